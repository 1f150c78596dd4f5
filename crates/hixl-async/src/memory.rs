//! Registered memory: owned host buffers, the region lease that in-flight ops hold, and the
//! user's `Region` handle.

use std::alloc::{self, Layout};
use std::any::Any;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hixl_core::{Access, Error, MemKind, RegionId, Result};

const PAGE: usize = 4096;

/// A page-aligned, zero-initialised host buffer that hixl can own while it is registered.
///
/// ```
/// let b = hixl_async::HostBuffer::zeroed(1 << 20).unwrap();
/// assert_eq!(b.len(), 1 << 20);
/// assert_eq!(b.as_ptr() as usize % 4096, 0);
/// ```
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: HostBuffer uniquely owns its allocation, like a Box<[u8]>.
unsafe impl Send for HostBuffer {}
// SAFETY: shared access only hands out `&[u8]` through `&self`.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Allocates `len` zeroed bytes aligned to 4 KiB.
    ///
    /// # Errors
    /// [`Error::ZeroLength`] for `len == 0`, [`Error::ResourceExhausted`] when the allocation
    /// fails.
    pub fn zeroed(len: usize) -> Result<HostBuffer> {
        if len == 0 {
            return Err(Error::ZeroLength { index: 0 });
        }
        let layout = Layout::from_size_align(len, PAGE).map_err(|_| Error::InvalidParam {
            what: format!("buffer length {len} is too large"),
        })?;
        // SAFETY: layout has non-zero size (checked above).
        let p = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).ok_or_else(|| Error::ResourceExhausted {
            what: format!("allocating {len} bytes of host memory"),
        })?;
        Ok(HostBuffer { ptr, len })
    }

    /// Start address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a buffer has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of len bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // The layout was valid at allocation with the same len and alignment.
        if let Ok(layout) = Layout::from_size_align(self.len, PAGE) {
            // SAFETY: allocated by alloc_zeroed with this layout, freed once.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuffer")
            .field("addr", &self.ptr)
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
    #[allow(dead_code)]
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
    #[allow(dead_code)]
    pub(crate) keep: Box<dyn Any + Send + Sync>,
    /// `(local key, remote key)` for work requests and for peers.
    pub(crate) keys: (u32, u32),
}

impl std::fmt::Debug for DeviceMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMr")
            .field("keys", &self.keys)
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
    /// Local key of `mr` for work requests of this engine (read by verbs).
    #[allow(dead_code)]
    pub(crate) lkey: Option<u32>,
    /// Remote key of `mr` that peers' devices present (read by verbs).
    #[allow(dead_code)]
    pub(crate) dev_rkey: Option<u32>,
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
        let (lkey, dev_rkey) = match &mr {
            Some(m) => (Some(m.keys.0), Some(m.keys.1)),
            None => (None, None),
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
            lkey,
            dev_rkey,
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
        let mr = self.mr.lock().ok().and_then(|mut m| m.take());
        drop(mr);
        match self.owned.lock().ok().and_then(|mut o| o.take()) {
            Some(Owned::Host(b)) => Some(b),
            Some(Owned::Pooled(_)) | None => None,
        }
    }

    /// `f` of the transport memory this region owns, when it is a `T` (the fabric asks for
    /// its pool buffers).
    #[allow(dead_code)]
    pub(crate) fn pooled<T: Any, R>(&self, f: impl FnOnce(&T) -> R) -> Option<R> {
        let g = self.owned.lock().ok()?;
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

/// A raw pointer into leased memory that may cross threads: the lease that travels with it
/// keeps the memory valid.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MemPtr(pub(crate) *mut u8);
// SAFETY: a MemPtr is only dereferenced while a Lease on its region is held by the same op.
unsafe impl Send for MemPtr {}
// SAFETY: as above.
unsafe impl Sync for MemPtr {}

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
    /// [`Error::InvalidParam`] when `offset` is past the end.
    pub fn addr_at(&self, offset: u64) -> Result<u64> {
        if offset >= self.inner.len {
            return Err(Error::InvalidParam {
                what: format!(
                    "offset {offset} is past the end of a {}-byte region",
                    self.inner.len
                ),
            });
        }
        Ok(self.inner.addr + offset)
    }

    /// Runs `f` with the region's memory guaranteed live: bounds-checked, and the owned buffer
    /// (if any) locked so deregistration cannot free it meanwhile.
    fn with_mem(&self, offset: u64, len: usize, f: impl FnOnce(*mut u8)) -> Result<()> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.inner.len => {}
            _ => {
                return Err(Error::InvalidParam {
                    what: format!(
                        "range {offset}+{len} is outside a {}-byte region",
                        self.inner.len
                    ),
                })
            }
        }
        let guard = self.inner.owned.lock().map_err(|_| Error::InvalidParam {
            what: "region lock poisoned".into(),
        })?;
        if self.inner.revoked.load(Ordering::SeqCst) {
            return Err(Error::InvalidParam {
                what: format!("region {:#x} was deregistered", self.inner.addr),
            });
        }
        f((self.inner.addr + offset) as *mut u8);
        drop(guard);
        Ok(())
    }

    /// Copies bytes out of the region (which peers may be writing concurrently: synchronise
    /// with them through transfer completion or notifies).
    ///
    /// # Errors
    /// [`Error::InvalidParam`] when the range is outside the region.
    pub fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let n = out.len();
        self.with_mem(offset, n, |p| {
            // SAFETY: the range is inside the region, whose memory with_mem keeps live (owned
            // buffers) or register_raw's contract keeps valid.
            unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), n) }
        })
    }

    /// Copies bytes into the region.
    ///
    /// # Errors
    /// [`Error::InvalidParam`] when the range is outside the region.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.with_mem(offset, data.len(), |p| {
            // SAFETY: as in read_at; the region is writable memory we registered.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) }
        })
    }

    /// A view of the whole region.
    ///
    /// # Safety
    /// No peer or local transfer may write the region while the slice lives, and the region
    /// must stay registered (or, for raw registrations, its memory valid) meanwhile.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: per the caller's contract.
        unsafe { std::slice::from_raw_parts(self.inner.addr as *const u8, self.inner.len as usize) }
    }
}
