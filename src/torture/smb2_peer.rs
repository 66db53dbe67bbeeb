//! A raw SMB2 client over one SMB Direct connection: requests are built
//! with the `smbdirect_protocol::smb2` codecs and may then be broken byte
//! by byte before they are sent; MessageIds and credits are kept by hand
//! ([MS-SMB2] 3.2.4.1.3, 3.2.5.1.4), so a case can also step outside the
//! CommandSequenceWindow on purpose. `smbdirect_dataplane::smb2::client`
//! is the client for well-formed traffic; this one exists to send what a
//! correct client never would.

use super::rig::Rig;
use smbdirect_dataplane::client::Client;
use smbdirect_dataplane::provider::Provider;
use smbdirect_protocol::ntstatus::{NtStatus, STATUS_SUCCESS};
use smbdirect_protocol::smb2::{
    compound, emit_message, AccessMask, Capabilities, CloseFlags, CloseRequestRepr,
    CreateContextList, CreateDisposition, CreateOptions, CreateRequestRepr, EchoRequestRepr,
    FileAttributes, FileId, Guid, HashAlgorithm, HeaderId, HeaderRepr, ImpersonationLevel,
    IoctlRequestRepr, NegotiateContext, NegotiateContextList, NegotiateRequestRepr, OplockLevel,
    PreauthIntegrityCapabilities, ResponseBody, SecurityMode, SessionSetupFlags,
    SessionSetupRequestRepr, ShareAccess, Smb2Body, TreeConnectFlags, TreeConnectRequestRepr,
    U16Array, Utf16Str, WriteFlags, WriteRequestRepr, HEADER_LEN,
};
use smbdirect_protocol::smb2::{Channel, ChannelInfo, Command};
use std::time::Duration;

/// Credits every request asks for ([MS-SMB2] 3.2.4.1.5 CreditRequest).
const CREDIT_REQUEST: u16 = 64;

/// The dialects a torture session offers.
pub const DIALECTS: [u16; 3] = [0x0300, 0x0302, 0x0311];

/// An SMB2 NEGOTIATE request offering [`DIALECTS`] with a preauth
/// integrity context, MessageId `message_id`.
pub fn negotiate_request_bytes(message_id: u64) -> Vec<u8> {
    negotiate_bytes(message_id, &DIALECTS)
}

fn negotiate_bytes(message_id: u64, dialects: &[u16]) -> Vec<u8> {
    let salt = [0x3cu8; 32];
    let hashes = [HashAlgorithm::SHA_512.0];
    let ctxs = [NegotiateContext::PreauthIntegrity(
        PreauthIntegrityCapabilities {
            hash_algorithms: U16Array::new(&hashes),
            salt: &salt,
        },
    )];
    let with_311 = dialects.contains(&0x0311);
    let req = NegotiateRequestRepr {
        security_mode: SecurityMode::SIGNING_ENABLED,
        capabilities: Capabilities::LARGE_MTU,
        client_guid: Guid::from_bytes(*b"smbdirectd-tort!"),
        dialects: U16Array::new(dialects),
        negotiate_contexts: if with_311 {
            NegotiateContextList::new(&ctxs)
        } else {
            NegotiateContextList::EMPTY
        },
    };
    let mut h = HeaderRepr::request(Command::Negotiate, message_id);
    h.credit_charge = 0;
    h.credit = CREDIT_REQUEST;
    let mut buf = vec![0u8; HEADER_LEN + req.buffer_len()];
    let n = emit_message(&h, &req, &mut buf).unwrap_or(0);
    buf.truncate(n);
    buf
}

/// A response: its header and body bytes.
#[derive(Debug, Clone)]
pub struct Resp {
    /// The SMB2 header.
    pub header: HeaderRepr,
    /// The body (after the header).
    pub body: Vec<u8>,
}

impl Resp {
    /// The decoded body, if it decodes.
    pub fn decoded(&self) -> Option<ResponseBody<'_>> {
        ResponseBody::parse(&self.header, &self.body).ok()
    }
}

/// What waiting for a response produced.
#[derive(Debug)]
pub enum Reply {
    /// An SMB2 response.
    Response(Resp),
    /// A message that is not an SMB2 response.
    Garbage(String),
    /// The connection ended.
    Closed(String),
    /// Nothing arrived in time.
    Silent,
}

