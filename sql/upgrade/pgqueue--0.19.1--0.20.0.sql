-- pgqueue 0.19.1 -> 0.20.0.
--
-- The table of waiting and claimed messages is renamed pgqueue.message_rows, and
-- pgqueue.messages becomes a view of it with the same columns: what users read and may
-- update or lock through stays as it was, and a later release can keep a claim's lease
-- outside the row. Its sequence, primary key, constraint and index names stay. Every function
-- that names the table is replaced to name message_rows (those with SQL-standard bodies,
-- BEGIN ATOMIC, follow the rename by themselves). The rename takes an ACCESS EXCLUSIVE
-- lock on the table for an instant; no row is rewritten.

ALTER TABLE pgqueue.messages RENAME TO message_rows;
-- PostgreSQL 18 keeps NOT NULL constraints by name, made from the table's when it was
-- created: a fresh install's are message_rows_<column>_not_null. (Before 18 there are none.)
DO $$
DECLARE
    old name;
BEGIN
    FOR old IN SELECT c.conname FROM pg_catalog.pg_constraint c
                WHERE c.conrelid = 'pgqueue.message_rows'::regclass AND c.contype = 'n'
                  AND c.conname LIKE 'messages\_%\_not\_null' LOOP
        EXECUTE pg_catalog.format('ALTER TABLE pgqueue.message_rows RENAME CONSTRAINT %I TO %I', old,
                                  'message_rows' || pg_catalog.substr(old, pg_catalog.length('messages') + 1));
    END LOOP;
END
$$;

CREATE VIEW pgqueue.messages AS
SELECT msg_id, queue, state, priority, attempt, payload, headers, enqueued_at, visible_at, claim_token,
       claimed_at, consumer, lease_expires_at, last_error, session_pid, session_started, dedup_key,
       cancel_requested_at, progress, after, has_dependents, park_key, park_until
  FROM pgqueue.message_rows;
REVOKE ALL ON pgqueue.messages FROM PUBLIC;

COMMENT ON TABLE pgqueue.message_rows IS
    'the rows behind pgqueue.messages: read that view, not this table';
COMMENT ON VIEW pgqueue.messages IS
    'messages waiting (ready, delayed, pending on their parents, or parked until a signal) or claimed; finished ones move to pgqueue.history';

CREATE OR REPLACE FUNCTION pgqueue.pgq_drop_queue(queue text, force boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '5s' AS $$
DECLARE
    in_flight bigint;
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
    IF in_flight > 0 AND NOT force THEN
        RAISE EXCEPTION 'pgqueue: queue "%" has % claimed messages', queue, in_flight
            USING ERRCODE = 'object_in_use',
                  HINT = 'Wait for the consumers to finish, or pass force => true.';
    END IF;
    WITH gone AS (
        DELETE FROM pgqueue.message_rows m WHERE m.queue = pgq_drop_queue.queue
        RETURNING m.msg_id, m.has_dependents, m.after IS NOT NULL AS child
    )
    SELECT array_agg(g.msg_id) FILTER (WHERE g.has_dependents), array_agg(g.msg_id) FILTER (WHERE g.child)
      INTO parents, children FROM gone g;
    -- Children in other queues: their parents were deleted (on_parent_failure applies).
    IF parents IS NOT NULL OR children IS NOT NULL THEN
        PERFORM pgqueue._finish_dependencies(coalesce(parents, '{}'),
            pg_catalog.array_fill('deleted'::text, ARRAY[coalesce(pg_catalog.cardinality(parents), 0)]),
            coalesce(children, '{}'));
    END IF;
    DELETE FROM pgqueue.dedup_keys d WHERE d.queue = pgq_drop_queue.queue;
    DELETE FROM pgqueue.queues q WHERE q.queue = pgq_drop_queue.queue;
    PERFORM pgqueue._reset_queue(queue);  -- at commit; its waiting claims then find it gone
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
    headers jsonb DEFAULT NULL,
    dedup_keys text[] DEFAULT NULL,
    dedup_for interval DEFAULT '0',
    after bigint[] DEFAULT NULL,
    on_parent_failure text DEFAULT 'cancel'
) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    q pgqueue.queues := pgqueue._lock_queue(queue);
    due timestamptz;
    ids bigint[];
    waits boolean;
    failed_parent bigint;
    failed_outcome text;
    st text;
