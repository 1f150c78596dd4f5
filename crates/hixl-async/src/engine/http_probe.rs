//! Naming an HTTP server that was connected to as if it were an engine (a metrics port, a web
//! server on the wrong port). Some HTTP servers answer the engine's hello at once with an
//! error status; most wait for a request line that never comes, and the connect times out.
//! Either way, once a connect failed, one short HTTP request on a fresh connection tells: if
//! the answer starts `HTTP/`, the error says so and quotes the status line.

use std::net::SocketAddr;
use std::time::Duration;

use hixl_core::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long the probe may take, on top of the failed connect.
const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);

/// The status line of an HTTP response that `answer` starts with (at most 80 characters),
/// or `None` when it is not one.
pub(crate) fn http_status_line(answer: &[u8]) -> Option<String> {
    if !answer.starts_with(b"HTTP/") {
        return None;
    }
    let end = answer
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .unwrap_or(answer.len())
        .min(80);
    let line = String::from_utf8_lossy(&answer[..end]);
    Some(line.chars().filter(|c| !c.is_control()).collect())
}

/// The error for a connect to `peer` (at `addr`) that an HTTP server answered with `status`.
pub(crate) fn http_peer_error(peer: &str, addr: SocketAddr, status: &str) -> Error {
    Error::Protocol {
        peer: peer.to_string(),
        reason: format!(
            "{addr} is an HTTP server (it answers \"{status}\"), not a hixl engine: a metrics or \
             web port? Connect to the port the engine listens on (`hixl serve` prints it with READY)"
        ),
    }
}

/// Whether the connect error `e` is one an HTTP server would cause (no answer, a closed
/// connection, or bytes that are not a frame).
pub(crate) fn worth_probing(e: &Error) -> bool {
    matches!(
        e,
        Error::Timeout { .. }
            | Error::PeerLost { .. }
            | Error::Protocol { .. }
            | Error::WireVersion { .. }
    )
}

/// Sends one HTTP request to `addr` and returns the status line, if it answers HTTP within
/// [`PROBE_TIMEOUT`].
pub(crate) async fn probe(addr: SocketAddr) -> Option<String> {
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(b"GET / HTTP/1.0\r\nUser-Agent: hixl-probe\r\n\r\n")
            .await
            .ok()?;
        let mut buf = [0u8; 128];
        let mut got = 0;
        while got < buf.len() {
            match s.read(&mut buf[got..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
            if buf[..got].contains(&b'\n') {
                break;
            }
        }
        http_status_line(&buf[..got])
    };
    tokio::time::timeout(PROBE_TIMEOUT, ask)
        .await
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_are_taken_and_others_are_not() {
        assert_eq!(
            http_status_line(b"HTTP/1.0 404 Not Found\r\nServer: x\r\n").as_deref(),
            Some("HTTP/1.0 404 Not Found")
        );
        assert_eq!(
            http_status_line(b"HTTP/1.1 400").as_deref(),
            Some("HTTP/1.1 400")
        );
        assert_eq!(http_status_line(b"HIXL\x00\x01"), None);
        assert_eq!(http_status_line(b""), None);
        let long = [b"HTTP/1.1 200 ".as_slice(), &[b'a'; 200]].concat();
        assert_eq!(http_status_line(&long).map(|s| s.len()), Some(80));
        assert_eq!(
            http_status_line(b"HTTP/1.1 \x1b[31m200\n").as_deref(),
            Some("HTTP/1.1 [31m200")
        );
    }
}
