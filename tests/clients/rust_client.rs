//! The Rust client (`clients/rust`, crate `pgqueue-client`) against a live server of its own:
//! sends inside the caller's transaction (rolled back: nothing), a worker that handles 2,000
//! messages exactly once, nacks retryable errors with their text, dead-letters permanent ones,
//! keeps a job past its lease by renewing it, sends a handler's progress with its renewals and
//! its result with its ack for a caller awaiting it, gives back what it holds when it stops,
//! and survives `pg_terminate_backend` of its connections and a server restart without losing
//! or doubling a message. Sends with parents (`after`) wait for their acks, as `graph` shows.
//! Handlers park their jobs until a `signal` or a timeout.

use crate::common;

use common::server::Server;
use common::{Client, Finished, count, history, wait_for};
use pgqueue_client::{
    Error, GraphRow, HandlerError, Message, OnTimeout, ParentFailure, ParkOptions, SendOptions, Worker, WorkerConfig,
    graph, park, result, send, send_batch, signal, tokio_postgres,
};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::runtime::Runtime;
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;

const LIMIT: Duration = Duration::from_secs(120);

fn server() -> Server {
    Server::with_pgqueue(&["pgqueue.tick_interval = '200ms'", "pgqueue.launcher_naptime = '200ms'"])
}

