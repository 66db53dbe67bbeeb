//! The `smb2` upper layer, first slice: SMB2 over SMB Direct (no Direct TCP
//! transport header, [MS-SMB2] 2.1), server side, wire-exact through
//! `smbdirect_protocol::smb2`.
//!
//! Served: NEGOTIATE (3.0, 3.0.2, 3.1.1 with a preauth integrity context),
//! SESSION_SETUP (anonymous/guest only: any blob is accepted), LOGOFF,
//! TREE_CONNECT (share `data`), TREE_DISCONNECT, CREATE, CLOSE, FLUSH,
//! READ/WRITE inline and through SMB2_CHANNEL_RDMA_V1(_INVALIDATE), ECHO,
//! IOCTL (always STATUS_NOT_SUPPORTED for now), compounds (related
//! requests inherit SessionId, TreeId and FileId) and credits.
//!
//! Limits of this slice (see also [`store`]):
//! - each worker owns its own store (no locks on the I/O path); with several
//!   workers a connection sees the files of its worker only, until the
//!   shared pool-backed store lands;
//! - an RDMA READ/WRITE must be the last request of a compound; earlier
//!   responses of that compound are sent before it as their own message;
//! - "disconnect" outcomes of [`Smb2Error::server_action`] cannot close the
//!   connection yet (the worker's `Replies` has no close request): the
//!   connection is disconnected (`Replies::disconnect`);
//! - a reply that meets backpressure after the request changed state is
//!   kept and resent on the retry (inline path); the RDMA path re-executes
//!   on retry (its state changes are idempotent except credit accounting).

mod oldstore;
pub mod store; // first-slice store, replaced by store::Store implementations

use crate::planes::ConnId;
use crate::upper::{Backpressure, RdmaDone, RdmaError, RdmaKind, Replies, UpperLayer};
use oldstore::{MemStore, StoreError, DEFAULT_STORE_BYTES};
use smbdirect_protocol::ntstatus::*;
use smbdirect_protocol::smb2::*;
use std::collections::HashMap;

/// Credits a connection may hold outstanding.
pub const MAX_CREDITS: u32 = 512;
/// TreeId of the `data` share.
pub const DATA_TREE_ID: u32 = 1;
/// Name of the one share.
pub const SHARE_NAME: &str = "data";
/// Largest inline READ/WRITE payload (a response must fit one reassembled
/// SMB Direct message, default MaxFragmentedRecvSize 1 MiB).
pub const MAX_INLINE: u32 = (1 << 20) - 4096;
/// Response scratch buffer per worker.
const SCRATCH_LEN: usize = 1 << 20;
/// Context of an RDMA operation (see `RdmaCtx`).
const CTX_LEN: usize = CTX_HEADER + HEADER_LEN;
/// Where the response header starts in an RDMA context.
const CTX_HEADER: usize = 40;
/// Maximal access granted on the share (FILE_ALL_ACCESS).
const FILE_ALL_ACCESS: u32 = 0x001F_01FF;

/// One open.
#[derive(Debug)]
struct Open {
    persistent: u64,
    /// None: the share root (a directory handle).
    name: Option<String>,
}

/// A reply that met backpressure after the request changed state.
#[derive(Debug)]
struct Pending {
    first_message_id: u64,
    msg_len: usize,
    bytes: Vec<u8>,
}

#[derive(Debug)]
struct Conn {
    dialect: Option<Dialect>,
    session: Option<u64>,
    tree: Option<u32>,
    opens: HashMap<u64, Open>,
    outstanding: u32,
    pending: Option<Pending>,
    dead: bool,
}

impl Conn {
    fn new() -> Self {
        Conn {
            dialect: None,
            session: None,
            tree: None,
            opens: HashMap::new(),
            outstanding: 1,
            pending: None,
            dead: false,
        }
    }

