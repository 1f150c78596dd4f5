//! Establishing a link: the control connection's handshake and authentication, the memory
//! table, the data connections and the transports' channels.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};

use bytes::BytesMut;
use hixl_core::wire::{Channel, Message};
use hixl_core::{Error, Result, Token};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::control::{control_reader, probe};
use super::{now_ms, refusal, Link, TokenLog};
use crate::context::Shared;
use crate::frame_io::{read_frame, tune, unexpected, write_frame, write_frames};
use crate::link_state::LinkState;
use crate::tcp::channel::TcpChannel;
use crate::transport::{select, sort_table, LinkHooks, Negotiation, PeerChannel};

/// The initiator's half of the challenge-response of [`hixl_core::auth`]: answers a
/// challenge and checks the target's proof, or refuses a target that does not authenticate
/// when we have a secret. Returns the frame that follows (the `Welcome`, or a refusal).
async fn authenticate(
    shared: &Shared,
    s: &mut TcpStream,
    buf: &mut BytesMut,
    remote: &str,
    first: Message,
) -> Result<Message> {
    use hixl_core::auth::nonce;
    let failed = |reason: String| Error::AuthFailed {
        peer: remote.to_string(),
        reason,
    };
    match (first, &shared.auth) {
        (Message::AuthChallenge { nonce: nt }, Some(secret)) => {
            let ni = nonce().map_err(|e| Error::io("drawing an authentication nonce", e))?;
            let answer = Message::AuthResponse {
                nonce: ni.to_vec(),
                mac: secret.initiator_mac(&nt, &ni).to_vec(),
            };
            write_frame(s, &answer, remote).await?;
            match read_frame(s, buf, remote).await? {
                Message::AuthProof { mac } if secret.verify_target(&nt, &ni, &mac) => {
                    read_frame(s, buf, remote).await
                }
                Message::AuthProof { .. } => Err(failed(
                    "the peer's proof does not match our shared secret: it does not know it".into(),
                )),
                Message::Refuse { reason, .. } => Err(failed(reason)),
                m => Err(unexpected(remote, &m, "authentication proof")),
            }
        }
        (Message::AuthChallenge { .. }, None) => {
            // Tell the target why, so that its log names the problem too.
            let none = Message::AuthResponse {
                nonce: Vec::new(),
                mac: Vec::new(),
            };
            let _ = write_frame(s, &none, remote).await;
            Err(failed(
                "the peer requires a shared secret and this engine has none (set hixl.AuthSecret or HIXL_AUTH_SECRET)".into(),
            ))
        }
        (Message::Welcome { .. }, Some(_)) => Err(failed(
            "the peer did not authenticate itself (it has no shared secret configured); its memory table is not accepted".into(),
        )),
        (m, _) => Ok(m),
    }
}

/// Kills a half-built link's state when dropped (unless disarmed by taking the state).
struct KillOnDrop(Option<Arc<LinkState>>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            s.kill(Error::Cancelled { what: "a connect" });
        }
    }
}

/// Connection parameters of one link.
pub(crate) struct LinkParams<'a> {
    pub(crate) local_name: &'a str,
    pub(crate) instance: u64,
    pub(crate) remote: &'a str,
    pub(crate) addr: SocketAddr,
    pub(crate) streams: usize,
    pub(crate) chunk: u64,
}

