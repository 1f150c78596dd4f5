//! KV-cache geometry as in LLM-DataDist: descriptors, keys, layer ranges, block → address
//! mapping and the coalescing of block lists into contiguous runs.

use std::ops::Range;

use hixl_core::{OpDesc, StridedDesc};
use serde::{Deserialize, Serialize};

use crate::status::{DataDistError, Result};

/// At most this many tensor addresses per registration (LLM-DataDist's limit).
pub const MAX_ADDRS: usize = 240;

/// Element type of a cache tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DataType {
    /// 16-bit float.
    Float16,
    /// bfloat16.
    BFloat16,
    /// 32-bit float.
    Float32,
    /// 8-bit signed integer.
    Int8,
    /// 8-bit unsigned integer.
    UInt8,
    /// 16-bit signed integer.
    Int16,
    /// 32-bit signed integer.
    Int32,
    /// 64-bit signed integer.
    Int64,
}

impl DataType {
    /// Bytes per element.
    pub const fn size(self) -> u64 {
        match self {
            DataType::Int8 | DataType::UInt8 => 1,
            DataType::Float16 | DataType::BFloat16 | DataType::Int16 => 2,
            DataType::Float32 | DataType::Int32 => 4,
            DataType::Int64 => 8,
        }
    }
}

/// Where a cache lives (LLM-DataDist `CachePlacement`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Placement {
    /// Host memory.
    Host,
    /// Device memory (needs a device runtime; not in this build).
    Device,
}

/// Shape and type of a cache's tensors (LLM-DataDist `CacheDesc`). `shape[0]` is the number
/// of blocks (blocks cache) or the batch size (contiguous cache).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CacheDesc {
    /// Host or device.
    pub placement: Placement,
    /// Tensors in the cache (K,V,K,V… for `tensor_num_per_layer = 2`).
    pub num_tensors: u32,
    /// Element type.
    pub data_type: DataType,
    /// Shape of each tensor.
    pub shape: Vec<i64>,
}

impl CacheDesc {
    /// A host cache of `num_tensors` tensors of `shape`.
    pub fn host(num_tensors: u32, data_type: DataType, shape: Vec<i64>) -> CacheDesc {
        CacheDesc {
            placement: Placement::Host,
            num_tensors,
            data_type,
            shape,
        }
    }

    /// `product(shape) × dtype size`, checked.
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID` for an empty shape, a dimension ≤ 0, or overflow.
    pub fn tensor_size(&self) -> Result<u64> {
        if self.shape.is_empty() {
            return Err(DataDistError::param("cache shape is empty"));
        }
        let mut n: u64 = self.data_type.size();
        for &d in &self.shape {
            if d <= 0 {
                return Err(DataDistError::param(format!(
                    "cache shape {:?} has a dimension {d} ≤ 0",
                    self.shape
                )));
            }
            n = n.checked_mul(d as u64).ok_or_else(|| {
                DataDistError::param(format!("cache shape {:?} overflows", self.shape))
            })?;
        }
        Ok(n)
    }

    /// Blocks (or batch entries) per tensor: `shape[0]`.
    ///
    /// # Errors
    /// As [`CacheDesc::tensor_size`].
    pub fn units(&self) -> Result<u64> {
        self.tensor_size()?;
        Ok(self.shape[0] as u64)
    }

    /// Bytes per block (or batch entry): `tensor_size / shape[0]`.
    ///
    /// # Errors
    /// As [`CacheDesc::tensor_size`].
    pub fn stride(&self) -> Result<u64> {
        Ok(self.tensor_size()? / self.units()?)
    }

    /// Checks the descriptor against the addresses given for it.
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID` naming the mismatch.
    pub fn check(&self, addrs: &[u64]) -> Result<()> {
        self.tensor_size()?;
        if self.num_tensors == 0 {
            return Err(DataDistError::param("num_tensors is 0"));
        }
        if addrs.len() != self.num_tensors as usize {
            return Err(DataDistError::param(format!(
                "{} addresses for {} tensors",
                addrs.len(),
                self.num_tensors
            )));
        }
        if addrs.len() > MAX_ADDRS {
            return Err(DataDistError::param(format!(
                "{} addresses exceed the limit of {MAX_ADDRS}",
                addrs.len()
            )));
        }
        if let Some(i) = addrs.iter().position(|&a| a == 0) {
            return Err(DataDistError::param(format!(
                "address of tensor {i} is null"
            )));
        }
        Ok(())
    }
}

