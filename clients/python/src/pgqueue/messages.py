"""What a handler receives, and the small conversions the producer and workers share."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

Seconds = timedelta | int | float
"""An interval: a timedelta, or a number of seconds."""


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
