//! The claim ledger (0.21.0, step 2 of the write path): every claim call writes one row of
//! `pgqueue.claims`, its tokens name that row, and fencing (renew, ack, nack, fail, park,
//! pgq_ack_claim) raises XX000 where a message row is held under a token the ledger does not
//! vouch for, changing nothing. Stale tokens stay refused quietly (false), as before. The
//! tick's "claims" step deletes the rows none of whose messages is held under them. With
//! `pgqueue.claim_ledger` off (the default) claims hand out random tokens and write no ledger
//! row, which fencing takes on the row's word (`random token` below).

use crate::common::kit::{Claimed, claim, claim_one, message, new_queue, send_many, unvouched_claims};
use crate::common::{Client, sqlstate};
use uuid::Uuid;

/// A session whose claims write the ledger (`pgqueue.claim_ledger` is off by default).
fn connect() -> Client {
    let mut c = crate::connect();
    c.batch_execute("SET pgqueue.claim_ledger = on").unwrap();
    c
}

/// The ledger rows of queue `q`: (claim_id, msg_ids, attempts).
fn ledger(c: &mut Client, q: &str) -> Vec<(i64, Vec<i64>, Vec<i32>)> {
    c.query("SELECT claim_id, msg_ids, attempts FROM pgqueue.claims WHERE queue = $1 ORDER BY claim_id", &[&q])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// The ledger row a token names (None: a token the ledger did not issue).
fn named(c: &mut Client, token: Uuid) -> Option<i64> {
    c.query_one("SELECT pgqueue._token_claim($1)", &[&token]).unwrap().get(0)
}

/// One run of the "claims" step from the start: (looked at, deleted).
fn prune_claims(c: &mut Client) -> (i64, i64) {
    let r = c.query_one("SELECT looked, pruned FROM pgqueue._prune_claims(0, 1000000)", &[]).unwrap();
    (r.get(0), r.get(1))
}

#[test]
fn a_claim_call_writes_one_ledger_row_that_its_tokens_name() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let ids = send_many(&mut c, &q, 5, "0");
    let first = claim(&mut c, &q, 3, None);
    let second = claim(&mut c, &q, 5, None);
    let rows = ledger(&mut c, &q);
    assert_eq!(rows.len(), 2, "one row a claim call");
    assert_eq!((rows[0].1.clone(), rows[0].2.clone()), (ids[..3].to_vec(), vec![1, 1, 1]));
    assert_eq!((rows[1].1.clone(), rows[1].2.clone()), (ids[3..].to_vec(), vec![1, 1]));
    for (claimed, row) in [(&first, rows[0].0), (&second, rows[1].0)] {
        for m in claimed.iter() {
            assert_eq!(named(&mut c, m.token), Some(row), "message {}'s token names its claim", m.id);
            assert_eq!(m.token.get_version_num(), 8, "a version-8 UUID");
        }
    }
    let tokens: std::collections::HashSet<Uuid> = first.iter().chain(&second).map(|m| m.token).collect();
    assert_eq!(tokens.len(), 5, "tokens stay distinct per message");
    assert!(unvouched_claims(&mut c, &[&q]).is_empty());
}

/// Each fencing call, as SQL taking the message's id ($1) and token ($2) and saying whether
/// it took the claim (false: refused).
const FENCED: [(&str, &str); 7] = [
    ("pgq_ack", "SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)"),
    ("pgq_ack (array)", "SELECT count(*) = 1 FROM pgqueue.pgq_ack(ARRAY[$1::bigint], ARRAY[$2::uuid])"),
    ("pgq_fail", "SELECT pgqueue.pgq_fail($1, $2, 'x')"),
    ("pgq_nack", "SELECT pgqueue.pgq_nack($1, $2)"),
    ("pgq_renew", "SELECT pgqueue.pgq_renew($1::bigint, $2::uuid)"),
    ("pgq_park", "SELECT pgqueue.pgq_park($1, $2, 'k', '1 hour')"),
    (
        "pgq_ack_claim",
        "SELECT NOT EXISTS (SELECT FROM pgqueue.pgq_ack_claim((SELECT queue FROM pgqueue.messages WHERE msg_id = $1),
                                                                ARRAY[$1::bigint], ARRAY[$2::uuid], qty => 1)
                             WHERE kind = 'not_acked')",
    ),
];

fn took(c: &mut Client, sql: &str, id: i64, token: Uuid) -> Result<bool, postgres::Error> {
    c.query_one(sql, &[&id, &token]).map(|r| r.get(0))
}

