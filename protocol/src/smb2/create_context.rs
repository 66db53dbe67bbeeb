//! [MS-SMB2] 2.2.13.2 SMB2_CREATE_CONTEXT Request Values (and the response
//! values of 2.2.14.2, which share the layout): a chain of contexts linked
//! by Next, each with a Name and Data located from the context's start.
//!
//! Receive rules (every failure is STATUS_INVALID_PARAMETER): a context has
//! its 16-byte header; Next is 0 (last) or a multiple of 8 that stays inside
//! the list; Name is non-empty and lies after the header and inside the
//! context (up to Next, or the end of the list for the last one); Data,
//! when non-empty, lies there too, 8-byte aligned, not overlapping Name.
//! Contents are opaque: a server interprets the names it knows.

use super::error::Smb2Error;
use super::layout::{align8, check_disjoint, fit, resolve_in, Region};
use super::Scalar;

/// Byte ranges of [MS-SMB2] 2.2.13.2 (relative to the context).
mod field {
    use crate::smb2::Field;
    pub const NEXT: Field = 0..4;
    pub const NAME_OFFSET: Field = 4..6;
    pub const NAME_LENGTH: Field = 6..8;
    pub const RESERVED: Field = 8..10;
    pub const DATA_OFFSET: Field = 10..12;
    pub const DATA_LENGTH: Field = 12..16;
    /// Length of the header; Buffer starts here.
    pub const HEADER_LEN: usize = 16;
}

const WHAT: &str = "SMB2_CREATE_CONTEXT";

/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_EA_BUFFER.
pub const SMB2_CREATE_EA_BUFFER: &[u8; 4] = b"ExtA";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_SD_BUFFER.
pub const SMB2_CREATE_SD_BUFFER: &[u8; 4] = b"SecD";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_DURABLE_HANDLE_REQUEST.
pub const SMB2_CREATE_DURABLE_HANDLE_REQUEST: &[u8; 4] = b"DHnQ";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_DURABLE_HANDLE_RECONNECT.
pub const SMB2_CREATE_DURABLE_HANDLE_RECONNECT: &[u8; 4] = b"DHnC";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_ALLOCATION_SIZE.
pub const SMB2_CREATE_ALLOCATION_SIZE: &[u8; 4] = b"AlSi";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_QUERY_MAXIMAL_ACCESS_REQUEST.
pub const SMB2_CREATE_QUERY_MAXIMAL_ACCESS_REQUEST: &[u8; 4] = b"MxAc";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_TIMEWARP_TOKEN.
pub const SMB2_CREATE_TIMEWARP_TOKEN: &[u8; 4] = b"TWrp";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_QUERY_ON_DISK_ID.
pub const SMB2_CREATE_QUERY_ON_DISK_ID: &[u8; 4] = b"QFid";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_REQUEST_LEASE (and _V2).
pub const SMB2_CREATE_REQUEST_LEASE: &[u8; 4] = b"RqLs";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_DURABLE_HANDLE_REQUEST_V2.
pub const SMB2_CREATE_DURABLE_HANDLE_REQUEST_V2: &[u8; 4] = b"DH2Q";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_DURABLE_HANDLE_RECONNECT_V2.
pub const SMB2_CREATE_DURABLE_HANDLE_RECONNECT_V2: &[u8; 4] = b"DH2C";

/// One create context: its Name and Data, both opaque.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateContext<'a> {
    /// Name (usually 4 ASCII bytes, sometimes a 16-byte GUID).
    pub name: &'a [u8],
    /// Data.
    pub data: &'a [u8],
}

impl<'a> CreateContext<'a> {
    /// A context to emit.
    pub const fn new(name: &'a [u8], data: &'a [u8]) -> Self {
        CreateContext { name, data }
    }

    fn data_offset(&self) -> usize {
        if self.data.is_empty() {
            0
        } else {
            align8(field::HEADER_LEN + self.name.len())
        }
    }

    /// Bytes of this context on the wire, without trailing padding.
    pub fn buffer_len(&self) -> usize {
        if self.data.is_empty() {
            field::HEADER_LEN + self.name.len()
        } else {
            self.data_offset() + self.data.len()
        }
    }

