//! The held set (`in_flight.rs`) in shared memory, one per database: which messages are
//! claimed through the claim ledger. Step 3b of the write path (docs/design/write-path.md)
//! will let claims stop writing the message row and ask this set instead; until then it is
//! **shadowed**: claims that write the ledger take their messages here, the ends of those
//! claims (ack, fail, nack, park, re-arm, a dropped queue) end them at commit, the tick
//! rebuilds it from the ledger, and nothing decides by it. The test kit checks it against the
//! rows, which still decide, wherever it says it is exact (`held_disagreements`).
//!
//! Per transaction this keeps what it took and ended, applied at commit, undone at rollback
//! (a savepoint's at once). A prepared transaction commits elsewhere, later: the set forgets
//! its messages (they are asked about until a rebuild), and the tick does not rebuild while a
//! transaction of the database is prepared. Without preloading, with
//! `pgqueue.held_set_capacity` = 0, or with every set in use by other databases, nothing is
//! kept and nothing is lost.

use crate::in_flight::{Holds, InFlight, Owner, Slot, Take};
use crate::statement::Statement;
use pgrx::heap_tuple::PgHeapTupleError;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::{AllocatedByPostgres, WhoAllocated};
use std::cell::RefCell;
use std::mem::{align_of, size_of};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};

/// Databases with a set of their own.
const SETS: usize = 8;

/// A set's slots, or its log of ends and renewals, in shared memory after the header. A pointer, not a
/// reference: the memory is zeroed before it is set. Backends are forked from the
/// postmaster, so shared memory has the same address in each.
#[repr(C)]
struct Slots {
    start: *mut Slot,
    len: usize,
}

impl std::ops::Deref for Slots {
    type Target = [Slot];
    fn deref(&self) -> &[Slot] {
        // SAFETY: set by startup to a part of shared memory of `len` slots, never moved.
        unsafe { std::slice::from_raw_parts(self.start, self.len) }
    }
}

impl std::ops::DerefMut for Slots {
    fn deref_mut(&mut self) -> &mut [Slot] {
        // SAFETY: as in deref; the caller holds the lock (with_set).
        unsafe { std::slice::from_raw_parts_mut(self.start, self.len) }
    }
}

#[repr(C)]
struct Shared {
    /// 0: free.
    db: u32,
    /// Claims that found their message still in the set (an end or rollback whose callback
    /// had not run yet): the set forgot it.
    passed_over: u64,
    rebuilds: u64,
    /// The last rebuild read more live claims than the set keeps: the next ones wait for the
    /// prune cadence (each reads the whole ledger).
    too_many: bool,
    /// The set is exact and lists nothing (`quiet`): set under the lock after every change,
    /// read without it by every claim that writes rows.
    quiet: AtomicBool,
    set: InFlight<Slots>,
}

#[repr(C)]
struct Header {
    lock: *mut pg_sys::LWLock,
    sets: [Shared; SETS],
}

static mut HEADER: *mut Header = null_mut();

/// Each set's slots: twice the claims it keeps (`pgqueue.held_set_capacity`, rounded up to a
/// power of two); 0: no sets. Each has a log of ends and renewals as long as its capacity, so a claim
/// costs 3 slots, 72 bytes.
fn slots() -> usize {
    match crate::guc::HELD_SET_CAPACITY.get() {
        ..=0 => 0,
        claims => (claims as usize * 2).next_power_of_two(),
    }
}

fn header_size() -> usize {
    size_of::<Header>().next_multiple_of(align_of::<Slot>())
}

/// The shared memory this needs (`queue_state` asks for it with its own).
pub fn size() -> usize {
    match slots() {
        0 => 0,
        n => header_size() + SETS * (n + n / 2) * size_of::<Slot>(),
    }
}

