//! Faults of a link that goes silent: a cut while transfers are in flight, and a disconnect
//! from a silent peer.

use std::time::{Duration, Instant};

use hixl::{Engine, Error, HostBuffer, OpDesc};

use crate::check::{assert_failures_sensible, check_local, check_target, stats};
use crate::client::{connect, ctx, health, initiator, quiesce, secs};
use crate::netns::{in_namespace_b, say, Net, NetGuard};
use crate::role::spawn_target;
use crate::workload::{descs, run_phase, Fault, Layout};
use crate::{IP_B, LOCAL_BG, MARGIN};

/// The veth goes silent (every packet dropped both ways) while transfers are in flight (the
/// target is paused around the rule so that some certainly are). With nothing coming back,
/// they fail by their timeouts, as do transfers posted later; memory is checked while the
/// cut still holds; connecting during the cut fails within the connect timeout; after the cut
/// heals the same engine reconnects to the same target and moves verified bytes.
pub(crate) fn link_cut_mid_transfer() {
    let Some(g) = NetGuard::create("link_cut_mid_transfer", "cut", &["ip", "nft"]) else {
        return;
    };
    in_namespace_b(&g, |net| async move {
        let t_test = Instant::now();
        let lay = Layout {
            descs: 3,
            dlen: 100_003,
            gap: 1_001,
            slots: 33,
            big: 0,
        };
        let timeout = Duration::from_secs(3);
        let mut target = spawn_target(&net.a, lay.mem());
        let (e, local) = initiator(&lay).await;
        let peer = connect(&e, &target.engine).await;
        let h = health(&peer, &local, lay, 1, "before the cut").await;

        let c = ctx(&peer, &local, lay, Duration::from_millis(1600), timeout);
        let n = net.clone();
        let cut = Fault {
            at: Duration::from_millis(600),
            pid: target.pid,
            action: Box::new(move || n.cut()),
            resume: true,
        };
        let mut p = run_phase(c, Some(cut)).await;
        p.fates.insert(lay.health_slot(), h);
        let f = p.fault.unwrap();
        let s = stats(&p);
        assert_failures_sensible(&p, timeout, &target.engine);
        let in_flight = f.in_flight(&p);
        let unanswered = f.unanswered(&p);
        let after = f.after(&p);
        assert!(
            in_flight.iter().any(|o| o.err.is_some()),
            "no transfer in flight when the link was cut failed"
        );
        for o in unanswered.iter().chain(&after) {
            assert!(
                o.err.is_some(),
                "a transfer the paused target could not answer before the cut, or posted after it, completed: {o:?}"
            );
        }
        let detect: Vec<Duration> = in_flight
            .iter()
            .filter(|o| o.err.is_some())
            .map(|o| o.end().saturating_sub(f.done))
            .collect();
        // Memory is checked while the cut holds: no late byte can land meanwhile.
        check_target(&mut target, &lay, &p.fates, &[]);
        check_local(&local, &lay, &p.fates, &[LOCAL_BG]);
        let dropped = Net::dropped(&net.a);
        assert!(dropped > 0, "the cut dropped no packet");
        let still_up = peer.is_connected();
        let pending = e.ops_in_flight();

        // A new transfer on the silent link also fails by its timeout.
        let t0 = Instant::now();
        let r = peer
            .write(&descs(
                &ctx(&peer, &local, lay, Duration::ZERO, timeout),
                lay.probe_slot(),
                0,
            ))
            .timeout(Duration::from_millis(500))
            .await;
        let late = t0.elapsed();
        assert!(
            matches!(&r, Err(Error::Timeout { .. })) || r.as_ref().is_err_and(Error::is_link_lost),
            "{r:?}"
        );
        assert!(late <= Duration::from_millis(500) + MARGIN, "{late:?}");

        // Reconnecting during the cut fails within the connect timeout. (Whether disconnecting
        // reaps the abandoned ops at once is only reported: it does not when a data connection's
        // writer is blocked on a full socket; see disconnect_from_a_silent_peer_lets_go.)
        e.disconnect(&target.engine).await.unwrap();
        let reaped = quiesce(&e, Duration::from_secs(1)).await;
        let t0 = Instant::now();
        let r = e.connect(&target.engine, Duration::from_millis(1500)).await;
        let connect_took = t0.elapsed();
        assert!(r.is_err(), "connected across a cut link");
        assert!(
            connect_took <= Duration::from_millis(1500) + MARGIN,
            "connect took {connect_took:?}"
        );
        let connect_err = r.err().map(|e| e.to_string()).unwrap_or_default();

        // Healed: the same engine reconnects to the same target and moves verified bytes.
        net.heal_nft();
        let peer2 = connect(&e, &target.engine).await;
        let _ = health(&peer2, &local, lay, 2, "after the cut healed").await;
        // Once the old connections drain, every abandoned op is reaped.
        let drained = quiesce(&e, Duration::from_secs(10)).await;
        target.stop();
        say(&format!(
            "faults::link_cut_mid_transfer: {} transfers ({} ok, {} failed: {} timeouts, {} peer lost); \
             {} in flight at the cut ({} posted while the target was paused), {} of them failing {}..{} after it; \
             {} posted after the cut, all failed; \
             slowest failure {} (timeout {}); {} packets dropped; link still reported up after the cut: {}; \
             ops pending before disconnect: {}, reaped after disconnect in {}, after the heal in {}; \
             connect during the cut: \"{}\" after {}; \
             transport: {}; test took {}",
            p.ops.len(),
            s.ok,
            s.failed,
            s.timeouts,
            s.lost,
            in_flight.len(),
            unanswered.len(),
            detect.len(),
            detect.iter().min().map(|d| secs(*d)).unwrap_or_default(),
            detect.iter().max().map(|d| secs(*d)).unwrap_or_default(),
            after.len(),
            secs(s.slowest_failure),
            secs(timeout),
            dropped,
            still_up,
            pending,
            reaped.map(secs).unwrap_or_else(|| "not within 1s".into()),
            drained.map(secs).unwrap_or_else(|| "not within 10s".into()),
            connect_err,
            secs(connect_took),
            peer.transport(),
            secs(t_test.elapsed()),
        ));
        assert!(
            drained.is_some(),
            "abandoned ops of the cut link were not reaped after it healed"
        );
    });
}
/// Disconnecting from a peer that went silent lets go of what the link holds: the abandoned
/// transfer is reaped and its local region can be deregistered at once.
///
/// Ignored because it fails with this engine: a TCP data connection's writer task looks for
/// the link's death only between batches, so a writer blocked in a socket write to a peer
/// that stopped acknowledging (send buffer full) never sees the disconnect. It never shuts
/// the socket down, so the reader never fails the parts in flight, the abandoned op keeps its
/// lease on the local region, and `deregister` waits until TCP gives up
/// (`net.ipv4.tcp_retries2`, about 15 minutes by default) or the link heals.
pub(crate) fn disconnect_from_a_silent_peer_lets_go() {
    let Some(g) = NetGuard::create(
        "disconnect_from_a_silent_peer_lets_go",
        "silent",
        &["ip", "nft"],
    ) else {
        return;
    };
    in_namespace_b(&g, |net| async move {
        const LEN: u64 = 16 << 20;
        let target = spawn_target(&net.a, LEN);
        let e = Engine::builder(IP_B).build().await.unwrap();
        let src = e
            .register(HostBuffer::zeroed(LEN as usize).unwrap())
            .unwrap();
        let peer = connect(&e, &target.engine).await;
        let kv = peer.region("kv").unwrap().addr;
        net.cut();
        // 16 MiB cannot fit in the socket buffers of a silent link: the writers block.
        let r = peer
            .write(&[OpDesc::new(src.addr(), kv, LEN)])
            .timeout(Duration::from_millis(500))
            .await;
        assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
        e.disconnect(&target.engine).await.unwrap();
        let reaped = quiesce(&e, Duration::from_secs(2)).await;
        let held = e.ops_in_flight();
        let dereg = tokio::time::timeout(Duration::from_secs(2), e.deregister(&src)).await;
        // Let the stuck connections drain, so the test ends promptly either way.
        net.heal_nft();
        assert!(
            reaped.is_some() && dereg.is_ok(),
            "2 s after disconnect: {held} abandoned op(s) still held; deregister {}",
            if dereg.is_ok() {
                "returned"
            } else {
                "still waiting"
            }
        );
        drop(target);
    });
}
