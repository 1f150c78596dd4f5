//! Engines by name through the directory (feature `directory`, option `hixl.Directory`):
//! publishing this engine when it starts, [`Engine::connect_named`], directory names in
//! [`Engine::connect`] and the calls that take a peer, and ending links to an engine the
//! directory says was replaced by a new incarnation.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use hixl_core::{Error, Result};
use hixl_directory::{incarnation_hex, table_digest, Change, Directory, Entry, ENTRY_VERSION};
use tokio::sync::broadcast::error::RecvError;

use super::{Engine, EngineInner, LinkSlot};
use crate::link::Peer;
use crate::sync::lock;

/// The engine's directory state.
#[derive(Debug)]
pub(super) struct Named {
    pub(super) dir: Arc<Directory>,
    /// Names this engine connected by: the link's key and the incarnation it reached.
    links: Mutex<HashMap<String, (String, u64)>>,
    /// Wakes the task that republishes the memory-table digest.
    table: tokio::sync::watch::Sender<()>,
}

/// Whether `remote` is a directory name rather than an address: names never hold a `:`,
/// and an address to connect to always does (it needs a port).
pub(super) fn is_name(remote: &str) -> bool {
    !remote.contains(':') && remote.parse::<IpAddr>().is_err()
}

impl Engine {
    /// Opens the directory, publishes this engine (when it listens and has `hixl.Name`), and
    /// starts the tasks that watch for replaced peers and republish the memory-table digest.
    pub(super) async fn start_directory(&self, dir: Directory) -> Result<()> {
        let o = &self.inner.options.directory;
        let dir = Arc::new(dir);
        let (table, table_rx) = tokio::sync::watch::channel(());
        let named = Named {
            dir: dir.clone(),
            links: Mutex::new(HashMap::new()),
            table,
        };
        if self.inner.named.set(named).is_err() {
            return Err(Error::Internal {
                what: "the directory was started twice",
            });
        }
        match (&o.name, self.inner.listen) {
            (Some(name), Some(listen)) => {
                let entry = self.entry(name, listen, &o.endpoints)?;
                dir.publish(entry).await?;
                tokio::spawn(republish_digest(Arc::downgrade(&self.inner), table_rx));
            }
            (Some(name), None) => {
                return Err(Error::InvalidOption {
                    key: "hixl.Name".into(),
                    value: name.clone(),
                    reason:
                        "only a server engine (ip:port) publishes a name; this one is client-only"
                            .into(),
                })
            }
            (None, _) => {}
        }
        tokio::spawn(watch_replacements(
            Arc::downgrade(&self.inner),
            dir.changes(),
        ));
        Ok(())
    }

    /// This engine's entry: its listen address (on a wildcard listener, the address it
    /// reaches the directory from), its transports, its memory table's digest.
    fn entry(&self, name: &str, listen: SocketAddr, endpoints: &[String]) -> Result<Entry> {
        let ip = if listen.ip().is_unspecified() {
            route_ip(endpoints).ok_or_else(|| Error::InvalidOption {
                key: "hixl.Name".into(),
                value: name.into(),
                reason: format!(
                    "the engine listens on {listen}, and no local address reaches {}: \
                     listen on the address peers should use",
                    endpoints.join(",")
                ),
            })?
        } else {
            listen.ip()
        };
        let mut transports = vec!["tcp".to_owned()];
        for t in self.inner.lcx.transports.iter() {
            let k = t.kind().as_str().to_owned();
            if !transports.contains(&k) {
                transports.push(k);
            }
        }
        Ok(Entry {
            v: ENTRY_VERSION,
            name: name.to_owned(),
            incarnation: incarnation_hex(self.inner.instance),
            addrs: vec![SocketAddr::new(ip, listen.port()).to_string()],
            transports,
            table_digest: self.table_digest(),
            wire: u16::from(hixl_core::wire::VERSION),
        })
    }

    fn table_digest(&self) -> String {
        let t = lock(&self.inner.lcx.regions).exported();
        table_digest(t.iter().map(|r| (r.addr, r.len)))
    }

    /// The directory, if this engine has one (`hixl.Directory`).
    pub fn directory(&self) -> Option<&Directory> {
        self.inner.named.get().map(|n| &*n.dir)
    }

