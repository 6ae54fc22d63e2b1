//! The pages: each reads pgqueue's views (and, from 0.12.0, `pgqueue.jobs`,
//! `queue_minutes` and `audit_log`; from 0.13.0, `queue_overview`) and renders a template. Where this role may not read
//! something, or this pgqueue lacks it, the page says so instead of failing.

mod jobs;
mod queues;
mod system;

pub use jobs::{JOB_SQL, dead, job, jobs};
pub use queues::{COUNTS_SQL, LAST_HOUR_SQL, overview, queue, schedules};
pub use system::{audit, login_form, login_page, settings};

use crate::db::{Capabilities, Failure, is_denied, is_missing};
use crate::web::{Visitor, failure_page};
use axum::response::Response;

/// What the layout around every page shows.
pub struct Ctx {
    pub title: String,
    pub nav: &'static str,
    pub visitor: Visitor,
    pub caps: Capabilities,
}

impl Ctx {
    pub(crate) fn new(title: impl Into<String>, nav: &'static str, visitor: Visitor, caps: Capabilities) -> Ctx {
        Ctx { title: title.into(), nav, visitor, caps }
    }
}

/// A page's result: rendered, or the failure's own page.
pub(crate) type Page = Result<Response, Failure>;

/// Runs `page`, turning a failure into its page (503 with the banner when the database is
/// away).
pub(crate) async fn render(visitor: &Visitor, page: impl Future<Output = Page>) -> Response {
    match page.await {
        Ok(r) => r,
        Err(f) => failure_page(&f, visitor),
    }
}

/// A read that may be refused (no grant) or absent (older pgqueue): what to show instead.
pub enum Avail<T> {
    Yes(T),
    No(String),
}

pub(crate) fn avail<T>(result: Result<T, Failure>, what: &str) -> Result<Avail<T>, Failure> {
    match result {
        Ok(v) => Ok(Avail::Yes(v)),
        Err(f) if is_missing(&f) => {
            Ok(Avail::No(format!("{what} unavailable: this pgqueue has no such object (needs 0.13.0)")))
        }
        Err(f) if is_denied(&f) => {
            Ok(Avail::No(format!("{what} unavailable: this role may not read it ({})", f.message())))
        }
        Err(f) => Err(f),
    }
}
