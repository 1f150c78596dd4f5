//! The engine over real RDMA verbs (`hixl.Transport=verbs`): run inside the Soft-RoCE guest by
//! `tools/verbs-tests.sh`, with `HIXL_VERBS_DEVICE` naming the device (e.g. `rxe0`). Without it
//! every test prints that it is skipped and returns.
//!
//! The two-process tests re-execute this binary as the target (`target_role`, ignored as a
//! test), which runs an engine with a region named `kv`, announces `HIXL ADDR <engine>` and
//! `HIXL KV <addr> <len>` on stdout and answers `SUM <offset> <len>` and `NOTIFY` on stdin.
#![cfg(feature = "verbs")]

mod lifecycle;
mod rails;
mod setup;
mod target;
mod transfers;

use std::time::Duration;

const DEVICE_VAR: &str = "HIXL_VERBS_DEVICE";
const ROLE_VAR: &str = "HIXL_ENGINE_ROLE";
/// The target role's `kv` size in bytes ([`KV`] by default).
const KV_VAR: &str = "HIXL_TARGET_KV";
/// The devices of the rail tests, e.g. `rxe0,rxe1` (they are skipped without it). They take
/// the devices' links down and up, so `tools/verbs-tests.sh` runs them alone, one at a time.
const RAILS_VAR: &str = "HIXL_VERBS_RAILS";
/// The MTU test's two devices, `near,far` (e.g. `rxe2,rxe3`), whose netdevs have different
/// MTUs and reach each other (the test is skipped without it): we use the near one, the target
/// the far one.
const MTU_PAIR_VAR: &str = "HIXL_VERBS_MTU_PAIR";
const KV: usize = 8 << 20;
const T: Duration = Duration::from_secs(30);

#[test]
#[ignore = "the target role of the two-process tests; Target::spawn runs it"]
fn target_role() {
    target::target_role();
}

#[test]
fn write_read_blocks_verified_across_processes_and_notify_after_data() {
    transfers::write_read_blocks_verified_across_processes_and_notify_after_data();
}

#[test]
fn thousands_of_descriptors_per_call() {
    transfers::thousands_of_descriptors_per_call();
}

#[test]
fn strided_descriptors_as_one_chain() {
    transfers::strided_descriptors_as_one_chain();
}

#[test]
fn a_dropped_transfer_posts_nothing_more_from_its_backlog() {
    transfers::a_dropped_transfer_posts_nothing_more_from_its_backlog();
}

#[test]
fn remote_range_outside_the_peers_regions_is_refused_before_posting() {
    transfers::remote_range_outside_the_peers_regions_is_refused_before_posting();
}

#[test]
fn deregistration_revokes_device_access_and_the_peer_can_reconnect() {
    lifecycle::deregistration_revokes_device_access_and_the_peer_can_reconnect();
}

#[test]
fn killed_target_fails_in_flight_ops_without_hanging() {
    lifecycle::killed_target_fails_in_flight_ops_without_hanging();
}

#[test]
fn auto_transport_without_a_device_uses_tcp_and_says_why() {
    lifecycle::auto_transport_without_a_device_uses_tcp_and_says_why();
}

#[test]
fn rails_striped_64mib_write_and_read_over_two_rails_verified() {
    rails::striped_64mib_write_and_read_over_two_rails_verified();
}

#[test]
fn rails_one_rail_down_mid_transfer_completes_on_the_other_and_comes_back() {
    rails::one_rail_down_mid_transfer_completes_on_the_other_and_comes_back();
}

#[test]
fn rails_both_down_fail_with_an_error_naming_each_rail() {
    rails::both_down_fail_with_an_error_naming_each_rail();
}

#[test]
fn rails_different_mtus_are_negotiated() {
    rails::different_mtus_are_negotiated();
}
