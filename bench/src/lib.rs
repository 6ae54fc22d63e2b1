//! pgqueue's benchmarks: every scenario runs pgqueue and a baseline side by side on the same
//! server, in the same run, so the ratios mean something on a shared, noisy machine.
//!
//! The baseline is the design most PostgreSQL queues use: one table, a visibility time `vt`
//! filtered per row (`vt <= now()`), `FOR UPDATE SKIP LOCKED` in id order, the visibility time
//! pushed forward on read, and delete on ack.

use hdrhistogram::Histogram;
use postgres::{Client, NoTls};
use serde::Serialize;
use serde_json::Value;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use uuid::Uuid;

pub mod chart;
pub mod console_size;
pub mod cron_cost;

/// How big each scenario is.
#[derive(Clone, Debug)]
pub struct Sizes {
    pub depths: Vec<i64>,
    pub delayed: i64,
    pub claims_per_point: usize,
    pub consumers: Vec<usize>,
    pub in_flight: i64,
    pub run_for: Duration,
    /// Throughput: how long each point's consumers (and pgbench) run before the measured
    /// `run_for`, so that it sees a fleet past its connections' first touches of the shared
    /// buffers; and how many times the whole sweep runs (each point reports the median).
    pub warm_for: Duration,
    pub repeat: usize,
    pub rescue_claims: i64,
    pub prune_rows: i64,
    pub renewals: i64,
    pub enqueue_messages: i64,
    /// Messages queued per second of a throughput run (more than any consumer set drains).
    pub work_per_second: f64,
    pub pgbench_scale: u32,
    /// Pinned horizon: consumers claiming and acking one job at a time, with about
    /// `pin_waiting` messages kept waiting, and REPEATABLE READ readers in the second run.
    pub pin_consumers: usize,
    pub pin_waiting: i64,
    pub pin_readers: usize,
    /// How long the horizon is free, then held, then free again.
    pub pin_phases: [Duration; 3],
    /// Figures are kept per bucket; the pinned phase is reported per window.
    pub pin_bucket: Duration,
    pub pin_window: Duration,
    /// Pickup: consumers waiting in pgq_claim (or polling), the producer's steady rate, and
    /// how long the latency, idle and send phases run.
    pub pickup_consumers: usize,
    pub pickup_wait: Duration,
    pub poll_sleep: Duration,
    pub pickup_rate: f64,
    pub pickup_for: Duration,
    pub idle_for: Duration,
    pub send_for: Duration,
    /// Schedules: how many exist, how many of them come due together, how long the live
    /// run lasts (every 5 s the due ones fire).
    pub schedules: i64,
    pub schedules_due: i64,
    pub schedules_for: Duration,
    /// Cron: next times computed per case and round, and rounds.
    pub cron: (usize, usize),
    /// Harness: consumer counts; the ready depth one producer keeps (sending batches of
    /// `harness_batch`); the most a consumer claims per call (less when consumers x qty
    /// would exceed the depth); the simulated handler's time per job; warm-up, then measured.
    pub harness_consumers: Vec<usize>,
    pub harness_depth: i64,
    pub harness_batch: usize,
    pub harness_qty: i32,
    pub harness_handler: Duration,
    pub harness_warmup: Duration,
    pub harness_for: Duration,
    /// With nothing to claim, a pgqueue consumer waits in its call (pgq_ack_claim's `wait`,
    /// woken by a send's commit) up to `harness_wait`; a baseline consumer (no such wait)
    /// sleeps `harness_poll` before it polls again.
    pub harness_wait: Duration,
    pub harness_poll: Duration,
    /// How harness consumers ack and claim: one call per round (pgq_ack_claim), two
    /// (pgq_claim, then pgq_ack), or both, each point side by side.
    pub harness_modes: Vec<Mode>,
    /// Bytes: consumers per point; the background WAL is measured for `bytes_warmup` before
    /// the run, which then warms up as long before `bytes_for` is measured.
    pub bytes_consumers: usize,
    pub bytes_warmup: Duration,
    pub bytes_for: Duration,
    /// Prune: how long the consumers' rounds are measured before the prune (idle p99), and
    /// how often pg_locks is sampled for waiting backends.
    pub prune_idle_for: Duration,
    pub lock_sample_every: Duration,
    /// Console: (queues, history rows) of each size, smallest first, and the GETs per page.
    pub console_sizes: Vec<(i64, i64)>,
    pub console_rounds: usize,
    /// Results: callers each asking for one message's outcome (pgq_result, each on its own
    /// connection), rounds of as many messages, and how long a polling caller sleeps.
    pub result_callers: usize,
    pub result_rounds: usize,
    pub result_poll: Duration,
    /// Dependencies: single sends with `after` against plain ones, at each of these
    /// connection counts, this many calls of each kind per connection, with each of these
    /// numbers of parents; then `fan_in_runs` fan-ins of `fan_in_parents` parents acked by
    /// `fan_in_consumers`, each beside a control run of as many messages without dependents.
    pub dep_send_connections: Vec<usize>,
    /// Bloat: consumers (no handler, claiming `harness_qty`, one call a round); the share of
    /// the maximum rate (measured first for `bloat_calibrate`) the producer keeps to; how long
    /// the run lasts and how often it samples the hot table.
    pub bloat_consumers: usize,
    pub bloat_share: f64,
    pub bloat_calibrate: Duration,
    pub bloat_for: Duration,
    pub bloat_every: Duration,
    pub dep_send_calls: usize,
    pub dep_send_parents: Vec<usize>,
    pub fan_in_parents: i64,
    pub fan_in_consumers: usize,
    pub fan_in_runs: usize,
}

impl Sizes {
    /// The sizes the targets are stated for.
    pub fn full() -> Self {
        Sizes {
            depths: vec![0, 1_000, 10_000, 100_000],
            delayed: 100_000,
            claims_per_point: 2_000,
            consumers: vec![1, 4, 16, 64, 256],
            in_flight: 10_000,
            run_for: Duration::from_secs(10),
            warm_for: Duration::ZERO,
            repeat: 1,
            rescue_claims: 1_000_000,
            prune_rows: 1_000_000,
            renewals: 20_000,
            enqueue_messages: 200_000,
            work_per_second: 60_000.0,
            pgbench_scale: 10,
            pin_consumers: 16,
            pin_waiting: 5_000,
            pin_readers: 4,
            pin_phases: [Duration::from_secs(60), Duration::from_secs(300), Duration::from_secs(60)],
            pin_bucket: Duration::from_secs(10),
            pin_window: Duration::from_secs(60),
            pickup_consumers: 64,
            pickup_wait: Duration::from_secs(10),
            poll_sleep: Duration::from_millis(100),
            pickup_rate: 150.0,
            pickup_for: Duration::from_secs(60),
            idle_for: Duration::from_secs(30),
            send_for: Duration::from_secs(20),
            schedules: 10_000,
            schedules_due: 1_000,
            schedules_for: Duration::from_secs(30),
            cron: (5_000, 21),
            harness_consumers: vec![1, 4, 16, 64, 256],
            harness_depth: 2_000,
            harness_batch: 100,
            harness_qty: 32,
            harness_handler: Duration::from_millis(1),
            harness_warmup: Duration::from_secs(2),
            harness_for: Duration::from_secs(10),
            harness_wait: Duration::from_secs(1),
            harness_poll: Duration::from_millis(10),
            harness_modes: vec![Mode::OneCall],
            bytes_consumers: 16,
            bytes_warmup: Duration::from_secs(2),
            bytes_for: Duration::from_secs(15),
            prune_idle_for: Duration::from_secs(3),
            lock_sample_every: Duration::from_millis(5),
            console_sizes: vec![(10, 10_000), (1_000, 10_000_000)],
            console_rounds: 20,
            result_callers: 64,
            result_rounds: 150,
            result_poll: Duration::from_millis(10),
            dep_send_connections: vec![1, 4],
            bloat_consumers: 16,
            bloat_share: 0.8,
            bloat_calibrate: Duration::from_secs(15),
            bloat_for: Duration::from_secs(30 * 60),
            bloat_every: Duration::from_secs(10),
            dep_send_calls: 1_000,
            dep_send_parents: vec![1, 10],
            fan_in_parents: 10_000,
            fan_in_consumers: 16,
            fan_in_runs: 5,
        }
    }

    /// Tiny sizes: every scenario runs in seconds (the test suite's smoke run).
    pub fn smoke() -> Self {
        Sizes {
            depths: vec![0, 100],
            delayed: 100,
            claims_per_point: 20,
            consumers: vec![1, 2],
            in_flight: 50,
            run_for: Duration::from_millis(300),
            warm_for: Duration::from_millis(100),
            repeat: 2,
            rescue_claims: 2_000,
            // Enough that the pruned partition outweighs what the claimers ack meanwhile.
            prune_rows: 20_000,
            renewals: 200,
            enqueue_messages: 2_000,
            work_per_second: 10_000.0,
            pgbench_scale: 1,
            pin_consumers: 2,
            pin_waiting: 200,
            pin_readers: 2,
            pin_phases: [Duration::from_millis(500), Duration::from_secs(1), Duration::from_millis(500)],
            pin_bucket: Duration::from_millis(250),
            pin_window: Duration::from_millis(500),
            pickup_consumers: 4,
            pickup_wait: Duration::from_secs(1),
            poll_sleep: Duration::from_millis(100),
            pickup_rate: 50.0,
            pickup_for: Duration::from_secs(1),
            idle_for: Duration::from_secs(1),
            send_for: Duration::from_millis(500),
            schedules: 200,
            schedules_due: 20,
            schedules_for: Duration::from_secs(6),
            cron: (200, 1),
            harness_consumers: vec![1, 2],
            harness_depth: 200,
            harness_batch: 20,
            harness_qty: 8,
            harness_handler: Duration::from_millis(1),
            harness_warmup: Duration::from_millis(200),
            harness_for: Duration::from_millis(500),
            harness_wait: Duration::from_millis(100),
            harness_poll: Duration::from_millis(10),
            harness_modes: vec![Mode::OneCall, Mode::TwoCall],
            bytes_consumers: 2,
            bytes_warmup: Duration::from_millis(200),
            bytes_for: Duration::from_millis(500),
            prune_idle_for: Duration::from_millis(300),
            lock_sample_every: Duration::from_millis(5),
            console_sizes: vec![(2, 100), (4, 1_000)],
            console_rounds: 2,
            result_callers: 4,
            result_rounds: 2,
            result_poll: Duration::from_millis(10),
            dep_send_connections: vec![1, 2],
            bloat_consumers: 2,
            bloat_share: 0.8,
            bloat_calibrate: Duration::from_millis(500),
            bloat_for: Duration::from_secs(1),
            bloat_every: Duration::from_millis(250),
            dep_send_calls: 10,
            dep_send_parents: vec![1, 10],
            fan_in_parents: 100,
            fan_in_consumers: 2,
            fan_in_runs: 2,
        }
    }
}

/// Everything one run measured (written as JSON next to the charts).
#[derive(Default, Serialize)]
pub struct Report {
    pub server: String,
    pub flatness: Vec<FlatPoint>,
    pub throughput: Vec<ThroughputPoint>,
    pub rescue: Option<Rescue>,
    pub prune: Option<Prune>,
    pub renewals: Vec<Renewals>,
    pub enqueue: Vec<Enqueue>,
    pub pinned: Vec<PinnedRun>,
    pub pickup: Option<Pickup>,
    pub schedules: Option<Schedules>,
    pub unique: Vec<SendRate>,
    pub harness: Vec<HarnessPoint>,
    pub bytes: Vec<BytesPoint>,
    pub cron: Vec<cron_cost::CronCost>,
    pub console: Vec<console_size::ConsolePage>,
    pub results: Vec<ResultLatency>,
    pub dependencies: Option<Dependencies>,
    pub bloat: Vec<BloatRun>,
}

#[derive(Serialize, Clone)]
pub struct FlatPoint {
    pub system: String,
    pub in_flight: i64,
    pub delayed: i64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub buffers: i64,
}

#[derive(Serialize, Clone)]
pub struct ThroughputPoint {
    pub system: String,
    /// "two-call" (claim, then ack: two statements, two commits per round), "one-call"
    /// (pgq_ack_claim; the baseline's delete-ack and claim in one statement: one commit per
    /// round); empty for pgbench.
    pub mode: String,
    pub consumers: usize,
    pub qty: i32,
    /// Jobs per second (pgbench: tps).
    pub jobs_per_s: f64,
    /// p99 of one round (two-call: claim + ack; one-call: one call).
    pub p99_ms: f64,
    /// jobs_per_s ÷ pgbench -N's tps at the same consumer count (None for pgbench itself,
    /// or without pgbench).
    pub of_pgbench: Option<f64>,
    /// jobs_per_s ÷ the best jobs_per_s of the same system, mode and qty at any count.
    pub of_best: f64,
    /// Every run's jobs/s, in run order, when the sweep ran more than once (jobs_per_s and
    /// p99_ms are then the medians).
    pub runs: Vec<f64>,
}

#[derive(Serialize)]
pub struct Rescue {
    pub claims: i64,
    pub seconds: f64,
    pub claims_per_s: f64,
    pub live_p99_idle_ms: f64,
    pub live_p99_draining_ms: f64,
}

#[derive(Serialize)]
pub struct Prune {
    pub rows: i64,
    pub seconds: f64,
    pub rows_per_s: f64,
    pub outcome: String,
    /// pgq_prune calls that came back "blocked" (a lock held past the timeout) before it.
    pub blocked_attempts: u32,
    pub longest_claim_ack_ms: f64,
    pub lock_timeout_ms: i64,
    pub history_bytes_before: i64,
    pub history_bytes_after: i64,
    /// The same consumers just before the prune, for `idle_seconds`: rounds and their p99.
    pub idle_seconds: f64,
    pub idle_rounds: u64,
    pub idle_p99_ms: f64,
    /// The longest round that overlapped a pgq_prune call (from the first attempt's start to
    /// the end of the one that pruned), and that ÷ idle_p99_ms.
    pub longest_during_prune_ms: f64,
    pub during_vs_idle_p99: f64,
    /// The machine's own noise, for comparison: the idle time cut into windows as long as
    /// the prune call(s), the longest round overlapping each, their median and maximum (ms),
    /// and the median ÷ idle_p99_ms. The longest of a few hundred rounds is well above their
    /// p99 on a shared machine even when nothing else runs.
    pub idle_windows: u32,
    pub idle_window_longest_median_ms: f64,
    pub idle_window_longest_max_ms: f64,
    pub idle_window_vs_idle_p99: f64,
    /// pg_locks sampled every `lock_sample_ms` from a separate connection (waits shorter
    /// than that can be missed): the longest wait seen during the prune call(s) by the
    /// consumers and by the prune itself (`pg_locks.waitstart` to the sample), what the
    /// consumers' longest wait was for, and the consumers' longest wait while idle.
    pub lock_sample_ms: f64,
    pub lock_samples: u64,
    pub lock_wait_consumers_ms: f64,
    pub lock_wait_consumers_on: String,
    pub lock_wait_prune_ms: f64,
    pub lock_wait_idle_ms: f64,
}

#[derive(Serialize)]
pub struct Renewals {
    pub system: String,
    pub updates: i64,
    pub hot_updates: i64,
    pub hot_ratio: f64,
}

#[derive(Serialize)]
pub struct Enqueue {
    pub method: String,
    pub per_call: usize,
    pub messages_per_s: f64,
}

/// One system under one way of holding the xmin horizon back.
#[derive(Serialize)]
pub struct PinnedRun {
    pub system: String,
    pub pin: String,
    pub consumers: usize,
    pub waiting: i64,
    pub windows: Vec<PinWindow>,
    /// The queue table before the pin, at its end, and at the end of the run.
    pub tables: Vec<TableState>,
    /// Scans the REPEATABLE READ readers completed, and their mean time.
    pub reader_scans: u64,
    pub reader_scan_ms: f64,
}

#[derive(Serialize)]
pub struct PinWindow {
    /// unpinned, pinned, pinned (last), released.
    pub phase: String,
    /// Seconds since the phase began.
    pub from_s: f64,
    pub to_s: f64,
    pub jobs_per_s: f64,
    pub claim_p50_us: u64,
    pub claim_p99_us: u64,
}

#[derive(Serialize)]
pub struct TableState {
    pub when: String,
    pub dead_tuples: i64,
    pub bytes: i64,
}

#[derive(Serialize)]
pub struct Pickup {
    pub latency: Vec<PickupLatency>,
    pub idle: Vec<IdleCost>,
    pub sends: Vec<SendRate>,
}

