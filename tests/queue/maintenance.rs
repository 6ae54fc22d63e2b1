//! Pruning a named queue, with the background worker switched off so that what happens is
//! what these calls did.

use crate::common::{ack, claim, claim_one, prune, queue_with_old_history, send, sqlstate};
use crate::connect;
use serde_json::json;
use std::time::{Duration, Instant};

#[test]
fn prune_drops_partitions_past_retention() {
    let mut c = connect();
    let (q, part) = queue_with_old_history(&mut c, 1000);
    // Today's history stays: it is within the retention.
    send(&mut c, &q, json!({}));
    let m = claim_one(&mut c, &q, None);
    ack(&mut c, &m);

    assert_eq!(prune(&mut c, &q), vec![(part.clone(), "pruned".to_string(), 1000)]);
    let pages: i64 = c.query_one("SELECT pg_relation_size(format('pgqueue.%I', $1::text))", &[&part]).unwrap().get(0);
    assert_eq!(pages, 0, "the whole partition is truncated, not its rows deleted");
    let kept: i64 = c.query_one("SELECT count(*) FROM pgqueue.history WHERE queue = $1", &[&q]).unwrap().get(0);
    assert_eq!(kept, 1, "recent history is kept");
    // The emptied partition goes at the next prune, which has nothing left to remove.
    assert_eq!(prune(&mut c, &q), vec![(format!("history_{q}"), "noop".to_string(), 0)]);
    assert_eq!(regclass(&mut c, &part), None, "the emptied partition is dropped");
    assert_eq!(prune(&mut c, &q), vec![(format!("history_{q}"), "noop".to_string(), 0)]);
}

fn regclass(c: &mut crate::common::Client, part: &str) -> Option<String> {
    c.query_one("SELECT to_regclass(format('pgqueue.%I', $1::text))::text", &[&part]).unwrap().get(0)
}

/// Acks insert through the queue's history into today's partition and hold its lock until
/// they commit. Pruning never waits for them, nor makes them wait: the truncate locks only
/// the old partition, and the drop of an emptied one takes the history's lock only if it is
/// free at once (else a later prune drops it).
#[test]
fn pruning_neither_waits_for_acks_nor_holds_them_up() {
    let mut c = connect();
    let (q, part) = queue_with_old_history(&mut c, 100);
    c.execute("SELECT pgqueue.pgq_send_batch($1, ARRAY['{}', '{}']::jsonb[])", &[&q]).unwrap();
    let held = claim(&mut c, &q, 2, None);
    let mut acker = connect();
    acker.batch_execute("BEGIN").unwrap();
    assert!(ack(&mut acker, &held[0]));
    c.batch_execute("SET pgqueue.prune_lock_timeout = '5s'").unwrap();
    let start = Instant::now();
    assert_eq!(prune(&mut c, &q), vec![(part.clone(), "pruned".to_string(), 100)], "truncated under an open ack");
    assert_eq!(prune(&mut c, &q), vec![(format!("history_{q}"), "noop".to_string(), 0)]);
    assert!(start.elapsed() < Duration::from_secs(4), "pruning waited for the open ack: {:?}", start.elapsed());
    assert!(regclass(&mut c, &part).is_some(), "the emptied partition waits until the history is free");
    // The open ack was not made to wait either: a second ack in its transaction goes through.
    assert!(ack(&mut acker, &held[1]));
    acker.batch_execute("COMMIT").unwrap();
    assert_eq!(prune(&mut c, &q), vec![(format!("history_{q}"), "noop".to_string(), 0)]);
    assert_eq!(regclass(&mut c, &part), None, "dropped once nothing held the history");
    let done: i64 = c.query_one("SELECT count(*) FROM pgqueue.history WHERE queue = $1", &[&q]).unwrap().get(0);
    assert_eq!(done, 2, "both acks are in today's history");
}

