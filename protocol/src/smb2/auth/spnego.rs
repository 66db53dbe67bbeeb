//! SPNEGO ([RFC4178], [MS-SPNG] v20) tokens, DER-encoded, the subset an SMB2
//! server with one mechanism (NTLMSSP) needs:
//! - the NegTokenInit2 of the NEGOTIATE response's security buffer
//!   ([MS-SPNG] 2.2.1, [MS-SMB2] 3.3.5.4);
//! - the client's NegTokenInit (inside the GSS-API InitialContextToken,
//!   [RFC2743] 3.1) and NegTokenResp;
//! - the server's NegTokenResp (accept-incomplete with the CHALLENGE,
//!   accept-completed, reject).
//!
//! The decoder takes untrusted bytes: every length is checked against what
//! is left, lengths are at most 4 bytes long, nesting is bounded by the
//! grammar (no recursion on input), and nothing panics. It accepts BER long
//! forms that DER would not (some clients send them); it refuses the
//! indefinite length and high tag numbers, which no SPNEGO peer uses.

use crate::WireError;

/// The SPNEGO mechanism OID 1.3.6.1.5.5.2, content octets.
pub const OID_SPNEGO: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x02];
/// NTLMSSP 1.3.6.1.4.1.311.2.2.10, content octets.
pub const OID_NTLMSSP: &[u8] = &[0x2b, 0x06, 0x01, 0x04, 0x01, 0x82, 0x37, 0x02, 0x02, 0x0a];
/// Kerberos 5 1.2.840.113554.1.2.2 (recognized, not spoken).
pub const OID_KRB5: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x12, 0x01, 0x02, 0x02];
/// Microsoft's Kerberos 5 1.2.840.48018.1.2.2 (recognized, not spoken).
pub const OID_MS_KRB5: &[u8] = &[0x2a, 0x86, 0x48, 0x82, 0xf7, 0x12, 0x01, 0x02, 0x02];

const TAG_APPLICATION_0: u8 = 0x60;
const TAG_SEQUENCE: u8 = 0x30;
const TAG_OID: u8 = 0x06;
const TAG_OCTET_STRING: u8 = 0x04;
const TAG_ENUMERATED: u8 = 0x0a;
const TAG_BIT_STRING: u8 = 0x03;
const TAG_GENERAL_STRING: u8 = 0x1b;
/// Context-specific, constructed, tag number `n`.
const fn ctx(n: u8) -> u8 {
    0xa0 | n
}

const WHAT: &str = "SPNEGO token";

fn malformed(field: &'static str) -> WireError {
    WireError::Malformed { what: WHAT, field }
}

// ---------------------------------------------------------------------------
// DER reading

/// One tag-length-value: its tag, its content, and all of its bytes.
#[derive(Debug, Clone, Copy)]
struct Tlv<'a> {
    tag: u8,
    value: &'a [u8],
    raw: &'a [u8],
}

/// Reads one TLV from the front of `b`; returns it and what follows.
fn read_tlv<'a>(b: &'a [u8], field: &'static str) -> Result<(Tlv<'a>, &'a [u8]), WireError> {
    let tag = *b.first().ok_or(WireError::Truncated {
        what: WHAT,
        need: 2,
        have: b.len(),
    })?;
    if tag & 0x1f == 0x1f {
        return Err(malformed(field)); // high tag numbers: unused by SPNEGO
    }
    let first = *b.get(1).ok_or(WireError::Truncated {
        what: WHAT,
        need: 2,
        have: b.len(),
    })?;
    let (len, hdr) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return Err(malformed(field)); // indefinite, or absurdly long
        }
        let bytes = b.get(2..2 + n).ok_or(WireError::Truncated {
            what: WHAT,
            need: 2 + n,
            have: b.len(),
        })?;
        let len = bytes
            .iter()
            .fold(0usize, |acc, &x| (acc << 8) | usize::from(x));
        (len, 2 + n)
    };
    let end = hdr.checked_add(len).ok_or(malformed(field))?;
    if b.len() < end {
        return Err(WireError::Truncated {
            what: WHAT,
            need: end,
            have: b.len(),
        });
    }
    Ok((
        Tlv {
            tag,
            value: &b[hdr..end],
            raw: &b[..end],
        },
        &b[end..],
    ))
}

