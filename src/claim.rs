//! The claim's use of the shared state (`sql/claim.sql` calls these): where to start
//! scanning each priority, raising the hints past what was claimed, and whether delayed
//! messages may be due.

use crate::pending::{self, Kind, Note};
use crate::queue_state::{self, DUE_NEVER, Key, State};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::prelude::*;

/// Where a claim on `queue` starts: the priorities that may have claimable messages, highest
/// first, and the msg_id to start each at (NULL: scan from the start, as without shared
/// memory); the epoch to raise hints with; the wake-up count a waiting claim compares with;
/// whether delayed messages may be due (promote first).
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
    let state = Key::new(queue).and_then(|key| {
        queue_state::with_lock(false, |table| {
            table.entry(&key, false).map(|e| (e.hints(), e.epoch(), e.wake_seq(), e.next_due()))
        })
        .flatten()
        .or_else(|| {
            queue_state::with_lock(true, |table| {
                table.entry(&key, true).map(|e| (e.hints(), e.epoch(), e.wake_seq(), e.next_due()))
            })
            .flatten()
        })
    });
    let row = match state {
        None => (None, None, None, None, true),
        Some((hints, epoch, seq, next_due)) => {
            // SAFETY: a plain read; now() in SQL is this same timestamp.
            let now = unsafe { pg_sys::GetCurrentTransactionStartTimestamp() };
            let (priorities, starts) = hints.unzip();
            // Messages this transaction itself sent (or made claimable) are below no hint
            // yet: scan from the start, and raise nothing.
            if Key::new(queue).is_some_and(|key| pending::makes_ready_uncommitted(&key)) {
                (None, None, None, Some(seq as i64), now >= next_due)
            } else {
                (priorities, starts, Some(epoch as i64), Some(seq as i64), now >= next_due)
            }
        }
    };
    TableIterator::once(row)
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
        table.entry(&key, false).map_or(Some(false), |entry| entry.take(priority, epoch, msg_id))
    })
    .unwrap_or(Some(false));
    let Some(raised) = taken else { return false };
    HANDED.set(Some((key, priority, msg_id)));
    if raised {
        // Rolled back, the row is claimable again: the hint comes back down to it.
        let mut note = Note::new(key, Kind::Claimed);
        note.priority = priority;
        note.low = msg_id;
        note.high = msg_id;
        pending::record(note);
    }
    true
}

/// 0.6.0's pgq_claim calls this until `ALTER EXTENSION pgqueue UPDATE` replaces it (the
/// library is updated first): whether the hint has not passed `msg_id` yet.
#[pg_extern(volatile, parallel_unsafe, cost = 1000)]
fn _ahead(queue: &str, priority: i16, msg_id: i64) -> bool {
    let Some(key) = Key::new(queue) else { return true };
    queue_state::with_lock(false, |table| {
        table.entry(&key, false).is_none_or(|e| e.take(priority, None, msg_id).is_some())
    })
    .unwrap_or(true)
}

thread_local! {
    /// The row `_take` last handed out in this process.
    static HANDED: std::cell::Cell<Option<(Key, i16, i64)>> = const { std::cell::Cell::new(None) };
}

/// Readers that keep one snapshot for the whole transaction may not see messages committed
/// since: they must not raise anything.
fn snapshot_per_statement() -> bool {
    // SAFETY: a plain read of the transaction's isolation level.
    unsafe { pg_sys::XactIsoLevel < pg_sys::XACT_REPEATABLE_READ as i32 }
}

/// A claim took `n` messages of `priority` (ids `low` to `high`, leases ending from `expiry`):
/// raise the hint past them (if the claim started from hints at `epoch`: 0.6.0's claim; since
/// 0.7.0 `_take` raises it row by row and the epoch is NULL), and lower it again if this rolls
/// back; at commit the re-arm pass learns of them.
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
    let mut note = Note::new(key, Kind::Claimed);
    note.priority = priority;
    note.low = low;
    note.high = high;
    note.count = n;
    note.expiry = expiry.map_or(i64::MIN, pg_sys::TimestampTz::from);
    note.moved(n, Some(State::Ready), Some(State::Claimed));
    pending::record(note);
    if let Some(epoch) = epoch
        && snapshot_per_statement()
    {
        queue_state::with_lock(true, |table| {
            if let Some(entry) = table.entry(&key, false) {
                entry.raise(priority, epoch as u64, high.saturating_add(1));
            }
        });
    }
    true
}

/// The epoch a promotion starts from (read before its snapshot).
#[pg_extern(volatile, parallel_unsafe)]
fn _due_epoch(queue: &str) -> Option<i64> {
    let key = Key::new(queue)?;
    queue_state::with_lock(true, |table| table.entry(&key, true).map(|e| e.epoch() as i64)).flatten()
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
    let raised =
        queue_state::with_lock(true, |table| table.entry(&key, false).is_some_and(|e| e.raise_due(epoch as u64, due)))
            .unwrap_or(false);
    if raised {
        // Rolled back, the promoted messages are due again.
        let mut note = Note::new(key, Kind::Other);
        note.raised_due = true;
        pending::record(note);
    }
    raised
}
