//! [MS-SQOS] v8.0 Storage Quality of Service Protocol.
//!
//! - Wire codecs (section 2.2), smoltcp-style: [`StorageQosControlRequest`] /
//!   [`StorageQosControlRequestRepr`] and [`StorageQosControlResponse`] /
//!   [`StorageQosControlResponseRepr`], for SQoS dialects 1.0 (0x0100) and 1.1
//!   (0x0101). Names travel as UTF-16LE ([`Utf16Name`]); GUIDs as
//!   [`Guid`].
//! - Server processing (3.2) as pure functions over a
//!   [`server::LogicalFlowTable`] and a per-Open [`server::OpenQosState`]:
//!   [`server::process_request`].
//! - Client state (3.1): [`client::LogicalFlow`] (counters, StatusRequestTimer,
//!   request building, response handling) and the 3.1.7.1 initiation limit
//!   ([`client::InitiationLimiter`]).
//!
//! Where the specification is silent or contradicts itself the choice made is
//! written down in `docs/spec-notes.md`, section "MS-SQOS"; code comments
//! refer to those entries by their heading.

pub mod client;
pub mod enforcement;
mod guid;
mod name;
mod normalized_io;
mod request;
mod response;
pub mod server;

pub use guid::{Guid, GuidParseError};
pub use name::Utf16Name;
pub use normalized_io::{normalized_io_size, DEFAULT_BASE_IO_SIZE};
pub use request::{StorageQosControlRequest, StorageQosControlRequestRepr};
pub use response::{StorageQosControlResponse, StorageQosControlResponseRepr};

/// [MS-SQOS] 2.2.1: control code of the SMB2 IOCTL that carries a
/// STORAGE_QOS_CONTROL_REQUEST.
pub const FSCTL_STORAGE_QOS_CONTROL: u32 = 0x0009_0350;

/// [MS-SQOS] 2.2.1: maximum length, in bytes, of InitiatorName and
/// InitiatorNodeName.
pub const STORAGE_QOS_INITIATOR_NAME_SIZE: usize = 0x200;

/// [MS-SQOS] 3.2.5.1.2: the smallest InitiatorNameOffset /
/// InitiatorNodeNameOffset a server accepts for a non-empty name. Note that
/// this is smaller than both fixed parts (112 and 128 bytes); see
/// `docs/spec-notes.md`, "Name offset minimum 104".
pub const MIN_NAME_OFFSET: usize = 104;

/// [MS-SQOS] 3.1.4.1 / 3.2.5.1.4: the response size the specification quotes
/// ("at least 80 (size of STORAGE_QOS_CONTROL_RESPONSE)"). The real sizes are
/// 88 (dialect 1.0) and 96 (dialect 1.1); see `docs/spec-notes.md`,
/// "Response size 80 vs 88/96".
pub const SPEC_QUOTED_RESPONSE_SIZE: usize = 80;

/// [MS-SQOS] 1.7: SQoS dialect (protocol version).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dialect {
    /// SQoS dialect 1.0, ProtocolVersion 0x0100: no BandwidthLimit,
    /// KilobyteCountIncrement or MaximumBandwidth fields.
    V1_0,
    /// SQoS dialect 1.1, ProtocolVersion 0x0101.
    V1_1,
}

impl Dialect {
    /// The highest dialect this crate implements ([MS-SQOS] 3.1.3 / 3.2.3).
    pub const HIGHEST: Dialect = Dialect::V1_1;

    /// [MS-SQOS] 1.7: the dialect a ProtocolVersion value names, if any.
    pub const fn from_wire(protocol_version: u16) -> Option<Dialect> {
        match protocol_version {
            0x0100 => Some(Dialect::V1_0),
            0x0101 => Some(Dialect::V1_1),
            _ => None,
        }
    }

    /// [MS-SQOS] 1.7: the ProtocolVersion value of this dialect.
    pub const fn to_wire(self) -> u16 {
        match self {
            Dialect::V1_0 => 0x0100,
            Dialect::V1_1 => 0x0101,
        }
    }

    /// [MS-SQOS] 2.2.2.2: length of the request's fixed part (112 bytes for
    /// 1.0, 128 for 1.1, which adds BandwidthLimit and KilobyteCountIncrement).
    pub const fn request_fixed_len(self) -> usize {
        match self {
            Dialect::V1_0 => 112,
            Dialect::V1_1 => 128,
        }
    }

    /// [MS-SQOS] 2.2.2.3: length of the response (88 bytes for 1.0, 96 for
    /// 1.1, which adds MaximumBandwidth).
    pub const fn response_len(self) -> usize {
        match self {
            Dialect::V1_0 => 88,
            Dialect::V1_1 => 96,
        }
    }
}

impl core::fmt::Display for Dialect {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Dialect::V1_0 => f.write_str("SQoS 1.0"),
            Dialect::V1_1 => f.write_str("SQoS 1.1"),
        }
    }
}

