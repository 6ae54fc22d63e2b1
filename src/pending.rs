//! What this transaction did to its queues, applied to the shared state (`queue_state.rs`)
//! when it ends: messages it made claimable lower their queue's claim hint and wake waiting
//! claims at commit (once others can see them), claims it rolls back lower the hint at abort,
//! depth counters move at commit. The callbacks only touch shared memory: they cannot fail.
//!
//! Why sends are special: ids are taken in order but transactions commit in any order. A
//! claim that saw id 7 committed while id 5 was not yet visible may have raised its hint past
//! 5; 5's commit must then lower it. Each commit that makes messages ready is counted at
//! pre-commit (before anyone can see it), so that a send nobody can have claimed past commits
//! without lowering (`Dispatch::commit_ready`).

use crate::dependencies;
use crate::dispatch::DUE_NEVER;
use crate::held;
use crate::outcome_wait;
use crate::queue_state::{self, DEPTHS, Key, State};
use crate::rollup;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::ffi::c_void;

#[derive(Clone, Copy, PartialEq)]
pub enum Kind {
    /// New messages from a send: may commit "in order" (no lowering).
    Sent,
    /// Messages made claimable by anything else (nack, re-arm, promotion, redrive).
    Readied,
    /// Messages this transaction claimed: claimable again if it rolls back.
    Claimed,
    /// Rows a claim of this transaction passed over that their holder may leave claimable: at
    /// commit as `Readied`, but made claimable by someone else, so this transaction's claims
    /// keep their hints (from the start of the queue they would meet every row in flight).
    Skipped,
    /// Only depth, due times or wake-ups.
    Other,
}

#[derive(Clone, Copy)]
pub struct Note {
    pub key: Key,
    pub kind: Kind,
    pub priority: i16,
    pub low: i64,
    pub high: i64,
    /// Messages made claimable (Sent, Readied) or claimed (Claimed).
    pub count: i64,
    pub depth: [i64; DEPTHS],
    /// Sent, completed, dead, retried: added to the queue's rollup counters at commit.
    pub events: rollup::Events,
    /// Earliest due time of delayed messages it adds.
    pub due: i64,
    /// Earliest lease end of messages it claimed or renewed.
    pub expiry: i64,
    /// Rolled back, this leaves the queue's next due time unknown: it raised it, or it
    /// promoted messages, which are then delayed and due again (another promotion may have
    /// raised the due time past them, skipping them locked).
    pub forgets_due: bool,
    pub wake_all: bool,
    /// The queue was created or dropped: start over.
    pub reset: bool,
    /// Set at pre-commit (Sent, Readied): its number among ready-making commits, and the
    /// highest id made ready before it.
    sequence: u64,
    before: i64,
    /// Subtransaction nesting level it was made at, and whether that rolled back.
    level: i32,
    undone: bool,
}

impl Note {
    pub fn new(key: Key, kind: Kind) -> Note {
        Note {
            key,
            kind,
            priority: 0,
            low: i64::MAX,
            high: i64::MIN,
            count: 0,
            depth: [0; DEPTHS],
            events: rollup::Events::default(),
            due: DUE_NEVER,
            expiry: i64::MAX,
            forgets_due: false,
            wake_all: false,
            reset: false,
            sequence: 0,
            before: 0,
            level: 0,
            undone: false,
        }
    }

    pub fn moved(&mut self, n: i64, from: Option<State>, to: Option<State>) {
        if let Some(s) = from {
            self.depth[s as usize] -= n;
        }
        if let Some(s) = to {
            self.depth[s as usize] += n;
        }
    }
}

thread_local! {
    static NOTES: RefCell<Vec<Note>> = const { RefCell::new(Vec::new()) };
}

