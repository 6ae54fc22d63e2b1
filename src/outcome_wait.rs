//! `pgq_result(…, wait => …)`: a caller waiting for a message to finish sleeps on its own
//! slot in shared memory (one per server process), on which it wrote the msg_id it waits for.
//! A transaction that finished messages (`finish::to_history`) looks at the slots once its
//! commit is visible, and signals the slots waiting for one of them. No polling.
//!
//! Outside MVCC, so only an accelerator: the waiter reads the message again whenever it
//! wakes, and at its deadline. A signal that cannot come (no shared memory, a prepared
//! transaction committed by another session) costs the waiter its deadline, never a wrong
//! answer; without shared memory it reads the message in short steps instead.

use crate::on_rows;
use crate::statement::OnRows;
use crate::wait;
use pgrx::datum::Interval;
use pgrx::pg_sys::{self, INT8OID, TEXTOID};
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::mem::size_of;
use std::ptr::null_mut;
use std::sync::atomic::AtomicI64;
use std::sync::atomic::Ordering::SeqCst;

#[repr(C)]
struct Slot {
    /// The msg_id its process waits for; 0: none.
    msg_id: AtomicI64,
    cv: pg_sys::ConditionVariable,
}

#[repr(C)]
struct Header {
    /// Slots in use: a commit with none to signal does not look at them.
    waiting: AtomicI64,
    slots: usize,
}

static mut HEADER: *mut Header = null_mut();

/// Beyond this many finished messages in one transaction, its commit signals every waiter
/// (each reads its message again) rather than keep their ids.
const MAX_KEPT: usize = 10_000;

thread_local! {
    /// The messages this transaction finished; `None` once more than MAX_KEPT.
    static FINISHED: RefCell<Option<Vec<i64>>> = const { RefCell::new(Some(Vec::new())) };
    /// This process waits on its slot (for `on_exit`).
    static WAITING: Cell<Option<usize>> = const { Cell::new(None) };
    static EXIT_HOOKED: Cell<bool> = const { Cell::new(false) };
}

fn slots() -> usize {
    // SAFETY: set by the postmaster before shared memory is requested.
    unsafe { pg_sys::MaxBackends }.max(0) as usize
}

/// The shared memory this needs (`queue_state` asks for it with its own).
pub fn size() -> usize {
    size_of::<Header>().next_multiple_of(16) + slots() * size_of::<Slot>()
}

/// Attaches (and at first initialises) the slots; `queue_state::startup` calls this under
/// AddinShmemInitLock.
///
/// # Safety
/// Only from the shared memory startup hook.
pub unsafe fn startup() {
    let mut found = false;
    // SAFETY: the caller holds AddinShmemInitLock; the struct is sized by size().
    unsafe {
        let header = pg_sys::ShmemInitStruct(c"pgqueue outcome waits".as_ptr(), size(), &mut found) as *mut Header;
        if !found {
            header.write(Header { waiting: AtomicI64::new(0), slots: slots() });
            for i in 0..slots() {
                let slot = slot_at(header, i);
                (&raw mut (*slot).msg_id).write(AtomicI64::new(0));
                pg_sys::ConditionVariableInit(&raw mut (*slot).cv);
            }
        }
        HEADER = header;
    }
}

/// # Safety
/// `header` is the attached header and `i` below its slot count.
unsafe fn slot_at(header: *mut Header, i: usize) -> *mut Slot {
    // SAFETY: the slots follow the header, as size() lays them out.
    unsafe { (header as *mut u8).add(size_of::<Header>().next_multiple_of(16)).cast::<Slot>().add(i) }
}

/// This process's slot, if the server has them and it has one.
fn my_slot() -> Option<usize> {
    // SAFETY: HEADER is set once at startup; MyProc is this process's for its life.
    unsafe {
        if HEADER.is_null() || pg_sys::MyProc.is_null() {
            return None;
        }
        let index = pg_sys::MyProc.offset_from((*pg_sys::ProcGlobal).allProcs);
        usize::try_from(index).ok().filter(|&i| i < (*HEADER).slots)
    }
}

/// `finish::to_history` moved these messages: their waiters are signalled if this commits.
pub fn finished(ids: &[i64]) {
    // SAFETY: a plain read of a pointer set at startup.
    if ids.is_empty() || unsafe { HEADER.is_null() } {
        return;
    }
    FINISHED.with_borrow_mut(|kept| {
        if let Some(list) = kept {
            if list.len() + ids.len() > MAX_KEPT {
                *kept = None;
            } else {
                list.extend_from_slice(ids);
            }
        }
    });
}

/// The transaction committed (its commit is visible): signal those waiting for what it
/// finished. A waiter writes its msg_id before it reads the message, so either it sees this
/// commit or this sees its msg_id.
pub fn at_commit() {
    let Some(finished) = FINISHED.replace(Some(Vec::new())) else { return signal(|_| true) };
    if finished.is_empty() {
        return;
    }
    let mut finished = finished;
    finished.sort_unstable();
    signal(|id| finished.binary_search(&id).is_ok());
}

