-- Consumers: claim with a lease, renew it. Every claim gets a new claim_token; only the
-- holder of the current token can renew, ack, nack or fail the message (fencing).

-- Turns delayed messages whose time has come into claimable ones, oldest due first. Walks
-- the delayed index only up to the first row not yet due. Used by pgq_claim (so delays
-- never depend on the worker) and by the worker's tick. When all that was due got promoted,
-- it tells the shared state when the next one falls due, so that claims skip promoting
-- until then (the epoch, read before the promotion's snapshot, voids that if a delayed
-- message arrived meanwhile).
CREATE FUNCTION pgqueue._promote_due(queue text, max_rows integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_variable
DECLARE
    epoch bigint := pgqueue._due_epoch(queue);
    promoted bigint;
BEGIN
    WITH due AS (
        SELECT m.msg_id FROM pgqueue.message_rows m
         WHERE m.queue = queue AND m.state = 'delayed' AND m.visible_at <= now()
         ORDER BY m.visible_at
         LIMIT max_rows
           FOR UPDATE SKIP LOCKED
    ), moved AS (
        UPDATE pgqueue.message_rows m SET state = 'ready', visible_at = NULL
          FROM due WHERE m.msg_id = due.msg_id
        RETURNING m.msg_id, m.priority
    )
    SELECT coalesce(sum(n), 0) INTO promoted
      FROM (SELECT count(*) AS n,
                   pgqueue._note(queue, count(*), 'delayed', 'ready', mv.priority, min(mv.msg_id), max(mv.msg_id))
              FROM moved mv GROUP BY mv.priority) p;
    IF promoted < max_rows THEN
        PERFORM pgqueue._due_after(queue, epoch,
            (SELECT min(m.visible_at) FROM pgqueue.message_rows m
              WHERE m.queue = queue AND m.state = 'delayed' AND m.visible_at > now()));
    END IF;
    RETURN promoted;
END
$$;

-- Claims start each priority's scan at its hint from the shared state (pgqueue._claim_start):
-- the index entries below it belong to messages claimed, finished or moved since, which a
-- pinned xmin horizon keeps in the index however long it lasts. Without hints (no shared
-- memory, a queue not yet checked by the worker, or too many priorities) it scans from the
-- start. With wait, an empty claim sleeps until a commit makes messages of the queue
-- claimable, or until wait has passed.
-- Written in Rust (src/claim.rs): the claim is the hottest path, and an interpreter around
-- its few statements cost more than they do. Its statements are prepared once per process
-- and run their generic plans. The pick must read the index in order and stop at its LIMIT,
-- because _take hands out each row it is asked about: a bitmap scan and a sort (a plan
-- made with some statistics, or with a session's enable_indexscan off) would ask about
-- every ready row first, each then passed over by every claim until the worker's check.
-- Hence the planner settings; and no JIT: before PostgreSQL 18 a disabled sort (the
-- result's, which nothing else can give) adds a huge cost, enough to compile each statement.
CREATE FUNCTION pgqueue.pgq_claim(
    queue text,
    qty integer DEFAULT 1,
    lease interval DEFAULT NULL,
    consumer text DEFAULT NULL,
    session_bound boolean DEFAULT false,
    wait interval DEFAULT '0'
) RETURNS TABLE (
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
AS 'MODULE_PATHNAME', 'pgq_claim_wrapper';

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

-- The messages that only the claim ledger holds (rows a claim through the ledger left
-- 'ready': step 3b of the write path): the live entries of the ledger's rows (at their
-- message's claim number), with the lease in force and the ledger row (a renewal's, on the row, else the one
-- the claim granted). Read by queue: its ledger rows by index (claims_queue_idx), their
-- messages by primary key, as many reads as the queue has claims in flight. Each message is
-- looked up from its ledger entry, never the other way round: as a plain join, a generic plan
-- could walk the queue's ready rows and scan its ledger rows for each (the tick's hint check
-- then ran for minutes with 100,000 ready messages and 5,000 ledger rows); a subquery with a
-- LIMIT is not pulled up into the join, so the ledger stays outside. The lookup itself must
-- go by primary key: a plan made while the table was empty (a worker's kept plan) would scan
-- it for each entry, so the functions the worker runs over this view plan with
-- enable_seqscan off, as the library's kept statements do (statement.rs), and jit off: where
-- no index serves a scan, the setting's cost penalty would otherwise buy a JIT compile
-- (hundreds of ms a call on a server built with LLVM). The state is tested with texteq(),
-- not `=`, wherever a row is looked up from an entry: with `=` the partial ready index
-- qualifies, and where the statistics showed few ready rows the planner scanned all of it
-- for each entry (281,000 buffers for one tick's 1,216 entries); so only the primary key does.
CREATE VIEW pgqueue._ledger_held AS
SELECT c.queue, e.msg_id, e.number, coalesce(m.lease_expires_at, c.lease_expires_at) AS lease_expires_at, c.claim_id
  FROM pgqueue.claims c
 CROSS JOIN LATERAL unnest(c.msg_ids, c.claim_numbers) AS e(msg_id, number)
 CROSS JOIN LATERAL (SELECT r.lease_expires_at FROM pgqueue.message_rows r
                      WHERE r.msg_id = e.msg_id AND pg_catalog.texteq(r.state, 'ready') AND r.claims_ended + 1 = e.number
                      LIMIT 1) m;

-- Claim ledger rows written other than by a claim (a restore's COPY, an operator's INSERT)
-- make this database's held set forget everything at their commit (src/held.rs): it must not
-- vouch that their messages are free.
CREATE TRIGGER claims_written AFTER INSERT ON pgqueue.claims
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue._claims_written();
-- A set left by an earlier instance of the extension in this database knows nothing of it.
SELECT pgqueue._held_forget();
