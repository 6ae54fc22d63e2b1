"""Write-path probe: row writes, WAL bytes and WAL records per job for pgqueue and for
prototype layouts of the same job cycle (send in batches of 128, claim 64, ack 64), one
session, each call its own transaction. Counts, not times: the numbers do not depend on the
machine's load. See docs/design/write-path.md for what each layout is and what it keeps.
A second table breaks a send down: pgq_send_batch against the same rows inserted into copies
of its table with one thing changed each (fillfactor, row width, indexes, per-call work), and
against COPY into a table with one index.

    python bench/write_path/probe.py "host=127.0.0.1 port=54999 user=postgres" [jobs]

The server needs pgqueue installed (CREATE EXTENSION is run) and pg_stat_wal (PostgreSQL 14+).
The send breakdown empties pgqueue.message_rows (TRUNCATE): run the probe on a scratch server.
"""

import statistics
import sys
import time
import uuid

import psycopg

BATCH, QTY = 128, 64

SCHEMA = """
DROP SCHEMA IF EXISTS proto CASCADE;
CREATE SCHEMA proto;

-- The hot table without claim columns: a claim writes nothing to it.
CREATE TABLE proto.messages (
    msg_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue       text NOT NULL,
    priority    smallint NOT NULL DEFAULT 0,
    attempt     integer NOT NULL DEFAULT 0,
    payload     jsonb NOT NULL,
    headers     jsonb,
    enqueued_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON proto.messages (queue, priority DESC, msg_id);

CREATE TABLE proto.history (
    msg_id bigint NOT NULL, queue text NOT NULL, outcome text NOT NULL, priority smallint NOT NULL,
    attempt integer NOT NULL, payload jsonb NOT NULL, headers jsonb, enqueued_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now(), last_error text
);
CREATE INDEX ON proto.history (msg_id);

-- One row per claim call: the ids, their tokens and the lease (claims that survive a crash).
CREATE TABLE proto.claims (
    claim_id bigint GENERATED ALWAYS AS IDENTITY,
    msg_ids  bigint[] NOT NULL,
    tokens   uuid[] NOT NULL,
    lease_expires_at timestamptz NOT NULL
);
-- One row per ack call: what finished, and how (the message rows stay until their
-- partition is truncated; history reads them through this log).
CREATE TABLE proto.done (
    msg_ids  bigint[] NOT NULL,
    outcome  text NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now()
);

-- pgqueue's hot table as it is (columns, constraints, indexes), and the same with the columns
-- a claim changes moved after the payload, so that the update's WAL record can leave the
-- unchanged prefix out (PostgreSQL does when the new version stays on the same page).
CREATE TABLE proto.current (LIKE pgqueue.message_rows INCLUDING ALL) WITH (fillfactor = 80);
CREATE TABLE proto.reordered (
    msg_id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue            text NOT NULL,
    priority         smallint NOT NULL DEFAULT 0,
    payload          jsonb NOT NULL,
    headers          jsonb,
    enqueued_at      timestamptz NOT NULL DEFAULT now(),
    dedup_key        text,
    state            text NOT NULL,
    attempt          integer NOT NULL DEFAULT 0,
    visible_at       timestamptz,
    claim_token      uuid,
    claimed_at       timestamptz,
    consumer         text,
    lease_expires_at timestamptz,
    last_error       text,
    session_pid      integer,
    session_started  timestamptz
) WITH (fillfactor = 80);
CREATE INDEX ON proto.reordered (queue, priority DESC, msg_id) WHERE state = 'ready';
CREATE INDEX ON proto.reordered (queue, visible_at) WHERE state = 'delayed';
CREATE INDEX ON proto.reordered (msg_id) WHERE state = 'claimed';
CREATE INDEX ON proto.reordered (session_pid) WHERE session_pid IS NOT NULL;

-- The same two tables with no index that a claim's columns change: `state` named by no
-- index, the ready and delayed rows told apart by visible_at, no in-flight index. A claim is
-- then a HOT update (where the page has room), and its WAL record leaves out the unchanged
-- prefix and suffix of the row.
CREATE TABLE proto.hot (LIKE pgqueue.message_rows INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING CONSTRAINTS)
    WITH (fillfactor = 80);
CREATE TABLE proto.hot_reordered (LIKE proto.reordered INCLUDING DEFAULTS INCLUDING IDENTITY) WITH (fillfactor = 80);
ALTER TABLE proto.hot ADD PRIMARY KEY (msg_id);
ALTER TABLE proto.hot_reordered ADD PRIMARY KEY (msg_id);
CREATE INDEX ON proto.hot (queue, priority DESC, msg_id) WHERE visible_at IS NULL;
CREATE INDEX ON proto.hot (queue, visible_at) WHERE visible_at IS NOT NULL;
CREATE INDEX ON proto.hot (session_pid) WHERE session_pid IS NOT NULL;
CREATE INDEX ON proto.hot_reordered (queue, priority DESC, msg_id) WHERE visible_at IS NULL;
CREATE INDEX ON proto.hot_reordered (queue, visible_at) WHERE visible_at IS NOT NULL;
CREATE INDEX ON proto.hot_reordered (session_pid) WHERE session_pid IS NOT NULL;

-- The history as one row per ack call (F): the finished messages' columns as arrays, found
-- by msg_id through the call's first id (a BRIN index: about one entry per page of calls).
CREATE TABLE proto.history_calls (
    first_id bigint NOT NULL, msg_ids bigint[] NOT NULL, queue text NOT NULL, outcome text NOT NULL,
    priorities smallint[] NOT NULL, attempts integer[] NOT NULL, payloads jsonb[] NOT NULL, headers jsonb[],
    enqueued_ats timestamptz[] NOT NULL, finished_at timestamptz NOT NULL DEFAULT now(), last_errors text[]
);
CREATE INDEX ON proto.history_calls USING brin (first_id);
-- The same found exactly by msg_id: a GiST index of the call's id range (a lookup rechecks
-- msg_ids), or a GIN index of msg_ids (its pending list, as GIN inserts by default).
CREATE TABLE proto.history_calls_gist (LIKE proto.history_calls INCLUDING DEFAULTS, last_id bigint NOT NULL);
CREATE INDEX ON proto.history_calls_gist USING gist (int8range(first_id, last_id, '[]'));
CREATE TABLE proto.history_calls_gin (LIKE proto.history_calls INCLUDING DEFAULTS);
CREATE INDEX ON proto.history_calls_gin USING gin (msg_ids);

-- Per-message ledgers instead of per-call ones: one narrow row per claim, one per finish.
CREATE TABLE proto.claim_rows (
    msg_id bigint NOT NULL, attempt integer NOT NULL, claim_token uuid NOT NULL,
    lease_expires_at timestamptz NOT NULL, PRIMARY KEY (msg_id, attempt)
);
CREATE TABLE proto.done_rows (
    msg_id bigint PRIMARY KEY, outcome text NOT NULL, attempt integer NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now(), last_error text
);

-- A plain table with one index, for the cost of the insert itself.
CREATE TABLE proto.baseline (id bigint GENERATED ALWAYS AS IDENTITY, payload jsonb NOT NULL);
CREATE INDEX ON proto.baseline (id);
"""

