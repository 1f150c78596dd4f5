//! A model of the lease/pull protocol: the owner's real [`LeaseTable`] against model pullers
//! that follow the puller's rules (a deadline of `start + window` taken before the acquire;
//! no part starts past it, and a part that finishes past it is reported failed; at it, wait
//! for the parts in flight, then release), under arbitrary interleavings of acquires, parts
//! starting and finishing, frames delivered late or never, revocation, dead links and time.
//! The owner reuses a lease's blocks the instant it reports the lease ended.
//!
//! Checked:
//! - every lease ends in bounded time whatever the pullers do (a dead or hung puller does
//!   not hold the blocks forever);
//! - when a lease ends, no puller it admitted can still start a part, and any part of it
//!   still in flight is past its pull's deadline, so it is reported failed: no part reported
//!   landed ever reads reused bytes;
//! - with the one assumption from outside the table (a part in flight at its pull's deadline
//!   resolves within the grace, the time a dead link takes to be noticed, or its link is
//!   declared dead, which stops it), no part at all is in flight when a lease ends.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::{Frame, LeaseGrant, LeaseTable};

const GRACE: Duration = Duration::from_millis(50);
const PARTS: u32 = 3;
const PULLERS: usize = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Idle,
    /// The acquire is out; no answer yet.
    Acquiring,
    /// Admitted: parts may start until the deadline.
    Moving,
    /// Past the deadline: no part starts; the release goes out when none is in flight.
    Quiescing,
    /// Released, refused or dead: this pull starts nothing more.
    Over,
}

struct Puller {
    link: u64,
    st: St,
    deadline: Instant,
    ticket: u64,
    /// Frames on their way to the owner, in order.
    wire: VecDeque<Frame>,
    parts_left: u32,
    in_flight: u32,
    alive: bool,
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Advance(u64),
    Begin(usize, u32),
    Deliver(usize),
    StartPart(usize),
    FinishPart(usize),
    Revoke,
    Kill(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let p = 0..PULLERS;
    prop_oneof![
        (1u64..40).prop_map(Op::Advance),
        (p.clone(), 5u32..80).prop_map(|(p, w)| Op::Begin(p, w)),
        p.clone().prop_map(Op::Deliver),
        p.clone().prop_map(Op::StartPart),
        p.clone().prop_map(Op::FinishPart),
        Just(Op::Revoke),
        p.prop_map(Op::Kill),
    ]
}

struct World {
    now: Instant,
    /// Whether parts keep the assumption (resolve within the grace past their deadline).
    prompt: bool,
    table: LeaseTable,
    grant: LeaseGrant,
    readers: u32,
    pullers: Vec<Puller>,
    next_ticket: u64,
    ended: bool,
}

impl World {
    fn new(readers: u32, ttl_ms: u64, prompt: bool) -> World {
        let now = Instant::now();
        let mut table = LeaseTable::with_grace(GRACE);
        let ttl = Duration::from_millis(ttl_ms);
        let grant = table.create(1, 9, &[1], &[0, 1], ttl, 0x5eed, now).unwrap();
        let pullers = (0..PULLERS)
            .map(|i| Puller {
                link: 100 + i as u64,
                st: St::Idle,
                deadline: now,
                ticket: 0,
                wire: VecDeque::new(),
                parts_left: 0,
                in_flight: 0,
                alive: true,
            })
            .collect();
        World {
            now,
            prompt,
            table,
            grant,
            readers,
            pullers,
            next_ticket: 1,
            ended: false,
        }
    }

    /// The owner reports ended leases: it reuses their blocks at once. None may be read.
    fn on_ended(&mut self, ended: usize) -> Result<(), TestCaseError> {
        if ended == 0 {
            return Ok(());
        }
        prop_assert!(!self.ended, "the lease ended twice");
        self.ended = true;
        for p in &self.pullers {
            if p.in_flight > 0 || matches!(p.st, St::Moving | St::Quiescing) {
                // Whatever it finishes from here finishes past its deadline (reported failed)
                // and nothing starts.
                prop_assert!(
                    self.now >= p.deadline,
                    "blocks reused inside puller {}'s deadline ({:?}, {} in flight)",
                    p.link,
                    p.st,
                    p.in_flight
                );
            }
            if self.prompt {
                prop_assert_eq!(p.in_flight, 0, "blocks reused under a part in flight");
                prop_assert!(
                    !matches!(p.st, St::Moving | St::Quiescing),
                    "blocks reused while puller {} may still finish a part ({:?})",
                    p.link,
                    p.st
                );
            }
        }
        Ok(())
    }

