//! Concurrency, proven with many real connections: no double claim, no loss, re-arm
//! exactly once, and fencing of stale claim tokens.

use crate::common::{Client, claim_all, held, new_queue, send_many};
use crate::connect;
use std::collections::HashSet;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;
use uuid::Uuid;

fn rearm(c: &mut Client, q: &str, max_rows: i32) -> (i64, i64) {
    let row = c.query_one("SELECT * FROM pgqueue.pgq_rearm($1, queue => $2)", &[&max_rows, &q]).unwrap();
    (row.get(0), row.get(1))
}

#[test]
fn sixteen_claimers_drain_ten_thousand_exactly_once() {
    const MESSAGES: usize = 10_000;
    const CLAIMERS: usize = 16;
    let mut c = connect();
    let q = new_queue(&mut c, ", lease => '10 min'");
    send_many(&mut c, &q, MESSAGES, "0");

    let claimed = Arc::new(Mutex::new(Vec::<i64>::new()));
    let acked = Arc::new(Mutex::new(Vec::<i64>::new()));
    let start = Arc::new(Barrier::new(CLAIMERS));
    let workers: Vec<_> = (0..CLAIMERS)
        .map(|w| {
            let (q, claimed, acked, start) = (q.clone(), claimed.clone(), acked.clone(), start.clone());
            std::thread::spawn(move || {
                let mut c = connect();
                start.wait();
                let qty = 1 + (w % 8) as i32; // a mix of single and batch claimers
                loop {
                    let rows = c
                        .query(
                            "SELECT msg_id, claim_token FROM pgqueue.pgq_claim($1, $2, consumer => $3)",
                            &[&q, &qty, &format!("w{w}")],
                        )
                        .unwrap();
                    if rows.is_empty() {
                        break;
                    }
                    let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
                    let tokens: Vec<Uuid> = rows.iter().map(|r| r.get(1)).collect();
                    claimed.lock().unwrap().extend(&ids);
                    let done: Vec<i64> = c
                        .query("SELECT * FROM pgqueue.pgq_ack($1::bigint[], $2::uuid[])", &[&ids, &tokens])
                        .unwrap()
                        .iter()
                        .map(|r| r.get(0))
                        .collect();
                    acked.lock().unwrap().extend(done);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let claimed = claimed.lock().unwrap();
    let acked = acked.lock().unwrap();
    let distinct: HashSet<_> = claimed.iter().collect();
    assert_eq!(claimed.len(), MESSAGES, "every message claimed once, none twice");
    assert_eq!(distinct.len(), MESSAGES);
    assert_eq!(acked.len(), MESSAGES, "every claim acked exactly once");
    let left: i64 = c.query_one("SELECT count(*) FROM pgqueue.messages WHERE queue = $1", &[&q]).unwrap().get(0);
    let done: i64 = c
        .query_one(
            "SELECT count(DISTINCT msg_id) FROM pgqueue.history WHERE queue = $1 AND outcome = 'completed'",
            &[&q],
        )
        .unwrap()
        .get(0);
    assert_eq!((left, done), (0, MESSAGES as i64), "nothing lost, nothing left behind");
}

#[test]
fn four_rearmers_rearm_each_expired_claim_once_and_never_a_live_one() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send_many(&mut c, &q, 2000, "0");
    let expired = held(&claim_all(&mut c, &q, Some("50 ms")));
    send_many(&mut c, &q, 500, "0");
    let live = held(&claim_all(&mut c, &q, Some("1 hour")));
    assert_eq!((expired.len(), live.len()), (2000, 500));
    std::thread::sleep(Duration::from_millis(100));

    let start = Arc::new(Barrier::new(4));
    let sessions: Vec<_> = (0..4)
        .map(|_| {
            let (q, start) = (q.clone(), start.clone());
            std::thread::spawn(move || {
                let mut c = connect();
                start.wait();
                let mut total = 0;
                loop {
                    let (rearmed, dead) = rearm(&mut c, &q, 97);
                    assert_eq!(dead, 0);
                    if rearmed == 0 {
                        return total;
                    }
                    total += rearmed;
                }
            })
        })
        .collect();
    let total: i64 = sessions.into_iter().map(|s| s.join().unwrap()).sum();
    assert_eq!(total, 2000, "each expired claim re-armed exactly once across 4 sessions");
    assert_eq!(rearm(&mut c, &q, 5000), (0, 0), "idempotent: nothing left to re-arm");

    let ids: Vec<i64> = live.iter().map(|h| h.0).collect();
    let tokens: Vec<Uuid> = live.iter().map(|h| h.1).collect();
    let still: i64 = c
        .query_one(
            "SELECT count(*) FROM pgqueue.messages m JOIN unnest($1::bigint[], $2::uuid[]) AS l(id, t)
                 ON m.msg_id = l.id AND m.claim_token = l.t AND m.state = 'claimed'",
            &[&ids, &tokens],
        )
        .unwrap()
        .get(0);
    assert_eq!(still, 500, "live leases untouched");
    let ready: i64 = c
        .query_one("SELECT count(*) FROM pgqueue.messages WHERE queue = $1 AND state = 'ready' AND attempt = 1", &[&q])
        .unwrap()
        .get(0);
    assert_eq!(ready, 2000);
}

#[test]
fn a_stale_token_is_fenced_off_after_rearm_and_reclaim() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    c.execute("SELECT pgqueue.pgq_send($1, '{}')", &[&q]).unwrap();
    let old = held(&claim_all(&mut c, &q, Some("20 ms")))[0];
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(rearm(&mut c, &q, 10), (1, 0));
    let new = held(&claim_all(&mut c, &q, Some("1 hour")))[0];
    assert_eq!(old.0, new.0);
    assert_ne!(old.1, new.1, "every claim gets a new token");
    let stale: Vec<bool> = [
        "SELECT pgqueue.pgq_renew($1::bigint, $2::uuid)",
        "SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)",
        "SELECT pgqueue.pgq_nack($1, $2)",
        "SELECT pgqueue.pgq_fail($1, $2)",
    ]
    .iter()
    .map(|sql| c.query_one(*sql, &[&old.0, &old.1]).unwrap().get(0))
    .collect();
    assert_eq!(stale, [false; 4], "renew, ack, nack and fail all refuse the old token");
    let ok: bool = c.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&new.0, &new.1]).unwrap().get(0);
    assert!(ok, "the current holder still acks");
}

#[test]
fn poison_message_ends_in_dead_letter_and_redrive_brings_it_back() {
    let mut c = connect();
    let q = new_queue(&mut c, ", max_attempts => 3");
    let id: i64 = c.query_one("SELECT pgqueue.pgq_send($1, '{\"poison\": true}')", &[&q]).unwrap().get(0);
    for attempt in 1..=3 {
        let held = held(&claim_all(&mut c, &q, Some("20 ms")));
        assert_eq!(held.len(), 1, "attempt {attempt} claims it");
        std::thread::sleep(Duration::from_millis(40));
        let expected = if attempt < 3 { (1, 0) } else { (0, 1) };
        assert_eq!(rearm(&mut c, &q, 10), expected, "attempt {attempt}");
    }
    let outcome: String = c.query_one("SELECT outcome FROM pgqueue.history WHERE msg_id = $1", &[&id]).unwrap().get(0);
    assert_eq!(outcome, "dead");
    assert!(held(&claim_all(&mut c, &q, Some("1 s"))).is_empty());
    let n: i64 = c.query_one("SELECT pgqueue.pgq_redrive($1)", &[&q]).unwrap().get(0);
    assert_eq!(n, 1);
    let back = held(&claim_all(&mut c, &q, Some("1 hour")));
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].0, id);
}

