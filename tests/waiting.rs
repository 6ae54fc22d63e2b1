//! Waiting claims (`pgq_claim(…, wait => …)`) over real, committing connections: a claim
//! that finds nothing sleeps until a commit makes messages of its queue claimable — a send,
//! a batch send, a nack for now, a re-armed claim, a promoted delayed message, a redrive, a
//! resume — and not for a rolled-back send; it ends at its deadline with nothing, on
//! statement_timeout, cancel and termination, and when its queue is dropped. One commit
//! wakes one sleeper per message (64 sleepers, one send: one wakes). Without the library
//! preloaded waiting still works (by polling; so does `pgq_result`'s), and a restart that loses the shared state
//! loses no message.

mod common;

use common::server::{Server, bindir, this_major};
use common::{Client, claim_one, connect, new_queue, send, sqlstate, unique_queue, wait_for};
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};
use uuid::Uuid;

const LIMIT: Duration = Duration::from_secs(30);
/// A claim waiting 50 s that returns before this was woken, not timed out. A functional
/// check, not a latency one.
const WOKEN: Duration = Duration::from_secs(25);

/// What a waiting claim run in a thread of its own returned, after how long, and its
/// session (to see whether it survived).
struct Outcome {
    claimed: Result<Vec<(i64, i32)>, postgres::Error>,
    elapsed: Duration,
    client: Client,
}

impl Outcome {
    fn ids(&self) -> Vec<i64> {
        match &self.claimed {
            Ok(rows) => rows.iter().map(|&(id, _)| id).collect(),
            Err(e) => panic!("the waiting claim failed: {e}"),
        }
    }
}

/// `pgq_claim(q, qty, wait => wait)` on `c`, in a thread; (msg_id, attempt) of each row.
fn waiting_claim(mut c: Client, q: &str, qty: i32, wait: &str) -> JoinHandle<Outcome> {
    let (q, wait) = (q.to_owned(), wait.to_owned());
    thread::spawn(move || {
        let start = Instant::now();
        let claimed = c
            .query(
                "SELECT msg_id, attempt FROM pgqueue.pgq_claim($1, qty => $2::int, wait => $3::text::interval)",
                &[&q, &qty, &wait],
            )
            .map(|rows| rows.iter().map(|r| (r.get(0), r.get(1))).collect());
        Outcome { claimed, elapsed: start.elapsed(), client: c }
    })
}

/// (waiting_claims, wakeups) of `q` in `pgqueue.queue_depth`.
fn depth(c: &mut Client, q: &str) -> (i64, i64) {
    let r = c
        .query_opt("SELECT waiting_claims, wakeups FROM pgqueue.queue_depth WHERE queue = $1", &[&q])
        .unwrap()
        .unwrap_or_else(|| panic!("no row for {q} in pgqueue.queue_depth"));
    (r.get(0), r.get(1))
}

fn tracked(c: &mut Client, q: &str) -> bool {
    c.query_one("SELECT tracked FROM pgqueue.queue_depth WHERE queue = $1", &[&q]).unwrap().get(0)
}

/// Waits until exactly `n` claims sleep on `q`; returns the queue's wakeups then.
fn until_waiting(c: &mut Client, q: &str, n: i64) -> i64 {
    wait_for(&format!("{n} claims sleeping on {q}"), LIMIT, || {
        let (waiting, wakeups) = depth(c, q);
        (waiting == n).then_some(wakeups)
    })
}

