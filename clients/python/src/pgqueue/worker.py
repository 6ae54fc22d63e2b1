"""The worker: claims messages, runs a handler per message (at most `concurrency` at once, in
threads), renews their leases while the handlers run (with the progress they report), acks
(with what they return), nacks, fails or parks them, stops gracefully and reconnects after
connection losses."""

from __future__ import annotations

import inspect
import logging
import os
import queue as queue_module
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.types.json import Jsonb

from .messages import Message, Park, Seconds, backoff, error_text, interval, seconds, short
from .producer import park_query

log = logging.getLogger("pgqueue")

Handler = Callable[[Message], object]

# A lost or closed connection: reconnect and try again.
CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)

# A handler's result or progress refused: too large (54000: an OperationalError, so caught
# before CONNECTION_ERRORS), by a server before 0.16.0 (42883), or not JSON (before the call).
REFUSED = (pg_errors.ProgramLimitExceeded, pg_errors.UndefinedFunction, TypeError, ValueError)


@dataclass
class Settings:
    """A worker's settings, checked once (shared with the asyncio worker)."""

    dsn: str
    queue: str
    concurrency: int
    batch: int
    lease: timedelta | None
    wait: float
    non_retryable: tuple[type[BaseException], ...]
    retry_in: timedelta | None
    grace: float
    poll_interval: float
    consumer: str
    application_name: str
    prepare_threshold: int | None
    session_bound: bool
    max_backoff: float
    connect_timeout: int

    @classmethod
    def check(
        cls,
        dsn: str,
        queue: str,
        handler: object,
        *,
        concurrency: int,
        batch: int | None,
        lease: Seconds | None,
        wait: Seconds,
        non_retryable: Iterable[type[BaseException]],
        retry_in: Seconds | None,
        grace: Seconds,
        poll_interval: Seconds,
        consumer: str | None,
        application_name: str,
        prepare_threshold: int | None,
        session_bound: bool,
        max_backoff: Seconds,
        connect_timeout: int,
    ) -> Settings:
        if not isinstance(dsn, str):
            raise TypeError(f"dsn must be a connection string, not {type(dsn).__name__}")
        if not isinstance(queue, str) or not queue:
            raise ValueError(f"queue must be a queue's name, not {queue!r}")
        if not callable(handler):
            raise TypeError(f"handler must be callable, not {type(handler).__name__}")
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise ValueError(f"concurrency must be an int of at least 1, not {concurrency!r}")
        batch = concurrency if batch is None else batch
        if not isinstance(batch, int) or isinstance(batch, bool) or not 1 <= batch <= 1000:
            raise ValueError(f"batch must be an int from 1 to 1000, not {batch!r}")
        lease_td = interval(lease, "lease")
        if lease_td is not None and lease_td <= timedelta(0):
            raise ValueError(f"lease must be positive, not {lease_td}")
        wait_s = seconds(wait, "wait")
        if not 0 <= wait_s <= 60:
            raise ValueError(f"wait must be from 0 to 60 seconds, not {wait_s}")
        types = tuple(non_retryable)
        for t in types:
            if not (isinstance(t, type) and issubclass(t, BaseException)):
                raise TypeError(f"non_retryable must hold exception types, not {t!r}")
        grace_s, poll_s, backoff_s = (
            seconds(grace, "grace"),
            seconds(poll_interval, "poll_interval"),
            seconds(max_backoff, "max_backoff"),
        )
        if grace_s < 0 or poll_s <= 0 or backoff_s <= 0:
            raise ValueError("grace must not be negative; poll_interval and max_backoff must be positive")
        return cls(
            dsn=dsn,
            queue=queue,
            concurrency=concurrency,
            batch=batch,
            lease=lease_td,
            wait=wait_s,
            non_retryable=types,
            retry_in=interval(retry_in, "retry_in"),
            grace=grace_s,
            poll_interval=poll_s,
            consumer=consumer or f"{socket.gethostname()}:{os.getpid()}",
            application_name=application_name,
            prepare_threshold=prepare_threshold,
            session_bound=session_bound,
            max_backoff=backoff_s,
            connect_timeout=connect_timeout,
        )

    def connect_args(self) -> dict[str, Any]:
        return dict(
            autocommit=True,
            prepare_threshold=self.prepare_threshold,
            application_name=self.application_name,
            connect_timeout=self.connect_timeout,
        )

    def claim_query(self, qty: int, wait: float) -> tuple[str, list[Any]]:
        # now() is the claim's transaction start, from which the lease was granted; the
        # lease left is measured by the server's clock (see Held). Without a wait, no `wait`
        # argument: pgqueue before 0.5 has none.
        params = [self.queue, qty, self.lease, self.consumer, self.session_bound]
        waiting = ""
        if wait > 0:
            waiting = ", wait => %s::interval"
            params.append(timedelta(seconds=wait))
        return (
            "SELECT msg_id, claim_token, attempt, priority, payload, headers, enqueued_at,"
            " extract(epoch FROM lease_expires_at - now())::float8,"
            " extract(epoch FROM lease_expires_at - clock_timestamp())::float8"
            " FROM pgqueue.pgq_claim(queue => %s::text, qty => %s::int, lease => %s::interval,"
            f" consumer => %s::text, session_bound => %s::bool{waiting})",
            params,
        )

    def renew_query(self, held: list[Held], progress: list[Any]) -> tuple[str, list[Any]]:
        # Progress (beside msg_ids, None: unchanged) only when some message has a new report:
        # a server before 0.16.0 has no such argument.
        params: list[Any] = [
            self.queue,
            [h.message.msg_id for h in held],
            [h.message.claim_token for h in held],
            self.lease,
        ]
        reports = ""
        if any(p is not None for p in progress):
            reports = ", progress => %s::jsonb[]"
            params.append([None if p is None else Jsonb(p) for p in progress])
        return (
            "SELECT coalesce(array_agg(r), '{}') FROM pgqueue.pgq_renew(queue => %s::text,"
            f" msg_ids => %s::bigint[], claim_tokens => %s::uuid[], lease => %s::interval{reports}) r",
            params,
        )

    def finish_query(self, held: Held, outcome: str, error: str | None, result: Any = None) -> tuple[str, list[Any]]:
        """The call that finishes `held` by `outcome`: 'ack' (with `result`, if not None),
        'nack', 'fail', 'give_back', or 'park' (`result` is then the handler's `Park`)."""
        m = held.message
        if outcome == "park":
            assert isinstance(result, Park)
            return park_query(m, result.key, result.timeout, result.payload, result.on_timeout, self.queue)
        if outcome == "ack":
            # A result only when the handler returned one (a server before 0.16.0 has none).
            if result is not None:
                return (
                    "SELECT pgqueue.pgq_ack(queue => %s::text, msg_id => %s::bigint, claim_token => %s::uuid,"
                    " result => %s::jsonb)",
                    [self.queue, m.msg_id, m.claim_token, Jsonb(result)],
                )
            return (
                "SELECT pgqueue.pgq_ack(queue => %s::text, msg_id => %s::bigint, claim_token => %s::uuid)",
                [self.queue, m.msg_id, m.claim_token],
            )
        if outcome == "fail":
            return (
                "SELECT pgqueue.pgq_fail(queue => %s::text, msg_id => %s::bigint, claim_token => %s::uuid,"
                " error => %s::text)",
                [self.queue, m.msg_id, m.claim_token, error],
            )
        retry_in = timedelta(0) if outcome == "give_back" else self.retry_in
        return (
            "SELECT pgqueue.pgq_nack(queue => %s::text, msg_id => %s::bigint, claim_token => %s::uuid,"
            " retry_in => %s::interval, error => %s::text)",
            [self.queue, m.msg_id, m.claim_token, retry_in, error],
        )


