//! Cross-site request forgery: a double-submit cookie (SameSite=Strict, so another site's
//! page never sends it) whose value every form repeats, and an `Origin` that, when the
//! browser sends one, must be this host's.

/// The cookie holding the token; each form repeats it in the `csrf` field.
pub const COOKIE: &str = "pgqc_csrf";
/// The form field.
pub const FIELD: &str = "csrf";

/// A new random token (32 bytes, hex).
pub fn new_token() -> String {
    random_hex(32)
}

/// `bytes` random bytes from the operating system, in hex.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).expect("the operating system's random source");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Equality that takes as long whatever the first differing byte, so the time a refusal
/// takes says nothing about how much of a secret was right.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    subtle::ConstantTimeEq::ct_eq(a, b).into()
}

/// Why a POST was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The `Origin` header names another site.
    ForeignOrigin(String),
    /// No token cookie, no token field, or the two differ.
    BadToken,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::ForeignOrigin(o) => write!(f, "refused: the request came from another site ({o})"),
            Refusal::BadToken => {
                write!(f, "refused: the form's CSRF token is missing or wrong (reload the page and try again)")
            }
        }
    }
}

/// What the browser says about where a request comes from.
#[derive(Clone, Copy, Default)]
pub struct Provenance<'a> {
    /// The `Origin` header. With `Referrer-Policy: no-referrer` Chromium sends `null` for
    /// same-origin form posts too, so `null` is judged by `Sec-Fetch-Site`.
    pub origin: Option<&'a str>,
    /// The `Host` header.
    pub host: Option<&'a str>,
    /// The `Sec-Fetch-Site` header (`same-origin`, `same-site`, `cross-site`, `none`).
    pub fetch_site: Option<&'a str>,
}

/// Checks a state-changing request: it must not come from another site (by `Sec-Fetch-Site`
/// and `Origin`, when the browser sends them), and the form's token must equal the cookie's.
pub fn check(from: Provenance, cookie: Option<&str>, field: Option<&str>) -> Result<(), Refusal> {
    if let Some(site) = from.fetch_site.filter(|s| *s != "same-origin" && *s != "none") {
        return Err(Refusal::ForeignOrigin(site.to_string()));
    }
    match from.origin {
        Some("null") if from.fetch_site != Some("same-origin") => return Err(Refusal::ForeignOrigin("null".into())),
        Some("null") | None => {}
        Some(origin) => {
            let same = from.host.is_some_and(|h| origin == format!("http://{h}") || origin == format!("https://{h}"));
            if !same {
                return Err(Refusal::ForeignOrigin(origin.to_string()));
            }
        }
    }
    match (cookie, field) {
        (Some(c), Some(f)) if !c.is_empty() && constant_time_eq(c.as_bytes(), f.as_bytes()) => Ok(()),
        _ => Err(Refusal::BadToken),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: Option<&str> = Some("127.0.0.1:8080");

    fn from(origin: Option<&'static str>, fetch_site: Option<&'static str>) -> Provenance<'static> {
        Provenance { origin, host: HOST, fetch_site }
    }

    #[test]
    fn a_matching_token_from_this_host_passes() {
        assert_eq!(check(from(None, None), Some("abc"), Some("abc")), Ok(()));
        assert_eq!(check(from(Some("http://127.0.0.1:8080"), Some("same-origin")), Some("abc"), Some("abc")), Ok(()));
        let proxied = Provenance { origin: Some("https://q.example"), host: Some("q.example"), fetch_site: None };
        assert_eq!(check(proxied, Some("abc"), Some("abc")), Ok(()));
        // Chromium's same-origin form post under Referrer-Policy: no-referrer.
        assert_eq!(check(from(Some("null"), Some("same-origin")), Some("abc"), Some("abc")), Ok(()));
    }

    #[test]
    fn a_missing_or_wrong_token_is_refused() {
        assert_eq!(check(from(None, None), Some("abc"), None), Err(Refusal::BadToken));
        assert_eq!(check(from(None, None), None, Some("abc")), Err(Refusal::BadToken));
        assert_eq!(check(from(None, None), Some("abc"), Some("abd")), Err(Refusal::BadToken));
        assert_eq!(check(from(None, None), Some(""), Some("")), Err(Refusal::BadToken));
    }

    #[test]
    fn another_origin_is_refused_even_with_the_token() {
        let refused = check(from(Some("http://evil.example"), None), Some("abc"), Some("abc"));
        assert_eq!(refused, Err(Refusal::ForeignOrigin("http://evil.example".into())));
        // An opaque origin (a sandboxed frame elsewhere) and cross-site fetches.
        assert!(check(from(Some("null"), None), Some("abc"), Some("abc")).is_err());
        assert!(check(from(Some("null"), Some("cross-site")), Some("abc"), Some("abc")).is_err());
        assert!(check(from(None, Some("same-site")), Some("abc"), Some("abc")).is_err());
        let no_host = Provenance { origin: Some("http://127.0.0.1:8080"), host: None, fetch_site: None };
        assert!(check(no_host, Some("abc"), Some("abc")).is_err());
    }

    #[test]
    fn tokens_are_random_hex() {
        let (a, b) = (new_token(), new_token());
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn constant_time_eq_is_eq() {
        assert!(constant_time_eq(b"same", b"same"));
        assert!(!constant_time_eq(b"same", b"samf"));
        assert!(!constant_time_eq(b"same", b"same!"));
    }
}
