//! The worker: a claim loop on one connection (waiting claims block it server-side), and a
//! task per message whose renewals and ack/nack/fail/park go through a second connection.
//!
//! Every statement is one unnamed statement with typed parameters (`query_typed`: parse,
//! bind and execute in one round trip), never a named prepared statement, so that the worker
//! works behind PgBouncer in transaction pooling mode, where consecutive statements of a
//! connection may run on different server connections.

use crate::producer::park_call;
use crate::{Error, HandlerError, Param, ParkOptions, Result, interval};
use serde_json::Value;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, SystemTime};
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::{JoinError, JoinSet};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Config, NoTls};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// What a worker runs and how. Built with [`WorkerConfig::new`] and the setters below.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    conninfo: String,
    queue: String,
    concurrency: usize,
    batch: Option<usize>,
    lease: Option<Duration>,
    wait: Duration,
    consumer: Option<String>,
    grace: Duration,
    max_backoff: Duration,
}

impl WorkerConfig {
    /// `conninfo`: a libpq-style `key=value` string or a `postgresql://` URL (no TLS).
    pub fn new(conninfo: impl Into<String>, queue: impl Into<String>) -> Self {
        WorkerConfig {
            conninfo: conninfo.into(),
            queue: queue.into(),
            concurrency: 10,
            batch: None,
            lease: None,
            wait: Duration::from_secs(30),
            consumer: None,
            grace: Duration::from_secs(30),
            max_backoff: Duration::from_secs(30),
        }
    }

    /// Handlers running at once (default 10).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// Most messages one claim takes, 1 … 1000 (default: `concurrency`, at most 1000). A
    /// claim never takes more than there are free handler slots.
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = Some(n);
        self
    }

    /// The lease of each claim and renewal (default: the queue's). Renewed every lease/3.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// How long one claim waits server-side for messages, more than 0 and at most 1 minute
    /// (default 30 s).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The consumer name recorded on claims (default `rust-<pid>`).
    pub fn consumer(mut self, name: impl Into<String>) -> Self {
        self.consumer = Some(name.into());
        self
    }

    /// How long a shutdown waits for running handlers before giving their messages back
    /// (default 30 s).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The longest pause between two reconnection attempts (default 30 s; doubling from 100 ms).
    pub fn max_backoff(mut self, max: Duration) -> Self {
        self.max_backoff = max;
        self
    }

    fn check(&self) -> Result<usize> {
        let invalid = |what: String| Err(Error::InvalidArgument(what));
        if self.concurrency == 0 {
            return invalid("concurrency must be at least 1".into());
        }
        let batch = self.batch.unwrap_or(self.concurrency.min(1000));
        if !(1..=1000).contains(&batch) {
            return invalid(format!("batch must be 1 … 1000, not {batch}"));
        }
        if self.wait.is_zero() || self.wait > Duration::from_secs(60) {
            return invalid(format!("wait must be more than 0 and at most 1 minute, not {:?}", self.wait));
        }
        if self.lease.is_some_and(|l| l.is_zero()) {
            return invalid("lease must be more than 0".into());
        }
        Ok(batch)
    }
}

/// A claimed message, as the handler gets it.
#[derive(Debug, Clone)]
pub struct Message {
    pub msg_id: i64,
    /// This claim's fencing token (the worker renews and acks with it).
    pub claim_token: Uuid,
    /// Claims of this message so far, this one included (1 on the first delivery).
    pub attempt: i32,
    pub priority: i16,
    pub payload: Value,
    /// As sent; a message that was parked ([`HandlerError::Park`], [`park`](crate::park)) has a
    /// `pgq_park` object: its park's `key`, `parked_at`, `timeout_at`, `on_timeout`,
    /// `payload`, and once resumed `signal` (the signal's payload), `signalled_at` and
    /// `resumed_at`, or `timed_out` and `resumed_at`.
    pub headers: Option<Value>,
    pub enqueued_at: SystemTime,
    /// When the lease ended at the claim (the worker extends it while the handler runs).
    pub lease_expires_at: SystemTime,
    /// Cancelled when the handler should stop: a renewal found the claim no longer held,
    /// because its cancel was requested (`pgq_cancel`) or it was lost. Check `is_cancelled()`
    /// between steps, or `select!` on `cancelled()`. The worker finishes the message as the
    /// handler returned; the server records a requested cancel as `cancelled` whatever the
    /// call (and changes nothing for a lost claim).
    pub stop: CancellationToken,
    reports: Arc<Reports>,
}

