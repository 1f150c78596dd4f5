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
/// Its bytes are read and written by copies ([`RegisteredBuffer::read_at`],
/// [`RegisteredBuffer::write_at`]), never through a Rust reference: the device writes into the
/// buffer (an incoming RDMA WRITE, an RDMA READ landing here) whenever the peer's protocol
/// says, which a `&[u8]` would promise never happens while it lives.
pub struct RegisteredBuffer {
    // Dropped by hand in Drop: the region is deregistered before `mem` is freed.
    mr: ManuallyDrop<MemoryRegion>,
    mem: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is uniquely owned heap memory; the MR is Send.
unsafe impl Send for RegisteredBuffer {}
// SAFETY: &RegisteredBuffer only copies bytes out and gives immutable keys.
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

    /// Copies `dst.len()` bytes from `offset` out of the buffer. The buffer is memory the
    /// device may write at any time (an incoming RDMA WRITE, a READ landing here), so no Rust
    /// reference is ever formed over it: bytes move in and out by copies, and a copy that races
    /// the device yields unspecified bytes, never a broken aliasing promise.
    ///
    /// # Errors
    /// [`VerbsError::Invalid`] for a range past the buffer.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len())?;
        // SAFETY: [offset, offset + dst.len()) lies in the len bytes at mem (checked), which
        // self owns; dst is a distinct Rust buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.mem.as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        Ok(())
    }

    /// Copies `src` into the buffer at `offset` (see [`RegisteredBuffer::read_at`]).
    ///
    /// # Errors
    /// [`VerbsError::Invalid`] for a range past the buffer.
    pub fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len())?;
        // SAFETY: as in read_at, the other way.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.mem.as_ptr().add(offset), src.len())
        };
        Ok(())
    }

    /// A copy of the whole buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        // In range by construction.
        let _ = self.read_at(0, &mut v);
        v
    }

    /// Sets every byte to `byte`.
    pub fn fill(&mut self, byte: u8) {
        // SAFETY: mem points to len bytes owned by self; write_bytes forms no reference.
        unsafe { std::ptr::write_bytes(self.mem.as_ptr(), byte, self.len) };
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(VerbsError::Invalid {
                what: "buffer range",
                reason: format!("{len} bytes at {offset} of a {}-byte buffer", self.len),
            }),
        }
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
