//! Property tests for every SMB2 decoder of `smb2` and for the compound
//! walker.
//!
//! The decoders are compared with an independent model of the receive rules
//! written here from [MS-SMB2] section 2 (field positions from the tables,
//! StructureSize, fixed part, offset/length pairs counted from the header,
//! non-overlap, 8-byte alignment of negotiate and create contexts, the
//! create context chain of 2.2.13.2, the negotiate contexts of 2.2.3.1.x,
//! RDMA channel information as whole SMB_DIRECT_BUFFER_DESCRIPTOR_V1s).
//!
//! (a) Random bytes (with the right StructureSize planted half the time):
//!     no panic, and the decoder's verdict is the model's.
//! (b) Structure-aware: a valid message is generated from a `Repr`, emitted
//!     and round-tripped; then exactly one thing changes (one field set to a
//!     random or boundary value, a truncation, StructureSize, or trailing
//!     bytes) and the verdict must again be the model's.
//! Whenever a decoder accepts, `emit(parse(b))` must parse back to the same
//! value (and emit exactly `buffer_len` bytes).

use proptest::collection::vec;
use proptest::prelude::*;
use smbdirect_protocol::ntstatus::NtStatus;
use smbdirect_protocol::smb2::*;
use smbdirect_protocol::smbd::wire::BufferDescriptorRepr;

// ---------------------------------------------------------------------------
// Verdicts and the independent model
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Ok,
    Truncated,
    StructureSize,
    OutOfBounds,
    Overlap,
    Misaligned,
    Malformed,
    ShortMessage,
    ProtocolId,
    UnknownCommand,
    NextCommand,
}

fn verdict<T>(r: &Result<T, Smb2Error>) -> Verdict {
    match r {
        Ok(_) => Verdict::Ok,
        Err(e) => match e {
            Smb2Error::Truncated { .. } => Verdict::Truncated,
            Smb2Error::StructureSize { .. } => Verdict::StructureSize,
            Smb2Error::OutOfBounds { .. } => Verdict::OutOfBounds,
            Smb2Error::Overlap { .. } => Verdict::Overlap,
            Smb2Error::Misaligned { .. } => Verdict::Misaligned,
            Smb2Error::Malformed { .. } => Verdict::Malformed,
            Smb2Error::ShortMessage { .. } => Verdict::ShortMessage,
            Smb2Error::ProtocolId { .. } => Verdict::ProtocolId,
            Smb2Error::UnknownCommand { .. } => Verdict::UnknownCommand,
            Smb2Error::NextCommand { .. } => Verdict::NextCommand,
            other => panic!("decoder returned an encode-side error: {other:?}"),
        },
    }
}

/// Little-endian read of `w` bytes at `at` (the model's own, not the crate's).
fn rd(b: &[u8], at: usize, w: usize) -> u64 {
    (0..w).fold(0u64, |v, i| v | u64::from(b[at + i]) << (8 * i))
}

fn wr(b: &mut [u8], at: usize, w: usize, v: u64) {
    for i in 0..w {
        b[at + i] = (v >> (8 * i)) as u8;
    }
}

fn a8(n: u64) -> u64 {
    n.div_ceil(8) * 8
}

const HDR: u64 = 64;

/// Fixed-part rule: StructureSize, then `ss & !1` bytes.
fn fixed_rule(b: &[u8], ss: u16) -> Result<(), Verdict> {
    if b.len() < 2 {
        return Err(Verdict::Truncated);
    }
    if rd(b, 0, 2) != u64::from(ss) {
        return Err(Verdict::StructureSize);
    }
    if b.len() < usize::from(ss & !1) {
        return Err(Verdict::Truncated);
    }
    Ok(())
}

/// A header-relative (offset, length) buffer: `None` if empty, else its
/// header-relative range, which must lie in [64 + fixed, 64 + len].
fn region(b: &[u8], fixed: usize, off: u64, len: u64) -> Result<Option<(u64, u64)>, Verdict> {
    if len == 0 {
        return Ok(None);
    }
    if off < HDR + fixed as u64 || off + len > HDR + b.len() as u64 {
        return Err(Verdict::OutOfBounds);
    }
    Ok(Some((off, off + len)))
}

fn disjoint(rs: &[Option<(u64, u64)>]) -> Result<(), Verdict> {
    for i in 0..rs.len() {
        for j in i + 1..rs.len() {
            if let (Some(x), Some(y)) = (rs[i], rs[j]) {
                if x.0 < y.1 && y.0 < x.1 {
                    return Err(Verdict::Overlap);
                }
            }
        }
    }
    Ok(())
}

/// Regions given as (offset at, offset width, length at, length width).
fn regions(
    b: &[u8],
    fixed: usize,
    spec: &[(usize, usize, usize, usize)],
) -> Result<Vec<Option<(u64, u64)>>, Verdict> {
    let mut out = Vec::new();
    for &(oa, ow, la, lw) in spec {
        out.push(region(b, fixed, rd(b, oa, ow), rd(b, la, lw))?);
    }
    disjoint(&out)?;
    Ok(out)
}

/// [MS-SMB2] 2.2.3.1.x: one context's Data for the four decoded types.
fn negotiate_context_data_model(ty: u64, d: &[u8]) -> Result<(), Verdict> {
    let counted = |head: usize| -> Result<(u64, usize), Verdict> {
        if d.len() < head {
            return Err(Verdict::Truncated);
        }
        let c = rd(d, 0, 2);
        if c == 0 {
            return Err(Verdict::Malformed);
        }
        let end = head + 2 * c as usize;
        if end > d.len() {
            return Err(Verdict::Truncated);
        }
        Ok((c, end))
    };
    match ty {
        1 => {
            let (_, end) = counted(4)?;
            if end + rd(d, 2, 2) as usize > d.len() {
                return Err(Verdict::Truncated);
            }
            Ok(())
        }
        2 | 8 => counted(2).map(drop),
        7 => counted(8).map(drop),
        _ => Ok(()),
    }
}

/// The negotiate context list at body offset `start`; returns its end.
fn negotiate_list_model(b: &[u8], start: usize, count: u64) -> Result<usize, Verdict> {
    let mut pos = start;
    for i in 0..count {
        if i > 0 {
            pos = a8(pos as u64) as usize;
        }
        if pos + 8 > b.len() {
            return Err(Verdict::Truncated);
        }
        let ty = rd(b, pos, 2);
        let dl = rd(b, pos + 2, 2) as usize;
        if pos + 8 + dl > b.len() {
            return Err(Verdict::Truncated);
        }
        negotiate_context_data_model(ty, &b[pos + 8..pos + 8 + dl])?;
        pos += 8 + dl;
    }
    Ok(pos)
}

