//! Automatic failover under load: one etcd and three PostgreSQL nodes under Patroni, pgqueue
//! preloaded on each, the extension created on the leader. Producers record every send the
//! server confirmed, `pgq_ack_claim` consumers and a Python client worker follow the leader
//! through a multi-host connection string (`target_session_attrs=read-write`), a schedule
//! fires every second. Three leader changes in one run: the leader's postmaster killed
//! (SIGKILL), a planned switchover back to the node that was killed (it rejoined with
//! pg_rewind), and that node killed again. Run once with `synchronous_mode: true` (no confirmed
//! send may be lost) and once without (lost sends are counted, not forbidden).
//!
//! PostgreSQL 15 only: Debian 12's Patroni (3.0.2) is released for majors up to 15, and the
//! pgqueue code a failover exercises is the same on every major (tests/servers/standby.rs
//! promotes a standby by hand on all three). With `PGQUEUE_FAILOVER_REPORT=<file>` the test
//! writes its measurements there (docs/high-availability.md quotes them).
#![cfg(feature = "pg15")]

mod common;

use common::server::bindir;
use postgres::config::TargetSessionAttrs;
use postgres::{Client, NoTls};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use uuid::Uuid;

const LIMIT: Duration = Duration::from_secs(90);
/// The worker's settings on every node: a promoted node gets its worker within the naptime,
/// and the worker re-arms expired claims at its next tick.
const NAPTIME_MS: u64 = 500;
const TICK_MS: u64 = 200;
/// The lease of the claims the test abandons just before a leader dies.
const STUCK_LEASE_S: u64 = 2;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn is_root() -> bool {
    // SAFETY: a plain syscall without arguments.
    unsafe { libc::geteuid() == 0 }
}

/// A command run as the postgres user (PostgreSQL refuses to run as root).
fn as_postgres(program: &str) -> Command {
    if is_root() {
        let mut c = Command::new("sudo");
        c.args(["-u", "postgres", program]);
        c
    } else {
        Command::new(program)
    }
}

fn epoch_s(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

fn http_get(url: &str) -> Option<(u16, String)> {
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(2)).build();
    match agent.get(url).call() {
        Ok(r) => Some((r.status(), r.into_string().unwrap_or_default())),
        Err(ureq::Error::Status(code, r)) => Some((code, r.into_string().unwrap_or_default())),
        Err(_) => None,
    }
}

/// A child process, killed if the test ends (fails) before the test has waited for it.
struct Reaped(Option<Child>);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

struct Node {
    name: String,
    pg_port: u16,
    rest_port: u16,
    dir: PathBuf,
    patroni: Option<Child>,
}

