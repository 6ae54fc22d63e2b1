//! The claim ledger (0.21.0, step 2 of the write path; two-way since 0.22.0): every claim call
//! writes one row of `pgqueue.claims`, listing each message at its claim number (its
//! `claims_ended` + 1: nacks, parks and re-arms count the claims they end), and its tokens
//! name that row. Fencing (renew, ack, nack, fail, park, pgq_ack_claim) raises XX000, changing
//! nothing, where the ledger and the message's row disagree either way: the row holds the
//! message under a token the ledger does not vouch for, or the ledger vouches for a token the
//! row does not hold it under. Stale tokens stay refused quietly (false), as before. The
//! tick's "claims" step deletes the rows none of whose entries is live. With
//! `pgqueue.claim_ledger` off (the default) claims hand out random tokens and write no ledger
//! row, which fencing takes on the row's word (`random token` below).

use crate::common::kit::{
    ack, as_a_row_claim_leaves_it, as_the_ledger_leaves_it, claim, claim_one, claim_two, drop_queue,
    held_disagreements, ledger_disagreements, message, message_row, new_queue, send_many,
};
use crate::common::{Client, sqlstate};
use postgres::GenericClient;
use uuid::Uuid;

/// A session whose claims write the ledger (`pgqueue.claim_ledger` is off by default).
fn connect() -> Client {
    let mut c = crate::connect();
    c.batch_execute("SET pgqueue.claim_ledger = on").unwrap();
    c
}

/// The ledger rows of queue `q`: (claim_id, msg_ids, claim_numbers).
fn ledger(c: &mut impl GenericClient, q: &str) -> Vec<(i64, Vec<i64>, Vec<i32>)> {
    c.query("SELECT claim_id, msg_ids, claim_numbers FROM pgqueue.claims WHERE queue = $1 ORDER BY claim_id", &[&q])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// The ledger row a token names (None: a token the ledger did not issue).
fn named(c: &mut impl GenericClient, token: Uuid) -> Option<i64> {
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
    assert!(ledger_disagreements(&mut c, &[&q]).is_empty());
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

fn took(c: &mut impl GenericClient, sql: &str, id: i64, token: Uuid) -> Result<bool, postgres::Error> {
    c.query_one(sql, &[&id, &token]).map(|r| r.get(0))
}

#[test]
fn fencing_raises_xx000_and_changes_nothing_where_the_ledger_does_not_vouch_for_a_held_claim() {
    let mut c = connect();
    for (name, sql) in FENCED {
        let q = new_queue(&mut c, "");
        send_many(&mut c, &q, 6, "0");
        // Claims that wrote the row too (0.22.0, 0.23.0): the row holds them under a ledger
        // token. Its ledger row gone (as a prune too early would leave it).
        let [m, _] = claim_two(&mut c, &q);
        as_a_row_claim_leaves_it(&mut c, &m);
        let row = named(&mut c, m.token);
        c.execute("DELETE FROM pgqueue.claims WHERE claim_id = $1", &[&row]).unwrap();
        assert_eq!(ledger_disagreements(&mut c, &[&q]), [m.id]);
        let before = message(&mut c, m.id);
        assert_eq!(sqlstate(took(&mut c, sql, m.id, m.token)), "XX000", "{name}, no ledger row");
        assert_eq!(message(&mut c, m.id), before, "{name} changed nothing");

        // A token the ledger issued for another claim number, written to the row by hand.
        let [other, _] = claim_two(&mut c, &q);
        as_a_row_claim_leaves_it(&mut c, &other);
        let row = named(&mut c, other.token);
        let forged: Uuid = c
            .query_one("SELECT pgqueue._claim_token((SELECT k.key FROM pgqueue.claim_key k ORDER BY k.made_at, k.key LIMIT 1), $2, $1, 7)", &[&other.id, &row])
            .unwrap()
            .get(0);
        c.execute("UPDATE pgqueue.message_rows SET claim_token = $2 WHERE msg_id = $1", &[&other.id, &forged]).unwrap();
        assert_eq!(sqlstate(took(&mut c, sql, other.id, forged)), "XX000", "{name}, a token of claim number 7");
        assert_eq!(message(&mut c, other.id).map(|m| m.state), Some("claimed".into()), "{name} changed nothing");

        // A random token (as claims in flight during the update keep): the row's word alone.
        let [legacy, _] = claim_two(&mut c, &q);
        as_a_row_claim_leaves_it(&mut c, &legacy);
        let random = Uuid::new_v4();
        c.execute("UPDATE pgqueue.message_rows SET claim_token = $2 WHERE msg_id = $1", &[&legacy.id, &random])
            .unwrap();
        assert_eq!(took(&mut c, sql, legacy.id, random).map_err(|e| e.to_string()), Ok(true), "{name}, random token");
        drop_queue(&mut c, &q);
    }
}

#[test]
fn stale_tokens_stay_refused_without_an_error() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send_many(&mut c, &q, 2, "0");
    // A claim rolled back: its token names a ledger row that never committed, and the
    // message's next claim has the same attempt and claim number.
    let mut tx = c.transaction().unwrap();
    let [lost, _] = claim_two(&mut tx, &q);
    assert!(named(&mut tx, lost.token).is_some(), "a token of the ledger's");
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
    assert!(ledger_disagreements(&mut c, &[&q]).is_empty());
}

#[test]
fn the_claims_step_deletes_a_ledger_row_once_none_of_its_entries_is_live() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send_many(&mut c, &q, 5, "0");
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
    // The nacked one claimed again with the fifth: a new row, and the old one's last message parked.
    let [retried, fifth] = claim_two(&mut c, &q);
    assert_eq!((retried.id, retried.attempt), (four[2].id, 2));
    c.execute("SELECT pgqueue.pgq_park($1, $2, 'k', '1 hour')", &[&four[3].id, &four[3].token]).unwrap();
    let (_, pruned) = prune_claims(&mut c);
    assert!(pruned >= 1);
    assert!(!in_ledger(&mut c), "none held under it");
    assert_eq!(ledger(&mut c, &q).len(), 1, "the retry's row stays");
    assert!(ledger_disagreements(&mut c, &[&q]).is_empty());
    // The retry's token still acks (its row was not pruned with the other).
    assert!(crate::common::kit::ack(&mut c, &retried));
    assert!(crate::common::kit::ack(&mut c, &fifth));
    prune_claims(&mut c);
    assert!(ledger(&mut c, &q).is_empty());
}

