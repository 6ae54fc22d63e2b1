//! How times, durations and JSON read on the pages.

use chrono::{DateTime, Utc};

/// A timestamp in UTC to the second, or a dash.
pub fn time(t: Option<DateTime<Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string()).unwrap_or_else(|| "—".into())
}

/// A duration in seconds as its two largest units ("3 m 12 s", "2 h 5 m"), or a dash.
pub fn duration(seconds: Option<f64>) -> String {
    let Some(s) = seconds else { return "—".into() };
    let sign = if s < 0.0 { "-" } else { "" };
    let s = s.abs();
    if s < 10.0 {
        return format!("{sign}{s:.1} s");
    }
    let s = s.round() as u64;
    let (d, h, m, sec) = (s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
    let text = match (d, h, m) {
        (0, 0, 0) => format!("{sec} s"),
        (0, 0, m) => format!("{m} m {sec} s"),
        (0, h, m) => format!("{h} h {m} m"),
        (d, h, _) => format!("{d} d {h} h"),
    };
    format!("{sign}{text}")
}

/// JSON indented for reading; NULL as a dash.
pub fn json(value: Option<&serde_json::Value>) -> String {
    match value {
        Some(v) => serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()),
        None => "—".into(),
    }
}

/// The first `max` characters of compact JSON, with an ellipsis when cut.
pub fn json_preview(value: &serde_json::Value, max: usize) -> String {
    let text = value.to_string();
    if text.chars().count() <= max { text } else { text.chars().take(max).chain(std::iter::once('…')).collect() }
}

/// A search term for `ILIKE '%' || term || '%'`, with the pattern characters taken
/// literally.
pub fn like_literal(term: &str) -> String {
    term.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_in_two_units() {
        assert_eq!(duration(None), "—");
        assert_eq!(duration(Some(1.23)), "1.2 s");
        assert_eq!(duration(Some(42.0)), "42 s");
        assert_eq!(duration(Some(192.0)), "3 m 12 s");
        assert_eq!(duration(Some(7500.0)), "2 h 5 m");
        assert_eq!(duration(Some(200000.0)), "2 d 7 h");
        assert_eq!(duration(Some(-30.0)), "-30 s");
    }

    #[test]
    fn json_is_indented_and_previews_cut() {
        let v = serde_json::json!({"a": 1});
        assert_eq!(json(Some(&v)), "{\n  \"a\": 1\n}");
        assert_eq!(json(None), "—");
        assert_eq!(json_preview(&serde_json::json!({"text": "abcdef"}), 10), "{\"text\":\"a…");
    }

    #[test]
    fn like_patterns_are_literal() {
        assert_eq!(like_literal("50%_off\\"), "50\\%\\_off\\\\");
    }
}
