//! NTLMSSP ([MS-NLMP] v38), NTLMv2 only: the three messages, the server's
//! verification of an AUTHENTICATE_MESSAGE ([MS-NLMP] 3.2.5.1.2, 3.3.2), the
//! session key it yields, the MIC over the three messages, and the NTLM
//! session-security MAC that SPNEGO's mechListMIC needs ([MS-NLMP] 3.4.4.2).
//!
//! Sans-IO: [`NtlmServer`] takes bytes and returns bytes; the server
//! challenge, the current time (for MsvAvTimestamp) and the user lookup are
//! inputs. [`NtlmClient`] is the other side (the SMB2 client library and the
//! tests authenticate with it).
//!
//! Refused on purpose: NTLMv1 and LM responses (a 24-byte NtChallengeResponse),
//! LM_KEY, OEM-only clients for the CHALLENGE (the CHALLENGE is always
//! Unicode). Every refusal is an [`AuthError`] that maps to
//! STATUS_LOGON_FAILURE or STATUS_INVALID_PARAMETER ([`AuthError::status`]).

use hmac::{Hmac, Mac};
use md4::{Digest, Md4};
use md5::Md5;
use rc4::consts::U16;
use rc4::{KeyInit, Rc4, StreamCipher};
use subtle::ConstantTimeEq;

use crate::ntstatus::{self, NtStatus};
use crate::WireError;

type HmacMd5 = Hmac<Md5>;

/// An RC4 cipher keyed with 16 bytes: the NTLM sealing handle and the key
/// exchange cipher.
pub type Rc4Key16 = Rc4<U16>;

/// [MS-NLMP] 2.2.1: Signature of every message.
pub const SIGNATURE: &[u8; 8] = b"NTLMSSP\0";

/// [MS-NLMP] 2.2.1: MessageType values.
const NT_LM_NEGOTIATE: u32 = 1;
const NT_LM_CHALLENGE: u32 = 2;
const NT_LM_AUTHENTICATE: u32 = 3;

bitmask! {
    /// [MS-NLMP] 2.2.2.5 NEGOTIATE flags.
    pub struct NegotiateFlags(u32) {
        /// NTLMSSP_NEGOTIATE_UNICODE (A).
        UNICODE = 0x0000_0001;
        /// NTLM_NEGOTIATE_OEM (B).
        OEM = 0x0000_0002;
        /// NTLMSSP_REQUEST_TARGET (C).
        REQUEST_TARGET = 0x0000_0004;
        /// NTLMSSP_NEGOTIATE_SIGN (D).
        SIGN = 0x0000_0010;
        /// NTLMSSP_NEGOTIATE_SEAL (E).
        SEAL = 0x0000_0020;
        /// NTLMSSP_NEGOTIATE_DATAGRAM (F).
        DATAGRAM = 0x0000_0040;
        /// NTLMSSP_NEGOTIATE_LM_KEY (G).
        LM_KEY = 0x0000_0080;
        /// NTLMSSP_NEGOTIATE_NTLM (H).
        NTLM = 0x0000_0200;
        /// Anonymous (J).
        ANONYMOUS = 0x0000_0800;
        /// NTLMSSP_NEGOTIATE_OEM_DOMAIN_SUPPLIED (K).
        OEM_DOMAIN_SUPPLIED = 0x0000_1000;
        /// NTLMSSP_NEGOTIATE_OEM_WORKSTATION_SUPPLIED (L).
        OEM_WORKSTATION_SUPPLIED = 0x0000_2000;
        /// NTLMSSP_NEGOTIATE_ALWAYS_SIGN (M).
        ALWAYS_SIGN = 0x0000_8000;
        /// NTLMSSP_TARGET_TYPE_DOMAIN (N).
        TARGET_TYPE_DOMAIN = 0x0001_0000;
        /// NTLMSSP_TARGET_TYPE_SERVER (O).
        TARGET_TYPE_SERVER = 0x0002_0000;
        /// NTLMSSP_NEGOTIATE_EXTENDED_SESSIONSECURITY (P).
        EXTENDED_SESSIONSECURITY = 0x0008_0000;
        /// NTLMSSP_NEGOTIATE_IDENTIFY (Q).
        IDENTIFY = 0x0010_0000;
        /// NTLMSSP_REQUEST_NON_NT_SESSION_KEY (R).
        REQUEST_NON_NT_SESSION_KEY = 0x0040_0000;
        /// NTLMSSP_NEGOTIATE_TARGET_INFO (S).
        TARGET_INFO = 0x0080_0000;
        /// NTLMSSP_NEGOTIATE_VERSION (T).
        VERSION = 0x0200_0000;
        /// NTLMSSP_NEGOTIATE_128 (U).
        NEGOTIATE_128 = 0x2000_0000;
        /// NTLMSSP_NEGOTIATE_KEY_EXCH (V).
        KEY_EXCH = 0x4000_0000;
        /// NTLMSSP_NEGOTIATE_56 (W).
        NEGOTIATE_56 = 0x8000_0000;
    }
}

/// [MS-NLMP] 2.2.2.1 AvId values.
pub mod av {
    /// MsvAvEOL: end of the list.
    pub const EOL: u16 = 0;
    /// MsvAvNbComputerName.
    pub const NB_COMPUTER_NAME: u16 = 1;
    /// MsvAvNbDomainName.
    pub const NB_DOMAIN_NAME: u16 = 2;
    /// MsvAvDnsComputerName.
    pub const DNS_COMPUTER_NAME: u16 = 3;
    /// MsvAvDnsDomainName.
    pub const DNS_DOMAIN_NAME: u16 = 4;
    /// MsvAvDnsTreeName.
    pub const DNS_TREE_NAME: u16 = 5;
    /// MsvAvFlags (4 bytes).
    pub const FLAGS: u16 = 6;
    /// MsvAvTimestamp (FILETIME, 8 bytes).
    pub const TIMESTAMP: u16 = 7;
    /// MsvAvSingleHost.
    pub const SINGLE_HOST: u16 = 8;
    /// MsvAvTargetName.
    pub const TARGET_NAME: u16 = 9;
    /// MsvAvChannelBindings.
    pub const CHANNEL_BINDINGS: u16 = 10;
    /// MsvAvFlags bit: the AUTHENTICATE_MESSAGE carries a MIC.
    pub const FLAG_MIC_PRESENT: u32 = 0x0000_0002;
}

/// Byte ranges of the fixed parts ([MS-NLMP] 2.2.1.1-2.2.1.3).
mod field {
    use crate::smb2::Field;
    pub const SIGNATURE: Field = 0..8;
    pub const MESSAGE_TYPE: Field = 8..12;
    /// NEGOTIATE_MESSAGE.NegotiateFlags.
    pub const NEG_FLAGS: Field = 12..16;
    /// CHALLENGE_MESSAGE: TargetNameFields, NegotiateFlags, ServerChallenge,
    /// Reserved, TargetInfoFields, Version.
    pub const CHAL_TARGET_NAME: usize = 12;
    pub const CHAL_FLAGS: Field = 20..24;
    pub const CHAL_SERVER_CHALLENGE: Field = 24..32;
    pub const CHAL_TARGET_INFO: usize = 40;
    pub const CHAL_VERSION: Field = 48..56;
    pub const CHAL_LEN: usize = 56;
    /// AUTHENTICATE_MESSAGE: the six fields descriptors, NegotiateFlags,
    /// Version, MIC.
    pub const AUTH_LM: usize = 12;
    pub const AUTH_NT: usize = 20;
    pub const AUTH_DOMAIN: usize = 28;
    pub const AUTH_USER: usize = 36;
    pub const AUTH_WORKSTATION: usize = 44;
    pub const AUTH_SESSION_KEY: usize = 52;
    pub const AUTH_FLAGS: Field = 60..64;
    pub const AUTH_VERSION: Field = 64..72;
    pub const AUTH_MIC: Field = 72..88;
    /// Length of the fixed part without the MIC (a message whose payload
    /// starts here has none).
    pub const AUTH_LEN_NO_MIC: usize = 64;
    pub const AUTH_LEN: usize = 88;
}

/// [MS-NLMP] 2.2.2.10 VERSION: what this implementation reports (only for
/// debugging, per the specification): 10.0, build 0, NTLMSSP_REVISION_W2K3.
const OUR_VERSION: [u8; 8] = [10, 0, 0, 0, 0, 0, 0, 0x0F];

/// [MS-NLMP] 2.2.2.7: RespType and HiRespType of an NTLMv2 client challenge.
const NTLMV2_RESP_TYPE: u8 = 1;
/// Fixed part of NTLMv2_CLIENT_CHALLENGE before its AvPairs.
const NTLMV2_BLOB_FIXED: usize = 28;

