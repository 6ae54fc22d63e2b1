//! `pgq_ack_claim`: a consumer's round trip in one statement — ack the claims it finished
//! (fenced as `pgq_ack`), then claim the next ones (as `pgq_claim`) — over real, committing
//! connections. Every documented error and that it changes nothing (the acks of a call that
//! then fails included); the fence (stale tokens, re-armed and re-claimed messages,
//! duplicates, a mix) and its `not_acked` report; waiting; privileges; many sessions
//! draining a queue exactly once, with and without wrong tokens thrown in; and the order in
//! which claims hand messages out, to one consumer and to many.

use crate::common::{
    Claimed, Client, Finished, Message, claim, connect_to, held, history_of, message, new_queue, send, send_many,
    state, unique_queue, wait_for,
};
use crate::connect;
use serde_json::json;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Barrier, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// The tests with many sessions take this, one at a time: the machine has few cores and the
/// test cluster 100 connections.
static HEAVY: Mutex<()> = Mutex::new(());

fn heavy() -> MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What one pgq_ack_claim call returned.
#[derive(Debug, Default)]
struct Reply {
    not_acked: Vec<i64>,
    claimed: Vec<Claimed>,
}

impl Reply {
    fn ids(&self) -> Vec<i64> {
        self.claimed.iter().map(|m| m.id).collect()
    }

    fn held(&self) -> Vec<(i64, Uuid)> {
        self.claimed.iter().map(|m| (m.id, m.token)).collect()
    }
}

/// `pgq_ack_claim(q, <ids of held>, <tokens of held><args>)`, its reply checked for its
/// shape: `not_acked` rows first, each id once, with nothing but the msg_id; `claimed`
/// rows complete.
fn ack_claim(c: &mut Client, q: &str, held: &[(i64, Uuid)], args: &str) -> Reply {
    let (ids, tokens): (Vec<i64>, Vec<Uuid>) = held.iter().copied().unzip();
    let rows = c
        .query(
            &format!(
                "SELECT kind, msg_id, claim_token, attempt, priority, payload IS NULL, headers IS NULL,
                    enqueued_at IS NULL, lease_expires_at IS NULL
               FROM pgqueue.pgq_ack_claim($1, $2::bigint[], $3::uuid[]{args})"
            ),
            &[&q, &ids, &tokens],
        )
        .unwrap_or_else(|e| panic!("pgq_ack_claim({q}, {held:?}{args}): {e}"));
    let mut reply = Reply::default();
    for r in &rows {
        let kind: String = r.get(0);
        let id: i64 = r.get(1);
        let token: Option<Uuid> = r.get(2);
        let attempt: Option<i32> = r.get(3);
        let priority: Option<i16> = r.get(4);
        let (no_payload, no_headers, no_enqueued, no_lease): (bool, bool, bool, bool) =
            (r.get(5), r.get(6), r.get(7), r.get(8));
        match kind.as_str() {
            "not_acked" => {
                assert!(reply.claimed.is_empty(), "not_acked {id} after claimed rows: {rows:?}");
                assert!(!reply.not_acked.contains(&id), "not_acked {id} twice");
                assert!(
                    token.is_none()
                        && attempt.is_none()
                        && priority.is_none()
                        && no_payload
                        && no_headers
                        && no_enqueued
                        && no_lease,
                    "a not_acked row has only its msg_id: {r:?}"
                );
                reply.not_acked.push(id);
            }
            "claimed" => {
                assert!(!no_payload && !no_enqueued && !no_lease, "a claimed row is complete: {r:?}");
                reply.claimed.push(Claimed {
                    id,
                    token: token.expect("claim_token"),
                    attempt: attempt.expect("attempt"),
                    priority: priority.expect("priority"),
                });
            }
            other => panic!("unknown kind {other:?}"),
        }
    }
    reply
}

fn claimed_by(c: &mut Client, id: i64, token: Uuid) -> bool {
    message(c, id).is_some_and(|m| m.state == "claimed" && m.token == Some(token))
}

fn completed_once(c: &mut Client, q: &str, id: i64) -> bool {
    message(c, id).is_none()
        && history_of(c, id).iter().filter(|h| h.queue == q && h.outcome == "completed").count() == 1
}

/// A row of `messages`: (msg_id, state, claim_token, attempt, lease_expires_at).
type MessageRow = (i64, String, Option<Uuid>, i32, Option<String>);

/// Everything a call could change about `q`: its messages, its history, its shared state's
/// depths and wake-ups.
#[derive(Debug, PartialEq)]
struct World {
    messages: Vec<MessageRow>,
    history: Vec<(i64, String, i32)>,
    depth: Option<String>,
}

