//! Finding jobs: the search, a job's page and the dead letters, all from `pgqueue.jobs`.

use super::{Avail, Ctx, avail, render};
use crate::db::{Capabilities, Failure};
use crate::format::{self, duration, time};
use crate::web::{Shared, Visitor, html};
use askama::Template;
use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use deadpool_postgres::Object;
use serde::Deserialize;
use tokio_postgres::types::ToSql;

// --- job search and detail ----------------------------------------------------------------

#[derive(Deserialize, Default, Clone)]
pub struct Search {
    pub id: Option<String>,
    pub state: Option<String>,
    pub queue: Option<String>,
    pub key: Option<String>,
    pub payload: Option<String>,
    pub error: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
    pub before: Option<String>,
}

fn given(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

impl Search {
    /// This search's parameters as a query string, with `before` set to `before`.
    pub fn next_page(&self, before: i64) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("id", &self.id),
            ("state", &self.state),
            ("queue", &self.queue),
            ("key", &self.key),
            ("payload", &self.payload),
            ("error", &self.error),
            ("from", &self.from),
            ("to", &self.to),
        ] {
            if let Some(v) = given(v) {
                q.append_pair(k, v);
            }
        }
        q.append_pair("before", &before.to_string());
        q.finish()
    }

    pub fn field(&self, name: &str) -> &str {
        let v = match name {
            "id" => &self.id,
            "state" => &self.state,
            "queue" => &self.queue,
            "key" => &self.key,
            "payload" => &self.payload,
            "error" => &self.error,
            "from" => &self.from,
            "to" => &self.to,
            _ => &None,
        };
        given(v).unwrap_or("")
    }
}

pub struct JobRow {
    pub msg_id: i64,
    pub queue: String,
    pub state: String,
    pub attempt: i32,
    pub enqueued_at: String,
    pub finished_at: String,
    pub last_error: Option<String>,
    pub payload: String,
}

