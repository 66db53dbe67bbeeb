//! [MS-SMB2] 2.2.24 SMB2 OPLOCK_BREAK Acknowledgment (and the responses of
//! 2.2.25 and the oplock break notification of 2.2.23.1, which share the
//! layouts): the oplock form (2.2.24.1, StructureSize 24) and the lease
//! form (2.2.24.2, StructureSize 36). StructureSize says which one a body
//! is. The lease break notification (2.2.23.2, StructureSize 44), which
//! only a server that grants leases sends, is not decoded (a body of 44 is
//! `StructureSize`). A server that grants no oplocks or leases answers an
//! acknowledgment with an error (3.3.5.22.1:
//! STATUS_INVALID_OPLOCK_PROTOCOL; 3.3.5.22.2: STATUS_OBJECT_NAME_NOT_FOUND
//! for an unknown lease).

use super::create::OplockLevel;
use super::create_context::{LeaseFlags, LeaseState};
use super::error::Smb2Error;
use super::file_id::FileId;
use super::layout::room;
use super::Command;

/// Byte ranges of [MS-SMB2] 2.2.24.1.
mod oplock_field {
    use crate::smb2::Field;
    pub const OPLOCK_LEVEL: Field = 2..3;
    pub const RESERVED: Field = 3..4;
    pub const RESERVED2: Field = 4..8;
    pub const FILE_ID: Field = 8..24;
}

body_view! {
    /// A zero-copy view of an oplock break body ([MS-SMB2] 2.2.24.1
    /// acknowledgment, 2.2.23.1 notification, 2.2.25.1 response): 24 bytes.
    pub struct OplockBreak;
    what: "SMB2 OPLOCK_BREAK (oplock)",
    structure_size: 24,
    accessors {
        /// OplockLevel.
        oplock_level, set_oplock_level: OplockLevel = oplock_field::OPLOCK_LEVEL;
        /// Reserved.
        reserved, set_reserved: u8 = oplock_field::RESERVED;
        /// Reserved2.
        reserved2, set_reserved2: u32 = oplock_field::RESERVED2;
        /// FileId.
        file_id, set_file_id: FileId = oplock_field::FILE_ID;
    }
}

impl<T: AsRef<[u8]>> OplockBreak<T> {
    fn check_variable(&self) -> Result<(), Smb2Error> {
        Ok(())
    }
}

/// The values of an oplock break body ([MS-SMB2] 2.2.24.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OplockBreakAckRepr {
    /// OplockLevel (the level the client accepts / the server grants).
    pub oplock_level: OplockLevel,
    /// FileId.
    pub file_id: FileId,
}

impl OplockBreakAckRepr {
    /// Reads a checked view.
    pub fn parse<T: AsRef<[u8]>>(v: &OplockBreak<T>) -> Result<Self, Smb2Error> {
        v.check()?;
        Ok(OplockBreakAckRepr {
            oplock_level: v.oplock_level(),
            file_id: v.file_id(),
        })
    }

    /// 24 bytes.
    pub const fn buffer_len(&self) -> usize {
        24
    }

    /// Writes the body.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        room("SMB2 OPLOCK_BREAK (oplock)", buf, 24)?;
        let buf = &mut buf[..24];
        buf.fill(0);
        let mut v = OplockBreak::new_unchecked(buf);
        v.set_structure_size(24);
        v.set_oplock_level(self.oplock_level);
        v.set_file_id(self.file_id);
        Ok(24)
    }
}

/// Byte ranges of [MS-SMB2] 2.2.24.2.
mod lease_field {
    use crate::smb2::Field;
    pub const RESERVED: Field = 2..4;
    pub const FLAGS: Field = 4..8;
    pub const LEASE_KEY: Field = 8..24;
    pub const LEASE_STATE: Field = 24..28;
    pub const LEASE_DURATION: Field = 28..36;
}

