//! The file-system commands of the `smb2` upper layer end to end:
//! `smbdirectd serve --provider soft --upper smb2` as a child process, once
//! on the memory store and once on a directory store, driven by a
//! hand-built SMB2 client (messages from `smbdirect_protocol::smb2` reprs).
//!
//! Covered: QUERY_DIRECTORY of a thousand files in small pages, with a
//! pattern, SMB2_RETURN_SINGLE_ENTRY and SMB2_RESTART_SCANS ([MS-SMB2]
//! 3.3.5.18); QUERY_INFO of files, directories and the volume, alone and
//! compounded the way Linux cifs stats a path (3.3.5.20); SET_INFO of
//! times, attributes, end of file, rename and disposition (3.3.5.21) and
//! CREATE's FILE_DELETE_ON_CLOSE (3.3.5.9); LOCK between two connections
//! (3.3.5.14); the MxAc and QFid create contexts (3.3.5.9.5, 3.3.5.9.9);
//! FSCTL_QUERY_NETWORK_INTERFACE_INFO and FSCTL_DFS_GET_REFERRALS
//! (3.3.5.15.11, 3.3.5.15.2).

mod common;
use common::*;

use smbdirect_dataplane::client::{Client, ClientError};
use smbdirect_dataplane::provider::soft::SoftProvider;
use smbdirect_dataplane::provider::{MemoryRegion, Provider};
use smbdirect_hugepages::{Backing, BufferPool, PoolConfig, SizeClass, SliceAllocator};
use smbdirect_protocol::ntstatus::*;
use smbdirect_protocol::smb2::fscc::*;
use smbdirect_protocol::smb2::*;
use smbdirect_protocol::smbd::SmbdConfig;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long a response may take before a test fails.
const REPLY_WAIT: Duration = Duration::from_secs(20);
/// FILE_ALL_ACCESS.
const FILE_ALL_ACCESS: u32 = 0x001F_01FF;

fn cfg() -> SmbdConfig {
    SmbdConfig {
        receive_credit_max: 32,
        send_credit_target: 32,
        ..SmbdConfig::default()
    }
}

/// A directory of this test run, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "smbdirectd-fs-{}-{tag}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create a temporary directory");
        TempDir(p)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Which store the daemon serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mem,
    Dir,
}

/// The daemon under test and, for a directory store, its directory; a
/// failing test shows what the daemon said.
struct Server {
    d: Option<Daemon>,
    port: u16,
    kind: Kind,
    dir: Option<TempDir>,
}

impl Server {
    fn start(kind: Kind) -> Server {
        let port = free_port();
        let dir = (kind == Kind::Dir).then(|| TempDir::new("store"));
        let store = dir.as_ref().map_or("mem".to_string(), |d| {
            d.path().to_str().unwrap().to_string()
        });
        let args = ["--upper", "smb2", "--store", &store, "--store-size", "64M"];
        Server {
            d: Some(spawn(port, &args)),
            port,
            kind,
            dir,
        }
    }

    /// Where the directory store keeps `name` (`\`-separated).
    fn on_disk(&self, name: &str) -> Option<PathBuf> {
        self.dir
            .as_ref()
            .map(|d| d.path().join(name.replace('\\', "/")))
    }

    fn stop(mut self) {
        let d = self.d.take().expect("daemon running");
        terminate(d);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let (true, Some(d)) = (std::thread::panicking(), &self.d) {
            eprintln!(
                "daemon ({:?} store) stderr:\n{}",
                self.kind,
                d.stderr.lock().unwrap()
            );
        }
    }
}

/// The clients' memory: one pool registered with the soft provider, one
/// slice per connection.
struct Side {
    provider: SoftProvider,
    _pool: BufferPool,
    mr: MemoryRegion,
    slices: Vec<SliceAllocator>,
}

impl Side {
    fn new(slices: usize) -> Side {
        let provider = SoftProvider::new().unwrap();
        let pool = PoolConfig::new(slices * (8 << 20), slices)
            .class(SizeClass::new("send", 1364).per_slice(256))
            .class(SizeClass::new("receive", 8192).per_slice(64))
            .class(SizeClass::new("mid", 1 << 20).per_slice(4))
            .backing(Backing::SharedMemfd)
            .build()
            .unwrap();
        // SAFETY: the pool outlives the provider's use of it (whole test).
        let mr = unsafe { provider.register_pool(&pool) }.unwrap();
        let slices = (0..slices)
            .rev()
            .map(|i| pool.claim_slice(i).unwrap())
            .collect();
        Side {
            provider,
            _pool: pool,
            mr,
            slices,
        }
    }

    /// A connected client with a session and the `data` share.
    fn client(&mut self, port: u16) -> Raw {
        let alloc = self.slices.pop().expect("a free client pool slice");
        let c = Client::connect(
            &self.provider,
            format!("127.0.0.1:{port}").parse().unwrap(),
            cfg(),
            alloc,
            self.mr,
            Duration::from_secs(10),
        )
        .expect("connect");
        let mut r = Raw {
            c: Some(c),
            next_id: 0,
            credits: 1,
            session: 0,
            tree: 0,
            inbox: VecDeque::new(),
        };
        r.setup();
        r
    }

    fn give_back(&mut self, c: Raw) {
        self.slices.push(c.close());
    }
}

// ---------------------------------------------------------------------------
// The hand-built client

/// One SMB2 message of a response.
struct Part {
    header: HeaderRepr,
    body: Vec<u8>,
}

impl Part {
    fn body(&self) -> ResponseBody<'_> {
        ResponseBody::parse(&self.header, &self.body).expect("response body")
    }

    fn status(&self) -> NtStatus {
        self.header.status
    }

    fn expect(&self, st: NtStatus, what: &str) -> &Part {
        assert_eq!(self.status(), st, "{what}");
        self
    }

    fn output(&self) -> &[u8] {
        match self.body() {
            ResponseBody::QueryInfo(q) => q.output,
            ResponseBody::QueryDirectory(q) => q.output,
            ResponseBody::Ioctl(i) => i.output,
            other => panic!("no output buffer in {other:?}"),
        }
    }
}

/// SMB2 over a bare SMB Direct [`Client`], tracking the credits granted.
struct Raw {
    c: Option<Client<SoftProvider>>,
    next_id: u64,
    credits: u32,
    session: u64,
    tree: u32,
    inbox: VecDeque<Vec<Part>>,
}

impl Raw {
    fn conn(&mut self) -> &mut Client<SoftProvider> {
        self.c.as_mut().expect("connected")
    }

    fn close(mut self) -> SliceAllocator {
        self.c
            .take()
            .expect("connected")
            .close(Duration::from_secs(2))
    }

    /// The next request header (one credit, asks for 64 more).
    fn header(&mut self, command: Command, charge: u16) -> HeaderRepr {
        let n = u32::from(charge.max(1));
        assert!(self.credits >= n, "out of credits for {command:?}");
        self.credits -= n;
        let mut h = HeaderRepr::request(command, self.next_id);
        self.next_id += u64::from(n);
        h.credit_charge = charge;
        h.credit = 64;
        h.session_id = self.session;
        h.id = HeaderId::Sync {
            process_id: 0xFEFF,
            tree_id: self.tree,
        };
        h
    }