    /// [MS-SMB2] 3.3.1.2: consume CreditCharge, grant CreditRequest (at
    /// least 1, never past MAX_CREDITS outstanding).
    fn grant(&mut self, h: &HeaderRepr) -> u16 {
        let charge = u32::from(h.credit_charge.max(1));
        self.outstanding = self.outstanding.saturating_sub(charge);
        let room = MAX_CREDITS.saturating_sub(self.outstanding).max(1);
        let g = u32::from(h.credit.max(1)).min(room);
        self.outstanding += g;
        g as u16
    }
}

/// State shared by the connections of one worker.
#[derive(Debug)]
struct Shared {
    store: MemStore,
    next_session: u64,
    next_file: u64,
    server_guid: Guid,
    salt_seed: u64,
}

/// SessionId/TreeId/FileId a related request inherits.
#[derive(Debug, Default, Clone, Copy)]
struct Chain {
    session: u64,
    tree: u32,
    file: Option<FileId>,
}

/// An RDMA transfer the last request of a compound asks for.
#[derive(Debug)]
struct Plan<'a> {
    kind: RdmaKind,
    descs: &'a [u8],
    len: u32,
    ctx: [u8; CTX_LEN],
    name: String,
    file_offset: u64,
    request: HeaderRepr,
    response: HeaderRepr,
}

// Not boxed: no allocation per request on the I/O path.
#[allow(clippy::large_enum_variant)]
enum Step<'a> {
    Done,
    Rdma(Plan<'a>),
    Disconnect,
}

/// The SMB2 upper layer of one worker.
#[derive(Debug)]
pub struct Smb2Server {
    shared: Shared,
    conns: HashMap<ConnId, Conn>,
    scratch: Vec<u8>,
}

impl Default for Smb2Server {
    fn default() -> Self {
        Self::new()
    }
}

impl Smb2Server {
    /// A server with an empty `data` share.
    pub fn new() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        let mut g = [0u8; 16];
        g[..8].copy_from_slice(&seed.to_le_bytes());
        g[8..].copy_from_slice(b"smbdrct\0");
        Smb2Server {
            shared: Shared {
                store: MemStore::new(DEFAULT_STORE_BYTES),
                // Distinct per worker and run: high bits from the clock.
                next_session: (seed & 0xFFFF_FFFF_0000) | 1,
                next_file: 1,
                server_guid: Guid::from_bytes(g),
                salt_seed: seed | 1,
            },
            conns: HashMap::new(),
            scratch: vec![0u8; SCRATCH_LEN],
        }
    }
}

fn filetime_now() -> u64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    116_444_736_000_000_000 + d.as_nanos() as u64 / 100
}

fn resp_header(
    req: &HeaderRepr,
    status: NtStatus,
    grant: u16,
    session: u64,
    tree: u32,
) -> HeaderRepr {
    let mut h = req.response_to(status);
    h.credit = grant;
    h.session_id = session;
    if let HeaderId::Sync { process_id, .. } = h.id {
        h.id = HeaderId::Sync {
            process_id,
            tree_id: tree,
        };
    }
    h
}

fn push<B: Smb2Body + ?Sized>(w: &mut CompoundWriter<'_>, h: &HeaderRepr, body: &B) {
    if w.push(h, body).is_err() {
        // Only a response larger than the scratch buffer gets here.
        let mut e = *h;
        e.status = STATUS_INSUFFICIENT_RESOURCES;
        let _ = w.push(&e, &ErrorResponseRepr::EMPTY);
    }
}

