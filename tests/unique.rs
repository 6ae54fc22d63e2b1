//! Unique jobs (0.4.0): `pgq_send(…, dedup_key, dedup_for)` and `pgq_send_batch(…, dedup_keys,
//! dedup_for)` over real, committing connections. While a message with a queue's key waits or
//! runs, a send with that key enqueues nothing and returns the holder's msg_id; finishing the
//! message frees the key (or keeps it for `dedup_for`, after which the worker deletes it).
//!
//! Every check counts rows (messages, keys, who inserted what) rather than timing anything:
//! races are given many chances, and who waited for whom is read from pg_stat_activity.

mod common;

use common::{
    Client, ack, claim_one, connect, connect_as, create_queue, new_queue, outcome, sqlstate, unique_queue, wait_for,
};
use serde_json::{Value, json};
use std::sync::{Arc, Barrier};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------
// Queues, sends and claims

/// A send with `key` (a dedup key), released when its message finishes.
fn send_keyed(c: &mut Client, q: &str, key: &str) -> i64 {
    send_held(c, q, key, "0")
}

/// A send with `key`, kept for `hold` after its message finishes.
fn send_held(c: &mut Client, q: &str, key: &str, hold: &str) -> i64 {
    c.query_one(
        "SELECT pgqueue.pgq_send($1, '{}', dedup_key => $2, dedup_for => $3::text::interval)",
        &[&q, &key, &hold],
    )
    .unwrap()
    .get(0)
}

