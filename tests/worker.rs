//! The background worker, observed from real connections: it runs, commits, reloads its
//! settings on SIGHUP, survives the extension being dropped, and comes back when killed.

mod common;

use common::server::Server;
use common::{
    Client, as_the_ledger_leaves_it, claim_two, connect, held_disagreements, message, message_row, new_queue, send,
    send_many, state, unique_queue, wait_for,
};
use serde_json::json;
use std::sync::Mutex;
use std::time::Duration;
use uuid::Uuid;

const LIMIT: Duration = Duration::from_secs(30);

/// One test drops the extension: the tests of this binary take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn stat(c: &mut Client, column: &str) -> i64 {
    c.query_one(&format!("SELECT coalesce({column}, 0)::bigint FROM pgqueue.worker_stats"), &[]).unwrap().get(0)
}

/// (pid, ticks, tick_interval_ms) from the row the worker updates every tick.
fn worker_state(client: &mut Client) -> Option<(i32, i64, i32)> {
    let row = client
        .query_opt("SELECT pid, ticks, tick_interval_ms FROM pgqueue.worker_state WHERE pid IS NOT NULL", &[])
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
    wait_for("the worker to tick again", LIMIT, || worker_state(client).filter(|&(p, t, _)| p == pid && t > ticks))
}

/// ALTER SYSTEM (which refuses to run in a transaction block), then SIGHUP everyone.
fn reload(client: &mut Client, alter_system: &str) {
    client.batch_execute(alter_system).unwrap();
    client.batch_execute("SELECT pg_reload_conf()").unwrap();
}

// One test walks the worker's whole life so the steps cannot interfere with each other.
#[test]
fn worker_lifecycle() {
    let _serial = serial();
    let mut client = connect();

    // 1. It runs in the test database and commits its heartbeat, again and again.
    let pid = wait_for("the worker in pg_stat_activity", LIMIT, || worker_backend(&mut client));
    let (state_pid, ticks, interval) =
        wait_for("a committed tick", LIMIT, || worker_state(&mut client).filter(|&(p, ..)| p == pid));
    assert_eq!(state_pid, pid);
    assert_eq!(interval, 100, "the test cluster sets pgqueue.tick_interval = 100ms");
    ticks_beyond(&mut client, pid, ticks);

    // 2. SIGHUP: a reloaded tick interval is what the worker uses from then on.
    reload(&mut client, "ALTER SYSTEM SET pgqueue.tick_interval = '150ms'");
    let (_, _, interval) = wait_for("the reloaded interval", LIMIT, || {
        worker_state(&mut client).filter(|&(p, _, i)| p == pid && i == 150)
    });
    assert_eq!(interval, 150);
    reload(&mut client, "ALTER SYSTEM SET pgqueue.tick_interval = '100ms'");
    wait_for("the interval reset", LIMIT, || worker_state(&mut client).filter(|&(_, _, i)| i == 100));

    // 3. The extension dropped: the worker leaves. Created again: a worker comes back.
    client.batch_execute("DROP EXTENSION pgqueue").unwrap();
    wait_for("the worker to leave", LIMIT, || worker_backend(&mut client).is_none().then_some(()));
    client.batch_execute("CREATE EXTENSION pgqueue").unwrap();
    let pid = wait_for("a worker for the recreated extension", LIMIT, || worker_backend(&mut client));
    let (_, ticks, _) = wait_for("ticks in the recreated extension", LIMIT, || {
        worker_state(&mut client).filter(|&(p, t, _)| p == pid && t > 0)
    });
    ticks_beyond(&mut client, pid, ticks);

    // 4. pgqueue.databases restricts the workers to the databases it names.
    reload(&mut client, "ALTER SYSTEM SET pgqueue.databases = 'some_other_database'");
    wait_for("the worker to leave an unlisted database", LIMIT, || worker_backend(&mut client).is_none().then_some(()));
    reload(&mut client, "ALTER SYSTEM SET pgqueue.databases = 'postgres, pgrx_tests'");
    let pid = wait_for("the worker back in a listed database", LIMIT, || worker_backend(&mut client));
    reload(&mut client, "ALTER SYSTEM RESET pgqueue.databases");

    // 5. SIGTERM ends it promptly (its counters outlive it); the launcher starts another.
    let ticks_before = stat(&mut client, "ticks");
    let terminated: bool = client.query_one("SELECT pg_terminate_backend($1, 5000)", &[&pid]).unwrap().get(0);
    assert!(terminated, "the worker exits within 5 s of SIGTERM");
    let new_pid = wait_for("a restarted worker", LIMIT, || worker_backend(&mut client).filter(|&p| p != pid));
    let (_, ticks, _) =
        wait_for("the new worker's tick", LIMIT, || worker_state(&mut client).filter(|&(p, ..)| p == new_pid));
    ticks_beyond(&mut client, new_pid, ticks);
    assert!(ticks > ticks_before, "counters are not reset by a restart");

    // 6. The launcher, killed, is restarted by the postmaster; the worker carries on, alone:
    // the new launcher adopts it rather than starting a second one.
    let launcher = launcher_backend(&mut client).expect("the launcher runs");
    let worker = worker_backend(&mut client).expect("the worker runs");
    let locked: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = x'70677175'::int::oid
                AND objsubid = 3 AND mode = 'ExclusiveLock' AND granted AND pid = $1",
            &[&worker],
        )
        .unwrap()
        .get(0);
    assert_eq!(locked, 1, "the worker holds its database's lock");
    let terminated: bool = client.query_one("SELECT pg_terminate_backend($1, 5000)", &[&launcher]).unwrap().get(0);
    assert!(terminated);
    wait_for("a restarted launcher", LIMIT, || launcher_backend(&mut client).filter(|&p| p != launcher));
    let (_, ticks, _) = worker_state(&mut client).unwrap();
    wait_for("ticks after the launcher's restart", LIMIT, || worker_state(&mut client).filter(|&(_, t, _)| t > ticks));
    // Ten of the new launcher's rounds (its naptime is 200 ms here).
    for _ in 0..40 {
        let workers: Vec<i32> = client
            .query(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pgqueue worker' AND datname = current_database()",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(workers, vec![worker], "one worker, the same, after the launcher's restart");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn launcher_backend(client: &mut Client) -> Option<i32> {
    client
        .query_opt("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pgqueue launcher'", &[])
        .unwrap()
        .map(|row| row.get(0))
}

#[test]
fn every_database_with_the_extension_gets_a_worker_and_can_still_be_dropped() {
    let _serial = serial();
    let mut c = connect();
    let db = unique_queue("db");
    c.batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
    let mut other = common::connect_to(&db);
    // No extension, no worker (beyond a brief look).
    std::thread::sleep(Duration::from_millis(600));
    let workers = |c: &mut Client| -> i64 {
        c.query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgqueue worker' AND datname = $1",
            &[&db],
        )
        .unwrap()
        .get(0)
    };
    assert_eq!(workers(&mut c), 0);
    other.batch_execute("CREATE EXTENSION pgqueue").unwrap();
    wait_for("a worker in the new database", LIMIT, || (workers(&mut c) == 1).then_some(()));
    let ticks = |o: &mut Client| -> i64 { o.query_one("SELECT ticks FROM pgqueue.worker_state", &[]).unwrap().get(0) };
    wait_for("ticks in the new database", LIMIT, || (ticks(&mut other) > 0).then_some(()));
    drop(other);
    let launcher = launcher_backend(&mut c);
    // A plain DROP DATABASE (no FORCE) is not blocked by the worker.
    c.batch_execute(&format!("DROP DATABASE {db}")).unwrap();
    assert_eq!(workers(&mut c), 0);
    assert_eq!(launcher_backend(&mut c), launcher, "the launcher carries on");
    let (_, t, _) = worker_state(&mut c).unwrap();
    wait_for("this database's worker still ticking", LIMIT, || worker_state(&mut c).filter(|&(_, n, _)| n > t));
}

