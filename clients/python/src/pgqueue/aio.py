"""The asyncio twin of `pgqueue`: `send`, `send_batch`, `result`, `graph`, `park`, `signal`,
`AsyncProducer` and `AsyncWorker`, with the same arguments and behaviour as the sync ones
(handlers are coroutine functions and run as tasks)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import signal as signals
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import psycopg

from .messages import Message, OnTimeout, Park, Seconds, backoff, error_text, short
from .producer import (
    GraphRow,
    Outcome,
    ParentFailure,
    graph_query,
    park_query,
    result_query,
    send_batch_query,
    send_query,
    signal_query,
)
from .worker import (
    CONNECTION_ERRORS,
    REFUSED,
    Held,
    Settings,
    fenced_false,
    log,
    parked,
    put_back,
    refused_park,
    refused_result,
    shorter_wait,
    wait_unsupported,
)

AsyncTarget = psycopg.AsyncConnection[Any] | psycopg.AsyncCursor[Any]
AsyncHandler = Callable[[Message], Awaitable[object]]


async def send(
    target: AsyncTarget,
    queue: str,
    payload: Any,
    *,
    delay: Seconds | None = None,
    priority: int = 0,
    headers: Mapping[str, Any] | None = None,
    dedup_key: str | None = None,
    dedup_for: Seconds | None = None,
    after: Sequence[int] | None = None,
    on_parent_failure: ParentFailure | None = None,
) -> int:
    """`pgqueue.send` on an AsyncConnection or AsyncCursor; never commits."""
    sql, params = send_query(queue, payload, delay, priority, headers, dedup_key, dedup_for, after, on_parent_failure)
    cur = await _cursor(target, "send").execute(sql, params)
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def send_batch(
    target: AsyncTarget,
    queue: str,
    payloads: Sequence[Any],
    *,
    delay: Seconds | None = None,
    priority: int = 0,
    headers: Mapping[str, Any] | None = None,
    dedup_keys: Sequence[str | None] | None = None,
    dedup_for: Seconds | None = None,
    after: Sequence[int] | None = None,
    on_parent_failure: ParentFailure | None = None,
) -> list[int]:
    """`pgqueue.send_batch` on an AsyncConnection or AsyncCursor; never commits."""
    sql, params = send_batch_query(
        queue, payloads, delay, priority, headers, dedup_keys, dedup_for, after, on_parent_failure
    )
    cur = await _cursor(target, "send_batch").execute(sql, params)
    row = await cur.fetchone()
    assert row is not None
    return [int(i) for i in row[0] or []]


async def result(
    target: AsyncTarget, msg_id: int, wait: Seconds | None = None, queue: str | None = None
) -> Outcome | None:
    """`pgqueue.result` on an AsyncConnection or AsyncCursor."""
    cur = await _cursor(target, "result").execute(*result_query(msg_id, wait, queue))
    row = await cur.fetchone()
    return None if row is None else Outcome(*row)


async def graph(target: AsyncTarget, msg_id: int) -> list[GraphRow]:
    """`pgqueue.graph` on an AsyncConnection or AsyncCursor."""
    cur = await _cursor(target, "graph").execute(*graph_query(msg_id))
    return [GraphRow(*row) for row in await cur.fetchall()]


async def park(
    target: AsyncTarget,
    message: Message,
    key: str,
    timeout: Seconds,
    *,
    payload: Any = None,
    on_timeout: OnTimeout | None = None,
    queue: str | None = None,
) -> bool:
    """`pgqueue.park` on an AsyncConnection or AsyncCursor; never commits."""
    cur = await _cursor(target, "park").execute(*park_query(message, key, timeout, payload, on_timeout, queue))
    row = await cur.fetchone()
    assert row is not None
    if row[0]:
        message._parked.set()
    return bool(row[0])


async def signal(target: AsyncTarget, key: str, payload: Any = None, keep: Seconds | None = None) -> int:
    """`pgqueue.signal` on an AsyncConnection or AsyncCursor; never commits."""
    cur = await _cursor(target, "signal").execute(*signal_query(key, payload, keep))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


def _cursor(target: Any, what: str) -> Any:
    if isinstance(target, psycopg.AsyncConnection):
        return target.cursor()
    if isinstance(target, psycopg.AsyncCursor):
        return target
    raise TypeError(
        f"{what}() takes a psycopg AsyncConnection or AsyncCursor, not {type(target).__name__}"
        " (to send on a connection of its own, use pgqueue.aio.AsyncProducer(dsn))"
    )


class AsyncProducer:
    """`pgqueue.Producer` for asyncio: each call commits on the producer's own connection."""

    def __init__(
        self,
        dsn: str,
        *,
        prepare_threshold: int | None = None,
        application_name: str = "pgqueue-producer",
        connect_timeout: int = 10,
    ) -> None:
        self._dsn = dsn
        self._connect_args: dict[str, Any] = dict(
            autocommit=True,
            prepare_threshold=prepare_threshold,
            application_name=application_name,
            connect_timeout=connect_timeout,
        )
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(self._dsn, **self._connect_args)
        return self._conn

    async def _row(self, sql: str, params: list[Any]) -> Any:
        conn = await self._connection()
        try:
            return await (await conn.execute(sql, params)).fetchone()
        except psycopg.OperationalError:
            await conn.close()
            raise

    async def _rows(self, sql: str, params: list[Any]) -> list[Any]:
        conn = await self._connection()
        try:
            return await (await conn.execute(sql, params)).fetchall()
        except psycopg.OperationalError:
            await conn.close()
            raise

    async def _run(self, sql: str, params: list[Any]) -> Any:
        row = await self._row(sql, params)
        assert row is not None
        return row[0]

    async def send(
        self,
        queue: str,
        payload: Any,
        *,
        delay: Seconds | None = None,
        priority: int = 0,
        headers: Mapping[str, Any] | None = None,
        dedup_key: str | None = None,
        dedup_for: Seconds | None = None,
        after: Sequence[int] | None = None,
        on_parent_failure: ParentFailure | None = None,
    ) -> int:
        return int(
            await self._run(
                *send_query(queue, payload, delay, priority, headers, dedup_key, dedup_for, after, on_parent_failure)
            )
        )

    async def send_batch(
        self,
        queue: str,
        payloads: Sequence[Any],
        *,
        delay: Seconds | None = None,
        priority: int = 0,
        headers: Mapping[str, Any] | None = None,
        dedup_keys: Sequence[str | None] | None = None,
        dedup_for: Seconds | None = None,
        after: Sequence[int] | None = None,
        on_parent_failure: ParentFailure | None = None,
    ) -> list[int]:
        ids = await self._run(
            *send_batch_query(
                queue, payloads, delay, priority, headers, dedup_keys, dedup_for, after, on_parent_failure
            )
        )
        return [int(i) for i in ids or []]

    async def result(self, msg_id: int, wait: Seconds | None = None, queue: str | None = None) -> Outcome | None:
        row = await self._row(*result_query(msg_id, wait, queue))
        return None if row is None else Outcome(*row)

    async def graph(self, msg_id: int) -> list[GraphRow]:
        return [GraphRow(*row) for row in await self._rows(*graph_query(msg_id))]

    async def signal(self, key: str, payload: Any = None, keep: Seconds | None = None) -> int:
        return int(await self._run(*signal_query(key, payload, keep)))

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _AsyncLink:
    """A connection opened again after it broke; shared by the worker's tasks."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._lock = asyncio.Lock()
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def fetch(self, sql: str, params: list[Any]) -> Any:
        async with self._lock:
            if self._conn is None or self._conn.closed:
                self._conn = await psycopg.AsyncConnection.connect(self._settings.dsn, **self._settings.connect_args())
            conn = self._conn
        try:
            return await (await conn.execute(sql, params)).fetchall()
        except REFUSED:
            raise  # the connection is fine
        except CONNECTION_ERRORS:
            await self.drop(conn)
            raise

    async def drop(self, conn: psycopg.AsyncConnection[Any] | None = None) -> None:
        async with self._lock:
            if self._conn is not None and (conn is None or conn is self._conn):
                await self._conn.close()
                self._conn = None


class AsyncWorker:
    """`pgqueue.Worker` for asyncio: `await handler(message)` for each message, at most
    `concurrency` at once, each in a task. Same arguments as `Worker`."""

    def __init__(
        self,
        dsn: str,
        queue: str,
        handler: AsyncHandler,
        *,
        concurrency: int = 1,
        batch: int | None = None,
        lease: Seconds | None = None,
        wait: Seconds = 30,
        non_retryable: Iterable[type[BaseException]] = (),
        retry_in: Seconds | None = None,
        grace: Seconds = 30,
        poll_interval: Seconds = 1,
        consumer: str | None = None,
        application_name: str = "pgqueue-worker",
        prepare_threshold: int | None = None,
        session_bound: bool = False,
        max_backoff: Seconds = 30,
        connect_timeout: int = 10,
    ) -> None:
        self.settings = Settings.check(
            dsn,
            queue,
            handler,
            concurrency=concurrency,
            batch=batch,
            lease=lease,
            wait=wait,
            non_retryable=non_retryable,
            retry_in=retry_in,
            grace=grace,
            poll_interval=poll_interval,
            consumer=consumer,
            application_name=application_name,
            prepare_threshold=prepare_threshold,
            session_bound=session_bound,
            max_backoff=max_backoff,
            connect_timeout=connect_timeout,
        )
        if not (inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(type(handler).__call__)):
            raise TypeError("handler must be a coroutine function (async def): run a plain one with pgqueue.Worker")
        self._handler = handler
        self._claim_link = _AsyncLink(self.settings)
        self._link = _AsyncLink(self.settings)
        self._held: dict[int, Held] = {}
        self._started = False
        # Created in run(), on the worker's loop.
        self._changed: asyncio.Condition
        self._stopping: asyncio.Event
        self._hurry: asyncio.Event
        self._done: asyncio.Event
        self._claim_task: asyncio.Task[Any] | None = None

    @property
    def held(self) -> list[Message]:
        return [h.message for h in self._held.values()]

    async def run(self, handle_signals: bool = True) -> None:
        """As `Worker.run`: works until `stop()` (or SIGTERM / SIGINT when `handle_signals`
        and the loop runs in the main thread), then stops gracefully."""
        if self._started:
            raise RuntimeError("a worker runs once; make a new one")
        self._started = True
        self._changed = asyncio.Condition()
        self._stopping, self._hurry, self._done = asyncio.Event(), asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()
        handled: list[signals.Signals] = []
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signals.SIGTERM, signals.SIGINT):
                loop.add_signal_handler(sig, self.stop)
                handled.append(sig)
        renewer = asyncio.create_task(self._renew_loop())
        try:
            while not self._stopping.is_set():
                # The claim runs as a task of its own so that stop() can cancel its wait.
                self._claim_task = asyncio.create_task(self._claim_round())
                try:
                    await self._claim_task
                except asyncio.CancelledError:
                    if not self._stopping.is_set():
                        raise
        finally:
            self._stopping.set()
            await self._shutdown()
            renewer.cancel()
            for sig in handled:
                loop.remove_signal_handler(sig)

    def stop(self) -> None:
        """Stops claiming and ends `run()` gracefully; call it on the worker's loop (from
        another thread: `loop.call_soon_threadsafe(worker.stop)`). Twice: without grace."""
        if not self._started:
            return
        if self._stopping.is_set():
            self._hurry.set()
        self._stopping.set()
        if self._claim_task is not None:
            self._claim_task.cancel()  # psycopg cancels the query on the server

    # -- claiming -------------------------------------------------------------------------

    _failures = 0
    _wait: float | None = None
    _granted: float | None = None

    async def _claim_round(self) -> None:
        s = self.settings
        if self._wait is None:
            self._wait = s.wait
            self._granted = s.lease.total_seconds() if s.lease else None
        async with self._changed:
            await self._changed.wait_for(lambda: len(self._held) < s.concurrency)
            free = s.concurrency - len(self._held)
        wait = min(self._wait, self._granted / 3) if self._granted else self._wait
        try:
            rows = await self._claim_link.fetch(*s.claim_query(min(free, s.batch), wait))
            self._failures = 0
        except CONNECTION_ERRORS as exc:
            if self._stopping.is_set():
                return
            if shorter_wait(exc, wait):
                self._wait = wait / 2
                return
            self._failures += 1
            pause = backoff(self._failures, s.max_backoff)
            log.warning("claim on queue %r failed (%s); again in %.1f s", s.queue, short(exc), pause)
            await asyncio.sleep(pause)
            return
        except psycopg.Error as exc:
            if self._wait > 0 and wait_unsupported(exc):
                log.warning(
                    "the server cannot wait for messages here (%s): polling every %.1f s instead",
                    short(exc),
                    s.poll_interval,
                )
                self._wait = 0
                return
            raise
        now = time.monotonic()
        fresh = [Held.from_row(row, now) for row in rows]
        if not fresh:
            if self._wait == 0:
                await asyncio.sleep(s.poll_interval)
            return
        self._granted = self._granted or fresh[0].lease
        self._held.update((h.message.msg_id, h) for h in fresh)
        late = [h for h in fresh if h.renew_at <= now]
        if late:
            await self._renew(late)
        for h in fresh:
            if h.lost:
                await self._forget(h)
            else:
                h.task = asyncio.create_task(self._execute(h))

    async def _forget(self, held: Held) -> None:
        async with self._changed:
            self._held.pop(held.message.msg_id, None)
            self._changed.notify_all()

    # -- handling -------------------------------------------------------------------------

    async def _execute(self, held: Held) -> None:
        outcome, error, result = "ack", None, None
        try:
            result = await self._handler(held.message)
        except asyncio.CancelledError:
            if held.state == "given_back":
                return  # given back at the end of the grace period
            raise
        except Park as park:
            outcome, result = "park", park
            log.info("message %d (attempt %d): %s", held.message.msg_id, held.message.attempt, park)
        except Exception as exc:  # every failure is reported to the server
            error = error_text(exc)
            outcome = "fail" if isinstance(exc, self.settings.non_retryable) else "nack"
            log.info("message %d (attempt %d) failed: %s", held.message.msg_id, held.message.attempt, error)
        if held.state != "running":
            return
        held.state = "finishing"
        try:
            await self._call_until_done(held, outcome, error, result)
        finally:
            await self._forget(held)

    async def _call_until_done(self, held: Held, outcome: str, error: str | None, result: Any) -> None:
        if parked(held):
            return
        failures = 0
        while True:
            try:
                rows = await self._link.fetch(*self.settings.finish_query(held, outcome, error, result))
            except REFUSED as exc:
                if outcome == "park":
                    outcome, error, result = "nack", refused_park(held, exc), None
                    continue
                if result is None:
                    log.error("%s of message %d failed: %s", outcome, held.message.msg_id, exc)
                    return
                refused_result(held, exc)
                result = None
                continue
            except CONNECTION_ERRORS as exc:
                if self._done.is_set():
                    log.error(
                        "could not %s message %d before the worker ended (%s); its lease will run out",
                        outcome,
                        held.message.msg_id,
                        short(exc),
                    )
                    return
                failures += 1
                pause = backoff(failures, self.settings.max_backoff)
                log.warning(
                    "%s of message %d failed (%s); again in %.1f s", outcome, held.message.msg_id, short(exc), pause
                )
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._done.wait(), pause)
                continue
            except psycopg.Error as exc:
                if outcome == "park":
                    outcome, error, result = "nack", refused_park(held, exc), None
                    continue
                log.error("%s of message %d failed: %s", outcome, held.message.msg_id, exc)
                return
            if not rows[0][0]:
                fenced_false(outcome, held)
            return

    # -- renewing -------------------------------------------------------------------------

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            due = [h for h in self._held.values() if h.renewable(now)]
            if due:
                await self._renew(due)

    async def _renew(self, due: list[Held]) -> None:
        now = time.monotonic()
        progress = [h.message._progress.take() for h in due]
        try:
            rows = await self._link.fetch(*self.settings.renew_query(due, progress))
        except REFUSED as exc:
            # Refused progress is dropped: the renewal is due again at once, without it.
            log.error("renewing %d leases failed: %s", len(due), exc)
            return
        except CONNECTION_ERRORS as exc:
            log.warning("renewing %d leases failed (%s); trying again", len(due), short(exc))
            put_back(due, progress)
            await asyncio.sleep(backoff(1, self.settings.max_backoff))
            return
        except psycopg.Error as exc:
            log.error("renewing %d leases failed: %s", len(due), exc)
            return
        kept = set(rows[0][0])
        for h in due:
            if h.message.msg_id in kept:
                h.renewed(now)
            else:
                h.told_to_stop()
                fenced_false("renewal", h)

    # -- stopping -------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        s = self.settings

        async def drained() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: not self._held)

        grace = asyncio.create_task(drained())
        hurry = asyncio.create_task(self._hurry.wait())
        await asyncio.wait([grace, hurry], timeout=s.grace, return_when=asyncio.FIRST_COMPLETED)
        hurry.cancel()
        back = [h for h in self._held.values() if h.state == "running"]
        for h in back:
            h.state = "given_back"
            if h.task is not None:
                h.task.cancel()
        for h in back:
            log.info("giving back message %d (attempt %d)", h.message.msg_id, h.message.attempt)
            await self._give_back(h)
        # Finishing calls still retrying get a last few seconds.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(grace), 10)
        grace.cancel()
        self._done.set()
        await self._claim_link.drop()
        await self._link.drop()

    async def _give_back(self, held: Held) -> None:
        if parked(held):
            await self._forget(held)
            return
        for attempt in range(3):
            try:
                rows = await self._link.fetch(*self.settings.finish_query(held, "give_back", None))
            except CONNECTION_ERRORS as exc:
                log.warning("giving back message %d failed (%s)", held.message.msg_id, short(exc))
                await asyncio.sleep(backoff(attempt, 2))
                continue
            except psycopg.Error as exc:
                log.error("giving back message %d failed: %s", held.message.msg_id, exc)
                break
            if not rows[0][0]:
                fenced_false("giving back", held)
            break
        else:
            log.error("message %d was not given back; its lease will run out", held.message.msg_id)
        await self._forget(held)
