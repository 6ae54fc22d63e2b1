//! The Python client's test suite (clients/python/tests, pytest) against a server of this
//! major with pgqueue preloaded: the producer, the sync and asyncio workers, and the chaos
//! test (8 worker processes, 20,000 jobs, terminated connections and a server restart).
//! The virtual environment with psycopg and pytest is made by scripts/setup.sh.

use crate::common;

use common::server::Server;
use std::path::PathBuf;
use std::process::Command;

/// Tests in clients/python/tests: pytest must report at least this many passed.
const EXPECTED_PASSED: usize = 42;

#[test]
fn python_client_tests_pass() {
    let _turn = common::file_turn(file!());
    let server = Server::with_pgqueue(&["pgqueue.tick_interval = '200ms'"]);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let venv = std::env::var("PGQUEUE_VENV").unwrap_or_else(|_| "/var/cache/pgqueue/venv".into());
    let python = PathBuf::from(&venv).join("bin/python");
    assert!(python.exists(), "{} is missing: run scripts/setup.sh", python.display());
    let out = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "clients/python/tests"])
        .current_dir(&root)
        .env("PYTHONPATH", root.join("clients/python/src"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PGQUEUE_TEST_DSN", server.dsn("postgres"))
        .env("PGQUEUE_TEST_RESTART", server.restart_command())
        .output()
        .expect("run pytest");
    let output = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let n = common::pytest_passed(&output);
    assert!(
        out.status.success() && n >= EXPECTED_PASSED,
        "pytest exited with {} and {n} passed (expected at least {EXPECTED_PASSED}):\n{output}\n--- server log ---\n{}",
        out.status,
        server.log()
    );
    println!("{output}");
}
