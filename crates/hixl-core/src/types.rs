//! Plain data types of the HIXL model: memory kinds and descriptors, transfer ops and statuses.

use std::fmt;

/// Where registered memory lives (HIXL `MemType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum MemKind {
    /// Accelerator memory (HIXL `MEM_DEVICE = 0`). Needs a device runtime.
    Device,
    /// Host DRAM (HIXL `MEM_HOST = 1`).
    Host,
}

impl MemKind {
    /// HIXL's numeric value.
    pub const fn code(self) -> u8 {
        match self {
            MemKind::Device => 0,
            MemKind::Host => 1,
        }
    }

    /// The kind for HIXL's numeric value.
    pub fn from_code(code: u8) -> Option<MemKind> {
        match code {
            0 => Some(MemKind::Device),
            1 => Some(MemKind::Host),
            _ => None,
        }
    }
}

/// A memory range by address (HIXL `MemDesc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemDesc {
    /// Start address in the registering process.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

impl MemDesc {
    /// A descriptor for `len` bytes at `addr`.
    pub const fn new(addr: u64, len: u64) -> MemDesc {
        MemDesc { addr, len }
    }

    /// One past the last byte, or `None` on overflow.
    pub fn end(&self) -> Option<u64> {
        self.addr.checked_add(self.len)
    }
}

/// Direction of a one-sided transfer, named from the initiator (HIXL `TransferOp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransferOp {
    /// Copy remote memory into local memory (HIXL `READ = 0`).
    Read,
    /// Copy local memory into remote memory (HIXL `WRITE = 1`).
    Write,
}

impl TransferOp {
    /// HIXL's numeric value.
    pub const fn code(self) -> u8 {
        match self {
            TransferOp::Read => 0,
            TransferOp::Write => 1,
        }
    }
}

impl fmt::Display for TransferOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TransferOp::Read => "read",
            TransferOp::Write => "write",
        })
    }
}

/// One piece of a transfer (HIXL `TransferOpDesc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpDesc {
    /// Address in the initiator's registered memory.
    pub local_addr: u64,
    /// Address in the peer's remotely accessible memory.
    pub remote_addr: u64,
    /// Bytes to move.
    pub len: u64,
}

impl OpDesc {
    /// A descriptor moving `len` bytes between `local_addr` and `remote_addr`.
    pub const fn new(local_addr: u64, remote_addr: u64, len: u64) -> OpDesc {
        OpDesc {
            local_addr,
            remote_addr,
            len,
        }
    }
}

/// Bytes from the first of `count` pieces of `len` bytes, `stride` apart, to the end of the
/// last: `(count - 1) × stride + len`; `None` for no pieces or on overflow. The one place this
/// arithmetic lives (descriptors, the TCP target, the copy engine and CMA check spans with it).
pub const fn strided_span(len: u64, stride: u64, count: u64) -> Option<u64> {
    let Some(c) = count.checked_sub(1) else {
        return None;
    };
    let Some(x) = c.checked_mul(stride) else {
        return None;
    };
    x.checked_add(len)
}

/// A strided descriptor (as NIXL 1.5's): `count` pieces of `len` bytes, piece `i` between
/// `local_addr + i × local_stride` and `remote_addr + i × remote_stride`. A block run repeated
/// across equally spaced tensors, every other block of a cache, or a head slice in each token
/// of an NHD block is one descriptor instead of `count`. It is checked once, as a whole: the
/// span of its pieces must lie in one registered region on each side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StridedDesc {
    /// First piece in the initiator's registered memory.
    pub local_addr: u64,
    /// First piece in the peer's remotely accessible memory.
    pub remote_addr: u64,
    /// Bytes per piece (≥ 1).
    pub len: u64,
    /// Distance between pieces locally (≥ `len` when `count > 1`: pieces never overlap).
    pub local_stride: u64,
    /// Distance between pieces at the peer (≥ `len` when `count > 1`).
    pub remote_stride: u64,
    /// Pieces (≥ 1).
    pub count: u64,
}