/// A claim of `qty` waiting 50 s on `q` (in a session of its own) sleeps; then `event`
/// makes messages claimable and returns their ids. The waiter must get exactly those, long
/// before its deadline, woken by a signal (the queue's wakeups grew). Returns what it got,
/// (msg_id, attempt).
fn woken_by(q: &str, qty: i32, event: impl FnOnce(&mut Client) -> Vec<i64>) -> Vec<(i64, i32)> {
    let mut c = connect();
    let waiter = waiting_claim(connect(), q, qty, "50 s");
    let before = until_waiting(&mut c, q, 1);
    let mut expected = event(&mut c);
    let out = waiter.join().unwrap();
    let mut got = out.ids();
    got.sort_unstable();
    expected.sort_unstable();
    assert_eq!(got, expected, "the waiter got the messages the event made claimable");
    assert!(out.elapsed < WOKEN, "woken, not timed out: returned after {:?}", out.elapsed);
    let (waiting, after) = depth(&mut c, q);
    assert_eq!(waiting, 0, "the waiter left the sleepers");
    assert!(after > before, "the queue's wakeups grew: {before} -> {after}");
    out.claimed.unwrap()
}

/// The queue works: a waiting claim of another session gets a message sent meanwhile.
fn still_works(q: &str) {
    woken_by(q, 1, |c| vec![send(c, q, json!({}))]);
}

// ---------------------------------------------------------------------------------------
// 1. Woken by each kind of event.

#[test]
fn a_send_wakes_a_waiting_claim() {
    let q = new_queue(&mut connect(), "");
    let got = woken_by(&q, 1, |c| vec![send(c, &q, json!({}))]);
    assert_eq!(got[0].1, 1, "first attempt");
}

#[test]
fn a_batch_send_wakes_a_waiting_claim() {
    let q = new_queue(&mut connect(), "");
    woken_by(&q, 3, |c| {
        c.query("SELECT pgqueue.pgq_send_batch($1, ARRAY['{\"n\": 1}', '{\"n\": 2}', '{\"n\": 3}']::jsonb[])", &[&q])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    });
}

/// A claim woken after waiting longer than the lease gets the whole lease from when it
/// claimed: counted from the statement's start, it would come back already expired (and be
/// re-armed under its consumer). 0.5.0 did that.
#[test]
fn a_lease_runs_from_the_claim_not_from_the_start_of_the_wait() {
    let mut c = connect();
    let q = unique_queue("wait_lease");
    c.execute("SELECT pgqueue.pgq_create_queue($1, lease => '2 s')", &[&q]).unwrap();
    let mut w = connect();
    let queue = q.clone();
    let waiter = thread::spawn(move || -> f64 {
        w.query_one(
            "SELECT extract(epoch FROM lease_expires_at)::float8 FROM pgqueue.pgq_claim($1, wait => '50 s')",
            &[&queue],
        )
        .unwrap()
        .get(0)
    });
    until_waiting(&mut c, &q, 1);
    // Outlast the lease while the claim sleeps, then send.
    let asleep: f64 = c.query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[]).unwrap().get(0);
    wait_for("3 s to pass on the server's clock", LIMIT, || {
        let now: f64 = c.query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[]).unwrap().get(0);
        (now > asleep + 3.0).then_some(())
    });
    let sent_at: f64 = c
        .query_one("SELECT extract(epoch FROM clock_timestamp())::float8 FROM pgqueue.pgq_send($1, '{}')", &[&q])
        .unwrap()
        .get(0);
    let lease_end = waiter.join().unwrap();
    assert!(
        lease_end >= sent_at + 2.0,
        "claimed after the send ({sent_at}), so the 2 s lease ends after {}; it ends at {lease_end}",
        sent_at + 2.0
    );
}

#[test]
fn a_nack_for_now_wakes_a_waiting_claim() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send(&mut c, &q, json!({}));
    let (id, token) = claim_one(&mut c, &q, Some("1 hour")).held();
    let got = woken_by(&q, 1, |c| {
        let nacked: bool = c
            .query_one("SELECT pgqueue.pgq_nack($1::bigint, $2::uuid, retry_in => '0 s')", &[&id, &token])
            .unwrap()
            .get(0);
        assert!(nacked);
        vec![id]
    });
    assert_eq!(got[0].1, 2, "the second attempt");
}

