//! Storage QoS end to end ([MS-SQOS] over SMB2 IOCTL FSCTL_STORAGE_QOS_CONTROL
//! over SMB Direct): `smbdirectd serve --upper smb2` as a child process, the
//! SMB2 client library, real time. Enforcement bounds (a limited flow never
//! gets more than its limit + 3 %) are correctness checks of the server's
//! token buckets; the accuracy figures themselves come from
//! `smbdirectd bench --workload qos`. Also every MS-SQOS error the wire can
//! reach, one test each, and `qos` subcommands against the running daemon.

mod common;
use common::*;

use smbdirect_dataplane::provider::soft::SoftProvider;
use smbdirect_dataplane::provider::{MemoryRegion, Provider};
use smbdirect_dataplane::smb2::client::{Smb2Client, Smb2ClientOptions, Smb2Error, Transfer};
use smbdirect_hugepages::{Backing, BufferPool, PoolConfig, SizeClass};
use smbdirect_protocol::ntstatus::*;
use smbdirect_protocol::smb2::{CreateDisposition, CreateOptions, Dialect, FileId};
use smbdirect_protocol::smbd::SmbdConfig;
use smbdirect_protocol::sqos::{
    Dialect as QosDialect, FlowStatus, Guid, Options, StorageQosControlRequest,
    StorageQosControlRequestRepr, StorageQosControlResponse, StorageQosControlResponseRepr,
    Utf16Name, FSCTL_STORAGE_QOS_CONTROL,
};
use std::process::Command;
use std::time::{Duration, Instant};

const GOLD: &str = "8d7f0c7e-2f9b-4c58-9a35-1d3c5e6f7a81";
const SHARED: &str = "11111111-2222-3333-4444-555555555555";
const OPEN_ENDED: &str = "22222222-3333-4444-5555-666666666666";
const CAP_1000: &str = "44444444-5555-6666-7777-888888888888";

fn cfg() -> SmbdConfig {
    SmbdConfig {
        receive_credit_max: 64,
        send_credit_target: 64,
        ..SmbdConfig::default()
    }
}

fn client_pool(provider: &SoftProvider) -> (BufferPool, MemoryRegion) {
    let pool = PoolConfig::new(96 << 20, 1)
        .class(SizeClass::new("send", 1364).per_slice(512))
        .class(SizeClass::new("receive", 8192).per_slice(256))
        .class(SizeClass::new("io64k", 65536).per_slice(48))
        .class(SizeClass::new("mid", 1 << 20).per_slice(12))
        .backing(Backing::SharedMemfd)
        .build()
        .unwrap();
    // SAFETY: the pool outlives the provider's use of it (whole test).
    let mr = unsafe { provider.register_pool(&pool) }.unwrap();
    (pool, mr)
}

struct Session {
    c: Smb2Client<SoftProvider>,
    _pool: BufferPool,
}

fn session(provider: &SoftProvider, port: u16) -> Session {
    let (pool, mr) = client_pool(provider);
    let alloc = pool.claim_slice(0).unwrap();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut c = Smb2Client::connect(
        provider,
        addr,
        cfg(),
        alloc,
        mr,
        Duration::from_secs(10),
        Smb2ClientOptions::default(),
    )
    .expect("connect");
    c.negotiate(&[Dialect::SMB_3_1_1]).expect("negotiate");
    c.session_setup_anonymous().expect("session");
    c.tree_connect("data").expect("tree");
    Session { c, _pool: pool }
}

fn policy_file(port: u16) -> String {
    let path = format!("/tmp/smbdirectd-qos-test-{port}.toml");
    std::fs::write(
        &path,
        format!(
            "[[policy]]\nid = \"{GOLD}\"\nname = \"gold\"\ntype = \"dedicated\"\nmin_iops = 1000\n\
             [[policy]]\nid = \"{SHARED}\"\nname = \"shared\"\ntype = \"aggregated\"\nmax_iops = 4000\n\
             [[policy]]\nid = \"{OPEN_ENDED}\"\nname = \"unlimited\"\ntype = \"dedicated\"\n\
             [[policy]]\nid = \"{CAP_1000}\"\nname = \"cap1000\"\ntype = \"dedicated\"\nmax_iops = 1000\n"
        ),
    )
    .unwrap();
    path
}

