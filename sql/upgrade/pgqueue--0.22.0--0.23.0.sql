-- pgqueue 0.22.0 -> 0.23.0.
--
-- The held set, shadowed (step 3b of the write path begins: docs/design/write-path.md). Each
-- database that claims through the claim ledger gets a set in shared memory of the messages
-- claimed through it (src/held.rs), kept at commit and abort, rebuilt from the ledger by the
-- worker, shown in pgqueue.held_set; nothing decides by it yet. The functions that end claims
-- without the library's finish statement (pgq_nack, pgq_park, _rearm_batch, pgq_drop_queue)
-- now note those ends for it; ledger rows inserted around the API make it start over (a
-- statement trigger on pgqueue.claims).
--
-- The claim ledger's rows keep what their call granted (lease, consumer, session), as the
-- message rows still do: NULL in rows written before.
--
-- No table is rewritten; the new columns (no default) and the trigger take an ACCESS
-- EXCLUSIVE lock on pgqueue.claims until the update commits (claims with the ledger on wait
-- for it).

ALTER TABLE pgqueue.claims ADD COLUMN lease_expires_at timestamptz, ADD COLUMN consumer text,
    ADD COLUMN session_pid integer, ADD COLUMN session_started timestamptz;

CREATE FUNCTION pgqueue._held_end(
	"msg_ids" bigint[], /* :: std :: option :: Option < Vec < Option < i64 > > > */
	"numbers" INT[] /* :: std :: option :: Option < Vec < Option < i32 > > > */
) RETURNS INT /* i32 */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_held_end_wrapper';