/// NegotiateContextOffset rules, then the list; returns the body range.
fn negotiate_offset_model(
    b: &[u8],
    off: u64,
    count: u64,
    min: usize,
) -> Result<(u64, u64), Verdict> {
    if off % 8 != 0 {
        return Err(Verdict::Misaligned);
    }
    if off < HDR + min as u64 || off > HDR + b.len() as u64 {
        return Err(Verdict::OutOfBounds);
    }
    let start = (off - HDR) as usize;
    let end = negotiate_list_model(b, start, count)?;
    Ok((off, HDR + end as u64))
}

/// [MS-SMB2] 2.2.13.2: a create context chain.
fn create_chain_model(list: &[u8]) -> Result<(), Verdict> {
    let mut pos = 0usize;
    loop {
        let ctx = &list[pos..];
        if ctx.len() < 16 {
            return Err(Verdict::Truncated);
        }
        let next = rd(ctx, 0, 4);
        let extent = if next == 0 {
            ctx.len() as u64
        } else {
            if next % 8 != 0 {
                return Err(Verdict::Misaligned);
            }
            if next < 16 || next > ctx.len() as u64 {
                return Err(Verdict::OutOfBounds);
            }
            next
        };
        let (no, nl) = (rd(ctx, 4, 2), rd(ctx, 6, 2));
        let (dof, dl) = (rd(ctx, 10, 2), rd(ctx, 12, 4));
        if nl == 0 {
            return Err(Verdict::Malformed);
        }
        if no < 16 || no + nl > extent {
            return Err(Verdict::OutOfBounds);
        }
        if dl > 0 {
            if dof < 16 || dof + dl > extent {
                return Err(Verdict::OutOfBounds);
            }
            if dof % 8 != 0 {
                return Err(Verdict::Misaligned);
            }
            if no < dof + dl && dof < no + nl {
                return Err(Verdict::Overlap);
            }
        }
        if next == 0 {
            return Ok(());
        }
        pos += next as usize;
    }
}

fn create_contexts_model(b: &[u8], r: Option<(u64, u64)>, off: u64) -> Result<(), Verdict> {
    if let Some((s, e)) = r {
        if off % 8 != 0 {
            return Err(Verdict::Misaligned);
        }
        create_chain_model(&b[(s - HDR) as usize..(e - HDR) as usize])?;
    }
    Ok(())
}

