-- pgqueue 0.3.0 -> 0.4.0: periodic schedules fired by the worker, and unique jobs
-- (dedup keys). Function bodies are those of sql/*.sql in 0.4.0.

-- Unique jobs: the key a message holds, and the keys themselves.
ALTER TABLE pgqueue.messages ADD COLUMN dedup_key text;
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

SELECT pg_catalog.pg_extension_config_dump('pgqueue.dedup_keys', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.schedules', '');

-- The tick's new steps and what they count. Added without a default and then filled, so
-- that the catalog matches a fresh install's (a default given to ADD COLUMN is kept as the
-- column's "missing value").
ALTER TABLE pgqueue.worker_state
    ADD COLUMN schedule_failures bigint,
    ADD COLUMN keys_failures bigint,
    ADD COLUMN scheduled_runs bigint,
    ADD COLUMN missed_runs bigint,
    ADD COLUMN schedule_errors bigint,
    ADD COLUMN keys_expired bigint;
UPDATE pgqueue.worker_state SET schedule_failures = 0, keys_failures = 0, scheduled_runs = 0, missed_runs = 0, schedule_errors = 0, keys_expired = 0;
ALTER TABLE pgqueue.worker_state
    ALTER COLUMN schedule_failures SET DEFAULT 0, ALTER COLUMN schedule_failures SET NOT NULL,
    ALTER COLUMN keys_failures SET DEFAULT 0, ALTER COLUMN keys_failures SET NOT NULL,
    ALTER COLUMN scheduled_runs SET DEFAULT 0, ALTER COLUMN scheduled_runs SET NOT NULL,
    ALTER COLUMN missed_runs SET DEFAULT 0, ALTER COLUMN missed_runs SET NOT NULL,
    ALTER COLUMN schedule_errors SET DEFAULT 0, ALTER COLUMN schedule_errors SET NOT NULL,
    ALTER COLUMN keys_expired SET DEFAULT 0, ALTER COLUMN keys_expired SET NOT NULL;

-- The library's new functions.
CREATE FUNCTION pgqueue."_cron_problem"(
	"pattern" TEXT /* & str */
) RETURNS TEXT /* Option < String > */
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_cron_problem_wrapper';

CREATE FUNCTION pgqueue."_time_zone_problem"(
	"time_zone" TEXT /* & str */
) RETURNS TEXT /* Option < String > */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_time_zone_problem_wrapper';

CREATE FUNCTION pgqueue."_cron_next"(
	"pattern" TEXT, /* & str */
	"time_zone" TEXT, /* & str */
	"after" timestamp with time zone, /* TimestampWithTimeZone */
	"count" INT /* i32 */
) RETURNS SETOF timestamp with time zone /* TimestampWithTimeZone */
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_cron_next_wrapper';

CREATE FUNCTION pgqueue."_local_time"(
	"at" timestamp with time zone, /* TimestampWithTimeZone */
	"time_zone" TEXT /* & str */
) RETURNS timestamp /* Option < pgrx :: datum :: Timestamp > */
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_local_time_wrapper';

CREATE FUNCTION pgqueue."_due_slots"(
	"pattern" TEXT, /* & str */
	"time_zone" TEXT, /* & str */
	"next_run" timestamp with time zone, /* TimestampWithTimeZone */
	"at" timestamp with time zone, /* TimestampWithTimeZone */
	"missed_before" timestamp with time zone, /* TimestampWithTimeZone */
	"catch_up" bool /* bool */
) RETURNS TABLE (
	"slots" timestamp with time zone[],  /* Vec < TimestampWithTimeZone > */
	"catch_up_slot" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"missed" bigint,  /* i64 */
	"next_run" timestamp with time zone  /* Option < TimestampWithTimeZone > */
)
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_due_slots_wrapper';

-- New argument checks.
-- Unique jobs: a key of 1 to 512 characters (NULL: none) and how long it stays taken after
-- the message finishes: 0 to 365 days.
CREATE FUNCTION pgqueue._check_dedup(dedup_key text, dedup_for interval, argument text DEFAULT 'dedup_key')
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF pg_catalog.length(dedup_key) NOT BETWEEN 1 AND 512 THEN
        PERFORM pgqueue._invalid(argument, pg_catalog.format('a key of %s characters; 1 to 512', pg_catalog.length(dedup_key)));
    END IF;
    IF pgqueue._require(dedup_for, 'dedup_for') < interval '0' OR dedup_for > interval '365 days' THEN
        PERFORM pgqueue._invalid('dedup_for', pg_catalog.format('%s is not between 0 and 365 days', dedup_for));
    END IF;
