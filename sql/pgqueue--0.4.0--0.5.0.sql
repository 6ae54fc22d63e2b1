-- pgqueue 0.4.0 -> 0.5.0: the consumer's one-call round trip (pgq_ack_claim), and a prune
-- that never holds up acks. Function bodies are those of sql/*.sql in 0.5.0.


-- Paired-array checks name the caller's arguments.
DROP FUNCTION pgqueue._check_pairs(bigint[], uuid[]);

CREATE FUNCTION pgqueue._check_pairs(msg_ids bigint[], claim_tokens uuid[], ids_name text DEFAULT 'msg_ids',
                                     tokens_name text DEFAULT 'claim_tokens') RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM pgqueue._require(msg_ids, ids_name);
    PERFORM pgqueue._require(claim_tokens, tokens_name);
    IF pg_catalog.cardinality(msg_ids) <> pg_catalog.cardinality(claim_tokens) THEN
        PERFORM pgqueue._invalid(tokens_name, pg_catalog.format(
            '%s tokens for %s ids', pg_catalog.cardinality(claim_tokens), pg_catalog.cardinality(msg_ids)));
    END IF;
    IF pg_catalog.array_position(msg_ids, NULL) IS NOT NULL
       OR pg_catalog.array_position(claim_tokens, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'pgqueue: % and % must not contain NULL', ids_name, tokens_name
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
END
$$;

-- The consumer's round trip: ack what it finished and claim the next, one statement.

CREATE FUNCTION pgqueue.pgq_ack_claim(
    queue text,
    ack_msg_ids bigint[],
    ack_claim_tokens uuid[],
    qty integer DEFAULT 1,
    lease interval DEFAULT NULL,
    consumer text DEFAULT NULL,
    session_bound boolean DEFAULT false,
    wait interval DEFAULT '0'
) RETURNS TABLE (
    kind text,
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
#variable_conflict use_variable
DECLARE
    acked bigint[];
    waiting interval := pgq_ack_claim.wait;
BEGIN
    PERFORM pgqueue._check_pairs(ack_msg_ids, ack_claim_tokens, 'ack_msg_ids', 'ack_claim_tokens');
    IF pg_catalog.cardinality(ack_msg_ids) > 0 THEN
        acked := ARRAY(SELECT pgqueue._to_history(ack_msg_ids, ack_claim_tokens, 'completed'));
        IF pg_catalog.cardinality(acked) < pg_catalog.cardinality(ack_msg_ids) THEN
            RETURN QUERY
            SELECT 'not_acked', u.id, NULL::uuid, NULL::integer, NULL::smallint, NULL::jsonb, NULL::jsonb,
                   NULL::timestamptz, NULL::timestamptz
              FROM unnest(ack_msg_ids) WITH ORDINALITY AS u(id, n)
             WHERE u.id <> ALL (acked)
             GROUP BY u.id ORDER BY min(u.n);
        END IF;
        IF pg_catalog.cardinality(acked) > 0 AND waiting IS DISTINCT FROM interval '0' THEN
            PERFORM pgqueue._check_wait(waiting);
            waiting := interval '0';
        END IF;
    END IF;
    RETURN QUERY
    SELECT 'claimed', c.* FROM pgqueue.pgq_claim(pgq_ack_claim.queue, pgq_ack_claim.qty, pgq_ack_claim.lease,
                                                 pgq_ack_claim.consumer, pgq_ack_claim.session_bound, waiting) c;
END
$$;

REVOKE ALL ON FUNCTION pgqueue._check_pairs(bigint[], uuid[], text, text),
    pgqueue.pgq_ack_claim(text, bigint[], uuid[], integer, interval, text, boolean, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgqueue.pgq_ack_claim(text, bigint[], uuid[], integer, interval, text, boolean, interval)
TO pgqueue_consumer;
