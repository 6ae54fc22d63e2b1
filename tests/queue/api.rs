//! Every API function's normal path and every documented error.

use crate::common::{Claimed, Client, claim, count, new_queue, outcome, send, sqlstate, state, unique_queue};
use crate::connect;
use serde_json::json;
use std::time::Duration;
use uuid::Uuid;

#[test]
fn create_and_drop_queues() {
    let mut c = connect();
    let q = new_queue(&mut c, ", lease => '30 s', max_attempts => 3, retention => '1 day'");
    let row = c
        .query_one(
            "SELECT lease::text, max_attempts, retention::text, paused FROM pgqueue.queues WHERE queue = $1",
            &[&q],
        )
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "00:00:30");
    assert_eq!(row.get::<_, i32>(1), 3);
    assert_eq!(row.get::<_, String>(2), "1 day");
    assert!(!row.get::<_, bool>(3));
    // Its history partitions exist: the queue's own, a default and today's.
    let parts: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = format('pgqueue.%I', 'history_' || $1::text)::regclass",
            &[&q],
        )
        .unwrap()
        .get(0);
    assert!(parts >= 2, "default and day partitions, got {parts}");

    assert_eq!(sqlstate(c.execute(&format!("SELECT pgqueue.pgq_create_queue('{q}')"), &[])), "42710");
    c.execute(&format!("SELECT pgqueue.pgq_create_queue('{q}', if_not_exists => true)"), &[]).unwrap();

    c.execute("SELECT pgqueue.pgq_drop_queue($1)", &[&q]).unwrap();
    assert_eq!(count(&mut c, "SELECT count(*) FROM pgqueue.queues WHERE queue = $1", &q), 0);
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_drop_queue($1)", &[&q])), "42704");
}

#[test]
fn history_days_are_utc_days_whatever_the_session_time_zone() {
    let mut c = connect();
    c.batch_execute("SET TimeZone = 'America/New_York'").unwrap();
    let q = new_queue(&mut c, "");
    // A session in another zone (as the worker's is UTC) adds the same days: no overlap error.
    c.execute("SELECT pgqueue._maintain_partitions()", &[]).unwrap();
    c.batch_execute("SET TimeZone = 'Asia/Tokyo'").unwrap();
    c.execute("SELECT pgqueue._maintain_partitions()", &[]).unwrap();
    c.batch_execute("SET TimeZone = 'UTC'").unwrap();
    let bounds: Vec<String> = c
        .query(
            "SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
              WHERE i.inhparent = format('pgqueue.%I', 'history_' || $1::text)::regclass AND c.relname LIKE '%$2%'",
            &[&q],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(bounds.len() >= 3, "{bounds:?}");
    assert!(bounds.iter().all(|b| b.matches("00:00:00+00").count() == 2), "UTC midnights: {bounds:?}");
}

#[test]
fn misspelled_settings_are_rejected() {
    let mut c = connect();
    // The pgqueue.* prefix is reserved: a typo is an error, not a silently ignored placeholder.
    assert_eq!(sqlstate(c.batch_execute("SET pgqueue.tick_intervall = '1s'")), "42602");
    c.batch_execute("SET pgqueue.max_payload_bytes = '2MB'").unwrap();
    c.batch_execute("RESET pgqueue.max_payload_bytes").unwrap();
}

#[test]
fn queue_names_are_validated() {
    let mut c = connect();
    let long = "a".repeat(41);
    for bad in ["", "A", "1abc", "a-b", "a b", "a;drop table pgqueue.queues", "a'b", "é", long.as_str()] {
        assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_create_queue($1)", &[&bad])), "22023", "name {bad:?}");
    }
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_create_queue(NULL)", &[])), "22004");
    // Unknown but well-formed names are 42704 everywhere; malformed ones 22023.
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_send('no_such_queue', '{}')", &[])), "42704");
    assert_eq!(sqlstate(c.execute("SELECT * FROM pgqueue.pgq_claim('no_such_queue')", &[])), "42704");
    assert_eq!(sqlstate(c.execute("SELECT * FROM pgqueue.pgq_claim('Bad Name')", &[])), "22023");
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_redrive('no_such_queue')", &[])), "42704");
    for f in ["pgq_pause_queue", "pgq_resume_queue", "pgq_drop_queue"] {
        assert_eq!(sqlstate(c.execute(&format!("SELECT pgqueue.{f}('no_such_queue')"), &[])), "42704", "{f}");
    }
    let max = "a".repeat(40);
    c.execute("SELECT pgqueue.pgq_create_queue($1)", &[&max]).unwrap();
    c.execute("SELECT pgqueue.pgq_drop_queue($1)", &[&max]).unwrap();
}

#[test]
fn create_queue_rejects_bad_settings() {
    let mut c = connect();
    for args in [
        "lease => '0 s'",
        "lease => '-1 s'",
        "lease => '2 days'",
        "max_attempts => 0",
        "max_attempts => 1001",
        "retention => '-1 day'",
    ] {
        let q = unique_queue("bad");
        assert_eq!(
            sqlstate(c.execute(&format!("SELECT pgqueue.pgq_create_queue('{q}', {args})"), &[])),
            "22023",
            "{args}"
        );
        assert_eq!(count(&mut c, "SELECT count(*) FROM pgqueue.queues WHERE queue = $1", &q), 0);
    }
    for args in ["lease => NULL", "max_attempts => NULL", "if_not_exists => NULL"] {
        let q = unique_queue("bad");
        assert_eq!(
            sqlstate(c.execute(&format!("SELECT pgqueue.pgq_create_queue('{q}', {args})"), &[])),
            "22004",
            "{args}"
        );
    }
}

#[test]
fn send_claim_ack() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let id: i64 =
        c.query_one("SELECT pgqueue.pgq_send($1, '{\"n\":1}', headers => '{\"h\":\"v\"}')", &[&q]).unwrap().get(0);
    let row = c
        .query_one(
            "SELECT msg_id, claim_token, attempt, priority, payload, headers, enqueued_at <= now(),
                    lease_expires_at - now() BETWEEN '119 s' AND '121 s'
               FROM pgqueue.pgq_claim($1, consumer => 'w1')",
            &[&q],
        )
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), id);
    let token: Uuid = row.get(1);
    assert_eq!(row.get::<_, i32>(2), 1);
    assert_eq!(row.get::<_, i16>(3), 0);
    assert_eq!(row.get::<_, serde_json::Value>(4), json!({"n": 1}));
    assert_eq!(row.get::<_, serde_json::Value>(5), json!({"h": "v"}));
    assert!(row.get::<_, bool>(6));
    assert!(row.get::<_, bool>(7), "default lease is the queue's 120 s");
    assert_eq!(state(&mut c, id).as_deref(), Some("claimed"));
    assert!(claim(&mut c, &q, 1, None).is_empty(), "a claimed message is not claimable");

    let acked: bool = c.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&id, &token]).unwrap().get(0);
    assert!(acked);
    assert_eq!(state(&mut c, id), None);
    assert_eq!(outcome(&mut c, id).as_deref(), Some("completed"));
    let again: bool = c.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&id, &token]).unwrap().get(0);
    assert!(!again, "a second ack changes nothing");
    assert_eq!(count(&mut c, "SELECT count(*) FROM pgqueue.history WHERE queue = $1", &q), 1);
}