#[test]
fn with_the_setting_off_claims_write_no_ledger_row_and_their_random_tokens_ack() {
    let mut c = crate::connect();
    c.batch_execute("SET pgqueue.claim_ledger = off").unwrap();
    let q = new_queue(&mut c, "");
    send_many(&mut c, &q, 3, "0");
    let m = claim_one(&mut c, &q, None);
    assert_eq!(m.token.get_version_num(), 4, "a random UUID, as before 0.21.0");
    assert_eq!(named(&mut c, m.token), None);
    assert!(ledger(&mut c, &q).is_empty());
    // A session with the ledger on claims beside it; each token acks.
    let mut on = connect();
    let [n, _] = claim_two(&mut on, &q);
    assert_eq!(ledger(&mut c, &q).len(), 1);
    assert!(crate::common::kit::ack(&mut on, &m));
    assert!(crate::common::kit::ack(&mut c, &n));
}

/// The message's count of ended claims.
fn claims_ended(c: &mut Client, id: i64) -> i32 {
    c.query_one("SELECT claims_ended FROM pgqueue.messages WHERE msg_id = $1", &[&id]).unwrap().get(0)
}

#[test]
fn fencing_raises_xx000_and_changes_nothing_where_the_ledger_vouches_for_a_claim_the_row_does_not_hold() {
    let mut c = connect();
    for (name, sql) in FENCED {
        let q = new_queue(&mut c, "");
        send_many(&mut c, &q, 2, "0");
        let [m, _] = claim_two(&mut c, &q);
        // In one transaction with the uncounting below: committed in between, the claim's
        // ledger row would be no one's, and another test's prune of the ledger could delete it.
        c.batch_execute("BEGIN").unwrap();
        assert!(
            c.query_one("SELECT pgqueue.pgq_nack($1, $2, retry_in => '1 hour')", &[&m.id, &m.token])
                .unwrap()
                .get::<_, bool>(0)
        );
        assert_eq!(claims_ended(&mut c, m.id), 1, "the nack counted the claim it ended");
        assert!(!took(&mut c, sql, m.id, m.token).unwrap(), "{name}: the nacked claim's token, refused");
        // The end uncounted by hand (as a release forgetting to count one would leave it).
        c.execute("UPDATE pgqueue.message_rows SET claims_ended = 0 WHERE msg_id = $1", &[&m.id]).unwrap();
        c.batch_execute("COMMIT").unwrap();
        assert_eq!(ledger_disagreements(&mut c, &[&q]), [m.id]);
        let before = message(&mut c, m.id);
        assert_eq!(sqlstate(took(&mut c, sql, m.id, m.token)), "XX000", "{name}: the ledger vouches, the row does not");
        assert_eq!(message(&mut c, m.id), before, "{name} changed nothing");
        drop_queue(&mut c, &q);
    }
}

#[test]
fn a_park_that_resumes_at_once_gives_the_attempt_back_but_ends_the_claim() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send_many(&mut c, &q, 3, "0");
    let key = format!("{q}-resume");
    // In one transaction, so that the tick cannot prune the parked claim's ledger row.
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT pgqueue.pgq_signal($1, keep => '1 hour')", &[&key]).unwrap();
    let [parked, kept] = claim_two(&mut tx, &q);
    let resumed: bool = tx
        .query_one("SELECT pgqueue.pgq_park($1, $2, $3, '1 hour')", &[&parked.id, &parked.token, &key])
        .unwrap()
        .get(0);
    assert!(resumed);
    assert_eq!(message(&mut tx, parked.id).map(|m| (m.state, m.attempt)), Some(("ready".into(), 0)), "resumed at once");
    let [again, third] = claim_two(&mut tx, &q);
    assert_eq!((again.id, again.attempt), (parked.id, parked.attempt), "the same attempt again");
    assert_eq!(
        ledger(&mut tx, &q).iter().map(|r| r.2.clone()).collect::<Vec<_>>(),
        [vec![1, 1], vec![2, 1]],
        "claim numbers"
    );
    // The parked claim's ledger row is there; its token signed claim number 1.
    for (name, sql) in FENCED {
        assert!(!took(&mut tx, sql, parked.id, parked.token).unwrap_or_else(|e| panic!("{name}: {e}")), "{name}");
    }
    assert!(ledger_disagreements(&mut tx, &[&q]).is_empty());
    for m in [again, kept, third] {
        assert!(crate::common::kit::ack(&mut tx, &m));
    }
    tx.commit().unwrap();
}

