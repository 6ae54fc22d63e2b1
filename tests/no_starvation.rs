//! Nothing starves. Claims start each priority's index scan at a hint kept in shared memory,
//! outside MVCC: raised by claims, lowered at commit and abort by whatever makes a lower id
//! claimable (a send committing out of id order, a rolled-back claim, a savepoint rolled back,
//! a nack, a re-armed lease, a promoted delayed message, a redrive), and checked by the
//! worker's tick. A hint left too high would starve messages: claims would come back empty
//! while claimable rows wait.
//!
//! A private server (tick 200 ms), two queues, for about 30 s: 3 producers commit out of id
//! order (random 0–30 ms before each commit, 10 % rolled back), 6 consumers ack, nack (now or
//! in 0.5 s), fail, abandon (the 2 s lease expires and is re-armed), roll back whole claiming
//! transactions and savepoints; a redriver brings dead letters back. Chaos: the worker is
//! killed once, runs disabled for a while (a redriver's `pgq_rearm` re-arms meanwhile), and
//! the server restarts once, losing the shared memory (clients reconnect; a send whose commit
//! was cut off is resolved by looking for its payloads).
//!
//! What is asserted:
//! - Checkpoints (after the kill; with the worker disabled; after the restart; at the end):
//!   everything but the consumers pauses (they only ack, claiming with 0.3 s waits). First,
//!   before any lease or delay of the run ends (whose re-arm or promotion would lower the
//!   hints and so rescue a starved message): no message may stay ready, with the same
//!   attempt, across two samples between which two consumers' claims on its queue came back
//!   empty (with the worker on, those claims must start 2 ticks + 0.3 s after the first
//!   sample: the tick may repair a hint). Then, once every lease and delay of the run has
//!   ended ("settled"), nothing may be claimable for longer than 2 ticks + 1 s (worker on) or
//!   1.5 s (worker off: only the commit/abort callbacks can lower a hint); and once at least
//!   two consumers per queue have had a claim come back empty, no row may be ready or
//!   delayed: an empty claim proves it found nothing claimable.
//! - During the run (sampled every 100 ms): no message stays ready, untouched by any claim,
//!   while two consumers' claims on its queue, started 2 ticks + 0.3 s after it was seen
//!   ready, come back empty (outside the kill and restart windows).
//! - Never held twice: for any two claims of a message, the intervals in which each was
//!   surely held (from the claim's return to the lease end, or to the first ack/nack/fail or
//!   rollback sent for it) do not overlap; an ack/nack/fail refused only after the lease end.
//! - Nothing lost: in the end every committed id is in the history exactly once: completed
//!   (an ack was sent for it, at most one ack succeeded), or dead with a fail sent after its
//!   last redrive; no rolled-back send's id appears anywhere; every redrive brought back what
//!   it was asked to.
//! - Priority and FIFO order, then, with one consumer on a fresh queue (worker disabled, so
//!   only the callbacks maintain the hints; a `pgq_tick` now and then must find no hint too
//!   high): every claim returns exactly the first `qty` of the messages claimable at that
//!   moment, by priority (higher first) then msg_id. A message made claimable again after
//!   later ones were claimed (a late commit of a lower id, nack, re-arm, rollback, redrive)
//!   is therefore next in its priority: "FIFO as far as concurrency allows" is FIFO over what
//!   is claimable when the claim runs. Delayed messages count from their due time (within a
//!   2 ms window around the claim, either outcome is accepted).
//! - A message made claimable while another claim is in flight (race phase, worker disabled):
//!   each kind of lowering (nack, rollback of the claim holding it, a send committing after
//!   higher ids, redrive) commits while another session claims 1000 messages, when the hint
//!   is already at or below the message (so the lowering changes no hint value); the claim in
//!   flight either took the message or the next claim returns it. With any timing.
//!
//! The random choices come from a seed, printed; `PGQUEUE_NO_STARVATION_SEED` replays them
//! (thread timing still varies). A failure keeps the server log in /tmp.

mod common;

use common::server::{Server, bindir, this_major};
use common::{Client, Rng};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use uuid::Uuid;

/// The server's pgqueue.tick_interval, in seconds.
const TICK: f64 = 0.2;
const QUEUES: [&str; 2] = ["ns_a", "ns_b"];
const PRODUCERS: usize = 3;
const CONSUMERS: usize = 6;
/// Slots of the threads that obey a pause: producers, consumers, then the redriver.
const REDRIVER: usize = PRODUCERS + CONSUMERS;
const PAUSABLE: usize = REDRIVER + 1;
const DB: &str = "app";

const CLAIM: &str = "SELECT msg_id, claim_token, extract(epoch FROM lease_expires_at)::float8, priority
                       FROM pgqueue.pgq_claim($1, qty => $2, wait => $3::text::interval)";

/// Seconds since the epoch: the same clock the server's timestamps use.
fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

fn sleep_s(s: f64) {
    if s > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(s));
    }
}

fn sleep_until(t: f64) {
    sleep_s(t - now());
}

fn queue_index(name: &str) -> usize {
    QUEUES.iter().position(|q| *q == name).unwrap_or_else(|| panic!("unknown queue {name}"))
}

/// The soak's own draw on the kit's generator.
trait Priority {
    fn priority(&mut self) -> i16;
}

impl Priority for Rng {
    fn priority(&mut self) -> i16 {
        if self.chance(50) { 5 } else { 0 }
    }
}

/// A claim that came back empty.
struct Empty {
    consumer: usize,
    queue: usize,
    t_req: f64,
    t_ret: f64,
}

/// What the threads share with the controller.
struct Shared {
    port: u16,
    stop: AtomicBool,
    paused: AtomicBool,
    pause_gen: AtomicU64,
    /// The pause generation each pausable thread last saw.
    seen: Vec<AtomicU64>,
    restarting: AtomicBool,
    restart_epoch: AtomicU64,
    /// The worker is disabled: the redriver also re-arms expired claims.
    worker_off: AtomicBool,
    failures: Mutex<Vec<String>>,
    empties: Mutex<Vec<Empty>>,
}

impl Shared {
    /// At the top of each loop of a pausable thread: whether a pause is on (seen).
    fn pause_point(&self, slot: usize) -> bool {
        if !self.paused.load(SeqCst) {
            return false;
        }
        self.seen[slot].store(self.pause_gen.load(SeqCst), SeqCst);
        true
    }

    fn fail(&self, what: String) -> ! {
        eprintln!("no_starvation FAILURE: {what}");
        self.failures.lock().unwrap().push(what.clone());
        panic!("{what}");
    }
}

/// Stops the threads when the test ends, however it ends.
struct StopGuard(Arc<Shared>);

impl Drop for StopGuard {
    fn drop(&mut self) {
        self.0.stop.store(true, SeqCst);
        // Threads still running (the test failed) take the server's end for a restart and
        // say nothing more.
        self.0.restarting.store(true, SeqCst);
    }
}

/// Keeps the server log when the test fails (the server's directory goes with it).
struct KeepLog<'a> {
    server: &'a Server,
    seed: u64,
}

impl Drop for KeepLog<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let path = format!("/tmp/no_starvation-pg{}-seed{}-server.log", this_major(), self.seed);
            let log = self.server.log();
            let _ = std::fs::write(&path, &log);
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            eprintln!("no_starvation: seed {}; server log kept in {path}; its end:\n{tail}", self.seed);
        }
    }
}

/// A session to the test database that survives the restart: errors the restart causes are
/// recognised (`lost`) and the next `get` reconnects.
struct Conn {
    sh: Arc<Shared>,
    client: Option<Client>,
    epoch: u64,
}

impl Conn {
    fn new(sh: &Arc<Shared>) -> Conn {
        let mut conn = Conn { sh: sh.clone(), client: None, epoch: 0 };
        conn.get();
        conn
    }

    fn get(&mut self) -> &mut Client {
        if self.client.as_ref().is_none_or(|c| c.is_closed()) {
            self.connect();
        }
        self.client.as_mut().unwrap()
    }

    fn connect(&mut self) {
        self.client = None;
        let start = now();
        loop {
            let epoch = self.sh.restart_epoch.load(SeqCst);
            let attempt = postgres::Config::new()
                .host("127.0.0.1")
                .port(self.sh.port)
                .user("postgres")
                .dbname(DB)
                .connect(postgres::NoTls);
            if let Ok(mut client) = attempt {
                if !self.sh.restarting.load(SeqCst) && self.sh.restart_epoch.load(SeqCst) == epoch {
                    // Opened before any restart began: a restart ends it, and bumps the epoch.
                    self.client = Some(client);
                    self.epoch = epoch;
                    return;
                }
                // Opened while a restart is under way: use it only if it outlived the restart.
                while self.sh.restarting.load(SeqCst) {
                    sleep_s(0.05);
                }
                if client.simple_query("SELECT 1").is_ok() {
                    self.client = Some(client);
                    self.epoch = self.sh.restart_epoch.load(SeqCst);
                    return;
                }
            }
            if now() - start > 90.0 {
                self.sh.fail(format!("no connection to the server for 90 s (port {})", self.sh.port));
            }
            sleep_s(0.1);
        }
    }

    /// Whether `e` is the restart's doing (the session is dropped then).
    fn lost(&mut self, e: &postgres::Error) -> bool {
        let restart = self.sh.restarting.load(SeqCst) || self.sh.restart_epoch.load(SeqCst) != self.epoch;
        let code = e.code().map(|c| c.code().to_string()).unwrap_or_default();
        let broken = e.is_closed()
            || e.as_db_error().is_none()
            || ["57P01", "57P02", "57P03"].contains(&code.as_str())
            || code.starts_with("08");
        if restart && broken {
            self.client = None;
            true
        } else {
            false
        }
    }
}

// ---------------------------------------------------------------------------------------
// Producers

/// A message sent (committed or not).
#[derive(Clone, Debug)]
struct Sent {
    id: i64,
    queue: usize,
    priority: i16,
    delayed: bool,
    /// When its transaction ended (commit or rollback returned; resolved after the restart).
    t: f64,
}

#[derive(Default)]
struct Produced {
    committed: Vec<Sent>,
    rolled_back: Vec<Sent>,
    txs: u64,
    rollbacks: u64,
    resolved: u64,
}

