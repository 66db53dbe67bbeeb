//! SMB2 cases ([MS-SMB2] 3.3.5): malformed headers and bodies, requests
//! out of sequence, and READ/WRITE requests whose SMB Direct channel
//! information is wrong. Requests that fail get their NTSTATUS and the
//! connection goes on (an ECHO afterwards must succeed); the few that
//! 3.3.5.2 says end the connection must end it without a response.

use super::cases_smbd::ms;
use super::rig::{Grants, Rig};
use super::smb2_peer::{dialect_name, message_bytes, Reply, Smb2Peer};
use super::{Case, Layer, Observation};
use smbdirect_dataplane::provider::{Access, Provider};
use smbdirect_protocol::ntstatus::{
    NtStatus, STATUS_FILE_CLOSED, STATUS_INVALID_PARAMETER, STATUS_NETWORK_NAME_DELETED,
    STATUS_NOT_SUPPORTED, STATUS_USER_SESSION_DELETED,
};
use smbdirect_protocol::smb2::{
    AccessMask, Channel, ChannelInfo, Command, CompoundWriter, CreateContextList,
    CreateDisposition, CreateOptions, CreateRequestRepr, EchoRequestRepr, ErrorResponseRepr,
    FileAttributes, FileId, Header, HeaderId, HeaderRepr, ImpersonationLevel, OplockLevel,
    ReadFlags, ReadRequest, ReadRequestRepr, ShareAccess, Utf16Str, WriteFlags, WriteRequestRepr,
    HEADER_LEN,
};
use smbdirect_protocol::smbd::wire::BufferDescriptorRepr;
use std::time::Instant;

type Outcome = Result<Observation, String>;

/// Bytes each READ/WRITE case names.
const IO_LEN: u32 = 8192;

