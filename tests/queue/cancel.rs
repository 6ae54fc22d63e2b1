//! Cancel (`pgq_cancel`, `pgq_cancel_key`): a waiting message finishes as cancelled at once;
//! a claimed one when its holder stops (ack, nack, fail) or its lease ends, and its renewals
//! tell the holder to stop. The unique key is free once cancelled.

use crate::common::{
    Client, Finished, ack, as_role, claim, claim_one, history_of, message, new_queue, outcome, send, sqlstate, state,
};
use crate::connect;
use serde_json::json;
use std::time::Duration;
use uuid::Uuid;

fn cancel(c: &mut Client, ids: &[i64], reason: Option<&str>) -> Vec<i64> {
    c.query("SELECT * FROM pgqueue.pgq_cancel($1::bigint[], reason => $2)", &[&ids, &reason])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

fn cancel_one(c: &mut Client, id: i64) -> bool {
    c.query_one("SELECT pgqueue.pgq_cancel($1::bigint)", &[&id]).unwrap().get(0)
}

fn requested(c: &mut Client, id: i64) -> bool {
    c.query_one("SELECT cancel_requested_at IS NOT NULL FROM pgqueue.messages WHERE msg_id = $1", &[&id])
        .unwrap()
        .get(0)
}

fn renew(c: &mut Client, id: i64, token: Uuid) -> bool {
    c.query_one("SELECT pgqueue.pgq_renew($1::bigint, $2::uuid)", &[&id, &token]).unwrap().get(0)
}

fn only(history: Vec<Finished>) -> Finished {
    assert_eq!(history.len(), 1, "{history:?}");
    history.into_iter().next().unwrap()
}

#[test]
fn waiting_messages_are_cancelled_at_once() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let ready = send(&mut c, &q, json!({"n": 1}));
    let delayed: i64 = c.query_one("SELECT pgqueue.pgq_send($1, '{}', delay => '1 hour')", &[&q]).unwrap().get(0);
    let kept = send(&mut c, &q, json!({"n": 2}));

    assert_eq!(cancel(&mut c, &[delayed, ready, -5], Some("not needed")), vec![ready, delayed]);
    for id in [ready, delayed] {
        assert_eq!(state(&mut c, id), None);
        assert_eq!(only(history_of(&mut c, id)).result(), ("cancelled", 0, Some("not needed")));
    }
    assert_eq!(cancel(&mut c, &[ready, delayed], None), Vec::<i64>::new(), "finished: nothing changes");
    assert!(!cancel_one(&mut c, ready));
    let next = claim(&mut c, &q, 10, None);
    assert_eq!(next.iter().map(|m| m.id).collect::<Vec<_>>(), vec![kept], "only the message left");
    // Cancelled rolled back: nothing happened.
    let mut tx = c.transaction().unwrap();
    let other = send(&mut tx, &q, json!({}));
    tx.commit().unwrap();
    let mut tx = c.transaction().unwrap();
    assert!(tx.query_one("SELECT pgqueue.pgq_cancel($1::bigint)", &[&other]).unwrap().get::<_, bool>(0));
    tx.rollback().unwrap();
    assert_eq!(state(&mut c, other).as_deref(), Some("ready"));
    assert_eq!(outcome(&mut c, other), None);
}