#[derive(Template)]
#[template(path = "jobs.html")]
struct JobsPage {
    ctx: Ctx,
    search: Search,
    states: [&'static str; 5],
    searched: bool,
    jobs: Avail<Vec<JobRow>>,
    next: Option<String>,
}

pub const PAGE_SIZE: i64 = 50;
const STATES: [&str; 5] = ["ready", "delayed", "claimed", "completed", "dead"];

/// The WHERE clause and parameters of a search: every filter given, ANDed; an id always as
/// `msg_id = $n` and a unique key through `pgqueue.dedup_keys` where readable, so both use
/// an index.
fn search_sql(s: &Search, caps: &Capabilities) -> Result<(String, Vec<Box<dyn ToSql + Sync + Send>>), Failure> {
    let mut clauses: Vec<String> = vec![];
    let mut params: Vec<Box<dyn ToSql + Sync + Send>> = vec![];
    // Adds a clause whose one parameter is written `$?`; returns that parameter's number.
    let mut add = |clause: &str, p: Box<dyn ToSql + Sync + Send>| {
        params.push(p);
        clauses.push(clause.replace("$?", &format!("${}", params.len())));
        params.len()
    };
    let int = |v: &str, what: &str| {
        v.parse::<i64>().map_err(|_| Failure::BadRequest(format!("{what} must be a number, not {v:?}")))
    };
    if let Some(id) = given(&s.id) {
        add("msg_id = $?", Box::new(int(id, "the id")?));
    }
    if let Some(state) = given(&s.state) {
        if !STATES.contains(&state) {
            return Err(Failure::BadRequest(format!("no state {state:?}")));
        }
        add("state = $?", Box::new(state.to_string()));
    }
    let queue_param = given(&s.queue).map(|queue| add("queue = $?", Box::new(queue.to_string())));
    if let Some(key) = given(&s.key) {
        if caps.may_read_dedup_keys {
            // With the queue, the primary key (queue, dedup_key) finds the key.
            let same_queue = queue_param.map(|n| format!(" AND k.queue = ${n}")).unwrap_or_default();
            add(
                &format!(
                    "msg_id = ANY (ARRAY(SELECT k.msg_id FROM pgqueue.dedup_keys k WHERE k.dedup_key = $?{same_queue}))"
                ),
                Box::new(key.to_string()),
            );
        } else {
            add("dedup_key = $?", Box::new(key.to_string()));
        }
    }
    if let Some(payload) = given(&s.payload) {
        serde_json::from_str::<serde_json::Value>(payload)
            .map_err(|e| Failure::BadRequest(format!("the payload filter is not JSON: {e}")))?;
        add("payload @> $?::text::jsonb", Box::new(payload.to_string()));
    }
    if let Some(error) = given(&s.error) {
        add("last_error ILIKE '%' || $?::text || '%'", Box::new(format::like_literal(error)));
    }
    if let Some(from) = given(&s.from) {
        add("enqueued_at >= $?::text::timestamptz", Box::new(from.to_string()));
    }
    if let Some(to) = given(&s.to) {
        add("enqueued_at < $?::text::timestamptz", Box::new(to.to_string()));
    }
    if let Some(before) = given(&s.before) {
        add("msg_id < $?", Box::new(int(before, "before")?));
    }
    let filter = if clauses.is_empty() { "true".to_string() } else { clauses.join(" AND ") };
    Ok((filter, params))
}

fn job_rows(rows: &[tokio_postgres::Row]) -> Vec<JobRow> {
    rows.iter()
        .map(|r| JobRow {
            msg_id: r.get(0),
            queue: r.get(1),
            state: r.get(2),
            attempt: r.get(3),
            enqueued_at: time(r.get(4)),
            finished_at: time(r.get(5)),
            last_error: r.get(6),
            payload: format::json_preview(&r.get::<_, serde_json::Value>(7), 120),
        })
        .collect()
}

const JOB_COLUMNS: &str = "msg_id, queue, state, attempt, enqueued_at, finished_at, last_error, payload";

/// Runs a search: at most a page, newest first, and the next page's `before` if there is
/// more.
async fn find(client: &Object, search: &Search, caps: &Capabilities) -> Result<(Vec<JobRow>, Option<i64>), Failure> {
    let (filter, params) = search_sql(search, caps)?;
    let sql =
        format!("SELECT {JOB_COLUMNS} FROM pgqueue.jobs WHERE {filter} ORDER BY msg_id DESC LIMIT {}", PAGE_SIZE + 1);
    let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect();
    let rows = client.query(&sql, &refs).await?;
    let mut jobs = job_rows(&rows);
    let more = jobs.len() as i64 > PAGE_SIZE;
    jobs.truncate(PAGE_SIZE as usize);
    let next = if more { jobs.last().map(|j| j.msg_id) } else { None };
    Ok((jobs, next))
}

pub async fn jobs(
    State(app): Shared,
    Extension(visitor): Extension<Visitor>,
    Query(search): Query<Search>,
) -> Response {
    render(&visitor, async {
        let (client, caps) = app.connect().await?;
        let searched = ["id", "state", "queue", "key", "payload", "error", "from", "to"]
            .iter()
            .any(|f| !search.field(f).is_empty());
        let found = avail(find(&client, &search, &caps).await, "job search (pgqueue.jobs)")?;
        let (jobs, next) = match found {
            Avail::Yes((jobs, next)) => (Avail::Yes(jobs), next.map(|n| search.next_page(n))),
            Avail::No(note) => (Avail::No(note), None),
        };
        let ctx = Ctx::new("Jobs", "jobs", visitor.clone(), caps);
        Ok(html(StatusCode::OK, &JobsPage { ctx, search, states: STATES, searched, jobs, next }))
    })
    .await
}

pub struct JobDetail {
    pub msg_id: i64,
    pub queue: String,
    pub state: String,
    pub priority: i16,
    pub attempt: i32,
    pub payload: String,
    pub headers: String,
    pub times: Vec<(&'static str, String)>,
    pub consumer: Option<String>,
    pub lease_left: Option<String>,
    pub last_error: Option<String>,
    pub dedup_key: Option<String>,
}

#[derive(Template)]
#[template(path = "job.html")]
struct JobPage {
    ctx: Ctx,
    job: Avail<JobDetail>,
}

pub async fn job(State(app): Shared, Extension(visitor): Extension<Visitor>, Path(id): Path<String>) -> Response {
    render(&visitor, async {
        let id: i64 = id.parse().map_err(|_| Failure::BadRequest(format!("{id:?} is not a job id")))?;
        let (client, caps) = app.connect().await?;
        let job = avail(job_detail(&client, id).await, "job details (pgqueue.jobs)")?;
        let ctx = Ctx::new(format!("Job {id}"), "jobs", visitor.clone(), caps);
        Ok(html(StatusCode::OK, &JobPage { ctx, job }))
    })
    .await
}

async fn job_detail(client: &Object, id: i64) -> Result<JobDetail, Failure> {
    let r = client
        .query_opt(
            "SELECT msg_id, queue, state, priority, attempt, payload, headers, enqueued_at, visible_at, claimed_at,
                    consumer, lease_expires_at, extract(epoch FROM lease_expires_at - now())::float8,
                    finished_at, last_error, dedup_key
               FROM pgqueue.jobs WHERE msg_id = $1
              ORDER BY finished_at NULLS FIRST LIMIT 1",
            &[&id],
        )
        .await?
        .ok_or_else(|| Failure::NotFound(format!("no job {id}")))?;
    let state: String = r.get(2);
    Ok(JobDetail {
        msg_id: r.get(0),
        queue: r.get(1),
        priority: r.get(3),
        attempt: r.get(4),
        payload: format::json(r.get::<_, Option<serde_json::Value>>(5).as_ref()),
        headers: format::json(r.get::<_, Option<serde_json::Value>>(6).as_ref()),
        times: vec![
            ("enqueued", time(r.get(7))),
            ("visible", time(r.get(8))),
            ("claimed", time(r.get(9))),
            ("lease expires", time(r.get(11))),
            ("finished", time(r.get(13))),
        ],
        consumer: r.get(10),
        lease_left: (state == "claimed").then(|| duration(r.get(12))),
        last_error: r.get(14),
        dedup_key: r.get(15),
        state,
    })
}

// --- dead letters --------------------------------------------------------------------------

#[derive(Template)]
#[template(path = "dead.html")]
struct DeadPage {
    ctx: Ctx,
    search: Search,
    queues: Vec<String>,
    jobs: Avail<Vec<JobRow>>,
    next: Option<String>,
}

pub async fn dead(
    State(app): Shared,
    Extension(visitor): Extension<Visitor>,
    Query(search): Query<Search>,
) -> Response {
    render(&visitor, async {
        let (client, caps) = app.connect().await?;
        let only = Search {
            state: Some("dead".into()),
            queue: search.queue.clone(),
            error: search.error.clone(),
            before: search.before.clone(),
            ..Search::default()
        };
        let found = avail(find(&client, &only, &caps).await, "dead letters (pgqueue.jobs)")?;
        let (jobs, next) = match found {
            Avail::Yes((jobs, next)) => (Avail::Yes(jobs), next.map(|n| only.next_page(n))),
            Avail::No(note) => (Avail::No(note), None),
        };
        let queues = client
            .query("SELECT queue FROM pgqueue.queue_depth ORDER BY queue", &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let ctx = Ctx::new("Dead letters", "dead", visitor.clone(), caps);
        Ok(html(StatusCode::OK, &DeadPage { ctx, search, queues, jobs, next }))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search(pairs: &[(&str, &str)]) -> Search {
        let mut s = Search::default();
        for (k, v) in pairs {
            let v = Some(v.to_string());
            match *k {
                "id" => s.id = v,
                "queue" => s.queue = v,
                "key" => s.key = v,
                "payload" => s.payload = v,
                "error" => s.error = v,
                "state" => s.state = v,
                _ => unreachable!(),
            }
        }
        s
    }

    #[test]
    fn an_id_and_a_key_are_searched_by_index() {
        let caps = Capabilities { may_read_dedup_keys: true, ..Default::default() };
        let (sql, params) = search_sql(&search(&[("id", "7"), ("queue", "emails"), ("key", "k-1")]), &caps).unwrap();
        assert_eq!(
            sql,
            "msg_id = $1 AND queue = $2 AND msg_id = ANY (ARRAY(SELECT k.msg_id FROM pgqueue.dedup_keys k \
             WHERE k.dedup_key = $3 AND k.queue = $2))"
        );
        assert_eq!(params.len(), 3);
        let (sql, _) = search_sql(&search(&[("key", "k-1")]), &Capabilities::default()).unwrap();
        assert_eq!(sql, "dedup_key = $1", "without SELECT on dedup_keys, the view's column");
    }

    #[test]
    fn filters_are_checked_before_the_database_sees_them() {
        let caps = Capabilities::default();
        assert!(matches!(search_sql(&search(&[("id", "x")]), &caps), Err(Failure::BadRequest(_))));
        assert!(matches!(search_sql(&search(&[("state", "lost")]), &caps), Err(Failure::BadRequest(_))));
        assert!(matches!(search_sql(&search(&[("payload", "{nope")]), &caps), Err(Failure::BadRequest(_))));
        let (sql, _) = search_sql(&search(&[("payload", r#"{"a": 1}"#), ("error", "50%")]), &caps).unwrap();
        assert_eq!(sql, "payload @> $1::text::jsonb AND last_error ILIKE '%' || $2::text || '%'");
        assert_eq!(search_sql(&Search::default(), &caps).unwrap().0, "true");
    }
}