/// Names a blocks cache remotely: `(cluster_id, model_id)` (LLM-DataDist `BlocksCacheKey`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BlocksCacheKey {
    /// The owning cluster.
    pub cluster_id: u64,
    /// The model (distinct caches of one cluster need distinct model ids).
    pub model_id: u64,
}

/// Names one batch entry of a contiguous (prompt) cache by the request it holds
/// (LLM-DataDist `CacheKey`). The owner gives the keys when it registers the cache (key `i`
/// names batch entry `i`) and removes them with `remove_cache_key`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CacheKey {
    /// The owning cluster.
    pub cluster_id: u64,
    /// The request.
    pub req_id: u64,
    /// The model (default 0).
    pub model_id: u64,
    /// The prefix (default `u64::MAX`: none).
    pub prefix_id: u64,
}

impl CacheKey {
    /// The key of request `req_id` of `cluster_id`, with LLM-DataDist's defaults
    /// (`model_id = 0`, `prefix_id = 2^64 - 1`).
    pub fn new(cluster_id: u64, req_id: u64) -> CacheKey {
        CacheKey {
            cluster_id,
            req_id,
            model_id: 0,
            prefix_id: u64::MAX,
        }
    }
}

/// Names a cache by id, and an entry of a contiguous cache (LLM-DataDist `CacheIndex`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CacheIndex {
    /// The owning cluster.
    pub cluster_id: u64,
    /// The id `register_kv_cache` returned there.
    pub cache_id: i64,
    /// Batch entry (contiguous caches).
    pub batch_index: u32,
}

/// Layer ranges and layout of a transfer (LLM-DataDist `KvCacheExtParam`). Layer `L` covers
/// tensors `[L·n, L·n+n)` for `n = tensor_num_per_layer`; `None` means every layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvCacheExtParam {
    /// Source layers.
    pub src_layer_range: Option<Range<u32>>,
    /// Destination layers (same length as the source's).
    pub dst_layer_range: Option<Range<u32>>,
    /// Tensors per layer (2 for K and V).
    pub tensor_num_per_layer: u32,
}

impl Default for KvCacheExtParam {
    fn default() -> Self {
        KvCacheExtParam {
            src_layer_range: None,
            dst_layer_range: None,
            tensor_num_per_layer: 2,
        }
    }
}

impl KvCacheExtParam {
    /// Only layers `layers`, the same on both sides.
    pub fn layers(layers: Range<u32>) -> KvCacheExtParam {
        KvCacheExtParam {
            src_layer_range: Some(layers.clone()),
            dst_layer_range: Some(layers),
            tensor_num_per_layer: 2,
        }
    }
}

/// The tensors a layer range covers, checked against the cache's tensor count.
///
/// # Errors
/// `LLM_PARAM_INVALID` when `per_layer` is 0 or does not divide the tensors, or the range is
/// empty or past the last layer.
pub fn layer_tensors(
    range: Option<&Range<u32>>,
    per_layer: u32,
    num_tensors: u32,
) -> Result<Range<u32>> {
    if per_layer == 0 || num_tensors % per_layer != 0 {
        return Err(DataDistError::param(format!(
            "tensor_num_per_layer {per_layer} does not divide the cache's {num_tensors} tensors"
        )));
    }
    let layers = num_tensors / per_layer;
    let r = range.cloned().unwrap_or(0..layers);
    if r.start >= r.end || r.end > layers {
        return Err(DataDistError::param(format!(
            "layer range {r:?} is empty or past the cache's {layers} layers"
        )));
    }
    Ok(r.start * per_layer..r.end * per_layer)
}