/// From a send's commit (as its producer saw it return) to a consumer's claim returning it.
#[derive(Serialize)]
pub struct PickupLatency {
    pub consumers: String,
    pub sent: u64,
    pub claimed: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// From an ack's call returning (its commit done, as the finisher saw it) to the pgq_result
/// of the caller asking for that message returning it completed; and the finisher's acks.
#[derive(Serialize, Debug)]
pub struct ResultLatency {
    /// How the callers ask, how many there are (each on its own connection, asking for one
    /// message per round), and rounds.
    pub asking: String,
    pub callers: usize,
    pub rounds: usize,
    /// Callers that saw their message completed, and those that saw any other state.
    pub samples: u64,
    pub failures: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// The finisher's pgq_ack calls, each its own commit.
    pub ack_p50_ms: f64,
}

/// Dependencies: what `after` adds to a send, and a fan-in of many parents into one child.
#[derive(Serialize, Debug, Default)]
pub struct Dependencies {
    pub sends: Vec<DependencySend>,
    pub fan_in: Vec<FanInRun>,
    /// The median over the runs of `release_ms`.
    pub release_p50_ms: f64,
}

/// Single pgq_send calls, each its own commit, on `connections` connections at once, the
/// kinds interleaved call by call: per-call latency as the client sees it.
#[derive(Serialize, Debug)]
pub struct DependencySend {
    pub connections: usize,
    /// Parents named in `after`, each a ready message of its own (0: a plain send).
    pub parents: usize,
    pub calls: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// p50 ÷ the plain send's p50 at the same connection count.
    pub of_plain: f64,
}

/// One fan-in: a child sent with `after` naming `parents` ready messages, a claim waiting on
/// the child's queue, and `consumers` claiming and acking the parents one at a time (claim,
/// then ack, each its own commit). Beside it in the same run, the control: the same consumers
/// acking as many messages that have no dependents.
#[derive(Serialize, Debug)]
pub struct FanInRun {
    pub run: usize,
    pub parents: i64,
    pub consumers: usize,
    /// The child's pgq_send call, naming every parent.
    pub child_send_ms: f64,
    /// The parents' acks: how many, over how long, and one pgq_ack call's latency.
    pub acks: u64,
    pub seconds: f64,
    pub ack_p50_ms: f64,
    pub ack_p99_ms: f64,
    pub ack_max_ms: f64,
    /// The p50 of the first and of the last tenth of the acks (in the order they returned):
    /// whether an ack costs more as the child's parents finish.
    pub ack_p50_first_tenth_ms: f64,
    pub ack_p50_last_tenth_ms: f64,
    /// The control's acks.
    pub control_acks: u64,
    pub control_seconds: f64,
    pub control_ack_p50_ms: f64,
    pub control_ack_p99_ms: f64,
    pub control_ack_max_ms: f64,
    pub control_ack_p50_first_tenth_ms: f64,
    pub control_ack_p50_last_tenth_ms: f64,
    /// From the last parent's ack returning (the latest commit of them all, as its consumer
    /// saw it) to the waiting claim on the child's queue returning the child.
    pub release_ms: f64,
    /// What made the child claimable: the last ack's own transaction, or the worker (two
    /// last acks committing together, neither seeing the other's).
    pub released_by: String,
    /// pg_locks sampled during the acks (fan-in, control): samples, samples with a consumer
    /// waiting for a lock, and the longest such wait seen (with what it waited on).
    pub lock_samples: u64,
    pub lock_waiting_samples: u64,
    pub lock_wait_ms: f64,
    pub lock_wait_on: String,
    pub control_lock_samples: u64,
    pub control_lock_waiting_samples: u64,
    pub control_lock_wait_ms: f64,
}

/// How a results caller asks for its message's outcome.
#[derive(Clone, Copy)]
enum Asking {
    /// `pgq_result(…, wait => …)`, woken by the finishing commit.
    Waits,
    /// `pgq_result` without wait, sleeping this long while the message is not finished.
    Polls(Duration),
    /// Nobody asks: the acks alone, for comparison.
    Nobody,
}

impl Asking {
    fn describe(self) -> String {
        match self {
            Asking::Waits => "waiting (pgq_result wait)".into(),
            Asking::Polls(sleep) => format!("polling every {} ms", sleep.as_millis()),
            Asking::Nobody => "nobody asking (acks alone)".into(),
        }
    }
}

/// Statements per consumer per minute with nothing to claim.
#[derive(Serialize)]
pub struct IdleCost {
    pub consumers: String,
    pub seconds: f64,
    /// pgq_claim calls, counted by the consumers.
    pub claims_per_min: f64,
    /// From pg_stat_statements (None without it): pgq_claim calls, the statements run
    /// inside them, and among those the sleeps.
    pub server_claims_per_min: Option<f64>,
    pub inner_statements_per_min: Option<f64>,
    pub sleeps_per_min: Option<f64>,
}

/// Single sends as fast as one producer goes, beside consumers (or none).
#[derive(Serialize)]
pub struct SendRate {
    pub case: String,
    pub messages_per_s: f64,
    /// To the rate without consumers.
    pub ratio: f64,
    /// Messages the consumers claimed (and acked) per second meanwhile.
    pub consumed_per_s: f64,
}

/// Schedules: what a tick costs with none due, how long firing a burst takes, and how late
/// runs are enqueued under the live worker.
#[derive(Serialize)]
pub struct Schedules {
    pub schedules: i64,
    /// One `_fire_schedules(50)` call with nothing due: p50 time and shared buffers touched.
    pub idle_p50_us: u64,
    pub idle_buffers: i64,
    /// `due` schedules made due at once, fired the way the worker does (50 a transaction).
    pub due: i64,
    pub burst_fired: i64,
    pub burst_ms: f64,
    pub tick_interval_ms: i64,
    /// The live worker for `live_seconds`: runs enqueued against slots passed (times due),
    /// duplicates, and lateness (enqueued_at - scheduled_for).
    pub live_seconds: f64,
    pub live_runs: i64,
    pub live_expected: i64,
    pub live_duplicates: i64,
    pub lateness_p50_ms: f64,
    pub lateness_p99_ms: f64,
    pub lateness_max_ms: f64,
}

/// A harness point: one producer keeping a ready depth, N consumers with a simulated handler,
/// each acking by its next claim call.
#[derive(Serialize)]
pub struct HarnessPoint {
    pub system: String,
    pub mode: String,
    pub consumers: usize,
    /// What each call claims at most (smaller at high N so that consumers x qty <= depth).
    pub qty: i32,
    pub depth: i64,
    pub batch: usize,
    pub handler_ms: f64,
    pub seconds: f64,
    /// Jobs acked per second in the measured window.
    pub jobs_per_s: f64,
    /// consumers x (1 s ÷ handler): what the consumers could do with a free server.
    pub handler_bound: f64,
    pub sent_per_s: f64,
    /// The producer's mean time per send call (one batch, its own commit) in the window.
    pub send_call_ms: f64,
    /// Calls in the measured window that claimed nothing (the producer fell behind), of all.
    pub empty_calls: u64,
    pub calls: u64,
    /// With nothing to claim: pgqueue's wait in the call, the baseline's sleep before it
    /// polls again (ms).
    pub empty_wait_ms: f64,
    /// Enqueue -> claim on the server's clock (enqueued_at to clock_timestamp() as the
    /// claim's rows are returned), in ms.
    pub pickup_p50_ms: f64,
    pub pickup_p95_ms: f64,
    pub pickup_p99_ms: f64,
    /// p99 of one call (ack + claim) among the calls that claimed something.
    pub call_p99_ms: f64,
    /// The ready depth the producer kept (sent minus claimed, sampled every 100 ms in the
    /// window): median and lowest.
    pub depth_p50: i64,
    pub depth_min: i64,
    /// Per job acked in the window: rows inserted, updated and deleted in the system's
    /// tables (pg_stat_user_tables, whose counts reach the view within about a second), and
    /// WAL bytes (all of the server's).
    pub row_writes_per_job: f64,
    pub wal_bytes_per_job: f64,
    /// Dead rows in the system's tables at the end of the window.
    pub dead_rows: i64,
}

/// A long run at a steady rate below the maximum: does the hot table stay flat?
#[derive(Serialize)]
pub struct BloatRun {
    pub system: String,
    pub consumers: usize,
    pub qty: i32,
    /// Jobs/s as fast as producer and consumers go, and the producer's rate in the run.
    pub max_jobs_per_s: f64,
    pub rate: f64,
    /// The most the producer keeps ready (it sends at `rate` while fewer are).
    pub depth: i64,
    pub samples: Vec<BloatSample>,
}

#[derive(Serialize)]
pub struct BloatSample {
    pub at_s: f64,
    /// Jobs acked per second since the previous sample.
    pub jobs_per_s: f64,
    /// The hot table's live and dead rows (the statistics' counts), its size with indexes
    /// and TOAST, and how many autovacuums have processed it since the server started.
    pub live: i64,
    pub dead: i64,
    pub bytes: i64,
    pub autovacuums: i64,
}

/// WAL and table sizes with a producer keeping the depth and consumers at full speed.
#[derive(Serialize)]
pub struct BytesPoint {
    pub system: String,
    pub mode: String,
    pub consumers: usize,
    pub qty: i32,
    pub seconds: f64,
    /// Jobs acked and messages sent in the measured window.
    pub jobs: u64,
    pub sent: u64,
    pub jobs_per_s: f64,
    /// Calls that claimed nothing (the producer fell behind), of all, in the window.
    pub empty_calls: u64,
    pub calls: u64,
    /// pg_current_wal_insert_lsn() difference over the measured window, and ÷ jobs.
    pub wal_bytes: i64,
    pub wal_per_job: f64,
    /// WAL per second with nothing running but the worker (measured just before), and the
    /// WAL per job with that rate taken off.
    pub background_wal_per_s: f64,
    pub wal_per_job_net: f64,
    /// pg_stat_wal deltas over the window (approximate: backends flush these at most once a
    /// second); None where pg_stat_wal lacks them.
    pub wal_records_per_job: Option<f64>,
    pub wal_fpi: Option<i64>,
    /// The hot table (pgqueue.messages / bench_baseline.jobs) with indexes and TOAST, at the
    /// start and at the end of the measured window; its heap and each index at the end.
    pub hot_bytes_start: i64,
    pub hot_bytes_end: i64,
    pub heap_bytes: i64,
    pub indexes: Vec<RelSize>,
    /// pgqueue: the queue's history partitions (with indexes) at the start and end.
    pub history_bytes_start: Option<i64>,
    pub history_bytes_end: Option<i64>,
}

#[derive(Serialize)]
pub struct RelSize {
    pub name: String,
    pub bytes: i64,
}

/// How a consumer acks and claims.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Mode {
    /// A claim statement, then an ack statement: two commits per round.
    TwoCall,
    /// pgqueue: pgq_ack_claim; the baseline: its delete-ack and its claim in one statement.
    OneCall,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::TwoCall => "two-call",
            Mode::OneCall => "one-call",
        }
    }

    pub fn parse(name: &str) -> Option<Mode> {
        [Mode::TwoCall, Mode::OneCall].into_iter().find(|m| m.name() == name)
    }
}

/// The two systems under test, behind the same four operations.
#[derive(Clone, Copy, PartialEq)]
pub enum System {
    Pgqueue,
    Baseline,
}

impl System {
    pub fn name(self) -> &'static str {
        match self {
            System::Pgqueue => "pgqueue",
            System::Baseline => "baseline",
        }
    }

    /// The table its messages are in: for pgqueue the one behind the view pgqueue.messages
    /// (0.20.0 on) or, in earlier releases, that table itself.
    fn table(self, c: &mut impl postgres::GenericClient) -> String {
        match self {
            System::Pgqueue => c
                .query_one(
                    "SELECT coalesce(to_regclass('pgqueue.message_rows'), 'pgqueue.messages'::regclass)::text",
                    &[],
                )
                .unwrap()
                .get(0),
            System::Baseline => "bench_baseline.jobs".into(),
        }
    }
}

/// How the pinned scenario holds the xmin horizon back.
#[derive(Clone, Copy)]
enum Pin {
    /// A session idle in a transaction that holds an xid.
    IdleXid,
    /// Readers counting the queue table's rows in a loop, each keeping one REPEATABLE READ
    /// snapshot; or, as a control (the same load, no pin), READ COMMITTED.
    Readers { repeatable: bool },
}

/// How a pickup consumer waits for messages.
#[derive(Clone, Copy)]
enum Consumer {
    /// `pgq_claim(…, wait => …)` in a loop.
    Waiting(Duration),
    /// `pgq_claim` without wait, sleeping this long after an empty claim.
    Polling(Duration),
}

impl Consumer {
    fn describe(self, n: usize) -> String {
        match self {
            Consumer::Waiting(wait) => format!("{n} waiting (wait {wait:?})"),
            Consumer::Polling(sleep) => format!("{n} polling (sleep {sleep:?})"),
        }
    }
}

/// What a pickup consumer claimed: per message, its job number and when its claim returned
/// (µs since the consumers' base instant).
type Picked = Vec<(i64, u64)>;

/// Pickup consumers of one queue, each on its own connection, claiming one message at a time
/// and acking it.
struct Consumers {
    stop: Arc<AtomicBool>,
    /// pgq_claim calls completed.
    claims: Arc<AtomicU64>,
    /// Messages claimed.
    picked: Arc<AtomicU64>,
    threads: Vec<(postgres::CancelToken, JoinHandle<Picked>)>,
}

impl Consumers {
    /// `track_all`: pg_stat_statements also counts the statements inside pgq_claim.
    fn start(bench: &Bench, n: usize, queue: &str, how: Consumer, base: Instant, track_all: bool) -> Consumers {
        let stop = Arc::new(AtomicBool::new(false));
        let (claims, picked) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let wait = match how {
            Consumer::Waiting(wait) => wait,
            Consumer::Polling(_) => Duration::ZERO,
        };
        let sql = format!(
            "SELECT msg_id, claim_token, (payload->>'job')::bigint
               FROM pgqueue.pgq_claim('{queue}', wait => '{} ms')",
            wait.as_millis()
        );
        let threads = (0..n)
            .map(|_| {
                let mut c = bench.connect();
                if track_all {
                    c.batch_execute("SET pg_stat_statements.track = 'all'").unwrap();
                }
                let (stop, claims, picked) = (stop.clone(), claims.clone(), picked.clone());
                let (token, sql) = (c.cancel_token(), sql.clone());
                let thread = std::thread::spawn(move || {
                    let claim = c.prepare(&sql).unwrap();
                    let mut got = vec![];
                    while !stop.load(Ordering::Relaxed) {
                        let rows = match c.query(&claim, &[]) {
                            Ok(rows) => rows,
                            Err(_) if stop.load(Ordering::Relaxed) => break,
                            Err(e) => panic!("claim: {e}"),
                        };
                        let at = base.elapsed().as_micros() as u64;
                        claims.fetch_add(1, Ordering::Relaxed);
                        let Some(row) = rows.first() else {
                            if let Consumer::Polling(sleep) = how {
                                std::thread::sleep(sleep);
                            }
                            continue;
                        };
                        picked.fetch_add(1, Ordering::Relaxed);
                        got.push((row.get(2), at));
                        let (id, token): (i64, Uuid) = (row.get(0), row.get(1));
                        if let Err(e) = c.execute("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&id, &token]) {
                            assert!(stop.load(Ordering::Relaxed), "ack: {e}");
                            break;
                        }
                    }
                    got
                });
                (token, thread)
            })
            .collect();
        Consumers { stop, claims, picked, threads }
    }

