//! FSCTL_QUERY_NETWORK_INTERFACE_INFO output: [MS-SMB2] 2.2.32.5
//! NETWORK_INTERFACE_INFO entries, each with a 2.2.32.5.1 SockAddr_Storage
//! (IPv4 2.2.32.5.1.1, IPv6 2.2.32.5.1.2). A multichannel client (Linux
//! cifs with `multichannel`) asks for them after SESSION_SETUP; an entry
//! with RDMA_CAPABLE is what makes it open an SMB Direct channel to that
//! address (3.3.5.15.11 builds one entry per IP address of each interface,
//! never for IfIndex 0).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::error::Smb2Error;
use super::fscc::{Chain, ChainWriter};
use super::layout::room;
use super::Scalar;

bitmask! {
    /// [MS-SMB2] 2.2.32.5 Capability.
    pub struct InterfaceCapability(u32) {
        /// RSS_CAPABLE.
        RSS_CAPABLE = 0x0000_0001;
        /// RDMA_CAPABLE.
        RDMA_CAPABLE = 0x0000_0002;
    }
}

/// [MS-SMB2] 2.2.32.5.1 Family InterNetwork (IPv4).
pub const AF_INET_WIRE: u16 = 0x0002;
/// [MS-SMB2] 2.2.32.5.1 Family InterNetworkV6 (IPv6).
pub const AF_INET6_WIRE: u16 = 0x0017;

/// Byte ranges of [MS-SMB2] 2.2.32.5 (relative to the entry).
mod field {
    use crate::smb2::Field;
    pub const NEXT: Field = 0..4;
    pub const IF_INDEX: Field = 4..8;
    pub const CAPABILITY: Field = 8..12;
    pub const RESERVED: Field = 12..16;
    pub const LINK_SPEED: Field = 16..24;
    /// SockAddr_Storage (128 bytes) starts here: Family (2), Buffer (126).
    pub const FAMILY: Field = 24..26;
    /// IPv4: Port (2), IPv4Address (4), Reserved (8).
    pub const IPV4_ADDRESS: Field = 28..32;
    /// IPv6: Port (2), FlowInfo (4), IPv6Address (16), ScopeId (4).
    pub const IPV6_ADDRESS: Field = 32..48;
    /// Length of an entry.
    pub const LEN: usize = 152;
}

const WHAT: &str = "NETWORK_INTERFACE_INFO";

/// One NETWORK_INTERFACE_INFO ([MS-SMB2] 2.2.32.5): 152 bytes. Port,
/// FlowInfo and ScopeId of the address are written as 0 and ignored on
/// receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkInterfaceInfoRepr {
    /// IfIndex (not 0; the same for every address of one interface).
    pub if_index: u32,
    /// Capability.
    pub capability: InterfaceCapability,
    /// LinkSpeed, in bits per second.
    pub link_speed: u64,
    /// The address (IPv4 or IPv6, network byte order on the wire).
    pub address: IpAddr,
}

impl NetworkInterfaceInfoRepr {
    /// Length of an entry.
    pub const LEN: usize = field::LEN;

    /// Reads one entry (at least 152 bytes; Next is not interpreted).
    pub fn from_bytes(b: &[u8]) -> Result<Self, Smb2Error> {
        super::fscc::need(WHAT, b, Self::LEN)?;
        let address = match u16::read(b, field::FAMILY) {
            AF_INET_WIRE => {
                let a = &b[field::IPV4_ADDRESS];
                IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]))
            }
            AF_INET6_WIRE => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::read(b, field::IPV6_ADDRESS))),
            _ => {
                return Err(Smb2Error::Malformed {
                    what: WHAT,
                    field: "SockAddr_Storage.Family (not InterNetwork or InterNetworkV6)",
                })
            }
        };
        Ok(NetworkInterfaceInfoRepr {
            if_index: u32::read(b, field::IF_INDEX),
            capability: InterfaceCapability::read(b, field::CAPABILITY),
            link_speed: u64::read(b, field::LINK_SPEED),
            address,
        })
    }

    /// Writes the entry with the given Next into `dst` (152 bytes, every
    /// byte written).
    fn write(&self, dst: &mut [u8], next: u32) {
        dst[..Self::LEN].fill(0);
        next.write(dst, field::NEXT);
        self.if_index.write(dst, field::IF_INDEX);
        self.capability.write(dst, field::CAPABILITY);
        0u32.write(dst, field::RESERVED);
        self.link_speed.write(dst, field::LINK_SPEED);
        match self.address {
            IpAddr::V4(a) => {
                AF_INET_WIRE.write(dst, field::FAMILY);
                dst[field::IPV4_ADDRESS].copy_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                AF_INET6_WIRE.write(dst, field::FAMILY);
                dst[field::IPV6_ADDRESS].copy_from_slice(&a.octets());
            }
        }
    }
}

/// The FSCTL_QUERY_NETWORK_INTERFACE_INFO output to emit: the entries
/// back to back, Next = 152 on all but the last (0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NetworkInterfaceInfoList<'a> {
    /// The entries.
    pub entries: &'a [NetworkInterfaceInfoRepr],
}

impl<'a> NetworkInterfaceInfoList<'a> {
    /// 152 per entry.
    pub fn buffer_len(&self) -> usize {
        NetworkInterfaceInfoRepr::LEN * self.entries.len()
    }

    /// Writes the list (the IOCTL response's output).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        let len = self.buffer_len();
        room(WHAT, buf, len)?;
        let mut w = ChainWriter::default();
        for e in self.entries {
            let start = w.end;
            e.write(&mut buf[start..start + NetworkInterfaceInfoRepr::LEN], 0);
            w.commit(buf, start, NetworkInterfaceInfoRepr::LEN);
        }
        Ok(len)
    }

    /// Walks a received list.
    pub fn iter(bytes: &'a [u8]) -> NetworkInterfaceInfoIter<'a> {
        NetworkInterfaceInfoIter {
            chain: Chain::new(WHAT, bytes),
        }
    }
}

/// Walks NETWORK_INTERFACE_INFO entries by Next (a multiple of 8 inside
/// the buffer); the first malformed one is yielded as `Err` and ends the
/// walk.
#[derive(Debug, Clone)]
pub struct NetworkInterfaceInfoIter<'a> {
    chain: Chain<'a>,
}

impl Iterator for NetworkInterfaceInfoIter<'_> {
    type Item = Result<NetworkInterfaceInfoRepr, Smb2Error>;

    fn next(&mut self) -> Option<Self::Item> {
        let e = self.chain.next_entry(field::LEN, |_| field::LEN)?;
        let r = e.and_then(NetworkInterfaceInfoRepr::from_bytes);
        if r.is_err() {
            self.chain = Chain::new(WHAT, &[]);
        }
        Some(r)
    }
}
