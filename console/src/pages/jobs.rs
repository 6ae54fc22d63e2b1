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
    states: [&'static str; 8],
    searched: bool,
    jobs: Avail<Vec<JobRow>>,
    next: Option<String>,
}

pub const PAGE_SIZE: i64 = 50;
const STATES: [&str; 8] = ["ready", "delayed", "pending", "parked", "claimed", "completed", "dead", "cancelled"];

fn int(v: &str, what: &str) -> Result<i64, Failure> {
    v.parse::<i64>().map_err(|_| Failure::BadRequest(format!("{what} must be a number, not {v:?}")))
}

/// Where a search's id or unique key is, found before it runs, so that it reads only the
/// history partitions of the queues that hold them (a query of history by a queue the planner
/// does not know reads and locks every queue's partitions).
#[derive(Default)]
struct Scope {
    /// The queue holding the id searched for (none: no job has it).
    id_in: Option<Option<String>>,
    /// The (queue, msg_id) of every message holding the key searched for.
    keyed: Option<Vec<(String, i64)>>,
}

impl Scope {
    /// Nothing can match.
    fn is_empty(&self) -> bool {
        matches!(self.id_in, Some(None)) || self.keyed.as_ref().is_some_and(Vec::is_empty)
    }
}

/// Queues looked in at a time for a job whose queue is not given: each statement commits on
/// its own, so it holds the locks of this many queues' partitions, not of all of them.
const QUEUES_AT_A_TIME: usize = 50;

/// The queue of job `id`, looked for queue by queue in groups.
async fn locate(client: &Object, id: i64) -> Result<Option<String>, Failure> {
    let queues: Vec<String> =
        client.query("SELECT queue FROM pgqueue.queues ORDER BY queue", &[]).await?.iter().map(|r| r.get(0)).collect();
    for group in queues.chunks(QUEUES_AT_A_TIME) {
        let found = client
            .query_opt("SELECT queue FROM pgqueue.jobs WHERE msg_id = $1 AND queue = ANY ($2) LIMIT 1", &[&id, &group])
            .await?;
        if let Some(row) = found {
            return Ok(Some(row.get(0)));
        }
    }
    Ok(None)
}

async fn scope(client: &Object, s: &Search, caps: &Capabilities) -> Result<Scope, Failure> {
    let mut scope = Scope::default();
    let queue = given(&s.queue);
    if let (Some(id), None) = (given(&s.id), queue) {
        scope.id_in = Some(locate(client, int(id, "the id")?).await?);
    }
    if let (Some(key), true) = (given(&s.key), caps.may_read_dedup_keys) {
        let rows = client
            .query(
                "SELECT queue, msg_id FROM pgqueue.dedup_keys WHERE dedup_key = $1 AND ($2::text IS NULL OR queue = $2)",
                &[&key, &queue],
            )
            .await?;
        scope.keyed = Some(rows.iter().map(|r| (r.get(0), r.get(1))).collect());
    }
    Ok(scope)
}

