//! The completion queue of hixl's devices: where the TCP data connections and the fabric's
//! copy engines post finished parts for the engine's reactor, with an eventfd it parks on.
//! (The verbs transport's queue is the NIC's own, `hixl_verbs::Cq`.)

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use hixl_core::{CompletionSource, Error, PartResult, Token};

/// A multi-producer completion queue drained by one reactor.
///
/// Producers ring the eventfd only when the reactor has armed it (it is about to park), so a
/// busy queue costs no syscalls. The reactor's turn is: [`CompletionSource::drain`],
/// [`CompletionSource::arm`], `drain` again, then wait for [`CompletionSource::fd`] to become
/// readable; a completion posted after `arm` always makes the fd readable.
#[derive(Debug)]
pub struct CompletionQueue {
    q: Mutex<Vec<PartResult>>,
    armed: AtomicBool,
    efd: OwnedFd,
}

impl CompletionQueue {
    /// An empty queue with a fresh non-blocking eventfd.
    ///
    /// # Errors
    /// The OS error of `eventfd` (descriptor limits).
    pub fn new() -> io::Result<CompletionQueue> {
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(CompletionQueue {
            q: Mutex::new(Vec::with_capacity(1024)),
            armed: AtomicBool::new(false),
            // SAFETY: fd is a fresh descriptor that nothing else owns.
            efd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn lock(&self) -> MutexGuard<'_, Vec<PartResult>> {
        // Pushes and drains are single Vec operations: a poisoned queue is still consistent,
        // and dropping completions would strand the ops waiting for them.
        self.q.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Posts one completion and rings the eventfd if armed.
    pub fn push(&self, token: Token, result: Result<(), Error>) {
        self.lock().push((token, result));
        self.ring();
    }

    /// Posts several completions and rings once.
    pub fn push_all(&self, cs: impl IntoIterator<Item = PartResult>) {
        self.push_quiet(cs);
        self.ring();
    }

    /// Posts completions without ringing: the caller drains them itself, or calls
    /// [`CompletionQueue::ring`] when it does not.
    pub fn push_quiet(&self, cs: impl IntoIterator<Item = PartResult>) {
        self.lock().extend(cs);
    }

    /// Completions waiting to be drained.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing waits to be drained.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the eventfd currently signals (a zero-timeout `poll`).
    pub fn is_rung(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.efd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n == 1
    }

    /// Rings the eventfd if the reactor armed it.
    pub fn ring(&self) {
        if self.armed.swap(false, Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our own eventfd. It cannot fail short
            // of counter overflow (2^64 - 2 rings without a read), which a ring per arm excludes.
            let _ = unsafe {
                libc::write(
                    self.efd.as_raw_fd(),
                    (&one as *const u64).cast(),
                    std::mem::size_of::<u64>(),
                )
            };
        }
    }
}

impl CompletionSource for CompletionQueue {
    fn drain(&self, out: &mut Vec<PartResult>) -> usize {
        let mut q = self.lock();
        let n = q.len();
        out.append(&mut q);
        n
    }

    /// Consumes any earlier signal, then arms: the fd is readable again only for pushes after
    /// this point.
    fn arm(&self) {
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

    fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }

    fn fd(&self) -> RawFd {
        self.efd.as_raw_fd()
    }
}

impl AsRawFd for CompletionQueue {
    fn as_raw_fd(&self) -> RawFd {
        self.efd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_only_when_armed_and_once_per_arm() {
        let q = CompletionQueue::new().unwrap();
        q.push(Token(1), Ok(()));
        assert!(!q.is_rung(), "not armed: no syscall, no signal");
        let mut out = Vec::new();
        assert_eq!(q.drain(&mut out), 1);
        q.arm();
        assert!(!q.is_rung());
        q.push(Token(2), Ok(()));
        assert!(q.is_rung());
        q.push(Token(3), Ok(()));
        // Arming again consumes the old signal.
        q.arm();
        assert!(!q.is_rung());
        q.disarm();
        q.push_all([(Token(4), Ok(())), (Token(5), Ok(()))]);
        assert!(!q.is_rung(), "disarmed");
        assert_eq!(q.len(), 4);
        assert_eq!(q.drain(&mut out), 4);
        assert!(q.is_empty());
        let toks: Vec<u64> = out.iter().map(|(t, _)| t.0).collect();
        assert_eq!(toks, [1, 2, 3, 4, 5]);
    }
}
