//! Liveness of one link: the first fatal cause wins and every task of the link sees it; and
//! the link's tasks, so that its driver can join them all when it ends.

use std::future::Future;
use std::sync::OnceLock;

use hixl_core::Error;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

/// Shared by the tasks of one link (its driver, the control writer, the data connections,
/// the transports' channel tasks).
#[derive(Debug)]
pub(crate) struct LinkState {
    cause: OnceLock<Error>,
    tx: watch::Sender<bool>,
    /// Every task of the link, spawned through [`LinkState::spawn`].
    tasks: TaskTracker,
    /// The runtime the link was made on: tasks started later (a data connection's, on its
    /// first transfer) go there whatever thread submits.
    rt: Option<tokio::runtime::Handle>,
}

impl LinkState {
    pub(crate) fn new() -> LinkState {
        LinkState {
            cause: OnceLock::new(),
            tx: watch::channel(false).0,
            tasks: TaskTracker::new(),
            rt: tokio::runtime::Handle::try_current().ok(),
        }
    }

    /// Spawns a task of this link. Each must end once the link is dead (every task selects
    /// on [`LinkState::dead`] or on a socket the death shuts), so that [`LinkState::joined`]
    /// resolves.
    pub(crate) fn spawn<F>(&self, f: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match &self.rt {
            Some(rt) => drop(self.tasks.spawn_on(f, rt)),
            None => drop(self.tasks.spawn(f)),
        }
    }

    /// Resolves once the link is dead and every task it spawned has ended.
    pub(crate) async fn joined(&self) {
        self.dead().await;
        self.tasks.close();
        self.tasks.wait().await;
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

    #[tokio::test]
    async fn joined_waits_for_the_death_and_every_task() {
        use std::time::Duration;
        let s = std::sync::Arc::new(LinkState::new());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let st = s.clone();
        s.spawn(async move {
            st.dead().await;
            let _ = rx.await; // a task that takes a while to wind down
        });
        let wait = Duration::from_millis(30);
        assert!(
            tokio::time::timeout(wait, s.joined()).await.is_err(),
            "alive: not joined"
        );
        s.kill(Error::NotConnected { peer: "p".into() });
        assert!(
            tokio::time::timeout(wait, s.joined()).await.is_err(),
            "dead, but a task still runs"
        );
        let _ = tx.send(());
        tokio::time::timeout(Duration::from_secs(5), s.joined())
            .await
            .expect("joined once the last task ended");
    }
}