impl Reply {
    /// A short description for observations.
    pub fn describe(&self) -> String {
        match self {
            Reply::Response(r) => {
                format!("{:?} response with {}", r.header.command, r.header.status)
            }
            Reply::Garbage(s) => format!("a message that is not an SMB2 response ({s})"),
            Reply::Closed(e) => format!("connection closed ({e})"),
            Reply::Silent => "nothing".into(),
        }
    }
}

/// One raw SMB2 session over SMB Direct.
pub struct Smb2Peer<P: Provider> {
    c: Client<P>,
    next_id: u64,
    credits: u32,
    /// Credits each request asks for.
    pub credit_request: u16,
    /// SessionId requests carry.
    pub session: u64,
    /// TreeId requests carry.
    pub tree: u32,
    /// The negotiated dialect (0 before NEGOTIATE).
    pub dialect: u16,
    /// The server's MaxReadSize.
    pub max_read: u32,
    /// The server's MaxWriteSize.
    pub max_write: u32,
    server: String,
    share: String,
    timeout: Duration,
}

impl<P: Provider> Smb2Peer<P> {
    /// Connects and negotiates SMB Direct; no SMB2 message yet.
    pub fn connect(rig: &Rig<P>) -> Result<Self, String> {
        Ok(Smb2Peer {
            c: rig.client()?,
            next_id: 0,
            credits: 1,
            credit_request: CREDIT_REQUEST,
            session: 0,
            tree: 0,
            dialect: 0,
            max_read: 0,
            max_write: 0,
            server: rig.addr.ip().to_string(),
            share: rig.share.clone(),
            timeout: rig.timeout.max(Duration::from_secs(5)),
        })
    }

    /// A session with an open file: NEGOTIATE, SESSION_SETUP (anonymous),
    /// TREE_CONNECT to the share, CREATE of a fresh file.
    pub fn with_file(rig: &mut Rig<P>, what: &str) -> Result<(Self, FileId), String> {
        let mut s = Self::connect(rig)?;
        s.negotiate()?;
        s.session_setup()?;
        s.tree_connect()?;
        let name = format!(
            "torture-{what}-{}-{}.bin",
            std::process::id(),
            rig.next_seq()
        );
        let fid = s.create(&name, false)?;
        Ok((s, fid))
    }

    /// The SMB Direct connection.
    pub fn client_mut(&mut self) -> &mut Client<P> {
        &mut self.c
    }

    /// MessageIds (credits) granted and not yet used.
    pub fn credits(&self) -> u32 {
        self.credits
    }

    /// The lowest MessageId not yet used.
    pub fn next_message_id(&self) -> u64 {
        self.next_id
    }

    /// A request header using the next `charge` MessageIds (at least one),
    /// with this session's SessionId and TreeId.
    pub fn header(&mut self, command: Command, charge: u16) -> HeaderRepr {
        let n = u64::from(charge.max(1));
        let mut h = HeaderRepr::request(command, self.next_id);
        self.next_id += n;
        self.credits = self.credits.saturating_sub(n as u32);
        h.credit_charge = charge;
        h.credit = self.credit_request;
        h.session_id = self.session;
        h.id = HeaderId::Sync {
            process_id: 0xFEFF,
            tree_id: self.tree,
        };
        h
    }

    /// The bytes of a request (header from [`Smb2Peer::header`]).
    pub fn build<B: Smb2Body + ?Sized>(
        &mut self,
        command: Command,
        charge: u16,
        body: &B,
    ) -> Result<Vec<u8>, String> {
        let h = self.header(command, charge);
        message_bytes(&h, body)
    }