pub(super) fn cases<P: Provider>() -> Vec<Case<P>> {
    let invalid = "STATUS_INVALID_PARAMETER; the connection stays usable";
    vec![
        Case {
            name: "smb2-message-shorter-than-the-header",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.2.6",
            expected: "disconnect without a response",
            run: short_message::<P>,
        },
        Case {
            name: "smb2-command-code-not-defined",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.2.6 (docs/spec-notes.md: Unknown commands and malformed headers)",
            expected: "disconnect without a response",
            run: undefined_command::<P>,
        },
        Case {
            name: "smb2-protocol-id-not-smb2",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 2.2.1, 3.3.5.2.6 (not an SMB2 message: MAY disconnect)",
            expected: "disconnect without a response",
            run: bad_protocol_id::<P>,
        },
        Case {
            name: "smb2-header-structure-size-not-64",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 2.2.1, 3.3.5.2.6 (the header cannot be trusted: MAY disconnect)",
            expected: "disconnect without a response",
            run: bad_header_structure_size::<P>,
        },
        Case {
            name: "smb2-next-command-misaligned",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 2.2.1 (NextCommand 8-byte aligned), 3.3.5.2.7, 3.3.5.2.6",
            expected: "disconnect without a response (the compound cannot be delimited)",
            run: misaligned_next_command::<P>,
        },
        Case {
            name: "smb2-request-before-negotiate",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.2.2",
            expected: "disconnect without a response",
            run: before_negotiate::<P>,
        },
        Case {
            name: "smb2-second-negotiate",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.4 (NEGOTIATE after a dialect was negotiated)",
            expected: "disconnect without a response",
            run: second_negotiate::<P>,
        },
        Case {
            name: "smb2-message-id-outside-the-window",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.2.3 (docs/spec-notes.md: MessageId outside the CommandSequenceWindow)",
            expected: "disconnect without a response",
            run: message_id_outside::<P>,
        },
        Case {
            name: "smb2-message-id-reused",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.2.3 (docs/spec-notes.md: MessageId outside the CommandSequenceWindow)",
            expected: "disconnect without a response",
            run: message_id_reused::<P>,
        },
        Case {
            name: "smb2-defined-but-unimplemented-command",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.2.6 (docs/spec-notes.md: Unknown commands and malformed headers)",
            expected: "STATUS_NOT_SUPPORTED; the connection stays usable",
            run: unimplemented_command::<P>,
        },
        Case {
            name: "smb2-echo-with-a-bad-structure-size",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 2.2.28, 3.3.5.2.6",
            expected: invalid,
            run: echo_bad_structure_size::<P>,
        },
        Case {
            name: "smb2-read-with-a-bad-structure-size",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 2.2.19, 3.3.5.2.6",
            expected: invalid,
            run: read_bad_structure_size::<P>,
        },
        Case {
            name: "smb2-create-without-a-session",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.2.9",
            expected: "STATUS_USER_SESSION_DELETED; the connection stays usable",
            run: create_without_session::<P>,
        },
        Case {
            name: "smb2-read-on-an-unknown-tree",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.2.11",
            expected: "STATUS_NETWORK_NAME_DELETED; the connection stays usable",
            run: unknown_tree::<P>,
        },
        Case {
            name: "smb2-read-of-an-unknown-file-id",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.12",
            expected: "STATUS_FILE_CLOSED; the connection stays usable",
            run: unknown_file_id::<P>,
        },
        Case {
            name: "smb2-read-without-paying-its-credit-charge",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.12, 3.3.5.2.5",
            expected: invalid,
            run: unpaid_charge::<P>,
        },
        Case {
            name: "smb2-read-rdma-zero-length-descriptor",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.12; [MS-SMBD] 2.2.3.1, 3.1.4.5",
            expected: invalid,
            run: read_zero_length_descriptor::<P>,
        },
        Case {
            name: "smb2-write-rdma-zero-length-descriptor",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.13; [MS-SMBD] 2.2.3.1, 3.1.4.6",
            expected: invalid,
            run: write_zero_length_descriptor::<P>,
        },
        Case {
            name: "smb2-read-rdma-over-max-read-size",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.12 (Length > Connection.MaxReadSize)",
            expected: invalid,
            run: read_oversize::<P>,
        },
        Case {
            name: "smb2-write-rdma-over-max-write-size",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.13 (over Connection.MaxWriteSize); [MS-SMBD] MaxReadWriteSize",
            expected: invalid,
            run: write_oversize::<P>,
        },
        Case {
            name: "smb2-read-rdma-descriptors-shorter-than-length",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.12; [MS-SMBD] 3.1.4.5 (descriptors must describe the transfer)",
            expected: invalid,
            run: read_descriptors_short::<P>,
        },
        Case {
            name: "smb2-write-rdma-descriptors-shorter-than-length",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.13; [MS-SMBD] 3.1.4.6 (descriptors must describe the transfer)",
            expected: invalid,
            run: write_descriptors_short::<P>,
        },
        Case {
            name: "smb2-read-rdma-channel-info-not-whole-descriptors",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 2.2.19, 3.3.5.2.6; [MS-SMBD] 2.2.3.1",
            expected: invalid,
            run: read_channel_info_ragged::<P>,
        },
        Case {
            name: "smb2-read-rdma-channel-info-outside-the-message",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 2.2.19, 3.3.5.2.6",
            expected: invalid,
            run: read_channel_info_outside::<P>,
        },
        Case {
            name: "smb2-read-rdma-channel-without-channel-info",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.12 (RDMA channel with ReadChannelInfoLength 0)",
            expected: invalid,
            run: read_rdma_without_info::<P>,
        },
        Case {
            name: "smb2-read-unknown-channel",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.12 (Channel not NONE, RDMA_V1 or RDMA_V1_INVALIDATE)",
            expected: invalid,
            run: read_unknown_channel::<P>,
        },
        Case {
            name: "smb2-read-rdma-invalidate-on-smb-3-0",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.12 (dialect 3.0 and Channel RDMA_V1_INVALIDATE)",
            expected: invalid,
            run: read_invalidate_on_30::<P>,
        },
        Case {
            name: "smb2-read-rdma-overlapping-descriptors",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.12; [MS-SMBD] 3.1.4.3 (the descriptor array describes each location of the buffer)",
            expected: invalid,
            run: read_overlapping::<P>,
        },
        Case {
            name: "smb2-read-rdma-into-a-revoked-buffer",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.12; [MS-SMBD] 1.5, 3.1.4.5 (the RDMA Write fails: the response behind it is never delivered)",
            expected: "disconnect without a response",
            run: read_revoked::<P>,
        },
        Case {
            name: "smb2-write-rdma-overlapping-descriptors",
            layer: Layer::Smb2,
            rule: "[MS-SMB2] 3.3.5.13; [MS-SMBD] 3.1.4.3 (the descriptor array describes each location of the buffer)",
            expected: invalid,
            run: write_overlapping::<P>,
        },
    ]
}

