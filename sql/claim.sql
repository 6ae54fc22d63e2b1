-- Consumers: claim with a lease, renew it. Every claim gets a new claim_token; only the
-- holder of the current token can renew, ack, nack or fail the message (fencing).

-- Turns delayed messages whose time has come into claimable ones, oldest due first. Walks
-- the delayed index only up to the first row not yet due. Used by pgq_claim (so delays
-- never depend on the worker) and by the worker's tick. When all that was due got promoted,
-- it tells the shared state when the next one falls due, so that claims skip promoting
-- until then (the epoch, read before the promotion's snapshot, voids that if a delayed
-- message arrived meanwhile).
CREATE FUNCTION pgqueue._promote_due(queue text, max_rows integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_variable
DECLARE
    epoch bigint := pgqueue._due_epoch(queue);
    promoted bigint;
BEGIN
    WITH due AS (
        SELECT m.msg_id FROM pgqueue.messages m
         WHERE m.queue = queue AND m.state = 'delayed' AND m.visible_at <= now()
         ORDER BY m.visible_at
         LIMIT max_rows
           FOR UPDATE SKIP LOCKED
    ), moved AS (
        UPDATE pgqueue.messages m SET state = 'ready', visible_at = NULL
          FROM due WHERE m.msg_id = due.msg_id
        RETURNING m.msg_id, m.priority
    )
    SELECT coalesce(sum(n), 0) INTO promoted
      FROM (SELECT count(*) AS n,
                   pgqueue._note(queue, count(*), 'delayed', 'ready', mv.priority, min(mv.msg_id), max(mv.msg_id))
              FROM moved mv GROUP BY mv.priority) p;
    IF promoted < max_rows THEN
        PERFORM pgqueue._due_after(queue, epoch,
            (SELECT min(m.visible_at) FROM pgqueue.messages m
              WHERE m.queue = queue AND m.state = 'delayed' AND m.visible_at > now()));
    END IF;
    RETURN promoted;
END
$$;

-- Claims start each priority's scan at its hint from the shared state (pgqueue._claim_start):
-- the index entries below it belong to messages claimed, finished or moved since, which a
-- pinned xmin horizon keeps in the index however long it lasts. Without hints (no shared
-- memory, a queue not yet checked by the worker, or too many priorities) it scans from the
-- start. With wait, an empty claim sleeps until a commit makes messages of the queue
-- claimable, or until wait has passed.
-- Its statements run their generic plans (index scans whatever the arguments): left to
-- choose, PostgreSQL would plan them anew on every call (their LIMIT is a parameter), and
-- planning cost more than running them. The pick must read the index in order and stop at
-- its LIMIT, because _take hands out each row it is asked about: a bitmap scan and a sort
-- (the generic plan with some statistics, or with a session's enable_indexscan off) would
-- ask about every ready row first, each then passed over by every claim until the worker's
-- check. Hence the planner settings; and no JIT: before PostgreSQL 18 a disabled sort (the
-- result's, which nothing else can give) adds a huge cost, enough to compile each statement.
CREATE FUNCTION pgqueue.pgq_claim(
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
SET plan_cache_mode = force_generic_plan
SET enable_indexscan = on SET enable_bitmapscan = off SET enable_sort = off SET jit = off AS $$
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
                -- From each priority's hint, each row handed to one claim (_take raises the
                -- hint past it before this claim locks it), passing over what others took.
                picked := '{}';
                FOR i IN 1 .. pg_catalog.cardinality(s.priorities) LOOP
                    taken := ARRAY(
                        SELECT m.msg_id FROM pgqueue.messages m
                         WHERE m.queue = q.queue AND m.state = 'ready'
                           AND m.priority = s.priorities[i] AND m.msg_id >= s.starts[i]
                           AND pgqueue._take(q.queue, s.priorities[i], s.epoch, m.msg_id)
                         ORDER BY m.msg_id
                         LIMIT pgq_claim.qty - pg_catalog.cardinality(picked)
                           FOR UPDATE SKIP LOCKED);
                    IF pg_catalog.cardinality(taken) > 0 THEN
                        PERFORM pgqueue._claimed(q.queue, s.priorities[i], NULL, taken[1],
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

-- A consumer's round trip in one statement and one commit: acks the claims it has finished
-- (fenced, as pgq_ack) and claims the next ones (as pgq_claim, same arguments). An ack whose
-- claim was lost (stale token, re-armed, already finished) completes nothing and comes back as
-- a row of kind 'not_acked' with only its msg_id, before the claimed messages (kind
-- 'claimed'). The acks commit with the call, and their report must not come late: a call
-- with something to ack does not wait for messages; the consumer's next call, with nothing
-- to ack, does.
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
    -- The checks (which raise) are called only when something is wrong: a hot path. In two
    -- steps, because array_position refuses a multi-dimensional array with its own error.
    IF ack_msg_ids IS NULL OR ack_claim_tokens IS NULL
       OR pg_catalog.array_ndims(ack_msg_ids) > 1 OR pg_catalog.array_ndims(ack_claim_tokens) > 1 THEN
        PERFORM pgqueue._check_pairs(ack_msg_ids, ack_claim_tokens, 'ack_msg_ids', 'ack_claim_tokens');
    END IF;
    IF pg_catalog.cardinality(ack_msg_ids) <> pg_catalog.cardinality(ack_claim_tokens)
       OR pg_catalog.array_position(ack_msg_ids, NULL) IS NOT NULL
       OR pg_catalog.array_position(ack_claim_tokens, NULL) IS NOT NULL THEN
        PERFORM pgqueue._check_pairs(ack_msg_ids, ack_claim_tokens, 'ack_msg_ids', 'ack_claim_tokens');
    END IF;
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
        IF waiting IS DISTINCT FROM interval '0' THEN
            PERFORM pgqueue._check_wait(waiting);
            waiting := interval '0';
        END IF;
    END IF;
    RETURN QUERY
    SELECT 'claimed', c.* FROM pgqueue.pgq_claim(pgq_ack_claim.queue, pgq_ack_claim.qty, pgq_ack_claim.lease,
                                                 pgq_ack_claim.consumer, pgq_ack_claim.session_bound, waiting) c
     ORDER BY c.priority DESC, c.msg_id;
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
    -- The re-arm pass learns the earliest new lease end at commit (a lease may get shorter).
    RETURN QUERY
    WITH renewed AS (
        UPDATE pgqueue.messages m
           SET lease_expires_at = now() + coalesce(lease, q.lease)
          FROM unnest(msg_ids, claim_tokens) AS held(id, token), pgqueue.queues q
         WHERE m.msg_id = held.id AND m.claim_token = held.token AND m.state = 'claimed'
           AND q.queue = m.queue
        RETURNING m.msg_id, m.lease_expires_at
    ), noted AS (
        SELECT pgqueue._renewed(min(r.lease_expires_at)) FROM renewed r
    )
    SELECT r.msg_id FROM renewed r, noted;
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
