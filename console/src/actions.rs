//! The actions: each is a call of one of pgqueue's SQL functions, recorded with
//! `pgqueue.pgq_audit` in the same transaction (a refused action records nothing). Nothing
//! here checks privileges: the database decides, and its refusal is shown with a 403.

use crate::db::Failure;
use crate::pages::Ctx;
use crate::web::{App, Posted, Shared, failure_page, html, redirect_with_flash};
use askama::Template;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;
use std::collections::BTreeMap;
use tokio_postgres::types::ToSql;

/// One function call and how the audit log names it.
struct Call {
    /// A statement returning one row with one bigint (NULL for functions returning void).
    sql: &'static str,
    params: Vec<Box<dyn ToSql + Sync + Send>>,
    action: &'static str,
    target: String,
    detail: serde_json::Value,
}

/// Runs `calls` in one transaction, each followed by its audit record, and returns their
/// results. With `--read-only` the transaction is READ ONLY, so the database refuses too.
async fn perform(app: &App, user: Option<&str>, calls: Vec<Call>) -> Result<Vec<Option<i64>>, Failure> {
    let mut client = app.pool.get().await?;
    // Only ever READ ONLY, never READ WRITE: a standby refuses the latter at BEGIN (0A000),
    // and should refuse the action itself, as any read-only transaction does (25006).
    let mut begin = client.build_transaction();
    if app.config.read_only {
        begin = begin.read_only(true);
    }
    let tx = begin.start().await?;
    let mut results = vec![];
    for call in calls {
        let refs: Vec<&(dyn ToSql + Sync)> = call.params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect();
        let result: Option<i64> = tx.query_one(call.sql, &refs).await?.get(0);
        let mut detail = call.detail;
        if let (Some(r), Some(map)) = (result, detail.as_object_mut()) {
            map.insert("result".into(), json!(r));
        }
        tx.execute(
            "SELECT pgqueue.pgq_audit(action => $1, target => $2, detail => $3, console_user => $4)",
            &[&call.action, &call.target, &detail, &user],
        )
        .await?;
        results.push(result);
    }
    tx.commit().await?;
    Ok(results)
}

/// Where to go back to: a path of this console, never another site.
fn back(posted: &Posted, default: &str) -> String {
    match posted.get("back") {
        Some(b) if b.starts_with('/') && !b.starts_with("//") && !b.contains('\\') => b.to_string(),
        _ => default.to_string(),
    }
}

fn done(app: &App, posted: &Posted, to: &str, result: Result<String, Failure>) -> Response {
    match result {
        Ok(message) => redirect_with_flash(app, to, &message),
        Err(f) => failure_page(&f, &posted.visitor),
    }
}

async fn queue_call(app: &App, posted: &Posted, queue: &str, sql: &'static str, action: &'static str) -> Response {
    let call = Call {
        sql,
        params: vec![Box::new(queue.to_string())],
        action,
        target: format!("queue:{queue}"),
        detail: json!({}),
    };
    let result = perform(app, posted.visitor.user.as_deref(), vec![call]).await;
    let to = back(posted, &format!("/queues/{queue}"));
    done(app, posted, &to, result.map(|_| format!("{action}: {queue}")))
}

pub async fn pause_queue(axum::extract::State(app): Shared, Path(queue): Path<String>, posted: Posted) -> Response {
    queue_call(&app, &posted, &queue, "SELECT NULL::bigint FROM pgqueue.pgq_pause_queue($1)", "pause_queue").await
}

pub async fn resume_queue(axum::extract::State(app): Shared, Path(queue): Path<String>, posted: Posted) -> Response {
    queue_call(&app, &posted, &queue, "SELECT NULL::bigint FROM pgqueue.pgq_resume_queue($1)", "resume_queue").await
}

async fn schedule_call(app: &App, posted: &Posted, name: &str, sql: &'static str, action: &'static str) -> Response {
    let call = Call {
        sql,
        params: vec![Box::new(name.to_string())],
        action,
        target: format!("schedule:{name}"),
        detail: json!({}),
    };
    let result = perform(app, posted.visitor.user.as_deref(), vec![call]).await;
    let message = result.map(|r| match r.first().copied().flatten() {
        Some(msg_id) => format!("{action}: {name} (job {msg_id})"),
        None => format!("{action}: {name}"),
    });
    done(app, posted, &back(posted, "/schedules"), message)
}

pub async fn pause_schedule(axum::extract::State(app): Shared, Path(name): Path<String>, posted: Posted) -> Response {
    schedule_call(&app, &posted, &name, "SELECT NULL::bigint FROM pgqueue.pgq_pause_schedule($1)", "pause_schedule")
        .await
}

pub async fn resume_schedule(axum::extract::State(app): Shared, Path(name): Path<String>, posted: Posted) -> Response {
    schedule_call(&app, &posted, &name, "SELECT NULL::bigint FROM pgqueue.pgq_resume_schedule($1)", "resume_schedule")
        .await
}

pub async fn run_schedule(axum::extract::State(app): Shared, Path(name): Path<String>, posted: Posted) -> Response {
    schedule_call(&app, &posted, &name, "SELECT pgqueue.pgq_run_schedule($1)", "run_schedule").await
}

