//! The initiator's control connection during the handshake: its sans-io
//! [`InitiatorSession`] and the socket it drives. The handshake (hello, authentication,
//! offers, memory table) and the transports' negotiations run here, before the link's driver
//! takes the session over.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::BytesMut;
use hixl_core::session::{Event, InitiatorSession};
use hixl_core::wire::Message;
use hixl_core::{Error, RemoteRegion, Result};
use tokio::net::TcpStream;

use crate::clock::{now, sleep_until};
use crate::frame_io::{read_frame, write_frame};
use crate::transport::{BoxFuture, ControlExchange};

/// A control connection being set up: its session and its socket.
pub(super) struct Control {
    pub(super) session: InitiatorSession,
    pub(super) stream: TcpStream,
    pub(super) buf: BytesMut,
    pub(super) peer: Arc<str>,
    /// Events of the session the handshake leaves for the driver (revocations, device keys,
    /// table updates).
    pub(super) later: VecDeque<Event>,
}

/// What the handshake established.
pub(super) struct Welcomed {
    pub(super) session: u64,
    /// The target engine's incarnation.
    pub(super) incarnation: u64,
    /// The optional parts of the protocol both ends speak (`hixl_core::wire::feature`).
    pub(super) features: u64,
    pub(super) offers: Vec<Message>,
    pub(super) table: Vec<RemoteRegion>,
}

impl Control {
    pub(super) fn new(session: InitiatorSession, stream: TcpStream, peer: Arc<str>) -> Control {
        Control {
            session,
            stream,
            buf: BytesMut::with_capacity(crate::frame_io::READ_ROOM),
            peer,
            later: VecDeque::new(),
        }
    }

    /// Runs the handshake up to the first memory table.
    ///
    /// # Errors
    /// The session's cause: a refusal, an authentication failure, a protocol violation, the
    /// connection's loss.
    pub(super) async fn handshake(&mut self) -> Result<Welcomed> {
        let mut session = None;
        let (mut incarnation, mut features) = (0, 0);
        let mut offers = Vec::new();
        loop {
            while let Some(e) = self.session.poll_event() {
                match e {
                    Event::Welcomed {
                        session: s,
                        incarnation: i,
                        features: f,
                        ..
                    } => (session, incarnation, features) = (Some(s), i, f),
                    Event::TransportOffer(m) => offers.push(m),
                    Event::Table(table) => {
                        let session = session.ok_or(Error::Internal {
                            what: "a memory table before the welcome",
                        })?;
                        return Ok(Welcomed {
                            session,
                            incarnation,
                            features,
                            offers,
                            table,
                        });
                    }
                    Event::Closed(e) => return Err(e),
                    Event::Authenticated => {}
                    e => self.later.push_back(e),
                }
            }
            self.turn().await?;
        }
    }

    /// Writes what the session has to send, then waits for one frame or the session's next
    /// deadline and hands it in.
    ///
    /// # Errors
    /// The session's cause once it has ended.
    async fn turn(&mut self) -> Result<()> {
        self.flush().await;
        if let Some(e) = self.session.error() {
            return Err(e.clone());
        }
        let deadline = self.session.poll_timeout();
        tokio::select! {
            m = read_frame(&mut self.stream, &mut self.buf, &self.peer) => match m {
                Ok(m) => {
                    let _ = self.session.handle_frame(now(), m);
                }
                Err(e) => self.session.connection_lost(e),
            },
            _ = sleep_until(deadline) => self.session.handle_timeout(now()),
        }
        // A last frame of a failed handshake (the empty answer to a challenge) still goes.
        self.flush().await;
        Ok(())
    }

    /// Writes every frame the session queued; a write error ends the session.
    async fn flush(&mut self) {
        while let Some(m) = self.session.poll_transmit() {
            if let Err(e) = write_frame(&mut self.stream, &m, &self.peer).await {
                self.session.connection_lost(e);
            }
        }
    }
}

impl ControlExchange for Control {
    fn send(&mut self, m: Message) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            self.session.send_transport(m)?;
            self.flush().await;
            match self.session.error() {
                Some(e) => Err(e.clone()),
                None => Ok(()),
            }
        })
    }

    fn recv(&mut self) -> BoxFuture<'_, Result<Message>> {
        Box::pin(async move {
            loop {
                while let Some(e) = self.session.poll_event() {
                    match e {
                        Event::TransportMessage(m) => return Ok(m),
                        Event::Closed(e) => return Err(e),
                        e => self.later.push_back(e),
                    }
                }
                self.turn().await?;
            }
        })
    }
}
