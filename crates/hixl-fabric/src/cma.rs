//! Cross-memory attach: copying to and from another process's memory with
//! `process_vm_readv`/`process_vm_writev`, for host memory that is not in the fabric pool.
//!
//! The kernel allows it when the caller may ptrace the target (`PTRACE_MODE_ATTACH_REALCREDS`):
//! same uid and a dumpable target, or `CAP_SYS_PTRACE`; Yama (`kernel.yama.ptrace_scope` ≥ 1)
//! further limits it to descendants unless the target names the caller with
//! [`permit_cma_from`].

use std::io;

/// Bytes moved per syscall. The kernel caps one call at `MAX_RW_COUNT` (just under 2 GiB);
/// staying well below it keeps every call a full one.
const CHUNK: u64 = 1 << 30;

#[derive(Clone, Copy)]
enum Dir {
    Read,
    Write,
}

/// Copies `len` bytes from `remote` in process `pid` to `local` in this process.
///
/// # Safety
/// `local .. local + len` must be valid for writes in this process for the whole call, and no
/// Rust reference may be live over it (the kernel writes it like a device would).
///
/// # Errors
/// The OS error of `process_vm_readv`: `EPERM` (not allowed, see the module docs), `ESRCH`
/// (no such process), `EFAULT` (a range is not mapped; also when the kernel stops making
/// progress part-way), `InvalidInput` when a range overflows the address space.
pub unsafe fn cma_read(pid: i32, local: u64, remote: u64, len: u64) -> io::Result<()> {
    // SAFETY: forwarded contract: local is writable for len bytes.
    unsafe { cma(Dir::Read, pid, local, remote, len) }
}

/// Copies `len` bytes from `local` in this process to `remote` in process `pid`.
///
/// This changes another process's memory: the caller must have checked the range against what
/// that process exported.
///
/// # Safety
/// `local .. local + len` must be valid for reads in this process for the whole call and not be
/// written concurrently through a Rust reference.
///
/// # Errors
/// As [`cma_read`], from `process_vm_writev`.
pub unsafe fn cma_write(pid: i32, local: u64, remote: u64, len: u64) -> io::Result<()> {
    // SAFETY: forwarded contract: local is readable for len bytes.
    unsafe { cma(Dir::Write, pid, local, remote, len) }
}