    fn check_emit(&self) -> Result<(), Smb2Error> {
        if self.name.is_empty() {
            return Err(Smb2Error::Malformed {
                what: WHAT,
                field: "NameLength (0)",
            });
        }
        fit::<u16>(WHAT, "NameLength", self.name.len())?;
        fit::<u16>(WHAT, "DataOffset", self.data_offset())?;
        fit::<u32>(WHAT, "DataLength", self.data.len())?;
        fit::<u32>(WHAT, "Next", align8(self.buffer_len()))?;
        Ok(())
    }

    /// Writes the context with the given Next into `dst` (exactly
    /// [`buffer_len`](Self::buffer_len) bytes, zeroed).
    fn write(&self, dst: &mut [u8], next: u32) {
        next.write(dst, field::NEXT);
        (field::HEADER_LEN as u16).write(dst, field::NAME_OFFSET);
        (self.name.len() as u16).write(dst, field::NAME_LENGTH);
        0u16.write(dst, field::RESERVED);
        (self.data_offset() as u16).write(dst, field::DATA_OFFSET);
        (self.data.len() as u32).write(dst, field::DATA_LENGTH);
        let n = field::HEADER_LEN;
        dst[n..n + self.name.len()].copy_from_slice(self.name);
        let d = self.data_offset();
        dst[d..d + self.data.len()].copy_from_slice(self.data);
    }
}

/// Walks a create context chain (the bytes CreateContextsOffset and
/// CreateContextsLength name). The first malformed context is yielded as
/// `Err` and ends the walk.
#[derive(Debug, Clone)]
pub struct CreateContextIter<'a> {
    list: &'a [u8],
    pos: usize,
    done: bool,
}

impl<'a> CreateContextIter<'a> {
    /// Walks `list`.
    pub fn new(list: &'a [u8]) -> Self {
        CreateContextIter {
            list,
            pos: 0,
            done: list.is_empty(),
        }
    }

    fn step(&mut self) -> Result<CreateContext<'a>, Smb2Error> {
        let ctx = self.list.get(self.pos..).unwrap_or(&[]);
        if ctx.len() < field::HEADER_LEN {
            return Err(Smb2Error::Truncated {
                what: WHAT,
                need: field::HEADER_LEN,
                have: ctx.len(),
            });
        }
        let next = u32::read(ctx, field::NEXT);
        let extent = if next == 0 {
            ctx.len()
        } else {
            if next % 8 != 0 {
                return Err(Smb2Error::Misaligned {
                    what: WHAT,
                    field: "Next",
                    offset: u64::from(next),
                });
            }
            let n = next as usize;
            if n < field::HEADER_LEN || n > ctx.len() {
                return Err(Smb2Error::OutOfBounds {
                    what: WHAT,
                    field: "Next",
                    offset: u64::from(next),
                    length: 0,
                    min: field::HEADER_LEN as u64,
                    limit: ctx.len() as u64,
                });
            }
            n
        };
        let name_region = Region::new(
            "NameOffset",
            u64::from(u16::read(ctx, field::NAME_OFFSET)),
            u64::from(u16::read(ctx, field::NAME_LENGTH)),
        );
        let data_offset = u16::read(ctx, field::DATA_OFFSET);
        let data_region = Region::new(
            "DataOffset",
            u64::from(data_offset),
            u64::from(u32::read(ctx, field::DATA_LENGTH)),
        );
        let name = resolve_in(WHAT, 0, extent, field::HEADER_LEN, name_region)?.ok_or(
            Smb2Error::Malformed {
                what: WHAT,
                field: "NameLength (0)",
            },
        )?;
        let data = resolve_in(WHAT, 0, extent, field::HEADER_LEN, data_region)?;
        if data.is_some() && data_offset % 8 != 0 {
            return Err(Smb2Error::Misaligned {
                what: WHAT,
                field: "DataOffset",
                offset: u64::from(data_offset),
            });
        }
        let name_r = Some(name.clone());
        check_disjoint(WHAT, ("NameOffset", &name_r), ("DataOffset", &data))?;
        if next == 0 {
            self.done = true;
        } else {
            self.pos += extent;
        }
        Ok(CreateContext {
            name: ctx.get(name).unwrap_or(&[]),
            data: data.and_then(|r| ctx.get(r)).unwrap_or(&[]),
        })
    }
}

impl<'a> Iterator for CreateContextIter<'a> {
    type Item = Result<CreateContext<'a>, Smb2Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let r = self.step();
        if r.is_err() {
            self.done = true;
        }
        Some(r)
    }
}

