"""Shared fixtures: a live server (PGQUEUE_TEST_DSN, required), a fresh queue per test, and
helpers that poll instead of sleeping."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
import pytest

import pgqueue

T = TypeVar("T")


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("PGQUEUE_TEST_DSN"):
        raise pytest.UsageError(
            "PGQUEUE_TEST_DSN is not set: these tests need a live PostgreSQL with pgqueue "
            "(a libpq connection string, e.g. 'host=127.0.0.1 port=5432 user=postgres dbname=postgres')"
        )


@pytest.fixture(scope="session")
def dsn() -> str:
    return os.environ["PGQUEUE_TEST_DSN"]


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection for the test's own checks."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def make_queue(db: psycopg.Connection[Any]) -> Iterator[Callable[..., str]]:
    """Creates queues with unique names (dropped afterwards): make_queue(lease='2 s', ...)."""
    made: list[str] = []

    def make(lease: str = "30 s", max_attempts: int = 5) -> str:
        name = f"py_{uuid.uuid4().hex[:12]}"
        db.execute(
            "SELECT pgqueue.pgq_create_queue(%s, lease => %s::interval, max_attempts => %s)",
            [name, lease, max_attempts],
        )
        made.append(name)
        return name

    yield make
    for name in made:
        with contextlib.suppress(psycopg.Error):
            db.execute("SELECT pgqueue.pgq_drop_queue(%s, force => true)", [name])


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 60) -> T:
    """Polls `check` until it returns something truthy; fails the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def outcomes(db: psycopg.Connection[Any], queue: str) -> dict[str, int]:
    rows = db.execute("SELECT outcome, count(*) FROM pgqueue.history WHERE queue = %s GROUP BY 1", [queue]).fetchall()
    return {outcome: n for outcome, n in rows}


def waiting(db: psycopg.Connection[Any], queue: str) -> int:
    """Messages of `queue` still in the hot table (waiting or claimed)."""
    row = db.execute("SELECT count(*) FROM pgqueue.messages WHERE queue = %s", [queue]).fetchone()
    assert row is not None
    return int(row[0])


def history_row(db: psycopg.Connection[Any], msg_id: int) -> tuple[Any, ...] | None:
    return db.execute("SELECT outcome, attempt, last_error FROM pgqueue.history WHERE msg_id = %s", [msg_id]).fetchone()


@contextlib.contextmanager
def running(worker: pgqueue.Worker, join: float = 60) -> Iterator[threading.Thread]:
    """Runs `worker` in a thread for the duration of the block, then stops it and checks that
    run() returned without an error."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # handed to the test below
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        worker.stop()
        thread.join(join)
    assert not thread.is_alive(), "the worker did not stop"
    if errors:
        raise errors[0]


def terminate(db: psycopg.Connection[Any], application_name: str) -> int:
    """pg_terminate_backend of every connection with that application_name; how many."""
    row = db.execute(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE application_name = %s AND pid <> pg_backend_pid()",
        [application_name],
    ).fetchone()
    assert row is not None
    return int(row[0])


def connections(db: psycopg.Connection[Any], application_name: str) -> int:
    row = db.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [application_name]).fetchone()
    assert row is not None
    return int(row[0])