#[test]
fn a_claim_rearmed_by_the_worker_wakes_a_waiting_claim() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send(&mut c, &q, json!({}));
    // Claimed with a long lease, shortened to 1 s only once the waiter sleeps: the waiter
    // cannot take the message by its first attempt, however slowly it starts.
    let (id, token) = claim_one(&mut c, &q, Some("1 hour")).held();
    let got = woken_by(&q, 1, |c| {
        let renewed: bool = c
            .query_one("SELECT pgqueue.pgq_renew($1::bigint, $2::uuid, lease => '1 s')", &[&id, &token])
            .unwrap()
            .get(0);
        assert!(renewed);
        vec![id] // the worker (ticking every 100 ms) re-arms it once the lease ends
    });
    assert_eq!(got[0].1, 2, "the re-armed claim, second attempt");
}

#[test]
fn a_delayed_message_falling_due_wakes_a_waiting_claim() {
    let q = new_queue(&mut connect(), "");
    let mut sent_at = None;
    let started = Instant::now();
    woken_by(&q, 1, |c| {
        sent_at = Some(started.elapsed());
        vec![c.query_one("SELECT pgqueue.pgq_send($1, '{}', delay => '2 s')", &[&q]).unwrap().get(0)]
    });
    // Not before it was due (with margin for clock granularity).
    assert!(
        started.elapsed() >= sent_at.unwrap() + Duration::from_millis(1500),
        "claimed {:?} after the delayed send",
        started.elapsed() - sent_at.unwrap()
    );
}

#[test]
fn a_redrive_wakes_a_waiting_claim() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send(&mut c, &q, json!({}));
    let (id, token) = claim_one(&mut c, &q, Some("1 hour")).held();
    let failed: bool = c.query_one("SELECT pgqueue.pgq_fail($1::bigint, $2::uuid)", &[&id, &token]).unwrap().get(0);
    assert!(failed);
    woken_by(&q, 1, |c| {
        let moved: i64 = c.query_one("SELECT pgqueue.pgq_redrive($1)", &[&q]).unwrap().get(0);
        assert_eq!(moved, 1);
        vec![id]
    });
}

#[test]
fn a_resume_wakes_a_waiting_claim_of_a_paused_queue() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    c.execute("SELECT pgqueue.pgq_pause_queue($1)", &[&q]).unwrap();
    let id = send(&mut c, &q, json!({}));
    let nothing = c.query("SELECT msg_id FROM pgqueue.pgq_claim($1)", &[&q]).unwrap();
    assert!(nothing.is_empty(), "a paused queue gives nothing");
    woken_by(&q, 1, |c| {
        c.execute("SELECT pgqueue.pgq_resume_queue($1)", &[&q]).unwrap();
        vec![id]
    });
}

// ---------------------------------------------------------------------------------------
// 2, 3. Not woken: a rolled-back send; the deadline.

#[test]
fn a_rolled_back_send_wakes_nobody() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let waiter = waiting_claim(connect(), &q, 1, "3 s");
    let before = until_waiting(&mut c, &q, 1);
    let mut p = connect();
    p.batch_execute("BEGIN").unwrap();
    send(&mut p, &q, json!({}));
    p.batch_execute("ROLLBACK").unwrap();
    let out = waiter.join().unwrap();
    assert_eq!(out.ids(), Vec::<i64>::new());
    assert!(out.elapsed >= Duration::from_secs(3), "slept to its deadline: {:?}", out.elapsed);
    assert_eq!(depth(&mut c, &q), (0, before), "no sleeper left, no wake-up");
}

#[test]
fn a_waiting_claim_times_out_with_nothing() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let start = Instant::now();
    let rows = c.query("SELECT msg_id FROM pgqueue.pgq_claim($1, wait => '1 s')", &[&q]).unwrap();
    assert!(rows.is_empty());
    assert!(start.elapsed() >= Duration::from_secs(1), "waited its second: {:?}", start.elapsed());
    assert_eq!(depth(&mut c, &q).0, 0);
}