#[test]
fn a_claimed_message_is_cancelled_when_its_holder_stops() {
    let mut c = connect();
    let q = new_queue(&mut c, ", max_attempts => 5");
    for _ in 0..4 {
        send(&mut c, &q, json!({}));
    }
    let [by_nack, by_fail, by_ack, by_lease] = [0; 4].map(|_| claim_one(&mut c, &q, None));
    for m in [by_nack, by_fail, by_ack, by_lease] {
        assert!(renew(&mut c, m.id, m.token), "held");
    }
    let ids = [by_nack.id, by_fail.id, by_ack.id, by_lease.id];
    assert_eq!(cancel(&mut c, &ids, Some("customer left")), ids.to_vec());
    assert_eq!(cancel(&mut c, &ids, None), Vec::<i64>::new(), "requested already: nothing changes");
    for m in [by_nack, by_fail, by_ack, by_lease] {
        assert_eq!(state(&mut c, m.id).as_deref(), Some("claimed"), "still held");
        assert!(requested(&mut c, m.id));
        assert!(!renew(&mut c, m.id, m.token), "the renewal leaves it out: the holder is to stop");
    }

    // A nack does not retry it, a fail does not dead-letter it: both record it cancelled.
    let nacked: bool = c
        .query_one("SELECT pgqueue.pgq_nack($1, $2, error => 'stopped')", &[&by_nack.id, &by_nack.token])
        .unwrap()
        .get(0);
    assert!(nacked);
    assert_eq!(only(history_of(&mut c, by_nack.id)).result(), ("cancelled", 1, Some("customer left")));
    let failed: bool =
        c.query_one("SELECT pgqueue.pgq_fail($1, $2, 'stopped')", &[&by_fail.id, &by_fail.token]).unwrap().get(0);
    assert!(failed);
    assert_eq!(only(history_of(&mut c, by_fail.id)).result(), ("cancelled", 1, Some("customer left")));
    // An ack too: the cancel came first.
    assert!(ack(&mut c, &by_ack));
    assert_eq!(only(history_of(&mut c, by_ack.id)).result(), ("cancelled", 1, Some("customer left")));
    // A stale token changes nothing, cancelled or not.
    let stale: bool = c.query_one("SELECT pgqueue.pgq_fail($1, $2)", &[&by_lease.id, &Uuid::new_v4()]).unwrap().get(0);
    assert!(!stale);

    // The holder never comes back: at its lease's end it is cancelled, not re-armed.
    c.execute(
        "UPDATE pgqueue.message_rows SET lease_expires_at = now() - interval '1 s' WHERE msg_id = $1",
        &[&by_lease.id],
    )
    .unwrap();
    let (rearmed, dead): (i64, i64) = {
        let r = c.query_one("SELECT * FROM pgqueue.pgq_rearm(queue => $1)", &[&q]).unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((rearmed, dead), (0, 0), "neither re-armed nor dead-lettered");
    assert_eq!(state(&mut c, by_lease.id), None);
    assert_eq!(only(history_of(&mut c, by_lease.id)).result(), ("cancelled", 1, Some("customer left")));
    assert!(claim(&mut c, &q, 10, None).is_empty(), "nothing came back");
}

/// A cancel waits for a claim under way and acts on what it committed: here the claim, so
/// the message is marked, not moved; the claim's holder keeps a claim it must stop.
#[test]
fn a_cancel_waits_for_a_claim_under_way() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let id = send(&mut c, &q, json!({}));
    let mut claimer = crate::common::connect();
    claimer.batch_execute("BEGIN").unwrap();
    let m = claim_one(&mut claimer, &q, None);
    let canceller = std::thread::spawn(move || {
        let mut c = crate::common::connect();
        cancel_one(&mut c, id)
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!canceller.is_finished(), "the cancel waits for the claim's lock");
    claimer.batch_execute("COMMIT").unwrap();
    assert!(canceller.join().unwrap());
    assert_eq!(state(&mut c, id).as_deref(), Some("claimed"));
    assert!(requested(&mut c, id));
    assert!(!renew(&mut c, m.id, m.token));
}

#[test]
fn a_cancelled_message_frees_its_unique_key() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let send_key = |c: &mut Client, key: &str| -> i64 {
        c.query_one("SELECT pgqueue.pgq_send($1, '{}', dedup_key => $2, dedup_for => '1 hour')", &[&q, &key])
            .unwrap()
            .get(0)
    };
    let cancel_key = |c: &mut Client, key: Option<&str>| -> bool {
        c.query_one("SELECT pgqueue.pgq_cancel_key($1, $2, reason => 'by key')", &[&q, &key]).unwrap().get(0)
    };
    // Waiting: cancelled at once, and the key free although finishing would hold it an hour.
    let first = send_key(&mut c, "invoice-1");
    assert!(cancel_key(&mut c, Some("invoice-1")));
    assert_eq!(only(history_of(&mut c, first)).result(), ("cancelled", 0, Some("by key")));
    let second = send_key(&mut c, "invoice-1");
    assert_ne!(second, first, "a new message takes the key");
    assert!(!cancel_key(&mut c, Some("no-such-key")));

    // Claimed: the key stays taken until the holder stops.
    let m = claim_one(&mut c, &q, None);
    assert_eq!(m.id, second);
    assert!(cancel_key(&mut c, Some("invoice-1")));
    assert!(!cancel_key(&mut c, Some("invoice-1")), "requested already");
    assert_eq!(send_key(&mut c, "invoice-1"), second, "still held while it runs");
    let failed: bool = c.query_one("SELECT pgqueue.pgq_fail($1, $2)", &[&m.id, &m.token]).unwrap().get(0);
    assert!(failed);
    assert_eq!(outcome(&mut c, second).as_deref(), Some("cancelled"));
    let third = send_key(&mut c, "invoice-1");
    assert!(third != second && third != first, "free once cancelled");
    assert!(message(&mut c, third).is_some());
}

