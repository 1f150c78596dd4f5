//! A resharded pull under the prefill ranks' leases: a decode rank of one TP size reads its
//! heads from prefill ranks of another, each prefill rank's blocks protected by that rank's
//! lease. With more decode ranks than prefill ranks several decode ranks (several links) read
//! one lease; each declares how many do ([`crate::tp::readers`]), and the lease ends done once
//! every one of them said done.

use std::collections::HashSet;

use super::bound::Bound;
use super::leases::{check_grant_blocks, check_grant_cache};
use super::reshard::Moves;
use super::{Cache, LlmDataDist};
use crate::cache::{BlocksCacheKey, KvCacheExtParam};
use crate::lease::LeaseGrant;
use crate::status::{DataDistError, Result};
use crate::tokens::TokenMap;
use crate::tp::readers;

impl LlmDataDist {
    /// [`LlmDataDist::pull_kv_blocks_resharded`] under leases: `grants[i]` is the lease of the
    /// prefill rank whose blocks cache is `prefill[i]` (each prefill rank leases its own blocks
    /// with [`LlmDataDist::lease_blocks`], unchanged). The leases of the prefill ranks this
    /// decode rank reads are acquired before a byte moves, each declaring how many ranks of
    /// the decode group read that prefill rank; the heads move within the window
    /// (`llm.SyncKvCacheWaitTime`); each ticket is then released, with `done` when `done` was
    /// asked and the pull landed. A prefill rank's lease ends done once every decode rank that
    /// reads it released with `done`. Prefill ranks this rank does not read (replicas) are not
    /// acquired.
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID` for a grant count that is not the key count, a grant of another
    /// cluster than its key's, one that does not cover its key's cache or a source block, one
    /// lease given for two prefill ranks; `LLM_LEASE_ENDED` when an owner refuses an acquire
    /// (nothing moved; the tickets taken are released without done); otherwise as
    /// [`LlmDataDist::pull_kv_blocks_resharded`].
    #[allow(clippy::too_many_arguments)]
    pub async fn pull_leased_blocks_resharded(
        &self,
        grants: &[LeaseGrant],
        prefill: &[BlocksCacheKey],
        dst: &Cache,
        src_blocks: &[u64],
        dst_blocks: &[u64],
        ext: &KvCacheExtParam,
        done: bool,
    ) -> Result<()> {
        let moves = Moves::Blocks {
            src: src_blocks,
            dst: dst_blocks,
        };
        self.leased_resharded(grants, prefill, dst, moves, ext, done)
            .await
    }

    /// [`LlmDataDist::pull_kv_tokens`] under the prefill ranks' leases, as
    /// [`LlmDataDist::pull_leased_blocks_resharded`]: each grant covers every prefill block
    /// `map` names.
    ///
    /// # Errors
    /// As [`LlmDataDist::pull_leased_blocks_resharded`] and [`LlmDataDist::pull_kv_tokens`].
    pub async fn pull_leased_tokens(
        &self,
        grants: &[LeaseGrant],
        prefill: &[BlocksCacheKey],
        dst: &Cache,
        map: &TokenMap,
        ext: &KvCacheExtParam,
        done: bool,
    ) -> Result<()> {
        self.leased_resharded(grants, prefill, dst, Moves::Tokens(map), ext, done)
            .await
    }

    async fn leased_resharded(
        &self,
        grants: &[LeaseGrant],
        prefill: &[BlocksCacheKey],
        dst: &Cache,
        moves: Moves<'_>,
        ext: &KvCacheExtParam,
        done: bool,
    ) -> Result<()> {
        let window = self.inner()?.opts.sync_wait;
        let src_blocks = moves.src_blocks();
        if grants.len() != prefill.len() {
            return Err(DataDistError::param(format!(
                "{} lease grants for {} prefill caches: one grant per prefill rank's cache",
                grants.len(),
                prefill.len()
            )));
        }
        let mut leases = HashSet::with_capacity(grants.len());
        for (g, &key) in grants.iter().zip(prefill) {
            check_grant_blocks(g, key, &src_blocks)?;
            if !leases.insert((g.owner, g.lease_id)) {
                return Err(DataDistError::param(format!(
                    "lease {} of cluster {} is given for two prefill caches; each prefill rank \
                     leases its own blocks",
                    g.lease_id, g.owner
                )));
            }
        }
        let plan = self.plan_resharded(prefill, dst, moves, ext).await?;
        for ((g, &key), &(_, cache_id)) in grants.iter().zip(prefill).zip(&plan.keys) {
            check_grant_cache(g, key, cache_id)?;
        }
        let counts = readers(&plan.dshard, plan.prefill_tp)?;
        // The grants of the prefill ranks read, with the readers each lease has.
        let read: Vec<(&LeaseGrant, u32)> = plan
            .sources
            .iter()
            .filter_map(|&p| {
                let i = plan.keys.iter().position(|&(r, _)| r == p)?;
                Some((grants.get(i)?, counts.get(p as usize).copied()?))
            })
            .collect();
        let start = tokio::time::Instant::now();
        let acquired = futures::future::join_all(
            read.iter()
                .map(|&(g, n)| async move { (g, self.acquire_lease(g, n, window).await) }),
        )
        .await;
        let mut tickets = Vec::with_capacity(acquired.len());
        let mut refused = None;
        for (g, r) in acquired {
            match r {
                Ok(t) => tickets.push((g, t)),
                Err(e) => {
                    refused.get_or_insert(e);
                }
            }
        }
        let res = match refused {
            // Nothing moves when one lease is not held: the others are given back undone.
            Some(e) => Err(e),
            None => {
                // Every owner's window opened after `start`; past it each layer waits for
                // its parts in flight, so the releases go out when nothing reads the blocks.
                plan.run(Bound::leased(start, window)).await
            }
        };
        let ok = res.is_ok();
        for (g, t) in tickets {
            self.release_lease(g, t, done && ok, window).await;
        }
        res
    }
}