// ---------------------------------------------------------------------------------------
// 4. Interrupted: statement_timeout, cancel, termination.

#[test]
fn statement_timeout_ends_a_waiting_claim() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let mut s = connect();
    s.batch_execute("SET statement_timeout = '500ms'").unwrap();
    let start = Instant::now();
    let r = s.query("SELECT msg_id FROM pgqueue.pgq_claim($1, wait => '30 s')", &[&q]);
    assert_eq!(sqlstate(r), "57014");
    assert!(start.elapsed() < WOKEN, "ended by the timeout: {:?}", start.elapsed());
    until_waiting(&mut c, &q, 0);
    s.batch_execute("RESET statement_timeout").unwrap();
    let id = send(&mut c, &q, json!({}));
    let got: i64 = s.query_one("SELECT msg_id FROM pgqueue.pgq_claim($1)", &[&q]).unwrap().get(0);
    assert_eq!(got, id, "the timed-out session claims again");
    still_works(&q);
}

/// A waiter sleeping on a new queue, and its backend's pid.
fn sleeping_waiter(c: &mut Client) -> (String, i32, JoinHandle<Outcome>) {
    let q = new_queue(c, "");
    let mut w = connect();
    let pid: i32 = w.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    let waiter = waiting_claim(w, &q, 1, "50 s");
    until_waiting(c, &q, 1);
    (q, pid, waiter)
}

#[test]
fn pg_cancel_backend_ends_a_waiting_claim() {
    let mut c = connect();
    let (q, pid, waiter) = sleeping_waiter(&mut c);
    let signalled: bool = c.query_one("SELECT pg_cancel_backend($1)", &[&pid]).unwrap().get(0);
    assert!(signalled);
    let mut out = waiter.join().unwrap();
    assert!(out.elapsed < WOKEN, "ended by the cancel: {:?}", out.elapsed);
    assert_eq!(sqlstate(out.claimed), "57014");
    until_waiting(&mut c, &q, 0);
    out.client.batch_execute("SELECT 1").expect("the cancelled session goes on");
    still_works(&q);
}

#[test]
fn pg_terminate_backend_ends_a_waiting_claim() {
    let mut c = connect();
    let (q, pid, waiter) = sleeping_waiter(&mut c);
    let signalled: bool = c.query_one("SELECT pg_terminate_backend($1)", &[&pid]).unwrap().get(0);
    assert!(signalled);
    let mut out = waiter.join().unwrap();
    assert!(out.elapsed < WOKEN, "ended by the termination: {:?}", out.elapsed);
    assert!(out.claimed.is_err(), "the claim did not return normally");
    assert!(out.client.batch_execute("SELECT 1").is_err(), "the connection ended");
    until_waiting(&mut c, &q, 0);
    still_works(&q);
}

// ---------------------------------------------------------------------------------------
// 5. No thundering herd.

/// A server of its own, preloading pgqueue with its worker off (its check could add a
/// wake-up), with `queue` created; and a session on it.
fn server_with_queue(queue: &str, max_connections: u32) -> (Server, Client) {
    let _installed = connect();
    let connections = format!("max_connections = {max_connections}");
    let conf = ["shared_preload_libraries = 'pgqueue'", "pgqueue.enabled = off", connections.as_str()];
    let server = Server::init(&bindir(this_major()), &conf);
    server.start();
    let mut c = server.connect("postgres");
    c.batch_execute("CREATE EXTENSION pgqueue").unwrap();
    c.execute("SELECT pgqueue.pgq_create_queue($1)", &[&queue]).unwrap();
    (server, c)
}

