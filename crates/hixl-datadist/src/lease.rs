//! Request-scoped block leases: the side that holds a request's KV (the owner, usually
//! prefill) leases the request's blocks to the peer that will pull them (decode). This module
//! is the sans-io part: the grant a puller presents, the owner's table of live leases and its
//! rules, and the frames of the lease protocol. Time comes in as an `Instant`.
//!
//! The protocol rides on served notifies (`Engine::serve_notifies`), whose ack carries the
//! owner's answer:
//!
//! ```text
//!   puller                                   owner
//!   Acquire{lease, gen, ticket, window} ───▶ live lease, right generation, not ending,
//!                                            bound to this link (bound on first use)?
//!                                    ◀─── SUCCESS (ticket held until released or its window
//!                                            passes) / PARAM_INVALID (refused: no byte moves)
//!   READ the leased blocks (one-sided, within the window)
//!   Release{lease, gen, ticket, done} ───▶   ticket dropped, lease extended; `done` ends it
//! ```
//!
//! The owner never reports a lease ended (so the server never reuses its blocks) while a ticket
//! is held, except when the holder's link died: a dead process receives no more bytes. A lease
//! ends when the puller reports done, when its TTL passes without progress (acquire, release,
//! renew), when the puller's link dies, or when the owner revokes it; the end is final, and a
//! later acquire with its id or generation is refused.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::status::{DataDistError, LlmStatus, Result};

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
    /// The puller reported it is done.
    Done,
    /// Its TTL passed without progress.
    Expired,
    /// The puller's link to the owner died (or was closed).
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

/// A lease protocol frame (the message of a [`LEASE_NOTIFY`] notify).
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
        /// [`LeaseGrant::digest`] of the grant the puller holds: a grant whose caches or
        /// blocks were changed (or mixed up with another request's) is refused.
        digest: u64,
    },
    /// Give the ticket back; `done` ends the lease.
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
    /// Bytes of an encoded frame.
    pub const LEN: usize = 37;

    /// `op u8 | lease u64 | gen u64 | ticket u64 | arg u32 | digest u64`, little-endian.
    pub fn encode(&self) -> [u8; Frame::LEN] {
        let (op, lease, gen, ticket, arg, digest) = match *self {
            Frame::Acquire {
                lease,
                gen,
                ticket,
                window_ms,
                digest,
            } => (1u8, lease, gen, ticket, window_ms, digest),
            Frame::Release {
                lease,
                gen,
                ticket,
                done,
            } => (2, lease, gen, ticket, u32::from(done), 0),
            Frame::Renew { lease, gen } => (3, lease, gen, 0, 0, 0),
        };
        let mut b = [0u8; Frame::LEN];
        b[0] = op;
        b[1..9].copy_from_slice(&lease.to_le_bytes());
        b[9..17].copy_from_slice(&gen.to_le_bytes());
        b[17..25].copy_from_slice(&ticket.to_le_bytes());
        b[25..29].copy_from_slice(&arg.to_le_bytes());
        b[29..37].copy_from_slice(&digest.to_le_bytes());
        b
    }

    /// Parses a frame from a peer; `None` for anything malformed (never panics).
    pub fn decode(b: &[u8]) -> Option<Frame> {
        if b.len() != Frame::LEN {
            return None;
        }
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        let mut arg = [0u8; 4];
        arg.copy_from_slice(&b[25..29]);
        let arg = u32::from_le_bytes(arg);
        let (lease, gen, ticket, digest) = (u64_at(1), u64_at(9), u64_at(17), u64_at(29));
        match b[0] {
            1 => Some(Frame::Acquire {
                lease,
                gen,
                ticket,
                window_ms: arg,
                digest,
            }),
            2 if arg <= 1 && digest == 0 => Some(Frame::Release {
                lease,
                gen,
                ticket,
                done: arg == 1,
            }),
            3 if ticket == 0 && arg == 0 && digest == 0 => Some(Frame::Renew { lease, gen }),
            _ => None,
        }
    }
}

/// Why the owner refused a frame (the puller hears `PARAM_INVALID`; this is for the log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No live lease has this id and generation (never granted, ended, or a stale grant).
    NotLive,
    /// The lease is ending (done, expired or revoked) and takes no new pull.
    Ending,
    /// The lease is bound to another link.
    OtherLink,
    /// The grant presented is not the one made (its caches or blocks differ).
    Mismatch,
    /// The frame is malformed.
    Malformed,
}

struct Live {
    grant: LeaseGrant,
    digest: u64,
    ttl: Duration,
    deadline: Instant,
    link: Option<u64>,
    tickets: HashMap<u64, Instant>,
    ending: Option<LeaseEnd>,
}

impl Live {
    fn extend(&mut self, now: Instant) {
        // `ttl` ≤ MAX_TTL; an `Instant` that cannot hold it keeps the deadline it has.
        if let Some(d) = now.checked_add(self.ttl) {
            self.deadline = self.deadline.max(d);
        }
    }
}

