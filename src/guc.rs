//! Every `pgqueue.*` setting, registered in one place.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use std::ffi::CStr;
use std::time::Duration;

/// Database the worker connects to (until the per-database launcher lands).
pub static DATABASE: GucSetting<Option<std::ffi::CString>> =
    GucSetting::<Option<std::ffi::CString>>::new(Some(c"postgres"));

/// Largest payload (jsonb size in bytes) pgq_send accepts.
pub static MAX_PAYLOAD_BYTES: GucSetting<i32> = GucSetting::<i32>::new(1024 * 1024);

/// Milliseconds between two ticks of the worker.
pub static TICK_INTERVAL_MS: GucSetting<i32> = GucSetting::<i32>::new(1000);

pub fn init() {
    GucRegistry::define_int_guc(
        c"pgqueue.tick_interval",
        c"Time between two ticks of the pgqueue background worker.",
        c"Each tick re-arms expired claims and does the other housekeeping. Reloadable.",
        &TICK_INTERVAL_MS,
        10,
        3_600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"pgqueue.max_payload_bytes",
        c"Largest message payload pgqueue accepts, in bytes (jsonb size).",
        c"Larger payloads are rejected with SQLSTATE 54000.",
        &MAX_PAYLOAD_BYTES,
        1,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_BYTE,
    );
    // SAFETY: read of a postmaster global during library load.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        GucRegistry::define_string_guc(
            c"pgqueue.database",
            c"Database in which the pgqueue background worker runs.",
            c"Read at server start.",
            &DATABASE,
            GucContext::Postmaster,
            GucFlags::default(),
        );
    }
    // SAFETY: called from _PG_init; rejects misspelled pgqueue.* settings from now on.
    unsafe { pg_sys::MarkGUCPrefixReserved(c"pgqueue".as_ptr()) };
}

pub fn tick_interval() -> Duration {
    Duration::from_millis(TICK_INTERVAL_MS.get().max(1) as u64)
}

pub fn database() -> String {
    DATABASE
        .get()
        .as_deref()
        .map(CStr::to_string_lossy)
        .map(Into::into)
        .unwrap_or_else(|| "postgres".into())
}

/// The payload limit in force, for the SQL API (calling it also loads the library, and so
/// registers the setting, in sessions that did not preload it).
#[pgrx::pg_extern(stable, parallel_safe)]
fn _max_payload_bytes() -> i32 {
    MAX_PAYLOAD_BYTES.get()
}