/// Waits until the background worker ticks in database postgres (it re-arms expired claims).
fn until_ticking(c: &mut Client) {
    wait_for("the background worker's first tick", LIMIT, || {
        let ticks: i64 = c.query_one("SELECT ticks FROM pgqueue.worker_stats", &[]).unwrap().get(0);
        (ticks > 0).then_some(())
    });
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// A tokio-postgres connection for the producer's calls, driven on `rt`.
fn async_client(rt: &Runtime, server: &Server) -> tokio_postgres::Client {
    rt.block_on(async {
        let (client, connection) =
            tokio_postgres::connect(&server.dsn("postgres"), tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    })
}

/// How many times the handler ran for each msg_id.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<HashMap<i64, u32>>>);

impl Calls {
    fn record(&self, msg: &Message) {
        *self.0.lock().unwrap().entry(msg.msg_id).or_default() += 1;
    }
    fn of(&self, id: i64) -> u32 {
        self.0.lock().unwrap().get(&id).copied().unwrap_or(0)
    }
    fn total(&self) -> u32 {
        self.0.lock().unwrap().values().sum()
    }
}

/// A worker running on `rt` until the returned sender fires (or is dropped).
fn start<H, F>(
    rt: &Runtime,
    config: WorkerConfig,
    handler: H,
) -> (oneshot::Sender<()>, JoinHandle<pgqueue_client::Result<()>>)
where
    H: Fn(Message) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    let (stop, stopped) = oneshot::channel::<()>();
    let worker = Worker::new(config, handler);
    let run = rt.spawn(worker.run(async move {
        let _ = stopped.await;
    }));
    (stop, run)
}

/// Stops a worker and returns what `run` returned.
fn stop(
    rt: &Runtime,
    (stop, run): (oneshot::Sender<()>, JoinHandle<pgqueue_client::Result<()>>),
) -> pgqueue_client::Result<()> {
    let _ = stop.send(());
    rt.block_on(async {
        tokio::time::timeout(LIMIT, run).await.expect("the worker stops").expect("run does not panic")
    })
}

fn completed(c: &mut Client, q: &str) -> i64 {
    count(c, "SELECT count(*) FROM pgqueue.history WHERE queue = $1 AND outcome = 'completed'", q)
}

fn until_completed(c: &mut Client, q: &str, n: i64) {
    wait_for(&format!("{n} messages of {q} completed"), LIMIT, || (completed(c, q) >= n).then_some(()));
}

fn waiting_claims(c: &mut Client, q: &str) -> i64 {
    c.query_opt("SELECT waiting_claims FROM pgqueue.queue_depth WHERE queue = $1", &[&q])
        .unwrap()
        .map_or(0, |r| r.get(0))
}

#[test]
fn sends_belong_to_the_callers_transaction() {
    let _turn = common::file_turn(file!());
    let server = server();
    let rt = runtime();
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('sends')").unwrap();
    let mut client = async_client(&rt, &server);
    let in_queue = |c: &mut Client| count(c, "SELECT count(*) FROM pgqueue.messages WHERE queue = $1", "sends");

    // Rolled back: nothing, although ids were handed out.
    rt.block_on(async {
        let tx = client.transaction().await.unwrap();
        send(&tx, "sends", &json!({"n": 0}), SendOptions::default()).await.unwrap();
        let ids = send_batch(&tx, "sends", &[json!(1), json!(2)], SendOptions::default()).await.unwrap();
        assert_eq!(ids.len(), 2);
        tx.rollback().await.unwrap();
    });
    assert_eq!(in_queue(&mut c), 0);

    // Committed with a business write: both there, ids in payload order, options applied.
    let (one, batch) = rt.block_on(async {
        client.batch_execute("CREATE TABLE orders (id int)").await.unwrap();
        let tx = client.transaction().await.unwrap();
        tx.execute("INSERT INTO orders VALUES (1)", &[]).await.unwrap();
        let opts = SendOptions {
            priority: Some(5),
            headers: Some(json!({"trace": "t1"})),
            delay: Some(Duration::from_secs(3600)),
            ..Default::default()
        };
        let one = send(&tx, "sends", &json!({"order": 1}), opts).await.unwrap();
        let payloads: Vec<Value> = (0..100).map(|n| json!({"n": n})).collect();
        let batch = send_batch(&tx, "sends", &payloads, SendOptions::default()).await.unwrap();
        tx.commit().await.unwrap();
        (one, batch)
    });
    assert_eq!(in_queue(&mut c), 101);
    let r = c
        .query_one("SELECT state, priority, headers->>'trace' FROM pgqueue.messages WHERE msg_id = $1", &[&one])
        .unwrap();
    assert_eq!((r.get::<_, String>(0), r.get::<_, i16>(1), r.get::<_, String>(2)), ("delayed".into(), 5, "t1".into()));
    for (n, id) in batch.iter().enumerate() {
        let payload: Value =
            c.query_one("SELECT payload FROM pgqueue.messages WHERE msg_id = $1", &[id]).unwrap().get(0);
        assert_eq!(payload, json!({"n": n}));
    }

    rt.block_on(async {
        // On a plain client (autocommit), with a dedup key: the second send returns the first id.
        let key = || SendOptions { dedup_key: Some("k1".into()), ..Default::default() };
        let a = send(&client, "sends", &json!({}), key()).await.unwrap();
        let b = send(&client, "sends", &json!({}), key()).await.unwrap();
        assert_eq!(a, b);
        let keys =
            SendOptions { dedup_keys: Some(vec![Some("x".into()), None, Some("x".into())]), ..Default::default() };
        let ids = send_batch(&client, "sends", &[json!(1), json!(2), json!(3)], keys).await.unwrap();
        assert_eq!(ids[0], ids[2]);
        assert_ne!(ids[0], ids[1]);

        // Errors: the server's with their SQLSTATE, the client's own before any call.
        let e = send(&client, "nope", &json!({}), SendOptions::default()).await.unwrap_err();
        assert_eq!(e.sqlstate(), Some("42704"), "{e}");
        assert!(e.to_string().contains("42704"), "{e}");
        let e = send(&client, "sends", &json!({}), SendOptions { priority: Some(5000), ..Default::default() }).await;
        assert_eq!(e.unwrap_err().sqlstate(), Some("22023"));
        let e = send_batch(&client, "nope", &[json!(1)], SendOptions::default()).await.unwrap_err();
        assert_eq!(e.sqlstate(), Some("42704"));
        let bad = SendOptions { dedup_keys: Some(vec![None]), ..Default::default() };
        let e = send_batch(&client, "sends", &[json!(1), json!(2)], bad).await.unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert_eq!(e.sqlstate(), None);
    });
}

#[test]
fn a_worker_handles_every_message_exactly_once() {
    let _turn = common::file_turn(file!());
    let server = server();
    let rt = runtime();
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('many', lease => '60 s')").unwrap();
    let calls = Calls::default();
    let recorded = calls.clone();
    let config = WorkerConfig::new(server.dsn("postgres"), "many").concurrency(8).batch(20);
    let worker = start(&rt, config, move |msg| {
        recorded.record(&msg);
        async { Ok(()) }
    });
    // Sent while the worker runs (its first claim waits for them), in two transactions.
    let client = async_client(&rt, &server);
    let mut ids = vec![];
    for part in 0..2 {
        let payloads: Vec<Value> = (0..1000).map(|n| json!({"part": part, "n": n})).collect();
        ids.extend(rt.block_on(send_batch(&client, "many", &payloads, SendOptions::default())).unwrap());
    }
    until_completed(&mut c, "many", 2000);
    stop(&rt, worker).unwrap();

    let history = history(&mut c, "many");
    assert_eq!(history.len(), 2000);
    for id in &ids {
        assert_eq!(history[id].outcome, "completed");
        assert_eq!(history[id].attempt, 1, "message {id} was claimed more than once");
        assert_eq!(calls.of(*id), 1, "message {id} was handled {} times", calls.of(*id));
    }
    assert_eq!(calls.total(), 2000);
    assert_eq!(count(&mut c, "SELECT count(*) FROM pgqueue.messages WHERE queue = $1", "many"), 0);
}

fn io_work() -> std::io::Result<()> {
    Err(std::io::Error::other("disk on fire"))
}

#[test]
fn handler_errors_nack_with_their_text_or_dead_letter() {
    let _turn = common::file_turn(file!());
    let server = server();
    let rt = runtime();
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('errors', max_attempts => 3)").unwrap();
    let calls = Calls::default();
    let recorded = calls.clone();
    let config = WorkerConfig::new(server.dsn("postgres"), "errors").concurrency(4);
    let worker = start(&rt, config, move |msg| {
        recorded.record(&msg);
        async move {
            match msg.payload["kind"].as_str().unwrap() {
                // `?` on any std error: a retry with the server's backoff, until the last attempt.
                "io" => {
                    io_work()?;
                    Ok(())
                }
                "later" => Err(HandlerError::retry_in("smtp 451", Duration::from_secs(3600))),
                "bad" => Err(HandlerError::permanent("bad address")),
                "panic_once" if msg.attempt == 1 => panic!("first time unlucky"),
                _ => Ok(()),
            }
        }
    });
    let mut id = |kind: &str| -> i64 {
        c.query_one("SELECT pgqueue.pgq_send('errors', jsonb_build_object('kind', $1::text))", &[&kind]).unwrap().get(0)
    };
    let (io, later, bad, panic_once) = (id("io"), id("later"), id("bad"), id("panic_once"));

    let finished = |c: &mut Client| count(c, "SELECT count(*) FROM pgqueue.history WHERE queue = $1", "errors");
    // io: three attempts (1 s and 2 s backoff between); bad: at once; panic_once: at its second.
    wait_for("three messages finished", LIMIT, || (finished(&mut c) == 3).then_some(()));
    let nacked = wait_for("the nacked message delayed", LIMIT, || {
        let r = c
            .query_one("SELECT state, attempt, last_error FROM pgqueue.messages WHERE msg_id = $1", &[&later])
            .unwrap();
        (r.get::<_, String>(0) == "delayed").then(|| (r.get::<_, i32>(1), r.get::<_, Option<String>>(2)))
    });
    assert_eq!(nacked, (1, Some("smtp 451".into())), "nacked on its first attempt with the handler's error");
    stop(&rt, worker).unwrap();

    let history = history(&mut c, "errors");
    assert_eq!(history[&io].result(), ("dead", 3, Some("disk on fire")));
    assert_eq!(history[&bad].result(), ("dead", 1, Some("bad address")));
    assert_eq!(history[&panic_once].outcome, "completed");
    assert_eq!(history[&panic_once].attempt, 2);
    let panic_text = history[&panic_once].last_error.clone().unwrap_or_default();
    assert!(panic_text.contains("first time unlucky"), "{panic_text}");
    assert_eq!((calls.of(io), calls.of(later), calls.of(bad), calls.of(panic_once)), (3, 1, 1, 2));
}

#[test]
fn renewals_keep_a_long_job_past_its_lease() {
    let _turn = common::file_turn(file!());
    let server = server();
    let rt = runtime();
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('long', lease => '2 s')").unwrap();
    until_ticking(&mut c);
    let calls = Calls::default();
    let recorded = calls.clone();
    // The queue's lease (the worker is not told it); free slots to take the job again if
    // its claim were lost.
    let config = WorkerConfig::new(server.dsn("postgres"), "long").concurrency(4).wait(Duration::from_secs(30));
    let worker = start(&rt, config, move |msg| {
        recorded.record(&msg);
        async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(())
        }
    });
    // The claim has waited three leases when the message arrives: the lease runs from the
    // claim all the same, and the worker renews by it (not by the time since the statement
    // began, which would renew too late).
    wait_for("the worker's waiting claim", LIMIT, || (waiting_claims(&mut c, "long") == 1).then_some(()));
    std::thread::sleep(Duration::from_secs(6));
    let id: i64 = c.query_one("SELECT pgqueue.pgq_send('long', '{}')", &[]).unwrap().get(0);
    until_completed(&mut c, "long", 1);
    stop(&rt, worker).unwrap();

    let history = history(&mut c, "long");
    assert_eq!(history[&id].result(), ("completed", 1, None), "claimed once, never re-armed");
    assert_eq!(calls.of(id), 1);
    let rearmed: i64 = c.query_one("SELECT rearmed FROM pgqueue.worker_stats", &[]).unwrap().get(0);
    assert_eq!(rearmed, 0);
}

