//! A read/write `MAP_SHARED` mapping of a file, placed at a wanted virtual address when it can be
//! had (the unified VA window) and wherever the OS puts it otherwise.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::OnceLock;

/// The system page size in bytes.
pub fn page_size() -> u64 {
    static PAGE: OnceLock<u64> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        u64::try_from(n).ok().filter(|&p| p > 0).unwrap_or(4096)
    })
}

/// `len` rounded up to a whole number of pages; `None` on overflow.
pub(crate) fn round_to_page(len: u64) -> Option<u64> {
    let p = page_size();
    len.checked_add(p - 1).map(|v| v & !(p - 1))
}

/// Why a mapping did not land where it was wanted.
#[derive(Debug)]
pub(crate) enum Miss {
    /// The kernel refused the fixed placement (EEXIST: something is mapped there; ENOMEM or
    /// EINVAL: outside the address space or misaligned).
    Refused(io::Error),
    /// The kernel predates `MAP_FIXED_NOREPLACE` (< 4.17), took the address as a hint and put
    /// the mapping elsewhere.
    HintIgnored {
        /// Where it went instead.
        got: u64,
    },
}

impl std::fmt::Display for Miss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Miss::Refused(e) => write!(f, "fixed placement refused: {e}"),
            Miss::HintIgnored { got } => {
                write!(f, "kernel treated the address as a hint and chose {got:#x}")
            }
        }
    }
}

/// An owned mapping; unmapped on drop.
#[derive(Debug)]
pub(crate) struct SharedMap {
    ptr: NonNull<u8>,
    /// Mapped length (page-rounded).
    len: usize,
}

// SAFETY: SharedMap is an address range this process owns exclusively as a mapping; it holds no
// thread-affine state, and all access to the bytes goes through raw pointers whose users carry
// their own synchronisation contract.
unsafe impl Send for SharedMap {}
// SAFETY: as above; `&SharedMap` only exposes the address and length.
unsafe impl Sync for SharedMap {}

impl SharedMap {
    /// Maps `len` bytes of `fd` from offset 0, read/write and shared, at `want` with
    /// `MAP_FIXED_NOREPLACE` if given. Returns the mapping and, when it is not at `want`,
    /// why (the caller logs it and marks the mapping translated).
    ///
    /// # Errors
    /// The OS error of the final `mmap` when the file cannot be mapped anywhere.
    pub(crate) fn map(
        fd: BorrowedFd<'_>,
        len: u64,
        want: Option<u64>,
    ) -> io::Result<(SharedMap, Option<Miss>)> {
        let len = round_to_page(len)
            .and_then(|l| usize::try_from(l).ok())
            .filter(|&l| l > 0)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mut miss = None;
        if let Some(want) = want {
            match Self::mmap(fd, len, want, libc::MAP_FIXED_NOREPLACE) {
                Ok(m) if m.addr() == want => return Ok((m, None)),
                Ok(m) => {
                    // An old kernel ignored the flag and chose another place: keep the mapping,
                    // it is valid, just not where it was wanted.
                    let got = m.addr();
                    return Ok((m, Some(Miss::HintIgnored { got })));
                }
                Err(e) => miss = Some(Miss::Refused(e)),
            }
        }
        let m = Self::mmap(fd, len, 0, 0)?;
        Ok((m, miss))
    }

    fn mmap(fd: BorrowedFd<'_>, len: usize, addr: u64, extra: libc::c_int) -> io::Result<Self> {
        // SAFETY: mmap with MAP_SHARED of a caller-owned fd creates a new mapping; without
        // MAP_FIXED (MAP_FIXED_NOREPLACE never replaces) it cannot clobber existing mappings, so
        // no live Rust memory is affected. The result is checked before use.
        let p = unsafe {
            libc::mmap(
                addr as usize as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | extra,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))?;
        Ok(SharedMap { ptr, len })
    }

    /// Start of the mapping.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Start of the mapping as an integer address.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as usize as u64
    }

    /// Mapped length in bytes (whole pages).
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe exactly the mapping this value created and owns; nothing
        // borrows from it past its owner's lifetime (owners hand out raw pointers only, under
        // contracts that end with the owner).
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        if rc != 0 {
            tracing::warn!(
                addr = self.addr(),
                len = self.len,
                error = %io::Error::last_os_error(),
                "munmap of a fabric mapping failed"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_round_up() {
        let p = page_size();
        assert!(p.is_power_of_two());
        assert_eq!(round_to_page(1), Some(p));
        assert_eq!(round_to_page(p), Some(p));
        assert_eq!(round_to_page(p + 1), Some(2 * p));
        assert_eq!(round_to_page(u64::MAX), None);
    }
}