impl StridedDesc {
    /// Piece `i` as a plain descriptor (no check).
    pub const fn piece(&self, i: u64) -> OpDesc {
        OpDesc::new(
            self.local_addr
                .wrapping_add(i.wrapping_mul(self.local_stride)),
            self.remote_addr
                .wrapping_add(i.wrapping_mul(self.remote_stride)),
            self.len,
        )
    }

    /// The same bytes with back-to-back pieces merged: a descriptor whose pieces touch on
    /// both sides (both strides equal `len`) is one piece of `len × count` (checked spans do
    /// not overflow).
    pub const fn merged(&self) -> StridedDesc {
        if self.count > 1 && self.local_stride == self.len && self.remote_stride == self.len {
            StridedDesc {
                len: self.len.wrapping_mul(self.count),
                local_stride: self.len.wrapping_mul(self.count),
                remote_stride: self.len.wrapping_mul(self.count),
                count: 1,
                ..*self
            }
        } else {
            *self
        }
    }

    /// Bytes moved: `len × count`, if it does not overflow.
    pub const fn bytes(&self) -> Option<u64> {
        self.len.checked_mul(self.count)
    }

    /// The local and remote spans `(addr, len)` from the first piece's start to the last
    /// piece's end: what must lie in one region on each side.
    ///
    /// # Errors
    /// [`crate::Error::ZeroLength`] naming the descriptor (`index`) for pieces of zero bytes
    /// (as a plain descriptor of zero length is refused, whatever the strides and count);
    /// [`crate::Error::InvalidParam`] naming the descriptor and the value for a zero count, a
    /// stride shorter than a piece (pieces that overlap, locally or at the peer: a stride of 0
    /// with more than one piece among them), or a span that overflows.
    pub fn spans(&self, index: usize) -> crate::Result<((u64, u64), (u64, u64))> {
        let bad = |why: String| crate::Error::InvalidParam {
            what: format!("strided descriptor {index}: {why}"),
        };
        if self.len == 0 {
            return Err(crate::Error::ZeroLength { index });
        }
        if self.count == 0 {
            return Err(bad("count is 0".into()));
        }
        if self.count > 1 && (self.local_stride < self.len || self.remote_stride < self.len) {
            return Err(bad(format!(
                "strides {} (local) and {} (remote) must be at least the piece length {}, or pieces overlap",
                self.local_stride, self.remote_stride, self.len
            )));
        }
        let span = |stride| strided_span(self.len, stride, self.count);
        match (
            span(self.local_stride),
            span(self.remote_stride),
            self.bytes(),
        ) {
            (Some(l), Some(r), Some(_)) => Ok(((self.local_addr, l), (self.remote_addr, r))),
            _ => Err(bad(format!(
                "{} pieces of {} bytes with strides {} / {} overflow",
                self.count, self.len, self.local_stride, self.remote_stride
            ))),
        }
    }
}

/// State of a link as `ConnectAsync`/`DisconnectAsync` leave it (HIXL `AsyncConnectStatus`):
/// the status of the latest task queued for that peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AsyncConnectStatus {
    /// No link, and no task queued.
    NotConnect,
    /// A connect is queued behind earlier tasks for the peer.
    ConnectPending,
    /// The connect is running.
    Connecting,
    /// Connected.
    Connected,
    /// The connect failed (the error is logged; a synchronous `connect` returns it).
    ConnectFailed,
    /// A disconnect is queued.
    DisconnectPending,
    /// The disconnect is running.
    Disconnecting,
}

impl AsyncConnectStatus {
    /// HIXL's numeric value, in declaration order (`NOT_CONNECT = 0` ... `DISCONNECTING = 6`).
    pub const fn code(self) -> u8 {
        self as u8
    }
}

