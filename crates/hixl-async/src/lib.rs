//! Async engine of hixl.
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
// The transport interface has hooks that only an optional transport uses today (per-op peer
// keeps, pool memory, channel hooks and the notify path of a channel: the fabric's; the control
// exchange and device keys: verbs'; per-session state and the kinds and reasons of both). A
// build without that transport leaves them unused, and this is the one place that says so: a
// transport's module and its registry line are its only `cfg`s. The full build (CI's clippy
// with `--features verbs`, the fabric being a default) still reports any item dead in it.
#![cfg_attr(not(all(feature = "fabric", feature = "verbs")), allow(dead_code))]

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
