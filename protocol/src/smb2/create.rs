//! [MS-SMB2] 2.2.13 SMB2 CREATE Request and 2.2.14 SMB2 CREATE Response,
//! with the access mask ([MS-SMB2] 2.2.13.1, [MS-DTYP] 2.4.3) and file
//! attribute ([MS-FSCC] 2.6) values they carry.

use super::create_context::{check_chain, CreateContextList};
use super::error::Smb2Error;
use super::file_id::FileId;
use super::layout::{align8, fit, hdr, resolve_all, room, slice, Region};
use super::utf16::Utf16Str;
use super::Command;

wire_enum! {
    /// [MS-SMB2] 2.2.13 RequestedOplockLevel / 2.2.14 OplockLevel.
    pub struct OplockLevel(u8) {
        /// SMB2_OPLOCK_LEVEL_NONE.
        NONE = 0x00;
        /// SMB2_OPLOCK_LEVEL_II.
        II = 0x01;
        /// SMB2_OPLOCK_LEVEL_EXCLUSIVE.
        EXCLUSIVE = 0x08;
        /// SMB2_OPLOCK_LEVEL_BATCH.
        BATCH = 0x09;
        /// SMB2_OPLOCK_LEVEL_LEASE.
        LEASE = 0xFF;
    }
}

wire_enum! {
    /// [MS-SMB2] 2.2.13 ImpersonationLevel.
    pub struct ImpersonationLevel(u32) {
        /// Anonymous.
        ANONYMOUS = 0x0000_0000;
        /// Identification.
        IDENTIFICATION = 0x0000_0001;
        /// Impersonation.
        IMPERSONATION = 0x0000_0002;
        /// Delegate.
        DELEGATE = 0x0000_0003;
    }
}

bitmask! {
    /// [MS-SMB2] 2.2.13.1 access mask (file/pipe/printer form; the
    /// directory form 2.2.13.1.2 reuses the low bits as FILE_LIST_DIRECTORY,
    /// FILE_ADD_FILE, FILE_ADD_SUBDIRECTORY and FILE_TRAVERSE).
    pub struct AccessMask(u32) {
        /// FILE_READ_DATA (FILE_LIST_DIRECTORY).
        FILE_READ_DATA = 0x0000_0001;
        /// FILE_WRITE_DATA (FILE_ADD_FILE).
        FILE_WRITE_DATA = 0x0000_0002;
        /// FILE_APPEND_DATA (FILE_ADD_SUBDIRECTORY).
        FILE_APPEND_DATA = 0x0000_0004;
        /// FILE_READ_EA.
        FILE_READ_EA = 0x0000_0008;
        /// FILE_WRITE_EA.
        FILE_WRITE_EA = 0x0000_0010;
        /// FILE_EXECUTE (FILE_TRAVERSE).
        FILE_EXECUTE = 0x0000_0020;
        /// FILE_DELETE_CHILD.
        FILE_DELETE_CHILD = 0x0000_0040;
        /// FILE_READ_ATTRIBUTES.
        FILE_READ_ATTRIBUTES = 0x0000_0080;
        /// FILE_WRITE_ATTRIBUTES.
        FILE_WRITE_ATTRIBUTES = 0x0000_0100;
        /// DELETE.
        DELETE = 0x0001_0000;
        /// READ_CONTROL.
        READ_CONTROL = 0x0002_0000;
        /// WRITE_DAC.
        WRITE_DAC = 0x0004_0000;
        /// WRITE_OWNER.
        WRITE_OWNER = 0x0008_0000;
        /// SYNCHRONIZE.
        SYNCHRONIZE = 0x0010_0000;
        /// ACCESS_SYSTEM_SECURITY.
        ACCESS_SYSTEM_SECURITY = 0x0100_0000;
        /// MAXIMUM_ALLOWED.
        MAXIMUM_ALLOWED = 0x0200_0000;
        /// GENERIC_ALL.
        GENERIC_ALL = 0x1000_0000;
        /// GENERIC_EXECUTE.
        GENERIC_EXECUTE = 0x2000_0000;
        /// GENERIC_WRITE.
        GENERIC_WRITE = 0x4000_0000;
        /// GENERIC_READ.
        GENERIC_READ = 0x8000_0000;
    }
}

