-- What users read: one row per message waiting or claimed. A claim through the claim ledger
-- may leave its message's row as it was (step 3b of the write path, docs/design/write-path.md):
-- the message is then claimed by the ledger entry numbered claims_ended + 1 of a 'ready' row,
-- shown with that claim's state, attempt, token, time, consumer and session; a lease the row
-- has (a renewal) is the one in force, else the claim's. A hash join with the ledger's entries,
-- which are about as many as the messages claimed. Not updatable (0.24.0 on): the library
-- writes pgqueue.message_rows, and until ALTER EXTENSION UPDATE from 0.19 or earlier this name
-- is that table.
CREATE VIEW pgqueue.messages AS
SELECT r.msg_id, r.queue, CASE WHEN e.claim_id IS NULL THEN r.state ELSE 'claimed' END AS state, r.priority,
       r.attempt + (e.claim_id IS NOT NULL)::integer AS attempt, r.payload, r.headers, r.enqueued_at, r.visible_at,
       coalesce(r.claim_token,
                pgqueue._claim_token((SELECT k.key FROM pgqueue.claim_key k ORDER BY k.made_at, k.key LIMIT 1),
                                     e.claim_id, r.msg_id, e.number)) AS claim_token,
       coalesce(r.claimed_at, e.claimed_at) AS claimed_at, coalesce(r.consumer, e.consumer) AS consumer,
       coalesce(r.lease_expires_at, e.lease_expires_at) AS lease_expires_at, r.last_error,
       coalesce(r.session_pid, e.session_pid) AS session_pid,
       coalesce(r.session_started, e.session_started) AS session_started, r.dedup_key,
       r.cancel_requested_at, r.progress, r.after, r.has_dependents, r.park_key, r.park_until, r.claims_ended
  FROM pgqueue.message_rows r
  LEFT JOIN (SELECT c.claim_id, c.queue, u.msg_id, u.number, c.claimed_at, c.lease_expires_at, c.consumer, c.session_pid,
                    c.session_started
               FROM pgqueue.claims c, unnest(c.msg_ids, c.claim_numbers) AS u(msg_id, number)) e
         ON r.state = 'ready' AND e.queue = r.queue AND e.msg_id = r.msg_id AND e.number = r.claims_ended + 1;

-- Metrics, shaped for Prometheus' postgres_exporter: one row per queue.
CREATE VIEW pgqueue.queue_stats AS
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
CREATE VIEW pgqueue.jobs AS
SELECT m.msg_id, m.queue, m.state, m.priority, m.attempt, m.payload, m.headers, m.enqueued_at, m.visible_at,
       m.claimed_at, m.consumer, m.lease_expires_at, NULL::timestamptz AS finished_at, m.last_error, m.dedup_key,
       m.progress, NULL::jsonb AS result, m.after, m.park_key, m.park_until
  FROM pgqueue.messages m
 UNION ALL
SELECT h.msg_id, h.queue, h.outcome, h.priority, h.attempt, h.payload, h.headers, h.enqueued_at, NULL, NULL,
       NULL, NULL, h.finished_at, h.last_error, NULL, h.progress, h.result, h.after, NULL, NULL
  FROM pgqueue.history h;

-- The worker's counters in this database (monotonic; see the README for what to alert on).
CREATE VIEW pgqueue.worker_stats AS
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
       w.rollup_failures, w.last_rollup_at, w.dependency_failures, w.released, w.park_failures, w.park_timeouts,
       w.claims_failures, w.claims_pruned
  FROM pgqueue.worker_state w;

-- Every schedule: when it runs next, its last run (the slot) and how late that was enqueued,
-- counts, and its last error. Times of day are the caller's TimeZone; next_run_local is in
-- the schedule's own zone, by the tz database the schedules run on (the library's).
CREATE VIEW pgqueue.schedule_stats AS
SELECT s.name, s.queue, s.cron, s.time_zone, s.paused, s.missed, s.grace,
       s.next_run, pgqueue._local_time(s.next_run, s.time_zone) AS next_run_local,
       s.last_run, s.last_fired_at - s.last_run AS last_lateness, s.last_msg_id,
       s.runs, s.missed_runs, s.failures, s.last_error, s.last_error_at, s.created_at
  FROM pgqueue.schedules s;

-- A queue's exact depth by state (what the tick recounts the shared depths from). A 'ready'
-- row that only the claim ledger holds counts as claimed.
CREATE FUNCTION pgqueue._depth(queue text, OUT ready bigint, OUT delayed bigint, OUT claimed bigint)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp SET jit = off SET enable_seqscan = off
BEGIN ATOMIC
    SELECT r.ready - h.held, r.delayed, r.claimed + h.held
      FROM (SELECT count(*) FILTER (WHERE m.state = 'ready') AS ready,
                   count(*) FILTER (WHERE m.state = 'delayed') AS delayed,
                   count(*) FILTER (WHERE m.state = 'claimed') AS claimed
              FROM pgqueue.message_rows m WHERE m.queue = _depth.queue) r,
           (SELECT count(*) AS held FROM pgqueue._ledger_held l WHERE l.queue = _depth.queue) h;
END;

