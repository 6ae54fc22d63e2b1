//! Shared helpers for integration tests: a real server started by pgrx-tests with the
//! library preloaded, and real connections that commit.

#![allow(dead_code)]

pub mod kit;
pub mod rng;
pub mod server;

#[allow(unused_imports)]
pub use kit::*;
#[allow(unused_imports)]
pub use rng::Rng;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub use postgres::Client;

/// Starts (once per test binary) the test cluster with the worker preloaded, and returns a
/// fresh connection to the test database.
pub fn connect() -> Client {
    start_cluster();
    pgrx_tests::client().expect("connect to the test cluster").0
}

fn start_cluster() {
    pgrx_tests::run_test("test_extension_installed", None, pgqueue::pg_test::postgresql_conf_options())
        .expect("test cluster starts");
}

/// Turns the background worker off in this test binary's cluster (for tests that count
/// re-arms themselves), once, and waits until it has stopped ticking.
pub fn disable_worker() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| turn_workers_off(&mut connect()));
}

/// `pgqueue.enabled = off` in `c`'s cluster (reloaded), and waits until the worker of `c`'s
/// database has stopped ticking.
pub fn turn_workers_off(c: &mut Client) {
    c.batch_execute("ALTER SYSTEM SET pgqueue.enabled = off").unwrap();
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
    let ticks = |c: &mut Client| -> i64 { c.query_one("SELECT ticks FROM pgqueue.worker_state", &[]).unwrap().get(0) };
    let mut last = ticks(c);
    wait_for("the worker to stop ticking", Duration::from_secs(30), || {
        std::thread::sleep(Duration::from_millis(500));
        let now = ticks(c);
        std::mem::replace(&mut last, now).eq(&now).then_some(())
    });
}

/// Workers only in the databases `list` names (`pgqueue.databases`, reloaded), or everywhere
/// again (None); waits until no worker is left in any other database.
pub fn workers_only_in(c: &mut Client, list: Option<&str>) {
    match list {
        Some(list) => c.batch_execute(&format!("ALTER SYSTEM SET pgqueue.databases = '{list}'")).unwrap(),
        None => c.batch_execute("ALTER SYSTEM RESET pgqueue.databases").unwrap(),
    }
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
    if let Some(list) = list {
        wait_for("workers only where listed", Duration::from_secs(30), || {
            let others: i64 = c
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgqueue worker'
                        AND datname <> ALL (string_to_array(replace($1, ' ', ''), ','))",
                    &[&list],
                )
                .unwrap()
                .get(0);
            (others == 0).then_some(())
        });
    }
}

/// A connection whose server notices (e.g. auto_explain output) are collected in `sink`.
pub fn connect_with_notices(sink: Arc<Mutex<Vec<String>>>) -> Client {
    config(None)
        .notice_callback(move |notice| sink.lock().unwrap().push(notice.message().to_string()))
        .connect(postgres::NoTls)
        .expect("connect with a notice callback")
}

/// A connection to another database of the test cluster, whose notices are collected in `sink`.
pub fn connect_to_with_notices(dbname: &str, sink: Arc<Mutex<Vec<String>>>) -> Client {
    config(Some(dbname))
        .notice_callback(move |notice| sink.lock().unwrap().push(notice.message().to_string()))
        .connect(postgres::NoTls)
        .expect("connect with a notice callback")
}

/// A connection to another database of the test cluster.
pub fn connect_to(dbname: &str) -> Client {
    config(Some(dbname)).connect(postgres::NoTls).expect("connect to another database")
}

/// A connection to the test cluster's `dbname` as `user` (trust authentication).
pub fn connect_as(user: &str, dbname: &str) -> Client {
    config(Some(dbname)).user(user).connect(postgres::NoTls).expect("connect as another role")
}

/// A libpq connection string for the test database.
pub fn dsn() -> String {
    let config = config(None);
    let port = config.get_ports()[0];
    let user = config.get_user().unwrap_or("postgres").to_string();
    format!("host=localhost port={port} user={user} dbname={}", config.get_dbname().unwrap_or("pgrx_tests"))
}

/// Connection settings for the test cluster, for `dbname` (default: the test database).
fn config(dbname: Option<&str>) -> postgres::Config {
    let mut probe = connect();
    let row = probe
        .query_one("SELECT current_setting('port')::int, current_user::text, current_database()::text", &[])
        .unwrap();
    let (port, user, db): (i32, String, String) = (row.get(0), row.get(1), row.get(2));
    let mut config = postgres::Config::new();
    config.host("localhost").port(port as u16).user(&user).dbname(dbname.unwrap_or(&db));
    config
}

