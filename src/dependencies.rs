//! Dependencies (sql/dependencies.sql): what follows when a message with children, or with
//! parents, finishes. Each parent's finish marks its own links only (`parent_outcome`), so the
//! acks of a child's many parents never wait on each other; then, in the same transaction, a
//! child none of whose parents is unfinished any more becomes claimable, and a child of a
//! parent that failed follows its `on_parent_failure` (cancelled or dead, and its children in
//! turn; 'run' counts the failure as done).
//!
//! Two last parents finishing at once each see the other's link unfinished, and neither
//! releases the child. So a transaction that marked links without releasing their child
//! hands the child, once its commit is visible, to the database's worker (a list in shared
//! memory, and its latch), which looks again. That list is an accelerator: the worker's tick
//! also walks all pending messages in bounded windows (`check_pending`), which is what
//! `pgq_tick()` does without preloading, and what finds a child whose hand-over was lost.

use crate::finish::{self, Moved};
use crate::on_rows;
use crate::statement::{OnRows, Statement};
use pgrx::pg_sys::{self, BOOLOID, INT4OID, INT8ARRAYOID, INT8OID, TEXTARRAYOID};
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::mem::size_of;
use std::ptr::null_mut;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU32};

/// Marks the links of finished parents ($1, outcomes $2 beside) and removes those of finished
/// children ($3), but for links another transaction holds: a parent finishing meanwhile marks
/// its link and then waits for this child's row, and waiting for its link here would close a
/// cycle (the link it leaves behind is collected by the tick, `ORPHANS`). Returns each child
/// of a marked link: NULL fate to be released when its parents are all done, or
/// 'cancelled'/'dead' with the error it then keeps. The links are found by the primary key
/// (`parent = ANY`) and each outcome looked up in a map built once: joined with the unnest,
/// the generic plan read every link of the table for each ack of a 10,000-parent fan-in.
static FOLLOW: Statement = Statement {
    sql: c"WITH unlinked AS (
               DELETE FROM pgqueue.dependencies d
                WHERE d.ctid = ANY (ARRAY(SELECT l.ctid FROM pgqueue.dependencies l WHERE l.child = ANY ($3)
                                             FOR UPDATE SKIP LOCKED))
           ), marked AS (
               UPDATE pgqueue.dependencies d
                  SET parent_outcome = (SELECT pg_catalog.jsonb_object_agg(u.parent, u.outcome)
                                          FROM unnest($1::bigint[], $2::text[]) AS u(parent, outcome))
                                       ->> d.parent::text
                WHERE d.parent = ANY ($1) AND d.parent_outcome IS NULL AND d.child <> ALL ($3)
               RETURNING d.child, d.parent, d.parent_outcome AS outcome, d.on_parent_failure
           )
           SELECT m.child,
                  CASE WHEN m.outcome <> 'completed' AND m.on_parent_failure <> 'run'
                       THEN pgqueue._child_outcome(m.on_parent_failure) END,
                  pgqueue._parent_failed(m.parent, m.outcome)
             FROM marked m ORDER BY m.child",
    args: &[INT8ARRAYOID, TEXTARRAYOID, INT8ARRAYOID],
};

/// Pending messages of $1 none of whose parents holds them back (unfinished, or failed under
/// a policy other than 'run': those are FAILED's): claimable now (delayed until their due
/// time, if they have one), but those another transaction holds (see `cascade`).
/// Returns the ids released. A pending message always has links, and with $2 one without any
/// is left waiting: a restore that loads the messages before the links would release them all
/// to the tick (a finish's candidates are children of the links it just marked).
/// The links are read from the highest parent down, and the first
/// that holds the child back ends the read: parents are acked in about the order they were
/// sent, so in a fan-in the one just acked is rarely the last, and the highest still waits.
static RELEASE: OnRows = on_rows!(&[INT8ARRAYOID, BOOLOID];
    "WITH done AS (
               SELECT m.msg_id FROM ", ROWS, " m
                WHERE m.msg_id = ANY ($1) AND m.state = 'pending'
                  AND (NOT $2 OR EXISTS (SELECT FROM pgqueue.dependencies d WHERE d.child = m.msg_id))
                  AND (SELECT d.parent FROM pgqueue.dependencies d
                        WHERE d.child = m.msg_id
                          AND (d.parent_outcome IS NULL
                               OR (d.parent_outcome <> 'completed' AND d.on_parent_failure <> 'run'))
                        ORDER BY d.parent DESC LIMIT 1) IS NULL
                ORDER BY m.msg_id
                  FOR NO KEY UPDATE SKIP LOCKED
           ), freed AS (
               UPDATE ", ROWS, " m
                  SET state = CASE WHEN m.visible_at > now() THEN 'delayed' ELSE 'ready' END,
                      visible_at = CASE WHEN m.visible_at > now() THEN m.visible_at END
                 FROM done WHERE m.msg_id = done.msg_id
               RETURNING m.msg_id, m.queue, m.state, m.priority, m.visible_at
           ), noted AS (
               SELECT pgqueue._note(f.queue, count(*), 'pending', f.state, f.priority, min(f.msg_id), max(f.msg_id),
                                    min(f.visible_at))
                 FROM freed f GROUP BY f.queue, f.state, f.priority
           )
           SELECT f.msg_id FROM freed f WHERE (SELECT count(*) FROM noted) >= 0 ORDER BY f.msg_id");

