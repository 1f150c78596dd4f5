//! Writing steps to a TCP connection and reading its answers to the end.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::Step;

/// Writes `steps` to `w` and then shuts the write side down. Fds steps are ignored (TCP).
/// Returns false when a write failed (the peer closed first). Then the connection was reset,
/// and the reset may have been reported to the write, not to the reads: a reader then sees
/// what looks like an orderly EOF although bytes the peer sent last may be lost.
pub async fn write_steps<W: tokio::io::AsyncWrite + Unpin>(w: &mut W, steps: &[Step]) -> bool {
    for s in steps {
        match s {
            Step::Bytes(b) => {
                if !b.is_empty() && w.write_all(b).await.is_err() {
                    return false;
                }
            }
            Step::Pause => tokio::task::yield_now().await,
            Step::Fds(_) => {}
        }
    }
    let _ = w.shutdown().await;
    true
}

/// How reading ended, given whether all writes went through (see [`write_steps`]).
pub fn read_end(end: ReadEnd, wrote_all: bool) -> ReadEnd {
    match end {
        ReadEnd::Eof if !wrote_all => ReadEnd::Reset,
        e => e,
    }
}

/// How reading a connection to its end went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadEnd {
    /// An orderly EOF: the peer closed (or shut down) its side; everything it sent arrived.
    Eof,
    /// A reset or other error: bytes the peer sent may be missing at the end.
    Reset,
    /// The deadline passed with the connection still open.
    Timeout,
}

/// Reads until EOF or error, at most `limit` bytes (a longer answer is an invariant
/// violation: the caller's model bounds what the peer may send), for at most `within`.
pub async fn read_to_end<R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
    limit: usize,
    within: Duration,
) -> (Vec<u8>, ReadEnd) {
    let mut v = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, r.read(&mut buf)).await {
            Err(_) => return (v, ReadEnd::Timeout),
            Ok(Ok(0)) => return (v, ReadEnd::Eof),
            Ok(Ok(n)) => {
                v.extend_from_slice(&buf[..n]);
                assert!(
                    v.len() <= limit,
                    "invariant violated: the engine sent more than {limit} bytes on one connection (answers are bounded by the input)"
                );
            }
            Ok(Err(_)) => return (v, ReadEnd::Reset),
        }
    }
}