END
$$;

-- Schedule names: 1 to 100 letters, digits and _ . : / - (not starting with a punctuation mark).
CREATE FUNCTION pgqueue._check_schedule_name(name text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF pgqueue._require(name, 'name') !~ '^[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,99}$' THEN
        PERFORM pgqueue._invalid('name', pg_catalog.format(
            '%L is not a schedule name (1 to 100 letters, digits or _ . : / -, starting with a letter, digit or _)',
            pg_catalog.left(name, 120)));
    END IF;
    RETURN name;
END
$$;

-- A cron pattern (src/schedule.rs says which: the offending field is named) and an IANA time
-- zone name.
CREATE FUNCTION pgqueue._check_cron(cron text, time_zone text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    problem text := pgqueue._cron_problem(pgqueue._require(cron, 'cron'));
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM pgqueue._invalid('cron', pg_catalog.format('%L: %s', cron, problem));
    END IF;
    problem := pgqueue._time_zone_problem(pgqueue._require(time_zone, 'time_zone'));
    IF problem IS NOT NULL THEN
        PERFORM pgqueue._invalid('time_zone', problem);
    END IF;
END
$$;

-- The schedule's row, locked for the change that follows; 42704 when it does not exist.
CREATE FUNCTION pgqueue._schedule(name text) RETURNS pgqueue.schedules
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    s pgqueue.schedules;
BEGIN
    SELECT * INTO s FROM pgqueue.schedules sc WHERE sc.name = _schedule.name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM pgqueue._check_schedule_name(name);
        RAISE EXCEPTION 'pgqueue: schedule "%" does not exist', name USING ERRCODE = 'undefined_object';
    END IF;
    RETURN s;
END
$$;

-- Sends take a dedup key (new last arguments: the functions are replaced).
-- Unique jobs: takes `dedup_key` in `queue` for message `msg_id`, unless a message holds it
-- (waiting, delayed or claimed, or finished less than its hold ago). Returns the msg_id that
-- holds the key: msg_id itself if it was free. A concurrent send of the same key waits here
-- until this transaction ends (the primary key's insert), so exactly one of them takes it;
-- a rolled-back send leaves it free. A key found held is only read, never locked: a
-- duplicate send holds up no ack of the holder (and cannot deadlock with one).
CREATE FUNCTION pgqueue._take_key(queue text, dedup_key text, msg_id bigint, hold interval) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_variable
DECLARE
    holder bigint;
    expiry timestamptz;
BEGIN
    -- Each pass ends unless another transaction changed the key meanwhile.
    LOOP
        INSERT INTO pgqueue.dedup_keys AS d (queue, dedup_key, msg_id, hold)
        VALUES (queue, dedup_key, msg_id, hold)
        ON CONFLICT ON CONSTRAINT dedup_keys_pkey DO NOTHING;
        IF FOUND THEN
            RETURN msg_id;
        END IF;
        SELECT d.msg_id, d.expires_at INTO holder, expiry
          FROM pgqueue.dedup_keys d WHERE d.queue = queue AND d.dedup_key = dedup_key;
        IF FOUND AND (expiry IS NULL OR expiry > pg_catalog.clock_timestamp()) THEN
            RETURN holder;
        ELSIF FOUND THEN
            -- Its hold has ended: take it over, unless another send just did.
            UPDATE pgqueue.dedup_keys d SET msg_id = _take_key.msg_id, hold = _take_key.hold, expires_at = NULL
             WHERE d.queue = queue AND d.dedup_key = dedup_key AND d.expires_at <= pg_catalog.clock_timestamp();
            IF FOUND THEN
                RETURN msg_id;
            END IF;
        END IF;
    END LOOP;
END
$$;

DROP FUNCTION pgqueue.pgq_send_batch(text, jsonb[], interval, smallint, jsonb);
CREATE FUNCTION pgqueue.pgq_send_batch(
    queue text,
    payloads jsonb[],
    delay interval DEFAULT '0',
    priority smallint DEFAULT 0,
    headers jsonb DEFAULT NULL,
    dedup_keys text[] DEFAULT NULL,
    dedup_for interval DEFAULT '0'
) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    q pgqueue.queues := pgqueue._lock_queue(queue);
    due timestamptz;
BEGIN
    PERFORM pgqueue._check_payloads(payloads);
    PERFORM pgqueue._check_delay(pgqueue._require(delay, 'delay'), 'delay');
    PERFORM pgqueue._check_priority(priority);
    IF pg_catalog.cardinality(payloads) > 10000 THEN
        PERFORM pgqueue._invalid('payloads', pg_catalog.format(
            '%s messages in one call; at most 10000', pg_catalog.cardinality(payloads)));
    END IF;
    IF dedup_keys IS NOT NULL THEN
        -- Keyed: one send each, in array order (a key repeated in the batch returns the
        -- first one's id).
        IF pg_catalog.cardinality(dedup_keys) <> pg_catalog.cardinality(payloads) THEN
            PERFORM pgqueue._invalid('dedup_keys', pg_catalog.format(
                '%s keys for %s payloads', pg_catalog.cardinality(dedup_keys), pg_catalog.cardinality(payloads)));
        END IF;
        PERFORM pgqueue._check_dedup(k, dedup_for, 'dedup_keys') FROM unnest(dedup_keys) k;
        RETURN QUERY
        SELECT pgqueue.pgq_send(q.queue, u.p, delay, priority, headers, u.k, dedup_for)
          FROM unnest(payloads, dedup_keys) WITH ORDINALITY AS u(p, k, n) ORDER BY u.n;
        RETURN;
    END IF;
    IF dedup_for IS DISTINCT FROM interval '0' THEN
        PERFORM pgqueue._check_dedup(NULL, dedup_for);
    END IF;
    due := CASE WHEN delay > interval '0' THEN now() + delay END;
    RETURN QUERY
    WITH sent AS (
        INSERT INTO pgqueue.messages (queue, state, priority, payload, headers, visible_at)
        SELECT q.queue, CASE WHEN due IS NULL THEN 'ready' ELSE 'delayed' END, priority, p, headers, due
          FROM pg_catalog.unnest(payloads) WITH ORDINALITY AS u(p, n)
         ORDER BY u.n
        RETURNING messages.msg_id
    ), noted AS (
        SELECT pgqueue._note(q.queue, count(*), NULL, CASE WHEN due IS NULL THEN 'ready' ELSE 'delayed' END,
                             priority, min(s.msg_id), max(s.msg_id), due)
          FROM sent s
    )
    SELECT s.msg_id FROM sent s, noted ORDER BY s.msg_id;
END
$$;

DROP FUNCTION pgqueue.pgq_send(text, jsonb, interval, smallint, jsonb);
CREATE FUNCTION pgqueue.pgq_send(
    queue text,
    payload jsonb,
    delay interval DEFAULT '0',
    priority smallint DEFAULT 0,
    headers jsonb DEFAULT NULL,
    dedup_key text DEFAULT NULL,
    dedup_for interval DEFAULT '0'
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    q pgqueue.queues := pgqueue._lock_queue(queue);
    due timestamptz;
    id bigint;
    holder bigint;
BEGIN
    PERFORM pgqueue._check_payload(payload);
    PERFORM pgqueue._check_delay(pgqueue._require(delay, 'delay'), 'delay');
    PERFORM pgqueue._check_priority(priority);
    IF dedup_key IS NOT NULL OR dedup_for IS DISTINCT FROM interval '0' THEN
        PERFORM pgqueue._check_dedup(dedup_key, dedup_for);
    END IF;
    IF dedup_key IS NOT NULL THEN
        -- The id is drawn first: the key row names the message that holds it.
        id := pg_catalog.nextval('pgqueue.messages_msg_id_seq');
        holder := pgqueue._take_key(q.queue, dedup_key, id, dedup_for);
        IF holder <> id THEN
            RETURN holder;  -- taken: no second copy
        END IF;
    END IF;
    due := CASE WHEN delay > interval '0' THEN now() + delay END;
    INSERT INTO pgqueue.messages (msg_id, queue, state, priority, payload, headers, visible_at, dedup_key)
    OVERRIDING SYSTEM VALUE
    VALUES (coalesce(id, pg_catalog.nextval('pgqueue.messages_msg_id_seq')), q.queue,
            CASE WHEN due IS NULL THEN 'ready' ELSE 'delayed' END, priority, payload, headers, due, dedup_key)
    RETURNING msg_id INTO id;
    PERFORM pgqueue._note(q.queue, 1, NULL, CASE WHEN due IS NULL THEN 'ready' ELSE 'delayed' END,
                          priority, id, id, due);
    RETURN id;
END
$$;

-- Finishing a message releases its key; dropping a queue deletes its keys.
-- Moves messages out of the hot table into their queue's history, as completed or dead, in
-- one statement. With claim_tokens, only the claims still held under those tokens move (the
-- fence); without (NULL), the given messages move. Returns the ids that moved.
-- PL/pgSQL rather than SQL: its statements' plans are cached across calls.
CREATE OR REPLACE FUNCTION pgqueue._to_history(msg_ids bigint[], claim_tokens uuid[], outcome text, error text DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_variable
BEGIN
    RETURN QUERY
    WITH gone AS (
        DELETE FROM pgqueue.messages m
         USING unnest(msg_ids, claim_tokens) AS u(id, token)
         WHERE m.msg_id = u.id AND (claim_tokens IS NULL OR (m.claim_token = u.token AND m.state = 'claimed'))
        RETURNING m.msg_id, m.queue, m.state, m.priority, m.attempt, m.payload, m.headers, m.enqueued_at,
                  m.last_error, m.dedup_key
    ), released AS (
        -- Unique jobs: a finished message's key is free again, or kept for its hold.
        DELETE FROM pgqueue.dedup_keys d USING gone g
         WHERE g.dedup_key IS NOT NULL AND d.queue = g.queue AND d.dedup_key = g.dedup_key
           AND d.msg_id = g.msg_id AND d.hold = interval '0'
    ), held AS (
        UPDATE pgqueue.dedup_keys d SET expires_at = now() + d.hold FROM gone g
         WHERE g.dedup_key IS NOT NULL AND d.queue = g.queue AND d.dedup_key = g.dedup_key
           AND d.msg_id = g.msg_id AND d.hold > interval '0'
    ), kept AS (
        INSERT INTO pgqueue.history (msg_id, queue, outcome, priority, attempt, payload, headers,
                                     enqueued_at, last_error)
        SELECT g.msg_id, g.queue, outcome, g.priority, g.attempt, g.payload, g.headers,
               g.enqueued_at, coalesce(error, g.last_error)
          FROM gone g
        RETURNING history.msg_id
    ), noted AS (
        SELECT pgqueue._note(g.queue, count(*), g.state, NULL) FROM gone g GROUP BY g.queue, g.state
    )
    SELECT k.msg_id FROM kept k, (SELECT count(*) FROM noted) n ORDER BY k.msg_id;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.pgq_drop_queue(queue text, force boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '5s' AS $$
DECLARE
    in_flight bigint;
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
    SELECT count(*) INTO in_flight FROM pgqueue.messages m
     WHERE m.queue = pgq_drop_queue.queue AND m.state = 'claimed';
    IF in_flight > 0 AND NOT force THEN
        RAISE EXCEPTION 'pgqueue: queue "%" has % claimed messages', queue, in_flight
            USING ERRCODE = 'object_in_use',
                  HINT = 'Wait for the consumers to finish, or pass force => true.';
    END IF;
    DELETE FROM pgqueue.messages m WHERE m.queue = pgq_drop_queue.queue;
    DELETE FROM pgqueue.dedup_keys d WHERE d.queue = pgq_drop_queue.queue;
    DELETE FROM pgqueue.queues q WHERE q.queue = pgq_drop_queue.queue;
    PERFORM pgqueue._reset_queue(queue);  -- at commit; its waiting claims then find it gone
    -- Dropping a partition locks pgqueue.history exclusively: wait for that at most
    -- lock_timeout (5 s, this function's setting), then fail with 55P03 and change nothing.
    EXECUTE pg_catalog.format('DROP TABLE pgqueue.%I', pgqueue._history_table(queue));
END
$$;

-- Schedules (sql/schedule.sql).
CREATE FUNCTION pgqueue.pgq_cron_next(
    cron text,
    time_zone text DEFAULT 'UTC',
    after timestamptz DEFAULT now(),
    count integer DEFAULT 1
) RETURNS SETOF timestamptz
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgqueue._check_cron(cron, time_zone);
    IF pgqueue._require(count, 'count') NOT BETWEEN 1 AND 1000 THEN
        PERFORM pgqueue._invalid('count', pg_catalog.format('%s is not between 1 and 1000', count));
    END IF;
    IF NOT isfinite(pgqueue._require(after, 'after')) THEN
        PERFORM pgqueue._invalid('after', 'not a finite time');
    END IF;
    RETURN QUERY SELECT pgqueue._cron_next(cron, time_zone, after, count);
END
$$;

CREATE FUNCTION pgqueue.pgq_schedule(
    name text,
    queue text,
    cron text,
    payload jsonb DEFAULT '{}',
    time_zone text DEFAULT 'UTC',
    priority smallint DEFAULT 0,
    headers jsonb DEFAULT NULL,
    paused boolean DEFAULT false,
    missed text DEFAULT 'skip',
    grace interval DEFAULT '1 minute'
) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    s pgqueue.schedules;
    next_at timestamptz;
BEGIN
    PERFORM pgqueue._check_schedule_name(name);
    PERFORM pgqueue._queue(queue);
    PERFORM pgqueue._check_cron(cron, time_zone);
    PERFORM pgqueue._check_payload(payload);
    PERFORM pgqueue._check_priority(priority);
    IF jsonb_typeof(headers) <> 'object' THEN
        PERFORM pgqueue._invalid('headers', 'a JSON object or NULL');
    END IF;
    PERFORM pgqueue._require(paused, 'paused');
    IF pgqueue._require(missed, 'missed') NOT IN ('skip', 'catch_up') THEN
        PERFORM pgqueue._invalid('missed', pg_catalog.format('%L is neither ''skip'' nor ''catch_up''', missed));
    END IF;
    IF pgqueue._require(grace, 'grace') < interval '1 second' OR grace > interval '1 day' THEN
        PERFORM pgqueue._invalid('grace', pg_catalog.format('%s is not between 1 second and 1 day', grace));
    END IF;
    SELECT * INTO s FROM pgqueue.schedules sc WHERE sc.name = name FOR UPDATE;
    IF FOUND AND NOT s.paused AND s.cron = cron AND s.time_zone = time_zone AND s.next_run IS NOT NULL THEN
        next_at := s.next_run;  -- the same times: a slot due and not yet fired stays due
    ELSE
        -- The first slot after now, and after the last run (never one slot twice); after a
        -- pause, what passed meanwhile is not run.
        next_at := pgqueue._cron_next(cron, time_zone, greatest(now(), s.last_run), 1);
    END IF;
    INSERT INTO pgqueue.schedules AS sc (name, queue, cron, time_zone, payload, headers, priority, paused, missed,
                                         grace, next_run)
    VALUES (name, queue, cron, time_zone, payload, headers, priority, paused, missed, grace, next_at)
    ON CONFLICT ON CONSTRAINT schedules_pkey DO UPDATE
       SET queue = excluded.queue, cron = excluded.cron, time_zone = excluded.time_zone,
           payload = excluded.payload, headers = excluded.headers, priority = excluded.priority,
           paused = excluded.paused, missed = excluded.missed, grace = excluded.grace,
           next_run = excluded.next_run;
    RETURN next_at;
END
$$;

CREATE FUNCTION pgqueue.pgq_unschedule(name text, if_exists boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgqueue._check_schedule_name(name);
    PERFORM pgqueue._require(if_exists, 'if_exists');
    DELETE FROM pgqueue.schedules sc WHERE sc.name = pgq_unschedule.name;
    IF NOT FOUND THEN
        IF if_exists THEN
            RAISE NOTICE 'pgqueue: schedule "%" does not exist, skipping', name;
            RETURN;
        END IF;
        PERFORM pgqueue._schedule(name);  -- raises the error
    END IF;
END
$$;

-- A paused schedule fires nothing; resumed, it continues from its next slot after now (the
-- slots passed while paused are not runs, nor counted as missed).
CREATE FUNCTION pgqueue._set_schedule_paused(name text, paused boolean) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    s pgqueue.schedules := pgqueue._schedule(name);
BEGIN
    IF s.paused = paused THEN
        RETURN;
    END IF;
    UPDATE pgqueue.schedules sc
       SET paused = _set_schedule_paused.paused,
           next_run = CASE WHEN _set_schedule_paused.paused THEN sc.next_run
                           ELSE (SELECT pgqueue._cron_next(sc.cron, sc.time_zone, greatest(now(), sc.last_run), 1)) END
     WHERE sc.name = s.name;
END
$$;

CREATE FUNCTION pgqueue.pgq_pause_schedule(name text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT pgqueue._set_schedule_paused(name, true);
END;

CREATE FUNCTION pgqueue.pgq_resume_schedule(name text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT pgqueue._set_schedule_paused(name, false);
END;

-- One run of a schedule, for `slot`: the schedule's message, with headers naming the schedule
-- and the slot (UTC, ISO 8601), plus missed_runs for a catch-up run. The key schedule:name@slot
-- keeps a slot from being enqueued twice while its message waits or runs; a key someone else
-- holds (a producer may send any key) is an error, not a silent run.
CREATE FUNCTION pgqueue._fire(s pgqueue.schedules, slot timestamptz, missed_runs bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    at text := pg_catalog.to_char(slot AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"');
    key text := 'schedule:' || s.name || '@' || at;
    id bigint;
BEGIN
    id := pgqueue.pgq_send(s.queue, s.payload, priority => s.priority,
        headers => coalesce(s.headers, '{}') || jsonb_build_object('schedule', s.name, 'scheduled_for', at)
                   || CASE WHEN missed_runs IS NULL THEN '{}' ELSE jsonb_build_object('missed_runs', missed_runs) END,
        dedup_key => key);
    IF NOT EXISTS (SELECT FROM pgqueue.messages m
                    WHERE m.msg_id = id AND m.dedup_key = key AND m.headers ->> 'schedule' = s.name) THEN
        RAISE EXCEPTION 'pgqueue: the key % of this run is held by message %, not a run of this schedule', key, id
            USING ERRCODE = 'unique_violation';
    END IF;
    RETURN id;
END
$$;

-- Tick step "schedule": fires up to max_rows due schedules, earliest first, each in a
-- subtransaction, so a failing one never holds up the others. Its runs are rolled back: if
-- it met a lock or serialization conflict (lock timeout, deadlock, a concurrent change in
-- REPEATABLE READ) the next tick tries the same slots again; any other error counts each of
-- those runs as failed (on its row and in the result) and the schedule goes on from its next
-- slot. `at` stands for now (tests pass other times). Slots later than the schedule's grace
-- are missed: counted, and with missed = 'catch_up' the latest of them is enqueued once.
-- `more`: max_rows were due. A batch stays under 64 subtransactions, so other sessions'
-- snapshots never overflow.
CREATE FUNCTION pgqueue._fire_schedules(max_rows integer DEFAULT 50, at timestamptz DEFAULT NULL)
RETURNS TABLE (fired bigint, missed bigint, failed bigint, more boolean)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    now_at timestamptz := coalesce(at, now());
    s pgqueue.schedules;
    d record;
    slot timestamptz;
    n bigint;
    id bigint;
    last_slot timestamptz;
    problem text;
    code text;
    runs integer;  -- this firing's runs (at least one, for the failure count)
    seen integer := 0;
BEGIN
    fired := 0;
    missed := 0;
    failed := 0;
    FOR s IN SELECT * FROM pgqueue.schedules sc WHERE NOT sc.paused AND sc.next_run <= now_at
              ORDER BY sc.next_run LIMIT max_rows FOR UPDATE SKIP LOCKED LOOP
        seen := seen + 1;
        runs := 1;
        BEGIN
            SELECT * INTO d FROM pgqueue._due_slots(s.cron, s.time_zone, s.next_run, now_at, now_at - s.grace,
                                                    s.missed = 'catch_up');
            runs := greatest(cardinality(d.slots) + (d.catch_up_slot IS NOT NULL)::integer, 1);
            n := 0;
            id := NULL;
            last_slot := NULL;
            IF d.catch_up_slot IS NOT NULL THEN
                id := pgqueue._fire(s, d.catch_up_slot, d.missed);
                n := n + 1;
                last_slot := d.catch_up_slot;
            END IF;
            FOREACH slot IN ARRAY d.slots LOOP
                id := pgqueue._fire(s, slot, NULL);
                n := n + 1;
                last_slot := slot;
            END LOOP;
            IF d.next_run IS NULL THEN
                RAISE EXCEPTION 'no next time for cron % in %', s.cron, s.time_zone;
            END IF;
            UPDATE pgqueue.schedules sc
               SET next_run = d.next_run, runs = sc.runs + n, missed_runs = sc.missed_runs + d.missed,
                   last_run = coalesce(last_slot, sc.last_run), last_msg_id = coalesce(id, sc.last_msg_id),
                   last_fired_at = CASE WHEN n > 0 THEN clock_timestamp() ELSE sc.last_fired_at END
             WHERE sc.name = s.name;
            fired := fired + n;
            missed := missed + d.missed;
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT, code = RETURNED_SQLSTATE;
            IF problem IS DISTINCT FROM s.last_error THEN
                RAISE WARNING 'pgqueue: schedule "%" failed to enqueue its run for %: %', s.name, s.next_run, problem;
            END IF;
            IF code LIKE '40%' OR code = '55P03' THEN
                -- A conflict: the same slots next tick.
                UPDATE pgqueue.schedules sc SET last_error = problem, last_error_at = now() WHERE sc.name = s.name;
            ELSE
                -- Every run of this firing failed; passed over to the next slot (NULL if none
                -- can be computed: the schedule stops, reported).
                failed := failed + runs;
                UPDATE pgqueue.schedules sc
                   SET next_run = (SELECT pgqueue._cron_next(sc.cron, sc.time_zone, now_at, 1)),
                       failures = sc.failures + runs, last_error = problem, last_error_at = now()
                 WHERE sc.name = s.name;
            END IF;
        END;
    END LOOP;
    more := seen >= max_rows;
    RETURN NEXT;
END
$$;

-- The tick's new step and counters.
-- Step "keys": unique-job keys whose hold has ended are deleted, up to max_rows (a send
-- would take such a key over anyway; this keeps the table small). statement_timestamp(), not
-- clock_timestamp(): the expiry index can then bound the scan.
CREATE FUNCTION pgqueue._expire_dedup_keys(max_rows integer) RETURNS bigint
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH expired AS (
        SELECT d.queue, d.dedup_key FROM pgqueue.dedup_keys d
         WHERE d.expires_at <= statement_timestamp()
         ORDER BY d.expires_at LIMIT max_rows
           FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM pgqueue.dedup_keys d USING expired e
         WHERE d.queue = e.queue AND d.dedup_key = e.dedup_key
        RETURNING 1
    )
    SELECT count(*) FROM gone;
END;

-- Adds one tick's counts (a jsonb of counter => increment, plus "error" and flags) to the
-- worker_state row.
CREATE OR REPLACE FUNCTION pgqueue._record_tick(counts jsonb) RETURNS void
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    UPDATE pgqueue.worker_state SET
        pid = pg_backend_pid(),
        started_at = CASE WHEN (counts->>'first')::boolean THEN now() ELSE started_at END,
        last_tick_at = now(),
        last_prune_at = CASE WHEN (counts->>'pruned')::boolean THEN now() ELSE last_prune_at END,
        tick_interval_ms = (counts->>'tick_interval_ms')::integer,
        ticks = ticks + 1,
        tick_failures = tick_failures + coalesce((counts->>'tick_failures')::bigint, 0),
        promote_failures = promote_failures + coalesce((counts->>'promote_failures')::bigint, 0),
        orphan_failures = orphan_failures + coalesce((counts->>'orphan_failures')::bigint, 0),
        rearm_failures = rearm_failures + coalesce((counts->>'rearm_failures')::bigint, 0),
        partition_failures = partition_failures + coalesce((counts->>'partition_failures')::bigint, 0),
        reconcile_failures = reconcile_failures + coalesce((counts->>'reconcile_failures')::bigint, 0),
        prune_failures = prune_failures + coalesce((counts->>'prune_failures')::bigint, 0),
        promoted = promoted + coalesce((counts->>'promoted')::bigint, 0),
        orphans_expired = orphans_expired + coalesce((counts->>'orphans_expired')::bigint, 0),
        rearmed = rearmed + coalesce((counts->>'rearmed')::bigint, 0),
        dead_lettered = dead_lettered + coalesce((counts->>'dead_lettered')::bigint, 0),
        rescue_batches = rescue_batches + coalesce((counts->>'rescue_batches')::bigint, 0),
        rescue_rows = rescue_rows + coalesce((counts->>'rescue_rows')::bigint, 0),
        partitions_created = partitions_created + coalesce((counts->>'partitions_created')::bigint, 0),
        prune_pruned = prune_pruned + coalesce((counts->>'prune_pruned')::bigint, 0),
        prune_noop = prune_noop + coalesce((counts->>'prune_noop')::bigint, 0),
        prune_blocked = prune_blocked + coalesce((counts->>'prune_blocked')::bigint, 0),
        prune_skipped_active = prune_skipped_active + coalesce((counts->>'prune_skipped_active')::bigint, 0),
        prune_backed_off = prune_backed_off + coalesce((counts->>'prune_backed_off')::bigint, 0),
        prune_error = prune_error + coalesce((counts->>'prune_error')::bigint, 0),
        pruned_rows = pruned_rows + coalesce((counts->>'pruned_rows')::bigint, 0),
        hint_corrections = hint_corrections + coalesce((counts->>'hint_corrections')::bigint, 0),
        schedule_failures = schedule_failures + coalesce((counts->>'schedule_failures')::bigint, 0),
        keys_failures = keys_failures + coalesce((counts->>'keys_failures')::bigint, 0),
        scheduled_runs = scheduled_runs + coalesce((counts->>'scheduled_runs')::bigint, 0),
        missed_runs = missed_runs + coalesce((counts->>'missed_runs')::bigint, 0),
        schedule_errors = schedule_errors + coalesce((counts->>'schedule_errors')::bigint, 0),
        keys_expired = keys_expired + coalesce((counts->>'keys_expired')::bigint, 0),
        last_error = coalesce(counts->>'error', last_error),
        last_error_at = CASE WHEN counts ? 'error' THEN now() ELSE last_error_at END;
END;

CREATE OR REPLACE VIEW pgqueue.worker_stats AS
SELECT current_database() AS database,
       w.pid, w.started_at, w.last_tick_at, now() - w.last_tick_at AS since_last_tick,
       w.last_prune_at, w.tick_interval_ms,
       w.ticks, w.tick_failures, w.promote_failures, w.orphan_failures, w.rearm_failures,
       w.partition_failures, w.prune_failures,
       w.promoted, w.orphans_expired, w.rearmed, w.dead_lettered, w.rescue_batches, w.rescue_rows,
       w.partitions_created, w.prune_pruned, w.prune_noop, w.prune_blocked,
       w.prune_skipped_active, w.prune_backed_off, w.prune_error, w.pruned_rows,
       w.last_error, w.last_error_at, w.reconcile_failures, w.hint_corrections,
       w.schedule_failures, w.keys_failures, w.scheduled_runs, w.missed_runs, w.schedule_errors, w.keys_expired
  FROM pgqueue.worker_state w;

-- Every schedule: when it runs next, its last run (the slot) and how late that was enqueued,
-- counts, and its last error. Times of day are the caller's TimeZone; next_run_local is in
-- the schedule's own zone, by the tz database the schedules run on (the library's).
CREATE VIEW pgqueue.schedule_stats AS
SELECT s.name, s.queue, s.cron, s.time_zone, s.paused, s.missed, s.grace,
       s.next_run, pgqueue._local_time(s.next_run, s.time_zone) AS next_run_local,
       s.last_run, s.last_fired_at - s.last_run AS last_lateness, s.last_msg_id,
       s.runs, s.missed_runs, s.failures, s.last_error, s.last_error_at, s.created_at
  FROM pgqueue.schedules s;

-- Privileges, as sql/privileges.sql gives them.
REVOKE ALL ON FUNCTION
    pgqueue._cron_problem(text), pgqueue._time_zone_problem(text),
    pgqueue._cron_next(text, text, timestamptz, integer), pgqueue._local_time(timestamptz, text),
    pgqueue._due_slots(text, text, timestamptz, timestamptz, timestamptz, boolean),
    pgqueue._check_dedup(text, interval, text), pgqueue._check_schedule_name(text),
    pgqueue._check_cron(text, text), pgqueue._schedule(text),
    pgqueue._take_key(text, text, bigint, interval),
    pgqueue.pgq_send_batch(text, jsonb[], interval, smallint, jsonb, text[], interval),
    pgqueue.pgq_send(text, jsonb, interval, smallint, jsonb, text, interval),
    pgqueue.pgq_cron_next(text, text, timestamptz, integer),
    pgqueue.pgq_schedule(text, text, text, jsonb, text, smallint, jsonb, boolean, text, interval),
    pgqueue.pgq_unschedule(text, boolean), pgqueue._set_schedule_paused(text, boolean),
    pgqueue.pgq_pause_schedule(text), pgqueue.pgq_resume_schedule(text),
    pgqueue._fire(pgqueue.schedules, timestamptz, bigint), pgqueue._fire_schedules(integer, timestamptz),
    pgqueue._expire_dedup_keys(integer)
FROM PUBLIC;
REVOKE ALL ON pgqueue.dedup_keys, pgqueue.schedules, pgqueue.schedule_stats FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    pgqueue.pgq_send(text, jsonb, interval, smallint, jsonb, text, interval),
    pgqueue.pgq_send_batch(text, jsonb[], interval, smallint, jsonb, text[], interval)
TO pgqueue_producer;
GRANT EXECUTE ON FUNCTION
    pgqueue.pgq_schedule(text, text, text, jsonb, text, smallint, jsonb, boolean, text, interval),
    pgqueue.pgq_unschedule(text, boolean),
    pgqueue.pgq_pause_schedule(text),
    pgqueue.pgq_resume_schedule(text)
TO pgqueue_admin;
GRANT SELECT ON pgqueue.schedule_stats TO pgqueue_admin, pg_monitor;
GRANT EXECUTE ON FUNCTION pgqueue._local_time(timestamptz, text) TO pgqueue_admin, pg_monitor;
GRANT EXECUTE ON FUNCTION pgqueue.pgq_cron_next(text, text, timestamptz, integer) TO PUBLIC;
-- Names only: PUBLIC may call pgq_version and pgq_cron_next, nothing else.
GRANT USAGE ON SCHEMA pgqueue TO PUBLIC;