fn world(c: &mut Client, q: &str) -> World {
    let messages = c
        .query(
            "SELECT msg_id, state, claim_token, attempt, lease_expires_at::text FROM pgqueue.messages
              WHERE queue = $1 ORDER BY msg_id",
            &[&q],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    let history = c
        .query("SELECT msg_id, outcome, attempt FROM pgqueue.history WHERE queue = $1 ORDER BY msg_id", &[&q])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let depth = c
        .query_one(
            "SELECT (SELECT row(ready, delayed, claimed, wakeups)::text FROM pgqueue.queue_depth WHERE queue = $1)",
            &[&q],
        )
        .unwrap()
        .get(0);
    World { messages, history, depth }
}

/// (SQLSTATE, message) of a statement that must fail.
fn error_of(c: &mut Client, sql: &str) -> (String, String) {
    match c.query(sql, &[]) {
        Ok(rows) => panic!("expected an error, got {} rows: {sql}", rows.len()),
        Err(e) => {
            let db = e.as_db_error().unwrap_or_else(|| panic!("no server error: {e}: {sql}"));
            (db.code().code().to_string(), db.message().to_string())
        }
    }
}

/// Every documented error, each with its SQLSTATE and the argument its message names, and
/// none changes anything: the calls carry an ack that would succeed (a live claim and its
/// token), so a failure after the ack must roll the ack back. At the end the same ack, in a
/// valid call, does complete the message.
///
/// It runs in the ordering tests' database, where a tick (pgq_tick) makes the queue's
/// shared state known, so that its depths are part of what must not change.
#[test]
fn ack_claim_errors_change_nothing() {
    let mut c = connect_to(&ordering_db());
    let q = new_queue(&mut c, "");
    let ids = send_many(&mut c, &q, 3, "0");
    let (a, ta) = held(&claim(&mut c, &q, 1, Some("1 hour")))[0];
    let other = ids[1];
    assert_eq!(a, ids[0]);
    {
        let _heavy = heavy(); // not while a test needs its queues without hints
        tick(&mut c);
    }
    let rnd = Uuid::new_v4();
    let good = format!("ARRAY[{a}]::bigint[], ARRAY['{ta}']::uuid[]");
    let stale = format!("ARRAY[{a}]::bigint[], ARRAY['{rnd}']::uuid[]");
    let none = "'{}'::bigint[], '{}'::uuid[]".to_string();
    let before = world(&mut c, &q);
    assert_eq!(before.messages.iter().filter(|m| m.1 == "ready").count(), 2);
    assert!(before.depth.as_deref().is_some_and(|d| d.starts_with("(2,0,1,")), "depths known: {:?}", before.depth);

    let mut cases: Vec<(String, &str, &str)> = vec![
        // The arrays.
        (format!("'{q}', NULL, ARRAY['{ta}']::uuid[]"), "22004", "\"ack_msg_ids\""),
        (format!("'{q}', ARRAY[{a}]::bigint[], NULL"), "22004", "\"ack_claim_tokens\""),
        (format!("'{q}', NULL, NULL"), "22004", "\"ack_msg_ids\""),
        (format!("'{q}', ARRAY[{a}, NULL]::bigint[], ARRAY['{ta}', '{rnd}']::uuid[]"), "22004", "ack_msg_ids"),
        (format!("'{q}', ARRAY[{a}, {other}]::bigint[], ARRAY['{ta}', NULL]::uuid[]"), "22004", "ack_claim_tokens"),
        (format!("'{q}', ARRAY[{a}, {other}]::bigint[], ARRAY['{ta}']::uuid[]"), "22023", "\"ack_claim_tokens\""),
        (format!("'{q}', ARRAY[{a}]::bigint[], ARRAY['{ta}', '{rnd}']::uuid[]"), "22023", "\"ack_claim_tokens\""),
        (format!("'{q}', '{{}}'::bigint[], ARRAY['{ta}']::uuid[]"), "22023", "\"ack_claim_tokens\""),
        (format!("'{q}', ARRAY[[{a}]]::bigint[], ARRAY['{ta}']::uuid[]"), "22023", "\"ack_msg_ids\""),
        (format!("'{q}', ARRAY[{a}]::bigint[], ARRAY[['{ta}']]::uuid[]"), "22023", "\"ack_claim_tokens\""),
        // The queue.
        (format!("'no_such_queue', {good}"), "42704", "no_such_queue"),
        (format!("'Bad Name', {good}"), "22023", "\"queue\""),
        (format!("NULL, {good}"), "22004", "\"queue\""),
    ];
    // pgq_claim's own arguments, after an ack that succeeded, after one that failed the
    // fence (nothing acked) and without acks.
    for acks in [&good, &stale, &none] {
        for (arg, code, names) in [
            ("qty => NULL", "22004", "\"qty\""),
            ("qty => 0", "22023", "\"qty\""),
            ("qty => -1", "22023", "\"qty\""),
            ("qty => 1001", "22023", "\"qty\""),
            ("lease => '0 s'", "22023", "\"lease\""),
            ("lease => '-1 s'", "22023", "\"lease\""),
            ("lease => '25 hours'", "22023", "\"lease\""),
            ("session_bound => NULL", "22004", "\"session_bound\""),
            // wait is checked even when an ack means the call will not wait.
            ("wait => '-1 s'", "22023", "\"wait\""),
            ("wait => '61 s'", "22023", "\"wait\""),
            ("wait => '2 min'", "22023", "\"wait\""),
            ("wait => NULL", "22004", "\"wait\""),
        ] {
            cases.push((format!("'{q}', {acks}, {arg}"), code, names));
        }
    }
    for (args, code, names) in &cases {
        let sql = format!("SELECT * FROM pgqueue.pgq_ack_claim({args})");
        let (got, message) = error_of(&mut c, &sql);
        assert_eq!(&got, code, "{sql}: {message}");
        assert!(message.contains(names), "{sql}: the message names {names}: {message}");
        assert_eq!(world(&mut c, &q), before, "{sql} changed nothing");
    }

    // Waiting needs READ COMMITTED: 0A000 in the stricter levels, whether the ack succeeded
    // (the call would not wait) or there was nothing to ack.
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        for acks in [&good, &none] {
            c.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}")).unwrap();
            let sql = format!("SELECT * FROM pgqueue.pgq_ack_claim('{q}', {acks}, wait => '1 s')");
            let (got, message) = error_of(&mut c, &sql);
            c.batch_execute("ROLLBACK").unwrap();
            assert_eq!(got, "0A000", "{level}: {sql}: {message}");
            assert_eq!(world(&mut c, &q), before, "{level}: {sql} changed nothing");
        }
    }

    // The same ack in a valid call (REPEATABLE READ, no wait): it was good all along.
    c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ").unwrap();
    let reply = ack_claim(&mut c, &q, &[(a, ta)], ", qty => 2, wait => '0'");
    c.batch_execute("COMMIT").unwrap();
    assert!(reply.not_acked.is_empty());
    assert_eq!(reply.claimed.len(), 2);
    assert!(completed_once(&mut c, &q, a));
}

