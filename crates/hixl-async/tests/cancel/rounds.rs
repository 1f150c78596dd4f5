//! Rounds of the randomized test: concurrent tasks, the end-of-round checks, and
//! re-registration.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hixl_async::{Engine, HostBuffer, Region};
use hixl_core::OpDesc;

use crate::model::{Model, Runs, Side};
use crate::op::{one_op, Cx, How, Scratch, Tally};
use crate::process::{open_fds, rss_kib, runtime, serial, steady_malloc};
use crate::rig::{wait_idle, Mode, Rig};
use crate::rng::{fill, rounds, seed, splitmix, Rng};
use crate::{DEREG, GRACE, LEN, OPS_PER_TASK, PAGE, RSS_SLACK_KIB, T, TASKS};

/// Checks `mem` (one whole region) against the model: quarantined ranges byte by byte (old
/// or new value), everything else exactly.
pub(crate) fn verify(
    what: &str,
    seed: u64,
    mem: &[u8],
    m: &mut Model,
    on_target: bool,
    tally: &mut Tally,
) {
    let mut model = std::mem::take(&mut m.side(on_target).model);
    let mut new = Vec::new();
    for q in m.quarantine.iter().filter(|q| q.on_target == on_target) {
        let got = &mem[q.off..q.off + q.len];
        let before = &model[q.off..q.off + q.len];
        let new = Scratch::draw_into(&mut new, q.len, q.seed);
        // (A range whose old and new bytes coincide, e.g. a one-byte one, counts as landed.)
        if got == new {
            tally.landed += 1;
        } else if got == before {
            tally.untouched += 1;
        } else {
            tally.partial += 1;
            for (i, ((g, b), n)) in got.iter().zip(before).zip(new).enumerate() {
                assert!(
                    g == b || g == n,
                    "{what} (seed {seed:#x}): byte {} of abandoned op {}'s destination holds {g:#04x}, neither the old {b:#04x} nor the new {n:#04x}",
                    q.off + i,
                    q.op
                );
            }
        }
        model[q.off..q.off + q.len].copy_from_slice(got);
    }
    if mem != &model[..] {
        let bad: Vec<usize> = mem
            .iter()
            .zip(&model)
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(i, _)| i)
            .collect();
        let i = bad[0];
        panic!(
            "{what} (seed {seed:#x}): {} bytes outside live ops changed; first at offset {i} (page {}): {:#04x}, expected {:#04x}; last at {}",
            bad.len(),
            i / PAGE,
            mem[i],
            model[i],
            bad[bad.len() - 1]
        );
    }
    m.side(on_target).model = model;
}

