//! Copy engines ("SDMA streams"): OS threads that take copy ops from a bounded submission ring
//! and post one completion per op to a [`CompletionQueue`].

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hixl_core::{CompletionSource, Error, PartResult, Token};

use crate::cma::{cma_read, cma_write};
use crate::copy_op::strided_end;
pub use crate::copy_op::{CopyKind, CopyOp};
use hixl_cq::CompletionQueue;

/// Most copy streams an engine runs (HIXL's `fabric_memory.task_stream_num` range is 1–8).
pub const MAX_STREAMS: usize = 8;
/// Parts the submission ring holds by default.
pub const DEFAULT_RING_CAPACITY: usize = 8192;

/// `streams` threads draining one bounded submission ring; every op yields exactly one
/// completion `(token, result)` in [`CopyEngine::completions`], whether it ran, failed, was
/// cancelled with [`CopyEngine::cancel_queued`] or was still queued when the engine dropped.
///
/// Threads take ops one at a time from the shared ring, so the parts of a large op (split by
/// the caller, e.g. with [`CopyKind::split`]) spread across the streams. An idle stream spins
/// for up to `busy_poll` before sleeping on a condition variable; with a zero `busy_poll` an
/// idle engine uses no CPU.
#[derive(Debug)]
pub struct CopyEngine {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    ring: Mutex<Ring>,
    wake: Condvar,
    /// Mirror of `ring.ops.len()` that spinning streams read without the lock.
    queued: AtomicUsize,
    stop: AtomicBool,
    capacity: usize,
    busy_poll: Duration,
    cq: Arc<CompletionQueue>,
    /// Stream threads, so a stream takes at most its share of the ring at once.
    streams: usize,
}

/// Most ops a stream takes from the ring under one lock (and posts under one lock).
const TAKE_MAX: usize = 16;

