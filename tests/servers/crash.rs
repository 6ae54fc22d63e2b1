//! Claims across an immediate shutdown (a crash: no checkpoint, shared memory lost) and
//! across two-phase commit, on servers of their own. They pin down what any layout of a
//! claim must keep (issue 26: the lease, token and attempt moving out of the message's row):
//! a committed claim survives a crash with its token, attempt and lease, a stale token stays
//! refused, and a claim, nack or ack in a prepared transaction is neither handed out twice
//! nor lost, whatever the worker's checks do meanwhile.

use crate::common;

use common::server::Server;
use common::{
    Claimed, Client, ack, claim, claim_one, held_disagreements, held_numbers, held_set, ledger_disagreements, message,
    send_many, wait_for,
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
    let ids = send_many(&mut c, "crash", 5, "0");
    let long = claim(&mut c, "crash", 2, None);
    let short = claim_one(&mut c, "crash", Some("2 s"));
    let mut owner = server.connect("postgres");
    let bound: Claimed = owner
        .query_one(
            "SELECT msg_id, claim_token, attempt, priority FROM pgqueue.pgq_claim('crash', session_bound => true)",
            &[],
        )
        .map(|r| Claimed { id: r.get(0), token: r.get(1), attempt: r.get(2), priority: r.get(3) })
        .unwrap();
    let lease_ends = |c: &mut Client, id: i64| -> String {
        c.query_one("SELECT lease_expires_at::text FROM pgqueue.messages WHERE msg_id = $1", &[&id]).unwrap().get(0)
    };
    let before: Vec<String> = long.iter().map(|m| lease_ends(&mut c, m.id)).collect();
    assert_eq!([long[0].id, long[1].id, short.id, bound.id], ids[..4]);
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
    // The message never claimed, and (as new attempts) the expired lease and the dead
    // session's claim: nothing else, however long the worker runs.
    let mut back: Vec<Claimed> = vec![];
    wait_for("the expired and orphaned claims re-armed", LIMIT, || {
        back.extend(claim(&mut c, "crash", 10, None));
        (back.len() >= 3).then_some(())
    });
    let_ticks_pass(&mut c, 3);
    back.extend(claim(&mut c, "crash", 10, None));
    back.sort_by_key(|m| m.id);
    assert_eq!(back.iter().map(|m| (m.id, m.attempt)).collect::<Vec<_>>(), [(short.id, 2), (bound.id, 2), (ids[4], 1)]);
    // Shared memory was lost with the crash: the first claim after it gave the database a new
    // held set, which the worker rebuilt from the ledger, the claims from before included.
    wait_for("the held set rebuilt after the crash", LIMIT, || held_set(&mut c).filter(|s| s.0));
    assert_eq!(held_numbers(&mut c, &[long[0].id, long[1].id, short.id, bound.id, ids[4]]), [1, 1, 2, 2, 1]);
    assert!(held_disagreements(&mut c, &["crash"]).is_empty());
    // Their old tokens are refused; the live ones are not.
    assert!(!ack(&mut c, &short), "a stale token after the crash is refused");
    assert!(!ack(&mut c, &bound));
    for m in long.iter().chain(&back) {
        assert!(ack(&mut c, m), "the current token of {} acks", m.id);
    }
    let left: i64 = c.query_one("SELECT count(*) FROM pgqueue.messages WHERE queue = 'crash'", &[]).unwrap().get(0);
    assert_eq!(left, 0);
    let completed: i64 = c
        .query_one("SELECT count(*) FROM pgqueue.history WHERE queue = 'crash' AND outcome = 'completed'", &[])
        .unwrap()
        .get(0);
    assert_eq!(completed, 5, "each message completed once");
}

#[test]
fn prepared_claims_nacks_and_acks_are_neither_handed_out_twice_nor_lost() {
    let _turn = common::file_turn(file!());
    let server = Server::with_pgqueue(CONF);
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('prepared', lease => '1 hour')").unwrap();
    let ids = send_many(&mut c, "prepared", 3, "0");
    let mut p = server.connect("postgres");

    // A prepared claim: no other claim gets its message, through the worker's checks and a
    // restart; once committed its token acks.
    p.batch_execute("BEGIN").unwrap();
    let held = claim_one(&mut p, "prepared", None);
    assert_eq!(held.id, ids[0]);
    p.batch_execute("PREPARE TRANSACTION 'claim'").unwrap();
    let others = claim(&mut c, "prepared", 10, None);
    assert_eq!(others.iter().map(|m| m.id).collect::<Vec<_>>(), ids[1..]);
    let_ticks_pass(&mut c, 3);
    assert!(claim(&mut c, "prepared", 10, None).is_empty());
    // The held set forgot the prepared claim, and is not rebuilt while it is prepared (no
    // snapshot shows its ledger row yet).
    let s = held_set(&mut c).expect("preloaded");
    assert!(!s.0 && s.3 > 0, "not exact, rebuilds refused: {s:?}");
    assert_eq!(held_numbers(&mut c, &[held.id]), [0]);
    drop((c, p));
    server.restart();
    let mut c = server.connect("postgres");
    let_ticks_pass(&mut c, 3);
    assert!(claim(&mut c, "prepared", 10, None).is_empty(), "nothing is handed out twice after a restart");
    c.batch_execute("COMMIT PREPARED 'claim'").unwrap();
    assert!(ledger_disagreements(&mut c, &["prepared"]).is_empty(), "the ledger row committed with the claim");
    assert!(ack(&mut c, &held), "the prepared claim's token acks once committed");

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
    let again = wait_for("the nacked message claimable", LIMIT, || claim(&mut c, "prepared", 10, None).pop());
    assert_eq!((again.id, again.attempt), (others[0].id, 2));
    assert!(!ack(&mut c, &others[0]), "the nacked attempt's token is stale");
    // The first claim since the restart gave the database a new held set; rebuilt from the
    // ledger once nothing is prepared, with the claim from before the restart.
    wait_for("the held set rebuilt", LIMIT, || held_set(&mut c).filter(|s| s.0));
    assert_eq!(held_numbers(&mut c, &[others[1].id, again.id]), [1, 2]);
    assert!(held_disagreements(&mut c, &["prepared"]).is_empty());

    // A prepared claim rolled back: the message comes back with its attempt not counted.
    assert!(ack(&mut c, &again));
    c.execute("SELECT pgqueue.pgq_send('prepared', '{}')", &[]).unwrap();
    p.batch_execute("BEGIN").unwrap();
    let undone = claim_one(&mut p, "prepared", None);
    p.batch_execute("PREPARE TRANSACTION 'undone'").unwrap();
    c.batch_execute("ROLLBACK PREPARED 'undone'").unwrap();
    let retaken =
        wait_for("the message of a rolled-back claim claimable", LIMIT, || claim(&mut c, "prepared", 10, None).pop());
    assert_eq!((retaken.id, retaken.attempt), (undone.id, 1));
    assert!(!ack(&mut c, &undone), "a rolled-back claim's token matches nothing");

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
    assert!(ack(&mut c, &retaken));
    let completed: i64 = c
        .query_one("SELECT count(*) FROM pgqueue.history WHERE queue = 'prepared' AND outcome = 'completed'", &[])
        .unwrap()
        .get(0);
    assert_eq!(completed, 4, "each message completed once");
    wait_for("the held set rebuilt", LIMIT, || held_set(&mut c).filter(|s| s.0));
    assert!(held_disagreements(&mut c, &["prepared"]).is_empty());
    // The prepared claim rolled back left nothing listed: no claim found its message listed.
    assert_eq!(held_set(&mut c).unwrap().4, 0, "claims passed over");
}
