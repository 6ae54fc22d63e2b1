//! The Node (node-postgres) and Go (database/sql with lib/pq) examples in `examples/`, run as
//! a user would run them against a live server: the producer sends 500 messages, the worker
//! handles them (and nacks one that fails until it is dead-lettered), then stops on SIGTERM
//! while it waits in a claim, exiting 0. Every message is completed exactly once.
//!
//! The toolchains come from `scripts/setup.sh` (Node and npm, the Node example's
//! node_modules in the cache, Debian's Go and lib/pq); a missing one fails the test.

use crate::common;

use common::server::Server;
use common::{Client, count, wait_for};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);
const MESSAGES: i64 = 500;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn cache() -> PathBuf {
    PathBuf::from(std::env::var("PGQUEUE_CACHE").unwrap_or_else(|_| "/var/cache/pgqueue".into()))
}

/// Runs `command`, failing the test with its output unless it succeeds.
fn run_ok(what: &str, command: &mut Command) -> Output {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: cannot run {command:?}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Fails with a clear message when a toolchain setup.sh installs is missing.
fn require(program: &str, version_arg: &str) {
    let found = Command::new(program).arg(version_arg).output().is_ok_and(|o| o.status.success());
    assert!(found, "`{program}` not found or not working: run scripts/setup.sh (it installs it)");
}

fn waiting_claims(c: &mut Client, q: &str) -> i64 {
    c.query_opt("SELECT waiting_claims FROM pgqueue.queue_depth WHERE queue = $1", &[&q])
        .unwrap()
        .map_or(0, |r| r.get(0))
}

/// A language's producer and worker, as commands that take the queue (and count) as
/// arguments and DATABASE_URL from the environment.
struct Example {
    name: &'static str,
    /// Appended to the server's URL (lib/pq requires SSL unless told otherwise).
    url_options: &'static str,
    producer: Box<dyn Fn() -> Command>,
    worker: Box<dyn Fn() -> Command>,
}

/// The scenario both examples must pass.
fn producer_and_worker(example: &Example) {
    let server = Server::with_pgqueue(&["pgqueue.tick_interval = '200ms'", "pgqueue.launcher_naptime = '200ms'"]);
    let url = format!("{}{}", server.url("postgres"), example.url_options);
    let mut c = server.connect("postgres");
    let q = format!("{}_jobs", example.name);
    c.execute("SELECT pgqueue.pgq_create_queue($1, max_attempts => 2)", &[&q]).unwrap();

    let out = run_ok(
        &format!("{} producer", example.name),
        (example.producer)().arg(&q).arg(MESSAGES.to_string()).env("DATABASE_URL", &url),
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("sent {MESSAGES} messages")));
    assert_eq!(count(&mut c, "SELECT count(*) FROM pgqueue.messages WHERE queue = $1", &q), MESSAGES);
    // One the worker's handler fails: nacked with its error, dead after the queue's 2 attempts.
    let failing: i64 = c.query_one("SELECT pgqueue.pgq_send($1, '{\"fail\": true}')", &[&q]).unwrap().get(0);

    let mut worker: Child = (example.worker)()
        .arg(&q)
        .env("DATABASE_URL", &url)
        .env("WAIT_SECONDS", "50")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start the {} worker: {e}", example.name));
    let output = |worker: &mut Child| {
        let (mut out, mut err) = (String::new(), String::new());
        worker.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        worker.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        (out, err)
    };
    let alive = |worker: &mut Child| {
        if let Some(status) = worker.try_wait().unwrap() {
            let (out, err) = output(worker);
            panic!("the {} worker exited early ({status}):\n{out}\n{err}", example.name);
        }
    };
    let finished = |c: &mut Client, outcome: &str| {
        c.query_one("SELECT count(*) FROM pgqueue.history WHERE queue = $1 AND outcome = $2", &[&q, &outcome])
            .unwrap()
            .get::<_, i64>(0)
    };
    wait_for("every message completed and the failing one dead", LIMIT, || {
        alive(&mut worker);
        (finished(&mut c, "completed") == MESSAGES && finished(&mut c, "dead") == 1).then_some(())
    });
    // Idle now, in a waiting claim (of up to 50 s): SIGTERM must end it and the worker.
    wait_for("the worker's waiting claim", LIMIT, || {
        alive(&mut worker);
        (waiting_claims(&mut c, &q) == 1).then_some(())
    });
    // SAFETY: a plain syscall on our own child's pid.
    assert_eq!(unsafe { libc::kill(worker.id() as libc::pid_t, libc::SIGTERM) }, 0);
    let status = wait_for("the worker to exit after SIGTERM", Duration::from_secs(40), || worker.try_wait().unwrap());
    let (out, err) = output(&mut worker);
    assert!(status.success(), "the {} worker exited with {status} after SIGTERM:\n{out}\n{err}", example.name);
    assert!(out.contains("worker stopped"), "{out}\n{err}");
    assert_eq!(waiting_claims(&mut c, &q), 0, "its claim ended with it");

    // Exactly once: one history row per message, claimed once; handled once by the worker.
    let rows =
        c.query("SELECT msg_id, outcome, attempt, last_error FROM pgqueue.history WHERE queue = $1", &[&q]).unwrap();
    let mut history = BTreeMap::new();
    for r in &rows {
        let id: i64 = r.get(0);
        let row: (String, i32, Option<String>) = (r.get(1), r.get(2), r.get(3));
        assert!(history.insert(id, row).is_none(), "message {id} finished twice");
    }
    assert_eq!(history.len() as i64, MESSAGES + 1);
    assert_eq!(history[&failing], ("dead".into(), 2, Some("the payload asked to fail".into())));
    let mut handled: BTreeMap<i64, u32> = BTreeMap::new();
    for line in out.lines() {
        if let Some(id) = line.strip_prefix("handled ") {
            *handled.entry(id.parse().unwrap()).or_default() += 1;
        }
    }
    assert_eq!(handled.len() as i64, MESSAGES);
    for (id, (outcome, attempt, _)) in history.iter().filter(|(id, _)| **id != failing) {
        assert_eq!((outcome.as_str(), *attempt), ("completed", 1), "message {id}");
        assert_eq!(handled.get(id), Some(&1), "message {id} handled once");
    }
    assert_eq!(count(&mut c, "SELECT count(*) FROM pgqueue.messages WHERE queue = $1", &q), 0);
}

