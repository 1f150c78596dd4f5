//! SIGKILL of the target mid-transfer.

use std::time::{Duration, Instant};

use crate::check::{assert_failures_sensible, check_local, stats};
use crate::client::{connect, ctx, health, initiator, quiesce, secs};
use crate::netns::{in_namespace_b, say, NetGuard};
use crate::role::spawn_target;
use crate::workload::{descs, run_phase, Fault, Layout};
use crate::LOCAL_BG;

/// The target process is SIGKILLed while transfers are in flight (it is paused first so that
/// some certainly are): they fail fast with a peer-lost error naming the target, the link is marked down, later transfers on it fail at
/// once, nothing lands outside its range locally, and the same engine then works with a fresh
/// target.
pub(crate) fn target_killed_mid_transfer() {
    let Some(g) = NetGuard::create("target_killed_mid_transfer", "kill", &["ip"]) else {
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
        let target = spawn_target(&net.a, lay.mem());
        let name = target.engine.clone();
        let (e, local) = initiator(&lay).await;
        let peer = connect(&e, &name).await;
        let h = health(&peer, &local, lay, 1, "before the kill").await;
        let c = ctx(&peer, &local, lay, Duration::from_millis(1600), timeout);
        let kill = Fault {
            at: Duration::from_millis(600),
            pid: target.pid,
            action: Box::new(move || {
                let mut t = target;
                t.kill();
            }),
            resume: false,
        };
        let mut p = run_phase(c, Some(kill)).await;
        p.fates.insert(lay.health_slot(), h);
        let f = p.fault.unwrap();
        let s = stats(&p);
        assert_failures_sensible(&p, timeout, &name);
        let in_flight = f.in_flight(&p);
        let unanswered = f.unanswered(&p);
        let after = f.after(&p);
        assert!(
            in_flight.iter().any(|o| o.err.is_some()),
            "no transfer in flight when the target was killed failed ({} in flight, fault {f:?}, {} ops in the phase)",
            in_flight.len(),
            p.ops.len()
        );
        for o in unanswered.iter().chain(&after) {
            assert!(
                o.err.is_some(),
                "a transfer the paused target could not answer before the kill, or posted after it, completed: {o:?}"
            );
        }
        let detect: Vec<Duration> = in_flight
            .iter()
            .filter(|o| o.err.is_some())
            .map(|o| o.end().saturating_sub(f.done))
            .collect();
        // The peer's death is seen by its sockets (the kernel resets them), not by a timeout.
        assert_eq!(
            s.timeouts, 0,
            "transfers to a killed target timed out instead of failing"
        );
        let t0 = Instant::now();
        while peer.is_connected() && t0.elapsed() < Duration::from_secs(2) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            !peer.is_connected(),
            "the link to a killed target still looks up"
        );
        let cause = peer.error().map(|e| e.to_string()).unwrap_or_default();
        let t0 = Instant::now();
        let r = peer
            .write(&descs(
                &ctx(&peer, &local, lay, Duration::ZERO, timeout),
                lay.probe_slot(),
                0,
            ))
            .timeout(timeout)
            .await;
        let dead_took = t0.elapsed();
        let err = r.expect_err("a write to a killed target completed");
        assert!(err.to_string().contains(&name), "{err}");
        assert!(dead_took < Duration::from_millis(200), "{dead_took:?}");
        let reaped = quiesce(&e, Duration::from_secs(3)).await;
        assert!(reaped.is_some(), "ops to the killed target were not reaped");
        check_local(&local, &lay, &p.fates, &[LOCAL_BG]);

        // The same engine serves a fresh target in the same namespace.
        let target2 = spawn_target(&net.a, lay.mem());
        let peer2 = connect(&e, &target2.engine).await;
        let _ = health(&peer2, &local, lay, 2, "with a fresh target").await;
        e.disconnect(&name).await.unwrap();
        target2.stop();
        say(&format!(
            "faults::target_killed_mid_transfer: {} transfers ({} ok, {} failed: {} peer lost, {} timeouts); \
             {} in flight at the kill ({} posted while the target was paused), {} of them failing {}..{} after it; \
             {} posted after the kill, all failed; \
             link cause: \"{cause}\"; a later write failed in {:?}; test took {}",
            p.ops.len(),
            s.ok,
            s.failed,
            s.lost,
            s.timeouts,
            in_flight.len(),
            unanswered.len(),
            detect.len(),
            detect.iter().min().map(|d| secs(*d)).unwrap_or_default(),
            detect.iter().max().map(|d| secs(*d)).unwrap_or_default(),
            after.len(),
            dead_took,
            secs(t_test.elapsed()),
        ));
    });
}