#[test]
fn bad_cancels_are_refused_and_change_nothing() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let id = send(&mut c, &q, json!({}));
    for (sql, code) in [
        ("SELECT pgqueue.pgq_cancel(NULL::bigint[])", "22004"),
        ("SELECT pgqueue.pgq_cancel(NULL::bigint)", "22004"),
        ("SELECT pgqueue.pgq_cancel(ARRAY[$1, NULL]::bigint[])", "22004"),
        ("SELECT pgqueue.pgq_cancel(ARRAY[[$1]]::bigint[])", "22023"),
        ("SELECT pgqueue.pgq_cancel(ARRAY[$1]::bigint[], queue => 'no_such_queue')", "42704"),
        ("SELECT pgqueue.pgq_cancel($1::bigint, queue => 'Bad Name')", "22023"),
        ("SELECT pgqueue.pgq_cancel_key('no_such_queue', $1::bigint::text)", "42704"),
        ("SELECT pgqueue.pgq_cancel_key(NULL, $1::bigint::text)", "22004"),
    ] {
        let params: Vec<&(dyn postgres::types::ToSql + Sync)> = if sql.contains("$1") { vec![&id] } else { vec![] };
        assert_eq!(sqlstate(c.query(sql, &params)), code, "{sql}");
    }
    assert_eq!(sqlstate(c.query("SELECT pgqueue.pgq_cancel_key($1, NULL)", &[&q])), "22004");
    assert_eq!(state(&mut c, id).as_deref(), Some("ready"), "nothing changed");
    // Another queue's message is left, as with pgq_ack.
    let other = new_queue(&mut c, "");
    let left: bool = c.query_one("SELECT pgqueue.pgq_cancel($1::bigint, queue => $2)", &[&id, &other]).unwrap().get(0);
    assert!(!left);
    assert_eq!(state(&mut c, id).as_deref(), Some("ready"));
}

/// Producers (and admins) cancel; consumers do not.
#[test]
fn producers_cancel_and_consumers_do_not() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let (a, b) = (send(&mut c, &q, json!({})), send(&mut c, &q, json!({})));
    let user = crate::common::unique_queue("canceller");
    c.batch_execute(&format!("CREATE ROLE {user} LOGIN")).unwrap();
    let as_consumer = as_role(&mut c, &user, "pgqueue_consumer", &format!("SELECT pgqueue.pgq_cancel({a}::bigint)"));
    assert_eq!(sqlstate(as_consumer), "42501");
    assert_eq!(state(&mut c, a).as_deref(), Some("ready"));
    as_role(&mut c, &user, "pgqueue_producer", &format!("SELECT pgqueue.pgq_cancel(ARRAY[{a}, {b}]::bigint[])"))
        .unwrap();
    assert_eq!(outcome(&mut c, a).as_deref(), Some("cancelled"));
    assert_eq!(outcome(&mut c, b).as_deref(), Some("cancelled"));
    c.batch_execute(&format!("DROP ROLE {user}")).unwrap();
}

