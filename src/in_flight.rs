//! Which messages of a queue are in flight, as pure logic: the shared-memory part of stage 1 of
//! the write path (docs/design/write-path.md, "Stage 1 in detail"), where a claim no longer
//! writes the message row.
//!
//! A claim locks a message's row (`FOR UPDATE SKIP LOCKED`: a lock record, no new row version;
//! its re-check sees a release or an ack that committed since the claim's snapshot) and then
//! takes it by adding `(msg_id, attempt)` here under the table's lock, before it hands the
//! message out; the entry stays until the release or finish of that attempt has committed
//! (`end`), or goes when the claim rolls back. The row lock excludes claims under way; the set
//! is what knows of committed ones, which wrote nothing to the row. The set **vouches** for
//! every msg_id outside its *unknown range*: such a message, absent, is held by nobody. Inside
//! it (everything after a restart; the messages a full set had no room for, and those between
//! them), "present" still means held, but "absent" means "ask the ledger", in a snapshot taken
//! after the row lock (a claim that committed since the claim's own snapshot released that
//! lock first), and claims add their messages here while there is room. A set that filled up
//! widens the range only by what it could not keep, so that claims of newer messages still
//! ask nothing (a set that stopped vouching for anything once full made every claim read the
//! ledger: docs/design/write-path.md, "the rescue cliff"). The tick makes the set
//! exact again from the claim ledger (`begin_rebuild`, `finish_rebuild`), refusing while a
//! claim that could not add its messages is under way or committed meanwhile, and replaying
//! the ends that committed while it read. The table is full at half its slots: an
//! open-addressing table filled to the brim probes every slot for each message it lacks.
//! Entries are keyed by attempt too, so an end that reaches here after the next claim of the
//! same message (possible while the set is not exact) removes nothing of it.
//!
//! Losing all of it costs speed (ledger checks until the next rebuild), never a message: the
//! tests below check, against a model of claims, commits, aborts, ends, restarts and
//! rebuilds, that a message is never handed through the set while someone holds it.
#![cfg_attr(not(test), allow(dead_code))]

/// What `take` tells a claim, which holds the message's row lock, about the message.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Take {
    /// Someone holds it (or a claim under way took it): pass it over.
    Skip,
    /// Nobody holds it: hand it out.
    Free,
    /// The set cannot vouch for it (in the unknown range): hand it out only if no live ledger
    /// row holds it, asked in a snapshot taken after the row lock; if one does, `untake` it.
    Ask,
    /// As `Ask`, and the set had no room for it. The claim must pass its count of these to
    /// `commit` or `abort`.
    AskUnrecorded,
}

/// What the set says of a message to a claim that holds its row lock and must not hand it
/// out while a claim that wrote only the ledger holds it (`holds`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Holds {
    /// A claim the set lists at the attempt the row is at holds it: pass it over.
    Yes,
    /// As `Yes`, by a claim of another transaction whose commit or rollback has not reached
    /// the set yet (a rollback's row lock goes before its callback runs): pass it over, and
    /// look at it again once this claim has committed.
    Settling,
    /// Nobody holds it: absent where the set vouches, or listed at an earlier attempt, whose
    /// end the row (locked, so committed) already shows.
    No,
    /// The set cannot say: ask the ledger, in a snapshot taken after the row lock.
    Ask,
}

/// A claim under way (a backend's transaction); never 0, which marks committed entries.
pub type Owner = u32;

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Slot {
    /// 0: empty. Sends number messages from 1; a redrive keeps the msg_id of the dead letter it
    /// brings back, which may be anything but 0 (the caller holds a 0 without an entry).
    msg_id: i64,
    attempt: i32,
    /// The claim under way that took it; 0 once that claim committed.
    owner: Owner,
    /// When its lease ends (microseconds, like TimestampTz).
    lease_end: i64,
}