impl Node {
    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log/postgresql.log")).unwrap_or_default()
    }

    fn patroni_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("patroni.log")).unwrap_or_default()
    }

    fn connect(&self) -> Option<Client> {
        postgres::Config::new()
            .host("127.0.0.1")
            .port(self.pg_port)
            .user("postgres")
            .dbname("postgres")
            .connect_timeout(Duration::from_secs(2))
            .connect(NoTls)
            .ok()
    }

    /// Whether the node is a standby receiving WAL.
    fn streaming(&self) -> bool {
        self.connect().is_some_and(|mut c| {
            c.query_one("SELECT count(*) = 1 FROM pg_stat_wal_receiver WHERE status = 'streaming'", &[])
                .is_ok_and(|r| r.get::<_, bool>(0))
        })
    }

    /// Stops (SIGSTOP) the node's WAL senders for `stall`, then kills its postmaster and them
    /// (SIGKILL): the replicas lack what the node committed during the stall. With
    /// synchronous replication those commits were never confirmed; without, they were.
    fn kill_after_stall(&self, stall: Duration) {
        let mut c = self.connect().expect("the leader");
        let senders: Vec<i32> =
            c.query("SELECT pid FROM pg_stat_replication", &[]).unwrap().iter().map(|r| r.get(0)).collect();
        assert!(!senders.is_empty(), "the leader has WAL senders");
        drop(c);
        for &pid in &senders {
            // SAFETY: a signal to a process of this test's cluster.
            unsafe { libc::kill(pid, libc::SIGSTOP) };
        }
        thread::sleep(stall);
        self.kill_postmaster();
        for &pid in &senders {
            // SAFETY: as above; a stopped process is only ended by SIGKILL.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }

    /// Kills the node's postmaster with SIGKILL (Patroni on the node lives on).
    fn kill_postmaster(&self) {
        let pid_file = std::fs::read_to_string(self.data().join("postmaster.pid")).expect("postmaster.pid");
        let pid: i32 = pid_file.lines().next().unwrap().trim().parse().unwrap();
        // SAFETY: a signal to a process this test's cluster started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill -9 {pid}");
    }
}

struct Cluster {
    dir: PathBuf,
    etcd: Child,
    nodes: Vec<Node>,
}

impl Cluster {
    /// etcd, then node 0 (it bootstraps and leads), then nodes 1 and 2 (replicas, cloned by
    /// Patroni). Node 2 is tagged nosync: with synchronous_mode the synchronous standby is
    /// always node 0 or 1, so that the switchover can go back to the node killed first.
    fn start(synchronous: bool) -> Cluster {
        let dir = PathBuf::from(format!("/tmp/pgqueue-failover-{}-{}", std::process::id(), synchronous));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (client, peer) = (free_port(), free_port());
        let etcd_log = std::fs::File::create(dir.join("etcd.log")).unwrap();
        let etcd = Command::new("etcd")
            .args(["--name", "etcd0", "--data-dir"])
            .arg(dir.join("etcd"))
            .args(["--listen-client-urls", &format!("http://127.0.0.1:{client}")])
            .args(["--advertise-client-urls", &format!("http://127.0.0.1:{client}")])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-cluster", &format!("etcd0=http://127.0.0.1:{peer}")])
            .stdout(etcd_log.try_clone().unwrap())
            .stderr(etcd_log)
            .spawn()
            .expect("etcd (Debian's etcd-server, installed by scripts/setup.sh)");
        let mut cluster = Cluster { dir: dir.clone(), etcd, nodes: vec![] };
        common::wait_for("etcd", LIMIT, || {
            http_get(&format!("http://127.0.0.1:{client}/health")).filter(|(code, _)| *code == 200)
        });
        if is_root() {
            assert!(Command::new("chown").arg("postgres:").arg(&dir).status().unwrap().success());
        }
        for i in 0..3 {
            let node = Node {
                name: format!("node{i}"),
                pg_port: free_port(),
                rest_port: free_port(),
                dir: dir.join(format!("node{i}")),
                patroni: None,
            };
            std::fs::create_dir_all(node.dir.join("log")).unwrap();
            let config = patroni_config(&node, client, synchronous, i == 2, &dir);
            std::fs::write(node.dir.join("patroni.yml"), config).unwrap();
            if is_root() {
                assert!(Command::new("chown").arg("-R").arg("postgres:").arg(&node.dir).status().unwrap().success());
            }
            cluster.nodes.push(node);
        }
        cluster.spawn(0);
        cluster.wait_leader(LIMIT);
        cluster.spawn(1);
        cluster.spawn(2);
        cluster.wait_replicas(LIMIT, synchronous);
        cluster
    }

    fn spawn(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let out = std::fs::File::create(node.dir.join("patroni.log")).unwrap();
        let child = as_postgres("patroni")
            .arg(node.dir.join("patroni.yml"))
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .expect("patroni (Debian's, installed by scripts/setup.sh)");
        node.patroni = Some(child);
    }

    fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.pg_port).collect()
    }

    /// The members as Patroni's REST API reports them: name → role ("leader", "replica",
    /// "sync_standby") and state ("running", "stopped", …).
    fn members(&self) -> Option<BTreeMap<String, (String, String)>> {
        self.nodes.iter().find_map(|n| {
            let (code, body) = http_get(&format!("http://127.0.0.1:{}/cluster", n.rest_port))?;
            if code != 200 {
                return None;
            }
            let v: Value = serde_json::from_str(&body).ok()?;
            Some(
                v["members"]
                    .as_array()?
                    .iter()
                    .map(|m| {
                        let s = |k: &str| m[k].as_str().unwrap_or_default().to_string();
                        (s("name"), (s("role"), s("state")))
                    })
                    .collect(),
            )
        })
    }

    /// The leader's index, once it accepts writes.
    fn wait_leader(&self, limit: Duration) -> usize {
        self.wait_new_leader(usize::MAX, limit)
    }

    /// The index of a leader other than node `old`, once it accepts writes.
    fn wait_new_leader(&self, old: usize, limit: Duration) -> usize {
        common::wait_for("a writable leader", limit, || {
            self.nodes.iter().enumerate().position(|(i, n)| {
                i != old
                    && http_get(&format!("http://127.0.0.1:{}/primary", n.rest_port)).is_some_and(|(c, _)| c == 200)
                    && n.connect().is_some_and(|mut c| {
                        c.query_one("SELECT NOT pg_is_in_recovery()", &[]).is_ok_and(|r| r.get::<_, bool>(0))
                    })
            })
        })
    }

    /// Until every node runs: the leader, and two replicas receiving its WAL (with
    /// synchronous_mode, one of them the synchronous standby).
    fn wait_replicas(&self, limit: Duration, synchronous: bool) {
        common::wait_for("three members, two of them streaming", limit, || {
            let m = self.members()?;
            let leader = m.values().filter(|(role, state)| role == "leader" && state == "running").count();
            let sync = m.values().filter(|(role, _)| role == "sync_standby").count();
            let streaming = self
                .nodes
                .iter()
                .filter(|n| m.get(&n.name).is_some_and(|(r, _)| r != "leader") && n.streaming())
                .count();
            (m.len() == 3 && leader == 1 && streaming == 2 && (!synchronous || sync == 1)).then_some(())
        });
    }

    fn switchover(&self, from: usize, to: usize) {
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(60)).build();
        let body = json!({"leader": self.nodes[from].name, "candidate": self.nodes[to].name});
        let r = agent
            .post(&format!("http://127.0.0.1:{}/switchover", self.nodes[from].rest_port))
            .set("Content-Type", "application/json")
            .send_string(&body.to_string());
        assert!(r.is_ok(), "switchover {from} → {to}: {r:?}");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.patroni.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // Patroni, killed, leaves its PostgreSQL running: everything under the directory goes.
        let pattern = self.dir.display().to_string();
        let _ = Command::new("pkill").args(["-9", "-f", &pattern]).status();
        let _ = self.etcd.kill();
        let _ = self.etcd.wait();
        if std::thread::panicking() {
            for node in &self.nodes {
                let log = node.patroni_log();
                let tail: Vec<&str> = log.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect();
                eprintln!("--- {} (Patroni, last lines) ---\n{}", node.name, tail.join("\n"));
            }
            eprintln!("the cluster's files are kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn patroni_config(node: &Node, etcd_port: u16, synchronous: bool, nosync: bool, cluster_dir: &Path) -> String {
    let bin = bindir(15);
    let d = node.dir.display();
    format!(
        "scope: pgqueue-failover
namespace: /pgqueue-test-{pid}-{synchronous}/
name: {name}
restapi:
  listen: 127.0.0.1:{rest}
  connect_address: 127.0.0.1:{rest}
etcd3:
  hosts: 127.0.0.1:{etcd_port}
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 4
    maximum_lag_on_failover: 16777216
    primary_start_timeout: 0
    synchronous_mode: {synchronous}
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        shared_preload_libraries: pgqueue
        pgqueue.launcher_naptime: {NAPTIME_MS}ms
        pgqueue.tick_interval: {TICK_MS}ms
        max_connections: 100
        wal_log_hints: 'on'
        wal_keep_size: 256MB
  initdb:
  - encoding: UTF8
  - data-checksums
postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{pg}
  data_dir: {d}/data
  bin_dir: {bin}
  pgpass: {d}/pgpass
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
    rewind:
      username: postgres
  pg_hba:
  - local all all trust
  - host all all 127.0.0.1/32 trust
  - host replication all 127.0.0.1/32 trust
  parameters:
    unix_socket_directories: '{d}'
    logging_collector: 'on'
    log_directory: '{d}/log'
    log_filename: postgresql.log
    log_file_mode: '0644'
tags:
  nosync: {nosync}
# {cluster}
",
        pid = std::process::id(),
        name = node.name,
        rest = node.rest_port,
        pg = node.pg_port,
        bin = bin.display(),
        cluster = cluster_dir.display(),
    )
}

/// The connection every client of the test uses: all three nodes, the writable one chosen.
fn rw_config(ports: &[u16]) -> postgres::Config {
    let mut c = postgres::Config::new();
    for _ in ports {
        c.host("127.0.0.1");
    }
    for &p in ports {
        c.port(p);
    }
    c.user("postgres")
        .dbname("postgres")
        .target_session_attrs(TargetSessionAttrs::ReadWrite)
        .connect_timeout(Duration::from_secs(2));
    c
}

/// The same as a libpq connection string (the Python client).
fn rw_dsn(ports: &[u16]) -> String {
    let hosts = vec!["127.0.0.1"; ports.len()].join(",");
    let ports: Vec<String> = ports.iter().map(|p| p.to_string()).collect();
    format!(
        "host={hosts} port={} user=postgres dbname=postgres target_session_attrs=read-write connect_timeout=2",
        ports.join(",")
    )
}

/// What the clients saw, each event with the time it happened.
#[derive(Default)]
struct Log {
    /// Payload keys of sends whose call (and commit) the server confirmed.
    sent: Vec<(String, Instant)>,
    /// Claims by the Rust consumers: key, when, the consumer.
    claims: Vec<(String, Instant, usize)>,
    /// Acks the server confirmed (the call returned and did not report the key not acked).
    acked: HashMap<String, Instant>,
    /// Claim calls that returned messages: when, the port of the server, the consumer.
    successes: Vec<(Instant, u16, usize)>,
    /// Failed calls (connection lost, server shutting down …): when, who, the error.
    errors: Vec<(Instant, String, String)>,
}

type Shared = Arc<Mutex<Log>>;

fn connect_until(cfg: &postgres::Config, stop: &AtomicBool) -> Option<(Client, u16)> {
    while !stop.load(Ordering::Relaxed) {
        if let Ok(mut c) = cfg.connect(NoTls)
            && let Ok(r) = c.query_one("SELECT inet_server_port()", &[])
        {
            return Some((c, r.get::<_, i32>(0) as u16));
        }
        thread::sleep(Duration::from_millis(100));
    }
    None
}

fn producer(cfg: postgres::Config, id: usize, log: Shared, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut n = 0u64;
        let mut client: Option<Client> = None;
        while !stop.load(Ordering::Relaxed) {
            let Some(c) = client.as_mut() else {
                client = connect_until(&cfg, &stop).map(|(c, _)| c);
                continue;
            };
            let keys: Vec<String> = (0..10).map(|i| format!("p{id}-{n}-{i}")).collect();
            let payloads: Vec<Value> = keys.iter().map(|k| json!({"k": k})).collect();
            n += 1;
            match c.query("SELECT pgqueue.pgq_send_batch('ha', $1::jsonb[])", &[&payloads]) {
                Ok(_) => {
                    let now = Instant::now();
                    log.lock().unwrap().sent.extend(keys.into_iter().map(|k| (k, now)));
                }
                Err(e) => {
                    log.lock().unwrap().errors.push((Instant::now(), format!("producer {id}"), e.to_string()));
                    client = None;
                }
            }
            thread::sleep(Duration::from_millis(20));
        }
    })
}

