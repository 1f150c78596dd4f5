//! Fault injection between two network namespaces joined by a veth pair, with TEST-NET-1
//! addresses only (192.0.2.1 in namespace A, 192.0.2.2 in namespace B).
//!
//! The target is this test binary re-run in the `target_role` role under `ip netns exec A`: a
//! hixl engine that exports a region filled with a known pattern and, on a `DUMP path` line on
//! its standard input, writes that region to a file (so its memory can be checked while the
//! network is down). The initiator engine runs in this process, on a thread that entered
//! namespace B with setns(2). Each test injects one fault while transfers are in flight:
//! - a link cut (an nft drop rule on the veth),
//! - 10% random packet loss (nft `numgen random mod 10`),
//! - a rate limit (tc tbf on both ends of the veth),
//! - SIGKILL of the target.
//!
//! The property checked under every fault:
//! - every transfer either completes with verified bytes, or fails with a sensible error
//!   within its timeout plus a margin;
//! - nothing hangs: each test runs under an overall deadline;
//! - nothing is corrupted: each transfer carries a per-offset pattern with its own seed, and
//!   guard bytes around every descriptor keep their background pattern on both sides; a
//!   failed transfer's range holds, byte by byte, either the old or the new pattern.
//!
//! Workers write a slot, read it back into a second buffer and check it. A slot whose transfer
//! failed is never used again (its bytes may still land later), so the final image of both
//! regions is known exactly up to the failed ranges.
//!
//! The tests need root, `ip` and `tc` (iproute2) and `nft` (nftables). Without them they print
//! a `SKIPPED` line and pass, unless `HIXL_REQUIRE_NETNS=1`, which turns that into a failure.

use std::time::Duration;

const ROLE_VAR: &str = "HIXL_FAULTS_ROLE";
const REQUIRE_VAR: &str = "HIXL_REQUIRE_NETNS";
const IP_A: &str = "192.0.2.1";
const IP_B: &str = "192.0.2.2";
/// The veth ends, named inside their namespaces.
const DEV_A: &str = "hxa";
const DEV_B: &str = "hxb";
/// Concurrent workers, each with its own slots and one transfer in flight at a time.
const WORKERS: u64 = 4;
/// Slack allowed past a transfer's timeout before its error must be back (shared 2-core CI).
const MARGIN: Duration = Duration::from_millis(1500);
/// Whole-test deadline: past it the test fails as hung.
const DEADLINE: Duration = Duration::from_secs(40);
/// Background pattern of the target's region.
const REMOTE_BG: u64 = 0xB0B0_5EED;
/// Background pattern of the initiator's region.
const LOCAL_BG: u64 = 0x10CA_15EED;

mod check;
mod client;
mod kill;
mod loss;
mod mounts;
mod netns;
mod patterns;
mod rate;
mod role;
mod silent;
mod workload;

/// The target process (ignored as a test: it is a role, run by `spawn_target`).
#[test]
#[ignore = "the target role of the fault tests; spawn_target runs it"]
fn target_role() {
    role::target_role();
}

/// The checker itself (no namespaces needed), described in its module.
#[test]
fn the_checker_catches_stray_and_wrong_bytes() {
    check::the_checker_catches_stray_and_wrong_bytes();
}

// ---------------------------------------------------------------------------------------------
// The faults, each described in its module.

#[test]
fn link_cut_mid_transfer() {
    silent::link_cut_mid_transfer();
}

#[test]
fn disconnect_from_a_silent_peer_lets_go() {
    silent::disconnect_from_a_silent_peer_lets_go();
}

#[test]
fn auto_falls_back_to_tcp_for_a_peer_in_another_netns_sharing_our_mounts() {
    mounts::auto_falls_back_to_tcp_for_a_peer_in_another_netns_sharing_our_mounts();
}

#[test]
fn random_loss_10_percent() {
    loss::random_loss_10_percent();
}

#[test]
fn rate_limited_link() {
    rate::rate_limited_link();
}

#[test]
fn target_killed_mid_transfer() {
    kill::target_killed_mid_transfer();
}