/// A queue name no other test uses.
pub fn unique_queue(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("{prefix}_{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Runs `sql` as `user` with `role` granted for this call only (revoked after, whatever the
/// result): what a role may do, without a login of its own.
pub fn as_role(c: &mut Client, user: &str, role: &str, sql: &str) -> Result<u64, postgres::Error> {
    c.batch_execute(&format!("GRANT {role} TO {user}; SET ROLE {user}"))?;
    let r = c.execute(sql, &[]);
    c.batch_execute(&format!("RESET ROLE; REVOKE {role} FROM {user}"))?;
    r
}

/// How many tests pytest's summary line ("… 24 passed …") says passed; 0 without one.
pub fn pytest_passed(output: &str) -> usize {
    let summary = output.lines().rev().find(|l| l.contains(" passed")).unwrap_or("");
    let words: Vec<&str> = summary.split_whitespace().collect();
    words.windows(2).find(|w| w[1].trim_end_matches(',') == "passed").and_then(|w| w[0].parse().ok()).unwrap_or(0)
}

/// The SQLSTATE of a failed statement.
pub fn sqlstate(result: Result<impl Sized, postgres::Error>) -> String {
    match result {
        Ok(_) => panic!("expected an error, the statement succeeded"),
        Err(e) => e.code().map(|c| c.code().to_string()).unwrap_or_else(|| format!("no SQLSTATE: {e}")),
    }
}

/// Polls `probe` until it returns `Some`, failing the test after `limit`.
pub fn wait_for<T>(what: &str, limit: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A queue with `rows` completed messages in a day partition five days old, past its
/// one-day retention. Returns (queue, partition).
pub fn queue_with_old_history(c: &mut Client, rows: i64) -> (String, String) {
    let q = unique_queue("prune");
    c.execute("SELECT pgqueue.pgq_create_queue($1, retention => '1 day')", &[&q]).unwrap();
    c.execute("SELECT pgqueue._ensure_history_day($1, current_date - 5)", &[&q]).unwrap();
    c.execute(
        "INSERT INTO pgqueue.history (msg_id, queue, outcome, priority, attempt, payload, enqueued_at, finished_at)
         SELECT -g, $1, 'completed', 0, 1, '{}', now() - '6 days'::interval, (current_date - 5) + interval '1 hour'
           FROM generate_series(1, $2::bigint) g",
        &[&q, &rows],
    )
    .unwrap();
    let part: String = c
        .query_one("SELECT format('history_%s$%s', $1::text, to_char(current_date - 5, 'YYYYMMDD'))", &[&q])
        .unwrap()
        .get(0);
    (q, part)
}

/// `pgq_prune` of `q`, in a transaction of its own. Under the default lock timeout (10 ms) a
/// transaction of another test in the same cluster can make it `blocked` (a read of history by
/// msg_id alone locks every queue's partitions): unless the test set a timeout of its own, the
/// prune waits up to 60 s for its locks.
pub fn prune(c: &mut Client, q: &str) -> Vec<(String, String, i64)> {
    let mut tx = c.transaction().unwrap();
    tx.batch_execute(
        "SELECT set_config('pgqueue.prune_lock_timeout', '60s', true)
          WHERE current_setting('pgqueue.prune_lock_timeout') = '10ms'",
    )
    .unwrap();
    let rows = tx
        .query("SELECT target, outcome, rows FROM pgqueue.pgq_prune($1)", &[&q])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    tx.commit().unwrap();
    rows
}

/// Which file of a grouped test binary (tests/README.md) has the cluster, and how many of
/// its tests are running.
struct Turns {
    file: Option<&'static str>,
    running: usize,
}

static TURNS: Mutex<Turns> = Mutex::new(Turns { file: None, running: 0 });
static TURN_OVER: Condvar = Condvar::new();

/// A test's turn in a grouped binary: the tests of one file run together, in parallel as in
/// a binary of their own, never alongside another file's tests. Held until dropped.
pub struct FileTurn;

/// Waits until no other file's tests run, then holds the turn for `file` (pass `file!()`).
pub fn file_turn(file: &'static str) -> FileTurn {
    let mut t = TURNS.lock().unwrap_or_else(|e| e.into_inner());
    while t.file.is_some_and(|f| f != file) {
        t = TURN_OVER.wait(t).unwrap_or_else(|e| e.into_inner());
    }
    t.file = Some(file);
    t.running += 1;
    FileTurn
}

impl Drop for FileTurn {
    fn drop(&mut self) {
        let mut t = TURNS.lock().unwrap_or_else(|e| e.into_inner());
        t.running -= 1;
        if t.running == 0 {
            t.file = None;
            TURN_OVER.notify_all();
        }
    }
}
