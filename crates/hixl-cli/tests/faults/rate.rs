//! A rate-limited veth.

use std::time::{Duration, Instant};

use hixl::{Error, OpDesc};

use crate::check::{assert_failures_sensible, check_local, check_target, stats};
use crate::client::{connect, ctx, health, initiator, quiesce, secs};
use crate::netns::{in_namespace_b, say, NetGuard};
use crate::patterns::pattern;
use crate::role::spawn_target;
use crate::workload::{run_phase, Layout};
use crate::{MARGIN, REMOTE_BG};

/// Both veth ends are limited to 40 Mbit/s: transfers mostly complete, slower, and verify; a
/// write too large for its timeout fails with a timeout in time and lands nothing outside
/// its range.
pub(crate) fn rate_limited_link() {
    let Some(g) = NetGuard::create("rate_limited_link", "rate", &["ip", "tc"]) else {
        return;
    };
    in_namespace_b(&g, |net| async move {
        let t_test = Instant::now();
        let lay = Layout {
            descs: 3,
            dlen: 50_021,
            gap: 1_003,
            slots: 65,
            big: 6 << 20,
        };
        let timeout = Duration::from_secs(3);
        let mut target = spawn_target(&net.a, lay.mem());
        let (e, local) = initiator(&lay).await;
        let peer = connect(&e, &target.engine).await;
        let h = health(&peer, &local, lay, 1, "before the rate limit").await;
        net.rate_limit("40mbit");
        let c = ctx(&peer, &local, lay, Duration::from_secs(4), timeout);
        let mut p = run_phase(c.clone(), None).await;
        p.fates.insert(lay.health_slot(), h);
        let s = stats(&p);
        assert_failures_sensible(&p, timeout, &target.engine);
        assert!(s.ok > 0, "no transfer completed under the rate limit");
        // Writes and reads each cross the link once, in opposite directions.
        let write_rate = p
            .ops
            .iter()
            .filter(|o| o.write && o.err.is_none())
            .map(|o| o.bytes)
            .sum::<u64>() as f64
            / p.took.as_secs_f64();
        assert!(
            write_rate < 1.3 * 5e6,
            "{write_rate} B/s written: the rate limit did not apply"
        );

        // 6 MiB at 5 MB/s needs over a second: with 500 ms it must time out.
        let big_seed = 0xB16;
        local
            .write_at(
                lay.big_off(),
                &pattern(big_seed, lay.big_off(), lay.big as usize),
            )
            .unwrap();
        let t0 = Instant::now();
        let r = peer
            .write(&[OpDesc::new(
                local.addr() + lay.big_off(),
                c.kv + lay.big_off(),
                lay.big,
            )])
            .timeout(Duration::from_millis(500))
            .await;
        let big_took = t0.elapsed();
        assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
        assert!(
            big_took <= Duration::from_millis(500) + MARGIN,
            "{big_took:?}"
        );
        net.heal_tc();
        let reaped = quiesce(&e, Duration::from_secs(10)).await;
        assert!(reaped.is_some(), "abandoned ops were not reaped");
        check_target(&mut target, &lay, &p.fates, &[REMOTE_BG, big_seed]);
        check_local(&local, &lay, &p.fates, &[big_seed]);
        assert!(peer.is_connected(), "the rate limit cost the link");
        let _ = health(&peer, &local, lay, 2, "after the rate limit").await;
        target.stop();
        say(&format!(
            "faults::rate_limited_link: {} transfers in {} ({} ok, {} failed: {} timeouts); \
             {:.2} MB/s written, {:.2} MB/s verified both ways (limit 5 MB/s each way); slowest failure {}; \
             6 MiB write with a 500 ms timeout failed after {}, its ops reaped {} later; test took {}",
            p.ops.len(),
            secs(p.took),
            s.ok,
            s.failed,
            s.timeouts,
            write_rate / 1e6,
            s.bytes_ok as f64 / p.took.as_secs_f64() / 1e6,
            secs(s.slowest_failure),
            secs(big_took),
            reaped.map(secs).unwrap_or_default(),
            secs(t_test.elapsed()),
        ));
    });
}
