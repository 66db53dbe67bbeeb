//! Mutated SMB2 requests inside live sessions ([MS-SMB2] 3.3.5): the
//! other SMB2 cases each break one rule on purpose; this one breaks them at
//! random, after NEGOTIATE, SESSION_SETUP and TREE_CONNECT, against a real
//! open file and directory and buffers granted for RDMA, so the command
//! handlers behind the decoders (CREATE and its name, READ/WRITE offsets
//! and lengths, QUERY_INFO and SET_INFO classes and buffers, rename
//! targets, QUERY_DIRECTORY patterns, LOCK ranges, FSCTLs, compound chains,
//! RDMA channel descriptors) see what no well-behaved client sends. A
//! descriptor changed so that it names memory never granted makes the
//! server's RDMA fail at the provider, which ends that connection.
//!
//! A seeded generator takes a valid request of one of the templates below
//! (an inline WRITE above MaxSendSize among them, so SMB Direct fragments
//! it and the server reassembles it)
//! and changes one to three things in it: random bytes, a boundary integer
//! (0, 0x80.., 0xff..) at any offset, a truncation, a tail of random bytes,
//! or, in about one request in eight, a header field other than MessageId.
//!
//! `SMBDIRECTD_TORTURE_SEED` (decimal or 0x hex) replays or varies the
//! sequence, `SMBDIRECTD_TORTURE_MUTATIONS` sets how many requests (both
//! read by the tool, for longer campaigns; docs/reliability.md).
//!
//! What the server must do with each ([MS-SMB2] 3.3.5.2): answer it (any
//! status), or end the connection where 3.3.5.2 says to; only a CANCEL
//! goes unanswered (3.3.5.16), and anything else left without a response
//! for --timeout on an open connection fails the case. Whatever it did, the connection is then asked for
//! an ECHO: a connection still open must answer it. It must never crash or
//! stall, and a bystander session must keep working; the harness around
//! every case then checks the daemon's live connections (and the torture
//! test that every pool buffer comes back on shutdown and no panic was
//! printed).

use super::rig::{Grants, Healthy, Rig};
use super::smb2_peer::{create_request, message_bytes, Reply, Smb2Peer};
use super::{Case, Layer, Observation};
use smbdirect_dataplane::provider::{Access, Provider};
use smbdirect_protocol::ntstatus::{STATUS_MORE_PROCESSING_REQUIRED, STATUS_SUCCESS};
use smbdirect_protocol::smb2::auth::{self, spnego, NtlmClient};
use smbdirect_protocol::smb2::fscc::FileInfoClass;
use smbdirect_protocol::smb2::{
    Capabilities, Cipher, EncryptionCapabilities, Guid, HashAlgorithm, NegotiateContext,
    NegotiateContextList, NegotiateRequestRepr, PreauthIntegrityCapabilities,
    RdmaTransformCapabilities, ResponseBody, SecurityMode, SessionSetupFlags,
    SessionSetupRequestRepr, SigningAlgorithm, SigningCapabilities, U16Array,
};
use smbdirect_protocol::smb2::{
    ChangeNotifyFlags, ChangeNotifyRequestRepr, Channel, ChannelInfo, CloseFlags, CloseRequestRepr,
    Command, CompletionFilter, CompoundWriter, EchoRequestRepr, FileId, FlushRequestRepr,
    HeaderFlags, InfoType, IoctlRequestRepr, LockElement, LockElements, LockFlags, LockRequestRepr,
    QueryDirectoryFlags, QueryDirectoryRequestRepr, QueryInfoFlags, QueryInfoRequestRepr,
    ReadFlags, ReadRequestRepr, SetInfoRequestRepr, Utf16Str, WriteFlags, WriteRequestRepr,
    FSCTL_QUERY_NETWORK_INTERFACE_INFO, FSCTL_VALIDATE_NEGOTIATE_INFO, HEADER_LEN,
};
use smbdirect_protocol::smbd::wire::BufferDescriptorRepr;
use smbdirect_protocol::sqos::{
    Dialect as QosDialect, Guid as QosGuid, Options as QosOptions, StorageQosControlRequestRepr,
    Utf16Name, FSCTL_STORAGE_QOS_CONTROL,
};
use std::time::{Duration, Instant};

type Outcome = Result<Observation, String>;

/// Mutated requests per run (a few seconds on the soft provider).
const REQUESTS: usize = 1200;
/// Requests before a session is replaced by a fresh one (its open file
/// may have been renamed, truncated, locked or marked for deletion).
const PER_SESSION: usize = 150;
/// How long a CANCEL is given to show that it goes unanswered.
const QUIET: Duration = Duration::from_millis(300);
/// SMB2 CANCEL's command code ([MS-SMB2] 2.2.1.2).
const CANCEL: u16 = 0x000c;

