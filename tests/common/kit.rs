//! The test kit: the one set of queue helpers every test file uses — create a queue, send,
//! claim, ack, read a message's state and its history — with one typed claimed message.
//! Each takes `&mut impl GenericClient`, so a `Client` and a `Transaction` both do. They
//! unwrap: a statement that fails fails the test (tests of errors call the SQL themselves).

use postgres::GenericClient;
use serde_json::{Value, json};
use std::collections::HashMap;
use uuid::Uuid;

/// One message a claim handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimed {
    pub id: i64,
    pub token: Uuid,
    pub attempt: i32,
    pub priority: i16,
}

impl Claimed {
    /// (msg_id, claim_token): what an ack takes.
    pub fn held(&self) -> (i64, Uuid) {
        (self.id, self.token)
    }
}

/// The (msg_id, claim_token) pairs of `claimed`.
pub fn held(claimed: &[Claimed]) -> Vec<(i64, Uuid)> {
    claimed.iter().map(Claimed::held).collect()
}

/// The ids of `claimed`, in the order the claim returned them.
pub fn ids(claimed: &[Claimed]) -> Vec<i64> {
    claimed.iter().map(|m| m.id).collect()
}

/// A new queue no other test uses, created with `pgq_create_queue(name<args>)`; `args` is
/// SQL for the further named arguments, e.g. `", lease => '30 s', max_attempts => 3"` (or "").
pub fn new_queue(c: &mut impl GenericClient, args: &str) -> String {
    let q = super::unique_queue("q");
    create_queue(c, &q, args);
    q
}

/// `pgq_create_queue(q<args>)` for a name the caller chose.
pub fn create_queue(c: &mut impl GenericClient, q: &str, args: &str) {
    c.execute(&format!("SELECT pgqueue.pgq_create_queue($1{args})"), &[&q])
        .unwrap_or_else(|e| panic!("pgq_create_queue({q}{args}): {e}"));
}

/// `pgq_send(q, payload)`; the message's id.
pub fn send(c: &mut impl GenericClient, q: &str, payload: Value) -> i64 {
    c.query_one("SELECT pgqueue.pgq_send($1, $2)", &[&q, &payload]).unwrap().get(0)
}

/// `n` messages `{"i": 0…n-1}` in batches of at most 1,000 (`pgq_send_batch`, `delay` as
/// SQL interval text, "0" for none); their ids in order.
pub fn send_many(c: &mut impl GenericClient, q: &str, n: usize, delay: &str) -> Vec<i64> {
    let mut ids = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let payloads: Vec<Value> = chunk.iter().map(|i| json!({ "i": i })).collect();
        let rows = c
            .query(
                "SELECT * FROM pgqueue.pgq_send_batch($1, $2, delay => $3::text::interval)",
                &[&q, &payloads, &delay],
            )
            .unwrap();
        ids.extend(rows.iter().map(|r| r.get::<_, i64>(0)));
    }
    ids
}

/// `pgq_claim(q, qty, lease)`: what it handed out, in its order. `lease` as SQL interval
/// text, or None for the queue's own.
pub fn claim(c: &mut impl GenericClient, q: &str, qty: i32, lease: Option<&str>) -> Vec<Claimed> {
    try_claim(c, q, qty, lease).unwrap()
}

/// `claim`, with the server's error (for a test that expects some).
pub fn try_claim(
    c: &mut impl GenericClient,
    q: &str,
    qty: i32,
    lease: Option<&str>,
) -> Result<Vec<Claimed>, postgres::Error> {
    let rows = c.query(
        "SELECT msg_id, claim_token, attempt, priority FROM pgqueue.pgq_claim($1, $2, lease => $3::text::interval)",
        &[&q, &qty, &lease],
    )?;
    Ok(rows.iter().map(|r| Claimed { id: r.get(0), token: r.get(1), attempt: r.get(2), priority: r.get(3) }).collect())
}

/// One message claimed from `q`; fails the test if there is none.
pub fn claim_one(c: &mut impl GenericClient, q: &str, lease: Option<&str>) -> Claimed {
    claim(c, q, 1, lease).pop().unwrap_or_else(|| panic!("nothing to claim in {q}"))
}

/// Two messages of `q` claimed in one call, which goes through the claim ledger where the
/// session has it on (a claim that takes one message writes its row: 0.24.2); fails the test
/// if it does not get two.
pub fn claim_two(c: &mut impl GenericClient, q: &str) -> [Claimed; 2] {
    let got = claim(c, q, 2, None);
    <[Claimed; 2]>::try_from(got).unwrap_or_else(|got| panic!("two to claim in {q}, got {got:?}"))
}