#[test]
fn priority_then_fifo() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let mut ids = vec![];
    for p in [0i16, 5, 0, -3, 5] {
        ids.push(c.query_one("SELECT pgqueue.pgq_send($1, '{}', priority => $2)", &[&q, &p]).unwrap().get::<_, i64>(0));
    }
    let got: Vec<i64> = claim(&mut c, &q, 10, None).into_iter().map(|m| m.id).collect();
    assert_eq!(got, vec![ids[1], ids[4], ids[0], ids[2], ids[3]]);
    for p in [-1001i16, 1001] {
        assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_send($1, '{}', priority => $2)", &[&q, &p])), "22023");
    }
}

#[test]
fn claim_arguments() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send(&mut c, &q, json!(1));
    for (sql, code) in [
        ("SELECT * FROM pgqueue.pgq_claim($1, 0)", "22023"),
        ("SELECT * FROM pgqueue.pgq_claim($1, 1001)", "22023"),
        ("SELECT * FROM pgqueue.pgq_claim($1, NULL)", "22004"),
        ("SELECT * FROM pgqueue.pgq_claim($1, lease => '0 s')", "22023"),
        ("SELECT * FROM pgqueue.pgq_claim($1, lease => '25 hours')", "22023"),
    ] {
        assert_eq!(sqlstate(c.execute(sql, &[&q])), code, "{sql}");
    }
    assert_eq!(count(&mut c, "SELECT count(*) FROM pgqueue.messages WHERE queue = $1 AND state = 'ready'", &q), 1);
    let ok: bool = c
        .query_one("SELECT lease_expires_at - now() < '11 s' FROM pgqueue.pgq_claim($1, lease => '10 s')", &[&q])
        .unwrap()
        .get(0);
    assert!(ok, "an explicit lease overrides the queue's");
}

#[test]
fn send_batch() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let payloads = vec![json!({"i": 0}), json!({"i": 1}), json!({"i": 2})];
    let ids: Vec<i64> = c
        .query("SELECT * FROM pgqueue.pgq_send_batch($1, $2)", &[&q, &payloads])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids.len(), 3);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids follow the array's order");
    let got: Vec<serde_json::Value> =
        c.query("SELECT payload FROM pgqueue.pgq_claim($1, 10)", &[&q]).unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(got, payloads);
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_send_batch($1, NULL)", &[&q])), "22004");
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_send_batch($1, ARRAY['{}', NULL]::jsonb[])", &[&q])), "22004");
    assert_eq!(
        count(&mut c, "SELECT count(*) FROM pgqueue.messages WHERE queue = $1", &q),
        3,
        "failed batches add nothing"
    );
}

