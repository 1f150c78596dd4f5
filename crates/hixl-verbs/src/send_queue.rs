//! The software shadow of one QP's send queue: which op each posted work request belongs to,
//! so that selectively signalled chains still yield exactly one completion per op.
//!
//! RC work requests complete in posting order. A signalled success for WR `s` therefore means
//! every earlier WR of the QP succeeded too; an error for WR `s` means the earlier ones
//! succeeded and WR `s` failed; after an error the QP is in the error state and every later WR
//! comes back flushed, each with its own completion, signalled or not. The shadow pops every
//! entry up to `s` and reports an op when its last piece is popped, with the first error any
//! of its pieces got. Nothing here touches the device, so all of it is tested with fake
//! completions.

use std::collections::VecDeque;

use hixl_core::{Error as CoreError, PartResult, Token};

use crate::error::{completion_error, WcStatus};

/// One posted work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    seq: u64,
    token: Token,
    /// The last piece of its op (ops above the max message size are split into pieces).
    last_of_op: bool,
}

/// How a work request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// `IBV_WC_SUCCESS`.
    Success,
    /// Any other status.
    Failed {
        /// The status.
        status: WcStatus,
        /// The provider's code.
        vendor_err: u32,
    },
}

/// Outstanding work requests of one QP, in posting order.
#[derive(Debug)]
pub(crate) struct SendQueue {
    qpn: u32,
    peer: String,
    capacity: usize,
    entries: VecDeque<Entry>,
    /// Error of the op at the front, reported when its last piece is popped.
    op_error: Option<CoreError>,
    /// The first failure on this QP, cited by the ops flushed after it.
    failure: Option<String>,
}

impl SendQueue {
    pub(crate) fn new(qpn: u32, capacity: usize) -> SendQueue {
        SendQueue {
            qpn,
            peer: format!("qp {qpn:#x}"),
            capacity,
            entries: VecDeque::with_capacity(capacity.min(1 << 16)),
            op_error: None,
            failure: None,
        }
    }

    pub(crate) fn set_peer(&mut self, peer: &str) {
        peer.clone_into(&mut self.peer);
    }

    /// Work requests posted and not yet accounted for by a polled completion.
    pub(crate) fn outstanding(&self) -> usize {
        self.entries.len()
    }

