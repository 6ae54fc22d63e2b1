//! What operators and consoles use (0.12.0): the jobs view, deleting dead letters, running a
//! schedule now, recording actions; and who may use each.

use crate::common::{Client, claim, count, new_queue, send, sqlstate, unique_queue};
use crate::connect;
use serde_json::{Value, json};

/// (state, finished) of each of `ids` in pgqueue.jobs.
fn jobs(c: &mut Client, ids: &[i64]) -> Vec<(String, bool)> {
    c.query("SELECT state, finished_at IS NOT NULL FROM pgqueue.jobs WHERE msg_id = ANY ($1) ORDER BY msg_id", &[&ids])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[test]
fn the_jobs_view_shows_every_message_waiting_or_finished() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let ids: Vec<i64> = (0..4).map(|i| send(&mut c, &q, json!({ "i": i }))).collect();
    let delayed: i64 = c.query_one("SELECT pgqueue.pgq_send($1, '{}', delay => '1 hour')", &[&q]).unwrap().get(0);
    let held = claim(&mut c, &q, 3, None);
    assert!(crate::common::ack(&mut c, &held[0]));
    c.execute("SELECT pgqueue.pgq_fail($1, $2, 'broken')", &[&held[1].id, &held[1].token]).unwrap();
    let mut all = ids.clone();
    all.push(delayed);
    assert_eq!(
        jobs(&mut c, &all),
        [("completed", true), ("dead", true), ("claimed", false), ("ready", false), ("delayed", false)]
            .map(|(s, f)| (s.to_string(), f))
    );
    let error: Option<String> =
        c.query_one("SELECT last_error FROM pgqueue.jobs WHERE msg_id = $1", &[&ids[1]]).unwrap().get(0);
    assert_eq!(error.as_deref(), Some("broken"));
    let payload: Value = c.query_one("SELECT payload FROM pgqueue.jobs WHERE msg_id = $1", &[&ids[3]]).unwrap().get(0);
    assert_eq!(payload, json!({ "i": 3 }));
    // No claim token to read.
    let columns: i64 = c
        .query_one(
            "SELECT count(*) FROM information_schema.columns
              WHERE table_schema = 'pgqueue' AND table_name = 'jobs' AND column_name = 'claim_token'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(columns, 0);
}

#[test]
fn dead_letters_can_be_deleted_one_by_one_or_all() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    for i in 0..3 {
        send(&mut c, &q, json!({ "i": i }));
    }
    let held = claim(&mut c, &q, 3, None);
    for m in &held[..2] {
        c.execute("SELECT pgqueue.pgq_fail($1, $2)", &[&m.id, &m.token]).unwrap();
    }
    assert!(crate::common::ack(&mut c, &held[2]));
    let dead =
        |c: &mut Client| count(c, "SELECT count(*) FROM pgqueue.history WHERE queue = $1 AND outcome = 'dead'", &q);
    // Only dead letters: a completed message's id or an unknown one deletes nothing.
    let n: i64 = c
        .query_one("SELECT pgqueue.pgq_delete_dead($1, ARRAY[$2::bigint, $3, -5])", &[&q, &held[0].id, &held[2].id])
        .unwrap()
        .get(0);
    assert_eq!((n, dead(&mut c)), (1, 1));
    let n: i64 = c.query_one("SELECT pgqueue.pgq_delete_dead($1)", &[&q]).unwrap().get(0);
    assert_eq!((n, dead(&mut c)), (1, 0));
    assert_eq!(
        count(&mut c, "SELECT count(*) FROM pgqueue.history WHERE queue = $1", &q),
        1,
        "the completed one stays"
    );
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_delete_dead('no_such_queue_here')", &[])), "42704");
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_delete_dead(NULL)", &[])), "22004");
}

#[test]
fn a_schedule_runs_now_without_moving_its_next_run() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let name = unique_queue("yearly");
    c.execute("SELECT pgqueue.pgq_schedule($1, $2, '0 0 1 1 *', '{\"report\": true}', paused => true)", &[&name, &q])
        .unwrap();
    let next = |c: &mut Client| -> String {
        c.query_one("SELECT next_run::text FROM pgqueue.schedules WHERE name = $1", &[&name]).unwrap().get(0)
    };
    let before = next(&mut c);
    let id: i64 = c.query_one("SELECT pgqueue.pgq_run_schedule($1)", &[&name]).unwrap().get(0);
    let row =
        c.query_one("SELECT payload, headers ->> 'schedule' FROM pgqueue.messages WHERE msg_id = $1", &[&id]).unwrap();
    assert_eq!((row.get::<_, Value>(0), row.get::<_, String>(1)), (json!({ "report": true }), name.clone()));
    assert_eq!(next(&mut c), before, "the next run stays where it was");
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_run_schedule('no_such_schedule')", &[])), "42704");
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_run_schedule(NULL)", &[])), "22004");
    c.execute("SELECT pgqueue.pgq_unschedule($1)", &[&name]).unwrap();
}

