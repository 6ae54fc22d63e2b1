//! Sending: on the caller's client or transaction, so a message commits (or vanishes) with
//! the caller's own writes. Nothing here commits. Reading, or awaiting, what became of a
//! message ([`result`]), its dependencies ([`graph`]); parking a claimed message ([`park`])
//! and resuming what is parked on a key ([`signal`]).

use crate::{Error, Message, Param, Result, interval};
use serde_json::Value;
use std::fmt;
use std::time::{Duration, SystemTime};
use tokio_postgres::GenericClient;
use tokio_postgres::types::{ToSql, Type};
use uuid::Uuid;

/// Optional arguments of [`send`] and [`send_batch`]; what is None is left to the server's
/// defaults (README "SQL API").
#[derive(Debug, Clone, Default)]
pub struct SendOptions {
    /// Claimable this long after the commit.
    pub delay: Option<Duration>,
    /// −1000 … 1000, higher first.
    pub priority: Option<i16>,
    /// A JSON object (or any JSON) passed to the consumer beside the payload.
    pub headers: Option<Value>,
    /// [`send`] only: while a message of the queue holds this key, another send with it
    /// enqueues nothing and returns that message's id.
    pub dedup_key: Option<String>,
    /// [`send_batch`] only: one key (or None) per payload.
    pub dedup_keys: Option<Vec<Option<String>>>,
    /// How long a key stays taken after its message finished.
    pub dedup_for: Option<Duration>,
    /// Parents (msg_ids of committed messages, of any queue): the message is `pending` until
    /// every one has completed, then ready (or delayed until its `delay`). For [`send_batch`],
    /// every message of the batch waits for all of them. At most 10,000, each once; an unknown
    /// parent is SQLSTATE 23503. Needs pgqueue 0.17.0 or later.
    pub after: Option<Vec<i64>>,
    /// What becomes of the message if a parent fails instead of completing; None: the server's
    /// default, [`ParentFailure::Cancel`]. Needs pgqueue 0.17.0 or later.
    pub on_parent_failure: Option<ParentFailure>,
}

/// What becomes of a message sent with [`SendOptions::after`] when a parent fails (is
/// dead-lettered, cancelled, or deleted with its queue): `pgq_send`'s `on_parent_failure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ParentFailure {
    /// Cancelled (and its own children after their policies): the server's default.
    #[default]
    Cancel,
    /// Dead-lettered (and its own children after their policies).
    Dead,
    /// Runs all the same: the failed parent counts as done.
    Run,
}

impl ParentFailure {
    /// The SQL API's text: `cancel`, `dead` or `run`.
    pub fn as_str(self) -> &'static str {
        match self {
            ParentFailure::Cancel => "cancel",
            ParentFailure::Dead => "dead",
            ParentFailure::Run => "run",
        }
    }

    /// The policy named by the SQL API's text (as [`GraphRow::on_parent_failure`] has it).
    pub fn from_sql(text: &str) -> Option<Self> {
        match text {
            "cancel" => Some(ParentFailure::Cancel),
            "dead" => Some(ParentFailure::Dead),
            "run" => Some(ParentFailure::Run),
            _ => None,
        }
    }
}

impl fmt::Display for ParentFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `SELECT pgqueue.<function>(queue => $1, <first> => $2, …)` with only the options set.
///
/// Sent as one unnamed statement with typed parameters (`query_typed`), never a named
/// prepared statement: that is what works behind PgBouncer in transaction pooling mode.
struct Call {
    args: Vec<String>,
    params: Vec<(Box<dyn ToSql + Sync + Send>, Type)>,
}

impl Call {
    fn new() -> Self {
        Call { args: vec![], params: vec![] }
    }

    fn arg(&mut self, name: &str, ty: Type, value: impl ToSql + Sync + Send + 'static) {
        self.params.push((Box::new(value), ty));
        self.args.push(format!("{name} => ${}", self.params.len()));
    }

