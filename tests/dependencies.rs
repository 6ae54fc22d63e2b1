//! Dependencies (0.17.0): `pgq_send(…, after => parents, on_parent_failure => …)` over real,
//! committing connections. A child is pending until every parent completed, and claimable
//! from the commit of the last parent's finish; a parent that fails (dead, cancelled,
//! deleted with its queue) cancels or dead-letters its children (and theirs), or counts as
//! done with 'run'.

mod common;

use common::{Client, ack, claim, claim_one, connect, history_of, new_queue, outcome, send, sqlstate, state, wait_for};
use serde_json::json;
use std::sync::{Arc, Barrier};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(30);

fn send_after(c: &mut Client, q: &str, after: &[i64], policy: &str) -> i64 {
    c.query_one("SELECT pgqueue.pgq_send($1, '{}', after => $2, on_parent_failure => $3)", &[&q, &after, &policy])
        .unwrap()
        .get(0)
}

fn send_batch_after(c: &mut Client, q: &str, n: i32, after: &[i64]) -> Vec<i64> {
    c.query(
        "SELECT pgqueue.pgq_send_batch($1, array_fill('{}'::jsonb, ARRAY[$2::int]), after => $3)",
        &[&q, &n, &after],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// Links of `child` not finished yet.
fn waiting_for(c: &mut Client, child: i64) -> i64 {
    c.query_one("SELECT count(*) FROM pgqueue.dependencies WHERE child = $1 AND parent_outcome IS NULL", &[&child])
        .unwrap()
        .get(0)
}

/// Links from `parent`: other tests run at the same time, so never count the whole table.
fn links(c: &mut Client, parent: i64) -> i64 {
    c.query_one("SELECT count(*) FROM pgqueue.dependencies WHERE parent = $1", &[&parent]).unwrap().get(0)
}

/// (relation, msg_id, state) rows of pgq_graph.
fn graph(c: &mut Client, id: i64) -> Vec<(String, i64, Option<String>)> {
    c.query("SELECT relation, id, state FROM pgqueue.pgq_graph($1)", &[&id])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

fn fail(c: &mut Client, id: i64, token: uuid::Uuid) -> bool {
    c.query_one("SELECT pgqueue.pgq_fail($1::bigint, $2::uuid)", &[&id, &token]).unwrap().get(0)
}

/// Takes the one ready message `id` of `q` and acks it.
fn run(c: &mut Client, q: &str, id: i64) {
    let m = claim_one(c, q, None);
    assert_eq!(m.id, id, "the next message is {id}");
    assert!(ack(c, &m));
}

#[test]
fn a_chain_runs_in_order() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let a = send(&mut c, &q, json!({"step": "a"}));
    let b = send_after(&mut c, &q, &[a], "cancel");
    let cc = send_after(&mut c, &q, &[b], "cancel");
    assert_eq!(state(&mut c, b).as_deref(), Some("pending"));
    assert_eq!(state(&mut c, cc).as_deref(), Some("pending"));
    assert_eq!(
        graph(&mut c, b),
        vec![
            ("message".into(), b, Some("pending".into())),
            ("parent".into(), a, Some("ready".into())),
            ("child".into(), cc, Some("pending".into()))
        ]
    );
    let m = claim_one(&mut c, &q, None);
    assert_eq!(m.id, a);
    assert!(claim(&mut c, &q, 10, None).is_empty(), "b waits for a");
    // Not at the ack's statement: at its commit.
    let mut tx = c.transaction().unwrap();
    assert!(ack(&mut tx, &m));
    assert_eq!(state(&mut tx, b).as_deref(), Some("ready"), "inside the acking transaction");
    let mut other = connect();
    assert_eq!(state(&mut other, b).as_deref(), Some("pending"), "before the commit");
    tx.commit().unwrap();
    assert_eq!(state(&mut other, b).as_deref(), Some("ready"), "at the commit");
    run(&mut c, &q, b);
    run(&mut c, &q, cc);
    let parents: Vec<i64> =
        c.query_one("SELECT after FROM pgqueue.history WHERE msg_id = $1", &[&cc]).unwrap().get::<_, Vec<i64>>(0);
    assert_eq!(parents, vec![b], "history keeps the parents");
    assert_eq!(
        c.query_one("SELECT count(*) FROM pgqueue.dependencies WHERE child = ANY($1)", &[&vec![b, cc]])
            .unwrap()
            .get::<_, i64>(0),
        0,
        "links go with their child"
    );
}

#[test]
fn fan_in_across_queues_and_fan_out_in_a_batch() {
    let mut c = connect();
    let (q1, q2) = (new_queue(&mut c, ""), new_queue(&mut c, ""));
    let p1 = send(&mut c, &q1, json!({}));
    let p2 = send(&mut c, &q2, json!({}));
    let p3 = send(&mut c, &q2, json!({}));
    let child = send_after(&mut c, &q1, &[p1, p2, p3], "cancel");
    let fanned = send_batch_after(&mut c, &q2, 3, &[p1]);
    assert_eq!(fanned.len(), 3);
    assert_eq!(waiting_for(&mut c, child), 3);
    run(&mut c, &q1, p1);
    assert_eq!(waiting_for(&mut c, child), 2);
    assert_eq!(state(&mut c, child).as_deref(), Some("pending"));
    for id in &fanned {
        assert_eq!(state(&mut c, *id).as_deref(), Some("ready"), "the batch waited for p1 only");
    }
    // Both of q2's parents in one batch ack.
    let ms = claim(&mut c, &q2, 2, None);
    assert_eq!(ms.iter().map(|m| m.id).collect::<Vec<_>>(), vec![p2, p3]);
    let acked: Vec<i64> = c
        .query(
            "SELECT * FROM pgqueue.pgq_ack($1::bigint[], $2::uuid[])",
            &[&ms.iter().map(|m| m.id).collect::<Vec<_>>(), &ms.iter().map(|m| m.token).collect::<Vec<_>>()],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(acked, vec![p2, p3]);
    assert_eq!(state(&mut c, child).as_deref(), Some("ready"));
    run(&mut c, &q1, child);
}

#[test]
fn a_parent_finished_before_the_send_counts_as_it_ended() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let done = send(&mut c, &q, json!({}));
    run(&mut c, &q, done);
    let dead = send(&mut c, &q, json!({}));
    let m = claim_one(&mut c, &q, None);
    assert!(fail(&mut c, m.id, m.token));

    let after_done = send_after(&mut c, &q, &[done], "cancel");
    assert_eq!(state(&mut c, after_done).as_deref(), Some("ready"), "completed: done");
    run(&mut c, &q, after_done);
    let cancelled = send_after(&mut c, &q, &[done, dead], "cancel");
    let h = history_of(&mut c, cancelled);
    assert_eq!(h[0].result(), ("cancelled", 0, Some(&*format!("parent {dead} was dead-lettered"))));
    let dead_child = send_after(&mut c, &q, &[dead], "dead");
    assert_eq!(outcome(&mut c, dead_child).as_deref(), Some("dead"));
    let runs = send_after(&mut c, &q, &[dead], "run");
    assert_eq!(state(&mut c, runs).as_deref(), Some("ready"), "run: a failure counts as done");
    // Delayed: once its parents completed, it waits for its own due time.
    let delayed: i64 = c
        .query_one("SELECT pgqueue.pgq_send($1, '{}', delay => '1 hour', after => ARRAY[$2::bigint])", &[&q, &done])
        .unwrap()
        .get(0);
    assert_eq!(state(&mut c, delayed).as_deref(), Some("delayed"));
}

#[test]
fn a_failed_parent_cancels_or_dead_letters_down_the_graph() {
    let mut c = connect();
    let q = new_queue(&mut c, ", max_attempts => 1");
    let root = send(&mut c, &q, json!({}));
    let cancel_child = send_after(&mut c, &q, &[root], "cancel");
    let grandchild = send_after(&mut c, &q, &[cancel_child], "dead");
    let dead_child = send_after(&mut c, &q, &[root], "dead");
    let run_child = send_after(&mut c, &q, &[root], "run");
    let run_grandchild = send_after(&mut c, &q, &[run_child], "cancel");
    let m = claim_one(&mut c, &q, None);
    assert_eq!(m.id, root);
    assert!(fail(&mut c, m.id, m.token));
    let why = format!("parent {root} was dead-lettered");
    assert_eq!(history_of(&mut c, cancel_child)[0].result(), ("cancelled", 0, Some(why.as_str())));
    assert_eq!(
        history_of(&mut c, grandchild)[0].result(),
        ("dead", 0, Some(&*format!("parent {cancel_child} was cancelled")))
    );
    assert_eq!(history_of(&mut c, dead_child)[0].result(), ("dead", 0, Some(why.as_str())));
    assert_eq!(state(&mut c, run_child).as_deref(), Some("ready"));
    assert_eq!(state(&mut c, run_grandchild).as_deref(), Some("pending"));
    // A cancel of a pending child: its links go, its parent is unaffected.
    let p = send(&mut c, &q, json!({}));
    let ch = send_after(&mut c, &q, &[p], "cancel");
    assert!(c.query_one("SELECT pgqueue.pgq_cancel($1::bigint)", &[&ch]).unwrap().get::<_, bool>(0));
    assert_eq!(waiting_for(&mut c, ch), 0);
    assert_eq!(state(&mut c, p).as_deref(), Some("ready"));
    // Lease end on the last attempt, and a cancel of a waiting parent.
    let p2 = send(&mut c, &q, json!({}));
    let ch2 = send_after(&mut c, &q, &[p2], "cancel");
    run(&mut c, &q, run_child);
    let _ = run_grandchild;
    let held = claim(&mut c, &q, 10, Some("10 ms"));
    assert!(held.iter().any(|m| m.id == p2), "{held:?}");
    std::thread::sleep(Duration::from_millis(30));
    c.query("SELECT * FROM pgqueue.pgq_rearm(queue => $1)", &[&q]).unwrap();
    wait_for("the lease's end to dead-letter p2", LIMIT, || outcome(&mut c, p2));
    assert_eq!(outcome(&mut c, ch2).as_deref(), Some("cancelled"));
}

#[test]
fn dropping_a_queue_deletes_parents_of_other_queues_children() {
    let mut c = connect();
    let (doomed, kept) = (new_queue(&mut c, ""), new_queue(&mut c, ""));
    let p = send(&mut c, &doomed, json!({}));
    let cancelled = send_after(&mut c, &kept, &[p], "cancel");
    let runs = send_after(&mut c, &kept, &[p], "run");
    let orphan_child = send_after(&mut c, &doomed, &[runs], "cancel");
    c.execute("SELECT pgqueue.pgq_drop_queue($1)", &[&doomed]).unwrap();
    assert_eq!(history_of(&mut c, cancelled)[0].result(), ("cancelled", 0, Some(&*format!("parent {p} was deleted"))));
    assert_eq!(state(&mut c, runs).as_deref(), Some("ready"));
    assert_eq!(
        c.query_one("SELECT count(*) FROM pgqueue.dependencies WHERE child = $1 OR parent = $1", &[&orphan_child])
            .unwrap()
            .get::<_, i64>(0),
        0
    );
}

#[test]
fn bad_dependencies_are_refused_and_change_nothing() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let p = send(&mut c, &q, json!({}));
    let before = links(&mut c, p);
    let count = |c: &mut Client| -> i64 {
        c.query_one("SELECT count(*) FROM pgqueue.messages WHERE queue = $1", &[&q]).unwrap().get(0)
    };
    let n = count(&mut c);
    let cases: [(&str, &str); 7] = [
        ("SELECT pgqueue.pgq_send($1, '{}', after => ARRAY[-1]::bigint[])", "23503"),
        ("SELECT pgqueue.pgq_send($1, '{}', after => ARRAY[$2, $2]::bigint[])", "22023"),
        ("SELECT pgqueue.pgq_send($1, '{}', after => ARRAY[$2, NULL]::bigint[])", "22004"),
        ("SELECT pgqueue.pgq_send($1, '{}', after => ARRAY[$2]::bigint[], on_parent_failure => 'retry')", "22023"),
        ("SELECT pgqueue.pgq_send($1, '{}', after => ARRAY[$2]::bigint[], on_parent_failure => NULL)", "22004"),
        ("SELECT pgqueue.pgq_send($1, '{}', after => array_fill($2, ARRAY[10001]))", "22023"),
        ("SELECT pgqueue.pgq_send_batch($1, ARRAY['{}'::jsonb], after => ARRAY[$2, -2]::bigint[])", "23503"),
    ];
    for (sql, code) in cases {
        let sql = sql.replace("$2", &p.to_string());
        assert_eq!(sqlstate(c.query(&sql, &[&q])), code, "{sql}");
    }
    // A parent of a queue dropped since is gone with it.
    let doomed = new_queue(&mut c, "");
    let gone = send(&mut c, &doomed, json!({}));
    c.execute("SELECT pgqueue.pgq_drop_queue($1)", &[&doomed]).unwrap();
    assert_eq!(
        sqlstate(c.query("SELECT pgqueue.pgq_send($1, '{}', after => ARRAY[$2::bigint])", &[&q, &gone])),
        "23503"
    );
    // A parent sent by a transaction not committed yet does not exist yet.
    let mut sender = connect();
    let mut tx = sender.transaction().unwrap();
    let unseen = send(&mut tx, &q, json!({}));
    assert_eq!(
        sqlstate(c.query("SELECT pgqueue.pgq_send($1, '{}', after => ARRAY[$2::bigint])", &[&q, &unseen])),
        "23503"
    );
    tx.rollback().unwrap();
    assert_eq!(links(&mut c, p), before);
    assert_eq!(count(&mut c), n);
    assert_eq!(
        c.query_one("SELECT has_dependents FROM pgqueue.messages WHERE msg_id = $1", &[&p])
            .unwrap()
            .get::<_, Option<bool>>(0),
        None,
        "a refused send leaves its parent unmarked"
    );
}

/// A restore loads the links and the messages one table after the other, and the worker may
/// tick in between: links whose child is not loaded yet are not orphans, and a pending message
/// whose links are not loaded yet is not done waiting. Both halves, with a tick that collects.
#[test]
fn a_tick_between_a_restores_tables_neither_collects_links_nor_releases_children() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let p = send(&mut c, &q, json!({}));
    let child = send_after(&mut c, &q, &[p], "cancel");
    // Links loaded, their child not yet: a link to an id in neither the queue nor the history.
    let unloaded = p + 1_000_000_000;
    c.execute(
        "INSERT INTO pgqueue.dependencies (parent, child, on_parent_failure) VALUES ($1, $2, 'cancel')",
        &[&p, &unloaded],
    )
    .unwrap();
    // The child loaded, its links not yet.
    c.execute("DELETE FROM pgqueue.dependencies WHERE child = $1", &[&child]).unwrap();
    // A full tick that collects (the prune cadence is due).
    c.batch_execute("UPDATE pgqueue.worker_state SET last_prune_at = NULL").unwrap();
    let failed: i64 = c.query_one("SELECT count(*) FROM pgqueue.pgq_tick()", &[]).unwrap().get(0);
    assert_eq!(failed, 0);
    assert_eq!(
        c.query_one("SELECT count(*) FROM pgqueue.dependencies WHERE child = $1", &[&unloaded])
            .unwrap()
            .get::<_, i64>(0),
        1,
        "a link whose child is not loaded yet is kept"
    );
    assert_eq!(state(&mut c, child).as_deref(), Some("pending"), "a child whose links are not loaded yet waits");
    // The rest of the restore arrives: the child's link, and the parent's ack releases it.
    c.execute("DELETE FROM pgqueue.dependencies WHERE child = $1", &[&unloaded]).unwrap();
    c.execute(
        "INSERT INTO pgqueue.dependencies (parent, child, on_parent_failure) VALUES ($1, $2, 'cancel')",
        &[&p, &child],
    )
    .unwrap();
    let (id, token) = claim_one(&mut c, &q, None).held();
    assert_eq!(id, p);
    assert!(c.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&id, &token]).unwrap().get::<_, bool>(0));
    assert_eq!(state(&mut c, child).as_deref(), Some("ready"));
}