#[test]
fn prune_reports_blocked_after_the_lock_timeout_then_pruned() {
    let mut c = connect();
    let (q, part) = queue_with_old_history(&mut c, 10);
    // A reader holds a lock that conflicts with dropping the partition.
    let mut reader = connect();
    reader.batch_execute("BEGIN").unwrap();
    reader.batch_execute(&format!("SELECT count(*) FROM pgqueue.{part}")).unwrap();

    c.batch_execute("SET pgqueue.prune_lock_timeout = '50ms'").unwrap();
    let start = Instant::now();
    let got = prune(&mut c, &q);
    let waited = start.elapsed();
    assert_eq!(got, vec![(part.clone(), "blocked".to_string(), 0)]);
    // Bounded by the lock timeout, not by the reader: generous slack for a loaded machine.
    assert!(waited < Duration::from_secs(5), "prune waited {waited:?} with a 50 ms lock timeout");

    reader.batch_execute("COMMIT").unwrap();
    assert_eq!(prune(&mut c, &q), vec![(part, "pruned".to_string(), 10)]);

    for bad in ["0", "-1"] {
        assert_eq!(sqlstate(c.batch_execute(&format!("SET pgqueue.prune_lock_timeout = {bad}"))), "22023");
    }
}

/// A queue dropped while a prune of it is under way: the prune has truncated one old
/// partition (and holds it) and is blocked on the next, the drop holds the queue's row and
/// waits for the history. The prune's backoff bookkeeping once waited for the queue's row
/// there, and the two deadlocked; it now leaves a queue being dropped alone.
#[test]
fn a_queue_dropped_while_its_prune_is_blocked_is_no_deadlock() {
    let mut c = connect();
    let (q, first) = queue_with_old_history(&mut c, 10);
    c.execute("SELECT pgqueue._ensure_history_day($1, current_date - 4)", &[&q]).unwrap();
    c.execute(
        "INSERT INTO pgqueue.history (msg_id, queue, outcome, priority, attempt, payload, enqueued_at, finished_at)
         SELECT -g, $1, 'completed', 0, 1, '{}', now() - '5 days'::interval, (current_date - 4) + interval '1 hour'
           FROM generate_series(11, 20) g",
        &[&q],
    )
    .unwrap();
    let second: String = c
        .query_one("SELECT format('history_%s$%s', $1::text, to_char(current_date - 4, 'YYYYMMDD'))", &[&q])
        .unwrap()
        .get(0);
    let mut holder = connect();
    holder.batch_execute(&format!("BEGIN; SELECT count(*) FROM pgqueue.\"{second}\"")).unwrap();
    // Whether the session named `name` waits for a lock.
    let waiting = |c: &mut crate::common::Client, name: &str| -> bool {
        c.query_one(
            "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock')",
            &[&name],
        )
        .unwrap()
        .get(0)
    };
    let run = |name: &'static str, setup: &'static str, sql: &'static str, q: String| {
        std::thread::spawn(move || {
            let mut s = connect();
            s.batch_execute(&format!("SET application_name = '{name}'; {setup}")).unwrap();
            s.query(sql, &[&q])
                .map(|rows| rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect::<Vec<(String, String, i64)>>())
                .map_err(|e| format!("{e:?}"))
        })
    };
    let pruner = run(
        "pruner",
        "SET pgqueue.prune_lock_timeout = '3s'",
        "SELECT target, outcome, rows FROM pgqueue.pgq_prune($1)",
        q.clone(),
    );
    let limit = Duration::from_secs(60);
    crate::common::wait_for("the prune blocked on the second partition", limit, || {
        waiting(&mut c, "pruner").then_some(())
    });
    let dropper = run("dropper", "", "SELECT ''::text, ''::text, 0::bigint FROM pgqueue.pgq_drop_queue($1)", q.clone());
    crate::common::wait_for("the drop waiting for the history", limit, || waiting(&mut c, "dropper").then_some(()));
    let pruned = pruner.join().unwrap();
    assert_eq!(
        pruned,
        Ok(vec![(first, "pruned".to_string(), 10), (second, "blocked".to_string(), 0)]),
        "the prune is no deadlock's victim"
    );
    holder.batch_execute("ROLLBACK").unwrap();
    assert_eq!(dropper.join().unwrap().map(|_| ()), Ok(()), "the drop is no deadlock's victim");
    let left: (bool, i64) = c
        .query_one(
            "SELECT to_regclass(format('pgqueue.%I', 'history_' || $1::text)) IS NULL,
                    (SELECT count(*) FROM pgqueue.prune_state WHERE queue = $1)",
            &[&q],
        )
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert_eq!(left, (true, 0), "the queue's history and its backoff are gone");
}

