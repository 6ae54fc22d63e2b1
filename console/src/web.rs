//! The HTTP side: routes, the guard every request passes (login, CSRF cookie, security
//! headers), form bodies, flash messages and error pages.

use crate::auth::{self, Secrets, Sessions};
use crate::config::Config;
use crate::csrf;
use crate::db::{Capabilities, Failure};
use crate::{actions, pages};
use askama::Template;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use deadpool_postgres::{Object, Pool};
use std::sync::Arc;

/// What every handler shares.
pub struct App {
    pub config: Config,
    pub pool: Pool,
    pub sessions: Sessions,
    pub secrets: Secrets,
}

pub type Shared = State<Arc<App>>;

impl App {
    /// A connection and what its role may do: the first thing every page needs.
    pub async fn connect(&self) -> Result<(Object, Capabilities), Failure> {
        let client = self.pool.get().await?;
        let caps = Capabilities::of(&client, self.config.read_only).await?;
        Ok((client, caps))
    }
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(pages::overview))
        .route("/queues/{queue}", get(pages::queue))
        .route("/queues/{queue}/pause", post(actions::pause_queue))
        .route("/queues/{queue}/resume", post(actions::resume_queue))
        .route("/jobs", get(pages::jobs))
        .route("/jobs/{id}", get(pages::job))
        .route("/dead", get(pages::dead))
        .route("/dead/redrive", post(actions::redrive))
        .route("/dead/delete", post(actions::delete_dead))
        .route("/schedules", get(pages::schedules))
        .route("/schedules/{name}/pause", post(actions::pause_schedule))
        .route("/schedules/{name}/resume", post(actions::resume_schedule))
        .route("/schedules/{name}/run", post(actions::run_schedule))
        .route("/audit", get(pages::audit))
        .route("/settings", get(pages::settings))
        .route("/login", get(pages::login_form).post(login))
        .route("/logout", post(logout))
        .route("/static/console.css", get(css))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

/// Who is asking, as the guard found out: handed to every handler.
#[derive(Clone, Debug)]
pub struct Visitor {
    /// The CSRF token the forms of this page repeat.
    pub csrf: String,
    /// The name for the audit log (None without authentication).
    pub user: Option<String>,
    /// Authenticated by `Authorization: Bearer`: not a browser's ambient credential, so
    /// CSRF does not apply.
    pub bearer: bool,
    /// Logged in through the form (the page offers a logout button).
    pub session: bool,
    /// A message left by the action before the redirect.
    pub flash: Option<String>,
}

pub const FLASH_COOKIE: &str = "pgqc_flash";

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn set_cookie(config: &Config, name: &str, value: &str, max_age: Option<u64>) -> HeaderValue {
    let mut c = format!("{name}={value}; Path=/; HttpOnly; SameSite=Strict");
    if let Some(age) = max_age {
        c.push_str(&format!("; Max-Age={age}"));
    }
    if config.secure_cookies {
        c.push_str("; Secure");
    }
    HeaderValue::from_str(&c).expect("cookie values are hex or percent-encoded")
}

fn is_public(path: &str) -> bool {
    path == "/login" || path.starts_with("/static/")
}

