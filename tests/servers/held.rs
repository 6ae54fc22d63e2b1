//! The held set (src/held.rs): the claims of the claim ledger as shared memory knows them, one
//! set per database, shadowed in 0.23.0 (the rows decide; step 3b of the write path will ask
//! the set instead of writing the row). On servers of their own, with the ledger on and a
//! worker that rebuilds the set every tick: the set must list exactly the claims the rows
//! hold wherever it says it vouches, through claims, every kind of end, rollbacks,
//! savepoints, a claim ended in its own transaction, the extension created again, and
//! ledger rows written around the API. (Crashes and prepared transactions: crash.rs.)

use crate::common;

use common::server::Server;
use common::{Client, ack, claim, held_disagreements, held_numbers, held_set, ids, message_row, send_many, wait_for};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(30);
const CONF: &[&str] = &["pgqueue.tick_interval = '100ms'", "pgqueue.claim_ledger = on"];

/// Waits until the worker has made the set exact (it knows nothing at first).
fn exact(c: &mut Client) -> (bool, i64, i64, i64, i64) {
    wait_for("the held set to be exact", LIMIT, || held_set(c).filter(|s| s.0))
}

fn agrees(c: &mut Client, q: &str) {
    assert_eq!(held_disagreements(c, &[q]), Vec::<String>::new());
}

