//! The server's side of SESSION_SETUP authentication: SPNEGO ([RFC4178],
//! [MS-SPNG]) or raw NTLMSSP framing around one [`NtlmServer`]
//! ([MS-SMB2] 3.3.5.5.3 hands each security buffer to "the GSS
//! authentication protocol"; this is that protocol).
//!
//! The framing of the client's first token decides the framing of every
//! answer: Windows and smbclient wrap NTLMSSP in SPNEGO; Linux cifs.ko sends
//! bare NTLMSSP messages in SMB2 and parses the CHALLENGE bare.

use subtle::ConstantTimeEq;

use super::ntlm::{self, AuthError, AuthOk, Direction, NtlmServer, NtlmServerConfig};
use super::spnego::{self, Framing, NegState, NegToken, NegTokenResp, OID_NTLMSSP};

/// What to answer a SESSION_SETUP request with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// STATUS_MORE_PROCESSING_REQUIRED with this security buffer.
    Continue(Vec<u8>),
    /// STATUS_SUCCESS with this security buffer (empty for raw NTLMSSP).
    Complete {
        /// The response's security buffer.
        token: Vec<u8>,
        /// Who logged on, and Session.SessionKey.
        auth: AuthOk,
    },
}

#[derive(Debug)]
enum State {
    /// Nothing received yet.
    Start,
    /// SPNEGO chose NTLMSSP without an optimistic token: the next
    /// NegTokenResp carries the NEGOTIATE_MESSAGE.
    AwaitNegotiate {
        mech_types: Vec<u8>,
        first_choice: bool,
    },
    /// The CHALLENGE went out; the AUTHENTICATE_MESSAGE comes next.
    AwaitAuthenticate {
        mech_types: Option<Vec<u8>>,
        mic_required: bool,
    },
    /// Completed or failed.
    Done,
}

/// One SESSION_SETUP authentication exchange, sans-IO.
#[derive(Debug)]
pub struct Acceptor {
    ntlm: NtlmServer,
    framing: Option<Framing>,
    state: State,
}

impl Acceptor {
    /// An exchange whose CHALLENGE carries `challenge` (8 fresh random
    /// bytes) and is built from `config`.
    pub fn new(challenge: [u8; 8], config: NtlmServerConfig) -> Self {
        Acceptor {
            ntlm: NtlmServer::new(challenge, config),
            framing: None,
            state: State::Start,
        }
    }

    /// The security buffer of the NEGOTIATE response ([MS-SMB2] 3.3.5.4):
    /// a NegTokenInit2 that offers NTLMSSP.
    pub fn negotiate_token() -> Vec<u8> {
        spnego::neg_token_init2(&[OID_NTLMSSP])
    }

    /// How the client frames its tokens, once its first one arrived.
    pub fn framing(&self) -> Option<Framing> {
        self.framing
    }

    /// One SESSION_SETUP request's security buffer in; what to answer out.
    /// An error ends the exchange: answer with [`AuthError::status`] and
    /// forget the session.
    pub fn step<F>(&mut self, token: &[u8], lookup: F) -> Result<Step, AuthError>
    where
        F: Fn(&str, &str) -> Option<[u8; 16]>,
    {
        let framing = spnego::framing(token);
        if *self.framing.get_or_insert(framing) != framing {
            self.state = State::Done;
            return Err(AuthError::UnexpectedMessage {
                expected: "the framing of the first token",
                got: "a change of framing",
            });
        }
        let r = match framing {
            Framing::RawNtlmssp => self.step_raw(token, lookup),
            Framing::Spnego => self.step_spnego(token, lookup),
        };
        if r.is_err() {
            self.state = State::Done;
        }
        r
    }

