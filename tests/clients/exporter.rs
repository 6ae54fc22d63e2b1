//! monitoring/queries.yaml with the real postgres_exporter (Debian's 0.11): a server with two
//! queues holding known numbers of ready, delayed, claimed, expired and dead messages, the
//! worker's counters after one `pgq_tick()`, a schedule and a waiting claim; the exporter,
//! connected as a login role that is only a member of `pg_monitor`, must serve exactly those
//! values under their Prometheus names and types, without a query error (in its metrics and
//! in its log). The Grafana dashboard and the alert rules may only use metrics it served.

use crate::common;

use common::server::Server;
use common::{Client, claim, claim_one, send_many, wait_for};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Duration;

const EXPORTER: &str = "/usr/bin/prometheus-postgres-exporter";
const LIMIT: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The exporter process; killed when dropped.
struct Exporter {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Exporter {
    /// Starts the exporter against `dsn` with monitoring/queries.yaml and only its metrics
    /// (the built-in ones and collectors are off: they are not ours to test, and some of
    /// 0.11's built-in queries do not fit every PostgreSQL major).
    fn start(dsn: &str, log: PathBuf) -> Exporter {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(EXPORTER)
            .env("DATA_SOURCE_NAME", dsn)
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg(format!("--extend.query-path={}", repo().join("monitoring/queries.yaml").display()))
            .args(["--disable-default-metrics", "--disable-settings-metrics"])
            .args(["--no-collector.database", "--no-collector.bgwriter"])
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .unwrap_or_else(|e| panic!("start {EXPORTER} (scripts/setup.sh installs it): {e}"));
        let mut exporter = Exporter { child, port, log };
        // Its landing page answers once it listens (without querying the server).
        wait_for("the exporter to listen", LIMIT, || {
            if let Ok(Some(status)) = exporter.child.try_wait() {
                panic!("the exporter exited ({status}):\n{}", exporter.log());
            }
            ureq::get(&format!("http://127.0.0.1:{port}/")).call().ok().map(|_| ())
        });
        exporter
    }

    fn scrape(&self) -> String {
        ureq::get(&format!("http://127.0.0.1:{}/metrics", self.port))
            .call()
            .unwrap_or_else(|e| panic!("scrape: {e}\n{}", self.log()))
            .into_string()
            .unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One sample of the text exposition format.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

fn parse(text: &str) -> (Vec<Sample>, BTreeMap<String, String>) {
    let mut samples = vec![];
    let mut types = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            types.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').unwrap();
                let labels = body
                    .split("\",")
                    .filter(|p| !p.is_empty())
                    .map(|p| {
                        let (k, v) = p.split_once("=\"").unwrap();
                        (k.to_string(), v.trim_end_matches('"').to_string())
                    })
                    .collect();
                (name, labels)
            }
        };
        let value = value.parse().unwrap_or_else(|_| panic!("a value in {line:?}"));
        samples.push(Sample { name: name.to_string(), labels, value });
    }
    (samples, types)
}

/// The value of the one sample named `name` whose labels include `labels`.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
        .collect();
    assert_eq!(found.len(), 1, "one sample {name}{labels:?}, found {found:?}");
    found[0].value
}

fn f64_of(c: &mut Client, sql: &str) -> f64 {
    c.query_one(sql, &[]).unwrap().get(0)
}

/// Expired claims: `pgq_claim` with a 1 ms lease, then waits until it has ended.
fn expired_claims(c: &mut Client, q: &str, qty: i32) {
    let got = claim(c, q, qty, Some("1 millisecond"));
    assert_eq!(got.len(), qty as usize, "claimed {qty} of {q}");
    wait_for("the leases to end", LIMIT, || {
        let n: i64 = c
            .query_one("SELECT count(*) FROM pgqueue.messages WHERE queue = $1 AND lease_expires_at <= now()", &[&q])
            .unwrap()
            .get(0);
        (n >= qty as i64).then_some(())
    });
}

fn fail(c: &mut Client, q: &str) {
    let (id, token) = claim_one(c, q, Some("1 hour")).held();
    let done: bool = c.query_one("SELECT pgqueue.pgq_fail($1, $2)", &[&id, &token]).unwrap().get(0);
    assert!(done);
}

