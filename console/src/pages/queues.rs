//! The overview, a queue's page and the schedules: counts from the views, the last hour
//! from `pgqueue.queue_minutes`, the worker's health.

use super::{Avail, Ctx, avail, render};
use crate::charts::{self, Series, Summary, Svg};
use crate::db::Failure;
use crate::format::{duration, time};
use crate::web::{Shared, Visitor, html};
use askama::Template;
use axum::Extension;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use deadpool_postgres::Object;
use std::collections::HashMap;

// --- overview --------------------------------------------------------------------------

pub struct QueueRow {
    pub queue: String,
    pub paused: bool,
    pub ready: i64,
    pub delayed: i64,
    pub claimed: i64,
    pub expired: i64,
    pub dead: i64,
    pub waiting: i64,
    pub oldest_ready: String,
    pub spark: Option<Svg>,
}

pub struct Worker {
    /// Whether it has ticked at all in this database.
    pub started: bool,
    pub pid: String,
    pub last_tick: String,
    pub since_last_tick: String,
    pub healthy: bool,
    pub ticks: i64,
    pub tick_failures: i64,
    pub step_failures: Vec<(String, i64)>,
    pub last_error: Option<String>,
    pub last_error_at: String,
}

#[derive(Template)]
#[template(path = "overview.html")]
struct Overview {
    ctx: Ctx,
    queues: Vec<QueueRow>,
    worker: Option<Worker>,
    charts_note: Option<String>,
}

/// A queue's last hour, one slot a minute, oldest first.
#[derive(Clone)]
pub struct Hour {
    pub sent: Vec<Option<f64>>,
    pub completed: Vec<Option<f64>>,
    pub failed: Vec<Option<f64>>,
    pub ready: Vec<Option<f64>>,
    pub delayed: Vec<Option<f64>>,
    pub claimed: Vec<Option<f64>>,
}

const MINUTES: usize = 60;

impl Hour {
    fn idle() -> Hour {
        // A minute without a row had no activity; its depth is unknown.
        let zero = vec![Some(0.0); MINUTES];
        Hour { sent: zero.clone(), completed: zero.clone(), failed: zero, ..Hour::blank() }
    }

    fn blank() -> Hour {
        let none = vec![None; MINUTES];
        Hour {
            sent: none.clone(),
            completed: none.clone(),
            failed: none.clone(),
            ready: none.clone(),
            delayed: none.clone(),
            claimed: none,
        }
    }
}

/// The last hour's minute rollups of every queue ($1 NULL) or one: queue by queue through the
/// primary key, so the hour's rows only are read, not the retention's.
pub const LAST_HOUR_SQL: &str = "SELECT q.queue,
        (extract(epoch FROM m.minute - (date_trunc('minute', now()) - interval '59 minutes')) / 60)::int,
        m.sent, m.completed, m.dead, m.retried, m.ready, m.delayed, m.claimed
   FROM pgqueue.queues q
   JOIN LATERAL (SELECT * FROM pgqueue.queue_minutes m
      WHERE m.queue = q.queue AND m.minute > date_trunc('minute', now()) - interval '60 minutes'
      ORDER BY m.minute) m ON true
              WHERE $1::text IS NULL OR q.queue = $1";

/// The last hour of `pgqueue.queue_minutes`, by queue (all queues, or one).
async fn last_hour(client: &Object, queue: Option<&str>) -> Result<HashMap<String, Hour>, Failure> {
    let rows = client.query(LAST_HOUR_SQL, &[&queue]).await?;
    let mut out: HashMap<String, Hour> = HashMap::new();
    for r in rows {
        let slot: i32 = r.get(1);
        let Ok(slot) = usize::try_from(slot) else { continue };
        if slot >= MINUTES {
            continue;
        }
        let h = out.entry(r.get(0)).or_insert_with(Hour::idle);
        let n = |i: usize| r.get::<_, Option<i64>>(i).map(|v| v as f64);
        h.sent[slot] = n(2).or(Some(0.0));
        h.completed[slot] = n(3).or(Some(0.0));
        h.failed[slot] = Some(n(4).unwrap_or(0.0) + n(5).unwrap_or(0.0));
        h.ready[slot] = n(6);
        h.delayed[slot] = n(7);
        h.claimed[slot] = n(8);
    }
    Ok(out)
}

fn throughput_spark(h: &Hour) -> Svg {
    charts::sparkline(
        &[
            Series { name: "completed", class: "completed", values: &h.completed, summary: Summary::Total },
            Series { name: "failed", class: "failed", values: &h.failed, summary: Summary::Total },
        ],
        120,
        24,
    )
}