/// Reads a TLV that must carry `tag`.
fn expect<'a>(b: &'a [u8], tag: u8, field: &'static str) -> Result<(Tlv<'a>, &'a [u8]), WireError> {
    let (t, rest) = read_tlv(b, field)?;
    if t.tag != tag {
        return Err(malformed(field));
    }
    Ok((t, rest))
}

/// The single TLV of `b` (nothing may follow it), with `tag`.
fn only<'a>(b: &'a [u8], tag: u8, field: &'static str) -> Result<Tlv<'a>, WireError> {
    let (t, rest) = expect(b, tag, field)?;
    if !rest.is_empty() {
        return Err(malformed(field));
    }
    Ok(t)
}

/// The context-tagged fields of a SEQUENCE body, in increasing tag order,
/// each with its explicit content; unknown tags are skipped.
fn fields<'a>(mut body: &'a [u8], field: &'static str) -> Result<[Option<&'a [u8]>; 5], WireError> {
    let mut out: [Option<&'a [u8]>; 5] = [None; 5];
    let mut last: Option<u8> = None;
    while !body.is_empty() {
        let (t, rest) = read_tlv(body, field)?;
        if t.tag & 0xe0 != 0xa0 {
            return Err(malformed(field));
        }
        let n = t.tag & 0x1f;
        if last.is_some_and(|l| n <= l) {
            return Err(malformed(field)); // duplicate or out of order
        }
        last = Some(n);
        if let Some(slot) = out.get_mut(usize::from(n)) {
            *slot = Some(t.value);
        }
        body = rest;
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// DER writing

fn push_len(out: &mut Vec<u8>, len: usize) {
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = (len as u32).to_be_bytes();
        let skip = bytes.iter().take_while(|&&b| b == 0).count();
        out.push(0x80 | (4 - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
}

fn tlv(tag: u8, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() + 6);
    out.push(tag);
    push_len(&mut out, value.len());
    out.extend_from_slice(value);
    out
}

fn concat(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

/// DER MechTypeList: SEQUENCE OF OID. The bytes the mechListMIC covers.
pub fn mech_type_list(mechs: &[&[u8]]) -> Vec<u8> {
    let oids: Vec<Vec<u8>> = mechs.iter().map(|m| tlv(TAG_OID, m)).collect();
    tlv(TAG_SEQUENCE, &concat(&oids))
}

/// Wraps a NegotiationToken in the GSS-API InitialContextToken ([RFC2743]
/// 3.1) with the SPNEGO OID.
fn initial_context_token(neg_token: Vec<u8>) -> Vec<u8> {
    tlv(
        TAG_APPLICATION_0,
        &concat(&[tlv(TAG_OID, OID_SPNEGO), neg_token]),
    )
}

/// The server's NegTokenInit2 for the NEGOTIATE response ([MS-SPNG] 2.2.1,
/// 3.2.5.2): mechTypes only. negHints is deprecated and left out; no
/// mechToken, so the client starts the chosen mechanism.
pub fn neg_token_init2(mechs: &[&[u8]]) -> Vec<u8> {
    let body = tlv(ctx(0), &mech_type_list(mechs));
    initial_context_token(tlv(ctx(0), &tlv(TAG_SEQUENCE, &body)))
}

/// A client's NegTokenInit ([RFC4178] 4.2.1) with an optimistic mechToken
/// for the first mechanism (client side).
pub fn neg_token_init(mechs: &[&[u8]], mech_token: Option<&[u8]>) -> Vec<u8> {
    let mut body = tlv(ctx(0), &mech_type_list(mechs));
    if let Some(t) = mech_token {
        body.extend_from_slice(&tlv(ctx(2), &tlv(TAG_OCTET_STRING, t)));
    }
    initial_context_token(tlv(ctx(0), &tlv(TAG_SEQUENCE, &body)))
}

/// [RFC4178] 4.2.2 negState.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NegState {
    /// accept-completed (0).
    AcceptCompleted,
    /// accept-incomplete (1).
    AcceptIncomplete,
    /// reject (2).
    Reject,
    /// request-mic (3).
    RequestMic,
}

impl NegState {
    fn wire(self) -> u8 {
        match self {
            NegState::AcceptCompleted => 0,
            NegState::AcceptIncomplete => 1,
            NegState::Reject => 2,
            NegState::RequestMic => 3,
        }
    }

    fn from_wire(v: u8) -> Option<Self> {
        Some(match v {
            0 => NegState::AcceptCompleted,
            1 => NegState::AcceptIncomplete,
            2 => NegState::Reject,
            3 => NegState::RequestMic,
            _ => return None,
        })
    }
}

/// [RFC4178] 4.2.2 NegTokenResp, to emit or as parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NegTokenResp<'a> {
    /// negState.
    pub neg_state: Option<NegState>,
    /// supportedMech (OID content octets).
    pub supported_mech: Option<&'a [u8]>,
    /// responseToken (the mechanism's token).
    pub response_token: Option<&'a [u8]>,
    /// mechListMIC.
    pub mech_list_mic: Option<&'a [u8]>,
}

impl<'a> NegTokenResp<'a> {
    /// DER: `[1] SEQUENCE { [0] negState, [1] supportedMech, [2]
    /// responseToken, [3] mechListMIC }`, absent fields left out.
    pub fn emit(&self) -> Vec<u8> {
        let mut body = Vec::new();
        if let Some(s) = self.neg_state {
            body.extend_from_slice(&tlv(ctx(0), &tlv(TAG_ENUMERATED, &[s.wire()])));
        }
        if let Some(m) = self.supported_mech {
            body.extend_from_slice(&tlv(ctx(1), &tlv(TAG_OID, m)));
        }
        if let Some(t) = self.response_token {
            body.extend_from_slice(&tlv(ctx(2), &tlv(TAG_OCTET_STRING, t)));
        }
        if let Some(m) = self.mech_list_mic {
            body.extend_from_slice(&tlv(ctx(3), &tlv(TAG_OCTET_STRING, m)));
        }
        tlv(ctx(1), &tlv(TAG_SEQUENCE, &body))
    }

    fn parse_body(seq_body: &'a [u8]) -> Result<NegTokenResp<'a>, WireError> {
        let f = fields(seq_body, "NegTokenResp")?;
        let neg_state = match f[0] {
            Some(v) => {
                let e = only(v, TAG_ENUMERATED, "negState")?;
                let [b] = e.value else {
                    return Err(malformed("negState"));
                };
                Some(NegState::from_wire(*b).ok_or(malformed("negState"))?)
            }
            None => None,
        };
        Ok(NegTokenResp {
            neg_state,
            supported_mech: f[1]
                .map(|v| only(v, TAG_OID, "supportedMech").map(|t| t.value))
                .transpose()?,
            response_token: f[2]
                .map(|v| only(v, TAG_OCTET_STRING, "responseToken").map(|t| t.value))
                .transpose()?,
            mech_list_mic: f[3]
                .map(|v| only(v, TAG_OCTET_STRING, "mechListMIC").map(|t| t.value))
                .transpose()?,
        })
    }
}

/// The server's reject token ([RFC4178] 4.2.2).
pub fn reject() -> Vec<u8> {
    NegTokenResp {
        neg_state: Some(NegState::Reject),
        ..Default::default()
    }
    .emit()
}

/// A NegTokenInit ([RFC4178] 4.2.1) or, from a server, NegTokenInit2
/// ([MS-SPNG] 2.2.1), as parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NegTokenInit<'a> {
    /// mechTypes, OID content octets, in the sender's order of preference.
    pub mech_types: Vec<&'a [u8]>,
    /// The DER of the MechTypeList (the input of mechListMIC).
    pub mech_types_der: &'a [u8],
    /// mechToken, the optimistic token of the first mechanism.
    pub mech_token: Option<&'a [u8]>,
    /// mechListMIC ([3] in NegTokenInit, [4] in NegTokenInit2).
    pub mech_list_mic: Option<&'a [u8]>,
    /// negHints.hintName (NegTokenInit2 only).
    pub hint_name: Option<&'a [u8]>,
}

impl<'a> NegTokenInit<'a> {
    fn parse_body(seq_body: &'a [u8]) -> Result<Self, WireError> {
        let f = fields(seq_body, "NegTokenInit")?;
        let list = f[0].ok_or(malformed("mechTypes"))?;
        let seq = only(list, TAG_SEQUENCE, "mechTypes")?;
        let mut mech_types = Vec::new();
        let mut rest = seq.value;
        while !rest.is_empty() {
            let (oid, r) = expect(rest, TAG_OID, "mechTypes")?;
            mech_types.push(oid.value);
            rest = r;
        }
        if let Some(flags) = f[1] {
            only(flags, TAG_BIT_STRING, "reqFlags")?;
        }
        let mech_token = f[2]
            .map(|v| only(v, TAG_OCTET_STRING, "mechToken").map(|t| t.value))
            .transpose()?;
        // [3] is mechListMIC (OCTET STRING) in RFC 4178's NegTokenInit and
        // negHints (SEQUENCE) in MS-SPNG's NegTokenInit2, whose MIC is [4].
        let mut mech_list_mic = None;
        let mut hint_name = None;
        if let Some(v) = f[3] {
            let (t, rest) = read_tlv(v, "negHints/mechListMIC")?;
            if !rest.is_empty() {
                return Err(malformed("negHints/mechListMIC"));
            }
            match t.tag {
                TAG_OCTET_STRING => mech_list_mic = Some(t.value),
                TAG_SEQUENCE => {
                    let h = fields(t.value, "negHints")?;
                    hint_name = h[0]
                        .map(|v| only(v, TAG_GENERAL_STRING, "hintName").map(|t| t.value))
                        .transpose()?;
                }
                _ => return Err(malformed("negHints/mechListMIC")),
            }
        }
        if let Some(v) = f[4] {
            mech_list_mic = Some(only(v, TAG_OCTET_STRING, "mechListMIC")?.value);
        }
        Ok(NegTokenInit {
            mech_types,
            mech_types_der: seq.raw,
            mech_token,
            mech_list_mic,
            hint_name,
        })
    }
}

/// A parsed SPNEGO token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NegToken<'a> {
    /// negTokenInit (from the client's first SESSION_SETUP, or a server's
    /// NEGOTIATE response).
    Init(NegTokenInit<'a>),
    /// negTokenResp (every later token).
    Resp(NegTokenResp<'a>),
}

impl<'a> NegToken<'a> {
    /// Parses an InitialContextToken (`60 ...` with the SPNEGO OID and a
    /// NegotiationToken) or a bare NegotiationToken (`a0 ...`, `a1 ...`).
    /// Trailing bytes after the token are refused.
    pub fn parse(token: &'a [u8]) -> Result<Self, WireError> {
        let (outer, rest) = read_tlv(token, "InitialContextToken")?;
        if !rest.is_empty() {
            return Err(malformed("trailing bytes"));
        }
        let neg = if outer.tag == TAG_APPLICATION_0 {
            let (oid, inner) = expect(outer.value, TAG_OID, "thisMech")?;
            if oid.value != OID_SPNEGO {
                return Err(malformed("thisMech (not SPNEGO)"));
            }
            let (t, rest) = read_tlv(inner, "NegotiationToken")?;
            if !rest.is_empty() {
                return Err(malformed("trailing bytes"));
            }
            t
        } else {
            outer
        };
        match neg.tag {
            t if t == ctx(0) => {
                let seq = only(neg.value, TAG_SEQUENCE, "NegTokenInit")?;
                Ok(NegToken::Init(NegTokenInit::parse_body(seq.value)?))
            }
            t if t == ctx(1) => {
                let seq = only(neg.value, TAG_SEQUENCE, "NegTokenResp")?;
                Ok(NegToken::Resp(NegTokenResp::parse_body(seq.value)?))
            }
            _ => Err(malformed("NegotiationToken")),
        }
    }
}

/// How a SESSION_SETUP security buffer is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// SPNEGO tokens carrying NTLMSSP (Windows, Samba's smbclient).
    Spnego,
    /// Bare NTLMSSP messages ("raw NTLMSSP": Linux cifs.ko sends these in
    /// SMB2 and expects the CHALLENGE back bare).
    RawNtlmssp,
}

/// The framing of a client's token: bare NTLMSSP starts with its signature.
pub fn framing(token: &[u8]) -> Framing {
    if token.starts_with(super::ntlm::SIGNATURE) {
        Framing::RawNtlmssp
    } else {
        Framing::Spnego
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::ntlm::tests::unhex;
    use super::*;
    use proptest::prelude::*;

    // Tokens from Microsoft's published SMB 3.1.1 exchange (Open
    // Specifications blog, "SMB 2 and SMB 3 security in Windows 10: the
    // anatomy of signing and cryptographic keys", appendix).

    /// The security buffer of Windows' NEGOTIATE response: NegTokenInit2
    /// with mechTypes {NEGOEX, NTLMSSP} and a NEGOEX mechToken.
    const WIN_NEGOTIATE_BLOB_HEAD: &str =
        "6082013C06062B0601050502A08201303082012CA01A3018060A2B06010401\
        823702021E060A2B06010401823702020A";
    /// The first SESSION_SETUP request's buffer: NegTokenInit, mechTypes
    /// {NTLMSSP}, mechToken = NTLMSSP NEGOTIATE.
    pub(crate) const WIN_SESSION_SETUP_1: &str =
        "604806062B0601050502A03E303CA00E300C060A2B06010401823702020AA22A\
        04284E544C4D5353500001000000978208E200000000000000000000000000000000060380250000000F";
    /// The final SESSION_SETUP response's buffer: accept-completed with the
    /// server's mechListMIC.
    pub(crate) const WIN_SESSION_SETUP_DONE: &str =
        "A11B3019A0030A0100A3120410010000003B453CDC3524164200000000";

    #[test]
    fn parses_the_windows_session_setup_negtokeninit() {
        let b = unhex(WIN_SESSION_SETUP_1);
        let NegToken::Init(init) = NegToken::parse(&b).unwrap() else {
            panic!("not init")
        };
        assert_eq!(init.mech_types, vec![OID_NTLMSSP]);
        assert_eq!(
            init.mech_types_der,
            &unhex("300C060A2B06010401823702020A")[..]
        );
        let tok = init.mech_token.unwrap();
        assert!(tok.starts_with(b"NTLMSSP\0"));
        assert_eq!(tok.len(), 0x28);
        assert_eq!(framing(&b), Framing::Spnego);
        assert_eq!(framing(tok), Framing::RawNtlmssp);
        // And our encoder writes the same bytes for the same content.
        assert_eq!(neg_token_init(&[OID_NTLMSSP], Some(tok)), b);
    }

    #[test]
    fn parses_the_windows_accept_completed() {
        let b = unhex(WIN_SESSION_SETUP_DONE);
        let NegToken::Resp(r) = NegToken::parse(&b).unwrap() else {
            panic!("not resp")
        };
        assert_eq!(r.neg_state, Some(NegState::AcceptCompleted));
        assert_eq!(r.response_token, None);
        assert_eq!(
            r.mech_list_mic,
            Some(&unhex("010000003B453CDC3524164200000000")[..])
        );
        assert_eq!(r.emit(), b, "our encoder writes Windows' bytes");
    }

    #[test]
    fn parses_the_windows_negotiate_negtokeninit2_mech_list() {
        // Only the head is kept here; rebuild a token with the same
        // mechTypes and a hint to exercise NegTokenInit2's [3] negHints.
        let head = unhex(WIN_NEGOTIATE_BLOB_HEAD);
        assert_eq!(&head[..2], &[0x60, 0x82]);
        let negoex: &[u8] = &[0x2b, 0x06, 0x01, 0x04, 0x01, 0x82, 0x37, 0x02, 0x02, 0x1e];
        let hint = tlv(
            ctx(3),
            &tlv(
                TAG_SEQUENCE,
                &tlv(
                    ctx(0),
                    &tlv(TAG_GENERAL_STRING, b"not_defined_in_RFC4178@please_ignore"),
                ),
            ),
        );
        let body = concat(&[tlv(ctx(0), &mech_type_list(&[negoex, OID_NTLMSSP])), hint]);
        let tok = initial_context_token(tlv(ctx(0), &tlv(TAG_SEQUENCE, &body)));
        let NegToken::Init(init) = NegToken::parse(&tok).unwrap() else {
            panic!()
        };
        assert_eq!(init.mech_types, vec![negoex, OID_NTLMSSP]);
        assert_eq!(
            init.hint_name,
            Some(&b"not_defined_in_RFC4178@please_ignore"[..])
        );
        assert!(head.ends_with(init.mech_types_der));
    }

    #[test]
    fn our_negtokeninit2_round_trips() {
        let b = neg_token_init2(&[OID_NTLMSSP]);
        let NegToken::Init(init) = NegToken::parse(&b).unwrap() else {
            panic!()
        };
        assert_eq!(init.mech_types, vec![OID_NTLMSSP]);
        assert_eq!(init.mech_token, None);
        assert_eq!(init.mech_list_mic, None);
    }

    #[test]
    fn negtokenresp_round_trips_with_long_lengths() {
        let big = vec![0x5a; 70_000];
        for t in [
            NegTokenResp {
                neg_state: Some(NegState::AcceptIncomplete),
                supported_mech: Some(OID_NTLMSSP),
                response_token: Some(&big),
                mech_list_mic: None,
            },
            NegTokenResp {
                neg_state: Some(NegState::Reject),
                ..Default::default()
            },
            NegTokenResp {
                neg_state: None,
                supported_mech: None,
                response_token: Some(b"x"),
                mech_list_mic: Some(&[1; 16]),
            },
        ] {
            let b = t.emit();
            assert_eq!(NegToken::parse(&b).unwrap(), NegToken::Resp(t));
        }
        assert_eq!(
            reject(),
            vec![0xa1, 0x07, 0x30, 0x05, 0xa0, 0x03, 0x0a, 0x01, 0x02]
        );
    }

    #[test]
    fn refuses_indefinite_lengths_wrong_oids_and_trailing_bytes() {
        assert!(NegToken::parse(&[0x60, 0x80, 0x00, 0x00]).is_err());
        let mut wrong = unhex(WIN_SESSION_SETUP_1);
        wrong[4] = 0x2a; // first OID byte of thisMech
        assert!(NegToken::parse(&wrong).is_err());
        let mut trailing = unhex(WIN_SESSION_SETUP_DONE);
        trailing.push(0);
        assert!(NegToken::parse(&trailing).is_err());
        // Fields out of order.
        let body = concat(&[
            tlv(ctx(2), &tlv(TAG_OCTET_STRING, b"t")),
            tlv(ctx(0), &tlv(TAG_ENUMERATED, &[0])),
        ]);
        assert!(NegToken::parse(&tlv(ctx(1), &tlv(TAG_SEQUENCE, &body))).is_err());
    }

    #[test]
    fn every_prefix_of_a_real_token_is_refused_without_panic() {
        let b = unhex(WIN_SESSION_SETUP_1);
        for n in 0..b.len() {
            assert!(NegToken::parse(&b[..n]).is_err(), "prefix {n}");
        }
    }

    proptest! {
        #[test]
        fn hostile_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = NegToken::parse(&bytes);
            let _ = framing(&bytes);
        }

        #[test]
        fn mutated_real_tokens_never_panic(i in 0usize..80, v in any::<u8>(), which in 0usize..2) {
            let mut b = unhex([WIN_SESSION_SETUP_1, WIN_SESSION_SETUP_DONE][which]);
            let n = b.len();
            b[i % n] = v;
            let _ = NegToken::parse(&b);
        }
    }
}
