//! What a device reports about itself and its ports: MTUs, port state, link layer, GIDs with
//! their types (IB, RoCE v1, RoCE v2), and the device summary `hixl info` prints.

use std::fmt;
use std::net::Ipv6Addr;

use crate::sys;

/// Path MTU of a port or a connection (`enum ibv_mtu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    /// 256 bytes.
    M256 = 1,
    /// 512 bytes.
    M512 = 2,
    /// 1024 bytes (rxe's default over a 1500-byte Ethernet MTU).
    M1024 = 3,
    /// 2048 bytes.
    M2048 = 4,
    /// 4096 bytes.
    M4096 = 5,
}

impl Mtu {
    /// From the `ibv_mtu` code (1..=5).
    pub fn from_code(code: u32) -> Option<Mtu> {
        Some(match code {
            1 => Mtu::M256,
            2 => Mtu::M512,
            3 => Mtu::M1024,
            4 => Mtu::M2048,
            5 => Mtu::M4096,
            _ => return None,
        })
    }
    /// The `ibv_mtu` code.
    pub fn code(self) -> u32 {
        self as u32
    }
    /// Bytes.
    pub fn bytes(self) -> u32 {
        128 << self.code()
    }
}

impl fmt::Display for Mtu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

/// Logical port state (`enum ibv_port_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PortState {
    /// Down: no link.
    Down,
    /// Initializing (IB: waiting for the subnet manager).
    Init,
    /// Armed.
    Armed,
    /// Active: usable.
    Active,
    /// Any other code (NOP, ACTIVE_DEFER, future values).
    Other(u32),
}

impl PortState {
    pub(crate) fn from_code(c: u32) -> PortState {
        match c {
            sys::ibv_port_state::IBV_PORT_DOWN => PortState::Down,
            sys::ibv_port_state::IBV_PORT_INIT => PortState::Init,
            sys::ibv_port_state::IBV_PORT_ARMED => PortState::Armed,
            sys::ibv_port_state::IBV_PORT_ACTIVE => PortState::Active,
            c => PortState::Other(c),
        }
    }
}

impl fmt::Display for PortState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortState::Down => f.write_str("down"),
            PortState::Init => f.write_str("init"),
            PortState::Armed => f.write_str("armed"),
            PortState::Active => f.write_str("active"),
            PortState::Other(c) => write!(f, "state {c}"),
        }
    }
}

/// Link layer of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// InfiniBand: addressed by LID; GIDs optional.
    InfiniBand,
    /// Ethernet (RoCE, including Soft-RoCE): addressed by GID only.
    Ethernet,
    /// Unspecified by the driver (treated as InfiniBand by libibverbs).
    Unspecified,
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LinkLayer::InfiniBand => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet",
            LinkLayer::Unspecified => "unspecified",
        })
    }
}

/// What a GID table entry addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GidType {
    /// InfiniBand GID.
    Ib,
    /// RoCE v1 (Ethernet, not routable).
    RoceV1,
    /// RoCE v2 (UDP/IP, routable): what RoCE deployments use.
    RoceV2,
    /// A type this build does not know.
    Other(u32),
}

impl GidType {
    pub(crate) fn from_code(c: u32) -> GidType {
        match c {
            sys::GID_TYPE_IB => GidType::Ib,
            sys::GID_TYPE_ROCE_V1 => GidType::RoceV1,
            sys::GID_TYPE_ROCE_V2 => GidType::RoceV2,
            c => GidType::Other(c),
        }
    }
}

impl fmt::Display for GidType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GidType::Ib => f.write_str("IB"),
            GidType::RoceV1 => f.write_str("RoCE v1"),
            GidType::RoceV2 => f.write_str("RoCE v2"),
            GidType::Other(c) => write!(f, "type {c}"),
        }
    }
}

/// One populated GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GidInfo {
    /// Index in the port's GID table (what a QP's `gid_index` names).
    pub index: u8,
    /// The GID (for RoCE an IPv6 or IPv4-mapped address).
    pub gid: [u8; 16],
    /// Its type.
    pub gid_type: GidType,
}

impl fmt::Display for GidInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gid[{}] {} ({})",
            self.index,
            Ipv6Addr::from(self.gid),
            self.gid_type
        )
    }
}

/// One port of a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number (from 1).
    pub port: u8,
    /// Logical state.
    pub state: PortState,
    /// Active MTU (`None` for a code this build does not know).
    pub active_mtu: Option<Mtu>,
    /// Largest message one work request may carry; larger ops are split.
    pub max_msg_size: u32,
    /// Local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Populated GID entries.
    pub gids: Vec<GidInfo>,
}

impl PortInfo {
    pub(crate) fn from_attr(port: u8, a: &sys::ibv_port_attr) -> PortInfo {
        PortInfo {
            port,
            state: PortState::from_code(a.state),
            active_mtu: Mtu::from_code(a.active_mtu),
            max_msg_size: a.max_msg_sz,
            lid: a.lid,
            link_layer: match a.link_layer {
                sys::LINK_LAYER_INFINIBAND => LinkLayer::InfiniBand,
                sys::LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
                _ => LinkLayer::Unspecified,
            },
            gids: Vec::new(),
        }
    }

