//! `Engine.connect_retrying`: a connect that tries again while the peer refuses or cannot be
//! reached (a peer still starting, a network blip), waiting between tries with a doubling
//! backoff; after the last try its error says how many tries were made.

use std::io::ErrorKind;
use std::time::{Duration, Instant};

use hixl_core::Error;
use pyo3::prelude::*;

use crate::engine::{Engine, Peer};
use crate::op::{ErrOut, Op, OutFn};

/// The longest wait between two tries, unless the backoff asked is longer.
const MAX_DELAY: Duration = Duration::from_secs(10);

/// Whether a connect that failed with `e` may succeed if tried again: the peer refused the
/// TCP connection (nothing listens yet), reset or aborted it, the host or network is
/// unreachable, or the connect timed out. Refusals by a hixl peer (authentication, wire
/// version, a link that exists already) and bad addresses are final.
fn retryable(e: &Error) -> bool {
    match e {
        Error::Io { source, .. } | Error::ConnectionLost { source, .. } => {
            matches!(
                source.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::TimedOut
            ) || matches!(
                source.raw_os_error(),
                Some(libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EHOSTDOWN | libc::ENETDOWN)
            )
        }
        Error::Timeout { what, .. } => *what == "connect",
        _ => false,
    }
}

/// The wait before retry `k` (0-based): `backoff`, doubling, at most [`MAX_DELAY`] (or
/// `backoff` when that is longer).
fn delay(backoff: Duration, k: u32) -> Duration {
    let cap = MAX_DELAY.max(backoff);
    backoff
        .checked_mul(1u32.checked_shl(k.min(31)).unwrap_or(u32::MAX))
        .unwrap_or(cap)
        .min(cap)
}

#[pymethods]
impl Engine {
    /// Connects to `remote` like `connect`, trying up to `retries` more times (after
    /// `backoff` seconds, doubling) while the connect fails in a way a retry may mend.
    fn connect_retrying(
        &self,
        remote: String,
        timeout: f64,
        retries: u32,
        backoff: f64,
    ) -> PyResult<Op> {
        let e = self.get()?;
        let d = crate::seconds(timeout)?;
        let backoff = if backoff > 0.0 {
            Duration::try_from_secs_f64(backoff).unwrap_or(MAX_DELAY)
        } else {
            Duration::ZERO
        };
        Ok(Op::other(async move {
            let start = Instant::now();
            let mut tries: u32 = 0;
            loop {
                tries += 1;
                let err = match e.connect(&remote, d).await {
                    Ok(p) => {
                        let out: OutFn =
                            Box::new(move |py| Ok(Py::new(py, Peer { peer: p })?.into_any()));
                        return Ok(out);
                    }
                    Err(err) => err,
                };
                if tries > retries || !retryable(&err) {
                    if tries == 1 {
                        return Err(ErrOut::Hixl(err));
                    }
                    let note = format!(
                        "connecting to {remote}: {tries} tries in {:.2} s, the last failed",
                        start.elapsed().as_secs_f64()
                    );
                    return Err(ErrOut::Other(Box::new(move |_| {
                        crate::errors::hixl_err_noted(err, &note)
                    })));
                }
                let wait = delay(backoff, tries - 1);
                tracing::info!(
                    target: "hixl_py::connect",
                    peer = %remote,
                    "connect to {remote} failed ({err}); retry {tries} of {retries} in {wait:?}"
                );
                tokio::time::sleep(wait).await;
            }
        }))
    }
}
