//! The queue's SQL API over real, committing connections.

#[path = "../common/mod.rs"]
mod common;

mod api;
mod concurrency;
