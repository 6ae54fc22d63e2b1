-- pgqueue 0.17.0 -> 0.18.0.
--
-- Parking: pgq_park(msg_id, claim_token, key, timeout, ...) ends a claim and leaves its message
-- 'parked' until pgq_signal(key, payload) or the timeout. New: the state 'parked' (the CHECK
-- constraint, two partial indexes), the columns messages.park_key and messages.park_until, the
-- table pgqueue.park_keys, pgq_park, pgq_signal, queue_stats.parked, jobs.park_key and
-- .park_until, worker_stats.park_failures and .park_timeouts. The index that says whether a
-- child is held back by its parents gets the parent as a second column (it is rebuilt).
-- Locks on queue data: ALTER TABLE takes ACCESS EXCLUSIVE on pgqueue.messages until the update
-- commits; the new CHECK constraints read it once, and each CREATE INDEX once more (no
-- rewrite).
-- The library runs the 0.17.0 SQL as before: install, restart, update.

ALTER TABLE pgqueue.messages ADD COLUMN park_key text, ADD COLUMN park_until timestamptz;
ALTER TABLE pgqueue.messages
    DROP CONSTRAINT messages_state_check,
    ADD CONSTRAINT messages_state_check CHECK (state IN ('ready', 'delayed', 'claimed', 'pending', 'parked')),
    ADD CONSTRAINT messages_parked_has_key
        CHECK ((state = 'parked') = (park_key IS NOT NULL AND park_until IS NOT NULL));
-- Parked rows: by key for the signal that resumes them, by time for the tick that ends their
-- wait.
CREATE INDEX messages_parked_key_idx ON pgqueue.messages (park_key)
    WHERE state = 'parked';
CREATE INDEX messages_parked_until_idx ON pgqueue.messages (park_until)
    WHERE state = 'parked';
-- Whether a child is held back: one index entry per parent not finished yet, or failed under
-- a policy other than 'run' (dependencies.rs reads it with this very condition, from the
-- highest parent down, and stops at the first that holds the child back).
DROP INDEX pgqueue.dependencies_waiting_idx;
CREATE INDEX dependencies_waiting_idx ON pgqueue.dependencies (child, parent)
    WHERE parent_outcome IS NULL OR (parent_outcome <> 'completed' AND on_parent_failure <> 'run');

-- Added without a default, filled, then given it: so that the catalog matches a fresh
-- install's (a default given to ADD COLUMN is kept as the column's "missing value").
ALTER TABLE pgqueue.worker_state ADD COLUMN park_failures bigint, ADD COLUMN park_timeouts bigint;
UPDATE pgqueue.worker_state SET park_failures = 0, park_timeouts = 0;
ALTER TABLE pgqueue.worker_state
    ALTER COLUMN park_failures SET DEFAULT 0, ALTER COLUMN park_failures SET NOT NULL,
    ALTER COLUMN park_timeouts SET DEFAULT 0, ALTER COLUMN park_timeouts SET NOT NULL;

-- Park keys (sql/park.sql): one row per key that messages park on or that was signalled. A
-- park and a signal of the same key both write its row, so they happen one after the other:
-- the later one sees the earlier (a signal wakes what parked before it; a park finds a signal
-- sent before it). A signal is kept until keep_until, for the parks that come after it.
-- Rows with no kept signal and no message parked on them are collected by the tick.
CREATE TABLE pgqueue.park_keys (
    key          text PRIMARY KEY,
    signal       jsonb,        -- the kept signal's payload
    signalled_at timestamptz,  -- NULL: no signal kept
    keep_until   timestamptz,
    CONSTRAINT park_keys_signal_kept CHECK ((signalled_at IS NULL) = (keep_until IS NULL))
);

SELECT pg_catalog.pg_extension_config_dump('pgqueue.park_keys', '');