    /// A duration, sent as an interval literal in text (tokio-postgres has no interval type).
    fn interval(&mut self, name: &str, value: Duration) {
        self.params.push((Box::new(interval(value)), Type::TEXT));
        self.args.push(format!("{name} => ${}::interval", self.params.len()));
    }

    fn options(&mut self, opts: SendOptions) {
        if let Some(delay) = opts.delay {
            self.interval("delay", delay);
        }
        if let Some(priority) = opts.priority {
            self.arg("priority", Type::INT2, priority);
        }
        if let Some(headers) = opts.headers {
            self.arg("headers", Type::JSONB, headers);
        }
        if let Some(key) = opts.dedup_key {
            self.arg("dedup_key", Type::TEXT, key);
        }
        if let Some(keys) = opts.dedup_keys {
            self.arg("dedup_keys", Type::TEXT_ARRAY, keys);
        }
        if let Some(dedup_for) = opts.dedup_for {
            self.interval("dedup_for", dedup_for);
        }
        if let Some(after) = opts.after {
            self.arg("after", Type::INT8_ARRAY, after);
        }
        if let Some(policy) = opts.on_parent_failure {
            self.arg("on_parent_failure", Type::TEXT, policy.as_str());
        }
    }

    fn params(&self) -> Vec<Param<'_>> {
        self.params.iter().map(|(p, ty)| (p.as_ref() as &(dyn ToSql + Sync), ty.clone())).collect()
    }
}

/// Enqueues one message on `client` (a `Client` in autocommit, or a `Transaction`: then it is
/// visible when that transaction commits). Returns its msg_id.
///
/// With [`SendOptions::after`] it waits for its parents (state `pending`); the options not set
/// are not sent, so a send without them works with servers before 0.17.0.
pub async fn send(client: &impl GenericClient, queue: &str, payload: &Value, opts: SendOptions) -> Result<i64> {
    if opts.dedup_keys.is_some() {
        return Err(Error::InvalidArgument("send takes dedup_key; dedup_keys is for send_batch".into()));
    }
    let mut call = Call::new();
    call.arg("queue", Type::TEXT, queue.to_owned());
    call.arg("payload", Type::JSONB, payload.clone());
    call.options(opts);
    let sql = format!("SELECT pgqueue.pgq_send({})", call.args.join(", "));
    Ok(client.query_typed_one(&sql, &call.params()).await?.get(0))
}

/// Enqueues many messages in one statement (at most 10,000). Returns their msg_ids in the
/// order of `payloads`. With [`SendOptions::after`], each of them waits for all the parents.
pub async fn send_batch(
    client: &impl GenericClient,
    queue: &str,
    payloads: &[Value],
    opts: SendOptions,
) -> Result<Vec<i64>> {
    if opts.dedup_key.is_some() {
        return Err(Error::InvalidArgument(
            "send_batch takes dedup_keys (one per payload); dedup_key is for send".into(),
        ));
    }
    if let Some(keys) = &opts.dedup_keys
        && keys.len() != payloads.len()
    {
        return Err(Error::InvalidArgument(format!(
            "dedup_keys has {} keys for {} payloads",
            keys.len(),
            payloads.len()
        )));
    }
    let mut call = Call::new();
    call.arg("queue", Type::TEXT, queue.to_owned());
    call.arg("payloads", Type::JSONB_ARRAY, payloads.to_vec());
    call.options(opts);
    let sql = format!(
        "SELECT id FROM pgqueue.pgq_send_batch({}) WITH ORDINALITY AS t(id, n) ORDER BY n",
        call.args.join(", ")
    );
    let rows = client.query_typed(&sql, &call.params()).await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// What became of a message so far, as [`result`] reads it (`pgq_result`).
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// `pending` (waiting for its parents: [`SendOptions::after`]), `ready`, `delayed`,
    /// `parked` (waiting for a signal: [`park`]) or `claimed` while it waits or runs; once
    /// finished, its outcome: `completed`, `dead` or `cancelled`.
    pub state: String,
    /// Claims of it so far.
    pub attempt: i32,
    /// What its ack stored (completed messages only): [`Message::set_result`](crate::Message::set_result).
    pub result: Option<Value>,
    /// The latest progress its handlers reported (kept across retries):
    /// [`Message::report_progress`](crate::Message::report_progress).
    pub progress: Option<Value>,
    /// The last error: a nack's, a fail's, a cancel's reason.
    pub last_error: Option<String>,
    pub enqueued_at: SystemTime,
    /// Set once it finished.
    pub finished_at: Option<SystemTime>,
}

