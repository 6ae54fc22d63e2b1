"""The sync Worker against a live server: each message handled once, nack with the error,
fail for non-retryable errors, renewal beyond the lease, results and progress, graceful stop,
reconnecting, bad arguments; and the same for the asyncio worker."""

from __future__ import annotations

import asyncio
import collections
import logging
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
from conftest import connections, history_row, outcomes, running, terminate, wait_for, waiting

import pgqueue
import pgqueue.aio

HERE = Path(__file__).parent


class Permanent(Exception):
    """A failure that retrying cannot fix."""


def claim_raw(db, queue):
    """A plain claim, as a second consumer would make it: (msg_id, attempt) or None."""
    return db.execute("SELECT msg_id, attempt FROM pgqueue.pgq_claim(%s)", [queue]).fetchone()


# -- sync -------------------------------------------------------------------------------


def test_worker_handles_each_message_once(dsn, db, make_queue):
    q = make_queue()
    ids = pgqueue.Producer(dsn).send_batch(q, [{"n": i} for i in range(300)])
    seen = collections.Counter()
    lock = threading.Lock()

    def handle(msg: pgqueue.Message) -> None:
        assert msg.payload == {"n": msg.msg_id - ids[0]}
        with lock:
            seen[msg.msg_id] += 1

    with running(pgqueue.Worker(dsn, q, handle, concurrency=4, batch=8, wait=5)):
        wait_for("300 completed", lambda: outcomes(db, q).get("completed") == 300)
    assert outcomes(db, q) == {"completed": 300}
    assert waiting(db, q) == 0
    assert sorted(seen) == ids and set(seen.values()) == {1}, "each message handled exactly once"


def test_concurrency_limits_handlers_at_once(dsn, db, make_queue):
    q = make_queue()
    pgqueue.Producer(dsn).send_batch(q, list(range(12)))
    now, most, lock = [0], [0], threading.Lock()

    def handle(msg: pgqueue.Message) -> None:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.2)
        with lock:
            now[0] -= 1

    with running(pgqueue.Worker(dsn, q, handle, concurrency=3, wait=5)):
        wait_for("12 completed", lambda: outcomes(db, q).get("completed") == 12)
    assert most[0] == 3


def test_exception_nacks_with_its_text(dsn, db, make_queue):
    q = make_queue()
    mid = pgqueue.Producer(dsn).send(q, {"job": 1})

    def handle(msg: pgqueue.Message) -> None:
        if msg.attempt == 1:
            raise ValueError("smtp said 451")

    with running(pgqueue.Worker(dsn, q, handle, retry_in=0, wait=5)):
        wait_for("completed", lambda: history_row(db, mid))
    # The nack kept the error on the message; the ack after the retry carried it to history.
    assert history_row(db, mid) == ("completed", 2, "ValueError: smtp said 451")


def test_exhausted_attempts_and_non_retryable_errors_dead_letter(dsn, db, make_queue):
    q = make_queue(max_attempts=2)
    p = pgqueue.Producer(dsn)
    flaky, permanent = p.send(q, "flaky"), p.send(q, "permanent")

    def handle(msg: pgqueue.Message) -> None:
        if msg.payload == "permanent":
            raise Permanent("no such address")
        raise RuntimeError(f"try {msg.attempt}")

    with running(pgqueue.Worker(dsn, q, handle, retry_in=0, non_retryable=[Permanent], wait=5)):
        wait_for("both dead", lambda: outcomes(db, q).get("dead") == 2)
    assert history_row(db, permanent) == ("dead", 1, "test_worker.Permanent: no such address")
    assert history_row(db, flaky) == ("dead", 2, "RuntimeError: try 2")


def test_renewal_holds_a_message_past_its_lease(dsn, db, make_queue):
    q = make_queue(lease="2 s")
    mid = pgqueue.Producer(dsn).send(q, {"slow": True})
    started = threading.Event()

    def handle(msg: pgqueue.Message) -> None:
        started.set()
        time.sleep(5)

    with running(pgqueue.Worker(dsn, q, handle, wait=1)):
        assert started.wait(30)
        # A second consumer keeps trying for longer than the lease: it must get nothing.
        while history_row(db, mid) is None:
            assert claim_raw(db, q) is None, "the message was re-armed while its handler ran"
            time.sleep(0.1)
    assert history_row(db, mid) == ("completed", 1, None)


