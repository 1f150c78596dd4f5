//! hixl: an async-first, one-sided, zero-copy transfer engine for KV cache and any registered
//! memory, with Huawei HIXL's calls, status codes and option keys.
//!
//! Depend on this crate; it re-exports the API of `hixl-core` and `hixl-async`. The README
//! follows; its examples are compiled as doctests.
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub use hixl_async::*;
pub use hixl_core::{
    options, wire, Access, AsyncConnectStatus, Error, MemDesc, MemKind, Notify, OpDesc, Options,
    RegionId, RemoteRegion, Result, Status, StridedDesc, TransferOp, TransferStatus,
    NOTIFY_MAX_LEN, NOTIFY_MAX_PENDING,
};

/// LLM-DataDist over hixl (feature `datadist`): the KV-cache layer inference servers use.
#[cfg(feature = "datadist")]
pub use hixl_datadist as datadist;

/// The etcd directory of engines (entries, the watched cache, publication state).
#[cfg(feature = "directory")]
pub use hixl_directory as directory;
/// The RDMA verbs layer (devices, ports, GIDs, memory regions, queue pairs), for tools that
/// want to look below the engine, such as `hixl info`.
#[cfg(feature = "verbs")]
pub use hixl_verbs as verbs;

/// The user guide's examples, compiled as doctests.
#[doc = include_str!("../../../docs/guide.md")]
#[cfg(doctest)]
pub struct UserGuide;