impl Outcome {
    /// Whether the message finished (`state` is then its outcome).
    pub fn finished(&self) -> bool {
        self.finished_at.is_some()
    }
}

/// What became of message `msg_id` (of `queue`, if given): None when there is no such message
/// (or its history was pruned). With `wait` (at most 1 minute), a message not finished yet is
/// waited for: the call returns at the commit that finishes it, or when `wait` runs out with
/// the message as it is then (not [`finished`](Outcome::finished)). Waiting needs READ
/// COMMITTED (SQLSTATE 0A000 otherwise) and holds `client`'s connection meanwhile.
pub async fn result(
    client: &impl GenericClient,
    msg_id: i64,
    wait: Option<Duration>,
    queue: Option<&str>,
) -> Result<Option<Outcome>> {
    let mut call = Call::new();
    call.arg("msg_id", Type::INT8, msg_id);
    if let Some(wait) = wait {
        call.interval("wait", wait);
    }
    if let Some(queue) = queue {
        call.arg("queue", Type::TEXT, queue.to_owned());
    }
    let sql = format!(
        "SELECT state, attempt, result, progress, last_error, enqueued_at, finished_at FROM pgqueue.pgq_result({})",
        call.args.join(", ")
    );
    Ok(client.query_typed_opt(&sql, &call.params()).await?.map(|r| Outcome {
        state: r.get(0),
        attempt: r.get(1),
        result: r.get(2),
        progress: r.get(3),
        last_error: r.get(4),
        enqueued_at: r.get(5),
        finished_at: r.get(6),
    }))
}

/// One message of a message's dependency graph, as [`graph`] reads it (`pgq_graph`).
#[derive(Debug, Clone, PartialEq)]
pub struct GraphRow {
    /// `message` (the message asked about), `parent` (one of its
    /// [`after`](SendOptions::after), in their order) or `child` (a message sent with it in
    /// its `after`, still in the queue).
    pub relation: String,
    /// Its msg_id.
    pub id: i64,
    /// None for a parent whose history was pruned (as are `state` and the times).
    pub queue: Option<String>,
    /// As [`Outcome::state`]: `pending`, `ready`, `delayed`, `parked` or `claimed` while in the
    /// queue, its outcome once finished.
    pub state: Option<String>,
    /// A child's policy (`cancel`, `dead`, `run`: [`ParentFailure::from_sql`]); the message's
    /// own while it has links to parents; None for a parent.
    pub on_parent_failure: Option<String>,
    pub enqueued_at: Option<SystemTime>,
    /// Set once it finished.
    pub finished_at: Option<SystemTime>,
}

impl GraphRow {
    /// Whether this message finished (`state` is then its outcome).
    pub fn finished(&self) -> bool {
        self.finished_at.is_some()
    }
}

