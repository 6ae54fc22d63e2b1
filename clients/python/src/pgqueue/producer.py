"""Sending messages: inside the caller's transaction (`send`, `send_batch`), or on a
connection of the producer's own that commits each call (`Producer`); and reading, or
awaiting, what became of one (`result`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from .messages import Seconds, interval

Target = psycopg.Connection[Any] | psycopg.Cursor[Any]


def send(
    target: Target,
    queue: str,
    payload: Any,
    *,
    delay: Seconds | None = None,
    priority: int = 0,
    headers: Mapping[str, Any] | None = None,
    dedup_key: str | None = None,
    dedup_for: Seconds | None = None,
) -> int:
    """Enqueues `payload` (anything JSON can hold) on the caller's connection or cursor and
    returns its msg_id. Never commits: the message becomes visible when the caller's
    transaction commits (with an autocommit connection, at once), and vanishes if it rolls back.
    With `dedup_key`, a key already held returns the id of the message that holds it."""
    sql, params = send_query(queue, payload, delay, priority, headers, dedup_key, dedup_for)
    row = _cursor(target, "send").execute(sql, params).fetchone()
    assert row is not None
    return int(row[0])


def send_batch(
    target: Target,
    queue: str,
    payloads: Sequence[Any],
    *,
    delay: Seconds | None = None,
    priority: int = 0,
    headers: Mapping[str, Any] | None = None,
    dedup_keys: Sequence[str | None] | None = None,
    dedup_for: Seconds | None = None,
) -> list[int]:
    """Enqueues up to 10,000 payloads in one statement; returns their ids in order. Like
    `send`, it never commits."""
    sql, params = send_batch_query(queue, payloads, delay, priority, headers, dedup_keys, dedup_for)
    row = _cursor(target, "send_batch").execute(sql, params).fetchone()
    assert row is not None
    return [int(i) for i in row[0] or []]


@dataclass(frozen=True)
class Outcome:
    """What became of a message so far, as `result` reads it (`pgq_result`)."""

    state: str
    """'ready', 'delayed' or 'claimed' while it waits or runs; once finished, its outcome:
    'completed', 'dead' or 'cancelled'."""
    attempt: int
    result: Any
    """What its handler returned (completed messages only; None: nothing)."""
    progress: Any
    """The latest progress its handlers reported (kept across retries)."""
    last_error: str | None
    enqueued_at: datetime
    finished_at: datetime | None

    @property
    def finished(self) -> bool:
        return self.finished_at is not None


def result(target: Target, msg_id: int, wait: Seconds | None = None, queue: str | None = None) -> Outcome | None:
    """What became of message `msg_id` (of `queue`, if given); None when there is no such
    message (or its history was pruned). With `wait` (at most 60 s), a message not finished yet
    is waited for: the call returns at the commit that finishes it, or when `wait` runs out
    with the message as it is then (not `finished`). Waiting needs READ COMMITTED."""
    row = _cursor(target, "result").execute(*result_query(msg_id, wait, queue)).fetchone()
    return None if row is None else Outcome(*row)


class Producer:
    """Sends on a connection of its own; each call is its own transaction, committed when it
    returns. If the connection breaks during a call, the call raises (the message may or may
    not have been committed: send with a `dedup_key` to make a retry safe) and the next call
    connects again."""

    def __init__(
        self,
        dsn: str,
        *,
        prepare_threshold: int | None = None,
        application_name: str = "pgqueue-producer",
        connect_timeout: int = 10,
    ) -> None:
        self._connect_args: dict[str, Any] = dict(
            autocommit=True,
            prepare_threshold=prepare_threshold,
            application_name=application_name,
            connect_timeout=connect_timeout,
        )
        self._dsn = dsn
        self._conn: psycopg.Connection[Any] | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self._dsn, **self._connect_args)
        return self._conn

    def _row(self, sql: str, params: list[Any]) -> Any:
        conn = self._connection()
        try:
            return conn.execute(sql, params).fetchone()
        except psycopg.OperationalError:
            conn.close()
            raise

    def _run(self, sql: str, params: list[Any]) -> Any:
        row = self._row(sql, params)
        assert row is not None
        return row[0]

    def send(
        self,
        queue: str,
        payload: Any,
        *,
        delay: Seconds | None = None,
        priority: int = 0,
        headers: Mapping[str, Any] | None = None,
        dedup_key: str | None = None,
        dedup_for: Seconds | None = None,
    ) -> int:
        """`send`, committed."""
        return int(self._run(*send_query(queue, payload, delay, priority, headers, dedup_key, dedup_for)))

    def send_batch(
        self,
        queue: str,
        payloads: Sequence[Any],
        *,
        delay: Seconds | None = None,
        priority: int = 0,
        headers: Mapping[str, Any] | None = None,
        dedup_keys: Sequence[str | None] | None = None,
        dedup_for: Seconds | None = None,
    ) -> list[int]:
        """`send_batch`, committed."""
        ids = self._run(*send_batch_query(queue, payloads, delay, priority, headers, dedup_keys, dedup_for))
        return [int(i) for i in ids or []]

    def result(self, msg_id: int, wait: Seconds | None = None, queue: str | None = None) -> Outcome | None:
        """`result`; a wait holds the producer's connection (its other calls wait meanwhile)."""
        row = self._row(*result_query(msg_id, wait, queue))
        return None if row is None else Outcome(*row)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cursor(target: Any, what: str) -> Any:
    if isinstance(target, psycopg.Connection):
        return target.cursor()
    if isinstance(target, psycopg.Cursor):
        return target
    raise TypeError(
        f"{what}() takes a psycopg Connection or Cursor, not {type(target).__name__}"
        " (to send on a connection of its own, use pgqueue.Producer(dsn))"
    )


