-- Argument checks shared by the API: every error the API raises comes from here, with its
-- SQLSTATE, so the messages and codes stay consistent (and documented in the README).
--
-- Internal helpers (names starting with _) pin no search_path themselves: they run inside
-- the API functions, which do (SECURITY DEFINER, search_path = pg_catalog, pg_temp), and a
-- SET clause would cost a settings save and restore on every call of the hot paths.

-- 22004: a required argument is NULL.
CREATE FUNCTION pgqueue._require(value anyelement, argument text) RETURNS anyelement
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'pgqueue: argument "%" must not be NULL', argument
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    RETURN value;
END
$$;

-- 22023: an argument's value is out of its documented range.
CREATE FUNCTION pgqueue._invalid(argument text, problem text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RAISE EXCEPTION 'pgqueue: invalid value for "%": %', argument, problem
        USING ERRCODE = 'invalid_parameter_value';
END
$$;

-- Queue names: a lower-case letter, then lower-case letters, digits or underscores;
-- 1 to 40 characters. They end up in partition names, so nothing else is accepted.
CREATE FUNCTION pgqueue._check_queue_name(queue text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM pgqueue._require(queue, 'queue');
    IF queue !~ '^[a-z][a-z0-9_]{0,39}$' THEN
        PERFORM pgqueue._invalid('queue', pg_catalog.format(
            '%L is not a queue name (a lower-case letter, then up to 39 lower-case letters, digits or underscores)',
            queue));
    END IF;
    RETURN queue;
END
$$;

-- The queue's settings; 42704 when it does not exist.
CREATE FUNCTION pgqueue._queue(queue text) RETURNS pgqueue.queues
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q pgqueue.queues;
BEGIN
    SELECT * INTO q FROM pgqueue.queues WHERE queues.queue = _queue.queue;
    IF NOT FOUND THEN
        PERFORM pgqueue._check_queue_name(queue);
        RAISE EXCEPTION 'pgqueue: queue "%" does not exist', queue
            USING ERRCODE = 'undefined_object';
    END IF;
    RETURN q;
END
$$;

-- The queue's settings, its row locked FOR KEY SHARE until commit, for the functions that
-- insert messages: pgq_drop_queue locks the row FOR UPDATE before it deletes the queue's
-- messages, so each insert either commits first (and is deleted with the queue) or finds the
-- queue gone (42704). A foreign key would do the same per row, but pg_restore --jobs loads
-- the data of an extension's tables in any order, and would fail on it.
CREATE FUNCTION pgqueue._lock_queue(queue text) RETURNS pgqueue.queues
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q pgqueue.queues;
BEGIN
    SELECT * INTO q FROM pgqueue.queues WHERE queues.queue = _lock_queue.queue FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN pgqueue._queue(queue);  -- raises the error
    END IF;
    RETURN q;
END
$$;

-- Leases: more than zero, at most one day.
CREATE FUNCTION pgqueue._check_lease(lease interval, argument text DEFAULT 'lease') RETURNS interval
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF lease IS NOT NULL AND (lease <= interval '0' OR lease > interval '1 day') THEN
        PERFORM pgqueue._invalid(argument, pg_catalog.format('%s is not between 0 (exclusive) and 1 day', lease));
    END IF;
    RETURN lease;
END
$$;

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

-- Delays and retry times: from zero to 365 days.
CREATE FUNCTION pgqueue._check_delay(delay interval, argument text) RETURNS interval
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF delay IS NOT NULL AND (delay < interval '0' OR delay > interval '365 days') THEN
        PERFORM pgqueue._invalid(argument, pg_catalog.format('%s is not between 0 and 365 days', delay));
    END IF;
    RETURN delay;
END
$$;

-- Priorities: -1000 to 1000, higher is claimed first (the same bounds as the CHECK).
CREATE FUNCTION pgqueue._check_priority(priority smallint) RETURNS smallint
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM pgqueue._require(priority, 'priority');
    IF priority NOT BETWEEN -1000 AND 1000 THEN
        PERFORM pgqueue._invalid('priority', pg_catalog.format('%s is not between -1000 and 1000', priority));
    END IF;
    RETURN priority;
END
$$;

-- Paired arrays (ids and tokens) must be non-NULL, one-dimensional and of the same length;
-- errors name the caller's arguments.
CREATE FUNCTION pgqueue._check_pairs(msg_ids bigint[], claim_tokens uuid[], ids_name text DEFAULT 'msg_ids',
                                     tokens_name text DEFAULT 'claim_tokens') RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM pgqueue._require(msg_ids, ids_name);
    PERFORM pgqueue._require(claim_tokens, tokens_name);
    IF pg_catalog.array_ndims(msg_ids) > 1 OR pg_catalog.array_ndims(claim_tokens) > 1 THEN
        PERFORM pgqueue._invalid(CASE WHEN pg_catalog.array_ndims(msg_ids) > 1 THEN ids_name ELSE tokens_name END,
                                 'a one-dimensional array is expected');
    END IF;
    IF pg_catalog.cardinality(msg_ids) <> pg_catalog.cardinality(claim_tokens) THEN
        PERFORM pgqueue._invalid(tokens_name, pg_catalog.format(
            '%s tokens for %s ids', pg_catalog.cardinality(claim_tokens), pg_catalog.cardinality(msg_ids)));
    END IF;
    IF pg_catalog.array_position(msg_ids, NULL) IS NOT NULL
       OR pg_catalog.array_position(claim_tokens, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'pgqueue: % and % must not contain NULL', ids_name, tokens_name
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
END
$$;

-- A list of msg_ids: not NULL, one-dimensional, no NULL in it (22004, 22023).
CREATE FUNCTION pgqueue._check_ids(msg_ids bigint[], argument text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM pgqueue._require(msg_ids, argument);
    IF pg_catalog.array_ndims(msg_ids) > 1 THEN
        PERFORM pgqueue._invalid(argument, 'a one-dimensional array is expected');
    END IF;
    IF pg_catalog.array_position(msg_ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'pgqueue: % must not contain NULL', argument USING ERRCODE = 'null_value_not_allowed';
    END IF;
END
$$;

-- 54000: a payload larger than pgqueue.max_payload_bytes (jsonb size, pg_column_size).
CREATE FUNCTION pgqueue._check_payload_size(size integer) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    max_size integer := pgqueue._max_payload_bytes();
BEGIN
    IF size > max_size THEN
        RAISE EXCEPTION 'pgqueue: payload of % bytes is larger than pgqueue.max_payload_bytes (%)', size, max_size
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
END
$$;

CREATE FUNCTION pgqueue._check_payload(payload jsonb, argument text DEFAULT 'payload') RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM pgqueue._require(payload, argument);
    PERFORM pgqueue._check_payload_size(pg_catalog.pg_column_size(payload));
    RETURN payload;
END
$$;

-- A whole batch's payloads in one pass: 22004 if any is NULL, 54000 if the largest is too big.
CREATE FUNCTION pgqueue._check_payloads(payloads jsonb[]) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    nulls bigint;
    largest integer;
BEGIN
    PERFORM pgqueue._require(payloads, 'payloads');
    SELECT count(*) FILTER (WHERE p IS NULL), max(pg_catalog.pg_column_size(p)) INTO nulls, largest
      FROM unnest(payloads) p;
    IF nulls > 0 THEN
        PERFORM pgqueue._require(NULL::jsonb, 'payloads');
    END IF;
    PERFORM pgqueue._check_payload_size(largest);
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