#[test]
fn nacks_parks_and_re_arms_count_the_claims_they_end() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send_many(&mut c, &q, 2, "0");
    let first = claim_two(&mut c, &q);
    for m in &first {
        c.execute("SELECT pgqueue.pgq_nack($1, $2, retry_in => '0')", &[&m.id, &m.token]).unwrap();
    }
    let second = claim_two(&mut c, &q);
    let ids: Vec<i64> = second.iter().map(|m| m.id).collect();
    c.execute(
        "UPDATE pgqueue.message_rows SET lease_expires_at = now() - interval '1 s' WHERE msg_id = ANY ($1)",
        &[&ids],
    )
    .unwrap();
    // Re-armed here or by the worker's tick, whichever comes first. pgq_rearm walks every
    // window of claims (one _rearm_batch looks at the first 400 claimed rows of the database,
    // which the claims of tests running beside this one may fill).
    crate::common::wait_for("the expired claims re-armed", std::time::Duration::from_secs(30), || {
        c.execute("SELECT FROM pgqueue.pgq_rearm(1000000, $1)", &[&q]).unwrap();
        ids.iter().all(|&id| message(&mut c, id).map(|m| m.state) == Some("ready".into())).then_some(())
    });
    let third = claim_two(&mut c, &q);
    c.execute("SELECT pgqueue.pgq_park($1, $2, $3 || '-count', '1 hour')", &[&third[0].id, &third[0].token, &q])
        .unwrap();
    assert!(ack(&mut c, &third[1]));
    assert_eq!(claims_ended(&mut c, first[0].id), 3, "a nack, a re-arm and a park");
    assert!(ledger_disagreements(&mut c, &[&q]).is_empty());
    for old in [first[0], second[0], third[0]] {
        assert!(!took(&mut c, FENCED[0].1, old.id, old.token).unwrap(), "claim {}'s token refused", old.token);
    }
    prune_claims(&mut c);
    assert!(ledger(&mut c, &q).is_empty(), "none live");
}

#[test]
fn a_redriven_message_is_claimed_past_the_claims_the_ledger_still_lists() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send_many(&mut c, &q, 3, "0");
    // Claimed together; one dead-lettered, the other still held: the row stays.
    let both = claim(&mut c, &q, 2, None);
    c.execute("SELECT pgqueue.pgq_fail($1, $2, 'x')", &[&both[0].id, &both[0].token]).unwrap();
    prune_claims(&mut c);
    assert_eq!(ledger(&mut c, &q).len(), 1, "the row of the claim still held");
    let back: i64 =
        c.query_one("SELECT pgqueue.pgq_redrive($1, ARRAY[$2::bigint])", &[&q, &both[0].id]).unwrap().get(0);
    assert_eq!(back, 1);
    assert_eq!(claims_ended(&mut c, both[0].id), 1, "past the claim the ledger lists");
    assert!(ledger_disagreements(&mut c, &[&q]).is_empty());
    let [again, third] = claim_two(&mut c, &q);
    assert_eq!(again.id, both[0].id);
    assert_eq!(ledger(&mut c, &q).last().map(|r| r.2.clone()), Some(vec![2, 1]), "at its second claim number");
    for (name, sql) in FENCED {
        assert!(!took(&mut c, sql, both[0].id, both[0].token).unwrap_or_else(|e| panic!("{name}: {e}")), "{name}");
    }
    for m in [again, both[1], third] {
        assert!(crate::common::kit::ack(&mut c, &m));
    }
    assert!(ledger_disagreements(&mut c, &[&q]).is_empty());
}

/// (outcome, attempt) of message `id` of queue `q` in the history. By queue: a read by msg_id
/// alone locks every queue's history partitions until the transaction ends, and these
/// tests keep theirs open while other tests drop their queues.
fn finished(c: &mut impl GenericClient, q: &str, id: i64) -> Option<(String, i32)> {
    c.query_opt("SELECT outcome, attempt FROM pgqueue.history WHERE queue = $1 AND msg_id = $2", &[&q, &id])
        .unwrap()
        .map(|r| (r.get(0), r.get(1)))
}

