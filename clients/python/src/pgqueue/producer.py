"""Sending messages: inside the caller's transaction (`send`, `send_batch`), or on a
connection of the producer's own that commits each call (`Producer`); reading, or
awaiting, what became of one (`result`); its dependencies (`graph`); parking a claimed
message (`park`) and resuming what is parked on a key (`signal`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import psycopg
from psycopg.types.json import Jsonb

from .messages import Message, OnTimeout, Seconds, check_park, interval, park_timeout

Target = psycopg.Connection[Any] | psycopg.Cursor[Any]

ParentFailure = Literal["cancel", "dead", "run"]
"""What becomes of a message sent with `after` when a parent fails (is dead-lettered, cancelled,
or deleted with its queue): 'cancel' (the server's default) cancels it, 'dead' dead-letters it
(both down its own children too), 'run' lets it run all the same."""


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
    after: Sequence[int] | None = None,
    on_parent_failure: ParentFailure | None = None,
) -> int:
    """Enqueues `payload` (anything JSON can hold) on the caller's connection or cursor and
    returns its msg_id. Never commits: the message becomes visible when the caller's
    transaction commits (with an autocommit connection, at once), and vanishes if it rolls back.
    With `dedup_key`, a key already held returns the id of the message that holds it.

    With `after` (msg_ids of committed messages, of any queue), the message is 'pending'
    until every one of them has completed, then ready (or delayed until its `delay`);
    `on_parent_failure` says what becomes of it if one fails instead (`ParentFailure`;
    the server's default: 'cancel'). Needs pgqueue 0.17.0 or later; left out, the statement
    is one older servers know."""
    sql, params = send_query(queue, payload, delay, priority, headers, dedup_key, dedup_for, after, on_parent_failure)
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
    after: Sequence[int] | None = None,
    on_parent_failure: ParentFailure | None = None,
) -> list[int]:
    """Enqueues up to 10,000 payloads in one statement; returns their ids in order. Like
    `send`, it never commits. With `after`, every message of the batch waits for all of
    those parents (see `send`)."""
    sql, params = send_batch_query(
        queue, payloads, delay, priority, headers, dedup_keys, dedup_for, after, on_parent_failure
    )
    row = _cursor(target, "send_batch").execute(sql, params).fetchone()
    assert row is not None
    return [int(i) for i in row[0] or []]


@dataclass(frozen=True)
class Outcome:
    """What became of a message so far, as `result` reads it (`pgq_result`)."""

    state: str
    """'pending' (waiting for its parents: `send(..., after=...)`), 'ready', 'delayed', 'parked'
    (waiting for a signal: `Park`) or 'claimed' while it waits or runs; once finished, its
    outcome: 'completed', 'dead' or 'cancelled'."""
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


@dataclass(frozen=True)
class GraphRow:
    """One message of a message's dependency graph, as `graph` reads it (`pgq_graph`)."""

    relation: str
    """'message' (the message asked about), 'parent' (one of its `after`, in their order) or
    'child' (a message sent with it in its `after` and still in the queue)."""
    id: int
    """Its msg_id."""
    queue: str | None
    """None for a parent whose history was pruned (so is everything below but `relation`, `id`)."""
    state: str | None
    """As `Outcome.state`: 'pending', 'ready', 'delayed', 'parked' or 'claimed' while in the
    queue, its outcome once finished."""
    on_parent_failure: str | None
    """A child's policy ('cancel', 'dead', 'run'); the message's own while it waits for parents;
    None for a parent."""
    enqueued_at: datetime | None
    finished_at: datetime | None

    @property
    def finished(self) -> bool:
        return self.finished_at is not None


def graph(target: Target, msg_id: int) -> list[GraphRow]:
    """The dependencies of message `msg_id`: the message itself first ('message'), then its
    parents ('parent'), then its children still in the queue ('child'); an empty list when
    there is no such message (or its history was pruned). Needs pgqueue 0.17.0 or later."""
    return [GraphRow(*row) for row in _cursor(target, "graph").execute(*graph_query(msg_id)).fetchall()]


def park(
    target: Target,
    message: Message,
    key: str,
    timeout: Seconds,
    *,
    payload: Any = None,
    on_timeout: OnTimeout | None = None,
    queue: str | None = None,
) -> bool:
    """Parks a claimed message (`pgq_park`) on the caller's connection or cursor: its claim
    ends, and it waits until `signal(key)` or until `timeout` (at most 365 days) passes; see
    `Park` for what then becomes of it. Never commits: the park takes effect when the caller's
    transaction commits. False: the claim was no longer held under `message.claim_token` (lost,
    or of another queue than `queue`, if given); nothing changed. Inside a `Worker`'s handler,
    raising `Park` is simpler; a message this call parked is neither renewed nor finished by
    the worker afterwards. Needs pgqueue 0.18.0 or later."""
    row = _cursor(target, "park").execute(*park_query(message, key, timeout, payload, on_timeout, queue)).fetchone()
    assert row is not None
    if row[0]:
        message._parked.set()
    return bool(row[0])


def signal(target: Target, key: str, payload: Any = None, keep: Seconds | None = None) -> int:
    """Resumes every message parked on `key` (`pgq_signal`): claimable again, with `payload`
    (anything JSON can hold) in their "pgq_park" header; returns how many. The signal is kept
    for `keep` (the server's default: 1 day; 0: not kept), and a message parked on `key`
    meanwhile resumes at once; signalling a key whose signal is still kept changes nothing.
    Never commits. Needs pgqueue 0.18.0 or later."""
    row = _cursor(target, "signal").execute(*signal_query(key, payload, keep)).fetchone()
    assert row is not None
    return int(row[0])


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

    def _rows(self, sql: str, params: list[Any]) -> list[Any]:
        conn = self._connection()
        try:
            return conn.execute(sql, params).fetchall()
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
        after: Sequence[int] | None = None,
        on_parent_failure: ParentFailure | None = None,
    ) -> int:
        """`send`, committed."""
        return int(
            self._run(
                *send_query(queue, payload, delay, priority, headers, dedup_key, dedup_for, after, on_parent_failure)
            )
        )

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
        after: Sequence[int] | None = None,
        on_parent_failure: ParentFailure | None = None,
    ) -> list[int]:
        """`send_batch`, committed."""
        ids = self._run(
            *send_batch_query(
                queue, payloads, delay, priority, headers, dedup_keys, dedup_for, after, on_parent_failure
            )
        )
        return [int(i) for i in ids or []]

    def result(self, msg_id: int, wait: Seconds | None = None, queue: str | None = None) -> Outcome | None:
        """`result`; a wait holds the producer's connection (its other calls wait meanwhile)."""
        row = self._row(*result_query(msg_id, wait, queue))
        return None if row is None else Outcome(*row)

    def graph(self, msg_id: int) -> list[GraphRow]:
        """`graph`."""
        return [GraphRow(*row) for row in self._rows(*graph_query(msg_id))]

    def signal(self, key: str, payload: Any = None, keep: Seconds | None = None) -> int:
        """`signal`, committed."""
        return int(self._run(*signal_query(key, payload, keep)))

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
    after: Sequence[int] | None,
    on_parent_failure: ParentFailure | None,
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
    if after is not None:
        args.append("after => %s::bigint[]")
        params.append(_ids(after, "after"))
    if on_parent_failure is not None:
        if not isinstance(on_parent_failure, str):
            raise TypeError(
                f"on_parent_failure must be 'cancel', 'dead' or 'run', not {type(on_parent_failure).__name__}"
            )
        args.append("on_parent_failure => %s::text")
        params.append(on_parent_failure)
    return args, params