#[test]
fn payload_limit() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    c.batch_execute("SET pgqueue.max_payload_bytes = 200").unwrap();
    let big = json!({"blob": "x".repeat(300)});
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_send($1, $2)", &[&q, &big])), "54000");
    let batch = vec![json!(1), big.clone()];
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_send_batch($1, $2)", &[&q, &batch])), "54000");
    send(&mut c, &q, json!({"small": true}));
    assert_eq!(count(&mut c, "SELECT count(*) FROM pgqueue.messages WHERE queue = $1", &q), 1);
    c.batch_execute("RESET pgqueue.max_payload_bytes").unwrap();
    send(&mut c, &q, big);
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_send($1, NULL)", &[&q])), "22004");
}

#[test]
fn delayed_messages_become_claimable_without_the_worker() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let later: i64 = c.query_one("SELECT pgqueue.pgq_send($1, '1', delay => '1 hour')", &[&q]).unwrap().get(0);
    let soon: i64 = c.query_one("SELECT pgqueue.pgq_send($1, '2', delay => '2 s')", &[&q]).unwrap().get(0);
    assert_eq!(state(&mut c, later).as_deref(), Some("delayed"));
    assert!(claim(&mut c, &q, 10, None).is_empty(), "nothing is due yet");
    std::thread::sleep(Duration::from_millis(2200));
    // Claimed even if the worker never ran: the claim promotes due messages itself.
    let got: Vec<i64> = claim(&mut c, &q, 10, None).into_iter().map(|m| m.id).collect();
    assert_eq!(got, vec![soon]);
    assert_eq!(state(&mut c, later).as_deref(), Some("delayed"));
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_send($1, '1', delay => '-1 s')", &[&q])), "22023");
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_send($1, '1', delay => NULL)", &[&q])), "22004");
}

#[test]
fn paused_queue_yields_nothing() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send(&mut c, &q, json!(1));
    c.execute("SELECT pgqueue.pgq_pause_queue($1)", &[&q]).unwrap();
    assert!(claim(&mut c, &q, 1, None).is_empty());
    send(&mut c, &q, json!(2)); // producers are not stopped by a pause
    c.execute("SELECT pgqueue.pgq_resume_queue($1)", &[&q]).unwrap();
    assert_eq!(claim(&mut c, &q, 10, None).len(), 2);
}

#[test]
fn renew_extends_only_held_claims() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send(&mut c, &q, json!(1));
    send(&mut c, &q, json!(2));
    let held = claim(&mut c, &q, 2, None);
    let Claimed { id, token, .. } = held[0];
    let renewed: bool =
        c.query_one("SELECT pgqueue.pgq_renew($1::bigint, $2::uuid, '1 hour')", &[&id, &token]).unwrap().get(0);
    assert!(renewed);
    let longer: bool = c
        .query_one("SELECT lease_expires_at - now() > '59 min' FROM pgqueue.messages WHERE msg_id = $1", &[&id])
        .unwrap()
        .get(0);
    assert!(longer);
    let wrong = Uuid::new_v4();
    let renewed: bool = c.query_one("SELECT pgqueue.pgq_renew($1::bigint, $2::uuid)", &[&id, &wrong]).unwrap().get(0);
    assert!(!renewed, "a wrong token renews nothing");
    let renewed: bool = c.query_one("SELECT pgqueue.pgq_renew(-1, $1)", &[&wrong]).unwrap().get(0);
    assert!(!renewed, "an unknown message renews nothing");

    // Batch: the whole unfinished batch, minus what is no longer held.
    let ids: Vec<i64> = held.iter().map(|h| h.id).collect();
    let mut tokens: Vec<Uuid> = held.iter().map(|h| h.token).collect();
    let got: Vec<i64> = c
        .query("SELECT * FROM pgqueue.pgq_renew($1::bigint[], $2::uuid[]) ORDER BY 1", &[&ids, &tokens])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(got, ids);
    tokens[1] = wrong;
    let got: Vec<i64> = c
        .query("SELECT * FROM pgqueue.pgq_renew($1::bigint[], $2::uuid[])", &[&ids, &tokens])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(got, vec![ids[0]]);
    let short = vec![ids[0]];
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_renew($1::bigint[], $2::uuid[])", &[&short, &tokens])), "22023");
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_renew($1::bigint[], NULL::uuid[])", &[&ids])), "22004");
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_renew($1::bigint, $2::uuid, '0 s')", &[&id, &token])), "22023");
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_renew(NULL::bigint, $1)", &[&token])), "22004");
}

#[test]
fn batch_ack() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    for i in 0..5 {
        send(&mut c, &q, json!(i));
    }
    let held = claim(&mut c, &q, 5, None);
    let ids: Vec<i64> = held.iter().map(|h| h.id).collect();
    let mut tokens: Vec<Uuid> = held.iter().map(|h| h.token).collect();
    tokens[2] = Uuid::new_v4();
    let acked: Vec<i64> = c
        .query("SELECT * FROM pgqueue.pgq_ack($1::bigint[], $2::uuid[])", &[&ids, &tokens])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(acked, vec![ids[0], ids[1], ids[3], ids[4]]);
    assert_eq!(state(&mut c, ids[2]).as_deref(), Some("claimed"));
    let short = vec![ids[0]];
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_ack($1::bigint[], $2::uuid[])", &[&short, &tokens])), "22023");
}