bitmask! {
    /// [MS-FSCC] 2.6 file attributes (FILE_ATTRIBUTE_*).
    pub struct FileAttributes(u32) {
        /// FILE_ATTRIBUTE_READONLY.
        READONLY = 0x0000_0001;
        /// FILE_ATTRIBUTE_HIDDEN.
        HIDDEN = 0x0000_0002;
        /// FILE_ATTRIBUTE_SYSTEM.
        SYSTEM = 0x0000_0004;
        /// FILE_ATTRIBUTE_DIRECTORY.
        DIRECTORY = 0x0000_0010;
        /// FILE_ATTRIBUTE_ARCHIVE.
        ARCHIVE = 0x0000_0020;
        /// FILE_ATTRIBUTE_NORMAL.
        NORMAL = 0x0000_0080;
        /// FILE_ATTRIBUTE_TEMPORARY.
        TEMPORARY = 0x0000_0100;
        /// FILE_ATTRIBUTE_SPARSE_FILE.
        SPARSE_FILE = 0x0000_0200;
        /// FILE_ATTRIBUTE_REPARSE_POINT.
        REPARSE_POINT = 0x0000_0400;
        /// FILE_ATTRIBUTE_COMPRESSED.
        COMPRESSED = 0x0000_0800;
        /// FILE_ATTRIBUTE_OFFLINE.
        OFFLINE = 0x0000_1000;
        /// FILE_ATTRIBUTE_NOT_CONTENT_INDEXED.
        NOT_CONTENT_INDEXED = 0x0000_2000;
        /// FILE_ATTRIBUTE_ENCRYPTED.
        ENCRYPTED = 0x0000_4000;
        /// FILE_ATTRIBUTE_INTEGRITY_STREAM.
        INTEGRITY_STREAM = 0x0000_8000;
        /// FILE_ATTRIBUTE_NO_SCRUB_DATA.
        NO_SCRUB_DATA = 0x0002_0000;
    }
}

bitmask! {
    /// [MS-SMB2] 2.2.13 ShareAccess.
    pub struct ShareAccess(u32) {
        /// FILE_SHARE_READ.
        READ = 0x0000_0001;
        /// FILE_SHARE_WRITE.
        WRITE = 0x0000_0002;
        /// FILE_SHARE_DELETE.
        DELETE = 0x0000_0004;
    }
}

wire_enum! {
    /// [MS-SMB2] 2.2.13 CreateDisposition. A value outside 0..=5 is for the
    /// server to refuse (3.3.5.9: STATUS_INVALID_PARAMETER).
    pub struct CreateDisposition(u32) {
        /// FILE_SUPERSEDE.
        SUPERSEDE = 0x0000_0000;
        /// FILE_OPEN.
        OPEN = 0x0000_0001;
        /// FILE_CREATE.
        CREATE = 0x0000_0002;
        /// FILE_OPEN_IF.
        OPEN_IF = 0x0000_0003;
        /// FILE_OVERWRITE.
        OVERWRITE = 0x0000_0004;
        /// FILE_OVERWRITE_IF.
        OVERWRITE_IF = 0x0000_0005;
    }
}