pub(super) fn cases<P: Provider>() -> Vec<Case<P>> {
    vec![Case {
        name: "smb2-mutated-requests",
        layer: Layer::Smb2,
        rule: "[MS-SMB2] 3.3.5.2 (every request answered, or the connection ended), 3.3.5.16 (CANCEL unanswered)",
        expected: "each of 1,200 randomly mutated requests in live sessions is answered (a CANCEL never) or ends its connection; an open connection then answers ECHO; a bystander keeps working",
        run: mutated_requests::<P>,
    }, Case {
        name: "smb2-mutated-handshake",
        layer: Layer::Smb2,
        rule: "[MS-SMB2] 3.3.5.3, 3.3.5.4 (NEGOTIATE), 3.3.5.5 (SESSION_SETUP); [MS-SPNG]; [MS-NLMP] 3.2.5.1",
        expected: "each of 600 mutated NEGOTIATE, NTLMSSP NEGOTIATE and AUTHENTICATE requests (before any authentication) is answered or ends its connection; an open connection then answers ECHO; a bystander keeps working",
        run: mutated_handshake::<P>,
    }]
}

/// Handshake requests per run (each on a fresh connection).
const HANDSHAKES: usize = 600;
/// The account the handshake case logs on with. A server that knows it
/// (`printf '%s\n' torture-password | smbdirectd user add torture --users
/// FILE`, as tests/torture.rs does) verifies the NTLMv2 response of every
/// AUTHENTICATE whose mutation spared it, and goes on to the session key,
/// the MIC and the signing key with whatever the mutation left there; one
/// that does not stops at the user lookup, after parsing the message.
const USER: &str = "torture";
const PASSWORD: &str = "torture-password";

/// What no client has to authenticate for: NEGOTIATE, and both
/// SESSION_SETUP rounds of NTLMSSP (raw or inside SPNEGO), each mutated
/// as [`mutate`] does, on a fresh connection brought up to just before it.
/// The server's users file is irrelevant: an AUTHENTICATE is parsed whole
/// (names, NTLMv2 blob, AV pairs) before its user is looked up.
fn mutated_handshake<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let started = Instant::now();
    let (mut bystander, requests, mut seed) = campaign(rig, HANDSHAKES, 0x6a09_e667_f3bc_c908)?;
    let first_seed = seed;
    // Does this server run NTLMSSP (--users), or is every session
    // anonymous (then an AUTHENTICATE is never asked for)?
    let ntlm_server = {
        let mut peer = Smb2Peer::connect(rig)?;
        peer.negotiate()?;
        let t1 = NtlmClient::new(USER, "", auth::ntlm::nt_hash(PASSWORD), "TORTURE").negotiate();
        let r = peer.call(Command::SessionSetup, 1, &setup(&t1))?;
        peer.close();
        r.header.status == STATUS_MORE_PROCESSING_REQUIRED
    };
    let phases = if ntlm_server { 3 } else { 2 };
    let mut logons = 0usize;
    let mut tally = Tally::default();
    for trial in 0..requests {
        let phase = trial % phases;
        let spnego = next(&mut seed) % 2 == 0;
        let mut peer = Smb2Peer::connect(rig)?;
        let mut bytes = match phase {
            0 => negotiate_request(&mut peer, &mut seed)?,
            _ => {
                peer.negotiate()?;
                let mut ntlm = NtlmClient::new(USER, "", auth::ntlm::nt_hash(PASSWORD), "TORTURE");
                let t1 = ntlm.negotiate();
                let t1 = if spnego {
                    spnego::neg_token_init(&[spnego::OID_NTLMSSP], Some(&t1))
                } else {
                    t1
                };
                if phase == 1 {
                    peer.build(Command::SessionSetup, 1, &setup(&t1))?
                } else {
                    let r = peer.call(Command::SessionSetup, 1, &setup(&t1))?;
                    peer.session = r.header.session_id;
                    let challenge = match r.decoded() {
                        Some(ResponseBody::SessionSetup(b)) => b.security_buffer.to_vec(),
                        _ => Vec::new(),
                    };
                    // The CHALLENGE_MESSAGE, unwrapped from SPNEGO.
                    let challenge = match spnego::NegToken::parse(&challenge) {
                        Ok(spnego::NegToken::Resp(t)) => {
                            t.response_token.unwrap_or(&challenge).to_vec()
                        }
                        _ => challenge,
                    };
                    let t2 = ntlm
                        .authenticate(&challenge, [1; 8], [0x5a; 16], 0)
                        .map_err(|e| {
                            format!("building an AUTHENTICATE for the server's challenge ({} bytes, status {}): {e}", challenge.len(), r.header.status)
                        })?;
                    let t2 = if spnego {
                        spnego::NegTokenResp {
                            response_token: Some(&t2),
                            ..Default::default()
                        }
                        .emit()
                    } else {
                        t2
                    };
                    peer.build(Command::SessionSetup, 1, &setup(&t2))?
                }
            }
        };
        let what = mutate(&mut bytes, &mut seed);
        let fail = |e: String| {
            Ok(Observation::fail(format!(
                "handshake {trial} (seed {first_seed:#x}, phase {phase}, spnego {spnego}, {what}): {e}"
            )))
        };
        let command = bytes
            .get(12..14)
            .map_or(0, |c| u16::from_le_bytes([c[0], c[1]]));
        if peer.send(&bytes).is_err() {
            tally.disconnects += 1;
            peer.close();
            continue;
        }
        let wait = if command == CANCEL {
            QUIET
        } else {
            rig.timeout.max(QUIET)
        };
        match peer.recv(wait) {
            Reply::Response(r) => {
                tally.answered += 1;
                if r.header.status == STATUS_SUCCESS {
                    tally.succeeded += 1;
                    if phase == 2 {
                        logons += 1;
                    }
                }
            }
            Reply::Closed(_) => {
                tally.disconnects += 1;
                peer.close();
                continue;
            }
            Reply::Silent if command == CANCEL => tally.quiet += 1,
            Reply::Silent => {
                peer.close();
                return fail(format!(
                    "command {command:#x}: no response in {wait:?} and the connection still open"
                ));
            }
            Reply::Garbage(g) => {
                peer.close();
                return fail(format!("a message that is not an SMB2 response: {g}"));
            }
        }
        match echo_after(&mut peer, rig.timeout.max(Duration::from_secs(5))) {
            Ok(true) => {}
            Ok(false) => tally.disconnects += 1,
            Err(e) => {
                peer.close();
                return fail(e);
            }
        }
        peer.close();
        tally.sessions += 1;
        if trial % 64 == 63 {
            bystander.idle_step()?;
        }
    }
    let rtt = bystander.round_trip(rig.timeout)?;
    bystander.close();
    let auth = if ntlm_server {
        format!("NEGOTIATE, NTLMSSP NEGOTIATE and AUTHENTICATE of user {USER} in turn, raw or in SPNEGO; {logons} AUTHENTICATE(s) still logged on")
    } else {
        "NEGOTIATE and SESSION_SETUP in turn; the server has no --users, so no AUTHENTICATE was asked for".to_string()
    };
    Ok(Observation::pass(format!(
        "{requests} mutated handshake requests (seed {first_seed:#x}; {auth}): {}",
        tally.report(rtt, started)
    )))
}

