-- pgqueue 0.10.0 -> 0.11.0.
--
-- 1. The worker's orphan step no longer walks the in-flight index from its start: its query
--    leaves `state = 'claimed'` out, and messages_session_idx is rebuilt with a predicate
--    that leaves it out too, so only that index (or the table) can serve the step. Building
--    it reads pgqueue.messages under a SHARE lock: sends, claims and acks wait meanwhile
--    (for a time that grows with its rows). The index stays empty unless claims are
--    session-bound.
-- 2. Descriptions for the public functions, views and tables (the same COMMENT ON
--    statements as sql/comments.sql, which fresh installs run).
-- 3. _fire_schedules logs a schedule's error again when the schedule fired since it was
--    last logged; _record_tick takes the number of ticks it records (a tick whose record
--    failed is recorded with the next).

DROP INDEX pgqueue.messages_session_idx;
CREATE INDEX messages_session_idx ON pgqueue.messages (session_pid)
    WHERE session_pid IS NOT NULL;

CREATE OR REPLACE FUNCTION pgqueue._expire_orphaned_claims() RETURNS bigint
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH alive AS MATERIALIZED (
        SELECT a.pid, a.backend_start FROM pg_stat_get_activity(NULL) a
         WHERE a.datid = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
    ), orphaned AS (
        SELECT m.msg_id FROM pgqueue.messages m
         WHERE m.session_pid IS NOT NULL AND m.lease_expires_at > now()
           AND NOT EXISTS (SELECT FROM alive a
                            WHERE a.pid = m.session_pid AND a.backend_start = m.session_started)
           FOR UPDATE OF m SKIP LOCKED
    ), expired AS (
        UPDATE pgqueue.messages m SET lease_expires_at = now()
          FROM orphaned o WHERE m.msg_id = o.msg_id
        RETURNING m.msg_id
    )
    SELECT count(*) FROM expired;
END;

CREATE OR REPLACE FUNCTION pgqueue._fire_schedules(max_rows integer DEFAULT 50, at timestamptz DEFAULT NULL)
RETURNS TABLE (fired bigint, missed bigint, failed bigint, more boolean)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    now_at timestamptz := coalesce(at, now());
    s pgqueue.schedules;
    d record;
    slot timestamptz;
    n bigint;
    id bigint;
    last_slot timestamptz;
    problem text;
    code text;
    runs integer;  -- this firing's runs (at least one, for the failure count)
    seen integer := 0;