bitmask! {
    /// [MS-SMB2] 2.2.13 CreateOptions.
    pub struct CreateOptions(u32) {
        /// FILE_DIRECTORY_FILE.
        DIRECTORY_FILE = 0x0000_0001;
        /// FILE_WRITE_THROUGH.
        WRITE_THROUGH = 0x0000_0002;
        /// FILE_SEQUENTIAL_ONLY.
        SEQUENTIAL_ONLY = 0x0000_0004;
        /// FILE_NO_INTERMEDIATE_BUFFERING.
        NO_INTERMEDIATE_BUFFERING = 0x0000_0008;
        /// FILE_SYNCHRONOUS_IO_ALERT.
        SYNCHRONOUS_IO_ALERT = 0x0000_0010;
        /// FILE_SYNCHRONOUS_IO_NONALERT.
        SYNCHRONOUS_IO_NONALERT = 0x0000_0020;
        /// FILE_NON_DIRECTORY_FILE.
        NON_DIRECTORY_FILE = 0x0000_0040;
        /// FILE_COMPLETE_IF_OPLOCKED.
        COMPLETE_IF_OPLOCKED = 0x0000_0100;
        /// FILE_NO_EA_KNOWLEDGE.
        NO_EA_KNOWLEDGE = 0x0000_0200;
        /// FILE_OPEN_REMOTE_INSTANCE.
        OPEN_REMOTE_INSTANCE = 0x0000_0400;
        /// FILE_RANDOM_ACCESS.
        RANDOM_ACCESS = 0x0000_0800;
        /// FILE_DELETE_ON_CLOSE.
        DELETE_ON_CLOSE = 0x0000_1000;
        /// FILE_OPEN_BY_FILE_ID.
        OPEN_BY_FILE_ID = 0x0000_2000;
        /// FILE_OPEN_FOR_BACKUP_INTENT.
        OPEN_FOR_BACKUP_INTENT = 0x0000_4000;
        /// FILE_NO_COMPRESSION.
        NO_COMPRESSION = 0x0000_8000;
        /// FILE_OPEN_REQUIRING_OPLOCK.
        OPEN_REQUIRING_OPLOCK = 0x0001_0000;
        /// FILE_DISALLOW_EXCLUSIVE.
        DISALLOW_EXCLUSIVE = 0x0002_0000;
        /// FILE_RESERVE_OPFILTER.
        RESERVE_OPFILTER = 0x0010_0000;
        /// FILE_OPEN_REPARSE_POINT.
        OPEN_REPARSE_POINT = 0x0020_0000;
        /// FILE_OPEN_NO_RECALL.
        OPEN_NO_RECALL = 0x0040_0000;
        /// FILE_OPEN_FOR_FREE_SPACE_QUERY.
        OPEN_FOR_FREE_SPACE_QUERY = 0x0080_0000;
    }
}

wire_enum! {
    /// [MS-SMB2] 2.2.14 CreateAction.
    pub struct CreateAction(u32) {
        /// FILE_SUPERSEDED.
        SUPERSEDED = 0x0000_0000;
        /// FILE_OPENED.
        OPENED = 0x0000_0001;
        /// FILE_CREATED.
        CREATED = 0x0000_0002;
        /// FILE_OVERWRITTEN.
        OVERWRITTEN = 0x0000_0003;
    }
}

bitmask! {
    /// [MS-SMB2] 2.2.14 Flags (SMB 3.x).
    pub struct CreateResponseFlags(u8) {
        /// SMB2_CREATE_FLAG_REPARSEPOINT.
        REPARSEPOINT = 0x01;
    }
}

/// Byte ranges of [MS-SMB2] 2.2.13.
mod req_field {
    use crate::smb2::Field;
    pub const SECURITY_FLAGS: Field = 2..3;
    pub const REQUESTED_OPLOCK_LEVEL: Field = 3..4;
    pub const IMPERSONATION_LEVEL: Field = 4..8;
    pub const SMB_CREATE_FLAGS: Field = 8..16;
    pub const RESERVED: Field = 16..24;
    pub const DESIRED_ACCESS: Field = 24..28;
    pub const FILE_ATTRIBUTES: Field = 28..32;
    pub const SHARE_ACCESS: Field = 32..36;
    pub const CREATE_DISPOSITION: Field = 36..40;
    pub const CREATE_OPTIONS: Field = 40..44;
    pub const NAME_OFFSET: Field = 44..46;
    pub const NAME_LENGTH: Field = 46..48;
    pub const CREATE_CONTEXTS_OFFSET: Field = 48..52;
    pub const CREATE_CONTEXTS_LENGTH: Field = 52..56;
    /// Buffer starts here.
    pub const BUFFER: usize = 56;
}