/// A request name: relative, no `.`/`..` components, no streams.
fn valid_name(name: &str) -> bool {
    !name.starts_with('\\')
        && !name.contains(':')
        && !name.contains('/')
        && name
            .split('\\')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

fn store_status(e: StoreError) -> NtStatus {
    match e {
        StoreError::NotFound => STATUS_FILE_CLOSED,
        StoreError::Full => STATUS_DISK_FULL,
    }
}

/// [MS-SMB2] 3.3.5.2.5: a large READ/WRITE must be paid for.
fn charge_ok(h: &HeaderRepr, payload: u32) -> bool {
    h.credit_charge.max(1) >= HeaderRepr::credit_charge_for(u64::from(payload))
}

impl Shared {
    #[allow(clippy::too_many_arguments)]
    fn execute<'a>(
        &mut self,
        c: &mut Conn,
        m: &smbdirect_protocol::smb2::Message<'a>,
        chain: &mut Chain,
        w: &mut CompoundWriter<'_>,
        last: bool,
        max_rw: u32,
    ) -> Step<'a> {
        let req = *m.header();
        if req.is_response() {
            return Step::Disconnect;
        }
        let (session, tree) = if m.is_related() {
            (chain.session, chain.tree)
        } else {
            (req.session_id, req.tree_id().unwrap_or(0))
        };
        chain.session = session;
        chain.tree = tree;
        if req.command == Command::Cancel {
            return Step::Done; // no response ([MS-SMB2] 3.3.5.16); nothing is async yet
        }
        let grant = c.grant(&req);
        let body = match m.request_body() {
            Ok(b) => b,
            Err(e) => match e.server_action() {
                ServerAction::Disconnect => return Step::Disconnect,
                ServerAction::FailRequest(st) => {
                    push(
                        w,
                        &resp_header(&req, st, grant, session, tree),
                        &ErrorResponseRepr::EMPTY,
                    );
                    return Step::Done;
                }
            },
        };
        match self.handle(c, &req, body, chain, w, last, max_rw, grant, session, tree) {
            Ok(step) => step,
            Err(st) => {
                push(
                    w,
                    &resp_header(&req, st, grant, chain.session, chain.tree),
                    &ErrorResponseRepr::EMPTY,
                );
                Step::Done
            }
        }
    }

    fn lookup<'c>(
        c: &'c Conn,
        fid: FileId,
        chain: &Chain,
        related: bool,
    ) -> Result<(FileId, &'c Open), NtStatus> {
        let fid = if related && fid == FileId::ANY {
            chain.file.ok_or(STATUS_INVALID_PARAMETER)?
        } else {
            fid
        };
        match c.opens.get(&fid.volatile) {
            Some(o) if o.persistent == fid.persistent => Ok((fid, o)),
            _ => Err(STATUS_FILE_CLOSED),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn handle<'a>(
        &mut self,
        c: &mut Conn,
        req: &HeaderRepr,
        body: RequestBody<'a>,
        chain: &mut Chain,
        w: &mut CompoundWriter<'_>,
        last: bool,
        max_rw: u32,
        grant: u16,
        session: u64,
        tree: u32,
    ) -> Result<Step<'a>, NtStatus> {
        let related = req.is_related();
        let ok = |s: u64, t: u32| resp_header(req, STATUS_SUCCESS, grant, s, t);
        // Connection, session and tree checks ([MS-SMB2] 3.3.5.2.x).
        let Some(dialect) = c.dialect else {
            if let RequestBody::Negotiate(n) = body {
                return self.negotiate(c, req, n, w, max_rw, grant);
            }
            return Ok(Step::Disconnect);
        };
        let needs_session = !matches!(
            body,
            RequestBody::Negotiate(_) | RequestBody::SessionSetup(_) | RequestBody::Echo(_)
        );
        if needs_session && (c.session.is_none() || c.session != Some(session)) {
            return Err(STATUS_USER_SESSION_DELETED);
        }
        let needs_tree =
            needs_session && !matches!(body, RequestBody::Logoff(_) | RequestBody::TreeConnect(_));
        if needs_tree && c.tree != Some(tree) {
            return Err(STATUS_NETWORK_NAME_DELETED);
        }
        match body {
            // 3.3.5.3.1: a second NEGOTIATE ends the connection.
            RequestBody::Negotiate(_) => Ok(Step::Disconnect),
            RequestBody::SessionSetup(s) => {
                let id = match c.session {
                    Some(id) if session == id => id,
                    _ if session != 0 => return Err(STATUS_USER_SESSION_DELETED),
                    _ => {
                        let id = self.next_session;
                        self.next_session += 1;
                        c.session = Some(id);
                        id
                    }
                };
                chain.session = id;
                let flags = if s.security_buffer.is_empty() {
                    SessionFlags::IS_NULL
                } else {
                    SessionFlags::IS_GUEST
                };
                let r = SessionSetupResponseRepr {
                    session_flags: flags,
                    security_buffer: &[],
                };
                push(w, &ok(id, tree), &r);
                Ok(Step::Done)
            }
            RequestBody::Logoff(_) => {
                c.session = None;
                c.tree = None;
                c.opens.clear();
                push(w, &ok(session, tree), &LogoffResponseRepr);
                Ok(Step::Done)
            }
            RequestBody::TreeConnect(t) => {
                let path = t.path.decode().map_err(|_| STATUS_INVALID_PARAMETER)?;
                let share = path.rsplit('\\').next().unwrap_or("");
                if !share.eq_ignore_ascii_case(SHARE_NAME) {
                    return Err(STATUS_BAD_NETWORK_NAME);
                }
                c.tree = Some(DATA_TREE_ID);
                chain.tree = DATA_TREE_ID;
                let r = TreeConnectResponseRepr {
                    share_type: ShareType::DISK,
                    share_flags: ShareFlags::empty(),
                    capabilities: ShareCapabilities::empty(),
                    maximal_access: AccessMask::from_bits(FILE_ALL_ACCESS),
                };
                push(w, &ok(session, DATA_TREE_ID), &r);
                Ok(Step::Done)
            }
            RequestBody::TreeDisconnect(_) => {
                c.tree = None;
                c.opens.clear();
                push(w, &ok(session, tree), &TreeDisconnectResponseRepr);
                Ok(Step::Done)
            }
            RequestBody::Create(r) => {
                let name = r.name.decode().map_err(|_| STATUS_INVALID_PARAMETER)?;
                let now = filetime_now();
                let (action, open_name, attrs, eof) = if name.is_empty() {
                    (CreateAction::OPENED, None, FileAttributes::DIRECTORY, 0)
                } else {
                    if !valid_name(&name) {
                        return Err(STATUS_INVALID_PARAMETER);
                    }
                    if r.create_options.contains(CreateOptions::DIRECTORY_FILE) {
                        return Err(STATUS_NOT_SUPPORTED);
                    }
                    let exists = self.store.exists(&name);
                    let d = r.create_disposition;
                    let action = if d == CreateDisposition::SUPERSEDE {
                        if exists {
                            CreateAction::SUPERSEDED
                        } else {
                            CreateAction::CREATED
                        }
                    } else if d == CreateDisposition::OPEN {
                        if !exists {
                            return Err(STATUS_OBJECT_NAME_NOT_FOUND);
                        }
                        CreateAction::OPENED
                    } else if d == CreateDisposition::CREATE {
                        if exists {
                            return Err(STATUS_OBJECT_NAME_COLLISION);
                        }
                        CreateAction::CREATED
                    } else if d == CreateDisposition::OPEN_IF {
                        if exists {
                            CreateAction::OPENED
                        } else {
                            CreateAction::CREATED
                        }
                    } else if d == CreateDisposition::OVERWRITE {
                        if !exists {
                            return Err(STATUS_OBJECT_NAME_NOT_FOUND);
                        }
                        CreateAction::OVERWRITTEN
                    } else if d == CreateDisposition::OVERWRITE_IF {
                        if exists {
                            CreateAction::OVERWRITTEN
                        } else {
                            CreateAction::CREATED
                        }
                    } else {
                        return Err(STATUS_INVALID_PARAMETER);
                    };
                    if action != CreateAction::OPENED {
                        self.store.create_or_truncate(&name);
                    }
                    let eof = self.store.size(&name).unwrap_or(0);
                    (action, Some(name), FileAttributes::ARCHIVE, eof)
                };
                let id = self.next_file;
                self.next_file += 1;
                let fid = FileId {
                    persistent: id,
                    volatile: id,
                };
                c.opens.insert(
                    id,
                    Open {
                        persistent: id,
                        name: open_name,
                    },
                );
                chain.file = Some(fid);
                let resp = CreateResponseRepr {
                    oplock_level: OplockLevel::NONE,
                    flags: CreateResponseFlags::empty(),
                    create_action: action,
                    creation_time: now,
                    last_access_time: now,
                    last_write_time: now,
                    change_time: now,
                    allocation_size: eof,
                    end_of_file: eof,
                    file_attributes: attrs,
                    file_id: fid,
                    create_contexts: CreateContextList::EMPTY,
                };
                push(w, &ok(session, tree), &resp);
                Ok(Step::Done)
            }
            RequestBody::Close(r) => {
                let (fid, open) = Self::lookup(c, r.file_id, chain, related)?;
                let mut resp = CloseResponseRepr {
                    flags: CloseFlags::empty(),
                    creation_time: 0,
                    last_access_time: 0,
                    last_write_time: 0,
                    change_time: 0,
                    allocation_size: 0,
                    end_of_file: 0,
                    file_attributes: FileAttributes::empty(),
                };
                if r.flags.contains(CloseFlags::POSTQUERY_ATTRIB) {
                    let now = filetime_now();
                    let eof = open
                        .name
                        .as_deref()
                        .and_then(|n| self.store.size(n))
                        .unwrap_or(0);
                    resp = CloseResponseRepr {
                        flags: CloseFlags::POSTQUERY_ATTRIB,
                        creation_time: now,
                        last_access_time: now,
                        last_write_time: now,
                        change_time: now,
                        allocation_size: eof,
                        end_of_file: eof,
                        file_attributes: if open.name.is_some() {
                            FileAttributes::ARCHIVE
                        } else {
                            FileAttributes::DIRECTORY
                        },
                    };
                }
                c.opens.remove(&fid.volatile);
                push(w, &ok(session, tree), &resp);
                Ok(Step::Done)
            }
            RequestBody::Flush(r) => {
                Self::lookup(c, r.file_id, chain, related)?;
                push(w, &ok(session, tree), &FlushResponseRepr);
                Ok(Step::Done)
            }
            RequestBody::Echo(_) => {
                push(w, &ok(session, tree), &EchoResponseRepr);
                Ok(Step::Done)
            }
            RequestBody::Ioctl(_r) => {
                // FSCTL_STORAGE_QOS_CONTROL ([MS-SQOS]) is refused for now:
                // the control-plane QoS path comes next. Every other code
                // is not supported by this server either.
                Err(STATUS_NOT_SUPPORTED)
            }
            RequestBody::Cancel(_) => Ok(Step::Done),
            RequestBody::Read(r) => {
                let (fid, open) = Self::lookup(c, r.file_id, chain, related)?;
                let name = open.name.as_deref().ok_or(STATUS_INVALID_DEVICE_REQUEST)?;
                if !charge_ok(req, r.length) {
                    return Err(STATUS_INVALID_PARAMETER);
                }
                let size = self.store.size(name).ok_or(STATUS_FILE_CLOSED)?;
                let avail = size.saturating_sub(r.offset).min(u64::from(r.length)) as u32;
                if (avail == 0 && r.length > 0) || avail < r.minimum_count {
                    return Err(STATUS_END_OF_FILE);
                }
                match r.channel {
                    Channel::None => {
                        if r.length > MAX_INLINE {
                            return Err(STATUS_INVALID_PARAMETER);
                        }
                        let data = self
                            .store
                            .read(name, r.offset, avail as usize)
                            .map_err(store_status)?;
                        let resp = ReadResponseRepr {
                            data,
                            data_remaining: 0,
                            flags: 0,
                        };
                        push(w, &ok(session, tree), &resp);
                        Ok(Step::Done)
                    }
                    ch if ch.is_rdma() => {
                        let descs = rdma_channel(ch, dialect, r.channel_info, last, avail, max_rw)?;
                        let name = name.to_string();
                        Ok(Step::Rdma(plan(
                            RdmaKind::Write,
                            descs,
                            avail,
                            ch,
                            fid,
                            r.offset,
                            name,
                            *req,
                            ok(session, tree),
                        )))
                    }
                    _ => Err(STATUS_INVALID_PARAMETER),
                }
            }
            RequestBody::Write(r) => {
                let (fid, open) = Self::lookup(c, r.file_id, chain, related)?;
                let name = open.name.as_deref().ok_or(STATUS_INVALID_DEVICE_REQUEST)?;
                match r.channel {
                    Channel::None => {
                        let len = r.data.len() as u32;
                        if !charge_ok(req, len) {
                            return Err(STATUS_INVALID_PARAMETER);
                        }
                        self.store
                            .write(name, r.offset, r.data)
                            .map_err(store_status)?;
                        push(w, &ok(session, tree), &WriteResponseRepr { count: len });
                        Ok(Step::Done)
                    }
                    ch if ch.is_rdma() => {
                        // 3.3.5.13: the data travels by RDMA; RemainingBytes
                        // is its length and no data may be inline.
                        let len = r.remaining_bytes;
                        if !r.data.is_empty() || len == 0 || !charge_ok(req, len) {
                            return Err(STATUS_INVALID_PARAMETER);
                        }
                        let descs = rdma_channel(ch, dialect, r.channel_info, last, len, max_rw)?;
                        let name = name.to_string();
                        Ok(Step::Rdma(plan(
                            RdmaKind::Read,
                            descs,
                            len,
                            ch,
                            fid,
                            r.offset,
                            name,
                            *req,
                            ok(session, tree),
                        )))
                    }
                    _ => Err(STATUS_INVALID_PARAMETER),
                }
            }
        }
    }

    fn negotiate<'a>(
        &mut self,
        c: &mut Conn,
        req: &HeaderRepr,
        n: NegotiateRequestRepr<'_>,
        w: &mut CompoundWriter<'_>,
        max_rw: u32,
        grant: u16,
    ) -> Result<Step<'a>, NtStatus> {
        let dialect = [Dialect::SMB_3_1_1, Dialect::SMB_3_0_2, Dialect::SMB_3_0]
            .into_iter()
            .find(|d| n.dialects.contains(d.0))
            .ok_or(STATUS_NOT_SUPPORTED)?;
        let mut salt = [0u8; 32];
        for (i, ch) in salt.chunks_mut(8).enumerate() {
            // xorshift: a per-connection salt (not a secret: no signing yet).
            let mut x = self.salt_seed.wrapping_add(i as u64 + 1);
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ch.copy_from_slice(&x.to_le_bytes());
        }
        self.salt_seed = self
            .salt_seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1);
        let hashes = [HashAlgorithm::SHA_512.0];
        let ctxs = [NegotiateContext::PreauthIntegrity(
            PreauthIntegrityCapabilities {
                hash_algorithms: U16Array::new(&hashes),
                salt: &salt,
            },
        )];
        let contexts = if dialect == Dialect::SMB_3_1_1 {
            // 3.3.5.4: 3.1.1 requires a preauth integrity context with SHA-512.
            match n
                .negotiate_contexts
                .find(NegotiateContextType::PREAUTH_INTEGRITY_CAPABILITIES)
            {
                Some(NegotiateContext::PreauthIntegrity(p))
                    if p.hash_algorithms.contains(HashAlgorithm::SHA_512.0) => {}
                _ => return Err(STATUS_INVALID_PARAMETER),
            }
            NegotiateContextList::new(&ctxs)
        } else {
            NegotiateContextList::EMPTY
        };
        c.dialect = Some(dialect);
        // Truthful capabilities: multi-credit only (no DFS, leasing,
        // multichannel, persistent handles, encryption).
        let r = NegotiateResponseRepr {
            security_mode: SecurityMode::SIGNING_ENABLED,
            dialect_revision: dialect.0,
            server_guid: self.server_guid,
            capabilities: Capabilities::LARGE_MTU,
            max_transact_size: max_rw,
            max_read_size: max_rw,
            max_write_size: max_rw,
            system_time: filetime_now(),
            server_start_time: 0,
            security_buffer: &[],
            negotiate_contexts: contexts,
        };
        push(w, &resp_header(req, STATUS_SUCCESS, grant, 0, 0), &r);
        Ok(Step::Done)
    }
}