/// Why a message was refused. [`AuthError::status`] is what the SMB2
/// server answers; the rest is for the operator's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// The bytes do not form the message they claim to be.
    Malformed(WireError),
    /// A message arrived that the exchange does not expect now.
    UnexpectedMessage {
        /// What the state machine waits for.
        expected: &'static str,
        /// What came (a MessageType, or a description).
        got: &'static str,
    },
    /// An NTLMv1 or LM-only response ([MS-NLMP] 3.3.1): refused.
    NtlmV1Refused,
    /// An anonymous AUTHENTICATE while anonymous logons are not allowed.
    AnonymousRefused,
    /// The lookup knows no such user.
    UnknownUser {
        /// UserName as sent.
        user: String,
        /// DomainName as sent.
        domain: String,
    },
    /// NTProofStr did not verify under the user's NT hash.
    WrongPassword {
        /// UserName as sent.
        user: String,
        /// DomainName as sent.
        domain: String,
    },
    /// The MIC over the three messages does not match ([MS-NLMP] 3.2.5.1.2).
    MicMismatch {
        /// UserName as sent.
        user: String,
    },
    /// SPNEGO: the client's mechListMIC did not verify ([RFC4178] 5).
    MechListMicMismatch,
    /// SPNEGO: the client offers no mechanism this server speaks.
    NoCommonMechanism,
}

impl AuthError {
    /// The NTSTATUS the SESSION_SETUP response carries ([MS-SMB2] 3.3.5.5.3:
    /// a failed authentication is STATUS_LOGON_FAILURE; a token that cannot
    /// be decoded is STATUS_INVALID_PARAMETER).
    pub fn status(&self) -> NtStatus {
        match self {
            AuthError::Malformed(_) | AuthError::UnexpectedMessage { .. } => {
                ntstatus::STATUS_INVALID_PARAMETER
            }
            AuthError::NoCommonMechanism => ntstatus::STATUS_NOT_SUPPORTED,
            _ => ntstatus::STATUS_LOGON_FAILURE,
        }
    }
}

impl core::fmt::Display for AuthError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AuthError::Malformed(e) => write!(f, "malformed security token: {e}"),
            AuthError::UnexpectedMessage { expected, got } => {
                write!(f, "unexpected {got} (expected {expected})")
            }
            AuthError::NtlmV1Refused => {
                write!(f, "NTLMv1/LM response refused (only NTLMv2 is accepted)")
            }
            AuthError::AnonymousRefused => write!(f, "anonymous logon refused"),
            // The names are the peer's: escaped (control characters,
            // quotes, backslashes), so that a name cannot forge a log line
            // or drive the operator's terminal.
            AuthError::UnknownUser { user, domain } => write!(
                f,
                "unknown user '{}' (domain '{}')",
                user.escape_debug(),
                domain.escape_debug()
            ),
            AuthError::WrongPassword { user, domain } => write!(
                f,
                "wrong password for '{}' (domain '{}')",
                user.escape_debug(),
                domain.escape_debug()
            ),
            AuthError::MicMismatch { user } => write!(
                f,
                "NTLMSSP MIC mismatch for '{}' (tampered exchange?)",
                user.escape_debug()
            ),
            AuthError::MechListMicMismatch => write!(f, "SPNEGO mechListMIC mismatch"),
            AuthError::NoCommonMechanism => {
                write!(f, "the client offers no mechanism but NTLMSSP is supported")
            }
        }
    }
}

impl std::error::Error for AuthError {}

impl From<WireError> for AuthError {
    fn from(e: WireError) -> Self {
        AuthError::Malformed(e)
    }
}

// ---------------------------------------------------------------------------
// Primitives ([MS-NLMP] 3.3.1, 3.3.2, 3.4.5, 6)

/// NTOWFv1 = MD4(UNICODE(Passwd)): the NT hash a user store keeps.
pub fn nt_hash(password: &str) -> [u8; 16] {
    Md4::digest(utf16le(password)).into()
}

/// [MS-NLMP] 3.3.2 NTOWFv2 = HMAC_MD5(NT hash, UNICODE(Uppercase(User) +
/// UserDom)). Uppercasing is Unicode simple uppercasing.
pub fn ntowf_v2(nt_hash: &[u8; 16], user: &str, domain: &str) -> [u8; 16] {
    let mut m = hmac_md5(nt_hash);
    m.update(&utf16le(&user.to_uppercase()));
    m.update(&utf16le(domain));
    m.finalize().into_bytes().into()
}

/// [MS-NLMP] 3.3.2: NTProofStr = HMAC_MD5(ResponseKeyNT,
/// ConcatenationOf(CHALLENGE_MESSAGE.ServerChallenge, temp)), where `temp`
/// is the NTLMv2_CLIENT_CHALLENGE as sent.
pub fn nt_proof_str(
    response_key_nt: &[u8; 16],
    server_challenge: &[u8; 8],
    temp: &[u8],
) -> [u8; 16] {
    let mut m = hmac_md5(response_key_nt);
    m.update(server_challenge);
    m.update(temp);
    m.finalize().into_bytes().into()
}

/// [MS-NLMP] 3.3.2: SessionBaseKey = HMAC_MD5(ResponseKeyNT, NTProofStr);
/// for NTLMv2 it is also the KeyExchangeKey ([MS-NLMP] 3.4.5.1).
pub fn session_base_key(response_key_nt: &[u8; 16], nt_proof_str: &[u8; 16]) -> [u8; 16] {
    let mut m = hmac_md5(response_key_nt);
    m.update(nt_proof_str);
    m.finalize().into_bytes().into()
}

/// [MS-NLMP] 3.3.2: the LMv2 response, HMAC_MD5(ResponseKeyLM,
/// ServerChallenge || ClientChallenge) || ClientChallenge (clients only).
pub fn lmv2_response(
    response_key: &[u8; 16],
    server_challenge: &[u8; 8],
    client_challenge: &[u8; 8],
) -> [u8; 24] {
    let mut m = hmac_md5(response_key);
    m.update(server_challenge);
    m.update(client_challenge);
    let mut out = [0u8; 24];
    out[..16].copy_from_slice(&m.finalize().into_bytes());
    out[16..].copy_from_slice(client_challenge);
    out
}

/// RC4 of 16 bytes under a 16-byte key (one-shot; [MS-NLMP] 6 RC4K): the
/// key exchange ([MS-NLMP] 3.1.5.1.2, 3.2.5.1.2).
pub fn rc4k(key: &[u8; 16], data: &[u8; 16]) -> [u8; 16] {
    let mut out = *data;
    Rc4Key16::new(key.into()).apply_keystream(&mut out);
    out
}

/// [MS-NLMP] 3.1.5.1.2 / 3.2.5.1.2: MIC = HMAC_MD5(ExportedSessionKey,
/// NEGOTIATE || CHALLENGE || AUTHENTICATE), the AUTHENTICATE with its MIC
/// field zeroed.
pub fn mic(
    exported_session_key: &[u8; 16],
    negotiate: &[u8],
    challenge: &[u8],
    authenticate: &[u8],
) -> [u8; 16] {
    let mut m = hmac_md5(exported_session_key);
    m.update(negotiate);
    m.update(challenge);
    let (before, rest) = authenticate.split_at(field::AUTH_MIC.start.min(authenticate.len()));
    m.update(before);
    if rest.len() >= 16 {
        m.update(&[0u8; 16]);
        m.update(&rest[16..]);
    } else {
        m.update(rest);
    }
    m.finalize().into_bytes().into()
}

fn hmac_md5(key: &[u8]) -> HmacMd5 {
    // HMAC accepts keys of any length; this cannot fail.
    <HmacMd5 as Mac>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes any key length"))
}

/// UTF-16LE bytes of `s` ([MS-NLMP] "UNICODE()").
pub fn utf16le(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

/// Decodes a UTF-16LE field; an odd length or an unpaired surrogate is
/// malformed.
fn from_utf16le(b: &[u8], what: &'static str, field: &'static str) -> Result<String, WireError> {
    if b.len() % 2 != 0 {
        return Err(WireError::Malformed { what, field });
    }
    let units = b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]));
    char::decode_utf16(units)
        .collect::<Result<String, _>>()
        .map_err(|_| WireError::Malformed { what, field })
}

/// A string field: UTF-16LE when UNICODE was negotiated, else OEM (decoded
/// as Latin-1, which is exact for ASCII).
fn decode_str(
    b: &[u8],
    unicode: bool,
    what: &'static str,
    field: &'static str,
) -> Result<String, WireError> {
    if unicode {
        from_utf16le(b, what, field)
    } else {
        Ok(b.iter().map(|&c| char::from(c)).collect())
    }
}

fn u32_at(b: &[u8], f: crate::smb2::Field) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(f) {
        if s.len() == 4 {
            a.copy_from_slice(s);
        }
    }
    u32::from_le_bytes(a)
}

/// [MS-NLMP] 2.2.1: a *Fields descriptor (Len 2, MaxLen 2, BufferOffset 4)
/// at `at`, resolved against `msg`. An empty field's offset is ignored.
fn payload<'a>(
    msg: &'a [u8],
    at: usize,
    what: &'static str,
    name: &'static str,
) -> Result<&'a [u8], WireError> {
    let d = msg.get(at..at + 8).ok_or(WireError::Truncated {
        what,
        need: at + 8,
        have: msg.len(),
    })?;
    let len = usize::from(u16::from_le_bytes([d[0], d[1]]));
    let off = u32::from_le_bytes([d[4], d[5], d[6], d[7]]) as usize;
    if len == 0 {
        return Ok(&[]);
    }
    let end = off
        .checked_add(len)
        .ok_or(WireError::Malformed { what, field: name })?;
    msg.get(off..end)
        .ok_or(WireError::Malformed { what, field: name })
}

