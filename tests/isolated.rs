//! Tests that need the cluster to themselves, one at a time, with the worker off: plan and
//! write shape (not time: the claim walks the partial index and touches the same number of
//! buffers however many rows are in flight or delayed; renewals are HOT), and the
//! all-queues housekeeping (pgq_tick, prune backoff) that would disturb other tests.

mod common;

use common::{Client, connect, connect_with_notices, prune, queue_with_old_history, unique_queue};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// These tests read table-wide counters or act on every queue: they must not overlap.
static SERIAL: Mutex<()> = Mutex::new(());

/// What auto_explain reported for one statement run inside pgq_claim.
#[derive(Debug)]
struct Nested {
    buffers: i64,
    indexes: Vec<String>,
    plan: Value,
}

fn walk(plan: &Value, indexes: &mut Vec<String>) {
    if let Some(name) = plan.get("Index Name").and_then(Value::as_str) {
        indexes.push(name.to_string());
    }
    for child in plan.get("Plans").and_then(Value::as_array).into_iter().flatten() {
        walk(child, indexes);
    }
}

/// Runs `sql` (rolled back, so the queue stays as it is; the least of three runs: the first
/// may set hint bits the others do not) and returns what the nested statement whose text has
/// both `marks` did.
fn explain_nested(c: &mut Client, notices: &Arc<Mutex<Vec<String>>>, sql: &str, q: &str, marks: [&str; 2]) -> Nested {
    let mut best: Option<Nested> = None;
    for _ in 0..3 {
        notices.lock().unwrap().clear();
        let mut tx = c.transaction().unwrap();
        tx.query(sql, &[&q]).unwrap();
        tx.rollback().unwrap();
        let mut found = None;
        for notice in notices.lock().unwrap().iter() {
            let Some(start) = notice.find('{') else {
                continue;
            };
            let Ok(doc) = serde_json::from_str::<Value>(&notice[start..]) else {
                continue;
            };
            let text = doc["Query Text"].as_str().unwrap_or_default().to_string();
            if !marks.iter().all(|m| text.contains(m)) {
                continue;
            }
            let plan = &doc["Plan"];
            let buffers =
                plan["Shared Hit Blocks"].as_i64().unwrap_or(0) + plan["Shared Read Blocks"].as_i64().unwrap_or(0);
            let mut indexes = vec![];
            walk(plan, &mut indexes);
            found = Some(Nested { buffers, indexes, plan: plan.clone() });
        }
        let found = found.unwrap_or_else(|| panic!("no plan logged for a statement with {marks:?}"));
        if best.as_ref().is_none_or(|b| found.buffers < b.buffers) {
            best = Some(found);
        }
    }
    best.unwrap()
}

/// The rows the plan's CTE scans read, over all their loops (those their filters removed too).
fn cte_rows_read(plan: &Value) -> f64 {
    let loops = plan["Actual Loops"].as_f64().unwrap_or(0.0);
    let own = if plan["Node Type"] == "CTE Scan" {
        (plan["Actual Rows"].as_f64().unwrap_or(0.0) + plan["Rows Removed by Filter"].as_f64().unwrap_or(0.0)) * loops
    } else {
        0.0
    };
    own + plan.get("Plans").and_then(Value::as_array).into_iter().flatten().map(cte_rows_read).sum::<f64>()
}

/// The claim statement of one `pgq_claim($1, 1)` (it must claim a message).
fn explain_claim(c: &mut Client, notices: &Arc<Mutex<Vec<String>>>, q: &str) -> Nested {
    explain_nested(c, notices, "SELECT * FROM pgqueue.pgq_claim($1, 1)", q, ["state = 'ready'", "SKIP LOCKED"])
}

/// The promotion statement, as claims and the worker's tick run it.
fn explain_promotion(c: &mut Client, notices: &Arc<Mutex<Vec<String>>>, q: &str) -> Nested {
    explain_nested(c, notices, "SELECT pgqueue._promote_due($1, 1000)", q, ["state = 'delayed'", "SKIP LOCKED"])
}

