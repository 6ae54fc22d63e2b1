-- Consumers: claim with a lease, renew it. Every claim gets a new claim_token; only the
-- holder of the current token can renew, ack, nack or fail the message (fencing).

-- Turns delayed messages whose time has come into claimable ones, oldest due first. Walks
-- the delayed index only up to the first row not yet due. Used by pgq_claim (so delays
-- never depend on the worker) and by the worker's tick.
CREATE FUNCTION pgqueue._promote_due(queue text, max_rows integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_variable
DECLARE
    promoted bigint;
BEGIN
    WITH due AS (
        SELECT m.msg_id FROM pgqueue.messages m
         WHERE m.queue = queue AND m.state = 'delayed' AND m.visible_at <= now()
         ORDER BY m.visible_at
         LIMIT max_rows
           FOR UPDATE SKIP LOCKED
    )
    UPDATE pgqueue.messages m SET state = 'ready', visible_at = NULL
      FROM due WHERE m.msg_id = due.msg_id;
    GET DIAGNOSTICS promoted = ROW_COUNT;
    RETURN promoted;
END
$$;

CREATE FUNCTION pgqueue.pgq_claim(
    queue text,
    qty integer DEFAULT 1,
    lease interval DEFAULT NULL,
    consumer text DEFAULT NULL,
    session_bound boolean DEFAULT false
) RETURNS TABLE (
    msg_id bigint,
    claim_token uuid,
    attempt integer,
    priority smallint,
    payload jsonb,
    headers jsonb,
    enqueued_at timestamptz,
    lease_expires_at timestamptz
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queues;
    granted interval;
    bound_pid integer;
    bound_start timestamptz;
BEGIN
    -- The checks call their helpers (which raise) only when something is wrong: the claim is
    -- the hottest path, and a function call per check costs more than the claim's own query.
    SELECT * INTO q FROM pgqueue.queues qs WHERE qs.queue = pgq_claim.queue;
    IF NOT FOUND THEN
        q := pgqueue._queue(pgq_claim.queue);
    END IF;
    IF pgq_claim.qty IS NULL OR pgq_claim.qty NOT BETWEEN 1 AND 1000 THEN
        PERFORM pgqueue._invalid('qty', pg_catalog.format('%s is not between 1 and 1000',
                                                            pgqueue._require(pgq_claim.qty, 'qty')));
    END IF;
    IF pgq_claim.lease IS NOT NULL THEN
        PERFORM pgqueue._check_lease(pgq_claim.lease);
    END IF;
    granted := coalesce(pgq_claim.lease, q.lease);
    IF pgq_claim.session_bound IS NULL THEN
        PERFORM pgqueue._require(pgq_claim.session_bound, 'session_bound');
    ELSIF pgq_claim.session_bound THEN
        bound_pid := pg_backend_pid();
        SELECT a.backend_start INTO bound_start FROM pg_stat_get_activity(bound_pid) a;
    END IF;
    IF q.paused THEN
        RETURN;
    END IF;
    PERFORM pgqueue._promote_due(q.queue, 1000);
    RETURN QUERY
    WITH picked AS (
        SELECT m.msg_id FROM pgqueue.messages m
         WHERE m.queue = q.queue AND m.state = 'ready'
         ORDER BY m.priority DESC, m.msg_id
         LIMIT pgq_claim.qty
           FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE pgqueue.messages m
           SET state = 'claimed', claim_token = gen_random_uuid(), attempt = m.attempt + 1,
               claimed_at = now(), lease_expires_at = now() + granted, consumer = pgq_claim.consumer,
               session_pid = bound_pid, session_started = bound_start
          FROM picked WHERE m.msg_id = picked.msg_id
        RETURNING m.msg_id, m.claim_token, m.attempt, m.priority, m.payload, m.headers,
                  m.enqueued_at, m.lease_expires_at
    )
    SELECT * FROM claimed c ORDER BY c.priority DESC, c.msg_id;
END
$$;

-- Extends the leases of the claims still held; returns the ids whose lease was extended.
-- An id missing from the result has lost its claim (re-armed, re-claimed, finished, or
-- never existed): its holder must stop working on it.
CREATE FUNCTION pgqueue.pgq_renew(msg_ids bigint[], claim_tokens uuid[], lease interval DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
BEGIN
    PERFORM pgqueue._check_pairs(msg_ids, claim_tokens);
    PERFORM pgqueue._check_lease(lease);
    -- Only the lease changes, and it is in no index: a HOT update.
    RETURN QUERY
    UPDATE pgqueue.messages m
       SET lease_expires_at = now() + coalesce(lease, q.lease)
      FROM unnest(msg_ids, claim_tokens) AS held(id, token), pgqueue.queues q
     WHERE m.msg_id = held.id AND m.claim_token = held.token AND m.state = 'claimed'
       AND q.queue = m.queue
    RETURNING m.msg_id;
END
$$;

CREATE FUNCTION pgqueue.pgq_renew(msg_id bigint, claim_token uuid, lease interval DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN EXISTS (
        SELECT FROM pgqueue.pgq_renew(ARRAY[pgqueue._require(msg_id, 'msg_id')],
                                      ARRAY[pgqueue._require(claim_token, 'claim_token')], lease));
END
$$;
