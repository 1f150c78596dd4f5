//! The completion sink transports hand finished parts to: the engine's completion queue,
//! drained inline when no drain runs, else by the reactor.

use hixl_core::{Error, PartResult, Token};

use crate::completion::{Completion, CompletionQueue};
use crate::reactor::Reactor;

/// Where transports hand in finished parts: the engine's completion queue and its reactor.
/// A narrow handle: transports hold this, not the engine.
#[derive(Debug, Clone)]
pub(crate) struct Completions {
    cq: std::sync::Arc<CompletionQueue>,
    reactor: std::sync::Arc<Reactor>,
}

impl Completions {
    pub(crate) fn new(
        cq: std::sync::Arc<CompletionQueue>,
        reactor: std::sync::Arc<Reactor>,
    ) -> Completions {
        Completions { cq, reactor }
    }

    /// Posts completions and drains them inline; only if another drain is running does the
    /// reactor get rung (so a parked reactor is not woken for nothing).
    pub(crate) fn complete_all(&self, cs: impl IntoIterator<Item = Completion>) {
        self.cq.push_quiet(cs.into_iter().map(PartResult::from));
        if self.reactor.poll_inline().is_none() {
            self.cq.ring();
        }
    }

    /// Drains the engine's completion queues inline unless a drain is running (for a task
    /// spinning on its transfer); how many completions it applied.
    pub(crate) fn drain(&self) -> usize {
        self.reactor.poll_inline().unwrap_or(0)
    }

    /// Fails every part of `tokens` (one completion each) with `e` (the fabric's copy engine
    /// refusing a submission).
    #[cfg_attr(not(feature = "fabric"), allow(dead_code))]
    pub(crate) fn fail(&self, tokens: impl IntoIterator<Item = Token>, e: &Error) {
        self.complete_all(tokens.into_iter().map(|token| Completion {
            token,
            result: Err(e.clone()),
        }));
    }
}
