//! Completion queue: where a device (TCP connection tasks now; copy engines and RDMA CQs later)
//! posts finished parts, with an eventfd that the reactor parks on.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use hixl_core::{CompletionSource, Error, PartResult, Token};

/// Locks recovering a poisoned mutex: the crate's one poisoning policy, [`crate::sync`].
pub(crate) use crate::sync::lock;

/// One finished part of an op.
#[derive(Debug)]
pub(crate) struct Completion {
    pub(crate) token: Token,
    pub(crate) result: Result<(), Error>,
}

/// A multi-producer completion queue drained by one reactor.
///
/// Producers push and ring the eventfd only when the reactor has armed it (it is about to
/// park), so a busy queue costs no syscalls.
#[derive(Debug)]
pub(crate) struct CompletionQueue {
    q: Mutex<Vec<Completion>>,
    armed: AtomicBool,
    efd: OwnedFd,
}

impl CompletionQueue {
    pub(crate) fn new() -> std::io::Result<CompletionQueue> {
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(CompletionQueue {
            q: Mutex::new(Vec::with_capacity(1024)),
            armed: AtomicBool::new(false),
            // SAFETY: fd is a fresh descriptor that nothing else owns.
            efd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Posts one completion and rings.
    #[cfg(test)]
    pub(crate) fn push(&self, c: Completion) {
        lock(&self.q).push(c);
        self.ring();
    }

    /// Posts completions without ringing; the caller drains them itself or calls
    /// [`CompletionQueue::ring`].
    pub(crate) fn push_quiet(&self, cs: impl IntoIterator<Item = Completion>) {
        lock(&self.q).extend(cs);
    }

    /// Rings the eventfd if the reactor armed it.
    pub(crate) fn ring(&self) {
        if self.armed.swap(false, Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
            let _ = unsafe {
                libc::write(
                    self.efd.as_raw_fd(),
                    (&one as *const u64).cast(),
                    std::mem::size_of::<u64>(),
                )
            };
        }
    }

    /// Arm: from now on the next push rings the eventfd. Also consumes any earlier ring, so
    /// the fd is readable again only for pushes after this point.
    fn arm_inner(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64 from our own non-blocking eventfd.
        let _ = unsafe {
            libc::read(
                self.efd.as_raw_fd(),
                (&mut v as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Whether the eventfd currently signals (for tests).
    #[cfg(test)]
    pub(crate) fn is_rung(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.efd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n == 1
    }
}

impl CompletionSource for CompletionQueue {
    fn drain(&self, out: &mut Vec<PartResult>) -> usize {
        let mut q = lock(&self.q);
        let n = q.len();
        out.extend(q.drain(..).map(|c| (c.token, c.result)));
        n
    }

    fn arm(&self) {
        self.arm_inner();
    }

    fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }

    fn fd(&self) -> RawFd {
        self.efd.as_raw_fd()
    }
}
