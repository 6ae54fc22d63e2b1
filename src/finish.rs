//! Finishing messages: the one statement that moves them out of the hot table into their
//! queue's history (`pgqueue._to_history`, which ack, nack, fail and pgq_ack_claim use).

use crate::dependencies;
use crate::outcome_wait;
use crate::statement::{Statement, has_column, has_history_rows};
use pgrx::AnyArray;
use pgrx::pg_sys::{self, INT8ARRAYOID, JSONBARRAYOID, TEXTOID, UUIDARRAYOID};
use pgrx::prelude::*;

/// With claim tokens, only the claims still held under them move (the fence); without
/// (NULL), the given messages move. With a queue ($5), only that queue's messages move (a
/// message of another queue is left, as a stale token is). Results ($6, jsonb[] beside the
/// ids, or NULL) are kept with the completed ones. A message whose cancel was requested
/// (`$cancelling`) leaves as cancelled whatever finished it (ack, nack, fail, lease end),
/// keeping the cancel's reason as its error and no result, so that rule lives here only.
/// Unique jobs: a finished message's key is free again, or kept for its hold (a cancelled
/// one's is free at once). Announces what left each state (pgqueue._note, applied at commit).
/// Returns each moved message with its outcome, whether children were sent after it
/// (`has_dependents`) and whether it had parents (dependencies.rs takes it from there).
/// `noted` is read in the WHERE clause: an uncorrelated subquery there runs once (an
/// initplan); joined as a FROM item it ran again for every row (quadratic in 0.17.0 and
/// 0.18.0, where `kept` was joined too). `kept`, like every data-modifying CTE, runs to
/// completion unread.
/// Earlier releases' tables lack columns: `$progress`, `$dependents` and `$after` read the
/// message's, and `$kept` and `$values` the history's extra columns, as the layout has them.
macro_rules! to_history {
    ($history:literal, $table:literal, $held:expr, $cancelling:literal, $progress:literal, $dependents:literal, $after:literal, $kept:literal, $values:literal, $ended:literal, $unwritten:literal) => {
        Statement {
            sql: crate::statement::text(concat!(
                    "WITH gone AS (
               DELETE FROM ",
                    $table,
                    " m
                USING unnest($1, $2, $6) AS u(id, token, result)
                WHERE m.msg_id = u.id AND ($2 IS NULL OR ",
                    $held,
                    ")
                  AND ($5::text IS NULL OR m.queue = $5)
               RETURNING m.msg_id, m.queue, CASE WHEN ",
                    $unwritten,
                    " THEN 'claimed' ELSE m.state END AS state, m.priority, m.attempt + (",
                    $unwritten,
                    ")::integer AS attempt, m.payload, m.headers, m.enqueued_at,
                         m.dedup_key, ",
                    $progress,
                    " AS progress, ",
                    $dependents,
                    " AS has_dependents, ",
                    $after,
                    " AS after, ",
                    $ended,
                    " AS ended,
                         CASE WHEN ",
                    $cancelling,
                    " THEN 'cancelled' ELSE $3 END AS outcome,
                         CASE WHEN ",
                    $cancelling,
                    " THEN m.last_error ELSE coalesce($4, m.last_error) END AS last_error,
                         CASE WHEN NOT ",
                    $cancelling,
                    " THEN u.result END AS result
           ), released AS (
               DELETE FROM pgqueue.dedup_keys d USING gone g
                WHERE g.dedup_key IS NOT NULL AND d.queue = g.queue AND d.dedup_key = g.dedup_key
                  AND d.msg_id = g.msg_id AND (d.hold = interval '0' OR g.outcome = 'cancelled')
           ), held AS (
               UPDATE pgqueue.dedup_keys d SET expires_at = pg_catalog.now() + d.hold FROM gone g
                WHERE g.dedup_key IS NOT NULL AND d.queue = g.queue AND d.dedup_key = g.dedup_key
                  AND d.msg_id = g.msg_id AND d.hold > interval '0' AND g.outcome <> 'cancelled'
           ), kept AS (
               INSERT INTO ",
                    $history,
                    " AS h (msg_id, queue, outcome, priority, attempt, payload, headers,
                                            enqueued_at, last_error",
                    $kept,
                    ")
               SELECT g.msg_id, g.queue, g.outcome, g.priority, g.attempt, g.payload, g.headers,
                      g.enqueued_at, g.last_error",
                    $values,
                    "
                 FROM gone g
               RETURNING h.msg_id
           ), noted AS (
               SELECT pgqueue._note(g.queue, count(*), g.state, g.outcome) FROM gone g GROUP BY g.queue, g.state, g.outcome
           )
           SELECT g.msg_id, g.outcome, g.has_dependents, g.after IS NOT NULL, g.ended
             FROM gone g WHERE (SELECT count(*) FROM noted) >= 0 ORDER BY g.msg_id\0"
                )),
            args: &[INT8ARRAYOID, UUIDARRAYOID, TEXTOID, TEXTOID, TEXTOID, JSONBARRAYOID],
        }
    };
}
/// The fence before the claim ledger (0.20.0 and earlier): the row alone.
macro_rules! held_by_row {
    () => {
        "(m.claim_token = u.token AND m.state = 'claimed')"
    };
}
/// The statement on the tables of 0.17.0 and later (dependencies, results, progress), with
/// `$held`, the fence, as the release's SQL has it, and `$history`, the table finished
/// messages go to (pgqueue.history until 0.26.0, then the table behind that view).
macro_rules! to_history_since_0_17 {
    ($table:literal, $held:expr) => {
        to_history_since_0_17!("pgqueue.history", $table, $held, "NULL::integer", "false")
    };
    ($history:literal, $table:literal, $held:expr, $ended:literal, $unwritten:literal) => {
        to_history!(
            $history,
            $table,
            $held,
            "m.cancel_requested_at IS NOT NULL",
            "m.progress",
            "m.has_dependents",
            "m.after",
            ", result, progress, after",
            ", g.result, g.progress, g.after",
            $ended,
            $unwritten
        )
    };
}
/// The fence: the message is held under the token; and (0.22.0 on) for a token the claim
/// ledger issued, the ledger agrees, both ways (ledger.rs; the ledger row looked up in this
/// statement's snapshot). A 'ready' row is as a claim through the ledger leaves it (step 3b
/// of the write path): the ledger alone says whether it is held, and a row it fences is that
/// claim's, one attempt further than the row counts. Returns the number of each claim it
/// ends (for the held set). `$history`: 0.24.0's to 0.25.1's tables name their history's
/// rows pgqueue.history.
macro_rules! to_history_since_0_24 {
    ($history:literal) => {
        to_history_since_0_17!(
            $history,
            "pgqueue.message_rows",
            "CASE WHEN pgqueue._token_claim(u.token) IS NULL THEN m.claim_token = u.token AND m.state = 'claimed'
                  ELSE pgqueue._ledger_agrees(u.token, m.msg_id, m.claims_ended + 1,
                                              CASE WHEN m.state <> 'ready' THEN m.claim_token = u.token AND m.state = 'claimed' END,
                                              (SELECT k.key FROM pgqueue.claim_key k ORDER BY k.made_at, k.key LIMIT 1),
                                              EXISTS (SELECT FROM pgqueue.claims c
                                                       WHERE c.claim_id = pgqueue._token_claim(u.token)))
             END",
            "CASE WHEN (m.state = 'claimed' AND pgqueue._token_claim(m.claim_token) IS NOT NULL)
                       OR (m.state = 'ready' AND $2 IS NOT NULL) THEN m.claims_ended + 1 END",
            "(m.state = 'ready' AND $2 IS NOT NULL)"
        )
    };
}
static TO_HISTORY: Statement = to_history_since_0_24!("pgqueue.history_rows");
static TO_HISTORY_0_25: Statement = to_history_since_0_24!("pgqueue.history");
/// The same for a database still running an earlier release's SQL (until ALTER EXTENSION
/// UPDATE): 0.21.0's ledger counts attempts, and only vouches for what the row holds;
/// 0.20.0's has no claim ledger; 0.16.0's no dependencies; 0.15.0's keeps neither
/// results nor progress; 0.14.0's messages cannot be cancelled. Those up to 0.20.0 name
/// `pgqueue.messages` (the table until 0.19.0, a plain view of it in 0.20.0).
static TO_HISTORY_0_21: Statement = to_history_since_0_17!(
    "pgqueue.message_rows",
    "CASE WHEN m.claim_token IS DISTINCT FROM u.token OR m.state <> 'claimed' THEN false
          WHEN pgqueue._token_claim(u.token) IS NULL THEN true
          ELSE pgqueue._vouched(u.token, m.msg_id, m.attempt,
                                 (SELECT k.key FROM pgqueue.claim_key k ORDER BY k.made_at, k.key LIMIT 1),
                                 EXISTS (SELECT FROM pgqueue.claims c WHERE c.claim_id = pgqueue._token_claim(u.token)))
     END"
);
static TO_HISTORY_0_20: Statement = to_history_since_0_17!("pgqueue.messages", held_by_row!());
static TO_HISTORY_0_16: Statement = to_history!(
    "pgqueue.history",
    "pgqueue.messages",
    held_by_row!(),
    "m.cancel_requested_at IS NOT NULL",
    "m.progress",
    "false",
    "NULL::bigint[]",
    ", result, progress",
    ", g.result, g.progress",
    "NULL::integer",
    "false"
);
static TO_HISTORY_0_15: Statement = to_history!(
    "pgqueue.history",
    "pgqueue.messages",
    held_by_row!(),
    "m.cancel_requested_at IS NOT NULL",
    "NULL::jsonb",
    "false",
    "NULL::bigint[]",
    "",
    "",
    "NULL::integer",
    "false"
);
static TO_HISTORY_0_14: Statement = to_history!(
    "pgqueue.history",
    "pgqueue.messages",
    held_by_row!(),
    "false",
    "NULL::jsonb",
    "false",
    "NULL::bigint[]",
    "",
    "",
    "NULL::integer",
    "false"
);

