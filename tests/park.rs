//! Parking (0.18.0): `pgq_park` ends a claim and parks its message on a key until
//! `pgq_signal(key)` or its timeout, over real, committing connections. A parked message is
//! not claimable; a signal resumes it at its commit (waking waiting claims), with its payload
//! in the "pgq_park" header and the attempt given back; a signal sent before the park is kept
//! and resumes the park at once. A park and a signal of the same key never lose the wakeup,
//! in any order, under real concurrency (REPEATABLE READ gets 40001 instead). The worker ends
//! timed-out parks (resumed, or dead-lettered). Bad arguments change nothing; a cancel, a
//! dropped queue, a dependency graph and a session-bound claim all see a parked message as
//! waiting.

mod common;

use common::rng::{Rng, seed_from};
use common::{
    Claimed, Client, Message, ack, claim, claim_all, claim_one, connect, history_of, message, new_queue, outcome, send,
    send_many, sqlstate, state, unique_queue, wait_for,
};
use postgres::GenericClient;
use serde_json::{Value, json};
use std::sync::Barrier;
use std::thread;
use std::time::Duration;
use uuid::Uuid;

const LIMIT: Duration = Duration::from_secs(30);

const TIMEOUT_ERROR: &str = "parked, and no signal came before its timeout";

/// A park key no other test uses.
fn unique_key(what: &str) -> String {
    unique_queue(&format!("key_{what}"))
}

/// `pgq_park(id, token, key, timeout)` with its defaults: whether it parked (false: the claim
/// is not held under that token).
fn park(c: &mut impl GenericClient, m: &Claimed, key: &str, timeout: &str) -> bool {
    c.query_one(
        "SELECT pgqueue.pgq_park($1::bigint, $2::uuid, $3, $4::text::interval)",
        &[&m.id, &m.token, &key, &timeout],
    )
    .unwrap()
    .get(0)
}

/// `pgq_park` with a payload and an on_timeout.
fn park_with(
    c: &mut impl GenericClient,
    m: &Claimed,
    key: &str,
    timeout: &str,
    payload: Option<Value>,
    on_timeout: &str,
) -> bool {
    c.query_one(
        "SELECT pgqueue.pgq_park($1::bigint, $2::uuid, $3, $4::text::interval, payload => $5::jsonb,
                                 on_timeout => $6)",
        &[&m.id, &m.token, &key, &timeout, &payload, &on_timeout],
    )
    .unwrap()
    .get(0)
}

/// `pgq_signal(key, payload)` with its default keep: how many messages it resumed.
fn signal(c: &mut impl GenericClient, key: &str, payload: Value) -> i64 {
    c.query_one("SELECT pgqueue.pgq_signal($1, $2::jsonb)", &[&key, &payload]).unwrap().get(0)
}

/// `pgq_signal(key, payload, keep)`.
fn signal_keep(c: &mut impl GenericClient, key: &str, payload: Value, keep: &str) -> i64 {
    c.query_one("SELECT pgqueue.pgq_signal($1, $2::jsonb, $3::text::interval)", &[&key, &payload, &keep])
        .unwrap()
        .get(0)
}

/// The "pgq_park" header of message `id`, waiting or finished (`pgqueue.jobs`); Null if none.
fn park_header(c: &mut impl GenericClient, id: i64) -> Value {
    c.query_one("SELECT headers -> 'pgq_park' FROM pgqueue.jobs WHERE msg_id = $1", &[&id])
        .unwrap()
        .get::<_, Option<Value>>(0)
        .unwrap_or(Value::Null)
}

/// One message claimed from `q` with the "pgq_park" header the claim returned (Null if none);
/// None when there is nothing to claim.
fn claim_with_park_header(c: &mut impl GenericClient, q: &str) -> Option<(Claimed, Value)> {
    c.query_opt(
        "SELECT msg_id, claim_token, attempt, priority, headers -> 'pgq_park' FROM pgqueue.pgq_claim($1, lease => '1 hour')",
        &[&q],
    )
    .unwrap()
    .map(|r| {
        let m = Claimed { id: r.get(0), token: r.get(1), attempt: r.get(2), priority: r.get(3) };
        (m, r.get::<_, Option<Value>>(4).unwrap_or(Value::Null))
    })
}

/// The payload of the signal kept for `key` (None: no row, or no signal kept now).
fn kept_signal(c: &mut impl GenericClient, key: &str) -> Option<Value> {
    c.query_opt("SELECT signal FROM pgqueue.park_keys WHERE key = $1 AND keep_until > now()", &[&key])
        .unwrap()
        .map(|r| r.get::<_, Option<Value>>(0).unwrap_or(Value::Null))
}

