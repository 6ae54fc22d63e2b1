//! The binary's startup: a listen address beyond loopback without authentication is refused
//! before anything listens; `hash-password` prints a hash that `--password-hash` accepts.

use std::io::Write;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_pgqueue-console");

#[test]
fn an_exposed_listen_without_auth_refuses_to_start() {
    let out = Command::new(BIN)
        .args(["--dsn", "host=127.0.0.1 dbname=postgres", "--listen", "0.0.0.0:0"])
        .env_remove("PGQUEUE_CONSOLE_PASSWORD_HASH")
        .env_remove("PGQUEUE_CONSOLE_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("refusing to listen on 0.0.0.0:0 without authentication"), "{stderr}");
}

#[test]
fn hash_password_prints_a_usable_hash() {
    let mut child =
        Command::new(BIN).arg("hash-password").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"correct horse\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let hash = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(pgqueue_console::auth::verify_password(&hash, "correct horse"), "{hash}");
    let config = pgqueue_console::Config {
        password_hash: Some(hash),
        listen: "0.0.0.0:8080".parse().unwrap(),
        ..pgqueue_console::Config::new("host=127.0.0.1")
    };
    assert_eq!(config.validate(), Ok(()));
}

#[test]
fn serve_refuses_an_exposed_listener_and_runs_on_a_spawned_task() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("0.0.0.0:0")).unwrap();
    // Spawned, as a test or a program embedding it would: the future is Send.
    let task = rt.spawn(pgqueue_console::serve(pgqueue_console::Config::new("host=127.0.0.1"), listener));
    let refused = rt.block_on(task).unwrap().expect_err("refused");
    assert!(refused.to_string().contains("refusing to listen on 0.0.0.0:"), "{refused}");
}
