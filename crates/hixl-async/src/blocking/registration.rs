//! Memory registration of the blocking facade (HIXL `RegisterMem` / `DeregisterMem`).

#[cfg(doc)]
use hixl_core::Error;
use hixl_core::{Access, MemDesc, MemKind, Result};

use super::{Hixl, MemHandle};
use crate::{HostBuffer, Region};

impl Hixl {
    /// Registers memory the caller owns for remote read and write (HIXL `RegisterMem`).
    /// Registering the identical `(addr, len)` again returns the same handle. Register before
    /// [`Hixl::connect`]: as in HIXL, a link only sees the memory the peer had registered
    /// when it was set up (hixl also pushes later changes, but do not rely on it for HIXL
    /// portability). Does not block.
    ///
    /// # Safety
    /// `desc` must describe memory that stays valid for reads and writes for its whole length
    /// until [`Hixl::deregister_mem`] has returned for the handle or [`Hixl::finalize`] has
    /// returned (and no clone from [`Hixl::engine`] is still in use): peers may read and write
    /// it at any time until then, concurrently with this process. Do not hold Rust references
    /// to it while transfers may touch it.
    ///
    /// # Errors
    /// [`Error::NotInitialized`], [`Error::NullAddress`], [`Error::ZeroLength`],
    /// [`Error::RangeOverflow`], [`Error::Overlap`] (a partial overlap with a registered region
    /// of the same kind), [`Error::Unsupported`] for [`MemKind::Device`] (no device runtime).
    pub unsafe fn register_mem(&self, desc: MemDesc, kind: MemKind) -> Result<MemHandle> {
        self.with(|i| {
            // SAFETY: the caller upholds register_raw's contract, restated above.
            let r = unsafe { i.engine.register_raw(desc, kind, Access::REMOTE_RW, None) }?;
            Ok(r.id())
        })
    }

    /// Registers an owned host buffer for remote read and write (hixl extension; safe). The
    /// engine keeps the buffer until [`Hixl::deregister_mem`] or [`Hixl::finalize`]; the
    /// returned [`Region`] reads and writes it and gives its address for descriptors.
    ///
    /// # Errors
    /// [`Error::NotInitialized`].
    pub fn register_buffer(&self, buf: HostBuffer) -> Result<(MemHandle, Region)> {
        self.with(|i| {
            let r = i.engine.register(buf)?;
            Ok((r.id(), r))
        })
    }

    /// Ends a registration (HIXL `DeregisterMem`): peers lose access at once, then this waits
    /// until no in-flight transfer touches the region. An unknown or already deregistered
    /// handle is a successful no-op, as in HIXL. A buffer from [`Hixl::register_buffer`] is
    /// freed. Disconnect from peers first, as HIXL recommends.
    ///
    /// # Errors
    /// [`Error::NotInitialized`], [`Error::InsideRuntime`] from inside a tokio runtime.
    pub fn deregister_mem(&self, handle: MemHandle) -> Result<()> {
        self.with_blocking("deregister_mem", |i| {
            i.block_on("deregister_mem", i.engine.deregister_id(handle))??;
            Ok(())
        })
    }
}