/// Checks a whole chain.
pub(crate) fn check_chain(list: &[u8]) -> Result<(), Smb2Error> {
    for c in CreateContextIter::new(list) {
        c?;
    }
    Ok(())
}

/// The create contexts of a CREATE request or response: the wire chain of
/// a parsed message (zero-copy, already checked) or a slice to emit. Two
/// lists are equal when their contexts are.
#[derive(Clone, Copy)]
pub struct CreateContextList<'a>(Inner<'a>);

#[derive(Clone, Copy)]
enum Inner<'a> {
    Wire(&'a [u8]),
    Slice(&'a [CreateContext<'a>]),
}

impl<'a> CreateContextList<'a> {
    /// No contexts.
    pub const EMPTY: CreateContextList<'static> = CreateContextList(Inner::Slice(&[]));

    /// Contexts to emit.
    pub const fn new(contexts: &'a [CreateContext<'a>]) -> Self {
        CreateContextList(Inner::Slice(contexts))
    }

    pub(crate) fn from_wire(list: &'a [u8]) -> Self {
        CreateContextList(Inner::Wire(list))
    }

    /// The contexts in order.
    pub fn iter(&self) -> impl Iterator<Item = CreateContext<'a>> + 'a {
        let (wire, slice): (&'a [u8], &'a [CreateContext<'a>]) = match self.0 {
            Inner::Wire(b) => (b, &[]),
            Inner::Slice(s) => (&[], s),
        };
        CreateContextIter::new(wire)
            .filter_map(Result::ok)
            .chain(slice.iter().copied())
    }

    /// Number of contexts.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// True when there is none.
    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }

    /// The first context named `name`.
    pub fn find(&self, name: &[u8]) -> Option<CreateContext<'a>> {
        self.iter().find(|c| c.name == name)
    }

    /// Bytes of the chain (each context padded to 8 except the last).
    pub fn byte_len(&self) -> usize {
        let mut end = 0;
        for c in self.iter() {
            end = align8(end) + c.buffer_len();
        }
        end
    }

    /// Checks every context can be emitted.
    pub(crate) fn check_emit(&self) -> Result<(), Smb2Error> {
        for c in self.iter() {
            c.check_emit()?;
        }
        Ok(())
    }

    /// Writes the chain into `dst` (at least [`byte_len`](Self::byte_len)
    /// bytes, zeroed, 8-byte aligned).
    pub(crate) fn write_to(&self, dst: &mut [u8]) {
        let mut it = self.iter().peekable();
        let mut pos = 0;
        while let Some(c) = it.next() {
            let len = c.buffer_len();
            let next = if it.peek().is_some() { align8(len) } else { 0 };
            if let Some(d) = dst.get_mut(pos..pos + len) {
                c.write(d, next as u32);
            }
            pos += align8(len);
        }
    }
}

impl PartialEq for CreateContextList<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for CreateContextList<'_> {}

impl core::fmt::Debug for CreateContextList<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Default for CreateContextList<'_> {
    fn default() -> Self {
        CreateContextList::EMPTY
    }
}

// ---------------------------------------------------------------------------
// The contexts Linux cifs sends and the ones a server answers
// ---------------------------------------------------------------------------

