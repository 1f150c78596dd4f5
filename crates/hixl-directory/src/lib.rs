//! The directory of hixl engines: an engine publishes one entry (name, incarnation, listen
//! addresses, transports, memory-table digest; never rkeys nor the shared secret) in etcd,
//! under a lease it keeps alive, and finds peers by name from a cache a watch keeps current.
//!
//! - A killed engine's entry disappears within the lease TTL; a clean shutdown deletes it at
//!   once ([`Directory::close`]).
//! - Two live engines cannot hold one name: the second is refused naming the holder.
//! - etcd being down stops nothing that runs: lookups come from the cache, and the entry is
//!   published again when etcd is back.
//!
//! [`entry`] and [`cache`] are pure (no I/O); `connect`, `watch` and `publish` talk to etcd.

pub mod cache;
mod connect;
mod directory;
pub mod entry;
mod publish;
mod shared;
mod sync;
pub mod testing;
mod watch;

pub use cache::Change;
pub use directory::Directory;
pub use entry::{incarnation_hex, table_digest, Entry, ENTRY_VERSION};
pub use shared::{Publication, PublishState};
