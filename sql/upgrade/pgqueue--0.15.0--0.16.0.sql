-- pgqueue 0.15.0 -> 0.16.0.
--
-- Progress and results: pgq_renew stores a holder's progress (jsonb) with its message,
-- pgq_ack and pgq_ack_claim keep a result with each message they complete, and pgq_result
-- reads a message's state, progress, outcome and result, waiting with `wait` until the
-- commit that finishes it. New columns: messages.progress, history.result and
-- history.progress; pgqueue.jobs shows them. pgq_renew, pgq_ack and pgq_ack_claim gain a
-- last argument: they are dropped and created again (their grants and comments with them).
-- Locks on queue data: ALTER TABLE takes ACCESS EXCLUSIVE on pgqueue.messages and on
-- pgqueue.history and its partitions (new nullable columns: no rewrite, no scan), until the
-- update commits.
-- The library runs the 0.15.0 SQL as before: install, restart, update.

ALTER TABLE pgqueue.messages ADD COLUMN progress jsonb;
ALTER TABLE pgqueue.history ADD COLUMN result jsonb, ADD COLUMN progress jsonb;

DROP FUNCTION pgqueue._check_wait(interval);
-- How long a claim (or pgq_result, `what`) may wait: from zero to one minute (the call is one
-- statement, and holds its snapshot while it waits). Waiting needs a fresh snapshot per
-- statement to see what others commit meanwhile.
CREATE FUNCTION pgqueue._check_wait(wait interval, what text DEFAULT 'a claim') RETURNS interval
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF pgqueue._require(wait, 'wait') < interval '0' OR wait > interval '1 minute' THEN
        PERFORM pgqueue._invalid('wait', pg_catalog.format('%s is not between 0 and 1 minute', wait));
    END IF;
    IF wait > interval '0' AND pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgqueue: % can wait only in a READ COMMITTED transaction', what
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'In REPEATABLE READ or SERIALIZABLE nothing committed after the transaction began becomes visible: call it with wait => ''0''.';
    END IF;
    RETURN wait;
END
$$;

