//! The database side: a pool that reconnects by itself, what this role may do here, and how
//! a database error becomes an HTTP answer.

use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use std::time::Duration;
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

/// The oldest extension version with everything the console reads and calls.
pub const REQUIRED_VERSION: &str = "0.13.0";

/// A pool of a few connections. Each is checked before it is handed out, so after a server
/// restart the dead ones are dropped and new ones made; while the server is away, getting
/// one fails within the timeouts and the page says so.
pub fn pool(dsn: &str) -> Result<Pool, String> {
    let mut config: tokio_postgres::Config = dsn.parse().map_err(|e| format!("{e}"))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(5));
    }
    if config.get_application_name().is_none() {
        config.application_name("pgqueue-console");
    }
    let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Verified });
    Pool::builder(manager)
        // The console's statements are probes a queue at a time: the planner costs a
        // thousand queues' worth high enough to compile them (JIT), which takes longer than
        // running them (the overview's last hour: 70 ms against 16 at 1,000 queues).
        .post_create(Hook::async_fn(|client, _| {
            Box::pin(async move { client.batch_execute("SET jit = off").await.map_err(HookError::Backend) })
        }))
        .max_size(8)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(5)))
        .create_timeout(Some(Duration::from_secs(5)))
        .recycle_timeout(Some(Duration::from_secs(5)))
        .build()
        .map_err(|e| e.to_string())
}

/// What went wrong answering a request.
#[derive(Debug)]
pub enum Failure {
    /// No connection to the database (HTTP 503; the page retries by itself).
    Unavailable(String),
    /// The database refused or failed the statement.
    Database { code: Option<String>, message: String },
    /// Something the request asked for does not exist (HTTP 404).
    NotFound(String),
    /// The request itself is wrong (HTTP 400).
    BadRequest(String),
    /// Refused by the console before the database was asked (HTTP 403).
    Forbidden(String),
    /// Not logged in (HTTP 401).
    Unauthorized,
}

impl Failure {
    /// The HTTP status for this failure: the database's refusals by their SQLSTATE.
    pub fn status(&self) -> u16 {
        match self {
            Failure::Unavailable(_) => 503,
            Failure::NotFound(_) => 404,
            Failure::BadRequest(_) => 400,
            Failure::Forbidden(_) => 403,
            Failure::Unauthorized => 401,
            Failure::Database { code, .. } => match code.as_deref() {
                // insufficient_privilege, read_only_sql_transaction (a standby or --read-only)
                Some("42501") | Some("25006") => 403,
                Some("42704") => 404,
                Some(c) if c.starts_with("22") => 400,
                _ => 500,
            },
        }
    }

    pub fn message(&self) -> String {
        match self {
            Failure::Unavailable(e) => format!("database unavailable, retrying ({e})"),
            Failure::Database { code: Some(code), message } => {
                format!("the database refused: {message} (SQLSTATE {code})")
            }
            Failure::Database { code: None, message } => format!("the database failed: {message}"),
            Failure::NotFound(m) | Failure::BadRequest(m) | Failure::Forbidden(m) => m.clone(),
            Failure::Unauthorized => "log in first".into(),
        }
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Failure {
        match e.as_db_error() {
            Some(db) => {
                Failure::Database { code: Some(db.code().code().to_string()), message: db.message().to_string() }
            }
            // No server answer: the connection is gone (the pool replaces it).
            None if e.is_closed() || e.code().is_none() => Failure::Unavailable(e.to_string()),
            None => Failure::Database { code: None, message: e.to_string() },
        }
    }
}

impl From<deadpool_postgres::PoolError> for Failure {
    fn from(e: deadpool_postgres::PoolError) -> Failure {
        Failure::Unavailable(e.to_string())
    }
}

/// Whether an error means the object (a table, a view, a function) is not there: an older
/// pgqueue, so the page shows what it can without it.
pub fn is_missing(f: &Failure) -> bool {
    matches!(f, Failure::Database { code: Some(c), .. }
        if c == SqlState::UNDEFINED_TABLE.code() || c == SqlState::UNDEFINED_FUNCTION.code() || c == SqlState::UNDEFINED_COLUMN.code())
}

/// Whether an error is a refused read (this role has no SELECT on it).
pub fn is_denied(f: &Failure) -> bool {
    matches!(f, Failure::Database { code: Some(c), .. } if c == SqlState::INSUFFICIENT_PRIVILEGE.code())
}

/// What this connection's role may do here, asked at each request (the answer changes with
/// grants and failovers, and it costs one round trip).
#[derive(Clone, Debug, Default)]
pub struct Capabilities {
    pub role: String,
    pub in_recovery: bool,
    pub ext_version: Option<String>,
    pub may_pause_queue: bool,
    pub may_redrive: bool,
    pub may_delete_dead: bool,
    pub may_pause_schedule: bool,
    pub may_run_schedule: bool,
    pub may_audit: bool,
    pub may_read_jobs: bool,
    pub may_read_queues: bool,
    pub may_read_dedup_keys: bool,
    /// `--read-only`.
    pub forced_read_only: bool,
}

impl Capabilities {
    pub async fn of(client: &Object, forced_read_only: bool) -> Result<Capabilities, Failure> {
        let row = client
            .query_one(
                "SELECT current_user::text, pg_is_in_recovery(),
                        (SELECT extversion FROM pg_extension WHERE extname = 'pgqueue'),
                        coalesce(has_function_privilege(to_regprocedure('pgqueue.pgq_pause_queue(text)'), 'EXECUTE'), false),
                        coalesce(has_function_privilege(to_regprocedure('pgqueue.pgq_redrive(text,bigint[])'), 'EXECUTE'), false),
                        coalesce(has_function_privilege(to_regprocedure('pgqueue.pgq_delete_dead(text,bigint[])'), 'EXECUTE'), false),
                        coalesce(has_function_privilege(to_regprocedure('pgqueue.pgq_pause_schedule(text)'), 'EXECUTE'), false),
                        coalesce(has_function_privilege(to_regprocedure('pgqueue.pgq_run_schedule(text)'), 'EXECUTE'), false),
                        coalesce(has_function_privilege(to_regprocedure('pgqueue.pgq_audit(text,text,jsonb,text)'), 'EXECUTE'), false),
                        coalesce(has_table_privilege(to_regclass('pgqueue.jobs'), 'SELECT'), false),
                        coalesce(has_table_privilege(to_regclass('pgqueue.queues'), 'SELECT'), false),
                        coalesce(has_table_privilege(to_regclass('pgqueue.dedup_keys'), 'SELECT'), false)",
                &[],
            )
            .await?;
        Ok(Capabilities {
            role: row.get(0),
            in_recovery: row.get(1),
            ext_version: row.get(2),
            may_pause_queue: row.get(3),
            may_redrive: row.get(4),
            may_delete_dead: row.get(5),
            may_pause_schedule: row.get(6),
            may_run_schedule: row.get(7),
            may_audit: row.get(8),
            may_read_jobs: row.get(9),
            may_read_queues: row.get(10),
            may_read_dedup_keys: row.get(11),
            forced_read_only,
        })
    }