/// Which release's tables this database has, by the newest table or column each added:
/// catalog cache lookups, no query, so that an ack costs the same.
fn layout() -> &'static Statement {
    if has_history_rows() {
        &TO_HISTORY
    } else if has_column(c"messages", c"claims_ended") {
        &TO_HISTORY_0_25
    } else if has_column(c"claims", c"claim_id") {
        &TO_HISTORY_0_21
    } else if has_column(c"history", c"after") {
        &TO_HISTORY_0_20
    } else if has_column(c"history", c"result") {
        &TO_HISTORY_0_16
    } else if has_column(c"messages", c"cancel_requested_at") {
        &TO_HISTORY_0_15
    } else {
        &TO_HISTORY_0_14
    }
}

/// Moves the messages (bigint[] `msg_ids`, uuid[] `tokens`) to history as `outcome`, inside
/// an SPI connection; returns the ids that moved, in order. `queue`: only that queue's;
/// `results` (jsonb[] beside the ids): what the completed ones keep. Those who wait for
/// their outcome (pgq_result) are woken when this commits. Their children follow
/// (dependencies.rs), and theirs in turn.
pub fn to_history(
    msg_ids: Option<pg_sys::Datum>,
    tokens: Option<pg_sys::Datum>,
    outcome: Option<&str>,
    error: Option<&str>,
    queue: Option<&str>,
    results: Option<pg_sys::Datum>,
) -> Vec<i64> {
    let moved = move_rows(msg_ids, tokens, outcome.into_datum(), error.into_datum(), queue.into_datum(), results);
    let ids = moved.ids.clone();
    dependencies::follow(moved);
    ids
}