/// Checks Signature and MessageType.
fn check_header(msg: &[u8], ty: u32, what: &'static str) -> Result<(), WireError> {
    if msg.len() < 12 {
        return Err(WireError::Truncated {
            what,
            need: 12,
            have: msg.len(),
        });
    }
    if &msg[field::SIGNATURE] != SIGNATURE {
        return Err(WireError::Malformed {
            what,
            field: "Signature",
        });
    }
    if u32_at(msg, field::MESSAGE_TYPE) != ty {
        return Err(WireError::Malformed {
            what,
            field: "MessageType",
        });
    }
    Ok(())
}

/// The MessageType of an NTLMSSP message, if `msg` starts like one.
pub fn message_type(msg: &[u8]) -> Option<u32> {
    (msg.len() >= 12 && &msg[field::SIGNATURE] == SIGNATURE)
        .then(|| u32_at(msg, field::MESSAGE_TYPE))
}

// ---------------------------------------------------------------------------
// AV pairs ([MS-NLMP] 2.2.2.1)

/// An AV_PAIR list as the wire carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AvPairs<'a>(&'a [u8]);

impl<'a> AvPairs<'a> {
    /// Checks that `b` is a sequence of AV_PAIRs ending with MsvAvEOL (bytes
    /// after the EOL are ignored, as [MS-NLMP] 2.2.2.7 allows padding).
    pub fn parse(b: &'a [u8]) -> Result<Self, WireError> {
        const WHAT: &str = "AV_PAIR list";
        let mut at = 0usize;
        loop {
            let h = b.get(at..at + 4).ok_or(WireError::Truncated {
                what: WHAT,
                need: at + 4,
                have: b.len(),
            })?;
            let id = u16::from_le_bytes([h[0], h[1]]);
            let len = usize::from(u16::from_le_bytes([h[2], h[3]]));
            if id == av::EOL {
                return Ok(AvPairs(&b[..at + 4]));
            }
            if b.len() < at + 4 + len {
                return Err(WireError::Truncated {
                    what: WHAT,
                    need: at + 4 + len,
                    have: b.len(),
                });
            }
            at += 4 + len;
        }
    }

    /// The pairs before MsvAvEOL, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u16, &'a [u8])> + 'a {
        let b = self.0;
        let mut at = 0usize;
        core::iter::from_fn(move || {
            let h = b.get(at..at + 4)?;
            let id = u16::from_le_bytes([h[0], h[1]]);
            let len = usize::from(u16::from_le_bytes([h[2], h[3]]));
            if id == av::EOL {
                return None;
            }
            let v = b.get(at + 4..at + 4 + len)?;
            at += 4 + len;
            Some((id, v))
        })
    }

    /// The first value with `id`.
    pub fn get(&self, id: u16) -> Option<&'a [u8]> {
        self.iter().find(|&(i, _)| i == id).map(|(_, v)| v)
    }

    /// MsvAvFlags, 0 when absent.
    pub fn flags(&self) -> u32 {
        self.get(av::FLAGS)
            .and_then(|v| v.try_into().ok())
            .map_or(0, u32::from_le_bytes)
    }

    /// The bytes, EOL included.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.0
    }
}

fn push_av(out: &mut Vec<u8>, id: u16, value: &[u8]) {
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&(value.len().min(u16::MAX as usize) as u16).to_le_bytes());
    out.extend_from_slice(&value[..value.len().min(u16::MAX as usize)]);
}

// ---------------------------------------------------------------------------
// Messages

/// [MS-NLMP] 2.2.1.1 NEGOTIATE_MESSAGE, as much as a server needs: the flags.
/// Only the first 16 bytes are required (early clients stop there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NegotiateMessage {
    /// NegotiateFlags.
    pub flags: NegotiateFlags,
}

impl NegotiateMessage {
    /// Parses a NEGOTIATE_MESSAGE.
    pub fn parse(msg: &[u8]) -> Result<Self, WireError> {
        const WHAT: &str = "NTLMSSP NEGOTIATE_MESSAGE";
        check_header(msg, NT_LM_NEGOTIATE, WHAT)?;
        if msg.len() < 16 {
            return Err(WireError::Truncated {
                what: WHAT,
                need: 16,
                have: msg.len(),
            });
        }
        Ok(NegotiateMessage {
            flags: NegotiateFlags(u32_at(msg, field::NEG_FLAGS)),
        })
    }

    /// Emits a NEGOTIATE_MESSAGE with empty domain and workstation fields and
    /// a Version when VERSION is set (40 bytes; 32 without).
    pub fn emit(&self) -> Vec<u8> {
        let mut m = Vec::with_capacity(40);
        m.extend_from_slice(SIGNATURE);
        m.extend_from_slice(&NT_LM_NEGOTIATE.to_le_bytes());
        m.extend_from_slice(&self.flags.bits().to_le_bytes());
        let payload_at: u32 = if self.flags.contains(NegotiateFlags::VERSION) {
            40
        } else {
            32
        };
        for _ in 0..2 {
            m.extend_from_slice(&[0, 0, 0, 0]);
            m.extend_from_slice(&payload_at.to_le_bytes());
        }
        if self.flags.contains(NegotiateFlags::VERSION) {
            m.extend_from_slice(&OUR_VERSION);
        }
        m
    }
}

/// [MS-NLMP] 2.2.1.2 CHALLENGE_MESSAGE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChallengeMessage<'a> {
    /// NegotiateFlags.
    pub flags: NegotiateFlags,
    /// ServerChallenge.
    pub server_challenge: [u8; 8],
    /// TargetName (UTF-16LE when UNICODE is set).
    pub target_name: &'a [u8],
    /// TargetInfo (an AV_PAIR list).
    pub target_info: AvPairs<'a>,
}

impl<'a> ChallengeMessage<'a> {
    /// Parses a CHALLENGE_MESSAGE (client side).
    pub fn parse(msg: &'a [u8]) -> Result<Self, WireError> {
        const WHAT: &str = "NTLMSSP CHALLENGE_MESSAGE";
        check_header(msg, NT_LM_CHALLENGE, WHAT)?;
        if msg.len() < 48 {
            return Err(WireError::Truncated {
                what: WHAT,
                need: 48,
                have: msg.len(),
            });
        }
        let mut server_challenge = [0u8; 8];
        server_challenge.copy_from_slice(&msg[field::CHAL_SERVER_CHALLENGE]);
        let info = payload(msg, field::CHAL_TARGET_INFO, WHAT, "TargetInfoFields")?;
        let target_info = if info.is_empty() {
            AvPairs(&[])
        } else {
            AvPairs::parse(info)?
        };
        Ok(ChallengeMessage {
            flags: NegotiateFlags(u32_at(msg, field::CHAL_FLAGS)),
            server_challenge,
            target_name: payload(msg, field::CHAL_TARGET_NAME, WHAT, "TargetNameFields")?,
            target_info,
        })
    }
}

/// [MS-NLMP] 2.2.1.3 AUTHENTICATE_MESSAGE, fields resolved (zero-copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthenticateMessage<'a> {
    /// LmChallengeResponse.
    pub lm_response: &'a [u8],
    /// NtChallengeResponse.
    pub nt_response: &'a [u8],
    /// DomainName (encoded as sent).
    pub domain: &'a [u8],
    /// UserName (encoded as sent).
    pub user: &'a [u8],
    /// Workstation (encoded as sent).
    pub workstation: &'a [u8],
    /// EncryptedRandomSessionKey.
    pub encrypted_session_key: &'a [u8],
    /// NegotiateFlags.
    pub flags: NegotiateFlags,
    /// MIC, when the fixed part is long enough to hold one (every payload
    /// offset at or after byte 88).
    pub mic: Option<[u8; 16]>,
}

impl<'a> AuthenticateMessage<'a> {
    /// Parses an AUTHENTICATE_MESSAGE; every field must lie inside `msg`.
    pub fn parse(msg: &'a [u8]) -> Result<Self, WireError> {
        const WHAT: &str = "NTLMSSP AUTHENTICATE_MESSAGE";
        check_header(msg, NT_LM_AUTHENTICATE, WHAT)?;
        if msg.len() < field::AUTH_LEN_NO_MIC {
            return Err(WireError::Truncated {
                what: WHAT,
                need: field::AUTH_LEN_NO_MIC,
                have: msg.len(),
            });
        }
        let fields = [
            (field::AUTH_LM, "LmChallengeResponseFields"),
            (field::AUTH_NT, "NtChallengeResponseFields"),
            (field::AUTH_DOMAIN, "DomainNameFields"),
            (field::AUTH_USER, "UserNameFields"),
            (field::AUTH_WORKSTATION, "WorkstationFields"),
            (field::AUTH_SESSION_KEY, "EncryptedRandomSessionKeyFields"),
        ];
        let mut v: [&[u8]; 6] = [&[]; 6];
        // The payload starts after the fixed part; its lowest offset tells
        // whether Version and MIC are present.
        let mut first_payload = msg.len();
        for (i, (at, name)) in fields.iter().enumerate() {
            v[i] = payload(msg, *at, WHAT, name)?;
            if !v[i].is_empty() {
                let off = u32_at(msg, *at + 4..*at + 8) as usize;
                if off < field::AUTH_LEN_NO_MIC {
                    return Err(WireError::Malformed {
                        what: WHAT,
                        field: name,
                    });
                }
                first_payload = first_payload.min(off);
            }
        }
        let mic = (first_payload >= field::AUTH_LEN && msg.len() >= field::AUTH_LEN).then(|| {
            let mut m = [0u8; 16];
            m.copy_from_slice(&msg[field::AUTH_MIC]);
            m
        });
        Ok(AuthenticateMessage {
            lm_response: v[0],
            nt_response: v[1],
            domain: v[2],
            user: v[3],
            workstation: v[4],
            encrypted_session_key: v[5],
            flags: NegotiateFlags(u32_at(msg, field::AUTH_FLAGS)),
            mic,
        })
    }
}