    /// The directory's lines of [`Engine::metrics_text`]: whether this engine's entry is
    /// published (by state) and how many attempts to publish it again failed.
    pub(super) fn directory_metrics(&self, out: &mut String, engine: &str) {
        use std::fmt::Write as _;
        let Some(d) = self.directory() else { return };
        let Some(p) = d.publication() else { return };
        let name = crate::telemetry::label_value(&p.entry.name);
        let state = match p.state {
            hixl_directory::PublishState::Live => "live",
            hixl_directory::PublishState::Retrying(_) => "retrying",
            hixl_directory::PublishState::Lost(_) => "lost",
        };
        out.push_str("# HELP hixl_directory_published Whether this engine's directory entry is live (1) or not (0), with its state.\n");
        out.push_str("# TYPE hixl_directory_published gauge\n");
        let live = u8::from(state == "live");
        let _ = writeln!(
            out,
            "hixl_directory_published{{engine=\"{engine}\",name=\"{name}\",state=\"{state}\"}} {live}"
        );
        out.push_str("# HELP hixl_directory_publish_failures_total Attempts to publish this engine's entry again that failed.\n");
        out.push_str("# TYPE hixl_directory_publish_failures_total counter\n");
        let _ = writeln!(
            out,
            "hixl_directory_publish_failures_total{{engine=\"{engine}\",name=\"{name}\"}} {}",
            d.publish_failures()
        );
    }

    pub(super) fn named(&self) -> Option<&Named> {
        self.inner.named.get()
    }

    /// Tells the directory task that the memory table changed.
    pub(super) fn table_changed(&self) {
        if let Some(n) = self.inner.named.get() {
            n.table.send_replace(());
        }
    }

    /// Connects to the engine published as `name` in the directory (looked up in the watched
    /// cache, else asked of etcd), within `timeout`. The link is the same authenticated link
    /// as [`Engine::connect`]'s, and it is checked to reach the incarnation the directory
    /// names. [`Engine::connect`] does the same for a remote without a `:` when a directory
    /// is configured.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] without `hixl.Directory`; [`Error::UnknownName`];
    /// [`Error::Directory`] for an entry hixl cannot read, or one whose address answers as
    /// another incarnation (a stale entry); else those of [`Engine::connect`].
    pub async fn connect_named(&self, name: &str, timeout: Duration) -> Result<Peer> {
        self.check_open("connect refused")?;
        let n = self.named().ok_or_else(|| Error::InvalidOption {
            key: "hixl.Directory".into(),
            value: String::new(),
            reason: format!("connecting to {name:?} by name needs a directory (etcd://...)"),
        })?;
        let mut entry = n.dir.resolve(name).await?;
        for attempt in 0..2 {
            let addr = entry.addrs.first().cloned().unwrap_or_default();
            let peer = self.connect_addr(&addr, timeout).await?;
            let want = entry.incarnation_id();
            if peer.incarnation() == want {
                let key = peer.name().to_string();
                lock(&n.links).insert(name.to_owned(), (key, want));
                return Ok(peer);
            }
            // The cache may lag a restart; etcd itself may still hold a dead one's entry.
            let fresh = n.dir.resolve_cold(name).await?;
            if attempt == 0 && fresh.incarnation_id() == peer.incarnation() {
                lock(&n.links).insert(name.to_owned(), (peer.name().into(), peer.incarnation()));
                return Ok(peer);
            }
            let _ = self.disconnect(&addr).await;
            if fresh == entry {
                return Err(Error::Directory {
                    what: format!("{}: connecting to {name:?}", n.dir.describe()),
                    reason: format!(
                        "the entry names incarnation {} at {addr}, but {addr} answered as \
                         incarnation {}: a stale entry (it expires with its lease)",
                        entry.incarnation,
                        incarnation_hex(peer.incarnation())
                    ),
                });
            }
            entry = fresh;
        }
        Err(Error::Directory {
            what: format!("{}: connecting to {name:?}", n.dir.describe()),
            reason: "its entry changed while connecting; try again".into(),
        })
    }

    /// The link-table key a directory name stands for: the link made by that name, else the
    /// cached entry's address.
    pub(super) fn named_key(&self, name: &str) -> Option<String> {
        let n = self.named()?;
        if let Some((key, _)) = lock(&n.links).get(name) {
            return Some(key.clone());
        }
        n.dir.lookup(name)?.addrs.first().cloned()
    }