BEGIN
    fired := 0;
    missed := 0;
    failed := 0;
    FOR s IN SELECT * FROM pgqueue.schedules sc WHERE NOT sc.paused AND sc.next_run <= now_at
              ORDER BY sc.next_run LIMIT max_rows FOR UPDATE SKIP LOCKED LOOP
        seen := seen + 1;
        runs := 1;
        BEGIN
            SELECT * INTO d FROM pgqueue._due_slots(s.cron, s.time_zone, s.next_run, now_at, now_at - s.grace,
                                                    s.missed = 'catch_up');
            runs := greatest(cardinality(d.slots) + (d.catch_up_slot IS NOT NULL)::integer, 1);
            n := 0;
            id := NULL;
            last_slot := NULL;
            IF d.catch_up_slot IS NOT NULL THEN
                id := pgqueue._fire(s, d.catch_up_slot, d.missed);
                n := n + 1;
                last_slot := d.catch_up_slot;
            END IF;
            FOREACH slot IN ARRAY d.slots LOOP
                id := pgqueue._fire(s, slot, NULL);
                n := n + 1;
                last_slot := slot;
            END LOOP;
            IF d.next_run IS NULL THEN
                RAISE EXCEPTION 'no next time for cron % in %', s.cron, s.time_zone;
            END IF;
            UPDATE pgqueue.schedules sc
               SET next_run = d.next_run, runs = sc.runs + n, missed_runs = sc.missed_runs + d.missed,
                   last_run = coalesce(last_slot, sc.last_run), last_msg_id = coalesce(id, sc.last_msg_id),
                   last_fired_at = CASE WHEN n > 0 THEN clock_timestamp() ELSE sc.last_fired_at END
             WHERE sc.name = s.name;
            fired := fired + n;
            missed := missed + d.missed;
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT, code = RETURNED_SQLSTATE;
            -- Logged once per error in a row: again when it differs, or when the schedule
            -- fired since it was last seen.
            IF problem IS DISTINCT FROM s.last_error OR s.last_fired_at > s.last_error_at THEN
                RAISE WARNING 'pgqueue: schedule "%" failed to enqueue its run for %: %', s.name, s.next_run, problem;
            END IF;
            IF code LIKE '40%' OR code = '55P03' THEN
                -- A conflict: the same slots next tick.
                UPDATE pgqueue.schedules sc SET last_error = problem, last_error_at = now() WHERE sc.name = s.name;
            ELSE
                -- Every run of this firing failed; passed over to the next slot (NULL if none
                -- can be computed: the schedule stops, reported).
                failed := failed + runs;
                UPDATE pgqueue.schedules sc
                   SET next_run = (SELECT pgqueue._cron_next(sc.cron, sc.time_zone, now_at, 1)),
                       failures = sc.failures + runs, last_error = problem, last_error_at = now()
                 WHERE sc.name = s.name;
            END IF;
        END;
    END LOOP;
    more := seen >= max_rows;
    RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue._record_tick(counts jsonb) RETURNS void
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    UPDATE pgqueue.worker_state SET
        pid = pg_backend_pid(),
        started_at = CASE WHEN (counts->>'first')::boolean THEN now() ELSE started_at END,
        last_tick_at = now(),
        last_prune_at = CASE WHEN (counts->>'pruned')::boolean THEN now() ELSE last_prune_at END,
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
        last_error = coalesce(counts->>'error', last_error),
        last_error_at = CASE WHEN counts ? 'error' THEN now() ELSE last_error_at END;
END;

COMMENT ON FUNCTION pgqueue.pgq_create_queue(text, interval, integer, boolean, interval, boolean) IS
    'create a queue with its lease, max_attempts and retention, and its history partitions';
COMMENT ON FUNCTION pgqueue.pgq_drop_queue(text, boolean) IS
    'drop a queue with its messages, keys and history; refused while messages are claimed, unless force';
COMMENT ON FUNCTION pgqueue.pgq_pause_queue(text) IS
    'pause a queue: sends still go in, claims return nothing';
COMMENT ON FUNCTION pgqueue.pgq_resume_queue(text) IS
    'resume a paused queue and wake its waiting claims';

COMMENT ON FUNCTION pgqueue.pgq_send(text, jsonb, interval, smallint, jsonb, text, interval) IS
    'enqueue one message (delay, priority, headers, unique key); returns its msg_id';
COMMENT ON FUNCTION pgqueue.pgq_send_batch(text, jsonb[], interval, smallint, jsonb, text[], interval) IS
    'enqueue up to 10,000 messages in one statement; returns their msg_ids in array order';

COMMENT ON FUNCTION pgqueue.pgq_claim(text, integer, interval, text, boolean, interval) IS
    'claim up to qty messages with a lease, highest priority first; can wait for messages to arrive';
COMMENT ON FUNCTION pgqueue.pgq_ack_claim(text, bigint[], uuid[], integer, interval, text, boolean, interval) IS
    'ack finished claims and claim the next messages in one statement: a consumer''s round trip';
COMMENT ON FUNCTION pgqueue.pgq_ack(bigint, uuid) IS
    'complete a claimed message; false if the claim was lost';
COMMENT ON FUNCTION pgqueue.pgq_ack(bigint[], uuid[]) IS
    'complete claimed messages; returns the ids completed';
