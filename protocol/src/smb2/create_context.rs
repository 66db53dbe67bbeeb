//! [MS-SMB2] 2.2.13.2 SMB2_CREATE_CONTEXT Request Values (and the response
//! values of 2.2.14.2, which share the layout): a chain of contexts linked
//! by Next, each with a Name and Data located from the context's start.
//!
//! Receive rules (every failure is STATUS_INVALID_PARAMETER): a context has
//! its 16-byte header; Next is 0 (last) or a multiple of 8 that stays inside
//! the list; Name is non-empty and lies after the header and inside the
//! context (up to Next, or the end of the list for the last one); Data,
//! when non-empty, lies there too, 8-byte aligned, not overlapping Name.
//! Contents are opaque: a server interprets the names it knows.

use super::error::Smb2Error;
use super::layout::{align8, check_disjoint, fit, resolve_in, Region};
use super::Scalar;

/// Byte ranges of [MS-SMB2] 2.2.13.2 (relative to the context).
mod field {
    use crate::smb2::Field;
    pub const NEXT: Field = 0..4;
    pub const NAME_OFFSET: Field = 4..6;
    pub const NAME_LENGTH: Field = 6..8;
    pub const RESERVED: Field = 8..10;
    pub const DATA_OFFSET: Field = 10..12;
    pub const DATA_LENGTH: Field = 12..16;
    /// Length of the header; Buffer starts here.
    pub const HEADER_LEN: usize = 16;
}

const WHAT: &str = "SMB2_CREATE_CONTEXT";

/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_EA_BUFFER.
pub const SMB2_CREATE_EA_BUFFER: &[u8; 4] = b"ExtA";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_SD_BUFFER.
pub const SMB2_CREATE_SD_BUFFER: &[u8; 4] = b"SecD";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_DURABLE_HANDLE_REQUEST.
pub const SMB2_CREATE_DURABLE_HANDLE_REQUEST: &[u8; 4] = b"DHnQ";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_DURABLE_HANDLE_RECONNECT.
pub const SMB2_CREATE_DURABLE_HANDLE_RECONNECT: &[u8; 4] = b"DHnC";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_ALLOCATION_SIZE.
pub const SMB2_CREATE_ALLOCATION_SIZE: &[u8; 4] = b"AlSi";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_QUERY_MAXIMAL_ACCESS_REQUEST.
pub const SMB2_CREATE_QUERY_MAXIMAL_ACCESS_REQUEST: &[u8; 4] = b"MxAc";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_TIMEWARP_TOKEN.
pub const SMB2_CREATE_TIMEWARP_TOKEN: &[u8; 4] = b"TWrp";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_QUERY_ON_DISK_ID.
pub const SMB2_CREATE_QUERY_ON_DISK_ID: &[u8; 4] = b"QFid";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_REQUEST_LEASE (and _V2).
pub const SMB2_CREATE_REQUEST_LEASE: &[u8; 4] = b"RqLs";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_DURABLE_HANDLE_REQUEST_V2.
pub const SMB2_CREATE_DURABLE_HANDLE_REQUEST_V2: &[u8; 4] = b"DH2Q";
/// [MS-SMB2] 2.2.13.2 SMB2_CREATE_DURABLE_HANDLE_RECONNECT_V2.
pub const SMB2_CREATE_DURABLE_HANDLE_RECONNECT_V2: &[u8; 4] = b"DH2C";

/// One create context: its Name and Data, both opaque.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateContext<'a> {
    /// Name (usually 4 ASCII bytes, sometimes a 16-byte GUID).
    pub name: &'a [u8],
    /// Data.
    pub data: &'a [u8],
}

impl<'a> CreateContext<'a> {
    /// A context to emit.
    pub const fn new(name: &'a [u8], data: &'a [u8]) -> Self {
        CreateContext { name, data }
    }

    fn data_offset(&self) -> usize {
        if self.data.is_empty() {
            0
        } else {
            align8(field::HEADER_LEN + self.name.len())
        }
    }