PAYLOAD = '{"task": "resize", "image": 12345, "size": [640, 480]}'


def counters(c):
    c.execute("SELECT pg_stat_force_next_flush()")
    row = c.execute(
        """SELECT pg_current_wal_lsn(), w.wal_records, w.wal_fpi,
                  (SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)
                     FROM pg_stat_user_tables WHERE schemaname IN ('pgqueue', 'proto')),
                  (SELECT coalesce(sum(n_tup_hot_upd), 0)
                     FROM pg_stat_user_tables WHERE schemaname IN ('pgqueue', 'proto'))
             FROM pg_stat_wal w"""
    ).fetchone()
    return row


def measure(c, name, jobs, run, hot):
    """`hot`: the tables whose dead rows VACUUM then removes (its WAL is counted apart)."""
    c.execute("CHECKPOINT")
    before = counters(c)
    run(jobs)
    after = counters(c)
    wal = c.execute("SELECT %s::pg_lsn - %s::pg_lsn", (after[0], before[0])).fetchone()[0]
    lsn = c.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    dead = 0
    for table in hot:
        c.execute("SELECT pg_stat_force_next_flush()")
        dead += c.execute(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = %s::regclass", (table,)
        ).fetchone()[0]
        c.execute(f"VACUUM {table}")
    vacuum = c.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", (lsn,)).fetchone()[0]
    per = lambda a, b: (a - b) / jobs  # noqa: E731
    print(
        f"| {name} | {per(after[3], before[3]):.2f} | {per(after[4], before[4]):.2f} | "
        f"{float(wal) / jobs:,.0f} | {per(after[1], before[1]):.2f} | {per(after[2], before[2]):.3f} | "
        f"{dead / jobs:.2f} | {float(vacuum) / jobs:,.0f} |"
    )