body_view! {
    /// A zero-copy view of an SMB2 CREATE Request body ([MS-SMB2] 2.2.13).
    /// `new_checked` verifies the name and the create context list (inside
    /// the body, after the fixed part, not overlapping; the list 8-byte
    /// aligned and a well-formed chain, 2.2.13.2).
    pub struct CreateRequest;
    what: "SMB2 CREATE request",
    structure_size: 57,
    accessors {
        /// SecurityFlags (reserved: 0).
        security_flags, set_security_flags: u8 = req_field::SECURITY_FLAGS;
        /// RequestedOplockLevel.
        requested_oplock_level, set_requested_oplock_level: OplockLevel = req_field::REQUESTED_OPLOCK_LEVEL;
        /// ImpersonationLevel.
        impersonation_level, set_impersonation_level: ImpersonationLevel = req_field::IMPERSONATION_LEVEL;
        /// SmbCreateFlags (reserved: 0).
        smb_create_flags, set_smb_create_flags: u64 = req_field::SMB_CREATE_FLAGS;
        /// Reserved.
        reserved, set_reserved: u64 = req_field::RESERVED;
        /// DesiredAccess.
        desired_access, set_desired_access: AccessMask = req_field::DESIRED_ACCESS;
        /// FileAttributes.
        file_attributes, set_file_attributes: FileAttributes = req_field::FILE_ATTRIBUTES;
        /// ShareAccess.
        share_access, set_share_access: ShareAccess = req_field::SHARE_ACCESS;
        /// CreateDisposition.
        create_disposition, set_create_disposition: CreateDisposition = req_field::CREATE_DISPOSITION;
        /// CreateOptions.
        create_options, set_create_options: CreateOptions = req_field::CREATE_OPTIONS;
        /// NameOffset, from the header.
        name_offset, set_name_offset: u16 = req_field::NAME_OFFSET;
        /// NameLength, in bytes.
        name_length, set_name_length: u16 = req_field::NAME_LENGTH;
        /// CreateContextsOffset, from the header.
        create_contexts_offset, set_create_contexts_offset: u32 = req_field::CREATE_CONTEXTS_OFFSET;
        /// CreateContextsLength.
        create_contexts_length, set_create_contexts_length: u32 = req_field::CREATE_CONTEXTS_LENGTH;
    }
}

/// Checks a create context region of a body: 8-byte aligned offset, chain.
fn check_contexts(
    what: &'static str,
    body: &[u8],
    offset: u32,
    range: &Option<core::ops::Range<usize>>,
) -> Result<(), Smb2Error> {
    if let Some(r) = range {
        if offset % 8 != 0 {
            return Err(Smb2Error::Misaligned {
                what,
                field: "CreateContextsOffset",
                offset: u64::from(offset),
            });
        }
        check_chain(body.get(r.clone()).unwrap_or(&[]))?;
    }
    Ok(())
}

impl<T: AsRef<[u8]>> CreateRequest<T> {
    fn regions(&self) -> [Region; 2] {
        [
            Region::new(
                "NameOffset",
                u64::from(self.name_offset()),
                u64::from(self.name_length()),
            ),
            Region::new(
                "CreateContextsOffset",
                u64::from(self.create_contexts_offset()),
                u64::from(self.create_contexts_length()),
            ),
        ]
    }

    fn check_variable(&self) -> Result<(), Smb2Error> {
        let b = self.buffer.as_ref();
        let [_, ctx] = resolve_all(Self::WHAT, b.len(), Self::FIXED_LEN, self.regions())?;
        check_contexts(Self::WHAT, b, self.create_contexts_offset(), &ctx)
    }

    /// The file name, UTF-16LE, relative to the share.
    pub fn name(&self) -> Utf16Str<'_> {
        Utf16Str::from_utf16le(slice(
            self.buffer.as_ref(),
            Self::FIXED_LEN,
            self.regions()[0],
        ))
    }

    /// The create contexts.
    pub fn create_contexts(&self) -> CreateContextList<'_> {
        CreateContextList::from_wire(slice(
            self.buffer.as_ref(),
            Self::FIXED_LEN,
            self.regions()[1],
        ))
    }
}