/// The messages in flight: an open-addressing table over `slots` (a power of two of them),
/// plain data for shared memory, where `S` is a slice of it (held.rs; its size is a setting)
/// and in the tests a `Vec`. The caller holds the table's lock for every call.
#[repr(C)]
pub struct InFlight<S> {
    /// The msg_ids (inclusive) whose holds may be missing; None: the set is exact.
    unknown: Option<(i64, i64)>,
    len: usize,
    slots: S,
    /// Claims under way that took messages the set had no room for.
    unrecorded: u32,
    /// Bumped by every restart and every `begin_rebuild`: a rebuild finishes only with the
    /// number it began with.
    epoch: u64,
    rebuilding: bool,
    /// The rebuild under way cannot finish: a claim the set does not know of committed, or
    /// more ends than the log holds.
    spoiled: bool,
    /// The ends (msg_id and attempt; owner 0) and renewals (msg_id, attempt and lease end;
    /// owner 1) that committed while a rebuild read the ledger, in order: as many as the set
    /// keeps claims, since a rebuild's read takes as long as the claims it reads.
    ends: S,
    nends: usize,
    /// Counters for the views: takes that found no room, rebuilds refused.
    pub overflows: u64,
    pub refused: u64,
}

impl<S: std::ops::DerefMut<Target = [Slot]>> InFlight<S> {
    /// A set knowing nothing over `slots` (a power of two of them, at least 2) and `ends`
    /// (half as many: its capacity).
    pub fn new(slots: S, ends: S) -> Self {
        assert!(slots.len().is_power_of_two() && slots.len() >= 2 && ends.len() == slots.len() / 2);
        let mut set = InFlight {
            unknown: None,
            len: 0,
            slots,
            unrecorded: 0,
            epoch: 0,
            rebuilding: false,
            spoiled: false,
            ends,
            nends: 0,
            overflows: 0,
            refused: 0,
        };
        set.restart();
        set
    }

