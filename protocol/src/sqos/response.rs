//! [MS-SQOS] 2.2.2.3 STORAGE_QOS_CONTROL_RESPONSE.

use super::{
    guid_at, le16, le32, le64, set_guid, set_le16, set_le32, set_le64, Dialect, FlowStatus, Guid,
};
use crate::WireError;

const WHAT: &str = "STORAGE_QOS_CONTROL_RESPONSE";

/// Byte ranges of the fields of [MS-SQOS] 2.2.2.3, in table order.
/// MaximumBandwidth is last, after BaseIoSize and Reserved, as the table says
/// — not where the 4.3 example's hex dump puts it; see `docs/spec-notes.md`,
/// "MaximumBandwidth position in the 4.3 response dump".
mod field {
    use crate::sqos::Field;

    pub const PROTOCOL_VERSION: Field = 0..2;
    pub const RESERVED: Field = 2..4;
    pub const OPTIONS: Field = 4..8;
    pub const LOGICAL_FLOW_ID: Field = 8..24;
    pub const POLICY_ID: Field = 24..40;
    pub const INITIATOR_ID: Field = 40..56;
    pub const TIME_TO_LIVE: Field = 56..60;
    pub const STATUS: Field = 60..64;
    pub const MAXIMUM_IO_RATE: Field = 64..72;
    pub const MINIMUM_IO_RATE: Field = 72..80;
    pub const BASE_IO_SIZE: Field = 80..84;
    pub const RESERVED2: Field = 84..88;
    /// Dialect 1.1 only.
    pub const MAXIMUM_BANDWIDTH: Field = 88..96;
}

// The dialects' responses end where the field table says.
const _: () = assert!(field::RESERVED2.end == Dialect::V1_0.response_len());
const _: () = assert!(field::MAXIMUM_BANDWIDTH.end == Dialect::V1_1.response_len());

/// A zero-copy view of a STORAGE_QOS_CONTROL_RESPONSE ([MS-SQOS] 2.2.2.3):
/// 88 bytes in dialect 1.0, 96 in dialect 1.1.
#[derive(Debug, Clone)]
pub struct StorageQosControlResponse<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> StorageQosControlResponse<T> {
    /// Wraps `buffer` without any check (accessors read zeros past its end).
    pub const fn new_unchecked(buffer: T) -> Self {
        StorageQosControlResponse { buffer }
    }

