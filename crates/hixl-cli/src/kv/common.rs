//! What `bench kv`'s parts share: the arguments of `bench kv` and `kv-serve`, the result
//! they print, the peer's cache keys, allocation and small helpers.

use hixl::datadist::models::ModelGeometry;
use hixl::datadist::{BlocksCacheKey, Cache, KvCacheExtParam, LlmDataDist, LlmRole};
use serde::Serialize;

use crate::util::{CliError, CliResult};

/// Arguments of `hixl kv-serve` (the peer cluster `bench kv` starts).
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Model whose caches to allocate.
    #[arg(long)]
    pub model: String,
    /// Blocks per cache.
    #[arg(long)]
    pub blocks: u64,
    /// `tcp`, `fabric` or `auto`.
    #[arg(long, default_value = "auto")]
    pub transport: String,
    /// Tokens per block (default: the model's).
    #[arg(long)]
    pub block_tokens: Option<u64>,
    /// Serve a prefill TP group of this many ranks (clusters `cluster_base + rank`, NHD caches
    /// holding each rank's heads) instead of one unsharded cluster.
    #[arg(long)]
    pub tp: Option<u32>,
    /// First cluster id of the TP group.
    #[arg(long, default_value_t = 10)]
    pub cluster_base: u64,
    /// Block layout of the TP group's caches: `nhd` or `hnd`.
    #[arg(long, default_value = "nhd")]
    pub layout: String,
}

/// Arguments of `hixl bench kv`.
#[derive(clap::Args, Debug)]
pub struct KvArgs {
    /// Model (from the shipped geometry table: llama-3.1-8b, deepseek-r1, ...).
    #[arg(long, default_value = "llama-3.1-8b")]
    pub model: String,
    /// Tokens of one request.
    #[arg(long, default_value_t = 4096)]
    pub tokens: u64,
    /// `tcp` or `fabric`.
    #[arg(long, default_value = "tcp")]
    pub transport: String,
    /// Push layer by layer, each as soon as its simulated compute is done.
    #[arg(long)]
    pub layerwise: bool,
    /// Simulated compute per layer, in ms (with --layerwise).
    #[arg(long, default_value_t = 2.0)]
    pub layer_ms: f64,
    /// Seconds to measure.
    #[arg(long, default_value_t = 2.0)]
    pub duration: f64,
    /// Tokens per block (default: the model's; 16 is vLLM's, 1 SGLang's page size).
    #[arg(long)]
    pub block_tokens: Option<u64>,
    /// Which peer blocks a request's blocks are: `contiguous` (0..n) or `every-other`
    /// (0, 2, 4, ...: runs that strided descriptors group, one per tensor).
    #[arg(long, default_value = "contiguous")]
    pub pattern: String,
    /// Prefill TP size: pull as decode rank 0 of `--decode-tp` from a prefill group of this
    /// size (heads resharded), alternating with a pull from a group of the decode's own TP size.
    #[arg(long, requires = "decode_tp")]
    pub prefill_tp: Option<u32>,
    /// Decode TP size (with `--prefill-tp`).
    #[arg(long, requires = "prefill_tp")]
    pub decode_tp: Option<u32>,
    /// The prefill group's tokens per block, with `--prefill-tp` (default: the decode's,
    /// `--block-tokens`): where they differ, each token is pulled to its place (converted),
    /// against the decode's own geometry pulled whole.
    #[arg(long, requires = "prefill_tp")]
    pub prefill_block_tokens: Option<u64>,
    /// Block layout with `--prefill-tp`: `nhd` (a head slice is a piece per token) or `hnd`
    /// (a piece per block).
    #[arg(long, default_value = "nhd")]
    pub layout: String,
    /// Also pull each request under a lease (granted by the peer, released with done) and
    /// report its cost: requests alternate between plain and leased pulls.
    #[arg(long)]
    pub leases: bool,
    /// One JSON object per case.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
pub(super) struct KvResult {
    pub(super) bench: &'static str,
    pub(super) model: String,
    pub(super) transport: String,
    pub(super) tokens: u64,
    pub(super) mode: &'static str,
    pub(super) bytes_per_request: u64,
    pub(super) block_tokens: u64,
    pub(super) blocks: u64,
    pub(super) pattern: String,
    /// Strided descriptors the KV layer posts per request.
    pub(super) descriptors_per_request: usize,
    /// The same request as plain descriptors (one per piece).
    pub(super) pieces_per_request: usize,
    /// The engine alone posting the plain pieces: GB/s and submit time per request.
    pub(super) engine_plain_gbps: Option<f64>,
    /// Why the plain pieces could not be posted, if they could not.
    pub(super) engine_plain_error: Option<String>,
    pub(super) submit_plain_us: Option<f64>,
    /// ... and the strided descriptors.
    pub(super) submit_strided_us: Option<f64>,
    pub(super) requests: u64,
    pub(super) gbps: f64,
    pub(super) p50_ms: f64,
    pub(super) engine_same_descs_gbps: Option<f64>,
    pub(super) ratio_to_engine: Option<f64>,
    pub(super) leased_gbps: Option<f64>,
    pub(super) leased_p50_ms: Option<f64>,
    pub(super) lease_ratio: Option<f64>,
    pub(super) compute_ms: Option<f64>,
    pub(super) transfer_ms: Option<f64>,
    pub(super) exposed_ms: Option<f64>,
    pub(super) hidden_fraction: Option<f64>,
}

/// The peer's cache `i` (cluster 1 is always the peer) and the layout of a whole-request move.
pub(super) fn peer_cache(i: usize, per_layer: u32) -> (BlocksCacheKey, KvCacheExtParam) {
    let key = BlocksCacheKey {
        cluster_id: 1,
        model_id: i as u64,
    };
    let ext = KvCacheExtParam {
        tensor_num_per_layer: per_layer,
        ..Default::default()
    };
    (key, ext)
}

pub(super) fn cli(e: impl std::fmt::Display) -> CliError {
    CliError(e.to_string())
}

pub(super) async fn allocate(
    dd: &LlmDataDist,
    m: &ModelGeometry,
    cluster: u64,
    blocks: u64,
    block_tokens: u64,
) -> CliResult<Vec<(Cache, u32)>> {
    let mut out = Vec::new();
    for (i, (desc, per_layer)) in m.caches(blocks, block_tokens).into_iter().enumerate() {
        let key = BlocksCacheKey {
            cluster_id: cluster,
            model_id: i as u64,
        };
        out.push((
            dd.allocate_kv_cache(desc, Some(key)).await.map_err(cli)?,
            per_layer,
        ));
    }
    Ok(out)
}

pub(super) fn layout(s: &str) -> CliResult<hixl::datadist::KvLayout> {
    match s {
        "nhd" => Ok(hixl::datadist::KvLayout::Nhd),
        "hnd" => Ok(hixl::datadist::KvLayout::Hnd),
        "hnd-kv" => Ok(hixl::datadist::KvLayout::HndKv),
        _ => Err(CliError(format!(
            "--layout must be nhd, hnd or hnd-kv, not {s:?}"
        ))),
    }
}

pub(super) fn p50(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The bench side's cluster (id 2) in `role`, over `transport`, with a long pull timeout.
pub(super) async fn bench_cluster(role: LlmRole, transport: &str) -> CliResult<LlmDataDist> {
    let mut dd = LlmDataDist::new(2, role);
    dd.initialize(&[
        ("llm.ListenIpInfo", "127.0.0.1:0"),
        ("hixl.Transport", transport),
        ("llm.SyncKvCacheWaitTime", "60000"),
    ])
    .await
    .map_err(cli)?;
    Ok(dd)
}
