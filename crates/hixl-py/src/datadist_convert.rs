//! Plain values of `hixl._hixl.DataDist` to and from the KV layer's types: errors into
//! `LLMException`s, roles, element types, layer ranges, keys, lease grants, and the check that
//! a tensor address is mapped memory of this process.

use std::time::Duration;

use hixl_datadist::{
    BlocksCacheKey, CacheIndex, CacheKey, DataDistError, DataType, KvCacheExtParam, LeaseEnd,
    LeaseGrant, LlmRole, LlmStatus,
};
use pyo3::prelude::*;

/// A layer range as Python passes it: `(start, stop)`, or `None` for every layer.
pub(crate) type LayerRange = Option<(u32, u32)>;
/// Layer ranges and tensors per layer of a transfer: `(src_range, dst_range, per_layer)`.
pub(crate) type Ext = (LayerRange, LayerRange, u32);
/// A `CacheKey` as Python passes it: `(cluster_id, req_id, model_id, prefix_id)`.
pub(crate) type KeyTuple = (u64, u64, u64, u64);
/// An ended lease as Python receives it: `(request_id, lease_id, caches, blocks, why)`.
pub(crate) type EndedTuple = (u64, u64, Vec<i64>, Vec<u64>, &'static str);

pub(crate) use hixl_async::sync::lock;

/// The `LLMException` for `e` (built by `hixl.llm_datadist._status._native_error`).
pub(crate) fn dd_err(e: DataDistError) -> PyErr {
    Python::attach(|py| match make_err(py, &e) {
        Ok(err) => err,
        Err(fallback) => fallback,
    })
}

pub(crate) fn make_err(py: Python<'_>, e: &DataDistError) -> PyResult<PyErr> {
    let failed: Vec<(u32, u32, u64, u64)> = e
        .failed
        .iter()
        .map(|f| (f.src_layer, f.dst_layer, f.src_block, f.dst_block))
        .collect();
    let m = py.import("hixl.llm_datadist._status")?;
    let exc = m
        .getattr("_native_error")?
        .call1((e.status.code(), e.message.clone(), failed))?;
    Ok(PyErr::from_value(exc))
}

/// `Result<T, DataDistError>` into a `PyResult`.
pub(crate) fn dd_result<T>(r: Result<T, DataDistError>) -> PyResult<T> {
    r.map_err(dd_err)
}

/// An `LLM_PARAM_INVALID` exception with `msg`.
pub(crate) fn param(msg: impl Into<String>) -> PyErr {
    dd_err(DataDistError::param(msg))
}

pub(crate) fn role_of(role: u8) -> PyResult<LlmRole> {
    match role {
        1 => Ok(LlmRole::Prompt),
        2 => Ok(LlmRole::Decoder),
        3 => Ok(LlmRole::Mix),
        r => Err(param(format!(
            "role {r}: LLMRole is PROMPT (1), DECODER (2) or MIX (3)"
        ))),
    }
}

pub(crate) fn dtype_of(name: &str) -> PyResult<DataType> {
    Ok(match name {
        "DT_FLOAT16" => DataType::Float16,
        "DT_BF16" => DataType::BFloat16,
        "DT_FLOAT" => DataType::Float32,
        "DT_INT8" => DataType::Int8,
        "DT_UINT8" => DataType::UInt8,
        "DT_INT16" => DataType::Int16,
        "DT_INT32" => DataType::Int32,
        "DT_INT64" => DataType::Int64,
        other => {
            return Err(param(format!(
                "data type {other:?} is not supported; hixl knows DT_FLOAT16, DT_BF16, DT_FLOAT, \
                 DT_INT8, DT_UINT8, DT_INT16, DT_INT32, DT_INT64"
            )))
        }
    })
}

pub(crate) fn ext_of((src, dst, n): Ext) -> KvCacheExtParam {
    KvCacheExtParam {
        src_layer_range: src.map(|(a, b)| a..b),
        dst_layer_range: dst.map(|(a, b)| a..b),
        tensor_num_per_layer: n,
    }
}

pub(crate) fn millis(ms: u64, what: &str) -> PyResult<Duration> {
    if ms == 0 {
        return Err(param(format!("{what} {ms} ms: it must be > 0")));
    }
    Ok(Duration::from_millis(ms))
}

pub(crate) fn why_name(w: LeaseEnd) -> &'static str {
    match w {
        LeaseEnd::Done => "DONE",
        LeaseEnd::Expired => "EXPIRED",
        LeaseEnd::LinkDown => "LINK_DOWN",
        LeaseEnd::Revoked => "REVOKED",
    }
}

pub(crate) fn grant_of(json: &str) -> PyResult<LeaseGrant> {
    serde_json::from_str(json).map_err(|e| param(format!("lease grant {json:?} is not valid: {e}")))
}

/// Every grant of a list (JSON each), the first invalid one refused by name.
pub(crate) fn grants_of(json: &[String]) -> PyResult<Vec<LeaseGrant>> {
    json.iter().map(|g| grant_of(g)).collect()
}

/// Checks that `[addr, addr + len)` is mapped memory of this process, so that a wrong integer
/// is refused by name instead of crashing the process at the first transfer.
pub(crate) fn check_mapped(addr: u64, len: u64, tensor: usize) -> PyResult<()> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = if page > 0 { page as u64 } else { 4096 };
    let end = addr.checked_add(len).ok_or_else(|| {
        param(format!(
            "tensor {tensor}: address {addr:#x} + {len} bytes overflows"
        ))
    })?;
    const CHUNK_PAGES: u64 = 1 << 16;
    let mut vec = vec![0u8; CHUNK_PAGES as usize];
    let mut at = addr & !(page - 1);
    while at < end {
        let n = (end - at).div_ceil(page).min(CHUNK_PAGES);
        // SAFETY: mincore only reads the page tables of [at, at + n pages) (`at` is page
        // aligned) and writes n bytes into `vec`, which holds CHUNK_PAGES ≥ n.
        let r = unsafe {
            libc::mincore(
                at as usize as *mut libc::c_void,
                (n * page) as usize,
                vec.as_mut_ptr(),
            )
        };
        if r != 0 {
            let err = std::io::Error::last_os_error();
            return Err(param(format!(
                "tensor {tensor}: address {addr:#x} ({len} bytes) is not mapped memory of this \
                 process ({err}); pass the address of memory you keep alive, e.g. \
                 arr.ctypes.data or tensor.data_ptr()"
            )));
        }
        at += n * page;
    }
    Ok(())
}

/// A per-cluster result as `(code, message)`.
pub(crate) fn outcome(r: Result<(), DataDistError>) -> (u32, String) {
    match r {
        Ok(()) => (LlmStatus::Success.code(), String::new()),
        Err(e) => (e.status.code(), e.message),
    }
}

/// Blocks cache keys from `(cluster_id, model_id)` pairs.
pub(crate) fn bkeys(keys: Vec<(u64, u64)>) -> Vec<BlocksCacheKey> {
    keys.into_iter().map(bkey).collect()
}

pub(crate) fn bkey((cluster_id, model_id): (u64, u64)) -> BlocksCacheKey {
    BlocksCacheKey {
        cluster_id,
        model_id,
    }
}

pub(crate) fn cache_key((cluster_id, req_id, model_id, prefix_id): KeyTuple) -> CacheKey {
    CacheKey {
        cluster_id,
        req_id,
        model_id,
        prefix_id,
    }
}

pub(crate) fn cache_index((cluster_id, cache_id, batch_index): (u64, i64, u32)) -> CacheIndex {
    CacheIndex {
        cluster_id,
        cache_id,
        batch_index,
    }
}