/// A job cancelled while its handler runs: the next renewal cancels the handler's
/// `msg.stop`, the handler returns, and its finish records the cancel; the
/// unique key stays held until then and is free after.
#[test]
fn a_cancelled_job_stops_its_handler_and_frees_its_key() {
    let _turn = common::file_turn(file!());
    let server = server();
    let rt = runtime();
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('cancelled', lease => '3 s')").unwrap();
    let send_key = |c: &mut Client| -> i64 {
        c.query_one("SELECT pgqueue.pgq_send('cancelled', '{}', dedup_key => 'k', dedup_for => '1 hour')", &[])
            .unwrap()
            .get(0)
    };
    let id = send_key(&mut c);
    let (started, stopped) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (on_start, on_stop) = (started.clone(), stopped.clone());
    let config = WorkerConfig::new(server.dsn("postgres"), "cancelled").wait(Duration::from_secs(1));
    let worker = start(&rt, config, move |msg| {
        let (on_start, on_stop) = (on_start.clone(), on_stop.clone());
        async move {
            on_start.notify_one();
            tokio::time::timeout(LIMIT, msg.stop.cancelled()).await.expect("told to stop");
            on_stop.notify_one();
            Ok(()) // returns normally: the worker records the cancel all the same
        }
    });
    rt.block_on(async { tokio::time::timeout(LIMIT, started.notified()).await.expect("the handler started") });
    let cancelled: bool =
        c.query_one("SELECT pgqueue.pgq_cancel($1::bigint, reason => 'not needed')", &[&id]).unwrap().get(0);
    assert!(cancelled);
    assert_eq!(send_key(&mut c), id, "the key is held while the handler runs");
    rt.block_on(async { tokio::time::timeout(LIMIT, stopped.notified()).await.expect("the handler stopped") });
    wait_for("the cancel recorded", LIMIT, || history(&mut c, "cancelled").get(&id).cloned());
    stop(&rt, worker).unwrap();
    assert_eq!(history(&mut c, "cancelled")[&id].result(), ("cancelled", 1, Some("not needed")));
    assert_ne!(send_key(&mut c), id, "the key is free once cancelled");
}