# The send breakdown's tables, each created afresh before its measurement. pgqueue's table as
# it is (LIKE does not copy the fillfactor), then one change at a time.
SEND_TABLES = {
    "copy": "CREATE TABLE proto.send (LIKE pgqueue.message_rows INCLUDING ALL) WITH (fillfactor = 80)",
    "copy, fillfactor 100": "CREATE TABLE proto.send (LIKE pgqueue.message_rows INCLUDING ALL) WITH (fillfactor = 100)",
    # Written out, not ALTER TABLE … DROP COLUMN: a dropped column stays in every new row's
    # attribute count, and so in its null bitmap.
    "copy, claim columns dropped": """
        CREATE TABLE proto.send (
            msg_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            queue       text NOT NULL,
            state       text NOT NULL CHECK (state IN ('ready', 'delayed', 'claimed')),
            priority    smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN -1000 AND 1000),
            attempt     integer NOT NULL DEFAULT 0,
            payload     jsonb NOT NULL,
            headers     jsonb,
            enqueued_at timestamptz NOT NULL DEFAULT now(),
            visible_at  timestamptz,
            dedup_key   text,
            CHECK ((state = 'delayed') = (visible_at IS NOT NULL))
        ) WITH (fillfactor = 80);
        CREATE INDEX ON proto.send (queue, priority DESC, msg_id) WHERE state = 'ready';
        CREATE INDEX ON proto.send (queue, visible_at) WHERE state = 'delayed';
        CREATE INDEX ON proto.send (msg_id) WHERE state = 'claimed'""",
    "copy, primary key only": """
        CREATE TABLE proto.send (LIKE pgqueue.message_rows INCLUDING ALL EXCLUDING INDEXES) WITH (fillfactor = 80);
        ALTER TABLE proto.send ADD PRIMARY KEY (msg_id)""",
    "copy, ready index only": """
        CREATE TABLE proto.send (LIKE pgqueue.message_rows INCLUDING ALL EXCLUDING INDEXES) WITH (fillfactor = 80);
        CREATE INDEX ON proto.send (queue, priority DESC, msg_id) WHERE state = 'ready'""",
    "floor": """
        CREATE TABLE proto.send (
            msg_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            queue   text NOT NULL,
            payload jsonb NOT NULL
        )""",
}