/// What one move did, for dependencies.rs.
#[derive(Default)]
pub struct Moved {
    pub ids: Vec<i64>,
    /// Those with children, and how they ended.
    pub parents: Vec<(i64, String)>,
    /// Those that had parents.
    pub children: Vec<i64>,
}

/// One run of the statement (datums as `to_history` takes them).
pub fn move_rows(
    msg_ids: Option<pg_sys::Datum>,
    tokens: Option<pg_sys::Datum>,
    outcome: Option<pg_sys::Datum>,
    error: Option<pg_sys::Datum>,
    queue: Option<pg_sys::Datum>,
    results: Option<pg_sys::Datum>,
) -> Moved {
    let rows = layout().run(&[msg_ids, tokens, outcome, error, queue, results]);
    let mut moved = Moved::default();
    for r in 0..rows.len() {
        let Some(id) = rows.get::<i64>(r, 1) else { continue };
        moved.ids.push(id);
        if rows.get::<bool>(r, 3) == Some(true) {
            moved.parents.push((id, rows.get::<String>(r, 2).unwrap_or_default()));
        }
        if rows.get::<bool>(r, 4) == Some(true) {
            moved.children.push(id);
        }
        if let Some(number) = rows.get::<i32>(r, 5) {
            crate::held::ended(id, number);
        }
    }
    outcome_wait::finished(&moved.ids);
    moved
}

/// `pgqueue._to_history` of every queue (sql/finish.sql; the symbol releases up to 0.13.0 name).
#[pg_extern(sql = false)]
fn _to_history(
    msg_ids: Option<AnyArray>,
    claim_tokens: Option<AnyArray>,
    outcome: Option<&str>,
    error: Option<&str>,
) -> SetOfIterator<'static, i64> {
    _to_history_in(msg_ids, claim_tokens, outcome, error, None)
}

/// `pgqueue._to_history` with a queue (NULL: any): pgq_ack, pgq_nack and pgq_fail given their queue.
#[pg_extern(sql = false)]
fn _to_history_in(
    msg_ids: Option<AnyArray>,
    claim_tokens: Option<AnyArray>,
    outcome: Option<&str>,
    error: Option<&str>,
    queue: Option<&str>,
) -> SetOfIterator<'static, i64> {
    _to_history_with(msg_ids, claim_tokens, outcome, error, queue, None)
}

/// `pgqueue._to_history` with a queue and results (jsonb[] beside the ids, or NULL): pgq_ack.
#[pg_extern(sql = false)]
fn _to_history_with(
    msg_ids: Option<AnyArray>,
    claim_tokens: Option<AnyArray>,
    outcome: Option<&str>,
    error: Option<&str>,
    queue: Option<&str>,
    results: Option<AnyArray>,
) -> SetOfIterator<'static, i64> {
    let (ids, tokens, results) =
        (msg_ids.map(|a| a.datum()), claim_tokens.map(|a| a.datum()), results.map(|a| a.datum()));
    SetOfIterator::new(Spi::connect_mut(|_| to_history(ids, tokens, outcome, error, queue, results)))
}
