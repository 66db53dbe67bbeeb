//! `--workload send`: SMB Direct data-transfer round trips. Each operation
//! sends one upper-layer message of `--size` bytes through
//! [`smbdirect_dataplane::client::Client`] (fragmented above
//! MaxSendSize - 24, [MS-SMBD] 3.1.5.1) and ends when the server's echo of
//! it has been reassembled and delivered. Up to `--queue-depth` messages
//! are outstanding per connection, within the send credits the server
//! grants ([MS-SMBD] 3.1.5.9); the echo upper layer answers in order, so
//! replies are matched first in, first out.

use super::error::BenchError;
use super::options::BenchOptions;
use super::pattern;
use super::workload::{Fifo, Outcome, Session, Workload};
use super::Retained;
use smbdirect_controlplane::{start, RunningServer, ServerConfig};
use smbdirect_dataplane::client::{client_caps, Client, ClientError};
use smbdirect_dataplane::endpoint::EndpointError;
use smbdirect_dataplane::marks::{self, Point};
use smbdirect_dataplane::provider::Provider;
use smbdirect_dataplane::upper::Echo;
use smbdirect_hugepages::{Backing, HugepagePolicy, PoolConfig, SizeClass};
use smbdirect_protocol::ntstatus;
use smbdirect_protocol::smbd::{SmbdConfig, TerminateReason};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long negotiation may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The SMB Direct parameters of the loopback server: the Windows defaults,
/// with 1 MiB RDMA staging buffers (the echo never needs the default
/// 8 MiB ones, and they would cost 8 MiB per message in flight) and
/// `--max-send-size`.
pub fn loopback_smbd(opts: &BenchOptions) -> SmbdConfig {
    SmbdConfig {
        max_read_write_size: 1 << 20,
        max_send_size: opts.max_send_size,
        ..SmbdConfig::default()
    }
}

/// The SMB Direct parameters of a bench client: the Windows defaults with
/// `--max-send-size` (its PreferredSendSize, [MS-SMBD] 3.1.5.2).
pub(crate) fn client_smbd(opts: &BenchOptions) -> SmbdConfig {
    SmbdConfig {
        max_send_size: opts.max_send_size,
        ..SmbdConfig::default()
    }
}

/// Pool memory the loopback server needs for `opts` with messages (or
/// RDMA staging buffers) of `size` bytes, per worker slice of a
/// [`PoolConfig::smbdirect`] pool: every receive credit of every connection
/// in the receive class (25 % of the budget), the send queue in the send
/// class (10 %), and for messages above MaxReceiveSize two buffers per
/// outstanding message (the reassembled request and the echo) in the class
/// that holds them (64 KiB at 10 %, or the 1 MiB RDMA class at 55 %).
pub(crate) fn server_pool_mem(opts: &BenchOptions, size: usize) -> usize {
    let workers = opts.server_cores.len().max(1);
    let conns = opts.connections.div_ceil(workers);
    let smbd = loopback_smbd(opts);
    let receives = conns * (smbd.receive_credit_max as usize + 16) * 8192 * 100 / 25;
    let send_buf = (smbd.max_send_size as usize).next_multiple_of(64) + 64;
    let sends = conns * (smbd.send_credit_target as usize + 64) * send_buf * 100 / 10;
    let in_flight = conns * (2 * opts.queue_depth as usize + 4);
    let messages = if size <= smbd.max_receive_size as usize {
        0
    } else if size <= 64 << 10 {
        in_flight * (64 << 10) * 100 / 10
    } else {
        in_flight * (1 << 20) * 100 / 55
    };
    workers * receives.max(sends).max(messages).max(64 << 20)
}

/// The `--loopback` server's configuration: control plane and one pinned
/// worker per `--server-cores` entry, listening on `listen`.
pub(crate) fn loopback_server_config(
    opts: &BenchOptions,
    listen: SocketAddr,
    pool_mem: usize,
) -> ServerConfig {
    ServerConfig {
        listen,
        worker_cores: opts.server_cores.clone(),
        smbd: loopback_smbd(opts),
        queue_depth: opts.queue_depth,
        max_connections: opts.connections,
        pool_mem,
        idle_park: Duration::from_millis(100),
        ..ServerConfig::default()
    }
}