pub(crate) async fn round(rig: &mut Rig, seed: u64, r: usize, rng: &mut Rng) -> Tally {
    let name = format!("kv{r}");
    let mut tguard = vec![0u8; LEN];
    let mut lguard = vec![0u8; LEN];
    fill(&mut tguard, rng.next());
    fill(&mut lguard, rng.next());
    let (remote, local, peer, rr) = rig.setup(&name, &tguard, &lguard).await;
    let model = Model {
        target: Side {
            model: tguard,
            runs: Runs::new(LEN / PAGE),
        },
        local: Side {
            model: lguard,
            runs: Runs::new(LEN / PAGE),
        },
        quarantine: Vec::new(),
    };
    let cx = Arc::new(Cx {
        seed,
        peer: peer.clone(),
        remote: remote.clone(),
        local: local.clone(),
        rr,
        model: Mutex::new(model),
        tally: Mutex::new(Tally::default()),
    });
    let tasks: Vec<_> = (0..TASKS)
        .map(|k| {
            let cx = cx.clone();
            let mut rng = Rng::new(rng.next());
            tokio::spawn(async move {
                let mut scratch = Scratch::default();
                let first = ((r * TASKS + k) * OPS_PER_TASK) as u64;
                for i in 0..OPS_PER_TASK as u64 {
                    one_op(&cx, &mut rng, &mut scratch, first + i, None).await;
                }
            })
        })
        .collect();
    for t in tasks {
        if let Err(e) = t.await {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    // A last large op dropped at once, so that deregistration meets an abandoned op in
    // flight on every transport.
    let last = ((r + 1) * TASKS * OPS_PER_TASK + r) as u64;
    one_op(&cx, rng, &mut Scratch::default(), last, Some(How::DropNow)).await;
    let cx = Arc::try_unwrap(cx).unwrap_or_else(|_| panic!("tasks still hold the round"));
    let mut tally = cx.tally.into_inner().unwrap_or_else(|p| p.into_inner());
    let mut m = cx.model.into_inner().unwrap_or_else(|p| p.into_inner());
    tally.in_flight_at_end = rig.init.ops_in_flight() as u64;

    let what = format!("{:?} round {r}", rig.mode);
    // One region is deregistered while abandoned ops may still be in flight: deregistration
    // waits for their leases (within a bound), and once it has returned nothing may land in
    // the buffer any more. The initiator's region first in even rounds, the target's in odd
    // ones (for pool memory, whose buffer goes back to the pool rather than to us, the
    // target's memory is checked before it is deregistered).
    let target_first = r % 2 == 1 && rig.mode != Mode::FabricPool;
    let mut tbuf = None;
    if target_first {
        let b = dereg_within(&rig.target, &remote, &what, seed)
            .await
            .expect("the target's buffer comes back");
        verify(
            &format!("{what}, target"),
            seed,
            b.as_slice(),
            &mut m,
            true,
            &mut tally,
        );
        tbuf = Some(b);
    }
    let lbuf = dereg_within(&rig.init, &local, &what, seed)
        .await
        .expect("the initiator's buffer comes back");
    verify(
        &format!("{what}, initiator"),
        seed,
        lbuf.as_slice(),
        &mut m,
        false,
        &mut tally,
    );
    assert!(
        wait_idle(&rig.init, GRACE).await,
        "{what} (seed {seed:#x}): {} ops still in flight {GRACE:?} after the last was posted",
        rig.init.ops_in_flight()
    );
    assert_eq!(rig.target.ops_in_flight(), 0);
    assert!(
        lbuf.as_slice() == &m.local.model[..],
        "{what} (seed {seed:#x}): the initiator's buffer changed after its deregistration returned"
    );
    match &tbuf {
        Some(b) => assert!(
            b.as_slice() == &m.target.model[..],
            "{what} (seed {seed:#x}): the target's buffer changed after its deregistration returned"
        ),
        None => {
            let mut tmem = vec![0u8; LEN];
            remote.read_at(0, &mut tmem).expect("read target");
            verify(
                &format!("{what}, target"),
                seed,
                &tmem,
                &mut m,
                true,
                &mut tally,
            );
            drop(tmem);
            tbuf = dereg_within(&rig.target, &remote, &what, seed).await;
        }
    }
    drop(m);
    match rig.mode {
        Mode::FabricPool => assert!(tbuf.is_none(), "pool memory goes back to the pool"),
        Mode::Tcp | Mode::TcpUring | Mode::FabricCma => {
            let b = tbuf.expect("the target's buffer comes back");
            assert_eq!(b.len(), LEN);
            rig.tbuf = Some(b);
        }
    }
    assert_eq!(lbuf.len(), LEN);
    rig.lbuf = Some(lbuf);
    rig.init.disconnect(peer.name()).await.expect("disconnect");
    tally
}

/// Deregisters `region`, failing the test past [`DEREG`] (a leaked lease hangs it).
pub(crate) async fn dereg_within(
    e: &Engine,
    region: &Region,
    what: &str,
    seed: u64,
) -> Option<HostBuffer> {
    tokio::time::timeout(DEREG, e.deregister(region))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{what} (seed {seed:#x}): deregistering {}'s region hung for {DEREG:?}: a lease leaked",
                e.local_engine()
            )
        })
        .expect("deregister")
}

/// Registers again after the last round and moves 1 MiB both ways.
pub(crate) async fn reregister_works(rig: &mut Rig, rng: &mut Rng) {
    let mut tguard = vec![0u8; 2 << 20];
    let mut lguard = vec![0u8; 2 << 20];
    fill(&mut tguard, rng.next());
    fill(&mut lguard, rng.next());
    rig.tbuf = None;
    rig.lbuf = None;
    let (remote, local, peer, rr) = rig.setup("again", &tguard, &lguard).await;
    let d = OpDesc::new(local.addr(), rr.addr, 1 << 20);
    peer.write(&[d]).timeout(T).await.expect("write");
    let mut got = vec![0u8; 1 << 20];
    remote.read_at(0, &mut got).expect("read");
    assert!(got[..] == lguard[..1 << 20]);
    let d = OpDesc::new(local.addr() + (1 << 20), rr.addr + (1 << 20), 1 << 20);
    peer.read(&[d]).timeout(T).await.expect("read");
    local.read_at(1 << 20, &mut got).expect("read");
    assert!(got[..] == tguard[1 << 20..]);
    rig.init.deregister(&local).await.expect("dereg");
    rig.target.deregister(&remote).await.expect("dereg");
    rig.init.disconnect(peer.name()).await.expect("disconnect");
}

pub(crate) fn randomized(mode: Mode) {
    let _serial = serial();
    let test = format!("randomized cancellation over {mode:?}");
    let seed = seed(&test);
    let rounds = rounds();
    let started = Instant::now();
    steady_malloc();
    runtime().block_on(async move {
        let mut rng = Rng::new(seed ^ splitmix(mode as u64));
        let mut rig = Rig::new(mode).await;
        let mut total = Tally::default();
        // RSS and open fds after each round may not grow past round 0's (RSS by a little
        // slack; a leaked region would be 32 MiB a round).
        let (mut rss0, mut fds0) = (0u64, 0usize);
        for r in 0..rounds {
            let t = round(&mut rig, seed, r, &mut rng).await;
            eprintln!("{}", t.report(&format!("{mode:?} round {r}")));
            total.add(&t);
            if r == 0 {
                // Sockets of the closed link go away asynchronously.
                tokio::time::sleep(Duration::from_millis(200)).await;
                (rss0, fds0) = (rss_kib(), open_fds());
            }
            let (rss, mut fds) = (rss_kib(), open_fds());
            let end = Instant::now() + Duration::from_secs(2);
            while fds > fds0 && Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(10)).await;
                fds = open_fds();
            }
            eprintln!("{mode:?} round {r}: RSS {rss} KiB, {fds} fds");
            assert!(
                fds <= fds0,
                "{mode:?} (seed {seed:#x}): {fds} fds open after round {r}, {fds0} after round 0"
            );
            assert!(
                rss <= rss0 + RSS_SLACK_KIB,
                "{mode:?} (seed {seed:#x}): RSS {rss} KiB after round {r}, {rss0} KiB after round 0"
            );
        }
        reregister_works(&mut rig, &mut rng).await;
        eprintln!("{}", total.report(&format!("{mode:?} total")));
    });
    eprintln!("{test}: {rounds} rounds in {:?}", started.elapsed());
}