fn start(extra: &[&str]) -> (Daemon, u16, String) {
    let port = free_port();
    let pf = policy_file(port);
    let mut args = vec![
        "--upper",
        "smb2",
        "--policy-file",
        &pf,
        "--store-size",
        "256M",
        "--receive-credit-max",
        "64",
        "--send-credit-target",
        "64",
    ];
    args.extend_from_slice(extra);
    let d = spawn(port, &args);
    (d, port, pf)
}

/// A file of `len` bytes to read from.
fn file(s: &mut Session, name: &str, len: usize) -> FileId {
    let f =
        s.c.create(
            name,
            CreateDisposition::OVERWRITE_IF,
            CreateOptions::NON_DIRECTORY_FILE,
        )
        .expect("create")
        .file_id;
    let chunk = vec![0xa5u8; 1 << 20];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(chunk.len());
        s.c.write(
            f,
            off as u64,
            &chunk[..n],
            Transfer::Rdma {
                descriptors: 1,
                invalidate: false,
            },
        )
        .expect("write");
        off += n;
    }
    f
}

fn guid(n: u32) -> Guid {
    Guid::from_fields(n, 0x5151, 0x7171, *b"qostest!")
}

fn request(options: Options, flow: Guid) -> StorageQosControlRequestRepr<'static> {
    let mut r = StorageQosControlRequestRepr::new(QosDialect::V1_1, options, flow);
    r.initiator_id = guid(0xabc);
    r
}

fn set_policy(flow: Guid, policy: Guid, limit: u64, reservation: u64) -> Vec<u8> {
    let mut r = request(
        Options::from_bits(Options::SET_LOGICAL_FLOW_ID.bits() | Options::SET_POLICY.bits()),
        flow,
    );
    r.policy_id = policy;
    r.limit = limit;
    r.reservation = reservation;
    r.initiator_name = Utf16Name::new("vm-qos-test").unwrap();
    r.initiator_node_name = Utf16Name::new("host-1").unwrap();
    r.to_vec()
}

fn ioctl(s: &mut Session, f: FileId, input: &[u8], max_output: u32) -> (NtStatus, Vec<u8>) {
    match s.c.ioctl(f, FSCTL_STORAGE_QOS_CONTROL, input, max_output) {
        Ok(r) => r,
        Err(Smb2Error::Status(st)) => (st, Vec::new()),
        Err(e) => panic!("IOCTL: {e}"),
    }
}

fn status(bytes: &[u8]) -> StorageQosControlResponseRepr {
    StorageQosControlResponseRepr::parse(&StorageQosControlResponse::new_checked(bytes).unwrap())
        .unwrap()
}

/// Keeps `qd` reads of `size` outstanding for `dur`, ignoring any limit;
/// returns the reads completed within `dur` and their median latency.
fn drive(s: &mut Session, f: FileId, size: u32, qd: usize, dur: Duration) -> (u64, Duration) {
    let transfer = if size > 65536 {
        Transfer::Rdma {
            descriptors: 1,
            invalidate: true,
        }
    } else {
        Transfer::Inline
    };
    let mut bufs = Vec::new();
    for _ in 0..qd {
        bufs.push(s.c.alloc_io_buf(size as usize).expect("io buf"));
    }
    let t0 = Instant::now();
    let mut outstanding = 0;
    for b in bufs {
        s.c.submit_read(f, 0, size, b, transfer).expect("submit");
        outstanding += 1;
    }
    let mut done = 0u64;
    let mut lat = Vec::new();
    while outstanding > 0 {
        let Some(comp) = s.c.poll(Duration::from_millis(200)).expect("poll") else {
            assert!(
                t0.elapsed() < dur + Duration::from_secs(20),
                "reads stalled"
            );
            continue;
        };
        outstanding -= 1;
        assert_eq!(comp.result.as_ref().ok(), Some(&size), "{:?}", comp.result);
        if t0.elapsed() <= dur {
            done += 1;
            lat.push(comp.latency);
            if let Some(b) = comp.buf {
                s.c.submit_read(f, 0, size, b, transfer).expect("submit");
                outstanding += 1;
            }
        } else if let Some(b) = comp.buf {
            let _ = s.c.free_io_buf(b);
        }
    }
    lat.sort();
    (done, lat.get(lat.len() / 2).copied().unwrap_or_default())
}

