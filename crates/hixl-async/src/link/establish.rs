//! Establishing a link: the control connection's handshake and authentication, the memory
//! table, the data connections and the transports' channels.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, RwLock};

use hixl_core::session::{Config, InitiatorSession};
use hixl_core::{Error, Result};
use tokio::sync::mpsc;

use super::control::Control;
use super::{now_ms, Link, TokenLog};
use crate::clock::now;
use crate::context::{EngineConfig, OpsHandle, Regions};
use crate::frame_io::{connect, keep_alive, tune};
use crate::link_state::LinkState;
use crate::transport::{select, LinkHooks, Negotiation, Transport};

/// Kills a half-built link's state when dropped (unless disarmed by taking the state).
struct KillOnDrop(Option<Arc<LinkState>>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            s.kill(Error::Cancelled { what: "a connect" });
        }
    }
}

/// The engine's handles every link is built with.
#[derive(Debug, Clone)]
pub(crate) struct LinkCx {
    pub(crate) config: Arc<EngineConfig>,
    pub(crate) ops: OpsHandle,
    pub(crate) regions: Regions,
    /// The transports, TCP among them (see `transport::select` for the order of the rest).
    pub(crate) transports: Arc<Vec<Arc<dyn Transport>>>,
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
    pub(crate) async fn establish(lcx: &LinkCx, p: LinkParams<'_>) -> Result<Arc<Link>> {
        let remote = p.remote;
        let s = connect(p.addr)
            .await
            .map_err(|e| Error::io(format!("connecting to {remote}"), e))?;
        tune(&s);
        keep_alive(&s, &lcx.config.heartbeat);
        let name: Arc<str> = Arc::from(remote);
        let config = Config {
            engine: p.local_name.to_string(),
            // The caller bounds the whole connect (`hixl.ConnectTimeoutMs`).
            handshake_timeout: None,
            ..lcx.config.session(p.instance)
        };
        let nonce = lcx
            .config
            .nonce()
            .map_err(|e| Error::io("drawing an authentication nonce", e))?;
        let session = InitiatorSession::new(config, remote, now(), nonce);
        let mut control = Control::new(session, s, name.clone());
        let welcomed = control.handshake().await?;
        let (session, offers, table) = (welcomed.session, welcomed.offers, welcomed.table);
        let (incarnation, features) = (welcomed.incarnation, welcomed.features);
        let state = Arc::new(LinkState::new());
        // Until the link is built, an error or a dropped connect future must end the data
        // connections' tasks (and close their sockets): nothing else would.
        let mut unbuilt = KillOnDrop(Some(state.clone()));
        let (tx, rx) = mpsc::unbounded_channel();
        // Data connections are opened when a transfer first needs them (an idle link holds
        // only its control connection, and the transport's channel if it has one).
        let mut cx = Negotiation {
            offers: &offers,
            control: &mut control,
            peer: &name,
            session,
            local_name: p.local_name,
            addr: p.addr,
            streams: p.streams,
            features,
            chunk: p.chunk.max(4096),
            state: &state,
            ops: &lcx.ops,
            sink: &lcx.ops.sink,
            config: &lcx.config,
        };
        let (channels, transport) = select::choose(&lcx.transports, &mut cx).await?;
        tracing::info!(peer = %name, "transport: {transport}");
        let telemetry = Arc::new(crate::telemetry::LinkTelemetry::new(
            name.clone(),
            &transport,
        ));
        let link = Arc::new(Link {
            telemetry,
            name,
            state,
            table: RwLock::new(table),
            driver: tx,
            notifies_waiting: AtomicUsize::new(0),
            work_seen: AtomicBool::new(false),
            channels,
            tokens: Mutex::new(TokenLog::default()),
            last_used: AtomicU64::new(now_ms()),
            transport,
            incarnation,
            ops: lcx.ops.clone(),
            regions: lcx.regions.clone(),
            spin: lcx.config.spin,
        });
        unbuilt.0 = None;
        link.state
            .spawn(super::driver::run(link.clone(), control, rx));
        for ch in &link.channels {
            // Weak: the channel's hooks must not keep its own link alive.
            let l = Arc::downgrade(&link);
            let driver = link.driver.clone();
            ch.start(LinkHooks {
                control: Box::new(move |m| {
                    driver.send(super::driver::Command::Transport(m)).is_ok()
                }),
                state: link.state.clone(),
                on_ack: Box::new(move |seq, status| {
                    if let Some(l) = l.upgrade() {
                        l.notify_acked(seq, status);
                    }
                }),
            });
        }
        Ok(link)
    }
}
