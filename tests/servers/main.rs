//! Upgrades, backups, standbys and crashes: servers of their own, and the test cluster's
//! `pgqueue.databases` restricted while an update or a restore runs (`workers_only_in`).
//! One binary, so the kit compiles once: each test takes its file's turn
//! (`common::file_turn`), so the files run one after another as separate binaries did, and
//! upgrade's and backup's restrictions never overlap (tests/README.md).

#[path = "../common/mod.rs"]
mod common;

mod backup;
mod crash;
mod held;
mod standby;
mod upgrade;