/// Remembers `note` until the transaction ends.
pub fn record(mut note: Note) {
    if !queue_state::available() {
        return;
    }
    // SAFETY: a plain read of the transaction state.
    note.level = unsafe { pg_sys::GetCurrentTransactionNestLevel() };
    NOTES.with_borrow_mut(|notes| {
        // Many sends of one transaction to one queue make one note. Never into a note a
        // savepoint rolled back: ROLLBACK TO restarts the savepoint at the same level, and
        // what is done after it is not undone.
        if let Some(last) = notes.last_mut()
            && last.key == note.key
            && last.kind == note.kind
            && last.priority == note.priority
            && last.level == note.level
            && !last.undone
            && !last.reset
            && !note.reset
        {
            last.low = last.low.min(note.low);
            last.high = last.high.max(note.high);
            last.count += note.count;
            last.add_depth(&note.depth);
            last.events.add(&note.events);
            last.due = last.due.min(note.due);
            last.expiry = last.expiry.min(note.expiry);
            last.forgets_due |= note.forgets_due;
            last.wake_all |= note.wake_all;
            return;
        }
        notes.push(note);
    });
}

impl Note {
    fn add_depth(&mut self, depth: &[i64; DEPTHS]) {
        for (d, n) in self.depth.iter_mut().zip(depth) {
            *d += n;
        }
    }

    fn makes_ready(&self) -> bool {
        matches!(self.kind, Kind::Sent | Kind::Readied | Kind::Skipped) && self.count > 0
    }

    /// Whether all it does at commit is count: move depths, lower the in-flight floor.
    fn only_counts(&self) -> bool {
        !self.reset && !self.undone && !self.makes_ready() && self.due == DUE_NEVER && !self.wake_all
    }

    fn lowers_in_flight(&self) -> bool {
        self.kind == Kind::Claimed || self.expiry != i64::MAX
    }

    /// Where its claims start (i64::MAX: it claimed nothing, only leases changed).
    fn in_flight_low(&self) -> i64 {
        if self.kind == Kind::Claimed { self.low } else { i64::MAX }
    }
}

/// Whether this transaction made messages of `key` claimable and has not committed yet: the
/// shared hints learn of them only at commit, but this transaction's own claims see them.
pub fn makes_ready_uncommitted(key: &Key) -> bool {
    NOTES.with_borrow(|notes| {
        notes.iter().any(|n| n.key == *key && !n.undone && n.kind != Kind::Skipped && n.makes_ready())
    })
}

/// What this transaction's notes, not yet applied, move `key`'s `state` count by: a count made
/// inside the transaction sees those changes already.
pub fn uncommitted_depth(key: &Key, state: State) -> i64 {
    NOTES
        .with_borrow(|notes| notes.iter().filter(|n| n.key == *key && !n.undone).map(|n| n.depth[state as usize]).sum())
}

