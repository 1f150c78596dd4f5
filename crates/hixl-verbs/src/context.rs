//! An open device (`ibv_context`): the handle protection domains and completion queues are
//! created from, and the place port and GID attributes are queried.

use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::sync::Arc;

use crate::attr::{DeviceInfo, GidInfo, GidType, PortInfo};
use crate::error::{Result, VerbsError};
use crate::list::{device_name, with_device_list};
use crate::sys;

/// An open RDMA device. Cheap to clone; the device is closed when the last clone, protection
/// domain and completion queue made from it are gone.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

pub(crate) struct ContextInner {
    ctx: *mut sys::ibv_context,
    name: String,
    fw_ver: String,
    limits: Limits,
}

// SAFETY: an ibv_context is a handle to kernel objects; libibverbs documents every verb on it
// as thread-safe, and the wrapper's own fields are immutable after open.
unsafe impl Send for ContextInner {}
// SAFETY: see Send; no interior mutability on the Rust side.
unsafe impl Sync for ContextInner {}

/// Device limits a QP or CQ is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Deepest work queue.
    pub max_qp_wr: u32,
    /// Largest completion queue.
    pub max_cqe: u32,
    /// Outstanding RDMA READs a QP may initiate.
    pub max_qp_init_rd_atom: u32,
    /// Outstanding RDMA READs a QP may serve.
    pub max_qp_rd_atom: u32,
    /// Largest memory region.
    pub max_mr_size: u64,
    /// Physical ports.
    pub ports: u8,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.inner.name)
            .finish()
    }
}

