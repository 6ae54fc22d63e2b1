-- Housekeeping: what the background worker's tick (and pgq_tick) runs, step by step.
-- Each function is one step; the worker runs each in its own transaction.

-- Step "promote": due delayed messages of every queue become claimable, in bulk.
CREATE FUNCTION pgqueue._promote_all(max_rows integer) RETURNS bigint
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT coalesce(sum(pgqueue._promote_due(q.queue, max_rows)), 0)::bigint FROM pgqueue.queues q;
END;

-- Step "orphans": session-bound claims whose backend has exited (same pid and start time no
-- longer alive in this database) get an expired lease, so the re-arm step that follows makes
-- them claimable. "In this database": a restored copy's claims belong to no session here.
-- The held set learns the new leases at commit.
-- No `state = 'claimed'` (the CHECK constraint implies it): with it, the planner may walk
-- messages_claimed_idx from the start, dead entries and all (see messages_session_idx).
-- A claim only the claim ledger holds (its row left 'ready': step 3b of the write path) has
-- its session in its ledger row (claims_session_idx): its row gets the expired lease.
CREATE FUNCTION pgqueue._expire_orphaned_claims() RETURNS bigint
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp SET jit = off SET enable_seqscan = off
BEGIN ATOMIC
    WITH alive AS MATERIALIZED (
        SELECT a.pid, a.backend_start FROM pg_stat_get_activity(NULL) a
         WHERE a.datid = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
    ), orphaned AS (
        SELECT m.msg_id FROM pgqueue.message_rows m
         WHERE m.session_pid IS NOT NULL AND m.lease_expires_at > now()
           AND NOT EXISTS (SELECT FROM alive a
                            WHERE a.pid = m.session_pid AND a.backend_start = m.session_started)
           FOR UPDATE OF m SKIP LOCKED
    ), orphaned_in_ledger AS (
        -- Each message looked up from its entry (as in _ledger_held), and locked there.
        SELECT m.msg_id FROM pgqueue.claims c
         CROSS JOIN LATERAL unnest(c.msg_ids, c.claim_numbers) AS e(msg_id, number)
         CROSS JOIN LATERAL (SELECT r.msg_id FROM pgqueue.message_rows r
                              WHERE r.msg_id = e.msg_id AND pg_catalog.texteq(r.state, 'ready') AND r.claims_ended + 1 = e.number
                                AND coalesce(r.lease_expires_at, c.lease_expires_at) > now()
                              LIMIT 1
                                FOR UPDATE SKIP LOCKED) m
         WHERE c.session_pid IS NOT NULL
           AND NOT EXISTS (SELECT FROM alive a
                            WHERE a.pid = c.session_pid AND a.backend_start = c.session_started)
    ), expired AS (
        UPDATE pgqueue.message_rows m SET lease_expires_at = now()
          FROM (SELECT o.msg_id FROM orphaned o UNION ALL SELECT o.msg_id FROM orphaned_in_ledger o) o
         WHERE m.msg_id = o.msg_id
        RETURNING m.msg_id, m.claims_ended + 1 AS number, m.lease_expires_at
    )
    SELECT coalesce(pgqueue._held_renew(array_agg(e.msg_id), array_agg(e.number), array_agg(e.lease_expires_at)), 0)::bigint
      FROM expired e;
END;