/// One transaction of 1–5 messages to random queues and priorities (sometimes delayed),
/// random 0–30 ms before its end, which is a commit or (with `rollback`) a rollback.
fn send_tx(
    c: &mut Client,
    rng: &mut Rng,
    tag: (usize, u64),
    rollback: bool,
    sent: &mut Vec<Sent>,
) -> Result<(), postgres::Error> {
    c.batch_execute("BEGIN")?;
    let mut left = rng.range(1, 5);
    let mut n = 0;
    while left > 0 {
        let k = rng.range(1, left.min(3));
        let queue = rng.below(QUEUES.len() as u64) as usize;
        let priority = rng.priority();
        let delay = if rng.chance(15) { rng.secs(0.3, 1.0) } else { 0.0 };
        let payloads: Vec<Value> = (n..n + k).map(|i| json!({ "p": tag.0, "t": tag.1, "i": i })).collect();
        let ids: Vec<i64> = if k == 1 && rng.chance(50) {
            vec![
                c.query_one(
                    "SELECT pgqueue.pgq_send($1, $2, delay => make_interval(secs => $3), priority => $4)",
                    &[&QUEUES[queue], &payloads[0], &delay, &priority],
                )?
                .get(0),
            ]
        } else {
            c.query(
                "SELECT pgqueue.pgq_send_batch($1, $2, delay => make_interval(secs => $3), priority => $4)",
                &[&QUEUES[queue], &payloads, &delay, &priority],
            )?
            .iter()
            .map(|r| r.get(0))
            .collect()
        };
        sent.extend(ids.into_iter().map(|id| Sent { id, queue, priority, delayed: delay > 0.0, t: f64::NAN }));
        n += k;
        left -= k;
    }
    sleep_s(rng.secs(0.0, 0.03));
    c.batch_execute(if rollback { "ROLLBACK" } else { "COMMIT" })?;
    let t = now();
    for s in sent.iter_mut() {
        s.t = t;
    }
    Ok(())
}

