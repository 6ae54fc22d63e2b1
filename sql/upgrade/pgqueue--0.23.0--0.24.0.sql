-- pgqueue 0.23.0 -> 0.24.0.
--
-- pgqueue.messages shows the claims of the claim ledger (step 3b of the write path:
-- docs/design/write-path.md): a message whose row is 'ready' but that a live ledger entry
-- holds (the entry numbered claims_ended + 1) is shown claimed, with that claim's attempt,
-- token, time, consumer, session and lease: with pgqueue.claim_ledger on, this release's
-- claims write only the ledger and leave the row so. The view stops being updatable (the
-- library writes pgqueue.message_rows). pgqueue.jobs and pgqueue.queue_stats read the view,
-- and pgq_result and pgq_graph now read their states from it.
--
-- Fencing and the calls that end a claim take such a claim (the ledger decides for a 'ready'
-- row): pgq_renew, pgq_nack, pgq_park and pgq_cancel are replaced (pgq_ack, pgq_fail and
-- pgq_ack_claim are the library's). The rows' CHECK (pgqueue._message_ok, the library's)
-- allows a cancel request on a 'ready' row.
--
-- The re-arm pass (worker and pgq_rearm) and the orphans step find such claims too: a new
-- batch function walks the ledger by claim_id (_rearm_ledger_batch; what both batch functions
-- do with the claims they found is now _release_expired), and a partial index on the
-- ledger's session-bound rows (claims_session_idx) serves the orphans step.
--
-- The counts and checks take such claims as claimed, through one view of the claims only the
-- ledger holds (_ledger_held, read by queue through a new index of the ledger,
-- claims_queue_idx): the exact depths (_depth), the overview's oldest ready message and
-- expired claims, the tick's check of the claim hints (_claimable), and pgq_drop_queue's
-- refusal while messages are claimed.
--
-- Views, functions and two indexes: no table of queue data is locked; the indexes take a
-- SHARE lock on pgqueue.claims (claims through the ledger wait for it; the ledger holds about
-- one row per claim call in flight).

CREATE INDEX claims_queue_idx ON pgqueue.claims (queue, claim_id);

CREATE VIEW pgqueue._ledger_held AS
SELECT c.queue, e.msg_id, e.number, coalesce(m.lease_expires_at, c.lease_expires_at) AS lease_expires_at, c.claim_id
  FROM pgqueue.claims c
 CROSS JOIN LATERAL unnest(c.msg_ids, c.claim_numbers) AS e(msg_id, number)
 CROSS JOIN LATERAL (SELECT r.lease_expires_at FROM pgqueue.message_rows r
                      WHERE r.msg_id = e.msg_id AND pg_catalog.texteq(r.state, 'ready') AND r.claims_ended + 1 = e.number
                      LIMIT 1) m;
REVOKE ALL ON pgqueue._ledger_held FROM PUBLIC;
COMMENT ON VIEW pgqueue._ledger_held IS
    'internal: the messages that only the claim ledger holds (rows left ready by their claim), with the lease in force; read it by queue';

CREATE OR REPLACE VIEW pgqueue.messages AS
SELECT r.msg_id, r.queue, CASE WHEN e.claim_id IS NULL THEN r.state ELSE 'claimed' END AS state, r.priority,
       r.attempt + (e.claim_id IS NOT NULL)::integer AS attempt, r.payload, r.headers, r.enqueued_at, r.visible_at,
       coalesce(r.claim_token,
                pgqueue._claim_token((SELECT k.key FROM pgqueue.claim_key k ORDER BY k.made_at, k.key LIMIT 1),
                                     e.claim_id, r.msg_id, e.number)) AS claim_token,
       coalesce(r.claimed_at, e.claimed_at) AS claimed_at, coalesce(r.consumer, e.consumer) AS consumer,
       coalesce(r.lease_expires_at, e.lease_expires_at) AS lease_expires_at, r.last_error,
       coalesce(r.session_pid, e.session_pid) AS session_pid,
       coalesce(r.session_started, e.session_started) AS session_started, r.dedup_key,
       r.cancel_requested_at, r.progress, r.after, r.has_dependents, r.park_key, r.park_until, r.claims_ended
  FROM pgqueue.message_rows r
  LEFT JOIN (SELECT c.claim_id, c.queue, u.msg_id, u.number, c.claimed_at, c.lease_expires_at, c.consumer, c.session_pid,
                    c.session_started
               FROM pgqueue.claims c, unnest(c.msg_ids, c.claim_numbers) AS u(msg_id, number)) e
         ON r.state = 'ready' AND e.queue = r.queue AND e.msg_id = r.msg_id AND e.number = r.claims_ended + 1;

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
       c.pending,
       c.parked,
       -- Outcomes kept in the history (its retention): counted only when selected, and each
       -- count reads that part of the queue's history.
       (SELECT count(*) FROM pgqueue.history h WHERE h.queue = q.queue AND h.outcome = 'completed') AS completed,
       (SELECT count(*) FROM pgqueue.history h WHERE h.queue = q.queue AND h.outcome = 'cancelled') AS cancelled
  FROM pgqueue.queues q
 CROSS JOIN LATERAL (
       SELECT count(*) FILTER (WHERE m.state = 'ready') AS ready,
              count(*) FILTER (WHERE m.state = 'delayed') AS delayed,
              count(*) FILTER (WHERE m.state = 'claimed') AS claimed,
              count(*) FILTER (WHERE m.state = 'claimed' AND m.lease_expires_at <= now()) AS expired_claims,
              min(m.enqueued_at) FILTER (WHERE m.state = 'ready') AS oldest_ready,
              min(m.lease_expires_at) FILTER (WHERE m.state = 'claimed' AND m.lease_expires_at <= now())
                  AS oldest_expired_lease,
              count(*) FILTER (WHERE m.state = 'pending') AS pending,
              count(*) FILTER (WHERE m.state = 'parked') AS parked
         FROM pgqueue.messages m
        WHERE m.queue = q.queue) c;

CREATE OR REPLACE VIEW pgqueue.jobs AS
SELECT m.msg_id, m.queue, m.state, m.priority, m.attempt, m.payload, m.headers, m.enqueued_at, m.visible_at,
       m.claimed_at, m.consumer, m.lease_expires_at, NULL::timestamptz AS finished_at, m.last_error, m.dedup_key,
       m.progress, NULL::jsonb AS result, m.after, m.park_key, m.park_until
  FROM pgqueue.messages m
 UNION ALL
SELECT h.msg_id, h.queue, h.outcome, h.priority, h.attempt, h.payload, h.headers, h.enqueued_at, NULL, NULL,
       NULL, NULL, h.finished_at, h.last_error, NULL, h.progress, h.result, h.after, NULL, NULL
  FROM pgqueue.history h;

-- The claim's picks pass over rows the held set lists as held without locking them (the
-- library's; a pick that locked them held up their holders' acks until it committed).
CREATE FUNCTION pgqueue._take_free(
	"queue" TEXT, /* & str */
	"priority" smallint, /* i16 */
	"epoch" bigint, /* Option < i64 > */
	"msg_id" bigint, /* i64 */
	"number" INT /* i32 */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE COST 1000
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_take_free_wrapper';

CREATE FUNCTION pgqueue._held_free(
	"queue" TEXT, /* & str */
	"priority" smallint, /* i16 */
	"msg_id" bigint, /* i64 */
	"number" INT /* i32 */
) RETURNS bool /* bool */
STRICT VOLATILE PARALLEL UNSAFE COST 1000
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_held_free_wrapper';

REVOKE ALL ON FUNCTION pgqueue._take_free(text, smallint, bigint, bigint, integer),
    pgqueue._held_free(text, smallint, bigint, integer) FROM PUBLIC;

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
                                                CASE WHEN m.state <> 'ready' THEN m.claim_token = held.token AND m.state = 'claimed' END,
                                                (SELECT k.key FROM pgqueue.claim_key k ORDER BY k.made_at, k.key LIMIT 1),
                                                EXISTS (SELECT FROM pgqueue.claims c WHERE c.claim_id = pgqueue._token_claim(held.token)))
               END
           AND m.cancel_requested_at IS NULL
           AND q.queue = m.queue AND (queue IS NULL OR m.queue = queue)
        RETURNING m.msg_id, m.lease_expires_at, m.claims_ended + 1 AS number,
                  pgqueue._token_claim(held.token) IS NOT NULL AS ledger
    ), noted AS (
        SELECT pgqueue._renewed(min(r.lease_expires_at)),
               pgqueue._held_renew(array_agg(r.msg_id) FILTER (WHERE r.ledger), array_agg(r.number) FILTER (WHERE r.ledger),
                                   array_agg(r.lease_expires_at) FILTER (WHERE r.ledger))
          FROM renewed r
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
    ended integer;
BEGIN
    IF queue IS NOT NULL THEN
        PERFORM pgqueue._queue(queue);
    END IF;
    PERFORM pgqueue._require(msg_id, 'msg_id');
    PERFORM pgqueue._require(claim_token, 'claim_token');
    PERFORM pgqueue._check_delay(retry_in, 'retry_in');
    -- A 'ready' row the fence holds is as a claim through the ledger left it: that claim's
    -- attempt is one further than the row counts.
    SELECT m.msg_id, m.queue, m.priority, m.attempt + (m.state = 'ready')::integer AS attempt, q.max_attempts,
           m.cancel_requested_at INTO h
      FROM pgqueue.message_rows m JOIN pgqueue.queues q ON q.queue = m.queue
     WHERE m.msg_id = msg_id
       AND CASE WHEN pgqueue._token_claim(claim_token) IS NULL THEN m.claim_token = claim_token AND m.state = 'claimed'
                ELSE pgqueue._ledger_agrees(claim_token, m.msg_id, m.claims_ended + 1,
                                            CASE WHEN m.state <> 'ready' THEN m.claim_token = claim_token AND m.state = 'claimed' END,
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
        PERFORM pgqueue._to_history(ARRAY[msg_id], ARRAY[claim_token], 'dead', coalesce(error, 'nacked on the last attempt'));
        RETURN true;
    END IF;
    wait := coalesce(retry_in, pgqueue._backoff(h.attempt));
    UPDATE pgqueue.message_rows m
       SET state = CASE WHEN wait > interval '0' THEN 'delayed' ELSE 'ready' END,
           visible_at = CASE WHEN wait > interval '0' THEN now() + wait END, attempt = h.attempt,
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

CREATE OR REPLACE FUNCTION pgqueue.pgq_cancel(msg_ids bigint[], reason text DEFAULT NULL, queue text DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    waiting bigint[];
    running bigint[];
BEGIN
    IF queue IS NOT NULL THEN
        PERFORM pgqueue._queue(queue);
    END IF;
    PERFORM pgqueue._check_ids(msg_ids, 'msg_ids');
    -- Locked in msg_id order (overlapping cancels cannot deadlock), after any claim or finish
    -- under way: its outcome decides what is left to cancel.
    PERFORM FROM pgqueue.message_rows m
      WHERE m.msg_id = ANY (msg_ids) AND (queue IS NULL OR m.queue = queue)
      ORDER BY m.msg_id
        FOR UPDATE OF m;
    -- Then read, in a statement of its own: in READ COMMITTED its snapshot follows the locks,
    -- so it sees the ledger row of a claim this waited for (a claim through the ledger may
    -- leave the row as it was, step 3b of the write path, and the lock's re-check of an
    -- unchanged row reads nothing else anew). A 'ready' row is held if a live entry of the
    -- claim ledger holds it; cancels are rare, so the queue's ledger rows are read.
    SELECT coalesce(array_agg(l.msg_id) FILTER (WHERE NOT l.held), '{}'),
           coalesce(array_agg(l.msg_id) FILTER (WHERE l.held AND l.cancel_requested_at IS NULL), '{}')
      INTO waiting, running
      FROM (SELECT m.msg_id, m.cancel_requested_at,
                   m.state = 'claimed'
                   OR (m.state = 'ready'
                       AND EXISTS (SELECT FROM pgqueue._ledger_held h WHERE h.queue = m.queue AND h.msg_id = m.msg_id)) AS held
              FROM pgqueue.message_rows m
             WHERE m.msg_id = ANY (msg_ids) AND (queue IS NULL OR m.queue = queue)) l;
    UPDATE pgqueue.message_rows m SET cancel_requested_at = now(), last_error = coalesce(reason, m.last_error)
     WHERE m.msg_id = ANY (running);
    RETURN QUERY
    SELECT c.id FROM (SELECT pgqueue._to_history(waiting, NULL, 'cancelled', reason) AS id
                      UNION ALL SELECT unnest(running)) c
     ORDER BY c.id;
END
$$;

-- A message's state and what it reported: its progress while waiting or claimed (the latest
-- its holders stored with pgq_renew), and once finished (finished_at set) its outcome as
-- state, its result (pgq_ack) and last error. No row: no such message (of queue, if given),
-- or its history was pruned. With wait, a message not finished yet is waited for, until the
-- commit that finishes it or for at most wait; then the row is read as it is (state still
-- 'ready', 'delayed' or 'claimed' when wait ran out).
CREATE OR REPLACE FUNCTION pgqueue.pgq_result(msg_id bigint, wait interval DEFAULT '0', queue text DEFAULT NULL)
RETURNS TABLE (
    state text,
    attempt integer,
    result jsonb,
    progress jsonb,
    last_error text,
    enqueued_at timestamptz,
    finished_at timestamptz
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
BEGIN
    IF queue IS NOT NULL THEN
        PERFORM pgqueue._queue(queue);
    END IF;
    PERFORM pgqueue._require(msg_id, 'msg_id');
    IF pgqueue._check_wait(wait, 'pgq_result') > interval '0' THEN
        PERFORM pgqueue._await_outcome(msg_id, wait, queue);
    END IF;
    -- The view, not its rows: a claim through the claim ledger leaves its row 'ready'.
    RETURN QUERY
    SELECT m.state, m.attempt, NULL::jsonb, m.progress, m.last_error, m.enqueued_at, NULL::timestamptz
      FROM pgqueue.messages m WHERE m.msg_id = msg_id AND (queue IS NULL OR m.queue = queue)
     UNION ALL
    SELECT h.outcome, h.attempt, h.result, h.progress, h.last_error, h.enqueued_at, h.finished_at
      FROM pgqueue.history h WHERE h.msg_id = msg_id AND (queue IS NULL OR h.queue = queue)
     LIMIT 1;
END
$$;

-- A message's dependencies, one row each (id: its msg_id): itself ('message'), its parents ('parent', from its `after`, as
-- they are now: a state while in the queue, an outcome once finished, NULL once pruned) and
-- the children that wait or waited for it and are still in the queue ('child'). A finished
-- child is found from its own side. No rows: no such message.
CREATE OR REPLACE FUNCTION pgqueue.pgq_graph(msg_id bigint)
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

CREATE INDEX claims_session_idx ON pgqueue.claims (session_pid) WHERE session_pid IS NOT NULL;

CREATE FUNCTION pgqueue._release_expired(retry bigint[], exhausted bigint[], exhausted_tokens uuid[],
                                         cancelled bigint[], cancelled_tokens uuid[],
                                         OUT rearmed bigint, OUT dead_lettered bigint)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    WITH back AS (
        UPDATE pgqueue.message_rows m
           SET state = 'ready', attempt = m.attempt + (m.state = 'ready')::integer, claim_token = NULL,
               claimed_at = NULL, lease_expires_at = NULL, consumer = NULL, session_pid = NULL,
               session_started = NULL, last_error = 'lease expired', claims_ended = m.claims_ended + 1
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
        exhausted, exhausted_tokens, 'dead', 'lease expired on the last attempt'));
    -- Cancel requested and the holder gone: finished as cancelled, not retried.
    PERFORM pgqueue._to_history(cancelled, cancelled_tokens, 'cancelled', NULL);
END
$$;
REVOKE ALL ON FUNCTION pgqueue._release_expired(bigint[], bigint[], uuid[], bigint[], uuid[]) FROM PUBLIC;

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
    SELECT r.rearmed, r.dead_lettered INTO rearmed, dead_lettered
      FROM pgqueue._release_expired(retry, exhausted, NULL, cancelled, NULL) r;
    RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue._rearm_ledger_batch(after_claim_id bigint, max_rows integer, queue text DEFAULT NULL)
RETURNS TABLE (rearmed bigint, dead_lettered bigint, last_claim_id bigint, more boolean, next_expiry timestamptz)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET jit = off SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    retry bigint[];
    exhausted bigint[];
    exhausted_tokens uuid[];
    cancelled bigint[];
    cancelled_tokens uuid[];
BEGIN
    SELECT max(w.claim_id) FILTER (WHERE w.earlier < max_rows),
           count(*) FILTER (WHERE w.earlier >= max_rows) > 0 OR count(*) >= max_rows
      INTO last_claim_id, more
      FROM (SELECT c.claim_id,
                   coalesce(sum(pg_catalog.cardinality(c.msg_ids))
                                OVER (ORDER BY c.claim_id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS earlier
              FROM pgqueue.claims c WHERE c.claim_id > after_claim_id AND (queue IS NULL OR c.queue = queue)
             ORDER BY c.claim_id LIMIT max_rows) w;
    rearmed := 0;
    dead_lettered := 0;
    IF last_claim_id IS NULL THEN
        more := false;
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT coalesce(array_agg(e.msg_id) FILTER (WHERE NOT e.cancel AND e.attempt < e.max_attempts), '{}'),
           coalesce(array_agg(e.msg_id) FILTER (WHERE NOT e.cancel AND e.attempt >= e.max_attempts), '{}'),
           coalesce(array_agg(e.token) FILTER (WHERE NOT e.cancel AND e.attempt >= e.max_attempts), '{}'),
           coalesce(array_agg(e.msg_id) FILTER (WHERE e.cancel), '{}'),
           coalesce(array_agg(e.token) FILTER (WHERE e.cancel), '{}')
      INTO retry, exhausted, exhausted_tokens, cancelled, cancelled_tokens
      FROM (SELECT m.msg_id, m.attempt + 1 AS attempt, q.max_attempts, m.cancel,
                   pgqueue._claim_token((SELECT k.key FROM pgqueue.claim_key k ORDER BY k.made_at, k.key LIMIT 1),
                                        c.claim_id, m.msg_id, l.number) AS token
              FROM pgqueue.claims c
             CROSS JOIN LATERAL unnest(c.msg_ids, c.claim_numbers) AS l(msg_id, number)
             -- Each message looked up from its entry (as in _ledger_held), and locked there.
             CROSS JOIN LATERAL (SELECT r.msg_id, r.attempt, r.queue, r.cancel_requested_at IS NOT NULL AS cancel
                                   FROM pgqueue.message_rows r
                                  WHERE r.msg_id = l.msg_id AND pg_catalog.texteq(r.state, 'ready') AND r.claims_ended + 1 = l.number
                                    AND coalesce(r.lease_expires_at, c.lease_expires_at) <= now()
                                  LIMIT 1
                                    FOR UPDATE SKIP LOCKED) m
              JOIN pgqueue.queues q ON q.queue = m.queue
             WHERE c.claim_id > after_claim_id AND c.claim_id <= last_claim_id
               AND (queue IS NULL OR c.queue = queue)) e;
    SELECT r.rearmed, r.dead_lettered INTO rearmed, dead_lettered
      FROM pgqueue._release_expired(retry, exhausted, exhausted_tokens, cancelled, cancelled_tokens) r;
    -- After the release, which ended what it re-armed: what is left live, an ended lease that
    -- another session held locked included (the next pass then comes at once).
    SELECT min(h.lease_expires_at) INTO next_expiry
      FROM pgqueue._ledger_held h
     WHERE h.claim_id > after_claim_id AND h.claim_id <= last_claim_id AND (queue IS NULL OR h.queue = queue);
    RETURN NEXT;
END
$$;
REVOKE ALL ON FUNCTION pgqueue._rearm_ledger_batch(bigint, integer, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgqueue.pgq_rearm(max_rows integer DEFAULT 5000, queue text DEFAULT NULL)
RETURNS TABLE (rearmed bigint, dead_lettered bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    cursor_at bigint := 0;
    b record;
BEGIN
    IF pgqueue._require(pgq_rearm.max_rows, 'max_rows') NOT BETWEEN 1 AND 1000000 THEN
        PERFORM pgqueue._invalid('max_rows', pg_catalog.format('%s is not between 1 and 1000000', pgq_rearm.max_rows));
    END IF;
    IF pgq_rearm.queue IS NOT NULL THEN
        PERFORM pgqueue._queue(pgq_rearm.queue);
    END IF;
    rearmed := 0;
    dead_lettered := 0;
    -- Windows until max_rows are done or every in-flight row was looked at.
    LOOP
        SELECT * INTO b FROM pgqueue._rearm_batch(cursor_at, pgq_rearm.max_rows - (rearmed + dead_lettered)::integer,
                                                  pgq_rearm.queue);
        rearmed := rearmed + b.rearmed;
        dead_lettered := dead_lettered + b.dead_lettered;
        EXIT WHEN NOT b.more OR rearmed + dead_lettered >= pgq_rearm.max_rows OR b.last_msg_id IS NULL;
        cursor_at := b.last_msg_id;
    END LOOP;
    -- Then the claims only the claim ledger holds, by claim_id.
    cursor_at := 0;
    WHILE rearmed + dead_lettered < pgq_rearm.max_rows LOOP
        SELECT * INTO b FROM pgqueue._rearm_ledger_batch(cursor_at,
                                                         pgq_rearm.max_rows - (rearmed + dead_lettered)::integer,
                                                         pgq_rearm.queue);
        rearmed := rearmed + b.rearmed;
        dead_lettered := dead_lettered + b.dead_lettered;
        EXIT WHEN NOT b.more OR b.last_claim_id IS NULL;
        cursor_at := b.last_claim_id;
    END LOOP;
    RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue._expire_orphaned_claims() RETURNS bigint
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp SET jit = off SET enable_seqscan = off
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
    ), orphaned_in_ledger AS (
        -- Each message looked up from its entry (as in _ledger_held), and locked there.
        SELECT m.msg_id FROM pgqueue.claims c
         CROSS JOIN LATERAL unnest(c.msg_ids, c.claim_numbers) AS e(msg_id, number)
         CROSS JOIN LATERAL (SELECT r.msg_id FROM pgqueue.message_rows r
                              WHERE r.msg_id = e.msg_id AND pg_catalog.texteq(r.state, 'ready') AND r.claims_ended + 1 = e.number
                                AND coalesce(r.lease_expires_at, c.lease_expires_at) > now()
                              LIMIT 1
                                FOR UPDATE SKIP LOCKED) m
         WHERE c.session_pid IS NOT NULL
           AND NOT EXISTS (SELECT FROM alive a
                            WHERE a.pid = c.session_pid AND a.backend_start = c.session_started)
    ), expired AS (
        UPDATE pgqueue.message_rows m SET lease_expires_at = now()
          FROM (SELECT o.msg_id FROM orphaned o UNION ALL SELECT o.msg_id FROM orphaned_in_ledger o) o
         WHERE m.msg_id = o.msg_id
        RETURNING m.msg_id, m.claims_ended + 1 AS number, m.lease_expires_at
    )
    SELECT coalesce(pgqueue._held_renew(array_agg(e.msg_id), array_agg(e.number), array_agg(e.lease_expires_at)), 0)::bigint
      FROM expired e;
END;

-- The claims step's cursor stops before the rows claimed in the last 10 seconds that are still
-- live (new, most end within a tick): passed, they stayed until the prune cadence, and every
-- read of the ledger by queue (the tick's hint check) read them.
CREATE OR REPLACE FUNCTION pgqueue._prune_claims(after_claim_id bigint, max_rows integer)
RETURNS TABLE (looked bigint, pruned bigint, last_claim_id bigint)
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH looked_at AS MATERIALIZED (
        SELECT c.claim_id, c.claimed_at FROM pgqueue.claims c WHERE c.claim_id > after_claim_id
         ORDER BY c.claim_id LIMIT max_rows
    ), gone AS (
        DELETE FROM pgqueue.claims c USING looked_at l
         WHERE c.claim_id = l.claim_id
           AND NOT EXISTS (SELECT FROM unnest(c.msg_ids, c.claim_numbers) AS e(msg_id, number)
                             JOIN pgqueue.message_rows m ON m.msg_id = e.msg_id
                            WHERE m.claims_ended < e.number)
        RETURNING c.claim_id
    )
    SELECT (SELECT count(*) FROM looked_at), (SELECT count(*) FROM gone),
           (SELECT CASE WHEN s.live_from IS NULL THEN s.last
                        WHEN s.looked < max_rows OR s.live_from - 1 > after_claim_id THEN s.live_from - 1
                        ELSE s.last END
              FROM (SELECT count(*) AS looked, max(l.claim_id) AS last,
                           min(l.claim_id) FILTER (WHERE l.claimed_at > now() - interval '10 seconds'
                                                     AND NOT EXISTS (SELECT FROM gone g WHERE g.claim_id = l.claim_id))
                               AS live_from
                      FROM looked_at l) s);
END;

CREATE OR REPLACE FUNCTION pgqueue._depth(queue text, OUT ready bigint, OUT delayed bigint, OUT claimed bigint)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp SET jit = off SET enable_seqscan = off
BEGIN ATOMIC
    SELECT r.ready - h.held, r.delayed, r.claimed + h.held
      FROM (SELECT count(*) FILTER (WHERE m.state = 'ready') AS ready,
                   count(*) FILTER (WHERE m.state = 'delayed') AS delayed,
                   count(*) FILTER (WHERE m.state = 'claimed') AS claimed
              FROM pgqueue.message_rows m WHERE m.queue = _depth.queue) r,
           (SELECT count(*) AS held FROM pgqueue._ledger_held l WHERE l.queue = _depth.queue) h;
END;

CREATE OR REPLACE FUNCTION pgqueue._oldest_ready(queue text) RETURNS timestamptz
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH RECURSIVE held AS MATERIALIZED (
         SELECT l.msg_id FROM pgqueue._ledger_held l WHERE l.queue = _oldest_ready.queue),
    p(priority) AS (
         SELECT (SELECT max(m.priority) FROM pgqueue.message_rows m
                  WHERE m.queue = _oldest_ready.queue AND m.state = 'ready')
          UNION ALL
         SELECT (SELECT max(m.priority) FROM pgqueue.message_rows m
                  WHERE m.queue = _oldest_ready.queue AND m.state = 'ready' AND m.priority < p.priority)
           FROM p WHERE p.priority IS NOT NULL)
    SELECT min((SELECT m.enqueued_at FROM pgqueue.message_rows m
                 WHERE m.queue = _oldest_ready.queue AND m.state = 'ready' AND m.priority = p.priority
                   AND m.msg_id NOT IN (SELECT held.msg_id FROM held)
                 ORDER BY m.msg_id LIMIT 1))
      FROM p WHERE p.priority IS NOT NULL;
END;

CREATE OR REPLACE FUNCTION pgqueue._claimable(queue text, priorities smallint[])
RETURNS TABLE (priority smallint, msg_id bigint, due timestamptz, busy boolean)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp SET jit = off SET enable_seqscan = off AS $$
#variable_conflict use_variable
DECLARE
    p smallint;
    above integer := 1001;  -- priorities are between -1000 and 1000
    below integer;
    listed smallint[] := ARRAY(SELECT l FROM unnest(priorities) l ORDER BY l DESC);
    i integer := 1;
    ledger_held bigint[] := ARRAY(SELECT h.msg_id FROM pgqueue._ledger_held h WHERE h.queue = queue);
BEGIN
    due := NULL;
    LOOP
        below := CASE WHEN i <= cardinality(listed) THEN listed[i] ELSE -1001 END;
        -- Unlisted priorities strictly between `above` and `below`, highest first.
        LOOP
            SELECT m.priority, m.msg_id, m.xmax <> '0' INTO priority, msg_id, busy FROM pgqueue.message_rows m
             WHERE m.queue = queue AND m.state = 'ready' AND m.priority < above AND m.priority > below
               AND m.msg_id NOT IN (SELECT unnest(ledger_held))
             ORDER BY m.priority DESC, m.msg_id LIMIT 1;
            EXIT WHEN NOT FOUND;
            RETURN NEXT;
            above := priority;
        END LOOP;
        EXIT WHEN i > cardinality(listed);
        p := listed[i];
        SELECT m.msg_id, m.xmax <> '0' INTO msg_id, busy FROM pgqueue.message_rows m
         WHERE m.queue = queue AND m.state = 'ready' AND m.priority = p
           AND m.msg_id NOT IN (SELECT unnest(ledger_held))
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
    due := (SELECT min(m.visible_at) FROM pgqueue.message_rows m WHERE m.queue = queue AND m.state = 'delayed');
    RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.pgq_drop_queue(queue text, force boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '5s' AS $$
DECLARE
    in_flight bigint;
    ended integer;
    held bigint[];
    held_numbers integer[];
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
    -- And the claims only the claim ledger holds (their rows left 'ready').
    SELECT array_agg(h.msg_id), array_agg(h.number) INTO held, held_numbers
      FROM pgqueue._ledger_held h WHERE h.queue = pgq_drop_queue.queue;
    in_flight := in_flight + coalesce(pg_catalog.cardinality(held), 0);
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
    ended := pgqueue._held_end(held, held_numbers);
    -- Its claim ledger rows: none of their entries is live now. Left to the tick's "claims"
    -- step, a queue created again under the name would read them as its own until then.
    DELETE FROM pgqueue.claims c WHERE c.queue = pgq_drop_queue.queue;
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

CREATE OR REPLACE VIEW pgqueue.queue_overview AS
SELECT q.queue, q.paused, d.tracked, d.ready, d.delayed, d.claimed, d.dead, d.waiting_claims,
       now() - pgqueue._oldest_ready(q.queue) AS oldest_ready_age,
       coalesce(x.expired_claims, 0) AS expired_claims
  FROM pgqueue.queues q
  JOIN pgqueue.queue_depth d ON d.queue = q.queue
  LEFT JOIN (SELECT e.queue, count(*) AS expired_claims
               FROM (SELECT m.queue FROM pgqueue.message_rows m
                      WHERE m.state = 'claimed' AND m.lease_expires_at <= now()
                     UNION ALL
                     SELECT l.queue FROM pgqueue._ledger_held l WHERE l.lease_expires_at <= now()) e
              GROUP BY e.queue) x ON x.queue = q.queue;
