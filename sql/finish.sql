-- Finishing messages: ack (completed), nack (retry later or dead letter), fail (dead
-- letter now), cancel, plus re-arming expired claims and redriving dead letters. Whatever
-- becomes claimable again is announced to the shared state (pgqueue._note), applied at commit.
-- A claimed message whose cancel was requested (cancel_requested_at) is never retried:
-- whatever finishes it (ack, nack, fail, lease end) records it as cancelled.

-- Moves messages out of the hot table into their queue's history (completed, dead, cancelled), in
-- one statement (src/finish.rs, which pgq_ack_claim runs too). With claim_tokens, only the
-- claims still held under those tokens move (the fence); without (NULL), the given messages
-- move. Returns the ids that moved.
CREATE FUNCTION pgqueue._to_history(msg_ids bigint[], claim_tokens uuid[], outcome text, error text DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', '_to_history_wrapper';

-- The same, with a queue: only its messages move; one of another queue is left, as with a
-- stale token. NULL: any queue's.
CREATE FUNCTION pgqueue._to_history(msg_ids bigint[], claim_tokens uuid[], outcome text, error text, queue text)
RETURNS SETOF bigint
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', '_to_history_in_wrapper';

-- The same, with results (beside msg_ids; NULL: none): what each completed message keeps.
CREATE FUNCTION pgqueue._to_history(msg_ids bigint[], claim_tokens uuid[], outcome text, error text, queue text,
                                    results jsonb[])
RETURNS SETOF bigint
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', '_to_history_with_wrapper';

-- Every finishing function takes the message's queue as its last argument (default NULL: any
-- queue). Given, the queue must exist (42704) and only its messages are acted on. A call that
-- names its queue can be routed to where the queue lives (docs/design/citus.md).