    /// Work requests that may still be posted.
    pub(crate) fn room(&self) -> usize {
        self.capacity.saturating_sub(self.entries.len())
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// The first failure seen on this QP, if any.
    pub(crate) fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Records a WR about to be posted. Sequence numbers must increase.
    pub(crate) fn push(&mut self, seq: u64, token: Token, last_of_op: bool) {
        debug_assert!(self.entries.back().map_or(true, |e| e.seq < seq));
        self.entries.push_back(Entry {
            seq,
            token,
            last_of_op,
        });
    }

    /// Forgets the WRs from `seq` on (the device did not take them). If that leaves an op
    /// with only some of its pieces posted, the last posted piece reports it.
    pub(crate) fn unpost_from(&mut self, seq: u64) {
        while self.entries.back().is_some_and(|e| e.seq >= seq) {
            self.entries.pop_back();
        }
        if let Some(e) = self.entries.back_mut() {
            e.last_of_op = true;
        }
    }

    fn flushed(&self) -> CoreError {
        let after = match &self.failure {
            Some(f) => format!(" after an earlier failure: {f}"),
            None => String::new(),
        };
        CoreError::PeerLost {
            peer: self.peer.clone(),
            cause: format!(
                "qp {:#x}: work request flushed (the QP is in the error state){after}",
                self.qpn
            ),
        }
    }

    /// Applies the completion of WR `seq`, appending one result per op whose last piece it
    /// covers. Returns false (and changes nothing) for a sequence number that is not
    /// outstanding: a completion of a QP that was reset, or a bug.
    pub(crate) fn complete(
        &mut self,
        seq: u64,
        outcome: Outcome,
        out: &mut Vec<PartResult>,
    ) -> bool {
        match (self.entries.front(), self.entries.back()) {
            (Some(f), Some(b)) if f.seq <= seq && seq <= b.seq => {}
            _ => return false,
        }
        while let Some(e) = self.entries.front().copied() {
            if e.seq > seq {
                break;
            }
            self.entries.pop_front();
            if e.seq == seq {
                if let Outcome::Failed { status, vendor_err } = outcome {
                    let err = if status.is_flush() {
                        self.flushed()
                    } else {
                        completion_error(&self.peer, self.qpn, status, vendor_err)
                    };
                    if self.failure.is_none() {
                        self.failure = Some(err.to_string());
                    }
                    self.op_error.get_or_insert(err);
                }
            }
            if e.last_of_op {
                out.push((e.token, self.op_error.take().map_or(Ok(()), Err)));
            }
        }
        true
    }

    /// Fails every outstanding op with `cause` (the QP was destroyed or reset and the device
    /// will report nothing more for it).
    pub(crate) fn fail_all(&mut self, cause: &str, out: &mut Vec<PartResult>) {
        while let Some(e) = self.entries.pop_front() {
            if e.last_of_op {
                let err = self.op_error.take().unwrap_or_else(|| CoreError::PeerLost {
                    peer: self.peer.clone(),
                    cause: format!("qp {:#x}: {cause}", self.qpn),
                });
                out.push((e.token, Err(err)));
            }
        }
        self.op_error = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hixl_core::Status;

    fn toks(out: &[PartResult]) -> Vec<(u64, bool)> {
        out.iter().map(|(t, r)| (t.0, r.is_ok())).collect()
    }

    /// Op A in two pieces (seq 1, 2), B (3), C (4); only seq 4 signalled.
    fn three_ops() -> SendQueue {
        let mut sq = SendQueue::new(0x11, 8);
        sq.push(1, Token(0xA), false);
        sq.push(2, Token(0xA), true);
        sq.push(3, Token(0xB), true);
        sq.push(4, Token(0xC), true);
        sq
    }

    #[test]
    fn one_signalled_completion_reports_every_op_once() {
        let mut sq = three_ops();
        assert_eq!((sq.outstanding(), sq.room()), (4, 4));
        let mut out = Vec::new();
        assert!(sq.complete(4, Outcome::Success, &mut out));
        assert_eq!(toks(&out), [(0xA, true), (0xB, true), (0xC, true)]);
        assert_eq!(sq.outstanding(), 0);
        assert!(!sq.complete(4, Outcome::Success, &mut out), "stale");
    }

    #[test]
    fn every_nth_signalled_reports_progressively() {
        let mut sq = three_ops();
        let mut out = Vec::new();
        assert!(sq.complete(2, Outcome::Success, &mut out));
        assert_eq!(toks(&out), [(0xA, true)]);
        assert!(sq.complete(4, Outcome::Success, &mut out));
        assert_eq!(toks(&out), [(0xA, true), (0xB, true), (0xC, true)]);
    }

    #[test]
    fn error_then_flush_cites_the_first_failure() {
        let mut sq = three_ops();
        sq.set_peer("peer-1");
        let mut out = Vec::new();
        let rem = Outcome::Failed {
            status: WcStatus::REM_ACCESS_ERR,
            vendor_err: 0,
        };
        assert!(sq.complete(3, rem, &mut out));
        assert_eq!(toks(&out), [(0xA, true), (0xB, false)]);
        let e = out[1].1.as_ref().unwrap_err();
        assert_eq!(e.status(), Status::ParamInvalid);
        assert!(e.to_string().contains("remote access error"), "{e}");
        assert!(e.to_string().contains("peer-1"), "{e}");
        let flush = Outcome::Failed {
            status: WcStatus::WR_FLUSH_ERR,
            vendor_err: 0,
        };
        assert!(sq.complete(4, flush, &mut out));
        let e = out[2].1.as_ref().unwrap_err().to_string();
        assert!(
            e.contains("flushed") && e.contains("remote access error"),
            "{e}"
        );
        assert!(sq
            .failure()
            .is_some_and(|f| f.contains("remote access error")));
    }

    #[test]
    fn a_failed_first_piece_fails_its_op_once() {
        let mut sq = three_ops();
        let mut out = Vec::new();
        let retry = Outcome::Failed {
            status: WcStatus::RETRY_EXC_ERR,
            vendor_err: 0x81,
        };
        assert!(sq.complete(1, retry, &mut out));
        assert!(out.is_empty(), "op A still has a piece outstanding");
        let flush = Outcome::Failed {
            status: WcStatus::WR_FLUSH_ERR,
            vendor_err: 0,
        };
        for s in 2..=4 {
            assert!(sq.complete(s, flush, &mut out));
        }
        assert_eq!(toks(&out), [(0xA, false), (0xB, false), (0xC, false)]);
        let a = out[0].1.as_ref().unwrap_err().to_string();
        assert!(
            a.contains("retry counter exceeded") && !a.contains("flushed"),
            "{a}"
        );
        assert_eq!(sq.outstanding(), 0);
    }

    #[test]
    fn stale_and_future_sequence_numbers_are_ignored() {
        let mut sq = three_ops();
        let mut out = Vec::new();
        assert!(!sq.complete(0, Outcome::Success, &mut out));
        assert!(!sq.complete(5, Outcome::Success, &mut out));
        assert!(out.is_empty());
        assert_eq!(sq.outstanding(), 4);
    }

    #[test]
    fn unposting_keeps_a_partly_posted_op_reportable() {
        let mut sq = three_ops();
        sq.unpost_from(2);
        assert_eq!(sq.outstanding(), 1);
        let mut out = Vec::new();
        let flush = Outcome::Failed {
            status: WcStatus::WR_FLUSH_ERR,
            vendor_err: 0,
        };
        assert!(sq.complete(1, flush, &mut out));
        assert_eq!(toks(&out), [(0xA, false)]);
    }

    #[test]
    fn fail_all_reports_each_op_once() {
        let mut sq = three_ops();
        let mut out = Vec::new();
        sq.fail_all("destroyed", &mut out);
        assert_eq!(toks(&out), [(0xA, false), (0xB, false), (0xC, false)]);
        assert!(out[0]
            .1
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("destroyed"));
        assert_eq!(sq.room(), sq.capacity());
    }
}
