//! The initiator side in namespace B: its engine, its link, the context of its workers and the
//! health checks of a link.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hixl::{Engine, HostBuffer, Peer, Region};

use crate::patterns::{pattern, splitmix};
use crate::workload::{write_and_read_back, Ctx, Fate, Layout};
use crate::{IP_B, LOCAL_BG};

/// A client engine in namespace B with a region twice the target's, filled with its pattern.
pub(crate) async fn initiator(lay: &Layout) -> (Engine, Region) {
    let e = Engine::builder(IP_B).build().await.unwrap();
    let mem = lay.mem() as usize;
    let mut img = pattern(LOCAL_BG, 0, mem);
    img.extend_from_within(..);
    let mut buf = HostBuffer::zeroed(2 * mem).unwrap();
    buf.as_mut_slice().copy_from_slice(&img);
    let local = e.register(buf).unwrap();
    (e, local)
}

pub(crate) async fn connect(e: &Engine, target: &str) -> Peer {
    let p = e.connect(target, Duration::from_secs(5)).await.unwrap();
    // Across network namespaces the fabric cannot serve the peer: its Unix abstract socket
    // exists only in the target's network namespace. The engine must have fallen back to TCP.
    // (For targets started by `ip netns exec` it does so because their mount namespace
    // differs; for one sharing our mount namespace see
    // auto_falls_back_to_tcp_for_a_peer_in_another_netns_sharing_our_mounts.)
    assert!(
        p.transport().starts_with("tcp"),
        "expected a TCP fallback across namespaces: {}",
        p.transport()
    );
    p
}

pub(crate) fn ctx(
    peer: &Peer,
    local: &Region,
    lay: Layout,
    stop_at: Duration,
    timeout: Duration,
) -> Ctx {
    Ctx {
        peer: peer.clone(),
        local: local.clone(),
        kv: peer.region("kv").unwrap().addr,
        lay,
        start: Instant::now(),
        stop_at,
        timeout,
        seed: splitmix(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
                ^ u64::from(std::process::id()),
        ),
        outstanding: Arc::default(),
        posted: Arc::default(),
    }
}

/// A write+read-back of the health slot that must complete and verify; returns what the slot
/// now holds.
pub(crate) async fn health(
    peer: &Peer,
    local: &Region,
    lay: Layout,
    seed: u64,
    what: &str,
) -> Fate {
    let c = ctx(peer, local, lay, Duration::ZERO, Duration::from_secs(5));
    let mut fate = Fate::new();
    let mut ops = Vec::new();
    write_and_read_back(&c, lay.health_slot(), seed, &mut fate, &mut ops).await;
    for o in &ops {
        assert!(o.err.is_none(), "{what}: {:?}", o.err);
    }
    assert_eq!(ops.len(), 2, "{what}");
    fate
}
/// Waits until every abandoned op has been reaped (its last part answered or failed).
pub(crate) async fn quiesce(e: &Engine, within: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    while e.ops_in_flight() > 0 {
        if t0.elapsed() > within {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Some(t0.elapsed())
}

pub(crate) fn secs(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}