/// How many rows of `pgqueue.park_keys` are for `keys` (never the whole table).
fn key_rows(c: &mut impl GenericClient, keys: &[&str]) -> i64 {
    c.query_one("SELECT count(*) FROM pgqueue.park_keys WHERE key = ANY($1)", &[&keys]).unwrap().get(0)
}

/// `worker_stats.park_timeouts`.
fn park_timeouts(c: &mut Client) -> i64 {
    c.query_one("SELECT park_timeouts FROM pgqueue.worker_stats", &[]).unwrap().get(0)
}

fn backend_pid(c: &mut Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0)
}

/// Waits until the statement of backend `waiter` is blocked by backend `holder`.
fn until_blocked(c: &mut Client, waiter: i32, holder: i32) {
    wait_for(&format!("backend {waiter} to wait for {holder}'s transaction"), LIMIT, || {
        let blocked: bool = c.query_one("SELECT $2 = ANY (pg_blocking_pids($1))", &[&waiter, &holder]).unwrap().get(0);
        blocked.then_some(())
    });
}

/// `pgq_send(q, '{}', after => parents)`.
fn send_after(c: &mut Client, q: &str, parents: &[i64]) -> i64 {
    c.query_one("SELECT pgqueue.pgq_send($1, '{}', after => $2)", &[&q, &parents]).unwrap().get(0)
}

fn shuffle<T>(items: &mut [T], rng: &mut Rng) {
    for i in (1..items.len()).rev() {
        items.swap(i, rng.below(i as u64 + 1) as usize);
    }
}

#[test]
fn a_parked_message_waits_for_its_signal_and_resumes_at_its_commit_with_the_same_attempt() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let id = send(&mut c, &q, json!({"job": 1}));
    let first = claim_one(&mut c, &q, None);
    assert_eq!((first.id, first.attempt), (id, 1));
    let k = unique_key("webhook");
    assert!(park_with(&mut c, &first, &k, "1 hour", Some(json!({"waiting_for": "webhook"})), "resume"));

    // Parked: no claim left, the key and the deadline set.
    let r = c
        .query_one(
            "SELECT state, park_key, park_until > now() + interval '59 minutes', claim_token IS NULL,
                    claimed_at IS NULL AND lease_expires_at IS NULL AND consumer IS NULL AND session_pid IS NULL
               FROM pgqueue.messages WHERE msg_id = $1",
            &[&id],
        )
        .unwrap();
    assert_eq!(
        (
            r.get::<_, String>(0),
            r.get::<_, Option<String>>(1),
            r.get::<_, bool>(2),
            r.get::<_, bool>(3),
            r.get::<_, bool>(4)
        ),
        ("parked".to_string(), Some(k.clone()), true, true, true)
    );
    let h = park_header(&mut c, id);
    assert_eq!(h["key"], json!(k), "{h}");
    assert_eq!(h["on_timeout"], json!("resume"), "{h}");
    assert_eq!(h["payload"], json!({"waiting_for": "webhook"}), "{h}");
    assert!(h["parked_at"].is_string() && h["timeout_at"].is_string(), "{h}");
    assert!(h.get("signal").is_none() && h.get("resumed_at").is_none(), "not resumed yet: {h}");
    let parked: i64 = c.query_one("SELECT parked FROM pgqueue.queue_stats WHERE queue = $1", &[&q]).unwrap().get(0);
    assert_eq!(parked, 1, "queue_stats counts it");
    assert!(claim(&mut c, &q, 10, None).is_empty(), "a parked message is not claimable");
    assert!(!park(&mut c, &first, &k, "1 hour"), "the claim ended with the park: its token parks nothing");

    // The signal resumes it at its commit, not before.
    let mut other = connect();
    let mut tx = c.transaction().unwrap();
    assert_eq!(signal(&mut tx, &k, json!({"approved": true})), 1);
    assert_eq!(state(&mut tx, id).as_deref(), Some("ready"), "inside the signalling transaction");
    assert_eq!(state(&mut other, id).as_deref(), Some("parked"), "before the commit");
    assert!(claim(&mut other, &q, 10, None).is_empty(), "nothing to claim before the commit");
    tx.commit().unwrap();

    let (m, h) = claim_with_park_header(&mut other, &q).expect("claimable after the signal's commit");
    assert_eq!(m.id, id);
    assert_eq!(m.attempt, first.attempt, "the park gave its attempt back");
    assert_eq!(h["signal"], json!({"approved": true}), "{h}");
    assert_eq!(h["payload"], json!({"waiting_for": "webhook"}), "the park's payload is kept: {h}");
    assert_eq!(h["key"], json!(k), "{h}");
    assert!(h["signalled_at"].is_string() && h["resumed_at"].is_string(), "{h}");
    let parked: i64 = c.query_one("SELECT parked FROM pgqueue.queue_stats WHERE queue = $1", &[&q]).unwrap().get(0);
    assert_eq!(parked, 0);
    assert!(ack(&mut other, &m));
    assert_eq!(outcome(&mut c, id).as_deref(), Some("completed"));
    assert_eq!(signal(&mut c, &k, json!({"again": true})), 0, "nothing is parked on the key any more");
}

