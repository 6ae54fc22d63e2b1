//! `Dispatch` against a model of the transactions around it: sends committing in any order,
//! claims walking from the hints while others commit and roll back, nacks and re-arms making
//! claimed messages ready again, delayed sends and promotions, the tick's check, and restarts
//! (shared memory lost), and claims that wait. Each step is one of the atomic steps the server
//! takes under the table's lock or in a snapshot; after every step the model checks the rule
//! the claims rely on. When everything has finished, no waiting claim may sleep while a
//! message is claimable (no wake-up lost), and a claim run alone must get exactly the
//! messages a full scan would.

use super::*;
use proptest::prelude::*;
use std::collections::BTreeSet;

#[derive(Clone, Copy, PartialEq, Debug)]
enum St {
    /// Inserted by a transaction that has not committed.
    Invisible,
    Ready,
    Delayed(i64),
    Claimed,
    /// Rolled back.
    Gone,
}

#[derive(Clone, Debug)]
struct Row {
    prio: i16,
    st: St,
    /// The commit that made it what it is (ready, delayed), and whether that commit has been
    /// applied to the dispatch state (or the state was lost since: then the tick's check is
    /// what knows of it).
    made_by: Option<usize>,
    applied: bool,
    /// The transaction holding its row lock.
    holder: Option<usize>,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Phase {
    Open,
    PreCommitted,
    /// Committed: others see it; its callback has not run yet.
    Visible,
}

#[derive(Clone, Debug)]
enum Kind {
    /// A send (`due`: delayed until then).
    Send {
        due: Option<i64>,
    },
    /// A nack or re-arm of claimed messages: ready again at commit.
    Release,
    /// Moves due messages to ready; started at `epoch`, found nothing due before `next`.
    Promote {
        epoch: u64,
        raised: bool,
    },
    Claim(Claim),
    /// The tick's check: what its snapshot found, per priority, and the earliest due time;
    /// of those, the busy ones below their hints (held by a claim under way), and which of
    /// those it leaves for the next check (reconcile.rs).
    Check {
        lowest: Vec<(i16, i64)>,
        due: Option<i64>,
        busy_below: Vec<(i16, i64)>,
        deferred: Vec<(i16, i64)>,
    },
}

#[derive(Clone, Debug)]
struct Claim {
    /// The hints and epoch it started from; None: a scan from the start.
    start: Option<(Vec<(i16, i64)>, u64)>,
    qty: usize,
    /// Which of `start`'s priorities it walks, and what that walk's snapshot showed.
    at: usize,
    candidates: Option<Vec<i64>>,
    locked: Vec<i64>,
    /// Rows noted for the rollback: lowered to if it rolls back.
    noted: Vec<(i16, i64)>,
    done: bool,
    /// A waiting claim: the wake-up count it read with the hints, and whether it sleeps
    /// (and was signalled since).
    wait: bool,
    seen: u64,
    asleep: bool,
    signalled: bool,
    /// Its latest walk followed a wake-up: if it fills its qty, it signals the next sleeper.
    woken: bool,
}

#[derive(Clone, Debug)]
struct Tx {
    kind: Kind,
    rows: Vec<i64>,
    phase: Phase,
    sent: Option<(u64, i64)>,
}

struct World {
    d: Dispatch,
    rows: Vec<Row>,
    txs: Vec<Option<Tx>>,
    now: i64,
    /// Sleeping claims not signalled yet, in the order they went to sleep (a condition
    /// variable signals the longest sleeper).
    sleepers: Vec<usize>,
    /// What the last check found busy below its hint: lowered to if the next finds it again.
    busy_below: Vec<(i16, i64)>,
}

#[derive(Clone, Debug)]
enum Op {
    Send {
        n: usize,
        prio: i16,
        delay: Option<i64>,
    },
    Release {
        pick: usize,
    },
    Claim {
        qty: usize,
        wait: bool,
    },
    /// A sleeping claim's deadline: one last try.
    Timeout {
        pick: usize,
    },
    Promote,
    Check,
    Advance {
        pick: usize,
    },
    Abort {
        pick: usize,
    },
    Tick,
    Restart,
    Solo {
        qty: usize,
    },
}

fn op(prios: i16) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1..4usize, 0..prios, prop::option::weighted(0.2, 1..4i64))
            .prop_map(|(n, prio, delay)| Op::Send { n, prio, delay }),
        1 => any::<usize>().prop_map(|pick| Op::Release { pick }),
        3 => (1..4usize, any::<bool>()).prop_map(|(qty, wait)| Op::Claim { qty, wait }),
        1 => any::<usize>().prop_map(|pick| Op::Timeout { pick }),
        1 => Just(Op::Promote),
        1 => Just(Op::Check),
        12 => any::<usize>().prop_map(|pick| Op::Advance { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Abort { pick }),
        1 => Just(Op::Tick),
        1 => Just(Op::Restart),
        1 => (1..6usize).prop_map(|qty| Op::Solo { qty }),
    ]
}

