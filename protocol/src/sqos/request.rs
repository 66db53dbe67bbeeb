//! [MS-SQOS] 2.2.2.2 STORAGE_QOS_CONTROL_REQUEST.

use super::{
    guid_at, le16, le32, le64, set_guid, set_le16, set_le32, set_le64, Dialect, Guid, Options,
    Utf16Name,
};
use crate::WireError;

const WHAT: &str = "STORAGE_QOS_CONTROL_REQUEST";

/// Byte ranges of the fields of [MS-SQOS] 2.2.2.2, in table order.
mod field {
    use crate::sqos::Field;

    pub const PROTOCOL_VERSION: Field = 0..2;
    pub const RESERVED: Field = 2..4;
    pub const OPTIONS: Field = 4..8;
    pub const LOGICAL_FLOW_ID: Field = 8..24;
    pub const POLICY_ID: Field = 24..40;
    pub const INITIATOR_ID: Field = 40..56;
    pub const LIMIT: Field = 56..64;
    pub const RESERVATION: Field = 64..72;
    pub const INITIATOR_NAME_OFFSET: Field = 72..74;
    pub const INITIATOR_NAME_LENGTH: Field = 74..76;
    pub const INITIATOR_NODE_NAME_OFFSET: Field = 76..78;
    pub const INITIATOR_NODE_NAME_LENGTH: Field = 78..80;
    pub const IO_COUNT_INCREMENT: Field = 80..88;
    pub const NORMALIZED_IO_COUNT_INCREMENT: Field = 88..96;
    pub const LATENCY_INCREMENT: Field = 96..104;
    pub const LOWER_LATENCY_INCREMENT: Field = 104..112;
    /// End of the dialect 1.0 fixed part (112 bytes).
    pub const FIXED_V1_0_END: usize = LOWER_LATENCY_INCREMENT.end;
    /// Dialect 1.1 only.
    pub const BANDWIDTH_LIMIT: Field = 112..120;
    /// Dialect 1.1 only.
    pub const KILOBYTE_COUNT_INCREMENT: Field = 120..128;
    /// End of the dialect 1.1 fixed part (128 bytes).
    pub const FIXED_V1_1_END: usize = KILOBYTE_COUNT_INCREMENT.end;
}

// The dialects' fixed parts end where the field table says.
const _: () = assert!(field::FIXED_V1_0_END == Dialect::V1_0.request_fixed_len());
const _: () = assert!(field::FIXED_V1_1_END == Dialect::V1_1.request_fixed_len());

/// A zero-copy view of a STORAGE_QOS_CONTROL_REQUEST ([MS-SQOS] 2.2.2.2).
///
/// The buffer is the whole IOCTL input: its length is the request's
/// RequestSize ([MS-SQOS] 3.2.4.1). [`new_checked`](Self::new_checked)
/// verifies the ProtocolVersion and that the fixed part of that dialect is
/// present; the variable-length names are checked only when read, because
/// a server ignores them unless SET_POLICY or PROBE_POLICY is in effect.
#[derive(Debug, Clone)]
pub struct StorageQosControlRequest<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> StorageQosControlRequest<T> {
    /// Wraps `buffer` without any check. Accessors never panic, but on a
    /// buffer that `new_checked` would refuse they read zeros.
    pub const fn new_unchecked(buffer: T) -> Self {
        StorageQosControlRequest { buffer }
    }