/// A consumer's loop: acks what it handled and claims the next ones in one call, waiting up
/// to a second; handling takes 2 ms a job.
fn consumer(cfg: postgres::Config, id: usize, log: Shared, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut client: Option<(Client, u16)> = None;
        let mut held: Vec<(i64, Uuid, String)> = vec![];
        loop {
            let stopping = stop.load(Ordering::Relaxed);
            if stopping && held.is_empty() {
                return;
            }
            let Some((c, port)) = client.as_mut() else {
                held.clear(); // their acks' fate is unknown: the leases end, they run again
                client = connect_until(&cfg, &stop);
                if client.is_none() {
                    return;
                }
                continue;
            };
            let ids: Vec<i64> = held.iter().map(|h| h.0).collect();
            let tokens: Vec<Uuid> = held.iter().map(|h| h.1).collect();
            let qty: i32 = if stopping { 1 } else { 10 };
            let result = c.query(
                "SELECT kind, msg_id, claim_token, payload->>'k' FROM pgqueue.pgq_ack_claim(queue => 'ha',
                        ack_msg_ids => $1, ack_claim_tokens => $2, qty => $3, lease => '5 s', wait => '1 s')",
                &[&ids, &tokens, &qty],
            );
            match result {
                Ok(rows) => {
                    let now = Instant::now();
                    let not_acked: BTreeSet<i64> =
                        rows.iter().filter(|r| r.get::<_, &str>(0) == "not_acked").map(|r| r.get(1)).collect();
                    let claimed: Vec<(i64, Uuid, String)> = rows
                        .iter()
                        .filter(|r| r.get::<_, &str>(0) == "claimed")
                        .map(|r| (r.get(1), r.get(2), r.get(3)))
                        .collect();
                    let mut l = log.lock().unwrap();
                    for (msg_id, _, key) in held.drain(..) {
                        if !not_acked.contains(&msg_id) {
                            l.acked.insert(key, now);
                        }
                    }
                    if !claimed.is_empty() {
                        l.successes.push((now, *port, id));
                    }
                    l.claims.extend(claimed.iter().map(|(_, _, k)| (k.clone(), now, id)));
                    drop(l);
                    if stopping {
                        // The last call acked what was held; what it claimed goes back to the
                        // queue by its lease, so hand it straight back instead.
                        for (msg_id, token, _) in &claimed {
                            let _ = c.execute("SELECT pgqueue.pgq_nack($1, $2, retry_in => '0')", &[msg_id, token]);
                        }
                        return;
                    }
                    thread::sleep(Duration::from_millis(2 * claimed.len() as u64));
                    held = claimed;
                }
                Err(e) => {
                    log.lock().unwrap().errors.push((Instant::now(), format!("consumer {id}"), e.to_string()));
                    client = None;
                }
            }
        }
    })
}

