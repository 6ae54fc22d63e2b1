//! The background worker process: wakes every `pgqueue.tick_interval` and runs a tick
//! (see `tick.rs`), sooner while an expired-claim backlog remains.

use crate::guc;
use crate::tick::{self, Bracket, Plan};
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::prelude::*;
use std::time::{Duration, Instant};

const WORKER_TYPE: &str = "pgqueue worker";

/// Registers the worker with the postmaster; only valid while preloading.
pub fn register() {
    BackgroundWorkerBuilder::new(WORKER_TYPE)
        .set_type(WORKER_TYPE)
        .set_library("pgqueue")
        .set_function("pgqueue_worker_main")
        .enable_spi_access()
        // A crash or a pg_terminate_backend brings the worker back after a second.
        .set_restart_time(Some(Duration::from_secs(1)))
        .load();
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pgqueue_worker_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let database = guc::database();
    // Errors (e.g. the database does not exist yet) end the process with a FATAL; the
    // postmaster restarts it after the restart time, so the worker keeps trying.
    BackgroundWorker::connect_worker_to_spi(Some(&database), None);
    log!("pgqueue worker started in database \"{database}\"");
    // No step may hang the worker on a lock: it fails (is counted) and is retried next tick.
    let _ = tick::in_transaction(|| {
        Spi::run("SELECT pg_catalog.set_config('lock_timeout', '5s', false)")
    });

    let mut first = true;
    let mut cursor = 0;
    let mut last_full: Option<Instant> = None;
    loop {
        if BackgroundWorker::sighup_received() {
            // SAFETY: the documented way for a background process to reload its settings.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        let interval = guc::tick_interval();
        let mut wait = interval;
        // A standby cannot write: the worker waits for promotion. Nothing to do either
        // while the extension is not installed (it may be created at any time).
        // SAFETY: reads shared memory state, callable any time after connecting.
        if guc::ENABLED.get() && !unsafe { pg_sys::RecoveryInProgress() } && extension_installed() {
            let all_steps = last_full.is_none_or(|at| at.elapsed() >= interval);
            if all_steps {
                last_full = Some(Instant::now());
            }
            let out = tick::run(Bracket::Transaction, Plan { all_steps, first }, &mut cursor);
            first = false;
            let until_next =
                interval.saturating_sub(last_full.map_or(Duration::ZERO, |at| at.elapsed()));
            // A backlog of expired claims: come straight back for another re-arm pass.
            wait = if out.backlog {
                Duration::ZERO
            } else {
                until_next
            };
        }
        if !BackgroundWorker::wait_latch(Some(wait)) {
            break;
        }
    }
    log!("pgqueue worker exiting");
    // Exit code 1 asks the postmaster for a restart: a pg_terminate_backend on the worker
    // must not remove it for good. At server shutdown nothing is restarted anyway.
    // SAFETY: ends the process the normal way.
    unsafe { pg_sys::proc_exit(1) };
}

/// Whether `pgqueue` is installed in this database.
fn extension_installed() -> bool {
    // SAFETY: catalog lookup inside a transaction; missing_ok = true never raises.
    tick::in_transaction(|| unsafe {
        pg_sys::get_extension_oid(c"pgqueue".as_ptr(), true) != pg_sys::InvalidOid
    })
    .unwrap_or(false)
}
