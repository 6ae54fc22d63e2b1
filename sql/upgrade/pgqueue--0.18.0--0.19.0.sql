-- pgqueue 0.18.0 -> 0.19.0.
--
-- The hot table's eight CHECK constraints become one, which calls pgqueue._message_ok (in the
-- library): PostgreSQL reads each CHECK's stored expression again for every statement that
-- writes the table, and that was a fifth of a claim's time. What a row may hold is unchanged.
-- Locks on queue data: ALTER TABLE takes ACCESS EXCLUSIVE on pgqueue.messages until the update
-- commits, and the new constraint reads the table once (no rewrite).
-- The library must be 0.19.0's, loaded: install, restart, then update (the function is in it).
-- A send with parents runs fewer queries: _check_after tests a single parent for duplicates
-- without a query, and pgq_send assigns _depend's result instead of selecting from it.
-- The library runs the 0.18.0 SQL as before.

-- What each state of a message requires of its other columns: the hot table's one CHECK
-- (src/message_rules.rs). A function, because PostgreSQL reads every CHECK's stored expression
-- anew for each statement that writes the table: one CHECK per rule cost a claim a fifth of
-- its time. Not strict: a NULL column is an answer.
CREATE FUNCTION pgqueue._message_ok(state text, priority smallint, visible_at timestamptz, claim_token uuid,
                                    lease_expires_at timestamptz, session_pid integer,
                                    cancel_requested_at timestamptz, after bigint[], park_key text,
                                    park_until timestamptz)
RETURNS boolean
LANGUAGE c IMMUTABLE PARALLEL SAFE AS 'MODULE_PATHNAME', '_message_ok_wrapper';
REVOKE ALL ON FUNCTION pgqueue._message_ok(text, smallint, timestamptz, uuid, timestamptz, integer, timestamptz,
                                           bigint[], text, timestamptz) FROM PUBLIC;

ALTER TABLE pgqueue.messages
    DROP CONSTRAINT messages_state_check,
    DROP CONSTRAINT messages_priority_check,
    DROP CONSTRAINT messages_session_only_when_claimed,
    DROP CONSTRAINT messages_cancel_only_when_claimed,
    DROP CONSTRAINT messages_delayed_has_due_time,
    DROP CONSTRAINT messages_pending_has_parents,
    DROP CONSTRAINT messages_parked_has_key,
    DROP CONSTRAINT messages_claimed_has_lease,
    -- The state and priority are known; only a claim has a session or a cancel request;
    -- delayed rows have a due time, and only they but pending ones (delayed once released);
    -- pending ones have parents; parked ones have a key and a timeout, claimed ones a token
    -- and a lease, and only they.
    ADD CONSTRAINT messages_state_rules CHECK (pgqueue._message_ok(state, priority, visible_at, claim_token,
        lease_expires_at, session_pid, cancel_requested_at, after, park_key, park_until));

-- The parents and the policy of a send (22004, 22023), for pgq_send and pgq_send_batch.
-- after NULL or empty: no parents.
CREATE OR REPLACE FUNCTION pgqueue._check_after(after bigint[], on_parent_failure text) RETURNS void
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

CREATE OR REPLACE FUNCTION pgqueue.pgq_send(
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
    linked record;  -- what _depend found
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
        -- An assignment, not SELECT … FROM: PL/pgSQL evaluates a lone call without a query.
        linked := pgqueue._depend(ARRAY[id], after, on_parent_failure);
        waits := linked.waits;
        failed_parent := linked.failed_parent;
        failed_outcome := linked.failed_outcome;
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
