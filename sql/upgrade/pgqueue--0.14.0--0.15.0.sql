-- pgqueue 0.14.0 -> 0.15.0.
--
-- Cancel: pgq_cancel (by msg_ids or one msg_id) and pgq_cancel_key (by unique key). A waiting
-- message moves to history as 'cancelled' at once; a claimed one gets cancel_requested_at:
-- its renewals are refused and whatever finishes it (ack, nack, fail, lease end) records it
-- as cancelled. The history's outcome constraint
-- gains 'cancelled'.
-- Locks on queue data: ALTER TABLE takes ACCESS EXCLUSIVE on pgqueue.messages (a new column,
-- no rewrite, and a check that reads the table once) and on pgqueue.history and its
-- partitions (the outcome check, which reads every history row once), until the update
-- commits: sends, claims and acks wait for it meanwhile.
-- The library's changes run the 0.14.0 SQL as before: install, restart, update.

ALTER TABLE pgqueue.messages
    ADD COLUMN cancel_requested_at timestamptz,
    ADD CONSTRAINT messages_cancel_only_when_claimed CHECK (cancel_requested_at IS NULL OR state = 'claimed');

ALTER TABLE pgqueue.history
    DROP CONSTRAINT history_outcome_check,
    ADD CONSTRAINT history_outcome_check CHECK (outcome IN ('completed', 'dead', 'cancelled'));

-- A list of msg_ids: not NULL, one-dimensional, no NULL in it (22004, 22023).
CREATE FUNCTION pgqueue._check_ids(msg_ids bigint[], argument text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM pgqueue._require(msg_ids, argument);
    IF pg_catalog.array_ndims(msg_ids) > 1 THEN
        PERFORM pgqueue._invalid(argument, 'a one-dimensional array is expected');
    END IF;
    IF pg_catalog.array_position(msg_ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'pgqueue: % must not contain NULL', argument USING ERRCODE = 'null_value_not_allowed';
    END IF;
END
$$;

-- Renewals leave out a claim whose cancel was requested: its holder is to stop.
CREATE OR REPLACE FUNCTION pgqueue.pgq_renew(msg_ids bigint[], claim_tokens uuid[], lease interval DEFAULT NULL,
                                  queue text DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
BEGIN
    IF queue IS NOT NULL THEN
        PERFORM pgqueue._queue(queue);
    END IF;
    PERFORM pgqueue._check_pairs(msg_ids, claim_tokens);
    PERFORM pgqueue._check_lease(lease);
    -- Only the lease changes, and it is in no index: a HOT update.
    -- The re-arm pass learns the earliest new lease end at commit (a lease may get shorter).
    RETURN QUERY
    WITH renewed AS (
        UPDATE pgqueue.messages m
           SET lease_expires_at = now() + coalesce(lease, q.lease)
          FROM unnest(msg_ids, claim_tokens) AS held(id, token), pgqueue.queues q
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

-- A nack of a claim whose cancel was requested does not retry it: like any finish of it, it
-- records it as cancelled (the library's _to_history decides the outcome).
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
      FROM pgqueue.messages m JOIN pgqueue.queues q ON q.queue = m.queue
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
    UPDATE pgqueue.messages m
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

-- A claim whose cancel was requested and whose lease ends is finished as cancelled, not re-armed.
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
      FROM (SELECT m.msg_id, m.lease_expires_at FROM pgqueue.messages m
             WHERE m.state = 'claimed' AND m.msg_id > after_msg_id
             ORDER BY m.msg_id LIMIT 4 * max_rows) w;
    SELECT coalesce(array_agg(e.msg_id) FILTER (WHERE NOT e.cancel AND e.attempt < e.max_attempts), '{}'),
           coalesce(array_agg(e.msg_id) FILTER (WHERE NOT e.cancel AND e.attempt >= e.max_attempts), '{}'),
           coalesce(array_agg(e.msg_id) FILTER (WHERE e.cancel), '{}'),
           CASE WHEN count(*) >= max_rows THEN max(e.msg_id) ELSE window_end END,
           count(*) >= max_rows OR window_full
      INTO retry, exhausted, cancelled, last_msg_id, more
      FROM (SELECT m.msg_id, m.attempt, q.max_attempts, m.cancel_requested_at IS NOT NULL AS cancel
              FROM pgqueue.messages m JOIN pgqueue.queues q ON q.queue = m.queue
             WHERE m.state = 'claimed' AND m.msg_id > after_msg_id AND m.msg_id <= window_end
               AND m.lease_expires_at <= now()
               AND (queue IS NULL OR m.queue = queue)
             ORDER BY m.msg_id
             LIMIT max_rows
               FOR UPDATE OF m SKIP LOCKED) e;
    WITH back AS (
        UPDATE pgqueue.messages m
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

CREATE FUNCTION pgqueue.pgq_cancel(msg_ids bigint[], reason text DEFAULT NULL, queue text DEFAULT NULL)
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
      FROM (SELECT m.msg_id, m.state, m.cancel_requested_at FROM pgqueue.messages m
             WHERE m.msg_id = ANY (msg_ids) AND (queue IS NULL OR m.queue = queue)
             ORDER BY m.msg_id
               FOR UPDATE) l;
    UPDATE pgqueue.messages m SET cancel_requested_at = now(), last_error = coalesce(reason, m.last_error)
     WHERE m.msg_id = ANY (running);
    RETURN QUERY
    SELECT c.id FROM (SELECT pgqueue._to_history(waiting, NULL, 'cancelled', reason) AS id
                      UNION ALL SELECT unnest(running)) c
     ORDER BY c.id;
END
$$;

CREATE FUNCTION pgqueue.pgq_cancel(msg_id bigint, reason text DEFAULT NULL, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
BEGIN
    RETURN EXISTS (SELECT FROM pgqueue.pgq_cancel(ARRAY[pgqueue._require(msg_id, 'msg_id')], reason, queue));
END
$$;

CREATE FUNCTION pgqueue.pgq_cancel_key(queue text, dedup_key text, reason text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    q pgqueue.queues := pgqueue._queue(queue);
    holder bigint;
BEGIN
    SELECT d.msg_id INTO holder FROM pgqueue.dedup_keys d
     WHERE d.queue = q.queue AND d.dedup_key = pgqueue._require(dedup_key, 'dedup_key') AND d.expires_at IS NULL;
    IF holder IS NULL THEN
        RETURN false;
    END IF;
    RETURN pgqueue.pgq_cancel(holder, reason, q.queue);
END
$$;

REVOKE ALL ON FUNCTION pgqueue._check_ids(bigint[], text), pgqueue.pgq_cancel(bigint[], text, text),
    pgqueue.pgq_cancel(bigint, text, text), pgqueue.pgq_cancel_key(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    pgqueue.pgq_cancel(bigint[], text, text),
    pgqueue.pgq_cancel(bigint, text, text),
    pgqueue.pgq_cancel_key(text, text, text)
TO pgqueue_producer;

COMMENT ON FUNCTION pgqueue.pgq_cancel(bigint[], text, text) IS
    'cancel messages: waiting ones at once, claimed ones when their holder stops; returns the ids cancelled or marked';
COMMENT ON FUNCTION pgqueue.pgq_cancel(bigint, text, text) IS
    'cancel a message: at once if waiting, when its holder stops if claimed; false if nothing changed';
COMMENT ON FUNCTION pgqueue.pgq_cancel_key(text, text, text) IS
    'cancel the message that holds a queue''s unique key, as pgq_cancel; false if none holds it';