/// Channel information with an RDMA channel: present, whole descriptors.
fn rdma_info_model(channel: u64, r: Option<(u64, u64)>) -> Result<(), Verdict> {
    if channel == 1 || channel == 2 {
        match r {
            None => return Err(Verdict::Malformed),
            Some((s, e)) if (e - s) % 16 != 0 => return Err(Verdict::Malformed),
            _ => {}
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    NegotiateReq,
    NegotiateRsp,
    SessionSetupReq,
    SessionSetupRsp,
    TreeConnectReq,
    TreeConnectRsp,
    CreateReq,
    CreateRsp,
    CloseReq,
    CloseRsp,
    FlushReq,
    ReadReq,
    ReadRsp,
    WriteReq,
    WriteRsp,
    IoctlReq,
    IoctlRsp,
    ErrorRsp,
    Reserved4,
}

/// The model's verdict for `b` decoded as `kind`.
fn model(kind: Kind, b: &[u8]) -> Verdict {
    let r = (|| -> Result<(), Verdict> {
        match kind {
            Kind::NegotiateReq => {
                fixed_rule(b, 36)?;
                let dc = rd(b, 2, 2);
                if dc == 0 {
                    return Err(Verdict::Malformed);
                }
                let end = 36 + 2 * dc as usize;
                if b.len() < end {
                    return Err(Verdict::Truncated);
                }
                let has311 = (0..dc as usize).any(|i| rd(b, 36 + 2 * i, 2) == 0x0311);
                let count = rd(b, 32, 2);
                if has311 && count > 0 {
                    negotiate_offset_model(b, rd(b, 28, 4), count, end)?;
                }
                Ok(())
            }
            Kind::NegotiateRsp => {
                fixed_rule(b, 65)?;
                let sec = regions(b, 64, &[(56, 2, 58, 2)])?[0];
                let count = rd(b, 6, 2);
                if rd(b, 4, 2) == 0x0311 && count > 0 {
                    let list = negotiate_offset_model(b, rd(b, 60, 4), count, 64)?;
                    disjoint(&[sec, Some(list)])?;
                }
                Ok(())
            }
            Kind::SessionSetupReq => {
                fixed_rule(b, 25)?;
                regions(b, 24, &[(12, 2, 14, 2)]).map(drop)
            }
            Kind::SessionSetupRsp => {
                fixed_rule(b, 9)?;
                regions(b, 8, &[(4, 2, 6, 2)]).map(drop)
            }
            Kind::TreeConnectReq => {
                fixed_rule(b, 9)?;
                regions(b, 8, &[(4, 2, 6, 2)]).map(drop)
            }
            Kind::TreeConnectRsp => fixed_rule(b, 16),
            Kind::CreateReq => {
                fixed_rule(b, 57)?;
                let rs = regions(b, 56, &[(44, 2, 46, 2), (48, 4, 52, 4)])?;
                create_contexts_model(b, rs[1], rd(b, 48, 4))
            }
            Kind::CreateRsp => {
                fixed_rule(b, 89)?;
                let rs = regions(b, 88, &[(80, 4, 84, 4)])?;
                create_contexts_model(b, rs[0], rd(b, 80, 4))
            }
            Kind::CloseReq | Kind::FlushReq => fixed_rule(b, 24),
            Kind::CloseRsp => fixed_rule(b, 60),
            Kind::ReadReq => {
                fixed_rule(b, 49)?;
                let channel = rd(b, 36, 4);
                let r = if channel == 0 {
                    None
                } else {
                    regions(b, 48, &[(44, 2, 46, 2)])?[0]
                };
                rdma_info_model(channel, r)
            }
            Kind::ReadRsp => {
                fixed_rule(b, 17)?;
                regions(b, 16, &[(2, 1, 4, 4)]).map(drop)
            }
            Kind::WriteReq => {
                fixed_rule(b, 49)?;
                let channel = rd(b, 32, 4);
                let rs = if channel == 0 {
                    regions(b, 48, &[(2, 2, 4, 4)])?
                } else {
                    regions(b, 48, &[(2, 2, 4, 4), (40, 2, 42, 2)])?
                };
                rdma_info_model(channel, rs.get(1).copied().flatten())
            }
            Kind::WriteRsp => fixed_rule(b, 17),
            Kind::IoctlReq => {
                fixed_rule(b, 57)?;
                regions(b, 56, &[(24, 4, 28, 4), (36, 4, 40, 4)]).map(drop)
            }
            Kind::IoctlRsp => {
                fixed_rule(b, 49)?;
                regions(b, 48, &[(24, 4, 28, 4), (32, 4, 36, 4)]).map(drop)
            }
            Kind::ErrorRsp => {
                fixed_rule(b, 9)?;
                let bc = rd(b, 4, 4);
                if 8 + bc > b.len() as u64 {
                    return Err(Verdict::OutOfBounds);
                }
                let data = &b[8..8 + bc as usize];
                let mut pos = 0usize;
                for i in 0..b[2] {
                    if i > 0 {
                        pos = a8(pos as u64) as usize;
                    }
                    if pos + 8 > data.len() {
                        return Err(Verdict::Truncated);
                    }
                    let dl = rd(data, pos, 4) as usize;
                    if pos + 8 + dl > data.len() {
                        return Err(Verdict::Truncated);
                    }
                    pos += 8 + dl;
                }
                Ok(())
            }
            Kind::Reserved4 => fixed_rule(b, 4),
        }
    })();
    match r {
        Ok(()) => Verdict::Ok,
        Err(v) => v,
    }
}

/// Decodes `b` as `kind`; on success checks the emit/parse fixpoint.
fn decode(kind: Kind, b: &[u8]) -> Verdict {
    macro_rules! fix {
        ($ty:ident) => {{
            let r = $ty::from_body(b);
            if let Ok(v) = &r {
                let mut out = vec![0xA5u8; v.buffer_len()];
                let n = v.emit(&mut out).expect("emit a parsed value");
                assert_eq!(n, out.len());
                let again = $ty::from_body(&out).expect("re-parse emitted bytes");
                assert_eq!(&again, v);
            }
            verdict(&r)
        }};
    }
    match kind {
        Kind::NegotiateReq => fix!(NegotiateRequestRepr),
        Kind::NegotiateRsp => fix!(NegotiateResponseRepr),
        Kind::SessionSetupReq => fix!(SessionSetupRequestRepr),
        Kind::SessionSetupRsp => fix!(SessionSetupResponseRepr),
        Kind::TreeConnectReq => fix!(TreeConnectRequestRepr),
        Kind::TreeConnectRsp => fix!(TreeConnectResponseRepr),
        Kind::CreateReq => fix!(CreateRequestRepr),
        Kind::CreateRsp => fix!(CreateResponseRepr),
        Kind::CloseReq => fix!(CloseRequestRepr),
        Kind::CloseRsp => fix!(CloseResponseRepr),
        Kind::FlushReq => fix!(FlushRequestRepr),
        Kind::ReadReq => fix!(ReadRequestRepr),
        Kind::ReadRsp => fix!(ReadResponseRepr),
        Kind::WriteReq => fix!(WriteRequestRepr),
        Kind::WriteRsp => fix!(WriteResponseRepr),
        Kind::IoctlReq => fix!(IoctlRequestRepr),
        Kind::IoctlRsp => fix!(IoctlResponseRepr),
        Kind::ErrorRsp => fix!(ErrorResponseRepr),
        Kind::Reserved4 => {
            let v = [
                verdict(&LogoffRequestRepr::from_body(b)),
                verdict(&LogoffResponseRepr::from_body(b)),
                verdict(&TreeDisconnectRequestRepr::from_body(b)),
                verdict(&TreeDisconnectResponseRepr::from_body(b)),
                verdict(&EchoRequestRepr::from_body(b)),
                verdict(&EchoResponseRepr::from_body(b)),
                verdict(&CancelRequestRepr::from_body(b)),
                verdict(&FlushResponseRepr::from_body(b)),
            ];
            assert!(v.iter().all(|x| *x == v[0]), "{v:?}");
            v[0]
        }
    }
}

const KINDS: [(Kind, u16); 19] = [
    (Kind::NegotiateReq, 36),
    (Kind::NegotiateRsp, 65),
    (Kind::SessionSetupReq, 25),
    (Kind::SessionSetupRsp, 9),
    (Kind::TreeConnectReq, 9),
    (Kind::TreeConnectRsp, 16),
    (Kind::CreateReq, 57),
    (Kind::CreateRsp, 89),
    (Kind::CloseReq, 24),
    (Kind::CloseRsp, 60),
    (Kind::FlushReq, 24),
    (Kind::ReadReq, 49),
    (Kind::ReadRsp, 17),
    (Kind::WriteReq, 49),
    (Kind::WriteRsp, 17),
    (Kind::IoctlReq, 57),
    (Kind::IoctlRsp, 49),
    (Kind::ErrorRsp, 9),
    (Kind::Reserved4, 4),
];

/// Offset/length/count fields worth mutating, per kind: (at, width).
fn static_fields(kind: Kind) -> &'static [(usize, usize)] {
    match kind {
        Kind::NegotiateReq => &[(2, 2), (28, 4), (32, 2), (36, 2)],
        Kind::NegotiateRsp => &[(4, 2), (6, 2), (56, 2), (58, 2), (60, 4)],
        Kind::SessionSetupReq => &[(12, 2), (14, 2)],
        Kind::SessionSetupRsp | Kind::TreeConnectReq => &[(4, 2), (6, 2)],
        Kind::CreateReq => &[(44, 2), (46, 2), (48, 4), (52, 4)],
        Kind::CreateRsp => &[(80, 4), (84, 4)],
        Kind::ReadReq => &[(36, 4), (44, 2), (46, 2)],
        Kind::ReadRsp => &[(2, 1), (4, 4)],
        Kind::WriteReq => &[(2, 2), (4, 4), (32, 4), (40, 2), (42, 2)],
        Kind::IoctlReq => &[(24, 4), (28, 4), (36, 4), (40, 4)],
        Kind::IoctlRsp => &[(24, 4), (28, 4), (32, 4), (36, 4)],
        Kind::ErrorRsp => &[(2, 1), (4, 4)],
        _ => &[(0, 2)],
    }
}

/// The static fields plus the fields of the first two nested contexts
/// (create contexts: Next, NameOffset, NameLength, DataOffset, DataLength;
/// negotiate contexts: ContextType, DataLength, the first count and the
/// salt length; ERROR Contexts: ErrorDataLength), located from `body`.
fn mutable_fields(kind: Kind, body: &[u8]) -> Vec<(usize, usize)> {
    let mut f = static_fields(kind).to_vec();
    let fits = |at: usize, w: usize| at + w <= body.len();
    let mut nested = |starts: &[usize], rel: &[(usize, usize)]| {
        for &s in starts {
            for &(o, w) in rel {
                if fits(s + o, w) {
                    f.push((s + o, w));
                }
            }
        }
    };
    match kind {
        Kind::CreateReq | Kind::CreateRsp => {
            let at = if kind == Kind::CreateReq { 48 } else { 80 };
            if fits(at, 8) && rd(body, at + 4, 4) > 0 {
                let c0 = (rd(body, at, 4) as usize).saturating_sub(64);
                let mut starts = vec![c0];
                if fits(c0, 4) && rd(body, c0, 4) > 0 {
                    starts.push(c0 + rd(body, c0, 4) as usize);
                }
                nested(&starts, &[(0, 4), (4, 2), (6, 2), (10, 2), (12, 4)]);
            }
        }
        Kind::NegotiateReq | Kind::NegotiateRsp => {
            let (off_at, count_at) = if kind == Kind::NegotiateReq {
                (28, 32)
            } else {
                (60, 6)
            };
            if fits(off_at, 4) && fits(count_at, 2) && rd(body, count_at, 2) > 0 {
                let c0 = (rd(body, off_at, 4) as usize).saturating_sub(64);
                let mut starts = vec![c0];
                if fits(c0, 4) {
                    starts.push(a8((c0 + 8 + rd(body, c0 + 2, 2) as usize) as u64) as usize);
                }
                nested(&starts, &[(0, 2), (2, 2), (8, 2), (10, 2)]);
            }
        }
        Kind::ErrorRsp if body.len() > 2 && body[2] > 0 => nested(&[8], &[(0, 4)]),
        _ => {}
    }
    f
}

// ---------------------------------------------------------------------------
// Strategies: owned material for valid messages
// ---------------------------------------------------------------------------

fn dialect() -> impl Strategy<Value = u16> {
    prop_oneof![
        Just(0x0202u16),
        Just(0x0210),
        Just(0x0300),
        Just(0x0302),
        Just(0x0311),
        any::<u16>()
    ]
}

#[derive(Debug, Clone)]
enum OwnedNegCtx {
    Preauth(Vec<u16>, Vec<u8>),
    Encryption(Vec<u16>),
    Signing(Vec<u16>),
    Rdma(Vec<u16>),
    Other(u16, Vec<u8>),
}

fn neg_ctx() -> impl Strategy<Value = OwnedNegCtx> {
    let ids = || vec(any::<u16>(), 1..5);
    prop_oneof![
        (ids(), vec(any::<u8>(), 0..40)).prop_map(|(h, s)| OwnedNegCtx::Preauth(h, s)),
        ids().prop_map(OwnedNegCtx::Encryption),
        ids().prop_map(OwnedNegCtx::Signing),
        ids().prop_map(OwnedNegCtx::Rdma),
        (
            any::<u16>().prop_filter("decoded types", |t| ![1, 2, 7, 8].contains(t)),
            vec(any::<u8>(), 0..30)
        )
            .prop_map(|(t, d)| OwnedNegCtx::Other(t, d)),
    ]
}

fn borrow_ctx(c: &OwnedNegCtx) -> NegotiateContext<'_> {
    match c {
        OwnedNegCtx::Preauth(h, s) => {
            NegotiateContext::PreauthIntegrity(PreauthIntegrityCapabilities {
                hash_algorithms: U16Array::new(h),
                salt: s,
            })
        }
        OwnedNegCtx::Encryption(c) => NegotiateContext::Encryption(EncryptionCapabilities {
            ciphers: U16Array::new(c),
        }),
        OwnedNegCtx::Signing(c) => NegotiateContext::Signing(SigningCapabilities {
            signing_algorithms: U16Array::new(c),
        }),
        OwnedNegCtx::Rdma(c) => NegotiateContext::RdmaTransform(RdmaTransformCapabilities {
            transform_ids: U16Array::new(c),
        }),
        OwnedNegCtx::Other(t, d) => NegotiateContext::Other {
            context_type: *t,
            data: d,
        },
    }
}

