//! The claim ledger's SQL side (steps 2 and 3 of the write path: docs/design/write-path.md):
//! tokens issued for a claim's ledger row, and the check that the ledger and the message rows
//! agree on who holds a message. The rows still decide (fencing compares their
//! `claim_token`); the ledger is proven against them, both ways, so that a later release can
//! stop writing the rows. The token's layout and MAC are `claim_token.rs`.

use crate::claim_token::{self, Key};
use pgrx::Uuid;
use pgrx::prelude::*;

pub(crate) fn key(bytes: &[u8]) -> Key {
    match <[u8; 16]>::try_from(bytes) {
        Ok(k) => Key(k),
        Err(_) => error!("pgqueue: the claim key is {} bytes, not 16", bytes.len()),
    }
}

/// The token of `msg_id`'s claim number `attempt` (named so in 0.21.0, whose SQL counted
/// attempts), taken by the ledger row `claim_id` (`key`: the installation's,
/// `pgqueue.claim_key`).
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

/// Fencing's check (0.22.0 on) whenever a token of the ledger's kind meets its message's row
/// (a random token, of a release before 0.21.0 or of `pgqueue.claim_ledger = off`, is the
/// row's word alone). The ledger holds the message under the token if the token verifies for
/// the message's current claim number (`number`: its `claims_ended` + 1) and names a ledger
/// row that exists (`in_ledger`, looked up in the statement's snapshot). The row holds it if
/// it is claimed under the token (`row_holds`); NULL (0.24.0's SQL, for a 'ready' row): the row
/// is as a claim through the ledger leaves it (step 3b of the write path), and the ledger's
/// word decides. Where the two disagree (either way): XX000, never an answer. Otherwise
/// whether the message is held under the token.
#[pg_extern(stable, parallel_safe, cost = 10)]
fn _ledger_agrees(
    token: Option<Uuid>,
    msg_id: Option<i64>,
    number: Option<i32>,
    row_holds: Option<bool>,
    key_bytes: Option<&[u8]>,
    in_ledger: Option<bool>,
) -> bool {
    let (Some(token), Some(msg_id), Some(number)) = (token, msg_id, number) else {
        error!("pgqueue: _ledger_agrees needs a token, a msg_id and a claim number")
    };
    let verifies = key_bytes.is_some_and(|k| claim_token::verify(&key(k), token.as_bytes(), msg_id, number));
    let exists = in_ledger == Some(true);
    let ledger = verifies && exists;
    let Some(row) = row_holds else { return ledger };
    if row != ledger {
        error!(
            "pgqueue: the message rows and the claim ledger disagree on who holds message {msg_id}: its row says \
             it is {} under token {token}; the token {} for claim number {number}, and its ledger row {}",
            if row { "held" } else { "not held" },
            if verifies { "verifies" } else { "does not verify" },
            if exists { "exists" } else { "is missing" }
        );
    }
    row
}
