//! Cron schedules (`pgq_schedule` and friends), observed from real connections: every slot is
//! enqueued exactly once whoever fires it (the worker, `pgq_tick()` in other sessions, a worker
//! killed mid-run), daylight saving transitions follow the documented rules when computed and
//! when fired, slots missed beyond the grace are skipped or caught up once, a dropped queue
//! fails only its own schedule, a tick with nothing due reads the index and no row, and bad
//! arguments are refused with their SQLSTATE and change nothing.
//!
//! `_fire_schedules` fires every due schedule of the database, some tests pass it a time in
//! 2027, read table-wide counters, or stop and kill the worker: the tests of this binary take
//! turns, and each deletes its schedules when it ends (also when it fails).

mod common;

use common::{Client, connect, new_queue, unique_queue, wait_for};
use postgres::GenericClient;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Names for one test's schedules (a prefix no other test uses). Its schedules are deleted
/// when it goes out of scope, also when the test panics, so none keeps firing into the next
/// test. Declare it before the test's connection: that one (and any transaction on it, whose
/// locks the delete would wait for) is dropped first.
struct Scope {
    prefix: String,
}

impl Scope {
    fn new(what: &str) -> Self {
        Scope { prefix: unique_queue(what) }
    }

    fn name(&self, what: impl std::fmt::Display) -> String {
        format!("{}.{what}", self.prefix)
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        let _ = connect().execute("DELETE FROM pgqueue.schedules WHERE starts_with(name, $1)", &[&self.prefix]);
    }
}

/// Creates or replaces a schedule; returns its next run (epoch seconds). `options`: more
/// named arguments, e.g. `, grace => '1 s'`.
fn schedule(c: &mut impl GenericClient, name: &str, queue: &str, cron: &str, options: &str) -> i64 {
    let sql = format!("SELECT extract(epoch FROM pgqueue.pgq_schedule($1, $2, $3{options}))::bigint");
    c.query_one(&sql, &[&name, &queue, &cron]).unwrap().get(0)
}

/// What a schedule has done, from `schedule_stats` and its messages (times in epoch seconds).
#[derive(Debug)]
struct Record {
    runs: i64,
    missed: i64,
    failures: i64,
    next_run: Option<i64>,
    /// Every message's `scheduled_for`, in order (catch-up runs included).
    slots: Vec<i64>,
    /// (slot, `missed_runs` header) of the catch-up runs.
    catch_ups: Vec<(i64, i64)>,
}

fn record(c: &mut impl GenericClient, name: &str) -> Record {
    let row = c
        .query_one(
            "SELECT s.runs, s.missed_runs, s.failures, extract(epoch FROM s.next_run)::bigint,
                    coalesce(array_agg(m.slot ORDER BY m.slot) FILTER (WHERE m.slot IS NOT NULL), '{}'),
                    coalesce(array_agg(m.slot ORDER BY m.slot) FILTER (WHERE m.missed IS NOT NULL), '{}'),
                    coalesce(array_agg(m.missed ORDER BY m.slot) FILTER (WHERE m.missed IS NOT NULL), '{}')
               FROM pgqueue.schedule_stats s
               LEFT JOIN LATERAL (
                     SELECT extract(epoch FROM (msg.headers ->> 'scheduled_for')::timestamptz)::bigint AS slot,
                            (msg.headers ->> 'missed_runs')::bigint AS missed
                       FROM pgqueue.messages msg
                      WHERE msg.queue = s.queue AND msg.headers ->> 'schedule' = s.name) m ON true
              WHERE s.name = $1
              GROUP BY s.runs, s.missed_runs, s.failures, s.next_run",
            &[&name],
        )
        .unwrap();
    let (catch_up_slots, catch_up_counts): (Vec<i64>, Vec<i64>) = (row.get(5), row.get(6));
    Record {
        runs: row.get(0),
        missed: row.get(1),
        failures: row.get(2),
        next_run: row.get(3),
        slots: row.get(4),
        catch_ups: catch_up_slots.into_iter().zip(catch_up_counts).collect(),
    }
}

/// Every slot from `first` up to the schedule's next run is accounted for exactly once:
/// enqueued (one message, one run) or counted as missed (a catch-up run stands for missed
/// slots, and is itself one of them).
fn assert_every_slot_once(r: &Record, first: i64, what: &str) {
    assert!(r.slots.windows(2).all(|w| w[0] < w[1]), "{what}: a slot enqueued twice: {r:?}");
    assert_eq!(r.runs, r.slots.len() as i64, "{what}: one run counted per message: {r:?}");
    let next = r.next_run.unwrap_or_else(|| panic!("{what}: no next run: {r:?}"));
    assert!(r.slots.iter().all(|s| (first..next).contains(s)), "{what}: slots outside [first, next run): {r:?}");
    let on_time = r.slots.iter().filter(|s| !r.catch_ups.iter().any(|(c, _)| c == *s)).count() as i64;
    assert_eq!(on_time + r.missed, next - first, "{what}: each slot from the first enqueued or missed: {r:?}");
}

/// A transaction holding the rows of the schedules named `prefix...` locked: ticks pass locked
/// rows over (SKIP LOCKED), and a firing under way commits its messages and its row together
/// before the lock is granted, so what the schedules did reads as of one instant, and stays.
fn freeze<'a>(c: &'a mut Client, prefix: &str) -> postgres::Transaction<'a> {
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT FROM pgqueue.schedules WHERE starts_with(name, $1) FOR UPDATE", &[&prefix]).unwrap();
    tx
}

fn worker_stat(c: &mut Client, column: &str) -> i64 {
    c.query_one(&format!("SELECT coalesce({column}, 0)::bigint FROM pgqueue.worker_stats"), &[]).unwrap().get(0)
}

fn worker_backend(c: &mut Client) -> Option<i32> {
    c.query_opt(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pgqueue worker' AND datname = current_database()",
        &[],
    )
    .unwrap()
    .map(|r| r.get(0))
}

/// Terminates this database's worker and waits for the launcher to start another.
fn kill_worker(c: &mut Client) {
    let pid = wait_for("the worker", LIMIT, || worker_backend(c));
    let ended: bool = c.query_one("SELECT pg_terminate_backend($1, 5000)", &[&pid]).unwrap().get(0);
    assert!(ended, "the worker exits within 5 s of SIGTERM");
    wait_for("a restarted worker", LIMIT, || worker_backend(c).filter(|&p| p != pid));
}

/// Sessions calling `pgq_tick()` in a loop, beside the worker, until stopped (or dropped: a
/// failing test leaves none running into the next).
struct Tickers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Vec<String>>>,
}

