//! The runtime and engine that exist between `initialize` and `finalize`, and how they stop.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use hixl_core::{Error, Result};
use tokio::runtime::Runtime;

use crate::{Engine, Transfer};

/// How long `finalize` waits for abandoned transfers to drain after closing every link.
const FINALIZE_GRACE: Duration = Duration::from_secs(1);

/// An asynchronous request kept until a terminal status is read.
pub(super) struct Pending {
    pub(super) transfer: Transfer,
    pub(super) user_data: u64,
}

/// What exists between `initialize` and `finalize`.
pub(super) struct Inner {
    pub(super) rt: Runtime,
    pub(super) engine: Engine,
    /// Outstanding requests by number; numbers grow, so key order is submission order.
    pub(super) reqs: Mutex<BTreeMap<u64, Pending>>,
}

impl Inner {
    /// Runs `f` to completion on the runtime, refusing (instead of panicking) when the calling
    /// thread is already inside a tokio runtime.
    pub(super) fn block_on<F: Future>(&self, call: &'static str, f: F) -> Result<F::Output> {
        not_in_runtime(call)?;
        Ok(self.rt.block_on(f))
    }

    /// Finalize: abandon outstanding requests, close links and the listener, stop the runtime.
    /// Must run outside any tokio runtime (the caller guarantees it).
    pub(super) fn shutdown(self) {
        let Inner { rt, engine, reqs } = self;
        let _ctx = rt.enter();
        drop(std::mem::take(&mut *lock(&reqs)));
        rt.block_on(engine.shutdown(FINALIZE_GRACE));
        drop(engine);
        drop(_ctx);
        // Waits until every engine task has been dropped: no peer touches memory afterwards.
        drop(rt);
    }

    /// Finalize from inside a tokio runtime, where neither `block_on` nor dropping a runtime
    /// is allowed: tell the engine to stop and let the runtime wind down in the background.
    pub(super) fn shutdown_background(self) {
        let Inner { rt, engine, reqs } = self;
        {
            let _ctx = rt.enter();
            drop(std::mem::take(&mut *lock(&reqs)));
            // Dropping the last handle closes the links and stops the listener.
            drop(engine);
        }
        // Only reached when no helper thread could be started: tasks are cancelled, but may
        // still be finishing on the workers for a moment after finalize returns.
        rt.shutdown_background();
    }
}

pub(super) fn not_in_runtime(call: &'static str) -> Result<()> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Error::InsideRuntime { call });
    }
    Ok(())
}

/// The crate's poisoning policy ([`crate::sync`]) for the facade's locks.
pub(super) use crate::sync::lock;
