//! An upper layer refused a resource (a pool buffer, a send-queue entry, an
//! RDMA slot: `Backpressure`) is called again once the worker has done
//! something that may have freed one (a completion, a control message, a
//! close, the 1 ms timer scan), not on every turn of its loop. Both ways a
//! refusal comes back: a message the handler pushed back (`Err`, the
//! worker keeps it), and a held request the layer asks to be woken for
//! again (`UpperIo::wake_when_freed`, the SMB2 server's retry).

mod common;

use smbdirect_controlplane::start;
use smbdirect_dataplane::client::Client;
use smbdirect_dataplane::planes::ConnId;
use smbdirect_dataplane::provider::soft::SoftProvider;
use smbdirect_dataplane::upper::{Backpressure, Replies, UpperIo, UpperLayer};
use smbdirect_protocol::time::Instant as PInstant;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Echoes each message, except while `refuse` is set: then it says the
/// pool is exhausted. `hold`: it holds every message and answers from a
/// wake, re-holding and asking [`UpperIo::wake_when_freed`] while refused
/// (the SMB2 server's way); else it pushes the message back (`Err`).
struct Stubborn {
    refuse: Arc<AtomicBool>,
    calls: Arc<AtomicU64>,
    hold: bool,
    next: u64,
    retries: VecDeque<(ConnId, u64)>,
}

impl UpperLayer for Stubborn {
    fn name(&self) -> &'static str {
        "stubborn"
    }

    fn on_message(
        &mut self,
        conn: ConnId,
        msg: &[u8],
        out: &mut Replies<'_>,
    ) -> Result<(), Backpressure> {
        if self.hold {
            self.next += 1;
            out.hold(self.next);
            self.retries.push_back((conn, self.next));
            return Ok(());
        }
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.refuse.load(Ordering::Relaxed) {
            return Err(Backpressure::PoolExhausted);
        }
        out.reply(msg.len(), |b| b.copy_from_slice(msg))
    }

    fn poll(&mut self, _now: PInstant, io: &mut UpperIo<'_>) -> bool {
        let any = !self.retries.is_empty();
        while let Some((c, t)) = self.retries.pop_front() {
            io.wake_when_freed(c, t);
        }
        any
    }

    fn on_wake(
        &mut self,
        conn: ConnId,
        token: u64,
        msg: Option<&[u8]>,
        out: &mut Replies<'_>,
    ) -> Result<(), Backpressure> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let Some(msg) = msg else {
            return Ok(());
        };
        if self.refuse.load(Ordering::Relaxed) {
            out.hold(token);
            self.retries.push_back((conn, token));
            return Ok(());
        }
        out.reply(msg.len(), |b| b.copy_from_slice(msg))
    }
}

/// Sends one message while the layer refuses, lets the worker idle for a
/// while, then lifts the refusal: the message is answered, and while
/// refused the layer was called about once per timer scan (once a
/// millisecond), not once per turn of the loop (a turn is about a
/// microsecond: before, hundreds of thousands of calls in this window).
fn refused_then_served(hold: bool) {
    let provider = Arc::new(SoftProvider::new().expect("soft provider"));
    let refuse = Arc::new(AtomicBool::new(true));
    let calls = Arc::new(AtomicU64::new(0));
    let (r, c) = (refuse.clone(), calls.clone());
    let server = start(
        provider.clone(),
        common::server_config(1, 4, common::smbd32()),
        move || Stubborn {
            refuse: r.clone(),
            calls: c.clone(),
            hold,
            next: 0,
            retries: VecDeque::new(),
        },
    )
    .expect("server starts");
    let (cpool, mr) = common::client_pool(&provider, 48 << 20, 1 << 20);
    let mut client = Client::connect(
        &*provider,
        server.local_addr(),
        common::smbd32(),
        cpool.claim_slice(0).unwrap(),
        mr,
        Duration::from_secs(5),
    )
    .expect("connect");
    let msg: Vec<u8> = (0..700u32).map(|i| (i * 13) as u8).collect();
    client.send(&msg).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while calls.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "the layer was never called");
        std::thread::sleep(Duration::from_millis(1));
    }
    let t0 = Instant::now();
    let c0 = calls.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(300));
    let n = calls.load(Ordering::Relaxed) - c0;
    let ms = t0.elapsed().as_millis() as u64;
    assert!(
        n <= ms + 20,
        "{n} calls in {ms} ms while refused: the worker retries without anything freed"
    );
    assert!(
        n >= 1,
        "no retry at all in {ms} ms: the timer scan should make one"
    );
    refuse.store(false, Ordering::Relaxed);
    let echoed = client
        .recv_with(Duration::from_secs(5), |m| m == &msg[..])
        .expect("the message is answered once the refusal lifts");
    assert!(echoed, "the echo differs");
    let t = server.stats().totals();
    assert_eq!(t.messages_in, 1);
    assert_eq!(t.messages_out, 1);
    let _alloc = client.close(Duration::from_secs(2));
    let stats = server.shutdown();
    for c in stats.pool_classes() {
        assert_eq!(c.free, c.total, "pool class {} has buffers out", c.name);
    }
}

#[test]
fn a_pushed_back_message_is_retried_when_something_may_have_freed_not_every_turn() {
    refused_then_served(false);
}

#[test]
fn a_held_request_woken_when_freed_is_retried_when_something_may_have_freed_not_every_turn() {
    refused_then_served(true);
}