/// The fence, as pgq_ack's: an ack completes a message only with its current claim token.
/// Every other ack — a wrong token, a message already finished or given back (nack), an
/// unknown id — completes nothing and is reported as `not_acked`, once per id, in the order
/// given, before the claimed rows. Duplicates of a good pair ack once; a good pair beside a
/// bad one for the same id acks it (and so does not report it).
#[test]
fn ack_claim_reports_stale_acks_and_completes_only_good_ones() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send_many(&mut c, &q, 9, "0");
    let held = held(&claim(&mut c, &q, 7, Some("1 hour")));
    let m: Vec<i64> = held.iter().map(|h| h.0).collect();
    let t: Vec<Uuid> = held.iter().map(|h| h.1).collect();
    let rnd = Uuid::new_v4;

    // A wrong token and an unknown id: reported, nothing completed; the call still claims.
    let reply = ack_claim(&mut c, &q, &[(m[0], rnd()), (-7, rnd())], "");
    assert_eq!(reply.not_acked, vec![m[0], -7]);
    assert_eq!(reply.claimed.len(), 1, "qty 1 claimed after the report");
    let extra1 = reply.held()[0];
    assert!(claimed_by(&mut c, m[0], t[0]), "the holder keeps it");
    assert!(history_of(&mut c, m[0]).is_empty());

    // Already finished (by pgq_ack): reported, completed only once.
    let ok: bool = c.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&m[1], &t[1]]).unwrap().get(0);
    assert!(ok);
    let reply = ack_claim(&mut c, &q, &[(m[1], t[1])], "");
    assert_eq!(reply.not_acked, vec![m[1]]);
    let extra2 = reply.held()[0];
    assert!(completed_once(&mut c, &q, m[1]));

    // Given back (nack): its old token is spent; the message stays ready, then is claimed.
    let ok: bool = c.query_one("SELECT pgqueue.pgq_nack($1, $2, retry_in => '0')", &[&m[6], &t[6]]).unwrap().get(0);
    assert!(ok);
    let reply = ack_claim(&mut c, &q, &[(m[6], t[6])], ", qty => 5");
    assert_eq!(reply.not_acked, vec![m[6]]);
    assert_eq!(reply.ids(), vec![m[6]], "claimed again, the only message ready");
    assert_eq!((reply.claimed[0].attempt, reply.claimed[0].token == t[6]), (2, false));
    let m6 = reply.held()[0];

    // Duplicates: a good pair twice acks once and reports nothing; a bad pair twice is
    // reported once; a bad and a good pair for one id ack it.
    let reply = ack_claim(&mut c, &q, &[(m[2], t[2]), (m[2], t[2])], "");
    assert!(reply.not_acked.is_empty() && reply.claimed.is_empty(), "{reply:?}");
    assert!(completed_once(&mut c, &q, m[2]));
    let reply = ack_claim(&mut c, &q, &[(m[3], rnd()), (m[3], rnd())], "");
    assert_eq!(reply.not_acked, vec![m[3]]);
    assert!(claimed_by(&mut c, m[3], t[3]));
    let reply = ack_claim(&mut c, &q, &[(m[4], rnd()), (m[4], t[4])], "");
    assert!(reply.not_acked.is_empty(), "{reply:?}");
    assert!(completed_once(&mut c, &q, m[4]));

    // A mix: the good ones completed, the others reported in the order first given.
    let mix = [(m[5], rnd()), (m[0], t[0]), (-7, rnd()), (m[3], t[3]), (m[2], t[2]), (m[5], rnd()), (m6.0, t[6])];
    let reply = ack_claim(&mut c, &q, &mix, ", qty => 3");
    assert_eq!(reply.not_acked, vec![m[5], -7, m[2], m6.0]);
    assert!(reply.claimed.is_empty(), "nothing left to claim");
    for id in [m[0], m[3]] {
        assert_eq!(
            history_of(&mut c, id).iter().map(Finished::summary).collect::<Vec<_>>(),
            vec![(q.as_str(), "completed", 1)],
            "{id} completed once"
        );
    }
    assert!(completed_once(&mut c, &q, m[2]), "not completed twice");
    assert!(claimed_by(&mut c, m[5], t[5]) && claimed_by(&mut c, m6.0, m6.1));

    // The rest, with their tokens: all acked, nothing reported.
    let reply = ack_claim(&mut c, &q, &[(m[5], t[5]), m6, extra1, extra2], "");
    assert!(reply.not_acked.is_empty() && reply.claimed.is_empty(), "{reply:?}");
    let done: Vec<(i64, i64)> = c
        .query(
            "SELECT count(*), count(DISTINCT msg_id) FROM pgqueue.history WHERE queue = $1 AND outcome = 'completed'",
            &[&q],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(done, vec![(9, 9)]);
    assert!(world(&mut c, &q).messages.is_empty());
}

/// A claim whose lease expired and was re-armed: its old holder's ack fails the fence. Not
/// yet re-claimed, the message is ready (and the old holder's own call may claim it anew,
/// with a new token); re-claimed by another session, that session keeps it and acks it.
#[test]
fn ack_claim_fences_off_a_rearmed_and_reclaimed_claim() {
    let mut c = connect();
    let mut other = connect();
    let q = new_queue(&mut c, "");
    let ids = send_many(&mut c, &q, 2, "0");
    let old = held(&claim(&mut c, &q, 2, Some("50 ms")));
    assert_eq!(old.iter().map(|h| h.0).collect::<Vec<_>>(), ids);
    std::thread::sleep(Duration::from_millis(150));
    // (A tick of another test may have re-armed them first: what counts is that they are.)
    c.execute("SELECT * FROM pgqueue.pgq_rearm(queue => $1)", &[&q]).unwrap();
    for id in &ids {
        assert_eq!(
            message(&mut c, *id),
            Some(Message { state: "ready".to_string(), token: None, attempt: 1 }),
            "re-armed"
        );
    }

    // Another session claims the first again.
    let theirs = ack_claim(&mut other, &q, &[], "");
    assert_eq!(theirs.ids(), vec![ids[0]]);
    assert_eq!(theirs.claimed[0].attempt, 2);
    let theirs = theirs.held()[0];

    // The old holder acks both: the first is someone else's now, the second is ready again.
    // Its call reports both, completes neither, and claims the second anew.
    let reply = ack_claim(&mut c, &q, &old, ", qty => 5");
    assert_eq!(reply.not_acked, ids);
    assert_eq!(reply.ids(), vec![ids[1]]);
    assert_eq!(reply.claimed[0].attempt, 2);
    assert_ne!(reply.claimed[0].token, old[1].1, "a new claim, a new token");
    let mine = reply.held()[0];
    assert!(claimed_by(&mut c, ids[0], theirs.1), "the new holder keeps it");
    assert!(history_of(&mut c, ids[0]).is_empty() && history_of(&mut c, ids[1]).is_empty());

    // The old tokens are dead for good; the current holders ack.
    let reply = ack_claim(&mut c, &q, &old, "");
    assert_eq!(reply.not_acked, ids);
    let reply = ack_claim(&mut other, &q, &[theirs], "");
    assert!(reply.not_acked.is_empty() && reply.claimed.is_empty());
    let reply = ack_claim(&mut c, &q, &[mine], "");
    assert!(reply.not_acked.is_empty() && reply.claimed.is_empty());
    for id in &ids {
        assert_eq!(
            history_of(&mut c, *id).iter().map(Finished::summary).collect::<Vec<_>>(),
            vec![(q.as_str(), "completed", 2)]
        );
    }
}

/// Empty arrays: exactly a claim — the arguments of pgq_claim with their defaults (qty 1,
/// the queue's lease, no consumer, not session-bound), and each one honoured when given.
#[test]
fn ack_claim_with_empty_arrays_is_a_plain_claim() {
    let mut c = connect();
    let q = new_queue(&mut c, ", lease => '30 s'");
    let low: i64 = c.query_one("SELECT pgqueue.pgq_send($1, '{\"n\": 1}')", &[&q]).unwrap().get(0);
    let high: i64 = c
        .query_one(
            "SELECT pgqueue.pgq_send($1, '{\"n\": 2}', priority => 4::smallint, headers => '{\"h\": \"v\"}')",
            &[&q],
        )
        .unwrap()
        .get(0);
    let third = send(&mut c, &q, json!({}));
    let row = c
        .query_one(
            "SELECT kind, msg_id, attempt, priority, payload, headers, enqueued_at <= now(),
                    lease_expires_at - now() BETWEEN '29 s' AND '31 s'
               FROM pgqueue.pgq_ack_claim($1, '{}', '{}')",
            &[&q],
        )
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "claimed");
    assert_eq!(row.get::<_, i64>(1), high, "qty 1, highest priority first");
    assert_eq!(row.get::<_, i32>(2), 1);
    assert_eq!(row.get::<_, i16>(3), 4);
    assert_eq!(row.get::<_, serde_json::Value>(4), json!({"n": 2}));
    assert_eq!(row.get::<_, serde_json::Value>(5), json!({"h": "v"}));
    assert!(row.get::<_, bool>(6));
    assert!(row.get::<_, bool>(7), "the queue's lease");
    let held: (Option<String>, Option<i32>) = c
        .query_one("SELECT consumer, session_pid FROM pgqueue.messages WHERE msg_id = $1", &[&high])
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert_eq!(held, (None, None));

    let rows = c
        .query(
            "SELECT msg_id, lease_expires_at - now() BETWEEN '9 s' AND '11 s'
               FROM pgqueue.pgq_ack_claim($1, '{}', '{}', qty => 5, lease => '10 s', consumer => 'w7',
                                          session_bound => true)",
            &[&q],
        )
        .unwrap();
    assert_eq!(rows.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>(), vec![low, third]);
    assert!(rows.iter().all(|r| r.get::<_, bool>(1)), "the lease given");
    for id in [low, third] {
        let ok: bool = c
            .query_one(
                "SELECT consumer = 'w7' AND session_pid = pg_backend_pid() FROM pgqueue.messages WHERE msg_id = $1",
                &[&id],
            )
            .unwrap()
            .get(0);
        assert!(ok, "consumer and session recorded");
    }
    assert!(ack_claim(&mut c, &q, &[], ", qty => 1000").claimed.is_empty(), "nothing left");
}