    /// Wraps `buffer` after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let v = Self::new_unchecked(buffer);
        v.check_len()?;
        Ok(v)
    }

    /// Fails unless ProtocolVersion names a dialect and the buffer holds that
    /// dialect's response (88 / 96 bytes). Trailing bytes are ignored.
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
        let need = dialect.response_len();
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

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// ProtocolVersion.
    pub fn protocol_version(&self) -> u16 {
        le16(self.b(), field::PROTOCOL_VERSION)
    }
    /// The dialect ProtocolVersion names (1.0 if none; `new_checked` rules
    /// that out).
    pub fn dialect(&self) -> Dialect {
        Dialect::from_wire(self.protocol_version()).unwrap_or(Dialect::V1_0)
    }
    /// Reserved (ignored by a client).
    pub fn reserved(&self) -> u16 {
        le16(self.b(), field::RESERVED)
    }
    /// Options (the server sets 0).
    pub fn options(&self) -> u32 {
        le32(self.b(), field::OPTIONS)
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
    /// TimeToLive, in milliseconds.
    pub fn time_to_live(&self) -> u32 {
        le32(self.b(), field::TIME_TO_LIVE)
    }
    /// Status ([MS-SQOS] 2.2.2.1).
    pub fn status(&self) -> FlowStatus {
        FlowStatus::from_wire(le32(self.b(), field::STATUS))
    }
    /// MaximumIoRate, normalized IOPS.
    pub fn maximum_io_rate(&self) -> u64 {
        le64(self.b(), field::MAXIMUM_IO_RATE)
    }
    /// MinimumIoRate, normalized IOPS.
    pub fn minimum_io_rate(&self) -> u64 {
        le64(self.b(), field::MINIMUM_IO_RATE)
    }
    /// BaseIoSize, bytes.
    pub fn base_io_size(&self) -> u32 {
        le32(self.b(), field::BASE_IO_SIZE)
    }
    /// The second Reserved field (after BaseIoSize).
    pub fn reserved2(&self) -> u32 {
        le32(self.b(), field::RESERVED2)
    }
    /// MaximumBandwidth, KB/s; `None` in dialect 1.0.
    pub fn maximum_bandwidth(&self) -> Option<u64> {
        match self.dialect() {
            Dialect::V1_0 => None,
            Dialect::V1_1 => Some(le64(self.b(), field::MAXIMUM_BANDWIDTH)),
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> StorageQosControlResponse<T> {
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
    pub fn set_options(&mut self, v: u32) {
        set_le32(self.bm(), field::OPTIONS, v)
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
    /// Sets TimeToLive.
    pub fn set_time_to_live(&mut self, v: u32) {
        set_le32(self.bm(), field::TIME_TO_LIVE, v)
    }
    /// Sets Status.
    pub fn set_status(&mut self, v: FlowStatus) {
        set_le32(self.bm(), field::STATUS, v.to_wire())
    }
    /// Sets MaximumIoRate.
    pub fn set_maximum_io_rate(&mut self, v: u64) {
        set_le64(self.bm(), field::MAXIMUM_IO_RATE, v)
    }
    /// Sets MinimumIoRate.
    pub fn set_minimum_io_rate(&mut self, v: u64) {
        set_le64(self.bm(), field::MINIMUM_IO_RATE, v)
    }
    /// Sets BaseIoSize.
    pub fn set_base_io_size(&mut self, v: u32) {
        set_le32(self.bm(), field::BASE_IO_SIZE, v)
    }
    /// Sets the second Reserved field.
    pub fn set_reserved2(&mut self, v: u32) {
        set_le32(self.bm(), field::RESERVED2, v)
    }
    /// Sets MaximumBandwidth (bytes 88..96, dialect 1.1 only).
    pub fn set_maximum_bandwidth(&mut self, v: u64) {
        set_le64(self.bm(), field::MAXIMUM_BANDWIDTH, v)
    }
}

/// The values of a STORAGE_QOS_CONTROL_RESPONSE ([MS-SQOS] 2.2.2.3).
/// Options and the Reserved fields are emitted as 0 and ignored on parse
/// (2.2.2.3: "the client MUST ignore it on receipt").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageQosControlResponseRepr {
    /// ProtocolVersion; a server answers in the request's dialect.
    pub dialect: Dialect,
    /// LogicalFlowID.
    pub logical_flow_id: Guid,
    /// PolicyID.
    pub policy_id: Guid,
    /// InitiatorID.
    pub initiator_id: Guid,
    /// TimeToLive, milliseconds.
    pub time_to_live: u32,
    /// Status.
    pub status: FlowStatus,
    /// MaximumIoRate, normalized IOPS.
    pub maximum_io_rate: u64,
    /// MinimumIoRate, normalized IOPS.
    pub minimum_io_rate: u64,
    /// BaseIoSize, bytes.
    pub base_io_size: u32,
    /// MaximumBandwidth, KB/s (dialect 1.1 only: parsed as 0 from, and not
    /// emitted in, a 1.0 response).
    pub maximum_bandwidth: u64,
}

impl StorageQosControlResponseRepr {
    /// Parses a response.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        view: &StorageQosControlResponse<&T>,
    ) -> Result<Self, WireError> {
        view.check_len()?;
        Ok(StorageQosControlResponseRepr {
            dialect: view.dialect(),
            logical_flow_id: view.logical_flow_id(),
            policy_id: view.policy_id(),
            initiator_id: view.initiator_id(),
            time_to_live: view.time_to_live(),
            status: view.status(),
            maximum_io_rate: view.maximum_io_rate(),
            minimum_io_rate: view.minimum_io_rate(),
            base_io_size: view.base_io_size(),
            maximum_bandwidth: view.maximum_bandwidth().unwrap_or(0),
        })
    }

    /// 88 bytes for dialect 1.0, 96 for 1.1.
    pub fn buffer_len(&self) -> usize {
        self.dialect.response_len()
    }

    /// Writes the response; the buffer must hold [`buffer_len`](Self::buffer_len)
    /// bytes (a shorter one gets a truncated response, never a panic).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, view: &mut StorageQosControlResponse<T>) {
        view.set_protocol_version(self.dialect.to_wire());
        view.set_reserved(0);
        view.set_options(0);
        view.set_logical_flow_id(self.logical_flow_id);
        view.set_policy_id(self.policy_id);
        view.set_initiator_id(self.initiator_id);
        view.set_time_to_live(self.time_to_live);
        view.set_status(self.status);
        view.set_maximum_io_rate(self.maximum_io_rate);
        view.set_minimum_io_rate(self.minimum_io_rate);
        view.set_base_io_size(self.base_io_size);
        view.set_reserved2(0);
        if self.dialect == Dialect::V1_1 {
            view.set_maximum_bandwidth(self.maximum_bandwidth);
        }
    }

    /// The response as a new byte vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.buffer_len()];
        self.emit(&mut StorageQosControlResponse::new_unchecked(&mut v[..]));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(dialect: Dialect) -> StorageQosControlResponseRepr {
        StorageQosControlResponseRepr {
            dialect,
            logical_flow_id: Guid::from_fields(1, 2, 3, [4; 8]),
            policy_id: Guid::from_fields(5, 6, 7, [8; 8]),
            initiator_id: Guid::from_fields(9, 10, 11, [12; 8]),
            time_to_live: 3981,
            status: FlowStatus::InsufficientThroughput,
            maximum_io_rate: 100,
            minimum_io_rate: 10,
            base_io_size: 8192,
            maximum_bandwidth: if dialect == Dialect::V1_1 { 200 } else { 0 },
        }
    }

    #[test]
    fn response_is_88_bytes_in_1_0_and_96_in_1_1_and_round_trips() {
        for (d, len) in [(Dialect::V1_0, 88), (Dialect::V1_1, 96)] {
            let repr = sample(d);
            let bytes = repr.to_vec();
            assert_eq!(bytes.len(), len);
            let view = StorageQosControlResponse::new_checked(&bytes[..]).unwrap();
            assert_eq!(StorageQosControlResponseRepr::parse(&view).unwrap(), repr);
        }
    }

    #[test]
    fn response_maximum_bandwidth_follows_base_io_size_and_reserved() {
        let bytes = sample(Dialect::V1_1).to_vec();
        assert_eq!(&bytes[80..84], &8192u32.to_le_bytes());
        assert_eq!(&bytes[84..88], &[0; 4]);
        assert_eq!(&bytes[88..96], &200u64.to_le_bytes());
    }

    #[test]
    fn truncated_response_is_rejected() {
        let bytes = sample(Dialect::V1_1).to_vec();
        assert!(matches!(
            StorageQosControlResponse::new_checked(&bytes[..95]),
            Err(WireError::Truncated {
                need: 96,
                have: 95,
                ..
            })
        ));
        let mut v10 = sample(Dialect::V1_0).to_vec();
        assert!(StorageQosControlResponse::new_checked(&v10[..]).is_ok());
        v10[0] = 0x07;
        assert!(matches!(
            StorageQosControlResponse::new_checked(&v10[..]),
            Err(WireError::Malformed {
                field: "ProtocolVersion",
                ..
            })
        ));
    }
}
