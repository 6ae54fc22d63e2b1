-- pgqueue 0.16.0 -> 0.17.0.
--
-- Dependencies: pgq_send and pgq_send_batch take `after` (parent msg_ids) and
-- `on_parent_failure`; a message sent with parents not finished yet is 'pending' until they
-- all completed. New: the table pgqueue.dependencies, the columns messages.after,
-- messages.has_dependents and history.after, the state 'pending' (the CHECK constraints and a
-- partial index), pgq_graph, queue_stats.pending, worker_stats.dependency_failures and
-- .released. pgq_send and pgq_send_batch gain two last arguments: they are dropped and
-- created again (their grants and comments with them).
-- Locks on queue data: ALTER TABLE takes ACCESS EXCLUSIVE on pgqueue.messages and on
-- pgqueue.history and its partitions until the update commits; the new CHECK constraints
-- read pgqueue.messages once, and CREATE INDEX reads it again (no rewrite).
-- The library runs the 0.16.0 SQL as before: install, restart, update.

ALTER TABLE pgqueue.messages ADD COLUMN after bigint[], ADD COLUMN has_dependents boolean;
ALTER TABLE pgqueue.history ADD COLUMN after bigint[];
ALTER TABLE pgqueue.messages
    DROP CONSTRAINT messages_state_check,
    ADD CONSTRAINT messages_state_check CHECK (state IN ('ready', 'delayed', 'claimed', 'pending')),
    DROP CONSTRAINT messages_delayed_has_due_time,
    ADD CONSTRAINT messages_delayed_has_due_time
        CHECK (state = 'pending' OR (state = 'delayed') = (visible_at IS NOT NULL)),
    ADD CONSTRAINT messages_pending_has_parents CHECK (state <> 'pending' OR after IS NOT NULL);
-- Pending rows, for the tick that checks that none waits for parents that all completed.
CREATE INDEX messages_pending_idx ON pgqueue.messages (msg_id)
    WHERE state = 'pending';

-- Added without a default, filled, then given it: so that the catalog matches a fresh
-- install's (a default given to ADD COLUMN is kept as the column's "missing value").
ALTER TABLE pgqueue.worker_state ADD COLUMN dependency_failures bigint, ADD COLUMN released bigint;
UPDATE pgqueue.worker_state SET dependency_failures = 0, released = 0;
ALTER TABLE pgqueue.worker_state
    ALTER COLUMN dependency_failures SET DEFAULT 0, ALTER COLUMN dependency_failures SET NOT NULL,
    ALTER COLUMN released SET DEFAULT 0, ALTER COLUMN released SET NOT NULL;

-- Dependencies (sql/dependencies.sql): one row per parent a pending message still waits for,
-- or waited for. parent_outcome is NULL until the parent finishes, then how it did ('completed',
-- 'dead', 'cancelled', or 'deleted' with its queue). Each parent's finish writes its own rows
-- only, so the acks of a child's many parents never wait on each other. The rows go when the
-- child finishes.
CREATE TABLE pgqueue.dependencies (
    parent            bigint NOT NULL,
    child             bigint NOT NULL,
    on_parent_failure text NOT NULL CONSTRAINT dependencies_policy_check
                          CHECK (on_parent_failure IN ('cancel', 'dead', 'run')),
    parent_outcome    text CONSTRAINT dependencies_outcome_check
                          CHECK (parent_outcome IN ('completed', 'dead', 'cancelled', 'deleted')),
    PRIMARY KEY (parent, child)
);
-- A child's rows, to remove them when it finishes.
CREATE INDEX dependencies_child_idx ON pgqueue.dependencies (child);
-- Whether a child is held back: one index entry per parent not finished yet, or failed under
-- a policy other than 'run' (dependencies.rs reads it with this very condition). The check
-- costs the same whichever of 10,000 parents finished last.
CREATE INDEX dependencies_waiting_idx ON pgqueue.dependencies (child)
    WHERE parent_outcome IS NULL OR (parent_outcome <> 'completed' AND on_parent_failure <> 'run');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.dependencies', '');

-- Dependencies: a message sent with `after` (pgq_send, pgq_send_batch) is pending until every
-- listed parent has completed. The parent that finishes last, in its own transaction, makes
-- it claimable (src/dependencies.rs); a parent that ends otherwise (dead, cancelled, deleted
-- with its queue) applies the child's on_parent_failure, down the graph.

