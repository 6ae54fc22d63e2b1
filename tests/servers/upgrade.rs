//! Upgrades: `ALTER EXTENSION pgqueue UPDATE` from the previous release gives the schema of
//! a fresh install and keeps every row; pg_upgrade from PostgreSQL 17 to 18 keeps the queues
//! and the worker runs after it.

use crate::common;

use common::server::{bindir, this_major};
use common::{Client, connect, connect_to, connect_to_with_notices, wait_for, workers_only_in};
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(30);

/// Queues, messages in every state (ready at several priorities, delayed, claimed, claimed
/// with a lease that ends at once), history today and in a partition two days old, with a
/// dead letter in each. Returns the claim that stays live: (msg_id, token).
fn fill(c: &mut Client) -> (i64, uuid::Uuid) {
    c.batch_execute(
        "SELECT pgqueue.pgq_create_queue('jobs', lease => '1 hour', max_attempts => 2, retention => '10 days');
         SELECT pgqueue.pgq_create_queue('parked', paused => true);
         SELECT pgqueue.pgq_send('jobs', jsonb_build_object('n', g), priority => (g % 3)::smallint)
           FROM generate_series(1, 10) g;
         SELECT pgqueue.pgq_send('jobs', '{}', delay => '1 hour');
         SELECT pgqueue.pgq_send('parked', '{}', headers => '{\"h\": 1}');
         SELECT pgqueue._ensure_history_day('jobs', current_date - 2);
         INSERT INTO pgqueue.history (msg_id, queue, outcome, priority, attempt, payload, enqueued_at, finished_at)
         SELECT -g, 'jobs', CASE WHEN g = 1 THEN 'dead' ELSE 'completed' END, 0, 1, '{}',
                now() - interval '3 days', current_date - 2 + interval '1 hour'
           FROM generate_series(1, 3) g;",
    )
    .unwrap();
    let claim = |c: &mut Client, lease: &str| -> (i64, uuid::Uuid) {
        let r = c
            .query_one(
                "SELECT msg_id, claim_token FROM pgqueue.pgq_claim('jobs', lease => $1::text::interval)",
                &[&lease],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    let done = claim(c, "1 hour");
    c.execute("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&done.0, &done.1]).unwrap();
    let dead = claim(c, "1 hour");
    c.execute("SELECT pgqueue.pgq_fail($1, $2, error => 'bad')", &[&dead.0, &dead.1]).unwrap();
    claim(c, "100 ms"); // expires at once: the worker re-arms it
    claim(c, "1 hour")
}

/// Every row pgqueue keeps, as JSON, and the sequence's position.
fn rows(c: &mut Client) -> Vec<String> {
    [
        "SELECT json_agg(t ORDER BY queue)::text FROM pgqueue.queues t",
        "SELECT json_agg(to_jsonb(t) - ARRAY['dedup_key', 'cancel_requested_at', 'progress', 'after', 'has_dependents', 'park_key',
                                        'park_until', 'claims_ended'] ORDER BY msg_id)::text
           FROM pgqueue.messages t",
        "SELECT json_agg(to_jsonb(t) - ARRAY['result', 'progress', 'after'] ORDER BY queue, finished_at, msg_id)::text
           FROM pgqueue.history t",
        "SELECT json_agg(t ORDER BY queue)::text FROM pgqueue.prune_state t",
        // Columns added by later releases are left out (they start at their defaults).
        "SELECT json_agg(to_jsonb(t) - ARRAY['reconcile_failures', 'hint_corrections', 'schedule_failures',
                'keys_failures', 'scheduled_runs', 'missed_runs', 'schedule_errors', 'keys_expired',
                'rollup_failures', 'last_rollup_at', 'dependency_failures', 'released', 'park_failures',
                'park_timeouts', 'claims_failures', 'claims_pruned'])::text
           FROM pgqueue.worker_state t",
        "SELECT last_value::text FROM pgqueue.messages_msg_id_seq",
    ]
    .iter()
    .map(|q| c.query_one(*q, &[]).unwrap().get::<_, Option<String>>(0).unwrap_or_default())
    .collect()
}

