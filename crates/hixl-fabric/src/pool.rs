//! The fabric memory pool: buffers backed by sealed memfds that peers on this host can map,
//! optionally placed in a unified virtual-address window shared by every process.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};

use hixl_core::{Error, Result};

use crate::placement::{page_size, round_to_page, SharedMap};

/// The seals every pool memfd carries. `F_SEAL_SHRINK` is what protects a peer that maps the
/// buffer: the file can never become shorter than its mapping, so touching it never SIGBUSes.
pub const POOL_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// Allocates fabric buffers, each its own sealed memfd mapped `MAP_SHARED`.
///
/// `capacity` bounds the bytes (page-rounded) of live buffers. With a window, buffers are placed
/// at `start + offset`, offsets taken first-fit from `[0, capacity)` and returned on drop, so
/// the same offsets serve again after churn. A buffer whose window address cannot be had (taken
/// by another mapping, or no contiguous offset is free) is mapped where the OS chooses and
/// marked [`FabricBuf::translated`].
///
/// HIXL configures the window with `fabric_memory.start_address` and
/// `fabric_memory.max_capacity`, both in TB (default start 40 TB); the caller converts:
///
/// ```
/// # fn main() -> hixl_core::Result<()> {
/// let pool = hixl_fabric::FabricPool::new(1 << 30, Some(41 << 40))?;
/// let buf = pool.alloc(1 << 20)?;
/// assert!(buf.translated() || buf.addr() == 41 << 40);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct FabricPool {
    inner: Arc<PoolInner>,
}

#[derive(Debug)]
struct PoolInner {
    capacity: u64,
    window: Option<u64>,
    state: Mutex<PoolState>,
}

#[derive(Debug)]
struct PoolState {
    used: u64,
    /// Free window extents: offset → length, coalesced.
    free: BTreeMap<u64, u64>,
}

impl PoolInner {
    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // The state is plain numbers updated atomically under the lock: a poisoned lock still
        // holds consistent data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl PoolState {
    /// First-fit: takes `len` bytes of window offsets.
    fn take_extent(&mut self, len: u64) -> Option<u64> {
        let (&off, &ext) = self.free.iter().find(|(_, &ext)| ext >= len)?;
        self.free.remove(&off);
        if ext > len {
            self.free.insert(off + len, ext - len);
        }
        Some(off)
    }

    fn give_extent(&mut self, mut off: u64, mut len: u64) {
        if let Some((&prev, &plen)) = self.free.range(..off).next_back() {
            if prev + plen == off {
                self.free.remove(&prev);
                off = prev;
                len += plen;
            }
        }
        if let Some(&nlen) = self.free.get(&(off + len)) {
            self.free.remove(&(off + len));
            len += nlen;
        }
        self.free.insert(off, len);
    }
}

impl FabricPool {
    /// A pool of at most `capacity` bytes; with `window = Some(start)`, buffers go to the unified
    /// VA window `[start, start + capacity)`.
    ///
    /// # Errors
    /// [`Error::InvalidParam`] for a zero capacity, or a window start that is zero, not page
    /// aligned, or whose window overflows the address space.
    pub fn new(capacity: u64, window: Option<u64>) -> Result<FabricPool> {
        if capacity == 0 {
            return Err(Error::InvalidParam {
                what: "fabric pool capacity must be > 0 bytes".into(),
            });
        }
        if let Some(start) = window {
            if start == 0 || start % page_size() != 0 || start.checked_add(capacity).is_none() {
                return Err(Error::InvalidParam {
                    what: format!(
                        "fabric window start {start:#x} with capacity {capacity} bytes: the start \
                         must be a non-zero multiple of the page size ({}) and the window must fit \
                         the address space",
                        page_size()
                    ),
                });
            }
        }
        let mut free = BTreeMap::new();
        if window.is_some() {
            free.insert(0, capacity - capacity % page_size());
        }
        Ok(FabricPool {
            inner: Arc::new(PoolInner {
                capacity,
                window,
                state: Mutex::new(PoolState { used: 0, free }),
            }),
        })
    }