#[test]
fn nack_retries_then_dead_letters() {
    let mut c = connect();
    let q = new_queue(&mut c, ", max_attempts => 3");
    let id = send(&mut c, &q, json!({"job": 1}));
    // Immediate retry.
    let Claimed { token, attempt, .. } = claim(&mut c, &q, 1, None)[0];
    assert_eq!(attempt, 1);
    let ok: bool = c
        .query_one("SELECT pgqueue.pgq_nack($1, $2, retry_in => '0 s', error => 'boom')", &[&id, &token])
        .unwrap()
        .get(0);
    assert!(ok);
    assert_eq!(state(&mut c, id).as_deref(), Some("ready"));
    let stale: bool = c.query_one("SELECT pgqueue.pgq_nack($1, $2)", &[&id, &token]).unwrap().get(0);
    assert!(!stale, "a nacked claim's token is spent");
    // Default: exponential backoff, so the message waits (delayed) before the next try.
    let Claimed { token, attempt, .. } = claim(&mut c, &q, 1, None)[0];
    assert_eq!(attempt, 2);
    c.execute("SELECT pgqueue.pgq_nack($1, $2)", &[&id, &token]).unwrap();
    let row = c
        .query_one("SELECT state, visible_at - now() BETWEEN '1 s' AND '3 s', last_error FROM pgqueue.messages WHERE msg_id = $1", &[&id])
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "delayed");
    assert!(row.get::<_, bool>(1), "second attempt backs off ~2 s");
    assert_eq!(row.get::<_, String>(2), "boom", "the last error is kept");
    // Make it due now, claim the last attempt, nack: dead letter. The UPDATE goes around the
    // API, so the queue's shared state does not know it is due: promote it as the tick's
    // step would (the worker is off here), for this queue only. A whole tick (pgq_tick)
    // would hold other tests' due messages locked while it runs, and their claims pass
    // locked rows over.
    c.execute("UPDATE pgqueue.message_rows SET visible_at = now() WHERE msg_id = $1", &[&id]).unwrap();
    c.execute("SELECT pgqueue._promote_due($1, 1000)", &[&q]).unwrap();
    let Claimed { token, attempt, .. } = claim(&mut c, &q, 1, None)[0];
    assert_eq!(attempt, 3);
    c.execute("SELECT pgqueue.pgq_nack($1, $2, error => 'final')", &[&id, &token]).unwrap();
    assert_eq!(state(&mut c, id), None);
    assert_eq!(outcome(&mut c, id).as_deref(), Some("dead"));
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_nack($1, $2, retry_in => '-1 s')", &[&id, &token])), "22023");

    // Redrive brings it back with a fresh attempt count.
    let n: i64 = c.query_one("SELECT pgqueue.pgq_redrive($1)", &[&q]).unwrap().get(0);
    assert_eq!(n, 1);
    assert_eq!(outcome(&mut c, id), None);
    let Claimed { id: got, attempt, .. } = claim(&mut c, &q, 1, None)[0];
    assert_eq!((got, attempt), (id, 1));
}

#[test]
fn fail_dead_letters_now_and_redrive_by_id() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let a = send(&mut c, &q, json!("a"));
    let b = send(&mut c, &q, json!("b"));
    for Claimed { id, token, .. } in claim(&mut c, &q, 2, None) {
        let ok: bool = c.query_one("SELECT pgqueue.pgq_fail($1, $2, 'bad input')", &[&id, &token]).unwrap().get(0);
        assert!(ok);
        let again: bool = c.query_one("SELECT pgqueue.pgq_fail($1, $2)", &[&id, &token]).unwrap().get(0);
        assert!(!again);
    }
    let err: String = c.query_one("SELECT last_error FROM pgqueue.history WHERE msg_id = $1", &[&a]).unwrap().get(0);
    assert_eq!(err, "bad input");
    let dead: i64 = c.query_one("SELECT dead FROM pgqueue.queue_stats WHERE queue = $1", &[&q]).unwrap().get(0);
    assert_eq!(dead, 2);
    let n: i64 = c.query_one("SELECT pgqueue.pgq_redrive($1, ARRAY[$2::bigint])", &[&q, &b]).unwrap().get(0);
    assert_eq!(n, 1);
    assert_eq!(state(&mut c, b).as_deref(), Some("ready"));
    assert_eq!(outcome(&mut c, a).as_deref(), Some("dead"));
}

#[test]
fn drop_queue_refuses_while_claimed() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send(&mut c, &q, json!(1));
    claim(&mut c, &q, 1, None);
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_drop_queue($1)", &[&q])), "55006");
    assert_eq!(count(&mut c, "SELECT count(*) FROM pgqueue.messages WHERE queue = $1", &q), 1, "nothing changed");
    c.execute("SELECT pgqueue.pgq_drop_queue($1, force => true)", &[&q]).unwrap();
    assert_eq!(count(&mut c, "SELECT count(*) FROM pgqueue.messages WHERE queue = $1", &q), 0);
    let part: Option<String> =
        c.query_one("SELECT to_regclass(format('pgqueue.%I', 'history_' || $1::text))::text", &[&q]).unwrap().get(0);
    assert_eq!(part, None, "the queue's history goes with it");
}

