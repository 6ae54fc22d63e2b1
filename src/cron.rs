//! Cron patterns with the meaning Debian's cron (Vixie cron) gives them, in an IANA time zone.
//! Pure logic: `schedule.rs` adapts it to SQL.
//!
//! croner parses a pattern and matches it against wall-clock times only (in UTC, where no
//! clock changes); this module decides which instants those wall-clock times are:
//!
//! - **Days**: day of month OR day of week, unless either field begins with `*` (or `?`):
//!   then both must match, as in Vixie cron (`*/15 * MON-FRI` is a 15-step day that is a
//!   weekday).
//! - **Wildcard jobs** (minute or hour field begins with `*`) run at every real instant whose
//!   wall-clock time matches: twice in a repeated hour, not at all in a skipped one.
//! - **Fixed-time jobs** (all others) run each wall-clock time once: a time repeated by a
//!   fall-back at its first instant only, the times skipped by a spring-forward once, at the
//!   first instant after the gap.

use chrono::{DateTime, Duration, LocalResult, NaiveDateTime, Offset, TimeZone, Utc};
use chrono_tz::{GapInfo, Tz};
use croner::Cron;
use croner::errors::CronError;
use croner::parser::{CronParser, Seconds, Year};

/// Walls passed over in one search before giving up (a fixed-time job skips at most the
/// slots of one repeated hour; croner's own search ends sooner on a pattern that never
/// matches).
const MAX_STEPS: usize = 200_000;
/// How far back `previous_before` looks.
const MAX_LOOK_BACK: Duration = Duration::days(366 * 30);