#[test]
fn limited_flow_ignoring_its_limit_gets_at_most_the_limit() {
    let _g = serial();
    let (d, port, _) = start(&[]);
    let provider = SoftProvider::new().unwrap();
    let mut s = session(&provider, port);
    let f = file(&mut s, "limited.bin", 1 << 20);
    let (st, out) = ioctl(&mut s, f, &set_policy(guid(1), Guid::NULL, 2000, 0), 4096);
    assert_eq!(st, STATUS_SUCCESS);
    assert!(out.is_empty());
    // 8 KiB reads (one normalized I/O each), 16 outstanding: the client
    // offers far more than 2,000 IOPS (its reads wait in the server's queue:
    // the median latency is about 16 / 2,000 s).
    let secs = 5;
    let (n, p50) = drive(&mut s, f, 8192, 16, Duration::from_secs(secs));
    let limit = 2000 * secs;
    assert!(
        n as f64 <= limit as f64 * 1.03,
        "{n} reads in {secs} s exceed 2,000 IOPS + 3 %"
    );
    assert!(
        n >= limit / 4,
        "only {n} reads in {secs} s: enforcement starves the flow"
    );
    assert!(
        p50 >= Duration::from_millis(4),
        "median latency {p50:?}: the client did not offer twice the limit"
    );
    // GET_STATUS reports what is assigned.
    let req = request(Options::GET_STATUS, guid(1)).to_vec();
    let (st, out) = ioctl(&mut s, f, &req, 4096);
    assert_eq!(st, STATUS_SUCCESS);
    let r = status(&out);
    assert_eq!(r.maximum_io_rate, 2000);
    assert_eq!(r.base_io_size, 8192);
    assert_eq!(r.status, FlowStatus::Ok);
    assert!(
        // About 4 s, counting down from 4,000 ms; refreshed every 100 ms
        // (more slowly when the control plane is starved of CPU).
        (1000..=4000).contains(&r.time_to_live),
        "TimeToLive {}",
        r.time_to_live
    );
    // stats and `qos flows` see the flow.
    let doc = stats_json(&d);
    assert_eq!(field(&doc, "flows"), 1, "{doc}");
    assert_eq!(field(&doc, "qos_opens"), 1, "{doc}");
    let out = Command::new(env!("CARGO_BIN_EXE_smbdirectd"))
        .args(["qos", "flows", "--json", "--admin-socket", &d.admin])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("vm-qos-test") && text.contains("host-1"),
        "{text}"
    );
    assert!(text.contains("\"limit_iops\":2000"), "{text}");
    s.c.close(f).unwrap();
    let doc = stats_json(&d);
    assert_eq!(field(&doc, "qos_opens"), 0, "{doc}");
    assert_eq!(field(&doc, "opens"), 0, "{doc}");
    drop(s);
    terminate(d);
}

#[test]
fn one_mib_io_is_charged_128_normalized_ios() {
    let _g = serial();
    let (d, port, _) = start(&[]);
    let provider = SoftProvider::new().unwrap();
    let mut s = session(&provider, port);
    let f = file(&mut s, "big.bin", 1 << 20);
    // 1,280 normalized IOPS = ten 1 MiB reads a second.
    let (st, _) = ioctl(&mut s, f, &set_policy(guid(2), Guid::NULL, 1280, 0), 4096);
    assert_eq!(st, STATUS_SUCCESS);
    let secs = 5;
    let (n, _) = drive(&mut s, f, 1 << 20, 4, Duration::from_secs(secs));
    // Charged 1 per I/O it would have done 6,400; charged 128 at most 51.
    assert!(
        (n * 128) as f64 <= 1280.0 * secs as f64 * 1.03,
        "{n} reads of 1 MiB in {secs} s exceed 1,280 normalized IOPS + 3 %"
    );
    assert!(n >= 10, "only {n} reads of 1 MiB");
    drop(s);
    terminate(d);
}

