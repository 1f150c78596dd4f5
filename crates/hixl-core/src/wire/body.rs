//! The structures messages carry.

/// What a new TCP connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Channel {
    /// The control connection of a link: handshake, memory table, notifies, heartbeats.
    Control,
    /// A data connection of an established link, bound to it by the session id.
    Data,
    /// The same-host fabric channel of a link (a Unix socket that carries memfds).
    Fabric,
}

/// How a same-host peer reaches one exported region: through a shared mapping of the memfd
/// sent alongside (`fd_index`), or with cross-memory attach into the exporter's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct FabricRegion {
    /// The region's rkey (matches the memory table).
    pub rkey: u64,
    /// Start address in the exporter.
    pub addr: u64,
    /// Length.
    pub len: u64,
    /// Index of the region's memfd among the fds sent with the message, or [`NO_FD`] for
    /// memory reached with process_vm_readv/writev.
    pub fd_index: u32,
}

/// [`FabricRegion::fd_index`] of a region without a memfd.
pub const NO_FD: u32 = u32::MAX;

/// A data-path request: move `len` bytes at `addr` of the region with `rkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct DataReq {
    /// Request id, echoed in the answer.
    pub id: u64,
    /// Key of the target region.
    pub rkey: u64,
    /// Target address.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
}

/// A strided data-path request: `count` pieces of `len` bytes, piece `i` at
/// `addr + i × stride` of the region with `rkey`. The payload (a write's, or a read's answer)
/// is the pieces back to back: `len × count` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct StridedReq {
    /// Request id, echoed in the answer.
    pub id: u64,
    /// Key of the target region.
    pub rkey: u64,
    /// First piece's target address.
    pub addr: u64,
    /// Bytes per piece.
    pub len: u64,
    /// Distance between pieces.
    pub stride: u64,
    /// Pieces, 1..=[`MAX_STRIDED_PIECES`].
    pub count: u64,
}

/// Pieces of one strided request at most.
pub const MAX_STRIDED_PIECES: u64 = 1024;

impl StridedReq {
    /// Payload bytes: `len × count` (checked at decode to fit [`super::MAX_PAYLOAD`]).
    pub fn bytes(&self) -> u64 {
        self.len.saturating_mul(self.count)
    }
}
