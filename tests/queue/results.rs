//! Progress and results: a holder's progress stored with its renewals, a result kept with
//! each ack (`pgq_ack`, `pgq_ack_claim`), and `pgq_result`, which reads them and, with
//! `wait`, waits for the commit that finishes the message (not the statement, not a
//! rollback), for many waiters at once.

use crate::common::{Claimed, Client, claim_one, new_queue, send, sqlstate, state};
use crate::connect;
use serde_json::{Value, json};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// The tests that hold many connections at once (the test cluster's max_connections is 100,
/// and tests run side by side) take turns.
static MANY_CONNECTIONS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A wait of 50 s that ends before this was woken, not timed out: a functional check, not a
/// latency one (as in tests/waiting.rs).
const WOKEN: Duration = Duration::from_secs(25);

/// (state, result, progress, last_error, finished) as pgq_result reads it; None: no row.
type Report = (String, Option<Value>, Option<Value>, Option<String>, bool);

fn report(c: &mut impl postgres::GenericClient, id: i64, wait: &str) -> Option<Report> {
    c.query_opt(
        "SELECT state, result, progress, last_error, finished_at IS NOT NULL
           FROM pgqueue.pgq_result($1, wait => $2::text::interval)",
        &[&id, &wait],
    )
    .unwrap()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
}

fn renew(c: &mut Client, m: &Claimed, progress: Option<Value>) -> bool {
    c.query_one("SELECT pgqueue.pgq_renew($1::bigint, $2::uuid, progress => $3)", &[&m.id, &m.token, &progress])
        .unwrap()
        .get(0)
}

fn ack(c: &mut impl postgres::GenericClient, m: &Claimed, result: Option<Value>) -> bool {
    c.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid, result => $3)", &[&m.id, &m.token, &result])
        .unwrap()
        .get(0)
}

