//! The verbs data path: a thin shell around the protocol engines of [`crate::proto::send`] and
//! [`crate::proto::recv`]. The shell owns the queue pairs, the completion queue and the
//! registered FIFO and ring memory: it reads what the NIC wrote (clear-to-send entries, the
//! credit word, eager headers, sizes) into events for the engine and turns the engine's answers
//! into work requests ([`send`](super::send), [`recv`](super::recv)). The protocol itself is
//! described in `docs/protocol.md`.
//!
//! This module holds what both directions share: the queue depths and work-request ids, the
//! comm's state (`Common`), its polling and the text of errors; its children hold the failure
//! state later calls take up (`failover`), the notices to and from the peer (`notices`) and what
//! an idle call looks at (`liveness`); `super::post` books and posts work requests. `test` polls
//! the comm's one CQ in batches; a failed completion kills the comm with a WARN naming device,
//! port, QPN, peer, status, vendor error and a hint; later calls fail fast. A peer that vanished
//! (out-of-band socket closed) fails pending requests after a grace period. Nothing on the data
//! path allocates: requests, work requests and scatter lists are fixed arrays.

use super::nic::{Nic, NicPort, Verbs};
use crate::error::{Error, Kind, Result};
use crate::transport::oob::pulse::{self as oob, PeerState};
use crate::proto::qps::{Fault, OnFault, QpStates, Recovery, Source};
use crate::proto::verbs::{Mismatch, Notice, EAGER_HDR, MAX_NOTICE};
use crate::proto::{Explain, ProtoError};
use crate::sys::ib::*;
use crate::sys::verbs::{wc_status_hint, wc_status_name};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::time::Duration;

mod failover;
mod liveness;
mod notices;

pub(super) use super::post::{mr_for, post_chain, rdma_wr, SqBook};
pub(super) use crate::proto::qps::Drain;
pub(super) use failover::once;
use liveness::event_hint;
pub use crate::proto::recv::{FLUSH_REQS, RECV_REQS};
pub use crate::proto::send::{RTS_HDRS, SEND_REQS};
const POLL_BATCH: usize = 16;
/// How long completions may still arrive after the peer's socket closed.
const EOF_GRACE: Duration = Duration::from_millis(500);
/// How long a failed completion of the kind a dead link causes waits for the port's state or
/// PORT_ERR event to say so, before the error is reported without a cause. Packets stop before
/// the kernel marks the port down, and on a loaded host (two polling ranks on two emulated CPUs)
/// `ip link set down` can take hundreds of milliseconds to get there.
const CAUSE_WAIT: Duration = Duration::from_millis(1500);
const LIVENESS_EVERY: Duration = Duration::from_millis(10);
/// How often an idle comm looks at its peer's out-of-band socket (a system call per comm).
const PEER_EVERY: Duration = Duration::from_millis(100);
/// Idle calls between two looks at the clock.
const IDLE_CALLS: u32 = 64;

/// A work request's id: its kind in the top byte, the request slot in the low 16 bits; a
/// signaled one on a booked send queue ([`SqBook`]) also has its queue pair's index in the next
/// byte and its place in that queue (the low 32 bits of the count of posts so far) above the slot.
pub(super) const KIND_SHIFT: u32 = 56;
/// A rendezvous part's completing write also names its part (logical queue pair) in bits
/// 12..16, above the request slot (below 4096).
pub(super) const PART_SHIFT: u32 = 12;
pub(super) const REQ_MASK: u64 = (1 << PART_SHIFT) - 1;
const _: () = assert!(SEND_REQS + RTS_HDRS <= REQ_MASK as usize && crate::proto::verbs::MAX_QPS <= 16);
pub(super) const QP_SHIFT: u32 = 48;
pub(super) const SEQ_SHIFT: u32 = 16;
pub(super) const KIND_SEND: u64 = 1;
pub(super) const KIND_RECV: u64 = 2;
/// The id of the receives a receiver keeps posted (what setup posts, and a NIC completes).
pub const RECV_WR_ID: u64 = KIND_RECV << KIND_SHIFT;
pub(super) const KIND_CTRL: u64 = 3;
pub(super) const KIND_FLUSH: u64 = 4;
/// The marker posted on a failed queue pair once it is in ERR: its (flushed) completion comes
/// after every other of that queue, so the queue is drained once it is seen. Its queue pair's
/// index is in the low byte.
pub(super) const KIND_DRAIN: u64 = 5;
/// How long a failover waits for its drain markers (and for room for what it writes again).
pub(super) const DRAIN_WAIT: Duration = Duration::from_millis(crate::proto::qps::DRAIN_WAIT_MS);
/// How long notices may wait for the out-of-band socket to take them.
const NOTICE_WAIT: Duration = Duration::from_secs(2);

