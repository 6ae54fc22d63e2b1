"""send / send_batch: what reaches the queue, inside the caller's transaction or committed by
the Producer, and the errors for bad arguments; result: what became of a message."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
import pytest

import pgqueue
import pgqueue.aio


def rows(db, queue):
    return db.execute(
        "SELECT msg_id, state, priority, payload, headers, visible_at > now() + interval '50 s'"
        " FROM pgqueue.messages WHERE queue = %s ORDER BY msg_id",
        [queue],
    ).fetchall()


def test_producer_sends_what_it_is_given(dsn, db, make_queue):
    q = make_queue()
    with pgqueue.Producer(dsn) as p:
        a = p.send(q, {"to": "a@example.com"})
        b = p.send(q, [1, "two"], priority=5, headers={"trace": "t1"}, delay=timedelta(minutes=1))
        c = p.send(q, "once", dedup_key="k1")
        again = p.send(q, "once more", dedup_key="k1", dedup_for=60)
        batch = p.send_batch(q, [{"n": i} for i in range(5)], priority=-3, dedup_keys=["x", None, "y", None, "x"])
    assert again == c, "a held dedup_key returns the id of the message holding it"
    assert batch[:4] == sorted(batch[:4]) and batch[4] == batch[0], "ids in order; a repeated key returns the first"
    assert rows(db, q) == [
        (a, "ready", 0, {"to": "a@example.com"}, None, None),
        (b, "delayed", 5, [1, "two"], {"trace": "t1"}, True),
        (c, "ready", 0, "once", None, None),
        *[(batch[i], "ready", -3, {"n": i}, None, None) for i in range(4)],
    ]


def test_send_joins_the_callers_transaction(dsn, db, make_queue):
    q = make_queue()
    with psycopg.connect(dsn) as conn:  # not autocommit: a transaction the caller owns
        conn.execute("CREATE TEMP TABLE orders (id int)")
        conn.commit()
        conn.execute("INSERT INTO orders VALUES (1)")
        pgqueue.send(conn, q, {"order": 1})
        with conn.cursor() as cur:
            pgqueue.send_batch(cur, q, [{"order": 2}, {"order": 3}])
        assert rows(db, q) == [], "nothing is visible before the caller commits"
        conn.rollback()
        assert rows(db, q) == [], "a rolled-back send was never sent"
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (0,)

        conn.execute("INSERT INTO orders VALUES (4)")
        sent = pgqueue.send(conn, q, {"order": 4})
        more = pgqueue.send_batch(conn, q, [{"order": 5}])
        conn.commit()
    assert [r[0] for r in rows(db, q)] == [sent, *more]


def test_async_send_joins_the_callers_transaction(dsn, db, make_queue):
    q = make_queue()

    async def main() -> list[int]:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await pgqueue.aio.send(conn, q, {"n": 0})
            await conn.rollback()
            ids = [await pgqueue.aio.send(conn, q, {"n": 1}, priority=2)]
            async with conn.cursor() as cur:
                ids += await pgqueue.aio.send_batch(cur, q, [{"n": 2}, {"n": 3}])
            await conn.commit()
        async with pgqueue.aio.AsyncProducer(dsn, prepare_threshold=None) as p:
            ids.append(await p.send(q, {"n": 4}))
            ids += await p.send_batch(q, [{"n": 5}])
        return ids

    ids = asyncio.run(main())
    assert [(r[0], r[3]) for r in rows(db, q)] == [(i, {"n": n}) for i, n in zip(ids, range(1, 6), strict=True)]


def test_bad_arguments_raise_clear_errors(dsn, db, make_queue):
    q = make_queue()
    with pgqueue.Producer(dsn) as p:
        with pytest.raises(TypeError, match="Producer"):
            pgqueue.send(dsn, q, {})  # a DSN where a connection belongs
        with pytest.raises(TypeError, match="delay must be a timedelta"):
            p.send(q, {}, delay="10 s")
        with pytest.raises(TypeError, match="priority must be an int"):
            p.send(q, {}, priority="high")
        with pytest.raises(TypeError, match="headers must be a mapping"):
            p.send(q, {}, headers=["x"])
        with pytest.raises(TypeError, match="payloads must be a sequence"):
            p.send_batch(q, {"a": 1})
        with pytest.raises(ValueError, match="one per payload"):
            p.send_batch(q, [1, 2], dedup_keys=["a"])
        with pytest.raises(psycopg.errors.UndefinedObject, match='queue "no_such_queue" does not exist'):
            p.send("no_such_queue", {})
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="priority"):
            p.send(q, {}, priority=5000)
        # The producer is still usable after the server refused a call.
        assert p.send(q, {"ok": True}) > 0
    assert len(rows(db, q)) == 1


def test_result_reads_a_message_or_none(dsn, db, make_queue):
    q, other = make_queue(), make_queue()
    with pgqueue.Producer(dsn) as p:
        assert p.result(-1) is None, "no such message"
        mid = p.send(q, {"n": 1})
        ready = p.result(mid, wait=0.2, queue=q)  # nobody claims it: the wait runs out
        assert p.result(mid, queue=other) is None, "not a message of that queue"
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="wait"):
            p.result(mid, wait=61)
        with pytest.raises(TypeError, match="msg_id must be an int"):
            p.result(str(mid))
    assert ready is not None
    assert (ready.state, ready.attempt, ready.result, ready.progress, ready.finished) == ("ready", 0, None, None, False)
    assert pgqueue.result(db, mid) == ready

    async def main() -> tuple[pgqueue.Outcome | None, ...]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            unknown = await pgqueue.aio.result(conn, -1)
        async with pgqueue.aio.AsyncProducer(dsn) as ap:
            again = await ap.result(mid, wait=timedelta(milliseconds=100), queue=q)
        return unknown, again

    assert asyncio.run(main()) == (None, ready)
