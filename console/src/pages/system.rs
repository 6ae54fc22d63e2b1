//! The audit log, the settings and shared memory, and the login form.

use super::{Avail, Ctx, avail, render};
use crate::db::Failure;
use crate::format::time;
use crate::web::{Shared, Visitor, html};
use askama::Template;
use axum::Extension;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

// --- audit, settings ------------------------------------------------------------------------

pub struct AuditRow {
    pub action_id: i64,
    pub at: String,
    pub db_role: String,
    pub console_user: String,
    pub action: String,
    pub target: String,
    pub detail: String,
}

#[derive(Template)]
#[template(path = "audit.html")]
struct AuditPage {
    ctx: Ctx,
    entries: Avail<Vec<AuditRow>>,
    next: Option<i64>,
}

#[derive(Deserialize)]
pub struct Before {
    pub before: Option<i64>,
}

pub async fn audit(State(app): Shared, Extension(visitor): Extension<Visitor>, Query(q): Query<Before>) -> Response {
    render(&visitor, async {
        let (client, caps) = app.connect().await?;
        let rows = client
            .query(
                "SELECT action_id, at, db_role, console_user, action, target, detail
                   FROM pgqueue.audit_log WHERE $1::bigint IS NULL OR action_id < $1
                  ORDER BY action_id DESC LIMIT 101",
                &[&q.before],
            )
            .await
            .map_err(Failure::from);
        let entries = avail(
            rows.map(|rows| {
                rows.iter()
                    .map(|r| AuditRow {
                        action_id: r.get(0),
                        at: time(r.get(1)),
                        db_role: r.get::<_, Option<String>>(2).unwrap_or_default(),
                        console_user: r.get::<_, Option<String>>(3).unwrap_or_default(),
                        action: r.get::<_, Option<String>>(4).unwrap_or_default(),
                        target: r.get::<_, Option<String>>(5).unwrap_or_default(),
                        detail: r.get::<_, Option<serde_json::Value>>(6).map(|d| d.to_string()).unwrap_or_default(),
                    })
                    .collect::<Vec<_>>()
            }),
            "audit log (pgqueue.audit_log)",
        )?;
        let (entries, next) = match entries {
            Avail::Yes(mut e) => {
                let next = (e.len() > 100).then(|| e[99].action_id);
                e.truncate(100);
                (Avail::Yes(e), next)
            }
            no => (no, None),
        };
        let ctx = Ctx::new("Audit log", "audit", visitor.clone(), caps);
        Ok(html(StatusCode::OK, &AuditPage { ctx, entries, next }))
    })
    .await
}

#[derive(Template)]
#[template(path = "settings.html")]
struct SettingsPage {
    ctx: Ctx,
    server: Vec<(&'static str, String)>,
    shared: Avail<Vec<(&'static str, String)>>,
    settings: Vec<(String, String, String)>,
}

pub async fn settings(State(app): Shared, Extension(visitor): Extension<Visitor>) -> Response {
    render(&visitor, async {
        let (client, caps) = app.connect().await?;
        let r = client
            .query_one(
                "SELECT current_setting('server_version'), current_database()::text, current_user::text,
                        pg_is_in_recovery()::text, pgqueue.pgq_version()",
                &[],
            )
            .await?;
        let server = vec![
            ("PostgreSQL", r.get::<_, String>(0)),
            ("database", r.get(1)),
            ("role", r.get(2)),
            ("in recovery", r.get(3)),
            ("pgqueue library", r.get(4)),
            ("pgqueue in this database", caps.ext_version.clone().unwrap_or_else(|| "—".into())),
            ("console", env!("CARGO_PKG_VERSION").to_string()),
        ];
        let shared = avail(
            async {
                let rows = client
                    .query(
                        "SELECT max_queues, queues, queues_untracked, bytes_per_queue FROM pgqueue.shared_state",
                        &[],
                    )
                    .await?;
                Ok(match rows.first() {
                    Some(r) => vec![
                        ("max_queues", r.get::<_, i64>(0).to_string()),
                        ("queues tracked", r.get::<_, i64>(1).to_string()),
                        ("times full (queues_untracked)", r.get::<_, i64>(2).to_string()),
                        ("bytes per queue", r.get::<_, i64>(3).to_string()),
                    ],
                    None => vec![("shared memory", "none: the library is not preloaded".to_string())],
                })
            }
            .await,
            "shared memory (pgqueue.shared_state)",
        )?;
        let settings = client
            .query(
                "SELECT name, setting || coalesce(' ' || unit, ''), short_desc FROM pg_settings
                  WHERE name LIKE 'pgqueue.%' ORDER BY name",
                &[],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get::<_, Option<String>>(2).unwrap_or_default()))
            .collect();
        let ctx = Ctx::new("Settings", "settings", visitor.clone(), caps);
        Ok(html(StatusCode::OK, &SettingsPage { ctx, server, shared, settings }))
    })
    .await
}

// --- login ----------------------------------------------------------------------------------

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage<'a> {
    visitor: &'a Visitor,
    error: Option<&'a str>,
}

pub fn login_page(visitor: &Visitor, error: Option<&str>, status: StatusCode) -> Response {
    html(status, &LoginPage { visitor, error })
}

pub async fn login_form(Extension(visitor): Extension<Visitor>) -> Response {
    login_page(&visitor, None, StatusCode::OK)
}
