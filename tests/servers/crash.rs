//! Claims across an immediate shutdown (a crash: no checkpoint, shared memory lost) and
//! across two-phase commit, on servers of their own. They pin down what any layout of a
//! claim must keep (issue 26: the lease, token and attempt moving out of the message's row):
//! a committed claim survives a crash with its token, attempt and lease, a stale token stays
//! refused, and a claim, nack or ack in a prepared transaction is neither handed out twice
//! nor lost, whatever the worker's checks do meanwhile.

use crate::common;

use common::server::Server;
use common::{
    Claimed, Client, ack, claim, held_disagreements, held_numbers, held_set, ledger_disagreements, message, send_many,
    wait_for,
};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(30);
/// With the claim ledger (0.21.0), which must survive the crash with the rows.
const CONF: &[&str] =
    &["pgqueue.tick_interval = '100ms'", "max_prepared_transactions = 10", "pgqueue.claim_ledger = on"];

fn crash_and_start(server: &Server) {
    server.run_ok("pg_ctl", &["-D", &server.data(), "-m", "immediate", "-w", "stop"]);
    server.start();
}

/// The worker's completed ticks in this database.
fn ticks(c: &mut Client) -> i64 {
    c.query_one("SELECT ticks FROM pgqueue.worker_state", &[]).unwrap().get(0)
}

/// Waits until the worker has finished `n` more ticks (each checks the claim hints against
/// the table, re-arms what expired and ends orphaned session-bound claims).
fn let_ticks_pass(c: &mut Client, n: i64) {
    let from = ticks(c);
    wait_for("the worker's ticks", LIMIT, || (ticks(c) >= from + n).then_some(()));
}

#[test]
fn claims_survive_an_immediate_shutdown_with_their_tokens_attempts_and_leases() {
    let _turn = common::file_turn(file!());
    let server = Server::with_pgqueue(CONF);
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('crash', lease => '1 hour')").unwrap();
    let ids = send_many(&mut c, "crash", 7, "0");
    // Claims of two: they go through the ledger (a claim of one message writes its row).
    let long = claim(&mut c, "crash", 2, None);
    let short = claim(&mut c, "crash", 2, Some("2 s"));
    let mut owner = server.connect("postgres");
    let bound: Vec<Claimed> = owner
        .query(
            "SELECT msg_id, claim_token, attempt, priority FROM pgqueue.pgq_claim('crash', 2, session_bound => true)",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| Claimed { id: r.get(0), token: r.get(1), attempt: r.get(2), priority: r.get(3) })
        .collect();
    let lease_ends = |c: &mut Client, id: i64| -> String {
        c.query_one("SELECT lease_expires_at::text FROM pgqueue.messages WHERE msg_id = $1", &[&id]).unwrap().get(0)
    };
    let before: Vec<String> = long.iter().map(|m| lease_ends(&mut c, m.id)).collect();
    let claimed: Vec<i64> = long.iter().chain(&short).chain(&bound).map(|m| m.id).collect();
    assert_eq!(claimed, ids[..6]);
    drop(c);

    crash_and_start(&server); // with the session-bound claimer still connected
    drop(owner);
    let mut c = server.connect("postgres");
    // Held claims stay held with what they had.
    for (m, lease) in long.iter().zip(&before) {
        let now = message(&mut c, m.id).expect("a claimed message survives the crash");
        assert_eq!((now.state.as_str(), now.token, now.attempt), ("claimed", Some(m.token), 1));
        assert_eq!(&lease_ends(&mut c, m.id), lease, "its lease is unchanged");
    }
    assert!(ledger_disagreements(&mut c, &["crash"]).is_empty(), "the claim ledger survives the crash with them");
    // The message never claimed, and (as new attempts) the expired leases and the dead
    // session's claims: nothing else, however long the worker runs. Claimed in one call once
    // all are back, through the ledger.
    let ready = |c: &mut Client| -> i64 {
        c.query_one("SELECT count(*) FROM pgqueue.messages WHERE queue = 'crash' AND state = 'ready'", &[])
            .unwrap()
            .get(0)
    };
    wait_for("the expired and orphaned claims re-armed", LIMIT, || (ready(&mut c) >= 5).then_some(()));
    let_ticks_pass(&mut c, 3);
    let mut back = claim(&mut c, "crash", 10, None);
    back.extend(claim(&mut c, "crash", 10, None));
    back.sort_by_key(|m| m.id);
    let expected: Vec<(i64, i32)> = ids[2..].iter().map(|&id| (id, if id == ids[6] { 1 } else { 2 })).collect();
    assert_eq!(back.iter().map(|m| (m.id, m.attempt)).collect::<Vec<_>>(), expected);
    // Shared memory was lost with the crash: the first claim after it gave the database a new
    // held set, which the worker rebuilt from the ledger, the claims from before included.
    wait_for("the held set rebuilt after the crash", LIMIT, || held_set(&mut c).filter(|s| s.0));
    assert_eq!(held_numbers(&mut c, &ids), [1, 1, 2, 2, 2, 2, 1]);
    assert!(held_disagreements(&mut c, &["crash"]).is_empty());
    // Their old tokens are refused; the live ones are not.
    for m in short.iter().chain(&bound) {
        assert!(!ack(&mut c, m), "a stale token after the crash is refused");
    }
    for m in long.iter().chain(&back) {
        assert!(ack(&mut c, m), "the current token of {} acks", m.id);
    }
    let left: i64 = c.query_one("SELECT count(*) FROM pgqueue.messages WHERE queue = 'crash'", &[]).unwrap().get(0);
    assert_eq!(left, 0);
    let completed: i64 = c
        .query_one("SELECT count(*) FROM pgqueue.history WHERE queue = 'crash' AND outcome = 'completed'", &[])
        .unwrap()
        .get(0);
    assert_eq!(completed, 7, "each message completed once");
}