/// [MS-SMB2] 2.2.14.2 SMB2_CREATE_QUERY_MAXIMAL_ACCESS_RESPONSE ("MxAc",
/// the request's name).
pub const SMB2_CREATE_QUERY_MAXIMAL_ACCESS_RESPONSE: &[u8; 4] = b"MxAc";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_APP_INSTANCE_ID (a GUID-named context,
/// wire bytes).
pub const SMB2_CREATE_APP_INSTANCE_ID: &[u8; 16] = &[
    0x45, 0xBC, 0xA6, 0x6A, 0xEF, 0xA7, 0xF7, 0x4A, 0x90, 0x08, 0xFA, 0x46, 0x2E, 0x14, 0x4D, 0x74,
];
/// The SMB3 POSIX extensions create context (not in [MS-SMB2]; Linux cifs
/// sends it on mounts with `posix`): a 16-byte GUID-named context,
/// 93AD2550-9CB4-11E7-B423-83DE968BCD7C as wire bytes. A server without
/// POSIX extensions ignores it (no response context).
pub const SMB2_CREATE_POSIX_CONTEXT: &[u8; 16] = &[
    0x93, 0xAD, 0x25, 0x50, 0x9C, 0xB4, 0x11, 0xE7, 0xB4, 0x23, 0x83, 0xDE, 0x96, 0x8B, 0xCD, 0x7C,
];

bitmask! {
    /// [MS-SMB2] 2.2.13.2.8 LeaseState.
    pub struct LeaseState(u32) {
        /// SMB2_LEASE_READ_CACHING.
        READ_CACHING = 0x0000_0001;
        /// SMB2_LEASE_HANDLE_CACHING.
        HANDLE_CACHING = 0x0000_0002;
        /// SMB2_LEASE_WRITE_CACHING.
        WRITE_CACHING = 0x0000_0004;
    }
}

bitmask! {
    /// [MS-SMB2] 2.2.13.2.8 / 2.2.13.2.10 lease Flags.
    pub struct LeaseFlags(u32) {
        /// SMB2_LEASE_FLAG_BREAK_IN_PROGRESS (responses).
        BREAK_IN_PROGRESS = 0x0000_0002;
        /// SMB2_LEASE_FLAG_PARENT_LEASE_KEY_SET (v2).
        PARENT_LEASE_KEY_SET = 0x0000_0004;
    }
}

/// Fails with `Truncated` unless a context's Data holds `need` bytes.
fn data_need(what: &'static str, data: &[u8], need: usize) -> Result<(), Smb2Error> {
    if data.len() < need {
        Err(Smb2Error::Truncated {
            what,
            need,
            have: data.len(),
        })
    } else {
        Ok(())
    }
}

/// [MS-SMB2] 2.2.13.2.5 SMB2_CREATE_QUERY_MAXIMAL_ACCESS_REQUEST: Data is
/// empty or an 8-byte Timestamp (FILETIME).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MaximalAccessRequest {
    /// Timestamp: when set, the open's maximal access as of that time.
    pub timestamp: Option<u64>,
}

impl MaximalAccessRequest {
    /// Decodes the Data (0 bytes, or at least 8).
    pub fn parse(data: &[u8]) -> Result<Self, Smb2Error> {
        if data.is_empty() {
            return Ok(MaximalAccessRequest { timestamp: None });
        }
        data_need("SMB2_CREATE_QUERY_MAXIMAL_ACCESS_REQUEST", data, 8)?;
        Ok(MaximalAccessRequest {
            timestamp: Some(u64::read(data, 0..8)),
        })
    }
}

/// [MS-SMB2] 2.2.14.2.5 SMB2_CREATE_QUERY_MAXIMAL_ACCESS_RESPONSE:
/// QueryStatus (4), MaximalAccess (4). A server answers an MxAc request
/// with `CreateContext::new(SMB2_CREATE_QUERY_MAXIMAL_ACCESS_RESPONSE,
/// &resp.to_bytes())`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaximalAccessResponse {
    /// QueryStatus (STATUS_SUCCESS, or why MaximalAccess is not valid).
    pub query_status: crate::ntstatus::NtStatus,
    /// MaximalAccess: the access the user could be granted on this file.
    pub maximal_access: super::create::AccessMask,
}

impl MaximalAccessResponse {
    /// Length of the Data.
    pub const LEN: usize = 8;

    /// Decodes the Data.
    pub fn parse(data: &[u8]) -> Result<Self, Smb2Error> {
        data_need("SMB2_CREATE_QUERY_MAXIMAL_ACCESS_RESPONSE", data, Self::LEN)?;
        Ok(MaximalAccessResponse {
            query_status: crate::ntstatus::NtStatus::read(data, 0..4),
            maximal_access: super::create::AccessMask::read(data, 4..8),
        })
    }

    /// The Data bytes.
    pub fn to_bytes(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        self.query_status.write(&mut b, 0..4);
        self.maximal_access.write(&mut b, 4..8);
        b
    }
}

/// [MS-SMB2] 2.2.14.2.9 SMB2_CREATE_QUERY_ON_DISK_ID response: DiskFileId
/// (8), VolumeId (8), Reserved (16). The request ("QFid") has no Data. A
/// server answers with `CreateContext::new(SMB2_CREATE_QUERY_ON_DISK_ID,
/// &resp.to_bytes())`; Linux cifs takes DiskFileId as the inode number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueryOnDiskIdResponse {
    /// DiskFileId: the file's identifier on its volume
    /// (FileInternalInformation's IndexNumber).
    pub disk_file_id: u64,
    /// VolumeId.
    pub volume_id: u64,
}