impl World {
    fn new() -> World {
        World { d: Dispatch::default(), rows: vec![], txs: vec![], now: 0, sleepers: vec![], busy_below: vec![] }
    }

    fn open(&mut self, kind: Kind, rows: Vec<i64>) -> usize {
        self.txs.push(Some(Tx { kind, rows, phase: Phase::Open, sent: None }));
        self.txs.len() - 1
    }

    fn open_txs(&self) -> Vec<usize> {
        (0..self.txs.len()).filter(|&t| self.txs[t].is_some()).collect()
    }

    fn row(&mut self, id: i64) -> &mut Row {
        &mut self.rows[id as usize]
    }

    /// What a snapshot taken now shows as ready, best first (held rows included: a lock
    /// does not hide a row).
    fn ready(&self, prio: Option<i16>, from: i64) -> Vec<i64> {
        let mut ids: Vec<i64> = (0..self.rows.len() as i64)
            .filter(|&id| {
                let r = &self.rows[id as usize];
                r.st == St::Ready && prio.is_none_or(|p| p == r.prio) && id >= from
            })
            .collect();
        ids.sort_by_key(|&id| (std::cmp::Reverse(self.rows[id as usize].prio), id));
        ids
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Send { n, prio, delay } => {
                let first = self.rows.len() as i64;
                for _ in 0..n {
                    self.rows.push(Row { prio, st: St::Invisible, made_by: None, applied: false, holder: None });
                }
                let due = delay.map(|d| self.now + d);
                self.open(Kind::Send { due }, (first..first + n as i64).collect());
            }
            Op::Release { pick } => {
                let claimed: Vec<i64> = (0..self.rows.len() as i64)
                    .filter(|&id| self.rows[id as usize].st == St::Claimed && self.rows[id as usize].holder.is_none())
                    .collect();
                if claimed.is_empty() {
                    return;
                }
                let id = claimed[pick % claimed.len()];
                let t = self.open(Kind::Release, vec![id]);
                self.row(id).holder = Some(t);
            }
            Op::Claim { qty, wait } => {
                let mut claim = Claim {
                    start: None,
                    qty,
                    at: 0,
                    candidates: None,
                    locked: vec![],
                    noted: vec![],
                    done: false,
                    wait,
                    seen: 0,
                    asleep: false,
                    signalled: false,
                    woken: false,
                };
                self.begin(&mut claim);
                self.open(Kind::Claim(claim), vec![]);
            }
            Op::Timeout { pick } => {
                let asleep: Vec<usize> = self.open_txs().into_iter().filter(|&t| self.is_asleep(t)).collect();
                if let Some(&t) = asleep.get(pick % asleep.len().max(1)) {
                    self.sleepers.retain(|&s| s != t);
                    if let Some(Tx { kind: Kind::Claim(c), .. }) = self.txs[t].as_mut() {
                        c.wait = false;
                        c.signalled = true;
                    }
                    self.advance(t);
                }
            }
            Op::Promote => {
                let epoch = self.d.due_epoch();
                self.open(Kind::Promote { epoch, raised: false }, vec![]);
            }
            Op::Check => {
                let mut lowest: Vec<(i16, i64)> = vec![];
                for id in self.ready(None, 0) {
                    let p = self.rows[id as usize].prio;
                    if !lowest.iter().any(|&(q, _)| q == p) {
                        lowest.push((p, id));
                    }
                }
                let (prios, hints) = self.d.listed();
                let (mut busy_below, mut deferred) = (vec![], vec![]);
                for (p, id) in lowest.clone() {
                    let Some(hint) = prios.iter().position(|&q| q == p).map(|i| hints[i]) else { continue };
                    if self.rows[id as usize].holder.is_none() || hint <= id {
                        continue;
                    }
                    busy_below.push((p, id));
                    if !self.busy_below.contains(&(p, id)) {
                        deferred.push((p, id));
                        // Instead, the first free one after it, below the hint.
                        let free = self
                            .ready(Some(p), id + 1)
                            .into_iter()
                            .find(|&f| f < hint && self.rows[f as usize].holder.is_none());
                        lowest.extend(free.map(|f| (p, f)));
                    }
                }
                let due = self.rows.iter().filter_map(|r| if let St::Delayed(d) = r.st { Some(d) } else { None }).min();
                self.open(Kind::Check { lowest, due, busy_below, deferred }, vec![]);
            }
            Op::Advance { pick } => {
                let open = self.open_txs();
                if !open.is_empty() {
                    self.advance(open[pick % open.len()]);
                }
            }
            Op::Abort { pick } => {
                let open: Vec<usize> = self
                    .open_txs()
                    .into_iter()
                    .filter(|&t| self.txs[t].as_ref().is_some_and(|tx| tx.phase != Phase::Visible))
                    .collect();
                if !open.is_empty() {
                    self.abort(open[pick % open.len()], true);
                }
            }
            Op::Tick => self.now += 1,
            Op::Restart => {
                // Every transaction not committed rolls back without its callbacks; those
                // committed keep their rows; shared memory starts empty.
                for t in self.open_txs() {
                    if self.txs[t].as_ref().is_some_and(|tx| tx.phase == Phase::Visible) {
                        self.txs[t] = None;
                    } else {
                        self.abort(t, false);
                    }
                }
                self.rows.iter_mut().for_each(|r| r.applied = true);
                self.d = Dispatch::default();
                self.sleepers.clear();
                // The worker restarts with the server: what its last check deferred is gone.
                self.busy_below.clear();
            }
            Op::Solo { qty } => self.solo(qty),
        }
    }

    fn advance(&mut self, t: usize) {
        let mut tx = self.txs[t].take().expect("open");
        match (&mut tx.kind, tx.phase) {
            (Kind::Claim(c), _) if c.asleep => {
                // Sleeps until signalled; then claims again if something was announced since
                // it looked (or at its deadline), else sleeps on.
                if c.signalled {
                    c.signalled = false;
                    if c.wait && self.d.wake_seq() == c.seen {
                        self.sleepers.push(t);
                    } else {
                        c.woken = self.d.wake_seq() != c.seen;
                        self.begin(c);
                    }
                }
                self.txs[t] = Some(tx);
                return;
            }
            (Kind::Claim(c), _) if !c.done => {
                self.walk(t, c);
                if c.done && chains(c.woken, c.locked.len(), c.qty) && !self.sleepers.is_empty() {
                    self.signal_first();
                }
                self.txs[t] = Some(tx);
                return;
            }
            (Kind::Claim(c), _) if c.locked.is_empty() && c.wait => {
                // Nothing claimed: it sleeps, unless something was announced since it read
                // the hints.
                if self.d.wake_seq() == c.seen {
                    c.asleep = true;
                    self.sleepers.push(t);
                } else {
                    // (The sleep returns at once, as woken.)
                    c.woken = true;
                    self.begin(c);
                }
                self.txs[t] = Some(tx);
                return;
            }
            (Kind::Claim(c), _) => {
                for &id in &c.locked {
                    let r = self.row(id);
                    (r.st, r.holder) = (St::Claimed, None);
                }
                return;
            }
            (Kind::Check { lowest, due, busy_below, deferred }, _) => {
                let mut lowered = false;
                self.busy_below = busy_below.clone();
                for &(p, id) in lowest.iter() {
                    let later = deferred.contains(&(p, id)) && self.d.tracks(p);
                    if self.d.is_below(p, id) && !later {
                        self.d.lower(p, id);
                        lowered = true;
                    }
                }
                if let Some(due) = *due {
                    self.d.lower_due(due);
                }
                self.d.mark_known();
                let waiters = self.open_txs().into_iter().filter(|&s| self.is_asleep(s)).count();
                if lowered || (!lowest.is_empty() && waiters > 0) {
                    self.wake(1);
                }
                return;
            }
            (Kind::Promote { epoch, raised }, Phase::Open) if tx.rows.is_empty() && !*raised => {
                // Its snapshot: takes what is due (as a claim would, rows locked), and raises
                // the next due time to the earliest of the rest.
                let now = self.now;
                let due: Vec<i64> = (0..self.rows.len() as i64)
                    .filter(|&id| {
                        let r = &self.rows[id as usize];
                        matches!(r.st, St::Delayed(d) if d <= now) && r.holder.is_none()
                    })
                    .collect();
                let next = self
                    .rows
                    .iter()
                    .filter_map(|r| if let St::Delayed(d) = r.st { (d > now).then_some(d) } else { None })
                    .min()
                    .unwrap_or(DUE_NEVER);
                for &id in &due {
                    self.row(id).holder = Some(t);
                }
                *raised = self.d.raise_due(*epoch, next);
                tx.rows = due;
                if tx.rows.is_empty() {
                    // Nothing moved: commits at once.
                    return;
                }
            }
            (_, Phase::Open) => {
                tx.phase = Phase::PreCommitted;
                if self.makes_ready(&tx) {
                    let high = *tx.rows.iter().max().expect("rows");
                    let (sequence, before) = self.d.precommit_ready(high);
                    if matches!(tx.kind, Kind::Send { .. }) {
                        tx.sent = Some((sequence, before));
                    }
                }
            }
            (_, Phase::PreCommitted) => {
                tx.phase = Phase::Visible;
                let st = match tx.kind {
                    Kind::Send { due: Some(d) } => St::Delayed(d),
                    _ => St::Ready,
                };
                for &id in &tx.rows {
                    let r = self.row(id);
                    (r.st, r.made_by, r.applied, r.holder) = (st, Some(t), false, None);
                }
            }
            (_, Phase::Visible) => {
                // The commit's callback: lowers per priority to its lowest id.
                if let Kind::Send { due: Some(d) } = tx.kind {
                    self.d.lower_due(d);
                } else {
                    let mut lows: Vec<(i16, i64)> = vec![];
                    for &id in &tx.rows {
                        let p = self.rows[id as usize].prio;
                        match lows.iter_mut().find(|(q, _)| *q == p) {
                            Some((_, low)) => *low = (*low).min(id),
                            None => lows.push((p, id)),
                        }
                    }
                    for (p, low) in lows {
                        self.d.commit_ready(p, low, tx.sent);
                        let n = tx.rows.iter().filter(|&&id| self.rows[id as usize].prio == p).count();
                        self.wake(n);
                    }
                }
                for &id in &tx.rows {
                    let r = self.row(id);
                    r.applied |= r.made_by == Some(t);
                }
                return;
            }
        }
        self.txs[t] = Some(tx);
    }

    /// Where a claim starts (again): the hints, the epoch and the wake-up count, read
    /// together under the lock.
    fn begin(&self, c: &mut Claim) {
        c.start = self.d.hints().map(|(p, h)| (p.into_iter().zip(h).collect(), self.d.epoch()));
        c.seen = self.d.wake_seq();
        (c.at, c.candidates, c.done, c.asleep) = (0, None, false, false);
    }

    fn is_asleep(&self, t: usize) -> bool {
        matches!(&self.txs[t], Some(Tx { kind: Kind::Claim(c), .. }) if c.asleep)
    }

    /// Announces `n` new claimable messages and signals as many sleepers as `signals` says.
    fn wake(&mut self, n: usize) {
        self.d.announce();
        let asked: u64 = self.sleepers.iter().map(|&t| self.qty(t) as u64).sum();
        for _ in 0..signals(n as i64, self.sleepers.len() as u32, asked) {
            self.signal_first();
        }
    }

    /// The condition variable's signal: the longest sleeper wakes.
    fn signal_first(&mut self) {
        let t = self.sleepers.remove(0);
        if let Some(Tx { kind: Kind::Claim(c), .. }) = self.txs[t].as_mut() {
            c.signalled = true;
        }
    }

    fn qty(&self, t: usize) -> usize {
        match &self.txs[t] {
            Some(Tx { kind: Kind::Claim(c), .. }) => c.qty,
            _ => 1,
        }
    }

    fn makes_ready(&self, tx: &Tx) -> bool {
        !tx.rows.is_empty() && matches!(tx.kind, Kind::Send { due: None } | Kind::Release | Kind::Promote { .. })
    }

    /// One step of a claim's pick: a scan from the start (all at once), or one row of the
    /// walk from a priority's hint (a new snapshot per priority, as each statement of a
    /// claim in READ COMMITTED takes one).
    fn walk(&mut self, t: usize, c: &mut Claim) {
        let Some((hints, epoch)) = &c.start else {
            for id in self.ready(None, 0) {
                if c.locked.len() == c.qty {
                    break;
                }
                if self.rows[id as usize].holder.is_none() {
                    self.row(id).holder = Some(t);
                    c.locked.push(id);
                    c.noted.push((self.rows[id as usize].prio, id));
                }
            }
            c.done = true;
            return;
        };
        let Some(&(prio, from)) = hints.get(c.at) else {
            c.done = true;
            return;
        };
        let candidates = c.candidates.get_or_insert_with(|| self.ready(Some(prio), from));
        if let Some(id) = (!candidates.is_empty()).then(|| candidates.remove(0))
            && self.d.take(prio, Some(*epoch), id).is_some()
        {
            // Handed to this claim: noted for a rollback, whether it raised the hint or not
            // (as `_take` does). Locked unless another holds it; checked again once locked
            // (a claim that committed since the snapshot changed it).
            c.noted.push((prio, id));
            let r = &self.rows[id as usize];
            if r.holder.is_none() && r.st == St::Ready {
                self.row(id).holder = Some(t);
                c.locked.push(id);
            }
        }
        if c.candidates.as_ref().is_some_and(Vec::is_empty) {
            c.candidates = None;
            c.at += 1;
        }
        c.done |= c.locked.len() == c.qty;
    }

    /// A rollback: rows it inserted are gone, rows it held are released; with `callbacks`
    /// (not a crash), what it noted is applied.
    fn abort(&mut self, t: usize, callbacks: bool) {
        let tx = self.txs[t].take().expect("open");
        if let Kind::Claim(c) = &tx.kind
            && c.asleep
        {
            // Interrupted in its sleep: hands on a signal it may have had.
            self.sleepers.retain(|&s| s != t);
            if callbacks && !self.sleepers.is_empty() {
                self.signal_first();
            }
        }
        for id in 0..self.rows.len() as i64 {
            if self.rows[id as usize].holder == Some(t) {
                self.row(id).holder = None;
            }
        }
        if let Kind::Send { .. } = tx.kind {
            for &id in &tx.rows {
                self.row(id).st = St::Gone;
            }
        }
        if !callbacks {
            return;
        }
        match tx.kind {
            Kind::Claim(c) => {
                for (p, id) in c.noted {
                    self.d.lower(p, id);
                    self.wake(1);
                }
            }
            // It raised the next due time, or its messages are delayed and due again.
            Kind::Promote { raised, .. } if raised || !tx.rows.is_empty() => self.d.forget_due(),
            _ => {}
        }
    }

    /// Runs every transaction to its end, but for the claims sleeping unsignalled.
    fn settle(&mut self) {
        while let Some(t) = self.open_txs().into_iter().find(|t| !self.sleepers.contains(t)) {
            self.advance(t);
            self.check();
        }
    }

    /// A claim while nothing else is under way: it must get the best `qty` ready messages.
    fn solo(&mut self, qty: usize) {
        if !self.open_txs().is_empty() {
            return;
        }
        let want: Vec<i64> = self.ready(None, 0).into_iter().take(qty).collect();
        self.step(&Op::Claim { qty, wait: false });
        let t = self.txs.len() - 1;
        while self.txs[t].as_ref().is_some_and(|tx| matches!(&tx.kind, Kind::Claim(c) if !c.done)) {
            self.advance(t);
        }
        let Some(Tx { kind: Kind::Claim(c), .. }) = &self.txs[t] else { unreachable!() };
        let got: BTreeSet<i64> = c.locked.iter().copied().collect();
        assert_eq!(got, want.iter().copied().collect(), "a claim alone gets the best messages; {:?}", self.d.listed());
        self.advance(t);
    }

    /// The rule: usable hints are at or below every message made ready by a commit that has
    /// been applied, unless a claim under way holds it; the next due time is at or below
    /// every delayed message's whose send has been applied.
    fn check(&self) {
        let hints = self.d.hints();
        for (id, r) in self.rows.iter().enumerate() {
            let id = id as i64;
            if !r.applied || r.holder.is_some() {
                continue;
            }
            match r.st {
                St::Ready => {
                    if let Some((prios, starts)) = &hints {
                        let at = prios.iter().position(|&p| p == r.prio);
                        assert!(at.is_some(), "message {id}'s priority {} is not tracked: {prios:?}", r.prio);
                        let hint = starts[at.unwrap()];
                        assert!(hint <= id, "priority {}'s hint {hint} is above message {id}", r.prio);
                    }
                }
                St::Delayed(due) => {
                    let next = self.d.next_due();
                    assert!(next == DUE_UNKNOWN || next <= due, "next due {next} is after message {id}'s {due}");
                }
                _ => {}
            }
        }
    }
}

