//! The background worker, observed from real connections: it runs, commits, reloads its
//! settings on SIGHUP, survives the extension being dropped, and comes back when killed.

mod common;

use common::{Client, connect, wait_for};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(30);

/// (pid, ticks, tick_interval_ms) from the row the worker updates every tick.
fn state(client: &mut Client) -> Option<(i32, i64, i32)> {
    let row = client
        .query_opt(
            "SELECT pid, ticks, tick_interval_ms FROM pgqueue.worker_state WHERE pid IS NOT NULL",
            &[],
        )
        .ok()??;
    Some((row.get(0), row.get(1), row.get(2)))
}

fn worker_backend(client: &mut Client) -> Option<i32> {
    client
        .query_opt(
            "SELECT pid FROM pg_stat_activity
              WHERE backend_type = 'pgqueue worker' AND datname = current_database()",
            &[],
        )
        .unwrap()
        .map(|row| row.get(0))
}

fn ticks_beyond(client: &mut Client, pid: i32, ticks: i64) -> (i32, i64, i32) {
    wait_for("the worker to tick again", LIMIT, || {
        state(client).filter(|&(p, t, _)| p == pid && t > ticks)
    })
}

/// ALTER SYSTEM (which refuses to run in a transaction block), then SIGHUP everyone.
fn reload(client: &mut Client, alter_system: &str) {
    client.batch_execute(alter_system).unwrap();
    client.batch_execute("SELECT pg_reload_conf()").unwrap();
}

// One test walks the worker's whole life so the steps cannot interfere with each other.
#[test]
fn worker_lifecycle() {
    let mut client = connect();

    // 1. It runs in the test database and commits its heartbeat, again and again.
    let pid = wait_for("the worker in pg_stat_activity", LIMIT, || {
        worker_backend(&mut client)
    });
    let (state_pid, ticks, interval) = wait_for("a committed tick", LIMIT, || {
        state(&mut client).filter(|&(p, ..)| p == pid)
    });
    assert_eq!(state_pid, pid);
    assert_eq!(
        interval, 100,
        "the test cluster sets pgqueue.tick_interval = 100ms"
    );
    ticks_beyond(&mut client, pid, ticks);

    // 2. SIGHUP: a reloaded tick interval is what the worker uses from then on.
    reload(
        &mut client,
        "ALTER SYSTEM SET pgqueue.tick_interval = '150ms'",
    );
    let (_, _, interval) = wait_for("the reloaded interval", LIMIT, || {
        state(&mut client).filter(|&(p, _, i)| p == pid && i == 150)
    });
    assert_eq!(interval, 150);
    reload(
        &mut client,
        "ALTER SYSTEM SET pgqueue.tick_interval = '100ms'",
    );
    wait_for("the interval reset", LIMIT, || {
        state(&mut client).filter(|&(_, _, i)| i == 100)
    });

    // 3. The extension disappearing and coming back does not kill the worker.
    client.batch_execute("DROP EXTENSION pgqueue").unwrap();
    std::thread::sleep(Duration::from_millis(500)); // several ticks without the extension
    assert_eq!(
        worker_backend(&mut client),
        Some(pid),
        "worker survives the extension's absence"
    );
    client.batch_execute("CREATE EXTENSION pgqueue").unwrap();
    let (_, ticks, _) = wait_for("ticks in the recreated extension", LIMIT, || {
        state(&mut client).filter(|&(p, t, _)| p == pid && t > 0)
    });
    ticks_beyond(&mut client, pid, ticks);

    // 4. SIGTERM ends it promptly; being killed is not final, the postmaster restarts it.
    let terminated: bool = client
        .query_one("SELECT pg_terminate_backend($1, 5000)", &[&pid])
        .unwrap()
        .get(0);
    assert!(terminated, "the worker exits within 5 s of SIGTERM");
    let new_pid = wait_for("a restarted worker", LIMIT, || {
        worker_backend(&mut client).filter(|&p| p != pid)
    });
    let (_, ticks, _) = wait_for("the new worker's tick", LIMIT, || {
        state(&mut client).filter(|&(p, ..)| p == new_pid)
    });
    ticks_beyond(&mut client, new_pid, ticks);
}
