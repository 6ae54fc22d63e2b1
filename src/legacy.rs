//! C functions that only earlier releases' SQL calls. The library is updated (and the server
//! restarted) before `ALTER EXTENSION pgqueue UPDATE`, so for that while this library runs
//! the previous release's SQL; and no C function a released script names is ever removed.
//! Each says which releases' SQL calls it:
//!
//! | function | called by the SQL of |
//! |---|---|
//! | `_claim_start` | 0.3.0 – 0.7.0 (`pgq_claim`) |
//! | `_claimed` | 0.3.0 – 0.7.0 (`pgq_claim`) |
//! | `_wait` | 0.3.0 – 0.7.0 (`pgq_claim` with `wait`) |
//! | `_ahead` | 0.5.0 – 0.6.0 (`pgq_claim`) |
//! | `pgq_ack_claim` | 0.8.0 – 0.15.0 (`pgq_ack_claim`, before `ack_results`) |
//! | `_vouched` | 0.21.0 (fencing; and `finish.rs` on its tables) |

use crate::claim::{self, Ask, Jsonb};
use crate::claim_token;
use crate::ledger::key;
use crate::queue_state::{self, Key};
use crate::wait;
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::{AnyArray, Uuid};

/// Where a claim on `queue` starts (the claim itself calls `start`; this is for earlier
/// releases' SQL and for looking at the shared state): the priorities that may have
/// claimable messages, highest first, and the msg_id to start each at (NULL: scan from the
/// start, as without shared memory); the epoch to raise hints with; the wake-up count a
/// waiting claim compares with; whether delayed messages may be due (promote first).
#[pg_extern(volatile, parallel_unsafe)]
#[allow(clippy::type_complexity)]
fn _claim_start(
    queue: &str,
) -> TableIterator<
    'static,
    (
        name!(priorities, Option<Vec<i16>>),
        name!(starts, Option<Vec<i64>>),
        name!(epoch, Option<i64>),
        name!(seq, Option<i64>),
        name!(promote, bool),
    ),
> {
    let s = claim::start(queue);
    let (priorities, starts) = s.hints.map(|h| h.into_iter().unzip()).unzip();
    TableIterator::once((priorities, starts, s.epoch, s.seq, s.promote))
}

/// A claim took `n` messages of `priority` (ids `low` to `high`, leases ending from `expiry`):
/// raise the hint past them (if the claim started from hints at `epoch`: 0.6.0's claim; since
/// 0.7.0 `_take` raises it row by row and the epoch is NULL), and lower it again if this rolls
/// back; at commit the re-arm pass learns of them. Since 0.8.0 the claim (Rust) notes its rows
/// itself (`claimed_note`): this stays for 0.6.0's and 0.7.0's SQL, which call it until
/// `ALTER EXTENSION pgqueue UPDATE`.
#[pg_extern(volatile, parallel_unsafe)]
fn _claimed(
    queue: &str,
    priority: i16,
    epoch: Option<i64>,
    low: Option<i64>,
    high: Option<i64>,
    n: i64,
    expiry: Option<TimestampWithTimeZone>,
) -> bool {
    let (Some(key), Some(low), Some(high)) = (Key::new(queue), low, high) else { return false };
    if n <= 0 {
        return false;
    }
    claim::claimed_note(key, priority, (low, high), n, expiry.map_or(i64::MIN, pg_sys::TimestampTz::from), n);
    if let Some(epoch) = epoch
        && claim::snapshot_per_statement()
    {
        queue_state::with_lock(true, |table| {
            if let Some(entry) = table.entry(&key, false) {
                entry.dispatch.raise(priority, epoch as u64, high.saturating_add(1));
            }
        });
    }
    true
}

/// 0.6.0's pgq_claim calls this until `ALTER EXTENSION pgqueue UPDATE` replaces it (the
/// library is updated first): whether the hint has not passed `msg_id` yet.
#[pg_extern(volatile, parallel_unsafe, cost = 1000)]
fn _ahead(queue: &str, priority: i16, msg_id: i64) -> bool {
    let Some(key) = Key::new(queue) else { return true };
    queue_state::with_lock(false, |table| {
        table.entry(&key, false).is_none_or(|e| e.dispatch.take(priority, None, msg_id).is_some())
    })
    .unwrap_or(true)
}

/// `wait::sleep`, which 0.3.0's to 0.7.0's `pgq_claim` called through SQL.
#[pg_extern(volatile, parallel_unsafe)]
fn _wait(queue: &str, seen: Option<i64>, deadline: TimestampWithTimeZone) -> bool {
    // Its callers claim without chaining: one signal per message, as then.
    wait::sleep(queue, seen, deadline, 1)
}

/// `claim::pgq_ack_claim_reporting` without results, as 0.8.0's to 0.15.0's SQL declares it
/// (the row type is spelled out again: pg_extern takes only a literal tuple of `name!`s).
#[pg_extern(sql = false)]
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn pgq_ack_claim(
    queue: Option<&str>,
    ack_msg_ids: Option<AnyArray>,
    ack_claim_tokens: Option<AnyArray>,
    qty: Option<i32>,
    lease: Option<Interval>,
    consumer: Option<&str>,
    session_bound: Option<bool>,
    wait: Option<Interval>,
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
    let acks = [ack_msg_ids.map(|a| a.datum()), ack_claim_tokens.map(|a| a.datum()), None];
    TableIterator::new(claim::ack_claim(acks, Ask { queue, qty, lease, consumer, session_bound, wait }))
}

/// 0.21.0's fencing (its SQL, until ALTER EXTENSION UPDATE, and `finish.rs` on its tables):
/// the check of a message held under a token of the ledger's kind (fencing asks only
/// then: a random token, of a release before 0.21.0 or of `pgqueue.claim_ledger = off`, is the
/// row's word alone): the token must verify for the row's attempt and name a ledger row that
/// exists (`in_ledger`, looked up in the statement's snapshot, so that a concurrent ack and
/// prune cannot make it a false alarm). Where it does not, the two records of who holds the
/// message disagree: XX000, never an answer either way. True otherwise.
#[pg_extern(stable, parallel_safe, cost = 10)]
fn _vouched(
    token: Option<Uuid>,
    msg_id: Option<i64>,
    attempt: Option<i32>,
    key_bytes: Option<&[u8]>,
    in_ledger: Option<bool>,
) -> bool {
    let (Some(token), Some(msg_id), Some(attempt)) = (token, msg_id, attempt) else {
        error!("pgqueue: _vouched needs a token, a msg_id and an attempt")
    };
    let verifies = key_bytes.is_some_and(|k| claim_token::verify(&key(k), token.as_bytes(), msg_id, attempt));
    if !verifies || in_ledger != Some(true) {
        error!(
            "pgqueue: message {msg_id} is held under a claim the claim ledger does not vouch for: the row's token \
             {token} {} for attempt {attempt}, and its ledger row {}",
            if verifies { "verifies" } else { "does not verify" },
            if in_ledger == Some(true) { "exists" } else { "is missing" }
        );
    }
    true
}