/// A claim handed a row that another transaction holds locked skips it (a stale ack, nack or
/// renew whose row changed under its snapshot keeps such a lock until it ends, refused).
/// Once that transaction ends, the next claim gets the row: with the worker off, no tick's
/// check brings the claim hint back to it (the cancel race once left a message so).
#[test]
fn a_row_skipped_because_another_transaction_held_it_is_claimed_once_that_ends() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let ids = send_many(&mut c, &q, 2, "0");
    // A first claim: the queue's hints are checked, then raised past what it takes.
    let first = crate::common::claim(&mut c, &q, 1, None);
    assert_eq!(crate::common::ids(&first), vec![ids[0]]);
    for end in ["ROLLBACK", "COMMIT"] {
        let mut holder = connect();
        holder.batch_execute("BEGIN").unwrap();
        holder.execute("SELECT FROM pgqueue.message_rows WHERE msg_id = $1 FOR UPDATE", &[&ids[1]]).unwrap();
        assert!(crate::common::claim(&mut c, &q, 1, None).is_empty(), "the locked row is skipped");
        holder.batch_execute(end).unwrap();
        let next = crate::common::claim(&mut c, &q, 1, None);
        assert_eq!(crate::common::ids(&next), vec![ids[1]], "claimed once the holder ended ({end})");
        c.execute("SELECT pgqueue.pgq_nack($1, $2, retry_in => '0')", &[&ids[1], &next[0].held().1]).unwrap();
    }
}

/// A claim that passed over a row another transaction held goes on from the claim hints
/// for the rest of its transaction: the row is looked at again after it commits, but the
/// transaction made nothing claimable itself, so its claims need not scan from the start of
/// the queue (0.24.0's did, and with the claim ledger on, each then met every row in flight:
/// 64 consumers made a seventh of the jobs a second of the ledger off).
#[test]
fn a_claim_that_passed_over_a_locked_row_keeps_its_hints() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let ids = send_many(&mut c, &q, 3, "0");
    let first = crate::common::claim(&mut c, &q, 1, None);
    assert_eq!(crate::common::ids(&first), vec![ids[0]]);
    let starts = |c: &mut Client| -> Option<Vec<i64>> {
        c.query_one("SELECT starts FROM pgqueue._claim_start($1)", &[&q]).unwrap().get(0)
    };
    assert_eq!(starts(&mut c), Some(vec![ids[0] + 1]), "the hint is past the first claim");
    let mut holder = connect();
    holder.batch_execute("BEGIN").unwrap();
    holder.execute("SELECT FROM pgqueue.message_rows WHERE msg_id = $1 FOR UPDATE", &[&ids[1]]).unwrap();
    c.batch_execute("BEGIN").unwrap();
    let next = crate::common::claim(&mut c, &q, 1, None);
    assert_eq!(crate::common::ids(&next), vec![ids[2]], "the locked row is passed over");
    assert_eq!(starts(&mut c), Some(vec![ids[2] + 1]), "the transaction's next claim starts from the hint");
    c.batch_execute("COMMIT").unwrap();
    holder.batch_execute("ROLLBACK").unwrap();
    assert_eq!(starts(&mut c), Some(vec![ids[1]]), "the commit lowered the hint to the row passed over");
    let last = crate::common::claim(&mut c, &q, 1, None);
    assert_eq!(crate::common::ids(&last), vec![ids[1]]);
}