/// Appends a payload and returns its descriptor (Len, MaxLen, Offset).
fn put_payload(payload: &mut Vec<u8>, base: usize, data: &[u8]) -> [u8; 8] {
    let off = (base + payload.len()) as u32;
    let len = data.len().min(u16::MAX as usize) as u16;
    payload.extend_from_slice(&data[..usize::from(len)]);
    let mut d = [0u8; 8];
    d[0..2].copy_from_slice(&len.to_le_bytes());
    d[2..4].copy_from_slice(&len.to_le_bytes());
    d[4..8].copy_from_slice(&off.to_le_bytes());
    d
}

// ---------------------------------------------------------------------------
// Server

/// The names the server puts in the CHALLENGE's TargetName and TargetInfo
/// ([MS-NLMP] 3.2.5.1.1). A standalone server uses its own name for both the
/// NetBIOS computer and domain names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetNames {
    /// MsvAvNbComputerName (and TargetName).
    pub nb_computer: String,
    /// MsvAvNbDomainName.
    pub nb_domain: String,
    /// MsvAvDnsComputerName.
    pub dns_computer: String,
    /// MsvAvDnsDomainName.
    pub dns_domain: String,
}

impl TargetNames {
    /// Names for a standalone server called `name` (upper-cased for the
    /// NetBIOS names, lower-cased for the DNS ones).
    pub fn standalone(name: &str) -> Self {
        TargetNames {
            nb_computer: name.to_uppercase(),
            nb_domain: name.to_uppercase(),
            dns_computer: name.to_lowercase(),
            dns_domain: name.to_lowercase(),
        }
    }
}

/// How an [`NtlmServer`] answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NtlmServerConfig {
    /// The CHALLENGE's names.
    pub names: TargetNames,
    /// The current time as a FILETIME (100 ns units since 1601-01-01 UTC),
    /// sent as MsvAvTimestamp; its presence makes clients send a MIC
    /// ([MS-NLMP] 3.1.5.1.2). `None` leaves MsvAvTimestamp out.
    pub timestamp: Option<u64>,
    /// Accept anonymous AUTHENTICATE messages ([MS-NLMP] 3.2.5.1.2). The
    /// result is an [`AuthOk`] with `anonymous` set.
    pub allow_anonymous: bool,
}

/// A successful authentication.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthOk {
    /// UserName as the client sent it (empty for anonymous).
    pub user: String,
    /// DomainName as the client sent it.
    pub domain: String,
    /// Workstation as the client sent it.
    pub workstation: String,
    /// ExportedSessionKey ([MS-NLMP] 3.2.5.1.2): the SMB2 Session.SessionKey
    /// ([MS-SMB2] 3.3.5.5.3) from which the signing key is derived.
    pub session_key: [u8; 16],
    /// An anonymous logon ([MS-SMB2] SMB2_SESSION_FLAG_IS_NULL): no
    /// signing, no key.
    pub anonymous: bool,
    /// The flags of the AUTHENTICATE_MESSAGE (the negotiated set).
    pub flags: NegotiateFlags,
    /// A MIC was present and verified.
    pub mic_verified: bool,
}

impl core::fmt::Debug for AuthOk {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AuthOk")
            .field("user", &self.user)
            .field("domain", &self.domain)
            .field("workstation", &self.workstation)
            .field("session_key", &"<redacted>")
            .field("anonymous", &self.anonymous)
            .field("flags", &self.flags)
            .field("mic_verified", &self.mic_verified)
            .finish()
    }
}

#[derive(Debug)]
enum ServerState {
    AwaitNegotiate,
    AwaitAuthenticate {
        negotiate: Vec<u8>,
        challenge: Vec<u8>,
    },
    Done,
}

/// The server side of one NTLMSSP exchange: NEGOTIATE in, CHALLENGE out,
/// AUTHENTICATE in, [`AuthOk`] out. One instance per SESSION_SETUP
/// sequence; any error ends it.
#[derive(Debug)]
pub struct NtlmServer {
    challenge: [u8; 8],
    config: NtlmServerConfig,
    state: ServerState,
}

impl NtlmServer {
    /// A server that will send `challenge` (8 random bytes from the caller:
    /// [MS-NLMP] 3.2.5.1.1 requires a fresh nonce per exchange).
    pub fn new(challenge: [u8; 8], config: NtlmServerConfig) -> Self {
        NtlmServer {
            challenge,
            config,
            state: ServerState::AwaitNegotiate,
        }
    }

    /// The flags the CHALLENGE answers a NEGOTIATE with ([MS-NLMP]
    /// 3.2.5.1.1): what the client asked for among what this server
    /// supports, plus what NTLMv2 with target info always needs.
    fn answer_flags(client: NegotiateFlags) -> NegotiateFlags {
        let echoed = NegotiateFlags::SIGN
            | NegotiateFlags::SEAL
            | NegotiateFlags::ALWAYS_SIGN
            | NegotiateFlags::EXTENDED_SESSIONSECURITY
            | NegotiateFlags::NEGOTIATE_128
            | NegotiateFlags::NEGOTIATE_56
            | NegotiateFlags::KEY_EXCH
            | NegotiateFlags::IDENTIFY
            | NegotiateFlags::REQUEST_TARGET;
        let mut f = (client & echoed)
            | NegotiateFlags::UNICODE
            | NegotiateFlags::NTLM
            | NegotiateFlags::TARGET_INFO
            | NegotiateFlags::VERSION;
        if client.contains(NegotiateFlags::REQUEST_TARGET) {
            f |= NegotiateFlags::TARGET_TYPE_SERVER;
        }
        f
    }

    /// NEGOTIATE_MESSAGE in, CHALLENGE_MESSAGE out.
    pub fn on_negotiate(&mut self, msg: &[u8]) -> Result<Vec<u8>, AuthError> {
        if !matches!(self.state, ServerState::AwaitNegotiate) {
            self.state = ServerState::Done;
            return Err(AuthError::UnexpectedMessage {
                expected: "AUTHENTICATE_MESSAGE",
                got: "NEGOTIATE_MESSAGE",
            });
        }
        let neg = match NegotiateMessage::parse(msg) {
            Ok(n) => n,
            Err(e) => {
                self.state = ServerState::Done;
                return Err(e.into());
            }
        };
        let challenge = self.emit_challenge(Self::answer_flags(neg.flags));
        self.state = ServerState::AwaitAuthenticate {
            negotiate: msg.to_vec(),
            challenge: challenge.clone(),
        };
        Ok(challenge)
    }

    fn emit_challenge(&self, flags: NegotiateFlags) -> Vec<u8> {
        let n = &self.config.names;
        let mut info = Vec::with_capacity(128);
        push_av(&mut info, av::NB_DOMAIN_NAME, &utf16le(&n.nb_domain));
        push_av(&mut info, av::NB_COMPUTER_NAME, &utf16le(&n.nb_computer));
        push_av(&mut info, av::DNS_DOMAIN_NAME, &utf16le(&n.dns_domain));
        push_av(&mut info, av::DNS_COMPUTER_NAME, &utf16le(&n.dns_computer));
        if let Some(t) = self.config.timestamp {
            push_av(&mut info, av::TIMESTAMP, &t.to_le_bytes());
        }
        push_av(&mut info, av::EOL, &[]);
        let target_name = if flags.contains(NegotiateFlags::REQUEST_TARGET) {
            utf16le(&n.nb_computer)
        } else {
            Vec::new()
        };

        let mut payload = Vec::new();
        let name_d = put_payload(&mut payload, field::CHAL_LEN, &target_name);
        let info_d = put_payload(&mut payload, field::CHAL_LEN, &info);
        let mut m = Vec::with_capacity(field::CHAL_LEN + payload.len());
        m.extend_from_slice(SIGNATURE);
        m.extend_from_slice(&NT_LM_CHALLENGE.to_le_bytes());
        m.extend_from_slice(&name_d);
        m.extend_from_slice(&flags.bits().to_le_bytes());
        m.extend_from_slice(&self.challenge);
        m.extend_from_slice(&[0u8; 8]);
        m.extend_from_slice(&info_d);
        m.extend_from_slice(&OUR_VERSION);
        debug_assert_eq!(m.len(), field::CHAL_LEN);
        debug_assert_eq!(&m[field::CHAL_VERSION], &OUR_VERSION);
        m.extend_from_slice(&payload);
        m
    }