/// The macros, as Vixie cron spells them out.
const MACROS: [(&str, &str); 7] = [
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

#[derive(Debug, Clone)]
pub struct Pattern {
    cron: Cron,
    /// A fixed-time job: neither minute nor hour begins with `*`.
    fixed_time: bool,
}

/// The instants of one wall-clock time.
enum Instants {
    One(DateTime<Utc>),
    /// A time a fall-back repeats: its first and second instants.
    Twice(DateTime<Utc>, DateTime<Utc>),
    /// A time a spring-forward skips, and the first instant after the gap.
    Skipped(DateTime<Utc>),
    /// Beyond the time zone data.
    Unknown,
}

fn parser(dom_and_dow: bool) -> CronParser {
    CronParser::builder().seconds(Seconds::Optional).year(Year::Disallowed).dom_and_dow(dom_and_dow).build()
}

impl Pattern {
    /// Five fields (minute hour day-of-month month day-of-week), or six with seconds first,
    /// or a macro.
    pub fn parse(text: &str) -> Result<Pattern, CronError> {
        let text = text.trim();
        let text = MACROS.iter().find(|(m, _)| m.eq_ignore_ascii_case(text)).map_or(text, |(_, p)| p);
        let fields: Vec<&str> = text.split_whitespace().collect();
        let starred = |i: usize| fields.get(i).is_some_and(|f| f.starts_with(['*', '?']));
        // Indexes of minute, hour, day of month, day of week.
        let [minute, hour, dom, dow] = if fields.len() == 6 { [1, 2, 3, 5] } else { [0, 1, 2, 4] };
        let cron = parser(starred(dom) || starred(dow)).parse(text)?;
        Ok(Pattern { cron, fixed_time: !(starred(minute) || starred(hour)) })
    }

    /// The first matching wall-clock time after `wall` (or at it, if `inclusive`).
    fn wall_next(&self, wall: NaiveDateTime, inclusive: bool) -> Option<NaiveDateTime> {
        self.cron.find_next_occurrence(&wall.and_utc(), inclusive).ok().map(|t| t.naive_utc())
    }

    /// The first slot strictly after `t`, in `tz`.
    pub fn next_after(&self, tz: Tz, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Slots are whole seconds: the first after `t` is the first after its second.
        let t = t.checked_sub_signed(Duration::nanoseconds(t.timestamp_subsec_nanos().into()))?;
        if self.fixed_time { self.next_fixed(tz, t) } else { self.next_wildcard(tz, t) }
    }

    /// The first slot at or after `t`.
    pub fn next_from(&self, tz: Tz, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // A nanosecond before `t` lies in the second before it when `t` is a whole second
        // (a slot itself), else in `t`'s own second, whose slot has passed.
        self.next_after(tz, t.checked_sub_signed(Duration::nanoseconds(1))?)
    }

    /// Each wall-clock time at its first instant (a skipped one at the gap's end): these
    /// instants never decrease as the wall clock advances, so the first after `t` is that of
    /// the first wall-clock time after `t`'s that lands after `t`.
    fn next_fixed(&self, tz: Tz, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut wall = local(tz, t);
        for _ in 0..MAX_STEPS {
            wall = self.wall_next(wall, false)?;
            let at = match instants(tz, wall) {
                Instants::One(at) | Instants::Twice(at, _) | Instants::Skipped(at) => at,
                Instants::Unknown => continue,
            };
            if at > t {
                return Some(at);
            }
        }
        None
    }

    /// Every real instant whose wall-clock time matches. Walking the wall clock from `t`'s,
    /// the first time with an instant after `t` gives the answer, but for one case: `t` in
    /// the first pass of a repeated hour, whose second pass (after `t`) repeats wall-clock
    /// times from before `t`'s.
    fn next_wildcard(&self, tz: Tz, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let start = local(tz, t);
        let mut ahead = None;
        let mut wall = start;
        for _ in 0..MAX_STEPS {
            let Some(next) = self.wall_next(wall, false) else { break };
            wall = next;
            ahead = match instants(tz, wall) {
                Instants::One(at) if at > t => Some(at),
                Instants::Twice(first, second) if first > t || second > t => {
                    Some(if first > t { first } else { second })
                }
                _ => continue,
            };
            break;
        }
        let Instants::Twice(first, second) = instants(tz, start) else { return ahead };
        if first != t {
            return ahead;
        }
        // The second pass starts at the wall-clock time just after the clock went back.
        let back = transition(tz, first, second);
        let repeated = self.wall_next(local(tz, back), true).filter(|w| *w <= start);
        let again = repeated.and_then(|w| match instants(tz, w) {
            Instants::Twice(_, second) => Some(second),
            _ => None,
        });
        match (ahead, again) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The last slot strictly before `t`: found by looking back twice as far each time.
    pub fn previous_before(&self, tz: Tz, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut span = Duration::seconds(1);
        while span <= MAX_LOOK_BACK {
            let mut last = self.next_after(tz, t - span).filter(|s| *s < t);
            if last.is_some() {
                while let Some(s) = last.and_then(|l| self.next_after(tz, l)).filter(|s| *s < t) {
                    last = Some(s);
                }
                return last;
            }
            span = span * 2;
        }
        None
    }
}

fn local(tz: Tz, t: DateTime<Utc>) -> NaiveDateTime {
    t.with_timezone(&tz).naive_local()
}

fn instants(tz: Tz, wall: NaiveDateTime) -> Instants {
    match tz.from_local_datetime(&wall) {
        LocalResult::Single(t) => Instants::One(t.to_utc()),
        LocalResult::Ambiguous(a, b) => Instants::Twice(a.to_utc().min(b.to_utc()), a.to_utc().max(b.to_utc())),
        LocalResult::None => match GapInfo::new(&wall, &tz).and_then(|gap| gap.end) {
            Some(end) => Instants::Skipped(end.to_utc()),
            None => Instants::Unknown,
        },
    }
}

/// The instant the clock went back, between a repeated wall-clock time's two instants: the
/// first with the offset of the second.
fn transition(tz: Tz, first: DateTime<Utc>, second: DateTime<Utc>) -> DateTime<Utc> {
    let offset = |t: DateTime<Utc>| tz.offset_from_utc_datetime(&t.naive_utc()).fix();
    let after = offset(second);
    let (mut lo, mut hi) = (first, second);
    while hi - lo > Duration::seconds(1) {
        let mid = lo + (hi - lo) / 2;
        if offset(mid) == after { hi = mid } else { lo = mid }
    }
    hi
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().to_utc()
    }

    fn next(pattern: &str, zone: &str, after: &str, n: usize) -> Vec<String> {
        let (p, tz): (Pattern, Tz) = (Pattern::parse(pattern).unwrap(), zone.parse().unwrap());
        let mut at = utc(after);
        (0..n)
            .map(|_| {
                at = p.next_after(tz, at).unwrap();
                at.with_timezone(&tz).format("%F %T%:z").to_string()
            })
            .collect()
    }

    #[test]
    fn a_day_field_beginning_with_a_star_makes_both_day_fields_count() {
        // The 16th is the first day after the 14th that is both a 15-step day and a weekday.
        assert_eq!(
            next("11-34 * */15 * MON-FRI", "Europe/Berlin", "2027-03-14T03:00:00Z", 1),
            ["2027-03-16 00:11:00+01:00"]
        );
        assert_eq!(
            next("20 23 27 * */2", "America/New_York", "2027-11-30T04:21:00Z", 1),
            ["2028-01-27 23:20:00-05:00"]
        );
        // Neither begins with a star: either matches.
        assert_eq!(
            next("0 0 13 * FRI", "UTC", "2026-12-01T00:00:00Z", 2),
            ["2026-12-04 00:00:00+00:00", "2026-12-11 00:00:00+00:00"]
        );
        assert_eq!(
            next("0 0 1-7 * MON", "UTC", "2026-11-29T12:00:00Z", 2),
            ["2026-11-30 00:00:00+00:00", "2026-12-01 00:00:00+00:00"]
        );
    }

    #[test]
    fn a_fixed_time_job_runs_each_wall_clock_time_once() {
        // Berlin falls back at 03:00 CEST on 2026-10-25; after 02:32 CEST.
        let fall = next("2,31,38,51 2,3,9,12 * * *", "Europe/Berlin", "2026-10-25T00:32:00Z", 4);
        assert_eq!(
            fall,
            [
                "2026-10-25 02:38:00+02:00",
                "2026-10-25 02:51:00+02:00",
                "2026-10-25 03:02:00+01:00",
                "2026-10-25 03:31:00+01:00"
            ]
        );
        // St. John's springs forward at 02:00 NST on 2026-03-08: 02:20-02:51 run once, at 03:00 NDT.
        let spring = next("20-51 1-3 * * *", "America/St_Johns", "2026-03-08T05:25:00Z", 3);
        assert_eq!(spring, ["2026-03-08 03:00:00-02:30", "2026-03-08 03:20:00-02:30", "2026-03-08 03:21:00-02:30"]);
        let steps = next("5-8/3 2-11/3 * * *", "Europe/Berlin", "2026-10-24T23:00:00Z", 3);
        assert_eq!(steps, ["2026-10-25 02:05:00+02:00", "2026-10-25 02:08:00+02:00", "2026-10-25 05:05:00+01:00"]);
        // a-a/n is a alone.
        assert_eq!(
            next("15-15/3 4 * * *", "UTC", "2026-12-01T00:00:00Z", 2),
            ["2026-12-01 04:15:00+00:00", "2026-12-02 04:15:00+00:00"]
        );
    }

    #[test]
    fn a_skipped_day_is_a_gap_like_any_other() {
        // Samoa skipped 30 December 2011: that day's noon runs once, at the first instant after.
        let apia = next("0 12 * * *", "Pacific/Apia", "2011-12-29T00:00:00Z", 3);
        assert_eq!(apia, ["2011-12-29 12:00:00-10:00", "2011-12-31 00:00:00+14:00", "2011-12-31 12:00:00+14:00"]);
    }

    #[test]
    fn a_wildcard_job_runs_at_every_real_instant() {
        // From the first pass of New York's repeated 01:00-02:00 (2026-11-01).
        let fall = next("15,45 * * * *", "America/New_York", "2026-11-01T05:20:00Z", 4);
        assert_eq!(
            fall,
            [
                "2026-11-01 01:45:00-04:00",
                "2026-11-01 01:15:00-05:00",
                "2026-11-01 01:45:00-05:00",
                "2026-11-01 02:15:00-05:00"
            ]
        );
        // Late in the first pass, with nothing left in it: the second pass comes first.
        assert_eq!(
            next("*/20 1 * * *", "America/New_York", "2026-11-01T05:50:00Z", 2),
            ["2026-11-01 01:00:00-05:00", "2026-11-01 01:20:00-05:00"]
        );
        // The skipped hour does not exist.
        assert_eq!(
            next("30 * * * *", "Europe/Berlin", "2026-03-29T00:00:00Z", 2),
            ["2026-03-29 01:30:00+01:00", "2026-03-29 03:30:00+02:00"]
        );
    }

    #[test]
    fn previous_before_is_the_slot_before() {
        let (p, tz): (Pattern, Tz) = (Pattern::parse("0 9 * * MON").unwrap(), "Europe/Berlin".parse().unwrap());
        assert_eq!(p.previous_before(tz, utc("2026-12-01T00:00:00Z")), Some(utc("2026-11-30T08:00:00Z")));
        assert_eq!(p.previous_before(tz, utc("2026-11-30T08:00:00Z")), Some(utc("2026-11-23T08:00:00Z")));
    }

    #[test]
    fn next_from_includes_a_slot_at_its_instant() {
        let (p, tz): (Pattern, Tz) = (Pattern::parse("0 9 * * MON").unwrap(), "Europe/Berlin".parse().unwrap());
        let slot = utc("2026-11-30T08:00:00Z");
        assert_eq!(p.next_from(tz, slot), Some(slot));
        assert_eq!(p.next_from(tz, slot + Duration::microseconds(1)), Some(utc("2026-12-07T08:00:00Z")));
    }

    #[test]
    fn macros_and_their_kinds() {
        assert!(!Pattern::parse("@hourly").unwrap().fixed_time);
        assert!(Pattern::parse("@daily").unwrap().fixed_time);
        assert!(Pattern::parse("0 30 2 * * *").unwrap().fixed_time);
        assert!(!Pattern::parse("0 */5 2 * * *").unwrap().fixed_time);
        assert!(Pattern::parse("*/10 30 2 * * *").unwrap().fixed_time);
    }
}
