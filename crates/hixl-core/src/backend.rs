//! The surface every transport backend gives the engine's reactor: a completion source with a
//! pollable fd. Backends never spawn async tasks; the reactor drains them.

use std::os::fd::RawFd;

use crate::error::Error;
use crate::op_table::Token;

/// One finished part of an op, as a backend reports it.
pub type PartResult = (Token, Result<(), Error>);

/// A backend's completion queue, drained by the engine's reactor.
///
/// The reactor polls ([`CompletionSource::drain`]), then arms ([`CompletionSource::arm`]), then
/// polls again before it parks on [`CompletionSource::fd`]. Implementations must make the fd
/// readable for any completion posted after `arm`, so that a completion racing with the park
/// is never lost.
pub trait CompletionSource: Send + Sync {
    /// Moves every finished part into `out`; returns how many.
    fn drain(&self, out: &mut Vec<PartResult>) -> usize;
    /// From now on the next posted completion makes [`CompletionSource::fd`] readable; also
    /// consumes an earlier signal.
    fn arm(&self);
    /// Withdraws `arm` when the second poll found work (saves producers a wake-up).
    fn disarm(&self);
    /// The fd the reactor waits on (an eventfd or a completion channel).
    fn fd(&self) -> RawFd;
}
