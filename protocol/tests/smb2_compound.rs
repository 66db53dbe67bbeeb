//! Compounded SMB2 messages ([MS-SMB2] 2.2.1 NextCommand, 3.2.4.1.4,
//! 3.3.5.2.7): the walker delimits messages with bounds-checked,
//! 8-byte-aligned NextCommand values and stops at the first bad one; the
//! writer pads and links messages.

use smbdirect_protocol::ntstatus::STATUS_SUCCESS;
use smbdirect_protocol::smb2::*;

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

const NAME: &str = r"dir\file.bin";

/// CREATE + READ + CLOSE, the second and third related, as a client
/// compounds them (3.2.4.1.4).
fn create_read_close(buf: &mut [u8]) -> (usize, [core::ops::Range<usize>; 3]) {
    let mut w = CompoundWriter::new(buf);
    let create = CreateRequestRepr {
        security_flags: 0,
        requested_oplock_level: OplockLevel::NONE,
        impersonation_level: ImpersonationLevel::IMPERSONATION,
        smb_create_flags: 0,
        desired_access: AccessMask::FILE_READ_DATA | AccessMask::SYNCHRONIZE,
        file_attributes: FileAttributes::empty(),
        share_access: ShareAccess::READ,
        create_disposition: CreateDisposition::OPEN,
        create_options: CreateOptions::NON_DIRECTORY_FILE,
        name: Utf16Str::new(NAME),
        create_contexts: CreateContextList::EMPTY,
    };
    let read = ReadRequestRepr {
        padding: 0x50,
        flags: ReadFlags::empty(),
        length: 4096,
        offset: 0,
        file_id: FileId::ANY,
        minimum_count: 0,
        channel: Channel::None,
        remaining_bytes: 0,
        channel_info: ChannelInfo::EMPTY,
    };
    let close = CloseRequestRepr {
        flags: CloseFlags::empty(),
        file_id: FileId::ANY,
    };
    let mut h = HeaderRepr::request(Command::Create, 10);
    h.session_id = 0x77;
    h.id = HeaderId::Sync {
        process_id: 0xFEFF,
        tree_id: 5,
    };
    let r0 = w.push(&h, &create).unwrap();
    h.command = Command::Read;
    h.message_id = 11;
    h.flags = HeaderFlags::RELATED_OPERATIONS;
    let r1 = w.push(&h, &read).unwrap();
    h.command = Command::Close;
    h.message_id = 12;
    let r2 = w.push(&h, &close).unwrap();
    (w.finish(), [r0, r1, r2])
}

#[test]
fn writer_pads_each_message_to_8_and_links_next_command() {
    let mut buf = vec![0xEEu8; 1024];
    let (len, ranges) = create_read_close(&mut buf);
    // CREATE: 64 + 57 + 24 (name) = 64 + 80 = 144 bytes, already aligned.
    assert_eq!(ranges[0], 0..144);
    // READ: 64 + 49 = 113 -> next at 144 + 120.
    assert_eq!(ranges[1], 144..257);
    assert_eq!(ranges[2], 264..264 + 64 + 24);
    assert_eq!(len, 352);
    let next = |at: usize| u32::from_le_bytes(buf[at + 20..at + 24].try_into().unwrap());
    assert_eq!(next(0), 144);
    assert_eq!(next(144), 120);
    assert_eq!(next(264), 0);
    assert_eq!(&buf[257..264], &[0; 7], "padding is zeroed");
}

#[test]
fn walker_yields_each_message_with_its_body() {
    let mut buf = vec![0u8; 1024];
    let (len, ranges) = create_read_close(&mut buf);
    let msgs: Vec<_> = compound(&buf[..len]).map(Result::unwrap).collect();
    assert_eq!(msgs.len(), 3);
    assert_eq!(
        msgs.iter().map(Message::offset).collect::<Vec<_>>(),
        [0, 144, 264]
    );
    assert!(!msgs[0].is_related());
    assert!(msgs[1].is_related() && msgs[2].is_related());
    // A message spans up to NextCommand, padding included (what a signature
    // covers); the last one to the end.
    assert_eq!(msgs[1].bytes().len(), 120);
    assert_eq!(msgs[2].bytes().len(), ranges[2].len());
    match msgs[0].request_body().unwrap() {
        RequestBody::Create(c) => assert_eq!(c.name.decode().unwrap(), NAME),
        other => panic!("{other:?}"),
    }
    match msgs[1].request_body().unwrap() {
        RequestBody::Read(r) => {
            assert_eq!(r.length, 4096);
            assert!(r.file_id.is_any());
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        msgs[2].request_body().unwrap(),
        RequestBody::Close(_)
    ));
    assert_eq!(msgs[0].header().session_id, 0x77);
}

#[test]
fn a_lone_message_is_a_compound_of_one() {
    let mut buf = [0u8; 68];
    let n = emit_message(
        &HeaderRepr::request(Command::Echo, 1),
        &EchoRequestRepr,
        &mut buf,
    )
    .unwrap();
    let v: Vec<_> = compound(&buf[..n]).collect();
    assert_eq!(v.len(), 1);
    let m = v[0].as_ref().unwrap();
    assert_eq!(m.body(), &[4, 0, 0, 0]);
    assert_eq!(
        m.request_body().unwrap(),
        RequestBody::Echo(EchoRequestRepr)
    );
}

