//! Stopping a long-running command cleanly: SIGINT (Ctrl-C) and SIGTERM (what Kubernetes,
//! systemd and `docker stop` send) both end it through its shutdown path.

use tokio::signal::unix::{signal, Signal, SignalKind};

/// SIGINT and SIGTERM, caught from the moment [`Stop::install`] returns: install it before
/// the command says it is ready, so that a signal right after that still shuts it down.
pub struct Stop {
    int: Signal,
    term: Signal,
}

impl Stop {
    /// Catches SIGINT and SIGTERM from now on (they no longer kill the process).
    ///
    /// # Errors
    /// The signal handlers could not be installed.
    pub fn install() -> std::io::Result<Stop> {
        Ok(Stop {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }

    /// Waits for either signal; returns its name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
        }
    }
}
