//! `pgqueue-console`: the operator console's command line.

use clap::{Parser, Subcommand};
use pgqueue_console::{Config, auth};
use std::io::BufRead;
use std::net::SocketAddr;

#[derive(Parser)]
#[command(name = "pgqueue-console", version, about = "pgqueue's operator console, in the browser")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// The database: a libpq connection string or postgresql:// URI.
    #[arg(long, env = "PGQUEUE_CONSOLE_DSN", default_value = "host=127.0.0.1 dbname=postgres")]
    dsn: String,
    /// Where to listen. Only a loopback address may be used without --password-hash or --token.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// An Argon2 hash in PHC form (`pgqueue-console hash-password`): the login form asks for its password.
    #[arg(long, env = "PGQUEUE_CONSOLE_PASSWORD_HASH", hide_env_values = true)]
    password_hash: Option<String>,
    /// A token (16 characters or more) for `Authorization: Bearer` or the login form.
    #[arg(long, env = "PGQUEUE_CONSOLE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// No actions, whatever the database role may do.
    #[arg(long)]
    read_only: bool,
    /// Marks cookies Secure (behind a TLS reverse proxy).
    #[arg(long)]
    secure_cookies: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Reads a password from standard input and prints its hash for --password-hash.
    HashPassword,
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if let Some(Command::HashPassword) = cli.command {
        eprintln!("password (read from standard input, one line):");
        let mut line = String::new();
        if std::io::stdin().lock().read_line(&mut line).is_err() || line.trim_end_matches(['\r', '\n']).is_empty() {
            fail("no password given");
        }
        match auth::hash_password(line.trim_end_matches(['\r', '\n'])) {
            Ok(hash) => println!("{hash}"),
            Err(e) => fail(&e),
        }
        return;
    }
    let config = Config {
        dsn: cli.dsn,
        listen: cli.listen,
        password_hash: cli.password_hash.filter(|s| !s.is_empty()),
        token: cli.token.filter(|s| !s.is_empty()),
        read_only: cli.read_only,
        secure_cookies: cli.secure_cookies,
    };
    // Refused before binding, so a refused configuration never listens at all.
    if let Err(e) = config.validate() {
        fail(&e.to_string());
    }
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(l) => l,
        Err(e) => fail(&format!("cannot listen on {}: {e}", config.listen)),
    };
    eprintln!("pgqueue-console: listening on http://{}/", config.listen);
    tokio::select! {
        result = pgqueue_console::serve(config, listener) => {
            if let Err(e) = result {
                fail(&e.to_string());
            }
        }
        _ = tokio::signal::ctrl_c() => eprintln!("pgqueue-console: stopped"),
    }
}

fn fail(message: &str) -> ! {
    eprintln!("pgqueue-console: {message}");
    std::process::exit(2);
}