impl QueryOnDiskIdResponse {
    /// Length of the Data.
    pub const LEN: usize = 32;

    /// Decodes the Data (DiskFileId and VolumeId must be present; the
    /// Reserved bytes may be absent).
    pub fn parse(data: &[u8]) -> Result<Self, Smb2Error> {
        data_need("SMB2_CREATE_QUERY_ON_DISK_ID response", data, 16)?;
        Ok(QueryOnDiskIdResponse {
            disk_file_id: u64::read(data, 0..8),
            volume_id: u64::read(data, 8..16),
        })
    }

    /// The Data bytes (Reserved zero).
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        self.disk_file_id.write(&mut b, 0..8);
        self.volume_id.write(&mut b, 8..16);
        b
    }
}

/// [MS-SMB2] 2.2.13.2.8 SMB2_CREATE_REQUEST_LEASE (32 bytes: LeaseKey (16),
/// LeaseState (4), LeaseFlags (4), LeaseDuration (8)) and 2.2.13.2.10
/// SMB2_CREATE_REQUEST_LEASE_V2 (52 bytes: the same, then ParentLeaseKey
/// (16), Epoch (2), Reserved (2)). Both are named "RqLs"; the length tells
/// them apart. A server that grants no leases answers without a lease
/// context and with the oplock level it grants (3.3.5.9.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseRequest {
    /// LeaseKey.
    pub lease_key: [u8; 16],
    /// LeaseState requested.
    pub lease_state: LeaseState,
    /// LeaseFlags (v1: 0) / Flags (v2).
    pub lease_flags: LeaseFlags,
    /// LeaseDuration (reserved: 0).
    pub lease_duration: u64,
    /// The v2 fields: ParentLeaseKey and Epoch.
    pub v2: Option<LeaseRequestV2>,
}

/// The fields SMB2_CREATE_REQUEST_LEASE_V2 adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseRequestV2 {
    /// ParentLeaseKey (with SMB2_LEASE_FLAG_PARENT_LEASE_KEY_SET).
    pub parent_lease_key: [u8; 16],
    /// Epoch.
    pub epoch: u16,
}

impl LeaseRequest {
    /// Length of the v1 Data.
    pub const V1_LEN: usize = 32;
    /// Length of the v2 Data.
    pub const V2_LEN: usize = 52;

    /// Decodes the Data: 52 bytes or more is v2, 32 to 51 v1.
    pub fn parse(data: &[u8]) -> Result<Self, Smb2Error> {
        data_need("SMB2_CREATE_REQUEST_LEASE", data, Self::V1_LEN)?;
        Ok(LeaseRequest {
            lease_key: <[u8; 16]>::read(data, 0..16),
            lease_state: LeaseState::read(data, 16..20),
            lease_flags: LeaseFlags::read(data, 20..24),
            lease_duration: u64::read(data, 24..32),
            v2: (data.len() >= Self::V2_LEN).then(|| LeaseRequestV2 {
                parent_lease_key: <[u8; 16]>::read(data, 32..48),
                epoch: u16::read(data, 48..50),
            }),
        })
    }

    /// Length of the Data `to_bytes` writes.
    pub fn data_len(&self) -> usize {
        if self.v2.is_some() {
            Self::V2_LEN
        } else {
            Self::V1_LEN
        }
    }

    /// The Data bytes (v1: the first 32 of the array).
    pub fn to_bytes(&self) -> [u8; 52] {
        let mut b = [0u8; 52];
        self.lease_key.write(&mut b, 0..16);
        self.lease_state.write(&mut b, 16..20);
        self.lease_flags.write(&mut b, 20..24);
        self.lease_duration.write(&mut b, 24..32);
        if let Some(v2) = self.v2 {
            v2.parent_lease_key.write(&mut b, 32..48);
            v2.epoch.write(&mut b, 48..50);
        }
        b
    }
}

/// [MS-SMB2] 2.2.13.2.11 SMB2_CREATE_DURABLE_HANDLE_REQUEST_V2: Timeout
/// (4), Flags (4), Reserved (8), CreateGuid (16). A server without durable
/// handles ignores it (no response context, 3.3.5.9.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DurableHandleRequestV2 {
    /// Timeout, in milliseconds.
    pub timeout: u32,
    /// Flags (SMB2_DHANDLE_FLAG_PERSISTENT = 0x2).
    pub flags: u32,
    /// CreateGuid.
    pub create_guid: crate::sqos::Guid,
}

