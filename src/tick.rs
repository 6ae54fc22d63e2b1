//! One tick of housekeeping, shared by the background worker and `pgq_tick()`. Each step
//! runs in a bracket of its own — a transaction in the worker, a subtransaction in
//! `pgq_tick()` — so a failing step is counted and logged and never stops the others.
//! The steps' SQL lives in `sql/maintenance.sql`; this file only sequences and counts.

use crate::bracket::Bracket;
use crate::guc;
use crate::queue_state;
use crate::rollup;
use crate::tick_counts;
use pgrx::JsonB;
use pgrx::prelude::*;
use serde_json::{Map, Value, json};
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::time::Instant;

/// What to run this time.
pub struct Plan {
    /// All steps, or only a re-arm pass (the worker comes back sooner while a backlog lasts).
    pub all_steps: bool,
    /// The first tick since the process started (recorded as `started_at`).
    pub first: bool,
}

/// What one tick did.
#[derive(Default)]
pub struct Outcome {
    counts: Map<String, Value>,
    failed: Vec<(&'static str, String)>,
    /// The re-arm pass stopped on its budget with expired claims left.
    pub backlog: bool,
    /// The earliest next run of a schedule (worker only): it wakes for it before its tick.
    pub next_schedule: Option<pg_sys::TimestampTz>,
    /// The minute rollup was recorded (the tick's record then sets `last_rollup_at`).
    rolled_up: bool,
}

impl Outcome {
    fn add(&mut self, counter: &str, n: i64) {
        let entry = self.counts.entry(counter).or_insert(json!(0));
        *entry = json!(entry.as_i64().unwrap_or(0) + n);
    }