/// A handler reports progress, which its next renewal stores for `result` to read while it
/// runs, then sets a result, which its ack stores; a caller awaiting the message is woken at
/// the ack's commit, with both.
#[test]
fn a_handler_reports_progress_and_a_result_that_a_caller_awaits() {
    let _turn = common::file_turn(file!());
    let server = server();
    let rt = runtime();
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('results', lease => '3 s')").unwrap();
    let client = async_client(&rt, &server);
    let awaiter = rt.block_on(async {
        let dsn = format!("{} application_name=awaiter", server.dsn("postgres"));
        let (client, connection) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    });
    let release = Arc::new(Notify::new());
    let released = release.clone();
    let config = WorkerConfig::new(server.dsn("postgres"), "results").wait(Duration::from_secs(1));
    let worker = start(&rt, config, move |msg| {
        let released = released.clone();
        async move {
            msg.report_progress(json!({"done": 1}));
            tokio::time::timeout(LIMIT, released.notified()).await.expect("released");
            let sum = msg.payload["a"].as_i64().unwrap() + msg.payload["b"].as_i64().unwrap();
            msg.set_result(json!({ "sum": sum }));
            Ok(())
        }
    });
    let (unknown, id) = rt.block_on(async {
        let unknown = result(&client, -1, None, None).await.unwrap();
        (unknown, send(&client, "results", &json!({"a": 1, "b": 2}), SendOptions::default()).await.unwrap())
    });
    assert_eq!(unknown, None, "no such message");

    // Stored by a renewal (every second) while the handler runs.
    let running = wait_for("the progress", LIMIT, || {
        rt.block_on(result(&client, id, None, Some("results"))).unwrap().filter(|o| o.progress.is_some())
    });
    assert_eq!((running.state.as_str(), running.finished()), ("claimed", false));
    assert_eq!(running.progress, Some(json!({"done": 1})));

    // A caller awaits it; the handler finishes once the caller sleeps.
    let awaited = rt.spawn(async move {
        let start = std::time::Instant::now();
        (result(&awaiter, id, Some(Duration::from_secs(50)), Some("results")).await, start.elapsed())
    });
    wait_for("the caller's wait", LIMIT, || {
        let sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Extension'";
        (count(&mut c, sql, "awaiter") == 1).then_some(())
    });
    release.notify_one();
    let (outcome, took) = rt.block_on(awaited).unwrap();
    stop(&rt, worker).unwrap();
    let outcome = outcome.unwrap().expect("the message");
    assert!(took < Duration::from_secs(40), "woken at the ack's commit, not at the end of the wait ({took:?})");
    assert_eq!((outcome.state.as_str(), outcome.attempt, outcome.finished()), ("completed", 1, true));
    assert_eq!((outcome.result, outcome.progress), (Some(json!({"sum": 3})), Some(json!({"done": 1}))));
}

/// A `graph` row as (relation, id, state, on_parent_failure, finished).
type Related<'a> = (&'a str, i64, Option<&'a str>, Option<&'a str>, bool);

fn relations(rows: &[GraphRow]) -> Vec<Related<'_>> {
    rows.iter()
        .map(|r| (r.relation.as_str(), r.id, r.state.as_deref(), r.on_parent_failure.as_deref(), r.finished()))
        .collect()
}