/// A batch send; the ids in the order the function returned them.
fn send_batch(c: &mut Client, q: &str, payloads: &[Value], keys: &[Option<&str>], extra: &str) -> Vec<i64> {
    c.query(
        &format!(
            "SELECT id FROM pgqueue.pgq_send_batch($1, $2, dedup_keys => $3{extra}) WITH ORDINALITY AS b(id, n)
              ORDER BY n"
        ),
        &[&q, &payloads, &keys],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// Claims the queue's next message and acks it; returns its id.
fn claim_and_ack(c: &mut Client, q: &str) -> i64 {
    let held = claim_one(c, q, None);
    assert!(ack(c, &held), "ack of {}", held.id);
    held.id
}

// ---------------------------------------------------------------------------------------
// What the tables hold

/// The (msg_id, finished) of the key's row in pgqueue.dedup_keys; finished: its expires_at
/// is set (the message finished and the key is kept for its hold).
fn key_row(c: &mut Client, q: &str, key: &str) -> Option<(i64, bool)> {
    c.query_opt(
        "SELECT msg_id, expires_at IS NOT NULL FROM pgqueue.dedup_keys WHERE queue = $1 AND dedup_key = $2",
        &[&q, &key],
    )
    .unwrap()
    .map(|r| (r.get(0), r.get(1)))
}

/// The waiting or claimed messages that carry `key`.
fn copies(c: &mut Client, q: &str, key: &str) -> Vec<i64> {
    c.query("SELECT msg_id FROM pgqueue.messages WHERE queue = $1 AND dedup_key = $2 ORDER BY 1", &[&q, &key])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// (messages, keys) of a queue.
fn counts(c: &mut Client, q: &str) -> (i64, i64) {
    let r = c
        .query_one(
            "SELECT (SELECT count(*) FROM pgqueue.messages WHERE queue = $1),
                    (SELECT count(*) FROM pgqueue.dedup_keys WHERE queue = $1)",
            &[&q],
        )
        .unwrap();
    (r.get(0), r.get(1))
}

/// Asserts that `key` is free in `q`: a send with it enqueues a new message (not `old`), which
/// then holds it. Returns the new id.
fn assert_key_free(c: &mut Client, q: &str, key: &str, old: i64, after: &str) -> i64 {
    let id = send_keyed(c, q, key);
    assert_ne!(id, old, "after {after}, the key is free: a send enqueues a new message");
    assert_eq!(copies(c, q, key), vec![id], "after {after}: the new message is the only one with the key");
    assert_eq!(key_row(c, q, key), Some((id, false)), "after {after}: the new message holds the key");
    id
}

// ---------------------------------------------------------------------------------------
// Concurrent senders

/// A keyed send in a transaction of its own: (the msg_id it returned, whether this
/// transaction inserted that message).
fn send_in_transaction(c: &mut Client, q: &str, key: &str, start: Option<&Barrier>) -> (i64, bool) {
    let mut tx = c.transaction().unwrap();
    if let Some(start) = start {
        start.wait();
    }
    let id: i64 = tx.query_one("SELECT pgqueue.pgq_send($1, '{}', dedup_key => $2)", &[&q, &key]).unwrap().get(0);
    // Whoever enqueued it wrote the row: its xmin is that transaction's.
    let mine: bool = tx
        .query_one("SELECT xmin = pg_current_xact_id()::xid FROM pgqueue.message_rows WHERE msg_id = $1", &[&id])
        .unwrap()
        .get(0);
    tx.commit().unwrap();
    (id, mine)
}

/// `n` sessions, named `app`, that each send `key` in a transaction of their own while another
/// session's open transaction holds it: returns them once all of them wait for that one.
fn senders_blocked_behind(
    c: &mut Client,
    q: &str,
    key: &str,
    app: &str,
    n: usize,
) -> Vec<std::thread::JoinHandle<(i64, bool)>> {
    let senders: Vec<_> = (0..n)
        .map(|_| {
            let (q, key, app) = (q.to_string(), key.to_string(), app.to_string());
            std::thread::spawn(move || {
                let mut s = connect();
                s.execute("SELECT set_config('application_name', $1, false)", &[&app]).unwrap();
                send_in_transaction(&mut s, &q, &key, None)
            })
        })
        .collect();
    wait_for("every sender waiting for the holder's transaction", LIMIT, || {
        let waiting: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
                &[&app],
            )
            .unwrap()
            .get(0);
        (waiting == n as i64).then_some(())
    });
    senders
}

#[test]
fn sixteen_sessions_sending_one_key_at_once_enqueue_one_message() {
    const SESSIONS: usize = 16;
    const ROUNDS: usize = 20;
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let start = Arc::new(Barrier::new(SESSIONS));
    let sessions: Vec<_> = (0..SESSIONS)
        .map(|_| {
            let (q, start) = (q.clone(), start.clone());
            std::thread::spawn(move || {
                let mut s = connect();
                (0..ROUNDS).map(|round| send_in_transaction(&mut s, &q, &format!("k{round}"), Some(&start))).collect()
            })
        })
        .collect();
    let results: Vec<Vec<(i64, bool)>> = sessions.into_iter().map(|s| s.join().unwrap()).collect();
    for round in 0..ROUNDS {
        let key = format!("k{round}");
        let ids: Vec<i64> = results.iter().map(|r| r[round].0).collect();
        let enqueued = results.iter().filter(|r| r[round].1).count();
        assert_eq!(enqueued, 1, "{key}: exactly one of the sessions enqueued");
        assert!(ids.iter().all(|&id| id == ids[0]), "{key}: every session got the same msg_id: {ids:?}");
        assert_eq!(copies(&mut c, &q, &key), vec![ids[0]], "{key}: one message");
        assert_eq!(key_row(&mut c, &q, &key), Some((ids[0], false)), "{key}: held by it");
    }
    assert_eq!(counts(&mut c, &q), (ROUNDS as i64, ROUNDS as i64), "one message and one key per round");
}

#[test]
fn sends_wait_for_an_open_holder_and_get_its_id_when_it_commits() {
    const WAITERS: usize = 15;
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let mut holder = connect();
    holder.batch_execute("BEGIN").unwrap();
    let held = send_keyed(&mut holder, &q, "k");
    let waiters = senders_blocked_behind(&mut c, &q, "k", &format!("{q}_commit"), WAITERS);
    holder.batch_execute("COMMIT").unwrap();
    let got: Vec<(i64, bool)> = waiters.into_iter().map(|w| w.join().unwrap()).collect();
    assert_eq!(got, vec![(held, false); WAITERS], "every waiter got the holder's id and enqueued nothing");
    assert_eq!(copies(&mut c, &q, "k"), vec![held]);
    assert_eq!(counts(&mut c, &q), (1, 1));
}

#[test]
fn a_rolled_back_holder_lets_exactly_one_waiter_enqueue() {
    const WAITERS: usize = 15;
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let mut holder = connect();
    holder.batch_execute("BEGIN").unwrap();
    let gone = send_keyed(&mut holder, &q, "k");
    let waiters = senders_blocked_behind(&mut c, &q, "k", &format!("{q}_rollback"), WAITERS);
    holder.batch_execute("ROLLBACK").unwrap();
    let got: Vec<(i64, bool)> = waiters.into_iter().map(|w| w.join().unwrap()).collect();
    assert_eq!(got.iter().filter(|(_, mine)| *mine).count(), 1, "exactly one waiter enqueued: {got:?}");
    let winner = got.iter().find(|(_, mine)| *mine).unwrap().0;
    assert_ne!(winner, gone, "the rolled-back message holds nothing");
    assert!(got.iter().all(|(id, _)| *id == winner), "the others got the winner's id: {got:?}");
    assert_eq!(copies(&mut c, &q, "k"), vec![winner]);
    assert_eq!(key_row(&mut c, &q, "k"), Some((winner, false)));
    assert_eq!(counts(&mut c, &q), (1, 1));
}

// ---------------------------------------------------------------------------------------
// The key's life: held while the message waits or runs, freed (or kept) when it finishes

#[test]
fn a_keyed_send_returns_the_waiting_or_claimed_holder() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let first = send_keyed(&mut c, &q, "k");
    assert_eq!(send_keyed(&mut c, &q, "k"), first, "while it waits");
    let delayed: i64 =
        c.query_one("SELECT pgqueue.pgq_send($1, '{}', delay => '1 hour', dedup_key => 'd')", &[&q]).unwrap().get(0);
    assert_eq!(send_keyed(&mut c, &q, "d"), delayed, "while it is delayed");
    let claimed = claim_one(&mut c, &q, None).held();
    assert_eq!(claimed.0, first);
    assert_eq!(send_keyed(&mut c, &q, "k"), first, "while it is claimed");
    assert_eq!(counts(&mut c, &q), (2, 2), "no second copy of either");
}

#[test]
fn the_key_is_freed_when_its_message_finishes() {
    let mut c = connect();
    // Ack and fail.
    let q = new_queue(&mut c, "");
    let id = send_keyed(&mut c, &q, "acked");
    assert_eq!(claim_and_ack(&mut c, &q), id);
    assert_eq!(key_row(&mut c, &q, "acked"), None, "an ack deletes the key (no hold)");
    let again = assert_key_free(&mut c, &q, "acked", id, "an ack");
    assert_eq!(claim_and_ack(&mut c, &q), again);

    let id = send_keyed(&mut c, &q, "failed");
    let (m, token) = claim_one(&mut c, &q, None).held();
    c.execute("SELECT pgqueue.pgq_fail($1, $2)", &[&m, &token]).unwrap();
    assert_eq!(outcome(&mut c, id).as_deref(), Some("dead"));
    assert_key_free(&mut c, &q, "failed", id, "pgq_fail");

    // Nack on the last attempt, and an expired lease on the last attempt (re-arm to dead).
    let last = new_queue(&mut c, ", max_attempts => 1");
    let id = send_keyed(&mut c, &last, "nacked");
    let (m, token) = claim_one(&mut c, &last, None).held();
    c.execute("SELECT pgqueue.pgq_nack($1, $2, retry_in => '0')", &[&m, &token]).unwrap();
    assert_eq!(outcome(&mut c, id).as_deref(), Some("dead"), "nacked on its last attempt");
    let again = assert_key_free(&mut c, &last, "nacked", id, "a nack on the last attempt");
    assert_eq!(claim_and_ack(&mut c, &last), again);

    let id = send_keyed(&mut c, &last, "expired");
    let r = c.query_one("SELECT msg_id FROM pgqueue.pgq_claim($1, lease => '100 ms')", &[&last]).unwrap();
    assert_eq!(r.get::<_, i64>(0), id);
    wait_for("the expired claim dead-lettered", LIMIT, || {
        // The worker re-arms it; so may this session (whoever comes first, once).
        c.execute("SELECT pgqueue.pgq_rearm(queue => $1)", &[&last]).unwrap();
        outcome(&mut c, id).filter(|o| o == "dead")
    });
    let new = assert_key_free(&mut c, &last, "expired", id, "a re-arm to dead letter");

    // The dead letter redriven comes back without its key: it does not take the key from the
    // new holder, and finishing it leaves the new holder's key alone.
    let back: i64 = c.query_one("SELECT pgqueue.pgq_redrive($1, ARRAY[$2::bigint])", &[&last, &id]).unwrap().get(0);
    assert_eq!(back, 1);
    let key: Option<String> =
        c.query_one("SELECT dedup_key FROM pgqueue.messages WHERE msg_id = $1", &[&id]).unwrap().get(0);
    assert_eq!(key, None, "the redriven message carries no key");
    assert_eq!(send_keyed(&mut c, &last, "expired"), new, "the new holder keeps the key");
    let redriven = claim_one(&mut c, &last, None);
    assert_eq!(redriven.id, id, "FIFO: the redriven message (the lower id) first");
    assert!(ack(&mut c, &redriven), "ack of {}", redriven.id);
    assert_eq!(key_row(&mut c, &last, "expired"), Some((new, false)), "the redriven message's ack frees nothing");
    assert_eq!(copies(&mut c, &last, "expired"), vec![new]);
}

#[test]
fn a_nack_that_retries_keeps_the_key() {
    let mut c = connect();
    let q = new_queue(&mut c, ", max_attempts => 3");
    let id = send_keyed(&mut c, &q, "k");
    let (m, token) = claim_one(&mut c, &q, None).held();
    c.execute("SELECT pgqueue.pgq_nack($1, $2, retry_in => '0')", &[&m, &token]).unwrap();
    assert_eq!(send_keyed(&mut c, &q, "k"), id, "after a retrying nack (ready again)");
    let (m, token) = claim_one(&mut c, &q, None).held();
    assert_eq!(m, id);
    c.execute("SELECT pgqueue.pgq_nack($1, $2, retry_in => '1 hour')", &[&m, &token]).unwrap();
    assert_eq!(send_keyed(&mut c, &q, "k"), id, "after a retrying nack (delayed)");
    assert_eq!(key_row(&mut c, &q, "k"), Some((id, false)));
    assert_eq!(counts(&mut c, &q), (1, 1), "no second copy");
}

#[test]
fn dedup_for_keeps_the_key_after_the_finish_until_it_expires_and_the_worker_deletes_it() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let expired_before: i64 = c.query_one("SELECT keys_expired FROM pgqueue.worker_stats", &[]).unwrap().get(0);
    // resent: sent again in and after its window; expiring: left to the worker; kept: a long
    // hold, finished; waiting: never finished. All but waiting are claimed and acked.
    let resent = send_held(&mut c, &q, "resent", "2 s");
    let expiring = send_held(&mut c, &q, "expiring", "2 s");
    let kept = send_held(&mut c, &q, "kept", "1 hour");
    for id in [resent, expiring, kept] {
        assert_eq!(claim_and_ack(&mut c, &q), id);
    }
    let waiting = send_held(&mut c, &q, "waiting", "2 s");
    assert_eq!(key_row(&mut c, &q, "resent"), Some((resent, true)), "kept after the ack, with an end");
    assert_eq!(key_row(&mut c, &q, "expiring"), Some((expiring, true)));
    assert_eq!(key_row(&mut c, &q, "waiting"), Some((waiting, false)), "no end while it waits");

    assert_eq!(send_keyed(&mut c, &q, "resent"), resent, "within the window: the finished message's id");
    assert_eq!(copies(&mut c, &q, "resent"), Vec::<i64>::new(), "and nothing enqueued");

    std::thread::sleep(Duration::from_millis(2500));
    let again = send_keyed(&mut c, &q, "resent");
    assert_ne!(again, resent, "after the window: a new message");
    assert_eq!(copies(&mut c, &q, "resent"), vec![again]);
    assert_eq!(key_row(&mut c, &q, "resent"), Some((again, false)), "held by the new message, without an end");

    wait_for("the worker deleting the expired key", LIMIT, || key_row(&mut c, &q, "expiring").is_none().then_some(()));
    wait_for("the worker counting it", LIMIT, || {
        let n: i64 = c.query_one("SELECT keys_expired FROM pgqueue.worker_stats", &[]).unwrap().get(0);
        (n > expired_before).then_some(())
    });
    assert_eq!(key_row(&mut c, &q, "kept"), Some((kept, true)), "a hold not yet over stays");
    assert_eq!(key_row(&mut c, &q, "waiting"), Some((waiting, false)), "a waiting message's key stays");
    assert_eq!(send_keyed(&mut c, &q, "kept"), kept);
}