    /// Sends one message (one SMB Direct upper-layer message).
    pub fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.c.send(bytes).map_err(|e| format!("send: {e}"))
    }

    /// Waits up to `timeout` for the next message.
    pub fn recv(&mut self, timeout: Duration) -> Reply {
        let r = self.c.recv_with(timeout, |m| match compound(m).next() {
            Some(Ok(msg)) if msg.header().is_response() => Ok(Resp {
                header: *msg.header(),
                body: msg.body().to_vec(),
            }),
            Some(Ok(_)) => Err("a request".to_string()),
            Some(Err(e)) => Err(e.to_string()),
            None => Err("empty".to_string()),
        });
        match r {
            Ok(Ok(resp)) => {
                self.credits = self.credits.saturating_add(u32::from(resp.header.credit));
                Reply::Response(resp)
            }
            Ok(Err(e)) => Reply::Garbage(e),
            Err(smbdirect_dataplane::client::ClientError::Timeout(_)) => Reply::Silent,
            Err(e) => Reply::Closed(e.to_string()),
        }
    }

    /// Sends `bytes` and waits for the response.
    pub fn exchange(&mut self, bytes: &[u8]) -> Reply {
        if let Err(e) = self.send(bytes) {
            return Reply::Closed(e);
        }
        self.recv(self.timeout)
    }

    /// A request and its response; anything but a response is an error.
    pub fn call<B: Smb2Body + ?Sized>(
        &mut self,
        command: Command,
        charge: u16,
        body: &B,
    ) -> Result<Resp, String> {
        let bytes = self.build(command, charge, body)?;
        match self.exchange(&bytes) {
            Reply::Response(r) => Ok(r),
            other => Err(format!("{command:?}: {}", other.describe())),
        }
    }

    /// [`Smb2Peer::call`] that must succeed.
    fn call_ok<B: Smb2Body + ?Sized>(
        &mut self,
        command: Command,
        charge: u16,
        body: &B,
    ) -> Result<Resp, String> {
        let r = self.call(command, charge, body)?;
        if r.header.status != STATUS_SUCCESS {
            return Err(format!("{command:?} failed: {}", r.header.status));
        }
        Ok(r)
    }

    /// SMB2 NEGOTIATE offering SMB 3.0, 3.0.2 and 3.1.1.
    pub fn negotiate(&mut self) -> Result<(), String> {
        self.negotiate_dialects(&DIALECTS)
    }

    /// SMB2 NEGOTIATE offering `dialects`.
    pub fn negotiate_dialects(&mut self, dialects: &[u16]) -> Result<(), String> {
        let bytes = negotiate_bytes(self.next_id, dialects);
        self.next_id += 1;
        self.credits = self.credits.saturating_sub(1);
        let r = match self.exchange(&bytes) {
            Reply::Response(r) => r,
            other => return Err(format!("NEGOTIATE: {}", other.describe())),
        };
        match r.decoded() {
            Some(ResponseBody::Negotiate(n)) if r.header.status == STATUS_SUCCESS => {
                self.dialect = n.dialect_revision;
                self.max_read = n.max_read_size;
                self.max_write = n.max_write_size;
                Ok(())
            }
            _ => Err(format!("NEGOTIATE answered {}", r.header.status)),
        }
    }

    /// SESSION_SETUP with an empty security buffer (an anonymous session).
    pub fn session_setup(&mut self) -> Result<(), String> {
        let req = SessionSetupRequestRepr {
            flags: SessionSetupFlags::empty(),
            security_mode: SecurityMode::SIGNING_ENABLED,
            capabilities: Capabilities::empty(),
            channel: 0,
            previous_session_id: 0,
            security_buffer: &[],
        };
        let r = self.call_ok(Command::SessionSetup, 1, &req)?;
        self.session = r.header.session_id;
        Ok(())
    }

    /// TREE_CONNECT to `\\SERVER\SHARE`.
    pub fn tree_connect(&mut self) -> Result<(), String> {
        let path = format!("\\\\{}\\{}", self.server, self.share);
        let req = TreeConnectRequestRepr {
            flags: TreeConnectFlags::empty(),
            path: Utf16Str::new(&path),
        };
        let r = self.call_ok(Command::TreeConnect, 1, &req)?;
        self.tree = r.header.tree_id().unwrap_or(0);
        Ok(())
    }

    /// CREATE (OPEN_IF) of a file, or of a directory with `directory`.
    pub fn create(&mut self, name: &str, directory: bool) -> Result<FileId, String> {
        let r = self.call_ok(Command::Create, 1, &create_request(name, directory))?;
        match r.decoded() {
            Some(ResponseBody::Create(c)) => Ok(c.file_id),
            _ => Err("CREATE response does not decode".into()),
        }
    }

    /// WRITE of `data` inline at `offset`.
    pub fn write_inline(&mut self, fid: FileId, offset: u64, data: &[u8]) -> Result<(), String> {
        let req = WriteRequestRepr {
            offset,
            file_id: fid,
            channel: Channel::None,
            remaining_bytes: 0,
            flags: WriteFlags::empty(),
            data,
            channel_info: ChannelInfo::EMPTY,
        };
        let charge = HeaderRepr::credit_charge_for(data.len() as u64);
        self.ensure_credits(u32::from(charge))?;
        self.call_ok(Command::Write, charge, &req).map(|_| ())
    }

    /// SMB2 ECHO; its status.
    pub fn echo(&mut self, timeout: Duration) -> Result<NtStatus, String> {
        let bytes = self.build(Command::Echo, 1, &EchoRequestRepr)?;
        self.send(&bytes)?;
        match self.recv(timeout) {
            Reply::Response(r) if r.header.command == Command::Echo => Ok(r.header.status),
            other => Err(format!("ECHO: {}", other.describe())),
        }
    }

    /// FSCTL on `fid`: (status, output).
    pub fn ioctl(
        &mut self,
        fid: FileId,
        ctl_code: u32,
        input: &[u8],
        max_output: u32,
    ) -> Result<(NtStatus, Vec<u8>), String> {
        let req = IoctlRequestRepr::fsctl(ctl_code, fid, input, max_output);
        let r = self.call(Command::Ioctl, 1, &req)?;
        let out = match r.decoded() {
            Some(ResponseBody::Ioctl(i)) => i.output.to_vec(),
            _ => Vec::new(),
        };
        Ok((r.header.status, out))
    }

    /// Asks for credits (ECHOs requesting 256 each) until `n` are held.
    pub fn ensure_credits(&mut self, n: u32) -> Result<(), String> {
        let keep = self.credit_request;
        self.credit_request = 256;
        let mut tries = 0;
        while self.credits < n && tries < 16 {
            let st = self.echo(self.timeout);
            tries += 1;
            if let Err(e) = st {
                self.credit_request = keep;
                return Err(e);
            }
        }
        self.credit_request = keep;
        if self.credits < n {
            return Err(format!("holding {} SMB2 credits, {n} needed", self.credits));
        }
        Ok(())
    }

    /// CLOSE of `fid` (errors ignored: cleanup).
    pub fn close_file(&mut self, fid: FileId) {
        let req = CloseRequestRepr {
            flags: CloseFlags::empty(),
            file_id: fid,
        };
        let _ = self.call(Command::Close, 1, &req);
    }

    /// Whether the session still answers an ECHO with STATUS_SUCCESS; the
    /// text for an observation.
    pub fn still_usable(&mut self) -> Result<(), String> {
        match self.echo(self.timeout) {
            Ok(st) if st == STATUS_SUCCESS => Ok(()),
            Ok(st) => Err(format!("a following ECHO got {st}")),
            Err(e) => Err(format!("a following {e}")),
        }
    }

    /// Closes the SMB Direct connection.
    pub fn close(self) {
        let _ = self.c.close(Duration::from_secs(2));
    }
}