// --- dead letters -----------------------------------------------------------------------------

/// Which dead letters a form names: `one` (a row's own button), or the checked `ids`, or
/// `all` of a queue. Each id comes as `queue:msg_id`, since the functions take the queue.
enum Selection {
    Ids(Vec<(String, i64)>),
    AllOf(String),
}

fn parse_id(v: &str) -> Result<(String, i64), Failure> {
    v.rsplit_once(':')
        .and_then(|(q, id)| Some((q.to_string(), id.parse().ok()?)))
        .ok_or_else(|| Failure::BadRequest(format!("{v:?} is not queue:msg_id")))
}

fn selection(posted: &Posted) -> Result<(Selection, bool), Failure> {
    if let Some(one) = posted.get("one") {
        return Ok((Selection::Ids(vec![parse_id(one)?]), true));
    }
    if let Some(queue) = posted.get("all") {
        return Ok((Selection::AllOf(queue.to_string()), false));
    }
    let ids = posted.all("ids").map(parse_id).collect::<Result<Vec<_>, _>>()?;
    let single = ids.len() == 1;
    Ok((Selection::Ids(ids), single))
}

#[derive(Template)]
#[template(path = "confirm.html")]
struct Confirm {
    ctx: Ctx,
    question: String,
    verb: &'static str,
    action: &'static str,
    ids: Vec<(String, i64)>,
    all: Option<String>,
    back: String,
    danger: bool,
}

/// What a dead-letter action does, for its confirmation, its calls and its message.
struct DeadAction {
    path: &'static str,
    verb: &'static str,
    past: &'static str,
    sql: &'static str,
    audit: &'static str,
    /// Asks first even for one letter (a deletion cannot be undone).
    always_confirm: bool,
}

const REDRIVE: DeadAction = DeadAction {
    path: "/dead/redrive",
    verb: "Redrive",
    past: "redriven",
    sql: "SELECT pgqueue.pgq_redrive($1, $2)",
    audit: "redrive",
    always_confirm: false,
};

const DELETE: DeadAction = DeadAction {
    path: "/dead/delete",
    verb: "Delete",
    past: "deleted",
    sql: "SELECT pgqueue.pgq_delete_dead($1, $2)",
    audit: "delete_dead",
    always_confirm: true,
};

async fn dead_action(app: &App, posted: Posted, what: &DeadAction) -> Response {
    let to = back(&posted, "/dead");
    let (selection, single) = match selection(&posted) {
        Ok(s) => s,
        Err(f) => return failure_page(&f, &posted.visitor),
    };
    if matches!(&selection, Selection::Ids(ids) if ids.is_empty()) {
        return redirect_with_flash(app, &to, "nothing selected");
    }
    let confirmed = posted.get("confirm") == Some("yes") || (single && !what.always_confirm);
    if !confirmed {
        // Bulk (or destructive): show what would happen, change nothing yet.
        let (question, ids, all) = match selection {
            Selection::Ids(ids) => (format!("{} these {} dead letters?", what.verb, ids.len()), ids, None),
            Selection::AllOf(q) => (format!("{} every dead letter of queue {q}?", what.verb), vec![], Some(q)),
        };
        let caps = match app.connect().await {
            Ok((_, caps)) => caps,
            Err(f) => return failure_page(&f, &posted.visitor),
        };
        let ctx =
            Ctx { title: format!("{} dead letters", what.verb), nav: "dead", visitor: posted.visitor.clone(), caps };
        let danger = what.always_confirm;
        let page = Confirm { ctx, question, verb: what.verb, action: what.path, ids, all, back: to, danger };
        return html(StatusCode::OK, &page);
    }
    let calls: Vec<Call> = match selection {
        Selection::AllOf(queue) => vec![Call {
            sql: what.sql,
            params: vec![Box::new(queue.clone()), Box::new(None::<Vec<i64>>)],
            action: what.audit,
            target: format!("queue:{queue}"),
            detail: json!({"msg_ids": "all"}),
        }],
        Selection::Ids(ids) => {
            let mut by_queue: BTreeMap<String, Vec<i64>> = BTreeMap::new();
            for (q, id) in ids {
                by_queue.entry(q).or_default().push(id);
            }
            by_queue
                .into_iter()
                .map(|(queue, ids)| Call {
                    sql: what.sql,
                    detail: json!({"msg_ids": ids}),
                    params: vec![Box::new(queue.clone()), Box::new(Some(ids))],
                    action: what.audit,
                    target: format!("queue:{queue}"),
                })
                .collect()
        }
    };
    let result = perform(app, posted.visitor.user.as_deref(), calls).await;
    let message = result.map(|r| format!("{} dead letters {}", r.iter().flatten().sum::<i64>(), what.past));
    done(app, &posted, &to, message)
}

pub async fn redrive(axum::extract::State(app): Shared, posted: Posted) -> Response {
    dead_action(&app, posted, &REDRIVE).await
}

pub async fn delete_dead(axum::extract::State(app): Shared, posted: Posted) -> Response {
    dead_action(&app, posted, &DELETE).await
}
