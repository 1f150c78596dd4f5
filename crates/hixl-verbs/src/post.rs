//! Posting: a call's RDMA WRITE/READ ops become one linked chain of work requests, split at
//! the port's max message size, selectively signalled and handed to the device with a single
//! `ibv_post_send` (one doorbell).

use std::sync::atomic::{AtomicU64, Ordering};

use hixl_core::{Token, TransferOp};

use crate::error::{Result, VerbsError};
use crate::mr::{LocalRange, RemoteRange};
use crate::qp::QueuePair;
use crate::sys;

/// Sequence numbers carried in `wr_id`, unique in the process so that a late completion of a
/// destroyed QP can never match the shadow of a new QP that reuses its number.
static NEXT_SEQ: AtomicU64 = AtomicU64::new(1);

/// One RDMA op of a chain. The addresses are plain integers; what they must satisfy is the
/// `# Safety` contract of [`QueuePair::post_chain`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkRequest {
    /// Reported with the op's one completion.
    pub token: Token,
    /// [`TransferOp::Write`] (local → remote) or [`TransferOp::Read`] (remote → local).
    pub op: TransferOp,
    /// Local side: address, length and the lkey of the region it lies in.
    pub local: LocalRange,
    /// Remote side: address in the peer and its rkey. The length is `local.len`.
    pub remote: RemoteRange,
}

impl WorkRequest {
    /// An RDMA WRITE of `local` to `remote`.
    pub fn write(token: Token, local: LocalRange, remote: RemoteRange) -> WorkRequest {
        WorkRequest {
            token,
            op: TransferOp::Write,
            local,
            remote,
        }
    }

    /// An RDMA READ of `remote` into `local`.
    pub fn read(token: Token, local: LocalRange, remote: RemoteRange) -> WorkRequest {
        WorkRequest {
            token,
            op: TransferOp::Read,
            local,
            remote,
        }
    }

    /// Work requests this op becomes when split at `max_msg` bytes.
    pub fn pieces(&self, max_msg: u32) -> u64 {
        self.local.len.div_ceil(u64::from(max_msg.max(1)))
    }
}

/// Whether WR `i` of a chain of `n` is signalled.
fn signalled(i: usize, n: usize, every: u32) -> bool {
    i + 1 == n || (every > 0 && (i + 1) % every as usize == 0)
}