/// Whether one claim ran the promotion (it need not when nothing can be due).
fn claim_promotes(c: &mut Client, notices: &Arc<Mutex<Vec<String>>>, q: &str) -> bool {
    notices.lock().unwrap().clear();
    let mut tx = c.transaction().unwrap();
    tx.query("SELECT * FROM pgqueue.pgq_claim($1, 1)", &[&q]).unwrap();
    tx.rollback().unwrap();
    notices.lock().unwrap().iter().any(|n| n.contains("state = 'delayed'") && n.contains("SKIP LOCKED"))
}

fn vacuum(c: &mut Client) {
    c.batch_execute("VACUUM (ANALYZE) pgqueue.message_rows").unwrap();
}

/// A session whose nested statements' plans arrive as notices, with `extra` settings.
fn explaining_session(extra: &str) -> (Client, Arc<Mutex<Vec<String>>>) {
    common::disable_worker();
    let notices = Arc::new(Mutex::new(Vec::new()));
    let mut c = connect_with_notices(notices.clone());
    c.batch_execute(&format!(
        "LOAD 'auto_explain';
         SET auto_explain.log_min_duration = 0; SET auto_explain.log_analyze = on;
         SET auto_explain.log_buffers = on; SET auto_explain.log_timing = off;
         SET auto_explain.log_nested_statements = on; SET auto_explain.log_format = 'json';
         SET auto_explain.log_level = 'notice'; SET plan_cache_mode = 'force_generic_plan'; {extra}"
    ))
    .unwrap();
    (c, notices)
}

#[test]
fn claim_cost_is_flat_in_in_flight_and_delayed_rows() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Buffers are compared on one plan shape: the index path, which a 20-row table might
    // otherwise trade for a sequential scan. The last check below uses default settings.
    let (mut c, notices) = explaining_session("SET enable_seqscan = off");
    let q = unique_queue("flat");
    c.execute("SELECT pgqueue.pgq_create_queue($1)", &[&q]).unwrap();
    let ready: Vec<Value> = (0..20).map(|i| json!({ "i": i })).collect();
    c.execute("SELECT pgqueue.pgq_send_batch($1, $2)", &[&q, &ready]).unwrap();
    vacuum(&mut c);
    let claim0 = explain_claim(&mut c, &notices, &q);
    let promote0 = explain_promotion(&mut c, &notices, &q);

    // 10,000 in-flight rows that sort *ahead* of the ready ones (higher priority): a design
    // that filtered leases per row would scan past every one of them.
    let payloads: Vec<Value> = (0..1000).map(|i| json!({ "i": i })).collect();
    for _ in 0..10 {
        c.execute("SELECT pgqueue.pgq_send_batch($1, $2, priority => 10::smallint)", &[&q, &payloads]).unwrap();
        c.execute("SELECT count(*) FROM pgqueue.pgq_claim($1, 1000, '1 hour')", &[&q]).unwrap();
    }
    vacuum(&mut c);
    let claim1 = explain_claim(&mut c, &notices, &q);
    let promote1 = explain_promotion(&mut c, &notices, &q);
    // Committed claims found nothing delayed: later claims skip the promotion altogether.
    assert!(!claim_promotes(&mut c, &notices, &q), "a claim promoted although nothing is delayed");

    // Plus 10,000 delayed rows, not yet due, also at the higher priority.
    for _ in 0..10 {
        c.execute(
            "SELECT pgqueue.pgq_send_batch($1, $2, delay => '1 hour', priority => 10::smallint)",
            &[&q, &payloads],
        )
        .unwrap();
    }
    vacuum(&mut c);
    let claim2 = explain_claim(&mut c, &notices, &q);
    let promote2 = explain_promotion(&mut c, &notices, &q);
    assert!(!claim_promotes(&mut c, &notices, &q), "a claim promoted although nothing is due for an hour");

    let summary = format!(
        "buffers per claim statement {} / {} / {}, per promotion {} / {} / {} (0 / 10k in flight / + 10k delayed)",
        claim0.buffers, claim1.buffers, claim2.buffers, promote0.buffers, promote1.buffers, promote2.buffers
    );
    for (label, n) in
        [("nothing in flight", &claim0), ("10k in flight", &claim1), ("10k in flight + 10k delayed", &claim2)]
    {
        assert!(n.indexes.contains(&"messages_ready_idx".to_string()), "{label}: {n:?}");
    }
    // A btree level more is the most a larger index may add (plus the in-flight index's
    // own growth on insert); scanning past rows would add hundreds.
    assert!(claim1.buffers <= claim0.buffers + 6, "{summary}");
    assert!(claim2.buffers <= claim0.buffers + 6, "{summary}");
    assert!(promote1.buffers <= promote0.buffers + 3, "{summary}");
    assert!(promote2.buffers <= promote0.buffers + 3, "{summary}");

    // With default planner settings on the now large table, both statements take their
    // partial index.
    let (mut fresh, notices) = explaining_session("");
    let claim = explain_claim(&mut fresh, &notices, &q);
    let promote = explain_promotion(&mut fresh, &notices, &q);
    assert!(claim.indexes.contains(&"messages_ready_idx".to_string()), "claim plan: {claim:?}");
    assert!(promote.indexes.contains(&"messages_delayed_idx".to_string()), "promotion plan: {promote:?}");
}