#[test]
fn the_worker_rearms_an_expired_claim_by_itself() {
    let _serial = serial();
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let id: i64 = c.query_one("SELECT pgqueue.pgq_send($1, '{}')", &[&q]).unwrap().get(0);
    c.execute("SELECT * FROM pgqueue.pgq_claim($1, lease => '200 ms')", &[&q]).unwrap();
    let rearmed = stat(&mut c, "rearmed");
    // Nobody calls anything: the worker re-arms it.
    wait_for("the worker to re-arm the claim", LIMIT, || (state(&mut c, id).as_deref() == Some("ready")).then_some(()));
    // The counters are written at the end of the tick that re-armed it.
    wait_for("the re-arm counted", LIMIT, || (stat(&mut c, "rearmed") > rearmed).then_some(()));
    // And a delayed message is promoted in bulk by the worker too.
    let later: i64 = c.query_one("SELECT pgqueue.pgq_send($1, '{}', delay => '200 ms')", &[&q]).unwrap().get(0);
    wait_for("the worker to promote a due message", LIMIT, || {
        (state(&mut c, later).as_deref() == Some("ready")).then_some(())
    });
}

/// Messages made ready around the API, below their hint, are claimed in order once the tick's
/// check has run, while the first of them is held locked by another transaction: the check
/// lowers the hint (to that message, or first to the free one after it), and no tick fails.
#[test]
fn the_check_lowers_a_hint_past_a_message_held_locked_below_it() {
    let _serial = serial();
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let ids: Vec<i64> = (0..3).map(|_| send(&mut c, &q, json!({}))).collect();
    c.query("SELECT * FROM pgqueue.pgq_claim($1, 2)", &[&q]).unwrap();
    // Made ready again by hand: no commit of the API lowers the hint, which stays past them.
    // Their claims counted as ended (as a re-arm counts them): else, with the claim ledger on,
    // its entries would still hold the rows (0.24.0), and they would not be claimable.
    c.execute(
        "UPDATE pgqueue.message_rows SET state = 'ready', claim_token = NULL, claimed_at = NULL, consumer = NULL,
                lease_expires_at = NULL, session_pid = NULL, session_started = NULL, claims_ended = claims_ended + 1
          WHERE msg_id = ANY ($1)",
        &[&ids[..2].to_vec()],
    )
    .unwrap();
    let mut holder = connect();
    let mut hold = holder.transaction().unwrap();
    hold.query("SELECT FROM pgqueue.message_rows WHERE msg_id = $1 FOR UPDATE", &[&ids[0]]).unwrap();
    let failures = stat(&mut c, "tick_failures");
    let pid = worker_backend(&mut c).expect("the worker runs");
    let (_, ticks, _) = worker_state(&mut c).unwrap();
    let (_, ticks, _) = ticks_beyond(&mut c, pid, ticks + 3);
    let first: i64 = c.query_one("SELECT msg_id FROM pgqueue.pgq_claim($1)", &[&q]).unwrap().get(0);
    assert_eq!(first, ids[1], "the free message below the hint comes first, not the one after the hint");
    hold.rollback().unwrap();
    ticks_beyond(&mut c, pid, ticks + 1);
    assert_eq!(stat(&mut c, "tick_failures"), failures, "no tick failed");
}

#[test]
fn a_hundred_thousand_abandoned_claims_drain_in_bounded_passes_while_live_work_flows() {
    const ABANDONED: i64 = 100_000;
    let _serial = serial();
    let mut c = connect();
    let dead_fleet = new_queue(&mut c, "");
    let live = new_queue(&mut c, "");
    // The abandoned claims: claimed with a long lease, then aged past it in one statement
    // (as if the fleet died an hour ago), so none expires before all are claimed.
    c.execute(
        "SELECT pgqueue.pgq_send_batch($1, array_agg(jsonb_build_object('i', g))) FROM generate_series(1, 10000) g, generate_series(1, 10) r GROUP BY r",
        &[&dead_fleet],
    )
    .unwrap();
    loop {
        let n: i64 =
            c.query_one("SELECT count(*) FROM pgqueue.pgq_claim($1, 1000, '1 hour')", &[&dead_fleet]).unwrap().get(0);
        if n == 0 {
            break;
        }
    }
    let (rows0, batches0) = (stat(&mut c, "rescue_rows"), stat(&mut c, "rescue_batches"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let consumer = {
        let (live, stop) = (live.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut c = connect();
            let mut done = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                c.execute("SELECT pgqueue.pgq_send($1, '{}')", &[&live]).unwrap();
                let row = c.query_one("SELECT msg_id, claim_token FROM pgqueue.pgq_claim($1)", &[&live]).unwrap();
                let (id, token): (i64, Uuid) = (row.get(0), row.get(1));
                let ok: bool =
                    c.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&id, &token]).unwrap().get(0);
                assert!(ok);
                done += 1;
            }
            done
        })
    };
    c.execute(
        "UPDATE pgqueue.message_rows SET lease_expires_at = now() - interval '1 hour' WHERE queue = $1",
        &[&dead_fleet],
    )
    .unwrap();
    let live_during_drain = {
        wait_for("the backlog to drain", Duration::from_secs(300), || {
            let left: i64 = c
                .query_one(
                    "SELECT count(*) FROM pgqueue.messages WHERE queue = $1 AND state = 'claimed'",
                    &[&dead_fleet],
                )
                .unwrap()
                .get(0);
            (left == 0).then_some(())
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        consumer.join().unwrap()
    };
    let row = c
        .query_one(
            "SELECT count(*) FILTER (WHERE state = 'ready' AND attempt = 1 AND last_error = 'lease expired'), count(*)
               FROM pgqueue.messages WHERE queue = $1",
            &[&dead_fleet],
        )
        .unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (ABANDONED, ABANDONED), "every one claimable again");
    // The last pass's counts are written at the end of its tick: wait for them, then make
    // sure no re-arm is counted twice.
    wait_for("the last pass counted", LIMIT, || (stat(&mut c, "rescue_rows") - rows0 >= ABANDONED).then_some(()));
    std::thread::sleep(Duration::from_millis(500));
    let (rows, batches) = (stat(&mut c, "rescue_rows") - rows0, stat(&mut c, "rescue_batches") - batches0);
    assert_eq!(rows, ABANDONED, "each abandoned claim re-armed exactly once");
    // Through the claim ledger (on in the suite from 17 on) a batch takes whole ledger rows,
    // here claim calls of 1,000 each.
    let ledger: bool = c.query_one("SELECT current_setting('pgqueue.claim_ledger')::boolean", &[]).unwrap().get(0);
    let per_batch = if ledger { 1000 } else { 500 };
    assert!(batches >= ABANDONED / per_batch, "bounded batches of {per_batch}: {batches}");
    assert!(live_during_drain > 0, "live claims kept flowing during the drain");
}

