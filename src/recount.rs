//! Exact recounts of a queue's counters (depths, dead letters) while commits go on.
//!
//! A commit moves the shared counters after others can see it (`pending.rs`), so a count
//! cannot simply replace them: commits that land during the count would be lost, or counted
//! twice. Instead the count runs in a snapshot taken under the table's exclusive lock, where
//! the counters are read too; what it stores is the count plus what commits moved the
//! counters by since. Every commit is then either applied before the snapshot (so counted by
//! it, and not in the difference), or invisible to it (in the difference only) — unless the
//! snapshot sees a commit not applied yet. Those publish their transaction id at pre-commit
//! (`queue_state::commit_starts`); a snapshot that sees one is retaken a moment later.

use crate::queue_state::{self, Key, State};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::CString;

/// Snapshots retaken before the count gives up until the next tick (a commit stays
/// "applied but not yet visible" for microseconds: one retake is almost always enough).
const TRIES: u32 = 50;

/// Counts `states` of `queue` with `sql` (one row, a bigint column per state, `$1` the
/// queue, read-only) and stores them. False when it could not: the queue is untracked or
/// gone, or commits kept landing in the snapshot.
pub fn recount(queue: &str, sql: &str, states: &[State]) -> bool {
    let Some(key) = Key::new(queue) else { return false };
    let mut before = None;
    for _ in 0..TRIES {
        match queue_state::with_lock(true, |table| {
            let read: Vec<i64> = {
                let entry = table.entry(&key, false)?;
                states.iter().map(|&s| entry.raw(s)).collect()
            };
            // SAFETY: the newest snapshot, copied onto the active stack (popped below, or by
            // the abort if the count fails).
            unsafe {
                let snapshot = pg_sys::GetLatestSnapshot();
                if table.sees_commits_under_way(snapshot) {
                    return Some(None);
                }
                pg_sys::PushActiveSnapshot(snapshot);
            }
            Some(Some(read))
        })
        .flatten()
        {
            None => return false,
            Some(Some(read)) => {
                before = Some(read);
                break;
            }
            Some(None) => {
                // SAFETY: a short sleep between snapshots.
                unsafe { pg_sys::pg_usleep(100) };
                pgrx::check_for_interrupts!();
            }
        }
    }
    let Some(before) = before else { return false };
    let counted = count(sql, queue, states.len());
    // SAFETY: pops what was pushed above.
    unsafe { pg_sys::PopActiveSnapshot() };
    let Some(counted) = counted else { return false };
    queue_state::with_lock(true, |table| {
        let Some(entry) = table.entry(&key, false) else { return false };
        for ((&state, counted), before) in states.iter().zip(counted).zip(before) {
            // In pgq_tick() the count sees what the caller's transaction did, which its
            // commit adds.
            let counted = counted - crate::pending::uncommitted_depth(&key, state);
            entry.recounted(state, counted, before);
        }
        true
    })
    .unwrap_or(false)
}

/// The one row of `sql`, run read-only: in the active snapshot (pgrx's SPI takes a new one
/// once the transaction has written). None where it returns no row or a NULL.
fn count(sql: &str, queue: &str, columns: usize) -> Option<Vec<i64>> {
    let sql = CString::new(sql).expect("a query without NUL");
    Spi::connect(|_| {
        // SAFETY: SPI is connected; the argument datum lives until the call returns, and the
        // result is read before SPI is finished.
        unsafe {
            let mut types = [pg_sys::TEXTOID];
            let mut values = [queue.into_datum().expect("a text datum")];
            let rc = pg_sys::SPI_execute_with_args(
                sql.as_ptr(),
                1,
                types.as_mut_ptr(),
                values.as_mut_ptr(),
                std::ptr::null(),
                true,
                1,
            );
            if rc != pg_sys::SPI_OK_SELECT as i32 {
                error!("pgqueue: a recount failed (SPI code {rc})");
            }
            let table = pg_sys::SPI_tuptable;
            if table.is_null() || (*table).numvals == 0 {
                return None;
            }
            let (tuple, desc) = (*(*table).vals, (*table).tupdesc);
            (1..=columns as i32)
                .map(|column| {
                    let mut null = false;
                    let datum = pg_sys::SPI_getbinval(tuple, desc, column, &mut null);
                    i64::from_datum(datum, null)
                })
                .collect()
        }
    })
}
