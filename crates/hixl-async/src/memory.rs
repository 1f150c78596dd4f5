//! Registered memory: owned host buffers, the region lease that in-flight ops hold, and the
//! user's `Region` handle.
//!
//! Once registered, memory is shared with peers, copy engines and the device: nothing here
//! forms a Rust reference over it. Bytes move through [`RawRange`]s, which a [`Lease`] (for
//! ops) or the region's lock (for [`Region::read_at`]/[`Region::write_at`]) keeps valid.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hixl_core::{Access, Error, MemKind, RegionId, Result};

use crate::rawio::RawRange;
use crate::sync::lock;

const PAGE: usize = 4096;

/// A page-aligned, zero-initialised host buffer that hixl can own while it is registered.
///
/// Its bytes are reachable as slices only while the caller owns it, that is, while it is not
/// registered: [`crate::Engine::register`] takes it by value and [`crate::Engine::deregister`]
/// hands it back once no op touches it. While it is registered, use [`Region::read_at`] and
/// [`Region::write_at`].
///
/// ```
/// let b = hixl_async::HostBuffer::zeroed(1 << 20).unwrap();
/// assert_eq!(b.len(), 1 << 20);
/// assert_eq!(b.as_ptr() as usize % 4096, 0);
/// ```
pub struct HostBuffer {
    /// The allocation: `len` bytes starting at the first page boundary inside it. It is never
    /// resized, so its heap block (and the buffer's address) never moves.
    mem: Vec<u8>,
    /// Offset of the page boundary in `mem`.
    off: usize,
    len: usize,
}

impl HostBuffer {
    /// Allocates `len` zeroed bytes aligned to 4 KiB (the allocation is up to 4095 bytes
    /// larger, to find the boundary).
    ///
    /// # Errors
    /// [`Error::ZeroLength`] for `len == 0`, [`Error::TooLarge`] for a length no allocation
    /// can have, [`Error::ResourceExhausted`] when the allocation fails.
    pub fn zeroed(len: usize) -> Result<HostBuffer> {
        if len == 0 {
            return Err(Error::ZeroLength { index: 0 });
        }
        let total = len
            .checked_add(PAGE - 1)
            .filter(|&t| t <= isize::MAX as usize)
            .ok_or(Error::TooLarge {
                what: "host buffer",
                len: len as u64,
                max: (isize::MAX as usize - (PAGE - 1)) as u64,
            })?;
        let mut mem = Vec::new();
        mem.try_reserve_exact(total)
            .map_err(|_| Error::ResourceExhausted {
                what: format!("allocating {len} bytes of host memory"),
            })?;
        mem.resize(total, 0);
        let off = (mem.as_ptr() as usize).wrapping_neg() % PAGE;
        Ok(HostBuffer { mem, off, len })
    }

    /// Start address (for registration and descriptors: access the bytes through
    /// [`HostBuffer::as_slice`] while unregistered, [`Region::read_at`] while registered).
    pub fn as_ptr(&self) -> *mut u8 {
        self.mem.as_ptr().wrapping_add(self.off).cast_mut()
    }

    /// Start address, with the provenance to write (what a registration keeps).
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.mem.as_mut_ptr().wrapping_add(self.off)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a buffer has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The bytes (the buffer is not registered: only its owner can reach them).
    pub fn as_slice(&self) -> &[u8] {
        &self.mem[self.off..self.off + self.len]
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.mem[self.off..self.off + self.len]
    }
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuffer")
            .field("addr", &self.as_ptr())
            .field("len", &self.len)
            .finish()
    }
}

/// Memory a region owns: freed (or returned to its pool) when the region is deregistered and
/// no op touches it any more.
pub(crate) enum Owned {
    /// A page-aligned heap buffer, handed back by `deregister`.
    Host(HostBuffer),
    /// Memory a transport allocated (the fabric pool's sealed memfds), returned to it when
    /// the region goes; the transport finds its own type in it again ([`RegionInner::pooled`]).
    #[cfg_attr(not(feature = "fabric"), allow(dead_code))]
    Pooled(Box<dyn Any + Send + Sync>),
}

impl std::fmt::Debug for Owned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owned::Host(b) => f.debug_tuple("Host").field(b).finish(),
            Owned::Pooled(_) => f.write_str("Pooled"),
        }
    }
}

