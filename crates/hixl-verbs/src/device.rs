//! RDMA devices as libibverbs lists them, and what `hixl info` shows about each: ports, their
//! state, active MTU, message size limit and GIDs with their types (IB, RoCE v1, RoCE v2).

use crate::attr::DeviceInfo;
use crate::context::Context;
use crate::error::{Result, VerbsError};
use crate::list::{device_name, with_device_list};

/// An RDMA device by name (`rxe0`, `mlx5_0`). Opening it gives a [`Context`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Device {
    name: String,
}

impl Device {
    /// Every device libibverbs lists, in its order.
    ///
    /// # Errors
    /// [`VerbsError::NoDevice`] when libibverbs lists none (no kernel support or provider);
    /// an empty list is reported the same way, with the reason.
    pub fn list() -> Result<Vec<Device>> {
        with_device_list(|devs| {
            Ok(devs
                .iter()
                .map(|&d| Device {
                    // SAFETY: each pointer comes from the live device list.
                    name: unsafe { device_name(d) },
                })
                .collect())
        })
    }

    /// The device of this name.
    ///
    /// # Errors
    /// [`VerbsError::DeviceNotFound`] naming the devices that exist, or [`VerbsError::NoDevice`].
    pub fn by_name(name: &str) -> Result<Device> {
        let all = Device::list()?;
        all.iter()
            .find(|d| d.name == name)
            .cloned()
            .ok_or_else(|| VerbsError::DeviceNotFound {
                name: name.to_owned(),
                available: names(&all),
            })
    }

    /// The first device with an active port.
    ///
    /// # Errors
    /// [`VerbsError::NoActiveDevice`] listing every device's port states, or
    /// [`VerbsError::NoDevice`].
    pub fn first_active() -> Result<Device> {
        let mut seen = Vec::new();
        for d in Device::list()? {
            match d.query() {
                Ok(info) if info.active_port().is_some() => return Ok(d),
                Ok(info) => {
                    let states: Vec<String> = info
                        .ports
                        .iter()
                        .map(|p| format!("port {} {}", p.port, p.state))
                        .collect();
                    seen.push(format!("{} ({})", d.name, states.join(", ")));
                }
                Err(e) => seen.push(format!("{} ({e})", d.name)),
            }
        }
        Err(VerbsError::NoActiveDevice {
            available: seen.join("; "),
        })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Opens the device.
    ///
    /// # Errors
    /// The device vanished, or `ibv_open_device` failed (permissions on `/dev/infiniband`).
    pub fn open(&self) -> Result<Context> {
        Context::open(&self.name)
    }

    /// Opens the device briefly and reports its ports and GIDs.
    ///
    /// # Errors
    /// As [`Device::open`], or a failing `ibv_query_*`.
    pub fn query(&self) -> Result<DeviceInfo> {
        self.open()?.info()
    }
}

fn names(all: &[Device]) -> String {
    all.iter()
        .map(|d| d.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

impl Context {
    /// Opens the first device with an active port.
    ///
    /// # Errors
    /// [`VerbsError::NoActiveDevice`] (listing what exists) or [`VerbsError::NoDevice`].
    pub fn open_first_active() -> Result<Context> {
        Device::first_active()?.open()
    }
}

/// Every device with its ports and GIDs (`hixl info`).
///
/// # Errors
/// [`VerbsError::NoDevice`] when there is none; a device that fails to open is reported as an
/// error too (with its name), since `hixl info` should say why verbs is unavailable.
pub fn query_devices() -> Result<Vec<DeviceInfo>> {
    Device::list()?.iter().map(Device::query).collect()
}
