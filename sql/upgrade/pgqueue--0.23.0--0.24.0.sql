-- pgqueue 0.23.0 -> 0.24.0.
--
-- pgqueue.messages shows the claims of the claim ledger (step 3b of the write path:
-- docs/design/write-path.md): a message whose row is 'ready' but that a live ledger entry
-- holds (the entry numbered claims_ended + 1) is shown claimed, with that claim's attempt,
-- token, time, consumer, session and lease. This release's claims still write the row as
-- well, so what the view shows is unchanged; the view stops being updatable (the library
-- writes pgqueue.message_rows). pgqueue.jobs and pgqueue.queue_stats read the view.
--
-- Views only: no table is locked beyond the views' own ACCESS EXCLUSIVE locks while the
-- update commits.

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
