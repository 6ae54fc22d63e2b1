//! Per-queue minute rollups (`pgqueue.queue_minutes`), the counting side: what a commit
//! counts, and what a rollup that drained the shared counters but failed to record them keeps
//! for the next one. Pure logic; the tick drains and records (src/tick.rs).
//!
//! Commits add their events to their queue's shared entry (pending.rs); a rollup swaps them
//! to zero and adds them to the minute's row. A failed record keeps what it drained in the
//! process (`Carry`), so nothing is lost but what a crash takes between the drain and the
//! commit, or what a queue's entry held when the server stopped: counts for charts, never a
//! message or a limit.

use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// Sent, completed, dead-lettered, retried.
pub const EVENTS: usize = 4;
pub const SENT: usize = 0;
pub const COMPLETED: usize = 1;
pub const DEAD: usize = 2;
pub const RETRIED: usize = 3;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Events(pub [i64; EVENTS]);

impl Events {
    /// What `n` messages moving `from` → `to` count (the states `pgqueue._note` names: NULL
    /// for new, 'completed' or 'dead' for history, 'history' for redriven).
    pub fn of_move(n: i64, from: Option<&str>, to: Option<&str>) -> Events {
        let mut e = Events::default();
        match (from, to) {
            (None, Some("ready" | "delayed" | "pending")) => e.0[SENT] = n,
            (Some("claimed"), Some("ready" | "delayed")) => e.0[RETRIED] = n,
            (Some(_), Some("completed")) => e.0[COMPLETED] = n,
            (Some(_), Some("dead")) => e.0[DEAD] = n,
            _ => {}
        }
        e
    }

    pub fn add(&mut self, other: &Events) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }

    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|&n| n == 0)
    }
}

/// Events drained from shared memory whose record has not committed yet, per queue.
#[derive(Debug, Default)]
pub struct Carry(BTreeMap<String, Events>);

impl Carry {
    pub fn add(&mut self, queue: &str, events: Events) {
        if !events.is_zero() {
            self.0.entry(queue.to_string()).or_default().add(&events);
        }
    }

    pub fn get(&self, queue: &str) -> Events {
        self.0.get(queue).copied().unwrap_or_default()
    }

    /// The rows of a record (`pgqueue._roll_up`): what was just drained — each queue's events
    /// and its depth when known — added to what is carried, one row per queue with events or a
    /// depth that is not all zero. What was drained stays carried until `recorded`.
    pub fn rows(&mut self, drained: Vec<(String, Events, Option<[i64; 3]>)>) -> Vec<Value> {
        let mut depths = BTreeMap::new();
        for (queue, events, depth) in drained {
            self.add(&queue, events);
            if let Some(depth) = depth.filter(|d| d.iter().any(|&n| n != 0)) {
                depths.insert(queue, depth);
            }
        }
        let queues: BTreeSet<&String> = self.0.keys().chain(depths.keys()).collect();
        queues
            .into_iter()
            .map(|queue| {
                let (e, d) = (self.get(queue).0, depths.get(queue));
                json!({
                    "queue": queue, "sent": e[SENT], "completed": e[COMPLETED], "dead": e[DEAD], "retried": e[RETRIED],
                    "ready": d.map(|d| d[0]), "delayed": d.map(|d| d[1]), "claimed": d.map(|d| d[2]),
                })
            })
            .collect()
    }

    /// The record committed: nothing is carried any more.
    pub fn recorded(&mut self) {
        self.0.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn moves_count_as_the_rollup_columns_say() {
        assert_eq!(Events::of_move(3, None, Some("ready")).0, [3, 0, 0, 0]);
        assert_eq!(Events::of_move(2, None, Some("delayed")).0, [2, 0, 0, 0]);
        assert_eq!(Events::of_move(1, Some("claimed"), Some("completed")).0, [0, 1, 0, 0]);
        assert_eq!(Events::of_move(1, Some("ready"), Some("dead")).0, [0, 0, 1, 0]);
        assert_eq!(Events::of_move(4, Some("claimed"), Some("delayed")).0, [0, 0, 0, 4]);
        // Promotion, claims, redrive and the old releases' "to history" (NULL) count nothing.
        assert!(Events::of_move(5, Some("delayed"), Some("ready")).is_zero());
        assert!(Events::of_move(5, Some("ready"), Some("claimed")).is_zero());
        assert!(Events::of_move(5, Some("history"), Some("ready")).is_zero());
        assert!(Events::of_move(5, Some("claimed"), None).is_zero());
    }

    #[test]
    fn a_record_has_a_row_per_queue_with_events_or_a_depth() {
        let mut carry = Carry::default();
        carry.add("carried", Events([1, 0, 0, 0]));
        let rows = carry.rows(vec![
            ("carried".into(), Events([2, 1, 0, 0]), None),
            ("deep".into(), Events::default(), Some([5, 1, 0])),
            ("idle".into(), Events::default(), Some([0, 0, 0])),
        ]);
        assert_eq!(
            rows,
            vec![
                json!({"queue": "carried", "sent": 3, "completed": 1, "dead": 0, "retried": 0,
                       "ready": null, "delayed": null, "claimed": null}),
                json!({"queue": "deep", "sent": 0, "completed": 0, "dead": 0, "retried": 0,
                       "ready": 5, "delayed": 1, "claimed": 0}),
            ]
        );
        // Kept until the record commits.
        assert_eq!(carry.get("carried").0, [3, 1, 0, 0]);
        carry.recorded();
        assert!(carry.get("carried").is_zero());
    }

    #[derive(Clone, Debug)]
    enum Step {
        /// A commit counted `n` events of kind `kind` in queue `q`.
        Commit { q: usize, kind: usize, n: i64 },
        /// A rollup drains every queue and its record commits, or fails.
        Rollup { commits: bool },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0..3usize, 0..EVENTS, 1..50i64).prop_map(|(q, kind, n)| Step::Commit { q, kind, n }),
            2 => any::<bool>().prop_map(|commits| Step::Rollup { commits }),
        ]
    }

    proptest! {
        /// Against a model that just adds up every committed event: what the table holds plus
        /// what shared memory and the carry hold is exactly that, after any sequence of
        /// commits and of failing and committing rollups; once a rollup commits, nothing is
        /// carried.
        #[test]
        fn no_count_is_lost_or_counted_twice(steps in proptest::collection::vec(step(), 1..200)) {
            let names = ["a", "b", "c"];
            let mut shared = [Events::default(); 3];
            let mut table = [Events::default(); 3];
            let mut model = [Events::default(); 3];
            let mut carry = Carry::default();
            for s in steps {
                match s {
                    Step::Commit { q, kind, n } => {
                        shared[q].0[kind] += n;
                        model[q].0[kind] += n;
                    }
                    Step::Rollup { commits } => {
                        for (q, name) in names.iter().enumerate() {
                            carry.add(name, std::mem::take(&mut shared[q]));
                        }
                        if commits {
                            for (q, name) in names.iter().enumerate() {
                                table[q].add(&carry.get(name));
                            }
                            carry.recorded();
                            prop_assert_eq!(carry.0.len(), 0);
                        }
                    }
                }
                for (q, name) in names.iter().enumerate() {
                    let mut held = table[q];
                    held.add(&shared[q]);
                    held.add(&carry.get(name));
                    prop_assert_eq!(held, model[q]);
                }
            }
        }
    }
}