    /// Stops them, cancelling the claims still waiting; what they claimed.
    fn stop(self) -> Picked {
        self.stop.store(true, Ordering::Relaxed);
        // A cancel that lands between two statements is lost: repeat until all are out.
        while self.threads.iter().any(|(_, t)| !t.is_finished()) {
            for (token, thread) in &self.threads {
                if !thread.is_finished() {
                    let _ = token.cancel_query(NoTls);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.threads.into_iter().flat_map(|(_, t)| t.join().unwrap()).collect()
    }
}

/// What one round of a consumer did: acks that committed, messages claimed, and per claimed
/// message the µs from its enqueued_at to the claim (the server's clock).
struct Round {
    acked: usize,
    claimed: usize,
    waits_us: Vec<i64>,
}

/// A consumer's round trips, in either mode, for one system. It keeps what it claimed until
/// its next round acks it. Each statement is its own transaction.
struct Rounds {
    system: System,
    mode: Mode,
    qty: i32,
    /// pgqueue: how long a claim with nothing to ack waits for messages (zero: not at all).
    wait: Duration,
    ids: Vec<i64>,
    tokens: Vec<Option<Uuid>>,
    /// Prepared once (a harness's driver would), or sent as text each time (as the rest of
    /// the tool does: the client prepares an unnamed statement per call).
    prepared: Option<[postgres::Statement; 2]>,
}

/// enqueued_at -> the claim's rows being returned, in µs, on the server's clock.
const WAIT_US: &str = "(extract(epoch FROM clock_timestamp() - enqueued_at) * 1e6)::bigint";

impl Rounds {
    /// [claim (two-call) or ack + claim (one-call), ack (two-call)]; every claim returns
    /// (claimed?, msg_id, claim_token, wait µs).
    fn sql(system: System, mode: Mode, wait: Duration) -> [String; 2] {
        let wait = if wait.is_zero() { String::new() } else { format!(", wait => '{} ms'", wait.as_millis()) };
        let ack = match system {
            System::Pgqueue => "SELECT count(*) FROM pgqueue.pgq_ack($1::bigint[], $2::uuid[])".to_string(),
            System::Baseline => "DELETE FROM bench_baseline.jobs WHERE id = ANY ($1::bigint[])".to_string(),
        };
        let claim = match (system, mode) {
            (System::Pgqueue, Mode::TwoCall) => {
                format!("SELECT true, msg_id, claim_token, {WAIT_US} FROM pgqueue.pgq_claim('{QUEUE}', $1::int{wait})")
            }
            (System::Pgqueue, Mode::OneCall) => format!(
                "SELECT kind = 'claimed', msg_id, claim_token, {WAIT_US}
                   FROM pgqueue.pgq_ack_claim('{QUEUE}', $1::bigint[], $2::uuid[], $3::int{wait})"
            ),
            (System::Baseline, Mode::TwoCall) => format!(
                "WITH next AS (
                     SELECT id FROM bench_baseline.jobs WHERE queue = '{QUEUE}' AND vt <= now()
                      ORDER BY id LIMIT $1::int FOR UPDATE SKIP LOCKED)
                 UPDATE bench_baseline.jobs j SET vt = now() + interval '30 s', read_ct = read_ct + 1
                   FROM next WHERE j.id = next.id
                 RETURNING true, j.id, NULL::uuid, {WAIT_US}"
            ),
            // The baseline's one-commit round: its delete-ack and its claim in one statement.
            // The rows it deletes are its own claims (vt in the future), which the claim's
            // `vt <= now()` never picks. The claim waits for the delete to finish (a one-time
            // filter on it, evaluated before the scan), so that, as pgq_ack_claim does, it acks
            // before it locks anything: acking after the claim's locks deadlocks, because
            // SKIP LOCKED still waits on a transaction while following a row's update chain.
            (System::Baseline, Mode::OneCall) => format!(
                "WITH acked AS (
                     DELETE FROM bench_baseline.jobs WHERE id = ANY ($1::bigint[]) RETURNING id
                 ), next AS (
                     SELECT id FROM bench_baseline.jobs
                      WHERE queue = '{QUEUE}' AND vt <= now() AND (SELECT count(*) FROM acked) >= 0
                      ORDER BY id LIMIT $2::int FOR UPDATE SKIP LOCKED
                 )
                 UPDATE bench_baseline.jobs j SET vt = now() + interval '30 s', read_ct = read_ct + 1
                   FROM next WHERE j.id = next.id
                 RETURNING true, j.id, NULL::uuid, {WAIT_US}"
            ),
        };
        [claim, ack]
    }

    fn new(c: &mut Client, system: System, mode: Mode, qty: i32, wait: Duration, prepare: bool) -> Rounds {
        let prepared = prepare.then(|| Self::sql(system, mode, wait).map(|sql| c.prepare(&sql).unwrap()));
        Rounds { system, mode, qty, wait, ids: vec![], tokens: vec![], prepared }
    }

    fn run(&self, c: &mut Client, which: usize, params: &[&(dyn postgres::types::ToSql + Sync)]) -> Vec<postgres::Row> {
        match &self.prepared {
            Some(statements) => c.query(&statements[which], params),
            None => c.query(Self::sql(self.system, self.mode, self.wait)[which].as_str(), params),
        }
        .unwrap_or_else(|e| {
            let what = e.as_db_error().map_or_else(|| e.to_string(), |d| format!("{}: {:?}", d.message(), d.detail()));
            panic!("{} {} round: {what}", self.system.name(), self.mode.name())
        })
    }

    /// Acks what it holds and claims up to qty: one statement (one-call) or two.
    fn round(&mut self, c: &mut Client) -> Round {
        let held = self.ids.len();
        let mut acked = held;
        let rows = match (self.mode, self.system) {
            (Mode::OneCall, System::Pgqueue) => self.run(c, 0, &[&self.ids, &self.tokens, &self.qty]),
            (Mode::OneCall, System::Baseline) => self.run(c, 0, &[&self.ids, &self.qty]),
            (Mode::TwoCall, system) => {
                if held > 0 {
                    let rows = match system {
                        System::Pgqueue => self.run(c, 1, &[&self.ids, &self.tokens]),
                        System::Baseline => self.run(c, 1, &[&self.ids]),
                    };
                    // pgqueue: the count of acks that passed the fence; the baseline deletes
                    // without a fence (and returns no rows).
                    if system == System::Pgqueue {
                        acked = rows[0].get::<_, i64>(0) as usize;
                    }
                }
                self.run(c, 0, &[&self.qty])
            }
        };
        self.ids.clear();
        self.tokens.clear();
        let mut waits_us = vec![];
        for row in &rows {
            if row.get::<_, bool>(0) {
                self.ids.push(row.get(1));
                self.tokens.push(row.get(2));
                waits_us.push(row.get::<_, Option<i64>>(3).unwrap_or(0));
            } else {
                acked -= 1; // pgq_ack_claim: an ack that failed the fence
            }
        }
        Round { acked, claimed: self.ids.len(), waits_us }
    }
}

/// What a fleet runs: which system, how its consumers ack and claim, and its producer.
#[derive(Clone, Copy)]
struct FleetSpec {
    system: System,
    mode: Mode,
    consumers: usize,
    qty: i32,
    /// Per job, one after the other (zero: none).
    handler: Duration,
    /// pgqueue: the claim's wait with nothing to ack; the baseline: the sleep after an empty
    /// poll. (pgqueue without a wait sleeps as long as the baseline.)
    wait: Duration,
    poll: Duration,
    depth: i64,
    batch: usize,
    /// The most messages a second the producer sends (None: as fast as the depth allows).
    rate: Option<f64>,
}

/// A producer keeping about `depth` messages ready (sent minus claimed, as the consumers
/// report them), and consumers running `Rounds` with a simulated handler. Counters and
/// histograms cover the measured window only (`measure`).
struct Fleet {
    stop: Arc<AtomicBool>,
    measuring: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    claimed: Arc<AtomicU64>,
    /// The producer's send calls and the µs they took.
    sends: Arc<AtomicU64>,
    send_us: Arc<AtomicU64>,
    acked: Arc<AtomicU64>,
    calls: Arc<AtomicU64>,
    empty_calls: Arc<AtomicU64>,
    producer: JoinHandle<()>,
    /// Per consumer: enqueue -> claim µs, and µs of the calls that claimed, in the window.
    consumers: Vec<JoinHandle<(Histogram<u64>, Histogram<u64>)>>,
}

/// Counters of a fleet at one instant.
#[derive(Clone, Copy)]
struct Counts {
    at: Instant,
    sent: u64,
    sends: u64,
    send_us: u64,
    acked: u64,
    calls: u64,
    empty_calls: u64,
}

impl Fleet {
    fn start(bench: &Bench, spec: FleetSpec) -> Fleet {
        let FleetSpec { system, mode, consumers, qty, handler, wait, poll, depth, batch, rate } = spec;
        let stop = Arc::new(AtomicBool::new(false));
        let measuring = Arc::new(AtomicBool::new(false));
        let counter = || Arc::new(AtomicU64::new(0));
        let (sent, claimed, acked, calls, empty_calls) = (counter(), counter(), counter(), counter(), counter());
        let (sends, send_us) = (counter(), counter());
        let mut p = bench.connect();
        let producer = {
            let (stop, sent, claimed, sends, send_us) =
                (stop.clone(), sent.clone(), claimed.clone(), sends.clone(), send_us.clone());
            let send = match system {
                System::Pgqueue => format!("SELECT count(*) FROM pgqueue.pgq_send_batch('{QUEUE}', $1::jsonb[])"),
                System::Baseline => {
                    format!(
                        "INSERT INTO bench_baseline.jobs (queue, payload) SELECT '{QUEUE}', p FROM unnest($1::jsonb[]) p"
                    )
                }
            };
            let send = p.prepare(&send).unwrap();
            std::thread::spawn(move || {
                let payloads: Vec<Value> = (0..batch as u64).map(payload).collect();
                // At a rate: one batch per batch ÷ rate, late ones not made up for.
                let every = rate.map(|r| Duration::from_secs_f64(batch as f64 / r));
                let mut next = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let ready = sent.load(Ordering::Relaxed) as i64 - claimed.load(Ordering::Relaxed) as i64;
                    if let Some(wait) = every.and_then(|_| next.checked_duration_since(Instant::now())) {
                        std::thread::sleep(wait.min(Duration::from_millis(10)));
                    } else if ready < depth {
                        next = next.max(Instant::now()) + every.unwrap_or_default();
                        let t = Instant::now();
                        p.execute(&send, &[&payloads]).unwrap();
                        send_us.fetch_add(t.elapsed().as_micros() as u64, Ordering::Relaxed);
                        sends.fetch_add(1, Ordering::Relaxed);
                        sent.fetch_add(batch as u64, Ordering::Relaxed);
                    } else {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            })
        };
        // Only pgqueue waits in its call; the baseline polls.
        let (wait, poll) = match system {
            System::Pgqueue if !wait.is_zero() => (wait, Duration::ZERO),
            _ => (Duration::ZERO, poll),
        };
        let clients: Vec<Client> = (0..consumers).map(|_| bench.connect()).collect();
        let consumers = clients
            .into_iter()
            .map(|mut c| {
                let (stop, measuring) = (stop.clone(), measuring.clone());
                let (claimed, acked, calls, empty_calls) =
                    (claimed.clone(), acked.clone(), calls.clone(), empty_calls.clone());
                let mut rounds = Rounds::new(&mut c, system, mode, qty, wait, true);
                std::thread::spawn(move || {
                    let (mut waits, mut took) = (Histogram::<u64>::new(3).unwrap(), Histogram::<u64>::new(3).unwrap());
                    while !stop.load(Ordering::Relaxed) {
                        let t = Instant::now();
                        let round = rounds.round(&mut c);
                        let call = t.elapsed();
                        claimed.fetch_add(round.claimed as u64, Ordering::Relaxed);
                        acked.fetch_add(round.acked as u64, Ordering::Relaxed);
                        calls.fetch_add(1, Ordering::Relaxed);
                        if measuring.load(Ordering::Relaxed) && round.claimed > 0 {
                            took.record(call.as_micros() as u64).unwrap();
                            for &w in &round.waits_us {
                                waits.record(w.max(0) as u64).unwrap();
                            }
                        }
                        if round.claimed == 0 {
                            empty_calls.fetch_add(1, Ordering::Relaxed);
                            std::thread::sleep(poll);
                            continue;
                        }
                        // The handler: one job after the other.
                        if !handler.is_zero() {
                            for _ in 0..round.claimed {
                                std::thread::sleep(handler);
                            }
                        }
                    }
                    (waits, took)
                })
            })
            .collect();
        Fleet { stop, measuring, sent, claimed, sends, send_us, acked, calls, empty_calls, producer, consumers }
    }

    /// What the producer sees as ready: sent minus claimed.
    fn ready(&self) -> i64 {
        self.sent.load(Ordering::Relaxed) as i64 - self.claimed.load(Ordering::Relaxed) as i64
    }

    fn counts(&self) -> Counts {
        Counts {
            at: Instant::now(),
            sent: self.sent.load(Ordering::Relaxed),
            sends: self.sends.load(Ordering::Relaxed),
            send_us: self.send_us.load(Ordering::Relaxed),
            acked: self.acked.load(Ordering::Relaxed),
            calls: self.calls.load(Ordering::Relaxed),
            empty_calls: self.empty_calls.load(Ordering::Relaxed),
        }
    }

    /// Starts (true) or ends (false) the measured window; the counters at that instant.
    fn measure(&self, on: bool) -> Counts {
        let counts = self.counts();
        self.measuring.store(on, Ordering::Relaxed);
        counts
    }

    /// Stops everyone; the merged (pickup µs, call µs) histograms of the measured window.
    fn stop(self) -> (Histogram<u64>, Histogram<u64>) {
        self.stop.store(true, Ordering::Relaxed);
        self.producer.join().unwrap();
        let (mut waits, mut calls) = (Histogram::<u64>::new(3).unwrap(), Histogram::<u64>::new(3).unwrap());
        for consumer in self.consumers {
            let (w, c) = consumer.join().unwrap();
            waits.add(w).unwrap();
            calls.add(c).unwrap();
        }
        (waits, calls)
    }
}

/// A message as every scenario sends it.
fn payload(job: u64) -> Value {
    serde_json::json!({"job": job, "pad": "xxxxxxxxxxxxxxxxxxxxxxxx"})
}

const QUEUE: &str = "bench";
/// Dependencies: the parents' queue and the child's (reset drops them with the rest).
const PARENTS: &str = "bench_parents";
const CHILD: &str = "bench_child";

/// The baseline queue, installed next to pgqueue.
const BASELINE_SQL: &str = "
DROP SCHEMA IF EXISTS bench_baseline CASCADE;
CREATE SCHEMA bench_baseline;
CREATE TABLE bench_baseline.jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    vt timestamptz NOT NULL DEFAULT now(),
    read_ct integer NOT NULL DEFAULT 0,
    priority smallint NOT NULL DEFAULT 0,
    payload jsonb NOT NULL,
    enqueued_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX jobs_vt_idx ON bench_baseline.jobs (vt);
";

pub struct Bench {
    dsn: String,
    pub sizes: Sizes,
    progress: bool,
}

impl Bench {
    pub fn new(dsn: &str, sizes: Sizes, progress: bool) -> Self {
        Bench { dsn: dsn.to_string(), sizes, progress }
    }

    fn connect(&self) -> Client {
        Client::connect(&self.dsn, NoTls).unwrap_or_else(|e| panic!("connect to {}: {e}", self.dsn))
    }

    fn say(&self, what: &str) {
        if self.progress {
            eprintln!("[bench] {what}");
        }
    }

    /// Runs the named scenarios ("all" for every one).
    pub fn run(&self, scenarios: &[&str]) -> Report {
        let wants = |s: &str| scenarios.contains(&"all") || scenarios.contains(&s);
        let mut c = self.connect();
        // Whether the shared buffers are in huge pages (huge_pages_status since 17), and the
        // release of pgqueue's SQL (runs that swap builds say which one they measured).
        let server = c
            .query_one(
                "SELECT version() || ', huge_pages = ' || coalesce(current_setting('huge_pages_status', true),
                        current_setting('huge_pages'))
                        || coalesce(', pgqueue ' || (SELECT extversion FROM pg_extension WHERE extname = 'pgqueue'), '')",
                &[],
            )
            .unwrap()
            .get(0);
        let mut report = Report { server, ..Default::default() };
        if wants("flatness") {
            report.flatness = self.flatness();
        }
        if wants("throughput") {
            report.throughput = self.throughput();
        }
        if wants("rescue") {
            report.rescue = Some(self.rescue());
        }
        if wants("prune") {
            report.prune = Some(self.prune());
        }
        if wants("renewals") {
            report.renewals = self.renewals();
        }
        if wants("enqueue") {
            report.enqueue = self.enqueue();
        }
        if wants("pinned") {
            report.pinned = self.pinned();
        }
        if wants("pickup") {
            report.pickup = Some(self.pickup());
        }
        if wants("schedules") {
            report.schedules = Some(self.schedules());
        }
        if wants("unique") {
            report.unique = self.unique();
        }
        if wants("harness") {
            report.harness = self.harness();
        }
        if wants("bytes") {
            report.bytes = self.bytes();
        }
        if wants("cron") {
            let (slots, rounds) = self.sizes.cron;
            report.cron = cron_cost::measure(slots, rounds);
        }
        if wants("console") {
            report.console =
                console_size::measure(&self.dsn, &self.sizes.console_sizes, self.sizes.console_rounds, |w| self.say(w));
        }
        if wants("results") {
            report.results = self.results();
        }
        if wants("dependencies") {
            report.dependencies = Some(self.dependencies());
        }
        // Half an hour at full size: only when named.
        if scenarios.contains(&"bloat") {
            report.bloat = self.bloat();
        }
        report
    }

    /// An empty queue in both systems.
    fn reset(&self, c: &mut Client) {
        c.batch_execute(BASELINE_SQL).unwrap();
        // A plain table of pgqueue's shape, for the enqueue comparison.
        let table = System::Pgqueue.table(c);
        c.batch_execute(&format!("CREATE TABLE bench_baseline.plain (LIKE {table} INCLUDING ALL)")).unwrap();
        c.batch_execute(&format!(
            "SELECT pgqueue.pgq_drop_queue(queue, force => true) FROM pgqueue.queues WHERE queue LIKE '{QUEUE}%';
             SELECT pgqueue.pgq_create_queue('{QUEUE}', lease => '1 hour', retention => '1 day');"
        ))
        .unwrap();
        Self::checked(c, QUEUE);
    }

    /// Waits until a tick has checked `queue`'s hints and, with the claim ledger on, the held
    /// set vouches for every claim. A queue's claims use the hints from then on: within a
    /// second of its creation, but right after CREATE EXTENSION only when the database's worker
    /// has started (pgqueue.launcher_naptime, 10 s). Until then every claim scans from the
    /// start, and claims through the ledger ask the ledger about the rows they lock (the set
    /// is exact from the worker's first rebuild); that is not what a point measures.
    fn checked(c: &mut Client, queue: &str) {
        let held_set: bool = c
            .query_one(
                "SELECT to_regclass('pgqueue.held_set') IS NOT NULL
                    AND coalesce(current_setting('pgqueue.claim_ledger', true), 'off') = 'on'",
                &[],
            )
            .unwrap()
            .get(0);
        let exact = if held_set { " AND (SELECT coalesce(bool_and(exact), true) FROM pgqueue.held_set)" } else { "" };
        let sql = format!("SELECT coalesce(bool_or(tracked), false){exact} FROM pgqueue.queue_depth WHERE queue = $1");
        let waited = Instant::now();
        while !c.query_one(&sql, &[&queue]).unwrap().get::<_, bool>(0) {
            assert!(waited.elapsed() < Duration::from_secs(60), "a tick checks the queue's hints");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Adds `n` messages (visible after `delay`) in 10,000-message statements.
    fn fill(&self, c: &mut Client, system: System, n: i64, delay: &str) {
        let mut left = n;
        while left > 0 {
            let chunk = left.min(10_000);
            let sql = match system {
                System::Pgqueue => format!(
                    "SELECT count(*) FROM pgqueue.pgq_send_batch('{QUEUE}',
                        (SELECT array_agg(jsonb_build_object('job', g, 'pad', 'xxxxxxxxxxxxxxxxxxxxxxxx')) FROM generate_series(1, $1::int) g),
                        delay => '{delay}')"
                ),
                System::Baseline => format!(
                    "INSERT INTO bench_baseline.jobs (queue, vt, payload)
                     SELECT '{QUEUE}', now() + '{delay}', jsonb_build_object('job', g, 'pad', 'xxxxxxxxxxxxxxxxxxxxxxxx')
                       FROM generate_series(1, $1::int) g"
                ),
            };
            c.execute(&sql, &[&(chunk as i32)]).unwrap();
            left -= chunk;
        }
    }

    /// Claims `n` messages for an hour (they stay in flight), oldest first.
    fn hold(&self, c: &mut Client, system: System, n: i64) {
        match system {
            System::Pgqueue => {
                let mut left = n;
                while left > 0 {
                    let chunk = left.min(1000) as i32;
                    c.execute(&format!("SELECT count(*) FROM pgqueue.pgq_claim('{QUEUE}', $1, '1 hour')"), &[&chunk])
                        .unwrap();
                    left -= i64::from(chunk);
                }
            }
            System::Baseline => {
                c.execute(
                    "UPDATE bench_baseline.jobs SET vt = now() + interval '1 hour', read_ct = read_ct + 1
                      WHERE id IN (SELECT id FROM bench_baseline.jobs WHERE vt <= now() ORDER BY id LIMIT $1)",
                    &[&n],
                )
                .unwrap();
            }
        }
    }

    fn claim_sql(system: System) -> &'static str {
        match system {
            System::Pgqueue => "SELECT msg_id, claim_token FROM pgqueue.pgq_claim('bench', $1::int)",
            System::Baseline => {
                "WITH next AS (
                     SELECT id FROM bench_baseline.jobs WHERE queue = 'bench' AND vt <= now()
                      ORDER BY id LIMIT $1::int FOR UPDATE SKIP LOCKED)
                 UPDATE bench_baseline.jobs j SET vt = now() + interval '30 s', read_ct = read_ct + 1
                   FROM next WHERE j.id = next.id
                 RETURNING j.id, NULL::uuid"
            }
        }
    }

