-- pgqueue 0.12.0 -> 0.13.0.
--
-- 1. Dead letters counted in shared memory, per queue: moved at the commits that dead-letter,
--    redrive and delete them, recounted by the worker one queue per transaction (when
--    unknown, and at every prune); pgqueue.queue_depth shows them (a new last column, dead).
-- 2. pgqueue.queue_overview: every queue in O(number of queues) reads (the console's
--    overview and queue pages).
-- No locks on queue data.

CREATE FUNCTION pgqueue."_dead_letters"() RETURNS TABLE (
	"queue" TEXT,  /* alloc::string::String */
	"dead" bigint  /* core::option::Option<i64> */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_dead_letters_wrapper';

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
CREATE OR REPLACE VIEW pgqueue.queue_depth AS
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
-- from the ready index's head (a skip scan over its priorities). A function so that the
-- overview's plan is costed as cheap as it runs: inlined, a thousand queues' probes made the
-- planner compile the statement (JIT), which took 20 times longer than the probes.
CREATE FUNCTION pgqueue._oldest_ready(queue text) RETURNS timestamptz
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH RECURSIVE p(priority) AS (
         SELECT (SELECT max(m.priority) FROM pgqueue.messages m
                  WHERE m.queue = _oldest_ready.queue AND m.state = 'ready')
          UNION ALL
         SELECT (SELECT max(m.priority) FROM pgqueue.messages m
                  WHERE m.queue = _oldest_ready.queue AND m.state = 'ready' AND m.priority < p.priority)
           FROM p WHERE p.priority IS NOT NULL)
    SELECT min((SELECT m.enqueued_at FROM pgqueue.messages m
                 WHERE m.queue = _oldest_ready.queue AND m.state = 'ready' AND m.priority = p.priority
                 ORDER BY m.msg_id LIMIT 1))
      FROM p WHERE p.priority IS NOT NULL;
END;

-- Every queue at a glance, in O(number of queues) reads whatever the size of its backlog and
-- history (for consoles and dashboards): the depths and dead letters of queue_depth
-- (NULL where the shared state does not know them: pgqueue.queue_stats counts),
-- the age of the oldest ready message (the first by msg_id of each priority, read from the
-- ready index's head) and the claims past their lease (read from the in-flight index).
CREATE VIEW pgqueue.queue_overview AS
SELECT q.queue, q.paused, d.tracked, d.ready, d.delayed, d.claimed, d.dead, d.waiting_claims,
       now() - pgqueue._oldest_ready(q.queue) AS oldest_ready_age,
       coalesce(x.expired_claims, 0) AS expired_claims
  FROM pgqueue.queues q
  JOIN pgqueue.queue_depth d ON d.queue = q.queue
  LEFT JOIN (SELECT m.queue, count(*) AS expired_claims
               FROM pgqueue.messages m WHERE m.state = 'claimed' AND m.lease_expires_at <= now()
              GROUP BY m.queue) x ON x.queue = q.queue;

-- Deletes dead letters for good: all of the queue's, or the given ids. Returns how many.
CREATE OR REPLACE FUNCTION pgqueue.pgq_delete_dead(queue text, msg_ids bigint[] DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    q pgqueue.queues := pgqueue._queue(queue);
    deleted bigint;
BEGIN
    DELETE FROM pgqueue.history h
     WHERE h.queue = q.queue AND h.outcome = 'dead' AND (msg_ids IS NULL OR h.msg_id = ANY (msg_ids));
    GET DIAGNOSTICS deleted = ROW_COUNT;
    PERFORM pgqueue._note(q.queue, deleted, 'dead', NULL);
    RETURN deleted;
END
$$;

REVOKE ALL ON FUNCTION pgqueue._dead_letters(), pgqueue._dead_count(text), pgqueue._oldest_ready(text) FROM PUBLIC;
REVOKE ALL ON pgqueue.queue_overview FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgqueue._dead_letters(), pgqueue._oldest_ready(text) TO pgqueue_admin, pg_monitor;
GRANT SELECT ON pgqueue.queue_overview TO pgqueue_admin, pg_monitor;

COMMENT ON VIEW pgqueue.queue_depth IS
    'per queue, from shared memory without counting: depths and dead letters, waiting claims, wake-ups';
COMMENT ON VIEW pgqueue.queue_overview IS
    'per queue, in O(queues) reads: depths and dead letters, oldest ready age, expired claims';
