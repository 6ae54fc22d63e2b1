"""Dependencies (pgqueue 0.17.0): send and send_batch with `after` and `on_parent_failure`,
sync and asyncio; a child pending until its parents completed (acked by the worker), what
becomes of it when a parent fails; `graph`; and the errors for bad parents."""

from __future__ import annotations

import asyncio
import threading

import psycopg
import pytest
from conftest import outcomes, running, wait_for

import pgqueue
import pgqueue.aio
from pgqueue.producer import send_batch_query, send_query


def state(db, msg_id):
    outcome = pgqueue.result(db, msg_id)
    assert outcome is not None, f"message {msg_id}"
    return outcome.state


def relations(rows):
    """graph() rows as (relation, id, queue, state, on_parent_failure, finished)."""
    return [(r.relation, r.id, r.queue, r.state, r.on_parent_failure, r.finished) for r in rows]


def claim_and_ack(db, queue):
    """Claims one message of `queue` and acks it, as any consumer would: its msg_id."""
    row = db.execute(
        "SELECT c.msg_id, pgqueue.pgq_ack(msg_id => c.msg_id, claim_token => c.claim_token)"
        " FROM pgqueue.pgq_claim(queue => %s, qty => 1) c",
        [queue],
    ).fetchone()
    assert row is not None and row[1], f"a message of {queue} claimed and acked"
    return row[0]


def test_a_child_waits_until_the_worker_acks_its_parent(dsn, db, make_queue):
    q = make_queue()
    with pgqueue.Producer(dsn) as p:
        a = p.send(q, {"step": "a"})
        b = p.send(q, {"step": "b"}, after=[a])
        assert p.result(b).state == "pending"
        assert relations(p.graph(b)) == [
            ("message", b, q, "pending", "cancel", False),
            ("parent", a, q, "ready", None, False),
        ]
        assert relations(p.graph(a)) == [
            ("message", a, q, "ready", None, False),
            ("child", b, q, "pending", "cancel", False),
        ]
        assert p.graph(-1) == [], "no such message"

    handled: list[int] = []
    release = threading.Event()

    def handle(msg: pgqueue.Message) -> None:
        handled.append(msg.msg_id)
        if msg.msg_id == a:
            assert release.wait(60)

    with running(pgqueue.Worker(dsn, q, handle, concurrency=2, wait=5)):
        wait_for("a claimed", lambda: handled == [a])
        # Its parent runs: the child is not claimable, although the worker has a free slot.
        assert state(db, a) == "claimed"
        assert state(db, b) == "pending"
        assert [(r.relation, r.state) for r in pgqueue.graph(db, b)] == [("message", "pending"), ("parent", "claimed")]
        release.set()
        wait_for("both completed", lambda: outcomes(db, q).get("completed") == 2)
    assert handled == [a, b], "the child ran after its parent's ack"

    rows = pgqueue.graph(db, b)
    assert relations(rows) == [
        ("message", b, q, "completed", None, True),
        ("parent", a, q, "completed", None, True),
    ]
    assert all(isinstance(r, pgqueue.GraphRow) and r.enqueued_at is not None for r in rows)
    assert rows[1].finished_at <= rows[0].finished_at
    assert [r.relation for r in pgqueue.graph(db, a)] == ["message"], "a finished child is found from its side"


def test_a_batch_waits_for_all_of_its_parents(dsn, db, make_queue):
    q, other = make_queue(), make_queue()

    async def send() -> tuple[int, int, list[int], list[pgqueue.GraphRow], list[pgqueue.GraphRow]]:
        async with pgqueue.aio.AsyncProducer(dsn) as ap:
            p1 = await ap.send(q, {"parent": 1})
            p2 = await ap.send(other, {"parent": 2})  # parents of any queue
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                kids = await pgqueue.aio.send_batch(
                    conn, q, [{"child": i} for i in range(3)], after=[p1, p2], on_parent_failure="dead"
                )
                await conn.commit()
                rows = await pgqueue.aio.graph(conn, kids[0])
            kids += await ap.send_batch(other, [{"child": 3}], after=[p2])
            return p1, p2, kids, rows, await ap.graph(p2)

    p1, p2, kids, rows, of_p2 = asyncio.run(send())
    assert relations(rows) == [
        ("message", kids[0], q, "pending", "dead", False),
        ("parent", p1, q, "ready", None, False),
        ("parent", p2, other, "ready", None, False),
    ]
    assert of_p2 == pgqueue.graph(db, p2)
    assert [(r.relation, r.id, r.queue, r.on_parent_failure) for r in of_p2] == [
        ("message", p2, other, None),
        *[("child", k, q, "dead") for k in kids[:3]],
        ("child", kids[3], other, "cancel"),
    ]
    assert [state(db, k) for k in kids] == ["pending"] * 4

    assert claim_and_ack(db, other) == p2, "the pending child is not claimable, its parent is"
    assert [state(db, k) for k in kids] == ["pending"] * 3 + ["ready"], "the last one waited for p2 only"
    assert claim_and_ack(db, q) == p1
    assert [state(db, k) for k in kids] == ["ready"] * 4
    assert [r.state for r in pgqueue.graph(db, kids[0])] == ["ready", "completed", "completed"]