/// 0.24.0: each fencing call takes a claim that only the ledger holds, on a row left 'ready'
/// (as claims will leave rows: step 3b of the write path), as it takes one the row holds:
/// stale tokens are refused quietly, and each end counts the claim's attempt and ends it; a
/// cancel marks it as it marks a claimed row.
/// In one transaction with the row's change, so that no tick and no claim sees it meanwhile.
#[test]
fn fencing_takes_a_claim_only_the_ledger_holds_on_a_row_left_ready() {
    let mut c = connect();
    for (name, sql) in FENCED {
        let q = new_queue(&mut c, ", lease => '1 hour'");
        send_many(&mut c, &q, 2, "0");
        let [m, other] = claim_two(&mut c, &q);
        let mut tx = c.transaction().unwrap();
        as_the_ledger_leaves_it(&mut tx, m.id);
        assert_eq!(message_row(&mut tx, m.id), Some(("ready".into(), 0, 0, false)));
        let shown = message(&mut tx, m.id).unwrap();
        assert_eq!(
            (shown.state.as_str(), shown.token, shown.attempt),
            ("claimed", Some(m.token), 1),
            "{name}: the view"
        );
        for token in [other.token, Uuid::new_v4()] {
            assert!(!took(&mut tx, sql, m.id, token).unwrap(), "{name}: a stale token, refused quietly");
        }
        assert!(took(&mut tx, sql, m.id, m.token).unwrap_or_else(|e| panic!("{name}: {e}")), "{name}: taken");
        let after = message_row(&mut tx, m.id);
        let moved = finished(&mut tx, &q, m.id);
        match name {
            "pgq_fail" => assert_eq!(moved, Some(("dead".into(), 1)), "{name}"),
            "pgq_nack" => assert_eq!(after.clone().map(|r| (r.1, r.2, r.3)), Some((1, 1, false)), "{name}"),
            "pgq_park" => assert_eq!(after.clone(), Some(("parked".into(), 1, 1, false)), "{name}"),
            "pgq_renew" => {
                assert_eq!(after.clone(), Some(("ready".into(), 0, 0, true)), "{name}: the lease on the row")
            }
            _ => assert_eq!(moved, Some(("completed".into(), 1)), "{name}"),
        }
        if ["pgq_nack", "pgq_park"].contains(&name) {
            assert!(!took(&mut tx, sql, m.id, m.token).unwrap(), "{name}: the ended claim's token, refused");
        }
        tx.commit().unwrap();
        if name == "pgq_renew" {
            assert!(
                c.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&m.id, &m.token])
                    .unwrap()
                    .get::<_, bool>(0)
            );
        }
        c.execute("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&other.id, &other.token]).unwrap();
        assert!(ledger_disagreements(&mut c, &[&q]).is_empty(), "{name}");
        assert!(held_disagreements(&mut c, &[&q]).is_empty(), "{name}: {:?}", held_disagreements(&mut c, &[&q]));
        drop_queue(&mut c, &q);
    }

    // A cancel marks it (renewals leave it out from then on), and its end records it cancelled.
    let q = new_queue(&mut c, "");
    send_many(&mut c, &q, 2, "0");
    let [m, _] = claim_two(&mut c, &q);
    let mut tx = c.transaction().unwrap();
    as_the_ledger_leaves_it(&mut tx, m.id);
    let cancelled: Vec<i64> = tx
        .query("SELECT pgqueue.pgq_cancel(ARRAY[$1::bigint], 'stop')", &[&m.id])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(cancelled, [m.id]);
    assert_eq!(message_row(&mut tx, m.id), Some(("ready".into(), 0, 0, false)), "marked, not moved");
    assert_eq!(message(&mut tx, m.id).map(|m| m.state), Some("claimed".into()));
    assert!(!took(&mut tx, "SELECT pgqueue.pgq_renew($1::bigint, $2::uuid)", m.id, m.token).unwrap());
    assert!(took(&mut tx, "SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", m.id, m.token).unwrap());
    assert_eq!(finished(&mut tx, &q, m.id), Some(("cancelled".into(), 1)));
    tx.commit().unwrap();
    assert!(held_disagreements(&mut c, &[&q]).is_empty());

    // A nack on the last attempt dead-letters it at the claim's attempt.
    let q = new_queue(&mut c, ", max_attempts => 1");
    send_many(&mut c, &q, 2, "0");
    let [m, _] = claim_two(&mut c, &q);
    let mut tx = c.transaction().unwrap();
    as_the_ledger_leaves_it(&mut tx, m.id);
    assert!(took(&mut tx, "SELECT pgqueue.pgq_nack($1, $2)", m.id, m.token).unwrap());
    assert_eq!(finished(&mut tx, &q, m.id), Some(("dead".into(), 1)));
    tx.commit().unwrap();
    assert!(held_disagreements(&mut c, &[&q]).is_empty());
}

