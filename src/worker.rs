//! The background workers. A launcher (one per server, connected to no database) finds the
//! databases and starts one worker per database; a worker whose database does not have the
//! extension exits at once, and the launcher looks again every `pgqueue.launcher_naptime`.
//! A database worker wakes every `pgqueue.tick_interval` and runs a tick (`tick.rs`),
//! sooner while an expired-claim backlog remains or when a schedule falls due. One worker
//! per database: a restarted launcher adopts the workers running (`running_workers`), and
//! each worker holds its database's lock (`hold_database`), so that no second one ticks.

use crate::bracket::{Bracket, in_transaction};
use crate::guc;
use crate::tick::{self, Plan};
use pgrx::PgMemoryContexts;
use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BackgroundWorkerStatus, DynamicBackgroundWorker, SignalWakeFlags,
};
use pgrx::prelude::*;
use std::collections::HashMap;
use std::ffi::CStr;
use std::time::{Duration, Instant};

const LAUNCHER: &str = "pgqueue launcher";
/// The backend type of the database workers (what pg_stat_activity shows).
pub const WORKER: &str = "pgqueue worker";

/// Registers the launcher with the postmaster, and the DROP DATABASE hook; only valid while
/// preloading.
pub fn register() {
    BackgroundWorkerBuilder::new(LAUNCHER)
        .set_type(LAUNCHER)
        .set_library("pgqueue")
        .set_function("pgqueue_launcher_main")
        .enable_spi_access()
        // A crash or a pg_terminate_backend brings it back after a second.
        .set_restart_time(Some(Duration::from_secs(1)))
        .load();
    crate::drop_database::install_hook();
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pgqueue_launcher_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    // No database: the launcher only reads the shared catalog pg_database.
    BackgroundWorker::connect_worker_to_spi(None, None);
    log!("pgqueue launcher started");
    // Each worker's handle lives in a memory context of its own, deleted with the entry:
    // the postmaster's handles would otherwise pile up in the launcher's top context.
    let mut workers: HashMap<u32, (DynamicBackgroundWorker, PgMemoryContexts)> = HashMap::new();
    let mut probed: HashMap<u32, Instant> = HashMap::new();
    let mut seen: Vec<u32> = vec![];
    loop {
        if BackgroundWorker::sighup_received() {
            // SAFETY: the documented way for a background process to reload its settings.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        let naptime = guc::launcher_naptime();
        let all = databases();
        // Shared queue state of dropped databases would otherwise stay until a restart. Only
        // databases seen before and gone now: one created since this scan began is not gone.
        let gone: Vec<u32> = seen.iter().filter(|oid| !all.iter().any(|(o, _)| o == *oid)).copied().collect();
        crate::queue_state::forget_databases(&gone);
        crate::held::forget_databases(&gone);
        seen = all.iter().map(|(oid, _)| *oid).collect();
        let wanted: Vec<(u32, String)> = all.into_iter().filter(|(_, name)| guc::database_wanted(name)).collect();
        // Forget workers that have exited; stop those whose database is no longer wanted,
        // ours and those a launcher before us started.
        workers.retain(|_, (worker, _)| matches!(worker.pid(), Ok(_) | Err(BackgroundWorkerStatus::NotYetStarted)));
        let unwanted: Vec<u32> = workers.keys().filter(|oid| !wanted.iter().any(|(o, _)| o == *oid)).copied().collect();
        for oid in unwanted {
            if let Some((worker, _)) = workers.remove(&oid) {
                let _ = worker.terminate();
            }
        }
        let running = running_workers();
        for &(oid, pid) in &running {
            if !workers.contains_key(&oid) && !wanted.iter().any(|(o, _)| *o == oid) {
                // SAFETY: SIGTERM to a worker of this server; it exits at its next wait.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
        probed.retain(|oid, _| wanted.iter().any(|(o, _)| o == oid)); // dropped databases
        for (oid, name) in &wanted {
            let due = probed.get(oid).is_none_or(|at| at.elapsed() >= naptime);
            if workers.contains_key(oid) || !due || running.iter().any(|(o, _)| o == oid) {
                continue;
            }
            probed.insert(*oid, Instant::now());
            let mut context = PgMemoryContexts::new("pgqueue worker handle");
            // SAFETY: the handle is allocated in `context`, which lives as long as the entry.
            match unsafe { context.switch_to(|_| start_database_worker(*oid, name)) } {
                Ok(worker) => {
                    workers.insert(*oid, (worker, context));
                }
                Err(e) => warning!(
                    "pgqueue launcher: cannot start a worker for database \"{name}\": {e:?} (max_worker_processes?)"
                ),
            }
        }
        if !BackgroundWorker::wait_latch(Some(naptime.min(Duration::from_secs(1)))) {
            break;
        }
    }
    log!("pgqueue launcher exiting");
    // Exit code 1: the postmaster restarts it (after a pg_terminate_backend too).
    // SAFETY: ends the process the normal way.
    unsafe { pg_sys::proc_exit(1) };
}

fn start_database_worker(oid: u32, name: &str) -> Result<DynamicBackgroundWorker, impl std::fmt::Debug> {
    BackgroundWorkerBuilder::new(&format!("{WORKER} for {name}"))
        .set_type(WORKER)
        .set_library("pgqueue")
        .set_function("pgqueue_worker_main")
        .set_argument(Some(pg_sys::Datum::from(oid)))
        .enable_spi_access()
        .set_restart_time(None) // the launcher decides when to start one again
        // SAFETY: our own pid, so that the postmaster tells us when it starts and stops.
        .set_notify_pid(unsafe { pg_sys::MyProcPid })
        .load_dynamic()
}

/// (database oid, pid) of every pgqueue worker running now, whoever started it.
fn running_workers() -> Vec<(u32, i32)> {
    let mut found = vec![];
    // SAFETY: the proc array is in shared memory for the server's life; a slot read while it
    // changes gives a pid that the worker-type lookup (under its own lock) then rejects, and
    // a worker missed here is kept unique by its database's lock.
    unsafe {
        let global = pg_sys::ProcGlobal;
        for i in 0..(*global).allProcCount as usize {
            let proc = (*global).allProcs.add(i);
            let (pid, db) = ((&raw const (*proc).pid).read_volatile(), (*proc).databaseId);
            if pid == 0 || db == pg_sys::InvalidOid {
                continue;
            }
            let kind = pg_sys::GetBackgroundWorkerTypeByPid(pid);
            if !kind.is_null() && CStr::from_ptr(kind).to_bytes() == WORKER.as_bytes() {
                found.push((db.to_u32(), pid));
            }
        }
    }
    found
}

/// Takes this database's worker lock, without waiting; false if another worker holds it.
/// An advisory lock tag whose fourth field no SQL function sets (they use 1 and 2), so no
/// application's advisory lock can collide with it; held until the process exits. pg_locks
/// shows it as an advisory lock with classid 0x70677175 and objsubid 3.
fn hold_database(db: pg_sys::Oid) -> bool {
    let tag = pg_sys::LOCKTAG {
        locktag_field1: db.to_u32(),
        locktag_field2: 0x7067_7175, // "pgqu"
        locktag_field3: 0,
        locktag_field4: 3,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    };
    // SAFETY: a session lock (no transaction or resource owner needed), released at exit.
    let got = unsafe { pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, true, true) };
    got != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
}

/// (oid, name) of every database that accepts connections and is not a template, read
/// straight from the shared catalog (the launcher has no database to run SQL in).
fn databases() -> Vec<(u32, String)> {
    let mut found = vec![];
    // SAFETY: a catalog heap scan in a transaction, as the autovacuum launcher does it.
    unsafe {
        pg_sys::StartTransactionCommand();
        pg_sys::GetTransactionSnapshot();
        let rel = pg_sys::table_open(pg_sys::DatabaseRelationId, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let scan = pg_sys::table_beginscan_catalog(rel, 0, std::ptr::null_mut());
        loop {
            let tuple = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
            if tuple.is_null() {
                break;
            }
            let db = &*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_database>(tuple);
            // datconnlimit -2 marks a database left invalid by an interrupted DROP DATABASE.
            if db.datallowconn && !db.datistemplate && db.datconnlimit != -2 {
                let name = CStr::from_ptr(db.datname.data.as_ptr()).to_string_lossy().into_owned();
                found.push((db.oid.to_u32(), name));
            }
        }
        pg_sys::heap_endscan(scan);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        pg_sys::CommitTransactionCommand();
    }
    found
}

/// What PostgreSQL's `die` does for a backend: the next interrupt check ends the process
/// (FATAL, the transaction rolled back), and a wait wakes up.
unsafe extern "C-unwind" fn on_sigterm(_signal: i32) {
    // SAFETY: flags PostgreSQL reads at its interrupt checks, and this process's latch (safe
    // in a signal handler); errno is kept for the code the signal interrupted.
    unsafe {
        let errno = *libc::__errno_location();
        (&raw mut pg_sys::InterruptPending).write_volatile(1);
        (&raw mut pg_sys::ProcDiePending).write_volatile(1);
        pg_sys::SetLatch(pg_sys::MyLatch);
        *libc::__errno_location() = errno;
    }
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pgqueue_worker_main(arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP);
    // SIGTERM (a fast shutdown, pg_terminate_backend, DROP DATABASE) as for any backend: a
    // statement under way ends at its next interrupt check (the tick's transaction rolls
    // back), so a long one — a recount of a large queue, a wait for a lock — never holds up
    // a shutdown; between ticks the wait ends and the loop leaves.
    // SAFETY: a handler for this process, installed the way PostgreSQL installs its own.
    unsafe {
        #[cfg(not(feature = "pg18"))]
        pg_sys::pqsignal(libc::SIGTERM, Some(on_sigterm));
        #[cfg(feature = "pg18")]
        pg_sys::pqsignal_be(libc::SIGTERM, Some(on_sigterm));
    }
    let oid = pg_sys::Oid::from(arg.value() as u32);
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(oid), None);
    if !extension_installed() {
        // Nothing to look after here; the launcher looks again later.
        // SAFETY: ends the process the normal way (0: not restarted).
        unsafe { pg_sys::proc_exit(0) };
    }
    if !hold_database(oid) {
        log!("pgqueue worker: another worker runs in this database; exiting");
        // SAFETY: as above.
        unsafe { pg_sys::proc_exit(0) };
    }
    log!("pgqueue worker started");
    crate::dependencies::register_worker();
    // No step may hang the worker on a lock: it fails (is counted) and is retried next tick.
    let _ = in_transaction(|| Spi::run("SELECT pg_catalog.set_config('lock_timeout', '5s', false)"));

    let mut first = true;
    let mut pass = tick::Pass::default();
    let mut last_full: Option<Instant> = None;
    loop {
        if BackgroundWorker::sighup_received() {
            // SAFETY: the documented way for a background process to reload its settings.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        if !extension_installed() {
            log!("pgqueue worker: the extension was dropped; exiting");
            break;
        }
        let interval = guc::tick_interval();
        let mut wait = interval;
        // A standby cannot write; the launcher only starts workers after promotion, but a
        // check costs nothing.
        // SAFETY: reads shared memory state, callable any time after connecting.
        if guc::ENABLED.get() && !unsafe { pg_sys::RecoveryInProgress() } {
            let all_steps = last_full.is_none_or(|at| at.elapsed() >= interval);
            if all_steps {
                last_full = Some(Instant::now());
            }
            let out = tick::run(Bracket::Transaction, Plan { all_steps, first }, &mut pass);
            first = false;
            let until_next = interval.saturating_sub(last_full.map_or(Duration::ZERO, |at| at.elapsed()));
            // A schedule due before the next tick: wake for it. (One still due after firing
            // — a lock conflict — waits for the tick, so a conflict never spins.)
            // SAFETY: reads the clock.
            let now = unsafe { pg_sys::GetCurrentTimestamp() };
            let until_schedule = out
                .next_schedule
                .filter(|due| *due > now)
                .map_or(until_next, |due| Duration::from_micros((due - now) as u64));
            // A backlog of expired claims: come straight back for another re-arm pass.
            wait = if out.backlog { Duration::ZERO } else { until_next.min(until_schedule) };
        }
        // SAFETY: a read of the flag the SIGTERM handler sets.
        if !BackgroundWorker::wait_latch(Some(wait))
            || unsafe { (&raw const pg_sys::ProcDiePending).read_volatile() } != 0
        {
            break;
        }
    }
    // Leaving anyway: no interrupt check (the log line makes one) turns it into a FATAL.
    // SAFETY: HOLD_INTERRUPTS(), for the rest of this process.
    unsafe { pg_sys::InterruptHoldoffCount += 1 };
    crate::dependencies::unregister_worker();
    log!("pgqueue worker exiting");
    // SAFETY: ends the process the normal way; the launcher starts a new one when needed.
    unsafe { pg_sys::proc_exit(0) };
}

/// Whether `pgqueue` is installed in this database.
fn extension_installed() -> bool {
    // SAFETY: catalog lookup inside a transaction; missing_ok = true never raises.
    in_transaction(|| unsafe { pg_sys::get_extension_oid(c"pgqueue".as_ptr(), true) != pg_sys::InvalidOid })
        .unwrap_or(false)
}
