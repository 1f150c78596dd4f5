//! The blocking `Hixl` facade end to end: two instances in one process over 127.0.0.1, driven
//! from plain threads (no tokio runtime in the tests themselves).

mod lifecycle;
mod links;
mod pair;
mod transfers;

const T: i32 = 5000;
const BLOCK: usize = 64 << 10;

#[test]
fn hixl_is_send_and_sync() {
    lifecycle::hixl_is_send_and_sync();
}

#[test]
fn sync_write_and_read_with_raw_and_buffer_registrations() {
    transfers::sync_write_and_read_with_raw_and_buffer_registrations();
}

#[test]
fn async_transfer_status_is_freed_once_terminal() {
    transfers::async_transfer_status_is_freed_once_terminal();
}

#[test]
fn get_all_transfer_status_orders_limits_and_echoes_user_data() {
    transfers::get_all_transfer_status_orders_limits_and_echoes_user_data();
}

#[test]
fn notifies_are_delivered_then_cleared() {
    links::notifies_are_delivered_then_cleared();
}

#[test]
fn calls_before_initialize_and_after_finalize_fail() {
    lifecycle::calls_before_initialize_and_after_finalize_fail();
}

#[test]
fn initialize_errors_are_reported() {
    lifecycle::initialize_errors_are_reported();
}

#[test]
fn timeouts_links_and_handles() {
    links::timeouts_links_and_handles();
}

#[test]
fn capabilities() {
    lifecycle::capabilities();
}

#[test]
fn blocking_calls_inside_a_runtime_are_refused_not_panicking() {
    lifecycle::blocking_calls_inside_a_runtime_are_refused_not_panicking();
}

#[test]
fn shared_between_threads() {
    lifecycle::shared_between_threads();
}

#[test]
fn outstanding_async_requests_are_capped() {
    transfers::outstanding_async_requests_are_capped();
}

#[test]
fn disconnect_fails_outstanding_requests_which_are_then_freed() {
    transfers::disconnect_fails_outstanding_requests_which_are_then_freed();
}
