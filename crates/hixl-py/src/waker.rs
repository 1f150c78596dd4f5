//! A per-event-loop doorbell: Rust threads report finished ops here without the GIL; the loop's
//! thread, woken by the eventfd it watches (`loop.add_reader`), drains the ids and resolves the
//! asyncio futures.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;

pub(crate) use hixl_async::sync::lock;

/// The shared half: the eventfd and the ids of ops finished since the last drain.
#[derive(Debug)]
pub(crate) struct Bell {
    fd: OwnedFd,
    done: Mutex<Vec<u64>>,
}

impl Bell {
    /// Reports op `id` finished: queued, and the eventfd written when the queue was empty (one
    /// wake-up per drain, however many ops finish meanwhile).
    pub(crate) fn ring(&self, id: u64) {
        let first = {
            let mut q = lock(&self.done);
            q.push(id);
            q.len() == 1
        };
        if first {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our eventfd. A full counter (EAGAIN)
            // means a wake-up is pending anyway.
            unsafe {
                libc::write(
                    self.fd.as_raw_fd(),
                    (&one as *const u64).cast(),
                    std::mem::size_of::<u64>(),
                )
            };
        }
    }
}

/// `hixl._hixl.Waker`: one per asyncio event loop (made by `hixl`'s Python side).
#[pyclass(module = "hixl._hixl", frozen)]
pub(crate) struct Waker {
    pub(crate) bell: Arc<Bell>,
}

#[pymethods]
impl Waker {
    #[new]
    fn new() -> PyResult<Waker> {
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(PyOSError::new_err(format!(
                "eventfd: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Waker {
            bell: Arc::new(Bell {
                fd,
                done: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The eventfd to watch for readability.
    fn fileno(&self) -> i32 {
        self.bell.fd.as_raw_fd()
    }

    /// Clears the eventfd and returns the ids of the ops finished since the last drain.
    fn drain(&self) -> Vec<u64> {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our nonblocking eventfd (EAGAIN when
        // nothing is pending).
        unsafe {
            libc::read(
                self.bell.fd.as_raw_fd(),
                (&mut v as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        std::mem::take(&mut *lock(&self.bell.done))
    }
}

pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Waker>()
}
