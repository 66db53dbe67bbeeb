//! SMB2 session authentication and message integrity, sans-IO: SPNEGO and
//! NTLMSSP (NTLMv2) for SESSION_SETUP, the SMB 3.x key derivation, the
//! 3.1.1 preauthentication integrity hash, and message signing.
//!
//! # What the SMB2 server calls, step by step
//!
//! 1. NEGOTIATE: the response's security buffer is
//!    [`Acceptor::negotiate_token`] (a NegTokenInit2 offering NTLMSSP). For
//!    3.1.1, feed the request and then the response, as sent, to the
//!    connection's [`PreauthHash`] ([MS-SMB2] 3.3.5.4).
//! 2. First SESSION_SETUP (SessionId 0): allocate the session, give it
//!    `Acceptor::new(challenge, config)` with 8 fresh random bytes and an
//!    [`NtlmServerConfig`] (names, current FILETIME, anonymous policy); for
//!    3.1.1 start the session's hash as a clone of the connection's and
//!    `update` it with the request. Then `acceptor.step(security_buffer,
//!    lookup)`: [`Step::Continue`] means STATUS_MORE_PROCESSING_REQUIRED
//!    with that buffer (hash the response too, for 3.1.1).
//! 3. Second SESSION_SETUP: hash the request (3.1.1), then `step` again:
//!    [`Step::Complete`] gives the response's buffer and an [`AuthOk`]
//!    whose `session_key` is Session.SessionKey. Derive the signing key
//!    with [`kdf::signing_key`]`(dialect, &session_key, Some(hash.value()))`
//!    (the hash after this request; 2.x and 3.0 ignore it) and sign the
//!    STATUS_SUCCESS response with [`signing::sign`] (3.x always signs it,
//!    [MS-SMB2] 3.3.5.5.3), using [`signing::algorithm_for`] the dialect and
//!    the SIGNING_CAPABILITIES choice. The final response is not hashed.
//!    An anonymous [`AuthOk`] gets SMB2_SESSION_FLAG_IS_NULL and no
//!    signing.
//! 4. Any `Err(AuthError)`: answer with [`AuthError::status`] and drop the
//!    session (its preauth hash too).
//! 5. Afterwards: when the session signs (the client required it, or the
//!    request was signed), [`signing::verify`] each request and
//!    [`signing::sign`] each response, one message of a compound at a time.

mod acceptor;
pub mod kdf;
pub mod ntlm;
pub mod preauth;
pub mod signing;
pub mod spnego;

pub use acceptor::{Acceptor, Step};
pub use ntlm::{AuthError, AuthOk, NtlmClient, NtlmServer, NtlmServerConfig, TargetNames};
pub use preauth::PreauthHash;
pub use spnego::Framing;
