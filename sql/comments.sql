-- One-line descriptions of pgqueue's public functions, views and tables, as psql's \df+, \dv+
-- and \dt+ show them (from 0.11.0). One line each, lower case, no final period.

-- Queues
COMMENT ON FUNCTION pgqueue.pgq_create_queue(text, interval, integer, boolean, interval, boolean) IS
    'create a queue with its lease, max_attempts and retention, and its history partitions';
COMMENT ON FUNCTION pgqueue.pgq_drop_queue(text, boolean) IS
    'drop a queue with its messages, keys and history; refused while messages are claimed, unless force';
COMMENT ON FUNCTION pgqueue.pgq_pause_queue(text) IS
    'pause a queue: sends still go in, claims return nothing';
COMMENT ON FUNCTION pgqueue.pgq_resume_queue(text) IS
    'resume a paused queue and wake its waiting claims';

-- Sending
COMMENT ON FUNCTION pgqueue.pgq_send(text, jsonb, interval, smallint, jsonb, text, interval, bigint[], text) IS
    'enqueue one message (delay, priority, headers, unique key, parents to wait for); returns its msg_id';
COMMENT ON FUNCTION pgqueue.pgq_send_batch(text, jsonb[], interval, smallint, jsonb, text[], interval, bigint[], text) IS
    'enqueue up to 10,000 messages in one statement (each waits for the parents in after); returns their msg_ids in array order';
COMMENT ON FUNCTION pgqueue.pgq_graph(bigint) IS
    'a message''s dependencies: the message, its parents and the children still in the queue, with their states';

-- Claiming and finishing
COMMENT ON FUNCTION pgqueue.pgq_claim(text, integer, interval, text, boolean, interval) IS
    'claim up to qty messages with a lease, highest priority first; can wait for messages to arrive';
COMMENT ON FUNCTION pgqueue.pgq_ack_claim(text, bigint[], uuid[], integer, interval, text, boolean, interval, jsonb[]) IS
    'ack finished claims and claim the next messages in one statement: a consumer''s round trip';
COMMENT ON FUNCTION pgqueue.pgq_ack(bigint, uuid, text, jsonb) IS
    'complete a claimed message (of queue, if given), keeping its result; false if the claim was lost';
COMMENT ON FUNCTION pgqueue.pgq_ack(bigint[], uuid[], text, jsonb[]) IS
    'complete claimed messages (of queue, if given), keeping their results; returns the ids completed';
COMMENT ON FUNCTION pgqueue.pgq_result(bigint, interval, text) IS
    'a message''s state, progress, and once finished its outcome, result and error; waits for it to finish with wait';
COMMENT ON FUNCTION pgqueue.pgq_nack(bigint, uuid, interval, text, text) IS
    'give a claimed message (of queue, if given) back for a retry later, or dead-letter it on its last attempt';
COMMENT ON FUNCTION pgqueue.pgq_fail(bigint, uuid, text, text) IS
    'dead-letter a claimed message (of queue, if given) now';
COMMENT ON FUNCTION pgqueue.pgq_cancel(bigint[], text, text) IS
    'cancel messages: waiting ones at once, claimed ones when their holder stops; returns the ids cancelled or marked';
COMMENT ON FUNCTION pgqueue.pgq_cancel(bigint, text, text) IS
    'cancel a message: at once if waiting, when its holder stops if claimed; false if nothing changed';
COMMENT ON FUNCTION pgqueue.pgq_park(bigint, uuid, text, interval, jsonb, text, text) IS
    'park a claimed message until pgq_signal(key) or its timeout, ending the claim; false if the claim was lost';
COMMENT ON FUNCTION pgqueue.pgq_signal(text, jsonb, interval) IS
    'resume every message parked on key with this payload, and keep the signal for parks to come; returns how many it resumed';
COMMENT ON FUNCTION pgqueue.pgq_cancel_key(text, text, text) IS
    'cancel the message that holds a queue''s unique key, as pgq_cancel; false if none holds it';
COMMENT ON FUNCTION pgqueue.pgq_renew(bigint, uuid, interval, text, jsonb) IS
    'extend the lease of a claim still held (on a message of queue, if given), storing its progress; false if the claim was lost';
COMMENT ON FUNCTION pgqueue.pgq_renew(bigint[], uuid[], interval, text, jsonb[]) IS
    'extend the leases of claims still held (on messages of queue, if given), storing their progress; returns their ids';
COMMENT ON FUNCTION pgqueue.pgq_redrive(text, bigint[]) IS
    'make a queue''s dead letters claimable again with a fresh attempt count; returns how many';
COMMENT ON FUNCTION pgqueue.pgq_delete_dead(text, bigint[]) IS
    'delete a queue''s dead letters (all, or the given ids) for good; returns how many';

-- Schedules
COMMENT ON FUNCTION pgqueue.pgq_schedule(text, text, text, jsonb, text, smallint, jsonb, boolean, text, interval) IS
    'create or replace a periodic schedule (cron pattern in a time zone); returns its next run';
COMMENT ON FUNCTION pgqueue.pgq_run_schedule(text) IS
    'enqueue one run of a schedule now, its next run unchanged; returns the msg_id';
