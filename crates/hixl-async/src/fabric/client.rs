//! The initiator's view of a same-host peer: the peer's pool regions mapped here, its other
//! host regions reached by cross-memory attach, and the revocation handshake.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, RwLock};

use bytes::BytesMut;
use hixl_core::wire::{Channel, FabricRegion, Message, FEATURES, NO_FD};
use hixl_core::{Error, Result, Status};
use hixl_fabric::{cma_probe, HostIdentity, PeerMapping};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use super::chan::{recv_frame, send_frame};
use super::FabricBackend;
use crate::link_state::LinkState;
use crate::sync::{lock, read, recover, write};

/// How the initiator reaches one of the peer's regions over the fabric.
#[derive(Debug)]
pub(crate) enum Reach {
    /// The peer's memfd, mapped here.
    Mapped(PeerMapping),
    /// Host memory of the peer, reached with process_vm_readv/writev.
    Cma,
}

/// A region's [`Reach`] and the signal its revocation waits for. Every op with copies in
/// flight holds a clone of the `Arc<Held>` in its op-table keep-alive (dropped when the op's
/// last copy is done); when the last one goes, the fields drop in order: first the mapping
/// (unmapped), then `gone`, which tells a waiting revocation.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) reach: Reach,
    gone: Gone,
}

/// Fires its sender, if a revocation set one, when dropped.
#[derive(Debug, Default)]
struct Gone(Mutex<Option<tokio::sync::oneshot::Sender<()>>>);