/// A claim reads the ready index from its hint, not the primary key: in msg_id order the
/// key also holds every row that is not ready (claimed, delayed, other queues', dead
/// versions). Statistics taken while the queue was all ready, then 45,000 rows claimed past
/// the first ready one (held back by a claim that rolls back): a generic plan for "= priority
/// ORDER BY msg_id" took the key here and walked all 45,000 (as under 256 consumers, where
/// autovacuum's statistics see a queue of ready rows). On a server of its own, autovacuum
/// off, so that the statistics stay those of a table that is one queue, all ready.
#[test]
fn a_claim_does_not_walk_rows_that_are_not_ready_in_msg_id_order() {
    let server = common::server::Server::with_pgqueue(&["autovacuum = off"]);
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('head')").unwrap();
    let thousand: Vec<Value> = (0..1000).map(|i| json!({ "i": i })).collect();
    for _ in 0..50 {
        c.execute("SELECT pgqueue.pgq_send_batch('head', $1)", &[&thousand]).unwrap();
    }
    c.execute("SELECT pgqueue.pgq_tick()", &[]).unwrap();
    c.batch_execute("VACUUM ANALYZE pgqueue.message_rows").unwrap();
    let mut held = server.connect("postgres");
    let mut hold = held.transaction().unwrap();
    let first: i64 = hold.query_one("SELECT msg_id FROM pgqueue.pgq_claim('head')", &[]).unwrap().get(0);
    for _ in 0..45 {
        c.execute("SELECT count(*) FROM pgqueue.pgq_claim('head', 1000)", &[]).unwrap();
    }
    hold.rollback().unwrap();
    c.batch_execute("VACUUM pgqueue.message_rows").unwrap();
    let second: i64 = c
        .query_one("SELECT min(msg_id) FROM pgqueue.messages WHERE state = 'ready' AND msg_id > $1", &[&first])
        .unwrap()
        .get(0);
    assert!(second - first > 45_000, "claimed rows lie between {first} and {second}");
    let tracked: bool =
        c.query_one("SELECT tracked FROM pgqueue.queue_depth WHERE queue = 'head'", &[]).unwrap().get(0);
    assert!(tracked, "the queue has hints");
    // A session's first claims get custom plans, later ones a generic plan: both.
    for mode in ["force_custom_plan", "force_generic_plan"] {
        let mut c = server.connect("postgres");
        c.batch_execute(&format!("SET plan_cache_mode = {mode}")).unwrap();
        let mut tx = c.transaction().unwrap();
        let got: Vec<i64> = tx
            .query("SELECT msg_id FROM pgqueue.pgq_claim('head', 2)", &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(got, [first, second], "{mode}: FIFO");
        let row = tx
            .query_one(
                "SELECT pg_catalog.pg_stat_get_xact_tuples_returned('pgqueue.messages_pkey'::regclass),
                        pg_catalog.pg_stat_get_xact_tuples_returned('pgqueue.messages_ready_idx'::regclass)",
                &[],
            )
            .unwrap();
        let (key, ready): (i64, i64) = (row.get(0), row.get(1));
        // The claim's update finds its two rows by key; the pick reads two ready entries.
        assert!(key <= 10 && (2..=10).contains(&ready), "{mode}: index entries read: key {key}, ready {ready}");
        tx.rollback().unwrap();
    }
}

/// A pinned xmin horizon (a session holding an xid) keeps the index entries of every message
/// claimed and acked since in `messages_ready_idx`; the claim starts at its hint, past them,
/// so it touches as many buffers with 20,000 such entries ahead of it as with none. The same
/// scan from the start of the queue (what a claim does without hints) touches hundreds.
#[test]
fn a_pinned_horizon_does_not_make_claims_walk_dead_entries() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (mut c, notices) = explaining_session("SET enable_seqscan = off");
    let q = unique_queue("pinned");
    c.execute("SELECT pgqueue.pgq_create_queue($1)", &[&q]).unwrap();
    let twenty: Vec<Value> = (0..20).map(|i| json!({ "i": i })).collect();
    c.execute("SELECT pgqueue.pgq_send_batch($1, $2)", &[&q, &twenty]).unwrap();
    // The worker is off in this binary: a tick checks the new queue's hints.
    c.execute("SELECT pgqueue.pgq_tick()", &[]).unwrap();
    vacuum(&mut c);
    let before = explain_claim(&mut c, &notices, &q);
    let tracked: bool = c.query_one("SELECT tracked FROM pgqueue.queue_depth WHERE queue = $1", &[&q]).unwrap().get(0);
    assert!(tracked, "the queue has hints");

    let mut pin = connect();
    pin.batch_execute("BEGIN; SELECT txid_current();").unwrap();
    // Claim and ack the 20 and 20,000 more: all dead to everyone but the pinned snapshot.
    let thousand: Vec<Value> = (0..1000).map(|i| json!({ "i": i })).collect();
    for round in 0..21 {
        if round > 0 {
            c.execute("SELECT pgqueue.pgq_send_batch($1, $2)", &[&q, &thousand]).unwrap();
        }
        c.execute(
            "WITH got AS (SELECT msg_id, claim_token FROM pgqueue.pgq_claim($1, 1000))
             SELECT count(*) FROM got, pgqueue.pgq_ack(ARRAY[got.msg_id], ARRAY[got.claim_token])",
            &[&q],
        )
        .unwrap();
    }
    c.execute("SELECT pgqueue.pgq_send_batch($1, $2)", &[&q, &twenty]).unwrap();
    vacuum(&mut c);
    let dead: i64 = c
        .query_one("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'pgqueue.message_rows'::regclass", &[])
        .unwrap()
        .get(0);
    let after = explain_claim(&mut c, &notices, &q);
    // The same scan from the start of the queue, for contrast.
    let from_start: i64 = {
        let plan: Value = c
            .query_one(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
                 SELECT m.msg_id FROM pgqueue.messages m WHERE m.queue = $1 AND m.state = 'ready'
                  ORDER BY m.priority DESC, m.msg_id LIMIT 1",
                &[&q],
            )
            .unwrap()
            .get(0);
        let plan = &plan[0]["Plan"];
        plan["Shared Hit Blocks"].as_i64().unwrap_or(0) + plan["Shared Read Blocks"].as_i64().unwrap_or(0)
    };
    pin.batch_execute("ROLLBACK").unwrap();
    let summary = format!(
        "claim buffers {} before, {} with 20,000 dead entries ahead ({dead} dead tuples kept by the pin); \
         the scan from the start: {from_start}",
        before.buffers, after.buffers
    );
    // 20,020 deletes, and with the claim ledger off as many claims' old row versions (a claim
    // through the ledger writes no row); the statistics may lag by a round.
    assert!(dead >= 15_000, "the pin keeps the dead rows: {summary}");
    assert!(from_start > after.buffers + 50, "without hints the scan walks the dead entries: {summary}");
    assert!(after.buffers <= before.buffers + 3, "{summary}");
    assert!(after.indexes.contains(&"messages_ready_idx".to_string()), "{after:?}");
    eprintln!("{summary}");
}

