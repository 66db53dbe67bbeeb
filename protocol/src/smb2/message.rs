//! Whole messages: emitting a header and body, and decoding a body by the
//! header's Command ([MS-SMB2] 2.2.1, 3.3.5.2).

use super::body::Smb2Body;
use super::error::Smb2Error;
use super::header::{Command, HeaderRepr, HEADER_LEN};
use super::layout::room;
use super::*;
use crate::ntstatus::{STATUS_BUFFER_OVERFLOW, STATUS_MORE_PROCESSING_REQUIRED, STATUS_SUCCESS};

/// Writes `header` then `body` into `buf`; returns the bytes written. Fails
/// with `Malformed` when the header's Command is not the body's (an ERROR
/// response body goes with any Command).
pub fn emit_message<B: Smb2Body + ?Sized>(
    header: &HeaderRepr,
    body: &B,
    buf: &mut [u8],
) -> Result<usize, Smb2Error> {
    if body.command().is_some_and(|c| c != header.command) {
        return Err(Smb2Error::Malformed {
            what: "SMB2 header",
            field: "Command (differs from the body's command)",
        });
    }
    room("SMB2 message", buf, HEADER_LEN + body.buffer_len())?;
    header.emit(buf)?;
    let n = body.emit(&mut buf[HEADER_LEN..])?;
    Ok(HEADER_LEN + n)
}