#[test]
fn node_producer_and_worker() {
    let _turn = common::file_turn(file!());
    require("node", "--version");
    let node_modules = cache().join("node-example/node_modules");
    assert!(
        node_modules.join("pg/package.json").exists(),
        "the Node example's dependencies are missing from {}: run scripts/setup.sh",
        node_modules.display()
    );
    let script = |name: &str| {
        let path = repo().join("examples/node").join(name);
        let node_modules = node_modules.clone();
        move || {
            let mut command = Command::new("node");
            // The clone has no node_modules; setup.sh installed the lock's packages there.
            command.arg(&path).env("NODE_PATH", &node_modules);
            command
        }
    };
    producer_and_worker(&Example {
        name: "node",
        url_options: "",
        producer: Box::new(script("producer.js")),
        worker: Box::new(script("worker.js")),
    });
}

#[test]
fn go_producer_and_worker() {
    let _turn = common::file_turn(file!());
    require("go", "version");
    let pq = Path::new("/usr/share/gocode/src/github.com/lib/pq");
    assert!(pq.join("go.mod").exists(), "lib/pq is missing from {}: run scripts/setup.sh", pq.display());

    // Built offline against Debian's lib/pq: the example's go.mod, copied and given a
    // `replace` (the committed one stays what a user with internet builds as is).
    let build = std::env::temp_dir().join(format!("pgqueue-go-example-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&build);
    std::fs::create_dir_all(&build).unwrap();
    let example = repo().join("examples/go");
    std::fs::copy(example.join("go.mod"), build.join("go.mod")).unwrap();
    std::fs::copy(example.join("go.sum"), build.join("go.sum")).unwrap();
    let go_cache = cache().join("go");
    let go = |args: &[&str]| {
        let mut command = Command::new("go");
        command
            .args(args)
            .current_dir(&example)
            .env("GOFLAGS", "-mod=mod")
            .env("GOPROXY", "off")
            .env("GOSUMDB", "off")
            .env("GOCACHE", go_cache.join("build"))
            .env("GOPATH", go_cache.join("path"));
        command
    };
    let modfile = format!("-modfile={}", build.join("go.mod").display());
    let replace = format!("-replace=github.com/lib/pq={}", pq.display());
    run_ok("go mod edit", &mut go(&["mod", "edit", &modfile, &replace]));
    let bin = build.join("bin");
    let out = format!("{}/", bin.display());
    run_ok("go build", &mut go(&["build", &modfile, "-o", &out, "./producer", "./worker"]));

    let program = |name: &str| {
        let path = bin.join(name);
        move || Command::new(&path)
    };
    producer_and_worker(&Example {
        name: "go",
        url_options: "?sslmode=disable",
        producer: Box::new(program("producer")),
        worker: Box::new(program("worker")),
    });
    let _ = std::fs::remove_dir_all(&build);
}