    /// Rows for pgq_tick(): (step, failed, error).
    pub fn failures(&self) -> &[(&'static str, String)] {
        &self.failed
    }
}

/// Runs one tick. `pass` is the re-arm pass under way, if the previous tick left one.
pub fn run(bracket: Bracket, plan: Plan, pass: &mut Pass) -> Outcome {
    let mut out = Outcome::default();
    let level = sql_level(bracket, &mut out);
    // Between full ticks, first: a child whose last parents finished together waits for this
    // (dependencies.rs).
    if level >= SQL_DEPENDENCIES && !plan.all_steps && crate::dependencies::handed_over() {
        check_pending(bracket, &mut out, None, false);
    }
    // Also between full ticks: the worker comes back early when a schedule falls due.
    if level >= SQL_SCHEDULES {
        fire_schedules(bracket, &mut out);
    }
    if plan.all_steps {
        if let Some(n) = step(bracket, &mut out, "promote", || one("SELECT pgqueue._promote_all(10000)")) {
            out.add("promoted", n);
        }
        if let Some(n) = step(bracket, &mut out, "orphan", || one("SELECT pgqueue._expire_orphaned_claims()")) {
            out.add("orphans_expired", n);
            if n > 0 {
                queue_state::lease_may_have_ended();
            }
        }
    }
    let current_sql = level >= SQL_SHARED_STATE;
    let prune_now = plan.all_steps && prune_due(bracket, &mut out);
    if level >= SQL_DEPENDENCIES && plan.all_steps {
        check_pending(bracket, &mut out, Some(PENDING_WINDOW), prune_now);
    }
    if level >= SQL_PARKS && plan.all_steps {
        end_parks(bracket, &mut out, prune_now);
    }
    // At the prune cadence a pass runs from the start even if no lease seems to have ended:
    // claims and leases written around the API (a restore, an UPDATE) are re-armed then.
    rescue(bracket, &mut out, pass, current_sql, level >= SQL_LEDGER_CLAIMS, prune_now);
    if plan.all_steps && level >= SQL_LEDGER {
        prune_claims(bracket, &mut out, prune_now);
        // Part of the claims step (its failures counted as claims_failures); its rebuilds are
        // counted in pgqueue.held_set.
        step(bracket, &mut out, "claims", || crate::held::rebuild(prune_now));
    }
    if plan.all_steps {
        // After promote and re-arm, whose commits it then finds announced already. Depths
        // are recounted at the prune cadence (they cost a count of the queue).
        if let Some(n) = step(bracket, &mut out, "reconcile", || crate::reconcile::run(prune_now, current_sql)) {
            out.add("hint_corrections", n);
        }
    }
    if plan.all_steps && level >= SQL_SCHEDULES {
        expire_keys(bracket, &mut out);
    }
    if plan.all_steps && level >= SQL_ROLLUPS {
        roll_up(bracket, &mut out);
    }
    let mut pruned = false;
    if prune_now {
        if let Some(n) = step(bracket, &mut out, "partition", || one("SELECT pgqueue._maintain_partitions()")) {
            out.add("partitions_created", n);
        }
        if let Some(rows) = step(bracket, &mut out, "prune", prune) {
            for (outcome, n, removed) in rows {
                out.add(&format!("prune_{outcome}"), n);
                out.add("pruned_rows", removed);
            }
        }
        pruned = true;
    }
    if plan.all_steps && current_sql && level >= SQL_DEAD_COUNTS {
        // After the prune, which drops dead letters with their partitions.
        if prune_now {
            crate::reconcile::mark_dead_stale();
        }
        count_dead(bracket, &mut out);
    }
    record(bracket, &mut out, &plan, pruned);
    out
}

/// A re-arm pass under way (it may span ticks while a backlog lasts): the claimed rows by
/// msg_id, then (0.24.0 on) the claims only the claim ledger holds, by claim_id.
#[derive(Default)]
pub struct Pass {
    /// Where the next batch starts (msg_id > cursor); None: no pass under way.
    cursor: Option<i64>,
    /// The claimed rows done: where the next batch of the ledger starts (claim_id > this).
    ledger: Option<i64>,
    /// The pass's number in shared memory, the lowest claimed msg_id (once its first batch
    /// ran) and the earliest lease end it saw so far (see queue_state::start_pass).
    number: u64,
    first: Option<i64>,
    expiry: i64,
}

/// What one re-arm batch did: re-armed, dead-lettered, where it stopped, whether there may
/// be more after it, the lowest claimed msg_id it saw (rows only) and the earliest lease end.
type Batch = (i64, i64, i64, bool, Option<i64>, Option<i64>);

/// One batch of `sql` (`$1`: the cursor, `$2`: the batch size), whose columns are a `Batch`'s.
fn rearm_batch(bracket: Bracket, out: &mut Outcome, sql: &str, after: i64, size: i32) -> Option<Batch> {
    step(bracket, out, "rearm", || {
        Spi::connect(|client| {
            let row = client.select(sql, Some(1), &[after.into(), size.into()])?.first();
            Ok::<_, pgrx::spi::Error>((
                row.get::<i64>(1)?.unwrap_or(0),
                row.get::<i64>(2)?.unwrap_or(0),
                row.get::<i64>(3)?.unwrap_or(0),
                row.get::<bool>(4)?.unwrap_or(false),
                row.get::<i64>(5)?,
                row.get::<pgrx::datum::TimestampWithTimeZone>(6)?.map(pg_sys::TimestampTz::from),
            ))
        })
        .unwrap_or_else(|e| error!("{e}"))
    })
}

/// The bounded rescue: batches of `rescue_batch_size`, each in its own bracket, continuing
/// while batches come back full, until the pass budget or row cap is reached. A new pass
/// starts only when a lease may have ended (always with `force`, and without this release's
/// SQL), from where claimed messages start. With `ledger` (0.24.0's SQL on), the claims only
/// the claim ledger holds follow the claimed rows in the same pass.
fn rescue(bracket: Bracket, out: &mut Outcome, pass: &mut Pass, current_sql: bool, ledger: bool, force: bool) {
    let (budget, max_rows) = (guc::rescue_pass_budget(), i64::from(guc::RESCUE_PASS_MAX_ROWS.get()));
    let batch = guc::RESCUE_BATCH_SIZE.get();
    let start = Instant::now();
    let mut rows = 0;
    if pass.cursor.is_none() {
        let (floor, number) = if current_sql {
            // SAFETY: reads the clock.
            let now = unsafe { pg_sys::GetCurrentTimestamp() };
            match queue_state::start_pass(now, force) {
                Some(started) => started,
                None => return, // no lease can have ended yet
            }
        } else {
            (i64::MIN, 0)
        };
        *pass =
            Pass { cursor: Some(floor.saturating_sub(1).max(0)), ledger: None, number, first: None, expiry: i64::MAX };
    }
    loop {
        let done = match pass.ledger {
            Some(after) => rearm_batch(
                bracket,
                out,
                "SELECT b.rearmed, b.dead_lettered, coalesce(b.last_claim_id, 0), b.more, NULL::bigint, b.next_expiry
                   FROM pgqueue._rearm_ledger_batch($1, $2) b",
                after,
                batch,
            ),
            None => rearm_batch(
                bracket,
                out,
                // By name: an earlier release's function lacks the last two.
                "SELECT b.rearmed, b.dead_lettered, coalesce(b.last_msg_id, 0), b.more,
                        (to_jsonb(b) ->> 'first_msg_id')::bigint, (to_jsonb(b) ->> 'next_expiry')::timestamptz
                   FROM pgqueue._rearm_batch($1, $2) b",
                pass.cursor.unwrap_or(0),
                batch,
            ),
        };
        let Some((rearmed, dead, last, more, first, expiry)) = done else {
            // Counted; the next tick starts a new pass (shared memory kept what it had).
            *pass = Pass::default();
            break;
        };
        out.add("rearmed", rearmed);
        out.add("dead_lettered", dead);
        out.add("rescue_batches", 1);
        out.add("rescue_rows", rearmed + dead);
        rows += rearmed + dead;
        if pass.ledger.is_none() {
            if pass.first.is_none() && current_sql {
                // The first batch saw where claimed messages start: the next pass may start there.
                queue_state::pass_found_floor(pass.number, first.unwrap_or(i64::MAX));
            }
            pass.first = pass.first.or(first).or(Some(i64::MAX));
        }
        pass.expiry = pass.expiry.min(expiry.unwrap_or(i64::MAX));
        match (more, pass.ledger) {
            (true, Some(_)) => pass.ledger = Some(last),
            (true, None) => pass.cursor = Some(last),
            (false, None) if ledger => pass.ledger = Some(0),
            (false, _) => {
                if current_sql {
                    queue_state::end_pass(pass.number, pass.expiry);
                }
                *pass = Pass::default();
                break;
            }
        }
        if start.elapsed() >= budget || rows >= max_rows {
            out.backlog = true;
            break;
        }
    }
}

/// Due schedules, 50 a transaction (each schedule is a subtransaction: see
/// `_fire_schedules`), until none is left or the rescue pass budget is used up. In
/// `pgq_tick()` one batch only: its subtransactions all count in the caller's transaction,
/// and more than 64 would overflow other sessions' snapshots while it runs.
fn fire_schedules(bracket: Bracket, out: &mut Outcome) {
    let start = Instant::now();
    while let Some((fired, missed, failed, more)) = step(bracket, out, "schedule", || {
        Spi::connect(|client| {
            let row = client.select("SELECT * FROM pgqueue._fire_schedules(50)", Some(1), &[])?.first();
            Ok::<_, pgrx::spi::Error>((
                row.get::<i64>(1)?.unwrap_or(0),
                row.get::<i64>(2)?.unwrap_or(0),
                row.get::<i64>(3)?.unwrap_or(0),
                row.get::<bool>(4)?.unwrap_or(false),
            ))
        })
        .unwrap_or_else(|e| error!("{e}"))
    }) {
        out.add("scheduled_runs", fired);
        out.add("missed_runs", missed);
        out.add("schedule_errors", failed);
        if !more || start.elapsed() >= guc::rescue_pass_budget() || matches!(bracket, Bracket::Subtransaction) {
            break;
        }
    }
    if matches!(bracket, Bracket::Transaction) {
        out.next_schedule = step(bracket, out, "schedule", || {
            Spi::get_one::<pgrx::datum::TimestampWithTimeZone>(
                "SELECT min(next_run) FROM pgqueue.schedules WHERE NOT paused",
            )
            .unwrap_or_else(|e| error!("{e}"))
        })
        .flatten()
        .map(pg_sys::TimestampTz::from);
    }
}

/// Unique-job keys whose hold has ended, 10,000 a transaction while batches come back full,
/// within the rescue pass budget.
fn expire_keys(bracket: Bracket, out: &mut Outcome) {
    in_batches(bracket, out, "keys", "SELECT pgqueue._expire_dedup_keys(10000)", 10_000, "keys_expired");
}

/// The claim ledger's rows whose messages are all let go, deleted in batches of
/// `CLAIMS_BATCH` rows looked at, within the pass budget: each tick the rows written since
/// the last one looked at (most claims have ended by then; from 0.24.0's SQL on, the cursor
/// stops before a row claimed in the last 10 seconds that is still live, so that the next
/// tick looks at it again), and at the prune cadence
/// (`from_start`) all of them, so that rows held long are looked at once a prune interval,
/// not at every tick.
fn prune_claims(bracket: Bracket, out: &mut Outcome, from_start: bool) {
    thread_local! {
        static CURSOR: std::cell::Cell<i64> = const { std::cell::Cell::new(0) };
    }
    if from_start {
        CURSOR.set(0);
    }
    let start = Instant::now();
    while let Some((looked, pruned, last)) = step(bracket, out, "claims", || {
        let row = Spi::get_three_with_args::<i64, i64, i64>(
            "SELECT looked, pruned, last_claim_id FROM pgqueue._prune_claims($1, $2)",
            &[CURSOR.get().into(), (CLAIMS_BATCH as i32).into()],
        )
        .unwrap_or_else(|e| error!("{e}"));
        (row.0.unwrap_or(0), row.1.unwrap_or(0), row.2)
    }) {
        out.add("claims_pruned", pruned);
        if let Some(last) = last {
            CURSOR.set(last);
        }
        if looked < CLAIMS_BATCH || start.elapsed() >= guc::rescue_pass_budget() {
            break;
        }
    }
}

/// Claim ledger rows a batch of the "claims" step looks at.
const CLAIMS_BATCH: i64 = 1000;

/// Runs `sql` (a batch of at most `batch` rows, returning how many it handled) as step `name`
/// while batches come back full, within the pass budget (the other steps must not starve),
/// adding what each handled to `counter`.
fn in_batches(bracket: Bracket, out: &mut Outcome, name: &'static str, sql: &'static str, batch: i64, counter: &str) {
    let start = Instant::now();
    while let Some(n) = step(bracket, out, name, || one(sql)) {
        out.add(counter, n);
        if n < batch || start.elapsed() >= guc::rescue_pass_budget() {
            break;
        }
    }
}

/// At the first tick of each minute: the events commits counted in shared memory, and the
/// depths, into the minute just ended (`pgqueue._roll_up`). What a failed record drained is
/// carried to the next one (src/rollup.rs).
fn roll_up(bracket: Bracket, out: &mut Outcome) {
    thread_local! {
        static CARRY: std::cell::RefCell<rollup::Carry> = std::cell::RefCell::new(rollup::Carry::default());
    }
    let due = step(bracket, out, "rollup", || {
        Spi::get_one::<bool>("SELECT pgqueue._rollup_due()").unwrap_or_else(|e| error!("{e}")).unwrap_or(false)
    });
    if due != Some(true) {
        return;
    }
    let rows = CARRY.with_borrow_mut(|carry| carry.rows(queue_state::drain_events()));
    let retention = format!("{} minutes", guc::ROLLUP_RETENTION_MIN.get());
    let counts = JsonB(Value::Array(rows));
    let written = step(bracket, out, "rollup", move || {
        Spi::get_one_with_args::<i64>("SELECT pgqueue._roll_up($1, $2::interval)", &[counts.into(), retention.into()])
            .unwrap_or_else(|e| error!("{e}"))
    });
    if written.is_some() {
        CARRY.with_borrow_mut(rollup::Carry::recorded);
        out.rolled_up = true;
    }
}

/// Recounts the dead letters of queues whose count is unknown or due (part of the check of
/// the shared state, counted as "reconcile"): one queue per bracket, since each count locks
/// that queue's history partitions; within a budget, then on at the next tick from the
/// queue after the last one counted (a queue that fails is not counted first every time).
fn count_dead(bracket: Bracket, out: &mut Outcome) {
    thread_local! {
        static LAST: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    // In pgq_tick() the locks of every bracket last until its caller's commit.
    let (budget, most) = (guc::tick_interval() / 10, if bracket.is_transaction() { 1000 } else { 50 });
    let start = Instant::now();
    for queue in LAST.with_borrow(|last| crate::reconcile::dead_due(last)).into_iter().take(most) {
        let counted = step(bracket, out, "reconcile", || crate::reconcile::recount_dead(&queue));
        LAST.set(queue);
        if counted.is_none() || start.elapsed() >= budget {
            break;
        }
    }
}

fn prune_due(bracket: Bracket, out: &mut Outcome) -> bool {
    let interval = guc::prune_interval().as_secs_f64();
    step(bracket, out, "prune", || {
        Spi::get_one_with_args::<bool>(
            "SELECT last_prune_at IS NULL OR now() - last_prune_at >= make_interval(secs => $1)
               FROM pgqueue.worker_state",
            &[interval.into()],
        )
        .unwrap_or_else(|e| error!("{e}"))
        .unwrap_or(false)
    })
    .unwrap_or(false)
}

/// (outcome, partitions, rows removed) per outcome of `pgq_prune()` over all queues.
fn prune() -> Vec<(String, i64, i64)> {
    Spi::connect(|client| {
        client
            .select(
                "SELECT outcome, count(*), coalesce(sum(rows) FILTER (WHERE outcome = 'pruned'), 0)::bigint
                   FROM pgqueue.pgq_prune() GROUP BY outcome",
                None,
                &[],
            )?
            .map(|row| {
                Ok((row.get::<String>(1)?.unwrap_or_default(), row.get(2)?.unwrap_or(0), row.get(3)?.unwrap_or(0)))
            })
            .collect::<Result<Vec<_>, pgrx::spi::Error>>()
    })
    .unwrap_or_else(|e| error!("{e}"))
}

/// Adds the tick's counts to `pgqueue.worker_state`.
fn record(bracket: Bracket, out: &mut Outcome, plan: &Plan, pruned: bool) {
    thread_local! {
        /// The counts of a tick whose record failed, recorded with the next tick's.
        static UNRECORDED: std::cell::RefCell<Option<Map<String, Value>>> = const { std::cell::RefCell::new(None) };
    }
    let mut counts = out.counts.clone();
    counts.insert("ticks".into(), json!(1));
    for (step, _) in &out.failed {
        let key = format!("{step}_failures");
        let n = counts.get(&key).and_then(Value::as_i64).unwrap_or(0);
        counts.insert(key, json!(n + 1));
    }
    counts.insert("tick_failures".into(), json!(out.failed.len()));
    counts.insert("first".into(), json!(plan.first));
    counts.insert("pruned".into(), json!(pruned));
    counts.insert("rolled_up".into(), json!(out.rolled_up));
    counts.insert("tick_interval_ms".into(), json!(guc::TICK_INTERVAL_MS.get()));
    if let Some((step, error)) = out.failed.last() {
        counts.insert("error".into(), json!(format!("{step}: {error}")));
    }
    if let Some(earlier) = UNRECORDED.take() {
        tick_counts::merge(&mut counts, earlier);
    }
    let argument = JsonB(Value::Object(counts.clone()));
    let recorded = step(bracket, out, "record", move || {
        Spi::run_with_args("SELECT pgqueue._record_tick($1)", &[argument.into()]).unwrap_or_else(|e| error!("{e}"))
    });
    if recorded.is_none() {
        let error = out.failed.last().map_or("", |(_, e)| e.as_str());
        tick_counts::record_failed(&mut counts, error);
        UNRECORDED.set(Some(counts));
    }
}

/// Which release's SQL this database runs: until ALTER EXTENSION UPDATE, this library may
/// run an earlier release's, whose commits announce nothing to the shared state (before
/// 0.3.0), which has no schedules (before 0.4.0), no rollups (before 0.12.0) and no count of
/// a queue's dead letters (before 0.13.0), no dependencies (before 0.17.0), no parking
/// (before 0.18.0), no claim ledger (before 0.21.0) and no re-arm of the claims only the
/// ledger holds (before 0.24.0). Known by the functions it has.
const SQL_SHARED_STATE: u8 = 3;
const SQL_SCHEDULES: u8 = 4;
const SQL_ROLLUPS: u8 = 5;
const SQL_DEAD_COUNTS: u8 = 6;
const SQL_DEPENDENCIES: u8 = 7;
const SQL_PARKS: u8 = 8;
const SQL_LEDGER: u8 = 9;
const SQL_LEDGER_CLAIMS: u8 = 10;

/// Pending messages a full tick looks at (one window; the next tick goes on from there).
const PENDING_WINDOW: i32 = 1000;

fn sql_level(bracket: Bracket, out: &mut Outcome) -> u8 {
    thread_local! {
        static LEVEL: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
    }
    if LEVEL.get() < SQL_LEDGER_CLAIMS {
        let level = step(bracket, out, "rearm", || {
            Spi::get_one::<i32>(
                "SELECT CASE WHEN to_regprocedure('pgqueue._rearm_ledger_batch(bigint, integer, text)') IS NOT NULL
                             THEN 10
                             WHEN to_regprocedure('pgqueue._prune_claims(bigint, integer)') IS NOT NULL THEN 9
                             WHEN to_regprocedure('pgqueue._expire_parks(integer)') IS NOT NULL THEN 8
                             WHEN to_regprocedure('pgqueue._finish_dependencies(bigint[], text[], bigint[])') IS NOT NULL
                             THEN 7
                             WHEN to_regprocedure('pgqueue._dead_count(text)') IS NOT NULL THEN 6
                             WHEN to_regprocedure('pgqueue._roll_up(jsonb, interval)') IS NOT NULL THEN 5
                             WHEN to_regprocedure('pgqueue._fire_schedules(integer, timestamptz)') IS NOT NULL THEN 4
                             WHEN to_regprocedure('pgqueue._claimable(text, smallint[])') IS NOT NULL THEN 3
                             ELSE 0 END",
            )
            .unwrap_or_else(|e| error!("{e}"))
            .unwrap_or(0)
        })
        .unwrap_or(0);
        LEVEL.set(level as u8);
    }
    LEVEL.get()
}

/// The dependency step: children handed over, a `window` of pending messages, and with
/// `collect` links left behind (at the prune cadence: it reads the links table).
fn check_pending(bracket: Bracket, out: &mut Outcome, window: Option<i32>, collect: bool) {
    if let Some(n) = step(bracket, out, "dependency", || crate::dependencies::check_pending(window, collect)) {
        out.add("released", n);
    }
}

/// Parked messages whose timeout passed, in batches; with `collect`, park keys no longer in
/// use (at the prune cadence).
fn end_parks(bracket: Bracket, out: &mut Outcome, collect: bool) {
    in_batches(bracket, out, "park", "SELECT pgqueue._expire_parks(1000)", 1_000, "park_timeouts");
    if collect {
        step(bracket, out, "park", || one("SELECT pgqueue._collect_park_keys(10000)"));
    }
}

fn one(sql: &str) -> i64 {
    Spi::get_one::<i64>(sql).unwrap_or_else(|e| error!("{e}")).unwrap_or(0)
}

/// Runs `body` in its bracket; on error, logs a warning, counts the failure, returns None.
fn step<R>(
    bracket: Bracket,
    out: &mut Outcome,
    name: &'static str,
    body: impl FnOnce() -> R + UnwindSafe + RefUnwindSafe,
) -> Option<R> {
    bracket
        .run(body)
        .map_err(|error| {
            warning!("pgqueue: step \"{name}\" failed: {error}");
            out.failed.push((name, error));
        })
        .ok()
}

/// Runs one tick of the background worker's housekeeping in this session: for servers
/// where the library cannot be preloaded (schedule it with pg_cron). Every step runs in a
/// subtransaction; returns the steps that failed (none: an empty result).
#[pg_extern(volatile, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn pgq_tick() -> TableIterator<'static, (name!(step, String), name!(error, String))> {
    let out = run(Bracket::Subtransaction, Plan { all_steps: true, first: false }, &mut Pass::default());
    TableIterator::new(out.failures().iter().map(|(s, e)| (s.to_string(), e.clone())).collect::<Vec<_>>())
}