    /// Claims up to `qty`: their ids and (pgqueue's) claim tokens.
    fn claim(c: &mut Client, system: System, qty: i32) -> (Vec<i64>, Vec<Option<Uuid>>) {
        let rows = c.query(Self::claim_sql(system), &[&qty]).unwrap();
        rows.iter().map(|r| (r.get::<_, i64>(0), r.get::<_, Option<Uuid>>(1))).unzip()
    }

    /// Acks what one claim returned (a batch ack).
    fn ack(c: &mut Client, system: System, ids: &[i64], tokens: &[Option<Uuid>]) {
        match system {
            System::Pgqueue => {
                c.execute("SELECT count(*) FROM pgqueue.pgq_ack($1::bigint[], $2::uuid[])", &[&ids, &tokens]).unwrap();
            }
            System::Baseline => {
                c.execute("DELETE FROM bench_baseline.jobs WHERE id = ANY ($1)", &[&ids]).unwrap();
            }
        }
    }

    /// Claims up to `qty` and acks them. Returns how many.
    fn claim_and_ack(c: &mut Client, system: System, qty: i32) -> usize {
        let (ids, tokens) = Self::claim(c, system, qty);
        if !ids.is_empty() {
            Self::ack(c, system, &ids, &tokens);
        }
        ids.len()
    }

    /// Switches the background workers on or off (and gives them a moment to notice).
    fn worker(c: &mut Client, on: bool) {
        let sql = if on { "ALTER SYSTEM RESET pgqueue.enabled" } else { "ALTER SYSTEM SET pgqueue.enabled = off" };
        c.batch_execute(sql).unwrap();
        c.batch_execute("SELECT pg_reload_conf()").unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        if !on {
            // A tick under way finishes all its steps (a prune among them): until none ticks.
            let last = |c: &mut Client| -> Option<String> {
                c.query_one("SELECT last_tick_at::text FROM pgqueue.worker_state", &[]).unwrap().get(0)
            };
            for _ in 0..20 {
                let before = last(c);
                std::thread::sleep(Duration::from_millis(1500));
                if last(c) == before {
                    break;
                }
            }
        }
    }

    fn vacuum(c: &mut Client) {
        // One statement each: VACUUM refuses to run in the implicit transaction of a batch.
        let table = System::Pgqueue.table(c);
        c.batch_execute(&format!("VACUUM (ANALYZE) {table}")).unwrap();
        c.batch_execute("VACUUM (ANALYZE) bench_baseline.jobs").unwrap();
    }

    /// Claim latency and buffers against the number of rows in flight (and delayed).
    fn flatness(&self) -> Vec<FlatPoint> {
        let mut points = vec![];
        let mut c = self.connect();
        let mut cases: Vec<(i64, i64)> = self.sizes.depths.iter().map(|&d| (d, 0)).collect();
        cases.push((*self.sizes.depths.last().unwrap(), self.sizes.delayed));
        for (depth, delayed) in cases {
            for system in [System::Pgqueue, System::Baseline] {
                self.say(&format!("flatness: {} with {depth} in flight, {delayed} delayed", system.name()));
                self.reset(&mut c);
                // Delayed and in-flight rows first, so they sit ahead of the claimable ones.
                self.fill(&mut c, system, delayed, "1 hour");
                self.fill(&mut c, system, depth, "0");
                self.hold(&mut c, system, depth);
                self.fill(&mut c, system, 1_000, "0");
                Self::vacuum(&mut c);
                let mut hist = Histogram::<u64>::new(3).unwrap();
                for i in 0..self.sizes.claims_per_point + 20 {
                    let mut tx = c.transaction().unwrap();
                    let start = Instant::now();
                    let n = tx.query(Self::claim_sql(system), &[&1i32]).unwrap().len();
                    let took = start.elapsed();
                    tx.rollback().unwrap();
                    assert_eq!(n, 1, "a claimable message is there");
                    if i >= 20 {
                        hist.record(took.as_micros() as u64).unwrap();
                    }
                }
                let buffers = self.claim_buffers(&mut c, system);
                points.push(FlatPoint {
                    system: system.name().into(),
                    in_flight: depth,
                    delayed,
                    p50_us: hist.value_at_quantile(0.5),
                    p99_us: hist.value_at_quantile(0.99),
                    buffers,
                });
            }
        }
        points
    }