-- Results and progress beside a list of n msg_ids: NULL (none), or a one-dimensional array
-- of n values, each NULL or at most pgqueue.max_payload_bytes (22023, 54000).
CREATE FUNCTION pgqueue._check_reports(reports jsonb[], n integer, argument text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    largest integer;
BEGIN
    IF reports IS NULL THEN
        RETURN;
    END IF;
    IF pg_catalog.array_ndims(reports) > 1 THEN
        PERFORM pgqueue._invalid(argument, 'a one-dimensional array is expected');
    END IF;
    IF pg_catalog.cardinality(reports) <> n THEN
        PERFORM pgqueue._invalid(argument, pg_catalog.format('%s values for %s ids', pg_catalog.cardinality(reports), n));
    END IF;
    SELECT max(pg_catalog.pg_column_size(r)) INTO largest FROM unnest(reports) r;
    IF largest > pgqueue._max_payload_bytes() THEN
        RAISE EXCEPTION 'pgqueue: a value of % of % bytes is larger than pgqueue.max_payload_bytes (%)',
                        argument, largest, pgqueue._max_payload_bytes()
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
END
$$;

-- The same, with results (beside msg_ids; NULL: none): what each completed message keeps.
CREATE FUNCTION pgqueue._to_history(msg_ids bigint[], claim_tokens uuid[], outcome text, error text, queue text,
                                    results jsonb[])
RETURNS SETOF bigint
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', '_to_history_with_wrapper';

DROP FUNCTION pgqueue.pgq_ack(bigint[], uuid[], text), pgqueue.pgq_ack(bigint, uuid, text),
    pgqueue.pgq_renew(bigint, uuid, interval, text), pgqueue.pgq_renew(bigint[], uuid[], interval, text),
    pgqueue.pgq_ack_claim(text, bigint[], uuid[], integer, interval, text, boolean, interval);

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

-- A consumer's round trip in one statement and one commit: acks the claims it has finished
-- (fenced, as pgq_ack) and claims the next ones (as pgq_claim, same arguments). An ack whose
-- claim was lost (stale token, re-armed, already finished) completes nothing and comes back as
-- a row of kind 'not_acked' with only its msg_id, before the claimed messages (kind
-- 'claimed'). The acks commit with the call, and their report must not come late: a call
-- with something to ack does not wait for messages; the consumer's next call, with nothing
-- to ack, does. ack_results (beside ack_msg_ids; NULL: none): what each message acked keeps,
-- as pgq_ack's results. Rust, as pgq_claim.
CREATE FUNCTION pgqueue.pgq_ack_claim(
    queue text,
    ack_msg_ids bigint[],
    ack_claim_tokens uuid[],
    qty integer DEFAULT 1,
    lease interval DEFAULT NULL,
    consumer text DEFAULT NULL,
    session_bound boolean DEFAULT false,
    wait interval DEFAULT '0',
    ack_results jsonb[] DEFAULT NULL
) RETURNS TABLE (
    kind text,
    msg_id bigint,
    claim_token uuid,
    attempt integer,
    priority smallint,
    payload jsonb,
    headers jsonb,
    enqueued_at timestamptz,
    lease_expires_at timestamptz
)
LANGUAGE c VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_indexscan = on SET enable_bitmapscan = off SET enable_sort = off SET jit = off
AS 'MODULE_PATHNAME', 'pgq_ack_claim_reporting_wrapper';

-- Extends the leases of the claims still held; returns the ids whose lease was extended.
-- An id missing from the result has lost its claim (re-armed, re-claimed, finished, its
-- cancel requested, or never existed): its holder must stop working on it.
-- With a queue (the last argument, as for pgq_ack): the queue must exist, and only its
-- messages are renewed. progress (beside msg_ids; NULL: unchanged): what each holder reports,
-- kept with its message (pgq_result, pgqueue.jobs) until the next report.
CREATE FUNCTION pgqueue.pgq_renew(msg_ids bigint[], claim_tokens uuid[], lease interval DEFAULT NULL,
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
        UPDATE pgqueue.messages m
           SET lease_expires_at = now() + coalesce(lease, q.lease),
               progress = coalesce(held.progress, m.progress)
          FROM unnest(msg_ids, claim_tokens, progress) AS held(id, token, progress), pgqueue.queues q
         WHERE m.msg_id = held.id AND m.claim_token = held.token AND m.state = 'claimed'
           AND m.cancel_requested_at IS NULL
           AND q.queue = m.queue AND (queue IS NULL OR m.queue = queue)
        RETURNING m.msg_id, m.lease_expires_at
    ), noted AS (
        SELECT pgqueue._renewed(min(r.lease_expires_at)) FROM renewed r
    )
    SELECT r.msg_id FROM renewed r, noted;
END
$$;

CREATE FUNCTION pgqueue.pgq_renew(msg_id bigint, claim_token uuid, lease interval DEFAULT NULL,
                                  queue text DEFAULT NULL, progress jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
BEGIN
    IF queue IS NOT NULL THEN
        PERFORM pgqueue._queue(queue);
    END IF;
    RETURN EXISTS (
        SELECT FROM pgqueue.pgq_renew(ARRAY[pgqueue._require(msg_id, 'msg_id')],
                                      ARRAY[pgqueue._require(claim_token, 'claim_token')], lease, queue,
                                      CASE WHEN progress IS NOT NULL THEN ARRAY[progress] END));
END
$$;

-- Dead letters back to claimable with a fresh attempt count (and their progress): all of the
-- queue's, or the given ids. Returns how many came back.
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
    , again AS (
        INSERT INTO pgqueue.messages (msg_id, queue, state, priority, payload, headers, enqueued_at, last_error,
                                      progress)
        OVERRIDING SYSTEM VALUE
        SELECT b.msg_id, q.queue, 'ready', b.priority, b.payload, b.headers, b.enqueued_at, b.last_error, b.progress
          FROM back b
        RETURNING messages.msg_id, messages.priority
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
    RETURN QUERY
    SELECT m.state, m.attempt, NULL::jsonb, m.progress, m.last_error, m.enqueued_at, NULL::timestamptz
      FROM pgqueue.messages m WHERE m.msg_id = msg_id AND (queue IS NULL OR m.queue = queue)
     UNION ALL
    SELECT h.outcome, h.attempt, h.result, h.progress, h.last_error, h.enqueued_at, h.finished_at
      FROM pgqueue.history h WHERE h.msg_id = msg_id AND (queue IS NULL OR h.queue = queue)
     LIMIT 1;
END
$$;

-- Every message, waiting, claimed or finished: one place to look a job up (by msg_id, which
-- both halves index, or through pgqueue.dedup_keys by unique key). Claim tokens are left out:
-- who can read this view cannot act for a consumer.
CREATE OR REPLACE VIEW pgqueue.jobs AS
SELECT m.msg_id, m.queue, m.state, m.priority, m.attempt, m.payload, m.headers, m.enqueued_at, m.visible_at,
       m.claimed_at, m.consumer, m.lease_expires_at, NULL::timestamptz AS finished_at, m.last_error, m.dedup_key,
       m.progress, NULL::jsonb AS result
  FROM pgqueue.messages m
 UNION ALL
SELECT h.msg_id, h.queue, h.outcome, h.priority, h.attempt, h.payload, h.headers, h.enqueued_at, NULL, NULL,
       NULL, NULL, h.finished_at, h.last_error, NULL, h.progress, h.result
  FROM pgqueue.history h;

REVOKE ALL ON FUNCTION pgqueue._check_wait(interval, text), pgqueue._check_reports(jsonb[], integer, text),
    pgqueue._to_history(bigint[], uuid[], text, text, text, jsonb[]),
    pgqueue.pgq_ack(bigint[], uuid[], text, jsonb[]), pgqueue.pgq_ack(bigint, uuid, text, jsonb),
    pgqueue.pgq_ack_claim(text, bigint[], uuid[], integer, interval, text, boolean, interval, jsonb[]),
    pgqueue.pgq_renew(bigint[], uuid[], interval, text, jsonb[]), pgqueue.pgq_renew(bigint, uuid, interval, text, jsonb),
    pgqueue._await_outcome(bigint, interval, text), pgqueue._outcome_waiters(),
    pgqueue.pgq_result(bigint, interval, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgqueue.pgq_result(bigint, interval, text) TO pgqueue_producer;
GRANT EXECUTE ON FUNCTION
    pgqueue.pgq_ack_claim(text, bigint[], uuid[], integer, interval, text, boolean, interval, jsonb[]),
    pgqueue.pgq_renew(bigint, uuid, interval, text, jsonb),
    pgqueue.pgq_renew(bigint[], uuid[], interval, text, jsonb[]),
    pgqueue.pgq_ack(bigint, uuid, text, jsonb),
    pgqueue.pgq_ack(bigint[], uuid[], text, jsonb[]),
    pgqueue.pgq_result(bigint, interval, text)
TO pgqueue_consumer;

COMMENT ON FUNCTION pgqueue.pgq_ack_claim(text, bigint[], uuid[], integer, interval, text, boolean, interval, jsonb[]) IS
    'ack finished claims and claim the next messages in one statement: a consumer''s round trip';

COMMENT ON FUNCTION pgqueue.pgq_ack(bigint, uuid, text, jsonb) IS
    'complete a claimed message (of queue, if given), keeping its result; false if the claim was lost';

COMMENT ON FUNCTION pgqueue.pgq_ack(bigint[], uuid[], text, jsonb[]) IS
    'complete claimed messages (of queue, if given), keeping their results; returns the ids completed';

COMMENT ON FUNCTION pgqueue.pgq_result(bigint, interval, text) IS
    'a message''s state, progress, and once finished its outcome, result and error; waits for it to finish with wait';

COMMENT ON FUNCTION pgqueue.pgq_renew(bigint, uuid, interval, text, jsonb) IS
    'extend the lease of a claim still held (on a message of queue, if given), storing its progress; false if the claim was lost';

COMMENT ON FUNCTION pgqueue.pgq_renew(bigint[], uuid[], interval, text, jsonb[]) IS
    'extend the leases of claims still held (on messages of queue, if given), storing their progress; returns their ids';