    /// Wraps `buffer` after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let v = Self::new_unchecked(buffer);
        v.check_len()?;
        Ok(v)
    }

    /// Fails with `Truncated` when the buffer cannot hold ProtocolVersion,
    /// `Malformed { field: "ProtocolVersion" }` when it names no dialect of
    /// [MS-SQOS] 1.7, and `Truncated` when it is shorter than that dialect's
    /// fixed part (112 bytes for 1.0, 128 for 1.1).
    pub fn check_len(&self) -> Result<(), WireError> {
        let have = self.buffer.as_ref().len();
        if have < field::PROTOCOL_VERSION.end {
            return Err(WireError::Truncated {
                what: WHAT,
                need: field::PROTOCOL_VERSION.end,
                have,
            });
        }
        let dialect = Dialect::from_wire(self.protocol_version()).ok_or(WireError::Malformed {
            what: WHAT,
            field: "ProtocolVersion",
        })?;
        let need = dialect.request_fixed_len();
        if have < need {
            return Err(WireError::Truncated {
                what: WHAT,
                need,
                have,
            });
        }
        Ok(())
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// RequestSize ([MS-SQOS] 3.2.4.1): the total size of the request,
    /// including variable-length fields — the length of the buffer.
    pub fn request_size(&self) -> usize {
        self.buffer.as_ref().len()
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// ProtocolVersion.
    pub fn protocol_version(&self) -> u16 {
        le16(self.b(), field::PROTOCOL_VERSION)
    }
    /// The dialect ProtocolVersion names (1.0 if it names none, which
    /// `new_checked` rules out).
    pub fn dialect(&self) -> Dialect {
        Dialect::from_wire(self.protocol_version()).unwrap_or(Dialect::V1_0)
    }
    /// Reserved (ignored by a server).
    pub fn reserved(&self) -> u16 {
        le16(self.b(), field::RESERVED)
    }
    /// Options.
    pub fn options(&self) -> Options {
        Options::from_bits(le32(self.b(), field::OPTIONS))
    }
    /// LogicalFlowID.
    pub fn logical_flow_id(&self) -> Guid {
        guid_at(self.b(), field::LOGICAL_FLOW_ID)
    }
    /// PolicyID.
    pub fn policy_id(&self) -> Guid {
        guid_at(self.b(), field::POLICY_ID)
    }
    /// InitiatorID.
    pub fn initiator_id(&self) -> Guid {
        guid_at(self.b(), field::INITIATOR_ID)
    }
    /// Limit, in normalized IOPS (0: not defined).
    pub fn limit(&self) -> u64 {
        le64(self.b(), field::LIMIT)
    }
    /// Reservation, in normalized IOPS.
    pub fn reservation(&self) -> u64 {
        le64(self.b(), field::RESERVATION)
    }
    /// InitiatorNameOffset.
    pub fn initiator_name_offset(&self) -> u16 {
        le16(self.b(), field::INITIATOR_NAME_OFFSET)
    }
    /// InitiatorNameLength, in bytes.
    pub fn initiator_name_length(&self) -> u16 {
        le16(self.b(), field::INITIATOR_NAME_LENGTH)
    }
    /// InitiatorNodeNameOffset.
    pub fn initiator_node_name_offset(&self) -> u16 {
        le16(self.b(), field::INITIATOR_NODE_NAME_OFFSET)
    }
    /// InitiatorNodeNameLength, in bytes.
    pub fn initiator_node_name_length(&self) -> u16 {
        le16(self.b(), field::INITIATOR_NODE_NAME_LENGTH)
    }
    /// IoCountIncrement.
    pub fn io_count_increment(&self) -> u64 {
        le64(self.b(), field::IO_COUNT_INCREMENT)
    }
    /// NormalizedIoCountIncrement.
    pub fn normalized_io_count_increment(&self) -> u64 {
        le64(self.b(), field::NORMALIZED_IO_COUNT_INCREMENT)
    }
    /// LatencyIncrement, in 100-nanosecond units.
    pub fn latency_increment(&self) -> u64 {
        le64(self.b(), field::LATENCY_INCREMENT)
    }
    /// LowerLatencyIncrement, in 100-nanosecond units.
    pub fn lower_latency_increment(&self) -> u64 {
        le64(self.b(), field::LOWER_LATENCY_INCREMENT)
    }
    /// BandwidthLimit in KB/s (0: not defined); `None` in dialect 1.0, whose
    /// request has no such field.
    pub fn bandwidth_limit(&self) -> Option<u64> {
        match self.dialect() {
            Dialect::V1_0 => None,
            Dialect::V1_1 => Some(le64(self.b(), field::BANDWIDTH_LIMIT)),
        }
    }
    /// KilobyteCountIncrement; `None` in dialect 1.0.
    pub fn kilobyte_count_increment(&self) -> Option<u64> {
        match self.dialect() {
            Dialect::V1_0 => None,
            Dialect::V1_1 => Some(le64(self.b(), field::KILOBYTE_COUNT_INCREMENT)),
        }
    }

    fn name_bytes(
        &self,
        offset: u16,
        length: u16,
        field: &'static str,
    ) -> Result<&[u8], WireError> {
        if length == 0 {
            return Ok(&[]);
        }
        let start = usize::from(offset);
        let end = start + usize::from(length);
        self.b()
            .get(start..end)
            .ok_or(WireError::Malformed { what: WHAT, field })
    }

    /// The InitiatorName bytes (UTF-16LE) at InitiatorNameOffset; empty when
    /// InitiatorNameLength is 0. `Malformed { field: "InitiatorNameOffset" }`
    /// when offset + length runs past RequestSize.
    pub fn initiator_name(&self) -> Result<&[u8], WireError> {
        self.name_bytes(
            self.initiator_name_offset(),
            self.initiator_name_length(),
            "InitiatorNameOffset",
        )
    }

    /// The InitiatorNodeName bytes (UTF-16LE); as [`initiator_name`](Self::initiator_name).
    pub fn initiator_node_name(&self) -> Result<&[u8], WireError> {
        self.name_bytes(
            self.initiator_node_name_offset(),
            self.initiator_node_name_length(),
            "InitiatorNodeNameOffset",
        )
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> StorageQosControlRequest<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Sets ProtocolVersion.
    pub fn set_protocol_version(&mut self, v: u16) {
        set_le16(self.bm(), field::PROTOCOL_VERSION, v)
    }
    /// Sets Reserved.
    pub fn set_reserved(&mut self, v: u16) {
        set_le16(self.bm(), field::RESERVED, v)
    }
    /// Sets Options.
    pub fn set_options(&mut self, v: Options) {
        set_le32(self.bm(), field::OPTIONS, v.bits())
    }
    /// Sets LogicalFlowID.
    pub fn set_logical_flow_id(&mut self, v: Guid) {
        set_guid(self.bm(), field::LOGICAL_FLOW_ID, v)
    }
    /// Sets PolicyID.
    pub fn set_policy_id(&mut self, v: Guid) {
        set_guid(self.bm(), field::POLICY_ID, v)
    }
    /// Sets InitiatorID.
    pub fn set_initiator_id(&mut self, v: Guid) {
        set_guid(self.bm(), field::INITIATOR_ID, v)
    }
    /// Sets Limit.
    pub fn set_limit(&mut self, v: u64) {
        set_le64(self.bm(), field::LIMIT, v)
    }
    /// Sets Reservation.
    pub fn set_reservation(&mut self, v: u64) {
        set_le64(self.bm(), field::RESERVATION, v)
    }
    /// Sets InitiatorNameOffset.
    pub fn set_initiator_name_offset(&mut self, v: u16) {
        set_le16(self.bm(), field::INITIATOR_NAME_OFFSET, v)
    }
    /// Sets InitiatorNameLength.
    pub fn set_initiator_name_length(&mut self, v: u16) {
        set_le16(self.bm(), field::INITIATOR_NAME_LENGTH, v)
    }
    /// Sets InitiatorNodeNameOffset.
    pub fn set_initiator_node_name_offset(&mut self, v: u16) {
        set_le16(self.bm(), field::INITIATOR_NODE_NAME_OFFSET, v)
    }
    /// Sets InitiatorNodeNameLength.
    pub fn set_initiator_node_name_length(&mut self, v: u16) {
        set_le16(self.bm(), field::INITIATOR_NODE_NAME_LENGTH, v)
    }
    /// Sets IoCountIncrement.
    pub fn set_io_count_increment(&mut self, v: u64) {
        set_le64(self.bm(), field::IO_COUNT_INCREMENT, v)
    }
    /// Sets NormalizedIoCountIncrement.
    pub fn set_normalized_io_count_increment(&mut self, v: u64) {
        set_le64(self.bm(), field::NORMALIZED_IO_COUNT_INCREMENT, v)
    }
    /// Sets LatencyIncrement.
    pub fn set_latency_increment(&mut self, v: u64) {
        set_le64(self.bm(), field::LATENCY_INCREMENT, v)
    }
    /// Sets LowerLatencyIncrement.
    pub fn set_lower_latency_increment(&mut self, v: u64) {
        set_le64(self.bm(), field::LOWER_LATENCY_INCREMENT, v)
    }
    /// Sets BandwidthLimit (bytes 112..120: only meaningful in dialect 1.1).
    pub fn set_bandwidth_limit(&mut self, v: u64) {
        set_le64(self.bm(), field::BANDWIDTH_LIMIT, v)
    }
    /// Sets KilobyteCountIncrement (bytes 120..128: only meaningful in
    /// dialect 1.1).
    pub fn set_kilobyte_count_increment(&mut self, v: u64) {
        set_le64(self.bm(), field::KILOBYTE_COUNT_INCREMENT, v)
    }
    /// The whole buffer, for writing the variable-length part.
    pub fn buffer_mut(&mut self) -> &mut [u8] {
        self.bm()
    }
}

/// The values of a STORAGE_QOS_CONTROL_REQUEST ([MS-SQOS] 2.2.2.2).
///
/// Reserved fields are not represented (emitted as 0, ignored on parse);
/// name offsets are not represented either: [`emit`](Self::emit) places
/// InitiatorName right after the dialect's fixed part and InitiatorNodeName
/// right after it (offset 0 for an empty name), which satisfies 3.2.5.1.2
/// (offset ≥ 104, offset + length ≤ RequestSize) and is where Windows
/// clients put them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageQosControlRequestRepr<'a> {
    /// ProtocolVersion.
    pub dialect: Dialect,
    /// Options.
    pub options: Options,
    /// LogicalFlowID.
    pub logical_flow_id: Guid,
    /// PolicyID (NULL: no policy).
    pub policy_id: Guid,
    /// InitiatorID.
    pub initiator_id: Guid,
    /// Limit, normalized IOPS (0: not defined).
    pub limit: u64,
    /// Reservation, normalized IOPS.
    pub reservation: u64,
    /// IoCountIncrement.
    pub io_count_increment: u64,
    /// NormalizedIoCountIncrement.
    pub normalized_io_count_increment: u64,
    /// LatencyIncrement, 100 ns units.
    pub latency_increment: u64,
    /// LowerLatencyIncrement, 100 ns units.
    pub lower_latency_increment: u64,
    /// BandwidthLimit, KB/s (dialect 1.1 only: parsed as 0 from, and not
    /// emitted in, a 1.0 request).
    pub bandwidth_limit: u64,
    /// KilobyteCountIncrement (dialect 1.1 only, as `bandwidth_limit`).
    pub kilobyte_count_increment: u64,
    /// InitiatorName.
    pub initiator_name: Utf16Name<'a>,
    /// InitiatorNodeName.
    pub initiator_node_name: Utf16Name<'a>,
}

impl<'a> StorageQosControlRequestRepr<'a> {
    /// A request of `dialect` with the given options and flow, every other
    /// field zero ([MS-SQOS] 3.1.4.1: "All fields ... SHOULD initially be set
    /// to zero").
    pub fn new(dialect: Dialect, options: Options, logical_flow_id: Guid) -> Self {
        StorageQosControlRequestRepr {
            dialect,
            options,
            logical_flow_id,
            policy_id: Guid::NULL,
            initiator_id: Guid::NULL,
            limit: 0,
            reservation: 0,
            io_count_increment: 0,
            normalized_io_count_increment: 0,
            latency_increment: 0,
            lower_latency_increment: 0,
            bandwidth_limit: 0,
            kilobyte_count_increment: 0,
            initiator_name: Utf16Name::EMPTY,
            initiator_node_name: Utf16Name::EMPTY,
        }
    }

    /// Parses a request. Stricter than a server needs to be: the names must
    /// lie inside the buffer and be at most STORAGE_QOS_INITIATOR_NAME_SIZE
    /// bytes even when no flag uses them (the server works on the view and
    /// applies 3.2.5.1.2 itself).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        view: &StorageQosControlRequest<&'a T>,
    ) -> Result<Self, WireError> {
        view.check_len()?;
        let whole: &'a T = view.buffer;
        let buf: &'a [u8] = whole.as_ref();
        let view = StorageQosControlRequest::new_unchecked(buf);
        let initiator_name = Utf16Name::from_utf16le(name_slice(&view, true)?)?;
        let initiator_node_name = Utf16Name::from_utf16le(name_slice(&view, false)?)?;
        Ok(StorageQosControlRequestRepr {
            dialect: view.dialect(),
            options: view.options(),
            logical_flow_id: view.logical_flow_id(),
            policy_id: view.policy_id(),
            initiator_id: view.initiator_id(),
            limit: view.limit(),
            reservation: view.reservation(),
            io_count_increment: view.io_count_increment(),
            normalized_io_count_increment: view.normalized_io_count_increment(),
            latency_increment: view.latency_increment(),
            lower_latency_increment: view.lower_latency_increment(),
            bandwidth_limit: view.bandwidth_limit().unwrap_or(0),
            kilobyte_count_increment: view.kilobyte_count_increment().unwrap_or(0),
            initiator_name,
            initiator_node_name,
        })
    }

    /// Bytes [`emit`](Self::emit) writes: the dialect's fixed part plus both
    /// names.
    pub fn buffer_len(&self) -> usize {
        self.dialect.request_fixed_len()
            + self.initiator_name.byte_len()
            + self.initiator_node_name.byte_len()
    }

    /// Writes the request into `view`, whose buffer must hold at least
    /// [`buffer_len`](Self::buffer_len) bytes (a shorter buffer gets a
    /// truncated request, never a panic). Bytes past `buffer_len` are left
    /// untouched.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, view: &mut StorageQosControlRequest<T>) {
        let fixed = self.dialect.request_fixed_len();
        view.set_protocol_version(self.dialect.to_wire());
        view.set_reserved(0);
        view.set_options(self.options);
        view.set_logical_flow_id(self.logical_flow_id);
        view.set_policy_id(self.policy_id);
        view.set_initiator_id(self.initiator_id);
        view.set_limit(self.limit);
        view.set_reservation(self.reservation);
        view.set_io_count_increment(self.io_count_increment);
        view.set_normalized_io_count_increment(self.normalized_io_count_increment);
        view.set_latency_increment(self.latency_increment);
        view.set_lower_latency_increment(self.lower_latency_increment);
        if self.dialect == Dialect::V1_1 {
            view.set_bandwidth_limit(self.bandwidth_limit);
            view.set_kilobyte_count_increment(self.kilobyte_count_increment);
        }
        // Names are at most 0x200 bytes each (Utf16Name guarantees it), so
        // every offset and length below fits in 16 bits.
        let name_len = self.initiator_name.byte_len();
        let node_len = self.initiator_node_name.byte_len();
        let name_off = if name_len == 0 { 0 } else { fixed };
        let node_off = if node_len == 0 { 0 } else { fixed + name_len };
        view.set_initiator_name_offset(name_off as u16);
        view.set_initiator_name_length(name_len as u16);
        view.set_initiator_node_name_offset(node_off as u16);
        view.set_initiator_node_name_length(node_len as u16);
        let buf = view.buffer_mut();
        if let Some(dst) = buf.get_mut(fixed..) {
            self.initiator_name.write_utf16le(dst);
        }
        if let Some(dst) = buf.get_mut(fixed + name_len..) {
            self.initiator_node_name.write_utf16le(dst);
        }
    }

    /// The request as a new byte vector of [`buffer_len`](Self::buffer_len)
    /// bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.buffer_len()];
        self.emit(&mut StorageQosControlRequest::new_unchecked(&mut v[..]));
        v
    }
}