/// NEGOTIATE, SESSION_SETUP, TREE_CONNECT.
fn session<P: Provider>(rig: &Rig<P>) -> Result<Smb2Peer<P>, String> {
    let mut s = Smb2Peer::connect(rig)?;
    s.negotiate()?;
    s.session_setup()?;
    s.tree_connect()?;
    Ok(s)
}

/// The request must end the connection without a response.
fn expect_disconnect<P: Provider>(
    s: &mut Smb2Peer<P>,
    bytes: &[u8],
    timeout: std::time::Duration,
) -> Observation {
    let sent = Instant::now();
    if let Err(e) = s.send(bytes) {
        return Observation::fail(format!("could not send: {e}"));
    }
    match s.recv(timeout) {
        Reply::Closed(e) => Observation::pass(format!(
            "disconnected {} after the request, no response ({e})",
            ms(sent.elapsed())
        )),
        other => Observation::fail(format!(
            "expected a disconnect without a response; got {} within {:?}",
            other.describe(),
            timeout
        )),
    }
}

/// The request must fail with `want`, and the connection must go on.
fn expect_status<P: Provider>(s: &mut Smb2Peer<P>, bytes: &[u8], want: NtStatus) -> Observation {
    match s.exchange(bytes) {
        Reply::Response(r) if r.header.status == want => match s.still_usable() {
            Ok(()) => Observation::pass(format!(
                "{:?} answered {want}; the connection still answers ECHO",
                r.header.command
            )),
            Err(e) => Observation::fail(format!("{:?} answered {want}, but {e}", r.header.command)),
        },
        other => Observation::fail(format!("expected {want}; got {}", other.describe())),
    }
}

fn finish<P: Provider>(s: Smb2Peer<P>, o: Observation) -> Outcome {
    s.close();
    Ok(o)
}

fn short_message<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut s = session(rig)?;
    let mut bytes = s.build(Command::Echo, 1, &EchoRequestRepr)?;
    bytes.truncate(40);
    let o = expect_disconnect(&mut s, &bytes, rig.timeout);
    finish(s, o)
}

fn undefined_command<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut s = session(rig)?;
    let mut bytes = s.build(Command::Echo, 1, &EchoRequestRepr)?;
    Header::new_unchecked(&mut bytes[..]).set_command(0x0099);
    let o = expect_disconnect(&mut s, &bytes, rig.timeout);
    finish(s, o)
}

fn bad_protocol_id<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut s = session(rig)?;
    let mut bytes = s.build(Command::Echo, 1, &EchoRequestRepr)?;
    Header::new_unchecked(&mut bytes[..]).set_protocol_id([0xFF, b'S', b'M', b'B']);
    let o = expect_disconnect(&mut s, &bytes, rig.timeout);
    finish(s, o)
}

fn bad_header_structure_size<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut s = session(rig)?;
    let mut bytes = s.build(Command::Echo, 1, &EchoRequestRepr)?;
    Header::new_unchecked(&mut bytes[..]).set_structure_size(63);
    let o = expect_disconnect(&mut s, &bytes, rig.timeout);
    finish(s, o)
}

fn misaligned_next_command<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut s = session(rig)?;
    let mut buf = vec![0u8; 512];
    let mut w = CompoundWriter::new(&mut buf);
    let h1 = s.header(Command::Echo, 1);
    let h2 = s.header(Command::Echo, 1);
    w.push(&h1, &EchoRequestRepr)
        .and_then(|_| w.push(&h2, &EchoRequestRepr))
        .map_err(|e| format!("compound: {e}"))?;
    let n = w.finish();
    buf.truncate(n);
    Header::new_unchecked(&mut buf[..]).set_next_command(70);
    let o = expect_disconnect(&mut s, &buf, rig.timeout);
    finish(s, o)
}

fn before_negotiate<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut s = Smb2Peer::connect(rig)?;
    let bytes = s.build(Command::Echo, 0, &EchoRequestRepr)?;
    let o = expect_disconnect(&mut s, &bytes, rig.timeout);
    finish(s, o)
}

fn second_negotiate<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut s = Smb2Peer::connect(rig)?;
    s.negotiate()?;
    let bytes = super::smb2_peer::negotiate_request_bytes(s.next_message_id());
    let o = expect_disconnect(&mut s, &bytes, rig.timeout);
    finish(s, o)
}

