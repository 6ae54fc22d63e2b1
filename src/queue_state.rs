//! Per-queue state in shared memory, outside MVCC: where each priority's claimable messages
//! start and when the next delayed message may fall due (a `Dispatch`, `dispatch.rs`),
//! approximate depths, and the condition variable waiting claims sleep on.
//!
//! Everything here is a hint. A hint may be too low (a claim then walks a few more index
//! entries) but must never be above a claimable message: anything that makes a message
//! claimable lowers it at commit (`pending.rs`), claims raise it only if nothing was lowered
//! meanwhile (the epoch), and the worker's tick checks every hint against the table
//! (`reconcile.rs`). Without it (library not preloaded, table full, after a restart) claims
//! scan from the start as they always did: slower under a pinned horizon, never wrong.

use crate::dispatch::Dispatch;
use crate::guc;
use crate::rollup;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::c_void;
use std::mem::size_of;
use std::ptr::null_mut;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicI64, AtomicU32};

/// Queue names are at most 40 bytes (`pgqueue._check_queue_name`).
const NAME_LEN: usize = 44;

/// Depth counters, by message state; `Dead`: dead letters in history.
#[derive(Clone, Copy)]
pub enum State {
    Ready = 0,
    Delayed = 1,
    Claimed = 2,
    Dead = 3,
}

/// Counters in a depth: the three message states and dead letters.
pub const DEPTHS: usize = 4;

impl State {
    pub fn parse(state: &str) -> Option<State> {
        match state {
            "ready" => Some(State::Ready),
            "delayed" => Some(State::Delayed),
            "claimed" => Some(State::Claimed),
            // 'history' is where a redrive takes messages from: dead letters only.
            "dead" | "history" => Some(State::Dead),
            _ => None,
        }
    }
}

/// A queue of one database. Zero-padded, so the bytes hash and compare as the key.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Key {
    db: pg_sys::Oid,
    name: [u8; NAME_LEN],
}

impl Key {
    pub fn new(queue: &str) -> Option<Key> {
        let bytes = queue.as_bytes();
        let mut name = [0u8; NAME_LEN];
        name.get_mut(..bytes.len())?.copy_from_slice(bytes);
        // SAFETY: a plain read of this backend's database.
        Some(Key { db: unsafe { pg_sys::MyDatabaseId }, name })
    }

    /// This database's entry for what all its queues share: where claimed messages start.
    /// Queue names start with a letter, so it is nobody's queue.
    pub fn in_flight() -> Key {
        Key::new("*in flight").expect("short")
    }

    pub fn is_queue(&self) -> bool {
        self.name[0].is_ascii_lowercase()
    }

    pub fn queue(&self) -> String {
        let end = self.name.iter().position(|&b| b == 0).unwrap_or(NAME_LEN);
        String::from_utf8_lossy(&self.name[..end]).into_owned()
    }
}

/// One queue's state. Lives in the shared hash table; changed only under the table's lock.
#[repr(C)]
pub struct Entry {
    key: Key,
    /// Waiting claims sleep here.
    cv: pg_sys::ConditionVariable,
    /// Sleepers on `cv`: an entry with sleepers is never removed (they hold its address).
    waiters: u32,
    /// How many messages the sleepers asked for in all (`dispatch::signals`).
    asked: u64,
    /// Where claims start (hints, epoch, in-order sends, next due time).
    pub dispatch: Dispatch,
    /// Approximate depth by state (see `State`); meaningful once `depth_known`. Commits
    /// that only move depths (and lower the in-flight floor and expiry below) do it under the
    /// shared lock, as atomic adds and minimums: they commute, and everything that reads or
    /// sets them as a whole holds the exclusive lock.
    depth: [AtomicI64; DEPTHS],
    depth_known: bool,
    /// The dead-letter count (`depth[Dead]`) is meaningful; and is due for a recount (the
    /// tick recounts it one queue per transaction: a queue's history is many partitions).
    dead_known: bool,
    dead_stale: bool,
    /// Messages sent, completed, dead-lettered and retried (see `rollup::Events`) by commits
    /// since the rollup last drained them: atomic adds under either lock, a swap to drain.
    events: [AtomicI64; rollup::EVENTS],
    /// Waiting claims woken by a signal; hints the tick found too high (missed events).
    wakeups: i64,
    corrections: i64,
    /// In a database's `Key::in_flight` entry only (see `start_pass`): no claimed message of
    /// that database has a lower msg_id, and no lease ends before `next_expiry`; the same two
    /// for what was claimed (or renewed) since the current re-arm pass started.
    claimed_floor: AtomicI64,
    next_expiry: AtomicI64,
    floor_since: AtomicI64,
    expiry_since: AtomicI64,
    pass: u64,
}