# The SQL, shared with the asyncio twin. Named arguments, as the SQL API asks; the optional
# ones only when given, so that the server's defaults apply.


def _common(
    queue: str,
    delay: Seconds | None,
    priority: int,
    headers: Mapping[str, Any] | None,
    dedup_for: Seconds | None,
) -> tuple[list[str], list[Any]]:
    if not isinstance(queue, str):
        raise TypeError(f"queue must be a str, not {type(queue).__name__}")
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise TypeError(f"priority must be an int, not {type(priority).__name__}")
    if headers is not None and not isinstance(headers, Mapping):
        raise TypeError(f"headers must be a mapping (a JSON object), not {type(headers).__name__}")
    args: list[str] = ["priority => %s::smallint"]
    params: list[Any] = [priority]
    if delay is not None:
        args.append("delay => %s::interval")
        params.append(interval(delay, "delay"))
    if headers is not None:
        args.append("headers => %s::jsonb")
        params.append(Jsonb(dict(headers)))
    if dedup_for is not None:
        args.append("dedup_for => %s::interval")
        params.append(interval(dedup_for, "dedup_for"))
    return args, params


def send_query(
    queue: str,
    payload: Any,
    delay: Seconds | None,
    priority: int,
    headers: Mapping[str, Any] | None,
    dedup_key: str | None,
    dedup_for: Seconds | None,
) -> tuple[str, list[Any]]:
    args, params = _common(queue, delay, priority, headers, dedup_for)
    if dedup_key is not None:
        args.append("dedup_key => %s::text")
        params.append(dedup_key)
    sql = f"SELECT pgqueue.pgq_send(queue => %s::text, payload => %s::jsonb, {', '.join(args)})"
    return sql, [queue, Jsonb(payload), *params]


def send_batch_query(
    queue: str,
    payloads: Sequence[Any],
    delay: Seconds | None,
    priority: int,
    headers: Mapping[str, Any] | None,
    dedup_keys: Sequence[str | None] | None,
    dedup_for: Seconds | None,
) -> tuple[str, list[Any]]:
    if isinstance(payloads, (str, bytes, Mapping)) or not isinstance(payloads, Sequence):
        raise TypeError(f"payloads must be a sequence (a list) of payloads, not {type(payloads).__name__}")
    args, params = _common(queue, delay, priority, headers, dedup_for)
    if dedup_keys is not None:
        if len(dedup_keys) != len(payloads):
            raise ValueError(
                f"dedup_keys has {len(dedup_keys)} keys for {len(payloads)} payloads: give one per payload"
            )
        args.append("dedup_keys => %s::text[]")
        params.append(list(dedup_keys))
    sql = (
        "SELECT array_agg(s.id ORDER BY s.n) FROM pgqueue.pgq_send_batch("
        f"queue => %s::text, payloads => %s::jsonb[], {', '.join(args)}) WITH ORDINALITY AS s(id, n)"
    )
    return sql, [queue, [Jsonb(p) for p in payloads], *params]


def result_query(msg_id: int, wait: Seconds | None, queue: str | None) -> tuple[str, list[Any]]:
    if not isinstance(msg_id, int) or isinstance(msg_id, bool):
        raise TypeError(f"msg_id must be an int, not {type(msg_id).__name__}")
    args: list[str] = ["msg_id => %s::bigint"]
    params: list[Any] = [msg_id]
    if wait is not None:
        args.append("wait => %s::interval")
        params.append(interval(wait, "wait"))
    if queue is not None:
        args.append("queue => %s::text")
        params.append(queue)
    sql = (
        "SELECT state, attempt, result, progress, last_error, enqueued_at, finished_at"
        f" FROM pgqueue.pgq_result({', '.join(args)})"
    )
    return sql, params
