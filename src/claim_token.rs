//! Claim tokens that name their claim, as pure logic: stage 1 of the write path
//! (docs/design/write-path.md, "Tokens that prove themselves"). Claims issue them and fencing
//! checks them through `ledger.rs`.
//!
//! A token is a version-8 UUID holding the claim's ledger id (48 bits), the attempt (its low
//! 12 bits) and 62 bits of a SipHash-2-4 MAC of (msg_id, claim id, whole attempt) under the
//! installation's secret key. The "attempt" here is the message's claim number since 0.22.0
//! (its `claims_ended` + 1, which never goes back; 0.21.0 used the attempt). An ack, nack,
//! fail, renew or park checks it against the row's current number without reading anything
//! but the claim's ledger row by its id: a token of a claim that has ended, of another
//! message, or made up, does not verify. Tokens stay opaque to users and distinct per message
//! and claim.

use siphasher::sip::SipHasher24;
use std::hash::Hasher;

/// The installation's secret (16 random bytes, created with the extension).
pub struct Key(pub [u8; 16]);

/// Ledger ids above this do not fit a token.
pub const CLAIM_ID_MAX: i64 = (1 << 48) - 1;

fn mac(key: &Key, msg_id: i64, claim_id: i64, attempt: i32) -> u64 {
    let mut h = SipHasher24::new_with_key(&key.0);
    h.write_i64(msg_id);
    h.write_i64(claim_id);
    h.write_i32(attempt);
    h.finish()
}

/// The token of `msg_id`'s `attempt`, taken by the claim whose ledger row is `claim_id`.
pub fn issue(key: &Key, msg_id: i64, claim_id: i64, attempt: i32) -> Option<[u8; 16]> {
    if !(1..=CLAIM_ID_MAX).contains(&claim_id) {
        return None;
    }
    let m = mac(key, msg_id, claim_id, attempt);
    let mut t = [0u8; 16];
    t[..6].copy_from_slice(&claim_id.to_be_bytes()[2..]);
    // Version 8 (custom) in the high nibble of byte 6; the variant (0b10) in byte 8's top bits.
    t[6] = 0x80 | ((attempt >> 8) & 0x0F) as u8;
    t[7] = attempt as u8;
    t[8] = 0x80 | ((m >> 56) & 0x3F) as u8;
    t[9..].copy_from_slice(&m.to_be_bytes()[1..]);
    Some(t)
}

/// The ledger id a token names, if it is laid out as `issue` lays them out.
pub fn claim_id(token: &[u8; 16]) -> Option<i64> {
    if token[6] >> 4 != 8 || token[8] >> 6 != 0b10 {
        return None;
    }
    let mut id = [0u8; 8];
    id[2..].copy_from_slice(&token[..6]);
    Some(i64::from_be_bytes(id)).filter(|id| *id >= 1)
}

/// Whether `token` is the token of `msg_id`'s `attempt` (the attempt its row says is under
/// way: the row's ended attempts + 1).
pub fn verify(key: &Key, token: &[u8; 16], msg_id: i64, attempt: i32) -> bool {
    claim_id(token).and_then(|claim| issue(key, msg_id, claim, attempt)).is_some_and(|t| &t == token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    const KEY: Key = Key(*b"0123456789abcdef");

    #[test]
    fn a_token_names_its_claim_and_is_a_version_8_uuid() {
        let t = issue(&KEY, 42, 7, 3).unwrap();
        assert_eq!(claim_id(&t), Some(7));
        assert_eq!(t[6] >> 4, 8, "version");
        assert_eq!(t[8] >> 6, 0b10, "variant");
        assert!(verify(&KEY, &t, 42, 3));
        assert_eq!(issue(&KEY, 42, 0, 3), None);
        assert_eq!(issue(&KEY, 42, CLAIM_ID_MAX + 1, 3), None);
        assert_eq!(claim_id(&issue(&KEY, 1, CLAIM_ID_MAX, 1).unwrap()), Some(CLAIM_ID_MAX));
    }

    #[test]
    fn a_token_of_another_attempt_message_or_key_does_not_verify() {
        let t = issue(&KEY, 42, 7, 3).unwrap();
        assert!(!verify(&KEY, &t, 42, 4), "an attempt that has ended");
        assert!(!verify(&KEY, &t, 43, 3), "another message");
        assert!(!verify(&Key(*b"fedcba9876543210"), &t, 42, 3), "another installation");
        // The token keeps 12 bits of the attempt; the MAC covers all of it.
        assert!(!verify(&KEY, &t, 42, 3 + 4096));
        assert!(!verify(&KEY, &[0u8; 16], 42, 3));
    }

    #[test]
    fn every_bit_of_a_token_counts() {
        let t = issue(&KEY, 42, 7, 3).unwrap();
        for bit in 0..128 {
            let mut f = t;
            f[bit / 8] ^= 1 << (bit % 8);
            assert!(!verify(&KEY, &f, 42, 3), "bit {bit} flipped still verifies");
        }
    }

    #[test]
    fn tokens_are_distinct_per_message_and_attempt() {
        let mut seen = HashSet::new();
        for msg in 1..=2_000 {
            for attempt in 1..=5 {
                assert!(seen.insert(issue(&KEY, msg, 9, attempt).unwrap()), "({msg}, {attempt})");
            }
        }
    }

    proptest! {
        #[test]
        fn issued_tokens_verify_and_nothing_else_does(
            key in any::<[u8; 16]>(), msg in 1..i64::MAX, claim in 1..=CLAIM_ID_MAX, attempt in 1..1_000_000i32,
            other_msg in 1..i64::MAX, other_attempt in 1..1_000_000i32,
        ) {
            let key = Key(key);
            let t = issue(&key, msg, claim, attempt).unwrap();
            prop_assert_eq!(claim_id(&t), Some(claim));
            prop_assert!(verify(&key, &t, msg, attempt));
            prop_assert_eq!(verify(&key, &t, other_msg, attempt), other_msg == msg);
            prop_assert_eq!(verify(&key, &t, msg, other_attempt), other_attempt == attempt);
        }
    }
}