-- results: what each message completed keeps (beside msg_ids; NULL: none), which
-- pgq_result returns.
CREATE FUNCTION pgqueue.pgq_ack(msg_ids bigint[], claim_tokens uuid[], queue text DEFAULT NULL,
                                results jsonb[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
BEGIN
    IF queue IS NOT NULL THEN
        PERFORM pgqueue._queue(queue);
    END IF;
    PERFORM pgqueue._check_pairs(msg_ids, claim_tokens);
    IF results IS NOT NULL THEN
        PERFORM pgqueue._check_reports(results, pg_catalog.cardinality(msg_ids), 'results');
    END IF;
    RETURN QUERY SELECT pgqueue._to_history(msg_ids, claim_tokens, 'completed', NULL, queue, results);
END
$$;

CREATE FUNCTION pgqueue.pgq_ack(msg_id bigint, claim_token uuid, queue text DEFAULT NULL, result jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
BEGIN
    IF queue IS NOT NULL THEN
        PERFORM pgqueue._queue(queue);
    END IF;
    IF msg_id IS NULL OR claim_token IS NULL THEN
        PERFORM pgqueue._require(msg_id, 'msg_id');
        PERFORM pgqueue._require(claim_token, 'claim_token');
    END IF;
    IF result IS NOT NULL THEN
        PERFORM pgqueue._check_reports(ARRAY[result], 1, 'result');
    END IF;
    RETURN EXISTS (SELECT FROM pgqueue._to_history(ARRAY[msg_id], ARRAY[claim_token], 'completed', NULL, queue,
                                                   CASE WHEN result IS NOT NULL THEN ARRAY[result] END));
END
$$;

-- Default retry delay after the n-th attempt: 1 s, 2 s, 4 s, ... capped at one hour.
CREATE FUNCTION pgqueue._backoff(attempt integer) RETURNS interval
LANGUAGE sql IMMUTABLE
RETURN least(interval '1 second' * power(2, least(greatest(attempt - 1, 0), 12)), interval '1 hour');

CREATE FUNCTION pgqueue.pgq_nack(
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

CREATE FUNCTION pgqueue.pgq_fail(msg_id bigint, claim_token uuid, error text DEFAULT NULL, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
BEGIN
    IF queue IS NOT NULL THEN
        PERFORM pgqueue._queue(queue);
    END IF;
    RETURN EXISTS (
        SELECT FROM pgqueue._to_history(ARRAY[pgqueue._require(msg_id, 'msg_id')],
                                        ARRAY[pgqueue._require(claim_token, 'claim_token')],
                                        'dead', coalesce(error, 'failed by the consumer'), queue));
END
$$;

-- Cancels messages: a waiting (ready or delayed) one moves to history as cancelled at once;
-- a claimed one is marked (cancel_requested_at, and the reason as its last_error): its
-- holder's renewals leave it out from then on, which tells the holder to stop, and whatever
-- finishes it (ack, nack, fail, lease end) records it as cancelled. Either way its unique key
-- is free once it is cancelled. Returns the ids cancelled or marked; one finished, unknown, of
-- another queue, or already marked is left out (nothing changed).
CREATE FUNCTION pgqueue.pgq_cancel(msg_ids bigint[], reason text DEFAULT NULL, queue text DEFAULT NULL)
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

CREATE FUNCTION pgqueue.pgq_cancel(msg_id bigint, reason text DEFAULT NULL, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
BEGIN
    RETURN EXISTS (SELECT FROM pgqueue.pgq_cancel(ARRAY[pgqueue._require(msg_id, 'msg_id')], reason, queue));
END
$$;

-- Cancels the message that holds `queue`'s unique key `dedup_key` (as pgq_cancel); false
-- when no waiting or running message holds it.
CREATE FUNCTION pgqueue.pgq_cancel_key(queue text, dedup_key text, reason text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    q pgqueue.queues := pgqueue._queue(queue);
    holder bigint;
BEGIN
    SELECT d.msg_id INTO holder FROM pgqueue.dedup_keys d
     WHERE d.queue = q.queue AND d.dedup_key = pgqueue._require(dedup_key, 'dedup_key') AND d.expires_at IS NULL;
    IF holder IS NULL THEN
        RETURN false;
    END IF;
    RETURN pgqueue.pgq_cancel(holder, reason, q.queue);
END
$$;

-- What a re-arm batch does with the expired claims it locked: back to ready with the claim
-- counted (retry), to dead letter when the queue's max_attempts is used up (exhausted), or to
-- history as cancelled when a cancel was requested (counted in neither). A 'ready' row was
-- left so by a claim through the claim ledger (step 3b of the write path): its attempt is
-- counted here, and its token (beside the id; NULL for claimed rows) tells the move to
-- history that the ledger held it. Returns the counts.
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

-- One batch of re-arming: expired claims with msg_id > after_msg_id, in msg_id order, back
-- to ready, or to dead letter when the queue's max_attempts is used up (to history as
-- cancelled when a cancel was requested: counted in neither). Rows another session
-- holds locked are skipped (SKIP LOCKED), so many sessions can run it at once and each
-- expired claim is re-armed exactly once; a live lease is never touched.
-- The lease is in no index (renewals stay HOT), so expiry is checked row by row; to keep
-- every batch the same cost however many claims are in flight, a batch looks at a window of
-- at most 4 x max_rows in-flight rows after the cursor (an index seek, never a rescan of
-- what was already swept). `more` says there may be more after last_msg_id; first_msg_id is
-- the lowest in-flight msg_id after the cursor and next_expiry the earliest lease end in the
-- window (the worker starts its next pass there, and not before then: see src/tick.rs).
CREATE FUNCTION pgqueue._rearm_batch(after_msg_id bigint, max_rows integer, queue text DEFAULT NULL)
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

-- The same for claims only the claim ledger holds (a claim through the ledger leaves its row
-- 'ready': step 3b of the write path), found from the ledger, which has no index by message:
-- a batch looks at the ledger's rows (of `queue` if given) after after_claim_id in claim_id
-- order, as many as hold max_rows messages (at least one row). Of their live entries (the
-- row 'ready' and at the entry's claim number) those whose lease has ended (the row's, which
-- renewals and the orphans step set, else the one the claim granted) go back to ready with
-- the claim counted (attempt and claims_ended), or to dead letter or cancelled as above.
-- `more` says there may be more after last_claim_id; next_expiry is the earliest lease end
-- of the live entries it saw that it did not end.
CREATE FUNCTION pgqueue._rearm_ledger_batch(after_claim_id bigint, max_rows integer, queue text DEFAULT NULL)
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

-- Expired claims back to claimable (or dead letter), at most max_rows of them; `queue`
-- restricts it to one queue. The background worker does this by itself every tick.
CREATE FUNCTION pgqueue.pgq_rearm(max_rows integer DEFAULT 5000, queue text DEFAULT NULL)
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

-- Deletes dead letters for good: all of the queue's, or the given ids. Returns how many.
CREATE FUNCTION pgqueue.pgq_delete_dead(queue text, msg_ids bigint[] DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    q pgqueue.queues := pgqueue._queue(queue);
    deleted bigint;
BEGIN
    DELETE FROM pgqueue.history_rows h
     WHERE h.queue = q.queue AND h.outcome = 'dead' AND (msg_ids IS NULL OR h.msg_id = ANY (msg_ids));
    GET DIAGNOSTICS deleted = ROW_COUNT;
    PERFORM pgqueue._note(q.queue, deleted, 'dead', NULL);
    RETURN deleted;
END
$$;

-- Dead letters back to claimable with a fresh attempt count (and their progress): all of the
-- queue's, or the given ids. Returns how many came back.
CREATE FUNCTION pgqueue.pgq_redrive(queue text, msg_ids bigint[] DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    q pgqueue.queues := pgqueue._lock_queue(queue);
    moved bigint;
BEGIN
    WITH back AS (
        DELETE FROM pgqueue.history_rows h
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

-- Waits until the message is neither waiting nor claimed (finished or unknown), or for wait;
-- woken at the commit that finishes it (src/outcome_wait.rs). True if it is.
CREATE FUNCTION pgqueue._await_outcome(msg_id bigint, wait interval, queue text) RETURNS boolean
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', '_await_outcome_wrapper';

-- How many pgq_result calls wait now, in the whole server (0 without shared memory).
CREATE FUNCTION pgqueue._outcome_waiters() RETURNS bigint
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', '_outcome_waiters_wrapper';

-- A message's state and what it reported: its progress while waiting or claimed (the latest
-- its holders stored with pgq_renew), and once finished (finished_at set) its outcome as
-- state, its result (pgq_ack) and last error. No row: no such message (of queue, if given),
-- or its history was pruned. With wait, a message not finished yet is waited for, until the
-- commit that finishes it or for at most wait; then the row is read as it is (state still
-- 'ready', 'delayed' or 'claimed' when wait ran out).
CREATE FUNCTION pgqueue.pgq_result(msg_id bigint, wait interval DEFAULT '0', queue text DEFAULT NULL)
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
