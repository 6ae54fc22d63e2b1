-- pgqueue 0.8.0 -> 0.9.0: a prune that holds the consumers up less. pgq_prune counts a
-- partition's rows 64 pages at a time (pgqueue._count_history_part) and has the truncated
-- partition's old files freed at commit a few megabytes at a time (pgqueue._free_in_steps).
-- Same names, arguments, results and errors. Definitions as in sql/maintenance.sql of 0.9.0.

-- How many rows a history partition holds, and the latest finished_at among them, for
-- pgq_prune (which holds the partition locked). Counted 64 pages at a time: one scan of a
-- large partition held the consumers' claims and acks up for 12-25 ms on a 2-core machine,
-- short ones for about a third of that (BENCHMARKS.md, "A prune that holds up no commit").
CREATE FUNCTION pgqueue._count_history_part(part regclass, OUT n bigint, OUT newest timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    pages bigint := pg_catalog.pg_relation_size(part) / pg_catalog.current_setting('block_size')::bigint;
    first bigint := 0;
    k bigint;
    latest timestamptz;
BEGIN
    n := 0;
    WHILE first < pages LOOP
        EXECUTE pg_catalog.format('SELECT count(*), max(finished_at) FROM %s WHERE ctid >= $1 AND ctid < $2', part)
           INTO k, latest
          USING pg_catalog.format('(%s,0)', first)::tid, pg_catalog.format('(%s,0)', first + 64)::tid;
        n := n + k;
        newest := greatest(newest, latest);
        first := first + 64;
    END LOOP;
END
$$;

CREATE FUNCTION pgqueue."_free_in_steps"(
	"part" oid /* pgrx::pg_sys::Oid */
) RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_free_in_steps_wrapper';

CREATE OR REPLACE FUNCTION pgqueue.pgq_prune(queue text DEFAULT NULL) RETURNS SETOF pgqueue.prune_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET jit = off SET TimeZone = 'UTC' SET lock_timeout = '5s' AS $$
#variable_conflict use_column
DECLARE
    r pgqueue.prune_result;
    q pgqueue.queues;
    part record;
    timeout text := pgqueue._prune_lock_timeout() || 'ms';
    cutoff timestamptz;
    n bigint;
    newest timestamptz;
    setback boolean;
    parent regclass;
    unindexed text;
    empties text[] := '{}';  -- [queue's history, emptied partition] pairs
    truncated boolean := false;
    k integer;
BEGIN
    IF pgq_prune.queue IS NOT NULL THEN
        PERFORM pgqueue._queue(pgq_prune.queue);
    END IF;
    FOR q IN SELECT * FROM pgqueue.queues qs
              WHERE pgq_prune.queue IS NULL OR qs.queue = pgq_prune.queue ORDER BY qs.queue LOOP
        r.queue := q.queue;
        r.target := pgqueue._history_table(q.queue);
        r.rows := 0;
        IF pgq_prune.queue IS NULL AND EXISTS (
            SELECT FROM pgqueue.prune_state s WHERE s.queue = q.queue AND s.retry_after > now()) THEN
            r.outcome := 'backed_off';
            RETURN NEXT r;
            CONTINUE;
        END IF;
        parent := to_regclass(format('pgqueue.%I', pgqueue._history_table(q.queue)));
        CONTINUE WHEN parent IS NULL;  -- the queue is being dropped
        unindexed := pgqueue._unindexed_history_part(parent);
        IF unindexed IS NOT NULL THEN
            RAISE WARNING 'pgqueue: not pruning queue "%": its history partition "%" has no index yet',
                q.queue, unindexed
                USING HINT = pg_catalog.format('A restore under way creates it last; else: SELECT pgqueue._index_history_part(%L)',
                                               unindexed);
        END IF;
        IF unindexed IS NOT NULL
           OR NOT pg_try_advisory_xact_lock(hashtext('pgqueue.pgq_prune'), hashtext(q.queue)) THEN
            r.outcome := 'skipped_active';
            setback := true;
            RETURN NEXT r;
        ELSE
            setback := false;
            cutoff := now() - q.retention;
            r.outcome := 'noop';
            FOR part IN
                SELECT c.relname::text AS name,
                       CASE WHEN c.relname::text ~ '\$\d{8}$'
                            THEN to_date(right(c.relname::text, 8), 'YYYYMMDD') END AS day
                  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                 WHERE i.inhparent = parent
                 ORDER BY 2 NULLS LAST
            LOOP
                CONTINUE WHEN part.day IS NOT NULL AND (part.day + 1)::timestamptz > cutoff;
                BEGIN
                    -- Only the lock wait is bounded by the prune lock timeout. The lock comes
                    -- first, so no ack can slip in between the count and the truncate.
                    PERFORM set_config('lock_timeout', timeout, true);
                    EXECUTE format('LOCK TABLE ONLY pgqueue.%I IN ACCESS EXCLUSIVE MODE', part.name);
                    PERFORM set_config('lock_timeout', '5s', true);
                    SELECT c.n, c.newest INTO n, newest
                      FROM pgqueue._count_history_part(format('pgqueue.%I', part.name)::regclass) c;
                    IF n = 0 AND part.day IS NOT NULL THEN
                        empties := empties || ARRAY[[parent::text, format('pgqueue.%I', part.name)]];
                    END IF;
                    -- The default partition only once everything in it is past.
                    CONTINUE WHEN n = 0 OR newest > cutoff;
                    PERFORM pgqueue._free_in_steps(format('pgqueue.%I', part.name)::regclass);
                    EXECUTE format('TRUNCATE pgqueue.%I', part.name);
                    truncated := true;
                    r.target := part.name;
                    r.outcome := 'pruned';
                    r.rows := n;
                EXCEPTION
                    WHEN lock_not_available THEN
                        r.target := part.name;
                        r.outcome := 'blocked';
                        r.rows := 0;
                        setback := true;
                    WHEN OTHERS THEN
                        RAISE WARNING 'pgqueue: pruning % failed: %', part.name, SQLERRM;
                        r.target := part.name;
                        r.outcome := 'error';
                        r.rows := 0;
                END;
                RETURN NEXT r;
            END LOOP;
            IF r.outcome = 'noop' THEN
                r.target := pgqueue._history_table(q.queue);
                RETURN NEXT r;
            END IF;
        END IF;
        -- Back off a queue whose pruning keeps being blocked: 3 in a row, then 1 min, 2 min, … 1 h.
        -- (Bookkeeping never fails the prune: another pruner may hold the row a moment.)
        BEGIN
            IF setback THEN
                INSERT INTO pgqueue.prune_state AS s (queue, failures, retry_after)
                VALUES (q.queue, 1, now())
                ON CONFLICT (queue) DO UPDATE
                   SET failures = s.failures + 1,
                       retry_after = now() + CASE WHEN s.failures + 1 >= 3
                           THEN least(interval '1 minute' * power(2, least(s.failures - 2, 10)), interval '1 hour')
                           ELSE interval '0' END;
            ELSE
                DELETE FROM pgqueue.prune_state s WHERE s.queue = q.queue;
            END IF;
        EXCEPTION WHEN lock_not_available OR foreign_key_violation THEN
            NULL;
        END;
    END LOOP;
    -- Last, so that no other work of this call runs while a queue's history is locked.
    FOR k IN 1 .. CASE WHEN truncated THEN 0 ELSE coalesce(array_length(empties, 1), 0) END LOOP
        BEGIN
            EXECUTE format('LOCK TABLE ONLY %s IN ACCESS EXCLUSIVE MODE NOWAIT', empties[k][2]);
            EXECUTE format('LOCK TABLE ONLY %s IN ACCESS EXCLUSIVE MODE NOWAIT', empties[k][1]);
            EXECUTE format('DROP TABLE %s', empties[k][2]);
        EXCEPTION
            WHEN lock_not_available THEN NULL;  -- in use right now: a later prune drops it
            WHEN OTHERS THEN
                RAISE WARNING 'pgqueue: dropping the emptied partition % failed: %', empties[k][2], SQLERRM;
        END;
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION pgqueue._count_history_part(regclass), pgqueue._free_in_steps(oid) FROM PUBLIC;