/// [MS-SQOS] 2.2.2.2: the Options bitmap of a STORAGE_QOS_CONTROL_REQUEST.
/// Bits the specification does not define are kept (so a view round-trips)
/// but carry no meaning.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Options(u32);

impl Options {
    /// No flag.
    pub const NONE: Options = Options(0);
    /// STORAGE_QOS_CONTROL_FLAG_SET_LOGICAL_FLOW_ID: associate the handle to
    /// the logical flow named by LogicalFlowID.
    pub const SET_LOGICAL_FLOW_ID: Options = Options(0x0000_0001);
    /// STORAGE_QOS_CONTROL_FLAG_SET_POLICY: update the flow's policy
    /// parameters.
    pub const SET_POLICY: Options = Options(0x0000_0002);
    /// STORAGE_QOS_CONTROL_FLAG_PROBE_POLICY: set flow and policy only if the
    /// handle is not yet associated.
    pub const PROBE_POLICY: Options = Options(0x0000_0004);
    /// STORAGE_QOS_CONTROL_FLAG_GET_STATUS: return a
    /// STORAGE_QOS_CONTROL_RESPONSE.
    pub const GET_STATUS: Options = Options(0x0000_0008);
    /// STORAGE_QOS_CONTROL_FLAG_UPDATE_COUNTERS: the counter fields are valid.
    pub const UPDATE_COUNTERS: Options = Options(0x0000_0010);
    /// Every flag [MS-SQOS] 2.2.2.2 defines.
    pub const ALL_DEFINED: Options = Options(0x0000_001F);

    /// From the raw bitmap (all bits kept).
    pub const fn from_bits(bits: u32) -> Options {
        Options(bits)
    }
    /// The raw bitmap.
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// True when every flag of `other` is set.
    pub const fn contains(self, other: Options) -> bool {
        self.0 & other.0 == other.0
    }
    /// True when any flag of `other` is set.
    pub const fn intersects(self, other: Options) -> bool {
        self.0 & other.0 != 0
    }
    /// True when at least one flag defined by [MS-SQOS] 2.2.2.2 is set.
    pub const fn has_defined_flag(self) -> bool {
        self.intersects(Options::ALL_DEFINED)
    }
    /// `self` with the flags of `other` cleared.
    pub const fn without(self, other: Options) -> Options {
        Options(self.0 & !other.0)
    }
}

impl core::ops::BitOr for Options {
    type Output = Options;
    fn bitor(self, rhs: Options) -> Options {
        Options(self.0 | rhs.0)
    }
}

impl core::ops::BitOrAssign for Options {
    fn bitor_assign(&mut self, rhs: Options) {
        self.0 |= rhs.0;
    }
}

impl core::fmt::Debug for Options {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        const NAMES: [(Options, &str); 5] = [
            (Options::SET_LOGICAL_FLOW_ID, "SET_LOGICAL_FLOW_ID"),
            (Options::SET_POLICY, "SET_POLICY"),
            (Options::PROBE_POLICY, "PROBE_POLICY"),
            (Options::GET_STATUS, "GET_STATUS"),
            (Options::UPDATE_COUNTERS, "UPDATE_COUNTERS"),
        ];
        write!(f, "Options(0x{:08X}", self.0)?;
        let mut sep = ": ";
        for (flag, name) in NAMES {
            if self.contains(flag) {
                write!(f, "{sep}{name}")?;
                sep = " | ";
            }
        }
        let undefined = self.0 & !Options::ALL_DEFINED.0;
        if undefined != 0 {
            write!(f, "{sep}undefined 0x{undefined:08X}")?;
        }
        f.write_str(")")
    }
}

/// [MS-SQOS] 2.2.2.1: Logical Flow Status Codes, as carried in the Status
/// field of a STORAGE_QOS_CONTROL_RESPONSE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlowStatus {
    /// StorageQoSStatusOk (0): the flow performs within its policy.
    Ok,
    /// StorageQoSStatusInsufficientThroughput (1): the minimum throughput
    /// demand cannot be satisfied.
    InsufficientThroughput,
    /// StorageQoSUnknownPolicyId (2): the flow's PolicyID is not known.
    UnknownPolicyId,
    /// StorageQoSStatusConfigurationMismatch (4): a requested policy parameter
    /// is not supported.
    ConfigurationMismatch,
    /// StorageQoSStatusNotAvailable (5): no status information for the flow.
    NotAvailable,
    /// A value 2.2.2.1 does not define, received from a peer. Never produced
    /// by this crate's server; kept so a client does not discard the rest of
    /// a response.
    Unrecognized(u32),
}

