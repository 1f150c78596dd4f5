//! The link table: connect, disconnect, peer lookup, AutoConnect and transfers by name.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hixl_core::{Error, OpDesc, Result, TransferOp};

use super::{http_probe, Engine, LinkSlot};
use crate::addr::{engine_name, EngineAddr};
use crate::link::{Link, LinkParams, Peer};
use crate::sync::lock;
use crate::transfer::Transfer;

/// AutoConnect and the channel pool connect with HIXL's fixed timeout (`kAutoConnectTimeout`).
const AUTO_CONNECT_TIMEOUT: Duration = Duration::from_millis(3000);

/// Removes a `Connecting` placeholder when a connect is abandoned (its future dropped, e.g.
/// by a caller's own timeout), so the peer can be connected again.
struct ConnectingSlot<'a> {
    links: &'a Mutex<HashMap<String, LinkSlot>>,
    key: &'a str,
    armed: bool,
}

impl Drop for ConnectingSlot<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut l = lock(self.links);
            if matches!(l.get(self.key), Some(LinkSlot::Connecting)) {
                l.remove(self.key);
            }
        }
    }
}

impl Engine {
    /// Connects to a server engine (`"ip:port"`), fetching its memory table and opening its
    /// data connections, within `timeout`.
    ///
    /// # Errors
    /// [`Error::ConnectToSelf`], [`Error::AlreadyConnected`], [`Error::InvalidAddress`] (also for
    /// an address without a port), [`Error::Timeout`], [`Error::Io`] (refused), or the peer's
    /// refusal.
    ///
    /// With a directory (`hixl.Directory`), a `remote` without a `:` is an engine name:
    /// see [`Engine::connect_named`].
    pub async fn connect(&self, remote: &str, timeout: Duration) -> Result<Peer> {
        #[cfg(feature = "directory")]
        if self.named().is_some() && super::named::is_name(remote) {
            return self.connect_named(remote, timeout).await;
        }
        self.connect_addr(remote, timeout).await
    }