#[test]
fn a_rolled_back_send_holds_nothing() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    c.batch_execute("BEGIN").unwrap();
    let gone = send_keyed(&mut c, &q, "k");
    c.batch_execute("ROLLBACK").unwrap();
    assert_eq!(counts(&mut c, &q), (0, 0));
    assert_key_free(&mut c, &q, "k", gone, "a rolled-back send");

    // Nor does one rolled back to a savepoint: the same transaction takes the key afresh.
    c.batch_execute("BEGIN; SAVEPOINT s").unwrap();
    let gone = send_keyed(&mut c, &q, "s");
    c.batch_execute("ROLLBACK TO SAVEPOINT s").unwrap();
    let id = send_keyed(&mut c, &q, "s");
    c.batch_execute("COMMIT").unwrap();
    assert_ne!(id, gone);
    assert_eq!(copies(&mut c, &q, "s"), vec![id]);
    assert_eq!(key_row(&mut c, &q, "s"), Some((id, false)));
}

#[test]
fn keys_are_per_queue() {
    let mut c = connect();
    let (q1, q2) = (new_queue(&mut c, ""), new_queue(&mut c, ""));
    let a = send_keyed(&mut c, &q1, "k");
    let b = send_keyed(&mut c, &q2, "k");
    assert_ne!(a, b, "the same key in another queue is another key");
    assert_eq!((copies(&mut c, &q1, "k"), copies(&mut c, &q2, "k")), (vec![a], vec![b]));
    assert_eq!(claim_and_ack(&mut c, &q1), a);
    assert_eq!(send_keyed(&mut c, &q2, "k"), b, "finishing one queue's holder leaves the other's key held");
}