fn run(ops: &[Op]) {
    let mut w = World::new();
    for op in ops {
        w.step(op);
        w.check();
    }
    // Everything finishes but the claims sleeping unsignalled: none may sleep while a message
    // is claimable (the tick's check is not needed for that).
    w.settle();
    let claimable = w.ready(None, 0);
    assert!(w.sleepers.is_empty() || claimable.is_empty(), "claims sleep while {claimable:?} are claimable");
    // After their deadlines and the tick's check, a claim alone gets what a scan would.
    while !w.sleepers.is_empty() {
        w.step(&Op::Timeout { pick: 0 });
        w.settle();
    }
    w.step(&Op::Check);
    let t = w.txs.len() - 1;
    w.advance(t);
    w.check();
    w.solo(usize::MAX);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Three priorities: the hints stay usable.
    #[test]
    fn hints_are_never_above_a_claimable_message(ops in prop::collection::vec(op(3), 1..120)) {
        run(&ops);
    }

    /// More priorities than fit: claims fall back to scans, never miss a message.
    #[test]
    fn past_the_tracked_priorities_claims_scan(ops in prop::collection::vec(op(PRIORITIES as i16 + 2), 1..120)) {
        run(&ops);
    }
}

#[test]
fn a_send_in_order_commits_without_lowering() {
    let mut d = Dispatch::default();
    d.lower(0, 1);
    d.mark_known();
    let epoch = d.epoch();
    let sent = d.precommit_ready(5);
    d.commit_ready(0, 5, Some(sent));
    assert_eq!(d.epoch(), epoch, "claims under way may still raise");
    // Two sends whose pre-commits overlap: the one that finishes last lowers.
    let (a, b) = (d.precommit_ready(7), d.precommit_ready(6));
    d.commit_ready(0, 7, Some(a));
    assert_ne!(d.epoch(), epoch);
    let epoch = d.epoch();
    d.commit_ready(0, 6, Some(b));
    assert_ne!(d.epoch(), epoch, "an earlier pre-commit had a higher id");
}