/// Claims (1,000 at a time) until `q` hands out nothing more; everything claimed.
pub fn claim_all(c: &mut impl GenericClient, q: &str, lease: Option<&str>) -> Vec<Claimed> {
    let mut all = vec![];
    loop {
        let got = claim(c, q, 1000, lease);
        if got.is_empty() {
            return all;
        }
        all.extend(got);
    }
}

/// `pgq_ack(id, token)` of a claimed message: whether it was acked.
pub fn ack(c: &mut impl GenericClient, m: &Claimed) -> bool {
    ack_by(c, m.id, m.token)
}

/// `pgq_ack(id, token)`: whether it was acked.
pub fn ack_by(c: &mut impl GenericClient, id: i64, token: Uuid) -> bool {
    c.query_one("SELECT pgqueue.pgq_ack($1::bigint, $2::uuid)", &[&id, &token]).unwrap().get(0)
}

/// A message as `pgqueue.messages` has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub state: String,
    pub token: Option<Uuid>,
    pub attempt: i32,
}

/// The message `id` while it is in `pgqueue.messages` (waiting, delayed or claimed); None
/// once it left (finished, or never there).
pub fn message(c: &mut impl GenericClient, id: i64) -> Option<Message> {
    c.query_opt("SELECT state, claim_token, attempt FROM pgqueue.messages WHERE msg_id = $1", &[&id])
        .unwrap()
        .map(|r| Message { state: r.get(0), token: r.get(1), attempt: r.get(2) })
}

/// The state of message `id` in `pgqueue.messages`, or None if it is not there.
pub fn state(c: &mut impl GenericClient, id: i64) -> Option<String> {
    message(c, id).map(|m| m.state)
}

/// A finished message as `pgqueue.history` has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub id: i64,
    pub queue: String,
    pub outcome: String,
    pub attempt: i32,
    pub last_error: Option<String>,
}

impl Finished {
    /// (queue, outcome, attempt).
    pub fn summary(&self) -> (&str, &str, i32) {
        (&self.queue, &self.outcome, self.attempt)
    }

    /// (outcome, attempt, last_error).
    pub fn result(&self) -> (&str, i32, Option<&str>) {
        (&self.outcome, self.attempt, self.last_error.as_deref())
    }
}

const FINISHED: &str = "SELECT msg_id, queue, outcome, attempt, last_error FROM pgqueue.history";

fn finished(r: &postgres::Row) -> Finished {
    Finished { id: r.get(0), queue: r.get(1), outcome: r.get(2), attempt: r.get(3), last_error: r.get(4) }
}

/// Every history row of message `id` (one, once it finished; none before).
pub fn history_of(c: &mut impl GenericClient, id: i64) -> Vec<Finished> {
    c.query(&format!("{FINISHED} WHERE msg_id = $1"), &[&id]).unwrap().iter().map(finished).collect()
}

/// The outcome of message `id` in the history, or None if it has not finished.
pub fn outcome(c: &mut impl GenericClient, id: i64) -> Option<String> {
    c.query_opt("SELECT outcome FROM pgqueue.history WHERE msg_id = $1", &[&id]).unwrap().map(|r| r.get(0))
}

/// The history of queue `q` by msg_id; fails the test if a message finished twice.
pub fn history(c: &mut impl GenericClient, q: &str) -> HashMap<i64, Finished> {
    let mut all = HashMap::new();
    for r in c.query(&format!("{FINISHED} WHERE queue = $1"), &[&q]).unwrap() {
        let f = finished(&r);
        let id = f.id;
        assert!(all.insert(id, f).is_none(), "message {id} finished twice");
    }
    all
}

/// How many history rows queue `q` has.
pub fn history_count(c: &mut impl GenericClient, q: &str) -> i64 {
    count(c, "SELECT count(*) FROM pgqueue.history WHERE queue = $1", q)
}

/// The bigint a one-parameter counting statement (`$1`: a queue name) returns.
pub fn count(c: &mut impl GenericClient, sql: &str, q: &str) -> i64 {
    c.query_one(sql, &[&q]).unwrap().get(0)
}