fn message_id_outside<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut s = session(rig)?;
    let mut h = s.header(Command::Echo, 1);
    h.message_id += 100_000;
    let bytes = message_bytes(&h, &EchoRequestRepr)?;
    let mut o = expect_disconnect(&mut s, &bytes, rig.timeout);
    o.text = format!(
        "MessageId {} with {} credits held: {}",
        h.message_id,
        s.credits(),
        o.text
    );
    finish(s, o)
}

fn message_id_reused<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut s = session(rig)?;
    let h = s.header(Command::Echo, 1);
    let bytes = message_bytes(&h, &EchoRequestRepr)?;
    match s.exchange(&bytes) {
        Reply::Response(r) if r.header.status.0 == 0 => {}
        other => {
            return finish(
                s,
                Observation::fail(format!("first ECHO: {}", other.describe())),
            )
        }
    }
    let mut o = expect_disconnect(&mut s, &bytes, rig.timeout);
    o.text = format!("MessageId {} sent twice: {}", h.message_id, o.text);
    finish(s, o)
}

fn unimplemented_command<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut s = session(rig)?;
    // SERVER_TO_CLIENT_NOTIFICATION: defined by 2.2.1, sent only by
    // servers, so a server has nothing to serve it with.
    let bytes = s.build(
        Command::ServerToClientNotification,
        1,
        &ErrorResponseRepr::EMPTY,
    )?;
    let o = expect_status(&mut s, &bytes, STATUS_NOT_SUPPORTED);
    finish(s, o)
}

fn echo_bad_structure_size<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut s = session(rig)?;
    let mut bytes = s.build(Command::Echo, 1, &EchoRequestRepr)?;
    bytes[HEADER_LEN..HEADER_LEN + 2].copy_from_slice(&5u16.to_le_bytes());
    let o = expect_status(&mut s, &bytes, STATUS_INVALID_PARAMETER);
    finish(s, o)
}

fn read_bad_structure_size<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let (mut s, fid) = Smb2Peer::with_file(rig, "structsize")?;
    let req = read_req(fid, 16, Channel::None, &[]);
    let mut bytes = s.build(Command::Read, 1, &req)?;
    ReadRequest::new_unchecked(&mut bytes[HEADER_LEN..]).set_structure_size(48);
    let o = expect_status(&mut s, &bytes, STATUS_INVALID_PARAMETER);
    finish(s, o)
}

fn create_without_session<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut s = Smb2Peer::connect(rig)?;
    s.negotiate()?;
    let req = CreateRequestRepr {
        security_flags: 0,
        requested_oplock_level: OplockLevel::NONE,
        impersonation_level: ImpersonationLevel::IMPERSONATION,
        smb_create_flags: 0,
        desired_access: AccessMask::GENERIC_READ,
        file_attributes: FileAttributes::NORMAL,
        share_access: ShareAccess::READ,
        create_disposition: CreateDisposition::OPEN_IF,
        create_options: CreateOptions::NON_DIRECTORY_FILE,
        name: Utf16Str::new("torture-no-session.bin"),
        create_contexts: CreateContextList::EMPTY,
    };
    let bytes = s.build(Command::Create, 1, &req)?;
    let o = expect_status(&mut s, &bytes, STATUS_USER_SESSION_DELETED);
    finish(s, o)
}

fn unknown_tree<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let (mut s, fid) = Smb2Peer::with_file(rig, "tree")?;
    let mut h = s.header(Command::Read, 1);
    h.id = HeaderId::Sync {
        process_id: 0xFEFF,
        tree_id: s.tree.wrapping_add(0x0bad_0000),
    };
    let bytes = message_bytes(&h, &read_req(fid, 16, Channel::None, &[]))?;
    let o = expect_status(&mut s, &bytes, STATUS_NETWORK_NAME_DELETED);
    finish(s, o)
}

fn unknown_file_id<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut s = session(rig)?;
    let fid = FileId {
        persistent: 0x7075_7274_6f72_7475,
        volatile: 0x6b6e_6f77_6e21_2121,
    };
    let bytes = s.build(Command::Read, 1, &read_req(fid, 16, Channel::None, &[]))?;
    let o = expect_status(&mut s, &bytes, STATUS_FILE_CLOSED);
    finish(s, o)
}

