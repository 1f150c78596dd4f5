//! Reaching etcd: one client per member, requests that fail over from a member that is down
//! or hung to the next one, the directory's description in errors.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use hixl_core::options::DirectoryOptions;
use hixl_core::{Error, Result};

/// How long one etcd request may take, over every member it tries, before the directory
/// counts etcd as unreachable.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// How long one member has to answer one try before the next member is asked (with several
/// members; a lone member has the whole [`REQUEST_TIMEOUT`]). A member that is frozen (a
/// stuck disk, a GC pause, SIGSTOP) keeps its connections open and answers nothing; etcd's
/// own client moves on the same way.
pub(crate) const MEMBER_TIMEOUT: Duration = Duration::from_millis(900);

/// The largest gRPC message the directory reads (gRPC's default is 4 MiB). Listings are
/// paged well under it; this is for a page or a watch batch that holds large values.
pub(crate) const MAX_MESSAGE: usize = 64 << 20;

/// Where the directory lives, for messages: `etcd://a:2379,b:2379 under /hixl/engines/`.
pub(crate) fn describe(o: &DirectoryOptions) -> String {
    format!("etcd://{} under {}", o.endpoints.join(","), o.prefix)
}

/// [`Error::Directory`] for `what` failing with `e`.
pub(crate) fn failed(o: &DirectoryOptions, what: &str, e: &dyn std::fmt::Display) -> Error {
    Error::Directory {
        what: format!("{}: {what}", describe(o)),
        reason: e.to_string(),
    }
}

/// `e` in words: gRPC's message and the root cause (e.g. "tcp connect error: Connection
/// refused (os error 111)"), never the client's debug text.
pub(crate) fn plain(e: &etcd_client::Error) -> String {
    let (mut out, mut src): (String, Option<&dyn std::error::Error>) = match e {
        etcd_client::Error::GRpcStatus(s) => {
            let m = s.message();
            let m = if m.is_empty() {
                s.code().description()
            } else {
                m
            };
            (m.to_owned(), std::error::Error::source(s))
        }
        other => (other.to_string(), std::error::Error::source(other)),
    };
    let mut root = None;
    while let Some(x) = src {
        root = Some(x.to_string());
        src = x.source();
    }
    if let Some(r) = root.filter(|r| !out.contains(r.as_str())) {
        out = format!("{out}: {r}");
    }
    out
}

/// Whether `e` may pass by itself or on another member: a member that is down or electing a
/// leader, a connection that broke. Not: bad credentials, a refused request.
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

/// The etcd members `o.endpoints`, one client (one connection) each, made when first asked
/// for and again after the member failed a try. Requests go to the member that answered
/// last, and move on to the next when it is down, fails or does not answer in time.
pub(crate) struct Members {
    opts: DirectoryOptions,
    clients: Vec<tokio::sync::Mutex<Option<Client>>>,
    current: AtomicUsize,
}

impl Members {
    /// The members of `o` (nothing is connected yet).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a user without a password.
    pub(crate) fn new(o: &DirectoryOptions) -> Result<Members> {
        if o.user.is_some() != o.password.is_some() {
            return Err(Error::InvalidOption {
                key: "hixl.DirectoryUser".into(),
                value: o.user.clone().unwrap_or_default(),
                reason: "hixl.DirectoryUser and hixl.DirectoryPassword go together".into(),
            });
        }
        Ok(Members {
            opts: o.clone(),
            clients: o
                .endpoints
                .iter()
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
            current: AtomicUsize::new(0),
        })
    }

    /// The member requests go to now.
    pub(crate) fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed) % self.clients.len().max(1)
    }

    /// Member `i` failed (or stopped answering): drop its connection, and send requests to
    /// the next member if they went to it.
    pub(crate) fn failed(&self, i: usize) {
        if let Ok(mut c) = self.clients[i].try_lock() {
            c.take();
        }
        let n = self.clients.len();
        let _ = self
            .current
            .compare_exchange(i, (i + 1) % n, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Member `i`'s client, connecting it if need be (HTTP/2 keep-alive pings find a dead
    /// connection in about 10 s, and are no more frequent than etcd's
    /// `--grpc-keepalive-min-time` of 5 s allows, past which etcd closes the connection;
    /// requests need a leader, so a member cut off from its cluster answers with an error
    /// instead of stale data; an expired auth token, or one an etcd restart forgot, is
    /// renewed with the credentials).
    async fn client(&self, i: usize) -> std::result::Result<Client, etcd_client::Error> {
        let mut slot = self.clients[i].lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_keep_alive(Duration::from_secs(6), Duration::from_secs(4))
            .with_keep_alive_while_idle(true)
            .with_require_leader(true)
            .with_auto_token_refresh(true);
        if let (Some(u), Some(p)) = (&self.opts.user, &self.opts.password) {
            opts = opts.with_user(u.clone(), p.clone());
        }
        let ep = format!("http://{}", self.opts.endpoints[i]);
        let c = Client::connect([ep], Some(opts)).await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Runs one etcd request (made by `f` with a member's client, again on each try) until it
    /// succeeds, fails for good, or [`REQUEST_TIMEOUT`] passes. A member that fails
    /// transiently (down, electing a leader, a broken connection) or does not answer within
    /// [`MEMBER_TIMEOUT`] is left for the next one. Failures map to [`Error::Directory`]
    /// naming `what`.
    pub(crate) async fn request<T, F, Fut>(&self, what: &str, mut f: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let o = &self.opts;
        let n = self.clients.len();
        if n == 0 {
            return Err(failed(o, what, &"no etcd endpoint is configured"));
        }
        let per_try = if n == 1 {
            REQUEST_TIMEOUT
        } else {
            MEMBER_TIMEOUT
        };
        let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
        let mut pause = Duration::from_millis(25);
        let mut tried = 0usize;
        loop {
            let i = self.current();
            let until = deadline.min(tokio::time::Instant::now() + per_try);
            let attempt = async {
                let c = self.client(i).await?;
                f(c).await
            };
            let why = match tokio::time::timeout_at(until, attempt).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if !transient(&e) => return Err(failed(o, what, &plain(&e))),
                Ok(Err(e)) => plain(&e),
                Err(_) => format!(
                    "member {} did not answer in {:?}",
                    o.endpoints[i],
                    per_try.min(REQUEST_TIMEOUT)
                ),
            };
            self.failed(i);
            tried += 1;
            let now = tokio::time::Instant::now();
            if now >= deadline {
                let why = if n == 1 {
                    format!("etcd did not answer in {REQUEST_TIMEOUT:?} ({why})")
                } else {
                    format!("no member answered in {REQUEST_TIMEOUT:?}; last: {why}")
                };
                return Err(failed(o, what, &why));
            }
            // Once round every member, wait a little (a leader election, a restart).
            if tried % n == 0 {
                if now + pause >= deadline {
                    return Err(failed(o, what, &why));
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(400));
            }
        }
    }
}
