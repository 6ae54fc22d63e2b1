//! Where a queue's claims start, as pure logic: per priority the claim hint (no claimable
//! message of that priority lies below it), the epoch that keeps a lowering from being lost
//! to a claim under way, the in-order detection that lets most sends commit without lowering
//! anything, and the next due time of delayed messages. `queue_state.rs` keeps one `Dispatch`
//! per queue in shared memory and calls it under its lock, and signals the waiting claims
//! that `announce` tells to look again; the tests below check it against
//! a model of the transactions that drive it.
//!
//! The rule everything here keeps: once the transaction that made a message claimable has
//! applied its commit, and while no claim under way holds the message, usable hints are at
//! or below it. Hints may be too low (a claim walks a few more index entries), never too
//! high. Without usable hints (not yet checked against the table, more priorities than fit)
//! claims scan from the start.

use std::sync::atomic::AtomicI64;
use std::sync::atomic::Ordering::Relaxed;

/// Distinct priorities tracked per queue; a queue using more falls back to full scans.
pub const PRIORITIES: usize = 8;
/// `next_due` when nobody knows: claims promote until a promotion finds the next due time.
pub const DUE_UNKNOWN: i64 = i64::MIN;
/// `next_due` when the queue has no delayed message.
pub const DUE_NEVER: i64 = i64::MAX;

/// One queue's dispatch state. Plain data (it lives in shared memory); the caller holds the
/// table's lock: shared for `take`, which is an atomic max, exclusive for every `&mut self`.
#[repr(C)]
pub struct Dispatch {
    /// `prio`/`hint` were checked against the table at least once.
    known: bool,
    /// More priorities than `PRIORITIES`: claims on this queue scan from the start.
    overflow: bool,
    nprio: u8,
    /// Priorities with claimable messages, highest first, and for each a msg_id below which
    /// none of its messages is claimable.
    prio: [i16; PRIORITIES],
    hint: [AtomicI64; PRIORITIES],
    /// Bumped by every lowering of a hint: a claim raises a hint only if the epoch it started
    /// from is still current.
    epoch: u64,
    /// The same for the next due time, bumped by every commit of delayed messages: a promotion
    /// raises it only if no delayed message was committed since it started.
    due_epoch: u64,
    /// Commits that made messages ready, counted at pre-commit, and the highest msg_id they
    /// made ready (see `commit_ready`).
    ready_commits: u64,
    max_ready_id: i64,
    /// No delayed message falls due before this (microseconds since 2000, like TimestampTz).
    next_due: i64,
    /// Bumped whenever messages become claimable: a waiting claim goes back to claim when it
    /// changed since it last looked (never reset: a reset must wake them too).
    wake_seq: u64,
}

impl Default for Dispatch {
    fn default() -> Dispatch {
        let mut d = Dispatch {
            known: false,
            overflow: false,
            nprio: 0,
            prio: [0; PRIORITIES],
            hint: std::array::from_fn(|_| AtomicI64::new(i64::MAX)),
            epoch: 0,
            due_epoch: 0,
            ready_commits: 0,
            max_ready_id: 0,
            next_due: DUE_UNKNOWN,
            wake_seq: 0,
        };
        d.reset();
        d
    }
}

impl Dispatch {
    /// Back to "nothing known" (a new or dropped queue, or a validation that must start over).
    /// The epoch moves on: a claim that started before must not raise anything.
    pub fn reset(&mut self) {
        self.known = false;
        self.overflow = false;
        self.nprio = 0;
        self.prio = [0; PRIORITIES];
        self.hint.iter().for_each(|h| h.store(i64::MAX, Relaxed));
        self.ready_commits = 0;
        self.max_ready_id = 0;
        self.next_due = DUE_UNKNOWN;
        self.epoch += 1;
        self.due_epoch += 1;
    }

    /// Claims may use the hints: checked against the table, and no more priorities than fit.
    fn usable(&self) -> bool {
        self.known && !self.overflow
    }

    fn index(&self, priority: i16) -> Option<usize> {
        self.prio[..usize::from(self.nprio)].iter().position(|&p| p == priority)
    }

    /// (priorities, hints) when claims may use them; None: scan from the start.
    pub fn hints(&self) -> Option<(Vec<i16>, Vec<i64>)> {
        self.usable().then(|| self.listed())
    }

    /// Every tracked priority and its hint, known or not (for the tick's check).
    pub fn listed(&self) -> (Vec<i16>, Vec<i64>) {
        let n = usize::from(self.nprio);
        (self.prio[..n].to_vec(), self.hint[..n].iter().map(|h| h.load(Relaxed)).collect())
    }

