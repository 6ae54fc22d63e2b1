//! Every `pgqueue.*` setting, registered in one place (README: "Settings").

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use std::ffi::{CStr, CString};
use std::time::Duration;

pub static DATABASES: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static LAUNCHER_NAPTIME_MS: GucSetting<i32> = GucSetting::<i32>::new(10_000);
pub static ENABLED: GucSetting<bool> = GucSetting::<bool>::new(true);
pub static CLAIM_LEDGER: GucSetting<bool> = GucSetting::<bool>::new(false);
pub static TICK_INTERVAL_MS: GucSetting<i32> = GucSetting::<i32>::new(1000);
pub static PRUNE_INTERVAL_S: GucSetting<i32> = GucSetting::<i32>::new(60);
pub static RESCUE_BATCH_SIZE: GucSetting<i32> = GucSetting::<i32>::new(500);
pub static RESCUE_PASS_BUDGET_MS: GucSetting<i32> = GucSetting::<i32>::new(500);
pub static RESCUE_PASS_MAX_ROWS: GucSetting<i32> = GucSetting::<i32>::new(100_000);
pub static PRUNE_LOCK_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(10);
pub static MAX_QUEUES: GucSetting<i32> = GucSetting::<i32>::new(1024);
pub static HELD_SET_CAPACITY: GucSetting<i32> = GucSetting::<i32>::new(16384);
pub static MAX_PAYLOAD_BYTES: GucSetting<i32> = GucSetting::<i32>::new(1024 * 1024);
pub static ROLLUP_RETENTION_MIN: GucSetting<i32> = GucSetting::<i32>::new(7 * 24 * 60);

fn int(
    name: &'static CStr,
    short: &'static CStr,
    long: &'static CStr,
    setting: &'static GucSetting<i32>,
    range: (i32, i32),
    context: GucContext,
    flags: GucFlags,
) {
    GucRegistry::define_int_guc(name, short, long, setting, range.0, range.1, context, flags);
}