/// Of the pending messages $1, those with a parent that failed and a policy other than 'run':
/// the outcome it gives them and why (by the lowest such parent).
static FAILED: OnRows = on_rows!(&[INT8ARRAYOID];
    "SELECT DISTINCT ON (d.child) d.child, pgqueue._child_outcome(d.on_parent_failure),
                  pgqueue._parent_failed(d.parent, d.parent_outcome)
             FROM pgqueue.dependencies d JOIN ", ROWS, " m ON m.msg_id = d.child AND m.state = 'pending'
            WHERE d.child = ANY ($1) AND d.parent_outcome <> 'completed' AND d.on_parent_failure <> 'run'
            ORDER BY d.child, d.parent");

/// Locks children about to be finished because of a failed parent, but those another
/// transaction holds (see `cascade`).
static LOCK_CHILDREN: OnRows = on_rows!(&[INT8ARRAYOID];
    "SELECT m.msg_id FROM ", ROWS, " m WHERE m.msg_id = ANY ($1) ORDER BY m.msg_id
             FOR UPDATE SKIP LOCKED");

/// Links whose child finished (it is in the history, no longer in the queue) and that its
/// finish could not remove (see FOLLOW), at most 1,000. Only those: while a restore loads the
/// links before the messages, every child seems gone from the queue.
static ORPHANS: OnRows = on_rows!(&[];
    "DELETE FROM pgqueue.dependencies d
            WHERE d.ctid = ANY (ARRAY(SELECT l.ctid FROM pgqueue.dependencies l
                                       WHERE NOT EXISTS (SELECT FROM ", ROWS, " m WHERE m.msg_id = l.child)
                                         AND EXISTS (SELECT FROM pgqueue.history h WHERE h.msg_id = l.child)
                                       LIMIT 1000 FOR UPDATE SKIP LOCKED))");

/// A window of pending messages after $1, at most $2.
static PENDING: OnRows = on_rows!(&[INT8OID, INT4OID];
    "SELECT m.msg_id FROM ", ROWS, " m WHERE m.state = 'pending' AND m.msg_id > $1
            ORDER BY m.msg_id LIMIT $2");

/// Parents of $1's unfinished links that are no longer in the hot table, and how they ended
/// ('deleted' if not in history either): finished around the API (a restore, a DELETE).
static LOST_PARENTS: OnRows = on_rows!(&[INT8ARRAYOID];
    "SELECT p.parent,
                  coalesce((SELECT h.outcome FROM pgqueue.history h WHERE h.msg_id = p.parent LIMIT 1), 'deleted')
             FROM (SELECT DISTINCT d.parent FROM pgqueue.dependencies d
                    WHERE d.child = ANY ($1) AND d.parent_outcome IS NULL
                      AND NOT EXISTS (SELECT FROM ", ROWS, " p WHERE p.msg_id = d.parent)) p");

/// Children to finish because of a failed parent: by (outcome, error), their ids.
type Failing = BTreeMap<(String, String), Vec<i64>>;

/// Applies what the finish of `first` means to the children of its messages, and theirs.
pub fn follow(first: Moved) {
    cascade(VecDeque::from([first]), Failing::new());
}

/// Level by level down the graph: each finish's children released or failed, those failed
/// finished in turn. It never waits for a row another transaction holds (a send linking a new
/// child, which may wait for this one: a deadlock): such a child is left to the worker, which
/// looks at it once this commits (and the tick's windows, if that is lost).
fn cascade(mut work: VecDeque<Moved>, mut failing: Failing) {
    let mut released_maybe: Vec<i64> = vec![];
    loop {
        if !failing.is_empty() {
            let mut doomed: Vec<i64> = failing.values().flatten().copied().collect();
            doomed.sort_unstable();
            let rows = LOCK_CHILDREN.get().run(&[doomed.into_datum()]);
            let locked: HashSet<i64> = (0..rows.len()).filter_map(|r| rows.get::<i64>(r, 1)).collect();
            drop(rows);
            for ((fate, error), children) in std::mem::take(&mut failing) {
                let (now, held): (Vec<i64>, Vec<i64>) = children.into_iter().partition(|c| locked.contains(c));
                released_maybe.extend(held);
                if !now.is_empty() {
                    let (fate, error) = (fate.as_str(), error.as_str());
                    work.push_back(finish::move_rows(
                        now.into_datum(),
                        None,
                        fate.into_datum(),
                        error.into_datum(),
                        None,
                        None,
                    ));
                }
            }
        }
        let Some(moved) = work.pop_front() else { break };
        if moved.parents.is_empty() && moved.children.is_empty() {
            continue;
        }
        let (parents, outcomes): (Vec<i64>, Vec<String>) = moved.parents.into_iter().unzip();
        let rows = FOLLOW.run(&[parents.into_datum(), outcomes.into_datum(), moved.children.into_datum()]);
        for r in 0..rows.len() {
            let Some(child) = rows.get::<i64>(r, 1) else { continue };
            match rows.get::<String>(r, 2) {
                None => released_maybe.push(child),
                Some(fate) => {
                    failing.entry((fate, rows.get::<String>(r, 3).unwrap_or_default())).or_default().push(child)
                }
            }
        }
    }
    if !released_maybe.is_empty() {
        released_maybe.sort_unstable();
        released_maybe.dedup();
        let released = release(&released_maybe, false);
        // Still waiting here: for a parent whose finish commits with this one, or held by
        // another transaction.
        LATER.with_borrow_mut(|later| {
            if let Some(list) = later {
                list.extend(released_maybe.iter().filter(|id| released.binary_search(id).is_err()));
                if list.len() > MAX_KEPT {
                    *later = None;
                }
            }
        });
    }
}

/// Of the pending messages `ids`, those with a failed parent whose policy is not 'run': what
/// becomes of them and why (the lowest such parent's).
fn failing_among(ids: &[i64]) -> Failing {
    let rows = FAILED.get().run(&[ids.to_vec().into_datum()]);
    let mut failing = Failing::new();
    for r in 0..rows.len() {
        if let (Some(child), Some(fate), Some(error)) =
            (rows.get::<i64>(r, 1), rows.get::<String>(r, 2), rows.get::<String>(r, 3))
        {
            failing.entry((fate, error)).or_default().push(child);
        }
    }
    failing
}

/// Releases those of `candidates` whose parents are all done; returns them, sorted.
/// With `linked_only`, a candidate without any link waits (see RELEASE).
fn release(candidates: &[i64], linked_only: bool) -> Vec<i64> {
    let rows = RELEASE.get().run(&[candidates.to_vec().into_datum(), linked_only.into_datum()]);
    (0..rows.len()).filter_map(|r| rows.get::<i64>(r, 1)).collect()
}

/// `pgqueue._finish_dependencies` (sql/dependencies.sql): for pgq_drop_queue, whose messages
/// go without passing through history.
#[pg_extern(sql = false)]
fn _finish_dependencies(parents: Option<Vec<i64>>, outcomes: Option<Vec<String>>, children: Option<Vec<i64>>) {
    let parents = parents.unwrap_or_default();
    let outcomes = outcomes.unwrap_or_default();
    if parents.len() != outcomes.len() {
        error!("pgqueue: {} parents for {} outcomes", parents.len(), outcomes.len());
    }
    let moved = Moved {
        ids: vec![],
        parents: parents.into_iter().zip(outcomes).collect(),
        children: children.unwrap_or_default(),
    };
    Spi::connect_mut(|_| follow(moved));
}

/// One tick's check: the children handed over by commits (see the module's comment), then,
/// with `window` (at most that many rows), pending messages after this process's cursor in
/// msg_id order: parents of theirs that left without marking their links count as finished
/// (a restore, a DELETE), and those done waiting are released. After a hand-over was lost,
/// windows until every pending message was looked at. With `collect`, also removes links left
/// behind by finished children (ORPHANS). Returns how many it released.
pub fn check_pending(window: Option<i32>, collect: bool) -> i64 {
    thread_local! {
        static CURSOR: Cell<i64> = const { Cell::new(0) };
    }
    Spi::connect_mut(|_| {
        let mut released = 0;
        if collect {
            drop(ORPHANS.get().run(&[]));
        }
        let (handed, lost) = take_handed();
        if !handed.is_empty() {
            cascade(VecDeque::new(), failing_among(&handed));
            released += release(&handed, true).len() as i64;
        }
        let Some(max_rows) = window.or(lost.then_some(1000)) else {
            forget();
            return released;
        };
        if lost {
            CURSOR.set(0);
        }
        loop {
            let rows = PENDING.get().run(&[CURSOR.get().into_datum(), max_rows.into_datum()]);
            let ids: Vec<i64> = (0..rows.len()).filter_map(|r| rows.get::<i64>(r, 1)).collect();
            drop(rows);
            let full = ids.len() >= max_rows as usize;
            CURSOR.set(if full { *ids.last().unwrap_or(&0) } else { 0 });
            if !ids.is_empty() {
                let found = LOST_PARENTS.get().run(&[ids.clone().into_datum()]);
                let parents: Vec<(i64, String)> = (0..found.len())
                    .filter_map(|r| Some((found.get::<i64>(r, 1)?, found.get::<String>(r, 2)?)))
                    .collect();
                drop(found);
                let lost_parents = Moved { ids: vec![], parents, children: vec![] };
                cascade(VecDeque::from([lost_parents]), failing_among(&ids));
                released += release(&ids, true).len() as i64;
            }
            if !(lost && full) {
                // What this check left (held by another transaction) is not handed back to
                // itself, which would spin while that transaction lasts: the next window finds it.
                forget();
                break released;
            }
        }
    })
}

// ---- The hand-over to the worker (shared memory) ----

/// Slots for children handed over; past them (or without a worker), the tick's windows find them.
const SLOTS: usize = 4096;
/// Databases with a worker registered.
const WORKERS: usize = 64;
/// Beyond this many children left waiting in one transaction, its commit asks the worker to
/// walk every pending message instead.
const MAX_KEPT: usize = 10_000;
/// How far a hand-over looks for a free slot.
const PROBES: usize = 64;

#[repr(C)]
struct Worker {
    /// The database (0: a free entry).
    db: AtomicU32,
    /// The worker's index in ProcGlobal->allProcs, whose latch is set; -1: not running.
    proc: AtomicI32,
    /// A hand-over found no free slot: walk every pending message.
    overflowed: AtomicU32,
}

#[repr(C)]
struct Shared {
    workers: [Worker; WORKERS],
    /// Per slot: the database that took it (0: free), and the child (0: not written yet).
    dbs: [AtomicU32; SLOTS],
    ids: [AtomicI64; SLOTS],
}

static mut SHARED: *mut Shared = null_mut();

thread_local! {
    /// Children this transaction left waiting; `None`: too many.
    static LATER: RefCell<Option<Vec<i64>>> = const { RefCell::new(Some(Vec::new())) };
    /// This process is its database's worker, registered in this entry.
    static REGISTERED: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The shared memory this needs (`queue_state` asks for it with its own).
pub fn size() -> usize {
    size_of::<Shared>()
}

/// Attaches (and at first zeroes) the list; `queue_state::startup` calls this under
/// AddinShmemInitLock.
///
/// # Safety
/// Only from the shared memory startup hook.
pub unsafe fn startup() {
    let mut found = false;
    // SAFETY: the caller holds AddinShmemInitLock; zeroed atomics are valid values.
    unsafe {
        let shared = pg_sys::ShmemInitStruct(c"pgqueue dependencies".as_ptr(), size(), &mut found) as *mut Shared;
        if !found {
            std::ptr::write_bytes(shared as *mut u8, 0, size());
        }
        SHARED = shared;
    }
}

fn shared() -> Option<&'static Shared> {
    // SAFETY: set once at startup; lives as long as the server.
    unsafe { SHARED.as_ref() }
}

fn my_database() -> u32 {
    // SAFETY: a plain read of this process's database.
    u32::from(unsafe { pg_sys::MyDatabaseId })
}

/// The transaction committed (visible): hand its waiting children to the worker, and wake it.
pub fn at_commit() {
    let Some(later) = LATER.replace(Some(Vec::new())) else { return hand_over(&[], true) };
    if !later.is_empty() {
        hand_over(&later, false);
    }
}

/// The transaction rolled back or was prepared: it released nothing.
pub fn forget() {
    LATER.set(Some(Vec::new()));
}

fn hand_over(children: &[i64], overflow: bool) {
    let Some(shared) = shared() else { return };
    let db = my_database();
    let Some(worker) = shared.workers.iter().find(|w| w.db.load(SeqCst) == db) else { return };
    let mut overflow = overflow;
    'children: for &child in children {
        let start = (child as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as usize % SLOTS;
        for probe in 0..PROBES {
            let i = (start + probe) % SLOTS;
            if shared.dbs[i].compare_exchange(0, db, SeqCst, SeqCst).is_ok() {
                shared.ids[i].store(child, SeqCst);
                continue 'children;
            }
        }
        overflow = true;
    }
    if overflow {
        worker.overflowed.store(1, SeqCst);
    }
    set_latch(worker);
}

fn set_latch(worker: &Worker) {
    let proc = worker.proc.load(SeqCst);
    if proc < 0 {
        return;
    }
    // SAFETY: the worker's PGPROC, which exists as long as the server; setting another
    // process's latch is what it is for.
    unsafe {
        let proc = (*pg_sys::ProcGlobal).allProcs.add(proc as usize);
        pg_sys::SetLatch(&raw mut (*proc).procLatch);
    }
}

/// What was handed over to this database's worker since it last looked, and whether some
/// was lost (every pending message is then walked).
fn take_handed() -> (Vec<i64>, bool) {
    let Some(shared) = shared() else { return (vec![], false) };
    let Some(entry) = REGISTERED.get() else { return (vec![], false) };
    let db = my_database();
    let mut taken = vec![];
    for i in 0..SLOTS {
        if shared.dbs[i].load(SeqCst) == db {
            // Not written yet: its writer sets the latch after writing it, so it is next time's.
            let id = shared.ids[i].swap(0, SeqCst);
            if id != 0 {
                taken.push(id);
                shared.dbs[i].store(0, SeqCst);
            }
        }
    }
    taken.sort_unstable();
    taken.dedup();
    (taken, shared.workers[entry].overflowed.swap(0, SeqCst) != 0)
}

/// Whether the worker has children handed over to look at (it then runs its check at once).
pub fn handed_over() -> bool {
    let (Some(shared), Some(entry)) = (shared(), REGISTERED.get()) else { return false };
    let db = my_database();
    shared.workers[entry].overflowed.load(SeqCst) != 0
        || shared.dbs.iter().zip(&shared.ids).any(|(d, id)| d.load(SeqCst) == db && id.load(SeqCst) != 0)
}

/// The database's worker registers its latch (and finds what was handed over while none ran:
/// the entry starts out overflowed).
pub fn register_worker() {
    let Some(shared) = shared() else { return };
    let db = my_database();
    // SAFETY: MyProc is this process's for its life.
    let proc = unsafe { pg_sys::MyProc.offset_from((*pg_sys::ProcGlobal).allProcs) } as i32;
    let entry = shared
        .workers
        .iter()
        .position(|w| w.db.load(SeqCst) == db)
        .or_else(|| shared.workers.iter().position(|w| w.db.compare_exchange(0, db, SeqCst, SeqCst).is_ok()));
    let Some(entry) = entry else { return };
    shared.workers[entry].proc.store(proc, SeqCst);
    shared.workers[entry].overflowed.store(1, SeqCst);
    REGISTERED.set(Some(entry));
}

/// The worker leaves (the entry stays its database's; hand-overs wait for the next worker).
pub fn unregister_worker() {
    let (Some(shared), Some(entry)) = (shared(), REGISTERED.take()) else { return };
    shared.workers[entry].proc.store(-1, SeqCst);
}