    /// Why the console shows no actions, if it shows none.
    pub fn read_only_reason(&self) -> Option<String> {
        if self.ext_version.is_none() {
            Some("read-only: pgqueue is not installed in this database".into())
        } else if self.in_recovery {
            Some("read-only: standby".into())
        } else if self.forced_read_only {
            Some("read-only: started with --read-only".into())
        } else if !self.may_audit || !(self.may_pause_queue || self.may_redrive || self.may_pause_schedule) {
            Some(format!("read-only: role {} may not act on pgqueue (grant it pgqueue_admin for actions)", self.role))
        } else {
            None
        }
    }

    /// Whether action buttons are shown at all.
    pub fn acts(&self) -> bool {
        self.read_only_reason().is_none()
    }

    pub fn pause_queue(&self) -> bool {
        self.acts() && self.may_pause_queue
    }
    pub fn redrive(&self) -> bool {
        self.acts() && self.may_redrive
    }
    pub fn delete_dead(&self) -> bool {
        self.acts() && self.may_delete_dead
    }
    pub fn pause_schedule(&self) -> bool {
        self.acts() && self.may_pause_schedule
    }
    pub fn run_schedule(&self) -> bool {
        self.acts() && self.may_run_schedule
    }

    /// A warning when the extension here is older than the console needs.
    pub fn version_warning(&self) -> Option<String> {
        match &self.ext_version {
            None => Some("pgqueue is not installed in this database (CREATE EXTENSION pgqueue)".into()),
            Some(v) if older(v, REQUIRED_VERSION) => Some(format!(
                "pgqueue {v} is installed here; the console needs {REQUIRED_VERSION} (ALTER EXTENSION pgqueue UPDATE): \
                 the overview, charts, job search, dead letters and the audit log are unavailable until then"
            )),
            Some(_) => None,
        }
    }
}

/// Whether dotted version `a` is older than `b`.
pub fn older(a: &str, b: &str) -> bool {
    let parse = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parse(a) < parse(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_numerically() {
        assert!(older("0.11.0", "0.12.0"));
        assert!(older("0.9.0", "0.12.0"));
        assert!(!older("0.12.0", "0.12.0"));
        assert!(!older("0.12.1", "0.12.0"));
        assert!(!older("1.0.0", "0.12.0"));
    }

    #[test]
    fn refusals_map_to_statuses() {
        let db = |code: &str| Failure::Database { code: Some(code.into()), message: String::new() };
        assert_eq!(db("42501").status(), 403);
        assert_eq!(db("25006").status(), 403);
        assert_eq!(db("42704").status(), 404);
        assert_eq!(db("22023").status(), 400);
        assert_eq!(db("XX000").status(), 500);
        assert_eq!(Failure::Unavailable(String::new()).status(), 503);
    }

    #[test]
    fn read_only_reasons() {
        let admin = Capabilities {
            role: "ops".into(),
            ext_version: Some("0.13.0".into()),
            may_pause_queue: true,
            may_redrive: true,
            may_audit: true,
            ..Default::default()
        };
        assert!(admin.acts());
        assert!(Capabilities { in_recovery: true, ..admin.clone() }.read_only_reason().unwrap().contains("standby"));
        assert!(!Capabilities { forced_read_only: true, ..admin.clone() }.acts());
        let monitor = Capabilities { role: "watcher".into(), ext_version: Some("0.13.0".into()), ..Default::default() };
        assert!(monitor.read_only_reason().unwrap().contains("watcher"));
        assert!(!monitor.redrive());
    }
}