#[test]
fn a_kept_signal_resumes_a_later_park_at_once_and_later_signals_change_nothing() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let k = unique_key("early");
    assert_eq!(signal(&mut c, &k, json!({"n": 1})), 0, "nothing parked yet");
    assert_eq!(kept_signal(&mut c, &k), Some(json!({"n": 1})));
    assert_eq!(signal(&mut c, &k, json!({"n": 2})), 0, "a signal while one is kept");
    assert_eq!(kept_signal(&mut c, &k), Some(json!({"n": 1})), "the first payload wins");

    // Every park on the key while the signal is kept resumes at once.
    for round in 0..2 {
        let id = send(&mut c, &q, json!({"round": round}));
        let first = claim_one(&mut c, &q, None);
        assert_eq!(first.id, id);
        assert!(park(&mut c, &first, &k, "1 hour"), "round {round}");
        assert_eq!(state(&mut c, id).as_deref(), Some("ready"), "round {round}: resumed at once");
        let h = park_header(&mut c, id);
        assert_eq!(h["signal"], json!({"n": 1}), "round {round}: {h}");
        assert_eq!(h["resumed_at"], h["parked_at"], "round {round}: resumed by the park itself: {h}");
        let (m, h) = claim_with_park_header(&mut c, &q).expect("claimable");
        assert_eq!((m.id, m.attempt), (id, first.attempt), "round {round}: the same attempt again");
        assert_eq!(h["signal"], json!({"n": 1}), "round {round}: {h}");
        assert!(ack(&mut c, &m));
    }

    // keep => '0': nothing kept, a later park waits.
    let k0 = unique_key("unkept");
    assert_eq!(signal_keep(&mut c, &k0, json!({"n": 0}), "0"), 0);
    assert_eq!(kept_signal(&mut c, &k0), None, "keep 0 keeps nothing");
    let id = send(&mut c, &q, json!({}));
    let m = claim_one(&mut c, &q, None);
    assert!(park(&mut c, &m, &k0, "1 hour"));
    assert_eq!(state(&mut c, id).as_deref(), Some("parked"), "the earlier signal was not kept");
    assert_eq!(signal_keep(&mut c, &k0, json!({"n": 1}), "0"), 1, "a signal after the park resumes it");
    assert_eq!(park_header(&mut c, id)["signal"], json!({"n": 1}));
}

/// (a) A park not committed yet: a signal of its key from another session waits for its
/// commit, then resumes it.
#[test]
fn a_signal_waits_for_an_uncommitted_park_of_its_key_then_resumes_it() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let id = send(&mut c, &q, json!({}));
    let m = claim_one(&mut c, &q, Some("1 hour"));
    let k = unique_key("park_first");
    let mut parker = connect();
    let parker_pid = backend_pid(&mut parker);
    let mut signaller = connect();
    let signaller_pid = backend_pid(&mut signaller);

    let mut tx = parker.transaction().unwrap();
    assert!(park(&mut tx, &m, &k, "1 hour"));
    let key = k.clone();
    let signalled = thread::spawn(move || signal(&mut signaller, &key, json!({"from": "signaller"})));
    until_blocked(&mut c, signaller_pid, parker_pid);
    assert_eq!(state(&mut c, id).as_deref(), Some("claimed"), "the park is not committed yet");
    tx.commit().unwrap();
    assert_eq!(signalled.join().unwrap(), 1, "the signal saw the park once it committed");
    assert_eq!(state(&mut c, id).as_deref(), Some("ready"));
    assert_eq!(park_header(&mut c, id)["signal"], json!({"from": "signaller"}));
}

