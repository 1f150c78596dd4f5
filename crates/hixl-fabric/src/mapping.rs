//! A peer's fabric buffer mapped into this process, after checking that the peer cannot make it
//! SIGBUS us.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use hixl_core::{Error, Result};

use crate::placement::SharedMap;

/// A peer's exported memfd, mapped read/write and shared. Dropping it unmaps; the peer's own
/// buffer is unaffected.
///
/// Before mapping, [`PeerMapping::map`] checks that the file is at least `len` bytes and carries
/// `F_SEAL_SHRINK`: a peer that could truncate the file under our mapping would turn our next
/// access into a SIGBUS. Seals can only be added, never removed, so the check stays true.
#[derive(Debug)]
pub struct PeerMapping {
    map: SharedMap,
    len: u64,
    translated: bool,
}

impl PeerMapping {
    /// Maps the first `len` bytes of `fd`, at `want_addr` (the peer's own address of the buffer,
    /// for the unified VA window) with `MAP_FIXED_NOREPLACE` when given. When the address cannot
    /// be had the mapping goes wherever the OS puts it and [`PeerMapping::translated`] is true.
    /// The fd is closed once mapped; the mapping keeps the pages alive.
    ///
    /// # Errors
    /// [`Error::ZeroLength`] for `len == 0`; [`Error::InvalidParam`] when the file is not sealed
    /// against shrinking or is shorter than `len`; [`Error::Io`] when `fstat`, `F_GET_SEALS` or
    /// `mmap` fail.
    pub fn map(fd: OwnedFd, len: u64, want_addr: Option<u64>) -> Result<PeerMapping> {
        if len == 0 {
            return Err(Error::ZeroLength { index: 0 });
        }
        // SAFETY: all-zero is a valid `stat`; fstat fills it from a descriptor we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: live descriptor and live stat buffer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(Error::io(
                "fstat of a peer's fabric memfd",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: plain syscall on a descriptor we own.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINVAL) {
                return Err(unsealed(
                    "it does not support seals (not a memfd or shmem file)",
                ));
            }
            return Err(Error::io("F_GET_SEALS on a peer's fabric memfd", e));
        }
        if seals & libc::F_SEAL_SHRINK == 0 {
            return Err(unsealed("F_SEAL_SHRINK is not set"));
        }
        let size = u64::try_from(st.st_size).unwrap_or(0);
        if size < len {
            return Err(Error::InvalidParam {
                what: format!(
                    "peer fabric memfd is {size} bytes, shorter than the {len} bytes it was \
                     exported with; refusing to map it"
                ),
            });
        }
        let (map, miss) = SharedMap::map(fd.as_fd(), len, want_addr)
            .map_err(|e| Error::io(format!("mapping a peer's {len}-byte fabric buffer"), e))?;
        if let (Some(want), Some(miss)) = (want_addr, &miss) {
            tracing::info!(
                wanted = format_args!("{want:#x}"),
                got = format_args!("{:#x}", map.addr()),
                len,
                reason = %miss,
                "peer fabric buffer mapped outside the unified VA window; addresses are translated"
            );
        }
        Ok(PeerMapping {
            map,
            len,
            translated: miss.is_some(),
        })
    }

    /// Where the buffer starts in this process.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr()
    }

    /// Where the buffer starts in this process, as an integer address.
    pub fn addr(&self) -> u64 {
        self.map.addr()
    }

    /// The mapped length that was asked for.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Never true: zero-length mappings are refused.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when a wanted address was given but could not be had.
    pub fn translated(&self) -> bool {
        self.translated
    }

    /// The local address of the peer's range `remote_addr .. remote_addr + len`, where the peer
    /// has the buffer at `remote_base`. `None` unless the whole range lies inside the mapping.
    ///
    /// ```no_run
    /// # fn f(m: &hixl_fabric::PeerMapping) {
    /// let base = 0x2800_0000_0000; // the peer's address of the buffer
    /// let local = m.translate(base + 4096, base, 512).expect("in bounds");
    /// assert_eq!(local, m.addr() + 4096);
    /// # }
    /// ```
    pub fn translate(&self, remote_addr: u64, remote_base: u64, len: u64) -> Option<u64> {
        let off = remote_addr.checked_sub(remote_base)?;
        let end = off.checked_add(len)?;
        if end > self.len {
            return None;
        }
        Some(self.addr() + off)
    }
}