-- A queue's dead letters, counted in its own history partitions only (a query of
-- pgqueue.history by a queue the planner does not know locks every queue's partitions).
CREATE FUNCTION pgqueue._dead_count(queue text) RETURNS bigint
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n bigint;
BEGIN
    IF to_regclass(format('pgqueue.%I', pgqueue._history_table(queue))) IS NULL THEN
        RETURN NULL;
    END IF;
    EXECUTE format('SELECT count(*) FROM pgqueue.%I WHERE outcome = %L', pgqueue._history_table(queue), 'dead')
       INTO n;
    RETURN n;
END
$$;

-- Depths without counting: read from the shared state, O(number of queues), for monitoring
-- that scrapes often. Approximate: moved at every commit, recounted by the worker every
-- pgqueue.prune_interval; NULL where unknown (tracked false: not in shared memory — library
-- not preloaded, pgqueue.max_queues reached — or not yet checked by the worker).
-- pgqueue.queue_stats is the exact count. dead (since 0.13.0): dead letters in history.
CREATE VIEW pgqueue.queue_depth AS
SELECT q.queue,
       coalesce(s.tracked, false) AS tracked,
       s.ready, s.delayed, s.claimed,
       coalesce(s.waiting_claims, 0) AS waiting_claims,
       coalesce(s.wakeups, 0) AS wakeups,
       coalesce(s.hint_corrections, 0) AS hint_corrections,
       d.dead
  FROM pgqueue.queues q
  LEFT JOIN pgqueue._queue_depth() s ON s.queue = q.queue
  LEFT JOIN pgqueue._dead_letters() d ON d.queue = q.queue;

-- When the oldest ready message of `queue` was sent: the first by msg_id of each priority, read
-- from the ready index's head (a skip scan over its priorities), past the rows that only the
-- claim ledger holds (a hashed list of the queue's). A function so that the
-- overview's plan is costed as cheap as it runs: inlined, a thousand queues' probes made the
-- planner compile the statement (JIT), which took 20 times longer than the probes.
CREATE FUNCTION pgqueue._oldest_ready(queue text) RETURNS timestamptz
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH RECURSIVE held AS MATERIALIZED (
         SELECT l.msg_id FROM pgqueue._ledger_held l WHERE l.queue = _oldest_ready.queue),
    p(priority) AS (
         SELECT (SELECT max(m.priority) FROM pgqueue.message_rows m
                  WHERE m.queue = _oldest_ready.queue AND m.state = 'ready')
          UNION ALL
         SELECT (SELECT max(m.priority) FROM pgqueue.message_rows m
                  WHERE m.queue = _oldest_ready.queue AND m.state = 'ready' AND m.priority < p.priority)
           FROM p WHERE p.priority IS NOT NULL)
    SELECT min((SELECT m.enqueued_at FROM pgqueue.message_rows m
                 WHERE m.queue = _oldest_ready.queue AND m.state = 'ready' AND m.priority = p.priority
                   AND m.msg_id NOT IN (SELECT held.msg_id FROM held)
                 ORDER BY m.msg_id LIMIT 1))
      FROM p WHERE p.priority IS NOT NULL;
END;

-- Every queue at a glance, in O(number of queues) reads whatever the size of its backlog and
-- history (for consoles and dashboards): the depths and dead letters of queue_depth
-- (NULL where the shared state does not know them: pgqueue.queue_stats counts),
-- the age of the oldest ready message (the first by msg_id of each priority, read from the
-- ready index's head) and the claims past their lease (read from the in-flight index, and
-- from the claim ledger for the claims only it holds).
CREATE VIEW pgqueue.queue_overview AS
SELECT q.queue, q.paused, d.tracked, d.ready, d.delayed, d.claimed, d.dead, d.waiting_claims,
       now() - pgqueue._oldest_ready(q.queue) AS oldest_ready_age,
       coalesce(x.expired_claims, 0) AS expired_claims
  FROM pgqueue.queues q
  JOIN pgqueue.queue_depth d ON d.queue = q.queue
  LEFT JOIN (SELECT e.queue, count(*) AS expired_claims
               FROM (SELECT m.queue FROM pgqueue.message_rows m
                      WHERE m.state = 'claimed' AND m.lease_expires_at <= now()
                     UNION ALL
                     SELECT l.queue FROM pgqueue._ledger_held l WHERE l.lease_expires_at <= now()) e
              GROUP BY e.queue) x ON x.queue = q.queue;

-- The shared state's use, for the whole server: max_queues (pgqueue.max_queues), queues
-- tracked now, and how many times a queue found it full (its claims then scan from the
-- start and its waiting claims poll: raise pgqueue.max_queues). No row when the library is
-- not preloaded.
CREATE VIEW pgqueue.shared_state AS SELECT * FROM pgqueue._shared_state();

-- This database's held set (src/held.rs): the messages claimed through the claim ledger, as
-- shared memory knows them. Shadowed for now (the rows decide): exact, or the msg_ids it does
-- not vouch for (unknown_from to unknown_to: after a restart, a prepared transaction, a set
-- that filled); its size and capacity; takes that found it full; the worker's rebuilds from
-- the ledger and those it refused; claims that found their message's last claim still listed
-- (its end's commit not yet applied). No row when the library is not preloaded.
CREATE VIEW pgqueue.held_set AS SELECT * FROM pgqueue._held_set();
