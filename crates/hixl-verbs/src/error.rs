//! The typed error of every verbs call, the work-completion status it may carry, and how both
//! map onto [`hixl_core::Error`] (and so onto one HIXL status).

use std::ffi::CStr;
use std::io;
use std::sync::Arc;

use hixl_core::{Error as CoreError, Status};

use crate::sys;

/// Result alias of this crate.
pub type Result<T, E = VerbsError> = std::result::Result<T, E>;

/// A work completion's status (`enum ibv_wc_status`), kept as the device reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WcStatus(pub u32);

impl WcStatus {
    /// `IBV_WC_SUCCESS`.
    pub const SUCCESS: WcStatus = WcStatus(sys::ibv_wc_status::IBV_WC_SUCCESS);
    /// `IBV_WC_LOC_PROT_ERR`: the local range is not inside the MR named by the lkey.
    pub const LOC_PROT_ERR: WcStatus = WcStatus(sys::ibv_wc_status::IBV_WC_LOC_PROT_ERR);
    /// `IBV_WC_WR_FLUSH_ERR`: the QP was already in the error state; the WR never ran.
    pub const WR_FLUSH_ERR: WcStatus = WcStatus(sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR);
    /// `IBV_WC_REM_ACCESS_ERR`: the peer's device refused the rkey, range or access.
    pub const REM_ACCESS_ERR: WcStatus = WcStatus(sys::ibv_wc_status::IBV_WC_REM_ACCESS_ERR);
    /// `IBV_WC_REM_INV_REQ_ERR`: the peer's device found the request invalid (e.g. too long).
    pub const REM_INV_REQ_ERR: WcStatus = WcStatus(sys::ibv_wc_status::IBV_WC_REM_INV_REQ_ERR);
    /// `IBV_WC_RETRY_EXC_ERR`: the peer stopped acknowledging (dead process, cut link).
    pub const RETRY_EXC_ERR: WcStatus = WcStatus(sys::ibv_wc_status::IBV_WC_RETRY_EXC_ERR);
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: the peer was never ready to receive.
    pub const RNR_RETRY_EXC_ERR: WcStatus = WcStatus(sys::ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR);

    /// libibverbs' description (`ibv_wc_status_str`), e.g. `"remote access error"`.
    pub fn as_str(self) -> &'static str {
        // SAFETY: ibv_wc_status_str accepts any value and returns a pointer to a static,
        // NUL-terminated string ("unknown" for values it does not know).
        let p = unsafe { sys::ibv_wc_status_str(self.0) };
        if p.is_null() {
            return "unknown";
        }
        // SAFETY: non-null, NUL-terminated and static (see above).
        unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("unknown")
    }

    /// Whether the WR was flushed because the QP had already failed.
    pub fn is_flush(self) -> bool {
        self == WcStatus::WR_FLUSH_ERR
    }
}

impl std::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (status {})", self.as_str(), self.0)
    }
}

/// Everything that can go wrong in the verbs layer.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// libibverbs lists no RDMA device (no kernel support, no provider, or none configured).
    #[error("no RDMA device found ({reason})")]
    NoDevice {
        /// What libibverbs reported.
        reason: String,
    },
    /// No device of that name.
    #[error("RDMA device {name:?} not found (devices: {available})")]
    DeviceNotFound {
        /// The name asked for.
        name: String,
        /// The devices that exist, comma-separated.
        available: String,
    },
    /// Devices exist but none has an active port.
    #[error("no RDMA device has an active port (devices: {available})")]
    NoActiveDevice {
        /// The devices that exist, with their port states.
        available: String,
    },
    /// A verb failed with an errno.
    #[error("{call} on {device}: {source}")]
    Verb {
        /// The verb (`ibv_reg_mr`, `ibv_modify_qp(RTR)`, ...).
        call: &'static str,
        /// The device.
        device: String,
        /// The OS error.
        source: Arc<io::Error>,
    },
    /// A parameter outside what the device or the call accepts.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// Which parameter.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A QP endpoint received from a peer is malformed.
    #[error("malformed QP endpoint from the peer: {reason}")]
    BadEndpoint {
        /// What is wrong with it.
        reason: String,
    },
    /// The send queue has no room for the chain.
    #[error(
        "send queue of qp {qpn:#x} is full: {outstanding} of {capacity} work requests \
         outstanding, the chain needs {needed}"
    )]
    SendQueueFull {
        /// The QP.
        qpn: u32,
        /// WRs posted and not yet completed (polled).
        outstanding: usize,
        /// WRs the chain needs after splitting.
        needed: usize,
        /// The send queue's depth.
        capacity: usize,
    },
    /// The completion queue cannot take another QP's worst-case completions.
    #[error("completion queue holds {capacity} entries, {reserved} already reserved, {needed} more needed")]
    CompletionQueueFull {
        /// CQ entries.
        capacity: u32,
        /// Entries reserved by QPs already attached.
        reserved: u32,
        /// Entries the new QP needs.
        needed: u32,
    },
    /// `ibv_post_send` refused part of a chain.
    #[error(
        "posting to qp {qpn:#x} failed at work request {failed_wr} of {total}: {source}; \
         the first {reported_ops} ops still complete (with errors)"
    )]
    Post {
        /// The QP.
        qpn: u32,
        /// Index (after splitting) of the first WR the device did not take.
        failed_wr: usize,
        /// WRs in the chain.
        total: usize,
        /// How many of the call's ops (from the front) will still get one completion each.
        reported_ops: usize,
        /// The errno `ibv_post_send` returned.
        source: Arc<io::Error>,
    },
    /// A work request completed with an error status.
    #[error("work request on qp {qpn:#x} failed: {status}, vendor error {vendor_err:#x}")]
    Completion {
        /// The QP.
        qpn: u32,
        /// The status.
        status: WcStatus,
        /// The provider's vendor error code.
        vendor_err: u32,
    },
}