#[test]
fn progress_and_results_are_kept_and_read_back() {
    let mut c = connect();
    let q = new_queue(&mut c, ", max_attempts => 5");
    let id = send(&mut c, &q, json!({"rows": 3}));
    assert_eq!(report(&mut c, id, "0"), Some(("ready".into(), None, None, None, false)));

    // Progress with renewals: kept until the next report; a lost claim stores nothing.
    let m = claim_one(&mut c, &q, None);
    assert!(renew(&mut c, &m, Some(json!({"done": 1}))));
    assert!(renew(&mut c, &m, None), "a renewal without progress keeps the last");
    assert_eq!(report(&mut c, id, "0"), Some(("claimed".into(), None, Some(json!({"done": 1})), None, false)));
    let stale = Claimed { token: uuid::Uuid::new_v4(), ..m };
    assert!(!renew(&mut c, &stale, Some(json!({"done": 99}))));
    // It stays with the message across a retry, for the next attempt to resume from.
    assert!(
        c.query_one("SELECT pgqueue.pgq_nack($1::bigint, $2::uuid, retry_in => '0')", &[&m.id, &m.token])
            .unwrap()
            .get::<_, bool>(0)
    );
    assert_eq!(report(&mut c, id, "0").unwrap().2, Some(json!({"done": 1})));
    let m = claim_one(&mut c, &q, None);
    assert!(renew(&mut c, &m, Some(json!({"done": 2}))));
    // A result with the ack; a stale ack keeps none.
    assert!(!ack(&mut c, &Claimed { token: uuid::Uuid::new_v4(), ..m }, Some(json!("stale"))));
    assert!(ack(&mut c, &m, Some(json!({"sum": 6}))));
    assert_eq!(
        report(&mut c, id, "0"),
        Some(("completed".into(), Some(json!({"sum": 6})), Some(json!({"done": 2})), None, true))
    );
    let (result, progress): (Option<Value>, Option<Value>) = {
        let r = c.query_one("SELECT result, progress FROM pgqueue.jobs WHERE msg_id = $1", &[&id]).unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((result, progress), (Some(json!({"sum": 6})), Some(json!({"done": 2}))), "pgqueue.jobs shows them");

    // Many at once: results beside the ids (NULL: none), in pgq_ack and pgq_ack_claim.
    let ids: Vec<i64> = (0..4).map(|n| send(&mut c, &q, json!({ "n": n }))).collect();
    let [a, b, d, e] = [0; 4].map(|_| claim_one(&mut c, &q, None));
    let acked: Vec<i64> = c
        .query(
            "SELECT * FROM pgqueue.pgq_ack($1::bigint[], $2::uuid[], results => ARRAY['1', NULL]::jsonb[])",
            &[&vec![a.id, b.id], &vec![a.token, b.token]],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(acked, vec![a.id, b.id]);
    let rows: Vec<(String, i64)> = c
        .query(
            "SELECT kind, msg_id FROM pgqueue.pgq_ack_claim($1, $2::bigint[], $3::uuid[],
                                                         ack_results => ARRAY['{\"ok\": true}', '\"gone\"']::jsonb[])",
            &[&q, &vec![d.id, e.id + 1000], &vec![d.token, e.token]],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(rows, vec![("not_acked".into(), e.id + 1000)]);
    assert_eq!(ids, vec![a.id, b.id, d.id, e.id]);
    let result = |c: &mut Client, id: i64| report(c, id, "0").unwrap().1;
    assert_eq!(
        [a.id, b.id, d.id, e.id].map(|id| result(&mut c, id)),
        [Some(json!(1)), None, Some(json!({"ok": true})), None]
    );
    assert_eq!(state(&mut c, e.id).as_deref(), Some("claimed"));

    // A cancelled message keeps no result, whatever its holder acked with.
    assert!(c.query_one("SELECT pgqueue.pgq_cancel($1::bigint, 'stop')", &[&e.id]).unwrap().get::<_, bool>(0));
    assert!(ack(&mut c, &e, Some(json!("late"))));
    assert_eq!(report(&mut c, e.id, "0"), Some(("cancelled".into(), None, None, Some("stop".into()), true)));

    // Unknown, or of another queue: no row. (Not -1: other files' tests write history rows
    // with negative ids.)
    assert_eq!(report(&mut c, i64::MAX, "0"), None);
    let other = new_queue(&mut c, "");
    let n: i64 =
        c.query_one("SELECT count(*) FROM pgqueue.pgq_result($1, queue => $2)", &[&id, &other]).unwrap().get(0);
    assert_eq!(n, 0);
    let n: i64 = c.query_one("SELECT count(*) FROM pgqueue.pgq_result($1, queue => $2)", &[&id, &q]).unwrap().get(0);
    assert_eq!(n, 1);
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send(&mut c, &q, json!({}));
    let m = claim_one(&mut c, &q, None);
    let (id, token) = (m.id, m.token);
    assert_eq!(run(&mut c, "SELECT * FROM pgqueue.pgq_result(NULL)"), "22004");
    assert_eq!(run(&mut c, &format!("SELECT * FROM pgqueue.pgq_result({id}, wait => NULL)")), "22004");
    assert_eq!(run(&mut c, &format!("SELECT * FROM pgqueue.pgq_result({id}, wait => '-1 s')")), "22023");
    assert_eq!(run(&mut c, &format!("SELECT * FROM pgqueue.pgq_result({id}, wait => '2 minutes')")), "22023");
    assert_eq!(run(&mut c, &format!("SELECT * FROM pgqueue.pgq_result({id}, queue => 'no_such_queue')")), "42704");
    assert_eq!(
        run(
            &mut c,
            &format!(
                "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT * FROM pgqueue.pgq_result({id}, wait => '1 s'); COMMIT"
            )
        ),
        "0A000"
    );
    c.batch_execute("ROLLBACK").unwrap();
    let ack = |results: &str| {
        format!("SELECT pgqueue.pgq_ack(ARRAY[{id}]::bigint[], ARRAY['{token}']::uuid[], results => {results})")
    };
    assert_eq!(run(&mut c, &ack("ARRAY['1', '2']::jsonb[]")), "22023", "two results for one id");
    assert_eq!(run(&mut c, &ack("ARRAY[['1']]::jsonb[]")), "22023");
    assert_eq!(
        run(
            &mut c,
            &format!(
                "SELECT * FROM pgqueue.pgq_ack_claim('{q}', ARRAY[{id}]::bigint[], ARRAY['{token}']::uuid[],
                                                 ack_results => '{{}}'::jsonb[])"
            )
        ),
        "22023"
    );
    assert_eq!(
        run(
            &mut c,
            &format!(
                "SELECT pgqueue.pgq_renew(ARRAY[{id}]::bigint[], ARRAY['{token}']::uuid[], progress => ARRAY['1', '2']::jsonb[])"
            )
        ),
        "22023"
    );
    // Larger than pgqueue.max_payload_bytes: 54000.
    let big = "jsonb_build_object('x', repeat('x', 2000))";
    c.batch_execute("SET pgqueue.max_payload_bytes = 1000").unwrap();
    assert_eq!(run(&mut c, &format!("SELECT pgqueue.pgq_ack({id}, '{token}', result => {big})")), "54000");
    assert_eq!(run(&mut c, &format!("SELECT pgqueue.pgq_renew({id}, '{token}', progress => {big})")), "54000");
    assert_eq!(
        run(
            &mut c,
            &format!(
                "SELECT * FROM pgqueue.pgq_ack_claim('{q}', ARRAY[{id}]::bigint[], ARRAY['{token}']::uuid[],
                                                 ack_results => ARRAY[{big}])"
            )
        ),
        "54000"
    );
    c.batch_execute("RESET pgqueue.max_payload_bytes").unwrap();
    // Nothing changed: still held, with no progress.
    assert_eq!(report(&mut c, id, "0"), Some(("claimed".into(), None, None, None, false)));
    assert!(renew(&mut c, &m, None));
}