impl Message {
    /// Sets the job's result: when the handler returns `Ok`, the ack stores it
    /// (`pgq_ack(…, result => …)`) for [`result`](crate::result) to read. The last call counts.
    /// A result the server refuses (larger than `pgqueue.max_payload_bytes`, or a server before
    /// 0.16.0) is logged and the message acked without it: the work is done.
    pub fn set_result(&self, value: Value) {
        *lock(&self.reports.result) = Some(value);
    }

    /// Reports how far the job got: sent with the next lease renewal (within lease/3) and kept
    /// with the message for [`result`](crate::result) to read, also by a later attempt that
    /// resumes. A newer report replaces one not sent yet; one still unsent when the handler
    /// returns is dropped (its result is what counts), and so is one the server refuses.
    pub fn report_progress(&self, value: Value) {
        *lock(&self.reports.progress) = Some(value);
    }

    /// [`park`](crate::park) parked it: the claim ended, so the worker neither renews nor
    /// finishes it.
    pub(crate) fn mark_parked(&self) {
        self.reports.parked.store(true, Ordering::Relaxed);
    }
}

/// What a handler reports through its message (and its clones): the latest progress not sent
/// yet, which the next renewal takes, the result for the ack, and whether it parked the
/// message itself.
#[derive(Debug, Default)]
struct Reports {
    progress: std::sync::Mutex<Option<Value>>,
    result: std::sync::Mutex<Option<Value>>,
    parked: AtomicBool,
}

impl Reports {
    /// Progress whose renewal did not get through goes with the next one, unless a newer
    /// report came meanwhile.
    fn put_back(&self, progress: Value) {
        lock(&self.progress).get_or_insert(progress);
    }

    fn parked(&self) -> bool {
        self.parked.load(Ordering::Relaxed)
    }
}

fn lock(slot: &std::sync::Mutex<Option<Value>>) -> std::sync::MutexGuard<'_, Option<Value>> {
    // Held for a move in or out only, which cannot leave it half done.
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `handler` on the messages of one queue; see [`Worker::run`].
pub struct Worker<H> {
    config: WorkerConfig,
    handler: Arc<H>,
}