fn hot_counters(c: &mut Client) -> (i64, i64) {
    c.batch_execute("SELECT pg_stat_force_next_flush()").unwrap();
    c.batch_execute("SELECT pg_stat_clear_snapshot()").unwrap();
    let row = c
        .query_one(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'pgqueue.message_rows'::regclass",
            &[],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

#[test]
fn renewals_are_hot_updates() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    common::disable_worker();
    let mut c = connect();
    let q = unique_queue("hot");
    c.execute("SELECT pgqueue.pgq_create_queue($1)", &[&q]).unwrap();
    let payloads: Vec<Value> = (0..100).map(|i| json!({ "job": i, "pad": "x".repeat(100) })).collect();
    c.execute("SELECT pgqueue.pgq_send_batch($1, $2)", &[&q, &payloads]).unwrap();
    let held: Vec<(i64, uuid::Uuid)> = c
        .query("SELECT msg_id, claim_token FROM pgqueue.pgq_claim($1, 100)", &[&q])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let (upd0, hot0) = hot_counters(&mut c);
    for _ in 0..5 {
        for (id, token) in &held {
            let ok: bool = c.query_one("SELECT pgqueue.pgq_renew($1::bigint, $2::uuid)", &[id, token]).unwrap().get(0);
            assert!(ok);
        }
    }
    let (upd1, hot1) = hot_counters(&mut c);
    let (upd, hot) = (upd1 - upd0, hot1 - hot0);
    eprintln!("renewals: {upd} updates, {hot} HOT");
    assert!(upd >= 500, "every renewal counted: {upd}");
    assert!(hot * 100 >= upd * 95, "renewals are HOT: {hot} of {upd}");
}

#[test]
fn repeatedly_blocked_pruning_backs_off() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    common::disable_worker();
    let mut c = connect();
    let (q, part) = queue_with_old_history(&mut c, 1);
    let mut reader = connect();
    reader.batch_execute(&format!("BEGIN; SELECT count(*) FROM pgqueue.{part}")).unwrap();
    // The all-queues form (the worker's) backs a queue off after three blocked attempts.
    let outcome = |c: &mut Client| -> String {
        c.query_one("SELECT outcome FROM pgqueue.pgq_prune() WHERE queue = $1", &[&q]).unwrap().get(0)
    };
    let seen: Vec<String> = (0..4).map(|_| outcome(&mut c)).collect();
    assert_eq!(seen, ["blocked", "blocked", "blocked", "backed_off"]);
    // Naming the queue tries anyway; success clears the backoff.
    reader.batch_execute("COMMIT").unwrap();
    assert_eq!(prune(&mut c, &q)[0].1, "pruned");
    assert_eq!(outcome(&mut c), "noop");
}

