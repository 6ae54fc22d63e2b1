-- pgqueue 0.11.0 -> 0.12.0.
--
-- 1. Minute rollups: pgqueue.queue_minutes (per queue and minute: sent, completed, dead,
--    retried, depths), written by the worker's new "rollup" step, kept for
--    pgqueue.rollup_retention; worker_state gets rollup_failures and last_rollup_at
--    (worker_stats shows them).
-- 2. For operators and consoles: the pgqueue.jobs view (every message, waiting or finished),
--    pgq_delete_dead, pgq_run_schedule, and pgq_audit with pgqueue.audit_log.
-- 3. Every history leaf partition gets a BRIN index on msg_id (finding a finished job by id):
--    each build takes a SHARE lock on its leaf only (acks into that leaf wait for it; a
--    BRIN build reads the leaf once).
-- 4. pgqueue.queues is readable by pgqueue_admin and pg_monitor, pgqueue.dedup_keys by
--    pgqueue_admin (finding a job by its unique key).

-- Added without a default, filled, then given it: so that the catalog matches a fresh
-- install's (a default given to ADD COLUMN is kept as the column's "missing value").
ALTER TABLE pgqueue.worker_state
    ADD COLUMN rollup_failures bigint,
    ADD COLUMN last_rollup_at timestamptz;
UPDATE pgqueue.worker_state SET rollup_failures = 0;
ALTER TABLE pgqueue.worker_state
    ALTER COLUMN rollup_failures SET DEFAULT 0, ALTER COLUMN rollup_failures SET NOT NULL;

-- Per-queue counts by minute, for charts (the console, exporters, SQL): what commits sent,
-- completed, dead-lettered and retried (nacked or re-armed), and the depth by state when the
-- worker recorded them. Written once a minute by the worker's rollup step (src/rollup.rs says
-- what the counts can miss); kept for pgqueue.rollup_retention.
CREATE TABLE pgqueue.queue_minutes (
    queue     text NOT NULL REFERENCES pgqueue.queues ON DELETE CASCADE,
    minute    timestamptz NOT NULL,
    sent      bigint NOT NULL DEFAULT 0,
    completed bigint NOT NULL DEFAULT 0,
    dead      bigint NOT NULL DEFAULT 0,
    retried   bigint NOT NULL DEFAULT 0,
    ready     bigint,  -- depths: NULL where the shared state did not know them
    delayed   bigint,
    claimed   bigint,
    PRIMARY KEY (queue, minute)
);

-- What operators did through a console (pgqueue.pgq_audit): who, what, when.
CREATE TABLE pgqueue.audit_log (
    action_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    db_role      text NOT NULL,   -- the session's role
    console_user text,            -- the person the console authenticated, if it did
    action       text NOT NULL,
    target       text,
    detail       jsonb
);

SELECT pg_catalog.pg_extension_config_dump('pgqueue.queue_minutes', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.audit_log', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.audit_log_action_id_seq', '');