async fn worker(client: &Object) -> Result<Option<Worker>, Failure> {
    // The row as JSON for the counters, so a step added in a later release shows up here
    // without a change (every `*_failures` column is a step's).
    let row = client
        .query_opt(
            "SELECT pid, last_tick_at, extract(epoch FROM since_last_tick)::float8, tick_interval_ms, ticks,
                    tick_failures, last_error, last_error_at, to_jsonb(w)
               FROM pgqueue.worker_stats w",
            &[],
        )
        .await?;
    Ok(row.map(|r| {
        let since: Option<f64> = r.get(2);
        let interval_ms: Option<i32> = r.get(3);
        // Late: more than ten ticks' worth, and at least ten seconds, since the last tick.
        let limit = (interval_ms.unwrap_or(1000) as f64 / 100.0).max(10.0);
        let all: serde_json::Value = r.get(8);
        let mut step_failures: Vec<(String, i64)> = all
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.strip_suffix("_failures")?.to_string(), v.as_i64()?)))
            .filter(|(k, v)| k != "tick" && *v > 0)
            .collect();
        step_failures.sort();
        Worker {
            started: r.get::<_, Option<DateTime<Utc>>>(1).is_some(),
            pid: r.get::<_, Option<i32>>(0).map(|p| p.to_string()).unwrap_or_else(|| "—".into()),
            last_tick: time(r.get(1)),
            since_last_tick: duration(since),
            healthy: since.is_some_and(|s| s < limit),
            ticks: r.get::<_, Option<i64>>(4).unwrap_or(0),
            tick_failures: r.get::<_, Option<i64>>(5).unwrap_or(0),
            step_failures,
            last_error: r.get(6),
            last_error_at: time(r.get(7)),
        }
    }))
}

/// The counts of every queue ($1 NULL) or one, for the overview and a queue's page.
pub const COUNTS_SQL: &str = "SELECT queue, paused, ready, delayed, claimed, expired_claims, dead,
        extract(epoch FROM oldest_ready_age)::float8, waiting_claims, tracked
   FROM pgqueue.queue_overview WHERE $1::text IS NULL OR queue = $1 ORDER BY queue";

/// The queues' counts (all, or one) from `pgqueue.queue_overview`, which reads O(queues)
/// buffers whatever the backlog and history; with whether the shared state tracks each. A
/// queue whose counts the shared state does not know (a new queue before the worker's next
/// tick, the library not preloaded) is counted by `pgqueue.queue_stats`, one statement per
/// queue: each commits on its own, holding only that queue's partitions' locks.
async fn counts(client: &Object, queue: Option<&str>) -> Result<Vec<(QueueRow, bool)>, Failure> {
    let rows = client.query(COUNTS_SQL, &[&queue]).await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let mut known: [Option<i64>; 4] = [r.get(2), r.get(3), r.get(4), r.get(6)];
        let queue: String = r.get(0);
        if known.iter().any(Option::is_none)
            && let Some(c) = client
                .query_opt("SELECT ready, delayed, claimed, dead FROM pgqueue.queue_stats WHERE queue = $1", &[&queue])
                .await?
        {
            known = [c.get(0), c.get(1), c.get(2), c.get(3)];
        }
        let [ready, delayed, claimed, dead] = known.map(|n| n.unwrap_or(0));
        let row = QueueRow {
            paused: r.get(1),
            ready,
            delayed,
            claimed,
            expired: r.get(5),
            dead,
            oldest_ready: duration(r.get(7)),
            waiting: r.get(8),
            spark: None,
            queue,
        };
        out.push((row, r.get(9)));
    }
    Ok(out)
}

pub async fn overview(State(app): Shared, Extension(visitor): Extension<Visitor>) -> Response {
    render(&visitor, async {
        let (client, caps) = app.connect().await?;
        let counted = counts(&client, None).await?;
        let (hours, charts_note) = match avail(last_hour(&client, None).await, "charts")? {
            Avail::Yes(h) => (Some(h), None),
            Avail::No(note) => (None, Some(note)),
        };
        let queues = counted
            .into_iter()
            .map(|(mut q, _)| {
                q.spark = hours.as_ref().map(|h| throughput_spark(h.get(&q.queue).unwrap_or(&Hour::idle())));
                q
            })
            .collect();
        let worker = worker(&client).await?;
        Ok(html(
            StatusCode::OK,
            &Overview { ctx: Ctx::new("Overview", "overview", visitor.clone(), caps), queues, worker, charts_note },
        ))
    })
    .await
}

// --- queue -----------------------------------------------------------------------------

pub struct Claim {
    pub msg_id: i64,
    pub consumer: String,
    pub attempt: i32,
    pub claimed_at: String,
    pub lease_left: String,
    pub expired: bool,
}

pub struct ScheduleRow {
    pub name: String,
    pub queue: String,
    pub cron: String,
    pub paused: bool,
    pub next_run: String,
    pub last_run: String,
    pub runs: i64,
    pub failures: i64,
    pub last_error: Option<String>,
    pub last_error_at: String,
}

