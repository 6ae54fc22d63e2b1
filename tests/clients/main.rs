//! The clients, examples, exporter, bench tool and console against servers of their own
//! (each test starts one; `connect()` only installs the extension). One binary, so the kit
//! compiles once: each test takes its file's turn (`common::file_turn`), so the files run one
//! after another as separate binaries did, each file's tests in parallel (tests/README.md).

#[path = "../common/mod.rs"]
mod common;

mod bench_smoke;
mod console;
mod examples;
mod exporter;
mod pgbouncer;
mod python_client;
mod rust_client;
