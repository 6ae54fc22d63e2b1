//! Every benchmark scenario at tiny sizes, against the test cluster: the bench tool keeps
//! compiling and working. Nothing here asserts a time.

use crate::common;

use pgqueue_bench::{Bench, Sizes};

#[test]
fn every_scenario_runs_at_tiny_sizes() {
    let _turn = common::file_turn(file!());
    common::connect();
    let dsn = common::dsn();
    let report = Bench::new(&dsn, Sizes::smoke(), false).run(&["all", "bloat"]);

    let sizes = Sizes::smoke();
    assert_eq!(report.flatness.len(), 2 * (sizes.depths.len() + 1), "each depth, for both systems");
    assert!(report.flatness.iter().all(|p| p.buffers > 0 && p.p50_us > 0));
    // Per consumer count: 2 systems x 2 batch sizes x 2 modes (two calls, one call), plus pgbench.
    assert_eq!(report.throughput.len(), 9 * sizes.consumers.len());
    assert!(report.throughput.iter().filter(|p| p.system != "pgbench -N").all(|p| p.jobs_per_s > 0.0));
    assert_eq!(report.throughput.iter().filter(|p| p.mode == "one-call").count(), 4 * sizes.consumers.len());
    assert!(report.throughput.iter().filter(|p| p.jobs_per_s > 0.0).all(|p| p.of_best > 0.0 && p.of_best <= 1.0));
    // The smoke size runs the sweep twice: every point lists both runs, and reports the
    // upper of the two (the median of an even count).
    for p in &report.throughput {
        assert_eq!(p.runs.len(), sizes.repeat, "{} {} {}", p.system, p.mode, p.consumers);
        assert_eq!(p.jobs_per_s, p.runs.iter().copied().fold(f64::MIN, f64::max));
    }
    let rescue = report.rescue.expect("rescue ran");
    assert_eq!(rescue.claims, sizes.rescue_claims);
    assert!(rescue.claims_per_s > 0.0);
    let prune = report.prune.expect("prune ran");
    assert_eq!((prune.outcome.as_str(), prune.rows), ("pruned", sizes.prune_rows));
    assert!(prune.history_bytes_after < prune.history_bytes_before);
    assert!(prune.idle_rounds > 0 && prune.idle_p99_ms > 0.0 && prune.longest_during_prune_ms > 0.0);
    assert!(prune.lock_samples > 0);
    assert_eq!(report.renewals.len(), 2);
    assert!(report.renewals.iter().all(|r| r.updates >= sizes.renewals));
    assert_eq!(report.enqueue.len(), 4);
    assert!(report.enqueue.iter().all(|e| e.messages_per_s > 0.0));
    // Two ways of pinning the horizon and the readers' control, for both systems; the queue
    // table before, at the end of the pin and after.
    assert_eq!(report.pinned.len(), 6);
    assert!(report.pinned.iter().all(|r| r.windows[0].jobs_per_s > 0.0 && r.tables.len() == 3));
    let pickup = report.pickup.expect("pickup ran");
    assert!(pickup.latency.iter().all(|l| l.sent > 0 && l.claimed > 0));
    assert!(pickup.idle.iter().all(|i| i.claims_per_min > 0.0));
    assert_eq!(pickup.sends.len(), 4);
    assert!(pickup.sends.iter().all(|s| s.messages_per_s > 0.0));
    let schedules = report.schedules.expect("schedules ran");
    assert_eq!(schedules.burst_fired, sizes.schedules_due, "every due schedule fired once");
    assert!(schedules.idle_buffers > 0 && schedules.live_runs > 0);
    assert_eq!(schedules.live_duplicates, 0);
    // Waiting and polling callers each saw every message completed; the acks alone, none.
    assert_eq!(report.results.len(), 3);
    let every = (sizes.result_callers * sizes.result_rounds) as u64;
    assert!(report.results[..2].iter().all(|r| r.samples == every && r.failures == 0), "{:?}", report.results);
    assert!(report.results.iter().all(|r| r.ack_p50_ms > 0.0));
    // Dependencies: per connection count, a plain send and one per number of parents; each
    // fan-in's child released and claimed, every parent acked, beside its control.
    let deps = report.dependencies.expect("dependencies ran");
    assert_eq!(deps.sends.len(), sizes.dep_send_connections.len() * (1 + sizes.dep_send_parents.len()));
    assert!(
        deps.sends.iter().all(|p| p.calls == (p.connections * sizes.dep_send_calls) as u64 && p.p50_ms > 0.0),
        "{:?}",
        deps.sends
    );
    assert_eq!(deps.fan_in.len(), sizes.fan_in_runs);
    assert!(
        deps.fan_in.iter().all(|f| f.acks == sizes.fan_in_parents as u64
            && f.control_acks == f.acks
            && f.ack_max_ms >= f.ack_p50_ms
            && f.child_send_ms > 0.0
            && f.lock_samples > 0
            && f.control_lock_samples > 0),
        "{:?}",
        deps.fan_in
    );
    assert_eq!(report.unique.len(), 3);
    assert!(report.unique.iter().all(|u| u.messages_per_s > 0.0));
    // Per consumer count, both systems; what the consumers acked, and when they claimed it.
    assert_eq!(report.harness.len(), 2 * sizes.harness_modes.len() * sizes.harness_consumers.len());
    assert!(report.harness.iter().all(|h| h.jobs_per_s > 0.0 && h.sent_per_s > 0.0 && h.pickup_p99_ms > 0.0));
    // Every job wrote WAL (row writes come from statistics that lag by up to a second, more
    // than a smoke window); the producer kept some depth.
    assert!(report.harness.iter().all(|h| h.wal_bytes_per_job > 0.0));
    assert!(
        report.harness.iter().all(|h| h.depth_p50 > 0),
        "{:?}",
        report.harness.iter().map(|h| h.depth_p50).collect::<Vec<_>>()
    );
    // 2 systems x 2 batch sizes x 2 modes.
    assert_eq!(report.bytes.len(), 8);
    // Bloat: both systems, the producer held below what it did at full speed, samples of a
    // table that has rows.
    assert_eq!(report.bloat.iter().map(|b| b.system.as_str()).collect::<Vec<_>>(), ["pgqueue", "baseline"]);
    for b in &report.bloat {
        assert!(
            b.max_jobs_per_s > 0.0 && b.rate < b.max_jobs_per_s,
            "{} at {} of {}",
            b.system,
            b.rate,
            b.max_jobs_per_s
        );
        assert!(b.samples.len() >= 2 && b.samples.iter().all(|s| s.bytes > 0), "{}", b.system);
        assert!(b.samples.iter().any(|s| s.jobs_per_s > 0.0), "{}", b.system);
    }
    assert!(report.bytes.iter().all(|b| b.jobs > 0 && b.wal_per_job > 0.0 && b.hot_bytes_end > 0 && b.heap_bytes > 0));
    assert!(report.bytes.iter().all(|b| (b.system == "pgqueue") == b.history_bytes_end.is_some()));
    // Every page of the console at each size, each answered.
    assert_eq!(report.console.len(), 6 * sizes.console_sizes.len());
    assert!(report.console.iter().all(|p| p.p50_ms > 0.0 && p.max_ms >= p.p50_ms));
    assert_eq!(report.cron.len(), 6);
    assert!(report.cron.iter().all(|c| c.slots == sizes.cron.0 && c.ns_per_slot > 0.0 && c.ns_per_slot_0_9_0 > 0.0));
}
