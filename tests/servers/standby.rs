//! A real streaming standby (pg_basebackup -R on localhost): while it is a standby pgqueue
//! runs nothing there and logs nothing alarming, and the queues replicate; after pg_promote()
//! its worker starts within the launcher's naptime and re-arms the claims that expired before
//! the failover; nothing is lost.

use crate::common;

use common::server::{Server, bindir, this_major};
use common::{Client, connect, wait_for};
use std::collections::BTreeSet;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

fn pgqueue_processes(c: &mut Client) -> Vec<String> {
    c.query("SELECT backend_type FROM pg_stat_activity WHERE backend_type LIKE 'pgqueue%' ORDER BY 1", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

fn ids(c: &mut Client, sql: &str) -> BTreeSet<i64> {
    c.query(sql, &[]).unwrap().iter().map(|r| r.get(0)).collect()
}

#[test]
fn a_standby_runs_nothing_until_promoted_then_takes_over_the_queues() {
    let _turn = common::file_turn(file!());
    let _installed = connect();
    let conf = [
        "shared_preload_libraries = 'pgqueue'",
        "pgqueue.launcher_naptime = '200ms'",
        "pgqueue.tick_interval = '100ms'",
    ];
    let primary = Server::init(&bindir(this_major()), &conf);
    primary.start();
    primary.connect("postgres").batch_execute("CREATE DATABASE app").unwrap();
    let mut p = primary.connect("app");
    p.batch_execute(
        "CREATE EXTENSION pgqueue;
         SELECT pgqueue.pgq_create_queue('jobs', lease => '1 hour', max_attempts => 3);
         SELECT pgqueue.pgq_send('jobs', jsonb_build_object('n', g)) FROM generate_series(1, 50) g;
         SELECT pgqueue.pgq_send('jobs', '{}', delay => '1 hour');",
    )
    .unwrap();
    // Some work done before the standby exists: acked and dead-lettered.
    for fail in [false, false, true] {
        let r = p.query_one("SELECT msg_id, claim_token FROM pgqueue.pgq_claim('jobs')", &[]).unwrap();
        let (id, token): (i64, uuid::Uuid) = (r.get(0), r.get(1));
        let f = if fail { "pgq_fail" } else { "pgq_ack" };
        p.execute(&format!("SELECT pgqueue.{f}($1::bigint, $2::uuid)"), &[&id, &token]).unwrap();
    }

    let standby = Server::standby_of(&primary, &[]);
    standby.start();
    let mut s = standby.connect("app");
    let in_recovery: bool = s.query_one("SELECT pg_is_in_recovery()", &[]).unwrap().get(0);
    assert!(in_recovery);

    // From now on the primary's worker idles (the setting is not part of what replicates),
    // so claims that expire stay expired until the failover.
    common::turn_workers_off(&mut p);
    let expired = ids(&mut p, "SELECT msg_id FROM pgqueue.pgq_claim('jobs', qty => 5, lease => '1 s')");
    let live = ids(&mut p, "SELECT msg_id FROM pgqueue.pgq_claim('jobs', qty => 2)");
    p.batch_execute("SELECT pgqueue.pgq_send('jobs', '{\"late\": true}') FROM generate_series(1, 3)").unwrap();
    std::thread::sleep(Duration::from_millis(1500)); // the short leases end

    // The standby replays all of it, and runs nothing of pgqueue's.
    let lsn: String = p.query_one("SELECT pg_current_wal_lsn()::text", &[]).unwrap().get(0);
    wait_for("the standby to replay the primary's WAL", LIMIT, || {
        let caught_up: bool =
            s.query_one("SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn", &[&lsn]).unwrap().get(0);
        caught_up.then_some(())
    });
    let all = "SELECT msg_id FROM pgqueue.messages UNION ALL SELECT msg_id FROM pgqueue.history";
    let sent = ids(&mut p, all);
    assert_eq!(sent.len(), 54);
    assert_eq!(ids(&mut s, all), sent, "the queues replicate");
    assert_eq!(pgqueue_processes(&mut s), Vec::<String>::new(), "no launcher or worker on a standby");
    let log = standby.log();
    let alarming: Vec<&str> =
        log.lines().filter(|l| ["ERROR", "FATAL", "PANIC", "WARNING"].iter().any(|w| l.contains(w))).collect();
    assert!(alarming.is_empty(), "the standby's log: {alarming:#?}");

    // Failover.
    drop(p);
    primary.stop();
    let promoted: bool = s.query_one("SELECT pg_promote()", &[]).unwrap().get(0);
    assert!(promoted);
    wait_for("a launcher and a worker after promotion", LIMIT, || {
        (pgqueue_processes(&mut s) == ["pgqueue launcher", "pgqueue worker"]).then_some(())
    });
    wait_for("the claims that expired before the failover re-armed", LIMIT, || {
        let back = ids(&mut s, "SELECT msg_id FROM pgqueue.messages WHERE state = 'ready' AND attempt = 1");
        expired.is_subset(&back).then_some(())
    });
    let still = ids(&mut s, "SELECT msg_id FROM pgqueue.messages WHERE state = 'claimed'");
    assert_eq!(still, live, "live leases are left alone");
    assert_eq!(ids(&mut s, all), sent, "nothing lost");
    // And it is a working queue: claim, ack, send.
    let r = s.query_one("SELECT msg_id, claim_token FROM pgqueue.pgq_claim('jobs')", &[]).unwrap();
    let (id, token): (i64, uuid::Uuid) = (r.get(0), r.get(1));
    let acked: bool = s.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&id, &token]).unwrap().get(0);
    assert!(acked);
    let new: i64 = s.query_one("SELECT pgqueue.pgq_send('jobs', '{}')", &[]).unwrap().get(0);
    assert!(!sent.contains(&new) && new > *sent.last().unwrap());
}
