//! Who may use the console: a password (kept only as an Argon2 hash) or a token, exchanged at
//! the login form for a session cookie; or the token as `Authorization: Bearer`.

use crate::csrf::{constant_time_eq, random_hex};
use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The session cookie.
pub const SESSION_COOKIE: &str = "pgqc_session";
/// How long a session lasts without logging in again.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// The Argon2id hash, in PHC form, that `--password-hash` takes.
pub fn hash_password(password: &str) -> Result<String, String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| e.to_string())?;
    let salt = SaltString::encode_b64(&bytes).map_err(|e| e.to_string())?;
    Argon2::default().hash_password(password.as_bytes(), &salt).map(|h| h.to_string()).map_err(|e| e.to_string())
}

/// Whether `password` matches `hash` (a PHC string; a malformed one matches nothing).
pub fn verify_password(hash: &str, password: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|h| Argon2::default().verify_password(password.as_bytes(), &h).is_ok())
}

/// The secrets a login may present.
pub struct Secrets {
    pub password_hash: Option<String>,
    pub token: Option<String>,
}

impl Secrets {
    /// Whether `secret` is the password or the token.
    pub fn accepts(&self, secret: &str) -> bool {
        self.token_matches(secret) || self.password_hash.as_deref().is_some_and(|h| verify_password(h, secret))
    }

    /// Whether `presented` is the token.
    pub fn token_matches(&self, presented: &str) -> bool {
        self.token.as_deref().is_some_and(|t| constant_time_eq(t.as_bytes(), presented.as_bytes()))
    }
}

/// The bearer token of an `Authorization` header value.
pub fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Sessions in memory: a restart of the console logs everyone out, which is what one wants
/// from a console with a single shared secret.
#[derive(Default)]
pub struct Sessions {
    live: Mutex<HashMap<String, Session>>,
}

#[derive(Clone)]
struct Session {
    user: String,
    expires: Instant,
}

impl Sessions {
    /// Opens a session for `user` (the name given at login, for the audit log); returns the
    /// cookie value.
    pub fn open(&self, user: &str) -> String {
        let id = random_hex(32);
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        live.retain(|_, s| s.expires > now);
        live.insert(id.clone(), Session { user: user.to_string(), expires: now + SESSION_LIFETIME });
        id
    }

    /// The user of a live session.
    pub fn user(&self, id: &str) -> Option<String> {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.get(id).filter(|s| s.expires > Instant::now()).map(|s| s.user.clone())
    }

    pub fn close(&self, id: &str) {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_verifies_its_password_only() {
        let hash = hash_password("correct horse").unwrap();
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_password(&hash, "correct horse"));
        assert!(!verify_password(&hash, "correct horse "));
        assert!(!verify_password("not a hash", "correct horse"));
    }

    #[test]
    fn secrets_accept_the_password_or_the_token() {
        let s = Secrets { password_hash: Some(hash_password("pw").unwrap()), token: Some("t".repeat(20)) };
        assert!(s.accepts("pw"));
        assert!(s.accepts(&"t".repeat(20)));
        assert!(!s.accepts("nope"));
        assert!(!s.token_matches("pw"));
        let none = Secrets { password_hash: None, token: None };
        assert!(!none.accepts(""));
    }

    #[test]
    fn bearer_headers() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer"), None);
    }

    #[test]
    fn sessions_open_and_close() {
        let s = Sessions::default();
        let id = s.open("alice");
        assert_eq!(s.user(&id).as_deref(), Some("alice"));
        assert_eq!(s.user("forged"), None);
        s.close(&id);
        assert_eq!(s.user(&id), None);
    }
}
