//! The tick's check of the shared state against the table (step "reconcile"): every hint of
//! this database's queues is compared with the lowest claimable message of its priority, and
//! lowered if it is above it; priorities nobody announced are added; the next due time is
//! lowered to the earliest delayed message; entries of dropped queues are removed. A missed
//! lowering (a prepared transaction, a change made outside the API, a bug) therefore delays
//! a message by one tick at most. Depths are recounted when asked (`recount.rs`: exact while
//! commits go on); dead letters one queue per transaction (`recount_dead`).
//! Also: the `pgqueue.queue_depth` view's numbers.

use crate::queue_state::{self, Key, State};
use crate::recount;
use crate::statement::{has_history_rows, has_message_rows};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::collections::HashSet;

struct Seen {
    key: Key,
    priorities: Vec<i16>,
    hints: Vec<i64>,
    waiters: u32,
    depth_known: bool,
}

impl Seen {
    /// The entry as the check starts from it (read before the check's snapshot).
    fn of(e: &queue_state::Entry) -> Seen {
        let (priorities, hints) = e.dispatch.listed();
        Seen { key: e.key(), priorities, hints, waiters: e.waiters(), depth_known: e.depth().is_some() }
    }

    /// `priority`'s hint when the check started (None: not tracked then).
    fn hint(&self, priority: i16) -> Option<i64> {
        self.priorities.iter().position(|&p| p == priority).map(|i| self.hints[i])
    }
}

/// Runs the check; returns how many hints were found too high (each a missed lowering).
/// `current_sql`: the database runs this release's SQL (else there is nothing to check with).
pub fn run(recount: bool, current_sql: bool) -> i64 {
    let mut seen: Vec<Seen> = queue_state::this_database(Seen::of);
    if !current_sql || !queue_state::available() {
        return 0;
    }
    let queues: Vec<String> =
        Spi::get_one::<Vec<String>>("SELECT coalesce(array_agg(queue), '{}') FROM pgqueue.queues")
            .unwrap_or_else(|e| error!("{e}"))
            .unwrap_or_default();
    // Queues nobody used since the server started are tracked from now on, while there is
    // room (never counted as untracked: no claim was turned away), so that their depths and
    // dead letters are known before someone asks.
    let tracked: HashSet<String> = seen.iter().map(|s| s.key.queue()).collect();
    let missing: Vec<Key> = queues.iter().filter(|q| !tracked.contains(*q)).filter_map(|q| Key::new(q)).collect();
    if !missing.is_empty() {
        queue_state::with_lock(true, |table| {
            for key in missing {
                if table.has_room() && table.entry(&key, true).is_some() {
                    seen.push(Seen { key, priorities: vec![], hints: vec![], waiters: 0, depth_known: false });
                }
            }
        });
    }
    let mut corrections = 0;
    let previous = BUSY_BELOW.take();
    let mut busy_below = vec![];
    for s in seen {
        let queue = s.key.queue();
        if !queues.contains(&queue) {
            queue_state::with_lock(true, |table| table.remove(&s.key));
            continue;
        }
        corrections += check(&s, &previous, &mut busy_below);
        if recount || !s.depth_known {
            let depths = [State::Ready, State::Delayed, State::Claimed];
            recount::recount(&queue, "SELECT ready, delayed, claimed FROM pgqueue._depth($1)", &depths);
        }
    }
    BUSY_BELOW.set(busy_below);
    corrections
}