/// # Safety
/// As [`cma_read`] (for `Dir::Read`) or [`cma_write`] (for `Dir::Write`).
unsafe fn cma(dir: Dir, pid: i32, local: u64, remote: u64, len: u64) -> io::Result<()> {
    if local.checked_add(len).is_none() || remote.checked_add(len).is_none() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "cross-memory attach range overflows the address space",
        ));
    }
    let mut done = 0u64;
    while done < len {
        let chunk = (len - done).min(CHUNK) as usize;
        let l = libc::iovec {
            iov_base: (local + done) as usize as *mut libc::c_void,
            iov_len: chunk,
        };
        let r = libc::iovec {
            iov_base: (remote + done) as usize as *mut libc::c_void,
            iov_len: chunk,
        };
        // SAFETY: one iovec per side. The local one lies inside the range the caller vouched
        // for (valid for writes when reading, for reads when writing); the remote one is checked
        // by the kernel against the target's mappings and never touches our memory.
        let n = unsafe {
            match dir {
                Dir::Read => libc::process_vm_readv(pid, &l, 1, &r, 1, 0),
                Dir::Write => libc::process_vm_writev(pid, &l, 1, &r, 1, 0),
            }
        };
        match n {
            n if n > 0 => done += n as u64,
            0 => return Err(io::Error::from_raw_os_error(libc::EFAULT)),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Pieces per `process_vm_readv`/`writev` call (the kernel's `UIO_MAXIOV`).
const MAX_IOV: u64 = 1024;

/// Copies `count` pieces of `len` bytes between `local.0 + i × local.1` here and
/// `remote.0 + i × remote.1` in process `pid` (`write`: to the peer), up to 1024 pieces per
/// syscall.
///
/// # Safety
/// Every local piece must be valid for writes (reading from the peer) or reads (writing to it)
/// for the whole call, with no Rust reference over it; a write must have been checked against
/// what the peer exported.
///
/// # Errors
/// As [`cma_read`].
pub unsafe fn cma_strided(
    write: bool,
    pid: i32,
    local: (u64, u64),
    remote: (u64, u64),
    len: u64,
    count: u64,
) -> io::Result<()> {
    let end =
        |(base, stride): (u64, u64)| hixl_core::strided_span(len, stride, count)?.checked_add(base);

    if count == 0 || len == 0 {
        return Ok(());
    }
    if end(local).is_none() || end(remote).is_none() || len > CHUNK {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "strided cross-memory attach range overflows the address space or a piece exceeds 1 GiB",
        ));
    }
    let dir = if write { Dir::Write } else { Dir::Read };
    let mut first = 0u64;
    while first < count {
        let n = (count - first).min(MAX_IOV);
        let iov = |(base, stride): (u64, u64)| -> Vec<libc::iovec> {
            (first..first + n)
                .map(|i| libc::iovec {
                    iov_base: (base + i * stride) as usize as *mut libc::c_void,
                    iov_len: len as usize,
                })
                .collect()
        };
        let (l, r) = (iov(local), iov(remote));
        // SAFETY: n ≤ 1024 iovecs a side; each local one lies inside a piece the caller
        // vouched for; the remote ones are checked by the kernel against the peer's mappings.
        let got = unsafe {
            match dir {
                Dir::Read => libc::process_vm_readv(pid, l.as_ptr(), n as _, r.as_ptr(), n as _, 0),
                Dir::Write => {
                    libc::process_vm_writev(pid, l.as_ptr(), n as _, r.as_ptr(), n as _, 0)
                }
            }
        };
        let want = n * len;
        if got < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let got = got as u64;
        if got < want {
            // A short call: finish its pieces one by one (each resumes where it stopped).
            let (whole, part) = (got / len, got % len);
            for i in first + whole..first + n {
                let skip = if i == first + whole { part } else { 0 };
                let (lp, rp) = (local.0 + i * local.1 + skip, remote.0 + i * remote.1 + skip);
                // SAFETY: the rest of a piece the caller vouched for.
                unsafe { cma(dir, pid, lp, rp, len - skip) }?;
            }
        }
        first += n;
    }
    Ok(())
}

/// Checks that this process may read process `pid`'s memory at `remote_addr` by reading one
/// byte of it. Connect calls this before choosing cross-memory attach for a peer's host regions.
///
/// # Errors
/// A message that names the errno and what would allow access, e.g. for `EPERM`: same uid or
/// `CAP_SYS_PTRACE`, and the Yama `ptrace_scope` in force.
pub fn cma_probe(pid: i32, remote_addr: u64) -> Result<(), String> {
    let mut byte = 0u8;
    let local = &mut byte as *mut u8 as usize as u64;
    // SAFETY: `byte` is a live local, writable for one byte, not otherwise borrowed.
    let r = unsafe { cma_read(pid, local, remote_addr, 1) };
    let e = match r {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    Err(match e.raw_os_error() {
        Some(libc::EPERM) => format!(
            "cross-memory attach to pid {pid} denied (EPERM): process_vm_readv needs the same \
             uid as the target (which must be dumpable) or CAP_SYS_PTRACE{}; container seccomp \
             profiles can also forbid it",
            yama_hint()
        ),
        Some(libc::ESRCH) => format!(
            "cross-memory attach: no process {pid} (ESRCH): it exited or is in another PID \
             namespace"
        ),
        Some(libc::EFAULT) => format!(
            "cross-memory attach: address {remote_addr:#x} is not mapped readable in pid {pid} \
             (EFAULT)"
        ),
        Some(libc::ENOSYS) => "cross-memory attach unavailable (ENOSYS): the kernel lacks \
             CONFIG_CROSS_MEMORY_ATTACH or seccomp blocks process_vm_readv"
            .to_string(),
        _ => format!("cross-memory attach to pid {pid} at {remote_addr:#x} failed: {e}"),
    })
}

fn yama_hint() -> String {
    match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope") {
        Ok(s) => match s.trim() {
            "0" => "; kernel.yama.ptrace_scope is 0 (classic rules)".to_string(),
            "1" => "; kernel.yama.ptrace_scope is 1, so only descendants, or processes the \
                    target permitted with PR_SET_PTRACER, may attach"
                .to_string(),
            v => format!(
                "; kernel.yama.ptrace_scope is {v}, which needs CAP_SYS_PTRACE or forbids it"
            ),
        },
        Err(_) => String::new(),
    }
}

/// Lets process `pid` (any process of our uid with `None`) attach to this one under Yama
/// `ptrace_scope = 1`, which otherwise admits only ancestors. A peer that maps our fabric
/// memory is trusted with our memory anyway; this extends that to CMA into host regions.
/// Only one pid can be named at a time, so with several peers pass `None`.
///
/// # Errors
/// The OS error of `prctl(PR_SET_PTRACER)`; a kernel without Yama (`EINVAL`) is not an error,
/// there is nothing to permit.
pub fn permit_cma_from(pid: Option<i32>) -> io::Result<()> {
    let who: libc::c_ulong = match pid {
        Some(p) => p as libc::c_ulong,
        None => libc::PR_SET_PTRACER_ANY,
    };
    // SAFETY: prctl(PR_SET_PTRACER) takes plain integers and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_PTRACER, who, 0, 0, 0) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EINVAL) {
        return Ok(());
    }
    Err(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> i32 {
        std::process::id() as i32
    }

    #[test]
    fn read_and_write_own_memory() {
        let src: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        // SAFETY: dst is live and writable for its length; src is only read.
        unsafe {
            cma_read(
                me(),
                dst.as_mut_ptr() as u64,
                src.as_ptr() as u64,
                src.len() as u64,
            )
            .unwrap();
        }
        assert_eq!(dst, src);
        let mut back = vec![0u8; 1000];
        // SAFETY: src is readable; `back` is the remote side and live.
        unsafe {
            cma_write(me(), src.as_ptr() as u64, back.as_mut_ptr() as u64, 1000).unwrap();
        }
        assert_eq!(back[..], src[..1000]);
        // Zero length is a no-op.
        // SAFETY: nothing is touched.
        unsafe { cma_read(me(), 0, 0, 0).unwrap() };
    }

    #[test]
    fn probe_messages_name_the_errno() {
        let x = 7u8;
        cma_probe(me(), &x as *const u8 as u64).unwrap();
        let e = cma_probe(me(), 8).unwrap_err();
        assert!(e.contains("EFAULT") && e.contains("0x8"), "{e}");
        // pid_max is at most 2^22; this pid cannot exist.
        let e = cma_probe(i32::MAX, 8).unwrap_err();
        assert!(e.contains("ESRCH"), "{e}");
        let mut b = [0u8; 4];
        // SAFETY: b is live and writable; the range overflows and is refused before any copy.
        let e = unsafe { cma_read(me(), b.as_mut_ptr() as u64, u64::MAX - 1, 4) }.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn a_transfer_that_runs_into_a_hole_copies_up_to_it_then_fails() {
        let p = crate::page_size() as usize;
        // SAFETY: a fresh private anonymous mapping; the result is checked.
        let m = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * p,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(m, libc::MAP_FAILED);
        // SAFETY: the first page is ours and writable; the second becomes unreadable (kept
        // mapped, so no other test can land there).
        unsafe {
            std::ptr::write_bytes(m.cast::<u8>(), 0x42, p);
            assert_eq!(
                libc::mprotect(m.cast::<u8>().add(p).cast(), p, libc::PROT_NONE),
                0
            );
        }
        let mut dst = vec![0u8; 2 * p];
        // SAFETY: dst is live and writable for 2 pages.
        let e = unsafe { cma_read(me(), dst.as_mut_ptr() as u64, m as u64, 2 * p as u64) };
        assert_eq!(e.unwrap_err().raw_os_error(), Some(libc::EFAULT));
        assert!(
            dst[..p].iter().all(|&b| b == 0x42),
            "the readable page was copied"
        );
        assert!(dst[p..].iter().all(|&b| b == 0));
        // SAFETY: unmaps exactly the mapping created above.
        assert_eq!(unsafe { libc::munmap(m, 2 * p) }, 0);
    }

    #[test]
    fn permitting_attach_is_harmless() {
        permit_cma_from(None).unwrap();
    }
}
