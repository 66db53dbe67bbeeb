//! Compounded messages ([MS-SMB2] 3.2.4.1.4, 3.3.5.2.7): headers chained by
//! NextCommand, each starting 8-byte aligned. [`compound`] walks a received
//! chain; [`CompoundWriter`] builds one.

use core::ops::Range;

use super::body::Smb2Body;
use super::error::Smb2Error;
use super::header::{Header, HeaderRepr, HEADER_LEN};
use super::layout::{align8, room};
use super::message::{emit_message, RequestBody, ResponseBody};

/// One message of a (possibly single-message) compound: a checked header
/// and the body that follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    offset: usize,
    bytes: &'a [u8],
    header: HeaderRepr,
}

impl<'a> Message<'a> {
    /// Offset of this header from the start of the compound.
    pub fn offset(&self) -> usize {
        self.offset
    }
    /// The message: header, body and any padding up to NextCommand (what a
    /// signature covers, [MS-SMB2] 3.1.4.1).
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
    /// The parsed header.
    pub fn header(&self) -> &HeaderRepr {
        &self.header
    }
    /// The body: the bytes after the 64-byte header.
    pub fn body(&self) -> &'a [u8] {
        self.bytes.get(HEADER_LEN..).unwrap_or(&[])
    }
    /// True when SMB2_FLAGS_RELATED_OPERATIONS is set ([MS-SMB2] 3.3.5.2.7.2:
    /// use the previous request's SessionId, TreeId and FileId).
    pub fn is_related(&self) -> bool {
        self.header.is_related()
    }
    /// Decodes the body as the request the header's Command names.
    pub fn request_body(&self) -> Result<RequestBody<'a>, Smb2Error> {
        RequestBody::parse(self.header.command, self.body())
    }
    /// Decodes the body as the response the header's Command and Status
    /// name (an ERROR response where [`ResponseBody::parse`] says so).
    pub fn response_body(&self) -> Result<ResponseBody<'a>, Smb2Error> {
        ResponseBody::parse(&self.header, self.body())
    }
}

/// Walks the messages of a compound (a lone message is a compound of one).
///
/// Each item is a message whose header passed [`Header::new_checked`] and
/// [`HeaderRepr::parse`] and whose NextCommand is 0 or delimits a next
/// message: a multiple of 8 ([MS-SMB2] 2.2.1), at least 64 and less than the
/// bytes left. The first failure is yielded as `Err` and ends the walk: the
/// chain cannot be delimited past it ([`Smb2Error::server_action`] says
/// Disconnect). Bodies are not decoded here.
pub fn compound(bytes: &[u8]) -> CompoundIter<'_> {
    CompoundIter {
        bytes,
        pos: 0,
        done: false,
    }
}

/// Iterator returned by [`compound`].
#[derive(Debug, Clone)]
pub struct CompoundIter<'a> {
    bytes: &'a [u8],
    pos: usize,
    done: bool,
}

impl<'a> CompoundIter<'a> {
    fn step(&mut self) -> Result<Message<'a>, Smb2Error> {
        let rest = self.bytes.get(self.pos..).unwrap_or(&[]);
        let header = HeaderRepr::parse(&Header::new_checked(rest)?)?;
        let next = header.next_command;
        let offset = self.pos;
        if next == 0 {
            self.done = true;
            return Ok(Message {
                offset,
                bytes: rest,
                header,
            });
        }
        let n = next as usize;
        if next % 8 != 0 || n < HEADER_LEN || n >= rest.len() {
            return Err(Smb2Error::NextCommand {
                next_command: next,
                remaining: rest.len(),
            });
        }
        self.pos += n;
        Ok(Message {
            offset,
            bytes: &rest[..n],
            header,
        })
    }
}

impl<'a> Iterator for CompoundIter<'a> {
    type Item = Result<Message<'a>, Smb2Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let r = self.step();
        if r.is_err() {
            self.done = true;
        }
        Some(r)
    }
}

impl core::iter::FusedIterator for CompoundIter<'_> {}

/// Builds a compound into a caller buffer: each [`push`](Self::push) pads
/// the previous message to 8 bytes with zeros, appends header and body, and
/// sets the previous header's NextCommand to the distance ([MS-SMB2]
/// 3.2.4.1.4 for requests, 3.3.4.1.3 for responses). The last message keeps
/// NextCommand 0 and is not padded.
///
/// Sign after the last push: message *i* spans from its push's start to
/// the next push's start (padding included), the last one to
/// [`len`](Self::len).
#[derive(Debug)]
pub struct CompoundWriter<'b> {
    buf: &'b mut [u8],
    len: usize,
    last: Option<usize>,
}

impl<'b> CompoundWriter<'b> {
    /// An empty compound over `buf`.
    pub fn new(buf: &'b mut [u8]) -> Self {
        CompoundWriter {
            buf,
            len: 0,
            last: None,
        }
    }

    /// Appends one message; returns where its header starts and its body
    /// ends. `header.next_command` is ignored (written as 0, then patched by
    /// the next push).
    pub fn push<B: Smb2Body + ?Sized>(
        &mut self,
        header: &HeaderRepr,
        body: &B,
    ) -> Result<Range<usize>, Smb2Error> {
        let start = if self.last.is_some() {
            align8(self.len)
        } else {
            0
        };
        let need = start + HEADER_LEN + body.buffer_len();
        room("SMB2 compound", self.buf, need)?;
        let mut h = *header;
        h.next_command = 0;
        let n = emit_message(&h, body, &mut self.buf[start..])?;
        self.buf[self.len..start].fill(0);
        if let Some(prev) = self.last {
            let distance = u32::try_from(start - prev).map_err(|_| Smb2Error::TooLarge {
                what: "SMB2 compound",
                field: "NextCommand",
                value: (start - prev) as u64,
                max: u64::from(u32::MAX),
            })?;
            Header::new_unchecked(&mut self.buf[prev..]).set_next_command(distance);
        }
        self.last = Some(start);
        self.len = start + n;
        Ok(start..start + n)
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True before the first push.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The compound's length.
    pub fn finish(self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::smb2::{Command, EchoRequestRepr};

    #[test]
    fn writer_and_walker_agree_on_a_two_message_chain() {
        let mut buf = [0u8; 256];
        let mut w = CompoundWriter::new(&mut buf);
        let a = w
            .push(&HeaderRepr::request(Command::Echo, 1), &EchoRequestRepr)
            .unwrap();
        let b = w
            .push(&HeaderRepr::request(Command::Echo, 2), &EchoRequestRepr)
            .unwrap();
        assert_eq!(a, 0..68);
        assert_eq!(b, 72..140);
        let len = w.finish();
        let ids: Vec<u64> = compound(&buf[..len])
            .map(|m| m.unwrap().header().message_id)
            .collect();
        assert_eq!(ids, [1, 2]);
    }

    #[test]
    fn walker_is_fused_after_an_error() {
        let mut it = compound(&[0u8; 10]);
        assert!(matches!(
            it.next(),
            Some(Err(Smb2Error::ShortMessage { have: 10 }))
        ));
        assert!(it.next().is_none());
        assert!(it.next().is_none());
    }
}
