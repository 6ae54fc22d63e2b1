-- Parking: the holder of a claim parks its message to wait for the outside world (a webhook, a
-- person, another system). pgq_park releases the claim, and pgq_signal(key) makes every
-- message parked on that key claimable again, carrying the signal's payload. A signal sent
-- before the park is kept (pgq_signal's keep) and resumes a park that comes later at once.
-- What the next claim of the message sees is in its headers, under "pgq_park".
--
-- A park and a signal of the same key both write the key's row in pgqueue.park_keys, so one
-- waits for the other's commit and then sees it: no wakeup is lost in between. In
-- REPEATABLE READ or SERIALIZABLE, a row written by a transaction the snapshot does not see
-- raises a serialization failure (40001): retry.

-- Park keys: 1 to 512 characters (22004, 22023).
CREATE FUNCTION pgqueue._check_park_key(key text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF pg_catalog.length(pgqueue._require(key, 'key')) NOT BETWEEN 1 AND 512 THEN
        PERFORM pgqueue._invalid('key', pg_catalog.format('a key of %s characters; 1 to 512', pg_catalog.length(key)));
    END IF;
    RETURN key;
END
$$;

-- The message's headers with its "pgq_park" entry replaced by `park` (at the park), or with
-- `resumed` added to it (when it becomes claimable again). Headers that are not a JSON object
-- (nor NULL) cannot take the entry: pgq_park refuses them first.
CREATE FUNCTION pgqueue._park_headers(headers jsonb, park jsonb, resumed jsonb DEFAULT NULL) RETURNS jsonb
LANGUAGE sql IMMUTABLE
RETURN coalesce(headers, '{}') || pg_catalog.jsonb_build_object('pgq_park',
    coalesce(park, headers -> 'pgq_park', '{}') || coalesce(resumed, '{}'));

-- Parks a claimed message (fenced by its token, as pgq_nack) until pgq_signal(key) or the end
-- of `timeout`: its claim ends (the consumer is free, the lease is not re-armed). When it
-- resumes, its attempt is given back: the claim that resumes it counts it again. `payload`
-- is kept in the "pgq_park" header, for the holder that resumes it. At the timeout it becomes
-- claimable with "timed_out": true (on_timeout 'resume') or is dead-lettered ('dead'). A
-- signal of `key` still kept resumes it at once. False: not held under that token (nothing
-- changed). A message whose cancel was requested is finished as cancelled instead.
CREATE FUNCTION pgqueue.pgq_park(
    msg_id bigint,
    claim_token uuid,
    key text,
    timeout interval,
    payload jsonb DEFAULT NULL,
    on_timeout text DEFAULT 'resume',
    queue text DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    h record;
    kept record;
    park jsonb;
    ended integer;
BEGIN
    IF queue IS NOT NULL THEN
        PERFORM pgqueue._queue(queue);
    END IF;
    PERFORM pgqueue._require(msg_id, 'msg_id');
    PERFORM pgqueue._require(claim_token, 'claim_token');
    PERFORM pgqueue._check_park_key(key);
    IF pgqueue._require(timeout, 'timeout') <= interval '0' OR timeout > interval '365 days' THEN
        PERFORM pgqueue._invalid('timeout', pg_catalog.format('%s is not between 0 (exclusive) and 365 days', timeout));
    END IF;
    IF pgqueue._require(on_timeout, 'on_timeout') NOT IN ('resume', 'dead') THEN
        PERFORM pgqueue._invalid('on_timeout',
            pg_catalog.format('%L is not one of ''resume'', ''dead''', on_timeout));
    END IF;
    IF payload IS NOT NULL THEN
        PERFORM pgqueue._check_reports(ARRAY[payload], 1, 'payload');
    END IF;
    SELECT m.msg_id, m.queue, m.priority, m.headers, m.cancel_requested_at INTO h
      FROM pgqueue.message_rows m
     WHERE m.msg_id = msg_id
       AND CASE WHEN pgqueue._token_claim(claim_token) IS NULL THEN m.claim_token = claim_token AND m.state = 'claimed'
                ELSE pgqueue._ledger_agrees(claim_token, m.msg_id, m.claims_ended + 1,
                                            CASE WHEN m.state <> 'ready' THEN m.claim_token = claim_token AND m.state = 'claimed' END,
                                            (SELECT k.key FROM pgqueue.claim_key k ORDER BY k.made_at, k.key LIMIT 1),
                                            EXISTS (SELECT FROM pgqueue.claims c WHERE c.claim_id = pgqueue._token_claim(claim_token)))
           END
       AND (queue IS NULL OR m.queue = queue)
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF h.headers IS NOT NULL AND pg_catalog.jsonb_typeof(h.headers) <> 'object' THEN
        PERFORM pgqueue._invalid('msg_id', pg_catalog.format(
            'message %s has headers that are not a JSON object: it cannot be parked', msg_id));
    END IF;
    IF h.cancel_requested_at IS NOT NULL THEN
        PERFORM pgqueue._to_history(ARRAY[msg_id], ARRAY[claim_token], 'cancelled', NULL);
        RETURN true;
    END IF;
    -- After the message: a signal locks the key's row, then the messages parked on it.
    INSERT INTO pgqueue.park_keys AS p (key) VALUES (key)
    ON CONFLICT ON CONSTRAINT park_keys_pkey DO UPDATE SET key = p.key
    RETURNING p.signal, p.signalled_at, coalesce(p.keep_until > now(), false) AS signalled INTO kept;
    park := pg_catalog.jsonb_build_object('key', key, 'parked_at', now(), 'timeout_at', now() + timeout,
                                          'on_timeout', on_timeout)
            || CASE WHEN payload IS NOT NULL THEN pg_catalog.jsonb_build_object('payload', payload) ELSE '{}' END;
    UPDATE pgqueue.message_rows m
       SET state = CASE WHEN kept.signalled THEN 'ready' ELSE 'parked' END,
           park_key = CASE WHEN NOT kept.signalled THEN key END,
           park_until = CASE WHEN NOT kept.signalled THEN now() + timeout END,
           -- A 'ready' row was left so by a claim through the ledger: one attempt further.
           attempt = m.attempt + (m.state = 'ready')::integer - CASE WHEN kept.signalled THEN 1 ELSE 0 END,
           claim_token = NULL, claimed_at = NULL, lease_expires_at = NULL, consumer = NULL,
           session_pid = NULL, session_started = NULL, claims_ended = m.claims_ended + 1,
           headers = pgqueue._park_headers(m.headers, park,
               CASE WHEN kept.signalled THEN pg_catalog.jsonb_build_object(
                   'signal', kept.signal, 'signalled_at', kept.signalled_at, 'resumed_at', now()) END)
     WHERE m.msg_id = h.msg_id
    RETURNING m.claims_ended INTO ended;
    -- The claim's end, for the held set at commit (claims of the ledger's tokens only).
    PERFORM pgqueue._held_end(ARRAY[h.msg_id], ARRAY[ended]) WHERE pgqueue._token_claim(claim_token) IS NOT NULL;
    PERFORM pgqueue._note(h.queue, 1, 'claimed', 'parked');
    IF kept.signalled THEN
        PERFORM pgqueue._note(h.queue, 1, 'parked', 'ready', h.priority, h.msg_id, h.msg_id);
    END IF;
    RETURN true;
END
$$;

-- Resumes every message parked on `key`: claimable again (waiting claims are woken at
-- commit), with the signal in its "pgq_park" header (signal: the payload, signalled_at,
-- resumed_at). The signal is kept until now() + keep, and a park on `key` meanwhile resumes at
-- once with it; keep '0' keeps nothing. While a signal is kept, the key's later signals change
-- nothing (a signal sent twice is one signal): they resume nothing, since nothing can park on
-- the key meanwhile. Returns how many messages it resumed.
CREATE FUNCTION pgqueue.pgq_signal(key text, payload jsonb DEFAULT NULL, keep interval DEFAULT '1 day')
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    kept record;
    resumed bigint;
BEGIN
    PERFORM pgqueue._check_park_key(key);
    PERFORM pgqueue._check_delay(pgqueue._require(keep, 'keep'), 'keep');
    IF payload IS NOT NULL THEN
        PERFORM pgqueue._check_reports(ARRAY[payload], 1, 'payload');
    END IF;
    INSERT INTO pgqueue.park_keys AS p (key, signal, signalled_at, keep_until)
    VALUES (key, payload, now(), now() + keep)
    ON CONFLICT ON CONSTRAINT park_keys_pkey DO UPDATE
       SET signal = CASE WHEN p.keep_until > now() THEN p.signal ELSE excluded.signal END,
           signalled_at = CASE WHEN p.keep_until > now() THEN p.signalled_at ELSE excluded.signalled_at END,
           keep_until = CASE WHEN p.keep_until > now() THEN p.keep_until ELSE excluded.keep_until END
    RETURNING p.signal, p.signalled_at INTO kept;
    -- In msg_id order, as pgq_cancel locks them: the two cannot deadlock.
    WITH parked AS (
        SELECT m.msg_id FROM pgqueue.message_rows m WHERE m.park_key = key AND m.state = 'parked'
         ORDER BY m.msg_id
           FOR UPDATE
    ), back AS (
        UPDATE pgqueue.message_rows m
           SET state = 'ready', park_key = NULL, park_until = NULL, attempt = m.attempt - 1,
               headers = pgqueue._park_headers(m.headers, NULL, pg_catalog.jsonb_build_object(
                   'signal', kept.signal, 'signalled_at', kept.signalled_at, 'resumed_at', now()))
          FROM parked WHERE m.msg_id = parked.msg_id
        RETURNING m.queue, m.priority, m.msg_id
    )
    SELECT coalesce(sum(r.n), 0) INTO resumed
      FROM (SELECT count(*) AS n, pgqueue._note(b.queue, count(*), 'parked', 'ready', b.priority,
                                                min(b.msg_id), max(b.msg_id))
              FROM back b GROUP BY b.queue, b.priority) r;
    RETURN resumed;
END
$$;

-- Parked messages whose wait ended with no signal, at most max_rows, earliest first: claimable
-- again with "timed_out": true in their "pgq_park" header, or dead-lettered (on_timeout
-- 'dead'). Rows another session holds are left for the next call. Returns how many.
CREATE FUNCTION pgqueue._expire_parks(max_rows integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    resume bigint[];
    dead bigint[];
    resumed bigint;
BEGIN
    SELECT coalesce(array_agg(e.msg_id) FILTER (WHERE NOT e.dead), '{}'),
           coalesce(array_agg(e.msg_id) FILTER (WHERE e.dead), '{}')
      INTO resume, dead
      FROM (SELECT m.msg_id, coalesce(m.headers -> 'pgq_park' ->> 'on_timeout' = 'dead', false) AS dead
              FROM pgqueue.message_rows m
             WHERE m.state = 'parked' AND m.park_until <= now()
             ORDER BY m.park_until
             LIMIT max_rows
               FOR UPDATE SKIP LOCKED) e;
    WITH back AS (
        UPDATE pgqueue.message_rows m
           SET state = 'ready', park_key = NULL, park_until = NULL, attempt = m.attempt - 1,
               headers = pgqueue._park_headers(m.headers, NULL,
                   pg_catalog.jsonb_build_object('timed_out', true, 'resumed_at', now()))
         WHERE m.msg_id = ANY (resume)
        RETURNING m.queue, m.priority, m.msg_id
    )
    SELECT coalesce(sum(r.n), 0) INTO resumed
      FROM (SELECT count(*) AS n, pgqueue._note(b.queue, count(*), 'parked', 'ready', b.priority,
                                                min(b.msg_id), max(b.msg_id))
              FROM back b GROUP BY b.queue, b.priority) r;
    RETURN resumed + (SELECT count(*) FROM pgqueue._to_history(dead, NULL, 'dead', 'parked, and no signal came before its timeout'));
END
$$;

-- Park keys with no signal kept and no message parked on them, at most max_rows (the tick, at
-- the prune cadence). Locked first, then checked in a statement of its own: a park that
-- committed before the lock is seen, and none can commit on them after it.
CREATE FUNCTION pgqueue._collect_park_keys(max_rows integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    idle text[];
    n bigint;
BEGIN
    SELECT coalesce(array_agg(p.key), '{}') INTO idle
      FROM (SELECT k.key FROM pgqueue.park_keys k
             WHERE k.keep_until IS NULL OR k.keep_until <= now()
             LIMIT max_rows
               FOR UPDATE SKIP LOCKED) p;
    DELETE FROM pgqueue.park_keys k
     WHERE k.key = ANY (idle)
       AND NOT EXISTS (SELECT FROM pgqueue.message_rows m WHERE m.park_key = k.key AND m.state = 'parked');
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
