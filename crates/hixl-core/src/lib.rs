//! Sans-io core of hixl: HIXL's status codes and types, options, the region and op tables and
//! the wire format. No runtime, clock or socket lives here.
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod answers;
pub mod auth;
pub mod backend;
pub mod error;
mod error_status;
pub mod op_table;
pub mod options;
pub mod outbox;
pub mod region;
pub mod session;
pub mod status;
pub mod types;
pub mod wire;

pub use backend::{CompletionSource, PartResult};
pub use error::{Error, Result, Side};
pub use op_table::{Completed, OpTable, Phase, Token};
pub use options::Options;
pub use region::{RegionEntry, RegionId, RegionTable, Registered};
pub use status::Status;
pub use types::{strided_span, TransferStatus, NOTIFY_MAX_LEN, NOTIFY_MAX_PENDING};
pub use types::{
    Access, AsyncConnectStatus, MemDesc, MemKind, Notify, OpDesc, RemoteRegion, StridedDesc,
    TransferOp,
};