fn guid() -> impl Strategy<Value = Guid> {
    any::<[u8; 16]>().prop_map(Guid::from_bytes)
}

fn file_id() -> impl Strategy<Value = FileId> {
    (any::<u64>(), any::<u64>()).prop_map(|(p, v)| FileId::new(p, v))
}

fn create_ctxs() -> impl Strategy<Value = Vec<(Vec<u8>, Vec<u8>)>> {
    vec((vec(any::<u8>(), 1..20), vec(any::<u8>(), 0..40)), 0..4)
}

fn descriptors() -> impl Strategy<Value = Vec<BufferDescriptorRepr>> {
    vec(
        (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(offset, token, length)| {
            BufferDescriptorRepr {
                offset,
                token,
                length,
            }
        }),
        1..4,
    )
}

fn channel() -> impl Strategy<Value = Channel> {
    prop_oneof![
        Just(Channel::None),
        Just(Channel::RdmaV1),
        Just(Channel::RdmaV1Invalidate),
        Just(Channel::RdmaTransform),
    ]
}

/// A valid body of `kind`, built from random material and emitted.
fn valid_body(kind: Kind) -> BoxedStrategy<Vec<u8>> {
    fn out<B: Smb2Body>(r: &B) -> Vec<u8> {
        let mut b = vec![0xEEu8; r.buffer_len()];
        let n = r.emit(&mut b).expect("emit generated value");
        assert_eq!(n, b.len());
        b
    }
    match kind {
        Kind::NegotiateReq => (
            vec(dialect(), 1..6),
            vec(neg_ctx(), 0..5),
            any::<u16>(),
            any::<u32>(),
            guid(),
        )
            .prop_map(|(mut d, ctx, mode, caps, g)| {
                if !ctx.is_empty() && !d.contains(&0x0311) {
                    d.push(0x0311);
                }
                let c: Vec<_> = ctx.iter().map(borrow_ctx).collect();
                out(&NegotiateRequestRepr {
                    security_mode: SecurityMode(mode),
                    capabilities: Capabilities(caps),
                    client_guid: g,
                    dialects: U16Array::new(&d),
                    negotiate_contexts: NegotiateContextList::new(&c),
                })
            })
            .boxed(),
        Kind::NegotiateRsp => (
            dialect(),
            vec(neg_ctx(), 0..4),
            vec(any::<u8>(), 0..80),
            guid(),
            any::<(u32, u32, u32, u64)>(),
        )
            .prop_map(|(d, ctx, sec, g, (t, r, w, time))| {
                let c: Vec<_> = if d == 0x0311 {
                    ctx.iter().map(borrow_ctx).collect()
                } else {
                    Vec::new()
                };
                out(&NegotiateResponseRepr {
                    security_mode: SecurityMode::SIGNING_ENABLED,
                    dialect_revision: d,
                    server_guid: g,
                    capabilities: Capabilities::LARGE_MTU,
                    max_transact_size: t,
                    max_read_size: r,
                    max_write_size: w,
                    system_time: time,
                    server_start_time: 0,
                    security_buffer: &sec,
                    negotiate_contexts: NegotiateContextList::new(&c),
                })
            })
            .boxed(),
        Kind::SessionSetupReq => (
            any::<u8>(),
            any::<u8>(),
            any::<u32>(),
            any::<u64>(),
            vec(any::<u8>(), 0..100),
        )
            .prop_map(|(f, m, caps, prev, tok)| {
                out(&SessionSetupRequestRepr {
                    flags: SessionSetupFlags(f),
                    security_mode: SecurityMode(u16::from(m)),
                    capabilities: Capabilities(caps),
                    channel: 0,
                    previous_session_id: prev,
                    security_buffer: &tok,
                })
            })
            .boxed(),
        Kind::SessionSetupRsp => (any::<u16>(), vec(any::<u8>(), 0..100))
            .prop_map(|(f, tok)| {
                out(&SessionSetupResponseRepr {
                    session_flags: SessionFlags(f),
                    security_buffer: &tok,
                })
            })
            .boxed(),
        Kind::TreeConnectReq => (any::<u16>(), "[a-zA-Z0-9\\\\.é]{0,40}")
            .prop_map(|(f, p)| {
                out(&TreeConnectRequestRepr {
                    flags: TreeConnectFlags(f),
                    path: Utf16Str::new(&p),
                })
            })
            .boxed(),
        Kind::TreeConnectRsp => any::<(u8, u32, u32, u32)>()
            .prop_map(|(t, f, c, a)| {
                out(&TreeConnectResponseRepr {
                    share_type: ShareType(t),
                    share_flags: ShareFlags(f),
                    capabilities: ShareCapabilities(c),
                    maximal_access: AccessMask(a),
                })
            })
            .boxed(),
        Kind::CreateReq => (
            any::<(u8, u8, u32, u64, u32, u32, u32, u32, u32)>(),
            "[a-zA-Z0-9\\\\.]{0,30}",
            create_ctxs(),
        )
            .prop_map(|((sf, ol, il, cf, da, fa, sa, cd, co), name, ctx)| {
                let c: Vec<_> = ctx.iter().map(|(n, d)| CreateContext::new(n, d)).collect();
                out(&CreateRequestRepr {
                    security_flags: sf,
                    requested_oplock_level: OplockLevel(ol),
                    impersonation_level: ImpersonationLevel(il),
                    smb_create_flags: cf,
                    desired_access: AccessMask(da),
                    file_attributes: FileAttributes(fa),
                    share_access: ShareAccess(sa),
                    create_disposition: CreateDisposition(cd),
                    create_options: CreateOptions(co),
                    name: Utf16Str::new(&name),
                    create_contexts: CreateContextList::new(&c),
                })
            })
            .boxed(),
        Kind::CreateRsp => (
            any::<(u8, u8, u32, u64, u64, u64, u64, u64, u64, u32)>(),
            file_id(),
            create_ctxs(),
        )
            .prop_map(|((ol, f, ca, t1, t2, t3, t4, al, eof, fa), fid, ctx)| {
                let c: Vec<_> = ctx.iter().map(|(n, d)| CreateContext::new(n, d)).collect();
                out(&CreateResponseRepr {
                    oplock_level: OplockLevel(ol),
                    flags: CreateResponseFlags(f),
                    create_action: CreateAction(ca),
                    creation_time: t1,
                    last_access_time: t2,
                    last_write_time: t3,
                    change_time: t4,
                    allocation_size: al,
                    end_of_file: eof,
                    file_attributes: FileAttributes(fa),
                    file_id: fid,
                    create_contexts: CreateContextList::new(&c),
                })
            })
            .boxed(),
        Kind::CloseReq => (any::<u16>(), file_id())
            .prop_map(|(f, fid)| {
                out(&CloseRequestRepr {
                    flags: CloseFlags(f),
                    file_id: fid,
                })
            })
            .boxed(),
        Kind::CloseRsp => any::<(u16, u64, u64, u64, u64, u64, u64, u32)>()
            .prop_map(|(f, a, b, c, d, e, g, h)| {
                out(&CloseResponseRepr {
                    flags: CloseFlags(f),
                    creation_time: a,
                    last_access_time: b,
                    last_write_time: c,
                    change_time: d,
                    allocation_size: e,
                    end_of_file: g,
                    file_attributes: FileAttributes(h),
                })
            })
            .boxed(),
        Kind::FlushReq => file_id()
            .prop_map(|fid| out(&FlushRequestRepr { file_id: fid }))
            .boxed(),
        Kind::ReadReq => (
            any::<(u8, u8, u32, u64, u32, u32)>(),
            file_id(),
            channel(),
            descriptors(),
            vec(any::<u8>(), 1..40),
        )
            .prop_map(|((p, f, l, o, m, r), fid, ch, d, raw)| {
                let info = match ch {
                    Channel::None => ChannelInfo::EMPTY,
                    Channel::RdmaTransform => ChannelInfo::from_bytes(&raw),
                    _ => ChannelInfo::descriptors(&d),
                };
                out(&ReadRequestRepr {
                    padding: p,
                    flags: ReadFlags(f),
                    length: l,
                    offset: o,
                    file_id: fid,
                    minimum_count: m,
                    channel: ch,
                    remaining_bytes: r,
                    channel_info: info,
                })
            })
            .boxed(),
        Kind::ReadRsp => (vec(any::<u8>(), 0..150), any::<u32>(), any::<u32>())
            .prop_map(|(d, r, f)| {
                out(&ReadResponseRepr {
                    data: &d,
                    data_remaining: r,
                    flags: f,
                })
            })
            .boxed(),
        Kind::WriteReq => (
            any::<(u64, u32, u32)>(),
            file_id(),
            channel(),
            descriptors(),
            vec(any::<u8>(), 0..100),
            vec(any::<u8>(), 1..40),
        )
            .prop_map(|((o, r, f), fid, ch, d, data, raw)| {
                let info = match ch {
                    Channel::None => ChannelInfo::EMPTY,
                    Channel::RdmaTransform => ChannelInfo::from_bytes(&raw),
                    _ => ChannelInfo::descriptors(&d),
                };
                out(&WriteRequestRepr {
                    offset: o,
                    file_id: fid,
                    channel: ch,
                    remaining_bytes: r,
                    flags: WriteFlags(f),
                    data: &data,
                    channel_info: info,
                })
            })
            .boxed(),
        Kind::WriteRsp => any::<u32>()
            .prop_map(|c| out(&WriteResponseRepr { count: c }))
            .boxed(),
        Kind::IoctlReq => (
            any::<(u32, u32, u32, u32)>(),
            file_id(),
            vec(any::<u8>(), 0..100),
            vec(any::<u8>(), 0..40),
        )
            .prop_map(|((c, mi, mo, f), fid, i, o)| {
                out(&IoctlRequestRepr {
                    ctl_code: c,
                    file_id: fid,
                    input: &i,
                    max_input_response: mi,
                    output: &o,
                    max_output_response: mo,
                    flags: IoctlFlags(f),
                })
            })
            .boxed(),
        Kind::IoctlRsp => (
            any::<(u32, u32)>(),
            file_id(),
            vec(any::<u8>(), 0..40),
            vec(any::<u8>(), 0..100),
        )
            .prop_map(|((c, f), fid, i, o)| {
                out(&IoctlResponseRepr {
                    ctl_code: c,
                    file_id: fid,
                    input: &i,
                    output: &o,
                    flags: f,
                })
            })
            .boxed(),
        Kind::ErrorRsp => vec(vec(any::<u8>(), 0..20), 0..3)
            .prop_map(|ctxs| {
                // ERROR Contexts (2.2.2.1), each 8-byte aligned.
                let mut data = Vec::new();
                for (i, c) in ctxs.iter().enumerate() {
                    if i > 0 {
                        data.resize(a8(data.len() as u64) as usize, 0);
                    }
                    data.extend_from_slice(&(c.len() as u32).to_le_bytes());
                    data.extend_from_slice(&0u32.to_le_bytes());
                    data.extend_from_slice(c);
                }
                out(&ErrorResponseRepr {
                    error_context_count: ctxs.len() as u8,
                    error_data: &data,
                })
            })
            .boxed(),
        Kind::Reserved4 => Just(out(&EchoRequestRepr)).boxed(),
    }
}