def measure_sends(c, name, jobs, send, table="proto.send"):
    """Per row, for jobs rows sent in batches of BATCH, each batch its own transaction; the
    table is fresh (created, or truncated for pgqueue's) and the CHECKPOINT comes after, so
    that every measurement starts with no page written since it: the full-page images are
    then those of pages the sends touch first, alike for every row."""
    # An autovacuum during the run would be counted (the WAL position is the server's, not the
    # table's): the earlier measurements' tables and the catalogs are vacuumed and analyzed
    # first, so none is due, and this table's 25,600 inserts must not start one.
    c.execute("VACUUM ANALYZE")
    c.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    c.execute("CHECKPOINT")
    before = counters(c)
    times = []
    for _ in range(jobs // BATCH):
        start = time.perf_counter()
        send(BATCH)
        times.append(time.perf_counter() - start)
    after = counters(c)
    wal = c.execute("SELECT %s::pg_lsn - %s::pg_lsn", (after[0], before[0])).fetchone()[0]
    heap, indexes = c.execute("SELECT pg_relation_size(%s), pg_indexes_size(%s)", (table, table)).fetchone()
    c.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")
    rows = jobs // BATCH * BATCH
    per = lambda a, b: (a - b) / rows  # noqa: E731
    print(
        f"| {name} | {per(after[3], before[3]):.2f} | {float(wal) / rows:,.0f} | {per(after[1], before[1]):.2f} | "
        f"{per(after[2], before[2]):.3f} | {heap / rows:.0f} | {indexes / rows:.0f} | "
        f"{statistics.median(times) * 1000:.2f} |"
    )


def payloads(n):
    """The batch as the client sends it: n payloads in one jsonb[] parameter."""
    return [PAYLOAD] * n


def insert_unnest(c, n, columns="queue, state, payload", values="'probe', 'ready', p", lock=False):
    """n rows into proto.send, one INSERT … SELECT unnest(…), as pgq_send_batch inserts them;
    lock: in the same statement, the queue row's FOR KEY SHARE, the one row _lock_queue writes
    (one statement, so the same round trips as the others)."""
    if lock:
        columns, values = "queue, state, payload", "q.queue, 'ready', p"
    c.execute(
        ("WITH q AS (SELECT queue FROM pgqueue.queues WHERE queue = 'probe' FOR KEY SHARE) " if lock else "")
        + f"INSERT INTO proto.send ({columns}) SELECT {values} FROM "
        + ("q, " if lock else "")
        + "unnest(%s::jsonb[]) p",
        (payloads(n),),
    )


def copy_rows(c, n):
    """n rows into proto.send by COPY: PostgreSQL writes them with one WAL record per page
    filled (heap_multi_insert), where an INSERT writes one per row."""
    with c.cursor().copy("COPY proto.send (queue, payload) FROM STDIN") as copy:
        for _ in range(n):
            copy.write_row(("probe", PAYLOAD))


def send_breakdown(c, jobs):
    """Where a send's WAL goes: pgq_send_batch, then the same rows without the function, then
    one change to the table at a time, down to the floor."""
    print(f"\nSends alone, {jobs} rows in batches of {BATCH}, each batch its own transaction; per row:\n")
    print(
        "| send | row writes | WAL bytes | WAL records | full-page images | heap bytes | index bytes "
        "| median ms per batch (client side, noisy) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    # pgqueue's table emptied to a new file, as if created: the cycle above left rows and
    # free space in it, whose pages would cost full-page images the fresh copies do not. The
    # queue is 'probe', as in the copies' rows: its name is stored in each row and in each
    # ready-index entry. Then the queue of the table above, whose name is 6 bytes longer.
    for queue in ("probe", "probe_sends"):
        c.execute("TRUNCATE pgqueue.message_rows")
        measure_sends(
            c, f"pgq_send_batch, queue '{queue}'", jobs,
            lambda n, queue=queue: c.execute(
                "SELECT count(*) FROM pgqueue.pgq_send_batch(%s, %s::jsonb[])", (queue, payloads(n))),
            "pgqueue.message_rows",
        )
    for name, table, send in (
        ("INSERT … unnest, copy of its table (fillfactor 80, 5 indexes)", "copy", insert_unnest),
        ("the same + the queue row's KEY SHARE lock", "copy", lambda c, n: insert_unnest(c, n, lock=True)),
        ("copy, fillfactor 100", "copy, fillfactor 100", insert_unnest),
        ("copy, claim columns dropped (10 columns, not 17)", "copy, claim columns dropped", insert_unnest),
        ("copy, primary key only", "copy, primary key only", insert_unnest),
        ("copy, ready index only (no primary key)", "copy, ready index only", insert_unnest),
        ("floor: msg_id, queue, payload, primary key; INSERT … unnest", "floor",
         lambda c, n: insert_unnest(c, n, "queue, payload", "'probe', p")),
        ("floor by COPY", "floor", copy_rows),
    ):
        c.execute("DROP TABLE IF EXISTS proto.send")
        c.execute(SEND_TABLES[table])
        measure_sends(c, name, jobs, lambda n, send=send: send(c, n))


def send_batch(c, queue, n):
    """n messages through pgq_send_batch, one call."""
    c.execute(
        "SELECT count(*) FROM pgqueue.pgq_send_batch(%s, (SELECT array_agg(%s::jsonb) FROM generate_series(1, %s)))",
        (queue, PAYLOAD, n),
    )


def insert(c, table, n, columns="queue, payload", values="'probe', %s::jsonb"):
    """n rows into a prototype table, one INSERT."""
    c.execute(f"INSERT INTO {table} ({columns}) SELECT {values} FROM generate_series(1, %s)", (PAYLOAD, n))


def cycle(jobs, send, claim_and_ack):
    """The job cycle: sends keep a lead of 4 claims; claim_and_ack() returns how many jobs it
    finished."""
    sent = done = 0
    while done < jobs:
        if sent - done < 4 * QTY and sent < jobs:
            n = min(BATCH, jobs - sent)
            send(n)
            sent += n
        else:
            done += claim_and_ack()


def sends_alone(jobs, send):
    for _ in range(jobs // BATCH):
        send(BATCH)


def pgqueue(c, jobs):
    held = ([], [])

    def round_():
        nonlocal held
        rows = c.execute(
            "SELECT kind, msg_id, claim_token FROM pgqueue.pgq_ack_claim('probe', %s, %s, qty => %s)",
            (held[0], held[1], QTY),
        ).fetchall()
        acked = len(held[0])
        held = ([r[1] for r in rows if r[0] == "claimed"], [r[2] for r in rows if r[0] == "claimed"])
        return acked

    cycle(jobs, lambda n: send_batch(c, "probe", n), round_)
    if held[0]:
        c.execute("SELECT pgqueue.pgq_ack(%s, %s)", (held[0], held[1]))


def proto(c, jobs, claim_log, ack, lock=False):
    """claim_log: False (nothing written), True (a row per call), 'rows' (a row per message);
    ack: 'delete' (DELETE + INSERT history per message), 'calls' (DELETE + one history row per
    call; 'calls gist', 'calls gin': its table indexed for look-ups by msg_id), 'log' (a done row per call) or 'rows' (a done row per message); lock: the claim locks
    the rows it takes (FOR UPDATE SKIP LOCKED)."""
    start = 0
    pick = "FOR UPDATE SKIP LOCKED" if lock else ""

    def round_():
        nonlocal start
        # The claim: the rows after the hint, read, not written (the lease lives elsewhere).
        ids = [
            r[0]
            for r in c.execute(
                "SELECT msg_id FROM proto.messages WHERE queue = 'probe' AND msg_id > %s "
                f"ORDER BY priority DESC, msg_id LIMIT %s {pick}",
                (start, QTY),
            ).fetchall()
        ]
        start = ids[-1]
        if claim_log == "rows":
            c.execute(
                "INSERT INTO proto.claim_rows SELECT id, 1, gen_random_uuid(), now() + '30 s' FROM unnest(%s::bigint[]) id",
                (ids,),
            )
        elif claim_log:
            c.execute(
                "INSERT INTO proto.claims (msg_ids, tokens, lease_expires_at) VALUES (%s, %s, now() + '30 s')",
                (ids, [uuid.uuid4() for _ in ids]),
            )
        if ack == "delete":
            delete_to_history(c, "proto.messages", ids, "attempt + 1")
        elif ack.startswith("calls"):
            table, last = {"calls": ("proto.history_calls", ""), "calls gist": ("proto.history_calls_gist", ", last_id"),
                           "calls gin": ("proto.history_calls_gin", "")}[ack]
            c.execute(
                f"""WITH gone AS (DELETE FROM proto.messages WHERE msg_id = ANY(%s) RETURNING *)
                   INSERT INTO {table} (first_id, msg_ids, queue, outcome, priorities, attempts,
                                        payloads, headers, enqueued_ats{last})
                   SELECT min(msg_id), array_agg(msg_id ORDER BY msg_id), min(queue), 'completed',
                          array_agg(priority ORDER BY msg_id), array_agg(attempt + 1 ORDER BY msg_id),
                          array_agg(payload ORDER BY msg_id), array_agg(headers ORDER BY msg_id),
                          array_agg(enqueued_at ORDER BY msg_id){", max(msg_id)" if last else ""}
                     FROM gone""",
                (ids,),
            )
        elif ack == "rows":
            c.execute("INSERT INTO proto.done_rows SELECT id, 'completed', 1 FROM unnest(%s::bigint[]) id", (ids,))
        else:
            c.execute("INSERT INTO proto.done (msg_ids, outcome) VALUES (%s, 'completed')", (ids,))
        return len(ids)

    cycle(jobs, lambda n: insert(c, "proto.messages", n), round_)


def delete_to_history(c, table, ids, attempt):
    """The ack as pgqueue does it: the rows deleted, and written to history."""
    c.execute(
        f"""WITH gone AS (DELETE FROM {table} WHERE msg_id = ANY(%s) RETURNING *)
           INSERT INTO proto.history (msg_id, queue, outcome, priority, attempt, payload, headers, enqueued_at)
           SELECT msg_id, queue, 'completed', priority, {attempt}, payload, headers, enqueued_at FROM gone""",
        (ids,),
    )


def in_place(c, jobs, table, lock):
    """pgqueue's cycle on a copy of its table: the claim an UPDATE of the row (after a
    FOR UPDATE SKIP LOCKED pick, or without one), the ack DELETE + history."""
    pick = "FOR UPDATE SKIP LOCKED" if lock else ""

    def round_():
        ids = [
            r[0]
            for r in c.execute(
                f"""WITH picked AS (SELECT msg_id FROM {table} WHERE queue = 'probe' AND state = 'ready'
                                      AND visible_at IS NULL
                                    ORDER BY priority DESC, msg_id LIMIT %s {pick})
                    UPDATE {table} m SET state = 'claimed', claim_token = gen_random_uuid(),
                           attempt = m.attempt + 1, claimed_at = now(), lease_expires_at = now() + '30 s'
                      FROM picked WHERE m.msg_id = picked.msg_id AND m.state = 'ready'
                    RETURNING m.msg_id""",
                (QTY,),
            ).fetchall()
        ]
        delete_to_history(c, table, ids, "attempt")
        return len(ids)

    cycle(jobs, lambda n: insert(c, table, n, "queue, state, payload", "'probe', 'ready', %s::jsonb"), round_)


def main():
    dsn = sys.argv[1]
    jobs = int(sys.argv[2]) if len(sys.argv) > 2 else 64_000
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS pgqueue")
        c.execute(SCHEMA)
        for q in ("probe", "probe_sends"):
            if not c.execute("SELECT 1 FROM pgqueue.queues WHERE queue = %s", (q,)).fetchone():
                c.execute("SELECT pgqueue.pgq_create_queue(%s)", (q,))
        print(f"{jobs} jobs; sends of {BATCH}, claims and acks of {QTY}; per job:\n")
        print(
            "| layout | row writes | of which HOT updates | WAL bytes | WAL records | full-page images "
            "| dead rows left | WAL of the VACUUM that removes them |"
        )
        print("|---|---|---|---|---|---|---|---|")
        m = ["pgqueue.message_rows"]
        p = ["proto.messages"]
        measure(c, "pgqueue (send_batch, ack_claim)", jobs, lambda n: pgqueue(c, n), m)
        measure(c, "pgqueue sends alone (send_batch)", jobs, lambda n: sends_alone(n, lambda k: send_batch(c, "probe_sends", k)), [])
        measure(c, "its cycle in SQL, on a copy of its table", jobs, lambda n: in_place(c, n, "proto.current", True),
                ["proto.current"])
        measure(c, "H: the same, no index a claim changes (HOT claim)", jobs,
                lambda n: in_place(c, n, "proto.hot", True), ["proto.hot"])
        measure(c, "H, claim columns after the payload", jobs,
                lambda n: in_place(c, n, "proto.hot_reordered", True), ["proto.hot_reordered"])
        measure(c, "the same without the row lock", jobs, lambda n: in_place(c, n, "proto.current", False),
                ["proto.current"])
        measure(c, "the same, claim columns after the payload", jobs,
                lambda n: in_place(c, n, "proto.reordered", False), ["proto.reordered"])
        measure(c, "A: claims off the row, DELETE + history", jobs, lambda n: proto(c, n, False, "delete"), p)
        measure(c, "B: A + a claim row per call", jobs, lambda n: proto(c, n, True, "delete"), p)
        measure(c, "B + the claim's row locks (stage 1)", jobs, lambda n: proto(c, n, True, "delete", lock=True), p)
        measure(c, "F: B, the history one row per ack call", jobs, lambda n: proto(c, n, True, "calls"), p)
        measure(c, "F + the claim's row locks", jobs, lambda n: proto(c, n, True, "calls", lock=True), p)
        measure(c, "F + locks, found by id range (GiST)", jobs,
                lambda n: proto(c, n, True, "calls gist", lock=True), p)
        measure(c, "F + locks, found by id (GIN)", jobs, lambda n: proto(c, n, True, "calls gin", lock=True), p)
        c.execute("TRUNCATE proto.messages")
        measure(c, "C: claims off the row, a done row per call", jobs, lambda n: proto(c, n, False, "log"), p)
        c.execute("TRUNCATE proto.messages")
        measure(c, "D: C + a claim row per call", jobs, lambda n: proto(c, n, True, "log"), p)
        c.execute("TRUNCATE proto.messages")
        measure(c, "E: C, D with a row per claim and per finish", jobs, lambda n: proto(c, n, "rows", "rows"), p)
        c.execute("TRUNCATE proto.messages")
        measure(c, "C's send alone (INSERT, two indexes)", jobs, lambda n: sends_alone(n, lambda k: insert(c, "proto.messages", k)), [])
        measure(c, "insert only, one index", jobs, lambda n: sends_alone(n, lambda k: insert(c, "proto.baseline", k, "payload", "%s::jsonb")), [])
        send_breakdown(c, jobs)


if __name__ == "__main__":
    main()