fn name_slice<'a>(
    view: &StorageQosControlRequest<&'a [u8]>,
    initiator: bool,
) -> Result<&'a [u8], WireError> {
    let buf: &'a [u8] = view.buffer;
    let (offset, length, field) = if initiator {
        (
            view.initiator_name_offset(),
            view.initiator_name_length(),
            "InitiatorNameOffset",
        )
    } else {
        (
            view.initiator_node_name_offset(),
            view.initiator_node_name_length(),
            "InitiatorNodeNameOffset",
        )
    };
    if length == 0 {
        return Ok(&[]);
    }
    let start = usize::from(offset);
    buf.get(start..start + usize::from(length))
        .ok_or(WireError::Malformed { what: WHAT, field })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(dialect: Dialect) -> StorageQosControlRequestRepr<'static> {
        StorageQosControlRequestRepr {
            policy_id: Guid::from_fields(1, 2, 3, [4; 8]),
            initiator_id: Guid::from_fields(5, 6, 7, [8; 8]),
            limit: 0,
            reservation: 0,
            io_count_increment: 399,
            normalized_io_count_increment: 400,
            latency_increment: 38_223_584,
            lower_latency_increment: 38_223_000,
            bandwidth_limit: if dialect == Dialect::V1_1 { 77 } else { 0 },
            kilobyte_count_increment: if dialect == Dialect::V1_1 { 88 } else { 0 },
            initiator_name: Utf16Name::new("TEST-VM").unwrap(),
            initiator_node_name: Utf16Name::new("node.example").unwrap(),
            ..StorageQosControlRequestRepr::new(
                dialect,
                Options::SET_POLICY | Options::UPDATE_COUNTERS,
                Guid::from_fields(9, 10, 11, [12; 8]),
            )
        }
    }

    #[test]
    fn request_round_trips_in_both_dialects() {
        for d in [Dialect::V1_0, Dialect::V1_1] {
            let repr = sample(d);
            let bytes = repr.to_vec();
            assert_eq!(bytes.len(), d.request_fixed_len() + 14 + 24);
            let view = StorageQosControlRequest::new_checked(&bytes[..]).unwrap();
            assert_eq!(
                usize::from(view.initiator_name_offset()),
                d.request_fixed_len()
            );
            assert_eq!(
                usize::from(view.initiator_node_name_offset()),
                d.request_fixed_len() + 14
            );
            assert_eq!(StorageQosControlRequestRepr::parse(&view).unwrap(), repr);
        }
    }

    #[test]
    fn dialect_1_0_request_has_no_bandwidth_fields() {
        let repr =
            StorageQosControlRequestRepr::new(Dialect::V1_0, Options::GET_STATUS, Guid::NULL);
        let bytes = repr.to_vec();
        assert_eq!(bytes.len(), 112);
        let view = StorageQosControlRequest::new_checked(&bytes[..]).unwrap();
        assert_eq!(view.bandwidth_limit(), None);
        assert_eq!(view.kilobyte_count_increment(), None);
    }

    #[test]
    fn request_shorter_than_its_dialect_fixed_part_is_truncated() {
        let mut bytes =
            StorageQosControlRequestRepr::new(Dialect::V1_1, Options::GET_STATUS, Guid::NULL)
                .to_vec();
        bytes.truncate(127);
        assert_eq!(
            StorageQosControlRequest::new_checked(&bytes[..]).unwrap_err(),
            WireError::Truncated {
                what: WHAT,
                need: 128,
                have: 127
            }
        );
        // The same 127 bytes are a complete dialect 1.0 request.
        bytes[0..2].copy_from_slice(&0x0100u16.to_le_bytes());
        assert!(StorageQosControlRequest::new_checked(&bytes[..]).is_ok());
        assert!(matches!(
            StorageQosControlRequest::new_checked(&[1u8][..]),
            Err(WireError::Truncated {
                need: 2,
                have: 1,
                ..
            })
        ));
    }

    #[test]
    fn request_with_unknown_protocol_version_is_malformed() {
        let mut bytes =
            StorageQosControlRequestRepr::new(Dialect::V1_1, Options::GET_STATUS, Guid::NULL)
                .to_vec();
        bytes[0..2].copy_from_slice(&0x0200u16.to_le_bytes());
        assert_eq!(
            StorageQosControlRequest::new_checked(&bytes[..]).unwrap_err(),
            WireError::Malformed {
                what: WHAT,
                field: "ProtocolVersion"
            }
        );
    }

    #[test]
    fn name_outside_the_buffer_is_reported_only_when_read() {
        let mut bytes = sample(Dialect::V1_1).to_vec();
        let len = bytes.len() as u16;
        bytes[72..74].copy_from_slice(&len.to_le_bytes());
        let view = StorageQosControlRequest::new_checked(&bytes[..]).unwrap();
        assert_eq!(view.options().bits(), 0x12);
        assert!(view.initiator_name().is_err());
        assert!(view.initiator_node_name().is_ok());
        assert_eq!(
            StorageQosControlRequestRepr::parse(&view).unwrap_err(),
            WireError::Malformed {
                what: WHAT,
                field: "InitiatorNameOffset"
            }
        );
    }
}