    /// The GID index a QP should use by default: the first routable RoCE v2 GID — an
    /// IPv4-mapped one first, then a global IPv6 one — else the first RoCE v2 GID, else the
    /// first GID. (A link-local `fe80::` GID, index 0 on most RoCE ports, reaches only peers on
    /// the same link: across subnets, and between two devices of one host, nothing arrives.)
    pub fn default_gid_index(&self) -> Option<u8> {
        let v2 = || self.gids.iter().filter(|g| g.gid_type == GidType::RoceV2);
        let addr = |g: &GidInfo| std::net::Ipv6Addr::from(g.gid);
        v2().find(|g| addr(g).to_ipv4_mapped().is_some())
            .or_else(|| {
                v2().find(|g| {
                    let a = addr(g);
                    (a.segments()[0] & 0xffc0) != 0xfe80 && !a.is_unspecified()
                })
            })
            .or_else(|| v2().next())
            .or_else(|| self.gids.first())
            .map(|g| g.index)
    }
}

/// A device and its ports, for `hixl info` and transport selection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name.
    pub name: String,
    /// Firmware version string.
    pub fw_ver: String,
    /// Largest memory region.
    pub max_mr_size: u64,
    /// Deepest work queue.
    pub max_qp_wr: u32,
    /// Largest completion queue.
    pub max_cqe: u32,
    /// Outstanding RDMA READs a QP may initiate.
    pub max_qp_init_rd_atom: u32,
    /// Ports, from 1.
    pub ports: Vec<PortInfo>,
}

impl DeviceInfo {
    /// The first active port.
    pub fn active_port(&self) -> Option<&PortInfo> {
        self.ports.iter().find(|p| p.state == PortState::Active)
    }
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: fw {}, max_mr_size {}, max_qp_wr {}, max_cqe {}",
            self.name, self.fw_ver, self.max_mr_size, self.max_qp_wr, self.max_cqe
        )?;
        for p in &self.ports {
            let mtu = p
                .active_mtu
                .map_or_else(|| "?".to_owned(), |m| m.to_string());
            writeln!(
                f,
                "  port {}: {}, {}, active_mtu {}, max_msg {}, lid {}",
                p.port, p.state, p.link_layer, mtu, p.max_msg_size, p.lid
            )?;
            for g in &p.gids {
                writeln!(f, "    {g}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_codes() {
        assert_eq!(Mtu::from_code(3), Some(Mtu::M1024));
        assert_eq!(Mtu::M4096.bytes(), 4096);
        assert_eq!(Mtu::M256.bytes(), 256);
        assert_eq!(Mtu::from_code(0), None);
        assert_eq!(Mtu::from_code(6), None);
        assert!(Mtu::M1024 < Mtu::M4096);
    }

    #[test]
    fn gid_display_and_default_index() {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[192, 0, 2, 1]);
        let p = PortInfo {
            port: 1,
            state: PortState::Active,
            active_mtu: Some(Mtu::M1024),
            max_msg_size: 1 << 23,
            lid: 0,
            link_layer: LinkLayer::Ethernet,
            gids: vec![
                GidInfo {
                    index: 0,
                    gid,
                    gid_type: GidType::RoceV1,
                },
                GidInfo {
                    index: 1,
                    gid,
                    gid_type: GidType::RoceV2,
                },
            ],
        };
        assert_eq!(p.default_gid_index(), Some(1));
        assert_eq!(p.gids[1].to_string(), "gid[1] ::ffff:192.0.2.1 (RoCE v2)");
        // As rxe and mlx5 list them: link-local first, the IPv4-mapped one after it.
        let mut ll = [0u8; 16];
        ll[..2].copy_from_slice(&[0xfe, 0x80]);
        ll[8..].copy_from_slice(&[0x0c, 0x48, 0xe0, 0xff, 0xfe, 0x32, 0x50, 0x72]);
        let mut global = [0u8; 16];
        global[..2].copy_from_slice(&[0x20, 0x01]);
        global[15] = 1;
        let port = |gids: Vec<([u8; 16], GidType)>| PortInfo {
            gids: gids
                .into_iter()
                .enumerate()
                .map(|(i, (gid, gid_type))| GidInfo {
                    index: i as u8,
                    gid,
                    gid_type,
                })
                .collect(),
            ..p.clone()
        };
        let v2 = GidType::RoceV2;
        assert_eq!(port(vec![(ll, v2), (gid, v2)]).default_gid_index(), Some(1));
        assert_eq!(
            port(vec![(ll, v2), (global, v2), (gid, v2)]).default_gid_index(),
            Some(2)
        );
        assert_eq!(
            port(vec![(ll, v2), (global, v2)]).default_gid_index(),
            Some(1)
        );
        assert_eq!(port(vec![(ll, v2)]).default_gid_index(), Some(0));
        assert_eq!(
            port(vec![(gid, GidType::RoceV1)]).default_gid_index(),
            Some(0)
        );
    }
}