fn producer(sh: Arc<Shared>, me: usize, seed: u64) -> Produced {
    let mut rng = Rng::new(seed, 1 + me as u64);
    let mut conn = Conn::new(&sh);
    let mut out = Produced::default();
    let mut tx = 0;
    while !sh.stop.load(SeqCst) {
        if sh.pause_point(me) {
            sleep_s(0.02);
            continue;
        }
        tx += 1;
        out.txs += 1;
        let rollback = rng.chance(10);
        let mut sent = vec![];
        match send_tx(conn.get(), &mut rng, (me, tx), rollback, &mut sent) {
            Ok(()) if rollback => {
                out.rollbacks += 1;
                out.rolled_back.extend(sent);
            }
            Ok(()) => out.committed.extend(sent),
            Err(e) if conn.lost(&e) => {
                // Cut off by the restart: did it commit? Its payloads say.
                out.resolved += 1;
                let tag = json!({ "p": me, "t": tx });
                let found: Vec<Sent> = loop {
                    match conn.get().query(
                        "SELECT msg_id, queue, priority FROM pgqueue.messages WHERE payload @> $1
                         UNION ALL SELECT msg_id, queue, priority FROM pgqueue.history WHERE payload @> $1",
                        &[&tag],
                    ) {
                        Ok(rows) => {
                            let t = now();
                            break rows
                                .iter()
                                .map(|r| Sent {
                                    id: r.get(0),
                                    queue: queue_index(r.get(1)),
                                    priority: r.get(2),
                                    delayed: false,
                                    t,
                                })
                                .collect();
                        }
                        Err(e) if conn.lost(&e) => continue,
                        Err(e) => sh.fail(format!("producer {me}: resolving transaction {tx}: {e}")),
                    }
                };
                if found.is_empty() {
                    out.rolled_back.extend(sent);
                } else {
                    let got: HashSet<i64> = found.iter().map(|s| s.id).collect();
                    if let Some(s) = sent.iter().find(|s| !got.contains(&s.id)) {
                        sh.fail(format!(
                            "producer {me}: transaction {tx} half committed: {} missing from {got:?}",
                            s.id
                        ));
                    }
                    out.committed.extend(found);
                }
            }
            Err(e) => sh.fail(format!("producer {me}: {e}")),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Consumers

/// How a claim was made.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Via {
    /// An autocommit claim (committed when it returned).
    Plain,
    /// Inside a transaction then rolled back.
    RolledBack,
    /// Inside a savepoint then rolled back to it.
    Undone,
    /// Again after that rollback to the savepoint, then committed.
    Kept,
}

#[derive(Clone, Debug)]
struct Claim {
    consumer: usize,
    queue: usize,
    priority: i16,
    msg: i64,
    token: Uuid,
    t_req: f64,
    t_ret: f64,
    lease: f64,
    via: Via,
    /// When its rollback (RolledBack, Undone) was sent.
    end: Option<f64>,
    /// Its transaction was cut off by the restart: whether it was ever held is unknown.
    lost: bool,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum What {
    Ack,
    Nack,
    NackLater,
    Fail,
}

#[derive(Clone, Debug)]
struct Op {
    msg: i64,
    token: Uuid,
    what: What,
    t_req: f64,
    t_ret: f64,
    /// None: cut off by the restart.
    ok: Option<bool>,
}

#[derive(Default)]
struct Consumed {
    claims: Vec<Claim>,
    ops: Vec<Op>,
    abandoned: u64,
    rollbacks: u64,
    undos: u64,
}

struct Consumer {
    sh: Arc<Shared>,
    me: usize,
    rng: Rng,
    out: Consumed,
    /// The savepoint transaction of this round committed.
    kept_committed: bool,
}

impl Consumer {
    fn claim(
        &mut self,
        c: &mut Client,
        queue: usize,
        qty: i32,
        wait: &str,
        via: Via,
    ) -> Result<Vec<(i64, Uuid)>, postgres::Error> {
        let t_req = now();
        let rows = c.query(CLAIM, &[&QUEUES[queue], &qty, &wait])?;
        let t_ret = now();
        if rows.is_empty() && via == Via::Plain {
            self.sh.empties.lock().unwrap().push(Empty { consumer: self.me, queue, t_req, t_ret });
        }
        let mut held = vec![];
        for r in rows {
            let (msg, token): (i64, Uuid) = (r.get(0), r.get(1));
            self.out.claims.push(Claim {
                consumer: self.me,
                queue,
                priority: r.get(3),
                msg,
                token,
                t_req,
                t_ret,
                lease: r.get(2),
                via,
                end: None,
                lost: false,
            });
            held.push((msg, token));
        }
        Ok(held)
    }

    /// Acks, nacks, fails or abandons each message held (only acks in a pause).
    fn process(&mut self, c: &mut Client, held: &[(i64, Uuid)], ack_only: bool) -> Result<(), postgres::Error> {
        for &(msg, token) in held {
            let what = if ack_only {
                What::Ack
            } else {
                match self.rng.below(90) {
                    0..70 => What::Ack,
                    70..78 => What::Nack,
                    78..83 => What::NackLater,
                    83..87 => What::Fail,
                    _ => {
                        self.out.abandoned += 1;
                        continue;
                    }
                }
            };
            let sql = match what {
                What::Ack => "SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)",
                What::Nack => "SELECT pgqueue.pgq_nack($1::bigint, $2::uuid, retry_in => '0')",
                What::NackLater => "SELECT pgqueue.pgq_nack($1::bigint, $2::uuid, retry_in => '0.5 s')",
                What::Fail => "SELECT pgqueue.pgq_fail($1::bigint, $2::uuid)",
            };
            let i = self.out.ops.len();
            self.out.ops.push(Op { msg, token, what, t_req: now(), t_ret: f64::NAN, ok: None });
            let ok: bool = c.query_one(sql, &[&msg, &token])?.get(0);
            self.out.ops[i].t_ret = now();
            self.out.ops[i].ok = Some(ok);
        }
        Ok(())
    }

    fn end_claims(&mut self, from: usize) {
        let at = now();
        for claim in &mut self.out.claims[from..] {
            claim.end = Some(at);
        }
    }

    fn plain(&mut self, c: &mut Client, queue: usize, qty: i32, ack_only: bool) -> Result<(), postgres::Error> {
        // Shorter waits in a pause: the checkpoints wait for claims that come back empty.
        let held = self.claim(c, queue, qty, if ack_only { "0.3 s" } else { "1 s" }, Via::Plain)?;
        self.process(c, &held, ack_only)
    }

    fn rolled_back(&mut self, c: &mut Client, queue: usize, qty: i32) -> Result<(), postgres::Error> {
        c.batch_execute("BEGIN")?;
        let from = self.out.claims.len();
        self.claim(c, queue, qty, "0", Via::RolledBack)?;
        sleep_s(self.rng.secs(0.0, 0.01));
        self.end_claims(from);
        c.batch_execute("ROLLBACK")?;
        self.out.rollbacks += 1;
        Ok(())
    }

    fn savepoint(&mut self, c: &mut Client, queue: usize, qty: i32) -> Result<(), postgres::Error> {
        c.batch_execute("BEGIN; SAVEPOINT s")?;
        let from = self.out.claims.len();
        self.claim(c, queue, qty, "0", Via::Undone)?;
        self.end_claims(from);
        c.batch_execute("ROLLBACK TO SAVEPOINT s")?;
        self.out.undos += 1;
        let held = self.claim(c, queue, qty, "0", Via::Kept)?;
        c.batch_execute("COMMIT")?;
        self.kept_committed = true;
        self.process(c, &held, false)
    }
}

fn consumer(sh: Arc<Shared>, me: usize, seed: u64) -> Consumed {
    let mut conn = Conn::new(&sh);
    let mut w = Consumer {
        sh: sh.clone(),
        me,
        rng: Rng::new(seed, 100 + me as u64),
        out: Consumed::default(),
        kept_committed: false,
    };
    let mut turn = me;
    while !sh.stop.load(SeqCst) {
        let ack_only = sh.pause_point(PRODUCERS + me);
        let queue = turn % QUEUES.len();
        turn += 1;
        let qty = w.rng.range(1, 3) as i32;
        let r = w.rng.below(100);
        let first = w.out.claims.len();
        w.kept_committed = false;
        let result = if ack_only || r >= 10 {
            w.plain(conn.get(), queue, qty, ack_only)
        } else if r < 7 {
            w.rolled_back(conn.get(), queue, qty)
        } else {
            w.savepoint(conn.get(), queue, qty)
        };
        if let Err(e) = result {
            if !conn.lost(&e) {
                sh.fail(format!("consumer {me}: {e}"));
            }
            let kept = w.kept_committed;
            for claim in &mut w.out.claims[first..] {
                if claim.via != Via::Plain && !(claim.via == Via::Kept && kept) {
                    claim.lost = true;
                }
            }
        }
    }
    w.out
}

// ---------------------------------------------------------------------------------------
// Redriver (and, while the worker is disabled, re-armer)

struct Redrive {
    ids: Vec<i64>,
    t_req: f64,
    ok: Option<bool>,
}

#[derive(Default)]
struct Redriven {
    redrives: Vec<Redrive>,
    rearmed: i64,
}

fn redrive(c: &mut Client, queue: usize, log: &mut Vec<Redrive>) -> Result<(), postgres::Error> {
    let ids: Vec<i64> = c
        .query(
            "SELECT msg_id FROM pgqueue.history WHERE queue = $1 AND outcome = 'dead' ORDER BY msg_id",
            &[&QUEUES[queue]],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if ids.is_empty() {
        return Ok(());
    }
    let i = log.len();
    log.push(Redrive { ids: ids.clone(), t_req: now(), ok: None });
    let n: i64 = c.query_one("SELECT pgqueue.pgq_redrive($1, $2)", &[&QUEUES[queue], &ids])?.get(0);
    log[i].ok = Some(n == ids.len() as i64);
    Ok(())
}

fn redriver(sh: Arc<Shared>) -> Redriven {
    let mut conn = Conn::new(&sh);
    let mut out = Redriven::default();
    let (mut last_redrive, mut last_rearm) = (now(), now());
    while !sh.stop.load(SeqCst) {
        if sh.pause_point(REDRIVER) {
            sleep_s(0.02);
            continue;
        }
        if sh.worker_off.load(SeqCst) && now() - last_rearm >= 0.3 {
            last_rearm = now();
            match conn.get().query_one("SELECT rearmed FROM pgqueue.pgq_rearm()", &[]) {
                Ok(row) => out.rearmed += row.get::<_, i64>(0),
                Err(e) if conn.lost(&e) => {}
                Err(e) => sh.fail(format!("redriver: pgq_rearm: {e}")),
            }
        }
        if now() - last_redrive >= 2.0 {
            last_redrive = now();
            for queue in 0..QUEUES.len() {
                match redrive(conn.get(), queue, &mut out.redrives) {
                    Ok(()) => {}
                    Err(e) if conn.lost(&e) => {}
                    Err(e) => sh.fail(format!("redriver: {e}")),
                }
                if let Some(Redrive { ids, ok: Some(false), .. }) = out.redrives.last() {
                    sh.fail(format!("pgq_redrive did not bring back all of the dead letters {ids:?}"));
                }
            }
        }
        sleep_s(0.05);
    }
    out
}

// ---------------------------------------------------------------------------------------
// Sampler: how long each message stays ready, untouched

/// A message seen ready, with the same attempt count, in every sample from `first` to `last`.
struct ReadyRun {
    msg: i64,
    queue: usize,
    first: f64,
    last: f64,
}

/// Runs shorter than this cannot hold two empty claims after the margin: not kept.
const LONG_RUN: f64 = 2.0;

fn sampler(sh: Arc<Shared>) -> (Vec<ReadyRun>, u64) {
    let mut conn = Conn::new(&sh);
    // msg_id -> (queue, attempt, first seen (after the sample), last seen (before the sample))
    let mut open: HashMap<i64, (usize, i32, f64, f64)> = HashMap::new();
    let mut runs = vec![];
    let mut samples = 0;
    let close = |runs: &mut Vec<ReadyRun>, msg: i64, (queue, _, first, last): (usize, i32, f64, f64)| {
        if last - first >= LONG_RUN {
            runs.push(ReadyRun { msg, queue, first, last });
        }
    };
    let queues: Vec<&str> = QUEUES.to_vec();
    while !sh.stop.load(SeqCst) {
        let before = now();
        match conn.get().query(
            "SELECT msg_id, queue, attempt FROM pgqueue.messages WHERE state = 'ready' AND queue = ANY($1)",
            &[&queues],
        ) {
            Ok(rows) => {
                samples += 1;
                let after = now();
                let mut seen = HashSet::new();
                for r in rows {
                    let (msg, queue, attempt): (i64, &str, i32) = (r.get(0), r.get(1), r.get(2));
                    seen.insert(msg);
                    match open.get_mut(&msg) {
                        Some(o) if o.1 == attempt => o.3 = before,
                        _ => {
                            if let Some(old) = open.insert(msg, (queue_index(queue), attempt, after, before)) {
                                close(&mut runs, msg, old);
                            }
                        }
                    }
                }
                let gone: Vec<i64> = open.keys().filter(|m| !seen.contains(m)).copied().collect();
                for msg in gone {
                    let o = open.remove(&msg).unwrap();
                    close(&mut runs, msg, o);
                }
            }
            Err(e) if conn.lost(&e) => {
                for (msg, o) in open.drain() {
                    close(&mut runs, msg, o);
                }
            }
            Err(e) => sh.fail(format!("sampler: {e}")),
        }
        sleep_s(0.1 - (now() - before));
    }
    for (msg, o) in open.drain() {
        close(&mut runs, msg, o);
    }
    (runs, samples)
}

// ---------------------------------------------------------------------------------------
// The controller

struct Ctl<'a> {
    server: &'a Server,
    sh: Arc<Shared>,
    conn: Conn,
    kills: Vec<f64>,
    restarts: Vec<(f64, f64)>,
}

/// (ready, delayed, claimed with an ended lease, claimed) of the test's queues.
fn pending(c: &mut Client) -> (i64, i64, i64, i64) {
    let queues: Vec<&str> = QUEUES.to_vec();
    let r = c
        .query_one(
            "SELECT count(*) FILTER (WHERE state = 'ready'), count(*) FILTER (WHERE state = 'delayed'),
                    count(*) FILTER (WHERE state = 'claimed' AND lease_expires_at <= clock_timestamp()),
                    count(*) FILTER (WHERE state = 'claimed')
               FROM pgqueue.messages WHERE queue = ANY($1)",
            &[&queues],
        )
        .unwrap();
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

/// A checkpoint that failed: why, and the messages concerned.
struct Stuck {
    what: String,
    ids: Vec<i64>,
}

/// What the tables and the shared state say, for a failure message; and the ids of the
/// messages ready or delayed, then of those claimed with the lease ended.
fn diagnose(c: &mut Client) -> (String, Vec<i64>) {
    let queues: Vec<&str> = QUEUES.to_vec();
    let mut s = String::from("messages (first 30):\n");
    for r in c
        .query(
            "SELECT row_to_json(m)::text FROM (
                 SELECT msg_id, queue, priority, state, attempt, visible_at, lease_expires_at, clock_timestamp() AS at
                   FROM pgqueue.messages WHERE queue = ANY($1) ORDER BY queue, priority DESC, msg_id LIMIT 30) m",
            &[&queues],
        )
        .unwrap()
    {
        s += &format!("  {}\n", r.get::<_, String>(0));
    }
    let ids: Vec<i64> = c
        .query(
            "SELECT msg_id FROM pgqueue.messages WHERE queue = ANY($1) AND state <> 'claimed' ORDER BY msg_id",
            &[&queues],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    // Which of them someone holds locked (a claim skips those).
    c.batch_execute("BEGIN").unwrap();
    let free: BTreeSet<i64> = c
        .query(
            "SELECT msg_id FROM pgqueue.message_rows WHERE queue = ANY($1) AND state <> 'claimed' FOR UPDATE SKIP LOCKED",
            &[&queues],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    c.batch_execute("ROLLBACK").unwrap();
    let locked: Vec<&i64> = ids.iter().filter(|id| !free.contains(id)).collect();
    s += &format!("ready or delayed: {ids:?}; of which locked by someone: {locked:?}\n");
    // Claims whose lease has ended are stuck too: their stories are told as well.
    let expired: Vec<i64> = c
        .query(
            "SELECT msg_id FROM pgqueue.messages
              WHERE queue = ANY($1) AND state = 'claimed' AND lease_expires_at <= clock_timestamp() ORDER BY msg_id",
            &[&queues],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    s += &format!("claimed with the lease ended: {expired:?}\n");
    let ids: Vec<i64> = ids.into_iter().chain(expired).collect();
    for q in QUEUES {
        let hints: String =
            c.query_one("SELECT row_to_json(s)::text FROM pgqueue._claim_start($1) s", &[&q]).unwrap().get(0);
        s += &format!("claim start of {q}: {hints}\n");
    }
    for r in c.query("SELECT row_to_json(d)::text FROM pgqueue.queue_depth d", &[]).unwrap() {
        s += &format!("queue_depth: {}\n", r.get::<_, String>(0));
    }
    for r in c
        .query(
            "SELECT row_to_json(a)::text FROM (
                 SELECT pid, backend_type, state, xact_start, left(query, 100) AS query FROM pg_stat_activity
                  WHERE datname = current_database() AND state IS DISTINCT FROM 'idle' AND pid <> pg_backend_pid()) a",
            &[],
        )
        .unwrap()
    {
        s += &format!("session: {}\n", r.get::<_, String>(0));
    }
    let w: String = c.query_one("SELECT row_to_json(w)::text FROM pgqueue.worker_stats w", &[]).unwrap().get(0);
    (s + &format!("worker_stats: {w}\n"), ids)
}

impl Ctl<'_> {
    fn check_failures(&self) {
        let failures = self.sh.failures.lock().unwrap().clone();
        assert!(failures.is_empty(), "a thread failed: {failures:#?}");
    }

    fn run_for(&mut self, secs: f64) {
        let until = now() + secs;
        while now() < until {
            self.check_failures();
            sleep_s((until - now()).min(0.1));
        }
        self.check_failures();
    }

    fn pause(&mut self) {
        let generation = self.sh.pause_gen.fetch_add(1, SeqCst) + 1;
        self.sh.paused.store(true, SeqCst);
        let start = now();
        while self.sh.seen.iter().any(|s| s.load(SeqCst) != generation) {
            self.check_failures();
            assert!(now() - start < 20.0, "the threads did not pause within 20 s");
            sleep_s(0.01);
        }
    }

    fn kill_worker(&mut self) {
        let rows = self
            .conn
            .get()
            .query(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
                  WHERE backend_type = 'pgqueue worker' AND datname = current_database()",
                &[],
            )
            .unwrap();
        assert!(rows.len() == 1 && rows[0].get::<_, bool>(0), "the worker was running and ended");
        self.kills.push(now());
        eprintln!("no_starvation: worker killed");
    }

    fn ticks(&mut self) -> i64 {
        self.conn.get().query_one("SELECT ticks FROM pgqueue.worker_state", &[]).unwrap().get(0)
    }

    fn worker(&mut self, on: bool) {
        if on {
            self.conn.get().batch_execute("ALTER SYSTEM RESET pgqueue.enabled").unwrap();
            self.conn.get().batch_execute("SELECT pg_reload_conf()").unwrap();
            let ticks = self.ticks();
            common::wait_for("the worker to tick again", Duration::from_secs(30), || {
                (self.ticks() > ticks + 1).then_some(())
            });
            self.sh.worker_off.store(false, SeqCst);
        } else {
            common::turn_workers_off(self.conn.get());
            self.sh.worker_off.store(true, SeqCst);
        }
        eprintln!("no_starvation: worker {}", if on { "enabled" } else { "disabled" });
    }

    fn restart(&mut self) {
        self.sh.restarting.store(true, SeqCst);
        self.sh.restart_epoch.fetch_add(1, SeqCst);
        let t0 = now();
        self.conn.client = None;
        self.server.stop();
        self.server.start();
        self.sh.restarting.store(false, SeqCst);
        let t1 = now();
        self.restarts.push((t0, t1));
        eprintln!("no_starvation: server restarted ({:.1} s)", t1 - t0);
    }

    /// Stage A of a checkpoint, right after the pause, before any lease or delay of the run
    /// ends and re-arms or promotions lower hints (and so rescue starved messages): a message
    /// ready, with the same attempt, in two samples, while two consumers' claims on its queue
    /// started after the first (plus 2 ticks + 0.3 s with the worker, which may repair a hint)
    /// and came back empty before the second, is starved. In a pause nothing returns to ready
    /// (no nack, no rollback, no redrive), so such a message was ready and free throughout.
    fn starved_at_pause(&mut self, name: &str, worker_on: bool) -> Result<(), Stuck> {
        let queues: Vec<&str> = QUEUES.to_vec();
        let sql = "SELECT msg_id, queue, attempt FROM pgqueue.messages WHERE state = 'ready' AND queue = ANY($1)";
        let sample = |c: &mut Client| -> HashMap<i64, (usize, i32)> {
            c.query(sql, &[&queues]).unwrap().iter().map(|r| (r.get(0), (queue_index(r.get(1)), r.get(2)))).collect()
        };
        let first = sample(self.conn.get());
        let from = now() + if worker_on { 2.0 * TICK + 0.3 } else { 0.0 };
        sleep_until(from + 0.8);
        let to = now();
        let second = sample(self.conn.get());
        let idle: Vec<BTreeSet<usize>> = {
            let empties = self.sh.empties.lock().unwrap();
            (0..QUEUES.len())
                .map(|q| {
                    empties
                        .iter()
                        .filter(|e| e.queue == q && e.t_req >= from && e.t_ret <= to)
                        .map(|e| e.consumer)
                        .collect()
                })
                .collect()
        };
        let mut starved: Vec<i64> = first
            .iter()
            .filter(|&(id, &(q, attempt))| second.get(id) == Some(&(q, attempt)) && idle[q].len() >= 2)
            .map(|(&id, _)| id)
            .collect();
        starved.sort_unstable();
        if starved.is_empty() {
            return Ok(());
        }
        let (d, _) = diagnose(self.conn.get());
        let what = format!(
            "checkpoint {name}: {starved:?} stayed ready for {:.2} s while claims of consumers {idle:?} (per queue) \
             came back empty",
            to - from
        );
        Err(Stuck { what: format!("{what}\n{d}"), ids: starved })
    }

    /// Everything but the consumers pauses (they only ack); once every lease and delay of the
    /// run has ended, nothing may stay claimable for longer than 2 ticks + 1 s (worker on) or
    /// 1.5 s (worker off, after one pgq_rearm); and once two consumers per queue have had a
    /// claim come back empty, nothing may be ready or delayed. Leaves the pause on.
    fn checkpoint(&mut self, name: &str, worker_on: bool) -> Result<(), Stuck> {
        let t0 = now();
        self.pause();
        let paused = now();
        self.starved_at_pause(name, worker_on)?;
        let queues: Vec<&str> = QUEUES.to_vec();
        // The claim ledger and the rows agree on every claim, both ways (fencing would raise
        // XX000 where a token meets a disagreement; this finds those no token met yet).
        let disagreeing = common::kit::ledger_disagreements(self.conn.get(), &queues);
        if !disagreeing.is_empty() {
            return Err(Stuck {
                what: format!("checkpoint {name}: the claim ledger and the rows disagree"),
                ids: disagreeing,
            });
        }
        // So do the held set in shared memory (shadowed) and the rows, wherever it vouches.
        let held = common::kit::held_disagreements(self.conn.get(), &queues);
        if !held.is_empty() {
            return Err(Stuck {
                what: format!("checkpoint {name}: the held set and the rows disagree: {held:?}"),
                ids: vec![],
            });
        }
        let r = self
            .conn
            .get()
            .query_one(
                "SELECT extract(epoch FROM clock_timestamp())::float8,
                        extract(epoch FROM max(lease_expires_at) FILTER (WHERE state = 'claimed'))::float8,
                        extract(epoch FROM max(visible_at) FILTER (WHERE state = 'delayed'))::float8
                   FROM pgqueue.messages WHERE queue = ANY($1)",
                &[&queues],
            )
            .unwrap();
        let mut settled =
            [r.get::<_, f64>(0), r.get::<_, Option<f64>>(1).unwrap_or(0.0), r.get::<_, Option<f64>>(2).unwrap_or(0.0)]
                .into_iter()
                .fold(0.0, f64::max);
        if !worker_on {
            // Nothing re-arms without the worker: one pgq_rearm, whose commit lowers the hints.
            sleep_until(settled + 0.05);
            self.conn.get().query_one("SELECT rearmed FROM pgqueue.pgq_rearm()", &[]).unwrap();
            settled = now();
        }
        let bound = if worker_on { 2.0 * TICK + 1.0 } else { 1.5 };
        let deadline = settled + bound;
        let mut drained = None;
        while drained.is_none() && now() < deadline {
            let (ready, delayed, expired, _) = pending(self.conn.get());
            if ready + delayed + expired == 0 && now() >= settled {
                drained = Some(now() - settled);
            } else {
                sleep_s(0.02);
            }
        }
        if drained.is_none() {
            let (d, ids) = diagnose(self.conn.get());
            let what =
                format!("checkpoint {name}: messages still claimable {bound} s after the last lease and delay ended");
            return Err(Stuck { what: format!("{what}\n{d}"), ids });
        }
        // An empty claim proves that its claim found nothing claimable.
        sleep_until(deadline);
        let idle = common::wait_for("two consumers per queue to find nothing", Duration::from_secs(10), || {
            let empties = self.sh.empties.lock().unwrap();
            (0..QUEUES.len())
                .all(|q| {
                    empties
                        .iter()
                        .filter(|e| e.queue == q && e.t_req >= deadline)
                        .map(|e| e.consumer)
                        .collect::<BTreeSet<_>>()
                        .len()
                        >= 2
                })
                .then(now)
        });
        let (ready, delayed, expired, _) = pending(self.conn.get());
        if ready + delayed + expired > 0 {
            let (d, ids) = diagnose(self.conn.get());
            let what = format!(
                "checkpoint {name}: consumers' claims come back empty while {ready} ready, {delayed} delayed and \
                 {expired} expired claims wait (all of them due for at least {bound} s)"
            );
            return Err(Stuck { what: format!("{what}\n{d}"), ids });
        }
        common::wait_for("the last claims to be acked", Duration::from_secs(5), || {
            (pending(self.conn.get()).3 == 0).then_some(())
        });
        let line = format!(
            "checkpoint {name}: paused in {:.2} s, settled {:.2} s later, drained {:.2} s after that (bound {bound:.1} s), \
             consumers idle {:.2} s after the bound",
            paused - t0,
            settled - paused,
            drained.unwrap(),
            idle - deadline
        );
        eprintln!("no_starvation: {line}");
        Ok(())
    }
}

/// The load's threads.
struct Threads {
    producers: Vec<JoinHandle<Produced>>,
    consumers: Vec<JoinHandle<Consumed>>,
    redriver: JoinHandle<Redriven>,
    sampler: JoinHandle<(Vec<ReadyRun>, u64)>,
}

/// What they did; `failed` names those that panicked (their part is then empty).
struct Joined {
    produced: Vec<Produced>,
    consumed: Vec<Consumed>,
    redriven: Redriven,
    runs: Vec<ReadyRun>,
    samples: u64,
    failed: Vec<String>,
}

impl Threads {
    fn start(sh: &Arc<Shared>, seed: u64) -> Threads {
        Threads {
            producers: (0..PRODUCERS)
                .map(|i| {
                    let sh = sh.clone();
                    std::thread::spawn(move || producer(sh, i, seed))
                })
                .collect(),
            consumers: (0..CONSUMERS)
                .map(|i| {
                    let sh = sh.clone();
                    std::thread::spawn(move || consumer(sh, i, seed))
                })
                .collect(),
            redriver: {
                let sh = sh.clone();
                std::thread::spawn(move || redriver(sh))
            },
            sampler: {
                let sh = sh.clone();
                std::thread::spawn(move || sampler(sh))
            },
        }
    }

    fn join(self) -> Joined {
        fn take<T: Default>(failed: &mut Vec<String>, what: String, h: JoinHandle<T>) -> T {
            h.join().unwrap_or_else(|_| {
                failed.push(what);
                T::default()
            })
        }
        let mut failed = vec![];
        let produced: Vec<Produced> = (self.producers.into_iter().enumerate())
            .map(|(i, h)| take(&mut failed, format!("producer {i}"), h))
            .collect();
        let consumed: Vec<Consumed> = (self.consumers.into_iter().enumerate())
            .map(|(i, h)| take(&mut failed, format!("consumer {i}"), h))
            .collect();
        let redriven = take(&mut failed, "the redriver".into(), self.redriver);
        let (runs, samples) = take(&mut failed, "the sampler".into(), self.sampler);
        Joined { produced, consumed, redriven, runs, samples, failed }
    }
}

/// Everything the test did to the messages `ids` (at most 6 of them), in time order, and the
/// claims of their queue and priority around their last event.
fn story_of(ids: &[i64], produced: &[Produced], consumed: &[Consumed], redriven: &Redriven, t0: f64) -> String {
    let mut out = String::new();
    for &id in ids.iter().take(6) {
        let mut events: Vec<(f64, String)> = vec![];
        let mut key = None;
        for (p, prod) in produced.iter().enumerate() {
            for (s, how) in prod
                .committed
                .iter()
                .map(|s| (s, "committed"))
                .chain(prod.rolled_back.iter().map(|s| (s, "rolled back")))
            {
                if s.id == id {
                    key = Some((s.queue, s.priority));
                    events.push((
                        s.t,
                        format!(
                            "send {how} by producer {p}: {} priority {}{}",
                            QUEUES[s.queue],
                            s.priority,
                            if s.delayed { ", delayed" } else { "" }
                        ),
                    ));
                }
            }
        }
        for (i, cons) in consumed.iter().enumerate() {
            for c in cons.claims.iter().filter(|c| c.msg == id) {
                key = Some((c.queue, c.priority));
                events.push((
                    c.t_ret,
                    format!(
                        "claimed by consumer {i} ({:?}{}): asked {:.3}, lease to {:.3}, let go {:?}, token {}",
                        c.via,
                        if c.lost { ", lost" } else { "" },
                        c.t_req - t0,
                        c.lease - t0,
                        c.end.map(|e| format!("{:.3}", e - t0)),
                        c.token
                    ),
                ));
            }
            for o in cons.ops.iter().filter(|o| o.msg == id) {
                events.push((
                    o.t_req,
                    format!(
                        "{:?} by consumer {i}: {:?} (returned {:.3}), token {}",
                        o.what,
                        o.ok,
                        o.t_ret - t0,
                        o.token
                    ),
                ));
            }
        }
        for r in redriven.redrives.iter().filter(|r| r.ids.contains(&id)) {
            events.push((r.t_req, format!("redrive of {} messages: {:?}", r.ids.len(), r.ok)));
        }
        events.sort_by(|a, b| a.0.total_cmp(&b.0));
        out += &format!("msg_id {id}:\n");
        for (t, e) in &events {
            out += &format!("  {:9.3} {e}\n", t - t0);
        }
        // The claims that may have gone past it.
        if let (Some((queue, priority)), Some(&(last, _))) = (key, events.last()) {
            let mut near: Vec<(f64, String)> = vec![];
            for (i, cons) in consumed.iter().enumerate() {
                for c in cons.claims.iter().filter(|c| {
                    c.queue == queue && c.priority == priority && c.msg > id && (c.t_ret - last).abs() < 1.0
                }) {
                    near.push((
                        c.t_req,
                        format!("claim of {} by consumer {i} ({:?}): returned {:.3}", c.msg, c.via, c.t_ret - t0),
                    ));
                }
            }
            near.sort_by(|a, b| a.0.total_cmp(&b.0));
            out += &format!(
                "  claims of higher ids of {} priority {priority} within 1 s of that (first 20):\n",
                QUEUES[queue]
            );
            for (t, e) in near.iter().take(20) {
                out += &format!("  {:9.3} {e}\n", t - t0);
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// The test

#[test]
fn nothing_starves() {
    let _installed = common::connect();
    let seed = common::rng::seed_from("PGQUEUE_NO_STARVATION_SEED", "no_starvation");
    let started = Instant::now();

    // The claim ledger and the held set on, as the suite runs them on 17 and 18 (off on 15,
    // which runs the default): the checkpoints check both against the rows.
    let ledger = if this_major() == 15 { "pgqueue.claim_ledger = off" } else { "pgqueue.claim_ledger = on" };
    let server = Server::init(
        &bindir(this_major()),
        &[
            "shared_preload_libraries = 'pgqueue'",
            "pgqueue.tick_interval = '200ms'",
            "pgqueue.launcher_naptime = '200ms'",
            "max_connections = 100",
            ledger,
        ],
    );
    server.start();
    let _keep_log = KeepLog { server: &server, seed };
    server.connect("postgres").batch_execute(&format!("CREATE DATABASE {DB}")).unwrap();
    {
        let mut c = server.connect(DB);
        c.batch_execute("CREATE EXTENSION pgqueue").unwrap();
        for q in QUEUES {
            c.execute("SELECT pgqueue.pgq_create_queue($1, lease => '2 s', max_attempts => 1000)", &[&q]).unwrap();
        }
        common::wait_for("the worker to tick", Duration::from_secs(30), || {
            let ticks: i64 = c.query_one("SELECT ticks FROM pgqueue.worker_state", &[]).unwrap().get(0);
            (ticks > 0).then_some(())
        });
    }

    let sh = Arc::new(Shared {
        port: server.port,
        stop: AtomicBool::new(false),
        paused: AtomicBool::new(false),
        pause_gen: AtomicU64::new(0),
        seen: (0..PAUSABLE).map(|_| AtomicU64::new(0)).collect(),
        restarting: AtomicBool::new(false),
        restart_epoch: AtomicU64::new(0),
        worker_off: AtomicBool::new(false),
        failures: Mutex::new(vec![]),
        empties: Mutex::new(vec![]),
    });
    let _stop = StopGuard(sh.clone());
    let threads = Threads::start(&sh, seed);
    let mut ctl = Ctl { server: &server, sh: sh.clone(), conn: Conn::new(&sh), kills: vec![], restarts: vec![] };
    let run_started = now();
    let outcome = (|| -> Result<(), Stuck> {
        ctl.run_for(2.5);
        ctl.kill_worker();
        ctl.run_for(2.5);
        ctl.checkpoint("1 (worker killed 2.5 s before)", true)?;
        ctl.worker(false);
        ctl.sh.paused.store(false, SeqCst);
        ctl.run_for(5.0);
        ctl.checkpoint("2 (worker disabled: commit and abort callbacks alone)", false)?;
        ctl.worker(true);
        ctl.sh.paused.store(false, SeqCst);
        ctl.run_for(1.5);
        ctl.restart();
        ctl.run_for(3.0);
        ctl.checkpoint("3 (after the restart that lost the shared memory)", true)?;
        ctl.sh.paused.store(false, SeqCst);
        ctl.run_for(3.0);
        ctl.checkpoint("final", true)
    })();
    let run_ended = now();
    sh.stop.store(true, SeqCst);
    let Joined { produced, consumed, redriven, runs, samples, failed } = threads.join();
    if let Err(stuck) = outcome {
        let story = story_of(&stuck.ids, &produced, &consumed, &redriven, run_started);
        panic!("{}\nwhat the test did to them (times in s since the load started):\n{story}", stuck.what);
    }
    ctl.check_failures();
    assert!(failed.is_empty(), "threads failed: {failed:?}");

    let mut c = server.connect(DB);
    let problems = verify(&mut c, &ctl, &produced, &consumed, &redriven, &runs);

    // The counts.
    let committed: usize = produced.iter().map(|p| p.committed.len()).sum();
    let rolled_back: usize = produced.iter().map(|p| p.rolled_back.len()).sum();
    let claims: Vec<&Claim> = consumed.iter().flat_map(|c| &c.claims).collect();
    let ops: Vec<&Op> = consumed.iter().flat_map(|c| &c.ops).collect();
    let count_ops = |what: What, ok: Option<bool>| ops.iter().filter(|o| o.what == what && o.ok == ok).count();
    let w = c
        .query_one(
            "SELECT ticks, rearmed, promoted, hint_corrections, tick_failures, coalesce(last_error, '') FROM pgqueue.worker_stats",
            &[],
        )
        .unwrap();
    let (ticks, rearmed, promoted, corrections, tick_failures, last_error): (i64, i64, i64, i64, i64, String) =
        (w.get(0), w.get(1), w.get(2), w.get(3), w.get(4), w.get(5));
    eprintln!(
        "no_starvation [pg{}, seed {seed}] {:.1} s of load:\n  sends: {} transactions, {committed} messages committed, \
         {} transactions ({rolled_back} messages) rolled back, {} cut off by the restart and resolved\n  claims: {} \
         committed, {} claiming transactions rolled back, {} savepoints rolled back, {} empty\n  acks {}, nacks {} + {} \
         for later, fails {}, abandoned {}, refused (stale token) {}, cut off {}\n  redrives: {} calls, {} messages; \
         pgq_rearm by hand: {} re-armed\n  worker_stats: ticks {ticks}, rearmed {rearmed}, promoted {promoted}, \
         hint_corrections {corrections}, tick_failures {tick_failures} {last_error}\n  sampler: {samples} samples, \
         {} runs of 2 s+ ready checked",
        this_major(),
        run_ended - run_started,
        produced.iter().map(|p| p.txs).sum::<u64>(),
        produced.iter().map(|p| p.rollbacks).sum::<u64>(),
        produced.iter().map(|p| p.resolved).sum::<u64>(),
        claims.iter().filter(|c| matches!(c.via, Via::Plain | Via::Kept)).count(),
        consumed.iter().map(|c| c.rollbacks).sum::<u64>(),
        consumed.iter().map(|c| c.undos).sum::<u64>(),
        sh.empties.lock().unwrap().len(),
        count_ops(What::Ack, Some(true)),
        count_ops(What::Nack, Some(true)),
        count_ops(What::NackLater, Some(true)),
        count_ops(What::Fail, Some(true)),
        consumed.iter().map(|c| c.abandoned).sum::<u64>(),
        ops.iter().filter(|o| o.ok == Some(false)).count(),
        ops.iter().filter(|o| o.ok.is_none()).count(),
        redriven.redrives.len(),
        redriven.redrives.iter().map(|r| r.ids.len()).sum::<usize>(),
        redriven.rearmed,
        runs.len(),
    );
    assert!(
        problems.is_empty(),
        "{} problems (first 40):\n{}",
        problems.len(),
        problems.iter().take(40).cloned().collect::<Vec<_>>().join("\n")
    );
    assert!(committed > 1000 && count_ops(What::Ack, Some(true)) > 1000, "the load ran");
    if this_major() != 15 {
        // The checkpoints' held-set checks had a set to check: (exact, held, rebuilds, refused, passed over).
        let set = common::kit::held_set(&mut c).expect("claims through the ledger gave the database a held set");
        eprintln!("  held set at the end: {set:?}");
        assert!(set.2 > 0, "the worker rebuilt it (it knows nothing after the restart)");
    }

    drop(c);
    fifo_phase(&server, seed);
    race_phase(&server);
    eprintln!("no_starvation: done in {:.1} s", started.elapsed().as_secs_f64());
}

/// Everything but the checkpoints: nothing lost, nothing held twice, no run-time starvation.
fn verify(
    c: &mut Client,
    ctl: &Ctl,
    produced: &[Produced],
    consumed: &[Consumed],
    redriven: &Redriven,
    runs: &[ReadyRun],
) -> Vec<String> {
    let mut problems = vec![];
    let queues: Vec<&str> = QUEUES.to_vec();
    let mut committed: HashMap<i64, usize> = HashMap::new();
    for sent in produced.iter().flat_map(|p| &p.committed) {
        let id = sent.id;
        if committed.insert(id, sent.queue).is_some() {
            problems.push(format!("msg_id {id} was returned by two sends"));
        }
    }
    let rolled_back: HashSet<i64> = produced.iter().flat_map(|p| p.rolled_back.iter().map(|s| s.id)).collect();
    let left: Vec<i64> = c
        .query("SELECT msg_id FROM pgqueue.messages WHERE queue = ANY($1) ORDER BY 1", &[&queues])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    if !left.is_empty() {
        problems.push(format!("messages left after the drain: {left:?}"));
    }
    let mut history: HashMap<i64, Vec<(String, String)>> = HashMap::new();
    for r in c
        .query(
            "SELECT msg_id, outcome, coalesce(last_error, '') FROM pgqueue.history WHERE queue = ANY($1)",
            &[&queues],
        )
        .unwrap()
    {
        history.entry(r.get(0)).or_default().push((r.get(1), r.get(2)));
    }
    for id in committed.keys() {
        if !history.contains_key(id) && !left.contains(id) {
            problems.push(format!("msg_id {id} was committed and is gone (lost)"));
        }
    }
    for (id, rows) in &history {
        if rows.len() != 1 {
            problems.push(format!("msg_id {id} is in the history {} times: {rows:?}", rows.len()));
        }
        if !committed.contains_key(id) {
            let why = if rolled_back.contains(id) { "rolled back" } else { "never returned by a send" };
            problems.push(format!("msg_id {id} is in the history but was {why}"));
        }
    }

    let claims: Vec<&Claim> = consumed.iter().flat_map(|c| &c.claims).collect();
    let ops: Vec<&Op> = consumed.iter().flat_map(|c| &c.ops).collect();
    for claim in &claims {
        if !committed.contains_key(&claim.msg) {
            problems.push(format!("claimed msg_id {} was never committed by a send: {claim:?}", claim.msg));
        }
    }

    // Final fates.
    let mut redrives: HashMap<i64, Vec<f64>> = HashMap::new();
    for r in &redriven.redrives {
        if r.ok == Some(true) {
            for id in &r.ids {
                redrives.entry(*id).or_default().push(r.t_req);
            }
        }
    }
    let mut ops_of: HashMap<i64, Vec<&Op>> = HashMap::new();
    for op in &ops {
        ops_of.entry(op.msg).or_default().push(op);
    }
    let none = vec![];
    for (id, rows) in &history {
        let mine = ops_of.get(id).unwrap_or(&none);
        let sent = |what: What| mine.iter().filter(move |o| o.what == what && o.ok != Some(false));
        let acked = mine.iter().filter(|o| o.what == What::Ack && o.ok == Some(true)).count();
        if acked > 1 {
            problems.push(format!("msg_id {id} was acked {acked} times"));
        }
        let fails = sent(What::Fail).count();
        let redriven_n = redrives.get(id).map_or(0, Vec::len);
        if redriven_n > fails {
            problems.push(format!("msg_id {id} was redriven {redriven_n} times but failed only {fails} times"));
        }
        match rows[0].0.as_str() {
            "completed" => {
                if sent(What::Ack).count() == 0 {
                    problems.push(format!("msg_id {id} completed without an ack: {mine:?}"));
                }
            }
            "dead" => {
                if rows[0].1 != "failed by the consumer" {
                    problems.push(format!("msg_id {id} is dead: {}", rows[0].1));
                }
                let last_redrive = redrives.get(id).map_or(0.0, |t| t.iter().copied().fold(0.0, f64::max));
                if !sent(What::Fail).any(|o| o.t_req > last_redrive) {
                    problems
                        .push(format!("msg_id {id} was redriven and is dead without having failed since: {mine:?}"));
                }
            }
            other => problems.push(format!("msg_id {id}: outcome {other}")),
        }
    }
    for op in &ops {
        if op.ok == Some(true) && op.what == What::Ack && history.get(&op.msg).is_none_or(|h| h[0].0 != "completed") {
            problems.push(format!("msg_id {} was acked but is not completed: {:?}", op.msg, history.get(&op.msg)));
        }
    }

    // Never held twice at once. A claim is surely held from its return until its lease ends
    // or its holder lets go (ack, nack, fail, rollback sent), whichever is first.
    let by_token: HashMap<Uuid, &Claim> = claims.iter().map(|c| (c.token, *c)).collect();
    let mut released: HashMap<Uuid, f64> = HashMap::new();
    for op in &ops {
        let t = released.entry(op.token).or_insert(f64::INFINITY);
        *t = t.min(op.t_req);
        // The fence refuses a token only once its lease has ended.
        if op.ok == Some(false) {
            match by_token.get(&op.token) {
                Some(claim) if claim.lease > op.t_ret => problems.push(format!(
                    "{:?} of msg_id {} refused {:.3} s before its lease ended: {claim:?}",
                    op.what,
                    op.msg,
                    claim.lease - op.t_ret
                )),
                Some(_) => {}
                None => problems.push(format!("an operation on an unknown claim: {op:?}")),
            }
        }
    }
    let mut held: HashMap<i64, Vec<(f64, f64, &Claim)>> = HashMap::new();
    for claim in claims.iter().filter(|c| !c.lost) {
        let end = match claim.via {
            Via::RolledBack | Via::Undone => claim.end.unwrap_or(claim.t_ret),
            Via::Plain | Via::Kept => claim.lease.min(released.get(&claim.token).copied().unwrap_or(f64::INFINITY)),
        };
        held.entry(claim.msg).or_default().push((claim.t_ret, end, claim));
    }
    for (msg, list) in &held {
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if a.0 < b.1 && b.0 < a.1 {
                    problems.push(format!(
                        "msg_id {msg} held twice at once: consumer {} ({:?}, held {:.3}..{:.3}) and consumer {} \
                         ({:?}, held {:.3}..{:.3})",
                        a.2.consumer, a.2.via, a.0, a.1, b.2.consumer, b.2.via, b.0, b.1
                    ));
                }
            }
        }
    }

    // Starvation under load: a message ready and untouched while claims on its queue, started
    // 2 ticks + 0.3 s after it was seen ready, come back empty (two consumers at least).
    let mut claims_of: HashMap<i64, Vec<&Claim>> = HashMap::new();
    for claim in &claims {
        claims_of.entry(claim.msg).or_default().push(claim);
    }
    let empties = ctl.sh.empties.lock().unwrap();
    let chaos: Vec<(f64, f64)> = ctl
        .kills
        .iter()
        .map(|&k| (k - 1.0, k + 2.0))
        .chain(ctl.restarts.iter().map(|&(a, b)| (a - 1.0, b + 3.0)))
        .collect();
    for run in runs {
        if chaos.iter().any(|&(a, b)| run.first < b && a < run.last) {
            continue;
        }
        if claims_of.get(&run.msg).is_some_and(|l| l.iter().any(|c| c.t_req <= run.last && c.t_ret >= run.first)) {
            continue;
        }
        let (from, to) = (run.first + 2.0 * TICK + 0.3, run.last - 0.3);
        let idle: BTreeSet<usize> = empties
            .iter()
            .filter(|e| e.queue == run.queue && e.t_req >= from && e.t_ret <= to)
            .map(|e| e.consumer)
            .collect();
        if idle.len() >= 2 {
            problems.push(format!(
                "msg_id {} ({}) stayed ready and unclaimed for {:.1} s while consumers {idle:?} found nothing to claim",
                run.msg,
                QUEUES[run.queue],
                run.last - run.first
            ));
        }
    }
    problems
}

// ---------------------------------------------------------------------------------------
// Priority and FIFO order with one consumer

/// The claimable set of the FIFO phase's queue, as it must be.
#[derive(Default)]
struct Fifo {
    /// (-priority, msg_id): claim order.
    ready: BTreeSet<(i32, i64)>,
    /// msg_id -> (-priority, due time)
    delayed: BTreeMap<i64, (i32, f64)>,
    dead: BTreeMap<i64, i32>,
    /// Abandoned claims: msg_id -> (-priority, lease end).
    expiring: BTreeMap<i64, (i32, f64)>,
    committed: BTreeSet<i64>,
    rolled_back: BTreeSet<i64>,
    checked: usize,
}

type Got = Vec<(i64, i16)>;

impl Fifo {
    /// A claim of `qty` that ran between `t_ref` (its transaction started after it) and
    /// `t_ret` must return the first `qty` claimable messages by (priority DESC, msg_id);
    /// a delayed message due within 2 ms of that window may or may not count.
    fn check(&mut self, what: &str, t_ref: f64, t_ret: f64, qty: usize, got: &Got) {
        let mut claimable = self.ready.clone();
        let mut maybe = BTreeSet::new();
        for (&id, &(p, due)) in &self.delayed {
            if due <= t_ref - 0.002 {
                claimable.insert((p, id));
            } else if due <= t_ret + 0.002 {
                maybe.insert((p, id));
            }
        }
        for &(id, priority) in got {
            if maybe.contains(&(-i32::from(priority), id)) {
                claimable.insert((-i32::from(priority), id));
            }
        }
        let expected: Got = claimable.iter().take(qty).map(|&(p, id)| (id, -p as i16)).collect();
        assert_eq!(
            got, &expected,
            "FIFO phase, {what} of {qty}: got {got:?}, expected {expected:?}; claimable (-priority, msg_id): \
             {claimable:?}, maybe due: {maybe:?}, abandoned: {:?}",
            self.expiring
        );
        self.checked += 1;
    }

    fn take(&mut self, got: &Got) {
        for &(id, priority) in got {
            let key = (-i32::from(priority), id);
            assert!(self.ready.remove(&key) || self.delayed.remove(&id).is_some(), "{id} was claimable");
        }
    }

    fn add(&mut self, c: &mut Client, sent: &[(i64, i16, bool)]) {
        for &(id, priority, delayed) in sent {
            self.committed.insert(id);
            if delayed {
                let due = due_time(c, id);
                self.delayed.insert(id, (-i32::from(priority), due));
            } else {
                self.ready.insert((-i32::from(priority), id));
            }
        }
    }
}

fn due_time(c: &mut Client, id: i64) -> f64 {
    c.query_one(
        "SELECT extract(epoch FROM visible_at)::float8 FROM pgqueue.messages WHERE msg_id = $1 AND state = 'delayed'",
        &[&id],
    )
    .unwrap()
    .get(0)
}

/// 1–3 messages of one priority (15 %: delayed 0.15–0.4 s) in `c`'s transaction.
fn fifo_send(c: &mut Client, rng: &mut Rng, q: &str, n: &mut u64) -> Vec<(i64, i16, bool)> {
    let k = rng.range(1, 3);
    let priority = rng.priority();
    let delay = if rng.chance(15) { rng.secs(0.15, 0.4) } else { 0.0 };
    let payloads: Vec<Value> = (0..k).map(|i| json!({ "f": *n + i })).collect();
    *n += k;
    c.query(
        "SELECT pgqueue.pgq_send_batch($1, $2, delay => make_interval(secs => $3), priority => $4)",
        &[&q, &payloads, &delay, &priority],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), priority, delay > 0.0))
    .collect()
}

/// (msg_id, priority) and tokens of a claim of `qty`, with its start and return times.
fn fifo_claim(c: &mut Client, q: &str, qty: i32, lease: &str) -> (Got, Vec<Uuid>, Vec<f64>, f64, f64) {
    let t_req = now();
    let rows = c
        .query(
            "SELECT msg_id, priority, claim_token, extract(epoch FROM lease_expires_at)::float8
               FROM pgqueue.pgq_claim($1, qty => $2, lease => $3::text::interval)",
            &[&q, &qty, &lease],
        )
        .unwrap();
    let t_ret = now();
    let got = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    (got, rows.iter().map(|r| r.get(2)).collect(), rows.iter().map(|r| r.get(3)).collect(), t_req, t_ret)
}

fn corrections(c: &mut Client, q: &str) -> i64 {
    c.query_one("SELECT hint_corrections FROM pgqueue.queue_depth WHERE queue = $1", &[&q]).unwrap().get(0)
}

/// One `pgq_tick()`: no step may fail, and its check may find no hint of the queue too high.
fn fifo_tick(c: &mut Client, q: &str) {
    let before = corrections(c, q);
    let failed: Vec<String> = c
        .query("SELECT step || ': ' || error FROM pgqueue.pgq_tick()", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(failed.is_empty(), "pgq_tick failed: {failed:?}");
    let after = corrections(c, q);
    assert_eq!(after, before, "the tick found a hint of {q} above a claimable message: a lowering was missed");
}

fn fifo_phase(server: &Server, seed: u64) {
    let q = "ns_fifo";
    let mut c = server.connect(DB);
    let mut p1 = server.connect(DB);
    let mut p2 = server.connect(DB);
    common::turn_workers_off(&mut c);
    c.execute("SELECT pgqueue.pgq_create_queue($1, lease => '2 s', max_attempts => 1000)", &[&q]).unwrap();
    let mut rng = Rng::new(seed, 999);
    let mut m = Fifo::default();
    let mut n = 0;
    let mut stats: BTreeMap<&str, usize> = BTreeMap::new();

    // A first message, then a tick: from then on the queue's claims start at their hints.
    let sent = fifo_send(&mut p1, &mut rng, q, &mut n);
    m.add(&mut p1, &sent);
    fifo_tick(&mut c, q);
    let tracked: bool = c.query_one("SELECT tracked FROM pgqueue.queue_depth WHERE queue = $1", &[&q]).unwrap().get(0);
    assert!(tracked, "the FIFO queue has hints");

    // p2's transaction stays open across steps: it commits lower ids after higher ones.
    let mut open: Option<Vec<(i64, i16, bool)>> = None;
    let until = now() + 5.0;
    let mut step = 0;
    while step < 400 && now() < until {
        step += 1;
        match rng.below(100) {
            0..25 => {
                let sent = fifo_send(&mut p1, &mut rng, q, &mut n);
                m.add(&mut p1, &sent);
                *stats.entry("sends").or_default() += 1;
            }
            25..35 => match open.take() {
                None => {
                    p2.batch_execute("BEGIN").unwrap();
                    open = Some(fifo_send(&mut p2, &mut rng, q, &mut n));
                }
                Some(sent) if rng.chance(75) => {
                    p2.batch_execute("COMMIT").unwrap();
                    let late = sent.iter().any(|&(id, ..)| m.committed.iter().any(|&other| other > id));
                    m.add(&mut p2, &sent);
                    *stats.entry(if late { "late commits" } else { "commits in order" }).or_default() += 1;
                }
                Some(sent) => {
                    p2.batch_execute("ROLLBACK").unwrap();
                    m.rolled_back.extend(sent.iter().map(|&(id, ..)| id));
                    *stats.entry("rolled-back sends").or_default() += 1;
                }
            },
            35..63 => {
                let qty = rng.range(1, 3) as usize;
                let (got, tokens, _, t_req, t_ret) = fifo_claim(&mut c, q, qty as i32, "2 s");
                m.check("claim", t_req, t_ret, qty, &got);
                m.take(&got);
                for (&(id, priority), token) in got.iter().zip(&tokens) {
                    let key = -i32::from(priority);
                    match rng.below(100) {
                        0..60 => {
                            let ok: bool = c
                                .query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&id, token])
                                .unwrap()
                                .get(0);
                            assert!(ok, "ack of {id}");
                        }
                        60..75 => {
                            let ok: bool = c
                                .query_one(
                                    "SELECT pgqueue.pgq_nack($1::bigint, $2::uuid, retry_in => '0')",
                                    &[&id, token],
                                )
                                .unwrap()
                                .get(0);
                            assert!(ok, "nack of {id}");
                            m.ready.insert((key, id));
                            *stats.entry("nacks").or_default() += 1;
                        }
                        75..87 => {
                            let later = rng.secs(0.15, 0.4);
                            let ok: bool = c
                                .query_one(
                                    "SELECT pgqueue.pgq_nack($1::bigint, $2::uuid, retry_in => make_interval(secs => $3))",
                                    &[&id, token, &later],
                                )
                                .unwrap()
                                .get(0);
                            assert!(ok, "nack of {id}");
                            let due = due_time(&mut c, id);
                            m.delayed.insert(id, (key, due));
                            *stats.entry("nacks for later").or_default() += 1;
                        }
                        _ => {
                            let ok: bool = c
                                .query_one("SELECT pgqueue.pgq_fail($1::bigint, $2::uuid)", &[&id, token])
                                .unwrap()
                                .get(0);
                            assert!(ok, "fail of {id}");
                            m.dead.insert(id, key);
                            *stats.entry("fails").or_default() += 1;
                        }
                    }
                }
            }
            63..68 => {
                // Abandoned: a short lease that ends; pgq_rearm brings it back (the worker is off).
                let qty = rng.range(1, 2) as usize;
                let (got, _, leases, t_req, t_ret) = fifo_claim(&mut c, q, qty as i32, "200 ms");
                m.check("claim", t_req, t_ret, qty, &got);
                m.take(&got);
                for (&(id, priority), &lease) in got.iter().zip(&leases) {
                    m.expiring.insert(id, (-i32::from(priority), lease));
                }
                *stats.entry("abandoned").or_default() += got.len();
            }
            68..73 => {
                let qty = rng.range(1, 3) as usize;
                let t_begin = now();
                c.batch_execute("BEGIN").unwrap();
                let (got, ..) = fifo_claim(&mut c, q, qty as i32, "2 s");
                m.check("claim in a transaction then rolled back", t_begin, now(), qty, &got);
                c.batch_execute("ROLLBACK").unwrap();
                *stats.entry("claims rolled back").or_default() += 1;
            }
            73..78 => {
                let qty = rng.range(1, 3) as usize;
                let t_begin = now();
                c.batch_execute("BEGIN; SAVEPOINT s").unwrap();
                let (undone, ..) = fifo_claim(&mut c, q, qty as i32, "2 s");
                m.check("claim in a savepoint then rolled back to it", t_begin, now(), qty, &undone);
                c.batch_execute("ROLLBACK TO SAVEPOINT s").unwrap();
                let (got, tokens, ..) = fifo_claim(&mut c, q, qty as i32, "2 s");
                m.check("claim after the rollback to the savepoint", t_begin, now(), qty, &got);
                c.batch_execute("COMMIT").unwrap();
                m.take(&got);
                for (&(id, _), token) in got.iter().zip(&tokens) {
                    let ok: bool =
                        c.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&id, token]).unwrap().get(0);
                    assert!(ok, "ack of {id}");
                }
                *stats.entry("savepoints rolled back").or_default() += 1;
            }
            78..83 if !m.dead.is_empty() => {
                let back: i64 = c.query_one("SELECT pgqueue.pgq_redrive($1)", &[&q]).unwrap().get(0);
                assert_eq!(back, m.dead.len() as i64, "pgq_redrive brings back every dead letter");
                for (id, key) in std::mem::take(&mut m.dead) {
                    m.ready.insert((key, id));
                }
                *stats.entry("redrives").or_default() += 1;
            }
            83..88 if !m.expiring.is_empty() => fifo_rearm(&mut c, &mut m, &mut stats),
            88..93 if m.expiring.is_empty() => {
                fifo_tick(&mut c, q);
                *stats.entry("ticks").or_default() += 1;
            }
            _ => sleep_s(rng.secs(0.02, 0.15)),
        }
    }

    // The end: everything comes out, in order.
    if let Some(sent) = open.take() {
        p2.batch_execute("COMMIT").unwrap();
        m.add(&mut p2, &sent);
    }
    loop {
        if !m.expiring.is_empty() {
            fifo_rearm(&mut c, &mut m, &mut stats);
        }
        if m.ready.is_empty() {
            match m.delayed.values().map(|&(_, due)| due).reduce(f64::max) {
                Some(due) => sleep_until(due + 0.01),
                None => break,
            }
        }
        let (got, tokens, _, t_req, t_ret) = fifo_claim(&mut c, q, 3, "2 s");
        m.check("claim", t_req, t_ret, 3, &got);
        m.take(&got);
        for (&(id, _), token) in got.iter().zip(&tokens) {
            let ok: bool = c.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&id, token]).unwrap().get(0);
            assert!(ok, "ack of {id}");
        }
    }
    let (got, _, _, t_req, t_ret) = fifo_claim(&mut c, q, 3, "2 s");
    m.check("claim of an empty queue", t_req, t_ret, 3, &got);
    fifo_tick(&mut c, q);
    let left: i64 = c.query_one("SELECT count(*) FROM pgqueue.messages WHERE queue = $1", &[&q]).unwrap().get(0);
    assert_eq!(left, 0, "the FIFO queue is empty");
    let done: BTreeSet<i64> = c
        .query("SELECT msg_id FROM pgqueue.history WHERE queue = $1 AND outcome = 'completed'", &[&q])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let dead: BTreeSet<i64> = c
        .query("SELECT msg_id FROM pgqueue.history WHERE queue = $1 AND outcome = 'dead'", &[&q])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(dead, m.dead.keys().copied().collect(), "the dead letters are the failed ones not redriven");
    let all: BTreeSet<i64> = done.union(&dead).copied().collect();
    assert_eq!(all, m.committed, "every committed message finished exactly once");
    assert!(m.rolled_back.is_disjoint(&all), "no rolled-back send's id appears");
    eprintln!("no_starvation: FIFO phase: {} claims checked, {n} messages sent; {stats:?}", m.checked);
}