def cancel(db, mid: int) -> bool:
    row = db.execute("SELECT pgqueue.pgq_cancel(%s::bigint, reason => 'not needed')", [mid]).fetchone()
    return bool(row and row[0])


def test_a_cancelled_job_stops_its_handler_and_frees_its_key(dsn, db, make_queue):
    q = make_queue(lease="3 s")  # renewed every second
    p = pgqueue.Producer(dsn)
    mid = p.send(q, "long", dedup_key="report-1", dedup_for=3600)
    started, stopped = threading.Event(), threading.Event()

    def handle(msg: pgqueue.Message) -> None:
        started.set()
        deadline = time.monotonic() + 60
        while not msg.stop.is_set():
            assert time.monotonic() < deadline, "never told to stop"
            time.sleep(0.05)
        stopped.set()  # returns normally: the worker records the cancel all the same

    with running(pgqueue.Worker(dsn, q, handle, wait=1)):
        assert started.wait(30)
        assert cancel(db, mid)
        assert p.send(q, "again", dedup_key="report-1") == mid, "the key is held while the handler runs"
        assert stopped.wait(30)
        wait_for("the cancel recorded", lambda: history_row(db, mid))
    assert history_row(db, mid) == ("cancelled", 1, "not needed")
    assert p.send(q, "again", dedup_key="report-1") != mid, "the key is free once cancelled"


def test_a_handlers_return_value_is_the_result_its_caller_awaits(dsn, db, make_queue):
    q = make_queue()
    app = "pgqueue-test-awaiter"
    p = pgqueue.Producer(dsn, application_name=app)
    mid = p.send(q, {"a": 1, "b": 2})

    def caller_waits() -> bool:
        return bool(
            db.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND state = 'active'", [app]
            ).fetchone()
        )

    def handle(msg: pgqueue.Message) -> dict[str, int]:
        wait_for("the caller's wait", caller_waits)  # so that the ack is what ends it
        return {"sum": msg.payload["a"] + msg.payload["b"]}

    with running(pgqueue.Worker(dsn, q, handle, wait=1)):
        start = time.monotonic()
        outcome = p.result(mid, wait=10)
        took = time.monotonic() - start
    assert outcome is not None and outcome.finished
    assert (outcome.state, outcome.attempt, outcome.result) == ("completed", 1, {"sum": 3})
    assert took < 9, "woken at the ack's commit, not at the end of the wait"


def test_progress_goes_with_the_next_renewal(dsn, db, make_queue):
    q = make_queue(lease="2 s")  # renewed every 2/3 s
    p = pgqueue.Producer(dsn)
    mid = p.send(q, {"rows": 3})
    seen = threading.Event()

    def handle(msg: pgqueue.Message) -> str:
        msg.report_progress({"done": 1})
        msg.report_progress({"done": 2})  # replaces the first if no renewal sent it yet
        assert seen.wait(60), "the progress was never read"
        return "ok"

    def progress_read() -> pgqueue.Outcome | None:
        outcome = p.result(mid)
        return outcome if outcome and outcome.progress == {"done": 2} else None

    with running(pgqueue.Worker(dsn, q, handle, wait=1)):
        running_outcome = wait_for("the progress", progress_read)
        seen.set()
        done = p.result(mid, wait=10)
    assert (running_outcome.state, running_outcome.finished) == ("claimed", False)
    assert done is not None
    assert (done.state, done.result, done.progress) == ("completed", "ok", {"done": 2}), "kept in history"


def test_a_result_or_progress_the_server_refuses_is_left_out(dsn, db, make_queue, caplog):
    q = make_queue(lease="2 s")
    small = dsn + " options='-c pgqueue.max_payload_bytes=64'"
    p = pgqueue.Producer(dsn)
    big, odd = p.send(q, "big"), p.send(q, "odd")
    caplog.set_level(logging.ERROR, logger="pgqueue")

    def handle(msg: pgqueue.Message) -> object:
        msg.report_progress("x" * 100)  # too large (54000): the renewal goes on without it
        time.sleep(3)  # past the lease: renewed all the same
        return "y" * 100 if msg.payload == "big" else object()  # too large; not JSON

    with running(pgqueue.Worker(small, q, handle, concurrency=2, wait=1)):
        wait_for("both completed", lambda: outcomes(db, q).get("completed") == 2)
    for mid in (big, odd):
        outcome = p.result(mid)
        assert outcome is not None
        assert (outcome.state, outcome.attempt, outcome.result, outcome.progress) == ("completed", 1, None, None)
    assert caplog.text.count("its result was refused") == 2
    assert "renewing" in caplog.text