#[test]
fn two_flows_of_an_aggregated_policy_share_its_limit() {
    let _g = serial();
    let (d, port, _) = start(&[]);
    let provider = SoftProvider::new().unwrap();
    let shared: Guid = SHARED.parse().unwrap();
    let mut a = session(&provider, port);
    let mut b = session(&provider, port);
    let fa = file(&mut a, "a.bin", 1 << 20);
    let fb = file(&mut b, "b.bin", 1 << 20);
    assert_eq!(
        ioctl(&mut a, fa, &set_policy(guid(3), shared, 0, 0), 4096).0,
        STATUS_SUCCESS
    );
    assert_eq!(
        ioctl(&mut b, fb, &set_policy(guid(4), shared, 0, 0), 4096).0,
        STATUS_SUCCESS
    );
    let secs = 5;
    let t = std::thread::spawn(move || {
        let r = drive(&mut b, fb, 8192, 16, Duration::from_secs(secs)).0;
        (r, b)
    });
    let na = drive(&mut a, fa, 8192, 16, Duration::from_secs(secs)).0;
    let (nb, b) = t.join().unwrap();
    let total = na + nb;
    assert!(
        total as f64 <= 4000.0 * secs as f64 * 1.03,
        "{na} + {nb} reads in {secs} s exceed the aggregated 4,000 IOPS + 3 %"
    );
    assert!(na > 0 && nb > 0, "{na} / {nb}: a flow was starved");
    // Each flow's GET_STATUS shows its share; the shares add up to 4,000
    // once both flows are idle and the split stops moving (two GET_STATUS
    // calls can straddle a re-allocation while demand still changes).
    let mut b = b;
    let mut sum = 0;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        sum = 0;
        for (s, f, g) in [(&mut a, fa, guid(3)), (&mut b, fb, guid(4))] {
            let (st, out) = ioctl(s, f, &request(Options::GET_STATUS, g).to_vec(), 4096);
            assert_eq!(st, STATUS_SUCCESS);
            sum += status(&out).maximum_io_rate;
        }
        if sum == 4000 {
            break;
        }
    }
    assert_eq!(sum, 4000);
    drop(a);
    terminate(d);
}

#[test]
fn reservation_is_met_beside_a_greedy_flow_on_one_worker() {
    let _g = serial();
    let (d, port, _) = start(&["--cores", "1"]);
    let provider = SoftProvider::new().unwrap();
    let gold: Guid = GOLD.parse().unwrap();
    let unlimited: Guid = OPEN_ENDED.parse().unwrap();
    let mut r = session(&provider, port);
    let mut g = session(&provider, port);
    let fr = file(&mut r, "r.bin", 1 << 20);
    let fg = file(&mut g, "g.bin", 1 << 20);
    assert_eq!(
        ioctl(&mut r, fr, &set_policy(guid(5), gold, 0, 0), 4096).0,
        STATUS_SUCCESS
    );
    assert_eq!(
        ioctl(&mut g, fg, &set_policy(guid(6), unlimited, 0, 0), 4096).0,
        STATUS_SUCCESS
    );
    let secs = 3;
    let t = std::thread::spawn(move || {
        let n = drive(&mut g, fg, 65536, 32, Duration::from_secs(secs)).0;
        (n, g)
    });
    let n = drive(&mut r, fr, 8192, 4, Duration::from_secs(secs)).0;
    let (greedy, _g2) = t.join().unwrap();
    assert!(
        n as f64 >= 950.0 * secs as f64,
        "the reserved flow got {n} reads in {secs} s (greedy: {greedy})"
    );
    let (st, out) = ioctl(
        &mut r,
        fr,
        &request(Options::GET_STATUS, guid(5)).to_vec(),
        4096,
    );
    assert_eq!(st, STATUS_SUCCESS);
    let st = status(&out);
    assert_eq!(st.minimum_io_rate, 1000);
    assert_eq!(st.status, FlowStatus::Ok);
    drop(r);
    terminate(d);
}

#[test]
fn share_default_policy_limits_clients_that_send_no_qos_ioctl() {
    let _g = serial();
    let share = format!("data:policy={CAP_1000}");
    let (d, port, _) = start(&["--share", &share]);
    let provider = SoftProvider::new().unwrap();
    let mut s = session(&provider, port);
    // No FSCTL_STORAGE_QOS_CONTROL: the Open becomes a flow by itself.
    let f = file(&mut s, "default.bin", 1 << 20);
    let secs = 3;
    let (n, _) = drive(&mut s, f, 8192, 16, Duration::from_secs(secs));
    assert!(
        n as f64 <= 1000.0 * secs as f64 * 1.03,
        "{n} reads in {secs} s exceed the share's 1,000 IOPS + 3 %"
    );
    assert!(n >= 250 * secs, "only {n} reads");
    let out = Command::new(env!("CARGO_BIN_EXE_smbdirectd"))
        .args(["qos", "flows", "--json", "--admin-socket", &d.admin])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("smbdirectd default policy"), "{text}");
    assert!(
        text.contains(CAP_1000) && text.contains("\"limit_iops\":1000"),
        "{text}"
    );
    s.c.close(f).unwrap();
    let doc = stats_json(&d);
    assert_eq!(field(&doc, "qos_opens"), 0, "{doc}");
    drop(s);
    terminate(d);
}