/// The WHERE clause and parameters of a search: every filter given, ANDed; an id always as
/// `msg_id = $n` and a unique key as the (queue, msg_id) pairs `pgqueue.dedup_keys` has for
/// it where readable, each within its queues, so both use an index.
fn search_sql(
    s: &Search,
    caps: &Capabilities,
    scope: &Scope,
) -> Result<(String, Vec<Box<dyn ToSql + Sync + Send>>), Failure> {
    let mut clauses: Vec<String> = vec![];
    let mut params: Vec<Box<dyn ToSql + Sync + Send>> = vec![];
    // Adds a clause whose one parameter is written `$?`.
    let mut add = |clause: &str, p: Box<dyn ToSql + Sync + Send>| {
        params.push(p);
        clauses.push(clause.replace("$?", &format!("${}", params.len())));
    };
    if let Some(id) = given(&s.id) {
        add("msg_id = $?", Box::new(int(id, "the id")?));
        if let Some(Some(queue)) = &scope.id_in {
            add("queue = $?", Box::new(queue.clone()));
        }
    }
    if let Some(state) = given(&s.state) {
        if !STATES.contains(&state) {
            return Err(Failure::BadRequest(format!("no state {state:?}")));
        }
        add("state = $?", Box::new(state.to_string()));
    }
    if let Some(queue) = given(&s.queue) {
        add("queue = $?", Box::new(queue.to_string()));
    }
    if let Some(key) = given(&s.key) {
        match (&scope.keyed, caps.may_read_dedup_keys) {
            (Some(keyed), true) => {
                let mut queues: Vec<String> = keyed.iter().map(|(q, _)| q.clone()).collect();
                queues.dedup();
                add("queue = ANY ($?)", Box::new(queues));
                add("msg_id = ANY ($?)", Box::new(keyed.iter().map(|(_, id)| *id).collect::<Vec<i64>>()));
            }
            _ => add("dedup_key = $?", Box::new(key.to_string())),
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
    // Bad input is refused before anything is looked up.
    search_sql(search, caps, &Scope::default())?;
    let scope = scope(client, search, caps).await?;
    if scope.is_empty() {
        return Ok((vec![], None));
    }
    let (filter, params) = search_sql(search, caps, &scope)?;
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

#[derive(Deserialize)]
pub struct InQueue {
    pub queue: Option<String>,
}

pub async fn job(
    State(app): Shared,
    Extension(visitor): Extension<Visitor>,
    Path(id): Path<String>,
    Query(at): Query<InQueue>,
) -> Response {
    render(&visitor, async {
        let id: i64 = id.parse().map_err(|_| Failure::BadRequest(format!("{id:?} is not a job id")))?;
        let (client, caps) = app.connect().await?;
        let job = avail(job_detail(&client, id, given(&at.queue)).await, "job details (pgqueue.jobs)")?;
        let ctx = Ctx::new(format!("Job {id}"), "jobs", visitor.clone(), caps);
        Ok(html(StatusCode::OK, &JobPage { ctx, job }))
    })
    .await
}

/// A job by id ($1) and queue ($2): that queue's history partitions only, through an index.
pub const JOB_SQL: &str =
    "SELECT msg_id, queue, state, priority, attempt, payload, headers, enqueued_at, visible_at, claimed_at,
        consumer, lease_expires_at, extract(epoch FROM lease_expires_at - now())::float8,
        finished_at, last_error, dedup_key
   FROM pgqueue.jobs WHERE msg_id = $1 AND queue = $2
  ORDER BY finished_at NULLS FIRST LIMIT 1";

/// Job `id`, in `queue` (the console's links give it: only that queue's partitions are read)
/// or looked for.
async fn job_detail(client: &Object, id: i64, queue: Option<&str>) -> Result<JobDetail, Failure> {
    let queue = match queue {
        Some(q) => q.to_string(),
        None => locate(client, id).await?.ok_or_else(|| Failure::NotFound(format!("no job {id}")))?,
    };
    let r =
        client.query_opt(JOB_SQL, &[&id, &queue]).await?.ok_or_else(|| Failure::NotFound(format!("no job {id}")))?;
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
        let keyed = Scope { keyed: Some(vec![("emails".into(), 7), ("emails".into(), 9)]), ..Scope::default() };
        let (sql, params) =
            search_sql(&search(&[("id", "7"), ("queue", "emails"), ("key", "k-1")]), &caps, &keyed).unwrap();
        assert_eq!(sql, "msg_id = $1 AND queue = $2 AND queue = ANY ($3) AND msg_id = ANY ($4)");
        assert_eq!(params.len(), 4);
        let located = Scope { id_in: Some(Some("emails".into())), ..Scope::default() };
        let (sql, _) = search_sql(&search(&[("id", "7")]), &caps, &located).unwrap();
        assert_eq!(sql, "msg_id = $1 AND queue = $2", "an id is looked for within the queue found to hold it");
        assert!(Scope { id_in: Some(None), ..Scope::default() }.is_empty(), "no queue holds it: nothing to search");
        assert!(Scope { keyed: Some(vec![]), ..Scope::default() }.is_empty(), "no message holds the key");
        let (sql, _) = search_sql(&search(&[("key", "k-1")]), &Capabilities::default(), &Scope::default()).unwrap();
        assert_eq!(sql, "dedup_key = $1", "without SELECT on dedup_keys, the view's column");
    }

    #[test]
    fn filters_are_checked_before_the_database_sees_them() {
        let caps = Capabilities::default();
        let none = Scope::default();
        assert!(matches!(search_sql(&search(&[("id", "x")]), &caps, &none), Err(Failure::BadRequest(_))));
        assert!(matches!(search_sql(&search(&[("state", "lost")]), &caps, &none), Err(Failure::BadRequest(_))));
        assert!(matches!(search_sql(&search(&[("payload", "{nope")]), &caps, &none), Err(Failure::BadRequest(_))));
        let (sql, _) = search_sql(&search(&[("payload", r#"{"a": 1}"#), ("error", "50%")]), &caps, &none).unwrap();
        assert_eq!(sql, "payload @> $1::text::jsonb AND last_error ILIKE '%' || $2::text || '%'");
        assert_eq!(search_sql(&Search::default(), &caps, &none).unwrap().0, "true");
    }
}