#[test]
fn a_failing_step_is_counted_and_the_others_still_run() {
    let _serial = serial();
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let pid = wait_for("a ticking worker", LIMIT, || Some(stat(&mut c, "pid")).filter(|&p| p != 0));
    let failures = stat(&mut c, "prune_failures");
    // Break the prune step: its bookkeeping table disappears.
    c.batch_execute("ALTER TABLE pgqueue.prune_state RENAME TO prune_state_gone").unwrap();
    wait_for("a counted prune failure", LIMIT, || (stat(&mut c, "prune_failures") > failures).then_some(()));
    let error: String = c.query_one("SELECT last_error FROM pgqueue.worker_stats", &[]).unwrap().get(0);
    assert!(error.starts_with("prune:"), "last_error names the step: {error}");
    // Meanwhile the re-arm step still works, tick after tick.
    let id: i64 = c.query_one("SELECT pgqueue.pgq_send($1, '{}')", &[&q]).unwrap().get(0);
    c.execute("SELECT * FROM pgqueue.pgq_claim($1, lease => '100 ms')", &[&q]).unwrap();
    wait_for("a re-arm despite the failing prune", LIMIT, || {
        (state(&mut c, id).as_deref() == Some("ready")).then_some(())
    });
    c.batch_execute("ALTER TABLE pgqueue.prune_state_gone RENAME TO prune_state").unwrap();
    assert_eq!(stat(&mut c, "pid"), pid, "the same worker process carried on");
}

/// A tick whose record fails (its row locked past the worker's lock_timeout of 5 s) is
/// recorded with the next tick: its counts and its own failure.
#[test]
fn a_tick_whose_record_failed_is_recorded_with_the_next() {
    let _serial = serial();
    let mut c = connect();
    let q = new_queue(&mut c, "");
    wait_for("a ticking worker", LIMIT, || Some(stat(&mut c, "pid")).filter(|&p| p != 0));
    // Lock the row before the claim: a slow machine may otherwise see the short lease re-armed
    // and recorded before the lock is taken.
    let mut holder = connect();
    let mut tx = holder.transaction().unwrap();
    tx.execute("SELECT FROM pgqueue.worker_state FOR UPDATE", &[]).unwrap();
    let (failures, ticks, rearmed) = (stat(&mut c, "tick_failures"), stat(&mut c, "ticks"), stat(&mut c, "rearmed"));
    let id: i64 = c.query_one("SELECT pgqueue.pgq_send($1, '{}')", &[&q]).unwrap().get(0);
    c.execute("SELECT * FROM pgqueue.pgq_claim($1, lease => '100 ms')", &[&q]).unwrap();
    // The worker re-arms the claim, then waits 5 s for the row and gives up on this record.
    wait_for("the re-arm", LIMIT, || (state(&mut c, id).as_deref() == Some("ready")).then_some(()));
    std::thread::sleep(Duration::from_millis(6_000));
    assert_eq!(stat(&mut c, "rearmed"), rearmed, "not recorded while the row is locked");
    tx.commit().unwrap();
    wait_for("the failed record counted", LIMIT, || (stat(&mut c, "tick_failures") > failures).then_some(()));
    let error: String = c.query_one("SELECT last_error FROM pgqueue.worker_stats", &[]).unwrap().get(0);
    assert!(error.starts_with("record:") && error.contains("lock timeout"), "{error}");
    assert!(stat(&mut c, "rearmed") > rearmed, "the re-arm of the unrecorded tick is counted");
    assert!(stat(&mut c, "ticks") >= ticks + 2, "both ticks are counted");
}

#[test]
fn a_session_bound_claim_comes_back_when_its_backend_dies() {
    let _serial = serial();
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let bound: i64 = c.query_one("SELECT pgqueue.pgq_send($1, '{\"bound\": true}')", &[&q]).unwrap().get(0);
    let plain: i64 = c.query_one("SELECT pgqueue.pgq_send($1, '{}')", &[&q]).unwrap().get(0);
    let mut consumer = connect();
    let got: i64 = consumer
        .query_one("SELECT msg_id FROM pgqueue.pgq_claim($1, lease => '1 hour', session_bound => true)", &[&q])
        .unwrap()
        .get(0);
    assert_eq!(got, bound);
    consumer.query_one("SELECT msg_id FROM pgqueue.pgq_claim($1, lease => '1 hour')", &[&q]).unwrap();
    let consumer_pid: i32 = consumer.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    // While the consumer lives, its claim stays.
    let ticks = stat(&mut c, "ticks");
    wait_for("two ticks", LIMIT, || (stat(&mut c, "ticks") >= ticks + 2).then_some(()));
    assert_eq!(state(&mut c, bound).as_deref(), Some("claimed"));

    let ok: bool = c.query_one("SELECT pg_terminate_backend($1, 5000)", &[&consumer_pid]).unwrap().get(0);
    assert!(ok);
    let ticks = stat(&mut c, "ticks");
    wait_for("the session-bound claim back", LIMIT, || {
        (state(&mut c, bound).as_deref() == Some("ready")).then_some(())
    });
    let took = stat(&mut c, "ticks") - ticks;
    assert!(took <= 3, "claimable again within two ticks (took {took})");
    assert_eq!(state(&mut c, plain).as_deref(), Some("claimed"), "a plain claim waits for its lease");
}