COMMENT ON FUNCTION pgqueue.pgq_unschedule(text, boolean) IS
    'delete a schedule; the messages it enqueued stay';
COMMENT ON FUNCTION pgqueue.pgq_pause_schedule(text) IS
    'pause a schedule: it enqueues nothing until resumed';
COMMENT ON FUNCTION pgqueue.pgq_resume_schedule(text) IS
    'resume a paused schedule from its first time after now';
COMMENT ON FUNCTION pgqueue.pgq_cron_next(text, text, timestamptz, integer) IS
    'the next times of a cron pattern in a time zone, as schedules fire them';

-- Maintenance and inspecting
COMMENT ON FUNCTION pgqueue.pgq_tick() IS
    'run one tick of the background worker''s housekeeping in this session; returns the steps that failed';
COMMENT ON FUNCTION pgqueue.pgq_rearm(integer, text) IS
    'make expired claims claimable again, or dead-letter those without attempts left';
COMMENT ON FUNCTION pgqueue.pgq_prune(text) IS
    'remove history past each queue''s retention, a day partition at a time';
COMMENT ON FUNCTION pgqueue.pgq_version() IS
    'the version of the pgqueue library loaded';
COMMENT ON TYPE pgqueue.prune_result IS
    'one row of pgq_prune: queue, partition, outcome and rows removed';

-- Auditing
COMMENT ON FUNCTION pgqueue.pgq_audit(text, text, jsonb, text) IS
    'record an operator''s action (who, what, on what) in pgqueue.audit_log; returns its id';

-- Views
COMMENT ON VIEW pgqueue.jobs IS
    'every message, waiting, claimed or finished, with its state or outcome (no claim tokens)';
COMMENT ON VIEW pgqueue.queue_stats IS
    'per queue, counted exactly: ready, delayed, claimed, expired, pending and parked messages, oldest ages; dead, completed and cancelled in the history kept';
COMMENT ON VIEW pgqueue.queue_depth IS
    'per queue, from shared memory without counting: depths and dead letters, waiting claims, wake-ups';
COMMENT ON VIEW pgqueue.queue_overview IS
    'per queue, in O(queues) reads: depths and dead letters, oldest ready age, expired claims';
COMMENT ON VIEW pgqueue._ledger_held IS
    'internal: the messages that only the claim ledger holds (rows left ready by their claim), with the lease in force; read it by queue';
COMMENT ON VIEW pgqueue.worker_stats IS
    'what the background worker has done in this database: last tick, counters, last error';
COMMENT ON VIEW pgqueue.schedule_stats IS
    'per schedule: next run, last run and its lateness, run counts, last error';
COMMENT ON VIEW pgqueue.shared_state IS
    'pgqueue''s shared memory, all databases: max_queues, queues tracked, times it was full';
COMMENT ON VIEW pgqueue.held_set IS
    'this database''s held set in shared memory (the claims of the claim ledger): exact or not, size, rebuilds';

-- Tables
COMMENT ON TABLE pgqueue.queues IS
    'queue settings, one row per queue: lease, max_attempts, retention, paused';
COMMENT ON TABLE pgqueue.message_rows IS
    'the rows behind pgqueue.messages: read that view, not this table';
COMMENT ON VIEW pgqueue.messages IS
    'messages waiting (ready, delayed, pending on their parents, or parked until a signal) or claimed; finished ones move to pgqueue.history';
COMMENT ON TABLE pgqueue.history_rows IS
    'the rows behind pgqueue.history, partitioned by queue and day: read that view, not this table';
COMMENT ON VIEW pgqueue.history IS
    'completed, dead-lettered and cancelled messages, kept for the queue''s retention';
COMMENT ON TABLE pgqueue.schedules IS
    'periodic schedules: pattern, time zone, message to enqueue, next run and counters';
COMMENT ON TABLE pgqueue.dedup_keys IS
    'unique-job keys taken, per queue, and until when a finished message keeps its key';
COMMENT ON TABLE pgqueue.dependencies IS
    'one row per parent a message waits or waited for, with how the parent ended; removed when the child finishes';
COMMENT ON TABLE pgqueue.park_keys IS
    'one row per key messages park on or that was signalled, with the signal kept for parks to come';
COMMENT ON TABLE pgqueue.claims IS
    'the claim ledger: one row per claim call, naming the messages it took and their claim numbers, until none is held under it';
COMMENT ON TABLE pgqueue.claim_key IS
    'the secret claim tokens are signed with (the oldest row); only its owner reads it';
COMMENT ON TABLE pgqueue.worker_state IS
    'one row: the counters behind pgqueue.worker_stats, written at every tick';
COMMENT ON TABLE pgqueue.queue_minutes IS
    'per queue and minute: messages sent, completed, dead-lettered, retried, and the depths then';
COMMENT ON TABLE pgqueue.audit_log IS
    'operators'' actions recorded by pgq_audit: when, which role, which console user, what';
COMMENT ON TABLE pgqueue.prune_state IS
    'queues whose pruning backs off after being blocked or skipped';
