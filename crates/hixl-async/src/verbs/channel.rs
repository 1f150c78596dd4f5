//! Verbs as a [`PeerChannel`]: one-sided RDMA WRITE/READ striped over the link's rails, for
//! descriptors whose local region is registered with our devices and whose peer region has
//! device keys.

use std::collections::HashSet;
use std::sync::Arc;

use hixl_core::wire::Message;
use hixl_core::{Error, OpDesc, RemoteRegion, Result, Token, TransferOp};

use super::link::{Piece, VerbsLink};
use super::stripe;
use crate::keep::Keeps;
use crate::memory::RegionInner;
use crate::sink::Completions;
use crate::sync::lock;
use crate::transport::{Batch, LinkHooks, PeerChannel};

/// The verbs channel of one link.
#[derive(Debug)]
pub(crate) struct VerbsChannel {
    pub(crate) link: Arc<VerbsLink>,
}

impl PeerChannel for VerbsChannel {
    fn start(&self, hooks: LinkHooks) {
        *lock(&self.link.control) = Some(hooks.control);
        super::keeper::spawn(&self.link);
    }

    fn batch(&self, token: Token, op: TransferOp) -> Box<dyn Batch + '_> {
        Box::new(VerbsBatch {
            link: &self.link,
            token,
            op,
            pieces: Vec::new(),
        })
    }

    fn on_control(&self, m: &Message) -> bool {
        match m {
            Message::VerbsKeys(v) => {
                self.link.update_keys(v);
                true
            }
            Message::VerbsAccept { rail, .. } => {
                // A probe's answer (the keeper waits for it); one nobody waits for any more
                // (the probe timed out) is dropped, and its queue pairs with the next ask.
                if let Some(tx) = lock(&self.link.answers).remove(rail) {
                    let _ = tx.send(m.clone());
                }
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

    fn rails(&self) -> Vec<crate::RailInfo> {
        self.link.rails_info()
    }

    fn close(&self, _cause: &Error, _tokens: &HashSet<Token>) {
        // Flushes every rail's queue pairs (their requests complete with errors) and fails
        // the queued slices with the link's cause.
        self.link.close();
    }
}

struct VerbsBatch<'a> {
    link: &'a VerbsLink,
    token: Token,
    op: TransferOp,
    pieces: Vec<Piece>,
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
        let (Some(lkeys), Some(rkeys)) = (&local.lkeys, self.link.key(rkey)) else {
            return Ok(None);
        };
        self.pieces.push(Piece {
            local: d.local_addr,
            remote: d.remote_addr,
            len: d.len,
            lkeys: lkeys.clone(),
            rkeys,
            numa: local.numa,
        });
        let n = stripe::count(d.len, self.link.backend.slice_bytes);
        Ok(Some(u32::try_from(n).unwrap_or(u32::MAX)))
    }

    fn post(self: Box<Self>, _sink: &Completions) {
        // The link completes (or fails) every slice through the engine's completions.
        self.link.submit(self.token, self.op, self.pieces);
    }
}