/// A region's registration with a transport's device (an RDMA memory region): kept until
/// deregistration, when dropping it makes the device refuse the region's keys.
pub(crate) struct DeviceMr {
    /// Held for its drop, which ends the registration.
    pub(crate) _keep: Box<dyn Any + Send + Sync>,
    /// Local keys for work requests, one per device of the transport, in device order.
    pub(crate) lkeys: Arc<[u32]>,
    /// Remote keys that peers' devices present, in the same order.
    pub(crate) rkeys: Arc<[u32]>,
    /// The NUMA node of the memory, when the host says.
    pub(crate) numa: Option<u32>,
}

impl std::fmt::Debug for DeviceMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMr")
            .field("lkeys", &self.lkeys)
            .field("rkeys", &self.rkeys)
            .field("numa", &self.numa)
            .finish()
    }
}

/// What a region holds on to until it is deregistered: its memory (when the engine owns it)
/// and its device registration.
#[derive(Debug, Default)]
pub(crate) struct Backing {
    pub(crate) owned: Option<Owned>,
    pub(crate) mr: Option<DeviceMr>,
}

/// A registered region's shared state: what keeps its memory alive and counts ops touching it.
#[derive(Debug)]
pub(crate) struct RegionInner {
    pub(crate) id: RegionId,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) kind: MemKind,
    pub(crate) access: Access,
    pub(crate) rkey: u64,
    /// The device registration, dropped by deregistration once no local op uses it (from then
    /// on the device refuses the region's keys). Declared before `owned` so that, when an
    /// engine is dropped without deregistering, it is dropped before the memory is freed.
    mr: Mutex<Option<DeviceMr>>,
    owned: Mutex<Option<Owned>>,
    /// Local keys of `mr` (one per device) for work requests of this engine (read by verbs).
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub(crate) lkeys: Option<Arc<[u32]>>,
    /// Remote keys of `mr` (one per device) that peers' devices present (read by verbs).
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub(crate) dev_rkeys: Option<Arc<[u32]>>,
    /// The memory's NUMA node, when the host said at registration (read by verbs).
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub(crate) numa: Option<u32>,
    inflight: AtomicUsize,
    revoked: AtomicBool,
    idle: tokio::sync::Notify,
}

impl RegionInner {
    pub(crate) fn new(
        id: RegionId,
        addr: u64,
        len: u64,
        kind: MemKind,
        access: Access,
        rkey: u64,
        backing: Backing,
    ) -> RegionInner {
        let Backing { owned, mr } = backing;
        let (lkeys, dev_rkeys, numa) = match &mr {
            Some(m) => (Some(m.lkeys.clone()), Some(m.rkeys.clone()), m.numa),
            None => (None, None, None),
        };
        RegionInner {
            id,
            addr,
            len,
            kind,
            access,
            rkey,
            owned: Mutex::new(owned),
            mr: Mutex::new(mr),
            lkeys,
            dev_rkeys,
            numa,
            inflight: AtomicUsize::new(0),
            revoked: AtomicBool::new(false),
            idle: tokio::sync::Notify::new(),
        }
    }

    /// Marks the region revoked and waits until no op touches it; then hands back the owned
    /// buffer, if any.
    pub(crate) async fn revoke_and_drain(&self) -> Option<HostBuffer> {
        self.revoked.store(true, Ordering::SeqCst);
        loop {
            let notified = self.idle.notified();
            if self.inflight.load(Ordering::SeqCst) == 0 {
                break;
            }
            notified.await;
        }
        // No local work request names the region any more: end the device registration
        // before the memory can be freed or reused (a peer's late RDMA op is refused).
        let mr = lock(&self.mr).take();
        drop(mr);
        let owned = lock(&self.owned).take();
        match owned {
            Some(Owned::Host(b)) => Some(b),
            Some(Owned::Pooled(_)) | None => None,
        }
    }

    /// `f` of the transport memory this region owns, when it is a `T` (the fabric asks for
    /// its pool buffers).
    #[cfg_attr(not(feature = "fabric"), allow(dead_code))]
    pub(crate) fn pooled<T: Any, R>(&self, f: impl FnOnce(&T) -> R) -> Option<R> {
        let g = lock(&self.owned);
        match g.as_ref()? {
            Owned::Pooled(b) => b.downcast_ref::<T>().map(f),
            Owned::Host(_) => None,
        }
    }
}

