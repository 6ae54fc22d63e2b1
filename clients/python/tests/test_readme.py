"""The README's first example, as a new user would run it: copied into a file, with their
connection string, started, stopped with Ctrl-C (SIGINT)."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
from conftest import outcomes, wait_for

README = Path(__file__).parent.parent / "README.md"


def test_the_readme_worker_runs_as_written(dsn, db, tmp_path):
    example = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert example, "the README starts with a Python example"
    code, n = re.subn(r'^DSN = ".*"$', f"DSN = {dsn!r}", example.group(1), flags=re.M)
    assert n == 1, "the example has one DSN line to fill in"
    script = tmp_path / "worker.py"
    script.write_text(code)
    with contextlib.suppress(psycopg.errors.UndefinedObject):
        db.execute("SELECT pgqueue.pgq_drop_queue('emails', force => true)")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for("the ten jobs", lambda: outcomes(db, "emails").get("completed") == 10)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    db.execute("SELECT pgqueue.pgq_drop_queue('emails', force => true)")
    assert proc.returncode == 0, out
    assert "attempt 1: email to user9@example.com" in out, out