impl Tickers {
    fn start(n: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut c = connect();
                    let mut failed = vec![];
                    while !stop.load(Ordering::Relaxed) {
                        for row in c.query("SELECT step, error FROM pgqueue.pgq_tick()", &[]).unwrap() {
                            failed.push(format!("{}: {}", row.get::<_, String>(0), row.get::<_, String>(1)));
                        }
                    }
                    failed
                })
            })
            .collect();
        Tickers { stop, threads }
    }

    /// Stops them; returns the steps that failed in their ticks.
    fn stop(mut self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        std::mem::take(&mut self.threads).into_iter().flat_map(|t| t.join().unwrap()).collect()
    }
}

impl Drop for Tickers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Workers only in another database (so none here) until dropped, also when the test panics.
struct WorkersAway<'a>(&'a mut Client);

impl<'a> WorkersAway<'a> {
    fn new(c: &'a mut Client) -> Self {
        common::workers_only_in(c, Some("postgres"));
        WorkersAway(c)
    }
}

impl Drop for WorkersAway<'_> {
    fn drop(&mut self) {
        common::workers_only_in(self.0, None);
    }
}

/// (SQLSTATE, message) of a statement that must fail.
fn refusal(c: &mut Client, sql: &str) -> (String, String) {
    match c.batch_execute(sql) {
        Ok(()) => panic!("expected an error, it succeeded: {sql}"),
        Err(e) => {
            let db = e.as_db_error().unwrap_or_else(|| panic!("not a server error: {e}"));
            (db.code().code().to_string(), db.message().to_string())
        }
    }
}

