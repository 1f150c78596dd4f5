//! Random packet loss on the veth.

use std::time::{Duration, Instant};

use crate::check::{assert_failures_sensible, check_local, check_target, stats};
use crate::client::{connect, ctx, health, initiator, quiesce, secs};
use crate::netns::{in_namespace_b, say, Net, NetGuard};
use crate::role::spawn_target;
use crate::workload::{run_phase, Layout};
use crate::LOCAL_BG;

/// 10% of the packets in each direction are dropped at random for the whole phase: TCP
/// retransmits, so transfers mostly complete; every completed one verifies and every failed
/// one failed within its timeout.
pub(crate) fn random_loss_10_percent() {
    let Some(g) = NetGuard::create("random_loss_10_percent", "loss", &["ip", "nft"]) else {
        return;
    };
    in_namespace_b(&g, |net| async move {
        let t_test = Instant::now();
        let lay = Layout {
            descs: 3,
            dlen: 30_011,
            gap: 997,
            slots: 65,
            big: 0,
        };
        let timeout = Duration::from_secs(4);
        let mut target = spawn_target(&net.a, lay.mem());
        let (e, local) = initiator(&lay).await;
        let peer = connect(&e, &target.engine).await;
        let h = health(&peer, &local, lay, 1, "before the loss").await;
        net.lossy();
        let c = ctx(&peer, &local, lay, Duration::from_secs(5), timeout);
        let mut p = run_phase(c, None).await;
        p.fates.insert(lay.health_slot(), h);
        let dropped = Net::dropped(&net.a) + Net::dropped(&net.b);
        net.heal_nft();
        let s = stats(&p);
        assert_failures_sensible(&p, timeout, &target.engine);
        assert!(dropped > 0, "the loss rule dropped no packet");
        assert!(s.ok > 0, "no transfer completed under 10% loss");
        let reaped = quiesce(&e, Duration::from_secs(10)).await;
        assert!(reaped.is_some(), "abandoned ops were not reaped");
        check_target(&mut target, &lay, &p.fates, &[]);
        check_local(&local, &lay, &p.fates, &[LOCAL_BG]);
        assert!(
            peer.is_connected(),
            "loss cost the link: {:?}",
            peer.error()
        );
        let _ = health(&peer, &local, lay, 2, "after the loss").await;
        target.stop();
        say(&format!(
            "faults::random_loss_10_percent: {} transfers in {} ({} ok, {} failed: {} timeouts, {} peer lost); \
             {:.1} MB/s verified; slowest failure {} (timeout {}); {dropped} packets dropped; test took {}",
            p.ops.len(),
            secs(p.took),
            s.ok,
            s.failed,
            s.timeouts,
            s.lost,
            s.bytes_ok as f64 / p.took.as_secs_f64() / 1e6,
            secs(s.slowest_failure),
            secs(timeout),
            secs(t_test.elapsed()),
        ));
    });
}
