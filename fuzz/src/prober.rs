//! The "still serves a normal initiator" check.

use std::time::Duration;

use hixl_async::{Engine, HostBuffer, Region};
use hixl_core::OpDesc;

/// A real client engine that connects to a target engine, writes a pattern into one of its
/// regions, reads it back and compares, then disconnects.
pub struct Prober {
    /// The client engine.
    pub engine: Engine,
    local: Region,
    round: u64,
}

impl Prober {
    /// A client engine with these options (e.g. `hixl.Transport=tcp`).
    pub async fn new(options: &[(&str, &str)]) -> Prober {
        let mut b = Engine::builder("127.0.0.1");
        for (k, v) in options {
            b = b.option(*k, *v);
        }
        let engine = b.build().await.expect("harness setup: prober engine");
        let local = engine
            .register(HostBuffer::zeroed(64 << 10).expect("harness setup: prober buffer"))
            .expect("harness setup: prober registration");
        Prober {
            engine,
            local,
            round: 0,
        }
    }

    /// Connects to `remote`, moves 1 KiB into its region `region` at an offset that changes
    /// every round and back, compares, disconnects. Returns the remote address written and
    /// the bytes, so the caller can check them in the target's memory too.
    ///
    /// # Panics
    /// When any step fails: the target engine no longer serves a normal initiator.
    pub async fn check(&mut self, remote: &str, region: &str) -> (u64, Vec<u8>) {
        self.round += 1;
        let r = self.round;
        let peer = match self.engine.connect(remote, Duration::from_secs(10)).await {
            Ok(p) => p,
            Err(e) => panic!(
                "invariant violated: the engine at {remote} no longer accepts a normal initiator: {e}"
            ),
        };
        let Some(reg) = peer.region(region) else {
            panic!(
                "invariant violated: the engine's memory table lost region {region}: {:?}",
                peer.regions()
            )
        };
        const N: u64 = 1024;
        let slots = (reg.len / N).max(1);
        let remote_addr = reg.addr + (r % slots) * N;
        let pattern: Vec<u8> = (0..N)
            .map(|i| (i as u8) ^ (r as u8).wrapping_mul(31))
            .collect();
        self.local
            .write_at(0, &pattern)
            .expect("harness setup: prober local write");
        let w = peer
            .write(&[OpDesc::new(self.local.addr(), remote_addr, N)])
            .timeout(Duration::from_secs(10))
            .await;
        if let Err(e) = w {
            panic!(
                "invariant violated: a normal write to {remote} failed ({}): {e}",
                peer.transport()
            );
        }
        let rd = peer
            .read(&[OpDesc::new(self.local.addr() + 4096, remote_addr, N)])
            .timeout(Duration::from_secs(10))
            .await;
        if let Err(e) = rd {
            panic!(
                "invariant violated: a normal read from {remote} failed ({}): {e}",
                peer.transport()
            );
        }
        let mut back = vec![0u8; N as usize];
        self.local
            .read_at(4096, &mut back)
            .expect("harness setup: prober local read");
        assert!(
            back == pattern,
            "invariant violated: bytes written to {remote} and read back differ ({})",
            peer.transport()
        );
        drop(peer);
        let _ = self.engine.disconnect(remote).await;
        (remote_addr, pattern)
    }
}
