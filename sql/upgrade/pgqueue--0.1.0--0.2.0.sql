-- pgqueue 0.1.0 -> 0.2.0
--
-- Dumps of a pgqueue database restore again, also with pg_restore --jobs:
-- * the dead-letter index moves from a partitioned index on pgqueue.history (which ATTACH
--   PARTITION copied onto each queue's history before the dump's own CREATE INDEX ran) to a
--   plain index on each leaf partition; the worker neither adds nor drops a queue's history
--   partitions while one lacks it (a restore still under way);
-- * messages loses its foreign key to queues (a parallel restore loads the two in any
--   order); sends lock the queue row themselves, and pgq_drop_queue deletes the messages
--   (only in READ COMMITTED, where it sees what concurrent sends commit).
-- Session-bound claims count as orphaned unless their backend is connected to this database.

-- Indexes one leaf partition of a queue's history, for pgq_redrive's lookups of dead
-- letters. Every leaf gets it when it is created, before it is attached, so pgq_prune can
-- take a leaf without it for a restore still under way (pg_dump creates indexes last).
-- The name is the leaf's plus "_dead": at most 62 characters, and unique as the leaf's is.
CREATE FUNCTION pgqueue._index_history_part(part text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    EXECUTE pg_catalog.format('CREATE INDEX %I ON pgqueue.%I (msg_id) WHERE outcome = %L',
        part || '_dead', part, 'dead');
END
$$;

-- The first leaf partition of a queue's history (`parent`) that has no index, if any: a
-- restore is still building that history (pg_dump creates indexes last) and may yet load
-- rows into, or index, any of its partitions, so the worker neither adds nor drops one.
CREATE FUNCTION pgqueue._unindexed_history_part(parent regclass) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (SELECT c.relname::text FROM pg_partition_tree(parent) t JOIN pg_class c ON c.oid = t.relid
         WHERE t.isleaf AND NOT EXISTS (SELECT FROM pg_index i WHERE i.indrelid = t.relid)
         ORDER BY 1 LIMIT 1);

-- The queue's settings, its row locked FOR KEY SHARE until commit, for the functions that
-- insert messages: pgq_drop_queue locks the row FOR UPDATE before it deletes the queue's
-- messages, so each insert either commits first (and is deleted with the queue) or finds the
-- queue gone (42704). A foreign key would do the same per row, but pg_restore --jobs loads
-- the data of an extension's tables in any order, and would fail on it.
CREATE FUNCTION pgqueue._lock_queue(queue text) RETURNS pgqueue.queues
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q pgqueue.queues;
BEGIN
    SELECT * INTO q FROM pgqueue.queues WHERE queues.queue = _lock_queue.queue FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN pgqueue._queue(queue);  -- raises the error
    END IF;
    RETURN q;
END
$$;

-- Creates the day partition of a queue's history that holds `day` (a UTC day), unless it
-- exists. Created apart, then attached: attaching locks the queue's history only in SHARE
-- UPDATE EXCLUSIVE mode, so acks keep flowing.
CREATE OR REPLACE FUNCTION pgqueue._ensure_history_day(queue text, day date) RETURNS boolean
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
        'CREATE TABLE pgqueue.%I (LIKE pgqueue.history INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', part);
    PERFORM pgqueue._index_history_part(part);
    EXECUTE pg_catalog.format(
        'ALTER TABLE pgqueue.%I ATTACH PARTITION pgqueue.%I FOR VALUES FROM (%L) TO (%L)',
        parent, part, day::timestamptz, (day + 1)::timestamptz);
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.pgq_create_queue(
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

    -- Built apart and attached last: attaching locks pgqueue.history only in SHARE UPDATE
    -- EXCLUSIVE mode, so other queues' acks are not held up.
    EXECUTE pg_catalog.format(
        'CREATE TABLE pgqueue.%I (LIKE pgqueue.history INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (finished_at)',
        pgqueue._history_table(queue));
    -- Rows that arrive before their day's partition exists land here; never lost.
    EXECUTE pg_catalog.format('CREATE TABLE pgqueue.%I PARTITION OF pgqueue.%I DEFAULT',
        pgqueue._history_table(queue) || '$default', pgqueue._history_table(queue));
    PERFORM pgqueue._index_history_part(pgqueue._history_table(queue) || '$default');
    FOR day IN SELECT d::date FROM pg_catalog.generate_series(now()::date, now()::date + 2, '1 day') d LOOP
        PERFORM pgqueue._ensure_history_day(queue, day);
    END LOOP;
    EXECUTE pg_catalog.format('ALTER TABLE pgqueue.history ATTACH PARTITION pgqueue.%I FOR VALUES IN (%L)',
        pgqueue._history_table(queue), queue);
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.pgq_drop_queue(queue text, force boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '5s' AS $$
DECLARE
    in_flight bigint;
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
    SELECT count(*) INTO in_flight FROM pgqueue.messages m
     WHERE m.queue = pgq_drop_queue.queue AND m.state = 'claimed';
    IF in_flight > 0 AND NOT force THEN
        RAISE EXCEPTION 'pgqueue: queue "%" has % claimed messages', queue, in_flight
            USING ERRCODE = 'object_in_use',
                  HINT = 'Wait for the consumers to finish, or pass force => true.';
    END IF;
    DELETE FROM pgqueue.messages m WHERE m.queue = pgq_drop_queue.queue;
    DELETE FROM pgqueue.queues q WHERE q.queue = pgq_drop_queue.queue;
    -- Dropping a partition locks pgqueue.history exclusively: wait for that at most
    -- lock_timeout (5 s, this function's setting), then fail with 55P03 and change nothing.
    EXECUTE pg_catalog.format('DROP TABLE pgqueue.%I', pgqueue._history_table(queue));
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.pgq_send_batch(
    queue text,
    payloads jsonb[],
    delay interval DEFAULT '0',
    priority smallint DEFAULT 0,
    headers jsonb DEFAULT NULL
) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    q pgqueue.queues := pgqueue._lock_queue(queue);
    due timestamptz;
BEGIN
    PERFORM pgqueue._check_payloads(payloads);
    PERFORM pgqueue._check_delay(pgqueue._require(delay, 'delay'), 'delay');
    PERFORM pgqueue._check_priority(priority);
    IF pg_catalog.cardinality(payloads) > 10000 THEN
        PERFORM pgqueue._invalid('payloads', pg_catalog.format(
            '%s messages in one call; at most 10000', pg_catalog.cardinality(payloads)));
    END IF;
    due := CASE WHEN delay > interval '0' THEN now() + delay END;
    RETURN QUERY
    INSERT INTO pgqueue.messages (queue, state, priority, payload, headers, visible_at)
    SELECT q.queue, CASE WHEN due IS NULL THEN 'ready' ELSE 'delayed' END, priority, p, headers, due
      FROM pg_catalog.unnest(payloads) WITH ORDINALITY AS u(p, n)
     ORDER BY u.n
    RETURNING msg_id;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.pgq_send(
    queue text,
    payload jsonb,
    delay interval DEFAULT '0',
    priority smallint DEFAULT 0,
    headers jsonb DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    q pgqueue.queues := pgqueue._lock_queue(queue);
    due timestamptz;
    id bigint;
BEGIN
    PERFORM pgqueue._check_payload(payload);
    PERFORM pgqueue._check_delay(pgqueue._require(delay, 'delay'), 'delay');
    PERFORM pgqueue._check_priority(priority);
    due := CASE WHEN delay > interval '0' THEN now() + delay END;
    INSERT INTO pgqueue.messages (queue, state, priority, payload, headers, visible_at)
    VALUES (q.queue, CASE WHEN due IS NULL THEN 'ready' ELSE 'delayed' END, priority, payload, headers, due)
    RETURNING msg_id INTO id;
    RETURN id;
END
$$;

-- Dead letters back to claimable with a fresh attempt count: all of the queue's, or the
-- given ids. Returns how many came back.
CREATE OR REPLACE FUNCTION pgqueue.pgq_redrive(queue text, msg_ids bigint[] DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    q pgqueue.queues := pgqueue._lock_queue(queue);
    moved bigint;
BEGIN
    WITH back AS (
        DELETE FROM pgqueue.history h
         WHERE h.queue = q.queue AND h.outcome = 'dead'
           AND (msg_ids IS NULL OR h.msg_id = ANY (msg_ids))
        RETURNING h.msg_id, h.priority, h.payload, h.headers, h.enqueued_at, h.last_error
    )
    INSERT INTO pgqueue.messages (msg_id, queue, state, priority, payload, headers, enqueued_at, last_error)
    OVERRIDING SYSTEM VALUE
    SELECT b.msg_id, q.queue, 'ready', b.priority, b.payload, b.headers, b.enqueued_at, b.last_error
      FROM back b;
    GET DIAGNOSTICS moved = ROW_COUNT;
    RETURN moved;
END
$$;

-- Step "orphans": session-bound claims whose backend has exited (same pid and start time no
-- longer alive in this database) get an expired lease, so the re-arm step that follows makes
-- them claimable. "In this database": a restored copy's claims belong to no session here.
CREATE OR REPLACE FUNCTION pgqueue._expire_orphaned_claims() RETURNS bigint
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH alive AS MATERIALIZED (
        SELECT a.pid, a.backend_start FROM pg_stat_get_activity(NULL) a
         WHERE a.datid = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
    ), orphaned AS (
        SELECT m.msg_id FROM pgqueue.messages m
         WHERE m.state = 'claimed' AND m.session_pid IS NOT NULL AND m.lease_expires_at > now()
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

-- Step "partitions": every queue's history has day partitions for today and the next two
-- days. Creating one locks the queue's history briefly: only under prune_lock_timeout, and a
-- lock not granted in time is retried next tick (rows meanwhile go to the default partition).
CREATE OR REPLACE FUNCTION pgqueue._maintain_partitions() RETURNS bigint
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
                    -- Only the lock waits are bounded by the prune lock timeout.
                    PERFORM set_config('lock_timeout', timeout, true);
                    IF part.day IS NULL THEN
                        -- The default partition: truncated once everything in it is past. Lock
                        -- first, so no ack can slip in between the check and the truncate.
                        EXECUTE format('LOCK TABLE pgqueue.%I IN ACCESS EXCLUSIVE MODE', part.name);
                        PERFORM set_config('lock_timeout', '5s', true);
                        EXECUTE format('SELECT count(*), max(finished_at) FROM pgqueue.%I', part.name)
                           INTO n, newest;
                        CONTINUE WHEN n = 0 OR newest > cutoff;
                        EXECUTE format('TRUNCATE pgqueue.%I', part.name);
                    ELSE
                        PERFORM set_config('lock_timeout', '5s', true);
                        EXECUTE format('SELECT count(*) FROM pgqueue.%I', part.name) INTO n;
                        PERFORM set_config('lock_timeout', timeout, true);
                        EXECUTE format('DROP TABLE pgqueue.%I', part.name);
                        PERFORM set_config('lock_timeout', '5s', true);
                    END IF;
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
END
$$;

REVOKE ALL ON FUNCTION pgqueue._index_history_part(text), pgqueue._unindexed_history_part(regclass),
    pgqueue._lock_queue(text) FROM PUBLIC;

ALTER TABLE pgqueue.messages DROP CONSTRAINT messages_queue_fkey;

DROP INDEX pgqueue.history_dead_idx;  -- and with it every partition's copy
DO $upgrade$
DECLARE
    leaf text;
BEGIN
    FOR leaf IN SELECT c.relname FROM pg_catalog.pg_partition_tree('pgqueue.history') t
                  JOIN pg_catalog.pg_class c ON c.oid = t.relid
                 WHERE t.isleaf ORDER BY 1 LOOP
        PERFORM pgqueue._index_history_part(leaf);
    END LOOP;
END
$upgrade$;
