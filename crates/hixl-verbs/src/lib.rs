//! RDMA verbs backend of hixl (RoCE / InfiniBand, tested on Soft-RoCE) over `rdma-sys`.
//!
//! A small synchronous layer whose types are named after the verbs objects they wrap:
//!
//! 1. [`Device::list`] / [`query_devices`] (what `hixl info` shows: ports, state, active MTU,
//!    GIDs and their RoCE version), [`Context::open`] or [`Context::open_first_active`].
//! 2. [`ProtectionDomain::new`]; [`MemoryRegion::register`] (unsafe: the caller keeps the
//!    memory alive) or [`RegisteredBuffer::new`] (owns its memory) give lkeys and rkeys.
//! 3. [`Cq::new`]: a CQ with a non-blocking completion channel fd; it implements
//!    [`hixl_core::CompletionSource`] for the engine's reactor (drain, arm, drain, park).
//! 4. [`QueuePair::new`] (RC), [`QueuePair::endpoint`] sent to the peer out of band,
//!    [`QueuePair::connect`] with the peer's [`QpEndpoint`].
//! 5. [`QueuePair::post_chain`]: the one `unsafe` posting point, one doorbell per call; each
//!    [`WorkRequest`] yields one completion carrying its [`hixl_core::Token`].
//!
//! ```no_run
//! use std::time::Duration;
//! use hixl_core::{Access, Token};
//! use hixl_verbs::{Cq, Context, ProtectionDomain, QpConfig, QueuePair};
//! use hixl_verbs::{RegisteredBuffer, VerbsError, WorkRequest};
//!
//! # fn main() -> hixl_verbs::Result<()> {
//! let ctx = Context::open("rxe0")?;
//! let pd = ProtectionDomain::new(&ctx)?;
//! let cq = Cq::new(&ctx, 4096)?;
//! let mut qp = QueuePair::new(&pd, &cq, QpConfig::default())?;
//! let buf = RegisteredBuffer::new(&pd, 1 << 20, Access::REMOTE_RW)?;
//! // Send qp.endpoint() and buf.remote() to the peer out of band; receive its pair.
//! # let (peer_ep, peer_mem) = (qp.endpoint(), buf.remote());
//! qp.connect(&peer_ep)?;
//! let outside = || VerbsError::Invalid { what: "range", reason: "outside".into() };
//! let local = buf.local(0, 4096).ok_or_else(outside)?;
//! let remote = peer_mem.at(0, 4096).ok_or_else(outside)?;
//! // SAFETY: buf and the peer's region stay registered until the completion is drained.
//! unsafe { qp.post_chain(&[WorkRequest::write(Token(1), local, remote)])? };
//! let mut done = Vec::new();
//! cq.wait_for(&mut done, 1, Duration::from_secs(5));
//! # Ok(()) }
//! ```
//!
//! Nothing here spawns threads or tasks. All FFI goes through the private `sys` module.
//! Tests that need a device run when `HIXL_VERBS_DEVICE` names one (e.g. `rxe0` inside the
//! Soft-RoCE guest of `tools/softroce-vm.sh`) and skip otherwise.
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod attr;
mod buffer;
mod context;
mod cq;
mod device;
mod endpoint;
mod error;
mod list;
mod mr;
mod nic;
mod pairing;
mod post;
mod qp;
mod send_queue;
mod sys;

pub use attr::{DeviceInfo, GidInfo, GidType, LinkLayer, Mtu, PortInfo, PortState};
pub use buffer::RegisteredBuffer;
pub use context::{Context, Limits};
pub use cq::Cq;
pub use device::{query_devices, Device};
pub use endpoint::{QpEndpoint, ENDPOINT_LEN};
pub use error::{Result, VerbsError, WcStatus};
pub use mr::{LocalRange, MemoryRegion, ProtectionDomain, RemoteMemory, RemoteRange};
pub use nic::{NicInfo, MAX_NICS};
pub use pairing::{pair, Pairing, RailPlan};
pub use post::WorkRequest;
pub use qp::{QpConfig, QpState, QueuePair};
