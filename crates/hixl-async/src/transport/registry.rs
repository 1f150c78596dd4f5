//! The transports of this build: the one place where each transport is registered (behind
//! its cargo feature), in the order the transport policy tries them: the fabric (a same-host
//! memcpy beats a loop through the NIC), then verbs. TCP is every link's own path.
//!
//! Adding a transport: a module implementing [`Transport`] (and [`super::PeerChannel`] for
//! its channels), a cargo feature, and one entry here.

use std::sync::Arc;

use hixl_core::{Options, Result};

use super::Transport;

/// Starts the backend of every transport this build has and the options allow (a transport
/// that is off stays registered, so that `Peer::transport` can say why it is not used).
///
/// # Errors
/// A backend that fails to start (e.g. a forced transport without its device).
pub(crate) fn start(options: &Options, instance: u64) -> Result<Vec<Arc<dyn Transport>>> {
    let _ = (options, instance);
    let transports: Vec<Arc<dyn Transport>> = vec![
        #[cfg(feature = "fabric")]
        Arc::new(crate::fabric::connect::FabricTransport {
            backend: crate::fabric::FabricBackend::new(options, instance)?.map(Arc::new),
        }),
        #[cfg(feature = "verbs")]
        {
            let (v, why) = crate::verbs::VerbsBackend::new(options)?;
            Arc::new(crate::verbs::connect::VerbsTransport {
                backend: v.map(Arc::new),
                why,
            })
        },
    ];
    Ok(transports)
}