#[derive(Debug)]
struct Ring {
    ops: VecDeque<CopyOp>,
    sleepers: usize,
    stop: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Ring> {
        // The ring is only changed by whole VecDeque operations; a poisoned lock still guards
        // consistent data, and giving up would strand queued ops without completions.
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl CopyEngine {
    /// Starts `streams` copy threads (1..=8) with a ring of [`DEFAULT_RING_CAPACITY`] parts.
    ///
    /// # Errors
    /// `InvalidInput` for a stream count outside 1..=8; the OS error when an eventfd or thread
    /// cannot be created.
    pub fn new(streams: usize, busy_poll: Duration) -> io::Result<CopyEngine> {
        Self::with_ring_capacity(streams, busy_poll, DEFAULT_RING_CAPACITY)
    }

    /// As [`CopyEngine::new`] with a ring of `capacity` parts.
    ///
    /// # Errors
    /// As [`CopyEngine::new`]; also `InvalidInput` for a zero capacity.
    pub fn with_ring_capacity(
        streams: usize,
        busy_poll: Duration,
        capacity: usize,
    ) -> io::Result<CopyEngine> {
        if !(1..=MAX_STREAMS).contains(&streams) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "copy engine: task_stream_num must be within 1..=8",
            ));
        }
        if capacity == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "copy engine: submission ring capacity must be > 0",
            ));
        }
        Self::start(streams, busy_poll, capacity)
    }

    /// Starts without validating `streams`; tests use 0 streams to hold ops in the ring.
    fn start(streams: usize, busy_poll: Duration, capacity: usize) -> io::Result<CopyEngine> {
        let shared = Arc::new(Shared {
            ring: Mutex::new(Ring {
                ops: VecDeque::with_capacity(capacity.min(DEFAULT_RING_CAPACITY)),
                sleepers: 0,
                stop: false,
            }),
            wake: Condvar::new(),
            queued: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            capacity,
            busy_poll,
            cq: Arc::new(CompletionQueue::new()?),
            streams: streams.max(1),
        });
        let mut engine = CopyEngine {
            shared,
            threads: Vec::with_capacity(streams),
        };
        for i in 0..streams {
            let shared = Arc::clone(&engine.shared);
            // On error `engine` drops here, stopping and joining the streams already started.
            let t = std::thread::Builder::new()
                .name(format!("hixl-sdma-{i}"))
                .spawn(move || stream_loop(&shared))?;
            engine.threads.push(t);
        }
        Ok(engine)
    }

    /// Queues `ops` (all or none) and wakes sleeping streams.
    ///
    /// # Safety
    /// For every op, until its completion has been taken from [`CopyEngine::completions`] (or
    /// from the engine as a [`CompletionSource`]):
    /// - `Memcpy`: `src .. src + len` is valid for reads and `dst .. dst + len` valid for writes
    ///   in this process, and no Rust reference covers `dst .. dst + len` (a stream writes it
    ///   concurrently). Ranges may overlap.
    /// - `CmaRead`: `local .. local + len` is valid for writes here, as for `dst` above.
    /// - `CmaWrite`: `local .. local + len` is valid for reads here.
    ///
    /// The remote side of a CMA op is checked by the kernel against the peer's mappings; the
    /// caller must still have checked it against what the peer exported. An op cancelled or
    /// still queued when the engine drops completes with an error without being touched; ops
    /// already running finish before the engine's drop returns.
    ///
    /// # Errors
    /// [`Error::ResourceExhausted`] when the ring cannot take all of `ops`; the ops come back
    /// untouched so the caller can retry after draining completions.
    pub unsafe fn submit(&self, ops: Vec<CopyOp>) -> Result<(), (Error, Vec<CopyOp>)> {
        if ops.is_empty() {
            return Ok(());
        }
        let n = ops.len();
        let sleepers = {
            let mut ring = self.shared.lock();
            let queued = ring.ops.len();
            if queued + n > self.shared.capacity {
                let e = Error::ResourceExhausted {
                    what: format!(
                        "copy-engine submission ring: {n} parts submitted, {queued} of {} queued",
                        self.shared.capacity
                    ),
                };
                return Err((e, ops));
            }
            ring.ops.extend(ops);
            self.shared.queued.store(ring.ops.len(), Ordering::Release);
            ring.sleepers
        };
        // Sleepers are counted under the lock and re-check the ring under it, so waking after
        // unlocking loses nothing.
        for _ in 0..n.min(sleepers) {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Runs `ops` on the calling thread, now, and returns their completions instead of posting
    /// them: for small ops, where handing them to a stream would cost more than the copy.
    ///
    /// # Safety
    /// As for [`CopyEngine::submit`], for the duration of the call.
    pub unsafe fn run_inline(&self, ops: Vec<CopyOp>) -> Vec<PartResult> {
        ops.into_iter()
            .map(|op| {
                // SAFETY: the caller upholds submit's contract while this call runs.
                let r = unsafe { execute(op.kind) };
                drop(op.keep);
                (op.token, r)
            })
            .collect()
    }

    /// Removes the queued (not yet started) ops whose token matches and completes each with
    /// `error`; returns how many. Used when a peer dies or a transfer is abandoned: ops already
    /// running finish normally.
    pub fn cancel_queued(&self, mut matches: impl FnMut(Token) -> bool, error: &Error) -> usize {
        let removed: Vec<CopyOp> = {
            let mut ring = self.shared.lock();
            let mut out = Vec::new();
            for op in std::mem::take(&mut ring.ops) {
                if matches(op.token) {
                    out.push(op);
                } else {
                    ring.ops.push_back(op);
                }
            }
            self.shared.queued.store(ring.ops.len(), Ordering::Release);
            out
        };
        let n = removed.len();
        if n > 0 {
            let tokens: Vec<Token> = removed.iter().map(|op| op.token).collect();
            // The ops' `keep`s drop here, outside both locks: their drops may call back into
            // the engine.
            drop(removed);
            self.shared
                .cq
                .push_all(tokens.into_iter().map(|t| (t, Err(error.clone()))));
        }
        n
    }

    /// The completion queue, for a reactor that should outlive the engine (it keeps receiving
    /// the error completions of ops the engine's drop cancels).
    pub fn completions(&self) -> Arc<CompletionQueue> {
        Arc::clone(&self.shared.cq)
    }

    /// Ops waiting in the ring (not started).
    pub fn queued(&self) -> usize {
        self.shared.queued.load(Ordering::Acquire)
    }

    /// The ring's capacity in parts.
    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }

    /// How many copy streams run.
    pub fn streams(&self) -> usize {
        self.threads.len()
    }
}