// ---------------------------------------------------------------------------------------
// Batches

#[test]
fn batch_sends_return_ids_in_array_order_with_duplicates_and_nulls() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let earlier = send_keyed(&mut c, &q, "held");
    let payloads: Vec<Value> = (0..6).map(|n| json!({ "n": n })).collect();
    let keys = [Some("a"), None, Some("a"), Some("held"), Some("b"), None];
    let ids = send_batch(&mut c, &q, &payloads, &keys, "");
    assert_eq!(ids.len(), 6, "one id per payload: {ids:?}");
    assert_eq!(ids[2], ids[0], "a key repeated in the batch returns the first one's id");
    assert_eq!(ids[3], earlier, "a key already held returns the holder's id");
    let new = [ids[0], ids[1], ids[4], ids[5]];
    assert!(new.windows(2).all(|w| w[0] < w[1]), "new messages enqueued in array order: {ids:?}");
    assert!(new.iter().all(|&id| id > earlier), "{ids:?}");
    // Each new message is its element: payload and key.
    for (i, &id) in ids.iter().enumerate().filter(|(i, _)| [0, 1, 4, 5].contains(i)) {
        let r = c.query_one("SELECT payload, dedup_key FROM pgqueue.messages WHERE msg_id = $1", &[&id]).unwrap();
        let (payload, key): (Value, Option<String>) = (r.get(0), r.get(1));
        assert_eq!((payload, key.as_deref()), (json!({ "n": i }), keys[i]), "element {i}");
    }
    assert_eq!(counts(&mut c, &q), (5, 3), "held + four new; keys held, a, b");
    assert_eq!(key_row(&mut c, &q, "a"), Some((ids[0], false)));
    assert_eq!(key_row(&mut c, &q, "b"), Some((ids[4], false)));

    // Only NULL keys: plain messages, no key taken.
    let plain = send_batch(&mut c, &q, &payloads[..2], &[None, None], "");
    assert_eq!(plain.len(), 2);
    assert_eq!(counts(&mut c, &q), (7, 3));

    // The keyed path applies delay, priority and headers to every message it enqueues.
    let delayed = send_batch(
        &mut c,
        &q,
        &payloads[..2],
        &[Some("x"), Some("y")],
        ", delay => '1 hour', priority => 7::smallint, headers => '{\"h\": 1}'",
    );
    let shape: Vec<(String, i16, Option<Value>)> = c
        .query(
            "SELECT state, priority, headers FROM pgqueue.messages WHERE msg_id = ANY ($1) ORDER BY msg_id",
            &[&delayed],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(shape, vec![("delayed".into(), 7, Some(json!({ "h": 1 }))); 2]);
}

