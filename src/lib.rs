//! pgqueue: a job queue inside PostgreSQL.
//!
//! Layout: one module per concern. `schema` owns every table and index (from `sql/`),
//! `guc` every setting, `worker` the background worker that looks after the queues and
//! `tick` what it does. The shared-memory core: `queue_state` (per-queue hints, due times,
//! depths and wake-ups), `pending` (what a transaction changes there at commit or abort),
//! `claim` and `wait` (the claim's side of it), `reconcile` (the tick's check of it).
//! The hot paths are Rust: `claim` (pgq_claim, pgq_ack_claim) and `finish` (the move to
//! history), over statements `statement` keeps prepared. `schedule` computes the times of
//! periodic schedules, which the tick fires; `prune` frees a pruned partition's old files in
//! steps as the prune commits.

use pgrx::prelude::*;

mod bracket;
mod claim;
mod claim_token;
mod cron;
mod dependencies;
mod dispatch;
mod drop_database;
mod finish;
mod guc;
mod held;
mod in_flight;
mod ledger;
mod legacy;
mod message_rules;
mod outcome_wait;
mod partition_files;
mod pending;
mod queue_state;
mod reconcile;
mod recount;
mod rollup;
mod schedule;
mod sql_files;
mod statement;
mod tick;
mod tick_counts;
mod wait;
mod worker;

::pgrx::pg_module_magic!(name = c"pgqueue", version = c"0.26.0");

#[pg_guard]
#[allow(non_snake_case)]
pub extern "C-unwind" fn _PG_init() {
    // SAFETY: plain reads of postmaster globals during library load.
    let preloading = unsafe { pg_sys::process_shared_preload_libraries_in_progress };
    guc::init(preloading);
    pending::init();
    partition_files::init();
    let binary_upgrade = unsafe { pg_sys::IsBinaryUpgrade };
    // Loaded into a single session (no preload): the SQL API works, but a worker can only
    // be registered while the postmaster loads `shared_preload_libraries`.
    if preloading && !binary_upgrade {
        queue_state::init();
        worker::register();
    }
}

