"""A worker process for the tests: `python worker_process.py DSN QUEUE APPLICATION_NAME [chaos]`.

Runs pgqueue.Worker in the main thread (so SIGTERM and SIGINT stop it gracefully) with
prepared statements off. The handler sleeps for the payload's "sleep" seconds; in chaos
mode it records each run (msg_id, attempt) in table chaos_runs, committed on a connection of
its own, before the worker acks."""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

import psycopg

import pgqueue

dsn, queue, app = sys.argv[1:4]
chaos = sys.argv[4:] == ["chaos"]
logging.basicConfig(level=logging.WARNING, format=f"[{app}] %(levelname)s %(message)s")
local = threading.local()


def record(msg: pgqueue.Message) -> None:
    conn: Any = getattr(local, "conn", None)
    if conn is None or conn.closed:
        conn = local.conn = psycopg.connect(dsn, autocommit=True, application_name=app, connect_timeout=5)
    try:
        conn.execute("INSERT INTO chaos_runs (msg_id, attempt) VALUES (%s, %s)", [msg.msg_id, msg.attempt])
    except psycopg.OperationalError:
        conn.close()
        raise


def handle(msg: pgqueue.Message) -> None:
    if chaos:
        record(msg)
    elif isinstance(msg.payload, dict):
        time.sleep(msg.payload.get("sleep", 0))


worker = pgqueue.Worker(
    dsn,
    queue,
    handle,
    concurrency=4 if chaos else 1,
    batch=10 if chaos else 1,
    wait=5,
    retry_in=0 if chaos else None,
    grace=10,
    max_backoff=2,
    application_name=app,
    prepare_threshold=None,
)
worker.run()
