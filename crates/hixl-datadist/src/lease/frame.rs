//! The lease protocol's wire format: one frame per [`super::LEASE_NOTIFY`] notify, fixed
//! layouts, little-endian, parsed without trusting the peer.
//!
//! ```text
//!   op 1 acquire          op u8 | lease u64 | gen u64 | ticket u64 | window_ms u32 | digest u64   37 bytes
//!   op 2 release          op u8 | lease u64 | gen u64 | ticket u64 | done u32 (0/1) | 0 u64      37 bytes
//!   op 3 renew            op u8 | lease u64 | gen u64 | 0 u64      | 0 u32          | 0 u64      37 bytes
//!   op 4 acquire shared   the 37 bytes of op 1 (with op 4) | readers u32 (≥ 2)                   41 bytes
//! ```
//!
//! An acquire of a lease read by one puller link is op 1, as before shared leases existed: an
//! owner that knows only ops 1–3 keeps serving pullers that read alone. Op 4 declares how many
//! distinct puller links will read the lease (decode ranks of a larger TP group reading one
//! prefill rank).

/// A lease protocol frame (the message of a [`super::LEASE_NOTIFY`] notify).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Take a ticket to pull within `window_ms`.
    Acquire {
        /// Lease id.
        lease: u64,
        /// Its generation.
        gen: u64,
        /// The puller's ticket number.
        ticket: u64,
        /// How long the pull may take, ms.
        window_ms: u32,
        /// [`super::LeaseGrant::digest`] of the grant the puller holds: a grant whose caches
        /// or blocks were changed (or mixed up with another request's) is refused.
        digest: u64,
        /// How many distinct puller links will read the lease (1: only this one; 0 is taken
        /// as 1). Every acquire of a lease declares the same count.
        readers: u32,
    },
    /// Give the ticket back; `done` says this puller link needs the blocks no more.
    Release {
        /// Lease id.
        lease: u64,
        /// Its generation.
        gen: u64,
        /// The ticket.
        ticket: u64,
        /// The puller needs the blocks no more.
        done: bool,
    },
    /// Progress without a pull: extend the lease.
    Renew {
        /// Lease id.
        lease: u64,
        /// Its generation.
        gen: u64,
    },
}

impl Frame {
    /// Bytes of an encoded frame of ops 1–3 (an acquire read by one link, a release, a renew).
    pub const LEN: usize = 37;

    /// Bytes of an encoded shared acquire (op 4): [`Frame::LEN`] and the reader count.
    pub const SHARED_LEN: usize = Frame::LEN + 4;

    /// The frame's bytes: [`Frame::LEN`] of them, or [`Frame::SHARED_LEN`] for an acquire
    /// declaring 2 readers or more.
    pub fn encode(&self) -> Vec<u8> {
        let (op, lease, gen, ticket, arg, digest, readers) = match *self {
            Frame::Acquire {
                lease,
                gen,
                ticket,
                window_ms,
                digest,
                readers,
            } => {
                // One reader is op 1, what peers without shared leases read.
                let shared = (readers > 1).then_some(readers);
                let op = if shared.is_some() { 4u8 } else { 1 };
                (op, lease, gen, ticket, window_ms, digest, shared)
            }
            Frame::Release {
                lease,
                gen,
                ticket,
                done,
            } => (2, lease, gen, ticket, u32::from(done), 0, None),
            Frame::Renew { lease, gen } => (3, lease, gen, 0, 0, 0, None),
        };
        let mut b = Vec::with_capacity(Frame::SHARED_LEN);
        b.push(op);
        b.extend_from_slice(&lease.to_le_bytes());
        b.extend_from_slice(&gen.to_le_bytes());
        b.extend_from_slice(&ticket.to_le_bytes());
        b.extend_from_slice(&arg.to_le_bytes());
        b.extend_from_slice(&digest.to_le_bytes());
        if let Some(r) = readers {
            b.extend_from_slice(&r.to_le_bytes());
        }
        b
    }