/// The values of an SMB2 CREATE Request ([MS-SMB2] 2.2.13). Reserved is
/// emitted as 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateRequestRepr<'a> {
    /// SecurityFlags (the client sets 0).
    pub security_flags: u8,
    /// RequestedOplockLevel.
    pub requested_oplock_level: OplockLevel,
    /// ImpersonationLevel.
    pub impersonation_level: ImpersonationLevel,
    /// SmbCreateFlags (the client sets 0).
    pub smb_create_flags: u64,
    /// DesiredAccess.
    pub desired_access: AccessMask,
    /// FileAttributes.
    pub file_attributes: FileAttributes,
    /// ShareAccess.
    pub share_access: ShareAccess,
    /// CreateDisposition.
    pub create_disposition: CreateDisposition,
    /// CreateOptions.
    pub create_options: CreateOptions,
    /// Name (relative to the share; empty for its root).
    pub name: Utf16Str<'a>,
    /// Create contexts.
    pub create_contexts: CreateContextList<'a>,
}

impl<'a> CreateRequestRepr<'a> {
    /// Reads a checked view.
    pub fn parse(v: &CreateRequest<&'a [u8]>) -> Result<Self, Smb2Error> {
        v.check()?;
        let b: &'a [u8] = v.buffer;
        let [name, ctx] = v.regions();
        let fixed = CreateRequest::<&[u8]>::FIXED_LEN;
        Ok(CreateRequestRepr {
            security_flags: v.security_flags(),
            requested_oplock_level: v.requested_oplock_level(),
            impersonation_level: v.impersonation_level(),
            smb_create_flags: v.smb_create_flags(),
            desired_access: v.desired_access(),
            file_attributes: v.file_attributes(),
            share_access: v.share_access(),
            create_disposition: v.create_disposition(),
            create_options: v.create_options(),
            name: Utf16Str::from_utf16le(slice(b, fixed, name)),
            create_contexts: CreateContextList::from_wire(slice(b, fixed, ctx)),
        })
    }

    fn layout(&self) -> (usize, usize) {
        let name_end = req_field::BUFFER + self.name.byte_len();
        if self.create_contexts.is_empty() {
            (name_end, name_end.max(57))
        } else {
            let start = align8(name_end);
            (start, start + self.create_contexts.byte_len())
        }
    }

    /// Fixed part, name (header offset 120), then the contexts at the next
    /// 8-byte boundary (at least 57 bytes).
    pub fn buffer_len(&self) -> usize {
        self.layout().1
    }

    /// Writes the request.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        const WHAT: &str = "SMB2 CREATE request";
        let (ctx_start, len) = self.layout();
        room(WHAT, buf, len)?;
        let name_len: u16 = fit(WHAT, "NameLength", self.name.byte_len())?;
        self.create_contexts.check_emit()?;
        let ctx_len: u32 = fit(
            WHAT,
            "CreateContextsLength",
            self.create_contexts.byte_len(),
        )?;
        let ctx_off: u32 = if ctx_len == 0 {
            0
        } else {
            fit(WHAT, "CreateContextsOffset", hdr(ctx_start))?
        };
        let buf = &mut buf[..len];
        buf.fill(0);
        let mut v = CreateRequest::new_unchecked(&mut *buf);
        v.set_structure_size(57);
        v.set_security_flags(self.security_flags);
        v.set_requested_oplock_level(self.requested_oplock_level);
        v.set_impersonation_level(self.impersonation_level);
        v.set_smb_create_flags(self.smb_create_flags);
        v.set_desired_access(self.desired_access);
        v.set_file_attributes(self.file_attributes);
        v.set_share_access(self.share_access);
        v.set_create_disposition(self.create_disposition);
        v.set_create_options(self.create_options);
        v.set_name_offset(hdr(req_field::BUFFER) as u16);
        v.set_name_length(name_len);
        v.set_create_contexts_offset(ctx_off);
        v.set_create_contexts_length(ctx_len);
        self.name.write_to(&mut buf[req_field::BUFFER..]);
        self.create_contexts.write_to(&mut buf[ctx_start..]);
        Ok(len)
    }
}