    /// The next message from the server, as its SMB2 messages.
    fn recv(&mut self) -> Result<Vec<Part>, ClientError> {
        let deadline = Instant::now() + REPLY_WAIT;
        while self.inbox.is_empty() {
            let inbox = &mut self.inbox;
            let c = self.c.as_mut().expect("connected");
            let progress = c.step(&mut |m, _token| {
                let parts = compound(m)
                    .map(|msg| {
                        let msg = msg.expect("a well-formed response");
                        assert!(msg.header().is_response());
                        Part {
                            header: *msg.header(),
                            body: msg.body().to_vec(),
                        }
                    })
                    .collect();
                inbox.push_back(parts);
            })?;
            if self.inbox.is_empty() {
                if Instant::now() > deadline {
                    return Err(ClientError::Timeout("a message"));
                }
                if !progress {
                    std::thread::yield_now();
                }
            }
        }
        let r = self.inbox.pop_front().expect("a queued message");
        self.credits += r.iter().map(|p| u32::from(p.header.credit)).sum::<u32>();
        Ok(r)
    }

    /// Sends a compound of requests (each after the first related when
    /// `related`), returns the responses in order.
    fn compound(&mut self, reqs: &[(Command, &dyn Smb2Body)], related: bool) -> Vec<Part> {
        let mut buf = vec![0u8; 1 << 16];
        let mut w = CompoundWriter::new(&mut buf);
        let mut ids = Vec::new();
        for (i, (command, body)) in reqs.iter().enumerate() {
            let mut h = self.header(*command, 1);
            if related && i > 0 {
                h.flags |= HeaderFlags::RELATED_OPERATIONS;
            }
            ids.push(h.message_id);
            w.push(&h, *body).expect("emit");
        }
        let n = w.finish();
        self.conn().send(&buf[..n]).expect("send");
        let mut parts = Vec::new();
        while parts.len() < reqs.len() {
            parts.extend(self.recv().expect("responses"));
        }
        for (p, (id, (command, _))) in parts.iter().zip(ids.iter().zip(reqs)) {
            assert_eq!((p.header.message_id, p.header.command), (*id, *command));
        }
        parts
    }

    fn call<B: Smb2Body>(&mut self, command: Command, charge: u16, body: &B) -> Part {
        let h = self.header(command, charge);
        let mut buf = vec![0u8; HEADER_LEN + body.buffer_len()];
        let n = emit_message(&h, body, &mut buf).expect("emit");
        self.conn().send(&buf[..n]).expect("send");
        let mut r = self
            .recv()
            .unwrap_or_else(|e| panic!("response to {command:?}: {e}"));
        assert_eq!(r.len(), 1, "one response to {command:?}");
        let p = r.pop().unwrap();
        assert_eq!(p.header.message_id, h.message_id);
        assert_eq!(p.header.command, command);
        p
    }

    /// NEGOTIATE 3.1.1, an anonymous SESSION_SETUP, TREE_CONNECT to `data`.
    fn setup(&mut self) {
        let salt = [9u8; 32];
        let hashes = [HashAlgorithm::SHA_512.0];
        let ctxs = [NegotiateContext::PreauthIntegrity(
            PreauthIntegrityCapabilities {
                hash_algorithms: U16Array::new(&hashes),
                salt: &salt,
            },
        )];
        let dialects = [Dialect::SMB_3_1_1.0];
        let neg = NegotiateRequestRepr {
            security_mode: SecurityMode::SIGNING_ENABLED,
            capabilities: Capabilities::LARGE_MTU,
            client_guid: Guid::from_bytes([0x42; 16]),
            dialects: U16Array::new(&dialects),
            negotiate_contexts: NegotiateContextList::new(&ctxs),
        };
        self.call(Command::Negotiate, 0, &neg)
            .expect(STATUS_SUCCESS, "NEGOTIATE");
        let ss = SessionSetupRequestRepr {
            flags: SessionSetupFlags::empty(),
            security_mode: SecurityMode::SIGNING_ENABLED,
            capabilities: Capabilities::empty(),
            channel: 0,
            previous_session_id: 0,
            security_buffer: &[],
        };
        let r = self.call(Command::SessionSetup, 1, &ss);
        r.expect(STATUS_SUCCESS, "SESSION_SETUP");
        self.session = r.header.session_id;
        let tc = TreeConnectRequestRepr {
            flags: TreeConnectFlags::empty(),
            path: Utf16Str::new("\\\\127.0.0.1\\data"),
        };
        let r = self.call(Command::TreeConnect, 1, &tc);
        r.expect(STATUS_SUCCESS, "TREE_CONNECT");
        self.tree = r.header.tree_id().expect("a SYNC response");
    }