fn unpaid_charge<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let (mut s, fid) = Smb2Peer::with_file(rig, "charge")?;
    let bytes = s.build(
        Command::Read,
        1,
        &read_req(fid, 200_000, Channel::None, &[]),
    )?;
    let mut o = expect_status(&mut s, &bytes, STATUS_INVALID_PARAMETER);
    o.text = format!("READ of 200000 bytes with CreditCharge 1: {}", o.text);
    finish(s, o)
}

fn read_req<'a>(
    fid: FileId,
    length: u32,
    channel: Channel,
    descs: &'a [BufferDescriptorRepr],
) -> ReadRequestRepr<'a> {
    ReadRequestRepr {
        padding: 0x50,
        flags: ReadFlags::empty(),
        length,
        offset: 0,
        file_id: fid,
        minimum_count: 0,
        channel,
        remaining_bytes: 0,
        channel_info: ChannelInfo::descriptors(descs),
    }
}

fn write_req<'a>(
    fid: FileId,
    length: u32,
    channel: Channel,
    descs: &'a [BufferDescriptorRepr],
) -> WriteRequestRepr<'a> {
    WriteRequestRepr {
        offset: 0,
        file_id: fid,
        channel,
        remaining_bytes: length,
        flags: WriteFlags::empty(),
        data: &[],
        channel_info: ChannelInfo::descriptors(descs),
    }
}

/// A session with a file of [`IO_LEN`] bytes and buffers granted to the
/// server, revoked and freed when the case ends.
struct Io<P: Provider> {
    s: Smb2Peer<P>,
    fid: FileId,
    grants: Grants,
}

impl<P: Provider> Io<P> {
    fn open(rig: &mut Rig<P>, what: &str) -> Result<Self, String> {
        let (mut s, fid) = Smb2Peer::with_file(rig, what)?;
        s.write_inline(fid, 0, &[0x6bu8; IO_LEN as usize])?;
        Ok(Io {
            s,
            fid,
            grants: Grants::default(),
        })
    }

    /// A buffer of `len` bytes granted `access`: its descriptor.
    fn grant(&mut self, len: usize, access: Access) -> Result<BufferDescriptorRepr, String> {
        self.grants.grant(self.s.client_mut(), len, len, access)
    }

    fn close(mut self, o: Observation) -> Outcome {
        self.grants.release(self.s.client_mut());
        self.s.close_file(self.fid);
        self.s.close();
        Ok(o)
    }
}

/// Opens an [`Io`], builds the request with `build`, expects
/// STATUS_INVALID_PARAMETER.
fn io_case<P: Provider>(
    rig: &mut Rig<P>,
    what: &str,
    build: impl FnOnce(&mut Io<P>) -> Result<(String, Vec<u8>), String>,
) -> Outcome {
    io_case_expecting(rig, what, build, |s, bytes| {
        expect_status(s, bytes, STATUS_INVALID_PARAMETER)
    })
}

/// [`io_case`] with the outcome judged by `expect`.
fn io_case_expecting<P: Provider>(
    rig: &mut Rig<P>,
    what: &str,
    build: impl FnOnce(&mut Io<P>) -> Result<(String, Vec<u8>), String>,
    expect: impl FnOnce(&mut Smb2Peer<P>, &[u8]) -> Observation,
) -> Outcome {
    let mut io = Io::open(rig, what)?;
    let (label, bytes) = match build(&mut io) {
        Ok(b) => b,
        Err(e) => {
            let _ = io.close(Observation::fail(String::new()));
            return Err(e);
        }
    };
    let mut o = expect(&mut io.s, &bytes);
    o.text = format!("{label}: {}", o.text);
    io.close(o)
}

fn zero_length_pair(d: BufferDescriptorRepr) -> [BufferDescriptorRepr; 2] {
    let mut half = d;
    half.length = d.length / 2;
    let zero = BufferDescriptorRepr {
        offset: d.offset + u64::from(half.length),
        token: d.token,
        length: 0,
    };
    [half, zero]
}

fn read_zero_length_descriptor<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    io_case(rig, "read0", |io| {
        let d = io.grant(IO_LEN as usize, Access::RemoteWrite)?;
        let descs = zero_length_pair(d);
        let req = read_req(io.fid, IO_LEN / 2, Channel::RdmaV1, &descs);
        Ok((
            "READ with descriptors of 4096 and 0 bytes".into(),
            io.s.build(Command::Read, 1, &req)?,
        ))
    })
}

