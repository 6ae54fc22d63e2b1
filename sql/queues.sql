-- Queue management: create, drop, pause, resume.

-- The history partition that holds a queue's completed and dead-lettered messages. Its own
-- partitions are named history_<queue>$<YYYYMMDD> and history_<queue>$default: queue names
-- cannot contain '$', so no queue's tables can collide with another's.
CREATE FUNCTION pgqueue._history_table(queue text) RETURNS text
LANGUAGE sql IMMUTABLE
RETURN 'history_' || queue;

-- Indexes one leaf partition of a queue's history: its dead letters, for pgq_redrive and
-- pgq_delete_dead, and (since 0.12.0) its msg_ids as a BRIN index, for finding a job by id
-- (history is written in about msg_id order; a BRIN index costs an insert almost nothing).
-- Every leaf gets them when it is created, before it is attached, so pgq_prune can take a
-- leaf without both for a restore still under way (pg_dump creates indexes last). The names
-- are the leaf's plus "_dead" and "_ids": at most 62 characters, and unique as the leaf's is.
CREATE FUNCTION pgqueue._index_history_part(part text) RETURNS void
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
CREATE FUNCTION pgqueue._unindexed_history_part(parent regclass) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (SELECT c.relname::text FROM pg_partition_tree(parent) t JOIN pg_class c ON c.oid = t.relid
         WHERE t.isleaf AND (SELECT count(*) FROM pg_index i WHERE i.indrelid = t.relid) < 2
         ORDER BY 1 LIMIT 1);

-- Creates the day partition of a queue's history that holds `day` (a UTC day), unless it
-- exists. Created apart, then attached: attaching locks the queue's history only in SHARE
-- UPDATE EXCLUSIVE mode, so acks keep flowing.
CREATE FUNCTION pgqueue._ensure_history_day(queue text, day date) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET TimeZone = 'UTC' AS $$
DECLARE
    parent text := pgqueue._history_table(queue);
    part text := parent || '$' || pg_catalog.to_char(day, 'YYYYMMDD');
BEGIN
    IF EXISTS (SELECT FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                WHERE i.inhparent = pg_catalog.format('pgqueue.%I', parent)::regclass AND c.relname = part) THEN
        RETURN false;
    END IF;
    EXECUTE pg_catalog.format(
        'CREATE TABLE pgqueue.%I (LIKE pgqueue.history_rows INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', part);
    PERFORM pgqueue._index_history_part(part);
    EXECUTE pg_catalog.format(
        'ALTER TABLE pgqueue.%I ATTACH PARTITION pgqueue.%I FOR VALUES FROM (%L) TO (%L)',
        parent, part, day::timestamptz, (day + 1)::timestamptz);
    RETURN true;
END
$$;