/// (b) A signal not committed yet: a park of its key from another session waits for its
/// commit, then resumes at once.
#[test]
fn a_park_waits_for_an_uncommitted_signal_of_its_key_then_resumes_at_once() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let id = send(&mut c, &q, json!({}));
    let m = claim_one(&mut c, &q, Some("1 hour"));
    let k = unique_key("signal_first");
    let mut signaller = connect();
    let signaller_pid = backend_pid(&mut signaller);
    let mut parker = connect();
    let parker_pid = backend_pid(&mut parker);

    let mut tx = signaller.transaction().unwrap();
    assert_eq!(signal(&mut tx, &k, json!({"from": "signaller"})), 0);
    let key = k.clone();
    let parked = thread::spawn(move || park(&mut parker, &m, &key, "1 hour"));
    until_blocked(&mut c, parker_pid, signaller_pid);
    assert_eq!(state(&mut c, id).as_deref(), Some("claimed"), "the park waits");
    tx.commit().unwrap();
    assert!(parked.join().unwrap());
    assert_eq!(state(&mut c, id).as_deref(), Some("ready"), "the park found the signal once it committed");
    let h = park_header(&mut c, id);
    assert_eq!(h["signal"], json!({"from": "signaller"}), "{h}");
    assert_eq!(h["resumed_at"], h["parked_at"], "resumed by the park: {h}");
}

/// (c) Each of many keys parked once and signalled once, by sessions racing each other with
/// random small pauses: signals land before, during and after the parks. The timeout is an
/// hour, so only a signal resumes a message: every one must end ready, with its key's signal.
/// PGQUEUE_PARK_SEED=<seed> replays a run's orders and pauses.
#[test]
fn parks_and_signals_racing_on_many_keys_never_lose_a_wakeup() {
    const KEYS: usize = 240;
    const PARKERS: usize = 8;
    const SIGNALLERS: usize = 8;
    let seed = seed_from("PGQUEUE_PARK_SEED", "parks_and_signals_racing_on_many_keys_never_lose_a_wakeup");
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send_many(&mut c, &q, KEYS, "0");
    let held = claim_all(&mut c, &q, Some("1 hour"));
    assert_eq!(held.len(), KEYS);
    let base = unique_key("race");
    let key = |i: usize| format!("{base}_{i}");
    let mut parkers: Vec<Client> = (0..PARKERS).map(|_| connect()).collect();
    let mut signallers: Vec<Client> = (0..SIGNALLERS).map(|_| connect()).collect();
    let start = Barrier::new(PARKERS + SIGNALLERS);

    // Per key: the message's state in the park's own transaction, after the park ("ready":
    // resumed at once by a signal committed before it), and what the signal returned.
    let mut park_state: Vec<Option<String>> = vec![None; KEYS];
    let mut resumed: Vec<Option<i64>> = vec![None; KEYS];
    thread::scope(|s| {
        let (start, held, key) = (&start, &held, &key);
        let parks: Vec<_> = parkers
            .iter_mut()
            .enumerate()
            .map(|(p, pc)| {
                s.spawn(move || {
                    let mut rng = Rng::new(seed, p as u64);
                    let mut mine: Vec<usize> = (p..KEYS).step_by(PARKERS).collect();
                    shuffle(&mut mine, &mut rng);
                    start.wait();
                    let mut out = vec![];
                    for i in mine {
                        thread::sleep(Duration::from_micros(rng.below(3001)));
                        let mut tx = pc.transaction().unwrap();
                        assert!(park(&mut tx, &held[i], &key(i), "1 hour"), "seed {seed}: key {i}");
                        let st = state(&mut tx, held[i].id).unwrap();
                        tx.commit().unwrap();
                        out.push((i, st));
                    }
                    out
                })
            })
            .collect();
        let signals: Vec<_> = signallers
            .iter_mut()
            .enumerate()
            .map(|(n, sc)| {
                s.spawn(move || {
                    let mut rng = Rng::new(seed, 1000 + n as u64);
                    let mut mine: Vec<usize> = (n..KEYS).step_by(SIGNALLERS).collect();
                    shuffle(&mut mine, &mut rng);
                    start.wait();
                    let mut out = vec![];
                    for i in mine {
                        thread::sleep(Duration::from_micros(rng.below(3001)));
                        out.push((i, signal(sc, &key(i), json!({"key": i}))));
                    }
                    out
                })
            })
            .collect();
        for h in parks {
            for (i, st) in h.join().unwrap() {
                park_state[i] = Some(st);
            }
        }
        for h in signals {
            for (i, n) in h.join().unwrap() {
                resumed[i] = Some(n);
            }
        }
    });

    let mut at_once = 0;
    for (i, m) in held.iter().enumerate() {
        let parked_state = park_state[i].as_deref().unwrap();
        let expected = match parked_state {
            "ready" => {
                at_once += 1;
                0
            }
            "parked" => 1,
            other => panic!("seed {seed}: key {i}: {other} after the park"),
        };
        assert_eq!(
            resumed[i],
            Some(expected),
            "seed {seed}: key {i}: the signal resumes the message iff the park came first"
        );
        assert_eq!(state(&mut c, m.id).as_deref(), Some("ready"), "seed {seed}: key {i}: a lost wakeup");
        let h = park_header(&mut c, m.id);
        assert_eq!(h["signal"], json!({"key": i}), "seed {seed}: key {i}: {h}");
        assert_eq!(h["key"], json!(key(i)), "seed {seed}: key {i}: {h}");
    }
    eprintln!("seed {seed}: {at_once} of {KEYS} parks came after their signal");
    assert!(at_once > 0 && at_once < KEYS, "seed {seed}: both orders happened ({at_once} of {KEYS} signals first)");
    let again = claim_all(&mut c, &q, Some("1 hour"));
    assert_eq!(again.len(), KEYS);
    assert!(again.iter().all(|m| m.attempt == 1), "seed {seed}: every park gave its attempt back");
}

