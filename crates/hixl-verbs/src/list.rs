//! The device list of libibverbs: walking it and naming its entries.

use std::ffi::CStr;

use crate::error::{Result, VerbsError};
use crate::sys;

/// Runs `f` over the device list, freeing it afterwards. Without a loadable libibverbs (no
/// rdma-core on the host) there is no device, and the error says why.
pub(crate) fn with_device_list<T>(
    f: impl FnOnce(&[*mut sys::ibv_device]) -> Result<T>,
) -> Result<T> {
    sys::library().map_err(|why| VerbsError::NoDevice {
        reason: why.to_owned(),
    })?;
    let mut n: libc::c_int = 0;
    // SAFETY: n is a valid out-pointer; the returned list is freed below.
    let list = unsafe { sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(VerbsError::NoDevice {
            reason: format!("ibv_get_device_list: {}", sys::last_error()),
        });
    }
    let len = usize::try_from(n).unwrap_or(0);
    // SAFETY: libibverbs returns an array of n device pointers (NULL-terminated after them).
    let devs = unsafe { std::slice::from_raw_parts(list, len) };
    let out = if devs.is_empty() {
        Err(VerbsError::NoDevice {
            reason: "libibverbs lists no devices (is an RDMA driver loaded, e.g. rdma_rxe with \
                     `rdma link add rxe0 type rxe netdev eth0`?)"
                .to_owned(),
        })
    } else {
        f(devs)
    };
    // SAFETY: list came from ibv_get_device_list and is freed once; devices opened inside `f`
    // stay valid after the list is freed (libibverbs keeps opened devices referenced).
    unsafe { sys::ibv_free_device_list(list) };
    out
}

/// # Safety
/// `d` must point to a device of a live device list.
pub(crate) unsafe fn device_name(d: *mut sys::ibv_device) -> String {
    // SAFETY: the caller guarantees d is live; the name is a NUL-terminated array in it.
    let p = unsafe { sys::ibv_get_device_name(d) };
    if p.is_null() {
        return String::from("?");
    }
    // SAFETY: non-null and NUL-terminated (a char array inside the device struct).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
