//! LLM-DataDist over hixl: the KV-cache layer inference servers integrate. They speak in
//! caches, blocks and layers; this crate turns them into one-sided transfers.
//!
//! Wiring into an inference server: create an [`LlmDataDist`] at start and `initialize` it
//! with `llm.ListenIpInfo`; register (or allocate) the KV caches, under a [`BlocksCacheKey`]
//! for paged caches; on the first request that needs a peer cluster, `link_clusters`; per
//! request, `pull_kv_blocks` (decode) or `push_kv_blocks` (prefill), or
//! [`LlmDataDist::transfer_layerwise`] to move each layer as soon as it is computed;
//! `unlink_clusters` and `finalize` on shutdown.
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod cache;
mod datadist;
mod layerwise;
pub mod lease;
pub mod models;
pub mod options;
pub mod status;
pub mod table;
pub mod tokens;
pub mod tp;

pub use cache::{
    BlocksCacheKey, CacheDesc, CacheIndex, CacheKey, DataType, KvCacheExtParam, Placement,
};
pub use datadist::{Cache, ClusterInfo, LeaseEvents, LlmDataDist, LlmRole, MAX_CLUSTERS_PER_CALL};
pub use layerwise::{LayerTarget, LayerwiseReport};
pub use lease::{EndedLease, LeaseEnd, LeaseGrant};
pub use status::{BlockFailure, DataDistError, LlmStatus, Result};
pub use tp::{KvLayout, KvShard};