    /// Bytes of this context on the wire, without trailing padding.
    pub fn buffer_len(&self) -> usize {
        if self.data.is_empty() {
            field::HEADER_LEN + self.name.len()
        } else {
            self.data_offset() + self.data.len()
        }
    }

    fn check_emit(&self) -> Result<(), Smb2Error> {
        if self.name.is_empty() {
            return Err(Smb2Error::Malformed {
                what: WHAT,
                field: "NameLength (0)",
            });
        }
        fit::<u16>(WHAT, "NameLength", self.name.len())?;
        fit::<u16>(WHAT, "DataOffset", self.data_offset())?;
        fit::<u32>(WHAT, "DataLength", self.data.len())?;
        fit::<u32>(WHAT, "Next", align8(self.buffer_len()))?;
        Ok(())
    }

    /// Writes the context with the given Next into `dst` (exactly
    /// [`buffer_len`](Self::buffer_len) bytes, zeroed).
    fn write(&self, dst: &mut [u8], next: u32) {
        next.write(dst, field::NEXT);
        (field::HEADER_LEN as u16).write(dst, field::NAME_OFFSET);
        (self.name.len() as u16).write(dst, field::NAME_LENGTH);
        0u16.write(dst, field::RESERVED);
        (self.data_offset() as u16).write(dst, field::DATA_OFFSET);
        (self.data.len() as u32).write(dst, field::DATA_LENGTH);
        let n = field::HEADER_LEN;
        dst[n..n + self.name.len()].copy_from_slice(self.name);
        let d = self.data_offset();
        dst[d..d + self.data.len()].copy_from_slice(self.data);
    }
}

/// Walks a create context chain (the bytes CreateContextsOffset and
/// CreateContextsLength name). The first malformed context is yielded as
/// `Err` and ends the walk.
#[derive(Debug, Clone)]
pub struct CreateContextIter<'a> {
    list: &'a [u8],
    pos: usize,
    done: bool,
}

impl<'a> CreateContextIter<'a> {
    /// Walks `list`.
    pub fn new(list: &'a [u8]) -> Self {
        CreateContextIter {
            list,
            pos: 0,
            done: list.is_empty(),
        }
    }

    fn step(&mut self) -> Result<CreateContext<'a>, Smb2Error> {
        let ctx = self.list.get(self.pos..).unwrap_or(&[]);
        if ctx.len() < field::HEADER_LEN {
            return Err(Smb2Error::Truncated {
                what: WHAT,
                need: field::HEADER_LEN,
                have: ctx.len(),
            });
        }
        let next = u32::read(ctx, field::NEXT);
        let extent = if next == 0 {
            ctx.len()
        } else {
            if next % 8 != 0 {
                return Err(Smb2Error::Misaligned {
                    what: WHAT,
                    field: "Next",
                    offset: u64::from(next),
                });
            }
            let n = next as usize;
            if n < field::HEADER_LEN || n > ctx.len() {
                return Err(Smb2Error::OutOfBounds {
                    what: WHAT,
                    field: "Next",
                    offset: u64::from(next),
                    length: 0,
                    min: field::HEADER_LEN as u64,
                    limit: ctx.len() as u64,
                });
            }
            n
        };
        let name_region = Region::new(
            "NameOffset",
            u64::from(u16::read(ctx, field::NAME_OFFSET)),
            u64::from(u16::read(ctx, field::NAME_LENGTH)),
        );
        let data_offset = u16::read(ctx, field::DATA_OFFSET);
        let data_region = Region::new(
            "DataOffset",
            u64::from(data_offset),
            u64::from(u32::read(ctx, field::DATA_LENGTH)),
        );
        let name = resolve_in(WHAT, 0, extent, field::HEADER_LEN, name_region)?.ok_or(
            Smb2Error::Malformed {
                what: WHAT,
                field: "NameLength (0)",
            },
        )?;
        let data = resolve_in(WHAT, 0, extent, field::HEADER_LEN, data_region)?;
        if data.is_some() && data_offset % 8 != 0 {
            return Err(Smb2Error::Misaligned {
                what: WHAT,
                field: "DataOffset",
                offset: u64::from(data_offset),
            });
        }
        let name_r = Some(name.clone());
        check_disjoint(WHAT, ("NameOffset", &name_r), ("DataOffset", &data))?;
        if next == 0 {
            self.done = true;
        } else {
            self.pos += extent;
        }
        Ok(CreateContext {
            name: ctx.get(name).unwrap_or(&[]),
            data: data.and_then(|r| ctx.get(r)).unwrap_or(&[]),
        })
    }
}