#[test]
fn a_prune_already_running_on_a_queue_is_skipped() {
    let mut c = connect();
    let (q, _) = queue_with_old_history(&mut c, 1);
    let mut other = connect();
    other
        .batch_execute(&format!("BEGIN; SELECT pg_advisory_xact_lock(hashtext('pgqueue.pgq_prune'), hashtext('{q}'))"))
        .unwrap();
    assert_eq!(prune(&mut c, &q)[0].1, "skipped_active");
    other.batch_execute("ROLLBACK").unwrap();
    assert_eq!(prune(&mut c, &q)[0].1, "pruned");
}

/// A restore creates a queue's history partitions, loads them, and indexes them last: while a
/// partition has no index, pruning leaves the queue alone rather than drop what the restore
/// is about to load or index.
#[test]
fn a_history_still_being_restored_is_not_pruned() {
    let mut c = connect();
    let (q, part) = queue_with_old_history(&mut c, 3);
    c.batch_execute(&format!("DROP INDEX pgqueue.\"{part}_dead\"")).unwrap();
    let notices = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
    let mut watched = crate::common::connect_with_notices(notices.clone());
    assert_eq!(prune(&mut watched, &q), vec![(format!("history_{q}"), "skipped_active".to_string(), 0)]);
    let warned = notices.lock().unwrap().iter().any(|n| n.contains(&part) && n.contains("has no index"));
    assert!(warned, "a warning names the partition: {:?}", notices.lock().unwrap());
    let kept: Option<String> =
        c.query_one("SELECT to_regclass(format('pgqueue.%I', $1::text))::text", &[&part]).unwrap().get(0);
    assert!(kept.is_some(), "the partition is still there");
    c.execute("SELECT pgqueue._index_history_part($1)", &[&part]).unwrap();
    assert_eq!(prune(&mut c, &q), vec![(part, "pruned".to_string(), 3)]);
}

/// Every leaf of a queue's history has its own dead-letter index and (since 0.12.0) its BRIN
/// index on msg_id, named after it, however long the queue's name (up to 40 characters).
#[test]
fn every_history_partition_has_its_dead_letter_index() {
    let mut c = connect();
    let q = format!("q{}", "x".repeat(39));
    c.execute("SELECT pgqueue.pgq_create_queue($1, if_not_exists => true)", &[&q]).unwrap();
    let rows = c
        .query(
            "SELECT c.relname::text,
                    array_agg(i.indexrelid::regclass::text || ' ' || am.amname ORDER BY i.indexrelid::regclass::text)
               FROM pg_partition_tree(format('pgqueue.%I', 'history_' || $1::text)::regclass) t
               JOIN pg_class c ON c.oid = t.relid
               LEFT JOIN pg_index i ON i.indrelid = t.relid
               LEFT JOIN pg_class ic ON ic.oid = i.indexrelid
               LEFT JOIN pg_am am ON am.oid = ic.relam
              WHERE t.isleaf GROUP BY 1 ORDER BY 1",
            &[&q],
        )
        .unwrap();
    assert_eq!(rows.len(), 4, "three days and the default partition");
    for r in rows {
        let (leaf, indexes): (String, Vec<String>) = (r.get(0), r.get(1));
        assert_eq!(
            indexes,
            [format!("pgqueue.\"{leaf}_dead\" btree"), format!("pgqueue.\"{leaf}_ids\" brin")],
            "{leaf}"
        );
    }
}

