//! The claim: `pgq_claim` and `pgq_ack_claim` (declared in `sql/claim.sql`), a few kept
//! statements around the shared state, and that state's side of it: where to start scanning
//! each priority, handing rows out one at a time, noting what was claimed, and whether
//! delayed messages may be due.

use crate::dispatch::DUE_NEVER;
use crate::in_flight::Holds;
use crate::on_rows;
use crate::pending::{self, Kind, Note};
use crate::queue_state::{self, Key, State};
use crate::statement::{OnRows, Rows, Statement};
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys::{
    self, BOOLOID, INT2OID, INT4ARRAYOID, INT4OID, INT8ARRAYOID, INT8OID, INTERVALOID, JSONBARRAYOID, TEXTOID,
    TIMESTAMPTZOID, UUIDARRAYOID,
};
use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable, TypeOrigin,
};
use pgrx::prelude::*;
use pgrx::{AnyArray, Uuid};

/// Where a claim starts (also `legacy::_claim_start`).
pub struct Start {
    /// Per priority that may have claimable messages, highest first: the msg_id to start at.
    pub hints: Option<Vec<(i16, i64)>>,
    pub epoch: Option<i64>,
    pub seq: Option<i64>,
    pub promote: bool,
    /// No tick has checked the queue's hints yet (see `reconcile::check_unchecked`).
    pub unchecked: bool,
}

pub fn start(queue: &str) -> Start {
    let key = Key::new(queue);
    let read = |e: &mut queue_state::Entry| {
        let d = &e.dispatch;
        (d.hints(), d.epoch(), d.wake_seq(), d.next_due(), !d.is_known())
    };
    let state = key.and_then(|key| {
        queue_state::with_lock(false, |table| table.entry(&key, false).map(read))
            .flatten()
            .or_else(|| queue_state::with_lock(true, |table| table.entry(&key, true).map(read)).flatten())
    });
    match state {
        None => Start { hints: None, epoch: None, seq: None, promote: true, unchecked: false },
        Some((hints, epoch, seq, next_due, unchecked)) => {
            // SAFETY: a plain read; now() in SQL is this same timestamp.
            let now = unsafe { pg_sys::GetCurrentTransactionStartTimestamp() };
            let hints = hints.map(|(priorities, starts)| priorities.into_iter().zip(starts).collect());
            // Messages this transaction itself sent (or made claimable) are below no hint
            // yet: scan from the start, and raise nothing.
            if key.is_some_and(|key| pending::makes_ready_uncommitted(&key)) {
                Start { hints: None, epoch: None, seq: Some(seq as i64), promote: now >= next_due, unchecked: false }
            } else {
                let (epoch, seq) = (Some(epoch as i64), Some(seq as i64));
                Start { hints, epoch, seq, promote: now >= next_due, unchecked }
            }
        }
    }
}

/// Hands `msg_id` of `queue`'s `priority` to the claim asking, or refuses it: false once the
/// hint has passed it (another claim took it since this one read the hints). Called per row
/// before the claim locks any, so concurrent claims scanning from the same hint are handed
/// different rows instead of trying each other's locks (each try goes through the lock
/// manager, and locking a row a committed claim changed since the scan's snapshot would keep
/// that lock until commit, holding up its owner's ack). A claim that started from hints at
/// `epoch` raises the hint past each row it is handed, if no lowering happened since (as
/// `_claimed` did after the whole pick); a rollback lowers it again. Costly so that the
/// planner checks it after everything else.
#[pg_extern(volatile, parallel_unsafe, cost = 1000)]
fn _take(queue: &str, priority: i16, epoch: Option<i64>, msg_id: i64) -> bool {
    let Some(key) = Key::new(queue) else { return true };
    // PostgreSQL checks a row again once it has locked it if it changed since the snapshot:
    // the row this claim was just handed is still its own.
    if HANDED.get() == Some((key, priority, msg_id)) {
        return true;
    }
    let epoch = epoch.filter(|_| snapshot_per_statement()).map(|e| e as u64);
    // None: passed over; Some(raised). Untracked: handed (the claim scans from the start).
    let taken = queue_state::with_lock(false, |table| {
        table.entry(&key, false).map_or(Some(false), |entry| entry.dispatch.take(priority, epoch, msg_id))
    })
    .unwrap_or(Some(false));
    if taken.is_none() {
        return false;
    }
    HANDED.set(Some((key, priority, msg_id)));
    HANDED_NOW.with_borrow_mut(|ids| ids.push(msg_id));
    // Rolled back, the row is claimable again: the hint comes back down to it, raised by
    // this claim or not (another claim may have raised it past the row and skipped it,
    // locked; dispatch/tests.rs has the case).
    rollback_note(key, priority, msg_id);
    true
}

/// `_take` for claims that write only the claim ledger, whose held rows stay 'ready' (`number`:
/// the row's next claim number): a row the held set lists as held is not handed, so not locked
/// (its holder's ack would wait for this claim to end), and the hint passes it as it passes a
/// handed row (an end of that claim that leaves the row claimable lowers the hint again). A
/// row the set has free, or cannot vouch for, is `_take`'s; once locked, `free_of_holds` asks
/// again (a claim may have taken it between this call and the lock).
#[pg_extern(volatile, parallel_unsafe, cost = 1000)]
fn _take_free(queue: &str, priority: i16, epoch: Option<i64>, msg_id: i64, number: i32) -> bool {
    // The row re-checked after its lock (it changed since the snapshot) is this claim's, as
    // in `_take`: not asked about again.
    if HANDED.get().is_some_and(|(_, p, id)| p == priority && id == msg_id) {
        return _take(queue, priority, epoch, msg_id);
    }
    let holds = crate::held::holds(&[(msg_id, number)])[0];
    if matches!(holds, Holds::No | Holds::Ask) {
        return _take(queue, priority, epoch, msg_id);
    }
    let Some(key) = Key::new(queue) else { return false };
    let epoch = epoch.filter(|_| snapshot_per_statement()).map(|e| e as u64);
    let raised = queue_state::with_lock(false, |table| {
        table.entry(&key, false).and_then(|entry| entry.dispatch.take(priority, epoch, msg_id))
    });
    // A claim not yet settled may roll back, and its rollback may have lowered the hint to
    // the row just before this raised it again: then the row is looked at again once this
    // claim commits. Where the hint had passed it already, whoever raised it answers for it.
    if holds == Holds::Settling && raised.flatten() == Some(true) {
        skipped_note(key, priority, msg_id);
    }
    false
}

