-- Privileges: three roles, each with its part of the API; PUBLIC gets only what reads nothing.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgqueue FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA pgqueue FROM PUBLIC;
GRANT USAGE ON SCHEMA pgqueue TO pgqueue_producer, pgqueue_consumer, pgqueue_admin;
-- Names only: PUBLIC may call pgq_version and pgq_cron_next, nothing else.
GRANT USAGE ON SCHEMA pgqueue TO PUBLIC;

GRANT EXECUTE ON FUNCTION
    pgqueue.pgq_send(text, jsonb, interval, smallint, jsonb, text, interval, bigint[], text),
    pgqueue.pgq_send_batch(text, jsonb[], interval, smallint, jsonb, text[], interval, bigint[], text),
    pgqueue.pgq_cancel(bigint[], text, text),
    pgqueue.pgq_cancel(bigint, text, text),
    pgqueue.pgq_cancel_key(text, text, text),
    pgqueue.pgq_result(bigint, interval, text),
    pgqueue.pgq_graph(bigint),
    pgqueue.pgq_signal(text, jsonb, interval)
TO pgqueue_producer;

GRANT EXECUTE ON FUNCTION
    pgqueue.pgq_claim(text, integer, interval, text, boolean, interval),
    pgqueue.pgq_ack_claim(text, bigint[], uuid[], integer, interval, text, boolean, interval, jsonb[]),
    pgqueue.pgq_renew(bigint, uuid, interval, text, jsonb),
    pgqueue.pgq_renew(bigint[], uuid[], interval, text, jsonb[]),
    pgqueue.pgq_ack(bigint, uuid, text, jsonb),
    pgqueue.pgq_ack(bigint[], uuid[], text, jsonb[]),
    pgqueue.pgq_nack(bigint, uuid, interval, text, text),
    pgqueue.pgq_fail(bigint, uuid, text, text),
    pgqueue.pgq_result(bigint, interval, text),
    pgqueue.pgq_graph(bigint),
    pgqueue.pgq_park(bigint, uuid, text, interval, jsonb, text, text),
    pgqueue.pgq_signal(text, jsonb, interval)
TO pgqueue_consumer;

GRANT pgqueue_producer, pgqueue_consumer TO pgqueue_admin;
GRANT EXECUTE ON FUNCTION
    pgqueue.pgq_create_queue(text, interval, integer, boolean, interval, boolean),
    pgqueue.pgq_drop_queue(text, boolean),
    pgqueue.pgq_pause_queue(text),
    pgqueue.pgq_resume_queue(text),
    pgqueue.pgq_redrive(text, bigint[]),
    pgqueue.pgq_delete_dead(text, bigint[]),
    pgqueue.pgq_run_schedule(text),
    pgqueue.pgq_audit(text, text, jsonb, text),
    pgqueue.pgq_rearm(integer, text),
    pgqueue.pgq_prune(text),
    pgqueue.pgq_tick(),
    pgqueue.pgq_schedule(text, text, text, jsonb, text, smallint, jsonb, boolean, text, interval),
    pgqueue.pgq_unschedule(text, boolean),
    pgqueue.pgq_pause_schedule(text),
    pgqueue.pgq_resume_schedule(text)
TO pgqueue_admin;
GRANT SELECT ON pgqueue.queue_stats, pgqueue.worker_stats, pgqueue.queue_depth, pgqueue.queue_overview,
    pgqueue.shared_state, pgqueue.held_set,
    pgqueue.schedule_stats, pgqueue.queue_minutes, pgqueue.audit_log, pgqueue.queues
    TO pgqueue_admin, pg_monitor;
-- Payloads are the applications' data: readable by admins, and by whom they grant it to.
GRANT SELECT ON pgqueue.jobs, pgqueue.dedup_keys, pgqueue.dependencies, pgqueue.park_keys, pgqueue.claims
    TO pgqueue_admin;
GRANT EXECUTE ON FUNCTION pgqueue._queue_depth(), pgqueue._dead_letters(), pgqueue._shared_state(), pgqueue._held_set(),
    pgqueue._local_time(timestamptz, text), pgqueue._oldest_ready(text)
    TO pgqueue_admin, pg_monitor;

GRANT EXECUTE ON FUNCTION pgqueue.pgq_version(), pgqueue.pgq_cron_next(text, text, timestamptz, integer) TO PUBLIC;