body_view! {
    /// A zero-copy view of a lease break body ([MS-SMB2] 2.2.24.2
    /// acknowledgment, 2.2.25.2 response): 36 bytes.
    pub struct LeaseBreak;
    what: "SMB2 OPLOCK_BREAK (lease)",
    structure_size: 36,
    accessors {
        /// Reserved.
        reserved, set_reserved: u16 = lease_field::RESERVED;
        /// Flags (reserved: 0).
        flags, set_flags: LeaseFlags = lease_field::FLAGS;
        /// LeaseKey.
        lease_key, set_lease_key: [u8; 16] = lease_field::LEASE_KEY;
        /// LeaseState.
        lease_state, set_lease_state: LeaseState = lease_field::LEASE_STATE;
        /// LeaseDuration (reserved: 0).
        lease_duration, set_lease_duration: u64 = lease_field::LEASE_DURATION;
    }
}

impl<T: AsRef<[u8]>> LeaseBreak<T> {
    fn check_variable(&self) -> Result<(), Smb2Error> {
        Ok(())
    }
}

/// The values of a lease break body ([MS-SMB2] 2.2.24.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseBreakAckRepr {
    /// Flags.
    pub flags: LeaseFlags,
    /// LeaseKey.
    pub lease_key: [u8; 16],
    /// LeaseState.
    pub lease_state: LeaseState,
    /// LeaseDuration.
    pub lease_duration: u64,
}

impl LeaseBreakAckRepr {
    /// Reads a checked view.
    pub fn parse<T: AsRef<[u8]>>(v: &LeaseBreak<T>) -> Result<Self, Smb2Error> {
        v.check()?;
        Ok(LeaseBreakAckRepr {
            flags: v.flags(),
            lease_key: v.lease_key(),
            lease_state: v.lease_state(),
            lease_duration: v.lease_duration(),
        })
    }

    /// 36 bytes.
    pub const fn buffer_len(&self) -> usize {
        36
    }

    /// Writes the body.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        room("SMB2 OPLOCK_BREAK (lease)", buf, 36)?;
        let buf = &mut buf[..36];
        buf.fill(0);
        let mut v = LeaseBreak::new_unchecked(buf);
        v.set_structure_size(36);
        v.set_flags(self.flags);
        v.set_lease_key(self.lease_key);
        v.set_lease_state(self.lease_state);
        v.set_lease_duration(self.lease_duration);
        Ok(36)
    }
}

/// An SMB2 OPLOCK_BREAK body: the oplock or the lease form, by
/// StructureSize ([MS-SMB2] 2.2.24).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OplockBreakRepr {
    /// StructureSize 24 (2.2.24.1).
    Oplock(OplockBreakAckRepr),
    /// StructureSize 36 (2.2.24.2).
    Lease(LeaseBreakAckRepr),
}

impl OplockBreakRepr {
    /// Checks and parses a body: StructureSize 24 or 36; any other is
    /// `StructureSize` (expected 24).
    pub fn from_body(body: &[u8]) -> Result<Self, Smb2Error> {
        match body.get(0..2).map(|s| u16::from_le_bytes([s[0], s[1]])) {
            Some(36) => Ok(OplockBreakRepr::Lease(LeaseBreakAckRepr::parse(
                &LeaseBreak::new_checked(body)?,
            )?)),
            _ => Ok(OplockBreakRepr::Oplock(OplockBreakAckRepr::parse(
                &OplockBreak::new_checked(body)?,
            )?)),
        }
    }

    /// 24 or 36.
    pub const fn buffer_len(&self) -> usize {
        match self {
            OplockBreakRepr::Oplock(_) => 24,
            OplockBreakRepr::Lease(_) => 36,
        }
    }

    /// Writes the body.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        match self {
            OplockBreakRepr::Oplock(o) => o.emit(buf),
            OplockBreakRepr::Lease(l) => l.emit(buf),
        }
    }
}

impl super::Smb2Body for OplockBreakRepr {
    fn command(&self) -> Option<Command> {
        Some(Command::OplockBreak)
    }
    fn buffer_len(&self) -> usize {
        OplockBreakRepr::buffer_len(self)
    }
    fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        OplockBreakRepr::emit(self, buf)
    }
}
