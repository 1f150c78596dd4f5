//! TCP as a [`PeerChannel`]: the link's data connections, the fallback that reaches every
//! peer. The transport policy ([`crate::transport::select`]) puts it after the channel it
//! chose, so it takes every descriptor the others do not.
//!
//! A descriptor becomes parts of at most `hixl.TcpChunkBytes`. A link's ops use its first data
//! connection only, until an op of more than 1 MiB in several parts comes: from then on parts
//! are spread round-robin over all `hixl.TcpStreams` connections. Connections open when
//! their first part comes, so an idle link, or one that only moves small ops, holds one data
//! socket at most. Each connection sends parts straight from registered memory and completes
//! them as the answers come ([`super::initiator`]).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use hixl_core::wire::{DataReq, MAX_STRIDED_PIECES};
use hixl_core::{Error, OpDesc, Result, StridedDesc, Token, TransferOp};

use super::initiator::{fail_with, DataConn, DataOpener, Part, Pending};
use crate::context::{EngineConfig, OpsHandle};
use crate::keep::Keeps;
use crate::link_state::LinkState;
use crate::memory::RegionInner;
use crate::rawio::PartRange;
use crate::sink::Completions;
use crate::transport::{Batch, PeerChannel};

/// An op moving more than this in several parts spreads its link's parts over every data
/// connection from then on. Smaller ops stay on one: on a few cores, one connection served by
/// one spinning target task beats several that contend for the cores (4 KiB × 32 in one call:
/// about twice as fast).
const WIDE_BYTES: u64 = 1 << 20;

/// The TCP channel of one link: its data connections.
#[derive(Debug)]
pub(crate) struct TcpChannel {
    conns: Vec<DataConn>,
    /// Round-robin start of the next op's parts.
    next: AtomicUsize,
    /// Set by the first op of more than [`WIDE_BYTES`] in several parts: parts then spread
    /// over every connection.
    wide: AtomicBool,
    /// Largest single part (`hixl.TcpChunkBytes`).
    chunk: u64,
    /// Whether the peer takes strided requests (both ends announced
    /// `hixl_core::wire::feature::STRIDED`); without, each piece is a request of its own.
    strided: bool,
    peer: Arc<str>,
    state: Arc<LinkState>,
    /// Ops of this link withdrawn so far: the writers recheck an op only when it moved.
    withdrawals: Arc<AtomicU64>,
}

/// How a link's ops are cut into parts.
pub(crate) struct Split {
    /// Largest single part (`hixl.TcpChunkBytes`).
    pub(crate) chunk: u64,
    /// Whether the peer takes strided requests.
    pub(crate) strided: bool,
}

impl TcpChannel {
    /// The link's `streams` data connections, each opened by `open` when first used; with
    /// `hixl.TcpIo=uring` in `config`, each moves its bytes through an io_uring of its own.
    pub(crate) fn spawn(
        streams: usize,
        open: DataOpener,
        peer: Arc<str>,
        ops: OpsHandle,
        state: Arc<LinkState>,
        split: Split,
        config: &EngineConfig,
    ) -> TcpChannel {
        let uring = config.tcp_io == hixl_core::options::TcpIo::Uring;
        // Owners spin for their transfers when the engine's spin is on.
        let owners_spin = !config.spin.is_zero();
        let withdrawals = Arc::new(AtomicU64::new(0));
        let conns = (0..streams)
            .map(|_| {
                DataConn::spawn(
                    open.clone(),
                    peer.clone(),
                    ops.clone(),
                    state.clone(),
                    withdrawals.clone(),
                    uring,
                    owners_spin,
                )
            })
            .collect();
        TcpChannel {
            conns,
            next: AtomicUsize::new(0),
            wide: AtomicBool::new(false),
            chunk: split.chunk.max(1),
            strided: split.strided,
            peer,
            state,
            withdrawals,
        }
    }
}

impl PeerChannel for TcpChannel {
    fn batch(&self, token: Token, op: TransferOp) -> Box<dyn Batch + '_> {
        Box::new(TcpBatch::new(self, token, op))
    }

    fn with_batch(
        &self,
        token: Token,
        op: TransferOp,
        sink: &Completions,
        build: &mut dyn FnMut(&mut dyn Batch) -> Result<()>,
    ) -> Result<()> {
        let mut b = TcpBatch::new(self, token, op);
        build(&mut b)?;
        b.post_now(sink);
        Ok(())
    }

    /// Counted, and seen by the writers before their next part (`send_batch`): they skip the
    /// unsent parts of an op that is no longer wanted. Parts already sent are answered.
    fn withdraw(&self, _token: Token, _cause: &Error) {
        self.withdrawals.fetch_add(1, Ordering::Release);
        // The withdrawn op's parts already sent are still answered: nobody may spin for them
        // any more, so the readers must be watching.
        self.nudge();
    }

    /// Nothing to do here: the connections' tasks see the link's death themselves (the
    /// writers fail what they have not sent, the readers what awaits an answer).
    fn close(&self, _cause: &Error, _tokens: &HashSet<Token>) {}

    fn spinning(&self, on: bool) {
        for c in &self.conns {
            c.spinning(on);
        }
    }

    fn nudge(&self) {
        for c in &self.conns {
            c.nudge();
        }
    }

    /// Pumps every data connection once (see [`DataConn::progress`]).
    fn progress(&self) -> bool {
        let mut moved = false;
        for c in &self.conns {
            moved |= c.progress();
        }
        moved
    }
}

/// One call's TCP parts, per connection. Allocates only once a descriptor comes its way.
struct TcpBatch<'a> {
    ch: &'a TcpChannel,
    token: Token,
    write: bool,
    per: Vec<Vec<Pending>>,
    /// The connection of the next part.
    k: usize,
    /// Bytes so far.
    bytes: u64,
    /// The channel's withdrawal count before the op could be abandoned.
    withdrawals: u64,
    /// Descriptors the call has ([`Batch::expect`]).
    hint: usize,
}