/// 0.24.0: the re-arm pass finds claims only the ledger holds from the ledger, with the
/// lease in force (a renewal's on the row, else the claim's): an ended one goes back to ready
/// with its attempt counted, to dead letter on its last attempt, or to history as cancelled
/// if a cancel was requested; a renewed one stays. `pgq_rearm` in one transaction with the
/// rows' change; then the orphans step, for a session-bound claim whose session exits.
#[test]
fn the_rearm_pass_and_the_orphans_step_find_claims_only_the_ledger_holds() {
    let mut c = connect();
    let q = new_queue(&mut c, ", lease => '1 hour', max_attempts => 2");
    send_many(&mut c, &q, 4, "0");
    let ms = claim(&mut c, &q, 4, None);
    let ids: Vec<i64> = ms.iter().map(|m| m.id).collect();
    let mut tx = c.transaction().unwrap();
    for m in &ms {
        as_the_ledger_leaves_it(&mut tx, m.id);
    }
    tx.execute(
        "UPDATE pgqueue.claims SET lease_expires_at = now() - interval '1 s' WHERE $1 = ANY (msg_ids)",
        &[&ids[0]],
    )
    .unwrap();
    assert!(took(&mut tx, "SELECT pgqueue.pgq_renew($1::bigint, $2::uuid)", ms[1].id, ms[1].token).unwrap());
    tx.execute("SELECT pgqueue.pgq_cancel($1::bigint)", &[&ids[2]]).unwrap();
    tx.execute("UPDATE pgqueue.message_rows SET attempt = 1 WHERE msg_id = $1", &[&ids[3]]).unwrap();
    let r = tx.query_one("SELECT rearmed, dead_lettered FROM pgqueue.pgq_rearm(queue => $1)", &[&q]).unwrap();
    assert_eq!((r.get::<_, i64>(0), r.get::<_, i64>(1)), (1, 1));
    assert_eq!(message_row(&mut tx, ids[0]), Some(("ready".into(), 1, 1, false)), "re-armed, the attempt counted");
    assert_eq!(message(&mut tx, ids[0]).map(|m| m.state), Some("ready".into()));
    assert_eq!(message_row(&mut tx, ids[1]), Some(("ready".into(), 0, 0, true)), "renewed: held");
    assert_eq!(message(&mut tx, ids[1]).map(|m| m.state), Some("claimed".into()));
    let ended = |tx: &mut postgres::Transaction, id: i64| finished(tx, &q, id);
    assert_eq!(ended(&mut tx, ids[2]), Some(("cancelled".into(), 1)));
    assert_eq!(ended(&mut tx, ids[3]), Some(("dead".into(), 2)), "its last attempt");
    assert!(!took(&mut tx, "SELECT pgqueue.pgq_nack($1, $2)", ms[0].id, ms[0].token).unwrap(), "the token, stale");
    tx.commit().unwrap();
    assert!(took(&mut c, "SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", ms[1].id, ms[1].token).unwrap());
    assert!(held_disagreements(&mut c, &[&q]).is_empty(), "{:?}", held_disagreements(&mut c, &[&q]));

    // A session-bound claim whose session exits: the orphans step expires it, the pass re-arms
    // it (called here: the worker is off in this binary; tests/worker.rs has the worker's).
    let q = new_queue(&mut c, ", lease => '1 hour'");
    let ids = send_many(&mut c, &q, 2, "0");
    let mut holder = connect();
    let bound = holder.query("SELECT claim_token FROM pgqueue.pgq_claim($1, 2, session_bound => true)", &[&q]).unwrap();
    assert_eq!(bound.len(), 2);
    let bound: Vec<Uuid> = bound.iter().map(|r| r.get(0)).collect();
    assert!(named(&mut c, bound[0]).is_some(), "through the ledger");
    let pid: i32 = holder.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    for &id in &ids {
        as_the_ledger_leaves_it(&mut c, id);
        assert_eq!(message(&mut c, id).map(|m| m.state), Some("claimed".into()));
    }
    let rearm = |c: &mut Client| -> i64 {
        c.query_one("SELECT rearmed FROM pgqueue.pgq_rearm(queue => $1)", &[&q]).unwrap().get(0)
    };
    c.query_one("SELECT pgqueue._expire_orphaned_claims()", &[]).unwrap();
    assert_eq!(rearm(&mut c), 0, "its session lives");
    assert!(c.query_one("SELECT pg_terminate_backend($1, 5000)", &[&pid]).unwrap().get::<_, bool>(0));
    c.query_one("SELECT pgqueue._expire_orphaned_claims()", &[]).unwrap();
    assert_eq!(rearm(&mut c), 2);
    for &id in &ids {
        assert_eq!(message_row(&mut c, id), Some(("ready".into(), 1, 1, false)));
    }
    assert!(held_disagreements(&mut c, &[&q]).is_empty(), "{:?}", held_disagreements(&mut c, &[&q]));
}

/// 0.24.0: the counts and checks take a message that only the ledger holds (its row left
/// 'ready') as claimed: the exact depth the tick recounts from, pgqueue.messages, the
/// overview's oldest ready message and expired claims, the tick's check of the claim hints
/// (which must not find such a row claimable below its hint), and pgq_drop_queue, which
/// refuses while messages are claimed and, forced, ends their held-set entries.
#[test]
fn counts_and_checks_take_a_claim_only_the_ledger_holds_as_claimed() {
    let mut c = connect();
    let q = new_queue(&mut c, ", lease => '1 hour'");
    let ids = send_many(&mut c, &q, 3, "0");
    let held = claim(&mut c, &q, 2, None);
    assert_eq!(held.iter().map(|m| m.id).collect::<Vec<_>>(), ids[..2]);
    assert_eq!(crate::common::kit::held_numbers(&mut c, &ids[..2]), [1, 1]);
    let mut tx = c.transaction().unwrap();
    for m in &held {
        as_the_ledger_leaves_it(&mut tx, m.id);
    }
    let depth = tx.query_one("SELECT ready, delayed, claimed FROM pgqueue._depth($1)", &[&q]).unwrap();
    assert_eq!((depth.get::<_, i64>(0), depth.get::<_, i64>(1), depth.get::<_, i64>(2)), (1, 0, 2));
    // As pgqueue.queue_stats counts (not read here: its history counts would lock every
    // queue's history partitions until this transaction ends, and other tests drop queues).
    let shown = tx
        .query_one(
            "SELECT count(*) FILTER (WHERE state = 'ready'), count(*) FILTER (WHERE state = 'claimed')
               FROM pgqueue.messages WHERE queue = $1",
            &[&q],
        )
        .unwrap();
    assert_eq!((shown.get::<_, i64>(0), shown.get::<_, i64>(1)), (1, 2));
    let claimable: Vec<(i16, i64)> = tx
        .query("SELECT priority, msg_id FROM pgqueue._claimable($1, '{0}') WHERE priority IS NOT NULL", &[&q])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(claimable, [(0, ids[2])], "the first free message, past the held ones");
    let oldest: bool = tx
        .query_one(
            "SELECT pgqueue._oldest_ready($1) = enqueued_at FROM pgqueue.message_rows WHERE msg_id = $2",
            &[&q, &ids[2]],
        )
        .unwrap()
        .get(0);
    assert!(oldest, "the oldest ready message is the free one");
    let expired = |tx: &mut postgres::Transaction| -> i64 {
        tx.query_one("SELECT expired_claims FROM pgqueue.queue_overview WHERE queue = $1", &[&q]).unwrap().get(0)
    };
    assert_eq!(expired(&mut tx), 0);
    tx.execute("UPDATE pgqueue.claims SET lease_expires_at = now() - interval '1 s' WHERE queue = $1", &[&q]).unwrap();
    assert_eq!(expired(&mut tx), 2);

    let mut sp = tx.savepoint("refused").unwrap();
    assert_eq!(sqlstate(sp.execute("SELECT pgqueue.pgq_drop_queue($1)", &[&q])), "55006");
    sp.rollback().unwrap();
    tx.commit().unwrap();
    // Forced (the worker is off in this binary: nothing touches the rows meanwhile).
    drop_queue(&mut c, &q);
    assert_eq!(crate::common::kit::held_numbers(&mut c, &ids[..2]), [0, 0], "their held-set entries ended");
    assert!(ledger(&mut c, &q).is_empty(), "its ledger rows go with it (a queue created again would read them)");
}