#[test]
fn exporter_serves_the_queries_of_monitoring() {
    let _turn = common::file_turn(file!());
    // The worker off: the claims stay expired and the counters move only by our pgq_tick().
    let server = Server::with_pgqueue(&["pgqueue.enabled = off"]);
    let mut c = server.connect("postgres");
    c.batch_execute(
        "SELECT pgqueue.pgq_create_queue('a', max_attempts => 5);
         SELECT pgqueue.pgq_create_queue('b', max_attempts => 1);
         SELECT pgqueue.pgq_create_queue('c');",
    )
    .unwrap();
    let ticks: i64 = c.query_one("SELECT ticks FROM pgqueue.worker_stats", &[]).unwrap().get(0);
    assert_eq!(ticks, 0, "the worker is off");

    // Counters: one tick re-arms a's 2 expired claims and dead-letters b's (1 attempt).
    send_many(&mut c, "a", 2, "0");
    expired_claims(&mut c, "a", 2);
    send_many(&mut c, "b", 1, "0");
    expired_claims(&mut c, "b", 1);
    let failed: i64 = c.query_one("SELECT count(*) FROM pgqueue.pgq_tick()", &[]).unwrap().get(0);
    assert_eq!(failed, 0, "no step of the tick failed");

    // a: ready 3, delayed 2, claimed 3 (2 expired), dead 1.
    send_many(&mut c, "a", 4, "0");
    claim_one(&mut c, "a", Some("1 hour"));
    expired_claims(&mut c, "a", 2);
    fail(&mut c, "a");
    send_many(&mut c, "a", 1, "0");
    send_many(&mut c, "a", 2, "1 hour");
    // b: ready 1, delayed 0, claimed 1 (expired), dead 2, pending 1 (on a delayed message of a),
    // parked 1.
    send_many(&mut c, "b", 3, "0");
    expired_claims(&mut c, "b", 1);
    fail(&mut c, "b");
    c.batch_execute(
        "SELECT pgqueue.pgq_send('b', '{}', after => ARRAY(SELECT min(msg_id) FROM pgqueue.messages
                                                          WHERE queue = 'a' AND state = 'delayed'));
         SELECT pgqueue.pgq_send('b', '{}');
         SELECT pgqueue.pgq_park(msg_id, claim_token, key => 'exporter', timeout => '1 hour')
           FROM pgqueue.pgq_claim('b');",
    )
    .unwrap();
    // c: empty, with a claim waiting on it.
    let waiter = {
        let mut w = server.connect("postgres");
        thread::spawn(move || w.query("SELECT * FROM pgqueue.pgq_claim('c', wait => '60 s')", &[]).unwrap().len())
    };
    wait_for("the claim to wait", LIMIT, || {
        let n: i64 =
            c.query_one("SELECT waiting_claims FROM pgqueue.queue_depth WHERE queue = 'c'", &[]).unwrap().get(0);
        (n == 1).then_some(())
    });
    c.batch_execute(
        "SELECT pgqueue.pgq_schedule('nightly', 'a', '0 3 * * *');
         SELECT pgqueue.pgq_schedule('held', 'b', '*/5 * * * *', paused => true);
         CREATE ROLE pgqueue_exporter LOGIN IN ROLE pg_monitor;",
    )
    .unwrap();

    let dsn = format!("postgresql://pgqueue_exporter@127.0.0.1:{}/postgres?sslmode=disable", server.port);
    let exporter = Exporter::start(&dsn, server.dir.join("exporter.log"));
    // Ages grow while we look: the served one lies between the ones read before and after.
    let ages =
        "SELECT extract(epoch FROM s.oldest_ready_age)::float8, extract(epoch FROM s.oldest_expired_claim_age)::float8
                  FROM pgqueue.queue_stats s WHERE queue = 'a'";
    let since = "SELECT extract(epoch FROM since_last_tick)::float8 FROM pgqueue.worker_stats";
    let (ready_before, expired_before): (f64, f64) = {
        let r = c.query_one(ages, &[]).unwrap();
        (r.get(0), r.get(1))
    };
    let since_before = f64_of(&mut c, since);
    let text = exporter.scrape();
    let (ready_after, expired_after): (f64, f64) = {
        let r = c.query_one(ages, &[]).unwrap();
        (r.get(0), r.get(1))
    };
    let since_after = f64_of(&mut c, since);
    c.batch_execute("SELECT pgqueue.pgq_send('c', '{}')").unwrap();
    assert_eq!(waiter.join().unwrap(), 1, "the waiting claim got the message sent after the scrape");

    let (samples, types) = parse(&text);
    let log = exporter.log();
    let context = format!("--- metrics ---\n{text}\n--- exporter log ---\n{log}");

    // The exporter connected, loaded the file and ran every query without an error.
    assert_eq!(value(&samples, "pg_up", &[]), 1.0, "{context}");
    assert_eq!(value(&samples, "pg_exporter_last_scrape_error", &[]), 0.0, "{context}");
    assert_eq!(value(&samples, "pg_exporter_user_queries_load_error", &[]), 0.0, "{context}");
    for bad in ["level=error", "level=warn", "err="] {
        assert!(!log.contains(bad), "the exporter logged {bad:?}\n{context}");
    }

    // Depth by state, exactly, and nothing else for pgqueue_queue_messages.
    let mut depth = BTreeMap::new();
    for s in samples.iter().filter(|s| s.name == "pgqueue_queue_messages") {
        assert_eq!(s.labels["datname"], "postgres");
        assert!(s.labels.contains_key("server"), "the exporter's server label: {s:?}");
        depth.insert((s.labels["queue"].clone(), s.labels["state"].clone()), s.value);
    }
    let want: BTreeMap<(String, String), f64> = [
        ("a", "ready", 3.0),
        ("a", "delayed", 2.0),
        ("a", "claimed", 3.0),
        ("a", "dead", 1.0),
        ("a", "pending", 0.0),
        ("a", "parked", 0.0),
        ("b", "ready", 1.0),
        ("b", "delayed", 0.0),
        ("b", "claimed", 1.0),
        ("b", "dead", 2.0),
        ("b", "pending", 1.0),
        ("b", "parked", 1.0),
        ("c", "ready", 0.0),
        ("c", "delayed", 0.0),
        ("c", "claimed", 0.0),
        ("c", "dead", 0.0),
        ("c", "pending", 0.0),
        ("c", "parked", 0.0),
    ]
    .into_iter()
    .map(|(q, s, v)| ((q.to_string(), s.to_string()), v))
    .collect();
    assert_eq!(depth, want, "{context}");

    // Per queue.
    let q = |name: &str, queue: &str| value(&samples, name, &[("queue", queue), ("datname", "postgres")]);
    assert_eq!((q("pgqueue_expired_claims", "a"), q("pgqueue_expired_claims", "b")), (2.0, 1.0));
    assert_eq!(q("pgqueue_expired_claims", "c"), 0.0);
    let ready_age = q("pgqueue_oldest_ready_age_seconds", "a");
    assert!(ready_before <= ready_age && ready_age <= ready_after, "{ready_before} <= {ready_age} <= {ready_after}");
    let expired_age = q("pgqueue_oldest_expired_claim_age_seconds", "a");
    assert!(expired_before <= expired_age && expired_age <= expired_after);
    assert_eq!(q("pgqueue_oldest_ready_age_seconds", "c"), 0.0, "no ready message: 0");
    assert_eq!(q("pgqueue_oldest_expired_claim_age_seconds", "c"), 0.0);
    assert_eq!((q("pgqueue_waiting_claims", "c"), q("pgqueue_waiting_claims", "a")), (1.0, 0.0));
    assert_eq!((q("pgqueue_paused", "a"), q("pgqueue_tracked", "a")), (0.0, 1.0));
    let wakeups: i64 = c.query_one("SELECT wakeups FROM pgqueue.queue_depth WHERE queue = 'a'", &[]).unwrap().get(0);
    assert_eq!(q("pgqueue_wakeups_total", "a"), wakeups as f64);

    // The worker's counters: the one tick's, and every other equal to the view's.
    let w = |name: &str| value(&samples, name, &[("datname", "postgres")]);
    assert_eq!(w("pgqueue_worker_ticks_total"), 1.0, "{context}");
    assert_eq!(w("pgqueue_worker_rearmed_total"), 2.0);
    assert_eq!(w("pgqueue_worker_dead_lettered_total"), 1.0);
    assert_eq!(w("pgqueue_worker_tick_failures_total"), 0.0);
    assert_eq!(w("pgqueue_worker_tick_interval_seconds"), 1.0);
    assert_eq!(w("pgqueue_worker_last_error_timestamp_seconds"), 0.0, "no error ever: 0");
    let since_tick = w("pgqueue_worker_since_last_tick_seconds");
    assert!(since_before <= since_tick && since_tick <= since_after, "{since_before} <= {since_tick} <= {since_after}");
    let row = c.query_one("SELECT * FROM pgqueue.worker_stats", &[]).unwrap();
    for (metric, column) in [
        ("promoted_total", "promoted"),
        ("orphans_expired_total", "orphans_expired"),
        ("rescue_batches_total", "rescue_batches"),
        ("rescue_rows_total", "rescue_rows"),
        ("partitions_created_total", "partitions_created"),
        ("pruned_rows_total", "pruned_rows"),
        ("hint_corrections_total", "hint_corrections"),
        ("scheduled_runs_total", "scheduled_runs"),
        ("missed_runs_total", "missed_runs"),
        ("schedule_errors_total", "schedule_errors"),
        ("keys_expired_total", "keys_expired"),
    ] {
        let want: i64 = row.get(column);
        assert_eq!(w(&format!("pgqueue_worker_{metric}")), want as f64, "{metric}");
    }
    for step in ["schedule", "promote", "orphan", "rearm", "reconcile", "keys", "partition", "prune"] {
        let n = value(&samples, "pgqueue_worker_step_failures_total", &[("step", step), ("datname", "postgres")]);
        assert_eq!(n, 0.0, "{step}");
    }
    let row = c.query_one("SELECT prune_noop, prune_pruned FROM pgqueue.worker_stats", &[]).unwrap();
    let outcome = |o: &str| value(&samples, "pgqueue_worker_prune_outcomes_total", &[("outcome", o)]);
    assert_eq!((outcome("noop"), outcome("pruned")), (row.get::<_, i64>(0) as f64, row.get::<_, i64>(1) as f64));
    assert_eq!(samples.iter().filter(|s| s.name == "pgqueue_worker_prune_outcomes_total").count(), 6);

    // Schedules.
    let s = |name: &str, schedule: &str| value(&samples, name, &[("schedule", schedule)]);
    let next = f64_of(
        &mut c,
        "SELECT extract(epoch FROM next_run)::float8 FROM pgqueue.schedule_stats WHERE name = 'nightly'",
    );
    assert_eq!(s("pgqueue_schedule_next_run_timestamp_seconds", "nightly"), next);
    assert_eq!((s("pgqueue_schedule_paused", "nightly"), s("pgqueue_schedule_paused", "held")), (0.0, 1.0));
    assert_eq!((s("pgqueue_schedule_exhausted", "nightly"), s("pgqueue_schedule_runs_total", "nightly")), (0.0, 0.0));
    assert_eq!(value(&samples, "pgqueue_schedule_runs_total", &[("schedule", "nightly"), ("queue", "a")]), 0.0);

    // Shared memory.
    assert_eq!(value(&samples, "pgqueue_shared_max_queues", &[]), 1024.0);
    let queues = f64_of(&mut c, "SELECT queues::float8 FROM pgqueue.shared_state");
    assert!(queues >= 3.0, "a, b and c are tracked");
    assert_eq!(value(&samples, "pgqueue_shared_queues", &[]), queues);
    assert_eq!(value(&samples, "pgqueue_shared_queues_untracked_total", &[]), 0.0);

    // Prometheus naming: counters end in _total, and only counters do.
    let ours: BTreeSet<&str> = samples.iter().map(|s| s.name.as_str()).filter(|n| n.starts_with("pgqueue_")).collect();
    for name in &ours {
        let kind = types.get(*name).map(String::as_str);
        let want = if name.ends_with("_total") { "counter" } else { "gauge" };
        assert_eq!(kind, Some(want), "# TYPE of {name}");
    }

    // The dashboard and the alert rules use nothing else.
    let served: BTreeSet<&str> = samples.iter().map(|s| s.name.as_str()).collect();
    check_names("monitoring/grafana-dashboard.json", &dashboard_exprs(), &served);
    check_names("monitoring/alerts.yml", &[read("monitoring/alerts.yml")], &served);
    check_names("monitoring/alerts.test.yml", &[read("monitoring/alerts.test.yml")], &served);
}