impl<H, F> Worker<H>
where
    H: Fn(Message) -> F + Send + Sync + 'static,
    F: Future<Output = std::result::Result<(), HandlerError>> + Send + 'static,
{
    pub fn new(config: WorkerConfig, handler: H) -> Self {
        Worker { config, handler: Arc::new(handler) }
    }

    /// Claims and handles messages until `shutdown` resolves: then it stops claiming (a
    /// waiting claim is cancelled), waits up to the grace period for running handlers, and
    /// gives back (`pgq_nack`, `retry_in => '0'`) the messages of those still running.
    ///
    /// Connection losses and server restarts are retried with capped exponential backoff.
    /// Returns an error only for what retrying cannot fix (an unknown queue: SQLSTATE
    /// 42704, missing privileges, a bad argument), after the same graceful stop.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let batch = self.config.check()?;
        let mut pg: Config = self.config.conninfo.parse()?;
        if pg.get_application_name().is_none() {
            pg.application_name("pgqueue-worker");
        }
        let shared = Arc::new(Shared {
            consumer: self.config.consumer.clone().unwrap_or_else(|| format!("rust-{}", std::process::id())),
            lease: self.config.lease.map(interval),
            config: self.config,
            pg,
            finisher: Mutex::new(None),
        });
        let slots = Arc::new(Semaphore::new(shared.config.concurrency));
        let (giveback, _) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);
        let mut claimer: Option<Client> = None;
        let mut backoff = FIRST_BACKOFF;
        let mut fatal = None;

        loop {
            // One free handler slot at least, then as many more as are free (up to batch).
            let first = tokio::select! {
                permit = slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
                () = &mut shutdown => break,
            };
            let mut permits = vec![first];
            while permits.len() < batch {
                match slots.clone().try_acquire_owned() {
                    Ok(permit) => permits.push(permit),
                    Err(_) => break,
                }
            }

            let client = match claimer.take() {
                Some(c) if !c.is_closed() => c,
                _ => {
                    let connected = tokio::select! {
                        c = connect(&shared.pg) => c,
                        () = &mut shutdown => break,
                    };
                    match connected {
                        Ok(c) => c,
                        Err(e) if e.is_transient() => {
                            log::warn!("pgqueue worker: cannot connect ({e}); retrying in {backoff:?}");
                            if pause(&mut backoff, shared.config.max_backoff, &mut shutdown).await {
                                break;
                            }
                            continue;
                        }
                        Err(e) => {
                            fatal = Some(e);
                            break;
                        }
                    }
                }
            };

            let mut stopping = false;
            let result = {
                let claim = claim(&client, &shared, permits.len());
                tokio::pin!(claim);
                tokio::select! {
                    r = &mut claim => r,
                    () = &mut shutdown => {
                        stopping = true;
                        // End the waiting claim now: it then holds nothing (57014), or returns
                        // what it got just before, handled (or given back) like the rest.
                        if let Err(e) = client.cancel_token().cancel_query(NoTls).await {
                            log::debug!("pgqueue worker: cancelling the waiting claim: {e}");
                        }
                        claim.await
                    }
                }
            };
            match result {
                Ok(claimed) => {
                    backoff = FIRST_BACKOFF;
                    claimer = Some(client);
                    // Slots beyond what was claimed are released as `permits` drops.
                    for (c, permit) in claimed.into_iter().zip(permits.drain(..)) {
                        let job = process(shared.clone(), self.handler.clone(), c, giveback.subscribe(), permit);
                        tasks.spawn(job);
                    }
                }
                Err(e) if stopping => log::debug!("pgqueue worker: the claim ended by the shutdown: {e}"),
                Err(e) if e.is_transient() => {
                    log::warn!("pgqueue worker: claim failed ({e}); reconnecting in {backoff:?}");
                    drop(permits);
                    if pause(&mut backoff, shared.config.max_backoff, &mut shutdown).await {
                        break;
                    }
                }
                Err(e) => {
                    fatal = Some(e);
                    break;
                }
            }
            if stopping {
                break;
            }
        }

        drop(claimer);
        let all_done = async { while tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(shared.config.grace, all_done).await.is_err() {
            log::info!("pgqueue worker: grace period over; giving back {} message(s) still held", tasks.len());
            giveback.send_replace(true);
            while tasks.join_next().await.is_some() {}
        }
        match fatal {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Sleeps `backoff` (then doubles it up to `max`); true when `shutdown` came first.
async fn pause(backoff: &mut Duration, max: Duration, shutdown: &mut (impl Future<Output = ()> + Unpin)) -> bool {
    let stop = tokio::select! {
        () = tokio::time::sleep(*backoff) => false,
        () = shutdown => true,
    };
    *backoff = (*backoff * 2).min(max);
    stop
}

async fn connect(pg: &Config) -> Result<Client> {
    let (client, connection) = pg.connect(NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            log::debug!("pgqueue worker: connection ended: {e}");
        }
    });
    Ok(client)
}

/// A claimed message and its lease (what was left of it when the claim returned).
struct Claimed {
    msg: Message,
    lease: Duration,
}