/// Sends lock the queue's row (there is no foreign key to do it): a drop waits for a send
/// under way and deletes what it committed, so no message outlives its queue. It needs READ
/// COMMITTED to see those messages, and says so otherwise.
#[test]
fn drop_queue_takes_the_messages_of_a_send_that_commits_while_it_waits() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let mut producer = connect();
    producer.batch_execute("BEGIN").unwrap();
    producer.execute("SELECT pgqueue.pgq_send($1, '1')", &[&q]).unwrap();
    let drop_sql = format!("SELECT pgqueue.pgq_drop_queue('{q}')");
    let dropper = {
        let drop_sql = drop_sql.clone();
        std::thread::spawn(move || connect().batch_execute(&drop_sql))
    };
    // The drop waits for the producer's lock on the queue's row.
    crate::common::wait_for("the drop to wait for the send", Duration::from_secs(30), || {
        let waiting: bool = c
            .query_one(
                "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query = $1)",
                &[&drop_sql],
            )
            .unwrap()
            .get(0);
        waiting.then_some(())
    });
    producer.batch_execute("COMMIT").unwrap();
    dropper.join().unwrap().expect("the drop succeeds");
    assert_eq!(count(&mut c, "SELECT count(*) FROM pgqueue.messages WHERE queue = $1", &q), 0, "no orphan");
    assert_eq!(sqlstate(producer.execute("SELECT pgqueue.pgq_send($1, '1')", &[&q])), "42704");

    let q = new_queue(&mut c, "");
    c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ").unwrap();
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_drop_queue($1)", &[&q])), "0A000");
    c.batch_execute("ROLLBACK").unwrap();
    assert_eq!(count(&mut c, "SELECT count(*) FROM pgqueue.queues WHERE queue = $1", &q), 1, "nothing changed");
}

#[test]
fn queue_stats() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    for _ in 0..3 {
        send(&mut c, &q, json!(1));
    }
    c.execute("SELECT pgqueue.pgq_send($1, '1', delay => '1 hour')", &[&q]).unwrap();
    c.execute("SELECT * FROM pgqueue.pgq_claim($1, lease => '1 ms')", &[&q]).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let row = c
        .query_one(
            "SELECT ready, delayed, claimed, expired_claims, dead, oldest_ready_age IS NOT NULL,
                    oldest_expired_claim_age > '0'
               FROM pgqueue.queue_stats WHERE queue = $1",
            &[&q],
        )
        .unwrap();
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, i64>(1), row.get::<_, i64>(2), row.get::<_, i64>(3), row.get::<_, i64>(4)),
        (2, 1, 1, 1, 0)
    );
    assert!(row.get::<_, bool>(5) && row.get::<_, bool>(6));
}

/// Outcomes in the history kept, per queue; read only when selected (a scrape of the depths
/// does not touch the history).
#[test]
fn queue_stats_counts_outcomes_only_when_selected() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let ids: Vec<i64> = (0..4).map(|_| send(&mut c, &q, json!(1))).collect();
    c.execute("SELECT pgqueue.pgq_ack(msg_id, claim_token) FROM pgqueue.pgq_claim($1, qty => 2)", &[&q]).unwrap();
    c.execute("SELECT pgqueue.pgq_cancel($1::bigint)", &[&ids[3]]).unwrap();
    let row = c
        .query_one("SELECT ready, completed, cancelled, dead FROM pgqueue.queue_stats WHERE queue = $1", &[&q])
        .unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1), row.get::<_, i64>(2), row.get::<_, i64>(3)), (1, 2, 1, 0));
    let plan: Vec<String> = c
        .query("EXPLAIN SELECT ready, pending, parked FROM pgqueue.queue_stats WHERE queue = $1", &[&q])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!plan.join("\n").contains("history"), "{}", plan.join("\n"));
}