/// Held by every op while it may touch a region's memory; the memory cannot be deregistered
/// (and an owned buffer cannot be freed) while a lease exists.
#[derive(Debug)]
pub(crate) struct Lease(Arc<RegionInner>);

impl Lease {
    /// Takes a lease. Call only while the region is in the engine's table, under its lock, so
    /// that deregistration (which removes it under the same lock) sees the count.
    pub(crate) fn new(r: &Arc<RegionInner>) -> Lease {
        r.inflight.fetch_add(1, Ordering::SeqCst);
        Lease(r.clone())
    }

    pub(crate) fn region(&self) -> &RegionInner {
        &self.0
    }

    /// The bytes `addr..addr + len` of the leased region, as a range that cannot outlive the
    /// lease.
    ///
    /// # Errors
    /// [`Error::OutsideRegion`] when the bytes are not all inside the region (callers checked
    /// this already; a failure here is a bug, reported rather than acted on).
    pub(crate) fn range(&self, addr: u64, len: u64) -> Result<RawRange<'_>> {
        let r = self.region();
        let inside = addr >= r.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= r.addr + r.len);
        if !inside {
            return Err(Error::OutsideRegion {
                addr,
                len,
                region_addr: r.addr,
                region_len: r.len,
            });
        }
        // SAFETY: the range lies inside the region (checked above). The lease, which the
        // returned range borrows, keeps the region registered, so its memory stays valid:
        // an owned buffer is not freed while a lease exists, and raw memory stays valid until
        // deregistration returns by register_raw's contract. Others may access the bytes
        // concurrently; RawRange never forms a reference over them.
        Ok(unsafe { RawRange::new(addr as *mut u8, len as usize) })
    }
}

impl Clone for Lease {
    fn clone(&self) -> Lease {
        Lease::new(&self.0)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.0.inflight.fetch_sub(1, Ordering::SeqCst) == 1
            && self.0.revoked.load(Ordering::SeqCst)
        {
            self.0.idle.notify_waiters();
        }
    }
}

/// The user's handle to a registered region (HIXL `MemHandle`).
///
/// Dropping it does not deregister: like HIXL's handle it is just a name for the registration.
/// Call [`crate::Engine::deregister`] to end the registration; it waits for in-flight ops and
/// returns an owned buffer.
#[derive(Debug, Clone)]
pub struct Region {
    pub(crate) inner: Arc<RegionInner>,
}

impl Region {
    /// The HIXL handle.
    pub fn id(&self) -> RegionId {
        self.inner.id
    }
    /// Start address.
    pub fn addr(&self) -> u64 {
        self.inner.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.inner.len
    }
    /// Always false: regions are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }
    /// Memory kind.
    pub fn kind(&self) -> MemKind {
        self.inner.kind
    }
    /// Accesses granted to peers.
    pub fn access(&self) -> Access {
        self.inner.access
    }
    /// The key peers present (0 for local-only regions, which are never exported).
    pub fn rkey(&self) -> u64 {
        self.inner.rkey
    }

    /// Address of byte `offset`, bounds-checked.
    ///
    /// # Errors
    /// [`Error::OffsetOutOfBounds`] (with `len` 1) when `offset` is past the end.
    pub fn addr_at(&self, offset: u64) -> Result<u64> {
        if offset >= self.inner.len {
            return Err(Error::OffsetOutOfBounds {
                offset,
                len: 1,
                region_len: self.inner.len,
            });
        }
        Ok(self.inner.addr + offset)
    }

