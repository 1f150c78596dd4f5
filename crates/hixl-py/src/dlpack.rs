//! DLPack: the address and size of a tensor handed over as a `dltensor` capsule (how a CPU
//! `torch.Tensor` is registered without importing torch).

use std::ffi::{c_void, CStr};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

/// `DLManagedTensor`'s head (only `dl_tensor` is read).
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
}

const NAME: &CStr = c"dltensor";
/// kDLCPU and kDLCUDAHost: memory this process can address.
const HOST_DEVICES: [i32; 2] = [1, 3];

/// `(address, bytes)` of the C-contiguous host tensor in `capsule` (a `dltensor` capsule from
/// `__dlpack__()`, left as it is: its owner frees it).
#[pyfunction]
pub(crate) fn dlpack_span(capsule: &Bound<'_, PyAny>) -> PyResult<(u64, u64)> {
    // SAFETY: `capsule` is a live object (we hold a reference); PyCapsule_IsValid only reads it.
    let valid = unsafe { pyo3::ffi::PyCapsule_IsValid(capsule.as_ptr(), NAME.as_ptr()) } == 1;
    if !valid {
        return Err(PyValueError::new_err(
            "__dlpack__() did not return an unused \"dltensor\" capsule",
        ));
    }
    // SAFETY: a valid capsule of that name holds a non-null pointer.
    let p = unsafe { pyo3::ffi::PyCapsule_GetPointer(capsule.as_ptr(), NAME.as_ptr()) }
        .cast::<DlManagedTensor>();
    if p.is_null() {
        return Err(PyValueError::new_err(
            "the dltensor capsule holds no tensor",
        ));
    }
    // SAFETY: DLPack's ABI: an unused "dltensor" capsule points at a live DLManagedTensor,
    // which stays alive while the capsule does (the caller holds it). Its fields are only read.
    let t = unsafe { &(*p).dl_tensor };
    if !HOST_DEVICES.contains(&t.device.device_type) {
        return Err(PyValueError::new_err(format!(
            "a tensor on DLPack device type {} is not host memory",
            t.device.device_type
        )));
    }
    if t.ndim < 0 || t.ndim > 64 || (t.ndim > 0 && t.shape.is_null()) {
        return Err(PyValueError::new_err(format!(
            "a DLPack tensor of {} dimensions",
            t.ndim
        )));
    }
    let nd = t.ndim as usize;
    let shape: Vec<i64> = if nd == 0 {
        Vec::new()
    } else {
        // SAFETY: `shape` points at `ndim` i64s (DLPack).
        unsafe { std::slice::from_raw_parts(t.shape, nd) }.to_vec()
    };
    let strides: Option<Vec<i64>> = if t.strides.is_null() || nd == 0 {
        None
    } else {
        // SAFETY: non-null `strides` points at `ndim` i64s (DLPack).
        Some(unsafe { std::slice::from_raw_parts(t.strides, nd) }.to_vec())
    };
    let bits = u64::from(t.dtype.bits) * u64::from(t.dtype.lanes.max(1));
    if bits % 8 != 0 {
        return Err(PyValueError::new_err(format!(
            "a DLPack dtype of {bits} bits is not whole bytes"
        )));
    }
    let mut elems: u64 = 1;
    for &d in &shape {
        let d = u64::try_from(d)
            .map_err(|_| PyValueError::new_err(format!("a DLPack dimension of {d}")))?;
        elems = elems
            .checked_mul(d)
            .ok_or_else(|| PyValueError::new_err("a DLPack tensor's size overflows"))?;
    }
    if let Some(st) = strides {
        // C-contiguous: each stride is the product of the later dimensions (size-1 dims free).
        let mut want: i64 = 1;
        for i in (0..nd).rev() {
            if shape[i] != 1 && st[i] != want {
                return Err(PyValueError::new_err(format!(
                    "a non-contiguous DLPack tensor (strides {st:?}, shape {shape:?})"
                )));
            }
            want = want.saturating_mul(shape[i]);
        }
    }
    let bytes = elems
        .checked_mul(bits / 8)
        .ok_or_else(|| PyValueError::new_err("a DLPack tensor's size overflows"))?;
    let addr = (t.data as u64)
        .checked_add(t.byte_offset)
        .ok_or_else(|| PyValueError::new_err("a DLPack tensor's address overflows"))?;
    let _ = t.dtype.code;
    Ok((addr, bytes))
}
