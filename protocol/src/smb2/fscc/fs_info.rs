//! [MS-FSCC] 2.5 file system information classes a server returns to
//! QUERY_INFO with InfoType SMB2_0_INFO_FILESYSTEM. Linux cifs asks for
//! FileFsAttributeInformation, FileFsDeviceInformation,
//! FileFsVolumeInformation and FileFsSectorSizeInformation at mount and
//! FileFsFullSizeInformation for statfs.

use super::super::error::Smb2Error;
use super::super::layout::{fit, room};
use super::super::utf16::Utf16Str;
use super::super::Scalar;
use super::need;
use crate::sqos::Guid;

bitmask! {
    /// [MS-FSCC] 2.5 FileFsAttributeInformation: FileSystemAttributes.
    pub struct FileSystemAttributes(u32) {
        /// FILE_CASE_SENSITIVE_SEARCH.
        CASE_SENSITIVE_SEARCH = 0x0000_0001;
        /// FILE_CASE_PRESERVED_NAMES.
        CASE_PRESERVED_NAMES = 0x0000_0002;
        /// FILE_UNICODE_ON_DISK.
        UNICODE_ON_DISK = 0x0000_0004;
        /// FILE_PERSISTENT_ACLS.
        PERSISTENT_ACLS = 0x0000_0008;
        /// FILE_FILE_COMPRESSION.
        FILE_COMPRESSION = 0x0000_0010;
        /// FILE_VOLUME_QUOTAS.
        VOLUME_QUOTAS = 0x0000_0020;
        /// FILE_SUPPORTS_SPARSE_FILES.
        SUPPORTS_SPARSE_FILES = 0x0000_0040;
        /// FILE_SUPPORTS_REPARSE_POINTS.
        SUPPORTS_REPARSE_POINTS = 0x0000_0080;
        /// FILE_SUPPORTS_REMOTE_STORAGE.
        SUPPORTS_REMOTE_STORAGE = 0x0000_0100;
        /// FILE_RETURNS_CLEANUP_RESULT_INFO.
        RETURNS_CLEANUP_RESULT_INFO = 0x0000_0200;
        /// FILE_SUPPORTS_POSIX_UNLINK_RENAME.
        SUPPORTS_POSIX_UNLINK_RENAME = 0x0000_0400;
        /// FILE_VOLUME_IS_COMPRESSED.
        VOLUME_IS_COMPRESSED = 0x0000_8000;
        /// FILE_SUPPORTS_OBJECT_IDS.
        SUPPORTS_OBJECT_IDS = 0x0001_0000;
        /// FILE_SUPPORTS_ENCRYPTION.
        SUPPORTS_ENCRYPTION = 0x0002_0000;
        /// FILE_NAMED_STREAMS.
        NAMED_STREAMS = 0x0004_0000;
        /// FILE_READ_ONLY_VOLUME.
        READ_ONLY_VOLUME = 0x0008_0000;
        /// FILE_SEQUENTIAL_WRITE_ONCE.
        SEQUENTIAL_WRITE_ONCE = 0x0010_0000;
        /// FILE_SUPPORTS_TRANSACTIONS.
        SUPPORTS_TRANSACTIONS = 0x0020_0000;
        /// FILE_SUPPORTS_HARD_LINKS.
        SUPPORTS_HARD_LINKS = 0x0040_0000;
        /// FILE_SUPPORTS_EXTENDED_ATTRIBUTES.
        SUPPORTS_EXTENDED_ATTRIBUTES = 0x0080_0000;
        /// FILE_SUPPORTS_OPEN_BY_FILE_ID.
        SUPPORTS_OPEN_BY_FILE_ID = 0x0100_0000;
        /// FILE_SUPPORTS_USN_JOURNAL.
        SUPPORTS_USN_JOURNAL = 0x0200_0000;
        /// FILE_SUPPORT_INTEGRITY_STREAMS.
        SUPPORT_INTEGRITY_STREAMS = 0x0400_0000;
        /// FILE_SUPPORTS_BLOCK_REFCOUNTING.
        SUPPORTS_BLOCK_REFCOUNTING = 0x0800_0000;
        /// FILE_SUPPORTS_SPARSE_VDL.
        SUPPORTS_SPARSE_VDL = 0x1000_0000;
        /// FILE_DAX_VOLUME.
        DAX_VOLUME = 0x2000_0000;
        /// FILE_SUPPORTS_GHOSTING.
        SUPPORTS_GHOSTING = 0x4000_0000;
    }
}