/// `pg_dump --schema-only --binary-upgrade` (which, unlike a plain dump, shows the members of
/// the extension) of the test cluster's `db`, without what differs between any two
/// databases (object ids) and without the `tests` schema that test builds add.
fn schema(c: &mut Client, db: &str) -> String {
    let row = c.query_one("SELECT current_setting('port'), current_user::text", &[]).unwrap();
    let (port, user): (String, String) = (row.get(0), row.get(1));
    let out = Command::new(bindir(this_major()).join("pg_dump"))
        .args(["-h", "localhost", "-p", &port, "-U", &user, "--schema-only", "--binary-upgrade", "-d", db])
        .output()
        .unwrap();
    assert!(out.status.success(), "pg_dump: {}", String::from_utf8_lossy(&out.stderr));
    let mut dump = String::from_utf8(out.stdout).unwrap();
    // A column an update added with a default keeps it as the older rows' "missing value" (no
    // rewrite): storage, not schema. pg_dump adds each as "\n-- set missing value.\n…);\n\n".
    while let Some(start) = dump.find("\n-- set missing value.\n") {
        let end = start + dump[start..].find(");\n\n").expect("the call's end") + 4;
        dump.replace_range(start..end, "");
    }
    let mut kept = vec![];
    // Entries start with a "-- Name: …; Type: …; Schema: …" header.
    for entry in dump.split("\n--\n-- Name: ") {
        let header = entry.lines().next().unwrap_or_default();
        if header.contains("; Schema: tests;") || header.starts_with("tests; Type: SCHEMA") {
            continue;
        }
        let lines = entry.lines().filter(|l| {
            !l.contains("binary_upgrade")
                && !l.starts_with("-- For binary upgrade")
                // the relfrozenxid and relminmxid of each table, by object id
                && !l.starts_with("UPDATE pg_catalog.pg_class")
                && !l.starts_with("SET relfrozenxid")
                && !l.starts_with("WHERE oid = ")
                && !l.starts_with("\\restrict")
                && !l.starts_with("\\unrestrict")
                && !l.contains(" tests.")
                && !l.starts_with("SELECT pg_catalog.setval(")
        });
        kept.push(lines.collect::<Vec<_>>().join("\n"));
    }
    kept.join("\n-- entry: ")
}

#[test]
fn alter_extension_update_from_0_1_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.1.0");
}

#[test]
fn alter_extension_update_from_0_2_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.2.0");
}

#[test]
fn alter_extension_update_from_0_3_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.3.0");
}

#[test]
fn alter_extension_update_from_0_4_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.4.0");
}

#[test]
fn alter_extension_update_from_0_5_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.5.0");
}

#[test]
fn alter_extension_update_from_0_6_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.6.0");
}

#[test]
fn alter_extension_update_from_0_7_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.7.0");
}

#[test]
fn alter_extension_update_from_0_8_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.8.0");
}

#[test]
fn alter_extension_update_from_0_9_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.9.0");
}

#[test]
fn alter_extension_update_from_0_10_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.10.0");
}

#[test]
fn alter_extension_update_from_0_11_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.11.0");
}

#[test]
fn alter_extension_update_from_0_12_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.12.0");
}

#[test]
fn alter_extension_update_from_0_13_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.13.0");
}

#[test]
fn alter_extension_update_from_0_14_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.14.0");
}

#[test]
fn alter_extension_update_from_0_15_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.15.0");
}

#[test]
fn alter_extension_update_from_0_16_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.16.0");
}

#[test]
fn alter_extension_update_from_0_17_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.17.0");
}

#[test]
fn alter_extension_update_from_0_18_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.18.0");
}

#[test]
fn alter_extension_update_from_0_19_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.19.0");
}

#[test]
fn alter_extension_update_from_0_19_1_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.19.1");
}

#[test]
fn alter_extension_update_from_0_20_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.20.0");
}

#[test]
fn alter_extension_update_from_0_21_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.21.0");
}

#[test]
fn alter_extension_update_from_0_22_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.22.0");
}

#[test]
fn alter_extension_update_from_0_23_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.23.0");
}

#[test]
fn alter_extension_update_from_0_24_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.24.0");
}

#[test]
fn alter_extension_update_from_0_24_1_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.24.1");
}

#[test]
fn alter_extension_update_from_0_24_2_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.24.2");
}