impl<'a> TcpBatch<'a> {
    fn new(ch: &'a TcpChannel, token: Token, op: TransferOp) -> TcpBatch<'a> {
        TcpBatch {
            ch,
            token,
            write: op == TransferOp::Write,
            per: Vec::new(),
            k: 0,
            bytes: 0,
            withdrawals: ch.withdrawals.load(Ordering::Acquire),
            hint: 0,
        }
    }

    /// The link's data connections, with a part list for each once the batch takes its first
    /// descriptor; `None` without connections.
    fn start(&mut self) -> Option<usize> {
        let n = self.ch.conns.len();
        if n == 0 {
            return None;
        }
        if self.per.is_empty() {
            // While the channel is narrow every part goes to the first connection.
            let first = self.hint;
            self.per = (0..n)
                .map(|i| Vec::with_capacity(if i == 0 { first } else { 0 }))
                .collect();
            self.k = if self.ch.wide.load(Ordering::Relaxed) {
                self.ch.next.fetch_add(1, Ordering::Relaxed)
            } else {
                0
            };
        }
        Some(n)
    }

    /// The connection of the next part, of `bytes` bytes: the first while the channel is
    /// narrow, then round robin (the channel widens past `WIDE_BYTES` in one batch).
    fn place(&mut self, n: usize, bytes: u64) -> usize {
        let wide = self.ch.wide.load(Ordering::Relaxed);
        if self.bytes >= WIDE_BYTES && !wide {
            self.ch.wide.store(true, Ordering::Relaxed);
        }
        self.bytes += bytes;
        let conn = if wide { self.k % n } else { 0 };
        self.k = self.k.wrapping_add(1);
        conn
    }

    /// [`Batch::post`] without the box: hands each connection its parts; those of a dead
    /// connection fail with the link's cause.
    fn post_now(self, sink: &Completions) {
        for (conn, parts) in self.ch.conns.iter().zip(self.per) {
            if parts.is_empty() {
                continue;
            }
            if let Err(parts) = conn.submit(parts) {
                let e = self.ch.state.error().unwrap_or_else(|| Error::PeerLost {
                    peer: self.ch.peer.to_string(),
                    cause: "data connection closed".into(),
                });
                fail_with(sink, parts.into_iter().map(|p| p.part), &e);
            }
        }
    }
}

impl Batch for TcpBatch<'_> {
    fn expect(&mut self, descs: usize) {
        self.hint = descs.min(1 << 16);
    }

    /// Reaches every descriptor (the link has at least one data connection).
    fn add(
        &mut self,
        _index: usize,
        d: &OpDesc,
        _local: &Arc<RegionInner>,
        rkey: u64,
        _keep: &mut Keeps,
    ) -> Result<Option<u32>> {
        let Some(n) = self.start() else {
            return Ok(None);
        };
        let parts = u32::try_from(d.len.div_ceil(self.ch.chunk))
            .map_err(|_| crate::transport::too_many_parts())?;
        let mut off = 0;
        while off < d.len {
            let len = self.ch.chunk.min(d.len - off);
            let conn = self.place(n, len);
            self.per[conn].push(Pending::new(
                Part {
                    token: self.token,
                    write: self.write,
                    local: PartRange::new(d.local_addr + off, len),
                    req: DataReq {
                        id: self.token.0,
                        rkey,
                        addr: d.remote_addr + off,
                        len,
                    },
                    strided: None,
                },
                self.withdrawals,
            ));
            off += len;
        }
        Ok(Some(parts))
    }

    /// A strided descriptor of small pieces goes as strided requests, each of whole pieces
    /// (at most [`MAX_STRIDED_PIECES`] and about `hixl.TcpChunkBytes`): one request frame and
    /// one answer for many pieces. Pieces of half a chunk or more gain nothing from it and go
    /// as plain parts, as every piece does to a peer that does not take strided requests.
    fn add_strided(
        &mut self,
        index: usize,
        d: &StridedDesc,
        local: &Arc<RegionInner>,
        rkey: u64,
        keep: &mut Keeps,
    ) -> Result<Option<u32>> {
        if !self.ch.strided || d.count == 1 || d.len.saturating_mul(2) > self.ch.chunk {
            // The default: each piece as a plain descriptor.
            return crate::transport::add_pieces(self, index, d, local, rkey, keep);
        }
        let Some(n) = self.start() else {
            return Ok(None);
        };
        // `submit` refuses zero-length pieces; `max(1)` keeps the division total regardless.
        let per_part = (self.ch.chunk / d.len.max(1)).clamp(1, MAX_STRIDED_PIECES);
        let parts = u32::try_from(d.count.div_ceil(per_part))
            .map_err(|_| crate::transport::too_many_parts())?;
        let mut first = 0;
        while first < d.count {
            let count = per_part.min(d.count - first);
            let bytes = count * d.len;
            let conn = self.place(n, bytes);
            self.per[conn].push(Pending::new(
                Part {
                    token: self.token,
                    write: self.write,
                    local: PartRange::strided(
                        d.local_addr + first * d.local_stride,
                        d.len,
                        d.local_stride,
                        count,
                    ),
                    req: DataReq {
                        id: self.token.0,
                        rkey,
                        addr: d.remote_addr + first * d.remote_stride,
                        len: bytes,
                    },
                    strided: Some((d.len, d.remote_stride, count)),
                },
                self.withdrawals,
            ));
            first += count;
        }
        Ok(Some(parts))
    }

    fn post(self: Box<Self>, sink: &Completions) {
        (*self).post_now(sink);
    }
}
