-- pgqueue 0.13.0 -> 0.14.0.
--
-- pgq_ack, pgq_nack, pgq_fail and pgq_renew (single and batch) take the message's queue as a
-- new last argument, `queue text DEFAULT NULL`: given, the queue must exist and only its
-- messages are acted on. Every call that worked before resolves and behaves as before. A
-- function cannot gain an argument in place: each is dropped and created again, with its
-- grant and comment.
-- No locks on queue data. The new C function needs the 0.14.0 library: install, restart, update.

-- The same, with a queue: only its messages move; one of another queue is left, as with a
-- stale token. NULL: any queue's.
CREATE FUNCTION pgqueue._to_history(msg_ids bigint[], claim_tokens uuid[], outcome text, error text, queue text)
RETURNS SETOF bigint
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', '_to_history_in_wrapper';

DROP FUNCTION pgqueue.pgq_ack(bigint[], uuid[]);
DROP FUNCTION pgqueue.pgq_ack(bigint, uuid);
DROP FUNCTION pgqueue.pgq_nack(bigint, uuid, interval, text);
DROP FUNCTION pgqueue.pgq_fail(bigint, uuid, text);
DROP FUNCTION pgqueue.pgq_renew(bigint, uuid, interval);
DROP FUNCTION pgqueue.pgq_renew(bigint[], uuid[], interval);

CREATE FUNCTION pgqueue.pgq_ack(msg_ids bigint[], claim_tokens uuid[], queue text DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
BEGIN
    IF queue IS NOT NULL THEN
        PERFORM pgqueue._queue(queue);
    END IF;
    PERFORM pgqueue._check_pairs(msg_ids, claim_tokens);
    RETURN QUERY SELECT pgqueue._to_history(msg_ids, claim_tokens, 'completed', NULL, queue);
END
$$;

CREATE FUNCTION pgqueue.pgq_ack(msg_id bigint, claim_token uuid, queue text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
BEGIN
    IF queue IS NOT NULL THEN
        PERFORM pgqueue._queue(queue);
    END IF;
    IF msg_id IS NULL OR claim_token IS NULL THEN
        PERFORM pgqueue._require(msg_id, 'msg_id');
        PERFORM pgqueue._require(claim_token, 'claim_token');
    END IF;
    RETURN EXISTS (SELECT FROM pgqueue._to_history(ARRAY[msg_id], ARRAY[claim_token], 'completed', NULL, queue));
END
$$;

CREATE FUNCTION pgqueue.pgq_nack(
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
    SELECT m.msg_id, m.queue, m.priority, m.attempt, q.max_attempts INTO h
      FROM pgqueue.messages m JOIN pgqueue.queues q ON q.queue = m.queue
     WHERE m.msg_id = msg_id AND m.claim_token = claim_token AND m.state = 'claimed'
       AND (queue IS NULL OR m.queue = queue)
       FOR UPDATE OF m;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF h.attempt >= h.max_attempts THEN
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

CREATE FUNCTION pgqueue.pgq_fail(msg_id bigint, claim_token uuid, error text DEFAULT NULL, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
BEGIN
    IF queue IS NOT NULL THEN
        PERFORM pgqueue._queue(queue);
    END IF;
    RETURN EXISTS (
        SELECT FROM pgqueue._to_history(ARRAY[pgqueue._require(msg_id, 'msg_id')],
                                        ARRAY[pgqueue._require(claim_token, 'claim_token')],
                                        'dead', coalesce(error, 'failed by the consumer'), queue));
END
$$;

CREATE FUNCTION pgqueue.pgq_renew(msg_ids bigint[], claim_tokens uuid[], lease interval DEFAULT NULL,
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
           AND q.queue = m.queue AND (queue IS NULL OR m.queue = queue)
        RETURNING m.msg_id, m.lease_expires_at
    ), noted AS (
        SELECT pgqueue._renewed(min(r.lease_expires_at)) FROM renewed r
    )
    SELECT r.msg_id FROM renewed r, noted;
END
$$;

CREATE FUNCTION pgqueue.pgq_renew(msg_id bigint, claim_token uuid, lease interval DEFAULT NULL,
                                  queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
BEGIN
    IF queue IS NOT NULL THEN
        PERFORM pgqueue._queue(queue);
    END IF;
    RETURN EXISTS (
        SELECT FROM pgqueue.pgq_renew(ARRAY[pgqueue._require(msg_id, 'msg_id')],
                                      ARRAY[pgqueue._require(claim_token, 'claim_token')], lease, queue));
END
$$;

-- A new function is executable by PUBLIC until revoked (privileges.sql does it for a fresh
-- install).
REVOKE ALL ON FUNCTION
    pgqueue._to_history(bigint[], uuid[], text, text, text),
    pgqueue.pgq_renew(bigint, uuid, interval, text),
    pgqueue.pgq_renew(bigint[], uuid[], interval, text),
    pgqueue.pgq_ack(bigint, uuid, text),
    pgqueue.pgq_ack(bigint[], uuid[], text),
    pgqueue.pgq_nack(bigint, uuid, interval, text, text),
    pgqueue.pgq_fail(bigint, uuid, text, text)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    pgqueue.pgq_renew(bigint, uuid, interval, text),
    pgqueue.pgq_renew(bigint[], uuid[], interval, text),
    pgqueue.pgq_ack(bigint, uuid, text),
    pgqueue.pgq_ack(bigint[], uuid[], text),
    pgqueue.pgq_nack(bigint, uuid, interval, text, text),
    pgqueue.pgq_fail(bigint, uuid, text, text)
TO pgqueue_consumer;

COMMENT ON FUNCTION pgqueue.pgq_ack(bigint, uuid, text) IS
    'complete a claimed message (of queue, if given); false if the claim was lost';
COMMENT ON FUNCTION pgqueue.pgq_ack(bigint[], uuid[], text) IS
    'complete claimed messages (of queue, if given); returns the ids completed';
COMMENT ON FUNCTION pgqueue.pgq_nack(bigint, uuid, interval, text, text) IS
    'give a claimed message (of queue, if given) back for a retry later, or dead-letter it on its last attempt';
COMMENT ON FUNCTION pgqueue.pgq_fail(bigint, uuid, text, text) IS
    'dead-letter a claimed message (of queue, if given) now';
COMMENT ON FUNCTION pgqueue.pgq_renew(bigint, uuid, interval, text) IS
    'extend the lease of a claim still held (on a message of queue, if given); false if the claim was lost';
COMMENT ON FUNCTION pgqueue.pgq_renew(bigint[], uuid[], interval, text) IS
    'extend the leases of claims still held (on messages of queue, if given); returns their ids';
