//! Ops queued behind a long op: a deadline on one, and one dropped while queued.

use std::time::{Duration, Instant};

use hixl_async::{Peer, Region};
use hixl_core::{Error, OpDesc, RemoteRegion, TransferStatus};

use crate::rig::{wait_idle, Mode, Rig};
use crate::rng::{fill, seed, Rng};
use crate::{DEREG, GRACE, HANG, LATE};

/// Memory for the ordered-op tests: a long op `A` and, queued behind it, a shorter op `B`.
/// `B` is larger than what the fabric copies on the submitting thread (4 MiB per call), so it
/// too goes to the copy stream, behind `A`; a smaller one would run at once.
pub(crate) const A_LEN: usize = 32 << 20;
pub(crate) const B_LEN: usize = 8 << 20;

/// Engines of `mode` with `A_LEN + B_LEN` bytes on each side, guard-filled, connected (over
/// tcp by one data connection, so that `B` is queued behind all of `A`).
pub(crate) async fn queued_rig(
    mode: Mode,
    rng: &mut Rng,
) -> (Rig, Region, Region, Peer, RemoteRegion) {
    let mut rig = Rig::with_streams(mode, 1).await;
    let mut tguard = vec![0u8; A_LEN + B_LEN];
    let mut lguard = vec![0u8; A_LEN + B_LEN];
    fill(&mut tguard, rng.next());
    fill(&mut lguard, rng.next());
    let (remote, local, peer, rr) = rig.setup("kv", &tguard, &lguard).await;
    (rig, remote, local, peer, rr)
}

/// A deadline on an op queued behind a long one (so it cannot have finished): `Timeout` at
/// the deadline, status `TimedOut`; the long op completes; the abandoned op drains by itself
/// and its destination holds old or new bytes only.
///
/// Returns `None` when the run cannot count: the queued op completed because this thread was
/// descheduled between submitting it and polling it for longer than a quarter of the long
/// op's time (both ops finished meanwhile, and a finished op reports its success).
pub(crate) async fn deadline_behind_a_long_op(mode: Mode) -> Option<()> {
    let mut rng = Rng::new(seed(&format!("deadline behind a long op over {mode:?}")));
    let (rig, remote, local, peer, rr) = queued_rig(mode, &mut rng).await;
    let mut before = vec![0u8; B_LEN];
    remote
        .read_at(A_LEN as u64, &mut before)
        .expect("read target");
    let mut new = vec![0u8; B_LEN];
    local.read_at(A_LEN as u64, &mut new).expect("read local");
    let a = peer.write(&[OpDesc::new(local.addr(), rr.addr, A_LEN as u64)]);
    let d = Duration::from_micros(300);
    let started = Instant::now();
    let mut b = peer
        .write(&[OpDesc::new(
            local.addr() + A_LEN as u64,
            rr.addr + A_LEN as u64,
            B_LEN as u64,
        )])
        .timeout(d);
    let got_b = (&mut b).await;
    let took = started.elapsed();
    let b_status = b.status();
    drop(b);
    a.timeout(HANG).await.expect("the long op completes");
    let long = started.elapsed();
    match got_b {
        Ok(()) if took * 4 >= long => {
            eprintln!(
                "{mode:?}: the queued op was first polled after {took:?} of the long op's {long:?} and had completed; not counted"
            );
            return None;
        }
        Ok(()) => panic!(
            "the op queued behind 32 MiB completed after {took:?}, within a quarter of the long op's {long:?}"
        ),
        Err(e) => {
            assert!(
                matches!(e, Error::Timeout { after, .. } if after == d),
                "{e:?}"
            );
            assert_eq!(b_status, TransferStatus::TimedOut);
            assert!(
                took >= d && took < d + LATE,
                "deadline {d:?} after {took:?}"
            );
        }
    }
    assert!(
        wait_idle(&rig.init, GRACE).await,
        "the timed-out op never drained"
    );
    let mut got = vec![0u8; B_LEN];
    remote.read_at(A_LEN as u64, &mut got).expect("read target");
    let changed = got.iter().zip(&before).filter(|(g, o)| g != o).count();
    for (i, ((g, o), n)) in got.iter().zip(&before).zip(&new).enumerate() {
        assert!(g == o || g == n, "byte {i} of the timed-out op: {g:#x}");
    }
    eprintln!(
        "{mode:?}: timed out after {took:?}; {changed} of {B_LEN} bytes of it changed by the end"
    );
    tokio::time::timeout(DEREG, rig.init.deregister(&local))
        .await
        .expect("deregister in time")
        .expect("deregister");
    Some(())
}

/// An op dropped while all its parts are still queued behind a long op moves no byte: "parts
/// not yet sent are never sent". Returns how many of its destination bytes changed (its data
/// is random: were it all to land, about 1 byte in 256 would still read unchanged), or `None`
/// when the run could not show that the op was still queued at its drop: the drop came later
/// than a quarter of the long op's time after its submission (this thread was descheduled between submitting and
/// dropping, while the connection's tasks sent all of the long op), so its parts may have
/// started, as they are allowed to.
pub(crate) async fn dropped_while_queued(mode: Mode) -> Option<usize> {
    let mut rng = Rng::new(seed(&format!("dropped while queued over {mode:?}")));
    let (rig, remote, local, peer, rr) = queued_rig(mode, &mut rng).await;
    let mut before = vec![0u8; B_LEN];
    remote
        .read_at(A_LEN as u64, &mut before)
        .expect("read target");
    let a = peer.write(&[OpDesc::new(local.addr(), rr.addr, A_LEN as u64)]);
    // From A's submission on (the fabric copies A's first call on this thread first).
    let started = Instant::now();
    let b = peer.write(&[OpDesc::new(
        local.addr() + A_LEN as u64,
        rr.addr + A_LEN as u64,
        B_LEN as u64,
    )]);
    assert_eq!(b.status(), TransferStatus::Waiting);
    drop(b);
    let dropped = started.elapsed();
    a.timeout(HANG).await.expect("the long op completes");
    let long = started.elapsed();
    assert!(
        wait_idle(&rig.init, GRACE).await,
        "the dropped op never drained"
    );
    let mut got = vec![0u8; B_LEN];
    remote.read_at(A_LEN as u64, &mut got).expect("read target");
    let changed = got.iter().zip(&before).filter(|(g, o)| g != o).count();
    tokio::time::timeout(DEREG, rig.init.deregister(&local))
        .await
        .expect("deregister in time")
        .expect("deregister");
    if dropped * 4 >= long {
        eprintln!(
            "{mode:?}: dropped after {dropped:?} of the long op's {long:?}; {changed} bytes changed; not counted"
        );
        return None;
    }
    Some(changed)
}
