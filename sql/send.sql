-- Producers: enqueue one message or many. Messages are visible at commit (plus delay);
-- pgqueue._note tells the shared state at commit (claim hints, waiting claims, depths).

-- Unique jobs: takes `dedup_key` in `queue` for message `msg_id`, unless a message holds it
-- (waiting, delayed or claimed, or finished less than its hold ago). Returns the msg_id that
-- holds the key: msg_id itself if it was free. A concurrent send of the same key waits here
-- until this transaction ends (the primary key's insert), so exactly one of them takes it;
-- a rolled-back send leaves it free. A key found held is only read, never locked: a
-- duplicate send holds up no ack of the holder (and cannot deadlock with one).
CREATE FUNCTION pgqueue._take_key(queue text, dedup_key text, msg_id bigint, hold interval) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_variable
DECLARE
    holder bigint;
    expiry timestamptz;
BEGIN
    -- Each pass ends unless another transaction changed the key meanwhile.
    LOOP
        INSERT INTO pgqueue.dedup_keys AS d (queue, dedup_key, msg_id, hold)
        VALUES (queue, dedup_key, msg_id, hold)
        ON CONFLICT ON CONSTRAINT dedup_keys_pkey DO NOTHING;
        IF FOUND THEN
            RETURN msg_id;
        END IF;
        SELECT d.msg_id, d.expires_at INTO holder, expiry
          FROM pgqueue.dedup_keys d WHERE d.queue = queue AND d.dedup_key = dedup_key;
        IF FOUND AND (expiry IS NULL OR expiry > pg_catalog.clock_timestamp()) THEN
            RETURN holder;
        ELSIF FOUND THEN
            -- Its hold has ended: take it over, unless another send just did.
            UPDATE pgqueue.dedup_keys d SET msg_id = _take_key.msg_id, hold = _take_key.hold, expires_at = NULL
             WHERE d.queue = queue AND d.dedup_key = dedup_key AND d.expires_at <= pg_catalog.clock_timestamp();
            IF FOUND THEN
                RETURN msg_id;
            END IF;
        END IF;
    END LOOP;
END
$$;

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
        INSERT INTO pgqueue.message_rows (msg_id, queue, state, priority, payload, headers, visible_at, after)
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
        INSERT INTO pgqueue.message_rows (queue, state, priority, payload, headers, visible_at)
        SELECT q.queue, CASE WHEN due IS NULL THEN 'ready' ELSE 'delayed' END, priority, p, headers, due
          FROM pg_catalog.unnest(payloads) WITH ORDINALITY AS u(p, n)
         ORDER BY u.n
        RETURNING message_rows.msg_id
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
    INSERT INTO pgqueue.message_rows (msg_id, queue, state, priority, payload, headers, visible_at, dedup_key, after)
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
