-- Periodic schedules: a cron pattern in a time zone enqueues a message into a queue at each of
-- its times ("slots"). The worker's tick (and pgq_tick) fires what is due: each schedule's
-- runs are enqueued and its next_run advanced in one transaction, the schedule's row locked
-- with SKIP LOCKED, so two tickers never fire one slot twice. Patterns and times are computed
-- in Rust (src/schedule.rs).

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

-- Enqueues one run of a schedule now, whatever its next run (unchanged) and even if paused;
-- its slot is the current second, so a second call within that second returns the same
-- message. Returns the msg_id.
CREATE FUNCTION pgqueue.pgq_run_schedule(name text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN pgqueue._fire(pgqueue._schedule(name), date_trunc('second', now()), NULL);
END
$$;

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
    IF NOT EXISTS (SELECT FROM pgqueue.message_rows m
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
            -- Logged once per error in a row: again when it differs, or when the schedule
            -- fired since it was last seen.
            IF problem IS DISTINCT FROM s.last_error OR s.last_fired_at > s.last_error_at THEN
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