CREATE FUNCTION pgqueue.pgq_create_queue(
    queue text,
    lease interval DEFAULT '120 s',
    max_attempts integer DEFAULT 5,
    if_not_exists boolean DEFAULT false,
    retention interval DEFAULT '7 days',
    paused boolean DEFAULT false
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET TimeZone = 'UTC' AS $$
DECLARE
    day date;
BEGIN
    PERFORM pgqueue._check_queue_name(queue);
    PERFORM pgqueue._require(lease, 'lease');
    PERFORM pgqueue._check_lease(lease);
    PERFORM pgqueue._require(max_attempts, 'max_attempts');
    IF max_attempts NOT BETWEEN 1 AND 1000 THEN
        PERFORM pgqueue._invalid('max_attempts', pg_catalog.format('%s is not between 1 and 1000', max_attempts));
    END IF;
    PERFORM pgqueue._require(if_not_exists, 'if_not_exists');
    PERFORM pgqueue._require(retention, 'retention');
    IF retention < interval '0' OR retention > interval '3650 days' THEN
        PERFORM pgqueue._invalid('retention', pg_catalog.format('%s is not between 0 and 3650 days', retention));
    END IF;
    PERFORM pgqueue._require(paused, 'paused');

    INSERT INTO pgqueue.queues (queue, lease, max_attempts, retention, paused)
    VALUES (queue, lease, max_attempts, retention, paused)
    ON CONFLICT ON CONSTRAINT queues_pkey DO NOTHING;
    IF NOT FOUND THEN
        IF if_not_exists THEN
            RAISE NOTICE 'pgqueue: queue "%" already exists, skipping', queue;
            RETURN;
        END IF;
        RAISE EXCEPTION 'pgqueue: queue "%" already exists', queue USING ERRCODE = 'duplicate_object';
    END IF;
    -- Shared state left by an earlier queue of that name is forgotten at commit.
    PERFORM pgqueue._reset_queue(queue);

    -- Built apart and attached last: attaching locks pgqueue.history_rows only in SHARE UPDATE
    -- EXCLUSIVE mode, so other queues' acks are not held up.
    EXECUTE pg_catalog.format(
        'CREATE TABLE pgqueue.%I (LIKE pgqueue.history_rows INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (finished_at)',
        pgqueue._history_table(queue));
    -- Rows that arrive before their day's partition exists land here; never lost.
    EXECUTE pg_catalog.format('CREATE TABLE pgqueue.%I PARTITION OF pgqueue.%I DEFAULT',
        pgqueue._history_table(queue) || '$default', pgqueue._history_table(queue));
    PERFORM pgqueue._index_history_part(pgqueue._history_table(queue) || '$default');
    FOR day IN SELECT d::date FROM pg_catalog.generate_series(now()::date, now()::date + 2, '1 day') d LOOP
        PERFORM pgqueue._ensure_history_day(queue, day);
    END LOOP;
    EXECUTE pg_catalog.format('ALTER TABLE pgqueue.history_rows ATTACH PARTITION pgqueue.%I FOR VALUES IN (%L)',
        pgqueue._history_table(queue), queue);
END
$$;

CREATE FUNCTION pgqueue.pgq_drop_queue(queue text, force boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '5s' AS $$
DECLARE
    in_flight bigint;
    ended integer;
    held bigint[];
    held_numbers integer[];
    parents bigint[];
    children bigint[];
BEGIN
    PERFORM pgqueue._require(force, 'force');
    PERFORM pgqueue._queue(queue);
    -- The messages of sends that commit while this waits for the queue's row must be
    -- visible to the DELETE below: only a fresh snapshot per statement sees them.
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgqueue: pgq_drop_queue runs only in a READ COMMITTED transaction'
            USING ERRCODE = 'feature_not_supported';
    END IF;
    -- Lock the queue row: sends under way (they lock it FOR KEY SHARE, see _lock_queue)
    -- commit first, and no new one starts until this commits.
    PERFORM FROM pgqueue.queues q WHERE q.queue = pgq_drop_queue.queue FOR UPDATE;
    SELECT count(*) INTO in_flight FROM pgqueue.message_rows m
     WHERE m.queue = pgq_drop_queue.queue AND m.state = 'claimed';
    -- And the claims only the claim ledger holds (their rows left 'ready').
    SELECT array_agg(h.msg_id), array_agg(h.number) INTO held, held_numbers
      FROM pgqueue._ledger_held h WHERE h.queue = pgq_drop_queue.queue;
    in_flight := in_flight + coalesce(pg_catalog.cardinality(held), 0);
    IF in_flight > 0 AND NOT force THEN
        RAISE EXCEPTION 'pgqueue: queue "%" has % claimed messages', queue, in_flight
            USING ERRCODE = 'object_in_use',
                  HINT = 'Wait for the consumers to finish, or pass force => true.';
    END IF;
    WITH gone AS (
        DELETE FROM pgqueue.message_rows m WHERE m.queue = pgq_drop_queue.queue
        RETURNING m.msg_id, m.has_dependents, m.after IS NOT NULL AS child,
                  CASE WHEN m.state = 'claimed' THEN m.claims_ended + 1 END AS number
    )
    -- Claims ended with their messages: for the held set at commit.
    SELECT array_agg(g.msg_id) FILTER (WHERE g.has_dependents), array_agg(g.msg_id) FILTER (WHERE g.child),
           pgqueue._held_end(array_agg(g.msg_id) FILTER (WHERE g.number IS NOT NULL),
                             array_agg(g.number) FILTER (WHERE g.number IS NOT NULL))
      INTO parents, children, ended FROM gone g;
    ended := pgqueue._held_end(held, held_numbers);
    -- Its claim ledger rows: none of their entries is live now. Left to the tick's "claims"
    -- step, a queue created again under the name would read them as its own until then.
    DELETE FROM pgqueue.claims c WHERE c.queue = pgq_drop_queue.queue;
    -- Children in other queues: their parents were deleted (on_parent_failure applies).
    IF parents IS NOT NULL OR children IS NOT NULL THEN
        PERFORM pgqueue._finish_dependencies(coalesce(parents, '{}'),
            pg_catalog.array_fill('deleted'::text, ARRAY[coalesce(pg_catalog.cardinality(parents), 0)]),
            coalesce(children, '{}'));
    END IF;
    DELETE FROM pgqueue.dedup_keys d WHERE d.queue = pgq_drop_queue.queue;
    DELETE FROM pgqueue.queues q WHERE q.queue = pgq_drop_queue.queue;
    PERFORM pgqueue._reset_queue(queue);  -- at commit; its waiting claims then find it gone
    -- Dropping a partition locks pgqueue.history_rows exclusively: wait for that at most
    -- lock_timeout (5 s, this function's setting), then fail with 55P03 and change nothing.
    EXECUTE pg_catalog.format('DROP TABLE pgqueue.%I', pgqueue._history_table(queue));
END
$$;

-- Pausing: claims on a paused queue return nothing; sends still go in.
CREATE FUNCTION pgqueue._set_paused(queue text, paused boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgqueue._queue(queue);
    UPDATE pgqueue.queues q SET paused = _set_paused.paused WHERE q.queue = _set_paused.queue;
    IF NOT paused THEN
        PERFORM pgqueue._wake_queue(queue);  -- waiting claims look again at commit
    END IF;
END
$$;

CREATE FUNCTION pgqueue.pgq_pause_queue(queue text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT pgqueue._set_paused(queue, true);
END;

CREATE FUNCTION pgqueue.pgq_resume_queue(queue text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT pgqueue._set_paused(queue, false);
END;
