//! Why bytes are not a valid frame.

/// Why bytes are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The magic is wrong: not a hixl peer, or the stream lost sync. A peer speaking another
    /// protocol the first bytes give away (HTTP, TLS, SSH) is named.
    #[error("bad magic {:#010x}{}", .0, other_protocol(*.0))]
    BadMagic(u32),
    /// A version this build does not speak.
    #[error("unsupported protocol version {0}")]
    BadVersion(u8),
    /// An unknown frame type.
    #[error("unknown frame type {0}")]
    BadType(u8),
    /// Reserved flag bits set.
    #[error("reserved flags {0:#06x} set")]
    BadFlags(u16),
    /// A body longer than allowed.
    #[error("frame body of {0} bytes exceeds the limit")]
    TooLong(u32),
    /// The body ended before a field.
    #[error("frame body truncated reading {0}")]
    Truncated(&'static str),
    /// Bytes left over after the last field.
    #[error("{0} trailing bytes after the frame body")]
    Trailing(usize),
    /// A field whose value is out of range.
    #[error("invalid {field}: {value}")]
    BadField {
        /// The field.
        field: &'static str,
        /// The value seen.
        value: u64,
    },
}

/// `": …"` naming the protocol whose first four bytes (as the magic, little-endian) `magic`
/// is, or nothing.
fn other_protocol(magic: u32) -> &'static str {
    match &magic.to_le_bytes() {
        b"HTTP" | b"GET " | b"POST" | b"PUT " | b"HEAD" => {
            ": the peer speaks HTTP, not hixl (a web server or a metrics endpoint on that port?)"
        }
        b"SSH-" => ": the peer speaks SSH, not hixl",
        [0x16, 0x03, _, _] => ": the peer speaks TLS, not hixl (hixl does not use TLS)",
        _ => ": not a hixl peer, or the stream lost sync",
    }
}