    fn step_raw<F>(&mut self, token: &[u8], lookup: F) -> Result<Step, AuthError>
    where
        F: Fn(&str, &str) -> Option<[u8; 16]>,
    {
        match core::mem::replace(&mut self.state, State::Done) {
            State::Start => {
                let challenge = self.ntlm.on_negotiate(token)?;
                self.state = State::AwaitAuthenticate {
                    mech_types: None,
                    mic_required: false,
                };
                Ok(Step::Continue(challenge))
            }
            State::AwaitAuthenticate { .. } => {
                let auth = self.ntlm.on_authenticate(token, lookup)?;
                Ok(Step::Complete {
                    token: Vec::new(),
                    auth,
                })
            }
            _ => Err(AuthError::UnexpectedMessage {
                expected: "no more tokens",
                got: "NTLMSSP message",
            }),
        }
    }

    fn step_spnego<F>(&mut self, token: &[u8], lookup: F) -> Result<Step, AuthError>
    where
        F: Fn(&str, &str) -> Option<[u8; 16]>,
    {
        let neg = NegToken::parse(token)?;
        match (core::mem::replace(&mut self.state, State::Done), neg) {
            (State::Start, NegToken::Init(init)) => {
                let Some(pos) = init.mech_types.iter().position(|m| *m == OID_NTLMSSP) else {
                    return Err(AuthError::NoCommonMechanism);
                };
                let mech_types = init.mech_types_der.to_vec();
                match (pos, init.mech_token) {
                    // NTLMSSP preferred and started optimistically.
                    (0, Some(t)) => {
                        let challenge = self.ntlm.on_negotiate(t)?;
                        self.state = State::AwaitAuthenticate {
                            mech_types: Some(mech_types),
                            mic_required: false,
                        };
                        Ok(Step::Continue(accept_incomplete(
                            Some(OID_NTLMSSP),
                            Some(&challenge),
                        )))
                    }
                    // Another mechanism preferred (its optimistic token is
                    // dropped), or no token: select NTLMSSP and wait for its
                    // first token ([RFC4178] 3.2). Not the first choice makes
                    // the mechListMIC exchange mandatory ([RFC4178] 5).
                    _ => {
                        self.state = State::AwaitNegotiate {
                            mech_types,
                            first_choice: pos == 0,
                        };
                        Ok(Step::Continue(accept_incomplete(Some(OID_NTLMSSP), None)))
                    }
                }
            }
            (
                State::AwaitNegotiate {
                    mech_types,
                    first_choice,
                },
                NegToken::Resp(resp),
            ) => {
                let t = resp.response_token.ok_or(AuthError::UnexpectedMessage {
                    expected: "NegTokenResp with an NTLMSSP NEGOTIATE_MESSAGE",
                    got: "NegTokenResp without responseToken",
                })?;
                let challenge = self.ntlm.on_negotiate(t)?;
                self.state = State::AwaitAuthenticate {
                    mech_types: Some(mech_types),
                    mic_required: !first_choice,
                };
                Ok(Step::Continue(accept_incomplete(None, Some(&challenge))))
            }
            (
                State::AwaitAuthenticate {
                    mech_types,
                    mic_required,
                },
                NegToken::Resp(resp),
            ) => {
                let t = resp.response_token.ok_or(AuthError::UnexpectedMessage {
                    expected: "NegTokenResp with an NTLMSSP AUTHENTICATE_MESSAGE",
                    got: "NegTokenResp without responseToken",
                })?;
                let auth = self.ntlm.on_authenticate(t, lookup)?;
                let mech_types = mech_types.unwrap_or_default();
                let our_mic =
                    self.mech_list_mic(&auth, &mech_types, resp.mech_list_mic, mic_required)?;
                let token = NegTokenResp {
                    neg_state: Some(NegState::AcceptCompleted),
                    supported_mech: None,
                    response_token: None,
                    mech_list_mic: our_mic.as_ref().map(|m| &m[..]),
                }
                .emit();
                Ok(Step::Complete { token, auth })
            }
            (_, NegToken::Init(_)) => Err(AuthError::UnexpectedMessage {
                expected: "NegTokenResp",
                got: "a second NegTokenInit",
            }),
            (_, NegToken::Resp(_)) => Err(AuthError::UnexpectedMessage {
                expected: "NegTokenInit",
                got: "NegTokenResp",
            }),
        }
    }