#[test]
fn misaligned_next_command_ends_the_walk_with_a_disconnect() {
    let mut buf = vec![0u8; 1024];
    let (len, _) = create_read_close(&mut buf);
    put32(&mut buf, 20, 148);
    let v: Vec<_> = compound(&buf[..len]).collect();
    assert_eq!(v.len(), 1);
    let e = v[0].unwrap_err();
    assert_eq!(
        e,
        Smb2Error::NextCommand {
            next_command: 148,
            remaining: len
        }
    );
    assert_eq!(e.server_action(), ServerAction::Disconnect);
}

#[test]
fn next_command_past_the_end_or_inside_the_header_is_refused() {
    let mut buf = vec![0u8; 1024];
    let (len, _) = create_read_close(&mut buf);
    for bad in [0x4000_0000u32, len as u32, len as u32 + 8, 56, 8] {
        let mut b = buf[..len].to_vec();
        put32(&mut b, 20, bad);
        let v: Vec<_> = compound(&b).collect();
        assert_eq!(v.len(), 1, "NextCommand {bad}");
        assert!(matches!(v[0], Err(Smb2Error::NextCommand { .. })), "{bad}");
    }
    // The second message's NextCommand is checked against what remains
    // after it, not the whole compound.
    let mut b = buf[..len].to_vec();
    put32(&mut b, 144 + 20, (len - 144) as u32);
    let v: Vec<_> = compound(&b).collect();
    assert_eq!(v.len(), 2);
    assert!(v[0].is_ok());
    assert!(matches!(v[1], Err(Smb2Error::NextCommand { .. })));
}

#[test]
fn a_bad_header_later_in_the_chain_is_reported_after_the_good_ones() {
    let mut buf = vec![0u8; 1024];
    let (len, _) = create_read_close(&mut buf);
    buf[264] = 0xFF; // third ProtocolId: SMB1
    let v: Vec<_> = compound(&buf[..len]).collect();
    assert_eq!(v.len(), 3);
    assert!(v[0].is_ok() && v[1].is_ok());
    assert!(matches!(
        v[2],
        Err(Smb2Error::ProtocolId {
            found: [0xFF, b'S', b'M', b'B']
        })
    ));

    let mut b = buf[..len].to_vec();
    b[264] = 0xFE;
    b[264 + 12] = 0x99; // unknown command
    let v: Vec<_> = compound(&b).collect();
    assert!(matches!(
        v[2],
        Err(Smb2Error::UnknownCommand { command: 0x99 })
    ));
}

#[test]
fn empty_and_short_input_is_a_short_message() {
    assert_eq!(
        compound(&[]).collect::<Vec<_>>(),
        vec![Err(Smb2Error::ShortMessage { have: 0 })]
    );
    assert_eq!(
        compound(&[0xFE, b'S', b'M', b'B']).collect::<Vec<_>>(),
        vec![Err(Smb2Error::ShortMessage { have: 4 })]
    );
}

#[test]
fn response_compound_decodes_error_and_command_responses() {
    let mut buf = vec![0u8; 512];
    let mut w = CompoundWriter::new(&mut buf);
    let req = HeaderRepr::request(Command::Create, 20);
    let ok = req.response_to(STATUS_SUCCESS);
    let create = CreateResponseRepr {
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
        file_id: FileId::new(1, 2),
        create_contexts: CreateContextList::EMPTY,
    };
    w.push(&ok, &create).unwrap();
    let mut read_req = HeaderRepr::request(Command::Read, 21);
    read_req.flags = HeaderFlags::RELATED_OPERATIONS;
    let failed = read_req.response_to(smbdirect_protocol::ntstatus::STATUS_END_OF_FILE);
    w.push(&failed, &ErrorResponseRepr::EMPTY).unwrap();
    let len = w.finish();
    let msgs: Vec<_> = compound(&buf[..len]).map(Result::unwrap).collect();
    assert_eq!(msgs.len(), 2);
    assert_eq!(
        msgs[0].response_body().unwrap(),
        ResponseBody::Create(create)
    );
    assert_eq!(
        msgs[1].response_body().unwrap(),
        ResponseBody::Error(ErrorResponseRepr::EMPTY)
    );
    assert!(msgs[1].header().is_response() && msgs[1].is_related());
}

#[test]
fn writer_fails_cleanly_when_the_buffer_is_full() {
    let mut buf = [0u8; 100];
    let mut w = CompoundWriter::new(&mut buf);
    w.push(&HeaderRepr::request(Command::Echo, 1), &EchoRequestRepr)
        .unwrap();
    assert!(matches!(
        w.push(&HeaderRepr::request(Command::Echo, 2), &EchoRequestRepr),
        Err(Smb2Error::BufferTooSmall { .. })
    ));
    assert_eq!(w.len(), 68);
}