async fn claim(client: &Client, shared: &Shared, qty: usize) -> Result<Vec<Claimed>> {
    let c = &shared.config;
    // With the lease left when the claim returns: the lease granted (the queue's unless
    // configured), as it runs from the claim (pgqueue 0.6.0 and later), also after a wait.
    let sql = "SELECT msg_id, claim_token, attempt, priority, payload, headers, enqueued_at, lease_expires_at,
                      EXTRACT(epoch FROM lease_expires_at - clock_timestamp())::float8
                 FROM pgqueue.pgq_claim(queue => $1, qty => $2, lease => $3::interval, consumer => $4,
                                        wait => $5::interval)";
    let qty = qty as i32;
    let wait = interval(c.wait);
    let params: [Param; 5] = [
        (&c.queue, Type::TEXT),
        (&qty, Type::INT4),
        (&shared.lease, Type::TEXT),
        (&shared.consumer, Type::TEXT),
        (&wait, Type::TEXT),
    ];
    let rows = client.query_typed(sql, &params).await?;
    let secs = |s: f64| Duration::from_secs_f64(s.max(0.0));
    Ok(rows
        .iter()
        .map(|r| Claimed {
            msg: Message {
                msg_id: r.get(0),
                claim_token: r.get(1),
                attempt: r.get(2),
                priority: r.get(3),
                payload: r.get(4),
                headers: r.get(5),
                enqueued_at: r.get(6),
                lease_expires_at: r.get(7),
                stop: CancellationToken::new(),
                reports: Arc::default(),
            },
            lease: secs(r.get(8)),
        })
        .collect())
}

struct Shared {
    config: WorkerConfig,
    consumer: String,
    /// The configured lease as an interval literal; None: the queue's.
    lease: Option<String>,
    pg: Config,
    /// The connection for renewals and acks, (re)made on demand.
    finisher: Mutex<Option<Arc<Client>>>,
}

enum Op {
    Renew { progress: Option<Value> },
    Ack { result: Option<Value> },
    Nack { retry_in: Option<Duration>, error: String },
    Fail { error: String },
    Park { key: String, timeout: Duration, options: ParkOptions },
}

impl Op {
    /// The same op without the progress or result it carries; None if it carries none.
    fn without_report(&self) -> Option<Op> {
        match self {
            Op::Renew { progress: Some(_) } => Some(Op::Renew { progress: None }),
            Op::Ack { result: Some(_) } => Some(Op::Ack { result: None }),
            _ => None,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Renew { .. } => "renew",
            Op::Ack { .. } => "ack",
            Op::Nack { .. } => "nack",
            Op::Fail { .. } => "fail",
            Op::Park { .. } => "park",
        })
    }
}

/// `, <name> => $n` with `report` added to `params`; nothing without one, so that a call
/// without a report is what a server before 0.16.0 knows.
fn report<'a>(params: &mut Vec<Param<'a>>, name: &str, value: &'a Option<Value>) -> String {
    match value {
        Some(value) => {
            params.push((value, Type::JSONB));
            format!(", {name} => ${}", params.len())
        }
        None => String::new(),
    }
}