/// Claims `n` messages of queue `stuck` with a short lease and walks away: the leader dies
/// with them claimed, and the new leader must re-arm them.
fn abandon_claims(cfg: &postgres::Config, n: i32) -> (BTreeSet<i64>, SystemTime) {
    let mut c = cfg.connect(NoTls).unwrap();
    c.execute("SELECT pgqueue.pgq_send('stuck', '{}') FROM generate_series(1, $1)", &[&n]).unwrap();
    let rows = c
        .query(
            &format!("SELECT msg_id FROM pgqueue.pgq_claim('stuck', qty => $1, lease => '{STUCK_LEASE_S} s')"),
            &[&n],
        )
        .unwrap();
    let ids: BTreeSet<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(ids.len(), n as usize);
    (ids, SystemTime::now() + Duration::from_secs(STUCK_LEASE_S))
}

/// What one leader change measured.
struct Change {
    what: &'static str,
    /// From the leader's death (or the switchover's request) to the first claim that returned
    /// messages on the new leader.
    to_first_claim: Duration,
    /// From when the abandoned claims could first be re-armed on the new leader (its first
    /// writable moment, or their lease's end if later) to when they were.
    rearm_after: Duration,
    /// Jobs completed per second in the 5 s before, and in the 5 s from the first claim on.
    rate_before: f64,
    rate_after: f64,
    /// Confirmed sends missing on the new leader.
    lost: usize,
}