#[test]
fn alter_extension_update_from_0_25_0_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.25.0");
}

#[test]
fn alter_extension_update_from_0_25_1_equals_a_fresh_install() {
    let _turn = common::file_turn(file!());
    update_from("0.25.1");
}

/// 0.21.0's claim ledger numbered a message's claims by its attempt, which a park that resumes
/// at once gives back. The update carries the claims in flight under the ledger's tokens over
/// (they ack after it) and drops the entries the rows no longer hold, which the new count
/// would take for live: a stale token of such a claim is refused quietly after it, not with
/// XX000. The claims here are made as 0.21.0's library made them (this build's library claims
/// with random tokens on 0.21.0's SQL), in one transaction with the update, so that no tick
/// prunes the ledger before it.
#[test]
fn an_update_from_0_21_0_carries_over_the_claims_held_under_the_ledgers_tokens() {
    let _turn = common::file_turn(file!());
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = connect();
    let db = common::unique_queue("ledger021");
    c.batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
    let mut u = connect_to(&db);
    u.batch_execute(
        "CREATE EXTENSION pgqueue VERSION '0.21.0';
         SELECT pgqueue.pgq_create_queue('jobs', lease => '1 hour');
         SELECT pgqueue.pgq_send('jobs', jsonb_build_object('n', g)) FROM generate_series(1, 4) g;
         SELECT pgqueue.pgq_signal('resume', keep => '1 hour');",
    )
    .unwrap();
    let mut tx = u.transaction().unwrap();
    // As 0.21.0's claim did: a ledger row of the call's messages at their attempts, and tokens
    // signed for them.
    let as_0_21 = |tx: &mut postgres::Transaction, qty: i32| -> Vec<(i64, uuid::Uuid)> {
        let ids: Vec<i64> = tx
            .query("SELECT msg_id FROM pgqueue.pgq_claim('jobs', qty => $1)", &[&qty])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        tx.query(
            "WITH ledger AS (
                 INSERT INTO pgqueue.claims (queue, msg_ids, attempts, claimed_at)
                 SELECT 'jobs', array_agg(m.msg_id ORDER BY m.msg_id), array_agg(m.attempt ORDER BY m.msg_id), now()
                   FROM pgqueue.messages m WHERE m.msg_id = ANY ($1)
                 RETURNING claim_id)
             UPDATE pgqueue.message_rows m
                SET claim_token = pgqueue._claim_token((SELECT key FROM pgqueue.claim_key ORDER BY made_at, key LIMIT 1),
                                                       l.claim_id, m.msg_id, m.attempt)
               FROM ledger l WHERE m.msg_id = ANY ($1)
             RETURNING m.msg_id, m.claim_token",
            &[&ids],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
    };
    // Before the update, this library acks such a token as 0.21.0 did (finish.rs on 0.21.0's
    // tables).
    let early = as_0_21(&mut tx, 1)[0];
    let acked: bool =
        tx.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&early.0, &early.1]).unwrap().get(0);
    assert!(acked, "a 0.21.0 ledger token acks on 0.21.0's SQL");
    let mut two = as_0_21(&mut tx, 2);
    two.sort();
    let parked = as_0_21(&mut tx, 1)[0];
    let resumed: bool =
        tx.query_one("SELECT pgqueue.pgq_park($1, $2, 'resume', '1 hour')", &[&parked.0, &parked.1]).unwrap().get(0);
    assert!(resumed, "resumed at once: its attempt given back");
    let again = as_0_21(&mut tx, 1)[0];
    assert_eq!(again.0, parked.0);
    let ledger_rows = |tx: &mut postgres::Transaction| -> i64 {
        tx.query_one("SELECT count(*) FROM pgqueue.claims", &[]).unwrap().get(0)
    };
    assert_eq!(ledger_rows(&mut tx), 4, "the acked and the parked claims' rows are still there");
    tx.batch_execute("ALTER EXTENSION pgqueue UPDATE").unwrap();
    assert_eq!(ledger_rows(&mut tx), 2, "the acked and the parked claims' rows are dropped");
    assert!(common::ledger_disagreements(&mut tx, &["jobs"]).is_empty());
    tx.commit().unwrap();

    let ack = |u: &mut Client, (id, token): (i64, uuid::Uuid)| -> bool {
        u.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&id, &token]).unwrap().get(0)
    };
    assert!(!ack(&mut u, parked), "the parked claim's token is refused, quietly");
    for held in two.into_iter().chain([again]) {
        assert!(ack(&mut u, held), "a claim held under the ledger's token acks after the update");
    }
    u.batch_execute("SET pgqueue.claim_ledger = on").unwrap();
    assert!(common::ledger_disagreements(&mut u, &["jobs"]).is_empty());
    drop(u);
    c.batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)")).unwrap();
}