/// Checks one queue's hints against the table; returns the corrections (missed lowerings).
/// `previous`: the busy messages the last check found below their hints; those it finds now
/// are added to `busy_below`.
fn check(s: &Seen, previous: &[(Key, i16, i64)], busy_below: &mut Vec<(Key, i16, i64)>) -> i64 {
    let queue = s.key.queue();
    let mut corrections = 0;
    let mut found = claimable(&queue, &s.priorities);
    // A busy message (locked or changed by a transaction the check's snapshot cannot see the
    // end of) is most often one a claim under way is taking: that claim raised the hint past
    // it, and its rollback would lower it again. Lowering to it would move the epoch at every
    // tick under load, and the claims under way would then be handed rows without raising the
    // hint: several are handed the same rows and collide on their locks, and one that locks a
    // row another has just claimed keeps that lock while the row's owner waits to ack it. So a
    // busy message below its hint is lowered to only if the next check finds it again (a
    // prepared transaction, a lock taken around the API); meanwhile the first free one after
    // it is. An untracked priority is added at once: claims that use the hints walk only the
    // priorities listed.
    let mut deferred = vec![];
    for (priority, msg_id, _, busy) in found.clone() {
        let (Some(priority), Some(msg_id), true) = (priority, msg_id, busy) else { continue };
        let Some(hint) = s.hint(priority) else { continue };
        if hint <= msg_id {
            continue;
        }
        busy_below.push((s.key, priority, msg_id));
        if !previous.contains(&(s.key, priority, msg_id)) {
            deferred.push((priority, msg_id));
            if let Some(free) = first_free(&queue, priority, msg_id, hint) {
                found.push((Some(priority), Some(free), None, false));
            }
        }
    }
    queue_state::with_lock(true, |table| {
        let Some(entry) = table.entry(&s.key, false) else { return };
        let known = entry.dispatch.is_known();
        let mut lowered = false;
        let mut any = false;
        for &(priority, msg_id, due, busy) in &found {
            if let (Some(priority), Some(msg_id)) = (priority, msg_id) {
                any = true;
                let later = deferred.contains(&(priority, msg_id)) && entry.dispatch.tracks(priority);
                if entry.dispatch.is_below(priority, msg_id) && !later {
                    entry.dispatch.lower(priority, msg_id);
                    lowered = true;
                    // A correction (a missed lowering) only if the hint was above it
                    // before the check's snapshot and nobody had the message locked: a
                    // claim under way raises the hint past what it takes before it
                    // commits, and a rollback lowers it right after.
                    if known && !busy && s.hint(priority).is_some_and(|h| h > msg_id) {
                        entry.add_correction();
                        corrections += 1;
                    }
                }
            }
            if let Some(due) = due {
                entry.dispatch.lower_due(due);
            }
        }
        entry.dispatch.mark_known();
        // A sleeper while messages are claimable: someone missed a wake-up.
        if lowered || (any && s.waiters > 0) {
            entry.wake(1);
        }
    });
    corrections
}

/// A claim found `queue`'s hints not checked yet (the server has just started, or the queue
/// was created, and no tick has checked them since; right after CREATE EXTENSION the
/// database's worker comes only within pgqueue.launcher_naptime): it checks them itself
/// rather than scan from the start of the queue, and so do the claims after it. Only with
/// this library's SQL (every release whose SQL calls pgq_claim has `_claimable`).
pub fn check_unchecked(queue: &str) {
    let Some(key) = Key::new(queue) else { return };
    let seen = queue_state::with_lock(false, |table| {
        table.entry(&key, false).filter(|e| !e.dispatch.is_known()).map(|e| Seen::of(e))
    });
    if let Some(Some(s)) = seen {
        check(&s, &[], &mut vec![]);
    }
}

thread_local! {
    /// The busy messages the last check in this process found below their hints.
    static BUSY_BELOW: std::cell::RefCell<Vec<(Key, i16, i64)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The first ready message of `queue`'s `priority` after `after` and below `hint` that no
/// transaction has locked or changed.
fn first_free(queue: &str, priority: i16, after: i64, hint: i64) -> Option<i64> {
    Spi::get_one_with_args::<i64>(
        &format!(
            "SELECT (SELECT m.msg_id FROM {} m
                      WHERE m.queue = $1 AND m.state = 'ready' AND m.priority >= $2 AND m.priority <= $2
                        AND m.msg_id > $3 AND m.msg_id < $4 AND m.xmax = '0'
                      ORDER BY m.priority DESC, m.msg_id LIMIT 1)",
            message_table()
        ),
        &[queue.into(), priority.into(), after.into(), hint.into()],
    )
    .unwrap_or_else(|e| error!("{e}"))
}

/// The table the view `pgqueue.messages` reads (0.20.0 on): `xmax` is the table's. Until
/// ALTER EXTENSION UPDATE from 0.19 or earlier, `pgqueue.messages` is that table.
fn message_table() -> &'static str {
    if has_message_rows() { "pgqueue.message_rows" } else { "pgqueue.messages" }
}

/// (priority, lowest claimable msg_id, -, busy) per priority, and (-, -, earliest due time, -).
#[allow(clippy::type_complexity)]
fn claimable(queue: &str, priorities: &[i16]) -> Vec<(Option<i16>, Option<i64>, Option<i64>, bool)> {
    Spi::connect(|client| {
        client
            .select(
                "SELECT priority, msg_id, due, busy FROM pgqueue._claimable($1, $2)",
                None,
                &[queue.into(), priorities.to_vec().into()],
            )?
            .map(|row| {
                let due = row.get::<TimestampWithTimeZone>(3)?.map(pg_sys::TimestampTz::from);
                Ok((row.get::<i16>(1)?, row.get::<i64>(2)?, due, row.get::<bool>(4)?.unwrap_or(false)))
            })
            .collect::<Result<Vec<_>, pgrx::spi::Error>>()
    })
    .unwrap_or_else(|e| error!("{e}"))
}