#[test]
fn the_held_set_lists_the_claims_the_rows_hold_through_every_end() {
    let _turn = common::file_turn(file!());
    let server = Server::with_pgqueue(CONF);
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('held', lease => '1 hour')").unwrap();
    let ids = send_many(&mut c, "held", 9, "0");
    // A database's first claim through the ledger gives it a set, knowing nothing until the
    // worker rebuilds it from the ledger.
    let claimed = claim(&mut c, "held", 6, None);
    exact(&mut c);
    assert_eq!(held_numbers(&mut c, &ids), [1, 1, 1, 1, 1, 1, 0, 0, 0], "each at claim number 1");
    agrees(&mut c, "held");
    // Each way a claim ends: ack, fail, nack, park, re-arm (a lease that ended), and
    // pgq_ack_claim, whose claim takes the next messages in the same call (two: a claim of
    // one message writes its row, not the ledger).
    assert!(ack(&mut c, &claimed[0]));
    let ended = |c: &mut Client, sql: &str, m: &common::Claimed| -> bool {
        c.query_one(sql, &[&m.id, &m.token]).unwrap().get(0)
    };
    assert!(ended(&mut c, "SELECT pgqueue.pgq_fail($1::bigint, $2::uuid, 'no')", &claimed[1]));
    assert!(ended(&mut c, "SELECT pgqueue.pgq_nack($1::bigint, $2::uuid, retry_in => '1 hour')", &claimed[2]));
    assert!(ended(&mut c, "SELECT pgqueue.pgq_park($1::bigint, $2::uuid, 'k', '1 hour')", &claimed[3]));
    c.batch_execute(&format!(
        "UPDATE pgqueue.message_rows SET lease_expires_at = now() - interval '1 s' WHERE msg_id = {}",
        claimed[4].id
    ))
    .unwrap();
    let rearmed: i64 = c.query_one("SELECT rearmed FROM pgqueue.pgq_rearm()", &[]).unwrap().get(0);
    assert_eq!(rearmed, 1);
    let next: Vec<(i64, i32)> = c
        .query(
            "SELECT msg_id, attempt FROM pgqueue.pgq_ack_claim('held', ARRAY[$1::bigint], ARRAY[$2::uuid], qty => 2)",
            &[&claimed[5].id, &claimed[5].token],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(next, [(claimed[4].id, 2), (ids[6], 1)], "the re-armed message, first in line");
    // Held now: the re-armed message under its second claim, the next one under its first.
    assert_eq!(held_numbers(&mut c, &ids), [0, 0, 0, 0, 2, 0, 1, 0, 0]);
    agrees(&mut c, "held");
    // A dropped queue ends its claims.
    claim(&mut c, "held", 2, None);
    assert_eq!(held_set(&mut c).unwrap().1, 4);
    c.batch_execute("SELECT pgqueue.pgq_drop_queue('held', force => true)").unwrap();
    let s = held_set(&mut c).unwrap();
    assert_eq!((s.0, s.1, s.4), (true, 0, 0), "exact and empty, no claim passed over");
}

/// 0.25.1: with the ledger on, a claim that asks for one message picks as a session with the
/// setting off: where the set is exact and lists nothing, the plain pick, which asks the set
/// about no row (`_take_free` and `_held_free` uncalled, counted with `track_functions`);
/// where the ledger holds messages, the ledger's pick, which passes over them. A claim of
/// two takes the ledger's pick either way.
#[test]
fn a_claim_of_one_through_the_ledger_picks_as_with_the_setting_off() {
    let _turn = common::file_turn(file!());
    let server = Server::with_pgqueue(CONF);
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('held', lease => '1 hour'); SET track_functions = 'all'").unwrap();
    let sent = send_many(&mut c, "held", 8, "0");
    // The worker's tick gives the database a set, exact and empty, before any claim.
    exact(&mut c);
    // The calls this claim made: the difference within its transaction (the counts of an
    // earlier one may not have been flushed yet).
    let claim_asking = |c: &mut Client, qty: i32| -> (Vec<i64>, i64) {
        let mut tx = c.transaction().unwrap();
        let calls = |tx: &mut postgres::Transaction| -> i64 {
            tx.query_one(
                "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_xact_user_functions
                  WHERE schemaname = 'pgqueue' AND funcname IN ('_take_free', '_held_free')",
                &[],
            )
            .unwrap()
            .get(0)
        };
        let before = calls(&mut tx);
        let got = ids(&claim(&mut tx, "held", qty, None));
        let asked = calls(&mut tx) - before;
        tx.commit().unwrap();
        (got, asked)
    };
    assert_eq!(claim_asking(&mut c, 1), (vec![sent[0]], 0), "the plain pick");
    let (two, asked) = claim_asking(&mut c, 2);
    assert_eq!(two, sent[1..3]);
    assert!(asked > 0, "a claim of two asks the set about each row it meets");
    assert_eq!(held_numbers(&mut c, &sent[..4]), [0, 1, 1, 0], "the first written on its row, the two in the ledger");
    let (one, asked) = claim_asking(&mut c, 1);
    assert_eq!(one, [sent[3]], "past the two the ledger holds");
    assert!(asked > 0, "with messages held, the ledger's pick");
    assert_eq!(message_row(&mut c, sent[3]).map(|r| r.0), Some("claimed".into()), "its row written");
    agrees(&mut c, "held");
}

#[test]
fn rolled_back_claims_and_claims_ended_in_their_own_transaction_leave_nothing() {
    let _turn = common::file_turn(file!());
    let server = Server::with_pgqueue(CONF);
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('held', lease => '1 hour')").unwrap();
    let ids = send_many(&mut c, "held", 8, "0");
    // Claims of two throughout: a claim of one message writes its row, not the ledger.
    for m in claim(&mut c, "held", 2, None) {
        assert!(ack(&mut c, &m));
    }
    exact(&mut c);
    let ids = &ids[2..];
    let of = |claimed: &[common::Claimed]| claimed.iter().map(|m| m.id).collect::<Vec<_>>();
    // Rolled back, whole and to a savepoint.
    let mut tx = c.transaction().unwrap();
    claim(&mut tx, "held", 2, None);
    tx.rollback().unwrap();
    assert_eq!(held_set(&mut c).unwrap().1, 0);
    let mut tx = c.transaction().unwrap();
    let first = claim(&mut tx, "held", 2, None);
    let mut sp = tx.savepoint("s").unwrap();
    let undone = claim(&mut sp, "held", 2, None);
    sp.rollback().unwrap();
    tx.commit().unwrap();
    assert_eq!((of(&first), of(&undone)), (ids[..2].to_vec(), ids[2..4].to_vec()));
    assert_eq!(held_numbers(&mut c, ids), [1, 1, 0, 0, 0, 0], "only the claim that committed");
    // Claimed and acked in one transaction; and an ack rolled back leaves its claim.
    let mut tx = c.transaction().unwrap();
    for m in &common::claim_two(&mut tx, "held") {
        assert!(ack(&mut tx, m));
    }
    tx.commit().unwrap();
    let mut tx = c.transaction().unwrap();
    assert!(ack(&mut tx, &first[0]));
    tx.rollback().unwrap();
    assert_eq!(held_numbers(&mut c, ids), [1, 1, 0, 0, 0, 0]);
    agrees(&mut c, "held");
    let s = held_set(&mut c).unwrap();
    assert_eq!((s.0, s.1, s.4), (true, 2, 0));
}

#[test]
fn the_extension_created_again_and_ledger_rows_written_around_the_api_make_the_set_start_over() {
    let _turn = common::file_turn(file!());
    let server = Server::with_pgqueue(CONF);
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('held', lease => '1 hour')").unwrap();
    let ids = send_many(&mut c, "held", 3, "0");
    claim(&mut c, "held", 3, None);
    assert_eq!(exact(&mut c).1, 3);
    // Dropped with its claims held, created again: the new messages have the same ids, and a
    // set that still listed the old claims would say they are held.
    c.batch_execute("DROP EXTENSION pgqueue CASCADE; CREATE EXTENSION pgqueue").unwrap();
    assert_eq!(held_set(&mut c).unwrap().1, 0, "it forgot the old claims");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('held', lease => '1 hour')").unwrap();
    assert_eq!(send_many(&mut c, "held", 3, "0"), ids, "the same ids again");
    exact(&mut c);
    let again = claim(&mut c, "held", 3, None);
    assert_eq!(again.len(), 3);
    assert_eq!(held_numbers(&mut c, &ids), [1, 1, 1]);
    assert_eq!(held_set(&mut c).unwrap().4, 0, "no claim found an old entry");
    agrees(&mut c, "held");
    // A ledger row written by hand (as a restore's COPY writes them): the set forgets at
    // commit, and the worker rebuilds it from the ledger, these claims included.
    let rebuilds = held_set(&mut c).unwrap().2;
    c.batch_execute(
        "INSERT INTO pgqueue.claims (queue, msg_ids, claim_numbers, claimed_at) VALUES ('held', '{999999}', '{1}', now())",
    )
    .unwrap();
    // Rebuilt by the worker (a rebuild runs only where the set is not exact).
    wait_for("the held set rebuilt", LIMIT, || held_set(&mut c).filter(|s| s.0 && s.2 > rebuilds));
    assert_eq!(held_numbers(&mut c, &ids), [1, 1, 1], "from the ledger");
    agrees(&mut c, "held");
    for m in &again {
        assert!(ack(&mut c, m));
    }
    assert_eq!(held_set(&mut c).unwrap().1, 0);
}

/// `pgqueue.held_set_capacity` sizes each set (rounded up to a power of two). Claims beyond it
/// are counted as overflows and the set stops vouching only for them; a rebuild that finds
/// more live claims than fit waits for the prune cadence instead of reading the ledger every
/// tick; once they fit, it makes the set exact again. At 0 there is no set, and claims ask the
/// ledger.
#[test]
fn a_set_sized_by_its_setting_overflows_and_is_rebuilt_once_the_claims_fit() {
    let _turn = common::file_turn(file!());
    let conf = [CONF, &["pgqueue.held_set_capacity = 10", "pgqueue.prune_interval = '4s'"]].concat();
    let server = Server::with_pgqueue(&conf);
    let mut c = server.connect("postgres");
    let capacity = |c: &mut Client| -> (i64, i64) {
        let r = c.query_one("SELECT capacity, overflows FROM pgqueue.held_set", &[]).unwrap();
        (r.get(0), r.get(1))
    };
    c.batch_execute("SELECT pgqueue.pgq_create_queue('held', lease => '1 hour')").unwrap();
    let ids = send_many(&mut c, "held", 40, "0");
    let first = claim(&mut c, "held", 8, None);
    let rebuilds = exact(&mut c).2;
    assert_eq!(capacity(&mut c), (16, 0), "10 rounded up");
    // 72 bytes a claim for each of 8 databases, and a header.
    let bytes: i64 =
        c.query_one("SELECT size FROM pg_shmem_allocations WHERE name = 'pgqueue held sets'", &[]).unwrap().get(0);
    assert!((8 * 16 * 72..8 * 16 * 72 + 4096).contains(&bytes), "{bytes} bytes");
    // 28 held: the 12 the set has no room for are the ones it stops vouching for.
    let more = claim(&mut c, "held", 20, None);
    let s = held_set(&mut c).unwrap();
    assert_eq!((s.0, s.1, capacity(&mut c).1), (false, 16, 12));
    let unknown: (i64, i64) = {
        let r = c.query_one("SELECT unknown_from, unknown_to FROM pgqueue.held_set", &[]).unwrap();
        (r.get(0), r.get(1))
    };
    assert!(unknown.0 >= more[0].id && unknown.1 <= more[19].id, "only the new claims' span: {unknown:?}");
    assert_eq!(held_numbers(&mut c, &ids[..8]), [1; 8], "the first claims still listed");
    agrees(&mut c, "held");
    // The worker's next rebuild finds 28 live claims, more than fit: it keeps 16 and waits for
    // the prune cadence (4 s) before reading the ledger again, not every tick (100 ms).
    let tried =
        wait_for("a rebuild that found too many", LIMIT, || held_set(&mut c).filter(|s| s.2 > rebuilds).map(|s| s.2));
    std::thread::sleep(Duration::from_millis(1500));
    let after = held_set(&mut c).unwrap();
    assert!(after.2 <= tried + 1, "rebuilds spaced: {tried} then {}", after.2);
    assert!(!after.0);
    agrees(&mut c, "held");
    // 14 acked: 14 held, which fit; the next rebuild at the cadence makes the set exact.
    for m in first.iter().chain(&more[..6]) {
        assert!(ack(&mut c, m));
    }
    let s = exact(&mut c);
    assert_eq!(s.1, 14);
    assert_eq!(held_numbers(&mut c, &ids[14..28]), [1; 14]);
    agrees(&mut c, "held");
    drop(c);
    drop(server);

    // None at all: claims through the ledger work, and the view has no row.
    let conf = [CONF, &["pgqueue.held_set_capacity = 0"]].concat();
    let server = Server::with_pgqueue(&conf);
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('held', lease => '1 hour')").unwrap();
    send_many(&mut c, "held", 2, "0");
    let claimed = claim(&mut c, "held", 2, None);
    assert_eq!(claimed.len(), 2);
    assert!(held_set(&mut c).is_none());
    let allocated: i64 =
        c.query_one("SELECT count(*) FROM pg_shmem_allocations WHERE name = 'pgqueue held sets'", &[]).unwrap().get(0);
    assert_eq!(allocated, 0, "no shared memory for it");
    assert!(claimed.iter().all(|m| ack(&mut c, m)));
    // Without a set every claim asks the ledger about the rows it locked, in a snapshot taken
    // after its row locks (0.25.0): in REPEATABLE READ and SERIALIZABLE transactions whose
    // snapshots predate the claim through the ledger, with the setting on and off, the held
    // rows are passed over, without 40001.
    let ids = send_many(&mut c, "held", 6, "0");
    let mut others: Vec<Client> = (0..2).map(|_| server.connect("postgres")).collect();
    others[1].batch_execute("SET pgqueue.claim_ledger = off").unwrap();
    for (o, level) in others.iter_mut().zip(["REPEATABLE READ", "SERIALIZABLE"]) {
        o.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}; SELECT count(*) FROM pgqueue.queues")).unwrap();
    }
    let held = claim(&mut c, "held", 2, None);
    assert_eq!(held.iter().map(|m| m.id).collect::<Vec<_>>(), ids[..2]);
    let mut rest: Vec<i64> = vec![];
    for o in &mut others {
        rest.extend(claim(o, "held", 2, None).iter().map(|m| m.id));
        o.batch_execute("COMMIT").unwrap();
    }
    rest.sort_unstable();
    assert_eq!(rest, ids[2..], "neither took the two the ledger holds");
}