#[test]
fn pgq_tick_does_a_ticks_work_in_the_calling_session() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    common::disable_worker();
    // A database of its own: one tick's re-arm pass has a time budget, which the claims
    // other tests leave in flight could use up before it reaches this test's.
    let db = unique_queue("tickdb");
    connect().batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
    let mut c = common::connect_to(&db);
    c.batch_execute("CREATE EXTENSION pgqueue").unwrap();
    let q = unique_queue("tick");
    c.execute("SELECT pgqueue.pgq_create_queue($1)", &[&q]).unwrap();
    c.execute("SELECT pgqueue.pgq_send($1, '{}')", &[&q]).unwrap();
    c.execute("SELECT pgqueue.pgq_send($1, '{}', delay => '50 ms')", &[&q]).unwrap();
    c.execute("SELECT * FROM pgqueue.pgq_claim($1, lease => '10 ms')", &[&q]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let before: i64 = c.query_one("SELECT ticks FROM pgqueue.worker_stats", &[]).unwrap().get(0);
    let failures = c.query("SELECT step, error FROM pgqueue.pgq_tick()", &[]).unwrap();
    assert!(
        failures.is_empty(),
        "no step failed: {:?}",
        failures.iter().map(|r| r.get::<_, String>(1)).collect::<Vec<_>>()
    );
    let ready: i64 = c
        .query_one("SELECT count(*) FROM pgqueue.messages WHERE queue = $1 AND state = 'ready'", &[&q])
        .unwrap()
        .get(0);
    assert_eq!(ready, 2, "the expired claim re-armed and the due message promoted");
    let after: i64 = c.query_one("SELECT ticks FROM pgqueue.worker_stats", &[]).unwrap().get(0);
    assert!(after > before, "the tick is counted");
    drop(c);
    connect().batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)")).unwrap();
}