impl Shared {
    async fn finisher(&self) -> Result<Arc<Client>> {
        // Held while connecting: one reconnection, which the other tasks wait for.
        let mut slot = self.finisher.lock().await;
        if let Some(client) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(client.clone());
        }
        *slot = None;
        let client = Arc::new(connect(&self.pg).await?);
        *slot = Some(client.clone());
        Ok(client)
    }

    /// One try of `op`; true when the claim was still held (and now renewed or finished). A
    /// progress or result the server refuses (54000: larger than `pgqueue.max_payload_bytes`;
    /// 42883: a server before 0.16.0) is left out, and `op` made again without it. A park the
    /// server refuses (a bad key or timeout, a payload too large, a server before 0.18.0) is a
    /// nack with its error instead, so that the message is not left to its lease.
    async fn try_op(&self, op: &Op, id: i64, token: Uuid) -> Result<bool> {
        match (self.call(op, id, token).await, op.without_report()) {
            (Err(e), Some(plain)) if matches!(e.sqlstate(), Some("54000" | "42883")) => {
                log::error!("pgqueue worker: message {id}: its {op} was refused ({e}); made again without its report");
                self.call(&plain, id, token).await
            }
            (Err(e), _) if matches!(op, Op::Park { .. }) && !e.is_transient() => {
                log::error!("pgqueue worker: message {id}: its park was refused ({e}); nacking it");
                self.call(&Op::Nack { retry_in: None, error: format!("park refused: {e}") }, id, token).await
            }
            (result, _) => result,
        }
    }

    async fn call(&self, op: &Op, id: i64, token: Uuid) -> Result<bool> {
        let client = self.finisher().await?;
        // The queue-qualified forms: every call names its queue (pgqueue 0.14.0 and later).
        let queue: Param = (&self.config.queue, Type::TEXT);
        let row = match op {
            Op::Renew { progress } => {
                let mut params: Vec<Param> =
                    vec![(&id, Type::INT8), (&token, Type::UUID), (&self.lease, Type::TEXT), queue];
                let progress = report(&mut params, "progress", progress);
                let sql = format!(
                    "SELECT pgqueue.pgq_renew(queue => $4, msg_id => $1, claim_token => $2, lease => $3::interval{progress})"
                );
                client.query_typed_one(&sql, &params).await?
            }
            Op::Ack { result } => {
                let mut params: Vec<Param> = vec![(&id, Type::INT8), (&token, Type::UUID), queue];
                let result = report(&mut params, "result", result);
                let sql = format!("SELECT pgqueue.pgq_ack(queue => $3, msg_id => $1, claim_token => $2{result})");
                client.query_typed_one(&sql, &params).await?
            }
            Op::Nack { retry_in, error } => {
                let sql = "SELECT pgqueue.pgq_nack(queue => $5, msg_id => $1, claim_token => $2,
                                                   retry_in => $3::interval, error => $4)";
                let retry_in = retry_in.map(interval);
                let params: [Param; 5] =
                    [(&id, Type::INT8), (&token, Type::UUID), (&retry_in, Type::TEXT), (error, Type::TEXT), queue];
                client.query_typed_one(sql, &params).await?
            }
            Op::Fail { error } => {
                let sql = "SELECT pgqueue.pgq_fail(queue => $4, msg_id => $1, claim_token => $2, error => $3)";
                let params: [Param; 4] = [(&id, Type::INT8), (&token, Type::UUID), (error, Type::TEXT), queue];
                client.query_typed_one(sql, &params).await?
            }
            Op::Park { key, timeout, options } => {
                let options = ParkOptions { queue: Some(self.config.queue.clone()), ..options.clone() };
                return park_call(&*client, id, token, key, *timeout, options).await;
            }
        };
        Ok(row.get(0))
    }

    /// `op`, retried through connection losses until `until` (when the lease ends, after which
    /// the token is stale anyway). None: it did not get through (logged); the server
    /// redelivers the message once its lease ends.
    async fn op(&self, op: &Op, id: i64, token: Uuid, until: Instant) -> Option<bool> {
        let mut backoff = FIRST_BACKOFF;
        loop {
            match self.try_op(op, id, token).await {
                Ok(held) => return Some(held),
                Err(e) if e.is_transient() && Instant::now() + backoff < until => {
                    log::warn!("pgqueue worker: {op} of message {id} failed ({e}); retrying in {backoff:?}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.config.max_backoff);
                }
                Err(e) => {
                    log::error!(
                        "pgqueue worker: {op} of message {id} failed ({e}); it will be delivered again once its lease ends"
                    );
                    return None;
                }
            }
        }
    }
}