-- Step "claims": deletes the claim ledger's rows none of whose entries is live any more (each
-- message finished, or its claim ended by a nack, park or re-arm: claims_ended at or past the
-- entry's claim number), looking at up to max_rows rows after after_claim_id (the caller's
-- cursor: 0 starts from the first). An entry once ended stays so: claims_ended only grows,
-- and a redrive starts it past the numbers the ledger lists. Messages are read by primary
-- key only (a state predicate may make the planner read the in-flight index, whose dead
-- entries a pinned horizon keeps). Returns the rows looked at, those deleted, and where the
-- cursor goes: just before the first row left that was claimed in the last 10 seconds, so
-- that the next tick looks at it again (after a full batch only if that is past the cursor: a
-- step that made no progress would never end), else the last id looked at.
-- Most such rows are live only because they are new (their claims end within a tick); passed
-- by the cursor, they would stay until the prune cadence looks at all rows, and every read of
-- the ledger by queue (the tick's hint check) would read thousands of them.
-- The rows it deletes are locked first without waiting (0.25.0): a pgq_drop_queue deletes its
-- queue's rows in an order of its own, and a step waiting for it while it waits for the step
-- was a deadlock. A row skipped so is looked at again at the prune cadence, if still there.
CREATE FUNCTION pgqueue._prune_claims(after_claim_id bigint, max_rows integer)
RETURNS TABLE (looked bigint, pruned bigint, last_claim_id bigint)
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH looked_at AS MATERIALIZED (
        SELECT c.claim_id, c.claimed_at FROM pgqueue.claims c WHERE c.claim_id > after_claim_id
         ORDER BY c.claim_id LIMIT max_rows
    ), ended AS (
        SELECT c.claim_id FROM pgqueue.claims c JOIN looked_at l ON c.claim_id = l.claim_id
         WHERE NOT EXISTS (SELECT FROM unnest(c.msg_ids, c.claim_numbers) AS e(msg_id, number)
                             JOIN pgqueue.message_rows m ON m.msg_id = e.msg_id
                            WHERE m.claims_ended < e.number)
           FOR UPDATE OF c SKIP LOCKED
    ), gone AS (
        DELETE FROM pgqueue.claims c USING ended e WHERE c.claim_id = e.claim_id
        RETURNING c.claim_id
    )
    SELECT (SELECT count(*) FROM looked_at), (SELECT count(*) FROM gone),
           (SELECT CASE WHEN s.live_from IS NULL THEN s.last
                        WHEN s.looked < max_rows OR s.live_from - 1 > after_claim_id THEN s.live_from - 1
                        ELSE s.last END
              FROM (SELECT count(*) AS looked, max(l.claim_id) AS last,
                           min(l.claim_id) FILTER (WHERE l.claimed_at > now() - interval '10 seconds'
                                                     AND NOT EXISTS (SELECT FROM gone g WHERE g.claim_id = l.claim_id))
                               AS live_from
                      FROM looked_at l) s);
END;

-- Step "reconcile" (src/reconcile.rs): for each priority the shared state lists, its lowest
-- claimable msg_id; then, in the gaps between the listed priorities, any priority it does not
-- list (a loose index scan: one probe per priority found); and the earliest due time.
-- Rows with a NULL priority carry only the due time. A 'ready' row that only the claim ledger
-- holds is not claimable (its queue's list is read once). `busy`: another transaction has the
-- message locked or changed (a claim under way, or one just rolled back), so a hint above it
-- is no sign of a missed lowering.
CREATE FUNCTION pgqueue._claimable(queue text, priorities smallint[])
RETURNS TABLE (priority smallint, msg_id bigint, due timestamptz, busy boolean)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp SET jit = off SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    p smallint;
    above integer := 1001;  -- priorities are between -1000 and 1000
    below integer;
    listed smallint[] := ARRAY(SELECT l FROM unnest(priorities) l ORDER BY l DESC);
    i integer := 1;
    ledger_held bigint[] := ARRAY(SELECT h.msg_id FROM pgqueue._ledger_held h WHERE h.queue = queue);
BEGIN
    due := NULL;
    LOOP
        below := CASE WHEN i <= cardinality(listed) THEN listed[i] ELSE -1001 END;
        -- Unlisted priorities strictly between `above` and `below`, highest first.
        LOOP
            SELECT m.priority, m.msg_id, m.xmax <> '0' INTO priority, msg_id, busy FROM pgqueue.message_rows m
             WHERE m.queue = queue AND m.state = 'ready' AND m.priority < above AND m.priority > below
               AND m.msg_id NOT IN (SELECT unnest(ledger_held))
             ORDER BY m.priority DESC, m.msg_id LIMIT 1;
            EXIT WHEN NOT FOUND;
            RETURN NEXT;
            above := priority;
        END LOOP;
        EXIT WHEN i > cardinality(listed);
        p := listed[i];
        SELECT m.msg_id, m.xmax <> '0' INTO msg_id, busy FROM pgqueue.message_rows m
         WHERE m.queue = queue AND m.state = 'ready' AND m.priority = p
           AND m.msg_id NOT IN (SELECT unnest(ledger_held))
         ORDER BY m.msg_id LIMIT 1;
        IF FOUND THEN
            priority := p;
            RETURN NEXT;
        END IF;
        above := p;
        i := i + 1;
    END LOOP;
    priority := NULL;
    msg_id := NULL;
    busy := NULL;
    due := (SELECT min(m.visible_at) FROM pgqueue.message_rows m WHERE m.queue = queue AND m.state = 'delayed');
    RETURN NEXT;
END
$$;

-- Step "partitions": every queue's history has day partitions for today and the next two
-- days. Creating one locks the queue's history briefly: only under prune_lock_timeout, and a
-- lock not granted in time is retried next tick (rows meanwhile go to the default partition).
CREATE FUNCTION pgqueue._maintain_partitions() RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET TimeZone = 'UTC' SET lock_timeout = '5s' AS $$
DECLARE
    q text;
    day date;
    created bigint := 0;
    timeout text := pgqueue._prune_lock_timeout() || 'ms';
BEGIN
    FOR q IN SELECT queues.queue FROM pgqueue.queues ORDER BY 1 LOOP
        -- Not while a restore builds this history: that day's rows may be on their way into
        -- the default partition, and its COPY would fail once the day has a partition.
        CONTINUE WHEN pgqueue._unindexed_history_part(
            to_regclass(format('pgqueue.%I', pgqueue._history_table(q)))) IS NOT NULL;
        FOR day IN SELECT d::date FROM generate_series(now()::date, now()::date + 2, '1 day') d LOOP
            BEGIN
                PERFORM set_config('lock_timeout', timeout, true);
                IF pgqueue._ensure_history_day(q, day) THEN
                    created := created + 1;
                END IF;
            EXCEPTION
                WHEN lock_not_available THEN NULL;  -- busy: next tick
                WHEN check_violation THEN NULL;     -- that day's rows already sit in the default partition
                WHEN OTHERS THEN                    -- one queue's trouble must not stop the others
                    RAISE WARNING 'pgqueue: cannot add the % partition of queue %: %', day, q, SQLERRM;
            END;
        END LOOP;
    END LOOP;
    RETURN created;
END
$$;

-- How many rows a history partition holds, and the latest finished_at among them, for
-- pgq_prune (which holds the partition locked). Counted 64 pages at a time: one scan of a
-- large partition held the consumers' claims and acks up for 12-25 ms on a 2-core machine,
-- short ones for about a third of that (docs/benchmarks/history.md, "A prune that holds up no commit").
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

-- Removes each queue's completed and dead-lettered messages past its retention, a whole day
-- partition at a time: it is truncated, and dropped empty by a later prune. Acks insert
-- through the queue's history into today's partition, so neither step makes them wait:
-- truncating locks only the old partition, and the drop (which must lock the queue's
-- history too) takes its locks only if they are free at once, last, and only in a call that
-- truncated nothing, so that its commit has no data to unlink; the truncated partition's old
-- files are freed at commit a few megabytes at a time (src/prune.rs). Lock waits are bounded
-- by pgqueue.prune_lock_timeout. One row per queue and partition:
--   pruned          the partition was emptied (rows: how many it held)
--   noop            nothing of this queue is past its retention
--   blocked         the lock was not granted within the timeout; tried again next time
--   skipped_active  another session is pruning this queue, or restoring its history, right now
--   backed_off      not tried: recent attempts were blocked or skipped (all-queues form only)
--   error           anything else went wrong (logged as a warning); other partitions go on
CREATE TYPE pgqueue.prune_result AS (queue text, target text, outcome text, rows bigint);

CREATE FUNCTION pgqueue.pgq_prune(queue text DEFAULT NULL) RETURNS SETOF pgqueue.prune_result
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

-- Step "keys": unique-job keys whose hold has ended are deleted, up to max_rows (a send
-- would take such a key over anyway; this keeps the table small). statement_timestamp(), not
-- clock_timestamp(): the expiry index can then bound the scan.
CREATE FUNCTION pgqueue._expire_dedup_keys(max_rows integer) RETURNS bigint
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH expired AS (
        SELECT d.queue, d.dedup_key FROM pgqueue.dedup_keys d
         WHERE d.expires_at <= statement_timestamp()
         ORDER BY d.expires_at LIMIT max_rows
           FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM pgqueue.dedup_keys d USING expired e
         WHERE d.queue = e.queue AND d.dedup_key = e.dedup_key
        RETURNING 1
    )
    SELECT count(*) FROM gone;
END;

-- Adds one tick's counts (a jsonb of counter => increment, plus "error" and flags) to the
-- worker_state row.
CREATE FUNCTION pgqueue._record_tick(counts jsonb) RETURNS void
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
        claims_failures = claims_failures + coalesce((counts->>'claims_failures')::bigint, 0),
        claims_pruned = claims_pruned + coalesce((counts->>'claims_pruned')::bigint, 0),
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