/// Payloads and headers come back exactly as they were sent, whatever their size: large
/// ones are stored out of line (TOAST), numbers keep every digit, both functions, and a row
/// returned by one statement is still whole after its message is acked in the next.
#[test]
fn claims_return_payloads_as_sent_large_ones_too() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    // ~300 kB that does not compress: stored out of line.
    let big: String = (0..20_000u64).map(|i| format!("{:016x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15))).collect();
    // As text: serde_json would round the long number.
    let sent: [(String, Option<String>); 3] = [
        (json!({ "big": big, "n": 1 }).to_string(), Some(json!({ "h": big.len() }).to_string())),
        (r#"{"n": 12345678901234567890.12345678901234567890}"#.into(), None),
        (json!({ "small": [1, "two", null, true] }).to_string(), Some(json!({ "big": big }).to_string())),
    ];
    for (payload, headers) in &sent {
        c.execute("SELECT pgqueue.pgq_send($1, $2::text::jsonb, headers => $3::text::jsonb)", &[&q, payload, headers])
            .unwrap();
    }
    let stored = |c: &mut Client, id: i64| -> (String, Option<String>) {
        let r =
            c.query_one("SELECT payload::text, headers::text FROM pgqueue.messages WHERE msg_id = $1", &[&id]).unwrap();
        (r.get(0), r.get(1))
    };
    let mut tx = c.transaction().unwrap();
    let first = tx
        .query_one("SELECT msg_id, claim_token, payload::text, headers::text FROM pgqueue.pgq_claim($1)", &[&q])
        .unwrap();
    let (id, token): (i64, Uuid) = (first.get(0), first.get(1));
    // Kept by the client, then compared after the ack (same transaction) deleted the row.
    let (payload, headers): (String, Option<String>) = (first.get(2), first.get(3));
    let kept = tx
        .query(
            "SELECT kind, msg_id, payload::text, headers::text
               FROM pgqueue.pgq_ack_claim($1, ARRAY[$2::bigint], ARRAY[$3::uuid], qty => 2)",
            &[&q, &id, &token],
        )
        .unwrap();
    tx.commit().unwrap();
    let canonical =
        |c: &mut Client, v: &String| -> String { c.query_one("SELECT $1::text::jsonb::text", &[v]).unwrap().get(0) };
    assert_eq!(payload, canonical(&mut c, &sent[0].0));
    assert_eq!(headers, sent[0].1.as_ref().map(|h| canonical(&mut c, h)));
    assert_eq!(kept.len(), 2, "two claimed: {kept:?}");
    for (row, (p, h)) in kept.iter().zip(&sent[1..]) {
        assert_eq!(row.get::<_, String>(0), "claimed");
        let id: i64 = row.get(1);
        let (sp, sh) = stored(&mut c, id);
        assert_eq!(row.get::<_, String>(2), sp, "as stored");
        assert_eq!(row.get::<_, Option<String>>(3), sh);
        assert_eq!(sp, canonical(&mut c, p));
        assert_eq!(sh, h.as_ref().map(|h| canonical(&mut c, h)));
    }
    assert!(
        kept[0].get::<_, String>(2).contains("12345678901234567890.12345678901234567890"),
        "every digit: {}",
        kept[0].get::<_, String>(2)
    );
}

/// The claim and the ack keep their statements prepared for the connection's life: a session
/// that outlives its extension (dropped and created again, so every table and function has a
/// new oid) goes on claiming and acking without an error, and sees only the new queue.
#[test]
fn a_session_claims_on_after_the_extension_is_created_again() {
    let mut admin = connect();
    let db = format!("ackc_again_{}", std::process::id());
    admin.batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
    let mut c = connect_to(&db);
    let round = |c: &mut Client, n: i64| {
        c.batch_execute("CREATE EXTENSION pgqueue; SELECT pgqueue.pgq_create_queue('again')").unwrap();
        let sent: i64 =
            c.query_one("SELECT pgqueue.pgq_send('again', jsonb_build_object('n', $1::bigint))", &[&n]).unwrap().get(0);
        let r = c.query_one("SELECT msg_id, claim_token, payload->>'n' FROM pgqueue.pgq_claim('again')", &[]).unwrap();
        assert_eq!((r.get::<_, i64>(0), r.get::<_, String>(2)), (sent, n.to_string()));
        let token: Uuid = r.get(1);
        let next = c
            .query(
                "SELECT kind FROM pgqueue.pgq_ack_claim('again', ARRAY[$1::bigint], ARRAY[$2::uuid])",
                &[&sent, &token],
            )
            .unwrap();
        assert!(next.is_empty(), "acked, nothing else to claim: {next:?}");
        let done: i64 = c.query_one("SELECT count(*) FROM pgqueue.history WHERE msg_id = $1", &[&sent]).unwrap().get(0);
        assert_eq!(done, 1);
        c.batch_execute("DROP EXTENSION pgqueue CASCADE").unwrap();
    };
    for n in 1..=3 {
        round(&mut c, n);
    }
    drop(c);
    admin.batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)")).unwrap();
}

/// A paused queue: the call acks (acks are by id and token) but claims nothing.
#[test]
fn ack_claim_on_a_paused_queue_acks_and_claims_nothing() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let ids = send_many(&mut c, &q, 3, "0");
    let held = held(&claim(&mut c, &q, 2, Some("1 hour")));
    c.execute("SELECT pgqueue.pgq_pause_queue($1)", &[&q]).unwrap();
    let reply = ack_claim(&mut c, &q, &held, ", qty => 10");
    assert!(reply.not_acked.is_empty() && reply.claimed.is_empty(), "{reply:?}");
    assert!(completed_once(&mut c, &q, ids[0]) && completed_once(&mut c, &q, ids[1]));
    assert_eq!(state(&mut c, ids[2]).as_deref(), Some("ready"));
    c.execute("SELECT pgqueue.pgq_resume_queue($1)", &[&q]).unwrap();
    assert_eq!(ack_claim(&mut c, &q, &[], ", qty => 10").ids(), vec![ids[2]]);
}

