"""The write-path probe's pgqueue cycle alone, with pgqueue.claim_ledger off and then on: row
writes, WAL and dead rows a job for the build installed (probe.py explains the columns).

    python bench/write_path/probe_ledger.py "host=127.0.0.1 port=54999 user=postgres" 25600 LABEL [QTY]

QTY: the messages a pgq_ack_claim call claims (default 64, as in probe.py).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe  # noqa: E402
import psycopg  # noqa: E402


def main():
    dsn, jobs, label = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if len(sys.argv) > 4:
        probe.QTY = int(sys.argv[4])
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS pgqueue")
        c.execute(probe.SCHEMA)
        if not c.execute("SELECT 1 FROM pgqueue.queues WHERE queue = 'probe'").fetchone():
            c.execute("SELECT pgqueue.pgq_create_queue('probe')")
        print("| build, ledger | row writes | HOT | WAL bytes | WAL records | FPI | dead rows left | VACUUM WAL |")
        for ledger in ("off", "on"):
            c.execute(f"SET pgqueue.claim_ledger = {ledger}")
            probe.measure(c, f"{label}, ledger {ledger}", jobs, lambda n: probe.pgqueue(c, n), ["pgqueue.message_rows"])


if __name__ == "__main__":
    main()