    /// Deletes this engine's entry at once (shutdown).
    pub(super) async fn close_directory(&self) {
        if let Some(n) = self.named() {
            n.dir.close().await;
        }
    }
}

/// The local address the OS would use to reach the first directory endpoint that resolves.
fn route_ip(endpoints: &[String]) -> Option<IpAddr> {
    use std::net::ToSocketAddrs;
    endpoints.iter().find_map(|ep| {
        let to = ep.to_socket_addrs().ok()?.next()?;
        let bind = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
        let s = std::net::UdpSocket::bind(bind).ok()?;
        s.connect(to).ok()?;
        Some(s.local_addr().ok()?.ip()).filter(|ip| !ip.is_unspecified())
    })
}

/// Republishes the entry when the memory table changed (at most every 100 ms).
async fn republish_digest(inner: Weak<EngineInner>, mut rx: tokio::sync::watch::Receiver<()>) {
    while rx.changed().await.is_ok() {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Some(inner) = inner.upgrade() else { return };
        let engine = Engine { inner };
        let (Some(n), Some(p)) = (
            engine.named(),
            engine.directory().and_then(|d| d.publication()),
        ) else {
            return;
        };
        let digest = engine.table_digest();
        if digest != p.entry.table_digest {
            let dir = n.dir.clone();
            drop(engine);
            dir.update(Entry {
                table_digest: digest,
                ..p.entry
            })
            .await;
        }
    }
}

/// Ends links to engines the directory says were replaced: a name now held by another
/// incarnation than the one a link reached. (An entry that only vanished ends nothing: the
/// directory is not in the data path, and a live link outlives its peer's lease.)
async fn watch_replacements(
    inner: Weak<EngineInner>,
    mut rx: tokio::sync::broadcast::Receiver<Change>,
) {
    loop {
        let changes = match rx.recv().await {
            Ok(ch) => vec![ch],
            Err(RecvError::Lagged(_)) => {
                // Missed some: compare every named link with the cache.
                let Some(inner) = inner.upgrade() else { return };
                let e = Engine { inner };
                let Some(n) = e.named() else { return };
                let names: Vec<String> = lock(&n.links).keys().cloned().collect();
                names
                    .iter()
                    .filter_map(|name| n.dir.lookup(name))
                    .map(Change::Added)
                    .collect()
            }
            Err(RecvError::Closed) => return,
        };
        let Some(inner) = inner.upgrade() else { return };
        let engine = Engine { inner };
        for ch in changes {
            engine.on_change(&ch);
        }
    }
}

impl Engine {
    fn on_change(&self, ch: &Change) {
        let Some(n) = self.named() else { return };
        let (name, new, old) = match ch {
            Change::Added(e) | Change::Updated(e) => (&e.name, e, None),
            Change::Replaced { old, new } => (&new.name, new, Some(old.incarnation_id())),
            Change::Removed(_) => return,
        };
        let new_inc = new.incarnation_id();
        let mut ended: Vec<(String, u64)> = Vec::new();
        {
            let mut links = lock(&n.links);
            if let Some((key, inc)) = links.get(name).cloned() {
                if inc != new_inc {
                    links.remove(name);
                    ended.push((key, inc));
                }
            }
        }
        // Links made by address to the replaced incarnation end too.
        if let Some(old) = old {
            for (key, slot) in lock(&self.inner.links).iter() {
                if matches!(slot, LinkSlot::Up(l) if l.incarnation == old) {
                    ended.push((key.clone(), old));
                }
            }
        }
        for (key, inc) in ended {
            let link = match lock(&self.inner.links).get(&key) {
                Some(LinkSlot::Up(l)) if l.incarnation == inc => l.clone(),
                _ => continue,
            };
            let cause = format!(
                "the directory says {name:?} is now incarnation {} at {} (this link reached \
                 incarnation {}): the engine was replaced",
                new.incarnation,
                new.addrs.join(", "),
                incarnation_hex(inc)
            );
            tracing::info!(peer = %key, "{cause}");
            link.close_because(
                "replaced in the directory",
                Error::PeerLost { peer: key, cause },
            );
        }
    }
}
