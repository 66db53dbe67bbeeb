//! A small probe of the SMB2 RDMA data path of a running `smbdirectd serve
//! --upper smb2` (soft provider): 1 MiB READ and WRITE throughput against
//! a 1 MiB memcpy in this process, and 4 KiB RDMA READs at a queue depth.
//! A stop-gap until `smbdirectd bench` has SMB2 workloads; one connection,
//! the client on the calling thread.
//!
//! ```text
//! smbdirectd serve --provider soft --upper smb2 --cores 1 --listen 127.0.0.1:4450 &
//! cargo run --release -p smbdirect-benches --bin smb2-rdma-probe -- 127.0.0.1:4450 [SECONDS [all|1m|4k]]
//! ```

use smbdirect_dataplane::provider::soft::SoftProvider;
use smbdirect_dataplane::provider::Provider;
use smbdirect_dataplane::smb2::client::{
    IoBuf, Smb2Client, Smb2ClientOptions, Smb2Error, Transfer,
};
use smbdirect_hugepages::{Backing, PoolConfig, SizeClass};
use smbdirect_protocol::smb2::{CreateDisposition, CreateOptions, Dialect, FileId};
use smbdirect_protocol::smbd::SmbdConfig;
use std::collections::VecDeque;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;
const FILE: usize = 64 * MIB;

/// Keeps `qd` requests of `len` bytes outstanding for `secs`; returns
/// (requests completed, seconds).
fn pipeline(
    c: &mut Smb2Client<SoftProvider>,
    fid: FileId,
    bufs: &[IoBuf],
    len: usize,
    write: bool,
    secs: f64,
) -> Result<(u64, f64), Smb2Error> {
    let t = Transfer::Rdma {
        descriptors: 1,
        invalidate: true,
    };
    let mut free: VecDeque<IoBuf> = bufs.iter().copied().collect();
    let slots = (FILE / len) as u64;
    let (mut next, mut done, mut out) = (0u64, 0u64, 0usize);
    let start = Instant::now();
    loop {
        let running = start.elapsed().as_secs_f64() < secs;
        while let Some(b) = if running { free.pop_front() } else { None } {
            let off = (next.wrapping_mul(2_654_435_761) % slots) * len as u64;
            let r = if write {
                c.submit_write(fid, off, len as u32, b, t)
            } else {
                c.submit_read(fid, off, len as u32, b, t)
            };
            match r {
                Ok(_) => {
                    next += 1;
                    out += 1;
                }
                Err(Smb2Error::NoCredits { .. }) => {
                    free.push_front(b);
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        if out == 0 {
            break;
        }
        let comp = c
            .poll(Duration::from_secs(10))?
            .ok_or_else(|| Smb2Error::Invalid("no completion in 10 s".into()))?;
        comp.result?;
        free.push_back(comp.buf.expect("buffer back"));
        out -= 1;
        done += 1;
    }
    Ok((done, start.elapsed().as_secs_f64()))
}

/// GB/s of copying 1 MiB between two buffers (the copy a data path does).
fn memcpy_gbps(secs: f64) -> f64 {
    let src = vec![7u8; MIB];
    let mut dst = vec![0u8; MIB];
    let (mut n, start) = (0u64, Instant::now());
    while start.elapsed().as_secs_f64() < secs {
        for _ in 0..64 {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        }
        n += 64;
    }
    n as f64 * MIB as f64 / start.elapsed().as_secs_f64() / 1e9
}

fn run(addr: &str, secs: f64, which: &str) -> Result<(), String> {
    let e = |x: Smb2Error| x.to_string();
    let provider = SoftProvider::new().map_err(|x| x.to_string())?;
    let pool = PoolConfig::new(96 << 20, 1)
        .class(SizeClass::new("send", 1364).per_slice(256))
        .class(SizeClass::new("io4k", 4096).per_slice(64))
        .class(SizeClass::new("receive", 8192).per_slice(64))
        .class(SizeClass::new("mid", MIB).per_slice(12))
        .class(SizeClass::new("big", 8 << 20).per_slice(2))
        .backing(Backing::SharedMemfd)
        .build()
        .map_err(|x| x.to_string())?;
    // SAFETY: `pool` lives until the end of this function, after the
    // connection (and so the provider's use of its memory) is gone.
    let mr = unsafe { provider.register_pool(&pool) }.map_err(|x| x.to_string())?;
    let alloc = pool.claim_slice(0).map_err(|x| x.to_string())?;
    let cfg = SmbdConfig {
        receive_credit_max: 64,
        send_credit_target: 64,
        ..SmbdConfig::default()
    };
    let mut c = Smb2Client::connect(
        &provider,
        addr.parse().map_err(|x| format!("{addr}: {x}"))?,
        cfg,
        alloc,
        mr,
        Duration::from_secs(10),
        Smb2ClientOptions::default(),
    )
    .map_err(e)?;
    c.negotiate(&[Dialect::SMB_3_1_1]).map_err(e)?;
    c.session_setup_anonymous().map_err(e)?;
    c.tree_connect("data").map_err(e)?;
    let fid = c
        .create(
            "probe.bin",
            CreateDisposition::OVERWRITE_IF,
            CreateOptions::NON_DIRECTORY_FILE,
        )
        .map_err(e)?
        .file_id;
    let big: Vec<IoBuf> = (0..4)
        .map(|_| c.alloc_io_buf(MIB))
        .collect::<Result<_, _>>()
        .map_err(e)?;
    for i in 0..FILE / MIB {
        let t = Transfer::Rdma {
            descriptors: 1,
            invalidate: false,
        };
        c.submit_write(fid, (i * MIB) as u64, MIB as u32, big[0], t)
            .map_err(e)?;
        let comp = c
            .poll(Duration::from_secs(10))
            .map_err(e)?
            .ok_or("no completion")?;
        comp.result.map_err(e)?;
    }
    let mc = memcpy_gbps(secs);
    println!("memcpy 1 MiB: {mc:.2} GB/s");
    let big_runs: &[(&str, bool)] = if which == "4k" {
        &[]
    } else {
        &[("READ", false), ("WRITE", true)]
    };
    for &(name, write) in big_runs {
        let (n, s) = pipeline(&mut c, fid, &big, MIB, write, secs).map_err(e)?;
        let gbps = n as f64 * MIB as f64 / s / 1e9;
        println!(
            "{name} 1 MiB RDMA, QD 4: {gbps:.2} GB/s = {:.2} x memcpy ({n} in {s:.1} s)",
            gbps / mc
        );
    }
    if which == "1m" {
        let _ = c.disconnect(Duration::from_secs(2));
        return Ok(());
    }
    let small: Vec<IoBuf> = (0..32)
        .map(|_| c.alloc_io_buf(4096))
        .collect::<Result<_, _>>()
        .map_err(e)?;
    let (n, s) = pipeline(&mut c, fid, &small, 4096, false, secs).map_err(e)?;
    println!(
        "READ 4 KiB RDMA, QD 32: {:.0} k ops/s ({n} in {s:.1} s)",
        n as f64 / s / 1e3
    );
    let _ = c.disconnect(Duration::from_secs(2));
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(addr) = args.first() else {
        eprintln!("usage: smb2-rdma-probe HOST:PORT [SECONDS [all|1m|4k]]");
        return ExitCode::from(2);
    };
    let secs = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let which = args.get(2).map_or("all", |s| s.as_str());
    match run(addr, secs, which) {
        Ok(()) => ExitCode::SUCCESS,
        Err(m) => {
            eprintln!("smb2-rdma-probe: {m}");
            ExitCode::FAILURE
        }
    }
}
