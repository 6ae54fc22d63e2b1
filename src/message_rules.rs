//! What each state of a row of `pgqueue.messages` requires of its other columns. The table's
//! one CHECK constraint (`messages_state_rules`, sql/schema.sql) calls `pgqueue._message_ok`,
//! which asks `valid`. One function rather than a CHECK per rule: PostgreSQL reads every
//! CHECK's stored expression anew for each statement that writes the table, and eight of them
//! were a fifth of a claim's time (docs/benchmarks/history.md, 0.19.0).

/// Every state a message can be in.
pub const STATES: [&str; 5] = ["ready", "delayed", "claimed", "pending", "parked"];

/// Which of a message's optional columns are set (not NULL).
#[derive(Clone, Copy, Debug, Default)]
pub struct Set {
    pub visible_at: bool,
    pub claim_token: bool,
    pub lease_expires_at: bool,
    pub session_pid: bool,
    pub cancel_requested_at: bool,
    pub after: bool,
    pub park_key: bool,
    pub park_until: bool,
}

/// Whether a message in `state` with `priority` and the columns `set` may be stored.
pub fn valid(state: &str, priority: i16, set: Set) -> bool {
    if !STATES.contains(&state) || !(-1000..=1000).contains(&priority) {
        return false;
    }
    let (claimed, delayed, pending, parked) =
        (state == "claimed", state == "delayed", state == "pending", state == "parked");
    // Only a claim is bound to a session or asked to stop. A claim through the claim ledger
    // may leave its row 'ready' (step 3b of the write path): such a row may be asked to
    // stop (0.24.0), and carry the lease of a renewal (the rule below always allowed it).
    (claimed || !set.session_pid && (!set.cancel_requested_at || state == "ready"))
        // Delayed rows have a due time, and only they, but for pending ones (due once released).
        && (pending || delayed == set.visible_at)
        // A pending message has parents.
        && (!pending || set.after)
        // A parked one has a key and a timeout, and only it.
        && parked == (set.park_key && set.park_until)
        // A claimed one has a token and a lease, and only it.
        && claimed == (set.claim_token && set.lease_expires_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CHECK constraints of 0.18.0, one per rule, as SQL evaluated them (no column is
    /// NULL where these read it: state and priority are NOT NULL), but for the one change
    /// since: a cancel request on a 'ready' row (0.24.0).
    fn constraints_of_0_18(state: &str, priority: i16, s: Set) -> bool {
        let is = |x: &str| state == x;
        STATES.contains(&state)
            && (-1000..=1000).contains(&priority)
            && (!s.session_pid || is("claimed"))
            && (!s.cancel_requested_at || is("claimed") || is("ready"))
            && (is("pending") || is("delayed") == s.visible_at)
            && (!is("pending") || s.after)
            && is("parked") == (s.park_key && s.park_until)
            && is("claimed") == (s.claim_token && s.lease_expires_at)
    }

    fn set(bits: u32) -> Set {
        let b = |i: u32| bits & (1 << i) != 0;
        Set {
            visible_at: b(0),
            claim_token: b(1),
            lease_expires_at: b(2),
            session_pid: b(3),
            cancel_requested_at: b(4),
            after: b(5),
            park_key: b(6),
            park_until: b(7),
        }
    }

    #[test]
    fn the_one_check_allows_exactly_what_the_eight_did() {
        let states = STATES.iter().copied().chain(["", "done", "Ready", "claimed "]);
        let mut allowed = 0;
        for state in states {
            for priority in [i16::MIN, -1001, -1000, 0, 1000, 1001, i16::MAX] {
                for bits in 0..256 {
                    let expected = constraints_of_0_18(state, priority, set(bits));
                    assert_eq!(valid(state, priority, set(bits)), expected, "{state:?} {priority} {:?}", set(bits));
                    allowed += usize::from(expected);
                }
            }
        }
        // Something is allowed in every state (the comparison above is not vacuous).
        assert!(allowed > 0);
        for state in STATES {
            assert!((0..256).any(|bits| valid(state, 0, set(bits))), "{state} never valid");
        }
    }

    #[test]
    fn each_state_in_its_plain_shape() {
        let none = Set::default();
        assert!(valid("ready", 0, none));
        assert!(valid("delayed", 0, Set { visible_at: true, ..none }));
        assert!(!valid("delayed", 0, none));
        assert!(valid("claimed", 0, Set { claim_token: true, lease_expires_at: true, ..none }));
        assert!(!valid("claimed", 0, Set { claim_token: true, ..none }));
        assert!(valid("pending", 0, Set { after: true, ..none }));
        assert!(valid("pending", 0, Set { after: true, visible_at: true, ..none }));
        assert!(valid("parked", 0, Set { park_key: true, park_until: true, ..none }));
        assert!(!valid("ready", 0, Set { session_pid: true, ..none }));
        // As a claim through the ledger leaves it, renewed and asked to stop.
        assert!(valid("ready", 0, Set { lease_expires_at: true, cancel_requested_at: true, ..none }));
        assert!(!valid("delayed", 0, Set { visible_at: true, cancel_requested_at: true, ..none }));
        assert!(!valid("ready", 1001, none));
    }
}
