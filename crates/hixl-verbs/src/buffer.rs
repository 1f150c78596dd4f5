//! A page-aligned heap buffer registered as a memory region, owned together: the safe way to get
//! registered memory when the caller does not already have some.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use hixl_core::Access;

use crate::error::{Result, VerbsError};
use crate::mr::{LocalRange, MemoryRegion, ProtectionDomain, RemoteMemory};

const PAGE: usize = 4096;

/// Zeroed, page-aligned memory plus its memory region. The region is deregistered before the
/// memory is freed.
///
/// The slices it hands out are ordinary Rust borrows: the device writes into the buffer
/// (incoming RDMA WRITE, or an RDMA READ landing here) only as the `# Safety` contract of
/// [`crate::QueuePair::post_chain`] and the peer's protocol allow, so reading a slice while
/// such a write is in flight is the caller's race to avoid.
pub struct RegisteredBuffer {
    // Dropped by hand in Drop: the region is deregistered before `mem` is freed.
    mr: ManuallyDrop<MemoryRegion>,
    mem: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is uniquely owned heap memory; the MR is Send.
unsafe impl Send for RegisteredBuffer {}
// SAFETY: &RegisteredBuffer only gives shared slices and immutable keys.
unsafe impl Sync for RegisteredBuffer {}

impl std::fmt::Debug for RegisteredBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredBuffer")
            .field("mr", &self.mr)
            .finish()
    }
}

impl RegisteredBuffer {
    /// Allocates `len` zeroed bytes (page-aligned) and registers them with `access`.
    ///
    /// # Errors
    /// [`VerbsError::Invalid`] for a zero or unrepresentable length; allocation failure; the
    /// errors of [`MemoryRegion::register`].
    pub fn new(pd: &ProtectionDomain, len: usize, access: Access) -> Result<RegisteredBuffer> {
        let layout =
            Layout::from_size_align(len.max(1), PAGE).map_err(|e| VerbsError::Invalid {
                what: "buffer length",
                reason: e.to_string(),
            })?;
        if len == 0 {
            return Err(VerbsError::Invalid {
                what: "buffer length",
                reason: "zero".into(),
            });
        }
        // SAFETY: layout has a non-zero size.
        let mem =
            NonNull::new(unsafe { alloc_zeroed(layout) }).ok_or_else(|| VerbsError::Invalid {
                what: "buffer length",
                reason: format!("cannot allocate {len} bytes"),
            })?;
        // SAFETY: mem points to len bytes we own; they stay allocated until after the region is
        // deregistered (Drop takes the region first).
        let mr = match unsafe { MemoryRegion::register(pd, mem.as_ptr(), len, access) } {
            Ok(mr) => mr,
            Err(e) => {
                // SAFETY: allocated above with this layout, never registered.
                unsafe { dealloc(mem.as_ptr(), layout) };
                return Err(e);
            }
        };
        Ok(RegisteredBuffer {
            mr: ManuallyDrop::new(mr),
            mem,
            len,
        })
    }

    /// The memory region.
    pub fn mr(&self) -> &MemoryRegion {
        &self.mr
    }

    /// The whole buffer.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: mem points to len initialised (zeroed) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.mem.as_ptr(), self.len) }
    }

    /// The whole buffer, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as as_slice, and &mut self makes the borrow unique on the Rust side.
        unsafe { std::slice::from_raw_parts_mut(self.mem.as_ptr(), self.len) }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (zero-length buffers are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// See [`MemoryRegion::local`].
    pub fn local(&self, offset: u64, len: u64) -> Option<LocalRange> {
        self.mr().local(offset, len)
    }

    /// See [`MemoryRegion::remote`].
    pub fn remote(&self) -> RemoteMemory {
        self.mr().remote()
    }
}

impl Drop for RegisteredBuffer {
    fn drop(&mut self) {
        // SAFETY: the region is dropped exactly once, here, and never used afterwards.
        unsafe { ManuallyDrop::drop(&mut self.mr) };
        // SAFETY: allocated in new with exactly this layout (validated there); the region that
        // pinned it is gone.
        unsafe {
            dealloc(
                self.mem.as_ptr(),
                Layout::from_size_align_unchecked(self.len.max(1), PAGE),
            )
        };
    }
}
