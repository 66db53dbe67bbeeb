//! The codecs a server needs for Linux cifs to mount and use a share:
//! QUERY_INFO, SET_INFO, QUERY_DIRECTORY, LOCK, CHANGE_NOTIFY and
//! OPLOCK_BREAK bodies ([MS-SMB2] 2.2.23 to 2.2.40), the [MS-FSCC]
//! information classes, directory entry packing (3.3.5.18), the create
//! contexts of 2.2.13.2/2.2.14.2, NETWORK_INTERFACE_INFO (2.2.32.5) and
//! the negotiate contexts cifs 3.1.1 sends (2.2.3.1.x).
//!
//! Three kinds of test, as in smb2_wire.rs and smb2_proptest.rs: byte
//! layouts written out by hand from the specification tables, round trips
//! (Repr -> emit -> parse == Repr), and property tests on hostile input
//! (never panic, verdicts equal an independent model of the receive rules,
//! accepted input re-emits to the same value).

use proptest::collection::vec;
use proptest::prelude::*;
use smbdirect_protocol::ntstatus::*;
use smbdirect_protocol::smb2::fscc::*;
use smbdirect_protocol::smb2::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Emits a body into a buffer prefilled with 0xEE (unwritten padding would
/// show) and checks the length returned.
fn emit<B: Smb2Body + ?Sized>(r: &B) -> Vec<u8> {
    let mut buf = vec![0xEEu8; r.buffer_len()];
    let n = r.emit(&mut buf).expect("emit");
    assert_eq!(n, buf.len(), "emit length == buffer_len");
    buf
}

/// Round trip through bytes; an emit into a buffer one byte short fails.
macro_rules! round_trip {
    ($repr_ty:ident, $value:expr) => {{
        let value = $value;
        let bytes = emit(&value);
        let back = $repr_ty::from_body(&bytes).expect("decode emitted bytes");
        assert_eq!(back, value);
        let mut short = vec![0u8; bytes.len() - 1];
        assert!(matches!(
            Smb2Body::emit(&value, &mut short),
            Err(Smb2Error::BufferTooSmall { .. })
        ));
        bytes
    }};
}

/// Emits an [MS-FSCC] Repr (inherent `emit`/`buffer_len`) into a
/// 0xEE-filled buffer, checking the length and the short-buffer failure.
macro_rules! fscc_bytes {
    ($value:expr) => {{
        let value = &$value;
        let mut buf = vec![0xEEu8; value.buffer_len()];
        assert_eq!(value.emit(&mut buf), Ok(buf.len()));
        if !buf.is_empty() {
            let mut short = vec![0u8; buf.len() - 1];
            assert!(matches!(
                value.emit(&mut short),
                Err(Smb2Error::BufferTooSmall { .. })
            ));
        }
        buf
    }};
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn utf16(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

const FILE_ID: FileId = FileId {
    persistent: 0x1122_3344_5566_7788,
    volatile: 0x99AA_BBCC_DDEE_FF00,
};

/// FileId as the wire carries it: Persistent then Volatile, little-endian.
const FILE_ID_BYTES: [u8; 16] = [
    0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0x00, 0xFF, 0xEE, 0xDD, 0xCC, 0xBB, 0xAA, 0x99,
];

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn is_invalid_parameter(e: &Smb2Error) -> bool {
    e.status() == STATUS_INVALID_PARAMETER
        && e.server_action() == ServerAction::FailRequest(STATUS_INVALID_PARAMETER)
}

// ---------------------------------------------------------------------------
// 2.2.37 / 2.2.38 QUERY_INFO
// ---------------------------------------------------------------------------

#[test]
fn query_info_request_for_file_all_information_matches_hand_written_bytes() {
    // As cifs asks for FileAllInformation: OutputBufferLength 100 + 2 *
    // PATH_MAX = 8292 = 0x2064, no input.
    let expected = cat(&[
        &[0x29, 0x00],             // StructureSize 41
        &[0x01],                   // InfoType SMB2_0_INFO_FILE
        &[0x12],                   // FileInfoClass FileAllInformation
        &[0x64, 0x20, 0x00, 0x00], // OutputBufferLength
        &[0x00, 0x00],             // InputBufferOffset (no input)
        &[0x00, 0x00],             // Reserved
        &[0x00, 0x00, 0x00, 0x00], // InputBufferLength
        &[0x00, 0x00, 0x00, 0x00], // AdditionalInformation
        &[0x00, 0x00, 0x00, 0x00], // Flags
        &FILE_ID_BYTES,            // FileId
        &[0x00],                   // Buffer (one byte)
    ]);
    let repr = QueryInfoRequestRepr {
        info_type: InfoType::FILE,
        file_info_class: FileInfoClass::FILE_ALL_INFORMATION.0,
        output_buffer_length: 0x2064,
        input: &[],
        additional_information: 0,
        flags: QueryInfoFlags::empty(),
        file_id: FILE_ID,
    };
    let b = round_trip!(QueryInfoRequestRepr, repr);
    assert_eq!(b, expected);
    assert_eq!(repr.file_class(), Some(FileInfoClass::FILE_ALL_INFORMATION));
    assert_eq!(repr.fs_class(), None);
    // The Buffer byte may be absent.
    assert_eq!(QueryInfoRequestRepr::from_body(&b[..40]), Ok(repr));
}

#[test]
fn query_info_request_input_buffer_sits_at_header_offset_104() {
    let input = [1u8, 2, 3, 4, 5];
    let repr = QueryInfoRequestRepr {
        info_type: InfoType::QUOTA,
        file_info_class: 0,
        output_buffer_length: 0x400,
        input: &input,
        additional_information: 0,
        flags: QueryInfoFlags::RESTART_SCAN,
        file_id: FILE_ID,
    };
    let b = round_trip!(QueryInfoRequestRepr, repr);
    assert_eq!(b.len(), 45);
    assert_eq!(le16(&b, 8), 104);
    assert_eq!(le32(&b, 12), 5);
    assert_eq!(le32(&b, 20), 1);
    assert_eq!(&b[40..], &input);
    let v = QueryInfoRequest::new_checked(&b[..]).unwrap();
    assert_eq!(v.input(), &input);
}

#[test]
fn query_info_request_for_a_security_descriptor_carries_the_parts_wanted() {
    let repr = QueryInfoRequestRepr {
        info_type: InfoType::SECURITY,
        file_info_class: 0,
        output_buffer_length: 0x1000,
        input: &[],
        additional_information: (AdditionalInformation::OWNER
            | AdditionalInformation::GROUP
            | AdditionalInformation::DACL)
            .bits(),
        flags: QueryInfoFlags::empty(),
        file_id: FILE_ID,
    };
    let b = round_trip!(QueryInfoRequestRepr, repr);
    assert_eq!(b[2], 3);
    assert_eq!(le32(&b, 16), 7);
    assert!(repr
        .security_information()
        .contains(AdditionalInformation::DACL));
}

#[test]
fn query_info_request_rejects_input_outside_the_body() {
    let repr = QueryInfoRequestRepr {
        info_type: InfoType::FILE,
        file_info_class: 4,
        output_buffer_length: 40,
        input: &[9; 8],
        additional_information: 0,
        flags: QueryInfoFlags::empty(),
        file_id: FILE_ID,
    };
    let good = emit(&repr);
    // Offset inside the fixed part.
    let mut b = good.clone();
    b[8..10].copy_from_slice(&103u16.to_le_bytes());
    let e = QueryInfoRequestRepr::from_body(&b).unwrap_err();
    assert!(matches!(
        e,
        Smb2Error::OutOfBounds {
            field: "InputBufferOffset",
            ..
        }
    ));
    assert!(is_invalid_parameter(&e));
    // Length past the end.
    let mut b = good.clone();
    b[12..16].copy_from_slice(&9u32.to_le_bytes());
    assert!(matches!(
        QueryInfoRequestRepr::from_body(&b),
        Err(Smb2Error::OutOfBounds { .. })
    ));
    // Length 0: the offset is ignored.
    let mut b = good;
    b[8..10].copy_from_slice(&0xFFFFu16.to_le_bytes());
    b[12..16].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(
        QueryInfoRequestRepr::from_body(&b).unwrap().input,
        &[] as &[u8]
    );
}

#[test]
fn query_info_request_rules_of_3_3_5_20() {
    let mut r = QueryInfoRequestRepr {
        info_type: InfoType::FILE,
        file_info_class: 5,
        output_buffer_length: 65536,
        input: &[],
        additional_information: 0,
        flags: QueryInfoFlags::empty(),
        file_id: FILE_ID,
    };
    assert_eq!(r.check_request_rules(65536), Ok(()));
    assert!(r.check_request_rules(65535).is_err());
    r.info_type = InfoType(9);
    let e = r.check_request_rules(65536).unwrap_err();
    assert!(is_invalid_parameter(&e));
}

#[test]
fn query_info_response_with_file_standard_information_matches_hand_written_bytes() {
    let std = FileStandardInformationRepr {
        allocation_size: 4096,
        end_of_file: 10,
        number_of_links: 1,
        delete_pending: false,
        directory: false,
    };
    let out = std.to_bytes();
    assert_eq!(
        out.to_vec(),
        cat(&[
            &[0x00, 0x10, 0, 0, 0, 0, 0, 0], // AllocationSize 4096
            &[0x0A, 0, 0, 0, 0, 0, 0, 0],    // EndOfFile 10
            &[0x01, 0, 0, 0],                // NumberOfLinks 1
            &[0x00],                         // DeletePending
            &[0x00],                         // Directory
            &[0x00, 0x00],                   // Reserved
        ])
    );
    let b = round_trip!(
        QueryInfoResponseRepr,
        QueryInfoResponseRepr { output: &out }
    );
    assert_eq!(
        &b[..8],
        &[0x09, 0x00, 0x48, 0x00, 0x18, 0x00, 0x00, 0x00],
        "StructureSize 9, OutputBufferOffset 72, OutputBufferLength 24"
    );
    assert_eq!(&b[8..], &out);
    let back = QueryInfoResponseRepr::from_body(&b).unwrap();
    assert_eq!(
        FileStandardInformationRepr::from_bytes(back.output),
        Ok(std)
    );
}

#[test]
fn query_info_response_built_in_place_equals_the_copying_emit() {
    let info = FileInternalInformationRepr {
        index_number: 0xABCD,
    };
    let mut body = vec![0xEEu8; 64];
    let n = info
        .emit(&mut body[QueryInfoResponseRepr::BUFFER_OFFSET..])
        .unwrap();
    let len = QueryInfoResponseRepr::emit_fixed(&mut body, n).unwrap();
    let copied = emit(&QueryInfoResponseRepr {
        output: &info.to_bytes(),
    });
    assert_eq!(&body[..len], &copied[..]);
    // With no output there is one zero Buffer byte.
    let mut body = [0xEEu8; 9];
    assert_eq!(QueryInfoResponseRepr::emit_fixed(&mut body, 0), Ok(9));
    assert_eq!(body, [9, 0, 72, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn query_info_output_is_truncated_with_buffer_overflow_or_refused() {
    assert_eq!(
        fit_query_info_output(102, 100, 4096),
        Ok((102, STATUS_SUCCESS))
    );
    assert_eq!(
        fit_query_info_output(300, 100, 200),
        Ok((200, STATUS_BUFFER_OVERFLOW))
    );
    assert_eq!(
        fit_query_info_output(300, 100, 99),
        Err(STATUS_INFO_LENGTH_MISMATCH)
    );
}

// ---------------------------------------------------------------------------
// 2.2.39 / 2.2.40 SET_INFO
// ---------------------------------------------------------------------------

#[test]
fn set_info_request_with_end_of_file_matches_hand_written_bytes() {
    let eof = FileEndOfFileInformationRepr {
        end_of_file: 0x1_0000_0000,
    }
    .to_bytes();
    let expected = cat(&[
        &[0x21, 0x00],                            // StructureSize 33
        &[0x01],                                  // InfoType FILE
        &[0x14],                                  // FileEndOfFileInformation
        &[0x08, 0x00, 0x00, 0x00],                // BufferLength 8
        &[0x60, 0x00],                            // BufferOffset 96
        &[0x00, 0x00],                            // Reserved
        &[0x00, 0x00, 0x00, 0x00],                // AdditionalInformation
        &FILE_ID_BYTES,                           // FileId
        &[0x00, 0x00, 0x00, 0x00, 0x01, 0, 0, 0], // EndOfFile
    ]);
    let repr = SetInfoRequestRepr {
        info_type: InfoType::FILE,
        file_info_class: FileInfoClass::FILE_END_OF_FILE_INFORMATION.0,
        data: &eof,
        additional_information: 0,
        file_id: FILE_ID,
    };
    let b = round_trip!(SetInfoRequestRepr, repr);
    assert_eq!(b, expected);
    let back = SetInfoRequestRepr::from_body(&b).unwrap();
    assert_eq!(
        back.file_class(),
        Some(FileInfoClass::FILE_END_OF_FILE_INFORMATION)
    );
    assert_eq!(
        FileEndOfFileInformationRepr::from_bytes(back.data)
            .unwrap()
            .end_of_file,
        0x1_0000_0000
    );
}

#[test]
fn set_info_rename_payload_is_the_smb2_form() {
    // FILE_RENAME_INFORMATION_TYPE_2: ReplaceIfExists 1, Reserved (7),
    // RootDirectory 0, FileNameLength 6, "a\b".
    let expected = cat(&[
        &[0x01],
        &[0; 7],
        &[0; 8],
        &[0x06, 0, 0, 0],
        &[0x61, 0x00, 0x5C, 0x00, 0x62, 0x00],
    ]);
    let rename = FileRenameInformationRepr {
        replace_if_exists: true,
        root_directory: 0,
        file_name: Utf16Str::new("a\\b"),
    };
    let b = fscc_bytes!(rename);
    assert_eq!(b, expected);
    let back = FileRenameInformationRepr::from_bytes(&b).unwrap();
    assert_eq!(back, rename);
    assert_eq!(back.file_name.decode().unwrap(), "a\\b");
    // The name must be present in full.
    let e = FileRenameInformationRepr::from_bytes(&b[..25]).unwrap_err();
    assert!(matches!(e, Smb2Error::Truncated { need: 26, .. }));
    assert_eq!(info_length_status(&e), STATUS_INFO_LENGTH_MISMATCH);
    // FileLinkInformation has the same layout.
    let link: FileLinkInformationRepr<'_> = FileLinkInformationRepr::from_bytes(&b).unwrap();
    assert!(link.replace_if_exists);
    // Carried in a SET_INFO request.
    let repr = SetInfoRequestRepr {
        info_type: InfoType::FILE,
        file_info_class: FileInfoClass::FILE_RENAME_INFORMATION.0,
        data: &b,
        additional_information: 0,
        file_id: FILE_ID,
    };
    let body = round_trip!(SetInfoRequestRepr, repr);
    assert_eq!(&body[32..], &expected[..]);
}

#[test]
fn set_info_disposition_allocation_and_basic_decode() {
    assert!(
        FileDispositionInformationRepr::from_bytes(&[1])
            .unwrap()
            .delete_pending
    );
    assert!(
        !FileDispositionInformationRepr::from_bytes(&[0])
            .unwrap()
            .delete_pending
    );
    assert!(matches!(
        FileDispositionInformationRepr::from_bytes(&[]),
        Err(Smb2Error::Truncated {
            need: 1,
            have: 0,
            ..
        })
    ));
    assert_eq!(
        FileAllocationInformationRepr::from_bytes(&[0, 0x20, 0, 0, 0, 0, 0, 0])
            .unwrap()
            .allocation_size,
        0x2000
    );
    // FileBasicInformation with "do not change" times (0) and "stop
    // updating" (-1).
    let mut b = [0u8; 40];
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    b[32..36].copy_from_slice(&0x20u32.to_le_bytes());
    let basic = FileBasicInformationRepr::from_bytes(&b).unwrap();
    assert_eq!(basic.creation_time, 0);
    assert_eq!(basic.last_access_time, u64::MAX);
    assert_eq!(basic.file_attributes, FileAttributes::ARCHIVE);
    assert!(matches!(
        FileBasicInformationRepr::from_bytes(&b[..36]),
        Err(Smb2Error::Truncated { need: 40, .. })
    ));
}

#[test]
fn set_info_response_is_structure_size_2() {
    let b = round_trip!(SetInfoResponseRepr, SetInfoResponseRepr);
    assert_eq!(b, [0x02, 0x00]);
    assert!(matches!(
        SetInfoResponseRepr::from_body(&[0x04, 0x00]),
        Err(Smb2Error::StructureSize {
            expected: 2,
            found: 4,
            ..
        })
    ));
}

#[test]
fn set_info_request_rules_of_3_3_5_21() {
    let r = SetInfoRequestRepr {
        info_type: InfoType::FILE,
        file_info_class: 13,
        data: &[1; 16],
        additional_information: 0,
        file_id: FILE_ID,
    };
    assert_eq!(r.check_request_rules(16), Ok(()));
    assert!(r.check_request_rules(15).is_err());
    let bad = SetInfoRequestRepr {
        info_type: InfoType(0),
        ..r
    };
    assert!(bad.check_request_rules(16).is_err());
}

// ---------------------------------------------------------------------------
// 2.2.33 / 2.2.34 QUERY_DIRECTORY
// ---------------------------------------------------------------------------

#[test]
fn query_directory_request_matches_hand_written_bytes() {
    let expected = cat(&[
        &[0x21, 0x00],             // StructureSize 33
        &[0x25],                   // FileIdBothDirectoryInformation
        &[0x01],                   // SMB2_RESTART_SCANS
        &[0x00, 0x00, 0x00, 0x00], // FileIndex
        &FILE_ID_BYTES,            // FileId
        &[0x60, 0x00],             // FileNameOffset 96
        &[0x02, 0x00],             // FileNameLength 2
        &[0x00, 0x00, 0x01, 0x00], // OutputBufferLength 65536
        &[0x2A, 0x00],             // "*"
    ]);
    let repr = QueryDirectoryRequestRepr {
        file_information_class: FileInfoClass::FILE_ID_BOTH_DIRECTORY_INFORMATION,
        flags: QueryDirectoryFlags::RESTART_SCANS,
        file_index: 0,
        file_id: FILE_ID,
        file_name: Utf16Str::new("*"),
        output_buffer_length: 65536,
    };
    let b = round_trip!(QueryDirectoryRequestRepr, repr);
    assert_eq!(b, expected);
    assert_eq!(
        repr.directory_class(),
        Some(DirectoryInfoClass::IdBothDirectory)
    );
    assert!(repr.restarts());
    assert_eq!(repr.check_request_rules(65536), Ok(()));
    assert!(repr.check_request_rules(65535).is_err());
    // A pattern overrunning the body.
    let mut bad = b.clone();
    bad[26..28].copy_from_slice(&4u16.to_le_bytes());
    assert!(matches!(
        QueryDirectoryRequestRepr::from_body(&bad),
        Err(Smb2Error::OutOfBounds {
            field: "FileNameOffset",
            ..
        })
    ));
    // Empty pattern: 33 bytes with one Buffer byte.
    let empty = QueryDirectoryRequestRepr {
        file_name: Utf16Str::EMPTY,
        ..repr
    };
    assert_eq!(round_trip!(QueryDirectoryRequestRepr, empty).len(), 33);
}

#[test]
fn query_directory_response_carries_packed_entries_at_72() {
    let mut out = [0u8; 256];
    let e = DirectoryEntry {
        file_name: Utf16Str::new("f"),
        ..DirectoryEntry::default()
    };
    let (n, len) =
        pack_directory_entries(DirectoryInfoClass::Names, [e, e], &mut out, false).unwrap();
    assert_eq!((n, len), (2, 16 + 14));
    let b = round_trip!(
        QueryDirectoryResponseRepr,
        QueryDirectoryResponseRepr {
            output: &out[..len]
        }
    );
    assert_eq!(le16(&b, 2), 72);
    assert_eq!(le32(&b, 4), 30);
    let back = QueryDirectoryResponseRepr::from_body(&b).unwrap();
    let names: Vec<_> = DirectoryEntryIter::new(DirectoryInfoClass::Names, back.output)
        .map(|r| r.unwrap().file_name.decode().unwrap())
        .collect();
    assert_eq!(names, ["f", "f"]);
}

// ---------------------------------------------------------------------------
// [MS-FSCC] directory classes and packing
// ---------------------------------------------------------------------------

fn sample_entry(name: &'static str) -> DirectoryEntry<'static> {
    DirectoryEntry {
        file_index: 0x0102_0304,
        creation_time: 0x1111_1111_1111_1111,
        last_access_time: 0x2222_2222_2222_2222,
        last_write_time: 0x3333_3333_3333_3333,
        change_time: 0x4444_4444_4444_4444,
        end_of_file: 0x5555,
        allocation_size: 0x6000,
        file_attributes: FileAttributes::ARCHIVE,
        ea_size: 0x77,
        short_name: Utf16Str::new("A~1"),
        file_id: 0x8888_9999_AAAA_BBBB,
        file_name: Utf16Str::new(name),
    }
}

#[test]
fn id_both_directory_entries_are_laid_out_and_chained_as_2_4_specifies() {
    // Entry 1 ("a"): 104 + 2 = 106 bytes; entry 2 starts at 112 (8-byte
    // aligned), "bc": 104 + 4 = 108 bytes, ends at 220.
    let mut buf = vec![0xEEu8; 220];
    let mut w = DirectoryEntryWriter::new(DirectoryInfoClass::IdBothDirectory, &mut buf);
    assert_eq!(w.push(&sample_entry("a")), Ok(true));
    assert_eq!(w.push(&sample_entry("bc")), Ok(true));
    assert_eq!((w.count(), w.len()), (2, 220));
    assert_eq!(w.push(&sample_entry("")), Ok(false), "no room left");
    let b = buf;
    // Entry 1.
    assert_eq!(le32(&b, 0), 112, "NextEntryOffset");
    assert_eq!(le32(&b, 4), 0x0102_0304, "FileIndex");
    assert_eq!(le64(&b, 8), 0x1111_1111_1111_1111, "CreationTime");
    assert_eq!(le64(&b, 16), 0x2222_2222_2222_2222, "LastAccessTime");
    assert_eq!(le64(&b, 24), 0x3333_3333_3333_3333, "LastWriteTime");
    assert_eq!(le64(&b, 32), 0x4444_4444_4444_4444, "ChangeTime");
    assert_eq!(le64(&b, 40), 0x5555, "EndOfFile");
    assert_eq!(le64(&b, 48), 0x6000, "AllocationSize");
    assert_eq!(le32(&b, 56), 0x20, "FileAttributes");
    assert_eq!(le32(&b, 60), 2, "FileNameLength");
    assert_eq!(le32(&b, 64), 0x77, "EaSize");
    assert_eq!(b[68], 6, "ShortNameLength");
    assert_eq!(b[69], 0, "Reserved1");
    assert_eq!(&b[70..76], &utf16("A~1")[..]);
    assert_eq!(&b[76..94], &[0u8; 18], "rest of ShortName zero");
    assert_eq!(&b[94..96], &[0, 0], "Reserved2");
    assert_eq!(le64(&b, 96), 0x8888_9999_AAAA_BBBB, "FileId");
    assert_eq!(&b[104..106], &utf16("a")[..]);
    assert_eq!(&b[106..112], &[0u8; 6], "alignment padding zeroed");
    // Entry 2.
    assert_eq!(le32(&b, 112), 0, "last NextEntryOffset");
    assert_eq!(le32(&b, 112 + 60), 4);
    assert_eq!(&b[216..220], &utf16("bc")[..]);
    // Walk back.
    let got: Vec<_> = DirectoryEntryIter::new(DirectoryInfoClass::IdBothDirectory, &b)
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(got, vec![sample_entry("a"), sample_entry("bc")]);
}

#[test]
fn packing_stops_at_the_first_entry_that_does_not_fit() {
    let entries = [sample_entry("a"), sample_entry("bc"), sample_entry("d")];
    let mut buf = vec![0u8; 219];
    let r = pack_directory_entries(
        DirectoryInfoClass::IdBothDirectory,
        entries,
        &mut buf,
        false,
    );
    assert_eq!(r, Ok((1, 106)));
    assert_eq!(le32(&buf, 0), 0, "the only entry is the last");
    // SMB2_RETURN_SINGLE_ENTRY.
    let mut buf = vec![0u8; 4096];
    assert_eq!(
        pack_directory_entries(DirectoryInfoClass::IdBothDirectory, entries, &mut buf, true),
        Ok((1, 106))
    );
    // Not even the first fits.
    let mut buf = vec![0u8; 105];
    assert_eq!(
        pack_directory_entries(
            DirectoryInfoClass::IdBothDirectory,
            entries,
            &mut buf,
            false
        ),
        Ok((0, 0))
    );
}

#[test]
fn every_directory_class_has_its_2_4_fixed_length_and_fields() {
    // (class, value, FileName offset, EaSize?, ShortName?, FileId at)
    let table = [
        (DirectoryInfoClass::Directory, 0x01, 64, false, false, None),
        (
            DirectoryInfoClass::FullDirectory,
            0x02,
            68,
            true,
            false,
            None,
        ),
        (
            DirectoryInfoClass::BothDirectory,
            0x03,
            94,
            true,
            true,
            None,
        ),
        (DirectoryInfoClass::Names, 0x0C, 12, false, false, None),
        (
            DirectoryInfoClass::IdBothDirectory,
            0x25,
            104,
            true,
            true,
            Some(96),
        ),
        (
            DirectoryInfoClass::IdFullDirectory,
            0x26,
            80,
            true,
            false,
            Some(72),
        ),
    ];
    for (class, value, fixed, ea, short, id_at) in table {
        assert_eq!(class.class(), FileInfoClass(value));
        assert_eq!(
            DirectoryInfoClass::from_class(FileInfoClass(value)),
            Some(class)
        );
        assert_eq!(class.fixed_len(), fixed, "{class:?}");
        let e = sample_entry("xyz");
        let mut buf = vec![0xEEu8; fixed + 6];
        assert_eq!(
            pack_directory_entries(class, [e], &mut buf, false),
            Ok((1, fixed + 6))
        );
        assert_eq!(&buf[fixed..], &utf16("xyz")[..], "{class:?} FileName");
        let name_len_at = if class == DirectoryInfoClass::Names {
            8
        } else {
            60
        };
        assert_eq!(le32(&buf, name_len_at), 6, "{class:?}");
        if ea {
            assert_eq!(le32(&buf, 64), 0x77, "{class:?} EaSize");
        }
        if short {
            assert_eq!(buf[68], 6, "{class:?} ShortNameLength");
        }
        if let Some(at) = id_at {
            assert_eq!(le64(&buf, at), 0x8888_9999_AAAA_BBBB, "{class:?} FileId");
        }
        let back = DirectoryEntryIter::new(class, &buf)
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(back, project(class, &e), "{class:?}");
    }
    assert_eq!(
        DirectoryInfoClass::from_class(FileInfoClass::FILE_BASIC_INFORMATION),
        None
    );
}

#[test]
fn names_information_chains_three_entries_on_8_byte_boundaries() {
    // 12 + 2 = 14 -> next at 16; 12 + 4 = 16 -> next at 32; 12 + 6 = 18.
    let mut buf = vec![0xEEu8; 64];
    let entries = ["x", "yy", "zzz"].map(|n| DirectoryEntry {
        file_index: 7,
        file_name: Utf16Str::new(n),
        ..DirectoryEntry::default()
    });
    let (n, len) =
        pack_directory_entries(DirectoryInfoClass::Names, entries, &mut buf, false).unwrap();
    assert_eq!((n, len), (3, 50));
    assert_eq!(
        &buf[..50],
        &cat(&[
            &[16, 0, 0, 0, 7, 0, 0, 0, 2, 0, 0, 0, b'x', 0, 0, 0],
            &[16, 0, 0, 0, 7, 0, 0, 0, 4, 0, 0, 0, b'y', 0, b'y', 0],
            &[0, 0, 0, 0, 7, 0, 0, 0, 6, 0, 0, 0, b'z', 0, b'z', 0, b'z', 0],
        ])[..]
    );
}

#[test]
fn directory_walk_rejects_misaligned_or_overrunning_entries() {
    let mut buf = vec![0u8; 64];
    let entries = ["x", "yy"].map(|n| DirectoryEntry {
        file_name: Utf16Str::new(n),
        ..DirectoryEntry::default()
    });
    let (_, len) =
        pack_directory_entries(DirectoryInfoClass::Names, entries, &mut buf, false).unwrap();
    let good = &buf[..len];
    fn walk(b: &[u8]) -> Vec<Result<DirectoryEntry<'_>, Smb2Error>> {
        DirectoryEntryIter::new(DirectoryInfoClass::Names, b).collect()
    }
    assert!(walk(good).iter().all(Result::is_ok));
    let mut b = good.to_vec();
    b[0] = 12; // not a multiple of 8
    assert!(matches!(
        walk(&b)[0],
        Err(Smb2Error::Misaligned {
            field: "NextEntryOffset",
            ..
        })
    ));
    let mut b = good.to_vec();
    b[0] = 64; // past the buffer
    assert!(matches!(walk(&b)[0], Err(Smb2Error::OutOfBounds { .. })));
    let mut b = good.to_vec();
    b[8] = 6; // name runs past NextEntryOffset (12 + 6 > 16)
    assert!(matches!(walk(&b)[0], Err(Smb2Error::Truncated { .. })));
    let mut b = good.to_vec();
    b.truncate(len - 1); // last name cut short
    let r = walk(&b);
    assert_eq!(r.len(), 2);
    assert!(r[1].is_err());
    // ShortNameLength over 24.
    let mut buf = vec![0u8; 128];
    pack_directory_entries(
        DirectoryInfoClass::BothDirectory,
        [sample_entry("q")],
        &mut buf,
        false,
    )
    .unwrap();
    buf[68] = 25;
    assert!(matches!(
        DirectoryEntryIter::new(DirectoryInfoClass::BothDirectory, &buf).next(),
        Some(Err(Smb2Error::Malformed { .. }))
    ));
    assert!(DirectoryEntryIter::new(DirectoryInfoClass::Names, &[])
        .next()
        .is_none());
}

#[test]
fn a_short_name_over_24_bytes_cannot_be_written() {
    let e = DirectoryEntry {
        short_name: Utf16Str::new("ABCDEFGH.IJKL"),
        ..sample_entry("n")
    };
    let mut buf = vec![0u8; 256];
    let mut w = DirectoryEntryWriter::new(DirectoryInfoClass::BothDirectory, &mut buf);
    assert!(matches!(w.push(&e), Err(Smb2Error::TooLarge { .. })));
    assert!(w.is_empty());
    // Classes without a ShortName ignore it.
    let mut w = DirectoryEntryWriter::new(DirectoryInfoClass::FullDirectory, &mut buf);
    assert_eq!(w.push(&e), Ok(true));
}

// ---------------------------------------------------------------------------
// [MS-FSCC] file classes
// ---------------------------------------------------------------------------

#[test]
fn file_basic_information_matches_hand_written_bytes() {
    let basic = FileBasicInformationRepr {
        creation_time: 1,
        last_access_time: 2,
        last_write_time: 3,
        change_time: 4,
        file_attributes: FileAttributes::ARCHIVE | FileAttributes::READONLY,
    };
    let b = fscc_bytes!(basic);
    assert_eq!(
        b,
        cat(&[
            &[1, 0, 0, 0, 0, 0, 0, 0],
            &[2, 0, 0, 0, 0, 0, 0, 0],
            &[3, 0, 0, 0, 0, 0, 0, 0],
            &[4, 0, 0, 0, 0, 0, 0, 0],
            &[0x21, 0, 0, 0],
            &[0, 0, 0, 0], // Reserved
        ])
    );
    assert_eq!(FileBasicInformationRepr::from_bytes(&b), Ok(basic));
    let v = FileBasicInformation::new_checked(&b[..]).unwrap();
    assert_eq!(v.change_time(), 4);
    assert!(FileBasicInformation::new_checked(&b[..39]).is_err());
}

#[test]
fn file_all_information_places_its_members_at_2_4_2_offsets() {
    let all = FileAllInformationRepr {
        basic: FileBasicInformationRepr {
            creation_time: 0x11,
            last_access_time: 0x12,
            last_write_time: 0x13,
            change_time: 0x14,
            file_attributes: FileAttributes::DIRECTORY,
        },
        standard: FileStandardInformationRepr {
            allocation_size: 0,
            end_of_file: 0,
            number_of_links: 1,
            delete_pending: false,
            directory: true,
        },
        internal: FileInternalInformationRepr {
            index_number: 0xFEED,
        },
        ea: FileEaInformationRepr { ea_size: 0 },
        access: FileAccessInformationRepr {
            access_flags: AccessMask::GENERIC_READ,
        },
        position: FilePositionInformationRepr {
            current_byte_offset: 0,
        },
        mode: FileModeInformationRepr { mode: 0x20 },
        alignment: FileAlignmentInformationRepr {
            alignment_requirement: 0,
        },
        file_name: Utf16Str::new("\\"),
    };
    let b = fscc_bytes!(all);
    assert_eq!(b.len(), 102);
    assert_eq!(le64(&b, 0), 0x11);
    assert_eq!(le32(&b, 32), 0x10, "Basic.FileAttributes");
    assert_eq!(le32(&b, 56), 1, "Standard.NumberOfLinks");
    assert_eq!(b[61], 1, "Standard.Directory");
    assert_eq!(le64(&b, 64), 0xFEED, "Internal.IndexNumber");
    assert_eq!(le32(&b, 72), 0, "Ea.EaSize");
    assert_eq!(le32(&b, 76), 0x8000_0000, "Access.AccessFlags");
    assert_eq!(le64(&b, 80), 0, "Position");
    assert_eq!(le32(&b, 88), 0x20, "Mode");
    assert_eq!(le32(&b, 92), 0, "Alignment");
    assert_eq!(le32(&b, 96), 2, "FileNameLength");
    assert_eq!(&b[100..], &[0x5C, 0x00]);
    assert_eq!(FileAllInformationRepr::from_bytes(&b), Ok(all));
    assert!(matches!(
        FileAllInformationRepr::from_bytes(&b[..101]),
        Err(Smb2Error::Truncated { need: 102, .. })
    ));
    assert!(matches!(
        FileAllInformationRepr::from_bytes(&b[..99]),
        Err(Smb2Error::Truncated { need: 100, .. })
    ));
}

#[test]
fn small_file_classes_have_their_2_4_sizes() {
    assert_eq!(
        fscc_bytes!(FileInternalInformationRepr { index_number: 3 }),
        [3, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(
        fscc_bytes!(FileEaInformationRepr { ea_size: 9 }),
        [9, 0, 0, 0]
    );
    assert_eq!(
        fscc_bytes!(FileAccessInformationRepr {
            access_flags: AccessMask::FILE_READ_DATA | AccessMask::SYNCHRONIZE
        }),
        [1, 0, 0x10, 0]
    );
    assert_eq!(
        fscc_bytes!(FilePositionInformationRepr {
            current_byte_offset: 0x100
        }),
        [0, 1, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(
        fscc_bytes!(FileModeInformationRepr { mode: 2 }),
        [2, 0, 0, 0]
    );
    assert_eq!(
        fscc_bytes!(FileAlignmentInformationRepr {
            alignment_requirement: 0x1FF
        }),
        [0xFF, 1, 0, 0]
    );
    assert_eq!(
        fscc_bytes!(FileAttributeTagInformationRepr {
            file_attributes: FileAttributes::NORMAL,
            reparse_tag: 0
        }),
        [0x80, 0, 0, 0, 0, 0, 0, 0]
    );
    let comp = FileCompressionInformationRepr {
        compressed_file_size: 10,
        compression_format: 0,
        compression_unit_shift: 1,
        chunk_shift: 2,
        cluster_shift: 3,
    };
    assert_eq!(
        fscc_bytes!(comp),
        [10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 0, 0, 0]
    );
    let net = FileNetworkOpenInformationRepr {
        creation_time: 1,
        last_access_time: 2,
        last_write_time: 3,
        change_time: 4,
        allocation_size: 5,
        end_of_file: 6,
        file_attributes: FileAttributes::ARCHIVE,
    };
    let b = fscc_bytes!(net);
    assert_eq!(b.len(), 56);
    assert_eq!(le64(&b, 32), 5);
    assert_eq!(le64(&b, 40), 6);
    assert_eq!(le32(&b, 48), 0x20);
    assert_eq!(&b[52..], &[0, 0, 0, 0]);
    assert_eq!(FileNetworkOpenInformationRepr::from_bytes(&b), Ok(net));
    let name = FileNameInformationRepr {
        file_name: Utf16Str::new("\\d\\f"),
    };
    let b = fscc_bytes!(name);
    assert_eq!(&b[..4], &[8, 0, 0, 0]);
    assert_eq!(FileNameInformationRepr::from_bytes(&b), Ok(name));
}

#[test]
fn file_stream_information_reports_the_default_data_stream() {
    let entries = [StreamEntry {
        stream_size: 10,
        stream_allocation_size: 4096,
        stream_name: Utf16Str::new(DEFAULT_DATA_STREAM_NAME),
    }];
    let b = fscc_bytes!(FileStreamInformationRepr { entries: &entries });
    assert_eq!(
        b,
        cat(&[
            &[0, 0, 0, 0],                // NextEntryOffset
            &[14, 0, 0, 0],               // StreamNameLength
            &[10, 0, 0, 0, 0, 0, 0, 0],   // StreamSize
            &[0, 0x10, 0, 0, 0, 0, 0, 0], // StreamAllocationSize
            &utf16("::$DATA"),
        ])
    );
    let back: Vec<_> = FileStreamInformationRepr::iter(&b)
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(back, entries);
    // Two entries: the second at align8(38) = 40.
    let two = [entries[0], entries[0]];
    let b = fscc_bytes!(FileStreamInformationRepr { entries: &two });
    assert_eq!(b.len(), 78);
    assert_eq!(le32(&b, 0), 40);
    assert_eq!(&b[38..40], &[0, 0]);
    assert_eq!(FileStreamInformationRepr::iter(&b).count(), 2);
    // A directory has none.
    assert!(fscc_bytes!(FileStreamInformationRepr::default()).is_empty());
}

// ---------------------------------------------------------------------------
// [MS-FSCC] 2.5 file system classes
// ---------------------------------------------------------------------------

#[test]
fn file_system_classes_match_hand_written_bytes() {
    let attr = FileFsAttributeInformationRepr {
        file_system_attributes: FileSystemAttributes::CASE_SENSITIVE_SEARCH
            | FileSystemAttributes::CASE_PRESERVED_NAMES
            | FileSystemAttributes::UNICODE_ON_DISK,
        maximum_component_name_length: 255,
        file_system_name: Utf16Str::new("NTFS"),
    };
    let b = fscc_bytes!(attr);
    assert_eq!(
        b,
        cat(&[
            &[7, 0, 0, 0],
            &[0xFF, 0, 0, 0],
            &[8, 0, 0, 0],
            &[b'N', 0, b'T', 0, b'F', 0, b'S', 0],
        ])
    );
    assert_eq!(FileFsAttributeInformationRepr::from_bytes(&b), Ok(attr));
    assert!(FileFsAttributeInformationRepr::from_bytes(&b[..19]).is_err());

    let vol = FileFsVolumeInformationRepr {
        volume_creation_time: 0,
        volume_serial_number: 0x1234_5678,
        supports_objects: false,
        volume_label: Utf16Str::EMPTY,
    };
    let b = fscc_bytes!(vol);
    assert_eq!(
        b,
        [0, 0, 0, 0, 0, 0, 0, 0, 0x78, 0x56, 0x34, 0x12, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(FileFsVolumeInformationRepr::from_bytes(&b), Ok(vol));
    let labelled = FileFsVolumeInformationRepr {
        volume_label: Utf16Str::new("share"),
        supports_objects: true,
        ..vol
    };
    let b = fscc_bytes!(labelled);
    assert_eq!(le32(&b, 12), 10);
    assert_eq!(b[16], 1);
    assert_eq!(FileFsVolumeInformationRepr::from_bytes(&b), Ok(labelled));

    let full = FileFsFullSizeInformationRepr {
        total_allocation_units: 1000,
        caller_available_allocation_units: 500,
        actual_available_allocation_units: 600,
        sectors_per_allocation_unit: 8,
        bytes_per_sector: 512,
    };
    let b = fscc_bytes!(full);
    assert_eq!(
        b,
        cat(&[
            &1000u64.to_le_bytes(),
            &500u64.to_le_bytes(),
            &600u64.to_le_bytes(),
            &8u32.to_le_bytes(),
            &512u32.to_le_bytes(),
        ])
    );
    let size = FileFsSizeInformationRepr {
        total_allocation_units: 1000,
        available_allocation_units: 500,
        sectors_per_allocation_unit: 8,
        bytes_per_sector: 512,
    };
    assert_eq!(fscc_bytes!(size).len(), 24);
    let dev = FileFsDeviceInformationRepr {
        device_type: FILE_DEVICE_DISK,
        characteristics: FsDeviceCharacteristics::REMOTE_DEVICE,
    };
    assert_eq!(fscc_bytes!(dev), [7, 0, 0, 0, 0x10, 0, 0, 0]);
    let sector = FileFsSectorSizeInformationRepr {
        logical_bytes_per_sector: 512,
        physical_bytes_per_sector_for_atomicity: 4096,
        physical_bytes_per_sector_for_performance: 4096,
        effective_physical_bytes_per_sector_for_atomicity: 4096,
        flags: SectorSizeFlags::ALIGNED_DEVICE | SectorSizeFlags::PARTITION_ALIGNED_ON_DEVICE,
        byte_offset_for_sector_alignment: 0,
        byte_offset_for_partition_alignment: 0,
    };
    let b = fscc_bytes!(sector);
    assert_eq!(b.len(), 28);
    assert_eq!(le32(&b, 16), 3);
    assert_eq!(FileFsSectorSizeInformationRepr::from_bytes(&b), Ok(sector));
    let oid = FileFsObjectIdInformationRepr {
        object_id: Guid::from_bytes([7; 16]),
        extended_info: [0; 48],
    };
    let b = fscc_bytes!(oid);
    assert_eq!(&b[..16], &[7; 16]);
    assert_eq!(&b[16..], &[0; 48]);
    assert_eq!(FileFsObjectIdInformationRepr::from_bytes(&b), Ok(oid));
}

#[test]
fn info_class_numbers_follow_fscc() {
    let file = [
        (FileInfoClass::FILE_BASIC_INFORMATION, 4),
        (FileInfoClass::FILE_STANDARD_INFORMATION, 5),
        (FileInfoClass::FILE_INTERNAL_INFORMATION, 6),
        (FileInfoClass::FILE_EA_INFORMATION, 7),
        (FileInfoClass::FILE_ACCESS_INFORMATION, 8),
        (FileInfoClass::FILE_RENAME_INFORMATION, 10),
        (FileInfoClass::FILE_DISPOSITION_INFORMATION, 13),
        (FileInfoClass::FILE_POSITION_INFORMATION, 14),
        (FileInfoClass::FILE_MODE_INFORMATION, 16),
        (FileInfoClass::FILE_ALIGNMENT_INFORMATION, 17),
        (FileInfoClass::FILE_ALL_INFORMATION, 18),
        (FileInfoClass::FILE_ALLOCATION_INFORMATION, 19),
        (FileInfoClass::FILE_END_OF_FILE_INFORMATION, 20),
        (FileInfoClass::FILE_STREAM_INFORMATION, 22),
        (FileInfoClass::FILE_COMPRESSION_INFORMATION, 28),
        (FileInfoClass::FILE_NETWORK_OPEN_INFORMATION, 34),
        (FileInfoClass::FILE_ATTRIBUTE_TAG_INFORMATION, 35),
        (FileInfoClass::FILE_ID_BOTH_DIRECTORY_INFORMATION, 37),
        (FileInfoClass::FILE_ID_FULL_DIRECTORY_INFORMATION, 38),
    ];
    for (c, v) in file {
        assert_eq!(c.0, v, "{c:?}");
    }
    let fs = [
        (FsInfoClass::FILE_FS_VOLUME_INFORMATION, 1),
        (FsInfoClass::FILE_FS_SIZE_INFORMATION, 3),
        (FsInfoClass::FILE_FS_DEVICE_INFORMATION, 4),
        (FsInfoClass::FILE_FS_ATTRIBUTE_INFORMATION, 5),
        (FsInfoClass::FILE_FS_FULL_SIZE_INFORMATION, 7),
        (FsInfoClass::FILE_FS_OBJECT_ID_INFORMATION, 8),
        (FsInfoClass::FILE_FS_SECTOR_SIZE_INFORMATION, 11),
    ];
    for (c, v) in fs {
        assert_eq!(c.0, v, "{c:?}");
    }
    assert_eq!(
        format!("{:?}", FileInfoClass(18)),
        "FileInfoClass::FILE_ALL_INFORMATION"
    );
}

// ---------------------------------------------------------------------------
// 2.2.26 / 2.2.27 LOCK
// ---------------------------------------------------------------------------

fn lock_body() -> Vec<u8> {
    cat(&[
        &[0x30, 0x00],             // StructureSize 48
        &[0x02, 0x00],             // LockCount 2
        &[0x35, 0x00, 0x00, 0x00], // LockSequenceNumber 5, LockSequenceIndex 3
        &FILE_ID_BYTES,
        &[0, 0x10, 0, 0, 0, 0, 0, 0], // Offset 0x1000
        &[0, 0x02, 0, 0, 0, 0, 0, 0], // Length 0x200
        &[0x12, 0, 0, 0],             // EXCLUSIVE | FAIL_IMMEDIATELY
        &[0, 0, 0, 0],                // Reserved
        &[0, 0x30, 0, 0, 0, 0, 0, 0], // Offset 0x3000
        &[1, 0, 0, 0, 0, 0, 0, 0],    // Length 1
        &[0x11, 0, 0, 0],             // SHARED | FAIL_IMMEDIATELY
        &[0, 0, 0, 0],
    ])
}

#[test]
fn lock_request_matches_hand_written_bytes() {
    let elements = [
        LockElement {
            offset: 0x1000,
            length: 0x200,
            flags: LockFlags::EXCLUSIVE | LockFlags::FAIL_IMMEDIATELY,
        },
        LockElement {
            offset: 0x3000,
            length: 1,
            flags: LockFlags::SHARED | LockFlags::FAIL_IMMEDIATELY,
        },
    ];
    let repr = LockRequestRepr {
        lock_sequence: (3 << 4) | 5,
        file_id: FILE_ID,
        locks: LockElements::new(&elements),
    };
    let b = round_trip!(LockRequestRepr, repr);
    assert_eq!(b, lock_body());
    let back = LockRequestRepr::from_body(&b).unwrap();
    assert_eq!(back.lock_sequence_number(), 5);
    assert_eq!(back.lock_sequence_index(), 3);
    assert_eq!(back.locks.len(), 2);
    assert_eq!(back.locks.get(1), Some(elements[1]));
    assert_eq!(back.locks.get(2), None);
    assert_eq!(
        back.operation(),
        Ok(LockOperation::Lock {
            fail_immediately: true
        })
    );
}

#[test]
fn lock_request_needs_lock_count_elements_and_at_least_one() {
    let good = lock_body();
    let e = LockRequestRepr::from_body(&good[..71]).unwrap_err();
    assert!(matches!(
        e,
        Smb2Error::Truncated {
            need: 72,
            have: 71,
            ..
        }
    ));
    let mut zero = good.clone();
    zero[2] = 0;
    let e = LockRequestRepr::from_body(&zero).unwrap_err();
    assert!(matches!(e, Smb2Error::Malformed { .. }));
    assert!(is_invalid_parameter(&e));
    // StructureSize stays 48 for any count: one element is the minimum.
    let mut one = good[..48].to_vec();
    one[2] = 1;
    assert_eq!(LockRequestRepr::from_body(&one).unwrap().locks.len(), 1);
    let empty = LockRequestRepr {
        lock_sequence: 0,
        file_id: FILE_ID,
        locks: LockElements::new(&[]),
    };
    assert!(matches!(
        empty.emit(&mut [0u8; 64]),
        Err(Smb2Error::Malformed { .. })
    ));
}

#[test]
fn lock_element_rules_of_3_3_5_14() {
    let el = |flags: u32| LockElement {
        offset: 0,
        length: 10,
        flags: LockFlags(flags),
    };
    let op = |els: &[LockElement]| {
        LockRequestRepr {
            lock_sequence: 0,
            file_id: FILE_ID,
            locks: LockElements::new(els),
        }
        .operation()
    };
    assert_eq!(op(&[el(0x04), el(0x04)]), Ok(LockOperation::Unlock));
    assert_eq!(op(&[el(0x04), el(0x14)]), Ok(LockOperation::Unlock));
    assert_eq!(op(&[el(0x04), el(0x01)]), Err(STATUS_INVALID_PARAMETER));
    assert_eq!(
        op(&[el(0x02)]),
        Ok(LockOperation::Lock {
            fail_immediately: false
        })
    );
    assert_eq!(op(&[el(0x12), el(0x02)]), Err(STATUS_INVALID_PARAMETER));
    assert_eq!(op(&[el(0x12), el(0x04)]), Err(STATUS_INVALID_PARAMETER));
    assert_eq!(op(&[el(0x03)]), Err(STATUS_INVALID_PARAMETER));
    assert_eq!(op(&[el(0x00)]), Err(STATUS_INVALID_PARAMETER));
    for ok in [0x01, 0x02, 0x11, 0x12, 0x04] {
        assert!(LockFlags(ok).is_valid_combination());
    }
    for bad in [0x00, 0x03, 0x05, 0x10, 0x14, 0x13] {
        assert!(!LockFlags(bad).is_valid_combination(), "{bad:#x}");
    }
    let wrap = LockElement {
        offset: u64::MAX,
        length: 2,
        flags: LockFlags::EXCLUSIVE,
    };
    assert!(wrap.range_overflows());
    assert_eq!(op(&[wrap]), Err(STATUS_INVALID_LOCK_RANGE));
    assert!(!LockElement {
        offset: u64::MAX,
        length: 1,
        ..wrap
    }
    .range_overflows());
    assert!(!LockElement {
        offset: u64::MAX,
        length: 0,
        ..wrap
    }
    .range_overflows());
}

#[test]
fn lock_response_is_structure_size_4() {
    assert_eq!(
        round_trip!(LockResponseRepr, LockResponseRepr),
        [4, 0, 0, 0]
    );
}

// ---------------------------------------------------------------------------
// 2.2.35 / 2.2.36 CHANGE_NOTIFY, 2.2.24 OPLOCK_BREAK
// ---------------------------------------------------------------------------

#[test]
fn change_notify_request_matches_hand_written_bytes() {
    let repr = ChangeNotifyRequestRepr {
        flags: ChangeNotifyFlags::WATCH_TREE,
        output_buffer_length: 0x800,
        file_id: FILE_ID,
        completion_filter: CompletionFilter::FILE_NAME
            | CompletionFilter::DIR_NAME
            | CompletionFilter::ATTRIBUTES,
    };
    let b = round_trip!(ChangeNotifyRequestRepr, repr);
    assert_eq!(
        b,
        cat(&[
            &[0x20, 0x00],
            &[0x01, 0x00],
            &[0x00, 0x08, 0x00, 0x00],
            &FILE_ID_BYTES,
            &[0x07, 0, 0, 0],
            &[0, 0, 0, 0],
        ])
    );
    let out = [1u8, 2, 3];
    let b = round_trip!(
        ChangeNotifyResponseRepr,
        ChangeNotifyResponseRepr { output: &out }
    );
    assert_eq!(b, [9, 0, 72, 0, 3, 0, 0, 0, 1, 2, 3]);
}

#[test]
fn oplock_break_acknowledgments_are_told_apart_by_structure_size() {
    let oplock = OplockBreakRepr::Oplock(OplockBreakAckRepr {
        oplock_level: OplockLevel::II,
        file_id: FILE_ID,
    });
    let b = round_trip!(OplockBreakRepr, oplock);
    assert_eq!(
        b,
        cat(&[&[0x18, 0x00, 0x01, 0x00], &[0, 0, 0, 0], &FILE_ID_BYTES])
    );
    let lease = OplockBreakRepr::Lease(LeaseBreakAckRepr {
        flags: LeaseFlags::empty(),
        lease_key: [0xAB; 16],
        lease_state: LeaseState::READ_CACHING,
        lease_duration: 0,
    });
    let b = round_trip!(OplockBreakRepr, lease);
    assert_eq!(
        b,
        cat(&[
            &[0x24, 0x00, 0x00, 0x00],
            &[0, 0, 0, 0],
            &[0xAB; 16],
            &[1, 0, 0, 0],
            &[0; 8]
        ])
    );
    let e = OplockBreakRepr::from_body(&[44, 0, 0, 0]).unwrap_err();
    assert!(matches!(
        e,
        Smb2Error::StructureSize {
            expected: 24,
            found: 44,
            ..
        }
    ));
    assert!(matches!(
        OplockBreakRepr::from_body(&b[..35]),
        Err(Smb2Error::Truncated { need: 36, .. })
    ));
}

// ---------------------------------------------------------------------------
// Dispatch: Message::request_body / ResponseBody::parse
// ---------------------------------------------------------------------------

/// (command, request StructureSize, minimal valid request body).
fn new_requests() -> Vec<(Command, Vec<u8>)> {
    let mut lock = vec![0u8; 48];
    lock[0] = 48;
    lock[2] = 1;
    lock[40] = 2; // EXCLUSIVE
    let minimal = |ss: u8| {
        let mut b = vec![0u8; usize::from(ss)];
        b[0] = ss;
        b
    };
    vec![
        (Command::Lock, lock),
        (Command::QueryDirectory, minimal(33)),
        (Command::ChangeNotify, minimal(32)),
        (Command::QueryInfo, minimal(41)),
        (Command::SetInfo, minimal(33)),
        (Command::OplockBreak, minimal(24)),
        (Command::OplockBreak, minimal(36)),
    ]
}

#[test]
fn the_new_requests_are_decoded_by_dispatch_and_by_message() {
    for (cmd, body) in new_requests() {
        let r = RequestBody::parse(cmd, &body).unwrap();
        assert_eq!(r.command(), cmd);
        assert_eq!(r.as_body().command(), Some(cmd));
        let again = emit(r.as_body());
        assert_eq!(RequestBody::parse(cmd, &again), Ok(r), "{cmd:?} re-emits");
        // Through a whole message.
        let h = HeaderRepr::request(cmd, 7);
        let mut buf = vec![0u8; 64 + body.len()];
        emit_message(&h, r.as_body(), &mut buf).unwrap();
        let m = compound(&buf).next().unwrap().unwrap();
        assert_eq!(m.request_body().unwrap(), r);
        // Wrong StructureSize and truncation: STATUS_INVALID_PARAMETER.
        let mut bad = body.clone();
        bad[0] ^= 0x40;
        let e = RequestBody::parse(cmd, &bad).unwrap_err();
        assert!(matches!(e, Smb2Error::StructureSize { .. }), "{cmd:?}");
        assert!(is_invalid_parameter(&e));
        for k in 0..body.len() & !1 {
            let e = RequestBody::parse(cmd, &body[..k]).unwrap_err();
            assert!(is_invalid_parameter(&e), "{cmd:?} at {k}: {e:?}");
        }
    }
    let body = emit(&QueryInfoRequestRepr {
        info_type: InfoType::FILESYSTEM,
        file_info_class: FsInfoClass::FILE_FS_FULL_SIZE_INFORMATION.0,
        output_buffer_length: 32,
        input: &[],
        additional_information: 0,
        flags: QueryInfoFlags::empty(),
        file_id: FILE_ID,
    });
    let m = RequestBody::parse(Command::QueryInfo, &body).unwrap();
    let RequestBody::QueryInfo(q) = m else {
        panic!("{m:?}")
    };
    assert_eq!(
        q.fs_class(),
        Some(FsInfoClass::FILE_FS_FULL_SIZE_INFORMATION)
    );
}

#[test]
fn the_new_responses_are_decoded_by_dispatch() {
    let out = [5u8; 10];
    let bodies: Vec<(Command, Vec<u8>)> = vec![
        (Command::Lock, emit(&LockResponseRepr)),
        (
            Command::QueryDirectory,
            emit(&QueryDirectoryResponseRepr { output: &out }),
        ),
        (
            Command::ChangeNotify,
            emit(&ChangeNotifyResponseRepr { output: &out }),
        ),
        (
            Command::QueryInfo,
            emit(&QueryInfoResponseRepr { output: &out }),
        ),
        (Command::SetInfo, emit(&SetInfoResponseRepr)),
        (
            Command::OplockBreak,
            emit(&OplockBreakRepr::Oplock(OplockBreakAckRepr::default())),
        ),
    ];
    for (cmd, body) in bodies {
        let h = HeaderRepr::request(cmd, 1).response_to(STATUS_SUCCESS);
        let r = ResponseBody::parse(&h, &body).unwrap();
        assert_eq!(r.as_body().command(), Some(cmd));
        assert_eq!(emit(r.as_body()), body);
    }
    // QUERY_INFO truncated with STATUS_BUFFER_OVERFLOW still carries its
    // body; an error status with a 9-byte body is an ERROR response.
    let body = emit(&QueryInfoResponseRepr { output: &out });
    let h = HeaderRepr::request(Command::QueryInfo, 1).response_to(STATUS_BUFFER_OVERFLOW);
    assert!(matches!(
        ResponseBody::parse(&h, &body),
        Ok(ResponseBody::QueryInfo(q)) if q.output == out
    ));
    let h = HeaderRepr::request(Command::QueryInfo, 1).response_to(STATUS_ACCESS_DENIED);
    assert!(matches!(
        ResponseBody::parse(&h, &emit(&ErrorResponseRepr::EMPTY)),
        Ok(ResponseBody::Error(_))
    ));
    let h = HeaderRepr::request(Command::QueryDirectory, 1).response_to(STATUS_NO_MORE_FILES);
    assert!(matches!(
        ResponseBody::parse(&h, &emit(&ErrorResponseRepr::EMPTY)),
        Ok(ResponseBody::Error(_))
    ));
}

// ---------------------------------------------------------------------------
// 2.2.13.2 / 2.2.14.2 create contexts
// ---------------------------------------------------------------------------

#[test]
fn create_contexts_cifs_sends_are_recognised() {
    let lease_v2: Vec<u8> = cat(&[
        &[0x11; 16],   // LeaseKey
        &[7, 0, 0, 0], // R | H | W
        &[4, 0, 0, 0], // PARENT_LEASE_KEY_SET
        &[0; 8],       // LeaseDuration
        &[0x22; 16],   // ParentLeaseKey
        &[3, 0],       // Epoch
        &[0, 0],       // Reserved
    ]);
    let ts = 0x01DA_0000_0000_0001u64.to_le_bytes();
    let dh2q = cat(&[&[0x10, 0x27, 0, 0], &[0; 4], &[0; 8], &[0x33; 16]]);
    let ctxs = [
        CreateContext::new(SMB2_CREATE_QUERY_MAXIMAL_ACCESS_REQUEST, &[]),
        CreateContext::new(SMB2_CREATE_QUERY_MAXIMAL_ACCESS_REQUEST, &ts),
        CreateContext::new(SMB2_CREATE_QUERY_ON_DISK_ID, &[]),
        CreateContext::new(SMB2_CREATE_REQUEST_LEASE, &lease_v2),
        CreateContext::new(SMB2_CREATE_REQUEST_LEASE, &lease_v2[..32]),
        CreateContext::new(SMB2_CREATE_DURABLE_HANDLE_REQUEST_V2, &dh2q),
        CreateContext::new(SMB2_CREATE_POSIX_CONTEXT, &[0xA4, 0x01, 0, 0]),
        CreateContext::new(SMB2_CREATE_SD_BUFFER, &[1, 2, 3]),
    ];
    // Through a CREATE request on the wire.
    let req = CreateRequestRepr {
        security_flags: 0,
        requested_oplock_level: OplockLevel::LEASE,
        impersonation_level: ImpersonationLevel::IMPERSONATION,
        smb_create_flags: 0,
        desired_access: AccessMask::GENERIC_READ,
        file_attributes: FileAttributes::empty(),
        share_access: ShareAccess::READ,
        create_disposition: CreateDisposition::OPEN,
        create_options: CreateOptions::empty(),
        name: Utf16Str::new("f"),
        create_contexts: CreateContextList::new(&ctxs),
    };
    let b = emit(&req);
    let back = CreateRequestRepr::from_body(&b).unwrap();
    let got: Vec<_> = back
        .create_contexts
        .requests()
        .collect::<Result<_, _>>()
        .unwrap();
    let v2 = LeaseRequest {
        lease_key: [0x11; 16],
        lease_state: LeaseState::READ_CACHING
            | LeaseState::HANDLE_CACHING
            | LeaseState::WRITE_CACHING,
        lease_flags: LeaseFlags::PARENT_LEASE_KEY_SET,
        lease_duration: 0,
        v2: Some(LeaseRequestV2 {
            parent_lease_key: [0x22; 16],
            epoch: 3,
        }),
    };
    assert_eq!(
        got,
        vec![
            CreateContextRequest::MaximalAccess(MaximalAccessRequest { timestamp: None }),
            CreateContextRequest::MaximalAccess(MaximalAccessRequest {
                timestamp: Some(0x01DA_0000_0000_0001)
            }),
            CreateContextRequest::QueryOnDiskId,
            CreateContextRequest::Lease(v2),
            CreateContextRequest::Lease(LeaseRequest { v2: None, ..v2 }),
            CreateContextRequest::DurableHandleV2(DurableHandleRequestV2 {
                timeout: 10000,
                flags: 0,
                create_guid: Guid::from_bytes([0x33; 16]),
            }),
            CreateContextRequest::Posix { mode: 0o644 },
            CreateContextRequest::Other(CreateContext::new(SMB2_CREATE_SD_BUFFER, &[1, 2, 3])),
        ]
    );
    assert_eq!(&v2.to_bytes()[..], &lease_v2[..]);
    assert_eq!(v2.data_len(), 52);
    // Short Data of a known name is refused.
    assert!(matches!(
        CreateContextRequest::parse(&CreateContext::new(SMB2_CREATE_REQUEST_LEASE, &[0; 31])),
        Err(Smb2Error::Truncated { need: 32, .. })
    ));
    assert!(CreateContextRequest::parse(&CreateContext::new(
        SMB2_CREATE_QUERY_MAXIMAL_ACCESS_REQUEST,
        &[0; 4]
    ))
    .is_err());
}

#[test]
fn create_response_contexts_mxac_and_qfid_match_hand_written_bytes() {
    let mxac = MaximalAccessResponse {
        query_status: STATUS_SUCCESS,
        maximal_access: AccessMask(0x001F_01FF),
    };
    assert_eq!(mxac.to_bytes(), [0, 0, 0, 0, 0xFF, 0x01, 0x1F, 0x00]);
    let qfid = QueryOnDiskIdResponse {
        disk_file_id: 0x1234,
        volume_id: 0x99,
    };
    let qb = qfid.to_bytes();
    assert_eq!(
        &qb[..16],
        &cat(&[&0x1234u64.to_le_bytes(), &0x99u64.to_le_bytes()])[..]
    );
    assert_eq!(&qb[16..], &[0; 16]);
    let mb = mxac.to_bytes();
    let ctxs = [
        CreateContext::new(SMB2_CREATE_QUERY_MAXIMAL_ACCESS_RESPONSE, &mb),
        CreateContext::new(SMB2_CREATE_QUERY_ON_DISK_ID, &qb),
    ];
    let rsp = CreateResponseRepr {
        oplock_level: OplockLevel::NONE,
        flags: CreateResponseFlags::empty(),
        create_action: CreateAction::OPENED,
        creation_time: 0,
        last_access_time: 0,
        last_write_time: 0,
        change_time: 0,
        allocation_size: 0,
        end_of_file: 0,
        file_attributes: FileAttributes::NORMAL,
        file_id: FILE_ID,
        create_contexts: CreateContextList::new(&ctxs),
    };
    let b = emit(&rsp);
    // Contexts at body offset 88: "MxAc" context is 16 + 4 name, Data at
    // 24, 8 bytes -> 32; "QFid" at 88 + 32.
    let c = &b[88..];
    assert_eq!(le32(c, 0), 32, "Next");
    assert_eq!(le16(c, 4), 16, "NameOffset");
    assert_eq!(le16(c, 6), 4, "NameLength");
    assert_eq!(le16(c, 10), 24, "DataOffset");
    assert_eq!(le32(c, 12), 8, "DataLength");
    assert_eq!(&c[16..20], b"MxAc");
    assert_eq!(&c[24..32], &mb);
    assert_eq!(&c[32 + 16..32 + 20], b"QFid");
    assert_eq!(le32(c, 32 + 12), 32);
    let back = CreateResponseRepr::from_body(&b).unwrap();
    let got = back
        .create_contexts
        .find(SMB2_CREATE_QUERY_MAXIMAL_ACCESS_RESPONSE)
        .unwrap();
    assert_eq!(MaximalAccessResponse::parse(got.data), Ok(mxac));
    let got = back
        .create_contexts
        .find(SMB2_CREATE_QUERY_ON_DISK_ID)
        .unwrap();
    assert_eq!(QueryOnDiskIdResponse::parse(got.data), Ok(qfid));
}

// ---------------------------------------------------------------------------
// FSCTLs: network interfaces, validate negotiate, DFS referrals
// ---------------------------------------------------------------------------

#[test]
fn network_interface_info_matches_hand_written_bytes() {
    let v4 = NetworkInterfaceInfoRepr {
        if_index: 2,
        capability: InterfaceCapability::RSS_CAPABLE | InterfaceCapability::RDMA_CAPABLE,
        link_speed: 100_000_000_000,
        address: IpAddr::V4(Ipv4Addr::new(192, 168, 1, 10)),
    };
    let v6 = NetworkInterfaceInfoRepr {
        if_index: 2,
        capability: InterfaceCapability::RDMA_CAPABLE,
        link_speed: 100_000_000_000,
        address: IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1)),
    };
    let entries = [v4, v6];
    let list = NetworkInterfaceInfoList { entries: &entries };
    let b = fscc_bytes!(list);
    assert_eq!(b.len(), 304);
    let first = cat(&[
        &[0x98, 0, 0, 0],                         // Next 152
        &[2, 0, 0, 0],                            // IfIndex
        &[3, 0, 0, 0],                            // RSS | RDMA
        &[0, 0, 0, 0],                            // Reserved
        &[0x00, 0xE8, 0x76, 0x48, 0x17, 0, 0, 0], // LinkSpeed 100 Gb/s
        &[0x02, 0x00],                            // Family InterNetwork
        &[0x00, 0x00],                            // Port
        &[192, 168, 1, 10],                       // IPv4Address
        &[0; 8],                                  // Reserved
    ]);
    assert_eq!(&b[..40], &first[..]);
    assert!(b[40..152].iter().all(|&x| x == 0));
    let s = &b[152..];
    assert_eq!(le32(s, 0), 0, "last Next");
    assert_eq!(le16(s, 24), 0x17, "InterNetworkV6");
    assert_eq!(&s[26..32], &[0; 6], "Port, FlowInfo");
    assert_eq!(s[32], 0xfe);
    assert_eq!(s[33], 0x80);
    assert_eq!(s[47], 1);
    assert_eq!(&s[48..52], &[0; 4], "ScopeId");
    let back: Vec<_> = NetworkInterfaceInfoList::iter(&b)
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(back, entries);
    // Unknown family.
    let mut bad = b.clone();
    bad[24] = 9;
    assert!(matches!(
        NetworkInterfaceInfoList::iter(&bad).next(),
        Some(Err(Smb2Error::Malformed { .. }))
    ));
    // Carried as the output of an IOCTL response.
    let rsp = IoctlResponseRepr {
        ctl_code: FSCTL_QUERY_NETWORK_INTERFACE_INFO,
        file_id: FileId::ANY,
        input: &[],
        output: &b,
        flags: 0,
    };
    let body = emit(&rsp);
    let back = IoctlResponseRepr::from_body(&body).unwrap();
    assert_eq!(NetworkInterfaceInfoList::iter(back.output).count(), 2);
}

#[test]
fn validate_negotiate_info_is_checked_against_the_negotiate_request() {
    let guid = Guid::from_bytes([9; 16]);
    let req = ValidateNegotiateInfoRequestRepr {
        capabilities: Capabilities(0x44),
        guid,
        security_mode: SecurityMode(1),
        dialects: U16Array::new(&[0x0300, 0x0302]),
    };
    let mut b = vec![0u8; req.buffer_len()];
    req.emit(&mut b).unwrap();
    let v = ValidateNegotiateInfoRequest::new_checked(&b[..]).unwrap();
    let back = ValidateNegotiateInfoRequestRepr::parse(&v).unwrap();
    assert!(back.matches_negotiate(
        Capabilities(0x44),
        guid,
        SecurityMode(1),
        U16Array::new(&[0x0300, 0x0302])
    ));
    assert!(!back.matches_negotiate(
        Capabilities(0x44),
        guid,
        SecurityMode(1),
        U16Array::new(&[0x0302, 0x0300])
    ));
    assert!(!back.matches_negotiate(
        Capabilities(0x40),
        guid,
        SecurityMode(1),
        U16Array::new(&[0x0300, 0x0302])
    ));
}

#[test]
fn dfs_referral_request_is_recognised_and_answered_fs_driver_required() {
    let input = cat(&[&[4, 0], &utf16("\\\\srv\\share"), &[0, 0]]);
    let req = IoctlRequestRepr::fsctl(FSCTL_DFS_GET_REFERRALS, FileId::ANY, &input, 4096);
    let b = emit(&req);
    let v = IoctlRequest::new_checked(&b[..]).unwrap();
    let d = v.dfs_referral_request().unwrap().unwrap();
    assert_eq!(d.max_referral_level, 4);
    assert_eq!(d.request_file_name.decode().unwrap(), "\\\\srv\\share");
    assert!(v.validate_negotiate_info().is_none());
    assert!(matches!(
        DfsReferralRequest::parse(&[4]),
        Err(Smb2Error::Truncated { .. })
    ));
    // No terminator: all of the rest.
    assert_eq!(
        DfsReferralRequest::parse(&[1, 0, b'a', 0])
            .unwrap()
            .request_file_name
            .decode()
            .unwrap(),
        "a"
    );
    assert_eq!(STATUS_FS_DRIVER_REQUIRED.0, 0xC000_019C);
}

// ---------------------------------------------------------------------------
// 2.2.3.1.x negotiate contexts cifs 3.1.1 sends
// ---------------------------------------------------------------------------

#[test]
fn every_negotiate_context_cifs_sends_is_parsed_and_unknown_ones_kept() {
    let comp = CompressionCapabilities {
        flags: CompressionCapabilityFlags::CHAINED,
        algorithms: U16Array::new(&[
            CompressionAlgorithm::LZ77.0,
            CompressionAlgorithm::PATTERN_V1.0,
        ]),
    };
    let mut comp_data = vec![0u8; comp.data_len()];
    assert_eq!(comp.emit_data(&mut comp_data), Ok(12));
    assert_eq!(comp_data, [2, 0, 0, 0, 1, 0, 0, 0, 2, 0, 4, 0]);
    let netname = utf16("srv");
    let transport = TransportCapabilities {
        flags: TransportCapabilityFlags::ACCEPT_TRANSPORT_LEVEL_SECURITY,
    }
    .to_bytes();
    let salt = [0x5A; 32];
    let ctxs = [
        NegotiateContext::PreauthIntegrity(PreauthIntegrityCapabilities {
            hash_algorithms: U16Array::new(&[HashAlgorithm::SHA_512.0]),
            salt: &salt,
        }),
        NegotiateContext::Encryption(EncryptionCapabilities {
            ciphers: U16Array::new(&[Cipher::AES_256_GCM.0, Cipher::AES_128_GCM.0]),
        }),
        NegotiateContext::Other {
            context_type: NegotiateContextType::COMPRESSION_CAPABILITIES.0,
            data: &comp_data,
        },
        NegotiateContext::Other {
            context_type: NegotiateContextType::NETNAME_NEGOTIATE_CONTEXT_ID.0,
            data: &netname,
        },
        NegotiateContext::Other {
            context_type: NegotiateContextType::TRANSPORT_CAPABILITIES.0,
            data: &transport,
        },
        NegotiateContext::RdmaTransform(RdmaTransformCapabilities {
            transform_ids: U16Array::new(&[RdmaTransformId::NONE.0]),
        }),
        NegotiateContext::Signing(SigningCapabilities {
            signing_algorithms: U16Array::new(&[
                SigningAlgorithm::AES_GMAC.0,
                SigningAlgorithm::AES_CMAC.0,
            ]),
        }),
        NegotiateContext::Other {
            context_type: SMB2_POSIX_EXTENSIONS_AVAILABLE,
            data: &POSIX_EXTENSIONS_GUID,
        },
        NegotiateContext::Other {
            context_type: 0x7777,
            data: &[1, 2, 3],
        },
    ];
    let req = NegotiateRequestRepr {
        security_mode: SecurityMode(1),
        capabilities: Capabilities(0x7F),
        client_guid: Guid::from_bytes([1; 16]),
        dialects: U16Array::new(&[0x0300, 0x0302, 0x0311]),
        negotiate_contexts: NegotiateContextList::new(&ctxs),
    };
    let b = emit(&req);
    let back = NegotiateRequestRepr::from_body(&b).unwrap();
    assert_eq!(back, req);
    let list = back.negotiate_contexts;
    assert_eq!(list.len(), 9);
    let c = list
        .find(NegotiateContextType::COMPRESSION_CAPABILITIES)
        .unwrap();
    assert_eq!(c.compression(), Some(Ok(comp)));
    let n = list
        .find(NegotiateContextType::NETNAME_NEGOTIATE_CONTEXT_ID)
        .unwrap();
    assert_eq!(n.netname().unwrap().decode().unwrap(), "srv");
    let t = list
        .find(NegotiateContextType::TRANSPORT_CAPABILITIES)
        .unwrap();
    assert_eq!(
        t.transport().unwrap().unwrap().flags,
        TransportCapabilityFlags::ACCEPT_TRANSPORT_LEVEL_SECURITY
    );
    assert!(list.iter().any(|c| c.is_posix_extensions()));
    assert_eq!(list.iter().filter(|c| c.is_posix_extensions()).count(), 1);
    let Some(NegotiateContext::Signing(s)) = list.find(NegotiateContextType::SIGNING_CAPABILITIES)
    else {
        panic!("signing context")
    };
    assert_eq!(s.signing_algorithms.get(0), Some(2), "AES-GMAC = 2");
    assert_eq!(SigningAlgorithm::AES_CMAC.0, 1);
    // Accessors of the wrong type say None.
    assert_eq!(c.netname(), None);
    assert_eq!(n.compression(), None);
    // A malformed compression context is reported by its accessor only.
    assert!(matches!(
        NegotiateContext::Other {
            context_type: 3,
            data: &[0, 0, 0, 0, 0, 0, 0, 0]
        }
        .compression(),
        Some(Err(Smb2Error::Malformed { .. }))
    ));
}

#[test]
fn signing_capabilities_are_emitted_in_a_negotiate_response_context() {
    let ctx = NegotiateContext::Signing(SigningCapabilities {
        signing_algorithms: U16Array::new(&[SigningAlgorithm::AES_CMAC.0]),
    });
    let list = [ctx];
    let l = NegotiateContextList::new(&list);
    assert_eq!(l.byte_len(), 8 + 4);
    assert_eq!(
        l.find(NegotiateContextType::SIGNING_CAPABILITIES),
        Some(ctx)
    );
}

#[test]
fn new_ntstatus_values_follow_ms_erref() {
    for (s, v) in [
        (STATUS_NO_MORE_FILES, 0x8000_0006),
        (STATUS_NO_SUCH_FILE, 0xC000_000F),
        (STATUS_FILE_LOCK_CONFLICT, 0xC000_0054),
        (STATUS_LOCK_NOT_GRANTED, 0xC000_0055),
        (STATUS_RANGE_NOT_LOCKED, 0xC000_007E),
        (STATUS_NOT_SAME_DEVICE, 0xC000_00D4),
        (STATUS_DELETE_PENDING, 0xC000_0056),
        (STATUS_CANNOT_DELETE, 0xC000_0121),
        (STATUS_INVALID_INFO_CLASS, 0xC000_0003),
        (STATUS_INFO_LENGTH_MISMATCH, 0xC000_0004),
        (STATUS_FS_DRIVER_REQUIRED, 0xC000_019C),
        (STATUS_NOTIFY_ENUM_DIR, 0x0000_010C),
        (STATUS_INVALID_HANDLE, 0xC000_0008),
        (STATUS_SHARING_VIOLATION, 0xC000_0043),
        (STATUS_OBJECT_PATH_SYNTAX_BAD, 0xC000_003B),
        (STATUS_NO_EAS_ON_FILE, 0xC000_0052),
        (STATUS_INVALID_LOCK_RANGE, 0xC000_01A1),
    ] {
        assert_eq!(s.0, v, "{s:?}");
        assert!(s.name().is_some());
    }
    assert!(!STATUS_NO_MORE_FILES.is_error());
    assert!(STATUS_NO_SUCH_FILE.is_error());
}

// ---------------------------------------------------------------------------
// Property tests: hostile input never panics and matches a model
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Ok,
    Truncated,
    StructureSize,
    OutOfBounds,
    Malformed,
    Other,
}

fn verdict<T>(r: &Result<T, Smb2Error>) -> Verdict {
    match r {
        Ok(_) => Verdict::Ok,
        Err(Smb2Error::Truncated { .. }) => Verdict::Truncated,
        Err(Smb2Error::StructureSize { .. }) => Verdict::StructureSize,
        Err(Smb2Error::OutOfBounds { .. }) => Verdict::OutOfBounds,
        Err(Smb2Error::Malformed { .. }) => Verdict::Malformed,
        Err(_) => Verdict::Other,
    }
}

/// Little-endian read of `w` bytes at `at` (the model's own).
fn rd(b: &[u8], at: usize, w: usize) -> u64 {
    (0..w).fold(0u64, |v, i| v | u64::from(b[at + i]) << (8 * i))
}

/// [MS-SMB2] receive rules for a body with StructureSize `ss` and at most
/// one (offset, length) buffer counted from the header.
fn model_one_region(b: &[u8], ss: u16, region: Option<(usize, usize, usize, usize)>) -> Verdict {
    if b.len() < 2 {
        return Verdict::Truncated;
    }
    if rd(b, 0, 2) != u64::from(ss) {
        return Verdict::StructureSize;
    }
    let fixed = usize::from(ss & !1);
    if b.len() < fixed {
        return Verdict::Truncated;
    }
    if let Some((oa, ow, la, lw)) = region {
        let (off, len) = (rd(b, oa, ow), rd(b, la, lw));
        if len != 0 && (off < 64 + fixed as u64 || off + len > 64 + b.len() as u64) {
            return Verdict::OutOfBounds;
        }
    }
    Verdict::Ok
}

fn model_lock(b: &[u8]) -> Verdict {
    match model_one_region(b, 48, None) {
        Verdict::Ok => {}
        v => return v,
    }
    let count = rd(b, 2, 2) as usize;
    if count == 0 {
        Verdict::Malformed
    } else if b.len() < 24 + 24 * count {
        Verdict::Truncated
    } else {
        Verdict::Ok
    }
}

fn model_oplock_break(b: &[u8]) -> Verdict {
    if b.len() >= 2 && rd(b, 0, 2) == 36 {
        model_one_region(b, 36, None)
    } else {
        model_one_region(b, 24, None)
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    QueryInfoReq,
    QueryInfoRsp,
    SetInfoReq,
    SetInfoRsp,
    QueryDirReq,
    QueryDirRsp,
    LockReq,
    LockRsp,
    NotifyReq,
    NotifyRsp,
    OplockBreak,
}

const KINDS: [(Kind, u16); 11] = [
    (Kind::QueryInfoReq, 41),
    (Kind::QueryInfoRsp, 9),
    (Kind::SetInfoReq, 33),
    (Kind::SetInfoRsp, 2),
    (Kind::QueryDirReq, 33),
    (Kind::QueryDirRsp, 9),
    (Kind::LockReq, 48),
    (Kind::LockRsp, 4),
    (Kind::NotifyReq, 32),
    (Kind::NotifyRsp, 9),
    (Kind::OplockBreak, 24),
];

/// Decodes with the crate; when it accepts, re-emits and checks the value
/// survives (and that `emit` writes exactly `buffer_len` bytes).
fn decode(kind: Kind, b: &[u8]) -> Verdict {
    macro_rules! check {
        ($ty:ident) => {{
            let r = $ty::from_body(b);
            if let Ok(v) = &r {
                let mut buf = vec![0u8; Smb2Body::buffer_len(v)];
                assert_eq!(Smb2Body::emit(v, &mut buf), Ok(buf.len()));
                assert_eq!(&$ty::from_body(&buf).expect("re-emitted body decodes"), v);
            }
            verdict(&r)
        }};
    }
    match kind {
        Kind::QueryInfoReq => check!(QueryInfoRequestRepr),
        Kind::QueryInfoRsp => check!(QueryInfoResponseRepr),
        Kind::SetInfoReq => check!(SetInfoRequestRepr),
        Kind::SetInfoRsp => check!(SetInfoResponseRepr),
        Kind::QueryDirReq => check!(QueryDirectoryRequestRepr),
        Kind::QueryDirRsp => check!(QueryDirectoryResponseRepr),
        Kind::LockReq => check!(LockRequestRepr),
        Kind::LockRsp => check!(LockResponseRepr),
        Kind::NotifyReq => check!(ChangeNotifyRequestRepr),
        Kind::NotifyRsp => check!(ChangeNotifyResponseRepr),
        Kind::OplockBreak => check!(OplockBreakRepr),
    }
}

fn model(kind: Kind, b: &[u8]) -> Verdict {
    match kind {
        Kind::QueryInfoReq => model_one_region(b, 41, Some((8, 2, 12, 4))),
        Kind::SetInfoReq => model_one_region(b, 33, Some((8, 2, 4, 4))),
        Kind::QueryDirReq => model_one_region(b, 33, Some((24, 2, 26, 2))),
        Kind::QueryInfoRsp | Kind::QueryDirRsp | Kind::NotifyRsp => {
            model_one_region(b, 9, Some((2, 2, 4, 4)))
        }
        Kind::SetInfoRsp => model_one_region(b, 2, None),
        Kind::LockRsp => model_one_region(b, 4, None),
        Kind::NotifyReq => model_one_region(b, 32, None),
        Kind::LockReq => model_lock(b),
        Kind::OplockBreak => model_oplock_break(b),
    }
}

fn any_kind() -> impl Strategy<Value = (Kind, u16)> {
    (0..KINDS.len()).prop_map(|i| KINDS[i])
}

/// Random bytes with, half the time, the kind's StructureSize planted (and
/// for LOCK a small LockCount).
fn hostile_body() -> impl Strategy<Value = (Kind, Vec<u8>)> {
    (any_kind(), any::<bool>(), 0u8..4, vec(any::<u8>(), 0..160)).prop_map(
        |((kind, ss), plant, count, mut b)| {
            if plant && b.len() >= 2 {
                b[..2].copy_from_slice(&ss.to_le_bytes());
                if matches!(kind, Kind::LockReq) && b.len() >= 4 {
                    b[2..4].copy_from_slice(&u16::from(count).to_le_bytes());
                }
            }
            (kind, b)
        },
    )
}

fn names() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 ._~-]{0,20}"
}

/// One generated entry (owned strings, borrowed by `entry`).
#[derive(Debug, Clone)]
struct OwnedEntry {
    nums: (u32, u64, u64, u64, u64, u64, u64, u32, u32, u64),
    short: String,
    name: String,
}

fn owned_entry() -> impl Strategy<Value = OwnedEntry> {
    (
        (
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
        ),
        "[A-Z0-9~]{0,12}",
        names(),
    )
        .prop_map(|(nums, short, name)| OwnedEntry { nums, short, name })
}

fn entry(o: &OwnedEntry) -> DirectoryEntry<'_> {
    let n = o.nums;
    DirectoryEntry {
        file_index: n.0,
        creation_time: n.1,
        last_access_time: n.2,
        last_write_time: n.3,
        change_time: n.4,
        end_of_file: n.5,
        allocation_size: n.6,
        file_attributes: FileAttributes(n.7),
        ea_size: n.8,
        short_name: Utf16Str::new(&o.short),
        file_id: n.9,
        file_name: Utf16Str::new(&o.name),
    }
}

/// What a class keeps of an entry: the fields it lacks read back as zero.
fn project<'a>(class: DirectoryInfoClass, e: &DirectoryEntry<'a>) -> DirectoryEntry<'a> {
    use DirectoryInfoClass::*;
    let mut p = *e;
    if class == Names {
        p = DirectoryEntry {
            file_index: e.file_index,
            file_name: e.file_name,
            ..DirectoryEntry::default()
        };
    }
    if matches!(class, Directory | Names) {
        p.ea_size = 0;
    }
    if !matches!(class, BothDirectory | IdBothDirectory) {
        p.short_name = Utf16Str::EMPTY;
    }
    if !matches!(class, IdBothDirectory | IdFullDirectory) {
        p.file_id = 0;
    }
    p
}

const CLASSES: [DirectoryInfoClass; 6] = [
    DirectoryInfoClass::Directory,
    DirectoryInfoClass::FullDirectory,
    DirectoryInfoClass::BothDirectory,
    DirectoryInfoClass::Names,
    DirectoryInfoClass::IdBothDirectory,
    DirectoryInfoClass::IdFullDirectory,
];

proptest! {
    /// Random bytes into every new body decoder: no panic, the model's
    /// verdict, and an accepted body re-emits to the same value.
    #[test]
    fn hostile_bodies_get_the_models_verdict((kind, b) in hostile_body()) {
        prop_assert_eq!(decode(kind, &b), model(kind, &b), "{:?}", kind);
    }

    /// Structure-aware: a valid QUERY_INFO / SET_INFO / QUERY_DIRECTORY
    /// request round-trips; then one byte of the fixed part changes, or
    /// the body is cut, and the verdict is the model's.
    #[test]
    fn mutated_valid_requests_get_the_models_verdict(
        which in 0u8..3,
        info_type in any::<u8>(),
        class in any::<u8>(),
        obl in any::<u32>(),
        extra in any::<u32>(),
        data in vec(any::<u8>(), 0..40),
        at in 0usize..48,
        value in any::<u8>(),
        cut in any::<usize>(),
    ) {
        let name = String::from_utf8_lossy(&data).into_owned();
        let (kind, mut b) = match which {
            0 => (Kind::QueryInfoReq, emit(&QueryInfoRequestRepr {
                info_type: InfoType(info_type),
                file_info_class: class,
                output_buffer_length: obl,
                input: &data,
                additional_information: extra,
                flags: QueryInfoFlags(extra.rotate_left(7)),
                file_id: FILE_ID,
            })),
            1 => (Kind::SetInfoReq, emit(&SetInfoRequestRepr {
                info_type: InfoType(info_type),
                file_info_class: class,
                data: &data,
                additional_information: extra,
                file_id: FILE_ID,
            })),
            _ => (Kind::QueryDirReq, emit(&QueryDirectoryRequestRepr {
                file_information_class: FileInfoClass(class),
                flags: QueryDirectoryFlags(info_type),
                file_index: extra,
                file_id: FILE_ID,
                file_name: Utf16Str::new(&name),
                output_buffer_length: obl,
            })),
        };
        prop_assert_eq!(decode(kind, &b), Verdict::Ok);
        if at < b.len() {
            b[at] = value;
        }
        prop_assert_eq!(decode(kind, &b), model(kind, &b));
        let k = cut % (b.len() + 1);
        prop_assert_eq!(decode(kind, &b[..k]), model(kind, &b[..k]));
    }

    /// LOCK requests of any element count round-trip; element flags and
    /// the operation check never panic.
    #[test]
    fn lock_requests_round_trip(
        els in vec((any::<u64>(), any::<u64>(), any::<u32>()), 1..8),
        seq in any::<u32>(),
    ) {
        let elements: Vec<LockElement> = els
            .iter()
            .map(|&(offset, length, f)| LockElement { offset, length, flags: LockFlags(f) })
            .collect();
        let repr = LockRequestRepr { lock_sequence: seq, file_id: FILE_ID, locks: LockElements::new(&elements) };
        let b = emit(&repr);
        prop_assert_eq!(b.len(), 24 + 24 * elements.len());
        let back = LockRequestRepr::from_body(&b).unwrap();
        prop_assert_eq!(back, repr);
        let _ = back.operation();
        prop_assert_eq!(back.lock_sequence_index() << 4 | u32::from(back.lock_sequence_number()), seq);
    }

    /// Every [MS-FSCC] decoder and walker on random bytes: no panic, the
    /// walkers end, and accepted input re-emits to the same value.
    #[test]
    fn fscc_decoders_never_panic_and_reemit(b in vec(any::<u8>(), 0..300)) {
        macro_rules! again {
            ($ty:ident) => {
                if let Ok(v) = $ty::from_bytes(&b) {
                    let mut out = vec![0u8; v.buffer_len()];
                    prop_assert_eq!(v.emit(&mut out), Ok(out.len()));
                    prop_assert_eq!($ty::from_bytes(&out), Ok(v));
                }
            };
        }
        again!(FileBasicInformationRepr);
        again!(FileStandardInformationRepr);
        again!(FileInternalInformationRepr);
        again!(FileEaInformationRepr);
        again!(FileAccessInformationRepr);
        again!(FilePositionInformationRepr);
        again!(FileModeInformationRepr);
        again!(FileAlignmentInformationRepr);
        again!(FileNetworkOpenInformationRepr);
        again!(FileAttributeTagInformationRepr);
        again!(FileCompressionInformationRepr);
        again!(FileDispositionInformationRepr);
        again!(FileEndOfFileInformationRepr);
        again!(FileAllocationInformationRepr);
        again!(FileAllInformationRepr);
        again!(FileNameInformationRepr);
        again!(FileRenameInformationRepr);
        again!(FileFsVolumeInformationRepr);
        again!(FileFsAttributeInformationRepr);
        again!(FileFsSizeInformationRepr);
        again!(FileFsFullSizeInformationRepr);
        again!(FileFsDeviceInformationRepr);
        again!(FileFsSectorSizeInformationRepr);
        again!(FileFsObjectIdInformationRepr);
        for class in CLASSES {
            prop_assert!(DirectoryEntryIter::new(class, &b).take(1000).count() < 1000);
        }
        prop_assert!(FileStreamInformationRepr::iter(&b).take(1000).count() < 1000);
        prop_assert!(NetworkInterfaceInfoList::iter(&b).take(1000).count() < 1000);
        let _ = DfsReferralRequest::parse(&b);
        for ctype in [3u16, 5, 6, 0x100] {
            let c = NegotiateContext::Other { context_type: ctype, data: &b };
            let _ = (c.compression(), c.netname(), c.transport(), c.is_posix_extensions());
        }
        for name in [
            &SMB2_CREATE_QUERY_MAXIMAL_ACCESS_REQUEST[..],
            &SMB2_CREATE_QUERY_ON_DISK_ID[..],
            &SMB2_CREATE_REQUEST_LEASE[..],
            &SMB2_CREATE_DURABLE_HANDLE_REQUEST[..],
            &SMB2_CREATE_DURABLE_HANDLE_REQUEST_V2[..],
            &SMB2_CREATE_ALLOCATION_SIZE[..],
            &SMB2_CREATE_TIMEWARP_TOKEN[..],
            &SMB2_CREATE_POSIX_CONTEXT[..],
        ] {
            let _ = CreateContextRequest::parse(&CreateContext::new(name, &b));
        }
        let _ = MaximalAccessResponse::parse(&b);
        let _ = QueryOnDiskIdResponse::parse(&b);
    }

    /// Directory packing: any entries, any class, any room. What is written
    /// is a prefix of the entries, stops at the first that does not fit,
    /// never exceeds the room, keeps every entry 8-byte aligned with
    /// NextEntryOffset 0 on the last, and walks back to the prefix (as the
    /// class projects it).
    #[test]
    fn directory_packing_writes_a_walkable_prefix(
        owned in vec(owned_entry(), 0..12),
        class_i in 0usize..6,
        room in 0usize..1500,
        single in any::<bool>(),
    ) {
        let class = CLASSES[class_i];
        let entries: Vec<_> = owned.iter().map(entry).collect();
        let mut buf = vec![0xEEu8; room];
        let (n, len) = pack_directory_entries(class, entries.iter().copied(), &mut buf, single).unwrap();
        prop_assert!(len <= room);
        prop_assert!(n <= entries.len());
        if single {
            prop_assert!(n <= 1);
        }
        // Stopped at the first that did not fit (or after one).
        if n < entries.len() && !(single && n == 1) {
            let start = if n == 0 { 0 } else { (len + 7) & !7 };
            prop_assert!(start + entries[n].buffer_len(class) > room);
        }
        let walked: Vec<_> = DirectoryEntryIter::new(class, &buf[..len])
            .collect::<Result<_, _>>()
            .unwrap();
        prop_assert_eq!(walked.len(), n);
        for (w, e) in walked.iter().zip(&entries) {
            prop_assert_eq!(*w, project(class, e));
        }
        // Chain shape.
        let mut pos = 0;
        for i in 0..n {
            let next = le32(&buf, pos) as usize;
            if i + 1 == n {
                prop_assert_eq!(next, 0);
            } else {
                prop_assert!(next % 8 == 0 && next >= entries[i].buffer_len(class));
                prop_assert!(buf[pos + entries[i].buffer_len(class)..pos + next].iter().all(|&x| x == 0));
                pos += next;
            }
        }
    }

    /// NETWORK_INTERFACE_INFO lists of any length round-trip.
    #[test]
    fn network_interface_lists_round_trip(
        raw in vec((1u32..64, any::<u32>(), any::<u64>(), any::<bool>(), any::<[u8; 16]>()), 0..6),
    ) {
        let entries: Vec<_> = raw
            .iter()
            .map(|&(if_index, cap, link_speed, v6, a)| NetworkInterfaceInfoRepr {
                if_index,
                capability: InterfaceCapability(cap),
                link_speed,
                address: if v6 {
                    IpAddr::V6(Ipv6Addr::from(a))
                } else {
                    IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]))
                },
            })
            .collect();
        let list = NetworkInterfaceInfoList { entries: &entries };
        let mut b = vec![0xEEu8; list.buffer_len()];
        prop_assert_eq!(list.emit(&mut b), Ok(152 * entries.len()));
        let back: Vec<_> = NetworkInterfaceInfoList::iter(&b).collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(back, entries);
    }

    /// Random request bodies through dispatch never panic, for every
    /// command including the new ones.
    #[test]
    fn dispatch_of_new_commands_never_panics(
        cmd in prop_oneof![Just(0x0Au16), Just(0x0E), Just(0x0F), Just(0x10), Just(0x11), Just(0x12)],
        status in any::<u32>(),
        bytes in vec(any::<u8>(), 0..120),
    ) {
        let command = Command::from_wire(cmd).unwrap();
        if let Ok(r) = RequestBody::parse(command, &bytes) {
            prop_assert_eq!(r.command(), command);
            let again = emit(r.as_body());
            prop_assert_eq!(RequestBody::parse(command, &again), Ok(r));
        }
        let h = HeaderRepr::request(command, 0).response_to(NtStatus(status));
        let _ = ResponseBody::parse(&h, &bytes);
    }
}