/// The held set's word on `msg_id` at claim `number`, for picks without hints (see
/// `_take_free`): false where it lists the row as held; true where it has it free or cannot
/// say (the ledger is asked once the row is locked). Such picks raise no hint, so a row
/// whose claim is settling needs no second look (its rollback lowers the hint itself).
/// `queue` and `priority` are unused since 0.24.1 (the SQL's calls name them).
#[pg_extern(volatile, parallel_unsafe, cost = 1000)]
fn _held_free(queue: &str, priority: i16, msg_id: i64, number: i32) -> bool {
    let _ = (queue, priority);
    matches!(crate::held::holds(&[(msg_id, number)])[0], Holds::No | Holds::Ask)
}

/// At rollback, lowers `priority`'s hint to `msg_id`, which this claim holds, and wakes a
/// waiting claim for it.
fn rollback_note(key: Key, priority: i16, msg_id: i64) {
    row_note(key, Kind::Claimed, priority, msg_id);
}

/// At commit, lowers `priority`'s hint to `msg_id`: this claim was handed the row, raising
/// the hint past it, but another transaction held it locked. That one may leave it ready (a
/// stale ack, nack or renew whose row changed under its snapshot keeps the lock it took
/// until it ends, refused), and nothing else would bring the hint back to it before the
/// tick's check.
fn skipped_note(key: Key, priority: i16, msg_id: i64) {
    row_note(key, Kind::Skipped, priority, msg_id);
}

/// A note of one row: `kind` says when it lowers the hint (Claimed: at rollback; Skipped: at
/// commit).
fn row_note(key: Key, kind: Kind, priority: i16, msg_id: i64) {
    let mut note = Note::new(key, kind);
    note.priority = priority;
    note.low = msg_id;
    note.high = msg_id;
    note.count = 1;
    pending::record(note);
}

