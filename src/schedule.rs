//! Cron schedules in SQL: checking patterns and zones, their next times, the slots due
//! (`sql/schedule.sql` keeps the schedules and fires them). What a pattern means, in a time
//! zone and across daylight saving changes, is `cron.rs`; zones are chrono-tz's IANA
//! database.

use crate::cron::Pattern;
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::prelude::*;

/// Microseconds from 1970-01-01 (chrono) to 2000-01-01 (PostgreSQL), both UTC.
const PG_EPOCH_US: i64 = 946_684_800_000_000;
/// Slots fired for one schedule in one call; the rest follow in the next.
const MAX_SLOTS: usize = 1000;
/// Missed slots counted one by one at most this many per call (then reported as this many).
const MAX_MISSED_COUNT: i64 = 10_000;

const FIELDS: [&str; 6] = ["second", "minute", "hour", "day of month", "month", "day of week"];

/// What is wrong with a pattern, naming the offending field; None when it is valid and
/// matches some time in the next years.
fn pattern_problem(pattern: &str) -> Option<String> {
    let error = match Pattern::parse(pattern) {
        Ok(p) => {
            // SAFETY: reads the clock.
            let now = DateTime::from_timestamp_micros(unsafe { pg_sys::GetCurrentTimestamp() } + PG_EPOCH_US);
            let never = now.is_none_or(|now| p.next_after(Tz::UTC, now).is_none());
            return never.then(|| "it matches no time in the future".into());
        }
        Err(e) => e,
    };
    let fields: Vec<&str> = pattern.split_whitespace().collect();
    if pattern.trim_start().starts_with('@') {
        return Some(format!("{error} (macros: @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly)"));
    }
    if fields.len() != 5 && fields.len() != 6 {
        return Some(format!(
            "{} fields; expected 5 (minute hour day-of-month month day-of-week) or 6 (second first)",
            fields.len()
        ));
    }
    // The first field that fails on its own, all others being wildcards.
    let names = &FIELDS[6 - fields.len()..];
    for (i, field) in fields.iter().enumerate() {
        let alone: Vec<&str> = (0..fields.len()).map(|j| if j == i { *field } else { "*" }).collect();
        if let Err(e) = Pattern::parse(&alone.join(" ")) {
            return Some(format!("{} field \"{field}\": {e}", names[i]));
        }
    }
    Some(error.to_string())
}

/// A valid pattern and zone (checked by `_cron_problem` / `_time_zone_problem` when the
/// schedule was made); None if either no longer parses.
fn parse(pattern: &str, time_zone: &str) -> Option<(Pattern, Tz)> {
    Some((Pattern::parse(pattern).ok()?, zone(time_zone)?))
}

/// An IANA zone by name, in any case (as PostgreSQL's own time zone names).
fn zone(name: &str) -> Option<Tz> {
    name.parse().ok().or_else(|| chrono_tz::TZ_VARIANTS.iter().find(|z| z.name().eq_ignore_ascii_case(name)).copied())
}

fn to_utc(ts: TimestampWithTimeZone) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_micros(pg_sys::TimestampTz::from(ts).checked_add(PG_EPOCH_US)?)
}

fn to_pg(t: &DateTime<Utc>) -> Option<TimestampWithTimeZone> {
    TimestampWithTimeZone::try_from(t.timestamp_micros() - PG_EPOCH_US).ok()
}

/// NULL if `pattern` is a valid cron pattern, else what is wrong with it.
#[pg_extern(stable, parallel_safe)]
fn _cron_problem(pattern: &str) -> Option<String> {
    pattern_problem(pattern)
}

/// NULL if `time_zone` is an IANA time zone name, else what is wrong with it.
#[pg_extern(immutable, parallel_safe)]
fn _time_zone_problem(time_zone: &str) -> Option<String> {
    match zone(time_zone) {
        Some(_) => None,
        None => Some(format!("\"{time_zone}\" is not an IANA time zone name (such as UTC or Europe/Berlin)")),
    }
}

/// The next `count` times of a checked pattern strictly after `after`; none if the pattern or
/// zone does not parse.
#[pg_extern(stable, parallel_safe)]
fn _cron_next(
    pattern: &str,
    time_zone: &str,
    after: TimestampWithTimeZone,
    count: i32,
) -> SetOfIterator<'static, TimestampWithTimeZone> {
    let mut times = vec![];
    if let Some((p, tz)) = parse(pattern, time_zone) {
        let mut at = to_utc(after);
        for _ in 0..count.max(0) {
            at = at.and_then(|t| p.next_after(tz, t));
            match at.as_ref().and_then(to_pg) {
                Some(t) => times.push(t),
                None => break,
            }
        }
    }
    SetOfIterator::new(times)
}

