//! pgqueue behind Debian's PgBouncer (1.18) in transaction pooling mode, with a pool smaller
//! than the number of clients so that they really share server connections: every function
//! of the SQL API works through it (with the simple query protocol or unnamed statements —
//! named prepared statements do not survive transaction pooling, shown here too), the
//! Python and Rust clients' producers and workers process every message exactly once through
//! it, and
//! session-bound claims, which transaction pooling defeats, are harmless: never delivered
//! twice while a lease is live, and a claim re-armed under a consumer that still works is
//! fenced (its ack changes nothing) rather than completed twice.

use crate::common;

use common::server::Server;
use common::{Claimed, Client, wait_for};
use pgqueue_client::{Message, SendOptions, Worker, WorkerConfig, tokio_postgres};
use postgres::Row;
use postgres::types::{ToSql, Type};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;
use tokio::sync::oneshot;
use uuid::Uuid;

const PGBOUNCER: &str = "/usr/sbin/pgbouncer";
const LIMIT: Duration = Duration::from_secs(60);
/// Server connections PgBouncer opens at most: fewer than the tests' clients.
const POOL_SIZE: i64 = 4;
/// The role PgBouncer logs into the server as (a member of pgqueue_admin, not a superuser).
const APP_ROLE: &str = "pgq_app";