/// A worker reports a closed window a few flows at a time, as the ring to
/// the control plane has room (dataplane/src/smb2/mod.rs,
/// QOS_REPORT_BUDGET; the daemon's ring holds 32 messages with
/// `--max-connections 4`): with a hundred flows reading all the time,
/// every flow's rate reaches the control plane (`qos flows`, which shows
/// each flow's last closed window: sampled while the reads go on).
#[test]
fn every_flow_of_a_hundred_reading_has_its_rate_reported() {
    let _g = serial();
    // Three times the ring, and few enough that a round of reads over all
    // of them (~50 ms in a debug build) fits in a 100 ms window.
    const FLOWS: u32 = 100;
    let (d, port, _) = start(&["--max-connections", "4"]);
    let provider = SoftProvider::new().unwrap();
    let mut s = session(&provider, port);
    let f = file(&mut s, "many.bin", 4096);
    s.c.close(f).unwrap();
    let mut opens = Vec::new();
    for n in 0..FLOWS {
        let fid =
            s.c.create(
                "many.bin",
                CreateDisposition::OPEN,
                CreateOptions::NON_DIRECTORY_FILE,
            )
            .expect("open")
            .file_id;
        let mut r = request(
            Options::from_bits(Options::SET_LOGICAL_FLOW_ID.bits() | Options::SET_POLICY.bits()),
            guid(0x1000 + n),
        );
        r.limit = 1_000_000;
        let (st, _) = ioctl(&mut s, fid, &r.to_vec(), 1024);
        assert_eq!(st, STATUS_SUCCESS, "flow {n}");
        opens.push(fid);
    }
    // Another thread samples `qos flows` every 100 ms for 3 s while this
    // one reads on every flow in turn.
    let admin = d.admin.clone();
    let sampler = std::thread::spawn(move || {
        let mut samples = Vec::new();
        for _ in 0..30 {
            std::thread::sleep(Duration::from_millis(100));
            let out = Command::new(env!("CARGO_BIN_EXE_smbdirectd"))
                .args(["qos", "flows", "--json", "--admin-socket", &admin])
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            samples.push(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        samples
    });
    let mut rounds = 0;
    while !sampler.is_finished() {
        for &fid in &opens {
            s.c.read(fid, 0, 512, Transfer::Inline).expect("read");
        }
        rounds += 1;
    }
    let samples = sampler.join().unwrap();
    // Flow id -> seen with a rate in some sample.
    let mut seen = std::collections::BTreeMap::new();
    for text in &samples {
        for row in text.split("{\"flow_id\":\"").skip(1) {
            let id = row.split('"').next().unwrap_or_default().to_string();
            let busy = !row.contains("\"iops\":0,");
            *seen.entry(id).or_insert(false) |= busy;
        }
    }
    assert_eq!(
        seen.len(),
        FLOWS as usize,
        "{rounds} rounds; {:?}",
        samples.last()
    );
    let never: Vec<&String> = seen
        .iter()
        .filter(|(_, b)| !**b)
        .map(|(id, _)| id)
        .collect();
    assert!(
        never.is_empty(),
        "{} of {FLOWS} flows read in each of {rounds} rounds but no sample of `qos flows` showed \
         a rate for them (first: {:?})",
        never.len(),
        &never[..never.len().min(3)]
    );
    for fid in opens {
        s.c.close(fid).unwrap();
    }
    drop(s);
    terminate(d);
}

#[test]
fn qos_policy_subcommands_change_a_running_daemon() {
    let _g = serial();
    let (d, port, pf) = start(&[]);
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_smbdirectd"))
            .arg("qos")
            .args(args)
            .args(["--admin-socket", &d.admin])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let id = "33333333-4444-5555-6666-777777777777";
    let (code, text) = run(&[
        "policy",
        "add",
        id,
        "--type",
        "dedicated",
        "--max-iops",
        "500",
    ]);
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = run(&["policy", "list", "--json"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains(id) && text.contains("\"max_iops\":500"),
        "{text}"
    );
    // Written back to the policy file.
    assert!(std::fs::read_to_string(&pf).unwrap().contains(id));
    // A flow naming the new policy gets its limit at once.
    let provider = SoftProvider::new().unwrap();
    let mut s = session(&provider, port);
    let f = file(&mut s, "p.bin", 8192);
    let (st, _) = ioctl(
        &mut s,
        f,
        &set_policy(guid(7), id.parse().unwrap(), 0, 0),
        4096,
    );
    assert_eq!(st, STATUS_SUCCESS);
    let (_, out) = ioctl(
        &mut s,
        f,
        &request(Options::GET_STATUS, guid(7)).to_vec(),
        4096,
    );
    assert_eq!(status(&out).maximum_io_rate, 500);
    // Removing it: the flow's policy is now unknown.
    let (code, text) = run(&["policy", "remove", id]);
    assert_eq!(code, Some(0), "{text}");
    std::thread::sleep(Duration::from_millis(300));
    let (_, out) = ioctl(
        &mut s,
        f,
        &request(Options::GET_STATUS, guid(7)).to_vec(),
        4096,
    );
    assert_eq!(status(&out).status, FlowStatus::UnknownPolicyId);
    let (code, text) = run(&["policy", "remove", id]);
    assert_eq!(code, Some(1), "{text}");
    let (code, text) = run(&["flows"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("UnknownPolicyId"), "{text}");
    drop(s);
    terminate(d);
}

/// [MS-SQOS] 2.2.2.1 StorageQoSStatusConfigurationMismatch: a policy whose
/// minimum is above its maximum is accepted with a warning; a flow under it
/// is limited to the maximum, keeps no reservation and reports the mismatch
/// in GET_STATUS and in `qos flows`.
#[test]
fn policy_that_cannot_be_applied_reports_configuration_mismatch() {
    let _g = serial();
    let (d, port, _pf) = start(&[]);
    let id = "55555555-6666-7777-8888-999999999999";
    let out = Command::new(env!("CARGO_BIN_EXE_smbdirectd"))
        .args(["qos", "policy", "add", id, "--type", "dedicated"])
        .args(["--min-iops", "900", "--max-iops", "300"])
        .args(["--admin-socket", &d.admin])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("configuration mismatch"), "{err}");
    let provider = SoftProvider::new().unwrap();
    let mut s = session(&provider, port);
    let f = file(&mut s, "m.bin", 8192);
    let (st, _) = ioctl(
        &mut s,
        f,
        &set_policy(guid(9), id.parse().unwrap(), 0, 0),
        4096,
    );
    assert_eq!(st, STATUS_SUCCESS);
    let (st, out) = ioctl(
        &mut s,
        f,
        &request(Options::GET_STATUS, guid(9)).to_vec(),
        4096,
    );
    assert_eq!(st, STATUS_SUCCESS);
    let r = status(&out);
    assert_eq!(r.status, FlowStatus::ConfigurationMismatch);
    assert_eq!((r.maximum_io_rate, r.minimum_io_rate), (300, 0));
    let flows = Command::new(env!("CARGO_BIN_EXE_smbdirectd"))
        .args(["qos", "flows", "--admin-socket", &d.admin])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&flows.stdout);
    assert!(text.contains("ConfigurationMismatch"), "{text}");
    drop(s);
    terminate(d);
}

/// Every MS-SQOS failure the wire can reach, one test each: the IOCTL
/// response carries the status, the connection goes on.
mod errors {
    use super::*;

    fn check(build: impl FnOnce(&mut Session) -> (FileId, Vec<u8>, u32), want: NtStatus) {
        let _g = serial();
        let (d, port, _) = start(&["--qos-max-flows", "2"]);
        let provider = SoftProvider::new().unwrap();
        let mut s = session(&provider, port);
        let (f, input, max_output) = build(&mut s);
        let (st, out) = ioctl(&mut s, f, &input, max_output);
        assert_eq!(st, want);
        assert!(out.is_empty());
        // The connection goes on.
        s.c.echo().expect("echo after the failed IOCTL");
        drop(s);
        terminate(d);
    }

    fn plain(s: &mut Session) -> FileId {
        file(s, "e.bin", 0)
    }

    #[test]
    fn open_that_is_not_a_file_is_an_invalid_device_request() {
        check(
            |s| {
                let dir =
                    s.c.create("", CreateDisposition::OPEN, CreateOptions::DIRECTORY_FILE)
                        .unwrap()
                        .file_id;
                (dir, set_policy(guid(1), Guid::NULL, 10, 0), 4096)
            },
            STATUS_INVALID_DEVICE_REQUEST,
        );
    }

    #[test]
    fn unknown_protocol_version_is_a_revision_mismatch() {
        check(
            |s| {
                let mut v = set_policy(guid(1), Guid::NULL, 10, 0);
                v[0..2].copy_from_slice(&0x0102u16.to_le_bytes());
                (plain(s), v, 4096)
            },
            STATUS_REVISION_MISMATCH,
        );
    }

    #[test]
    fn no_defined_option_flag_is_an_invalid_parameter() {
        check(
            |s| {
                (
                    plain(s),
                    request(Options::from_bits(0x100), guid(1)).to_vec(),
                    4096,
                )
            },
            STATUS_INVALID_PARAMETER,
        );
    }

    #[test]
    fn request_shorter_than_its_fixed_part_is_an_invalid_parameter() {
        check(
            |s| {
                let v = set_policy(guid(1), Guid::NULL, 10, 0);
                (plain(s), v[..40].to_vec(), 4096)
            },
            STATUS_INVALID_PARAMETER,
        );
    }

    #[test]
    fn probe_policy_with_an_empty_flow_id_is_an_invalid_parameter() {
        check(
            |s| {
                (
                    plain(s),
                    request(Options::PROBE_POLICY, Guid::NULL).to_vec(),
                    4096,
                )
            },
            STATUS_INVALID_PARAMETER,
        );
    }

    #[test]
    fn set_policy_on_an_unassociated_open_is_not_found() {
        check(
            |s| {
                let mut r = request(Options::SET_POLICY, guid(1));
                r.limit = 10;
                (plain(s), r.to_vec(), 4096)
            },
            STATUS_NOT_FOUND,
        );
    }

    #[test]
    fn get_status_on_an_unassociated_open_is_not_found() {
        check(
            |s| {
                (
                    plain(s),
                    request(Options::GET_STATUS, guid(1)).to_vec(),
                    4096,
                )
            },
            STATUS_NOT_FOUND,
        );
    }

    #[test]
    fn update_counters_on_an_unassociated_open_is_not_found() {
        check(
            |s| {
                let mut r = request(Options::UPDATE_COUNTERS, guid(1));
                r.io_count_increment = 5;
                (plain(s), r.to_vec(), 4096)
            },
            STATUS_NOT_FOUND,
        );
    }

    #[test]
    fn get_status_with_a_max_response_below_its_size_is_an_invalid_parameter() {
        check(
            |s| {
                let f = plain(s);
                let (st, _) = ioctl(s, f, &set_policy(guid(1), Guid::NULL, 10, 0), 4096);
                assert_eq!(st, STATUS_SUCCESS);
                (f, request(Options::GET_STATUS, guid(1)).to_vec(), 79)
            },
            STATUS_INVALID_PARAMETER,
        );
    }

    #[test]
    fn initiator_name_outside_the_buffer_is_an_invalid_parameter() {
        check(
            |s| {
                let mut v = set_policy(guid(1), Guid::NULL, 10, 0);
                let len = v.len() as u32;
                // InitiatorNameOffset past the end of the request.
                let mut view = StorageQosControlRequest::new_unchecked(&mut v[..]);
                view.set_initiator_name_offset((len + 8) as u16);
                (plain(s), v, 4096)
            },
            STATUS_INVALID_PARAMETER,
        );
    }

    #[test]
    fn limit_above_the_note_8_bound_is_an_invalid_parameter() {
        check(
            |s| {
                (
                    plain(s),
                    set_policy(guid(1), Guid::NULL, 2_000_000_000, 0),
                    4096,
                )
            },
            STATUS_INVALID_PARAMETER,
        );
    }

    #[test]
    fn a_full_flow_table_is_insufficient_resources() {
        // --qos-max-flows 2: two flows referenced by open Opens, a third is refused.
        check(
            |s| {
                for i in 1..=2 {
                    let f = file(s, &format!("f{i}.bin"), 0);
                    let (st, _) = ioctl(s, f, &set_policy(guid(i), Guid::NULL, 10, 0), 4096);
                    assert_eq!(st, STATUS_SUCCESS);
                }
                (plain(s), set_policy(guid(3), Guid::NULL, 10, 0), 4096)
            },
            STATUS_INSUFFICIENT_RESOURCES,
        );
    }
}
