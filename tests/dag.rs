//! Randomized dependency graphs (0.17.0): random DAGs sent with `pgq_send(…, after,
//! on_parent_failure)` and, for nodes that share their parents, `pgq_send_batch`, over three
//! queues, run by consumers that ack, nack, fail, get killed and get cancelled, across one
//! server restart, on a server of the test's own.
//!
//! The graphs: 1–50 nodes (four in ten of them at most 8), node i's parents 0–4 earlier nodes
//! (half of the draws among the last five, for long chains), a random queue and
//! on_parent_failure (or none: the default 'cancel'). A graph is sent either in one
//! transaction (its nodes are all pending or ready at its commit) or a send at a time with
//! short pauses (a parent may then have finished, well or not, before its child is sent).
//! Batches of 50 graphs: the next goes once at most 400 messages are left.
//!
//! Each node has a plan, drawn from the seed and carried in its payload: ack; nack once (retry
//! at once or in 0.3 s), then ack; fail (dead); get killed once (the consumer drops its
//! connection without finishing: the 1 s lease ends and is re-armed), then ack; nack on every
//! attempt or get killed on every attempt (dead after the queues' 3 attempts). Apart from
//! that, some nodes are cancelled (`pgq_cancel`, by a canceller thread) 0–1.5 s after their
//! graph was sent, whatever they are doing then, and some while they run (their consumer asks
//! for the cancel, waits for it, then acks: they finish as cancelled).
//!
//! Six consumers, two a queue, claim (waiting up to 200 ms) and write their log rows
//! (`dag_log(msg_id, attempt, started_at clock_timestamp())`) in one statement: a claim that
//! committed has its row, a row means the claim committed (the restart may cut a connection
//! anywhere).
//!
//! What is asserted, once no message of the run is left in pgqueue.messages (nothing stuck:
//! waited for, with a generous limit, and reported with the graph around what is left):
//! - Every node finished exactly once (pgqueue.history), with the parents it was sent with
//!   (`after`), and pgqueue.dependencies has no row of any node left.
//! - A node whose parent failed (dead or cancelled) and whose policy is 'cancel' or 'dead' never
//!   ran (no log row), and finished as cancelled or dead (its policy's) with 'parent N was …'
//!   naming a failed parent by its outcome — or as cancelled by the test, if the test
//!   cancelled it. (Not: no earlier than that parent. finished_at is now(), its transaction's
//!   start: a send that waited for its parent's failing finish to commit, and then found it
//!   failed, starts before that finish did.)
//! - A node that ran: every parent finished before it first started (history's finished_at ≤
//!   the log's first started_at), and every parent completed, unless its policy is 'run'.
//! - A node that never ran and has no failed parent (or 'run'): cancelled by the test.
//! - Its log's attempts are 1…n, each once, n being the attempt history has (0 if it never
//!   ran); a completed node finished after each of its starts; no node that ran ends with a
//!   'parent N was …' error.
//! - The server logged no crash; no statement failed but those the restart cut; no step of
//!   the worker's (or pgq_tick's) ticks failed; and, last, at most one call per 200 nodes was
//!   chosen as a deadlock's victim (a transaction sending a graph one node after another can
//!   close a cycle with a finish; a send so chosen is sent again, so that the run goes on).
//! - The tick released at most a quarter of the children that ran (it is the exception: two
//!   last parents that finished together, a hand-over lost; about 1 % of them).
//! - Each case happened at least once (children cancelled and dead-lettered by a failed
//!   parent, 'run' children run after a failed parent, children run after several parents,
//!   nodes cancelled by the test, nodes re-run after a kill).
//!
//! Two runs: 1,000 graphs with the background worker (which re-arms leases and looks again at
//! children whose last parents finished together), and 150 graphs on a server without the
//! library preloaded (no worker, no shared memory: no hand-over), where a thread calls
//! `pgq_tick()` every 200 ms. Each restarts its server once, halfway.
//!
//! The random choices come from a seed, printed; `PGQUEUE_DAG_SEED` replays them (thread
//! timing still varies). A failure keeps the server log in /tmp.

mod common;

use common::Rng;
use common::server::{Server, bindir, this_major};
use postgres::error::SqlState;
use postgres::types::ToSql;
use postgres::{Client, GenericClient};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use uuid::Uuid;

const QUEUES: [&str; 3] = ["dag_a", "dag_b", "dag_c"];
const CONSUMERS: usize = 6;
/// Messages a claim takes at most.
const CLAIM_QTY: i32 = 4;
/// The reason the test's cancels give (a cancelled node's last_error).
const REASON: &str = "dag: cancelled by the test";
/// The next batch of graphs is sent once at most this many messages are left.
const IN_FLIGHT_LOW: i64 = 400;
/// How long the last messages may take to finish (generous: a run takes seconds).
const DRAIN_LIMIT: Duration = Duration::from_secs(150);
const DB: &str = "postgres";

/// The two runs share the machine badly: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

// ---------------------------------------------------------------------------------------
// The graphs

/// What a node's consumer does, by attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    Ack,
    NackOnce,
    Fail,
    KillOnce,
    NackAlways,
    KillAlways,
}

enum Action {
    Ack,
    Nack,
    Fail,
    Kill,
}

impl Plan {
    const ALL: [Plan; 6] = [Plan::Ack, Plan::NackOnce, Plan::Fail, Plan::KillOnce, Plan::NackAlways, Plan::KillAlways];