/// 0.24.0: claims that only the claim ledger holds (their rows left 'ready', as claims through
/// the ledger will leave them: step 3b of the write path) are re-armed by the worker's pass once
/// their lease ends, and once a session-bound holder's backend exits (the orphans step, then
/// the pass), with nobody calling anything.
#[test]
fn the_worker_rearms_claims_only_the_ledger_holds() {
    let _serial = serial();
    let mut c = connect();
    c.batch_execute("SET pgqueue.claim_ledger = on").unwrap();
    let q = new_queue(&mut c, ", lease => '1 hour'");
    send_many(&mut c, &q, 4, "0");
    // Its lease ends (the claim's, shortened by hand), and the worker is told so. Claims of
    // two: a claim of one message writes its row, not the ledger.
    let two = claim_two(&mut c, &q);
    let mut tx = c.transaction().unwrap();
    tx.execute(
        "UPDATE pgqueue.claims SET lease_expires_at = now() - interval '1 s' WHERE $1 = ANY (msg_ids)",
        &[&two[0].id],
    )
    .unwrap();
    tx.execute("SELECT pgqueue._renewed(now() - interval '1 s')", &[]).unwrap();
    tx.commit().unwrap();
    for m in &two {
        wait_for("the worker to re-arm it", LIMIT, || (message_row(&mut c, m.id)?.2 == 1).then_some(()));
        assert_eq!(message(&mut c, m.id).map(|m| (m.state, m.attempt)), Some(("ready".into(), 1)));
    }

    // A session-bound claim whose backend exits.
    let mut holder = connect();
    holder.batch_execute("SET pgqueue.claim_ledger = on").unwrap();
    let bound: Uuid = holder
        .query("SELECT claim_token FROM pgqueue.pgq_claim($1, 2, session_bound => true)", &[&q])
        .unwrap()
        .first()
        .expect("claimed")
        .get(0);
    let pid: i32 = holder.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    let id: i64 = c.query_one("SELECT msg_id FROM pgqueue.messages WHERE claim_token = $1", &[&bound]).unwrap().get(0);
    as_the_ledger_leaves_it(&mut c, id);
    let ended = message_row(&mut c, id).unwrap().2;
    let ticks = stat(&mut c, "ticks");
    wait_for("two ticks", LIMIT, || (stat(&mut c, "ticks") >= ticks + 2).then_some(()));
    assert_eq!(message(&mut c, id).map(|m| m.state), Some("claimed".into()), "held while its session lives");
    assert!(c.query_one("SELECT pg_terminate_backend($1, 5000)", &[&pid]).unwrap().get::<_, bool>(0));
    wait_for("the orphans step and the pass", LIMIT, || (message_row(&mut c, id)?.2 == ended + 1).then_some(()));
    assert_eq!(message(&mut c, id).map(|m| m.state), Some("ready".into()));
    assert!(held_disagreements(&mut c, &[&q]).is_empty(), "{:?}", held_disagreements(&mut c, &[&q]));
}

#[test]
fn a_database_owner_who_is_not_a_superuser_drops_it_and_nobody_else_disturbs_its_worker() {
    let _serial = serial();
    let mut c = connect();
    let db = unique_queue("owned");
    let forced = format!("{db}_forced");
    let (owner, stranger) = (format!("{db}_owner"), format!("{db}_stranger"));
    c.batch_execute(&format!("CREATE ROLE {owner} LOGIN CREATEDB; CREATE ROLE {stranger} LOGIN CREATEDB")).unwrap();
    let worker = |c: &mut Client, db: &str| -> Option<i32> {
        c.query_opt("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pgqueue worker' AND datname = $1", &[&db])
            .unwrap()
            .map(|r| r.get(0))
    };
    for d in [&db, &forced] {
        c.batch_execute(&format!("CREATE DATABASE {d} OWNER {owner}")).unwrap();
        common::connect_to(d).batch_execute("CREATE EXTENSION pgqueue").unwrap();
    }
    let pid = wait_for("a worker in the owned database", LIMIT, || worker(&mut c, &db));
    wait_for("a worker in the other one", LIMIT, || worker(&mut c, &forced));
    let still_ticking = |c: &mut Client| {
        let ticks = stat(&mut common::connect_to(&db), "ticks");
        wait_for("two more ticks there", LIMIT, || {
            (stat(&mut common::connect_to(&db), "ticks") >= ticks + 2).then_some(())
        });
        assert_eq!(worker(c, &db), Some(pid), "the same worker carries on");
    };

    // Someone who may not drop it is refused, and its worker is left alone.
    let mut other = common::connect_as(&stranger, "postgres");
    let err = other.batch_execute(&format!("DROP DATABASE {db}")).unwrap_err();
    assert_eq!(err.code().map(|s| s.code()), Some("42501"), "{err}");
    still_ticking(&mut c);
    // So does a drop that PostgreSQL refuses in a transaction block.
    let mut owner_session = common::connect_as(&owner, "postgres");
    owner_session.batch_execute("BEGIN").unwrap();
    let err = owner_session.batch_execute(&format!("DROP DATABASE {db}")).unwrap_err();
    assert_eq!(err.code().map(|s| s.code()), Some("25001"), "{err}");
    owner_session.batch_execute("ROLLBACK").unwrap();
    still_ticking(&mut c);

    // Its owner drops it at once, plainly or WITH (FORCE): the worker leaves first.
    owner_session.batch_execute(&format!("DROP DATABASE {db}")).expect("the owner's DROP DATABASE succeeds");
    owner_session
        .batch_execute(&format!("DROP DATABASE {forced} WITH (FORCE)"))
        .expect("the owner's DROP DATABASE WITH (FORCE) succeeds");
    let gone: i64 =
        c.query_one("SELECT count(*) FROM pg_database WHERE datname IN ($1, $2)", &[&db, &forced]).unwrap().get(0);
    assert_eq!(gone, 0);
    drop((other, owner_session));
    c.batch_execute(&format!("DROP ROLE {owner}; DROP ROLE {stranger}")).unwrap();
}

/// pgqueue's ProcessUtility hook sees every utility statement of the cluster: their errors
/// must reach the client as PostgreSQL raised them, also with RUST_BACKTRACE set for the
/// postmaster (pgrx adds a Rust backtrace as DETAIL to errors it re-raises).
#[test]
fn errors_of_other_statements_pass_through_the_hook_unchanged() {
    let _installed = connect();
    let server = common::server::Server::init(
        &common::server::bindir(common::server::this_major()),
        &["shared_preload_libraries = 'pgqueue'"],
    )
    .env("RUST_BACKTRACE", "1");
    server.start();
    for db in ["postgres", "with_pgqueue"] {
        let mut c = server.connect("postgres");
        if db != "postgres" {
            c.batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
            c = server.connect(db);
            c.batch_execute("CREATE EXTENSION pgqueue").unwrap();
        }
        c.batch_execute("CREATE TABLE t (a int); CREATE VIEW v AS SELECT a FROM t").unwrap();

        let err = c.batch_execute("CREATE TABLE t ()").unwrap_err();
        let e = err.as_db_error().expect("a server error");
        assert_eq!((e.code().code(), e.message()), ("42P07", "relation \"t\" already exists"));
        assert_eq!(e.detail(), None, "no DETAIL added");

        let err = c.batch_execute("DROP TABLE t").unwrap_err();
        let e = err.as_db_error().unwrap();
        assert_eq!(e.code().code(), "2BP01");
        assert_eq!(e.detail(), Some("view v depends on table t"));
        assert_eq!(e.hint(), Some("Use DROP ... CASCADE to drop the dependent objects too."));

        // The error's position in the statement survives too.
        let err = c.batch_execute("CREATE TABLE u (a no_such_type)").unwrap_err();
        let e = err.as_db_error().unwrap();
        assert_eq!((e.code().code(), e.detail()), ("42704", None));
        assert!(matches!(e.position(), Some(postgres::error::ErrorPosition::Original(19))), "{:?}", e.position());
    }
}