/// Updates quiet the workers of the whole cluster for a while: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// 0.9.0 -> 0.10.0 moves each running schedule's next run to the first time by Debian cron's
/// rules, from where it stood (a due one stays due), and names the moved ones in a WARNING.
#[test]
fn the_update_from_0_9_0_moves_next_runs_to_debian_crons_times() {
    let _turn = common::file_turn(file!());
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = connect();
    let test_db: String = c.query_one("SELECT current_database()::text", &[]).unwrap().get(0);
    let db = common::unique_queue("cronupdate");
    c.batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
    // No worker there: it would fire the due schedule.
    workers_only_in(&mut c, Some(&test_db));
    let notices = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
    let mut u = connect_to_with_notices(&db, notices.clone());
    // Next runs as 0.9.0's library computed them (this build's would already give the new ones).
    u.batch_execute(
        "CREATE EXTENSION pgqueue VERSION '0.9.0';
         SELECT pgqueue.pgq_create_queue('jobs');
         SELECT pgqueue.pgq_schedule('due', 'jobs', '11-34 * */15 * MON-FRI', time_zone => 'Europe/Berlin');
         SELECT pgqueue.pgq_schedule('ahead', 'jobs', '20 23 27 * */2', time_zone => 'America/New_York');
         SELECT pgqueue.pgq_schedule('same', 'jobs', '*/5 * * * *');
         SELECT pgqueue.pgq_schedule('paused', 'jobs', '11-34 * */15 * MON-FRI', paused => true);
         SELECT pgqueue.pgq_schedule('list', 'jobs', '0,30 2 * * *', time_zone => 'Europe/Berlin');
         -- Monday the 15th: no 15-step day. Due, the last run before it.
         UPDATE pgqueue.schedules SET next_run = '2026-06-15 00:11 Europe/Berlin',
                last_run = '2026-06-01 00:34 Europe/Berlin' WHERE name = 'due';
         -- A Tuesday, not the 27th, in the future.
         UPDATE pgqueue.schedules SET next_run = '2027-11-30 23:20 America/New_York' WHERE name = 'ahead';
         UPDATE pgqueue.schedules SET next_run = '2030-01-01 00:00+00' WHERE name = 'paused';",
    )
    .unwrap();
    let next_runs = |u: &mut Client| -> Vec<(String, Option<String>)> {
        u.query("SELECT name, (next_run AT TIME ZONE 'UTC')::text FROM pgqueue.schedules ORDER BY name", &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    };
    // docs/schedules.md's query for the schedules whose meaning changes, run on 0.9.0.
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/schedules.md")).unwrap();
    let query = doc
        .split("```sql\n")
        .map(|b| b.split("```").next().unwrap())
        .find(|b| b.contains("regexp_split_to_array"))
        .expect("the query in docs/schedules.md");
    let mut flagged: Vec<String> = u.query(query, &[]).unwrap().iter().map(|r| r.get(0)).collect();
    flagged.sort();
    assert_eq!(flagged, ["ahead", "due", "list", "paused"], "what docs/schedules.md's query finds");
    // Before the update, 0.9.0's SQL already computes by this library's (the new) rules.
    let first: String = u
        .query_one(
            "SELECT (t AT TIME ZONE 'UTC')::text
               FROM pgqueue.pgq_cron_next('11-34 * */15 * MON-FRI', 'Europe/Berlin', '2027-03-14 03:00+00') t",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(first, "2027-03-15 23:11:00", "Tuesday the 16th, 00:11 CET");
    let before = next_runs(&mut u);
    u.batch_execute("ALTER EXTENSION pgqueue UPDATE TO '0.10.0'").unwrap();
    let after = next_runs(&mut u);
    let same_before = before.iter().find(|(n, _)| n == "same").unwrap().clone();
    let expected_ahead: String = u
        .query_one(
            "SELECT (t AT TIME ZONE 'UTC')::text FROM pgqueue.pgq_cron_next('20 23 27 * */2', 'America/New_York', now()) t",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        after,
        [
            ("ahead".to_string(), Some(expected_ahead)),
            // The 16th, a Tuesday, is the first 15-step weekday at or after the due time.
            ("due".into(), Some("2026-06-15 22:11:00".into())),
            before.iter().find(|(n, _)| n == "list").unwrap().clone(),
            ("paused".into(), Some("2030-01-01 00:00:00".into())),
            same_before,
        ]
    );
    let notices = notices.lock().unwrap().clone();
    assert_eq!(notices.len(), 2, "one warning per moved schedule: {notices:?}");
    assert!(notices[0].starts_with("pgqueue: schedule \"ahead\""), "{notices:?}");
    assert!(
        notices[1].contains("\"due\" (cron '11-34 * */15 * MON-FRI' in Europe/Berlin) next runs at"),
        "{notices:?}"
    );
    drop(u);
    workers_only_in(&mut c, None);
    c.batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)")).unwrap();
}

/// Creates the extension at an earlier release (`sql/install/`), fills it, updates it to
/// this build's version, and compares it with a fresh install.
fn update_from(previous: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = connect();
    let test_db: String = c.query_one("SELECT current_database()::text", &[]).unwrap().get(0);
    let (old, fresh) = (common::unique_queue("updated"), common::unique_queue("fresh"));
    for db in [&old, &fresh] {
        c.batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
    }

    // The previous release, filled, with its worker (this build's library) ticking in it.
    let mut u = connect_to(&old);
    u.batch_execute(&format!("CREATE EXTENSION pgqueue VERSION '{previous}'")).unwrap_or_else(|e| {
        panic!("{e}: is sql/install/pgqueue--{previous}.sql installed? (scripts/install.sh installs it)")
    });
    let live = fill(&mut u);
    wait_for("the worker to re-arm the expired claim", LIMIT, || {
        let n: i64 = u.query_one("SELECT rearmed FROM pgqueue.worker_state", &[]).unwrap().get(0);
        (n > 0).then_some(())
    });
    let failures: i64 = u.query_one("SELECT tick_failures FROM pgqueue.worker_state", &[]).unwrap().get(0);
    assert_eq!(failures, 0, "this library runs the previous release's SQL without a failing step");

    // Quiet (no worker there), so that the rows before and after the update can be compared.
    workers_only_in(&mut c, Some(&test_db));
    let before = rows(&mut u);
    u.batch_execute("ALTER EXTENSION pgqueue UPDATE").unwrap();
    let version: String =
        u.query_one("SELECT extversion FROM pg_extension WHERE extname = 'pgqueue'", &[]).unwrap().get(0);
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
    assert_eq!(rows(&mut u), before, "the update changes no row");

    // The same queues created in a fresh install: the same schema, object for object.
    let mut f = connect_to(&fresh);
    f.batch_execute(
        "CREATE EXTENSION pgqueue;
         SELECT pgqueue.pgq_create_queue('jobs', lease => '1 hour', max_attempts => 2, retention => '10 days');
         SELECT pgqueue.pgq_create_queue('parked', paused => true);
         SELECT pgqueue._ensure_history_day('jobs', current_date - 2);",
    )
    .unwrap();
    let (updated, installed) = (schema(&mut c, &old), schema(&mut c, &fresh));
    assert!(updated.contains("history_jobs$default_dead"), "the dump shows the extension's objects");
    if updated != installed {
        let diff: Vec<String> = updated
            .lines()
            .zip(installed.lines())
            .filter(|(a, b)| a != b)
            .take(10)
            .map(|(a, b)| format!("updated: {a}\n  fresh: {b}"))
            .collect();
        panic!("the updated schema differs from a fresh install's:\n{}", diff.join("\n"));
    }

    // The same tables' data is dumped (pg_extension_config_dump), in both.
    let config = |db: &str| -> String {
        connect_to(db)
            .query_one("SELECT extconfig::regclass[]::text || ' ' || extcondition::text FROM pg_extension WHERE extname = 'pgqueue'", &[])
            .unwrap()
            .get(0)
    };
    assert_eq!(config(&old), config(&fresh));

    // And it works: the worker comes back, the live claim acks, the old dead letter redrives.
    workers_only_in(&mut c, None);
    let ticks: i64 = u.query_one("SELECT ticks FROM pgqueue.worker_state", &[]).unwrap().get(0);
    wait_for("the worker ticking after the update", LIMIT, || {
        let t: i64 = u.query_one("SELECT ticks FROM pgqueue.worker_state", &[]).unwrap().get(0);
        (t > ticks + 1).then_some(())
    });
    let acked: bool = u.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&live.0, &live.1]).unwrap().get(0);
    assert!(acked);
    let back: i64 = u.query_one("SELECT pgqueue.pgq_redrive('jobs', ARRAY[-1::bigint])", &[]).unwrap().get(0);
    assert_eq!(back, 1);
    u.batch_execute("SET pgqueue.claim_ledger = on").unwrap();
    let claimed: i64 = u.query_one("SELECT count(*) FROM pgqueue.pgq_claim('jobs', qty => 100)", &[]).unwrap().get(0);
    assert_eq!(claimed, 8, "six never claimed, the re-armed one and the redriven one");
    // The claim ledger has that claim, its eight messages at their claim numbers, and only that
    // (once the "claims" step has pruned the row of the live claim acked above: from 0.22.0 on
    // it was a claim of the ledger's, the suite's setting on 17 and 18).
    u.batch_execute("SELECT pgqueue._prune_claims(0, 1000)").unwrap();
    let ledger: Vec<(i64, i64)> = u
        .query(
            "SELECT cardinality(c.msg_ids)::bigint, count(m.*)
               FROM pgqueue.claims c
               LEFT JOIN pgqueue.messages m ON m.msg_id = ANY (c.msg_ids) AND m.state = 'claimed'
                    AND m.claims_ended + 1 = c.claim_numbers[array_position(c.msg_ids, m.msg_id)]
                    AND pgqueue._token_claim(m.claim_token) = c.claim_id
              GROUP BY c.claim_id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(ledger, [(8, 8)], "the ledger row of the claim after the update");
    let failures: i64 = u.query_one("SELECT tick_failures FROM pgqueue.worker_state", &[]).unwrap().get(0);
    assert_eq!(failures, 0);
    drop((u, f));
    for db in [&old, &fresh] {
        c.batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)")).unwrap();
    }
}