    fn create_with(
        &mut self,
        name: &str,
        disposition: CreateDisposition,
        options: CreateOptions,
        contexts: &[CreateContext<'_>],
    ) -> Part {
        let req = create_req(name, disposition, options, contexts);
        self.call(Command::Create, 1, &req)
    }

    fn try_open(
        &mut self,
        name: &str,
        disposition: CreateDisposition,
        options: CreateOptions,
    ) -> Result<FileId, NtStatus> {
        let r = self.create_with(name, disposition, options, &[]);
        match r.body() {
            ResponseBody::Create(c) if r.status() == STATUS_SUCCESS => Ok(c.file_id),
            _ => Err(r.status()),
        }
    }

    /// Opens or creates a file.
    fn file(&mut self, name: &str) -> FileId {
        self.try_open(
            name,
            CreateDisposition::OPEN_IF,
            CreateOptions::NON_DIRECTORY_FILE,
        )
        .unwrap_or_else(|st| panic!("open file {name}: {st}"))
    }

    /// Opens or creates a directory.
    fn dir(&mut self, name: &str) -> FileId {
        self.try_open(
            name,
            CreateDisposition::OPEN_IF,
            CreateOptions::DIRECTORY_FILE,
        )
        .unwrap_or_else(|st| panic!("open directory {name}: {st}"))
    }

    fn close_fid(&mut self, fid: FileId) {
        let req = CloseRequestRepr {
            flags: CloseFlags::empty(),
            file_id: fid,
        };
        self.call(Command::Close, 1, &req)
            .expect(STATUS_SUCCESS, "CLOSE");
    }

    /// Creates `name` and closes it in one related compound.
    fn touch(&mut self, name: &str) {
        let create = create_req(
            name,
            CreateDisposition::CREATE,
            CreateOptions::NON_DIRECTORY_FILE,
            &[],
        );
        let close = CloseRequestRepr {
            flags: CloseFlags::empty(),
            file_id: FileId::ANY,
        };
        let r = self.compound(
            &[
                (Command::Create, &create as &dyn Smb2Body),
                (Command::Close, &close),
            ],
            true,
        );
        r[0].expect(STATUS_SUCCESS, name);
        r[1].expect(STATUS_SUCCESS, name);
    }

    fn write(&mut self, fid: FileId, offset: u64, data: &[u8]) {
        let req = WriteRequestRepr {
            offset,
            file_id: fid,
            channel: Channel::None,
            remaining_bytes: 0,
            flags: WriteFlags::empty(),
            data,
            channel_info: ChannelInfo::descriptors(&[]),
        };
        let charge = HeaderRepr::credit_charge_for(data.len() as u64);
        self.call(Command::Write, charge, &req)
            .expect(STATUS_SUCCESS, "WRITE");
    }

    fn read(&mut self, fid: FileId, offset: u64, length: u32) -> Vec<u8> {
        let req = ReadRequestRepr {
            padding: 0x50,
            flags: ReadFlags::empty(),
            length,
            offset,
            file_id: fid,
            minimum_count: 0,
            channel: Channel::None,
            remaining_bytes: 0,
            channel_info: ChannelInfo::descriptors(&[]),
        };
        let charge = HeaderRepr::credit_charge_for(u64::from(length));
        let r = self.call(Command::Read, charge, &req);
        r.expect(STATUS_SUCCESS, "READ");
        match r.body() {
            ResponseBody::Read(rd) => rd.data.to_vec(),
            _ => panic!("not a READ response"),
        }
    }

    fn query_info(&mut self, fid: FileId, info_type: InfoType, class: u8, out_len: u32) -> Part {
        self.call(
            Command::QueryInfo,
            1,
            &query_info_req(fid, info_type, class, out_len),
        )
    }

    /// A FILE class, which must succeed.
    fn file_info(&mut self, fid: FileId, class: FileInfoClass) -> Vec<u8> {
        let r = self.query_info(fid, InfoType::FILE, class.0, 65536);
        r.expect(STATUS_SUCCESS, &format!("QUERY_INFO {class:?}"));
        r.output().to_vec()
    }

    fn basic(&mut self, fid: FileId) -> FileBasicInformationRepr {
        FileBasicInformationRepr::from_bytes(
            &self.file_info(fid, FileInfoClass::FILE_BASIC_INFORMATION),
        )
        .unwrap()
    }

    fn standard(&mut self, fid: FileId) -> FileStandardInformationRepr {
        FileStandardInformationRepr::from_bytes(
            &self.file_info(fid, FileInfoClass::FILE_STANDARD_INFORMATION),
        )
        .unwrap()
    }

    /// FileAllInformation's name.
    fn name_of(&mut self, fid: FileId) -> String {
        let b = self.file_info(fid, FileInfoClass::FILE_ALL_INFORMATION);
        FileAllInformationRepr::from_bytes(&b)
            .unwrap()
            .file_name
            .decode()
            .unwrap()
    }

    fn set_info(&mut self, fid: FileId, class: FileInfoClass, data: &[u8]) -> NtStatus {
        let req = SetInfoRequestRepr {
            info_type: InfoType::FILE,
            file_info_class: class.0,
            data,
            additional_information: 0,
            file_id: fid,
        };
        self.call(Command::SetInfo, 1, &req).status()
    }

    fn rename(&mut self, fid: FileId, to: &str, replace: bool) -> NtStatus {
        let n = FileRenameInformationRepr {
            replace_if_exists: replace,
            root_directory: 0,
            file_name: Utf16Str::new(to),
        };
        let mut b = vec![0u8; n.buffer_len()];
        n.emit(&mut b).unwrap();
        self.set_info(fid, FileInfoClass::FILE_RENAME_INFORMATION, &b)
    }

    fn dispose(&mut self, fid: FileId, delete: bool) -> NtStatus {
        let d = FileDispositionInformationRepr {
            delete_pending: delete,
        };
        self.set_info(
            fid,
            FileInfoClass::FILE_DISPOSITION_INFORMATION,
            &d.to_bytes(),
        )
    }

    fn query_dir(
        &mut self,
        fid: FileId,
        flags: QueryDirectoryFlags,
        pattern: &str,
        out_len: u32,
    ) -> Part {
        let req = QueryDirectoryRequestRepr {
            file_information_class: FileInfoClass::FILE_ID_BOTH_DIRECTORY_INFORMATION,
            flags,
            file_index: 0,
            file_id: fid,
            file_name: Utf16Str::new(pattern),
            output_buffer_length: out_len,
        };
        self.call(Command::QueryDirectory, 1, &req)
    }

    /// Every name a full enumeration returns (fresh open, pages of
    /// `out_len` bytes), with the pages it took.
    fn list(&mut self, dir: &str, pattern: &str, out_len: u32) -> (Vec<String>, usize) {
        let fid = self.dir(dir);
        let mut names = Vec::new();
        let mut pages = 0;
        loop {
            let r = self.query_dir(fid, QueryDirectoryFlags::empty(), pattern, out_len);
            if r.status() == STATUS_NO_MORE_FILES {
                break;
            }
            r.expect(STATUS_SUCCESS, "QUERY_DIRECTORY page");
            assert!(r.output().len() <= out_len as usize);
            pages += 1;
            names.extend(entries(r.output()).into_iter().map(|e| e.0));
        }
        self.close_fid(fid);
        (names, pages)
    }

    fn lock(&mut self, fid: FileId, elems: &[LockElement]) -> NtStatus {
        let req = LockRequestRepr {
            lock_sequence: 0,
            file_id: fid,
            locks: LockElements::new(elems),
        };
        self.call(Command::Lock, 1, &req).status()
    }

    fn ioctl(&mut self, fid: FileId, code: u32, input: &[u8]) -> Part {
        let req = IoctlRequestRepr::fsctl(code, fid, input, 65536);
        self.call(Command::Ioctl, 1, &req)
    }
}

fn create_req<'a>(
    name: &'a str,
    disposition: CreateDisposition,
    options: CreateOptions,
    contexts: &'a [CreateContext<'a>],
) -> CreateRequestRepr<'a> {
    CreateRequestRepr {
        security_flags: 0,
        requested_oplock_level: OplockLevel::NONE,
        impersonation_level: ImpersonationLevel::IMPERSONATION,
        smb_create_flags: 0,
        desired_access: AccessMask::GENERIC_READ | AccessMask::GENERIC_WRITE | AccessMask::DELETE,
        file_attributes: FileAttributes::NORMAL,
        share_access: ShareAccess::READ | ShareAccess::WRITE | ShareAccess::DELETE,
        create_disposition: disposition,
        create_options: options,
        name: Utf16Str::new(name),
        create_contexts: CreateContextList::new(contexts),
    }
}

fn query_info_req(
    fid: FileId,
    info_type: InfoType,
    class: u8,
    out_len: u32,
) -> QueryInfoRequestRepr<'static> {
    QueryInfoRequestRepr {
        info_type,
        file_info_class: class,
        output_buffer_length: out_len,
        input: &[],
        additional_information: 0,
        flags: QueryInfoFlags::empty(),
        file_id: fid,
    }
}

