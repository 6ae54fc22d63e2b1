//! pgqueue-bench: runs the benchmark scenarios against a server that has pgqueue preloaded and
//! created (`--dsn`), or against a throwaway one it starts itself (`--pg-config`).

use clap::Parser;
use pgqueue_bench::{Bench, BloatRun, BloatSample, Dependencies, Mode, Report, Sizes, ThroughputPoint, chart};
use std::path::PathBuf;
use std::process::Command;

#[derive(Parser)]
#[command(about = "Benchmarks pgqueue against a single-table SKIP LOCKED queue, side by side")]
struct Args {
    /// A libpq connection string; the server must preload pgqueue and have the extension.
    #[arg(long, conflicts_with = "pg_config")]
    dsn: Option<String>,
    /// Start a throwaway server from this pg_config's PostgreSQL (pgqueue installed in it).
    #[arg(long)]
    pg_config: Option<PathBuf>,
    /// Scenarios: all, flatness, throughput, rescue, prune, renewals, enqueue, pinned, pickup,
    /// schedules, unique, harness, bytes, cron, console, results, dependencies (comma-separated);
    /// bloat (half an hour at full size) only when named.
    #[arg(long, default_value = "all")]
    scenarios: String,
    /// Tiny sizes (seconds, not minutes).
    #[arg(long)]
    smoke: bool,
    /// Consumer counts of the throughput and harness scenarios (comma-separated), instead of
    /// the size's own (full: 1,4,16,64,256).
    #[arg(long, value_delimiter = ',')]
    consumers: Option<Vec<usize>>,
    /// Harness: the ready depth the producer keeps, its batch size, and the most a consumer
    /// claims per call, instead of the size's own (full: 2000, 100, 32).
    #[arg(long)]
    harness_depth: Option<i64>,
    /// Console: the sizes to measure, as queues:history_rows (comma-separated, smallest
    /// first), instead of the size's own (full: 10:10000,1000:10000000).
    #[arg(long, value_delimiter = ',')]
    console_sizes: Option<Vec<String>>,
    #[arg(long)]
    harness_batch: Option<usize>,
    #[arg(long)]
    harness_qty: Option<i32>,
    /// Harness: one-call (pgq_ack_claim), two-call (pgq_claim, then pgq_ack), or both
    /// (comma-separated; default one-call).
    #[arg(long, value_delimiter = ',')]
    harness_modes: Option<Vec<String>>,
    /// Seconds each throughput, harness and bytes point is measured, instead of the size's own
    /// (full: 10, 10, 15).
    #[arg(long)]
    run_for: Option<f64>,
    /// Seconds each throughput point (and its pgbench) runs unmeasured before its `run_for`:
    /// a fleet past its connections' first touches of the shared buffers (default 0).
    #[arg(long)]
    warm_for: Option<f64>,
    /// Run the throughput sweep this many times (every other one from the largest consumer
    /// count down); each point reports the median of its runs and lists them all.
    #[arg(long)]
    repeat: Option<usize>,
    /// Start the throwaway server with `huge_pages = on`: its shared buffers in 2 MB pages
    /// (the machine must have them reserved: `scripts/bench.sh --huge-pages` does). With 4 kB
    /// pages every backend maps each buffer it touches for the first time itself, which
    /// costs 256 fresh consumers much of the machine (BENCHMARKS.md). Without it: off, even
    /// where the kernel has huge pages reserved, so that runs compare.
    #[arg(long, requires = "pg_config")]
    huge_pages: bool,
    /// A setting of the throwaway server, as `name=value` (repeatable), e.g.
    /// `--set pgqueue.claim_ledger=on`: the same build measured with and without it.
    #[arg(long = "set", requires = "pg_config", value_name = "NAME=VALUE")]
    settings: Vec<String>,
    /// Bloat: minutes the steady run lasts, instead of the size's own (full: 30).
    #[arg(long)]
    bloat_for: Option<f64>,
    /// Where results.json and the charts (flatness.png, throughput.png, throughput-qty1.png) go.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

/// A throwaway PostgreSQL in a temporary directory, run as the postgres user when we are
/// root; stopped and removed on drop.
struct Server {
    dir: PathBuf,
    bindir: PathBuf,
    port: u16,
}

impl Server {
    fn as_server_user(program: PathBuf) -> Command {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let mut c = Command::new("sudo");
            c.args(["-u", "postgres"]).arg(program);
            c
        } else {
            Command::new(program)
        }
    }

