//! SMB2 message signing ([MS-SMB2] 3.1.4.1 signing, 3.1.5.1 verifying):
//! a 16-byte MAC over one whole message (header through the end of its
//! body, compound padding included) with the Signature field taken as zero.
//!
//! - AES-128-CMAC ([RFC4493]): 3.0, 3.0.2, and 3.1.1 unless the SMB2
//!   SIGNING_CAPABILITIES context chose another algorithm;
//! - AES-128-GMAC ([RFC4543]): 3.1.1 with AES-GMAC negotiated; the 12-byte
//!   nonce is MessageId (8 bytes, little-endian) followed by a 32-bit
//!   little-endian word whose bit 0 is set when the sender is the server
//!   and bit 1 when the message is an SMB2 CANCEL request;
//! - HMAC-SHA256 truncated to 16 bytes: 2.0.2 and 2.1.
//!
//! A compound chain is signed message by message: the caller passes each
//! message's slice (up to its NextCommand, or the end). Received messages
//! are verified in place, without copying: the MACs are fed the bytes
//! before the Signature field, sixteen zeros, and the bytes after it.

use aes::cipher::{BlockEncrypt, KeyInit};
use aes::Aes128;
use cmac::Cmac;
use ghash::universal_hash::UniversalHash;
use ghash::GHash;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::smb2::{Command, Dialect, HeaderFlags, SigningAlgorithm, HEADER_LEN};

/// Byte ranges of the SMB2 header fields signing reads ([MS-SMB2] 2.2.1).
mod field {
    use crate::smb2::Field;
    pub const COMMAND: Field = 12..14;
    pub const FLAGS: Field = 16..20;
    pub const MESSAGE_ID: Field = 24..32;
    pub const SIGNATURE: Field = 48..64;
}

/// Why a message cannot be signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignError {
    /// Shorter than an SMB2 header.
    TooShort {
        /// Its length.
        len: usize,
    },
    /// A SigningAlgorithmId [MS-SMB2] 2.2.3.1.7 does not define.
    UnknownAlgorithm(SigningAlgorithm),
}

impl core::fmt::Display for SignError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SignError::TooShort { len } => {
                write!(f, "message of {len} bytes is shorter than an SMB2 header")
            }
            SignError::UnknownAlgorithm(a) => write!(f, "unknown signing algorithm {a:?}"),
        }
    }
}

impl std::error::Error for SignError {}

/// The algorithm a connection signs with ([MS-SMB2] 3.1.4.1): HMAC-SHA256
/// for 2.x; for 3.1.1 the one SIGNING_CAPABILITIES negotiated, if any;
/// AES-CMAC otherwise.
pub fn algorithm_for(dialect: Dialect, negotiated: Option<SigningAlgorithm>) -> SigningAlgorithm {
    match (dialect, negotiated) {
        (Dialect::SMB_3_1_1, Some(a)) => a,
        (d, _) if d.is_smb3() => SigningAlgorithm::AES_CMAC,
        _ => SigningAlgorithm::HMAC_SHA256,
    }
}

fn u32_at(b: &[u8], f: crate::smb2::Field) -> u32 {
    b.get(f)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// The signature of `msg` under `key`, computed as if its Signature field
/// were zero (the field's current content is ignored).
pub fn signature(alg: SigningAlgorithm, key: &[u8; 16], msg: &[u8]) -> Result<[u8; 16], SignError> {
    if msg.len() < HEADER_LEN {
        return Err(SignError::TooShort { len: msg.len() });
    }
    let (head, rest) = msg.split_at(field::SIGNATURE.start);
    let tail = &rest[16..];
    let zeros = [0u8; 16];
    let mut out = [0u8; 16];
    match alg {
        SigningAlgorithm::AES_CMAC => {
            let mut m = <Cmac<Aes128> as Mac>::new_from_slice(key)
                .unwrap_or_else(|_| unreachable!("16-byte key"));
            m.update(head);
            m.update(&zeros);
            m.update(tail);
            out.copy_from_slice(&m.finalize().into_bytes());
        }
        SigningAlgorithm::HMAC_SHA256 => {
            let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key)
                .unwrap_or_else(|_| unreachable!("any key length"));
            m.update(head);
            m.update(&zeros);
            m.update(tail);
            out.copy_from_slice(&m.finalize().into_bytes()[..16]);
        }
        SigningAlgorithm::AES_GMAC => out = gmac(key, &gmac_nonce(msg), &[head, &zeros, tail]),
        a => return Err(SignError::UnknownAlgorithm(a)),
    }
    Ok(out)
}

