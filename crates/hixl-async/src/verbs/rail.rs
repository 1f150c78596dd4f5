//! One rail of a link: our device to one of the peer's, with its queue pairs, the work waiting
//! for send-queue room on each, the bytes each has outstanding, its health and its counters.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use hixl_core::{Error, Token};
use hixl_verbs::{QueuePair, RailPlan, WorkRequest};

use super::health::Health;
use crate::sync::lock;

/// A work request waiting for room, and the op its slice belongs to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Queued {
    pub(crate) wr: WorkRequest,
    pub(crate) op: Token,
}

/// One queue pair of a rail and what waits for it.
#[derive(Default)]
pub(crate) struct Slot {
    /// `None` while the rail is paused or the link closed.
    pub(crate) qp: Option<QueuePair>,
    /// Waiting for send-queue room, in placement order.
    pub(crate) backlog: VecDeque<Queued>,
}

/// What posting a slot's backlog left to do.
pub(crate) enum Pumped {
    /// Posted what fit (maybe nothing).
    Done,
    /// The slot has no queue pair (paused, or the link closed): these wait for a rail.
    NoQp(Vec<Queued>),
    /// The queue pair failed, or the device refused the post: the rail is broken (`cause`);
    /// these were not posted.
    Broken { cause: Error, unposted: Vec<Queued> },
}

/// Per-rail counters (`hixl info --peer`, metrics, `hixl bench`).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) bytes: AtomicU64,
    pub(crate) slices: AtomicU64,
    pub(crate) errors: AtomicU64,
}

/// One rail.
pub(crate) struct Rail {
    pub(crate) index: usize,
    pub(crate) plan: RailPlan,
    /// `"rxe0→rxe1"`.
    pub(crate) name: String,
    /// The local device's NUMA node.
    pub(crate) numa: Option<u16>,
    pub(crate) slots: Vec<Mutex<Slot>>,
    /// Bytes placed on each slot and not yet completed.
    pub(crate) load: Vec<AtomicU64>,
    pub(crate) health: Mutex<Health>,
    /// Mirrors `health.is_up()` for the placement path.
    pub(crate) up: AtomicBool,
    /// Bumped at every pause: slices placed before it were on queue pairs now dropped.
    generation: AtomicU64,
    pub(crate) counters: Counters,
    /// Work requests each queue pair may have outstanding.
    pub(crate) capacity: usize,
    pub(crate) max_msg: u32,
}

impl Rail {
    pub(crate) fn new(
        index: usize,
        plan: RailPlan,
        name: String,
        numa: Option<u16>,
        qps: Vec<Option<QueuePair>>,
        health: Health,
    ) -> Rail {
        let (capacity, max_msg) = qps.iter().flatten().next().map_or((1, u32::MAX), |q| {
            (q.config().max_send_wr as usize, q.max_message_size())
        });
        let up = health.is_up();
        Rail {
            index,
            plan,
            name,
            numa,
            load: qps.iter().map(|_| AtomicU64::new(0)).collect(),
            slots: qps
                .into_iter()
                .map(|qp| {
                    Mutex::new(Slot {
                        qp,
                        backlog: VecDeque::new(),
                    })
                })
                .collect(),
            health: Mutex::new(health),
            up: AtomicBool::new(up),
            generation: AtomicU64::new(0),
            counters: Counters::default(),
            capacity: capacity.max(1),
            max_msg,
        }
    }

    /// How many times the rail was paused (see [`Slice::generation`](super::source::Slice)).
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Pauses the rail with `cause`: its queue pairs are dropped (what they had outstanding
    /// completes flushed) and what waited for them is returned, to be placed elsewhere.
    /// Returns `None` when it was paused already.
    pub(crate) fn pause(&self, now: Instant, cause: String) -> Option<Vec<Queued>> {
        if !lock(&self.health).pause(now, cause) {
            return None;
        }
        self.up.store(false, Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
        Some(self.take_all())
    }

    /// Takes every queue pair and everything waiting (the link closed).
    pub(crate) fn close(&self) -> Vec<Queued> {
        self.up.store(false, Ordering::Release);
        self.take_all()
    }

    /// Drops every queue pair (outside its slot's lock: a QP with work outstanding is
    /// flushed) and returns every backlog.
    fn take_all(&self) -> Vec<Queued> {
        let mut waiting = Vec::new();
        for s in &self.slots {
            let (qp, backlog) = {
                let mut s = lock(s);
                (s.qp.take(), std::mem::take(&mut s.backlog))
            };
            drop(qp);
            waiting.extend(backlog);
        }
        waiting
    }

    /// Posts as much of slot `q`'s backlog as its send queue has room for, as one chain.
    pub(crate) fn pump(&self, q: usize, peer: &str) -> Pumped {
        let Some(slot) = self.slots.get(q) else {
            return Pumped::Done;
        };
        let mut s = lock(slot);
        if s.backlog.is_empty() {
            return Pumped::Done;
        }
        let Slot { qp, backlog } = &mut *s;
        let Some(qp) = qp.as_mut() else {
            return Pumped::NoQp(backlog.drain(..).collect());
        };
        if let Some(f) = qp.failure() {
            return Pumped::Broken {
                cause: qp_failed(peer, &self.name, &f),
                unposted: backlog.drain(..).collect(),
            };
        }
        let mut room = self.capacity.saturating_sub(qp.outstanding());
        let mut n = 0;
        for w in backlog.iter() {
            let p = usize::try_from(w.wr.pieces(self.max_msg)).unwrap_or(usize::MAX);
            if p > room {
                break;
            }
            room -= p;
            n += 1;
        }
        if n == 0 {
            return Pumped::Done;
        }
        let chain: Vec<WorkRequest> = backlog.iter().take(n).map(|w| w.wr).collect();
        // SAFETY: every request's local range lies in a region registered with this rail's
        // device under `local.lkey`, leased (so neither deregistered nor freed) until the
        // request's completion is drained: each slice is a part of its op, the op table holds
        // the op's lease until its last part completes (`rawio::PartRange`), and a posted
        // request completes only through the drain (a dropped QP's through its flush). The
        // remote range was checked against the peer's memory table; the peer's device
        // refuses anything else.
        let r = unsafe { qp.post_chain(&chain) };
        match r {
            Ok(_) => {
                backlog.drain(..n);
                Pumped::Done
            }
            // Room was computed under the lock; keep the order and retry on the next drain.
            Err(hixl_verbs::VerbsError::SendQueueFull { .. }) => Pumped::Done,
            Err(e @ hixl_verbs::VerbsError::Post { reported_ops, .. }) => {
                backlog.drain(..reported_ops.min(n));
                Pumped::Broken {
                    cause: Error::transport(peer, "posting RDMA work requests", e),
                    unposted: backlog.drain(..).collect(),
                }
            }
            Err(e) => Pumped::Broken {
                cause: Error::from(e),
                unposted: backlog.drain(..).collect(),
            },
        }
    }

    /// The rail's state for `hixl info --peer` and errors: `"rxe0→rxe0 up"`.
    pub(crate) fn describe(&self, now: Instant) -> String {
        format!(
            "rail {} {}: {}",
            self.index,
            self.name,
            lock(&self.health).describe(now)
        )
    }
}

/// The error of a slice whose queue pair failed.
pub(crate) fn qp_failed(peer: &str, rail: &str, f: &str) -> Error {
    Error::PeerLost {
        peer: peer.to_owned(),
        cause: format!("RDMA queue pair of rail {rail} failed: {f}"),
    }
}
