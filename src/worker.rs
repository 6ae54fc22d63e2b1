//! The background worker: wakes every `pgqueue.tick_interval` and runs the tick's steps,
//! each in its own transaction, so one failing step never stops the others or the worker.

use crate::guc;
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::time::Duration;

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

    let mut started = false;
    loop {
        if BackgroundWorker::sighup_received() {
            // SAFETY: the documented way for a background process to reload its settings.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        // A standby cannot write; its worker waits for promotion.
        // SAFETY: reads shared memory state, callable any time after connecting.
        if !unsafe { pg_sys::RecoveryInProgress() } {
            started |= tick(!started);
        }
        if !BackgroundWorker::wait_latch(Some(guc::tick_interval())) {
            break;
        }
    }
    log!("pgqueue worker exiting");
    // Exit code 1 asks the postmaster for a restart: a pg_terminate_backend on the worker
    // must not remove it for good. At server shutdown nothing is restarted anyway.
    // SAFETY: ends the process the normal way.
    unsafe { pg_sys::proc_exit(1) };
}

/// One tick. Returns whether the extension was present (its state row was written).
fn tick(first: bool) -> bool {
    in_transaction("heartbeat", || {
        if !extension_exists() {
            return false;
        }
        let started_at = if first { "now()" } else { "started_at" };
        Spi::run_with_args(
            &format!(
                "UPDATE pgqueue.worker_state
                    SET pid = pg_backend_pid(), started_at = {started_at}, last_tick_at = now(),
                        ticks = ticks + 1, tick_interval_ms = $1"
            ),
            &[guc::TICK_INTERVAL_MS.get().into()],
        )
        .map(|_| true)
        .unwrap_or_else(|e| error!("{e}"))
    })
    .unwrap_or(false)
}

/// Whether `pgqueue` is installed in this database (it may be created or dropped at any
/// time; the worker keeps running either way).
fn extension_exists() -> bool {
    // SAFETY: catalog lookup inside a transaction; missing_ok = true never raises.
    unsafe { pg_sys::get_extension_oid(c"pgqueue".as_ptr(), true) != pg_sys::InvalidOid }
}

/// Runs `body` in its own transaction. An error is logged and the transaction rolled
/// back; the worker carries on with `None`.
fn in_transaction<R>(
    step: &str,
    body: impl FnOnce() -> R + UnwindSafe + RefUnwindSafe,
) -> Option<R> {
    // SAFETY: the standard transaction bracket for a background worker.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    let mut body = Some(body);
    PgTryBuilder::new(move || {
        let result = (body.take().expect("runs once"))();
        // SAFETY: closes the bracket opened above; a failing commit lands in the catch.
        unsafe {
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
        }
        Some(result)
    })
    .catch_others(|error| {
        report_failure(step, &error);
        // SAFETY: without this the next StartTransactionCommand fails on a dangling state.
        unsafe { pg_sys::AbortCurrentTransaction() };
        None
    })
    .execute()
}

fn report_failure(step: &str, error: &CaughtError) {
    let message = match error {
        CaughtError::PostgresError(e) | CaughtError::ErrorReport(e) => e.message().to_string(),
        CaughtError::RustPanic { ereport, .. } => ereport.message().to_string(),
    };
    warning!("pgqueue worker: step \"{step}\" failed: {message}");
}