-- Parking: the holder of a claim parks its message to wait for the outside world (a webhook, a
-- person, another system). pgq_park releases the claim, and pgq_signal(key) makes every
-- message parked on that key claimable again, carrying the signal's payload. A signal sent
-- before the park is kept (pgq_signal's keep) and resumes a park that comes later at once.
-- What the next claim of the message sees is in its headers, under "pgq_park".
--
-- A park and a signal of the same key both write the key's row in pgqueue.park_keys, so one
-- waits for the other's commit and then sees it: no wakeup is lost in between. In
-- REPEATABLE READ or SERIALIZABLE, a row written by a transaction the snapshot does not see
-- raises a serialization failure (40001): retry.

-- Park keys: 1 to 512 characters (22004, 22023).
CREATE FUNCTION pgqueue._check_park_key(key text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF pg_catalog.length(pgqueue._require(key, 'key')) NOT BETWEEN 1 AND 512 THEN
        PERFORM pgqueue._invalid('key', pg_catalog.format('a key of %s characters; 1 to 512', pg_catalog.length(key)));
    END IF;
    RETURN key;
END
$$;

-- The message's headers with its "pgq_park" entry replaced by `park` (at the park), or with
-- `resumed` added to it (when it becomes claimable again). Headers that are not a JSON object
-- (nor NULL) cannot take the entry: pgq_park refuses them first.
CREATE FUNCTION pgqueue._park_headers(headers jsonb, park jsonb, resumed jsonb DEFAULT NULL) RETURNS jsonb
LANGUAGE sql IMMUTABLE
RETURN coalesce(headers, '{}') || pg_catalog.jsonb_build_object('pgq_park',
    coalesce(park, headers -> 'pgq_park', '{}') || coalesce(resumed, '{}'));

-- Parks a claimed message (fenced by its token, as pgq_nack) until pgq_signal(key) or the end
-- of `timeout`: its claim ends (the consumer is free, the lease is not re-armed). When it
-- resumes, its attempt is given back: the claim that resumes it counts it again. `payload`
-- is kept in the "pgq_park" header, for the holder that resumes it. At the timeout it becomes
-- claimable with "timed_out": true (on_timeout 'resume') or is dead-lettered ('dead'). A
-- signal of `key` still kept resumes it at once. False: not held under that token (nothing
-- changed). A message whose cancel was requested is finished as cancelled instead.
CREATE FUNCTION pgqueue.pgq_park(
    msg_id bigint,
    claim_token uuid,
    key text,
    timeout interval,
    payload jsonb DEFAULT NULL,
    on_timeout text DEFAULT 'resume',
    queue text DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    h record;
    kept record;
    park jsonb;
BEGIN
    IF queue IS NOT NULL THEN
        PERFORM pgqueue._queue(queue);
    END IF;
    PERFORM pgqueue._require(msg_id, 'msg_id');
    PERFORM pgqueue._require(claim_token, 'claim_token');
    PERFORM pgqueue._check_park_key(key);
    IF pgqueue._require(timeout, 'timeout') <= interval '0' OR timeout > interval '365 days' THEN
        PERFORM pgqueue._invalid('timeout', pg_catalog.format('%s is not between 0 (exclusive) and 365 days', timeout));
    END IF;
    IF pgqueue._require(on_timeout, 'on_timeout') NOT IN ('resume', 'dead') THEN
        PERFORM pgqueue._invalid('on_timeout',
            pg_catalog.format('%L is not one of ''resume'', ''dead''', on_timeout));
    END IF;
    IF payload IS NOT NULL THEN
        PERFORM pgqueue._check_reports(ARRAY[payload], 1, 'payload');
    END IF;
    SELECT m.msg_id, m.queue, m.priority, m.headers, m.cancel_requested_at INTO h
      FROM pgqueue.messages m
     WHERE m.msg_id = msg_id AND m.claim_token = claim_token AND m.state = 'claimed'
       AND (queue IS NULL OR m.queue = queue)
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF h.headers IS NOT NULL AND pg_catalog.jsonb_typeof(h.headers) <> 'object' THEN
        PERFORM pgqueue._invalid('msg_id', pg_catalog.format(
            'message %s has headers that are not a JSON object: it cannot be parked', msg_id));
    END IF;
    IF h.cancel_requested_at IS NOT NULL THEN
        PERFORM pgqueue._to_history(ARRAY[msg_id], NULL, 'cancelled', NULL);
        RETURN true;
    END IF;
    -- After the message: a signal locks the key's row, then the messages parked on it.
    INSERT INTO pgqueue.park_keys AS p (key) VALUES (key)
    ON CONFLICT ON CONSTRAINT park_keys_pkey DO UPDATE SET key = p.key
    RETURNING p.signal, p.signalled_at, coalesce(p.keep_until > now(), false) AS signalled INTO kept;
    park := pg_catalog.jsonb_build_object('key', key, 'parked_at', now(), 'timeout_at', now() + timeout,
                                          'on_timeout', on_timeout)
            || CASE WHEN payload IS NOT NULL THEN pg_catalog.jsonb_build_object('payload', payload) ELSE '{}' END;
    UPDATE pgqueue.messages m
       SET state = CASE WHEN kept.signalled THEN 'ready' ELSE 'parked' END,
           park_key = CASE WHEN NOT kept.signalled THEN key END,
           park_until = CASE WHEN NOT kept.signalled THEN now() + timeout END,
           attempt = m.attempt - CASE WHEN kept.signalled THEN 1 ELSE 0 END,
           claim_token = NULL, claimed_at = NULL, lease_expires_at = NULL, consumer = NULL,
           session_pid = NULL, session_started = NULL,
           headers = pgqueue._park_headers(m.headers, park,
               CASE WHEN kept.signalled THEN pg_catalog.jsonb_build_object(
                   'signal', kept.signal, 'signalled_at', kept.signalled_at, 'resumed_at', now()) END)
     WHERE m.msg_id = h.msg_id;
    PERFORM pgqueue._note(h.queue, 1, 'claimed', 'parked');
    IF kept.signalled THEN
        PERFORM pgqueue._note(h.queue, 1, 'parked', 'ready', h.priority, h.msg_id, h.msg_id);
    END IF;
    RETURN true;
END
$$;

-- Resumes every message parked on `key`: claimable again (waiting claims are woken at
-- commit), with the signal in its "pgq_park" header (signal: the payload, signalled_at,
-- resumed_at). The signal is kept until now() + keep, and a park on `key` meanwhile resumes at
-- once with it; keep '0' keeps nothing. While a signal is kept, the key's later signals change
-- nothing (a signal sent twice is one signal): they resume nothing, since nothing can park on
-- the key meanwhile. Returns how many messages it resumed.
CREATE FUNCTION pgqueue.pgq_signal(key text, payload jsonb DEFAULT NULL, keep interval DEFAULT '1 day')
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    kept record;
    resumed bigint;
BEGIN
    PERFORM pgqueue._check_park_key(key);
    PERFORM pgqueue._check_delay(pgqueue._require(keep, 'keep'), 'keep');
    IF payload IS NOT NULL THEN
        PERFORM pgqueue._check_reports(ARRAY[payload], 1, 'payload');
    END IF;
    INSERT INTO pgqueue.park_keys AS p (key, signal, signalled_at, keep_until)
    VALUES (key, payload, now(), now() + keep)
    ON CONFLICT ON CONSTRAINT park_keys_pkey DO UPDATE
       SET signal = CASE WHEN p.keep_until > now() THEN p.signal ELSE excluded.signal END,
           signalled_at = CASE WHEN p.keep_until > now() THEN p.signalled_at ELSE excluded.signalled_at END,
           keep_until = CASE WHEN p.keep_until > now() THEN p.keep_until ELSE excluded.keep_until END
    RETURNING p.signal, p.signalled_at INTO kept;
    -- In msg_id order, as pgq_cancel locks them: the two cannot deadlock.
    WITH parked AS (
        SELECT m.msg_id FROM pgqueue.messages m WHERE m.park_key = key AND m.state = 'parked'
         ORDER BY m.msg_id
           FOR UPDATE
    ), back AS (
        UPDATE pgqueue.messages m
           SET state = 'ready', park_key = NULL, park_until = NULL, attempt = m.attempt - 1,
               headers = pgqueue._park_headers(m.headers, NULL, pg_catalog.jsonb_build_object(
                   'signal', kept.signal, 'signalled_at', kept.signalled_at, 'resumed_at', now()))
          FROM parked WHERE m.msg_id = parked.msg_id
        RETURNING m.queue, m.priority, m.msg_id
    )
    SELECT coalesce(sum(r.n), 0) INTO resumed
      FROM (SELECT count(*) AS n, pgqueue._note(b.queue, count(*), 'parked', 'ready', b.priority,
                                                min(b.msg_id), max(b.msg_id))
              FROM back b GROUP BY b.queue, b.priority) r;
    RETURN resumed;
END
$$;

-- Parked messages whose wait ended with no signal, at most max_rows, earliest first: claimable
-- again with "timed_out": true in their "pgq_park" header, or dead-lettered (on_timeout
-- 'dead'). Rows another session holds are left for the next call. Returns how many.
CREATE FUNCTION pgqueue._expire_parks(max_rows integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    resume bigint[];
    dead bigint[];
    resumed bigint;
BEGIN
    SELECT coalesce(array_agg(e.msg_id) FILTER (WHERE NOT e.dead), '{}'),
           coalesce(array_agg(e.msg_id) FILTER (WHERE e.dead), '{}')
      INTO resume, dead
      FROM (SELECT m.msg_id, coalesce(m.headers -> 'pgq_park' ->> 'on_timeout' = 'dead', false) AS dead
              FROM pgqueue.messages m
             WHERE m.state = 'parked' AND m.park_until <= now()
             ORDER BY m.park_until
             LIMIT max_rows
               FOR UPDATE SKIP LOCKED) e;
    WITH back AS (
        UPDATE pgqueue.messages m
           SET state = 'ready', park_key = NULL, park_until = NULL, attempt = m.attempt - 1,
               headers = pgqueue._park_headers(m.headers, NULL,
                   pg_catalog.jsonb_build_object('timed_out', true, 'resumed_at', now()))
         WHERE m.msg_id = ANY (resume)
        RETURNING m.queue, m.priority, m.msg_id
    )
    SELECT coalesce(sum(r.n), 0) INTO resumed
      FROM (SELECT count(*) AS n, pgqueue._note(b.queue, count(*), 'parked', 'ready', b.priority,
                                                min(b.msg_id), max(b.msg_id))
              FROM back b GROUP BY b.queue, b.priority) r;
    RETURN resumed + (SELECT count(*) FROM pgqueue._to_history(dead, NULL, 'dead', 'parked, and no signal came before its timeout'));
END
$$;

-- Park keys with no signal kept and no message parked on them, at most max_rows (the tick, at
-- the prune cadence). Locked first, then checked in a statement of its own: a park that
-- committed before the lock is seen, and none can commit on them after it.
CREATE FUNCTION pgqueue._collect_park_keys(max_rows integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    idle text[];
    n bigint;
BEGIN
    SELECT coalesce(array_agg(p.key), '{}') INTO idle
      FROM (SELECT k.key FROM pgqueue.park_keys k
             WHERE k.keep_until IS NULL OR k.keep_until <= now()
             LIMIT max_rows
               FOR UPDATE SKIP LOCKED) p;
    DELETE FROM pgqueue.park_keys k
     WHERE k.key = ANY (idle)
       AND NOT EXISTS (SELECT FROM pgqueue.messages m WHERE m.park_key = k.key AND m.state = 'parked');
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
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
        dependency_failures = dependency_failures + coalesce((counts->>'dependency_failures')::bigint, 0),
        released = released + coalesce((counts->>'released')::bigint, 0),
        park_failures = park_failures + coalesce((counts->>'park_failures')::bigint, 0),
        park_timeouts = park_timeouts + coalesce((counts->>'park_timeouts')::bigint, 0),
        last_error = coalesce(counts->>'error', last_error),
        last_error_at = CASE WHEN counts ? 'error' THEN now() ELSE last_error_at END;
END;

-- Metrics, shaped for Prometheus' postgres_exporter: one row per queue.
CREATE OR REPLACE VIEW pgqueue.queue_stats AS
SELECT q.queue,
       q.paused,
       c.ready,
       c.delayed,
       c.claimed,
       c.expired_claims,
       (SELECT count(*) FROM pgqueue.history h WHERE h.queue = q.queue AND h.outcome = 'dead') AS dead,
       now() - c.oldest_ready AS oldest_ready_age,
       now() - c.oldest_expired_lease AS oldest_expired_claim_age,
       c.pending,
       c.parked,
       -- Outcomes kept in the history (its retention): counted only when selected, and each
       -- count reads that part of the queue's history.
       (SELECT count(*) FROM pgqueue.history h WHERE h.queue = q.queue AND h.outcome = 'completed') AS completed,
       (SELECT count(*) FROM pgqueue.history h WHERE h.queue = q.queue AND h.outcome = 'cancelled') AS cancelled
  FROM pgqueue.queues q
 CROSS JOIN LATERAL (
       SELECT count(*) FILTER (WHERE m.state = 'ready') AS ready,
              count(*) FILTER (WHERE m.state = 'delayed') AS delayed,
              count(*) FILTER (WHERE m.state = 'claimed') AS claimed,
              count(*) FILTER (WHERE m.state = 'claimed' AND m.lease_expires_at <= now()) AS expired_claims,
              min(m.enqueued_at) FILTER (WHERE m.state = 'ready') AS oldest_ready,
              min(m.lease_expires_at) FILTER (WHERE m.state = 'claimed' AND m.lease_expires_at <= now())
                  AS oldest_expired_lease,
              count(*) FILTER (WHERE m.state = 'pending') AS pending,
              count(*) FILTER (WHERE m.state = 'parked') AS parked
         FROM pgqueue.messages m
        WHERE m.queue = q.queue) c;

-- Every message, waiting, claimed or finished: one place to look a job up (by msg_id, which
-- both halves index, or through pgqueue.dedup_keys by unique key). Claim tokens are left out:
-- who can read this view cannot act for a consumer.
CREATE OR REPLACE VIEW pgqueue.jobs AS
SELECT m.msg_id, m.queue, m.state, m.priority, m.attempt, m.payload, m.headers, m.enqueued_at, m.visible_at,
       m.claimed_at, m.consumer, m.lease_expires_at, NULL::timestamptz AS finished_at, m.last_error, m.dedup_key,
       m.progress, NULL::jsonb AS result, m.after, m.park_key, m.park_until
  FROM pgqueue.messages m
 UNION ALL
SELECT h.msg_id, h.queue, h.outcome, h.priority, h.attempt, h.payload, h.headers, h.enqueued_at, NULL, NULL,
       NULL, NULL, h.finished_at, h.last_error, NULL, h.progress, h.result, h.after, NULL, NULL
  FROM pgqueue.history h;

-- The worker's counters in this database (monotonic; see the README for what to alert on).
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
       w.rollup_failures, w.last_rollup_at, w.dependency_failures, w.released, w.park_failures, w.park_timeouts
  FROM pgqueue.worker_state w;

-- Generic plans for a send's dependency statements (sql/dependencies.sql says why).
ALTER FUNCTION pgqueue._depend(bigint[], bigint[], text) SET plan_cache_mode = force_generic_plan;

REVOKE ALL ON FUNCTION
    pgqueue._check_park_key(text),
    pgqueue._park_headers(jsonb, jsonb, jsonb),
    pgqueue.pgq_park(bigint, uuid, text, interval, jsonb, text, text),
    pgqueue.pgq_signal(text, jsonb, interval),
    pgqueue._expire_parks(integer),
    pgqueue._collect_park_keys(integer)
FROM PUBLIC;
REVOKE ALL ON pgqueue.park_keys FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgqueue.pgq_signal(text, jsonb, interval) TO pgqueue_producer;
GRANT EXECUTE ON FUNCTION
    pgqueue.pgq_park(bigint, uuid, text, interval, jsonb, text, text),
    pgqueue.pgq_signal(text, jsonb, interval)
TO pgqueue_consumer;
GRANT SELECT ON pgqueue.park_keys TO pgqueue_admin;

COMMENT ON FUNCTION pgqueue.pgq_park(bigint, uuid, text, interval, jsonb, text, text) IS
    'park a claimed message until pgq_signal(key) or its timeout, ending the claim; false if the claim was lost';
COMMENT ON FUNCTION pgqueue.pgq_signal(text, jsonb, interval) IS
    'resume every message parked on key with this payload, and keep the signal for parks to come; returns how many it resumed';
COMMENT ON VIEW pgqueue.queue_stats IS
    'per queue, counted exactly: ready, delayed, claimed, expired, pending and parked messages, oldest ages; dead, completed and cancelled in the history kept';
COMMENT ON TABLE pgqueue.messages IS
    'messages waiting (ready, delayed, pending on their parents, or parked until a signal) or claimed; finished ones move to pgqueue.history';
COMMENT ON TABLE pgqueue.park_keys IS
    'one row per key messages park on or that was signalled, with the signal kept for parks to come';
