//! Two devices whose netdevs reach each other with different MTUs, named by
//! `HIXL_VERBS_MTU_PAIR=near,far` (in the guest of tools/softroce-vm.sh: rxe2 on a veth end of
//! MTU 1500, active MTU 1024, and rxe3 on the other end, MTU 9000 and 4096). Skipped without it.
//! What `QueuePair::to_rtr`'s choice of the smaller MTU is for: a far end that used its own
//! larger one would send packets the near end's link drops.

mod common;

use std::time::Duration;

use common::{checksum, filled, tok, wait, Side};
use hixl_verbs::{Mtu, QpConfig, WorkRequest};

const PAIR_VAR: &str = "HIXL_VERBS_MTU_PAIR";

fn tx_dropped(dev: &str) -> u64 {
    let netdev = std::fs::read_to_string(format!(
        "/sys/class/infiniband/{dev}/ports/1/gid_attrs/ndevs/0"
    ))
    .expect("netdev of the device");
    let p = format!("/sys/class/net/{}/statistics/tx_dropped", netdev.trim());
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{p}: {e}"))
        .trim()
        .parse()
        .expect("counter")
}

/// READs `len` bytes from `far` into `near` over a fresh QP pair whose far QP is told the
/// near end's MTU is `claim` (`None`: the truth). The completion's error, if any.
fn read_once(near: &str, far: &str, claim: Option<Mtu>, len: usize) -> Result<(), String> {
    let (n, f) = (Side::open(near, 2048), Side::open(far, 2048));
    // Few, short tries (about 67 ms each): a dropped response fails the READ in well under
    // a second; an undisturbed 256 KiB READ takes milliseconds even in the TCG guest.
    let cfg = QpConfig {
        retry_cnt: 3,
        ..QpConfig::default()
    };
    let (mut qn, mut qf) = (n.qp(cfg.clone()), f.qp(cfg));
    let (en, ef) = (qn.endpoint(), qf.endpoint());
    qn.connect(&ef).expect("connect near");
    let told = claim.map_or(en, |mtu| hixl_verbs::QpEndpoint { mtu, ..en });
    qf.connect(&told).expect("connect far");
    let (mut src, dst) = (f.buffer(len), n.buffer(len));
    src.write_at(0, &filled(len, 7)).expect("fill");
    let wr = WorkRequest::read(
        tok(0),
        dst.local(0, len as u64).expect("inside"),
        src.remote().at(0, len as u64).expect("inside"),
    );
    // SAFETY: both buffers stay registered and untouched until the completion is drained.
    unsafe { qn.post_chain(&[wr]) }.expect("post read");
    let out = wait(&n.cq, 1, Duration::from_secs(30));
    match &out[0].1 {
        Ok(()) => {
            assert_eq!(checksum(&dst.to_vec()), checksum(&src.to_vec()), "READ");
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn the_far_ends_larger_mtu_unnegotiated_is_dropped_and_the_read_fails() {
    let pair = std::env::var(PAIR_VAR).unwrap_or_default();
    let Some((near, far)) = pair.split_once(',') else {
        eprintln!("the_far_ends_larger_mtu_unnegotiated_is_dropped: skipped ({PAIR_VAR} does not name two devices)");
        return;
    };
    const LEN: usize = 256 << 10;
    read_once(near, far, None, LEN).expect("negotiated: the READ completes");
    println!("negotiated: a {LEN}-byte READ from {far} completed, verified");
    let dropped = tx_dropped(far);
    let err = read_once(near, far, Some(Mtu::M4096), LEN)
        .expect_err("the far end sent 4096-byte packets, yet the READ completed");
    let dropped = tx_dropped(far) - dropped;
    println!("{far} told {near}'s MTU is 4096: the READ failed ({err}); {dropped} packets dropped on the way");
    assert!(dropped > 0, "no packet was dropped");
}