/// `at` as wall-clock time in `time_zone` (by the same tz database the schedules use); NULL
/// if the zone is unknown.
#[pg_extern(stable, parallel_safe)]
fn _local_time(at: TimestampWithTimeZone, time_zone: &str) -> Option<pgrx::datum::Timestamp> {
    let local = to_utc(at)?.with_timezone(&zone(time_zone)?).naive_local().and_utc().timestamp_micros();
    pgrx::datum::Timestamp::try_from(local - PG_EPOCH_US).ok()
}

/// What a schedule due at `next_run` fires at `at`. Slots before `missed_before` were missed:
/// they are counted (`missed`), and with `catch_up` the latest of them is returned as
/// `catch_up_slot`. The slots from `missed_before` (or `next_run`) to `at` are `slots`, at
/// most 1000; `next_run` is the slot after the last of them. A pattern or zone that no
/// longer parses gives no slots and a NULL `next_run`.
#[pg_extern(stable, parallel_safe)]
#[allow(clippy::type_complexity)]
fn _due_slots(
    pattern: &str,
    time_zone: &str,
    next_run: TimestampWithTimeZone,
    at: TimestampWithTimeZone,
    missed_before: TimestampWithTimeZone,
    catch_up: bool,
) -> TableIterator<
    'static,
    (
        name!(slots, Vec<TimestampWithTimeZone>),
        name!(catch_up_slot, Option<TimestampWithTimeZone>),
        name!(missed, i64),
        name!(next_run, Option<TimestampWithTimeZone>),
    ),
> {
    let none = (vec![], None, 0, None);
    let Some((p, tz)) = parse(pattern, time_zone) else { return TableIterator::once(none) };
    let (Some(first), Some(at), Some(missed_before)) = (to_utc(next_run), to_utc(at), to_utc(missed_before)) else {
        return TableIterator::once(none);
    };
    let (mut missed, mut latest_missed) = (0, None);
    let mut slot = p.next_from(tz, first);
    if first < missed_before {
        while let Some(s) = slot.filter(|s| *s < missed_before) {
            missed += 1;
            latest_missed = Some(s);
            if missed >= MAX_MISSED_COUNT {
                // Counted no further: the latest missed slot is the last before missed_before.
                latest_missed = p.previous_before(tz, missed_before);
                break;
            }
            slot = p.next_after(tz, s);
        }
        slot = p.next_from(tz, missed_before);
    }
    let mut slots = vec![];
    while let Some(s) = slot.filter(|s| *s <= at && slots.len() < MAX_SLOTS) {
        slots.extend(to_pg(&s));
        slot = p.next_after(tz, s);
    }
    let catch_up_slot = if catch_up { latest_missed.as_ref().and_then(to_pg) } else { None };
    TableIterator::once((slots, catch_up_slot, missed, slot.as_ref().and_then(to_pg)))
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::pattern_problem;

    #[pgrx::pg_test]
    fn test_pattern_problems_name_the_field() {
        assert_eq!(pattern_problem("*/5 * * * *"), None);
        assert_eq!(pattern_problem("*/10 * * * * *"), None);
        assert_eq!(pattern_problem("30 2 * * MON-FRI"), None);
        assert_eq!(pattern_problem("@hourly"), None);
        let p = pattern_problem("61 * * * *").expect("invalid");
        assert!(p.starts_with("minute field \"61\""), "{p}");
        let p = pattern_problem("0 0 * 13 *").expect("invalid");
        assert!(p.starts_with("month field \"13\""), "{p}");
        let p = pattern_problem("0 0 * * FUN").expect("invalid");
        assert!(p.starts_with("day of week field"), "{p}");
        let p = pattern_problem("99 * * * * *").expect("invalid");
        assert!(p.starts_with("second field \"99\""), "{p}");
        let p = pattern_problem("* * *").expect("invalid");
        assert!(p.starts_with("3 fields"), "{p}");
        assert!(pattern_problem("@fortnightly").is_some());
        assert_eq!(pattern_problem("@midnight"), None);
        assert!(pattern_problem("@reboot").expect("no boot").contains("macros:"));
        assert!(pattern_problem("0 0 30 2 *").expect("never").contains("no time"));
    }
}