/// The extension's version as installed in this database.
#[pg_extern(stable, parallel_safe)]
fn pgq_version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// `pgqueue._message_ok`, the CHECK of `pgqueue.messages` (sql/schema.sql): message_rules.rs.
/// Not strict: a NULL column is an answer, not an unknown.
#[pg_extern(sql = false)]
#[allow(clippy::too_many_arguments)]
fn _message_ok(
    state: Option<&str>,
    priority: Option<i16>,
    visible_at: Option<TimestampWithTimeZone>,
    claim_token: Option<pgrx::Uuid>,
    lease_expires_at: Option<TimestampWithTimeZone>,
    session_pid: Option<i32>,
    cancel_requested_at: Option<TimestampWithTimeZone>,
    after: Option<pgrx::AnyArray>,
    park_key: Option<&str>,
    park_until: Option<TimestampWithTimeZone>,
) -> bool {
    let (Some(state), Some(priority)) = (state, priority) else { return false };
    let set = message_rules::Set {
        visible_at: visible_at.is_some(),
        claim_token: claim_token.is_some(),
        lease_expires_at: lease_expires_at.is_some(),
        session_pid: session_pid.is_some(),
        cancel_requested_at: cancel_requested_at.is_some(),
        after: after.is_some(),
        park_key: park_key.is_some(),
        park_until: park_until.is_some(),
    };
    message_rules::valid(state, priority, set)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn test_extension_installed() {
        let schema = Spi::get_one::<String>(
            "SELECT n.nspname::text FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
             WHERE e.extname = 'pgqueue'",
        );
        assert_eq!(schema, Ok(Some("pgqueue".to_string())));
        assert_eq!(Spi::get_one::<String>("SELECT pgqueue.pgq_version()"), Ok(Some("0.26.0".into())));
    }

    /// `\df+`, `\dv+` and `\dt+` describe every public function, every view and every table
    /// (sql/comments.sql); internal functions (`_`-prefixed) are left undescribed.
    #[pg_test]
    fn every_public_function_view_and_table_has_a_description() {
        let missing = Spi::get_one::<String>(
            "SELECT nullif(concat_ws(', ',
                 (SELECT string_agg(c.oid::regclass::text, ', ') FROM pg_class c
                   WHERE c.relnamespace = 'pgqueue'::regnamespace AND c.relkind IN ('r', 'p', 'v')
                     AND NOT c.relispartition AND obj_description(c.oid, 'pg_class') IS NULL),
                 (SELECT string_agg(p.oid::regprocedure::text, ', ') FROM pg_proc p
                   WHERE p.pronamespace = 'pgqueue'::regnamespace AND p.proname LIKE 'pgq\\_%'
                     AND obj_description(p.oid, 'pg_proc') IS NULL)), '')",
        );
        assert_eq!(missing, Ok(None), "undescribed");
        let internal = Spi::get_one::<i64>(
            "SELECT count(*) FROM pg_proc p WHERE p.pronamespace = 'pgqueue'::regnamespace
                AND p.proname LIKE '\\_%' AND obj_description(p.oid, 'pg_proc') IS NOT NULL",
        );
        assert_eq!(internal, Ok(Some(0)));
    }

    /// `pgqueue.messages` is a view of the table `pgqueue.message_rows` with its columns, which
    /// also shows the claims of the claim ledger on rows a claim left as they were (0.24.0;
    /// step 3b of the write path): such a row, 'ready' with a live ledger entry, reads as the
    /// claim it was handed out as. Writes go to the table (the view is not updatable).
    #[pg_test]
    fn messages_is_a_view_of_message_rows_and_the_ledgers_claims() {
        let kinds = Spi::get_one::<String>(
            "SELECT string_agg(c.relname || ':' || c.relkind::text, ' ' ORDER BY c.relname) FROM pg_class c
              WHERE c.relnamespace = 'pgqueue'::regnamespace AND c.relname IN ('messages', 'message_rows')",
        );
        assert_eq!(kinds, Ok(Some("message_rows:r messages:v".into())));
        let columns = |rel: &str| {
            Spi::get_one::<String>(&format!(
                "SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
                   FROM pg_attribute a WHERE a.attrelid = 'pgqueue.{rel}'::regclass AND a.attnum > 0 AND NOT a.attisdropped"
            ))
            .unwrap()
            .unwrap()
        };
        assert_eq!(columns("messages"), columns("message_rows"));
        assert_eq!(
            Spi::get_one::<bool>("SELECT pg_relation_is_updatable('pgqueue.messages', false) = 0"),
            Ok(Some(true))
        );

        Spi::run("SELECT pgqueue.pgq_create_queue('viewed')").unwrap();
        let id = Spi::get_one::<i64>("SELECT pgqueue.pgq_send('viewed', '{\"n\": 1}')").unwrap().unwrap();
        let read = |sql: &str| Spi::get_one::<String>(&sql.replace("$id", &id.to_string())).unwrap();
        let row = "SELECT concat_ws(' ', state, attempt, claim_token, consumer,
                                    lease_expires_at = claimed_at + interval '1 hour', session_pid = pg_backend_pid())
                     FROM pgqueue.messages WHERE msg_id = $id";
        assert_eq!(read(row), Some("ready 0".into()));

        // A claim through the ledger (of two messages: a claim of one writes its row), bound to
        // this session; then its row put back as it was.
        Spi::run("SET LOCAL pgqueue.claim_ledger = on").unwrap();
        Spi::run("SELECT pgqueue.pgq_send('viewed', '{\"n\": 2}')").unwrap();
        let token = Spi::get_one::<pgrx::Uuid>(&format!(
            "SELECT claim_token FROM pgqueue.pgq_claim('viewed', 2, lease => '1 hour', consumer => 'w1', session_bound => true)
              WHERE msg_id = {id}"
        ))
        .unwrap()
        .unwrap();
        let claimed = format!("claimed 1 {token} w1 t t");
        assert_eq!(read(row), Some(claimed.clone()));
        Spi::run(&format!(
            "UPDATE pgqueue.message_rows SET state = 'ready', attempt = 0, claim_token = NULL, claimed_at = NULL,
                    consumer = NULL, lease_expires_at = NULL, session_pid = NULL, session_started = NULL
              WHERE msg_id = {id}"
        ))
        .unwrap();
        assert_eq!(read(row), Some(claimed), "the ledger's claim, as handed out");
        assert_eq!(read("SELECT state FROM pgqueue.jobs WHERE msg_id = $id"), Some("claimed".into()));
        // The claim ended (claims_ended counts it): the row alone again.
        Spi::run(&format!("UPDATE pgqueue.message_rows SET claims_ended = 1, attempt = 1 WHERE msg_id = {id}"))
            .unwrap();
        assert_eq!(read(row), Some("ready 1".into()));
        assert_eq!(read("SELECT state FROM pgqueue.jobs WHERE msg_id = $id"), Some("ready".into()));
    }

    #[pg_test]
    fn test_worker_state_row_exists() {
        let rows = Spi::get_one::<i64>("SELECT count(*) FROM pgqueue.worker_state");
        assert_eq!(rows, Ok(Some(1)));
    }

    #[pg_test]
    fn test_settings_registered() {
        // Reserved prefix and defaults an operator sees in pg_settings.
        let ctx = Spi::get_one::<String>("SELECT context FROM pg_settings WHERE name = 'pgqueue.tick_interval'");
        assert_eq!(ctx, Ok(Some("sighup".into())));
        let ctx = Spi::get_one::<String>("SELECT context FROM pg_settings WHERE name = 'pgqueue.databases'");
        assert_eq!(ctx, Ok(Some("sighup".into())));
        let setting =
            Spi::get_one::<String>("SELECT setting FROM pg_settings WHERE name = 'pgqueue.prune_lock_timeout'");
        assert_eq!(setting, Ok(Some("10".into())));
    }
}

/// Hooks for `cargo pgrx test`; also used by the integration tests in `tests/`.
#[cfg(any(test, feature = "pg_test"))]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    /// The test cluster preloads the library so the worker runs, in the test database,
    /// ticking fast so tests wait little.
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        let mut options = vec![
            "shared_preload_libraries = 'pgqueue'",
            "pgqueue.launcher_naptime = '200ms'",
            "pgqueue.tick_interval = '100ms'",
            "pgqueue.prune_interval = '1s'",
            // Tests make several databases, each with its worker (default 8 slots in all).
            "max_worker_processes = 16",
            // Tests run side by side, some with 64 connections of their own.
            "max_connections = 200",
        ];
        // The claim ledger's shadow (0.21.0; checked both ways since 0.22.0) runs under the
        // whole suite on 17 and 18; 15 runs the default, without it. Tests of the ledger itself turn it on in their sessions.
        if cfg!(not(feature = "pg15")) {
            options.push("pgqueue.claim_ledger = on");
        }
        options
    }
}
