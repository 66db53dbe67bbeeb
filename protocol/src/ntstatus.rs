//! NTSTATUS values ([MS-ERREF] 2.3) used by [MS-SMBD], [MS-SQOS] and SMB2.
//! Add a value here (one place) rather than spelling a literal elsewhere.

/// An NTSTATUS code.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NtStatus(pub u32);

impl NtStatus {
    /// Severity field (top two bits): 3 = STATUS_SEVERITY_ERROR ([MS-ERREF] 2.3).
    pub const fn severity(self) -> u32 {
        self.0 >> 30
    }
    /// True when the severity is STATUS_SEVERITY_ERROR.
    pub const fn is_error(self) -> bool {
        self.severity() == 3
    }
    /// Symbolic name, if this crate knows it.
    pub fn name(self) -> Option<&'static str> {
        KNOWN.iter().find(|(v, _)| *v == self).map(|(_, n)| *n)
    }
}

impl core::fmt::Debug for NtStatus {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n}(0x{:08X})", self.0),
            None => write!(f, "NTSTATUS(0x{:08X})", self.0),
        }
    }
}

impl core::fmt::Display for NtStatus {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(self, f)
    }
}

macro_rules! statuses {
    ($($(#[$m:meta])* $name:ident = $val:expr;)*) => {
        $( $(#[$m])* pub const $name: NtStatus = NtStatus($val); )*
        const KNOWN: &[(NtStatus, &str)] = &[$(($name, stringify!($name))),*];
    };
}

statuses! {
    /// Success.
    STATUS_SUCCESS = 0x0000_0000;
    /// [MS-SMBD] 3.1.5.6: version range without 0x0100; SMB2 unsupported ops.
    STATUS_NOT_SUPPORTED = 0xC000_00BB;
    /// [MS-SMBD] note <5>; resource exhaustion.
    STATUS_INSUFFICIENT_RESOURCES = 0xC000_009A;
    /// Invalid parameter.
    STATUS_INVALID_PARAMETER = 0xC000_000D;
    /// [MS-SQOS] 3.2.5.1: request on an open that is not a file/volume.
    STATUS_INVALID_DEVICE_REQUEST = 0xC000_0010;
    /// [MS-SQOS] 3.2.5.1: unsupported protocol version.
    STATUS_REVISION_MISMATCH = 0xC000_0059;
    /// [MS-SQOS] 3.2.5.1.x: flow not found.
    STATUS_NOT_FOUND = 0xC000_0225;
    /// Buffer too small.
    STATUS_BUFFER_TOO_SMALL = 0xC000_0023;
    /// SMB2: unknown command / invalid request.
    STATUS_INVALID_DEVICE_STATE = 0xC000_0184;
    /// SMB2 access denied.
    STATUS_ACCESS_DENIED = 0xC000_0022;
    /// SMB2 logon failure.
    STATUS_LOGON_FAILURE = 0xC000_006D;
    /// SMB2 end of file.
    STATUS_END_OF_FILE = 0xC000_0011;
    /// SMB2 object name not found.
    STATUS_OBJECT_NAME_NOT_FOUND = 0xC000_0034;
    /// SMB2 object name collision.
    STATUS_OBJECT_NAME_COLLISION = 0xC000_0035;
    /// SMB2 file closed / invalid handle.
    STATUS_FILE_CLOSED = 0xC000_0128;
    /// SMB2 disk full.
    STATUS_DISK_FULL = 0xC000_007F;
    /// SMB2 network name deleted / bad share.
    STATUS_BAD_NETWORK_NAME = 0xC000_00CC;
    /// SMB2 user session deleted.
    STATUS_USER_SESSION_DELETED = 0xC000_0203;
    /// SMB2 network session expired / invalid tree.
    STATUS_NETWORK_NAME_DELETED = 0xC000_00C9;
    /// SMB2: request not accepted (credits / connection limits).
    STATUS_REQUEST_NOT_ACCEPTED = 0xC000_00D0;
    /// SMB2 more processing required (SESSION_SETUP continuation).
    STATUS_MORE_PROCESSING_REQUIRED = 0xC000_0016;
    /// Cancelled.
    STATUS_CANCELLED = 0xC000_0120;
    /// Connection disconnected.
    STATUS_CONNECTION_DISCONNECTED = 0xC000_020C;
    /// I/O timeout.
    STATUS_IO_TIMEOUT = 0xC000_00B5;
    /// Invalid network response.
    STATUS_INVALID_NETWORK_RESPONSE = 0xC000_00C3;
    /// [MS-SMB2] 3.3.4.2: interim response of an operation that goes async.
    STATUS_PENDING = 0x0000_0103;
    /// [MS-SMB2] 3.3.4.4: READ/IOCTL output truncated to the client's limit
    /// (a warning: the command's response body is still sent).
    STATUS_BUFFER_OVERFLOW = 0x8000_0005;
    /// SMB2 object path not found (a parent directory is missing).
    STATUS_OBJECT_PATH_NOT_FOUND = 0xC000_003A;
    /// SMB2 object name invalid.
    STATUS_OBJECT_NAME_INVALID = 0xC000_0033;
    /// A file operation on a directory.
    STATUS_FILE_IS_A_DIRECTORY = 0xC000_00BA;
    /// A directory operation on a file.
    STATUS_NOT_A_DIRECTORY = 0xC000_0103;
    /// An I/O error the store cannot name more precisely.
    STATUS_UNEXPECTED_IO_ERROR = 0xC000_00E9;
    /// Directory not empty (delete of a non-empty directory).
    STATUS_DIRECTORY_NOT_EMPTY = 0xC000_0101;
    /// [MS-SMB2] 3.3.5.18: QUERY_DIRECTORY has no (more) entries to return
    /// (a warning).
    STATUS_NO_MORE_FILES = 0x8000_0006;
    /// [MS-SMB2] 3.3.5.18: the first QUERY_DIRECTORY of a search matches
    /// nothing.
    STATUS_NO_SUCH_FILE = 0xC000_000F;
    /// [MS-SMB2] 3.3.5.12/3.3.5.13: READ/WRITE over a byte range another open
    /// has locked.
    STATUS_FILE_LOCK_CONFLICT = 0xC000_0054;
    /// [MS-SMB2] 3.3.5.14: a lock request that conflicts with an existing
    /// lock.
    STATUS_LOCK_NOT_GRANTED = 0xC000_0055;
    /// [MS-SMB2] 3.3.5.14: an unlock of a range that is not locked.
    STATUS_RANGE_NOT_LOCKED = 0xC000_007E;
    /// [MS-SMB2] 3.3.5.14: Offset + Length of a lock element overflows.
    STATUS_INVALID_LOCK_RANGE = 0xC000_01A1;
    /// [MS-FSA] 2.1.5.15.12 (rename): target on another volume/share.
    STATUS_NOT_SAME_DEVICE = 0xC000_00D4;
    /// An open of a file whose delete is pending.
    STATUS_DELETE_PENDING = 0xC000_0056;
    /// Delete of a file that cannot be deleted (read-only).
    STATUS_CANNOT_DELETE = 0xC000_0121;
    /// [MS-SMB2] 3.3.5.20.1: an information class [MS-FSCC] does not define.
    STATUS_INVALID_INFO_CLASS = 0xC000_0003;
    /// [MS-FSA] 2.1.5.x: an output or input buffer shorter than the
    /// information class's fixed part.
    STATUS_INFO_LENGTH_MISMATCH = 0xC000_0004;
    /// [MS-SMB2] 3.3.5.15.2: FSCTL_DFS_GET_REFERRALS on a server without DFS.
    STATUS_FS_DRIVER_REQUIRED = 0xC000_019C;
    /// [MS-SMB2] 3.3.5.19: CHANGE_NOTIFY whose changes did not fit (a success
    /// code: enumerate the directory again).
    STATUS_NOTIFY_ENUM_DIR = 0x0000_010C;
    /// [MS-SMB2] 3.3.5.19: CHANGE_NOTIFY completed because the handle closed.
    STATUS_NOTIFY_CLEANUP = 0x0000_010B;
    /// An invalid handle.
    STATUS_INVALID_HANDLE = 0xC000_0008;
    /// [MS-SMB2] 3.3.5.9: the open conflicts with another open's share access.
    STATUS_SHARING_VIOLATION = 0xC000_0043;
    /// A path that is syntactically invalid.
    STATUS_OBJECT_PATH_SYNTAX_BAD = 0xC000_003B;
    /// FileFullEaInformation on a file with no extended attributes.
    STATUS_NO_EAS_ON_FILE = 0xC000_0052;
    /// The file system does not support extended attributes.
    STATUS_EAS_NOT_SUPPORTED = 0xC000_004F;
    /// The requested operation is not implemented.
    STATUS_NOT_IMPLEMENTED = 0xC000_0002;
    /// [MS-SMB2] 3.3.5.22.1: OPLOCK_BREAK acknowledgment with no break in
    /// progress.
    STATUS_INVALID_OPLOCK_PROTOCOL = 0xC000_00E3;
    /// A write to a read-only volume.
    STATUS_MEDIA_WRITE_PROTECTED = 0xC000_00A2;
    /// FSCTL_GET_REPARSE_POINT on a file that is not one.
    STATUS_NOT_A_REPARSE_POINT = 0xC000_0275;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn severity_error_is_detected() {
        assert!(STATUS_NOT_SUPPORTED.is_error());
        assert!(STATUS_INSUFFICIENT_RESOURCES.is_error());
        assert!(!STATUS_SUCCESS.is_error());
        assert_eq!(
            format!("{:?}", STATUS_NOT_FOUND),
            "STATUS_NOT_FOUND(0xC0000225)"
        );
    }
}