#[test]
fn actions_are_recorded_with_the_role_that_did_them() {
    let mut c = connect();
    let target = unique_queue("audited");
    let id: i64 = c
        .query_one(
            "SELECT pgqueue.pgq_audit('pause_queue', $1, '{\"why\": \"deploy\"}', console_user => 'alice')",
            &[&target],
        )
        .unwrap()
        .get(0);
    let row = c
        .query_one(
            "SELECT db_role, console_user, action, detail, at <= now() FROM pgqueue.audit_log WHERE action_id = $1",
            &[&id],
        )
        .unwrap();
    let role: String = c.query_one("SELECT session_user::text", &[]).unwrap().get(0);
    assert_eq!(row.get::<_, String>(0), role);
    assert_eq!(row.get::<_, Option<String>>(1).as_deref(), Some("alice"));
    assert_eq!(row.get::<_, String>(2), "pause_queue");
    assert_eq!(row.get::<_, Value>(3), json!({ "why": "deploy" }));
    assert!(row.get::<_, bool>(4));
    // Rolled back with the action it records, it records nothing.
    c.batch_execute(&format!("BEGIN; SELECT pgqueue.pgq_audit('redrive', '{target}'); ROLLBACK")).unwrap();
    assert_eq!(count(&mut c, "SELECT count(*) FROM pgqueue.audit_log WHERE target = $1", &target), 1);
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_audit(NULL)", &[])), "22004");
    assert_eq!(sqlstate(c.execute("SELECT pgqueue.pgq_audit('Drop Everything')", &[])), "22023");
}

/// Admins use all of it; a monitoring role reads rollups, the audit log and queue settings,
/// but no payload, and can act on nothing; PUBLIC nothing.
#[test]
fn admins_act_monitors_only_read_counts() {
    let mut c = connect();
    let q = new_queue(&mut c, "");
    let user = unique_queue("operator");
    c.batch_execute(&format!("CREATE ROLE {user} LOGIN")).unwrap();
    let as_role = |c: &mut Client, role: &str, sql: &str| crate::common::as_role(c, &user, role, sql);
    let reads = [
        "SELECT count(*) FROM pgqueue.queue_minutes".to_string(),
        "SELECT count(*) FROM pgqueue.audit_log".to_string(),
        "SELECT count(*) FROM pgqueue.queues".to_string(),
    ];
    let jobs = "SELECT count(*) FROM pgqueue.jobs".to_string();
    let keys = "SELECT count(*) FROM pgqueue.dedup_keys".to_string();
    let acts = [
        format!("SELECT pgqueue.pgq_delete_dead('{q}')"),
        format!("SELECT pgqueue.pgq_audit('redrive', '{q}')"),
        "SELECT pgqueue.pgq_run_schedule('none_such')".to_string(),
    ];
    for sql in reads.iter().chain([&jobs, &keys]) {
        as_role(&mut c, "pgqueue_admin", sql).unwrap();
    }
    as_role(&mut c, "pgqueue_admin", &acts[0]).unwrap();
    as_role(&mut c, "pgqueue_admin", &acts[1]).unwrap();
    assert_eq!(sqlstate(as_role(&mut c, "pgqueue_admin", &acts[2])), "42704", "allowed, and no such schedule");
    for sql in &reads {
        as_role(&mut c, "pg_monitor", sql).unwrap();
    }
    for sql in acts.iter().chain([&jobs, &keys]) {
        assert_eq!(sqlstate(as_role(&mut c, "pg_monitor", sql)), "42501", "pg_monitor: {sql}");
    }
    for sql in [
        "pgqueue.pgq_delete_dead(text, bigint[])",
        "pgqueue.pgq_run_schedule(text)",
        "pgqueue.pgq_audit(text, text, jsonb, text)",
    ] {
        let public: bool =
            c.query_one("SELECT has_function_privilege('public', $1, 'EXECUTE')", &[&sql]).unwrap().get(0);
        assert!(!public, "{sql}");
    }
    c.batch_execute(&format!("DROP ROLE {user}")).unwrap();
}