/// A decoded request body, by command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestBody<'a> {
    /// 2.2.3.
    Negotiate(NegotiateRequestRepr<'a>),
    /// 2.2.5.
    SessionSetup(SessionSetupRequestRepr<'a>),
    /// 2.2.7.
    Logoff(LogoffRequestRepr),
    /// 2.2.9.
    TreeConnect(TreeConnectRequestRepr<'a>),
    /// 2.2.11.
    TreeDisconnect(TreeDisconnectRequestRepr),
    /// 2.2.13.
    Create(CreateRequestRepr<'a>),
    /// 2.2.15.
    Close(CloseRequestRepr),
    /// 2.2.17.
    Flush(FlushRequestRepr),
    /// 2.2.19.
    Read(ReadRequestRepr<'a>),
    /// 2.2.21.
    Write(WriteRequestRepr<'a>),
    /// 2.2.31.
    Ioctl(IoctlRequestRepr<'a>),
    /// 2.2.30.
    Cancel(CancelRequestRepr),
    /// 2.2.28.
    Echo(EchoRequestRepr),
    /// 2.2.26.
    Lock(LockRequestRepr<'a>),
    /// 2.2.33.
    QueryDirectory(QueryDirectoryRequestRepr<'a>),
    /// 2.2.35.
    ChangeNotify(ChangeNotifyRequestRepr),
    /// 2.2.37.
    QueryInfo(QueryInfoRequestRepr<'a>),
    /// 2.2.39.
    SetInfo(SetInfoRequestRepr<'a>),
    /// 2.2.24 (acknowledgment: oplock or lease form).
    OplockBreak(OplockBreakRepr),
}

impl<'a> RequestBody<'a> {
    /// Checks and decodes `body` as the request `command` names. Only
    /// SERVER_TO_CLIENT_NOTIFICATION (never a request) is
    /// `UnsupportedCommand` (STATUS_NOT_SUPPORTED). Every command a server
    /// does not implement still decodes, so a malformed body of it is
    /// STATUS_INVALID_PARAMETER like any other; the server answers a
    /// well-formed one STATUS_NOT_SUPPORTED itself.
    pub fn parse(command: Command, body: &'a [u8]) -> Result<Self, Smb2Error> {
        Ok(match command {
            Command::Negotiate => RequestBody::Negotiate(NegotiateRequestRepr::from_body(body)?),
            Command::SessionSetup => {
                RequestBody::SessionSetup(SessionSetupRequestRepr::from_body(body)?)
            }
            Command::Logoff => RequestBody::Logoff(LogoffRequestRepr::from_body(body)?),
            Command::TreeConnect => {
                RequestBody::TreeConnect(TreeConnectRequestRepr::from_body(body)?)
            }
            Command::TreeDisconnect => {
                RequestBody::TreeDisconnect(TreeDisconnectRequestRepr::from_body(body)?)
            }
            Command::Create => RequestBody::Create(CreateRequestRepr::from_body(body)?),
            Command::Close => RequestBody::Close(CloseRequestRepr::from_body(body)?),
            Command::Flush => RequestBody::Flush(FlushRequestRepr::from_body(body)?),
            Command::Read => RequestBody::Read(ReadRequestRepr::from_body(body)?),
            Command::Write => RequestBody::Write(WriteRequestRepr::from_body(body)?),
            Command::Ioctl => RequestBody::Ioctl(IoctlRequestRepr::from_body(body)?),
            Command::Cancel => RequestBody::Cancel(CancelRequestRepr::from_body(body)?),
            Command::Echo => RequestBody::Echo(EchoRequestRepr::from_body(body)?),
            Command::Lock => RequestBody::Lock(LockRequestRepr::from_body(body)?),
            Command::QueryDirectory => {
                RequestBody::QueryDirectory(QueryDirectoryRequestRepr::from_body(body)?)
            }
            Command::ChangeNotify => {
                RequestBody::ChangeNotify(ChangeNotifyRequestRepr::from_body(body)?)
            }
            Command::QueryInfo => RequestBody::QueryInfo(QueryInfoRequestRepr::from_body(body)?),
            Command::SetInfo => RequestBody::SetInfo(SetInfoRequestRepr::from_body(body)?),
            Command::OplockBreak => RequestBody::OplockBreak(OplockBreakRepr::from_body(body)?),
            other => return Err(Smb2Error::UnsupportedCommand { command: other }),
        })
    }

    /// The body as an emittable value.
    pub fn as_body(&self) -> &dyn Smb2Body {
        match self {
            RequestBody::Negotiate(r) => r,
            RequestBody::SessionSetup(r) => r,
            RequestBody::Logoff(r) => r,
            RequestBody::TreeConnect(r) => r,
            RequestBody::TreeDisconnect(r) => r,
            RequestBody::Create(r) => r,
            RequestBody::Close(r) => r,
            RequestBody::Flush(r) => r,
            RequestBody::Read(r) => r,
            RequestBody::Write(r) => r,
            RequestBody::Ioctl(r) => r,
            RequestBody::Cancel(r) => r,
            RequestBody::Echo(r) => r,
            RequestBody::Lock(r) => r,
            RequestBody::QueryDirectory(r) => r,
            RequestBody::ChangeNotify(r) => r,
            RequestBody::QueryInfo(r) => r,
            RequestBody::SetInfo(r) => r,
            RequestBody::OplockBreak(r) => r,
        }
    }

    /// The command.
    pub fn command(&self) -> Command {
        match self {
            RequestBody::Negotiate(_) => Command::Negotiate,
            RequestBody::SessionSetup(_) => Command::SessionSetup,
            RequestBody::Logoff(_) => Command::Logoff,
            RequestBody::TreeConnect(_) => Command::TreeConnect,
            RequestBody::TreeDisconnect(_) => Command::TreeDisconnect,
            RequestBody::Create(_) => Command::Create,
            RequestBody::Close(_) => Command::Close,
            RequestBody::Flush(_) => Command::Flush,
            RequestBody::Read(_) => Command::Read,
            RequestBody::Write(_) => Command::Write,
            RequestBody::Ioctl(_) => Command::Ioctl,
            RequestBody::Cancel(_) => Command::Cancel,
            RequestBody::Echo(_) => Command::Echo,
            RequestBody::Lock(_) => Command::Lock,
            RequestBody::QueryDirectory(_) => Command::QueryDirectory,
            RequestBody::ChangeNotify(_) => Command::ChangeNotify,
            RequestBody::QueryInfo(_) => Command::QueryInfo,
            RequestBody::SetInfo(_) => Command::SetInfo,
            RequestBody::OplockBreak(_) => Command::OplockBreak,
        }
    }
}

/// A decoded response body, by command (or the ERROR response).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseBody<'a> {
    /// 2.2.2, for any command.
    Error(ErrorResponseRepr<'a>),
    /// 2.2.4.
    Negotiate(NegotiateResponseRepr<'a>),
    /// 2.2.6.
    SessionSetup(SessionSetupResponseRepr<'a>),
    /// 2.2.8.
    Logoff(LogoffResponseRepr),
    /// 2.2.10.
    TreeConnect(TreeConnectResponseRepr),
    /// 2.2.12.
    TreeDisconnect(TreeDisconnectResponseRepr),
    /// 2.2.14.
    Create(CreateResponseRepr<'a>),
    /// 2.2.16.
    Close(CloseResponseRepr),
    /// 2.2.18.
    Flush(FlushResponseRepr),
    /// 2.2.20.
    Read(ReadResponseRepr<'a>),
    /// 2.2.22.
    Write(WriteResponseRepr),
    /// 2.2.32.
    Ioctl(IoctlResponseRepr<'a>),
    /// 2.2.29.
    Echo(EchoResponseRepr),
    /// 2.2.27.
    Lock(LockResponseRepr),
    /// 2.2.34.
    QueryDirectory(QueryDirectoryResponseRepr<'a>),
    /// 2.2.36.
    ChangeNotify(ChangeNotifyResponseRepr<'a>),
    /// 2.2.38.
    QueryInfo(QueryInfoResponseRepr<'a>),
    /// 2.2.40.
    SetInfo(SetInfoResponseRepr),
    /// 2.2.25 response or 2.2.23.1 notification (oplock or lease form of
    /// 24 or 36 bytes).
    OplockBreak(OplockBreakRepr),
}

impl<'a> ResponseBody<'a> {
    /// Checks and decodes a response body.
    ///
    /// It is an ERROR response ([MS-SMB2] 2.2.2) when Status is not
    /// STATUS_SUCCESS, the body's StructureSize is 9 and it is not the
    /// SESSION_SETUP response that carries STATUS_MORE_PROCESSING_REQUIRED
    /// (3.2.5.3.1), nor a QUERY_INFO, QUERY_DIRECTORY or CHANGE_NOTIFY
    /// response (StructureSize 9 too) carrying STATUS_BUFFER_OVERFLOW, the
    /// warning of an output truncated to OutputBufferLength (3.3.5.20,
    /// 3.2.5.1.6). Other non-success statuses with the command's own
    /// StructureSize (STATUS_BUFFER_OVERFLOW on READ or IOCTL, 3.2.5.1.x)
    /// decode as the command's response.
    pub fn parse(header: &HeaderRepr, body: &'a [u8]) -> Result<Self, Smb2Error> {
        let structure_size = body.get(0..2).map(|s| u16::from_le_bytes([s[0], s[1]]));
        let session_continues = header.command == Command::SessionSetup
            && header.status == STATUS_MORE_PROCESSING_REQUIRED;
        let truncated_output = header.status == STATUS_BUFFER_OVERFLOW
            && matches!(
                header.command,
                Command::QueryInfo | Command::QueryDirectory | Command::ChangeNotify
            );
        if header.status != STATUS_SUCCESS
            && structure_size == Some(ErrorResponse::<&[u8]>::STRUCTURE_SIZE)
            && !session_continues
            && !truncated_output
        {
            return Ok(ResponseBody::Error(ErrorResponseRepr::from_body(body)?));
        }
        Ok(match header.command {
            Command::Negotiate => ResponseBody::Negotiate(NegotiateResponseRepr::from_body(body)?),
            Command::SessionSetup => {
                ResponseBody::SessionSetup(SessionSetupResponseRepr::from_body(body)?)
            }
            Command::Logoff => ResponseBody::Logoff(LogoffResponseRepr::from_body(body)?),
            Command::TreeConnect => {
                ResponseBody::TreeConnect(TreeConnectResponseRepr::from_body(body)?)
            }
            Command::TreeDisconnect => {
                ResponseBody::TreeDisconnect(TreeDisconnectResponseRepr::from_body(body)?)
            }
            Command::Create => ResponseBody::Create(CreateResponseRepr::from_body(body)?),
            Command::Close => ResponseBody::Close(CloseResponseRepr::from_body(body)?),
            Command::Flush => ResponseBody::Flush(FlushResponseRepr::from_body(body)?),
            Command::Read => ResponseBody::Read(ReadResponseRepr::from_body(body)?),
            Command::Write => ResponseBody::Write(WriteResponseRepr::from_body(body)?),
            Command::Ioctl => ResponseBody::Ioctl(IoctlResponseRepr::from_body(body)?),
            Command::Echo => ResponseBody::Echo(EchoResponseRepr::from_body(body)?),
            Command::Lock => ResponseBody::Lock(LockResponseRepr::from_body(body)?),
            Command::QueryDirectory => {
                ResponseBody::QueryDirectory(QueryDirectoryResponseRepr::from_body(body)?)
            }
            Command::ChangeNotify => {
                ResponseBody::ChangeNotify(ChangeNotifyResponseRepr::from_body(body)?)
            }
            Command::QueryInfo => ResponseBody::QueryInfo(QueryInfoResponseRepr::from_body(body)?),
            Command::SetInfo => ResponseBody::SetInfo(SetInfoResponseRepr::from_body(body)?),
            Command::OplockBreak => ResponseBody::OplockBreak(OplockBreakRepr::from_body(body)?),
            other => return Err(Smb2Error::UnsupportedCommand { command: other }),
        })
    }

    /// The body as an emittable value.
    pub fn as_body(&self) -> &dyn Smb2Body {
        match self {
            ResponseBody::Error(r) => r,
            ResponseBody::Negotiate(r) => r,
            ResponseBody::SessionSetup(r) => r,
            ResponseBody::Logoff(r) => r,
            ResponseBody::TreeConnect(r) => r,
            ResponseBody::TreeDisconnect(r) => r,
            ResponseBody::Create(r) => r,
            ResponseBody::Close(r) => r,
            ResponseBody::Flush(r) => r,
            ResponseBody::Read(r) => r,
            ResponseBody::Write(r) => r,
            ResponseBody::Ioctl(r) => r,
            ResponseBody::Echo(r) => r,
            ResponseBody::Lock(r) => r,
            ResponseBody::QueryDirectory(r) => r,
            ResponseBody::ChangeNotify(r) => r,
            ResponseBody::QueryInfo(r) => r,
            ResponseBody::SetInfo(r) => r,
            ResponseBody::OplockBreak(r) => r,
        }
    }
}
