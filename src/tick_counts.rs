//! What a tick hands to `pgqueue._record_tick`: counters that add up, and a few values of
//! the tick itself. When recording fails, the worker keeps the tick's counts and records
//! them with the next tick's, merged here: no count is lost, the failure included.

use serde_json::{Map, Value, json};

/// Values that are not counters: `first`, `pruned` and `rolled_up` (whether either tick was
/// one), the latest `tick_interval_ms`, and the latest `error` (the later tick's, else the
/// earlier's).
const FLAGS: [&str; 3] = ["first", "pruned", "rolled_up"];
const LATEST: [&str; 2] = ["tick_interval_ms", "error"];

/// Adds `earlier` (a tick not recorded) into `later`.
pub fn merge(later: &mut Map<String, Value>, earlier: Map<String, Value>) {
    for (key, value) in earlier {
        let k = key.as_str();
        if FLAGS.contains(&k) {
            let either = value.as_bool().unwrap_or(false) || later.get(k).and_then(Value::as_bool).unwrap_or(false);
            later.insert(key, json!(either));
        } else if LATEST.contains(&k) {
            later.entry(key).or_insert(value);
        } else {
            let sum = value.as_i64().unwrap_or(0) + later.get(k).and_then(Value::as_i64).unwrap_or(0);
            later.insert(key, json!(sum));
        }
    }
}

/// A tick's counts after its own record failed with `error`: one more failed step.
pub fn record_failed(counts: &mut Map<String, Value>, error: &str) {
    let failures = counts.get("tick_failures").and_then(Value::as_i64).unwrap_or(0);
    counts.insert("tick_failures".into(), json!(failures + 1));
    counts.insert("error".into(), json!(format!("record: {error}")));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn counters_add_up_and_the_latest_values_win() {
        let mut later = map(json!({"ticks": 1, "rearmed": 2, "first": false, "pruned": false, "rolled_up": false,
                                   "tick_interval_ms": 200, "tick_failures": 0}));
        let earlier = map(json!({"ticks": 1, "rearmed": 5, "promoted": 3, "first": true, "pruned": false,
                                 "rolled_up": true, "tick_interval_ms": 1000, "tick_failures": 1,
                                 "error": "record: lock timeout"}));
        merge(&mut later, earlier);
        assert_eq!(
            Value::Object(later),
            json!({"ticks": 2, "rearmed": 7, "promoted": 3, "first": true, "pruned": false, "rolled_up": true,
                   "tick_interval_ms": 200, "tick_failures": 1, "error": "record: lock timeout"})
        );
    }

    #[test]
    fn a_later_error_is_kept() {
        let mut later = map(json!({"error": "prune: boom", "tick_failures": 1}));
        merge(&mut later, map(json!({"error": "record: lock timeout", "tick_failures": 1})));
        assert_eq!(later["error"], json!("prune: boom"));
        assert_eq!(later["tick_failures"], json!(2));
    }

    #[test]
    fn a_failed_record_counts_itself() {
        let mut counts = map(json!({"tick_failures": 1, "error": "prune: boom"}));
        record_failed(&mut counts, "lock timeout");
        assert_eq!(Value::Object(counts), json!({"tick_failures": 2, "error": "record: lock timeout"}));
    }
}
