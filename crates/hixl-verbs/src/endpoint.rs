//! What two peers exchange out of band to connect a pair of RC queue pairs, and its fixed
//! 32-byte wire form (decoded without panicking on any input).

use std::net::Ipv6Addr;

use crate::attr::Mtu;
use crate::error::{Result, VerbsError};

const MAGIC: [u8; 2] = *b"QP";
const VERSION: u8 = 1;
/// Bytes of [`QpEndpoint::to_bytes`].
pub const ENDPOINT_LEN: usize = 32;

/// One side of an RC connection: the peer needs this to bring its QP to RTR.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpEndpoint {
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// First packet sequence number the QP sends (24 bits).
    pub psn: u32,
    /// The QP's source GID (all zero on InfiniBand without GRH).
    pub gid: [u8; 16],
    /// LID of the port (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// GID index the QP sends from (informational: each side picks its own `sgid_index`).
    pub gid_index: u8,
    /// The port's active MTU; the connection uses the smaller of both sides'.
    pub mtu: Mtu,
}

impl QpEndpoint {
    /// The fixed wire form: magic `"QP"`, version, gid index, qpn, psn (big-endian u32),
    /// gid (16 bytes), lid (big-endian u16), mtu code, one reserved byte.
    pub fn to_bytes(&self) -> [u8; ENDPOINT_LEN] {
        let mut b = [0u8; ENDPOINT_LEN];
        b[0..2].copy_from_slice(&MAGIC);
        b[2] = VERSION;
        b[3] = self.gid_index;
        b[4..8].copy_from_slice(&self.qpn.to_be_bytes());
        b[8..12].copy_from_slice(&self.psn.to_be_bytes());
        b[12..28].copy_from_slice(&self.gid);
        b[28..30].copy_from_slice(&self.lid.to_be_bytes());
        b[30] = self.mtu.code() as u8;
        b
    }

    /// Parses what a peer sent.
    ///
    /// # Errors
    /// [`VerbsError::BadEndpoint`] for a wrong length, magic or version, a QPN or PSN wider
    /// than 24 bits, or an unknown MTU code.
    pub fn from_bytes(b: &[u8]) -> Result<QpEndpoint> {
        let bad = |reason: String| VerbsError::BadEndpoint { reason };
        let b: &[u8; ENDPOINT_LEN] = b
            .try_into()
            .map_err(|_| bad(format!("{} bytes, expected {ENDPOINT_LEN}", b.len())))?;
        if b[0..2] != MAGIC || b[2] != VERSION {
            return Err(bad(format!(
                "magic/version {:02x?}, expected \"QP\" v{VERSION}",
                &b[0..3]
            )));
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let (qpn, psn) = (u32_at(4), u32_at(8));
        if qpn > 0xff_ffff || psn > 0xff_ffff {
            return Err(bad(format!(
                "qpn {qpn:#x} or psn {psn:#x} wider than 24 bits"
            )));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[12..28]);
        let mtu =
            Mtu::from_code(u32::from(b[30])).ok_or_else(|| bad(format!("mtu code {}", b[30])))?;
        Ok(QpEndpoint {
            qpn,
            psn,
            gid,
            lid: u16::from_be_bytes([b[28], b[29]]),
            gid_index: b[3],
            mtu,
        })
    }

    /// Lower-case hex of [`QpEndpoint::to_bytes`], for text channels.
    pub fn to_hex(&self) -> String {
        self.to_bytes().iter().map(|x| format!("{x:02x}")).collect()
    }

    /// Parses [`QpEndpoint::to_hex`].
    ///
    /// # Errors
    /// [`VerbsError::BadEndpoint`] for non-hex input, or as [`QpEndpoint::from_bytes`].
    pub fn from_hex(s: &str) -> Result<QpEndpoint> {
        let s = s.trim();
        if s.len() != 2 * ENDPOINT_LEN || !s.is_ascii() {
            return Err(VerbsError::BadEndpoint {
                reason: format!("hex of length {}", s.len()),
            });
        }
        let mut b = [0u8; ENDPOINT_LEN];
        for (i, x) in b.iter_mut().enumerate() {
            *x = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|e| {
                VerbsError::BadEndpoint {
                    reason: format!("hex: {e}"),
                }
            })?;
        }
        QpEndpoint::from_bytes(&b)
    }
}

impl std::fmt::Display for QpEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "qpn {:#x} psn {:#x} gid {} (index {}) lid {} mtu {}",
            self.qpn,
            self.psn,
            Ipv6Addr::from(self.gid),
            self.gid_index,
            self.lid,
            self.mtu
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep() -> QpEndpoint {
        QpEndpoint {
            qpn: 0x11,
            psn: 0xabcdef,
            gid: [7; 16],
            lid: 3,
            gid_index: 1,
            mtu: Mtu::M1024,
        }
    }

    #[test]
    fn round_trips() {
        let e = ep();
        assert_eq!(QpEndpoint::from_bytes(&e.to_bytes()).unwrap(), e);
        assert_eq!(QpEndpoint::from_hex(&e.to_hex()).unwrap(), e);
        assert!(e.to_string().contains("psn 0xabcdef"));
    }

    #[test]
    fn refuses_malformed_input_without_panicking() {
        let good = ep().to_bytes();
        assert!(QpEndpoint::from_bytes(&good[..31]).is_err());
        assert!(QpEndpoint::from_bytes(&[]).is_err());
        let mut b = good;
        b[0] = b'X';
        assert!(QpEndpoint::from_bytes(&b).is_err());
        let mut b = good;
        b[4] = 1; // qpn >= 2^24
        assert!(QpEndpoint::from_bytes(&b).is_err());
        let mut b = good;
        b[30] = 9;
        assert!(QpEndpoint::from_bytes(&b)
            .unwrap_err()
            .to_string()
            .contains("mtu"));
        assert!(QpEndpoint::from_hex("zz").is_err());
        assert!(QpEndpoint::from_hex(&"é".repeat(32)).is_err());
        assert!(QpEndpoint::from_hex(&"g".repeat(64)).is_err());
        // Every single-byte corruption either parses or errors; none panics.
        for i in 0..ENDPOINT_LEN {
            for v in [0u8, 0x7f, 0xff] {
                let mut b = good;
                b[i] = v;
                let _ = QpEndpoint::from_bytes(&b);
            }
        }
    }
}