#[test]
fn a_signal_wakes_a_waiting_claim_at_its_commit() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let id = send(&mut c, &q, json!({}));
    let first = claim_one(&mut c, &q, Some("1 hour"));
    let k = unique_key("wake");
    assert!(park(&mut c, &first, &k, "1 hour"));

    let mut w = connect();
    let queue = q.clone();
    let waiter = thread::spawn(move || -> Vec<(i64, i32, Value)> {
        w.query("SELECT msg_id, attempt, headers -> 'pgq_park' FROM pgqueue.pgq_claim($1, wait => '30 s')", &[&queue])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get::<_, Option<Value>>(2).unwrap_or(Value::Null)))
            .collect()
    });
    // The waiter sleeps before the signal: only the signal's commit can wake it.
    wait_for("the claim to sleep", LIMIT, || {
        let sleeping: i64 = c
            .query_one("SELECT waiting_claims FROM pgqueue.queue_depth WHERE queue = $1", &[&q])
            .unwrap()
            .get::<_, Option<i64>>(0)
            .unwrap_or(0);
        (sleeping == 1).then_some(())
    });
    let mut tx = c.transaction().unwrap();
    assert_eq!(signal(&mut tx, &k, json!({"go": true})), 1);
    tx.commit().unwrap();
    let got = waiter.join().unwrap();
    assert_eq!(got.len(), 1, "the waiting claim returned the resumed message: {got:?}");
    assert_eq!((got[0].0, got[0].1), (id, first.attempt));
    assert_eq!(got[0].2["signal"], json!({"go": true}));
}

/// The test cluster's worker ticks every 100 ms (pgqueue.tick_interval in
/// pg_test::postgresql_conf_options): it ends the timed-out parks, nobody calls pgq_tick().
#[test]
fn the_worker_resumes_or_dead_letters_parks_whose_timeout_passed() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let before = park_timeouts(&mut c);
    let resumed = send(&mut c, &q, json!({"on_timeout": "resume"}));
    let m_resumed = claim_one(&mut c, &q, Some("1 hour"));
    let dead = send(&mut c, &q, json!({"on_timeout": "dead"}));
    let m_dead = claim_one(&mut c, &q, Some("1 hour"));
    assert_eq!((m_resumed.id, m_dead.id), (resumed, dead));
    let (k_resumed, k_dead) = (unique_key("timeout_resume"), unique_key("timeout_dead"));
    assert!(park_with(&mut c, &m_resumed, &k_resumed, "200 ms", Some(json!({"step": 2})), "resume"));
    assert!(park_with(&mut c, &m_dead, &k_dead, "200 ms", None, "dead"));

    wait_for("the 'dead' park dead-lettered", LIMIT, || outcome(&mut c, dead));
    assert_eq!(history_of(&mut c, dead)[0].result(), ("dead", m_dead.attempt, Some(TIMEOUT_ERROR)));
    wait_for("the 'resume' park resumed", LIMIT, || (state(&mut c, resumed).as_deref() == Some("ready")).then_some(()));
    let (m, h) = claim_with_park_header(&mut c, &q).expect("the timed-out message is claimable");
    assert_eq!((m.id, m.attempt), (resumed, m_resumed.attempt), "the same attempt again");
    assert_eq!(h["timed_out"], json!(true), "{h}");
    assert_eq!(h["payload"], json!({"step": 2}), "{h}");
    assert!(h.get("signal").is_none() && h["resumed_at"].is_string(), "{h}");
    // The counts are written at the end of the tick.
    wait_for("worker_stats.park_timeouts to count both", LIMIT, || (park_timeouts(&mut c) >= before + 2).then_some(()));
    assert_eq!(signal(&mut c, &k_resumed, json!({})), 0, "too late: nothing parked");
    assert_eq!(signal(&mut c, &k_dead, json!({})), 0, "too late: nothing parked");
    assert!(ack(&mut c, &m));
}