/// (name, attributes, file id, end of file) of each entry of a
/// FileIdBothDirectoryInformation buffer.
fn entries(out: &[u8]) -> Vec<(String, FileAttributes, u64, u64)> {
    DirectoryEntryIter::new(DirectoryInfoClass::IdBothDirectory, out)
        .map(|e| {
            let e = e.expect("a well-formed entry");
            (
                e.file_name.decode().unwrap(),
                e.file_attributes,
                e.file_id,
                e.end_of_file,
            )
        })
        .collect()
}

/// Waits up to 10 s for `ok`.
fn eventually(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `body` against a daemon on the memory store, then on a directory
/// store.
fn on_both_stores(clients: usize, body: impl Fn(&Server, &mut Side)) {
    let _serial = serial();
    for kind in [Kind::Mem, Kind::Dir] {
        let s = Server::start(kind);
        let mut side = Side::new(clients);
        body(&s, &mut side);
        s.stop();
    }
}

// ---------------------------------------------------------------------------
// QUERY_DIRECTORY

#[test]
fn query_directory_pages_a_thousand_files_with_patterns_single_entries_and_restarts() {
    on_both_stores(1, |s, side| {
        let mut c = side.client(s.port);
        let d = c.dir("big");
        c.close_fid(d);
        for i in 0..1000 {
            let ext = if i % 2 == 0 { "txt" } else { "dat" };
            c.touch(&format!("big\\f{i:04}.{ext}"));
        }
        c.dir("big\\sub");

        // Small pages: every name exactly once, "." and ".." included.
        let (names, pages) = c.list("big", "*", 2048);
        assert!(pages > 20, "{pages} pages of 2 KiB");
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for n in &names {
            *seen.entry(n).or_default() += 1;
        }
        assert_eq!(names.len(), 1003, "1000 files, sub, . and ..");
        assert!(seen.values().all(|&n| n == 1), "a name came twice");
        assert_eq!(&names[..2], [".", ".."]);
        for i in 0..1000 {
            let ext = if i % 2 == 0 { "txt" } else { "dat" };
            assert!(seen.contains_key(format!("f{i:04}.{ext}").as_str()));
        }

        // A pattern (case-insensitive) and an empty one (= "*").
        let (txt, _) = c.list("big", "*.TXT", 4096);
        assert_eq!(txt.len(), 500);
        assert!(txt.iter().all(|n| n.ends_with(".txt")));
        let (q, _) = c.list("big", "f00?0.*", 65536);
        assert_eq!(q.len(), 10, "{q:?}");
        let (all, _) = c.list("big", "", 65536);
        assert_eq!(all.len(), 1003);

        // Attributes and ids of the entries.
        let fid = c.dir("big");
        let r = c.query_dir(fid, QueryDirectoryFlags::empty(), "sub", 4096);
        let e = entries(r.expect(STATUS_SUCCESS, "sub").output());
        assert_eq!(e.len(), 1);
        assert!(e[0].1.contains(FileAttributes::DIRECTORY));
        let sub = c.dir("big\\sub");
        let internal = c.file_info(sub, FileInfoClass::FILE_INTERNAL_INFORMATION);
        assert_eq!(
            FileInternalInformationRepr::from_bytes(&internal)
                .unwrap()
                .index_number,
            e[0].2
        );
        c.close_fid(sub);
        // The pattern of the first query stays: a later one is ignored.
        c.query_dir(fid, QueryDirectoryFlags::empty(), "*", 4096)
            .expect(STATUS_NO_MORE_FILES, "after the only match");

        // RETURN_SINGLE_ENTRY and RESTART_SCANS.
        let single = QueryDirectoryFlags::RETURN_SINGLE_ENTRY;
        let restart = QueryDirectoryFlags::RESTART_SCANS;
        let r = c.query_dir(fid, restart | single, "*", 65536);
        let e = entries(r.expect(STATUS_SUCCESS, "restart, single").output());
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].0, ".");
        let r = c.query_dir(fid, single, "*", 65536);
        assert_eq!(entries(r.output())[0].0, "..");
        let r = c.query_dir(fid, QueryDirectoryFlags::empty(), "*", 65536);
        let page = entries(r.expect(STATUS_SUCCESS, "next page").output());
        assert!(page.len() > 100 && page[0].0 != "." && page[0].0 != "..");
        let r = c.query_dir(fid, restart, "*", 65536);
        assert_eq!(entries(r.output())[0].0, ".", "restarted");
        // REOPEN takes a new pattern.
        let r = c.query_dir(fid, QueryDirectoryFlags::REOPEN, "f0999.dat", 65536);
        let e = entries(r.expect(STATUS_SUCCESS, "reopen").output());
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].0, "f0999.dat");

        // Nothing matches: STATUS_NO_SUCH_FILE first, then NO_MORE_FILES.
        let r = c.query_dir(fid, QueryDirectoryFlags::REOPEN, "nothing*", 65536);
        r.expect(STATUS_NO_SUCH_FILE, "no match");
        c.query_dir(fid, QueryDirectoryFlags::empty(), "nothing*", 65536)
            .expect(STATUS_NO_MORE_FILES, "no match, again");
        // A buffer below one entry's fixed part; one too small for the
        // first entry's name.
        c.query_dir(fid, restart, "*", 50)
            .expect(STATUS_INFO_LENGTH_MISMATCH, "50-byte buffer");
        let r = c.query_dir(fid, QueryDirectoryFlags::REOPEN, "f0000.txt", 110);
        r.expect(STATUS_BUFFER_OVERFLOW, "the first entry does not fit");
        assert!(r.output().is_empty());
        let r = c.query_dir(fid, QueryDirectoryFlags::empty(), "*", 4096);
        assert_eq!(entries(r.output())[0].0, "f0000.txt", "it stays next");
        c.close_fid(fid);

        // A file is not a directory.
        let f = c.file("big\\f0000.txt");
        c.query_dir(f, QueryDirectoryFlags::empty(), "*", 4096)
            .expect(STATUS_INVALID_PARAMETER, "QUERY_DIRECTORY on a file");
        c.close_fid(f);
        side.give_back(c);
    });
}

// ---------------------------------------------------------------------------
// QUERY_INFO