    /// `statements`: preload pg_stat_statements too, if that build has it (the pickup
    /// scenario counts statements with it; the others run without it).
    fn start(pg_config: &PathBuf, statements: bool, huge_pages: bool, settings: &[String]) -> Server {
        let config = |what: &str| {
            let out = Command::new(pg_config).arg(what).output().expect("run pg_config");
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        };
        let bindir = config("--bindir");
        let preload = if statements && config("--pkglibdir").join("pg_stat_statements.so").exists() {
            "pgqueue, pg_stat_statements"
        } else {
            "pgqueue"
        };
        let dir = std::env::temp_dir().join(format!("pgqueue-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let _ = Command::new("chown").args(["postgres:", dir.to_str().unwrap()]).status();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let data = dir.join("data");
        let ok = Self::as_server_user(bindir.join("initdb"))
            .args(["-A", "trust", "-U", "postgres", "--no-instructions", "-D"])
            .arg(&data)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "initdb");
        // max_connections: 256 consumers (or pgbench's 256 clients) and the tool's own.
        let conf = format!(
            "port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             shared_preload_libraries = '{preload}'\nshared_buffers = '1GB'\nmax_connections = 320\n\
             max_wal_size = '8GB'\nsynchronous_commit = on\nhuge_pages = {}\n",
            dir.display(),
            if huge_pages { "on" } else { "off" }
        ) + &settings
            .iter()
            .map(|s| match s.split_once('=') {
                Some((name, value)) => format!("{name} = '{}'\n", value.replace('\'', "''")),
                None => panic!("--set {s}: expected NAME=VALUE"),
            })
            .collect::<String>();
        let conf_path = data.join("postgresql.auto.conf");
        let mut existing = Self::as_server_user("cat".into()).arg(&conf_path).output().unwrap().stdout;
        existing.extend_from_slice(conf.as_bytes());
        let tmp = dir.join("auto.conf");
        std::fs::write(&tmp, existing).unwrap();
        Self::as_server_user("cp".into()).arg(&tmp).arg(&conf_path).status().unwrap();
        let ok = Self::as_server_user(bindir.join("pg_ctl"))
            .args(["-w", "-D"])
            .arg(&data)
            .arg("-l")
            .arg(dir.join("server.log"))
            .arg("start")
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "pg_ctl start (log: {})", dir.join("server.log").display());
        let server = Server { dir, bindir, port };
        let mut c = postgres::Client::connect(&server.dsn(), postgres::NoTls).unwrap();
        c.batch_execute("CREATE EXTENSION pgqueue").unwrap();
        server
    }