    pub fn tracks(&self, priority: i16) -> bool {
        self.index(priority).is_some()
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn next_due(&self) -> i64 {
        self.next_due
    }

    pub fn due_epoch(&self) -> u64 {
        self.due_epoch
    }

    pub fn mark_known(&mut self) {
        self.known = true;
    }

    pub fn is_known(&self) -> bool {
        self.known
    }

    /// Lowers `priority`'s hint to `msg_id` (adding the priority if it is new). Returns
    /// whether the hint changed. The epoch is bumped either way: a claim under way may have
    /// started below `msg_id` and not seen it (made claimable after its snapshot), and must
    /// not raise the hint past it.
    pub fn lower(&mut self, priority: i16, msg_id: i64) -> bool {
        self.epoch += 1;
        let n = usize::from(self.nprio);
        match self.index(priority) {
            Some(i) if self.hint[i].load(Relaxed) > msg_id => {
                self.hint[i].store(msg_id, Relaxed);
                true
            }
            Some(_) => false,
            None if n < PRIORITIES => {
                let at = self.prio[..n].iter().position(|&p| p < priority).unwrap_or(n);
                for i in (at..n).rev() {
                    self.prio[i + 1] = self.prio[i];
                    self.hint[i + 1].store(self.hint[i].load(Relaxed), Relaxed);
                }
                self.prio[at] = priority;
                self.hint[at].store(msg_id, Relaxed);
                self.nprio += 1;
                true
            }
            None => {
                self.overflow = true;
                true
            }
        }
    }

    /// Whether `msg_id` lies below `priority`'s hint (or the priority is not tracked).
    pub fn is_below(&self, priority: i16, msg_id: i64) -> bool {
        self.index(priority).is_none_or(|i| self.hint[i].load(Relaxed) > msg_id)
    }

    /// A claim that started from the hints at `epoch` (None: it raises nothing) asks for
    /// `msg_id` of `priority`: None if the hint has passed it (taken by another claim);
    /// otherwise whether this claim raised the hint past it. Needs only the shared lock: the
    /// epoch moves under the exclusive one, and of claims asking for the same row at once
    /// the atomic max lets one through.
    pub fn take(&self, priority: i16, epoch: Option<u64>, msg_id: i64) -> Option<bool> {
        let Some(i) = self.index(priority).filter(|_| self.usable()) else { return Some(false) };
        if self.hint[i].load(Relaxed) > msg_id {
            return None;
        }
        if epoch != Some(self.epoch) {
            return Some(false);
        }
        (self.hint[i].fetch_max(msg_id.saturating_add(1), Relaxed) <= msg_id).then_some(true)
    }

    /// Raises `priority`'s hint to `msg_id` if no lowering happened since `epoch`; whether
    /// it did.
    pub fn raise(&mut self, priority: i16, epoch: u64, msg_id: i64) -> bool {
        if self.epoch != epoch || !self.known {
            return false;
        }
        match self.index(priority) {
            Some(i) if self.hint[i].load(Relaxed) < msg_id => {
                self.hint[i].store(msg_id, Relaxed);
                true
            }
            _ => false,
        }
    }

    /// Counts, at pre-commit (before anyone can see it), a commit that makes messages up to
    /// `high` ready; returns what `commit_ready` needs of a send: its sequence number among
    /// such commits and the highest id made ready before it.
    pub fn precommit_ready(&mut self, high: i64) -> (u64, i64) {
        let before = self.max_ready_id;
        self.ready_commits += 1;
        self.max_ready_id = self.max_ready_id.max(high);
        (self.ready_commits, before)
    }

    /// A commit made messages of `priority` from `low` on ready. Ids are taken in order but
    /// transactions commit in any order: a claim that saw a later id committed may have
    /// raised the hint past `low`. A send (`sent`: what `precommit_ready` returned) is in
    /// order when no other ready-making commit pre-committed after it and none before it
    /// made a higher id ready: nobody can have claimed past it, and it commits without
    /// lowering (which would stop every claim under way from raising). Anything else lowers.
    pub fn commit_ready(&mut self, priority: i16, low: i64, sent: Option<(u64, i64)>) {
        let in_order = sent.is_some_and(|(sequence, before)| self.ready_commits == sequence && before < low);
        if !in_order || !self.tracks(priority) {
            self.lower(priority, low);
        }
    }

    /// Delayed messages were committed, the earliest due at `due` (or the tick found one). The
    /// due epoch moves on either way, as `lower` moves the epoch: a promotion under way may
    /// have taken its snapshot before them, and must not raise the due time past them, even
    /// from unknown (which nothing lowers).
    pub fn lower_due(&mut self, due: i64) {
        self.due_epoch += 1;
        if due < self.next_due {
            self.next_due = due;
        }
    }

    /// The next due time found by a promotion that started at `due_epoch`.
    pub fn raise_due(&mut self, due_epoch: u64, due: i64) -> bool {
        if self.due_epoch != due_epoch || due <= self.next_due {
            return false;
        }
        self.next_due = due;
        true
    }

    pub fn forget_due(&mut self) {
        self.next_due = DUE_UNKNOWN;
    }

    pub fn wake_seq(&self) -> u64 {
        self.wake_seq
    }

    /// Messages may have become claimable: waiting claims look again.
    pub fn announce(&mut self) {
        self.wake_seq += 1;
    }
}

/// How many sleeping claims a commit that makes `n` messages claimable signals: enough for
/// the claims' sizes on average (the `waiters` asked for `asked` messages in all), at least
/// one. Signalling one per message woke every sleeper for a batch, and all but the first
/// few found nothing: a woken claim that gets all it asked for signals the next sleeper
/// itself (`chains`), so fewer signals never leave a message unclaimed.
pub fn signals(n: i64, waiters: u32, asked: u64) -> i64 {
    if n <= 0 || waiters == 0 {
        return 0;
    }
    let asked = i128::from(asked.max(u64::from(waiters)));
    let wanted = (i128::from(n) * i128::from(waiters) + asked - 1) / asked;
    wanted.clamp(1, i128::from(waiters)) as i64
}

/// Whether a claim that was woken by a signal and got `claimed` of the `qty` it asked for
/// must signal the next sleeper: more may be claimable than its signal covered.
pub fn chains(woken: bool, claimed: usize, qty: usize) -> bool {
    woken && claimed >= qty
}

#[cfg(test)]
mod tests;
