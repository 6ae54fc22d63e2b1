//! What the console is started with, and the rule that keeps it from being exposed without
//! authentication.

use std::fmt;
use std::net::SocketAddr;

/// The console's settings (the binary fills them from its flags and environment).
#[derive(Clone, Debug)]
pub struct Config {
    /// A libpq-style connection string or `postgresql://` URI.
    pub dsn: String,
    /// Where to listen; only a loopback address may go without authentication.
    pub listen: SocketAddr,
    /// An Argon2 password hash in PHC form (`pgqueue-console hash-password`).
    pub password_hash: Option<String>,
    /// A shared secret, for `Authorization: Bearer` or the login form.
    pub token: Option<String>,
    /// No actions, whatever the database role may do.
    pub read_only: bool,
    /// Marks cookies `Secure`: set it when a TLS reverse proxy is in front.
    pub secure_cookies: bool,
}

/// Why a configuration is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// Listening beyond loopback with no password hash and no token.
    ExposedWithoutAuth(SocketAddr),
    /// The password hash is not an Argon2 hash in PHC form.
    BadPasswordHash(String),
    /// A token short enough to guess.
    ShortToken,
    /// The connection string does not parse.
    BadDsn(String),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::ExposedWithoutAuth(addr) => write!(
                f,
                "refusing to listen on {addr} without authentication: \
                 give --password-hash or --token, or listen on a loopback address"
            ),
            ConfigError::BadPasswordHash(e) => {
                write!(
                    f,
                    "the password hash is not an Argon2 PHC string ({e}): make one with `pgqueue-console hash-password`"
                )
            }
            ConfigError::ShortToken => write!(f, "the token must have at least {MIN_TOKEN_CHARS} characters"),
            ConfigError::BadDsn(e) => write!(f, "the connection string does not parse: {e}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A token shorter than this is refused.
pub const MIN_TOKEN_CHARS: usize = 16;

impl Config {
    /// A configuration for `dsn` with the defaults: loopback, no authentication, actions on.
    pub fn new(dsn: impl Into<String>) -> Config {
        Config {
            dsn: dsn.into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            password_hash: None,
            token: None,
            read_only: false,
            secure_cookies: false,
        }
    }

    /// Whether logging in is required.
    pub fn auth_required(&self) -> bool {
        self.password_hash.is_some() || self.token.is_some()
    }

    /// Checks the configuration before anything listens: a non-loopback address needs
    /// authentication, and what authentication is given must be usable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(hash) = &self.password_hash {
            argon2::PasswordHash::new(hash).map_err(|e| ConfigError::BadPasswordHash(e.to_string()))?;
        }
        if self.token.as_ref().is_some_and(|t| t.chars().count() < MIN_TOKEN_CHARS) {
            return Err(ConfigError::ShortToken);
        }
        if !self.listen.ip().is_loopback() && !self.auth_required() {
            return Err(ConfigError::ExposedWithoutAuth(self.listen));
        }
        self.dsn.parse::<tokio_postgres::Config>().map_err(|e| ConfigError::BadDsn(e.to_string()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(addr: &str) -> Config {
        Config { listen: addr.parse().unwrap(), ..Config::new("host=127.0.0.1 dbname=postgres") }
    }

    #[test]
    fn loopback_needs_no_auth() {
        assert_eq!(at("127.0.0.1:8080").validate(), Ok(()));
        assert_eq!(at("[::1]:8080").validate(), Ok(()));
        assert_eq!(at("127.0.0.2:0").validate(), Ok(()));
    }

    #[test]
    fn other_addresses_need_auth() {
        for addr in ["0.0.0.0:8080", "[::]:8080", "192.0.2.10:80"] {
            assert_eq!(at(addr).validate(), Err(ConfigError::ExposedWithoutAuth(addr.parse().unwrap())));
        }
        let with_token = Config { token: Some("a-long-enough-token".into()), ..at("0.0.0.0:8080") };
        assert_eq!(with_token.validate(), Ok(()));
        let hash = crate::auth::hash_password("secret").unwrap();
        let with_password = Config { password_hash: Some(hash), ..at("0.0.0.0:8080") };
        assert_eq!(with_password.validate(), Ok(()));
    }

    #[test]
    fn unusable_auth_is_refused() {
        let short = Config { token: Some("short".into()), ..at("0.0.0.0:8080") };
        assert_eq!(short.validate(), Err(ConfigError::ShortToken));
        let bad = Config { password_hash: Some("plaintext".into()), ..at("0.0.0.0:8080") };
        assert!(matches!(bad.validate(), Err(ConfigError::BadPasswordHash(_))));
    }

    #[test]
    fn a_bad_dsn_is_refused() {
        let bad = Config { dsn: "port=notaport".into(), ..at("127.0.0.1:8080") };
        assert!(matches!(bad.validate(), Err(ConfigError::BadDsn(_))));
    }
}