/// Acks are by id and token, whatever the queue: a message of another queue is completed
/// (in its own queue's history) and the call claims from the queue it names.
#[test]
fn ack_claim_acks_a_message_of_another_queue() {
    let mut c = connect();
    let qa = new_queue(&mut c, "");
    let qb = new_queue(&mut c, "");
    let a = send(&mut c, &qa, json!({}));
    let b = send(&mut c, &qb, json!({}));
    let held = held(&claim(&mut c, &qa, 1, Some("1 hour")));
    let reply = ack_claim(&mut c, &qb, &held, "");
    assert!(reply.not_acked.is_empty());
    assert_eq!(reply.ids(), vec![b]);
    assert_eq!(
        history_of(&mut c, a).iter().map(Finished::summary).collect::<Vec<_>>(),
        vec![(qa.as_str(), "completed", 1)]
    );
    assert!(world(&mut c, &qa).messages.is_empty() && world(&mut c, &qb).history.is_empty());
}

/// A call that acked something does not wait, even on an empty queue (the acks commit with
/// it): waiting 10 s, it returns well before (a behavioural bound, not a performance one),
/// also when some of its acks failed the fence.
#[test]
fn ack_claim_that_acked_does_not_wait() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send_many(&mut c, &q, 3, "0");
    let held = held(&claim(&mut c, &q, 3, Some("1 hour")));
    // Acks that all fail the fence do not make it wait either: their report comes at once.
    for acks in [vec![held[0]], vec![held[1], (held[2].0, Uuid::new_v4())], vec![(held[2].0, Uuid::new_v4())]] {
        let start = Instant::now();
        let reply = ack_claim(&mut c, &q, &acks, ", qty => 4, wait => '10 s'");
        let elapsed = start.elapsed();
        assert!(elapsed < Duration::from_secs(5), "it had acks, so it did not wait: {elapsed:?}");
        assert!(reply.claimed.is_empty());
        let stale: Vec<i64> =
            acks.iter().filter(|a| a.1 != held.iter().find(|h| h.0 == a.0).unwrap().1).map(|a| a.0).collect();
        assert_eq!(reply.not_acked, stale);
        if stale.len() < acks.len() {
            assert!(completed_once(&mut c, &q, acks[0].0));
        }
    }
    assert!(claimed_by(&mut c, held[2].0, held[2].1));
}

/// A call with nothing to ack waits as pgq_claim does: it sleeps (the queue counts a waiting
/// claim), a send committed by another session wakes it, and it returns that message.
#[test]
fn ack_claim_with_nothing_to_ack_waits_and_a_send_wakes_it() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send(&mut c, &q, json!({}));
    let (id, token) = held(&claim(&mut c, &q, 1, Some("1 hour")))[0];
    // Twice: a wake-up of the first round must not be left over for the second.
    for _ in 0..2 {
        let acks: Vec<(i64, Uuid)> = vec![];
        let waiter = {
            let (q, acks) = (q.clone(), acks.clone());
            std::thread::spawn(move || {
                let mut c = connect();
                let start = Instant::now();
                let reply = ack_claim(&mut c, &q, &acks, ", qty => 3, wait => '30 s'");
                (reply, start.elapsed())
            })
        };
        wait_for("the call to sleep", Duration::from_secs(20), || {
            let waiting: i64 =
                c.query_one("SELECT waiting_claims FROM pgqueue.queue_depth WHERE queue = $1", &[&q]).unwrap().get(0);
            (waiting == 1).then_some(())
        });
        let sent = send(&mut c, &q, json!({}));
        let (reply, elapsed) = waiter.join().unwrap();
        assert_eq!(reply.not_acked, acks.iter().map(|a| a.0).collect::<Vec<_>>());
        assert_eq!(reply.ids(), vec![sent], "woken by the send, with its message");
        assert!(elapsed < Duration::from_secs(25), "woken, not timed out: {elapsed:?}");
        let reply = ack_claim(&mut c, &q, &reply.held(), "");
        assert!(reply.not_acked.is_empty());
    }
    assert!(claimed_by(&mut c, id, token), "the claimed message stays with its holder");
}

/// Granted to pgqueue_consumer (and so to pgqueue_admin, a member), not to
/// pgqueue_producer, not to PUBLIC.
#[test]
fn ack_claim_privileges() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    send_many(&mut c, &q, 3, "0");
    let (a, ta) = held(&claim(&mut c, &q, 1, Some("1 hour")))[0];
    let signature =
        "pgqueue.pgq_ack_claim(text, bigint[], uuid[], integer, interval, text, boolean, interval, jsonb[])";
    for (role, expected) in
        [("public", false), ("pgqueue_producer", false), ("pgqueue_consumer", true), ("pgqueue_admin", true)]
    {
        let can: bool =
            c.query_one("SELECT has_function_privilege($1, $2, 'EXECUTE')", &[&role, &signature]).unwrap().get(0);
        assert_eq!(can, expected, "{role}");
    }

    let user = unique_queue("ackc_user");
    c.batch_execute(&format!("CREATE ROLE {user} LOGIN")).unwrap();
    let as_role = |c: &mut Client, role: Option<&str>, sql: &str| -> Result<Vec<postgres::Row>, postgres::Error> {
        if let Some(role) = role {
            c.batch_execute(&format!("GRANT {role} TO {user}"))?;
        }
        c.batch_execute(&format!("SET ROLE {user}"))?;
        let r = c.query(sql, &[]);
        c.batch_execute("RESET ROLE")?;
        if let Some(role) = role {
            c.batch_execute(&format!("REVOKE {role} FROM {user}"))?;
        }
        r
    };
    let sql =
        format!("SELECT kind, msg_id FROM pgqueue.pgq_ack_claim('{q}', ARRAY[{a}]::bigint[], ARRAY['{ta}']::uuid[])");
    let before = world(&mut c, &q);
    for role in [None, Some("pgqueue_producer")] {
        let e = as_role(&mut c, role, &sql).expect_err("refused");
        assert_eq!(e.code().map(|s| s.code()), Some("42501"), "{role:?}: {e}");
        assert_eq!(world(&mut c, &q), before, "{role:?}: nothing changed");
    }
    let rows = as_role(&mut c, Some("pgqueue_consumer"), &sql).unwrap();
    assert_eq!(rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>(), vec!["claimed"]);
    assert!(completed_once(&mut c, &q, a));
    let sql = format!("SELECT kind FROM pgqueue.pgq_ack_claim('{q}', '{{}}', '{{}}')");
    assert_eq!(as_role(&mut c, Some("pgqueue_admin"), &sql).unwrap().len(), 1);
    c.batch_execute(&format!("DROP ROLE {user}")).unwrap();
}

/// What one session of a drain did.
#[derive(Default)]
struct Drained {
    claimed: Vec<i64>,
    acked: Vec<i64>,
    not_acked: Vec<i64>,
    /// Acks presented with a wrong token on purpose: (call, ids).
    spoiled: Vec<Vec<i64>>,
}