/// Checks an RDMA channel ([MS-SMB2] 3.3.5.12/3.3.5.13) and returns its
/// descriptor bytes (validated by the worker when the transfer is staged).
fn rdma_channel<'a>(
    ch: Channel,
    dialect: Dialect,
    info: ChannelInfo<'a>,
    last: bool,
    len: u32,
    max_rw: u32,
) -> Result<&'a [u8], NtStatus> {
    if ch == Channel::RdmaV1Invalidate && dialect == Dialect::SMB_3_0 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    if !last {
        return Err(STATUS_NOT_SUPPORTED);
    }
    if len > max_rw {
        return Err(STATUS_INVALID_PARAMETER);
    }
    let descs = info.as_bytes().unwrap_or(&[]);
    if descs.is_empty() || descs.len() % 16 != 0 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    Ok(descs)
}

#[allow(clippy::too_many_arguments)]
fn plan<'a>(
    kind: RdmaKind,
    descs: &'a [u8],
    len: u32,
    ch: Channel,
    fid: FileId,
    file_offset: u64,
    name: String,
    request: HeaderRepr,
    response: HeaderRepr,
) -> Plan<'a> {
    // Context: [0] invalidate, [4..8] first token, [8..16] volatile FileId,
    // [16..24] persistent FileId, [24..28] length, [32..40] file offset,
    // [40..104] response header.
    let mut ctx = [0u8; CTX_LEN];
    if ch == Channel::RdmaV1Invalidate {
        ctx[0] = 1;
        ctx[4..8].copy_from_slice(&descs[8..12]);
    }
    ctx[8..16].copy_from_slice(&fid.volatile.to_le_bytes());
    ctx[16..24].copy_from_slice(&fid.persistent.to_le_bytes());
    ctx[24..28].copy_from_slice(&len.to_le_bytes());
    ctx[32..40].copy_from_slice(&file_offset.to_le_bytes());
    let _ = response.emit(&mut ctx[CTX_HEADER..]);
    Plan {
        kind,
        descs,
        len,
        ctx,
        name,
        file_offset,
        request,
        response,
    }
}