/// A value for a mutated field: random, or near an anchor that matters
/// to the rules (the field's current value, the end of the fixed part, the
/// end of the message, the bytes after the fixed part).
#[derive(Debug, Clone, Copy)]
enum How {
    Raw(u64),
    Near(u8, i8),
}

#[derive(Debug, Clone)]
enum Mutation {
    /// Set field `i` (of `mutable_fields`) to a value.
    Field(usize, How),
    /// Keep a prefix of the given fraction (per mille).
    Truncate(u16),
    /// Change StructureSize.
    StructureSize(u16),
    /// Append bytes.
    Extend(Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        2 => (any::<usize>(), prop_oneof![0u64..300, any::<u64>(), Just(0u64), Just(u64::MAX)])
            .prop_map(|(i, v)| Mutation::Field(i, How::Raw(v))),
        4 => (
            any::<usize>(),
            0u8..4,
            proptest::sample::select(vec![-8i8, -4, -2, -1, 0, 1, 2, 4, 8]),
        )
            .prop_map(|(i, a, d)| Mutation::Field(i, How::Near(a, d))),
        2 => (0u16..1000).prop_map(Mutation::Truncate),
        1 => any::<u16>().prop_map(Mutation::StructureSize),
        1 => vec(any::<u8>(), 1..30).prop_map(Mutation::Extend),
    ]
}

