//! Transaction brackets for work that must not take other work down with it: each of the
//! worker's steps commits on its own; `pgq_tick()`'s run in subtransactions of the caller's
//! transaction. A failure comes back as its message, the bracket rolled back.

use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use std::panic::{RefUnwindSafe, UnwindSafe};

/// How each step is isolated from the others.
#[derive(Clone, Copy)]
pub enum Bracket {
    /// Its own top-level transaction (background worker: every step commits on its own).
    Transaction,
    /// A subtransaction of the caller's transaction (`pgq_tick()` from SQL).
    Subtransaction,
}

impl Bracket {
    pub fn is_transaction(self) -> bool {
        matches!(self, Bracket::Transaction)
    }

    /// Runs `body` in a bracket of this kind.
    pub fn run<R>(self, body: impl FnOnce() -> R + UnwindSafe + RefUnwindSafe) -> Result<R, String> {
        match self {
            Bracket::Transaction => in_transaction(body),
            Bracket::Subtransaction => in_subtransaction(body),
        }
    }
}

fn message(error: &CaughtError) -> String {
    match error {
        CaughtError::PostgresError(e) | CaughtError::ErrorReport(e) => e.message().to_string(),
        CaughtError::RustPanic { ereport, .. } => ereport.message().to_string(),
    }
}

/// A top-level transaction of its own (background worker only).
pub fn in_transaction<R>(body: impl FnOnce() -> R + UnwindSafe + RefUnwindSafe) -> Result<R, String> {
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
        Ok(result)
    })
    .catch_others(|error| {
        // SAFETY: without this the next StartTransactionCommand fails on a dangling state.
        unsafe { pg_sys::AbortCurrentTransaction() };
        Err(message(&error))
    })
    .execute()
}

/// A subtransaction of the caller's transaction, as PL/pgSQL's EXCEPTION blocks do it.
fn in_subtransaction<R>(body: impl FnOnce() -> R + UnwindSafe + RefUnwindSafe) -> Result<R, String> {
    // SAFETY: BeginInternalSubTransaction switches memory context and resource owner;
    // both are restored on either path, as PL/pgSQL does.
    let (context, owner) = unsafe { (pg_sys::CurrentMemoryContext, pg_sys::CurrentResourceOwner) };
    unsafe {
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(context);
    }
    let restore = move || unsafe {
        pg_sys::MemoryContextSwitchTo(context);
        pg_sys::CurrentResourceOwner = owner;
    };
    let mut body = Some(body);
    PgTryBuilder::new(move || {
        let result = (body.take().expect("runs once"))();
        unsafe { pg_sys::ReleaseCurrentSubTransaction() };
        restore();
        Ok(result)
    })
    .catch_others(move |error| {
        unsafe {
            pg_sys::MemoryContextSwitchTo(context);
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
        }
        restore();
        // A cancel or statement timeout is the caller's, not a step's failure: pass it on,
        // as PL/pgSQL's WHEN OTHERS does.
        if let CaughtError::PostgresError(e) | CaughtError::ErrorReport(e) = &error
            && e.sql_error_code() == PgSqlErrorCode::ERRCODE_QUERY_CANCELED
        {
            error.rethrow();
        }
        Err(message(&error))
    })
    .execute()
}
