//! Information class numbers: [MS-FSCC] 2.4 (file information classes, the
//! FileInfoClass of QUERY_INFO/SET_INFO with InfoType SMB2_0_INFO_FILE and
//! the FileInformationClass of QUERY_DIRECTORY) and 2.5 (file system
//! information classes, InfoType SMB2_0_INFO_FILESYSTEM).

wire_enum! {
    /// [MS-FSCC] 2.4 file information classes ([MS-SMB2] 2.2.33, 2.2.37,
    /// 2.2.39 list the ones SMB2 carries).
    pub struct FileInfoClass(u8) {
        /// FileDirectoryInformation (QUERY_DIRECTORY).
        FILE_DIRECTORY_INFORMATION = 0x01;
        /// FileFullDirectoryInformation (QUERY_DIRECTORY).
        FILE_FULL_DIRECTORY_INFORMATION = 0x02;
        /// FileBothDirectoryInformation (QUERY_DIRECTORY).
        FILE_BOTH_DIRECTORY_INFORMATION = 0x03;
        /// FileBasicInformation (query, set).
        FILE_BASIC_INFORMATION = 0x04;
        /// FileStandardInformation (query).
        FILE_STANDARD_INFORMATION = 0x05;
        /// FileInternalInformation (query).
        FILE_INTERNAL_INFORMATION = 0x06;
        /// FileEaInformation (query).
        FILE_EA_INFORMATION = 0x07;
        /// FileAccessInformation (query).
        FILE_ACCESS_INFORMATION = 0x08;
        /// FileNameInformation (query).
        FILE_NAME_INFORMATION = 0x09;
        /// FileRenameInformation (set).
        FILE_RENAME_INFORMATION = 0x0A;
        /// FileLinkInformation (set).
        FILE_LINK_INFORMATION = 0x0B;
        /// FileNamesInformation (QUERY_DIRECTORY).
        FILE_NAMES_INFORMATION = 0x0C;
        /// FileDispositionInformation (set).
        FILE_DISPOSITION_INFORMATION = 0x0D;
        /// FilePositionInformation (query, set).
        FILE_POSITION_INFORMATION = 0x0E;
        /// FileFullEaInformation (query, set).
        FILE_FULL_EA_INFORMATION = 0x0F;
        /// FileModeInformation (query, set).
        FILE_MODE_INFORMATION = 0x10;
        /// FileAlignmentInformation (query).
        FILE_ALIGNMENT_INFORMATION = 0x11;
        /// FileAllInformation (query).
        FILE_ALL_INFORMATION = 0x12;
        /// FileAllocationInformation (set).
        FILE_ALLOCATION_INFORMATION = 0x13;
        /// FileEndOfFileInformation (set).
        FILE_END_OF_FILE_INFORMATION = 0x14;
        /// FileAlternateNameInformation (query).
        FILE_ALTERNATE_NAME_INFORMATION = 0x15;
        /// FileStreamInformation (query).
        FILE_STREAM_INFORMATION = 0x16;
        /// FilePipeInformation (query, set).
        FILE_PIPE_INFORMATION = 0x17;
        /// FilePipeLocalInformation (query).
        FILE_PIPE_LOCAL_INFORMATION = 0x18;
        /// FilePipeRemoteInformation (query).
        FILE_PIPE_REMOTE_INFORMATION = 0x19;
        /// FileCompressionInformation (query).
        FILE_COMPRESSION_INFORMATION = 0x1C;
        /// FileQuotaInformation.
        FILE_QUOTA_INFORMATION = 0x20;
        /// FileNetworkOpenInformation (query).
        FILE_NETWORK_OPEN_INFORMATION = 0x22;
        /// FileAttributeTagInformation (query).
        FILE_ATTRIBUTE_TAG_INFORMATION = 0x23;
        /// FileIdBothDirectoryInformation (QUERY_DIRECTORY).
        FILE_ID_BOTH_DIRECTORY_INFORMATION = 0x25;
        /// FileIdFullDirectoryInformation (QUERY_DIRECTORY).
        FILE_ID_FULL_DIRECTORY_INFORMATION = 0x26;
        /// FileValidDataLengthInformation (set).
        FILE_VALID_DATA_LENGTH_INFORMATION = 0x27;
        /// FileShortNameInformation (set).
        FILE_SHORT_NAME_INFORMATION = 0x28;
        /// FileNormalizedNameInformation (query, SMB 3.1.1).
        FILE_NORMALIZED_NAME_INFORMATION = 0x30;
        /// FileIdInformation (query, SMB 3.x).
        FILE_ID_INFORMATION = 0x3B;
        /// FileIdExtdDirectoryInformation (QUERY_DIRECTORY).
        FILE_ID_EXTD_DIRECTORY_INFORMATION = 0x3C;
        /// FileDispositionInformationEx (set).
        FILE_DISPOSITION_INFORMATION_EX = 0x40;
        /// FileRenameInformationEx (set).
        FILE_RENAME_INFORMATION_EX = 0x41;
    }
}

wire_enum! {
    /// [MS-FSCC] 2.5 file system information classes ([MS-SMB2] 2.2.37
    /// with InfoType SMB2_0_INFO_FILESYSTEM).
    pub struct FsInfoClass(u8) {
        /// FileFsVolumeInformation.
        FILE_FS_VOLUME_INFORMATION = 0x01;
        /// FileFsLabelInformation (set).
        FILE_FS_LABEL_INFORMATION = 0x02;
        /// FileFsSizeInformation.
        FILE_FS_SIZE_INFORMATION = 0x03;
        /// FileFsDeviceInformation.
        FILE_FS_DEVICE_INFORMATION = 0x04;
        /// FileFsAttributeInformation.
        FILE_FS_ATTRIBUTE_INFORMATION = 0x05;
        /// FileFsControlInformation.
        FILE_FS_CONTROL_INFORMATION = 0x06;
        /// FileFsFullSizeInformation.
        FILE_FS_FULL_SIZE_INFORMATION = 0x07;
        /// FileFsObjectIdInformation.
        FILE_FS_OBJECT_ID_INFORMATION = 0x08;
        /// FileFsDriverPathInformation.
        FILE_FS_DRIVER_PATH_INFORMATION = 0x09;
        /// FileFsVolumeFlagsInformation.
        FILE_FS_VOLUME_FLAGS_INFORMATION = 0x0A;
        /// FileFsSectorSizeInformation.
        FILE_FS_SECTOR_SIZE_INFORMATION = 0x0B;
    }
}