    fn name(self) -> &'static str {
        match self {
            Plan::Ack => "ack",
            Plan::NackOnce => "nack_once",
            Plan::Fail => "fail",
            Plan::KillOnce => "kill_once",
            Plan::NackAlways => "nack_always",
            Plan::KillAlways => "kill_always",
        }
    }

    fn parse(name: &str) -> Plan {
        Plan::ALL.into_iter().find(|p| p.name() == name).unwrap_or_else(|| panic!("no plan {name:?}"))
    }

    fn draw(rng: &mut Rng) -> Plan {
        match rng.below(100) {
            0..72 => Plan::Ack,
            72..80 => Plan::NackOnce,
            80..86 => Plan::Fail,
            86..92 => Plan::KillOnce,
            92..97 => Plan::NackAlways,
            _ => Plan::KillAlways,
        }
    }

    fn action(self, attempt: i32) -> Action {
        match self {
            Plan::Ack => Action::Ack,
            Plan::NackOnce if attempt == 1 => Action::Nack,
            Plan::NackOnce => Action::Ack,
            Plan::Fail => Action::Fail,
            Plan::KillOnce if attempt == 1 => Action::Kill,
            Plan::KillOnce => Action::Ack,
            Plan::NackAlways => Action::Nack,
            Plan::KillAlways => Action::Kill,
        }
    }
}

struct Node {
    queue: usize,
    /// Indices of earlier nodes of its graph.
    parents: Vec<usize>,
    /// None: on_parent_failure not given (the default, 'cancel').
    policy: Option<&'static str>,
    plan: Plan,
    /// A nack's retry_in.
    retry: &'static str,
    /// Cancelled while it runs (its consumer asks for it).
    cancel_running: bool,
    /// Cancelled 0–1.5 s after its graph was sent, whatever it is doing then.
    cancel_later: bool,
}

struct Graph {
    nodes: Vec<Node>,
    /// The sends, in order: one node (pgq_send), or several with the same parents, queue and
    /// policy (pgq_send_batch).
    sends: Vec<Vec<usize>>,
    /// All its sends in one transaction (else each commits on its own, with pauses between).
    one_transaction: bool,
    /// Roots sent with after => '{}' (else NULL).
    roots_empty: bool,
}

fn graph(rng: &mut Rng) -> Graph {
    let size = if rng.chance(40) { rng.range(1, 8) } else { rng.range(1, 50) } as usize;
    let mut nodes: Vec<Node> = Vec::with_capacity(size);
    let mut sends = vec![];
    while nodes.len() < size {
        let n = nodes.len();
        let k = if n > 0 && rng.chance(20) { rng.range(2, 4) as usize } else { 1 }.min(size - n);
        let want = if n == 0 || rng.chance(15) { 0 } else { rng.range(1, 4) as usize }.min(n);
        let mut parents = vec![];
        while parents.len() < want {
            let p =
                if rng.chance(50) { n - 1 - rng.below(n.min(5) as u64) as usize } else { rng.below(n as u64) as usize };
            if !parents.contains(&p) {
                parents.push(p);
            }
        }
        let policy = match rng.below(4) {
            0 => None,
            1 => Some("cancel"),
            2 => Some("dead"),
            _ => Some("run"),
        };
        let queue = rng.below(QUEUES.len() as u64) as usize;
        sends.push((n..n + k).collect());
        for _ in 0..k {
            nodes.push(Node {
                queue,
                parents: parents.clone(),
                policy,
                plan: Plan::draw(rng),
                retry: if rng.chance(50) { "0 s" } else { "300 ms" },
                cancel_running: rng.chance(3),
                cancel_later: rng.chance(3),
            });
        }
    }
    Graph { nodes, sends, one_transaction: rng.chance(50), roots_empty: rng.chance(50) }
}

/// A node as sent.
struct Sent {
    id: i64,
    graph: usize,
    parents: Vec<i64>,
    /// The effective on_parent_failure.
    policy: &'static str,
    plan: Plan,
}

/// Sends `g`'s nodes in order; their ids. `pause` runs after each send. A send chosen as a
/// deadlock's victim is noted (it fails the test in the end) and sent again.
fn send_graph(
    sh: &Shared,
    c: &mut impl GenericClient,
    pid: i32,
    gi: usize,
    g: &Graph,
    pause: &mut dyn FnMut(),
) -> Vec<i64> {
    let mut ids = vec![0i64; g.nodes.len()];
    for send in &g.sends {
        let first = &g.nodes[send[0]];
        let after: Option<Vec<i64>> = if first.parents.is_empty() {
            g.roots_empty.then(Vec::new)
        } else {
            Some(first.parents.iter().map(|&p| ids[p]).collect())
        };
        let payloads: Vec<Value> = send
            .iter()
            .map(|&n| {
                let node = &g.nodes[n];
                json!({"g": gi, "n": n, "plan": node.plan.name(), "retry": node.retry,
                       "cancel_running": node.cancel_running})
            })
            .collect();
        let policy_arg = if first.policy.is_some() { ", on_parent_failure => $4" } else { "" };
        let queue = QUEUES[first.queue];
        sh.doing(pid, format!("the send of graph {gi}'s nodes {send:?} after {after:?}"));
        let got: Vec<i64> = if send.len() == 1 {
            let mut params: Vec<&(dyn ToSql + Sync)> = vec![&queue, &payloads[0], &after];
            if let Some(policy) = &first.policy {
                params.push(policy);
            }
            let sql = format!("SELECT pgqueue.pgq_send($1, $2, after => $3{policy_arg})");
            vec![retry_deadlock(sh, &sql, gi, || c.query_one(&sql, &params)).get(0)]
        } else {
            let mut params: Vec<&(dyn ToSql + Sync)> = vec![&queue, &payloads, &after];
            if let Some(policy) = &first.policy {
                params.push(policy);
            }
            let sql = format!(
                "SELECT id FROM pgqueue.pgq_send_batch($1, $2, after => $3{policy_arg}) WITH ORDINALITY AS b(id, n)
                  ORDER BY n"
            );
            retry_deadlock(sh, &sql, gi, || c.query(&sql, &params)).iter().map(|r| r.get(0)).collect()
        };
        assert_eq!(got.len(), send.len(), "one id per payload");
        for (&n, id) in send.iter().zip(got) {
            ids[n] = id;
        }
        pause();
    }
    ids
}

