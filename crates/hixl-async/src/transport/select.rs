//! The transport policy, in one place: each transport of the engine, in order (fabric, then
//! verbs: a same-host memcpy beats a loop through the NIC), is asked to open its channel to
//! the peer; the first that can serves it. A transport that `hixl.Transport` forces and that
//! cannot serve the peer fails the connect with its reason, never a silent fallback. TCP,
//! the transport that reaches every peer, always opens its channel, which comes last: it
//! carries what the chosen channel does not reach (a region without a device key or a
//! mapping), and everything when none serves.

use std::sync::Arc;

use hixl_core::{Error, Result};

use super::{Declined, Negotiation, PeerChannel, Transport, TransportKind};

/// The link's channels in the order a descriptor tries them (the chosen one, if any, then
/// `tcp`, which always reaches), and what `Peer::transport` says: the chosen channel's
/// description, or `tcp (why not the first transport); not <kind>: why not the next; ...`.
pub(crate) async fn choose(
    transports: &[Arc<dyn Transport>],
    cx: &mut Negotiation<'_>,
) -> Result<(Vec<Arc<dyn PeerChannel>>, String)> {
    let is_tcp = |t: &&Arc<dyn Transport>| t.kind() == TransportKind::Tcp;
    let no_tcp = Error::Internal {
        what: "a build without the TCP transport",
    };
    let tcp = transports.iter().find(is_tcp).ok_or(no_tcp)?;
    let tcp = match tcp.connect(cx).await? {
        Ok(o) => o.channel,
        Err(_) => {
            return Err(Error::Internal {
                what: "the TCP transport declined a peer",
            })
        }
    };
    let mut declined: Vec<(TransportKind, Declined)> = Vec::new();
    for t in transports.iter().filter(|t| !is_tcp(t)) {
        match t.connect(cx).await? {
            Ok(o) => return Ok((vec![o.channel, tcp], o.describe)),
            Err(why) if t.forced() => {
                return Err(Error::Unsupported {
                    what: format!(
                        "hixl.Transport={}, but {} cannot use it: {why}",
                        t.kind(),
                        cx.peer
                    ),
                })
            }
            Err(why) => declined.push((t.kind(), why)),
        }
    }
    Ok((vec![tcp], describe_tcp(&declined)))
}

fn describe_tcp(declined: &[(TransportKind, Declined)]) -> String {
    let mut it = declined.iter();
    let mut s = match it.next() {
        Some((_, why)) => format!("{} ({why})", TransportKind::Tcp),
        None => format!("{} (this build has no other transport)", TransportKind::Tcp),
    };
    for (kind, why) in it {
        s.push_str(&format!("; not {kind}: {why}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::{describe_tcp, Declined, TransportKind};

    #[test]
    fn tcp_says_why_each_transport_declined() {
        assert_eq!(
            describe_tcp(&[
                (TransportKind::Fabric, Declined::OtherHost),
                (
                    TransportKind::Fabric,
                    Declined::PeerLacks(TransportKind::Fabric)
                )
            ]),
            "tcp (the peer is on another host (its boot id differs)); not fabric: the peer offers no fabric channel"
        );
        assert_eq!(describe_tcp(&[]), "tcp (this build has no other transport)");
    }
}