/// The transaction rolled back or was prepared: nothing it finished is finished yet.
pub fn forget() {
    FINISHED.set(Some(Vec::new()));
}

fn signal(wanted: impl Fn(i64) -> bool) {
    // SAFETY: HEADER is set once at startup; slots live as long as the server.
    unsafe {
        if HEADER.is_null() || (*HEADER).waiting.load(SeqCst) == 0 {
            return;
        }
        for i in 0..(*HEADER).slots {
            let slot = slot_at(HEADER, i);
            let id = (*slot).msg_id.load(SeqCst);
            if id != 0 && wanted(id) {
                pg_sys::ConditionVariableSignal(&raw mut (*slot).cv);
            }
        }
    }
}

fn leave() {
    let Some(i) = WAITING.take() else { return };
    // SAFETY: the slot this process took; cancelling a sleep is always allowed.
    unsafe {
        pg_sys::ConditionVariableCancelSleep();
        (*slot_at(HEADER, i)).msg_id.store(0, SeqCst);
        (*HEADER).waiting.fetch_sub(1, SeqCst);
    }
}

/// pg_terminate_backend and shutdown end the process inside the sleep: free the slot.
#[pg_guard]
unsafe extern "C-unwind" fn on_exit(_code: i32, _arg: pg_sys::Datum) {
    leave();
}

/// Whether the message is still waiting or claimed (in `queue`, if given).
static UNFINISHED: OnRows = on_rows!(&[INT8OID, TEXTOID];
    "SELECT FROM ", ROWS, " m WHERE m.msg_id = $1 AND ($2::text IS NULL OR m.queue = $2)");

/// Sleep step when no signal can come.
const FALLBACK_STEP_MS: i64 = 50;

/// Waits until message `msg_id` is no longer waiting or claimed (finished, or unknown), or
/// for `wait`; returns whether it is (pgq_result then reads it). Interrupts (cancel,
/// statement_timeout, termination) end it with the usual error.
/// `pgqueue._await_outcome` (sql/finish.sql declares it).
#[pg_extern(sql = false)]
fn _await_outcome(msg_id: i64, wait: Interval, queue: Option<&str>) -> bool {
    // SAFETY: reads the clock.
    let deadline = unsafe { pg_sys::GetCurrentTimestamp() } + i64::try_from(wait.as_micros()).unwrap_or(i64::MAX);
    let args = [Some(pg_sys::Datum::from(msg_id)), queue.into_datum()];
    let unfinished = || Spi::connect_mut(|_| UNFINISHED.get().run(&args).len() > 0);
    if !unfinished() {
        return true;
    }
    let slot = my_slot();
    if let Some(i) = slot {
        if !EXIT_HOOKED.get() {
            // SAFETY: registers a callback for this process's exit, once.
            unsafe { pg_sys::before_shmem_exit(Some(on_exit), pg_sys::Datum::from(0)) };
            EXIT_HOOKED.set(true);
        }
        // SAFETY: the slot is this process's own; written before the message is read again.
        unsafe {
            (*slot_at(HEADER, i)).msg_id.store(msg_id, SeqCst);
            (*HEADER).waiting.fetch_add(1, SeqCst);
        }
        WAITING.set(Some(i));
    }
    PgTryBuilder::new(|| {
        if let Some(i) = slot {
            // SAFETY: our own slot's condition variable, there for the server's life.
            unsafe { pg_sys::ConditionVariablePrepareToSleep(&raw mut (*slot_at(HEADER, i)).cv) };
        }
        let done = loop {
            if !unfinished() {
                break true;
            }
            let left_ms = wait::remaining_ms(deadline);
            if left_ms <= 0 {
                break false;
            }
            match slot {
                // SAFETY: prepared above; returns on a signal, a latch set or the timeout,
                // and checks for interrupts itself.
                Some(i) => unsafe {
                    pg_sys::ConditionVariableTimedSleep(
                        &raw mut (*slot_at(HEADER, i)).cv,
                        left_ms as _,
                        pg_sys::PG_WAIT_EXTENSION,
                    );
                },
                None => wait::nap(left_ms.min(FALLBACK_STEP_MS)),
            }
        };
        leave();
        done
    })
    .catch_others(|error| {
        leave();
        error.rethrow()
    })
    .execute()
}

/// `pgqueue._outcome_waiters`: how many pgq_result calls wait now (0 without shared memory).
#[pg_extern(sql = false)]
fn _outcome_waiters() -> i64 {
    // SAFETY: HEADER is set once at startup.
    unsafe { if HEADER.is_null() { 0 } else { (*HEADER).waiting.load(SeqCst) } }
}
