//! Submitting a transfer: checking descriptors against the peer's table and the local
//! regions, and posting the parts to the transports' channels or the data connections.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use hixl_core::wire::DataReq;
use hixl_core::{Access, Error, OpDesc, RemoteRegion, Result, Token, TransferOp};

use super::{poisoned, Link};
use crate::context::Shared;
use crate::memory::Lease;
use crate::tcp::initiator::{fail_parts, Part};

impl Link {
    fn remote_rkey(
        table: &[RemoteRegion],
        peer: &str,
        index: usize,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<u64> {
        hixl_core::region::check_range(hixl_core::Side::Remote, index, addr, len)?;
        let i = table.partition_point(|r| r.addr <= addr);
        let r = i
            .checked_sub(1)
            .and_then(|i| table.get(i))
            .filter(|r| r.contains(addr, len))
            .ok_or_else(|| Error::RemoteOutOfBounds {
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
        Ok(r.rkey)
    }

    /// Validates every descriptor, splits them into parts and posts them on the data
    /// connections. Nothing is sent unless every descriptor is valid.
    pub(crate) fn submit(
        &self,
        shared: &Arc<Shared>,
        op: TransferOp,
        descs: &[OpDesc],
    ) -> Result<Token> {
        if let Some(e) = self.state.error() {
            return Err(e);
        }
        if descs.is_empty() {
            return Err(Error::InvalidParam {
                what: "a transfer needs at least one descriptor".into(),
            });
        }
        let write = op == TransferOp::Write;
        let need = Access::needed_by(op);
        let n = self.conns.len();
        let mut per: Vec<Vec<Part>> = (0..n).map(|_| Vec::new()).collect();
        let mut k = self.next.fetch_add(1, Ordering::Relaxed);
        let token = shared.ops.lock().map_err(|_| poisoned())?.insert();
        // Links have one channel or none: the first batch is kept apart, so that a call
        // allocates no vector for them (an empty `rest` does not allocate).
        let mut channels = self.channels.iter().map(|c| c.batch(token, op));
        let mut first = channels.next();
        let mut rest: Vec<_> = channels.collect();
        let built = (|| -> Result<u32> {
            let table = self.table.read().map_err(|_| poisoned())?;
            let regions = shared.regions.lock().map_err(|_| poisoned())?;
            let mut parts = 0u32;
            let mut count = |n: u32| -> Result<()> {
                parts = parts
                    .checked_add(n)
                    .ok_or_else(|| Error::ResourceExhausted {
                        what: "more than 2^32 parts in one transfer".into(),
                    })?;
                Ok(())
            };
            'descs: for (i, d) in descs.iter().enumerate() {
                let local = regions.lookup_local(i, d.local_addr, d.len)?;
                let rkey = Self::remote_rkey(&table, &self.name, i, d.remote_addr, d.len, need)?;
                for b in first.iter_mut().chain(rest.iter_mut()) {
                    if let Some(n) = b.add(i, d, &local.data, rkey)? {
                        count(n)?;
                        continue 'descs;
                    }
                }
                let mut off = 0;
                while off < d.len {
                    let len = self.chunk.min(d.len - off);
                    per[k % n].push(Part {
                        token,
                        write,
                        local: d.local_addr + off,
                        req: DataReq {
                            id: token.0,
                            rkey,
                            addr: d.remote_addr + off,
                            len,
                        },
                        lease: Lease::new(&local.data),
                    });
                    k += 1;
                    off += len;
                    count(1)?;
                }
            }
            Ok(parts)
        })();
        let mut ops = shared.ops.lock().map_err(|_| poisoned())?;
        let parts = match built {
            Ok(p) => p,
            Err(e) => {
                ops.abandon(token);
                return Err(e);
            }
        };
        ops.post(token, parts).map_err(|e| Error::InvalidParam {
            what: e.to_string(),
        })?;
        drop(ops);
        self.touch();
        if let Ok(mut t) = self.ops.lock() {
            t.record(token, &shared.ops);
        }
        for b in first.into_iter().chain(rest) {
            b.post(&shared.sink);
        }
        for (i, batch) in per.into_iter().enumerate() {
            if batch.is_empty() {
                continue;
            }
            if let Err(batch) = self.conns[i].submit(batch) {
                let e = self.state.error().unwrap_or_else(|| Error::PeerLost {
                    peer: self.name.to_string(),
                    cause: "data connection closed".into(),
                });
                fail_parts(shared, batch, &e);
            }
        }
        Ok(token)
    }
}
