-- pgqueue 0.2.0 -> 0.3.0: queue state in shared memory (claim hints, waiting claims,
-- depths without counting, where the re-arm pass starts). Function bodies are those of
-- sql/*.sql in 0.3.0.

-- The tick's new step and what it counts. Added without a default and then filled, so
-- that the catalog matches a fresh install's (a default given to ADD COLUMN is kept as the
-- column's "missing value").
ALTER TABLE pgqueue.worker_state ADD COLUMN reconcile_failures bigint, ADD COLUMN hint_corrections bigint;
UPDATE pgqueue.worker_state SET reconcile_failures = 0, hint_corrections = 0;
ALTER TABLE pgqueue.worker_state
    ALTER COLUMN reconcile_failures SET DEFAULT 0, ALTER COLUMN reconcile_failures SET NOT NULL,
    ALTER COLUMN hint_corrections SET DEFAULT 0, ALTER COLUMN hint_corrections SET NOT NULL;

-- The library's new functions.
CREATE FUNCTION pgqueue."_claim_start"(
	"queue" TEXT /* & str */
) RETURNS TABLE (
	"priorities" smallint[],  /* :: std :: option :: Option < Vec < i16 > > */
	"starts" bigint[],  /* :: std :: option :: Option < Vec < i64 > > */
	"epoch" bigint,  /* Option < i64 > */
	"seq" bigint,  /* Option < i64 > */
	"promote" bool  /* bool */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_claim_start_wrapper';

CREATE FUNCTION pgqueue."_claimed"(
	"queue" TEXT, /* & str */
	"priority" smallint, /* i16 */
	"epoch" bigint, /* Option < i64 > */
	"low" bigint, /* Option < i64 > */
	"high" bigint, /* Option < i64 > */
	"n" bigint, /* i64 */
	"expiry" timestamp with time zone /* Option < TimestampWithTimeZone > */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_claimed_wrapper';

CREATE FUNCTION pgqueue."_due_epoch"(
	"queue" TEXT /* & str */
) RETURNS bigint /* Option < i64 > */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_due_epoch_wrapper';

CREATE FUNCTION pgqueue."_due_after"(
	"queue" TEXT, /* & str */
	"epoch" bigint, /* Option < i64 > */
	"next" timestamp with time zone /* Option < TimestampWithTimeZone > */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_due_after_wrapper';

CREATE FUNCTION pgqueue."_note"(
	"queue" TEXT, /* & str */
	"n" bigint, /* i64 */
	"from_state" TEXT, /* Option < & str > */
	"to_state" TEXT, /* Option < & str > */
	"priority" smallint DEFAULT NULL, /* Option < i16 > */
	"low" bigint DEFAULT NULL, /* Option < i64 > */
	"high" bigint DEFAULT NULL, /* Option < i64 > */
	"due" timestamp with time zone DEFAULT NULL /* Option < pgrx :: datum :: TimestampWithTimeZone > */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_note_wrapper';

CREATE FUNCTION pgqueue."_reset_queue"(
	"queue" TEXT /* & str */
) RETURNS bool /* bool */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_reset_queue_wrapper';

CREATE FUNCTION pgqueue."_wake_queue"(
	"queue" TEXT /* & str */
) RETURNS bool /* bool */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_wake_queue_wrapper';

CREATE FUNCTION pgqueue."_renewed"(
	"until" timestamp with time zone /* Option < pgrx :: datum :: TimestampWithTimeZone > */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_renewed_wrapper';

CREATE FUNCTION pgqueue."_wait"(
	"queue" TEXT, /* & str */
	"seen" bigint, /* Option < i64 > */
	"deadline" timestamp with time zone /* TimestampWithTimeZone */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_wait_wrapper';

CREATE FUNCTION pgqueue."_queue_depth"() RETURNS TABLE (
	"queue" TEXT,  /* String */
	"tracked" bool,  /* bool */
	"ready" bigint,  /* Option < i64 > */
	"delayed" bigint,  /* Option < i64 > */
	"claimed" bigint,  /* Option < i64 > */
	"waiting_claims" bigint,  /* i64 */
	"wakeups" bigint,  /* i64 */
	"hint_corrections" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_queue_depth_wrapper';

CREATE FUNCTION pgqueue."_shared_state"() RETURNS TABLE (
	"max_queues" bigint,  /* i64 */
	"queues" bigint,  /* i64 */
	"queues_untracked" bigint,  /* i64 */
	"bytes_per_queue" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_shared_state_wrapper';

-- New SQL functions.
CREATE FUNCTION pgqueue._check_wait(wait interval) RETURNS interval
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF pgqueue._require(wait, 'wait') < interval '0' OR wait > interval '1 minute' THEN
        PERFORM pgqueue._invalid('wait', pg_catalog.format('%s is not between 0 and 1 minute', wait));
    END IF;
    IF wait > interval '0' AND pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgqueue: a claim can wait only in a READ COMMITTED transaction'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'In REPEATABLE READ or SERIALIZABLE nothing committed after the transaction began becomes visible: claim with wait => ''0''.';
    END IF;
    RETURN wait;
END
$$;

CREATE FUNCTION pgqueue._claimable(queue text, priorities smallint[])
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
            SELECT m.priority, m.msg_id, m.xmax <> '0' INTO priority, msg_id, busy FROM pgqueue.messages m
             WHERE m.queue = queue AND m.state = 'ready' AND m.priority < above AND m.priority > below
             ORDER BY m.priority DESC, m.msg_id LIMIT 1;
            EXIT WHEN NOT FOUND;
            RETURN NEXT;
            above := priority;
        END LOOP;
        EXIT WHEN i > cardinality(listed);
        p := listed[i];
        SELECT m.msg_id, m.xmax <> '0' INTO msg_id, busy FROM pgqueue.messages m
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
    due := (SELECT min(m.visible_at) FROM pgqueue.messages m WHERE m.queue = queue AND m.state = 'delayed');
    RETURN NEXT;
END
$$;

CREATE FUNCTION pgqueue._depth(queue text, OUT ready bigint, OUT delayed bigint, OUT claimed bigint)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT count(*) FILTER (WHERE m.state = 'ready'),
           count(*) FILTER (WHERE m.state = 'delayed'),
           count(*) FILTER (WHERE m.state = 'claimed')
      FROM pgqueue.messages m WHERE m.queue = _depth.queue;
END;

-- Changed functions.
CREATE OR REPLACE FUNCTION pgqueue._promote_due(queue text, max_rows integer) RETURNS bigint
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

CREATE OR REPLACE FUNCTION pgqueue.pgq_send_batch(
    queue text,
    payloads jsonb[],
    delay interval DEFAULT '0',
    priority smallint DEFAULT 0,
    headers jsonb DEFAULT NULL
) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    q pgqueue.queues := pgqueue._lock_queue(queue);
    due timestamptz;
BEGIN
    PERFORM pgqueue._check_payloads(payloads);
    PERFORM pgqueue._check_delay(pgqueue._require(delay, 'delay'), 'delay');
    PERFORM pgqueue._check_priority(priority);
    IF pg_catalog.cardinality(payloads) > 10000 THEN
        PERFORM pgqueue._invalid('payloads', pg_catalog.format(
            '%s messages in one call; at most 10000', pg_catalog.cardinality(payloads)));
    END IF;
    due := CASE WHEN delay > interval '0' THEN now() + delay END;
    RETURN QUERY
    WITH sent AS (
        INSERT INTO pgqueue.messages (queue, state, priority, payload, headers, visible_at)
        SELECT q.queue, CASE WHEN due IS NULL THEN 'ready' ELSE 'delayed' END, priority, p, headers, due
          FROM pg_catalog.unnest(payloads) WITH ORDINALITY AS u(p, n)
         ORDER BY u.n
        RETURNING messages.msg_id
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
    headers jsonb DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    q pgqueue.queues := pgqueue._lock_queue(queue);
    due timestamptz;
    id bigint;
BEGIN
    PERFORM pgqueue._check_payload(payload);
    PERFORM pgqueue._check_delay(pgqueue._require(delay, 'delay'), 'delay');
    PERFORM pgqueue._check_priority(priority);
    due := CASE WHEN delay > interval '0' THEN now() + delay END;
    INSERT INTO pgqueue.messages (queue, state, priority, payload, headers, visible_at)
    VALUES (q.queue, CASE WHEN due IS NULL THEN 'ready' ELSE 'delayed' END, priority, payload, headers, due)
    RETURNING msg_id INTO id;
    PERFORM pgqueue._note(q.queue, 1, NULL, CASE WHEN due IS NULL THEN 'ready' ELSE 'delayed' END,
                          priority, id, id, due);
    RETURN id;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue._to_history(msg_ids bigint[], claim_tokens uuid[], outcome text, error text DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_variable
BEGIN
    RETURN QUERY
    WITH gone AS (
        DELETE FROM pgqueue.messages m
         USING unnest(msg_ids, claim_tokens) AS u(id, token)
         WHERE m.msg_id = u.id AND (claim_tokens IS NULL OR (m.claim_token = u.token AND m.state = 'claimed'))
        RETURNING m.msg_id, m.queue, m.state, m.priority, m.attempt, m.payload, m.headers, m.enqueued_at,
                  m.last_error
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

CREATE OR REPLACE FUNCTION pgqueue.pgq_nack(
    msg_id bigint,
    claim_token uuid,
    retry_in interval DEFAULT NULL,
    error text DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
        RETURNING h.msg_id, h.priority, h.payload, h.headers, h.enqueued_at, h.last_error
    )
    , again AS (
        INSERT INTO pgqueue.messages (msg_id, queue, state, priority, payload, headers, enqueued_at, last_error)
        OVERRIDING SYSTEM VALUE
        SELECT b.msg_id, q.queue, 'ready', b.priority, b.payload, b.headers, b.enqueued_at, b.last_error
          FROM back b
        RETURNING messages.msg_id, messages.priority
    )
    SELECT coalesce(sum(n), 0) INTO moved
      FROM (SELECT count(*) AS n, pgqueue._note(q.queue, count(*), 'history', 'ready', a.priority,
                                                min(a.msg_id), max(a.msg_id))
              FROM again a GROUP BY a.priority) r;
    RETURN moved;
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

    -- Built apart and attached last: attaching locks pgqueue.history only in SHARE UPDATE
    -- EXCLUSIVE mode, so other queues' acks are not held up.
    EXECUTE pg_catalog.format(
        'CREATE TABLE pgqueue.%I (LIKE pgqueue.history INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (finished_at)',
        pgqueue._history_table(queue));
    -- Rows that arrive before their day's partition exists land here; never lost.
    EXECUTE pg_catalog.format('CREATE TABLE pgqueue.%I PARTITION OF pgqueue.%I DEFAULT',
        pgqueue._history_table(queue) || '$default', pgqueue._history_table(queue));
    PERFORM pgqueue._index_history_part(pgqueue._history_table(queue) || '$default');
    FOR day IN SELECT d::date FROM pg_catalog.generate_series(now()::date, now()::date + 2, '1 day') d LOOP
        PERFORM pgqueue._ensure_history_day(queue, day);
    END LOOP;
    EXECUTE pg_catalog.format('ALTER TABLE pgqueue.history ATTACH PARTITION pgqueue.%I FOR VALUES IN (%L)',
        pgqueue._history_table(queue), queue);
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.pgq_drop_queue(queue text, force boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '5s' AS $$
DECLARE
    in_flight bigint;
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
    SELECT count(*) INTO in_flight FROM pgqueue.messages m
     WHERE m.queue = pgq_drop_queue.queue AND m.state = 'claimed';
    IF in_flight > 0 AND NOT force THEN
        RAISE EXCEPTION 'pgqueue: queue "%" has % claimed messages', queue, in_flight
            USING ERRCODE = 'object_in_use',
                  HINT = 'Wait for the consumers to finish, or pass force => true.';
    END IF;
    DELETE FROM pgqueue.messages m WHERE m.queue = pgq_drop_queue.queue;
    DELETE FROM pgqueue.queues q WHERE q.queue = pgq_drop_queue.queue;
    PERFORM pgqueue._reset_queue(queue);  -- at commit; its waiting claims then find it gone
    -- Dropping a partition locks pgqueue.history exclusively: wait for that at most
    -- lock_timeout (5 s, this function's setting), then fail with 55P03 and change nothing.
    EXECUTE pg_catalog.format('DROP TABLE pgqueue.%I', pgqueue._history_table(queue));
END
$$;

CREATE OR REPLACE FUNCTION pgqueue._set_paused(queue text, paused boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgqueue._queue(queue);
    UPDATE pgqueue.queues q SET paused = _set_paused.paused WHERE q.queue = _set_paused.queue;
    IF NOT paused THEN
        PERFORM pgqueue._wake_queue(queue);  -- waiting claims look again at commit
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue._record_tick(counts jsonb) RETURNS void
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    UPDATE pgqueue.worker_state SET
        pid = pg_backend_pid(),
        started_at = CASE WHEN (counts->>'first')::boolean THEN now() ELSE started_at END,
        last_tick_at = now(),
        last_prune_at = CASE WHEN (counts->>'pruned')::boolean THEN now() ELSE last_prune_at END,
        tick_interval_ms = (counts->>'tick_interval_ms')::integer,
        ticks = ticks + 1,
        tick_failures = tick_failures + coalesce((counts->>'tick_failures')::bigint, 0),
        promote_failures = promote_failures + coalesce((counts->>'promote_failures')::bigint, 0),
        orphan_failures = orphan_failures + coalesce((counts->>'orphan_failures')::bigint, 0),
        rearm_failures = rearm_failures + coalesce((counts->>'rearm_failures')::bigint, 0),
        partition_failures = partition_failures + coalesce((counts->>'partition_failures')::bigint, 0),
        reconcile_failures = reconcile_failures + coalesce((counts->>'reconcile_failures')::bigint, 0),
        prune_failures = prune_failures + coalesce((counts->>'prune_failures')::bigint, 0),
        promoted = promoted + coalesce((counts->>'promoted')::bigint, 0),
        orphans_expired = orphans_expired + coalesce((counts->>'orphans_expired')::bigint, 0),
        rearmed = rearmed + coalesce((counts->>'rearmed')::bigint, 0),
        dead_lettered = dead_lettered + coalesce((counts->>'dead_lettered')::bigint, 0),
        rescue_batches = rescue_batches + coalesce((counts->>'rescue_batches')::bigint, 0),
        rescue_rows = rescue_rows + coalesce((counts->>'rescue_rows')::bigint, 0),
        partitions_created = partitions_created + coalesce((counts->>'partitions_created')::bigint, 0),
        prune_pruned = prune_pruned + coalesce((counts->>'prune_pruned')::bigint, 0),
        prune_noop = prune_noop + coalesce((counts->>'prune_noop')::bigint, 0),
        prune_blocked = prune_blocked + coalesce((counts->>'prune_blocked')::bigint, 0),
        prune_skipped_active = prune_skipped_active + coalesce((counts->>'prune_skipped_active')::bigint, 0),
        prune_backed_off = prune_backed_off + coalesce((counts->>'prune_backed_off')::bigint, 0),
        prune_error = prune_error + coalesce((counts->>'prune_error')::bigint, 0),
        pruned_rows = pruned_rows + coalesce((counts->>'pruned_rows')::bigint, 0),
        hint_corrections = hint_corrections + coalesce((counts->>'hint_corrections')::bigint, 0),
        last_error = coalesce(counts->>'error', last_error),
        last_error_at = CASE WHEN counts ? 'error' THEN now() ELSE last_error_at END;
END;

CREATE OR REPLACE FUNCTION pgqueue.pgq_renew(msg_ids bigint[], claim_tokens uuid[], lease interval DEFAULT NULL)
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

-- _rearm_batch also returns first_msg_id and next_expiry: a new result type.
DROP FUNCTION pgqueue._rearm_batch(bigint, integer, text);
CREATE FUNCTION pgqueue._rearm_batch(after_msg_id bigint, max_rows integer, queue text DEFAULT NULL)
RETURNS TABLE (rearmed bigint, dead_lettered bigint, last_msg_id bigint, more boolean, first_msg_id bigint,
               next_expiry timestamptz)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET jit = off AS $$
#variable_conflict use_variable
DECLARE
    retry bigint[];
    exhausted bigint[];
    window_end bigint;
    window_full boolean;
BEGIN
    SELECT min(w.msg_id), max(w.msg_id), count(*) >= 4 * max_rows, min(w.lease_expires_at)
      INTO first_msg_id, window_end, window_full, next_expiry
      FROM (SELECT m.msg_id, m.lease_expires_at FROM pgqueue.messages m
             WHERE m.state = 'claimed' AND m.msg_id > after_msg_id
             ORDER BY m.msg_id LIMIT 4 * max_rows) w;
    SELECT coalesce(array_agg(e.msg_id) FILTER (WHERE e.attempt < e.max_attempts), '{}'),
           coalesce(array_agg(e.msg_id) FILTER (WHERE e.attempt >= e.max_attempts), '{}'),
           CASE WHEN count(*) >= max_rows THEN max(e.msg_id) ELSE window_end END,
           count(*) >= max_rows OR window_full
      INTO retry, exhausted, last_msg_id, more
      FROM (SELECT m.msg_id, m.attempt, q.max_attempts
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
    RETURN NEXT;
END
$$;

-- pgq_claim gains its last argument, wait: a new signature.
DROP FUNCTION pgqueue.pgq_claim(text, integer, interval, text, boolean);
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
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    q pgqueue.queues;
    granted interval;
    bound_pid integer;
    bound_start timestamptz;
    s record;
    deadline timestamptz;
    i integer;
    got bigint;
    n bigint;
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
            IF s.priorities IS NULL THEN
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
                ), noted AS (
                    SELECT pgqueue._claimed(q.queue, c.priority, NULL, min(c.msg_id), max(c.msg_id), count(*),
                                            min(c.lease_expires_at))
                      FROM claimed c GROUP BY c.priority
                )
                SELECT c.* FROM claimed c, (SELECT count(*) FROM noted) k ORDER BY c.priority DESC, c.msg_id;
                GET DIAGNOSTICS got = ROW_COUNT;
            ELSE
                FOR i IN 1 .. pg_catalog.cardinality(s.priorities) LOOP
                    RETURN QUERY
                    WITH picked AS (
                        SELECT m.msg_id FROM pgqueue.messages m
                         WHERE m.queue = q.queue AND m.state = 'ready'
                           AND m.priority = s.priorities[i] AND m.msg_id >= s.starts[i]
                         ORDER BY m.msg_id
                         LIMIT pgq_claim.qty - got
                           FOR UPDATE SKIP LOCKED
                    ), claimed AS (
                        UPDATE pgqueue.messages m
                           SET state = 'claimed', claim_token = gen_random_uuid(), attempt = m.attempt + 1,
                               claimed_at = now(), lease_expires_at = now() + granted, consumer = pgq_claim.consumer,
                               session_pid = bound_pid, session_started = bound_start
                          FROM picked WHERE m.msg_id = picked.msg_id
                        RETURNING m.msg_id, m.claim_token, m.attempt, m.priority, m.payload, m.headers,
                                  m.enqueued_at, m.lease_expires_at
                    ), noted AS (
                        SELECT pgqueue._claimed(q.queue, s.priorities[i], s.epoch, min(c.msg_id), max(c.msg_id),
                                                count(*), min(c.lease_expires_at))
                          FROM claimed c
                    )
                    SELECT c.* FROM claimed c, noted ORDER BY c.msg_id;
                    GET DIAGNOSTICS n = ROW_COUNT;
                    got := got + n;
                    EXIT WHEN got >= pgq_claim.qty;
                END LOOP;
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

-- Views: worker_stats shows the new counters; two new ones.
CREATE OR REPLACE VIEW pgqueue.worker_stats AS
SELECT current_database() AS database,
       w.pid, w.started_at, w.last_tick_at, now() - w.last_tick_at AS since_last_tick,
       w.last_prune_at, w.tick_interval_ms,
       w.ticks, w.tick_failures, w.promote_failures, w.orphan_failures, w.rearm_failures,
       w.partition_failures, w.prune_failures,
       w.promoted, w.orphans_expired, w.rearmed, w.dead_lettered, w.rescue_batches, w.rescue_rows,
       w.partitions_created, w.prune_pruned, w.prune_noop, w.prune_blocked,
       w.prune_skipped_active, w.prune_backed_off, w.prune_error, w.pruned_rows,
       w.last_error, w.last_error_at, w.reconcile_failures, w.hint_corrections
  FROM pgqueue.worker_state w;

CREATE VIEW pgqueue.queue_depth AS
SELECT q.queue,
       coalesce(s.tracked, false) AS tracked,
       s.ready, s.delayed, s.claimed,
       coalesce(s.waiting_claims, 0) AS waiting_claims,
       coalesce(s.wakeups, 0) AS wakeups,
       coalesce(s.hint_corrections, 0) AS hint_corrections
  FROM pgqueue.queues q
  LEFT JOIN pgqueue._queue_depth() s ON s.queue = q.queue;

CREATE VIEW pgqueue.shared_state AS SELECT * FROM pgqueue._shared_state();

-- Privileges, as sql/privileges.sql gives them in a fresh install.
REVOKE ALL ON FUNCTION
    pgqueue._claim_start(text), pgqueue._claimed(text, smallint, bigint, bigint, bigint, bigint, timestamptz),
    pgqueue._due_epoch(text), pgqueue._due_after(text, bigint, timestamptz),
    pgqueue._note(text, bigint, text, text, smallint, bigint, bigint, timestamptz),
    pgqueue._reset_queue(text), pgqueue._wake_queue(text), pgqueue._renewed(timestamptz),
    pgqueue._wait(text, bigint, timestamptz), pgqueue._queue_depth(), pgqueue._shared_state(),
    pgqueue._check_wait(interval), pgqueue._claimable(text, smallint[]), pgqueue._depth(text),
    pgqueue._rearm_batch(bigint, integer, text),
    pgqueue.pgq_claim(text, integer, interval, text, boolean, interval)
FROM PUBLIC;
REVOKE ALL ON pgqueue.queue_depth, pgqueue.shared_state FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgqueue.pgq_claim(text, integer, interval, text, boolean, interval) TO pgqueue_consumer;
GRANT SELECT ON pgqueue.queue_depth, pgqueue.shared_state TO pgqueue_admin, pg_monitor;
GRANT EXECUTE ON FUNCTION pgqueue._queue_depth(), pgqueue._shared_state() TO pgqueue_admin, pg_monitor;