impl Link {
    /// Connects the control channel, fetches the memory table and opens the data connections.
    pub(crate) async fn establish(shared: Arc<Shared>, p: LinkParams<'_>) -> Result<Arc<Link>> {
        let remote = p.remote;
        let mut s = TcpStream::connect(p.addr)
            .await
            .map_err(|e| Error::io(format!("connecting to {remote}"), e))?;
        tune(&s);
        let hello = Message::Hello {
            engine: p.local_name.to_string(),
            channel: Channel::Control,
            session: p.instance,
        };
        write_frame(&mut s, &hello, remote).await?;
        let mut buf = BytesMut::with_capacity(4096);
        let first = read_frame(&mut s, &mut buf, remote).await?;
        let first = authenticate(&shared, &mut s, &mut buf, remote, first).await?;
        let session = match first {
            Message::Welcome { session, .. } => session,
            Message::Refuse { status, reason } => return Err(refusal(remote, status, reason)),
            m => return Err(unexpected(remote, &m, "welcome")),
        };
        // The transports the peer offers come before its memory table.
        let mut offers = Vec::new();
        let mut table = loop {
            match read_frame(&mut s, &mut buf, remote).await? {
                Message::MemTable(v) => break sort_table(v),
                m @ (Message::FabricInfo { .. } | Message::VerbsInfo { .. }) => offers.push(m),
                m => return Err(unexpected(remote, &m, "memory table")),
            }
        };
        let mut data = Vec::with_capacity(p.streams);
        for _ in 0..p.streams.max(1) {
            let mut d = TcpStream::connect(p.addr)
                .await
                .map_err(|e| Error::io(format!("opening data connection to {remote}"), e))?;
            tune(&d);
            let hello = Message::Hello {
                engine: p.local_name.to_string(),
                channel: Channel::Data,
                session,
            };
            write_frame(&mut d, &hello, remote).await?;
            let mut b = BytesMut::new();
            match read_frame(&mut d, &mut b, remote).await? {
                Message::Welcome { .. } if b.is_empty() => {}
                Message::Refuse { status, reason } => return Err(refusal(remote, status, reason)),
                m => return Err(unexpected(remote, &m, "welcome on a data connection")),
            }
            data.push(d);
        }
        let name: Arc<str> = Arc::from(remote);
        let state = Arc::new(LinkState::new());
        // Until the link is built, an error or a dropped connect future must end the data
        // connections' tasks (and close their sockets): nothing else would.
        let mut unbuilt = KillOnDrop(Some(state.clone()));
        let tcp: Arc<dyn PeerChannel> = Arc::new(TcpChannel::spawn(
            data,
            name.clone(),
            shared.clone(),
            state.clone(),
            p.chunk.max(4096),
        ));
        let (tx, rx) = mpsc::unbounded_channel();
        let mut cx = Negotiation {
            offers: &offers,
            control: &mut s,
            buf: &mut buf,
            table: &mut table,
            peer: &name,
            session,
            local_name: p.local_name,
            chunk: p.chunk.max(4096),
            state: &state,
            ops: &shared.ops,
            sink: &shared.sink,
        };
        let (channels, transport) = select::choose(&shared.transports, &mut cx, tcp).await?;
        tracing::info!(peer = %name, "transport: {transport}");
        let link = Arc::new(Link {
            name,
            state,
            table: RwLock::new(table),
            control: tx,
            notify_seq: AtomicU64::new(1),
            notify_waiters: Mutex::new(HashMap::new()),
            channels,
            ops: Mutex::new(TokenLog::default()),
            last_used: AtomicU64::new(now_ms()),
            transport,
            last_rx: AtomicU64::new(0),
            born: std::time::Instant::now(),
        });
        unbuilt.0 = None;
        let (r, w) = s.into_split();
        tokio::spawn(write_frames(w, rx, link.state.clone(), link.name.clone()));
        tokio::spawn(control_reader(r, buf, link.clone()));
        tokio::spawn(probe(link.clone(), shared.heartbeat));
        if !link.channels.is_empty() {
            // The link's death reaches every channel: work not yet started fails with the
            // link's cause, the devices flush the rest.
            let l = link.clone();
            tokio::spawn(async move {
                l.state.dead().await;
                let tokens: std::collections::HashSet<Token> = l
                    .ops
                    .lock()
                    .map(|t| t.tokens.iter().copied().collect())
                    .unwrap_or_default();
                let e = l.lost("link closed");
                for ch in &l.channels {
                    ch.close(&e, &tokens);
                }
            });
        }
        for ch in &link.channels {
            let l = link.clone();
            ch.start(LinkHooks {
                state: link.state.clone(),
                on_ack: Box::new(move |seq, status| l.notify_acked(seq, status)),
            });
        }
        Ok(link)
    }
}