impl VerbsError {
    pub(crate) fn verb(call: &'static str, device: &str, source: io::Error) -> VerbsError {
        VerbsError::Verb {
            call,
            device: device.to_owned(),
            source: Arc::new(source),
        }
    }

    /// The completion status, when this is a completion error.
    pub fn wc_status(&self) -> Option<WcStatus> {
        match self {
            VerbsError::Completion { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The HIXL status this error maps onto (the status of the [`hixl_core::Error`] it becomes).
    pub fn status(&self) -> Status {
        CoreError::from(self.clone()).status()
    }
}

/// Names the peer behind a QP in errors: the engine sets a label per QP
/// ([`crate::QueuePair::set_peer_name`]); otherwise `"qp 0x…"`. The completion itself
/// ([`VerbsError::Completion`]) is the source of the error, except for a remote access error,
/// which the peer's device answered (a refusal, as [`CoreError::Remote`]).
pub(crate) fn completion_error(
    peer: &str,
    qpn: u32,
    status: WcStatus,
    vendor_err: u32,
) -> CoreError {
    let source = VerbsError::Completion {
        qpn,
        status,
        vendor_err,
    };
    match status {
        WcStatus::REM_ACCESS_ERR => CoreError::Remote {
            peer: peer.to_owned(),
            status: Status::ParamInvalid,
            message: format!(
                "{source} (the peer's device refused the rkey, the range or the access; the QP \
                 is now in the error state)"
            ),
        },
        WcStatus::LOC_PROT_ERR => CoreError::Device {
            what: "the local range is not inside the memory region of the lkey",
            source: Arc::new(source),
        },
        WcStatus::RETRY_EXC_ERR => CoreError::transport(
            peer,
            "RDMA work request (the peer stopped acknowledging: process gone or link cut)",
            source,
        ),
        _ => CoreError::transport(peer, "RDMA work request", source),
    }
}

impl From<VerbsError> for CoreError {
    fn from(e: VerbsError) -> CoreError {
        match e {
            VerbsError::NoDevice { .. }
            | VerbsError::DeviceNotFound { .. }
            | VerbsError::NoActiveDevice { .. } => CoreError::Unsupported {
                what: e.to_string(),
            },
            VerbsError::Verb {
                call,
                device,
                source,
            } => CoreError::Io {
                context: format!("{call} on {device}"),
                source,
            },
            VerbsError::Invalid { .. } | VerbsError::BadEndpoint { .. } => CoreError::Device {
                what: "RDMA verbs",
                source: Arc::new(e),
            },
            VerbsError::SendQueueFull { .. } | VerbsError::CompletionQueueFull { .. } => {
                CoreError::ResourceExhausted {
                    what: e.to_string(),
                }
            }
            VerbsError::Post { qpn, .. } => {
                CoreError::transport(&format!("qp {qpn:#x}"), "ibv_post_send", e)
            }
            VerbsError::Completion {
                qpn,
                status,
                vendor_err,
            } => completion_error(&format!("qp {qpn:#x}"), qpn, status, vendor_err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_strings_come_from_libibverbs() {
        assert_eq!(WcStatus::SUCCESS.as_str(), "success");
        assert_eq!(WcStatus::REM_ACCESS_ERR.as_str(), "remote access error");
        assert_eq!(
            WcStatus::RETRY_EXC_ERR.as_str(),
            "transport retry counter exceeded"
        );
        assert!(WcStatus::WR_FLUSH_ERR.is_flush());
        assert_eq!(WcStatus(9999).as_str(), "unknown");
    }

    #[test]
    fn completion_errors_map_to_one_status() {
        let e = completion_error("p", 7, WcStatus::REM_ACCESS_ERR, 0);
        assert_eq!(e.status(), Status::ParamInvalid);
        assert!(e.to_string().contains("remote access error"), "{e}");
        let e = completion_error("p", 7, WcStatus::RETRY_EXC_ERR, 0);
        assert_eq!(e.status(), Status::Failed);
        assert!(e.is_link_lost());
        assert!(e.to_string().contains("retry counter exceeded"), "{e}");
        let src = e.layer_source().expect("the completion is the source");
        assert!(
            matches!(
                src.downcast_ref::<VerbsError>().map(VerbsError::wc_status),
                Some(Some(WcStatus::RETRY_EXC_ERR))
            ),
            "{src:?}"
        );
        let e = completion_error("p", 7, WcStatus::LOC_PROT_ERR, 0);
        assert_eq!(e.status(), Status::ParamInvalid);
        assert!(e.to_string().contains("lkey"), "{e}");
        let full = VerbsError::SendQueueFull {
            qpn: 1,
            outstanding: 1,
            needed: 2,
            capacity: 2,
        };
        assert_eq!(full.status(), Status::ResourceExhausted);
        assert_eq!(
            VerbsError::NoDevice { reason: "x".into() }.status(),
            Status::Unsupported
        );
    }
}