/// The alert rules and the dashboard's queries are valid PromQL, and each alert fires on the
/// series of its trouble and not on a healthy server (monitoring/alerts.test.yml), by
/// Debian's promtool.
/// Without the library preloaded (or past `pgqueue.max_queues`) a queue has no shared-memory
/// record: its metrics are served all the same, with `pgqueue_tracked` 0.
#[test]
fn an_untracked_queue_keeps_its_metrics() {
    let _turn = common::file_turn(file!());
    drop(common::connect()); // installs the extension into the trees
    let server = Server::init(&common::server::bindir(common::server::this_major()), &[]);
    server.start();
    let mut c = server.connect("postgres");
    c.batch_execute(
        "CREATE EXTENSION pgqueue;
         SELECT pgqueue.pgq_create_queue('u');
         CREATE ROLE pgqueue_exporter LOGIN IN ROLE pg_monitor;",
    )
    .unwrap();
    send_many(&mut c, "u", 3, "0");
    expired_claims(&mut c, "u", 1);
    let tracked: bool = c.query_one("SELECT tracked FROM pgqueue.queue_depth WHERE queue = 'u'", &[]).unwrap().get(0);
    assert!(!tracked, "no shared memory without preloading");

    let dsn = format!("postgresql://pgqueue_exporter@127.0.0.1:{}/postgres?sslmode=disable", server.port);
    let exporter = Exporter::start(&dsn, server.dir.join("exporter.log"));
    let text = exporter.scrape();
    let (samples, _) = parse(&text);
    let q = |name: &str| value(&samples, name, &[("queue", "u"), ("datname", "postgres")]);
    assert_eq!(q("pgqueue_expired_claims"), 1.0, "{text}");
    assert_eq!((q("pgqueue_tracked"), q("pgqueue_waiting_claims")), (0.0, 0.0));
    assert!(q("pgqueue_oldest_ready_age_seconds") > 0.0);
    assert_eq!(value(&samples, "pg_exporter_last_scrape_error", &[]), 0.0, "{text}");
}