CREATE FUNCTION pgqueue._held_entries() RETURNS TABLE (
	"msg_id" bigint,  /* i64 */
	"claim_number" INT,  /* i32 */
	"committed" bool,  /* bool */
	"lease_expires_at" timestamp with time zone  /* Option < TimestampWithTimeZone > */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_held_entries_wrapper';

CREATE FUNCTION pgqueue._held_renew(
	"msg_ids" bigint[], /* :: std :: option :: Option < Vec < Option < i64 > > > */
	"numbers" INT[], /* :: std :: option :: Option < Vec < Option < i32 > > > */
	"leases" timestamp with time zone[] /* :: std :: option :: Option < Vec < Option < TimestampWithTimeZone > > > */
) RETURNS INT /* i32 */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_held_renew_wrapper';

CREATE FUNCTION pgqueue._held_forget() RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_held_forget_wrapper';

CREATE FUNCTION pgqueue._held_set() RETURNS TABLE (
	"exact" bool,  /* bool */
	"held" bigint,  /* i64 */
	"capacity" bigint,  /* i64 */
	"unknown_from" bigint,  /* Option < i64 > */
	"unknown_to" bigint,  /* Option < i64 > */
	"overflows" bigint,  /* i64 */
	"rebuilds" bigint,  /* i64 */
	"rebuilds_refused" bigint,  /* i64 */
	"passed_over" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_held_set_wrapper';

CREATE FUNCTION pgqueue._claims_written()
	RETURNS TRIGGER
	LANGUAGE c
	AS 'MODULE_PATHNAME', '_claims_written_wrapper';

REVOKE ALL ON FUNCTION pgqueue._held_end(bigint[], integer[]), pgqueue._held_entries(), pgqueue._held_forget(),
    pgqueue._held_renew(bigint[], integer[], timestamptz[]),
    pgqueue._held_set(), pgqueue._claims_written() FROM PUBLIC;

-- This database's held set (src/held.rs): the messages claimed through the claim ledger, as
-- shared memory knows them. Shadowed for now (the rows decide): exact, or the msg_ids it does
-- not vouch for (unknown_from to unknown_to: after a restart, a prepared transaction, a set
-- that filled); its size and capacity; takes that found it full; the worker's rebuilds from
-- the ledger and those it refused; claims that found their message's last claim still listed
-- (its end's commit not yet applied). No row when the library is not preloaded.
CREATE VIEW pgqueue.held_set AS SELECT * FROM pgqueue._held_set();
COMMENT ON VIEW pgqueue.held_set IS
    'this database''s held set in shared memory (the claims of the claim ledger): exact or not, size, rebuilds';
GRANT SELECT ON pgqueue.held_set TO pgqueue_admin, pg_monitor;
GRANT EXECUTE ON FUNCTION pgqueue._held_set() TO pgqueue_admin, pg_monitor;

-- Claim ledger rows written other than by a claim (a restore's COPY, an operator's INSERT)
-- make this database's held set forget everything at their commit (src/held.rs): it must not
-- vouch that their messages are free.
CREATE TRIGGER claims_written AFTER INSERT ON pgqueue.claims
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue._claims_written();
-- A set left by an earlier instance of the extension in this database knows nothing of it.
SELECT pgqueue._held_forget();

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
    ended integer;
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
     WHERE m.msg_id = h.msg_id
    RETURNING m.claims_ended INTO ended;
    -- The claim's end, for the held set at commit (claims of the ledger's tokens only).
    PERFORM pgqueue._held_end(ARRAY[h.msg_id], ARRAY[ended]) WHERE pgqueue._token_claim(claim_token) IS NOT NULL;
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
        RETURNING m.queue, m.priority, m.msg_id, m.claims_ended
    ), ended AS (
        -- The claims' ends, for the held set at commit.
        SELECT pgqueue._held_end(array_agg(b.msg_id), array_agg(b.claims_ended)) FROM back b
    )
    SELECT coalesce(sum(n), 0) INTO rearmed
      FROM (SELECT count(*) AS n, pgqueue._note(b.queue, count(*), 'claimed', 'ready', b.priority,
                                                min(b.msg_id), max(b.msg_id))
              FROM back b GROUP BY b.queue, b.priority) r, ended;
    dead_lettered := (SELECT count(*) FROM pgqueue._to_history(
        exhausted, NULL, 'dead', 'lease expired on the last attempt'));
    -- Cancel requested and the holder gone: finished as cancelled, not retried.
    PERFORM pgqueue._to_history(cancelled, NULL, 'cancelled', NULL);
    RETURN NEXT;
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

CREATE OR REPLACE FUNCTION pgqueue.pgq_drop_queue(queue text, force boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '5s' AS $$
DECLARE
    in_flight bigint;
    ended integer;
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
    SELECT count(*) INTO in_flight FROM pgqueue.message_rows m
     WHERE m.queue = pgq_drop_queue.queue AND m.state = 'claimed';
    IF in_flight > 0 AND NOT force THEN
        RAISE EXCEPTION 'pgqueue: queue "%" has % claimed messages', queue, in_flight
            USING ERRCODE = 'object_in_use',
                  HINT = 'Wait for the consumers to finish, or pass force => true.';
    END IF;
    WITH gone AS (
        DELETE FROM pgqueue.message_rows m WHERE m.queue = pgq_drop_queue.queue
        RETURNING m.msg_id, m.has_dependents, m.after IS NOT NULL AS child,
                  CASE WHEN m.state = 'claimed' THEN m.claims_ended + 1 END AS number
    )
    -- Claims ended with their messages: for the held set at commit.
    SELECT array_agg(g.msg_id) FILTER (WHERE g.has_dependents), array_agg(g.msg_id) FILTER (WHERE g.child),
           pgqueue._held_end(array_agg(g.msg_id) FILTER (WHERE g.number IS NOT NULL),
                             array_agg(g.number) FILTER (WHERE g.number IS NOT NULL))
      INTO parents, children, ended FROM gone g;
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

-- Renewals, and leases ended by a session's exit, are noted for the held set.
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
    -- The re-arm pass learns the earliest new lease end at commit (a lease may get shorter),
    -- and the held set the new leases of the ledger's claims.
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
        RETURNING m.msg_id, m.lease_expires_at, m.claims_ended + 1 AS number,
                  pgqueue._token_claim(m.claim_token) IS NOT NULL AS ledger
    ), noted AS (
        SELECT pgqueue._renewed(min(r.lease_expires_at)),
               pgqueue._held_renew(array_agg(r.msg_id) FILTER (WHERE r.ledger), array_agg(r.number) FILTER (WHERE r.ledger),
                                   array_agg(r.lease_expires_at) FILTER (WHERE r.ledger))
          FROM renewed r
    )
    SELECT r.msg_id FROM renewed r, noted;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue._expire_orphaned_claims() RETURNS bigint
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH alive AS MATERIALIZED (
        SELECT a.pid, a.backend_start FROM pg_stat_get_activity(NULL) a
         WHERE a.datid = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
    ), orphaned AS (
        SELECT m.msg_id FROM pgqueue.message_rows m
         WHERE m.session_pid IS NOT NULL AND m.lease_expires_at > now()
           AND NOT EXISTS (SELECT FROM alive a
                            WHERE a.pid = m.session_pid AND a.backend_start = m.session_started)
           FOR UPDATE OF m SKIP LOCKED
    ), expired AS (
        UPDATE pgqueue.message_rows m SET lease_expires_at = now()
          FROM orphaned o WHERE m.msg_id = o.msg_id
        RETURNING m.msg_id, m.claims_ended + 1 AS number, m.lease_expires_at
    )
    SELECT coalesce(pgqueue._held_renew(array_agg(e.msg_id), array_agg(e.number), array_agg(e.lease_expires_at)), 0)::bigint
      FROM expired e;
END;