/// Queue depths (CQs are sized from them: every work request that can be outstanding). Providers
/// round a queue up to a power of two slots with one kept empty, so each is 2^k - 1. Every post
/// on a send queue is counted ([`SqBook`]): a send or receive that finds no room waits (NCCL is
/// told "not yet") instead of overflowing the queue, so the depths are a choice of memory
/// against back-pressure, not a bound the protocol must stay under. The sender's 127 hold the
/// data and size writes of 32 rendezvous sends (NCCL's requests per comm; more, of the 256 a
/// grouped receive allows, wait for room) and a run of unsignaled eager writes; staged sends,
/// posted in up to 4 parts, may wait for room when 32 are in flight.
pub const SEND_QP_SQ: u32 = 127;
/// The receiver posts a CTS write per receive that needs one (at most 32 in flight) and credit
/// writes, and signals one in 31 (half the depth).
pub const RECV_QP_SQ: u32 = 63;
/// Receives pre-posted on each receiver QP (topped up at an idle moment once a quarter is used,
/// at once when half is, and before each CTS or credit write that needs more): every write with
/// an immediate that may arrive must find one (each ring slot's, one per buffer of each receive
/// with a CTS out).
pub const RECV_QP_RQ: u32 = 127;
// Every ring slot and every one of 32 ungrouped receives (grouped ones may wait: a receive whose
// CTS could bring more writes than there are receives posted is not posted yet).
const _: () = assert!(RECV_QP_RQ as usize >= RING_SLOTS + crate::proto::recv::RECV_REQS + crate::proto::verbs::MAX_GROUP);
/// Bytes a send work request carries inline (eager header and payload; a rendezvous payload of
/// host memory this small; the size word; a CTS entry, a credit word): a message of up to 16
/// bytes goes inline, and the queue's slots stay
/// small (inline room is part of every slot: on rxe 48 keeps a slot at 256 bytes, 64 doubles
/// it). A group of CTS entries (64 bytes and more) is read from registered memory.
pub const SEND_INLINE: u32 = 48;
/// What a connection's shells run with, read from the configuration once, at setup: the shells
/// read no global configuration themselves (a simulator hands them its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub depths: Depths,
    /// NCCL_IB_RESILIENCY_PORT_FAILOVER (where the comm has a queue pair to fail over to).
    pub failover: bool,
    /// NCCL_IB_RESILIENCY_PORT_RECOVERY, its start delay (ms) and its attempts.
    pub recovery: bool,
    pub recovery_delay_ms: u64,
    pub recovery_attempts: u32,
    /// NCCL_IB_RETURN_ASYNC_EVENTS: a fatal asynchronous event fails the comm (else it is logged).
    pub return_async_events: bool,
    /// NCCL_IB_AR_THRESHOLD: messages above it are split from their completion under adaptive
    /// routing.
    pub ar_threshold: usize,
    /// NCCL_GDR_FLUSH_DISABLE.
    pub flush_disable: bool,
    /// RIVET_STATS: counts reported at close.
    pub stats: bool,
    /// Where the connection's sequence numbers and clear-to-send indices start: zero on the
    /// wire; near their wrap in the simulator.
    pub origin: crate::proto::send::Origin,
    /// NCCL_IB_MQP_RETRY_*: how often, and how much later each time, a failover tries again to
    /// move a queue pair to ERR that the device refused (at later calls, never with a sleep).
    pub mqp_retry: super::res::MqpRetry,
}