fn write_zero_length_descriptor<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    io_case(rig, "write0", |io| {
        let d = io.grant(IO_LEN as usize, Access::RemoteRead)?;
        let descs = zero_length_pair(d);
        let req = write_req(io.fid, IO_LEN / 2, Channel::RdmaV1, &descs);
        Ok((
            "WRITE with descriptors of 4096 and 0 bytes".into(),
            io.s.build(Command::Write, 1, &req)?,
        ))
    })
}

fn read_oversize<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    io_case(rig, "readbig", |io| {
        let len = io.s.max_read.saturating_add(65_536);
        let charge = HeaderRepr::credit_charge_for(u64::from(len));
        io.s.ensure_credits(u32::from(charge) + 1)?;
        let d = io.grant(IO_LEN as usize, Access::RemoteWrite)?;
        let descs = [d];
        let req = read_req(io.fid, len, Channel::RdmaV1, &descs);
        Ok((
            format!(
                "READ of {len} bytes (MaxReadSize {}), CreditCharge {charge} paid",
                io.s.max_read
            ),
            io.s.build(Command::Read, charge, &req)?,
        ))
    })
}

fn write_oversize<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    io_case(rig, "writebig", |io| {
        let len = io.s.max_write.saturating_add(65_536);
        let charge = HeaderRepr::credit_charge_for(u64::from(len));
        io.s.ensure_credits(u32::from(charge) + 1)?;
        let d = io.grant(IO_LEN as usize, Access::RemoteRead)?;
        let descs = [d];
        let req = write_req(io.fid, len, Channel::RdmaV1, &descs);
        Ok((
            format!(
                "WRITE of {len} bytes by RDMA (MaxWriteSize {}), CreditCharge {charge} paid",
                io.s.max_write
            ),
            io.s.build(Command::Write, charge, &req)?,
        ))
    })
}

fn read_descriptors_short<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    io_case(rig, "readshort", |io| {
        let d = io.grant(IO_LEN as usize / 2, Access::RemoteWrite)?;
        let descs = [d];
        let req = read_req(io.fid, IO_LEN, Channel::RdmaV1, &descs);
        Ok((
            format!(
                "READ of {IO_LEN} bytes into one {}-byte descriptor",
                IO_LEN / 2
            ),
            io.s.build(Command::Read, 1, &req)?,
        ))
    })
}

fn write_descriptors_short<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    io_case(rig, "writeshort", |io| {
        let d = io.grant(IO_LEN as usize / 2, Access::RemoteRead)?;
        let descs = [d];
        let req = write_req(io.fid, IO_LEN, Channel::RdmaV1, &descs);
        Ok((
            format!(
                "WRITE of {IO_LEN} bytes from one {}-byte descriptor",
                IO_LEN / 2
            ),
            io.s.build(Command::Write, 1, &req)?,
        ))
    })
}

fn read_channel_info_ragged<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    io_case(rig, "ragged", |io| {
        let d = io.grant(IO_LEN as usize, Access::RemoteWrite)?;
        let descs = zero_length_pair(d).map(|mut x| {
            x.length = IO_LEN / 2;
            x
        });
        let req = read_req(io.fid, IO_LEN, Channel::RdmaV1, &descs);
        let mut bytes = io.s.build(Command::Read, 1, &req)?;
        ReadRequest::new_unchecked(&mut bytes[HEADER_LEN..]).set_read_channel_info_length(24);
        Ok(("READ with ReadChannelInfoLength 24".into(), bytes))
    })
}

fn read_channel_info_outside<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    io_case(rig, "outside", |io| {
        let d = io.grant(IO_LEN as usize, Access::RemoteWrite)?;
        let descs = [d];
        let req = read_req(io.fid, IO_LEN, Channel::RdmaV1, &descs);
        let mut bytes = io.s.build(Command::Read, 1, &req)?;
        let past = (bytes.len() - 8) as u16;
        ReadRequest::new_unchecked(&mut bytes[HEADER_LEN..]).set_read_channel_info_offset(past);
        Ok((
            format!(
                "READ whose 16-byte channel info starts at {past} of a {}-byte message",
                bytes.len()
            ),
            bytes,
        ))
    })
}