/// A run of blocks contiguous on both sides: `count` blocks from `src` to `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// First source block.
    pub src: u64,
    /// First destination block.
    pub dst: u64,
    /// Blocks in the run.
    pub count: u64,
}

/// Pairs source and destination blocks and merges neighbours that are consecutive on both
/// sides, so a request becomes as few descriptors as possible.
///
/// # Errors
/// `LLM_PARAM_INVALID` when the lists differ in length, are empty, or name a block past
/// `src_units`/`dst_units`.
pub fn coalesce(src: &[u64], dst: &[u64], src_units: u64, dst_units: u64) -> Result<Vec<Run>> {
    if src.len() != dst.len() {
        return Err(DataDistError::param(format!(
            "{} source blocks but {} destination blocks",
            src.len(),
            dst.len()
        )));
    }
    if src.is_empty() {
        return Err(DataDistError::param("no blocks to transfer"));
    }
    let mut runs: Vec<Run> = Vec::new();
    for (&s, &d) in src.iter().zip(dst) {
        if s >= src_units || d >= dst_units {
            return Err(DataDistError::param(format!(
                "block pair ({s}, {d}) is past the caches' {src_units} / {dst_units} blocks"
            )));
        }
        match runs.last_mut() {
            Some(r) if r.src + r.count == s && r.dst + r.count == d => r.count += 1,
            _ => runs.push(Run {
                src: s,
                dst: d,
                count: 1,
            }),
        }
    }
    Ok(runs)
}

/// One side of a block transfer: where the tensors are and how big a block is.
#[derive(Clone, Copy, Debug)]
pub struct Side<'a> {
    /// Tensor base addresses.
    pub addrs: &'a [u64],
    /// Bytes per block.
    pub stride: u64,
}

/// Runs that repeat with constant steps on both sides: `runs` runs of `count` blocks, the
/// `k`-th from `src + k × src_step` to `dst + k × dst_step` (one strided descriptor per
/// tensor). Every other block of a cache, or a cache paged one token per block whose blocks
/// were handed out in a regular order, become one group instead of thousands of runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    /// First run.
    pub first: Run,
    /// Source blocks between the starts of consecutive runs.
    pub src_step: u64,
    /// Destination blocks between the starts of consecutive runs.
    pub dst_step: u64,
    /// Runs in the group.
    pub runs: u64,
}

/// Merges consecutive runs of equal length whose starts advance by constant steps on both
/// sides (steps at least the run length: pieces never overlap) into groups.
pub fn group_runs(runs: &[Run]) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    for r in runs {
        if let Some(g) = out.last_mut() {
            let last_src = g.first.src + (g.runs - 1) * g.src_step;
            let last_dst = g.first.dst + (g.runs - 1) * g.dst_step;
            let fits = r.count == g.first.count
                && r.src > last_src
                && r.dst > last_dst
                && r.src - last_src >= r.count
                && r.dst - last_dst >= r.count;
            if fits {
                let (ss, ds) = (r.src - last_src, r.dst - last_dst);
                if g.runs == 1 {
                    g.src_step = ss;
                    g.dst_step = ds;
                    g.runs = 2;
                    continue;
                }
                if ss == g.src_step && ds == g.dst_step {
                    g.runs += 1;
                    continue;
                }
            }
        }
        out.push(Group {
            first: *r,
            src_step: r.count,
            dst_step: r.count,
            runs: 1,
        });
    }
    out
}

