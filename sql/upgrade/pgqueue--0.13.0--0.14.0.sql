-- pgqueue 0.13.0 -> 0.14.0.
--
-- Queue-qualified forms of pgq_ack, pgq_nack, pgq_fail and pgq_renew: the queue first, then
-- the same arguments as before (the current forms stay as they are). pgq_nack's and
-- pgq_renew's work moves into pgqueue._nack and pgqueue._renew, which both forms call.
-- No locks on queue data. The new C function needs the 0.14.0 library: install, restart, update.

-- The same for the messages of one queue: a message of another queue does not move, as with a
-- stale token (the queue-qualified pgq_ack and pgq_fail).
CREATE FUNCTION pgqueue._to_history(msg_ids bigint[], claim_tokens uuid[], outcome text, error text, queue text)
RETURNS SETOF bigint
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', '_to_history_in_wrapper';

-- pgq_nack's work, on a message of `queue` (NULL: of any queue).
CREATE FUNCTION pgqueue._nack(queue text, msg_id bigint, claim_token uuid, retry_in interval, error text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_variable
DECLARE
    h record;
    wait interval;
BEGIN
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

CREATE OR REPLACE FUNCTION pgqueue.pgq_nack(
    msg_id bigint,
    claim_token uuid,
    retry_in interval DEFAULT NULL,
    error text DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN pgqueue._nack(NULL, msg_id, claim_token, retry_in, error);
END
$$;

-- pgq_renew's work, on messages of `queue` (NULL: of any queue).
CREATE FUNCTION pgqueue._renew(queue text, msg_ids bigint[], claim_tokens uuid[], lease interval)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_variable
BEGIN
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

CREATE OR REPLACE FUNCTION pgqueue.pgq_renew(msg_ids bigint[], claim_tokens uuid[], lease interval DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY SELECT pgqueue._renew(NULL, msg_ids, claim_tokens, lease);
END
$$;

-- The queue-qualified forms of pgq_ack, pgq_nack and pgq_fail (pgq_renew's are in
-- claim.sql): the same arguments after the queue. The queue must exist (42704); a message of
-- another queue is not finished, as with a stale token. With the queue in every call, a
-- sharded deployment can route each to the node of its queue (docs/design/citus.md).
CREATE FUNCTION pgqueue.pgq_ack(queue text, msg_ids bigint[], claim_tokens uuid[]) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
BEGIN
    PERFORM pgqueue._queue(queue);
    PERFORM pgqueue._check_pairs(msg_ids, claim_tokens);
    RETURN QUERY SELECT pgqueue._to_history(msg_ids, claim_tokens, 'completed', NULL, queue);
END
$$;

CREATE FUNCTION pgqueue.pgq_ack(queue text, msg_id bigint, claim_token uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
BEGIN
    PERFORM pgqueue._queue(queue);
    RETURN EXISTS (SELECT FROM pgqueue._to_history(ARRAY[pgqueue._require(msg_id, 'msg_id')],
                                                   ARRAY[pgqueue._require(claim_token, 'claim_token')],
                                                   'completed', NULL, queue));
END
$$;

CREATE FUNCTION pgqueue.pgq_nack(
    queue text,
    msg_id bigint,
    claim_token uuid,
    retry_in interval DEFAULT NULL,
    error text DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgqueue._queue(queue);
    RETURN pgqueue._nack(queue, msg_id, claim_token, retry_in, error);
END
$$;

CREATE FUNCTION pgqueue.pgq_fail(queue text, msg_id bigint, claim_token uuid, error text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
BEGIN
    PERFORM pgqueue._queue(queue);
    RETURN EXISTS (SELECT FROM pgqueue._to_history(ARRAY[pgqueue._require(msg_id, 'msg_id')],
                                                   ARRAY[pgqueue._require(claim_token, 'claim_token')],
                                                   'dead', coalesce(error, 'failed by the consumer'), queue));
END
$$;

-- The queue-qualified forms (as pgq_ack's in finish.sql): the queue must exist, and a message
-- of another queue is not renewed, as with a stale token.
CREATE FUNCTION pgqueue.pgq_renew(queue text, msg_ids bigint[], claim_tokens uuid[], lease interval DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgqueue._queue(queue);
    RETURN QUERY SELECT pgqueue._renew(queue, msg_ids, claim_tokens, lease);
END
$$;

CREATE FUNCTION pgqueue.pgq_renew(queue text, msg_id bigint, claim_token uuid, lease interval DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgqueue._queue(queue);
    RETURN EXISTS (
        SELECT FROM pgqueue._renew(queue, ARRAY[pgqueue._require(msg_id, 'msg_id')],
                                   ARRAY[pgqueue._require(claim_token, 'claim_token')], lease));
END
$$;

-- New functions are executable by PUBLIC until revoked (privileges.sql does it for a fresh
-- install).
REVOKE ALL ON FUNCTION
    pgqueue._to_history(bigint[], uuid[], text, text, text),
    pgqueue._nack(text, bigint, uuid, interval, text),
    pgqueue._renew(text, bigint[], uuid[], interval),
    pgqueue.pgq_renew(text, bigint, uuid, interval),
    pgqueue.pgq_renew(text, bigint[], uuid[], interval),
    pgqueue.pgq_ack(text, bigint, uuid),
    pgqueue.pgq_ack(text, bigint[], uuid[]),
    pgqueue.pgq_nack(text, bigint, uuid, interval, text),
    pgqueue.pgq_fail(text, bigint, uuid, text)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    pgqueue.pgq_renew(text, bigint, uuid, interval),
    pgqueue.pgq_renew(text, bigint[], uuid[], interval),
    pgqueue.pgq_ack(text, bigint, uuid),
    pgqueue.pgq_ack(text, bigint[], uuid[]),
    pgqueue.pgq_nack(text, bigint, uuid, interval, text),
    pgqueue.pgq_fail(text, bigint, uuid, text)
TO pgqueue_consumer;

COMMENT ON FUNCTION pgqueue.pgq_ack(text, bigint, uuid) IS
    'complete a claimed message of the queue; false if the claim was lost or the message is another queue''s';
COMMENT ON FUNCTION pgqueue.pgq_ack(text, bigint[], uuid[]) IS
    'complete claimed messages of the queue; returns the ids completed';
COMMENT ON FUNCTION pgqueue.pgq_nack(text, bigint, uuid, interval, text) IS
    'give a claimed message of the queue back for a retry later, or dead-letter it on its last attempt';
COMMENT ON FUNCTION pgqueue.pgq_fail(text, bigint, uuid, text) IS
    'dead-letter a claimed message of the queue now';
COMMENT ON FUNCTION pgqueue.pgq_renew(text, bigint, uuid, interval) IS
    'extend the lease of a claim still held on a message of the queue; false if the claim was lost';
COMMENT ON FUNCTION pgqueue.pgq_renew(text, bigint[], uuid[], interval) IS
    'extend the leases of claims still held on messages of the queue; returns their ids';
