//! The completion queue with its completion channel: the verbs backend's
//! [`hixl_core::CompletionSource`]. Draining maps work completions back to ops through each
//! QP's send-queue shadow; the channel's fd is what the engine's reactor parks on.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hixl_core::{CompletionSource, PartResult};

use crate::context::Context;
use crate::error::{Result, VerbsError, WcStatus};
use crate::mr::ProtectionDomain;
use crate::send_queue::{Outcome, SendQueue};
use crate::sys;

/// Work completions fetched per `ibv_poll_cq` call.
const POLL_BATCH: usize = 64;

/// A completion queue (`ibv_cq`) with a completion channel (`ibv_comp_channel`) whose fd is
/// non-blocking and pollable. Cheap to clone; every QP created on it holds a clone.
///
/// Every work request QPs post yields completions here; [`CompletionSource::drain`] turns them
/// into exactly one `(token, result)` per [`crate::WorkRequest`] (see
/// [`crate::QueuePair::post_chain`]). The reactor's turn is: `drain`, `arm` (request the next
/// event and consume earlier ones), `drain` again, then wait for [`CompletionSource::fd`].
///
/// The queue holds `capacity` entries; each QP reserves its send-queue depth (plus one receive
/// slot) when it is created, so that even when every outstanding WR of every QP is flushed
/// at once the queue cannot overflow.
#[derive(Clone)]
pub struct Cq {
    pub(crate) inner: Arc<CqInner>,
}

pub(crate) struct CqInner {
    cq: *mut sys::ibv_cq,
    channel: *mut sys::ibv_comp_channel,
    fd: RawFd,
    capacity: u32,
    ctx: Context,
    state: Mutex<CqState>,
}

/// What drain and post share: the shadows of the QPs attached to this CQ.
pub(crate) struct CqState {
    pub(crate) queues: HashMap<u32, Attached>,
    reserved: u32,
    zombies: usize,
}

/// One QP's entry: its shadow, its CQ reservation and, once its owner dropped it with work
/// still outstanding, the QP itself (destroyed when the last flush is drained).
pub(crate) struct Attached {
    pub(crate) sq: SendQueue,
    reserve: u32,
    zombie: Option<Zombie>,
}

struct Zombie {
    qp: *mut sys::ibv_qp,
    _pd: ProtectionDomain,
}

// SAFETY: libibverbs documents ibv_poll_cq, ibv_req_notify_cq and the channel calls as
// thread-safe; the shadows and parked QP pointers are only touched under `state`'s mutex.
unsafe impl Send for CqInner {}
// SAFETY: see Send.
unsafe impl Sync for CqInner {}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq")
            .field("device", &self.inner.ctx.name())
            .field("capacity", &self.inner.capacity)
            .field("fd", &self.inner.fd)
            .finish()
    }
}