    /// [`Engine::connect`] to an address (never a directory name).
    pub(super) async fn connect_addr(&self, remote: &str, timeout: Duration) -> Result<Peer> {
        self.check_open("connect refused")?;
        if timeout.is_zero() {
            return Err(Error::InvalidTimeout { millis: 0 });
        }
        let ra = EngineAddr::lookup(remote).await?;
        let sa = ra.socket_addr().ok_or_else(|| Error::InvalidAddress {
            addr: remote.to_string(),
            reason: "a remote engine needs a port".into(),
        })?;
        if self.is_self(sa) {
            return Err(Error::ConnectToSelf {
                engine: remote.to_string(),
            });
        }
        let key = engine_name(sa);
        {
            let mut links = lock(&self.inner.links);
            match links.get(&key) {
                Some(LinkSlot::Up(l)) if !l.state.is_dead() => {
                    return Err(Error::AlreadyConnected { peer: key })
                }
                Some(LinkSlot::Connecting) => return Err(Error::AlreadyConnected { peer: key }),
                _ => {}
            }
            self.make_room(&mut links, &key)?;
            links.insert(key.clone(), LinkSlot::Connecting);
        }
        let mut slot = ConnectingSlot {
            links: &self.inner.links,
            key: &key,
            armed: true,
        };
        let params = LinkParams {
            local_name: &self.inner.lcx.config.name,
            instance: self.inner.instance,
            remote: &key,
            addr: sa,
            streams: self.inner.options.tcp_streams,
            chunk: self.inner.options.tcp_chunk_bytes,
        };
        let r = tokio::time::timeout(timeout, Link::establish(&self.inner.lcx, params)).await;
        let r = match r {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout {
                what: "connect",
                peer: key.clone(),
                after: timeout,
            }),
        };
        // An HTTP server on the port is named as such, whatever it answered (or not).
        let r = match r {
            Err(e) if http_probe::worth_probing(&e) => match http_probe::probe(sa).await {
                Some(status) => Err(http_probe::http_peer_error(&key, sa, &status)),
                None => Err(e),
            },
            r => r,
        };
        slot.armed = false;
        // A shutdown that began while this connect ran has closed every link but this one.
        let r = match (r, self.check_open("connect refused")) {
            (Ok(link), Err(e)) => {
                link.close_because("engine finalized", e.clone());
                Err(e)
            }
            (r, _) => r,
        };
        let mut links = lock(&self.inner.links);
        match r {
            Ok(link) => {
                links.insert(key.clone(), LinkSlot::Up(link.clone()));
                self.evict_idle(&mut links, &key);
                drop(links);
                if self.inner.auto_connect {
                    self.forget_when_dead(&key, &link);
                }
                Ok(Peer { link })
            }
            Err(e) => {
                links.remove(&key);
                if let Error::Remote {
                    status: hixl_core::Status::ParamInvalid,
                    message,
                    ..
                } = &e
                {
                    if message == hixl_core::wire::REFUSE_SELF {
                        return Err(Error::ConnectToSelf {
                            engine: remote.to_string(),
                        });
                    }
                }
                Err(e)
            }
        }
    }

    /// AutoConnect: drops a dead link from the table, so the next transfer reconnects. A
    /// task of the link's own, so that `Link::closed` joins it too.
    fn forget_when_dead(&self, key: &str, link: &Arc<Link>) {
        let (inner, key, watched) = (Arc::downgrade(&self.inner), key.to_string(), link.clone());
        link.state.spawn(async move {
            let link = watched;
            link.state.dead().await;
            if let Some(inner) = inner.upgrade() {
                let mut l = lock(&inner.links);
                if matches!(l.get(&key), Some(LinkSlot::Up(x)) if Arc::ptr_eq(x, &link)) {
                    l.remove(&key);
                    tracing::info!(peer = %key, "auto-connect: dropped a dead link");
                }
            }
        });
    }

    /// The peer `remote`; with AutoConnect (or a configured channel pool), connects first
    /// when there is no live link, within HIXL's 3000 ms.
    ///
    /// # Errors
    /// [`Error::NotConnected`] without AutoConnect; else those of [`Engine::connect`].
    pub async fn peer_or_connect(&self, remote: &str) -> Result<Peer> {
        match self.peer(remote) {
            Ok(p) if p.is_connected() || !self.inner.auto_connect => return Ok(p),
            Err(e) if !self.inner.auto_connect => return Err(e),
            _ => {}
        }
        let deadline = tokio::time::Instant::now() + AUTO_CONNECT_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout {
                    what: "auto-connect",
                    peer: remote.to_string(),
                    after: AUTO_CONNECT_TIMEOUT,
                });
            }
            match self.connect(remote, left).await {
                Err(Error::AlreadyConnected { .. }) => {
                    // Connected meanwhile, or another task is connecting: use or wait for it.
                    if let Ok(p) = self.peer(remote) {
                        if p.is_connected() {
                            return Ok(p);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                r => return r,
            }
        }
    }

    /// Closes the link to `remote`. Its in-flight transfers fail.
    ///
    /// # Errors
    /// [`Error::NotConnected`] if there is no link.
    pub async fn disconnect(&self, remote: &str) -> Result<()> {
        let key = self.key(remote)?;
        let slot = lock(&self.inner.links).remove(&key);
        match slot {
            Some(LinkSlot::Up(l)) => {
                l.close("disconnect");
                // Every task of the link ends (its ops resolved) before this returns.
                l.closed().await;
                Ok(())
            }
            Some(LinkSlot::Connecting) | None => Err(Error::NotConnected { peer: key }),
        }
    }

    /// The peer `remote`, if connected.
    ///
    /// # Errors
    /// [`Error::NotConnected`].
    pub fn peer(&self, remote: &str) -> Result<Peer> {
        let key = self.key(remote)?;
        match lock(&self.inner.links).get(&key) {
            Some(LinkSlot::Up(l)) => Ok(Peer { link: l.clone() }),
            _ => Err(Error::NotConnected { peer: key }),
        }
    }

    /// The transfer counters of every link that is up, per peer, transport and operation
    /// (see [`crate::telemetry`]); [`crate::telemetry::prometheus_text`] renders them.
    pub fn telemetry(&self) -> crate::Telemetry {
        let up: Vec<_> = lock(&self.inner.links)
            .values()
            .filter_map(|v| match v {
                LinkSlot::Up(l) => Some(l.clone()),
                LinkSlot::Connecting => None,
            })
            .collect();
        let mut links: Vec<_> = up
            .iter()
            .map(|l| {
                let mut s = l.telemetry.snapshot();
                s.rails = l.rails();
                s
            })
            .collect();
        links.sort_by(|a, b| a.peer.cmp(&b.peer));
        crate::Telemetry { links }
    }

    /// The telemetry of every link that is up (taken out of the link table's lock).
    fn up_telemetry(&self) -> Vec<Arc<crate::telemetry::LinkTelemetry>> {
        lock(&self.inner.links)
            .values()
            .filter_map(|v| match v {
                LinkSlot::Up(l) => Some(l.telemetry.clone()),
                LinkSlot::Connecting => None,
            })
            .collect()
    }

    /// The engine's transfers that ended since the last call, as records (post and duration,
    /// bytes, descriptors, transport, outcome), the last
    /// [`RECENT`](crate::telemetry::RECENT) per link at most; links that are up only.
    pub fn take_transfer_records(&self) -> Vec<crate::TransferRecord> {
        let mut out = Vec::new();
        for t in self.up_telemetry() {
            t.take_recent(&mut out);
        }
        out
    }

    /// Serves this engine's telemetry on `listen` (`ip:port`; port 0 picks one) as
    /// Prometheus text at `GET /metrics`: the transfer counters and duration histograms per
    /// peer, transport and operation ([`crate::telemetry::prometheus_text`]) and
    /// `hixl_links_up` per peer and transport. Runs on the current tokio runtime until the
    /// returned server is dropped.
    ///
    /// # Errors
    /// [`Error::Io`] if `listen` cannot be bound; [`Error::NoRuntime`] outside a runtime.
    pub async fn serve_metrics(&self, listen: &str) -> Result<crate::telemetry::MetricsServer> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::NoRuntime {
                what: "the metrics endpoint",
            });
        }
        let l = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| Error::io(format!("binding the metrics endpoint {listen}"), e))?;
        let engine = self.clone();
        crate::telemetry::serve_metrics(l, move || engine.metrics_text())
            .map_err(|e| Error::io(format!("the metrics endpoint {listen}"), e))
    }

    /// This engine's telemetry as Prometheus text (what [`Engine::serve_metrics`] serves).
    pub fn metrics_text(&self) -> String {
        let t = self.telemetry();
        let name = self.local_engine().to_string();
        let mut out = crate::telemetry::prometheus_text(&name, &t);
        crate::rail_metrics::prometheus(&mut out, &name, &t);
        if let Some(s) = self.inner.server.as_ref() {
            s.cx.served.prometheus(&mut out, &name);
        }
        out.push_str(
            "# HELP hixl_links_up Links of this engine that are up, per peer and transport.\n",
        );
        out.push_str("# TYPE hixl_links_up gauge\n");
        let engine = crate::telemetry::label_value(&name);
        for l in &t.links {
            let _ = writeln!(
                out,
                "hixl_links_up{{engine=\"{engine}\",peer=\"{}\",transport=\"{}\"}} 1",
                crate::telemetry::label_value(&l.peer),
                l.transport
            );
        }
        // A target's side: the initiators connected to it.
        out.push_str("# HELP hixl_inbound_links Initiators connected to this engine, per peer and transport.\n");
        out.push_str("# TYPE hixl_inbound_links gauge\n");
        let mut inbound: std::collections::BTreeMap<(String, &'static str), u64> =
            std::collections::BTreeMap::new();
        if let Some(s) = self.inner.server.as_ref() {
            let transports = &self.inner.lcx.transports;
            for sess in s.cx.sessions.all().iter().filter(|s| !s.state.is_dead()) {
                let kind = transports
                    .iter()
                    .find(|t| t.serves(sess.id))
                    .map_or("tcp", |t| t.kind().as_str());
                *inbound.entry((sess.peer.to_string(), kind)).or_default() += 1;
            }
        }
        for ((peer, transport), n) in inbound {
            let _ = writeln!(
                out,
                "hixl_inbound_links{{engine=\"{engine}\",peer=\"{}\",transport=\"{transport}\"}} {n}",
                crate::telemetry::label_value(&peer),
            );
        }
        #[cfg(feature = "directory")]
        self.directory_metrics(&mut out, &engine);
        out
    }

    /// Names of connected peers.
    pub fn peers(&self) -> Vec<String> {
        lock(&self.inner.links)
            .iter()
            .filter(|(_, v)| matches!(v, LinkSlot::Up(_)))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Posts a transfer to `remote` by name (HIXL's `TransferAsync`); see [`Peer::transfer`].
    /// With `AutoConnect=1` (or a configured channel pool) a missing or dead link is
    /// connected first (within 3000 ms, as in HIXL); the transfer is posted as soon as it is
    /// up, whether or not the returned future is polled.
    pub fn transfer(&self, remote: &str, op: TransferOp, descs: &[OpDesc]) -> Transfer {
        if let Err(e) = self.check_open("transfer refused") {
            return Transfer::failed(self.inner.lcx.ops.table.clone(), e, Arc::from(remote));
        }
        if self.inner.auto_connect && !matches!(self.peer(remote), Ok(p) if p.is_connected()) {
            let Ok(rt) = tokio::runtime::Handle::try_current() else {
                return Transfer::failed(
                    self.inner.lcx.ops.table.clone(),
                    Error::NoRuntime {
                        what: "auto-connect",
                    },
                    Arc::from(remote),
                );
            };
            let (me, r, d) = (self.clone(), remote.to_string(), descs.to_vec());
            let task = rt.spawn(async move {
                let p = me.peer_or_connect(&r).await?;
                Ok(p.transfer(op, &d))
            });
            return Transfer::connecting(self.inner.lcx.ops.table.clone(), task, Arc::from(remote));
        }
        match self.peer(remote) {
            Ok(p) => p.transfer(op, descs),
            Err(e) => Transfer::failed(self.inner.lcx.ops.table.clone(), e, Arc::from(remote)),
        }
    }
}
