//! SMB 3.x key derivation ([MS-SMB2] 3.1.4.2): the SP800-108 KDF in counter
//! mode with HMAC-SHA256, r = 32, and the labels and contexts of
//! [MS-SMB2] 3.3.5.5.3 (server side: the server's EncryptionKey encrypts
//! what it sends, ServerOut; its DecryptionKey what it receives, ServerIn).

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::smb2::Dialect;

/// [MS-SMB2] 3.1.4.2 / [SP800-108] 5.1: `KDF(Ki, Label, Context)` for an
/// output of `out.len()` bytes (16 or 32): PRF = HMAC-SHA256,
/// K(i) = PRF(Ki, [i]4 || Label || 0x00 || Context || [L]4), big-endian
/// counters, L in bits. `label` and `context` are passed with their
/// terminating NULs where [MS-SMB2] has them.
pub fn kdf(key: &[u8], label: &[u8], context: &[u8], out: &mut [u8]) {
    let l_bits = (out.len() as u32).saturating_mul(8);
    for (i, chunk) in out.chunks_mut(32).enumerate() {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        m.update(&(i as u32 + 1).to_be_bytes());
        m.update(label);
        m.update(&[0]);
        m.update(context);
        m.update(&l_bits.to_be_bytes());
        let k = m.finalize().into_bytes();
        chunk.copy_from_slice(&k[..chunk.len()]);
    }
}

/// A 128-bit `KDF(Ki, Label, Context)`.
pub fn kdf128(key: &[u8], label: &[u8], context: &[u8]) -> [u8; 16] {
    let mut out = [0u8; 16];
    kdf(key, label, context, &mut out);
    out
}

/// The keys of one SMB2 session on the server ([MS-SMB2] 3.3.5.5.3), all
/// 128-bit (AES-128 ciphers; AES-256 ones would derive 32 bytes with the
/// same labels).
#[derive(Clone, PartialEq, Eq)]
pub struct SessionKeys {
    /// Session.SigningKey (and the first Channel.SigningKey).
    pub signing: [u8; 16],
    /// Session.EncryptionKey: what the server encrypts with (server to client).
    pub encryption: [u8; 16],
    /// Session.DecryptionKey: what the server decrypts with (client to server).
    pub decryption: [u8; 16],
    /// Session.ApplicationKey.
    pub application: [u8; 16],
}

impl core::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("SessionKeys { <redacted> }")
    }
}

/// Why keys cannot be derived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KdfError {
    /// 3.1.1 derives from the session's PreauthIntegrityHashValue, and none
    /// was given.
    NoPreauthHash,
    /// 2.0.2 and 2.1 derive nothing: their signing key is the session key
    /// itself, with HMAC-SHA256 ([MS-SMB2] 3.1.4.1).
    NotSmb3(Dialect),
}

impl core::fmt::Display for KdfError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            KdfError::NoPreauthHash => write!(
                f,
                "SMB 3.1.1 key derivation needs the session's preauth integrity hash"
            ),
            KdfError::NotSmb3(d) => write!(
                f,
                "dialect {d:?} derives no keys (signing uses the session key)"
            ),
        }
    }
}

impl std::error::Error for KdfError {}

/// Derives a server session's keys from Session.SessionKey ([MS-SMB2]
/// 3.3.5.5.3): for 3.0 and 3.0.2 with the constant contexts, for 3.1.1 with
/// the session's PreauthIntegrityHashValue (after the last SESSION_SETUP
/// request, see [`preauth`](super::preauth)).
pub fn session_keys(
    dialect: Dialect,
    session_key: &[u8; 16],
    preauth_hash: Option<&[u8; 64]>,
) -> Result<SessionKeys, KdfError> {
    match dialect {
        Dialect::SMB_3_0 | Dialect::SMB_3_0_2 => Ok(SessionKeys {
            signing: kdf128(session_key, b"SMB2AESCMAC\0", b"SmbSign\0"),
            encryption: kdf128(session_key, b"SMB2AESCCM\0", b"ServerOut\0"),
            decryption: kdf128(session_key, b"SMB2AESCCM\0", b"ServerIn \0"),
            application: kdf128(session_key, b"SMB2APP\0", b"SmbRpc\0"),
        }),
        Dialect::SMB_3_1_1 => {
            let h = preauth_hash.ok_or(KdfError::NoPreauthHash)?;
            Ok(SessionKeys {
                signing: kdf128(session_key, b"SMBSigningKey\0", h),
                encryption: kdf128(session_key, b"SMBS2CCipherKey\0", h),
                decryption: kdf128(session_key, b"SMBC2SCipherKey\0", h),
                application: kdf128(session_key, b"SMBAppKey\0", h),
            })
        }
        d => Err(KdfError::NotSmb3(d)),
    }
}