impl FlowStatus {
    /// From the wire value.
    pub const fn from_wire(v: u32) -> FlowStatus {
        match v {
            0 => FlowStatus::Ok,
            1 => FlowStatus::InsufficientThroughput,
            2 => FlowStatus::UnknownPolicyId,
            4 => FlowStatus::ConfigurationMismatch,
            5 => FlowStatus::NotAvailable,
            other => FlowStatus::Unrecognized(other),
        }
    }
    /// The wire value.
    pub const fn to_wire(self) -> u32 {
        match self {
            FlowStatus::Ok => 0,
            FlowStatus::InsufficientThroughput => 1,
            FlowStatus::UnknownPolicyId => 2,
            FlowStatus::ConfigurationMismatch => 4,
            FlowStatus::NotAvailable => 5,
            FlowStatus::Unrecognized(v) => v,
        }
    }
    /// True for the values [MS-SQOS] 2.2.2.1 defines.
    pub const fn is_defined(self) -> bool {
        !matches!(self, FlowStatus::Unrecognized(_))
    }
}

/// A byte range of a fixed-layout field.
type Field = core::ops::Range<usize>;

// Little-endian field access. The views call these only after `new_checked`
// verified that the buffer covers every fixed field; even so a short buffer
// reads as zero (and a write is dropped) rather than panicking.
fn read<const N: usize>(b: &[u8], f: Field) -> [u8; N] {
    let mut a = [0u8; N];
    if let Some(src) = b.get(f) {
        if src.len() == N {
            a.copy_from_slice(src);
        }
    }
    a
}
fn le16(b: &[u8], f: Field) -> u16 {
    u16::from_le_bytes(read(b, f))
}
fn le32(b: &[u8], f: Field) -> u32 {
    u32::from_le_bytes(read(b, f))
}
fn le64(b: &[u8], f: Field) -> u64 {
    u64::from_le_bytes(read(b, f))
}
fn guid_at(b: &[u8], f: Field) -> Guid {
    Guid::from_bytes(read(b, f))
}
fn write(b: &mut [u8], f: Field, v: &[u8]) {
    if let Some(dst) = b.get_mut(f) {
        if dst.len() == v.len() {
            dst.copy_from_slice(v);
        }
    }
}
fn set_le16(b: &mut [u8], f: Field, v: u16) {
    write(b, f, &v.to_le_bytes())
}
fn set_le32(b: &mut [u8], f: Field, v: u32) {
    write(b, f, &v.to_le_bytes())
}
fn set_le64(b: &mut [u8], f: Field, v: u64) {
    write(b, f, &v.to_le_bytes())
}
fn set_guid(b: &mut [u8], f: Field, v: Guid) {
    write(b, f, v.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dialect_wire_values_and_sizes_follow_section_1_7_and_2_2() {
        assert_eq!(Dialect::from_wire(0x0100), Some(Dialect::V1_0));
        assert_eq!(Dialect::from_wire(0x0101), Some(Dialect::V1_1));
        assert_eq!(Dialect::from_wire(0x0102), None);
        assert_eq!(Dialect::from_wire(0x0001), None);
        assert_eq!(Dialect::V1_0.request_fixed_len(), 112);
        assert_eq!(Dialect::V1_1.request_fixed_len(), 128);
        assert_eq!(Dialect::V1_0.response_len(), 88);
        assert_eq!(Dialect::V1_1.response_len(), 96);
        assert!(Dialect::V1_0 < Dialect::V1_1);
    }

    #[test]
    fn constants_match_section_2_2_1() {
        assert_eq!(FSCTL_STORAGE_QOS_CONTROL, 0x0009_0350);
        assert_eq!(STORAGE_QOS_INITIATOR_NAME_SIZE, 512);
    }

    #[test]
    fn flow_status_codes_match_section_2_2_2_1() {
        for (s, v) in [
            (FlowStatus::Ok, 0),
            (FlowStatus::InsufficientThroughput, 1),
            (FlowStatus::UnknownPolicyId, 2),
            (FlowStatus::ConfigurationMismatch, 4),
            (FlowStatus::NotAvailable, 5),
        ] {
            assert_eq!(s.to_wire(), v);
            assert_eq!(FlowStatus::from_wire(v), s);
            assert!(s.is_defined());
        }
        assert_eq!(FlowStatus::from_wire(3), FlowStatus::Unrecognized(3));
        assert!(!FlowStatus::from_wire(3).is_defined());
    }

    #[test]
    fn options_flags_match_section_2_2_2_2() {
        let o = Options::PROBE_POLICY | Options::GET_STATUS | Options::UPDATE_COUNTERS;
        assert_eq!(o.bits(), 0x1C);
        assert!(o.contains(Options::GET_STATUS));
        assert!(!o.contains(Options::SET_POLICY));
        assert!(o.has_defined_flag());
        assert!(!Options::from_bits(0x8000_0000).has_defined_flag());
        assert_eq!(o.without(Options::PROBE_POLICY).bits(), 0x18);
        let dbg = format!("{:?}", Options::from_bits(0x8000_0001));
        assert!(
            dbg.contains("SET_LOGICAL_FLOW_ID") && dbg.contains("undefined"),
            "{dbg}"
        );
    }

    #[test]
    fn field_helpers_never_panic_on_short_buffers() {
        assert_eq!(le64(&[1, 2], 0..8), 0);
        let mut b = [0u8; 2];
        set_le32(&mut b, 0..4, 7);
        assert_eq!(b, [0, 0]);
    }
}
