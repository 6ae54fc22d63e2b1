//! Waiting claims: `pgq_claim(…, wait => …)` sleeps here between two attempts, on its
//! queue's condition variable, until a commit makes messages of that queue claimable (it
//! bumps the queue's wake-up count and signals enough sleepers for those messages by the
//! qty each asked for; one that then gets all it asked for signals the next), or until the
//! deadline. No polling: a sleeper wakes only when signalled, or to pass on a signal it
//! cannot use. Without shared memory it sleeps in short steps instead.

use crate::queue_state::{self, Key};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::Cell;

thread_local! {
    /// The queue this process sleeps on and the qty it sleeps for, for `on_exit`.
    static SLEEPING: Cell<Option<(Key, u32)>> = const { Cell::new(None) };
    static EXIT_HOOKED: Cell<bool> = const { Cell::new(false) };
}

/// Leaves the sleepers of the queue we sleep on, handing on a wake-up we may have received
/// and cannot use (an error or a termination ended the wait).
fn stop_sleeping(pass_on: bool) {
    let Some((key, qty)) = SLEEPING.take() else { return };
    queue_state::with_lock(true, |table| {
        if let Some(entry) = table.entry(&key, false) {
            entry.remove_waiter(qty);
            if pass_on {
                entry.pass_on();
            }
        }
    });
}

/// pg_terminate_backend and shutdown end the process from inside the sleep (FATAL, no
/// error to catch): leave the sleepers on the way out.
#[pg_guard]
unsafe extern "C-unwind" fn on_exit(_code: i32, _arg: pg_sys::Datum) {
    stop_sleeping(true);
}

/// Sleep step when there is no shared state to be woken through.
const FALLBACK_STEP_MS: i64 = 50;

/// Sleeps until `queue`'s wake-up count differs from `seen` (returns true) or until
/// `deadline` (false), as a claim of `qty` messages (a commit signals sleepers for the
/// messages it made claimable by their qty; `chain` signals one more). Interrupts (cancel,
/// statement_timeout, termination) end it with the usual error; postmaster death ends the
/// process. (Also `legacy::_wait`.)
pub fn sleep(queue: &str, seen: Option<i64>, deadline: TimestampWithTimeZone, qty: u32) -> bool {
    let deadline = pg_sys::TimestampTz::from(deadline);
    let key = Key::new(queue);
    // Take a place among the sleepers: the entry cannot be removed while we are one.
    if !EXIT_HOOKED.get() {
        // SAFETY: registers a callback for this process's exit, once.
        unsafe { pg_sys::before_shmem_exit(Some(on_exit), pg_sys::Datum::from(0)) };
        EXIT_HOOKED.set(true);
    }
    let cv = match (key, seen) {
        (Some(key), Some(_)) => queue_state::with_lock(true, |table| {
            table.entry(&key, true).map(|e| {
                SLEEPING.set(Some((key, qty)));
                e.add_waiter(qty)
            })
        })
        .flatten(),
        _ => None,
    };
    let (Some(cv), Some(key), Some(seen)) = (cv, key, seen) else {
        fallback_sleep(deadline);
        return false;
    };
    let changed = || {
        queue_state::with_lock(false, |table| {
            table.entry(&key, false).is_none_or(|e| e.dispatch.wake_seq() as i64 != seen)
        })
        .unwrap_or(true)
    };
    let leave = |pass_on: bool| {
        // SAFETY: we are on cv's wait list, or were; cancelling is always allowed.
        unsafe { pg_sys::ConditionVariableCancelSleep() };
        stop_sleeping(pass_on);
    };
    PgTryBuilder::new(|| {
        // SAFETY: cv stays valid while we count among its waiters.
        unsafe { pg_sys::ConditionVariablePrepareToSleep(cv) };
        let mut woken = false;
        loop {
            if changed() {
                woken = true;
                break;
            }
            let left_ms = remaining_ms(deadline);
            if left_ms <= 0 {
                break;
            }
            // SAFETY: prepared above; returns on a signal, a latch set or the timeout, and
            // checks for interrupts itself.
            unsafe { pg_sys::ConditionVariableTimedSleep(cv, left_ms as _, pg_sys::PG_WAIT_EXTENSION) };
        }
        leave(false);
        woken
    })
    .catch_others(|error| {
        // We may have been the one signalled for a message: hand the signal on, so that
        // another sleeper takes it (a sleeper woken for nothing just sleeps again).
        leave(true);
        error.rethrow()
    })
    .execute()
}

/// A claim woken by a signal got all it asked for: more may be claimable than the signals
/// covered, so the next sleeper looks too (`dispatch::chains`).
pub fn chain(queue: &str) {
    let Some(key) = Key::new(queue) else { return };
    queue_state::with_lock(true, |table| {
        if let Some(entry) = table.entry(&key, false) {
            entry.pass_on();
        }
    });
}

pub fn remaining_ms(deadline: pg_sys::TimestampTz) -> i64 {
    // SAFETY: reads the clock.
    let now = unsafe { pg_sys::GetCurrentTimestamp() };
    (deadline - now + 999).div_euclid(1000)
}

fn fallback_sleep(deadline: pg_sys::TimestampTz) {
    nap(remaining_ms(deadline).clamp(0, FALLBACK_STEP_MS));
}

/// Sleeps `ms` (or until the latch is set) when no signal can come; checks for interrupts.
pub fn nap(ms: i64) {
    if ms <= 0 {
        return;
    }
    // SAFETY: a latch wait as pg_sleep does it; interrupts are checked after it.
    unsafe {
        pg_sys::WaitLatch(
            pg_sys::MyLatch,
            (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
            ms as _,
            pg_sys::PG_WAIT_EXTENSION,
        );
        pg_sys::ResetLatch(pg_sys::MyLatch);
    }
    pgrx::check_for_interrupts!();
}