#[repr(C)]
struct Header {
    lock: *mut pg_sys::LWLock,
    capacity: i64,
    entries: i64,
    /// Queues that found the table full (they use the fallback path).
    untracked: i64,
}

static mut HEADER: *mut Header = null_mut();
static mut TABLE: *mut pg_sys::HTAB = null_mut();
/// Commits under way that move counters: slot 0 counts processes without a slot of their
/// own, then one per server process, holding its top transaction id (0: none). Set at
/// pre-commit, before others can see the commit, and cleared under the table's lock once
/// its moves are applied (see `pending.rs`, `recount.rs`).
static mut COMMITTING: *mut AtomicU32 = null_mut();
static mut PREVIOUS_REQUEST: pg_sys::shmem_request_hook_type = None;
static mut PREVIOUS_STARTUP: pg_sys::shmem_startup_hook_type = None;

/// Asks for the shared memory at preload time (`_PG_init`).
pub fn init() {
    // SAFETY: hook chaining while the postmaster loads shared_preload_libraries.
    unsafe {
        PREVIOUS_REQUEST = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(request);
        PREVIOUS_STARTUP = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(startup);
    }
}

fn capacity() -> i64 {
    i64::from(guc::MAX_QUEUES.get())
}

fn size() -> usize {
    // SAFETY: pure size arithmetic.
    let table = unsafe { pg_sys::hash_estimate_size(capacity() as _, size_of::<Entry>()) };
    size_of::<Header>().next_multiple_of(16)
        + table
        + committing_size().next_multiple_of(16)
        + crate::outcome_wait::size().next_multiple_of(16)
        + crate::dependencies::size().next_multiple_of(16)
        + crate::held::size().next_multiple_of(16)
}

fn slots() -> usize {
    // SAFETY: set by the postmaster before shared memory is requested.
    1 + unsafe { pg_sys::MaxBackends }.max(0) as usize
}

fn committing_size() -> usize {
    slots() * size_of::<AtomicU32>()
}

