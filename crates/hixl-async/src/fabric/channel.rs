//! The fabric as a [`PeerChannel`]: copies between this process and a same-host peer's memory,
//! through the peer's mapped memfds or cross-memory attach, on the copy engine's streams (or
//! inline on the submitting thread for small calls).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use hixl_core::wire::Message;
use hixl_core::{Error, OpDesc, Result, StridedDesc, Token, TransferOp};
use hixl_fabric::{CopyKind, CopyOp};

use super::client::{FabricLink, FabricStream, Reach};
use super::FabricBackend;
use crate::completion::Completion;
use crate::keep::Keeps;
use crate::memory::RegionInner;
use crate::sink::Completions;
use crate::transport::{Batch, LinkHooks, PeerChannel};

/// Fabric copies of one call up to this many bytes (and copies) run on the submitting thread:
/// cheaper than waking a copy stream and, through the reactor, the caller again. Measured with
/// `hixl bench comm --transport fabric` (2 vCPU): inline, 1 MiB batch 1 runs at 25–33 GB/s
/// against 7–8 on a stream, 4 KiB × 32 at 7–16 GB/s against 1.6, 64 KiB × 32 at 16–23 against
/// 10–12; past a few MiB a call is bound by DRAM either way and the streams (which overlap
/// calls and use every core) are level or ahead (16 MiB: 9–10 GB/s on streams, 6–8 inline).
const INLINE_BYTES: u64 = 4 << 20;
const INLINE_OPS: usize = 64;

/// The fabric channel of one link.
#[derive(Debug)]
pub(crate) struct FabricChannel {
    pub(crate) link: Arc<FabricLink>,
    backend: Arc<FabricBackend>,
    /// Largest single copy (`hixl.TcpChunkBytes`, shared with TCP's parts).
    chunk: u64,
    peer: Arc<str>,
    /// The channel's socket until [`PeerChannel::start`] hands it to its tasks.
    stream: Mutex<Option<FabricStream>>,
}

impl FabricChannel {
    pub(crate) fn new(
        link: Arc<FabricLink>,
        backend: Arc<FabricBackend>,
        chunk: u64,
        peer: Arc<str>,
        stream: FabricStream,
    ) -> FabricChannel {
        FabricChannel {
            link,
            backend,
            chunk,
            peer,
            stream: Mutex::new(Some(stream)),
        }
    }
}

impl PeerChannel for FabricChannel {
    /// Starts the channel's writer (notifies, revoke acks) and reader (table updates,
    /// revocations, notify acks); a failed channel kills the link.
    fn start(&self, hooks: LinkHooks) {
        let Some(fs) = crate::sync::lock(&self.stream).take() else {
            return;
        };
        let LinkHooks { state, on_ack, .. } = hooks;
        let writer = super::client::writer(fs.stream.clone(), fs.rx, self.peer.clone());
        let dead = state.clone();
        state.spawn(async move {
            tokio::select! {
                _ = writer => {}
                _ = dead.dead() => {}
            }
        });
        let f = self.link.clone();
        let st = state.clone();
        st.spawn(async move {
            let e = tokio::select! {
                e = super::client::reader(fs.stream, fs.buf, fs.fds, f, &state, on_ack) => e,
                _ = state.dead() => return,
            };
            state.kill(e);
        });
    }

    fn batch(&self, token: Token, op: TransferOp) -> Box<dyn Batch + '_> {
        Box::new(FabricBatch::new(self, token, op))
    }

    fn with_batch(
        &self,
        token: Token,
        op: TransferOp,
        sink: &Completions,
        build: &mut dyn FnMut(&mut dyn Batch) -> Result<()>,
    ) -> Result<()> {
        let mut b = FabricBatch::new(self, token, op);
        build(&mut b)?;
        b.post_now(sink);
        Ok(())
    }

    fn send_notify(&self, m: Message) -> Option<bool> {
        Some(self.link.send(m))
    }

    fn carries_notifies(&self) -> bool {
        true
    }

    fn withdraw(&self, token: Token, cause: &Error) {
        if self.backend.copy.queued() > 0 {
            self.backend.copy.cancel_queued(|t| t == token, cause);
        }
    }

    fn close(&self, cause: &Error, tokens: &HashSet<Token>) {
        // Like HIXL's FabricMem disconnect: copies not yet started are aborted with the link's
        // cause; running ones finish (they only touch mapped or leased memory).
        self.backend
            .copy
            .cancel_queued(|t| tokens.contains(&t), cause);
    }
}

struct FabricBatch<'a> {
    ch: &'a FabricChannel,
    token: Token,
    write: bool,
    copies: Vec<CopyOp>,
    /// The peer region of the last descriptor (most of a call's go to one region): its rkey
    /// and how it is reached, kept for the op already.
    last: Option<(u64, super::client::Entry)>,
}