/// Index entries of `messages_claimed_idx` read so far (by this cluster).
fn claimed_idx_reads(c: &mut Client) -> i64 {
    c.batch_execute("SELECT pg_stat_force_next_flush(); SELECT pg_stat_clear_snapshot();").unwrap();
    c.query_one("SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = 'messages_claimed_idx'", &[])
        .unwrap()
        .get(0)
}

/// The re-arm pass starts where claimed messages start (shared memory keeps that msg_id,
/// lowered by every claim at commit): with a pinned horizon keeping the entries of 20,000
/// finished messages in the in-flight index, a tick reads only the live claims' entries,
/// where a pass from the start would read all of them each tick.
#[test]
fn a_pinned_horizon_does_not_make_the_rearm_pass_walk_dead_entries() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    common::disable_worker();
    // A database of its own: the claims other tests leave would be part of every pass.
    let db = unique_queue("rearmpin");
    connect().batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
    let mut c = common::connect_to(&db);
    // Claims that write the row (the in-flight index is theirs; through the claim ledger a
    // claim leaves the row 'ready', and the pass walks the ledger instead).
    c.batch_execute("CREATE EXTENSION pgqueue; SET pgqueue.claim_ledger = off").unwrap();
    let q = "jobs";
    c.execute("SELECT pgqueue.pgq_create_queue($1)", &[&q]).unwrap();
    let mut pin = common::connect_to(&db);
    pin.batch_execute("BEGIN; SELECT txid_current();").unwrap();
    let thousand: Vec<Value> = (0..1000).map(|i| json!({ "i": i })).collect();
    for _ in 0..20 {
        c.execute("SELECT pgqueue.pgq_send_batch($1, $2)", &[&q, &thousand]).unwrap();
        c.execute(
            "WITH got AS (SELECT msg_id, claim_token FROM pgqueue.pgq_claim($1, 1000))
             SELECT count(*) FROM got, pgqueue.pgq_ack(ARRAY[got.msg_id], ARRAY[got.claim_token])",
            &[&q],
        )
        .unwrap();
    }
    // Three live claims after them, one of which expires in a second; one tick to find where
    // claimed messages start.
    c.execute("SELECT pgqueue.pgq_send_batch($1, $2)", &[&q, &thousand[..3].to_vec()]).unwrap();
    c.execute("SELECT count(*) FROM pgqueue.pgq_claim($1, 2, '1 hour')", &[&q]).unwrap();
    c.execute("SELECT count(*) FROM pgqueue.pgq_claim($1, 1, '1 s')", &[&q]).unwrap();
    c.execute("SELECT pgqueue.pgq_tick()", &[]).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // Keep the prune cadence (1 s here), whose pass starts from the start on purpose, out of
    // the five ticks.
    c.execute("UPDATE pgqueue.worker_state SET last_prune_at = now() + interval '1 hour'", &[]).unwrap();
    let rearmed =
        |c: &mut Client| -> i64 { c.query_one("SELECT rearmed FROM pgqueue.worker_stats", &[]).unwrap().get(0) };
    let (before, rearmed_before) = (claimed_idx_reads(&mut c), rearmed(&mut c));
    // The first of these re-arms the expired claim, walking the live claims only; the others
    // find that no lease can have ended and walk nothing.
    let mut ticks = vec![];
    for _ in 0..5 {
        let at = claimed_idx_reads(&mut c);
        let failed: Vec<String> = c
            .query("SELECT step || ': ' || error FROM pgqueue.pgq_tick()", &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(failed.is_empty(), "{failed:?}");
        let batches: i64 = c.query_one("SELECT rescue_batches FROM pgqueue.worker_stats", &[]).unwrap().get(0);
        ticks.push(format!("{} read, re-arm batches so far {batches}", claimed_idx_reads(&mut c) - at));
    }
    let read = claimed_idx_reads(&mut c) - before;
    assert_eq!(rearmed(&mut c) - rearmed_before, 1, "the expired claim was re-armed");
    // The same window scan from the start, for contrast.
    let from_start: i64 = c
        .query_one(
            "SELECT count(*) FROM (SELECT m.msg_id FROM pgqueue.message_rows m WHERE m.state = 'claimed'
              ORDER BY m.msg_id LIMIT 2000) w",
            &[],
        )
        .map(|_| claimed_idx_reads(&mut c) - before - read)
        .unwrap();
    let shared: String = c
        .query_one("SELECT coalesce((SELECT row(s.*)::text FROM pgqueue.shared_state s), 'none')", &[])
        .unwrap()
        .get(0);
    pin.batch_execute("ROLLBACK").unwrap();
    drop((pin, c));
    connect().batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)")).unwrap();
    let summary = format!(
        "5 ticks read {read} in-flight index entries; one scan from the start reads {from_start} (shared state {shared}; per tick: {ticks:?})"
    );
    assert!(from_start >= 20_000, "the pin keeps the finished messages' entries: {summary}");
    assert!(read <= 5 * 20, "{summary}");
    eprintln!("{summary}");
}