/// Runs `send` until it is not a deadlock's victim (each noted); panics on any other error.
fn retry_deadlock<T>(sh: &Shared, sql: &str, gi: usize, mut send: impl FnMut() -> Result<T, postgres::Error>) -> T {
    for _ in 0..10 {
        match send() {
            Ok(t) => return t,
            Err(e) if e.code() == Some(&SqlState::T_R_DEADLOCK_DETECTED) => {
                sh.deadlock(format!("a send of graph {gi}: {}", sh.describe(&e)));
            }
            Err(e) => panic!("{sql} for graph {gi}: {e}"),
        }
    }
    panic!("{sql} for graph {gi}: ten deadlocks in a row")
}

// ---------------------------------------------------------------------------------------
// Threads and connections

struct Shared {
    port: u16,
    stop: AtomicBool,
    /// A restart is under way; `epoch` counts restarts begun.
    restarting: AtomicBool,
    epoch: AtomicU64,
    /// Statements that failed other than by the restart or a deadlock.
    unexpected: Mutex<Vec<String>>,
    /// Statements chosen as a deadlock's victim (40P01).
    deadlocks: Mutex<Vec<String>>,
    /// Who each backend of the test's connections is, and what it last started doing.
    pids: Mutex<HashMap<i32, (String, String)>>,
    /// Ids the canceller was asked to cancel (noted before the call).
    cancelled: Mutex<HashSet<i64>>,
    acks: AtomicU64,
    nacks: AtomicU64,
    fails: AtomicU64,
    kills: AtomicU64,
    running_cancels: AtomicU64,
}

impl Shared {
    fn unexpected(&self, what: String) {
        eprintln!("dag: unexpected: {what}");
        self.unexpected.lock().unwrap().push(what);
    }

    /// Notes what backend `pid` starts doing (for a deadlock's report).
    fn doing(&self, pid: i32, what: String) {
        if let Some(entry) = self.pids.lock().unwrap().get_mut(&pid) {
            entry.1 = what;
        }
    }

    fn deadlock(&self, what: String) {
        eprintln!("dag: deadlock: {what}");
        self.deadlocks.lock().unwrap().push(what);
    }