/// SIGTERM (what a fast shutdown, `pg_terminate_backend` and DROP DATABASE send) ends the
/// worker's statement under way instead of waiting for it: here a tick waiting for a lock,
/// which it would otherwise wait for until its lock timeout (5 s) and then fail. A server
/// of its own: the test holds the hot table's lock.
#[test]
fn sigterm_ends_the_workers_statement_under_way() {
    let server = common::server::Server::with_pgqueue(&["pgqueue.tick_interval = '100ms'"]);
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('stop'); SELECT pgqueue.pgq_send('stop', '{}')").unwrap();
    let mut locker = server.connect("postgres");
    locker.batch_execute("BEGIN; LOCK TABLE pgqueue.message_rows IN ACCESS EXCLUSIVE MODE").unwrap();
    let pid = wait_for("the worker waiting for the lock", LIMIT, || {
        c.query_opt(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pgqueue worker' AND wait_event_type = 'Lock'",
            &[],
        )
        .unwrap()
        .map(|row| row.get::<_, i32>(0))
    });
    let signalled: bool = c.query_one("SELECT pg_terminate_backend($1)", &[&pid]).unwrap().get(0);
    assert!(signalled);
    wait_for("the worker to leave while the lock is still held", Duration::from_secs(3), || {
        c.query_opt("SELECT FROM pg_stat_activity WHERE pid = $1", &[&pid]).unwrap().is_none().then_some(())
    });
    let held: bool = locker
        .query_one(
            "SELECT EXISTS (SELECT FROM pg_locks WHERE pid = pg_backend_pid() AND mode = 'AccessExclusiveLock'
                              AND relation = 'pgqueue.message_rows'::regclass AND granted)",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(held, "the lock was held all along");
    locker.batch_execute("ROLLBACK").unwrap();
    let log = server.log();
    let ended = format!("[{pid}] FATAL:  terminating background worker");
    assert!(log.contains(&ended), "the worker ended at its statement's interrupt check:\n{log}");
    assert!(!log.contains("lock timeout"), "no statement waited out its lock timeout:\n{log}");
    // The launcher starts another, which ticks once the lock is gone.
    wait_for("a new worker ticking", LIMIT, || {
        c.query_opt("SELECT pid FROM pgqueue.worker_state WHERE pid IS NOT NULL AND pid <> $1 AND ticks > 0", &[&pid])
            .unwrap()
            .map(|_| ())
    });
}

/// (ready, claimed) of `q` as the shared state counts them.
fn depth(c: &mut Client, q: &str) -> (Option<i64>, Option<i64>) {
    let r = c.query_one("SELECT ready, claimed FROM pgqueue.queue_depth WHERE queue = $1", &[&q]).unwrap();
    (r.get(0), r.get(1))
}

/// ROLLBACK TO SAVEPOINT restarts the savepoint at the same nesting level: what the
/// transaction does after it is kept, and its commit is announced like any other. The depth
/// counts it, a waiting claim is woken, and the re-arm pass learns of the leases — without
/// that, only the full pass at the prune cadence would re-arm them. A server of its own,
/// with that cadence an hour away and no claim before, so no other pass comes.
#[test]
fn what_follows_a_rollback_to_savepoint_is_announced_at_commit() {
    let server = Server::with_pgqueue(&[
        "pgqueue.tick_interval = '100ms'",
        "pgqueue.launcher_naptime = '200ms'",
        "pgqueue.prune_interval = '1h'",
    ]);
    let mut c = server.connect("postgres");
    for q in ["sp_claim", "sp_send"] {
        c.execute("SELECT pgqueue.pgq_create_queue($1)", &[&q]).unwrap();
    }
    // The worker's first tick runs a full pass; after it no lease is known to end.
    wait_for("the worker's first passes", LIMIT, || (stat(&mut c, "ticks") >= 3).then_some(()));

    // A claim kept after a rolled-back one.
    let id = send(&mut c, "sp_claim", json!({}));
    assert_eq!(depth(&mut c, "sp_claim"), (Some(1), Some(0)));
    c.batch_execute(
        "BEGIN; SAVEPOINT s;
         SELECT * FROM pgqueue.pgq_claim('sp_claim', lease => '300 ms');
         ROLLBACK TO SAVEPOINT s",
    )
    .unwrap();
    let kept: i64 =
        c.query_one("SELECT msg_id FROM pgqueue.pgq_claim('sp_claim', lease => '300 ms')", &[]).unwrap().get(0);
    c.batch_execute("COMMIT").unwrap();
    assert_eq!(kept, id);
    assert_eq!(depth(&mut c, "sp_claim"), (Some(0), Some(1)), "the kept claim is counted");
    wait_for("the worker to re-arm the kept claim", LIMIT, || {
        (state(&mut c, id).as_deref() == Some("ready")).then_some(())
    });

    // A send kept after a rolled-back one wakes a waiting claim at its commit (the worker
    // off: its tick would wake a sleeper that missed a wake-up).
    common::turn_workers_off(&mut c);
    let mut waiter = server.connect("postgres");
    let claiming = std::thread::spawn(move || {
        let start = std::time::Instant::now();
        let rows = waiter.query("SELECT msg_id FROM pgqueue.pgq_claim('sp_send', wait => '50 s')", &[]).unwrap();
        (rows.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>(), start.elapsed())
    });
    wait_for("the claim to wait", LIMIT, || {
        let n: i64 =
            c.query_one("SELECT waiting_claims FROM pgqueue.queue_depth WHERE queue = 'sp_send'", &[]).unwrap().get(0);
        (n == 1).then_some(())
    });
    c.batch_execute("BEGIN; SAVEPOINT s; SELECT pgqueue.pgq_send('sp_send', '{}'); ROLLBACK TO SAVEPOINT s").unwrap();
    let sent = send(&mut c, "sp_send", json!({}));
    c.batch_execute("COMMIT").unwrap();
    let (got, waited) = claiming.join().unwrap();
    assert_eq!(got, vec![sent]);
    // A claim waiting 50 s that returns within 25 was woken (a functional check).
    assert!(waited < Duration::from_secs(25), "woken at the commit, not at its deadline ({waited:?})");
    assert_eq!(depth(&mut c, "sp_send"), (Some(0), Some(1)));
}

/// The rollup of the minute that just ended, forced: the next `pgq_tick()` records it.
fn roll_up(c: &mut Client) -> Vec<String> {
    c.batch_execute("UPDATE pgqueue.worker_state SET last_rollup_at = now() - interval '1 minute'").unwrap();
    c.query("SELECT step || ': ' || error FROM pgqueue.pgq_tick()", &[]).unwrap().iter().map(|r| r.get(0)).collect()
}

/// (sent, completed, dead, retried) summed over a queue's rollups, and (ready, delayed,
/// claimed) of its latest.
type Rolled = ((i64, i64, i64, i64), Option<(i64, i64, i64)>);