impl<'a> Iterator for CreateContextIter<'a> {
    type Item = Result<CreateContext<'a>, Smb2Error>;

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

/// Checks a whole chain.
pub(crate) fn check_chain(list: &[u8]) -> Result<(), Smb2Error> {
    for c in CreateContextIter::new(list) {
        c?;
    }
    Ok(())
}

/// The create contexts of a CREATE request or response: the wire chain of
/// a parsed message (zero-copy, already checked) or a slice to emit. Two
/// lists are equal when their contexts are.
#[derive(Clone, Copy)]
pub struct CreateContextList<'a>(Inner<'a>);

#[derive(Clone, Copy)]
enum Inner<'a> {
    Wire(&'a [u8]),
    Slice(&'a [CreateContext<'a>]),
}

impl<'a> CreateContextList<'a> {
    /// No contexts.
    pub const EMPTY: CreateContextList<'static> = CreateContextList(Inner::Slice(&[]));

    /// Contexts to emit.
    pub const fn new(contexts: &'a [CreateContext<'a>]) -> Self {
        CreateContextList(Inner::Slice(contexts))
    }

    pub(crate) fn from_wire(list: &'a [u8]) -> Self {
        CreateContextList(Inner::Wire(list))
    }

    /// The contexts in order.
    pub fn iter(&self) -> impl Iterator<Item = CreateContext<'a>> + 'a {
        let (wire, slice): (&'a [u8], &'a [CreateContext<'a>]) = match self.0 {
            Inner::Wire(b) => (b, &[]),
            Inner::Slice(s) => (&[], s),
        };
        CreateContextIter::new(wire)
            .filter_map(Result::ok)
            .chain(slice.iter().copied())
    }

    /// Number of contexts.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// True when there is none.
    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }

    /// The first context named `name`.
    pub fn find(&self, name: &[u8]) -> Option<CreateContext<'a>> {
        self.iter().find(|c| c.name == name)
    }

    /// Bytes of the chain (each context padded to 8 except the last).
    pub fn byte_len(&self) -> usize {
        let mut end = 0;
        for c in self.iter() {
            end = align8(end) + c.buffer_len();
        }
        end
    }

    /// Checks every context can be emitted.
    pub(crate) fn check_emit(&self) -> Result<(), Smb2Error> {
        for c in self.iter() {
            c.check_emit()?;
        }
        Ok(())
    }

    /// Writes the chain into `dst` (at least [`byte_len`](Self::byte_len)
    /// bytes, zeroed, 8-byte aligned).
    pub(crate) fn write_to(&self, dst: &mut [u8]) {
        let mut it = self.iter().peekable();
        let mut pos = 0;
        while let Some(c) = it.next() {
            let len = c.buffer_len();
            let next = if it.peek().is_some() { align8(len) } else { 0 };
            if let Some(d) = dst.get_mut(pos..pos + len) {
                c.write(d, next as u32);
            }
            pos += align8(len);
        }
    }
}

impl PartialEq for CreateContextList<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for CreateContextList<'_> {}

impl core::fmt::Debug for CreateContextList<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Default for CreateContextList<'_> {
    fn default() -> Self {
        CreateContextList::EMPTY
    }
}
