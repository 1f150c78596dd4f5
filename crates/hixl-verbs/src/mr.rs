//! Protection domains and memory regions: registering a range with the device gives the lkey
//! local work requests name it by and the rkey a peer's RDMA READ/WRITE must present.

use std::sync::Arc;

use hixl_core::Access;

use crate::context::Context;
use crate::error::{Result, VerbsError};
use crate::sys;

/// A protection domain (`ibv_pd`): memory regions and QPs of one domain can be used together.
/// Cheap to clone; deallocated after the last clone, MR and QP are gone.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) inner: Arc<PdInner>,
}

pub(crate) struct PdInner {
    pd: *mut sys::ibv_pd,
    ctx: Context,
}

// SAFETY: an ibv_pd is a kernel handle; libibverbs verbs on it are thread-safe and the Rust
// side never mutates the pointer after allocation.
unsafe impl Send for PdInner {}
// SAFETY: see Send.
unsafe impl Sync for PdInner {}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("device", &self.inner.ctx.name())
            .finish()
    }
}

impl ProtectionDomain {
    /// Allocates a protection domain on the device.
    ///
    /// # Errors
    /// The errno of `ibv_alloc_pd`.
    pub fn new(ctx: &Context) -> Result<ProtectionDomain> {
        // SAFETY: the context is open for as long as the PD holds its clone.
        let pd = unsafe { sys::ibv_alloc_pd(ctx.raw()) };
        if pd.is_null() {
            return Err(VerbsError::verb(
                "ibv_alloc_pd",
                ctx.name(),
                sys::last_error(),
            ));
        }
        Ok(ProtectionDomain {
            inner: Arc::new(PdInner {
                pd,
                ctx: ctx.clone(),
            }),
        })
    }

    /// The device it belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    pub(crate) fn raw(&self) -> *mut sys::ibv_pd {
        self.inner.pd
    }
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: pd came from ibv_alloc_pd; every MR and QP of it holds a clone of the Arc
        // around this, so none is left.
        let rc = unsafe { sys::ibv_dealloc_pd(self.pd) };
        if rc != 0 {
            tracing::warn!(device = self.ctx.name(), rc, "ibv_dealloc_pd failed");
        }
    }
}

/// A registered memory region (`ibv_mr`). Dropping it deregisters the range: from then on the
/// device refuses its rkey (a peer's READ/WRITE completes with a remote access error).
pub struct MemoryRegion {
    mr: *mut sys::ibv_mr,
    pd: ProtectionDomain,
    addr: u64,
    len: u64,
    lkey: u32,
    rkey: u32,
    access: Access,
}

// SAFETY: the MR is a kernel handle; deregistration (the only mutation) happens in Drop with
// exclusive access, and libibverbs' verbs are thread-safe.
unsafe impl Send for MemoryRegion {}
// SAFETY: &MemoryRegion only reads immutable fields.
unsafe impl Sync for MemoryRegion {}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("access", &self.access)
            .finish()
    }
}