/// A ledger batch of the re-arm pass (`_rearm_ledger_batch`) for one queue reads only that
/// queue's ledger rows (its window ends at that queue's last claim, not at another queue's
/// later one), and its next lease end counts a claim whose lease ended but whose row another
/// session held locked, so that the next pass comes at once instead of after the next lease
/// end or the forced pass.
#[test]
fn a_ledger_batch_reads_its_queues_rows_and_counts_an_ended_lease_it_found_locked() {
    let mut c = connect();
    let q = new_queue(&mut c, ", lease => '1 hour'");
    let other = new_queue(&mut c, ", lease => '1 hour'");
    send_many(&mut c, &q, 2, "0");
    send_many(&mut c, &other, 2, "0");
    let mine = claim_two(&mut c, &q);
    let [later, _] = claim_two(&mut c, &other);
    let ids: Vec<i64> = mine.iter().map(|m| m.id).collect();
    c.execute("UPDATE pgqueue.claims SET lease_expires_at = now() - interval '1 s' WHERE queue = $1", &[&q]).unwrap();
    let own: i64 = ledger(&mut c, &q)[0].0;
    assert!(ledger(&mut c, &other)[0].0 > own, "the other queue's claim comes later");

    let batch = |c: &mut Client| -> (i64, Option<i64>, bool, bool) {
        let r = c
            .query_one(
                "SELECT rearmed, last_claim_id, more, next_expiry <= now() FROM pgqueue._rearm_ledger_batch(0, 100, $1)",
                &[&q],
            )
            .unwrap();
        (r.get(0), r.get(1), r.get(2), r.get::<_, Option<bool>>(3).unwrap_or(false))
    };
    let mut locker = connect();
    let mut lock = locker.transaction().unwrap();
    lock.execute("SELECT 1 FROM pgqueue.message_rows WHERE msg_id = ANY ($1) FOR UPDATE", &[&ids]).unwrap();
    assert_eq!(batch(&mut c), (0, Some(own), false, true), "skipped locked, their ended leases still due");
    lock.commit().unwrap();
    assert_eq!(batch(&mut c), (2, Some(own), false, false), "re-armed once the lock is gone");
    for &id in &ids {
        assert_eq!(message_row(&mut c, id), Some(("ready".into(), 1, 1, false)));
    }
    assert_eq!(message(&mut c, later.id).map(|m| m.state), Some("claimed".into()), "the other queue's, untouched");
    drop_queue(&mut c, &q);
    drop_queue(&mut c, &other);
}

/// A cancel that waited for a claim through the ledger reads the ledger after the wait. Such
/// a claim may leave the row as it was (step 3b of the write path), so the wait's re-check of
/// the row reads nothing anew, and a cancel that read the ledger in its first snapshot would
/// move the message to history under the claim. Here the claim goes through the ledger (it
/// takes two messages) and leaves the row as it was; the cancel, which began while that
/// transaction held the row, must find the message held and only ask for its cancel.
#[test]
fn a_cancel_that_waited_for_a_claim_through_the_ledger_finds_it_held() {
    let mut c = connect();
    let q = new_queue(&mut c, ", lease => '1 hour'");
    let id = send_many(&mut c, &q, 2, "0")[0];
    let mut claimer = connect();
    let mut tx = claimer.transaction().unwrap();
    let [m, _] = claim_two(&mut tx, &q);
    assert_eq!(m.id, id);
    let name = format!("cancel_{q}");
    let canceller = std::thread::spawn({
        let name = name.clone();
        move || {
            let mut s = connect();
            s.batch_execute(&format!("SET application_name = '{name}'")).unwrap();
            s.query_one("SELECT pgqueue.pgq_cancel($1::bigint)", &[&id]).unwrap().get::<_, bool>(0)
        }
    });
    crate::common::wait_for("the cancel to wait for the claim", std::time::Duration::from_secs(30), || {
        c.query_one(
            "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock')",
            &[&name],
        )
        .unwrap()
        .get::<_, bool>(0)
        .then_some(())
    });
    tx.commit().unwrap();
    assert!(canceller.join().unwrap(), "the message is cancelled (asked of its holder)");
    assert_eq!(message_row(&mut c, id).map(|r| r.0), Some("ready".into()), "left as the ledger left it");
    let asked: bool = c
        .query_one("SELECT cancel_requested_at IS NOT NULL FROM pgqueue.messages WHERE msg_id = $1", &[&id])
        .unwrap()
        .get(0);
    assert!(asked, "held by the claim: the cancel is asked, not done");
    assert_eq!(message(&mut c, id).map(|m| m.state), Some("claimed".into()));
    assert!(took(&mut c, "SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", m.id, m.token).unwrap(), "the holder ends it");
    assert_eq!(finished(&mut c, &q, id), Some(("cancelled".into(), 1)));
    drop_queue(&mut c, &q);
}

