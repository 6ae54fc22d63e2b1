//! The console at size (issue 29): how long its pages take to answer with few queues and a
//! small history, and with many queues and a large one, side by side in one run. The console
//! runs in this process on a loopback port; a page's time is that of its GET (loopback: the
//! server's time plus a fraction of a millisecond).

use postgres::{Client, NoTls};
use serde::Serialize;
use std::time::{Duration, Instant};

#[derive(Serialize, Clone)]
pub struct ConsolePage {
    pub queues: i64,
    pub history_rows: i64,
    pub page: String,
    pub p50_ms: f64,
    pub max_ms: f64,
    /// p50 ÷ the same page's p50 at the first (smallest) size.
    pub of_smallest: f64,
}

/// Queues of this scenario: `cs_0` … (dropped before each size and after the last).
const PREFIX: &str = "cs_";

/// The pages measured, with `{q}` for a queue, `{id}` for a finished job's id and `{idq}` for
/// its queue.
pub const PAGES: [(&str, &str); 6] = [
    ("overview", "/"),
    ("queue", "/queues/{q}"),
    ("job by id, from a link (with its queue)", "/jobs/{id}?queue={idq}"),
    ("job by id alone (in history)", "/jobs/{id}"),
    ("dead letters of a queue", "/dead?queue={q}"),
    ("search by id", "/jobs?id={id}"),
];

/// One transaction per queue: each holds the locks of its history partitions until commit.
fn drop_queues(c: &mut Client) {
    let names: Vec<String> = c
        .query("SELECT queue FROM pgqueue.queues WHERE queue LIKE $1", &[&format!("{PREFIX}%")])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for q in names {
        c.execute("SELECT pgqueue.pgq_drop_queue($1, force => true)", &[&q]).unwrap();
    }
}

/// `queues` queues, each with a few waiting, delayed and claimed messages and an hour of
/// minute rollups; `rows` finished messages spread over them (1 in 100 dead), finished in
/// the last hour. Returns the id of a finished one and its queue. Waits until the worker
/// knows every queue's counts (those written around the API included: as after a restore).
fn fill(c: &mut Client, queues: i64, rows: i64) -> (i64, String) {
    drop_queues(c);
    for q in 0..queues {
        let name = format!("{PREFIX}{q}");
        c.batch_execute(&format!(
            "SELECT pgqueue.pgq_create_queue('{name}');
             SELECT pgqueue.pgq_send_batch('{name}', array_fill('{{\"n\": 1}}'::jsonb, ARRAY[10]));
             SELECT pgqueue.pgq_send('{name}', '{{}}', delay => '1 hour');
             SELECT count(*) FROM pgqueue.pgq_claim('{name}', 2);
             INSERT INTO pgqueue.queue_minutes (queue, minute, sent, completed, dead, retried, ready, delayed, claimed)
             SELECT '{name}', date_trunc('minute', now()) - m * interval '1 minute', 100, 99, 1, 0, 10, 1, 2
               FROM generate_series(1, 60) m;"
        ))
        .unwrap();
    }
    // A million rows a transaction.
    const CHUNK: i64 = 1_000_000;
    for from in (1..=rows).step_by(CHUNK as usize) {
        let to = (from + CHUNK - 1).min(rows);
        c.batch_execute(&format!(
            "INSERT INTO pgqueue.history (msg_id, queue, outcome, priority, attempt, payload, enqueued_at, finished_at,
                                          last_error)
             SELECT -g, '{PREFIX}' || (g % {queues}), CASE WHEN g % 100 = 0 THEN 'dead' ELSE 'completed' END, 0, 1,
                    jsonb_build_object('order', g), now() - interval '2 hours', now() - (g % 3000) * interval '1 second',
                    CASE WHEN g % 100 = 0 THEN 'upstream timeout' END
               FROM generate_series({from}, {to}) g"
        ))
        .unwrap();
    }
    c.batch_execute("VACUUM ANALYZE pgqueue.history_rows").unwrap();
    c.batch_execute("ANALYZE pgqueue.message_rows").unwrap();
    // The rows above went around the API (as a restore's would): the tick's validation at the
    // prune cadence counts them. Ticks here too, in case no worker runs in this database.
    c.batch_execute("UPDATE pgqueue.worker_state SET last_prune_at = NULL").unwrap();
    let start = Instant::now();
    let names: Vec<String> = (0..queues).map(|q| format!("{PREFIX}{q}")).collect();
    loop {
        c.batch_execute("SELECT * FROM pgqueue.pgq_tick()").unwrap();
        // A queue at a time: a count locks the queue's history partitions.
        let wrong = names.iter().any(|q| {
            let r = c
                .query_one(
                    "SELECT (SELECT dead FROM pgqueue.queue_depth WHERE queue = $1) IS NOT DISTINCT FROM pgqueue._dead_count($1)
                        AND (SELECT ready FROM pgqueue.queue_depth WHERE queue = $1) IS NOT NULL",
                    &[q],
                )
                .unwrap();
            !r.get::<_, bool>(0)
        });
        if !wrong {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(600), "the tick did not count the queues");
    }
    let g = (rows / 2).max(1);
    (-g, format!("{PREFIX}{}", g % queues))
}

fn get(url: &str) -> Duration {
    let t = Instant::now();
    let r = ureq::get(url).call().unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(r.status(), 200, "GET {url}");
    r.into_string().unwrap();
    t.elapsed()
}

/// Each of `sizes` (queues, history rows) in turn, every page `rounds` times after one
/// unmeasured warm-up each.
pub fn measure(dsn: &str, sizes: &[(i64, i64)], rounds: usize, say: impl Fn(&str)) -> Vec<ConsolePage> {
    let mut c = Client::connect(dsn, NoTls).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let config = pgqueue_console::Config::new(dsn.to_string());
    rt.spawn(async move { pgqueue_console::serve(config, listener).await });
    let mut out: Vec<ConsolePage> = vec![];
    for &(queues, rows) in sizes {
        say(&format!("console: {queues} queues, {rows} history rows"));
        let (id, id_queue) = fill(&mut c, queues, rows);
        for (page, path) in PAGES {
            let path = path.replace("{q}", &format!("{PREFIX}1")).replace("{idq}", &id_queue);
            let url = base.clone() + &path.replace("{id}", &id.to_string());
            get(&url);
            let mut times: Vec<Duration> = (0..rounds).map(|_| get(&url)).collect();
            times.sort();
            let ms = |d: Duration| d.as_secs_f64() * 1000.0;
            let p50_ms = ms(times[times.len() / 2]);
            let first = out.iter().find(|p| p.page == page).map_or(p50_ms, |p| p.p50_ms);
            out.push(ConsolePage {
                queues,
                history_rows: rows,
                page: page.into(),
                p50_ms,
                max_ms: ms(*times.last().unwrap()),
                of_smallest: p50_ms / first,
            });
        }
    }
    drop_queues(&mut c);
    drop(rt);
    out
}
