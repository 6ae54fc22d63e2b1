-- pgqueue 0.25.1 -> 0.26.0.
--
-- Step 1 of stage 2 of the write path (docs/design/write-path.md): the table of finished
-- messages is renamed pgqueue.history_rows, and pgqueue.history becomes a view of it with the
-- same columns, which users read as before; a later release can show there finished rows
-- kept elsewhere without changing its readers. The partitions, their names, indexes and rows
-- stay; no row is rewritten. The rename takes an ACCESS EXCLUSIVE lock on the table (not on
-- its partitions) for an instant: acks wait for it. The functions that create, attach or
-- delete from it now name the table; the views that read it (queue_stats, jobs) the view.

ALTER TABLE pgqueue.history RENAME TO history_rows;
-- PostgreSQL 18 keeps NOT NULL constraints by name, made from the table's when it was
-- created: a fresh install's are history_rows_<column>_not_null. (Before 18 there are none.)
DO $$
DECLARE
    old name;
BEGIN
    FOR old IN SELECT c.conname FROM pg_catalog.pg_constraint c
                WHERE c.conrelid = 'pgqueue.history_rows'::regclass AND c.contype = 'n'
                  AND c.conname LIKE 'history\_%\_not\_null' LOOP
        EXECUTE pg_catalog.format('ALTER TABLE pgqueue.history_rows RENAME CONSTRAINT %I TO %I', old,
                                  'history_rows' || pg_catalog.substr(old, pg_catalog.length('history') + 1));
    END LOOP;
END
$$;

CREATE VIEW pgqueue.history AS
SELECT msg_id, queue, outcome, priority, attempt, payload, headers, enqueued_at, finished_at, last_error, result,
       progress, after
  FROM pgqueue.history_rows;
REVOKE ALL ON pgqueue.history FROM PUBLIC;

COMMENT ON TABLE pgqueue.history_rows IS
    'the rows behind pgqueue.history, partitioned by queue and day: read that view, not this table';
COMMENT ON VIEW pgqueue.history IS
    'completed, dead-lettered and cancelled messages, kept for the queue''s retention';

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

CREATE OR REPLACE VIEW pgqueue.jobs AS
SELECT m.msg_id, m.queue, m.state, m.priority, m.attempt, m.payload, m.headers, m.enqueued_at, m.visible_at,
       m.claimed_at, m.consumer, m.lease_expires_at, NULL::timestamptz AS finished_at, m.last_error, m.dedup_key,
       m.progress, NULL::jsonb AS result, m.after, m.park_key, m.park_until
  FROM pgqueue.messages m
 UNION ALL
SELECT h.msg_id, h.queue, h.outcome, h.priority, h.attempt, h.payload, h.headers, h.enqueued_at, NULL, NULL,
       NULL, NULL, h.finished_at, h.last_error, NULL, h.progress, h.result, h.after, NULL, NULL
  FROM pgqueue.history h;

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
        'CREATE TABLE pgqueue.%I (LIKE pgqueue.history_rows INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', part);
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

CREATE OR REPLACE FUNCTION pgqueue.pgq_drop_queue(queue text, force boolean DEFAULT false) RETURNS void
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

CREATE OR REPLACE FUNCTION pgqueue.pgq_delete_dead(queue text, msg_ids bigint[] DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    q pgqueue.queues := pgqueue._queue(queue);
    deleted bigint;
BEGIN
    DELETE FROM pgqueue.history_rows h
     WHERE h.queue = q.queue AND h.outcome = 'dead' AND (msg_ids IS NULL OR h.msg_id = ANY (msg_ids));
    GET DIAGNOSTICS deleted = ROW_COUNT;
    PERFORM pgqueue._note(q.queue, deleted, 'dead', NULL);
    RETURN deleted;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.pgq_redrive(queue text, msg_ids bigint[] DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    q pgqueue.queues := pgqueue._lock_queue(queue);
    moved bigint;
BEGIN
    WITH back AS (
        DELETE FROM pgqueue.history_rows h
         WHERE h.queue = q.queue AND h.outcome = 'dead'
           AND (msg_ids IS NULL OR h.msg_id = ANY (msg_ids))
        RETURNING h.msg_id, h.priority, h.payload, h.headers, h.enqueued_at, h.last_error, h.progress
    )
    -- A message back under its msg_id starts its claim count past every claim of it the
    -- ledger still lists, which would otherwise be live again (the ledger is read whole: it
    -- holds about the claims in flight, and a redrive is rare).
    , listed AS (
        SELECT e.msg_id, max(e.number) AS number
          FROM pgqueue.claims c, unnest(c.msg_ids, c.claim_numbers) AS e(msg_id, number)
         WHERE c.queue = q.queue AND e.msg_id IN (SELECT b.msg_id FROM back b)
         GROUP BY e.msg_id
    )
    , again AS (
        INSERT INTO pgqueue.message_rows (msg_id, queue, state, priority, payload, headers, enqueued_at, last_error,
                                      progress, claims_ended)
        OVERRIDING SYSTEM VALUE
        SELECT b.msg_id, q.queue, 'ready', b.priority, b.payload, b.headers, b.enqueued_at, b.last_error, b.progress,
               coalesce(l.number, 0)
          FROM back b LEFT JOIN listed l ON l.msg_id = b.msg_id
        RETURNING message_rows.msg_id, message_rows.priority
    )
    SELECT coalesce(sum(n), 0) INTO moved
      FROM (SELECT count(*) AS n, pgqueue._note(q.queue, count(*), 'history', 'ready', a.priority,
                                                min(a.msg_id), max(a.msg_id))
              FROM again a GROUP BY a.priority) r;
    RETURN moved;
END
$$;