#[test]
fn query_info_describes_files_directories_and_the_volume() {
    on_both_stores(1, |s, side| {
        let mut c = side.client(s.port);
        let d = c.dir("qi");
        let f = c.file("qi\\file.bin");
        c.write(f, 0, b"hello");

        // FileAllInformation of the file, and its parts one by one.
        let all = c.file_info(f, FileInfoClass::FILE_ALL_INFORMATION);
        let all = FileAllInformationRepr::from_bytes(&all).unwrap();
        assert_eq!(all.file_name.decode().unwrap(), "\\qi\\file.bin");
        assert_eq!(all.standard.end_of_file, 5);
        assert!(!all.standard.directory && !all.standard.delete_pending);
        assert!(all.standard.number_of_links >= 1);
        assert!(!all
            .basic
            .file_attributes
            .contains(FileAttributes::DIRECTORY));
        assert!(all.basic.last_write_time > 0);
        assert_eq!(all.access.access_flags.bits(), FILE_ALL_ACCESS);
        assert_eq!(c.basic(f), all.basic);
        assert_eq!(c.standard(f), all.standard);
        let internal = c.file_info(f, FileInfoClass::FILE_INTERNAL_INFORMATION);
        assert_eq!(
            FileInternalInformationRepr::from_bytes(&internal).unwrap(),
            all.internal
        );
        assert_ne!(all.internal.index_number, 0);
        let no = c.file_info(f, FileInfoClass::FILE_NETWORK_OPEN_INFORMATION);
        let no = FileNetworkOpenInformationRepr::from_bytes(&no).unwrap();
        assert_eq!(no.end_of_file, 5);
        assert_eq!(no.last_write_time, all.basic.last_write_time);
        let tag = c.file_info(f, FileInfoClass::FILE_ATTRIBUTE_TAG_INFORMATION);
        let tag = FileAttributeTagInformationRepr::from_bytes(&tag).unwrap();
        assert_eq!(tag.file_attributes, all.basic.file_attributes);
        let streams = c.file_info(f, FileInfoClass::FILE_STREAM_INFORMATION);
        let streams: Vec<_> = FileStreamInformationRepr::iter(&streams)
            .map(|e| e.unwrap())
            .collect();
        assert_eq!(streams.len(), 1);
        assert_eq!(streams[0].stream_name.decode().unwrap(), "::$DATA");
        assert_eq!(streams[0].stream_size, 5);
        for class in [
            FileInfoClass::FILE_EA_INFORMATION,
            FileInfoClass::FILE_POSITION_INFORMATION,
            FileInfoClass::FILE_MODE_INFORMATION,
            FileInfoClass::FILE_ALIGNMENT_INFORMATION,
        ] {
            assert!(c.file_info(f, class).iter().all(|&b| b == 0), "{class:?}");
        }

        // The directory.
        let dall = c.file_info(d, FileInfoClass::FILE_ALL_INFORMATION);
        let dall = FileAllInformationRepr::from_bytes(&dall).unwrap();
        assert_eq!(dall.file_name.decode().unwrap(), "\\qi");
        assert!(dall.standard.directory);
        assert!(dall
            .basic
            .file_attributes
            .contains(FileAttributes::DIRECTORY));
        assert_ne!(dall.internal.index_number, all.internal.index_number);
        assert!(c
            .file_info(d, FileInfoClass::FILE_STREAM_INFORMATION)
            .is_empty());
        let root = c.dir("");
        assert_eq!(c.name_of(root), "\\");

        // OutputBufferLength: below the fixed part, and cutting the name.
        let r = c.query_info(f, InfoType::FILE, FileInfoClass::FILE_ALL_INFORMATION.0, 99);
        r.expect(
            STATUS_INFO_LENGTH_MISMATCH,
            "99 bytes of FileAllInformation",
        );
        let r = c.query_info(
            f,
            InfoType::FILE,
            FileInfoClass::FILE_ALL_INFORMATION.0,
            104,
        );
        r.expect(STATUS_BUFFER_OVERFLOW, "a cut name");
        assert_eq!(r.output().len(), 104);
        let r = c.query_info(
            f,
            InfoType::FILE,
            FileInfoClass::FILE_BASIC_INFORMATION.0,
            39,
        );
        r.expect(
            STATUS_INFO_LENGTH_MISMATCH,
            "39 bytes of FileBasicInformation",
        );
        // Classes that are not served.
        c.query_info(
            f,
            InfoType::FILE,
            FileInfoClass::FILE_RENAME_INFORMATION.0,
            4096,
        )
        .expect(STATUS_INVALID_INFO_CLASS, "a SET_INFO class");
        c.query_info(f, InfoType::FILE, 0xEE, 4096)
            .expect(STATUS_INVALID_INFO_CLASS, "an unknown class");
        c.query_info(
            f,
            InfoType::FILE,
            FileInfoClass::FILE_FULL_EA_INFORMATION.0,
            4096,
        )
        .expect(STATUS_NOT_SUPPORTED, "EAs");
        c.query_info(f, InfoType::SECURITY, 0, 4096)
            .expect(STATUS_NOT_SUPPORTED, "a security descriptor");
        c.query_info(f, InfoType::QUOTA, 0, 4096)
            .expect(STATUS_NOT_SUPPORTED, "quotas");

        // The volume.
        let fs = |c: &mut Raw, class: FsInfoClass| {
            let r = c.query_info(root, InfoType::FILESYSTEM, class.0, 4096);
            r.expect(STATUS_SUCCESS, &format!("{class:?}"));
            r.output().to_vec()
        };
        let size = fs(&mut c, FsInfoClass::FILE_FS_FULL_SIZE_INFORMATION);
        let size = FileFsFullSizeInformationRepr::from_bytes(&size).unwrap();
        assert!(size.total_allocation_units > 0);
        assert!(size.actual_available_allocation_units <= size.total_allocation_units);
        assert_eq!(size.bytes_per_sector, 512);
        if s.kind == Kind::Mem {
            let unit = u64::from(size.sectors_per_allocation_unit * size.bytes_per_sector);
            assert_eq!(size.total_allocation_units * unit, 64 << 20);
        }
        let small = fs(&mut c, FsInfoClass::FILE_FS_SIZE_INFORMATION);
        let small = FileFsSizeInformationRepr::from_bytes(&small).unwrap();
        assert_eq!(small.total_allocation_units, size.total_allocation_units);
        let dev = fs(&mut c, FsInfoClass::FILE_FS_DEVICE_INFORMATION);
        assert_eq!(
            FileFsDeviceInformationRepr::from_bytes(&dev)
                .unwrap()
                .device_type,
            FILE_DEVICE_DISK
        );
        let attr = fs(&mut c, FsInfoClass::FILE_FS_ATTRIBUTE_INFORMATION);
        let attr = FileFsAttributeInformationRepr::from_bytes(&attr).unwrap();
        assert_eq!(attr.file_system_name.decode().unwrap(), "NTFS");
        assert_eq!(attr.maximum_component_name_length, 255);
        assert!(attr
            .file_system_attributes
            .contains(FileSystemAttributes::CASE_PRESERVED_NAMES));
        let vol = fs(&mut c, FsInfoClass::FILE_FS_VOLUME_INFORMATION);
        let vol = FileFsVolumeInformationRepr::from_bytes(&vol).unwrap();
        if s.kind == Kind::Mem {
            assert_eq!(vol.volume_label.decode().unwrap(), "mem");
        }
        let sector = fs(&mut c, FsInfoClass::FILE_FS_SECTOR_SIZE_INFORMATION);
        let sector = FileFsSectorSizeInformationRepr::from_bytes(&sector).unwrap();
        assert_eq!(sector.logical_bytes_per_sector, 512);
        let oid = fs(&mut c, FsInfoClass::FILE_FS_OBJECT_ID_INFORMATION);
        assert_eq!(oid.len(), 64);
        c.query_info(root, InfoType::FILESYSTEM, 0xEE, 4096)
            .expect(STATUS_INVALID_INFO_CLASS, "an unknown volume class");

        // Compounded as cifs stats a path: CREATE + QUERY_INFO + CLOSE.
        let create = create_req(
            "qi\\file.bin",
            CreateDisposition::OPEN,
            CreateOptions::empty(),
            &[],
        );
        let query = query_info_req(
            FileId::ANY,
            InfoType::FILE,
            FileInfoClass::FILE_ALL_INFORMATION.0,
            4096,
        );
        let close = CloseRequestRepr {
            flags: CloseFlags::empty(),
            file_id: FileId::ANY,
        };
        let r = c.compound(
            &[
                (Command::Create, &create as &dyn Smb2Body),
                (Command::QueryInfo, &query),
                (Command::Close, &close),
            ],
            true,
        );
        r[1].expect(STATUS_SUCCESS, "compounded QUERY_INFO");
        let stat = FileAllInformationRepr::from_bytes(r[1].output()).unwrap();
        assert_eq!(stat.standard.end_of_file, 5);
        assert_eq!(stat.internal, all.internal);
        r[2].expect(STATUS_SUCCESS, "compounded CLOSE");

        for fid in [f, d, root] {
            c.close_fid(fid);
        }
        side.give_back(c);
    });
}