/// The dependencies of message `msg_id`: the message itself first (`message`), then its
/// parents (`parent`), then its children still in the queue (`child`); empty when there is no
/// such message (or its history was pruned). Needs pgqueue 0.17.0 or later.
///
/// ```no_run
/// use pgqueue_client::{ParentFailure, SendOptions, graph, send};
/// use serde_json::json;
///
/// # async fn example(client: &tokio_postgres::Client) -> Result<(), pgqueue_client::Error> {
/// let extract = send(client, "etl", &json!({"step": "extract"}), SendOptions::default()).await?;
/// let load = SendOptions {
///     after: Some(vec![extract]),
///     on_parent_failure: Some(ParentFailure::Dead),
///     ..Default::default()
/// };
/// let load = send(client, "etl", &json!({"step": "load"}), load).await?;
/// for row in graph(client, load).await? {
///     println!("{} {} {:?}", row.relation, row.id, row.state); // message …, parent …
/// }
/// # Ok(()) }
/// ```
pub async fn graph(client: &impl GenericClient, msg_id: i64) -> Result<Vec<GraphRow>> {
    let mut call = Call::new();
    call.arg("msg_id", Type::INT8, msg_id);
    let sql = format!(
        "SELECT relation, id, queue, state, on_parent_failure, enqueued_at, finished_at FROM pgqueue.pgq_graph({})",
        call.args.join(", ")
    );
    let rows = client.query_typed(&sql, &call.params()).await?;
    Ok(rows
        .iter()
        .map(|r| GraphRow {
            relation: r.get(0),
            id: r.get(1),
            queue: r.get(2),
            state: r.get(3),
            on_parent_failure: r.get(4),
            enqueued_at: r.get(5),
            finished_at: r.get(6),
        })
        .collect())
}

/// What becomes of a parked message whose timeout passes with no signal: `pgq_park`'s
/// `on_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OnTimeout {
    /// Claimable again, with `"timed_out": true` in its `pgq_park` header: the server's default.
    #[default]
    Resume,
    /// Dead-lettered, with the error `parked, and no signal came before its timeout`.
    Dead,
}

impl OnTimeout {
    /// The SQL API's text: `resume` or `dead`.
    pub fn as_str(self) -> &'static str {
        match self {
            OnTimeout::Resume => "resume",
            OnTimeout::Dead => "dead",
        }
    }

    /// The policy named by the SQL API's text (as the `pgq_park` header's `on_timeout` has it).
    pub fn from_sql(text: &str) -> Option<Self> {
        match text {
            "resume" => Some(OnTimeout::Resume),
            "dead" => Some(OnTimeout::Dead),
            _ => None,
        }
    }
}

impl fmt::Display for OnTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Optional arguments of [`park`] and [`HandlerError::park`](crate::HandlerError::park); what
/// is None is left to the server's defaults, and not sent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParkOptions {
    /// Kept in the message's `pgq_park` header (as `payload`), for the handler that resumes it.
    pub payload: Option<Value>,
    /// What the timeout does; None: the server's default, [`OnTimeout::Resume`].
    pub on_timeout: Option<OnTimeout>,
    /// [`park`] only: the message's queue, checked by the server (a message of another queue is
    /// left as a stale token is; an unknown queue is SQLSTATE 42704). A worker parks its
    /// handlers' messages with its own queue.
    pub queue: Option<String>,
}

