//! DROP DATABASE just works where a pgqueue worker is connected: a ProcessUtility hook makes
//! the database's workers leave before PostgreSQL checks for other sessions.

use crate::worker::WORKER;
use pgrx::prelude::*;
use std::ffi::CStr;
use std::time::{Duration, Instant};

/// Chains the hook; only valid while preloading.
pub fn install_hook() {
    // SAFETY: hook chaining at preload time, as every extension does it.
    unsafe {
        PREVIOUS_PROCESS_UTILITY = pg_sys::ProcessUtility_hook;
        pg_sys::ProcessUtility_hook = Some(process_utility);
    }
}

static mut PREVIOUS_PROCESS_UTILITY: pg_sys::ProcessUtility_hook_type = None;

unsafe extern "C-unwind" {
    /// PostgreSQL's own, declared here without pgrx's guard: see `process_utility`.
    #[link_name = "standard_ProcessUtility"]
    fn standard_process_utility(
        pstmt: *mut pg_sys::PlannedStmt,
        query: *const std::ffi::c_char,
        read_only_tree: bool,
        context: pg_sys::ProcessUtilityContext::Type,
        params: pg_sys::ParamListInfo,
        query_env: *mut pg_sys::QueryEnvironment,
        dest: *mut pg_sys::DestReceiver,
        qc: *mut pg_sys::QueryCompletion,
    );
}

/// Every utility statement of the cluster passes through here. Our own work is guarded on
/// its own (`before_utility`); the statement itself is handed on unguarded, so that its
/// ERROR reaches PostgreSQL exactly as raised (through a pgrx guard it would be raised again,
/// without its position or object fields, and with a Rust backtrace as its DETAIL whenever
/// RUST_BACKTRACE is set). Nothing in this frame has a destructor, so the error's longjmp
/// may cross it.
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn process_utility(
    pstmt: *mut pg_sys::PlannedStmt,
    query: *const std::ffi::c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    // SAFETY: the arguments are PostgreSQL's, passed on unchanged; the hook chain is read
    // only after preload.
    unsafe {
        before_utility(pstmt, context);
        match PREVIOUS_PROCESS_UTILITY {
            Some(previous) => previous(pstmt, query, read_only_tree, context, params, query_env, dest, qc),
            None => standard_process_utility(pstmt, query, read_only_tree, context, params, query_env, dest, qc),
        }
    }
}

/// DROP DATABASE waits (5 s at most) for other sessions to leave the database, and with
/// FORCE terminates them only if the caller may signal them; our worker is one of them: make
/// it leave first, so dropping a database just works.
#[pg_guard]
unsafe extern "C-unwind" fn before_utility(
    pstmt: *mut pg_sys::PlannedStmt,
    context: pg_sys::ProcessUtilityContext::Type,
) {
    // SAFETY: pstmt is the statement being executed, valid for the duration of the call.
    unsafe {
        let stmt = (*pstmt).utilityStmt;
        // In a transaction block PostgreSQL refuses DROP DATABASE: leave the worker alone.
        let top_level = context == pg_sys::ProcessUtilityContext::PROCESS_UTILITY_TOPLEVEL;
        if !stmt.is_null() && (*stmt).type_ == pg_sys::NodeTag::T_DropdbStmt && !pg_sys::IsInTransactionBlock(top_level)
        {
            let name = CStr::from_ptr((*(stmt as *mut pg_sys::DropdbStmt)).dbname).to_string_lossy().into_owned();
            stop_workers_in(&name);
        }
    }
}

/// Makes the workers of `database` exit, if the caller may drop it: it exists, is not a
/// template nor the caller's own database, and the caller owns it (or is a superuser). A drop
/// that PostgreSQL will refuse for want of privileges leaves the worker alone.
fn stop_workers_in(database: &str) {
    let permitted = Spi::get_one_with_args::<pg_sys::Oid>(
        "SELECT oid FROM pg_catalog.pg_database
          WHERE datname OPERATOR(pg_catalog.=) $1 AND pg_catalog.pg_has_role(datdba, 'USAGE')
            AND NOT datistemplate AND datname OPERATOR(pg_catalog.<>) pg_catalog.current_database()",
        &[database.into()],
    );
    let Ok(Some(oid)) = permitted else {
        return;
    };
    // The lock DROP DATABASE itself takes next: from now on no session can connect there,
    // so the launcher cannot start a worker there again before the drop commits.
    // SAFETY: a heavyweight lock on a shared object, released at the end of the transaction.
    unsafe {
        pg_sys::LockSharedObject(pg_sys::DatabaseRelationId, oid, 0, pg_sys::AccessExclusiveLock as pg_sys::LOCKMODE)
    };
    // pg_stat_activity names other roles' backends only to privileged roles, and the owner
    // of a database need not be one: look as the bootstrap superuser.
    let pids: Vec<i32> = as_bootstrap_superuser(|| {
        Spi::connect(|client| {
            client
                .select(
                    "SELECT pid FROM pg_catalog.pg_stat_activity
                      WHERE backend_type OPERATOR(pg_catalog.=) $1 AND datname OPERATOR(pg_catalog.=) $2",
                    None,
                    &[WORKER.into(), database.into()],
                )?
                .map(|row| row.get::<i32>(1).map(Option::unwrap_or_default))
                .collect::<Result<Vec<_>, _>>()
        })
        .unwrap_or_default()
    });
    for &pid in &pids {
        // A direct signal: the worker runs as the bootstrap superuser, whom the owner
        // dropping the database may not pg_terminate_backend.
        // SAFETY: SIGTERM to a process of our own server; it exits at its next wait.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    // Until they are gone (a tick finishes first): DROP DATABASE ... WITH (FORCE) would
    // otherwise find one still there and refuse to terminate a superuser's process.
    let deadline = Instant::now() + Duration::from_secs(10);
    // SAFETY: BackendPidGetProc reads the proc array under its lock.
    while pids.iter().any(|&pid| unsafe { !pg_sys::BackendPidGetProc(pid).is_null() }) && Instant::now() < deadline {
        pgrx::check_for_interrupts!();
        // SAFETY: a plain sleep; interrupts are checked above.
        unsafe { pg_sys::pg_usleep(10_000) };
    }
}

/// Runs `f` with the bootstrap superuser's privileges, then restores the caller's (also when
/// `f` fails; an aborting transaction would restore them anyway).
fn as_bootstrap_superuser<T>(f: impl FnOnce() -> T + std::panic::UnwindSafe) -> T {
    let (mut user, mut security) = (pg_sys::InvalidOid, 0);
    // SAFETY: saving and switching the current user id, as SECURITY DEFINER calls do.
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut user, &mut security);
        pg_sys::SetUserIdAndSecContext(
            pg_sys::Oid::from(pg_sys::BOOTSTRAP_SUPERUSERID),
            security | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32,
        );
    }
    PgTryBuilder::new(f)
        // SAFETY: restores exactly what was saved above.
        .finally(|| unsafe { pg_sys::SetUserIdAndSecContext(user, security) })
        .execute()
}
