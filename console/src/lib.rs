//! pgqueue's operator console: server-rendered pages over pgqueue's views, and actions
//! through its SQL functions, each recorded in its audit log. `serve` runs it on a listener
//! (the binary's, or a test's).

pub mod actions;
pub mod auth;
pub mod charts;
pub mod config;
pub mod csrf;
pub mod db;
pub mod format;
pub mod pages;
pub mod web;

pub use config::{Config, ConfigError};

use std::sync::Arc;

/// Serves the console on `listener` until the task is dropped or the server fails. Refuses
/// (before answering anything) a configuration `Config::validate` refuses, judged by the
/// address the listener really has.
pub async fn serve(
    mut config: Config,
    listener: tokio::net::TcpListener,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    config.listen = listener.local_addr()?;
    config.validate()?;
    let pool = db::pool(&config.dsn)?;
    report_database(&pool, config.read_only).await;
    let secrets = auth::Secrets { password_hash: config.password_hash.clone(), token: config.token.clone() };
    let app = Arc::new(web::App { config, pool, sessions: auth::Sessions::default(), secrets });
    axum::serve(listener, web::router(app)).await?;
    Ok(())
}

/// Says on standard error what the console found at start: an older pgqueue, a read-only
/// role or standby, or no database yet (it keeps trying at each request).
async fn report_database(pool: &deadpool_postgres::Pool, read_only: bool) {
    let caps = match pool.get().await {
        Ok(client) => db::Capabilities::of(&client, read_only).await,
        Err(e) => Err(e.into()),
    };
    match caps {
        Ok(caps) => {
            if let Some(warning) = caps.version_warning() {
                eprintln!("pgqueue-console: {warning}");
            }
            if let Some(reason) = caps.read_only_reason() {
                eprintln!("pgqueue-console: {reason}");
            }
        }
        Err(f) => eprintln!("pgqueue-console: {} (pages say so until it answers)", f.message()),
    }
}