fn le32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes(s.try_into().unwrap()))
        .unwrap_or(0)
}

fn le64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .map(|s| u64::from_le_bytes(s.try_into().unwrap()))
        .unwrap_or(0)
}

fn first_message_id(msg: &[u8]) -> u64 {
    le64(msg, 24)
}

impl UpperLayer for Smb2Server {
    fn name(&self) -> &'static str {
        "smb2"
    }

    fn on_message(
        &mut self,
        conn: ConnId,
        msg: &[u8],
        out: &mut Replies<'_>,
    ) -> Result<(), Backpressure> {
        let c = self.conns.entry(conn).or_insert_with(Conn::new);
        if c.dead {
            return Ok(());
        }
        if let Some(p) = c.pending.take() {
            if p.first_message_id == first_message_id(msg) && p.msg_len == msg.len() {
                let r = out.reply(p.bytes.len(), |b| b.copy_from_slice(&p.bytes));
                if r.is_err() {
                    c.pending = Some(p);
                }
                return r;
            }
        }
        let max_rw = out.max_read_write_size();
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut w = CompoundWriter::new(&mut scratch);
        let mut chain = Chain::default();
        let mut rdma: Option<Plan<'_>> = None;
        let mut disconnect = false;
        let mut it = compound(msg).peekable();
        while let Some(m) = it.next() {
            let m = match m {
                Ok(m) => m,
                Err(_) => {
                    // Every chain-walk failure is a Disconnect
                    // (`Smb2Error::server_action`): the chain cannot be delimited.
                    disconnect = true;
                    break;
                }
            };
            let last = it.peek().is_none();
            match self.shared.execute(c, &m, &mut chain, &mut w, last, max_rw) {
                Step::Done => {}
                Step::Rdma(p) => rdma = Some(p),
                Step::Disconnect => {
                    disconnect = true;
                    break;
                }
            }
        }
        let result = if disconnect {
            // [MS-SMB2] 3.3.5.2: the request calls for a disconnect; the
            // worker terminates the connection (and the control plane logs it).
            c.dead = true;
            out.disconnect();
            Ok(())
        } else {
            let mut res = Ok(());
            if let Some(p) = rdma {
                let staged = match p.kind {
                    RdmaKind::Write => {
                        let store = &self.shared.store;
                        out.rdma_write(p.descs, 0, p.len, &p.ctx, |b| {
                            if let Ok(d) = store.read(&p.name, p.file_offset, b.len()) {
                                b[..d.len()].copy_from_slice(d);
                            }
                        })
                    }
                    RdmaKind::Read => out.rdma_read(p.descs, 0, p.len, &p.ctx),
                };
                match staged {
                    Ok(_) => {}
                    Err(RdmaError::Backpressure(b)) => res = Err(b),
                    Err(e) => {
                        // Malformed descriptors: this request fails, the
                        // connection goes on.
                        let mut h = p.response;
                        h.status = e.status();
                        let _ = p.request;
                        push(&mut w, &h, &ErrorResponseRepr::EMPTY);
                    }
                }
            }
            let len = w.finish();
            if res.is_ok() && len > 0 {
                res = out.reply(len, |b| b.copy_from_slice(&scratch[..len]));
                if res.is_err() {
                    c.pending = Some(Pending {
                        first_message_id: first_message_id(msg),
                        msg_len: msg.len(),
                        bytes: scratch[..len].to_vec(),
                    });
                }
            }
            res
        };
        self.scratch = scratch;
        result
    }

    fn on_rdma_complete(
        &mut self,
        conn: ConnId,
        done: &RdmaDone<'_>,
        out: &mut Replies<'_>,
    ) -> Result<(), Backpressure> {
        let Some(c) = self.conns.get_mut(&conn) else {
            return Ok(());
        };
        let ctx = done.context;
        let Ok(mut h) = HeaderRepr::from_bytes(ctx.get(CTX_HEADER..).unwrap_or(&[])) else {
            return Ok(());
        };
        let fid = FileId {
            volatile: le64(ctx, 8),
            persistent: le64(ctx, 16),
        };
        let len = le32(ctx, 24);
        let mut buf = [0u8; HEADER_LEN + 64];
        let n = match done.kind {
            // RDMA Write finished: a READ's data is at the client.
            RdmaKind::Write => {
                let r = ReadResponseRepr {
                    data: &[],
                    data_remaining: len,
                    flags: 0,
                };
                emit_message(&h, &r, &mut buf)
            }
            // RDMA Read finished: a WRITE's data is here.
            RdmaKind::Read => {
                let name = match c.opens.get(&fid.volatile) {
                    Some(o) if o.persistent == fid.persistent => o.name.clone(),
                    _ => None,
                };
                let st = match name {
                    Some(n) => self
                        .shared
                        .store
                        .write(&n, le64(ctx, 32), done.data)
                        .err()
                        .map(store_status),
                    None => Some(STATUS_FILE_CLOSED),
                };
                match st {
                    None => emit_message(
                        &h,
                        &WriteResponseRepr {
                            count: done.data.len() as u32,
                        },
                        &mut buf,
                    ),
                    Some(st) => {
                        h.status = st;
                        emit_message(&h, &ErrorResponseRepr::EMPTY, &mut buf)
                    }
                }
            }
        };
        let Ok(n) = n else { return Ok(()) };
        let fill = |b: &mut [u8]| b.copy_from_slice(&buf[..n]);
        if ctx[0] == 1 {
            out.reply_with_invalidate(n, le32(ctx, 4), fill)
        } else {
            out.reply(n, fill)
        }
    }

    fn on_close(&mut self, conn: ConnId) {
        self.conns.remove(&conn);
    }
}
