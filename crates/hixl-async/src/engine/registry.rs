//! Memory registration: owned, raw and pooled regions, their device registrations, and
//! deregistration.

use std::sync::Arc;

use hixl_core::region::Registered;

use crate::rng::OsRkeys;
use hixl_core::{Access, Error, MemDesc, MemKind, RegionId, Result};

use super::Engine;
use crate::memory::{Backing, HostBuffer, Owned, Region, RegionInner};
use crate::sync::lock;

impl Engine {
    /// Registers an owned host buffer, readable and writable by peers.
    ///
    /// # Errors
    /// As [`Engine::register_with`].
    pub fn register(&self, buf: HostBuffer) -> Result<Region> {
        self.register_with(buf, Access::REMOTE_RW, None)
    }

    /// Registers an owned host buffer with the given peer access and an optional name that
    /// peers see in their memory table. The engine keeps the buffer until
    /// [`Engine::deregister`] hands it back.
    ///
    /// # Errors
    /// [`Error::Overlap`] (cannot happen for a fresh buffer, but kept for symmetry).
    pub fn register_with(
        &self,
        buf: HostBuffer,
        access: Access,
        name: Option<&str>,
    ) -> Result<Region> {
        let mut buf = buf;
        let desc = MemDesc::new(buf.as_mut_ptr() as u64, buf.len() as u64);
        self.register_inner(
            desc,
            MemKind::Host,
            access,
            name,
            Some(Owned::Host(buf)),
            false,
        )
    }

    /// Registers memory the caller owns, as HIXL's `RegisterMem` does. Registering the identical
    /// range again returns the same region.
    ///
    /// # Safety
    /// `desc` must describe memory that is valid for reads and writes for its whole length
    /// until [`Engine::deregister`] (or [`Engine::deregister_id`]) has returned for it, or the
    /// engine has been shut down and dropped: peers may read and write it at any time until
    /// then, concurrently with this process. Meanwhile the caller must not hold a Rust reference
    /// (`&[u8]`, `&mut [u8]`) to it: reach it through raw pointers or [`Region::read_at`] and
    /// [`Region::write_at`].
    ///
    /// # Errors
    /// [`Error::NullAddress`], [`Error::ZeroLength`], [`Error::Overlap`] for a partial overlap
    /// with a region of the same kind, [`Error::Unsupported`] for device memory (no device
    /// runtime in this build).
    pub unsafe fn register_raw(
        &self,
        desc: MemDesc,
        kind: MemKind,
        access: Access,
        name: Option<&str>,
    ) -> Result<Region> {
        self.register_inner(desc, kind, access, name, None, false)
    }

    /// As [`Engine::register_raw`], but the region must be new: the identical range registered
    /// before is refused with [`Error::Overlap`] instead of returning the existing region. For a
    /// caller that deregisters what it registered (a failed registration of several tensors
    /// undoing its first ones), which must never deregister someone else's region.
    ///
    /// # Safety
    /// As [`Engine::register_raw`].
    ///
    /// # Errors
    /// As [`Engine::register_raw`], and [`Error::Overlap`] for the identical range.
    pub unsafe fn register_raw_new(
        &self,
        desc: MemDesc,
        kind: MemKind,
        access: Access,
        name: Option<&str>,
    ) -> Result<Region> {
        self.register_inner(desc, kind, access, name, None, true)
    }

