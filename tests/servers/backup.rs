//! Backups: a pg_dump of a database using pgqueue restores into a new database of the same
//! server — plain format through psql with ON_ERROR_STOP, custom format through pg_restore
//! --exit-on-error, also with --jobs 2 — with everything pgqueue created: queues and their
//! settings, messages in every state, history in its day partitions, the msg_id sequence,
//! privileges granted to application roles, schedules and unique-job keys, minute rollups and
//! the audit log; and the worker
//! runs there afterwards, firing schedules.
//!
//! The restored schema and data are compared with the source's own dumps, so an object that
//! pgqueue starts creating one day and that does not survive a round trip fails here.

use crate::common;

use common::server::{bindir, this_major};
use common::{Client, ack_by, claim_one, connect, connect_to, history_of, message, outcome, wait_for, workers_only_in};
use std::process::Command;
use std::time::Duration;
use uuid::Uuid;

const LIMIT: Duration = Duration::from_secs(30);

/// Runs a client program of this major against the test cluster; fails the test unless it
/// succeeds. Returns its standard output.
fn client_program(c: &mut Client, program: &str, args: &[&str]) -> String {
    let row = c.query_one("SELECT current_setting('port'), current_user::text", &[]).unwrap();
    let (port, user): (String, String) = (row.get(0), row.get(1));
    let out = Command::new(bindir(this_major()).join(program))
        .args(["-h", "localhost", "-p", &port, "-U", &user])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A dump's text without the lines that differ between any two dumps (psql's per-dump
/// `\restrict` key).
fn normalized(dump: String) -> String {
    dump.lines()
        .filter(|l| !l.starts_with("\\restrict") && !l.starts_with("\\unrestrict"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn schema(c: &mut Client, db: &str) -> String {
    normalized(client_program(c, "pg_dump", &["--schema-only", "-d", db]))
}

fn data(c: &mut Client, db: &str) -> String {
    normalized(client_program(c, "pg_dump", &["--data-only", "-d", db]))
}

struct Source {
    db: String,
    /// (msg_id, token) of a claim with an hour's lease, of one with a lease that ends a few
    /// seconds after the fill, and of a session-bound one.
    long: (i64, Uuid),
    short: (i64, Uuid),
    bound: (i64, Uuid),
    /// (msg_id, token) of a claim whose cancel was requested, and a message cancelled while
    /// it waited.
    cancelling: (i64, Uuid),
    cancelled: i64,
    /// Queue `flow`: a parent waiting and its child pending after it (0.17.0).
    parent: i64,
    child: i64,
    /// Queue `hook`: a message parked on key 'pay:1', and one claimable; a signal of key
    /// 'pay:early' kept, sent before any park (0.18.0).
    parked: i64,
    unparked: i64,
    /// A message completed with a result (the long claim has reported progress).
    done: i64,
    /// A dead letter in a history partition two days old.
    old_dead: i64,
    last_id: i64,
    roles: [String; 2],
    /// Each unique-job key of queue `keyed` and the msg_id that holds it.
    keys: Vec<(&'static str, i64)>,
    /// The source's schedules and dedup_keys rows, as text, as they were dumped.
    schedules: Vec<String>,
    dedup_keys: Vec<String>,
    /// The session that holds the session-bound claim (alive while the source is dumped).
    _consumer: Client,
}

/// A session-bound claim (`session_bound => true`, which the kit's `claim` does not take):
/// it comes back when `c`'s backend ends.
fn claim_session_bound(c: &mut Client, q: &str) -> (i64, Uuid) {
    let r = c.query_one("SELECT msg_id, claim_token FROM pgqueue.pgq_claim($1, session_bound => true)", &[&q]).unwrap();
    (r.get(0), r.get(1))
}

/// A database with queues, messages in every state, history in two day partitions,
/// privileges granted to two application roles, schedules and unique-job keys.
fn fill(c: &mut Client) -> Source {
    let db = common::unique_queue("backup_src");
    let roles = [format!("{db}_producer"), format!("{db}_ops")];
    c.batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
    c.batch_execute(&format!(
        "CREATE ROLE {} LOGIN IN ROLE pgqueue_producer; CREATE ROLE {} LOGIN",
        roles[0], roles[1]
    ))
    .unwrap();
    let mut s = connect_to(&db);
    s.batch_execute(&format!(
        "CREATE EXTENSION pgqueue;
         -- privileges changed on the extension's own objects
         GRANT USAGE ON SCHEMA pgqueue TO {o};
         GRANT SELECT ON pgqueue.queue_stats TO {o};
         GRANT EXECUTE ON FUNCTION pgqueue.pgq_redrive(text, bigint[]) TO {o};
         SELECT pgqueue.pgq_create_queue('jobs', lease => '1 hour', max_attempts => 3, retention => '10 days');
         SELECT pgqueue.pgq_create_queue('parked', paused => true, retention => '3 days');
         SELECT pgqueue.pgq_create_queue('q{long}');
         SELECT pgqueue.pgq_send('jobs', jsonb_build_object('n', g), priority => (g % 3)::smallint)
           FROM generate_series(1, 20) g;
         SELECT pgqueue.pgq_send('jobs', '{{\"later\": true}}', delay => '1 hour');
         SELECT pgqueue.pgq_send('parked', '{{}}', headers => '{{\"h\": 1}}');
         SELECT pgqueue.pgq_send('q{long}', '{{}}');",
        o = roles[1],
        long = "x".repeat(39)
    ))
    .unwrap();
    // Completed and dead messages today; a dead letter and completed ones two days ago.
    let done = claim_one(&mut s, "jobs", None).held();
    s.execute("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid, result => '{\"rows\": 7}')", &[&done.0, &done.1]).unwrap();
    let dead = claim_one(&mut s, "jobs", None).held();
    s.execute("SELECT pgqueue.pgq_fail($1, $2, error => 'bad input')", &[&dead.0, &dead.1]).unwrap();
    s.batch_execute(
        "SELECT pgqueue._ensure_history_day('jobs', current_date - 2);
         INSERT INTO pgqueue.history (msg_id, queue, outcome, priority, attempt, payload, enqueued_at, finished_at, last_error)
         SELECT -g, 'jobs', CASE WHEN g = 1 THEN 'dead' ELSE 'completed' END, 0, 1, '{}',
                now() - interval '3 days', current_date - 2 + interval '1 hour', CASE WHEN g = 1 THEN 'old failure' END
           FROM generate_series(1, 5) g",
    )
    .unwrap();
    let long = claim_one(&mut s, "jobs", None).held();
    // What 0.16.0 adds: progress and a result (above).
    s.execute("SELECT pgqueue.pgq_renew($1::bigint, $2::uuid, progress => '{\"step\": 2}')", &[&long.0, &long.1])
        .unwrap();
    let short = claim_one(&mut s, "jobs", Some("3 s")).held();
    // What 0.15.0 adds: a running job whose cancel was requested, and one cancelled waiting.
    let cancelling = claim_one(&mut s, "jobs", None).held();
    let cancelled: i64 = s.query_one("SELECT pgqueue.pgq_send('jobs', '{}')", &[]).unwrap().get(0);
    s.query("SELECT pgqueue.pgq_cancel(ARRAY[$1, $2]::bigint[], reason => 'stop')", &[&cancelling.0, &cancelled])
        .unwrap();
    // What 0.17.0 adds: a child pending on its parent.
    s.batch_execute("SELECT pgqueue.pgq_create_queue('flow')").unwrap();
    let parent: i64 = s.query_one("SELECT pgqueue.pgq_send('flow', '{}')", &[]).unwrap().get(0);
    let child: i64 = s
        .query_one(
            "SELECT pgqueue.pgq_send('flow', '{}', after => ARRAY[$1::bigint], on_parent_failure => 'dead')",
            &[&parent],
        )
        .unwrap()
        .get(0);
    // What 0.18.0 adds: a parked message, and a signal kept for a park to come.
    s.batch_execute("SELECT pgqueue.pgq_create_queue('hook')").unwrap();
    let parked: i64 = s.query_one("SELECT pgqueue.pgq_send('hook', '{}')", &[]).unwrap().get(0);
    let (id, token) = claim_one(&mut s, "hook", None).held();
    assert_eq!(id, parked);
    let was_parked: bool = s
        .query_one("SELECT pgqueue.pgq_park($1, $2, 'pay:1', '1 hour', payload => '{\"step\": 1}')", &[&id, &token])
        .unwrap()
        .get(0);
    assert!(was_parked);
    let unparked: i64 = s.query_one("SELECT pgqueue.pgq_send('hook', '{}')", &[]).unwrap().get(0);
    s.batch_execute("SELECT pgqueue.pgq_signal('pay:early', '{\"paid\": true}')").unwrap();
    let mut consumer = connect_to(&db);
    let bound = claim_session_bound(&mut consumer, "jobs");
    let keys = fill_schedules_and_keys(&mut s);
    // What 0.12.0 adds: a minute rollup (its foreign key makes the restore load queues
    // first) and an operator's recorded action.
    s.batch_execute(
        "INSERT INTO pgqueue.queue_minutes (queue, minute, sent, completed, ready)
         VALUES ('jobs', date_trunc('minute', now()) - interval '5 minutes', 7, 5, 2);
         SELECT pgqueue.pgq_audit('redrive', 'jobs', '{\"msg_ids\": [1]}', console_user => 'alice');",
    )
    .unwrap();
    let last_id: i64 = s.query_one("SELECT last_value FROM pgqueue.messages_msg_id_seq", &[]).unwrap().get(0);
    let (schedules, dedup_keys) = (rows(&mut s, "schedules", "name"), rows(&mut s, "dedup_keys", "queue, dedup_key"));
    assert_eq!((schedules.len(), dedup_keys.len()), (2, 4), "the source has its schedules and keys");
    Source {
        db,
        long,
        short,
        bound,
        cancelling,
        cancelled,
        parent,
        child,
        parked,
        unparked,
        done: done.0,
        old_dead: -1,
        last_id,
        roles,
        keys,
        schedules,
        dedup_keys,
        _consumer: consumer,
    }
}

/// What 0.4.0 adds. Two schedules, neither of which fires before the checks (the source has
/// no worker while it is dumped): a monthly one in a zone with daylight saving, with headers,
/// catching up, its next run in the future; and one every second, paused (resumed in each
/// restored database, whose worker must then fire it). Unique-job keys of messages waiting,
/// delayed, claimed, and of one acked whose key is kept for an hour. Returns (key, holder).
fn fill_schedules_and_keys(s: &mut Client) -> Vec<(&'static str, i64)> {
    s.batch_execute(
        "SELECT pgqueue.pgq_create_queue('keyed');
         SELECT pgqueue.pgq_create_queue('ticks');
         SELECT pgqueue.pgq_schedule('monthly', 'ticks', '0 3 1 * *', '{\"report\": \"monthly\"}',
                                     time_zone => 'Europe/Berlin', priority => 2::smallint,
                                     headers => '{\"origin\": \"cron\"}', missed => 'catch_up', grace => '10 min');
         SELECT pgqueue.pgq_schedule('every_second', 'ticks', '* * * * * *', paused => true);",
    )
    .unwrap();
    let mut send = |key: &str, extra: &str| -> i64 {
        s.query_one(&format!("SELECT pgqueue.pgq_send('keyed', '{{}}', dedup_key => $1{extra})"), &[&key])
            .unwrap()
            .get(0)
    };
    let kept = send("kept", ", dedup_for => '1 hour'");
    let claimed = send("claimed", "");
    let waiting = send("waiting", "");
    let delayed = send("delayed", ", delay => '1 hour'");
    let done = claim_one(s, "keyed", None).held();
    assert_eq!(done.0, kept);
    ack_by(s, done.0, done.1);
    assert_eq!(claim_one(s, "keyed", Some("1 hour")).id, claimed);
    vec![("kept", kept), ("claimed", claimed), ("waiting", waiting), ("delayed", delayed)]
}

/// Every row of a pgqueue table as text, in `order`.
fn rows(c: &mut Client, table: &str, order: &str) -> Vec<String> {
    c.query(&format!("SELECT t::text FROM pgqueue.{table} t ORDER BY {order}"), &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[test]
fn dumps_restore_into_a_new_database_with_everything_pgqueue_made() {
    let _turn = common::file_turn(file!());
    let mut c = connect();
    let test_db: String = c.query_one("SELECT current_database()::text", &[]).unwrap().get(0);
    // Phase 1, with no worker in the source or the copies: each restored copy must equal the
    // source exactly, schema and data.
    workers_only_in(&mut c, Some(&test_db));
    let src = fill(&mut c);
    let dir = std::env::temp_dir().join(format!("pgqueue-backup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (plain, custom) = (dir.join("dump.sql"), dir.join("dump.custom"));
    client_program(&mut c, "pg_dump", &["-d", &src.db, "-f", plain.to_str().unwrap()]);
    client_program(&mut c, "pg_dump", &["-Fc", "-d", &src.db, "-f", custom.to_str().unwrap()]);
    let (src_schema, src_data) = (schema(&mut c, &src.db), data(&mut c, &src.db));
    assert!(src_schema.contains("history_jobs$default"), "the runtime partitions are in the dump");

    let restores: [(&str, Vec<&str>); 3] = [
        ("psql", vec!["-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", plain.to_str().unwrap()]),
        ("pg_restore", vec!["--exit-on-error", custom.to_str().unwrap()]),
        ("pg_restore", vec!["--exit-on-error", "--jobs", "2", custom.to_str().unwrap()]),
    ];
    let mut copies = vec![];
    for (i, (program, args)) in restores.iter().enumerate() {
        let db = format!("{}_copy{i}", src.db);
        c.batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
        let mut all = vec!["-d", db.as_str()];
        all.extend(args);
        client_program(&mut c, program, &all);
        assert_eq!(schema(&mut c, &db), src_schema, "{program} {args:?}: the restored schema");
        assert_eq!(data(&mut c, &db), src_data, "{program} {args:?}: the restored data");
        copies.push(db);
    }

    // Phase 2: workers everywhere again. A restore with the worker already running in the
    // new database (it starts as soon as CREATE EXTENSION is restored) succeeds as well.
    workers_only_in(&mut c, None);
    let db = format!("{}_live", src.db);
    c.batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
    client_program(&mut c, "pg_restore", &["--exit-on-error", "--jobs", "2", "-d", &db, custom.to_str().unwrap()]);
    assert_eq!(schema(&mut c, &db), src_schema, "restored while its worker ran");
    copies.push(db);

    // The source stays, its consumer session holding the session-bound claim.
    for db in copies.iter().chain([&src.db]) {
        if db != &src.db {
            check_restored(&src, db);
        }
        c.batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)")).unwrap();
    }
    c.batch_execute(&format!("DROP ROLE {}; DROP ROLE {}", src.roles[0], src.roles[1])).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a user of the restored database sees once its worker runs.
fn check_restored(src: &Source, db: &str) {
    let mut r = connect_to(db);
    // The worker runs there.
    wait_for("the worker ticking in the restored database", LIMIT, || {
        let ticks: i64 = r.query_one("SELECT ticks FROM pgqueue.worker_state", &[]).unwrap().get(0);
        (ticks > 0).then_some(())
    });
    // Everything came across: 22 sent to jobs (one acked, one failed, one cancelled), 3 keyed
    // waiting or claimed, 1 each elsewhere, 8 in history (5 two days old).
    let counts: Vec<(String, i64)> = r
        .query("SELECT queue, count(*) FROM pgqueue.messages GROUP BY 1 ORDER BY 1", &[])
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let long = format!("q{}", "x".repeat(39));
    assert_eq!(
        counts,
        vec![
            ("flow".into(), 2),
            ("hook".into(), 2),
            ("jobs".into(), 19),
            ("keyed".into(), 3),
            ("parked".into(), 1),
            (long, 1)
        ],
        "{db}"
    );
    let history: i64 = r.query_one("SELECT count(*) FROM pgqueue.history WHERE queue = 'jobs'", &[]).unwrap().get(0);
    assert_eq!(history, 8, "{db}");
    assert_eq!(outcome(&mut r, src.cancelled).as_deref(), Some("cancelled"), "{db}");
    let q: (String, bool, i32) = {
        let row = r
            .query_one("SELECT lease::text, paused, max_attempts FROM pgqueue.queues WHERE queue = 'parked'", &[])
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    };
    assert_eq!(q, ("00:02:00".into(), true, 5), "{db}: queue settings");

    // Claims: the session-bound one comes back at once (its session is not in this
    // database), the short lease when it ends (its attempt counted), the long one stays and
    // its consumer can still finish it.
    wait_for("the session-bound claim back", LIMIT, || {
        (message(&mut r, src.bound.0).map(|m| (m.state, m.attempt)) == Some(("ready".into(), 1))).then_some(())
    });
    wait_for("the short lease's claim back after its lease", LIMIT, || {
        (message(&mut r, src.short.0).map(|m| (m.state, m.attempt)) == Some(("ready".into(), 1))).then_some(())
    });
    assert_eq!(message(&mut r, src.long.0).map(|m| (m.state, m.attempt)), Some(("claimed".into(), 1)), "{db}");
    let reported = |r: &mut Client, id: i64| -> (String, Option<String>, Option<String>) {
        let row =
            r.query_one("SELECT state, result::text, progress::text FROM pgqueue.pgq_result($1)", &[&id]).unwrap();
        (row.get(0), row.get(1), row.get(2))
    };
    assert_eq!(reported(&mut r, src.long.0), ("claimed".into(), None, Some(r#"{"step": 2}"#.into())), "{db}");
    assert_eq!(reported(&mut r, src.done), ("completed".into(), Some(r#"{"rows": 7}"#.into()), None), "{db}");
    let acked: bool =
        r.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&src.long.0, &src.long.1]).unwrap().get(0);
    assert!(acked, "{db}: the long claim's token still acks it");
    // The requested cancel came across: renewals leave it out, its fail records the cancel.
    let (id, token) = src.cancelling;
    let renewed: bool = r.query_one("SELECT pgqueue.pgq_renew($1::bigint, $2::uuid)", &[&id, &token]).unwrap().get(0);
    assert!(!renewed, "{db}: a claim whose cancel was requested is not renewed");
    let failed: bool = r.query_one("SELECT pgqueue.pgq_fail($1, $2)", &[&id, &token]).unwrap().get(0);
    assert!(failed, "{db}");
    assert_eq!(history_of(&mut r, id)[0].result(), ("cancelled", 1, Some("stop")), "{db}");
    // The child still waits for its parent, and runs once it completed.
    let graph: Vec<(String, i64, String)> = r
        .query("SELECT relation, id, state FROM pgqueue.pgq_graph($1)", &[&src.child])
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    assert_eq!(
        graph,
        vec![("message".into(), src.child, "pending".into()), ("parent".into(), src.parent, "ready".into())],
        "{db}"
    );
    let (p, token) = claim_one(&mut r, "flow", None).held();
    assert_eq!(p, src.parent, "{db}: only the parent is claimable");
    let acked: bool = r.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&p, &token]).unwrap().get(0);
    assert!(acked);
    assert_eq!(message(&mut r, src.child).map(|m| m.state).as_deref(), Some("ready"), "{db}");
    // The parked message still waits for its key's signal, and the kept signal resumes the
    // park that comes after it.
    assert_eq!(message(&mut r, src.parked).map(|m| m.state).as_deref(), Some("parked"), "{db}");
    let resumed: i64 = r.query_one("SELECT pgqueue.pgq_signal('pay:1', '{\"ok\": 1}')", &[]).unwrap().get(0);
    assert_eq!(resumed, 1, "{db}");
    let (id, token) = claim_one(&mut r, "hook", None).held();
    assert_eq!(id, src.parked, "{db}: resumed, and first in the queue");
    let park = |r: &mut Client, id: i64, token: Uuid| -> bool {
        r.query_one("SELECT pgqueue.pgq_park($1, $2, 'pay:early', '1 hour')", &[&id, &token]).unwrap().get(0)
    };
    let (other, other_token) = claim_one(&mut r, "hook", None).held();
    assert_eq!(other, src.unparked, "{db}");
    assert!(park(&mut r, other, other_token), "{db}");
    let headers: String = r
        .query_one(
            "SELECT headers->'pgq_park'->>'signal' FROM pgqueue.messages WHERE msg_id = $1 AND state = 'ready'",
            &[&other],
        )
        .unwrap()
        .get(0);
    assert_eq!(headers, r#"{"paid": true}"#, "{db}: the kept signal came across");
    let signal: String = r
        .query_one("SELECT headers->'pgq_park'->>'signal' FROM pgqueue.messages WHERE msg_id = $1", &[&id])
        .unwrap()
        .get(0);
    assert_eq!(signal, r#"{"ok": 1}"#, "{db}");
    let acked: bool = r.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&id, &token]).unwrap().get(0);
    assert!(acked, "{db}");

    // New sends continue past every restored id, also as the application's producer role.
    let mut producer = common::connect_as(&src.roles[0], db);
    let id: i64 = producer.query_one("SELECT pgqueue.pgq_send('jobs', '{}')", &[]).unwrap().get(0);
    assert!(id > src.last_id, "{db}: new id {id} after the restored {}", src.last_id);
    // The grants on pgqueue's objects came along.
    let mut ops = common::connect_as(&src.roles[1], db);
    let ready: i64 = ops.query_one("SELECT ready FROM pgqueue.queue_stats WHERE queue = 'parked'", &[]).unwrap().get(0);
    assert_eq!(ready, 1);
    let back: i64 =
        ops.query_one("SELECT pgqueue.pgq_redrive('jobs', ARRAY[$1::bigint])", &[&src.old_dead]).unwrap().get(0);
    assert_eq!(back, 1, "{db}: the old dead letter is redriven from its restored partition");
    assert_eq!(
        common::sqlstate(producer.query_one("SELECT pgqueue.pgq_redrive('jobs')", &[])),
        "42501",
        "and nothing more than was granted"
    );
    check_schedules_and_keys(src, db, &mut r);
}

/// Schedules and unique-job keys came across as they were, keys still hold (also the one
/// kept after its message finished), and the restored worker fires a resumed schedule.
fn check_schedules_and_keys(src: &Source, db: &str, r: &mut Client) {
    assert_eq!(rows(r, "schedules", "name"), src.schedules, "{db}: the schedules");
    assert_eq!(rows(r, "dedup_keys", "queue, dedup_key"), src.dedup_keys, "{db}: the unique-job keys");
    for (key, holder) in &src.keys {
        let id: i64 = r.query_one("SELECT pgqueue.pgq_send('keyed', '{}', dedup_key => $1)", &[key]).unwrap().get(0);
        assert_eq!(id, *holder, "{db}: a send with key {key} returns its restored holder");
    }
    let keyed: i64 = r.query_one("SELECT count(*) FROM pgqueue.messages WHERE queue = 'keyed'", &[]).unwrap().get(0);
    assert_eq!(keyed, 3, "{db}: and enqueues nothing");

    r.execute("SELECT pgqueue.pgq_resume_schedule('every_second')", &[]).unwrap();
    wait_for("the restored worker firing the resumed schedule", LIMIT, || {
        let fired: i64 = r
            .query_one(
                "SELECT count(*) FROM pgqueue.messages WHERE queue = 'ticks' AND headers->>'schedule' = 'every_second'",
                &[],
            )
            .unwrap()
            .get(0);
        (fired > 0).then_some(())
    });
}