/// The strided descriptors moving `runs` of every tensor in `src_t` to the matching tensor in
/// `dst_t`: one per tensor and group of runs ([`group_runs`]); `local_is_dst` picks which side
/// is the initiator's (pull: destination; push: source).
///
/// # Errors
/// `LLM_PARAM_INVALID` when the tensor ranges differ in length or the block sizes differ.
pub fn block_descs(
    src: Side<'_>,
    dst: Side<'_>,
    src_t: Range<u32>,
    dst_t: Range<u32>,
    runs: &[Run],
    local_is_dst: bool,
) -> Result<Vec<StridedDesc>> {
    if src_t.len() != dst_t.len() {
        return Err(DataDistError::param(format!(
            "source layers cover {} tensors, destination layers {}",
            src_t.len(),
            dst_t.len()
        )));
    }
    if src.stride != dst.stride {
        return Err(DataDistError::param(format!(
            "block sizes differ: {} bytes at the source, {} at the destination",
            src.stride, dst.stride
        )));
    }
    let groups = group_runs(runs);
    let mut out = Vec::with_capacity(src_t.len() * groups.len());
    for (ts, td) in src_t.zip(dst_t) {
        let (Some(&sa), Some(&da)) = (src.addrs.get(ts as usize), dst.addrs.get(td as usize))
        else {
            return Err(DataDistError::param(format!(
                "tensor {ts} or {td} does not exist"
            )));
        };
        for g in &groups {
            let s = sa + g.first.src * src.stride;
            let d = da + g.first.dst * dst.stride;
            let (ss, ds) = (g.src_step * src.stride, g.dst_step * dst.stride);
            let len = g.first.count * src.stride;
            out.push(if local_is_dst {
                StridedDesc {
                    local_addr: d,
                    remote_addr: s,
                    len,
                    local_stride: ds,
                    remote_stride: ss,
                    count: g.runs,
                }
            } else {
                StridedDesc {
                    local_addr: s,
                    remote_addr: d,
                    len,
                    local_stride: ss,
                    remote_stride: ds,
                    count: g.runs,
                }
            });
        }
    }
    Ok(out)
}