    /// [RFC4178] 5 / [MS-SPNG] 3.3.5.1: verify the client's mechListMIC over
    /// its mechTypes when it sent one (or must have), and answer with ours.
    /// An anonymous logon has no key and exchanges no MIC.
    fn mech_list_mic(
        &self,
        auth: &AuthOk,
        mech_types: &[u8],
        client_mic: Option<&[u8]>,
        required: bool,
    ) -> Result<Option<[u8; 16]>, AuthError> {
        if auth.anonymous {
            return Ok(None);
        }
        let Some(sent) = client_mic else {
            return if required {
                Err(AuthError::MechListMicMismatch)
            } else {
                Ok(None)
            };
        };
        let want = ntlm::first_mic(
            &auth.session_key,
            auth.flags,
            Direction::ClientToServer,
            mech_types,
        )
        .ok_or(AuthError::MechListMicMismatch)?;
        if sent.len() != 16 || !bool::from(want.ct_eq(sent)) {
            return Err(AuthError::MechListMicMismatch);
        }
        Ok(ntlm::first_mic(
            &auth.session_key,
            auth.flags,
            Direction::ServerToClient,
            mech_types,
        ))
    }
}

fn accept_incomplete(mech: Option<&[u8]>, token: Option<&[u8]>) -> Vec<u8> {
    NegTokenResp {
        neg_state: Some(NegState::AcceptIncomplete),
        supported_mech: mech,
        response_token: token,
        mech_list_mic: None,
    }
    .emit()
}

#[cfg(test)]
mod tests {
    use super::super::ntlm::tests::unhex;
    use super::super::ntlm::{nt_hash, NegotiateFlags, NtlmClient, TargetNames};
    use super::super::spnego::{neg_token_init, OID_KRB5};
    use super::*;
    use proptest::prelude::*;

    fn config() -> NtlmServerConfig {
        NtlmServerConfig {
            names: TargetNames::standalone("smbdirectd"),
            timestamp: Some(0x01da_0000_0000_0000),
            allow_anonymous: false,
        }
    }

    fn users(user: &str, _domain: &str) -> Option<[u8; 16]> {
        user.eq_ignore_ascii_case("bob").then(|| nt_hash("hunter2"))
    }

