//! LLM-DataDist status codes with their values, and the error every call returns.

use hixl_core::{Error, Status};

/// LLM-DataDist's status codes (`ge::Status`), with HIXL's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum LlmStatus {
    /// Success.
    Success = 0,
    /// A wait for the peer's processing timed out.
    WaitProcTimeout = 0x5010_B001,
    /// The named cache does not exist.
    KvCacheNotExist = 0x5010_B002,
    /// A parameter is invalid.
    ParamInvalid = 0x5010_B005,
    /// The cluster is not linked.
    NotYetLink = 0x5010_B007,
    /// The cluster is already linked.
    AlreadyLink = 0x5010_B008,
    /// Linking failed.
    LinkFailed = 0x5010_B009,
    /// Unlinking failed.
    UnlinkFailed = 0x5010_B00A,
    /// More than 16 clusters in one link or unlink call.
    ClusterNumExceedLimit = 0x5010_B00C,
    /// Links remain.
    ExistLink = 0x5010_B018,
    /// The feature is not enabled.
    FeatureNotEnabled = 0x5010_B019,
    /// A transfer timed out.
    Timeout = 0x5010_B01A,
    /// Out of memory.
    OutOfMemory = 0x5010_B01C,
    /// hixl extension: the pull's lease ended (done, expired, link down or revoked) or never
    /// existed; nothing was moved.
    LeaseEnded = 0x5010_B100,
    /// hixl extension: a live lease holds the blocks (or cache) the call would lease again,
    /// overwrite or unregister.
    LeaseHeld = 0x5010_B101,
    /// Generic failure.
    Failed = 0xFFFF_FFFF,
}

impl LlmStatus {
    /// The numeric value.
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// The constant's name (`LLM_PARAM_INVALID`...).
    pub const fn name(self) -> &'static str {
        match self {
            LlmStatus::Success => "LLM_SUCCESS",
            LlmStatus::WaitProcTimeout => "LLM_WAIT_PROC_TIMEOUT",
            LlmStatus::KvCacheNotExist => "LLM_KV_CACHE_NOT_EXIST",
            LlmStatus::ParamInvalid => "LLM_PARAM_INVALID",
            LlmStatus::NotYetLink => "LLM_NOT_YET_LINK",
            LlmStatus::AlreadyLink => "LLM_ALREADY_LINK",
            LlmStatus::LinkFailed => "LLM_LINK_FAILED",
            LlmStatus::UnlinkFailed => "LLM_UNLINK_FAILED",
            LlmStatus::ClusterNumExceedLimit => "LLM_CLUSTER_NUM_EXCEED_LIMIT",
            LlmStatus::ExistLink => "LLM_EXIST_LINK",
            LlmStatus::FeatureNotEnabled => "LLM_FEATURE_NOT_ENABLED",
            LlmStatus::Timeout => "LLM_TIMEOUT",
            LlmStatus::OutOfMemory => "LLM_OUT_OF_MEMORY",
            LlmStatus::LeaseEnded => "LLM_LEASE_ENDED",
            LlmStatus::LeaseHeld => "LLM_LEASE_HELD",
            LlmStatus::Failed => "LLM_FAILED",
        }
    }
}

impl std::fmt::Display for LlmStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({:#x})", self.name(), self.code())
    }
}

/// One (layer, block) pair of a block transfer that did not land.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockFailure {
    /// Layer at the source.
    pub src_layer: u32,
    /// Layer at the destination.
    pub dst_layer: u32,
    /// Block at the source.
    pub src_block: u64,
    /// Block at the destination (for a pull: the local block to recompute).
    pub dst_block: u64,
}

/// The error of every LLM-DataDist call: a status and what went wrong, naming the value.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{status}: {message}")]
pub struct DataDistError {
    /// The LLM-DataDist status.
    pub status: LlmStatus,
    /// What went wrong.
    pub message: String,
    /// For a block transfer that failed part-way: the (layer, block) pairs that did not land,
    /// sorted. Every pair of the call not listed here landed completely. Empty when the call
    /// failed before moving anything (then nothing landed) or is not a block transfer.
    pub failed: Box<[BlockFailure]>,
    /// The transfer engine's error underneath, if one caused this.
    #[source]
    pub source: Option<Error>,
}

/// Result alias of this crate.
pub type Result<T, E = DataDistError> = std::result::Result<T, E>;

impl DataDistError {
    /// An error with a status and message.
    pub fn new(status: LlmStatus, message: impl Into<String>) -> DataDistError {
        DataDistError {
            status,
            message: message.into(),
            failed: Box::default(),
            source: None,
        }
    }

    /// `LLM_PARAM_INVALID` with a message.
    pub fn param(message: impl Into<String>) -> DataDistError {
        Self::new(LlmStatus::ParamInvalid, message)
    }
}

impl From<Error> for DataDistError {
    fn from(e: Error) -> DataDistError {
        let status = match e.status() {
            Status::ParamInvalid => LlmStatus::ParamInvalid,
            Status::Timeout => LlmStatus::Timeout,
            Status::NotConnected => LlmStatus::NotYetLink,
            Status::AlreadyConnected => LlmStatus::AlreadyLink,
            Status::ResourceExhausted => LlmStatus::OutOfMemory,
            _ => LlmStatus::Failed,
        };
        DataDistError {
            status,
            message: e.to_string(),
            failed: Box::default(),
            source: Some(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_llm_datadist() {
        assert_eq!(LlmStatus::ParamInvalid.code(), 0x5010B005);
        assert_eq!(LlmStatus::NotYetLink.code(), 0x5010B007);
        assert_eq!(LlmStatus::AlreadyLink.code(), 0x5010B008);
        assert_eq!(LlmStatus::Timeout.code(), 0x5010B01A);
        assert_eq!(LlmStatus::ClusterNumExceedLimit.code(), 0x5010B00C);
        assert_eq!(LlmStatus::Failed.code(), 0xFFFFFFFF);
    }

    #[test]
    fn engine_errors_map() {
        let e: DataDistError = Error::NotConnected { peer: "x".into() }.into();
        assert_eq!(e.status, LlmStatus::NotYetLink);
        let e: DataDistError = Error::InvalidTimeout { millis: 0 }.into();
        assert_eq!(e.status, LlmStatus::ParamInvalid);
    }
}