impl Batch for FabricBatch<'_> {
    fn expect(&mut self, descs: usize) {
        // Most calls' descriptors all go to the fabric, one copy each (up to a chunk).
        self.copies.reserve(descs.min(1 << 16));
    }

    fn add(
        &mut self,
        index: usize,
        d: &OpDesc,
        _local: &Arc<RegionInner>,
        rkey: u64,
        keep: &mut Keeps,
    ) -> Result<Option<u32>> {
        if !matches!(&self.last, Some((k, _)) if *k == rkey) {
            let Some(e) = self.ch.link.entry(rkey) else {
                return Ok(None);
            };
            // The op table keeps the peer region reached (mapped) until the op's last copy is
            // done; its last holder unmaps it and lets a revocation of it finish.
            keep.peer(&e.reach);
            self.last = Some((rkey, e));
        }
        let Some((_, e)) = &self.last else {
            return Ok(None);
        };
        let pid = self.ch.link.pid;
        let mut n = 0;
        let mut off = 0;
        while off < d.len {
            let len = self.ch.chunk.min(d.len - off);
            let (l, r) = (d.local_addr + off, d.remote_addr + off);
            let kind = match &e.reach.reach {
                Reach::Mapped(m) => {
                    let mapped =
                        m.translate(r, e.base, len)
                            .ok_or_else(|| Error::RemoteOutOfBounds {
                                peer: self.ch.peer.to_string(),
                                addr: r,
                                len,
                                index,
                            })?;
                    if self.write {
                        CopyKind::Memcpy {
                            src: l,
                            dst: mapped,
                            len,
                        }
                    } else {
                        CopyKind::Memcpy {
                            src: mapped,
                            dst: l,
                            len,
                        }
                    }
                }
                Reach::Cma if self.write => CopyKind::CmaWrite {
                    pid,
                    local: l,
                    remote: r,
                    len,
                },
                Reach::Cma => CopyKind::CmaRead {
                    pid,
                    local: l,
                    remote: r,
                    len,
                },
            };
            self.copies.push(CopyOp {
                token: self.token,
                kind,
                keep: None,
            });
            n += 1;
            off += len;
        }
        Ok(Some(n))
    }

    fn add_strided(
        &mut self,
        index: usize,
        d: &StridedDesc,
        local: &Arc<RegionInner>,
        rkey: u64,
        keep: &mut Keeps,
    ) -> Result<Option<u32>> {
        if d.count == 1 || d.len >= self.ch.chunk {
            // Pieces of a chunk or more: each is split over the streams as a plain copy.
            return crate::transport::add_pieces(self, index, d, local, rkey, keep);
        }
        let Some(e) = self.ch.link.entry(rkey) else {
            return Ok(None);
        };
        keep.peer(&e.reach);
        let ((_, _), (remote, span)) = d.spans(index)?;
        let kind = match &e.reach.reach {
            Reach::Mapped(m) => {
                let mapped =
                    m.translate(remote, e.base, span)
                        .ok_or_else(|| Error::RemoteOutOfBounds {
                            peer: self.ch.peer.to_string(),
                            addr: remote,
                            len: span,
                            index,
                        })?;
                let (src, dst, src_stride, dst_stride) = if self.write {
                    (d.local_addr, mapped, d.local_stride, d.remote_stride)
                } else {
                    (mapped, d.local_addr, d.remote_stride, d.local_stride)
                };
                CopyKind::StridedMemcpy {
                    src,
                    dst,
                    len: d.len,
                    src_stride,
                    dst_stride,
                    count: d.count,
                }
            }
            Reach::Cma => CopyKind::StridedCma {
                pid: self.ch.link.pid,
                local: d.local_addr,
                remote: d.remote_addr,
                len: d.len,
                local_stride: d.local_stride,
                remote_stride: d.remote_stride,
                count: d.count,
                write: self.write,
            },
        };
        // One op, split into parts of whole pieces of about the channel's chunk, so that the
        // streams share a large one.
        let parts = kind.split(self.ch.chunk);
        let n = u32::try_from(parts.len()).map_err(|_| crate::transport::too_many_parts())?;
        self.copies.extend(parts.into_iter().map(|kind| CopyOp {
            token: self.token,
            kind,
            keep: None,
        }));
        Ok(Some(n))
    }

    fn post(self: Box<Self>, sink: &Completions) {
        (*self).post_now(sink);
    }
}

impl<'a> FabricBatch<'a> {
    fn new(ch: &'a FabricChannel, token: Token, op: TransferOp) -> FabricBatch<'a> {
        FabricBatch {
            ch,
            token,
            write: op == TransferOp::Write,
            copies: Vec::new(),
            last: None,
        }
    }

    /// [`Batch::post`] without the box.
    fn post_now(self, sink: &Completions) {
        let copies = self.copies;
        if copies.is_empty() {
            return;
        }
        let copy = &self.ch.backend.copy;
        let small = copies.len() <= INLINE_OPS
            && copies.iter().map(|c| c.kind.len()).sum::<u64>() <= INLINE_BYTES;
        let submitted = if small {
            // SAFETY: as below (the op is posted, so the op table holds its keep-alive); the
            // copies run before this call returns, and complete after it.
            let done = unsafe { copy.run_inline(copies) };
            sink.complete_all(
                done.into_iter()
                    .map(|(token, result)| Completion { token, result }),
            );
            Ok(())
        } else {
            // SAFETY: every copy's local range lies in a registered region and its remote
            // range in a mapping (or, for CMA, a region the peer exported); the op table holds
            // the op's lease on the local region and its reach of the peer region until the
            // copy has run and completed (`rawio::PartRange` states the invariant).
            unsafe { copy.submit(copies) }
        };
        if let Err((e, failed)) = submitted {
            sink.fail(failed.into_iter().map(|c| c.token), &e);
        }
    }
}