/// [MS-FSCC] 2.5 FileFsDeviceInformation: DeviceType FILE_DEVICE_DISK.
pub const FILE_DEVICE_DISK: u32 = 0x0000_0007;

bitmask! {
    /// [MS-FSCC] 2.5 FileFsDeviceInformation: Characteristics.
    pub struct FsDeviceCharacteristics(u32) {
        /// FILE_REMOVABLE_MEDIA.
        REMOVABLE_MEDIA = 0x0000_0001;
        /// FILE_READ_ONLY_DEVICE.
        READ_ONLY_DEVICE = 0x0000_0002;
        /// FILE_FLOPPY_DISKETTE.
        FLOPPY_DISKETTE = 0x0000_0004;
        /// FILE_WRITE_ONCE_MEDIA.
        WRITE_ONCE_MEDIA = 0x0000_0008;
        /// FILE_REMOTE_DEVICE.
        REMOTE_DEVICE = 0x0000_0010;
        /// FILE_DEVICE_IS_MOUNTED.
        DEVICE_IS_MOUNTED = 0x0000_0020;
        /// FILE_VIRTUAL_VOLUME.
        VIRTUAL_VOLUME = 0x0000_0040;
        /// FILE_DEVICE_SECURE_OPEN.
        DEVICE_SECURE_OPEN = 0x0000_0100;
        /// FILE_CHARACTERISTIC_TS_DEVICE.
        TS_DEVICE = 0x0000_1000;
        /// FILE_CHARACTERISTIC_WEBDAV_DEVICE.
        WEBDAV_DEVICE = 0x0000_2000;
        /// FILE_DEVICE_ALLOW_APPCONTAINER_TRAVERSAL.
        ALLOW_APPCONTAINER_TRAVERSAL = 0x0002_0000;
        /// FILE_PORTABLE_DEVICE.
        PORTABLE_DEVICE = 0x0004_0000;
    }
}

bitmask! {
    /// [MS-FSCC] 2.5 FileFsSectorSizeInformation Flags.
    pub struct SectorSizeFlags(u32) {
        /// SSINFO_FLAGS_ALIGNED_DEVICE.
        ALIGNED_DEVICE = 0x0000_0001;
        /// SSINFO_FLAGS_PARTITION_ALIGNED_ON_DEVICE.
        PARTITION_ALIGNED_ON_DEVICE = 0x0000_0002;
        /// SSINFO_FLAGS_NO_SEEK_PENALTY.
        NO_SEEK_PENALTY = 0x0000_0004;
        /// SSINFO_FLAGS_TRIM_ENABLED.
        TRIM_ENABLED = 0x0000_0008;
    }
}

fscc_fixed! {
    /// A zero-copy view of FILE_FS_SIZE_INFORMATION ([MS-FSCC] 2.5
    /// FileFsSizeInformation, class 3): 24 bytes.
    view FileFsSizeInformation;
    /// The values of FILE_FS_SIZE_INFORMATION.
    repr FileFsSizeInformationRepr;
    what: "FILE_FS_SIZE_INFORMATION",
    len: 24,
    fields {
        /// TotalAllocationUnits.
        total_allocation_units, set_total_allocation_units: u64 = 0..8;
        /// AvailableAllocationUnits (for the caller).
        available_allocation_units, set_available_allocation_units: u64 = 8..16;
        /// SectorsPerAllocationUnit.
        sectors_per_allocation_unit, set_sectors_per_allocation_unit: u32 = 16..20;
        /// BytesPerSector.
        bytes_per_sector, set_bytes_per_sector: u32 = 20..24;
    }
}

fscc_fixed! {
    /// A zero-copy view of FILE_FS_FULL_SIZE_INFORMATION ([MS-FSCC] 2.5
    /// FileFsFullSizeInformation, class 7): 32 bytes.
    view FileFsFullSizeInformation;
    /// The values of FILE_FS_FULL_SIZE_INFORMATION (cifs statfs).
    repr FileFsFullSizeInformationRepr;
    what: "FILE_FS_FULL_SIZE_INFORMATION",
    len: 32,
    fields {
        /// TotalAllocationUnits.
        total_allocation_units, set_total_allocation_units: u64 = 0..8;
        /// CallerAvailableAllocationUnits.
        caller_available_allocation_units, set_caller_available_allocation_units: u64 = 8..16;
        /// ActualAvailableAllocationUnits.
        actual_available_allocation_units, set_actual_available_allocation_units: u64 = 16..24;
        /// SectorsPerAllocationUnit.
        sectors_per_allocation_unit, set_sectors_per_allocation_unit: u32 = 24..28;
        /// BytesPerSector.
        bytes_per_sector, set_bytes_per_sector: u32 = 28..32;
    }
}

