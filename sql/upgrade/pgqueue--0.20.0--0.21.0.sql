-- pgqueue 0.20.0 -> 0.21.0.
--
-- The claim ledger (step 2 of the write path, docs/design/write-path.md): with the new setting
-- pgqueue.claim_ledger on (off by default), every claim call writes a row of pgqueue.claims,
-- and the tokens it hands out name that row (version-8 UUIDs signed with the new
-- pgqueue.claim_key). The message rows still decide who holds a message;
-- renew, ack, nack, fail and park check that the ledger vouches for each claim they accept
-- (XX000 where it does not). Claims in flight during the update keep their tokens (random
-- ones, which the ledger did not issue): they are checked against the row alone, as before.
-- The tick deletes ledger rows none of whose messages is held under them (step "claims",
-- counted in worker_stats). No row is rewritten; no lock beyond the new objects'.

-- The claim ledger (docs/design/write-path.md, step 2), written while pgqueue.claim_ledger is
-- on: one row per claim call, naming the messages it took and the attempt it took each at.
-- Its tokens name the row and carry a MAC under pgqueue.claim_key, so fencing finds the row by
-- its key. The rows above still decide who holds a message; fencing checks that the ledger
-- vouches for every claim they hold under such a token (XX000 where it does not), so that a
-- later release can stop writing them. The tick deletes a row once none of its messages is
-- held under it. Ids fit 48 bits (the token's).
CREATE TABLE pgqueue.claims (
    claim_id   bigint GENERATED ALWAYS AS IDENTITY (MAXVALUE 281474976710655) PRIMARY KEY,
    queue      text NOT NULL,
    msg_ids    bigint[] NOT NULL,   -- ascending
    attempts   integer[] NOT NULL,  -- beside msg_ids: the attempt each was claimed at
    claimed_at timestamptz NOT NULL,
    CONSTRAINT claims_shape CHECK (pg_catalog.cardinality(msg_ids) >= 1
                                   AND pg_catalog.cardinality(msg_ids) = pg_catalog.cardinality(attempts))
);

-- The installation's secret for claim tokens (16 random bytes), readable by its owner only.
-- The oldest row is the key: a restore adds the dumped key, older than the one its CREATE
-- EXTENSION made, so tokens handed out before the dump still verify.
CREATE TABLE pgqueue.claim_key (
    key     bytea NOT NULL CONSTRAINT claim_key_length CHECK (pg_catalog.octet_length(key) = 16),
    made_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO pgqueue.claim_key (key)
VALUES (pg_catalog.substr(pg_catalog.sha256(pg_catalog.uuid_send(pg_catalog.gen_random_uuid())
                                            || pg_catalog.uuid_send(pg_catalog.gen_random_uuid())), 1, 16));

SELECT pg_catalog.pg_extension_config_dump('pgqueue.claims', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.claims_claim_id_seq', '');
-- The key in use only (see pgqueue.claim_key), so that dumps of restores do not pile keys up.
SELECT pg_catalog.pg_extension_config_dump('pgqueue.claim_key',
    'WHERE made_at = (SELECT pg_catalog.min(k.made_at) FROM pgqueue.claim_key k)');

-- Filled, then given their default (as a fresh install has them: no "missing value").
ALTER TABLE pgqueue.worker_state ADD COLUMN claims_failures bigint, ADD COLUMN claims_pruned bigint;
UPDATE pgqueue.worker_state SET claims_failures = 0, claims_pruned = 0;
ALTER TABLE pgqueue.worker_state
    ALTER COLUMN claims_failures SET DEFAULT 0, ALTER COLUMN claims_failures SET NOT NULL,
    ALTER COLUMN claims_pruned SET DEFAULT 0, ALTER COLUMN claims_pruned SET NOT NULL;

CREATE FUNCTION pgqueue._claim_token(key_bytes bytea, claim_id bigint, msg_id bigint, attempt integer)
RETURNS uuid
LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', '_claim_token_wrapper';
CREATE FUNCTION pgqueue._token_claim(token uuid) RETURNS bigint
LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', '_token_claim_wrapper';
CREATE FUNCTION pgqueue._vouched(token uuid, msg_id bigint, attempt integer, key_bytes bytea, in_ledger boolean)
RETURNS boolean
LANGUAGE c STABLE PARALLEL SAFE COST 10 AS 'MODULE_PATHNAME', '_vouched_wrapper';

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
           AND CASE WHEN m.claim_token IS DISTINCT FROM held.token OR m.state <> 'claimed' THEN false
                    WHEN pgqueue._token_claim(held.token) IS NULL THEN true
                    ELSE pgqueue._vouched(held.token, m.msg_id, m.attempt,
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
       AND CASE WHEN m.claim_token IS DISTINCT FROM claim_token OR m.state <> 'claimed' THEN false
                WHEN pgqueue._token_claim(claim_token) IS NULL THEN true
                ELSE pgqueue._vouched(claim_token, m.msg_id, m.attempt,
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
           session_pid = NULL, session_started = NULL, last_error = coalesce(error, m.last_error)
     WHERE m.msg_id = h.msg_id;
    PERFORM pgqueue._note(h.queue, 1, 'claimed', CASE WHEN wait > interval '0' THEN 'delayed' ELSE 'ready' END,
                          h.priority, h.msg_id, h.msg_id, now() + wait);
    RETURN true;
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
       AND CASE WHEN m.claim_token IS DISTINCT FROM claim_token OR m.state <> 'claimed' THEN false
                WHEN pgqueue._token_claim(claim_token) IS NULL THEN true
                ELSE pgqueue._vouched(claim_token, m.msg_id, m.attempt,
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
           session_pid = NULL, session_started = NULL,
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

-- Step "claims": see sql/maintenance.sql.
CREATE FUNCTION pgqueue._prune_claims(after_claim_id bigint, max_rows integer)
RETURNS TABLE (looked bigint, pruned bigint, last_claim_id bigint)
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH looked_at AS MATERIALIZED (
        SELECT c.claim_id FROM pgqueue.claims c WHERE c.claim_id > after_claim_id
         ORDER BY c.claim_id LIMIT max_rows
    ), gone AS (
        DELETE FROM pgqueue.claims c USING looked_at l
         WHERE c.claim_id = l.claim_id
           AND NOT EXISTS (SELECT FROM pgqueue.message_rows m
                            WHERE m.msg_id = ANY (c.msg_ids)
                              AND pgqueue._token_claim(m.claim_token) = c.claim_id)
        RETURNING c.claim_id
    )
    SELECT (SELECT count(*) FROM looked_at), (SELECT count(*) FROM gone), (SELECT max(l.claim_id) FROM looked_at l);
END;

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
        park_failures = park_failures + coalesce((counts->>'park_failures')::bigint, 0),
        park_timeouts = park_timeouts + coalesce((counts->>'park_timeouts')::bigint, 0),
        claims_failures = claims_failures + coalesce((counts->>'claims_failures')::bigint, 0),
        claims_pruned = claims_pruned + coalesce((counts->>'claims_pruned')::bigint, 0),
        last_error = coalesce(counts->>'error', last_error),
        last_error_at = CASE WHEN counts ? 'error' THEN now() ELSE last_error_at END;
END;

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
       w.rollup_failures, w.last_rollup_at, w.dependency_failures, w.released, w.park_failures, w.park_timeouts,
       w.claims_failures, w.claims_pruned
  FROM pgqueue.worker_state w;

REVOKE ALL ON FUNCTION
    pgqueue._claim_token(bytea, bigint, bigint, integer),
    pgqueue._token_claim(uuid),
    pgqueue._vouched(uuid, bigint, integer, bytea, boolean),
    pgqueue._prune_claims(bigint, integer)
FROM PUBLIC;
REVOKE ALL ON pgqueue.claims, pgqueue.claim_key FROM PUBLIC;
GRANT SELECT ON pgqueue.claims TO pgqueue_admin;

COMMENT ON TABLE pgqueue.claims IS
    'the claim ledger: one row per claim call, naming the messages it took and their attempts, until none is held under it';
COMMENT ON TABLE pgqueue.claim_key IS
    'the secret claim tokens are signed with (the oldest row); only its owner reads it';