/// 64 sleepers on one queue (a server of its own: 64 connections would crowd the shared
/// cluster's max_connections, and its worker's check, which wakes one sleeper when it sees
/// claimable messages while claims sleep, could add a wake-up between the send and the
/// winner's claim). Observed: one send wakes exactly one sleeper (wakeups +1, the other 63
/// never leave their sleep, waiting_claims stays 63); a batch of 63 wakes the 63 others,
/// one message each (wakeups +63).
#[test]
fn one_send_wakes_one_of_64_waiting_claims() {
    let (server, mut c) = server_with_queue("herd", 100);
    let (tx, rx) = mpsc::channel();
    let mut threads = vec![];
    for _ in 0..64 {
        let waiter = waiting_claim(server.connect("postgres"), "herd", 1, "50 s");
        let tx = tx.clone();
        threads.push(thread::spawn(move || tx.send(waiter.join().unwrap()).unwrap()));
    }
    let before = until_waiting(&mut c, "herd", 64);

    let id = send(&mut c, "herd", json!({}));
    let winner = rx.recv_timeout(WOKEN).expect("one waiter returns");
    assert_eq!(winner.ids(), vec![id]);
    assert!(winner.elapsed < WOKEN);
    until_waiting(&mut c, "herd", 63);
    assert_eq!(depth(&mut c, "herd").1, before + 1, "one wake-up for one message");
    // For a moment: nobody else returns, and the 63 others stay asleep.
    assert!(rx.recv_timeout(Duration::from_millis(500)).is_err(), "a second waiter returned");
    assert_eq!(depth(&mut c, "herd"), (63, before + 1));

    let batch: BTreeSet<i64> = c
        .query("SELECT pgqueue.pgq_send_batch('herd', array_fill('{}'::jsonb, ARRAY[63]))", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(batch.len(), 63);
    let mut got = BTreeSet::new();
    for _ in 0..63 {
        let out = rx.recv_timeout(WOKEN).expect("every waiter returns");
        let ids = out.ids();
        assert_eq!(ids.len(), 1, "one message each: {ids:?}");
        assert!(out.elapsed < WOKEN);
        got.extend(ids);
    }
    assert_eq!(got, batch, "each of the 63 got one of the batch");
    assert_eq!(depth(&mut c, "herd"), (0, before + 64));
    for t in threads {
        t.join().unwrap();
    }
}

/// Waiters of `waiting` return until `sent` is all claimed, each long before its deadline; the
/// rest, with nothing left to claim, are cancelled and return holding nothing (cancelling
/// counts no wake-up). Returns how many claimed.
fn claimed_at_once(rx: &mpsc::Receiver<Outcome>, c: &mut Client, sent: &BTreeSet<i64>, waiting: usize) -> usize {
    let mut got = BTreeSet::new();
    let mut returned = 0;
    while got.len() < sent.len() {
        let out = rx.recv_timeout(WOKEN).expect("the messages are claimed, none left to a deadline");
        assert!(out.elapsed < WOKEN);
        got.extend(out.ids());
        returned += 1;
    }
    assert_eq!(&got, sent, "the waiters got what was sent");
    c.batch_execute(
        "SELECT pg_catalog.pg_cancel_backend(pid) FROM pg_catalog.pg_stat_activity
          WHERE state = 'active' AND query LIKE '%pgq_claim%' AND pid <> pg_catalog.pg_backend_pid()",
    )
    .unwrap();
    for _ in returned..waiting {
        let out = rx.recv_timeout(WOKEN).expect("the cancelled waiters return");
        assert!(out.claimed.is_err(), "cancelled, holding nothing");
    }
    returned
}

/// Sleepers are signalled by their claims' sizes, and a woken claim that gets all it asked
/// for signals the next (a server of its own, as above). 8 claims of 10 sleep: a batch of 40
/// signals 4 (wakeups +4), which claim it at once; those they pass the signal on to find
/// nothing and sleep on. Then 3 claims of 1 and one of 9 sleep, in that order: a batch
/// of 4 signals 2 (4 × 4 / 12, rounded up), the two longest sleepers, of 1 each; each then
/// signals the next, so the four messages are claimed at once, none left to a deadline. 0.14.0 signalled one sleeper per message: 40 and 4.
#[test]
fn sleepers_are_signalled_by_qty_and_pass_the_rest_on() {
    let (server, mut c) = server_with_queue("sized", 40);
    let (tx, rx) = mpsc::channel();
    let mut threads = vec![];
    // A claim of `qty` sleeps, the `n`th: the queue's wakeups then.
    let mut sleep = |c: &mut Client, qty: i32, n: i64| {
        let waiter = waiting_claim(server.connect("postgres"), "sized", qty, "50 s");
        let tx = tx.clone();
        threads.push(thread::spawn(move || tx.send(waiter.join().unwrap()).unwrap()));
        until_waiting(c, "sized", n)
    };
    let mut before = 0;
    for n in 1..=8 {
        before = sleep(&mut c, 10, n);
    }
    let batch = |c: &mut Client, n: i32| -> BTreeSet<i64> {
        c.query("SELECT pgqueue.pgq_send_batch('sized', array_fill('{}'::jsonb, ARRAY[$1::int]))", &[&n])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    let sent = batch(&mut c, 40);
    let returned = claimed_at_once(&rx, &mut c, &sent, 8);
    assert_eq!(depth(&mut c, "sized").1, before + 4, "four signals for 40 messages to claims of 10");
    // The four signalled return with 10 each, unless one they passed the signal on to ran first.
    assert!(returned >= 4, "{returned} waiters returned");
    until_waiting(&mut c, "sized", 0);

    for n in 1..=3 {
        sleep(&mut c, 1, n);
    }
    let before = sleep(&mut c, 9, 4);
    let sent = batch(&mut c, 4);
    claimed_at_once(&rx, &mut c, &sent, 4);
    // (Which claims got them depends on who ran first: the claim of 9 may take two.)
    assert_eq!(depth(&mut c, "sized").1, before + 2, "two signals; the rest were passed on");
    for t in threads {
        t.join().unwrap();
    }
}

// ---------------------------------------------------------------------------------------
// 6, 7. Errors; a dropped queue.

#[test]
fn wait_out_of_bounds_or_outside_read_committed_is_refused_and_changes_nothing() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let id = send(&mut c, &q, json!({}));
    let claim_sql = "SELECT msg_id FROM pgqueue.pgq_claim($1, wait => $2::text::interval)";
    for (wait, code) in [("-1 s", "22023"), ("61 s", "22023")] {
        assert_eq!(sqlstate(c.query(claim_sql, &[&q, &wait])), code, "wait => '{wait}'");
    }
    assert_eq!(sqlstate(c.query("SELECT msg_id FROM pgqueue.pgq_claim($1, wait => NULL)", &[&q])), "22004");
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        c.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}")).unwrap();
        assert_eq!(sqlstate(c.query(claim_sql, &[&q, &"1 s"])), "0A000", "wait in {level}");
        c.batch_execute("ROLLBACK").unwrap();
    }
    let state = |c: &mut Client| -> (String, i32) {
        let r = c.query_one("SELECT state, attempt FROM pgqueue.messages WHERE msg_id = $1", &[&id]).unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(state(&mut c), ("ready".to_string(), 0), "the failed calls claimed nothing");
    assert_eq!(depth(&mut c, &q).0, 0, "and left no sleeper");
    // Without waiting, REPEATABLE READ claims as before.
    c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ").unwrap();
    let rows = c.query(claim_sql, &[&q, &"0 s"]).unwrap();
    assert_eq!(rows.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>(), vec![id]);
    c.batch_execute("ROLLBACK").unwrap();
    // The upper bound is allowed (and a claim that finds a message does not wait).
    let rows = c.query(claim_sql, &[&q, &"1 minute"]).unwrap();
    assert_eq!(rows.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>(), vec![id]);
    assert_eq!(state(&mut c), ("claimed".to_string(), 1));
}