/// Registers the callbacks for this process (whenever the library is loaded).
pub fn init() {
    // SAFETY: permanent callbacks; they run in this process only.
    unsafe {
        pg_sys::RegisterXactCallback(Some(on_xact), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(on_subxact), std::ptr::null_mut());
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn on_xact(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_PRE_COMMIT => pre_commit(),
        XACT_EVENT_COMMIT => {
            finish(true);
            outcome_wait::at_commit();
            dependencies::at_commit();
            held::at_end(event);
        }
        XACT_EVENT_ABORT => {
            finish(false);
            outcome_wait::forget();
            dependencies::forget();
            held::at_end(event);
        }
        // A prepared transaction commits elsewhere, later: its messages are found by the
        // worker's check at the next tick.
        XACT_EVENT_PREPARE => {
            NOTES.with_borrow_mut(Vec::clear);
            outcome_wait::forget();
            dependencies::forget();
            queue_state::commit_ends();
            held::at_end(event);
        }
        _ => {}
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn on_subxact(
    event: pg_sys::SubXactEvent::Type,
    _sub: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut c_void,
) {
    // SAFETY: a plain read of the transaction state.
    let level = unsafe { pg_sys::GetCurrentTransactionNestLevel() };
    held::at_sub_end(event, level);
    match event {
        pg_sys::SubXactEvent::SUBXACT_EVENT_COMMIT_SUB => NOTES.with_borrow_mut(|notes| {
            for note in notes.iter_mut().filter(|n| n.level >= level) {
                note.level = level - 1;
            }
        }),
        pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB => {
            // Only what this rollback undoes (an earlier one at this level was applied then).
            let undone: Vec<Note> = NOTES.with_borrow_mut(|notes| {
                notes
                    .iter_mut()
                    .filter(|n| n.level >= level && !n.undone)
                    .map(|n| {
                        n.undone = true;
                        *n
                    })
                    .collect()
            });
            // Claims rolled back with the savepoint are claimable right now.
            apply_rollback(&undone);
        }
        _ => {}
    }
}

fn pre_commit() {
    NOTES.with_borrow_mut(|notes| {
        if notes.iter().any(|n| !n.undone) {
            queue_state::commit_starts();
        }
        let ready: Vec<&Note> = notes.iter().filter(|n| n.makes_ready() && !n.undone).collect();
        if ready.is_empty() {
            return;
        }
        // One count per queue per transaction, covering all of its notes.
        let mut counted: Vec<(Key, i64, u64, i64)> = vec![];
        for note in ready {
            match counted.iter_mut().find(|(k, ..)| *k == note.key) {
                Some((_, high, ..)) => *high = (*high).max(note.high),
                None => counted.push((note.key, note.high, 0, 0)),
            }
        }
        queue_state::with_lock(true, |table| {
            for (key, high, sequence, before) in counted.iter_mut() {
                if let Some(entry) = table.entry(key, true) {
                    (*sequence, *before) = entry.dispatch.precommit_ready(*high);
                }
            }
        });
        for note in notes.iter_mut() {
            if let Some(&(_, _, sequence, before)) = counted.iter().find(|(k, ..)| *k == note.key) {
                note.sequence = sequence;
                note.before = before;
            }
        }
    });
}

fn finish(committed: bool) {
    let notes = NOTES.with_borrow_mut(std::mem::take);
    if !committed {
        queue_state::commit_ends();
        apply_rollback(&notes);
        return;
    }
    // Cleared under the lock that applies the moves (a recount's snapshot is taken under the
    // exclusive lock: it sees this commit either applied or under way), and at last anyway.
    apply(&notes);
    queue_state::commit_ends();
}

fn apply(notes: &[Note]) {
    if notes.is_empty() {
        return;
    }
    // Most commits (claims, acks) only move depths and lower the in-flight floor: atomics,
    // under the shared lock, so that they do not queue behind each other and the claims.
    if notes.iter().all(Note::only_counts)
        && queue_state::with_lock(false, |table| {
            // Entries are removed only under the exclusive lock: found now, there until the end.
            let found = notes.iter().all(|n| table.entry(&n.key, false).is_some())
                && (!notes.iter().any(Note::lowers_in_flight) || table.entry(&Key::in_flight(), false).is_some());
            if found {
                for note in notes.iter() {
                    if note.lowers_in_flight() {
                        table.lower_in_flight(note.in_flight_low(), note.expiry, false);
                    }
                    if let Some(entry) = table.entry(&note.key, false) {
                        entry.add_depth(&note.depth);
                        entry.add_events(&note.events);
                    }
                }
                queue_state::commit_ends();
            }
            found
        })
        .unwrap_or(true)
    {
        return;
    }
    queue_state::with_lock(true, |table| {
        for note in notes.iter() {
            if note.reset && !note.undone {
                table.remove(&note.key);
                continue;
            }
            if note.undone {
                if note.kind == Kind::Claimed {
                    // Rolled back with a savepoint: lowered then; again now that it is final.
                    if let Some(entry) = table.entry(&note.key, false) {
                        entry.dispatch.lower(note.priority, note.low);
                    }
                }
                continue;
            }
            if note.lowers_in_flight() {
                table.lower_in_flight(note.in_flight_low(), note.expiry, true);
            }
            let Some(entry) = table.entry(&note.key, true) else { continue };
            entry.add_depth(&note.depth);
            entry.add_events(&note.events);
            if note.makes_ready() {
                let sent = (note.kind == Kind::Sent).then_some((note.sequence, note.before));
                entry.dispatch.commit_ready(note.priority, note.low, sent);
                entry.wake(note.count);
            }
            if note.due != DUE_NEVER {
                entry.dispatch.lower_due(note.due);
            }
            if note.wake_all {
                entry.wake_all();
            }
        }
        queue_state::commit_ends();
    });
}

/// What a rollback makes claimable again: the messages its claims had taken.
fn apply_rollback(notes: &[Note]) {
    if !notes.iter().any(|n| n.kind == Kind::Claimed || n.forgets_due) {
        return;
    }
    queue_state::with_lock(true, |table| {
        for note in notes {
            let Some(entry) = table.entry(&note.key, false) else { continue };
            // (A claim's rows are noted as it is handed them, before it has claimed any.)
            if note.kind == Kind::Claimed && note.low <= note.high {
                entry.dispatch.lower(note.priority, note.low);
                entry.wake(note.count);
            }
            if note.forgets_due {
                entry.dispatch.forget_due();
            }
        }
    });
}

/// `n` messages of `queue` moved `from_state` → `to_state` ('ready', 'delayed', 'claimed';
/// NULL: new from a send; 'completed', 'dead' or NULL: gone to history; 'history': back from
/// it by a redrive), with
/// the lowest and highest msg_id of those made ready and, for delayed ones, the earliest due
/// time. Applied when the transaction commits.
#[pg_extern(volatile, parallel_unsafe)]
#[allow(clippy::too_many_arguments)]
fn _note(
    queue: &str,
    n: i64,
    from_state: Option<&str>,
    to_state: Option<&str>,
    priority: default!(Option<i16>, "NULL"),
    low: default!(Option<i64>, "NULL"),
    high: default!(Option<i64>, "NULL"),
    due: default!(Option<pgrx::datum::TimestampWithTimeZone>, "NULL"),
) -> bool {
    let Some(key) = Key::new(queue) else { return false };
    if n <= 0 || !queue_state::available() {
        return false;
    }
    let from = from_state.and_then(State::parse);
    let to = to_state.and_then(State::parse);
    let kind = match (from_state, to) {
        (_, Some(State::Ready)) if low.is_none() => Kind::Other,
        (None, Some(State::Ready)) => Kind::Sent,
        (Some(_), Some(State::Ready)) => Kind::Readied,
        _ => Kind::Other,
    };
    let mut note = Note::new(key, kind);
    note.moved(n, from, to);
    note.events = rollup::Events::of_move(n, from_state, to_state);
    if kind != Kind::Other {
        note.priority = priority.unwrap_or(0);
        note.low = low.unwrap_or(i64::MAX);
        note.high = high.or(low).unwrap_or(i64::MIN);
        note.count = n;
    }
    if matches!(to, Some(State::Delayed)) {
        note.due = due.map_or(i64::MIN, pg_sys::TimestampTz::from);
    }
    if matches!(from, Some(State::Delayed)) && kind == Kind::Readied {
        // Promoted (a claim's own scan sees them: it scans from the start, as after any
        // change of its own that makes messages ready). Rolled back, they are due again.
        note.forgets_due = true;
    }
    record(note);
    true
}

/// `queue` was created or dropped: its shared state starts over when this commits.
#[pg_extern(volatile, parallel_unsafe)]
fn _reset_queue(queue: &str) -> bool {
    let Some(key) = Key::new(queue) else { return false };
    let mut note = Note::new(key, Kind::Other);
    note.reset = true;
    record(note);
    true
}

/// `queue` was resumed: its waiting claims look again when this commits.
#[pg_extern(volatile, parallel_unsafe)]
fn _wake_queue(queue: &str) -> bool {
    let Some(key) = Key::new(queue) else { return false };
    let mut note = Note::new(key, Kind::Other);
    note.wake_all = true;
    record(note);
    true
}

/// Claims renewed by this transaction hold their leases until at least `until`: the re-arm
/// pass must not wait longer than that (a renewal may shorten a lease).
#[pg_extern(volatile, parallel_unsafe)]
fn _renewed(until: Option<pgrx::datum::TimestampWithTimeZone>) -> bool {
    let Some(until) = until else { return false };
    let mut note = Note::new(Key::in_flight(), Kind::Other);
    note.expiry = pg_sys::TimestampTz::from(until);
    record(note);
    true
}