impl QueuePair {
    /// Posts `ops` as one chain of work requests with one `ibv_post_send`, returning how many
    /// work requests that was after splitting.
    ///
    /// **Splitting.** An op longer than [`QueuePair::max_message_size`] is posted as
    /// consecutive pieces of at most that size.
    ///
    /// **Signalling and completions.** Only the chain's last work request is signalled, plus
    /// every `signal_every`-th one when [`crate::QpConfig::signal_every`] is non-zero (which
    /// frees send-queue slots earlier in long chains). Regardless of splitting and signalling,
    /// each element of `ops` yields exactly **one** `(token, result)` from
    /// [`hixl_core::CompletionSource::drain`] on the QP's completion queue: RC completes in
    /// order, so a signalled success covers every earlier WR, and after a failure every later
    /// WR is flushed with its own completion. An op fails with the first error any of its
    /// pieces got: the device's status string (e.g. "remote access error", "transport retry
    /// counter exceeded"), and for ops flushed after it, "work request flushed" citing that
    /// first failure. An engine that gives a transfer's descriptors one token counts one part
    /// per descriptor.
    ///
    /// # Safety
    /// For every op, until its completion has been drained from the completion queue (or the
    /// QP has been dropped *and* its flushed completions drained):
    /// - `local` lies inside a memory region registered on this QP's protection domain whose
    ///   lkey is `local.lkey`, and that region (and the memory under it) stays registered and
    ///   mapped;
    /// - for a READ, nothing else reads or writes the local range (the device writes it at an
    ///   unspecified time); for a WRITE, nothing writes it (the device reads it);
    /// - `remote` names `local.len` bytes the peer registered with `remote.rkey` and the needed
    ///   access. A violation here is not memory-unsafe for this process (the peer's device
    ///   refuses it with a remote access error and both QPs go to the error state) but it
    ///   fails every op in flight on the QP: callers should check ranges first
    ///   ([`crate::RemoteMemory::at`]).
    ///
    /// # Errors
    /// [`VerbsError::Invalid`] for a zero-length or overflowing op (nothing posted);
    /// [`VerbsError::SendQueueFull`] when the chain does not fit in the send queue's free
    /// slots (nothing posted: drain and retry); [`VerbsError::Post`] when `ibv_post_send`
    /// refused the chain from some WR on: the ops it names are still in flight and complete
    /// (the QP is moved to the error state so that they do), the rest were not posted.
    ///
    /// A second poster on the same QP does not compile:
    ///
    /// ```compile_fail
    /// use hixl_verbs::{QueuePair, WorkRequest};
    /// fn post_from_a_shared_ref(qp: &QueuePair, ops: &[WorkRequest]) {
    ///     // SAFETY: never runs; posting needs `&mut QueuePair`.
    ///     let _ = unsafe { qp.post_chain(ops) };
    /// }
    /// ```
    ///
    /// whereas with exclusive access it does:
    ///
    /// ```no_run
    /// use hixl_verbs::{QueuePair, WorkRequest};
    /// fn post(qp: &mut QueuePair, ops: &[WorkRequest]) -> hixl_verbs::Result<usize> {
    ///     // SAFETY: the caller keeps the memory of `ops` registered and untouched until the
    ///     // completions are drained.
    ///     unsafe { qp.post_chain(ops) }
    /// }
    /// ```
    pub unsafe fn post_chain(&mut self, ops: &[WorkRequest]) -> Result<usize> {
        let max = u64::from(self.max_msg);
        let mut n = 0usize;
        for (i, op) in ops.iter().enumerate() {
            let l = op.local;
            if l.len == 0
                || l.addr.checked_add(l.len).is_none()
                || op.remote.addr.checked_add(l.len).is_none()
            {
                return Err(VerbsError::Invalid {
                    what: "work request",
                    reason: format!(
                        "op {i}: {:#x}+{} -> {:#x} is empty or overflows",
                        l.addr, l.len, op.remote.addr
                    ),
                });
            }
            n = n.saturating_add(usize::try_from(op.pieces(self.max_msg)).unwrap_or(usize::MAX));
        }
        if n == 0 {
            return Ok(0);
        }
        let base = {
            let mut st = self.cq.lock();
            let Some(a) = st.queues.get_mut(&self.qpn) else {
                return Err(VerbsError::Invalid {
                    what: "queue pair",
                    reason: "not attached".into(),
                });
            };
            if n > a.sq.room() {
                return Err(VerbsError::SendQueueFull {
                    qpn: self.qpn,
                    outstanding: a.sq.outstanding(),
                    needed: n,
                    capacity: a.sq.capacity(),
                });
            }
            // Entries go in before the doorbell: a completion may be polled before
            // ibv_post_send even returns.
            let base = NEXT_SEQ.fetch_add(n as u64, Ordering::Relaxed);
            let mut seq = base;
            for op in ops {
                let pieces = op.pieces(self.max_msg);
                for p in 0..pieces {
                    a.sq.push(seq, op.token, p + 1 == pieces);
                    seq += 1;
                }
            }
            base
        };
        self.fill(ops, base, n, max);
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is live; wrs[0..n] is a NULL-terminated linked chain whose sg_list
        // pointers point into sges, both of which stay untouched until this call returns
        // (the provider copies WRs into the send queue). The memory the WRs name is the
        // caller's responsibility (this function's contract).
        let rc = unsafe { sys::ibv_post_send(self.qp, self.wrs.as_mut_ptr(), &mut bad) };
        if rc == 0 {
            return Ok(n);
        }
        let failed_wr = (0..n)
            .find(|&i| std::ptr::eq(&self.wrs[i], bad))
            .unwrap_or(0);
        self.unpost(ops, base, failed_wr, n, sys::error_from_rc(rc))
    }