thread_local! {
    /// The row `_take` last handed out in this process.
    static HANDED: std::cell::Cell<Option<(Key, i16, i64)>> = const { std::cell::Cell::new(None) };
    /// The rows `_take` handed out during the current pick statement.
    static HANDED_NOW: std::cell::RefCell<Vec<i64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Readers that keep one snapshot for the whole transaction may not see messages committed
/// since: they must not raise anything.
pub fn snapshot_per_statement() -> bool {
    // SAFETY: a plain read of the transaction's isolation level.
    unsafe { pg_sys::XactIsoLevel < pg_sys::XACT_REPEATABLE_READ as i32 }
}

/// Notes `n` messages of `priority` claimed (ids `low` to `high`, leases ending from
/// `expiry`): at commit the re-arm pass learns of them; a rollback makes them claimable, and
/// wakes waiting claims for `wakes` of them (0: each was noted as it was handed).
pub fn claimed_note(key: Key, priority: i16, (low, high): (i64, i64), n: i64, expiry: pg_sys::TimestampTz, wakes: i64) {
    let mut note = Note::new(key, Kind::Claimed);
    note.priority = priority;
    note.low = low;
    note.high = high;
    note.count = wakes;
    note.expiry = expiry;
    note.moved(n, Some(State::Ready), Some(State::Claimed));
    pending::record(note);
}

/// The epoch a promotion starts from (read before its snapshot).
#[pg_extern(volatile, parallel_unsafe)]
fn _due_epoch(queue: &str) -> Option<i64> {
    let key = Key::new(queue)?;
    queue_state::with_lock(true, |table| table.entry(&key, true).map(|e| e.dispatch.due_epoch() as i64)).flatten()
}

/// A promotion that started at `epoch` left nothing due before `next` (NULL: no delayed
/// message at all): claims skip promoting until then.
#[pg_extern(volatile, parallel_unsafe)]
fn _due_after(queue: &str, epoch: Option<i64>, next: Option<TimestampWithTimeZone>) -> bool {
    let (Some(key), Some(epoch)) = (Key::new(queue), epoch) else { return false };
    if !snapshot_per_statement() {
        return false;
    }
    let due = next.map_or(DUE_NEVER, pg_sys::TimestampTz::from);
    let raised = queue_state::with_lock(true, |table| {
        table.entry(&key, false).is_some_and(|e| e.dispatch.raise_due(epoch as u64, due))
    })
    .unwrap_or(false);
    if raised {
        // Rolled back, the promoted messages are due again.
        let mut note = Note::new(key, Kind::Other);
        note.forgets_due = true;
        pending::record(note);
    }
    raised
}

/// jsonb as it is stored (payload, headers), handed on without a conversion.
pub struct Jsonb(pg_sys::Datum);

impl IntoDatum for Jsonb {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(self.0)
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

// SAFETY: returns the datum as it is (it lives in the caller's context).
unsafe impl pgrx::callconv::BoxRet for Jsonb {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut pgrx::callconv::FcInfo<'fcx>) -> pgrx::datum::Datum<'fcx> {
        unsafe { fcinfo.return_raw_datum(self.0) }
    }
}

// SAFETY: a jsonb datum, declared as jsonb.
unsafe impl SqlTranslatable for Jsonb {
    const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!(Jsonb);
    const TYPE_ORIGIN: TypeOrigin = TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Ok(SqlMappingRef::literal("jsonb"));
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> = Ok(ReturnsRef::One(SqlMappingRef::literal("jsonb")));
}

/// A claimed message, as pgq_claim returns it.
type Claimed = (i64, Uuid, i32, i16, Jsonb, Option<Jsonb>, TimestampWithTimeZone, TimestampWithTimeZone);

static QUEUE: Statement =
    Statement { sql: c"SELECT q.lease, q.paused FROM pgqueue.queues q WHERE q.queue = $1", args: &[TEXTOID] };
/// Raises the queue's error (no such queue, a bad name); or it was created meanwhile.
static QUEUE_OR_ERROR: Statement =
    Statement { sql: c"SELECT q.lease, q.paused FROM pgqueue._queue($1) q", args: &[TEXTOID] };
static PROMOTE: Statement = Statement { sql: c"SELECT pgqueue._promote_due($1, 1000)", args: &[TEXTOID] };
/// The picks' text on `$rows`. `$number` and `$free`: what claims that write only the claim
/// ledger add (the next claim number of each row, and the rows to leave out).
macro_rules! pick_text {
    (all $rows:literal, $number:literal, $free:literal) => {
        crate::statement::text(concat!(
            "SELECT m.msg_id, m.priority",
            $number,
            " FROM ",
            $rows,
            " m
      WHERE m.queue = $1 AND m.state = 'ready'",
            $free,
            "
      ORDER BY m.priority DESC, m.msg_id
      LIMIT $2
        FOR UPDATE SKIP LOCKED\0"
        ))
    };
    (from $rows:literal, $number:literal, $free:literal, $take:literal) => {
        crate::statement::text(concat!(
            "SELECT m.msg_id",
            $number,
            " FROM ",
            $rows,
            " m
      WHERE m.queue = $1 AND m.state = 'ready' AND m.priority >= $2 AND m.priority <= $2
        AND m.msg_id >= $3",
            $free,
            " AND pgqueue.",
            $take,
            "
      ORDER BY m.priority DESC, m.msg_id
      LIMIT $5
        FOR UPDATE SKIP LOCKED\0"
        ))
    };
}
/// Without hints: from the start of the queue's claimable rows.
static PICK: OnRows = OnRows {
    rows: Statement { sql: pick_text!(all "pgqueue.message_rows", "", ""), args: &[TEXTOID, INT4OID] },
    table: Statement { sql: pick_text!(all "pgqueue.messages", "", ""), args: &[TEXTOID, INT4OID] },
};
/// From a priority's hint, each row handed to one claim (_take raises the hint past it
/// before this claim locks it), passing over what others took. The plan must read the ready
/// index in order and stop at its LIMIT (see pgq_claim's settings). The priority is bounded
/// on both sides rather than compared with `=`: with `=` the order by msg_id alone would do,
/// and the primary key gives that too, walking past every row at or above the hint that is
/// not ready (delayed, claimed, other queues', dead versions), which the planner, seeing one
/// queue of ready rows, may think cheaper. Bounded, only the ready index gives the order.
static PICK_FROM: OnRows = OnRows {
    rows: Statement {
        sql: pick_text!(from "pgqueue.message_rows", "", "", "_take($1, $2, $4, m.msg_id)"),
        args: PICK_FROM_ARGS,
    },
    table: Statement {
        sql: pick_text!(from "pgqueue.messages", "", "", "_take($1, $2, $4, m.msg_id)"),
        args: PICK_FROM_ARGS,
    },
};
const PICK_FROM_ARGS: &[pg_sys::Oid] = &[TEXTOID, INT2OID, INT8OID, INT8OID, INT4OID];
/// The same for claims that write only the claim ledger (0.24.0's SQL on), whose rows stay
/// 'ready', with each row's next claim number, past `$3` (without hints) or `$6` (from a
/// hint), the rows this call passed over: from a hint, past the rows the held set lists
/// (`_take_free`); without hints, past those too (`_held_free`) where the set is exact, else
/// past the rows the ledger holds (the queue's list, read once).
static PICK_FREE: Statement = Statement {
    sql: pick_text!(all "pgqueue.message_rows", ", m.claims_ended + 1",
        "
        AND m.msg_id NOT IN (SELECT h.msg_id FROM pgqueue._ledger_held h WHERE h.queue = $1
                             UNION ALL SELECT pg_catalog.unnest($3::bigint[]))"),
    args: &[TEXTOID, INT4OID, INT8ARRAYOID],
};
static PICK_FREE_BY_SET: Statement = Statement {
    sql: pick_text!(all "pgqueue.message_rows", ", m.claims_ended + 1",
        "
        AND m.msg_id NOT IN (SELECT pg_catalog.unnest($3::bigint[]))
        AND pgqueue._held_free($1, m.priority, m.msg_id, m.claims_ended + 1)"),
    args: &[TEXTOID, INT4OID, INT8ARRAYOID],
};
static PICK_FROM_FREE: Statement = Statement {
    sql: pick_text!(from "pgqueue.message_rows", ", m.claims_ended + 1",
        " AND m.msg_id NOT IN (SELECT pg_catalog.unnest($6::bigint[]))",
        "_take_free($1, $2, $4, m.msg_id, m.claims_ended + 1)"),
    args: &[TEXTOID, INT2OID, INT8OID, INT8OID, INT4OID, INT8ARRAYOID],
};
/// Which of the rows a claim locked (`$2`, at the claim numbers `$3` their rows are at) a
/// live ledger entry holds, where the held set cannot say: in a snapshot taken after the row
/// locks (`run_latest`, also in REPEATABLE READ), so a claim that committed meanwhile is seen.
/// It reads the queue's ledger rows (about one a claim call in flight), not their messages'
/// rows: the numbers are the rows' already.
static LEDGER_HOLDS: Statement = Statement {
    sql: c"SELECT e.msg_id
             FROM pgqueue.claims c, unnest(c.msg_ids, c.claim_numbers) AS e(msg_id, number),
                  unnest($2::bigint[], $3::integer[]) AS a(msg_id, number)
            WHERE c.queue = $1 AND e.msg_id = a.msg_id AND e.number = a.number",
    args: &[TEXTOID, INT8ARRAYOID, INT4ARRAYOID],
};
/// The next claim number of each of the rows `$1` (which the claim holds locked).
static NEXT_NUMBERS: Statement = Statement {
    sql: c"SELECT m.msg_id, m.claims_ended + 1 FROM pgqueue.message_rows m WHERE m.msg_id = ANY ($1)",
    args: &[INT8ARRAYOID],
};
/// Claims the picked rows and writes the call's claim ledger row (`pgqueue.claims`): the rows'
/// claim numbers (`claims_ended` + 1), read from the rows this claim holds locked, and their
/// tokens, which name the ledger row (ledger.rs). One statement, as before the ledger.
/// `$granted` and `$values`: the ledger's columns for what the call granted (0.23.0 on) and
/// their values, or nothing (the 0.22 SQL).
macro_rules! claim_with_ledger {
    ($granted:literal, $values:literal) => {
        Statement {
            sql: crate::statement::text(concat!(
                "WITH taken AS (
               SELECT m.msg_id, m.claims_ended + 1 AS number FROM pgqueue.message_rows m WHERE m.msg_id = ANY ($1)
           ), ledger AS (
               INSERT INTO pgqueue.claims (queue, msg_ids, claim_numbers, claimed_at",
                $granted,
                ")
               SELECT $7, pg_catalog.array_agg(t.msg_id ORDER BY t.msg_id),
                      pg_catalog.array_agg(t.number ORDER BY t.msg_id), $2",
                $values,
                "
                 FROM taken t
               RETURNING claim_id
           )
           UPDATE pgqueue.message_rows m
              SET state = 'claimed', attempt = m.attempt + 1,
                  claim_token = pgqueue._claim_token(
                      (SELECT k.key FROM pgqueue.claim_key k ORDER BY k.made_at, k.key LIMIT 1),
                      l.claim_id, m.msg_id, m.claims_ended + 1),
                  claimed_at = $2, lease_expires_at = $2 + $3, consumer = $4,
                  session_pid = $5, session_started = $6
             FROM ledger l
            WHERE m.msg_id = ANY ($1)
           RETURNING m.msg_id, m.claim_token, m.attempt, m.priority, m.payload, m.headers,
                     m.enqueued_at, m.lease_expires_at, m.claims_ended + 1\0"
            )),
            args: &[INT8ARRAYOID, TIMESTAMPTZOID, INTERVALOID, TEXTOID, INT4OID, TIMESTAMPTZOID, TEXTOID],
        }
    };
}
static CLAIM: Statement =
    claim_with_ledger!(", lease_expires_at, consumer, session_pid, session_started", ", $2 + $3, $4, $5, $6");
/// Claims the picked rows through the claim ledger alone (step 3b of the write path): the
/// rows stay as they are, 'ready' and locked by this claim until it commits (so that a cancel
/// or a drop waits for it and then reads the ledger); the ledger row holds the claim, its
/// lease and its session, and `pgqueue.messages` shows it. Returns what CLAIM returns.
static CLAIM_LEDGER_ONLY: Statement = Statement {
    sql: c"WITH taken AS (
               SELECT m.msg_id, m.claims_ended + 1 AS number FROM pgqueue.message_rows m WHERE m.msg_id = ANY ($1)
           ), ledger AS (
               INSERT INTO pgqueue.claims (queue, msg_ids, claim_numbers, claimed_at, lease_expires_at, consumer,
                                           session_pid, session_started)
               SELECT $7, pg_catalog.array_agg(t.msg_id ORDER BY t.msg_id),
                      pg_catalog.array_agg(t.number ORDER BY t.msg_id), $2, $2 + $3, $4, $5, $6
                 FROM taken t
               RETURNING claim_id
           )
           SELECT m.msg_id,
                  pgqueue._claim_token((SELECT k.key FROM pgqueue.claim_key k ORDER BY k.made_at, k.key LIMIT 1),
                                       l.claim_id, m.msg_id, m.claims_ended + 1),
                  m.attempt + 1, m.priority, m.payload, m.headers, m.enqueued_at, $2 + $3, m.claims_ended + 1
             FROM pgqueue.message_rows m, ledger l
            WHERE m.msg_id = ANY ($1)",
    args: &[INT8ARRAYOID, TIMESTAMPTZOID, INTERVALOID, TEXTOID, INT4OID, TIMESTAMPTZOID, TEXTOID],
};
static CLAIM_0_22: Statement = claim_with_ledger!("", "");
/// The same without the ledger (`pgqueue.claim_ledger` off, the default; a claim of one
/// message with it on; or a database still running 0.21's SQL or earlier until ALTER
/// EXTENSION UPDATE, whose fencing counts claims otherwise): random tokens ($7, the queue,
/// unused).
static CLAIM_WITHOUT_LEDGER: OnRows = on_rows!(
    &[INT8ARRAYOID, TIMESTAMPTZOID, INTERVALOID, TEXTOID, INT4OID, TIMESTAMPTZOID, TEXTOID];
    "UPDATE ", ROWS, " m
        SET state = 'claimed', claim_token = pg_catalog.gen_random_uuid(), attempt = m.attempt + 1,
            claimed_at = $2, lease_expires_at = $2 + $3, consumer = $4,
            session_pid = $5, session_started = $6
      WHERE m.msg_id = ANY ($1)
     RETURNING m.msg_id, m.claim_token, m.attempt, m.priority, m.payload, m.headers,
               m.enqueued_at, m.lease_expires_at");
static BACKEND_START: Statement =
    Statement { sql: c"SELECT a.backend_start FROM pg_catalog.pg_stat_get_activity($1) a", args: &[INT4OID] };
static DEADLINE: Statement = Statement { sql: c"SELECT pg_catalog.clock_timestamp() + $1", args: &[INTERVALOID] };
// The checks: run only when an argument is wrong (or may be), they raise its error.
static CHECK_QTY: Statement = Statement {
    sql: c"SELECT pgqueue._invalid('qty', pg_catalog.format('%s is not between 1 and 1000', pgqueue._require($1, 'qty')))",
    args: &[INT4OID],
};
static CHECK_LEASE: Statement = Statement { sql: c"SELECT pgqueue._check_lease($1)", args: &[INTERVALOID] };
static CHECK_SESSION_BOUND: Statement =
    Statement { sql: c"SELECT pgqueue._require($1, 'session_bound')", args: &[BOOLOID] };
static CHECK_WAIT: Statement = Statement { sql: c"SELECT pgqueue._check_wait($1)", args: &[INTERVALOID] };
static CHECK_ACKS: Statement = Statement {
    sql: c"SELECT pgqueue._check_pairs($1, $2, 'ack_msg_ids', 'ack_claim_tokens')",
    args: &[INT8ARRAYOID, UUIDARRAYOID],
};

const DAY_US: i128 = 86_400_000_000;

/// What a claim was asked for (pgq_claim's arguments).
pub struct Ask<'a> {
    pub queue: Option<&'a str>,
    pub qty: Option<i32>,
    pub lease: Option<Interval>,
    pub consumer: Option<&'a str>,
    pub session_bound: Option<bool>,
    pub wait: Option<Interval>,
}

/// The queue's lease and whether it is paused; raises the queue's error if there is none.
fn queue_settings(queue: Option<&str>) -> (Interval, bool) {
    let read = |statement: &Statement| {
        let rows = statement.run(&[queue.into_datum()]);
        (rows.len() > 0).then(|| (rows.get::<Interval>(0, 1).expect("lease"), rows.get::<bool>(0, 2).expect("paused")))
    };
    read(&QUEUE).or_else(|| read(&QUEUE_OR_ERROR)).expect("pgqueue._queue raises or returns the queue")
}

fn raise(check: &Statement, args: &[Option<pg_sys::Datum>]) {
    check.run(args);
}

/// pgq_claim: checks, then claim attempts (and sleeps between them while waiting) until
/// something is claimed or the wait is over. `outer`: where the rows it returns must live.
fn claim(ask: &Ask, outer: pg_sys::MemoryContext) -> Vec<Claimed> {
    let (mut lease, mut paused) = queue_settings(ask.queue);
    let queue = ask.queue.expect("a queue was found");
    let qty = match ask.qty {
        Some(qty @ 1..=1000) => qty,
        _ => {
            raise(&CHECK_QTY, &[ask.qty.into_datum()]);
            error!("pgqueue: qty is out of range")
        }
    };
    if let Some(l) = ask.lease
        && !(1..=DAY_US).contains(&l.as_micros())
    {
        raise(&CHECK_LEASE, &[l.into_datum()]);
    }
    let (bound_pid, bound_start) = match ask.session_bound {
        None => {
            raise(&CHECK_SESSION_BOUND, &[None]);
            error!("pgqueue: session_bound must not be NULL")
        }
        Some(false) => (None, None),
        Some(true) => {
            // SAFETY: a plain read of this process's pid.
            let pid = unsafe { pg_sys::MyProcPid };
            let rows = BACKEND_START.run(&[pid.into_datum()]);
            (Some(pid), (rows.len() > 0).then(|| rows.get::<TimestampWithTimeZone>(0, 1)).flatten())
        }
    };
    // None: a single attempt.
    let deadline = match ask.wait {
        Some(w) if w.as_micros() == 0 => None,
        _ => {
            raise(&CHECK_WAIT, &[ask.wait.into_datum()]);
            let rows = DEADLINE.run(&[ask.wait.into_datum()]);
            rows.get::<TimestampWithTimeZone>(0, 1)
        }
    };
    // A lease runs from the claim, not from the statement's start: after a wait longer than
    // the lease, now() + lease would hand out a lease that has already ended.
    // SAFETY: plain reads of the transaction's start time.
    let mut since = unsafe { pg_sys::GetCurrentTransactionStartTimestamp() };
    let mut woken = false;
    loop {
        let granted = ask.lease.unwrap_or(lease);
        // Read before the claim's snapshot: what it reports is what this attempt can see.
        let mut s = start(queue);
        // A check must see every commit so far: not with the transaction's one snapshot.
        if s.unchecked && snapshot_per_statement() {
            crate::reconcile::check_unchecked(queue);
            s = start(queue);
        }
        if !paused {
            if s.promote && PROMOTE.run(&[queue.into_datum()]).get::<i64>(0, 1).unwrap_or(0) > 0 {
                s = start(queue);
            }
            let mut writes = writes();
            let free = match writes {
                // One message: writing its row costs what a ledger row does, without the
                // ledger's and the held set's work (0.24.2). The kinds live side by side (the
                // setting is per session); a pick for one is a session's with the setting off.
                Writes::Ledger if qty == 1 => {
                    writes = Writes::Row;
                    pick_beside_ledger(queue, &mut s, qty)
                }
                Writes::Ledger => pick_free(queue, &mut s, qty),
                Writes::Row if crate::statement::has_relation(c"_ledger_held") => {
                    pick_beside_ledger(queue, &mut s, qty)
                }
                _ => pick(queue, &s, qty, None).into_iter().map(|(id, _, _)| id).collect(),
            };
            // The same where more were asked for and the ledger's pick found one free.
            if free.len() == 1 && matches!(writes, Writes::Ledger) {
                writes = Writes::Row;
            }
            if !free.is_empty() {
                if crate::dispatch::chains(woken, free.len(), qty as usize) {
                    crate::wait::chain(queue);
                }
                let bound = (bound_pid, bound_start);
                return claim_picked(queue, ask.consumer, &free, since, granted, bound, writes, outer);
            }
        }
        let Some(deadline) = deadline else { return vec![] };
        // SAFETY: reads the clock.
        if unsafe { pg_sys::GetCurrentTimestamp() } >= deadline.into() {
            return vec![];
        }
        // Nothing yet: sleep until a commit makes messages of this queue claimable (or the
        // queue is resumed), then try again; one last try at the deadline.
        woken = crate::wait::sleep(queue, s.seq, deadline, qty as u32);
        // SAFETY: reads the clock.
        since = unsafe { pg_sys::GetCurrentTimestamp() };
        (lease, paused) = queue_settings(ask.queue);
    }
}

/// Locks up to `qty` claimable rows, highest priority first, FIFO within a priority; with
/// each, its priority and its next claim number where claims write only the ledger (`passed`: the rows this
/// call passed over as held, left out), else 0.
fn pick(queue: &str, s: &Start, qty: i32, passed: Option<&[i64]>) -> Vec<(i64, i16, i32)> {
    let number =
        |rows: &Rows, r: usize, col: i32| if passed.is_some() { rows.get::<i32>(r, col).unwrap_or(0) } else { 0 };
    let Some(hints) = &s.hints else {
        let rows = match passed {
            Some(passed) => {
                let pick = if crate::held::exact() { &PICK_FREE_BY_SET } else { &PICK_FREE };
                pick.run(&[queue.into_datum(), qty.into_datum(), passed.to_vec().into_datum()])
            }
            None => PICK.get().run(&[queue.into_datum(), qty.into_datum()]),
        };
        let picked: Vec<(i64, i16, i32)> = (0..rows.len())
            .filter_map(|r| Some((rows.get::<i64>(r, 1)?, rows.get::<i16>(r, 2)?, number(&rows, r, 3))))
            .collect();
        // Held now: noted for a rollback before anything else can fail (as `_take` does).
        if let Some(key) = Key::new(queue) {
            picked.iter().for_each(|&(id, priority, _)| rollback_note(key, priority, id));
        }
        return picked;
    };
    let mut picked = vec![];
    for &(priority, from) in hints {
        let want = qty - picked.len() as i32;
        HANDED_NOW.with_borrow_mut(Vec::clear);
        let args =
            [queue.into_datum(), priority.into_datum(), from.into_datum(), s.epoch.into_datum(), want.into_datum()];
        let rows = match passed {
            Some(passed) => {
                let mut args = args.to_vec();
                args.push(passed.to_vec().into_datum());
                PICK_FROM_FREE.run(&args)
            }
            None => PICK_FROM.get().run(&args),
        };
        let locked: Vec<(i64, i16, i32)> =
            (0..rows.len()).filter_map(|r| Some((rows.get::<i64>(r, 1)?, priority, number(&rows, r, 2)))).collect();
        // Handed but skipped, locked by another transaction (rare: each row is handed to one
        // claim at a time).
        let skipped = HANDED_NOW.with_borrow_mut(std::mem::take);
        if let Some(key) = Key::new(queue) {
            // Both in msg_id order (one priority).
            for id in skipped.into_iter().filter(|id| locked.binary_search_by_key(id, |&(m, _, _)| m).is_err()) {
                skipped_note(key, priority, id);
            }
        }
        picked.extend(locked);
        if picked.len() as i32 >= qty {
            break;
        }
    }
    picked
}

/// Where claims write only the ledger, the rows claims hold stay 'ready': picks pass them
/// over (`free_of_holds`) and go on past them, and past the free rows already locked, until
/// `qty` are free or nothing more is claimable. Returns the free rows, locked.
fn pick_free(queue: &str, s: &mut Start, qty: i32) -> Vec<i64> {
    let (mut free, mut passed) = (vec![], vec![]);
    loop {
        let left_out: Vec<i64> = passed.iter().chain(&free).copied().collect();
        let picked = pick(queue, s, qty - free.len() as i32, Some(&left_out));
        let all = picked.len();
        if all == 0 {
            return free;
        }
        let got = free_of_holds(queue, picked, &mut passed);
        let held = all - got.len();
        free.extend(got);
        if held == 0 || free.len() as i32 >= qty {
            free.sort_unstable();
            return free;
        }
        // The hints moved past what this pick was handed.
        *s = start(queue);
    }
}

/// The pick of a claim that writes rows, where claims through the ledger (0.24.0's SQL on)
/// may hold rows they leave 'ready': sessions with `pgqueue.claim_ledger` on, or claims made
/// before it was turned off. Where the held set says no message is held (`quiet`), the plain
/// pick; if a claim through the ledger took messages before this one locked its rows, the
/// rows it holds are passed over (the claim returns fewer). Otherwise the ledger's pick.
fn pick_beside_ledger(queue: &str, s: &mut Start, qty: i32) -> Vec<i64> {
    if !crate::held::quiet() {
        return pick_free(queue, s, qty);
    }
    let picked = pick(queue, s, qty, None);
    let ids: Vec<i64> = picked.iter().map(|&(id, _, _)| id).collect();
    // Asked again now that the rows are locked: a claim through the ledger that held one of
    // them committed before this claim locked it, and listed it before that.
    if ids.is_empty() || crate::held::quiet() {
        return ids;
    }
    let rows = NEXT_NUMBERS.run(&[ids.into_datum()]);
    let numbers: Vec<(i64, i32)> = (0..rows.len()).filter_map(|r| Some((rows.get(r, 1)?, rows.get(r, 2)?))).collect();
    let picked = picked
        .into_iter()
        .filter_map(|(id, priority, _)| numbers.iter().find(|n| n.0 == id).map(|&(_, number)| (id, priority, number)))
        .collect();
    free_of_holds(queue, picked, &mut vec![])
}

/// How this database's claims write a claim: a random token on the row (`pgqueue.claim_ledger`
/// off, or the SQL before 0.22.0), the row and the ledger (0.22.0 and 0.23.0), or the ledger
/// alone (0.24.0 on, whose SQL reads such claims; a claim of one message writes the row).
#[derive(Clone, Copy)]
enum Writes {
    Row,
    RowAndLedger(&'static Statement),
    Ledger,
}

fn writes() -> Writes {
    if !(crate::guc::CLAIM_LEDGER.get() && crate::statement::has_column(c"messages", c"claims_ended")) {
        Writes::Row
    } else if crate::statement::has_relation(c"_ledger_held") {
        Writes::Ledger
    } else if crate::statement::has_column(c"claims", c"lease_expires_at") {
        Writes::RowAndLedger(&CLAIM)
    } else {
        Writes::RowAndLedger(&CLAIM_0_22)
    }
}

/// Of the rows a claim picked and holds locked (with their next claim numbers), those no claim
/// through the ledger holds, by the held set, else by the ledger (read in a snapshot taken
/// now: in REPEATABLE READ too, a claim that committed after the transaction's snapshot is
/// seen); the others go to `passed`.
fn free_of_holds(queue: &str, picked: Vec<(i64, i16, i32)>, passed: &mut Vec<i64>) -> Vec<i64> {
    let holds = crate::held::holds(&picked.iter().map(|&(id, _, number)| (id, number)).collect::<Vec<_>>());
    let (ask, numbers): (Vec<i64>, Vec<i32>) =
        picked.iter().zip(&holds).filter(|(_, h)| **h == Holds::Ask).map(|(p, _)| (p.0, p.2)).unzip();
    let mut held_by_ledger = vec![];
    if !ask.is_empty() {
        let rows = LEDGER_HOLDS.run_latest(&[queue.into_datum(), ask.into_datum(), numbers.into_datum()]);
        held_by_ledger = (0..rows.len()).filter_map(|r| rows.get::<i64>(r, 1)).collect();
    }
    let mut free = vec![];
    for ((msg_id, priority, _), holds) in picked.into_iter().zip(holds) {
        let held = match holds {
            Holds::No => false,
            Holds::Yes | Holds::Settling => true,
            Holds::Ask => held_by_ledger.contains(&msg_id),
        };
        if !held {
            free.push(msg_id);
            continue;
        }
        passed.push(msg_id);
        if holds == Holds::Settling
            && let Some(key) = Key::new(queue)
        {
            // Perhaps a claim rolled back a moment ago: looked at again after this commits.
            skipped_note(key, priority, msg_id);
        }
    }
    free
}

/// Claims the picked rows; notes per priority what was claimed (the re-arm pass learns of
/// the leases at commit; a rollback makes them claimable again).
#[allow(clippy::too_many_arguments)]
fn claim_picked(
    queue: &str,
    consumer: Option<&str>,
    picked: &[i64],
    since: pg_sys::TimestampTz,
    granted: Interval,
    (bound_pid, bound_start): (Option<i32>, Option<TimestampWithTimeZone>),
    writes: Writes,
    outer: pg_sys::MemoryContext,
) -> Vec<Claimed> {
    let statement = match writes {
        Writes::Row => CLAIM_WITHOUT_LEDGER.get(),
        Writes::RowAndLedger(statement) => statement,
        Writes::Ledger => &CLAIM_LEDGER_ONLY,
    };
    let args = [
        picked.to_vec().into_datum(),
        since.into_datum(),
        granted.into_datum(),
        consumer.into_datum(),
        bound_pid.into_datum(),
        bound_start.into_datum(),
        queue.into_datum(),
    ];
    let ledger = !matches!(writes, Writes::Row);
    let rows = if ledger { crate::held::claiming(|| statement.run(&args)) } else { statement.run(&args) };
    if ledger {
        // The held set learns of the claim.
        let taken: Vec<(i64, i32, i64)> = (0..rows.len())
            .filter_map(|r| {
                let lease = rows.get::<TimestampWithTimeZone>(r, 8)?;
                Some((rows.get::<i64>(r, 1)?, rows.get::<i32>(r, 9)?, pg_sys::TimestampTz::from(lease)))
            })
            .collect();
        crate::held::took(&taken);
    }
    let mut claimed: Vec<Claimed> = (0..rows.len())
        .map(|r| {
            (
                rows.get::<i64>(r, 1).expect("msg_id"),
                rows.get::<Uuid>(r, 2).expect("claim_token"),
                rows.get::<i32>(r, 3).expect("attempt"),
                rows.get::<i16>(r, 4).expect("priority"),
                Jsonb(rows.copy_into(r, 5, outer).expect("payload")),
                rows.copy_into(r, 6, outer).map(Jsonb),
                rows.get::<TimestampWithTimeZone>(r, 7).expect("enqueued_at"),
                rows.get::<TimestampWithTimeZone>(r, 8).expect("lease_expires_at"),
            )
        })
        .collect();
    claimed.sort_by_key(|c| (std::cmp::Reverse(c.3), c.0));
    if let Some(key) = Key::new(queue) {
        for group in claimed.chunk_by(|a, b| a.3 == b.3) {
            let expiry = group.iter().map(|c| pg_sys::TimestampTz::from(c.7)).min();
            let (low, high) = (group[0].0, group[group.len() - 1].0);
            claimed_note(key, group[0].3, (low, high), group.len() as i64, expiry.unwrap_or(i64::MIN), 0);
        }
    }
    claimed
}

/// Whether an ack pair of arrays may be wrong (NULL, not one-dimensional, of different
/// lengths, with NULLs): then _check_pairs decides. Returns the number of pairs otherwise.
fn ack_pairs(ids: Option<pg_sys::Datum>, tokens: Option<pg_sys::Datum>) -> Option<usize> {
    let shape = |d: pg_sys::Datum| {
        // SAFETY: an array argument (bigint[] or uuid[]), detoasted to read its header.
        unsafe {
            let a = pg_sys::pg_detoast_datum(d.cast_mut_ptr()) as *mut pg_sys::ArrayType;
            let ndim = (*a).ndim;
            let dims = (a as *const u8).add(std::mem::size_of::<pg_sys::ArrayType>()) as *mut i32;
            (ndim, pg_sys::ArrayGetNItems(ndim, dims) as usize, (*a).dataoffset != 0)
        }
    };
    let ((nd_i, n_i, nulls_i), (nd_t, n_t, nulls_t)) = (shape(ids?), shape(tokens?));
    (nd_i <= 1 && nd_t <= 1 && n_i == n_t && !nulls_i && !nulls_t).then_some(n_i)
}

/// pgq_claim (sql/claim.sql declares it).
#[pg_extern(sql = false)]
#[allow(clippy::type_complexity)]
fn pgq_claim(
    queue: Option<&str>,
    qty: Option<i32>,
    lease: Option<Interval>,
    consumer: Option<&str>,
    session_bound: Option<bool>,
    wait: Option<Interval>,
) -> TableIterator<
    'static,
    (
        name!(msg_id, i64),
        name!(claim_token, Uuid),
        name!(attempt, i32),
        name!(priority, i16),
        name!(payload, Jsonb),
        name!(headers, Option<Jsonb>),
        name!(enqueued_at, TimestampWithTimeZone),
        name!(lease_expires_at, TimestampWithTimeZone),
    ),
> {
    // SAFETY: the context the rows returned must live in (this call's, for every row).
    let outer = unsafe { pg_sys::CurrentMemoryContext };
    let ask = Ask { queue, qty, lease, consumer, session_bound, wait };
    TableIterator::new(Spi::connect_mut(|_| claim(&ask, outer)))
}

/// The rows pgq_ack_claim returns.
pub type AckClaimRow = (
    &'static str,
    Option<i64>,
    Option<Uuid>,
    Option<i32>,
    Option<i16>,
    Option<Jsonb>,
    Option<Jsonb>,
    Option<TimestampWithTimeZone>,
    Option<TimestampWithTimeZone>,
);

/// pgq_ack_claim (sql/claim.sql declares it), with the results its acks keep.
#[pg_extern(sql = false)]
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn pgq_ack_claim_reporting(
    queue: Option<&str>,
    ack_msg_ids: Option<AnyArray>,
    ack_claim_tokens: Option<AnyArray>,
    qty: Option<i32>,
    lease: Option<Interval>,
    consumer: Option<&str>,
    session_bound: Option<bool>,
    wait: Option<Interval>,
    ack_results: Option<AnyArray>,
) -> TableIterator<
    'static,
    (
        name!(kind, &'static str),
        name!(msg_id, Option<i64>),
        name!(claim_token, Option<Uuid>),
        name!(attempt, Option<i32>),
        name!(priority, Option<i16>),
        name!(payload, Option<Jsonb>),
        name!(headers, Option<Jsonb>),
        name!(enqueued_at, Option<TimestampWithTimeZone>),
        name!(lease_expires_at, Option<TimestampWithTimeZone>),
    ),
> {
    let acks = [ack_msg_ids, ack_claim_tokens, ack_results].map(|a| a.map(|a| a.datum()));
    let ask = Ask { queue, qty, lease, consumer, session_bound, wait };
    TableIterator::new(ack_claim(acks, ask))
}

static CHECK_RESULTS: Statement =
    Statement { sql: c"SELECT pgqueue._check_reports($1, $2, 'ack_results')", args: &[JSONBARRAYOID, INT4OID] };

/// Acks (`acks`: msg_ids, claim tokens, results or NULL), then claims as `ask` says.
pub fn ack_claim(acks: [Option<pg_sys::Datum>; 3], mut ask: Ask) -> Vec<AckClaimRow> {
    // SAFETY: the context the rows returned must live in (this call's, for every row).
    let outer = unsafe { pg_sys::CurrentMemoryContext };
    let [ids, tokens, results] = acks;
    Spi::connect_mut(|_| {
        let n = match ack_pairs(ids, tokens) {
            Some(n) => n,
            None => {
                // Raises, unless the arrays only looked wrong (a NULL bitmap without NULLs).
                CHECK_ACKS.run(&[ids, tokens]);
                ack_pairs_checked(ids)
            }
        };
        if results.is_some() {
            CHECK_RESULTS.run(&[results, i32::try_from(n).ok().into_datum()]);
        }
        let mut rows = vec![];
        if n > 0 {
            let acked = crate::finish::to_history(ids, tokens, Some("completed"), None, None, results);
            if acked.len() < n {
                // SAFETY: a bigint[] argument, checked above.
                let all = unsafe { Array::<i64>::from_datum(ids.expect("checked"), false) }.expect("checked");
                let mut reported = std::collections::HashSet::new();
                for id in all.iter().flatten() {
                    if acked.binary_search(&id).is_err() && reported.insert(id) {
                        rows.push(("not_acked", Some(id), None, None, None, None, None, None, None));
                    }
                }
            }
            // The acks commit with the call, and their report must not come late: a call
            // with something to ack does not wait for messages.
            if ask.wait.is_none_or(|w| w.as_micros() != 0) {
                CHECK_WAIT.run(&[ask.wait.into_datum()]);
                ask.wait = Some(Interval::from_micros(0));
            }
        }
        rows.extend(claim(&ask, outer).into_iter().map(
            |(id, token, attempt, priority, payload, headers, at, until)| {
                (
                    "claimed",
                    Some(id),
                    Some(token),
                    Some(attempt),
                    Some(priority),
                    Some(payload),
                    headers,
                    Some(at),
                    Some(until),
                )
            },
        ));
        rows
    })
}

/// The number of ack pairs, once _check_pairs has passed them.
fn ack_pairs_checked(ids: Option<pg_sys::Datum>) -> usize {
    // SAFETY: a bigint[] argument _check_pairs accepted (not NULL, one dimension).
    unsafe { Array::<i64>::from_datum(ids.expect("checked"), false) }.map_or(0, |a| a.len())
}