/// A PgBouncer in front of `server`, killed when dropped.
struct Bouncer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Bouncer {
    fn start(server: &Server) -> Bouncer {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = PathBuf::from(format!(
            "/tmp/pgqueue-pgbouncer-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let ini = format!(
            "[databases]
postgres = host=127.0.0.1 port={server_port} dbname=postgres user={APP_ROLE}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {dir}/users.txt
admin_users = admin
pool_mode = transaction
default_pool_size = {POOL_SIZE}
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
",
            server_port = server.port,
            dir = dir.display()
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();
        std::fs::write(dir.join("users.txt"), "\"app\" \"\"\n\"admin\" \"\"\n").unwrap();
        let log = std::fs::File::create(dir.join("pgbouncer.log")).unwrap();
        let mut command = Command::new(PGBOUNCER);
        // It refuses to run as root: -u switches to the postgres user once started.
        if unsafe { libc::geteuid() } == 0 {
            command.args(["-u", "postgres"]);
        }
        let child = command
            .arg(dir.join("pgbouncer.ini"))
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("start {PGBOUNCER} (scripts/setup.sh installs it): {e}"));
        let mut bouncer = Bouncer { child, port, dir };
        wait_for("PgBouncer to accept connections", LIMIT, || {
            if let Ok(Some(status)) = bouncer.child.try_wait() {
                panic!("PgBouncer exited ({status}):\n{}", bouncer.log());
            }
            bouncer.try_connect("app", "postgres").ok()
        });
        bouncer
    }

    fn try_connect(&self, user: &str, dbname: &str) -> Result<Client, postgres::Error> {
        postgres::Config::new().host("127.0.0.1").port(self.port).user(user).dbname(dbname).connect(postgres::NoTls)
    }

    /// A client connection through PgBouncer.
    fn connect(&self) -> Client {
        self.try_connect("app", "postgres").unwrap_or_else(|e| panic!("connect through PgBouncer: {e}\n{}", self.log()))
    }

    /// PgBouncer's admin console (simple query protocol only).
    fn admin(&self) -> Client {
        self.try_connect("admin", "pgbouncer").unwrap()
    }

    /// A libpq connection string through PgBouncer.
    fn dsn(&self) -> String {
        format!("host=127.0.0.1 port={} user=app dbname=postgres", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A server with pgqueue, the role PgBouncer logs in as, and PgBouncer in front.
fn setup() -> (Server, Bouncer) {
    let server = Server::with_pgqueue(&[]);
    server.connect("postgres").batch_execute(&format!("CREATE ROLE {APP_ROLE} LOGIN IN ROLE pgqueue_admin")).unwrap();
    let bouncer = Bouncer::start(&server);
    (server, bouncer)
}

/// Of `queue`'s messages (payloads `{"p": producer, "i": n}`, n < 0 for rolled-back sends),
/// counted on the server: (completed, dead, distinct payloads, rolled back seen, left).
fn outcomes(direct: &mut Client, queue: &str) -> (i64, i64, i64, i64, i64) {
    let row = direct
        .query_one(
            "SELECT count(*) FILTER (WHERE outcome = 'completed'), count(*) FILTER (WHERE outcome = 'dead'),
                    count(DISTINCT (payload->>'p', payload->>'i')), count(*) FILTER (WHERE (payload->>'i')::int < 0),
                    (SELECT count(*) FROM pgqueue.messages WHERE queue = $1)
               FROM pgqueue.history WHERE queue = $1",
            &[&queue],
        )
        .unwrap();
    (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4))
}

/// Server connections PgBouncer holds now.
fn server_connections(direct: &mut Client) -> i64 {
    direct.query_one("SELECT count(*) FROM pg_stat_activity WHERE usename = $1", &[&APP_ROLE]).unwrap().get(0)
}

/// A statement with typed parameters as one unnamed statement (parse, bind, execute, sync
/// in one go): what works through transaction pooling besides the simple query protocol.
fn q(c: &mut Client, sql: &str, params: &[(&(dyn ToSql + Sync), Type)]) -> Vec<Row> {
    c.query_typed(sql, params).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn q1(c: &mut Client, sql: &str, params: &[(&(dyn ToSql + Sync), Type)]) -> Row {
    let mut rows = q(c, sql, params);
    assert_eq!(rows.len(), 1, "{sql}: one row");
    rows.pop().unwrap()
}

fn code(e: postgres::Error) -> String {
    e.code().map(|c| c.code().to_string()).unwrap_or_else(|| format!("no SQLSTATE: {e}"))
}

// send, claim and ack as the kit's, but each as one unnamed statement with explicit types
// (`q`, `q1`): PgBouncer's transaction pooling cannot keep the kit's named prepared statements.

fn send_through_pgbouncer(c: &mut Client, queue: &str, payload: Value) -> i64 {
    q1(c, "SELECT pgqueue.pgq_send($1, $2)", &[(&queue, Type::TEXT), (&payload, Type::JSONB)]).get(0)
}

fn claim_through_pgbouncer(c: &mut Client, queue: &str, qty: i32, lease: &str) -> Vec<Claimed> {
    q(
        c,
        "SELECT msg_id, claim_token, attempt, priority FROM pgqueue.pgq_claim($1, qty => $2, lease => $3::interval)",
        &[(&queue, Type::TEXT), (&qty, Type::INT4), (&lease, Type::TEXT)],
    )
    .iter()
    .map(|r| Claimed { id: r.get(0), token: r.get(1), attempt: r.get(2), priority: r.get(3) })
    .collect()
}

fn ack_through_pgbouncer(c: &mut Client, id: i64, token: Uuid) -> bool {
    q1(c, "SELECT pgqueue.pgq_ack($1, $2)", &[(&id, Type::INT8), (&token, Type::UUID)]).get(0)
}

#[test]
fn every_api_function_works_through_pgbouncer() {
    let _turn = common::file_turn(file!());
    let (server, bouncer) = setup();
    let mut direct = server.connect("postgres");
    let mut a = bouncer.connect();
    let mut b = bouncer.connect();

    let version: String = q1(&mut a, "SELECT pgqueue.pgq_version()", &[]).get(0);
    let want: String = direct.query_one("SELECT pgqueue.pgq_version()", &[]).unwrap().get(0);
    assert_eq!(version, want);

    // Queues: create (again with if_not_exists; without it the error comes through), pause, resume.
    a.batch_execute(
        "SELECT pgqueue.pgq_create_queue('jobs', lease => '30 s');
         SELECT pgqueue.pgq_create_queue('jobs', if_not_exists => true);
         SELECT pgqueue.pgq_create_queue('other');
         SELECT pgqueue.pgq_create_queue('doomed', max_attempts => 1);",
    )
    .unwrap();
    assert_eq!(code(a.batch_execute("SELECT pgqueue.pgq_create_queue('jobs')").unwrap_err()), "42710");
    assert_eq!(code(b.batch_execute("SELECT pgqueue.pgq_claim('nope')").unwrap_err()), "42704");
    b.batch_execute("SELECT pgqueue.pgq_pause_queue('jobs')").unwrap();
    let m1 = send_through_pgbouncer(&mut a, "jobs", json!({"n": 1}));
    assert!(
        claim_through_pgbouncer(&mut b, "jobs", 10, "1 minute").is_empty(),
        "a paused queue's claims return nothing"
    );
    b.batch_execute("SELECT pgqueue.pgq_resume_queue('jobs')").unwrap();
    let got = q(
        &mut b,
        "SELECT msg_id, claim_token, payload FROM pgqueue.pgq_claim($1, qty => 10)",
        &[(&"jobs", Type::TEXT)],
    );
    assert_eq!(got.len(), 1);
    let (id, token, payload): (i64, Uuid, Value) = (got[0].get(0), got[0].get(1), got[0].get(2));
    assert_eq!((id, payload), (m1, json!({"n": 1})));
    assert!(ack_through_pgbouncer(&mut a, id, token), "acked by another client than the one that claimed");
    assert!(!ack_through_pgbouncer(&mut b, id, token), "a second ack changes nothing");

    // send with every argument, send_batch; a send rolled back is never seen, a committed one is.
    let m2: i64 = q1(
        &mut a,
        "SELECT pgqueue.pgq_send($1, $2, delay => $3::interval, priority => $4, headers => $5, dedup_key => $6,
                                 dedup_for => $7::interval)",
        &[
            (&"other", Type::TEXT),
            (&json!({"late": true}), Type::JSONB),
            (&"1 hour", Type::TEXT),
            (&3i16, Type::INT2),
            (&json!({"h": 1}), Type::JSONB),
            (&"key-1", Type::TEXT),
            (&"1 hour", Type::TEXT),
        ],
    )
    .get(0);
    let ids: Vec<i64> = q(
        &mut a,
        "SELECT * FROM pgqueue.pgq_send_batch($1, $2)",
        &[(&"jobs", Type::TEXT), (&vec![json!({"b": 1}), json!({"b": 2}), json!({"b": 3})], Type::JSONB_ARRAY)],
    )
    .iter()
    .map(|r| r.get(0))
    .collect();
    assert_eq!(ids.len(), 3);
    let mut tx = a.transaction().unwrap();
    let rolled_back: i64 = tx.query_typed_one("SELECT pgqueue.pgq_send('jobs', '{}')", &[]).unwrap().get(0);
    tx.rollback().unwrap();
    let mut tx = a.transaction().unwrap();
    let committed: i64 = tx.query_typed_one("SELECT pgqueue.pgq_send('jobs', '{}')", &[]).unwrap().get(0);
    tx.commit().unwrap();
    let states: Vec<(i64, String)> = direct
        .query("SELECT msg_id, state::text FROM pgqueue.messages ORDER BY msg_id", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut want: Vec<(i64, String)> = vec![(m2, "delayed".into()), (committed, "ready".into())];
    want.extend(ids.iter().map(|&id| (id, "ready".to_string())));
    want.sort();
    assert_eq!(states, want, "the rolled-back send {rolled_back} is not there");

    // claim, renew (single and batch), ack (batch), nack, fail, redrive.
    let held = claim_through_pgbouncer(&mut b, "jobs", 3, "1 minute");
    assert_eq!(held.iter().map(|h| h.id).collect::<Vec<_>>(), ids, "FIFO");
    let (ids, tokens): (Vec<i64>, Vec<Uuid>) = held.iter().map(Claimed::held).unzip();
    let renewed: bool = q1(
        &mut a,
        "SELECT pgqueue.pgq_renew($1, $2, lease => $3::interval)",
        &[(&ids[0], Type::INT8), (&tokens[0], Type::UUID), (&"2 minutes", Type::TEXT)],
    )
    .get(0);
    assert!(renewed);
    let renewed: Vec<i64> =
        q(&mut a, "SELECT * FROM pgqueue.pgq_renew($1, $2)", &[(&ids, Type::INT8_ARRAY), (&tokens, Type::UUID_ARRAY)])
            .iter()
            .map(|r| r.get(0))
            .collect();
    assert_eq!(renewed, ids);
    let acked: Vec<i64> = q(
        &mut b,
        "SELECT * FROM pgqueue.pgq_ack($1, $2)",
        &[(&ids[1..].to_vec(), Type::INT8_ARRAY), (&tokens[1..].to_vec(), Type::UUID_ARRAY)],
    )
    .iter()
    .map(|r| r.get(0))
    .collect();
    assert_eq!(acked, ids[1..]);
    let nacked: bool = q1(
        &mut a,
        "SELECT pgqueue.pgq_nack($1, $2, retry_in => $3::interval, error => $4)",
        &[(&ids[0], Type::INT8), (&tokens[0], Type::UUID), (&"0", Type::TEXT), (&"boom", Type::TEXT)],
    )
    .get(0);
    assert!(nacked);
    let again = claim_through_pgbouncer(&mut b, "jobs", 1, "1 minute");
    assert_eq!((again[0].id, again[0].attempt), (ids[0], 2), "the nacked message, second attempt");
    let failed: bool = q1(
        &mut a,
        "SELECT pgqueue.pgq_fail($1, $2, error => $3)",
        &[(&again[0].id, Type::INT8), (&again[0].token, Type::UUID), (&"fatal", Type::TEXT)],
    )
    .get(0);
    assert!(failed);
    let redriven: i64 = q1(&mut b, "SELECT pgqueue.pgq_redrive($1)", &[(&"jobs", Type::TEXT)]).get(0);
    assert_eq!(redriven, 1);

    // ack_claim: a first round, then ack + claim in one call, and a stale ack reported.
    let rows = q(
        &mut a,
        "SELECT kind, msg_id, claim_token FROM pgqueue.pgq_ack_claim($1, '{}', '{}', qty => 1)",
        &[(&"jobs", Type::TEXT)],
    );
    let (kind, first, first_token): (String, i64, Uuid) = (rows[0].get(0), rows[0].get(1), rows[0].get(2));
    assert_eq!((kind.as_str(), first), ("claimed", ids[0]), "the redriven message comes first");
    let rows = q(
        &mut b,
        "SELECT kind, msg_id FROM pgqueue.pgq_ack_claim($1, $2, $3, qty => 1)",
        &[
            (&"jobs", Type::TEXT),
            (&vec![first, ids[1]], Type::INT8_ARRAY),
            (&vec![first_token, tokens[1]], Type::UUID_ARRAY),
        ],
    );
    let rows: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(rows, vec![("not_acked".to_string(), ids[1]), ("claimed".to_string(), committed)]);

    // rearm: a claim whose lease ended is claimable again (re-armed by this call, or by the
    // worker first: either way the call succeeds and the message comes back).
    let m3 = send_through_pgbouncer(&mut a, "jobs", json!({"short": 1}));
    assert_eq!(claim_through_pgbouncer(&mut a, "jobs", 1, "1 millisecond").len(), 1);
    thread::sleep(Duration::from_millis(20));
    let row = q1(&mut b, "SELECT * FROM pgqueue.pgq_rearm(queue => $1)", &[(&"jobs", Type::TEXT)]);
    let (rearmed, dead): (i64, i64) = (row.get(0), row.get(1));
    assert!(rearmed <= 1 && dead == 0, "{rearmed} {dead}");
    let back = claim_through_pgbouncer(&mut b, "jobs", 1, "1 minute");
    assert_eq!((back[0].id, back[0].attempt), (m3, 2), "re-armed, second attempt");
    assert!(ack_through_pgbouncer(&mut a, back[0].id, back[0].token));

    // prune, tick, schedules, cron_next.
    let outcomes: Vec<String> = q(&mut a, "SELECT outcome FROM pgqueue.pgq_prune($1)", &[(&"jobs", Type::TEXT)])
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!outcomes.is_empty() && outcomes.iter().all(|o| o == "noop"), "{outcomes:?}");
    assert!(q(&mut b, "SELECT * FROM pgqueue.pgq_tick()", &[]).is_empty(), "no step of the tick failed");
    let next: std::time::SystemTime = q1(
        &mut a,
        "SELECT pgqueue.pgq_schedule($1, $2, $3, payload => $4)",
        &[(&"report", Type::TEXT), (&"jobs", Type::TEXT), (&"0 3 * * *", Type::TEXT), (&json!({"r": 1}), Type::JSONB)],
    )
    .get(0);
    assert!(next > std::time::SystemTime::now());
    b.batch_execute(
        "SELECT pgqueue.pgq_pause_schedule('report');
         SELECT pgqueue.pgq_resume_schedule('report');
         SELECT pgqueue.pgq_unschedule('report');
         SELECT pgqueue.pgq_unschedule('report', if_exists => true);",
    )
    .unwrap();
    let times = q(&mut a, "SELECT * FROM pgqueue.pgq_cron_next('*/5 * * * *', count => 3)", &[]);
    assert_eq!(times.len(), 3);

    // The views.
    for view in ["queue_stats", "worker_stats", "queue_depth", "schedule_stats", "shared_state"] {
        let rows = a.simple_query(&format!("SELECT * FROM pgqueue.{view}")).unwrap();
        assert!(!rows.is_empty(), "{view} through PgBouncer");
    }
    let ready: i64 =
        q1(&mut b, "SELECT ready FROM pgqueue.queue_stats WHERE queue = $1", &[(&"jobs", Type::TEXT)]).get(0);
    assert_eq!(ready, 0);

    // A waiting claim is woken by a send from another client (it holds a server connection
    // while it waits: a pool must have room for the waiting consumers).
    let waiter = {
        let mut w = bouncer.connect();
        thread::spawn(move || {
            q(&mut w, "SELECT msg_id FROM pgqueue.pgq_claim($1, wait => '50 s')", &[(&"other", Type::TEXT)])
                .iter()
                .map(|r| r.get::<_, i64>(0))
                .collect::<Vec<_>>()
        })
    };
    wait_for("the claim to wait", LIMIT, || {
        let n: i64 = direct
            .query_one("SELECT waiting_claims FROM pgqueue.queue_depth WHERE queue = 'other'", &[])
            .unwrap()
            .get(0);
        (n == 1).then_some(())
    });
    let woken = send_through_pgbouncer(&mut b, "other", json!({"wake": 1}));
    assert_eq!(waiter.join().unwrap(), vec![woken]);

    // drop_queue: refused while a message is claimed, then forced.
    let held = claim_through_pgbouncer(&mut a, "other", 1, "1 minute");
    assert_eq!(held.len(), 0, "only the delayed message is left");
    send_through_pgbouncer(&mut a, "doomed", json!({}));
    assert_eq!(claim_through_pgbouncer(&mut a, "doomed", 1, "1 minute").len(), 1);
    assert_eq!(code(b.batch_execute("SELECT pgqueue.pgq_drop_queue('doomed')").unwrap_err()), "55006");
    b.batch_execute("SELECT pgqueue.pgq_drop_queue('doomed', force => true)").unwrap();
    let left: i64 = direct.query_one("SELECT count(*) FROM pgqueue.queues WHERE queue = 'doomed'", &[]).unwrap().get(0);
    assert_eq!(left, 0);

    // All of it over at most POOL_SIZE server connections (three clients, one of them waiting).
    let used = server_connections(&mut direct);
    assert!((1..=POOL_SIZE).contains(&used), "{used} server connections");
}

/// Why the calls above avoid named prepared statements: in transaction mode a statement
/// prepared on one server connection is missing on the next one a client gets.
#[test]
fn named_prepared_statements_do_not_survive_transaction_pooling() {
    let _turn = common::file_turn(file!());
    let (_server, bouncer) = setup();
    let mut a = bouncer.connect();
    let mut b = bouncer.connect();
    // Prepared on the pool's only server connection, which is idle again afterwards...
    let version = a.prepare("SELECT pgqueue.pgq_version()").unwrap();
    // ...and taken by another client's transaction: the next execution gets a new one.
    let mut tx = b.transaction().unwrap();
    tx.batch_execute("SELECT 1").unwrap();
    let err = a.query(&version, &[]).unwrap_err();
    assert_eq!(code(err), "26000", "prepared statement does not exist");
    tx.commit().unwrap();
    // The same call as an unnamed statement or a simple query works.
    assert_eq!(a.query_typed("SELECT pgqueue.pgq_version()", &[]).unwrap().len(), 1);
    let rows = a.simple_query("SELECT pgqueue.pgq_version()").unwrap();
    assert_eq!(rows.iter().filter(|m| matches!(m, postgres::SimpleQueryMessage::Row(_))).count(), 1);
}

/// Worse than missing: a statement name (drivers number theirs per connection, so names
/// repeat across clients) can meet another client's statement of that name on the server
/// connection PgBouncer hands out next, which then runs in the caller's place. Here an "ack"
/// dead-letters the message. Behind transaction pooling, prepared statements must be off
/// (psycopg: `prepare_threshold=None`, the Python client's default; lib/pq:
/// `binary_parameters=yes`, which sends a statement and its values in one round trip).
#[test]
fn a_statement_name_can_run_another_clients_statement() {
    let _turn = common::file_turn(file!());
    let (server, bouncer) = setup();
    let mut direct = server.connect("postgres");
    direct.batch_execute("SELECT pgqueue.pgq_create_queue('jobs'); SELECT pgqueue.pgq_send('jobs', '{}')").unwrap();
    let row = direct.query_one("SELECT msg_id, claim_token FROM pgqueue.pgq_claim('jobs')", &[]).unwrap();
    let (id, token): (i64, Uuid) = (row.get(0), row.get(1));
    let (mut a, mut b, mut c) = (bouncer.connect(), bouncer.connect(), bouncer.connect());
    // a prepares "finish" as an ack on the pool's first server connection...
    a.batch_execute("PREPARE finish(bigint, uuid) AS SELECT pgqueue.pgq_ack($1, $2)").unwrap();
    // ...c's transaction takes that connection, so b's "finish", a fail, goes to a second one...
    let mut tx = c.transaction().unwrap();
    tx.batch_execute("SELECT 1").unwrap();
    b.batch_execute("PREPARE finish(bigint, uuid) AS SELECT pgqueue.pgq_fail($1, $2)").unwrap();
    // ...where a's "ack" runs next.
    a.batch_execute(&format!("EXECUTE finish({id}, '{token}')")).unwrap();
    tx.commit().unwrap();
    let outcome: String =
        direct.query_one("SELECT outcome::text FROM pgqueue.history WHERE msg_id = $1", &[&id]).unwrap().get(0);
    assert_eq!(outcome, "dead", "a's ack ran b's statement");
}

/// `session_bound => true` ties a claim to the server backend, which behind transaction
/// pooling is not the consumer's: the server cannot tell, so it cannot refuse it, but the
/// misuse is harmless. A consumer that disconnects leaves its backend in the pool: the claim
/// comes back at the end of its lease, as a plain claim would, never before. A backend that
/// PgBouncer closes while its client still works re-arms that client's claim: another
/// consumer gets the message, and the first one's renew and ack are fenced (they change
/// nothing and say so): the message is completed once.
#[test]
fn session_bound_claims_through_pgbouncer_are_harmless() {
    let _turn = common::file_turn(file!());
    let (server, bouncer) = setup();
    let mut direct = server.connect("postgres");
    let mut producer = bouncer.connect();
    producer.batch_execute("SELECT pgqueue.pgq_create_queue('sb')").unwrap();
    let alive = |direct: &mut Client, pid: i32| -> bool {
        let n: i64 = direct.query_one("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", &[&pid]).unwrap().get(0);
        n == 1
    };
    let session_claim = |c: &mut Client, lease: &str| -> (i64, Uuid, std::time::SystemTime, i32) {
        let row = q1(
            c,
            "SELECT msg_id, claim_token, lease_expires_at, pg_backend_pid()
               FROM pgqueue.pgq_claim('sb', lease => $1::interval, session_bound => true)",
            &[(&lease, Type::TEXT)],
        );
        (row.get(0), row.get(1), row.get(2), row.get(3))
    };

    // The consumer disconnects; the backend it claimed through lives on in the pool.
    let m1 = send_through_pgbouncer(&mut producer, "sb", json!({"n": 1}));
    let mut a = bouncer.connect();
    let (id, _, lease_end, backend) = session_claim(&mut a, "5 s");
    assert_eq!(id, m1);
    drop(a);
    let mut b = bouncer.connect();
    let (attempt, claimed_at) = wait_for("the message to come back", LIMIT, || {
        let rows = q(&mut b, "SELECT attempt, now() FROM pgqueue.pgq_claim('sb', lease => '1 minute')", &[]);
        rows.first().map(|r| (r.get::<_, i32>(0), r.get::<_, std::time::SystemTime>(1)))
    });
    assert_eq!(attempt, 2);
    assert!(claimed_at >= lease_end, "not delivered again while the first lease was live");
    assert!(alive(&mut direct, backend), "the backend of the session-bound claim is still in the pool");
    let orphans: i64 = direct.query_one("SELECT orphans_expired FROM pgqueue.worker_stats", &[]).unwrap().get(0);
    assert_eq!(orphans, 0, "it came back by its lease, not as an orphan");
    drop(b);

    // PgBouncer closes the server connections while the consumer still works on its claim.
    let m2 = send_through_pgbouncer(&mut producer, "sb", json!({"n": 2}));
    let mut c = bouncer.connect();
    let (id, c_token, _, backend) = session_claim(&mut c, "10 minutes");
    assert_eq!(id, m2);
    bouncer.admin().simple_query("RECONNECT postgres").unwrap();
    wait_for("PgBouncer to close the backend", LIMIT, || (!alive(&mut direct, backend)).then_some(()));
    // The worker sees the backend gone and re-arms the claim: another consumer gets it.
    let mut d = bouncer.connect();
    let Claimed { id: d_id, token: d_token, attempt: d_attempt, .. } =
        wait_for("the orphaned claim to be re-armed", LIMIT, || {
            claim_through_pgbouncer(&mut d, "sb", 1, "1 minute").pop()
        });
    assert_eq!((d_id, d_attempt), (m2, 2));
    // The first consumer's connection still works, and its claim is fenced.
    let renewed: bool =
        q1(&mut c, "SELECT pgqueue.pgq_renew($1, $2)", &[(&m2, Type::INT8), (&c_token, Type::UUID)]).get(0);
    assert!(!renewed, "the first consumer learns it lost the claim");
    let rows = q(
        &mut c,
        "SELECT kind, msg_id FROM pgqueue.pgq_ack_claim('sb', $1, $2)",
        &[(&vec![m2], Type::INT8_ARRAY), (&vec![c_token], Type::UUID_ARRAY)],
    );
    let rows: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(rows, vec![("not_acked".to_string(), m2)], "its ack completed nothing");
    assert!(!ack_through_pgbouncer(&mut c, m2, c_token));
    assert!(ack_through_pgbouncer(&mut d, m2, d_token), "the second consumer completes it");
    let history: Vec<(i64, String)> = direct
        .query("SELECT msg_id, outcome::text FROM pgqueue.history ORDER BY msg_id", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(history, vec![(m2, "completed".to_string())], "completed once (m1 is still claimed by b's lease)");
    let orphans: i64 = direct.query_one("SELECT orphans_expired FROM pgqueue.worker_stats", &[]).unwrap().get(0);
    assert_eq!(orphans, 1);
}

/// Producers (a `Producer` each, plus `send` inside the caller's transaction) and workers of
/// the Python client, all through PgBouncer: more clients than server connections.
const PYTHON_SCRIPT: &str = r#"
import collections, json, sys, threading, time
import psycopg, pgqueue

dsn, queue = sys.argv[1], sys.argv[2]
producers, per_producer, workers = (int(a) for a in sys.argv[3:6])
total = producers * per_producer
runs = collections.Counter()
lock = threading.Lock()

def handle(msg):
    with lock:
        runs[(msg.payload["p"], msg.payload["i"])] += 1

# Waiting claims hold a server connection while they wait: short waits leave room in the pool.
# The client's defaults (no prepared statements) are what PgBouncer needs.
pool = [pgqueue.Worker(dsn, queue, handle, concurrency=2, batch=5, wait=1, grace=5,
                       application_name=f"worker-{n}") for n in range(workers)]
threads = [threading.Thread(target=w.run, kwargs={"handle_signals": False}) for w in pool]
for t in threads:
    t.start()

def produce(p):
    with pgqueue.Producer(dsn) as producer:
        i = 0
        while i < per_producer:
            if i % 3 == 0:
                producer.send(queue, {"p": p, "i": i})
                i += 1
            elif i % 3 == 1:
                batch = [{"p": p, "i": j} for j in range(i, min(i + 5, per_producer))]
                producer.send_batch(queue, batch)
                i += len(batch)
            else:
                # Inside the caller's transaction, rolled back once first: never seen.
                with psycopg.connect(dsn, prepare_threshold=None) as conn:
                    with conn.transaction(force_rollback=True):
                        pgqueue.send(conn, queue, {"p": p, "i": -1})
                    with conn.transaction():
                        pgqueue.send(conn, queue, {"p": p, "i": i})
                i += 1

sending = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
for t in sending:
    t.start()
for t in sending:
    t.join()
deadline = time.monotonic() + 120
while sum(runs.values()) < total and time.monotonic() < deadline:
    time.sleep(0.1)
for w in pool:
    w.stop()
for t in threads:
    t.join(60)
print(json.dumps({"runs": sum(runs.values()), "distinct": len(runs),
                  "rolled_back_seen": sum(n for (p, i), n in runs.items() if i < 0),
                  "alive": sum(t.is_alive() for t in threads)}))
"#;

#[test]
fn python_producers_and_workers_through_pgbouncer() {
    let _turn = common::file_turn(file!());
    let (server, bouncer) = setup();
    let mut direct = server.connect("postgres");
    direct.batch_execute("SELECT pgqueue.pgq_create_queue('py')").unwrap();
    let (producers, per_producer, workers) = (4, 150, 3);
    let venv = std::env::var("PGQUEUE_VENV").unwrap_or_else(|_| "/var/cache/pgqueue/venv".into());
    let python = PathBuf::from(&venv).join("bin/python");
    assert!(python.exists(), "{python:?} missing: scripts/setup.sh creates the Python environment");
    let out = Command::new(&python)
        .env("PYTHONPATH", PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/python/src"))
        .args(["-c", PYTHON_SCRIPT, &bouncer.dsn(), "py"])
        .args([producers, per_producer, workers].map(|n| n.to_string()))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the Python script failed:\n{stdout}\n{stderr}\n{}", bouncer.log());
    let report: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    let total = producers * per_producer;
    assert_eq!(
        report,
        json!({"runs": total, "distinct": total, "rolled_back_seen": 0, "alive": 0}),
        "each message handled once, the workers stopped\n{stderr}"
    );
    // Counted on the server itself: every message completed once, nothing left or dead.
    assert_eq!(
        outcomes(&mut direct, "py"),
        (total, 0, total, 0, 0),
        "(completed, dead, distinct payloads, rolled back, left)"
    );
    // A worker that stops cancels its waiting claim, for which PgBouncer briefly opens one more
    // server connection (closed within a second as surplus): wait for the pool's own size.
    wait_for(&format!("at most {POOL_SIZE} server connections for {} clients", producers + 2 * workers), LIMIT, || {
        (server_connections(&mut direct) <= POOL_SIZE).then_some(())
    });
}

/// One producer of the Rust client through PgBouncer: `send` (with options), `send_batch`
/// (with options), and `send` inside its own transaction, rolled back once first (payload
/// `i: -1`: never seen). Returns the msg_ids it got.
async fn produce_rust(dsn: String, queue: &str, p: i64, n: i64) -> pgqueue_client::Result<Vec<i64>> {
    let (mut client, connection) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let key = |i: i64| format!("{p}-{i}");
    let mut ids = vec![];
    let mut i = 0;
    while i < n {
        match i % 3 {
            0 => {
                let opts = SendOptions {
                    priority: Some(1),
                    headers: Some(json!({"p": p})),
                    dedup_key: Some(key(i)),
                    ..Default::default()
                };
                ids.push(pgqueue_client::send(&client, queue, &json!({"p": p, "i": i}), opts).await?);
                i += 1;
            }
            1 => {
                let range = i..(i + 5).min(n);
                let opts = SendOptions {
                    delay: Some(Duration::ZERO),
                    dedup_keys: Some(range.clone().map(|j| Some(key(j))).collect()),
                    dedup_for: Some(Duration::from_secs(3600)),
                    ..Default::default()
                };
                let batch: Vec<Value> = range.clone().map(|j| json!({"p": p, "i": j})).collect();
                ids.extend(pgqueue_client::send_batch(&client, queue, &batch, opts).await?);
                i = range.end;
            }
            _ => {
                let tx = client.transaction().await?;
                pgqueue_client::send(&tx, queue, &json!({"p": p, "i": -1}), SendOptions::default()).await?;
                tx.rollback().await?;
                let tx = client.transaction().await?;
                ids.push(pgqueue_client::send(&tx, queue, &json!({"p": p, "i": i}), SendOptions::default()).await?);
                tx.commit().await?;
                i += 1;
            }
        }
    }
    Ok(ids)
}

/// The Rust client's producers and workers, all through PgBouncer, more clients than server
/// connections: its statements are unnamed (`query_typed`), never named prepared statements
/// that another server connection lacks or knows as another client's statement.
#[test]
fn rust_client_producers_and_workers_through_pgbouncer() {
    let _turn = common::file_turn(file!());
    let (server, bouncer) = setup();
    let mut direct = server.connect("postgres");
    direct.batch_execute("SELECT pgqueue.pgq_create_queue('rs')").unwrap();
    let (producers, per_producer, workers) = (4, 150, 3);
    let total = producers * per_producer;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    // How many times a handler ran for each (producer, i) of the payloads.
    let runs: Arc<Mutex<HashMap<(i64, i64), u32>>> = Arc::default();

    let mut running: Vec<_> = (0..workers)
        .map(|n| {
            // Waiting claims hold a server connection while they wait: short waits leave room
            // in the pool.
            let config = WorkerConfig::new(bouncer.dsn(), "rs")
                .concurrency(2)
                .batch(5)
                .wait(Duration::from_secs(1))
                .grace(Duration::from_secs(5))
                .consumer(format!("worker-{n}"));
            let runs = runs.clone();
            let worker = Worker::new(config, move |msg: Message| {
                let runs = runs.clone();
                async move {
                    let key = (msg.payload["p"].as_i64().unwrap(), msg.payload["i"].as_i64().unwrap());
                    *runs.lock().unwrap().entry(key).or_default() += 1;
                    Ok(())
                }
            });
            let (stop, stopped) = oneshot::channel::<()>();
            let run = rt.spawn(worker.run(async move {
                let _ = stopped.await;
            }));
            (stop, run)
        })
        .collect();

    let sending: Vec<_> =
        (0..producers).map(|p| rt.spawn(produce_rust(bouncer.dsn(), "rs", p, per_producer))).collect();
    let mut sent: Vec<i64> = rt.block_on(async {
        let mut ids = vec![];
        for producer in sending {
            let got = tokio::time::timeout(LIMIT * 2, producer).await.expect("the producer finishes").unwrap();
            ids.extend(got.unwrap_or_else(|e| panic!("a producer failed: {e}\n{}", bouncer.log())));
        }
        ids
    });
    sent.sort();
    assert_eq!(sent.len() as i64, total);
    let handled = || runs.lock().unwrap().values().sum::<u32>() as i64;
    // A worker whose run ends before it is told to stop failed (e.g. SQLSTATE 26000).
    let stopped_early =
        |running: &Vec<(_, tokio::task::JoinHandle<_>)>| running.iter().position(|(_, run)| run.is_finished());
    wait_for("every message to be handled", LIMIT * 2, || {
        (handled() >= total || stopped_early(&running).is_some()).then_some(())
    });
    if let Some(n) = stopped_early(&running) {
        let run = running.swap_remove(n).1;
        panic!("a worker stopped on its own: {:?}\n{}", rt.block_on(run), bouncer.log());
    }
    // Counted before the workers stop: cancelling their waiting claims makes PgBouncer open a
    // server connection beyond the pool for a moment.
    let used = server_connections(&mut direct);
    assert!(used <= POOL_SIZE, "{used} server connections for {} clients", producers + 2 * workers);
    for (stop, run) in running {
        let _ = stop.send(());
        let stopped = rt.block_on(async { tokio::time::timeout(LIMIT, run).await });
        let result = stopped.expect("the worker stops").expect("run does not panic");
        result.unwrap_or_else(|e| panic!("a worker failed: {e}\n{}", bouncer.log()));
    }

    let runs = runs.lock().unwrap().clone();
    let rolled_back_seen = runs.iter().filter(|((_, i), _)| *i < 0).count();
    assert_eq!((handled(), runs.len() as i64, rolled_back_seen), (total, total, 0), "(runs, distinct, rolled back)");
    let want: HashMap<(i64, i64), u32> =
        (0..producers).flat_map(|p| (0..per_producer).map(move |i| ((p, i), 1))).collect();
    assert_eq!(runs, want, "each message handled once");
    // Counted on the server itself: every message completed once, nothing left or dead.
    assert_eq!(
        outcomes(&mut direct, "rs"),
        (total, 0, total, 0, 0),
        "(completed, dead, distinct payloads, rolled back, left)"
    );
    let finished: Vec<i64> = direct
        .query("SELECT msg_id FROM pgqueue.history WHERE queue = 'rs' ORDER BY msg_id", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(finished, sent, "the msg_ids the producers got are the ones completed");
}