impl Settings {
    pub fn from_config() -> Settings {
        let c = crate::config::get();
        Settings {
            depths: Depths::get(),
            failover: c.ib_failover,
            recovery: c.ib_recovery,
            recovery_delay_ms: c.ib_recovery_delay_ms,
            recovery_attempts: c.ib_recovery_attempts,
            return_async_events: c.ib_return_async_events,
            ar_threshold: c.ib_ar_threshold,
            flush_disable: c.gdr_flush_disable,
            stats: c.stats,
            origin: crate::proto::send::Origin::default(),
            mqp_retry: c.ib_mqp_retry,
        }
    }
}

/// The depths a comm's queues are made with: the constants above, or with RIVET_IB_MIN_QUEUES=1
/// (a test setting) the shallowest the protocol allows, so that tests reach back-pressure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Depths {
    pub send_sq: u32,
    pub recv_sq: u32,
    pub recv_rq: u32,
}

impl Depths {
    pub const DEFAULT: Depths = Depths { send_sq: SEND_QP_SQ, recv_sq: RECV_QP_SQ, recv_rq: RECV_QP_RQ };
    /// Send queues of 8 (one signaled in 4), and receives for the ring and one full group (and
    /// the drain marker's).
    pub const MIN: Depths = Depths { send_sq: 8, recv_sq: 8, recv_rq: (RING_SLOTS + crate::proto::verbs::MAX_GROUP) as u32 + 1 };

    pub fn get() -> Depths {
        if crate::config::get().ib_min_queues {
            Depths::MIN
        } else {
            Depths::DEFAULT
        }
    }

    /// Receives kept posted on each receiver queue pair: all but one, the room a failover's
    /// drain marker takes.
    pub fn recvs_posted(&self) -> u32 {
        self.recv_rq - 1
    }

    /// Completions the sender's CQ must hold: every work request of its send queues. Running,
    /// only the signaled ones complete, but when a queue pair fails every work request on it
    /// completes in error, unsignaled ones too, and an overflowing CQ is an error of the whole
    /// device.
    pub fn send_cq(&self, nqps: u32) -> u32 {
        nqps * self.send_sq
    }

    /// Completions the receiver's CQ must hold: every work request of its queues and the flush
    /// queue pair's.
    pub fn recv_cq(&self, nqps: u32) -> u32 {
        nqps * (self.recv_sq + self.recv_rq) + FLUSH_QP_SQ + 1
    }
}
pub const FLUSH_QP_SQ: u32 = FLUSH_REQS as u32 + 1;
/// Eager ring slots at each receiver: eager messages in flight per connection before the
/// receiver's credit returns (NCCL keeps at most 8 steps in flight per connection). Each is
/// RIVET_IB_EAGER_MAX (8 KiB) of registered memory.
pub const RING_SLOTS: usize = 8;
/// Bytes of the sender's header buffer.
pub const HDRS_BYTES: usize = (SEND_REQS + RTS_HDRS) * EAGER_HDR;

/// Bytes of one eager ring slot for a given eager limit.
pub fn slot_bytes(eager_max: usize) -> usize {
    (EAGER_HDR + eager_max).next_multiple_of(64)
}

/// A failed completion whose meaning waits for its port's verdict (Soft-RoCE fails a send with
/// LOC_QP_OP_ERR as soon as its netdev is down, which the port's state and PORT_ERR event may
/// show a moment later): failed over once the port is seen down, the comm's error once
/// CAUSE_WAIT is over without that. Looked at again at each call, never waited for.
struct Verdict {
    wc: ibv_wc,
    /// The member whose CQ it came from, and the data queue pairs that fail over if the port
    /// is down (one; or, for a flush queue pair's read, the member's).
    m: usize,
    mask: u32,
    /// Until when (coarse ms).
    until: u64,
}