fn setup(token: &[u8]) -> SessionSetupRequestRepr<'_> {
    SessionSetupRequestRepr {
        flags: SessionSetupFlags::empty(),
        security_mode: SecurityMode::SIGNING_ENABLED,
        capabilities: Capabilities::empty(),
        channel: 0,
        previous_session_id: 0,
        security_buffer: token,
    }
}

/// A NEGOTIATE offering 2.0.2 to 3.1.1 with every negotiate context the
/// server reads ([MS-SMB2] 2.2.3.1), some of them left out at random.
fn negotiate_request<P: Provider>(
    peer: &mut Smb2Peer<P>,
    seed: &mut u64,
) -> Result<Vec<u8>, String> {
    let dialects = [0x0202u16, 0x0210, 0x0300, 0x0302, 0x0311];
    let hashes = [HashAlgorithm::SHA_512.0];
    let salt = [0x3cu8; 32];
    let ciphers = [Cipher::AES_128_GCM.0, Cipher::AES_128_CCM.0];
    let signing = [SigningAlgorithm::AES_GMAC.0, SigningAlgorithm::AES_CMAC.0];
    let transforms = [0x0001u16];
    let netname: Vec<u8> = "127.0.0.1"
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .collect();
    let compression = [0u8, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0];
    let all = [
        NegotiateContext::PreauthIntegrity(PreauthIntegrityCapabilities {
            hash_algorithms: U16Array::new(&hashes),
            salt: &salt,
        }),
        NegotiateContext::Encryption(EncryptionCapabilities {
            ciphers: U16Array::new(&ciphers),
        }),
        NegotiateContext::Signing(SigningCapabilities {
            signing_algorithms: U16Array::new(&signing),
        }),
        NegotiateContext::RdmaTransform(RdmaTransformCapabilities {
            transform_ids: U16Array::new(&transforms),
        }),
        NegotiateContext::Other {
            context_type: 5,
            data: &netname,
        },
        NegotiateContext::Other {
            context_type: 3,
            data: &compression,
        },
    ];
    // PreauthIntegrity always (3.1.1 requires it), the rest at random.
    let keep = next(seed);
    let ctxs: Vec<NegotiateContext<'_>> = all
        .iter()
        .enumerate()
        .filter(|(i, _)| *i == 0 || keep >> i & 1 == 1)
        .map(|(_, c)| *c)
        .collect();
    let req = NegotiateRequestRepr {
        security_mode: SecurityMode::SIGNING_ENABLED,
        capabilities: Capabilities::LARGE_MTU,
        client_guid: Guid::from_bytes(*b"smbdirectd-fuzz!"),
        dialects: U16Array::new(&dialects),
        negotiate_contexts: NegotiateContextList::new(&ctxs),
    };
    peer.build(Command::Negotiate, 0, &req)
}