impl CompletionSource for CopyEngine {
    fn drain(&self, out: &mut Vec<PartResult>) -> usize {
        self.shared.cq.drain(out)
    }
    fn arm(&self) {
        self.shared.cq.arm();
    }
    fn disarm(&self) {
        self.shared.cq.disarm();
    }
    fn fd(&self) -> RawFd {
        self.shared.cq.fd()
    }
}

impl Drop for CopyEngine {
    /// Stops the streams (each finishes the op it runs), joins them, then completes every op
    /// still queued with an `ECANCELED` error.
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.notify_all();
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                tracing::error!("a copy-engine stream panicked");
            }
        }
        let left: Vec<CopyOp> = self.shared.lock().ops.drain(..).collect();
        self.shared.queued.store(0, Ordering::Release);
        if !left.is_empty() {
            let tokens: Vec<Token> = left.iter().map(|op| op.token).collect();
            // Their `keep`s drop outside the completion queue's lock.
            drop(left);
            self.shared.cq.push_all(tokens.into_iter().map(|t| {
                let e = Error::io(
                    format!("copy engine shut down before op {:#x} started", t.0),
                    io::Error::from_raw_os_error(libc::ECANCELED),
                );
                (t, Err(e))
            }));
        }
    }
}

/// One stream: take an op, run it, post its completion; spin then sleep when the ring is empty.
fn stream_loop(sh: &Shared) {
    let mut batch: Vec<CopyOp> = Vec::with_capacity(TAKE_MAX);
    let mut done = Vec::with_capacity(TAKE_MAX);
    loop {
        {
            let mut ring = sh.lock();
            if ring.stop {
                return;
            }
            // A fair share of what is queued, so parts still spread across the streams, and
            // one lock (and one completion post) per batch instead of per op.
            let take = (ring.ops.len() / sh.streams)
                .clamp(1, TAKE_MAX)
                .min(ring.ops.len());
            batch.extend(ring.ops.drain(..take));
            if !batch.is_empty() {
                sh.queued.store(ring.ops.len(), Ordering::Release);
            }
        }
        if !batch.is_empty() {
            for op in batch.drain(..) {
                // SAFETY: submit's contract keeps every range of a queued op valid until its
                // completion is drained, which cannot happen before the post below.
                let result = unsafe { execute(op.kind) };
                drop(op.keep);
                done.push((op.token, result));
            }
            sh.cq.push_all(done.drain(..));
            continue;
        }
        if spin_for_work(sh) {
            continue;
        }
        let mut ring = sh.lock();
        while ring.ops.is_empty() && !ring.stop {
            ring.sleepers += 1;
            ring = sh.wake.wait(ring).unwrap_or_else(|p| p.into_inner());
            ring.sleepers -= 1;
        }
    }
}

/// Spins up to the busy-poll budget for work (or stop) to appear; true if it did.
fn spin_for_work(sh: &Shared) -> bool {
    if sh.busy_poll.is_zero() {
        return false;
    }
    let start = Instant::now();
    let mut i: u32 = 0;
    loop {
        if sh.queued.load(Ordering::Acquire) > 0 || sh.stop.load(Ordering::Acquire) {
            return true;
        }
        i = i.wrapping_add(1);
        if i % 256 == 0 {
            if start.elapsed() >= sh.busy_poll {
                return false;
            }
            // Let a producer sharing our core run.
            std::thread::yield_now();
        }
        std::hint::spin_loop();
    }
}

