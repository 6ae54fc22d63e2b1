//! The queue's SQL API over real, committing connections.

#[path = "../common/mod.rs"]
mod common;

/// These tests call pgq_rearm and count what it did: the worker stays out of the way.
fn connect() -> common::Client {
    common::disable_worker();
    common::connect()
}

mod ack_claim;
mod api;
mod cancel;
mod concurrency;
mod ledger;
mod maintenance;
mod operators;
mod results;
mod write_path;