/// pg_upgrade from 17 to 18 with pgqueue in use: both builds exist in the toolchain, and this
/// test (in the 18 run) installs the 17 build itself.
#[cfg(feature = "pg18")]
#[test]
fn pg_upgrade_from_17_to_18_keeps_the_queues_and_the_worker_runs_after() {
    let _turn = common::file_turn(file!());
    use common::server::Server;
    let _installed = connect(); // this build, in 18
    let pg17 = bindir(17);
    let pg_config17 = pg17.join("pg_config");
    let status = Command::new("bash")
        .args(["scripts/install.sh", "--debug", "--test", "--pg-config"])
        .arg(&pg_config17)
        .args(["--no-default-features", "--features", "pg17 pg_test"])
        .status()
        .unwrap();
    assert!(status.success(), "installing the PostgreSQL 17 build");
    let conf = [
        "shared_preload_libraries = 'pgqueue'",
        "pgqueue.launcher_naptime = '200ms'",
        "pgqueue.tick_interval = '100ms'",
    ];
    let old = Server::init(&pg17, &conf);
    old.start();
    old.connect("postgres").batch_execute("CREATE DATABASE app").unwrap();
    let mut a = old.connect("app");
    a.batch_execute("CREATE EXTENSION pgqueue").unwrap();
    let live = fill(&mut a);
    wait_for("the 17 worker re-arming", LIMIT, || {
        let n: i64 = a.query_one("SELECT rearmed FROM pgqueue.worker_state", &[]).unwrap().get(0);
        (n > 0).then_some(())
    });
    // Quiet (the worker idles), and a claim whose lease ends while the server is down.
    common::turn_workers_off(&mut a);
    a.batch_execute("SELECT pgqueue.pgq_create_queue('lapse'); SELECT pgqueue.pgq_send('lapse', '{}')").unwrap();
    let lapsed: i64 = a.query_one("SELECT msg_id FROM pgqueue.pgq_claim('lapse', lease => '1 s')", &[]).unwrap().get(0);
    let before = rows(&mut a);
    drop(a);
    old.stop();

    // 18's initdb turns data checksums on by default; the 17 cluster has none.
    let new = Server::init_with(&bindir(18), &["--no-data-checksums"], &conf);
    let (old_port, new_port) = (old.port.to_string(), new.port.to_string());
    new.run_ok(
        "pg_upgrade",
        &[
            "-b",
            pg17.to_str().unwrap(),
            "-B",
            new.bindir.to_str().unwrap(),
            "-d",
            &old.data(),
            "-D",
            &new.data(),
            "-p",
            &old_port,
            "-P",
            &new_port,
            "-U",
            "postgres",
        ],
    );
    // First without its worker, so every row can be compared; then with it.
    new.configure(&["pgqueue.enabled = off"]);
    new.start();
    let mut a = new.connect("app");
    assert_eq!(rows(&mut a), before, "queues, messages, history, prune state, counters, sequence");
    a.batch_execute("ALTER SYSTEM SET pgqueue.enabled = on").unwrap();
    a.batch_execute("SELECT pg_reload_conf()").unwrap();
    wait_for("the 18 worker re-arming the lapsed claim", LIMIT, || {
        let s: String = a.query_one("SELECT state FROM pgqueue.messages WHERE msg_id = $1", &[&lapsed]).unwrap().get(0);
        (s == "ready").then_some(())
    });
    let acked: bool = a.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&live.0, &live.1]).unwrap().get(0);
    assert!(acked, "a claim taken on 17 is acked on 18");
    let r = a.query_one("SELECT msg_id, claim_token FROM pgqueue.pgq_claim('jobs')", &[]).unwrap();
    let (id, token): (i64, uuid::Uuid) = (r.get(0), r.get(1));
    let acked: bool = a.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&id, &token]).unwrap().get(0);
    assert!(acked);
}

