//! What a copy engine runs: one copy op (plain or strided, by memcpy or cross-memory attach),
//! how it splits over streams, and the token its completion carries.

use hixl_core::Token;

/// What one copy op moves. Addresses are integers as in a `MemDesc`; the `# Safety` section
/// of [`crate::CopyEngine::submit`] says what they must satisfy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyKind {
    /// `len` bytes from `src` to `dst`, both mapped in this process (own memory, or a peer's
    /// fabric buffer mapped with [`crate::PeerMapping`]). Overlapping ranges are allowed.
    Memcpy {
        /// Source address.
        src: u64,
        /// Destination address.
        dst: u64,
        /// Bytes.
        len: u64,
    },
    /// `len` bytes from `remote` in process `pid` into `local` here (cross-memory attach).
    CmaRead {
        /// The peer process.
        pid: i32,
        /// Destination, in this process.
        local: u64,
        /// Source, in the peer.
        remote: u64,
        /// Bytes.
        len: u64,
    },
    /// `len` bytes from `local` here to `remote` in process `pid`.
    CmaWrite {
        /// The peer process.
        pid: i32,
        /// Source, in this process.
        local: u64,
        /// Destination, in the peer.
        remote: u64,
        /// Bytes.
        len: u64,
    },
    /// A strided descriptor as one op: `count` pieces of `len` bytes, piece `i` from
    /// `src + i × src_stride` to `dst + i × dst_stride`, both mapped in this process.
    StridedMemcpy {
        /// First piece's source.
        src: u64,
        /// First piece's destination.
        dst: u64,
        /// Bytes per piece.
        len: u64,
        /// Source distance between pieces.
        src_stride: u64,
        /// Destination distance between pieces.
        dst_stride: u64,
        /// Pieces.
        count: u64,
    },
    /// A strided descriptor by cross-memory attach: `count` pieces of `len` bytes between
    /// `local + i × local_stride` here and `remote + i × remote_stride` in process `pid`
    /// (`write`: local → remote), up to 1024 pieces per syscall.
    StridedCma {
        /// The peer process.
        pid: i32,
        /// First piece, in this process.
        local: u64,
        /// First piece, in the peer.
        remote: u64,
        /// Bytes per piece.
        len: u64,
        /// Distance between pieces here.
        local_stride: u64,
        /// Distance between pieces in the peer.
        remote_stride: u64,
        /// Pieces.
        count: u64,
        /// Local → remote (else remote → local).
        write: bool,
    },
}

impl CopyKind {
    /// Bytes the op moves.
    pub fn len(&self) -> u64 {
        match *self {
            CopyKind::Memcpy { len, .. }
            | CopyKind::CmaRead { len, .. }
            | CopyKind::CmaWrite { len, .. } => len,
            CopyKind::StridedMemcpy { len, count, .. }
            | CopyKind::StridedCma { len, count, .. } => len.saturating_mul(count),
        }
    }

    /// Whether the op moves nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Splits the op into consecutive parts of at most `max_part` bytes (at least one part),
    /// so that the streams share a large copy. Submit each part with the op's token and count
    /// one completion per part. A `max_part` of 0 is taken as 1; the caller picks `max_part`
    /// so that `len / max_part` parts fit in memory and in the ring.
    pub fn split(self, max_part: u64) -> Vec<CopyKind> {
        let max_part = max_part.max(1);
        if let Some(parts) = self.split_strided(max_part) {
            return parts;
        }
        let len = self.len();
        let hint = len.div_ceil(max_part).clamp(1, 4096);
        let mut parts = Vec::with_capacity(hint as usize);
        let mut off = 0;
        loop {
            let n = (len - off).min(max_part);
            parts.push(match self {
                CopyKind::Memcpy { src, dst, .. } => CopyKind::Memcpy {
                    src: src.wrapping_add(off),
                    dst: dst.wrapping_add(off),
                    len: n,
                },
                CopyKind::CmaRead {
                    pid, local, remote, ..
                } => CopyKind::CmaRead {
                    pid,
                    local: local.wrapping_add(off),
                    remote: remote.wrapping_add(off),
                    len: n,
                },
                CopyKind::CmaWrite {
                    pid, local, remote, ..
                } => CopyKind::CmaWrite {
                    pid,
                    local: local.wrapping_add(off),
                    remote: remote.wrapping_add(off),
                    len: n,
                },
                // Taken by split_strided above.
                k @ (CopyKind::StridedMemcpy { .. } | CopyKind::StridedCma { .. }) => k,
            });
            off += n;
            if off >= len {
                return parts;
            }
        }
    }
}

impl CopyKind {
    /// A strided op split into ops of whole pieces, at least one piece and otherwise at most
    /// `max_part` bytes each; `None` for the other kinds.
    pub(crate) fn split_strided(self, max_part: u64) -> Option<Vec<CopyKind>> {
        let (len, count) = match self {
            CopyKind::StridedMemcpy { len, count, .. }
            | CopyKind::StridedCma { len, count, .. } => (len, count),
            _ => return None,
        };
        let per = (max_part / len.max(1)).max(1);
        let mut parts = Vec::with_capacity(count.div_ceil(per).clamp(1, 4096) as usize);
        let mut first = 0;
        loop {
            let n = (count - first).min(per);
            parts.push(match self {
                CopyKind::StridedMemcpy {
                    src,
                    dst,
                    len,
                    src_stride,
                    dst_stride,
                    ..
                } => CopyKind::StridedMemcpy {
                    src: src.wrapping_add(first.wrapping_mul(src_stride)),
                    dst: dst.wrapping_add(first.wrapping_mul(dst_stride)),
                    len,
                    src_stride,
                    dst_stride,
                    count: n,
                },
                CopyKind::StridedCma {
                    pid,
                    local,
                    remote,
                    len,
                    local_stride,
                    remote_stride,
                    write,
                    ..
                } => CopyKind::StridedCma {
                    pid,
                    local: local.wrapping_add(first.wrapping_mul(local_stride)),
                    remote: remote.wrapping_add(first.wrapping_mul(remote_stride)),
                    len,
                    local_stride,
                    remote_stride,
                    count: n,
                    write,
                },
                k => k,
            });
            first += n;
            if first >= count {
                return Some(parts);
            }
        }
    }
}

/// The end of `count` pieces of `len` bytes `stride` apart from `base`; `None` on overflow.
pub(crate) fn strided_end(base: u64, len: u64, stride: u64, count: u64) -> Option<u64> {
    hixl_core::strided_span(len, stride, count)?.checked_add(base)
}

/// One part of a transfer for the copy engine: what to copy and the token its completion
/// carries.
pub struct CopyOp {
    /// Reported back with the op's completion.
    pub token: Token,
    /// What to copy.
    pub kind: CopyKind,
    /// Whatever keeps the op's memory valid (region leases, a peer mapping): dropped by the
    /// stream right after the copy ran (or was abandoned), before the completion is posted.
    pub keep: Option<Box<dyn std::any::Any + Send>>,
}

impl CopyOp {
    /// An op with nothing to keep alive.
    pub fn new(token: Token, kind: CopyKind) -> CopyOp {
        CopyOp {
            token,
            kind,
            keep: None,
        }
    }
}

impl std::fmt::Debug for CopyOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyOp")
            .field("token", &self.token)
            .field("kind", &self.kind)
            .field("keep", &self.keep.is_some())
            .finish()
    }
}
