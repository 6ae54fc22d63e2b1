-- pgqueue 0.24.2 -> 0.25.0.
--
-- The tick's "claims" step (_prune_claims) locks the claim ledger rows it deletes without
-- waiting (FOR UPDATE SKIP LOCKED): a pgq_drop_queue deleting its queue's ledger rows while
-- the step deleted others could deadlock with it (40P01 for one of them). A row skipped so
-- is looked at again at the prune cadence.
--
-- The library's changes (a claim that writes rows no longer takes a message that a claim
-- through the claim ledger holds; the ledger read in a snapshot taken after the row locks
-- instead of 40001 in REPEATABLE READ) need the restart, not this script.

CREATE OR REPLACE FUNCTION pgqueue._prune_claims(after_claim_id bigint, max_rows integer)
RETURNS TABLE (looked bigint, pruned bigint, last_claim_id bigint)
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH looked_at AS MATERIALIZED (
        SELECT c.claim_id, c.claimed_at FROM pgqueue.claims c WHERE c.claim_id > after_claim_id
         ORDER BY c.claim_id LIMIT max_rows
    ), ended AS (
        SELECT c.claim_id FROM pgqueue.claims c JOIN looked_at l ON c.claim_id = l.claim_id
         WHERE NOT EXISTS (SELECT FROM unnest(c.msg_ids, c.claim_numbers) AS e(msg_id, number)
                             JOIN pgqueue.message_rows m ON m.msg_id = e.msg_id
                            WHERE m.claims_ended < e.number)
           FOR UPDATE OF c SKIP LOCKED
    ), gone AS (
        DELETE FROM pgqueue.claims c USING ended e WHERE c.claim_id = e.claim_id
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
