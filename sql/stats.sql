-- Metrics, shaped for Prometheus' postgres_exporter: one row per queue.
CREATE VIEW pgqueue.queue_stats AS
SELECT q.queue,
       q.paused,
       c.ready,
       c.delayed,
       c.claimed,
       c.expired_claims,
       (SELECT count(*) FROM pgqueue.history h WHERE h.queue = q.queue AND h.outcome = 'dead') AS dead,
       now() - c.oldest_ready AS oldest_ready_age,
       now() - c.oldest_expired_lease AS oldest_expired_claim_age
  FROM pgqueue.queues q
 CROSS JOIN LATERAL (
       SELECT count(*) FILTER (WHERE m.state = 'ready') AS ready,
              count(*) FILTER (WHERE m.state = 'delayed') AS delayed,
              count(*) FILTER (WHERE m.state = 'claimed') AS claimed,
              count(*) FILTER (WHERE m.state = 'claimed' AND m.lease_expires_at <= now()) AS expired_claims,
              min(m.enqueued_at) FILTER (WHERE m.state = 'ready') AS oldest_ready,
              min(m.lease_expires_at) FILTER (WHERE m.state = 'claimed' AND m.lease_expires_at <= now())
                  AS oldest_expired_lease
         FROM pgqueue.messages m
        WHERE m.queue = q.queue) c;

-- The worker's counters in this database (monotonic; see the README for what to alert on).
CREATE VIEW pgqueue.worker_stats AS
SELECT current_database() AS database,
       w.pid, w.started_at, w.last_tick_at, now() - w.last_tick_at AS since_last_tick,
       w.last_prune_at, w.tick_interval_ms,
       w.ticks, w.tick_failures, w.promote_failures, w.orphan_failures, w.rearm_failures,
       w.partition_failures, w.prune_failures,
       w.promoted, w.orphans_expired, w.rearmed, w.dead_lettered, w.rescue_batches, w.rescue_rows,
       w.partitions_created, w.prune_pruned, w.prune_noop, w.prune_blocked,
       w.prune_skipped_active, w.prune_backed_off, w.prune_error, w.pruned_rows,
       w.last_error, w.last_error_at
  FROM pgqueue.worker_state w;