/// A session with something to work on.
struct Target<P: Provider> {
    peer: Smb2Peer<P>,
    file: FileId,
    dir: FileId,
    /// Granted to the server: a buffer its RDMA Writes may fill (READ) and
    /// one its RDMA Reads may read (WRITE); revoked and freed at the end.
    sink: BufferDescriptorRepr,
    source: BufferDescriptorRepr,
    grants: Grants,
    /// Requests sent on it so far.
    sent: usize,
}

/// Ends the session in `t`, if any: grants revoked, buffers back to the
/// rig's pool and the connection closed, its posted receives drained (a
/// client dropped without `close` keeps them), whether or not the server
/// already ended it.
fn end<P: Provider>(t: &mut Option<Target<P>>) {
    let Some(mut old) = t.take() else {
        return;
    };
    old.grants.release(old.peer.client_mut());
    old.peer.close();
}

/// Bytes of each granted buffer (above the client's 8 KiB receive class).
const RDMA_LEN: usize = 16384;

fn target<P: Provider>(rig: &mut Rig<P>) -> Result<Target<P>, String> {
    let (mut peer, file) = Smb2Peer::with_file(rig, "mutated")?;
    let dir = format!(
        "torture-mutated-dir-{}-{}",
        std::process::id(),
        rig.next_seq()
    );
    let dir = peer.create(&dir, true)?;
    peer.ensure_credits(128)?;
    let mut grants = Grants::default();
    let c = peer.client_mut();
    let sink = grants.grant(c, RDMA_LEN, RDMA_LEN, Access::RemoteWrite)?;
    let source = grants.grant(c, RDMA_LEN, RDMA_LEN, Access::RemoteRead)?;
    Ok(Target {
        peer,
        file,
        dir,
        sink,
        source,
        grants,
        sent: 0,
    })
}

/// What happened to the requests, for the observation.
#[derive(Default)]
struct Tally {
    answered: usize,
    succeeded: usize,
    disconnects: usize,
    quiet: usize,
    sessions: usize,
}

impl Tally {
    /// What both cases report after their requests: the answers, the ended
    /// connections, the silent CANCELs, the bystander's round trip.
    fn report(&self, rtt: Duration, started: Instant) -> String {
        format!(
            "{} answered ({} with STATUS_SUCCESS), {} connections ended, {} CANCELs left unanswered; the bystander's round trip took {} us; {:.1} s",
            self.answered,
            self.succeeded,
            self.disconnects,
            self.quiet,
            rtt.as_micros(),
            started.elapsed().as_secs_f64()
        )
    }
}