#[test]
fn roles_get_only_their_part() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let id = send(&mut c, &q, json!(1));
    // PUBLIC can do nothing.
    let public_exec: bool = c
        .query_one("SELECT has_function_privilege('public', 'pgqueue.pgq_send(text, jsonb, interval, smallint, jsonb, text, interval, bigint[], text)', 'EXECUTE')", &[])
        .unwrap()
        .get(0);
    assert!(!public_exec);

    let user = unique_queue("someone");
    c.batch_execute(&format!("CREATE ROLE {user} LOGIN")).unwrap();
    let as_role = |c: &mut Client, role: &str, sql: &str| crate::common::as_role(c, &user, role, sql);
    let send_sql = format!("SELECT pgqueue.pgq_send('{q}', '2')");
    let claim_sql = format!("SELECT * FROM pgqueue.pgq_claim('{q}')");
    let ack_sql = format!("SELECT pgqueue.pgq_ack({id}, gen_random_uuid())");
    let drop_sql = format!("SELECT pgqueue.pgq_drop_queue('{q}', force => true)");
    let redrive_sql = format!("SELECT pgqueue.pgq_redrive('{q}')");
    let table_sql = "SELECT count(*) FROM pgqueue.messages";

    as_role(&mut c, "pgqueue_producer", &send_sql).unwrap();
    for sql in [&claim_sql, &ack_sql, &drop_sql, table_sql] {
        assert_eq!(sqlstate(as_role(&mut c, "pgqueue_producer", sql)), "42501", "producer: {sql}");
    }
    as_role(&mut c, "pgqueue_consumer", &claim_sql).unwrap();
    as_role(&mut c, "pgqueue_consumer", &ack_sql).unwrap();
    for sql in [&send_sql, &drop_sql, &redrive_sql, table_sql] {
        assert_eq!(sqlstate(as_role(&mut c, "pgqueue_consumer", sql)), "42501", "consumer: {sql}");
    }
    as_role(&mut c, "pgqueue_admin", &redrive_sql).unwrap();
    as_role(&mut c, "pgqueue_admin", &send_sql).unwrap();
    as_role(&mut c, "pgqueue_admin", "SELECT * FROM pgqueue.queue_stats").unwrap();
    as_role(&mut c, "pgqueue_admin", &drop_sql).unwrap();
    c.batch_execute(&format!("DROP ROLE {user}")).unwrap();
}

#[test]
fn transactions() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    // A rolled-back send is never seen.
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT pgqueue.pgq_send($1, '1')", &[&q]).unwrap();
    tx.rollback().unwrap();
    assert!(claim(&mut c, &q, 10, None).is_empty());

    // A send is invisible to other sessions until commit.
    let mut other = connect();
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT pgqueue.pgq_send($1, '2')", &[&q]).unwrap();
    assert!(claim(&mut other, &q, 10, None).is_empty());
    tx.commit().unwrap();
    let got = claim(&mut other, &q, 10, None);
    assert_eq!(got.len(), 1);
    c.execute("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&got[0].id, &got[0].token]).unwrap();

    // A rolled-back claim leaves the message claimable.
    let id = send(&mut c, &q, json!(3));
    let mut tx = c.transaction().unwrap();
    let n = tx.query("SELECT * FROM pgqueue.pgq_claim($1)", &[&q]).unwrap().len();
    assert_eq!(n, 1);
    tx.rollback().unwrap();
    assert_eq!(claim(&mut c, &q, 10, None)[0].id, id);

    // Send plus a business write commit or vanish together.
    let orders = unique_queue("orders");
    c.batch_execute(&format!("CREATE TABLE {orders} (id int)")).unwrap();
    for commit in [false, true] {
        let mut tx = c.transaction().unwrap();
        tx.execute(&format!("INSERT INTO {orders} VALUES (1)"), &[]).unwrap();
        tx.execute("SELECT pgqueue.pgq_send($1, '{\"order\": 1}')", &[&q]).unwrap();
        if commit {
            tx.commit().unwrap()
        } else {
            tx.rollback().unwrap()
        }
        let rows: i64 = c.query_one(&format!("SELECT count(*) FROM {orders}"), &[]).unwrap().get(0);
        let msgs = count(&mut c, "SELECT count(*) FROM pgqueue.messages WHERE queue = $1 AND state = 'ready'", &q);
        assert_eq!((rows, msgs), if commit { (1, 1) } else { (0, 0) });
    }
}

#[test]
fn state_list_matches_the_check_constraint() {
    let mut c = connect();
    // The states the code uses, and the states the CHECK allows, must be the same set: each
    // is allowed in its plain shape (src/message_rules.rs), and no other word is.
    let code_states = ["claimed", "delayed", "parked", "pending", "ready"];
    let def: String = c
        .query_one("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'messages_state_rules'", &[])
        .unwrap()
        .get(0);
    assert!(def.contains("_message_ok(state, priority"), "{def}");
    let allowed = |c: &mut Client, state: &str| -> bool {
        c.query_one(
            "SELECT pgqueue._message_ok($1, 0::smallint,
                        CASE WHEN $1 = 'delayed' THEN now() END, CASE WHEN $1 = 'claimed' THEN gen_random_uuid() END,
                        CASE WHEN $1 = 'claimed' THEN now() END, NULL, NULL,
                        CASE WHEN $1 = 'pending' THEN '{1}'::bigint[] END, CASE WHEN $1 = 'parked' THEN 'k' END,
                        CASE WHEN $1 = 'parked' THEN now() END)",
            &[&state],
        )
        .unwrap()
        .get(0)
    };
    for state in code_states {
        assert!(allowed(&mut c, state), "{state} refused");
    }
    for state in ["done", "Ready", "", "completed"] {
        assert!(!allowed(&mut c, state), "{state} allowed");
    }
    // Every state literal in the installed SQL functions is one of them.
    let bodies: Vec<String> = c
        .query("SELECT prosrc FROM pg_proc WHERE pronamespace = 'pgqueue'::regnamespace", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for body in bodies {
        for part in body.split("state = '").skip(1) {
            let lit = part.split('\'').next().unwrap();
            assert!(code_states.contains(&lit), "unknown state literal '{lit}'");
        }
    }
    let q = new_queue(&mut c, "");
    let id = send(&mut c, &q, json!(1));
    let bad = c.execute("UPDATE pgqueue.message_rows SET state = 'done' WHERE msg_id = $1", &[&id]);
    assert_eq!(sqlstate(bad), "23514");
}

