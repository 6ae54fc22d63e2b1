//! What a schedule's times cost to compute: pgqueue's cron module (src/cron.rs, Debian cron's
//! rules, included here as it is pure logic) against 0.9.0's computation (croner's own search
//! in the time zone), side by side in one run, rounds alternating.

#[allow(dead_code)]
#[path = "../../src/cron.rs"]
mod cron;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use serde::Serialize;
use std::time::Instant;

/// Patterns and zones: the schedules scenario's `*/5 * * * * *`, fixed times, a wildcard job
/// across DST, lists, a day rule.
const CASES: [(&str, &str); 6] = [
    ("*/5 * * * * *", "UTC"),
    ("30 2 * * *", "Europe/Berlin"),
    ("0,30 * * * *", "America/New_York"),
    ("2,31,38,51 2,3,9,12 * * *", "Europe/Berlin"),
    ("*/15 9-17 * * MON-FRI", "America/New_York"),
    ("0 9 */15 * MON-FRI", "Europe/Berlin"),
];

#[derive(Serialize, Clone)]
pub struct CronCost {
    pub pattern: String,
    pub time_zone: String,
    pub slots: usize,
    /// Median over the rounds, nanoseconds per next time.
    pub ns_per_slot: f64,
    pub ns_per_slot_0_9_0: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `slots` consecutive next times of each case from 2026-01-01, `rounds` times each way.
pub fn measure(slots: usize, rounds: usize) -> Vec<CronCost> {
    let start = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
    CASES
        .iter()
        .map(|&(pattern, zone)| {
            let tz: Tz = zone.parse().unwrap();
            let ours = cron::Pattern::parse(pattern).unwrap();
            let theirs = croner::parser::CronParser::builder()
                .seconds(croner::parser::Seconds::Optional)
                .year(croner::parser::Year::Disallowed)
                .build()
                .parse(pattern)
                .unwrap();
            let (mut new, mut old) = (vec![], vec![]);
            for _ in 0..rounds {
                let t = Instant::now();
                let mut at: DateTime<Utc> = start;
                for _ in 0..slots {
                    at = ours.next_after(tz, at).unwrap();
                }
                new.push(t.elapsed().as_nanos() as f64 / slots as f64);
                let t = Instant::now();
                let mut at = start.with_timezone(&tz);
                for _ in 0..slots {
                    at = theirs.find_next_occurrence(&at, false).unwrap();
                }
                old.push(t.elapsed().as_nanos() as f64 / slots as f64);
            }
            CronCost {
                pattern: pattern.into(),
                time_zone: zone.into(),
                slots,
                ns_per_slot: median(new),
                ns_per_slot_0_9_0: median(old),
            }
        })
        .collect()
}