@dataclass(eq=False)
class Held:
    """A message this worker holds, and when its lease is due for renewal (monotonic clock)."""

    message: Message
    lease: float  # seconds granted by each claim or renewal
    renew_at: float
    state: str = "running"  # running -> finishing | given_back
    lost: bool = False
    task: Any = field(default=None, repr=False)  # the asyncio worker's task

    @classmethod
    def from_row(cls, row: tuple[Any, ...], now: float) -> Held:
        msg_id, token, attempt, priority, payload, headers, enqueued_at, granted, left = row
        message = Message(
            msg_id=msg_id,
            attempt=attempt,
            payload=payload,
            headers=headers,
            priority=priority,
            enqueued_at=enqueued_at,
            claim_token=token,
        )
        # Renew when a third of the lease has passed. Before pgqueue 0.6.0 a waiting claim's
        # lease counted from the statement's start: if the wait spent much of it, renew at once.
        return cls(message, granted, now + left - granted * 2 / 3)

    def renewable(self, now: float) -> bool:
        """Due for renewal: still held, running or finishing, not parked by its handler."""
        return (
            not self.lost and self.state != "given_back" and not self.message._parked.is_set() and self.renew_at <= now
        )

    def renewed(self, now: float) -> None:
        self.renew_at = now + self.lease / 3

    def told_to_stop(self) -> None:
        """A renewal found the claim no longer held (its cancel requested, or lost): the
        handler is to stop."""
        self.lost = True
        self.message.stop.set()