/// [MS-SMB2] 3.1.4.1: the AES-GMAC nonce of a message.
fn gmac_nonce(msg: &[u8]) -> [u8; 12] {
    let mut nonce = [0u8; 12];
    nonce[..8].copy_from_slice(&msg[field::MESSAGE_ID]);
    let flags = HeaderFlags(u32_at(msg, field::FLAGS));
    let response = flags.contains(HeaderFlags::SERVER_TO_REDIR);
    let command = msg
        .get(field::COMMAND)
        .map_or(0, |c| u16::from_le_bytes([c[0], c[1]]));
    let mut word = 0u32;
    if response {
        word |= 1;
    }
    if !response && command == Command::Cancel.to_wire() {
        word |= 2;
    }
    nonce[8..].copy_from_slice(&word.to_le_bytes());
    nonce
}

/// AES-128-GMAC ([RFC4543]: GCM with the data as AAD and no plaintext) over
/// the concatenation of `parts`, 96-bit nonce ([NIST SP800-38D] 7.1):
/// T = E(K, J0) xor GHASH_H(A || 0-pad || [len(A)]64 || [0]64), with
/// H = E(K, 0^128) and J0 = nonce || 0^31 || 1. Only `parts[..n-1]` whose
/// lengths are multiples of 16 may precede the last (true for the SMB2
/// header split: 48 and 16 bytes).
fn gmac(key: &[u8; 16], nonce: &[u8; 12], parts: &[&[u8]]) -> [u8; 16] {
    let aes = Aes128::new(key.into());
    let mut h = [0u8; 16];
    aes.encrypt_block((&mut h).into());
    let mut ghash = GHash::new(&h.into());
    let mut len = 0u64;
    for p in parts {
        debug_assert!(core::ptr::eq(*p, *parts.last().unwrap_or(p)) || p.len() % 16 == 0);
        ghash.update_padded(p);
        len += p.len() as u64;
    }
    let mut lens = [0u8; 16];
    lens[..8].copy_from_slice(&(len * 8).to_be_bytes());
    ghash.update(&[lens.into()]);
    let s = ghash.finalize();
    let mut j0 = [0u8; 16];
    j0[..12].copy_from_slice(nonce);
    j0[15] = 1;
    aes.encrypt_block((&mut j0).into());
    let mut t = [0u8; 16];
    for i in 0..16 {
        t[i] = j0[i] ^ s[i];
    }
    t
}

/// Signs `msg` in place ([MS-SMB2] 3.1.4.1): sets SMB2_FLAGS_SIGNED, then
/// writes the signature computed with the Signature field zeroed.
pub fn sign(alg: SigningAlgorithm, key: &[u8; 16], msg: &mut [u8]) -> Result<(), SignError> {
    if msg.len() < HEADER_LEN {
        return Err(SignError::TooShort { len: msg.len() });
    }
    let flags = HeaderFlags(u32_at(msg, field::FLAGS)) | HeaderFlags::SIGNED;
    msg[field::FLAGS].copy_from_slice(&flags.bits().to_le_bytes());
    let sig = signature(alg, key, msg)?;
    msg[field::SIGNATURE].copy_from_slice(&sig);
    Ok(())
}