    /// AUTHENTICATE_MESSAGE in: verifies the NTLMv2 response against the NT
    /// hash `lookup(user, domain)` returns (user and domain as the client
    /// sent them; a local store ignores the domain and matches the user
    /// case-insensitively), then the key exchange and the MIC.
    ///
    /// [MS-NLMP] 3.2.5.1.2 and 3.3.2. NTOWFv2 is computed with the domain as
    /// sent, then, if that fails, with an empty domain and with the domain
    /// upper-cased (clients differ in what they hash).
    pub fn on_authenticate<F>(&mut self, msg: &[u8], lookup: F) -> Result<AuthOk, AuthError>
    where
        F: Fn(&str, &str) -> Option<[u8; 16]>,
    {
        let (negotiate, challenge) = match core::mem::replace(&mut self.state, ServerState::Done) {
            ServerState::AwaitAuthenticate {
                negotiate,
                challenge,
            } => (negotiate, challenge),
            _ => {
                return Err(AuthError::UnexpectedMessage {
                    expected: "NEGOTIATE_MESSAGE",
                    got: "AUTHENTICATE_MESSAGE",
                })
            }
        };
        const WHAT: &str = "NTLMSSP AUTHENTICATE_MESSAGE";
        let a = AuthenticateMessage::parse(msg)?;
        let unicode = a.flags.contains(NegotiateFlags::UNICODE);
        let user = decode_str(a.user, unicode, WHAT, "UserName")?;
        let domain = decode_str(a.domain, unicode, WHAT, "DomainName")?;
        let workstation = decode_str(a.workstation, unicode, WHAT, "Workstation")?;

        // Anonymous ([MS-NLMP] 3.2.5.1.2): no user, no NT response, an LM
        // response that is empty or one zero byte.
        if user.is_empty()
            && a.nt_response.is_empty()
            && (a.lm_response.is_empty() || a.lm_response == [0])
        {
            if !self.config.allow_anonymous {
                return Err(AuthError::AnonymousRefused);
            }
            // SessionBaseKey and KeyExchangeKey are all zeros.
            let session_key = self.exported_key(&a, &[0u8; 16])?;
            return Ok(AuthOk {
                user,
                domain,
                workstation,
                session_key,
                anonymous: true,
                flags: a.flags,
                mic_verified: false,
            });
        }
        // NTLMv1 (24 bytes) or LM only: refused. NTLMv2 is NTProofStr (16) +
        // a client challenge of at least its fixed part and an EOL.
        if a.nt_response.len() <= 24 {
            return Err(AuthError::NtlmV1Refused);
        }
        if a.nt_response.len() < 16 + NTLMV2_BLOB_FIXED + 4 {
            return Err(WireError::Truncated {
                what: WHAT,
                need: 16 + NTLMV2_BLOB_FIXED + 4,
                have: a.nt_response.len(),
            }
            .into());
        }
        let (proof, temp) = a.nt_response.split_at(16);
        if temp[0] != NTLMV2_RESP_TYPE || temp[1] != NTLMV2_RESP_TYPE {
            return Err(WireError::Malformed {
                what: "NTLMv2_CLIENT_CHALLENGE",
                field: "RespType",
            }
            .into());
        }
        let client_av = AvPairs::parse(&temp[NTLMV2_BLOB_FIXED..])?;

        // An unknown user costs the same work as a wrong password, so the
        // answer's timing does not tell which names exist.
        let found = lookup(&user, &domain);
        let hash = found.unwrap_or([0; 16]);
        let server_challenge = self.challenge;
        let upper = domain.to_uppercase();
        let mut candidates: Vec<&str> = vec![&domain];
        if !domain.is_empty() {
            candidates.push("");
        }
        if upper != domain {
            candidates.push(&upper);
        }
        let key = candidates.iter().find_map(|d| {
            let key = ntowf_v2(&hash, &user, d);
            let mut m = hmac_md5(&key);
            m.update(&server_challenge);
            m.update(temp);
            m.verify_slice(proof).is_ok().then_some(key)
        });
        if found.is_none() {
            return Err(AuthError::UnknownUser { user, domain });
        }
        let Some(response_key) = key else {
            return Err(AuthError::WrongPassword { user, domain });
        };
        let mut proof16 = [0u8; 16];
        proof16.copy_from_slice(proof);
        let base = session_base_key(&response_key, &proof16);
        let session_key = self.exported_key(&a, &base)?;

        let mic_required = client_av.flags() & av::FLAG_MIC_PRESENT != 0;
        let mut mic_verified = false;
        if mic_required {
            let Some(sent) = a.mic else {
                return Err(AuthError::MicMismatch { user });
            };
            let want = mic(&session_key, &negotiate, &challenge, msg);
            if !bool::from(want.ct_eq(&sent)) {
                return Err(AuthError::MicMismatch { user });
            }
            mic_verified = true;
        }
        Ok(AuthOk {
            user,
            domain,
            workstation,
            session_key,
            anonymous: false,
            flags: a.flags,
            mic_verified,
        })
    }

    /// [MS-NLMP] 3.2.5.1.2: ExportedSessionKey = RC4K(KeyExchangeKey,
    /// EncryptedRandomSessionKey) with KEY_EXCH, else KeyExchangeKey.
    fn exported_key(
        &self,
        a: &AuthenticateMessage<'_>,
        kxkey: &[u8; 16],
    ) -> Result<[u8; 16], AuthError> {
        if !a.flags.contains(NegotiateFlags::KEY_EXCH) {
            return Ok(*kxkey);
        }
        let enc: [u8; 16] =
            a.encrypted_session_key
                .try_into()
                .map_err(|_| WireError::Malformed {
                    what: "NTLMSSP AUTHENTICATE_MESSAGE",
                    field: "EncryptedRandomSessionKey (KEY_EXCH set: 16 bytes)",
                })?;
        Ok(rc4k(kxkey, &enc))
    }
}

// ---------------------------------------------------------------------------
// Session security: the MAC SPNEGO's mechListMIC is ([MS-NLMP] 3.4.4.2, 3.4.5)

const CLIENT_SIGN_MAGIC: &[u8] = b"session key to client-to-server signing key magic constant\0";
const SERVER_SIGN_MAGIC: &[u8] = b"session key to server-to-client signing key magic constant\0";
const CLIENT_SEAL_MAGIC: &[u8] = b"session key to client-to-server sealing key magic constant\0";
const SERVER_SEAL_MAGIC: &[u8] = b"session key to server-to-client sealing key magic constant\0";

/// Which direction's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Messages the client sends.
    ClientToServer,
    /// Messages the server sends.
    ServerToClient,
}

/// [MS-NLMP] 3.4.5.2 SIGNKEY (extended session security).
pub fn sign_key(exported_session_key: &[u8; 16], dir: Direction) -> [u8; 16] {
    let magic = match dir {
        Direction::ClientToServer => CLIENT_SIGN_MAGIC,
        Direction::ServerToClient => SERVER_SIGN_MAGIC,
    };
    let mut h = Md5::new();
    h.update(exported_session_key);
    h.update(magic);
    h.finalize().into()
}

/// [MS-NLMP] 3.4.5.3 SEALKEY (extended session security): the key is cut to
/// 7 bytes with NEGOTIATE_56 and 5 without either NEGOTIATE_128 or _56.
pub fn seal_key(
    exported_session_key: &[u8; 16],
    flags: NegotiateFlags,
    dir: Direction,
) -> [u8; 16] {
    let magic = match dir {
        Direction::ClientToServer => CLIENT_SEAL_MAGIC,
        Direction::ServerToClient => SERVER_SEAL_MAGIC,
    };
    let n = if flags.contains(NegotiateFlags::NEGOTIATE_128) {
        16
    } else if flags.contains(NegotiateFlags::NEGOTIATE_56) {
        7
    } else {
        5
    };
    let mut h = Md5::new();
    h.update(&exported_session_key[..n]);
    h.update(magic);
    h.finalize().into()
}

/// [MS-NLMP] 3.4.4.2: the NTLMSSP_MESSAGE_SIGNATURE of `message` with
/// extended session security: Version 1, the first 8 bytes of
/// HMAC_MD5(SigningKey, SeqNum || Message) (RC4-encrypted with the sealing
/// handle when KEY_EXCH was negotiated), SeqNum.
pub fn mac(sign_key: &[u8; 16], seal: Option<&mut Rc4Key16>, seq: u32, message: &[u8]) -> [u8; 16] {
    let mut m = hmac_md5(sign_key);
    m.update(&seq.to_le_bytes());
    m.update(message);
    let full = m.finalize().into_bytes();
    let mut checksum = [0u8; 8];
    checksum.copy_from_slice(&full[..8]);
    if let Some(h) = seal {
        h.apply_keystream(&mut checksum);
    }
    let mut out = [0u8; 16];
    out[0..4].copy_from_slice(&1u32.to_le_bytes());
    out[4..12].copy_from_slice(&checksum);
    out[12..16].copy_from_slice(&seq.to_le_bytes());
    out
}

/// GSS_GetMIC of the first message in `dir` after authentication (SeqNum 0,
/// a fresh sealing handle): what SPNEGO's mechListMIC carries ([MS-SPNG]
/// 3.3.5.1, [RFC4178] 5). Only defined with extended session security.
pub fn first_mic(
    session_key: &[u8; 16],
    flags: NegotiateFlags,
    dir: Direction,
    message: &[u8],
) -> Option<[u8; 16]> {
    if !flags.contains(NegotiateFlags::EXTENDED_SESSIONSECURITY) {
        return None;
    }
    let sk = sign_key(session_key, dir);
    let mut handle = flags
        .contains(NegotiateFlags::KEY_EXCH)
        .then(|| Rc4Key16::new((&seal_key(session_key, flags, dir)).into()));
    Some(mac(&sk, handle.as_mut(), 0, message))
}

// ---------------------------------------------------------------------------
// Client