    fn tick(&mut self) -> Result<(), TestCaseError> {
        let alive: Vec<(u64, bool)> = self.pullers.iter().map(|p| (p.link, p.alive)).collect();
        let ended = self
            .table
            .tick(self.now, |l| alive.iter().any(|&(k, a)| k == l && a));
        self.on_ended(ended.len())
    }

    /// The pullers' own moves: past the deadline a pull quiesces; with nothing in flight it
    /// releases (done when every part landed).
    fn settle(&mut self) {
        let (lease, gen) = (self.grant.lease_id, self.grant.generation);
        for p in &mut self.pullers {
            if p.st == St::Moving && self.now >= p.deadline {
                p.st = St::Quiescing;
            }
            let all_landed = p.st == St::Moving && p.parts_left == 0 && p.in_flight == 0;
            let quiet = p.st == St::Quiescing && p.in_flight == 0;
            if all_landed || quiet {
                p.wire.push_back(Frame::Release {
                    lease,
                    gen,
                    ticket: p.ticket,
                    done: all_landed,
                });
                p.st = St::Over;
            }
        }
    }

    fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Advance(ms) => {
                let to = self.now + Duration::from_millis(ms);
                // The assumption: a part in flight at its deadline resolves within the grace.
                for p in &mut self.pullers {
                    if self.prompt && p.in_flight > 0 && p.deadline + GRACE <= to {
                        p.in_flight = 0;
                    }
                }
                self.settle();
                self.now = to;
            }
            Op::Begin(i, window_ms) => {
                let p = &mut self.pullers[i];
                if p.alive && matches!(p.st, St::Idle | St::Over) {
                    // The deadline is taken before the acquire goes out.
                    p.deadline = self.now + Duration::from_millis(u64::from(window_ms));
                    p.ticket = self.next_ticket;
                    self.next_ticket += 1;
                    p.wire.push_back(Frame::Acquire {
                        lease: self.grant.lease_id,
                        gen: self.grant.generation,
                        ticket: p.ticket,
                        window_ms,
                        digest: self.grant.digest(),
                        readers: self.readers,
                    });
                    p.st = St::Acquiring;
                    p.parts_left = PARTS;
                }
            }
            Op::Deliver(i) => {
                let link = self.pullers[i].link;
                if let Some(f) = self.pullers[i].wire.pop_front() {
                    let acquire = matches!(f, Frame::Acquire { .. });
                    let (r, ended) = self.table.on_frame(Some(f), link, self.now);
                    let p = &mut self.pullers[i];
                    // The answer to an acquire: a refusal moves nothing.
                    if acquire && p.st == St::Acquiring {
                        p.st = if r.is_ok() && p.alive {
                            St::Moving
                        } else {
                            St::Over
                        };
                    }
                    self.on_ended(ended.len())?;
                }
            }
            Op::StartPart(i) => {
                let p = &mut self.pullers[i];
                if p.st == St::Moving && self.now < p.deadline && p.parts_left > 0 {
                    p.parts_left -= 1;
                    p.in_flight += 1;
                }
            }
            Op::FinishPart(i) => {
                let p = &mut self.pullers[i];
                p.in_flight = p.in_flight.saturating_sub(1);
            }
            Op::Revoke => {
                self.table.revoke(self.grant.lease_id);
            }
            Op::Kill(i) => {
                // A dead link moves nothing more and says nothing more.
                let p = &mut self.pullers[i];
                p.alive = false;
                p.in_flight = 0;
                p.st = St::Over;
                p.wire.clear();
            }
        }
        self.settle();
        self.tick()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn no_lease_ends_under_a_read_and_every_lease_ends(
        readers in 1u32..=2,
        ttl_ms in 1u64..60,
        prompt in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let mut w = World::new(readers, ttl_ms, prompt);
        for op in ops {
            w.apply(op)?;
        }
        // Whatever the pullers do from here (nothing: hung, or their frames lost), the lease
        // ends by the longest ticket (window + grace) and then its TTL.
        w.apply(Op::Advance(80 + GRACE.as_millis() as u64 + ttl_ms + 1))?;
        w.apply(Op::Advance(80 + GRACE.as_millis() as u64 + ttl_ms + 1))?;
        prop_assert!(w.ended, "the lease still holds its blocks");
        prop_assert!(w.table.is_empty());
    }
}