#[pg_guard]
unsafe extern "C-unwind" fn request() {
    // SAFETY: called by the postmaster in its shmem request phase.
    unsafe {
        if let Some(previous) = PREVIOUS_REQUEST {
            previous();
        }
        pg_sys::RequestAddinShmemSpace(size());
        pg_sys::RequestNamedLWLockTranche(c"pgqueue".as_ptr(), 1);
        crate::held::request();
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn startup() {
    // SAFETY: the standard shared memory initialisation, under AddinShmemInitLock.
    unsafe {
        if let Some(previous) = PREVIOUS_STARTUP {
            previous();
        }
        let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
        pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let mut found = false;
        let header =
            pg_sys::ShmemInitStruct(c"pgqueue queue state".as_ptr(), size_of::<Header>(), &mut found) as *mut Header;
        if !found {
            header.write(Header {
                lock: &raw mut (*pg_sys::GetNamedLWLockTranche(c"pgqueue".as_ptr())).lock,
                capacity: capacity(),
                entries: 0,
                untracked: 0,
            });
        }
        let mut info: pg_sys::HASHCTL = std::mem::zeroed();
        info.keysize = size_of::<Key>();
        info.entrysize = size_of::<Entry>();
        let n = (*header).capacity as std::ffi::c_long;
        TABLE = pg_sys::ShmemInitHash(
            c"pgqueue queues".as_ptr(),
            n,
            n,
            &mut info,
            (pg_sys::HASH_ELEM | pg_sys::HASH_BLOBS) as i32,
        );
        let committing = pg_sys::ShmemInitStruct(c"pgqueue commits".as_ptr(), committing_size(), &mut found);
        if !found {
            std::ptr::write_bytes(committing as *mut u8, 0, committing_size());
        }
        COMMITTING = committing as *mut AtomicU32;
        crate::outcome_wait::startup();
        crate::dependencies::startup();
        crate::held::startup();
        HEADER = header;
        pg_sys::LWLockRelease(init_lock);
    }
}

/// Whether this server has the shared state (the library was preloaded).
pub fn available() -> bool {
    // SAFETY: set once by the postmaster before any backend starts.
    unsafe { !HEADER.is_null() }
}

/// The table under its lock. Callers never raise an error while holding it (an error would
/// release it anyway: AbortTransaction releases every LWLock).
pub struct Locked {
    _private: (),
}

/// Runs `f` under the table's lock; None without shared memory.
pub fn with_lock<R>(exclusive: bool, f: impl FnOnce(&mut Locked) -> R) -> Option<R> {
    if !available() {
        return None;
    }
    let mode = if exclusive { pg_sys::LWLockMode::LW_EXCLUSIVE } else { pg_sys::LWLockMode::LW_SHARED };
    // SAFETY: HEADER is valid once available(); the lock is released on every path below.
    unsafe {
        pg_sys::LWLockAcquire((*HEADER).lock, mode);
        let result = f(&mut Locked { _private: () });
        pg_sys::LWLockRelease((*HEADER).lock);
        Some(result)
    }
}

thread_local! {
    /// This process's slot in COMMITTING while a commit of its own is under way.
    static MY_COMMIT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// This transaction commits moves of counters (called at pre-commit, before anyone can see
/// the commit).
pub fn commit_starts() {
    // SAFETY: reads of this process's transaction and of its place in the proc array, set
    // for its life; the slot is this process's own.
    unsafe {
        let xid = pg_sys::GetTopTransactionIdIfAny();
        if COMMITTING.is_null() || xid == pg_sys::InvalidTransactionId || MY_COMMIT.get().is_some() {
            return;
        }
        let index = pg_sys::MyProc.offset_from((*pg_sys::ProcGlobal).allProcs);
        let slot = usize::try_from(index + 1).ok().filter(|&i| i < slots()).unwrap_or(0);
        let cell = &*COMMITTING.add(slot);
        if slot == 0 {
            cell.fetch_add(1, SeqCst);
        } else {
            cell.store(xid.into_inner(), SeqCst);
        }
        MY_COMMIT.set(Some(slot));
    }
}

/// This transaction's moves are applied, or it rolled back. With a commit, called under the
/// lock that applied them.
pub fn commit_ends() {
    let Some(slot) = MY_COMMIT.take() else { return };
    // SAFETY: the slot this process took in commit_starts.
    let cell = unsafe { &*COMMITTING.add(slot) };
    if slot == 0 {
        cell.fetch_sub(1, SeqCst);
    } else {
        cell.store(0, SeqCst);
    }
}

impl Locked {
    /// Whether `snapshot` sees a commit whose moves are not applied yet (a count in it would
    /// count that commit twice). Under the exclusive lock, which applying them needs.
    pub fn sees_commits_under_way(&self, snapshot: pg_sys::Snapshot) -> bool {
        (0..slots()).any(|slot| {
            // SAFETY: slots are atomics in shared memory, there for the server's life.
            let value = unsafe { (*COMMITTING.add(slot)).load(SeqCst) };
            // A transaction that was committing when the snapshot was taken and is not in
            // progress in it has committed before it.
            value != 0
                && (slot == 0
                    // SAFETY: a read of the snapshot, which the caller holds.
                    || !unsafe { pg_sys::XidInMVCCSnapshot(pg_sys::TransactionId::from(value), snapshot) })
        })
    }

    /// The entry of `key`; with `create`, made if missing and the table has room.
    /// An entry can still be made.
    pub fn has_room(&self) -> bool {
        // SAFETY: read under the table's lock (held: &self).
        unsafe { (*HEADER).entries < (*HEADER).capacity }
    }

    pub fn entry(&mut self, key: &Key, create: bool) -> Option<&mut Entry> {
        // SAFETY: the table is only searched under its lock (held: &mut self); entries stay
        // where they are until removed, which needs the exclusive lock.
        unsafe {
            let mut found = false;
            let found_entry = pg_sys::hash_search(
                TABLE,
                key as *const Key as *const c_void,
                pg_sys::HASHACTION::HASH_FIND,
                &mut found,
            ) as *mut Entry;
            if !found_entry.is_null() {
                return Some(&mut *found_entry);
            }
            if !create {
                return None;
            }
            if (*HEADER).entries >= (*HEADER).capacity {
                (*HEADER).untracked += 1;
                return None;
            }
            let entry = pg_sys::hash_search(
                TABLE,
                key as *const Key as *const c_void,
                pg_sys::HASHACTION::HASH_ENTER_NULL,
                &mut found,
            ) as *mut Entry;
            if entry.is_null() {
                (*HEADER).untracked += 1;
                return None;
            }
            (*HEADER).entries += 1;
            // The key is already set; everything else starts unknown.
            let entry = &mut *entry;
            pg_sys::ConditionVariableInit(&mut entry.cv);
            entry.waiters = 0;
            entry.asked = 0;
            entry.wakeups = 0;
            entry.corrections = 0;
            (&raw mut entry.dispatch).write(Dispatch::default());
            entry.claimed_floor.store(i64::MIN, Relaxed);
            entry.next_expiry.store(i64::MIN, Relaxed);
            entry.floor_since.store(i64::MIN, Relaxed);
            entry.expiry_since.store(i64::MIN, Relaxed);
            entry.pass = 0;
            entry.events.iter().for_each(|e| e.store(0, Relaxed));
            entry.reset();
            Some(entry)
        }
    }

    /// Removes `key`'s entry unless a waiting claim sleeps on it (then it is only reset).
    pub fn remove(&mut self, key: &Key) {
        let Some(entry) = self.entry(key, false) else { return };
        if entry.waiters > 0 {
            entry.reset();
            entry.wake_all();
            return;
        }
        // SAFETY: under the exclusive lock; nobody holds the entry's address (no sleepers).
        unsafe {
            let mut found = false;
            pg_sys::hash_search(TABLE, key as *const Key as *const c_void, pg_sys::HASHACTION::HASH_REMOVE, &mut found);
            if found {
                (*HEADER).entries -= 1;
            }
        }
    }

    /// Every entry (of every database).
    pub fn entries(&mut self) -> Vec<*mut Entry> {
        let mut all = vec![];
        // SAFETY: a full scan under the lock, run to its end.
        unsafe {
            let mut status: pg_sys::HASH_SEQ_STATUS = std::mem::zeroed();
            pg_sys::hash_seq_init(&mut status, TABLE);
            loop {
                let entry = pg_sys::hash_seq_search(&mut status) as *mut Entry;
                if entry.is_null() {
                    break;
                }
                all.push(entry);
            }
        }
        all
    }

    /// (capacity, queues tracked, times a queue found the table full).
    pub fn usage(&self) -> (i64, i64, i64) {
        // SAFETY: under the lock.
        unsafe { ((*HEADER).capacity, (*HEADER).entries, (*HEADER).untracked) }
    }
}

impl Entry {
    pub fn key(&self) -> Key {
        self.key
    }

    /// Back to "nothing known" (a new or dropped queue, or a validation that must start over).
    fn reset(&mut self) {
        self.dispatch.reset();
        self.depth.iter().for_each(|d| d.store(0, Relaxed));
        self.depth_known = false;
        self.dead_known = false;
        self.dead_stale = false;
    }

    pub fn waiters(&self) -> u32 {
        self.waiters
    }

    /// Under either lock.
    pub fn add_depth(&self, delta: &[i64; DEPTHS]) {
        for (d, n) in self.depth.iter().zip(delta).filter(|(_, n)| **n != 0) {
            d.fetch_add(*n, Relaxed);
        }
    }

    /// The counter of `state` as commits moved it, known or not (see `recount.rs`).
    pub fn raw(&self, state: State) -> i64 {
        self.depth[state as usize].load(Relaxed)
    }

    /// `state` counted as `counted` when the counter read `before`: it keeps what commits
    /// moved it by since.
    pub fn recounted(&mut self, state: State, counted: i64, before: i64) {
        self.depth[state as usize].fetch_add(counted - before, Relaxed);
        match state {
            State::Dead => (self.dead_known, self.dead_stale) = (true, false),
            _ => self.depth_known = true,
        }
    }

    /// Asks the tick to recount the dead letters (what it shows meanwhile is kept).
    pub fn mark_dead_stale(&mut self) {
        self.dead_stale = true;
    }

    /// Dead letters when known, never negative.
    pub fn dead(&self) -> Option<i64> {
        self.dead_known.then(|| self.depth[State::Dead as usize].load(Relaxed).max(0))
    }

    /// The tick should recount the dead letters.
    pub fn dead_due(&self) -> bool {
        !self.dead_known || self.dead_stale
    }

    /// Under either lock.
    pub fn add_events(&self, events: &rollup::Events) {
        for (e, n) in self.events.iter().zip(events.0).filter(|(_, n)| *n != 0) {
            e.fetch_add(n, Relaxed);
        }
    }

    /// What commits counted since the last drain, counted from zero again.
    pub fn drain_events(&self) -> rollup::Events {
        rollup::Events(std::array::from_fn(|i| self.events[i].swap(0, Relaxed)))
    }

    /// (ready, delayed, claimed) when known, never negative.
    pub fn depth(&self) -> Option<[i64; 3]> {
        self.depth_known.then(|| std::array::from_fn(|i| self.depth[i].load(Relaxed).max(0)))
    }

    pub fn counters(&self) -> (i64, i64) {
        (self.wakeups, self.corrections)
    }

    pub fn add_correction(&mut self) {
        self.corrections += 1;
    }

    /// `n` messages became claimable: wake enough sleeping claims for them.
    pub fn wake(&mut self, n: i64) {
        self.dispatch.announce();
        let woken = crate::dispatch::signals(n, self.waiters, self.asked);
        for _ in 0..woken {
            // SAFETY: cv was initialised with the entry; signalling under our LWLock is allowed.
            unsafe { pg_sys::ConditionVariableSignal(&mut self.cv) };
        }
        self.wakeups += woken.max(0);
    }

    /// Wakes one sleeper without announcing anything new: it claims only if something was
    /// announced since it last looked (a signal its first receiver could not use).
    pub fn pass_on(&mut self) {
        if self.waiters > 0 {
            // SAFETY: as in `wake`.
            unsafe { pg_sys::ConditionVariableSignal(&mut self.cv) };
        }
    }

    /// Every sleeping claim looks again (resume, drop).
    pub fn wake_all(&mut self) {
        self.dispatch.announce();
        if self.waiters > 0 {
            self.wakeups += i64::from(self.waiters);
            // SAFETY: as in `wake`.
            unsafe { pg_sys::ConditionVariableBroadcast(&mut self.cv) };
        }
    }

    /// A claim of `qty` messages sleeps.
    pub fn add_waiter(&mut self, qty: u32) -> *mut pg_sys::ConditionVariable {
        self.waiters += 1;
        self.asked += u64::from(qty);
        &mut self.cv
    }

    pub fn remove_waiter(&mut self, qty: u32) {
        self.waiters = self.waiters.saturating_sub(1);
        self.asked = self.asked.saturating_sub(u64::from(qty));
    }

    pub fn db(&self) -> pg_sys::Oid {
        self.key.db
    }
}

/// Starts a re-arm pass of this database, unless no lease can have ended yet (the earliest
/// lease end known is after `now`; `force` starts one anyway, from the start). Returns where
/// claimed messages start (i64::MIN: unknown, from the start) and the pass's number.
///
/// Why: the pass walks the in-flight index, and a pinned xmin horizon keeps there the entries
/// of every message finished since. Starting past them, and only when a lease may have ended,
/// keeps the walk to the live claims, and to once per lease rather than once per tick.
/// Claims (and renewals) lower both values at commit; the pass sets them from what it saw.
pub fn start_pass(now: i64, force: bool) -> Option<(i64, u64)> {
    with_lock(true, |table| {
        let Some(e) = table.entry(&Key::in_flight(), true) else { return Some((i64::MIN, 0)) };
        if !force && e.next_expiry.load(Relaxed) > now {
            return None;
        }
        e.pass += 1;
        e.floor_since.store(i64::MAX, Relaxed);
        e.expiry_since.store(i64::MAX, Relaxed);
        // A forced pass starts from the start too: it is the one that finds claims written
        // around the API (a restore's COPY, an UPDATE of pgqueue.messages).
        Some((if force { i64::MIN } else { e.claimed_floor.load(Relaxed) }, e.pass))
    })
    .unwrap_or(Some((i64::MIN, 0)))
}

/// Pass `pass` saw no claimed message below `first` (i64::MAX: none at all): the next pass
/// may start there. If another pass started meanwhile, this only lowers.
pub fn pass_found_floor(pass: u64, first: i64) {
    with_lock(true, |table| {
        let Some(e) = table.entry(&Key::in_flight(), true) else { return };
        let floor = if e.pass == pass { e.floor_since.load(Relaxed) } else { e.claimed_floor.load(Relaxed) };
        e.claimed_floor.store(first.min(floor), Relaxed);
    });
}

/// Pass `pass` went through every claim and saw no lease ending before `expiry` (i64::MAX:
/// none): no pass is needed before then. If another pass started meanwhile, this only lowers.
pub fn end_pass(pass: u64, expiry: i64) {
    with_lock(true, |table| {
        let Some(e) = table.entry(&Key::in_flight(), true) else { return };
        let since = if e.pass == pass { e.expiry_since.load(Relaxed) } else { e.next_expiry.load(Relaxed) };
        e.next_expiry.store(expiry.min(since), Relaxed);
    });
}

/// Something may have made a lease end sooner (expired orphans): the next tick re-arms.
pub fn lease_may_have_ended() {
    with_lock(true, |table| table.lower_in_flight(i64::MAX, i64::MIN, true));
}

impl Locked {
    /// Messages claimed from `msg_id` on, with leases ending from `expiry` on. Under the
    /// shared lock only if the database's entry exists (`create`: false); whether it did.
    pub fn lower_in_flight(&mut self, msg_id: i64, expiry: i64, create: bool) -> bool {
        let Some(e) = self.entry(&Key::in_flight(), create) else { return false };
        e.claimed_floor.fetch_min(msg_id, Relaxed);
        e.floor_since.fetch_min(msg_id, Relaxed);
        e.next_expiry.fetch_min(expiry, Relaxed);
        e.expiry_since.fetch_min(expiry, Relaxed);
        true
    }
}

/// This database's queues: their events since the last drain (counted from zero again) and
/// their depth when known (for the rollup).
pub fn drain_events() -> Vec<(String, rollup::Events, Option<[i64; 3]>)> {
    // The drain is an atomic swap: fine under the shared lock.
    this_database(|e| (e.key().queue(), e.drain_events(), e.depth()))
}

/// What `f` reads from each queue of this database, under the shared lock (nothing without
/// shared memory).
pub fn this_database<R>(f: impl FnMut(&Entry) -> R) -> Vec<R> {
    // SAFETY: a plain read of this backend's database.
    let db = unsafe { pg_sys::MyDatabaseId };
    with_lock(false, |table| {
        table
            .entries()
            .into_iter()
            // SAFETY: entries from the scan, read under the lock.
            .map(|e| unsafe { &*e })
            .filter(|e| e.db() == db && e.key().is_queue())
            .map(f)
            .collect()
    })
    .unwrap_or_default()
}

/// Forgets the queues of databases that were dropped (run by the launcher).
pub fn forget_databases(dropped: &[u32]) {
    if dropped.is_empty() {
        return;
    }
    with_lock(true, |table| {
        for entry in table.entries() {
            // SAFETY: entries returned by the scan, under the exclusive lock.
            let key = unsafe { (*entry).key };
            if dropped.contains(&key.db.to_u32()) {
                table.remove(&key);
            }
        }
    });
}

/// The table's size and use, server-wide (for `pgqueue.shared_state`); no row without
/// shared memory.
#[pg_extern(volatile, parallel_unsafe)]
fn _shared_state() -> TableIterator<
    'static,
    (name!(max_queues, i64), name!(queues, i64), name!(queues_untracked, i64), name!(bytes_per_queue, i64)),
> {
    let usage = with_lock(false, |table| table.usage());
    TableIterator::new(usage.map(|(cap, n, untracked)| (cap, n, untracked, size_of::<Entry>() as i64)))
}
