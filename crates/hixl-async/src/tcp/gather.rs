//! How much one `sendmsg` (or one io_uring send) of a data connection gathers.

/// Requests gathered into one `sendmsg` at most, and bytes: a batch of small ops goes out in
/// one syscall (one segment chain for the kernel) instead of one per part. Past the bytes
/// bound only what is gathered already is committed, so a dropped op's parts behind a large
/// one are still withdrawn.
pub(crate) const GATHER_PARTS: usize = 64;
/// See [`GATHER_PARTS`].
pub(crate) const GATHER_BYTES: u64 = 256 << 10;