/// The orphan step (session-bound claims whose backend has gone) cannot be served by the
/// in-flight index at all, so no planner estimate can make it walk that index's dead
/// entries (it did, now and then, before 0.11.0): without messages_session_idx and with
/// sequential scans discouraged, its plan still does not use messages_claimed_idx.
#[test]
fn the_orphan_step_cannot_walk_the_in_flight_index() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (mut c, notices) = explaining_session("SET enable_seqscan = off");
    let q = unique_queue("orphans");
    c.execute("SELECT pgqueue.pgq_create_queue($1)", &[&q]).unwrap();
    c.execute("SELECT pgqueue.pgq_send($1, '{}')", &[&q]).unwrap();
    c.execute("SELECT count(*) FROM pgqueue.pgq_claim($1, session_bound => true)", &[&q]).unwrap();
    notices.lock().unwrap().clear();
    let mut tx = c.transaction().unwrap();
    tx.batch_execute("DROP INDEX pgqueue.messages_session_idx").unwrap();
    let expired: i64 = tx.query_one("SELECT pgqueue._expire_orphaned_claims()", &[]).unwrap().get(0);
    tx.rollback().unwrap();
    assert_eq!(expired, 0, "its claimer is alive");
    let plans = notices.lock().unwrap().join("\n");
    assert!(plans.contains("\"Relation Name\": \"message_rows\""), "the step's plan was seen: {plans}");
    assert!(!plans.contains("messages_claimed_idx"), "{plans}");
}