/// The `ibv_access_flags` for a hixl access set. Local write is always granted: an RDMA READ
/// lands in local memory, and the verbs spec requires it for remote write.
pub(crate) fn access_flags(access: Access) -> u32 {
    let mut f = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    if access.contains(Access::REMOTE_READ) {
        f |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    if access.contains(Access::REMOTE_WRITE) {
        f |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    f
}

impl MemoryRegion {
    /// Registers `len` bytes at `addr` with the device, granting `access` to peers (local
    /// write is always granted).
    ///
    /// # Safety
    /// `[addr, addr + len)` must be memory of this process that stays mapped until the region
    /// is dropped *and* until every work request naming its lkey or rkey has completed (been
    /// polled): the device reads and writes it without the CPU. Registration pins the pages;
    /// unmapping or remapping them while registered leaves the device using the old pages.
    /// Writes the device makes (RDMA READ into it, or a peer's RDMA WRITE) race with any
    /// concurrent Rust access, which must therefore be synchronised through completions.
    ///
    /// # Errors
    /// [`VerbsError::Invalid`] for a zero length or an overflowing range; the errno of
    /// `ibv_reg_mr` (`ENOMEM` beyond `RLIMIT_MEMLOCK`, `EFAULT` for unmapped memory).
    pub unsafe fn register(
        pd: &ProtectionDomain,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion> {
        if len == 0 || (addr as usize).checked_add(len).is_none() {
            return Err(VerbsError::Invalid {
                what: "memory region",
                reason: format!("{addr:p}+{len} is empty or overflows"),
            });
        }
        // SAFETY: the PD is live; the caller guarantees the range is mapped memory that
        // outlives the registration (this function's contract).
        let mr = unsafe {
            sys::ibv_reg_mr(
                pd.raw(),
                addr.cast(),
                len,
                access_flags(access) as libc::c_int,
            )
        };
        if mr.is_null() {
            return Err(VerbsError::verb(
                "ibv_reg_mr",
                pd.context().name(),
                sys::last_error(),
            ));
        }
        // SAFETY: a non-null result of ibv_reg_mr points to an initialised ibv_mr.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(MemoryRegion {
            mr,
            pd: pd.clone(),
            addr: addr as u64,
            len: len as u64,
            lkey,
            rkey,
            access,
        })
    }

    /// First byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Always false: zero-length regions are refused.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Key local work requests name the region by.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    /// Key a peer presents to READ or WRITE the region.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
    /// Accesses granted to peers.
    pub fn access(&self) -> Access {
        self.access
    }
    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// `len` bytes at `offset` as the local side of a work request, if inside the region.
    pub fn local(&self, offset: u64, len: u64) -> Option<LocalRange> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then(|| LocalRange {
            addr: self.addr + offset,
            len,
            lkey: self.lkey,
        })
    }

    /// What a peer needs to READ or WRITE this region (sent out of band).
    pub fn remote(&self) -> RemoteMemory {
        RemoteMemory {
            addr: self.addr,
            len: self.len,
            rkey: self.rkey,
        }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: mr came from ibv_reg_mr and is deregistered once; the PD is still allocated
        // (self.pd holds it).
        let rc = unsafe { sys::ibv_dereg_mr(self.mr) };
        if rc != 0 {
            tracing::warn!(addr = self.addr, len = self.len, rc, "ibv_dereg_mr failed");
        }
    }
}

/// A local range inside a registered region: the scatter/gather entry of a work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalRange {
    /// First byte.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// The region's lkey.
    pub lkey: u32,
}

/// A peer's registered region as it was announced out of band.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteMemory {
    /// First byte, in the peer's address space.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// The peer's rkey.
    pub rkey: u32,
}

impl RemoteMemory {
    /// The address `offset` bytes in, if `len` bytes from there stay inside the region. (The
    /// device checks this too, but only after posting, by failing the QP.)
    pub fn at(&self, offset: u64, len: u64) -> Option<RemoteRange> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then(|| RemoteRange {
            addr: self.addr + offset,
            rkey: self.rkey,
        })
    }
}

/// The remote side of a work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteRange {
    /// First byte, in the peer's address space.
    pub addr: u64,
    /// The peer's rkey for it.
    pub rkey: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_bounds_checked() {
        let r = RemoteMemory {
            addr: 0x1000,
            len: 0x100,
            rkey: 7,
        };
        assert_eq!(
            r.at(0, 0x100),
            Some(RemoteRange {
                addr: 0x1000,
                rkey: 7
            })
        );
        assert_eq!(r.at(0x80, 0x80).map(|x| x.addr), Some(0x1080));
        assert_eq!(r.at(0x80, 0x81), None);
        assert_eq!(r.at(u64::MAX, 2), None);
        assert_eq!(
            access_flags(Access::LOCAL),
            sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
        );
        assert_eq!(access_flags(Access::REMOTE_RW) & 0b110, 0b110);
    }
}