    /// Parses a frame from a peer; `None` for anything malformed (never panics): a length
    /// that is not its op's, an unknown op, a nonzero field an op does not use, a shared
    /// acquire declaring fewer than 2 readers (that is op 1).
    pub fn decode(b: &[u8]) -> Option<Frame> {
        let op = *b.first()?;
        let want = if op == 4 {
            Frame::SHARED_LEN
        } else {
            Frame::LEN
        };
        if b.len() != want {
            return None;
        }
        let u64_at = |i: usize| -> Option<u64> {
            Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?))
        };
        let u32_at = |i: usize| -> Option<u32> {
            Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?))
        };
        let (lease, gen, ticket) = (u64_at(1)?, u64_at(9)?, u64_at(17)?);
        let (arg, digest) = (u32_at(25)?, u64_at(29)?);
        match op {
            1 => Some(Frame::Acquire {
                lease,
                gen,
                ticket,
                window_ms: arg,
                digest,
                readers: 1,
            }),
            2 if arg <= 1 && digest == 0 => Some(Frame::Release {
                lease,
                gen,
                ticket,
                done: arg == 1,
            }),
            3 if ticket == 0 && arg == 0 && digest == 0 => Some(Frame::Renew { lease, gen }),
            4 => match u32_at(Frame::LEN)? {
                readers @ 2.. => Some(Frame::Acquire {
                    lease,
                    gen,
                    ticket,
                    window_ms: arg,
                    digest,
                    readers,
                }),
                _ => None,
            },
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acquire(readers: u32) -> Frame {
        Frame::Acquire {
            lease: 1,
            gen: u64::MAX,
            ticket: 9,
            window_ms: 1000,
            digest: 77,
            readers,
        }
    }

    #[test]
    fn frames_round_trip_and_garbage_is_refused() {
        for f in [
            acquire(1),
            acquire(2),
            acquire(u32::MAX),
            Frame::Release {
                lease: 2,
                gen: 3,
                ticket: 4,
                done: true,
            },
            Frame::Renew { lease: 5, gen: 6 },
        ] {
            assert_eq!(Frame::decode(&f.encode()), Some(f));
        }
        assert_eq!(Frame::decode(&[]), None);
        assert_eq!(Frame::decode(&[1; Frame::LEN - 1]), None);
        assert_eq!(Frame::decode(&[9; Frame::LEN]), None);
        let mut bad = Frame::Release {
            lease: 1,
            gen: 1,
            ticket: 1,
            done: false,
        }
        .encode();
        bad[25] = 2;
        assert_eq!(Frame::decode(&bad), None);
    }

    /// A lease read by one link is the acquire of before shared leases, byte for byte; a
    /// shared one is op 4 with the count after it, and only at its own length.
    #[test]
    fn a_single_reader_acquire_is_op_1_and_a_shared_one_op_4() {
        let one = acquire(1).encode();
        assert_eq!((one.len(), one[0]), (Frame::LEN, 1));
        assert_eq!(acquire(0).encode(), one, "0 readers is 1");
        let two = acquire(3).encode();
        assert_eq!((two.len(), two[0]), (Frame::SHARED_LEN, 4));
        assert_eq!(two[1..Frame::LEN], one[1..]);
        assert_eq!(two[Frame::LEN..], 3u32.to_le_bytes());
        // op 4 at op 1's length, op 1 at op 4's, and op 4 declaring < 2 readers are malformed
        let mut short = two.clone();
        short.truncate(Frame::LEN);
        assert_eq!(Frame::decode(&short), None);
        let mut long = one.clone();
        long.extend_from_slice(&3u32.to_le_bytes());
        assert_eq!(Frame::decode(&long), None);
        for r in [0u32, 1] {
            let mut few = two.clone();
            few[Frame::LEN..].copy_from_slice(&r.to_le_bytes());
            assert_eq!(Frame::decode(&few), None);
        }
    }

    proptest::proptest! {
        /// Any bytes: `decode` never panics, and whatever it accepts encodes back to the same
        /// bytes (one encoding per frame).
        #[test]
        fn random_bytes_never_panic_and_accepted_frames_are_canonical(
            b in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
            op in 0u8..6,
            len in proptest::prop_oneof![
                proptest::strategy::Just(Frame::LEN),
                proptest::strategy::Just(Frame::SHARED_LEN),
                0usize..64
            ],
        ) {
            let mut b = b;
            b.resize(len, 0);
            if let Some(first) = b.first_mut() {
                *first = op;
            }
            if let Some(f) = Frame::decode(&b) {
                proptest::prop_assert_eq!(f.encode(), b);
            }
        }
    }
}
