//! Transfers of the blocking facade: `TransferSync`, and `TransferAsync` with its request
//! tracking (`GetTransferStatus`).

use std::sync::atomic::Ordering;

use futures::FutureExt;
use hixl_core::{Error, OpDesc, Result, TransferOp, TransferStatus};

use super::runtime::{lock, not_in_runtime, Inner, Pending};
use super::{
    check_timeout, GetTransferStatusArgs, Hixl, TransferReq, TransferResult,
    MAX_OUTSTANDING_REQUESTS,
};
use crate::Transfer;

impl Hixl {
    /// Moves data and waits until every byte landed (HIXL `TransferSync`). `Read` copies
    /// remote → local, `Write` local → remote; local ranges must be registered here, remote
    /// ranges inside memory the peer registered. Nothing moves if any descriptor is invalid.
    ///
    /// # Errors
    /// [`Error::NotInitialized`], [`Error::InvalidTimeout`] for `timeout_ms <= 0`,
    /// [`Error::NotConnected`], descriptor errors ([`Error::NullAddress`],
    /// [`Error::ZeroLength`], [`Error::LocalUnregistered`], [`Error::RemoteOutOfBounds`],
    /// [`Error::NoDescriptors`] for an empty list), [`Error::Timeout`] (the op is abandoned),
    /// the link's failure, or [`Error::InsideRuntime`] from inside a tokio runtime.
    pub fn transfer_sync(
        &self,
        remote: &str,
        op: TransferOp,
        descs: &[OpDesc],
        timeout_ms: i32,
    ) -> Result<()> {
        self.with_blocking("transfer_sync", |i| {
            let t = check_timeout(timeout_ms)?;
            let peer = i.block_on("transfer_sync", i.engine.peer_or_connect(remote))??;
            i.block_on("transfer_sync", async move {
                peer.transfer(op, descs).timeout(t).await
            })?
        })
    }

    /// Posts a transfer and returns at once with its request (HIXL `TransferAsync`).
    /// `user_data` is echoed by [`Hixl::get_all_transfer_status`]. Query the request with
    /// [`Hixl::get_transfer_status`] until it is terminal, which frees it. As in HIXL there is
    /// no timeout: track a deadline yourself and [`Hixl::disconnect`] to abort. Does not
    /// block.
    ///
    /// # Errors
    /// [`Error::NotInitialized`], [`Error::NotConnected`], descriptor errors as for
    /// [`Hixl::transfer_sync`] (found at submission, so nothing is outstanding), the link's
    /// failure if it is already down, [`Error::ResourceExhausted`] when
    /// [`MAX_OUTSTANDING_REQUESTS`] requests are outstanding.
    pub fn transfer_async(
        &self,
        remote: &str,
        op: TransferOp,
        descs: &[OpDesc],
        user_data: u64,
    ) -> Result<TransferReq> {
        self.with(|i| {
            // AutoConnect: connect first (blocking, as HIXL does); otherwise a lookup.
            let peer = match i.engine.peer(remote) {
                Ok(p) if p.is_connected() || !i.engine.auto_connects() => p,
                Err(e) if !i.engine.auto_connects() => return Err(e),
                _ => {
                    not_in_runtime("transfer_async")?;
                    i.block_on("transfer_async", i.engine.peer_or_connect(remote))??
                }
            };
            let mut reqs = lock(&i.reqs);
            if reqs.len() >= MAX_OUTSTANDING_REQUESTS {
                return Err(Error::ResourceExhausted {
                    what: format!(
                        "{MAX_OUTSTANDING_REQUESTS} asynchronous requests are outstanding; \
                         read their status to free them"
                    ),
                });
            }
            let _ctx = i.rt.enter();
            let transfer = peer.transfer(op, descs);
            if transfer.status() == TransferStatus::Failed {
                return Err(match transfer.now_or_never() {
                    Some(Err(e)) => e,
                    // A failed transfer resolves to its error at once: reaching this is a bug.
                    _ => Error::Internal {
                        what: "a transfer failed at submission without an error",
                    },
                });
            }
            let req = self.next_req.fetch_add(1, Ordering::Relaxed);
            reqs.insert(
                req,
                Pending {
                    transfer,
                    user_data,
                },
            );
            Ok(TransferReq(req))
        })
    }

    /// The state of an asynchronous request, without waiting (HIXL `GetTransferStatus`).
    /// A terminal status ([`TransferStatus::Completed`], [`TransferStatus::Failed`]) frees
    /// the request: asking again is an error. ([`TransferStatus::TimedOut`] is never
    /// produced here, as in HIXL.)
    ///
    /// # Errors
    /// [`Error::NotInitialized`], [`Error::UnknownRequest`] (HIXL `PARAM_INVALID`) for a
    /// request that is unknown or already freed.
    pub fn get_transfer_status(&self, req: TransferReq) -> Result<TransferStatus> {
        self.with(|i| {
            let mut reqs = lock(&i.reqs);
            let status = match reqs.get(&req.0) {
                Some(p) => p.transfer.status(),
                None => return Err(Error::UnknownRequest { req: req.0 }),
            };
            if status.is_terminal() {
                if let Some(p) = reqs.remove(&req.0) {
                    reap(i, req, p.transfer);
                }
            }
            Ok(status)
        })
    }

    /// The state of every outstanding asynchronous request, in submission order (HIXL's
    /// "get all" `GetTransferStatus`): at most `args.max_query_count` results, without the
    /// waiting ones if `args.skip_waiting`. Requests returned with a terminal status are
    /// freed. Does not block.
    ///
    /// HIXL answers `UNSUPPORTED` here unless UB hardware (uboe/ub_rtp) is configured; hixl
    /// supports it on every transport.
    ///
    /// # Errors
    /// [`Error::NotInitialized`].
    pub fn get_all_transfer_status(
        &self,
        args: GetTransferStatusArgs,
    ) -> Result<Vec<TransferResult>> {
        self.with(|i| {
            let max = usize::try_from(args.max_query_count).unwrap_or(usize::MAX);
            let mut reqs = lock(&i.reqs);
            let mut out = Vec::new();
            let mut freed = Vec::new();
            for (&req, p) in reqs.iter() {
                if out.len() >= max {
                    break;
                }
                let status = p.transfer.status();
                if args.skip_waiting && status == TransferStatus::Waiting {
                    continue;
                }
                if status.is_terminal() {
                    freed.push(req);
                }
                out.push(TransferResult {
                    req: TransferReq(req),
                    user_data: p.user_data,
                    status,
                });
            }
            for req in freed {
                if let Some(p) = reqs.remove(&req) {
                    reap(i, TransferReq(req), p.transfer);
                }
            }
            Ok(out)
        })
    }
}

/// Frees a request that reached a terminal status: polls it once so its op slot is released
/// now (a failed op's error is logged, as HIXL only reports the status).
fn reap(inner: &Inner, req: TransferReq, transfer: Transfer) {
    let _ctx = inner.rt.enter();
    if let Some(Err(e)) = transfer.now_or_never() {
        tracing::debug!(req = req.0, "asynchronous transfer failed: {e}");
    }
}