    /// Allocates a zero-filled buffer of `len` bytes (the memfd and mapping are page-rounded).
    ///
    /// # Errors
    /// [`Error::ZeroLength`] for `len == 0`; [`Error::ResourceExhausted`] when the page-rounded
    /// size does not fit the remaining capacity; [`Error::Io`] when the memfd cannot be created,
    /// sized, sealed or mapped.
    pub fn alloc(&self, len: u64) -> Result<FabricBuf> {
        if len == 0 {
            return Err(Error::ZeroLength { index: 0 });
        }
        let too_big = || Error::ResourceExhausted {
            what: format!(
                "fabric pool: {len} bytes requested, capacity is {} bytes",
                self.inner.capacity
            ),
        };
        let rounded = round_to_page(len).ok_or_else(too_big)?;
        let offset = {
            let mut st = self.inner.lock();
            if rounded > self.inner.capacity - st.used {
                return Err(Error::ResourceExhausted {
                    what: format!(
                        "fabric pool: {rounded} bytes ({len} requested, page-rounded) do not fit: \
                         {} of {} bytes in use",
                        st.used, self.inner.capacity
                    ),
                });
            }
            st.used += rounded;
            match self.inner.window {
                Some(_) => st.take_extent(rounded),
                None => None,
            }
        };
        // From here the lease gives the bytes (and window offsets) back on any failure.
        let mut lease = Lease {
            pool: Arc::clone(&self.inner),
            bytes: rounded,
            offset,
        };
        let fd = sealed_memfd(rounded).map_err(|e| Error::io("creating a fabric memfd", e))?;
        let want = match (self.inner.window, offset) {
            (Some(start), Some(off)) => Some(start + off),
            _ => None,
        };
        let (map, miss) = SharedMap::map(fd.as_fd(), rounded, want)
            .map_err(|e| Error::io(format!("mapping a {rounded}-byte fabric buffer"), e))?;
        let translated = self.inner.window.is_some() && (want.is_none() || miss.is_some());
        if translated {
            // The window offsets are not in use by this buffer: give them back now.
            lease.release_extent();
            let why = match (&miss, want) {
                (Some(m), _) => m.to_string(),
                (None, _) => "no contiguous free range left in the window".to_string(),
            };
            tracing::info!(
                wanted = want.map(|w| format!("{w:#x}")),
                got = format_args!("{:#x}", map.addr()),
                len = rounded,
                reason = %why,
                "fabric buffer placed outside the unified VA window; peers must translate addresses"
            );
        }
        Ok(FabricBuf {
            map,
            fd,
            len,
            translated,
            _lease: lease,
        })
    }

    /// The capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    /// Bytes (page-rounded) held by live buffers.
    pub fn used(&self) -> u64 {
        self.inner.lock().used
    }

    /// The start of the unified VA window, if any.
    pub fn window(&self) -> Option<u64> {
        self.inner.window
    }
}

/// A buffer's share of its pool, given back on drop (after the mapping is gone).
#[derive(Debug)]
struct Lease {
    pool: Arc<PoolInner>,
    bytes: u64,
    offset: Option<u64>,
}

impl Lease {
    fn release_extent(&mut self) {
        if let Some(off) = self.offset.take() {
            self.pool.lock().give_extent(off, self.bytes);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.release_extent();
        let mut st = self.pool.lock();
        st.used = st.used.saturating_sub(self.bytes);
    }
}

/// One fabric buffer: a sealed memfd and its shared mapping. Dropping it unmaps the buffer and
/// closes the memfd; peers that mapped it keep their own mapping of the same pages.
#[derive(Debug)]
pub struct FabricBuf {
    // Field order is drop order: unmap, close, then return the window offsets to the pool so a
    // new buffer never races this mapping for its address.
    map: SharedMap,
    fd: OwnedFd,
    len: u64,
    translated: bool,
    _lease: Lease,
}

impl FabricBuf {
    /// Start of the buffer in this process.
    ///
    /// The memory is shared with every peer that maps the memfd; reads and writes through this
    /// pointer race with theirs unless the caller orders them (that is the transfer protocol).
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr()
    }

    /// Start of the buffer as an integer address (what a `MemDesc` carries).
    pub fn addr(&self) -> u64 {
        self.map.addr()
    }

    /// The length that was requested.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Never true: zero-length buffers are refused. Present for API symmetry with `len`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Mapped length: `len` rounded up to whole pages (also the memfd's size).
    pub fn mapped_len(&self) -> u64 {
        self.map.len() as u64
    }

    /// The memfd, to export to peers (e.g. with [`crate::send_fds`]).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Whether the buffer lies outside the pool's unified VA window (the window address could
    /// not be had), so peers must translate its addresses. Always false without a window.
    pub fn translated(&self) -> bool {
        self.translated
    }
}

