-- pgqueue 0.9.0 -> 0.10.0: cron patterns mean what Debian's cron makes of them (src/cron.rs,
-- docs/schedules.md): when either day field begins with `*`, both must match; a pattern whose
-- minute and hour both begin with something other than `*` (lists, ranges and steps too) is a
-- fixed-time job across daylight saving changes. The patterns are computed by the library,
-- which is replaced before this update; no function or table changes. This recomputes each
-- running schedule's next run by the new rules, from where it stands: a slot that is due stays
-- due, and no slot already run runs again. Each schedule whose next run moves is named in a
-- WARNING. Paused schedules get theirs when resumed, as always.
DO $update$
DECLARE
    s record;
    next_at timestamptz;
BEGIN
    FOR s IN SELECT sc.name, sc.cron, sc.time_zone, sc.next_run, sc.last_run
               FROM pgqueue.schedules sc
              WHERE NOT sc.paused AND sc.next_run IS NOT NULL
              ORDER BY sc.name FOR UPDATE LOOP
        -- At or after the next run if it is due, else after now; never at or before the last run.
        next_at := (SELECT pgqueue._cron_next(s.cron, s.time_zone,
                        greatest(s.last_run, least(s.next_run - interval '1 microsecond', now())), 1));
        IF next_at IS DISTINCT FROM s.next_run THEN
            UPDATE pgqueue.schedules sc SET next_run = next_at WHERE sc.name = s.name;
            RAISE WARNING 'pgqueue: schedule "%" (cron ''%'' in %) next runs at % instead of %',
                s.name, s.cron, s.time_zone, coalesce(next_at::text, 'no time (it stops)'), s.next_run
                USING HINT = 'pgqueue 0.10.0 reads cron patterns as Debian''s cron does: see docs/schedules.md.';
        END IF;
    END LOOP;
END
$update$;