def _ids(ids: Sequence[int], name: str) -> list[int]:
    if isinstance(ids, (str, bytes, Mapping)) or not isinstance(ids, Sequence):
        raise TypeError(f"{name} must be a sequence (a list) of msg_ids, not {type(ids).__name__}")
    for i in ids:
        if not isinstance(i, int) or isinstance(i, bool):
            raise TypeError(f"{name} must hold msg_ids (int), not {type(i).__name__}")
    return list(ids)


def send_query(
    queue: str,
    payload: Any,
    delay: Seconds | None,
    priority: int,
    headers: Mapping[str, Any] | None,
    dedup_key: str | None,
    dedup_for: Seconds | None,
    after: Sequence[int] | None = None,
    on_parent_failure: ParentFailure | None = None,
) -> tuple[str, list[Any]]:
    args, params = _common(queue, delay, priority, headers, dedup_for, after, on_parent_failure)
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
    after: Sequence[int] | None = None,
    on_parent_failure: ParentFailure | None = None,
) -> tuple[str, list[Any]]:
    if isinstance(payloads, (str, bytes, Mapping)) or not isinstance(payloads, Sequence):
        raise TypeError(f"payloads must be a sequence (a list) of payloads, not {type(payloads).__name__}")
    args, params = _common(queue, delay, priority, headers, dedup_for, after, on_parent_failure)
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


def graph_query(msg_id: int) -> tuple[str, list[Any]]:
    if not isinstance(msg_id, int) or isinstance(msg_id, bool):
        raise TypeError(f"msg_id must be an int, not {type(msg_id).__name__}")
    sql = (
        "SELECT relation, id, queue, state, on_parent_failure, enqueued_at, finished_at"
        " FROM pgqueue.pgq_graph(msg_id => %s::bigint)"
    )
    return sql, [msg_id]


def park_query(
    message: Message,
    key: str,
    timeout: Seconds,
    payload: Any,
    on_timeout: OnTimeout | None,
    queue: str | None,
) -> tuple[str, list[Any]]:
    if not isinstance(message, Message):
        raise TypeError(f"message must be a pgqueue.Message, not {type(message).__name__}")
    check_park(key, on_timeout)
    args: list[str] = [
        "msg_id => %s::bigint",
        "claim_token => %s::uuid",
        "key => %s::text",
        "timeout => %s::interval",
    ]
    params: list[Any] = [message.msg_id, message.claim_token, key, park_timeout(timeout)]
    if payload is not None:
        args.append("payload => %s::jsonb")
        params.append(Jsonb(payload))
    if on_timeout is not None:
        args.append("on_timeout => %s::text")
        params.append(on_timeout)
    if queue is not None:
        args.append("queue => %s::text")
        params.append(queue)
    return f"SELECT pgqueue.pgq_park({', '.join(args)})", params


def signal_query(key: str, payload: Any, keep: Seconds | None) -> tuple[str, list[Any]]:
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, not {type(key).__name__}")
    args: list[str] = ["key => %s::text"]
    params: list[Any] = [key]
    if payload is not None:
        args.append("payload => %s::jsonb")
        params.append(Jsonb(payload))
    if keep is not None:
        args.append("keep => %s::interval")
        params.append(interval(keep, "keep"))
    return f"SELECT pgqueue.pgq_signal({', '.join(args)})", params
