//! The owner's table of live leases: which blocks each holds, which puller links read it,
//! the tickets out, and when it ends (the rules of [`super`]'s protocol, frame by frame and
//! tick by tick).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::frame::Frame;
use super::{EndedLease, LeaseEnd, LeaseGrant, MAX_TTL, MAX_WINDOW};
use crate::status::{DataDistError, LlmStatus, Result};

/// Why the owner refused a frame (the puller hears `PARAM_INVALID`; this is for the log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No live lease has this id and generation (never granted, ended, or a stale grant).
    NotLive,
    /// The lease is ending (done, expired or revoked) and takes no new pull.
    Ending,
    /// The lease is bound to other links, as many as its readers.
    OtherLink,
    /// The acquire declares another reader count than the lease's first acquire did.
    ReaderCount,
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
    /// How many distinct links read the lease, as its first acquire declared (`None`
    /// before one: room for one link).
    readers: Option<u32>,
    /// The puller links bound to the lease, at most `readers`.
    links: Vec<u64>,
    /// The bound links that reported done.
    done: HashSet<u64>,
    /// Tickets out, `(link, ticket)` → the end of their window.
    tickets: HashMap<(u64, u64), Instant>,
    ending: Option<LeaseEnd>,
}

impl Live {
    fn extend(&mut self, now: Instant) {
        // `ttl` ≤ MAX_TTL; an `Instant` that cannot hold it keeps the deadline it has.
        if let Some(d) = now.checked_add(self.ttl) {
            self.deadline = self.deadline.max(d);
        }
    }

    /// Whether `link` may speak for the lease: bound, or room to bind it among `readers`.
    fn admits(&self, link: u64, readers: u32) -> std::result::Result<(), Refusal> {
        if self.links.contains(&link) || self.links.len() < readers.max(1) as usize {
            Ok(())
        } else {
            Err(Refusal::OtherLink)
        }
    }

    /// Binds `link` (admitted first).
    fn bind(&mut self, link: u64, readers: u32) -> std::result::Result<(), Refusal> {
        self.admits(link, readers)?;
        if !self.links.contains(&link) {
            self.links.push(link);
        }
        Ok(())
    }

    /// The reader count so far (1 before an acquire declared one).
    fn readers(&self) -> u32 {
        self.readers.unwrap_or(1)
    }
}

/// The owner's live leases.
#[derive(Default)]
pub struct LeaseTable {
    next_id: u64,
    live: HashMap<u64, Live>,
    /// `(cache, block)` → the lease holding it.
    held: HashMap<(i64, u64), u64>,
    /// How long past its window a ticket whose link is alive is still held: the puller's
    /// parts still in flight at its deadline resolve (it quiesces before it releases) within
    /// the time a dead link takes to be noticed.
    grace: Duration,
}

impl LeaseTable {
    /// An empty table whose tickets are held `grace` past their window while their link is
    /// alive (see [`LeaseTable::grace`]).
    pub fn with_grace(grace: Duration) -> LeaseTable {
        LeaseTable {
            grace: grace.min(MAX_WINDOW),
            ..LeaseTable::default()
        }
    }

    /// How long past its window a ticket is held while its puller's link is alive; then the
    /// lease may end although the puller never released it (a puller that hangs).
    pub fn grace(&self) -> Duration {
        self.grace
    }

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
                readers: None,
                links: Vec::new(),
                done: HashSet::new(),
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
        let grace = self.grace;
        let r = match frame {
            Frame::Acquire {
                lease,
                gen,
                ticket,
                window_ms,
                digest,
                readers,
            } => self.live_mut(lease, gen).and_then(|l| {
                // A link that reported done needs the blocks no more: it takes no new pull.
                if l.ending.is_some() || l.done.contains(&link) {
                    return Err(Refusal::Ending);
                }
                if digest != l.digest {
                    return Err(Refusal::Mismatch);
                }
                let readers = readers.max(1);
                if l.readers.is_some_and(|n| n != readers) {
                    return Err(Refusal::ReaderCount);
                }
                l.bind(link, readers)?;
                l.readers = Some(readers);
                let window = Duration::from_millis(u64::from(window_ms)).min(MAX_WINDOW) + grace;
                l.tickets
                    .insert((link, ticket), now.checked_add(window).unwrap_or(now));
                l.extend(now);
                Ok(())
            }),
            Frame::Release {
                lease,
                gen,
                ticket,
                done,
            } => self.live_mut(lease, gen).and_then(|l| {
                let readers = l.readers();
                l.admits(link, readers)?;
                l.tickets.remove(&(link, ticket));
                l.extend(now);
                if done {
                    // A link's done counts once; the lease is done when every reader's is in.
                    l.bind(link, readers)?;
                    l.done.insert(link);
                    if l.done.len() >= readers as usize && l.ending.is_none() {
                        l.ending = Some(LeaseEnd::Done);
                    }
                }
                Ok(())
            }),
            Frame::Renew { lease, gen } => self.live_mut(lease, gen).and_then(|l| {
                let readers = l.readers();
                l.bind(link, readers)?;
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
            let dead: Vec<u64> = l.links.iter().copied().filter(|&k| !alive(k)).collect();
            if !dead.is_empty() {
                // A dead puller receives no more bytes: its tickets are void. A reader that
                // died before it was done ends the lease (the others' pulls in flight finish
                // first); one that was done leaves it to the others.
                l.tickets.retain(|(k, _), _| !dead.contains(k));
                if dead.iter().any(|k| !l.done.contains(k)) {
                    l.ending.get_or_insert(LeaseEnd::LinkDown);
                }
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
        self.live.values().any(|l| !l.links.is_empty())
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
#[path = "tests.rs"]
mod tests;