    /// Runs `f` on bytes `offset..offset + len` of the region with its memory guaranteed
    /// live: bounds-checked, and the owned buffer (if any) locked so deregistration cannot
    /// free it (or, for raw memory, return to the caller) meanwhile.
    fn with_range(&self, offset: u64, len: usize, f: impl FnOnce(RawRange<'_>)) -> Result<()> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.inner.len => {}
            _ => {
                return Err(Error::OffsetOutOfBounds {
                    offset,
                    len: len as u64,
                    region_len: self.inner.len,
                })
            }
        }
        let guard = lock(&self.inner.owned);
        if self.inner.revoked.load(Ordering::SeqCst) {
            return Err(Error::Deregistered {
                addr: self.inner.addr,
            });
        }
        // SAFETY: the range is inside the region (checked above), which is not revoked, and
        // `guard` holds the lock that deregistration takes before handing back (or freeing)
        // the memory, so it stays valid (owned buffers) or, by register_raw's contract, valid
        // for raw memory, until the range (which cannot escape `f`) is gone. Peers may access
        // the bytes concurrently: RawRange never forms a reference over them.
        let range = unsafe { RawRange::new((self.inner.addr + offset) as *mut u8, len) };
        f(range);
        drop(guard);
        Ok(())
    }

    /// Copies bytes out of the region.
    ///
    /// Peers and in-flight transfers may be writing the region concurrently: the bytes read
    /// are then unspecified (never undefined behaviour: no reference to the region's memory is
    /// formed). Synchronise with them through transfer completion or notifies.
    ///
    /// # Errors
    /// [`Error::OffsetOutOfBounds`] when the range is outside the region,
    /// [`Error::Deregistered`] when the region was deregistered.
    pub fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.with_range(offset, out.len(), |r| r.copy_out(out))
    }

    /// Copies bytes into the region (see [`Region::read_at`] on concurrent access).
    ///
    /// # Errors
    /// [`Error::OffsetOutOfBounds`] when the range is outside the region,
    /// [`Error::Deregistered`] when the region was deregistered.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.with_range(offset, data.len(), |r| r.copy_in(data))
    }

    /// Copies `len` bytes from `offset` of this region to `dst_offset` of `dst` (a local copy:
    /// no peer involved). `dst` may be this region; overlapping ranges then move as `memmove`
    /// does. Both regions are held registered (and owned buffers alive) during the copy.
    ///
    /// As for [`Region::read_at`], peers may touch either range meanwhile: the bytes are then
    /// unspecified, never undefined behaviour.
    ///
    /// # Errors
    /// [`Error::OffsetOutOfBounds`] for a range outside its region (naming it),
    /// [`Error::Deregistered`] when either region was deregistered.
    pub fn copy_to(&self, offset: u64, dst: &Region, dst_offset: u64, len: u64) -> Result<()> {
        let n = usize::try_from(len).map_err(|_| Error::OffsetOutOfBounds {
            offset,
            len,
            region_len: self.inner.len,
        })?;
        if Arc::ptr_eq(&self.inner, &dst.inner) {
            self.check_bounds(offset, n)?;
            self.check_bounds(dst_offset, n)?;
            // One guard over the whole region; both ranges are checked sub-ranges of it.
            return self.with_range(0, self.inner.len as usize, |all| {
                let src = all.from(offset as usize).to(n);
                all.from(dst_offset as usize).to(n).copy_from(&src);
            });
        }
        // Lock in region-id order so that two opposite copies cannot deadlock.
        let mut inner = Ok(());
        if self.inner.id.0 < dst.inner.id.0 {
            self.with_range(offset, n, |src| {
                inner = dst.with_range(dst_offset, n, |d| d.copy_from(&src));
            })?;
        } else {
            dst.with_range(dst_offset, n, |d| {
                inner = self.with_range(offset, n, |src| d.copy_from(&src));
            })?;
        }
        inner
    }

    fn check_bounds(&self, offset: u64, len: usize) -> Result<()> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.inner.len => Ok(()),
            _ => Err(Error::OffsetOutOfBounds {
                offset,
                len: len as u64,
                region_len: self.inner.len,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_buffers_are_aligned_zeroed_and_sized() {
        for len in [1, 100, 4095, 4096, 4097, 1 << 20, (1 << 20) + 3] {
            let mut b = HostBuffer::zeroed(len).unwrap();
            assert_eq!(b.as_ptr() as usize % PAGE, 0, "{len}");
            assert_eq!(b.as_mut_ptr(), b.as_ptr());
            assert_eq!(b.as_slice().len(), len);
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_slice().fill(0x5a);
            assert_eq!(b.as_slice().as_ptr(), b.as_ptr().cast_const());
        }
        assert!(HostBuffer::zeroed(0).is_err());
        assert!(HostBuffer::zeroed(usize::MAX).is_err());
    }

    fn owned_region(id: u64, len: usize) -> Region {
        let mut buf = HostBuffer::zeroed(len).unwrap();
        let addr = buf.as_mut_ptr() as u64;
        let backing = Backing {
            owned: Some(Owned::Host(buf)),
            mr: None,
        };
        Region {
            inner: Arc::new(RegionInner::new(
                RegionId(id),
                addr,
                len as u64,
                MemKind::Host,
                Access::REMOTE_RW,
                id,
                backing,
            )),
        }
    }

    #[tokio::test]
    async fn local_copies_between_and_within_regions() {
        let (a, b) = (owned_region(2, 4096), owned_region(1, 4096));
        let pattern: Vec<u8> = (0..100u8).collect();
        a.write_at(10, &pattern).unwrap();
        // Both lock orders (ids 2 → 1 and 1 → 2).
        a.copy_to(10, &b, 4000, 96).unwrap();
        b.copy_to(4000, &a, 1000, 96).unwrap();
        let mut out = vec![0u8; 96];
        a.read_at(1000, &mut out).unwrap();
        assert_eq!(out, pattern[..96]);
        // Within one region, overlapping forwards: memmove semantics.
        a.copy_to(10, &a, 20, 100).unwrap();
        let mut out = vec![0u8; 100];
        a.read_at(20, &mut out).unwrap();
        assert_eq!(out, pattern);
        // Bounds, named; nothing copied on a refusal.
        let e = a.copy_to(4000, &b, 0, 97).unwrap_err();
        assert!(e.to_string().contains("4000"), "{e}");
        let e = a.copy_to(0, &b, 4090, 7).unwrap_err();
        assert!(e.to_string().contains("4090"), "{e}");
        let e = a.copy_to(0, &a, 4090, 7).unwrap_err();
        assert!(e.to_string().contains("4090"), "{e}");
        assert!(a.copy_to(0, &b, 0, u64::MAX).is_err());
        // A deregistered side refuses.
        b.inner.revoke_and_drain().await;
        assert!(matches!(
            a.copy_to(0, &b, 0, 1),
            Err(Error::Deregistered { .. })
        ));
        assert!(matches!(
            b.copy_to(0, &a, 0, 1),
            Err(Error::Deregistered { .. })
        ));
    }

    #[tokio::test]
    async fn lease_ranges_and_region_copies_stay_inside_the_region() {
        let mut buf = HostBuffer::zeroed(8192).unwrap();
        buf.as_mut_slice()[..4].copy_from_slice(b"head");
        let addr = buf.as_mut_ptr() as u64;
        let backing = Backing {
            owned: Some(Owned::Host(buf)),
            mr: None,
        };
        let inner = Arc::new(RegionInner::new(
            RegionId(1),
            addr,
            8192,
            MemKind::Host,
            Access::REMOTE_RW,
            7,
            backing,
        ));
        let region = Region {
            inner: inner.clone(),
        };
        {
            let lease = Lease::new(&inner);
            assert!(lease.range(addr, 8192).is_ok());
            assert!(lease.range(addr + 8191, 1).is_ok());
            assert!(lease.range(addr + 8192, 0).is_ok());
            assert!(lease.range(addr + 8191, 2).is_err());
            assert!(lease.range(addr - 1, 1).is_err());
            assert!(lease.range(addr, u64::MAX).is_err());
            let mut head = [0u8; 4];
            lease.range(addr, 4).unwrap().copy_out(&mut head);
            assert_eq!(&head, b"head");
        }
        region.write_at(8190, b"xy").unwrap();
        assert!(region.write_at(8191, b"xy").is_err());
        let mut out = [0u8; 2];
        region.read_at(8190, &mut out).unwrap();
        assert_eq!(&out, b"xy");
        assert!(region.read_at(u64::MAX, &mut out).is_err());
        let back = inner.revoke_and_drain().await.unwrap();
        assert_eq!(&back.as_slice()[8190..], b"xy");
        assert_eq!(&back.as_slice()[..4], b"head");
        assert!(region.read_at(0, &mut out).is_err(), "deregistered");
    }
}