fn mutated_requests<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let started = Instant::now();
    let (mut bystander, requests, mut seed) = campaign(rig, REQUESTS, 0x2545_f491_4f6c_dd1d)?;
    let first_seed = seed;
    let mut tally = Tally::default();
    let mut t: Option<Target<P>> = None;
    for trial in 0..requests {
        let tg = match t.as_mut() {
            Some(tg) if tg.sent < PER_SESSION => tg,
            _ => {
                // The old session (if any) ends first.
                end(&mut t);
                tally.sessions += 1;
                t.insert(target(rig)?)
            }
        };
        if tg.peer.credits() < 16 {
            if let Err(e) = tg.peer.ensure_credits(128) {
                end(&mut t);
                return Ok(Observation::fail(format!(
                    "request {trial} (seed {first_seed:#x}): asking for credits after an answered request: {e}"
                )));
            }
        }
        tg.sent += 1;
        let name = format!("m{trial}.dat");
        let template = next(&mut seed) % TEMPLATES;
        let mut bytes = build(tg, template, &name, &mut seed)?;
        let what = mutate(&mut bytes, &mut seed);
        let command = bytes
            .get(12..14)
            .map_or(0, |c| u16::from_le_bytes([c[0], c[1]]));
        if tg.peer.send(&bytes).is_err() {
            // The connection had already ended (an earlier request of
            // this session asked for it): a fresh session next.
            tally.disconnects += 1;
            end(&mut t);
            continue;
        }
        // A CANCEL gets QUIET to show it is not answered; anything else
        // the whole --timeout (a loaded host) before silence fails it.
        let wait = if command == CANCEL {
            QUIET
        } else {
            rig.timeout.max(QUIET)
        };
        match tg.peer.recv(wait) {
            Reply::Response(r) => {
                tally.answered += 1;
                if r.header.status == STATUS_SUCCESS {
                    tally.succeeded += 1;
                }
            }
            Reply::Closed(_) => {
                tally.disconnects += 1;
                end(&mut t);
                continue;
            }
            // [MS-SMB2] 3.3.5.16: "The server MUST NOT send a response
            // to a CANCEL request"; every other request gets one.
            Reply::Silent if command == CANCEL => tally.quiet += 1,
            Reply::Silent => {
                end(&mut t);
                return Ok(Observation::fail(format!(
                    "request {trial} (seed {first_seed:#x}, template {template}, command {command:#x}, {what}): no response in {wait:?} and the connection still open"
                )));
            }
            Reply::Garbage(g) => {
                end(&mut t);
                return Ok(Observation::fail(format!(
                    "request {trial} (seed {first_seed:#x}, template {template}, {what}): the server sent a message that is not an SMB2 response: {g}"
                )));
            }
        }
        // Answered or not, an open connection must answer an ECHO (late
        // answers to the mutated request, or an interim STATUS_PENDING's
        // final response, may come first).
        match echo_after(&mut tg.peer, rig.timeout.max(Duration::from_secs(5))) {
            Ok(true) => {}
            Ok(false) => {
                tally.disconnects += 1;
                end(&mut t);
            }
            Err(e) => {
                end(&mut t);
                return Ok(Observation::fail(format!(
                    "request {trial} (seed {first_seed:#x}, template {template}, command {command:#x}, {what}): {e}"
                )));
            }
        }
        if trial % 64 == 63 {
            bystander.idle_step()?;
        }
    }
    end(&mut t);
    let rtt = bystander.round_trip(rig.timeout)?;
    bystander.close();
    Ok(Observation::pass(format!(
        "{requests} mutated requests (seed {first_seed:#x}) in {} sessions: {}",
        tally.sessions,
        tally.report(rtt, started)
    )))
}

/// Sends an ECHO and waits for its response, skipping other responses.
/// `Ok(true)`: answered (any status: a mutated SESSION_SETUP may have set
/// SIGNING_REQUIRED for the session the ECHO names, and an unsigned ECHO
/// then gets STATUS_ACCESS_DENIED, docs/spec-notes.md); `Ok(false)`: the
/// connection ended; `Err`: it stayed open and silent, or sent something
/// that is not an SMB2 response.
fn echo_after<P: Provider>(peer: &mut Smb2Peer<P>, timeout: Duration) -> Result<bool, String> {
    let bytes = peer.build(Command::Echo, 1, &EchoRequestRepr)?;
    let id = peer.next_message_id() - 1;
    if peer.send(&bytes).is_err() {
        return Ok(false);
    }
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "the connection stayed open but its ECHO (MessageId {id}) was not answered in {timeout:?}"
            ));
        }
        match peer.recv(left) {
            Reply::Response(r) if r.header.message_id == id => return Ok(true),
            Reply::Response(_) | Reply::Silent => continue,
            Reply::Closed(_) => return Ok(false),
            Reply::Garbage(g) => {
                return Err(format!("a message that is not an SMB2 response: {g}"))
            }
        }
    }
}

/// What both cases start with: a bystander that has made a round trip,
/// the number of requests (`SMBDIRECTD_TORTURE_MUTATIONS`, else
/// `default`) and the seed (`SMBDIRECTD_TORTURE_SEED`, else one derived
/// from `base` and the run's sequence number).
fn campaign<P: Provider>(
    rig: &mut Rig<P>,
    default: usize,
    base: u64,
) -> Result<(Healthy<P>, usize, u64), String> {
    let mut bystander = rig.healthy()?;
    bystander.round_trip(rig.timeout)?;
    let env = |k: &str| std::env::var(k).ok().and_then(|v| parse_u64(&v));
    let requests = env("SMBDIRECTD_TORTURE_MUTATIONS").map_or(default, |n| n as usize);
    let seed = env("SMBDIRECTD_TORTURE_SEED")
        .unwrap_or_else(|| base ^ rig.next_seq().wrapping_mul(0x9e37_79b9_7f4a_7c15));
    // xorshift has one fixed point.
    Ok((bystander, requests, seed.max(1)))
}