// ---------------------------------------------------------------------------
// SET_INFO and delete on close

/// A FILETIME: 2019-11-14 22:13:20 UTC.
const T0: u64 = 132_182_000_000_000_000;

#[test]
fn set_info_changes_times_attributes_size_names_and_dispositions() {
    on_both_stores(1, |s, side| {
        let mut c = side.client(s.port);
        c.dir("si");
        let f = c.file("si\\a.txt");
        c.write(f, 0, b"0123456789");

        // FileBasicInformation: times (0 leaves one alone) and attributes.
        let before = c.basic(f);
        let set = FileBasicInformationRepr {
            creation_time: T0,
            last_access_time: T0 + 10_000_000,
            last_write_time: T0 + 20_000_000,
            change_time: T0 + 30_000_000,
            file_attributes: FileAttributes::empty(),
        };
        assert_eq!(
            c.set_info(f, FileInfoClass::FILE_BASIC_INFORMATION, &set.to_bytes()),
            STATUS_SUCCESS
        );
        let after = c.basic(f);
        assert_eq!(after.last_write_time, T0 + 20_000_000);
        assert_eq!(after.last_access_time, T0 + 10_000_000);
        if s.kind == Kind::Mem {
            assert_eq!(after.creation_time, T0);
            assert_eq!(after.change_time, T0 + 30_000_000);
        }
        assert_eq!(after.file_attributes, before.file_attributes);
        let only_write = FileBasicInformationRepr {
            last_write_time: T0 + 40_000_000,
            ..FileBasicInformationRepr::default()
        };
        c.set_info(
            f,
            FileInfoClass::FILE_BASIC_INFORMATION,
            &only_write.to_bytes(),
        );
        let after = c.basic(f);
        assert_eq!(after.last_write_time, T0 + 40_000_000);
        assert_eq!(after.last_access_time, T0 + 10_000_000, "0: unchanged");
        assert_eq!(
            c.set_info(f, FileInfoClass::FILE_BASIC_INFORMATION, &[0; 39]),
            STATUS_INFO_LENGTH_MISMATCH
        );
        let dir_attr = FileBasicInformationRepr {
            file_attributes: FileAttributes::DIRECTORY,
            ..FileBasicInformationRepr::default()
        };
        assert_eq!(
            c.set_info(
                f,
                FileInfoClass::FILE_BASIC_INFORMATION,
                &dir_attr.to_bytes()
            ),
            STATUS_INVALID_PARAMETER
        );

        // FileEndOfFileInformation: truncate, then extend with zeros.
        let eof = |n: u64| FileEndOfFileInformationRepr { end_of_file: n }.to_bytes();
        assert_eq!(
            c.set_info(f, FileInfoClass::FILE_END_OF_FILE_INFORMATION, &eof(4)),
            STATUS_SUCCESS
        );
        assert_eq!(c.standard(f).end_of_file, 4);
        assert_eq!(c.read(f, 0, 100), b"0123");
        c.set_info(f, FileInfoClass::FILE_END_OF_FILE_INFORMATION, &eof(8192));
        assert_eq!(c.standard(f).end_of_file, 8192);
        let data = c.read(f, 0, 8192);
        assert_eq!(&data[..4], b"0123");
        assert!(data[4..].iter().all(|&b| b == 0));
        let alloc = FileAllocationInformationRepr {
            allocation_size: 1 << 20,
        };
        assert_eq!(
            c.set_info(
                f,
                FileInfoClass::FILE_ALLOCATION_INFORMATION,
                &alloc.to_bytes()
            ),
            STATUS_SUCCESS
        );
        assert_eq!(
            c.standard(f).end_of_file,
            8192,
            "allocation changes no size"
        );
        if let Some(p) = s.on_disk("si\\a.txt") {
            assert_eq!(std::fs::metadata(p).unwrap().len(), 8192);
        }

        // FileRenameInformation: refused onto an existing name unless
        // replacing; the Open follows its file.
        let b = c.file("si\\b.txt");
        c.close_fid(b);
        assert_eq!(
            c.rename(f, "si\\b.txt", false),
            STATUS_OBJECT_NAME_COLLISION
        );
        assert_eq!(c.rename(f, "si\\b.txt", true), STATUS_SUCCESS);
        assert_eq!(c.name_of(f), "\\si\\b.txt");
        assert_eq!(
            c.try_open("si\\a.txt", CreateDisposition::OPEN, CreateOptions::empty()),
            Err(STATUS_OBJECT_NAME_NOT_FOUND)
        );
        assert_eq!(c.rename(f, "si\\c.txt", false), STATUS_SUCCESS);
        assert_eq!(
            c.rename(f, "nowhere\\c.txt", false),
            STATUS_OBJECT_PATH_NOT_FOUND
        );
        assert_eq!(
            c.rename(f, "si\\bad:name", false),
            STATUS_OBJECT_NAME_INVALID
        );
        let rooted = FileRenameInformationRepr {
            replace_if_exists: false,
            root_directory: 7,
            file_name: Utf16Str::new("si\\d.txt"),
        };
        let mut buf = vec![0u8; rooted.buffer_len()];
        rooted.emit(&mut buf).unwrap();
        assert_eq!(
            c.set_info(f, FileInfoClass::FILE_RENAME_INFORMATION, &buf),
            STATUS_INVALID_PARAMETER
        );
        // A directory renamed: the Open of a file beneath it follows.
        let si = c.dir("si");
        assert_eq!(c.rename(si, "si2", false), STATUS_SUCCESS);
        assert_eq!(c.name_of(si), "\\si2");
        assert_eq!(c.name_of(f), "\\si2\\c.txt");
        c.close_fid(si);
        if let Some(p) = s.on_disk("si2\\c.txt") {
            assert_eq!(std::fs::metadata(p).unwrap().len(), 8192);
        }
        let (names, _) = c.list("si2", "*", 4096);
        assert_eq!(names, [".", "..", "c.txt"]);

        // FileDispositionInformation: delete pending until the last close;
        // undone before it, the file stays.
        assert_eq!(c.dispose(f, true), STATUS_SUCCESS);
        assert!(c.standard(f).delete_pending);
        assert_eq!(c.dispose(f, false), STATUS_SUCCESS);
        assert!(!c.standard(f).delete_pending);
        c.close_fid(f);
        let f = c.file("si2\\c.txt");
        assert_eq!(c.dispose(f, true), STATUS_SUCCESS);
        assert_eq!(
            c.try_open(
                "si2\\c.txt",
                CreateDisposition::OPEN,
                CreateOptions::empty()
            ),
            Err(STATUS_DELETE_PENDING)
        );
        c.close_fid(f);
        // (A directory store unlinks in the background after the close.)
        eventually("the deleted file is gone", || {
            c.try_open(
                "si2\\c.txt",
                CreateDisposition::OPEN,
                CreateOptions::empty(),
            ) == Err(STATUS_OBJECT_NAME_NOT_FOUND)
        });
        if let Some(p) = s.on_disk("si2\\c.txt") {
            eventually("the deleted file is gone from the disk", || !p.exists());
        }

        // A read-only file cannot be deleted until the attribute goes.
        let ro = c.file("si2\\ro.txt");
        let readonly = FileBasicInformationRepr {
            file_attributes: FileAttributes::READONLY,
            ..FileBasicInformationRepr::default()
        };
        c.set_info(
            ro,
            FileInfoClass::FILE_BASIC_INFORMATION,
            &readonly.to_bytes(),
        );
        assert!(c
            .basic(ro)
            .file_attributes
            .contains(FileAttributes::READONLY));
        assert_eq!(c.dispose(ro, true), STATUS_CANNOT_DELETE);
        let normal = FileBasicInformationRepr {
            file_attributes: FileAttributes::NORMAL,
            ..FileBasicInformationRepr::default()
        };
        c.set_info(
            ro,
            FileInfoClass::FILE_BASIC_INFORMATION,
            &normal.to_bytes(),
        );
        assert!(!c
            .basic(ro)
            .file_attributes
            .contains(FileAttributes::READONLY));
        assert_eq!(c.dispose(ro, true), STATUS_SUCCESS);
        c.close_fid(ro);

        // Directories: not while something is in them; the root never.
        c.touch("si2\\keep.txt");
        let d = c.dir("si2");
        assert_eq!(c.dispose(d, true), STATUS_DIRECTORY_NOT_EMPTY);
        c.close_fid(d);
        let r = c.create_with(
            "si2",
            CreateDisposition::OPEN,
            CreateOptions::DIRECTORY_FILE | CreateOptions::DELETE_ON_CLOSE,
            &[],
        );
        r.expect(STATUS_DIRECTORY_NOT_EMPTY, "CREATE with delete on close");
        let root = c.dir("");
        assert_eq!(c.dispose(root, true), STATUS_CANNOT_DELETE);
        c.close_fid(root);
        // An empty directory opened with FILE_DELETE_ON_CLOSE goes at its
        // close; so does a new file.
        let e = c.dir("si2\\empty");
        c.close_fid(e);
        let r = c.create_with(
            "si2\\empty",
            CreateDisposition::OPEN,
            CreateOptions::DIRECTORY_FILE | CreateOptions::DELETE_ON_CLOSE,
            &[],
        );
        r.expect(STATUS_SUCCESS, "delete-on-close directory");
        let ResponseBody::Create(cr) = r.body() else {
            panic!("not a CREATE response")
        };
        assert!(c.standard(cr.file_id).delete_pending);
        c.close_fid(cr.file_id);
        let r = c.create_with(
            "si2\\temp.txt",
            CreateDisposition::CREATE,
            CreateOptions::NON_DIRECTORY_FILE | CreateOptions::DELETE_ON_CLOSE,
            &[],
        );
        let ResponseBody::Create(cr) = r.body() else {
            panic!("not a CREATE response")
        };
        c.close_fid(cr.file_id);
        eventually("only keep.txt is left", || {
            c.list("si2", "*", 4096).0 == [".", "..", "keep.txt"]
        });
        side.give_back(c);
    });
}

