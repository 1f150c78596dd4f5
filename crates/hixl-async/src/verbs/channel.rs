//! Verbs as a [`PeerChannel`]: one-sided RDMA WRITE/READ on the link's RC queue pair, for
//! descriptors whose local region is registered with the device and whose peer region has a
//! device key.

use std::collections::HashSet;
use std::sync::Arc;

use hixl_core::wire::Message;
use hixl_core::{Error, OpDesc, RemoteRegion, Result, Token, TransferOp};
use hixl_verbs::{LocalRange, RemoteRange, WorkRequest};

use super::VerbsLink;
use crate::keep::Keeps;
use crate::memory::RegionInner;
use crate::sink::Completions;
use crate::transport::{Batch, PeerChannel};

/// The verbs channel of one link.
#[derive(Debug)]
pub(crate) struct VerbsChannel {
    pub(crate) link: Arc<VerbsLink>,
}

impl PeerChannel for VerbsChannel {
    fn batch(&self, token: Token, op: TransferOp) -> Box<dyn Batch + '_> {
        Box::new(VerbsBatch {
            link: &self.link,
            token,
            op,
            wrs: Vec::new(),
        })
    }

    fn on_control(&self, m: &Message) -> bool {
        match m {
            Message::VerbsKeys(v) => {
                self.link.update_keys(v);
                true
            }
            _ => false,
        }
    }

    fn on_table(&self, table: &[RemoteRegion]) {
        self.link.prune_keys(table);
    }

    fn withdraw(&self, token: Token, cause: &Error) {
        self.link.withdraw(token, cause);
    }

    fn close(&self, _cause: &Error, _tokens: &HashSet<Token>) {
        // Flushes the QP (its requests complete with errors) and fails the backlog with the
        // link's cause.
        self.link.close();
    }
}

struct VerbsBatch<'a> {
    link: &'a VerbsLink,
    token: Token,
    op: TransferOp,
    wrs: Vec<WorkRequest>,
}

impl Batch for VerbsBatch<'_> {
    fn add(
        &mut self,
        _index: usize,
        d: &OpDesc,
        local: &Arc<RegionInner>,
        rkey: u64,
        _keep: &mut Keeps,
    ) -> Result<Option<u32>> {
        let (Some(lkey), Some(dev)) = (local.lkey, self.link.key(rkey)) else {
            return Ok(None);
        };
        self.wrs.push(WorkRequest {
            token: self.token,
            op: self.op,
            local: LocalRange {
                addr: d.local_addr,
                len: d.len,
                lkey,
            },
            remote: RemoteRange {
                addr: d.remote_addr,
                rkey: dev,
            },
        });
        Ok(Some(1))
    }

    fn post(self: Box<Self>, _sink: &Completions) {
        // The link completes (or fails) every request through the engine's completions.
        self.link.submit(self.token, self.wrs);
    }
}