/// Runs one op.
///
/// # Safety
/// The op's ranges satisfy [`CopyEngine::submit`]'s contract for the duration of the call.
unsafe fn execute(kind: CopyKind) -> Result<(), Error> {
    match kind {
        k @ (CopyKind::StridedMemcpy { .. } | CopyKind::StridedCma { .. }) => {
            // SAFETY: forwarded contract.
            unsafe { execute_strided(k) }
        }
        CopyKind::Memcpy { src, dst, len } => {
            if len == 0 {
                return Ok(());
            }
            let n = usize::try_from(len)
                .ok()
                .filter(|_| src != 0 && dst != 0)
                .filter(|_| src.checked_add(len).is_some() && dst.checked_add(len).is_some())
                .ok_or_else(|| Error::InvalidParam {
                    what: format!(
                        "memcpy {src:#x} -> {dst:#x}, {len} bytes: null or overflowing range"
                    ),
                })?;
            // SAFETY: the caller guarantees src is readable and dst writable for len bytes and
            // that no Rust reference covers dst; `copy` tolerates overlap.
            unsafe { std::ptr::copy(src as usize as *const u8, dst as usize as *mut u8, n) };
            Ok(())
        }
        CopyKind::CmaRead {
            pid,
            local,
            remote,
            len,
        } => {
            // SAFETY: the caller guarantees local is writable for len bytes.
            unsafe { cma_read(pid, local, remote, len) }.map_err(|e| {
                Error::io(
                    format!("process_vm_readv from pid {pid}: remote {remote:#x} -> local {local:#x}, {len} bytes"),
                    e,
                )
            })
        }
        CopyKind::CmaWrite {
            pid,
            local,
            remote,
            len,
        } => {
            // SAFETY: the caller guarantees local is readable for len bytes.
            unsafe { cma_write(pid, local, remote, len) }.map_err(|e| {
                Error::io(
                    format!("process_vm_writev to pid {pid}: local {local:#x} -> remote {remote:#x}, {len} bytes"),
                    e,
                )
            })
        }
    }
}

/// Runs a strided op.
///
/// # Safety
/// As [`execute`].
unsafe fn execute_strided(kind: CopyKind) -> Result<(), Error> {
    match kind {
        CopyKind::StridedMemcpy {
            src,
            dst,
            len,
            src_stride,
            dst_stride,
            count,
        } => {
            if len == 0 || count == 0 {
                return Ok(());
            }
            let n = usize::try_from(len)
                .ok()
                .filter(|_| src != 0 && dst != 0)
                .filter(|_| strided_end(src, len, src_stride, count).is_some())
                .filter(|_| strided_end(dst, len, dst_stride, count).is_some())
                .ok_or_else(|| Error::InvalidParam {
                    what: format!(
                        "strided memcpy {src:#x} -> {dst:#x}, {count} x {len} bytes (strides {src_stride}, {dst_stride}): null or overflowing range"
                    ),
                })?;
            for i in 0..count {
                let (s, d) = (src + i * src_stride, dst + i * dst_stride);
                // SAFETY: the caller guarantees every piece's source is readable and
                // destination writable, with no Rust reference over a destination; the span
                // was checked not to overflow above; `copy` tolerates overlap.
                unsafe { std::ptr::copy(s as usize as *const u8, d as usize as *mut u8, n) };
            }
            Ok(())
        }
        CopyKind::StridedCma {
            pid,
            local,
            remote,
            len,
            local_stride,
            remote_stride,
            count,
            write,
        } => {
            // SAFETY: the caller guarantees every local piece is valid for the direction.
            unsafe {
                crate::cma::cma_strided(
                    write,
                    pid,
                    (local, local_stride),
                    (remote, remote_stride),
                    len,
                    count,
                )
            }
            .map_err(|e| {
                Error::io(
                    format!(
                        "{} pid {pid}: {count} x {len} bytes, local {local:#x} (stride {local_stride}), remote {remote:#x} (stride {remote_stride})",
                        if write { "process_vm_writev to" } else { "process_vm_readv from" }
                    ),
                    e,
                )
            })
        }
        _ => Err(Error::InvalidParam {
            what: "a plain copy given to the strided executor".into(),
        }),
    }
}

#[cfg(test)]
#[path = "copy_engine_tests.rs"]
mod tests;
