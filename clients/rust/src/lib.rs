#![doc = include_str!("../README.md")]

mod error;
mod producer;
mod worker;

pub use error::{Error, HandlerError, Result};
pub use producer::{
    GraphRow, OnTimeout, Outcome, ParentFailure, ParkOptions, SendOptions, graph, park, result, send, send_batch,
    signal,
};
pub use tokio_postgres;
pub use tokio_util::sync::CancellationToken;
pub use worker::{Message, Worker, WorkerConfig};

use std::time::Duration;

/// A statement parameter with its type, for `query_typed` (one unnamed statement: what works
/// behind PgBouncer in transaction pooling mode, where named prepared statements do not).
type Param<'a> = (&'a (dyn tokio_postgres::types::ToSql + Sync), tokio_postgres::types::Type);

/// An interval literal for `$n::text::interval`: whole microseconds, PostgreSQL's resolution.
fn interval(d: Duration) -> String {
    format!("{} microseconds", d.as_micros())
}