-- The parents and the policy of a send (22004, 22023), for pgq_send and pgq_send_batch.
-- after NULL or empty: no parents.
CREATE FUNCTION pgqueue._check_after(after bigint[], on_parent_failure text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF pgqueue._require(on_parent_failure, 'on_parent_failure') NOT IN ('cancel', 'dead', 'run') THEN
        PERFORM pgqueue._invalid('on_parent_failure',
            pg_catalog.format('%L is not one of ''cancel'', ''dead'', ''run''', on_parent_failure));
    END IF;
    IF after IS NULL THEN
        RETURN;
    END IF;
    PERFORM pgqueue._check_ids(after, 'after');
    IF pg_catalog.cardinality(after) > 10000 THEN
        PERFORM pgqueue._invalid('after', pg_catalog.format('%s parents; at most 10000', pg_catalog.cardinality(after)));
    END IF;
    IF pg_catalog.cardinality(after) > 1
       AND pg_catalog.cardinality(after) <> (SELECT count(DISTINCT p) FROM pg_catalog.unnest(after) p) THEN
        PERFORM pgqueue._invalid('after', 'a parent is listed twice');
    END IF;
END
$$;

-- Links the messages about to be sent (children, ids drawn already) to their parents. A parent
-- still in the hot table is marked has_dependents and locked: the transaction
-- that finishes it waits for this send's commit, and then finds the new rows (it reads them in
-- a statement of its own, src/finish.rs). A parent finished already counts as it ended:
-- completed is done; dead or cancelled is a failure, which failed_parent and failed_outcome
-- report (the lowest such id). A parent found nowhere (never sent, not committed, pruned, or
-- of a dropped queue) is an error: 23503. waits: some parent has not finished yet.
CREATE FUNCTION pgqueue._depend(children bigint[], after bigint[], on_parent_failure text,
                                OUT waits boolean, OUT failed_parent bigint, OUT failed_outcome text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_variable
DECLARE
    live bigint[];
    gone bigint[];
    unknown bigint;
BEGIN
    -- Marked first, then locked: a lock taken FOR KEY SHARE and then raised by the update
    -- would wait behind a finish that waits for this send (a deadlock). Both in msg_id order.
    UPDATE pgqueue.messages m SET has_dependents = true WHERE m.msg_id = ANY (after) AND m.has_dependents IS NOT TRUE;
    WITH locked AS (
        SELECT m.msg_id FROM pgqueue.messages m WHERE m.msg_id = ANY (after) ORDER BY m.msg_id FOR KEY SHARE
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

-- Why a child of a failed parent was cancelled or dead-lettered (its last_error).
CREATE FUNCTION pgqueue._parent_failed(parent bigint, outcome text) RETURNS text
LANGUAGE sql IMMUTABLE
RETURN pg_catalog.format('parent %s %s', parent,
    CASE outcome WHEN 'dead' THEN 'was dead-lettered'
                 ELSE 'was ' || outcome END);

-- A child whose parent failed: what becomes of it (on_parent_failure 'cancel' or 'dead').
CREATE FUNCTION pgqueue._child_outcome(on_parent_failure text) RETURNS text
LANGUAGE sql IMMUTABLE
RETURN CASE on_parent_failure WHEN 'cancel' THEN 'cancelled' WHEN 'dead' THEN 'dead' END;

-- What follows from the finish of these messages (src/dependencies.rs): `parents` ended as
-- `outcomes` (beside; 'deleted': gone with their queue), `children` finished themselves (their
-- links go). Children whose parents all completed become claimable; those of a parent that
-- failed follow their on_parent_failure. pgq_drop_queue calls it; _to_history does the same.
CREATE FUNCTION pgqueue._finish_dependencies(parents bigint[], outcomes text[], children bigint[]) RETURNS void
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', '_finish_dependencies_wrapper';

-- A message's dependencies, one row each (id: its msg_id): itself ('message'), its parents ('parent', from its `after`, as
-- they are now: a state while in the queue, an outcome once finished, NULL once pruned) and
-- the children that wait or waited for it and are still in the queue ('child'). A finished
-- child is found from its own side. No rows: no such message.
CREATE FUNCTION pgqueue.pgq_graph(msg_id bigint)
RETURNS TABLE (relation text, id bigint, queue text, state text, on_parent_failure text,
               enqueued_at timestamptz, finished_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    me record;
BEGIN
    SELECT j.msg_id, j.queue, j.state, j.after, j.enqueued_at, j.finished_at INTO me
      FROM (SELECT m.msg_id, m.queue, m.state, m.after, m.enqueued_at, NULL::timestamptz AS finished_at
              FROM pgqueue.messages m WHERE m.msg_id = pgqueue._require(msg_id, 'msg_id')
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
              FROM pgqueue.messages m WHERE m.msg_id = p.id
             UNION ALL
            SELECT h.queue, h.outcome, h.enqueued_at, h.finished_at FROM pgqueue.history h WHERE h.msg_id = p.id
             LIMIT 1) j ON true
      ORDER BY p.n)
     UNION ALL
    (SELECT 'child', m.msg_id, m.queue, m.state, d.on_parent_failure, m.enqueued_at, NULL
       FROM pgqueue.dependencies d JOIN pgqueue.messages m ON m.msg_id = d.child
      WHERE d.parent = me.msg_id
      ORDER BY m.msg_id);
END
$$;

DROP FUNCTION pgqueue.pgq_send_batch(text, jsonb[], interval, smallint, jsonb, text[], interval);
DROP FUNCTION pgqueue.pgq_send(text, jsonb, interval, smallint, jsonb, text, interval);

CREATE FUNCTION pgqueue.pgq_send_batch(
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
        INSERT INTO pgqueue.messages (msg_id, queue, state, priority, payload, headers, visible_at, after)
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

CREATE FUNCTION pgqueue.pgq_send(
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
        SELECT * INTO waits, failed_parent, failed_outcome FROM pgqueue._depend(ARRAY[id], after, on_parent_failure);
    END IF;
    -- With parents not finished yet, pending (delayed or ready when they have completed).
    st := CASE WHEN waits THEN 'pending' WHEN due IS NULL THEN 'ready' ELSE 'delayed' END;
    INSERT INTO pgqueue.messages (msg_id, queue, state, priority, payload, headers, visible_at, dedup_key, after)
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
    SELECT count(*) INTO in_flight FROM pgqueue.messages m
     WHERE m.queue = pgq_drop_queue.queue AND m.state = 'claimed';
    IF in_flight > 0 AND NOT force THEN
        RAISE EXCEPTION 'pgqueue: queue "%" has % claimed messages', queue, in_flight
            USING ERRCODE = 'object_in_use',
                  HINT = 'Wait for the consumers to finish, or pass force => true.';
    END IF;
    WITH gone AS (
        DELETE FROM pgqueue.messages m WHERE m.queue = pgq_drop_queue.queue
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

-- Adds one tick's counts (a jsonb of counter => increment, plus "error" and flags) to the
-- worker_state row.
CREATE OR REPLACE FUNCTION pgqueue._record_tick(counts jsonb) RETURNS void
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    UPDATE pgqueue.worker_state SET
        pid = pg_backend_pid(),
        started_at = CASE WHEN (counts->>'first')::boolean THEN now() ELSE started_at END,
        last_tick_at = now(),
        last_prune_at = CASE WHEN (counts->>'pruned')::boolean THEN now() ELSE last_prune_at END,
        last_rollup_at = CASE WHEN (counts->>'rolled_up')::boolean THEN now() ELSE last_rollup_at END,
        tick_interval_ms = (counts->>'tick_interval_ms')::integer,
        ticks = ticks + coalesce((counts->>'ticks')::bigint, 1),
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
        schedule_failures = schedule_failures + coalesce((counts->>'schedule_failures')::bigint, 0),
        keys_failures = keys_failures + coalesce((counts->>'keys_failures')::bigint, 0),
        scheduled_runs = scheduled_runs + coalesce((counts->>'scheduled_runs')::bigint, 0),
        missed_runs = missed_runs + coalesce((counts->>'missed_runs')::bigint, 0),
        schedule_errors = schedule_errors + coalesce((counts->>'schedule_errors')::bigint, 0),
        keys_expired = keys_expired + coalesce((counts->>'keys_expired')::bigint, 0),
        rollup_failures = rollup_failures + coalesce((counts->>'rollup_failures')::bigint, 0),
        dependency_failures = dependency_failures + coalesce((counts->>'dependency_failures')::bigint, 0),
        released = released + coalesce((counts->>'released')::bigint, 0),
        last_error = coalesce(counts->>'error', last_error),
        last_error_at = CASE WHEN counts ? 'error' THEN now() ELSE last_error_at END;
END;

-- Metrics, shaped for Prometheus' postgres_exporter: one row per queue.
CREATE OR REPLACE VIEW pgqueue.queue_stats AS
SELECT q.queue,
       q.paused,
       c.ready,
       c.delayed,
       c.claimed,
       c.expired_claims,
       (SELECT count(*) FROM pgqueue.history h WHERE h.queue = q.queue AND h.outcome = 'dead') AS dead,
       now() - c.oldest_ready AS oldest_ready_age,
       now() - c.oldest_expired_lease AS oldest_expired_claim_age,
       c.pending
  FROM pgqueue.queues q
 CROSS JOIN LATERAL (
       SELECT count(*) FILTER (WHERE m.state = 'ready') AS ready,
              count(*) FILTER (WHERE m.state = 'delayed') AS delayed,
              count(*) FILTER (WHERE m.state = 'claimed') AS claimed,
              count(*) FILTER (WHERE m.state = 'claimed' AND m.lease_expires_at <= now()) AS expired_claims,
              min(m.enqueued_at) FILTER (WHERE m.state = 'ready') AS oldest_ready,
              min(m.lease_expires_at) FILTER (WHERE m.state = 'claimed' AND m.lease_expires_at <= now())
                  AS oldest_expired_lease,
              count(*) FILTER (WHERE m.state = 'pending') AS pending
         FROM pgqueue.messages m
        WHERE m.queue = q.queue) c;

-- Every message, waiting, claimed or finished: one place to look a job up (by msg_id, which
-- both halves index, or through pgqueue.dedup_keys by unique key). Claim tokens are left out:
-- who can read this view cannot act for a consumer.
CREATE OR REPLACE VIEW pgqueue.jobs AS
SELECT m.msg_id, m.queue, m.state, m.priority, m.attempt, m.payload, m.headers, m.enqueued_at, m.visible_at,
       m.claimed_at, m.consumer, m.lease_expires_at, NULL::timestamptz AS finished_at, m.last_error, m.dedup_key,
       m.progress, NULL::jsonb AS result, m.after
  FROM pgqueue.messages m
 UNION ALL
SELECT h.msg_id, h.queue, h.outcome, h.priority, h.attempt, h.payload, h.headers, h.enqueued_at, NULL, NULL,
       NULL, NULL, h.finished_at, h.last_error, NULL, h.progress, h.result, h.after
  FROM pgqueue.history h;

-- The worker's counters in this database (monotonic; see the README for what to alert on).
CREATE OR REPLACE VIEW pgqueue.worker_stats AS
SELECT current_database() AS database,
       w.pid, w.started_at, w.last_tick_at, now() - w.last_tick_at AS since_last_tick,
       w.last_prune_at, w.tick_interval_ms,
       w.ticks, w.tick_failures, w.promote_failures, w.orphan_failures, w.rearm_failures,
       w.partition_failures, w.prune_failures,
       w.promoted, w.orphans_expired, w.rearmed, w.dead_lettered, w.rescue_batches, w.rescue_rows,
       w.partitions_created, w.prune_pruned, w.prune_noop, w.prune_blocked,
       w.prune_skipped_active, w.prune_backed_off, w.prune_error, w.pruned_rows,
       w.last_error, w.last_error_at, w.reconcile_failures, w.hint_corrections,
       w.schedule_failures, w.keys_failures, w.scheduled_runs, w.missed_runs, w.schedule_errors, w.keys_expired,
       w.rollup_failures, w.last_rollup_at, w.dependency_failures, w.released
  FROM pgqueue.worker_state w;

REVOKE ALL ON FUNCTION
    pgqueue.pgq_send(text, jsonb, interval, smallint, jsonb, text, interval, bigint[], text),
    pgqueue.pgq_send_batch(text, jsonb[], interval, smallint, jsonb, text[], interval, bigint[], text),
    pgqueue.pgq_graph(bigint),
    pgqueue._check_after(bigint[], text),
    pgqueue._depend(bigint[], bigint[], text),
    pgqueue._parent_failed(bigint, text),
    pgqueue._child_outcome(text),
    pgqueue._finish_dependencies(bigint[], text[], bigint[])
FROM PUBLIC;
REVOKE ALL ON pgqueue.dependencies FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    pgqueue.pgq_send(text, jsonb, interval, smallint, jsonb, text, interval, bigint[], text),
    pgqueue.pgq_send_batch(text, jsonb[], interval, smallint, jsonb, text[], interval, bigint[], text),
    pgqueue.pgq_graph(bigint)
TO pgqueue_producer;
GRANT EXECUTE ON FUNCTION pgqueue.pgq_graph(bigint) TO pgqueue_consumer;
GRANT SELECT ON pgqueue.dependencies TO pgqueue_admin;

COMMENT ON FUNCTION pgqueue.pgq_send(text, jsonb, interval, smallint, jsonb, text, interval, bigint[], text) IS
    'enqueue one message (delay, priority, headers, unique key, parents to wait for); returns its msg_id';
COMMENT ON FUNCTION pgqueue.pgq_send_batch(text, jsonb[], interval, smallint, jsonb, text[], interval, bigint[], text) IS
    'enqueue up to 10,000 messages in one statement (each waits for the parents in after); returns their msg_ids in array order';
COMMENT ON FUNCTION pgqueue.pgq_graph(bigint) IS
    'a message''s dependencies: the message, its parents and the children still in the queue, with their states';
COMMENT ON VIEW pgqueue.queue_stats IS
    'per queue, counted exactly: ready, delayed, claimed, expired, dead and pending messages, oldest ages';
COMMENT ON TABLE pgqueue.messages IS
    'messages waiting (ready, delayed, or pending on their parents) or claimed; finished ones move to pgqueue.history';
COMMENT ON TABLE pgqueue.dependencies IS
    'one row per parent a message waits or waited for, with how the parent ended; removed when the child finishes';
