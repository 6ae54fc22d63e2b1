-- Producers: enqueue one message or many. Messages are visible at commit (plus delay);
-- pgqueue._note tells the shared state at commit (claim hints, waiting claims, depths).

CREATE FUNCTION pgqueue.pgq_send_batch(
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

CREATE FUNCTION pgqueue.pgq_send(
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
