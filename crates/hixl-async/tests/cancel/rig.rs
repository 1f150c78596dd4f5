//! The engines: two of one transport (over tcp or the fabric), and the buffers they hand back between rounds.

use std::time::{Duration, Instant};

use hixl_async::{Engine, HostBuffer, Peer, Region};
use hixl_core::{Access, RemoteRegion};

use crate::T;

pub(crate) async fn wait_idle(e: &Engine, within: Duration) -> bool {
    let end = Instant::now() + within;
    while e.ops_in_flight() > 0 {
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    true
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `hixl.Transport=tcp`.
    Tcp,
    /// `hixl.Transport=tcp` with `hixl.TcpIo=uring` on the initiator.
    TcpUring,
    /// `hixl.Transport=fabric`, the target's region from its fabric pool (mapped by the peer).
    FabricPool,
    /// `hixl.Transport=fabric`, the target's region plain host memory (cross-memory attach).
    FabricCma,
}

impl Mode {
    pub(crate) fn transport(self) -> &'static str {
        match self {
            Mode::Tcp | Mode::TcpUring => "tcp",
            Mode::FabricPool | Mode::FabricCma => "fabric",
        }
    }
}

/// Two engines of one transport, and the buffers they hand back between rounds.
pub(crate) struct Rig {
    pub(crate) mode: Mode,
    pub(crate) target: Engine,
    pub(crate) init: Engine,
    pub(crate) tbuf: Option<HostBuffer>,
    pub(crate) lbuf: Option<HostBuffer>,
}

impl Rig {
    pub(crate) async fn new(mode: Mode) -> Rig {
        Rig::with_streams(mode, 4).await
    }

    /// With `streams` TCP data connections per peer.
    pub(crate) async fn with_streams(mode: Mode, streams: usize) -> Rig {
        let target = Engine::builder("127.0.0.1")
            .option("hixl.Transport", mode.transport())
            .ephemeral_port()
            .build()
            .await
            .expect("target engine");
        let init = Engine::builder("127.0.0.1")
            .option("hixl.Transport", mode.transport())
            .option("hixl.TcpChunkBytes", "64K")
            .option("hixl.TcpStreams", streams.to_string())
            .option(
                "hixl.TcpIo",
                if mode == Mode::TcpUring {
                    "uring"
                } else {
                    "epoll"
                },
            )
            .build()
            .await
            .expect("initiator engine");
        if mode == Mode::TcpUring {
            let (io, why) = init.tcp_io();
            // Where the kernel refuses io_uring the engine runs epoll; CI may not skip.
            assert!(
                io == hixl_core::options::TcpIo::Uring
                    || std::env::var_os("HIXL_REQUIRE_URING").is_none(),
                "the uring rig runs {}: {}",
                io.as_str(),
                why.unwrap_or("no reason given")
            );
        }
        Rig {
            mode,
            target,
            init,
            tbuf: None,
            lbuf: None,
        }
    }

    /// Registers the target's region (named `name`) and the initiator's, as long as and
    /// filled with `tguard` and `lguard` (reusing the buffers of the last round), and
    /// connects.
    pub(crate) async fn setup(
        &mut self,
        name: &str,
        tguard: &[u8],
        lguard: &[u8],
    ) -> (Region, Region, Peer, RemoteRegion) {
        let len = tguard.len();
        let remote = match self.mode {
            Mode::FabricPool => self
                .target
                .register_pooled(len as u64, Access::REMOTE_RW, Some(name))
                .expect("register pooled"),
            Mode::Tcp | Mode::TcpUring | Mode::FabricCma => {
                let b = match self.tbuf.take() {
                    Some(b) => b,
                    None => HostBuffer::zeroed(len).expect("buffer"),
                };
                self.target
                    .register_with(b, Access::REMOTE_RW, Some(name))
                    .expect("register target")
            }
        };
        remote.write_at(0, tguard).expect("fill target");
        let b = match self.lbuf.take() {
            Some(b) => b,
            None => HostBuffer::zeroed(lguard.len()).expect("buffer"),
        };
        let local = self.init.register(b).expect("register local");
        local.write_at(0, lguard).expect("fill local");
        let peer = self
            .init
            .connect(self.target.local_engine(), T)
            .await
            .expect("connect");
        let how = peer.transport().to_string();
        assert!(how.starts_with(self.mode.transport()), "{how}");
        match self.mode {
            Mode::FabricPool => assert!(how.contains("1 pool regions mapped"), "{how}"),
            Mode::FabricCma => {
                assert!(how.contains("1 reached by cross-memory attach"), "{how}")
            }
            Mode::Tcp | Mode::TcpUring => {}
        }
        let rr = peer
            .region(name)
            .expect("the target's region is in its table");
        assert_eq!(rr.addr, remote.addr());
        (remote, local, peer, rr)
    }
}
