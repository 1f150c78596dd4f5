//! Which HIXL status each [`Error`] maps onto, and which errors say a link broke.

use crate::error::Error;
use crate::status::Status;

impl Error {
    /// The HIXL status this error maps onto.
    pub fn status(&self) -> Status {
        match self {
            Error::NotInitialized
            | Error::ShutDown { .. }
            | Error::Cancelled { .. }
            | Error::Internal { .. } => Status::Failed,
            Error::UnknownOption { .. }
            | Error::InvalidOption { .. }
            | Error::InvalidAddress { .. }
            | Error::InvalidTimeout { .. }
            | Error::NullAddress { .. }
            | Error::ZeroLength { .. }
            | Error::RangeOverflow { .. }
            | Error::Overlap { .. }
            | Error::LocalUnregistered { .. }
            | Error::RemoteOutOfBounds { .. }
            | Error::AccessDenied { .. }
            | Error::ConnectToSelf { .. }
            | Error::NotifyTooLong { .. }
            | Error::UnknownRequest { .. }
            | Error::TooLarge { .. }
            | Error::OpTooLarge { .. }
            | Error::OutsideRegion { .. }
            | Error::OffsetOutOfBounds { .. }
            | Error::Deregistered { .. }
            | Error::UnknownRkey { .. }
            | Error::InvalidFeature { .. }
            | Error::InsideRuntime { .. }
            | Error::NoRuntime { .. }
            | Error::TaskEnded { .. }
            | Error::AlreadyFinished { .. }
            | Error::Device { .. }
            | Error::InvalidParam { .. }
            | Error::NameTaken { .. }
            | Error::UnknownName { .. }
            | Error::NoDescriptors
            | Error::SessionOutOfPhase { .. }
            | Error::SessionNotPending { .. }
            | Error::AlreadyRevoking { .. }
            | Error::SessionWrongMessage { .. }
            | Error::Unsendable { .. } => Status::ParamInvalid,
            Error::Unsupported { .. } | Error::WireVersion { .. } => Status::Unsupported,
            Error::NotConnected { .. } => Status::NotConnected,
            Error::AlreadyConnected { .. } => Status::AlreadyConnected,
            Error::Timeout { .. } => Status::Timeout,
            Error::NotifyQueueFull { .. } | Error::ResourceExhausted { .. } => {
                Status::ResourceExhausted
            }
            Error::PeerLost { .. }
            | Error::ConnectionLost { .. }
            | Error::Transport { .. }
            | Error::HeartbeatLost { .. }
            | Error::Evicted { .. }
            | Error::RevokeUnacknowledged { .. }
            | Error::Protocol { .. }
            | Error::Io { .. }
            | Error::AuthFailed { .. }
            | Error::Directory { .. } => Status::Failed,
            Error::Remote { status, .. } => *status,
        }
    }

    /// Whether this error says the link to a peer broke (any of [`Error::PeerLost`],
    /// [`Error::ConnectionLost`], [`Error::Transport`], [`Error::HeartbeatLost`],
    /// [`Error::Evicted`], [`Error::RevokeUnacknowledged`]): the peer may be reconnected.
    pub fn is_link_lost(&self) -> bool {
        matches!(
            self,
            Error::PeerLost { .. }
                | Error::ConnectionLost { .. }
                | Error::Transport { .. }
                | Error::HeartbeatLost { .. }
                | Error::Evicted { .. }
                | Error::RevokeUnacknowledged { .. }
        )
    }
}