/// The client side of one NTLMSSP exchange, NTLMv2 with extended session
/// security, key exchange, and a MIC when the server sends MsvAvTimestamp.
/// The random inputs (client challenge, session key) and the time are the
/// caller's.
#[derive(Clone)]
pub struct NtlmClient {
    user: String,
    domain: String,
    workstation: String,
    nt_hash: [u8; 16],
    flags: NegotiateFlags,
    negotiate: Vec<u8>,
    session_key: Option<[u8; 16]>,
    negotiated: NegotiateFlags,
}

impl core::fmt::Debug for NtlmClient {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("NtlmClient")
            .field("user", &self.user)
            .field("domain", &self.domain)
            .field("workstation", &self.workstation)
            .field("flags", &self.flags)
            .finish_non_exhaustive()
    }
}

impl NtlmClient {
    /// The flags this client asks for.
    pub const DEFAULT_FLAGS: NegotiateFlags = NegotiateFlags(
        NegotiateFlags::UNICODE.0
            | NegotiateFlags::REQUEST_TARGET.0
            | NegotiateFlags::SIGN.0
            | NegotiateFlags::NTLM.0
            | NegotiateFlags::ALWAYS_SIGN.0
            | NegotiateFlags::EXTENDED_SESSIONSECURITY.0
            | NegotiateFlags::TARGET_INFO.0
            | NegotiateFlags::VERSION.0
            | NegotiateFlags::NEGOTIATE_128.0
            | NegotiateFlags::KEY_EXCH.0
            | NegotiateFlags::NEGOTIATE_56.0,
    );

    /// A client for `user` in `domain` with the NT hash of its password
    /// ([`nt_hash`]). An empty `user` and hash of zeros mean anonymous.
    pub fn new(user: &str, domain: &str, nt_hash: [u8; 16], workstation: &str) -> Self {
        NtlmClient {
            user: user.to_string(),
            domain: domain.to_string(),
            workstation: workstation.to_string(),
            nt_hash,
            flags: Self::DEFAULT_FLAGS,
            negotiate: Vec::new(),
            session_key: None,
            negotiated: NegotiateFlags::empty(),
        }
    }

    /// An anonymous client ([MS-NLMP] 3.1.5.1.2).
    pub fn anonymous(workstation: &str) -> Self {
        let mut c = Self::new("", "", [0; 16], workstation);
        c.flags |= NegotiateFlags::ANONYMOUS;
        c
    }

    /// Replaces the flags the NEGOTIATE asks for.
    pub fn with_flags(mut self, flags: NegotiateFlags) -> Self {
        self.flags = flags;
        self
    }

    /// The NEGOTIATE_MESSAGE (kept for the MIC).
    pub fn negotiate(&mut self) -> Vec<u8> {
        self.negotiate = NegotiateMessage { flags: self.flags }.emit();
        self.negotiate.clone()
    }

    /// CHALLENGE_MESSAGE in, AUTHENTICATE_MESSAGE out. `now` is a FILETIME
    /// used when the server sent no MsvAvTimestamp.
    pub fn authenticate(
        &mut self,
        challenge: &[u8],
        client_challenge: [u8; 8],
        random_session_key: [u8; 16],
        now: u64,
    ) -> Result<Vec<u8>, AuthError> {
        let c = ChallengeMessage::parse(challenge)?;
        let flags = c.flags;
        self.negotiated = flags;
        let anonymous = self.user.is_empty();
        let server_ts = c
            .target_info
            .get(av::TIMESTAMP)
            .and_then(|v| <[u8; 8]>::try_from(v).ok());
        let with_mic = server_ts.is_some() && !anonymous;

        let (lm, nt, base) = if anonymous {
            (vec![0u8], Vec::new(), [0u8; 16])
        } else {
            // [MS-NLMP] 3.1.5.1.2: the client's AV pairs are the server's,
            // plus MsvAvFlags with the MIC bit when it sends a MIC.
            let mut info = Vec::new();
            let mut had_flags = false;
            for (id, v) in c.target_info.iter() {
                if id == av::FLAGS && with_mic {
                    let f =
                        u32::from_le_bytes(v.try_into().unwrap_or([0; 4])) | av::FLAG_MIC_PRESENT;
                    push_av(&mut info, id, &f.to_le_bytes());
                    had_flags = true;
                } else {
                    push_av(&mut info, id, v);
                }
            }
            if with_mic && !had_flags {
                push_av(&mut info, av::FLAGS, &av::FLAG_MIC_PRESENT.to_le_bytes());
            }
            push_av(&mut info, av::EOL, &[]);
            let ts = server_ts.map_or(now, u64::from_le_bytes);
            let mut temp = Vec::with_capacity(NTLMV2_BLOB_FIXED + info.len() + 4);
            temp.extend_from_slice(&[NTLMV2_RESP_TYPE, NTLMV2_RESP_TYPE, 0, 0, 0, 0, 0, 0]);
            temp.extend_from_slice(&ts.to_le_bytes());
            temp.extend_from_slice(&client_challenge);
            temp.extend_from_slice(&[0u8; 4]);
            temp.extend_from_slice(&info);
            temp.extend_from_slice(&[0u8; 4]);
            let key = ntowf_v2(&self.nt_hash, &self.user, &self.domain);
            let proof = nt_proof_str(&key, &c.server_challenge, &temp);
            let mut nt = proof.to_vec();
            nt.extend_from_slice(&temp);
            // With MsvAvTimestamp the LM response is Z(24) ([MS-NLMP] 3.1.5.1.2).
            let lm = if server_ts.is_some() {
                vec![0u8; 24]
            } else {
                lmv2_response(&key, &c.server_challenge, &client_challenge).to_vec()
            };
            (lm, nt, session_base_key(&key, &proof))
        };
        let (exported, enc_key) = if flags.contains(NegotiateFlags::KEY_EXCH) {
            (
                random_session_key,
                rc4k(&base, &random_session_key).to_vec(),
            )
        } else {
            (base, Vec::new())
        };

        let header_len = if with_mic {
            field::AUTH_LEN
        } else {
            field::AUTH_LEN_NO_MIC + 8
        };
        let mut payload = Vec::new();
        let domain = utf16le(&self.domain);
        let user = utf16le(&self.user);
        let ws = utf16le(&self.workstation);
        let d_domain = put_payload(&mut payload, header_len, &domain);
        let d_user = put_payload(&mut payload, header_len, &user);
        let d_ws = put_payload(&mut payload, header_len, &ws);
        let d_lm = put_payload(&mut payload, header_len, &lm);
        let d_nt = put_payload(&mut payload, header_len, &nt);
        let d_key = put_payload(&mut payload, header_len, &enc_key);
        let mut m = Vec::with_capacity(header_len + payload.len());
        m.extend_from_slice(SIGNATURE);
        m.extend_from_slice(&NT_LM_AUTHENTICATE.to_le_bytes());
        for d in [d_lm, d_nt, d_domain, d_user, d_ws, d_key] {
            m.extend_from_slice(&d);
        }
        m.extend_from_slice(&flags.bits().to_le_bytes());
        m.extend_from_slice(&OUR_VERSION);
        debug_assert_eq!(&m[field::AUTH_VERSION], &OUR_VERSION);
        if with_mic {
            m.extend_from_slice(&[0u8; 16]);
        }
        m.extend_from_slice(&payload);
        if with_mic {
            let code = mic(&exported, &self.negotiate, challenge, &m);
            m[field::AUTH_MIC].copy_from_slice(&code);
        }
        self.session_key = Some(exported);
        Ok(m)
    }

    /// ExportedSessionKey, once [`authenticate`](Self::authenticate) ran.
    pub fn session_key(&self) -> Option<[u8; 16]> {
        self.session_key
    }