#[test]
fn promtool_checks_the_rules_and_the_dashboard() {
    let _turn = common::file_turn(file!());
    let dir = repo().join("monitoring");
    promtool(&["check", "rules", "alerts.yml"], &dir);
    promtool(&["test", "rules", "alerts.test.yml"], &dir);
    // The dashboard's expressions as recording rules, its variables replaced by `.*`.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, expr) in dashboard_exprs().iter().enumerate() {
        let expr = expr.replace("$datname", ".*").replace("$queue", ".*");
        if expr.starts_with("label_values(") {
            continue; // Grafana's function, not PromQL (its metric is checked in the other test)
        }
        rules.push_str(&format!("      - record: dashboard:expr_{i}\n        expr: {}\n", serde_json::json!(expr)));
    }
    let file = std::env::temp_dir().join(format!("pgqueue-dashboard-rules-{}.yml", std::process::id()));
    std::fs::write(&file, rules).unwrap();
    promtool(&["check", "rules", file.to_str().unwrap()], &dir);
    std::fs::remove_file(&file).unwrap();
}

fn promtool(args: &[&str], dir: &std::path::Path) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("promtool (Debian package prometheus, scripts/setup.sh installs it): {e}"));
    assert!(
        out.status.success(),
        "promtool {args:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every PromQL expression of the dashboard (panels' targets and template variables' queries).
fn dashboard_exprs() -> Vec<String> {
    let json: serde_json::Value = serde_json::from_str(&read("monitoring/grafana-dashboard.json")).expect("valid JSON");
    let mut exprs = vec![];
    for panel in json["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(target["expr"].as_str().expect("a target's expr").to_string());
        }
    }
    for var in json["templating"]["list"].as_array().expect("template variables") {
        if let Some(query) = var["query"].as_str().or(var["query"]["query"].as_str()) {
            exprs.push(query.to_string());
        }
    }
    assert!(
        json["templating"]["list"].as_array().unwrap().iter().any(|v| v["type"] == "datasource"),
        "the Prometheus datasource is a template variable"
    );
    assert!(exprs.len() >= 6, "the dashboard has its panels: {exprs:?}");
    exprs
}

/// Every `pgqueue_*` / `pg_*` name in `texts` must be one the exporter served.
fn check_names(file: &str, texts: &[String], served: &BTreeSet<&str>) {
    let mut used = BTreeSet::new();
    for text in texts {
        for word in text.split(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_')) {
            if word.starts_with("pgqueue_") || word.starts_with("pg_") {
                used.insert(word.to_string());
            }
        }
    }
    assert!(used.len() >= 5, "{file} uses pgqueue's metrics: {used:?}");
    let unknown: Vec<&String> = used.iter().filter(|n| !served.contains(n.as_str())).collect();
    assert!(unknown.is_empty(), "{file} uses metrics the exporter did not serve: {unknown:?}");
}
