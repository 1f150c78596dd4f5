//! One finished part of an op, as the TCP data path hands it on, and the completion queue it
//! goes to (`hixl_cq`, shared with the fabric's copy engines).

use hixl_core::{Error, PartResult, Token};

pub(crate) use hixl_cq::CompletionQueue;

/// One finished part of an op.
#[derive(Debug)]
pub(crate) struct Completion {
    pub(crate) token: Token,
    pub(crate) result: Result<(), Error>,
}

impl From<Completion> for PartResult {
    fn from(c: Completion) -> PartResult {
        (c.token, c.result)
    }
}
