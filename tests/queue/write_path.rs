//! What a job costs in row writes, counted (issue 26: the target is at most two a job, from
//! four). Counts, not times: the statistics of one transaction (`pg_stat_get_xact_*`), which
//! no other session's work changes. Each step of the write path's plan
//! (docs/design/write-path.md) lowers the numbers here, and this file says by how much.

use crate::common::{Client, new_queue};
use crate::connect;
use uuid::Uuid;

/// Rows inserted, updated (of which HOT) and deleted by this transaction so far: in the hot
/// table, and in all of history's partitions (found in the catalog: `pg_partition_tree` would
/// lock every queue's partitions until the transaction ends, and block other tests' prunes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Writes {
    inserted: i64,
    updated: i64,
    hot: i64,
    deleted: i64,
    history: i64,
    /// Rows inserted into the claim ledger (`pgqueue.claims`, 0.21.0 on: one a claim call).
    ledger: i64,
}

fn writes(c: &mut impl postgres::GenericClient) -> Writes {
    let r = c
        .query_one(
            "SELECT pg_stat_get_xact_tuples_inserted(t), pg_stat_get_xact_tuples_updated(t),
                    pg_stat_get_xact_tuples_hot_updated(t), pg_stat_get_xact_tuples_deleted(t),
                    (SELECT sum(pg_stat_get_xact_tuples_inserted(h.oid))::bigint FROM pg_class h
                      WHERE h.relnamespace = 'pgqueue'::regnamespace AND h.relkind = 'r'
                        AND h.relname LIKE 'history\\_%'),
                    pg_stat_get_xact_tuples_inserted('pgqueue.claims'::regclass)
               FROM (SELECT 'pgqueue.message_rows'::regclass AS t) x",
            &[],
        )
        .unwrap();
    Writes {
        inserted: r.get(0),
        updated: r.get(1),
        hot: r.get(2),
        deleted: r.get(3),
        history: r.get(4),
        ledger: r.get(5),
    }
}

fn since(before: Writes, after: Writes) -> Writes {
    Writes {
        inserted: after.inserted - before.inserted,
        updated: after.updated - before.updated,
        hot: after.hot - before.hot,
        deleted: after.deleted - before.deleted,
        history: after.history - before.history,
        ledger: after.ledger - before.ledger,
    }
}

const JOBS: i64 = 64;

/// Sends `JOBS` messages in one batch; the writes of the send alone.
fn send(tx: &mut postgres::Transaction, q: &str) -> Writes {
    let before = writes(tx);
    tx.execute("SELECT pgqueue.pgq_send_batch($1, array_fill('{}'::jsonb, ARRAY[$2::int]))", &[&q, &(JOBS as i32)])
        .unwrap();
    since(before, writes(tx))
}

#[test]
fn a_job_costs_four_row_writes_claimed_and_acked_in_two_calls() {
    two_calls(false);
}

/// 0.24.0: with the ledger on, a claim writes its call's ledger row and leaves the message
/// rows as they were (step 3b of the write path): three row writes a job, and one a call.
#[test]
fn with_the_claim_ledger_a_job_costs_three_row_writes_and_one_a_claim_call() {
    two_calls(true);
    one_call(true);
}

/// `SET pgqueue.claim_ledger` as asked (0.21.0: off by default).
fn session(ledger: bool) -> Client {
    let mut c: Client = connect();
    c.batch_execute(&format!("SET pgqueue.claim_ledger = {ledger}")).unwrap();
    c
}

fn two_calls(ledger: bool) {
    let mut c = session(ledger);
    let led = i64::from(ledger);
    let q = new_queue(&mut c, "");
    let mut tx = c.transaction().unwrap();
    let sent = send(&mut tx, &q);
    assert_eq!(sent, Writes { inserted: JOBS, ..Writes::default() }, "a send writes one row a message");

    let before = writes(&mut tx);
    let held: Vec<(i64, Uuid)> = tx
        .query("SELECT msg_id, claim_token FROM pgqueue.pgq_claim($1, $2)", &[&q, &(JOBS as i32)])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(held.len() as i64, JOBS);
    let claimed = since(before, writes(&mut tx));
    assert_eq!(
        claimed,
        Writes { updated: JOBS * (1 - led), ledger: led, ..Writes::default() },
        "a claim writes a new version of each message's row, none of them HOT (the in-flight index), or with \
         the ledger on, one claim ledger row and nothing else"
    );

    let before = writes(&mut tx);
    let (ids, tokens): (Vec<i64>, Vec<Uuid>) = held.into_iter().unzip();
    let acked: i64 = tx
        .query_one("SELECT count(*) FROM pgqueue.pgq_ack($1::bigint[], $2::uuid[])", &[&ids, &tokens])
        .unwrap()
        .get(0);
    assert_eq!(acked, JOBS);
    let finished = since(before, writes(&mut tx));
    assert_eq!(
        finished,
        Writes { deleted: JOBS, history: JOBS, ..Writes::default() },
        "an ack deletes the row and writes it to history"
    );
    let per_job =
        (sent.inserted + claimed.updated + claimed.ledger + finished.deleted + finished.history) as f64 / JOBS as f64;
    // With the ledger, the claim's row write becomes one ledger row a call (step 3b,
    // docs/design/write-path.md); stage 2 is to take the ack's two.
    assert_eq!(per_job, 4.0 - led as f64 + led as f64 / JOBS as f64, "row writes a job (issue 26's target: at most 2)");
    tx.rollback().unwrap();
}

#[test]
fn a_job_costs_four_row_writes_with_the_one_call_consumer() {
    one_call(false);
}

fn one_call(ledger: bool) {
    let mut c = session(ledger);
    let q = new_queue(&mut c, "");
    let mut tx = c.transaction().unwrap();
    send(&mut tx, &q);
    let before = writes(&mut tx);
    // Round one claims all; round two acks them and finds nothing more.
    let held: Vec<(i64, Uuid)> = tx
        .query(
            "SELECT msg_id, claim_token FROM pgqueue.pgq_ack_claim($1, '{}', '{}', $2) WHERE kind = 'claimed'",
            &[&q, &(JOBS as i32)],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(held.len() as i64, JOBS);
    let (ids, tokens): (Vec<i64>, Vec<Uuid>) = held.into_iter().unzip();
    let rows: i64 = tx
        .query_one("SELECT count(*) FROM pgqueue.pgq_ack_claim($1, $2, $3, $4)", &[&q, &ids, &tokens, &(JOBS as i32)])
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "every ack taken (no not_acked row), nothing left to claim");
    let consumed = since(before, writes(&mut tx));
    let led = i64::from(ledger);
    assert_eq!(
        consumed,
        Writes { updated: JOBS * (1 - led), deleted: JOBS, history: JOBS, ledger: led, ..Writes::default() }
    );
    tx.rollback().unwrap();
}
