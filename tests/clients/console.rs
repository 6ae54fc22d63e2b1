//! The operator console (console/) in a real browser: consoles started in-process on
//! 127.0.0.1 — as a superuser, as a role with only pg_monitor, on a streaming standby, with
//! --read-only, and one that requires a login —
//! and console/tests/test_console.py (pytest + Playwright driving Debian's chromium) run
//! against them. It writes the screenshots of docs/console.md into docs/images/. The virtual
//! environment with Playwright and pytest is made by scripts/setup.sh.

use crate::common;

use common::server::Server;
use pgqueue_console::{Config, ConfigError};
use std::path::PathBuf;
use std::process::Command;

/// Tests in console/tests/test_console.py: pytest must report at least this many passed.
const EXPECTED_PASSED: usize = 19;

/// Starts a console of `config` on a free loopback port of `rt`; returns its URL.
fn start(rt: &tokio::runtime::Runtime, config: Config) -> String {
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    rt.spawn(async move {
        if let Err(e) = pgqueue_console::serve(config, listener).await {
            panic!("the console stopped: {e}");
        }
    });
    url
}

/// The password and token of the console that requires a login.
const PASSWORD: &str = "correct horse battery staple";
const TOKEN: &str = "a-token-for-the-browser-tests";

#[test]
fn console_in_a_browser() {
    let _turn = common::file_turn(file!());
    let primary = Server::with_pgqueue(&["pgqueue.tick_interval = '200ms'", "pgqueue.launcher_naptime = '200ms'"]);
    primary
        .connect("postgres")
        .batch_execute(
            "DROP ROLE IF EXISTS console_watcher;
             CREATE ROLE console_watcher LOGIN IN ROLE pg_monitor;",
        )
        .unwrap();
    let standby = Server::standby_of(&primary, &[]);
    standby.start();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let admin = start(&rt, Config::new(primary.dsn("postgres")));
    let watcher = format!("host=127.0.0.1 port={} user=console_watcher dbname=postgres", primary.port);
    let read_only = start(&rt, Config::new(watcher));
    let on_standby = start(&rt, Config::new(standby.dsn("postgres")));
    let forced = start(&rt, Config { read_only: true, ..Config::new(primary.dsn("postgres")) });
    let hash = pgqueue_console::auth::hash_password(PASSWORD).unwrap();
    let with_login = start(
        &rt,
        Config { password_hash: Some(hash), token: Some(TOKEN.into()), ..Config::new(primary.dsn("postgres")) },
    );

    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let venv = std::env::var("PGQUEUE_VENV").unwrap_or_else(|_| "/var/cache/pgqueue/venv".into());
    let python = PathBuf::from(&venv).join("bin/python");
    assert!(python.exists(), "{} is missing: run scripts/setup.sh", python.display());
    let out = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "console/tests"])
        .current_dir(&root)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PGQC_ADMIN_URL", &admin)
        .env("PGQC_ADMIN_DSN", primary.dsn("postgres"))
        .env("PGQC_READONLY_URL", &read_only)
        .env("PGQC_STANDBY_URL", &on_standby)
        .env("PGQC_STANDBY_DSN", standby.dsn("postgres"))
        .env("PGQC_FORCED_URL", &forced)
        .env("PGQC_LOGIN_URL", &with_login)
        .env("PGQC_LOGIN_PASSWORD", PASSWORD)
        .env("PGQC_LOGIN_TOKEN", TOKEN)
        .env("PGQC_SCREENSHOTS", root.join("docs/images"))
        .output()
        .expect("run pytest");
    let output = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let n = common::pytest_passed(&output);
    assert!(
        out.status.success() && n >= EXPECTED_PASSED,
        "pytest exited with {} and {n} passed (expected at least {EXPECTED_PASSED}):\n{output}\n--- server log ---\n{}",
        out.status,
        primary.log()
    );
    println!("{output}");
    drop(rt);
}