/// One message: the handler in a task of its own, its lease renewed every lease/3 meanwhile
/// (with the progress it reported), then ack (with its result), nack, fail or park by its
/// outcome — or given back if the worker stops first. A message the handler parked itself
/// ([`park`](crate::park)) is neither renewed nor finished from then on: its claim ended.
async fn process<H, F>(
    shared: Arc<Shared>,
    handler: Arc<H>,
    claimed: Claimed,
    mut giveback: watch::Receiver<bool>,
    permit: OwnedSemaphorePermit,
) where
    H: Fn(Message) -> F + Send + Sync + 'static,
    F: Future<Output = std::result::Result<(), HandlerError>> + Send + 'static,
{
    let Claimed { msg, lease } = claimed;
    let (id, token, stop, reports) = (msg.msg_id, msg.claim_token, msg.stop.clone(), msg.reports.clone());
    let mut lease_end = Instant::now() + lease;
    if lease.is_zero() {
        // Only a server before 0.6.0, where a waiting claim's lease ran from the statement's
        // start, hands out a lease that has already ended; renewals may still save it.
        log::warn!("pgqueue worker: message {id} was claimed with its lease already ended (pgqueue before 0.6.0?)");
    }
    let renew = async |lease_end: &mut Instant| -> bool {
        let asked = Instant::now();
        let renewal = Op::Renew { progress: lock(&reports.progress).take() };
        match shared.try_op(&renewal, id, token).await {
            Ok(true) => {
                *lease_end = asked + lease;
                true
            }
            Ok(false) => {
                log::warn!(
                    "pgqueue worker: message {id}: the renewal found the claim no longer held (its cancel requested, \
                     or lost: lease expired and re-armed); telling the handler to stop"
                );
                stop.cancel();
                false
            }
            Err(e) => {
                log::warn!("pgqueue worker: renewing message {id} failed ({e}); trying again");
                if let Op::Renew { progress: Some(progress) } = renewal {
                    reports.put_back(progress);
                }
                true
            }
        }
    };
    let mut job = tokio::spawn((handler)(msg));
    let period = (lease / 3).max(Duration::from_millis(100));
    let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut held = true;
    let outcome = loop {
        tokio::select! {
            done = &mut job => break Some(done),
            _ = ticks.tick(), if held && !reports.parked() => held = renew(&mut lease_end).await,
            Ok(()) = giveback.changed() => {
                job.abort();
                break None;
            }
        }
    };

    let op = match outcome {
        None => Op::Nack { retry_in: Some(Duration::ZERO), error: "worker stopped before the handler finished".into() },
        Some(Ok(Ok(()))) => Op::Ack { result: lock(&reports.result).take() },
        Some(Ok(Err(HandlerError::Retry { error, retry_in }))) => Op::Nack { retry_in, error },
        Some(Ok(Err(HandlerError::Permanent { error }))) => Op::Fail { error },
        Some(Ok(Err(HandlerError::Park { key, timeout, options }))) => Op::Park { key, timeout, options },
        Some(Err(e)) => Op::Nack { retry_in: None, error: panic_text(e) },
    };
    if reports.parked() {
        log::debug!("pgqueue worker: message {id} was parked by its handler; nothing to {op}");
    } else if shared.op(&op, id, token, lease_end).await == Some(false) {
        log::warn!(
            "pgqueue worker: message {id}: {op} found its claim lost (lease expired and re-armed, or finished \
             elsewhere): nothing changed; its work may be repeated"
        );
    }
    drop(permit);
}

fn panic_text(e: JoinError) -> String {
    match e.try_into_panic() {
        Ok(panic) => match panic.downcast_ref::<&str>() {
            Some(s) => format!("handler panicked: {s}"),
            None => match panic.downcast_ref::<String>() {
                Some(s) => format!("handler panicked: {s}"),
                None => "handler panicked".into(),
            },
        },
        Err(e) => format!("handler task ended: {e}"),
    }
}
