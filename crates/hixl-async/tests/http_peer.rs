//! An HTTP server where an engine was expected (a metrics port, a web server) is named as such
//! by the connect's error, whether it answers the hello at once with an error status or waits
//! for a request line that never comes.

use std::time::Duration;

use hixl_async::Engine;
use hixl_core::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// How the fake HTTP server treats what it is sent.
#[derive(Clone, Copy)]
enum Http {
    /// Waits for the end of a request's headers, then answers 404 (most servers).
    WaitsForHeaders,
    /// Answers 400 at once to bytes that are not a request line, and closes.
    RejectsAtOnce,
}

async fn serve(l: TcpListener, how: Http) {
    loop {
        let Ok((mut s, _)) = l.accept().await else {
            return;
        };
        tokio::spawn(async move {
            let mut got = Vec::new();
            let mut buf = [0u8; 512];
            loop {
                let Ok(n) = s.read(&mut buf).await else {
                    return;
                };
                if n == 0 {
                    return;
                }
                got.extend_from_slice(&buf[..n]);
                let answer = match how {
                    Http::RejectsAtOnce if !got.starts_with(b"GET ") => {
                        Some("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                    }
                    _ if got.windows(4).any(|w| w == b"\r\n\r\n") => {
                        Some("HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    }
                    _ => None,
                };
                if let Some(a) = answer {
                    let _ = s.write_all(a.as_bytes()).await;
                    return;
                }
            }
        });
    }
}

async fn tcp_engine() -> Engine {
    Engine::builder("127.0.0.1")
        .option("hixl.Transport", "tcp")
        .build()
        .await
        .expect("engine")
}

async fn connect_error(how: Http, timeout: Duration) -> (String, Error) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    tokio::spawn(serve(l, how));
    let e = tcp_engine().await;
    let err = e
        .connect(&addr, timeout)
        .await
        .expect_err("an HTTP server is no engine");
    e.shutdown(Duration::from_millis(100)).await;
    (addr, err)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_that_waits_for_headers_is_named() {
    let (addr, err) = connect_error(Http::WaitsForHeaders, Duration::from_millis(300)).await;
    let text = err.to_string();
    assert!(matches!(err, Error::Protocol { .. }), "{err:?}");
    assert!(
        text.contains(&format!("{addr} is an HTTP server"))
            && text.contains("\"HTTP/1.0 404 Not Found\""),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_that_rejects_the_hello_is_named() {
    let (addr, err) = connect_error(Http::RejectsAtOnce, Duration::from_secs(5)).await;
    let text = err.to_string();
    assert!(
        text.contains(&format!("{addr} is an HTTP server")) && text.contains("HTTP/1."),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_port_is_a_timeout_not_http() {
    // Accepts and never answers anything: not HTTP, so the timeout stands.
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            conns.push(s);
        }
    });
    let e = tcp_engine().await;
    let err = e
        .connect(&addr, Duration::from_millis(300))
        .await
        .expect_err("nobody answers");
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    held.abort();
}