fscc_fixed! {
    /// A zero-copy view of FILE_FS_DEVICE_INFORMATION ([MS-FSCC] 2.5
    /// FileFsDeviceInformation, class 4): 8 bytes.
    view FileFsDeviceInformation;
    /// The values of FILE_FS_DEVICE_INFORMATION (a share on a disk:
    /// [`FILE_DEVICE_DISK`]).
    repr FileFsDeviceInformationRepr;
    what: "FILE_FS_DEVICE_INFORMATION",
    len: 8,
    fields {
        /// DeviceType.
        device_type, set_device_type: u32 = 0..4;
        /// Characteristics.
        characteristics, set_characteristics: FsDeviceCharacteristics = 4..8;
    }
}

fscc_fixed! {
    /// A zero-copy view of FILE_FS_SECTOR_SIZE_INFORMATION ([MS-FSCC]
    /// 2.5.7 FileFsSectorSizeInformation, class 11): 28 bytes.
    view FileFsSectorSizeInformation;
    /// The values of FILE_FS_SECTOR_SIZE_INFORMATION.
    repr FileFsSectorSizeInformationRepr;
    what: "FILE_FS_SECTOR_SIZE_INFORMATION",
    len: 28,
    fields {
        /// LogicalBytesPerSector.
        logical_bytes_per_sector, set_logical_bytes_per_sector: u32 = 0..4;
        /// PhysicalBytesPerSectorForAtomicity.
        physical_bytes_per_sector_for_atomicity, set_physical_bytes_per_sector_for_atomicity: u32 = 4..8;
        /// PhysicalBytesPerSectorForPerformance.
        physical_bytes_per_sector_for_performance, set_physical_bytes_per_sector_for_performance: u32 = 8..12;
        /// FileSystemEffectivePhysicalBytesPerSectorForAtomicity.
        effective_physical_bytes_per_sector_for_atomicity, set_effective_physical_bytes_per_sector_for_atomicity: u32 = 12..16;
        /// Flags.
        flags, set_flags: SectorSizeFlags = 16..20;
        /// ByteOffsetForSectorAlignment (0xFFFFFFFF: unknown).
        byte_offset_for_sector_alignment, set_byte_offset_for_sector_alignment: u32 = 20..24;
        /// ByteOffsetForPartitionAlignment (0xFFFFFFFF: unknown).
        byte_offset_for_partition_alignment, set_byte_offset_for_partition_alignment: u32 = 24..28;
    }
}

/// FILE_FS_VOLUME_INFORMATION ([MS-FSCC] 2.5 FileFsVolumeInformation,
/// class 1): VolumeCreationTime (8), VolumeSerialNumber (4),
/// VolumeLabelLength (4), SupportsObjects (1), Reserved (1), VolumeLabel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileFsVolumeInformationRepr<'a> {
    /// VolumeCreationTime (FILETIME).
    pub volume_creation_time: u64,
    /// VolumeSerialNumber.
    pub volume_serial_number: u32,
    /// SupportsObjects.
    pub supports_objects: bool,
    /// VolumeLabel.
    pub volume_label: Utf16Str<'a>,
}

impl<'a> FileFsVolumeInformationRepr<'a> {
    const WHAT: &'static str = "FILE_FS_VOLUME_INFORMATION";
    /// Length of the fixed part: 18.
    pub const FIXED_LEN: usize = 18;

    /// Checks and reads `b`.
    pub fn from_bytes(b: &'a [u8]) -> Result<Self, Smb2Error> {
        need(Self::WHAT, b, Self::FIXED_LEN)?;
        let end = Self::FIXED_LEN.saturating_add(u32::read(b, 12..16) as usize);
        need(Self::WHAT, b, end)?;
        Ok(FileFsVolumeInformationRepr {
            volume_creation_time: u64::read(b, 0..8),
            volume_serial_number: u32::read(b, 8..12),
            supports_objects: bool::read(b, 16..17),
            volume_label: Utf16Str::from_utf16le(&b[Self::FIXED_LEN..end]),
        })
    }

    /// 18 + the label.
    pub fn buffer_len(&self) -> usize {
        Self::FIXED_LEN + self.volume_label.byte_len()
    }

