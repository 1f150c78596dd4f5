//! Same-host ("fabric") backend of hixl, HIXL's FabricMem/SDMA path brought to hosts: a pool of
//! sealed memfd buffers that peers map, fd export over Unix sockets, cross-memory attach for other
//! host memory, and copy-engine threads that post completions to an eventfd-backed queue.
//!
//! Everything here is synchronous: the async engine drives [`CopyEngine`] through
//! [`hixl_core::CompletionSource`] and calls [`send_fds`]/[`recv_fds`] inside its own readiness
//! loop. All of hixl's `unsafe` for raw copies and mappings lives in this crate.
//!
//! The pieces, in the order a connection uses them:
//!
//! 1. [`HostIdentity::current`] on both sides; [`HostIdentity::same_host`] decides whether the
//!    fabric backend applies.
//! 2. [`FabricPool::alloc`] gives buffers whose memfd ([`FabricBuf::fd`]) is exported with
//!    [`send_fds`]; the peer maps it with [`PeerMapping::map`], at the same address when the
//!    unified VA window allows ([`PeerMapping::translated`] says when it did not).
//! 3. Host memory outside the pool is reached with [`cma_read`]/[`cma_write`], after
//!    [`cma_probe`] showed it is permitted.
//! 4. Transfers become [`CopyOp`]s submitted to a [`CopyEngine`]; each op yields one completion.
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod cma;
pub mod copy_engine;
mod copy_op;
pub mod fdpass;
pub mod host;
pub mod mapping;
mod placement;
pub mod pool;

pub use cma::{cma_probe, cma_read, cma_write, permit_cma_from};
pub use copy_engine::{CopyEngine, CopyKind, CopyOp, DEFAULT_RING_CAPACITY, MAX_STREAMS};
pub use fdpass::{recv_fds, send_fds, SCM_MAX_FD};
pub use hixl_cq::CompletionQueue;
pub use host::HostIdentity;
pub use mapping::PeerMapping;
pub use placement::page_size;
pub use pool::{FabricBuf, FabricPool, POOL_SEALS};