fn rolled_up(c: &mut Client, q: &str) -> Rolled {
    let sums = c
        .query_one(
            "SELECT coalesce(sum(sent), 0)::bigint, coalesce(sum(completed), 0)::bigint,
                    coalesce(sum(dead), 0)::bigint, coalesce(sum(retried), 0)::bigint
               FROM pgqueue.queue_minutes WHERE queue = $1",
            &[&q],
        )
        .unwrap();
    let depth = c
        .query_opt(
            "SELECT ready, delayed, claimed FROM pgqueue.queue_minutes WHERE queue = $1 ORDER BY minute DESC LIMIT 1",
            &[&q],
        )
        .unwrap()
        .map(|r| (r.get(0), r.get(1), r.get(2)));
    ((sums.get(0), sums.get(1), sums.get(2), sums.get(3)), depth)
}

/// Minute rollups count what commits did (a rolled-back send or claim counts nothing), with
/// the depths when recorded; a record that fails keeps its counts for the next one, which
/// adds them; rollups past pgqueue.rollup_retention are deleted, and a dropped queue's with it.
#[test]
fn minute_rollups_count_what_commits_did_and_lose_nothing_when_a_record_fails() {
    let _serial = serial();
    let server = Server::with_pgqueue(&["pgqueue.enabled = off"]);
    let mut c = server.connect("postgres");
    c.batch_execute(
        "SELECT pgqueue.pgq_create_queue('r', max_attempts => 3);
         SELECT pgqueue.pgq_send_batch('r', ARRAY['{}', '{}', '{}']::jsonb[]);
         SELECT pgqueue.pgq_send('r', '{}');
         SELECT pgqueue.pgq_send('r', '{}');
         SELECT pgqueue.pgq_send('r', '{}', delay => '1 hour');",
    )
    .unwrap();
    // (Each its own batch: a BEGIN inside a batch takes in the statements before it.)
    c.batch_execute("BEGIN; SELECT pgqueue.pgq_send_batch('r', ARRAY['{}', '{}']::jsonb[]); ROLLBACK").unwrap();
    c.batch_execute("BEGIN; SELECT count(*) FROM pgqueue.pgq_claim('r', 5); ROLLBACK").unwrap();
    let claimed = common::claim(&mut c, "r", 3, None);
    assert!(common::ack(&mut c, &claimed[0]));
    let (fail, nack) = (claimed[1].held(), claimed[2].held());
    c.execute("SELECT pgqueue.pgq_fail($1, $2)", &[&fail.0, &fail.1]).unwrap();
    c.execute("SELECT pgqueue.pgq_nack($1, $2, retry_in => '0')", &[&nack.0, &nack.1]).unwrap();
    assert_eq!(roll_up(&mut c), Vec::<String>::new());
    // Six sent (one delayed), one completed, one dead, one retried; three ready again.
    assert_eq!(rolled_up(&mut c, "r"), ((6, 1, 1, 1), Some((3, 1, 0))));
    let failures = stat(&mut c, "rollup_failures");

    // Not due again within the minute it last recorded: a tick adds nothing.
    send(&mut c, "r", json!({}));
    c.batch_execute(
        "BEGIN; UPDATE pgqueue.worker_state SET last_rollup_at = now(); SELECT pgqueue.pgq_tick(); COMMIT;",
    )
    .unwrap();
    assert_eq!(rolled_up(&mut c, "r").0, (6, 1, 1, 1));

    // A record that fails (a constraint refuses its rows) keeps what it drained ...
    c.batch_execute("ALTER TABLE pgqueue.queue_minutes ADD CONSTRAINT refuse CHECK (sent < 0) NOT VALID").unwrap();
    send(&mut c, "r", json!({}));
    let failed = roll_up(&mut c);
    assert!(failed.len() == 1 && failed[0].starts_with("rollup: "), "{failed:?}");
    assert_eq!(stat(&mut c, "rollup_failures"), failures + 1);
    // ... for the next, which records it with its own.
    c.batch_execute("ALTER TABLE pgqueue.queue_minutes DROP CONSTRAINT refuse").unwrap();
    send(&mut c, "r", json!({}));
    assert_eq!(roll_up(&mut c), Vec::<String>::new());
    assert_eq!(rolled_up(&mut c, "r"), ((9, 1, 1, 1), Some((6, 1, 0))));

    // Retention: a rollup older than the setting goes at the next record.
    c.batch_execute(
        "INSERT INTO pgqueue.queue_minutes (queue, minute, sent) VALUES ('r', now() - interval '3 hours', 100)",
    )
    .unwrap();
    c.batch_execute("ALTER SYSTEM SET pgqueue.rollup_retention = '2h'").unwrap();
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
    wait_for("the new retention", LIMIT, || {
        let r: String = c.query_one("SHOW pgqueue.rollup_retention", &[]).unwrap().get(0);
        (r == "2h").then_some(())
    });
    assert_eq!(roll_up(&mut c), Vec::<String>::new());
    assert_eq!(rolled_up(&mut c, "r").0, (9, 1, 1, 1));
    c.batch_execute("SELECT pgqueue.pgq_drop_queue('r', force => true)").unwrap();
    let left: i64 = c.query_one("SELECT count(*) FROM pgqueue.queue_minutes", &[]).unwrap().get(0);
    assert_eq!(left, 0, "a dropped queue's rollups go with it");
}

/// Dead letters of `q`: (as the shared state counts them, as history has them).
fn dead_counts(c: &mut Client, q: &str) -> (Option<i64>, i64) {
    let r = c
        .query_one(
            "SELECT (SELECT dead FROM pgqueue.queue_depth WHERE queue = $1),
                    (SELECT count(*) FROM pgqueue.history WHERE queue = $1 AND outcome = 'dead')",
            &[&q],
        )
        .unwrap();
    (r.get(0), r.get(1))
}

