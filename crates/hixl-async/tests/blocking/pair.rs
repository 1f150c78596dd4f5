//! Two initialized instances, test patterns and descriptors, and status helpers.

use std::time::{Duration, Instant};

use hixl_async::blocking::{Hixl, TransferReq};
use hixl_core::{OpDesc, Status, TransferStatus};

use crate::BLOCK;

/// A server (ephemeral port) and a client-only engine, both initialized.
pub(crate) fn pair() -> (Hixl, Hixl, String) {
    let server = Hixl::new();
    server.initialize_ephemeral("127.0.0.1", &[]).unwrap();
    let name = server.local_engine().unwrap();
    assert!(name.starts_with("127.0.0.1:"), "{name}");
    let client = Hixl::new();
    client.initialize("127.0.0.1", &[]).unwrap();
    (server, client, name)
}

pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 16) as u8)
        .collect()
}

pub(crate) fn descs(local: u64, remote: u64, len: usize) -> Vec<OpDesc> {
    (0..len / BLOCK)
        .map(|i| {
            OpDesc::new(
                local + (i * BLOCK) as u64,
                remote + (i * BLOCK) as u64,
                BLOCK as u64,
            )
        })
        .collect()
}

pub(crate) fn status_of<T: std::fmt::Debug>(r: hixl_core::Result<T>) -> Status {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.status(),
    }
}

/// Polls `get_transfer_status` until terminal (or panics after 10 s).
pub(crate) fn wait_terminal(h: &Hixl, req: TransferReq) -> TransferStatus {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let s = h.get_transfer_status(req).unwrap();
        if s.is_terminal() {
            return s;
        }
        assert!(Instant::now() < end, "request {req:?} still waiting");
        std::thread::sleep(Duration::from_millis(1));
    }
}
