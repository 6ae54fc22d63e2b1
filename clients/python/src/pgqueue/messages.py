"""What a handler receives, and the small conversions the producer and workers share."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal
from uuid import UUID

Seconds = timedelta | int | float
"""An interval: a timedelta, or a number of seconds."""

OnTimeout = Literal["resume", "dead"]
"""What becomes of a parked message whose timeout passes with no signal: 'resume' (the server's
default) makes it claimable again, with `"timed_out": true` in its "pgq_park" header; 'dead'
dead-letters it."""


class Latest:
    """The latest progress reported and not sent yet: reported by the handler, taken by the
    renewal that sends it (another thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value: Any = None

    def put(self, value: Any) -> None:
        with self._lock:
            self._value = value

    def take(self) -> Any:
        with self._lock:
            value, self._value = self._value, None
            return value

    def put_back(self, value: Any) -> None:
        """A report whose renewal did not get through, unless a newer one came meanwhile."""
        with self._lock:
            if self._value is None:
                self._value = value


@dataclass(frozen=True)
class Message:
    """A claimed message, as the handler sees it."""

    msg_id: int
    attempt: int
    """How many times it was claimed, this claim included (1 on the first)."""
    payload: Any
    headers: dict[str, Any] | None
    """As sent; a message that was parked (`Park`, `pgqueue.park`) has a "pgq_park" entry: its
    park's key, parked_at, timeout_at, on_timeout, payload, and once resumed signal (the
    signal's payload), signalled_at and resumed_at, or timed_out and resumed_at."""
    priority: int
    enqueued_at: datetime
    claim_token: UUID = field(repr=False)
    """The claim's fence: pgqueue acts on the message only with the current token."""
    stop: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    """Set when the handler should stop: a renewal found the claim no longer held, because its
    cancel was requested (`pgq_cancel`) or it was lost. Check `stop.is_set()` between steps and
    return; the worker finishes the message as the handler returned, and the server records a
    requested cancel as `cancelled` whatever the call (and changes nothing for a lost claim)."""
    _progress: Latest = field(default_factory=Latest, init=False, repr=False, compare=False)
    _parked: threading.Event = field(default_factory=threading.Event, init=False, repr=False, compare=False)
    """Set by `pgqueue.park` when it parked this message: the worker then neither renews nor
    finishes it (the park ended its claim)."""

    def report_progress(self, value: Any) -> None:
        """Reports how far the job got: `value` (anything JSON can hold; None: nothing) is sent
        with the worker's next lease renewal (within lease/3) and kept with the message, for
        `pgqueue.result` to read, also after a retry. A newer report replaces one not sent yet;
        one still unsent when the handler returns is dropped (its result is what counts).
        Thread-safe."""
        self._progress.put(value)


def interval(value: Seconds | None, name: str) -> timedelta | None:
    """`value` as a timedelta (None stays None); a clear TypeError for anything else."""
    if value is None or isinstance(value, timedelta):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return timedelta(seconds=value)
    raise TypeError(f"{name} must be a timedelta or a number of seconds, not {type(value).__name__}")


def seconds(value: Seconds, name: str) -> float:
    delta = interval(value, name)
    assert delta is not None
    return delta.total_seconds()


class Park(Exception):
    """Raised by a handler to park its message (`pgq_park`, pgqueue 0.18.0 or later): the worker
    ends the claim and the message waits until `signal(key)` (its payload is then in the
    message's "pgq_park" header, for the handler that resumes it) or until `timeout` (at most
    365 days) passes: then it is claimable again with `"timed_out": true` in that header
    (`on_timeout` 'resume', the server's default) or dead-lettered ('dead'). `payload` (anything
    JSON can hold) is kept in the header too. The claim that resumes it does not count as a new
    attempt. A park the server refuses (a bad key or timeout, a server before 0.18.0) is logged
    and the message nacked with the error."""

    def __init__(self, key: str, timeout: Seconds, *, payload: Any = None, on_timeout: OnTimeout | None = None) -> None:
        check_park(key, on_timeout)
        self.key = key
        self.timeout = park_timeout(timeout)
        self.payload = payload
        self.on_timeout = on_timeout
        super().__init__(f"park on {key!r} for {self.timeout}")


def park_timeout(timeout: Seconds) -> timedelta:
    delta = interval(timeout, "timeout")
    if delta is None:
        raise TypeError("timeout must be a timedelta or a number of seconds, not None")
    return delta


def check_park(key: str, on_timeout: OnTimeout | None) -> None:
    """The types of a park's key and on_timeout (their values are the server's to check)."""
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, not {type(key).__name__}")
    if on_timeout is not None and not isinstance(on_timeout, str):
        raise TypeError(f"on_timeout must be 'resume' or 'dead', not {type(on_timeout).__name__}")


def error_text(exc: BaseException) -> str:
    """What a nack or fail records: the exception's type and message."""
    name = type(exc).__qualname__
    module = type(exc).__module__
    if module not in ("builtins", "__main__"):
        name = f"{module}.{name}"
    text = str(exc)
    return f"{name}: {text}" if text else name


def short(exc: BaseException) -> str:
    """An error's first line (a server error's CONTEXT lines are noise in a log line)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def backoff(failures: int, cap: float) -> float:
    """Seconds to wait after `failures` consecutive failures: doubling from 0.1 s, capped,
    with jitter so that a fleet of workers does not reconnect in step."""
    base: float = min(cap, 0.1 * 2.0 ** min(failures, 20))
    return base * random.uniform(0.5, 1.0)