fn unsealed(why: &str) -> Error {
    Error::InvalidParam {
        what: format!(
            "peer fabric memfd is not sealed against shrinking ({why}); mapping it could SIGBUS \
             this process, refusing"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::FabricPool;
    use std::os::fd::FromRawFd;

    fn memfd(len: i64, seals: libc::c_int) -> OwnedFd {
        // SAFETY: valid NUL-terminated name; result checked.
        let fd = unsafe {
            libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        assert!(fd >= 0);
        // SAFETY: fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain syscalls on a descriptor we own.
        unsafe {
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), len), 0);
            if seals != 0 {
                assert_eq!(libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals), 0);
            }
        }
        fd
    }

    #[test]
    fn refuses_unsealed_and_short_files() {
        let e = PeerMapping::map(memfd(8192, 0), 8192, None).unwrap_err();
        assert!(e.to_string().contains("F_SEAL_SHRINK"), "{e}");
        assert!(e.to_string().contains("SIGBUS"), "{e}");
        // Sealed against growth only: still refused.
        let e = PeerMapping::map(memfd(8192, libc::F_SEAL_GROW), 8192, None).unwrap_err();
        assert!(e.to_string().contains("F_SEAL_SHRINK"), "{e}");
        let e = PeerMapping::map(memfd(4096, libc::F_SEAL_SHRINK), 8192, None).unwrap_err();
        assert!(
            e.to_string().contains("4096 bytes, shorter than the 8192"),
            "{e}"
        );
        assert!(matches!(
            PeerMapping::map(memfd(4096, libc::F_SEAL_SHRINK), 0, None),
            Err(Error::ZeroLength { .. })
        ));
        // A file that cannot carry seals at all (a pipe end).
        let mut p = [0; 2];
        // SAFETY: p has room for two descriptors.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: fresh descriptors, each owned once.
        let (r, _w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        let e = PeerMapping::map(r, 4096, None).unwrap_err();
        assert!(e.to_string().contains("seal"), "{e}");
    }

    #[test]
    fn maps_a_pool_buffer_and_shares_its_pages() {
        let pool = FabricPool::new(1 << 20, None).unwrap();
        let buf = pool.alloc(10_000).unwrap();
        let fd = buf.fd().try_clone_to_owned().unwrap();
        let m = PeerMapping::map(fd, buf.len(), None).unwrap();
        assert!(!m.translated());
        assert_ne!(m.addr(), buf.addr());
        // SAFETY: both mappings are live and 10_000 bytes long; single-threaded access.
        unsafe {
            m.as_ptr().add(9_999).write(0x5a);
            assert_eq!(buf.as_ptr().add(9_999).read(), 0x5a);
        }
        assert_eq!(
            m.translate(buf.addr() + 100, buf.addr(), 9_900),
            Some(m.addr() + 100)
        );
        assert_eq!(m.translate(buf.addr() + 100, buf.addr(), 9_901), None);
        assert_eq!(m.translate(buf.addr() - 1, buf.addr(), 1), None);
        assert_eq!(m.translate(u64::MAX, buf.addr(), 2), None);
    }

    #[test]
    fn wanted_address_taken_means_translated() {
        let pool = FabricPool::new(1 << 20, None).unwrap();
        let buf = pool.alloc(4096).unwrap();
        // Our own buffer occupies the wanted address, as a peer's would in the same window.
        let fd = buf.fd().try_clone_to_owned().unwrap();
        let m = PeerMapping::map(fd, buf.len(), Some(buf.addr())).unwrap();
        assert!(m.translated());
        assert_ne!(m.addr(), buf.addr());
        drop(m);
        // A free address is had exactly.
        let want = 45u64 << 40;
        let fd = buf.fd().try_clone_to_owned().unwrap();
        let m = PeerMapping::map(fd, buf.len(), Some(want)).unwrap();
        assert!(!m.translated());
        assert_eq!(m.addr(), want);
    }
}