/// Attaches (and at first initialises) the sets; `queue_state::startup` calls this under
/// AddinShmemInitLock.
///
/// # Safety
/// Only from the shared memory startup hook.
pub unsafe fn startup() {
    let n = slots();
    if n == 0 {
        return;
    }
    let mut found = false;
    // SAFETY: the caller holds AddinShmemInitLock; the memory is sized by size(): the header,
    // then each set's slots and log of ends and renewals. Zeroed, then each set made over its part.
    unsafe {
        let header = pg_sys::ShmemInitStruct(c"pgqueue held sets".as_ptr(), size(), &mut found) as *mut Header;
        if !found {
            std::ptr::write_bytes(header as *mut u8, 0, size());
            (*header).lock = &raw mut (*pg_sys::GetNamedLWLockTranche(c"pgqueue held".as_ptr())).lock;
            let base = (header as *mut u8).add(header_size()) as *mut Slot;
            for i in 0..SETS {
                let start = base.add(i * (n + n / 2));
                let set = InFlight::new(Slots { start, len: n }, Slots { start: start.add(n), len: n / 2 });
                std::ptr::write(&raw mut (*header).sets[i].set, set);
            }
        }
        HEADER = header;
    }
}

/// Asks for the lock (from `queue_state`'s request hook).
///
/// # Safety
/// Only from the shared memory request hook.
pub unsafe fn request() {
    // SAFETY: the postmaster's request phase.
    unsafe { pg_sys::RequestNamedLWLockTranche(c"pgqueue held".as_ptr(), 1) };
}