impl Context {
    /// Opens the device called `name` (`rxe0`, `mlx5_0`).
    ///
    /// # Errors
    /// [`VerbsError::DeviceNotFound`], [`VerbsError::NoDevice`], or the errno of
    /// `ibv_open_device`/`ibv_query_device`.
    pub fn open(name: &str) -> Result<Context> {
        let ctx = with_device_list(|devs| {
            for &d in devs {
                // SAFETY: d is a live entry of the device list.
                if unsafe { device_name(d) } == name {
                    // SAFETY: as above; the context outlives the list (libibverbs holds a
                    // reference to the device for every open context).
                    let ctx = unsafe { sys::ibv_open_device(d) };
                    if ctx.is_null() {
                        return Err(VerbsError::verb("ibv_open_device", name, sys::last_error()));
                    }
                    return Ok(ctx);
                }
            }
            // SAFETY: every entry is live for the duration of this closure.
            let available: Vec<String> = devs.iter().map(|&d| unsafe { device_name(d) }).collect();
            Err(VerbsError::DeviceNotFound {
                name: name.to_owned(),
                available: available.join(", "),
            })
        })?;
        // SAFETY: an all-zero ibv_device_attr is a valid value (plain integers and arrays).
        let mut attr: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: ctx is open; attr is a valid out-pointer.
        let rc = unsafe { sys::ibv_query_device(ctx, &mut attr) };
        if rc != 0 {
            // SAFETY: ctx was opened above and is closed exactly once here.
            unsafe { sys::ibv_close_device(ctx) };
            return Err(VerbsError::verb(
                "ibv_query_device",
                name,
                sys::error_from_rc(rc),
            ));
        }
        let limits = Limits {
            max_qp_wr: attr.max_qp_wr.max(0) as u32,
            max_cqe: attr.max_cqe.max(0) as u32,
            max_qp_init_rd_atom: attr.max_qp_init_rd_atom.max(0) as u32,
            max_qp_rd_atom: attr.max_qp_rd_atom.max(0) as u32,
            max_mr_size: attr.max_mr_size,
            ports: attr.phys_port_cnt,
        };
        let fw = {
            // SAFETY: fw_ver is a NUL-terminated char array filled by the driver (zeroed
            // beforehand, so a NUL exists even if the driver wrote nothing).
            let s = unsafe { CStr::from_ptr(attr.fw_ver.as_ptr()) };
            s.to_string_lossy().into_owned()
        };
        tracing::debug!(device = name, fw = %fw, ?limits, "opened RDMA device");
        Ok(Context {
            inner: Arc::new(ContextInner {
                ctx,
                name: name.to_owned(),
                fw_ver: fw,
                limits,
            }),
        })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The device's limits.
    pub fn limits(&self) -> Limits {
        self.inner.limits
    }

    pub(crate) fn raw(&self) -> *mut sys::ibv_context {
        self.inner.ctx
    }

    /// `ibv_query_port` of one port.
    fn query_port(&self, port: u8) -> Result<sys::ibv_port_attr> {
        let mut attr = MaybeUninit::<sys::ibv_port_attr>::zeroed();
        // SAFETY: the context is open; attr points to a zeroed ibv_port_attr of the size the
        // extended query is told (rdma-sys passes size_of_val).
        let rc = unsafe { sys::ibv_query_port_ex(self.raw(), port, attr.as_mut_ptr()) };
        if rc != 0 {
            return Err(VerbsError::verb(
                "ibv_query_port",
                self.name(),
                sys::error_from_rc(rc),
            ));
        }
        // SAFETY: zero-initialised and then filled by the driver; every field is an integer.
        Ok(unsafe { attr.assume_init() })
    }

    /// Attributes and GIDs of one port.
    ///
    /// # Errors
    /// The errno of `ibv_query_port` (e.g. `EINVAL` for a port that does not exist).
    pub fn port(&self, port: u8) -> Result<PortInfo> {
        let attr = self.query_port(port)?;
        let mut info = PortInfo::from_attr(port, &attr);
        let len = u32::try_from(attr.gid_tbl_len).unwrap_or(0).min(256);
        for index in 0..len {
            if let Some(g) = self.gid(port, index) {
                info.gids.push(g);
            }
        }
        Ok(info)
    }

    /// The port's state alone (one query, no GID table walk): what a link checks each second
    /// to pause a rail whose port went down and to probe it back once it is up.
    ///
    /// # Errors
    /// The errno of `ibv_query_port`.
    pub fn port_state(&self, port: u8) -> Result<crate::attr::PortState> {
        let attr = self.query_port(port)?;
        Ok(crate::attr::PortState::from_code(attr.state))
    }

    /// One GID table entry, or `None` when it is empty or cannot be read.
    fn gid(&self, port: u8, index: u32) -> Option<GidInfo> {
        let mut e = MaybeUninit::<sys::ibv_gid_entry>::zeroed();
        // SAFETY: the context is open; e is a valid out-pointer of the size passed.
        let rc = unsafe {
            sys::_ibv_query_gid_ex(
                self.raw(),
                u32::from(port),
                index,
                e.as_mut_ptr(),
                0,
                std::mem::size_of::<sys::ibv_gid_entry>(),
            )
        };
        if rc != 0 {
            return None; // ENODATA: an empty slot
        }
        // SAFETY: filled by libibverbs on success; all fields are integers or byte arrays.
        let e = unsafe { e.assume_init() };
        // SAFETY: both union variants are plain bytes; `raw` is always valid.
        let gid = unsafe { e.gid.raw };
        if gid == [0; 16] {
            return None;
        }
        Some(GidInfo {
            index: u8::try_from(index).ok()?,
            gid,
            gid_type: GidType::from_code(e.gid_type),
        })
    }

    /// The device's name, firmware, limits and every port (`hixl info`).
    ///
    /// # Errors
    /// As [`Context::port`].
    pub fn info(&self) -> Result<DeviceInfo> {
        let l = self.limits();
        let ports = (1..=l.ports)
            .map(|p| self.port(p))
            .collect::<Result<Vec<_>>>()?;
        Ok(DeviceInfo {
            name: self.name().to_owned(),
            fw_ver: self.inner.fw_ver.clone(),
            max_mr_size: l.max_mr_size,
            max_qp_wr: l.max_qp_wr,
            max_cqe: l.max_cqe,
            max_qp_init_rd_atom: l.max_qp_init_rd_atom,
            ports,
        })
    }
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: ctx was opened in Context::open; every PD, CQ and channel made from it holds
        // a clone of the Arc around this, so nothing uses it any more.
        let rc = unsafe { sys::ibv_close_device(self.ctx) };
        if rc != 0 {
            tracing::warn!(device = %self.name, rc, "ibv_close_device failed");
        }
    }
}