impl DurableHandleRequestV2 {
    /// Length of the Data.
    pub const LEN: usize = 32;

    /// Decodes the Data.
    pub fn parse(data: &[u8]) -> Result<Self, Smb2Error> {
        data_need("SMB2_CREATE_DURABLE_HANDLE_REQUEST_V2", data, Self::LEN)?;
        Ok(DurableHandleRequestV2 {
            timeout: u32::read(data, 0..4),
            flags: u32::read(data, 4..8),
            create_guid: crate::sqos::Guid::read(data, 16..32),
        })
    }
}

/// A request create context, recognised by name ([MS-SMB2] 2.2.13.2).
/// Contexts this crate does not decode are [`CreateContextRequest::Other`]
/// (a server ignores names it does not know, 3.3.5.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateContextRequest<'a> {
    /// "MxAc": answer with a maximal access response.
    MaximalAccess(MaximalAccessRequest),
    /// "QFid" (no Data): answer with an on-disk id response.
    QueryOnDiskId,
    /// "RqLs", v1 or v2.
    Lease(LeaseRequest),
    /// "DHnQ" (16 reserved bytes).
    DurableHandle,
    /// "DH2Q".
    DurableHandleV2(DurableHandleRequestV2),
    /// "AlSi": AllocationSize (8).
    AllocationSize(u64),
    /// "TWrp": Timestamp (8) of a previous version.
    TimewarpToken(u64),
    /// The SMB3 POSIX context: Mode (4, the POSIX permission bits).
    Posix {
        /// Mode.
        mode: u32,
    },
    /// Any other context ("ExtA", "SecD", "DHnC", "DH2C", app instance
    /// ids, ...), as received.
    Other(CreateContext<'a>),
}

impl<'a> CreateContextRequest<'a> {
    /// Recognises `c` by name and decodes its Data; a known name with Data
    /// too short is `Truncated` (STATUS_INVALID_PARAMETER).
    pub fn parse(c: &CreateContext<'a>) -> Result<Self, Smb2Error> {
        let d = c.data;
        Ok(match c.name {
            n if n == SMB2_CREATE_QUERY_MAXIMAL_ACCESS_REQUEST => {
                CreateContextRequest::MaximalAccess(MaximalAccessRequest::parse(d)?)
            }
            n if n == SMB2_CREATE_QUERY_ON_DISK_ID => CreateContextRequest::QueryOnDiskId,
            n if n == SMB2_CREATE_REQUEST_LEASE => {
                CreateContextRequest::Lease(LeaseRequest::parse(d)?)
            }
            n if n == SMB2_CREATE_DURABLE_HANDLE_REQUEST => {
                data_need("SMB2_CREATE_DURABLE_HANDLE_REQUEST", d, 16)?;
                CreateContextRequest::DurableHandle
            }
            n if n == SMB2_CREATE_DURABLE_HANDLE_REQUEST_V2 => {
                CreateContextRequest::DurableHandleV2(DurableHandleRequestV2::parse(d)?)
            }
            n if n == SMB2_CREATE_ALLOCATION_SIZE => {
                data_need("SMB2_CREATE_ALLOCATION_SIZE", d, 8)?;
                CreateContextRequest::AllocationSize(u64::read(d, 0..8))
            }
            n if n == SMB2_CREATE_TIMEWARP_TOKEN => {
                data_need("SMB2_CREATE_TIMEWARP_TOKEN", d, 8)?;
                CreateContextRequest::TimewarpToken(u64::read(d, 0..8))
            }
            n if n == SMB2_CREATE_POSIX_CONTEXT => {
                data_need("SMB2 POSIX create context", d, 4)?;
                CreateContextRequest::Posix {
                    mode: u32::read(d, 0..4),
                }
            }
            _ => CreateContextRequest::Other(*c),
        })
    }
}

impl<'a> CreateContextList<'a> {
    /// The contexts, recognised ([`CreateContextRequest::parse`]); the
    /// first known context with malformed Data is yielded as `Err`.
    pub fn requests(
        &self,
    ) -> impl Iterator<Item = Result<CreateContextRequest<'a>, Smb2Error>> + 'a {
        self.iter().map(|c| CreateContextRequest::parse(&c))
    }
}
