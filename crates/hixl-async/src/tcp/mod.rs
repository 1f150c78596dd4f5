//! TCP data path: the link's TCP channel (`channel.rs`, the [`crate::transport::PeerChannel`]
//! every link has), the initiator connections that post parts and collect answers, and the
//! target service that validates each request and moves bytes between socket and registered
//! memory.

pub(crate) mod channel;
mod gather;
pub(crate) mod initiator;
pub(crate) mod target;
pub(crate) mod transport;
pub(crate) mod uring;
