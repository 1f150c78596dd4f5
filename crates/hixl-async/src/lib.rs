//! Async engine of hixl.
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod addr;
pub mod clock;
mod completion;
mod context;
mod keep;
mod memory;
mod notify;
mod rawio;
mod reactor;
mod rng;
mod sink;
mod stage;
pub mod sync;
pub mod telemetry;

pub use memory::{HostBuffer, Region};
pub use notify::{NotifyHandler, NotifyService, NotifyStream};
mod engine;
#[cfg(feature = "fabric")]
mod fabric;
mod frame_io;
mod link;
mod link_state;
mod rail_info;
mod rail_metrics;
mod served;
mod server;
mod tcp;
mod transfer;
mod transport;
#[cfg(feature = "verbs")]
mod verbs;

pub use addr::EngineAddr;
pub use engine::{Engine, EngineBuilder};
pub use link::Peer;
pub use rail_info::RailInfo;
pub use telemetry::{Outcome, Telemetry, TransferRecord};
pub use transfer::Transfer;
pub mod blocking;