#[test]
fn bad_parks_and_signals_are_refused_and_change_nothing() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let other_q = new_queue(&mut c, "");
    let id = send(&mut c, &q, json!({}));
    let m = claim_one(&mut c, &q, Some("1 hour"));
    let k = unique_key("bad");
    let park_sql = "SELECT pgqueue.pgq_park({id}, {token}, {key}, '1 hour'";
    let cases: Vec<(String, &str)> = [
        ("SELECT pgqueue.pgq_park(NULL, {token}, {key}, '1 hour')", "22004"),
        ("SELECT pgqueue.pgq_park({id}, NULL, {key}, '1 hour')", "22004"),
        ("SELECT pgqueue.pgq_park({id}, {token}, NULL, '1 hour')", "22004"),
        ("SELECT pgqueue.pgq_park({id}, {token}, {key}, NULL)", "22004"),
        ("{park}, on_timeout => NULL)", "22004"),
        ("SELECT pgqueue.pgq_park({id}, {token}, '', '1 hour')", "22023"),
        ("SELECT pgqueue.pgq_park({id}, {token}, repeat('k', 513), '1 hour')", "22023"),
        ("SELECT pgqueue.pgq_park({id}, {token}, {key}, '0')", "22023"),
        ("SELECT pgqueue.pgq_park({id}, {token}, {key}, '-1 s')", "22023"),
        ("SELECT pgqueue.pgq_park({id}, {token}, {key}, '366 days')", "22023"),
        ("{park}, on_timeout => 'retry')", "22023"),
        ("{park}, payload => jsonb_build_object('x', repeat('x', 2000)))", "54000"),
        ("{park}, queue => 'no_such_queue_for_park')", "42704"),
        ("SELECT pgqueue.pgq_signal(NULL)", "22004"),
        ("SELECT pgqueue.pgq_signal('')", "22023"),
        ("SELECT pgqueue.pgq_signal(repeat('k', 513))", "22023"),
        ("SELECT pgqueue.pgq_signal({key}, keep => NULL)", "22004"),
        ("SELECT pgqueue.pgq_signal({key}, keep => '-1 s')", "22023"),
        ("SELECT pgqueue.pgq_signal({key}, keep => '366 days')", "22023"),
        ("SELECT pgqueue.pgq_signal({key}, jsonb_build_object('x', repeat('x', 2000)))", "54000"),
    ]
    .iter()
    .map(|&(sql, code)| {
        let sql = sql
            .replace("{park}", park_sql)
            .replace("{id}", &id.to_string())
            .replace("{token}", &format!("'{}'::uuid", m.token))
            .replace("{key}", &format!("'{k}'"));
        (sql, code)
    })
    .collect();
    c.batch_execute("SET pgqueue.max_payload_bytes = 1000").unwrap();
    for (sql, code) in &cases {
        assert_eq!(sqlstate(c.batch_execute(sql)), *code, "{sql}");
    }
    c.batch_execute("RESET pgqueue.max_payload_bytes").unwrap();

    // Headers that are not a JSON object cannot take the "pgq_park" entry.
    let listed: i64 = c.query_one("SELECT pgqueue.pgq_send($1, '{}', headers => '[1]')", &[&other_q]).unwrap().get(0);
    let lm = claim_one(&mut c, &other_q, Some("1 hour"));
    assert_eq!(lm.id, listed);
    assert_eq!(
        sqlstate(c.query("SELECT pgqueue.pgq_park($1::bigint, $2::uuid, $3, '1 hour')", &[&lm.id, &lm.token, &k])),
        "22023"
    );
    assert_eq!(message(&mut c, listed), Some(Message { state: "claimed".into(), token: Some(lm.token), attempt: 1 }));

    // Not held under that token, or not in that queue: false, nothing changed.
    let stale = Claimed { token: Uuid::new_v4(), ..m };
    assert!(!park(&mut c, &stale, &k, "1 hour"), "a stale token");
    let elsewhere: bool = c
        .query_one(
            "SELECT pgqueue.pgq_park($1::bigint, $2::uuid, $3, '1 hour', queue => $4)",
            &[&m.id, &m.token, &k, &other_q],
        )
        .unwrap()
        .get(0);
    assert!(!elsewhere, "a park naming another queue");

    assert_eq!(message(&mut c, id), Some(Message { state: "claimed".into(), token: Some(m.token), attempt: 1 }));
    assert_eq!(park_header(&mut c, id), Value::Null, "no park recorded");
    assert_eq!(key_rows(&mut c, &[&k]), 0, "no key row written");

    // The bounds themselves are accepted: a key of 512 characters, a timeout of 365 days.
    let long_key = format!("{k}_{}", "k".repeat(512 - k.len() - 1));
    assert_eq!(long_key.len(), 512);
    assert!(park(&mut c, &m, &long_key, "365 days"));
    assert_eq!(state(&mut c, id).as_deref(), Some("parked"));
    assert_eq!(signal_keep(&mut c, &long_key, json!({}), "365 days"), 1);
    // A finished message's token parks nothing.
    let m2 = claim_one(&mut c, &q, Some("1 hour"));
    assert!(ack(&mut c, &m2));
    assert!(!park(&mut c, &m2, &k, "1 hour"), "already finished");
    assert_eq!(key_rows(&mut c, &[&k]), 0);
}