/// `sessions` sessions drain `q` with pgq_ack_claim, each acking what it holds while it
/// claims the next (qty 1 to 8, by session), until a call claims nothing and it holds
/// nothing. With `spoil`, a session now and then presents a wrong token for one of its
/// held ids, or swaps the tokens of two: exactly those must come back not_acked, and be
/// acked with the right tokens by its next call.
fn drain(q: &str, sessions: usize, spoil: bool) -> Vec<Drained> {
    let start = Arc::new(Barrier::new(sessions));
    let workers: Vec<_> = (0..sessions)
        .map(|w| {
            let (q, start) = (q.to_owned(), start.clone());
            std::thread::spawn(move || {
                let mut c = connect();
                let call = c
                    .prepare(
                        "SELECT kind, msg_id, claim_token
                           FROM pgqueue.pgq_ack_claim($1, $2::bigint[], $3::uuid[], qty => $4, consumer => $5)",
                    )
                    .unwrap();
                let qty = 1 + (w % 8) as i32;
                let me = format!("w{w}");
                let mut out = Drained::default();
                let mut held: Vec<(i64, Uuid)> = vec![];
                let mut spoiled_last = false;
                start.wait();
                for n in 0usize.. {
                    let ids: Vec<i64> = held.iter().map(|h| h.0).collect();
                    let mut tokens: Vec<Uuid> = held.iter().map(|h| h.1).collect();
                    let mut spoiled = vec![];
                    if spoil && !spoiled_last && !held.is_empty() {
                        if n % 5 == 1 {
                            let i = n % held.len();
                            tokens[i] = Uuid::new_v4();
                            spoiled.push(ids[i]);
                        } else if n % 5 == 3 && held.len() >= 2 {
                            tokens.swap(0, 1);
                            spoiled.extend(&ids[..2]);
                        }
                    }
                    let rows = c.query(&call, &[&q, &ids, &tokens, &qty, &me]).unwrap();
                    let mut not_acked = vec![];
                    let mut claimed = vec![];
                    for r in &rows {
                        match r.get::<_, &str>(0) {
                            "not_acked" => not_acked.push(r.get::<_, i64>(1)),
                            "claimed" => claimed.push((r.get::<_, i64>(1), r.get::<_, Uuid>(2))),
                            other => panic!("unknown kind {other}"),
                        }
                    }
                    assert_eq!(not_acked, spoiled, "session {w}, call {n}: not_acked are the spoiled acks");
                    out.acked.extend(ids.iter().filter(|id| !not_acked.contains(id)));
                    out.not_acked.extend(&not_acked);
                    out.claimed.extend(claimed.iter().map(|m| m.0));
                    // What failed the fence is still held: present it again, rightly.
                    let kept: Vec<(i64, Uuid)> = held.iter().copied().filter(|h| spoiled.contains(&h.0)).collect();
                    spoiled_last = !spoiled.is_empty();
                    if spoiled_last {
                        out.spoiled.push(spoiled);
                    }
                    held = kept.into_iter().chain(claimed).collect();
                    if held.is_empty() {
                        break;
                    }
                }
                out
            })
        })
        .collect();
    workers.into_iter().map(|w| w.join().unwrap()).collect()
}

/// Each of `ids` completed exactly once: claimed once, acked once, in history once as
/// completed at its first attempt, nothing left of `q`.
fn exactly_once(c: &mut Client, q: &str, ids: &[i64], sessions: &[Drained]) {
    let claimed: Vec<i64> = sessions.iter().flat_map(|s| s.claimed.iter().copied()).collect();
    let acked: Vec<i64> = sessions.iter().flat_map(|s| s.acked.iter().copied()).collect();
    let sent: HashSet<i64> = ids.iter().copied().collect();
    let claimed_set: HashSet<i64> = claimed.iter().copied().collect();
    let acked_set: HashSet<i64> = acked.iter().copied().collect();
    assert_eq!(claimed.len(), ids.len(), "every message claimed, none twice");
    assert_eq!(claimed_set, sent);
    assert_eq!(acked.len(), ids.len(), "every claim acked once");
    assert_eq!(acked_set, sent);
    let row = c
        .query_one(
            "SELECT count(*), count(DISTINCT msg_id), count(*) FILTER (WHERE outcome = 'completed' AND attempt = 1),
                    (SELECT count(*) FROM pgqueue.messages WHERE queue = $1)
               FROM pgqueue.history WHERE queue = $1",
            &[&q],
        )
        .unwrap();
    let n = ids.len() as i64;
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, i64>(1), row.get::<_, i64>(2), row.get::<_, i64>(3)),
        (n, n, n, 0),
        "history: every message completed once at its first attempt; nothing left in messages"
    );
    let ids: Vec<i64> = ids.to_vec();
    let in_history: i64 = c
        .query_one("SELECT count(*) FROM pgqueue.history WHERE queue = $1 AND msg_id = ANY($2)", &[&q, &ids])
        .unwrap()
        .get(0);
    assert_eq!(in_history, n, "the messages sent, not others");
}

/// 32 sessions drain 20,000 messages with pgq_ack_claim alone (qty 1 to 8): each completed
/// exactly once, none claimed twice, no ack ever fails the fence (leases of 10 minutes).
#[test]
fn ack_claim_32_sessions_drain_20000_exactly_once() {
    let _heavy = heavy();
    let mut c = connect();
    let q = new_queue(&mut c, ", lease => '10 min'");
    let ids = send_many(&mut c, &q, 20_000, "0");
    let sessions = drain(&q, 32, false);
    let not_acked: Vec<i64> = sessions.iter().flat_map(|s| s.not_acked.iter().copied()).collect();
    assert!(not_acked.is_empty(), "no ack failed: {not_acked:?}");
    exactly_once(&mut c, &q, &ids, &sessions);
}

/// The fence under concurrency: 8 sessions drain 4,000 messages, each now and then
/// presenting a wrong token for one of its held ids or swapping the tokens of two. Exactly
/// those come back not_acked (checked call by call), stay held, and the next call acks
/// them; every message is still completed exactly once.
#[test]
fn ack_claim_fence_holds_under_concurrency() {
    let _heavy = heavy();
    let mut c = connect();
    let q = new_queue(&mut c, ", lease => '10 min'");
    let ids = send_many(&mut c, &q, 4_000, "0");
    let sessions = drain(&q, 8, true);
    let spoiled: Vec<i64> = sessions.iter().flat_map(|s| s.spoiled.iter().flatten().copied()).collect();
    let not_acked: Vec<i64> = sessions.iter().flat_map(|s| s.not_acked.iter().copied()).collect();
    assert!(spoiled.len() > 100, "the fence was tried: {} spoiled acks", spoiled.len());
    assert!(sessions.iter().any(|s| s.spoiled.iter().any(|x| x.len() == 2)), "swapped tokens were tried");
    assert_eq!(not_acked, spoiled);
    exactly_once(&mut c, &q, &ids, &sessions);
}