// ---------------------------------------------------------------------------------------
// Bad input

#[test]
fn every_bad_dedup_argument_is_refused_and_changes_nothing() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let held = send_keyed(&mut c, &q, "held");
    let before = counts(&mut c, &q);
    let long = "x".repeat(513);
    // Calls, by their arguments after the queue; batches of two payloads.
    let single = |args: &str| format!("pgq_send('{q}', '{{}}'{args})");
    let batch = |args: &str| format!("pgq_send_batch('{q}', ARRAY['{{}}', '{{}}']::jsonb[]{args})");
    let cases: Vec<(&str, String, &str)> = vec![
        ("empty key", single(", dedup_key => ''"), "22023"),
        ("513 characters", single(&format!(", dedup_key => '{long}'")), "22023"),
        ("NULL hold", single(", dedup_key => 'new', dedup_for => NULL"), "22004"),
        ("NULL hold, no key", single(", dedup_for => NULL"), "22004"),
        ("negative hold", single(", dedup_key => 'new', dedup_for => '-1 s'"), "22023"),
        ("negative hold, no key", single(", dedup_for => '-1 s'"), "22023"),
        ("hold over a year", single(", dedup_key => 'new', dedup_for => '366 days'"), "22023"),
        ("batch: empty key", batch(", dedup_keys => ARRAY['new', '']"), "22023"),
        ("batch: 513 characters", batch(&format!(", dedup_keys => ARRAY['new', '{long}']")), "22023"),
        ("batch: a held key, then a bad one", batch(", dedup_keys => ARRAY['held', '']"), "22023"),
        ("batch: fewer keys", batch(", dedup_keys => ARRAY['new']"), "22023"),
        ("batch: more keys", batch(", dedup_keys => ARRAY['new', 'a', 'b']"), "22023"),
        ("batch: an empty key array", batch(", dedup_keys => ARRAY[]::text[]"), "22023"),
        ("batch: NULL hold", batch(", dedup_keys => ARRAY['new', 'a'], dedup_for => NULL"), "22004"),
        ("batch: NULL hold, no keys", batch(", dedup_for => NULL"), "22004"),
        ("batch: negative hold", batch(", dedup_keys => ARRAY['new', 'a'], dedup_for => '-1 s'"), "22023"),
        ("batch: negative hold, no keys", batch(", dedup_for => '-1 s'"), "22023"),
        ("batch: hold over a year", batch(", dedup_keys => ARRAY['new', 'a'], dedup_for => '366 days'"), "22023"),
    ];
    for (what, call, code) in &cases {
        assert_eq!(sqlstate(c.query(&format!("SELECT * FROM pgqueue.{call}"), &[])), *code, "{what}");
        assert_eq!(counts(&mut c, &q), before, "{what}: nothing changed");
    }
    assert_eq!(key_row(&mut c, &q, "new"), None);
    assert_eq!(send_keyed(&mut c, &q, "held"), held, "the held key is still held by its message");

    // The limits themselves are accepted.
    let longest = "x".repeat(512);
    let id = send_held(&mut c, &q, &longest, "365 days");
    assert_eq!(key_row(&mut c, &q, &longest), Some((id, false)), "a key of 512 characters, held for 365 days");
}