/// Every request: the CSRF cookie (made on the first visit), authentication when the
/// console requires it, the flash message, and the security headers on every answer.
async fn guard(State(app): Shared, mut req: Request, next: Next) -> Response {
    let headers = req.headers().clone();
    let existing_csrf = cookie(&headers, csrf::COOKIE).filter(|v| v.len() == 64).map(str::to_string);
    let csrf = existing_csrf.clone().unwrap_or_else(csrf::new_token);
    let flash = cookie(&headers, FLASH_COOKIE).map(|v| {
        form_urlencoded::parse(format!("m={v}").as_bytes()).next().map(|(_, m)| m.into_owned()).unwrap_or_default()
    });
    let mut visitor = Visitor { csrf: csrf.clone(), user: None, bearer: false, session: false, flash: flash.clone() };

    let refused = if app.config.auth_required() {
        let bearer = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(auth::bearer);
        let session = cookie(&headers, auth::SESSION_COOKIE).and_then(|id| app.sessions.user(id));
        if bearer.is_some_and(|t| app.secrets.token_matches(t)) {
            visitor.user = Some("token".into());
            visitor.bearer = true;
            None
        } else if let Some(user) = session {
            visitor.user = Some(user);
            visitor.session = true;
            None
        } else if is_public(req.uri().path()) {
            None
        } else if req.method() == Method::GET {
            Some(Redirect::to("/login").into_response())
        } else {
            Some(failure_page(&Failure::Unauthorized, &visitor))
        }
    } else {
        None
    };
    let mut response = match refused {
        Some(r) => r,
        None => {
            req.extensions_mut().insert(visitor);
            next.run(req).await
        }
    };

    let h = response.headers_mut();
    if existing_csrf.is_none() {
        h.append(header::SET_COOKIE, set_cookie(&app.config, csrf::COOKIE, &csrf, None));
    }
    let sets_flash = h.get_all(header::SET_COOKIE).iter().any(|v| v.as_bytes().starts_with(FLASH_COOKIE.as_bytes()));
    if flash.is_some() && !sets_flash {
        h.append(header::SET_COOKIE, set_cookie(&app.config, FLASH_COOKIE, "", Some(0)));
    }
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; img-src 'self' data:; script-src 'self'; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// A form posted to the console, after the CSRF check: the fields in order (a name may
/// repeat, as checkboxes do).
pub struct Posted {
    pub visitor: Visitor,
    fields: Vec<(String, String)>,
}

impl Posted {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty())
    }

    pub fn all(&self, name: &str) -> impl Iterator<Item = &str> {
        self.fields.iter().filter(move |(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

impl<S: Send + Sync> FromRequest<S> for Posted {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Posted, Response> {
        let visitor = req.extensions().get::<Visitor>().cloned().expect("the guard runs first");
        let headers = req.headers().clone();
        let body = Bytes::from_request(req, state).await.map_err(IntoResponse::into_response)?;
        let fields: Vec<(String, String)> = form_urlencoded::parse(&body).into_owned().collect();
        let posted = Posted { visitor, fields };
        if !posted.visitor.bearer {
            let text = |name: HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
            let from = csrf::Provenance {
                origin: text(header::ORIGIN),
                host: text(header::HOST),
                fetch_site: text(HeaderName::from_static("sec-fetch-site")),
            };
            csrf::check(from, cookie(&headers, csrf::COOKIE), posted.get(csrf::FIELD))
                .map_err(|refusal| failure_page(&Failure::Forbidden(refusal.to_string()), &posted.visitor))?;
        }
        Ok(posted)
    }
}

/// After an action: back to `to`, with `message` shown there once.
pub fn redirect_with_flash(app: &App, to: &str, message: &str) -> Response {
    let encoded: String = form_urlencoded::byte_serialize(message.as_bytes()).collect();
    let mut r = Redirect::to(to).into_response();
    r.headers_mut().append(header::SET_COOKIE, set_cookie(&app.config, FLASH_COOKIE, &encoded, Some(60)));
    r
}

/// A rendered template as an HTML answer with `status`.
pub fn html(status: StatusCode, template: &impl Template) -> Response {
    match template.render() {
        Ok(body) => (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("template error: {e}")).into_response(),
    }
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage<'a> {
    status: u16,
    message: String,
    unavailable: bool,
    visitor: &'a Visitor,
}

/// The page for a failure: its status, its message, and for an unavailable database the
/// banner and a page that reloads itself until the database is back.
pub fn failure_page(failure: &Failure, visitor: &Visitor) -> Response {
    let status = StatusCode::from_u16(failure.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let page = ErrorPage {
        status: status.as_u16(),
        message: failure.message(),
        unavailable: matches!(failure, Failure::Unavailable(_)),
        visitor,
    };
    let mut r = html(status, &page);
    if page.unavailable {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    }
    r
}

async fn not_found(Extension(visitor): Extension<Visitor>) -> Response {
    failure_page(&Failure::NotFound("no such page".into()), &visitor)
}

async fn css() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8"), (header::CACHE_CONTROL, "max-age=3600")],
        include_str!("../static/console.css"),
    )
        .into_response()
}

async fn login(State(app): Shared, posted: Posted) -> Response {
    if !app.config.auth_required() {
        return Redirect::to("/").into_response();
    }
    let secret = posted.get("secret").unwrap_or("");
    if !app.secrets.accepts(secret) {
        return pages::login_page(&posted.visitor, Some("wrong password or token"), StatusCode::UNAUTHORIZED);
    }
    let user = posted.get("name").map(str::trim).filter(|n| !n.is_empty()).unwrap_or("console").to_string();
    let id = app.sessions.open(&user);
    let mut r = Redirect::to("/").into_response();
    let max_age = auth::SESSION_LIFETIME.as_secs();
    r.headers_mut().append(header::SET_COOKIE, set_cookie(&app.config, auth::SESSION_COOKIE, &id, Some(max_age)));
    r
}

async fn logout(State(app): Shared, headers: HeaderMap, _posted: Posted) -> Response {
    if let Some(id) = cookie(&headers, auth::SESSION_COOKIE) {
        app.sessions.close(id);
    }
    let mut r = Redirect::to("/login").into_response();
    r.headers_mut().append(header::SET_COOKIE, set_cookie(&app.config, auth::SESSION_COOKIE, "", Some(0)));
    r
}