/// The key a session signs with ([MS-SMB2] 3.3.5.5.3): derived for 3.x,
/// the session key itself for 2.x.
pub fn signing_key(
    dialect: Dialect,
    session_key: &[u8; 16],
    preauth_hash: Option<&[u8; 64]>,
) -> Result<[u8; 16], KdfError> {
    match session_keys(dialect, session_key, preauth_hash) {
        Ok(k) => Ok(k.signing),
        Err(KdfError::NotSmb3(_)) => Ok(*session_key),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::super::ntlm::tests::unhex;
    use super::*;

    fn k16(s: &str) -> [u8; 16] {
        unhex(s).try_into().unwrap()
    }

    // Microsoft Open Specifications blog, "SMB 2 and SMB 3 security in
    // Windows 10: the anatomy of signing and cryptographic keys", appendix
    // "Key derivation examples". Its Encryption/Decryption keys are the
    // client's; the server's are swapped.

    #[test]
    fn smb_3_0_keys_match_the_published_example() {
        let k = session_keys(
            Dialect::SMB_3_0,
            &k16("7CD451825D0450D235424E44BA6E78CC"),
            None,
        )
        .unwrap();
        assert_eq!(k.signing, k16("0B7E9C5CAC36C0F6EA9AB275298CEDCE"));
        assert_eq!(
            k.decryption,
            k16("FAD27796665B313EBB578F388632B4F7"),
            "client's EncryptionKey"
        );
        assert_eq!(
            k.encryption,
            k16("B0F0427F7CEB416D1D9DCC0CD4F99447"),
            "client's DecryptionKey"
        );
        assert_eq!(k.application, k16("BB23A4575AA26C721AF525AF15A87B4F"));
        // The second channel of the example (session binding).
        let k2 = session_keys(
            Dialect::SMB_3_0_2,
            &k16("4E01A2B313BCF660CC250BEF021AEDE6"),
            None,
        )
        .unwrap();
        assert_eq!(k2.signing, k16("BA1A17DBBFEC349BCA105563D598952F"));
    }

    #[test]
    fn smb_3_1_1_keys_match_the_published_example() {
        let h: [u8; 64] = unhex(
            "0DD13628CC3ED218EF9DF9772D436D0887AB9814BFAE63A80AA845F36909DB7928622DDDAD522D97\
             51640A459762C5A9D6BB084CBB3CE6BDADEF5D5BCE3C6C01",
        )
        .try_into()
        .unwrap();
        let k = session_keys(
            Dialect::SMB_3_1_1,
            &k16("270E1BA896585EEB7AF3472D3B4C75A7"),
            Some(&h),
        )
        .unwrap();
        assert_eq!(k.signing, k16("73FE7A9A77BEF0BDE49C650D8CCB5F76"));
        assert_eq!(
            k.decryption,
            k16("629BCBC54422A0F572B97F45989B6073"),
            "client's EncryptionKey"
        );
        assert_eq!(
            k.encryption,
            k16("E2AF0DCEFAC68DA71A0DFBD0D1350D74"),
            "client's DecryptionKey"
        );
        assert_eq!(k.application, k16("6D7AD7954E9EC61E907B4D473DC178FF"));
    }

    #[test]
    fn smb_3_1_1_needs_the_preauth_hash_and_2_x_uses_the_session_key() {
        let sk = [3u8; 16];
        assert_eq!(
            session_keys(Dialect::SMB_3_1_1, &sk, None),
            Err(KdfError::NoPreauthHash)
        );
        assert_eq!(signing_key(Dialect::SMB_2_1, &sk, None), Ok(sk));
        assert_eq!(
            signing_key(Dialect::SMB_3_0, &sk, None).unwrap(),
            kdf128(&sk, b"SMB2AESCMAC\0", b"SmbSign\0")
        );
    }

    #[test]
    fn a_256_bit_output_is_two_counter_blocks() {
        let mut out = [0u8; 32];
        kdf(&[1; 16], b"L\0", b"C\0", &mut out);
        let mut first = [0u8; 16];
        kdf(&[1; 16], b"L\0", b"C\0", &mut first);
        // L differs (256 vs 128 bits), so the outputs differ.
        assert_ne!(&out[..16], &first[..]);
    }
}