impl Cq {
    /// Creates a queue of `capacity` entries with its own completion channel.
    ///
    /// # Errors
    /// [`VerbsError::Invalid`] for 0 or more than the device's `max_cqe`; the errno of
    /// `ibv_create_comp_channel`, `fcntl` or `ibv_create_cq`.
    pub fn new(ctx: &Context, capacity: u32) -> Result<Cq> {
        let max = ctx.limits().max_cqe;
        if capacity == 0 || capacity > max || capacity > i32::MAX as u32 {
            return Err(VerbsError::Invalid {
                what: "completion queue capacity",
                reason: format!("{capacity} is not in 1..={max} (the device's max_cqe)"),
            });
        }
        // SAFETY: the context is open (ctx holds it).
        let channel = unsafe { sys::ibv_create_comp_channel(ctx.raw()) };
        if channel.is_null() {
            return Err(VerbsError::verb(
                "ibv_create_comp_channel",
                ctx.name(),
                sys::last_error(),
            ));
        }
        // SAFETY: channel is a valid channel just created.
        let fd = unsafe { (*channel).fd };
        let destroy_channel = || {
            // SAFETY: channel was created above and has no CQ yet.
            unsafe { sys::ibv_destroy_comp_channel(channel) };
        };
        // SAFETY: fd is the channel's open descriptor; F_GETFL/F_SETFL touch only its flags.
        let ok = unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            fl >= 0 && libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) == 0
        };
        if !ok {
            let e = sys::last_error();
            destroy_channel();
            return Err(VerbsError::verb(
                "fcntl(O_NONBLOCK) on the completion channel",
                ctx.name(),
                e,
            ));
        }
        // SAFETY: context and channel are valid; no cq_context is used.
        let cq = unsafe {
            sys::ibv_create_cq(
                ctx.raw(),
                capacity as libc::c_int,
                std::ptr::null_mut(),
                channel,
                0,
            )
        };
        if cq.is_null() {
            let e = sys::last_error();
            destroy_channel();
            return Err(VerbsError::verb("ibv_create_cq", ctx.name(), e));
        }
        Ok(Cq {
            inner: Arc::new(CqInner {
                cq,
                channel,
                fd,
                capacity,
                ctx: ctx.clone(),
                state: Mutex::new(CqState {
                    queues: HashMap::new(),
                    reserved: 0,
                    zombies: 0,
                }),
            }),
        })
    }

    /// Entries the queue holds.
    pub fn capacity(&self) -> u32 {
        self.inner.capacity
    }

    /// Entries not yet reserved by a QP.
    pub fn unreserved(&self) -> u32 {
        self.inner.capacity.saturating_sub(self.lock().reserved)
    }

    pub(crate) fn raw(&self) -> *mut sys::ibv_cq {
        self.inner.cq
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, CqState> {
        // Every critical section leaves the map consistent (single inserts/removes and shadow
        // updates); a poisoned lock is still usable, and refusing would strand in-flight ops.
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves `reserve` entries for a QP about to be created (checked and taken under one
    /// lock, so concurrent creations cannot oversubscribe the queue).
    pub(crate) fn reserve(&self, reserve: u32) -> Result<()> {
        let mut st = self.lock();
        if st.reserved.saturating_add(reserve) > self.inner.capacity {
            return Err(VerbsError::CompletionQueueFull {
                capacity: self.inner.capacity,
                reserved: st.reserved,
                needed: reserve,
            });
        }
        st.reserved += reserve;
        Ok(())
    }

    /// Returns a reservation whose QP could not be created.
    pub(crate) fn unreserve(&self, reserve: u32) {
        let mut st = self.lock();
        st.reserved = st.reserved.saturating_sub(reserve);
    }

    /// Starts the shadow of a QP created under a reservation of `reserve` entries.
    pub(crate) fn attach(&self, qpn: u32, sq: SendQueue, reserve: u32) {
        self.lock().queues.insert(
            qpn,
            Attached {
                sq,
                reserve,
                zombie: None,
            },
        );
    }

    /// Called by a QP's Drop: with nothing outstanding the QP is detached and the caller
    /// destroys it (returns true); otherwise it is parked here, already moved to the error
    /// state by the caller, until its flushed completions are drained (returns false).
    pub(crate) fn detach_or_park(
        &self,
        qpn: u32,
        qp: *mut sys::ibv_qp,
        pd: &ProtectionDomain,
    ) -> bool {
        let mut st = self.lock();
        let outstanding = st.queues.get(&qpn).map_or(0, |a| a.sq.outstanding());
        if outstanding == 0 {
            if let Some(a) = st.queues.remove(&qpn) {
                st.reserved = st.reserved.saturating_sub(a.reserve);
            }
            return true;
        }
        if let Some(a) = st.queues.get_mut(&qpn) {
            a.zombie = Some(Zombie {
                qp,
                _pd: pd.clone(),
            });
            st.zombies += 1;
        }
        false
    }

    /// Polls every available completion and applies it to its QP's shadow; returns how many
    /// `(token, result)` pairs were appended to `out`.
    pub fn poll(&self, out: &mut Vec<PartResult>) -> usize {
        let before = out.len();
        let mut st = self.lock();
        let mut wcs: [MaybeUninit<sys::ibv_wc>; POLL_BATCH] =
            [const { MaybeUninit::uninit() }; POLL_BATCH];
        loop {
            // SAFETY: the CQ is live; wcs has room for POLL_BATCH entries, of which the
            // provider initialises the first n it returns.
            let n =
                unsafe { sys::ibv_poll_cq(self.raw(), POLL_BATCH as i32, wcs.as_mut_ptr().cast()) };
            if n < 0 {
                tracing::error!(device = self.inner.ctx.name(), rc = n, "ibv_poll_cq failed");
                break;
            }
            for wc in &wcs[..n as usize] {
                // SAFETY: the provider initialised the first n entries.
                let wc = unsafe { wc.assume_init_ref() };
                st.apply(wc, out);
            }
            if (n as usize) < POLL_BATCH {
                break;
            }
        }
        if st.zombies > 0 {
            st.reap_zombies();
        }
        out.len() - before
    }

    /// Requests an event for the next completion and consumes (and acknowledges) the events
    /// already delivered, so that the fd is readable again only for completions after this.
    ///
    /// # Errors
    /// The errno of `ibv_req_notify_cq`.
    pub fn request_notify(&self) -> Result<()> {
        let mut events = 0u32;
        loop {
            let mut cq: *mut sys::ibv_cq = std::ptr::null_mut();
            let mut ctx: *mut libc::c_void = std::ptr::null_mut();
            // SAFETY: the channel is live and non-blocking, so this returns -1 (EAGAIN) when
            // no event is queued instead of blocking; cq and ctx are valid out-pointers.
            let rc = unsafe { sys::ibv_get_cq_event(self.inner.channel, &mut cq, &mut ctx) };
            if rc != 0 {
                break;
            }
            events += 1;
        }
        if events > 0 {
            // SAFETY: acknowledges exactly the events fetched above for our only CQ.
            unsafe { sys::ibv_ack_cq_events(self.raw(), events) };
        }
        // SAFETY: the CQ is live; 0 = notify on any completion, not only solicited ones.
        let rc = unsafe { sys::ibv_req_notify_cq(self.raw(), 0) };
        if rc != 0 {
            return Err(VerbsError::verb(
                "ibv_req_notify_cq",
                self.inner.ctx.name(),
                sys::error_from_rc(rc),
            ));
        }
        Ok(())
    }

    /// Waits up to `timeout` for the channel fd to become readable.
    pub fn wait_readable(&self, timeout: Duration) -> bool {
        let mut p = libc::pollfd {
            fd: self.inner.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        n == 1
    }

    /// The synchronous form of the reactor's turn, for callers without one (tests, tools):
    /// polls, arms, polls, parks on the fd, until `out` holds at least `want` results or
    /// `timeout` passed. Returns how many results were appended.
    pub fn wait_for(&self, out: &mut Vec<PartResult>, want: usize, timeout: Duration) -> usize {
        let start = out.len();
        // A timeout past any instant (`Duration::MAX`) is no bound.
        let deadline = Instant::now().checked_add(timeout);
        while out.len() - start < want {
            if self.poll(out) > 0 {
                continue;
            }
            if let Err(e) = self.request_notify() {
                tracing::error!("{e}");
            }
            if self.poll(out) > 0 {
                continue;
            }
            let left = deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                break;
            }
            self.wait_readable(left.min(Duration::from_millis(100)));
        }
        out.len() - start
    }
}

impl CqState {
    fn apply(&mut self, wc: &sys::ibv_wc, out: &mut Vec<PartResult>) {
        let Some(a) = self.queues.get_mut(&wc.qp_num) else {
            tracing::warn!(
                qpn = wc.qp_num,
                wr_id = wc.wr_id,
                "completion for an unknown QP ignored"
            );
            return;
        };
        let outcome = if wc.status == sys::ibv_wc_status::IBV_WC_SUCCESS {
            Outcome::Success
        } else {
            Outcome::Failed {
                status: WcStatus(wc.status),
                vendor_err: wc.vendor_err,
            }
        };
        if !a.sq.complete(wc.wr_id, outcome, out) {
            tracing::warn!(
                qpn = wc.qp_num,
                wr_id = wc.wr_id,
                "stale completion ignored"
            );
        }
    }

    fn reap_zombies(&mut self) {
        let done: Vec<u32> = self
            .queues
            .iter()
            .filter(|(_, a)| a.zombie.is_some() && a.sq.outstanding() == 0)
            .map(|(&q, _)| q)
            .collect();
        for qpn in done {
            if let Some(a) = self.queues.remove(&qpn) {
                self.reserved = self.reserved.saturating_sub(a.reserve);
                self.zombies -= 1;
                if let Some(z) = a.zombie {
                    destroy_qp(z.qp, qpn);
                }
            }
        }
    }
}

pub(crate) fn destroy_qp(qp: *mut sys::ibv_qp, qpn: u32) {
    // SAFETY: qp was created by ibv_create_qp, its owner is gone and it is destroyed once.
    let rc = unsafe { sys::ibv_destroy_qp(qp) };
    if rc != 0 {
        tracing::warn!(qpn, rc, "ibv_destroy_qp failed");
    }
}

impl CompletionSource for Cq {
    fn drain(&self, out: &mut Vec<PartResult>) -> usize {
        self.poll(out)
    }

    /// `ibv_req_notify_cq` after consuming delivered events.
    fn arm(&self) {
        if let Err(e) = self.request_notify() {
            tracing::error!("arming the completion channel: {e}");
        }
    }

    /// A completion channel cannot withdraw a request: the event it may still deliver is
    /// consumed by the next `arm`, at the cost of one spurious wake-up.
    fn disarm(&self) {}

    fn fd(&self) -> RawFd {
        self.inner.fd
    }
}

impl AsRawFd for Cq {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.fd
    }
}

impl Drop for CqInner {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let mut lost = Vec::new();
        for (qpn, mut a) in st.queues.drain() {
            if let Some(z) = a.zombie.take() {
                a.sq.fail_all("completion queue destroyed", &mut lost);
                destroy_qp(z.qp, qpn);
            }
        }
        if !lost.is_empty() {
            tracing::warn!(
                ops = lost.len(),
                "completion queue dropped with ops of dropped QPs outstanding"
            );
        }
        // SAFETY: no QP uses the CQ any more (live QPs hold the Arc around this; parked ones
        // were destroyed above) and every fetched event was acknowledged in request_notify.
        let rc = unsafe { sys::ibv_destroy_cq(self.cq) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_cq failed");
        }
        // SAFETY: the channel's only CQ is gone.
        let rc = unsafe { sys::ibv_destroy_comp_channel(self.channel) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_comp_channel failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrappers_can_be_shared_with_a_reactor_thread() {
        fn source<T: CompletionSource + Clone + 'static>() {}
        fn send_sync<T: Send + Sync>() {}
        source::<Cq>();
        send_sync::<crate::QueuePair>();
        send_sync::<crate::MemoryRegion>();
        send_sync::<crate::RegisteredBuffer>();
        send_sync::<crate::Context>();
    }
}