#[test]
fn fencing_raises_xx000_and_changes_nothing_where_the_ledger_does_not_vouch_for_a_held_claim() {
    let mut c = connect();
    for (name, sql) in FENCED {
        let q = new_queue(&mut c, "");
        send_many(&mut c, &q, 3, "0");
        // Its ledger row gone (as a prune too early would leave it).
        let m = claim_one(&mut c, &q, None);
        let row = named(&mut c, m.token);
        c.execute("DELETE FROM pgqueue.claims WHERE claim_id = $1", &[&row]).unwrap();
        assert_eq!(unvouched_claims(&mut c, &[&q]), [m.id]);
        let before = message(&mut c, m.id);
        assert_eq!(sqlstate(took(&mut c, sql, m.id, m.token)), "XX000", "{name}, no ledger row");
        assert_eq!(message(&mut c, m.id), before, "{name} changed nothing");

        // A token the ledger issued for another attempt, written to the row by hand.
        let other = claim_one(&mut c, &q, None);
        let row = named(&mut c, other.token);
        let forged: Uuid = c
            .query_one("SELECT pgqueue._claim_token((SELECT k.key FROM pgqueue.claim_key k ORDER BY k.made_at, k.key LIMIT 1), $2, $1, 7)", &[&other.id, &row])
            .unwrap()
            .get(0);
        c.execute("UPDATE pgqueue.message_rows SET claim_token = $2 WHERE msg_id = $1", &[&other.id, &forged]).unwrap();
        assert_eq!(sqlstate(took(&mut c, sql, other.id, forged)), "XX000", "{name}, a token of attempt 7");
        assert_eq!(message(&mut c, other.id).map(|m| m.state), Some("claimed".into()), "{name} changed nothing");

        // A random token (as claims in flight during the update keep): the row's word alone.
        let legacy = claim_one(&mut c, &q, None);
        let random = Uuid::new_v4();
        c.execute("UPDATE pgqueue.message_rows SET claim_token = $2 WHERE msg_id = $1", &[&legacy.id, &random])
            .unwrap();
        assert_eq!(took(&mut c, sql, legacy.id, random).map_err(|e| e.to_string()), Ok(true), "{name}, random token");
        c.execute("SELECT pgqueue.pgq_drop_queue($1, force => true)", &[&q]).unwrap();
    }
}

#[test]
fn stale_tokens_stay_refused_without_an_error() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send_many(&mut c, &q, 2, "0");
    // A claim rolled back: its token names a ledger row that never committed, and the
    // message's next claim is the same attempt.
    let mut tx = c.transaction().unwrap();
    let lost: Claimed = claim_one(&mut tx, &q, None);
    tx.rollback().unwrap();
    let both = claim(&mut c, &q, 2, None);
    let again = both.iter().find(|m| m.id == lost.id).copied().expect("claimed again");
    assert_eq!(again.attempt, lost.attempt, "the rolled-back attempt is not counted");
    assert_ne!(again.token, lost.token);
    let other = both.iter().find(|m| m.id != lost.id).copied().unwrap();
    for (name, sql) in FENCED {
        // The rolled-back claim's token, and one message's token for the other.
        for (id, token) in [(lost.id, lost.token), (other.id, again.token), (again.id, other.token)] {
            let done = took(&mut c, sql, id, token).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(!done, "{name} refused ({id}, {token})");
        }
    }
    assert_eq!(message(&mut c, again.id).map(|m| m.token), Some(Some(again.token)), "still held");
    assert!(unvouched_claims(&mut c, &[&q]).is_empty());
}

#[test]
fn the_claims_step_deletes_a_ledger_row_once_none_of_its_messages_is_held_under_it() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send_many(&mut c, &q, 4, "0");
    let four = claim(&mut c, &q, 4, None);
    let row = named(&mut c, four[0].token).unwrap();
    let in_ledger = |c: &mut Client| ledger(c, &q).iter().any(|r| r.0 == row);
    prune_claims(&mut c);
    assert!(in_ledger(&mut c), "all four held");
    // Acked, failed, nacked: one still held keeps the row.
    assert!(crate::common::kit::ack(&mut c, &four[0]));
    c.execute("SELECT pgqueue.pgq_fail($1, $2)", &[&four[1].id, &four[1].token]).unwrap();
    c.execute("SELECT pgqueue.pgq_nack($1, $2, retry_in => '0')", &[&four[2].id, &four[2].token]).unwrap();
    prune_claims(&mut c);
    assert!(in_ledger(&mut c), "one still held");
    // The nacked one claimed again: a new row, and the old one's last message parked.
    let retried = claim_one(&mut c, &q, None);
    assert_eq!((retried.id, retried.attempt), (four[2].id, 2));
    c.execute("SELECT pgqueue.pgq_park($1, $2, 'k', '1 hour')", &[&four[3].id, &four[3].token]).unwrap();
    let (_, pruned) = prune_claims(&mut c);
    assert!(pruned >= 1);
    assert!(!in_ledger(&mut c), "none held under it");
    assert_eq!(ledger(&mut c, &q).len(), 1, "the retry's row stays");
    assert!(unvouched_claims(&mut c, &[&q]).is_empty());
    // The retry's token still acks (its row was not pruned with the other).
    assert!(crate::common::kit::ack(&mut c, &retried));
    prune_claims(&mut c);
    assert!(ledger(&mut c, &q).is_empty());
}

#[test]
fn with_the_setting_off_claims_write_no_ledger_row_and_their_random_tokens_ack() {
    let mut c = crate::connect();
    c.batch_execute("SET pgqueue.claim_ledger = off").unwrap();
    let q = new_queue(&mut c, "");
    send_many(&mut c, &q, 2, "0");
    let m = claim_one(&mut c, &q, None);
    assert_eq!(m.token.get_version_num(), 4, "a random UUID, as before 0.21.0");
    assert_eq!(named(&mut c, m.token), None);
    assert!(ledger(&mut c, &q).is_empty());
    // A session with the ledger on claims beside it; each token acks.
    let mut on = connect();
    let n = claim_one(&mut on, &q, None);
    assert_eq!(ledger(&mut c, &q).len(), 1);
    assert!(crate::common::kit::ack(&mut on, &m));
    assert!(crate::common::kit::ack(&mut c, &n));
}
