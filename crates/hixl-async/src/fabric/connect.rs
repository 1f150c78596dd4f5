//! The fabric as a [`Transport`]: a peer on this host (same boot id and mount namespace) that
//! offers its fabric channel gets one; its memfds are mapped before `connect` returns.

use std::sync::Arc;

use hixl_core::wire::Message;
use hixl_core::{MemDesc, Result};

use super::channel::FabricChannel;
use super::client::{FabricLink, PeerInfo};
use super::server::Chans;
use super::FabricBackend;
use crate::memory::Owned;
use crate::transport::target::TargetCx;
use crate::transport::{BoxFuture, Declined, Negotiation, Opened, Transport, TransportKind};
use tokio::sync::watch;

/// The engine's fabric transport: its backend, unless `hixl.Transport` is `tcp` or `verbs`.
#[derive(Debug)]
pub(crate) struct FabricTransport {
    pub(crate) backend: Option<Arc<FabricBackend>>,
    /// The target's end of each session's fabric channel.
    pub(crate) chans: Chans,
}

impl Transport for FabricTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Fabric
    }

    fn forced(&self) -> bool {
        self.backend.as_ref().is_some_and(|b| b.forced)
    }

    fn connect<'a>(
        &'a self,
        cx: &'a mut Negotiation<'_>,
    ) -> BoxFuture<'a, Result<std::result::Result<Opened, Declined>>> {
        // A peer the fabric cannot serve is declined without boxing the opening's future
        // (several KiB, paid by every link of a thousand connecting at once).
        match self.eligible(cx) {
            Ok((backend, info)) => Box::pin(async move { Ok(self.open(backend, &info, cx).await) }),
            Err(why) => Box::pin(std::future::ready(Ok(Err(why)))),
        }
    }

    fn completions(&self) -> Option<Arc<dyn hixl_core::CompletionSource>> {
        Some(self.backend.as_ref()?.copy.completions())
    }

    fn alloc(&self, len: u64) -> Option<Result<(MemDesc, Owned)>> {
        let f = self.backend.as_ref()?;
        Some(f.pool.alloc(len).map(|buf| {
            let desc = MemDesc::new(buf.addr(), buf.len());
            (desc, Owned::Pooled(Box::new(buf)))
        }))
    }

    fn offer(&self) -> Option<Message> {
        let f = self.backend.as_ref()?;
        Some(Message::FabricInfo {
            boot_id: f.identity.boot_id.clone(),
            mnt_ns: f.identity.mnt_ns,
            pid: f.identity.pid as u32,
            uid: f.identity.uid,
            socket: f.socket.clone(),
        })
    }

    fn listen(&self, cx: &TargetCx, shutdown: watch::Receiver<bool>) -> Result<()> {
        if let Some(f) = &self.backend {
            let l = f.listen()?;
            let chans = self.chans.clone();
            cx.tasks
                .spawn(super::server::accept_loop(cx.clone(), chans, l, shutdown));
        }
        Ok(())
    }

    fn table_changed(&self, cx: &TargetCx) {
        if self.backend.is_some() {
            super::server::broadcast_tables(cx, &self.chans);
        }
    }

    fn revoke<'a>(&'a self, cx: &'a TargetCx, rkey: u64) -> BoxFuture<'a, ()> {
        // Same-host peers touch the memory directly: wait until each has stopped.
        Box::pin(super::server::revoke(cx, &self.chans, rkey))
    }

    fn farewell<'a>(&'a self, sess: &'a crate::transport::target::Session) -> BoxFuture<'a, ()> {
        Box::pin(super::server::flush(&self.chans, sess))
    }

    fn serves(&self, id: u64) -> bool {
        self.chans.contains(id)
    }
}

impl FabricTransport {
    /// The backend and the peer's fabric offer, or why the fabric cannot serve the peer.
    fn eligible(
        &self,
        cx: &Negotiation<'_>,
    ) -> std::result::Result<(&Arc<FabricBackend>, PeerInfo), Declined> {
        let Some(backend) = &self.backend else {
            return Err(Declined::Off(
                "the fabric backend is off: hixl.Transport is tcp or verbs",
            ));
        };
        let info = cx
            .offers
            .iter()
            .find(|m| matches!(m, Message::FabricInfo { .. }))
            .and_then(PeerInfo::from_message)
            .ok_or(Declined::PeerLacks(TransportKind::Fabric))?;
        if !backend.identity.same_host(&info.identity) {
            return Err(if backend.identity.boot_id != info.identity.boot_id {
                Declined::OtherHost
            } else {
                Declined::OtherNamespace
            });
        }
        Ok((backend, info))
    }

    async fn open(
        &self,
        backend: &Arc<FabricBackend>,
        info: &PeerInfo,
        cx: &mut Negotiation<'_>,
    ) -> std::result::Result<Opened, Declined> {
        let (fl, fs) =
            FabricLink::establish(backend, info, cx.session, cx.local_name, cx.peer.clone())
                .await
                // E.g. a peer that shares our boot id and mounts but not our network
                // namespace, where its abstract fabric socket does not exist.
                .map_err(|e| {
                    Declined::Setup(format!("the fabric channel could not be opened: {e}"))
                })?;
        let fallback = crate::sync::lock(&fl.fallback).clone();
        if let (true, Some(why)) = (backend.forced, &fallback) {
            return Err(Declined::Partial(why.clone()));
        }
        let (mapped, cma) = fl.counts();
        let translated = *crate::sync::lock(&fl.translated);
        let mut describe = format!(
            "fabric (same host: boot id and mount namespace match; {mapped} pool regions mapped{}, {cma} reached by cross-memory attach",
            if backend.unified { format!(", {translated} of them translated") } else { String::new() }
        );
        if let Some(f) = fallback {
            describe.push_str(&format!("; host regions over tcp: {f}"));
        }
        describe.push(')');
        let channel =
            FabricChannel::new(Arc::new(fl), backend.clone(), cx.chunk, cx.peer.clone(), fs);
        Ok(Opened {
            channel: Arc::new(channel),
            describe,
        })
    }
}