/// Waits until every abandoned lease has ended, then re-arms them by hand.
fn fifo_rearm(c: &mut Client, m: &mut Fifo, stats: &mut BTreeMap<&str, usize>) {
    let last = m.expiring.values().map(|&(_, lease)| lease).fold(0.0, f64::max);
    sleep_until(last + 0.01);
    let (rearmed, dead): (i64, i64) = {
        let r = c.query_one("SELECT rearmed, dead_lettered FROM pgqueue.pgq_rearm()", &[]).unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((rearmed, dead), (m.expiring.len() as i64, 0), "pgq_rearm re-arms the abandoned claims");
    for (id, (key, _)) in std::mem::take(&mut m.expiring) {
        m.ready.insert((key, id));
    }
    *stats.entry("re-armed").or_default() += rearmed as usize;
}

// ---------------------------------------------------------------------------------------
// A message made claimable while a claim is in flight

/// What makes the message X claimable in a round of the race phase.
#[derive(Clone, Copy, Debug)]
enum Lowering {
    /// X's claim is nacked.
    Nack,
    /// The transaction holding X's claim rolls back.
    Rollback,
    /// The send of X commits after higher ids were committed.
    LateCommit,
    /// X, dead, is redriven.
    Redrive,
}

fn race_send(c: &mut Client, q: &str, n: i64) -> Vec<i64> {
    c.query("SELECT pgqueue.pgq_send_batch($1, array_fill('{}'::jsonb, ARRAY[$2::int]))", &[&q, &(n as i32)])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

fn race_claim(c: &mut Client, q: &str, qty: i32) -> Vec<(i64, Uuid)> {
    c.query("SELECT msg_id, claim_token FROM pgqueue.pgq_claim($1, qty => $2)", &[&q, &qty])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// `pgq_nack` (for now, not after the default back-off) or `pgq_fail` of a claim held.
fn race_finish(c: &mut Client, f: &str, held: (i64, Uuid)) {
    let retry = if f == "pgq_nack" { ", retry_in => '0'" } else { "" };
    let sql = format!("SELECT pgqueue.{f}($1::bigint, $2::uuid{retry})");
    let ok: bool = c.query_one(&sql, &[&held.0, &held.1]).unwrap().get(0);
    assert!(ok, "{f} of {}", held.0);
}

/// With the worker off (only the commit/abort callbacks move the hints), each kind of
/// lowering commits while another session's claim of 1000 is in flight, at a moment when
/// the queue's hint is already at or below X (so the lowering changes no hint value): the
/// claim either saw X (and took it, X being the lowest id) or must not leave the hint above
/// it — the next claim returns X. Holds whatever the timing; the pauses vary where the
/// commit lands. (A claim raises the hint past what it took only if no lowering happened
/// since it read the hint — the entry's epoch —, so a lowering must count as one even when
/// the hint is already low enough.)
fn race_phase(server: &Server) {
    let mut c = server.connect(DB);
    let mut holder = server.connect(DB);
    let mut other = server.connect(DB);
    let mut claimer = Some(server.connect(DB));
    let mut in_flight = 0;
    let mut rounds = 0;
    let mut failed: Vec<String> = vec![];
    for kind in [Lowering::Nack, Lowering::Rollback, Lowering::LateCommit, Lowering::Redrive] {
        for pause in [0.001, 0.003, 0.006, 0.012] {
            rounds += 1;
            let q = format!("ns_race_{rounds}");
            c.execute("SELECT pgqueue.pgq_create_queue($1, lease => '1 hour', max_attempts => 1000)", &[&q]).unwrap();
            let mut trace = vec![];
            let state = |c: &mut Client, step: &str, trace: &mut Vec<String>| {
                let s: String =
                    c.query_one("SELECT row_to_json(s)::text FROM pgqueue._claim_start($1) s", &[&q]).unwrap().get(0);
                trace.push(format!("{step}: {s}"));
            };
            // X, and y below it whose claim is given back so that the hint ends at y <= X.
            let x = match kind {
                Lowering::Nack | Lowering::Redrive => {
                    let ids = race_send(&mut c, &q, 2);
                    fifo_tick(&mut c, &q);
                    state(&mut c, "ticked", &mut trace);
                    let held = race_claim(&mut holder, &q, 2);
                    state(&mut c, "claimed", &mut trace);
                    assert_eq!(held.iter().map(|h| h.0).collect::<Vec<_>>(), ids);
                    if let Lowering::Redrive = kind {
                        race_finish(&mut holder, "pgq_fail", held[1]);
                    }
                    race_finish(&mut holder, "pgq_nack", held[0]);
                    (ids[1], Some(held[1]))
                }
                Lowering::Rollback => {
                    let ids = race_send(&mut c, &q, 2);
                    fifo_tick(&mut c, &q);
                    state(&mut c, "ticked", &mut trace);
                    let y = race_claim(&mut holder, &q, 1);
                    other.batch_execute("BEGIN").unwrap();
                    let x = race_claim(&mut other, &q, 1);
                    assert_eq!((y[0].0, x[0].0), (ids[0], ids[1]));
                    race_finish(&mut holder, "pgq_nack", y[0]);
                    (ids[1], None)
                }
                Lowering::LateCommit => {
                    race_send(&mut c, &q, 1);
                    fifo_tick(&mut c, &q);
                    state(&mut c, "ticked", &mut trace);
                    other.batch_execute("BEGIN").unwrap();
                    (race_send(&mut other, &q, 1)[0], None)
                }
            };
            let (x, x_held) = x;
            state(&mut c, "set up", &mut trace);
            race_send(&mut c, &q, 2000);
            state(&mut c, "2000 sent", &mut trace);
            let mut a = claimer.take().unwrap();
            let qa = q.clone();
            let big = std::thread::spawn(move || {
                let got: Vec<i64> = race_claim(&mut a, &qa, 1000).iter().map(|r| r.0).collect();
                (a, got)
            });
            sleep_s(pause);
            match kind {
                Lowering::Nack => race_finish(&mut holder, "pgq_nack", x_held.unwrap()),
                Lowering::Rollback => other.batch_execute("ROLLBACK").unwrap(),
                Lowering::LateCommit => other.batch_execute("COMMIT").unwrap(),
                Lowering::Redrive => {
                    let back: i64 = c.query_one("SELECT pgqueue.pgq_redrive($1)", &[&q]).unwrap().get(0);
                    assert_eq!(back, 1);
                }
            }
            let (a, got) = big.join().expect("the claim in flight");
            claimer = Some(a);
            state(&mut c, "after the claim in flight", &mut trace);
            if !got.contains(&x) {
                in_flight += 1;
                let next: Vec<i64> = race_claim(&mut c, &q, 1).iter().map(|r| r.0).collect();
                if next != vec![x] {
                    state(&mut c, "after the next claim", &mut trace);
                    failed.push(format!(
                        "{kind:?} (pause {pause} s): {x} became claimable while a claim of 1000 was in flight, and \
                         the next claim returned {next:?}; the queue's claim start after each step: {}",
                        trace.join("; ")
                    ));
                }
            }
            c.execute("SELECT pgqueue.pgq_drop_queue($1, force => true)", &[&q]).unwrap();
        }
    }
    eprintln!("no_starvation: race phase: {rounds} rounds, {in_flight} with the commit after the big claim's snapshot");
    assert!(failed.is_empty(), "race phase: {} rounds of {rounds} failed:\n{}", failed.len(), failed.join("\n"));
}
