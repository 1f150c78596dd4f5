//! TCP as a transport like the others: every link's path of last resort. On the initiator's
//! side it opens the link's TCP channel (data connections opened lazily, on the first
//! transfer); on the target's it serves the data connections initiators open for their
//! sessions.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::BytesMut;
use hixl_core::wire::{feature, Channel, Message, FEATURES};
use hixl_core::{Error, Result, Status};
use tokio::net::TcpStream;

use super::channel::{Split, TcpChannel};
use super::initiator::DataOpener;
use crate::frame_io::{connect, read_frame, tune, unexpected, write_frame};
use crate::transport::target::TargetCx;
use crate::transport::{
    Accepted, BoxFuture, Declined, Negotiation, Opened, Transport, TransportKind,
};

/// The TCP transport: stateless, its channels and connections hold what they need.
#[derive(Debug)]
pub(crate) struct TcpTransport;

impl Transport for TcpTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    /// Never: `hixl.Transport=tcp` turns the others off, and TCP reaches every peer.
    fn forced(&self) -> bool {
        false
    }

    /// The link's TCP channel: `hixl.TcpStreams` data connections of the session, each
    /// opened when a transfer first needs it; strided requests only if both ends speak them.
    fn connect<'a>(
        &'a self,
        cx: &'a mut Negotiation<'_>,
    ) -> BoxFuture<'a, Result<std::result::Result<Opened, Declined>>> {
        let (addr, session) = (cx.addr, cx.session);
        let (local, peer) = (Arc::<str>::from(cx.local_name), cx.peer.clone());
        let open: DataOpener = Arc::new(move || {
            let (local, peer) = (local.clone(), peer.clone());
            Box::pin(async move { open_data(addr, &local, session, &peer).await })
        });
        let channel = TcpChannel::spawn(
            cx.streams.max(1),
            open,
            cx.peer.clone(),
            cx.ops.clone(),
            cx.state.clone(),
            Split {
                chunk: cx.chunk,
                strided: cx.features & feature::STRIDED != 0,
            },
            cx.config,
        );
        Box::pin(async move {
            Ok(Ok(Opened {
                channel: Arc::new(channel),
                describe: TransportKind::Tcp.to_string(),
            }))
        })
    }

    fn takes(&self, channel: Channel) -> bool {
        channel == Channel::Data
    }

    /// A data connection of a session: welcomed, then served (a task of the session's, which
    /// its driver joins) until the session or the connection ends.
    fn serve<'a>(&'a self, cx: &'a TargetCx, c: Accepted<'a>) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let Accepted {
                mut stream,
                buf,
                from,
                engine,
                session,
                config,
                instance,
            } = c;
            let sess = match cx.sessions.get(session) {
                Some(x) if *x.peer == *engine && buf.is_empty() => x,
                _ => {
                    let reason = format!("no session {session:#x} for engine {engine}");
                    tracing::info!(peer = %from, "refusing connection: {reason}");
                    let refuse = Message::Refuse {
                        status: Status::NotConnected.code(),
                        reason,
                    };
                    let _ = write_frame(&mut stream, &refuse, &from).await;
                    return;
                }
            };
            let welcome = Message::Welcome {
                engine: config.name.clone(),
                session,
                incarnation: instance,
                features: FEATURES,
            };
            if write_frame(&mut stream, &welcome, &from).await.is_err() {
                return;
            }
            let (st, regions, spin) = (sess.state.clone(), cx.regions.clone(), config.clone());
            let served = cx.served.peer(&sess.peer);
            st.spawn(async move {
                tokio::select! {
                    _ = super::target::serve(stream, sess.peer.clone(), regions, spin, served) => {}
                    _ = sess.state.dead() => {}
                }
            });
        })
    }
}

/// Opens one data connection of a link's session: connect, `Hello` on the data channel,
/// the peer's `Welcome`.
async fn open_data(addr: SocketAddr, local: &str, session: u64, remote: &str) -> Result<TcpStream> {
    let mut d = connect(addr)
        .await
        .map_err(|e| Error::io(format!("opening data connection to {remote}"), e))?;
    tune(&d);
    let hello = Message::Hello {
        engine: local.to_string(),
        channel: Channel::Data,
        session,
        features: FEATURES,
    };
    write_frame(&mut d, &hello, remote).await?;
    let mut b = BytesMut::new();
    match read_frame(&mut d, &mut b, remote).await? {
        Message::Welcome { .. } if b.is_empty() => Ok(d),
        Message::Refuse { status, reason } => Err(Error::Remote {
            peer: remote.to_string(),
            status: Status::from_code(status).unwrap_or(Status::Failed),
            message: reason,
        }),
        m => Err(unexpected(remote, &m, "welcome on a data connection")),
    }
}