/// A claim passes over the rows claims hold without locking them, so their holders' acks do
/// not wait for it: here from a hint a rollback lowered below a held row (a pick once locked
/// that row until it committed, and the ack waited), then without hints (a transaction that
/// sent to the queue itself scans from the start).
#[test]
fn a_claim_passes_over_held_rows_without_locking_them() {
    let mut c = connect();
    let q = new_queue(&mut c, ", lease => '1 hour'");
    let ids = send_many(&mut c, &q, 5, "0");
    let mut rolled_back = connect();
    let mut tx = rolled_back.transaction().unwrap();
    assert_eq!(claim_two(&mut tx, &q).map(|m| m.id), ids[..2]);
    let held = claim_two(&mut c, &q);
    assert_eq!(held.map(|m| m.id), ids[2..4]);
    tx.rollback().unwrap();

    let (mut walker, mut holder) = (connect(), connect());
    holder.batch_execute("SET lock_timeout = '5s'").unwrap();
    let mut walking = walker.transaction().unwrap();
    let got = claim(&mut walking, &q, 5, None);
    assert_eq!(got.iter().map(|m| m.id).collect::<Vec<_>>(), vec![ids[0], ids[1], ids[4]], "past the held rows");
    for m in &held {
        assert!(ack(&mut holder, m), "its holder acks {} while the claim that passed it is open", m.id);
    }
    walking.commit().unwrap();

    let mut walking = walker.transaction().unwrap();
    let own: i64 = walking.query_one("SELECT pgqueue.pgq_send($1, '{}')", &[&q]).unwrap().get(0);
    let mine = claim(&mut walking, &q, 5, None);
    assert_eq!(mine.iter().map(|m| m.id).collect::<Vec<_>>(), vec![own], "past the held rows, without hints");
    for m in &got {
        assert!(ack(&mut holder, m), "message {} acked while the claim that passed it is open", m.id);
    }
    walking.commit().unwrap();
    drop_queue(&mut c, &q);
}

/// The claims step's cursor stops before a row claimed in the last 10 seconds that is still
/// live, so that the next tick looks at it again (its claim most likely ends by then; passed,
/// it stayed until the prune cadence, and the tick's reads of the ledger by queue read it),
/// except after a full batch that begins with it (a step that made no progress would never
/// end). Other tests' ledger rows come and go meanwhile: the bounds allow for them.
#[test]
fn the_claims_steps_cursor_stops_before_a_new_row_still_live() {
    let mut c = connect();
    let q = new_queue(&mut c, ", lease => '1 hour'");
    send_many(&mut c, &q, 4, "0");
    let first = claim_two(&mut c, &q);
    let second = claim_two(&mut c, &q);
    let (a, b) = match ledger(&mut c, &q)[..] {
        [(a, ..), (b, ..)] => (a, b),
        ref rows => panic!("one ledger row a claim call: {rows:?}"),
    };
    let step = |c: &mut Client, after: i64, max: i32| -> (i64, i64) {
        let r =
            c.query_one("SELECT looked, last_claim_id FROM pgqueue._prune_claims($1, $2)", &[&after, &max]).unwrap();
        (r.get(0), r.get(1))
    };
    assert!(first.iter().all(|m| ack(&mut c, m)));
    let (_, last) = step(&mut c, a - 1, 1000);
    assert!(a <= last && last < b, "past the row that went ({a}), before the live one ({b}): {last}");
    assert_eq!(ledger(&mut c, &q).iter().map(|r| r.0).collect::<Vec<_>>(), vec![b], "the row that went is deleted");
    assert_eq!(step(&mut c, b - 1, 1), (1, b), "a full batch moves the cursor past a live row");
    assert!(second.iter().all(|m| ack(&mut c, m)));
    let (_, last) = step(&mut c, b - 1, 1000);
    assert!(last >= b, "past the row once it went: {last}");
    assert!(ledger(&mut c, &q).is_empty());
    drop_queue(&mut c, &q);
}

/// 0.24.2: a claim that ends up with one message writes the message's row, as with the setting
/// off (a random token, no ledger row, nothing for the held set): one ledger row would cost the
/// same row write and add the ledger's work. Asked for one, or for more with one left; claims
/// of two or more beside it go through the ledger, and each kind of token acks.
#[test]
fn a_claim_that_takes_one_message_writes_its_row() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let ids = send_many(&mut c, &q, 4, "0");
    let one = claim_one(&mut c, &q, None);
    let two = claim_two(&mut c, &q);
    let last = claim(&mut c, &q, 5, None);
    assert_eq!(last.len(), 1, "one left");
    for m in [one, last[0]] {
        assert_eq!(m.token.get_version_num(), 4, "a random token, as with the setting off");
        assert_eq!(named(&mut c, m.token), None);
        assert_eq!(message_row(&mut c, m.id).map(|r| r.0), Some("claimed".into()), "the row holds it");
    }
    assert_eq!(ledger(&mut c, &q).iter().map(|r| r.1.clone()).collect::<Vec<_>>(), [ids[1..3].to_vec()]);
    for m in two {
        assert!(named(&mut c, m.token).is_some());
        assert_eq!(message_row(&mut c, m.id).map(|r| r.0), Some("ready".into()), "the ledger holds it");
    }
    assert_eq!(crate::common::kit::held_numbers(&mut c, &ids), [0, 1, 1, 0]);
    assert!(ledger_disagreements(&mut c, &[&q]).is_empty());
    assert!(held_disagreements(&mut c, &[&q]).is_empty());
    for m in [one, two[0], two[1], last[0]] {
        assert!(ack(&mut c, &m), "message {} acked", m.id);
    }
    drop_queue(&mut c, &q);
}