def wait_unsupported(exc: psycopg.Error) -> bool:
    """The server cannot wait for messages: not in this transaction isolation (0A000), or a
    pgqueue before waiting claims (no `wait` argument, 42883)."""
    return isinstance(exc, (pg_errors.FeatureNotSupported, pg_errors.UndefinedFunction))


def shorter_wait(exc: Exception, wait: float) -> bool:
    """A waiting claim was cancelled (57014) though the worker is not stopping: most likely a
    statement_timeout shorter than the wait, so wait half as long from now on."""
    if not isinstance(exc, pg_errors.QueryCanceled) or wait < 1:
        return False
    log.warning("claim cancelled while waiting (%s): waiting %.1f s from now on", short(exc), wait / 2)
    return True


def refused_result(held: Held, exc: Exception) -> None:
    """A handler's result the ack could not store: the work is done, so the message is acked
    without it rather than left to be done again (which would not get it stored either)."""
    log.error("message %d: its result was refused (%s); acking it without", held.message.msg_id, short(exc))


def put_back(held: list[Held], progress: list[Any]) -> None:
    """Progress whose renewal did not get through goes with the next one."""
    for h, p in zip(held, progress, strict=True):
        if p is not None:
            h.message._progress.put_back(p)


def refused_park(held: Held, exc: Exception) -> str:
    """A park the server refused (a bad key or timeout, a payload too large or not JSON, a server
    before 0.18.0): the message is nacked instead, with the error, so that it is not lost."""
    log.error("message %d: its park was refused (%s); nacking it", held.message.msg_id, short(exc))
    return f"pgqueue.Park refused: {short(exc)}"


def parked(held: Held) -> bool:
    """Whether the handler parked its message itself (`pgqueue.park`): its claim ended, so there
    is nothing left to renew, finish or give back."""
    if held.message._parked.is_set():
        log.debug("message %d was parked by its handler; nothing to finish", held.message.msg_id)
        return True
    return False


def fenced_false(what: str, held: Held) -> None:
    m = held.message
    log.warning(
        "%s of message %d (attempt %d) changed nothing: its claim was lost (the lease ran out and it was"
        " re-armed, or another worker holds it now), its cancel was requested (a renewal: the handler is told"
        " to stop), or an earlier try of this call committed before the connection broke; its work may be"
        " done again",
        what,
        m.msg_id,
        m.attempt,
    )


class _Link:
    """A connection that is opened again after it broke; safe to share between threads
    (psycopg serializes the statements of one connection)."""

    def __init__(self, settings: Settings, name: str) -> None:
        self._settings = settings
        self._name = name
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None

    def get(self) -> psycopg.Connection[Any]:
        with self._lock:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self._settings.dsn, **self._settings.connect_args())
                log.debug("%s connection opened", self._name)
            return self._conn

    def fetch(self, sql: str, params: list[Any]) -> Any:
        conn = self.get()
        try:
            return conn.execute(sql, params).fetchall()
        except REFUSED:
            raise  # the connection is fine
        except CONNECTION_ERRORS:
            self.drop(conn)
            raise

    def drop(self, conn: psycopg.Connection[Any] | None = None) -> None:
        with self._lock:
            if self._conn is not None and (conn is None or conn is self._conn):
                self._conn.close()
                self._conn = None

    def cancel(self) -> None:
        conn = self._conn
        if conn is not None and not conn.closed:
            try:
                conn.cancel_safe(timeout=5)
            except Exception as exc:  # cancelling is a courtesy: the claim ends anyway
                log.debug("cancelling the claim failed: %s", exc)