/// A chain sent with `after`: the child is pending (and not claimed by the worker with room
/// for it) until the worker acks its parent; a batch waits for all of its parents, one of
/// another queue; `graph` shows both sides; an unknown parent is 23503.
#[test]
fn a_child_waits_until_the_worker_acks_its_parents() {
    let _turn = common::file_turn(file!());
    let server = server();
    let rt = runtime();
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('chain'); SELECT pgqueue.pgq_create_queue('elsewhere')").unwrap();
    let client = async_client(&rt, &server);
    let state = |id: i64| rt.block_on(result(&client, id, None, None)).unwrap().expect("the message").state;

    let (a, b, other, batch) = rt.block_on(async {
        let a = send(&client, "chain", &json!({"step": "a"}), SendOptions::default()).await.unwrap();
        let after_a = SendOptions { after: Some(vec![a]), ..Default::default() };
        let b = send(&client, "chain", &json!({"step": "b"}), after_a).await.unwrap();
        let other = send(&client, "elsewhere", &json!({}), SendOptions::default()).await.unwrap();
        let both = SendOptions {
            after: Some(vec![a, other]),
            on_parent_failure: Some(ParentFailure::Dead),
            priority: Some(3),
            ..Default::default()
        };
        let batch = send_batch(&client, "chain", &[json!({"n": 1}), json!({"n": 2})], both).await.unwrap();
        (a, b, other, batch)
    });
    assert_eq!(state(b), "pending");
    let of_b = rt.block_on(graph(&client, b)).unwrap();
    assert_eq!(
        relations(&of_b),
        [("message", b, Some("pending"), Some("cancel"), false), ("parent", a, Some("ready"), None, false)]
    );
    assert_eq!(of_b[1].queue.as_deref(), Some("chain"));
    let of_a = rt.block_on(graph(&client, a)).unwrap();
    assert_eq!(
        relations(&of_a),
        [
            ("message", a, Some("ready"), None, false),
            ("child", b, Some("pending"), Some("cancel"), false),
            ("child", batch[0], Some("pending"), Some("dead"), false),
            ("child", batch[1], Some("pending"), Some("dead"), false),
        ]
    );
    let of_batch = rt.block_on(graph(&client, batch[1])).unwrap();
    assert_eq!(
        of_batch.iter().map(|r| (r.relation.as_str(), r.id, r.queue.as_deref())).collect::<Vec<_>>(),
        [("message", batch[1], Some("chain")), ("parent", a, Some("chain")), ("parent", other, Some("elsewhere"))]
    );
    assert_eq!(ParentFailure::from_sql(of_batch[0].on_parent_failure.as_deref().unwrap()), Some(ParentFailure::Dead));
    assert!(rt.block_on(graph(&client, -1)).unwrap().is_empty(), "no such message");

    // The worker runs a: b and the batch wait, although it has room for them.
    let order = Arc::new(Mutex::new(vec![]));
    let recorded = order.clone();
    let config = WorkerConfig::new(server.dsn("postgres"), "chain").concurrency(4).wait(Duration::from_secs(1));
    let worker = start(&rt, config, move |msg| {
        recorded.lock().unwrap().push(msg.msg_id);
        async { Ok(()) }
    });
    until_completed(&mut c, "chain", 2);
    assert_eq!(*order.lock().unwrap(), [a, b], "b ran after a's ack");
    assert_eq!((state(batch[0]), state(batch[1])), ("pending".into(), "pending".into()), "other is not done");

    // Its last parent acked (by a plain claim on the other queue): the batch runs.
    let acked: bool = c
        .query_one(
            "SELECT pgqueue.pgq_ack(msg_id => c.msg_id, claim_token => c.claim_token) \
               FROM pgqueue.pgq_claim(queue => 'elsewhere', qty => 1) c",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(acked);
    until_completed(&mut c, "chain", 4);
    stop(&rt, worker).unwrap();
    assert_eq!(
        order.lock().unwrap()[2..].iter().copied().collect::<std::collections::BTreeSet<_>>(),
        batch.iter().copied().collect()
    );
    let of_b = rt.block_on(graph(&client, b)).unwrap();
    assert_eq!(
        relations(&of_b),
        [("message", b, Some("completed"), None, true), ("parent", a, Some("completed"), None, true)]
    );
    assert!(of_b[1].finished_at <= of_b[0].finished_at);

    rt.block_on(async {
        let unknown = SendOptions { after: Some(vec![a, -5]), ..Default::default() };
        let e = send(&client, "chain", &json!({}), unknown).await.unwrap_err();
        assert_eq!(e.sqlstate(), Some("23503"), "{e}");
        let twice = SendOptions { after: Some(vec![a, a]), ..Default::default() };
        let e = send_batch(&client, "chain", &[json!(1)], twice).await.unwrap_err();
        assert_eq!(e.sqlstate(), Some("22023"), "{e}");
        // Sent after a completed parent, with 'run': ready at once.
        let run =
            SendOptions { after: Some(vec![a]), on_parent_failure: Some(ParentFailure::Run), ..Default::default() };
        let id = send(&client, "elsewhere", &json!({}), run).await.unwrap();
        assert_eq!(result(&client, id, None, None).await.unwrap().unwrap().state, "ready");
    });
}

/// Parking: a handler that returns `HandlerError::park`, or calls `park` itself (then neither
/// renewed nor acked; a second call is false, the claim having ended), waits for `signal`,
/// which resumes it — not as a new attempt — with the signal's payload in its `pgq_park`
/// header; a signal sent before the park resumes it at once; timeouts resume or dead-letter;
/// a park the server refuses is nacked with its error; bad keys and timeouts are 22023.
#[test]
fn a_handler_parks_its_job_until_a_signal_or_its_timeout() {
    let _turn = common::file_turn(file!());
    let server = server();
    let rt = runtime();
    let mut c = server.connect("postgres");
    c.batch_execute(
        "SELECT pgqueue.pgq_create_queue('parking', lease => '3 s'); SELECT pgqueue.pgq_create_queue('elsewhere')",
    )
    .unwrap();
    let client = Arc::new(async_client(&rt, &server));
    let state = |id: i64| rt.block_on(result(&*client, id, None, None)).unwrap().expect("the message").state;

    // A signal before any park: kept (the server's default, a day) for the park to come.
    assert_eq!(rt.block_on(signal(&*client, "early", Some(&json!("first")), None)).unwrap(), 0);
    let kinds = ["returns park", "calls park", "early", "times out", "dies", "refused"];
    let ids = rt.block_on(send_batch(&*client, "parking", &kinds.map(|k| json!(k)), SendOptions::default())).unwrap();
    let id = |kind: &str| ids[kinds.iter().position(|k| *k == kind).unwrap()];

    let calls = Calls::default();
    let recorded = calls.clone();
    let handler_client = client.clone();
    let config = WorkerConfig::new(server.dsn("postgres"), "parking").concurrency(6).wait(Duration::from_secs(1));
    let worker = start(&rt, config, move |msg| {
        recorded.record(&msg);
        let client = handler_client.clone();
        async move {
            if let Some(header) = msg.headers.as_ref().and_then(|h| h.get("pgq_park")) {
                msg.set_result(header.clone()); // resumed: what it found, for the test to read
                return Ok(());
            }
            let (hour, second) = (Duration::from_secs(3600), Duration::from_secs(1));
            match msg.payload.as_str().unwrap() {
                "returns park" => {
                    let options =
                        ParkOptions { payload: Some(json!({"waiting_for": "payment"})), ..Default::default() };
                    Err(HandlerError::park("returned", hour, options))
                }
                "calls park" => {
                    let zero = park(&*client, &msg, "called", Duration::ZERO, ParkOptions::default()).await;
                    assert_eq!(zero.unwrap_err().sqlstate(), Some("22023"), "a timeout of 0");
                    let of = |queue: &str| ParkOptions { queue: Some(queue.into()), ..Default::default() };
                    assert!(!park(&*client, &msg, "called", hour, of("elsewhere")).await?, "another queue's");
                    assert!(park(&*client, &msg, "called", hour, of("parking")).await?);
                    assert!(!park(&*client, &msg, "called", hour, ParkOptions::default()).await?, "the claim ended");
                    tokio::time::sleep(Duration::from_millis(1500)).await; // a renewal would be due: none is made
                    Ok(()) // not acked: the message is parked
                }
                "early" => Err(HandlerError::park("early", hour, ParkOptions::default())),
                "times out" => Err(HandlerError::park("never signalled", second, ParkOptions::default())),
                "dies" => {
                    let dead = ParkOptions { on_timeout: Some(OnTimeout::Dead), ..Default::default() };
                    Err(HandlerError::park("never signalled", second, dead))
                }
                _ if msg.attempt == 1 => Err(HandlerError::park("", hour, ParkOptions::default())), // refused
                _ => Ok(()),
            }
        }
    });

    wait_for("two parked until a signal", LIMIT, || {
        (state(id("returns park")) == "parked" && state(id("calls park")) == "parked").then_some(())
    });
    rt.block_on(async {
        assert_eq!(signal(&*client, "returned", Some(&json!({"paid": true})), None).await.unwrap(), 1);
        assert_eq!(signal(&*client, "returned", None, None).await.unwrap(), 0, "kept: a second one changes nothing");
        assert_eq!(signal(&*client, "called", Some(&json!("approved")), Some(Duration::ZERO)).await.unwrap(), 1);
    });
    until_completed(&mut c, "parking", 5);
    wait_for("six finished", LIMIT, || (history(&mut c, "parking").len() == 6).then_some(()));
    stop(&rt, worker).unwrap();

    let history = history(&mut c, "parking");
    for kind in ["returns park", "calls park", "early", "times out"] {
        assert_eq!(history[&id(kind)].result(), ("completed", 1, None), "{kind}: resumed, not a new attempt");
        assert_eq!(calls.of(id(kind)), 2, "{kind}");
    }
    assert_eq!(history[&id("dies")].result(), ("dead", 1, Some("parked, and no signal came before its timeout")));
    let refused = &history[&id("refused")];
    assert_eq!((refused.outcome.as_str(), refused.attempt, calls.of(id("refused"))), ("completed", 2, 2));
    let error = refused.last_error.as_deref().unwrap_or_default();
    assert!(error.starts_with("park refused: ERROR (22023): pgqueue: invalid value for \"key\""), "{error}");

    let header = |kind: &str| rt.block_on(result(&*client, id(kind), None, None)).unwrap().unwrap().result.unwrap();
    let returned = header("returns park");
    assert_eq!(
        [&returned["key"], &returned["on_timeout"], &returned["payload"], &returned["signal"]],
        [&json!("returned"), &json!("resume"), &json!({"waiting_for": "payment"}), &json!({"paid": true})]
    );
    assert!(returned.get("resumed_at").is_some() && returned.get("timed_out").is_none());
    assert_eq!(header("calls park")["signal"], json!("approved"));
    assert_eq!(header("early")["signal"], json!("first"), "the kept signal resumed it at once");
    let timed_out = header("times out");
    assert_eq!((&timed_out["timed_out"], timed_out.get("signal")), (&json!(true), None));
    assert_eq!(OnTimeout::from_sql(timed_out["on_timeout"].as_str().unwrap()), Some(OnTimeout::Resume));

    rt.block_on(async {
        for key in [String::new(), "k".repeat(513)] {
            let e = signal(&*client, &key, None, None).await.unwrap_err();
            assert_eq!(e.sqlstate(), Some("22023"), "{e}");
        }
        let e = signal(&*client, "k", None, Some(Duration::from_secs(366 * 86_400))).await.unwrap_err();
        assert_eq!(e.sqlstate(), Some("22023"), "{e}");
        assert_eq!(signal(&*client, "never signalled", None, None).await.unwrap(), 0, "nothing parked on it now");
    });
}

/// Progress and a result larger than `pgqueue.max_payload_bytes` (54000): the renewal and the
/// ack go on without them, and the job completes on its first attempt.
#[test]
fn a_result_or_progress_the_server_refuses_is_left_out() {
    let _turn = common::file_turn(file!());
    let server = server();
    let rt = runtime();
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('refused', lease => '2 s')").unwrap();
    let dsn = format!("{} options='-c pgqueue.max_payload_bytes=64'", server.dsn("postgres"));
    let config = WorkerConfig::new(dsn, "refused").wait(Duration::from_secs(1));
    let worker = start(&rt, config, |msg| async move {
        let big = json!("x".repeat(100));
        msg.report_progress(big.clone());
        tokio::time::sleep(Duration::from_secs(3)).await; // past the lease: renewed all the same
        msg.set_result(big);
        Ok(())
    });
    let id: i64 = c.query_one("SELECT pgqueue.pgq_send('refused', '{}')", &[]).unwrap().get(0);
    until_completed(&mut c, "refused", 1);
    stop(&rt, worker).unwrap();
    let client = async_client(&rt, &server);
    let outcome = rt.block_on(result(&client, id, None, None)).unwrap().expect("the message");
    assert_eq!((outcome.state.as_str(), outcome.attempt), ("completed", 1));
    assert_eq!((outcome.result, outcome.progress), (None, None));
}

#[test]
fn a_stopping_worker_finishes_or_gives_back_what_it_holds() {
    let _turn = common::file_turn(file!());
    let server = server();
    let rt = runtime();
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('stop')").unwrap();

    // Idle in a 60 s waiting claim: stopping cancels it rather than waiting it out.
    let config = WorkerConfig::new(server.dsn("postgres"), "stop").wait(Duration::from_secs(60));
    let idle = start(&rt, config, |_| async { Ok(()) });
    wait_for("the idle worker's waiting claim", LIMIT, || (waiting_claims(&mut c, "stop") == 1).then_some(()));
    let _ = idle.0.send(());
    let stopped = rt.block_on(async { tokio::time::timeout(Duration::from_secs(40), idle.1).await });
    stopped.expect("stops without waiting out its claim").unwrap().unwrap();
    wait_for("no waiting claim", LIMIT, || (waiting_claims(&mut c, "stop") == 0).then_some(()));

    // Two handlers that finish soon after the stop, two that never finish.
    let ids: Vec<i64> = c
        .query("SELECT pgqueue.pgq_send('stop', jsonb_build_object('hang', g > 2)) FROM generate_series(1, 4) g", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let calls = Calls::default();
    let recorded = calls.clone();
    let (stopping_tx, stopping) = tokio::sync::watch::channel(false);
    let config = WorkerConfig::new(server.dsn("postgres"), "stop").concurrency(4).grace(Duration::from_secs(5));
    let worker = start(&rt, config, move |msg| {
        recorded.record(&msg);
        let mut stopping = stopping.clone();
        async move {
            if msg.payload["hang"].as_bool().unwrap() {
                std::future::pending::<()>().await;
            }
            let _ = stopping.wait_for(|s| *s).await;
            Ok(())
        }
    });
    wait_for("four handlers running", LIMIT, || (calls.total() == 4).then_some(()));
    stopping_tx.send_replace(true);
    stop(&rt, worker).unwrap();

    let history = history(&mut c, "stop");
    assert_eq!(history.len(), 2);
    for id in &ids[..2] {
        assert_eq!(history[id].outcome, "completed");
    }
    for id in &ids[2..] {
        let r =
            c.query_one("SELECT state, attempt, last_error FROM pgqueue.messages WHERE msg_id = $1", &[id]).unwrap();
        assert_eq!(r.get::<_, String>(0), "ready", "message {id} given back for now");
        assert_eq!(r.get::<_, i32>(1), 1);
        assert_eq!(r.get::<_, String>(2), "worker stopped before the handler finished");
    }
}

#[test]
fn a_worker_reconnects_after_terminated_sessions_and_a_restart() {
    let _turn = common::file_turn(file!());
    let server = server();
    let rt = runtime();
    let mut c = server.connect("postgres");
    c.batch_execute("SELECT pgqueue.pgq_create_queue('chaos', lease => '30 s')").unwrap();
    let calls = Calls::default();
    let recorded = calls.clone();
    let dsn = format!("{} application_name=chaos_worker", server.dsn("postgres"));
    let config = WorkerConfig::new(dsn, "chaos").concurrency(4).max_backoff(Duration::from_secs(1));
    let worker = start(&rt, config, move |msg| {
        recorded.record(&msg);
        async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(())
        }
    });
    let send = |c: &mut Client, n: i64| {
        c.execute("SELECT pgqueue.pgq_send('chaos', '{}') FROM generate_series(1, $1::bigint)", &[&n]).unwrap();
    };
    let terminate = |c: &mut Client| {
        let pids: Vec<i32> = c
            .query("SELECT pid FROM pg_stat_activity WHERE application_name = 'chaos_worker'", &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(pids.len(), 2, "the worker's claim and finishing connections");
        for pid in pids {
            let killed: bool = c.query_one("SELECT pg_terminate_backend($1)", &[&pid]).unwrap().get(0);
            assert!(killed);
        }
    };
    let idle = |c: &mut Client| {
        wait_for("the worker idle in a waiting claim", LIMIT, || (waiting_claims(c, "chaos") == 1).then_some(()))
    };

    // Its sessions terminated while it works, then while it waits in a claim.
    send(&mut c, 300);
    wait_for("work under way", LIMIT, || (completed(&mut c, "chaos") >= 50).then_some(()));
    terminate(&mut c);
    until_completed(&mut c, "chaos", 300);
    idle(&mut c);
    terminate(&mut c);
    send(&mut c, 100);
    until_completed(&mut c, "chaos", 400);

    // The server restarted while it works, then while it waits in a claim.
    send(&mut c, 300);
    wait_for("work under way again", LIMIT, || (completed(&mut c, "chaos") >= 450).then_some(()));
    server.restart();
    let mut c = server.connect("postgres");
    until_completed(&mut c, "chaos", 700);
    idle(&mut c);
    server.restart();
    let mut c = server.connect("postgres");
    send(&mut c, 100);
    until_completed(&mut c, "chaos", 800);
    let reconnected: i64 =
        count(&mut c, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", "chaos_worker");
    assert_eq!(reconnected, 2);
    stop(&rt, worker).unwrap();

    // Every message completed once; a handler ran again only for a claim that was lost
    // (its attempt says so), never twice within one claim.
    let history = history(&mut c, "chaos");
    assert_eq!(history.len(), 800);
    for (id, Finished { outcome, attempt, .. }) in &history {
        assert_eq!(outcome, "completed");
        let ran = calls.of(*id);
        assert!(ran >= 1 && ran <= *attempt as u32, "message {id} handled {ran} times in {attempt} claims");
    }
    assert_eq!(count(&mut c, "SELECT count(*) FROM pgqueue.messages WHERE queue = $1", "chaos"), 0);
}

#[test]
fn an_unknown_queue_or_a_bad_setting_is_an_error() {
    let _turn = common::file_turn(file!());
    let server = server();
    let rt = runtime();
    let config = WorkerConfig::new(server.dsn("postgres"), "no_such_queue");
    let (_stop, run) = start(&rt, config, |_| async { Ok(()) });
    let e = rt.block_on(async { tokio::time::timeout(LIMIT, run).await }).expect("run returns").unwrap().unwrap_err();
    assert_eq!(e.sqlstate(), Some("42704"), "{e}");
    assert!(!e.is_transient());

    let bad = [
        WorkerConfig::new(server.dsn("postgres"), "q").concurrency(0),
        WorkerConfig::new(server.dsn("postgres"), "q").batch(1001),
        WorkerConfig::new(server.dsn("postgres"), "q").wait(Duration::ZERO),
        WorkerConfig::new(server.dsn("postgres"), "q").wait(Duration::from_secs(61)),
        WorkerConfig::new(server.dsn("postgres"), "q").lease(Duration::ZERO),
    ];
    for config in bad {
        let e = rt.block_on(Worker::new(config, |_| async { Ok(()) }).run(std::future::pending())).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }
    let e = rt.block_on(Worker::new(WorkerConfig::new("port=notanumber", "q"), |_| async { Ok(()) }).run(async {}));
    assert!(matches!(e, Err(Error::Postgres(_))));
}