/// State shared by both directions: the peer, its out-of-band socket, the death certificate.
pub struct Common<N: Nic = Verbs> {
    /// Member 0 of the device (its only port, for a physical one): what messages name.
    pub port: &'static N::Port,
    /// Every member of the device; queue pair `q` is on member `q % ports.len()`.
    pub ports: &'static [&'static N::Port],
    /// Our QPNs and the member each is on, for matching asynchronous QP events: the data queue
    /// pairs (the first `ndata`, in order), then flush queue pairs.
    qpns: [u32; crate::proto::verbs::MAX_QPS + super::fuse::MAX_MEMBERS],
    qp_member: [u8; crate::proto::verbs::MAX_QPS + super::fuse::MAX_MEMBERS],
    nqpns: usize,
    ndata: usize,
    /// Failover (NCCL_IB_RESILIENCY_PORT_FAILOVER), where the comm has a queue pair to fail over to.
    pub(super) failover: bool,
    /// What the connection runs with.
    pub(super) set: Settings,
    /// The data queue pairs as failover and recovery see them: found failed, failed over, named
    /// dead by the peer, drained; refused moves to ERR; recovery's schedule.
    pub(super) qs: QpStates,
    /// Why queue pairs failed, for the comm's error if none is left.
    causes: Vec<String>,
    /// Each member's PORT_ERR count (`NicPort::downs`) when the comm began or last took a queue
    /// pair of it back: a higher count now says the port went down since, even if it is up again.
    downs_at: [u32; super::fuse::MAX_MEMBERS],
    /// Failover notices from the peer not yet acted on, in the order they came (the shells act
    /// on them in that order: a Recover and an account, or a Fail and a Recovered, mean
    /// different things the other way round).
    pub(super) notices: std::collections::VecDeque<Notice>,
    /// How each data queue pair was connected (to take a failed one back).
    pub(super) links: Vec<super::res::Link>,
    /// Bytes of the out-of-band socket not yet a whole notice, and a mismatch it brought.
    inbox: Vec<u8>,
    /// Notices not yet taken by the out-of-band socket (written on at each call, in order), and
    /// since when (coarse ms) they wait.
    outbox: Vec<u8>,
    outbox_since: u64,
    /// Failed completions waiting for their port's verdict: later failed completions of their
    /// queue pairs are part of the same verdict.
    verdicts: Vec<Verdict>,
    /// The comm's error, waiting (until the coarse ms) for the port's state to show the cause of
    /// a failure a dead link causes: the comm takes nothing new meanwhile, and dies with the
    /// error once the cause is found or the time is over.
    dying: Option<(ibv_wc, usize, u64)>,
    /// A shell's failover under way (queue pairs draining, writes to make again).
    failing: bool,
    /// Any of the above: work for the next call (one flag for the idle path to look at).
    pending: bool,
    mismatch: Option<Mismatch>,
    /// `die` is reading the peer's notices (for a mismatch it told of): a failure meanwhile is
    /// not read for again.
    reading_cause: bool,
    /// The end of the out-of-band socket (None) or its error (Some), once reading met it.
    oob_end: Option<Option<std::io::Error>>,
    pub peer: SocketAddr,
    pub oob: OwnedFd,
    dead: Option<Error>,
    /// When the peer's socket was found closed, on the coarse clock (ms).
    eof_since: Option<u64>,
    /// When liveness, and the peer's socket, were last checked, on the coarse clock (ms).
    last_check: u64,
    peer_checked: u64,
    idle_calls: u32,
    pub(super) wc: [ibv_wc; POLL_BATCH],
    /// The member whose CQ each of `wc` came from (QPNs are per device: two members may have the
    /// same).
    pub(super) wc_member: [u8; POLL_BATCH],
    /// The member whose CQ the next poll starts at (turns each poll).
    poll_from: u32,
    /// Posts that waited for room (a send queue full, or too few receives posted): reported
    /// at close with RIVET_STATS=1.
    pub(super) waits: u64,
    /// Bytes posted on each member's queue pairs (data writes; a fused device's striping),
    /// reported at close with RIVET_STATS=1.
    pub(super) member_bytes: [u64; super::fuse::MAX_MEMBERS],
}

