"""Parking (pgqueue 0.18.0): `park` ends a claim and parks its message on a key until `signal`
(sync and asyncio) or its timeout; what the claim that resumes it sees in its "pgq_park" header;
a signal kept for a park that comes later; stale tokens; a handler that parks its job (raising
`Park`, or calling `park` itself), with both workers; and the errors for bad arguments."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from conftest import history_row, outcomes, running, wait_for

import pgqueue
import pgqueue.aio
from pgqueue.producer import park_query, signal_query


def claim(db, queue):
    """A plain claim of one message, as a consumer of its own would make it: a Message, or None."""
    row = db.execute(
        "SELECT msg_id, attempt, payload, headers, priority, enqueued_at, claim_token FROM pgqueue.pgq_claim(%s)",
        [queue],
    ).fetchone()
    return None if row is None else pgqueue.Message(*row)


def state(db, msg_id):
    outcome = pgqueue.result(db, msg_id)
    assert outcome is not None, f"message {msg_id}"
    return outcome.state


def new_key():
    """Park keys are not per queue: one of its own for each use."""
    return f"py-{uuid.uuid4().hex}"


def test_a_parked_message_resumes_at_its_signal_with_the_signals_payload(dsn, db, make_queue):
    q, key = make_queue(), new_key()
    with pgqueue.Producer(dsn) as p:
        mid = p.send(q, {"order": 7}, headers={"trace": "t1"})
        msg = claim(db, q)
        assert (msg.msg_id, msg.attempt) == (mid, 1)
        assert pgqueue.park(db, msg, key, timedelta(hours=1), payload={"asked": "payment"}) is True
        assert state(db, mid) == "parked"
        assert claim(db, q) is None, "a parked message is not claimable"

        assert p.signal(key, {"paid": True}) == 1
        assert p.signal(key, {"paid": False}) == 0, "a second signal while the first is kept changes nothing"
        again = claim(db, q)
        assert again is not None and again.msg_id == mid
        assert again.attempt == 1, "the claim that resumes it is not a new attempt"
        assert again.headers["trace"] == "t1", "the sent headers are kept"
        park = again.headers["pgq_park"]
        assert (park["key"], park["on_timeout"], park["payload"], park["signal"]) == (
            key,
            "resume",
            {"asked": "payment"},
            {"paid": True},
        )
        assert {"parked_at", "timeout_at", "signalled_at", "resumed_at"} <= set(park) and "timed_out" not in park
        db.execute("SELECT pgqueue.pgq_ack(%s::bigint, %s::uuid)", [again.msg_id, again.claim_token])
    assert history_row(db, mid) == ("completed", 1, None)


def test_a_signal_kept_before_the_park_resumes_it_at_once(dsn, db, make_queue):
    q, early, unkept = make_queue(), new_key(), new_key()

    async def run() -> tuple[pgqueue.Message, pgqueue.Message]:
        async with pgqueue.aio.AsyncProducer(dsn) as ap:
            assert await ap.signal(early, "it came first") == 0, "nothing parked on it yet"
            assert await ap.signal(unkept, "lost", keep=0) == 0
            await ap.send_batch(q, ["early", "unkept"])
        first, second = claim(db, q), claim(db, q)
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            # In the caller's transaction: rolled back, the claim is still held.
            assert await pgqueue.aio.park(conn, first, early, 60)
            await conn.rollback()
            assert state(db, first.msg_id) == "claimed"
            assert await pgqueue.aio.park(conn, first, early, 60)
            assert await pgqueue.aio.park(conn, second, unkept, 60, payload=[1, 2], on_timeout="dead", queue=q)
            await conn.commit()
            assert await pgqueue.aio.signal(conn, new_key()) == 0
            await conn.commit()
        return first, second

    first, second = asyncio.run(run())
    assert state(db, first.msg_id) == "ready", "the kept signal resumed it at once"
    assert state(db, second.msg_id) == "parked", "a signal kept for 0 resumes no later park"
    resumed = claim(db, q)
    assert resumed is not None and (resumed.msg_id, resumed.attempt) == (first.msg_id, 1)
    park = resumed.headers["pgq_park"]
    assert (park["key"], park["signal"], park["on_timeout"]) == (early, "it came first", "resume")
    assert "payload" not in park, "no payload given"
    assert claim(db, q) is None


def test_a_stale_token_parks_nothing(dsn, db, make_queue):
    q, other, key = make_queue(), make_queue(), new_key()
    mid = pgqueue.Producer(dsn).send(q, "held")
    msg = claim(db, q)
    assert pgqueue.park(db, dataclasses.replace(msg, claim_token=uuid.uuid4()), key, 60) is False
    assert pgqueue.park(db, msg, key, 60, queue=other) is False, "another queue's message: as a stale token"
    assert state(db, mid) == "claimed", "nothing changed"
    assert pgqueue.park(db, msg, key, 60, queue=q) is True
    assert pgqueue.park(db, msg, key, 60) is False, "the first park ended the claim"
    ack = db.execute("SELECT pgqueue.pgq_ack(%s::bigint, %s::uuid)", [mid, msg.claim_token]).fetchone()
    assert ack == (False,), "so does an ack with its token"
    assert state(db, mid) == "parked"
    assert pgqueue.signal(db, key) == 1


def test_a_park_times_out_and_resumes_or_dead_letters(dsn, db, make_queue):
    q, resume, dead = make_queue(), new_key(), new_key()
    p = pgqueue.Producer(dsn)
    ids = p.send_batch(q, ["resume", "dead"])
    a, b = claim(db, q), claim(db, q)
    assert pgqueue.park(db, a, resume, 1)
    assert pgqueue.park(db, b, dead, timedelta(seconds=1), on_timeout="dead", payload={"n": 1})
    assert [state(db, i) for i in ids] == ["parked", "parked"]

    # The background worker's tick (every 200 ms here) ends the parks whose timeout passed.
    resumed = wait_for("the timed-out park claimable again", lambda: claim(db, q))
    assert (resumed.msg_id, resumed.attempt) == (ids[0], 1)
    park = resumed.headers["pgq_park"]
    assert (park["key"], park["timed_out"]) == (resume, True) and "signal" not in park and "resumed_at" in park
    wait_for("the other dead-lettered", lambda: history_row(db, ids[1]))
    assert history_row(db, ids[1]) == ("dead", 1, "parked, and no signal came before its timeout")
    assert p.signal(resume) == 0 and p.signal(dead) == 0, "nothing is parked on them any more"
    p.close()


def test_bad_park_or_signal_arguments_raise_the_servers_error(dsn, db, make_queue):
    q, key = make_queue(), new_key()
    mid = pgqueue.Producer(dsn).send(q, {})
    msg = claim(db, q)
    with pgqueue.Producer(dsn) as p:
        for bad, problem in (("", "a key of 0 characters"), ("k" * 513, "a key of 513 characters")):
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=problem) as e:
                p.signal(bad)
            assert e.value.sqlstate == "22023"
        with pytest.raises(psycopg.errors.InvalidParameterValue, match='"keep"') as e:
            p.signal(key, keep=-1)
        assert e.value.sqlstate == "22023"
        with pytest.raises(TypeError, match="key must be a str"):
            p.signal(None)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="keep must be"):
            p.signal(key, keep="1 day")  # type: ignore[arg-type]
        assert p.signal(key, keep=timedelta(0)) == 0, "the producer is still usable"

    for args, kwargs, argument in (
        (("", 60), {}, "key"),
        ((key, 0), {}, "timeout"),
        ((key, timedelta(days=366)), {}, "timeout"),
        ((key, 60), {"on_timeout": "later"}, "on_timeout"),
    ):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=f'"{argument}"') as e:
            pgqueue.park(db, msg, *args, **kwargs)
        assert e.value.sqlstate == "22023"
    with pytest.raises(psycopg.errors.UndefinedObject) as e:
        pgqueue.park(db, msg, key, 60, queue="no_such_queue")
    assert e.value.sqlstate == "42704"
    for args, kwargs, problem in (
        ((None, 60), {}, "key must be a str"),
        ((key, None), {}, "timeout must be"),
        ((key, "1 hour"), {}, "timeout must be"),
        ((key, 60), {"on_timeout": 1}, "on_timeout must be"),
    ):
        with pytest.raises(TypeError, match=problem):
            pgqueue.park(db, msg, *args, **kwargs)
    with pytest.raises(TypeError, match="message must be a pgqueue.Message"):
        pgqueue.park(db, mid, key, 60)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key must be a str"):
        pgqueue.Park(None, 60)  # type: ignore[arg-type]
    assert state(db, mid) == "claimed", "nothing changed"
    assert pgqueue.park(db, msg, key, 60)

    # Without the optional arguments, the statements name none of them.
    sql, params = park_query(msg, key, 60, None, None, None)
    assert "payload =>" not in sql and "on_timeout =>" not in sql and "queue =>" not in sql
    assert params == [mid, msg.claim_token, key, timedelta(seconds=60)]
    sql, params = park_query(msg, key, 60, {"a": 1}, "dead", q)
    assert "payload => %s::jsonb" in sql and "on_timeout => %s::text" in sql and "queue => %s::text" in sql
    assert params[4:] == [params[4], "dead", q] and params[4].obj == {"a": 1}
    sql, params = signal_query(key, None, None)
    assert "payload =>" not in sql and "keep =>" not in sql and params == [key]


def test_a_handler_parks_its_job_until_a_signal(dsn, db, make_queue, caplog):
    q = make_queue(lease="3 s")  # renewed every second
    raised, called = new_key(), new_key()
    p = pgqueue.Producer(dsn)
    ids = p.send_batch(q, ["raises Park", "calls park"])
    seen: dict[str, list[tuple[int, dict | None]]] = {"raises Park": [], "calls park": []}
    caplog.set_level(logging.WARNING, logger="pgqueue")

    def handle(msg: pgqueue.Message) -> object:
        park = (msg.headers or {}).get("pgq_park")
        seen[msg.payload].append((msg.attempt, park))
        if park is not None:
            return park["signal"]  # resumed: its result
        if msg.payload == "raises Park":
            raise pgqueue.Park(raised, 3600, payload={"waiting_for": "payment"})
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert pgqueue.park(conn, msg, called, 3600)
        time.sleep(1.5)  # a renewal would be due: none is made, the claim having ended
        return "not acked: the message is parked"

    worker = pgqueue.Worker(dsn, q, handle, concurrency=2, wait=1)
    with running(worker):
        wait_for("both parked", lambda: [state(db, i) for i in ids] == ["parked", "parked"])
        wait_for("both handlers done", lambda: worker.held == [])
        assert p.signal(raised, {"paid": True}) == 1
        assert p.signal(called, "approved") == 1
        done = [p.result(i, wait=30) for i in ids]
    assert [(o.state, o.attempt, o.result) for o in done] == [
        ("completed", 1, {"paid": True}),
        ("completed", 1, "approved"),
    ]
    assert [a for a, _ in seen["raises Park"]] == [1, 1] and [a for a, _ in seen["calls park"]] == [1, 1]
    assert seen["raises Park"][1][1]["payload"] == {"waiting_for": "payment"}
    assert seen["calls park"][1][1]["key"] == called
    assert "changed nothing" not in caplog.text, "no call with the ended claim's token"
    p.close()


def test_async_worker_parks_and_nacks_a_park_the_server_refuses(dsn, db, make_queue):
    q, key = make_queue(), new_key()
    p = pgqueue.Producer(dsn)
    good, bad = p.send_batch(q, ["good", "bad"])

    async def handle(msg: pgqueue.Message) -> object:
        if msg.payload == "bad" and msg.attempt == 1:
            raise pgqueue.Park("", 60)  # no such key: nacked with the server's error
        if msg.payload == "good" and msg.headers is None:
            raise pgqueue.Park(key, 3600, on_timeout="dead")
        return msg.payload

    async def until_done() -> None:
        while outcomes(db, q).get("completed") != 1 or state(db, good) != "parked":
            await asyncio.sleep(0.05)
        async with pgqueue.aio.AsyncProducer(dsn) as ap:
            assert await ap.signal(key) == 1
            assert (await ap.result(good, wait=30)).state == "completed"

    worker = pgqueue.aio.AsyncWorker(dsn, q, handle, concurrency=2, retry_in=0, wait=1)

    async def run() -> None:
        task = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(until_done(), 60)
        finally:
            worker.stop()
            await asyncio.wait_for(task, 60)

    asyncio.run(run())
    assert history_row(db, good) == ("completed", 1, None)
    outcome, attempt, error = history_row(db, bad)
    assert (outcome, attempt) == ("completed", 2)
    assert error.startswith('pgqueue.Park refused: pgqueue: invalid value for "key"'), error
    p.close()