/// Every piece of `descs` as a plain descriptor.
pub fn pieces(descs: &[StridedDesc]) -> Vec<OpDesc> {
    descs
        .iter()
        .flat_map(|d| (0..d.count).map(move |i| d.piece(i)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn desc(blocks: i64) -> CacheDesc {
        CacheDesc::host(4, DataType::BFloat16, vec![blocks, 128, 8, 128])
    }

    #[test]
    fn geometry_follows_hixl() {
        let d = desc(10);
        assert_eq!(d.tensor_size().unwrap(), 10 * 128 * 8 * 128 * 2);
        assert_eq!(d.units().unwrap(), 10);
        assert_eq!(d.stride().unwrap(), 128 * 8 * 128 * 2);
        assert!(CacheDesc::host(1, DataType::Int8, vec![])
            .tensor_size()
            .is_err());
        assert!(CacheDesc::host(1, DataType::Int8, vec![4, 0])
            .tensor_size()
            .is_err());
        assert!(CacheDesc::host(1, DataType::Int64, vec![i64::MAX, 4])
            .tensor_size()
            .is_err());
        assert!(d.check(&[1, 2, 3]).is_err());
        assert!(d.check(&[1, 2, 3, 0]).is_err());
        assert!(d.check(&[1, 2, 3, 4]).is_ok());
    }

    #[test]
    fn layer_ranges() {
        assert_eq!(layer_tensors(None, 2, 64).unwrap(), 0..64);
        assert_eq!(layer_tensors(Some(&(3..5)), 2, 64).unwrap(), 6..10);
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = 5..3;
        assert!(layer_tensors(Some(&backwards), 2, 64).is_err());
        assert!(layer_tensors(Some(&(30..33)), 2, 64).is_err());
        assert!(layer_tensors(None, 3, 64).is_err());
        assert!(layer_tensors(None, 0, 64).is_err());
    }

    #[test]
    fn coalescing_merges_runs_consecutive_on_both_sides() {
        let r = coalesce(&[1, 2, 3, 7, 8, 9], &[10, 11, 12, 13, 20, 21], 100, 100).unwrap();
        assert_eq!(
            r,
            vec![
                Run {
                    src: 1,
                    dst: 10,
                    count: 3
                },
                Run {
                    src: 7,
                    dst: 13,
                    count: 1
                },
                Run {
                    src: 8,
                    dst: 20,
                    count: 2
                },
            ]
        );
        assert!(coalesce(&[1], &[1, 2], 10, 10).is_err());
        assert!(coalesce(&[10], &[1], 10, 10).is_err());
        assert!(coalesce(&[], &[], 10, 10).is_err());
    }

    #[test]
    fn runs_with_constant_steps_group() {
        // every other source block into consecutive destination blocks
        let src: Vec<u64> = (0..100).map(|i| 2 * i).collect();
        let dst: Vec<u64> = (0..100).collect();
        let runs = coalesce(&src, &dst, 200, 100).unwrap();
        assert_eq!(runs.len(), 100);
        let g = group_runs(&runs);
        assert_eq!(
            g,
            vec![Group {
                first: Run {
                    src: 0,
                    dst: 0,
                    count: 1
                },
                src_step: 2,
                dst_step: 1,
                runs: 100
            }]
        );
        // runs of 3 every 5 blocks, then a break in the pattern
        let mut src: Vec<u64> = (0..4)
            .flat_map(|k| (0..3).map(move |i| 5 * k + i))
            .collect();
        let mut dst: Vec<u64> = (0..12).collect();
        src.extend([40, 41]);
        dst.extend([50, 51]);
        let g = group_runs(&coalesce(&src, &dst, 64, 64).unwrap());
        assert_eq!(g.len(), 2);
        assert_eq!(
            (g[0].runs, g[0].src_step, g[0].dst_step, g[0].first.count),
            (4, 5, 3, 3)
        );
        assert_eq!((g[1].runs, g[1].first.count), (1, 2));
        // backwards or overlapping steps do not group
        let g = group_runs(&coalesce(&[9, 5, 1], &[0, 2, 4], 10, 10).unwrap());
        assert_eq!(g.len(), 3);
    }

    proptest! {
        // Against a direct model: every (tensor, block) byte the descriptors move goes from
        // src_addr[t] + sb*stride to dst_addr[t'] + db*stride, and nothing else moves.
        #[test]
        fn descriptors_match_direct_model(
            pairs in proptest::collection::vec((0u64..32, 0u64..32), 1..40),
            layers in 1u32..4,
            stride in 1u64..64,
        ) {
            let (src_blocks, dst_blocks): (Vec<u64>, Vec<u64>) = pairs.iter().copied().unzip();
            let nt = layers * 2;
            let src_addrs: Vec<u64> = (0..nt as u64).map(|t| 1_000_000 + t * 10_000).collect();
            let dst_addrs: Vec<u64> = (0..nt as u64).map(|t| 5_000_000 + t * 10_000).collect();
            let runs = coalesce(&src_blocks, &dst_blocks, 32, 32).unwrap();
            let strided = block_descs(
                Side { addrs: &src_addrs, stride },
                Side { addrs: &dst_addrs, stride },
                0..nt, 0..nt, &runs, true,
            ).unwrap();
            for (i, d) in strided.iter().enumerate() {
                prop_assert!(d.spans(i).is_ok(), "{:?}", d);
            }
            let descs = pieces(&strided);
            let mut got: Vec<(u64, u64)> = Vec::new(); // (remote/src byte, local/dst byte)
            for d in &descs {
                for i in 0..d.len { got.push((d.remote_addr + i, d.local_addr + i)); }
            }
            let mut want = Vec::new();
            for t in 0..nt as usize {
                for (&s, &d) in src_blocks.iter().zip(&dst_blocks) {
                    for i in 0..stride {
                        want.push((src_addrs[t] + s * stride + i, dst_addrs[t] + d * stride + i));
                    }
                }
            }
            got.sort_unstable();
            want.sort_unstable();
            prop_assert_eq!(got, want);
            prop_assert!(strided.len() <= nt as usize * runs.len());
        }
    }
}
