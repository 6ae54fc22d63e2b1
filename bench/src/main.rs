//! pgqueue-bench: runs the benchmark scenarios against a server that has pgqueue preloaded and
//! created (`--dsn`), or against a throwaway one it starts itself (`--pg-config`).

use clap::Parser;
use pgqueue_bench::{Bench, Report, Sizes, chart};
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
    /// Scenarios: all, flatness, throughput, rescue, prune, renewals, enqueue, pinned, pickup
    /// (comma-separated).
    #[arg(long, default_value = "all")]
    scenarios: String,
    /// Tiny sizes (seconds, not minutes).
    #[arg(long)]
    smoke: bool,
    /// Where results.json and the charts go.
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
    fn start(pg_config: &PathBuf, statements: bool) -> Server {
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
        let conf = format!(
            "port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             shared_preload_libraries = '{preload}'\nshared_buffers = '1GB'\nmax_connections = 200\n\
             max_wal_size = '8GB'\nsynchronous_commit = on\n",
            dir.display()
        );
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
    let server = args.pg_config.as_ref().map(|pg_config| Server::start(pg_config, statements));
    let dsn = match (&args.dsn, &server) {
        (Some(dsn), _) => dsn.clone(),
        (None, Some(s)) => s.dsn(),
        (None, None) => panic!("give --dsn or --pg-config"),
    };
    let sizes = if args.smoke { Sizes::smoke() } else { Sizes::full() };
    let report = Bench::new(&dsn, sizes, true).run(&scenarios);
    std::fs::create_dir_all(&args.out).unwrap();
    std::fs::write(args.out.join("results.json"), serde_json::to_string_pretty(&report).unwrap()).unwrap();
    if !report.flatness.is_empty() {
        chart::flatness(&args.out.join("flatness.png"), &report.flatness).unwrap();
    }
    if !report.throughput.is_empty() {
        chart::throughput(&args.out.join("throughput.png"), &report.throughput).unwrap();
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
        println!("\nthroughput (claim + ack)\n| system | consumers | qty | jobs/s | p99 ms |\n|---|---|---|---|---|");
        for p in &r.throughput {
            println!("| {} | {} | {} | {:.0} | {:.2} |", p.system, p.consumers, p.qty, p.jobs_per_s, p.p99_ms);
        }
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
}
