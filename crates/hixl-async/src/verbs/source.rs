//! The verbs completion queues as the reactor sees them: one source over every device's CQ (an
//! epoll set of their completion channels when there are several), and the table of slices in
//! flight, so that a completion becomes a part of its op, or a failed slice is placed again on
//! another rail.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use hixl_core::{CompletionSource, Error, PartResult, Token, TransferOp};
use hixl_verbs::Cq;

use crate::sync::lock;

/// One slice of an op: a contiguous range of one descriptor, on one queue pair of one rail.
#[derive(Clone, Debug)]
pub(crate) struct Slice {
    pub(crate) op: Token,
    pub(crate) kind: TransferOp,
    pub(crate) local: u64,
    pub(crate) remote: u64,
    pub(crate) len: u64,
    /// The local region's lkey on each of our devices.
    pub(crate) lkeys: Arc<[u32]>,
    /// The peer region's rkey on each of the peer's devices (`None`: not registered there).
    pub(crate) rkeys: Arc<[Option<u32>]>,
    /// The local memory's NUMA node.
    pub(crate) numa: Option<u32>,
    pub(crate) link: Weak<dyn SliceOwner>,
    /// `(rail, queue pair)` it was placed on.
    pub(crate) at: (usize, usize),
    /// Its rail's generation when it was placed.
    pub(crate) generation: u64,
    /// Its op's owner went away: never placed again.
    pub(crate) withdrawn: bool,
}

/// The link that placed slices: told what became of each (the drain has taken it out of the
/// table), and asked to post what waits after every drain.
pub(crate) trait SliceOwner: Send + Sync {
    /// The slice landed.
    fn landed(&self, s: &Slice);
    /// The slice failed with `e`: reported in `out` when final, else placed again.
    fn slice_failed(&self, s: Slice, e: Error, out: &mut Vec<PartResult>);
    /// Posts queued slices into freed send-queue room.
    fn pump_all(&self);
}

/// Every device's completion queue and the slices in flight on them.
pub(crate) struct VerbsSource {
    cqs: Vec<Cq>,
    /// The epoll set of the CQs' channels, when there is more than one.
    epoll: Option<OwnedFd>,
    slices: Mutex<HashMap<u64, Slice>>,
    next: AtomicU64,
    links: Mutex<Vec<Weak<dyn SliceOwner>>>,
}

impl std::fmt::Debug for VerbsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsSource")
            .field("cqs", &self.cqs.len())
            .finish_non_exhaustive()
    }
}

impl VerbsSource {
    pub(crate) fn new(cqs: Vec<Cq>) -> hixl_verbs::Result<VerbsSource> {
        let epoll = if cqs.len() > 1 {
            // SAFETY: plain syscall; the result is checked and owned below.
            let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            if fd < 0 {
                return Err(verb_error("epoll_create1"));
            }
            // SAFETY: fd is a new epoll descriptor nothing else owns.
            let ep = unsafe { OwnedFd::from_raw_fd(fd) };
            for cq in &cqs {
                let mut ev = libc::epoll_event {
                    events: libc::EPOLLIN as u32,
                    u64: 0,
                };
                // SAFETY: both descriptors are open; ev is a valid event.
                let rc = unsafe {
                    libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, cq.fd(), &mut ev)
                };
                if rc != 0 {
                    return Err(verb_error("epoll_ctl"));
                }
            }
            Some(ep)
        } else {
            None
        };
        Ok(VerbsSource {
            cqs,
            epoll,
            slices: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            links: Mutex::new(Vec::new()),
        })
    }

    /// Records a slice about to be posted; its id goes in the work request's `wr_id`.
    pub(crate) fn insert(&self, s: Slice) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.slices).insert(id, s);
        id
    }

    /// Forgets slice `id` (it was never posted, and is completed by the caller).
    pub(crate) fn remove(&self, id: u64) -> Option<Slice> {
        lock(&self.slices).remove(&id)
    }

    /// Marks every slice of op `op` withdrawn: none is placed again after a failure.
    pub(crate) fn withdraw(&self, op: Token) {
        for s in lock(&self.slices).values_mut() {
            if s.op == op {
                s.withdrawn = true;
            }
        }
    }

    pub(crate) fn add_link(&self, l: Weak<dyn SliceOwner>) {
        let mut v = lock(&self.links);
        v.retain(|w| w.strong_count() > 0);
        v.push(l);
    }

    fn live_links(&self) -> Vec<Arc<dyn SliceOwner>> {
        lock(&self.links).iter().filter_map(Weak::upgrade).collect()
    }
}

fn verb_error(call: &'static str) -> hixl_verbs::VerbsError {
    hixl_verbs::VerbsError::Invalid {
        what: "completion channels",
        reason: format!("{call}: {}", std::io::Error::last_os_error()),
    }
}

impl CompletionSource for VerbsSource {
    fn drain(&self, out: &mut Vec<PartResult>) -> usize {
        let start = out.len();
        let mut got = Vec::new();
        for cq in &self.cqs {
            cq.drain(&mut got);
        }
        if got.is_empty() {
            return 0;
        }
        // One pass under one lock of the slice table; failed slices are handled after it.
        let mut failed = Vec::new();
        {
            let mut t = lock(&self.slices);
            for (id, r) in got {
                let Some(s) = t.remove(&id.0) else {
                    continue;
                };
                match r {
                    Ok(()) => {
                        if let Some(l) = s.link.upgrade() {
                            l.landed(&s);
                        }
                        out.push((s.op, Ok(())));
                    }
                    Err(e) => failed.push((s, e)),
                }
            }
        }
        for (s, e) in failed {
            match s.link.upgrade() {
                Some(l) => l.slice_failed(s, e, out),
                None => out.push((s.op, Err(e))),
            }
        }
        for l in self.live_links() {
            l.pump_all();
        }
        out.len() - start
    }

    fn arm(&self) {
        for cq in &self.cqs {
            cq.arm();
        }
    }

    fn disarm(&self) {
        for cq in &self.cqs {
            cq.disarm();
        }
    }

    fn fd(&self) -> RawFd {
        match (&self.epoll, self.cqs.first()) {
            (Some(ep), _) => ep.as_raw_fd(),
            (None, Some(cq)) => cq.fd(),
            (None, None) => -1,
        }
    }
}

/// The error for a slice that has no rail left.
pub(crate) fn no_rail(peer: &str, rails: &[String]) -> Error {
    Error::PeerLost {
        peer: peer.to_owned(),
        cause: format!("no RDMA rail is left: {}", rails.join("; ")),
    }
}