/// Verifies a received message ([MS-SMB2] 3.1.5.1) in constant time. False
/// for a message too short to carry a header, or an unknown algorithm.
pub fn verify(alg: SigningAlgorithm, key: &[u8; 16], msg: &[u8]) -> bool {
    match signature(alg, key, msg) {
        Ok(sig) => bool::from(sig.ct_eq(&msg[field::SIGNATURE])),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::super::kdf;
    use super::super::ntlm::tests::unhex;
    use super::super::preauth::tests::{AFTER_SESSION_SETUP_REQ_2, SESSION_SETUP_RSP_FINAL};
    use super::*;
    use aes_gcm::aead::AeadInPlace;
    use aes_gcm::Aes128Gcm;
    use proptest::prelude::*;

    #[test]
    fn cmac_matches_rfc_4493_examples() {
        // [RFC4493] 4: Examples 1-4.
        let key = unhex("2b7e151628aed2a6abf7158809cf4f3c");
        let msg = unhex(
            "6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51\
             30c81c46a35ce411e5fbc1191a0a52eff69f2445df4f9b17ad2b417be66c3710",
        );
        for (len, want) in [
            (0, "bb1d6929e95937287fa37d129b756746"),
            (16, "070a16b46b4d4144f79bdd9dd04a287c"),
            (40, "dfa66747de9ae63030ca32611497c827"),
            (64, "51f0bebf7e3b9d92fc49741779363cfe"),
        ] {
            let mut m = <Cmac<Aes128> as Mac>::new_from_slice(&key).unwrap();
            m.update(&msg[..len]);
            assert_eq!(
                m.finalize().into_bytes().to_vec(),
                unhex(want),
                "{len} bytes"
            );
        }
    }

    #[test]
    fn the_published_smb_3_1_1_final_session_setup_response_verifies() {
        // Microsoft's SMB 3.1.1 example: SigningKey derived from SessionKey
        // 270E1BA8...75A7 and the preauth hash after the last request; the
        // final SESSION_SETUP response is signed with AES-CMAC
        // (EBE146DA120BA25FC3376A49DFE31BC1).
        let h: [u8; 64] = unhex(AFTER_SESSION_SETUP_REQ_2).try_into().unwrap();
        let sk: [u8; 16] = unhex("270E1BA896585EEB7AF3472D3B4C75A7")
            .try_into()
            .unwrap();
        let key = kdf::signing_key(Dialect::SMB_3_1_1, &sk, Some(&h)).unwrap();
        let msg = unhex(SESSION_SETUP_RSP_FINAL);
        assert!(verify(SigningAlgorithm::AES_CMAC, &key, &msg));
        assert_eq!(
            signature(SigningAlgorithm::AES_CMAC, &key, &msg)
                .unwrap()
                .to_vec(),
            unhex("EBE146DA120BA25FC3376A49DFE31BC1")
        );
        // Re-signing from a zeroed field reproduces it.
        let mut again = msg.clone();
        again[48..64].fill(0);
        sign(SigningAlgorithm::AES_CMAC, &key, &mut again).unwrap();
        assert_eq!(again, msg);
    }

    fn message(len: usize, response: bool, command: Command, mid: u64) -> Vec<u8> {
        let mut m: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
        m[0..4].copy_from_slice(&[0xfe, b'S', b'M', b'B']);
        m[field::COMMAND].copy_from_slice(&command.to_wire().to_le_bytes());
        let flags = if response {
            HeaderFlags::SERVER_TO_REDIR
        } else {
            HeaderFlags::empty()
        };
        m[field::FLAGS].copy_from_slice(&flags.bits().to_le_bytes());
        m[field::MESSAGE_ID].copy_from_slice(&mid.to_le_bytes());
        m
    }

    #[test]
    fn streamed_gmac_equals_aes_gcm_with_the_message_as_aad() {
        let key = [0x11u8; 16];
        for len in [64, 65, 79, 80, 100, 1000] {
            for (response, command) in [
                (false, Command::Read),
                (true, Command::Read),
                (false, Command::Cancel),
            ] {
                let msg = message(len, response, command, 0x0102_0304_0506_0708);
                let got = signature(SigningAlgorithm::AES_GMAC, &key, &msg).unwrap();
                let mut zeroed = msg.clone();
                zeroed[48..64].fill(0);
                let nonce = gmac_nonce(&msg);
                let want = Aes128Gcm::new((&key).into())
                    .encrypt_in_place_detached((&nonce).into(), &zeroed, &mut [])
                    .unwrap();
                assert_eq!(got.to_vec(), want.to_vec(), "len {len}");
            }
        }
    }

    #[test]
    fn gmac_nonce_marks_server_and_cancel() {
        let req = message(64, false, Command::Read, 5);
        assert_eq!(gmac_nonce(&req), [5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let rsp = message(64, true, Command::Read, 5);
        assert_eq!(gmac_nonce(&rsp)[8..], [1, 0, 0, 0]);
        let cancel = message(64, false, Command::Cancel, 5);
        assert_eq!(gmac_nonce(&cancel)[8..], [2, 0, 0, 0]);
        // The same bytes signed as request and as response differ.
        let key = [9u8; 16];
        assert_ne!(
            signature(SigningAlgorithm::AES_GMAC, &key, &req).unwrap(),
            signature(SigningAlgorithm::AES_GMAC, &key, &rsp).unwrap()
        );
    }

    #[test]
    fn gmac_matches_the_nist_gcm_test_case_1_shape() {
        // [NIST GCM] test case 1: K = 0, IV = 0, no AAD, no plaintext.
        assert_eq!(
            gmac(&[0; 16], &[0; 12], &[]).to_vec(),
            unhex("58e2fccefa7e3061367f1d57a4e7455a")
        );
    }

    #[test]
    fn sign_sets_the_flag_and_every_algorithm_round_trips_and_detects_tampering() {
        let key = [0x2au8; 16];
        for alg in [
            SigningAlgorithm::AES_CMAC,
            SigningAlgorithm::AES_GMAC,
            SigningAlgorithm::HMAC_SHA256,
        ] {
            let mut m = message(200, true, Command::Write, 42);
            sign(alg, &key, &mut m).unwrap();
            assert!(HeaderFlags(u32_at(&m, field::FLAGS)).contains(HeaderFlags::SIGNED));
            assert!(verify(alg, &key, &m), "{alg:?}");
            assert!(!verify(alg, &[0x2b; 16], &m), "{alg:?} wrong key");
            for at in [0, 20, 48, 63, 64, 199] {
                let mut t = m.clone();
                t[at] ^= 0x80;
                assert!(!verify(alg, &key, &t), "{alg:?} tamper at {at}");
            }
        }
    }

    #[test]
    fn short_messages_and_unknown_algorithms_are_refused() {
        let mut short = [0u8; 63];
        assert_eq!(
            sign(SigningAlgorithm::AES_CMAC, &[0; 16], &mut short),
            Err(SignError::TooShort { len: 63 })
        );
        assert!(!verify(SigningAlgorithm::AES_CMAC, &[0; 16], &short));
        let mut m = message(64, false, Command::Read, 1);
        assert!(sign(SigningAlgorithm(7), &[0; 16], &mut m).is_err());
        assert!(!verify(SigningAlgorithm(7), &[0; 16], &m));
    }

    #[test]
    fn algorithm_follows_the_dialect() {
        assert_eq!(
            algorithm_for(Dialect::SMB_2_1, None),
            SigningAlgorithm::HMAC_SHA256
        );
        assert_eq!(
            algorithm_for(Dialect::SMB_3_0, Some(SigningAlgorithm::AES_GMAC)),
            SigningAlgorithm::AES_CMAC
        );
        assert_eq!(
            algorithm_for(Dialect::SMB_3_1_1, None),
            SigningAlgorithm::AES_CMAC
        );
        assert_eq!(
            algorithm_for(Dialect::SMB_3_1_1, Some(SigningAlgorithm::AES_GMAC)),
            SigningAlgorithm::AES_GMAC
        );
    }

    proptest! {
        #[test]
        fn verify_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200), alg in 0u16..4) {
            let _ = verify(SigningAlgorithm(alg), &[1; 16], &bytes);
        }
    }
}