/// The shared count of dead letters (pgqueue.queue_depth's dead) against the table, over
/// random dead-letterings (fail, nack and re-arm on the last attempt), redrives and deletes,
/// committed, rolled back or undone by a savepoint: equal after every step. Lost at a restart
/// and recounted by the next tick; a change made around the API is corrected when the tick
/// validates the counts (the prune cadence).
#[test]
fn dead_letter_counts_follow_commits_and_are_recounted_by_the_tick() {
    let _serial = serial();
    let server = Server::with_pgqueue(&["pgqueue.enabled = off"]);
    let mut c = server.connect("postgres");
    let queues = ["dl_a", "dl_b"];
    for q in queues {
        c.execute("SELECT pgqueue.pgq_create_queue($1, max_attempts => 1, retention => '1 day')", &[&q]).unwrap();
    }
    for q in queues {
        assert_eq!(dead_counts(&mut c, q), (None, 0), "unknown until the tick counts it");
    }
    c.batch_execute("SELECT * FROM pgqueue.pgq_tick()").unwrap();
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    println!("seed {seed}");
    let mut state = seed;
    let mut next = |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let mut most = 0;
    for step in 0..150 {
        let q = queues[next(2) as usize];
        // How the step ends: committed, rolled back, or undone by ROLLBACK TO SAVEPOINT.
        let (open, close) = match next(4) {
            0 => ("BEGIN", "ROLLBACK"),
            1 => ("BEGIN; SAVEPOINT s", "ROLLBACK TO SAVEPOINT s; COMMIT"),
            _ => ("BEGIN", "COMMIT"),
        };
        let dead: Vec<i64> = c
            .query("SELECT msg_id FROM pgqueue.history WHERE queue = $1 AND outcome = 'dead' ORDER BY msg_id", &[&q])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let pick = if dead.is_empty() { None } else { Some(dead[next(dead.len() as u64) as usize]) };
        let action = match (next(6), pick) {
            (0, _) | (1, None) => format!(
                "SELECT pgqueue.pgq_fail(m.msg_id, m.claim_token, 'step {step}')
                   FROM pgqueue.pgq_claim('{q}', 2) m"
            ),
            (1, Some(_)) | (2, None) => {
                format!("SELECT pgqueue.pgq_nack(m.msg_id, m.claim_token) FROM pgqueue.pgq_claim('{q}', 1) m")
            }
            (2, Some(id)) => format!("SELECT pgqueue.pgq_redrive('{q}', ARRAY[{id}]::bigint[])"),
            (3, Some(id)) => format!("SELECT pgqueue.pgq_delete_dead('{q}', ARRAY[{id}]::bigint[])"),
            (4, _) => format!("SELECT pgqueue.pgq_redrive('{q}')"),
            _ => format!("SELECT count(*) FROM pgqueue.pgq_claim('{q}', 1, lease => '1 ms')"),
        };
        // Something to dead-letter, committed first.
        c.execute("SELECT pgqueue.pgq_send_batch($1, array_fill('{}'::jsonb, ARRAY[2]))", &[&q]).unwrap();
        c.batch_execute(&format!("{open}; {action}; {close}")).unwrap();
        if step % 10 == 0 {
            // Re-arms the expired claims: on their last attempt, to dead letters.
            std::thread::sleep(Duration::from_millis(2));
            c.batch_execute("SELECT * FROM pgqueue.pgq_tick()").unwrap();
        }
        for q in queues {
            let (shown, exact) = dead_counts(&mut c, q);
            assert_eq!(shown, Some(exact), "{q} after step {step} ({open}; {action}; {close}), seed {seed}");
            most = most.max(exact);
        }
    }
    // (At the end they may all have been redriven or deleted.)
    assert!(most > 0, "the steps made dead letters, seed {seed}");

    // A restart loses the counts; the first tick counts them again.
    server.restart();
    let mut c = server.connect("postgres");
    assert_eq!(dead_counts(&mut c, "dl_a").0, None);
    c.batch_execute("SELECT * FROM pgqueue.pgq_tick()").unwrap();
    for q in queues {
        let (shown, exact) = dead_counts(&mut c, q);
        assert_eq!(shown, Some(exact), "{q} after the restart");
    }

    // Dead letters written around the API, in a partition past retention: the count is off
    // until the prune cadence, when the tick prunes them and counts again.
    c.batch_execute(
        "SELECT pgqueue._ensure_history_day('dl_a', current_date - 5);
         INSERT INTO pgqueue.history (msg_id, queue, outcome, priority, attempt, payload, enqueued_at, finished_at)
         SELECT -g, 'dl_a', 'dead', 0, 1, '{}', now() - interval '6 days', (current_date - 5) + interval '1 hour'
           FROM generate_series(1, 5) g;",
    )
    .unwrap();
    let (shown, exact) = dead_counts(&mut c, "dl_a");
    assert_eq!(shown.unwrap() + 5, exact);
    c.batch_execute("UPDATE pgqueue.worker_state SET last_prune_at = NULL; SELECT * FROM pgqueue.pgq_tick()").unwrap();
    for q in queues {
        let (shown, exact) = dead_counts(&mut c, q);
        assert_eq!(shown, Some(exact), "{q} after the prune");
    }
}

/// A queue dropped while a tick runs fails none of its steps: the tick, held up by the drop's
/// locks, finds the queue gone once the drop commits and passes over it. The dead-letter
/// count looked its history table up, waited for the drop, then failed to read it (42P01).
#[test]
fn a_queue_dropped_while_the_tick_runs_fails_no_step() {
    let _serial = serial();
    let server = Server::with_pgqueue(&["pgqueue.enabled = off"]);
    let mut c = server.connect("postgres");
    c.execute("SELECT pgqueue.pgq_create_queue('stays')", &[]).unwrap();
    // The prune and the partitions done, so that the next tick's steps are the ones every
    // tick runs; then a queue whose dead letters it has not counted yet.
    c.batch_execute("SELECT * FROM pgqueue.pgq_tick()").unwrap();
    c.execute("SELECT pgqueue.pgq_create_queue('goes')", &[]).unwrap();
    assert_eq!(dead_counts(&mut c, "goes"), (None, 0), "due for its first count");

    let mut dropper = server.connect("postgres");
    dropper.batch_execute("BEGIN; SELECT pgqueue.pgq_drop_queue('goes')").unwrap();
    let mut ticker = server.connect("postgres");
    let pid: i32 = ticker.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    let tick = std::thread::spawn(move || {
        ticker
            .query("SELECT step, error FROM pgqueue.pgq_tick()", &[])
            .unwrap()
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
            .collect::<Vec<_>>()
    });
    wait_for("the tick waiting for the drop's locks", LIMIT, || {
        let waiting: bool = c
            .query_one("SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1", &[&pid])
            .unwrap()
            .get(0);
        waiting.then_some(())
    });
    dropper.batch_execute("COMMIT").unwrap();
    assert_eq!(tick.join().unwrap(), vec![], "failed steps");
    let failures: i64 = c.query_one("SELECT tick_failures FROM pgqueue.worker_stats", &[]).unwrap().get(0);
    assert_eq!(failures, 0);
}

/// (queue, ready, delayed, claimed, dead) as the overview shows them (the shared counts),
/// and as the tables count them.
#[allow(clippy::type_complexity)]
fn overview_and_exact(c: &mut Client) -> (Vec<(String, i64, i64, i64, i64)>, Vec<(String, i64, i64, i64, i64)>) {
    let rows = |c: &mut Client, sql: &str| -> Vec<(String, i64, i64, i64, i64)> {
        c.query(sql, &[]).unwrap().iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))).collect()
    };
    (
        rows(
            c,
            "SELECT queue, coalesce(ready, -1), coalesce(delayed, -1), coalesce(claimed, -1), coalesce(dead, -1)
               FROM pgqueue.queue_overview ORDER BY queue",
        ),
        rows(c, "SELECT queue, ready, delayed, claimed, dead FROM pgqueue.queue_stats ORDER BY queue"),
    )
}

