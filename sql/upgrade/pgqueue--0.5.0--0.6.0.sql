-- pgqueue 0.5.0 -> 0.6.0: a waiting claim's lease runs from when it claimed, not from when
-- the statement started. Function bodies are those of sql/*.sql in 0.6.0.

CREATE OR REPLACE FUNCTION pgqueue.pgq_claim(
    queue text,
    qty integer DEFAULT 1,
    lease interval DEFAULT NULL,
    consumer text DEFAULT NULL,
    session_bound boolean DEFAULT false,
    wait interval DEFAULT '0'
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
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queues;
    granted interval;
    bound_pid integer;
    bound_start timestamptz;
    s record;
    deadline timestamptz;
    since timestamptz := now();
    i integer;
    picked bigint[];
    taken bigint[];
    got bigint;
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
    IF pgq_claim.wait IS DISTINCT FROM interval '0' THEN
        PERFORM pgqueue._check_wait(pgq_claim.wait);
    END IF;
    deadline := clock_timestamp() + pgq_claim.wait;
    LOOP
        -- Read before the claim's snapshot: what it reports is what this attempt can see.
        SELECT * INTO s FROM pgqueue._claim_start(q.queue);
        got := 0;
        IF NOT q.paused THEN
            IF s.promote AND pgqueue._promote_due(q.queue, 1000) > 0 THEN
                SELECT * INTO s FROM pgqueue._claim_start(q.queue);
            END IF;
            -- Pick, then claim what was picked by id.
            IF s.priorities IS NULL THEN
                picked := ARRAY(
                    SELECT m.msg_id FROM pgqueue.messages m
                     WHERE m.queue = q.queue AND m.state = 'ready'
                     ORDER BY m.priority DESC, m.msg_id
                     LIMIT pgq_claim.qty
                       FOR UPDATE SKIP LOCKED);
            ELSE
                -- From each priority's hint, passing over what other claims took since; the
                -- hint is raised past what this one takes at once, before the update.
                picked := '{}';
                FOR i IN 1 .. pg_catalog.cardinality(s.priorities) LOOP
                    taken := ARRAY(
                        SELECT m.msg_id FROM pgqueue.messages m
                         WHERE m.queue = q.queue AND m.state = 'ready'
                           AND m.priority = s.priorities[i] AND m.msg_id >= s.starts[i]
                           AND pgqueue._ahead(q.queue, s.priorities[i], m.msg_id)
                         ORDER BY m.msg_id
                         LIMIT pgq_claim.qty - pg_catalog.cardinality(picked)
                           FOR UPDATE SKIP LOCKED);
                    IF pg_catalog.cardinality(taken) > 0 THEN
                        PERFORM pgqueue._claimed(q.queue, s.priorities[i], s.epoch, taken[1],
                                                 taken[pg_catalog.cardinality(taken)],
                                                 pg_catalog.cardinality(taken), since + granted);
                        picked := picked || taken;
                    END IF;
                    EXIT WHEN pg_catalog.cardinality(picked) >= pgq_claim.qty;
                END LOOP;
            END IF;
            IF pg_catalog.cardinality(picked) > 0 THEN
                RETURN QUERY
                WITH claimed AS (
                    UPDATE pgqueue.messages m
                       SET state = 'claimed', claim_token = gen_random_uuid(), attempt = m.attempt + 1,
                           claimed_at = since, lease_expires_at = since + granted, consumer = pgq_claim.consumer,
                           session_pid = bound_pid, session_started = bound_start
                     WHERE m.msg_id = ANY (picked)
                    RETURNING m.msg_id, m.claim_token, m.attempt, m.priority, m.payload, m.headers,
                              m.enqueued_at, m.lease_expires_at
                ), noted AS (
                    -- (Claims from the hints noted theirs above.)
                    SELECT pgqueue._claimed(q.queue, c.priority, NULL, min(c.msg_id), max(c.msg_id), count(*),
                                            min(c.lease_expires_at))
                      FROM claimed c WHERE s.priorities IS NULL GROUP BY c.priority
                )
                SELECT c.* FROM claimed c, (SELECT count(*) FROM noted) k ORDER BY c.priority DESC, c.msg_id;
                GET DIAGNOSTICS got = ROW_COUNT;
            END IF;
        END IF;
        EXIT WHEN got > 0 OR clock_timestamp() >= deadline;
        -- Nothing yet: sleep until a commit makes messages of this queue claimable (or the
        -- queue is resumed), then try again; one last try at the deadline.
        PERFORM pgqueue._wait(q.queue, s.seq, deadline);
        -- A lease runs from the claim, not from the statement's start: after a wait longer
        -- than the lease, now() + lease would hand out a lease that has already ended.
        since := clock_timestamp();
        SELECT * INTO q FROM pgqueue.queues qs WHERE qs.queue = pgq_claim.queue;
        IF NOT FOUND THEN
            q := pgqueue._queue(pgq_claim.queue);
        END IF;
    END LOOP;
END
$$;