/// Whether this kernel says how much of a file it holds unwritten (`cachestat`, Linux 6.5 and
/// later on x86_64 and aarch64): only then are truncated partitions freed in steps.
fn kernel_says_what_is_unwritten() -> bool {
    if !cfg!(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))) {
        return false;
    }
    let file = std::fs::File::open("/proc/self/exe").unwrap();
    let (range, mut stat) = ([0u64; 2], [0u64; 5]);
    // SAFETY: both buffers are laid out as the kernel's structs and outlive the call.
    unsafe { libc::syscall(451, std::os::fd::AsRawFd::as_raw_fd(&file), range.as_ptr(), stat.as_mut_ptr(), 0) == 0 }
}

/// A partition of many pages is counted exactly (in runs of 64 pages), and its old files are
/// freed in steps at the prune's commit once they are written out.
#[test]
fn a_large_partition_is_counted_exactly_and_freed_in_steps() {
    let notices = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
    let mut c = crate::common::connect_with_notices(notices.clone());
    crate::common::disable_worker();
    let (q, part) = queue_with_old_history(&mut c, 50_000);
    let pages: i64 =
        c.query_one("SELECT pg_relation_size(format('pgqueue.%I', $1::text)) / 8192", &[&part]).unwrap().get(0);
    assert!(pages > 4 * 64, "the partition spans several runs of 64 pages: {pages}");
    let path: String =
        c.query_one("SELECT pg_relation_filepath(format('pgqueue.%I', $1::text))", &[&part]).unwrap().get(0);
    // Read once first: the prune's own count then sets no hint bits, so nothing of the
    // partition is unwritten when its commit frees it (a checkpoint by another test meanwhile
    // could write them out just then).
    c.batch_execute(&format!("SELECT count(*) FROM pgqueue.\"{part}\"; CHECKPOINT; SET client_min_messages = debug1"))
        .unwrap();
    notices.lock().unwrap().clear();
    assert_eq!(prune(&mut c, &q), vec![(part.clone(), "pruned".to_string(), 50_000)]);
    c.batch_execute("RESET client_min_messages").unwrap();
    let said: Vec<String> = notices.lock().unwrap().iter().filter(|n| n.contains(&path)).cloned().collect();
    assert_eq!(said.len(), 1, "one word on the partition's old files: {said:?}");
    if kernel_says_what_is_unwritten() {
        let steps = (pages as u64 * 8192).div_ceil(2 << 20);
        assert_eq!(said[0], format!("pgqueue: {path} freed in {steps} steps"));
    } else {
        assert!(said[0].contains("left to PostgreSQL"), "{said:?}");
    }
    let kept: i64 = c.query_one("SELECT count(*) FROM pgqueue.history WHERE queue = $1", &[&q]).unwrap().get(0);
    assert_eq!(kept, 0);
}