/// Messages on which the claim ledger and their rows disagree (0.22.0 on), both ways: held
/// under a token the ledger issued that does not sign the message's current claim number
/// (`claims_ended` + 1), or whose ledger row is missing or does not list it so; or listed by
/// a live ledger entry (the message there, its claim number past `claims_ended`) that its row
/// does not hold under that entry's token (a claim ended without being counted, or two live
/// claims); or held under a ledger row that records its grant (0.23.0 on) with another claim
/// time, consumer or session than the row's. Tests with many sessions, rollbacks, kills and restarts end by asserting there are
/// none in their queues; fencing raises XX000 on any it meets.
pub fn ledger_disagreements(c: &mut impl GenericClient, queues: &[&str]) -> Vec<i64> {
    c.query(
        "WITH k AS (SELECT k.key FROM pgqueue.claim_key k ORDER BY k.made_at, k.key LIMIT 1)
         SELECT m.msg_id FROM pgqueue.messages m, k
          WHERE m.queue = ANY ($1) AND m.state = 'claimed' AND pgqueue._token_claim(m.claim_token) IS NOT NULL
            AND (m.claim_token <> pgqueue._claim_token(k.key, pgqueue._token_claim(m.claim_token), m.msg_id,
                                                      m.claims_ended + 1)
                 OR NOT EXISTS (SELECT FROM pgqueue.claims l
                                 WHERE l.claim_id = pgqueue._token_claim(m.claim_token)
                                   AND l.claim_numbers[array_position(l.msg_ids, m.msg_id)] = m.claims_ended + 1
                                   AND (l.lease_expires_at IS NULL
                                        OR (l.claimed_at, l.consumer, l.session_pid, l.session_started)
                                           IS NOT DISTINCT FROM (m.claimed_at, m.consumer, m.session_pid, m.session_started))))
         UNION
         SELECT e.msg_id FROM pgqueue.claims l, unnest(l.msg_ids, l.claim_numbers) AS e(msg_id, number),
                pgqueue.messages m, k
          WHERE l.queue = ANY ($1) AND m.msg_id = e.msg_id AND m.claims_ended < e.number
            AND NOT (m.state = 'claimed'
                     AND m.claim_token IS NOT DISTINCT FROM pgqueue._claim_token(k.key, l.claim_id, e.msg_id, e.number))
          ORDER BY 1",
        &[&queues],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}
/// Where this database's held set (src/held.rs, shadowed) and the rows of `queues` disagree,
/// wherever the set vouches: a claim of the ledger's tokens the set does not list as
/// committed ("missing"), a committed entry of one of their messages (waiting or in history)
/// that is not the row's current claim ("stale"), or one whose lease is not the row's
/// ("lease"). Empty without shared memory. Only meaningful while no claim, renewal or end of
/// these queues is under way. Two races are read past: a rebuild by the tick between the
/// reads of the set's state and of its entries (which would make every claim it added look
/// missing), and a commit that the rows show while its callback has not reached the set yet
/// (an ack still under way makes its entry look stale): what disagrees is read again until
/// the same disagreements are found three times in a row, 50 ms apart.
pub fn held_disagreements(c: &mut impl GenericClient, queues: &[&str]) -> Vec<String> {
    let (mut last, mut same) = (None, 0);
    for _ in 0..40 {
        let before = held_state(c);
        let found = held_disagreements_once(c, queues);
        if held_state(c) != before {
            continue;
        }
        if found.is_empty() {
            return found;
        }
        same = if last.as_ref() == Some(&found) { same + 1 } else { 1 };
        if same == 3 {
            return found;
        }
        last = Some(found);
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    last.unwrap_or_else(|| panic!("the held set was rebuilt during each of 40 reads"))
}

/// The held set's (exact, rebuilds, unknown_from, unknown_to); None without shared memory.
fn held_state(c: &mut impl GenericClient) -> Option<(bool, i64, Option<i64>, Option<i64>)> {
    c.query_opt("SELECT exact, rebuilds, unknown_from, unknown_to FROM pgqueue.held_set", &[])
        .unwrap()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
}

fn held_disagreements_once(c: &mut impl GenericClient, queues: &[&str]) -> Vec<String> {
    c.query(
        "WITH s AS (SELECT * FROM pgqueue.held_set),
              truth AS (SELECT m.msg_id, m.claims_ended + 1 AS number, m.lease_expires_at AS lease
                          FROM pgqueue.messages m
                         WHERE m.queue = ANY ($1) AND m.state = 'claimed'
                           AND pgqueue._token_claim(m.claim_token) IS NOT NULL),
              listed AS (SELECT e.msg_id, e.claim_number AS number, e.lease_expires_at AS lease
                           FROM pgqueue._held_entries() e WHERE e.committed)
         SELECT 'missing ' || t.msg_id || '/' || t.number FROM truth t, s
          WHERE (s.exact OR t.msg_id NOT BETWEEN s.unknown_from AND s.unknown_to)
            AND NOT EXISTS (SELECT FROM listed l WHERE l.msg_id = t.msg_id AND l.number = t.number)
         UNION ALL
         SELECT 'stale ' || l.msg_id || '/' || l.number FROM listed l
          WHERE (EXISTS (SELECT FROM pgqueue.messages m WHERE m.msg_id = l.msg_id AND m.queue = ANY ($1))
                 OR EXISTS (SELECT FROM pgqueue.history h WHERE h.msg_id = l.msg_id AND h.queue = ANY ($1)))
            AND NOT EXISTS (SELECT FROM truth t WHERE t.msg_id = l.msg_id AND t.number = l.number)
         UNION ALL
         SELECT 'lease ' || l.msg_id || '/' || l.number FROM listed l JOIN truth t USING (msg_id, number)
          WHERE l.lease IS DISTINCT FROM t.lease
         ORDER BY 1",
        &[&queues],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// This database's held set: (exact, entries, rebuilds, rebuilds refused, passed over); None
/// without shared memory.
pub fn held_set(c: &mut impl GenericClient) -> Option<(bool, i64, i64, i64, i64)> {
    c.query_opt("SELECT exact, held, rebuilds, rebuilds_refused, passed_over FROM pgqueue.held_set", &[])
        .unwrap()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
}

/// The held set's committed claim numbers of `msg_ids`, in their order (0: not listed).
pub fn held_numbers(c: &mut impl GenericClient, msg_ids: &[i64]) -> Vec<i32> {
    c.query(
        "SELECT coalesce(e.claim_number, 0) FROM unnest($1::bigint[]) WITH ORDINALITY AS i(msg_id, n)
           LEFT JOIN pgqueue._held_entries() e ON e.msg_id = i.msg_id AND e.committed ORDER BY i.n",
        &[&msg_ids],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// Leaves claimed message `id`'s row as a claim through the ledger leaves it (step 3b of the
/// write path): 'ready', the claim's attempt not counted, no claim columns. Only the ledger
/// holds it then.
pub fn as_the_ledger_leaves_it(c: &mut impl GenericClient, id: i64) {
    c.execute(
        "UPDATE pgqueue.message_rows
            SET state = 'ready', attempt = attempt - 1, claim_token = NULL, claimed_at = NULL, consumer = NULL,
                lease_expires_at = NULL, session_pid = NULL, session_started = NULL
          WHERE msg_id = $1 AND state = 'claimed'",
        &[&id],
    )
    .unwrap();
}

/// Writes claim `m` onto its message's row as the claims of 0.22.0 and 0.23.0 did (the row
/// and the ledger; a claim through the ledger now leaves the row as it was): for tests of
/// such claims, which an update leaves in flight. A row a claim wrote already is left alone.
pub fn as_a_row_claim_leaves_it(c: &mut impl GenericClient, m: &Claimed) {
    c.execute(
        "UPDATE pgqueue.message_rows r
            SET state = 'claimed', attempt = v.attempt, claim_token = v.claim_token, claimed_at = v.claimed_at,
                lease_expires_at = v.lease_expires_at, consumer = v.consumer
           FROM pgqueue.messages v
          WHERE r.msg_id = $1 AND v.msg_id = r.msg_id AND r.state = 'ready' AND v.claim_token = $2",
        &[&m.id, &m.token],
    )
    .unwrap();
}

/// (state, attempt, claims_ended, whether the row has a lease) of message `id`'s row.
pub fn message_row(c: &mut impl GenericClient, id: i64) -> Option<(String, i32, i32, bool)> {
    c.query_opt(
        "SELECT state, attempt, claims_ended, lease_expires_at IS NOT NULL FROM pgqueue.message_rows WHERE msg_id = $1",
        &[&id],
    )
    .unwrap()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
}

/// Drops queue `q` with its claims (force), outside a transaction, as a test's cleanup: tried
/// again while other tests' transactions keep the history's table past the drop's lock
/// timeout (55P03; a drop waits for every reader of pgqueue.history, and tests run side by
/// side).
pub fn drop_queue(c: &mut impl GenericClient, q: &str) {
    for attempt in 1.. {
        match c.execute("SELECT pgqueue.pgq_drop_queue($1, force => true)", &[&q]) {
            Ok(_) => return,
            Err(e) if attempt < 5 && e.code() == Some(&postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {}
            Err(e) => panic!("dropping {q}: {e}"),
        }
    }
}