/// A child sent while its parent is being acked, in every order: never left pending once
/// both committed (no worker needed: the send and the ack see each other).
#[test]
fn a_send_racing_its_parents_ack_is_never_left_waiting() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    for round in 0..100 {
        let p = send(&mut c, &q, json!({"round": round}));
        let m = claim_one(&mut c, &q, None);
        assert_eq!(m.id, p);
        let start = Arc::new(Barrier::new(2));
        let (q2, s2) = (q.clone(), start.clone());
        let sender = std::thread::spawn(move || {
            let mut c = connect();
            s2.wait();
            send_after(&mut c, &q2, &[p], "cancel")
        });
        start.wait();
        assert!(ack(&mut c, &m));
        let child = sender.join().unwrap();
        assert_eq!(state(&mut c, child).as_deref(), Some("ready"), "round {round}");
        run(&mut c, &q, child);
    }
}

/// Sends `PARENTS` parents and a child after them, claims the parents, and acks each in a
/// transaction of its own connection; every ack is made before any commits, so each sees the
/// others' links unfinished and none releases the child. Returns the child.
fn ack_parents_together(c: &mut Client, ackers: &mut [Client], q: &str) -> i64 {
    let parents: Vec<i64> = (0..ackers.len()).map(|_| send(c, q, json!({}))).collect();
    let child = send_after(c, q, &parents, "cancel");
    let held = claim(c, q, ackers.len() as i32, None);
    assert_eq!(held.iter().map(|m| m.id).collect::<Vec<_>>(), parents);
    let acked = Barrier::new(ackers.len());
    std::thread::scope(|s| {
        for (a, m) in ackers.iter_mut().zip(&held) {
            let acked = &acked;
            s.spawn(move || {
                let mut tx = a.transaction().unwrap();
                assert!(ack(&mut tx, m));
                acked.wait();
                tx.commit().unwrap();
            });
        }
    });
    child
}