    /// Writes the structure.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        let len = self.buffer_len();
        room(Self::WHAT, buf, len)?;
        let n: u32 = fit(
            Self::WHAT,
            "VolumeLabelLength",
            self.volume_label.byte_len(),
        )?;
        let buf = &mut buf[..len];
        buf[..Self::FIXED_LEN].fill(0);
        self.volume_creation_time.write(buf, 0..8);
        self.volume_serial_number.write(buf, 8..12);
        n.write(buf, 12..16);
        self.supports_objects.write(buf, 16..17);
        self.volume_label.write_to(&mut buf[Self::FIXED_LEN..]);
        Ok(len)
    }
}

/// FILE_FS_ATTRIBUTE_INFORMATION ([MS-FSCC] 2.5
/// FileFsAttributeInformation, class 5): FileSystemAttributes (4),
/// MaximumComponentNameLength (4), FileSystemNameLength (4),
/// FileSystemName.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileFsAttributeInformationRepr<'a> {
    /// FileSystemAttributes.
    pub file_system_attributes: FileSystemAttributes,
    /// MaximumComponentNameLength (characters; 255 is usual).
    pub maximum_component_name_length: u32,
    /// FileSystemName ("NTFS", ...).
    pub file_system_name: Utf16Str<'a>,
}

impl<'a> FileFsAttributeInformationRepr<'a> {
    const WHAT: &'static str = "FILE_FS_ATTRIBUTE_INFORMATION";
    /// Length of the fixed part: 12.
    pub const FIXED_LEN: usize = 12;

    /// Checks and reads `b`.
    pub fn from_bytes(b: &'a [u8]) -> Result<Self, Smb2Error> {
        need(Self::WHAT, b, Self::FIXED_LEN)?;
        let end = Self::FIXED_LEN.saturating_add(u32::read(b, 8..12) as usize);
        need(Self::WHAT, b, end)?;
        Ok(FileFsAttributeInformationRepr {
            file_system_attributes: FileSystemAttributes::read(b, 0..4),
            maximum_component_name_length: u32::read(b, 4..8),
            file_system_name: Utf16Str::from_utf16le(&b[Self::FIXED_LEN..end]),
        })
    }

    /// 12 + the name.
    pub fn buffer_len(&self) -> usize {
        Self::FIXED_LEN + self.file_system_name.byte_len()
    }

    /// Writes the structure.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        let len = self.buffer_len();
        room(Self::WHAT, buf, len)?;
        let n: u32 = fit(
            Self::WHAT,
            "FileSystemNameLength",
            self.file_system_name.byte_len(),
        )?;
        let buf = &mut buf[..len];
        self.file_system_attributes.write(buf, 0..4);
        self.maximum_component_name_length.write(buf, 4..8);
        n.write(buf, 8..12);
        self.file_system_name.write_to(&mut buf[Self::FIXED_LEN..]);
        Ok(len)
    }
}

/// FILE_FS_OBJECTID_INFORMATION ([MS-FSCC] 2.5
/// FileFsObjectIdInformation, class 8): ObjectId (16), ExtendedInfo (48).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileFsObjectIdInformationRepr {
    /// ObjectId: the volume's GUID.
    pub object_id: Guid,
    /// ExtendedInfo (opaque; zero when unused).
    pub extended_info: [u8; 48],
}

impl Default for FileFsObjectIdInformationRepr {
    fn default() -> Self {
        FileFsObjectIdInformationRepr {
            object_id: Guid::default(),
            extended_info: [0; 48],
        }
    }
}

impl FileFsObjectIdInformationRepr {
    const WHAT: &'static str = "FILE_FS_OBJECTID_INFORMATION";
    /// Length: 64.
    pub const LEN: usize = 64;

    /// Checks and reads `b`.
    pub fn from_bytes(b: &[u8]) -> Result<Self, Smb2Error> {
        need(Self::WHAT, b, Self::LEN)?;
        let mut extended_info = [0u8; 48];
        extended_info.copy_from_slice(&b[16..64]);
        Ok(FileFsObjectIdInformationRepr {
            object_id: Guid::read(b, 0..16),
            extended_info,
        })
    }

    /// 64.
    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Writes the structure.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        room(Self::WHAT, buf, Self::LEN)?;
        self.object_id.write(buf, 0..16);
        buf[16..64].copy_from_slice(&self.extended_info);
        Ok(Self::LEN)
    }
}