#[derive(Template)]
#[template(path = "queue.html")]
struct QueuePage {
    ctx: Ctx,
    q: QueueRow,
    tracked: bool,
    settings: Avail<Vec<(&'static str, String)>>,
    claims: Avail<Vec<Claim>>,
    depth_chart: Avail<Svg>,
    throughput_chart: Option<Svg>,
    schedules: Vec<ScheduleRow>,
}

async fn schedules_of(client: &Object, queue: Option<&str>) -> Result<Vec<ScheduleRow>, Failure> {
    let rows = client
        .query(
            "SELECT name, queue, cron, time_zone, paused, next_run_local::text, last_run, runs, failures,
                    last_error, last_error_at
               FROM pgqueue.schedule_stats WHERE $1::text IS NULL OR queue = $1 ORDER BY name",
            &[&queue],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let zone: String = r.get(3);
            ScheduleRow {
                name: r.get(0),
                queue: r.get(1),
                cron: r.get(2),
                next_run: r
                    .get::<_, Option<String>>(5)
                    .map(|t| format!("{t} {zone}"))
                    .unwrap_or_else(|| "never again".into()),
                paused: r.get(4),
                last_run: time(r.get(6)),
                runs: r.get(7),
                failures: r.get(8),
                last_error: r.get(9),
                last_error_at: time(r.get(10)),
            }
        })
        .collect())
}

pub async fn queue(State(app): Shared, Extension(visitor): Extension<Visitor>, Path(queue): Path<String>) -> Response {
    render(&visitor, async {
        let (client, caps) = app.connect().await?;
        let (q, tracked) = counts(&client, Some(&queue))
            .await?
            .pop()
            .ok_or_else(|| Failure::NotFound(format!("no queue {queue}")))?;
        let hour = avail(last_hour(&client, Some(&queue)).await, "charts")?;
        let (depth_chart, throughput_chart) = match hour {
            Avail::Yes(mut h) => {
                let h = h.remove(&queue).unwrap_or_else(Hour::idle);
                let depth = charts::chart(
                    "depth, last hour",
                    &[
                        Series { name: "ready", class: "ready", values: &h.ready, summary: Summary::Latest },
                        Series { name: "delayed", class: "delayed", values: &h.delayed, summary: Summary::Latest },
                        Series { name: "claimed", class: "claimed", values: &h.claimed, summary: Summary::Latest },
                    ],
                    "-60 min",
                    "now",
                );
                let throughput = charts::chart(
                    "throughput, last hour",
                    &[
                        Series { name: "sent", class: "sent", values: &h.sent, summary: Summary::Total },
                        Series { name: "completed", class: "completed", values: &h.completed, summary: Summary::Total },
                        Series { name: "failed", class: "failed", values: &h.failed, summary: Summary::Total },
                    ],
                    "-60 min",
                    "now",
                );
                (Avail::Yes(depth), Some(throughput))
            }
            Avail::No(note) => (Avail::No(note), None),
        };
        let settings = avail(
            async {
                let r = client
                    .query_one(
                        "SELECT lease::text, max_attempts, retention::text FROM pgqueue.queues WHERE queue = $1",
                        &[&queue],
                    )
                    .await?;
                Ok(vec![
                    ("lease", r.get::<_, String>(0)),
                    ("max_attempts", r.get::<_, i32>(1).to_string()),
                    ("retention", r.get::<_, String>(2)),
                ])
            }
            .await,
            "settings (pgqueue.queues)",
        )?;
        let claims = avail(
            async {
                let rows = client
                    .query(
                        "SELECT msg_id, consumer, attempt, claimed_at, extract(epoch FROM lease_expires_at - now())::float8
                           FROM pgqueue.jobs WHERE queue = $1 AND state = 'claimed'
                          ORDER BY lease_expires_at LIMIT 100",
                        &[&queue],
                    )
                    .await?;
                Ok(rows
                    .iter()
                    .map(|r| {
                        let left: Option<f64> = r.get(4);
                        Claim {
                            msg_id: r.get(0),
                            consumer: r.get::<_, Option<String>>(1).unwrap_or_default(),
                            attempt: r.get(2),
                            claimed_at: time(r.get(3)),
                            lease_left: duration(left),
                            expired: left.is_some_and(|l| l <= 0.0),
                        }
                    })
                    .collect())
            }
            .await,
            "in-flight claims (pgqueue.jobs)",
        )?;
        let schedules = schedules_of(&client, Some(&queue)).await?;
        let ctx = Ctx::new(format!("Queue {queue}"), "overview", visitor.clone(), caps);
        let page = QueuePage { ctx, q, tracked, settings, claims, depth_chart, throughput_chart, schedules };
        Ok(html(StatusCode::OK, &page))
    })
    .await
}

// --- schedules -------------------------------------------------------------------------------

#[derive(Template)]
#[template(path = "schedules.html")]
struct SchedulesPage {
    ctx: Ctx,
    schedules: Vec<ScheduleRow>,
}

pub async fn schedules(State(app): Shared, Extension(visitor): Extension<Visitor>) -> Response {
    render(&visitor, async {
        let (client, caps) = app.connect().await?;
        let schedules = schedules_of(&client, None).await?;
        let ctx = Ctx::new("Schedules", "schedules", visitor.clone(), caps);
        Ok(html(StatusCode::OK, &SchedulesPage { ctx, schedules }))
    })
    .await
}