fn apply(kind: Kind, body: &[u8], m: &Mutation) -> Vec<u8> {
    let mut b = body.to_vec();
    match m {
        Mutation::Field(i, how) => {
            let fields = mutable_fields(kind, body);
            let (at, w) = fields[i % fields.len()];
            let fixed = KINDS
                .iter()
                .find(|(k, _)| *k == kind)
                .map_or(0, |(_, ss)| u64::from(ss & !1));
            let v = match *how {
                How::Raw(v) => v,
                How::Near(anchor, delta) => {
                    let base = match anchor {
                        0 => rd(body, at, w),
                        1 => HDR + fixed,
                        2 => HDR + body.len() as u64,
                        _ => (body.len() as u64).saturating_sub(fixed),
                    };
                    base.wrapping_add(delta as i64 as u64)
                }
            };
            wr(&mut b, at, w, v);
        }
        Mutation::Truncate(pm) => b.truncate(b.len() * usize::from(*pm) / 1000),
        Mutation::StructureSize(v) => wr(&mut b, 0, 2, u64::from(*v)),
        Mutation::Extend(x) => b.extend_from_slice(x),
    }
    b
}

fn any_kind() -> impl Strategy<Value = (Kind, u16)> {
    proptest::sample::select(KINDS.to_vec())
}

// ---------------------------------------------------------------------------
// Header and compound model
// ---------------------------------------------------------------------------

fn header_model(b: &[u8]) -> Verdict {
    if b.len() < 64 {
        return Verdict::ShortMessage;
    }
    if b[0..4] != [0xFE, b'S', b'M', b'B'] {
        return Verdict::ProtocolId;
    }
    if rd(b, 4, 2) != 64 {
        return Verdict::StructureSize;
    }
    if rd(b, 12, 2) > 0x13 {
        return Verdict::UnknownCommand;
    }
    Verdict::Ok
}

/// The compound walk: (offset, length, verdict) per item.
fn compound_model(b: &[u8]) -> Vec<(usize, usize, Verdict)> {
    let mut out = Vec::new();
    let mut pos = 0;
    loop {
        let rest = &b[pos..];
        let v = header_model(rest);
        if v != Verdict::Ok {
            out.push((pos, 0, v));
            return out;
        }
        let next = rd(rest, 20, 4);
        if next == 0 {
            out.push((pos, rest.len(), Verdict::Ok));
            return out;
        }
        if next % 8 != 0 || next < 64 || next >= rest.len() as u64 {
            out.push((pos, 0, Verdict::NextCommand));
            return out;
        }
        out.push((pos, next as usize, Verdict::Ok));
        pos += next as usize;
    }
}