#[test]
fn dropping_the_queue_ends_its_waiting_claims_with_42704() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let waiter = waiting_claim(connect(), &q, 1, "50 s");
    until_waiting(&mut c, &q, 1);
    c.execute("SELECT pgqueue.pgq_drop_queue($1)", &[&q]).unwrap();
    let out = waiter.join().unwrap();
    assert!(out.elapsed < WOKEN, "ended by the drop: {:?}", out.elapsed);
    assert_eq!(sqlstate(out.claimed), "42704");
}

// ---------------------------------------------------------------------------------------
// 8. Fallbacks: no shared memory; shared state lost in a restart.

#[test]
fn without_preloading_everything_works_and_waiting_claims_poll() {
    let _installed = connect();
    let server = Server::init(&bindir(this_major()), &[]);
    server.start();
    let mut c = server.connect("postgres");
    c.batch_execute("CREATE EXTENSION pgqueue; SELECT pgqueue.pgq_create_queue('plain')").unwrap();
    let id = send(&mut c, "plain", json!({}));
    let (got, token) = claim_one(&mut c, "plain", Some("1 hour")).held();
    assert_eq!(got, id);
    let acked: bool = c.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&id, &token]).unwrap().get(0);
    assert!(acked);
    let rows: i64 = c.query_one("SELECT count(*) FROM pgqueue.shared_state", &[]).unwrap().get(0);
    assert_eq!(rows, 0, "no shared state without preloading");
    assert!(!tracked(&mut c, "plain"));

    let waiter = waiting_claim(server.connect("postgres"), "plain", 1, "30 s");
    thread::sleep(Duration::from_secs(1));
    let id = send(&mut c, "plain", json!({}));
    let out = waiter.join().unwrap();
    assert_eq!(out.ids(), vec![id]);
    assert!(out.elapsed >= Duration::from_secs(1), "it waited for the send: {:?}", out.elapsed);
    assert!(out.elapsed < Duration::from_secs(20), "and got it by polling: {:?}", out.elapsed);

    // pgq_result waits by polling too.
    send(&mut c, "plain", json!({}));
    let (id, token) = claim_one(&mut c, "plain", Some("1 hour")).held();
    let mut r = server.connect("postgres");
    let awaited = thread::spawn(move || {
        let start = Instant::now();
        let row = r.query_one("SELECT state, result FROM pgqueue.pgq_result($1, wait => '30 s')", &[&id]).unwrap();
        (row.get::<_, String>(0), row.get::<_, Option<serde_json::Value>>(1), start.elapsed())
    });
    thread::sleep(Duration::from_secs(1));
    c.execute("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid, result => '7')", &[&id, &token]).unwrap();
    let (state, result, elapsed) = awaited.join().unwrap();
    assert_eq!((state.as_str(), result), ("completed", Some(json!(7))));
    assert!(elapsed >= Duration::from_secs(1) && elapsed < Duration::from_secs(20), "{elapsed:?}");
    let waiters: i64 = c.query_one("SELECT pgqueue._outcome_waiters()", &[]).unwrap().get(0);
    assert_eq!(waiters, 0, "no slots without preloading");
}

