//! Reaching etcd: the client and its options, the directory's description in errors, the
//! timeout every unary request runs under.

use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use hixl_core::options::DirectoryOptions;
use hixl_core::{Error, Result};

/// How long one etcd request may take before the directory counts etcd as unreachable.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// Where the directory lives, for messages: `etcd://a:2379,b:2379 under /hixl/engines/`.
pub(crate) fn describe(o: &DirectoryOptions) -> String {
    format!("etcd://{} under {}", o.endpoints.join(","), o.prefix)
}

/// A client of the etcd members `o.endpoints` (balanced over them; HTTP/2 keep-alive pings
/// find a silently dead member in about 10 s, and are no more frequent than etcd's
/// `--grpc-keepalive-min-time` of 5 s allows, past which etcd closes the connection;
/// requests need a leader, so a member cut off from its cluster answers with an error
/// instead of stale data).
pub(crate) async fn client(o: &DirectoryOptions) -> Result<Client> {
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_keep_alive(Duration::from_secs(6), Duration::from_secs(4))
        .with_keep_alive_while_idle(true)
        .with_require_leader(true);
    if let (Some(u), Some(p)) = (&o.user, &o.password) {
        opts = opts.with_user(u.clone(), p.clone());
    } else if o.user.is_some() != o.password.is_some() {
        return Err(Error::InvalidOption {
            key: "hixl.DirectoryUser".into(),
            value: o.user.clone().unwrap_or_default(),
            reason: "hixl.DirectoryUser and hixl.DirectoryPassword go together".into(),
        });
    }
    let eps: Vec<String> = o.endpoints.iter().map(|e| format!("http://{e}")).collect();
    let connect = Client::connect(eps, Some(opts));
    match tokio::time::timeout(REQUEST_TIMEOUT, connect).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(failed(o, "connecting", &e)),
        Err(_) => Err(failed(
            o,
            "connecting",
            &format!("no answer in {REQUEST_TIMEOUT:?}"),
        )),
    }
}

/// [`Error::Directory`] for `what` failing with `e`.
pub(crate) fn failed(o: &DirectoryOptions, what: &str, e: &dyn std::fmt::Display) -> Error {
    Error::Directory {
        what: format!("{}: {what}", describe(o)),
        reason: e.to_string(),
    }
}

/// Whether `e` may pass by itself: a member that is down or electing a leader, a connection
/// that broke. Not: bad credentials, a refused request.
fn transient(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match e {
        E::TransportError(_) | E::IoError(_) => true,
        E::GRpcStatus(s) => matches!(
            s.code(),
            tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::DeadlineExceeded
        ),
        _ => false,
    }
}

/// Runs one etcd request (made by `f`, again on each try) until it succeeds, fails for good,
/// or [`REQUEST_TIMEOUT`] passes; transient failures (a member down, a leader election) are
/// retried. Failures map to [`Error::Directory`] naming `what`.
pub(crate) async fn request<T, F, Fut>(o: &DirectoryOptions, what: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
    let mut pause = Duration::from_millis(25);
    loop {
        let e = match tokio::time::timeout_at(deadline, f()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => e,
            Err(_) => {
                let why = format!("etcd did not answer in {REQUEST_TIMEOUT:?}");
                return Err(failed(o, what, &why));
            }
        };
        if !transient(&e) || tokio::time::Instant::now() + pause >= deadline {
            return Err(failed(o, what, &e));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(400));
    }
}
