use crate::ParkOptions;
use std::fmt;
use std::time::Duration;
use tokio_postgres::error::SqlState;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong in a call of this crate.
#[derive(Debug)]
pub enum Error {
    /// The server refused the call (see [`Error::sqlstate`]: pgqueue's errors are listed in its
    /// README, e.g. `42704` for an unknown queue) or the connection failed.
    Postgres(tokio_postgres::Error),
    /// An argument this crate refuses before asking the server.
    InvalidArgument(String),
}

impl Error {
    /// The SQLSTATE of an error the server raised (`"42704"`, `"22023"`, …); None for a
    /// connection failure or an invalid argument.
    pub fn sqlstate(&self) -> Option<&str> {
        self.code().map(SqlState::code)
    }

    /// The SQLSTATE as tokio-postgres' constant, to compare with `SqlState::UNDEFINED_OBJECT`.
    pub fn code(&self) -> Option<&SqlState> {
        match self {
            Error::Postgres(e) => e.code(),
            Error::InvalidArgument(_) => None,
        }
    }

    /// Whether trying again later (on a new connection) may succeed: connection losses,
    /// shutdowns and restarts, too many connections, serialization failures.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Postgres(e) => match e.code() {
                // No SQLSTATE: the connection broke, closed or could not be made.
                None => true,
                Some(code) => {
                    let class = &code.code()[..2];
                    // 08 connection, 53 resources, 57 operator intervention (shutdown,
                    // terminate, cancel), 58 system error, 40 serialization/deadlock.
                    matches!(class, "08" | "53" | "57" | "58" | "40")
                }
            },
            Error::InvalidArgument(_) => false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Postgres(e) => match e.as_db_error() {
                // tokio-postgres' own Display leaves out the SQLSTATE; it is what callers match on.
                Some(db) => write!(f, "{} ({}): {}", db.severity(), db.code().code(), db.message()),
                None => write!(f, "{e}"),
            },
            Error::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Postgres(e) => Some(e),
            Error::InvalidArgument(_) => None,
        }
    }
}

impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Self {
        Error::Postgres(e)
    }
}

/// Why a handler did not finish a message: retry it later (`pgq_nack`, the error text
/// recorded on the message), never (`pgq_fail`: dead letter now), or once a signal comes
/// (`pgq_park`).
///
/// Any `std::error::Error` converts into a retry, so `?` works in handlers.
#[derive(Debug)]
pub enum HandlerError {
    /// Nack: claimable again after `retry_in` (None: the server's backoff, 1 s, 2 s, 4 s, …);
    /// dead-lettered by the server once the queue's `max_attempts` are used up.
    Retry { error: String, retry_in: Option<Duration> },
    /// Fail: dead letter now, whatever attempt this was.
    Permanent { error: String },
    /// Park: the claim ends, and the message waits for [`signal`](crate::signal) of `key` or
    /// for `timeout`, as [`park`](crate::park) does (with the worker's queue, whatever
    /// `options.queue` says). Needs pgqueue 0.18.0 or later; a park the server refuses (a bad
    /// key or timeout, a payload too large, an older server) is logged and the message nacked
    /// with the error (`park refused: …`).
    Park { key: String, timeout: Duration, options: ParkOptions },
}

impl HandlerError {
    /// Retry after the server's backoff.
    pub fn retry(error: impl fmt::Display) -> Self {
        HandlerError::Retry { error: error.to_string(), retry_in: None }
    }

    /// Retry after `retry_in`.
    pub fn retry_in(error: impl fmt::Display, retry_in: Duration) -> Self {
        HandlerError::Retry { error: error.to_string(), retry_in: Some(retry_in) }
    }

    /// Dead letter now.
    pub fn permanent(error: impl fmt::Display) -> Self {
        HandlerError::Permanent { error: error.to_string() }
    }

    /// Park on `key` (1 to 512 characters) until a signal, or until `timeout` (at most 365
    /// days) passes; the handler that resumes it finds the park, and the signal's payload, in
    /// `msg.headers["pgq_park"]`.
    pub fn park(key: impl Into<String>, timeout: Duration, options: ParkOptions) -> Self {
        HandlerError::Park { key: key.into(), timeout, options }
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandlerError::Retry { error, .. } => write!(f, "retry: {error}"),
            HandlerError::Permanent { error } => write!(f, "permanent: {error}"),
            HandlerError::Park { key, timeout, .. } => write!(f, "park on {key:?} for {timeout:?}"),
        }
    }
}

// Not `std::error::Error` itself, so that this blanket conversion does not overlap with
// `From<T> for T` (the same trick as anyhow's).
impl<E: std::error::Error> From<E> for HandlerError {
    fn from(e: E) -> Self {
        HandlerError::retry(e)
    }
}