pub fn init(preloading: bool) {
    use GucContext::{Postmaster, Sighup, Suset, Userset};
    // A postmaster setting can only be defined while the postmaster loads the library (a
    // session that LOADs it has no shared memory to size anyway).
    if preloading {
        int(
            c"pgqueue.max_queues",
            c"Queues whose claim hints and waiting claims pgqueue keeps in shared memory.",
            c"Queues beyond it (across all databases) work without them: claims scan from the start and waiting claims poll.",
            &MAX_QUEUES,
            (16, 1_000_000),
            Postmaster,
            GucFlags::default(),
        );
        int(
            c"pgqueue.held_set_capacity",
            c"Claims through the claim ledger that each database's held set keeps in shared memory.",
            c"Rounded up to a power of two; 72 bytes a claim, for each of 8 databases. Past it the set stops vouching for the claims it has no room for, and claims of those messages read the ledger; 0: no held set.",
            &HELD_SET_CAPACITY,
            (0, 4_194_304),
            Postmaster,
            GucFlags::default(),
        );
    }
    int(
        c"pgqueue.tick_interval",
        c"Time between two ticks of the pgqueue background worker.",
        c"Each tick promotes due delayed messages, re-arms expired claims and, when due, prunes.",
        &TICK_INTERVAL_MS,
        (10, 3_600_000),
        Sighup,
        GucFlags::UNIT_MS,
    );
    int(
        c"pgqueue.prune_interval",
        c"Time between two prunes of the queues' history by the worker.",
        c"",
        &PRUNE_INTERVAL_S,
        (1, 86_400),
        Sighup,
        GucFlags::UNIT_S,
    );
    int(
        c"pgqueue.rescue_batch_size",
        c"Expired claims re-armed per transaction.",
        c"",
        &RESCUE_BATCH_SIZE,
        (1, 100_000),
        Sighup,
        GucFlags::default(),
    );
    int(
        c"pgqueue.rescue_pass_budget",
        c"Longest time one re-arm pass may run (at most half the tick interval).",
        c"",
        &RESCUE_PASS_BUDGET_MS,
        (1, 3_600_000),
        Sighup,
        GucFlags::UNIT_MS,
    );
    int(
        c"pgqueue.rescue_pass_max_rows",
        c"Most expired claims one re-arm pass re-arms.",
        c"",
        &RESCUE_PASS_MAX_ROWS,
        (1, i32::MAX),
        Sighup,
        GucFlags::default(),
    );
    int(
        c"pgqueue.prune_lock_timeout",
        c"Longest wait for a lock when pruning or adding history partitions.",
        c"A lock not granted in time gives the outcome 'blocked'; it is never waited for longer.",
        &PRUNE_LOCK_TIMEOUT_MS,
        (1, 60_000),
        Userset,
        GucFlags::UNIT_MS,
    );
    int(
        c"pgqueue.max_payload_bytes",
        c"Largest message payload pgqueue accepts, in bytes (jsonb size).",
        c"Larger payloads are rejected with SQLSTATE 54000.",
        &MAX_PAYLOAD_BYTES,
        (1, i32::MAX),
        Suset,
        GucFlags::UNIT_BYTE,
    );
    int(
        c"pgqueue.rollup_retention",
        c"How long the worker keeps per-queue minute rollups (pgqueue.queue_minutes).",
        c"0: it records none and deletes those it has.",
        &ROLLUP_RETENTION_MIN,
        (0, 10 * 366 * 24 * 60),
        Sighup,
        GucFlags::UNIT_MIN,
    );
    GucRegistry::define_bool_guc(
        c"pgqueue.enabled",
        c"Whether the pgqueue background worker does its work.",
        c"Off: the worker idles; pgq_tick() still works.",
        &ENABLED,
        Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pgqueue.claim_ledger",
        c"Whether claims also write the claim ledger (pgqueue.claims) and hand out tokens that name it.",
        c"On: a shadow of the next release's write path, checked by fencing; costs a row write per claim call.",
        &CLAIM_LEDGER,
        Suset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"pgqueue.databases",
        c"Databases the pgqueue workers run in (comma-separated); empty: every database with the extension.",
        c"",
        &DATABASES,
        Sighup,
        GucFlags::default(),
    );
    int(
        c"pgqueue.launcher_naptime",
        c"How often the pgqueue launcher looks for databases that need a worker.",
        c"A database where the extension is created gets its worker within this time.",
        &LAUNCHER_NAPTIME_MS,
        (100, 3_600_000),
        Sighup,
        GucFlags::UNIT_MS,
    );
    // SAFETY: called from _PG_init; rejects misspelled pgqueue.* settings from now on.
    unsafe { pg_sys::MarkGUCPrefixReserved(c"pgqueue".as_ptr()) };
}

fn ms(setting: &GucSetting<i32>) -> Duration {
    Duration::from_millis(setting.get().max(1) as u64)
}

pub fn tick_interval() -> Duration {
    ms(&TICK_INTERVAL_MS)
}

pub fn prune_interval() -> Duration {
    Duration::from_secs(PRUNE_INTERVAL_S.get().max(1) as u64)
}

/// The re-arm pass's time budget: the setting, but never more than half a tick.
pub fn rescue_pass_budget() -> Duration {
    ms(&RESCUE_PASS_BUDGET_MS).min(tick_interval() / 2)
}

pub fn launcher_naptime() -> Duration {
    ms(&LAUNCHER_NAPTIME_MS)
}

/// Whether `pgqueue.databases` lets a worker run in `database` (empty: every database).
pub fn database_wanted(database: &str) -> bool {
    let list = DATABASES.get();
    let list = list.as_deref().map(CStr::to_string_lossy).unwrap_or_default();
    list.trim().is_empty() || list.split(',').any(|name| name.trim() == database)
}

/// The payload limit in force, for the SQL API (calling it also loads the library, and so
/// registers the settings, in sessions that did not preload it).
#[pgrx::pg_extern(stable, parallel_safe)]
fn _max_payload_bytes() -> i32 {
    MAX_PAYLOAD_BYTES.get()
}

/// The prune lock timeout in force, in milliseconds (never zero: the setting's minimum is 1).
#[pgrx::pg_extern(stable, parallel_safe)]
fn _prune_lock_timeout() -> i32 {
    PRUNE_LOCK_TIMEOUT_MS.get()
}