// ---------------------------------------------------------------------------
// LOCK

fn el(offset: u64, length: u64, flags: LockFlags) -> LockElement {
    LockElement {
        offset,
        length,
        flags,
    }
}

#[test]
fn byte_range_locks_between_two_connections() {
    on_both_stores(2, |s, side| {
        let mut a = side.client(s.port);
        let mut b = side.client(s.port);
        let fa = a.file("locked.bin");
        let fb = b.file("locked.bin");
        let x = LockFlags::EXCLUSIVE | LockFlags::FAIL_IMMEDIATELY;
        let sh = LockFlags::SHARED | LockFlags::FAIL_IMMEDIATELY;
        let un = LockFlags::UNLOCK;

        assert_eq!(a.lock(fa, &[el(0, 100, x)]), STATUS_SUCCESS);
        assert_eq!(b.lock(fb, &[el(50, 10, sh)]), STATUS_LOCK_NOT_GRANTED);
        assert_eq!(b.lock(fb, &[el(99, 1, x)]), STATUS_LOCK_NOT_GRANTED);
        // A blocking lock is not queued: it fails the same way.
        assert_eq!(
            b.lock(fb, &[el(0, 1, LockFlags::EXCLUSIVE)]),
            STATUS_LOCK_NOT_GRANTED
        );
        assert_eq!(b.lock(fb, &[el(100, 10, x)]), STATUS_SUCCESS, "adjacent");
        // I/O is not checked against locks (advisory).
        b.write(fb, 10, b"advisory");
        assert_eq!(b.lock(fb, &[el(100, 10, un)]), STATUS_SUCCESS);
        // Unlock: only the exact range, only its owner.
        assert_eq!(b.lock(fb, &[el(0, 100, un)]), STATUS_RANGE_NOT_LOCKED);
        assert_eq!(a.lock(fa, &[el(0, 50, un)]), STATUS_RANGE_NOT_LOCKED);
        assert_eq!(a.lock(fa, &[el(0, 100, un)]), STATUS_SUCCESS);
        assert_eq!(a.lock(fa, &[el(0, 100, un)]), STATUS_RANGE_NOT_LOCKED);

        // Shared locks share; exclusive ones do not join them.
        assert_eq!(b.lock(fb, &[el(0, 100, sh)]), STATUS_SUCCESS);
        assert_eq!(a.lock(fa, &[el(50, 100, sh)]), STATUS_SUCCESS);
        assert_eq!(a.lock(fa, &[el(0, 10, x)]), STATUS_LOCK_NOT_GRANTED);
        // Several elements: all or nothing.
        assert_eq!(
            a.lock(fa, &[el(1000, 10, x), el(2000, 10, x), el(105, 1, x)]),
            STATUS_LOCK_NOT_GRANTED
        );
        assert_eq!(
            b.lock(fb, &[el(1000, 10, x)]),
            STATUS_SUCCESS,
            "rolled back"
        );
        // Mixed flags: unlock with a lock flag, several without
        // FAIL_IMMEDIATELY.
        assert_eq!(
            a.lock(fa, &[el(0, 1, un | LockFlags::SHARED)]),
            STATUS_INVALID_PARAMETER
        );
        assert_eq!(
            a.lock(
                fa,
                &[
                    el(5000, 1, LockFlags::SHARED),
                    el(6000, 1, LockFlags::SHARED)
                ]
            ),
            STATUS_INVALID_PARAMETER
        );

        // A close releases its Open's locks.
        assert_eq!(a.lock(fa, &[el(3000, 10, x)]), STATUS_SUCCESS);
        assert_eq!(b.lock(fb, &[el(3000, 10, sh)]), STATUS_LOCK_NOT_GRANTED);
        a.close_fid(fa);
        assert_eq!(b.lock(fb, &[el(3000, 10, sh)]), STATUS_SUCCESS);
        // A connection going away releases its locks too.
        let fa = a.file("locked.bin");
        assert_eq!(a.lock(fa, &[el(4000, 10, x)]), STATUS_SUCCESS);
        side.give_back(a);
        let deadline = Instant::now() + Duration::from_secs(10);
        while b.lock(fb, &[el(4000, 10, x)]) != STATUS_SUCCESS {
            assert!(Instant::now() < deadline, "locks outlived their connection");
            std::thread::sleep(Duration::from_millis(20));
        }
        // No locks on directories.
        let d = b.dir("");
        assert_eq!(b.lock(d, &[el(0, 1, x)]), STATUS_INVALID_PARAMETER);
        b.close_fid(d);
        b.close_fid(fb);
        side.give_back(b);
    });
}

