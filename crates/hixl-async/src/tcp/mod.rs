//! TCP data path: initiator connections that post parts and collect answers, and the target
//! service that validates each request and moves bytes between socket and registered memory.

pub(crate) mod initiator;
pub(crate) mod target;