/// Starts the `--loopback` server with the echo upper layer.
pub fn start_echo_server<P: Provider>(
    provider: Arc<P>,
    opts: &BenchOptions,
    listen: SocketAddr,
) -> Result<RunningServer, BenchError> {
    let cfg = loopback_server_config(opts, listen, server_pool_mem(opts, opts.size));
    start(provider, cfg, || Echo)
        .map_err(|e| BenchError::failed("starting the loopback server (upper echo)", e))
}

/// SMB Direct echo round trips against a server at `addr`.
pub struct SendWorkload<'a, P: Provider> {
    provider: Arc<P>,
    addr: SocketAddr,
    size: usize,
    queue_depth: u32,
    verify: bool,
    smbd: SmbdConfig,
    /// Connection.MaxSendSize the last connection negotiated (0: none yet).
    negotiated: AtomicU32,
    retained: &'a Retained,
}

impl<'a, P: Provider> SendWorkload<'a, P> {
    /// The workload of `opts` against `addr`; client pools are kept in
    /// `retained` (they must outlive the provider's registrations).
    pub fn new(
        provider: Arc<P>,
        addr: SocketAddr,
        opts: &BenchOptions,
        retained: &'a Retained,
    ) -> Self {
        SendWorkload {
            provider,
            addr,
            size: opts.size,
            queue_depth: opts.queue_depth,
            verify: opts.verify,
            smbd: client_smbd(opts),
            negotiated: AtomicU32::new(0),
            retained,
        }
    }

    /// The Connection.MaxSendSize a connection negotiated ([MS-SMBD]
    /// 3.1.5.3: the smaller of ours and the server's MaxReceiveSize), if
    /// one connected.
    pub fn negotiated_max_send_size(&self) -> Option<u32> {
        Some(self.negotiated.load(Ordering::Relaxed)).filter(|&m| m != 0)
    }
}

/// A client pool for one connection: every receive credit, every send the
/// queue pair can hold, and one message buffer per outstanding message in
/// the class its size falls in (send, receive, or a class of `size`).
pub(crate) fn client_pool(cfg: &SmbdConfig, size: usize, qd: u32) -> PoolConfig {
    let caps = client_caps(cfg);
    let qd = qd + 4;
    let recv_size = cfg.max_receive_size as usize;
    let send_size = cfg.max_send_size as usize;
    let (mut recv_n, mut send_n) = (caps.max_recv_wr + 8, caps.max_send_wr + 8);
    let msg_size = size.max(recv_size + 1);
    if size <= send_size {
        send_n += qd;
    } else if size <= recv_size {
        recv_n += qd;
    }
    let stride = |s: usize| s.next_multiple_of(4096) as u64;
    let budget = stride(recv_size) * u64::from(recv_n + 2)
        + stride(send_size) * u64::from(send_n + 2)
        + stride(msg_size).next_power_of_two() * u64::from(qd + 2)
        + (8 << 20);
    PoolConfig::new(budget as usize, 1)
        .class(SizeClass::new("receive", recv_size).per_slice(recv_n))
        .class(SizeClass::new("send", send_size).per_slice(send_n))
        .class(SizeClass::new("message", msg_size).per_slice(qd))
        .backing(Backing::SharedMemfd)
        .hugepages(HugepagePolicy::Prefer)
        .mlock(false)
}

fn client_error(index: usize, what: &str, e: ClientError) -> BenchError {
    let hint = match e {
        // [MS-SMBD] 3.1.5.3: the server had no receive buffers for one
        // more connection (its pool, divided by --receive-credit-max).
        ClientError::Endpoint(EndpointError::Terminated(
            TerminateReason::NegotiateResponseStatus { status },
        )) if status == ntstatus::STATUS_INSUFFICIENT_RESOURCES => {
            " (the server has no buffers for another connection: give `serve` more --pool-mem or a smaller --receive-credit-max)"
        }
        ClientError::Endpoint(EndpointError::Terminated(
            TerminateReason::NegotiateResponseStatus { .. },
        )) => "",
        ClientError::Endpoint(_) => {
            " (a server whose upper layer cannot serve --workload send ends the connection: is it `serve --upper echo`?)"
        }
        _ => "",
    };
    BenchError::failed(format!("connection {index}: {what}"), format!("{e}{hint}"))
}