def test_graceful_stop_finishes_running_handlers(dsn, db, make_queue):
    q = make_queue()
    mid = pgqueue.Producer(dsn).send(q, "short")
    started = threading.Event()

    def handle(msg: pgqueue.Message) -> None:
        started.set()
        time.sleep(1)

    with running(pgqueue.Worker(dsn, q, handle, grace=30, wait=5)):
        assert started.wait(30)
    assert history_row(db, mid) == ("completed", 1, None), "finished within the grace period"


def test_graceful_stop_gives_back_what_it_holds(dsn, db, make_queue):
    q = make_queue()
    ids = pgqueue.Producer(dsn).send_batch(q, ["a", "b"])
    release = threading.Event()
    started = threading.Semaphore(0)

    def handle(msg: pgqueue.Message) -> None:
        started.release()
        release.wait(60)

    worker = pgqueue.Worker(dsn, q, handle, concurrency=2, grace=0.5, wait=5)
    with running(worker):
        assert started.acquire(timeout=30) and started.acquire(timeout=30)
        assert sorted(m.msg_id for m in worker.held) == ids
    assert worker.held == []
    # Claimable again at once (not after the lease), the first attempt counted.
    assert sorted([claim_raw(db, q), claim_raw(db, q)]) == [(ids[0], 2), (ids[1], 2)]
    release.set()


def test_reconnects_and_acks_what_it_held(dsn, db, make_queue):
    q = make_queue()
    app = "pgqueue-test-reconnect"
    p = pgqueue.Producer(dsn)
    first = p.send_batch(q, ["x", "y"])
    release, started = threading.Event(), threading.Semaphore(0)

    def handle(msg: pgqueue.Message) -> None:
        if msg.payload in ("x", "y"):
            started.release()
            release.wait(60)

    with running(pgqueue.Worker(dsn, q, handle, concurrency=2, wait=2, application_name=app, max_backoff=1)):
        assert started.acquire(timeout=30) and started.acquire(timeout=30)
        wait_for("the worker's two connections", lambda: connections(db, app) == 2)
        assert terminate(db, app) == 2
        release.set()  # the acks need a new connection, with the tokens of before
        wait_for("both acked", lambda: outcomes(db, q).get("completed") == 2)
        for round in range(3):
            wait_for("a connection to terminate", lambda: terminate(db, app))
            p.send_batch(q, [round] * 10)
        wait_for("all completed", lambda: outcomes(db, q).get("completed") == 32)
    assert [history_row(db, i) for i in first] == [("completed", 1, None)] * 2
    assert waiting(db, q) == 0


def test_polls_where_the_server_cannot_wait(dsn, db, make_queue, caplog):
    q = make_queue()
    serializable = dsn + " options='-c default_transaction_isolation=serializable'"
    pgqueue.Producer(dsn).send_batch(q, [1, 2, 3])
    caplog.set_level(logging.WARNING, logger="pgqueue")
    with running(pgqueue.Worker(serializable, q, lambda m: None, wait=5, poll_interval=0.2)):
        wait_for("3 completed", lambda: outcomes(db, q).get("completed") == 3)
        pgqueue.Producer(dsn).send(q, 4)
        wait_for("4 completed", lambda: outcomes(db, q).get("completed") == 4)
    assert "polling" in caplog.text


def test_waits_less_when_statement_timeout_cuts_the_wait(dsn, db, make_queue, caplog):
    q = make_queue()
    short_timeout = dsn + " options='-c statement_timeout=1500'"
    caplog.set_level(logging.WARNING, logger="pgqueue")
    with running(pgqueue.Worker(short_timeout, q, lambda m: None, wait=20)):
        wait_for("a cancelled wait", lambda: "claim cancelled while waiting" in caplog.text)
        pgqueue.Producer(dsn).send_batch(q, [1, 2])
        wait_for("2 completed", lambda: outcomes(db, q).get("completed") == 2)