/// With the worker off nothing ticks: the first claim of a new queue checks its hints itself
/// (rather than every claim scanning from the start of the queue until a worker comes: right
/// after CREATE EXTENSION, pgqueue.launcher_naptime), and the claims after it start from them.
/// A claim whose transaction keeps one snapshot does not check: it may not see every commit.
#[test]
fn a_claim_checks_the_hints_that_no_tick_has_checked() {
    let (server, mut c) = server_with_queue("fresh", 20);
    let ids = common::send_many(&mut c, "fresh", 5, "0");
    assert!(!tracked(&mut c, "fresh"), "no tick has checked the new queue");
    let claimed = |rows: Vec<postgres::Row>| rows.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>();

    let mut rr = server.connect("postgres");
    let mut tx = rr.build_transaction().isolation_level(postgres::IsolationLevel::RepeatableRead).start().unwrap();
    assert_eq!(claimed(tx.query("SELECT msg_id FROM pgqueue.pgq_claim('fresh')", &[]).unwrap()), ids[..1]);
    tx.rollback().unwrap();
    assert!(!tracked(&mut c, "fresh"), "a claim with its transaction's one snapshot does not check");

    assert_eq!(claimed(c.query("SELECT msg_id FROM pgqueue.pgq_claim('fresh', 2)", &[]).unwrap()), ids[..2]);
    assert!(tracked(&mut c, "fresh"), "the claim checked the queue's hints");
    assert_eq!(claimed(c.query("SELECT msg_id FROM pgqueue.pgq_claim('fresh', 10)", &[]).unwrap()), ids[2..]);
}

