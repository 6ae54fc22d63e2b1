-- pgqueue 0.19.0 -> 0.19.1.
--
-- pgq_prune's backoff bookkeeping takes the queue's row FOR KEY SHARE NOWAIT first and leaves
-- a queue being dropped alone: it waited for that row while holding the history partitions it
-- had truncated, and a pgq_drop_queue holding the row and waiting for the history deadlocked
-- with it. Nothing else changes; no lock on queue data. The library's fixes of 0.19.1 (the
-- worker's dead-letter count, claims passing over a row another transaction held) need the
-- restart, not this script.

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
            -- The queue's row first, without waiting: a pgq_drop_queue under way holds it and
            -- waits for the history partitions this call has locked, which a wait here would
            -- make a deadlock. The queue being dropped needs no bookkeeping.
            PERFORM FROM pgqueue.queues qs WHERE qs.queue = q.queue FOR KEY SHARE NOWAIT;
            IF NOT FOUND THEN
                NULL;
            ELSIF setback THEN
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