fn run(c: &mut Client, sql: &str) -> String {
    sqlstate(c.batch_execute(sql))
}

/// A connection named `tag` (application_name), to count its waits in pg_stat_activity.
fn tagged(tag: &str) -> Client {
    let mut c = crate::common::connect();
    c.batch_execute(&format!("SET application_name = '{tag}'")).unwrap();
    c
}

/// pgq_result(id, wait => 50 s) on a connection named `tag`, in a thread: what it read, and
/// when.
fn waiter(tag: &str, id: i64) -> mpsc::Receiver<(Option<Report>, Duration)> {
    let (tx, rx) = mpsc::channel();
    let mut c = tagged(tag);
    thread::spawn(move || {
        let start = Instant::now();
        let read = report(&mut c, id, "50 s");
        let _ = tx.send((read, start.elapsed()));
    });
    rx
}

/// Until `n` connections named `tag` sleep in pg_stat_activity (waiting inside pgq_result).
fn until_waiting(c: &mut Client, tag: &str, n: i64) {
    crate::common::wait_for("the waiters to sleep", Duration::from_secs(30), || {
        let sleeping: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Extension'",
                &[&tag],
            )
            .unwrap()
            .get(0);
        (sleeping >= n).then_some(())
    });
}

#[test]
fn a_waiting_result_is_woken_by_the_commit_that_finishes_it() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let id = send(&mut c, &q, json!({}));
    let m = claim_one(&mut c, &q, None);
    let read = waiter("woken_by_commit", id);
    until_waiting(&mut c, "woken_by_commit", 1);

    // The ack's statement does not wake it, nor does its rollback; its commit does.
    let mut tx = c.transaction().unwrap();
    assert!(ack(&mut tx, &m, Some(json!({"answer": 42}))));
    thread::sleep(Duration::from_millis(300));
    tx.rollback().unwrap();
    thread::sleep(Duration::from_millis(300));
    assert!(read.try_recv().is_err(), "still waiting: nothing finished");
    let mut tx = c.transaction().unwrap();
    assert!(ack(&mut tx, &m, Some(json!({"answer": 42}))));
    thread::sleep(Duration::from_millis(300));
    assert!(read.try_recv().is_err(), "still waiting: not committed");
    tx.commit().unwrap();
    let (got, elapsed) = read.recv().unwrap();
    assert_eq!(got, Some(("completed".into(), Some(json!({"answer": 42})), None, None, true)));
    assert!(elapsed < WOKEN, "woken, not timed out ({elapsed:?})");

    // Already finished: at once. Still running at the deadline: read as it is.
    assert_eq!(report(&mut c, id, "50 s").unwrap().0, "completed");
    let id = send(&mut c, &q, json!({}));
    let start = Instant::now();
    assert_eq!(report(&mut c, id, "200 ms").unwrap().0, "ready");
    assert!(start.elapsed() >= Duration::from_millis(200));
}