/// State of an asynchronous transfer (HIXL `TransferStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransferStatus {
    /// Still in flight.
    Waiting,
    /// Every byte landed.
    Completed,
    /// The deadline passed. (HIXL declares but never returns this; hixl does.)
    TimedOut,
    /// It failed.
    Failed,
}

impl TransferStatus {
    /// HIXL's numeric value (`WAITING=0, COMPLETED=1, TIMEOUT=2, FAILED=3`).
    pub const fn code(self) -> u8 {
        match self {
            TransferStatus::Waiting => 0,
            TransferStatus::Completed => 1,
            TransferStatus::TimedOut => 2,
            TransferStatus::Failed => 3,
        }
    }

    /// Whether the transfer has ended.
    pub const fn is_terminal(self) -> bool {
        !matches!(self, TransferStatus::Waiting)
    }
}

/// Which accesses a region grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Access(u8);

impl Access {
    /// Local use only: the region is not exported to peers.
    pub const LOCAL: Access = Access(0);
    /// Peers may READ from the region.
    pub const REMOTE_READ: Access = Access(1);
    /// Peers may WRITE into the region.
    pub const REMOTE_WRITE: Access = Access(2);
    /// Peers may READ and WRITE (HIXL's only mode).
    pub const REMOTE_RW: Access = Access(3);

    /// Raw bits (wire form).
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// From wire bits; unknown bits are dropped.
    pub const fn from_bits(bits: u8) -> Access {
        Access(bits & 3)
    }

    /// Whether every access in `other` is granted.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether peers may touch the region at all.
    pub const fn is_remote(self) -> bool {
        self.0 != 0
    }

    /// What an op needing this access is called in errors (`remote write`, `remote read`).
    pub const fn describe(self) -> &'static str {
        if self.contains(Access::REMOTE_WRITE) {
            "remote write"
        } else {
            "remote read"
        }
    }

    /// The access a transfer op needs on the *target's* region.
    pub const fn needed_by(op: TransferOp) -> Access {
        match op {
            TransferOp::Read => Access::REMOTE_READ,
            TransferOp::Write => Access::REMOTE_WRITE,
        }
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            0 => "local",
            1 => "remote-read",
            2 => "remote-write",
            _ => "remote-read-write",
        })
    }
}

/// A region a peer exported, as seen by the initiator after connect.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct RemoteRegion {
    /// Start address in the peer's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Key the peer checks on every access.
    pub rkey: u64,
    /// Accesses granted.
    pub access: Access,
    /// Memory kind.
    pub kind: MemKind,
    /// Optional name given at registration.
    pub name: Option<String>,
}

impl RemoteRegion {
    /// Whether `[addr, addr+len)` lies inside this region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        match (addr.checked_add(len), self.addr.checked_add(self.len)) {
            (Some(end), Some(rend)) => addr >= self.addr && end <= rend,
            _ => false,
        }
    }
}

/// A notify message (HIXL `NotifyDesc`), with the engine it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notify {
    /// Engine address of the sender (`ip:port` of a server engine; only `ip` for a
    /// client-only one, which several engines on one host may share).
    pub from: String,
    /// The link it arrived on: the receiving engine's id of the sender's connection, unique
    /// for as long as the receiving engine runs. Two senders with the same `from` (client-only
    /// engines on one host) have different links, and each link has its own budget of
    /// [`NOTIFY_MAX_PENDING`] undrained notifies.
    pub link: u64,
    /// Name, at most [`NOTIFY_MAX_LEN`] bytes.
    pub name: Vec<u8>,
    /// Message, at most [`NOTIFY_MAX_LEN`] bytes.
    pub msg: Vec<u8>,
}

