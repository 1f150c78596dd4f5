//! Liveness of one link: the first fatal cause wins and every task of the link sees it.

use std::sync::OnceLock;

use hixl_core::Error;
use tokio::sync::watch;

/// Shared by the tasks of one link (control and data connections).
#[derive(Debug)]
pub(crate) struct LinkState {
    cause: OnceLock<Error>,
    tx: watch::Sender<bool>,
}

impl LinkState {
    pub(crate) fn new() -> LinkState {
        LinkState {
            cause: OnceLock::new(),
            tx: watch::channel(false).0,
        }
    }

    /// Marks the link dead with `cause` (ignored if it is already dead) and wakes its tasks.
    pub(crate) fn kill(&self, cause: Error) {
        if self.cause.set(cause).is_ok() {
            tracing::debug!(cause = %self.cause.get().map(|e| e.to_string()).unwrap_or_default(), "link closed");
        }
        self.tx.send_replace(true);
    }

    /// Fixes the cause of a death that is about to happen (ignored if there is one already),
    /// without waking the tasks yet: an orderly close queues its last frame in between, so
    /// that nothing the peer does in answer can claim the cause first.
    pub(crate) fn doom(&self, cause: Error) {
        let _ = self.cause.set(cause);
    }

    /// Why the link died, if it did.
    pub(crate) fn error(&self) -> Option<Error> {
        self.cause.get().cloned()
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.cause.get().is_some()
    }

    /// A receiver whose `changed()` resolves when the link dies, or at once if it is dead
    /// already. (A plain watch receiver has seen the value current at subscription, so a task
    /// that subscribes after the death would otherwise wait for a change that never comes.)
    pub(crate) fn subscribe(&self) -> watch::Receiver<bool> {
        let mut rx = self.tx.subscribe();
        if *rx.borrow() {
            rx.mark_changed();
        }
        rx
    }

    /// Resolves once the link is dead.
    pub(crate) async fn dead(&self) {
        let mut rx = self.subscribe();
        while !*rx.borrow_and_update() {
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_receiver_made_after_the_death_sees_it() {
        let s = LinkState::new();
        s.kill(Error::NotConnected { peer: "p".into() });
        let mut rx = s.subscribe();
        tokio::time::timeout(std::time::Duration::from_secs(1), rx.changed())
            .await
            .expect("changed() resolves at once")
            .expect("sender alive");
        let alive = LinkState::new();
        let mut live = alive.subscribe();
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(20), live.changed())
                .await
                .is_err(),
            "a live link's receiver waits"
        );
    }
}