/// `pgq_cron_next` as text in the session's time zone.
fn cron_next(c: &mut impl GenericClient, cron: &str, time_zone: &str, after: &str, count: i32) -> Vec<String> {
    c.query(
        "SELECT t::text FROM pgqueue.pgq_cron_next($1, $2, $3::text::timestamptz, $4) t",
        &[&cron, &time_zone, &after, &count],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// (fired, missed, failed, more) of `_fire_schedules(50, at)`; `at` is an SQL expression.
fn fire(c: &mut impl GenericClient, at: &str) -> (i64, i64, i64, bool) {
    let row = c.query_one(&format!("SELECT * FROM pgqueue._fire_schedules(50, {at})"), &[]).unwrap();
    (row.get(0), row.get(1), row.get(2), row.get(3))
}

#[test]
fn an_every_second_schedule_fires_each_slot_once_through_worker_kills_and_concurrent_ticks() {
    let _serial = serial();
    let scope = Scope::new("each");
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let name = scope.name("tick");
    let first = schedule(&mut c, &name, &q, "* * * * * *", "");

    // pgq_tick() from another session races the worker for ~20 s, and the worker is killed
    // three times meanwhile (maybe in the middle of a firing transaction).
    let tickers = Tickers::start(1);
    for round in 0..4 {
        std::thread::sleep(Duration::from_secs(5));
        if round < 3 {
            kill_worker(&mut c);
        }
    }
    let failed = tickers.stop();
    assert!(failed.iter().all(|f| !f.starts_with("schedule")), "pgq_tick's schedule step failed: {failed:?}");

    let mut tx = freeze(&mut c, &scope.prefix);
    let r = record(&mut tx, &name);
    let next = r.next_run.expect("a next run");
    assert_eq!(r.slots, (first..next).collect::<Vec<_>>(), "every second from the first slot, each once: {r:?}");
    assert_eq!((r.runs, r.missed), (r.slots.len() as i64, 0), "runs = messages, none missed: {r:?}");
    assert!(r.runs >= 10, "it ran for ~20 s: {r:?}");
    let headers: Value = tx
        .query_one("SELECT headers FROM pgqueue.messages WHERE queue = $1 ORDER BY msg_id LIMIT 1", &[&q])
        .unwrap()
        .get(0);
    assert_eq!(headers["schedule"], json!(name));
    tx.execute("SELECT pgqueue.pgq_unschedule($1)", &[&name]).unwrap();
    tx.commit().unwrap();
    let left: i64 =
        c.query_one("SELECT count(*) FROM pgqueue.schedule_stats WHERE name = $1", &[&name]).unwrap().get(0);
    assert_eq!(left, 0);
}

/// A daylight saving case: a schedule whose next run is set to `next_run`, then fired at each
/// `at` of `fires`.
struct DstCase {
    cron: &'static str,
    time_zone: &'static str,
    grace: &'static str,
    next_run: &'static str,
    fires: &'static [Fire],
}

/// Fired at `at`: enqueues runs for `slots` (their `scheduled_for` headers), and the next run
/// is `next` (UTC), `next_local` on the schedule's wall clock.
struct Fire {
    at: &'static str,
    slots: &'static [&'static str],
    next: &'static str,
    next_local: &'static str,
}

const DST_CASES: [DstCase; 8] = [
    // Berlin springs forward on 2027-03-28 at 02:00 CET: 02:30 does not exist, it runs at
    // 03:00 CEST, the first instant after the gap.
    DstCase {
        cron: "30 2 * * *",
        time_zone: "Europe/Berlin",
        grace: "1 minute",
        next_run: "2027-03-27 01:30+00",
        fires: &[
            Fire {
                at: "2027-03-27 01:30+00",
                slots: &["2027-03-27T01:30:00Z"],
                next: "2027-03-28 01:00:00+00",
                next_local: "2027-03-28 03:00:00",
            },
            Fire {
                at: "2027-03-28 01:00+00",
                slots: &["2027-03-28T01:00:00Z"],
                next: "2027-03-29 00:30:00+00",
                next_local: "2027-03-29 02:30:00",
            },
        ],
    },
    // Berlin falls back on 2027-10-31 at 03:00 CEST: 02:30 happens twice, it runs once, at
    // the first.
    DstCase {
        cron: "30 2 * * *",
        time_zone: "Europe/Berlin",
        grace: "1 minute",
        next_run: "2027-10-31 00:30+00",
        fires: &[Fire {
            at: "2027-10-31 00:30+00",
            slots: &["2027-10-31T00:30:00Z"],
            next: "2027-11-01 01:30:00+00",
            next_local: "2027-11-01 02:30:00",
        }],
    },
    // New York springs forward on 2027-03-14 at 02:00 EST.
    DstCase {
        cron: "30 2 * * *",
        time_zone: "America/New_York",
        grace: "1 minute",
        next_run: "2027-03-13 07:30+00",
        fires: &[
            Fire {
                at: "2027-03-13 07:30+00",
                slots: &["2027-03-13T07:30:00Z"],
                next: "2027-03-14 07:00:00+00",
                next_local: "2027-03-14 03:00:00",
            },
            Fire {
                at: "2027-03-14 07:00+00",
                slots: &["2027-03-14T07:00:00Z"],
                next: "2027-03-15 06:30:00+00",
                next_local: "2027-03-15 02:30:00",
            },
        ],
    },
    // New York falls back on 2027-11-07 at 02:00 EDT: 01:30 runs once, at the first.
    DstCase {
        cron: "30 1 * * *",
        time_zone: "America/New_York",
        grace: "1 minute",
        next_run: "2027-11-07 05:30+00",
        fires: &[Fire {
            at: "2027-11-07 05:30+00",
            slots: &["2027-11-07T05:30:00Z"],
            next: "2027-11-08 06:30:00+00",
            next_local: "2027-11-08 01:30:00",
        }],
    },
    // Hour and minute lists are fixed times (Debian's cron): in Berlin's repeated hour of
    // 2027-10-31 (02:00-03:00 CET again), 02:02-02:51 do not run again; 03:02 CET is next.
    DstCase {
        cron: "2,31,38,51 2,3,9,12 * * *",
        time_zone: "Europe/Berlin",
        grace: "1 day",
        next_run: "2027-10-31 00:38+00",
        fires: &[
            Fire {
                at: "2027-10-31 00:51+00",
                slots: &["2027-10-31T00:38:00Z", "2027-10-31T00:51:00Z"],
                next: "2027-10-31 02:02:00+00",
                next_local: "2027-10-31 03:02:00",
            },
            // 02:40 CET, in the repeated hour: nothing is due.
            Fire {
                at: "2027-10-31 01:40+00",
                slots: &[],
                next: "2027-10-31 02:02:00+00",
                next_local: "2027-10-31 03:02:00",
            },
            Fire {
                at: "2027-10-31 02:31+00",
                slots: &["2027-10-31T02:02:00Z", "2027-10-31T02:31:00Z"],
                next: "2027-10-31 02:38:00+00",
                next_local: "2027-10-31 03:38:00",
            },
        ],
    },
    // St. John's springs forward on 2027-03-14 at 02:00 NST: 02:20-02:51 (a range) run
    // once, at 03:00 NDT.
    DstCase {
        cron: "20-51 1-3 * * *",
        time_zone: "America/St_Johns",
        grace: "1 minute",
        next_run: "2027-03-14 05:21+00",
        fires: &[
            Fire {
                at: "2027-03-14 05:21+00",
                slots: &["2027-03-14T05:21:00Z"],
                next: "2027-03-14 05:30:00+00",
                next_local: "2027-03-14 03:00:00",
            },
            Fire {
                at: "2027-03-14 05:30+00",
                slots: &["2027-03-14T05:30:00Z"],
                next: "2027-03-14 05:50:00+00",
                next_local: "2027-03-14 03:20:00",
            },
        ],
    },
    // Steps are fixed times too: 02:05 and 02:08 run in CEST only.
    DstCase {
        cron: "5-8/3 2-11/3 * * *",
        time_zone: "Europe/Berlin",
        grace: "1 day",
        next_run: "2027-10-31 00:05+00",
        fires: &[Fire {
            at: "2027-10-31 02:10+00",
            slots: &["2027-10-31T00:05:00Z", "2027-10-31T00:08:00Z"],
            next: "2027-10-31 04:05:00+00",
            next_local: "2027-10-31 05:05:00",
        }],
    },
    // A pattern with a wildcard hour runs at both instants of the repeated hour; fired late
    // in one go (a day of grace), each of them is a run.
    DstCase {
        cron: "0,30 * * * *",
        time_zone: "America/New_York",
        grace: "1 day",
        next_run: "2027-11-07 05:00+00",
        fires: &[Fire {
            at: "2027-11-07 07:00+00",
            slots: &[
                "2027-11-07T05:00:00Z",
                "2027-11-07T05:30:00Z",
                "2027-11-07T06:00:00Z",
                "2027-11-07T06:30:00Z",
                "2027-11-07T07:00:00Z",
            ],
            next: "2027-11-07 07:30:00+00",
            next_local: "2027-11-07 02:30:00",
        }],
    },
];

#[test]
fn daylight_saving_transitions_are_computed_and_fired_by_the_documented_rules() {
    let _serial = serial();
    let scope = Scope::new("dst");
    let mut c = connect();
    c.batch_execute("SET TimeZone = 'UTC'").unwrap();
    let berlin = "Europe/Berlin";
    let ny = "America/New_York";
    let spring_2026 = ["2026-03-29 01:00:00+00", "2026-03-30 00:30:00+00", "2026-03-31 00:30:00+00"];
    assert_eq!(cron_next(&mut c, "30 2 * * *", berlin, "2026-03-28 12:00+00", 3), spring_2026);
    let fall_2026 = ["2026-10-25 00:30:00+00", "2026-10-26 01:30:00+00"];
    assert_eq!(cron_next(&mut c, "30 2 * * *", berlin, "2026-10-24 12:00+00", 2), fall_2026);
    let ny_fall_2026 = ["2026-11-01 05:30:00+00", "2026-11-02 06:30:00+00"];
    assert_eq!(cron_next(&mut c, "30 1 * * *", ny, "2026-10-31 12:00+00", 2), ny_fall_2026);
    let ny_half_hours_2026 = [
        "2026-11-01 05:00:00+00",
        "2026-11-01 05:30:00+00",
        "2026-11-01 06:00:00+00",
        "2026-11-01 06:30:00+00",
        "2026-11-01 07:00:00+00",
    ];
    assert_eq!(cron_next(&mut c, "0,30 * * * *", ny, "2026-11-01 04:45+00", 5), ny_half_hours_2026);
    let ny_spring_2026 = ["2026-03-08 07:00:00+00", "2026-03-09 06:30:00+00"];
    assert_eq!(cron_next(&mut c, "30 2 * * *", ny, "2026-03-07 12:00+00", 2), ny_spring_2026);
    // The 2027 transitions, fired below (in the future: the worker leaves them alone).
    let spring_2027 = ["2027-03-28 01:00:00+00", "2027-03-29 00:30:00+00", "2027-03-30 00:30:00+00"];
    assert_eq!(cron_next(&mut c, "30 2 * * *", berlin, "2027-03-27 12:00+00", 3), spring_2027);
    let fall_2027 = ["2027-10-31 00:30:00+00", "2027-11-01 01:30:00+00"];
    assert_eq!(cron_next(&mut c, "30 2 * * *", berlin, "2027-10-30 12:00+00", 2), fall_2027);
    let ny_spring_2027 = ["2027-03-14 07:00:00+00", "2027-03-15 06:30:00+00"];
    assert_eq!(cron_next(&mut c, "30 2 * * *", ny, "2027-03-13 12:00+00", 2), ny_spring_2027);
    let ny_fall_2027 = ["2027-11-07 05:30:00+00", "2027-11-08 06:30:00+00"];
    assert_eq!(cron_next(&mut c, "30 1 * * *", ny, "2027-11-06 12:00+00", 2), ny_fall_2027);
    let ny_half_hours_2027 = [
        "2027-11-07 05:00:00+00",
        "2027-11-07 05:30:00+00",
        "2027-11-07 06:00:00+00",
        "2027-11-07 06:30:00+00",
        "2027-11-07 07:00:00+00",
    ];
    assert_eq!(cron_next(&mut c, "0,30 * * * *", ny, "2027-11-07 04:45+00", 5), ny_half_hours_2027);

    // Fired: all in one transaction, rolled back. Every step is checked (from the state it
    // should start from), and the test reports all that went wrong.
    let q = new_queue(&mut c, "");
    let mut tx = c.transaction().unwrap();
    let mut wrong = vec![];
    for (i, case) in DST_CASES.iter().enumerate() {
        let name = scope.name(i);
        let options = format!(", time_zone => '{}', grace => '{}'", case.time_zone, case.grace);
        schedule(&mut tx, &name, &q, case.cron, &options);
        let set_next_run = "UPDATE pgqueue.schedules SET next_run = $2::text::timestamptz WHERE name = $1";
        tx.execute(set_next_run, &[&name, &case.next_run]).unwrap();
        for f in case.fires {
            let last: i64 = tx.query_one("SELECT coalesce(max(msg_id), 0) FROM pgqueue.messages", &[]).unwrap().get(0);
            let (fired, missed, failed, _) = fire(&mut tx, &format!("'{}'", f.at));
            let slots: Vec<String> = tx
                .query(
                    "SELECT headers ->> 'scheduled_for' FROM pgqueue.messages
                      WHERE msg_id > $1 AND headers ->> 'schedule' = $2 ORDER BY msg_id",
                    &[&last, &name],
                )
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            let row = tx
                .query_one(
                    "SELECT next_run::text, next_run_local::text FROM pgqueue.schedule_stats WHERE name = $1",
                    &[&name],
                )
                .unwrap();
            let actual = (fired, missed, failed, slots, row.get::<_, String>(0), row.get::<_, String>(1));
            let slots = f.slots.iter().map(|s| s.to_string()).collect();
            let expected = (f.slots.len() as i64, 0, 0, slots, f.next.into(), f.next_local.into());
            if actual != expected {
                wrong.push(format!(
                    "{} in {} due {}, fired at {}\n  (fired, missed, failed, slots, next_run, next_run_local)\n  \
                     expected {expected:?}\n  actual   {actual:?}",
                    case.cron, case.time_zone, case.next_run, f.at
                ));
                tx.execute(set_next_run, &[&name, &f.next]).unwrap();
            }
        }
        // Out of the way of the next cases' (later) fake times.
        tx.execute("SELECT pgqueue.pgq_unschedule($1)", &[&name]).unwrap();
    }
    tx.rollback().unwrap();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The examples of issue 24, as Debian's cron runs them (times in UTC).
#[test]
fn patterns_mean_what_debian_cron_makes_of_them() {
    let mut c = connect();
    c.batch_execute("SET TimeZone = 'UTC'").unwrap();
    let cases: [(&str, &str, &str, &[&str]); 8] = [
        // A day field beginning with `*`: both must match. The 16th is the first 15-step day
        // that is a weekday (Tuesday, 00:11 CET).
        (
            "11-34 * */15 * MON-FRI",
            "Europe/Berlin",
            "2027-03-14 03:00+00",
            &["2027-03-15 23:11:00+00", "2027-03-15 23:12:00+00"],
        ),
        // A 27th that is a Sunday, Tuesday, Thursday or Saturday.
        (
            "20 23 27 * */2",
            "America/New_York",
            "2027-11-30 04:21+00",
            &["2028-01-28 04:20:00+00", "2028-02-28 04:20:00+00"],
        ),
        // Neither begins with `*`: either matches (Friday the 4th, Monday the 13th is no Friday).
        (
            "0 12 13 * FRI",
            "UTC",
            "2026-12-01 00:00+00",
            &["2026-12-04 12:00:00+00", "2026-12-11 12:00:00+00", "2026-12-13 12:00:00+00"],
        ),
        // Fall back: the repeated hour's times ran in CEST; 03:02 CET is next.
        (
            "2,31,38,51 2,3,9,12 * * *",
            "Europe/Berlin",
            "2026-10-25 00:32+00",
            &["2026-10-25 00:38:00+00", "2026-10-25 00:51:00+00", "2026-10-25 02:02:00+00", "2026-10-25 02:31:00+00"],
        ),
        // Spring forward: the skipped 02:20-02:51 run once, at 03:00 NDT.
        (
            "20-51 1-3 * * *",
            "America/St_Johns",
            "2026-03-08 05:25+00",
            &["2026-03-08 05:30:00+00", "2026-03-08 05:50:00+00"],
        ),
        (
            "5-8/3 2-11/3 * * *",
            "Europe/Berlin",
            "2026-10-24 23:00+00",
            &["2026-10-25 00:05:00+00", "2026-10-25 00:08:00+00", "2026-10-25 04:05:00+00"],
        ),
        // `a-a/n` is `a` alone.
        ("15-15/3 4 * * *", "UTC", "2026-12-01 00:00+00", &["2026-12-01 04:15:00+00", "2026-12-02 04:15:00+00"]),
        // A wildcard hour: both instants of New York's repeated 01:45.
        (
            "45 * * * *",
            "America/New_York",
            "2026-11-01 05:00+00",
            &["2026-11-01 05:45:00+00", "2026-11-01 06:45:00+00"],
        ),
    ];
    let mut wrong = vec![];
    for (cron, zone, after, expected) in cases {
        let got = cron_next(&mut c, cron, zone, after, expected.len() as i32);
        if got != expected {
            wrong.push(format!("{cron:?} in {zone} after {after}:\n  expected {expected:?}\n  got      {got:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn downtime_beyond_the_grace_is_skipped_or_caught_up_once() {
    let _serial = serial();
    let scope = Scope::new("down");
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let (skip, catch_up) = (scope.name("skip"), scope.name("catch_up"));
    // A fake now, 30 s after both were due (in 2027: the worker leaves them alone); rolled back.
    let mut tx = c.transaction().unwrap();
    let start: i64 =
        tx.query_one("SELECT extract(epoch FROM '2027-06-01 00:00+00'::timestamptz)::bigint", &[]).unwrap().get(0);
    for (name, missed) in [(&skip, "skip"), (&catch_up, "catch_up")] {
        let options = format!(
            ", payload => '{{\"job\": \"report\"}}', priority => 5::smallint,
               headers => '{{\"team\": \"ops\", \"schedule\": \"spoofed\"}}', missed => '{missed}', grace => '2 s'"
        );
        schedule(&mut tx, name, &q, "* * * * * *", &options);
        tx.execute("UPDATE pgqueue.schedules SET next_run = '2027-06-01 00:00+00' WHERE name = $1", &[name]).unwrap();
    }
    // Slots :00 to :30 are due; those before :28 (at - grace) are missed: 28 of 31 each.
    let result = fire(&mut tx, "'2027-06-01 00:00:30+00'");
    assert_eq!(result, (3 + 4, 28 + 28, 0, false), "(fired, missed, failed, more)");

    let r = record(&mut tx, &skip);
    assert_eq!((r.runs, r.missed, r.next_run), (3, 28, Some(start + 31)), "{r:?}");
    assert_eq!(r.slots, [start + 28, start + 29, start + 30]);
    assert!(r.catch_ups.is_empty(), "skip: no catch-up run: {r:?}");
    assert_every_slot_once(&r, start, "skip");

    let r = record(&mut tx, &catch_up);
    assert_eq!((r.runs, r.missed, r.next_run), (4, 28, Some(start + 31)), "{r:?}");
    assert_eq!(r.slots, [start + 27, start + 28, start + 29, start + 30]);
    assert_eq!(r.catch_ups, [(start + 27, 28)], "catch_up: the latest missed slot, once, counting them all");
    assert_every_slot_once(&r, start, "catch_up");

    // What the runs look like: the schedule's payload and priority, its headers under the
    // schedule's own, and a dedup key per slot.
    let messages: Vec<(Value, i16, Value, String)> = tx
        .query(
            "SELECT payload, priority, headers, dedup_key FROM pgqueue.messages
              WHERE queue = $1 AND headers ->> 'schedule' = $2 ORDER BY headers ->> 'scheduled_for' LIMIT 2",
            &[&q, &catch_up],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let headers = |slot: &str, missed: Option<i64>| {
        let mut h = json!({"team": "ops", "schedule": catch_up, "scheduled_for": slot});
        if let Some(n) = missed {
            h["missed_runs"] = json!(n);
        }
        h
    };
    let key = |slot: &str| format!("schedule:{catch_up}@{slot}");
    assert_eq!(
        messages,
        [
            (json!({"job": "report"}), 5, headers("2027-06-01T00:00:27Z", Some(28)), key("2027-06-01T00:00:27Z")),
            (json!({"job": "report"}), 5, headers("2027-06-01T00:00:28Z", None), key("2027-06-01T00:00:28Z")),
        ]
    );

    // Back on time: one slot each, nothing more missed.
    assert_eq!(fire(&mut tx, "'2027-06-01 00:00:31.5+00'"), (2, 0, 0, false));
    assert_eq!(record(&mut tx, &catch_up).missed, 28);
    tx.rollback().unwrap();
}

#[test]
fn the_worker_skips_or_catches_up_what_it_missed_while_away() {
    let _serial = serial();
    let scope = Scope::new("away");
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let (skip, catch_up) = (scope.name("skip"), scope.name("catch_up"));
    let missed_before = worker_stat(&mut c, "missed_runs");
    let (first_skip, first_catch_up) = {
        // No worker in this database for ~3 s: longer than the schedules' grace of 1 s.
        let away = WorkersAway::new(&mut c);
        let first_skip = schedule(away.0, &skip, &q, "* * * * * *", ", grace => '1 s'");
        let first_catch_up = schedule(away.0, &catch_up, &q, "* * * * * *", ", grace => '1 s', missed => 'catch_up'");
        std::thread::sleep(Duration::from_secs(3));
        (first_skip, first_catch_up)
    };
    wait_for("the worker back, firing both", LIMIT, || {
        let runs: i64 = c
            .query_one("SELECT min(runs) FROM pgqueue.schedules WHERE starts_with(name, $1)", &[&scope.prefix])
            .unwrap()
            .get(0);
        (runs >= 3).then_some(())
    });
    let mut tx = freeze(&mut c, &scope.prefix);
    let r = record(&mut tx, &skip);
    assert!(r.missed >= 1, "slots passed while away are missed: {r:?}");
    assert!(r.catch_ups.is_empty(), "skip: no catch-up run: {r:?}");
    assert_every_slot_once(&r, first_skip, "skip");
    let skipped = r.missed;

    let r = record(&mut tx, &catch_up);
    assert!(r.missed >= 1, "slots passed while away are missed: {r:?}");
    assert!(!r.catch_ups.is_empty(), "catch_up: a run for the missed slots: {r:?}");
    let caught_up: i64 = r.catch_ups.iter().map(|(_, n)| n).sum();
    assert_eq!(caught_up, r.missed, "the catch-up runs count every missed slot: {r:?}");
    assert_every_slot_once(&r, first_catch_up, "catch_up");
    tx.rollback().unwrap();
    // The counters are written at the end of the tick: wait for the last one.
    let total = skipped + r.missed;
    wait_for("the worker's missed_runs", LIMIT, || {
        (worker_stat(&mut c, "missed_runs") - missed_before >= total).then_some(())
    });
}

#[test]
fn a_dropped_queue_fails_only_its_own_schedule() {
    let _serial = serial();
    let scope = Scope::new("drop");
    let mut c = connect();
    let (a, b) = (new_queue(&mut c, ""), new_queue(&mut c, ""));
    let (on_a, on_b) = (scope.name("a"), scope.name("b"));
    schedule(&mut c, &on_a, &a, "* * * * * *", "");
    schedule(&mut c, &on_b, &b, "* * * * * *", "");
    let counters = ["schedule_errors", "tick_failures", "schedule_failures"];
    let before: Vec<i64> = counters.iter().map(|col| worker_stat(&mut c, col)).collect();
    c.execute("SELECT pgqueue.pgq_drop_queue($1)", &[&a]).unwrap();

    // Both due in one call (rows locked by this transaction: the worker passes them over).
    let mut tx = c.transaction().unwrap();
    tx.execute(
        "UPDATE pgqueue.schedules SET next_run = date_trunc('second', now()) WHERE name IN ($1, $2)",
        &[&on_a, &on_b],
    )
    .unwrap();
    let failures_a = record(&mut tx, &on_a).failures;
    assert_eq!(fire(&mut tx, "date_trunc('second', now())"), (1, 0, 1, false), "(fired, missed, failed, more)");
    let row = tx
        .query_one(
            "SELECT failures, last_error, next_run > now() FROM pgqueue.schedule_stats WHERE name = $1",
            &[&on_a],
        )
        .unwrap();
    let (failures, error, moved_on): (i64, String, bool) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(failures, failures_a + 1);
    assert!(error.contains(&format!("queue \"{a}\" does not exist")), "{error}");
    assert!(moved_on, "passed over to its next slot");
    tx.rollback().unwrap();

    // The worker: B keeps firing, A fails slot after slot, counted as schedule errors and
    // not as failed ticks.
    let runs_b = record(&mut c, &on_b).runs;
    wait_for("A's failures and B's runs", LIMIT, || {
        let (ra, rb) = (record(&mut c, &on_a), record(&mut c, &on_b));
        (ra.failures >= 2 && rb.runs >= runs_b + 2).then_some(())
    });
    wait_for("the schedule errors counted", LIMIT, || (worker_stat(&mut c, counters[0]) > before[0]).then_some(()));
    let error: String =
        c.query_one("SELECT last_error FROM pgqueue.schedule_stats WHERE name = $1", &[&on_a]).unwrap().get(0);
    assert!(error.contains(&format!("queue \"{a}\" does not exist")), "{error}");
    assert_eq!(record(&mut c, &on_a).runs, 0);
    let after: Vec<i64> = counters.iter().map(|col| worker_stat(&mut c, col)).collect();
    let last: Option<String> = c.query_one("SELECT last_error FROM pgqueue.worker_stats", &[]).unwrap().get(0);
    assert_eq!(after[1..], before[1..], "{counters:?}: no tick or step failed because of it (last error: {last:?})");
}

/// A failing schedule's warning is logged once per error in a row: not again while it fails
/// the same way slot after slot, but again when it fails that way after firing since.
#[test]
fn a_schedule_error_is_logged_again_after_the_schedule_fired() {
    let _serial = serial();
    let scope = Scope::new("relog");
    let notices = Arc::new(Mutex::new(vec![]));
    let mut c = common::connect_with_notices(notices.clone());
    let q = new_queue(&mut c, "");
    let name = scope.name("s");
    schedule(&mut c, &name, &q, "* * * * * *", "");
    let warned = || {
        let wanted = format!("schedule \"{name}\" failed to enqueue");
        notices.lock().unwrap().iter().filter(|n| n.contains(&wanted)).count()
    };
    // Due now, in this transaction (the worker passes a locked row over).
    let due = "UPDATE pgqueue.schedules SET next_run = date_trunc('second', now()) WHERE name = $1";
    let at = "date_trunc('second', now())";
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT pgqueue.pgq_drop_queue($1)", &[&q]).unwrap();
    for _ in 0..2 {
        tx.execute(due, &[&name]).unwrap();
        assert_eq!(fire(&mut tx, at), (0, 0, 1, false), "(fired, missed, failed, more)");
    }
    assert_eq!(warned(), 1, "the same error twice in a row: one warning");
    tx.execute("SELECT pgqueue.pgq_create_queue($1)", &[&q]).unwrap();
    tx.execute(due, &[&name]).unwrap();
    assert_eq!(fire(&mut tx, at), (1, 0, 0, false), "fired");
    tx.execute("SELECT pgqueue.pgq_drop_queue($1)", &[&q]).unwrap();
    tx.execute(due, &[&name]).unwrap();
    assert_eq!(fire(&mut tx, at), (0, 0, 1, false));
    assert_eq!(warned(), 2, "the same error after a firing: a warning again");
    tx.rollback().unwrap();
}

/// This transaction's scans of `pgqueue.schedules` so far: (sequential scans, index scans,
/// live rows fetched by index scans).
fn scans(tx: &mut impl GenericClient) -> [i64; 3] {
    let row = tx
        .query_one(
            "SELECT seq_scan, coalesce(idx_scan, 0), coalesce(idx_tup_fetch, 0)
               FROM pg_stat_xact_user_tables WHERE relid = 'pgqueue.schedules'::regclass",
            &[],
        )
        .unwrap();
    [row.get(0), row.get(1), row.get(2)]
}

/// How `_fire_schedules(50, at)` scanned `pgqueue.schedules`, and what it returned.
fn fire_scans(tx: &mut impl GenericClient, at: &str) -> ([i64; 3], (i64, i64, i64, bool)) {
    let before = scans(tx);
    let result = fire(tx, at);
    let after = scans(tx);
    ([after[0] - before[0], after[1] - before[1], after[2] - before[2]], result)
}

#[test]
fn ten_thousand_schedules_with_nothing_due_cost_an_index_probe() {
    let _serial = serial();
    let scope = Scope::new("many");
    let mut c = connect();
    let q = new_queue(&mut c, "");
    c.execute(
        "SELECT count(pgqueue.pgq_schedule($1 || '.' || g, $2, '0 0 1 1 *')) FROM generate_series(1, 10000) g",
        &[&scope.prefix, &q],
    )
    .unwrap();

    let mut tx = c.transaction().unwrap();
    let ([seq, probes, fetched], result) = fire_scans(&mut tx, "NULL");
    assert_eq!(result, (0, 0, 0, false));
    assert_eq!((seq, fetched), (0, 0), "no sequential scan, no row read");
    assert!(probes >= 1, "the due index was probed");
    tx.rollback().unwrap();

    // The same counters move when one is due.
    let mut tx = c.transaction().unwrap();
    tx.execute(
        "UPDATE pgqueue.schedules SET cron = '* * * * * *', next_run = date_trunc('second', now()) WHERE name = $1",
        &[&scope.name(1)],
    )
    .unwrap();
    let ([seq, _, fetched], result) = fire_scans(&mut tx, "date_trunc('second', now())");
    assert_eq!(result, (1, 0, 0, false));
    assert_eq!(seq, 0);
    assert!(fetched >= 1, "the due row was read through the index");
    tx.rollback().unwrap();
}

#[test]
fn pgq_tick_in_four_sessions_and_the_worker_never_fire_a_slot_twice() {
    const SCHEDULES: i64 = 200;
    let _serial = serial();
    let scope = Scope::new("race");
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let first: i64 = c
        .query_one(
            "SELECT min(extract(epoch FROM pgqueue.pgq_schedule($1 || '.' || g, $2, '* * * * * *')))::bigint
               FROM generate_series(1, $3::bigint) g",
            &[&scope.prefix, &q, &SCHEDULES],
        )
        .unwrap()
        .get(0);
    let tickers = Tickers::start(4);
    wait_for("three runs of each schedule", LIMIT, || {
        let runs: i64 = c
            .query_one("SELECT min(runs) FROM pgqueue.schedules WHERE starts_with(name, $1)", &[&scope.prefix])
            .unwrap()
            .get(0);
        (runs >= 3).then_some(())
    });
    let failed = tickers.stop();
    assert!(failed.iter().all(|f| !f.starts_with("schedule")), "pgq_tick's schedule step failed: {failed:?}");
    let mut tx = freeze(&mut c, &scope.prefix);
    for i in 1..=SCHEDULES {
        let name = scope.name(i);
        let r = record(&mut tx, &name);
        assert_eq!(r.missed, 0, "{name}: {r:?}");
        assert_every_slot_once(&r, first, &name);
    }
}

#[test]
fn bad_arguments_are_refused_with_their_sqlstate_and_change_nothing() {
    let _serial = serial();
    let scope = Scope::new("bad");
    let mut c = connect();
    let q = new_queue(&mut c, "");
    // An existing schedule (not due for a long time): the bad calls try to replace it.
    let x = scope.name("x");
    schedule(&mut c, &x, &q, "0 0 1 1 *", "");
    let table = |c: &mut Client| -> String {
        c.query_one("SELECT coalesce(jsonb_agg(to_jsonb(s) ORDER BY s.name), '[]')::text FROM pgqueue.schedules s", &[])
            .unwrap()
            .get(0)
    };
    let before = table(&mut c);
    // $X: the existing schedule, $Q: its queue.
    let calls = [
        ("pgq_schedule('$X', '$Q', '61 * * * *')", "22023", "minute field \"61\""),
        ("pgq_schedule('$X', '$Q', '0 25 * * *')", "22023", "hour field \"25\""),
        ("pgq_schedule('$X', '$Q', '0 0 32 * *')", "22023", "day of month field \"32\""),
        ("pgq_schedule('$X', '$Q', '0 0 * 13 *')", "22023", "month field \"13\""),
        ("pgq_schedule('$X', '$Q', '0 0 * * FUN')", "22023", "day of week field \"FUN\""),
        ("pgq_schedule('$X', '$Q', '99 * * * * *')", "22023", "second field \"99\""),
        ("pgq_schedule('$X', '$Q', '* * *')", "22023", "3 fields"),
        ("pgq_schedule('$X', '$Q', '@fortnightly')", "22023", "@hourly"),
        ("pgq_schedule('$X', '$Q', '0 0 30 2 *')", "22023", "matches no time"),
        ("pgq_schedule('$X', '$Q', '* * * * *', time_zone => 'Mars/Olympus')", "22023", "\"Mars/Olympus\""),
        ("pgq_schedule(NULL, '$Q', '* * * * *')", "22004", "\"name\""),
        ("pgq_schedule('$X', NULL, '* * * * *')", "22004", "\"queue\""),
        ("pgq_schedule('$X', '$Q', NULL)", "22004", "\"cron\""),
        ("pgq_schedule('$X', '$Q', '* * * * *', payload => NULL)", "22004", "\"payload\""),
        ("pgq_schedule('$X', '$Q', '* * * * *', time_zone => NULL)", "22004", "\"time_zone\""),
        ("pgq_schedule('$X', '$Q', '* * * * *', priority => NULL)", "22004", "\"priority\""),
        ("pgq_schedule('$X', '$Q', '* * * * *', priority => 2000::smallint)", "22023", "\"priority\""),
        ("pgq_schedule('$X', '$Q', '* * * * *', paused => NULL)", "22004", "\"paused\""),
        ("pgq_schedule('$X', '$Q', '* * * * *', missed => NULL)", "22004", "\"missed\""),
        ("pgq_schedule('$X', '$Q', '* * * * *', missed => 'later')", "22023", "\"missed\""),
        ("pgq_schedule('$X', '$Q', '* * * * *', grace => NULL)", "22004", "\"grace\""),
        ("pgq_schedule('$X', '$Q', '* * * * *', grace => '500 ms')", "22023", "\"grace\""),
        ("pgq_schedule('$X', '$Q', '* * * * *', grace => '25 hours')", "22023", "\"grace\""),
        ("pgq_schedule('$X', '$Q', '* * * * *', headers => '[1]')", "22023", "\"headers\""),
        ("pgq_schedule('$X', '$Q', '* * * * *', headers => '\"x\"')", "22023", "\"headers\""),
        ("pgq_schedule('$X', 'no_such_queue', '* * * * *')", "42704", "queue \"no_such_queue\" does not exist"),
        ("pgq_schedule('bad name', '$Q', '* * * * *')", "22023", "'bad name' is not a schedule name"),
        ("pgq_schedule('', '$Q', '* * * * *')", "22023", "is not a schedule name"),
        ("pgq_schedule(repeat('a', 101), '$Q', '* * * * *')", "22023", "is not a schedule name"),
        ("pgq_unschedule('no_such_schedule')", "42704", "schedule \"no_such_schedule\" does not exist"),
        ("pgq_unschedule('no_such_schedule', if_exists => NULL)", "22004", "\"if_exists\""),
        ("pgq_unschedule('bad name')", "22023", "is not a schedule name"),
        ("pgq_unschedule(NULL)", "22004", "\"name\""),
        ("pgq_pause_schedule('no_such_schedule')", "42704", "does not exist"),
        ("pgq_pause_schedule('bad name')", "22023", "is not a schedule name"),
        ("pgq_pause_schedule(NULL)", "22004", "\"name\""),
        ("pgq_resume_schedule('no_such_schedule')", "42704", "does not exist"),
        ("pgq_cron_next('61 * * * *')", "22023", "minute field \"61\""),
        ("pgq_cron_next('* * * * *', 'Mars/Olympus')", "22023", "\"Mars/Olympus\""),
        ("pgq_cron_next(NULL)", "22004", "\"cron\""),
        ("pgq_cron_next('* * * * *', NULL)", "22004", "\"time_zone\""),
        ("pgq_cron_next('* * * * *', after => NULL)", "22004", "\"after\""),
        ("pgq_cron_next('* * * * *', count => NULL)", "22004", "\"count\""),
        ("pgq_cron_next('* * * * *', count => 0)", "22023", "\"count\""),
        ("pgq_cron_next('* * * * *', count => 1001)", "22023", "\"count\""),
    ];
    for (call, code, fragment) in calls {
        let sql = format!("SELECT * FROM pgqueue.{}", call.replace("$X", &x).replace("$Q", &q));
        let (state, message) = refusal(&mut c, &sql);
        assert_eq!(state, code, "{sql}: {message}");
        assert!(message.contains(fragment), "{sql}: {message:?} does not contain {fragment:?}");
    }
    assert_eq!(table(&mut c), before, "the refused calls changed pgqueue.schedules");
    // The accepted edges.
    c.batch_execute("SELECT pgqueue.pgq_unschedule('no_such_schedule', if_exists => true)").unwrap();
    let counts: Vec<i64> = [1, 1000]
        .iter()
        .map(|n: &i32| {
            c.query_one("SELECT count(*) FROM pgqueue.pgq_cron_next('@hourly', count => $1)", &[n]).unwrap().get(0)
        })
        .collect();
    assert_eq!(counts, [1, 1000]);
    for grace in ["1 s", "1 day"] {
        schedule(&mut c, &x, &q, "0 0 1 1 *", &format!(", grace => '{grace}'"));
    }
}

#[test]
fn replace_pause_and_resume_keep_the_schedules_account() {
    let _serial = serial();
    let scope = Scope::new("keep");
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let name = scope.name("s");
    let first = schedule(&mut c, &name, &q, "* * * * * *", "");
    let runs_at_least = |c: &mut Client, n: i64| {
        wait_for("more runs", LIMIT, || (record(c, &name).runs >= n).then_some(()));
    };
    runs_at_least(&mut c, 2);

    // Replaced with the same pattern: the counters and the next run stay (a due slot stays
    // due); the payload is the new one.
    let mut tx = freeze(&mut c, &scope.prefix);
    let r = record(&mut tx, &name);
    let next = schedule(&mut tx, &name, &q, "* * * * * *", ", payload => '{\"v\": 2}'");
    assert_eq!(Some(next), r.next_run, "the same pattern keeps its next run");
    let kept = record(&mut tx, &name);
    assert_eq!((kept.runs, kept.missed, kept.next_run), (r.runs, r.missed, r.next_run));
    tx.commit().unwrap();
    let runs = record(&mut c, &name).runs;
    runs_at_least(&mut c, runs + 1);
    let payload: Value = c
        .query_one("SELECT payload FROM pgqueue.messages WHERE queue = $1 ORDER BY msg_id DESC LIMIT 1", &[&q])
        .unwrap()
        .get(0);
    assert_eq!(payload, json!({"v": 2}));

    // Paused: no run for ~2 s, the worker ticking meanwhile.
    c.execute("SELECT pgqueue.pgq_pause_schedule($1)", &[&name]).unwrap();
    let paused = record(&mut c, &name);
    let ticks = worker_stat(&mut c, "ticks");
    std::thread::sleep(Duration::from_secs(2));
    assert!(worker_stat(&mut c, "ticks") >= ticks + 5, "the worker ticked while it was paused");
    let r = record(&mut c, &name);
    assert_eq!((r.runs, &r.slots, r.next_run), (paused.runs, &paused.slots, paused.next_run), "no run while paused");
    let stats_paused: bool =
        c.query_one("SELECT paused FROM pgqueue.schedule_stats WHERE name = $1", &[&name]).unwrap().get(0);
    assert!(stats_paused);

    // Resumed: from the next slot after now; the slots passed while paused are not missed.
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT pgqueue.pgq_resume_schedule($1)", &[&name]).unwrap();
    let row = tx
        .query_one(
            "SELECT extract(epoch FROM next_run)::bigint, next_run > now() FROM pgqueue.schedules WHERE name = $1",
            &[&name],
        )
        .unwrap();
    let (resumed, after_now): (i64, bool) = (row.get(0), row.get(1));
    assert!(after_now, "resumed after now");
    tx.commit().unwrap();
    runs_at_least(&mut c, paused.runs + 2);
    c.execute("SELECT pgqueue.pgq_pause_schedule($1)", &[&name]).unwrap();
    let r = record(&mut c, &name);
    let until = r.next_run.expect("a next run");
    let expected: Vec<i64> = (first..paused.next_run.unwrap()).chain(resumed..until).collect();
    assert_eq!(r.slots, expected, "every slot but the paused ones, each once: {r:?}");
    assert_eq!((r.runs, r.missed), (r.slots.len() as i64, 0), "{r:?}");

    // Paused, then replaced with the same pattern (which unpauses it): as with a resume, the
    // slots passed meanwhile (the sleep lets one pass) are neither run nor missed.
    std::thread::sleep(Duration::from_millis(1500));
    let mut tx = c.transaction().unwrap();
    let replaced = schedule(&mut tx, &name, &q, "* * * * * *", "");
    let after_now: bool = tx.query_one("SELECT $1::bigint > extract(epoch FROM now())", &[&replaced]).unwrap().get(0);
    assert!(after_now, "a paused schedule replaced runs from after now");
    tx.commit().unwrap();
    runs_at_least(&mut c, r.runs + 2);
    let mut tx = freeze(&mut c, &scope.prefix);
    let r = record(&mut tx, &name);
    tx.rollback().unwrap();
    let expected: Vec<i64> = expected.into_iter().chain(replaced..r.next_run.expect("a next run")).collect();
    assert_eq!(r.slots, expected, "every slot but the paused ones, each once: {r:?}");
    assert_eq!((r.runs, r.missed), (r.slots.len() as i64, 0), "{r:?}");

    // Replaced with another pattern: the counters stay, the next run is the new pattern's.
    let mut tx = freeze(&mut c, &scope.prefix);
    let before = record(&mut tx, &name);
    let next = schedule(&mut tx, &name, &q, "0 0 1 1 *", "");
    let expected: i64 =
        tx.query_one("SELECT extract(epoch FROM pgqueue.pgq_cron_next('0 0 1 1 *'))::bigint", &[]).unwrap().get(0);
    assert_eq!(next, expected);
    let replaced = record(&mut tx, &name);
    assert_eq!((replaced.runs, replaced.missed, replaced.next_run), (before.runs, 0, Some(expected)));
    tx.commit().unwrap();
}

#[test]
fn schedules_belong_to_pgqueue_admin_and_pgq_cron_next_to_everyone() {
    let _serial = serial();
    let scope = Scope::new("roles");
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let db: String = c.query_one("SELECT current_database()::text", &[]).unwrap().get(0);
    let role = unique_queue("sched_role");
    let (producer, admin, nobody) = (format!("{role}_p"), format!("{role}_a"), format!("{role}_n"));
    c.batch_execute(&format!(
        "CREATE ROLE {producer} LOGIN; GRANT pgqueue_producer TO {producer};
         CREATE ROLE {admin} LOGIN; GRANT pgqueue_admin TO {admin};
         CREATE ROLE {nobody} LOGIN;"
    ))
    .unwrap();
    // Every check runs (the roles are dropped before the verdict); `wrong` collects the failures.
    let mut wrong = vec![];
    let name = scope.name("s");
    for role in [&producer, &admin, &nobody] {
        let n = common::connect_as(role, &db)
            .query_one("SELECT count(*) FROM pgqueue.pgq_cron_next('*/5 * * * *', count => 3)", &[])
            .map(|row| row.get::<_, i64>(0));
        if !matches!(n, Ok(3)) {
            wrong.push(format!("{role}: pgq_cron_next: {n:?}"));
        }
    }
    let calls = [
        format!("SELECT pgqueue.pgq_schedule('{name}', '{q}', '0 0 1 1 *')"),
        "SELECT * FROM pgqueue.schedule_stats".into(),
        format!("SELECT pgqueue.pgq_pause_schedule('{name}')"),
        format!("SELECT pgqueue.pgq_resume_schedule('{name}')"),
        format!("SELECT pgqueue.pgq_unschedule('{name}')"),
    ];
    let mut p = common::connect_as(&producer, &db);
    for call in &calls {
        match p.batch_execute(call) {
            Err(e) if e.code().map(|s| s.code()) == Some("42501") => {}
            other => wrong.push(format!("{producer} (a producer): {call}: {other:?}, expected 42501")),
        }
    }
    // An admin, in this order: the schedule exists for pause, resume and unschedule.
    let mut a = common::connect_as(&admin, &db);
    for call in &calls {
        if let Err(e) = a.batch_execute(call) {
            wrong.push(format!("{admin} (an admin): {call}: {e:?}"));
        }
    }
    drop((p, a));
    c.execute("DELETE FROM pgqueue.schedules WHERE name = $1", &[&name]).unwrap();
    c.batch_execute(&format!("DROP ROLE {producer}; DROP ROLE {admin}; DROP ROLE {nobody}")).unwrap();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
