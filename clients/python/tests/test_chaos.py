"""Chaos: 8 worker processes, 20,000 jobs, their connections terminated at random moments and
the server restarted once (PGQUEUE_TEST_RESTART, required). At the end every job is in the
history exactly once, none is left, and a handler ran more than once only for a message that
was claimed more than once (at-least-once, never more than once per claim)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgqueue

HERE = Path(__file__).parent
JOBS = 20_000
WORKERS = 8
APP = "pgqueue-chaos"


def query(dsn: str, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    """One statement on a new connection, tried again while the server restarts."""
    deadline = time.monotonic() + 120
    while True:
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
                cur = conn.execute(sql, params)
                return cur.fetchall() if cur.description else []
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_chaos(dsn: str, tmp_path: Path) -> None:
    restart = os.environ.get("PGQUEUE_TEST_RESTART")
    if not restart:
        pytest.fail("PGQUEUE_TEST_RESTART is not set: the command that restarts the server under test")
    queue = f"chaos_{random.randrange(10**6)}"
    query(dsn, "SELECT pgqueue.pgq_create_queue(%s, lease => '5 s', max_attempts => 1000)", [queue])
    query(dsn, "DROP TABLE IF EXISTS chaos_runs")
    query(dsn, "CREATE TABLE chaos_runs (msg_id bigint NOT NULL, attempt int NOT NULL)")
    with pgqueue.Producer(dsn) as p:
        ids = [i for start in range(0, JOBS, 10_000) for i in p.send_batch(queue, list(range(start, start + 10_000)))]
    assert len(set(ids)) == JOBS

    logs = [tmp_path / f"worker-{n}.log" for n in range(WORKERS)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "worker_process.py"), dsn, queue, f"{APP}-{n}", "chaos"],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )
        for n, log in enumerate(logs)
    ]
    terminated, restarted = 0, False
    rng = random.Random()
    try:
        deadline = time.monotonic() + 240
        while True:
            (left,) = query(dsn, "SELECT count(*) FROM pgqueue.messages WHERE queue = %s", [queue])[0]
            if left == 0:
                break
            assert time.monotonic() < deadline, f"{left} messages still not finished"
            assert all(p.poll() is None for p in procs), "a worker process ended"
            if not restarted and left < JOBS * 0.6:
                subprocess.run(restart, shell=True, check=True, capture_output=True, timeout=120)
                restarted = True
            else:
                # Some of the workers' connections (claims, acks, renewals, handlers' own).
                (n,) = query(
                    dsn,
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE application_name LIKE %s AND random() < 0.3",
                    [APP + "-%"],
                )[0]
                terminated += n
            time.sleep(rng.uniform(0.2, 1.5))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=60)
    outputs = "".join(log.read_text()[-3000:] for log in logs)
    assert [p.returncode for p in procs] == [0] * WORKERS, outputs
    assert restarted and terminated > 0

    history = dict(
        query(dsn, "SELECT msg_id, attempt FROM pgqueue.history WHERE queue = %s AND outcome = 'completed'", [queue])
    )
    (rows, dead) = query(
        dsn,
        "SELECT count(*), count(*) FILTER (WHERE outcome <> 'completed') FROM pgqueue.history WHERE queue = %s",
        [queue],
    )[0]
    assert rows == JOBS and dead == 0, f"{rows} rows in history ({dead} not completed) for {JOBS} jobs"
    assert sorted(history) == sorted(ids), "every job completed exactly once, none lost"
    assert query(dsn, "SELECT count(*) FROM pgqueue.messages WHERE queue = %s", [queue]) == [(0,)]

    runs: dict[int, list[int]] = {}
    for msg_id, attempt in query(dsn, "SELECT msg_id, attempt FROM chaos_runs"):
        runs.setdefault(msg_id, []).append(attempt)
    assert sorted(runs) == sorted(ids), "every completed job's handler ran"
    for msg_id, attempts in runs.items():
        # At most one run per claim: re-runs only for messages claimed again.
        assert len(attempts) == len(set(attempts)), f"message {msg_id} ran twice in one claim: {attempts}"
        assert max(attempts) <= history[msg_id], f"message {msg_id} ran in attempts {attempts} of {history[msg_id]}"
    reruns = sum(len(a) - 1 for a in runs.values())
    again = sum(1 for attempt in history.values() if attempt > 1)
    print(f"chaos: {terminated} connections terminated, 1 restart; {again} jobs claimed again, {reruns} re-runs")
    query(dsn, "DROP TABLE chaos_runs")
    query(dsn, "SELECT pgqueue.pgq_drop_queue(%s, force => true)", [queue])