COMMENT ON FUNCTION pgqueue.pgq_nack(bigint, uuid, interval, text) IS
    'give a claimed message back for a retry later, or dead-letter it on its last attempt';
COMMENT ON FUNCTION pgqueue.pgq_fail(bigint, uuid, text) IS
    'dead-letter a claimed message now';
COMMENT ON FUNCTION pgqueue.pgq_renew(bigint, uuid, interval) IS
    'extend the lease of a claim still held; false if the claim was lost';
COMMENT ON FUNCTION pgqueue.pgq_renew(bigint[], uuid[], interval) IS
    'extend the leases of claims still held; returns their ids';
COMMENT ON FUNCTION pgqueue.pgq_redrive(text, bigint[]) IS
    'make a queue''s dead letters claimable again with a fresh attempt count; returns how many';

COMMENT ON FUNCTION pgqueue.pgq_schedule(text, text, text, jsonb, text, smallint, jsonb, boolean, text, interval) IS
    'create or replace a periodic schedule (cron pattern in a time zone); returns its next run';
COMMENT ON FUNCTION pgqueue.pgq_unschedule(text, boolean) IS
    'delete a schedule; the messages it enqueued stay';
COMMENT ON FUNCTION pgqueue.pgq_pause_schedule(text) IS
    'pause a schedule: it enqueues nothing until resumed';
COMMENT ON FUNCTION pgqueue.pgq_resume_schedule(text) IS
    'resume a paused schedule from its first time after now';
COMMENT ON FUNCTION pgqueue.pgq_cron_next(text, text, timestamptz, integer) IS
    'the next times of a cron pattern in a time zone, as schedules fire them';

COMMENT ON FUNCTION pgqueue.pgq_tick() IS
    'run one tick of the background worker''s housekeeping in this session; returns the steps that failed';
COMMENT ON FUNCTION pgqueue.pgq_rearm(integer, text) IS
    'make expired claims claimable again, or dead-letter those without attempts left';
COMMENT ON FUNCTION pgqueue.pgq_prune(text) IS
    'remove history past each queue''s retention, a day partition at a time';
COMMENT ON FUNCTION pgqueue.pgq_version() IS
    'the version of the pgqueue library loaded';
COMMENT ON TYPE pgqueue.prune_result IS
    'one row of pgq_prune: queue, partition, outcome and rows removed';

COMMENT ON VIEW pgqueue.queue_stats IS
    'per queue, counted exactly: ready, delayed, claimed, expired and dead messages, oldest ages';
COMMENT ON VIEW pgqueue.queue_depth IS
    'per queue, from shared memory without counting: approximate depths, waiting claims, wake-ups';
COMMENT ON VIEW pgqueue.worker_stats IS
    'what the background worker has done in this database: last tick, counters, last error';
COMMENT ON VIEW pgqueue.schedule_stats IS
    'per schedule: next run, last run and its lateness, run counts, last error';
COMMENT ON VIEW pgqueue.shared_state IS
    'pgqueue''s shared memory, all databases: max_queues, queues tracked, times it was full';

COMMENT ON TABLE pgqueue.queues IS
    'queue settings, one row per queue: lease, max_attempts, retention, paused';
COMMENT ON TABLE pgqueue.messages IS
    'messages waiting (ready or delayed) or claimed; finished ones move to pgqueue.history';
COMMENT ON TABLE pgqueue.history IS
    'completed and dead-lettered messages, partitioned by queue and day, kept for the queue''s retention';
COMMENT ON TABLE pgqueue.schedules IS
    'periodic schedules: pattern, time zone, message to enqueue, next run and counters';
COMMENT ON TABLE pgqueue.dedup_keys IS
    'unique-job keys taken, per queue, and until when a finished message keeps its key';
COMMENT ON TABLE pgqueue.worker_state IS
    'one row: the counters behind pgqueue.worker_stats, written at every tick';
COMMENT ON TABLE pgqueue.prune_state IS
    'queues whose pruning backs off after being blocked or skipped';