/// Runs `f` on this database's set under the lock; None without one. A claim through the
/// ledger and the tick's rebuild (`take`) take a free set for a database that has none (it
/// starts knowing nothing). `f` must not raise an error.
fn with_set<R>(take: bool, f: impl FnOnce(&mut Shared) -> R) -> Option<R> {
    // SAFETY: HEADER is set once at startup; the lock is released on every path below, and
    // nothing between raises an error.
    unsafe {
        if HEADER.is_null() {
            return None;
        }
        let db = pg_sys::MyDatabaseId.to_u32();
        pg_sys::LWLockAcquire((*HEADER).lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let sets = &mut (*HEADER).sets;
        let i = match sets.iter().position(|s| s.db == db) {
            Some(i) => Some(i),
            None if !take => None,
            None => sets.iter().position(|s| s.db == 0).inspect(|&i| {
                sets[i].db = db;
                sets[i].passed_over = 0;
                sets[i].rebuilds = 0;
                sets[i].too_many = false;
                sets[i].set.restart();
            }),
        };
        let result = i.map(|i| {
            let result = f(&mut sets[i]);
            let quiet = sets[i].set.is_exact() && sets[i].set.is_empty();
            sets[i].quiet.store(quiet, Ordering::SeqCst);
            result
        });
        pg_sys::LWLockRelease((*HEADER).lock);
        result
    }
}

/// Reads this database's set, if it has one, under the shared lock: the claims' picks ask it
/// about every row they meet, and one exclusive lock held them up behind each other.
fn read_set<R>(f: impl FnOnce(&Shared) -> R) -> Option<R> {
    // SAFETY: as in with_set; nothing is written under the shared lock.
    unsafe {
        if HEADER.is_null() {
            return None;
        }
        let db = pg_sys::MyDatabaseId.to_u32();
        pg_sys::LWLockAcquire((*HEADER).lock, pg_sys::LWLockMode::LW_SHARED);
        let sets = &(*HEADER).sets;
        let result = sets.iter().find(|s| s.db == db).map(f);
        pg_sys::LWLockRelease((*HEADER).lock);
        result
    }
}

/// Frees the sets of databases that were dropped (run by the launcher).
pub fn forget_databases(dropped: &[u32]) {
    // SAFETY: as in with_set.
    unsafe {
        if HEADER.is_null() || dropped.is_empty() {
            return;
        }
        pg_sys::LWLockAcquire((*HEADER).lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        for s in (*HEADER).sets.iter_mut().filter(|s| dropped.contains(&s.db)) {
            s.db = 0;
        }
        pg_sys::LWLockRelease((*HEADER).lock);
    }
}

/// This process's owner number while a claim of its transaction is under way.
fn owner() -> Owner {
    // SAFETY: MyProc is this process's for its life (a backend claims; never the postmaster).
    unsafe { pg_sys::MyProc.offset_from((*pg_sys::ProcGlobal).allProcs) as Owner + 1 }
}

fn level() -> i32 {
    // SAFETY: a plain read of the transaction state.
    unsafe { pg_sys::GetCurrentTransactionNestLevel() }
}

/// What this transaction did to its database's set, applied when it ends.
#[derive(Default)]
struct Tx {
    /// Messages it took (and the nesting level it took them at).
    taken: Vec<(i64, i32)>,
    /// Takes that found no room (the set stops vouching for them).
    unrecorded: u32,
    /// Claims it ended: (msg_id, claim number, level).
    ends: Vec<(i64, i32, i32)>,
    /// Leases it set (renewed, or ended by a session's exit): (msg_id, claim number, lease
    /// end, level).
    renewals: Vec<(i64, i32, i64, i32)>,
    /// Claim ledger rows were written around the API: forget everything at commit.
    forget_all: bool,
}

thread_local! {
    static TX: RefCell<Tx> = RefCell::new(Tx::default());
    /// The API's claim statement is writing the ledger (not a restore's `COPY`).
    static CLAIMING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Where this database's set is (`quiet`), once found.
    static SET_INDEX: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Whether this database's SQL notes every end (0.23.0 on, which shows the set in
/// `pgqueue.held_set`): before that, takes would stay.
fn in_use() -> bool {
    // SAFETY: a plain read of a pointer set at startup.
    !unsafe { HEADER.is_null() } && crate::statement::has_relation(c"held_set")
}

/// A claim through the ledger took these messages (msg_id, claim number, lease end), holding
/// their rows. The rows decide for now: a message the set still lists (its last end or
/// rollback committed, its callback not yet run) is held without an entry, as a take that
/// found no room is, so that the set never vouches against a claim it does not list.
pub fn took(claimed: &[(i64, i32, i64)]) {
    if claimed.is_empty() || !in_use() {
        return;
    }
    let (owner, level) = (owner(), level());
    TX.with_borrow_mut(|tx| {
        with_set(true, |shared| {
            for &(msg_id, number, lease_end) in claimed {
                if msg_id == 0 {
                    // The one id a slot cannot hold (a redriven dead letter made by hand).
                    shared.set.hold_unrecorded(msg_id);
                    tx.unrecorded += 1;
                    continue;
                }
                match shared.set.take(owner, msg_id, number, lease_end) {
                    Take::Free | Take::Ask => tx.taken.push((msg_id, level)),
                    Take::AskUnrecorded => tx.unrecorded += 1,
                    Take::Skip => {
                        shared.passed_over += 1;
                        shared.set.hold_unrecorded(msg_id);
                        tx.unrecorded += 1;
                    }
                }
            }
        });
    });
}

/// Whether this database's set vouches for every message: then a pick can pass over held rows
/// by it alone (after a restart, until the tick's rebuild, it cannot).
pub fn exact() -> bool {
    in_use() && read_set(|shared| shared.set.is_exact()).unwrap_or(false)
}

/// Whether no claim through the ledger holds a message of this database: its set vouches for
/// every message and lists none, under way or committed. A claim that writes rows and holds
/// its rows locked may take them then without asking: a claim through the ledger lists its
/// messages before it commits (`took`), and cannot end them while their rows are locked.
/// False without a set (not preloaded, every set taken, before the tick's first rebuild).
pub fn quiet() -> bool {
    // Not `in_use()`: its caller claims on 0.24.0's SQL or later, which has the set's view,
    // and the two catalog lookups would come twice per claim.
    // SAFETY: a plain read of a pointer set at startup.
    if unsafe { HEADER.is_null() } {
        return false;
    }
    // The set's place, found once: it stays this database's while a backend is connected to
    // it (only a dropped database's set is freed).
    let i = match SET_INDEX.get() {
        Some(i) => i,
        None => match read_set_index() {
            Some(i) => {
                SET_INDEX.set(Some(i));
                i
            }
            None => return false,
        },
    };
    // SAFETY: HEADER is set (above); an atomic load, without the lock, which every claim
    // would otherwise take twice. A take (`took`) stores false under the lock before its
    // claim commits, and that commit comes before this claim's row lock on its rows.
    unsafe { (*HEADER).sets[i].quiet.load(Ordering::SeqCst) }
}

/// The index of this database's set, if it has one (under the shared lock).
fn read_set_index() -> Option<usize> {
    // SAFETY: as in with_set; nothing is written under the shared lock.
    unsafe {
        if HEADER.is_null() {
            return None;
        }
        let db = pg_sys::MyDatabaseId.to_u32();
        pg_sys::LWLockAcquire((*HEADER).lock, pg_sys::LWLockMode::LW_SHARED);
        let i = (*HEADER).sets.iter().position(|s| s.db == db);
        pg_sys::LWLockRelease((*HEADER).lock);
        i
    }
}

/// Whether claims hold these messages (msg_id, the next claim number by its row, as the
/// asking claim read it before its lock or holds it locked), as far as this database's set
/// can say: `Ask` for every one where it has none (not preloaded, more databases than sets,
/// the SQL before 0.23.0).
pub fn holds(claims: &[(i64, i32)]) -> Vec<Holds> {
    let ask = || vec![Holds::Ask; claims.len()];
    if claims.is_empty() || !in_use() {
        return ask();
    }
    let owner = owner();
    read_set(|shared| claims.iter().map(|&(msg_id, number)| shared.set.holds(owner, msg_id, number)).collect())
        .unwrap_or_else(ask)
}

/// The claim `number` of `msg_id` ended in this transaction (applied at commit).
pub fn ended(msg_id: i64, number: i32) {
    if !in_use() {
        return;
    }
    let level = level();
    TX.with_borrow_mut(|tx| tx.ends.push((msg_id, number, level)));
}

/// Runs the API's claim statement: ledger rows it writes are known to the set.
pub fn claiming<R>(f: impl FnOnce() -> R) -> R {
    CLAIMING.set(true);
    let result = f();
    CLAIMING.set(false);
    result
}

/// The transaction ended (pending.rs's callback): its takes and ends applied (commit), undone
/// (abort), or forgotten (prepare).
pub fn at_end(event: pg_sys::XactEvent::Type) {
    use pg_sys::XactEvent::*;
    CLAIMING.set(false);
    let tx = TX.with_borrow_mut(std::mem::take);
    if tx.taken.is_empty() && tx.ends.is_empty() && tx.renewals.is_empty() && tx.unrecorded == 0 && !tx.forget_all {
        return;
    }
    let owner = owner();
    let taken: Vec<i64> = tx.taken.iter().map(|&(id, _)| id).collect();
    with_set(false, |shared| match event {
        XACT_EVENT_COMMIT => {
            shared.set.commit(owner, &taken, tx.unrecorded);
            for &(msg_id, number, lease_end, _) in &tx.renewals {
                shared.set.renew(msg_id, number, lease_end);
            }
            for &(msg_id, number, _) in &tx.ends {
                shared.set.end(msg_id, number);
            }
            if tx.forget_all {
                shared.set.forget_all();
            }
        }
        XACT_EVENT_ABORT => shared.set.abort(owner, &taken, tx.unrecorded),
        _ => {
            // Prepared: its claims and ends commit (or not) elsewhere, later.
            let ended = tx.ends.iter().map(|(id, ..)| id);
            for &msg_id in taken.iter().chain(ended).chain(tx.renewals.iter().map(|(id, ..)| id)) {
                shared.set.forget(msg_id);
            }
            shared.set.abort(owner, &[], tx.unrecorded);
            if tx.forget_all {
                shared.set.forget_all();
            }
        }
    });
}

/// A subtransaction ended at nesting `level` (pending.rs's callback): committed, its takes
/// and ends become its parent's; rolled back, its claims' rows are claimable again now.
pub fn at_sub_end(event: pg_sys::SubXactEvent::Type, level: i32) {
    match event {
        pg_sys::SubXactEvent::SUBXACT_EVENT_COMMIT_SUB => TX.with_borrow_mut(|tx| {
            for (_, l) in tx.taken.iter_mut().filter(|(_, l)| *l >= level) {
                *l = level - 1;
            }
            for (.., l) in tx.ends.iter_mut().filter(|(.., l)| *l >= level) {
                *l = level - 1;
            }
            for (.., l) in tx.renewals.iter_mut().filter(|(.., l)| *l >= level) {
                *l = level - 1;
            }
        }),
        pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB => {
            CLAIMING.set(false);
            let undone: Vec<i64> = TX.with_borrow_mut(|tx| {
                tx.ends.retain(|&(.., l)| l < level);
                tx.renewals.retain(|&(.., l)| l < level);
                let undone = tx.taken.iter().filter(|&&(_, l)| l >= level).map(|&(id, _)| id).collect();
                tx.taken.retain(|&(_, l)| l < level);
                undone
            });
            if !undone.is_empty() {
                // Those rows are claimable again now.
                let owner = owner();
                with_set(false, |shared| {
                    for &msg_id in &undone {
                        shared.set.untake(owner, msg_id);
                    }
                });
            }
        }
        _ => {}
    }
}

/// Whether a rebuild must give up: a snapshot older than the rebuild (not READ COMMITTED), or
/// a prepared transaction of this database, whose claims are in no snapshot yet.
static BLOCKED: Statement = Statement {
    sql: c"SELECT pg_catalog.current_setting('transaction_isolation') <> 'read committed'
               OR EXISTS (SELECT FROM pg_catalog.pg_prepared_xacts p WHERE p.database = pg_catalog.current_database())",
    args: &[],
};
/// The live claims by the ledger (an entry whose message's claims_ended is below its number),
/// with their leases in force (the row's, else the ledger row's: a claim through the ledger
/// leaves the row without one), read with the rows they name in one snapshot. Each row
/// looked up from its entry (as in `_ledger_held`), whatever the planner's estimates.
static LIVE: Statement = Statement {
    sql: c"SELECT e.msg_id, e.number, coalesce(m.lease_expires_at, c.lease_expires_at)
             FROM pgqueue.claims c CROSS JOIN LATERAL unnest(c.msg_ids, c.claim_numbers) AS e(msg_id, number)
            CROSS JOIN LATERAL (SELECT r.lease_expires_at FROM pgqueue.message_rows r
                                 WHERE r.msg_id = e.msg_id AND r.claims_ended < e.number LIMIT 1) m",
    args: &[],
};

/// The tick's step: makes the set exact again from the claim ledger where it is not (after a
/// restart, a prepared transaction, a set that filled up). Gives up while a transaction of
/// this database is prepared (its claims are in no snapshot yet) and in a transaction whose
/// snapshot is older than the rebuild (not READ COMMITTED). After a rebuild that found more
/// live claims than the set keeps, the next runs only at the prune cadence (`prune_now`).
/// Returns whether it rebuilt.
pub fn rebuild(prune_now: bool) -> bool {
    if !in_use() {
        return false;
    }
    // The tick takes a set for its database, if one is free, whether or not its sessions
    // claim through the ledger: where the set is exact and lists nothing, claims that write
    // rows take them without asking the ledger (`quiet`).
    let begun = with_set(true, |shared| if shared.too_many && !prune_now { None } else { shared.set.begin_rebuild() });
    let Some(Some(epoch)) = begun else { return false };
    // Read after begin_rebuild, each in a snapshot of its own (Statement::run takes a new
    // one): a claim that commits later took its messages here first; one prepared later
    // makes the rebuild fail (forget). An error leaves it unfinished (the set not exact).
    let Some(live) = Spi::connect_mut(|_| {
        let rows = BLOCKED.run(&[]);
        if rows.len() != 1 || rows.get::<bool>(0, 1) != Some(false) {
            return None;
        }
        let rows = LIVE.run(&[]);
        let live: Vec<(i64, i32, i64)> = (0..rows.len())
            .filter_map(|r| {
                let lease = rows.get::<TimestampWithTimeZone>(r, 3).map(pg_sys::TimestampTz::from);
                Some((rows.get::<i64>(r, 1)?, rows.get::<i32>(r, 2)?, lease.unwrap_or(i64::MAX)))
            })
            .collect();
        Some(live)
    }) else {
        with_set(false, |shared| shared.set.abandon_rebuild(epoch));
        return false;
    };
    with_set(false, |shared| {
        shared.rebuilds += 1;
        shared.too_many = live.len() > shared.set.capacity();
        shared.set.finish_rebuild(epoch, &live)
    })
    .unwrap_or(false)
}

/// `pgqueue._held_end`: the claims (msg_id, claim number) this statement ended (nack, park,
/// re-arm, a dropped queue); applied to the held set at commit. Returns how many.
#[pg_extern(volatile, parallel_unsafe)]
fn _held_end(msg_ids: Option<Vec<Option<i64>>>, numbers: Option<Vec<Option<i32>>>) -> i32 {
    let (ids, numbers) = (msg_ids.unwrap_or_default(), numbers.unwrap_or_default());
    let mut n = 0;
    for (id, number) in ids.into_iter().zip(numbers) {
        if let (Some(id), Some(number)) = (id, number) {
            ended(id, number);
            n += 1;
        }
    }
    n
}

/// `pgqueue._held_renew`: the leases (msg_id, claim number, new end) this statement set
/// (pgq_renew, a session-bound claim whose session exited); applied to the held set at
/// commit. Returns how many.
#[pg_extern(volatile, parallel_unsafe)]
fn _held_renew(
    msg_ids: Option<Vec<Option<i64>>>,
    numbers: Option<Vec<Option<i32>>>,
    leases: Option<Vec<Option<TimestampWithTimeZone>>>,
) -> i32 {
    let (ids, numbers, leases) = (msg_ids.unwrap_or_default(), numbers.unwrap_or_default(), leases.unwrap_or_default());
    let noted: Vec<(i64, i32, i64)> = ids
        .into_iter()
        .zip(numbers)
        .zip(leases)
        .filter_map(|((id, number), lease)| Some((id?, number?, pg_sys::TimestampTz::from(lease?))))
        .collect();
    if in_use() && !noted.is_empty() {
        let level = level();
        TX.with_borrow_mut(|tx| {
            tx.renewals.extend(noted.iter().map(|&(id, number, lease_end)| (id, number, lease_end, level)))
        });
    }
    noted.len() as i32
}

/// `pgqueue._held_forget`: this database's held set forgets everything at commit (the
/// extension was created: a set left by an earlier one must not vouch for the new ids).
#[pg_extern(volatile, parallel_unsafe)]
fn _held_forget() {
    TX.with_borrow_mut(|tx| tx.forget_all = true);
}

/// The statement trigger on `pgqueue.claims`: ledger rows inserted other than by a claim
/// (a restore's `COPY`, an operator) make the set forget everything at commit.
#[pg_trigger]
fn _claims_written<'a>(
    _trigger: &'a PgTrigger<'a>,
) -> Result<Option<PgHeapTuple<'a, impl WhoAllocated>>, PgHeapTupleError> {
    if !CLAIMING.get() {
        TX.with_borrow_mut(|tx| tx.forget_all = true);
    }
    Ok(None::<PgHeapTuple<'a, AllocatedByPostgres>>)
}

/// `pgqueue.held_set`: this database's set; no row without shared memory (or without a set
/// of its own: all taken by other databases).
#[pg_extern(volatile, parallel_unsafe)]
#[allow(clippy::type_complexity)]
fn _held_set() -> TableIterator<
    'static,
    (
        name!(exact, bool),
        name!(held, i64),
        name!(capacity, i64),
        name!(unknown_from, Option<i64>),
        name!(unknown_to, Option<i64>),
        name!(overflows, i64),
        name!(rebuilds, i64),
        name!(rebuilds_refused, i64),
        name!(passed_over, i64),
    ),
> {
    let row = with_set(false, |s| {
        let unknown = s.set.unknown();
        (
            unknown.is_none(),
            s.set.len() as i64,
            s.set.capacity() as i64,
            unknown.map(|u| u.0),
            unknown.map(|u| u.1),
            s.set.overflows as i64,
            s.rebuilds as i64,
            s.set.refused as i64,
            s.passed_over as i64,
        )
    });
    TableIterator::new(row)
}

/// `pgqueue._held_entries`: the set's entries (for the test kit's check against the rows).
#[pg_extern(volatile, parallel_unsafe)]
#[allow(clippy::type_complexity)]
fn _held_entries() -> TableIterator<
    'static,
    (
        name!(msg_id, i64),
        name!(claim_number, i32),
        name!(committed, bool),
        name!(lease_expires_at, Option<TimestampWithTimeZone>),
    ),
> {
    let entries = with_set(false, |s| s.set.entries().collect::<Vec<_>>()).unwrap_or_default();
    TableIterator::new(
        entries
            .into_iter()
            .map(|(id, n, owner, lease_end)| (id, n, owner == 0, TimestampWithTimeZone::try_from(lease_end).ok())),
    )
}
