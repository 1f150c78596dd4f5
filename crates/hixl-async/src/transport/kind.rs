//! Which transport, and why one declines a peer: typed, so that the policy and
//! `Peer::transport` work on values and only the final text is a string.

// Part of the transport interface: hooks and kinds that only some transports use (the
// fabric's, verbs'). A build without one of them leaves those unused; the full build
// (`--features verbs`, the fabric being a default) checks every item here for dead code.
#![cfg_attr(not(all(feature = "fabric", feature = "verbs")), allow(dead_code))]

use std::fmt;

/// A data transport of hixl.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum TransportKind {
    /// Host TCP streams: the path every peer has.
    Tcp,
    /// Same-host shared memory and copy engines.
    Fabric,
    /// RDMA verbs.
    Verbs,
}

impl TransportKind {
    /// Its `hixl.Transport` value.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Fabric => "fabric",
            TransportKind::Verbs => "verbs",
        }
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a transport cannot serve a peer (the connect goes on over the next transport, or
/// fails when `hixl.Transport` forces this one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Declined {
    /// `hixl.Transport` names another transport.
    Off(&'static str),
    /// This engine has no RDMA device (and why).
    NoDevice(String),
    /// The peer offered nothing for it.
    PeerLacks(TransportKind),
    /// The peer is on another host.
    OtherHost,
    /// The peer is on this host, in another mount namespace.
    OtherNamespace,
    /// Setting the channel up failed (what, and the error).
    Setup(String),
    /// The peer refused a queue pair (its reason).
    Refused(String),
    /// A forced transport that would have to send some regions over another path.
    Partial(String),
}

impl fmt::Display for Declined {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Declined::Off(why) => write!(f, "{why}"),
            Declined::NoDevice(why) => write!(f, "this engine has no RDMA device ({why})"),
            Declined::PeerLacks(TransportKind::Fabric) => {
                f.write_str("the peer offers no fabric channel")
            }
            Declined::PeerLacks(TransportKind::Verbs) => {
                f.write_str("the peer offers no verbs (no usable RDMA device there)")
            }
            Declined::PeerLacks(k) => write!(f, "the peer offers no {k}"),
            Declined::OtherHost => f.write_str("the peer is on another host (its boot id differs)"),
            Declined::OtherNamespace => f.write_str(
                "the peer is on this host but in another mount namespace (a container), where our memfds and sockets do not reach",
            ),
            Declined::Setup(what) => f.write_str(what),
            Declined::Partial(what) => f.write_str(what),
            Declined::Refused(reason) => write!(f, "the peer refused a queue pair: {reason}"),
        }
    }
}