/// Parks a claimed message (`pgq_park`) on `client` (a `Client` in autocommit, or a
/// `Transaction`: then when that transaction commits): its claim ends, and it waits until
/// [`signal`] of `key` (1 to 512 characters) or until `timeout` (at most 365 days) passes.
/// Then it is claimable again — the claim that resumes it is not a new attempt — with a
/// `pgq_park` object in its headers: `key`, `parked_at`, `timeout_at`, `on_timeout`, `payload`,
/// and `signal` (the signal's payload), `signalled_at`, `resumed_at` after a signal, or
/// `timed_out`, `resumed_at` after the timeout ([`OnTimeout::Resume`]; [`OnTimeout::Dead`]
/// dead-letters it instead). A signal of `key` still kept resumes it at once.
///
/// False: the claim was no longer held under `msg.claim_token` (lost, or a message of another
/// queue than [`ParkOptions::queue`]); nothing changed. A bad key or timeout is SQLSTATE 22023.
/// Inside a [`Worker`](crate::Worker)'s handler, returning
/// [`HandlerError::park`](crate::HandlerError::park) is simpler; a message this call parked is
/// neither renewed nor finished by the worker afterwards (if the park's transaction rolls back,
/// its lease runs out and it is claimed again). Needs pgqueue 0.18.0 or later.
///
/// ```no_run
/// use pgqueue_client::{Message, ParkOptions, park};
/// use serde_json::json;
/// use std::time::Duration;
///
/// # async fn example(client: &tokio_postgres::Client, msg: &Message) -> Result<(), pgqueue_client::Error> {
/// let opts = ParkOptions { payload: Some(json!({"waiting_for": "payment"})), ..Default::default() };
/// if !park(client, msg, "payment:42", Duration::from_secs(86_400), opts).await? {
///     println!("the claim was lost: someone else handles message {}", msg.msg_id);
/// }
/// # Ok(()) }
/// ```
pub async fn park(
    client: &impl GenericClient,
    msg: &Message,
    key: &str,
    timeout: Duration,
    opts: ParkOptions,
) -> Result<bool> {
    let parked = park_call(client, msg.msg_id, msg.claim_token, key, timeout, opts).await?;
    if parked {
        msg.mark_parked();
    }
    Ok(parked)
}

/// `pgq_park` with only the options set (shared with the worker).
pub(crate) async fn park_call(
    client: &impl GenericClient,
    msg_id: i64,
    claim_token: Uuid,
    key: &str,
    timeout: Duration,
    opts: ParkOptions,
) -> Result<bool> {
    let mut call = Call::new();
    call.arg("msg_id", Type::INT8, msg_id);
    call.arg("claim_token", Type::UUID, claim_token);
    call.arg("key", Type::TEXT, key.to_owned());
    call.interval("timeout", timeout);
    if let Some(payload) = opts.payload {
        call.arg("payload", Type::JSONB, payload);
    }
    if let Some(on_timeout) = opts.on_timeout {
        call.arg("on_timeout", Type::TEXT, on_timeout.as_str());
    }
    if let Some(queue) = opts.queue {
        call.arg("queue", Type::TEXT, queue);
    }
    let sql = format!("SELECT pgqueue.pgq_park({})", call.args.join(", "));
    Ok(client.query_typed_one(&sql, &call.params()).await?.get(0))
}

/// Resumes every message parked on `key` (`pgq_signal`): claimable again (waiting claims are
/// woken at the commit), with `payload` as `signal` in their `pgq_park` header; returns how
/// many. The signal is kept for `keep` (None: the server's default, 1 day; zero: not kept), and
/// a message parked on `key` meanwhile resumes at once with it; a signal of a key whose signal
/// is still kept changes nothing (a signal sent twice is one signal). Producers and consumers
/// may both call it. A bad key (not 1 to 512 characters) or a `keep` over 365 days is SQLSTATE
/// 22023. Needs pgqueue 0.18.0 or later.
///
/// ```no_run
/// use pgqueue_client::signal;
/// use serde_json::json;
///
/// # async fn example(client: &tokio_postgres::Client) -> Result<(), pgqueue_client::Error> {
/// let resumed = signal(client, "payment:42", Some(&json!({"paid": true})), None).await?;
/// println!("{resumed} message(s) resumed");
/// # Ok(()) }
/// ```
pub async fn signal(
    client: &impl GenericClient,
    key: &str,
    payload: Option<&Value>,
    keep: Option<Duration>,
) -> Result<i64> {
    let mut call = Call::new();
    call.arg("key", Type::TEXT, key.to_owned());
    if let Some(payload) = payload {
        call.arg("payload", Type::JSONB, payload.clone());
    }
    if let Some(keep) = keep {
        call.interval("keep", keep);
    }
    let sql = format!("SELECT pgqueue.pgq_signal({})", call.args.join(", "));
    Ok(client.query_typed_one(&sql, &call.params()).await?.get(0))
}