/// A database of the test cluster of this binary's own, for the ordering tests, which run
/// the worker's tick (pgq_tick) to give their queues claim hints: a tick also re-arms
/// expired claims database-wide, which would disturb the tests that count re-arms.
fn ordering_db() -> String {
    static DB: OnceLock<String> = OnceLock::new();
    DB.get_or_init(|| {
        let mut c = connect(); // and the worker off
        let name = format!("ackc_order_{}", std::process::id());
        c.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
        connect_to(&name).batch_execute("CREATE EXTENSION pgqueue").unwrap();
        name
    })
    .clone()
}

/// A small deterministic generator.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// The order claims follow: higher priority first, then msg_id.
fn key(priority: i16, id: i64) -> (i32, i64) {
    (-i32::from(priority), id)
}

/// About `n` messages in batches of 1 to 12, each batch of one priority drawn from
/// `priorities`, so that ids interleave across priorities; their keys.
fn send_mixed(c: &mut Client, q: &str, n: usize, priorities: &[i16], rng: &mut Lcg) -> Vec<(i32, i64)> {
    let mut keys = vec![];
    while keys.len() < n {
        let size = 1 + rng.below(12) as usize;
        let priority = priorities[rng.below(priorities.len() as u64) as usize];
        let payloads: Vec<serde_json::Value> = (0..size).map(|i| json!({ "i": i, "p": priority })).collect();
        let rows = c
            .query("SELECT * FROM pgqueue.pgq_send_batch($1, $2, priority => $3)", &[&q, &payloads, &priority])
            .unwrap();
        keys.extend(rows.iter().map(|r| key(priority, r.get(0))));
    }
    keys
}

/// One tick of the worker's housekeeping in `c`'s database; all its steps succeed.
fn tick(c: &mut Client) {
    let failed: Vec<(String, String)> =
        c.query("SELECT * FROM pgqueue.pgq_tick()", &[]).unwrap().iter().map(|r| (r.get(0), r.get(1))).collect();
    assert!(failed.is_empty(), "the tick's steps succeed: {failed:?}");
}

/// Gives `q` its claim hints (the worker's reconcile step, run here by pgq_tick), or checks
/// it has none; either way claims use the path asked for.
fn use_hints(c: &mut Client, q: &str, hinted: bool) {
    if hinted {
        tick(c);
    }
    let has: bool = c.query_one("SELECT priorities IS NOT NULL FROM pgqueue._claim_start($1)", &[&q]).unwrap().get(0);
    assert_eq!(has, hinted, "claims of {q} scan from hints: {hinted}");
}

/// Where claims of `q` start scanning its only priority (its hint).
fn hint(c: &mut Client, q: &str) -> i64 {
    c.query_one("SELECT starts[1] FROM pgqueue._claim_start($1)", &[&q]).unwrap().get(0)
}

/// What is guaranteed to a single consumer: each claim returns the first `qty` claimable
/// messages in (priority descending, msg_id ascending) order — strict priority, FIFO
/// within a priority — across calls and within a batch, with pgq_claim and with
/// pgq_ack_claim, whether the claim scans from the shared hints or from the start of the
/// queue, and also for messages sent between calls (a new higher priority comes first,
/// a new lower one after all else).
#[test]
fn ack_claim_one_consumer_gets_priority_then_fifo_order() {
    let _heavy = heavy(); // no other test's tick gives hints to the queues meant to have none
    let db = ordering_db();
    let mut rng = Lcg(7);
    for hinted in [false, true] {
        for via_ack_claim in [false, true] {
            let what = format!("hinted {hinted}, via pgq_ack_claim {via_ack_claim}");
            let mut c = connect_to(&db);
            let q = unique_queue("ackc_order1");
            c.execute("SELECT pgqueue.pgq_create_queue($1)", &[&q]).unwrap();
            let mut remaining: BTreeSet<(i32, i64)> =
                send_mixed(&mut c, &q, 240, &[-3, 0, 2, 9], &mut rng).into_iter().collect();
            use_hints(&mut c, &q, hinted);
            let mut held: Vec<(i64, Uuid)> = vec![];
            for call in 0usize.. {
                if call == 6 {
                    remaining.extend(send_mixed(&mut c, &q, 40, &[12, 2, -8], &mut rng));
                }
                let qty = 1 + (call % 8) as i32;
                let got: Vec<(i64, Uuid, i16)> = if via_ack_claim {
                    let reply = ack_claim(&mut c, &q, &held, &format!(", qty => {qty}"));
                    assert!(reply.not_acked.is_empty(), "{what}");
                    reply.claimed.iter().map(|m| (m.id, m.token, m.priority)).collect()
                } else {
                    let got: Vec<(i64, Uuid, i16)> = c
                        .query("SELECT msg_id, claim_token, priority FROM pgqueue.pgq_claim($1, $2)", &[&q, &qty])
                        .unwrap()
                        .iter()
                        .map(|r| (r.get(0), r.get(1), r.get(2)))
                        .collect();
                    let (ids, tokens): (Vec<i64>, Vec<Uuid>) = got.iter().map(|g| (g.0, g.1)).unzip();
                    let acked =
                        c.query("SELECT * FROM pgqueue.pgq_ack($1::bigint[], $2::uuid[])", &[&ids, &tokens]).unwrap();
                    assert_eq!(acked.len(), ids.len(), "{what}");
                    got
                };
                let keys: Vec<(i32, i64)> = got.iter().map(|g| key(g.2, g.0)).collect();
                let expected: Vec<(i32, i64)> = remaining.iter().take(qty as usize).copied().collect();
                assert_eq!(
                    keys, expected,
                    "{what}: call {call} (qty {qty}) returns the first claimable messages in order"
                );
                for k in &keys {
                    remaining.remove(k);
                }
                held = got.iter().map(|g| (g.0, g.1)).collect();
                if got.is_empty() {
                    break;
                }
            }
            assert!(remaining.is_empty(), "{what}");
            let left: i64 =
                c.query_one("SELECT count(*) FROM pgqueue.messages WHERE queue = $1", &[&q]).unwrap().get(0);
            assert_eq!(left, 0, "{what}");
        }
    }
}

/// One pgq_ack_claim call of the ordering test, times from one shared base.
struct Call {
    start: Duration,
    end: Duration,
    /// Its claimed messages' keys, in the order returned.
    keys: Vec<(i32, i64)>,
}