class Worker:
    """Runs `handler(message)` for each message of `queue`, in up to `concurrency` threads.

    A handler that returns acks its message, with what it returned (if not None, anything
    JSON can hold) as the message's result; one that raises nacks it with the exception's
    type and text (retried after `retry_in`, or the server's backoff), or fails it (dead
    letter at once) if the exception is an instance of one of `non_retryable`; one that raises
    `Park` parks it until a signal (pgqueue 0.18.0 or later). Progress a handler reports
    (`message.report_progress`) goes with the next lease renewal.
    """

    def __init__(
        self,
        dsn: str,
        queue: str,
        handler: Handler,
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
        if inspect.iscoroutinefunction(handler):
            raise TypeError("handler is a coroutine function: run it with pgqueue.aio.AsyncWorker")
        self._handler = handler
        self._claim_link = _Link(self.settings, "claim")
        self._link = _Link(self.settings, "control")
        self._held: dict[int, Held] = {}
        self._changed = threading.Condition()  # guards _held; notified when it shrinks
        self._jobs: queue_module.SimpleQueue[Held | None] = queue_module.SimpleQueue()
        self._stopping = threading.Event()
        self._hurry = threading.Event()  # a second stop: no grace
        self._done = threading.Event()  # give up retrying finishes
        self._claiming = False
        self._started = False

    # -- public ---------------------------------------------------------------------------

    def run(self, handle_signals: bool = True) -> None:
        """Works until `stop()` (or SIGTERM / SIGINT, when `handle_signals` and called in the
        main thread; a second signal skips the grace period). On the way out it lets running
        handlers finish for up to `grace` seconds, then gives back what it still holds.
        Raises on errors that retrying cannot fix (no such queue, no privilege, bad settings)."""
        if self._started:
            raise RuntimeError("a worker runs once; make a new one")
        self._started = True
        restore = self._install_signals() if handle_signals else {}
        threads = [
            threading.Thread(target=self._work, name=f"pgqueue-handler-{i}", daemon=True)
            for i in range(self.settings.concurrency)
        ]
        threads.append(threading.Thread(target=self._renew_loop, name="pgqueue-renewer", daemon=True))
        for t in threads:
            t.start()
        try:
            self._claim_loop()
        finally:
            self._stopping.set()
            self._shutdown()
            for sig, previous in restore.items():
                signal.signal(sig, previous)

    def stop(self) -> None:
        """Stops claiming and ends `run()` gracefully; from any thread. Twice: without grace."""
        if self._stopping.is_set():
            self._hurry.set()
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()
        if self._claiming:
            self._claim_link.cancel()

    @property
    def held(self) -> list[Message]:
        """The messages held right now."""
        with self._changed:
            return [h.message for h in self._held.values()]

    # -- claiming -------------------------------------------------------------------------

    def _claim_loop(self) -> None:
        s = self.settings
        failures = 0
        wait = s.wait
        granted = s.lease.total_seconds() if s.lease else None
        while not self._stopping.is_set():
            with self._changed:
                while len(self._held) >= s.concurrency and not self._stopping.is_set():
                    self._changed.wait()
                free = s.concurrency - len(self._held)
            if self._stopping.is_set():
                break
            # Wait no longer than a third of the lease: before pgqueue 0.6.0 a waiting claim's
            # lease counted from the statement's start, so a long wait handed out messages
            # with little lease left (or none).
            this_wait = min(wait, granted / 3) if granted else wait
            try:
                self._claiming = True
                if self._stopping.is_set():
                    break
                rows = self._claim_link.fetch(*s.claim_query(min(free, s.batch), this_wait))
                failures = 0
            except CONNECTION_ERRORS as exc:
                if self._stopping.is_set():
                    break
                if shorter_wait(exc, this_wait):
                    wait = this_wait / 2
                    continue
                failures += 1
                pause = backoff(failures, s.max_backoff)
                log.warning("claim on queue %r failed (%s); again in %.1f s", s.queue, short(exc), pause)
                self._stopping.wait(pause)
                continue
            except psycopg.Error as exc:
                if wait > 0 and wait_unsupported(exc):
                    log.warning(
                        "the server cannot wait for messages here (%s): polling every %.1f s instead",
                        short(exc),
                        s.poll_interval,
                    )
                    wait = 0
                    continue
                raise
            finally:
                self._claiming = False
            now = time.monotonic()
            fresh = [Held.from_row(row, now) for row in rows]
            if fresh:
                granted = granted or fresh[0].lease
                self._dispatch(fresh, now)
            elif wait == 0:
                self._stopping.wait(s.poll_interval)

    def _dispatch(self, fresh: list[Held], now: float) -> None:
        with self._changed:
            for h in fresh:
                self._held[h.message.msg_id] = h
        # A claim that waited may bring messages whose lease is mostly spent: renew those
        # first, and start only what is still ours.
        late = [h for h in fresh if h.renew_at <= now]
        if late:
            self._renew(late)
        for h in fresh:
            if h.lost:
                self._forget(h)
            else:
                self._jobs.put(h)

    def _forget(self, held: Held) -> None:
        with self._changed:
            self._held.pop(held.message.msg_id, None)
            self._changed.notify_all()

    # -- handling -------------------------------------------------------------------------

    def _work(self) -> None:
        while (held := self._jobs.get()) is not None:
            if held.state != "running":
                continue
            outcome, error, result = "ack", None, None
            try:
                result = self._handler(held.message)
            except Park as park:
                outcome, result = "park", park
                log.info("message %d (attempt %d): %s", held.message.msg_id, held.message.attempt, park)
            except BaseException as exc:  # noqa: BLE001 - every failure is reported to the server
                error = error_text(exc)
                outcome = "fail" if isinstance(exc, self.settings.non_retryable) else "nack"
                log.info("message %d (attempt %d) failed: %s", held.message.msg_id, held.message.attempt, error)
            self._finish(held, outcome, error, result)

    def _finish(self, held: Held, outcome: str, error: str | None, result: Any) -> None:
        with self._changed:
            if held.state != "running":
                log.warning(
                    "message %d finished after it was given back; its work may be done again", held.message.msg_id
                )
                return
            held.state = "finishing"
        try:
            self._call_until_done(held, outcome, error, result)
        finally:
            self._forget(held)

    def _call_until_done(self, held: Held, outcome: str, error: str | None, result: Any) -> None:
        """One finishing call, tried again through connection losses (with the same token: if
        the claim was lost meanwhile, the fence makes it change nothing)."""
        if parked(held):
            return
        failures = 0
        while True:
            try:
                rows = self._link.fetch(*self.settings.finish_query(held, outcome, error, result))
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
                self._done.wait(pause)
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

    def _renew_loop(self) -> None:
        while not self._done.wait(0.1):
            now = time.monotonic()
            with self._changed:
                due = [h for h in self._held.values() if h.renewable(now)]
            if due:
                self._renew(due)

    def _renew(self, due: list[Held]) -> None:
        now = time.monotonic()
        progress = [h.message._progress.take() for h in due]
        try:
            rows = self._link.fetch(*self.settings.renew_query(due, progress))
        except REFUSED as exc:
            # Refused progress is dropped: the renewal is due again at once, without it.
            log.error("renewing %d leases failed: %s", len(due), exc)
            return
        except CONNECTION_ERRORS as exc:
            log.warning("renewing %d leases failed (%s); trying again", len(due), short(exc))
            put_back(due, progress)
            time.sleep(backoff(1, self.settings.max_backoff))
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

    def _shutdown(self) -> None:
        s = self.settings
        deadline = time.monotonic() + s.grace
        with self._changed:
            while self._held and not self._hurry.is_set() and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(min(left, 0.1))
            back = [h for h in self._held.values() if h.state == "running"]
            for h in back:
                h.state = "given_back"
        for h in back:
            log.info("giving back message %d (attempt %d)", h.message.msg_id, h.message.attempt)
            self._give_back(h)
        # Finishing calls still retrying get a last few seconds.
        end = time.monotonic() + 10
        with self._changed:
            while self._held and (left := end - time.monotonic()) > 0:
                self._changed.wait(min(left, 0.1))
        self._done.set()
        for _ in range(s.concurrency):
            self._jobs.put(None)
        self._claim_link.drop()
        self._link.drop()

    def _give_back(self, held: Held) -> None:
        if parked(held):
            self._forget(held)
            return
        for attempt in range(3):
            try:
                rows = self._link.fetch(*self.settings.finish_query(held, "give_back", None))
            except CONNECTION_ERRORS as exc:
                log.warning("giving back message %d failed (%s)", held.message.msg_id, short(exc))
                time.sleep(backoff(attempt, 2))
                continue
            except psycopg.Error as exc:
                log.error("giving back message %d failed: %s", held.message.msg_id, exc)
                break
            if not rows[0][0]:
                fenced_false("giving back", held)
            break
        else:
            log.error("message %d was not given back; its lease will run out", held.message.msg_id)
        self._forget(held)

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda *_: self.stop())
        return previous