/// A decimal or 0x-prefixed hexadecimal number.
fn parse_u64(v: &str) -> Option<u64> {
    match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

const TEMPLATES: u64 = 20;

/// FileInformationClass values QUERY_INFO and SET_INFO take ([MS-FSCC] 2.4).
const FILE_CLASSES: [u8; 12] = [4, 5, 6, 7, 8, 9, 10, 13, 14, 18, 20, 34];
/// FsInformationClass values ([MS-FSCC] 2.5).
const FS_CLASSES: [u8; 7] = [1, 3, 4, 5, 6, 7, 11];
/// Directory enumeration classes ([MS-FSCC] 2.4).
const DIR_CLASSES: [u8; 6] = [1, 2, 3, 12, 37, 38];

/// The valid request of template `k` (the peer's next MessageId).
fn build<P: Provider>(
    t: &mut Target<P>,
    k: u64,
    name: &str,
    seed: &mut u64,
) -> Result<Vec<u8>, String> {
    let (file, dir, sink, source) = (t.file, t.dir, t.sink, t.source);
    let p = &mut t.peer;
    let channel = |s: &mut u64| {
        if next(s) % 2 == 0 {
            Channel::RdmaV1
        } else {
            Channel::RdmaV1Invalidate
        }
    };
    let pick = |s: &mut u64, v: &[u8]| v[(next(s) % v.len() as u64) as usize];
    let create = |name| create_request(name, false);
    let query = |info_type, class, fid| QueryInfoRequestRepr {
        info_type,
        file_info_class: class,
        output_buffer_length: 4096,
        input: &[],
        additional_information: 0,
        flags: QueryInfoFlags::empty(),
        file_id: fid,
    };
    match k {
        0 => p.build(Command::Create, 1, &create(name)),
        1 => p.build(
            Command::Read,
            1,
            &ReadRequestRepr {
                padding: 0x50,
                flags: ReadFlags::empty(),
                length: 4096,
                offset: 512,
                file_id: file,
                minimum_count: 0,
                channel: Channel::None,
                remaining_bytes: 0,
                channel_info: ChannelInfo::EMPTY,
            },
        ),
        2 => p.build(
            Command::Write,
            1,
            &WriteRequestRepr {
                offset: 100,
                file_id: file,
                channel: Channel::None,
                remaining_bytes: 0,
                flags: WriteFlags::empty(),
                data: &[0xa5; 600],
                channel_info: ChannelInfo::EMPTY,
            },
        ),
        3 => {
            let c = pick(seed, &FILE_CLASSES);
            p.build(Command::QueryInfo, 1, &query(InfoType::FILE, c, file))
        }
        4 => {
            let c = pick(seed, &FS_CLASSES);
            p.build(Command::QueryInfo, 1, &query(InfoType::FILESYSTEM, c, file))
        }
        5..=8 => {
            // End of file, basic, rename (to a sibling), disposition.
            let (class, data): (u8, Vec<u8>) = match k {
                5 => (20, 8192u64.to_le_bytes().to_vec()),
                6 => {
                    let mut b = vec![0u8; 40];
                    b[8..16].copy_from_slice(&0x01d9_0000_0000_0000u64.to_le_bytes());
                    b[32..36].copy_from_slice(&0x20u32.to_le_bytes());
                    (4, b)
                }
                7 => {
                    let target: Vec<u8> = format!("r{}", next(seed) % 1000)
                        .encode_utf16()
                        .flat_map(u16::to_le_bytes)
                        .collect();
                    let mut b = vec![0u8; 20];
                    b[16..20].copy_from_slice(&(target.len() as u32).to_le_bytes());
                    b.extend_from_slice(&target);
                    (10, b)
                }
                _ => (13, vec![0u8]),
            };
            p.build(
                Command::SetInfo,
                1,
                &SetInfoRequestRepr {
                    info_type: InfoType::FILE,
                    file_info_class: class,
                    data: &data,
                    additional_information: 0,
                    file_id: file,
                },
            )
        }
        9 => {
            let c = pick(seed, &DIR_CLASSES);
            p.build(
                Command::QueryDirectory,
                1,
                &QueryDirectoryRequestRepr {
                    file_information_class: FileInfoClass(c),
                    flags: QueryDirectoryFlags::RESTART_SCANS,
                    file_index: 0,
                    file_id: dir,
                    file_name: Utf16Str::new("*"),
                    output_buffer_length: 8192,
                },
            )
        }
        10 => {
            let el = [LockElement {
                offset: next(seed) % 8192,
                length: 1 + next(seed) % 4096,
                flags: LockFlags::EXCLUSIVE.with(LockFlags::FAIL_IMMEDIATELY),
            }];
            p.build(
                Command::Lock,
                1,
                &LockRequestRepr {
                    lock_sequence: 0,
                    file_id: file,
                    locks: LockElements::new(&el),
                },
            )
        }
        11 => p.build(Command::Flush, 1, &FlushRequestRepr { file_id: file }),
        12 => {
            let (code, input): (u32, Vec<u8>) = match next(seed) % 3 {
                0 => {
                    // Capabilities, Guid, SecurityMode, DialectCount, Dialects.
                    let mut b = vec![0u8; 24];
                    b[20..22].copy_from_slice(&1u16.to_le_bytes());
                    b[22..24].copy_from_slice(&2u16.to_le_bytes());
                    b.extend_from_slice(&0x0300u16.to_le_bytes());
                    b.extend_from_slice(&0x0311u16.to_le_bytes());
                    (FSCTL_VALIDATE_NEGOTIATE_INFO, b)
                }
                1 => (FSCTL_QUERY_NETWORK_INTERFACE_INFO, Vec::new()),
                _ => (FSCTL_STORAGE_QOS_CONTROL, qos_request(seed)),
            };
            let fid = if code == FSCTL_STORAGE_QOS_CONTROL {
                file
            } else {
                FileId::new(u64::MAX, u64::MAX)
            };
            p.build(
                Command::Ioctl,
                1,
                &IoctlRequestRepr::fsctl(code, fid, &input, 4096),
            )
        }
        13 => p.build(
            Command::ChangeNotify,
            1,
            &ChangeNotifyRequestRepr {
                flags: ChangeNotifyFlags::empty(),
                output_buffer_length: 4096,
                file_id: dir,
                completion_filter: CompletionFilter::from_bits(0x17),
            },
        ),
        14 => p.build(
            Command::Close,
            1,
            &CloseRequestRepr {
                flags: CloseFlags::from_bits(1),
                file_id: FileId::new(next(seed), next(seed)),
            },
        ),
        15 => {
            // CREATE + QUERY_INFO + CLOSE, the last two related (the chain
            // the Linux client sends).
            let mut buf = vec![0u8; 1024];
            let mut w = CompoundWriter::new(&mut buf);
            let all = FileId::new(u64::MAX, u64::MAX);
            let h = p.header(Command::Create, 1);
            w.push(&h, &create(name)).map_err(|e| e.to_string())?;
            let mut h = p.header(Command::QueryInfo, 1);
            h.flags = h.flags.with(HeaderFlags::RELATED_OPERATIONS);
            w.push(&h, &query(InfoType::FILE, 18, all))
                .map_err(|e| e.to_string())?;
            let mut h = p.header(Command::Close, 1);
            h.flags = h.flags.with(HeaderFlags::RELATED_OPERATIONS);
            w.push(
                &h,
                &CloseRequestRepr {
                    flags: CloseFlags::empty(),
                    file_id: all,
                },
            )
            .map_err(|e| e.to_string())?;
            let n = w.finish();
            buf.truncate(n);
            Ok(buf)
        }
        16 => {
            // READ through the RDMA channel into the granted sink.
            let descs = [sink];
            p.build(
                Command::Read,
                1,
                &ReadRequestRepr {
                    padding: 0x50,
                    flags: ReadFlags::empty(),
                    length: 4096,
                    offset: next(seed) % 8192,
                    file_id: file,
                    minimum_count: 0,
                    channel: channel(seed),
                    remaining_bytes: 0,
                    channel_info: ChannelInfo::descriptors(&descs),
                },
            )
        }
        17 => {
            // WRITE through the RDMA channel from the granted source.
            let descs = [source];
            p.build(
                Command::Write,
                1,
                &WriteRequestRepr {
                    offset: next(seed) % 8192,
                    file_id: file,
                    channel: channel(seed),
                    remaining_bytes: 4096,
                    flags: WriteFlags::empty(),
                    data: &[],
                    channel_info: ChannelInfo::descriptors(&descs),
                },
            )
        }
        18 => {
            // An inline WRITE above MaxSendSize: SMB Direct fragments it and
            // the server reassembles it ([MS-SMBD] 3.1.5.1, 3.1.5.8). Above
            // 8 KiB, so the client takes it from its 64 KiB buffer class
            // (its 8 KiB one backs its posted receives).
            let len = 8193 + (next(seed) % 52_000) as usize;
            let data = vec![0x3c; len];
            p.build(
                Command::Write,
                1,
                &WriteRequestRepr {
                    offset: next(seed) % 65_536,
                    file_id: file,
                    channel: Channel::None,
                    remaining_bytes: 0,
                    flags: WriteFlags::empty(),
                    data: &data,
                    channel_info: ChannelInfo::EMPTY,
                },
            )
        }
        _ => {
            let h = p.header(Command::Echo, 1);
            message_bytes(&h, &EchoRequestRepr)
        }
    }
}

/// A valid [MS-SQOS] 2.2.2.2 request: dialect 1.0 or 1.1, any non-empty
/// set of the defined options, one of 4 logical flows and 2 policies (so
/// that opens of different sessions meet in one flow), limits, names and
/// counters drawn at random; then mutated like the rest.
fn qos_request(seed: &mut u64) -> Vec<u8> {
    let dialect = if next(seed) % 2 == 0 {
        QosDialect::V1_0
    } else {
        QosDialect::V1_1
    };
    let options = QosOptions::from_bits((1 + next(seed) % 31) as u32);
    let flow = QosGuid::from_fields(next(seed) as u32 % 4, 0xf10e, 0x7ea5, *b"mutated!");
    let mut r = StorageQosControlRequestRepr::new(dialect, options, flow);
    if next(seed) % 2 == 0 {
        r.policy_id = QosGuid::from_fields(next(seed) as u32 % 2, 0x9011, 0x7ea5, *b"mutated!");
    }
    r.initiator_id = QosGuid::from_fields(7, 0x1d1d, 0x7ea5, *b"mutated!");
    r.limit = EDGES[(next(seed) % EDGES.len() as u64) as usize].min(next(seed) % 100_000);
    r.reservation = next(seed) % 2_000;
    r.bandwidth_limit = next(seed) % 3 * 50_000;
    r.io_count_increment = next(seed) % 1_000;
    r.normalized_io_count_increment = next(seed) % 1_000;
    r.latency_increment = next(seed) % 1_000_000;
    r.lower_latency_increment = next(seed) % 1_000_000;
    r.kilobyte_count_increment = next(seed) % 100_000;
    r.initiator_name = Utf16Name::new("mutated-vm").unwrap_or(Utf16Name::EMPTY);
    r.initiator_node_name = Utf16Name::new("mutated-host").unwrap_or(Utf16Name::EMPTY);
    r.to_vec()
}

/// Boundary values a field is set to.
const EDGES: [u64; 10] = [
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0x7fff,
    0xffff,
    0x8000_0000,
    0xffff_ffff,
    u64::MAX,
];

/// Changes one to three things in `msg` (mostly after the first header;
/// the MessageId is left alone, so the sequence window stays in step).
/// Returns what it did, for a failure report.
fn mutate(msg: &mut Vec<u8>, seed: &mut u64) -> String {
    let mut did = Vec::new();
    for _ in 0..1 + next(seed) % 3 {
        let len = msg.len();
        let body = HEADER_LEN.min(len);
        match next(seed) % 8 {
            0 | 1 if len > body => {
                let n = 1 + next(seed) % 8;
                for _ in 0..n {
                    let i = body + (next(seed) % (len - body) as u64) as usize;
                    msg[i] = next(seed) as u8;
                }
                did.push(format!("{n} random byte(s)"));
            }
            2 | 3 if len > body => {
                let width = [1usize, 2, 4, 8][(next(seed) % 4) as usize];
                let i = body + (next(seed) % (len - body) as u64) as usize;
                let v = EDGES[(next(seed) % EDGES.len() as u64) as usize].to_le_bytes();
                let end = (i + width).min(len);
                msg[i..end].copy_from_slice(&v[..end - i]);
                did.push(format!("{width}-byte edge value at {i}"));
            }
            4 if len > body => {
                let keep = body + (next(seed) % (len - body) as u64) as usize;
                msg.truncate(keep.max(1));
                did.push(format!("truncated to {keep}"));
            }
            5 => {
                let n = 1 + next(seed) % 64;
                msg.extend((0..n).map(|_| next(seed) as u8));
                did.push(format!("{n} byte(s) appended"));
            }
            6 | 7 if next(seed) % 4 == 0 && len >= HEADER_LEN => {
                // A header field other than ProtocolId, StructureSize and
                // MessageId: CreditCharge, Command, Flags, NextCommand,
                // TreeId, SessionId.
                let (at, width) = [
                    (6usize, 2usize),
                    (12, 2),
                    (16, 4),
                    (20, 4),
                    (36, 4),
                    (40, 8),
                ][(next(seed) % 6) as usize];
                let v = if next(seed) % 2 == 0 {
                    EDGES[(next(seed) % EDGES.len() as u64) as usize]
                } else {
                    next(seed) % 0x20
                };
                msg[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
                did.push(format!("header bytes {at}..{} set to {v:#x}", at + width));
            }
            _ => {}
        }
    }
    if did.is_empty() {
        // Every draw skipped (the header one not taken): one random byte
        // after the first header, or anywhere in a message that short.
        let from = if msg.len() > HEADER_LEN {
            HEADER_LEN
        } else {
            0
        };
        if msg.len() > from {
            let i = from + (next(seed) % (msg.len() - from) as u64) as usize;
            msg[i] ^= 1 + (next(seed) % 255) as u8;
            did.push(format!("byte {i} flipped"));
        }
    }
    did.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_leave_the_message_id_and_change_the_message() {
        let mut seed = 7u64;
        let mut changed = 0;
        for _ in 0..2000 {
            let mut m: Vec<u8> = (0..200u8).collect();
            let before = m.clone();
            let what = mutate(&mut m, &mut seed);
            if m.len() >= 32 {
                assert_eq!(m[24..32], before[24..32], "MessageId touched: {what}");
            }
            if m != before {
                changed += 1;
            }
        }
        // Every draw changes something, but for the rare one that writes
        // a byte's own value over it.
        assert!(changed >= 1990, "{changed} of 2000 changed");
    }
}