#[test]
fn every_way_a_message_finishes_wakes_its_waiters() {
    let _turn = MANY_CONNECTIONS.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = connect();
    let q = new_queue(&mut c, ", max_attempts => 1");
    // 64 waiters, on 16 messages (four each): acked in one transaction, in a batch, failed,
    // nacked on the last attempt, cancelled waiting, cancelled running, re-armed to dead.
    let ids: Vec<i64> = (0..16).map(|n| send(&mut c, &q, json!({ "n": n }))).collect();
    let readers: Vec<(i64, mpsc::Receiver<_>)> =
        ids.iter().flat_map(|&id| (0..4).map(move |_| (id, waiter("every_way", id)))).collect();
    until_waiting(&mut c, "every_way", 64);
    let claims: Vec<Claimed> = crate::common::claim(&mut c, &q, 15, Some("1 hour")).into_iter().collect();
    assert_eq!(claims.len(), 15);
    // ids[15] stays ready: cancelled while it waits.
    let mut tx = c.transaction().unwrap();
    for m in &claims[0..4] {
        assert!(ack(&mut tx, m, Some(json!(m.id))));
    }
    tx.commit().unwrap();
    let batch: Vec<i64> = claims[4..8].iter().map(|m| m.id).collect();
    let tokens: Vec<uuid::Uuid> = claims[4..8].iter().map(|m| m.token).collect();
    c.query("SELECT pgqueue.pgq_ack($1::bigint[], $2::uuid[])", &[&batch, &tokens]).unwrap();
    for m in &claims[8..10] {
        c.execute("SELECT pgqueue.pgq_fail($1::bigint, $2::uuid)", &[&m.id, &m.token]).unwrap();
    }
    for m in &claims[10..12] {
        c.execute("SELECT pgqueue.pgq_nack($1::bigint, $2::uuid)", &[&m.id, &m.token]).unwrap();
    }
    c.execute("SELECT pgqueue.pgq_cancel(ARRAY[$1, $2]::bigint[])", &[&ids[15], &claims[12].id]).unwrap();
    c.execute("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&claims[12].id, &claims[12].token]).unwrap();
    // The last two: their leases end and pgq_rearm dead-letters them (last attempt).
    c.execute(
        "UPDATE pgqueue.message_rows SET lease_expires_at = now() - interval '1 s' WHERE msg_id = ANY ($1)",
        &[&vec![claims[13].id, claims[14].id]],
    )
    .unwrap();
    // This queue only: the database is shared with tests that count their own re-arms.
    c.execute("SELECT pgqueue.pgq_rearm(queue => $1)", &[&q]).unwrap();
    for (id, read) in readers {
        let (got, elapsed) = read.recv().unwrap();
        let (state, .., finished) = got.expect("a row");
        assert!(finished, "{id}: {state}");
        assert!(elapsed < WOKEN, "{id} woken, not timed out ({elapsed:?})");
    }
}

#[test]
fn a_waiter_that_is_cancelled_or_terminated_leaves_no_trace() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let id = send(&mut c, &q, json!({}));
    // statement_timeout ends the wait with its error; the same session waits again after.
    let mut w = crate::common::connect();
    w.batch_execute("SET statement_timeout = '300ms'").unwrap();
    assert_eq!(sqlstate(w.query("SELECT * FROM pgqueue.pgq_result($1, wait => '10 s')", &[&id])), "57014");
    w.batch_execute("RESET statement_timeout").unwrap();
    let pid: i32 = w.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    w.batch_execute("SET application_name = 'terminated'").unwrap();
    let read = {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let _ = tx.send(w.query("SELECT * FROM pgqueue.pgq_result($1, wait => '50 s')", &[&id]).map(|_| ()));
        });
        rx
    };
    until_waiting(&mut c, "terminated", 1);
    // A terminated waiter: its slot is free again, and the finish still wakes the others.
    let other = waiter("survivor", id);
    until_waiting(&mut c, "survivor", 1);
    c.execute("SELECT pg_terminate_backend($1)", &[&pid]).unwrap();
    assert!(read.recv().unwrap().is_err(), "the terminated waiter's call fails");
    let m = claim_one(&mut c, &q, None);
    assert!(ack(&mut c, &m, None));
    let (got, elapsed) = other.recv().unwrap();
    assert_eq!(got.unwrap().0, "completed");
    assert!(elapsed < WOKEN);
    // The terminated process's slot was left: no waiter is counted once all are gone.
    crate::common::wait_for("no waiter left", Duration::from_secs(30), || {
        let n: i64 = c.query_one("SELECT pgqueue._outcome_waiters()", &[]).unwrap().get(0);
        (n == 0).then_some(())
    });
}

