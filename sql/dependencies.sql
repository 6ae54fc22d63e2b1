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
    -- Nested: an IF with a subquery is a query of its own, which one parent need not run.
    IF pg_catalog.cardinality(after) > 1 THEN
        IF pg_catalog.cardinality(after) <> (SELECT count(DISTINCT p) FROM pg_catalog.unnest(after) p) THEN
            PERFORM pgqueue._invalid('after', 'a parent is listed twice');
        END IF;
    END IF;
END
$$;

-- Links the messages about to be sent (children, ids drawn already) to their parents. A parent
-- still in the hot table is marked has_dependents and locked: the transaction
-- that finishes it waits for this send's commit, and then finds the new rows (it reads them in
-- a statement of its own, src/finish.rs). A parent finished already counts as it ended:
-- completed is done; dead or cancelled is a failure, which failed_parent and failed_outcome
-- report (the lowest such id). A parent found nowhere (never sent, not committed, pruned, or
-- of a dropped queue) is an error: 23503. waits: some parent has not finished yet. Generic
-- plans: with custom ones (which the plan cache kept choosing for the arrays), planning its
-- statements was two thirds of a send's extra cost.
CREATE FUNCTION pgqueue._depend(children bigint[], after bigint[], on_parent_failure text,
                                OUT waits boolean, OUT failed_parent bigint, OUT failed_outcome text)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_variable
DECLARE
    live bigint[];
    gone bigint[];
    unknown bigint;
BEGIN
    -- Marked first, then locked: a lock taken FOR KEY SHARE and then raised by the update
    -- would wait behind a finish that waits for this send (a deadlock). Both in msg_id order.
    UPDATE pgqueue.message_rows m SET has_dependents = true WHERE m.msg_id = ANY (after) AND m.has_dependents IS NOT TRUE;
    WITH locked AS (
        SELECT m.msg_id FROM pgqueue.message_rows m WHERE m.msg_id = ANY (after) ORDER BY m.msg_id FOR KEY SHARE
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
    -- States from the view, not its rows: a claim through the claim ledger leaves its row 'ready'.
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