#[test]
fn a_cancel_finishes_a_parked_message_and_a_park_finishes_a_cancel_requested_claim() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    // A parked message is waiting: cancelled at once.
    let parked = send(&mut c, &q, json!({}));
    let m = claim_one(&mut c, &q, Some("1 hour"));
    let k = unique_key("cancel_parked");
    assert!(park(&mut c, &m, &k, "1 hour"));
    assert!(c.query_one("SELECT pgqueue.pgq_cancel($1::bigint)", &[&parked]).unwrap().get::<_, bool>(0));
    assert_eq!(outcome(&mut c, parked).as_deref(), Some("cancelled"));
    assert_eq!(state(&mut c, parked), None);
    assert_eq!(signal(&mut c, &k, json!({})), 0, "nothing left parked on the key");

    // A claim whose cancel was requested: its park cancels it.
    let running = send(&mut c, &q, json!({}));
    let m = claim_one(&mut c, &q, Some("1 hour"));
    assert!(c.query_one("SELECT pgqueue.pgq_cancel($1::bigint)", &[&running]).unwrap().get::<_, bool>(0));
    assert_eq!(state(&mut c, running).as_deref(), Some("claimed"), "the holder is to stop");
    let k2 = unique_key("cancel_requested");
    assert!(park(&mut c, &m, &k2, "1 hour"));
    assert_eq!(outcome(&mut c, running).as_deref(), Some("cancelled"));
    assert_eq!(state(&mut c, running), None);
    assert_eq!(key_rows(&mut c, &[&k2]), 0, "it did not park");
    assert_eq!(signal(&mut c, &k2, json!({})), 0);

    // Dropping the queue deletes its parked messages.
    let doomed = new_queue(&mut c, "");
    let gone = send(&mut c, &doomed, json!({}));
    let m = claim_one(&mut c, &doomed, Some("1 hour"));
    let k3 = unique_key("dropped");
    assert!(park(&mut c, &m, &k3, "1 hour"));
    c.execute("SELECT pgqueue.pgq_drop_queue($1)", &[&doomed]).unwrap();
    assert_eq!(state(&mut c, gone), None);
    assert_eq!(signal(&mut c, &k3, json!({})), 0, "the parked message went with its queue");
}

#[test]
fn a_park_in_repeatable_read_after_an_unseen_signal_fails_to_serialize_and_its_retry_resumes() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let id = send(&mut c, &q, json!({}));
    let m = claim_one(&mut c, &q, Some("1 hour"));
    let k = unique_key("repeatable_read");
    let mut rr = connect();
    let mut tx = rr.build_transaction().isolation_level(postgres::IsolationLevel::RepeatableRead).start().unwrap();
    tx.query_one("SELECT 1", &[]).unwrap(); // the snapshot: before the signal
    assert_eq!(signal(&mut c, &k, json!({"late": true})), 0);
    assert_eq!(
        sqlstate(tx.query_one("SELECT pgqueue.pgq_park($1::bigint, $2::uuid, $3, '1 hour')", &[&m.id, &m.token, &k])),
        "40001"
    );
    tx.rollback().unwrap();
    assert_eq!(message(&mut c, id), Some(Message { state: "claimed".into(), token: Some(m.token), attempt: 1 }));

    // The retry, in READ COMMITTED, sees the signal.
    let mut tx = rr.transaction().unwrap();
    assert!(park(&mut tx, &m, &k, "1 hour"));
    tx.commit().unwrap();
    assert_eq!(state(&mut c, id).as_deref(), Some("ready"), "resumed at once");
    assert_eq!(park_header(&mut c, id)["signal"], json!({"late": true}));

    // A signal its snapshot sees is no conflict: a REPEATABLE READ park resumes at once.
    let id2 = send(&mut c, &q, json!({}));
    let first = claim_all(&mut c, &q, Some("1 hour"));
    let m2 = *first.iter().find(|x| x.id == id2).unwrap();
    let mut tx = rr.build_transaction().isolation_level(postgres::IsolationLevel::RepeatableRead).start().unwrap();
    assert!(park(&mut tx, &m2, &k, "1 hour"));
    tx.commit().unwrap();
    assert_eq!(state(&mut c, id2).as_deref(), Some("ready"));
    assert_eq!(park_header(&mut c, id2)["signal"], json!({"late": true}));
}