/// What is guaranteed to many consumers (here 16 sessions on a preloaded queue of 3,000
/// messages over 3 priorities, nothing sent or given back during the run, qty 1 to 8,
/// acking as they go with pgq_ack_claim):
/// - each call's batch is itself in (priority descending, msg_id) order;
/// - overtaking is bounded by concurrency: a call C (started at s_C, ended at e_C, as the
///   client sees it) returns a message m only if every message ahead of m (a higher
///   priority, or the same priority and a lower msg_id) was returned by some call that
///   started before C ended (s_C' < e_C) — claims skip only messages other claims in flight
///   hold, never one nobody has yet;
/// - every message is claimed and completed exactly once.
#[test]
fn ack_claim_many_consumers_overtake_only_within_concurrency() {
    const SESSIONS: usize = 16;
    let _heavy = heavy();
    let db = ordering_db();
    let mut c = connect_to(&db);
    let q = unique_queue("ackc_order16");
    c.execute("SELECT pgqueue.pgq_create_queue($1, lease => '10 min')", &[&q]).unwrap();
    let mut rng = Lcg(11);
    let mut sent = send_mixed(&mut c, &q, 3000, &[0, 5, 10], &mut rng);
    use_hints(&mut c, &q, true);

    let base = Instant::now();
    let go = Arc::new(Barrier::new(SESSIONS));
    let workers: Vec<_> = (0..SESSIONS)
        .map(|w| {
            let (db, q, go) = (db.clone(), q.clone(), go.clone());
            std::thread::spawn(move || {
                let mut c = connect_to(&db);
                let qty = 1 + (w % 8);
                let mut held = vec![];
                let mut calls = vec![];
                go.wait();
                loop {
                    let start = base.elapsed();
                    let reply = ack_claim(&mut c, &q, &held, &format!(", qty => {qty}"));
                    let end = base.elapsed();
                    assert!(reply.not_acked.is_empty(), "{:?}", reply.not_acked);
                    held = reply.held();
                    calls.push(Call {
                        start,
                        end,
                        keys: reply.claimed.iter().map(|m| key(m.priority, m.id)).collect(),
                    });
                    if held.is_empty() {
                        return calls;
                    }
                }
            })
        })
        .collect();
    let calls: Vec<Call> = workers.into_iter().flat_map(|w| w.join().unwrap()).collect();

    // Each batch in order; each message once.
    let mut returned_by: HashMap<(i32, i64), usize> = HashMap::new();
    for (i, call) in calls.iter().enumerate() {
        assert!(call.keys.windows(2).all(|w| w[0] < w[1]), "a batch in priority/FIFO order: {:?}", call.keys);
        for k in &call.keys {
            assert!(returned_by.insert(*k, i).is_none(), "{k:?} returned twice");
        }
    }

    // The bound: walking the messages in claim order, the latest start of the calls that
    // returned those ahead of m must precede the end of the call that returned m (a message
    // never returned counts as returned by a call that never started).
    sent.sort_unstable();
    let never = Duration::MAX;
    let mut latest: Option<(Duration, (i32, i64))> = None;
    let mut overtaken = 0;
    for k in &sent {
        let Some(call) = returned_by.get(k).map(|&i| &calls[i]) else {
            latest = Some((never, *k));
            continue;
        };
        if let Some((start, ahead)) = latest {
            assert!(
                start < call.end,
                "{k:?} was returned by a call that ended at {:?}, but {ahead:?}, ahead of it, only by a call that \
                 started at {start:?} (MAX: never)",
                call.end
            );
            if start > call.start {
                overtaken += 1;
            }
        }
        if latest.is_none_or(|(s, _)| call.start > s) {
            latest = Some((call.start, *k));
        }
    }
    println!(
        "{} calls; {overtaken} messages returned by a call that started before one returning a message ahead",
        calls.len()
    );
    assert_eq!(returned_by.len(), sent.len(), "every message returned");
    let row = c
        .query_one(
            "SELECT count(*) FILTER (WHERE outcome = 'completed'), count(DISTINCT msg_id),
                    (SELECT count(*) FROM pgqueue.messages WHERE queue = $1)
               FROM pgqueue.history WHERE queue = $1",
            &[&q],
        )
        .unwrap();
    let n = sent.len() as i64;
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1), row.get::<_, i64>(2)), (n, n, 0));
}

/// Concurrent claims are handed rows one at a time (`pgqueue._take`, called per row before a
/// claim locks it): a row handed to one claim is passed over by every other, without trying
/// its lock, and comes back if that claim rolls back before it has claimed anything. The
/// same claim may ask again (PostgreSQL re-checks a row it has locked if it changed).
#[test]
fn a_row_handed_to_one_claim_is_passed_over_by_others_until_it_rolls_back() {
    let _heavy = heavy();
    let db = ordering_db();
    let mut a = connect_to(&db);
    let mut b = connect_to(&db);
    let q = unique_queue("ackc_hand");
    a.execute("SELECT pgqueue.pgq_create_queue($1)", &[&q]).unwrap();
    let ids = send_many(&mut a, &q, 3, "0");
    use_hints(&mut a, &q, true);
    let take = |c: &mut Client, id: i64| -> bool {
        c.query_one(
            "SELECT pgqueue._take($1, 0::smallint, (SELECT epoch FROM pgqueue._claim_start($1)), $2)",
            &[&q, &id],
        )
        .unwrap()
        .get(0)
    };
    assert_eq!(hint(&mut b, &q), ids[0]);

    a.batch_execute("BEGIN").unwrap();
    assert!(take(&mut a, ids[0]), "the first claim to ask is handed the row");
    assert!(take(&mut a, ids[0]), "and may ask again");
    assert!(!take(&mut b, ids[0]), "another claim is not handed it");
    assert_eq!(hint(&mut b, &q), ids[1], "claims now start past it");
    let got: Vec<i64> = held(&claim(&mut b, &q, 2, Some("1 hour"))).iter().map(|x| x.0).collect();
    assert_eq!(got, ids[1..].to_vec(), "a claim takes the rows after it, without waiting for it");

    a.batch_execute("ROLLBACK").unwrap();
    assert_eq!(hint(&mut b, &q), ids[0], "the rollback brings the hint back down");
    let got: Vec<i64> = held(&claim(&mut b, &q, 2, Some("1 hour"))).iter().map(|x| x.0).collect();
    assert_eq!(got, vec![ids[0]], "the row handed out and rolled back is claimed");
}

/// A claim asks `_take` only about the rows it goes on to lock: its pick reads the index in
/// order and stops at its LIMIT, whatever the session's planner settings (a plan that sorts
/// would ask about every ready row first, and the hint would pass them all).
#[test]
fn a_claim_is_handed_only_what_it_takes_whatever_the_planner_settings() {
    let _heavy = heavy();
    let db = ordering_db();
    let mut c = connect_to(&db);
    let q = unique_queue("ackc_plan");
    c.execute("SELECT pgqueue.pgq_create_queue($1)", &[&q]).unwrap();
    let ids = send_many(&mut c, &q, 200, "0");
    use_hints(&mut c, &q, true);
    c.batch_execute("SET enable_indexscan = off; SET enable_seqscan = off").unwrap();
    for (n, qty) in [(0usize, 1i32), (1, 3), (4, 1)] {
        let got: Vec<i64> = held(&claim(&mut c, &q, qty, Some("1 hour"))).iter().map(|x| x.0).collect();
        assert_eq!(got, ids[n..n + qty as usize].to_vec(), "claims go on in order");
        assert_eq!(hint(&mut c, &q), ids[n + qty as usize], "the hint passed only what was claimed");
    }
}
