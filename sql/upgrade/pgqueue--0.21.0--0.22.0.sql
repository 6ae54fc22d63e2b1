-- pgqueue 0.21.0 -> 0.22.0.
--
-- The claim ledger's two-way check (step 3 of the write path begins: docs/design/write-path.md).
-- Each message counts the claims of it that ended in a nack, park or re-arm (the new column
-- claims_ended); a claim takes it as claim number claims_ended + 1, which the ledger records
-- (its column attempts becomes claim_numbers) and its token signs. Fencing then checks, for
-- every token the ledger issued, that the ledger and the row agree both ways (XX000 where
-- they do not), and the tick prunes ledger rows by the counts alone.
--
-- Adding the column takes an ACCESS EXCLUSIVE lock on pgqueue.message_rows until the update
-- commits (no rewrite: the column has a constant default). Claims in flight keep their
-- tokens: random ones are the row's word, as before; the ledger's (pgqueue.claim_ledger on)
-- are carried over, their rows given the count that makes their attempt their claim number,
-- and the ledger trimmed to the entries the rows hold.

ALTER TABLE pgqueue.message_rows ADD COLUMN claims_ended integer NOT NULL DEFAULT 0;
CREATE OR REPLACE VIEW pgqueue.messages AS
SELECT msg_id, queue, state, priority, attempt, payload, headers, enqueued_at, visible_at, claim_token,
       claimed_at, consumer, lease_expires_at, last_error, session_pid, session_started, dedup_key,
       cancel_requested_at, progress, after, has_dependents, park_key, park_until, claims_ended
  FROM pgqueue.message_rows;

ALTER TABLE pgqueue.claims RENAME COLUMN attempts TO claim_numbers;
-- PostgreSQL 18 keeps NOT NULL constraints by name, made from the column's when it was added:
-- a fresh install's is claims_claim_numbers_not_null. (Before 18 there are none.)
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_constraint c
                WHERE c.conrelid = 'pgqueue.claims'::regclass AND c.contype = 'n'
                  AND c.conname = 'claims_attempts_not_null') THEN
        ALTER TABLE pgqueue.claims RENAME CONSTRAINT claims_attempts_not_null TO claims_claim_numbers_not_null;
    END IF;
END
$$;
-- 0.21.0 numbered a claim by the attempt it began, which a park that resumes at once gives
-- back: entries its rows no longer hold could look live by the new count. Only the entries
-- of claims the rows hold stay.
WITH kept AS (
    SELECT c.claim_id, array_agg(e.msg_id ORDER BY e.msg_id) AS msg_ids,
           array_agg(e.number ORDER BY e.msg_id) AS claim_numbers
      FROM pgqueue.claims c, unnest(c.msg_ids, c.claim_numbers) AS e(msg_id, number), pgqueue.message_rows m
     WHERE m.msg_id = e.msg_id AND m.state = 'claimed' AND pgqueue._token_claim(m.claim_token) = c.claim_id
     GROUP BY c.claim_id
), trimmed AS (
    UPDATE pgqueue.claims c SET msg_ids = k.msg_ids, claim_numbers = k.claim_numbers
      FROM kept k WHERE c.claim_id = k.claim_id AND c.msg_ids <> k.msg_ids
)
DELETE FROM pgqueue.claims c WHERE NOT EXISTS (SELECT FROM kept k WHERE k.claim_id = c.claim_id);
-- A claim held under the ledger's token goes on as the claim number it was signed for.
UPDATE pgqueue.message_rows m SET claims_ended = m.attempt - 1
 WHERE m.state = 'claimed' AND pgqueue._token_claim(m.claim_token) IS NOT NULL;

CREATE FUNCTION pgqueue._ledger_agrees(token uuid, msg_id bigint, number integer, row_holds boolean,
                                       key_bytes bytea, in_ledger boolean)
RETURNS boolean
LANGUAGE c STABLE PARALLEL SAFE COST 10 AS 'MODULE_PATHNAME', '_ledger_agrees_wrapper';
REVOKE ALL ON FUNCTION pgqueue._ledger_agrees(uuid, bigint, integer, boolean, bytea, boolean) FROM PUBLIC;