fn keys_present(c: &mut Client) -> BTreeSet<String> {
    c.query(
        "SELECT payload->>'k' FROM pgqueue.messages WHERE queue = 'ha'
         UNION ALL SELECT payload->>'k' FROM pgqueue.history WHERE queue = 'ha'",
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

fn completions_between(c: &mut Client, from: SystemTime, to: SystemTime) -> f64 {
    let n: i64 = c
        .query_one(
            "SELECT count(*) FROM pgqueue.history WHERE queue = 'ha' AND outcome = 'completed'
               AND finished_at >= to_timestamp($1) AND finished_at < to_timestamp($2)",
            &[&epoch_s(from), &epoch_s(to)],
        )
        .unwrap()
        .get(0);
    n as f64 / to.duration_since(from).unwrap().as_secs_f64()
}

/// The pgqueue processes of a node (none on a replica).
fn pgqueue_processes(node: &Node) -> Option<Vec<String>> {
    let mut c = node.connect()?;
    let rows =
        c.query("SELECT backend_type FROM pg_stat_activity WHERE backend_type LIKE 'pgqueue%' ORDER BY 1", &[]).ok()?;
    Some(rows.iter().map(|r| r.get(0)).collect())
}

fn run(synchronous: bool) -> String {
    let _installed = common::connect(); // pgrx's harness installs the extension first
    let cluster = Cluster::start(synchronous);
    let leader = cluster.wait_leader(LIMIT);
    assert_eq!(leader, 0, "node0 bootstraps the cluster");
    let ports = cluster.ports();
    let cfg = rw_config(&ports);
    {
        let mut c = cfg.connect(NoTls).unwrap();
        c.batch_execute(
            "CREATE EXTENSION pgqueue;
             SELECT pgqueue.pgq_create_queue('ha', lease => '5 s', max_attempts => 50);
             SELECT pgqueue.pgq_create_queue('stuck', max_attempts => 50);
             SELECT pgqueue.pgq_create_queue('ticks');
             SELECT pgqueue.pgq_schedule('every-second', 'ticks', '* * * * * *');",
        )
        .unwrap();
    }
    wait_for_worker(&cluster, leader);

    let log: Shared = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let stop_consumers = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..2).map(|i| producer(cfg.clone(), i, log.clone(), stop.clone())).collect();
    let consumers: Vec<_> = (0..4).map(|i| consumer(cfg.clone(), i, log.clone(), stop_consumers.clone())).collect();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let venv = std::env::var("PGQUEUE_VENV").unwrap_or_else(|_| "/var/cache/pgqueue/venv".into());
    let mut python = Reaped(Some(
        Command::new(PathBuf::from(&venv).join("bin/python"))
            .arg(root.join("clients/python/tests/worker_process.py"))
            .args([&rw_dsn(&ports), "ha", "failover-python"])
            .env("PYTHONPATH", root.join("clients/python/src"))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdout(std::fs::File::create(cluster.dir.join("python.log")).unwrap())
            .stderr(std::fs::File::create(cluster.dir.join("python.err")).unwrap())
            .spawn()
            .expect("the Python client's worker (scripts/setup.sh makes its virtual environment)"),
    ));

    // Replicas must never run pgqueue's processes: sampled before every change.
    let replica_processes: Arc<Mutex<Vec<String>>> = Arc::default();

    thread::sleep(Duration::from_secs(6));
    let mut changes: Vec<Change> = vec![];
    let mut killed_first: Option<usize> = None;
    let mut current = leader;
    for step in 0..3 {
        // A change only when a failover is possible: with synchronous_mode, Patroni restarts a
        // crashed leader in place unless a synchronous standby can take over.
        cluster.wait_replicas(LIMIT, synchronous);
        if let (1, Some(to)) = (step, killed_first) {
            common::wait_for("the killed node to rejoin as the synchronous standby", LIMIT, || {
                let m = cluster.members()?;
                let (role, _) = m.get(&cluster.nodes[to].name)?;
                let ready = cluster.nodes[to].streaming() && (!synchronous || role == "sync_standby");
                ready.then_some(())
            });
        }
        // Sample the replicas' processes (never the node that is leading, or about to).
        for (i, node) in cluster.nodes.iter().enumerate() {
            if i != current
                && let Some(p) = pgqueue_processes(node).filter(|p| !p.is_empty())
            {
                replica_processes.lock().unwrap().push(format!("{}: {p:?} before change {step}", node.name));
            }
        }
        let (stuck, lease_end) = abandon_claims(&cfg, 3);
        let before_wall = SystemTime::now();
        let at = Instant::now();
        let what = match step {
            0 => {
                cluster.nodes[current].kill_postmaster();
                killed_first = Some(current);
                "leader's postmaster killed (SIGKILL)"
            }
            2 => {
                cluster.nodes[current].kill_after_stall(Duration::from_secs(1));
                "leader's WAL senders stopped for 1 s, then its postmaster killed"
            }
            _ => {
                cluster.switchover(current, killed_first.unwrap());
                "planned switchover back to the rejoined node"
            }
        };
        // What the clients were told was sent before the leader died (or handed over).
        let sent_before: BTreeSet<String> = log.lock().unwrap().sent.iter().map(|(k, _)| k.clone()).collect();
        let new = cluster.wait_new_leader(current, LIMIT);
        let writable_at = SystemTime::now();
        let mut c = cluster.nodes[new].connect().expect("the new leader");
        let rearmed_at = common::wait_for("the abandoned claims re-armed on the new leader", LIMIT, || {
            let ids: Vec<i64> = stuck.iter().copied().collect();
            let n: i64 = c
                .query_one("SELECT count(*) FROM pgqueue.messages WHERE msg_id = ANY ($1) AND state = 'ready'", &[&ids])
                .ok()?
                .get(0);
            (n == 3).then(SystemTime::now)
        });
        let first = common::wait_for("a claim that returns messages on the new leader", LIMIT, || {
            let l = log.lock().unwrap();
            l.successes.iter().find(|(t, port, _)| *t > at && *port == ports[new]).map(|(t, _, _)| *t)
        });
        let present = keys_present(&mut c);
        let lost = sent_before.difference(&present).count();
        thread::sleep(Duration::from_secs(6));
        let first_wall = before_wall + first.duration_since(at);
        let change = Change {
            what,
            to_first_claim: first.duration_since(at),
            rearm_after: rearmed_at.duration_since(writable_at.max(lease_end)).unwrap_or_default(),
            rate_before: completions_between(&mut c, before_wall - Duration::from_secs(5), before_wall),
            rate_after: completions_between(&mut c, first_wall, first_wall + Duration::from_secs(5)),
            lost,
        };
        if synchronous {
            assert_eq!(change.lost, 0, "change {step} ({what}): confirmed sends lost in synchronous mode");
        }
        // The re-arm: within the naptime and one tick of the earliest moment it could happen,
        // plus this test's polling (50 ms) and a margin for a loaded machine.
        let bound = Duration::from_millis(NAPTIME_MS + TICK_MS + 1000);
        assert!(
            change.rearm_after <= bound,
            "change {step}: re-armed after {:?} (bound {bound:?})",
            change.rearm_after
        );
        changes.push(change);
        current = new;
    }

    // Drain: producers stop, consumers finish what is there.
    stop.store(true, Ordering::Relaxed);
    for p in producers {
        p.join().unwrap();
    }
    let mut c = cluster.nodes[current].connect().unwrap();
    common::wait_for("the queue drained", LIMIT, || {
        let n: i64 = c.query_one("SELECT count(*) FROM pgqueue.messages WHERE queue = 'ha'", &[]).unwrap().get(0);
        (n == 0).then_some(())
    });
    stop_consumers.store(true, Ordering::Relaxed);
    for h in consumers {
        h.join().unwrap();
    }
    let mut python = python.0.take().unwrap();
    // SAFETY: a signal to the Python worker this test started; SIGTERM stops it gracefully.
    unsafe { libc::kill(python.id() as i32, libc::SIGTERM) };
    let status = python.wait().unwrap();
    let python_err = std::fs::read_to_string(cluster.dir.join("python.err")).unwrap_or_default();
    assert!(status.success(), "the Python worker exited with {status}:\n{python_err}");

    // Every confirmed send completed exactly once (or, without synchronous replication, was
    // lost in a failover); nothing is left, nothing is dead.
    let l = log.lock().unwrap();
    let sent: BTreeSet<String> = l.sent.iter().map(|(k, _)| k.clone()).collect();
    let completed: Vec<(String, i64)> = c
        .query(
            "SELECT payload->>'k', count(*) FROM pgqueue.history WHERE queue = 'ha' AND outcome = 'completed'
              GROUP BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let twice: Vec<&(String, i64)> = completed.iter().filter(|(_, n)| *n > 1).collect();
    assert!(twice.is_empty(), "completed more than once: {twice:?}");
    let dead: i64 = c
        .query_one("SELECT count(*) FROM pgqueue.history WHERE queue = 'ha' AND outcome = 'dead'", &[])
        .unwrap()
        .get(0);
    assert_eq!(dead, 0, "no message dead-lettered");
    let done: BTreeSet<String> = completed.into_iter().map(|(k, _)| k).collect();
    let lost_in_all: BTreeSet<&String> = sent.difference(&done).collect();
    if synchronous {
        assert!(lost_in_all.is_empty(), "confirmed sends never completed: {} of {}", lost_in_all.len(), sent.len());
    }

    // A message ran again only where at-least-once allows it: never after its ack was
    // confirmed, unless (without synchronous replication) the failover lost that ack.
    let mut runs: HashMap<&str, usize> = HashMap::new();
    let mut after_ack = 0;
    for (key, at, who) in &l.claims {
        *runs.entry(key.as_str()).or_default() += 1;
        if l.acked.get(key).is_some_and(|acked| at > acked) {
            assert!(!synchronous, "consumer {who} claimed {key} after its ack was confirmed");
            after_ack += 1;
        }
    }
    let reruns = runs.values().filter(|&&n| n > 1).count();

    // Every client saw the leaders die and came back: each consumer failed at least once,
    // and claimed on the last leader.
    for id in 0..4 {
        let who = format!("consumer {id}");
        assert!(l.errors.iter().any(|(_, w, _)| *w == who), "{who} never saw a failover");
        assert!(l.successes.iter().any(|&(_, port, i)| i == id && port == ports[current]), "{who} never came back");
    }

    // The schedule: every second from its first run to its last, exactly once.
    let slots: Vec<(String, i64)> = c
        .query(
            "SELECT headers->>'scheduled_for', count(*) FROM pgqueue.messages WHERE queue = 'ticks' GROUP BY 1 ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert!(slots.iter().all(|(_, n)| *n == 1), "a slot fired twice: {slots:?}");
    let span: (f64, f64) = c
        .query_one(
            "SELECT extract(epoch FROM min((headers->>'scheduled_for')::timestamptz))::float8,
                    extract(epoch FROM max((headers->>'scheduled_for')::timestamptz))::float8
               FROM pgqueue.messages WHERE queue = 'ticks'",
            &[],
        )
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    let expected = (span.1 - span.0).round() as usize + 1;
    // Without synchronous replication a firing lost with its transaction fires again.
    if slots.len() != expected {
        // What the schedule itself says about it, and the slots there are.
        let schedule: String = c
            .query_one("SELECT row(s.*)::text FROM pgqueue.schedule_stats s WHERE s.name = 'every-second'", &[])
            .unwrap()
            .get(0);
        let fired: Vec<&str> = slots.iter().map(|(slot, _)| slot.as_str()).collect();
        panic!(
            "every slot between the first and the last fired (missed policy: within grace): {} of {expected}\n\
             schedule: {schedule}\nslots: {fired:?}",
            slots.len()
        );
    }

    // The node killed twice rejoins too; its WAL had diverged (what it committed while its WAL
    // senders were stopped), so Patroni rewound it at least once in the run.
    cluster.wait_replicas(LIMIT, synchronous);
    let rewound = cluster.nodes.iter().any(|n| n.patroni_log().contains("running pg_rewind from"));
    assert!(rewound, "a rejoining node was rewound with pg_rewind");

    // The worker runs only on the leader; nothing of pgqueue's complains anywhere.
    for (i, node) in cluster.nodes.iter().enumerate() {
        let p = pgqueue_processes(node).unwrap_or_default();
        if i == current {
            assert_eq!(p, ["pgqueue launcher", "pgqueue worker"], "the leader runs the worker");
        } else {
            assert!(p.is_empty(), "{} is a replica and runs {p:?}", node.name);
        }
        let log = node.log();
        let bad: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("pgqueue"))
            .filter(|l| {
                ["ERROR", "PANIC", "WARNING"].iter().any(|w| l.contains(w))
                    || (l.contains("FATAL") && !l.contains("administrator command"))
            })
            .collect();
        assert!(bad.is_empty(), "{}'s log: {bad:#?}", node.name);
    }
    let replica_processes = replica_processes.lock().unwrap();
    assert!(replica_processes.is_empty(), "pgqueue processes on replicas: {replica_processes:?}");

    let mut report = String::new();
    let mode = if synchronous { "synchronous_mode: true" } else { "synchronous_mode: false" };
    writeln!(report, "## {mode}").unwrap();
    writeln!(report, "confirmed sends: {}; completed: {}; lost: {}", sent.len(), done.len(), lost_in_all.len())
        .unwrap();
    writeln!(
        report,
        "Rust consumers' claims: {}; messages they ran more than once: {reruns}, of which after a confirmed ack \
         (lost with its failover): {after_ack}",
        l.claims.len()
    )
    .unwrap();
    writeln!(report, "failed client calls: {}; schedule slots: {} of {expected}", l.errors.len(), slots.len()).unwrap();
    for (i, ch) in changes.iter().enumerate() {
        writeln!(
            report,
            "change {}: {}: first claim on the new leader after {:.2} s; abandoned claims re-armed {:.2} s after \
             they could be; jobs/s {:.0} before, {:.0} after; confirmed sends missing: {}",
            i + 1,
            ch.what,
            ch.to_first_claim.as_secs_f64(),
            ch.rearm_after.as_secs_f64(),
            ch.rate_before,
            ch.rate_after,
            ch.lost
        )
        .unwrap();
    }
    let mut times: Vec<f64> = changes.iter().map(|c| c.to_first_claim.as_secs_f64()).collect();
    times.sort_by(f64::total_cmp);
    writeln!(report, "p50 to the first claim: {:.2} s", times[times.len() / 2]).unwrap();
    drop(l);
    drop(cluster);
    report
}

/// A launcher and a worker on the node.
fn wait_for_worker(cluster: &Cluster, i: usize) {
    common::wait_for("the leader's worker", LIMIT, || {
        (pgqueue_processes(&cluster.nodes[i])? == ["pgqueue launcher", "pgqueue worker"]).then_some(())
    });
}

#[test]
fn failover_under_load_loses_no_confirmed_job() {
    let mut report = run(true);
    report.push('\n');
    report.push_str(&run(false));
    println!("{report}");
    if let Ok(path) = std::env::var("PGQUEUE_FAILOVER_REPORT") {
        std::fs::write(path, &report).unwrap();
    }
}