/// A transaction claims what it sent itself, or gave back itself, before it commits: the
/// shared hints hear of those messages only at commit, so such a claim must not trust them
/// (it did, on a queue the worker had checked empty: the claim came back with nothing).
#[test]
fn a_transaction_claims_what_it_made_claimable_itself() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    // The queue is checked (the shared state lists its priorities, none yet): by a claim, which
    // checks a queue no tick has checked, as here where this binary may have the worker off.
    let checked = |c: &mut Client| -> bool {
        c.query_one("SELECT priorities IS NOT NULL FROM pgqueue._claim_start($1)", &[&q]).unwrap().get(0)
    };
    assert!(claim(&mut c, &q, 1, None).is_empty());
    assert!(checked(&mut c), "the claim checked the queue");
    c.batch_execute("BEGIN").unwrap();
    let id = send(&mut c, &q, json!("mine"));
    let got = claim(&mut c, &q, 1, None);
    assert_eq!(got.iter().map(|g| g.id).collect::<Vec<_>>(), vec![id], "its own send");
    c.execute("SELECT pgqueue.pgq_nack($1, $2, retry_in => '0')", &[&id, &got[0].token]).unwrap();
    let again = claim(&mut c, &q, 1, None);
    assert_eq!(again.iter().map(|g| g.id).collect::<Vec<_>>(), vec![id], "its own nack");
    c.batch_execute("COMMIT").unwrap();

    // A claim committed before, given back in this transaction: the same.
    assert!(checked(&mut c), "the commit left the queue checked");
    c.batch_execute("BEGIN").unwrap();
    c.execute("SELECT pgqueue.pgq_nack($1, $2, retry_in => '0')", &[&id, &again[0].token]).unwrap();
    assert_eq!(claim(&mut c, &q, 1, None).first().map(|g| g.id), Some(id), "its own nack of an older claim");
    c.batch_execute("COMMIT").unwrap();
}