    /// Builds the chain in the scratch arrays: WR `i` of `n`, with `wr_id = base + i`.
    fn fill(&mut self, ops: &[WorkRequest], base: u64, n: usize, max: u64) {
        self.wrs.clear();
        self.sges.clear();
        self.wrs.reserve(n);
        self.sges.reserve(n);
        for op in ops {
            let mut off = 0;
            while off < op.local.len {
                let len = (op.local.len - off).min(max);
                let i = self.wrs.len();
                self.sges.push(sys::ibv_sge {
                    addr: op.local.addr + off,
                    length: len as u32,
                    lkey: op.local.lkey,
                });
                // SAFETY: ibv_send_wr is plain data (integers, pointers, unions of those);
                // all-zero is a valid empty WR.
                let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
                wr.wr_id = base + i as u64;
                wr.num_sge = 1;
                wr.opcode = match op.op {
                    TransferOp::Write => sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                    TransferOp::Read => sys::ibv_wr_opcode::IBV_WR_RDMA_READ,
                };
                if signalled(i, n, self.cfg.signal_every) {
                    wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
                }
                wr.wr.rdma.remote_addr = op.remote.addr + off;
                wr.wr.rdma.rkey = op.remote.rkey;
                self.wrs.push(wr);
                off += len;
            }
        }
        // Link only now, when both vectors are at their final size, through one raw base
        // pointer each (Vec::as_mut_ptr materialises no reference, so the pointers stay valid
        // for the as_mut_ptr in post_chain).
        debug_assert!(self.wrs.len() == n && self.sges.len() == n);
        let wrs = self.wrs.as_mut_ptr();
        let sges = self.sges.as_mut_ptr();
        for i in 0..n {
            // SAFETY: i < n = len of both vectors, so every pointer formed is in bounds.
            unsafe {
                let wr = wrs.add(i);
                (*wr).sg_list = sges.add(i);
                (*wr).next = if i + 1 < n {
                    wrs.add(i + 1)
                } else {
                    std::ptr::null_mut()
                };
            }
        }
    }

    /// Undoes the shadow entries of the WRs the device did not take.
    fn unpost(
        &mut self,
        ops: &[WorkRequest],
        base: u64,
        failed_wr: usize,
        n: usize,
        e: std::io::Error,
    ) -> Result<usize> {
        if let Some(a) = self.cq.lock().queues.get_mut(&self.qpn) {
            a.sq.unpost_from(base + failed_wr as u64);
        }
        // Ops whose first piece was posted are still reported.
        let mut reported_ops = 0;
        let mut wr = 0u64;
        for op in ops {
            if wr >= failed_wr as u64 {
                break;
            }
            reported_ops += 1;
            wr += op.pieces(self.max_msg);
        }
        if failed_wr > 0 {
            // The last posted WR may be unsignalled: flush so that its completion arrives.
            if let Err(e2) = self.set_error() {
                tracing::warn!(qpn = self.qpn, "after a partial post: {e2}");
            }
        }
        Err(VerbsError::Post {
            qpn: self.qpn,
            failed_wr,
            total: n,
            reported_ops,
            source: std::sync::Arc::new(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signalling_pattern() {
        let s: Vec<bool> = (0..5).map(|i| signalled(i, 5, 0)).collect();
        assert_eq!(s, [false, false, false, false, true]);
        let s: Vec<bool> = (0..5).map(|i| signalled(i, 5, 2)).collect();
        assert_eq!(s, [false, true, false, true, true]);
        assert!(signalled(0, 1, 0));
    }

    #[test]
    fn pieces_round_up() {
        let wr = WorkRequest::write(
            Token(1),
            LocalRange {
                addr: 0x1000,
                len: 10,
                lkey: 1,
            },
            RemoteRange {
                addr: 0x2000,
                rkey: 2,
            },
        );
        assert_eq!(wr.pieces(4), 3);
        assert_eq!(wr.pieces(10), 1);
        assert_eq!(wr.pieces(0), 10, "0 is taken as 1");
    }
}