class Permanent(Exception):
    """Dead-letters its message at once."""


def test_a_failed_parent_cancels_dead_letters_or_runs_its_children(dsn, db, make_queue):
    q, kids_q = make_queue(), make_queue()
    with pgqueue.Producer(dsn) as p:
        parent = p.send(q, {"fails": True})
        run = p.send(kids_q, {"policy": "run"}, after=[parent], on_parent_failure="run")
        cancel = p.send(kids_q, {"policy": "cancel"}, after=[parent])
        grandchild = p.send(kids_q, {"policy": "grandchild"}, after=[cancel], on_parent_failure="run")
        cancelled_too = p.send(kids_q, {"policy": "cancelled too"}, after=[cancel])
        dead = p.send(kids_q, {"policy": "dead"}, after=[parent], on_parent_failure="dead")

    def fail(msg: pgqueue.Message) -> None:
        raise Permanent("no")

    with running(pgqueue.Worker(dsn, q, fail, non_retryable=(Permanent,), wait=5)):
        wait_for("the parent dead-lettered", lambda: outcomes(db, q).get("dead") == 1)

    with pgqueue.Producer(dsn) as p:
        assert p.result(parent).state == "dead"
        ran = p.result(run)
        assert (ran.state, ran.finished) == ("ready", False), "'run': claimable all the same"
        cancelled, dead_lettered = p.result(cancel), p.result(dead)
        assert (cancelled.state, cancelled.last_error) == ("cancelled", f"parent {parent} was dead-lettered")
        assert (dead_lettered.state, dead_lettered.last_error) == ("dead", f"parent {parent} was dead-lettered")
        assert p.result(grandchild).state == "ready", "a grandchild's own policy applies: 'run'"
        further = p.result(cancelled_too)
        assert (further.state, further.last_error) == ("cancelled", f"parent {cancel} was cancelled")
        # Sent after its parent failed: 'run' is ready at once, the default cancelled at once.
        late_run = p.send(kids_q, {"late": "run"}, after=[parent], on_parent_failure="run")
        late = p.send(kids_q, {"late": "cancel"}, after=[parent])
        assert (p.result(late_run).state, p.result(late).state) == ("ready", "cancelled")

    handled: list[int] = []
    with running(pgqueue.Worker(dsn, kids_q, lambda msg: handled.append(msg.msg_id), wait=5)):
        wait_for("the runnable children completed", lambda: outcomes(db, kids_q).get("completed") == 3)
    assert sorted(handled) == sorted([run, grandchild, late_run])
    assert outcomes(db, kids_q) == {"completed": 3, "cancelled": 3, "dead": 1}


def test_bad_parents_raise_the_servers_error(dsn, db, make_queue):
    q = make_queue()
    with pgqueue.Producer(dsn) as p:
        a = p.send(q, {})
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match="parent message -5 does not exist") as e:
            p.send(q, {}, after=[a, -5])
        assert e.value.sqlstate == "23503"
        with pytest.raises(psycopg.errors.ForeignKeyViolation) as e:
            p.send_batch(q, [1, 2], after=[-5])
        assert e.value.sqlstate == "23503"
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="on_parent_failure"):
            p.send(q, {}, after=[a], on_parent_failure="maybe")  # type: ignore[arg-type]
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="twice"):
            p.send(q, {}, after=[a, a])
        with pytest.raises(TypeError, match="after must be a sequence"):
            p.send(q, {}, after=a)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="after must hold msg_ids"):
            p.send_batch(q, [1], after=[str(a)])  # type: ignore[list-item]
        with pytest.raises(TypeError, match="on_parent_failure must be"):
            p.send(q, {}, after=[a], on_parent_failure=1)  # type: ignore[arg-type]
        # The producer is still usable; no parents: a plain message.
        assert p.result(p.send(q, {}, after=[])).state == "ready"
    with psycopg.connect(dsn) as conn:
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            pgqueue.send(conn, q, {}, after=[-5])
        conn.rollback()

    # Without after or on_parent_failure, the statements name neither (older servers lack them).
    for sql, _ in (
        send_query(q, {}, None, 0, None, None, None),
        send_batch_query(q, [{}], None, 0, None, None, None),
    ):
        assert "after" not in sql and "on_parent_failure" not in sql
    sql, params = send_query(q, {}, None, 0, None, None, None, [a], "run")
    assert "after => %s::bigint[]" in sql and "on_parent_failure => %s::text" in sql and params[-2:] == [[a], "run"]