BEGIN
    PERFORM pgqueue._check_payloads(payloads);
    PERFORM pgqueue._check_delay(pgqueue._require(delay, 'delay'), 'delay');
    PERFORM pgqueue._check_priority(priority);
    IF after IS NOT NULL OR on_parent_failure IS DISTINCT FROM 'cancel' THEN
        PERFORM pgqueue._check_after(after, on_parent_failure);
    END IF;
    IF pg_catalog.cardinality(payloads) > 10000 THEN
        PERFORM pgqueue._invalid('payloads', pg_catalog.format(
            '%s messages in one call; at most 10000', pg_catalog.cardinality(payloads)));
    END IF;
    IF dedup_keys IS NOT NULL THEN
        -- Keyed: one send each, in array order (a key repeated in the batch returns the
        -- first one's id).
        IF pg_catalog.cardinality(dedup_keys) <> pg_catalog.cardinality(payloads) THEN
            PERFORM pgqueue._invalid('dedup_keys', pg_catalog.format(
                '%s keys for %s payloads', pg_catalog.cardinality(dedup_keys), pg_catalog.cardinality(payloads)));
        END IF;
        PERFORM pgqueue._check_dedup(k, dedup_for, 'dedup_keys') FROM unnest(dedup_keys) k;
        RETURN QUERY
        SELECT pgqueue.pgq_send(q.queue, u.p, delay, priority, headers, u.k, dedup_for, after, on_parent_failure)
          FROM unnest(payloads, dedup_keys) WITH ORDINALITY AS u(p, k, n) ORDER BY u.n;
        RETURN;
    END IF;
    IF dedup_for IS DISTINCT FROM interval '0' THEN
        PERFORM pgqueue._check_dedup(NULL, dedup_for);
    END IF;
    due := CASE WHEN delay > interval '0' THEN now() + delay END;
    IF pg_catalog.cardinality(after) > 0 AND pg_catalog.cardinality(payloads) > 0 THEN
        -- Every message of the batch waits for all of after.
        SELECT array_agg(pg_catalog.nextval('pgqueue.messages_msg_id_seq')) INTO ids
          FROM pg_catalog.generate_series(1, pg_catalog.cardinality(payloads));
        SELECT * INTO waits, failed_parent, failed_outcome FROM pgqueue._depend(ids, after, on_parent_failure);
        st := CASE WHEN waits THEN 'pending' WHEN due IS NULL THEN 'ready' ELSE 'delayed' END;
        INSERT INTO pgqueue.message_rows (msg_id, queue, state, priority, payload, headers, visible_at, after)
        OVERRIDING SYSTEM VALUE
        SELECT ids[u.n], q.queue, st, priority, p, headers, due, after
          FROM pg_catalog.unnest(payloads) WITH ORDINALITY AS u(p, n);
        PERFORM pgqueue._note(q.queue, pg_catalog.cardinality(ids), NULL, st, priority, ids[1],
                              ids[pg_catalog.cardinality(ids)], due);
        IF failed_parent IS NOT NULL AND on_parent_failure <> 'run' THEN
            PERFORM pgqueue._to_history(ids, NULL, pgqueue._child_outcome(on_parent_failure),
                                        pgqueue._parent_failed(failed_parent, failed_outcome));
        END IF;
        RETURN QUERY SELECT unnest(ids);
        RETURN;
    END IF;
    RETURN QUERY
    WITH sent AS (
        INSERT INTO pgqueue.message_rows (queue, state, priority, payload, headers, visible_at)
        SELECT q.queue, CASE WHEN due IS NULL THEN 'ready' ELSE 'delayed' END, priority, p, headers, due
          FROM pg_catalog.unnest(payloads) WITH ORDINALITY AS u(p, n)
         ORDER BY u.n
        RETURNING message_rows.msg_id
    ), noted AS (
        SELECT pgqueue._note(q.queue, count(*), NULL, CASE WHEN due IS NULL THEN 'ready' ELSE 'delayed' END,
                             priority, min(s.msg_id), max(s.msg_id), due)
          FROM sent s
    )
    SELECT s.msg_id FROM sent s, noted ORDER BY s.msg_id;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.pgq_send(
    queue text,
    payload jsonb,
    delay interval DEFAULT '0',
    priority smallint DEFAULT 0,
    headers jsonb DEFAULT NULL,
    dedup_key text DEFAULT NULL,
    dedup_for interval DEFAULT '0',
    after bigint[] DEFAULT NULL,
    on_parent_failure text DEFAULT 'cancel'
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    q pgqueue.queues := pgqueue._lock_queue(queue);
    due timestamptz;
    id bigint;
    holder bigint;
    linked record;  -- what _depend found
    waits boolean;
    failed_parent bigint;
    failed_outcome text;
    st text;
BEGIN
    PERFORM pgqueue._check_payload(payload);
    PERFORM pgqueue._check_delay(pgqueue._require(delay, 'delay'), 'delay');
    PERFORM pgqueue._check_priority(priority);
    IF after IS NOT NULL OR on_parent_failure IS DISTINCT FROM 'cancel' THEN
        PERFORM pgqueue._check_after(after, on_parent_failure);
    END IF;
    IF dedup_key IS NOT NULL OR dedup_for IS DISTINCT FROM interval '0' THEN
        PERFORM pgqueue._check_dedup(dedup_key, dedup_for);
    END IF;
    IF dedup_key IS NOT NULL THEN
        -- The id is drawn first: the key row names the message that holds it.
        id := pg_catalog.nextval('pgqueue.messages_msg_id_seq');
        holder := pgqueue._take_key(q.queue, dedup_key, id, dedup_for);
        IF holder <> id THEN
            RETURN holder;  -- taken: no second copy
        END IF;
    END IF;
    due := CASE WHEN delay > interval '0' THEN now() + delay END;
    IF pg_catalog.cardinality(after) > 0 THEN
        id := coalesce(id, pg_catalog.nextval('pgqueue.messages_msg_id_seq'));
        -- An assignment, not SELECT … FROM: PL/pgSQL evaluates a lone call without a query.
        linked := pgqueue._depend(ARRAY[id], after, on_parent_failure);
        waits := linked.waits;
        failed_parent := linked.failed_parent;
        failed_outcome := linked.failed_outcome;
    END IF;
    -- With parents not finished yet, pending (delayed or ready when they have completed).
    st := CASE WHEN waits THEN 'pending' WHEN due IS NULL THEN 'ready' ELSE 'delayed' END;
    INSERT INTO pgqueue.message_rows (msg_id, queue, state, priority, payload, headers, visible_at, dedup_key, after)
    OVERRIDING SYSTEM VALUE
    VALUES (coalesce(id, pg_catalog.nextval('pgqueue.messages_msg_id_seq')), q.queue, st, priority, payload,
            headers, due, dedup_key, CASE WHEN waits IS NOT NULL THEN after END)
    RETURNING msg_id INTO id;
    PERFORM pgqueue._note(q.queue, 1, NULL, st, priority, id, id, due);
    IF failed_parent IS NOT NULL AND on_parent_failure <> 'run' THEN
        PERFORM pgqueue._to_history(ARRAY[id], NULL, pgqueue._child_outcome(on_parent_failure),
                                    pgqueue._parent_failed(failed_parent, failed_outcome));
    END IF;
    RETURN id;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue._depend(children bigint[], after bigint[], on_parent_failure text,
                                OUT waits boolean, OUT failed_parent bigint, OUT failed_outcome text)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_variable
DECLARE
    live bigint[];
    gone bigint[];
    unknown bigint;
BEGIN
    -- Marked first, then locked: a lock taken FOR KEY SHARE and then raised by the update
    -- would wait behind a finish that waits for this send (a deadlock). Both in msg_id order.
    UPDATE pgqueue.message_rows m SET has_dependents = true WHERE m.msg_id = ANY (after) AND m.has_dependents IS NOT TRUE;
    WITH locked AS (
        SELECT m.msg_id FROM pgqueue.message_rows m WHERE m.msg_id = ANY (after) ORDER BY m.msg_id FOR KEY SHARE
    ), linked AS (
        INSERT INTO pgqueue.dependencies (parent, child, on_parent_failure)
        SELECT l.msg_id, c, on_parent_failure FROM locked l, pg_catalog.unnest(children) c
    )
    SELECT coalesce(array_agg(l.msg_id), '{}') INTO live FROM locked l;
    IF pg_catalog.cardinality(live) < pg_catalog.cardinality(after) THEN
        SELECT coalesce(array_agg(g.p), '{}') INTO gone
          FROM (SELECT pg_catalog.unnest(after) EXCEPT SELECT pg_catalog.unnest(live)) g(p);
        SELECT h.msg_id, h.outcome INTO failed_parent, failed_outcome
          FROM pgqueue.history h WHERE h.msg_id = ANY (gone) AND h.outcome <> 'completed'
         ORDER BY h.msg_id LIMIT 1;
        SELECT g.p INTO unknown
          FROM (SELECT pg_catalog.unnest(gone) EXCEPT SELECT h.msg_id FROM pgqueue.history h
                 WHERE h.msg_id = ANY (gone)) g(p)
         ORDER BY g.p LIMIT 1;
        IF unknown IS NOT NULL THEN
            RAISE EXCEPTION 'pgqueue: parent message % does not exist', unknown
                USING ERRCODE = 'foreign_key_violation',
                      DETAIL = 'A parent must be sent (and committed) before its children, and not yet pruned.';
        END IF;
    END IF;
    waits := pg_catalog.cardinality(live) > 0;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.pgq_graph(msg_id bigint)
RETURNS TABLE (relation text, id bigint, queue text, state text, on_parent_failure text,
               enqueued_at timestamptz, finished_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    me record;
BEGIN
    SELECT j.msg_id, j.queue, j.state, j.after, j.enqueued_at, j.finished_at INTO me
      FROM (SELECT m.msg_id, m.queue, m.state, m.after, m.enqueued_at, NULL::timestamptz AS finished_at
              FROM pgqueue.message_rows m WHERE m.msg_id = pgqueue._require(msg_id, 'msg_id')
             UNION ALL
            SELECT h.msg_id, h.queue, h.outcome, h.after, h.enqueued_at, h.finished_at
              FROM pgqueue.history h WHERE h.msg_id = msg_id
             LIMIT 1) j;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT 'message', me.msg_id, me.queue, me.state,
           (SELECT d.on_parent_failure FROM pgqueue.dependencies d WHERE d.child = me.msg_id LIMIT 1),
           me.enqueued_at, me.finished_at
     UNION ALL
    (SELECT 'parent', p.id, j.queue, j.state, NULL, j.enqueued_at, j.finished_at
       FROM pg_catalog.unnest(me.after) WITH ORDINALITY AS p(id, n)
       LEFT JOIN LATERAL (
            SELECT m.queue, m.state, m.enqueued_at, NULL::timestamptz AS finished_at
              FROM pgqueue.message_rows m WHERE m.msg_id = p.id
             UNION ALL
            SELECT h.queue, h.outcome, h.enqueued_at, h.finished_at FROM pgqueue.history h WHERE h.msg_id = p.id
             LIMIT 1) j ON true
      ORDER BY p.n)
     UNION ALL
    (SELECT 'child', m.msg_id, m.queue, m.state, d.on_parent_failure, m.enqueued_at, NULL
       FROM pgqueue.dependencies d JOIN pgqueue.message_rows m ON m.msg_id = d.child
      WHERE d.parent = me.msg_id
      ORDER BY m.msg_id);
END
$$;

CREATE OR REPLACE FUNCTION pgqueue._promote_due(queue text, max_rows integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_variable
DECLARE
    epoch bigint := pgqueue._due_epoch(queue);
    promoted bigint;
BEGIN
    WITH due AS (
        SELECT m.msg_id FROM pgqueue.message_rows m
         WHERE m.queue = queue AND m.state = 'delayed' AND m.visible_at <= now()
         ORDER BY m.visible_at
         LIMIT max_rows
           FOR UPDATE SKIP LOCKED
    ), moved AS (
        UPDATE pgqueue.message_rows m SET state = 'ready', visible_at = NULL
          FROM due WHERE m.msg_id = due.msg_id
        RETURNING m.msg_id, m.priority
    )
    SELECT coalesce(sum(n), 0) INTO promoted
      FROM (SELECT count(*) AS n,
                   pgqueue._note(queue, count(*), 'delayed', 'ready', mv.priority, min(mv.msg_id), max(mv.msg_id))
              FROM moved mv GROUP BY mv.priority) p;
    IF promoted < max_rows THEN
        PERFORM pgqueue._due_after(queue, epoch,
            (SELECT min(m.visible_at) FROM pgqueue.message_rows m
              WHERE m.queue = queue AND m.state = 'delayed' AND m.visible_at > now()));
    END IF;
    RETURN promoted;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.pgq_renew(msg_ids bigint[], claim_tokens uuid[], lease interval DEFAULT NULL,
                                  queue text DEFAULT NULL, progress jsonb[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
BEGIN
    IF queue IS NOT NULL THEN
        PERFORM pgqueue._queue(queue);
    END IF;
    PERFORM pgqueue._check_pairs(msg_ids, claim_tokens);
    PERFORM pgqueue._check_lease(lease);
    IF progress IS NOT NULL THEN
        PERFORM pgqueue._check_reports(progress, pg_catalog.cardinality(msg_ids), 'progress');
    END IF;
    -- Only the lease and the progress change, and neither is in an index: a HOT update.
    -- The re-arm pass learns the earliest new lease end at commit (a lease may get shorter).
    RETURN QUERY
    WITH renewed AS (
        UPDATE pgqueue.message_rows m
           SET lease_expires_at = now() + coalesce(lease, q.lease),
               progress = coalesce(held.progress, m.progress)
          FROM unnest(msg_ids, claim_tokens, progress) AS held(id, token, progress), pgqueue.queues q
         WHERE m.msg_id = held.id AND m.claim_token = held.token AND m.state = 'claimed'
           AND m.cancel_requested_at IS NULL
           AND q.queue = m.queue AND (queue IS NULL OR m.queue = queue)
        RETURNING m.msg_id, m.lease_expires_at
    ), noted AS (
        SELECT pgqueue._renewed(min(r.lease_expires_at)) FROM renewed r
    )
    SELECT r.msg_id FROM renewed r, noted;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.pgq_nack(
    msg_id bigint,
    claim_token uuid,
    retry_in interval DEFAULT NULL,
    error text DEFAULT NULL,
    queue text DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    h record;
    wait interval;
BEGIN
    IF queue IS NOT NULL THEN
        PERFORM pgqueue._queue(queue);
    END IF;
    PERFORM pgqueue._require(msg_id, 'msg_id');
    PERFORM pgqueue._require(claim_token, 'claim_token');
    PERFORM pgqueue._check_delay(retry_in, 'retry_in');
    SELECT m.msg_id, m.queue, m.priority, m.attempt, q.max_attempts, m.cancel_requested_at INTO h
      FROM pgqueue.message_rows m JOIN pgqueue.queues q ON q.queue = m.queue
     WHERE m.msg_id = msg_id AND m.claim_token = claim_token AND m.state = 'claimed'
       AND (queue IS NULL OR m.queue = queue)
       FOR UPDATE OF m;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- A message whose cancel was requested is not retried (_to_history records it cancelled).
    IF h.attempt >= h.max_attempts OR h.cancel_requested_at IS NOT NULL THEN
        PERFORM pgqueue._to_history(ARRAY[msg_id], NULL, 'dead', coalesce(error, 'nacked on the last attempt'));
        RETURN true;
    END IF;
    wait := coalesce(retry_in, pgqueue._backoff(h.attempt));
    UPDATE pgqueue.message_rows m
       SET state = CASE WHEN wait > interval '0' THEN 'delayed' ELSE 'ready' END,
           visible_at = CASE WHEN wait > interval '0' THEN now() + wait END,
           claim_token = NULL, claimed_at = NULL, lease_expires_at = NULL, consumer = NULL,
           session_pid = NULL, session_started = NULL, last_error = coalesce(error, m.last_error)
     WHERE m.msg_id = h.msg_id;
    PERFORM pgqueue._note(h.queue, 1, 'claimed', CASE WHEN wait > interval '0' THEN 'delayed' ELSE 'ready' END,
                          h.priority, h.msg_id, h.msg_id, now() + wait);
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.pgq_cancel(msg_ids bigint[], reason text DEFAULT NULL, queue text DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    waiting bigint[];
    running bigint[];
BEGIN
    IF queue IS NOT NULL THEN
        PERFORM pgqueue._queue(queue);
    END IF;
    PERFORM pgqueue._check_ids(msg_ids, 'msg_ids');
    -- Locked in msg_id order (overlapping cancels cannot deadlock), after any claim or finish
    -- under way: its outcome decides what is left to cancel.
    SELECT coalesce(array_agg(l.msg_id) FILTER (WHERE l.state <> 'claimed'), '{}'),
           coalesce(array_agg(l.msg_id) FILTER (WHERE l.state = 'claimed' AND l.cancel_requested_at IS NULL), '{}')
      INTO waiting, running
      FROM (SELECT m.msg_id, m.state, m.cancel_requested_at FROM pgqueue.message_rows m
             WHERE m.msg_id = ANY (msg_ids) AND (queue IS NULL OR m.queue = queue)
             ORDER BY m.msg_id
               FOR UPDATE) l;
    UPDATE pgqueue.message_rows m SET cancel_requested_at = now(), last_error = coalesce(reason, m.last_error)
     WHERE m.msg_id = ANY (running);
    RETURN QUERY
    SELECT c.id FROM (SELECT pgqueue._to_history(waiting, NULL, 'cancelled', reason) AS id
                      UNION ALL SELECT unnest(running)) c
     ORDER BY c.id;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue._rearm_batch(after_msg_id bigint, max_rows integer, queue text DEFAULT NULL)
RETURNS TABLE (rearmed bigint, dead_lettered bigint, last_msg_id bigint, more boolean, first_msg_id bigint,
               next_expiry timestamptz)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET jit = off AS $$
#variable_conflict use_variable
DECLARE
    retry bigint[];
    exhausted bigint[];
    cancelled bigint[];
    window_end bigint;
    window_full boolean;
BEGIN
    SELECT min(w.msg_id), max(w.msg_id), count(*) >= 4 * max_rows, min(w.lease_expires_at)
      INTO first_msg_id, window_end, window_full, next_expiry
      FROM (SELECT m.msg_id, m.lease_expires_at FROM pgqueue.message_rows m
             WHERE m.state = 'claimed' AND m.msg_id > after_msg_id
             ORDER BY m.msg_id LIMIT 4 * max_rows) w;
    SELECT coalesce(array_agg(e.msg_id) FILTER (WHERE NOT e.cancel AND e.attempt < e.max_attempts), '{}'),
           coalesce(array_agg(e.msg_id) FILTER (WHERE NOT e.cancel AND e.attempt >= e.max_attempts), '{}'),
           coalesce(array_agg(e.msg_id) FILTER (WHERE e.cancel), '{}'),
           CASE WHEN count(*) >= max_rows THEN max(e.msg_id) ELSE window_end END,
           count(*) >= max_rows OR window_full
      INTO retry, exhausted, cancelled, last_msg_id, more
      FROM (SELECT m.msg_id, m.attempt, q.max_attempts, m.cancel_requested_at IS NOT NULL AS cancel
              FROM pgqueue.message_rows m JOIN pgqueue.queues q ON q.queue = m.queue
             WHERE m.state = 'claimed' AND m.msg_id > after_msg_id AND m.msg_id <= window_end
               AND m.lease_expires_at <= now()
               AND (queue IS NULL OR m.queue = queue)
             ORDER BY m.msg_id
             LIMIT max_rows
               FOR UPDATE OF m SKIP LOCKED) e;
    WITH back AS (
        UPDATE pgqueue.message_rows m
           SET state = 'ready', claim_token = NULL, claimed_at = NULL, lease_expires_at = NULL,
               consumer = NULL, session_pid = NULL, session_started = NULL, last_error = 'lease expired'
         WHERE m.msg_id = ANY (retry)
        RETURNING m.queue, m.priority, m.msg_id
    )
    SELECT coalesce(sum(n), 0) INTO rearmed
      FROM (SELECT count(*) AS n, pgqueue._note(b.queue, count(*), 'claimed', 'ready', b.priority,
                                                min(b.msg_id), max(b.msg_id))
              FROM back b GROUP BY b.queue, b.priority) r;
    dead_lettered := (SELECT count(*) FROM pgqueue._to_history(
        exhausted, NULL, 'dead', 'lease expired on the last attempt'));
    -- Cancel requested and the holder gone: finished as cancelled, not retried.
    PERFORM pgqueue._to_history(cancelled, NULL, 'cancelled', NULL);
    RETURN NEXT;
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
        DELETE FROM pgqueue.history h
         WHERE h.queue = q.queue AND h.outcome = 'dead'
           AND (msg_ids IS NULL OR h.msg_id = ANY (msg_ids))
        RETURNING h.msg_id, h.priority, h.payload, h.headers, h.enqueued_at, h.last_error, h.progress
    )
    , again AS (
        INSERT INTO pgqueue.message_rows (msg_id, queue, state, priority, payload, headers, enqueued_at, last_error,
                                      progress)
        OVERRIDING SYSTEM VALUE
        SELECT b.msg_id, q.queue, 'ready', b.priority, b.payload, b.headers, b.enqueued_at, b.last_error, b.progress
          FROM back b
        RETURNING message_rows.msg_id, message_rows.priority
    )
    SELECT coalesce(sum(n), 0) INTO moved
      FROM (SELECT count(*) AS n, pgqueue._note(q.queue, count(*), 'history', 'ready', a.priority,
                                                min(a.msg_id), max(a.msg_id))
              FROM again a GROUP BY a.priority) r;
    RETURN moved;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.pgq_result(msg_id bigint, wait interval DEFAULT '0', queue text DEFAULT NULL)
RETURNS TABLE (
    state text,
    attempt integer,
    result jsonb,
    progress jsonb,
    last_error text,
    enqueued_at timestamptz,
    finished_at timestamptz
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
BEGIN
    IF queue IS NOT NULL THEN
        PERFORM pgqueue._queue(queue);
    END IF;
    PERFORM pgqueue._require(msg_id, 'msg_id');
    IF pgqueue._check_wait(wait, 'pgq_result') > interval '0' THEN
        PERFORM pgqueue._await_outcome(msg_id, wait, queue);
    END IF;
    RETURN QUERY
    SELECT m.state, m.attempt, NULL::jsonb, m.progress, m.last_error, m.enqueued_at, NULL::timestamptz
      FROM pgqueue.message_rows m WHERE m.msg_id = msg_id AND (queue IS NULL OR m.queue = queue)
     UNION ALL
    SELECT h.outcome, h.attempt, h.result, h.progress, h.last_error, h.enqueued_at, h.finished_at
      FROM pgqueue.history h WHERE h.msg_id = msg_id AND (queue IS NULL OR h.queue = queue)
     LIMIT 1;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.pgq_park(
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
      FROM pgqueue.message_rows m
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
    UPDATE pgqueue.message_rows m
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

CREATE OR REPLACE FUNCTION pgqueue.pgq_signal(key text, payload jsonb DEFAULT NULL, keep interval DEFAULT '1 day')
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
        SELECT m.msg_id FROM pgqueue.message_rows m WHERE m.park_key = key AND m.state = 'parked'
         ORDER BY m.msg_id
           FOR UPDATE
    ), back AS (
        UPDATE pgqueue.message_rows m
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

CREATE OR REPLACE FUNCTION pgqueue._expire_parks(max_rows integer) RETURNS bigint
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
              FROM pgqueue.message_rows m
             WHERE m.state = 'parked' AND m.park_until <= now()
             ORDER BY m.park_until
             LIMIT max_rows
               FOR UPDATE SKIP LOCKED) e;
    WITH back AS (
        UPDATE pgqueue.message_rows m
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

CREATE OR REPLACE FUNCTION pgqueue._collect_park_keys(max_rows integer) RETURNS bigint
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
       AND NOT EXISTS (SELECT FROM pgqueue.message_rows m WHERE m.park_key = k.key AND m.state = 'parked');
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue._fire(s pgqueue.schedules, slot timestamptz, missed_runs bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    at text := pg_catalog.to_char(slot AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"');
    key text := 'schedule:' || s.name || '@' || at;
    id bigint;
BEGIN
    id := pgqueue.pgq_send(s.queue, s.payload, priority => s.priority,
        headers => coalesce(s.headers, '{}') || jsonb_build_object('schedule', s.name, 'scheduled_for', at)
                   || CASE WHEN missed_runs IS NULL THEN '{}' ELSE jsonb_build_object('missed_runs', missed_runs) END,
        dedup_key => key);
    IF NOT EXISTS (SELECT FROM pgqueue.message_rows m
                    WHERE m.msg_id = id AND m.dedup_key = key AND m.headers ->> 'schedule' = s.name) THEN
        RAISE EXCEPTION 'pgqueue: the key % of this run is held by message %, not a run of this schedule', key, id
            USING ERRCODE = 'unique_violation';
    END IF;
    RETURN id;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue._claimable(queue text, priorities smallint[])
RETURNS TABLE (priority smallint, msg_id bigint, due timestamptz, busy boolean)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    p smallint;
    above integer := 1001;  -- priorities are between -1000 and 1000
    below integer;
    listed smallint[] := ARRAY(SELECT l FROM unnest(priorities) l ORDER BY l DESC);
    i integer := 1;
BEGIN
    due := NULL;
    LOOP
        below := CASE WHEN i <= cardinality(listed) THEN listed[i] ELSE -1001 END;
        -- Unlisted priorities strictly between `above` and `below`, highest first.
        LOOP
            SELECT m.priority, m.msg_id, m.xmax <> '0' INTO priority, msg_id, busy FROM pgqueue.message_rows m
             WHERE m.queue = queue AND m.state = 'ready' AND m.priority < above AND m.priority > below
             ORDER BY m.priority DESC, m.msg_id LIMIT 1;
            EXIT WHEN NOT FOUND;
            RETURN NEXT;
            above := priority;
        END LOOP;
        EXIT WHEN i > cardinality(listed);
        p := listed[i];
        SELECT m.msg_id, m.xmax <> '0' INTO msg_id, busy FROM pgqueue.message_rows m
         WHERE m.queue = queue AND m.state = 'ready' AND m.priority = p
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