impl<P: Provider> Workload for SendWorkload<'_, P> {
    type Session = SendSession<P>;

    fn name(&self) -> &'static str {
        "send"
    }

    fn bytes_per_op(&self) -> u64 {
        self.size as u64
    }

    fn open(&self, index: usize) -> Result<SendSession<P>, BenchError> {
        let cfg = self.smbd.clone();
        let pool = client_pool(&cfg, self.size, self.queue_depth)
            .build()
            .map_err(|e| {
                BenchError::failed(format!("connection {index}: client buffer pool"), e)
            })?;
        self.retained.keep(pool.clone());
        // SAFETY: `retained` keeps the pool mapped until after the provider
        // is dropped (`super::run` creates it first).
        let mr = unsafe { self.provider.register_pool(&pool) }.map_err(|e| {
            BenchError::failed(format!("connection {index}: registering memory"), e)
        })?;
        let alloc = pool.claim_slice(0).map_err(|e| {
            BenchError::failed(format!("connection {index}: client buffer pool"), e)
        })?;
        let client =
            Client::connect(&*self.provider, self.addr, cfg, alloc, mr, CONNECT_TIMEOUT)
                .map_err(|e| client_error(index, &format!("connecting to {}", self.addr), e))?;
        let params = client.connection().params();
        self.negotiated
            .store(params.max_send_size, Ordering::Relaxed);
        let max = params.max_fragmented_send_size as usize;
        if self.size > max {
            let _ = client.close(Duration::from_secs(1));
            return Err(BenchError::Usage(format!(
                "--size {} exceeds the server's MaxFragmentedSize {max} ([MS-SMBD] 3.1.4.2)",
                self.size
            )));
        }
        Ok(SendSession {
            client,
            len: self.size,
            fifo: Fifo::with_capacity(self.queue_depth as usize),
            verify: self.verify,
            index,
        })
    }
}

/// One SMB Direct connection.
pub struct SendSession<P: Provider> {
    client: Client<P>,
    /// Bytes of each message.
    len: usize,
    fifo: Fifo,
    verify: bool,
    index: usize,
}

impl<P: Provider> Session for SendSession<P> {
    fn start(&mut self, slot: u32, seq: u64) -> Result<(), BenchError> {
        // Built in place in the pool buffer the Sends gather from, as an
        // upper layer builds its messages: `raw-send` copies nothing
        // either. Without --verify only the stamp is written.
        let verify = self.verify;
        marks::mark(Point::ClientPostBegin);
        let sent = self.client.send_with(self.len, |b| {
            if verify {
                pattern::fill(b, seq);
            } else {
                pattern::stamp(b, seq);
            }
        });
        marks::mark(Point::ClientPostEnd);
        sent.map_err(|e| client_error(self.index, "sending", e))?;
        if !self.fifo.push(slot, seq) {
            return Err(BenchError::failed(
                format!("connection {}", self.index),
                "more operations started than the queue depth",
            ));
        }
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(Outcome)) -> Result<bool, BenchError> {
        let SendSession {
            client,
            len,
            fifo,
            verify,
            index,
        } = self;
        let mut unexpected = false;
        let r = client.step(&mut |m, _| match fifo.pop() {
            Some((slot, seq)) => {
                let ok = m.len() == *len
                    && pattern::stamped(m, seq)
                    && (!*verify || pattern::check(m, seq));
                marks::mark(Point::ClientDone);
                done(Outcome { slot, ok });
            }
            None => unexpected = true,
        });
        let progressed = r.map_err(|e| client_error(*index, "receiving", e))?;
        if unexpected {
            return Err(BenchError::failed(
                format!("connection {index}"),
                "the server sent a message nobody asked for: is it `serve --upper echo`?",
            ));
        }
        Ok(progressed)
    }

    fn credit_stalls(&self) -> u64 {
        self.client.connection().stats().credit_stalls
    }

    fn describe(&self) -> String {
        let conn = self.client.connection();
        let c = conn.credits();
        let st = conn.stats();
        format!(
            "SMB Direct: send credits {}, receives posted {} ({} granted to the server), send queue {}, messages sent {} received {} delivered {}, credit stalls {}",
            c.send_credits,
            c.recv_posted,
            c.peer_credits,
            conn.send_queue_len(),
            st.messages_sent,
            st.messages_received,
            st.messages_delivered,
            st.credit_stalls
        )
    }

    fn close(self) {
        let _ = self.client.close(Duration::from_secs(2));
    }
}