impl_body!(CreateRequestRepr<'a>, CreateRequest, Some(Command::Create));

/// Byte ranges of [MS-SMB2] 2.2.14.
mod rsp_field {
    use crate::smb2::Field;
    pub const OPLOCK_LEVEL: Field = 2..3;
    pub const FLAGS: Field = 3..4;
    pub const CREATE_ACTION: Field = 4..8;
    pub const CREATION_TIME: Field = 8..16;
    pub const LAST_ACCESS_TIME: Field = 16..24;
    pub const LAST_WRITE_TIME: Field = 24..32;
    pub const CHANGE_TIME: Field = 32..40;
    pub const ALLOCATION_SIZE: Field = 40..48;
    pub const END_OF_FILE: Field = 48..56;
    pub const FILE_ATTRIBUTES: Field = 56..60;
    pub const RESERVED2: Field = 60..64;
    pub const FILE_ID: Field = 64..80;
    pub const CREATE_CONTEXTS_OFFSET: Field = 80..84;
    pub const CREATE_CONTEXTS_LENGTH: Field = 84..88;
    /// Buffer starts here.
    pub const BUFFER: usize = 88;
}

body_view! {
    /// A zero-copy view of an SMB2 CREATE Response body ([MS-SMB2] 2.2.14).
    pub struct CreateResponse;
    what: "SMB2 CREATE response",
    structure_size: 89,
    accessors {
        /// OplockLevel.
        oplock_level, set_oplock_level: OplockLevel = rsp_field::OPLOCK_LEVEL;
        /// Flags.
        flags, set_flags: CreateResponseFlags = rsp_field::FLAGS;
        /// CreateAction.
        create_action, set_create_action: CreateAction = rsp_field::CREATE_ACTION;
        /// CreationTime (FILETIME).
        creation_time, set_creation_time: u64 = rsp_field::CREATION_TIME;
        /// LastAccessTime (FILETIME).
        last_access_time, set_last_access_time: u64 = rsp_field::LAST_ACCESS_TIME;
        /// LastWriteTime (FILETIME).
        last_write_time, set_last_write_time: u64 = rsp_field::LAST_WRITE_TIME;
        /// ChangeTime (FILETIME).
        change_time, set_change_time: u64 = rsp_field::CHANGE_TIME;
        /// AllocationSize.
        allocation_size, set_allocation_size: u64 = rsp_field::ALLOCATION_SIZE;
        /// EndofFile.
        end_of_file, set_end_of_file: u64 = rsp_field::END_OF_FILE;
        /// FileAttributes.
        file_attributes, set_file_attributes: FileAttributes = rsp_field::FILE_ATTRIBUTES;
        /// Reserved2.
        reserved2, set_reserved2: u32 = rsp_field::RESERVED2;
        /// FileId.
        file_id, set_file_id: FileId = rsp_field::FILE_ID;
        /// CreateContextsOffset, from the header.
        create_contexts_offset, set_create_contexts_offset: u32 = rsp_field::CREATE_CONTEXTS_OFFSET;
        /// CreateContextsLength.
        create_contexts_length, set_create_contexts_length: u32 = rsp_field::CREATE_CONTEXTS_LENGTH;
    }
}

impl<T: AsRef<[u8]>> CreateResponse<T> {
    fn contexts_region(&self) -> Region {
        Region::new(
            "CreateContextsOffset",
            u64::from(self.create_contexts_offset()),
            u64::from(self.create_contexts_length()),
        )
    }

    fn check_variable(&self) -> Result<(), Smb2Error> {
        let b = self.buffer.as_ref();
        let [ctx] = resolve_all(
            Self::WHAT,
            b.len(),
            Self::FIXED_LEN,
            [self.contexts_region()],
        )?;
        check_contexts(Self::WHAT, b, self.create_contexts_offset(), &ctx)
    }

    /// The create contexts.
    pub fn create_contexts(&self) -> CreateContextList<'_> {
        CreateContextList::from_wire(slice(
            self.buffer.as_ref(),
            Self::FIXED_LEN,
            self.contexts_region(),
        ))
    }
}

