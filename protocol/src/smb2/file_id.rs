//! [MS-SMB2] 2.2.14.1 SMB2_FILEID.

use super::{Field, Scalar};

/// An SMB2 file handle: Persistent (8 bytes) then Volatile (8 bytes),
/// little-endian. Not a GUID: the server picks both halves (3.3.5.9).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
pub struct FileId {
    /// Persistent: survives reconnects of durable/persistent handles.
    pub persistent: u64,
    /// Volatile: may change on reconnect.
    pub volatile: u64,
}

impl FileId {
    /// Encoded length.
    pub const LEN: usize = 16;

    /// All ones: the FileId of a related compounded request that uses the
    /// previous request's open ([MS-SMB2] 3.2.4.1.4, 3.3.5.2.7.2), and the
    /// FileId of FSCTLs that have no open (3.3.5.15).
    pub const ANY: FileId = FileId {
        persistent: u64::MAX,
        volatile: u64::MAX,
    };

    /// From the two halves.
    pub const fn new(persistent: u64, volatile: u64) -> FileId {
        FileId {
            persistent,
            volatile,
        }
    }

    /// From the 16 wire bytes.
    pub fn from_bytes(b: [u8; 16]) -> FileId {
        FileId {
            persistent: u64::read(&b, 0..8),
            volatile: u64::read(&b, 8..16),
        }
    }

    /// The 16 wire bytes.
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        self.persistent.write(&mut b, 0..8);
        self.volatile.write(&mut b, 8..16);
        b
    }

    /// True for [`FileId::ANY`].
    pub const fn is_any(self) -> bool {
        self.persistent == u64::MAX && self.volatile == u64::MAX
    }
}

impl Scalar for FileId {
    fn read(b: &[u8], f: Field) -> Self {
        FileId::from_bytes(<[u8; 16]>::read(b, f))
    }
    fn write(self, b: &mut [u8], f: Field) {
        self.to_bytes().write(b, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_id_is_persistent_then_volatile_little_endian() {
        let f = FileId::new(0x0102_0304_0506_0708, 0x1112_1314_1516_1718);
        assert_eq!(
            f.to_bytes(),
            [
                0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, 0x18, 0x17, 0x16, 0x15, 0x14, 0x13,
                0x12, 0x11
            ]
        );
        assert_eq!(FileId::from_bytes(f.to_bytes()), f);
        assert!(FileId::ANY.is_any());
        assert_eq!(FileId::ANY.to_bytes(), [0xFF; 16]);
        assert!(!f.is_any());
    }
}