/// The worker releases such a child, woken by those commits (its ticks are an hour apart
/// here: only the hand-over can do it).
#[test]
fn the_worker_releases_a_child_whose_last_parents_finished_together() {
    let server = common::server::Server::with_pgqueue(&["pgqueue.tick_interval = '1h'"]);
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('fan')").unwrap();
    wait_for("the worker's first tick", LIMIT, || {
        let ticks: i64 = c.query_one("SELECT ticks FROM pgqueue.worker_state", &[]).unwrap().get(0);
        (ticks > 0).then_some(())
    });
    let mut ackers: Vec<Client> = (0..6).map(|_| server.connect("postgres")).collect();
    const ROUNDS: i64 = 25;
    for round in 0..ROUNDS {
        let child = ack_parents_together(&mut c, &mut ackers, "fan");
        wait_for(&format!("round {round}: the child released"), LIMIT, || {
            (state(&mut c, child).as_deref() == Some("ready")).then_some(())
        });
        run(&mut c, "fan", child);
    }
    let (released, failures): (i64, i64) = {
        let r = c.query_one("SELECT released, dependency_failures FROM pgqueue.worker_state", &[]).unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((released, failures), (ROUNDS, 0), "every child released by the worker");
}

/// Without the worker (or its shared memory), pgq_tick() finds such a child.
#[test]
fn pgq_tick_releases_a_child_whose_last_parents_finished_together() {
    let server = common::server::Server::with_pgqueue(&["pgqueue.enabled = off"]);
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('fan')").unwrap();
    let mut ackers: Vec<Client> = (0..4).map(|_| server.connect("postgres")).collect();
    let child = ack_parents_together(&mut c, &mut ackers, "fan");
    assert_eq!(state(&mut c, child).as_deref(), Some("pending"), "no ack released it");
    let failed: i64 = c.query_one("SELECT count(*) FROM pgqueue.pgq_tick()", &[]).unwrap().get(0);
    assert_eq!(failed, 0);
    assert_eq!(state(&mut c, child).as_deref(), Some("ready"));
    // A parent deleted around the API: its child follows its policy at the next tick.
    let p = send(&mut c, "fan", json!({}));
    let orphan = send_after(&mut c, "fan", &[p], "dead");
    c.execute("DELETE FROM pgqueue.message_rows WHERE msg_id = $1", &[&p]).unwrap();
    c.query("SELECT * FROM pgqueue.pgq_tick()", &[]).unwrap();
    assert_eq!(history_of(&mut c, orphan)[0].result(), ("dead", 0, Some(&*format!("parent {p} was deleted"))));
}
