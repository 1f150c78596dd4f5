//! What keeps an op's memory valid while a transport may touch it, as the op table holds it.
//!
//! The op table (`hixl_core::OpTable<Waker, Keep>`) is the one owner of each op's keep-alive,
//! for every transport: [`Keeps`] collects it while a call is staged (a lease per local region
//! the call touches, plus what a transport must keep on the peer's side, such as the fabric's
//! mapping of a peer region), `OpTable::post` takes it into the op's entry, and the op table
//! hands it back when the op's last part is done, to be dropped outside its lock. Transports
//! hold raw ranges meanwhile ([`crate::rawio::PartRange`] says why they stay valid).

use std::any::Any;
use std::sync::{Arc, Mutex};
use std::task::Waker;

use hixl_core::OpTable;

use crate::memory::{Lease, RegionInner};

/// One item of an op's keep-alive.
#[derive(Debug)]
pub(crate) enum Keep {
    /// A lease on a local region the op touches: the region stays registered.
    Region(Lease),
    /// What a transport keeps for the op on the peer's side (the fabric: its reach of a peer
    /// region, whose last holder unmaps it and lets a revocation finish).
    #[cfg_attr(not(feature = "fabric"), allow(dead_code))]
    Peer(Arc<dyn Any + Send + Sync>),
}

impl Keep {
    fn same_region(&self, r: &Arc<RegionInner>) -> bool {
        matches!(self, Keep::Region(l) if std::ptr::eq(l.region(), Arc::as_ptr(r)))
    }

    #[cfg_attr(not(feature = "fabric"), allow(dead_code))]
    fn same_peer(&self, p: *const ()) -> bool {
        matches!(self, Keep::Peer(a) if std::ptr::eq(Arc::as_ptr(a).cast::<()>(), p))
    }
}

/// The engine's op table: ops, their waiters and their keep-alive.
pub(crate) type Ops = OpTable<Waker, Keep>;

/// The op table as the engine's tasks share it.
pub(crate) type SharedOps = Arc<Mutex<Ops>>;

/// Items kept on the stack before spilling to the heap: a call touches a few regions at most
/// in the common case, so staging one allocates nothing.
const INLINE: usize = 4;

/// An op's keep-alive while its call is staged: one item per distinct region or peer reach
/// (a repeat is recognised against the inline items and the last spilled one).
#[derive(Debug)]
pub(crate) struct Keeps {
    inline: [Option<Keep>; INLINE],
    n: usize,
    spill: Vec<Keep>,
}

impl Default for Keeps {
    fn default() -> Self {
        Keeps {
            inline: [const { None }; INLINE],
            n: 0,
            spill: Vec::new(),
        }
    }
}

impl Keeps {
    fn seen(&self, f: impl Fn(&Keep) -> bool) -> bool {
        self.inline[..self.n].iter().flatten().any(&f) || self.spill.last().is_some_and(&f)
    }

    fn push(&mut self, k: Keep) {
        if self.n < INLINE {
            self.inline[self.n] = Some(k);
            self.n += 1;
        } else {
            self.spill.push(k);
        }
    }

    /// Leases `r` for the op, unless it is leased already. Call under the region table's lock
    /// (as [`Lease::new`] requires).
    pub(crate) fn region(&mut self, r: &Arc<RegionInner>) {
        if !self.seen(|k| k.same_region(r)) {
            self.push(Keep::Region(Lease::new(r)));
        }
    }

    /// Keeps `p` for the op, unless it is kept already.
    #[cfg_attr(not(feature = "fabric"), allow(dead_code))]
    pub(crate) fn peer<T: Any + Send + Sync>(&mut self, p: &Arc<T>) {
        let ptr = Arc::as_ptr(p).cast::<()>();
        if !self.seen(|k| k.same_peer(ptr)) {
            self.push(Keep::Peer(p.clone()));
        }
    }

    /// The items, for `OpTable::post`.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = Keep> + '_ {
        let n = std::mem::take(&mut self.n);
        self.inline[..n]
            .iter_mut()
            .filter_map(Option::take)
            .chain(self.spill.drain(..))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_are_kept_once() {
        let a: Arc<u32> = Arc::new(1);
        let b: Arc<u32> = Arc::new(2);
        let mut k = Keeps::default();
        for _ in 0..3 {
            k.peer(&a);
            k.peer(&b);
        }
        assert_eq!(Arc::strong_count(&a), 2);
        assert_eq!(k.drain().count(), 2);
        assert_eq!(Arc::strong_count(&a), 1, "drained items are gone");
        let many: Vec<Arc<u32>> = (0..10).map(Arc::new).collect();
        for m in &many {
            k.peer(m);
        }
        assert_eq!(k.drain().count(), 10);
    }
}