/// Randomized, over many connections: consumers claim (pgq_claim or pgq_ack_claim), renew,
/// ack, nack, fail or abandon their claims, a rearmer ends abandoned leases, and cancellers
/// cancel random messages (by id, in batches, and by key) all along. However they
/// interleave: every message finishes exactly once; each message a cancel returned finishes
/// as cancelled, and no claim that started after that cancel returned gets it; nothing a
/// cancel did not return is cancelled; and no cancelled message keeps its unique key.
#[test]
fn cancels_racing_claims_acks_nacks_and_lease_ends_lose_nothing() {
    use crate::common::Rng;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    const MESSAGES: usize = 2_000;
    const CONSUMERS: u64 = 8;
    const CANCELLERS: u64 = 3;
    let seed = crate::common::rng::seed_from("PGQUEUE_CANCEL_RACE_SEED", "cancel race");
    let mut c = connect();
    let q = new_queue(&mut c, ", lease => '300 ms', max_attempts => 4");
    // Every third message has a unique key, kept an hour after it finishes (unless cancelled).
    let mut ids = Vec::with_capacity(MESSAGES);
    let mut keys = HashMap::new();
    for i in 0..MESSAGES {
        let key = (i % 3 == 0).then(|| format!("k{i}"));
        let id: i64 = c
            .query_one(
                "SELECT pgqueue.pgq_send($1, jsonb_build_object('i', $2::int), dedup_key => $3, dedup_for => '1 hour')",
                &[&q, &(i as i32), &key],
            )
            .unwrap()
            .get(0);
        ids.push(id);
        if let Some(key) = key {
            keys.insert(id, key);
        }
    }
    let (ids, keys) = (Arc::new(ids), Arc::new(keys));

    // A clock of events: a claim takes its tick before it starts, a cancel after it returns.
    let clock = Arc::new(AtomicU64::new(0));
    let claims = Arc::new(Mutex::new(Vec::<(i64, u64)>::new()));
    let cancels = Arc::new(Mutex::new(HashMap::<i64, u64>::new()));
    let done = Arc::new(AtomicBool::new(false));

    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|me| {
            let (q, clock, claims, done) = (q.clone(), clock.clone(), claims.clone(), done.clone());
            std::thread::spawn(move || {
                let mut c = crate::common::connect();
                let mut rng = Rng::new(seed, me);
                let mut to_ack: (Vec<i64>, Vec<Uuid>) = (vec![], vec![]);
                while !done.load(Ordering::SeqCst) {
                    let qty = rng.range(1, 4) as i32;
                    let tick = clock.fetch_add(1, Ordering::SeqCst);
                    let rows = if rng.chance(50) {
                        let acks = std::mem::take(&mut to_ack);
                        c.query(
                            // An ack refused (cancelled, or its lease ended meanwhile) comes back as
                            // a not_acked row without a token; the final count accounts for it.
                            "SELECT msg_id, claim_token FROM pgqueue.pgq_ack_claim($1, $2, $3, qty => $4)
                              WHERE kind = 'claimed'",
                            &[&q, &acks.0, &acks.1, &qty],
                        )
                    } else {
                        c.query("SELECT msg_id, claim_token FROM pgqueue.pgq_claim($1, $2)", &[&q, &qty])
                    }
                    .unwrap();
                    if rows.is_empty() {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    for r in &rows {
                        let (id, token): (i64, Uuid) = (r.get(0), r.get(1));
                        claims.lock().unwrap().push((id, tick));
                        if rng.chance(30) {
                            renew(&mut c, id, token); // false: cancelled (or lost); the finish below is fenced
                        }
                        match rng.below(100) {
                            0..=39 => {
                                to_ack.0.push(id);
                                to_ack.1.push(token);
                            }
                            40..=59 => {
                                c.execute("SELECT pgqueue.pgq_nack($1, $2, retry_in => '0')", &[&id, &token]).unwrap();
                            }
                            60..=69 => {
                                c.execute("SELECT pgqueue.pgq_fail($1, $2)", &[&id, &token]).unwrap();
                            }
                            70..=89 => {
                                c.execute("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&id, &token]).unwrap();
                            }
                            _ => {} // abandoned: its lease ends
                        }
                    }
                }
                c.execute("SELECT pgqueue.pgq_ack($1::bigint[], $2::uuid[])", &[&to_ack.0, &to_ack.1]).unwrap();
            })
        })
        .collect();
    let cancellers: Vec<_> = (0..CANCELLERS)
        .map(|me| {
            let (ids, keys, q, clock, cancels, done) =
                (ids.clone(), keys.clone(), q.clone(), clock.clone(), cancels.clone(), done.clone());
            std::thread::spawn(move || {
                let mut c = crate::common::connect();
                let mut rng = Rng::new(seed, 100 + me);
                // About one message in five is cancelled, spread over the run.
                for _ in 0..MESSAGES / 5 / CANCELLERS as usize / 2 {
                    if done.load(Ordering::SeqCst) {
                        break;
                    }
                    let picked: Vec<i64> =
                        (0..rng.range(1, 3)).map(|_| ids[rng.below(MESSAGES as u64) as usize]).collect();
                    let got: Vec<(i64, u64)> = if rng.chance(25) && keys.contains_key(&picked[0]) {
                        let cancelled: bool = c
                            .query_one("SELECT pgqueue.pgq_cancel_key($1, $2)", &[&q, &keys[&picked[0]]])
                            .unwrap()
                            .get(0);
                        let tick = clock.fetch_add(1, Ordering::SeqCst);
                        if cancelled { vec![(picked[0], tick)] } else { vec![] }
                    } else {
                        let got = cancel(&mut c, &picked, Some("racing"));
                        let tick = clock.fetch_add(1, Ordering::SeqCst);
                        got.into_iter().map(|id| (id, tick)).collect()
                    };
                    let mut cancels = cancels.lock().unwrap();
                    for (id, tick) in got {
                        assert!(cancels.insert(id, tick).is_none(), "message {id} cancelled twice");
                    }
                    drop(cancels);
                    std::thread::sleep(Duration::from_millis(rng.range(1, 10)));
                }
            })
        })
        .collect();
    let rearmer = {
        let (q, done) = (q.clone(), done.clone());
        std::thread::spawn(move || {
            let mut c = crate::common::connect();
            while !done.load(Ordering::SeqCst) {
                c.execute("SELECT pgqueue.pgq_rearm(queue => $1)", &[&q]).unwrap();
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };

    // Until every message has finished (abandoned leases end within a second of the last).
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let left: i64 = c.query_one("SELECT count(*) FROM pgqueue.messages WHERE queue = $1", &[&q]).unwrap().get(0);
        if left == 0 {
            break;
        }
        if std::time::Instant::now() >= deadline {
            // What is left, and whether a claim gets it now: enough to tell a lost wake-up
            // from a message no claim can see.
            let rows: Vec<String> = c
                .query("SELECT to_jsonb(m)::text FROM pgqueue.messages m WHERE queue = $1", &[&q])
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            let claimed: Vec<i64> = c
                .query("SELECT msg_id FROM pgqueue.pgq_claim($1, 10)", &[&q])
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            panic!("{left} messages never finished (seed {seed}): {rows:?}; a claim now gets {claimed:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for t in cancellers {
        t.join().unwrap();
    }
    done.store(true, Ordering::SeqCst);
    for t in consumers.into_iter().chain([rearmer]) {
        t.join().unwrap();
    }

    let finished: HashMap<i64, (String, i64)> = c
        .query("SELECT msg_id, min(outcome), count(*) FROM pgqueue.history WHERE queue = $1 GROUP BY msg_id", &[&q])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    assert_eq!(finished.len(), MESSAGES, "every message finished (seed {seed})");
    let cancels = cancels.lock().unwrap();
    for (id, (outcome, n)) in &finished {
        assert_eq!(*n, 1, "message {id} finished once (seed {seed})");
        assert_eq!(
            outcome == "cancelled",
            cancels.contains_key(id),
            "message {id}: {outcome}, and a cancel returned it: {} (seed {seed})",
            cancels.contains_key(id)
        );
    }
    for (id, tick) in claims.lock().unwrap().iter() {
        if let Some(cancelled) = cancels.get(id) {
            assert!(tick < cancelled, "message {id} claimed after its cancel returned (seed {seed})");
        }
    }
    let kept: i64 = c
        .query_one(
            "SELECT count(*) FROM pgqueue.dedup_keys d JOIN pgqueue.history h USING (msg_id)
              WHERE d.queue = $1 AND h.outcome = 'cancelled'",
            &[&q],
        )
        .unwrap()
        .get(0);
    assert_eq!(kept, 0, "a cancelled message's key is free (seed {seed})");
    let outcomes: Vec<(String, i64)> = c
        .query("SELECT outcome, count(*) FROM pgqueue.history WHERE queue = $1 GROUP BY 1 ORDER BY 1", &[&q])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    eprintln!("cancel race (seed {seed}): {outcomes:?}, {} cancels", cancels.len());
    assert!(outcomes.len() == 3, "completed, dead and cancelled all happened: {outcomes:?}");
}