    /// The flags the server's CHALLENGE settled on.
    pub fn negotiated_flags(&self) -> NegotiateFlags {
        self.negotiated
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn unhex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    // [MS-NLMP] 4.2.1 common values.
    const USER: &str = "User";
    const DOMAIN: &str = "Domain";
    const PASSWORD: &str = "Password";
    const SERVER_CHALLENGE: [u8; 8] = [0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef];
    const CLIENT_CHALLENGE: [u8; 8] = [0xaa; 8];
    const RANDOM_SESSION_KEY: [u8; 16] = [0x55; 16];

    /// [MS-NLMP] 4.2.4.1.3 / 4.2.4.2.2: temp, with TargetInfo
    /// {MsvAvNbDomainName "Domain", MsvAvNbComputerName "Server"} and Time 0.
    const SPEC_TEMP: &str = "01010000000000000000000000000000aaaaaaaaaaaaaaaa00000000\
        02000c0044006f006d00610069006e0001000c005300650072007600650072000000000000000000";
    /// [MS-NLMP] 4.2.4.3: the CHALLENGE_MESSAGE.
    const SPEC_CHALLENGE: &str = "4e544c4d53535000020000000c000c003800000033828ae20123456789abcdef\
        00000000000000002400240044000000060070170000000f53006500720076006500720002000c0044006f00\
        6d00610069006e0001000c0053006500720076006500720000000000";
    /// [MS-NLMP] 4.2.4.3: the AUTHENTICATE_MESSAGE (no MIC).
    const SPEC_AUTHENTICATE: &str =
        "4e544c4d5353500003000000180018006c00000054005400840000000c000c00\
        480000000800080054000000100010005c00000010001000d8000000358288e20501280a0000000f44006f00\
        6d00610069006e00550073006500720043004f004d005000550054004500520086c35097ac9cec102554764a\
        57cccc19aaaaaaaaaaaaaaaa68cd0ab851e51c96aabc927bebef6a1c01010000000000000000000000000000\
        aaaaaaaaaaaaaaaa0000000002000c0044006f006d00610069006e0001000c00530065007200760065007200\
        0000000000000000c5dad2544fc9799094ce1ce90bc9d03e";

    fn spec_server() -> NtlmServer {
        NtlmServer::new(
            SERVER_CHALLENGE,
            NtlmServerConfig {
                names: TargetNames::standalone("Server"),
                timestamp: None,
                allow_anonymous: false,
            },
        )
    }

    fn lookup_spec(user: &str, _domain: &str) -> Option<[u8; 16]> {
        user.eq_ignore_ascii_case(USER).then(|| nt_hash(PASSWORD))
    }

    #[test]
    fn nt_hash_of_password_matches_ms_nlmp_4_2_1() {
        // [MS-NLMP] 4.2.2.1.2 NTOWFv1("Password").
        assert_eq!(
            nt_hash(PASSWORD).to_vec(),
            unhex("a4f49c406510bdcab6824ee7c30fd852")
        );
    }

    #[test]
    fn ntowfv2_matches_ms_nlmp_4_2_4_1_1() {
        let k = ntowf_v2(&nt_hash(PASSWORD), USER, DOMAIN);
        assert_eq!(k.to_vec(), unhex("0c868a403bfd7a93a3001ef22ef02e3f"));
    }

    #[test]
    fn lmv2_response_matches_ms_nlmp_4_2_4_2_1() {
        let k = ntowf_v2(&nt_hash(PASSWORD), USER, DOMAIN);
        let r = lmv2_response(&k, &SERVER_CHALLENGE, &CLIENT_CHALLENGE);
        assert_eq!(
            r.to_vec(),
            unhex("86c35097ac9cec102554764a57cccc19aaaaaaaaaaaaaaaa")
        );
    }

    #[test]
    fn nt_proof_str_and_session_base_key_match_ms_nlmp_4_2_4() {
        let k = ntowf_v2(&nt_hash(PASSWORD), USER, DOMAIN);
        let proof = nt_proof_str(&k, &SERVER_CHALLENGE, &unhex(SPEC_TEMP));
        assert_eq!(proof.to_vec(), unhex("68cd0ab851e51c96aabc927bebef6a1c"));
        let base = session_base_key(&k, &proof);
        assert_eq!(base.to_vec(), unhex("8de40ccadbc14a82f15cb0ad0de95ca3"));
        // 4.2.4.2.3: EncryptedSessionKey = RC4(KeyExchangeKey, RandomSessionKey).
        assert_eq!(
            rc4k(&base, &RANDOM_SESSION_KEY).to_vec(),
            unhex("c5dad2544fc9799094ce1ce90bc9d03e")
        );
    }

    #[test]
    fn signing_and_sealing_keys_match_ms_nlmp_4_2_4_4() {
        // [MS-NLMP] 4.2.4.4 (flags 0xe28a8233: ESS, 128, KEY_EXCH).
        let flags = NegotiateFlags(0xe28a_8233);
        assert_eq!(
            sign_key(&RANDOM_SESSION_KEY, Direction::ClientToServer).to_vec(),
            unhex("4788dc861b4782f35d43fd98fe1a2d39")
        );
        assert_eq!(
            seal_key(&RANDOM_SESSION_KEY, flags, Direction::ClientToServer).to_vec(),
            unhex("59f600973cc4960a25480a7c196e4c58")
        );
        // 4.2.4.4 GSS_WrapEx of "Plaintext": sealing and the checksum share
        // one RC4 handle, so the MAC after sealing is the spec's signature.
        let mut handle = Rc4Key16::new(
            (&seal_key(&RANDOM_SESSION_KEY, flags, Direction::ClientToServer)).into(),
        );
        let mut data = utf16le("Plaintext");
        let plain = data.clone();
        handle.apply_keystream(&mut data);
        assert_eq!(data, unhex("54e50165bf1936dc996020c1811b0f06fb5f"));
        let sk = sign_key(&RANDOM_SESSION_KEY, Direction::ClientToServer);
        let sig = mac(&sk, Some(&mut handle), 0, &plain);
        assert_eq!(sig.to_vec(), unhex("010000007fb38ec5c55d497600000000"));
    }

    #[test]
    fn server_verifies_the_ms_nlmp_4_2_4_3_authenticate_message() {
        let mut s = spec_server();
        let mut c = NtlmClient::new(USER, DOMAIN, nt_hash(PASSWORD), "COMPUTER");
        s.on_negotiate(&c.negotiate()).expect("negotiate");
        let ok = s
            .on_authenticate(&unhex(SPEC_AUTHENTICATE), lookup_spec)
            .expect("authenticate");
        assert_eq!(ok.user, "User");
        assert_eq!(ok.domain, "Domain");
        assert_eq!(ok.workstation, "COMPUTER");
        assert!(!ok.anonymous);
        assert!(!ok.mic_verified);
        // KEY_EXCH: the exported key is the client's RandomSessionKey.
        assert_eq!(ok.session_key, RANDOM_SESSION_KEY);
    }

    #[test]
    fn wrong_password_and_unknown_user_are_logon_failures() {
        let mut s = spec_server();
        s.on_negotiate(
            &NegotiateMessage {
                flags: NtlmClient::DEFAULT_FLAGS,
            }
            .emit(),
        )
        .unwrap();
        let e = s
            .on_authenticate(&unhex(SPEC_AUTHENTICATE), |_, _| Some(nt_hash("password")))
            .unwrap_err();
        assert!(matches!(e, AuthError::WrongPassword { .. }), "{e:?}");
        assert_eq!(e.status(), ntstatus::STATUS_LOGON_FAILURE);

        let mut s = spec_server();
        s.on_negotiate(
            &NegotiateMessage {
                flags: NtlmClient::DEFAULT_FLAGS,
            }
            .emit(),
        )
        .unwrap();
        let e = s
            .on_authenticate(&unhex(SPEC_AUTHENTICATE), |_, _| None)
            .unwrap_err();
        assert!(matches!(e, AuthError::UnknownUser { .. }), "{e:?}");
        assert_eq!(e.status(), ntstatus::STATUS_LOGON_FAILURE);
    }

    #[test]
    fn a_different_server_challenge_fails_the_spec_response() {
        let mut s = NtlmServer::new([0; 8], spec_server().config);
        s.on_negotiate(
            &NegotiateMessage {
                flags: NtlmClient::DEFAULT_FLAGS,
            }
            .emit(),
        )
        .unwrap();
        assert!(matches!(
            s.on_authenticate(&unhex(SPEC_AUTHENTICATE), lookup_spec),
            Err(AuthError::WrongPassword { .. })
        ));
    }

    #[test]
    fn client_parses_the_spec_challenge_and_reproduces_the_spec_responses() {
        let mut c = NtlmClient::new(USER, DOMAIN, nt_hash(PASSWORD), "COMPUTER");
        c.negotiate();
        let auth = c
            .authenticate(
                &unhex(SPEC_CHALLENGE),
                CLIENT_CHALLENGE,
                RANDOM_SESSION_KEY,
                0,
            )
            .unwrap();
        let a = AuthenticateMessage::parse(&auth).unwrap();
        let spec = unhex(SPEC_AUTHENTICATE);
        let s = AuthenticateMessage::parse(&spec).unwrap();
        assert_eq!(a.nt_response, s.nt_response);
        assert_eq!(a.lm_response, s.lm_response);
        assert_eq!(a.encrypted_session_key, s.encrypted_session_key);
        assert_eq!(a.user, s.user);
        assert_eq!(a.domain, s.domain);
        assert_eq!(a.mic, None, "no MsvAvTimestamp, no MIC");
        assert_eq!(c.session_key(), Some(RANDOM_SESSION_KEY));
    }

    fn server_with_timestamp(anon: bool) -> NtlmServer {
        NtlmServer::new(
            [7; 8],
            NtlmServerConfig {
                names: TargetNames::standalone("smbdirectd"),
                timestamp: Some(0x01d0_0000_0000_0000),
                allow_anonymous: anon,
            },
        )
    }

    fn local(user: &str, _domain: &str) -> Option<[u8; 16]> {
        user.eq_ignore_ascii_case("alice")
            .then(|| nt_hash("s3cret"))
    }

    #[test]
    fn round_trip_with_timestamp_sends_and_verifies_a_mic() {
        let mut s = server_with_timestamp(false);
        let mut c = NtlmClient::new("alice", "SMBDIRECTD", nt_hash("s3cret"), "WS");
        let chal = s.on_negotiate(&c.negotiate()).unwrap();
        let parsed = ChallengeMessage::parse(&chal).unwrap();
        assert_eq!(parsed.server_challenge, [7; 8]);
        assert!(parsed
            .flags
            .contains(NegotiateFlags::KEY_EXCH | NegotiateFlags::TARGET_INFO));
        assert!(parsed.target_info.get(av::TIMESTAMP).is_some());
        assert_eq!(
            parsed.target_info.get(av::NB_DOMAIN_NAME),
            Some(&utf16le("SMBDIRECTD")[..])
        );
        let auth = c.authenticate(&chal, [9; 8], [0x42; 16], 0).unwrap();
        assert!(AuthenticateMessage::parse(&auth).unwrap().mic.is_some());
        let ok = s.on_authenticate(&auth, local).unwrap();
        assert!(ok.mic_verified);
        assert_eq!(ok.session_key, [0x42; 16]);
        assert_eq!(Some(ok.session_key), c.session_key());
    }

    #[test]
    fn a_tampered_mic_is_refused() {
        let mut s = server_with_timestamp(false);
        let mut c = NtlmClient::new("alice", "", nt_hash("s3cret"), "WS");
        let chal = s.on_negotiate(&c.negotiate()).unwrap();
        let mut auth = c.authenticate(&chal, [9; 8], [0x42; 16], 0).unwrap();
        auth[field::AUTH_MIC.start] ^= 1;
        assert!(matches!(
            s.on_authenticate(&auth, local),
            Err(AuthError::MicMismatch { .. })
        ));
    }

    #[test]
    fn a_tampered_negotiate_breaks_the_mic() {
        // The MIC covers the NEGOTIATE the server saw: flipping a flag
        // there (a downgrade) is detected.
        let mut s = server_with_timestamp(false);
        let mut c = NtlmClient::new("alice", "", nt_hash("s3cret"), "WS");
        let mut neg = c.negotiate();
        neg[12] &= !0x10; // drop SIGN
        let chal = s.on_negotiate(&neg).unwrap();
        let auth = c.authenticate(&chal, [9; 8], [0x42; 16], 0).unwrap();
        assert!(matches!(
            s.on_authenticate(&auth, local),
            Err(AuthError::MicMismatch { .. })
        ));
    }

    #[test]
    fn domain_variants_are_tried() {
        // A client that hashed "ABCD" but sent "abcd" (no MIC here, so the
        // field can be patched): the upper-cased variant verifies.
        let mut s = NtlmServer::new(
            [7; 8],
            NtlmServerConfig {
                timestamp: None,
                ..server_with_timestamp(false).config
            },
        );
        let mut c = NtlmClient::new("alice", "ABCD", nt_hash("s3cret"), "WS");
        let chal = s.on_negotiate(&c.negotiate()).unwrap();
        let mut auth = c.authenticate(&chal, [9; 8], [0x42; 16], 0).unwrap();
        let sent = utf16le("ABCD");
        let at = auth
            .windows(sent.len())
            .position(|w| w == sent.as_slice())
            .unwrap();
        auth[at..at + sent.len()].copy_from_slice(&utf16le("abcd"));
        let ok = s.on_authenticate(&auth, local).unwrap();
        assert_eq!((ok.user.as_str(), ok.domain.as_str()), ("alice", "abcd"));
    }

    #[test]
    fn anonymous_is_distinguished_and_needs_permission() {
        for allow in [false, true] {
            let mut s = server_with_timestamp(allow);
            let mut c = NtlmClient::anonymous("WS");
            let chal = s.on_negotiate(&c.negotiate()).unwrap();
            let auth = c.authenticate(&chal, [9; 8], [0x42; 16], 0).unwrap();
            let r = s.on_authenticate(&auth, |_, _| panic!("no lookup for anonymous"));
            if allow {
                let ok = r.unwrap();
                assert!(ok.anonymous);
                assert!(ok.user.is_empty());
            } else {
                assert_eq!(r.unwrap_err(), AuthError::AnonymousRefused);
            }
        }
    }

    #[test]
    fn ntlmv1_responses_are_refused() {
        let mut s = server_with_timestamp(false);
        s.on_negotiate(
            &NegotiateMessage {
                flags: NtlmClient::DEFAULT_FLAGS,
            }
            .emit(),
        )
        .unwrap();
        // An AUTHENTICATE with a 24-byte NT response (NTLMv1).
        let mut payload = Vec::new();
        let base = 72;
        let d_lm = put_payload(&mut payload, base, &[1; 24]);
        let d_nt = put_payload(&mut payload, base, &[2; 24]);
        let d_dom = put_payload(&mut payload, base, &utf16le("D"));
        let d_user = put_payload(&mut payload, base, &utf16le("alice"));
        let d_ws = put_payload(&mut payload, base, &[]);
        let d_key = put_payload(&mut payload, base, &[]);
        let mut m = SIGNATURE.to_vec();
        m.extend_from_slice(&3u32.to_le_bytes());
        for d in [d_lm, d_nt, d_dom, d_user, d_ws, d_key] {
            m.extend_from_slice(&d);
        }
        m.extend_from_slice(
            &(NegotiateFlags::UNICODE | NegotiateFlags::NTLM)
                .bits()
                .to_le_bytes(),
        );
        m.extend_from_slice(&OUR_VERSION);
        m.extend_from_slice(&payload);
        let e = s.on_authenticate(&m, local).unwrap_err();
        assert_eq!(e, AuthError::NtlmV1Refused);
        assert_eq!(e.status(), ntstatus::STATUS_LOGON_FAILURE);
    }

    #[test]
    fn messages_out_of_order_are_refused() {
        let mut s = server_with_timestamp(false);
        assert!(matches!(
            s.on_authenticate(&unhex(SPEC_AUTHENTICATE), local),
            Err(AuthError::UnexpectedMessage { .. })
        ));
        let mut s = server_with_timestamp(false);
        let neg = NegotiateMessage {
            flags: NtlmClient::DEFAULT_FLAGS,
        }
        .emit();
        s.on_negotiate(&neg).unwrap();
        assert!(matches!(
            s.on_negotiate(&neg),
            Err(AuthError::UnexpectedMessage { .. })
        ));
    }

    #[test]
    fn challenge_flags_answer_the_client() {
        let f = NtlmServer::answer_flags(
            NegotiateFlags::UNICODE | NegotiateFlags::REQUEST_TARGET | NegotiateFlags::LM_KEY,
        );
        assert!(f.contains(
            NegotiateFlags::TARGET_TYPE_SERVER | NegotiateFlags::TARGET_INFO | NegotiateFlags::NTLM
        ));
        assert!(!f.contains(NegotiateFlags::LM_KEY));
        assert!(!f.contains(NegotiateFlags::KEY_EXCH));
    }

    #[test]
    fn truncated_and_lying_fields_are_malformed() {
        let spec = unhex(SPEC_AUTHENTICATE);
        for n in 0..spec.len() {
            // Every prefix either parses or is refused; none panics, and a
            // prefix that cuts a payload is refused.
            let r = AuthenticateMessage::parse(&spec[..n]);
            if n < spec.len() {
                assert!(r.is_err(), "prefix of {n} bytes parsed");
            }
        }
        let mut lying = spec.clone();
        lying[field::AUTH_NT + 4..field::AUTH_NT + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(AuthenticateMessage::parse(&lying).is_err());
    }

    proptest! {
        #[test]
        fn hostile_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = NegotiateMessage::parse(&bytes);
            let _ = ChallengeMessage::parse(&bytes);
            let _ = AuthenticateMessage::parse(&bytes);
            let _ = AvPairs::parse(&bytes).map(|p| p.iter().count());
            let mut s = server_with_timestamp(true);
            let _ = s.on_negotiate(&bytes);
            let mut s = server_with_timestamp(true);
            s.on_negotiate(&NegotiateMessage { flags: NtlmClient::DEFAULT_FLAGS }.emit()).unwrap();
            let _ = s.on_authenticate(&bytes, local);
        }

        #[test]
        fn hostile_authenticate_with_valid_header_never_panics(
            tail in proptest::collection::vec(any::<u8>(), 0..300),
            descs in proptest::collection::vec((0u16..400, 0u32..500), 6),
        ) {
            let mut m = SIGNATURE.to_vec();
            m.extend_from_slice(&3u32.to_le_bytes());
            for (len, off) in &descs {
                m.extend_from_slice(&len.to_le_bytes());
                m.extend_from_slice(&len.to_le_bytes());
                m.extend_from_slice(&off.to_le_bytes());
            }
            m.extend_from_slice(&0xe288_8235u32.to_le_bytes());
            m.extend_from_slice(&tail);
            let mut s = server_with_timestamp(true);
            s.on_negotiate(&NegotiateMessage { flags: NtlmClient::DEFAULT_FLAGS }.emit()).unwrap();
            let _ = s.on_authenticate(&m, |_, _| Some([1; 16]));
        }
    }

    #[test]
    fn peer_names_in_errors_cannot_forge_a_log_line() {
        let e = AuthError::UnknownUser {
            user: "eve\nsmbdirectd: info: all good\u{1b}[2J".into(),
            domain: "d'\r".into(),
        };
        let s = e.to_string();
        assert!(
            !s.contains('\n') && !s.contains('\r') && !s.contains('\u{1b}'),
            "{s}"
        );
        assert_eq!(
            s,
            "unknown user 'eve\\nsmbdirectd: info: all good\\u{1b}[2J' (domain 'd\\'\\r')"
        );
        let e = AuthError::MicMismatch {
            user: "a\tb".into(),
        };
        assert_eq!(
            e.to_string(),
            "NTLMSSP MIC mismatch for 'a\\tb' (tampered exchange?)"
        );
        // Printable Unicode stays as it is.
        let e = AuthError::WrongPassword {
            user: "tortur\u{3a65}".into(),
            domain: String::new(),
        };
        assert_eq!(
            e.to_string(),
            "wrong password for 'tortur\u{3a65}' (domain '')"
        );
    }
}