/// HIXL's limit on a notify's name and message, each.
pub const NOTIFY_MAX_LEN: usize = 1024;
/// HIXL's limit on undrained notifies per sending peer.
pub const NOTIFY_MAX_PENDING: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_bits() {
        assert!(Access::REMOTE_RW.contains(Access::REMOTE_READ));
        assert!(Access::REMOTE_RW.contains(Access::REMOTE_WRITE));
        assert!(!Access::REMOTE_READ.contains(Access::REMOTE_WRITE));
        assert!(!Access::LOCAL.is_remote());
        assert_eq!(Access::from_bits(0xff), Access::REMOTE_RW);
    }

    #[test]
    fn remote_region_contains_is_overflow_safe() {
        let r = RemoteRegion {
            addr: u64::MAX - 10,
            len: 10,
            rkey: 1,
            access: Access::REMOTE_RW,
            kind: MemKind::Host,
            name: None,
        };
        assert!(r.contains(u64::MAX - 10, 10));
        assert!(!r.contains(u64::MAX - 5, 10));
        assert!(!r.contains(0, 1));
    }

    fn strided(len: u64, count: u64, local_stride: u64, remote_stride: u64) -> StridedDesc {
        StridedDesc {
            local_addr: 1 << 20,
            remote_addr: 1 << 30,
            len,
            local_stride,
            remote_stride,
            count,
        }
    }

    #[test]
    fn degenerate_strided_shapes_are_refused_by_name() {
        // Zero-length pieces are refused as a zero-length plain descriptor is, whatever the
        // strides make the span.
        assert!(matches!(
            strided(0, 16, 512, 1024).spans(7),
            Err(crate::Error::ZeroLength { index: 7 })
        ));
        assert!(matches!(
            strided(0, 1, 0, 0).spans(0),
            Err(crate::Error::ZeroLength { index: 0 })
        ));
        for (d, says) in [
            (strided(8, 0, 8, 8), "count is 0"),
            (strided(8, 2, 4, 8), "must be at least the piece length 8"),
            // Remote pieces that overlap (a write would land twice on the same bytes).
            (strided(8, 2, 8, 0), "must be at least the piece length 8"),
            (strided(8, u64::MAX, 8, 8), "overflow"),
            (strided(u64::MAX, 2, u64::MAX, u64::MAX), "overflow"),
        ] {
            match d.spans(3) {
                Err(crate::Error::InvalidParam { what }) => {
                    assert!(what.starts_with("strided descriptor 3: "), "{what}");
                    assert!(what.contains(says), "{what}");
                }
                other => panic!("{d:?}: {other:?}"),
            }
        }
        // One piece: the strides do not matter.
        assert_eq!(
            strided(8, 1, 0, 0).spans(0).ok(),
            Some(((1 << 20, 8), (1 << 30, 8)))
        );
    }

    proptest::proptest! {
        /// Any shape is either refused or has spans that hold each piece, pieces that never
        /// overlap on either side, and a byte count that fits.
        #[test]
        fn accepted_strided_shapes_hold_their_pieces(
            len in proptest::prop_oneof![0u64..64, proptest::num::u64::ANY],
            count in proptest::prop_oneof![0u64..8, proptest::num::u64::ANY],
            ls in proptest::prop_oneof![0u64..128, proptest::num::u64::ANY],
            rs in proptest::prop_oneof![0u64..128, proptest::num::u64::ANY],
        ) {
            let d = strided(len, count, ls, rs);
            let Ok(((la, ll), (ra, rl))) = d.spans(0) else { return Ok(()) };
            proptest::prop_assert!(len > 0 && count > 0);
            proptest::prop_assert!(d.bytes().is_some());
            let m = d.merged();
            proptest::prop_assert_eq!(m.bytes(), d.bytes());
            for i in [0, count / 2, count - 1] {
                let p = d.piece(i);
                proptest::prop_assert!(p.local_addr >= la && p.local_addr - la + len <= ll);
                proptest::prop_assert!(p.remote_addr >= ra && p.remote_addr - ra + len <= rl);
            }
            if count > 1 {
                proptest::prop_assert!(ls >= len && rs >= len);
            }
        }
    }
}