/// Installing a build while the server runs replaces the library file by a new one (a new
/// inode) instead of writing over the one the server has mapped; the server, its worker and
/// new sessions carry on.
#[test]
fn installing_a_build_into_a_running_server_does_not_disturb_it() {
    let _turn = common::file_turn(file!());
    use std::os::unix::fs::MetadataExt;
    let mut c = connect();
    let libdir: String = c.query_one("SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'", &[]).unwrap().get(0);
    let library = std::path::Path::new(&libdir).join("pgqueue.so");
    let inode = std::fs::metadata(&library).unwrap().ino();
    let worker = |c: &mut Client| -> Option<i32> {
        c.query_opt(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pgqueue worker' AND datname = current_database()",
            &[],
        )
        .unwrap()
        .map(|r| r.get(0))
    };
    let pid = wait_for("the worker", LIMIT, || worker(&mut c));
    let pg_config = bindir(this_major()).join("pg_config");
    let status = Command::new("bash")
        .args(["scripts/install.sh", "--debug", "--test", "--pg-config"])
        .arg(&pg_config)
        .args(["--no-default-features", "--features", &format!("pg{} pg_test", this_major())])
        .status()
        .unwrap();
    assert!(status.success());
    assert_ne!(std::fs::metadata(&library).unwrap().ino(), inode, "a new file, renamed into place");
    let ticks: i64 = c.query_one("SELECT ticks FROM pgqueue.worker_state", &[]).unwrap().get(0);
    wait_for("the same worker ticking on", LIMIT, || {
        let t: i64 = c.query_one("SELECT ticks FROM pgqueue.worker_state", &[]).unwrap().get(0);
        (t > ticks + 1).then_some(())
    });
    assert_eq!(worker(&mut c), Some(pid));
    let mut fresh = connect();
    let version: String = fresh.query_one("SELECT pgqueue.pgq_version()", &[]).unwrap().get(0);
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
}
