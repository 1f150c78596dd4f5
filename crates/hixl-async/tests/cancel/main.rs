//! Timeouts and cancellation under load, over tcp and over the fabric (pool memory mapped by
//! the peer, and plain host memory reached by cross-memory attach).
//!
//! Several tasks post mixed READ/WRITE transfers (one byte to several MiB, one to eight
//! descriptors, 64 KiB parts) between two engines in this process and then await them, drop
//! them at once, drop them after a few polls or a short sleep, or give them a tiny deadline.
//! Every op owns its memory exclusively: the target's region and the initiator's region are
//! cut into page runs, each descriptor gets one run on each side, and the rest of both regions
//! holds a guard pattern. A run of an op that completed is reused; a run of an op that did not
//! is quarantined for the round, since bytes of its abandoned parts may still land there.
//! At the end of a round the checks are:
//! - the initiator's region can be deregistered while abandoned ops are still in flight (it
//!   waits for their leases, within a bound) and nothing lands in it afterwards;
//! - `ops_in_flight()` returns to 0 by itself (no disconnect);
//! - every byte outside quarantined runs holds exactly what the model says (guard, source
//!   data, or what a completed op moved), on both engines;
//! - every byte of a quarantined destination holds its old value or the op's new one;
//! - the target's region deregisters within a bound; the buffers come back and are registered
//!   again for the next round; RSS and open fds do not grow across rounds.
//!
//! The other tests pin down single behaviours: a deadline against a peer that never answers
//! (and deregistration waiting for the timed-out op until the link goes), a deadline on an op
//! queued behind a long one on each transport, and a dropped op queued behind a long one,
//! which must move nothing (ignored on the fabric, where it does: see the tests).
//!
//! `HIXL_CANCEL_SEED` replays a run's decisions (timing still varies), `HIXL_CANCEL_ROUNDS`
//! runs more rounds per transport. The seed is printed at the start of each test.

#[path = "../common/mod.rs"]
mod common;
mod model;
mod op;
mod ordered;
mod process;
mod rig;
mod rng;
mod rounds;

use std::time::{Duration, Instant};

use hixl_async::{Engine, HostBuffer};
use hixl_core::{Error, OpDesc, Status, TransferStatus};

use crate::ordered::{deadline_behind_a_long_op, dropped_while_queued, B_LEN};

/// Attempts of the dropped-while-queued test, for runs whose drop came too late to count.
const QUEUED_ATTEMPTS: usize = 5;

/// Bytes of the op dropped while queued that landed, from the first attempt whose drop
/// surely came while the op was queued.
fn dropped_queued(mode: Mode) -> usize {
    for _ in 0..QUEUED_ATTEMPTS {
        if let Some(changed) = runtime().block_on(dropped_while_queued(mode)) {
            return changed;
        }
    }
    panic!("{mode:?}: in {QUEUED_ATTEMPTS} attempts the drop never came early enough to count");
}

/// The deadline-behind-a-long-op test, retried when a run could not count.
fn deadline_queued(mode: Mode) {
    let _serial = serial();
    for _ in 0..QUEUED_ATTEMPTS {
        if runtime()
            .block_on(deadline_behind_a_long_op(mode))
            .is_some()
        {
            return;
        }
    }
    panic!("{mode:?}: in {QUEUED_ATTEMPTS} attempts the queued op was never polled early enough to count");
}
use crate::process::{runtime, serial};
use crate::rig::{wait_idle, Mode};
use crate::rounds::randomized;

/// Each region's size, on both engines.
const LEN: usize = 32 << 20;
const PAGE: usize = 4096;
/// Concurrent tasks posting ops.
const TASKS: usize = 4;
/// Ops per task per round.
const OPS_PER_TASK: usize = 20;
/// Default rounds per transport (`HIXL_CANCEL_ROUNDS` overrides).
const ROUNDS: usize = 3;
/// Bound on an awaited transfer: past it the test reports a hang instead of waiting forever.
const HANG: Duration = Duration::from_secs(30);
/// Bound on deregistration (it waits for leases: a leaked one hangs it).
const DEREG: Duration = Duration::from_secs(10);
/// How long abandoned ops may take to drain once nothing new is posted.
const GRACE: Duration = Duration::from_secs(5);
/// How late a timed-out transfer may report, on a loaded two-core machine.
const LATE: Duration = Duration::from_secs(1);
const T: Duration = Duration::from_secs(5);
/// How much RSS may grow past its level after the first round (it moves by under 1 MiB over
/// ten rounds; a leaked region would be 32 MiB a round).
const RSS_SLACK_KIB: u64 = 8 << 10;

#[test]
fn random_drops_and_deadlines_under_load_tcp() {
    randomized(Mode::Tcp);
}

#[test]
fn random_drops_and_deadlines_under_load_tcp_uring() {
    randomized(Mode::TcpUring);
}

