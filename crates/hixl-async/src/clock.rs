//! The drivers' clock: the sans-io sessions take time as a std `Instant` passed in; the
//! drivers read tokio's clock (so that tests on a paused clock drive them too).

use std::sync::OnceLock;
use std::time::Instant;

/// Now, in the type the sessions take.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Sleeps until `deadline` (a session's next timeout), or forever without one.
pub(crate) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await,
        None => std::future::pending().await,
    }
}

/// The process's fixed instant the links align their probes to (the first time it is asked
/// for). Any instant would do; one shared by every link is what lets one timer wake-up serve
/// them all.
pub(crate) fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(now)
}