/// The tick recounts depths and dead letters (forced at every tick here) while many sessions
/// send, claim, ack, nack, fail, redrive and delete, committing or rolling back: once they
/// stop, the shared counts equal the tables, although no count ran after the last commit.
/// A recount that replaced the counters with what its snapshot saw would lose the commits
/// that landed during it; one that added every move since it began would count twice those
/// its snapshot saw.
#[test]
fn counts_recounted_while_sessions_commit_equal_the_tables() {
    const SESSIONS: u64 = 6;
    let _serial = serial();
    let server = Server::with_pgqueue(&["pgqueue.enabled = off"]);
    let mut c = server.connect("postgres");
    let queues = ["rc_a", "rc_b", "rc_c"];
    for q in queues {
        c.execute("SELECT pgqueue.pgq_create_queue($1, max_attempts => 2, retention => '1 day')", &[&q]).unwrap();
    }
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    println!("seed {seed}");
    for round in 0..3 {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sessions: Vec<_> = (0..SESSIONS)
            .map(|i| {
                let (stop, mut s) = (stop.clone(), server.connect("postgres"));
                std::thread::spawn(move || {
                    let mut state = seed.wrapping_mul(i * 2 + round * 16 + 3) | 1;
                    let mut next = move |n: u64| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        state % n
                    };
                    let mut steps = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let q = queues[next(3) as usize];
                        let action = match next(9) {
                            0 | 1 => format!("SELECT pgqueue.pgq_send_batch('{q}', array_fill('{{}}'::jsonb, ARRAY[3]))"),
                            2 => format!("SELECT pgqueue.pgq_send('{q}', '{{}}', delay => '1 hour')"),
                            3 => format!(
                                "SELECT pgqueue.pgq_ack(m.msg_id, m.claim_token) FROM pgqueue.pgq_claim('{q}', 2) m"
                            ),
                            4 => format!(
                                "SELECT pgqueue.pgq_nack(m.msg_id, m.claim_token) FROM pgqueue.pgq_claim('{q}', 1) m"
                            ),
                            5 => format!(
                                "SELECT pgqueue.pgq_fail(m.msg_id, m.claim_token, 'r{round}') FROM pgqueue.pgq_claim('{q}', 1) m"
                            ),
                            6 => format!("SELECT count(*) FROM pgqueue.pgq_claim('{q}', 1, lease => '1 ms')"),
                            7 => format!("SELECT pgqueue.pgq_redrive('{q}')"),
                            _ => format!(
                                "SELECT pgqueue.pgq_delete_dead('{q}', array(SELECT msg_id FROM pgqueue.history
                                   WHERE queue = '{q}' AND outcome = 'dead' ORDER BY msg_id LIMIT 1))"
                            ),
                        };
                        let end = if next(5) == 0 { "ROLLBACK" } else { "COMMIT" };
                        s.batch_execute(&format!("BEGIN; {action}; {end}")).unwrap();
                        steps += 1;
                    }
                    steps
                })
            })
            .collect();
        // Recounts, forced at every tick: in their own transaction, or in a caller's that
        // wrote first (pgrx's SPI would then take a new snapshot for every statement).
        let mut ticks = 0;
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(4) || ticks < 6 {
            if ticks % 2 == 0 {
                c.batch_execute("UPDATE pgqueue.worker_state SET last_prune_at = NULL").unwrap();
                c.batch_execute("SELECT * FROM pgqueue.pgq_tick()").unwrap();
            } else {
                c.batch_execute(
                    "BEGIN; UPDATE pgqueue.worker_state SET last_prune_at = NULL; SELECT * FROM pgqueue.pgq_tick(); COMMIT",
                )
                .unwrap();
            }
            ticks += 1;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let steps: u64 = sessions.into_iter().map(|s| s.join().unwrap()).sum();
        let (shown, exact) = overview_and_exact(&mut c);
        println!("round {round}: {steps} steps, {ticks} ticks; {exact:?}");
        assert!(steps > 100, "the round did too little: {ticks} ticks, {steps} steps");
        assert_eq!(shown, exact, "round {round}, seed {seed}");
    }
}

/// A queue dropped while the worker counts its dead letters: the drop waits for the count
/// (or the count for the drop), and neither fails. A DROP TABLE of a queue's history locks
/// `pgqueue.history` before the queue's own table; the count once took them the other way
/// round, and the two deadlocked. Here a third session holds the queue's table so that the
/// worker's count is caught between the two.
#[test]
fn a_queue_dropped_while_the_worker_counts_its_dead_letters_is_no_deadlock() {
    let _serial = serial();
    let mut c = connect();
    let test_db: String = c.query_one("SELECT current_database()::text", &[]).unwrap().get(0);
    let db = unique_queue("dropdb");
    // No worker in the new database until the queue's table is held.
    common::workers_only_in(&mut c, Some(&test_db));
    c.batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
    let mut owner = common::connect_to(&db);
    owner.batch_execute("CREATE EXTENSION pgqueue").unwrap();
    // No prune at the first tick (it reads every queue's history partitions itself).
    owner.execute("UPDATE pgqueue.worker_state SET last_prune_at = now() + interval '1 hour'", &[]).unwrap();
    let q = unique_queue("dropped");
    owner.execute("SELECT pgqueue.pgq_create_queue($1)", &[&q]).unwrap(); // its dead count is unknown: due
    let table: String = owner.query_one("SELECT pgqueue._history_table($1)", &[&q]).unwrap().get(0);
    let mut holder = common::connect_to(&db);
    holder.batch_execute(&format!("BEGIN; LOCK TABLE ONLY pgqueue.{table} IN ACCESS EXCLUSIVE MODE")).unwrap();
    common::workers_only_in(&mut c, None);
    // Whether a session of this database that `which` selects waits for a lock.
    let waiting = |c: &mut Client, which: &str| -> bool {
        let sql = format!(
            "SELECT EXISTS (SELECT FROM pg_stat_activity
                             WHERE datname = current_database() AND wait_event_type = 'Lock' AND {which})"
        );
        c.query_one(&sql, &[]).unwrap().get(0)
    };
    wait_for("the worker's count waiting for the queue's table", LIMIT, || {
        waiting(&mut owner, "backend_type = 'pgqueue worker'").then_some(())
    });
    let dropper = {
        let (db, q) = (db.clone(), q.clone());
        std::thread::spawn(move || {
            let mut d = common::connect_to(&db);
            d.batch_execute("SET application_name = 'dropper'").unwrap();
            d.execute("SELECT pgqueue.pgq_drop_queue($1)", &[&q]).map(|_| ()).map_err(|e| format!("{e:?}"))
        })
    };
    wait_for("the drop waiting", LIMIT, || waiting(&mut owner, "application_name = 'dropper'").then_some(()));
    holder.batch_execute("ROLLBACK").unwrap();
    assert_eq!(dropper.join().unwrap(), Ok(()), "the drop is no deadlock's victim");
    // The worker's tick ended: its steps are counted.
    let ticks = stat(&mut owner, "ticks");
    wait_for("the worker's next tick", LIMIT, || (stat(&mut owner, "ticks") > ticks + 1).then_some(()));
    assert_eq!(stat(&mut owner, "reconcile_failures"), 0, "the count is no deadlock's victim");
    let gone: bool =
        owner.query_one("SELECT to_regclass('pgqueue.' || quote_ident($1)) IS NULL", &[&table]).unwrap().get(0);
    assert!(gone, "the queue's history is dropped");
    drop((owner, holder));
    c.batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)")).unwrap();
}