/// A promotion that rolls back puts its messages back as delayed and due: the next due time
/// another promotion raised meanwhile (it skipped them, locked) must not stand above them.
#[test]
fn a_promotion_rolled_back_leaves_the_next_due_time_unknown() {
    let mut w = World::new();
    let steps = [
        Op::Send { n: 1, prio: 0, delay: Some(1) },
        Op::Advance { pick: 0 },
        Op::Advance { pick: 0 },
        Op::Advance { pick: 0 },
        Op::Tick,
        // The first promotion starts, then a commit lowers (its epoch goes stale) ...
        Op::Promote,
        Op::Send { n: 1, prio: 0, delay: None },
        Op::Advance { pick: 1 },
        Op::Advance { pick: 1 },
        Op::Advance { pick: 1 },
        // ... it takes the due message, but cannot raise the due time ...
        Op::Advance { pick: 0 },
        // ... a second one skips the locked message and raises it ...
        Op::Promote,
        Op::Advance { pick: 1 },
        // ... and the first rolls back.
        Op::Abort { pick: 0 },
    ];
    for op in &steps {
        w.step(op);
        w.check();
    }
}

/// A claim whose epoch went stale takes a row without raising the hint; a later claim raises
/// the hint past it and skips it, locked. When the first rolls back, the hint must come back
/// down to that row: every row handed to a claim is noted for its rollback, raised or not.
#[test]
fn a_claim_rolled_back_lowers_to_every_row_it_was_handed() {
    let mut w = World::new();
    let steps = [
        Op::Send { n: 1, prio: 0, delay: None },
        Op::Advance { pick: 0 },
        Op::Advance { pick: 0 },
        Op::Advance { pick: 0 },
        Op::Check,
        Op::Advance { pick: 0 },
        // The claim starts from the hints ...
        Op::Claim { qty: 1, wait: false },
        // ... two sends overlap, and the first to finish lowers: its epoch is stale.
        Op::Send { n: 1, prio: 0, delay: None },
        Op::Send { n: 1, prio: 0, delay: None },
        Op::Advance { pick: 1 },
        Op::Advance { pick: 2 },
        Op::Advance { pick: 1 },
        Op::Advance { pick: 1 },
        // A second claim starts; the first takes message 0 without raising ...
        Op::Claim { qty: 1, wait: false },
        Op::Advance { pick: 0 },
        // ... the second raises past it (locked) and takes message 1, and commits ...
        Op::Advance { pick: 2 },
        Op::Advance { pick: 2 },
        Op::Advance { pick: 2 },
        // ... and the first rolls back.
        Op::Abort { pick: 0 },
    ];
    for op in &steps {
        w.step(op);
        w.check();
    }
    assert_eq!(w.rows[0].st, St::Ready);
    assert_eq!(w.rows[1].st, St::Claimed);
}