/// The set keeps each claim's lease as the row has it: granted by the claim, set by a renewal
/// at its commit (not by one rolled back, whole or to a savepoint), and ended by the exit of
/// a session-bound claim's session. The claim's ledger row keeps what the claim granted.
#[test]
fn renewals_and_a_sessions_exit_set_the_leases_the_set_lists() {
    let _turn = common::file_turn(file!());
    let server = Server::with_pgqueue(CONF);
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('held', lease => '1 hour')").unwrap();
    let ids = send_many(&mut c, "held", 4, "0");
    let claimed: Vec<common::Claimed> = c
        .query("SELECT msg_id, claim_token, attempt, priority FROM pgqueue.pgq_claim('held', 2, consumer => 'w1')", &[])
        .unwrap()
        .iter()
        .map(|r| common::Claimed { id: r.get(0), token: r.get(1), attempt: r.get(2), priority: r.get(3) })
        .collect();
    exact(&mut c);
    let granted = |c: &mut Client, id: i64| -> (String, Option<String>, Option<i32>) {
        let r = c
            .query_one(
                "SELECT (c.lease_expires_at - c.claimed_at)::text, c.consumer, c.session_pid
                   FROM pgqueue.claims c WHERE $1 = ANY (c.msg_ids)",
                &[&id],
            )
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(granted(&mut c, ids[0]), ("01:00:00".into(), Some("w1".into()), None), "the ledger row keeps the grant");
    let lease = |c: &mut Client, id: i64| -> (String, String) {
        let r = c
            .query_one(
                "SELECT m.lease_expires_at::text, e.lease_expires_at::text
                   FROM pgqueue.messages m JOIN pgqueue._held_entries() e USING (msg_id) WHERE m.msg_id = $1",
                &[&id],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    fn renew(c: &mut impl postgres::GenericClient, m: &common::Claimed, lease: &str) {
        let sql = format!("SELECT pgqueue.pgq_renew($1::bigint, $2::uuid, lease => '{lease}')");
        assert!(c.query_one(sql.as_str(), &[&m.id, &m.token]).unwrap().get::<_, bool>(0));
    }
    let before = lease(&mut c, ids[0]);
    assert_eq!(before.0, before.1);
    renew(&mut c, &claimed[0], "2 hours");
    let after = lease(&mut c, ids[0]);
    assert_eq!(after.0, after.1, "renewed");
    assert_ne!(after, before);
    // Rolled back, whole and to a savepoint: the lease stays.
    let mut tx = c.transaction().unwrap();
    renew(&mut tx, &claimed[0], "3 hours");
    tx.rollback().unwrap();
    let mut tx = c.transaction().unwrap();
    renew(&mut tx, &claimed[1], "4 hours");
    let mut sp = tx.savepoint("s").unwrap();
    renew(&mut sp, &claimed[0], "5 hours");
    sp.rollback().unwrap();
    tx.commit().unwrap();
    assert_eq!(lease(&mut c, ids[0]), after);
    let second = lease(&mut c, ids[1]);
    assert_eq!(second.0, second.1);
    agrees(&mut c, "held");

    // A session-bound claim (of two: through the ledger) whose session exits: its leases end
    // (the orphans step, run here by hand with the worker off, so that the re-arm does not
    // follow at once).
    common::turn_workers_off(&mut c);
    let mut s = server.connect("postgres");
    let bound: Vec<i64> = s
        .query("SELECT msg_id FROM pgqueue.pgq_claim('held', 2, session_bound => true)", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(bound, ids[2..]);
    let pid: i32 = s.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    assert_eq!(granted(&mut c, ids[2]).2, Some(pid), "and the session it is bound to");
    drop(s);
    wait_for("the session to exit", LIMIT, || {
        let gone: bool =
            c.query_one("SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)", &[&pid]).unwrap().get(0);
        gone.then_some(())
    });
    let expired: i64 = c.query_one("SELECT pgqueue._expire_orphaned_claims()", &[]).unwrap().get(0);
    assert_eq!(expired, 2);
    for &id in &ids[2..] {
        let ended = lease(&mut c, id);
        assert_eq!(ended.0, ended.1, "the lease ended by the session's exit");
    }
    agrees(&mut c, "held");
}

/// 0.25.0: the tick's "claims" step does not wait for ledger rows another transaction holds
/// locked. A pgq_drop_queue deleting them (in an order of its own) waited for the step while
/// the step waited for it: a deadlock (40P01, seen when a bench dropped its queues). The step
/// passes them over; the drop deletes them. The worker ticks once here (then once an hour),
/// before the rows exist, so that they are left for this test's step.
#[test]
fn the_claims_step_passes_over_ledger_rows_a_drop_holds() {
    let _turn = common::file_turn(file!());
    let server = Server::with_pgqueue(&["pgqueue.tick_interval = '1h'", "pgqueue.claim_ledger = on"]);
    let mut c = server.connect("postgres");
    wait_for("the worker's first tick", LIMIT, || {
        c.query_opt("SELECT FROM pgqueue.worker_state WHERE ticks > 0", &[]).unwrap().map(|_| ())
    });
    for q in ["a", "b"] {
        c.batch_execute(&format!("SELECT pgqueue.pgq_create_queue('{q}', lease => '1 hour')")).unwrap();
        send_many(&mut c, q, 4, "0");
        let claimed = [claim(&mut c, q, 2, None), claim(&mut c, q, 2, None)].concat();
        assert!(claimed.iter().all(|m| ack(&mut c, m)));
    }
    let ledger_rows = |c: &mut Client| -> Vec<String> {
        c.query("SELECT queue FROM pgqueue.claims ORDER BY claim_id", &[]).unwrap().iter().map(|r| r.get(0)).collect()
    };
    assert_eq!(ledger_rows(&mut c), ["a", "a", "b", "b"], "four ended claims left for the step");
    let mut dropping = server.connect("postgres");
    dropping.batch_execute("BEGIN; SELECT pgqueue.pgq_drop_queue('a')").unwrap();
    c.batch_execute("SET lock_timeout = '2s'").unwrap();
    let r = c.query_one("SELECT looked, pruned FROM pgqueue._prune_claims(0, 1000)", &[]).unwrap();
    assert_eq!(
        (r.get::<_, i64>(0), r.get::<_, i64>(1)),
        (4, 2),
        "b's two deleted; a's, which the drop holds, passed over"
    );
    dropping.batch_execute("COMMIT").unwrap();
    assert!(ledger_rows(&mut c).is_empty(), "the drop deleted a's");
}

/// 0.25.0: sessions with `pgqueue.claim_ledger` on and off side by side, at random, with a
/// restart in the middle: no message is claimed while another claim holds it (a session that
/// writes rows took what claims through the ledger held, before), every one is acked once,
/// and the ledger, the rows and the set agree. Right after the restart the set knows nothing
/// (the sessions that write rows ask the ledger, REPEATABLE READ included) until the worker
/// rebuilds it.
#[test]
fn sessions_with_the_setting_on_and_off_claim_each_message_once() {
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};
    let _turn = common::file_turn(file!());
    let server = Server::with_pgqueue(CONF);
    let seed = common::rng::seed_from("PGQUEUE_MIXED_SEED", "sessions_with_the_setting_on_and_off");
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('mixed', lease => '1 hour')").unwrap();
    let held = send_many(&mut c, "mixed", 4, "0");
    assert_eq!(claim(&mut c, "mixed", 2, None).iter().map(|m| m.id).collect::<Vec<_>>(), held[..2]);
    server.restart();
    let mut c = server.connect("postgres");
    let mut off = server.connect("postgres");
    off.batch_execute("SET pgqueue.claim_ledger = off; BEGIN ISOLATION LEVEL REPEATABLE READ").unwrap();
    let got = claim(&mut off, "mixed", 10, None);
    off.batch_execute("COMMIT").unwrap();
    assert_eq!(got.iter().map(|m| m.id).collect::<Vec<_>>(), held[2..], "the two the ledger holds passed over");
    assert!(got.iter().all(|m| ack(&mut c, m)));
    exact(&mut c);

    let total = 1200;
    let ids: Vec<i64> = (0..6).flat_map(|_| send_many(&mut c, "mixed", total / 6, "0")).collect();
    let in_flight: Arc<Mutex<HashSet<i64>>> = Arc::default();
    let acked: Arc<Mutex<Vec<i64>>> = Arc::default();
    let workers: Vec<_> = (0..8u64)
        .map(|w| {
            let (in_flight, acked, dsn) = (in_flight.clone(), acked.clone(), server.dsn("postgres"));
            std::thread::spawn(move || {
                let mut rng = common::Rng::new(seed, w);
                let mut c = postgres::Client::connect(&dsn, postgres::NoTls).unwrap();
                let ledger = if w % 2 == 0 { "on" } else { "off" };
                c.batch_execute(&format!("SET pgqueue.claim_ledger = {ledger}")).unwrap();
                let mut empty = 0;
                while empty < 20 {
                    let qty = rng.range(1, 4) as i32;
                    let got = if rng.chance(20) {
                        c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ").unwrap();
                        match common::try_claim(&mut c, "mixed", qty, None) {
                            Ok(got) => {
                                c.batch_execute("COMMIT").unwrap();
                                got
                            }
                            // A row claimed (so changed) since the snapshot, as in any REPEATABLE
                            // READ claim; never the ledger's ask, which reads in a snapshot of its own.
                            Err(e)
                                if e.as_db_error().is_some_and(|e| {
                                    e.message() == "could not serialize access due to concurrent update"
                                }) =>
                            {
                                c.batch_execute("ROLLBACK").unwrap();
                                empty = 0;
                                continue;
                            }
                            Err(e) => panic!("a claim in REPEATABLE READ failed: {e}"),
                        }
                    } else {
                        claim(&mut c, "mixed", qty, None)
                    };
                    empty = if got.is_empty() { empty + 1 } else { 0 };
                    for m in &got {
                        assert!(in_flight.lock().unwrap().insert(m.id), "message {} claimed twice at once", m.id);
                    }
                    if got.is_empty() {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    for m in &got {
                        assert!(in_flight.lock().unwrap().remove(&m.id));
                        assert!(ack(&mut c, m), "message {} acked under its claim", m.id);
                        acked.lock().unwrap().push(m.id);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let mut acked = acked.lock().unwrap().clone();
    acked.sort_unstable();
    assert_eq!(acked, ids, "every message acked once (the two held before the restart stay held)");
    agrees(&mut c, "mixed");
    assert!(common::ledger_disagreements(&mut c, &["mixed"]).is_empty());
}