-- Indexes one leaf partition of a queue's history: its dead letters, for pgq_redrive and
-- pgq_delete_dead, and (since 0.12.0) its msg_ids as a BRIN index, for finding a job by id
-- (history is written in about msg_id order; a BRIN index costs an insert almost nothing).
-- Every leaf gets them when it is created, before it is attached, so pgq_prune can take a
-- leaf without both for a restore still under way (pg_dump creates indexes last). The names
-- are the leaf's plus "_dead" and "_ids": at most 62 characters, and unique as the leaf's is.
CREATE OR REPLACE FUNCTION pgqueue._index_history_part(part text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- IF NOT EXISTS: the warning of pgq_prune suggests this for a leaf that may have one.
    EXECUTE pg_catalog.format('CREATE INDEX IF NOT EXISTS %I ON pgqueue.%I (msg_id) WHERE outcome = %L',
        part || '_dead', part, 'dead');
    EXECUTE pg_catalog.format('CREATE INDEX IF NOT EXISTS %I ON pgqueue.%I USING brin (msg_id)', part || '_ids', part);
END
$$;

-- The first leaf partition of a queue's history (`parent`) that lacks one of its two
-- indexes, if any: a restore is still building that history (pg_dump creates indexes last)
-- and may yet load rows into, or index, any of its partitions, so the worker neither adds
-- nor drops one.
CREATE OR REPLACE FUNCTION pgqueue._unindexed_history_part(parent regclass) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (SELECT c.relname::text FROM pg_partition_tree(parent) t JOIN pg_class c ON c.oid = t.relid
         WHERE t.isleaf AND (SELECT count(*) FROM pg_index i WHERE i.indrelid = t.relid) < 2
         ORDER BY 1 LIMIT 1);

DO $brin$
DECLARE
    part text;
BEGIN
    FOR part IN SELECT c.relname FROM pg_catalog.pg_partition_tree('pgqueue.history') t
                  JOIN pg_catalog.pg_class c ON c.oid = t.relid WHERE t.isleaf ORDER BY 1 LOOP
        EXECUTE pg_catalog.format('CREATE INDEX IF NOT EXISTS %I ON pgqueue.%I USING brin (msg_id)',
                                  part || '_ids', part);
    END LOOP;
END
$brin$;

-- Deletes dead letters for good: all of the queue's, or the given ids. Returns how many.
CREATE FUNCTION pgqueue.pgq_delete_dead(queue text, msg_ids bigint[] DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    q pgqueue.queues := pgqueue._queue(queue);
    deleted bigint;
BEGIN
    DELETE FROM pgqueue.history h
     WHERE h.queue = q.queue AND h.outcome = 'dead' AND (msg_ids IS NULL OR h.msg_id = ANY (msg_ids));
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END
$$;

-- Enqueues one run of a schedule now, whatever its next run (unchanged) and even if paused;
-- its slot is the current second, so a second call within that second returns the same
-- message. Returns the msg_id.
CREATE FUNCTION pgqueue.pgq_run_schedule(name text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN pgqueue._fire(pgqueue._schedule(name), date_trunc('second', now()), NULL);
END
$$;

-- Adds one tick's counts (a jsonb of counter => increment, plus "error" and flags) to the
-- worker_state row.
CREATE OR REPLACE FUNCTION pgqueue._record_tick(counts jsonb) RETURNS void
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    UPDATE pgqueue.worker_state SET
        pid = pg_backend_pid(),
        started_at = CASE WHEN (counts->>'first')::boolean THEN now() ELSE started_at END,
        last_tick_at = now(),
        last_prune_at = CASE WHEN (counts->>'pruned')::boolean THEN now() ELSE last_prune_at END,
        last_rollup_at = CASE WHEN (counts->>'rolled_up')::boolean THEN now() ELSE last_rollup_at END,
        tick_interval_ms = (counts->>'tick_interval_ms')::integer,
        ticks = ticks + coalesce((counts->>'ticks')::bigint, 1),
        tick_failures = tick_failures + coalesce((counts->>'tick_failures')::bigint, 0),
        promote_failures = promote_failures + coalesce((counts->>'promote_failures')::bigint, 0),
        orphan_failures = orphan_failures + coalesce((counts->>'orphan_failures')::bigint, 0),
        rearm_failures = rearm_failures + coalesce((counts->>'rearm_failures')::bigint, 0),
        partition_failures = partition_failures + coalesce((counts->>'partition_failures')::bigint, 0),
        reconcile_failures = reconcile_failures + coalesce((counts->>'reconcile_failures')::bigint, 0),
        prune_failures = prune_failures + coalesce((counts->>'prune_failures')::bigint, 0),
        promoted = promoted + coalesce((counts->>'promoted')::bigint, 0),
        orphans_expired = orphans_expired + coalesce((counts->>'orphans_expired')::bigint, 0),
        rearmed = rearmed + coalesce((counts->>'rearmed')::bigint, 0),
        dead_lettered = dead_lettered + coalesce((counts->>'dead_lettered')::bigint, 0),
        rescue_batches = rescue_batches + coalesce((counts->>'rescue_batches')::bigint, 0),
        rescue_rows = rescue_rows + coalesce((counts->>'rescue_rows')::bigint, 0),
        partitions_created = partitions_created + coalesce((counts->>'partitions_created')::bigint, 0),
        prune_pruned = prune_pruned + coalesce((counts->>'prune_pruned')::bigint, 0),
        prune_noop = prune_noop + coalesce((counts->>'prune_noop')::bigint, 0),
        prune_blocked = prune_blocked + coalesce((counts->>'prune_blocked')::bigint, 0),
        prune_skipped_active = prune_skipped_active + coalesce((counts->>'prune_skipped_active')::bigint, 0),
        prune_backed_off = prune_backed_off + coalesce((counts->>'prune_backed_off')::bigint, 0),
        prune_error = prune_error + coalesce((counts->>'prune_error')::bigint, 0),
        pruned_rows = pruned_rows + coalesce((counts->>'pruned_rows')::bigint, 0),
        hint_corrections = hint_corrections + coalesce((counts->>'hint_corrections')::bigint, 0),
        schedule_failures = schedule_failures + coalesce((counts->>'schedule_failures')::bigint, 0),
        keys_failures = keys_failures + coalesce((counts->>'keys_failures')::bigint, 0),
        scheduled_runs = scheduled_runs + coalesce((counts->>'scheduled_runs')::bigint, 0),
        missed_runs = missed_runs + coalesce((counts->>'missed_runs')::bigint, 0),
        schedule_errors = schedule_errors + coalesce((counts->>'schedule_errors')::bigint, 0),
        keys_expired = keys_expired + coalesce((counts->>'keys_expired')::bigint, 0),
        rollup_failures = rollup_failures + coalesce((counts->>'rollup_failures')::bigint, 0),
        last_error = coalesce(counts->>'error', last_error),
        last_error_at = CASE WHEN counts ? 'error' THEN now() ELSE last_error_at END;
END;

-- The rollup runs at the first tick of each minute (src/tick.rs): once the tick that did it
-- has recorded it.
CREATE FUNCTION pgqueue._rollup_due() RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (SELECT w.last_rollup_at IS NULL OR date_trunc('minute', w.last_rollup_at) < date_trunc('minute', now())
          FROM pgqueue.worker_state w);

-- Adds the counts drained from the shared state (`counts`: [{queue, sent, completed, dead,
-- retried, ready, delayed, claimed}]) to the minute that just ended, and deletes rollups
-- older than `retention` (zero: keep none). Queues dropped meanwhile are left out. Returns
-- the rows written. It leaves worker_state alone (the tick's record sets last_rollup_at), so
-- that a lock on that row holds up one step, not two; a second rollup within a minute,
-- should one run, adds only what was counted since.
CREATE FUNCTION pgqueue._roll_up(counts jsonb, retention interval) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    written bigint := 0;
BEGIN
    IF retention > interval '0' THEN
        INSERT INTO pgqueue.queue_minutes AS qm (queue, minute, sent, completed, dead, retried, ready, delayed, claimed)
        SELECT c.queue, date_trunc('minute', now()) - interval '1 minute',
               coalesce(c.sent, 0), coalesce(c.completed, 0), coalesce(c.dead, 0), coalesce(c.retried, 0),
               c.ready, c.delayed, c.claimed
          FROM jsonb_to_recordset(counts) AS c(queue text, sent bigint, completed bigint, dead bigint,
                                               retried bigint, ready bigint, delayed bigint, claimed bigint)
          JOIN pgqueue.queues q ON q.queue = c.queue
        ON CONFLICT (queue, minute) DO UPDATE
           SET sent = qm.sent + excluded.sent, completed = qm.completed + excluded.completed,
               dead = qm.dead + excluded.dead, retried = qm.retried + excluded.retried,
               ready = coalesce(excluded.ready, qm.ready), delayed = coalesce(excluded.delayed, qm.delayed),
               claimed = coalesce(excluded.claimed, qm.claimed);
        GET DIAGNOSTICS written = ROW_COUNT;
    END IF;
    -- Per queue, through the primary key: only the expired rows are read.
    DELETE FROM pgqueue.queue_minutes qm
     WHERE qm.queue = ANY (ARRAY(SELECT q.queue FROM pgqueue.queues q)) AND qm.minute < now() - retention;
    RETURN written;
END
$$;

CREATE FUNCTION pgqueue.pgq_audit(action text, target text DEFAULT NULL, detail jsonb DEFAULT NULL,
                                  console_user text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    id bigint;
BEGIN
    IF pgqueue._require(action, 'action') !~ '^[a-z][a-z0-9_]{0,62}$' THEN
        PERFORM pgqueue._invalid('action', pg_catalog.format(
            '%L is not an action name (1 to 63 lower-case letters, digits or _, starting with a letter)', action));
    END IF;
    INSERT INTO pgqueue.audit_log (db_role, console_user, action, target, detail)
    VALUES (session_user, console_user, action, target, detail)
    RETURNING audit_log.action_id INTO id;
    RETURN id;
END
$$;

-- Every message, waiting, claimed or finished: one place to look a job up (by msg_id, which
-- both halves index, or through pgqueue.dedup_keys by unique key). Claim tokens are left out:
-- who can read this view cannot act for a consumer.
CREATE VIEW pgqueue.jobs AS
SELECT m.msg_id, m.queue, m.state, m.priority, m.attempt, m.payload, m.headers, m.enqueued_at, m.visible_at,
       m.claimed_at, m.consumer, m.lease_expires_at, NULL::timestamptz AS finished_at, m.last_error, m.dedup_key
  FROM pgqueue.messages m
 UNION ALL
SELECT h.msg_id, h.queue, h.outcome, h.priority, h.attempt, h.payload, h.headers, h.enqueued_at, NULL, NULL,
       NULL, NULL, h.finished_at, h.last_error, NULL
  FROM pgqueue.history h;

CREATE OR REPLACE VIEW pgqueue.worker_stats AS
SELECT current_database() AS database,
       w.pid, w.started_at, w.last_tick_at, now() - w.last_tick_at AS since_last_tick,
       w.last_prune_at, w.tick_interval_ms,
       w.ticks, w.tick_failures, w.promote_failures, w.orphan_failures, w.rearm_failures,
       w.partition_failures, w.prune_failures,
       w.promoted, w.orphans_expired, w.rearmed, w.dead_lettered, w.rescue_batches, w.rescue_rows,
       w.partitions_created, w.prune_pruned, w.prune_noop, w.prune_blocked,
       w.prune_skipped_active, w.prune_backed_off, w.prune_error, w.pruned_rows,
       w.last_error, w.last_error_at, w.reconcile_failures, w.hint_corrections,
       w.schedule_failures, w.keys_failures, w.scheduled_runs, w.missed_runs, w.schedule_errors, w.keys_expired,
       w.rollup_failures, w.last_rollup_at
  FROM pgqueue.worker_state w;

REVOKE ALL ON FUNCTION
    pgqueue.pgq_delete_dead(text, bigint[]), pgqueue.pgq_run_schedule(text), pgqueue.pgq_audit(text, text, jsonb, text),
    pgqueue._rollup_due(), pgqueue._roll_up(jsonb, interval)
FROM PUBLIC;
REVOKE ALL ON pgqueue.queue_minutes, pgqueue.audit_log, pgqueue.jobs FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    pgqueue.pgq_delete_dead(text, bigint[]),
    pgqueue.pgq_run_schedule(text),
    pgqueue.pgq_audit(text, text, jsonb, text)
TO pgqueue_admin;
GRANT SELECT ON pgqueue.queue_minutes, pgqueue.audit_log, pgqueue.queues TO pgqueue_admin, pg_monitor;
GRANT SELECT ON pgqueue.jobs, pgqueue.dedup_keys TO pgqueue_admin;

COMMENT ON FUNCTION pgqueue.pgq_delete_dead(text, bigint[]) IS
    'delete a queue''s dead letters (all, or the given ids) for good; returns how many';
COMMENT ON FUNCTION pgqueue.pgq_run_schedule(text) IS
    'enqueue one run of a schedule now, its next run unchanged; returns the msg_id';
COMMENT ON FUNCTION pgqueue.pgq_audit(text, text, jsonb, text) IS
    'record an operator''s action (who, what, on what) in pgqueue.audit_log; returns its id';
COMMENT ON VIEW pgqueue.jobs IS
    'every message, waiting, claimed or finished, with its state or outcome (no claim tokens)';
COMMENT ON TABLE pgqueue.queue_minutes IS
    'per queue and minute: messages sent, completed, dead-lettered, retried, and the depths then';
COMMENT ON TABLE pgqueue.audit_log IS
    'operators'' actions recorded by pgq_audit: when, which role, which console user, what';