impl<N: Nic> Drop for Common<N> {
    fn drop(&mut self) {
        if !self.set.stats {
            return;
        }
        if self.waits > 0 {
            log::info!(
                target: crate::log::INIT,
                "NET/rivet: stats {}: {} post(s) waited for room in a send queue or for posted receives",
                self.where_(self.qpns[0]),
                self.waits
            );
        }
        if self.ports.len() > 1 && self.member_bytes.iter().any(|&b| b > 0) {
            let per: Vec<String> = self.ports.iter().zip(&self.member_bytes).map(|(p, b)| format!("{}:{} {b}", p.dev_name(), p.num())).collect();
            log::info!(target: crate::log::INIT, "NET/rivet: stats {}: bytes sent per member: {}", self.where_(self.qpns[0]), per.join(", "));
        }
    }
}

impl<N: Nic> Common<N> {
    /// Watch one more queue pair of this comm, on member `m`, for asynchronous events (a flush
    /// QP, made late).
    pub(super) fn watch_qp(&mut self, qpn: u32, m: usize) {
        if self.nqpns < self.qpns.len() {
            self.qpns[self.nqpns] = qpn;
            self.qp_member[self.nqpns] = m as u8;
            self.nqpns += 1;
        }
    }

    /// `links`: what setup learnt of each data queue pair's far end (recovery reconnects to it).
    pub fn new(ports: &'static [&'static N::Port], peer: SocketAddr, oob: OwnedFd, qpns: &[u32], links: Vec<super::res::Link>, set: Settings) -> Common<N> {
        let mut q = [0u32; crate::proto::verbs::MAX_QPS + super::fuse::MAX_MEMBERS];
        let mut qm = [0u8; crate::proto::verbs::MAX_QPS + super::fuse::MAX_MEMBERS];
        let n = qpns.len().min(q.len());
        q[..n].copy_from_slice(&qpns[..n]);
        for (i, m) in qm.iter_mut().enumerate().take(n) {
            *m = super::fuse::member_of(i, ports.len()) as u8;
        }
        Common {
            port: ports[0],
            ports,
            qpns: q,
            qp_member: qm,
            nqpns: n,
            ndata: n,
            failover: set.failover && n > 1,
            qs: QpStates::new(n, set.mqp_retry.into(), Recovery { on: set.recovery, delay_ms: set.recovery_delay_ms, attempts: set.recovery_attempts }),
            set,
            causes: Vec::new(),
            downs_at: std::array::from_fn(|m| ports.get(m).map_or(0, |p| p.downs())),
            notices: std::collections::VecDeque::new(),
            links,
            inbox: Vec::new(),
            outbox: Vec::new(),
            outbox_since: 0,
            verdicts: Vec::new(),
            dying: None,
            failing: false,
            pending: false,
            mismatch: None,
            reading_cause: false,
            oob_end: None,
            peer,
            oob,
            dead: None,
            eof_since: None,
            last_check: N::now_ms(),
            peer_checked: N::now_ms(),
            idle_calls: 0,
            // SAFETY: ibv_wc is plain C data; all-zero is a valid (empty) completion.
            wc: unsafe { std::mem::zeroed() },
            wc_member: [0; POLL_BATCH],
            poll_from: 0,
            waits: 0,
            member_bytes: [0; super::fuse::MAX_MEMBERS],
        }
    }

    /// Whether nothing calls for a look: the comm is not dead and no failover is due (the
    /// check of a poll that found nothing).
    #[inline]
    pub(super) fn quiet(&self) -> bool {
        self.dead.is_none() && !self.failover_due()
    }

    pub(super) fn check(&self) -> Result<()> {
        match &self.dead {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    pub(super) fn die(&mut self, e: Error) -> Error {
        if self.dead.is_some() {
            return e;
        }
        // A peer that told of a collective mismatch before it went: that is the cause, not what
        // its going did here (a write that failed, a socket that broke).
        let e = self.peer_mismatch().unwrap_or(e);
        if self.dead.is_none() {
            self.dead = Some(Error::new(e.kind, format!("connection is dead: {e}")));
        }
        e
    }

    /// A failed post on QP `qpn`: the comm is dead, with the reason.
    pub(super) fn post_failed(&mut self, qpn: u32, what: &str, rc: i32) -> Error {
        self.post_failed_on(self.member_of_qpn(qpn), qpn, what, rc)
    }

    /// As `post_failed`, for a queue pair known to be on member `m` (QPNs are per device).
    pub(super) fn post_failed_on(&mut self, m: usize, qpn: u32, what: &str, rc: i32) -> Error {
        let e = Error::system(format!("{}: {what} failed: {}", self.where_on(m, qpn), std::io::Error::from_raw_os_error(rc)));
        self.die(e)
    }

    /// Poll up to a batch of completions into `self.wc`. A failed one kills the comm (flushed
    /// work requests of an already dead comm are only reaped) and has its `wr_id` cleared, so
    /// callers see only successful completions by kind; they call `check` after handling them.
    /// `cqs` are the members' CQs, in member order.
    #[inline(always)]
    pub(super) fn poll(&mut self, cqs: &[N::Cq]) -> Result<usize> {
        // One member (every connection without NIC fusion) and nothing there, the common case
        // of an idle `test`: inline, without the work below.
        if let [cq] = cqs {
            return match N::poll(cq, &mut self.wc) {
                Ok(0) => Ok(0),
                // One successful completion of a work request (most messages' one): nothing for
                // `sort_polled` to look at.
                Ok(1) if self.wc[0].status == IBV_WC_SUCCESS && self.wc[0].wr_id >> KIND_SHIFT != KIND_DRAIN => {
                    self.wc_member[0] = 0;
                    Ok(1)
                }
                Ok(n) => {
                    self.wc_member[..n].fill(0);
                    self.sort_polled(n)
                }
                Err(e) => Err(self.poll_failed(0, e)),
            };
        }
        self.poll_members(cqs)
    }

    /// `poll` of a fused connection: a CQ per member.
    #[inline(never)]
    fn poll_members(&mut self, cqs: &[N::Cq]) -> Result<usize> {
        let mut n = 0;
        // From a member that turns each call, so that a busy one does not keep the others'
        // completions waiting.
        self.poll_from = self.poll_from.wrapping_add(1);
        for i in 0..cqs.len() {
            let m = (self.poll_from as usize + i) % cqs.len();
            let k = match N::poll(&cqs[m], &mut self.wc[n..]) {
                Ok(k) => k,
                Err(e) => return Err(self.poll_failed(m, e)),
            };
            self.wc_member[n..n + k].fill(m as u8);
            n += k;
            if n == POLL_BATCH {
                break;
            }
        }
        self.sort_polled(n)
    }

    #[cold]
    #[inline(never)]
    fn poll_failed(&mut self, m: usize, e: Error) -> Error {
        self.die(Error::system(format!("{}: {e}", self.where_on(m, 0))))
    }

    /// Look at `n` polled completions: markers and failures handled here (see `poll`).
    #[inline(never)]
    fn sort_polled(&mut self, n: usize) -> Result<usize> {
        for i in 0..n {
            let wc = self.wc[i];
            if wc.wr_id >> KIND_SHIFT == KIND_DRAIN {
                // A failover's marker (flushed): its queue is drained. Nothing for the caller.
                self.qs.marker((wc.wr_id & 0xff) as usize);
                self.wc[i].wr_id = 0;
                continue;
            }
            if wc.status == IBV_WC_SUCCESS {
                continue;
            }
            self.wc[i].wr_id = 0;
            if self.dying.is_some() || (wc.status == IBV_WC_WR_FLUSH_ERR && self.dead.is_some()) {
                continue; // the comm's error is decided (or waits for its cause)
            }
            let m = self.wc_member[i] as usize;
            let at = self.qpns[..self.nqpns].iter().zip(&self.qp_member).position(|(&q, &qm)| q == wc.qp_num && qm as usize == m);
            let src = match at {
                Some(q) if q < self.ndata => Source::Data(q),
                Some(_) => Source::Flush,
                None => Source::Unknown,
            };
            let fault = match wc.status {
                IBV_WC_WR_FLUSH_ERR => Fault::Flushed,
                IBV_WC_RETRY_EXC_ERR => Fault::RetryExceeded,
                IBV_WC_RNR_RETRY_EXC_ERR => Fault::RnrRetryExceeded,
                IBV_WC_LOC_QP_OP_ERR => Fault::LocalQpOp,
                _ => Fault::Other,
            };
            let awaiting = matches!(src, Source::Data(q) if self.verdicts.iter().any(|v| v.mask & (1 << q) != 0));
            // The port's word, asked only where it decides (each looks at the device).
            let (port, was) = (self.member_port(m), self.downs_at(m));
            let down = || failover::port_down(port) || port.downs() != was;
            let known = || failover::cause_on(port, wc.qp_num).is_some();
            match self.qs.on_fault(fault, src, self.failover, awaiting, down, known) {
                OnFault::Ignore => {} // flushed from a queue pair already failed over, or awaiting its verdict
                OnFault::AwaitPort => {
                    // Soft-RoCE fails a send with LOC_QP_OP_ERR as soon as its netdev is down,
                    // which the port's state and PORT_ERR event may show a moment later: the
                    // queue pair waits for that verdict (at later calls, for at most CAUSE_WAIT).
                    let mask = match src {
                        Source::Data(q) => 1 << q,
                        _ => {
                            // A flush read: it counts as done now (its caller sees its id and
                            // makes a new flush queue pair later); the member's data queue pairs
                            // await the verdict.
                            self.wc[i].wr_id = wc.wr_id;
                            self.on_member(m)
                        }
                    };
                    self.verdicts.push(Verdict { wc, m, mask, until: N::now_ms() + CAUSE_WAIT.as_millis() as u64 });
                    self.pending = true;
                }
                OnFault::FailOver => {
                    let e = self.wc_error(&wc, m);
                    if let Source::Data(q) = src {
                        self.mark_failed(1 << q, &e.to_string());
                    } else {
                        // A flush queue pair: its member's data queue pairs fail over, and the
                        // read counts as done (its caller sees its id).
                        self.mark_failed(self.on_member(m), &e.to_string());
                        self.wc[i].wr_id = wc.wr_id;
                    }
                }
                OnFault::AwaitCause => {
                    // The port's state may show a dead link's cause only a moment later: the
                    // comm takes nothing new from now on, and its error waits for the cause (at
                    // later calls, for at most CAUSE_WAIT) before it blames the peer.
                    self.dying = Some((wc, m, N::now_ms() + CAUSE_WAIT.as_millis() as u64));
                    self.pending = true;
                }
                OnFault::Die => {
                    let e = self.wc_error(&wc, m);
                    self.die(e);
                }
            }
        }
        Ok(n)
    }

    /// Adaptive routing on this comm's device (see the free function).
    pub(super) fn adaptive_routing(&self) -> bool {
        adaptive_routing(self.ports)
    }

    /// The member QPN `qpn` is on (the first with it: QPNs are per device; 0 if none).
    fn member_of_qpn(&self, qpn: u32) -> usize {
        self.qpns[..self.nqpns].iter().position(|&q| q == qpn).map_or(0, |i| self.qp_member[i] as usize)
    }

    /// "rxe0:1 QPN 17 (peer ...)": the port of the member QPN `qpn` is on (the first with it).
    pub(super) fn where_(&self, qpn: u32) -> String {
        self.where_on(self.member_of_qpn(qpn), qpn)
    }

    pub(super) fn where_on(&self, m: usize, qpn: u32) -> String {
        let p = self.ports.get(m).unwrap_or(&self.port);
        format!("{}:{} QPN {qpn} (peer {})", p.dev_name(), p.num(), self.peer)
    }

    /// What the protocol engine found, as the comm's error: a mismatch is the application's
    /// (the peer is told, so that it reports the same cause), a violation is the peer's; both
    /// kill the comm. A request NCCL should not have tested is our caller's error only.
    pub(super) fn proto(&mut self, e: ProtoError) -> Error {
        if e.is_internal() {
            return Error::internal(Explain(&e, &self.peer).to_string());
        }
        if let Some(m) = e.notice() {
            self.notify_mismatch(m);
        }
        let err = if e.is_mismatch() {
            Error::usage(Explain(&e, &self.peer).to_string())
        } else {
            Error::remote(format!("{}: {}", self.where_(0), Explain(&e, &self.peer)))
        };
        self.die(err)
    }

    /// A failed work completion as an error that says what and why.
    fn wc_error(&self, wc: &ibv_wc, m: usize) -> Error {
        let op = match wc.wr_id >> KIND_SHIFT {
            KIND_SEND => "RDMA WRITE of a send",
            KIND_RECV => "receive",
            KIND_CTRL => "clear-to-send, credit or announcement write",
            KIND_FLUSH => "flush RDMA READ",
            _ => "work request",
        };
        let kind = match wc.status {
            IBV_WC_REM_ACCESS_ERR
            | IBV_WC_REM_INV_REQ_ERR
            | IBV_WC_REM_OP_ERR
            | IBV_WC_RETRY_EXC_ERR
            | IBV_WC_RNR_RETRY_EXC_ERR
            | IBV_WC_REM_ABORT_ERR => Kind::Remote,
            _ => Kind::System,
        };
        // What the device said about this QP or its port, if anything.
        let cause = self.cause(wc, m).unwrap_or_default();
        let gone = match self.peer_state() {
            PeerState::Gone => format!("; the peer {} has closed its connection, so it most likely exited or crashed", self.peer),
            PeerState::Unreachable(e) => format!("; the peer host {} is unreachable ({e})", self.peer.ip()),
            _ => String::new(),
        };
        Error::new(
            kind,
            format!(
                "{}: {op} failed with {} (vendor error {:#x}): {}{cause}{gone}",
                self.where_on(m, wc.qp_num),
                wc_status_name(wc.status),
                wc.vendor_err,
                wc_status_hint(wc.status)
            ),
        )
    }
}

/// NCCL profiler events of a `size`-byte message over `qps`, logical queue pair `q` carried by
/// physical `map[q]` on member `q % members`: an eager one (`eager`) on logical queue pair 0 as
/// one RDMA WRITE with immediate; a larger one split into `parts` as
/// [`crate::proto::verbs::qp_chunk`] says (on the first `parts` queue pairs: which block a
/// message's parts take is known only once its clear-to-send is read), as plain RDMA WRITEs
/// where adaptive routing splits data from its completion (`ar_split`, the engine's decision).
#[allow(clippy::too_many_arguments)]
pub(super) fn plan_events<N: Nic>(
    size: usize,
    eager: bool,
    parts: usize,
    qps: &[N::Qp],
    map: &[u8],
    members: usize,
    ar_split: bool,
    out: &mut Vec<crate::transport::NetEvent>,
) {
    const WRITE: i32 = IBV_WR_RDMA_WRITE as i32;
    const WRITE_IMM: i32 = IBV_WR_RDMA_WRITE_WITH_IMM as i32;
    let ev = |q: usize, length: usize, opcode: i32| {
        let phys = map.get(q).map_or(q, |&m| m as usize).min(qps.len() - 1);
        crate::transport::NetEvent { device: super::fuse::member_of(phys, members) as i32, qpn: N::qpn(&qps[phys]), length, opcode }
    };
    if eager {
        out.push(ev(0, size, WRITE_IMM));
        return;
    }
    let opcode = if ar_split { WRITE } else { WRITE_IMM };
    let parts = parts.clamp(1, qps.len());
    for q in 0..parts {
        out.push(ev(q, crate::proto::verbs::qp_chunk(size, parts, q).1, opcode));
    }
}

/// Adaptive routing on a device of these members: when every member's fabric has it (as net_ib
/// decides for a send comm).
pub(super) fn adaptive_routing<P: NicPort>(ports: &[&'static P]) -> bool {
    ports.iter().all(|p| p.adaptive_routing())
}

/// The identity registrations of a device with these members carry (`MrInfo::dev`): a
/// physical device's, or a fused device's own (its members' list, made once per fused device),
/// so that a registration of one fused device is refused on another sharing its first member.
pub fn members_id<P: NicPort>(ports: &[&'static P]) -> usize {
    match ports {
        [p] => p.dev_id(),
        _ => ports.as_ptr() as usize,
    }
}