// ---------------------------------------------------------------------------
// CREATE contexts and FSCTLs

#[test]
fn create_contexts_and_network_interfaces_are_answered() {
    on_both_stores(1, |s, side| {
        let mut c = side.client(s.port);
        let lease = [0u8; 32];
        let ctxs = [
            CreateContext::new(SMB2_CREATE_QUERY_MAXIMAL_ACCESS_REQUEST, &[]),
            CreateContext::new(SMB2_CREATE_QUERY_ON_DISK_ID, &[]),
            CreateContext::new(SMB2_CREATE_REQUEST_LEASE, &lease),
            CreateContext::new(SMB2_CREATE_DURABLE_HANDLE_REQUEST, &[0; 16]),
        ];
        let r = c.create_with(
            "ctx.bin",
            CreateDisposition::OPEN_IF,
            CreateOptions::NON_DIRECTORY_FILE,
            &ctxs,
        );
        r.expect(STATUS_SUCCESS, "CREATE with contexts");
        let ResponseBody::Create(cr) = r.body() else {
            panic!("not a CREATE response")
        };
        assert_eq!(cr.oplock_level, OplockLevel::NONE);
        let fid = cr.file_id;
        let mx = cr
            .create_contexts
            .find(SMB2_CREATE_QUERY_MAXIMAL_ACCESS_RESPONSE)
            .expect("an MxAc answer");
        let mx = MaximalAccessResponse::parse(mx.data).unwrap();
        assert_eq!(mx.query_status, STATUS_SUCCESS);
        assert_eq!(mx.maximal_access.bits(), FILE_ALL_ACCESS);
        let q = cr
            .create_contexts
            .find(SMB2_CREATE_QUERY_ON_DISK_ID)
            .expect("a QFid answer");
        let q = QueryOnDiskIdResponse::parse(q.data).unwrap();
        assert!(cr.create_contexts.find(SMB2_CREATE_REQUEST_LEASE).is_none());
        assert!(cr
            .create_contexts
            .find(SMB2_CREATE_DURABLE_HANDLE_REQUEST)
            .is_none());
        assert_eq!(cr.create_contexts.len(), 2);
        let internal = c.file_info(fid, FileInfoClass::FILE_INTERNAL_INFORMATION);
        assert_eq!(
            FileInternalInformationRepr::from_bytes(&internal)
                .unwrap()
                .index_number,
            q.disk_file_id
        );
        // The volume id is the share's: the same for another file.
        let r = c.create_with(
            "other.bin",
            CreateDisposition::OPEN_IF,
            CreateOptions::NON_DIRECTORY_FILE,
            &ctxs[1..2],
        );
        let ResponseBody::Create(cr2) = r.body() else {
            panic!("not a CREATE response")
        };
        let q2 = QueryOnDiskIdResponse::parse(
            cr2.create_contexts
                .find(SMB2_CREATE_QUERY_ON_DISK_ID)
                .unwrap()
                .data,
        )
        .unwrap();
        assert_eq!(q2.volume_id, q.volume_id);
        assert_ne!(q2.disk_file_id, q.disk_file_id);
        c.close_fid(cr2.file_id);
        // A malformed MxAc is refused before anything is created.
        let bad = [CreateContext::new(
            SMB2_CREATE_QUERY_MAXIMAL_ACCESS_REQUEST,
            &[1, 2, 3],
        )];
        c.create_with(
            "never.bin",
            CreateDisposition::CREATE,
            CreateOptions::NON_DIRECTORY_FILE,
            &bad,
        )
        .expect(STATUS_INVALID_PARAMETER, "a 3-byte MxAc");
        assert_eq!(
            c.try_open("never.bin", CreateDisposition::OPEN, CreateOptions::empty()),
            Err(STATUS_OBJECT_NAME_NOT_FOUND)
        );

        // FSCTL_QUERY_NETWORK_INTERFACE_INFO: the --listen address.
        let r = c.ioctl(FileId::ANY, FSCTL_QUERY_NETWORK_INTERFACE_INFO, &[]);
        r.expect(STATUS_SUCCESS, "QUERY_NETWORK_INTERFACE_INFO");
        let nics: Vec<_> = NetworkInterfaceInfoList::iter(r.output())
            .map(|e| e.unwrap())
            .collect();
        assert_eq!(nics.len(), 1);
        assert_eq!(
            nics[0].address,
            "127.0.0.1".parse::<std::net::IpAddr>().unwrap()
        );
        assert!(nics[0]
            .capability
            .contains(InterfaceCapability::RDMA_CAPABLE));
        assert_ne!(nics[0].if_index, 0);
        assert!(nics[0].link_speed > 0);
        // These FSCTLs take no open.
        c.ioctl(fid, FSCTL_QUERY_NETWORK_INTERFACE_INFO, &[])
            .expect(STATUS_INVALID_PARAMETER, "with a FileId");
        // Not a DFS server.
        let mut dfs = vec![4, 0];
        dfs.extend(
            "\\127.0.0.1\\data"
                .encode_utf16()
                .flat_map(u16::to_le_bytes),
        );
        dfs.extend([0, 0]);
        c.ioctl(FileId::ANY, FSCTL_DFS_GET_REFERRALS, &dfs)
            .expect(STATUS_FS_DRIVER_REQUIRED, "DFS referral");
        c.ioctl(FileId::ANY, FSCTL_DFS_GET_REFERRALS_EX, &dfs)
            .expect(STATUS_FS_DRIVER_REQUIRED, "DFS referral (EX)");
        c.close_fid(fid);
        side.give_back(c);
    });
}