    fn register_inner(
        &self,
        desc: MemDesc,
        kind: MemKind,
        access: Access,
        name: Option<&str>,
        owned: Option<Owned>,
        exclusive: bool,
    ) -> Result<Region> {
        self.check_open("register refused")?;
        if kind == MemKind::Device {
            return Err(Error::Unsupported {
                what: "device memory needs a device runtime (CUDA or Ascend ACL); this build has none, and hixl never falls back to host memory silently".into(),
            });
        }
        if let Some(n) = name {
            if n.len() > hixl_core::wire::MAX_NAME {
                return Err(Error::TooLarge {
                    what: "region name",
                    len: n.len() as u64,
                    max: hixl_core::wire::MAX_NAME as u64,
                });
            }
        }
        let mr = self.device_register(desc, access)?;
        let mut owned = owned;
        let mut mr = mr;
        let region = {
            let mut t = lock(&self.inner.lcx.regions);
            let r = t.register(
                desc,
                kind,
                access,
                name.map(str::to_string),
                &mut OsRkeys,
                |id, rkey| {
                    Arc::new(RegionInner::new(
                        id,
                        desc.addr,
                        desc.len,
                        kind,
                        access,
                        rkey,
                        Backing {
                            owned: owned.take(),
                            mr: mr.take(),
                        },
                    ))
                },
            )?;
            let e = t.get(r.id()).ok_or(Error::Internal {
                what: "a region vanished from the table right after its registration",
            })?;
            if exclusive && matches!(r, Registered::Existing(_)) {
                return Err(Error::Overlap {
                    addr: desc.addr,
                    len: desc.len,
                    existing_addr: e.addr,
                    existing_len: e.len,
                });
            }
            e.data.clone()
        };
        if access.is_remote() {
            if let Some(s) = &self.inner.server {
                s.broadcast_table(true);
            }
            #[cfg(feature = "directory")]
            self.table_changed();
        }
        Ok(Region { inner: region })
    }

    /// Registers the memory with each transport's device (an RDMA memory region), when the
    /// engine has one; see [`crate::transport::Transport::register`].
    fn device_register(
        &self,
        desc: MemDesc,
        access: Access,
    ) -> Result<Option<crate::memory::DeviceMr>> {
        for t in self.inner.lcx.transports.iter() {
            // SAFETY: the memory stays valid until deregistration has returned (register_raw's
            // contract; owned buffers are kept by the region). The registration is dropped by
            // deregistration after the region's leases are gone and before the memory is
            // handed back, or when the region itself is dropped (it is declared before the
            // owned memory).
            if let Some(mr) = unsafe { t.register(desc, access) }? {
                return Ok(Some(mr));
            }
        }
        Ok(None)
    }

    /// Allocates `len` bytes from the engine's fabric pool (sealed, memfd-backed shared memory)
    /// and registers them. Same-host peers map such regions and copy into them directly;
    /// remote peers reach them over TCP like any other region.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the engine runs without the fabric backend
    /// (`hixl.Transport` `tcp` or `verbs`), [`Error::ResourceExhausted`] past the pool's capacity
    /// (`fabric_memory.max_capacity`), or the OS error of creating the memory.
    pub fn register_pooled(&self, len: u64, access: Access, name: Option<&str>) -> Result<Region> {
        self.check_open("register refused")?;
        let (desc, owned) = self
            .inner
            .lcx
            .transports
            .iter()
            .find_map(|t| t.alloc(len))
            .ok_or_else(|| Error::Unsupported {
                what: "this engine has no fabric pool (hixl.Transport is tcp or verbs, or the build has no fabric)".into(),
            })??;
        self.register_inner(desc, MemKind::Host, access, name, Some(owned), false)
    }

    /// Ends a registration: peers lose access at once (later requests are refused), then this
    /// waits until no in-flight op touches the region and returns the owned buffer, if any.
    ///
    /// # Errors
    /// None today (a poisoned lock is recovered, see ARCHITECTURE.md, "Locks and poisoning");
    /// an unknown region is not an error (HIXL: SUCCESS).
    pub async fn deregister(&self, region: &Region) -> Result<Option<HostBuffer>> {
        self.deregister_id(region.id()).await
    }

    /// [`Engine::deregister`] by handle. An unknown handle is a no-op, as in HIXL.
    ///
    /// # Errors
    /// None today, as for [`Engine::deregister`].
    pub async fn deregister_id(&self, id: RegionId) -> Result<Option<HostBuffer>> {
        let e = lock(&self.inner.lcx.regions).deregister(id);
        let Some(e) = e else { return Ok(None) };
        if e.access.is_remote() {
            if let Some(s) = &self.inner.server {
                s.broadcast_table(false);
                s.revoke(e.rkey).await;
            }
            #[cfg(feature = "directory")]
            self.table_changed();
        }
        Ok(e.data.revoke_and_drain().await)
    }
}