    /// Entries the set keeps at most: half its slots.
    pub fn capacity(&self) -> usize {
        self.slots.len() / 2
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    pub fn is_exact(&self) -> bool {
        self.unknown.is_none()
    }

    /// Whether an absent `msg_id` is known to be held by nobody.
    pub fn vouches_for(&self, msg_id: i64) -> bool {
        self.unknown.is_none_or(|(lo, hi)| msg_id < lo || msg_id > hi)
    }

    fn widen(&mut self, msg_id: i64) {
        self.unknown = Some(self.unknown.map_or((msg_id, msg_id), |(lo, hi)| (lo.min(msg_id), hi.max(msg_id))));
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// No entry, and no claim under way holding messages without one.
    pub fn is_empty(&self) -> bool {
        self.len == 0 && self.unrecorded == 0
    }

    /// The msg_ids (inclusive) the set does not vouch for; None when it is exact.
    pub fn unknown(&self) -> Option<(i64, i64)> {
        self.unknown
    }

    /// Its entries: (msg_id, attempt, owner (0 once committed), lease end).
    pub fn entries(&self) -> impl Iterator<Item = (i64, i32, Owner, i64)> + '_ {
        self.slots.iter().filter(|s| s.msg_id != 0).map(|s| (s.msg_id, s.attempt, s.owner, s.lease_end))
    }

    /// Shared memory lost (or the database is new to it): nothing known until a rebuild.
    pub fn restart(&mut self) {
        self.slots.fill(Slot::default());
        self.len = 0;
        self.unknown = Some((i64::MIN, i64::MAX));
        self.unrecorded = 0;
        self.epoch += 1;
        self.rebuilding = false;
        self.spoiled = false;
        self.nends = 0;
    }

    /// Everything forgotten while the server runs (the extension created again, claims
    /// written around the API): as `restart`, but claims under way keep their counts, and a
    /// rebuild under way cannot finish.
    pub fn forget_all(&mut self) {
        let (unrecorded, rebuilding) = (self.unrecorded, self.rebuilding);
        self.restart();
        self.unrecorded = unrecorded;
        self.rebuilding = rebuilding;
        self.spoiled = rebuilding;
    }

    /// Whatever the set says of `msg_id` may be wrong from now on (a claim or end of it was
    /// prepared: it commits or rolls back elsewhere, later): it is dropped and asked about.
    pub fn forget(&mut self, msg_id: i64) {
        if let Some(i) = self.find(msg_id) {
            self.remove_at(i);
        }
        self.widen(msg_id);
        if self.rebuilding {
            self.spoiled = true;
        }
    }

    /// Whether a claim holds `msg_id`, asked by the claim `owner` holding its row lock;
    /// `attempt` is the next one by the locked row.
    pub fn holds(&self, owner: Owner, msg_id: i64, attempt: i32) -> Holds {
        match self.find(msg_id).map(|i| (self.slots[i].attempt, self.slots[i].owner)) {
            Some((listed, by)) if listed == attempt && by != 0 && by != owner => Holds::Settling,
            Some((listed, _)) if listed == attempt => Holds::Yes,
            Some((listed, _)) if listed < attempt => Holds::No,
            Some(_) => Holds::Ask,
            None if msg_id != 0 && self.vouches_for(msg_id) => Holds::No,
            None => Holds::Ask,
        }
    }

    /// A claim (`owner`), holding `msg_id`'s row lock, asks for it; `attempt` is the next one
    /// by the locked row.
    pub fn take(&mut self, owner: Owner, msg_id: i64, attempt: i32, lease_end: i64) -> Take {
        debug_assert!(owner != 0 && msg_id != 0);
        if self.find(msg_id).is_some() {
            return Take::Skip;
        }
        if self.len == self.capacity() {
            // Claims of this message ask the ledger from now on, until a rebuild: the set
            // cannot say that it is held.
            self.widen(msg_id);
            self.overflows += 1;
            self.unrecorded += 1;
            return Take::AskUnrecorded;
        }
        let vouched = self.vouches_for(msg_id);
        self.insert(Slot { msg_id, attempt, owner, lease_end });
        if vouched { Take::Free } else { Take::Ask }
    }

    /// A claim under way holds `msg_id` without an entry here (the set said `Skip` while the
    /// rows, which decide for now, had it free): as a take that found no room, the set stops
    /// vouching for it, and the claim must pass it to `commit` or `abort` among its unrecorded.
    pub fn hold_unrecorded(&mut self, msg_id: i64) {
        self.forget(msg_id);
        self.unrecorded += 1;
    }

    /// The claim `owner` did not get `msg_id` after all (the ledger holds it).
    pub fn untake(&mut self, owner: Owner, msg_id: i64) {
        if let Some(i) = self.find(msg_id).filter(|&i| self.slots[i].owner == owner) {
            self.remove_at(i);
        }
    }

    /// `owner` committed (its messages are visible as claimed in the ledger). `taken`: the
    /// msg_ids it took (by the claim's own list, not a scan of every slot under the lock).
    pub fn commit(&mut self, owner: Owner, taken: &[i64], unrecorded: u32) {
        for &msg_id in taken {
            if let Some(i) = self.find(msg_id).filter(|&i| self.slots[i].owner == owner) {
                self.slots[i].owner = 0;
            }
        }
        self.settle(unrecorded);
        if unrecorded > 0 && self.rebuilding {
            // Committed after the rebuild's snapshot, perhaps: the set would miss it.
            self.spoiled = true;
        }
    }

    /// `owner` rolled back: the messages it took (`taken`) are free again.
    pub fn abort(&mut self, owner: Owner, taken: &[i64], unrecorded: u32) {
        for &msg_id in taken {
            self.untake(owner, msg_id);
        }
        self.settle(unrecorded);
    }

    fn settle(&mut self, unrecorded: u32) {
        // Less after a restart, which forgot the claims under way.
        self.unrecorded = self.unrecorded.saturating_sub(unrecorded);
    }

    /// The release or finish of `msg_id`'s `attempt` committed.
    pub fn end(&mut self, msg_id: i64, attempt: i32) {
        if let Some(i) = self.find(msg_id).filter(|&i| self.slots[i].attempt == attempt) {
            self.remove_at(i);
        }
        self.log(Slot { msg_id, attempt, owner: 0, lease_end: 0 });
    }

    /// A renewal of `msg_id`'s `attempt` committed (or its session's exit ended its lease).
    pub fn renew(&mut self, msg_id: i64, attempt: i32, lease_end: i64) {
        if let Some(i) = self.find(msg_id).filter(|&i| self.slots[i].attempt == attempt) {
            self.slots[i].lease_end = lease_end;
        }
        // A rebuild may have read the lease before it (and adds the claim after).
        self.log(Slot { msg_id, attempt, owner: 1, lease_end });
    }

    /// Remembers an end or renewal for the rebuild under way; one it cannot keep spoils it.
    fn log(&mut self, event: Slot) {
        if !self.rebuilding {
            return;
        }
        if self.nends == self.ends.len() {
            self.spoiled = true;
        } else {
            self.ends[self.nends] = event;
            self.nends += 1;
        }
    }

    /// Committed claims whose lease ended before `now`: what the re-arm pass releases (all of
    /// them only while the set is exact; otherwise the pass asks the ledger too).
    pub fn expired(&self, now: i64) -> Vec<(i64, i32)> {
        let mut out: Vec<_> = self
            .slots
            .iter()
            .filter(|s| s.msg_id != 0 && s.owner == 0 && s.lease_end < now)
            .map(|s| (s.msg_id, s.attempt))
            .collect();
        out.sort_unstable();
        out
    }

    /// The tick starts reading the live claims from the ledger (in a snapshot taken after
    /// this call). Returns the epoch to finish with, or None when the set is exact already.
    pub fn begin_rebuild(&mut self) -> Option<u64> {
        if self.is_exact() {
            return None;
        }
        self.epoch += 1;
        self.rebuilding = true;
        self.spoiled = false;
        self.nends = 0;
        Some(self.epoch)
    }

    /// The rebuild `epoch` gave up before reading (it found a prepared transaction, which
    /// may hold claims no snapshot shows).
    pub fn abandon_rebuild(&mut self, epoch: u64) {
        if self.rebuilding && epoch == self.epoch {
            self.rebuilding = false;
            self.refused += 1;
        }
    }

    /// The tick read `live` (committed claims not ended, as its snapshot saw them): adds them
    /// but those ended since, with the leases renewed since, and makes the set exact, unless that cannot be known to be
    /// right; with too many to keep, the unknown range becomes the span of those it could not
    /// keep. Returns whether the set is exact.
    pub fn finish_rebuild(&mut self, epoch: u64, live: &[(i64, i32, i64)]) -> bool {
        if !self.rebuilding || epoch != self.epoch {
            return false;
        }
        self.rebuilding = false;
        if self.spoiled || self.unrecorded > 0 {
            self.refused += 1;
            return false;
        }
        // Every hold is now in the set or in `live` (nothing unrecorded is under way or
        // committed since the read): the holds missing are those left out here.
        let mut left_out = None;
        for &(msg_id, attempt, lease_end) in live {
            let logged = || self.ends[..self.nends].iter().filter(|e| (e.msg_id, e.attempt) == (msg_id, attempt));
            if logged().any(|e| e.owner == 0) || self.find(msg_id).is_some() {
                continue;
            }
            // The last renewal since the read, if any.
            let lease_end = logged().next_back().map_or(lease_end, |e| e.lease_end);
            if self.len == self.capacity() {
                left_out =
                    Some(left_out.map_or((msg_id, msg_id), |(lo, hi): (i64, i64)| (lo.min(msg_id), hi.max(msg_id))));
                continue;
            }
            self.insert(Slot { msg_id, attempt, owner: 0, lease_end });
        }
        self.unknown = left_out;
        if left_out.is_some() {
            self.refused += 1;
        }
        left_out.is_none()
    }

    fn home(&self, msg_id: i64) -> usize {
        // Fibonacci hashing: consecutive ids (the usual claim) spread over the table.
        (msg_id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as usize & self.mask()
    }

    fn find(&self, msg_id: i64) -> Option<usize> {
        let mut i = self.home(msg_id);
        for _ in 0..self.slots.len() {
            match self.slots[i].msg_id {
                0 => return None,
                id if id == msg_id => return Some(i),
                _ => i = (i + 1) & self.mask(),
            }
        }
        None
    }

    fn insert(&mut self, slot: Slot) {
        debug_assert!(self.len < self.slots.len());
        let mut i = self.home(slot.msg_id);
        while self.slots[i].msg_id != 0 {
            i = (i + 1) & self.mask();
        }
        self.slots[i] = slot;
        self.len += 1;
    }

    /// Linear probing's deletion without tombstones: later entries of the same run move back
    /// into the gap when their home allows it.
    fn remove_at(&mut self, mut gap: usize) {
        self.slots[gap] = Slot::default();
        self.len -= 1;
        let mask = self.mask();
        let mut i = (gap + 1) & mask;
        while self.slots[i].msg_id != 0 {
            let home = self.home(self.slots[i].msg_id);
            // Movable when its home is not in (gap, i], cyclically.
            let dist_home = i.wrapping_sub(home) & mask;
            let dist_gap = i.wrapping_sub(gap) & mask;
            if dist_home >= dist_gap {
                self.slots[gap] = self.slots[i];
                self.slots[i] = Slot::default();
                gap = i;
            }
            i = (i + 1) & mask;
        }
    }
}

#[cfg(test)]
mod tests;
