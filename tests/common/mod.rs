//! Shared helpers for integration tests: a real server started by pgrx-tests with the
//! library preloaded, and real connections that commit.

#![allow(dead_code)]

use std::time::{Duration, Instant};

pub use postgres::Client;

/// Starts (once per test binary) the test cluster with the worker preloaded, and returns a
/// fresh connection to the test database.
pub fn connect() -> Client {
    pgrx_tests::run_test(
        "test_extension_installed",
        None,
        pgqueue::pg_test::postgresql_conf_options(),
    )
    .expect("test cluster starts");
    pgrx_tests::client().expect("connect to the test cluster").0
}

/// Polls `probe` until it returns `Some`, failing the test after `limit`.
pub fn wait_for<T>(what: &str, limit: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