#[test]
fn prepared_claims_nacks_and_acks_are_neither_handed_out_twice_nor_lost() {
    let _turn = common::file_turn(file!());
    let server = Server::with_pgqueue(CONF);
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('prepared', lease => '1 hour')").unwrap();
    let ids = send_many(&mut c, "prepared", 4, "0");
    let mut p = server.connect("postgres");

    // A prepared claim (of two: through the ledger): no other claim gets its messages, through
    // the worker's checks and a restart; once committed its tokens ack.
    p.batch_execute("BEGIN").unwrap();
    let held = claim(&mut p, "prepared", 2, None);
    assert_eq!(held.iter().map(|m| m.id).collect::<Vec<_>>(), ids[..2]);
    p.batch_execute("PREPARE TRANSACTION 'claim'").unwrap();
    let others = claim(&mut c, "prepared", 10, None);
    assert_eq!(others.iter().map(|m| m.id).collect::<Vec<_>>(), ids[2..]);
    let_ticks_pass(&mut c, 3);
    assert!(claim(&mut c, "prepared", 10, None).is_empty());
    // The held set forgot the prepared claim, and is not rebuilt while it is prepared (no
    // snapshot shows its ledger row yet).
    let s = held_set(&mut c).expect("preloaded");
    assert!(!s.0 && s.3 > 0, "not exact, rebuilds refused: {s:?}");
    assert_eq!(held_numbers(&mut c, &ids[..2]), [0, 0]);
    drop((c, p));
    server.restart();
    let mut c = server.connect("postgres");
    let_ticks_pass(&mut c, 3);
    assert!(claim(&mut c, "prepared", 10, None).is_empty(), "nothing is handed out twice after a restart");
    c.batch_execute("COMMIT PREPARED 'claim'").unwrap();
    assert!(ledger_disagreements(&mut c, &["prepared"]).is_empty(), "the ledger row committed with the claim");
    for m in &held {
        assert!(ack(&mut c, m), "the prepared claim's tokens ack once committed");
    }

    // A prepared nack, committed: the message is claimable again (within a tick).
    let mut p = server.connect("postgres");
    p.batch_execute("BEGIN").unwrap();
    let nacked: bool = p
        .query_one("SELECT pgqueue.pgq_nack($1::bigint, $2::uuid, retry_in => '0')", &[&others[0].id, &others[0].token])
        .unwrap()
        .get(0);
    assert!(nacked);
    p.batch_execute("PREPARE TRANSACTION 'nack'").unwrap();
    assert!(claim(&mut c, "prepared", 10, None).is_empty(), "not before the nack commits");
    c.batch_execute("COMMIT PREPARED 'nack'").unwrap();
    // Claimed again with a new message, in one call (through the ledger).
    let_ticks_pass(&mut c, 2);
    let new = c.query_one("SELECT pgqueue.pgq_send('prepared', '{}')", &[]).unwrap().get::<_, i64>(0);
    let two = claim(&mut c, "prepared", 10, None);
    assert_eq!(two.iter().map(|m| (m.id, m.attempt)).collect::<Vec<_>>(), [(others[0].id, 2), (new, 1)]);
    let again = two[0];
    assert!(!ack(&mut c, &others[0]), "the nacked attempt's token is stale");
    // The first claim since the restart gave the database a new held set; rebuilt from the
    // ledger once nothing is prepared, with the claim from before the restart.
    wait_for("the held set rebuilt", LIMIT, || held_set(&mut c).filter(|s| s.0));
    assert_eq!(held_numbers(&mut c, &[others[1].id, again.id]), [1, 2]);
    assert!(held_disagreements(&mut c, &["prepared"]).is_empty());

    // A prepared claim rolled back: the messages come back with their attempts not counted.
    for m in &two {
        assert!(ack(&mut c, m));
    }
    c.execute("SELECT pgqueue.pgq_send_batch('prepared', ARRAY['{}', '{}']::jsonb[])", &[]).unwrap();
    p.batch_execute("BEGIN").unwrap();
    let undone = claim(&mut p, "prepared", 2, None);
    assert_eq!(undone.len(), 2);
    p.batch_execute("PREPARE TRANSACTION 'undone'").unwrap();
    c.batch_execute("ROLLBACK PREPARED 'undone'").unwrap();
    let mut retaken: Vec<Claimed> = vec![];
    wait_for("the messages of a rolled-back claim claimable", LIMIT, || {
        retaken.extend(claim(&mut c, "prepared", 10, None));
        (retaken.len() >= 2).then_some(())
    });
    retaken.sort_by_key(|m| m.id);
    let expected: Vec<(i64, i32)> = undone.iter().map(|m| (m.id, 1)).collect();
    assert_eq!(retaken.iter().map(|m| (m.id, m.attempt)).collect::<Vec<_>>(), expected);
    for m in &undone {
        assert!(!ack(&mut c, m), "a rolled-back claim's token matches nothing");
    }

    // A prepared ack rolled back: the message stays claimed under its token, which acks.
    p.batch_execute("BEGIN").unwrap();
    assert!(ack(&mut p, &others[1]));
    p.batch_execute("PREPARE TRANSACTION 'ack'").unwrap();
    c.batch_execute("ROLLBACK PREPARED 'ack'").unwrap();
    let kept = message(&mut c, others[1].id).expect("still there");
    assert_eq!((kept.state.as_str(), kept.token), ("claimed", Some(others[1].token)));
    let_ticks_pass(&mut c, 2);
    assert!(claim(&mut c, "prepared", 10, None).is_empty(), "and not handed out again");
    assert!(ack(&mut c, &others[1]));
    for m in &retaken {
        assert!(ack(&mut c, m));
    }
    let completed: i64 = c
        .query_one("SELECT count(*) FROM pgqueue.history WHERE queue = 'prepared' AND outcome = 'completed'", &[])
        .unwrap()
        .get(0);
    assert_eq!(completed, 7, "each message completed once");
    wait_for("the held set rebuilt", LIMIT, || held_set(&mut c).filter(|s| s.0));
    assert!(held_disagreements(&mut c, &["prepared"]).is_empty());
    // The prepared claim rolled back left nothing listed: no claim found its message listed.
    assert_eq!(held_set(&mut c).unwrap().4, 0, "claims passed over");
}