/// Randomized, seeded (`PGQUEUE_RESULT_RACE_SEED` replays a run): 32 waiters on 24 messages
/// (some on the same one, some arriving after it finished) while 4 finishers claim and finish
/// them every way there is, in transactions that roll back whole or to a savepoint, and nack
/// some for another attempt first. Checked against what committed: every waiter returns its
/// message finished, as history has it, woken rather than timed out, and never before the
/// commit that finished it began.
#[test]
fn waiters_racing_finishes_rollbacks_and_retries_see_each_commit() {
    let _turn = MANY_CONNECTIONS.lock().unwrap_or_else(|e| e.into_inner());
    use crate::common::rng::{Rng, seed_from};
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    let seed = seed_from("PGQUEUE_RESULT_RACE_SEED", "result race");
    let mut c = connect();
    let q = new_queue(&mut c, ", max_attempts => 3, lease => '1 hour'");
    let ids: Vec<i64> = (0..24).map(|n| send(&mut c, &q, json!({ "n": n }))).collect();
    let base = Instant::now();
    // msg_id -> when the COMMIT that finished it was sent (µs since base).
    let finishing: Arc<Mutex<HashMap<i64, u128>>> = Arc::default();
    let waiters: Vec<_> = (0..32u64)
        .map(|w| {
            let mut rng = Rng::new(seed, w);
            let id = ids[rng.below(ids.len() as u64) as usize];
            let late = rng.chance(20);
            let mut r = crate::common::connect();
            thread::spawn(move || {
                if late {
                    thread::sleep(Duration::from_millis(rng.range(0, 1500)));
                }
                let start = Instant::now();
                let got = report(&mut r, id, "50 s");
                (id, got, start.elapsed(), base.elapsed().as_micros())
            })
        })
        .collect();
    let finishers: Vec<_> = (0..4u64)
        .map(|f| {
            let (q, finishing) = (q.clone(), finishing.clone());
            let mut c = crate::common::connect();
            thread::spawn(move || {
                let mut rng = Rng::new(seed, 1000 + f);
                loop {
                    let claimed = crate::common::claim(&mut c, &q, rng.range(1, 3) as i32, Some("1 hour"));
                    if claimed.is_empty() {
                        let left: i64 = c
                            .query_one("SELECT count(*) FROM pgqueue.messages WHERE queue = $1", &[&q])
                            .unwrap()
                            .get(0);
                        if left == 0 {
                            return;
                        }
                        thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                    // Until it commits: a transaction rolled back leaves the claims held.
                    loop {
                        thread::sleep(Duration::from_millis(rng.range(0, 30)));
                        let mut tx = c.transaction().unwrap();
                        let mut finished = vec![];
                        for m in &claimed {
                            if rng.chance(25) {
                                // A savepoint that finishes it, rolled back: nothing happened.
                                let mut sp = tx.transaction().unwrap();
                                assert!(ack(&mut sp, m, Some(json!("undone"))));
                                sp.rollback().unwrap();
                            }
                            let sql = match rng.below(5) {
                                0 | 1 => "SELECT pgqueue.pgq_ack($1::bigint, $2::uuid, result => to_jsonb($1::bigint))",
                                2 => "SELECT pgqueue.pgq_fail($1::bigint, $2::uuid)",
                                3 => "SELECT pgqueue.pgq_nack($1::bigint, $2::uuid, retry_in => '0')",
                                _ => "SELECT pgqueue.pgq_cancel($1::bigint) AND pgqueue.pgq_ack($1::bigint, $2::uuid)",
                            };
                            assert!(tx.query_one(sql, &[&m.id, &m.token]).unwrap().get::<_, bool>(0), "{sql}");
                            if !(sql.contains("pgq_nack") && m.attempt < 3) {
                                finished.push(m.id);
                            }
                        }
                        thread::sleep(Duration::from_millis(rng.range(0, 30)));
                        if rng.chance(20) {
                            tx.rollback().unwrap();
                            continue;
                        }
                        let mut map = finishing.lock().unwrap();
                        let at = base.elapsed().as_micros();
                        tx.commit().unwrap();
                        for id in finished {
                            map.insert(id, at);
                        }
                        break;
                    }
                }
            })
        })
        .collect();
    for f in finishers {
        f.join().unwrap();
    }
    let finishing = finishing.lock().unwrap().clone();
    for w in waiters {
        let (id, got, elapsed, returned) = w.join().unwrap();
        let (state, result, .., finished) = got.unwrap_or_else(|| panic!("seed {seed}: {id} has no row"));
        assert!(finished, "seed {seed}: {id} came back {state}");
        assert!(elapsed < WOKEN, "seed {seed}: {id} woken, not timed out ({elapsed:?})");
        assert!(returned >= finishing[&id], "seed {seed}: {id} returned before its finishing commit");
        let kept: String = c.query_one("SELECT outcome FROM pgqueue.history WHERE msg_id = $1", &[&id]).unwrap().get(0);
        assert_eq!(state, kept, "seed {seed}: {id}");
        if state == "completed" {
            assert_eq!(result, Some(json!(id)), "seed {seed}: the committed ack's result, not the undone one");
        }
    }
}

/// A transaction that finishes more messages than a commit keeps ids of (10,000) wakes every
/// waiter instead: each reads its message again.
#[test]
fn a_commit_that_finishes_very_many_messages_wakes_its_waiters() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    c.execute("SELECT pgqueue.pgq_send_batch($1, array_fill('{}'::jsonb, ARRAY[10000]))", &[&q]).unwrap();
    send(&mut c, &q, json!({}));
    // Claims take at most 1,000 at a time.
    let claimed: Vec<Claimed> = (0..11).flat_map(|_| crate::common::claim(&mut c, &q, 1000, Some("1 hour"))).collect();
    assert_eq!(claimed.len(), 10_001);
    let read = waiter("very_many", claimed[10_000].id);
    until_waiting(&mut c, "very_many", 1);
    let (ids, tokens): (Vec<i64>, Vec<uuid::Uuid>) = claimed.iter().map(|m| (m.id, m.token)).unzip();
    let acked = c.query("SELECT pgqueue.pgq_ack($1::bigint[], $2::uuid[])", &[&ids, &tokens]).unwrap();
    assert_eq!(acked.len(), 10_001);
    let (got, elapsed) = read.recv().unwrap();
    assert_eq!(got.unwrap().0, "completed");
    assert!(elapsed < WOKEN, "woken, not timed out ({elapsed:?})");
}
