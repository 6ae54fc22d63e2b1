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
    IF pg_catalog.array_ndims(msg_ids) > 1 OR pg_catalog.array_ndims(claim_tokens) > 1 THEN
        PERFORM pgqueue._invalid(CASE WHEN pg_catalog.array_ndims(msg_ids) > 1 THEN ids_name ELSE tokens_name END,
                                 'a one-dimensional array is expected');
    END IF;
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

-- Claims pass over what other claims took since they read the hints.

CREATE FUNCTION pgqueue."_ahead"(
	"queue" TEXT, /* & str */
	"priority" smallint, /* i16 */
	"msg_id" bigint /* i64 */
) RETURNS bool /* bool */
STRICT VOLATILE PARALLEL UNSAFE COST 1000
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_ahead_wrapper';

-- Claims pick, then claim by id, and run generic plans (no planning per call).

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
                                                 pg_catalog.cardinality(taken), now() + granted);
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
                           claimed_at = now(), lease_expires_at = now() + granted, consumer = pgq_claim.consumer,
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
        SELECT * INTO q FROM pgqueue.queues qs WHERE qs.queue = pgq_claim.queue;
        IF NOT FOUND THEN
            q := pgqueue._queue(pgq_claim.queue);
        END IF;
    END LOOP;
END
$$;

-- Acks run the generic plan of their statement.

CREATE OR REPLACE FUNCTION pgqueue._to_history(msg_ids bigint[], claim_tokens uuid[], outcome text, error text DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_variable
BEGIN
    RETURN QUERY
    WITH gone AS (
        DELETE FROM pgqueue.messages m
         USING unnest(msg_ids, claim_tokens) AS u(id, token)
         WHERE m.msg_id = u.id AND (claim_tokens IS NULL OR (m.claim_token = u.token AND m.state = 'claimed'))
        RETURNING m.msg_id, m.queue, m.state, m.priority, m.attempt, m.payload, m.headers, m.enqueued_at,
                  m.last_error, m.dedup_key
    ), released AS (
        -- Unique jobs: a finished message's key is free again, or kept for its hold.
        DELETE FROM pgqueue.dedup_keys d USING gone g
         WHERE g.dedup_key IS NOT NULL AND d.queue = g.queue AND d.dedup_key = g.dedup_key
           AND d.msg_id = g.msg_id AND d.hold = interval '0'
    ), held AS (
        UPDATE pgqueue.dedup_keys d SET expires_at = now() + d.hold FROM gone g
         WHERE g.dedup_key IS NOT NULL AND d.queue = g.queue AND d.dedup_key = g.dedup_key
           AND d.msg_id = g.msg_id AND d.hold > interval '0'
    ), kept AS (
        INSERT INTO pgqueue.history (msg_id, queue, outcome, priority, attempt, payload, headers,
                                     enqueued_at, last_error)
        SELECT g.msg_id, g.queue, outcome, g.priority, g.attempt, g.payload, g.headers,
               g.enqueued_at, coalesce(error, g.last_error)
          FROM gone g
        RETURNING history.msg_id
    ), noted AS (
        SELECT pgqueue._note(g.queue, count(*), g.state, NULL) FROM gone g GROUP BY g.queue, g.state
    )
    SELECT k.msg_id FROM kept k, (SELECT count(*) FROM noted) n ORDER BY k.msg_id;
END
$$;

-- Pruning truncates old partitions (their lock only) and drops them empty later, never holding up acks.

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
    empties text[] := '{}';  -- [queue's history, emptied partition] pairs
    truncated boolean := false;
    k integer;
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
                    -- Only the lock wait is bounded by the prune lock timeout. The lock comes
                    -- first, so no ack can slip in between the count and the truncate.
                    PERFORM set_config('lock_timeout', timeout, true);
                    EXECUTE format('LOCK TABLE ONLY pgqueue.%I IN ACCESS EXCLUSIVE MODE', part.name);
                    PERFORM set_config('lock_timeout', '5s', true);
                    EXECUTE format('SELECT count(*), max(finished_at) FROM pgqueue.%I', part.name)
                       INTO n, newest;
                    IF n = 0 AND part.day IS NOT NULL THEN
                        empties := empties || ARRAY[[parent::text, format('pgqueue.%I', part.name)]];
                    END IF;
                    -- The default partition only once everything in it is past.
                    CONTINUE WHEN n = 0 OR newest > cutoff;
                    EXECUTE format('TRUNCATE pgqueue.%I', part.name);
                    truncated := true;
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
    -- Last, so that no other work of this call runs while a queue's history is locked.
    FOR k IN 1 .. CASE WHEN truncated THEN 0 ELSE coalesce(array_length(empties, 1), 0) END LOOP
        BEGIN
            EXECUTE format('LOCK TABLE ONLY %s IN ACCESS EXCLUSIVE MODE NOWAIT', empties[k][2]);
            EXECUTE format('LOCK TABLE ONLY %s IN ACCESS EXCLUSIVE MODE NOWAIT', empties[k][1]);
            EXECUTE format('DROP TABLE %s', empties[k][2]);
        EXCEPTION
            WHEN lock_not_available THEN NULL;  -- in use right now: a later prune drops it
            WHEN OTHERS THEN
                RAISE WARNING 'pgqueue: dropping the emptied partition % failed: %', empties[k][2], SQLERRM;
        END;
    END LOOP;
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

REVOKE ALL ON FUNCTION pgqueue._check_pairs(bigint[], uuid[], text, text), pgqueue._ahead(text, smallint, bigint),
    pgqueue.pgq_ack_claim(text, bigint[], uuid[], integer, interval, text, boolean, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgqueue.pgq_ack_claim(text, bigint[], uuid[], integer, interval, text, boolean, interval)
TO pgqueue_consumer;