#[test]
fn a_parked_parent_holds_its_children_until_it_resumes_and_completes() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let parent = send(&mut c, &q, json!({"parent": true}));
    let early = send_after(&mut c, &q, &[parent]);
    let m = claim_one(&mut c, &q, Some("1 hour"));
    assert_eq!(m.id, parent);
    let k = unique_key("parent");
    assert!(park(&mut c, &m, &k, "1 hour"));
    let late = send_after(&mut c, &q, &[parent]);
    assert_eq!(state(&mut c, early).as_deref(), Some("pending"));
    assert_eq!(state(&mut c, late).as_deref(), Some("pending"), "a parked parent has not finished");
    assert!(claim(&mut c, &q, 10, None).is_empty(), "the parent is parked, its children pending");

    assert_eq!(signal(&mut c, &k, json!({})), 1);
    assert_eq!(state(&mut c, early).as_deref(), Some("pending"), "resumed is not finished");
    let again = claim_one(&mut c, &q, Some("1 hour"));
    assert_eq!((again.id, again.attempt), (parent, m.attempt));
    assert_eq!(state(&mut c, late).as_deref(), Some("pending"));
    assert!(ack(&mut c, &again));
    assert_eq!(state(&mut c, early).as_deref(), Some("ready"));
    assert_eq!(state(&mut c, late).as_deref(), Some("ready"));
}

#[test]
fn a_parked_session_bound_claim_no_longer_belongs_to_its_session() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let (parked, control) = (send(&mut c, &q, json!({})), send(&mut c, &q, json!({})));
    let mut session = connect();
    let pid = backend_pid(&mut session);
    let held: Vec<Claimed> = session
        .query(
            "SELECT msg_id, claim_token, attempt, priority
               FROM pgqueue.pgq_claim($1, 2, lease => '1 hour', session_bound => true)",
            &[&q],
        )
        .unwrap()
        .iter()
        .map(|r| Claimed { id: r.get(0), token: r.get(1), attempt: r.get(2), priority: r.get(3) })
        .collect();
    assert_eq!(held.iter().map(|m| m.id).collect::<Vec<_>>(), vec![parked, control]);
    let k = unique_key("session");
    assert!(park(&mut session, &held[0], &k, "1 hour"));
    let session_of = |c: &mut Client, id: i64| -> Option<i32> {
        c.query_one("SELECT session_pid FROM pgqueue.messages WHERE msg_id = $1", &[&id]).unwrap().get(0)
    };
    assert_eq!(session_of(&mut c, parked), None, "the park cleared the session");
    assert_eq!(session_of(&mut c, control), Some(pid));

    // The session ends: its remaining claim is made claimable again; the parked message
    // stays parked (the control shows the worker has seen the session gone).
    drop(session);
    wait_for("the worker to re-arm the session's other claim", LIMIT, || {
        (state(&mut c, control).as_deref() == Some("ready")).then_some(())
    });
    assert_eq!(message(&mut c, parked), Some(Message { state: "parked".into(), token: None, attempt: 1 }));
    let key: Option<String> =
        c.query_one("SELECT park_key FROM pgqueue.messages WHERE msg_id = $1", &[&parked]).unwrap().get(0);
    assert_eq!(key, Some(k.clone()));
    assert_eq!(signal(&mut c, &k, json!({})), 1);
    let back = claim_all(&mut c, &q, Some("1 hour"));
    let resumed = back.iter().find(|m| m.id == parked).expect("the resumed message is claimable");
    assert_eq!(resumed.attempt, held[0].attempt);
}