/// The CREATE request [`Smb2Peer::create`] sends: OPEN_IF, read and write
/// access and sharing, no create contexts.
pub fn create_request(name: &str, directory: bool) -> CreateRequestRepr<'_> {
    CreateRequestRepr {
        security_flags: 0,
        requested_oplock_level: OplockLevel::NONE,
        impersonation_level: ImpersonationLevel::IMPERSONATION,
        smb_create_flags: 0,
        desired_access: AccessMask::GENERIC_READ | AccessMask::GENERIC_WRITE,
        file_attributes: if directory {
            FileAttributes::DIRECTORY
        } else {
            FileAttributes::NORMAL
        },
        share_access: ShareAccess::READ | ShareAccess::WRITE,
        create_disposition: CreateDisposition::OPEN_IF,
        create_options: if directory {
            CreateOptions::DIRECTORY_FILE
        } else {
            CreateOptions::NON_DIRECTORY_FILE
        },
        name: Utf16Str::new(name),
        create_contexts: CreateContextList::EMPTY,
    }
}

/// Header and body as bytes (the codec refuses what it cannot encode,
/// such as an RDMA channel without descriptors: patch those in after).
pub fn message_bytes<B: Smb2Body + ?Sized>(h: &HeaderRepr, body: &B) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; HEADER_LEN + body.buffer_len().max(64)];
    let n =
        emit_message(h, body, &mut buf).map_err(|e| format!("encoding {:?}: {e}", h.command))?;
    buf.truncate(n);
    Ok(buf)
}

/// The dialect the session negotiated, for observations.
pub fn dialect_name(d: u16) -> String {
    match d {
        0x0300 => "3.0".into(),
        0x0302 => "3.0.2".into(),
        0x0311 => "3.1.1".into(),
        _ => format!("{d:#06x}"),
    }
}
