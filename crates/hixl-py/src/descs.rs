//! Descriptor arrays from Python: the transfer op's code, and raw `u64` records (an N×3 or
//! N×6 array the caller holds) copied into plain and strided descriptors.

use hixl_core::{Error, OpDesc, StridedDesc, TransferOp};
use pyo3::prelude::*;

/// Descriptors in a raw array at most (a copy of 24 bytes each is made).
const MAX_DESCS: usize = 1 << 24;

pub(crate) fn op_of(op: u8) -> PyResult<TransferOp> {
    match op {
        0 => Ok(TransferOp::Read),
        1 => Ok(TransferOp::Write),
        _ => Err(crate::hixl_err(Error::InvalidParam {
            what: format!("transfer op {op}: 0 is READ, 1 is WRITE"),
        })),
    }
}

/// Reads `n` records of `W` u64s from `ptr` (an array the caller keeps alive and does not
/// change during the call).
pub(crate) fn read_u64s<const W: usize>(ptr: u64, n: usize) -> PyResult<Vec<[u64; W]>> {
    if n > MAX_DESCS {
        return Err(crate::hixl_err(Error::InvalidParam {
            what: format!("{n} descriptors: at most {MAX_DESCS} per call"),
        }));
    }
    if n > 0 && (ptr == 0 || ptr % 8 != 0) {
        return Err(crate::hixl_err(Error::InvalidParam {
            what: format!("descriptor array at {ptr:#x} is null or not 8-byte aligned"),
        }));
    }
    let mut out = vec![[0u64; W]; n];
    if n > 0 {
        // SAFETY: the Python side passes a C-contiguous uint64 array of n×W entries that it
        // holds alive for this call (the GIL is held: no Python thread changes it meanwhile).
        // It is copied, never referenced.
        unsafe {
            std::ptr::copy_nonoverlapping(
                ptr as usize as *const u64,
                out.as_mut_ptr().cast::<u64>(),
                n * W,
            )
        };
    }
    Ok(out)
}

/// Plain descriptors from `(local, remote, len)` rows.
pub(crate) fn plain(rows: impl IntoIterator<Item = [u64; 3]>) -> Vec<OpDesc> {
    rows.into_iter()
        .map(|[l, r, len]| OpDesc::new(l, r, len))
        .collect()
}

/// Strided descriptors from `(local, remote, len, local_stride, remote_stride, count)` rows.
pub(crate) fn strided(rows: impl IntoIterator<Item = [u64; 6]>) -> Vec<StridedDesc> {
    rows.into_iter()
        .map(|[l, r, len, ls, rs, count]| StridedDesc {
            local_addr: l,
            remote_addr: r,
            len,
            local_stride: ls,
            remote_stride: rs,
            count,
        })
        .collect()
}