    /// Shared buffers one claim touches (EXPLAIN ANALYZE BUFFERS; for pgqueue the function
    /// scan's figure includes the statements inside the function).
    fn claim_buffers(&self, c: &mut Client, system: System) -> i64 {
        let mut tx = c.transaction().unwrap();
        let sql = match system {
            System::Pgqueue => "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM pgqueue.pgq_claim('bench', 1)",
            System::Baseline => {
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
                 WITH next AS (
                     SELECT id FROM bench_baseline.jobs WHERE queue = 'bench' AND vt <= now()
                      ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
                 UPDATE bench_baseline.jobs j SET vt = now() + interval '30 s', read_ct = read_ct + 1
                   FROM next WHERE j.id = next.id RETURNING j.id"
            }
        };
        let plan: Value = tx.query_one(sql, &[]).unwrap().get(0);
        tx.rollback().unwrap();
        let top = &plan[0]["Plan"];
        top["Shared Hit Blocks"].as_i64().unwrap_or(0) + top["Shared Read Blocks"].as_i64().unwrap_or(0)
    }

    /// Jobs per second with N consumers doing claim + ack, with rows in flight: two calls
    /// per round (claim, then ack) and one (ack + claim in one statement). With `repeat`
    /// above 1 the sweep runs that many times, every other one from the largest count down
    /// (so that a drift of the machine does not favour one end), and each point reports the
    /// median of its runs.
    fn throughput(&self) -> Vec<ThroughputPoint> {
        let mut c = self.connect();
        let repeat = self.sizes.repeat.max(1);
        let mut runs: Vec<Vec<ThroughputPoint>> = vec![];
        for run in 0..repeat {
            let mut counts = self.sizes.consumers.clone();
            if run % 2 == 1 {
                counts.reverse();
            }
            let mut points = vec![];
            for consumers in counts {
                for mode in [Mode::TwoCall, Mode::OneCall] {
                    for qty in [1i32, 32] {
                        for system in [System::Pgqueue, System::Baseline] {
                            self.say(&format!(
                                "throughput{}: {} {} with {consumers} consumers, qty {qty}",
                                if repeat > 1 { format!(" (run {} of {repeat})", run + 1) } else { String::new() },
                                system.name(),
                                mode.name()
                            ));
                            self.reset(&mut c);
                            self.fill(&mut c, system, self.sizes.in_flight, "0");
                            self.hold(&mut c, system, self.sizes.in_flight);
                            // Enough work for the whole run (single-job claims drain far slower).
                            let rate =
                                if qty == 1 { self.sizes.work_per_second / 4.0 } else { self.sizes.work_per_second };
                            let secs = (self.sizes.warm_for + self.sizes.run_for).as_secs_f64();
                            self.fill(&mut c, system, (secs * rate) as i64 + 1_000, "0");
                            Self::vacuum(&mut c);
                            let (jobs, seconds, p99) = self.consume(consumers, system, mode, qty);
                            points.push(ThroughputPoint {
                                system: system.name().into(),
                                mode: mode.name().into(),
                                consumers,
                                qty,
                                jobs_per_s: jobs as f64 / seconds,
                                p99_ms: p99,
                                of_pgbench: None,
                                of_best: 0.0,
                                runs: vec![],
                            });
                        }
                    }
                }
                points.push(ThroughputPoint {
                    system: "pgbench -N".into(),
                    mode: String::new(),
                    consumers,
                    qty: 0,
                    jobs_per_s: self.pgbench(consumers),
                    p99_ms: 0.0,
                    of_pgbench: None,
                    of_best: 0.0,
                    runs: vec![],
                });
            }
            runs.push(points);
        }
        let mut points = Self::medians(runs);
        let all = points.clone();
        for p in &mut points {
            let tps = all.iter().find(|q| q.system == "pgbench -N" && q.consumers == p.consumers).map(|q| q.jobs_per_s);
            if p.system != "pgbench -N" {
                p.of_pgbench = tps.filter(|&tps| tps > 0.0).map(|tps| p.jobs_per_s / tps);
            }
            let best = all
                .iter()
                .filter(|q| (&q.system, &q.mode, q.qty) == (&p.system, &p.mode, p.qty))
                .map(|q| q.jobs_per_s)
                .fold(0.0, f64::max);
            p.of_best = if best > 0.0 { p.jobs_per_s / best } else { 0.0 };
        }
        points
    }

    /// One point per (system, mode, qty, consumers), in the first run's order, with the
    /// median of its runs' jobs/s and p99 (the upper median for an even count); a single run
    /// is returned as it is.
    fn medians(runs: Vec<Vec<ThroughputPoint>>) -> Vec<ThroughputPoint> {
        let mut runs = runs.into_iter();
        let mut points = runs.next().unwrap_or_default();
        let rest: Vec<Vec<ThroughputPoint>> = runs.collect();
        if rest.is_empty() {
            return points;
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        for p in &mut points {
            let same = |q: &&ThroughputPoint| {
                (&q.system, &q.mode, q.qty, q.consumers) == (&p.system, &p.mode, p.qty, p.consumers)
            };
            let others: Vec<&ThroughputPoint> = rest.iter().filter_map(|r| r.iter().find(same)).collect();
            p.runs = std::iter::once(p.jobs_per_s).chain(others.iter().map(|q| q.jobs_per_s)).collect();
            p.p99_ms = median(std::iter::once(p.p99_ms).chain(others.iter().map(|q| q.p99_ms)).collect());
            p.jobs_per_s = median(p.runs.clone());
        }
        points
    }

    /// Runs `consumers` threads of claim + ack for `warm_for`, then for `run_for` measured
    /// (or until the queue is empty); (jobs, seconds measured, p99 ms of one round), counting
    /// only rounds that end in the measured part. Two-call: claim, then ack (each sent as
    /// text, as before); one-call: one call acks the previous round's claims and claims the
    /// next (sent the same way); a job counts once its ack has committed.
    fn consume(&self, consumers: usize, system: System, mode: Mode, qty: i32) -> (u64, f64, f64) {
        let (warm_for, run_for) = (self.sizes.warm_for, self.sizes.run_for);
        let jobs = Arc::new(AtomicU64::new(0));
        let hist = Arc::new(Mutex::new(Histogram::<u64>::new(3).unwrap()));
        let start = Arc::new(Barrier::new(consumers + 1));
        let threads: Vec<_> = (0..consumers)
            .map(|_| {
                let (jobs, hist, start) = (jobs.clone(), hist.clone(), start.clone());
                let mut c = self.connect();
                let mut rounds = Rounds::new(&mut c, system, mode, qty, Duration::ZERO, false);
                std::thread::spawn(move || {
                    let mut mine = Histogram::<u64>::new(3).unwrap();
                    start.wait();
                    let from = Instant::now() + warm_for;
                    let until = from + run_for;
                    while Instant::now() < until {
                        let t = Instant::now();
                        let (done, more) = match mode {
                            Mode::TwoCall => {
                                let n = Self::claim_and_ack(&mut c, system, qty);
                                (n, n > 0)
                            }
                            Mode::OneCall => {
                                let round = rounds.round(&mut c);
                                (round.acked, round.claimed > 0)
                            }
                        };
                        let measured = Instant::now() >= from;
                        if measured {
                            jobs.fetch_add(done as u64, Ordering::Relaxed);
                        }
                        if !more {
                            break;
                        }
                        if measured {
                            mine.record(t.elapsed().as_micros() as u64).unwrap();
                        }
                    }
                    hist.lock().unwrap().add(&mine).unwrap();
                })
            })
            .collect();
        start.wait();
        let began = Instant::now();
        for t in threads {
            t.join().unwrap();
        }
        let seconds = began.elapsed().saturating_sub(warm_for).as_secs_f64().max(1e-3);
        let p99 = hist.lock().unwrap().value_at_quantile(0.99) as f64 / 1000.0;
        (jobs.load(Ordering::Relaxed), seconds, p99)
    }

    /// The qty a harness consumer claims with `consumers` of them: the configured qty, or
    /// less so that consumers x qty does not exceed the ready depth.
    pub fn harness_qty(&self, consumers: usize) -> i32 {
        let s = &self.sizes;
        s.harness_qty.min((s.harness_depth / consumers.max(1) as i64).max(1) as i32)
    }

    /// Like a third-party harness: one producer keeps ~harness_depth messages ready (sending
    /// batches), N consumers claim batches with pgq_ack_claim (the baseline: its one-statement
    /// delete-ack + claim), handle each job in turn (a sleep) and ack them with the next call.
    fn harness(&self) -> Vec<HarnessPoint> {
        let s = &self.sizes;
        let mut c = self.connect();
        let mut points = vec![];
        for &consumers in &s.harness_consumers {
            let qty = self.harness_qty(consumers);
            for (mode, system) in s.harness_modes.iter().flat_map(|&m| [(m, System::Pgqueue), (m, System::Baseline)]) {
                self.say(&format!("harness: {} {} with {consumers} consumers, qty {qty}", system.name(), mode.name()));
                self.reset(&mut c);
                Self::vacuum(&mut c);
                let spec = FleetSpec {
                    system,
                    mode,
                    consumers,
                    qty,
                    handler: s.harness_handler,
                    wait: s.harness_wait,
                    poll: s.harness_poll,
                    depth: s.harness_depth,
                    batch: s.harness_batch,
                    rate: None,
                };
                let fleet = Fleet::start(self, spec);
                std::thread::sleep(s.harness_warmup);
                let (writes0, wal0) = (Self::row_writes(&mut c, system), Self::wal_at(&mut c));
                let from = fleet.measure(true);
                let mut depths = vec![];
                while from.at.elapsed() < s.harness_for {
                    depths.push(fleet.ready());
                    std::thread::sleep(Duration::from_millis(100).min(s.harness_for));
                }
                let to = fleet.measure(false);
                let wal1 = Self::wal_at(&mut c);
                // The last transactions' counts reach pg_stat_user_tables within a second.
                std::thread::sleep(Duration::from_millis(1100));
                let writes1 = Self::row_writes(&mut c, system);
                let dead_rows = Self::dead_rows(&mut c, system);
                let (waits, calls) = fleet.stop();
                depths.sort_unstable();
                let seconds = to.at.duration_since(from.at).as_secs_f64();
                let jobs = (to.acked - from.acked).max(1) as f64;
                let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
                points.push(HarnessPoint {
                    system: system.name().into(),
                    mode: mode.name().into(),
                    consumers,
                    qty,
                    depth: s.harness_depth,
                    batch: s.harness_batch,
                    handler_ms: s.harness_handler.as_secs_f64() * 1000.0,
                    seconds,
                    jobs_per_s: (to.acked - from.acked) as f64 / seconds,
                    handler_bound: consumers as f64 / s.harness_handler.as_secs_f64().max(1e-9),
                    sent_per_s: (to.sent - from.sent) as f64 / seconds,
                    send_call_ms: (to.send_us - from.send_us) as f64 / (to.sends - from.sends).max(1) as f64 / 1000.0,
                    empty_calls: to.empty_calls - from.empty_calls,
                    calls: to.calls - from.calls,
                    empty_wait_ms: match system {
                        System::Pgqueue => s.harness_wait,
                        System::Baseline => s.harness_poll,
                    }
                    .as_secs_f64()
                        * 1000.0,
                    pickup_p50_ms: ms(&waits, 0.5),
                    pickup_p95_ms: ms(&waits, 0.95),
                    pickup_p99_ms: ms(&waits, 0.99),
                    call_p99_ms: ms(&calls, 0.99),
                    depth_p50: depths.get(depths.len() / 2).copied().unwrap_or(0),
                    depth_min: depths.first().copied().unwrap_or(0),
                    row_writes_per_job: (writes1 - writes0) as f64 / jobs,
                    wal_bytes_per_job: (wal1 - wal0) as f64 / jobs,
                    dead_rows,
                });
            }
        }
        points
    }

    /// The WAL position (insert LSN) as bytes.
    fn wal_at(c: &mut Client) -> i64 {
        c.query_one("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint", &[]).unwrap().get(0)
    }

    /// The schema of a system's tables.
    fn schema(system: System) -> &'static str {
        match system {
            System::Pgqueue => "pgqueue",
            System::Baseline => "bench_baseline",
        }
    }

    /// Rows inserted, updated and deleted so far in a system's tables.
    fn row_writes(c: &mut Client, system: System) -> i64 {
        c.query_one(
            "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::bigint FROM pg_stat_user_tables
              WHERE schemaname = $1",
            &[&Self::schema(system)],
        )
        .unwrap()
        .get(0)
    }

    /// Dead rows now in a system's tables.
    fn dead_rows(c: &mut Client, system: System) -> i64 {
        c.query_one(
            "SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables WHERE schemaname = $1",
            &[&Self::schema(system)],
        )
        .unwrap()
        .get(0)
    }

    /// pg_stat_wal's (records, full-page images), where it has them.
    fn wal_stats(c: &mut Client) -> Option<(i64, i64)> {
        c.query_one("SELECT wal_records, wal_fpi FROM pg_stat_wal", &[]).ok().map(|r| (r.get(0), r.get(1)))
    }

    /// The hot table's size with indexes and TOAST; (that, its heap, each index).
    fn hot_sizes(c: &mut Client, system: System) -> (i64, i64, Vec<RelSize>) {
        let table = system.table(c);
        let row = c
            .query_one(&format!("SELECT pg_total_relation_size('{table}'), pg_relation_size('{table}')"), &[])
            .unwrap();
        let indexes = c
            .query(
                &format!(
                    "SELECT c.relname::text, pg_relation_size(c.oid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                      WHERE i.indrelid = '{table}'::regclass ORDER BY c.relname"
                ),
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| RelSize { name: r.get(0), bytes: r.get(1) })
            .collect();
        (row.get(0), row.get(1), indexes)
    }

    /// The queue's history partitions with their indexes.
    fn history_size(c: &mut Client) -> i64 {
        c.query_one(
            &format!(
                "SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint
                   FROM pg_partition_tree(to_regclass('pgqueue.history_{QUEUE}')) WHERE isleaf"
            ),
            &[],
        )
        .unwrap()
        .get(0)
    }

    /// WAL bytes per job and the hot table's size with a producer keeping the depth and
    /// consumers at full speed (no handler), two calls and one call per round.
    fn bytes(&self) -> Vec<BytesPoint> {
        let s = &self.sizes;
        let mut c = self.connect();
        let consumers = s.bytes_consumers;
        let mut points = vec![];
        for mode in [Mode::TwoCall, Mode::OneCall] {
            for qty in [1i32, 32] {
                for system in [System::Pgqueue, System::Baseline] {
                    self.say(&format!(
                        "bytes: {} {} with {consumers} consumers, qty {qty}",
                        system.name(),
                        mode.name()
                    ));
                    self.reset(&mut c);
                    // A compact hot table (earlier scenarios leave its indexes large), then a
                    // checkpoint: no timed one falls in the run, and the full-page images
                    // after this one land in the warm-up.
                    let table = System::Pgqueue.table(&mut c);
                    c.batch_execute(&format!("VACUUM FULL {table}")).unwrap();
                    Self::vacuum(&mut c);
                    c.batch_execute("CHECKPOINT").unwrap();
                    let (w0, t0) = (Self::wal_at(&mut c), Instant::now());
                    std::thread::sleep(s.bytes_warmup);
                    let background_wal_per_s = (Self::wal_at(&mut c) - w0) as f64 / t0.elapsed().as_secs_f64();
                    let spec = FleetSpec {
                        system,
                        mode,
                        consumers,
                        qty,
                        handler: Duration::ZERO,
                        wait: s.harness_wait,
                        poll: s.harness_poll,
                        depth: s.harness_depth.max(consumers as i64 * i64::from(qty) * 2),
                        batch: s.harness_batch,
                        rate: None,
                    };
                    let fleet = Fleet::start(self, spec);
                    std::thread::sleep(s.bytes_warmup);
                    let (hot_bytes_start, _, _) = Self::hot_sizes(&mut c, system);
                    let history_bytes_start = (system == System::Pgqueue).then(|| Self::history_size(&mut c));
                    let stats0 = Self::wal_stats(&mut c);
                    let wal0 = Self::wal_at(&mut c);
                    let from = fleet.measure(true);
                    std::thread::sleep(s.bytes_for);
                    let to = fleet.measure(false);
                    let wal1 = Self::wal_at(&mut c);
                    let stats1 = Self::wal_stats(&mut c);
                    let (hot_bytes_end, heap_bytes, indexes) = Self::hot_sizes(&mut c, system);
                    let history_bytes_end = (system == System::Pgqueue).then(|| Self::history_size(&mut c));
                    fleet.stop();
                    let seconds = to.at.duration_since(from.at).as_secs_f64();
                    let jobs = to.acked - from.acked;
                    let per_job = |x: f64| x / jobs.max(1) as f64;
                    let wal_bytes = wal1 - wal0;
                    let stats = stats0.zip(stats1).map(|(a, b)| (b.0 - a.0, b.1 - a.1));
                    points.push(BytesPoint {
                        system: system.name().into(),
                        mode: mode.name().into(),
                        consumers,
                        qty,
                        seconds,
                        jobs,
                        sent: to.sent - from.sent,
                        jobs_per_s: jobs as f64 / seconds,
                        empty_calls: to.empty_calls - from.empty_calls,
                        calls: to.calls - from.calls,
                        wal_bytes,
                        wal_per_job: per_job(wal_bytes as f64),
                        background_wal_per_s,
                        wal_per_job_net: per_job(wal_bytes as f64 - background_wal_per_s * seconds),
                        wal_records_per_job: stats.map(|(records, _)| per_job(records as f64)),
                        wal_fpi: stats.map(|(_, fpi)| fpi),
                        hot_bytes_start,
                        hot_bytes_end,
                        heap_bytes,
                        indexes,
                        history_bytes_start,
                        history_bytes_end,
                    });
                }
            }
        }
        points
    }

    /// The issue-26 bloat check: each system's maximum rate (producer and consumers at full
    /// speed, no handler), then a long run with the producer held to a share of it, sampling
    /// the hot table's live and dead rows and size. Default autovacuum settings.
    fn bloat(&self) -> Vec<BloatRun> {
        let s = &self.sizes;
        let mut c = self.connect();
        let (consumers, qty) = (s.bloat_consumers, self.harness_qty(s.bloat_consumers));
        let mut runs = vec![];
        for system in [System::Pgqueue, System::Baseline] {
            let table = system.table(&mut c);
            let spec = FleetSpec {
                system,
                mode: Mode::OneCall,
                consumers,
                qty,
                handler: Duration::ZERO,
                wait: s.harness_wait,
                poll: s.harness_poll,
                depth: s.harness_depth,
                batch: s.harness_batch,
                rate: None,
            };
            let fresh = |c: &mut Client| {
                self.reset(c);
                c.batch_execute(&format!("VACUUM FULL {table}")).unwrap();
                Self::vacuum(c);
            };
            self.say(&format!("bloat: {} at full speed, {consumers} consumers, qty {qty}", system.name()));
            fresh(&mut c);
            let fleet = Fleet::start(self, spec);
            std::thread::sleep(s.harness_warmup);
            let from = fleet.measure(true);
            std::thread::sleep(s.bloat_calibrate);
            let to = fleet.measure(false);
            fleet.stop();
            let max = (to.acked - from.acked) as f64 / to.at.duration_since(from.at).as_secs_f64();
            let rate = (max * s.bloat_share).max(1.0);
            self.say(&format!("bloat: {} at {rate:.0} jobs/s for {:?}", system.name(), s.bloat_for));
            fresh(&mut c);
            let fleet = Fleet::start(self, FleetSpec { rate: Some(rate), ..spec });
            let start = Instant::now();
            let (mut last, mut samples) = (fleet.counts(), vec![]);
            while start.elapsed() < s.bloat_for {
                std::thread::sleep(s.bloat_every);
                let now = fleet.counts();
                let row = c
                    .query_one(
                        &format!(
                            "SELECT pg_stat_get_live_tuples(t), pg_stat_get_dead_tuples(t), pg_total_relation_size(t),
                                    pg_stat_get_autovacuum_count(t)
                               FROM (SELECT '{table}'::regclass AS t) x"
                        ),
                        &[],
                    )
                    .unwrap();
                samples.push(BloatSample {
                    at_s: start.elapsed().as_secs_f64(),
                    jobs_per_s: (now.acked - last.acked) as f64 / now.at.duration_since(last.at).as_secs_f64(),
                    live: row.get(0),
                    dead: row.get(1),
                    bytes: row.get(2),
                    autovacuums: row.get(3),
                });
                last = now;
            }
            fleet.stop();
            runs.push(BloatRun {
                system: system.name().into(),
                consumers,
                qty,
                max_jobs_per_s: max,
                rate,
                depth: s.harness_depth,
                samples,
            });
        }
        runs
    }

    /// pgbench's simple-update (-N) tps at the same client count: the commit-rate ceiling.
    fn pgbench(&self, clients: usize) -> f64 {
        let mut c = self.connect();
        let bindir: String = c
            .query_one("SELECT setting FROM pg_config() WHERE name = 'BINDIR'", &[])
            .map(|r| r.get(0))
            .unwrap_or_default();
        let pgbench = std::path::Path::new(&bindir).join("pgbench");
        let initialized: bool =
            c.query_one("SELECT to_regclass('public.pgbench_accounts') IS NOT NULL", &[]).unwrap().get(0);
        if !initialized {
            self.say("pgbench: initializing");
            let ok = std::process::Command::new(&pgbench)
                .args(["-i", "-s", &self.sizes.pgbench_scale.to_string(), "-q", &self.dsn])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            if !ok {
                return 0.0;
            }
        }
        let (warm, run) = (self.sizes.warm_for.as_secs(), self.sizes.run_for.as_secs().max(1));
        let out = std::process::Command::new(&pgbench)
            .args(["-N", "-c", &clients.to_string(), "-j", &clients.min(4).to_string()])
            .args(["-T", &(warm + run).to_string(), &self.dsn])
            .args(if warm > 0 { &["-P", "1"][..] } else { &[] })
            .output();
        let Ok(out) = out else { return 0.0 };
        if warm == 0 {
            return String::from_utf8_lossy(&out.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("tps = ").and_then(|rest| rest.split_whitespace().next()?.parse().ok()))
                .unwrap_or(0.0);
        }
        // Warmed up: the mean of the progress reports (one per second, on stderr) after it.
        let measured: Vec<f64> = String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter_map(|l| {
                let (at, rest) = l.strip_prefix("progress: ")?.split_once(" s, ")?;
                let tps: f64 = rest.split_once(" tps")?.0.parse().ok()?;
                (at.parse::<f64>().ok()? > warm as f64).then_some(tps)
            })
            .collect();
        if measured.is_empty() { 0.0 } else { measured.iter().sum::<f64>() / measured.len() as f64 }
    }

    /// A fleet dies holding `rescue_claims` claims; the background worker alone drains them.
    fn rescue(&self) -> Rescue {
        let mut c = self.connect();
        self.reset(&mut c);
        let n = self.sizes.rescue_claims;
        self.say(&format!("rescue: {n} claims to abandon"));
        self.fill(&mut c, System::Pgqueue, n, "0");
        self.hold(&mut c, System::Pgqueue, n);
        c.batch_execute(
            "SELECT pgqueue.pgq_create_queue('bench_live');
             SELECT pgqueue.pgq_send_batch('bench_live', (SELECT array_agg('{}'::jsonb) FROM generate_series(1, 10000)));",
        )
        .unwrap();
        let table = System::Pgqueue.table(&mut c);
        c.batch_execute(&format!("VACUUM (ANALYZE) {table}")).unwrap();
        let live = |stop: Arc<AtomicBool>, dsn: String| {
            std::thread::spawn(move || {
                let mut c = Client::connect(&dsn, NoTls).unwrap();
                let mut hist = Histogram::<u64>::new(3).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let row = c.query_opt("SELECT msg_id, claim_token FROM pgqueue.pgq_claim('bench_live')", &[]);
                    if let Ok(Some(row)) = row {
                        let (id, token): (i64, Uuid) = (row.get(0), row.get(1));
                        c.execute("SELECT pgqueue.pgq_nack($1, $2, retry_in => '0 s')", &[&id, &token]).unwrap();
                    }
                    hist.record(t.elapsed().as_micros() as u64).unwrap();
                }
                hist.value_at_quantile(0.99) as f64 / 1000.0
            })
        };
        let stop = Arc::new(AtomicBool::new(false));
        let idle = live(stop.clone(), self.dsn.clone());
        std::thread::sleep(Duration::from_secs(2).min(self.sizes.run_for * 4));
        stop.store(true, Ordering::Relaxed);
        let live_p99_idle_ms = idle.join().unwrap();

        let stop = Arc::new(AtomicBool::new(false));
        let during = live(stop.clone(), self.dsn.clone());
        self.say("rescue: abandoning (leases expire now); the worker drains");
        // Progress from the worker's own counter: polling count(*) over a million rows would
        // take a core away from the worker being measured.
        let rescued = |c: &mut Client| -> i64 {
            c.query_one("SELECT rescue_rows FROM pgqueue.worker_stats", &[]).unwrap().get(0)
        };
        // Right after CREATE EXTENSION the database has no worker yet: not its launch to time.
        let waited = Instant::now();
        while c.query_one("SELECT ticks FROM pgqueue.worker_stats", &[]).unwrap().get::<_, i64>(0) == 0 {
            assert!(waited.elapsed() < Duration::from_secs(60), "the worker ticks");
            std::thread::sleep(Duration::from_millis(100));
        }
        let before = rescued(&mut c);
        // The leases are aged around the API: told nothing, the worker would find them only at
        // its forced pass (the prune cadence, a minute by default). What a renewal tells it at
        // commit (the earliest lease end) tells it here that they have ended.
        let mut tx = c.transaction().unwrap();
        let table = System::Pgqueue.table(&mut tx);
        tx.execute(
            &format!(
                "UPDATE {table} SET lease_expires_at = now() - interval '1 s' WHERE queue = 'bench' AND state = 'claimed'"
            ),
            &[],
        )
        .unwrap();
        // With pgqueue.claim_ledger on (0.24.0), a claim leaves its row 'ready' and its lease
        // in its ledger row.
        let ledger_leases: bool = tx
            .query_one(
                "SELECT EXISTS (SELECT FROM pg_attribute
                                 WHERE attrelid = to_regclass('pgqueue.claims') AND attname = 'lease_expires_at')",
                &[],
            )
            .unwrap()
            .get(0);
        if ledger_leases {
            tx.execute(
                "UPDATE pgqueue.claims SET lease_expires_at = now() - interval '1 s' WHERE queue = 'bench'",
                &[],
            )
            .unwrap();
        }
        tx.execute("SELECT pgqueue._renewed(now() - interval '1 s')", &[]).unwrap();
        tx.commit().unwrap();
        let start = Instant::now();
        let mut said = Instant::now();
        loop {
            let left = n - (rescued(&mut c) - before);
            if left <= 0 {
                break;
            }
            if said.elapsed() >= Duration::from_secs(5) {
                self.say(&format!("rescue: {left} left after {:.0?}", start.elapsed()));
                said = Instant::now();
            }
            assert!(start.elapsed() < Duration::from_secs(1800), "the backlog drains (is the worker running?)");
            std::thread::sleep(Duration::from_millis(20));
        }
        let seconds = start.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let live_p99_draining_ms = during.join().unwrap();
        Rescue { claims: n, seconds, claims_per_s: n as f64 / seconds, live_p99_idle_ms, live_p99_draining_ms }
    }

    /// Removes `prune_rows` completed messages past retention while consumers work.
    fn prune(&self) -> Prune {
        let mut c = self.connect();
        self.reset(&mut c);
        // The worker would prune the old partition by itself: this measures one pgq_prune call.
        Self::worker(&mut c, false);
        let n = self.sizes.prune_rows;
        self.say(&format!("prune: {n} completed messages five days old"));
        c.batch_execute(&format!(
            "SELECT pgqueue._ensure_history_day('{QUEUE}', current_date - 5);
             INSERT INTO pgqueue.history (msg_id, queue, outcome, priority, attempt, payload, enqueued_at, finished_at)
             SELECT -g, '{QUEUE}', 'completed', 0, 1, jsonb_build_object('job', g, 'pad', 'xxxxxxxxxxxxxxxxxxxxxxxx'),
                    now() - interval '6 days', (current_date - 5) + interval '1 hour'
               FROM generate_series(1, {n}) g;"
        ))
        .unwrap();
        self.fill(&mut c, System::Pgqueue, n.min(50_000), "0");
        // Five days old: long since written out by checkpoints.
        c.batch_execute("CHECKPOINT").unwrap();
        let size = |c: &mut Client| -> i64 {
            c.query_one(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
                  WHERE c.relname LIKE 'history\\_bench$%' AND c.relkind = 'r'",
                &[],
            )
            .unwrap()
            .get(0)
        };
        let history_bytes_before = size(&mut c);
        let lock_timeout_ms: i64 = c
            .query_one("SELECT setting::bigint FROM pg_settings WHERE name = 'pgqueue.prune_lock_timeout'", &[])
            .unwrap()
            .get(0);
        // Claimers acking into the same queue's history while the prune runs; each round's
        // start and duration (µs since `base`).
        let stop = Arc::new(AtomicBool::new(false));
        let base = Instant::now();
        let mut claimer_pids = vec![];
        let claimers: Vec<_> = (0..2)
            .map(|_| {
                let stop = stop.clone();
                let mut c = self.connect();
                claimer_pids.push(c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get::<_, i32>(0));
                std::thread::spawn(move || {
                    let mut rounds: Vec<(u64, u64)> = vec![];
                    while !stop.load(Ordering::Relaxed) {
                        let t = Instant::now();
                        Self::claim_and_ack(&mut c, System::Pgqueue, 1);
                        rounds.push((t.duration_since(base).as_micros() as u64, t.elapsed().as_micros() as u64));
                    }
                    rounds
                })
            })
            .collect();
        // Backends waiting on a lock, sampled from a connection of their own.
        let sampler = {
            let (stop, every, mut s) = (stop.clone(), self.sizes.lock_sample_every, self.connect());
            let sample = s
                .prepare(
                    "SELECT l.pid, (extract(epoch FROM clock_timestamp() - l.waitstart) * 1000)::float8,
                            l.locktype || ' ' || l.mode || coalesce(' on ' || l.relation::regclass::text, '')
                       FROM pg_locks l WHERE NOT l.granted AND l.waitstart IS NOT NULL",
                )
                .unwrap();
            std::thread::spawn(move || {
                let (mut waits, mut samples): (Vec<(u64, i32, f64, String)>, u64) = (vec![], 0);
                while !stop.load(Ordering::Relaxed) {
                    let at = base.elapsed().as_micros() as u64;
                    for r in s.query(&sample, &[]).unwrap() {
                        waits.push((at, r.get(0), r.get(1), r.get(2)));
                    }
                    samples += 1;
                    std::thread::sleep(every);
                }
                (waits, samples)
            })
        };
        std::thread::sleep(Duration::from_millis(200));
        let idle_from = base.elapsed().as_micros() as u64;
        std::thread::sleep(self.sizes.prune_idle_for);
        let idle_to = base.elapsed().as_micros() as u64;
        let prune_pid: i32 = c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
        // A drop that meets an ack's lock for longer than the lock timeout is "blocked" and
        // changes nothing; the worker would try again at its next prune. So does this, at
        // once (without the back-off that repeated blocks earn), and times the call that pruned.
        let (mut rows, mut seconds, mut blocked) = (vec![], 0.0, 0);
        let prune_from = base.elapsed().as_micros() as u64;
        for _ in 0..20 {
            let start = Instant::now();
            rows = c.query(&format!("SELECT outcome, rows FROM pgqueue.pgq_prune('{QUEUE}')"), &[]).unwrap();
            seconds = start.elapsed().as_secs_f64();
            if !rows.iter().any(|r| r.get::<_, String>(0) == "blocked") {
                break;
            }
            blocked += 1;
            c.batch_execute(&format!("DELETE FROM pgqueue.prune_state WHERE queue = '{QUEUE}'")).unwrap();
        }
        let prune_to = base.elapsed().as_micros() as u64;
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, Ordering::Relaxed);
        let rounds: Vec<(u64, u64)> = claimers.into_iter().flat_map(|t| t.join().unwrap()).collect();
        let (waits, lock_samples) = sampler.join().unwrap();
        Self::worker(&mut c, true);
        let mut idle = Histogram::<u64>::new(3).unwrap();
        for (_, took) in rounds.iter().filter(|(at, _)| (idle_from..idle_to).contains(at)) {
            idle.record(*took).unwrap();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        // As before: the longest round from the prune on (and 200 ms after it).
        let longest = rounds.iter().filter(|(at, _)| *at >= idle_to).map(|r| r.1).max().unwrap_or(0);
        let during = rounds
            .iter()
            .filter(|(at, took)| *at <= prune_to && at + took >= prune_from)
            .map(|r| r.1)
            .max()
            .unwrap_or(0);
        let idle_p99_ms = ms(idle.value_at_quantile(0.99));
        let window = (prune_to - prune_from).max(1);
        let mut idle_windows: Vec<u64> = (0..)
            .map(|k| idle_from + k * window)
            .take_while(|from| from + window <= idle_to)
            .map(|from| {
                rounds
                    .iter()
                    .filter(|(at, took)| (idle_from..idle_to).contains(at) && *at <= from + window && at + took >= from)
                    .map(|r| r.1)
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        idle_windows.sort_unstable();
        let idle_window_median = idle_windows.get(idle_windows.len() / 2).copied().unwrap_or(0);
        // A wait ongoing when the prune returned ends with it: samples a little after count.
        let slack = 2 * self.sizes.lock_sample_every.as_micros() as u64;
        let longest_wait = |from: u64, to: u64, pids: &[i32]| {
            waits
                .iter()
                .filter(|(at, pid, _, _)| (from..=to).contains(at) && pids.contains(pid))
                .max_by(|a, b| a.2.total_cmp(&b.2))
                .map_or((0.0, String::new()), |w| (w.2, w.3.clone()))
        };
        let (lock_wait_consumers_ms, lock_wait_consumers_on) =
            longest_wait(prune_from, prune_to + slack, &claimer_pids);
        let outcome: String = rows.first().map(|r| r.get(0)).unwrap_or_default();
        let removed: i64 = rows.iter().map(|r| r.get::<_, i64>(1)).sum();
        Prune {
            rows: removed,
            seconds,
            rows_per_s: removed as f64 / seconds,
            outcome,
            blocked_attempts: blocked,
            longest_claim_ack_ms: ms(longest),
            lock_timeout_ms,
            history_bytes_before,
            history_bytes_after: size(&mut c),
            idle_seconds: ms(idle_to - idle_from) / 1000.0,
            idle_rounds: idle.len(),
            idle_p99_ms,
            longest_during_prune_ms: ms(during),
            during_vs_idle_p99: if idle_p99_ms > 0.0 { ms(during) / idle_p99_ms } else { 0.0 },
            idle_windows: idle_windows.len() as u32,
            idle_window_longest_median_ms: ms(idle_window_median),
            idle_window_longest_max_ms: ms(idle_windows.last().copied().unwrap_or(0)),
            idle_window_vs_idle_p99: if idle_p99_ms > 0.0 { ms(idle_window_median) / idle_p99_ms } else { 0.0 },
            lock_sample_ms: self.sizes.lock_sample_every.as_secs_f64() * 1000.0,
            lock_samples,
            lock_wait_consumers_ms,
            lock_wait_consumers_on,
            lock_wait_prune_ms: longest_wait(prune_from, prune_to + slack, &[prune_pid]).0,
            lock_wait_idle_ms: longest_wait(idle_from, idle_to, &claimer_pids).0,
        }
    }

    /// Lease renewals only: how many of the updates are HOT.
    fn renewals(&self) -> Vec<Renewals> {
        let mut c = self.connect();
        let mut out = vec![];
        for system in [System::Pgqueue, System::Baseline] {
            self.say(&format!("renewals: {}", system.name()));
            self.reset(&mut c);
            self.fill(&mut c, system, 1_000, "0");
            let held: Vec<(i64, Option<Uuid>)> =
                c.query(Self::claim_sql(system), &[&1000i32]).unwrap().iter().map(|r| (r.get(0), r.get(1))).collect();
            let table = system.table(&mut c);
            let renew = match system {
                System::Pgqueue => "SELECT pgqueue.pgq_renew($1::bigint, $2::uuid)",
                System::Baseline => {
                    "UPDATE bench_baseline.jobs SET vt = now() + interval '30 s' WHERE id = $1 AND $2::uuid IS NULL"
                }
            };
            let counters = |c: &mut Client| -> (i64, i64) {
                c.batch_execute("SELECT pg_stat_force_next_flush()").unwrap();
                let r = c
                    .query_one(
                        &format!("SELECT pg_stat_get_tuples_updated('{table}'::regclass), pg_stat_get_tuples_hot_updated('{table}'::regclass)"),
                        &[],
                    )
                    .unwrap();
                (r.get(0), r.get(1))
            };
            std::thread::sleep(Duration::from_millis(600));
            let (u0, h0) = counters(&mut c);
            let rounds = (self.sizes.renewals / held.len().max(1) as i64).max(1);
            for _ in 0..rounds {
                for (id, token) in &held {
                    c.execute(renew, &[id, token]).unwrap();
                }
            }
            std::thread::sleep(Duration::from_millis(600));
            let (u1, h1) = counters(&mut c);
            let (updates, hot_updates) = (u1 - u0, h1 - h0);
            out.push(Renewals {
                system: system.name().into(),
                updates,
                hot_updates,
                hot_ratio: hot_updates as f64 / updates.max(1) as f64,
            });
        }
        out
    }

    /// Batch enqueue against a plain multi-row INSERT into a table of the same shape.
    fn enqueue(&self) -> Vec<Enqueue> {
        let mut c = self.connect();
        let mut out = vec![];
        for per_call in [100usize, 1000] {
            let payloads: Vec<Value> =
                (0..per_call).map(|i| serde_json::json!({"job": i, "pad": "xxxxxxxxxxxxxxxxxxxxxxxx"})).collect();
            for method in ["pgq_send_batch", "INSERT"] {
                self.say(&format!("enqueue: {method} with {per_call} per call"));
                self.reset(&mut c);
                let sql = match method {
                    "pgq_send_batch" => "SELECT count(*) FROM pgqueue.pgq_send_batch('bench', $1)",
                    _ => {
                        "INSERT INTO bench_baseline.plain (queue, state, payload)
                         SELECT 'bench', 'ready', p FROM unnest($1::jsonb[]) p"
                    }
                };
                let calls = (self.sizes.enqueue_messages as usize / per_call).max(1);
                let start = Instant::now();
                for _ in 0..calls {
                    c.execute(sql, &[&payloads]).unwrap();
                }
                let secs = start.elapsed().as_secs_f64();
                out.push(Enqueue { method: method.into(), per_call, messages_per_s: (calls * per_call) as f64 / secs });
            }
        }
        out
    }

    /// The queue table's dead tuples and size now.
    fn table_state(c: &mut Client, system: System, when: &str) -> TableState {
        let table = system.table(c);
        let row = c
            .query_one(
                &format!("SELECT pg_stat_get_dead_tuples('{table}'::regclass), pg_total_relation_size('{table}')"),
                &[],
            )
            .unwrap();
        TableState { when: when.into(), dead_tuples: row.get(0), bytes: row.get(1) }
    }

    /// Claim + ack one job at a time while the xmin horizon is free, then held back, then
    /// free again; both ways of holding it (and the readers' control), for both systems.
    fn pinned(&self) -> Vec<PinnedRun> {
        let mut runs = vec![];
        for pin in [Pin::IdleXid, Pin::Readers { repeatable: true }, Pin::Readers { repeatable: false }] {
            for system in [System::Pgqueue, System::Baseline] {
                runs.push(self.pinned_run(system, pin));
            }
        }
        runs
    }

    fn pinned_run(&self, system: System, pin: Pin) -> PinnedRun {
        let s = &self.sizes;
        let [free, held, after] = s.pin_phases;
        let pin_name = match pin {
            Pin::IdleXid => "idle transaction holding an xid".to_string(),
            Pin::Readers { repeatable: true } => format!("{} REPEATABLE READ readers", s.pin_readers),
            Pin::Readers { repeatable: false } => {
                format!("{} READ COMMITTED readers (control: the same load, no pin)", s.pin_readers)
            }
        };
        self.say(&format!(
            "pinned: {} with {pin_name}: {free:?} free, {held:?} held, {after:?} released",
            system.name()
        ));
        let mut c = self.connect();
        self.reset(&mut c);
        self.fill(&mut c, system, s.pin_waiting, "0");
        Self::vacuum(&mut c);
        let bucket = s.pin_bucket.as_secs_f64();
        let buckets = |d: Duration| (d.as_secs_f64() / bucket).round() as usize;
        let (pinned_at, released_at, end) = (buckets(free), buckets(free + held), buckets(free + held + after));
        let (stop, release) = (AtomicBool::new(false), AtomicBool::new(false));
        let acked = AtomicI64::new(0);
        let mut tables = vec![];
        let clients: Vec<Client> = (0..s.pin_consumers).map(|_| self.connect()).collect();
        let mut producer = self.connect();
        let (recorded, (reader_scans, reader_secs)) = std::thread::scope(|scope| {
            let start = Instant::now();
            // Per consumer and bucket (by when the claim began): jobs, claim latency in µs.
            let consumers: Vec<_> = clients
                .into_iter()
                .map(|mut c| {
                    let (stop, acked) = (&stop, &acked);
                    scope.spawn(move || {
                        let mut mine: Vec<(u64, Histogram<u64>)> =
                            (0..end).map(|_| (0, Histogram::new(3).unwrap())).collect();
                        while !stop.load(Ordering::Relaxed) {
                            let t = Instant::now();
                            let (ids, tokens) = Self::claim(&mut c, system, 1);
                            let took = t.elapsed();
                            if ids.is_empty() {
                                std::thread::sleep(Duration::from_millis(1));
                                continue;
                            }
                            Self::ack(&mut c, system, &ids, &tokens);
                            acked.fetch_add(1, Ordering::Relaxed);
                            let at = (t.duration_since(start).as_secs_f64() / bucket) as usize;
                            if let Some((jobs, hist)) = mine.get_mut(at) {
                                *jobs += 1;
                                hist.record(took.as_micros() as u64).unwrap();
                            }
                        }
                        mine
                    })
                })
                .collect();
            // The producer tops the queue up to about `pin_waiting` messages.
            scope.spawn(|| {
                let mut sent = s.pin_waiting;
                while !stop.load(Ordering::Relaxed) {
                    let short = s.pin_waiting - (sent - acked.load(Ordering::Relaxed));
                    if short > 0 {
                        self.fill(&mut producer, system, short.min(1_000), "0");
                        sent += short.min(1_000);
                    } else {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            });
            let until = |at: Duration| std::thread::sleep(at.saturating_sub(start.elapsed()));
            until(free);
            tables.push(Self::table_state(&mut c, system, "before the pin"));
            let holder = scope.spawn(|| self.hold_horizon(pin, system, &release));
            until(free + held);
            tables.push(Self::table_state(&mut c, system, "end of the pin"));
            release.store(true, Ordering::Relaxed);
            let readers = holder.join().unwrap();
            until(free + held + after);
            stop.store(true, Ordering::Relaxed);
            let mut recorded: Vec<(u64, Histogram<u64>)> = (0..end).map(|_| (0, Histogram::new(3).unwrap())).collect();
            for consumer in consumers {
                for (all, (jobs, hist)) in recorded.iter_mut().zip(consumer.join().unwrap()) {
                    all.0 += jobs;
                    all.1.add(hist).unwrap();
                }
            }
            (recorded, readers)
        });
        tables.push(Self::table_state(&mut c, system, "after"));
        let window = |phase: &str, phase_start: usize, from: usize, to: usize| {
            let mut hist = Histogram::<u64>::new(3).unwrap();
            let mut jobs = 0;
            for (n, h) in &recorded[from..to] {
                jobs += n;
                hist.add(h).unwrap();
            }
            PinWindow {
                phase: phase.into(),
                from_s: (from - phase_start) as f64 * bucket,
                to_s: (to - phase_start) as f64 * bucket,
                jobs_per_s: jobs as f64 / ((to - from) as f64 * bucket),
                claim_p50_us: hist.value_at_quantile(0.5),
                claim_p99_us: hist.value_at_quantile(0.99),
            }
        };
        let per_window = buckets(s.pin_window).max(1);
        let mut windows = vec![window("unpinned", 0, 0, pinned_at)];
        for from in (pinned_at..released_at).step_by(per_window) {
            windows.push(window("pinned", pinned_at, from, (from + per_window).min(released_at)));
        }
        if released_at - pinned_at > per_window {
            windows.push(window("pinned (last)", pinned_at, released_at - per_window, released_at));
        }
        for from in released_at..end {
            windows.push(window("released", released_at, from, from + 1));
        }
        PinnedRun {
            system: system.name().into(),
            pin: pin_name,
            consumers: s.pin_consumers,
            waiting: s.pin_waiting,
            windows,
            tables,
            reader_scans,
            reader_scan_ms: if reader_scans == 0 { 0.0 } else { reader_secs * 1000.0 / reader_scans as f64 },
        }
    }

    /// Holds the xmin horizon back until `release`: a transaction that took an xid and sits
    /// idle, or readers that each keep one REPEATABLE READ snapshot and count the queue
    /// table's rows in a loop (READ COMMITTED: a new snapshot per count, the horizon moves).
    /// Returns the readers' scans and the seconds they took.
    fn hold_horizon(&self, pin: Pin, system: System, release: &AtomicBool) -> (u64, f64) {
        match pin {
            Pin::IdleXid => {
                let mut c = self.connect();
                c.batch_execute("BEGIN; SELECT txid_current()").unwrap();
                while !release.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                c.batch_execute("COMMIT").unwrap();
                (0, 0.0)
            }
            Pin::Readers { repeatable } => {
                let count = format!("SELECT count(*) FROM {}", system.table(&mut self.connect()));
                let (begin, end) =
                    if repeatable { ("BEGIN ISOLATION LEVEL REPEATABLE READ", "COMMIT") } else { ("", "") };
                let readers: Vec<Client> = (0..self.sizes.pin_readers).map(|_| self.connect()).collect();
                std::thread::scope(|scope| {
                    let readers: Vec<_> = readers
                        .into_iter()
                        .map(|mut c| {
                            let count = &count;
                            scope.spawn(move || {
                                let (t, mut scans) = (Instant::now(), 0);
                                c.batch_execute(begin).unwrap();
                                while !release.load(Ordering::Relaxed) {
                                    c.query_one(count.as_str(), &[]).unwrap();
                                    scans += 1;
                                }
                                c.batch_execute(end).unwrap();
                                (scans, t.elapsed().as_secs_f64())
                            })
                        })
                        .collect();
                    readers.into_iter().map(|r| r.join().unwrap()).fold((0, 0.0), |a, r| (a.0 + r.0, a.1 + r.1))
                })
            }
        }
    }

    /// Waiting claims: how soon a waiting consumer gets a message, what waiting costs with
    /// nothing to claim, and what the waiters cost a producer.
    fn pickup(&self) -> Pickup {
        let mut c = self.connect();
        let stats: bool = c
            .query_one("SELECT current_setting('shared_preload_libraries') ~ 'pg_stat_statements'", &[])
            .unwrap()
            .get(0);
        if stats {
            c.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").unwrap();
        }
        let s = &self.sizes;
        let (waiting, polling) = (Consumer::Waiting(s.pickup_wait), Consumer::Polling(s.poll_sleep));
        let latency = [waiting, polling].map(|how| self.pickup_latency(how)).into();
        let idle = [waiting, polling].map(|how| self.idle_cost(how, stats)).into();
        let n = s.pickup_consumers;
        let cases = [
            ("no consumers".to_string(), None),
            (format!("{n} waiting on another, empty queue"), Some(("bench_idle", waiting))),
            (format!("{n} waiting on the same queue (consuming)"), Some((QUEUE, waiting))),
            (format!("{n} polling the same queue (consuming)"), Some((QUEUE, polling))),
        ];
        let mut sends: Vec<SendRate> = vec![];
        for (case, consumers) in cases {
            self.say(&format!("pickup: sends with {case}"));
            let (messages_per_s, consumed_per_s) = self.send_rate(consumers);
            let ratio = messages_per_s / sends.first().map_or(messages_per_s, |s| s.messages_per_s);
            sends.push(SendRate { case, messages_per_s, ratio, consumed_per_s });
        }
        Pickup { latency, idle, sends }
    }

    /// Sends at a steady rate, each its own commit, to consumers waiting (or polling).
    fn pickup_latency(&self, how: Consumer) -> PickupLatency {
        let s = &self.sizes;
        let consumers = how.describe(s.pickup_consumers);
        self.say(&format!("pickup: latency with {consumers}, {} sends/s", s.pickup_rate));
        let mut c = self.connect();
        self.reset(&mut c);
        let base = Instant::now();
        let fleet = Consumers::start(self, s.pickup_consumers, QUEUE, how, base, false);
        std::thread::sleep(Duration::from_millis(500));
        let send = c.prepare(&format!("SELECT pgqueue.pgq_send('{QUEUE}', $1)")).unwrap();
        let total = (s.pickup_rate * s.pickup_for.as_secs_f64()) as u64;
        // When each send's commit had returned (µs since base).
        let mut committed = Vec::with_capacity(total as usize);
        let began = Instant::now();
        for job in 0..total {
            let due = began + Duration::from_secs_f64(job as f64 / s.pickup_rate);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            c.query_one(&send, &[&payload(job)]).unwrap();
            committed.push(base.elapsed().as_micros() as u64);
        }
        let drained = Instant::now() + Duration::from_secs(2);
        while fleet.picked.load(Ordering::Relaxed) < total && Instant::now() < drained {
            std::thread::sleep(Duration::from_millis(10));
        }
        let picked = fleet.stop();
        let mut hist = Histogram::<u64>::new(3).unwrap();
        for &(job, at) in &picked {
            // A consumer can return before the producer hears of its commit: that is 0.
            hist.record(at.saturating_sub(committed[job as usize])).unwrap();
        }
        let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
        PickupLatency {
            consumers,
            sent: total,
            claimed: picked.len() as u64,
            p50_ms: ms(0.5),
            p99_ms: ms(0.99),
            max_ms: hist.max() as f64 / 1000.0,
        }
    }

    /// Consumers with nothing to claim: statements per consumer per minute.
    fn idle_cost(&self, how: Consumer, stats: bool) -> IdleCost {
        let s = &self.sizes;
        let consumers = how.describe(s.pickup_consumers);
        self.say(&format!("pickup: idle for {:?} with {consumers}", s.idle_for));
        let mut c = self.connect();
        self.reset(&mut c);
        let fleet = Consumers::start(self, s.pickup_consumers, QUEUE, how, Instant::now(), stats);
        std::thread::sleep(Duration::from_millis(500));
        if stats {
            c.batch_execute("SELECT pg_stat_statements_reset()").unwrap();
        }
        let (claims, t) = (fleet.claims.load(Ordering::Relaxed), Instant::now());
        std::thread::sleep(s.idle_for);
        let claims = fleet.claims.load(Ordering::Relaxed) - claims;
        let seconds = t.elapsed().as_secs_f64();
        let server = stats.then(|| {
            c.query_one(
                "SELECT coalesce(sum(calls) FILTER (WHERE toplevel AND query LIKE '%pgq_claim(%'), 0)::bigint,
                        coalesce(sum(calls) FILTER (WHERE NOT toplevel), 0)::bigint,
                        coalesce(sum(calls) FILTER (WHERE NOT toplevel AND query LIKE '%pgqueue._wait(%'), 0)::bigint
                   FROM pg_stat_statements",
                &[],
            )
            .unwrap()
        });
        fleet.stop();
        let per_min = |calls: i64| calls as f64 / s.pickup_consumers as f64 / (seconds / 60.0);
        let counted = |i: usize| server.as_ref().map(|r| per_min(r.get(i)));
        IdleCost {
            consumers,
            seconds,
            claims_per_min: per_min(claims as i64),
            server_claims_per_min: counted(0),
            inner_statements_per_min: counted(1),
            sleeps_per_min: counted(2),
        }
    }

    /// Schedules: a tick with nothing due, a burst of due ones, then the live worker.
    fn schedules(&self) -> Schedules {
        let s = &self.sizes;
        let mut c = self.connect();
        self.reset(&mut c);
        Self::worker(&mut c, false);
        self.say(&format!("schedules: {} schedules, none due", s.schedules));
        c.execute(
            "INSERT INTO pgqueue.schedules (name, queue, cron, payload, next_run)
             SELECT 'bench-' || g, 'bench', '0 0 1 1 *', '{}', pgqueue._cron_next('0 0 1 1 *', 'UTC', now(), 1)
               FROM generate_series(1, $1::bigint) g",
            &[&s.schedules],
        )
        .unwrap();
        c.batch_execute("VACUUM (ANALYZE) pgqueue.schedules").unwrap();
        let fire = c.prepare("SELECT fired, more FROM pgqueue._fire_schedules(50)").unwrap();
        let mut hist = Histogram::<u64>::new(3).unwrap();
        for _ in 0..200 {
            let t = Instant::now();
            c.query_one(&fire, &[]).unwrap();
            hist.record(t.elapsed().as_micros() as u64).unwrap();
        }
        let plan: String = c
            .query("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM pgqueue._fire_schedules(50)", &[])
            .unwrap()
            .iter()
            .map(|r| r.get::<_, Value>(0).to_string())
            .collect();
        let plan: Value = serde_json::from_str(&plan).unwrap();
        let idle_buffers =
            ["Shared Hit Blocks", "Shared Read Blocks"].iter().map(|k| plan[0]["Plan"][k].as_i64().unwrap_or(0)).sum();

        self.say(&format!("schedules: {} due at once", s.schedules_due));
        c.execute(
            "UPDATE pgqueue.schedules SET cron = '*/5 * * * * *',
                    next_run = (SELECT pgqueue._cron_next('*/5 * * * * *', 'UTC', now() - interval '5 s', 1))
              WHERE name IN (SELECT 'bench-' || g FROM generate_series(1, $1::bigint) g)",
            &[&s.schedules_due],
        )
        .unwrap();
        let (t, mut burst_fired) = (Instant::now(), 0i64);
        loop {
            let row = c.query_one(&fire, &[]).unwrap();
            burst_fired += row.get::<_, i64>(0);
            if !row.get::<_, bool>(1) {
                break;
            }
        }
        let burst_ms = t.elapsed().as_secs_f64() * 1000.0;

        self.say(&format!("schedules: live worker for {:?}", s.schedules_for));
        let table = System::Pgqueue.table(&mut c);
        c.batch_execute(&format!("DELETE FROM {table} WHERE queue = 'bench'")).unwrap();
        // From the next slot on: every 5 s the due schedules fire together.
        c.batch_execute(
            "UPDATE pgqueue.schedules SET next_run = (SELECT pgqueue._cron_next(cron, 'UTC', now(), 1))
              WHERE cron = '*/5 * * * * *'",
        )
        .unwrap();
        let start: String = c
            .query_one("SELECT min(next_run)::text FROM pgqueue.schedules WHERE cron = '*/5 * * * * *'", &[])
            .unwrap()
            .get(0);
        Self::worker(&mut c, true);
        std::thread::sleep(s.schedules_for);
        let stop: String = c.query_one("SELECT now()::text", &[]).unwrap().get(0);
        Self::worker(&mut c, false);
        let row = c
            .query_one(
                "WITH runs AS (
                     SELECT (headers->>'scheduled_for')::timestamptz AS slot, headers->>'schedule' AS name,
                            enqueued_at FROM pgqueue.messages WHERE queue = 'bench'
                 ), slots AS (
                     SELECT count(*) AS n FROM generate_series($1::text::timestamptz, $2::text::timestamptz - interval '2 s',
                                                               interval '5 s') g
                 )
                 SELECT count(*), (SELECT n FROM slots) * $3::bigint,
                        count(*) - count(DISTINCT (name, slot)),
                        extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY enqueued_at - slot))::float8 * 1000,
                        extract(epoch FROM percentile_cont(0.99) WITHIN GROUP (ORDER BY enqueued_at - slot))::float8 * 1000,
                        extract(epoch FROM max(enqueued_at - slot))::float8 * 1000,
                        (SELECT setting FROM pg_settings WHERE name = 'pgqueue.tick_interval')
                   FROM runs WHERE slot < $2::text::timestamptz - interval '2 s'",
                &[&start, &stop, &s.schedules_due],
            )
            .unwrap();
        let tick: String = row.get(6);
        let tick_interval_ms = tick.trim_end_matches("ms").parse().unwrap_or(0);
        c.batch_execute("DELETE FROM pgqueue.schedules WHERE name LIKE 'bench-%'").unwrap();
        Self::worker(&mut c, true);
        Schedules {
            schedules: s.schedules,
            idle_p50_us: hist.value_at_quantile(0.5),
            idle_buffers,
            due: s.schedules_due,
            burst_fired,
            burst_ms,
            tick_interval_ms,
            live_seconds: s.schedules_for.as_secs_f64(),
            live_runs: row.get(0),
            live_expected: row.get(1),
            live_duplicates: row.get(2),
            lateness_p50_ms: row.get::<_, Option<f64>>(3).unwrap_or(0.0),
            lateness_p99_ms: row.get::<_, Option<f64>>(4).unwrap_or(0.0),
            lateness_max_ms: row.get::<_, Option<f64>>(5).unwrap_or(0.0),
        }
    }

    /// Unique jobs: one producer's single sends without a key, each with a new key, and all
    /// with the same key (each a duplicate), side by side.
    fn unique(&self) -> Vec<SendRate> {
        let s = &self.sizes;
        let mut c = self.connect();
        let mut out: Vec<SendRate> = vec![];
        for (case, sql) in [
            ("no key", "SELECT pgqueue.pgq_send('bench', $1)"),
            ("a new key each", "SELECT pgqueue.pgq_send('bench', $1, dedup_key => $2)"),
            ("the same key (duplicates)", "SELECT pgqueue.pgq_send('bench', $1, dedup_key => 'same')"),
        ] {
            self.say(&format!("unique: sends with {case}"));
            self.reset(&mut c);
            let send = c.prepare(sql).unwrap();
            let message = payload(0);
            let (t, mut sent) = (Instant::now(), 0u64);
            while t.elapsed() < s.send_for {
                if case == "a new key each" {
                    c.query_one(&send, &[&message, &format!("k{sent}")]).unwrap();
                } else {
                    c.query_one(&send, &[&message]).unwrap();
                }
                sent += 1;
            }
            let messages_per_s = sent as f64 / t.elapsed().as_secs_f64();
            let ratio = messages_per_s / out.first().map_or(messages_per_s, |r| r.messages_per_s);
            out.push(SendRate { case: case.into(), messages_per_s, ratio, consumed_per_s: 0.0 });
        }
        out
    }

    /// One producer's single sends per second, each its own commit, beside `consumers` on a
    /// queue (or none); and the messages those claimed per second.
    fn send_rate(&self, consumers: Option<(&str, Consumer)>) -> (f64, f64) {
        let s = &self.sizes;
        let mut c = self.connect();
        self.reset(&mut c);
        c.batch_execute("SELECT pgqueue.pgq_create_queue('bench_idle')").unwrap();
        let fleet =
            consumers.map(|(queue, how)| Consumers::start(self, s.pickup_consumers, queue, how, Instant::now(), false));
        std::thread::sleep(Duration::from_millis(500));
        let send = c.prepare(&format!("SELECT pgqueue.pgq_send('{QUEUE}', $1)")).unwrap();
        let message = payload(0);
        let (t, mut sent) = (Instant::now(), 0u64);
        while t.elapsed() < s.send_for {
            c.query_one(&send, &[&message]).unwrap();
            sent += 1;
        }
        let seconds = t.elapsed().as_secs_f64();
        let consumed = fleet.map_or(0, |fleet| {
            let picked = fleet.picked.load(Ordering::Relaxed);
            fleet.stop();
            picked
        });
        (sent as f64 / seconds, consumed as f64 / seconds)
    }

    /// Callers asking for messages' outcomes as one finisher acks them: waiting in pgq_result
    /// (woken by the ack's commit), polling it, and nobody asking, round by round in turn so
    /// that the machine's noise falls on all three alike.
    fn results(&self) -> Vec<ResultLatency> {
        let s = &self.sizes;
        let n = s.result_callers;
        self.say(&format!("results: {n} callers, {} rounds", s.result_rounds));
        let mut c = self.connect();
        self.reset(&mut c);
        let base = Instant::now();
        // Per caller: the message it asks for next; back from all: when pgq_result returned
        // (µs since base) and whether the message was completed.
        let (done_tx, done) = std::sync::mpsc::channel::<(i64, u64, bool)>();
        let polling = Arc::new(AtomicU64::new(0));
        let (asks, threads): (Vec<_>, Vec<_>) = (0..n)
            .map(|_| {
                let (tx, ids) = std::sync::mpsc::channel::<(i64, Asking)>();
                let (mut c, done, polling) = (self.connect(), done_tx.clone(), polling.clone());
                let thread = std::thread::spawn(move || {
                    let wait = c.prepare("SELECT state FROM pgqueue.pgq_result($1, wait => '30 s')").unwrap();
                    let poll = c.prepare("SELECT state, finished_at IS NOT NULL FROM pgqueue.pgq_result($1)").unwrap();
                    for (id, how) in ids {
                        let (state, at): (String, u64) = match how {
                            Asking::Waits => {
                                let row = c.query_one(&wait, &[&id]).unwrap();
                                (row.get(0), base.elapsed().as_micros() as u64)
                            }
                            Asking::Polls(sleep) => {
                                let mut first = true;
                                loop {
                                    let row = c.query_one(&poll, &[&id]).unwrap();
                                    let at = base.elapsed().as_micros() as u64;
                                    if row.get(1) {
                                        break (row.get(0), at);
                                    }
                                    if std::mem::take(&mut first) {
                                        polling.fetch_add(1, Ordering::Relaxed);
                                    }
                                    std::thread::sleep(sleep);
                                }
                            }
                            Asking::Nobody => unreachable!("nobody asks"),
                        };
                        done.send((id, at, state == "completed")).unwrap();
                    }
                });
                (tx, thread)
            })
            .unzip();
        let send = c
            .prepare(&format!("SELECT pgqueue.pgq_send_batch('{QUEUE}', array_fill($1::jsonb, ARRAY[$2::int]))"))
            .unwrap();
        let claim =
            c.prepare(&format!("SELECT msg_id, claim_token FROM pgqueue.pgq_claim('{QUEUE}', qty => $1)")).unwrap();
        let ack = c.prepare("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid, result => $3::jsonb)").unwrap();
        let waiters = c.prepare("SELECT pgqueue._outcome_waiters()").unwrap();
        let ways = [Asking::Waits, Asking::Polls(s.result_poll), Asking::Nobody];
        let hist = || Histogram::<u64>::new(3).unwrap();
        // Per way: latencies, ack calls, failures.
        let mut measured = ways.map(|_| (hist(), hist(), 0u64));
        for round in 0..s.result_rounds {
            for k in 0..ways.len() {
                let i = (round + k) % ways.len();
                let how = ways[i];
                let ids: Vec<i64> =
                    c.query(&send, &[&payload(round as u64), &(n as i32)]).unwrap().iter().map(|r| r.get(0)).collect();
                polling.store(0, Ordering::Relaxed);
                if !matches!(how, Asking::Nobody) {
                    for (ask, &id) in asks.iter().zip(&ids) {
                        ask.send((id, how)).unwrap();
                    }
                }
                // Until every caller asks: each waits in its call, or has polled once.
                let t = Instant::now();
                loop {
                    let asking = match how {
                        Asking::Waits => c.query_one(&waiters, &[]).unwrap().get::<_, i64>(0) as u64,
                        Asking::Polls(_) => polling.load(Ordering::Relaxed),
                        Asking::Nobody => n as u64,
                    };
                    if asking >= n as u64 {
                        break;
                    }
                    assert!(t.elapsed() < Duration::from_secs(10), "results: {asking} of {n} callers asking");
                    std::thread::sleep(Duration::from_millis(1));
                }
                let (latency, acks, failures) = &mut measured[i];
                // When each message's ack returned (µs since base).
                let mut acked = std::collections::HashMap::new();
                let claimed = c.query(&claim, &[&(n as i32)]).unwrap();
                assert_eq!(claimed.len(), n, "results: the round's messages claimed");
                for row in &claimed {
                    let (id, token): (i64, Uuid) = (row.get(0), row.get(1));
                    let t = base.elapsed().as_micros() as u64;
                    c.query_one(&ack, &[&id, &token, &serde_json::json!({"ok": true})]).unwrap();
                    let at = base.elapsed().as_micros() as u64;
                    acks.record(at - t).unwrap();
                    acked.insert(id, at);
                }
                if matches!(how, Asking::Nobody) {
                    continue;
                }
                for _ in 0..n {
                    let (id, at, completed) =
                        done.recv_timeout(Duration::from_secs(40)).expect("results: callers answer");
                    if completed {
                        // A caller can return before the finisher hears of its commit: that is 0.
                        latency.record(at.saturating_sub(acked[&id])).unwrap();
                    } else {
                        *failures += 1;
                    }
                }
            }
        }
        drop(asks);
        threads.into_iter().for_each(|t| t.join().unwrap());
        ways.iter()
            .zip(measured)
            .map(|(how, (latency, acks, failures))| {
                let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
                ResultLatency {
                    asking: how.describe(),
                    callers: n,
                    rounds: s.result_rounds,
                    samples: latency.len(),
                    failures,
                    p50_ms: ms(&latency, 0.5),
                    p99_ms: ms(&latency, 0.99),
                    max_ms: latency.max() as f64 / 1000.0,
                    ack_p50_ms: ms(&acks, 0.5),
                }
            })
            .collect()
    }

    /// Dependencies: single sends with `after` against plain ones, then fan-ins of many
    /// parents into one child, each beside a control run of messages without dependents.
    fn dependencies(&self) -> Dependencies {
        let sends = self.dependency_sends();
        let s = &self.sizes;
        let (n, runs) = (s.fan_in_parents, s.fan_in_runs);
        let mut c = self.connect();
        // The consumers' connections serve every phase (a fresh backend's first calls fill
        // its caches), warmed once before the first run.
        let mut consumers: Vec<Client> = (0..s.fan_in_consumers).map(|_| self.connect()).collect();
        let base = Instant::now();
        self.dependencies_reset(&mut c);
        Self::send_parents(&mut c, n.min(1_000));
        (consumers, _) = self.ack_all(consumers, n.min(1_000) as u64, base);
        let mut fan_in = vec![];
        for run in 0..runs {
            self.say(&format!(
                "dependencies: fan-in {} of {runs}: {n} parents, {} consumers",
                run + 1,
                consumers.len()
            ));
            self.dependencies_reset(&mut c);
            // Every other run measures the control first: the machine's drift falls on both.
            let mut control = None;
            if run % 2 == 1 {
                Self::send_parents(&mut c, n);
                let phase;
                (consumers, phase) = self.ack_all(consumers, n as u64, base);
                control = Some(phase);
            }
            let parents = Self::send_parents(&mut c, n);
            let t = Instant::now();
            let child: i64 = c
                .query_one(
                    &format!("SELECT pgqueue.pgq_send('{CHILD}', $1::jsonb, after => $2::bigint[])"),
                    &[&payload(0), &parents],
                )
                .unwrap()
                .get(0);
            let child_send_ms = t.elapsed().as_secs_f64() * 1000.0;
            let released = |c: &mut Client| -> i64 {
                c.query_one("SELECT released FROM pgqueue.worker_state", &[]).unwrap().get(0)
            };
            let released_before = released(&mut c);
            // A claim waiting on the child's queue from before the first ack.
            let mut w = self.connect();
            let waiter_pid: i32 = w.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
            let waiter = std::thread::spawn(move || {
                let claim =
                    w.prepare(&format!("SELECT msg_id FROM pgqueue.pgq_claim('{CHILD}', wait => '30 s')")).unwrap();
                let t = Instant::now();
                loop {
                    if let Some(row) = w.query(&claim, &[]).unwrap().first() {
                        break (row.get::<_, i64>(0), base.elapsed().as_micros() as u64);
                    }
                    assert!(t.elapsed() < Duration::from_secs(300), "dependencies: the child is released");
                }
            });
            let t = Instant::now();
            while !c
                .query_one(
                    "SELECT coalesce(bool_or(state = 'active'), false) FROM pg_stat_activity WHERE pid = $1",
                    &[&waiter_pid],
                )
                .unwrap()
                .get::<_, bool>(0)
            {
                assert!(t.elapsed() < Duration::from_secs(10), "dependencies: the child's claim waits");
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(100));
            let phase;
            (consumers, phase) = self.ack_all(consumers, n as u64, base);
            let (claimed, at) = waiter.join().unwrap();
            assert_eq!(claimed, child, "dependencies: the waiting claim returns the child");
            // The worker counts what it released when it records its tick, soon after.
            let t = Instant::now();
            let mut by_worker = false;
            while t.elapsed() < Duration::from_millis(1500) && !by_worker {
                by_worker = released(&mut c) > released_before;
                std::thread::sleep(Duration::from_millis(50));
            }
            if control.is_none() {
                Self::send_parents(&mut c, n);
                let phase;
                (consumers, phase) = self.ack_all(consumers, n as u64, base);
                control = Some(phase);
            }
            let control = control.expect("the control ran");
            let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
            fan_in.push(FanInRun {
                run: run + 1,
                parents: n,
                consumers: consumers.len(),
                child_send_ms,
                acks: phase.acks.len(),
                seconds: phase.seconds,
                ack_p50_ms: ms(&phase.acks, 0.5),
                ack_p99_ms: ms(&phase.acks, 0.99),
                ack_max_ms: phase.acks.max() as f64 / 1000.0,
                ack_p50_first_tenth_ms: ms(&phase.tenths[0], 0.5),
                ack_p50_last_tenth_ms: ms(&phase.tenths[1], 0.5),
                control_acks: control.acks.len(),
                control_seconds: control.seconds,
                control_ack_p50_ms: ms(&control.acks, 0.5),
                control_ack_p99_ms: ms(&control.acks, 0.99),
                control_ack_max_ms: control.acks.max() as f64 / 1000.0,
                control_ack_p50_first_tenth_ms: ms(&control.tenths[0], 0.5),
                control_ack_p50_last_tenth_ms: ms(&control.tenths[1], 0.5),
                // The claim can return before the consumer hears of its commit: that is 0.
                release_ms: at.saturating_sub(phase.last_us) as f64 / 1000.0,
                released_by: if by_worker { "the worker" } else { "the last ack" }.into(),
                lock_samples: phase.samples,
                lock_waiting_samples: phase.waiting_samples,
                lock_wait_ms: phase.longest_wait_ms,
                lock_wait_on: phase.longest_wait_on,
                control_lock_samples: control.samples,
                control_lock_waiting_samples: control.waiting_samples,
                control_lock_wait_ms: control.longest_wait_ms,
            });
        }
        let mut releases: Vec<f64> = fan_in.iter().map(|r| r.release_ms).collect();
        releases.sort_by(f64::total_cmp);
        let release_p50_ms = releases.get(releases.len() / 2).copied().unwrap_or(0.0);
        Dependencies { sends, fan_in, release_p50_ms }
    }

    /// Empty queues (QUEUE, PARENTS, CHILD), checked by a tick, and freshly vacuumed tables.
    fn dependencies_reset(&self, c: &mut Client) {
        self.reset(c);
        c.batch_execute(&format!(
            "SELECT pgqueue.pgq_create_queue('{PARENTS}', lease => '1 hour', retention => '1 day');
             SELECT pgqueue.pgq_create_queue('{CHILD}', lease => '1 hour', retention => '1 day');"
        ))
        .unwrap();
        Self::checked(c, PARENTS);
        Self::checked(c, CHILD);
        Self::vacuum(c);
        c.batch_execute("VACUUM (ANALYZE) pgqueue.dependencies").unwrap();
    }

    /// Sends `n` ready messages to PARENTS (batches of 10,000, a batch's most); their ids.
    fn send_parents(c: &mut Client, n: i64) -> Vec<i64> {
        let send = c
            .prepare(&format!("SELECT pgqueue.pgq_send_batch('{PARENTS}', array_fill($1::jsonb, ARRAY[$2::int]))"))
            .unwrap();
        let mut ids = Vec::with_capacity(n as usize);
        let mut left = n;
        while left > 0 {
            let chunk = left.min(10_000);
            ids.extend(c.query(&send, &[&payload(0), &(chunk as i32)]).unwrap().iter().map(|r| r.get::<_, i64>(0)));
            left -= chunk;
        }
        ids
    }

    /// The consumers claim and ack PARENTS' `n` ready messages one at a time (pgq_claim, then
    /// pgq_ack, each its own commit), while pg_locks is sampled for any of them waiting.
    /// Returns the connections and what the acks took.
    fn ack_all(&self, consumers: Vec<Client>, n: u64, base: Instant) -> (Vec<Client>, AckPhase) {
        let mut consumers = consumers;
        let pids: Vec<i32> =
            consumers.iter_mut().map(|c| c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0)).collect();
        let acked = Arc::new(AtomicU64::new(0));
        let start = Arc::new(Barrier::new(consumers.len() + 1));
        let threads: Vec<_> = consumers
            .into_iter()
            .map(|mut c| {
                let (acked, start) = (acked.clone(), start.clone());
                std::thread::spawn(move || {
                    let claim =
                        c.prepare(&format!("SELECT msg_id, claim_token FROM pgqueue.pgq_claim('{PARENTS}')")).unwrap();
                    let ack = c.prepare("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)").unwrap();
                    let (mut acks, mut last) = (Histogram::<u64>::new(3).unwrap(), 0u64);
                    let mut tenths = [Histogram::<u64>::new(3).unwrap(), Histogram::<u64>::new(3).unwrap()];
                    start.wait();
                    let began = Instant::now();
                    while acked.load(Ordering::Relaxed) < n {
                        let rows = c.query(&claim, &[]).unwrap();
                        let Some(row) = rows.first() else {
                            // The rest are claimed by others: until they are acked.
                            assert!(began.elapsed() < Duration::from_secs(300), "dependencies: every parent acked");
                            std::thread::sleep(Duration::from_millis(1));
                            continue;
                        };
                        let (id, token): (i64, Uuid) = (row.get(0), row.get(1));
                        let t = Instant::now();
                        let done: bool = c.query_one(&ack, &[&id, &token]).unwrap().get(0);
                        let took = t.elapsed().as_micros() as u64;
                        last = last.max(base.elapsed().as_micros() as u64);
                        assert!(done, "dependencies: message {id} acked");
                        acks.record(took).unwrap();
                        let ordinal = acked.fetch_add(1, Ordering::Relaxed);
                        if ordinal < n / 10 {
                            tenths[0].record(took).unwrap();
                        } else if ordinal >= n - n / 10 {
                            tenths[1].record(took).unwrap();
                        }
                    }
                    (c, acks, tenths, last)
                })
            })
            .collect();
        // Backends of the consumers waiting on a lock, sampled from a connection of its own.
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (stop, every, mut s) = (stop.clone(), self.sizes.lock_sample_every, self.connect());
            let sample = s
                .prepare(
                    "SELECT (extract(epoch FROM clock_timestamp() - l.waitstart) * 1000)::float8,
                            l.locktype || ' ' || l.mode || coalesce(' on ' || l.relation::regclass::text, '')
                       FROM pg_locks l WHERE NOT l.granted AND l.waitstart IS NOT NULL AND l.pid = ANY ($1)",
                )
                .unwrap();
            std::thread::spawn(move || {
                let (mut samples, mut waiting, mut longest) = (0u64, 0u64, (0.0f64, String::new()));
                // At least one sample, however short the phase.
                loop {
                    let rows = s.query(&sample, &[&pids]).unwrap();
                    samples += 1;
                    waiting += u64::from(!rows.is_empty());
                    for r in rows {
                        let ms: f64 = r.get(0);
                        if ms > longest.0 {
                            longest = (ms, r.get(1));
                        }
                    }
                    if stop.load(Ordering::Relaxed) {
                        break (samples, waiting, longest);
                    }
                    std::thread::sleep(every);
                }
            })
        };
        start.wait();
        let began = Instant::now();
        let mut phase = AckPhase {
            acks: Histogram::<u64>::new(3).unwrap(),
            tenths: [Histogram::<u64>::new(3).unwrap(), Histogram::<u64>::new(3).unwrap()],
            last_us: 0,
            seconds: 0.0,
            samples: 0,
            waiting_samples: 0,
            longest_wait_ms: 0.0,
            longest_wait_on: String::new(),
        };
        let mut back = vec![];
        for t in threads {
            let (c, acks, tenths, last) = t.join().unwrap();
            phase.acks.add(&acks).unwrap();
            for (all, mine) in phase.tenths.iter_mut().zip(&tenths) {
                all.add(mine).unwrap();
            }
            phase.last_us = phase.last_us.max(last);
            back.push(c);
        }
        phase.seconds = began.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let (samples, waiting, (ms, on)) = sampler.join().unwrap();
        (phase.samples, phase.waiting_samples, phase.longest_wait_ms, phase.longest_wait_on) =
            (samples, waiting, ms, on);
        (back, phase)
    }

    /// Single pgq_send calls, each its own commit: plain, and with each number of parents
    /// (ready messages of their own, none named twice), interleaved call by call on every
    /// connection, at each connection count.
    fn dependency_sends(&self) -> Vec<DependencySend> {
        let s = &self.sizes;
        let mut c = self.connect();
        let kinds: Vec<usize> = std::iter::once(0).chain(s.dep_send_parents.iter().copied()).collect();
        // Unmeasured rounds first, on every connection.
        let warm = 10;
        let mut out = vec![];
        for &n in &s.dep_send_connections {
            self.say(&format!(
                "dependencies: sends on {n} connections, {} calls of each kind (parents: {kinds:?})",
                s.dep_send_calls
            ));
            self.dependencies_reset(&mut c);
            let per = (warm + s.dep_send_calls) * kinds.iter().sum::<usize>();
            let ids = Self::send_parents(&mut c, (per * n) as i64);
            let start = Arc::new(Barrier::new(n + 1));
            let threads: Vec<_> = ids
                .chunks(per)
                .map(|mine| {
                    let mine = mine.to_vec();
                    let mut c = self.connect();
                    let (start, kinds, calls) = (start.clone(), kinds.clone(), s.dep_send_calls);
                    std::thread::spawn(move || {
                        let plain = c.prepare(&format!("SELECT pgqueue.pgq_send('{QUEUE}', $1::jsonb)")).unwrap();
                        let after = c
                            .prepare(&format!("SELECT pgqueue.pgq_send('{QUEUE}', $1::jsonb, after => $2::bigint[])"))
                            .unwrap();
                        let mut hists: Vec<Histogram<u64>> =
                            kinds.iter().map(|_| Histogram::<u64>::new(3).unwrap()).collect();
                        let message = payload(0);
                        let mut parents = mine.into_iter();
                        start.wait();
                        for round in 0..warm + calls {
                            for k in 0..kinds.len() {
                                let i = (round + k) % kinds.len();
                                let named: Vec<i64> = parents.by_ref().take(kinds[i]).collect();
                                let t = Instant::now();
                                if named.is_empty() {
                                    c.query_one(&plain, &[&message]).unwrap();
                                } else {
                                    c.query_one(&after, &[&message, &named]).unwrap();
                                }
                                if round >= warm {
                                    hists[i].record(t.elapsed().as_micros() as u64).unwrap();
                                }
                            }
                        }
                        hists
                    })
                })
                .collect();
            start.wait();
            let mut hists: Vec<Histogram<u64>> = kinds.iter().map(|_| Histogram::<u64>::new(3).unwrap()).collect();
            for t in threads {
                for (all, mine) in hists.iter_mut().zip(t.join().unwrap()) {
                    all.add(&mine).unwrap();
                }
            }
            let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
            let plain_p50 = ms(&hists[0], 0.5);
            for (&parents, h) in kinds.iter().zip(&hists) {
                out.push(DependencySend {
                    connections: n,
                    parents,
                    calls: h.len(),
                    p50_ms: ms(h, 0.5),
                    p99_ms: ms(h, 0.99),
                    of_plain: if plain_p50 > 0.0 { ms(h, 0.5) / plain_p50 } else { 0.0 },
                });
            }
        }
        out
    }
}

/// What one phase of acks took (dependencies).
struct AckPhase {
    /// Each pgq_ack call's latency, µs.
    acks: Histogram<u64>,
    /// The first tenth of the acks and the last.
    tenths: [Histogram<u64>; 2],
    /// When the last ack returned, µs since the scenario's base.
    last_us: u64,
    seconds: f64,
    samples: u64,
    waiting_samples: u64,
    longest_wait_ms: f64,
    longest_wait_on: String,
}
