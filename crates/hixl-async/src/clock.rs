//! The engine's clock: the sans-io sessions (and the KV layer's lease table) take time as a
//! std `Instant` passed in; their drivers read tokio's clock through [`now`], so that a test
//! on tokio's paused clock drives heartbeats, timeouts and lease expiry in virtual time.

use std::sync::OnceLock;
use std::time::Instant;

/// Now, on tokio's clock, in the type the sessions take. Outside a runtime with a paused
/// clock this is the monotonic clock, as `Instant::now()`.
pub fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Sleeps until `deadline` (a session's next timeout), or forever without one.
pub(crate) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await,
        None => std::future::pending().await,
    }
}

/// `now + d`, or about thirty years from now when that does not fit an instant: a bound a
/// caller gives as `Duration::MAX` (or any other that overflows) means "no bound", as
/// tokio's own timers take it, never a panic.
pub(crate) fn deadline_after(d: std::time::Duration) -> tokio::time::Instant {
    const FAR: std::time::Duration = std::time::Duration::from_secs(86_400 * 365 * 30);
    let now = tokio::time::Instant::now();
    now.checked_add(d)
        .or_else(|| now.checked_add(FAR))
        .unwrap_or(now)
}

/// The process's fixed instant the links align their probes to (the first time it is asked
/// for). Any instant would do; one shared by every link is what lets one timer wake-up serve
/// them all.
pub(crate) fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(now)
}