#[test]
fn a_non_loopback_listen_without_auth_is_refused() {
    let _turn = common::file_turn(file!());
    let exposed = Config { listen: "0.0.0.0:8080".parse().unwrap(), ..Config::new("host=127.0.0.1 dbname=postgres") };
    assert_eq!(exposed.validate(), Err(ConfigError::ExposedWithoutAuth(exposed.listen)));
    // serve() judges the address the listener really has, whatever the config says.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("0.0.0.0:0")).unwrap();
    let refused = rt.block_on(pgqueue_console::serve(Config::new("host=127.0.0.1 dbname=postgres"), listener));
    let message = refused.expect_err("serve refuses an exposed listener").to_string();
    assert!(message.contains("refusing to listen on 0.0.0.0:"), "{message}");
    let with_token = Config { token: Some("a-token-of-enough-length".into()), ..exposed };
    assert_eq!(with_token.validate(), Ok(()));
}

/// The status and body of a GET (ureq answers an error status as an error).
fn get(url: &str) -> (u16, String) {
    match ureq::get(url).call() {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
        Err(e) => panic!("GET {url}: {e}"),
    }
}

#[test]
fn the_console_says_the_database_is_away_and_recovers_by_itself() {
    let _turn = common::file_turn(file!());
    let server = Server::with_pgqueue(&[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let url = start(&rt, Config::new(server.dsn("postgres")));
    assert_eq!(get(&url).0, 200);
    server.stop();
    let (status, body) = get(&url);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("database unavailable, retrying"), "{body}");
    server.start();
    // The pool drops the dead connections and makes new ones: no restart of the console.
    common::wait_for("the console to answer again", std::time::Duration::from_secs(30), || {
        (get(&url).0 == 200).then_some(())
    });
}

/// The console's sessions run with JIT off (docs/console.md "At size"): its per-queue probes
/// cost more to compile than to run.
#[test]
fn the_consoles_sessions_run_without_jit() {
    let _turn = common::file_turn(file!());
    let server = Server::with_pgqueue(&[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let jit: String = rt.block_on(async {
        let pool = pgqueue_console::db::pool(&server.dsn("postgres")).unwrap();
        let client = pool.get().await.unwrap();
        client.query_one("SHOW jit", &[]).await.unwrap().get(0)
    });
    assert_eq!(jit, "off");
    let mut c = server.connect("postgres");
    let default: String = c.query_one("SHOW jit", &[]).unwrap().get(0);
    assert_eq!(default, "on", "the server's own default, which the console overrides");
}

/// Shared buffers the statement `sql` reads (hit or read) when it runs with `params`, and its
/// plan as JSON text.
fn buffers(c: &mut postgres::Client, sql: &str, params: &[&(dyn postgres::types::ToSql + Sync)]) -> (i64, String) {
    let plan: serde_json::Value =
        c.query_one(&format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}"), params).unwrap().get(0);
    let top = &plan[0]["Plan"];
    let n = |k: &str| top[k].as_i64().unwrap_or(0);
    (n("Shared Hit Blocks") + n("Shared Read Blocks"), plan.to_string())
}

/// The overview's and a queue page's statements (issue 29: "read O(queues) buffers"):
/// measured with a small history and backlog, then with a hundred times more, on the same
/// queues. What they read must not grow with either, and they must not touch history.
#[test]
fn the_overview_and_queue_pages_read_o_queues_buffers() {
    use pgqueue_console::pages::{COUNTS_SQL, JOB_SQL, LAST_HOUR_SQL};
    let _turn = common::file_turn(file!());
    let server = Server::with_pgqueue(&["pgqueue.enabled = off"]);
    let mut c = server.connect("postgres");
    const QUEUES: i64 = 4;
    let mut dead_ids = vec![];
    for q in 0..QUEUES {
        let name = format!("sized_{q}");
        c.batch_execute(&format!(
            "SELECT pgqueue.pgq_create_queue('{name}', max_attempts => 1);
             SELECT pgqueue.pgq_send_batch('{name}', array_fill('{{}}'::jsonb, ARRAY[4]));
             SELECT pgqueue.pgq_send('{name}', '{{}}', priority => 5::smallint);
             SELECT pgqueue.pgq_send('{name}', '{{}}', delay => '1 hour');
             INSERT INTO pgqueue.queue_minutes (queue, minute, sent, completed)
             SELECT '{name}', date_trunc('minute', now()) - m * interval '1 minute', 10, 10 FROM generate_series(1, 60) m;"
        ))
        .unwrap();
        let m = common::kit::claim_one(&mut c, &name, None);
        c.execute("SELECT pgqueue.pgq_fail($1, $2, 'broken')", &[&m.id, &m.token]).unwrap();
        dead_ids.push((name.clone(), m.id));
        common::kit::claim_one(&mut c, &name, Some("1 ms"));
    }
    // The worker is off: pgq_tick() counts what the shared state does not know yet.
    c.batch_execute("SELECT * FROM pgqueue.pgq_tick()").unwrap();
    c.batch_execute("ANALYZE").unwrap();
    let measure = |c: &mut postgres::Client| {
        let all: Option<String> = None;
        let one = Some("sized_0".to_string());
        let (id, queue) = (dead_ids[0].1, dead_ids[0].0.clone());
        [
            buffers(c, COUNTS_SQL, &[&all]),
            buffers(c, LAST_HOUR_SQL, &[&all]),
            buffers(c, COUNTS_SQL, &[&one]),
            buffers(c, LAST_HOUR_SQL, &[&one]),
            buffers(c, JOB_SQL, &[&id, &queue]),
        ]
    };
    let small = measure(&mut c);

    // A hundred times the history (and a week of minute rollups, before the hour already
    // there: the clock has moved on since) in every queue, and a backlog of ready messages in one.
    for q in 0..QUEUES {
        c.batch_execute(&format!(
            "INSERT INTO pgqueue.history (msg_id, queue, outcome, priority, attempt, payload, enqueued_at, finished_at)
             SELECT -g, 'sized_{q}', 'completed', 0, 1, jsonb_build_object('n', g), now(), now()
               FROM generate_series({from}, {to}) g;
             INSERT INTO pgqueue.queue_minutes (queue, minute, sent, completed)
             SELECT 'sized_{q}', first.minute - m * interval '1 minute', 10, 10
               FROM (SELECT min(minute) AS minute FROM pgqueue.queue_minutes WHERE queue = 'sized_{q}') first,
                    generate_series(1, 7 * 1440 - 60) m;",
            from = q * 20_000 + 1,
            to = (q + 1) * 20_000
        ))
        .unwrap();
    }
    // (Each its own statement: a batch is one transaction, and VACUUM runs outside any.)
    for sql in [
        "SELECT pgqueue.pgq_send_batch('sized_0', array_fill('{}'::jsonb, ARRAY[10000]))",
        "SELECT pgqueue.pgq_send_batch('sized_0', array_fill('{}'::jsonb, ARRAY[10000]))",
        "VACUUM ANALYZE pgqueue.history_rows",
        "VACUUM ANALYZE pgqueue.message_rows",
        "VACUUM ANALYZE pgqueue.queue_minutes",
        "SELECT * FROM pgqueue.pgq_tick()",
    ] {
        c.batch_execute(sql).unwrap();
    }
    let large = measure(&mut c);

    let what = ["overview counts", "overview last hour", "queue page counts", "queue page last hour", "job by id"];
    for ((name, (before, _)), (after, plan)) in what.iter().zip(&small).zip(&large) {
        println!("{name}: {before} buffers, then {after} with a hundred times the history");
        if !name.starts_with("job") {
            // A btree may grow a level: a buffer more for each of a queue's few index probes,
            // never a share of the rows added.
            assert!(*after <= before + 6 * QUEUES + 10, "{name}: {before} -> {after} buffers\n{plan}");
            assert!(!plan.contains("history_"), "{name} reads history:\n{plan}");
        } else {
            // Through the BRIN index of the partition that holds it: at most the block ranges
            // (128 pages each) whose ids span it, whatever the partition's size.
            assert!(*after <= 2 * 128 + 20, "{name}: {before} -> {after} buffers\n{plan}");
            assert!(plan.contains("_ids\""), "the job by id is not found through an index:\n{plan}");
        }
    }
    // The counts the overview shows are the exact ones.
    let shown: Vec<(String, i64, i64, i64, i64)> = c
        .query("SELECT queue, ready, delayed, claimed, dead FROM pgqueue.queue_overview ORDER BY queue", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    let exact: Vec<(String, i64, i64, i64, i64)> = c
        .query("SELECT queue, ready, delayed, claimed, dead FROM pgqueue.queue_stats ORDER BY queue", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    assert_eq!(shown, exact);
}