/// A memfd of `len` bytes sealed with [`POOL_SEALS`].
fn sealed_memfd(len: u64) -> io::Result<OwnedFd> {
    const NAME: &CStr = c"hixl-fabric";
    // SAFETY: NAME is a valid NUL-terminated string; the result is checked.
    let raw =
        unsafe { libc::memfd_create(NAME.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a fresh descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let size =
        libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: plain syscall on a descriptor we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: plain syscall on a descriptor we own.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, POOL_SEALS) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distinct windows per test: tests share one address space and run in parallel.
    fn window(tb: u64) -> u64 {
        tb << 40
    }

    #[test]
    fn alloc_free_and_capacity() {
        let p = page_size();
        let pool = FabricPool::new(4 * p, None).unwrap();
        let a = pool.alloc(1).unwrap();
        assert_eq!((a.len(), a.mapped_len()), (1, p));
        assert!(!a.translated());
        let b = pool.alloc(3 * p).unwrap();
        assert_eq!(pool.used(), 4 * p);
        let e = pool.alloc(1).unwrap_err();
        assert!(matches!(e, Error::ResourceExhausted { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains(&(4 * p).to_string()) && msg.contains(&p.to_string()),
            "{msg}"
        );
        drop(a);
        assert_eq!(pool.used(), 3 * p);
        let c = pool.alloc(p).unwrap();
        drop((b, c));
        assert_eq!(pool.used(), 0);
        assert!(matches!(pool.alloc(0), Err(Error::ZeroLength { .. })));
        assert!(matches!(
            pool.alloc(u64::MAX),
            Err(Error::ResourceExhausted { .. })
        ));
        assert!(FabricPool::new(0, None).is_err());
        assert!(FabricPool::new(p, Some(123)).is_err());
        assert!(FabricPool::new(u64::MAX, Some(window(40))).is_err());
    }

    #[test]
    fn buffers_are_zeroed_shared_and_writable() {
        let pool = FabricPool::new(1 << 20, None).unwrap();
        let b = pool.alloc(10_000).unwrap();
        // SAFETY: the buffer is live and nobody else maps it.
        let s = unsafe { std::slice::from_raw_parts_mut(b.as_ptr(), b.len() as usize) };
        assert!(s.iter().all(|&x| x == 0));
        s.fill(0xab);
        // The memfd sees the same bytes as the mapping.
        let mut first = [0u8; 4];
        // SAFETY: reads 4 bytes into a live array from a descriptor we borrow.
        let n = unsafe { libc::pread(b.fd().as_raw_fd(), first.as_mut_ptr().cast(), 4, 0) };
        assert_eq!(n, 4);
        assert_eq!(first, [0xab; 4]);
    }

    #[test]
    fn seals_are_set_and_shrinking_is_refused() {
        let pool = FabricPool::new(1 << 20, None).unwrap();
        let b = pool.alloc(3 * page_size()).unwrap();
        let fd = b.fd().as_raw_fd();
        // SAFETY: plain syscall on a live descriptor.
        let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
        assert_eq!(seals & POOL_SEALS, POOL_SEALS, "seals {seals:#x}");
        // SAFETY: plain syscall on a live descriptor; it must fail.
        assert_ne!(unsafe { libc::ftruncate(fd, 1) }, 0);
        assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::EPERM));
        // SAFETY: as above; growing is sealed too.
        assert_ne!(unsafe { libc::ftruncate(fd, 1 << 30) }, 0);
        // SAFETY: as above; the seal set itself is sealed.
        let rc = unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_WRITE) };
        assert_ne!(rc, 0);
    }

    #[test]
    fn window_placement_reuses_offsets() {
        let p = page_size();
        let start = window(42);
        let pool = FabricPool::new(64 * p, Some(start)).unwrap();
        let a = pool.alloc(p + 1).unwrap();
        let b = pool.alloc(p).unwrap();
        assert!(!a.translated() && !b.translated());
        assert_eq!(a.addr(), start);
        assert_eq!(b.addr(), start + 2 * p);
        drop(a);
        let c = pool.alloc(p).unwrap();
        assert_eq!(c.addr(), start, "first fit reuses the freed offset");
        let d = pool.alloc(p).unwrap();
        assert_eq!(d.addr(), start + p);
        drop((b, c, d));
        // Everything coalesced back: one allocation of the whole window fits at its start.
        let all = pool.alloc(64 * p).unwrap();
        assert_eq!(all.addr(), start);
        assert!(!all.translated());
    }

    #[test]
    fn taken_window_address_falls_back_to_translation() {
        let p = page_size();
        let start = window(43);
        // Occupy the window start with an unrelated mapping.
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; the result is checked.
        let squat = unsafe {
            libc::mmap(
                start as usize as *mut libc::c_void,
                p as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        assert_eq!(
            squat as usize as u64, start,
            "could not set up the squatter"
        );
        let pool = FabricPool::new(16 * p, Some(start)).unwrap();
        let a = pool.alloc(p).unwrap();
        assert!(a.translated());
        assert_ne!(a.addr(), start);
        // The refused offsets went back to the pool, so first fit tries offset 0 again.
        let b = pool.alloc(2 * p).unwrap();
        assert!(b.translated(), "offset 0 is still taken");
        drop((a, b));
        assert_eq!(pool.used(), 0);
        // SAFETY: unmaps exactly the squatter mapping created above.
        assert_eq!(unsafe { libc::munmap(squat, p as usize) }, 0);
        let c = pool.alloc(p).unwrap();
        assert_eq!(c.addr(), start);
        assert!(!c.translated());
    }

    #[test]
    fn fragmented_window_translates_instead_of_failing() {
        let p = page_size();
        let pool = FabricPool::new(3 * p, Some(window(44))).unwrap();
        let a = pool.alloc(p).unwrap();
        let b = pool.alloc(p).unwrap();
        let c = pool.alloc(p).unwrap();
        drop((a, c));
        // Two pages free but not contiguous.
        let d = pool.alloc(2 * p).unwrap();
        assert!(d.translated());
        assert_eq!(pool.used(), 3 * p);
        drop((b, d));
        assert_eq!(pool.used(), 0);
    }

    #[test]
    fn pool_and_buffers_are_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<FabricPool>();
        check::<FabricBuf>();
    }
}
