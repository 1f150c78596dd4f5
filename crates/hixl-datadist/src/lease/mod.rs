//! Request-scoped block leases: the side that holds a request's KV (the owner, usually
//! prefill) leases the request's blocks to the peer or peers that will pull them (decode).
//! This module is the sans-io part: the grant a puller presents, the owner's table of live
//! leases and its rules ([`LeaseTable`]), and the frames of the lease protocol ([`Frame`]).
//! Time comes in as an `Instant`.
//!
//! The protocol rides on served notifies (`Engine::serve_notifies`), whose ack carries the
//! owner's answer:
//!
//! ```text
//!   puller                                   owner
//!   Acquire{lease, gen, ticket, window,      live lease, right generation, not ending, the
//!           readers} ───────────────────▶   reader count it was first acquired with, this
//!                                            link bound or room for it (bound on first use)?
//!                                    ◀─── SUCCESS (ticket held until released or its window
//!                                            passes) / PARAM_INVALID (refused: no byte moves)
//!   READ the leased blocks (one-sided, within the window)
//!   Release{lease, gen, ticket, done} ───▶   ticket dropped, lease extended; `done` from
//!                                            every reader link ends it
//! ```
//!
//! A lease is read by one puller link, or by `readers` distinct links when the pullers say so
//! (the decode ranks of a larger TP group that each read part of one prefill rank's heads);
//! the owner's grant is the same either way.
//!
//! The owner never reports a lease ended (so the server never reuses its blocks) while a ticket
//! is held, except the tickets of a link that died: a dead process receives no more bytes. A
//! lease ends when every reader link reported done, when its TTL passes without progress
//! (acquire, release, renew), when a reader link dies before it reported done, or when the
//! owner revokes it; the end is final, and a later acquire with its id or generation is
//! refused.

use std::time::Duration;

use serde::{Deserialize, Serialize};

mod frame;
mod table;

#[cfg(test)]
mod model;

pub use frame::Frame;
pub use table::{LeaseTable, Refusal};

/// Name of the served notifies that carry the lease protocol.
pub const LEASE_NOTIFY: &str = "hixl.kv.lease";

/// A ticket's window is capped at this, whatever the puller asks.
pub const MAX_WINDOW: Duration = Duration::from_secs(600);

/// The longest lease TTL (time without progress before a lease expires): one day. A longer
/// one (`Duration::MAX` as "forever", a TTL in milliseconds that does not fit an `Instant`)
/// is refused with `LLM_PARAM_INVALID` naming it: a lease is meant to end, and an owner that
/// wants one to last does so by ending it (`end_lease`) instead of by its TTL.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// What the owner hands the puller (out of band, e.g. in a serving engine's per-request
/// transfer parameters; it is `serde`-serializable): which blocks of which caches are leased,
/// under which id and generation, for how long without progress.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseGrant {
    /// The owner's cluster id.
    pub owner: u64,
    /// The lease's id at the owner (never reused by that owner instance).
    pub lease_id: u64,
    /// The lease's generation, random per lease: a grant from before a restart or a reuse
    /// never matches a live lease.
    pub generation: u64,
    /// The request the blocks belong to.
    pub request_id: u64,
    /// The owner's cache ids the lease covers (the same block ids in each).
    pub caches: Vec<i64>,
    /// The leased block ids.
    pub blocks: Vec<u64>,
    /// Time without progress after which the lease expires, in milliseconds.
    pub ttl_ms: u64,
}

impl LeaseGrant {
    /// FNV-1a over the caches and blocks, in order: what an acquire presents so the owner
    /// can tell the grant is the one it made.
    pub fn digest(&self) -> u64 {
        let words = self
            .caches
            .iter()
            .map(|&c| c as u64)
            .chain([u64::MAX])
            .chain(self.blocks.iter().copied());
        words.fold(0xcbf2_9ce4_8422_2325, |h, w| {
            w.to_le_bytes()
                .iter()
                .fold(h, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3))
        })
    }
}

/// Why a lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeaseEnd {
    /// The puller (every reader link of a shared lease) reported it is done.
    Done,
    /// Its TTL passed without progress.
    Expired,
    /// The puller's link to the owner died (or was closed); for a shared lease, a reader
    /// link that had not reported done.
    LinkDown,
    /// The owner ended it (`end_lease`: the request was aborted).
    Revoked,
}

/// An ended lease, as the owner's stream reports it: its blocks are free to reuse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndedLease {
    /// The request.
    pub request_id: u64,
    /// The lease's id.
    pub lease_id: u64,
    /// The caches it covered.
    pub caches: Vec<i64>,
    /// Its blocks.
    pub blocks: Vec<u64>,
    /// Why it ended.
    pub why: LeaseEnd,
}