/// A promotion must not add a priority to the hints before it commits: a send of that
/// priority committing in order meanwhile would find it tracked, lower nothing, and sit
/// below the promoted message's id.
#[test]
fn a_promotion_under_way_leaves_the_hints_alone() {
    let mut w = World::new();
    let steps = [
        Op::Send { n: 1, prio: 0, delay: None },
        Op::Advance { pick: 0 },
        Op::Advance { pick: 0 },
        Op::Advance { pick: 0 },
        Op::Check,
        Op::Advance { pick: 0 },
        // Message 1 (priority 1) is being sent; message 2 (priority 1) is sent delayed ...
        Op::Send { n: 1, prio: 1, delay: None },
        Op::Send { n: 1, prio: 1, delay: Some(1) },
        Op::Advance { pick: 1 },
        Op::Advance { pick: 1 },
        Op::Advance { pick: 1 },
        Op::Tick,
        // ... a promotion takes message 2 ...
        Op::Promote,
        Op::Advance { pick: 1 },
        // ... and message 1's send commits, in order.
        Op::Advance { pick: 0 },
        Op::Advance { pick: 0 },
        Op::Advance { pick: 0 },
    ];
    for op in &steps {
        w.step(op);
        w.check();
    }
}

/// A batch of 128 to 64 sleeping claims of 62 signals three of them (0.14.0: all 64); sleepers
/// of 1 get one signal a message; never more than sleep, never one for nothing.
#[test]
fn signals_cover_the_messages_by_qty() {
    assert_eq!(signals(128, 64, 64 * 62), 3);
    assert_eq!(signals(1, 64, 64), 1);
    assert_eq!(signals(63, 63, 63), 63);
    assert_eq!(signals(40, 8, 80), 4);
    assert_eq!(signals(4, 4, 12), 2);
    assert_eq!(signals(1000, 4, 8), 4);
    assert_eq!(signals(0, 5, 5), 0);
    assert_eq!(signals(5, 0, 0), 0);
    // A count the sleepers' sum cannot reach (a qty lost to a crash) still signals.
    assert_eq!(signals(3, 2, 0), 2);
}

/// A delayed message committed after a promotion's snapshot keeps that promotion from raising
/// the due time past it: while the due time is unknown (nothing lowers it then), and while it
/// is known and earlier than the message (the commit does not lower it either). Before
/// 0.24.0 only a lowering moved the epoch, and a claim then promoted nothing until the tick.
#[test]
fn a_delayed_message_committed_during_a_promotion_keeps_it_from_raising_past_it() {
    let mut d = Dispatch::default();
    let started = d.due_epoch();
    d.lower_due(100);
    assert!(!d.raise_due(started, 1_000), "from unknown, past a message it did not see");
    assert_eq!(d.next_due(), DUE_UNKNOWN);
    assert!(d.raise_due(d.due_epoch(), 50));
    let started = d.due_epoch();
    d.lower_due(200);
    assert_eq!(d.next_due(), 50);
    assert!(!d.raise_due(started, 1_000), "from 50, past the message due at 200");
    assert!(d.raise_due(d.due_epoch(), 200), "a promotion that saw it");
}