#[test]
fn a_restart_loses_the_shared_state_but_no_message() {
    let _installed = connect();
    let conf = [
        "shared_preload_libraries = 'pgqueue'",
        "pgqueue.tick_interval = '100ms'",
        "pgqueue.launcher_naptime = '200ms'",
    ];
    let server = Server::init(&bindir(this_major()), &conf);
    server.start();
    let mut c = server.connect("postgres");
    c.batch_execute("CREATE EXTENSION pgqueue; SELECT pgqueue.pgq_create_queue('jobs')").unwrap();
    // Claimed (its lease ends during the restart), then ready and delayed ones.
    let claimed = send(&mut c, "jobs", json!({}));
    let (id, _) = claim_one(&mut c, "jobs", Some("1 s")).held();
    assert_eq!(id, claimed);
    let mut all: Vec<i64> = c
        .query("SELECT pgqueue.pgq_send_batch('jobs', array_fill('{}'::jsonb, ARRAY[5]))", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    all.push(c.query_one("SELECT pgqueue.pgq_send('jobs', '{}', delay => '2 s')", &[]).unwrap().get(0));
    all.push(claimed);
    all.sort_unstable();
    wait_for("the worker to check the queue", LIMIT, || tracked(&mut c, "jobs").then_some(()));
    let rows: i64 = c.query_one("SELECT count(*) FROM pgqueue.shared_state", &[]).unwrap().get(0);
    assert_eq!(rows, 1);

    drop(c);
    server.stop();
    server.start();
    let mut c = server.connect("postgres");
    let mut seen = vec![];
    wait_for("every message claimed after the restart", LIMIT, || {
        let rows = c
            .query("SELECT msg_id, claim_token FROM pgqueue.pgq_claim('jobs', qty => 10, wait => '2 s')", &[])
            .unwrap();
        for r in rows {
            let (id, token): (i64, Uuid) = (r.get(0), r.get(1));
            seen.push(id);
            let acked: bool =
                c.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&id, &token]).unwrap().get(0);
            assert!(acked);
        }
        (seen.len() >= all.len()).then_some(())
    });
    let more = c.query("SELECT msg_id FROM pgqueue.pgq_claim('jobs', wait => '1 s')", &[]).unwrap();
    assert!(more.is_empty(), "nothing left to claim: {more:?}");
    seen.sort_unstable();
    assert_eq!(seen, all, "each message claimed exactly once");
    let done: i64 = c
        .query_one("SELECT count(*) FROM pgqueue.history WHERE queue = 'jobs' AND outcome = 'completed'", &[])
        .unwrap()
        .get(0);
    let left: i64 = c.query_one("SELECT count(*) FROM pgqueue.messages WHERE queue = 'jobs'", &[]).unwrap().get(0);
    assert_eq!((done, left), (all.len() as i64, 0), "nothing lost");
    wait_for("the queue tracked again after a tick", LIMIT, || tracked(&mut c, "jobs").then_some(()));
}
