//! The transports of this build: the one place where each transport is registered (behind
//! its cargo feature), in the order the transport policy tries them: the fabric (a same-host
//! memcpy beats a loop through the NIC), then verbs; then TCP, whose channel every link has,
//! after the chosen one (`select.rs`).
//!
//! Adding a transport: a module implementing [`Transport`] (and [`super::PeerChannel`] for
//! its channels), a cargo feature, and one entry here.

use std::sync::Arc;

use hixl_core::{Options, Result};

use super::Transport;
use crate::keep::SharedOps;

/// Starts the backend of every transport this build has and the options allow (a transport
/// that is off stays registered, so that `Peer::transport` can say why it is not used).
///
/// # Errors
/// A backend that fails to start (e.g. a forced transport without its device).
/// A backend whose device runs work on threads of its own (the fabric's copy engine) keeps
/// `ops`, which holds that work's memory, until its threads are joined.
pub(crate) fn start(
    options: &Options,
    instance: u64,
    ops: &SharedOps,
) -> Result<Vec<Arc<dyn Transport>>> {
    let _ = (options, instance, ops);
    let transports: Vec<Arc<dyn Transport>> = vec![
        #[cfg(feature = "fabric")]
        Arc::new(crate::fabric::connect::FabricTransport {
            backend: crate::fabric::FabricBackend::new(options, instance, ops)?.map(Arc::new),
            chans: Default::default(),
        }),
        #[cfg(feature = "verbs")]
        {
            let (v, why) = crate::verbs::VerbsBackend::new(options)?;
            Arc::new(crate::verbs::connect::VerbsTransport {
                backend: v.map(Arc::new),
                why,
                qps: Default::default(),
            })
        },
        Arc::new(crate::tcp::transport::TcpTransport),
    ];
    Ok(transports)
}