// ---------------------------------------------------------------------------------------
// Cost, drop, privileges

/// This transaction's (inserts, updates, deletes, index scans, sequential scans) of
/// pgqueue.dedup_keys so far.
fn dedup_keys_touched(c: &mut Client) -> (i64, i64, i64, i64, i64) {
    let r = c
        .query_one(
            "SELECT n_tup_ins, n_tup_upd, n_tup_del, coalesce(idx_scan, 0), coalesce(seq_scan, 0)
               FROM pg_stat_xact_user_tables WHERE schemaname = 'pgqueue' AND relname = 'dedup_keys'",
            &[],
        )
        .unwrap();
    (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))
}

#[test]
fn sends_and_finishes_without_a_key_never_touch_the_key_table() {
    let mut c = connect();
    let q = new_queue(&mut c, ", max_attempts => 3");
    for _ in 0..3 {
        c.execute("SELECT pgqueue.pgq_send($1, '{}')", &[&q]).unwrap();
    }
    c.batch_execute("BEGIN").unwrap();
    c.execute("SELECT pgqueue.pgq_send($1, '{}')", &[&q]).unwrap();
    c.execute("SELECT pgqueue.pgq_send_batch($1, ARRAY['{}', '{}']::jsonb[])", &[&q]).unwrap();
    claim_and_ack(&mut c, &q);
    let (m, token) = claim_one(&mut c, &q, None).held();
    c.execute("SELECT pgqueue.pgq_fail($1, $2)", &[&m, &token]).unwrap();
    let (m, token) = claim_one(&mut c, &q, None).held();
    c.execute("SELECT pgqueue.pgq_nack($1, $2)", &[&m, &token]).unwrap();
    assert_eq!(dedup_keys_touched(&mut c), (0, 0, 0, 0, 0), "no key, no access to pgqueue.dedup_keys");
    c.batch_execute("COMMIT").unwrap();

    // The same with a key does touch it (so the assertion above can fail).
    let keyed = new_queue(&mut c, "");
    c.batch_execute("BEGIN").unwrap();
    let id = send_keyed(&mut c, &keyed, "k");
    let held = claim_one(&mut c, &keyed, None);
    assert_eq!(held.id, id);
    assert!(ack(&mut c, &held), "ack of {}", held.id);
    let (ins, _, del, idx, seq) = dedup_keys_touched(&mut c);
    c.batch_execute("COMMIT").unwrap();
    assert!(ins > 0 && del > 0 && idx + seq > 0, "a keyed send and ack use the table: {:?}", (ins, del, idx, seq));
}