impl Drop for Gone {
    fn drop(&mut self) {
        let tx = self.0.get_mut().unwrap_or_else(recover).take();
        if let Some(tx) = tx {
            let _ = tx.send(());
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// The region's start in the peer's address space.
    pub(crate) base: u64,
    pub(crate) reach: Arc<Held>,
}

/// The peer's fabric identity, from its `FabricInfo`.
#[derive(Debug, Clone)]
pub(crate) struct PeerInfo {
    pub(crate) identity: HostIdentity,
    pub(crate) socket: String,
}

impl PeerInfo {
    /// From a `FabricInfo` message.
    pub(crate) fn from_message(m: &Message) -> Option<PeerInfo> {
        match m {
            Message::FabricInfo {
                boot_id,
                mnt_ns,
                pid,
                uid,
                socket,
            } => Some(PeerInfo {
                identity: HostIdentity {
                    boot_id: boot_id.clone(),
                    mnt_ns: *mnt_ns,
                    pid: *pid as i32,
                    uid: *uid,
                },
                socket: socket.clone(),
            }),
            _ => None,
        }
    }
}

/// The initiator's end of a fabric channel.
#[derive(Debug)]
pub(crate) struct FabricLink {
    pub(crate) pid: i32,
    regions: RwLock<HashMap<u64, Entry>>,
    tx: mpsc::UnboundedSender<Message>,
    unified: bool,
    cma: std::result::Result<(), String>,
    /// Why some regions go over TCP instead (CMA refused), for `Peer::transport`.
    pub(crate) fallback: Mutex<Option<String>>,
    pub(crate) translated: Mutex<usize>,
    peer: Arc<str>,
}

/// What `establish` hands the link so it can start the channel's reader.
#[derive(Debug)]
pub(crate) struct FabricStream {
    pub(crate) stream: Arc<UnixStream>,
    pub(crate) buf: BytesMut,
    /// Descriptors already received for frames not yet read.
    pub(crate) fds: Vec<OwnedFd>,
    pub(crate) rx: mpsc::UnboundedReceiver<Message>,
}

/// How many memfds a fabric-table message names. A table of more than `SCM_MAX_FD` memfds
/// comes in several messages, each but the last naming exactly `SCM_MAX_FD`.
pub(crate) fn fds_named(table: &[FabricRegion]) -> usize {
    table.iter().filter(|r| r.fd_index != NO_FD).count()
}

/// The descriptors of one table message: the first `n` received (a read may have taken the
/// next message's descriptors along; they stay queued for it).
fn take_fds(fds: &mut Vec<OwnedFd>, n: usize) -> Vec<OwnedFd> {
    let n = n.min(fds.len());
    fds.drain(..n).collect()
}

impl FabricLink {
    /// Opens the peer's fabric channel, receives its fabric table with memfds and maps them.
    ///
    /// # Errors
    /// Socket or protocol failures, a refused session, an unsealed or short memfd.
    pub(crate) async fn establish(
        backend: &FabricBackend,
        info: &PeerInfo,
        session: u64,
        local_name: &str,
        peer: Arc<str>,
    ) -> Result<(FabricLink, FabricStream)> {
        let s = super::connect(&info.socket).map_err(|e| {
            Error::io(
                format!("connecting to {peer}'s fabric socket @{}", info.socket),
                e,
            )
        })?;
        let hello = Message::Hello {
            engine: local_name.to_string(),
            channel: Channel::Fabric,
            session,
            features: FEATURES,
        };
        send_frame(&s, &hello, &[], &peer).await?;
        let mut buf = BytesMut::new();
        let mut fds = Vec::new();
        // The whole table before `connect` returns, however many messages it takes: a region
        // missing from it would silently go over TCP.
        let mut parts = Vec::new();
        loop {
            let table = match recv_frame(&s, &mut buf, &mut fds, &peer).await? {
                Message::FabricTable(t) => t,
                Message::Refuse { status, reason } => {
                    return Err(Error::Remote {
                        peer: peer.to_string(),
                        status: Status::from_code(status).unwrap_or(Status::Failed),
                        message: reason,
                    })
                }
                m => {
                    return Err(Error::Protocol {
                        peer: peer.to_string(),
                        reason: format!("expected a fabric table, got {m:?}"),
                    })
                }
            };
            let named = fds_named(&table);
            let mine = take_fds(&mut fds, named);
            parts.push((table, mine));
            if named < hixl_fabric::SCM_MAX_FD {
                break;
            }
        }
        let pid = info.identity.pid;
        let cma = match parts
            .iter()
            .flat_map(|(t, _)| t.iter())
            .find(|r| r.fd_index == NO_FD)
        {
            Some(r) => cma_probe(pid, r.addr),
            None => Ok(()),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let link = FabricLink {
            pid,
            regions: RwLock::new(HashMap::new()),
            tx,
            unified: backend.unified,
            cma,
            fallback: Mutex::new(None),
            translated: Mutex::new(0),
            peer,
        };
        for (table, mine) in parts {
            link.apply_table(table, mine)?;
        }
        Ok((
            link,
            FabricStream {
                stream: Arc::new(s),
                buf,
                fds,
                rx,
            },
        ))
    }

    /// Maps the regions of a (possibly partial) fabric table that are not known yet.
    pub(crate) fn apply_table(&self, table: Vec<FabricRegion>, fds: Vec<OwnedFd>) -> Result<()> {
        let mut fds: Vec<Option<OwnedFd>> = fds.into_iter().map(Some).collect();
        let mut regions = write(&self.regions);
        for r in table {
            if regions.contains_key(&r.rkey) {
                continue;
            }
            let reach = if r.fd_index == NO_FD {
                match &self.cma {
                    Ok(()) => Reach::Cma,
                    Err(why) => {
                        lock(&self.fallback).get_or_insert_with(|| why.clone());
                        continue;
                    }
                }
            } else {
                let fd = fds
                    .get_mut(r.fd_index as usize)
                    .and_then(Option::take)
                    .ok_or_else(|| Error::Protocol {
                        peer: self.peer.to_string(),
                        reason: format!(
                            "fabric region {:#x} names missing fd {}",
                            r.addr, r.fd_index
                        ),
                    })?;
                let m = PeerMapping::map(fd, r.len, self.unified.then_some(r.addr))?;
                if self.unified && m.translated() {
                    tracing::info!(
                        peer = %self.peer,
                        "fabric region {:#x}+{} could not be mapped at the same address; using translation",
                        r.addr,
                        r.len
                    );
                }
                if m.translated() {
                    *lock(&self.translated) += 1;
                }
                Reach::Mapped(m)
            };
            regions.insert(
                r.rkey,
                Entry {
                    base: r.addr,
                    reach: Arc::new(Held {
                        reach,
                        gone: Gone::default(),
                    }),
                },
            );
        }
        Ok(())
    }

    /// How to reach the region with `rkey`, if the fabric can.
    pub(crate) fn entry(&self, rkey: u64) -> Option<Entry> {
        read(&self.regions).get(&rkey).cloned()
    }

    /// Counts of mapped and CMA regions.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let r = read(&self.regions);
        let mapped = r
            .values()
            .filter(|e| matches!(e.reach.reach, Reach::Mapped(_)))
            .count();
        (mapped, r.len() - mapped)
    }

    /// Queues a frame for the peer.
    pub(crate) fn send(&self, m: Message) -> bool {
        self.tx.send(m).is_ok()
    }

    /// Stops using the region with `rkey`: no new copies find it; once the copies in flight
    /// have dropped their hold, the mapping goes and the peer is told. The wait is a task of
    /// the link's (`state`): it ends with the link, which joins it.
    pub(crate) fn revoke(self: &Arc<Self>, rkey: u64, state: &Arc<LinkState>) {
        let e = write(&self.regions).remove(&rkey);
        let (me, link) = (self.clone(), state.clone());
        state.spawn(async move {
            let drained = async {
                if let Some(e) = e {
                    // The op table drops each op's hold once its last copy is done; the last
                    // one to go unmaps and fires `gone`. No polling.
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    *lock(&e.reach.gone.0) = Some(tx);
                    drop(e);
                    let _ = rx.await;
                }
            };
            tokio::select! {
                _ = drained => {
                    me.send(Message::RevokeAck { rkey });
                }
                // A dead link acks nothing; its copies still drop their holds as their ops
                // resolve, and the last one unmaps.
                _ = link.dead() => {}
            }
        });
    }
}

/// Writes the initiator's frames (notifies, revoke acks) to the fabric channel.
pub(crate) async fn writer(
    s: Arc<UnixStream>,
    mut rx: mpsc::UnboundedReceiver<Message>,
    peer: Arc<str>,
) {
    while let Some(m) = rx.recv().await {
        if send_frame(&s, &m, &[], &peer).await.is_err() {
            break;
        }
    }
}

/// Reads the target's frames: table updates, revocations, notify acks (handed to `on_ack`).
/// Returns why the channel ended.
pub(crate) async fn reader(
    s: Arc<UnixStream>,
    mut buf: BytesMut,
    mut fds: Vec<OwnedFd>,
    link: Arc<FabricLink>,
    state: &Arc<LinkState>,
    on_ack: impl Fn(u64, u32),
) -> Error {
    loop {
        match recv_frame(&s, &mut buf, &mut fds, &link.peer).await {
            Ok(Message::FabricTable(t)) => {
                let mine = take_fds(&mut fds, fds_named(&t));
                if let Err(e) = link.apply_table(t, mine) {
                    return e;
                }
            }
            Ok(Message::Revoke { rkey }) => link.revoke(rkey, state),
            Ok(Message::NotifyAck { seq, status }) => on_ack(seq, status),
            Ok(m) => {
                return Error::Protocol {
                    peer: link.peer.to_string(),
                    reason: format!("unexpected {m:?} on the fabric channel"),
                }
            }
            Err(e) => return e,
        }
    }
}