/// pgq_ack, pgq_nack, pgq_fail and pgq_renew with their last argument, the queue: the same on
/// the queue's messages; a message of another queue is left as a stale token is; an unknown
/// queue is an error that changes nothing; calls without it resolve as before.
#[test]
fn finishes_given_a_queue_act_only_on_its_messages() {
    let mut c = connect();
    let (q, other) = (new_queue(&mut c, ", max_attempts => 2"), new_queue(&mut c, ""));
    for i in 0..6 {
        send(&mut c, &q, json!(i));
    }
    let mine = claim(&mut c, &q, 6, None);
    send(&mut c, &other, json!("x"));
    let theirs = claim(&mut c, &other, 1, None)[0];
    let scalar = |c: &mut Client, sql: &str, queue: &str, m: &Claimed| -> bool {
        c.query_one(sql, &[&queue, &m.id, &m.token]).unwrap().get(0)
    };

    // Renew: the queue's claims only.
    let renew = "SELECT pgqueue.pgq_renew($2::bigint, $3::uuid, '1 hour', queue => $1::text)";
    assert!(scalar(&mut c, renew, &q, &mine[0]));
    assert!(!scalar(&mut c, renew, &q, &theirs), "another queue's message is not renewed");
    let stale = Claimed { token: Uuid::new_v4(), ..mine[1] };
    assert!(!scalar(&mut c, renew, &q, &stale), "a stale token renews nothing");
    let ids: Vec<i64> = vec![mine[0].id, theirs.id, mine[1].id];
    let tokens: Vec<Uuid> = vec![mine[0].token, theirs.token, mine[1].token];
    let renewed: Vec<i64> = c
        .query(
            "SELECT * FROM pgqueue.pgq_renew($2::bigint[], $3::uuid[], '1 hour', $1) ORDER BY 1",
            &[&q, &ids, &tokens],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(renewed, vec![mine[0].id, mine[1].id]);
    let lease_left = |c: &mut Client, id: i64| -> bool {
        c.query_one("SELECT lease_expires_at - now() > '59 min' FROM pgqueue.messages WHERE msg_id = $1", &[&id])
            .unwrap()
            .get(0)
    };
    assert!(lease_left(&mut c, mine[0].id));
    assert!(!lease_left(&mut c, theirs.id), "the other queue's lease is unchanged");

    // Ack, batch and single.
    let acked: Vec<i64> = c
        .query("SELECT * FROM pgqueue.pgq_ack($2::bigint[], $3::uuid[], queue => $1) ORDER BY 1", &[&q, &ids, &tokens])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(acked, vec![mine[0].id, mine[1].id]);
    assert_eq!(outcome(&mut c, mine[0].id).as_deref(), Some("completed"));
    assert_eq!(state(&mut c, theirs.id).as_deref(), Some("claimed"), "another queue's message is not acked");
    let ack = "SELECT pgqueue.pgq_ack($2::bigint, $3::uuid, $1::text)";
    assert!(!scalar(&mut c, ack, &q, &theirs));
    assert!(scalar(&mut c, ack, &q, &mine[2]));
    assert!(!scalar(&mut c, ack, &q, &mine[2]), "acked already: the token is stale");

    // Nack: back to ready (attempt 1 of 2), then dead on the last attempt.
    let nack = "SELECT pgqueue.pgq_nack($2, $3, retry_in => '0', error => 'later', queue => $1)";
    assert!(!scalar(&mut c, nack, &q, &theirs));
    assert_eq!(state(&mut c, theirs.id).as_deref(), Some("claimed"));
    assert!(scalar(&mut c, nack, &q, &mine[3]));
    assert_eq!(state(&mut c, mine[3].id).as_deref(), Some("ready"));
    let again = claim(&mut c, &q, 1, None)[0];
    assert_eq!(again.id, mine[3].id);
    assert!(scalar(&mut c, nack, &q, &again));
    assert_eq!(outcome(&mut c, mine[3].id).as_deref(), Some("dead"), "nacked on its last attempt");

    // Fail: dead now, with the error.
    let fail = "SELECT pgqueue.pgq_fail($2, $3, 'broken', $1)";
    assert!(!scalar(&mut c, fail, &q, &theirs));
    assert!(scalar(&mut c, fail, &q, &mine[4]));
    let error: String =
        c.query_one("SELECT last_error FROM pgqueue.history WHERE msg_id = $1", &[&mine[4].id]).unwrap().get(0);
    assert_eq!(error, "broken");

    // Errors: an unknown queue or a bad name, NULLs, bad arrays, a bad lease or delay. Each
    // changes nothing: the last held message and the other queue's stay claimed.
    let held = &mine[5];
    let missing = unique_queue("missing");
    for sql in [ack, nack, fail, renew] {
        assert_eq!(sqlstate(c.query_one(sql, &[&missing, &held.id, &held.token])), "42704", "{sql}");
    }
    assert_eq!(sqlstate(c.query_one(ack, &[&"Bad Name", &held.id, &held.token])), "22023", "a malformed name");
    assert_eq!(sqlstate(c.query_one(ack, &[&q, &None::<i64>, &held.token])), "22004");
    assert_eq!(sqlstate(c.query_one(fail, &[&q, &held.id, &None::<Uuid>])), "22004");
    assert_eq!(sqlstate(c.query_one(nack, &[&q, &None::<i64>, &held.token])), "22004");
    let bad_delay = "SELECT pgqueue.pgq_nack($2, $3, retry_in => '-1 s', queue => $1)";
    assert_eq!(sqlstate(c.query_one(bad_delay, &[&q, &held.id, &held.token])), "22023");
    let bad_lease = "SELECT pgqueue.pgq_renew($2::bigint, $3::uuid, '0 s', $1)";
    assert_eq!(sqlstate(c.query_one(bad_lease, &[&q, &held.id, &held.token])), "22023");
    let short = vec![held.id];
    let two = vec![held.token, theirs.token];
    assert_eq!(
        sqlstate(c.execute("SELECT pgqueue.pgq_ack($2::bigint[], $3::uuid[], $1)", &[&q, &short, &two])),
        "22023"
    );
    assert_eq!(
        sqlstate(c.execute("SELECT pgqueue.pgq_renew($2::bigint[], NULL::uuid[], queue => $1)", &[&q, &short])),
        "22004"
    );
    assert_eq!(state(&mut c, held.id).as_deref(), Some("claimed"));
    assert_eq!(state(&mut c, theirs.id).as_deref(), Some("claimed"));

    // Calls without a queue resolve as before: by name, by position with literals, and with
    // parameters whose types the server infers (one function per name and arity).
    let by_name: bool = c
        .query_one("SELECT pgqueue.pgq_renew(msg_id => $1, claim_token => $2)", &[&held.id, &held.token])
        .unwrap()
        .get(0);
    assert!(by_name);
    let by_position: bool =
        c.query_one(&format!("SELECT pgqueue.pgq_nack({}, '{}', '0 s')", held.id, held.token), &[]).unwrap().get(0);
    assert!(by_position, "an integer literal and untyped literals");
    let inferred: bool =
        c.query_one("SELECT pgqueue.pgq_fail($1, $2, 'given up')", &[&held.id, &held.token]).unwrap().get(0);
    assert!(!inferred, "nacked above: the token is stale, and the call resolves");
    let by_position_queue: bool = c
        .query_one(&format!("SELECT pgqueue.pgq_fail({}, '{}', 'x', '{}')", theirs.id, theirs.token, other), &[])
        .unwrap()
        .get(0);
    assert!(by_position_queue, "the queue by position");
}