/// The values of an SMB2 CREATE Response ([MS-SMB2] 2.2.14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateResponseRepr<'a> {
    /// OplockLevel.
    pub oplock_level: OplockLevel,
    /// Flags.
    pub flags: CreateResponseFlags,
    /// CreateAction.
    pub create_action: CreateAction,
    /// CreationTime (FILETIME).
    pub creation_time: u64,
    /// LastAccessTime (FILETIME).
    pub last_access_time: u64,
    /// LastWriteTime (FILETIME).
    pub last_write_time: u64,
    /// ChangeTime (FILETIME).
    pub change_time: u64,
    /// AllocationSize.
    pub allocation_size: u64,
    /// EndofFile.
    pub end_of_file: u64,
    /// FileAttributes.
    pub file_attributes: FileAttributes,
    /// FileId.
    pub file_id: FileId,
    /// Create contexts (2.2.14.2).
    pub create_contexts: CreateContextList<'a>,
}

impl<'a> CreateResponseRepr<'a> {
    /// Reads a checked view.
    pub fn parse(v: &CreateResponse<&'a [u8]>) -> Result<Self, Smb2Error> {
        v.check()?;
        let b: &'a [u8] = v.buffer;
        Ok(CreateResponseRepr {
            oplock_level: v.oplock_level(),
            flags: v.flags(),
            create_action: v.create_action(),
            creation_time: v.creation_time(),
            last_access_time: v.last_access_time(),
            last_write_time: v.last_write_time(),
            change_time: v.change_time(),
            allocation_size: v.allocation_size(),
            end_of_file: v.end_of_file(),
            file_attributes: v.file_attributes(),
            file_id: v.file_id(),
            create_contexts: CreateContextList::from_wire(slice(
                b,
                CreateResponse::<&[u8]>::FIXED_LEN,
                v.contexts_region(),
            )),
        })
    }

    /// Fixed part, then the contexts at header offset 152 (at least 89
    /// bytes).
    pub fn buffer_len(&self) -> usize {
        (rsp_field::BUFFER + self.create_contexts.byte_len()).max(89)
    }

    /// Writes the response.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        const WHAT: &str = "SMB2 CREATE response";
        let len = self.buffer_len();
        room(WHAT, buf, len)?;
        self.create_contexts.check_emit()?;
        let ctx_len: u32 = fit(
            WHAT,
            "CreateContextsLength",
            self.create_contexts.byte_len(),
        )?;
        let buf = &mut buf[..len];
        buf.fill(0);
        let mut v = CreateResponse::new_unchecked(&mut *buf);
        v.set_structure_size(89);
        v.set_oplock_level(self.oplock_level);
        v.set_flags(self.flags);
        v.set_create_action(self.create_action);
        v.set_creation_time(self.creation_time);
        v.set_last_access_time(self.last_access_time);
        v.set_last_write_time(self.last_write_time);
        v.set_change_time(self.change_time);
        v.set_allocation_size(self.allocation_size);
        v.set_end_of_file(self.end_of_file);
        v.set_file_attributes(self.file_attributes);
        v.set_file_id(self.file_id);
        if ctx_len > 0 {
            v.set_create_contexts_offset(hdr(rsp_field::BUFFER) as u32);
            v.set_create_contexts_length(ctx_len);
        }
        self.create_contexts.write_to(&mut buf[rsp_field::BUFFER..]);
        Ok(len)
    }
}

impl_body!(
    CreateResponseRepr<'a>,
    CreateResponse,
    Some(Command::Create)
);