    /// An error, with who the processes a deadlock names were.
    fn describe(&self, e: &postgres::Error) -> String {
        let Some(db) = e.as_db_error() else { return e.to_string() };
        let detail = db.detail().unwrap_or("");
        let mut out = format!("{} ({}): {detail}", db.message(), db.code().code());
        if db.code() == &SqlState::T_R_DEADLOCK_DETECTED {
            let mut pids: Vec<i32> = detail
                .split("rocess ")
                .skip(1)
                .filter_map(|w| w.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
                .collect();
            pids.sort_unstable();
            pids.dedup();
            for pid in pids {
                let known = self.pids.lock().unwrap().get(&pid).map(|(who, doing)| format!("{who}, {doing}"));
                let who = known.unwrap_or_else(|| self.activity(pid));
                out.push_str(&format!("\n  process {pid}: {who}"));
            }
        }
        out
    }

    /// What pg_stat_activity says of `pid` (a process not the test's: the worker).
    fn activity(&self, pid: i32) -> String {
        let Ok(mut c) = postgres::Config::new()
            .host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname(DB)
            .connect(postgres::NoTls)
        else {
            return "unknown".into();
        };
        c.query_opt("SELECT backend_type, query FROM pg_stat_activity WHERE pid = $1", &[&pid])
            .ok()
            .flatten()
            .map_or("gone".into(), |r| format!("{}, {:?}", r.get::<_, String>(0), r.get::<_, Option<String>>(1)))
    }
}

/// A connection that knows whether the restart may have ended it.
struct Conn {
    client: Client,
    /// Its backend's (0: unknown).
    pid: i32,
    epoch: u64,
    during_restart: bool,
}

impl Conn {
    /// Connects, retrying for 90 s (the restart); `who` is noted by its backend's pid.
    fn open(sh: &Shared, who: &str) -> Conn {
        let start = Instant::now();
        loop {
            let (epoch, during_restart) = (sh.epoch.load(SeqCst), sh.restarting.load(SeqCst));
            match postgres::Config::new()
                .host("127.0.0.1")
                .port(sh.port)
                .user("postgres")
                .dbname(DB)
                .connect(postgres::NoTls)
            {
                Ok(mut client) => {
                    let mut pid = 0;
                    if let Ok(row) = client.query_one("SELECT pg_backend_pid()", &[]) {
                        pid = row.get(0);
                        sh.pids.lock().unwrap().insert(pid, (who.to_string(), String::new()));
                    }
                    return Conn { client, epoch, during_restart, pid };
                }
                Err(e) => {
                    assert!(!sh.stop.load(SeqCst), "the run stopped");
                    assert!(start.elapsed() < Duration::from_secs(90), "no connection for 90 s: {e}");
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Whether `e` is the restart's doing: the connection broke, and a restart began since
    /// it was opened (or is under way). Anything else is noted: a deadlock, or unexpected.
    fn lost(&self, sh: &Shared, e: &postgres::Error, what: &str) {
        let code = e.code().map(|c| c.code().to_string()).unwrap_or_default();
        let broken = e.is_closed()
            || e.as_db_error().is_none()
            || ["57P01", "57P02", "57P03"].contains(&code.as_str())
            || code.starts_with("08");
        let restarted = self.during_restart || sh.restarting.load(SeqCst) || sh.epoch.load(SeqCst) != self.epoch;
        if !(broken && restarted) {
            let what = format!("{what}: {}", sh.describe(e));
            if e.code() == Some(&SqlState::T_R_DEADLOCK_DETECTED) { sh.deadlock(what) } else { sh.unexpected(what) }
        }
    }
}

/// A cancel for the canceller: at `at`, with a reply once done (for a running node).
struct CancelRequest {
    id: i64,
    at: Instant,
    reply: Option<Sender<()>>,
}

fn canceller(sh: Arc<Shared>, requests: Receiver<CancelRequest>) {
    let mut due: Vec<CancelRequest> = vec![];
    let mut conn: Option<Conn> = None;
    while !sh.stop.load(SeqCst) {
        let now = Instant::now();
        let wait = due.iter().map(|r| r.at.saturating_duration_since(now)).min().unwrap_or(Duration::MAX);
        match requests.recv_timeout(wait.min(Duration::from_millis(50))) {
            Ok(r) => due.push(r),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        let (ready, later): (Vec<_>, Vec<_>) = due.drain(..).partition(|r| r.at <= now);
        due = later;
        for r in ready {
            sh.cancelled.lock().unwrap().insert(r.id);
            // Once more after a connection the restart ended.
            for _ in 0..2 {
                let c = conn.get_or_insert_with(|| Conn::open(&sh, "the canceller"));
                sh.doing(c.pid, format!("pgq_cancel({})", r.id));
                match c.client.query_one("SELECT pgqueue.pgq_cancel($1::bigint, reason => $2)", &[&r.id, &REASON]) {
                    Ok(_) => break,
                    Err(e) => {
                        c.lost(&sh, &e, &format!("pgq_cancel({})", r.id));
                        conn = None;
                    }
                }
            }
            if let Some(reply) = r.reply {
                let _ = reply.send(());
            }
        }
    }
}

/// Claims from `q` (waiting up to 200 ms) and writes the log rows, in one statement; handles
/// each message by its plan. True: a node's plan was to get killed (the connection then goes,
/// its claims held).
fn round(
    sh: &Shared,
    c: &mut Client,
    pid: i32,
    q: &str,
    cancels: &Sender<CancelRequest>,
) -> Result<bool, (postgres::Error, String)> {
    sh.doing(pid, format!("the claim from {q}"));
    let rows = c
        .query(
            "WITH claimed AS (
                 SELECT msg_id, claim_token, attempt, payload
                   FROM pgqueue.pgq_claim($1, $2, lease => '1 s', wait => '200 ms')
             ), logged AS (
                 INSERT INTO dag_log (msg_id, attempt) SELECT msg_id, attempt FROM claimed
             )
             SELECT msg_id, claim_token, attempt, payload FROM claimed",
            &[&q, &CLAIM_QTY],
        )
        .map_err(|e| (e, format!("the claim from {q}")))?;
    let mut killed = false;
    for r in &rows {
        let (id, token, attempt, payload): (i64, Uuid, i32, Value) = (r.get(0), r.get(1), r.get(2), r.get(3));
        let plan = Plan::parse(payload["plan"].as_str().unwrap_or_default());
        let cancelling = payload["cancel_running"] == json!(true) && attempt == 1;
        let call = |what: &str| {
            let call = format!("the {what} of {id} (attempt {attempt}{})", if cancelling { ", cancelled" } else { "" });
            sh.doing(pid, call.clone());
            move |e| (e, call)
        };
        if cancelling {
            let (reply, done) = mpsc::channel();
            cancels.send(CancelRequest { id, at: Instant::now(), reply: Some(reply) }).unwrap();
            let _ = done.recv_timeout(Duration::from_secs(10));
            sh.running_cancels.fetch_add(1, SeqCst);
        }
        match plan.action(attempt) {
            Action::Ack => {
                let failed = call("ack");
                c.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&id, &token]).map_err(failed)?;
                sh.acks.fetch_add(1, SeqCst);
            }
            Action::Nack => {
                let retry = payload["retry"].as_str().unwrap_or("0 s");
                let failed = call("nack");
                c.query_one(
                    "SELECT pgqueue.pgq_nack($1::bigint, $2::uuid, retry_in => $3::text::interval, error => 'dag: nack')",
                    &[&id, &token, &retry],
                )
                .map_err(failed)?;
                sh.nacks.fetch_add(1, SeqCst);
            }
            Action::Fail => {
                let failed = call("fail");
                c.query_one("SELECT pgqueue.pgq_fail($1::bigint, $2::uuid, 'dag: fail')", &[&id, &token])
                    .map_err(failed)?;
                sh.fails.fetch_add(1, SeqCst);
            }
            Action::Kill => {
                killed = true;
                sh.kills.fetch_add(1, SeqCst);
            }
        }
    }
    Ok(killed)
}

/// Consumer `k` takes the messages of queue k mod 3.
fn consumer(sh: Arc<Shared>, k: usize, cancels: Sender<CancelRequest>) {
    let mut conn: Option<Conn> = None;
    let q = QUEUES[k % QUEUES.len()];
    while !sh.stop.load(SeqCst) {
        let c = conn.get_or_insert_with(|| Conn::open(&sh, &format!("consumer {k}")));
        match round(&sh, &mut c.client, c.pid, q, &cancels) {
            Ok(false) => {}
            Ok(true) => conn = None,
            Err((e, what)) => {
                c.lost(&sh, &e, &format!("consumer {k}: {what}"));
                conn = None;
            }
        }
    }
}

/// Without a worker: `pgq_tick()` every 200 ms, from one session (its window's cursor).
fn ticker(sh: Arc<Shared>) {
    let mut conn: Option<Conn> = None;
    while !sh.stop.load(SeqCst) {
        let c = conn.get_or_insert_with(|| Conn::open(&sh, "the ticker"));
        match c.client.query("SELECT step, error FROM pgqueue.pgq_tick()", &[]) {
            Ok(rows) => {
                for r in rows {
                    let (step, error): (String, String) = (r.get(0), r.get(1));
                    let what = format!("pgq_tick: step {step} failed: {error}");
                    if error.contains("deadlock detected") { sh.deadlock(what) } else { sh.unexpected(what) }
                }
            }
            Err(e) => {
                c.lost(&sh, &e, "pgq_tick");
                conn = None;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Stops the threads when the test ends, however it ends.
struct StopGuard(Arc<Shared>);

impl Drop for StopGuard {
    fn drop(&mut self) {
        self.0.stop.store(true, SeqCst);
        // Threads still running (the test failed) take the server's end for a restart.
        self.0.restarting.store(true, SeqCst);
    }
}

/// Keeps the server log when the test fails (the server's directory goes with it).
struct KeepLog<'a> {
    server: &'a Server,
    name: &'static str,
    seed: u64,
}

impl Drop for KeepLog<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let path = format!("/tmp/{}-pg{}-seed{}-server.log", self.name, this_major(), self.seed);
            let log = self.server.log();
            let _ = std::fs::write(&path, &log);
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(30)..].join("\n");
            eprintln!("{}: seed {}; server log kept in {path}; its end:\n{tail}", self.name, self.seed);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The run

struct Run {
    name: &'static str,
    graphs: usize,
    batch: usize,
    /// The library preloaded (the worker runs); else a thread calls pgq_tick().
    preload: bool,
}

fn count(c: &mut Client, sql: &str) -> i64 {
    c.query_one(sql, &[&QUEUES.to_vec()]).unwrap().get(0)
}

const LEFT: &str = "SELECT count(*) FROM pgqueue.messages WHERE queue = ANY ($1)";

fn run(cfg: Run) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let _installed = common::connect();
    let seed = common::rng::seed_from("PGQUEUE_DAG_SEED", cfg.name);
    let started = Instant::now();
    let mut conf = vec!["max_connections = 50"];
    if cfg.preload {
        conf.extend([
            "shared_preload_libraries = 'pgqueue'",
            "pgqueue.tick_interval = '200ms'",
            "pgqueue.launcher_naptime = '200ms'",
        ]);
    }
    // Links a finished child could not remove are collected at the prune cadence.
    conf.push("pgqueue.prune_interval = '1s'");
    let server = Server::init(&bindir(this_major()), &conf);
    server.start();
    let _keep_log = KeepLog { server: &server, name: cfg.name, seed };
    let mut c = server.connect(DB);
    c.batch_execute(
        "CREATE EXTENSION pgqueue;
         CREATE TABLE dag_log (msg_id bigint NOT NULL, attempt int NOT NULL,
                               started_at timestamptz NOT NULL DEFAULT clock_timestamp())",
    )
    .unwrap();
    for q in QUEUES {
        c.execute("SELECT pgqueue.pgq_create_queue($1, lease => '1 s', max_attempts => 3)", &[&q]).unwrap();
    }
    if cfg.preload {
        common::wait_for("the worker to tick", Duration::from_secs(30), || {
            let ticks: i64 = c.query_one("SELECT ticks FROM pgqueue.worker_state", &[]).unwrap().get(0);
            (ticks > 0).then_some(())
        });
    }

    let mut gen_rng = Rng::new(seed, 1);
    let graphs: Vec<Graph> = (0..cfg.graphs).map(|_| graph(&mut gen_rng)).collect();
    let mut rng = Rng::new(seed, 2);

    let sh = Arc::new(Shared {
        port: server.port,
        stop: AtomicBool::new(false),
        restarting: AtomicBool::new(false),
        epoch: AtomicU64::new(0),
        unexpected: Mutex::new(vec![]),
        deadlocks: Mutex::new(vec![]),
        pids: Mutex::new(HashMap::new()),
        cancelled: Mutex::new(HashSet::new()),
        acks: AtomicU64::new(0),
        nacks: AtomicU64::new(0),
        fails: AtomicU64::new(0),
        kills: AtomicU64::new(0),
        running_cancels: AtomicU64::new(0),
    });
    let _stop = StopGuard(sh.clone());
    let sender = Conn::open(&sh, "the sender");
    let (mut c, mut sender_pid) = (sender.client, sender.pid);
    let (cancels, requests) = mpsc::channel();
    let mut threads: Vec<(String, JoinHandle<()>)> = (0..CONSUMERS)
        .map(|k| {
            let (sh, cancels) = (sh.clone(), cancels.clone());
            (format!("consumer {k}"), std::thread::spawn(move || consumer(sh, k, cancels)))
        })
        .collect();
    threads.push(("the canceller".into(), {
        let sh = sh.clone();
        std::thread::spawn(move || canceller(sh, requests))
    }));
    if !cfg.preload {
        threads.push(("the ticker".into(), {
            let sh = sh.clone();
            std::thread::spawn(move || ticker(sh))
        }));
    }

    let mut sent: Vec<Sent> = vec![];
    let batches = cfg.graphs.div_ceil(cfg.batch);
    let mut restarted_with = 0;
    let mut claimed_at_restart = 0;
    let mut waited = Duration::ZERO;
    for b in 0..batches {
        for (gi, g) in graphs.iter().enumerate().skip(b * cfg.batch).take(cfg.batch) {
            let ids = if g.one_transaction {
                let mut tx = c.transaction().unwrap();
                let ids = send_graph(&sh, &mut tx, sender_pid, gi, g, &mut || {});
                tx.commit().unwrap();
                ids
            } else {
                let mut pause = || {
                    if rng.chance(10) {
                        std::thread::sleep(Duration::from_millis(rng.range(1, 5)));
                    }
                };
                send_graph(&sh, &mut c, sender_pid, gi, g, &mut pause)
            };
            for (node, &id) in g.nodes.iter().zip(&ids) {
                sent.push(Sent {
                    id,
                    graph: gi,
                    parents: node.parents.iter().map(|&p| ids[p]).collect(),
                    policy: node.policy.unwrap_or("cancel"),
                    plan: node.plan,
                });
                if node.cancel_later {
                    let at = Instant::now() + Duration::from_millis(rng.range(0, 1500));
                    cancels.send(CancelRequest { id, at, reply: None }).unwrap();
                }
            }
        }
        if b == batches / 2 {
            std::thread::sleep(Duration::from_millis(rng.range(0, 200)));
            restarted_with = count(&mut c, LEFT);
            claimed_at_restart = count(&mut c, &format!("{LEFT} AND state = 'claimed'"));
            sh.restarting.store(true, SeqCst);
            sh.epoch.fetch_add(1, SeqCst);
            let t = Instant::now();
            server.restart();
            sh.restarting.store(false, SeqCst);
            eprintln!(
                "{}: restarted with {restarted_with} messages left, {claimed_at_restart} claimed ({:.1} s)",
                cfg.name,
                t.elapsed().as_secs_f64()
            );
            let sender = Conn::open(&sh, "the sender");
            (c, sender_pid) = (sender.client, sender.pid);
        }
        if b + 1 < batches {
            let t = Instant::now();
            common::wait_for("the run to drain to the low mark", DRAIN_LIMIT, || {
                (count(&mut c, LEFT) <= IN_FLIGHT_LOW).then_some(())
            });
            waited += t.elapsed();
        }
    }
    let sent_in = started.elapsed();

    // Nothing stuck.
    let drain = Instant::now();
    while count(&mut c, LEFT) > 0 {
        if drain.elapsed() > DRAIN_LIMIT {
            panic!("{}: seed {seed}: messages stuck after {DRAIN_LIMIT:?}:\n{}", cfg.name, stuck(&mut c, &sent));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let drained_in = drain.elapsed();
    sh.stop.store(true, SeqCst);
    drop(cancels);
    let failed: Vec<String> = threads.into_iter().filter_map(|(name, h)| h.join().is_err().then_some(name)).collect();
    assert!(failed.is_empty(), "{}: seed {seed}: threads failed: {failed:?}", cfg.name);

    let cancelled = sh.cancelled.lock().unwrap().clone();
    let (problems, seen) = verify(&mut c, &sent, &cancelled);
    let unexpected = sh.unexpected.lock().unwrap().clone();
    let deadlocks = sh.deadlocks.lock().unwrap().clone();
    let crashes: Vec<String> = server
        .log()
        .lines()
        .filter(|l| l.contains("terminated by signal") || l.contains("PANIC:"))
        .map(String::from)
        .collect();
    let (released, tick_failures, last_error): (i64, i64, Option<String>) = c
        .query_one("SELECT released, tick_failures, last_error FROM pgqueue.worker_state", &[])
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .unwrap();
    eprintln!(
        "{}: seed {seed}: {} graphs, {} nodes ({} sent in batches) in {:.1} s (sent in {:.1} s of which {:.1} s waiting for the \
         low mark, drained in {:.1} s); \
         restarted with {restarted_with} left ({claimed_at_restart} claimed); consumers: {} acks, {} nacks, {} fails, {} kills, {} cancels while \
         running; canceller asked for {}; the tick released {released}; tick failures {tick_failures}; {} deadlocks; {seen:?}",
        cfg.name,
        cfg.graphs,
        sent.len(),
        graphs.iter().flat_map(|g| &g.sends).filter(|s| s.len() > 1).map(Vec::len).sum::<usize>(),
        started.elapsed().as_secs_f64(),
        sent_in.as_secs_f64(),
        waited.as_secs_f64(),
        drained_in.as_secs_f64(),
        sh.acks.load(SeqCst),
        sh.nacks.load(SeqCst),
        sh.fails.load(SeqCst),
        sh.kills.load(SeqCst),
        sh.running_cancels.load(SeqCst),
        cancelled.len(),
        deadlocks.len(),
    );
    assert!(
        problems.is_empty(),
        "{}: seed {seed}: {} problems, the first:\n{}",
        cfg.name,
        problems.len(),
        problems.iter().take(30).cloned().collect::<Vec<_>>().join("\n")
    );
    assert!(crashes.is_empty(), "{}: seed {seed}: the server log has: {crashes:#?}", cfg.name);
    // The finish of a child's last parent releases it; the tick only when two last parents
    // finished together (about 1 % of them here), or when a hand-over was lost.
    assert!(
        released * 4 <= seen.ran_with_parents as i64,
        "{}: seed {seed}: the tick released {released} of the {} children that ran: their parents' finishes did not",
        cfg.name,
        seen.ran_with_parents
    );
    for (what, n) in [
        ("children cancelled by a failed parent", seen.cancelled_by_parent),
        ("children dead-lettered by a failed parent", seen.dead_by_parent),
        ("'run' children run after a failed parent", seen.run_after_failure),
        ("children run after several parents completed", seen.ran_after_several),
        ("nodes cancelled by the test", seen.cancelled_by_test),
        ("nodes run again after their consumer was killed", seen.rerun_after_kill),
    ] {
        assert!(n > 0, "{}: seed {seed}: no {what}: the run tested less than it should", cfg.name);
    }
    assert!(restarted_with > 0, "{}: seed {seed}: the restart found nothing under way", cfg.name);
    assert!(
        unexpected.is_empty(),
        "{}: seed {seed}: {} statements failed, the first: {:#?}",
        cfg.name,
        unexpected.len(),
        &unexpected[..unexpected.len().min(10)]
    );
    assert_eq!(tick_failures, 0, "{}: seed {seed}: steps of the tick failed, the last: {last_error:?}", cfg.name);
    // A transaction that sends a graph's nodes one statement after another holds the parents
    // of the earlier ones while it locks those of the later ones, in no global order, so a
    // finish can close a cycle with it (docs/dependencies.md: retry; nothing changed). Rare:
    // at most one victim per 200 nodes (runs see 0 to 2 in 2,000 to 17,000 nodes).
    assert!(
        deadlocks.len() * 200 <= sent.len().max(200),
        "{}: seed {seed}: {} statements chosen as a deadlock's victim, the first: {:#?}",
        cfg.name,
        deadlocks.len(),
        &deadlocks[..deadlocks.len().min(10)]
    );
}

/// What is left, and the graph around it.
fn stuck(c: &mut Client, sent: &[Sent]) -> String {
    let by_id: HashMap<i64, &Sent> = sent.iter().map(|s| (s.id, s)).collect();
    let rows = c
        .query(
            "SELECT msg_id, queue, state, attempt, coalesce(lease_expires_at::text, ''), coalesce(last_error, '')
               FROM pgqueue.messages WHERE queue = ANY ($1) ORDER BY msg_id LIMIT 20",
            &[&QUEUES.to_vec()],
        )
        .unwrap();
    let mut out = format!("{} left; the first:\n", count(c, LEFT));
    for r in rows {
        let id: i64 = r.get(0);
        let links: Vec<String> = c
            .query(
                "SELECT d.parent, coalesce(d.parent_outcome, '-'), d.on_parent_failure,
                        coalesce((SELECT m.state FROM pgqueue.messages m WHERE m.msg_id = d.parent),
                                 (SELECT h.outcome FROM pgqueue.history h WHERE h.msg_id = d.parent), 'nowhere')
                   FROM pgqueue.dependencies d WHERE d.child = $1 ORDER BY d.parent",
                &[&id],
            )
            .unwrap()
            .iter()
            .map(|l| {
                format!(
                    "{} (link {}, policy {}, now {})",
                    l.get::<_, i64>(0),
                    l.get::<_, String>(1),
                    l.get::<_, String>(2),
                    l.get::<_, String>(3)
                )
            })
            .collect();
        let node = by_id.get(&id);
        out.push_str(&format!(
            "  {id} in {} {} attempt {} lease {} error {:?}; graph {:?}, parents sent {:?}, plan {:?}; links: {links:?}\n",
            r.get::<_, String>(1),
            r.get::<_, String>(2),
            r.get::<_, i32>(3),
            r.get::<_, String>(4),
            r.get::<_, String>(5),
            node.map(|n| n.graph),
            node.map(|n| &n.parents),
            node.map(|n| n.plan),
        ));
    }
    out
}

// ---------------------------------------------------------------------------------------
// The checks

struct Finished {
    outcome: String,
    attempt: i32,
    last_error: Option<String>,
    /// finished_at, in µs since the epoch.
    at: i64,
    after: Option<Vec<i64>>,
}

/// How often each case happened.
#[derive(Debug, Default)]
struct Seen {
    ran: usize,
    ran_with_parents: usize,
    completed: usize,
    dead: usize,
    cancelled: usize,
    cancelled_by_parent: usize,
    dead_by_parent: usize,
    run_after_failure: usize,
    ran_after_several: usize,
    cancelled_by_test: usize,
    rerun_after_kill: usize,
    edges_checked: usize,
}

fn verify(c: &mut Client, sent: &[Sent], cancelled: &HashSet<i64>) -> (Vec<String>, Seen) {
    let mut problems = vec![];
    let mut seen = Seen::default();
    let mut history: HashMap<i64, Finished> = HashMap::new();
    for r in c
        .query(
            "SELECT msg_id, outcome, attempt, last_error, (extract(epoch FROM finished_at) * 1000000)::bigint, after
               FROM pgqueue.history WHERE queue = ANY ($1)",
            &[&QUEUES.to_vec()],
        )
        .unwrap()
    {
        let f = Finished { outcome: r.get(1), attempt: r.get(2), last_error: r.get(3), at: r.get(4), after: r.get(5) };
        if history.insert(r.get(0), f).is_some() {
            problems.push(format!("{} finished twice", r.get::<_, i64>(0)));
        }
    }
    // (attempt, started_at µs) by msg_id, in attempt order.
    let mut log: HashMap<i64, Vec<(i32, i64)>> = HashMap::new();
    for r in
        c.query("SELECT msg_id, attempt, (extract(epoch FROM started_at) * 1000000)::bigint FROM dag_log", &[]).unwrap()
    {
        log.entry(r.get(0)).or_default().push((r.get(1), r.get(2)));
    }
    for runs in log.values_mut() {
        runs.sort_unstable();
    }
    let ids: Vec<i64> = sent.iter().map(|s| s.id).collect();
    let known: HashSet<i64> = ids.iter().copied().collect();
    if history.len() != sent.len() || history.keys().any(|id| !known.contains(id)) {
        problems.push(format!("{} nodes sent, {} history rows of the run's queues", sent.len(), history.len()));
    }
    if let Some(stray) = log.keys().find(|id| !known.contains(id)) {
        problems.push(format!("a log row of {stray}, which the test never sent"));
    }
    // Links a finished child could not remove (another transaction held them) go at the
    // prune cadence: wait for it (a second here), a while.
    let links_left = |c: &mut Client| -> i64 {
        c.query_one("SELECT count(*) FROM pgqueue.dependencies WHERE parent = ANY ($1) OR child = ANY ($1)", &[&ids])
            .unwrap()
            .get(0)
    };
    let waited = Instant::now();
    let mut links = links_left(c);
    while links != 0 && waited.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(250));
        // Without a worker, nothing else ticks now.
        c.query("SELECT * FROM pgqueue.pgq_tick()", &[]).unwrap();
        links = links_left(c);
    }
    if links != 0 {
        problems.push(format!("{links} rows of the run's nodes left in pgqueue.dependencies"));
    }
    for s in sent {
        let id = s.id;
        let Some(me) = history.get(&id) else {
            problems.push(format!("{id} (graph {}) never finished", s.graph));
            continue;
        };
        let runs = log.get(&id).map(Vec::as_slice).unwrap_or(&[]);
        let first_start = runs.iter().map(|r| r.1).min();
        let by_test = me.outcome == "cancelled" && me.last_error.as_deref() == Some(REASON);
        if by_test && !cancelled.contains(&id) {
            problems.push(format!("{id} cancelled with the test's reason, but the test never cancelled it"));
        }
        // Sent with its parents.
        let after = me.after.clone().filter(|a| !a.is_empty());
        let expected = (!s.parents.is_empty()).then(|| s.parents.clone());
        if after != expected {
            problems.push(format!("{id}: history's after {after:?}, sent with {expected:?}"));
        }
        // Its log: attempts 1…n, n the attempt it finished with.
        let attempts: Vec<i32> = runs.iter().map(|r| r.0).collect();
        if attempts != (1..=me.attempt).collect::<Vec<_>>() {
            problems
                .push(format!("{id}: finished {} at attempt {}, log attempts {attempts:?}", me.outcome, me.attempt));
        }
        if s.plan == Plan::KillOnce && me.outcome == "completed" && attempts.len() >= 2 {
            seen.rerun_after_kill += 1;
        }
        if let Some(&(a, t)) = runs.iter().find(|r| r.1 > me.at).filter(|_| me.outcome == "completed") {
            problems.push(format!("{id}: completed at {} before its attempt {a} started at {t}", me.at));
        }
        if !runs.is_empty() && me.last_error.as_deref().is_some_and(|e| e.starts_with("parent ")) {
            problems.push(format!("{id} ran, and then finished as {} with {:?}", me.outcome, me.last_error));
        }
        match me.outcome.as_str() {
            "completed" => seen.completed += 1,
            "dead" => seen.dead += 1,
            "cancelled" => seen.cancelled += 1,
            other => problems.push(format!("{id}: outcome {other}")),
        }
        if by_test {
            seen.cancelled_by_test += 1;
        }

        let mut failed: Vec<(i64, &Finished)> = vec![];
        let mut parents_done = true;
        for &p in &s.parents {
            match history.get(&p) {
                Some(f) if f.outcome != "completed" => failed.push((p, f)),
                Some(_) => {}
                None => parents_done = false,
            }
        }
        if !parents_done {
            problems.push(format!("{id}: a parent of {:?} never finished", s.parents));
            continue;
        }
        if !failed.is_empty() && s.policy != "run" {
            // A failed parent: never ran; its policy's outcome, naming a failed parent.
            if !runs.is_empty() {
                problems.push(format!(
                    "{id} (policy {}) ran at attempts {attempts:?} though its parent {} ended {}",
                    s.policy, failed[0].0, failed[0].1.outcome
                ));
                continue;
            }
            if by_test {
                continue;
            }
            let fate = if s.policy == "cancel" { "cancelled" } else { "dead" };
            let named = failed.iter().find(|(p, f)| {
                let how = if f.outcome == "dead" { "dead-lettered" } else { f.outcome.as_str() };
                me.last_error.as_deref() == Some(format!("parent {p} was {how}").as_str())
            });
            match named {
                Some(_) if me.outcome == fate => {
                    if fate == "cancelled" {
                        seen.cancelled_by_parent += 1;
                    } else {
                        seen.dead_by_parent += 1;
                    }
                }
                _ => problems.push(format!(
                    "{id} (policy {}, failed parents {:?}) finished {} at {} with {:?}",
                    s.policy,
                    failed.iter().map(|(p, f)| format!("{p} {} at {}", f.outcome, f.at)).collect::<Vec<_>>(),
                    me.outcome,
                    me.at,
                    me.last_error
                )),
            }
            continue;
        }
        // Every parent completed, or 'run': it ran after the last of them finished, unless
        // the test cancelled it first.
        let Some(start) = first_start else {
            if !by_test {
                problems.push(format!(
                    "{id} (policy {}, parents {:?} all finished) never ran, and finished {} with {:?}",
                    s.policy, s.parents, me.outcome, me.last_error
                ));
            }
            continue;
        };
        seen.ran += 1;
        if !s.parents.is_empty() {
            seen.ran_with_parents += 1;
        }
        for &p in &s.parents {
            seen.edges_checked += 1;
            let f = &history[&p];
            if f.at > start {
                problems.push(format!(
                    "{id} started at {start}, before its parent {p} finished ({} at {})",
                    f.outcome, f.at
                ));
            }
        }
        if !failed.is_empty() {
            seen.run_after_failure += 1;
        } else if s.parents.len() >= 2 {
            seen.ran_after_several += 1;
        }
    }
    (problems, seen)
}

// ---------------------------------------------------------------------------------------
// The tests

/// 1,000 graphs, the background worker, one restart.
#[test]
fn random_dags_with_the_worker_and_a_restart() {
    run(Run { name: "random_dags_with_the_worker", graphs: 1000, batch: 50, preload: true });
}

/// 150 graphs without preloading: no worker, no shared memory, no hand-over of children
/// whose last parents finished together; pgq_tick() every 200 ms finds them.
#[test]
fn random_dags_without_a_worker() {
    run(Run { name: "random_dags_without_a_worker", graphs: 150, batch: 50, preload: false });
}
