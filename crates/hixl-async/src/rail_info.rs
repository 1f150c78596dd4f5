//! What a link says of its RDMA rails ([`crate::Peer::rails`], `hixl info --peer`, the
//! metrics, `hixl bench`): each rail's pairing, state and counters.

/// One rail of a verbs link: one of our devices paired with one of the peer's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RailInfo {
    /// The rail's number on the link.
    pub index: usize,
    /// Our device.
    pub local: String,
    /// The peer's device.
    pub remote: String,
    /// Why these two were paired (same subnet, or by position).
    pub why: String,
    /// The MTU both ends agreed on (the smaller of their active MTUs), in bytes.
    pub mtu: u32,
    /// Its RC queue pairs.
    pub qps: usize,
    /// Whether it takes slices now.
    pub up: bool,
    /// `up`, or paused with the cause and when it is probed back.
    pub state: String,
    /// Bytes of slices that landed on it.
    pub bytes: u64,
    /// Slices that landed on it.
    pub ops: u64,
    /// Slices that failed on it (each placed again elsewhere unless final).
    pub errors: u64,
    /// Times it was paused.
    pub pauses: u64,
}

impl std::fmt::Display for RailInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rail {} {} -> {} (peer): {}; mtu {}, {} QPs, {}; {} bytes in {} slices, {} errors, {} pauses",
            self.index,
            self.local,
            self.remote,
            self.state,
            self.mtu,
            self.qps,
            self.why,
            self.bytes,
            self.ops,
            self.errors,
            self.pauses
        )
    }
}
