//! Submitting a transfer: checking descriptors against the peer's table and the local
//! regions, and posting them to the link's channels (every descriptor goes to a channel).

use std::sync::Arc;

use hixl_core::{Access, Error, OpDesc, RemoteRegion, Result, StridedDesc, Token, TransferOp};

use super::Link;
use crate::keep::Keeps;
use crate::memory::RegionInner;
use crate::sync::{lock, read};
use crate::transport::Batch;

/// A descriptor `submit` takes: plain or strided. It is checked once by its spans.
pub(crate) trait Desc {
    /// `(addr, len)` of what it touches locally and at the peer.
    fn spans(&self, index: usize) -> Result<((u64, u64), (u64, u64))>;

    /// The bytes it moves (for telemetry; saturating).
    fn bytes(&self) -> u64;

    /// Hands it to a channel's batch.
    fn add_to(
        &self,
        b: &mut dyn Batch,
        index: usize,
        local: &Arc<RegionInner>,
        rkey: u64,
        keep: &mut Keeps,
    ) -> Result<Option<u32>>;
}

impl Desc for OpDesc {
    fn spans(&self, _index: usize) -> Result<((u64, u64), (u64, u64))> {
        Ok(((self.local_addr, self.len), (self.remote_addr, self.len)))
    }

    fn bytes(&self) -> u64 {
        self.len
    }

    fn add_to(
        &self,
        b: &mut dyn Batch,
        index: usize,
        local: &Arc<RegionInner>,
        rkey: u64,
        keep: &mut Keeps,
    ) -> Result<Option<u32>> {
        b.add(index, self, local, rkey, keep)
    }
}

impl Desc for StridedDesc {
    fn spans(&self, index: usize) -> Result<((u64, u64), (u64, u64))> {
        StridedDesc::spans(self, index)
    }

    fn bytes(&self) -> u64 {
        self.len.saturating_mul(self.count)
    }

    fn add_to(
        &self,
        b: &mut dyn Batch,
        index: usize,
        local: &Arc<RegionInner>,
        rkey: u64,
        keep: &mut Keeps,
    ) -> Result<Option<u32>> {
        // Checked by its spans already: merging back-to-back pieces cannot overflow.
        b.add_strided(index, &self.merged(), local, rkey, keep)
    }
}

impl Link {
    fn remote_region<'t>(
        table: &'t [RemoteRegion],
        peer: &str,
        index: usize,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<&'t RemoteRegion> {
        hixl_core::region::check_range(hixl_core::Side::Remote, index, addr, len)?;
        let r = super::holding(table, addr, len).ok_or_else(|| Error::RemoteOutOfBounds {
            peer: peer.to_string(),
            addr,
            len,
            index,
        })?;
        if !r.access.contains(need) {
            return Err(Error::AccessDenied {
                addr,
                len,
                need: need.describe(),
            });
        }
        Ok(r)
    }

    /// Validates every descriptor and routes each to the first of the link's channels that
    /// reaches it (TCP, last, reaches all), then posts the op and the channels' batches.
    /// Nothing is sent unless every descriptor is valid.
    pub(crate) fn submit<D: Desc>(&self, op: TransferOp, descs: &[D]) -> Result<Token> {
        if let Some(e) = self.state.error() {
            return Err(e);
        }
        if descs.is_empty() {
            return Err(Error::NoDescriptors);
        }
        let need = Access::needed_by(op);
        let token = lock(&self.ops.table).insert();
        // The op's keep-alive, handed to its op-table entry when it is posted.
        let mut keeps = Keeps::default();
        // Validates and routes every descriptor, then posts the op in the op table.
        let mut stage = |batches: &mut [&mut (dyn Batch + '_)]| -> Result<()> {
            let built = (|| -> Result<u32> {
                let table = read(&self.table);
                let regions = lock(&self.regions);
                let mut parts = 0u32;
                // A call's descriptors mostly fall in the region of the one before (a KV
                // cache's blocks): that region is tried first, on both sides, before a lookup.
                let mut last_local: Option<&hixl_core::RegionEntry<Arc<RegionInner>>> = None;
                let mut last_remote: Option<&RemoteRegion> = None;
                for b in batches.iter_mut() {
                    b.expect(descs.len());
                }
                'descs: for (i, d) in descs.iter().enumerate() {
                    let ((la, ll), (ra, rl)) = d.spans(i)?;
                    let local = match last_local {
                        Some(e) if ll > 0 && e.contains(la, ll) => e,
                        _ => {
                            let e = regions.lookup_local(i, la, ll)?;
                            keeps.region(&e.data);
                            last_local = Some(e);
                            e
                        }
                    };
                    let rkey = match last_remote {
                        Some(r) if rl > 0 && r.contains(ra, rl) => r.rkey,
                        _ => {
                            let r = Self::remote_region(&table, &self.name, i, ra, rl, need)?;
                            last_remote = Some(r);
                            r.rkey
                        }
                    };
                    for b in batches.iter_mut() {
                        if let Some(n) = d.add_to(&mut **b, i, &local.data, rkey, &mut keeps)? {
                            parts = parts
                                .checked_add(n)
                                .ok_or_else(crate::transport::too_many_parts)?;
                            continue 'descs;
                        }
                    }
                    return Err(Error::Internal {
                        what: "no channel of the link reaches a descriptor",
                    });
                }
                Ok(parts)
            })();
            let mut ops = lock(&self.ops.table);
            let parts = match built {
                Ok(p) => p,
                Err(e) => {
                    ops.abandon(token);
                    return Err(e);
                }
            };
            // From here until its last part is done, the op table keeps the op's memory valid.
            let mut reaped = Vec::new();
            let posted = ops.post(token, parts, keeps.drain(), &mut reaped);
            drop(ops);
            drop(reaped);
            if let Err(e) = posted {
                tracing::error!(peer = %self.name, "posting a staged op: {e}");
                return Err(Error::Internal {
                    what: "the op table refused to post a staged op",
                });
            }
            self.touch();
            lock(&self.tokens).record(token, &self.ops.table);
            self.working();
            Ok(())
        };
        // The channels' batches are posted once the op is. A link has its chosen channel and
        // TCP's: both keep their batches on their own stacks (no allocation per call for the
        // batches); more would be boxed.
        let sink = &self.ops.sink;
        match self.channels.as_slice() {
            [] => stage(&mut [])?,
            [one] => one.with_batch(token, op, sink, &mut |b| stage(&mut [b]))?,
            [first, last] => first.with_batch(token, op, sink, &mut |a| {
                last.with_batch(token, op, sink, &mut |b| stage(&mut [&mut *a, b]))
            })?,
            many => {
                let mut boxes: Vec<_> = many.iter().map(|c| c.batch(token, op)).collect();
                let mut refs: Vec<&mut (dyn Batch + '_)> =
                    boxes.iter_mut().map(|b| &mut **b).collect();
                stage(&mut refs)?;
                drop(refs);
                for b in boxes {
                    b.post(sink);
                }
            }
        }
        Ok(token)
    }
}