#[cfg(feature = "fabric")]
#[test]
fn random_drops_and_deadlines_under_load_fabric_pool() {
    randomized(Mode::FabricPool);
}

#[cfg(feature = "fabric")]
#[test]
fn random_drops_and_deadlines_under_load_fabric_cma() {
    randomized(Mode::FabricCma);
}

/// A peer that never answers: the deadline alone ends the wait, at the deadline.
#[test]
fn deadline_is_honoured_against_a_peer_that_never_answers() {
    let _serial = serial();
    runtime().block_on(async {
        let (addr, _task) = common::silent_target(1, Duration::from_secs(30)).await;
        let init = Engine::builder("127.0.0.1")
            .option("hixl.Transport", "tcp")
            .option("hixl.TcpStreams", "1")
            .option("hixl.HeartbeatIntervalMs", "60000")
            .build()
            .await
            .expect("initiator");
        let local = init
            .register(HostBuffer::zeroed(1 << 20).expect("buf"))
            .expect("register");
        let peer = init.connect(&addr, T).await.expect("connect");
        let mut in_flight = 0;
        for (k, ms) in [1u64, 20, 100].into_iter().enumerate() {
            let d = Duration::from_millis(ms);
            let desc = OpDesc::new(local.addr() + k as u64 * 4096, common::SILENT_ADDR, 4096);
            let started = Instant::now();
            let mut t = peer.read(&[desc]).timeout(d);
            assert_eq!(t.status(), TransferStatus::Waiting);
            let e = (&mut t).await.expect_err("nobody answers");
            let took = started.elapsed();
            assert!(
                matches!(e, Error::Timeout { after, .. } if after == d),
                "{e:?}"
            );
            assert_eq!(e.status(), Status::Timeout);
            assert_eq!(t.status(), TransferStatus::TimedOut);
            assert!(took >= d, "timed out after {took:?}, before {d:?}");
            assert!(
                took < d + Duration::from_millis(250),
                "deadline {d:?} reported after {took:?}"
            );
            // A read already sent may still be answered: its op keeps its lease. One the
            // writer had not sent yet when its deadline passed (a 1 ms deadline on a busy
            // machine) is withdrawn and reaped instead.
            let now = init.ops_in_flight();
            assert!(
                now == in_flight || now == in_flight + 1,
                "read {k}: {now} ops in flight after {in_flight}"
            );
            in_flight = now;
        }
        assert!(
            in_flight >= 1,
            "the 100 ms read was sent and keeps its lease"
        );
        // Only the link's death proves the reads can no longer land.
        let dereg = tokio::spawn({
            let (init, local) = (init.clone(), local.clone());
            async move { init.deregister(&local).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !dereg.is_finished(),
            "deregister returned under live leases"
        );
        init.disconnect(&addr).await.expect("disconnect");
        let buf = tokio::time::timeout(DEREG, dereg)
            .await
            .expect("deregister after the link closed")
            .expect("join")
            .expect("deregister");
        assert!(buf.is_some());
        assert!(
            wait_idle(&init, GRACE).await,
            "abandoned reads never reaped"
        );
    });
}

#[test]
fn deadline_behind_a_long_op_tcp() {
    deadline_queued(Mode::Tcp);
}

#[test]
fn deadline_behind_a_long_op_tcp_uring() {
    deadline_queued(Mode::TcpUring);
}

#[cfg(feature = "fabric")]
#[test]
fn deadline_behind_a_long_op_fabric_pool() {
    deadline_queued(Mode::FabricPool);
}

#[cfg(feature = "fabric")]
#[test]
fn deadline_behind_a_long_op_fabric_cma() {
    deadline_queued(Mode::FabricCma);
}

#[test]
fn a_dropped_op_queued_behind_another_sends_nothing_tcp() {
    let _serial = serial();
    let changed = dropped_queued(Mode::Tcp);
    assert_eq!(changed, 0, "bytes of a dropped, never-started op landed");
}

#[test]
fn a_dropped_op_queued_behind_another_sends_nothing_tcp_uring() {
    let _serial = serial();
    let changed = dropped_queued(Mode::TcpUring);
    assert_eq!(changed, 0, "bytes of a dropped, never-started op landed");
}

#[cfg(feature = "fabric")]
#[test]
fn a_dropped_op_queued_behind_another_copies_nothing_fabric_pool() {
    let _serial = serial();
    let changed = dropped_queued(Mode::FabricPool);
    assert_eq!(
        changed, 0,
        "{changed} of {B_LEN} bytes of a dropped op whose copies had not started landed"
    );
}

#[cfg(feature = "fabric")]
#[test]
fn a_dropped_op_queued_behind_another_copies_nothing_fabric_cma() {
    let _serial = serial();
    let changed = dropped_queued(Mode::FabricCma);
    assert_eq!(
        changed, 0,
        "{changed} of {B_LEN} bytes of a dropped op whose copies had not started landed"
    );
}
