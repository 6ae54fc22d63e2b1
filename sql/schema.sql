-- pgqueue schema: every table, constraint, index and role of the extension is defined here.

-- Roles are cluster-wide, so a second database's CREATE EXTENSION finds them already there.
DO $roles$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['pgqueue_producer', 'pgqueue_consumer', 'pgqueue_admin'] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
        END IF;
    END LOOP;
END
$roles$;

-- Queue settings, one row per queue. Names follow pgqueue._check_queue_name.
CREATE TABLE pgqueue.queues (
    queue        text PRIMARY KEY,
    lease        interval NOT NULL DEFAULT '120 s' CHECK (lease > '0'),
    max_attempts integer NOT NULL DEFAULT 5 CHECK (max_attempts BETWEEN 1 AND 1000),
    retention    interval NOT NULL DEFAULT '7 days' CHECK (retention >= '0'),
    paused       boolean NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- What each state of a message requires of its other columns: the hot table's one CHECK
-- (src/message_rules.rs). A function, because PostgreSQL reads every CHECK's stored expression
-- anew for each statement that writes the table: one CHECK per rule cost a claim a fifth of
-- its time. Not strict: a NULL column is an answer.
CREATE FUNCTION pgqueue._message_ok(state text, priority smallint, visible_at timestamptz, claim_token uuid,
                                    lease_expires_at timestamptz, session_pid integer,
                                    cancel_requested_at timestamptz, after bigint[], park_key text,
                                    park_until timestamptz)
RETURNS boolean
LANGUAGE c IMMUTABLE PARALLEL SAFE AS 'MODULE_PATHNAME', '_message_ok_wrapper';

-- The hot table: messages that are waiting (ready, delayed until visible_at, or pending until
-- their parents completed) or claimed.
-- Completed, dead-lettered and cancelled messages move to pgqueue.history.
-- fillfactor leaves room on each page so that lease renewals stay HOT updates.
-- Users read it as the view pgqueue.messages (sql/stats.sql), which also shows the claims
-- the claim ledger holds on rows a claim left as they were (step 3b of the write path). Its sequence, key and
-- index names are those of 0.19 and earlier, when the table itself was pgqueue.messages.
CREATE TABLE pgqueue.message_rows (
    msg_id           bigint GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME pgqueue.messages_msg_id_seq)
                     CONSTRAINT messages_pkey PRIMARY KEY,
    queue            text NOT NULL,  -- no foreign key: see pgqueue._lock_queue
    state            text NOT NULL,  -- ready, delayed, claimed, pending or parked
    priority         smallint NOT NULL DEFAULT 0,  -- -1000 to 1000
    attempt          integer NOT NULL DEFAULT 0,
    payload          jsonb NOT NULL,
    headers          jsonb,
    enqueued_at      timestamptz NOT NULL DEFAULT now(),
    visible_at       timestamptz,
    claim_token      uuid,
    claimed_at       timestamptz,
    consumer         text,
    lease_expires_at timestamptz,  -- deliberately in no index: renewals stay HOT
    last_error       text,
    session_pid      integer,      -- session-bound claims: the claiming backend ...
    session_started  timestamptz,  -- ... and its start time (pids are reused)
    dedup_key        text,         -- unique jobs: the key this message holds (pgqueue.dedup_keys)
    cancel_requested_at timestamptz, -- pgq_cancel of a claimed message: its holder is to stop
    progress         jsonb,        -- what its holders reported with their renewals (the latest)
    after            bigint[],     -- dependencies: the parents it was sent to wait for (pgq_send's after)
    has_dependents   boolean,      -- true: a child was sent with this message in its after
    park_key         text,         -- parked (pgq_park): the key a pgq_signal resumes it by ...
    park_until       timestamptz,  -- ... and when it resumes without one
    claims_ended     integer NOT NULL DEFAULT 0,  -- claims that ended in a nack, park or re-arm (the
                                   -- claim ledger's count: a claim takes the message as claim
                                   -- number claims_ended + 1; an ack or fail ends with the row)
    -- The state and priority are known; only a claim has a session or a cancel request;
    -- delayed rows have a due time, and only they but pending ones (delayed once released);
    -- pending ones have parents; parked ones have a key and a timeout, claimed ones a token
    -- and a lease, and only they.
    CONSTRAINT messages_state_rules CHECK (pgqueue._message_ok(state, priority, visible_at, claim_token,
        lease_expires_at, session_pid, cancel_requested_at, after, park_key, park_until))
) WITH (fillfactor = 80);

-- The claim walks only claimable rows, highest priority first, FIFO within a priority.
CREATE INDEX messages_ready_idx ON pgqueue.message_rows (queue, priority DESC, msg_id)
    WHERE state = 'ready';
-- Delayed rows in due order: promotion stops at the first row not yet due.
CREATE INDEX messages_delayed_idx ON pgqueue.message_rows (queue, visible_at)
    WHERE state = 'delayed';
-- Pending rows, for the tick that checks that none waits for parents that all completed.
CREATE INDEX messages_pending_idx ON pgqueue.message_rows (msg_id)
    WHERE state = 'pending';
-- Parked rows: by key for the signal that resumes them, by time for the tick that ends their
-- wait.
CREATE INDEX messages_parked_key_idx ON pgqueue.message_rows (park_key)
    WHERE state = 'parked';
CREATE INDEX messages_parked_until_idx ON pgqueue.message_rows (park_until)
    WHERE state = 'parked';
-- In-flight rows, for re-arming expired claims (the lease itself is not indexed).
CREATE INDEX messages_claimed_idx ON pgqueue.message_rows (msg_id)
    WHERE state = 'claimed';

-- Session-bound claims, so the worker finds those whose backend has gone without
-- scanning every claim. The predicate leaves `state` out (messages_state_rules
-- implies it): a query for session-bound claims then cannot be served by
-- messages_claimed_idx, whose dead entries behind a pinned horizon the planner cannot see.
CREATE INDEX messages_session_idx ON pgqueue.message_rows (session_pid)
    WHERE session_pid IS NOT NULL;

-- The claim ledger (docs/design/write-path.md, steps 2 and 3), written while
-- pgqueue.claim_ledger is on: one row per claim call, naming the messages it took and, for
-- each, its claim number (the message's claims_ended + 1). Its tokens name the row and carry
-- a MAC of (message, claim, claim number) under pgqueue.claim_key, so fencing finds the row by
-- its key. An entry is live while its message exists and has not ended that claim
-- (claims_ended below its number). The rows above still decide who holds a message; fencing
-- checks that the ledger agrees, both ways (XX000 where it does not), so that a later
-- release can stop writing them. The tick deletes a row once none of its entries is live.
-- Ids fit 48 bits (the token's). From 0.23.0 a row also keeps what its call granted, which
-- the rows keep too for now: the lease (renewals change the rows' only), the consumer and
-- the session of a session-bound claim; NULL in rows written before.
CREATE TABLE pgqueue.claims (
    claim_id      bigint GENERATED ALWAYS AS IDENTITY (MAXVALUE 281474976710655) PRIMARY KEY,
    queue         text NOT NULL,
    msg_ids       bigint[] NOT NULL,   -- ascending
    claim_numbers integer[] NOT NULL,  -- beside msg_ids: the claim number each was taken as
    claimed_at    timestamptz NOT NULL,
    lease_expires_at timestamptz,      -- as granted by the claim
    consumer      text,
    session_pid   integer,
    session_started timestamptz,
    CONSTRAINT claims_shape CHECK (pg_catalog.cardinality(msg_ids) >= 1
                                   AND pg_catalog.cardinality(msg_ids) = pg_catalog.cardinality(claim_numbers))
);
-- Session-bound claims, for the orphans step (sql/maintenance.sql): the claims only the
-- ledger holds have their session here alone (0.24.0).
CREATE INDEX claims_session_idx ON pgqueue.claims (session_pid) WHERE session_pid IS NOT NULL;
-- A queue's rows: what its readers, cancels, drops and re-arms look at (0.24.0).
CREATE INDEX claims_queue_idx ON pgqueue.claims (queue, claim_id);

-- The installation's secret for claim tokens (16 random bytes), readable by its owner only.
-- The oldest row is the key: a restore adds the dumped key, older than the one its CREATE
-- EXTENSION made, so tokens handed out before the dump still verify.
-- Statements read it inline, as (SELECT k.key FROM pgqueue.claim_key k ORDER BY k.made_at,
-- k.key LIMIT 1), planned with them: a SQL function there is planned anew at each call, which
-- cost a claim and an ack 0.1 ms each.
CREATE TABLE pgqueue.claim_key (
    key     bytea NOT NULL CONSTRAINT claim_key_length CHECK (pg_catalog.octet_length(key) = 16),
    made_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO pgqueue.claim_key (key)
VALUES (pg_catalog.substr(pg_catalog.sha256(pg_catalog.uuid_send(pg_catalog.gen_random_uuid())
                                            || pg_catalog.uuid_send(pg_catalog.gen_random_uuid())), 1, 16));

-- Unique jobs: one row per (queue, key) taken by a send with a dedup_key. The primary key is
-- what keeps a second copy out, under any concurrency. expires_at is NULL while the message
-- waits or runs; when it finishes, the key is released (hold 0) or kept until now() + hold.
CREATE TABLE pgqueue.dedup_keys (
    queue      text NOT NULL,
    dedup_key  text NOT NULL,
    msg_id     bigint NOT NULL,
    hold       interval NOT NULL,
    expires_at timestamptz,
    PRIMARY KEY (queue, dedup_key)
);
-- For the tick that deletes expired keys.
CREATE INDEX dedup_keys_expiry_idx ON pgqueue.dedup_keys (expires_at) WHERE expires_at IS NOT NULL;

-- Dependencies (sql/dependencies.sql): one row per parent a pending message still waits for,
-- or waited for. parent_outcome is NULL until the parent finishes, then how it did ('completed',
-- 'dead', 'cancelled', or 'deleted' with its queue). Each parent's finish writes its own rows
-- only, so the acks of a child's many parents never wait on each other. The rows go when the
-- child finishes.
CREATE TABLE pgqueue.dependencies (
    parent            bigint NOT NULL,
    child             bigint NOT NULL,
    on_parent_failure text NOT NULL CONSTRAINT dependencies_policy_check
                          CHECK (on_parent_failure IN ('cancel', 'dead', 'run')),
    parent_outcome    text CONSTRAINT dependencies_outcome_check
                          CHECK (parent_outcome IN ('completed', 'dead', 'cancelled', 'deleted')),
    PRIMARY KEY (parent, child)
);
-- A child's rows, to remove them when it finishes.
CREATE INDEX dependencies_child_idx ON pgqueue.dependencies (child);
-- Whether a child is held back: one index entry per parent not finished yet, or failed under
-- a policy other than 'run' (dependencies.rs reads it with this very condition, from the
-- highest parent down, and stops at the first that holds the child back).
CREATE INDEX dependencies_waiting_idx ON pgqueue.dependencies (child, parent)
    WHERE parent_outcome IS NULL OR (parent_outcome <> 'completed' AND on_parent_failure <> 'run');

-- Park keys (sql/park.sql): one row per key that messages park on or that was signalled. A
-- park and a signal of the same key both write its row, so they happen one after the other:
-- the later one sees the earlier (a signal wakes what parked before it; a park finds a signal
-- sent before it). A signal is kept until keep_until, for the parks that come after it.
-- Rows with no kept signal and no message parked on them are collected by the tick.
CREATE TABLE pgqueue.park_keys (
    key          text PRIMARY KEY,
    signal       jsonb,        -- the kept signal's payload
    signalled_at timestamptz,  -- NULL: no signal kept
    keep_until   timestamptz,
    CONSTRAINT park_keys_signal_kept CHECK ((signalled_at IS NULL) = (keep_until IS NULL))
);

-- Periodic schedules (sql/schedule.sql). The worker fires each due one: it enqueues the run
-- and advances next_run in one transaction. next_run NULL: the pattern has no further time.
CREATE TABLE pgqueue.schedules (
    name          text PRIMARY KEY,
    queue         text NOT NULL,  -- no foreign key: a dropped queue is reported at the next run
    cron          text NOT NULL,
    time_zone     text NOT NULL DEFAULT 'UTC',
    payload       jsonb NOT NULL,
    headers       jsonb,
    priority      smallint NOT NULL DEFAULT 0,
    paused        boolean NOT NULL DEFAULT false,
    missed        text NOT NULL DEFAULT 'skip' CHECK (missed IN ('skip', 'catch_up')),
    grace         interval NOT NULL DEFAULT '1 minute',
    next_run      timestamptz,
    last_run      timestamptz,    -- the slot of the latest run enqueued
    last_fired_at timestamptz,    -- when it was enqueued
    last_msg_id   bigint,
    runs          bigint NOT NULL DEFAULT 0,
    missed_runs   bigint NOT NULL DEFAULT 0,
    failures      bigint NOT NULL DEFAULT 0,
    last_error    text,
    last_error_at timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now()
);
-- A tick with nothing due reads this index and not the table.
CREATE INDEX schedules_due_idx ON pgqueue.schedules (next_run) WHERE NOT paused;

-- Completed, dead-lettered and cancelled messages, kept for each queue's retention. Partitioned by
-- queue, then by day of finished_at, so pruning drops whole partitions instead of
-- deleting rows. pgq_create_queue creates a queue's partitions, and each leaf partition its
-- own index (pgqueue._index_history_part). No index is declared here: a partitioned index on
-- this table, which belongs to the extension, would be copied onto every partition a
-- restore attaches, before the restore creates that same index from the dump.
-- Named history until 0.26.0; pgqueue.history is now a view of it (below).
CREATE TABLE pgqueue.history_rows (
    msg_id      bigint NOT NULL,
    queue       text NOT NULL,
    outcome     text NOT NULL CONSTRAINT history_outcome_check
                    CHECK (outcome IN ('completed', 'dead', 'cancelled')),
    priority    smallint NOT NULL,
    attempt     integer NOT NULL,
    payload     jsonb NOT NULL,
    headers     jsonb,
    enqueued_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now(),
    last_error  text,
    result      jsonb,  -- what the ack that completed it stored
    progress    jsonb,  -- the message's last progress
    after       bigint[] -- the parents it waited for
) PARTITION BY LIST (queue);

-- What users read of finished messages: the rows above, for now. Readers of finished
-- messages read this view, writers the table, so that stage 2 of the write path
-- (docs/design/write-path.md), which keeps finished messages in another shape, changes this
-- view's definition and not its readers.
CREATE VIEW pgqueue.history AS
SELECT msg_id, queue, outcome, priority, attempt, payload, headers, enqueued_at, finished_at, last_error, result,
       progress, after
  FROM pgqueue.history_rows;

-- Per-queue counts by minute, for charts (the console, exporters, SQL): what commits sent,
-- completed, dead-lettered and retried (nacked or re-armed), and the depth by state when the
-- worker recorded them. Written once a minute by the worker's rollup step (src/rollup.rs says
-- what the counts can miss); kept for pgqueue.rollup_retention.
CREATE TABLE pgqueue.queue_minutes (
    queue     text NOT NULL REFERENCES pgqueue.queues ON DELETE CASCADE,
    minute    timestamptz NOT NULL,
    sent      bigint NOT NULL DEFAULT 0,
    completed bigint NOT NULL DEFAULT 0,
    dead      bigint NOT NULL DEFAULT 0,
    retried   bigint NOT NULL DEFAULT 0,
    ready     bigint,  -- depths: NULL where the shared state did not know them
    delayed   bigint,
    claimed   bigint,
    PRIMARY KEY (queue, minute)
);

-- What operators did through a console (pgqueue.pgq_audit): who, what, when.
CREATE TABLE pgqueue.audit_log (
    action_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    db_role      text NOT NULL,   -- the session's role
    console_user text,            -- the person the console authenticated, if it did
    action       text NOT NULL,
    target       text,
    detail       jsonb
);

-- Queue data is user data: pg_dump keeps it.
SELECT pg_catalog.pg_extension_config_dump('pgqueue.queues', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.message_rows', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.messages_msg_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.dedup_keys', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.schedules', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.queue_minutes', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.audit_log', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.audit_log_action_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.dependencies', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.park_keys', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.claims', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.claims_claim_id_seq', '');
-- The key in use only (see pgqueue.claim_key), so that dumps of restores do not pile keys up.
SELECT pg_catalog.pg_extension_config_dump('pgqueue.claim_key',
    'WHERE made_at = (SELECT pg_catalog.min(k.made_at) FROM pgqueue.claim_key k)');

-- Prune backoff: queues whose pruning was blocked or skipped repeatedly wait a while.
CREATE TABLE pgqueue.prune_state (
    queue       text PRIMARY KEY REFERENCES pgqueue.queues ON DELETE CASCADE,
    failures    integer NOT NULL,
    retry_after timestamptz NOT NULL
);

-- One row: what the background worker (or pgq_tick) has done in this database. Written at
-- the end of every tick, so it doubles as a liveness signal; the counters only grow (they
-- survive restarts of the worker and of the server).
CREATE TABLE pgqueue.worker_state (
    singleton            boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    pid                  integer,
    started_at           timestamptz,
    last_tick_at         timestamptz,
    last_prune_at        timestamptz,
    tick_interval_ms     integer,
    ticks                bigint NOT NULL DEFAULT 0,
    tick_failures        bigint NOT NULL DEFAULT 0,
    promote_failures     bigint NOT NULL DEFAULT 0,
    orphan_failures      bigint NOT NULL DEFAULT 0,
    rearm_failures       bigint NOT NULL DEFAULT 0,
    partition_failures   bigint NOT NULL DEFAULT 0,
    prune_failures       bigint NOT NULL DEFAULT 0,
    promoted             bigint NOT NULL DEFAULT 0,
    orphans_expired      bigint NOT NULL DEFAULT 0,
    rearmed              bigint NOT NULL DEFAULT 0,
    dead_lettered        bigint NOT NULL DEFAULT 0,
    rescue_batches       bigint NOT NULL DEFAULT 0,
    rescue_rows          bigint NOT NULL DEFAULT 0,
    partitions_created   bigint NOT NULL DEFAULT 0,
    prune_pruned         bigint NOT NULL DEFAULT 0,
    prune_noop           bigint NOT NULL DEFAULT 0,
    prune_blocked        bigint NOT NULL DEFAULT 0,
    prune_skipped_active bigint NOT NULL DEFAULT 0,
    prune_backed_off     bigint NOT NULL DEFAULT 0,
    prune_error          bigint NOT NULL DEFAULT 0,
    pruned_rows          bigint NOT NULL DEFAULT 0,
    last_error           text,
    last_error_at        timestamptz,
    reconcile_failures   bigint NOT NULL DEFAULT 0,
    hint_corrections     bigint NOT NULL DEFAULT 0, -- claim hints the tick found too high
    schedule_failures    bigint NOT NULL DEFAULT 0,
    keys_failures        bigint NOT NULL DEFAULT 0,
    scheduled_runs       bigint NOT NULL DEFAULT 0, -- runs enqueued by schedules
    missed_runs          bigint NOT NULL DEFAULT 0, -- slots passed over (see pgq_schedule's missed)
    schedule_errors      bigint NOT NULL DEFAULT 0, -- runs whose enqueue failed
    keys_expired         bigint NOT NULL DEFAULT 0, -- dedup keys deleted after their hold
    rollup_failures      bigint NOT NULL DEFAULT 0,
    last_rollup_at       timestamptz,               -- the rollup step's last record
    dependency_failures  bigint NOT NULL DEFAULT 0,
    released             bigint NOT NULL DEFAULT 0, -- pending messages the tick found done waiting
    park_failures        bigint NOT NULL DEFAULT 0,
    park_timeouts        bigint NOT NULL DEFAULT 0, -- parked messages whose wait ended with no signal
    claims_failures      bigint NOT NULL DEFAULT 0,
    claims_pruned        bigint NOT NULL DEFAULT 0  -- claim ledger rows deleted, none of their messages held
);
INSERT INTO pgqueue.worker_state DEFAULT VALUES;