-- Fencing with the two-way check, and the ends of a claim counted: sql/claim.sql, finish.sql,
-- park.sql. The redrive starts a message's count past the ledger's; the claims step prunes by
-- the counts: sql/finish.sql, maintenance.sql.

CREATE OR REPLACE FUNCTION pgqueue.pgq_renew(msg_ids bigint[], claim_tokens uuid[], lease interval DEFAULT NULL,
                                  queue text DEFAULT NULL, progress jsonb[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
BEGIN
    IF queue IS NOT NULL THEN
        PERFORM pgqueue._queue(queue);
    END IF;
    PERFORM pgqueue._check_pairs(msg_ids, claim_tokens);
    PERFORM pgqueue._check_lease(lease);
    IF progress IS NOT NULL THEN
        PERFORM pgqueue._check_reports(progress, pg_catalog.cardinality(msg_ids), 'progress');
    END IF;
    -- Only the lease and the progress change, and neither is in an index: a HOT update.
    -- The re-arm pass learns the earliest new lease end at commit (a lease may get shorter).
    RETURN QUERY
    WITH renewed AS (
        UPDATE pgqueue.message_rows m
           SET lease_expires_at = now() + coalesce(lease, q.lease),
               progress = coalesce(held.progress, m.progress)
          FROM unnest(msg_ids, claim_tokens, progress) AS held(id, token, progress), pgqueue.queues q
         WHERE m.msg_id = held.id
           AND CASE WHEN pgqueue._token_claim(held.token) IS NULL THEN m.claim_token = held.token AND m.state = 'claimed'
                    ELSE pgqueue._ledger_agrees(held.token, m.msg_id, m.claims_ended + 1,
                                                m.claim_token = held.token AND m.state = 'claimed',
                                                (SELECT k.key FROM pgqueue.claim_key k ORDER BY k.made_at, k.key LIMIT 1),
                                                EXISTS (SELECT FROM pgqueue.claims c WHERE c.claim_id = pgqueue._token_claim(held.token)))
               END
           AND m.cancel_requested_at IS NULL
           AND q.queue = m.queue AND (queue IS NULL OR m.queue = queue)
        RETURNING m.msg_id, m.lease_expires_at
    ), noted AS (
        SELECT pgqueue._renewed(min(r.lease_expires_at)) FROM renewed r
    )
    SELECT r.msg_id FROM renewed r, noted;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.pgq_nack(
    msg_id bigint,
    claim_token uuid,
    retry_in interval DEFAULT NULL,
    error text DEFAULT NULL,
    queue text DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    h record;
    wait interval;
BEGIN
    IF queue IS NOT NULL THEN
        PERFORM pgqueue._queue(queue);
    END IF;
    PERFORM pgqueue._require(msg_id, 'msg_id');
    PERFORM pgqueue._require(claim_token, 'claim_token');
    PERFORM pgqueue._check_delay(retry_in, 'retry_in');
    SELECT m.msg_id, m.queue, m.priority, m.attempt, q.max_attempts, m.cancel_requested_at INTO h
      FROM pgqueue.message_rows m JOIN pgqueue.queues q ON q.queue = m.queue
     WHERE m.msg_id = msg_id
       AND CASE WHEN pgqueue._token_claim(claim_token) IS NULL THEN m.claim_token = claim_token AND m.state = 'claimed'
                ELSE pgqueue._ledger_agrees(claim_token, m.msg_id, m.claims_ended + 1,
                                            m.claim_token = claim_token AND m.state = 'claimed',
                                            (SELECT k.key FROM pgqueue.claim_key k ORDER BY k.made_at, k.key LIMIT 1),
                                            EXISTS (SELECT FROM pgqueue.claims c WHERE c.claim_id = pgqueue._token_claim(claim_token)))
           END
       AND (queue IS NULL OR m.queue = queue)
       FOR UPDATE OF m;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- A message whose cancel was requested is not retried (_to_history records it cancelled).
    IF h.attempt >= h.max_attempts OR h.cancel_requested_at IS NOT NULL THEN
        PERFORM pgqueue._to_history(ARRAY[msg_id], NULL, 'dead', coalesce(error, 'nacked on the last attempt'));
        RETURN true;
    END IF;
    wait := coalesce(retry_in, pgqueue._backoff(h.attempt));
    UPDATE pgqueue.message_rows m
       SET state = CASE WHEN wait > interval '0' THEN 'delayed' ELSE 'ready' END,
           visible_at = CASE WHEN wait > interval '0' THEN now() + wait END,
           claim_token = NULL, claimed_at = NULL, lease_expires_at = NULL, consumer = NULL,
           session_pid = NULL, session_started = NULL, last_error = coalesce(error, m.last_error),
           claims_ended = m.claims_ended + 1
     WHERE m.msg_id = h.msg_id;
    PERFORM pgqueue._note(h.queue, 1, 'claimed', CASE WHEN wait > interval '0' THEN 'delayed' ELSE 'ready' END,
                          h.priority, h.msg_id, h.msg_id, now() + wait);
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue._rearm_batch(after_msg_id bigint, max_rows integer, queue text DEFAULT NULL)
RETURNS TABLE (rearmed bigint, dead_lettered bigint, last_msg_id bigint, more boolean, first_msg_id bigint,
               next_expiry timestamptz)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET jit = off AS $$
#variable_conflict use_variable
DECLARE
    retry bigint[];
    exhausted bigint[];
    cancelled bigint[];
    window_end bigint;
    window_full boolean;
BEGIN
    SELECT min(w.msg_id), max(w.msg_id), count(*) >= 4 * max_rows, min(w.lease_expires_at)
      INTO first_msg_id, window_end, window_full, next_expiry
      FROM (SELECT m.msg_id, m.lease_expires_at FROM pgqueue.message_rows m
             WHERE m.state = 'claimed' AND m.msg_id > after_msg_id
             ORDER BY m.msg_id LIMIT 4 * max_rows) w;
    SELECT coalesce(array_agg(e.msg_id) FILTER (WHERE NOT e.cancel AND e.attempt < e.max_attempts), '{}'),
           coalesce(array_agg(e.msg_id) FILTER (WHERE NOT e.cancel AND e.attempt >= e.max_attempts), '{}'),
           coalesce(array_agg(e.msg_id) FILTER (WHERE e.cancel), '{}'),
           CASE WHEN count(*) >= max_rows THEN max(e.msg_id) ELSE window_end END,
           count(*) >= max_rows OR window_full
      INTO retry, exhausted, cancelled, last_msg_id, more
      FROM (SELECT m.msg_id, m.attempt, q.max_attempts, m.cancel_requested_at IS NOT NULL AS cancel
              FROM pgqueue.message_rows m JOIN pgqueue.queues q ON q.queue = m.queue
             WHERE m.state = 'claimed' AND m.msg_id > after_msg_id AND m.msg_id <= window_end
               AND m.lease_expires_at <= now()
               AND (queue IS NULL OR m.queue = queue)
             ORDER BY m.msg_id
             LIMIT max_rows
               FOR UPDATE OF m SKIP LOCKED) e;
    WITH back AS (
        UPDATE pgqueue.message_rows m
           SET state = 'ready', claim_token = NULL, claimed_at = NULL, lease_expires_at = NULL,
               consumer = NULL, session_pid = NULL, session_started = NULL, last_error = 'lease expired',
               claims_ended = m.claims_ended + 1
         WHERE m.msg_id = ANY (retry)
        RETURNING m.queue, m.priority, m.msg_id
    )
    SELECT coalesce(sum(n), 0) INTO rearmed
      FROM (SELECT count(*) AS n, pgqueue._note(b.queue, count(*), 'claimed', 'ready', b.priority,
                                                min(b.msg_id), max(b.msg_id))
              FROM back b GROUP BY b.queue, b.priority) r;
    dead_lettered := (SELECT count(*) FROM pgqueue._to_history(
        exhausted, NULL, 'dead', 'lease expired on the last attempt'));
    -- Cancel requested and the holder gone: finished as cancelled, not retried.
    PERFORM pgqueue._to_history(cancelled, NULL, 'cancelled', NULL);
    RETURN NEXT;
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
        RETURNING h.msg_id, h.priority, h.payload, h.headers, h.enqueued_at, h.last_error, h.progress
    )
    -- A message back under its msg_id starts its claim count past every claim of it the
    -- ledger still lists, which would otherwise be live again (the ledger is read whole: it
    -- holds about the claims in flight, and a redrive is rare).
    , listed AS (
        SELECT e.msg_id, max(e.number) AS number
          FROM pgqueue.claims c, unnest(c.msg_ids, c.claim_numbers) AS e(msg_id, number)
         WHERE c.queue = q.queue AND e.msg_id IN (SELECT b.msg_id FROM back b)
         GROUP BY e.msg_id
    )
    , again AS (
        INSERT INTO pgqueue.message_rows (msg_id, queue, state, priority, payload, headers, enqueued_at, last_error,
                                      progress, claims_ended)
        OVERRIDING SYSTEM VALUE
        SELECT b.msg_id, q.queue, 'ready', b.priority, b.payload, b.headers, b.enqueued_at, b.last_error, b.progress,
               coalesce(l.number, 0)
          FROM back b LEFT JOIN listed l ON l.msg_id = b.msg_id
        RETURNING message_rows.msg_id, message_rows.priority
    )
    SELECT coalesce(sum(n), 0) INTO moved
      FROM (SELECT count(*) AS n, pgqueue._note(q.queue, count(*), 'history', 'ready', a.priority,
                                                min(a.msg_id), max(a.msg_id))
              FROM again a GROUP BY a.priority) r;
    RETURN moved;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.pgq_park(
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
                                            m.claim_token = claim_token AND m.state = 'claimed',
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
        PERFORM pgqueue._to_history(ARRAY[msg_id], NULL, 'cancelled', NULL);
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
           attempt = m.attempt - CASE WHEN kept.signalled THEN 1 ELSE 0 END,
           claim_token = NULL, claimed_at = NULL, lease_expires_at = NULL, consumer = NULL,
           session_pid = NULL, session_started = NULL, claims_ended = m.claims_ended + 1,
           headers = pgqueue._park_headers(m.headers, park,
               CASE WHEN kept.signalled THEN pg_catalog.jsonb_build_object(
                   'signal', kept.signal, 'signalled_at', kept.signalled_at, 'resumed_at', now()) END)
     WHERE m.msg_id = h.msg_id;
    PERFORM pgqueue._note(h.queue, 1, 'claimed', 'parked');
    IF kept.signalled THEN
        PERFORM pgqueue._note(h.queue, 1, 'parked', 'ready', h.priority, h.msg_id, h.msg_id);
    END IF;
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue._prune_claims(after_claim_id bigint, max_rows integer)
RETURNS TABLE (looked bigint, pruned bigint, last_claim_id bigint)
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH looked_at AS MATERIALIZED (
        SELECT c.claim_id FROM pgqueue.claims c WHERE c.claim_id > after_claim_id
         ORDER BY c.claim_id LIMIT max_rows
    ), gone AS (
        DELETE FROM pgqueue.claims c USING looked_at l
         WHERE c.claim_id = l.claim_id
           AND NOT EXISTS (SELECT FROM unnest(c.msg_ids, c.claim_numbers) AS e(msg_id, number)
                             JOIN pgqueue.message_rows m ON m.msg_id = e.msg_id
                            WHERE m.claims_ended < e.number)
        RETURNING c.claim_id
    )
    SELECT (SELECT count(*) FROM looked_at), (SELECT count(*) FROM gone), (SELECT max(l.claim_id) FROM looked_at l);
END;


COMMENT ON TABLE pgqueue.claims IS
    'the claim ledger: one row per claim call, naming the messages it took and their claim numbers, until none is held under it';