/// pgq_claim's statements are never JIT-compiled, whatever the session's JIT settings: its
/// planner settings (no sort, no bitmap scan: see `sql/claim.sql`) add, before PostgreSQL 18,
/// a huge cost to the sort of its result, which would otherwise compile every claim (100 ms
/// each). Where the server has JIT (`pg_jit_available()`, Debian's 15 here), a statement of
/// the session itself is shown to be compiled, so the check can see it.
#[test]
fn claims_are_not_jit_compiled() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (mut c, notices) = explaining_session("SET jit = on; SET jit_above_cost = 0");
    let q = unique_queue("nojit");
    c.execute("SELECT pgqueue.pgq_create_queue($1)", &[&q]).unwrap();
    c.execute("SELECT count(*) FROM pgqueue.pgq_send_batch($1, ARRAY['{}', '{}']::jsonb[])", &[&q]).unwrap();
    c.execute("SELECT count(*) FROM pgqueue.pgq_tick()", &[]).unwrap(); // claim hints
    let compiled = |c: &mut Client, sql: &str| -> (usize, usize) {
        notices.lock().unwrap().clear();
        let mut tx = c.transaction().unwrap();
        tx.query(sql, &[&q]).unwrap();
        tx.rollback().unwrap();
        // The plans of the statements run inside the call (or, for a plain statement, its own).
        let docs: Vec<Value> = notices
            .lock()
            .unwrap()
            .iter()
            .filter_map(|n| serde_json::from_str::<Value>(&n[n.find('{')?..]).ok())
            .filter(|d| d.get("Plan").is_some() && (!sql.contains("pgq_claim") || d["Query Text"] != sql))
            .collect();
        (docs.len(), docs.iter().filter(|d| d.get("JIT").is_some()).count())
    };
    let (plans, jitted) = compiled(&mut c, "SELECT * FROM pgqueue.pgq_claim($1, 2)");
    // The queue's settings, the pick, the update (0.8.0; before, PL/pgSQL ran five).
    assert!(plans >= 3, "the claim's statements were seen: {plans}");
    assert_eq!(jitted, 0, "of the claim's {plans} statements {jitted} were JIT-compiled");
    if c.query_one("SELECT pg_jit_available()", &[]).unwrap().get::<_, bool>(0) {
        let (_, jitted) = compiled(&mut c, "SELECT count(*) FROM pgqueue.messages WHERE queue = $1");
        assert!(jitted > 0, "a statement of the session is compiled: the check sees JIT");
    }
}

#[test]
fn an_ack_reads_each_finished_row_a_bounded_number_of_times() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (mut c, notices) = explaining_session("");
    let q = unique_queue("finish_rows");
    c.execute("SELECT pgqueue.pgq_create_queue($1)", &[&q]).unwrap();
    let n = 200;
    let payloads: Vec<Value> = (0..n).map(|i| json!({ "i": i })).collect();
    c.execute("SELECT pgqueue.pgq_send_batch($1, $2)", &[&q, &payloads]).unwrap();
    c.execute("SELECT count(*) FROM pgqueue.pgq_claim($1, $2, '1 hour')", &[&q, &n]).unwrap();
    let ack = "SELECT count(*) FROM pgqueue.pgq_ack(
                   (SELECT array_agg(msg_id ORDER BY msg_id) FROM pgqueue.messages WHERE queue = $1),
                   (SELECT array_agg(claim_token ORDER BY msg_id) FROM pgqueue.messages WHERE queue = $1))";
    let finish =
        explain_nested(&mut c, &notices, ack, &q, ["DELETE FROM pgqueue.message_rows", "INSERT INTO pgqueue.history"]);
    let read = cte_rows_read(&finish.plan);
    // The statement reads the finished rows once per use (the unique-key steps, history,
    // the shared-state note, the result); a subquery run again for each row (0.17.0 and
    // 0.18.0) read them n times each.
    assert!(read >= n as f64, "the plan read {read} rows of its CTEs: was the finish statement found?");
    assert!(read <= 6.0 * n as f64, "an ack of {n} messages read {read} rows of its CTEs: {:#}", finish.plan);
}
