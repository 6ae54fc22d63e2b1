//! A client for pgqueue queues on tokio-postgres: a producer that sends
//! inside the caller's own transaction, and a worker that claims, runs a handler per message,
//! renews leases while it runs, acks or nacks, stops gracefully and reconnects.
//!
//! ```no_run
//! use pgqueue_client::{HandlerError, Message, Worker, WorkerConfig};
//!
//! # async fn example() -> pgqueue_client::Result<()> {
//! let config = WorkerConfig::new("host=localhost user=app dbname=app", "emails").concurrency(8);
//! let worker = Worker::new(config, |msg: Message| async move {
//!     println!("sending {}", msg.payload);
//!     Ok::<(), HandlerError>(())
//! });
//! worker.run(async { tokio::signal::ctrl_c().await.ok(); }).await
//! # }
//! ```

mod error;
mod producer;
mod worker;

pub use error::{Error, HandlerError, Result};
pub use producer::{SendOptions, send, send_batch};
pub use tokio_postgres;
pub use worker::{Message, Worker, WorkerConfig};

use std::time::Duration;

/// An interval literal for `$n::text::interval`: whole microseconds, PostgreSQL's resolution.
fn interval(d: Duration) -> String {
    format!("{} microseconds", d.as_micros())
}
