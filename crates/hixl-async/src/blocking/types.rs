//! Plain types of the blocking facade: request handles, query arguments and results, features.

use hixl_core::{RegionId, TransferStatus};

/// Handle of a registered memory region (HIXL `MemHandle`), returned by
/// [`Hixl::register_mem`](super::Hixl::register_mem).
pub type MemHandle = RegionId;

/// At most this many asynchronous requests may be outstanding (submitted and not yet freed by
/// a terminal status query) per [`Hixl`](super::Hixl), as in HIXL's CS engine.
pub const MAX_OUTSTANDING_REQUESTS: usize = 4096;

/// `GetCapability` value of a supported feature (HIXL `FEATURE_SUPPORTED`).
pub const FEATURE_SUPPORTED: i32 = 1;
/// `GetCapability` value of an unsupported or unknown feature (HIXL `FEATURE_NOT_SUPPORTED`).
pub const FEATURE_NOT_SUPPORTED: i32 = 0;

/// Handle of an asynchronous transfer (HIXL `TransferReq`), returned by
/// [`Hixl::transfer_async`](super::Hixl::transfer_async).
///
/// Handles are numbered from 1 in submission order and never reused by one [`Hixl`](super::Hixl)
/// (even across `finalize` and a new `initialize`). The field is public so that callers can
/// store the number (as HIXL's Python binding hands out an `int`) and rebuild the handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TransferReq(pub u64);

/// Arguments of [`Hixl::get_all_transfer_status`](super::Hixl::get_all_transfer_status)
/// (HIXL `GetTransferStatusArgs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GetTransferStatusArgs {
    /// Return at most this many results (default `u32::MAX`; 0 returns nothing).
    pub max_query_count: u32,
    /// Leave requests that are still [`TransferStatus::Waiting`] out of the results (they
    /// neither appear nor count against `max_query_count`).
    pub skip_waiting: bool,
}

impl Default for GetTransferStatusArgs {
    fn default() -> Self {
        GetTransferStatusArgs {
            max_query_count: u32::MAX,
            skip_waiting: false,
        }
    }
}

/// One entry returned by
/// [`Hixl::get_all_transfer_status`](super::Hixl::get_all_transfer_status) (HIXL
/// `TransferResult`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferResult {
    /// The request.
    pub req: TransferReq,
    /// The value given to [`Hixl::transfer_async`](super::Hixl::transfer_async), echoed back.
    pub user_data: u64,
    /// Its status; a terminal one means the request has now been freed.
    pub status: TransferStatus,
}

/// Features queried with [`Hixl::get_capability`](super::Hixl::get_capability) (HIXL
/// `FeatureType`; new values are only ever appended).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum FeatureType {
    /// Transfers connect lazily, so `connect` can be skipped (HIXL `AUTO_CONNECT = 0`).
    AutoConnect = 0,
    /// Client/server communication (HIXL `CLIENT_SERVER_COMM = 1`).
    ClientServerComm = 1,
}

impl FeatureType {
    /// HIXL's numeric value.
    pub const fn code(self) -> i32 {
        self as i32
    }
}

impl From<FeatureType> for i32 {
    fn from(f: FeatureType) -> i32 {
        f.code()
    }
}