fn read_rdma_without_info<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    io_case(rig, "noinfo", |io| {
        // The codec will not encode an RDMA channel without descriptors:
        // encode SMB2_CHANNEL_NONE and change the Channel.
        let req = read_req(io.fid, IO_LEN, Channel::None, &[]);
        let mut bytes = io.s.build(Command::Read, 1, &req)?;
        let mut v = ReadRequest::new_unchecked(&mut bytes[HEADER_LEN..]);
        v.set_channel(Channel::RdmaV1);
        v.set_read_channel_info_offset(0);
        v.set_read_channel_info_length(0);
        Ok((
            "READ with SMB2_CHANNEL_RDMA_V1 and ReadChannelInfoOffset/Length 0".into(),
            bytes,
        ))
    })
}

fn read_unknown_channel<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    io_case(rig, "channel7", |io| {
        let req = read_req(io.fid, 16, Channel::None, &[]);
        let mut bytes = io.s.build(Command::Read, 1, &req)?;
        ReadRequest::new_unchecked(&mut bytes[HEADER_LEN..]).set_channel(Channel::Unknown(7));
        Ok(("READ with Channel 7".into(), bytes))
    })
}

fn read_invalidate_on_30<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut s = Smb2Peer::connect(rig)?;
    s.negotiate_dialects(&[0x0300])?;
    s.session_setup()?;
    s.tree_connect()?;
    let name = format!(
        "torture-smb30-{}-{}.bin",
        std::process::id(),
        rig.next_seq()
    );
    let fid = s.create(&name, false)?;
    s.write_inline(fid, 0, &[0x30u8; IO_LEN as usize])?;
    let mut io = Io {
        s,
        fid,
        grants: Grants::default(),
    };
    let d = io.grant(IO_LEN as usize, Access::RemoteWrite)?;
    let descs = [d];
    let req = read_req(fid, IO_LEN, Channel::RdmaV1Invalidate, &descs);
    let bytes = io.s.build(Command::Read, 1, &req)?;
    let mut o = expect_status(&mut io.s, &bytes, STATUS_INVALID_PARAMETER);
    o.text = format!(
        "dialect {}, READ with SMB2_CHANNEL_RDMA_V1_INVALIDATE: {}",
        dialect_name(io.s.dialect),
        o.text
    );
    io.close(o)
}

/// Two descriptors naming the same bytes of one grant.
fn overlapping(d: BufferDescriptorRepr) -> [BufferDescriptorRepr; 2] {
    let half = BufferDescriptorRepr {
        length: d.length / 2,
        ..d
    };
    [half, half]
}

fn read_overlapping<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    io_case(rig, "overlapr", |io| {
        let d = io.grant(IO_LEN as usize, Access::RemoteWrite)?;
        let descs = overlapping(d);
        let req = read_req(io.fid, IO_LEN, Channel::RdmaV1, &descs);
        Ok((
            format!(
                "READ of {IO_LEN} bytes into two descriptors naming the same {} bytes",
                IO_LEN / 2
            ),
            io.s.build(Command::Read, 1, &req)?,
        ))
    })
}

/// A READ whose buffer the client revoked before sending it: the server's
/// RDMA Write is refused, which breaks the queue pair; the response the
/// server posts right behind the Write (docs/spec-notes.md, "A READ's
/// response follows its RDMA Write") must never arrive.
fn read_revoked<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let timeout = rig.timeout;
    io_case_expecting(
        rig,
        "readrevoked",
        |io| {
            let d = io.grant(IO_LEN as usize, Access::RemoteWrite)?;
            io.s.client_mut()
                .revoke(d.token)
                .map_err(|e| format!("revoke: {e}"))?;
            io.grants.rkeys.retain(|&k| k != d.token);
            let descs = [d];
            let req = read_req(io.fid, IO_LEN, Channel::RdmaV1Invalidate, &descs);
            Ok((
                format!("READ of {IO_LEN} bytes into a revoked buffer"),
                io.s.build(Command::Read, 1, &req)?,
            ))
        },
        |s, bytes| expect_disconnect(s, bytes, timeout),
    )
}

fn write_overlapping<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    io_case(rig, "overlapw", |io| {
        let d = io.grant(IO_LEN as usize, Access::RemoteRead)?;
        let descs = overlapping(d);
        let req = write_req(io.fid, IO_LEN, Channel::RdmaV1, &descs);
        Ok((
            format!(
                "WRITE of {IO_LEN} bytes from two descriptors naming the same {} bytes",
                IO_LEN / 2
            ),
            io.s.build(Command::Write, 1, &req)?,
        ))
    })
}