#[test]
fn dropping_a_queue_removes_its_keys_and_a_new_queue_of_that_name_starts_afresh() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let other = new_queue(&mut c, "");
    let kept = send_held(&mut c, &q, "kept", "1 hour");
    assert_eq!(claim_and_ack(&mut c, &q), kept);
    let claimed = send_keyed(&mut c, &q, "claimed");
    assert_eq!(claim_one(&mut c, &q, None).id, claimed);
    let waiting = send_keyed(&mut c, &q, "waiting");
    let elsewhere = send_keyed(&mut c, &other, "waiting");
    assert_eq!(counts(&mut c, &q), (2, 3), "a kept, a claimed and a waiting key");

    c.execute("SELECT pgqueue.pgq_drop_queue($1, force => true)", &[&q]).unwrap();
    assert_eq!(counts(&mut c, &q), (0, 0), "the queue's messages and keys are gone");
    assert_eq!(key_row(&mut c, &other, "waiting"), Some((elsewhere, false)), "another queue's same key stays");

    create_queue(&mut c, &q, "");
    for (key, old) in [("kept", kept), ("claimed", claimed), ("waiting", waiting)] {
        let id = send_keyed(&mut c, &q, key);
        assert!(id > old, "{key}: the re-created queue enqueues it anew ({id} after {old})");
    }
    assert_eq!(counts(&mut c, &q), (3, 3));
}

#[test]
fn a_producer_sends_with_keys_but_cannot_read_the_key_table() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let role = unique_queue("uniq_producer");
    let db: String = c.query_one("SELECT current_database()::text", &[]).unwrap().get(0);
    c.batch_execute(&format!("CREATE ROLE {role} LOGIN IN ROLE pgqueue_producer")).unwrap();
    {
        let mut p = connect_as(&role, &db);
        let id = send_keyed(&mut p, &q, "k");
        assert_eq!(send_held(&mut p, &q, "k", "1 hour"), id, "the producer's second send returns the holder");
        let ids = send_batch(&mut p, &q, &[json!({}), json!({})], &[Some("k"), Some("b")], ", dedup_for => '1 s'");
        assert_eq!(ids[0], id);
        assert!(ids[1] > id);
        assert_eq!(sqlstate(p.query("SELECT * FROM pgqueue.dedup_keys", &[])), "42501", "the table stays closed");
        assert_eq!(
            sqlstate(p.query("SELECT pgqueue._take_key($1, 'x', 1, '0')", &[&q])),
            "42501",
            "and so does the internal function behind the send"
        );
    }
    assert_eq!(counts(&mut c, &q), (2, 2));
    c.batch_execute(&format!("DROP ROLE {role}")).unwrap();
}