def test_bad_arguments_raise_clear_errors(dsn, make_queue):
    q = make_queue()
    with pytest.raises(ValueError, match="concurrency must be an int of at least 1"):
        pgqueue.Worker(dsn, q, print, concurrency=0)
    with pytest.raises(ValueError, match="batch"):
        pgqueue.Worker(dsn, q, print, batch=1001)
    with pytest.raises(ValueError, match="wait"):
        pgqueue.Worker(dsn, q, print, wait=61)
    with pytest.raises(TypeError, match="handler must be callable"):
        pgqueue.Worker(dsn, q, "print")
    with pytest.raises(TypeError, match="non_retryable"):
        pgqueue.Worker(dsn, q, print, non_retryable=["ValueError"])
    with pytest.raises(TypeError, match="lease"):
        pgqueue.Worker(dsn, q, print, lease="30 s")
    with pytest.raises(TypeError, match="AsyncWorker"):
        pgqueue.Worker(dsn, q, asyncio.sleep)
    with pytest.raises(TypeError, match="coroutine function"):
        pgqueue.aio.AsyncWorker(dsn, q, print)
    with pytest.raises(psycopg.errors.UndefinedObject, match='queue "no_such_queue" does not exist'):
        pgqueue.Worker(dsn, "no_such_queue", print, wait=1).run()
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="lease"):
        pgqueue.Worker(dsn, q, print, lease=2 * 86400, wait=1).run()


def test_sigterm_stops_a_worker_process_gracefully(dsn, db, make_queue):
    q = make_queue()
    mid = pgqueue.Producer(dsn).send(q, {"sleep": 1.5})
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "worker_process.py"), dsn, q, "pgqueue-test-sigterm"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # The handler has started when the message is claimed.
        wait_for(
            "the claim",
            lambda: db.execute(
                "SELECT 1 FROM pgqueue.messages WHERE msg_id = %s AND state = 'claimed'", [mid]
            ).fetchone(),
        )
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert history_row(db, mid) == ("completed", 1, None), out


# -- asyncio ----------------------------------------------------------------------------


async def arun(worker: pgqueue.aio.AsyncWorker, until, timeout: float = 60) -> None:
    """Runs `worker` until `until()` (a coroutine function) returns, then stops it."""
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(until(), timeout)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 60)