/// Freeing in steps touches only files that a commit deletes. Randomized: tables whose files
/// are noted or not, truncated or not, in savepoints rolled back or not, in transactions
/// committed or rolled back. After each round every table holds exactly the rows it should
/// (counted from its files: a file cut short shows as missing pages), and every committed
/// truncate of a noted table was freed (or left to PostgreSQL).
#[test]
fn freeing_in_steps_touches_only_what_a_commit_deletes() {
    let notices = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
    let mut c = crate::common::connect_with_notices(notices.clone());
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    let mut rng = seed;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    const TABLES: usize = 6;
    let fill = |c: &mut crate::common::Client, t: usize| {
        c.batch_execute(&format!(
            "INSERT INTO free_steps_{t} SELECT g, repeat('x', 200) FROM generate_series(1, 12000) g"
        ))
        .unwrap();
    };
    for t in 0..TABLES {
        c.batch_execute(&format!(
            "DROP TABLE IF EXISTS free_steps_{t}; CREATE TABLE free_steps_{t} (id int, pad text)"
        ))
        .unwrap();
        fill(&mut c, t);
    }
    let mut rows = [12_000i64; TABLES];
    let mut freed = 0;
    for round in 0..16 {
        c.batch_execute("CHECKPOINT; SET client_min_messages = debug1; BEGIN").unwrap();
        notices.lock().unwrap().clear();
        let commit = next(4) != 0;
        let mut truncated = [false; TABLES];
        let mut noted_paths = vec![];
        for (t, done) in truncated.iter_mut().enumerate() {
            let table = format!("free_steps_{t}");
            if next(3) != 0 {
                let path: String =
                    c.query_one("SELECT pg_relation_filepath($1::text::regclass)", &[&table]).unwrap().get(0);
                c.execute("SELECT pgqueue._free_in_steps($1::text::regclass)", &[&table]).unwrap();
                noted_paths.push((t, path));
            }
            match next(3) {
                0 => {}
                1 => {
                    c.batch_execute(&format!("SAVEPOINT s; TRUNCATE {table}; ROLLBACK TO SAVEPOINT s")).unwrap();
                }
                _ => {
                    c.batch_execute(&format!("SAVEPOINT s; TRUNCATE {table}; RELEASE SAVEPOINT s")).unwrap();
                    *done = true;
                }
            }
        }
        c.batch_execute(if commit { "COMMIT" } else { "ROLLBACK" }).unwrap();
        c.batch_execute("RESET client_min_messages").unwrap();
        let said = notices.lock().unwrap().clone();
        for (t, path) in &noted_paths {
            let words = said.iter().filter(|n| n.contains(path.as_str())).count();
            let deleted = commit && truncated[*t];
            assert_eq!(words, usize::from(deleted), "seed {seed}, round {round}, table {t}: {said:?}");
            freed += said.iter().filter(|n| n.contains(path.as_str()) && n.contains("freed in")).count();
        }
        for (t, n) in rows.iter_mut().enumerate() {
            if commit && truncated[t] {
                *n = 0;
            }
            let (count, pages): (i64, i64) = {
                let r = c
                    .query_one(
                        &format!("SELECT count(*), pg_relation_size('free_steps_{t}') / 8192 FROM free_steps_{t}"),
                        &[],
                    )
                    .unwrap();
                (r.get(0), r.get(1))
            };
            assert_eq!(count, *n, "seed {seed}, round {round}: table {t} lost rows");
            assert_eq!(pages == 0, *n == 0, "seed {seed}, round {round}: table {t} has {pages} pages");
            if *n == 0 {
                fill(&mut c, t);
                *n = 12_000;
            }
        }
    }
    if kernel_says_what_is_unwritten() {
        assert!(freed > 0, "seed {seed}: some truncated table was freed in steps");
    }
    for t in 0..TABLES {
        c.batch_execute(&format!("DROP TABLE free_steps_{t}")).unwrap();
    }
}

/// Functions planned with `enable_seqscan` off are planned with `jit` off too: where no index
/// serves a scan, the setting's cost penalty crosses `jit_above_cost`, and a server built with
/// LLVM compiled the worker's recount of three small queues for 0.6 s at every tick.
#[test]
fn functions_planned_without_seq_scans_are_planned_without_jit() {
    let mut c = connect();
    let names = |c: &mut crate::common::Client, with_jit_off: bool| -> Vec<String> {
        c.query(
            "SELECT proname::text FROM pg_proc
              WHERE pronamespace = 'pgqueue'::regnamespace AND 'enable_seqscan=off' = ANY (proconfig)
                AND ('jit=off' = ANY (proconfig)) = $1
              ORDER BY 1",
            &[&with_jit_off],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    };
    assert_eq!(names(&mut c, false), Vec::<String>::new(), "planned without seq scans, with jit");
    let planned = names(&mut c, true);
    for f in ["_claimable", "_depth", "_expire_orphaned_claims", "_rearm_ledger_batch"] {
        assert!(planned.contains(&f.to_string()), "{f} not planned without seq scans: {planned:?}");
    }
}