    fn resp(b: &[u8]) -> NegTokenResp<'_> {
        match NegToken::parse(b).unwrap() {
            NegToken::Resp(r) => r,
            other => panic!("not a NegTokenResp: {other:?}"),
        }
    }

    #[test]
    fn raw_ntlmssp_is_answered_raw_like_cifs_expects() {
        let mut a = Acceptor::new([1; 8], config());
        let mut c = NtlmClient::new("bob", "SMBDIRECTD", nt_hash("hunter2"), "linux");
        let Step::Continue(chal) = a.step(&c.negotiate(), users).unwrap() else {
            panic!()
        };
        assert!(chal.starts_with(b"NTLMSSP\0"));
        assert_eq!(a.framing(), Some(Framing::RawNtlmssp));
        let auth = c.authenticate(&chal, [2; 8], [3; 16], 0).unwrap();
        let Step::Complete { token, auth } = a.step(&auth, users).unwrap() else {
            panic!()
        };
        assert!(token.is_empty());
        assert_eq!(auth.user, "bob");
        assert_eq!(auth.session_key, [3; 16]);
        // The exchange is over.
        assert!(a.step(&c.negotiate(), users).is_err());
    }

    #[test]
    fn spnego_round_trip_exchanges_mech_list_mics() {
        let mut a = Acceptor::new([1; 8], config());
        let mut c = NtlmClient::new("bob", "", nt_hash("hunter2"), "win");
        let init = neg_token_init(&[OID_NTLMSSP], Some(&c.negotiate()));
        let Step::Continue(t) = a.step(&init, users).unwrap() else {
            panic!()
        };
        let r = resp(&t);
        assert_eq!(r.neg_state, Some(NegState::AcceptIncomplete));
        assert_eq!(r.supported_mech, Some(OID_NTLMSSP));
        let chal = r.response_token.unwrap().to_vec();
        let auth = c.authenticate(&chal, [2; 8], [3; 16], 0).unwrap();
        let flags = c.negotiated_flags();
        let mech_types = spnego::mech_type_list(&[OID_NTLMSSP]);
        let client_mic =
            ntlm::first_mic(&[3; 16], flags, Direction::ClientToServer, &mech_types).unwrap();
        let t = NegTokenResp {
            response_token: Some(&auth),
            mech_list_mic: Some(&client_mic),
            ..Default::default()
        }
        .emit();
        let Step::Complete { token, auth } = a.step(&t, users).unwrap() else {
            panic!()
        };
        assert!(auth.mic_verified);
        let r = resp(&token);
        assert_eq!(r.neg_state, Some(NegState::AcceptCompleted));
        let server_mic =
            ntlm::first_mic(&[3; 16], flags, Direction::ServerToClient, &mech_types).unwrap();
        assert_eq!(r.mech_list_mic, Some(&server_mic[..]));
    }

    #[test]
    fn a_wrong_mech_list_mic_is_refused() {
        let mut a = Acceptor::new([1; 8], config());
        let mut c = NtlmClient::new("bob", "", nt_hash("hunter2"), "win");
        let Step::Continue(t) = a
            .step(&neg_token_init(&[OID_NTLMSSP], Some(&c.negotiate())), users)
            .unwrap()
        else {
            panic!()
        };
        let auth = c
            .authenticate(resp(&t).response_token.unwrap(), [2; 8], [3; 16], 0)
            .unwrap();
        let t = NegTokenResp {
            response_token: Some(&auth),
            mech_list_mic: Some(&[0; 16]),
            ..Default::default()
        }
        .emit();
        assert_eq!(a.step(&t, users), Err(AuthError::MechListMicMismatch));
    }

    #[test]
    fn the_published_windows_mech_list_mics_verify() {
        // Microsoft's SMB 3.1.1 example: ExportedSessionKey 270E1BA8...75A7,
        // AUTHENTICATE flags 0xE2888215, mechTypes {NTLMSSP}: the client's
        // mechListMIC (second SESSION_SETUP request) and the server's
        // (final response).
        let key: [u8; 16] = unhex("270E1BA896585EEB7AF3472D3B4C75A7")
            .try_into()
            .unwrap();
        let flags = NegotiateFlags(0xE288_8215);
        let mech_types = unhex("300C060A2B06010401823702020A");
        assert_eq!(
            ntlm::first_mic(&key, flags, Direction::ClientToServer, &mech_types)
                .unwrap()
                .to_vec(),
            unhex("0100000063775A9A5FD97F0600000000")
        );
        assert_eq!(
            ntlm::first_mic(&key, flags, Direction::ServerToClient, &mech_types)
                .unwrap()
                .to_vec(),
            unhex("010000003B453CDC3524164200000000")
        );
    }

    #[test]
    fn kerberos_first_selects_ntlmssp_and_then_requires_the_mic() {
        for send_mic in [false, true] {
            let mut a = Acceptor::new([1; 8], config());
            let mut c = NtlmClient::new("bob", "", nt_hash("hunter2"), "linux");
            let init = neg_token_init(&[OID_KRB5, OID_NTLMSSP], Some(b"\x60\x03krb"));
            let Step::Continue(t) = a.step(&init, users).unwrap() else {
                panic!()
            };
            let r = resp(&t);
            assert_eq!(r.supported_mech, Some(OID_NTLMSSP));
            assert_eq!(r.response_token, None);
            let neg = c.negotiate();
            let t = NegTokenResp {
                response_token: Some(&neg),
                ..Default::default()
            }
            .emit();
            let Step::Continue(t) = a.step(&t, users).unwrap() else {
                panic!()
            };
            let auth = c
                .authenticate(resp(&t).response_token.unwrap(), [2; 8], [3; 16], 0)
                .unwrap();
            let mech_types = spnego::mech_type_list(&[OID_KRB5, OID_NTLMSSP]);
            let mic = ntlm::first_mic(
                &[3; 16],
                c.negotiated_flags(),
                Direction::ClientToServer,
                &mech_types,
            )
            .unwrap();
            let t = NegTokenResp {
                response_token: Some(&auth),
                mech_list_mic: send_mic.then_some(&mic[..]),
                ..Default::default()
            }
            .emit();
            let r = a.step(&t, users);
            if send_mic {
                assert!(matches!(r, Ok(Step::Complete { .. })), "{r:?}");
            } else {
                assert_eq!(r, Err(AuthError::MechListMicMismatch));
            }
        }
    }

    #[test]
    fn no_ntlmssp_in_mech_types_is_not_supported() {
        let mut a = Acceptor::new([1; 8], config());
        let e = a
            .step(&neg_token_init(&[OID_KRB5], None), users)
            .unwrap_err();
        assert_eq!(e, AuthError::NoCommonMechanism);
        assert_eq!(e.status(), crate::ntstatus::STATUS_NOT_SUPPORTED);
    }

    #[test]
    fn switching_framing_mid_exchange_is_refused() {
        let mut a = Acceptor::new([1; 8], config());
        let mut c = NtlmClient::new("bob", "", nt_hash("hunter2"), "x");
        a.step(&neg_token_init(&[OID_NTLMSSP], Some(&c.negotiate())), users)
            .unwrap();
        assert!(matches!(
            a.step(&c.negotiate(), users),
            Err(AuthError::UnexpectedMessage { .. })
        ));
    }

    #[test]
    fn the_negotiate_token_offers_ntlmssp() {
        let tok = Acceptor::negotiate_token();
        let NegToken::Init(init) = NegToken::parse(&tok).unwrap() else {
            panic!()
        };
        assert_eq!(init.mech_types, vec![OID_NTLMSSP]);
    }

    #[test]
    fn the_windows_first_session_setup_token_gets_a_challenge() {
        let b = unhex(super::super::spnego::tests::WIN_SESSION_SETUP_1);
        let mut a = Acceptor::new([1; 8], config());
        let Step::Continue(t) = a.step(&b, users).unwrap() else {
            panic!()
        };
        let chal = resp(&t).response_token.unwrap().to_vec();
        let c = ntlm::ChallengeMessage::parse(&chal).unwrap();
        assert_eq!(c.server_challenge, [1; 8]);
        // Windows asked for KEY_EXCH, SIGN, SEAL, 128, 56 (0xE2088297).
        assert!(c.flags.contains(
            NegotiateFlags::KEY_EXCH | NegotiateFlags::SIGN | NegotiateFlags::NEGOTIATE_128
        ));
    }

    proptest! {
        #[test]
        fn hostile_tokens_never_panic(
            first in proptest::collection::vec(any::<u8>(), 0..200),
            second in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let mut a = Acceptor::new([1; 8], config());
            let _ = a.step(&first, users);
            let _ = a.step(&second, users);
            // And after a valid first step.
            let mut a = Acceptor::new([1; 8], config());
            let mut c = NtlmClient::new("bob", "", nt_hash("hunter2"), "x");
            a.step(&neg_token_init(&[OID_NTLMSSP], Some(&c.negotiate())), users).unwrap();
            let _ = a.step(&second, users);
        }
    }
}