async def apoll(what: str, check, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def test_async_worker_handles_each_message_once(dsn, db, make_queue):
    q = make_queue()
    ids = pgqueue.Producer(dsn).send_batch(q, list(range(300)))
    seen = collections.Counter()
    now, most = [0], [0]

    async def handle(msg: pgqueue.Message) -> None:
        now[0] += 1
        most[0] = max(most[0], now[0])
        await asyncio.sleep(0.01)
        now[0] -= 1
        seen[msg.msg_id] += 1

    worker = pgqueue.aio.AsyncWorker(dsn, q, handle, concurrency=5, wait=5)
    asyncio.run(arun(worker, lambda: apoll("300 completed", lambda: outcomes(db, q).get("completed") == 300)))
    assert outcomes(db, q) == {"completed": 300} and waiting(db, q) == 0
    assert sorted(seen) == ids and set(seen.values()) == {1}
    assert most[0] == 5


def test_async_worker_nacks_and_fails(dsn, db, make_queue):
    q = make_queue()
    p = pgqueue.Producer(dsn)
    retried, permanent = p.send(q, "retry"), p.send(q, "permanent")

    async def handle(msg: pgqueue.Message) -> None:
        if msg.payload == "permanent":
            raise Permanent("bad input")
        if msg.attempt == 1:
            raise ConnectionResetError("upstream went away")

    worker = pgqueue.aio.AsyncWorker(dsn, q, handle, retry_in=0, non_retryable=(Permanent,), wait=5)
    asyncio.run(arun(worker, lambda: apoll("both finished", lambda: sum(outcomes(db, q).values()) == 2)))
    assert history_row(db, retried) == ("completed", 2, "ConnectionResetError: upstream went away")
    assert history_row(db, permanent) == ("dead", 1, "test_worker.Permanent: bad input")


def test_async_renewal_holds_a_message_past_its_lease(dsn, db, make_queue):
    q = make_queue(lease="2 s")
    mid = pgqueue.Producer(dsn).send(q, "slow")

    async def handle(msg: pgqueue.Message) -> None:
        await asyncio.sleep(5)

    async def second_consumer_gets_nothing() -> None:
        await apoll(
            "the claim",
            lambda: db.execute(
                "SELECT 1 FROM pgqueue.messages WHERE msg_id = %s AND state = 'claimed'", [mid]
            ).fetchone(),
        )
        while history_row(db, mid) is None:
            assert claim_raw(db, q) is None, "the message was re-armed while its handler ran"
            await asyncio.sleep(0.1)

    asyncio.run(arun(pgqueue.aio.AsyncWorker(dsn, q, handle, wait=1), second_consumer_gets_nothing))
    assert history_row(db, mid) == ("completed", 1, None)


def test_async_cancelled_job_stops_its_handler(dsn, db, make_queue):
    q = make_queue(lease="3 s")
    mid = pgqueue.Producer(dsn).send(q, "long")
    started, stopped = [False], [False]

    async def handle(msg: pgqueue.Message) -> None:
        started[0] = True
        while not msg.stop.is_set():
            await asyncio.sleep(0.05)
        stopped[0] = True

    async def cancelled() -> None:
        await apoll("the handler", lambda: started[0])
        assert cancel(db, mid)
        await apoll("the handler to stop", lambda: stopped[0])
        await apoll("the cancel recorded", lambda: history_row(db, mid))

    asyncio.run(arun(pgqueue.aio.AsyncWorker(dsn, q, handle, wait=1), cancelled))
    assert history_row(db, mid) == ("cancelled", 1, "not needed")


def test_async_worker_reports_progress_and_its_result(dsn, db, make_queue):
    q = make_queue(lease="2 s")
    mid = pgqueue.Producer(dsn).send(q, {"a": 1, "b": 2})
    seen = asyncio.Event()

    async def handle(msg: pgqueue.Message) -> dict[str, int]:
        msg.report_progress({"done": 1})
        await seen.wait()
        return {"sum": msg.payload["a"] + msg.payload["b"]}

    async def awaited() -> None:
        async with pgqueue.aio.AsyncProducer(dsn) as p:
            while (running_outcome := await p.result(mid)) is None or running_outcome.progress is None:
                await asyncio.sleep(0.05)
            assert (running_outcome.state, running_outcome.progress) == ("claimed", {"done": 1})
            seen.set()
            done = await p.result(mid, wait=10)
        assert done is not None
        assert (done.state, done.result, done.progress) == ("completed", {"sum": 3}, {"done": 1})

    asyncio.run(arun(pgqueue.aio.AsyncWorker(dsn, q, handle, wait=1), awaited))


def test_async_graceful_stop_gives_back_what_it_holds(dsn, db, make_queue):
    q = make_queue()
    ids = pgqueue.Producer(dsn).send_batch(q, ["a", "b"])
    cancelled = []

    async def handle(msg: pgqueue.Message) -> None:
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            cancelled.append(msg.msg_id)
            raise

    worker = pgqueue.aio.AsyncWorker(dsn, q, handle, concurrency=2, grace=0.5, wait=5)
    asyncio.run(arun(worker, lambda: apoll("two held", lambda: len(worker.held) == 2)))
    assert worker.held == [] and sorted(cancelled) == ids
    assert sorted([claim_raw(db, q), claim_raw(db, q)]) == [(ids[0], 2), (ids[1], 2)]


def test_async_worker_reconnects(dsn, db, make_queue):
    q = make_queue()
    app = "pgqueue-test-async-reconnect"
    p = pgqueue.Producer(dsn)
    release = asyncio.Event()

    async def handle(msg: pgqueue.Message) -> None:
        if msg.payload == "held":
            await release.wait()

    async def chaos() -> None:
        p.send(q, "held")
        await apoll("the held message", lambda: len(worker.held) == 1)
        await apoll("the worker's two connections", lambda: connections(db, app) == 2)
        assert terminate(db, app) == 2
        release.set()
        for round in range(3):
            await apoll("a connection to terminate", lambda: terminate(db, app))
            p.send_batch(q, [round] * 10)
        await apoll("all completed", lambda: outcomes(db, q).get("completed") == 31)

    worker = pgqueue.aio.AsyncWorker(dsn, q, handle, concurrency=3, wait=2, application_name=app, max_backoff=1)
    asyncio.run(arun(worker, chaos, timeout=120))
    assert outcomes(db, q) == {"completed": 31} and waiting(db, q) == 0


def test_async_worker_unknown_queue(dsn):
    worker = pgqueue.aio.AsyncWorker(dsn, "no_such_queue", asyncio.sleep, wait=1)
    with pytest.raises(psycopg.errors.UndefinedObject, match='queue "no_such_queue" does not exist'):
        asyncio.run(worker.run())
    with pytest.raises(ValueError, match="concurrency"):
        pgqueue.aio.AsyncWorker(dsn, "q", asyncio.sleep, concurrency=0)