/// This database's queues as the shared state sees them (for `pgqueue.queue_depth`).
#[pg_extern(volatile, parallel_unsafe)]
#[allow(clippy::type_complexity)]
fn _queue_depth() -> TableIterator<
    'static,
    (
        name!(queue, String),
        name!(tracked, bool),
        name!(ready, Option<i64>),
        name!(delayed, Option<i64>),
        name!(claimed, Option<i64>),
        name!(waiting_claims, i64),
        name!(wakeups, i64),
        name!(hint_corrections, i64),
    ),
> {
    let rows = queue_state::this_database(|e| {
        let depth = e.depth();
        let (wakeups, corrections) = e.counters();
        (
            e.key().queue(),
            e.dispatch.hints().is_some(),
            depth.map(|d| d[0]),
            depth.map(|d| d[1]),
            depth.map(|d| d[2]),
            i64::from(e.waiters()),
            wakeups,
            corrections,
        )
    });
    TableIterator::new(rows)
}

/// Queues of this database whose dead letters are due for a recount (unknown, or validated
/// at the prune cadence), in name order from after `after` round to it.
pub fn dead_due(after: &str) -> Vec<String> {
    let mut due: Vec<String> =
        queue_state::this_database(|e| e.dead_due().then(|| e.key().queue())).into_iter().flatten().collect();
    due.sort();
    let start = due.partition_point(|q| q.as_str() <= after);
    due.rotate_left(start);
    due
}

/// Every queue of this database: recount its dead letters soon.
pub fn mark_dead_stale() {
    // SAFETY: a plain read of this backend's database.
    let db = unsafe { pg_sys::MyDatabaseId };
    queue_state::with_lock(true, |table| {
        for e in table.entries() {
            // SAFETY: entries from the scan, changed under the exclusive lock.
            let e = unsafe { &mut *e };
            if e.db() == db && e.key().is_queue() {
                e.mark_dead_stale();
            }
        }
    });
}

/// Counts `queue`'s dead letters (its own history partitions only) and stores the count.
/// The queue's history is locked first: a `pgq_drop_queue` committing between the count's
/// look-up of the table and its read would fail the count (42P01) and with it the step.
pub fn recount_dead(queue: &str) {
    if lock_history(queue) {
        recount::recount(queue, "SELECT pgqueue._dead_count($1)", &[State::Dead]);
    }
}

/// Takes `queue`'s history table's share lock (until the bracket ends) if the table exists
/// once it is taken; false where it does not (the queue was dropped, or is being dropped
/// and this waited for that to commit).
///
/// The whole history's (`pgqueue.history_rows`) first: a DROP TABLE of a queue's history locks
/// the parent before the child, and the count's plan locks the parent too (for the partition
/// bound). Child first, a count and a `pgq_drop_queue` could each wait for the other. (Until
/// ALTER EXTENSION UPDATE from 0.25 or earlier the parent is named pgqueue.history; a view
/// of that name would lock every queue's partitions.)
fn lock_history(queue: &str) -> bool {
    let lock = if has_history_rows() {
        "LOCK TABLE ONLY pgqueue.history_rows IN ACCESS SHARE MODE"
    } else {
        "LOCK TABLE ONLY pgqueue.history IN ACCESS SHARE MODE"
    };
    Spi::run(lock).unwrap_or_else(|e| error!("{e}"));
    let name = Spi::get_one_with_args::<String>("SELECT pgqueue._history_table($1)", &[queue.into()])
        .unwrap_or_else(|e| error!("{e}"));
    let Some(name) = name.and_then(|n| std::ffi::CString::new(n).ok()) else { return false };
    // SAFETY: the range var points to strings that outlive the call; the look-up takes the
    // lock and repeats itself if the table was dropped or renamed while it waited for it.
    let oid = unsafe {
        let relation = pg_sys::makeRangeVar(c"pgqueue".as_ptr().cast_mut(), name.as_ptr().cast_mut(), -1);
        pg_sys::RangeVarGetRelidExtended(
            relation,
            pg_sys::AccessShareLock as pg_sys::LOCKMODE,
            pg_sys::RVROption::RVR_MISSING_OK,
            None,
            std::ptr::null_mut(),
        )
    };
    oid != pg_sys::InvalidOid
}

/// This database's queues' dead letters as the shared state counts them (for
/// `pgqueue.queue_depth`): NULL until the tick counted them.
#[pg_extern(volatile, parallel_unsafe)]
fn _dead_letters() -> TableIterator<'static, (name!(queue, String), name!(dead, Option<i64>))> {
    let rows = queue_state::this_database(|e| (e.key().queue(), e.dead()));
    TableIterator::new(rows)
}