    fn dsn(&self) -> String {
        format!("host=127.0.0.1 port={} user=postgres dbname=postgres", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Self::as_server_user(self.bindir.join("pg_ctl"))
            .args(["-w", "-m", "fast", "-D"])
            .arg(self.dir.join("data"))
            .arg("stop")
            .stdout(std::process::Stdio::null())
            .status();
        let _ = Self::as_server_user("rm".into()).arg("-rf").arg(&self.dir).status();
    }
}

fn main() {
    let args = Args::parse();
    let scenarios: Vec<&str> = args.scenarios.split(',').map(str::trim).collect();
    let statements = scenarios.iter().any(|s| ["all", "pickup"].contains(s));
    let server =
        args.pg_config.as_ref().map(|pg_config| Server::start(pg_config, statements, args.huge_pages, &args.settings));
    let dsn = match (&args.dsn, &server) {
        (Some(dsn), _) => dsn.clone(),
        (None, Some(s)) => s.dsn(),
        (None, None) => panic!("give --dsn or --pg-config"),
    };
    let mut sizes = if args.smoke { Sizes::smoke() } else { Sizes::full() };
    if let Some(consumers) = args.consumers {
        sizes.consumers.clone_from(&consumers);
        sizes.harness_consumers = consumers;
    }
    if let Some(secs) = args.run_for {
        let d = std::time::Duration::from_secs_f64(secs);
        (sizes.run_for, sizes.harness_for, sizes.bytes_for) = (d, d, d);
    }
    if let Some(depth) = args.harness_depth {
        sizes.harness_depth = depth;
    }
    if let Some(minutes) = args.bloat_for {
        sizes.bloat_for = std::time::Duration::from_secs_f64(minutes * 60.0);
    }
    if let Some(list) = args.console_sizes {
        sizes.console_sizes = list
            .iter()
            .map(|s| {
                let (q, r) = s.split_once(':').expect("--console-sizes: queues:history_rows");
                (q.parse().expect("a number of queues"), r.parse().expect("a number of history rows"))
            })
            .collect();
    }
    if let Some(batch) = args.harness_batch {
        sizes.harness_batch = batch;
    }
    if let Some(qty) = args.harness_qty {
        sizes.harness_qty = qty;
    }
    if let Some(modes) = &args.harness_modes {
        sizes.harness_modes = modes
            .iter()
            .map(|m| {
                Mode::parse(m.trim()).unwrap_or_else(|| panic!("--harness-modes: {m} is neither one-call nor two-call"))
            })
            .collect();
    }
    if let Some(secs) = args.warm_for {
        sizes.warm_for = std::time::Duration::from_secs_f64(secs);
    }
    if let Some(n) = args.repeat {
        sizes.repeat = n.max(1);
    }
    let report = Bench::new(&dsn, sizes, true).run(&scenarios);
    std::fs::create_dir_all(&args.out).unwrap();
    std::fs::write(args.out.join("results.json"), serde_json::to_string_pretty(&report).unwrap()).unwrap();
    if !report.flatness.is_empty() {
        chart::flatness(&args.out.join("flatness.png"), &report.flatness).unwrap();
    }
    if !report.throughput.is_empty() {
        chart::throughput(&args.out.join("throughput.png"), &report.throughput, false).unwrap();
        chart::throughput(&args.out.join("throughput-qty1.png"), &report.throughput, true).unwrap();
    }
    print(&report);
    eprintln!("results in {}", args.out.display());
}

fn print(r: &Report) {
    println!("server: {}", r.server);
    if !r.flatness.is_empty() {
        println!(
            "\nclaim vs in-flight depth\n| system | in flight | delayed | claim p50 µs | claim p99 µs | buffers/claim |\n|---|---|---|---|---|---|"
        );
        for p in &r.flatness {
            println!(
                "| {} | {} | {} | {} | {} | {} |",
                p.system, p.in_flight, p.delayed, p.p50_us, p.p99_us, p.buffers
            );
        }
    }
    if !r.throughput.is_empty() {
        print_throughput(&r.throughput);
    }
    if let Some(s) = &r.rescue {
        println!(
            "\nrescue drain: {} claims in {:.2} s = {:.0}/s; live claim p99 {:.2} ms idle, {:.2} ms draining",
            s.claims, s.seconds, s.claims_per_s, s.live_p99_idle_ms, s.live_p99_draining_ms
        );
    }
    if let Some(p) = &r.prune {
        println!(
            "\nprune: {} rows in {:.3} s = {:.0} rows/s ({}, after {} blocked); longest claim+ack during it {:.2} ms (lock timeout {} ms); history {} -> {} bytes",
            p.rows,
            p.seconds,
            p.rows_per_s,
            p.outcome,
            p.blocked_attempts,
            p.longest_claim_ack_ms,
            p.lock_timeout_ms,
            p.history_bytes_before,
            p.history_bytes_after
        );
        println!(
            "| idle rounds ({:.1} s before) | idle p99 ms | longest round overlapping the prune ms | ÷ idle p99 | longest lock wait, consumers ms | on | longest lock wait, the prune ms | consumers' longest lock wait idle ms | pg_locks samples (every {} ms) |\n|---|---|---|---|---|---|---|---|---|",
            p.idle_seconds, p.lock_sample_ms
        );
        println!(
            "| {} | {:.2} | {:.2} | {:.2}× | {:.2} | {} | {:.2} | {:.2} | {} |",
            p.idle_rounds,
            p.idle_p99_ms,
            p.longest_during_prune_ms,
            p.during_vs_idle_p99,
            p.lock_wait_consumers_ms,
            if p.lock_wait_consumers_on.is_empty() { "-" } else { &p.lock_wait_consumers_on },
            p.lock_wait_prune_ms,
            p.lock_wait_idle_ms,
            p.lock_samples
        );
        println!(
            "\nthe machine's noise: the idle {:.1} s in {} windows as long as the prune, longest round in each: median {:.2} ms ({:.2}× idle p99), max {:.2} ms",
            p.idle_seconds,
            p.idle_windows,
            p.idle_window_longest_median_ms,
            p.idle_window_vs_idle_p99,
            p.idle_window_longest_max_ms
        );
    }
    for h in &r.renewals {
        println!(
            "\nrenewals ({}): {} updates, {} HOT = {:.1} %",
            h.system,
            h.updates,
            h.hot_updates,
            h.hot_ratio * 100.0
        );
    }
    if !r.enqueue.is_empty() {
        println!("\nenqueue\n| method | per call | messages/s |\n|---|---|---|");
        for e in &r.enqueue {
            println!("| {} | {} | {:.0} |", e.method, e.per_call, e.messages_per_s);
        }
    }
    if !r.cron.is_empty() {
        println!(
            "\ncron: next times of a pattern, ns each (median of the rounds; 0.9.0's computation beside)\n| pattern | zone | next times | ns | 0.9.0 ns | ratio |\n|---|---|---|---|---|---|"
        );
        for c in &r.cron {
            println!(
                "| `{}` | {} | {} | {:.0} | {:.0} | {:.2} |",
                c.pattern,
                c.time_zone,
                c.slots,
                c.ns_per_slot,
                c.ns_per_slot_0_9_0,
                c.ns_per_slot / c.ns_per_slot_0_9_0
            );
        }
    }
    if let Some(s) = &r.schedules {
        println!(
            "\nschedules: {} schedules; a tick with none due: p50 {} µs, {} buffers; {} due at once fired in {:.0} ms (tick interval {} ms)",
            s.schedules, s.idle_p50_us, s.idle_buffers, s.due, s.burst_ms, s.tick_interval_ms
        );
        println!(
            "live worker {:.0} s: {} runs of {} slots x schedules, {} duplicates; lateness p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
            s.live_seconds,
            s.live_runs,
            s.live_expected,
            s.live_duplicates,
            s.lateness_p50_ms,
            s.lateness_p99_ms,
            s.lateness_max_ms
        );
    }
    if !r.console.is_empty() {
        println!(
            "\nconsole: each page's GET on loopback (the console in this process)\n| queues | history rows | page | p50 ms | max ms | p50 ÷ smallest |\n|---|---|---|---|---|---|"
        );
        for p in &r.console {
            println!(
                "| {} | {} | {} | {:.1} | {:.1} | {:.2} |",
                p.queues, p.history_rows, p.page, p.p50_ms, p.max_ms, p.of_smallest
            );
        }
    }
    if !r.unique.is_empty() {
        println!("\nunique jobs: single sends, each its own commit\n| keys | messages/s | ÷ no key |\n|---|---|---|");
        for u in &r.unique {
            println!("| {} | {:.0} | {:.2} |", u.case, u.messages_per_s, u.ratio);
        }
    }
    for run in &r.pinned {
        println!(
            "\npinned horizon: {}, {}; {} consumers claiming and acking one at a time, ~{} waiting",
            run.system, run.pin, run.consumers, run.waiting
        );
        println!(
            "| window | jobs/s | claim p50 µs | claim p99 µs | jobs/s ÷ unpinned | p50 ÷ unpinned |\n|---|---|---|---|---|---|"
        );
        let free = &run.windows[0];
        for w in &run.windows {
            println!(
                "| {} {}–{} s | {:.0} | {} | {} | {:.0} % | {:.2} |",
                w.phase,
                w.from_s,
                w.to_s,
                w.jobs_per_s,
                w.claim_p50_us,
                w.claim_p99_us,
                100.0 * w.jobs_per_s / free.jobs_per_s.max(f64::MIN_POSITIVE),
                w.claim_p50_us as f64 / free.claim_p50_us.max(1) as f64
            );
        }
        println!("| table | dead tuples | size |\n|---|---|---|");
        for t in &run.tables {
            println!("| {} | {} | {:.1} MB |", t.when, t.dead_tuples, t.bytes as f64 / 1e6);
        }
        if run.reader_scans > 0 {
            println!("readers: {} scans, {:.1} ms each on average", run.reader_scans, run.reader_scan_ms);
        }
    }
    if let Some(p) = &r.pickup {
        println!("\npickup latency (a send's commit returned -> a claim returned it)");
        println!("| consumers | sent | claimed | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|---|");
        for l in &p.latency {
            println!(
                "| {} | {} | {} | {:.2} | {:.2} | {:.2} |",
                l.consumers, l.sent, l.claimed, l.p50_ms, l.p99_ms, l.max_ms
            );
        }
        let stat = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        println!("\nidle (nothing sent): per consumer per minute");
        println!(
            "| consumers | seconds | pgq_claim calls (client) | pgq_claim calls (pg_stat_statements) | statements inside them | sleeps among those |\n|---|---|---|---|---|---|"
        );
        for i in &p.idle {
            println!(
                "| {} | {:.0} | {:.1} | {} | {} | {} |",
                i.consumers,
                i.seconds,
                i.claims_per_min,
                stat(i.server_claims_per_min),
                stat(i.inner_statements_per_min),
                stat(i.sleeps_per_min)
            );
        }
        println!("\nsends (one producer, single messages, each its own commit)");
        println!("| beside | messages/s | ÷ no consumers | consumed/s |\n|---|---|---|---|");
        for s in &p.sends {
            println!("| {} | {:.0} | {:.0} % | {:.0} |", s.case, s.messages_per_s, s.ratio * 100.0, s.consumed_per_s);
        }
    }
    if let Some(first) = r.results.first() {
        println!(
            "\nresults: {} rounds of {} messages, one for each caller (each its own connection); one finisher claims them and acks them one at a time, each its own commit. Latency: the ack's call returned -> its caller's pgq_result returned it completed",
            first.rounds, first.callers
        );
        println!(
            "| callers | samples | failures | p50 ms | p99 ms | max ms | ack p50 ms |\n|---|---|---|---|---|---|---|"
        );
        for l in &r.results {
            let ms = |v: f64| if l.samples > 0 { format!("{v:.2}") } else { "-".to_string() };
            println!(
                "| {} | {} | {} | {} | {} | {} | {:.2} |",
                l.asking,
                l.samples,
                l.failures,
                ms(l.p50_ms),
                ms(l.p99_ms),
                ms(l.max_ms),
                l.ack_p50_ms
            );
        }
    }
    for b in &r.bloat {
        print_bloat(b);
    }
    if let Some(d) = &r.dependencies {
        print_dependencies(d);
    }
    if let Some(h) = r.harness.first() {
        let baseline_poll = r.harness.iter().find(|h| h.system == "baseline").map_or(0.0, |h| h.empty_wait_ms);
        println!(
            "\nharness: one producer keeps ~{} ready (pgq_send_batch; baseline: one INSERT per batch), in batches of {}; consumers claim up to qty, one-call: pgq_ack_claim (baseline: its delete-ack + claim in one statement), acking with the next call; two-call: pgq_claim, then pgq_ack (baseline: UPDATE, then DELETE); {} ms handler per job in turn; with nothing to claim pgqueue waits in the call (wait {} ms), the baseline sleeps {} ms and polls again. Row writes: inserts, updates and deletes in the system's tables; WAL: the server's",
            h.depth,
            h.batch,
            h.handler_ms,
            r.harness.iter().find(|h| h.system == "pgqueue").map_or(0.0, |h| h.empty_wait_ms),
            baseline_poll
        );
        println!(
            "| system | mode | consumers | qty | jobs/s | ÷ handler bound | sent/s | depth kept p50 / min | ms per send call | empty calls | pickup p50 ms | p95 ms | p99 ms | claiming call p99 ms | row writes / job | WAL bytes / job | dead rows at the end |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for h in &r.harness {
            println!(
                "| {} | {} | {} | {} | {:.0} | {:.0} % | {:.0} | {} / {} | {:.1} | {} of {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {} |",
                h.system,
                h.mode,
                h.consumers,
                h.qty,
                h.jobs_per_s,
                100.0 * h.jobs_per_s / h.handler_bound.max(f64::MIN_POSITIVE),
                h.sent_per_s,
                h.depth_p50,
                h.depth_min,
                h.send_call_ms,
                h.empty_calls,
                h.calls,
                h.pickup_p50_ms,
                h.pickup_p95_ms,
                h.pickup_p99_ms,
                h.call_p99_ms,
                h.row_writes_per_job,
                h.wal_bytes_per_job,
                h.dead_rows
            );
        }
    }
    if let Some(b) = r.bytes.first() {
        println!(
            "\nWAL and table sizes: one producer keeping the depth, {} consumers at full speed, {:.0} s measured (WAL per job: its send, claim and ack; records and FPI from pg_stat_wal, approximate)",
            b.consumers, b.seconds
        );
        println!(
            "| system | mode | qty | jobs/s | WAL B/job | background B/s | net B/job | WAL records/job | FPI | empty calls | hot table start -> end | heap | indexes | history B/job |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        let kb = |b: i64| format!("{:.0} kB", b as f64 / 1024.0);
        for b in &r.bytes {
            let indexes: Vec<String> = b.indexes.iter().map(|i| format!("{} {}", i.name, kb(i.bytes))).collect();
            let history = b
                .history_bytes_start
                .zip(b.history_bytes_end)
                .map_or("-".to_string(), |(s, e)| format!("{:.0}", (e - s) as f64 / b.jobs.max(1) as f64));
            println!(
                "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {} of {} | {} -> {} | {} | {} | {} |",
                b.system,
                b.mode,
                b.qty,
                b.jobs_per_s,
                b.wal_per_job,
                b.background_wal_per_s,
                b.wal_per_job_net,
                b.wal_records_per_job.map_or("-".to_string(), |v| format!("{v:.1}")),
                b.wal_fpi.map_or("-".to_string(), |v| v.to_string()),
                b.empty_calls,
                b.calls,
                kb(b.hot_bytes_start),
                kb(b.hot_bytes_end),
                kb(b.heap_bytes),
                indexes.join(", "),
                history
            );
        }
    }
}

fn print_bloat(b: &BloatRun) {
    println!(
        "\nbloat: {}, {} consumers claiming {} (no handler), at full speed {:.0} jobs/s; the producer held to {:.0} jobs/s (ready capped at {}) for {:.0} s; default autovacuum settings",
        b.system,
        b.consumers,
        b.qty,
        b.max_jobs_per_s,
        b.rate,
        b.depth,
        b.samples.last().map_or(0.0, |s| s.at_s)
    );
    println!(
        "| at s | jobs/s | live rows | dead rows | dead ÷ depth cap | size MB | autovacuums |\n|---|---|---|---|---|---|---|"
    );
    for s in &b.samples {
        println!(
            "| {:.1} | {:.0} | {} | {} | {:.1} | {:.1} | {} |",
            s.at_s,
            s.jobs_per_s,
            s.live,
            s.dead,
            s.dead as f64 / b.depth.max(1) as f64,
            s.bytes as f64 / 1e6,
            s.autovacuums
        );
    }
    let most = |f: fn(&BloatSample) -> i64| b.samples.iter().map(f).max().unwrap_or(0);
    println!(
        "most dead rows {} ({:.1}× the depth cap; the target: at most 2×), largest size {:.1} MB",
        most(|s| s.dead),
        most(|s| s.dead) as f64 / b.depth.max(1) as f64,
        most(|s| s.bytes) as f64 / 1e6
    );
}

fn print_dependencies(d: &Dependencies) {
    println!(
        "\ndependencies: single pgq_send calls, each its own commit, the kinds interleaved call by call on every connection; parents: ready messages, none named twice\n| connections | parents in after | calls | p50 ms | p99 ms | p50 ÷ plain send |\n|---|---|---|---|---|---|"
    );
    for p in &d.sends {
        let parents = if p.parents == 0 { "none (plain send)".to_string() } else { p.parents.to_string() };
        println!(
            "| {} | {} | {} | {:.3} | {:.3} | {:.2}× |",
            p.connections, parents, p.calls, p.p50_ms, p.p99_ms, p.of_plain
        );
    }
    if let Some(first) = d.fan_in.first() {
        println!(
            "\nfan-in: one child sent with after => {} parents, a claim waiting on its queue; {} consumers claim and ack the parents one at a time (claim, then ack, each its own commit). Control: the same consumers acking as many messages without dependents, in the same run. Release: the last parent's ack returned -> the waiting claim returned the child",
            first.parents, first.consumers
        );
        println!(
            "| run | child's send ms | release ms | released by | acks/s | ack p50 ms | ack p99 ms | longest ack ms | control acks/s | control ack p50 ms | control ack p99 ms | control longest ack ms | longest ack ÷ control p99 | consumers seen waiting on a lock (samples) | longest lock wait ms | control: seen waiting (samples) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for f in &d.fan_in {
            println!(
                "| {} | {:.1} | {:.2} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2}× | {} of {} | {:.2}{} | {} of {} |",
                f.run,
                f.child_send_ms,
                f.release_ms,
                f.released_by,
                f.acks as f64 / f.seconds.max(1e-3),
                f.ack_p50_ms,
                f.ack_p99_ms,
                f.ack_max_ms,
                f.control_acks as f64 / f.control_seconds.max(1e-3),
                f.control_ack_p50_ms,
                f.control_ack_p99_ms,
                f.control_ack_max_ms,
                f.ack_max_ms / f.control_ack_p99_ms.max(1e-3),
                f.lock_waiting_samples,
                f.lock_samples,
                f.lock_wait_ms,
                if f.lock_wait_on.is_empty() { String::new() } else { format!(" ({})", f.lock_wait_on) },
                f.control_lock_waiting_samples,
                f.control_lock_samples
            );
        }
        println!(
            "\nack p50 ms over the fan-in: the first tenth of the acks against the last (and the control's)\n| run | first tenth | last tenth | control first tenth | control last tenth |\n|---|---|---|---|---|"
        );
        for f in &d.fan_in {
            println!(
                "| {} | {:.2} | {:.2} | {:.2} | {:.2} |",
                f.run,
                f.ack_p50_first_tenth_ms,
                f.ack_p50_last_tenth_ms,
                f.control_ack_p50_first_tenth_ms,
                f.control_ack_p50_last_tenth_ms
            );
        }
        println!("release p50 over {} runs: {:.2} ms", d.fan_in.len(), d.release_p50_ms);
    }
}

/// Every point, then qty 1 and qty 32 side by side per consumer count.
fn print_throughput(points: &[ThroughputPoint]) {
    let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.0} %", v * 100.0));
    let repeated = points.iter().any(|p| !p.runs.is_empty());
    println!(
        "\nthroughput (claim + ack; one-call: ack + claim in one statement{})\n| system | mode | consumers | qty | jobs/s | p99 ms | ÷ pgbench -N | ÷ best count |{}\n|---|---|---|---|---|---|---|---|{}",
        if repeated { "; medians of the runs" } else { "" },
        if repeated { " runs |" } else { "" },
        if repeated { "---|" } else { "" }
    );
    for p in points {
        let runs: Vec<String> = p.runs.iter().map(|r| format!("{r:.0}")).collect();
        println!(
            "| {} | {} | {} | {} | {:.0} | {:.2} | {} | {:.0} % |{}",
            p.system,
            p.mode,
            p.consumers,
            p.qty,
            p.jobs_per_s,
            p.p99_ms,
            pct(p.of_pgbench),
            p.of_best * 100.0,
            if repeated { format!(" {} |", runs.join(", ")) } else { String::new() }
        );
    }
    let mut counts: Vec<usize> = points.iter().map(|p| p.consumers).collect();
    counts.dedup();
    let find = |system: &str, mode: &str, qty: i32, n: usize| {
        points.iter().find(|p| p.system == system && p.mode == mode && p.qty == qty && p.consumers == n)
    };
    let rate = |p: Option<&ThroughputPoint>| p.map_or("-".to_string(), |p| format!("{:.0}", p.jobs_per_s));
    for qty in [1, 32] {
        println!(
            "\nqty {qty}, jobs/s (÷ best count of that column)\n| consumers | pgqueue two-call | pgqueue one-call | baseline two-call | baseline one-call | pgbench -N tps | pgqueue one-call ÷ pgbench | pgqueue one-call ÷ two-call | pgqueue one-call ÷ baseline one-call |\n|---|---|---|---|---|---|---|---|---|"
        );
        for &n in &counts {
            let cell = |p: Option<&ThroughputPoint>| {
                p.map_or("-".to_string(), |p| format!("{:.0} ({:.0} %)", p.jobs_per_s, p.of_best * 100.0))
            };
            let (two, one) = (find("pgqueue", "two-call", qty, n), find("pgqueue", "one-call", qty, n));
            let (btwo, bone) = (find("baseline", "two-call", qty, n), find("baseline", "one-call", qty, n));
            let ratio = |a: Option<&ThroughputPoint>, b: Option<&ThroughputPoint>| match (a, b) {
                (Some(a), Some(b)) if b.jobs_per_s > 0.0 => format!("{:.2}×", a.jobs_per_s / b.jobs_per_s),
                _ => "-".to_string(),
            };
            println!(
                "| {n} | {} | {} | {} | {} | {} | {} | {} | {} |",
                cell(two),
                cell(one),
                cell(btwo),
                cell(bone),
                rate(find("pgbench -N", "", 0, n)),
                pct(one.and_then(|p| p.of_pgbench)),
                ratio(one, two),
                ratio(one, bone)
            );
        }
    }
}