/// The owner's live leases.
#[derive(Default)]
pub struct LeaseTable {
    next_id: u64,
    live: HashMap<u64, Live>,
    /// `(cache, block)` → the lease holding it.
    held: HashMap<(i64, u64), u64>,
}

impl LeaseTable {
    /// Leases `blocks` of `caches` for `request_id`, with generation `gen`, under a fresh id.
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID` for no blocks or caches, a zero TTL or one over [`MAX_TTL`], a
    /// block or cache named twice;
    /// `LLM_LEASE_HELD` naming a block a live lease already holds and that lease's request.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &mut self,
        owner: u64,
        request_id: u64,
        caches: &[i64],
        blocks: &[u64],
        ttl: Duration,
        gen: u64,
        now: Instant,
    ) -> Result<LeaseGrant> {
        self.create_as(owner, request_id, caches, blocks, ttl, None, gen, now)
    }

    /// [`LeaseTable::create`] under the lease id `id` when given: for a grant minted ahead by a
    /// coordinator that cannot wait for the owner (a serving engine's scheduler returns the
    /// transfer parameters before the worker that holds the memory runs again). The minter
    /// keeps ids unique and generations random; a pull presented before the lease exists is
    /// refused like one after it ended, and moves no byte.
    ///
    /// # Errors
    /// As [`LeaseTable::create`], and `LLM_PARAM_INVALID` for an id 0, an id a live lease
    /// has, or a generation 0.
    #[allow(clippy::too_many_arguments)]
    pub fn create_as(
        &mut self,
        owner: u64,
        request_id: u64,
        caches: &[i64],
        blocks: &[u64],
        ttl: Duration,
        id: Option<u64>,
        gen: u64,
        now: Instant,
    ) -> Result<LeaseGrant> {
        if let Some(id) = id {
            if id == 0 || self.live.contains_key(&id) {
                return Err(DataDistError::param(format!(
                    "lease id {id} for request {request_id} is {}",
                    if id == 0 { "reserved" } else { "live" }
                )));
            }
            if gen == 0 {
                return Err(DataDistError::param(format!(
                    "lease {id} of request {request_id}: generation 0 is reserved"
                )));
            }
        }
        if blocks.is_empty() || caches.is_empty() {
            return Err(DataDistError::param(format!(
                "a lease of request {request_id} needs blocks and caches, got {} and {}",
                blocks.len(),
                caches.len()
            )));
        }
        if ttl.is_zero() {
            return Err(DataDistError::param(format!(
                "the lease TTL of request {request_id} must be > 0"
            )));
        }
        // Every check (and the deadline's arithmetic) comes before the table changes: a
        // refused lease leaves nothing behind.
        let deadline = now
            .checked_add(ttl)
            .filter(|_| ttl <= MAX_TTL)
            .ok_or_else(|| {
                DataDistError::param(format!(
                "the lease TTL of request {request_id} is {ttl:?} ({} ms); the longest is {} s \
                 (end a lease early with end_lease instead)",
                ttl.as_millis(),
                MAX_TTL.as_secs()
            ))
            })?;
        let mut seen = HashSet::with_capacity(blocks.len());
        if let Some(b) = blocks.iter().find(|&&b| !seen.insert(b)) {
            return Err(DataDistError::param(format!(
                "block {b} is named twice in the lease of request {request_id}"
            )));
        }
        let mut seen = HashSet::with_capacity(caches.len());
        if let Some(c) = caches.iter().find(|&&c| !seen.insert(c)) {
            return Err(DataDistError::param(format!(
                "cache {c} is named twice in the lease of request {request_id}"
            )));
        }
        for &c in caches {
            for &b in blocks {
                if let Some(l) = self.held.get(&(c, b)).and_then(|id| self.live.get(id)) {
                    return Err(DataDistError::new(
                        LlmStatus::LeaseHeld,
                        format!(
                            "block {b} of cache {c} is held by the live lease {} of request {}",
                            l.grant.lease_id, l.grant.request_id
                        ),
                    ));
                }
            }
        }
        let lease_id = match id {
            Some(id) => id,
            None => {
                self.next_id += 1;
                while self.live.contains_key(&self.next_id) || self.next_id == 0 {
                    self.next_id = self.next_id.wrapping_add(1);
                }
                self.next_id
            }
        };
        let grant = LeaseGrant {
            owner,
            lease_id,
            generation: gen,
            request_id,
            caches: caches.to_vec(),
            blocks: blocks.to_vec(),
            ttl_ms: ttl.as_millis().min(u128::from(u64::MAX)) as u64,
        };
        for &c in caches {
            for &b in blocks {
                self.held.insert((c, b), grant.lease_id);
            }
        }
        self.live.insert(
            grant.lease_id,
            Live {
                digest: grant.digest(),
                grant: grant.clone(),
                ttl,
                deadline,
                link: None,
                tickets: HashMap::new(),
                ending: None,
            },
        );
        Ok(grant)
    }

    fn live_mut(&mut self, lease: u64, gen: u64) -> std::result::Result<&mut Live, Refusal> {
        match self.live.get_mut(&lease) {
            Some(l) if l.grant.generation == gen => Ok(l),
            _ => Err(Refusal::NotLive),
        }
    }

    /// Answers a frame from the puller on `link`; leases it ended are returned.
    pub fn on_frame(
        &mut self,
        frame: Option<Frame>,
        link: u64,
        now: Instant,
    ) -> (std::result::Result<(), Refusal>, Vec<EndedLease>) {
        let Some(frame) = frame else {
            return (Err(Refusal::Malformed), Vec::new());
        };
        let r = match frame {
            Frame::Acquire {
                lease,
                gen,
                ticket,
                window_ms,
                digest,
            } => self.live_mut(lease, gen).and_then(|l| {
                if l.ending.is_some() {
                    return Err(Refusal::Ending);
                }
                if digest != l.digest {
                    return Err(Refusal::Mismatch);
                }
                if l.link.is_some_and(|k| k != link) {
                    return Err(Refusal::OtherLink);
                }
                l.link = Some(link);
                let window = Duration::from_millis(u64::from(window_ms)).min(MAX_WINDOW);
                l.tickets
                    .insert(ticket, now.checked_add(window).unwrap_or(now));
                l.extend(now);
                Ok(())
            }),
            Frame::Release {
                lease,
                gen,
                ticket,
                done,
            } => self.live_mut(lease, gen).and_then(|l| {
                if l.link.is_some_and(|k| k != link) {
                    return Err(Refusal::OtherLink);
                }
                l.tickets.remove(&ticket);
                l.extend(now);
                if done && l.ending.is_none() {
                    l.ending = Some(LeaseEnd::Done);
                }
                Ok(())
            }),
            Frame::Renew { lease, gen } => self.live_mut(lease, gen).and_then(|l| {
                if l.link.is_some_and(|k| k != link) {
                    return Err(Refusal::OtherLink);
                }
                l.link = Some(link);
                l.extend(now);
                Ok(())
            }),
        };
        let ended = self.tick(now, |_| true);
        (r, ended)
    }

    /// The owner ends a lease (`Revoked`): at once when no pull holds a ticket, else when the
    /// last one is released or its window passes. `false` for an unknown id.
    pub fn revoke(&mut self, lease: u64) -> bool {
        match self.live.get_mut(&lease) {
            Some(l) => {
                l.ending.get_or_insert(LeaseEnd::Revoked);
                true
            }
            None => false,
        }
    }

    /// Applies time and link liveness: expired leases and tickets, dead links. Returns the
    /// leases that ended.
    pub fn tick(&mut self, now: Instant, alive: impl Fn(u64) -> bool) -> Vec<EndedLease> {
        let mut done = Vec::new();
        for (&id, l) in &mut self.live {
            if l.link.is_some_and(|k| !alive(k)) {
                // A dead puller receives no more bytes: its tickets are void.
                l.tickets.clear();
                l.ending.get_or_insert(LeaseEnd::LinkDown);
            }
            l.tickets.retain(|_, &mut until| until > now);
            if l.ending.is_none() && l.tickets.is_empty() && l.deadline <= now {
                l.ending = Some(LeaseEnd::Expired);
            }
            if l.ending.is_some() && l.tickets.is_empty() {
                done.push(id);
            }
        }
        done.sort_unstable();
        done.into_iter()
            .filter_map(|id| {
                let l = self.live.remove(&id)?;
                for &c in &l.grant.caches {
                    for &b in &l.grant.blocks {
                        self.held.remove(&(c, b));
                    }
                }
                Some(EndedLease {
                    request_id: l.grant.request_id,
                    lease_id: id,
                    caches: l.grant.caches,
                    blocks: l.grant.blocks,
                    why: l.ending.unwrap_or(LeaseEnd::Expired),
                })
            })
            .collect()
    }

    /// The earliest moment [`LeaseTable::tick`] can end something by time alone.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.live
            .values()
            .flat_map(|l| {
                let lease = (l.tickets.is_empty()).then_some(l.deadline);
                l.tickets.values().copied().chain(lease)
            })
            .min()
    }

    /// Whether some live lease is bound to a link (then link liveness must be watched).
    pub fn any_bound(&self) -> bool {
        self.live.values().any(|l| l.link.is_some())
    }

    /// Live leases.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether no lease is live.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// The live lease holding a block of `cache` (with the block), if any.
    pub fn holder(&self, cache: i64, blocks: &[u64]) -> Option<(u64, u64)> {
        blocks.iter().find_map(|&b| {
            let id = self.held.get(&(cache, b))?;
            self.live.get(id).map(|l| (b, l.grant.request_id))
        })
    }

    /// A live lease covering `cache` (with its request), if any.
    pub fn holds_cache(&self, cache: i64) -> Option<u64> {
        self.live
            .values()
            .find(|l| l.grant.caches.contains(&cache))
            .map(|l| l.grant.request_id)
    }
}

#[cfg(test)]
#[path = "lease_tests.rs"]
mod tests;