/// 0.25.0: a session with the setting off writes rows, and does not take what claims through
/// the ledger hold (their rows stay 'ready'): before, it took them from its pick, and the two
/// holders' fencing disagreed (XX000). Passed over in READ COMMITTED, after a rollback that
/// lowered the claim hints to the rows it had, and in REPEATABLE READ when the claim through
/// the ledger committed after the transaction's snapshot (asked in a snapshot taken after the
/// row locks, not 40001); and a session with the setting on in REPEATABLE READ the same way.
#[test]
fn a_session_with_the_setting_off_passes_over_what_the_ledger_holds() {
    let mut c = connect();
    let mut off = crate::connect();
    off.batch_execute("SET pgqueue.claim_ledger = off").unwrap();
    let q = new_queue(&mut c, "");
    let ids = send_many(&mut c, &q, 4, "0");
    let held = claim_two(&mut c, &q);
    assert_eq!(held.map(|m| m.id), [ids[0], ids[1]]);
    off.batch_execute("BEGIN").unwrap();
    let own = crate::common::kit::send(&mut off, &q, serde_json::json!("own"));
    let got = claim(&mut off, &q, 10, None);
    assert_eq!(got.iter().map(|m| m.id).collect::<Vec<_>>(), [ids[2], ids[3], own], "the held two passed over");
    off.batch_execute("ROLLBACK").unwrap();
    let got = claim(&mut off, &q, 10, None);
    assert_eq!(got.iter().map(|m| m.id).collect::<Vec<_>>(), ids[2..], "from the hints the rollback lowered");
    assert!(got.iter().all(|m| message_row(&mut off, m.id).map(|r| r.0) == Some("claimed".into())));

    // REPEATABLE READ: the ledger's claims commit after each transaction's snapshot.
    let more = send_many(&mut c, &q, 6, "0");
    let mut on_rr = connect();
    for s in [&mut off, &mut on_rr] {
        s.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pgqueue.queues").unwrap();
    }
    let held_later = claim_two(&mut c, &q);
    assert_eq!(held_later.map(|m| m.id), [more[0], more[1]]);
    let by_off = claim(&mut off, &q, 2, None);
    let by_on = claim(&mut on_rr, &q, 2, None);
    assert!(by_off.iter().all(|m| named(&mut c, m.token).is_none()), "the session with it off wrote rows");
    for s in [&mut off, &mut on_rr] {
        s.batch_execute("COMMIT").unwrap();
    }
    let mut rest: Vec<i64> = by_off.iter().chain(&by_on).map(|m| m.id).collect();
    rest.sort_unstable();
    assert_eq!(rest, more[2..], "neither took what the ledger holds");
    assert!(ledger_disagreements(&mut c, &[&q]).is_empty());
    assert!(held_disagreements(&mut c, &[&q]).is_empty());
    for m in held.iter().chain(&got).chain(&held_later).chain(&by_off).chain(&by_on) {
        assert!(ack(&mut c, m), "message {} acked under its one claim", m.id);
    }
    drop_queue(&mut c, &q);
}

/// The ledger's reads (`pgqueue._ledger_held`, which picks without an exact held set, counts
/// and pgq_drop_queue use) look each entry's message up by primary key (0.24.1): `state =
/// 'ready'` would match the partial ready index, which the planner scanned whole for each
/// entry (281,000 buffers for 1,216 entries under the bench). 10 held messages among 20,000
/// ready ones: a few buffers each. Counted, not timed.
#[test]
fn the_ledgers_reads_look_each_message_up_by_primary_key() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    for _ in 0..2 {
        c.execute(
            "SELECT count(*) FROM pgqueue.pgq_send_batch($1,
                 (SELECT array_agg(jsonb_build_object('i', g)) FROM generate_series(1, 10000) g))",
            &[&q],
        )
        .unwrap();
    }
    for _ in 0..5 {
        claim_two(&mut c, &q);
    }
    let explain: serde_json::Value = c
        .query_one(
            &format!(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT count(*) FROM pgqueue._ledger_held WHERE queue = '{q}'"
            ),
            &[],
        )
        .unwrap()
        .get(0);
    let plan = &explain[0]["Plan"];
    let rows = plan["Plans"][0]["Actual Rows"].as_f64();
    let buffers = plan["Shared Hit Blocks"].as_i64().unwrap() + plan["Shared Read Blocks"].as_i64().unwrap();
    assert!(buffers <= 150, "{buffers} buffers for 10 entries ({rows:?} rows): {explain:#}");
    let held: i64 =
        c.query_one(&format!("SELECT count(*) FROM pgqueue._ledger_held WHERE queue = '{q}'"), &[]).unwrap().get(0);
    assert_eq!(held, 10);
    drop_queue(&mut c, &q);
}