fn compound_actual(b: &[u8]) -> Vec<(usize, usize, Verdict)> {
    let mut out = Vec::new();
    let mut pos = 0;
    for item in compound(b) {
        match item {
            Ok(m) => {
                assert_eq!(m.offset(), pos);
                assert_eq!(m.body(), &m.bytes()[64..]);
                out.push((m.offset(), m.bytes().len(), Verdict::Ok));
                pos += m.bytes().len();
            }
            Err(e) => out.push((pos, 0, verdict::<()>(&Err(e)))),
        }
    }
    out
}

fn header_repr() -> impl Strategy<Value = HeaderRepr> {
    (
        any::<(u16, u32, u16, u32, u64, u64)>(),
        0u16..0x14,
        any::<bool>(),
        any::<(u32, u32, u64)>(),
        any::<[u8; 16]>(),
    )
        .prop_map(
            |((cc, st, cr, fl, mid, sid), cmd, asy, (pid, tid, aid), sig)| {
                let id = if asy {
                    HeaderId::Async { async_id: aid }
                } else {
                    HeaderId::Sync {
                        process_id: pid,
                        tree_id: tid,
                    }
                };
                let flags = if asy {
                    HeaderFlags(fl | 2)
                } else {
                    HeaderFlags(fl & !2)
                };
                HeaderRepr {
                    credit_charge: cc,
                    status: NtStatus(st),
                    command: Command::from_wire(cmd).unwrap(),
                    credit: cr,
                    flags,
                    next_command: 0,
                    message_id: mid,
                    id,
                    session_id: sid,
                    signature: sig,
                }
            },
        )
}

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// (a) Random bytes, StructureSize planted half the time.
    #[test]
    fn random_bodies_get_the_models_verdict(
        (kind, ss) in any_kind(),
        plant in any::<bool>(),
        mut bytes in vec(any::<u8>(), 0..260),
    ) {
        if plant && bytes.len() >= 2 {
            wr(&mut bytes, 0, 2, u64::from(ss));
        }
        prop_assert_eq!(decode(kind, &bytes), model(kind, &bytes), "{:?} {:02x?}", kind, bytes);
    }

    /// (b) A valid message round-trips; one mutation later the decoder and
    /// the model agree.
    #[test]
    fn mutated_valid_bodies_get_the_models_verdict(
        (kind, body) in any_kind().prop_flat_map(|(k, _)| (Just(k), valid_body(k))),
        m in mutation(),
    ) {
        prop_assert_eq!(decode(kind, &body), Verdict::Ok, "{:?} generated {:02x?}", kind, body);
        prop_assert_eq!(model(kind, &body), Verdict::Ok);
        let b = apply(kind, &body, &m);
        prop_assert_eq!(decode(kind, &b), model(kind, &b), "{:?} after {:?}: {:02x?}", kind, m, b);
        if let Mutation::Extend(_) = m {
            prop_assert_eq!(decode(kind, &b), Verdict::Ok, "trailing bytes change nothing");
        }
        if let Mutation::StructureSize(v) = m {
            let ss = KINDS.iter().find(|(k, _)| *k == kind).unwrap().1;
            if v != ss {
                prop_assert_eq!(decode(kind, &b), Verdict::StructureSize);
            }
        }
    }

    /// Every prefix of a valid message decodes without panicking, with the
    /// model's verdict.
    #[test]
    fn every_prefix_of_a_valid_body_gets_the_models_verdict(
        (kind, body) in any_kind().prop_flat_map(|(k, _)| (Just(k), valid_body(k))),
    ) {
        for k in 0..body.len() {
            prop_assert_eq!(decode(kind, &body[..k]), model(kind, &body[..k]), "{:?} prefix {}", kind, k);
        }
    }

    /// Request and response dispatch never panic on random bodies.
    #[test]
    fn dispatch_never_panics(cmd in 0u16..0x14, status in any::<u32>(), bytes in vec(any::<u8>(), 0..200)) {
        let command = Command::from_wire(cmd).unwrap();
        let _ = RequestBody::parse(command, &bytes);
        let mut h = HeaderRepr::request(command, 0).response_to(NtStatus(status));
        let _ = ResponseBody::parse(&h, &bytes);
        h.status = NtStatus(0);
        let _ = ResponseBody::parse(&h, &bytes);
    }

    /// Headers round-trip, and one-byte mutations get the model's verdict.
    #[test]
    fn headers_round_trip_and_mutations_get_the_models_verdict(
        h in header_repr(),
        at in 0usize..64,
        v in any::<u8>(),
    ) {
        let mut b = [0u8; 64];
        prop_assert_eq!(h.emit(&mut b), Ok(64));
        prop_assert_eq!(HeaderRepr::from_bytes(&b), Ok(h));
        let mut m = b;
        m[at] = v;
        prop_assert_eq!(verdict(&HeaderRepr::from_bytes(&m)), header_model(&m));
    }

    /// The compound walker on random bytes (a header planted at the front
    /// half the time) matches the model.
    #[test]
    fn compound_walk_of_random_bytes_matches_the_model(
        plant in any::<bool>(),
        next in prop_oneof![Just(0u32), (8u32..200).prop_map(|n| n * 8 / 8), any::<u32>()],
        mut bytes in vec(any::<u8>(), 0..400),
    ) {
        if plant && bytes.len() >= 64 {
            let mut h = HeaderRepr::request(Command::Echo, 1);
            h.next_command = next;
            h.emit(&mut bytes[..64]).unwrap();
        }
        prop_assert_eq!(compound_actual(&bytes), compound_model(&bytes));
    }

    /// Compounds built by the writer walk back to the same messages; a
    /// single mutated NextCommand gets the model's verdict.
    #[test]
    fn written_compounds_walk_back_and_mutated_links_match_the_model(
        parts in vec((0u16..0x14, any::<u64>(), vec(any::<u8>(), 0..40)), 1..5),
        which in any::<usize>(),
        new_next in prop_oneof![0u32..600, any::<u32>()],
    ) {
        let mut buf = vec![0u8; 1024];
        let mut w = CompoundWriter::new(&mut buf);
        let mut starts = Vec::new();
        for (cmd, mid, data) in &parts {
            let mut h = HeaderRepr::request(Command::from_wire(*cmd).unwrap(), *mid);
            h.command = Command::Write;
            let body = WriteRequestRepr {
                offset: 0,
                file_id: FileId::ANY,
                channel: Channel::None,
                remaining_bytes: 0,
                flags: WriteFlags::empty(),
                data,
                channel_info: ChannelInfo::EMPTY,
            };
            starts.push(w.push(&h, &body).unwrap().start);
        }
        let len = w.finish();
        let bytes = &buf[..len];
        let walked: Vec<_> = compound(bytes).map(Result::unwrap).collect();
        prop_assert_eq!(walked.len(), parts.len());
        for ((m, (_, mid, data)), start) in walked.iter().zip(&parts).zip(&starts) {
            prop_assert_eq!(m.offset(), *start);
            prop_assert_eq!(m.offset() % 8, 0);
            prop_assert_eq!(m.header().message_id, *mid);
            match m.request_body().unwrap() {
                RequestBody::Write(wr) => prop_assert_eq!(wr.data, &data[..]),
                other => prop_assert!(false, "{:?}", other),
            }
        }
        let mut mutated = bytes.to_vec();
        let at = starts[which % starts.len()] + 20;
        mutated[at..at + 4].copy_from_slice(&new_next.to_le_bytes());
        prop_assert_eq!(compound_actual(&mutated), compound_model(&mutated));
    }
}

