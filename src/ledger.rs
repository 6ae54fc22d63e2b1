//! The claim ledger's SQL side (step 2 of the write path, "shadow": docs/design/write-path.md):
//! tokens issued for a claim's ledger row, and the check that the ledger vouches for every
//! claim the message rows say is held. The rows still decide (fencing compares their
//! `claim_token`); the ledger is proven against them so that a later release can stop writing
//! the rows. The token's layout and MAC are `claim_token.rs`.

use crate::claim_token::{self, Key};
use pgrx::Uuid;
use pgrx::prelude::*;

fn key(bytes: &[u8]) -> Key {
    match <[u8; 16]>::try_from(bytes) {
        Ok(k) => Key(k),
        Err(_) => error!("pgqueue: the claim key is {} bytes, not 16", bytes.len()),
    }
}

/// The token of `msg_id`'s `attempt`, claimed by the ledger row `claim_id` (`key`: the
/// installation's, `pgqueue.claim_key`).
#[pg_extern(immutable, strict, parallel_safe)]
fn _claim_token(key_bytes: &[u8], claim_id: i64, msg_id: i64, attempt: i32) -> Uuid {
    match claim_token::issue(&key(key_bytes), msg_id, claim_id, attempt) {
        Some(t) => Uuid::from_bytes(t),
        None => error!("pgqueue: claim id {claim_id} does not fit a claim token"),
    }
}

/// The ledger row a token names; NULL for a token the ledger did not issue (one of a release
/// before 0.21.0, or made up).
#[pg_extern(immutable, strict, parallel_safe)]
fn _token_claim(token: Uuid) -> Option<i64> {
    claim_token::claim_id(token.as_bytes())
}

/// Fencing's check of a message held under a token of the ledger's kind (fencing asks only
/// then: a random token, of a release before 0.21.0 or of `pgqueue.claim_ledger = off`, is the
/// row's word alone): the token must verify for the row's attempt and name a ledger row that
/// exists (`in_ledger`, looked up in the statement's snapshot, so that a concurrent ack and
/// prune cannot make it a false alarm). Where it does not, the two records of who holds the
/// message disagree: XX000, never an answer either way. True otherwise.
#[pg_extern(stable, parallel_safe, cost = 10)]
fn _vouched(
    token: Option<Uuid>,
    msg_id: Option<i64>,
    attempt: Option<i32>,
    key_bytes: Option<&[u8]>,
    in_ledger: Option<bool>,
) -> bool {
    let (Some(token), Some(msg_id), Some(attempt)) = (token, msg_id, attempt) else {
        error!("pgqueue: _vouched needs a token, a msg_id and an attempt")
    };
    let verifies = key_bytes.is_some_and(|k| claim_token::verify(&key(k), token.as_bytes(), msg_id, attempt));
    if !verifies || in_ledger != Some(true) {
        error!(
            "pgqueue: message {msg_id} is held under a claim the claim ledger does not vouch for: the row's token \
             {token} {} for attempt {attempt}, and its ledger row {}",
            if verifies { "verifies" } else { "does not verify" },
            if in_ledger == Some(true) { "exists" } else { "is missing" }
        );
    }
    true
}
