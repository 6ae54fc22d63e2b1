//! `pgq_cron_next` against Debian cron's meaning, computed apart from the product: thousands of
//! random 5- and 6-field patterns in zones with unusual daylight saving rules, from times
//! around their transitions (tests/cron/reference.py, a brute-force evaluator, and for
//! 5-field patterns also cronsim, a PyPI package that follows Debian's cron).
//!
//! The cases are random: a new seed every run, printed; `PGQUEUE_CRON_SEED=<n>` replays one,
//! `PGQUEUE_CRON_CASES` sets how many (default 3000).

mod common;

use common::connect;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

/// cronsim's known departures from Debian's cron (docs/schedules.md, "Checked against cron"),
/// where its answer is not compared: it reads `a-a/n` as `a-<max>/n`, and in zones whose
/// clocks change by other than a whole hour, or at other than a whole hour, it misses real
/// instants of wildcard jobs. (Where it departs near a clock change at midnight, the reference
/// leaves its answer out.)
fn cronsim_departs(pattern: &str, zone: &str) -> bool {
    let a_a_n = pattern.split([' ', ',']).any(|f| {
        let range = f.split('/').next().unwrap_or("");
        f.contains('/') && range.split_once('-').is_some_and(|(a, b)| a == b)
    });
    a_a_n || ["Australia/Lord_Howe", "Pacific/Chatham"].contains(&zone)
}

#[test]
fn pgq_cron_next_gives_debian_crons_times_for_random_patterns_around_dst_changes() {
    let venv = std::env::var("PGQUEUE_VENV").unwrap_or_else(|_| "/var/cache/pgqueue/venv".into());
    let python = PathBuf::from(&venv).join("bin/python");
    assert!(python.exists(), "{} is missing: run scripts/setup.sh", python.display());
    let seed: u64 = match std::env::var("PGQUEUE_CRON_SEED") {
        Ok(s) => s.parse().expect("PGQUEUE_CRON_SEED: a number"),
        Err(_) => {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
                % 1_000_000_007
        }
    };
    let cases = std::env::var("PGQUEUE_CRON_CASES").unwrap_or_else(|_| "3000".into());
    println!("seed {seed} (replay: PGQUEUE_CRON_SEED={seed}), {cases} cases");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(&python)
        .args(["tests/cron/reference.py", "--seed", &seed.to_string(), "--cases", &cases])
        .current_dir(&root)
        .env("PYTHONTZPATH", "") // zones from the tzdata package, of a known release
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run tests/cron/reference.py");
    assert!(out.status.success(), "reference.py failed: {}", String::from_utf8_lossy(&out.stderr));
    let mut lines =
        std::str::from_utf8(&out.stdout).unwrap().lines().map(|l| serde_json::from_str::<Value>(l).unwrap());
    let meta = lines.next().expect("reference.py's first line");
    assert_eq!(
        meta["tzdata"].as_str(),
        Some(chrono_tz::IANA_TZDB_VERSION),
        "the reference's tz database (tzdata on PyPI, tests/cron/requirements.txt) must be the release \
         compiled into pgqueue (chrono-tz): a difference in a zone's rules is not a cron bug"
    );
    let cases: Vec<Value> = lines.collect();
    assert!(cases.len() >= 1000, "{} cases", cases.len());

    let mut c = connect();
    let (mut wrong, mut wrong_cronsim, mut with_slots, mut by_cronsim) = (vec![], vec![], 0, 0);
    for chunk in cases.chunks(500) {
        let text = |k: &str| chunk.iter().map(|c| c[k].as_str().unwrap().to_string()).collect::<Vec<_>>();
        let after: Vec<i64> = chunk.iter().map(|c| c["after"].as_i64().unwrap()).collect();
        let rows = c
            .query(
                "SELECT array(SELECT extract(epoch FROM t)::bigint
                                FROM pgqueue.pgq_cron_next(p, z, to_timestamp(a), 8) t)
                   FROM unnest($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY AS u(p, z, a, i)
                  ORDER BY i",
                &[&text("pattern"), &text("zone"), &after],
            )
            .unwrap();
        for (case, row) in chunk.iter().zip(rows) {
            let until = case["until"].as_i64().unwrap();
            let ours: Vec<i64> = row.get::<_, Vec<i64>>(0).into_iter().filter(|t| *t <= until).collect();
            let slots = |k: &str| -> Option<Vec<i64>> {
                case.get(k).map(|v| v.as_array().unwrap().iter().map(|t| t.as_i64().unwrap()).collect())
            };
            let (pattern, zone) = (case["pattern"].as_str().unwrap(), case["zone"].as_str().unwrap());
            let reference = slots("slots").unwrap();
            with_slots += usize::from(!reference.is_empty());
            if ours != reference {
                wrong.push(format!(
                    "{pattern:?} in {zone} after {}: ours {ours:?}, reference {reference:?}",
                    case["after"]
                ));
            }
            if let Some(cronsim) = slots("cronsim").filter(|_| !cronsim_departs(pattern, zone)) {
                by_cronsim += 1;
                if ours != cronsim {
                    wrong_cronsim.push(format!(
                        "{pattern:?} in {zone} after {}: ours {ours:?}, cronsim {cronsim:?}",
                        case["after"]
                    ));
                }
            }
        }
    }
    println!(
        "{} cases, {with_slots} with slots in their window, {by_cronsim} also checked against cronsim",
        cases.len()
    );
    assert!(with_slots * 3 >= cases.len(), "too few cases with slots to test anything: {with_slots}");
    let report = |what: &str, v: &[String]| {
        format!(
            "{} of {} differ from {what} (seed {seed}):\n{}",
            v.len(),
            cases.len(),
            v.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
        )
    };
    assert!(wrong.is_empty(), "{}", report("the reference", &wrong));
    assert!(wrong_cronsim.is_empty(), "{}", report("cronsim", &wrong_cronsim));
}