// ---------------------------------------------------------------------------
// Focused: the nested context chains
// ---------------------------------------------------------------------------

/// Starts of every create context of a valid chain.
fn create_context_starts(list: &[u8]) -> Vec<usize> {
    let mut starts = vec![0];
    let mut pos = 0;
    loop {
        let next = rd(list, pos, 4) as usize;
        if next == 0 {
            return starts;
        }
        pos += next;
        starts.push(pos);
    }
}

/// Starts of every negotiate context of a valid list beginning at `start`.
fn negotiate_context_starts(b: &[u8], start: usize, count: usize) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut pos = start;
    for i in 0..count {
        if i > 0 {
            pos = a8(pos as u64) as usize;
        }
        starts.push(pos);
        pos += 8 + rd(b, pos + 2, 2) as usize;
    }
    starts
}

fn near(anchor: u64, delta: i8) -> u64 {
    anchor.wrapping_add(delta as i64 as u64)
}

fn delta() -> impl Strategy<Value = i8> {
    proptest::sample::select(vec![-16i8, -8, -4, -2, -1, 0, 1, 2, 4, 8, 16])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// One field of one create context (Next, NameOffset, NameLength,
    /// DataOffset, DataLength) moved near its value or set at random: the
    /// chain walk gets the model's verdict.
    #[test]
    fn create_context_field_mutations_get_the_models_verdict(
        ctx in vec((vec(any::<u8>(), 1..20), vec(any::<u8>(), 0..40)), 1..5),
        which in any::<usize>(),
        field in 0usize..5,
        raw in any::<Option<u32>>(),
        d in delta(),
    ) {
        let c: Vec<_> = ctx.iter().map(|(n, d)| CreateContext::new(n, d)).collect();
        let list = CreateContextList::new(&c);
        let mut body = vec![0u8; 200 + list.byte_len()];
        let req = CreateRequestRepr {
            security_flags: 0,
            requested_oplock_level: OplockLevel::NONE,
            impersonation_level: ImpersonationLevel::IMPERSONATION,
            smb_create_flags: 0,
            desired_access: AccessMask::GENERIC_READ,
            file_attributes: FileAttributes::empty(),
            share_access: ShareAccess::READ,
            create_disposition: CreateDisposition::OPEN,
            create_options: CreateOptions::empty(),
            name: Utf16Str::EMPTY,
            create_contexts: list,
        };
        let n = req.emit(&mut body).unwrap();
        let mut chain = body[56..n].to_vec();
        let starts = create_context_starts(&chain);
        prop_assert_eq!(starts.len(), ctx.len());
        let s = starts[which % starts.len()];
        let (o, w) = [(0usize, 4usize), (4, 2), (6, 2), (10, 2), (12, 4)][field];
        let v = match raw {
            Some(r) => u64::from(r),
            None => near(rd(&chain, s + o, w), d),
        };
        wr(&mut chain, s + o, w, v);
        let actual = CreateContextIter::new(&chain)
            .find_map(|r| r.err())
            .map_or(Verdict::Ok, |e| verdict::<()>(&Err(e)));
        prop_assert_eq!(actual, create_chain_model(&chain).err().unwrap_or(Verdict::Ok));
    }

    /// One field of one negotiate context (ContextType, DataLength, the
    /// count, SaltLength) moved near its value or set at random: the
    /// NEGOTIATE request gets the model's verdict.
    #[test]
    fn negotiate_context_field_mutations_get_the_models_verdict(
        ctx in vec(neg_ctx(), 1..5),
        which in any::<usize>(),
        field in 0usize..4,
        raw in any::<Option<u16>>(),
        d in delta(),
    ) {
        let c: Vec<_> = ctx.iter().map(borrow_ctx).collect();
        let repr = NegotiateRequestRepr {
            security_mode: SecurityMode::SIGNING_ENABLED,
            capabilities: Capabilities::empty(),
            client_guid: Guid::NULL,
            dialects: U16Array::new(&[0x0302, 0x0311]),
            negotiate_contexts: NegotiateContextList::new(&c),
        };
        let mut b = vec![0u8; repr.buffer_len()];
        repr.emit(&mut b).unwrap();
        let starts = negotiate_context_starts(&b, 40, ctx.len());
        let s = starts[which % starts.len()];
        let (o, w) = [(0usize, 2usize), (2, 2), (8, 2), (10, 2)][field];
        if s + o + w <= b.len() {
            let v = match raw {
                Some(r) => u64::from(r),
                None => near(rd(&b, s + o, w), d),
            };
            wr(&mut b, s + o, w, v);
        }
        prop_assert_eq!(decode(Kind::NegotiateReq, &b), model(Kind::NegotiateReq, &b));
    }

    /// READ and WRITE channel information of every length near a whole
    /// number of descriptors, with every Channel value near the defined ones.
    #[test]
    fn channel_info_lengths_and_values_get_the_models_verdict(
        write in any::<bool>(),
        channel in 0u32..6,
        len in 0u16..80,
        extra in vec(any::<u8>(), 0..80),
    ) {
        let (kind, ch_at, off_at, len_at) = if write {
            (Kind::WriteReq, 32, 40, 42)
        } else {
            (Kind::ReadReq, 36, 44, 46)
        };
        let mut b = vec![0u8; 48];
        wr(&mut b, 0, 2, 49);
        wr(&mut b, ch_at, 4, u64::from(channel));
        wr(&mut b, off_at, 2, 112);
        wr(&mut b, len_at, 2, u64::from(len));
        b.extend_from_slice(&extra);
        prop_assert_eq!(decode(kind, &b), model(kind, &b));
    }
}
