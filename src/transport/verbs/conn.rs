//! The verbs data path.
//!
//! Every send has a sequence number. Small messages (up to the receiver's eager limit) go
//! *eagerly*: one RDMA WRITE_WITH_IMM of a 32-byte header and the payload into the next slot of a
//! ring of registered buffers at the receiver, without waiting for anything; the receiver matches
//! them to its receives by sequence number and tag and copies them out. Ring slots come back to
//! the sender as credits (a counter the receiver RDMA-writes, in batches or when the sender asks).
//!
//! Large messages are receiver-driven: a receive with a buffer above the eager limit RDMA-writes a
//! clear-to-send (CTS) entry per buffer (address, size, rkey, tag, first sequence number) into a
//! FIFO in the sender's memory. `isend` returns a NULL request until its CTS has arrived, then
//! writes the payload straight into the receive buffer, split across the connection's QPs in
//! 128-byte units; each QP's part ends with an immediate naming the CTS slot and buffer, and the
//! size goes to the receiver's sizes FIFO first. A large send whose CTS has not come announces
//! itself with a header-only eager message, so that a send larger than its receive is reported
//! by both sides instead of waited for.
//!
//! `test` polls the comm's one CQ in batches; a failed completion kills the comm with a WARN
//! naming device, port, QPN, peer, status, vendor error and a hint; later calls fail fast. A peer
//! that vanished (out-of-band socket closed) fails pending requests after a grace period.
//! Nothing here allocates: requests, work requests and scatter lists are fixed arrays.

use super::dev::IbPort;
use super::res::{Cq, QpRts, RegBuf};
use crate::error::{Error, Kind, Result};
use crate::proto::verbs::{
    qp_chunk, seq_offset, Cts, EagerHdr, Imm, Mismatch, EAGER_DATA, EAGER_HDR, EAGER_RTS, EAGER_URGENT, FIFO_BYTES,
    FIFO_DEPTH, NOTICE_SIZE, SIZES_ENTRY,
};
use crate::sys::ib::*;
use crate::sys::verbs::{self, wc_status_hint, wc_status_name};
use crate::transport::{path_of, Conn, MrInfo, Path, RecvBuf, MAX_RECVS};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

pub const SEND_REQS: usize = 32 * MAX_RECVS;
pub const RECV_REQS: usize = 32;
pub const FLUSH_REQS: usize = 32;
const POLL_BATCH: usize = 16;
/// Signal one in this many unsignaled writes per QP (they hold send-queue slots until a later
/// signaled one completes).
const SIGNAL_EVERY: u32 = 32;
/// How long completions may still arrive after the peer's socket closed.
const EOF_GRACE: Duration = Duration::from_millis(500);
/// How long a failed completion of the kind a dead link causes waits for the port's state or
/// PORT_ERR event to say so, before the error is reported without a cause. Packets stop before
/// the kernel marks the port down, and on a loaded host (two polling ranks on two emulated CPUs)
/// `ip link set down` can take hundreds of milliseconds to get there.
const CAUSE_WAIT: Duration = Duration::from_millis(1500);
const LIVENESS_EVERY: Duration = Duration::from_millis(10);
/// Idle calls between two looks at the clock.
const IDLE_CALLS: u32 = 64;

const KIND_SHIFT: u32 = 56;
const KIND_SEND: u64 = 1;
const KIND_RECV: u64 = 2;
const KIND_CTRL: u64 = 3;
const KIND_FLUSH: u64 = 4;

/// Queue depths (CQs are sized from them: every work request that can be outstanding).
pub const SEND_QP_SQ: u32 = (SEND_REQS * 3 + 64) as u32;
pub const RECV_QP_SQ: u32 = 256;
/// Receives pre-posted on each receiver QP: every eager slot plus every send in flight.
pub const RECV_QP_RQ: u32 = 1024;
pub const FLUSH_QP_SQ: u32 = FLUSH_REQS as u32 + 1;
/// Eager ring slots at each receiver.
pub const RING_SLOTS: usize = 32;
/// Header buffers for header-only announcements, after the per-request ones.
pub const RTS_HDRS: usize = 16;
/// Bytes of the sender's header buffer.
pub const HDRS_BYTES: usize = (SEND_REQS + RTS_HDRS) * EAGER_HDR;

/// Bytes of one eager ring slot for a given eager limit.
pub fn slot_bytes(eager_max: usize) -> usize {
    (EAGER_HDR + eager_max).next_multiple_of(64)
}

/// Post `n` zero-length receives on `qp` (each consumes one completion with immediate data).
pub fn post_recvs(qp: &QpRts, n: u32) -> std::result::Result<(), i32> {
    for _ in 0..n {
        let mut wr = ibv_recv_wr { wr_id: KIND_RECV << KIND_SHIFT, next: std::ptr::null_mut(), sg_list: std::ptr::null_mut(), num_sge: 0 };
        let mut bad = std::ptr::null_mut();
        let rc = unsafe { verbs::post_recv(qp.qp().raw(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(rc);
        }
    }
    Ok(())
}

enum PeerState {
    Alive,
    /// The out-of-band socket ended (EOF or reset): the peer process exited or crashed.
    Gone,
    /// The out-of-band socket timed out (keepalive) or lost its route: the peer host stopped
    /// answering.
    Unreachable(std::io::Error),
    Mismatch(Mismatch),
}

/// State shared by both directions: the peer, its out-of-band socket, the death certificate.
pub struct Common {
    pub port: &'static IbPort,
    /// Our QPNs, for matching asynchronous QP events.
    qpns: [u32; crate::proto::verbs::MAX_QPS + 1],
    nqpns: usize,
    pub peer: SocketAddr,
    pub oob: OwnedFd,
    dead: Option<Error>,
    eof_since: Option<Instant>,
    last_check: Instant,
    idle_calls: u32,
    wc: [ibv_wc; POLL_BATCH],
}

impl Common {
    pub fn new(port: &'static IbPort, peer: SocketAddr, oob: OwnedFd, qpns: &[u32]) -> Common {
        let mut q = [0u32; crate::proto::verbs::MAX_QPS + 1];
        let n = qpns.len().min(q.len());
        q[..n].copy_from_slice(&qpns[..n]);
        Common {
            port,
            qpns: q,
            nqpns: n,
            peer,
            oob,
            dead: None,
            eof_since: None,
            last_check: Instant::now(),
            idle_calls: 0,
            wc: unsafe { std::mem::zeroed() },
        }
    }

    fn check(&self) -> Result<()> {
        match &self.dead {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn die(&mut self, e: Error) -> Error {
        if self.dead.is_none() {
            self.dead = Some(Error::new(e.kind, format!("connection is dead: {e}")));
        }
        e
    }

    /// A failed post on QP `qpn`: the comm is dead, with the reason.
    fn post_failed(&mut self, qpn: u32, what: &str, rc: i32) -> Error {
        let e = Error::system(format!("{}: {what} failed: {}", self.where_(qpn), std::io::Error::from_raw_os_error(rc)));
        self.die(e)
    }

    /// Poll up to a batch of completions into `self.wc`. A failed one kills the comm (flushed
    /// work requests of an already dead comm are only reaped) and has its `wr_id` cleared, so
    /// callers see only successful completions by kind; they call `check` after handling them.
    fn poll(&mut self, cq: &Cq) -> Result<usize> {
        let n = cq.poll(&mut self.wc)?;
        for i in 0..n {
            let wc = self.wc[i];
            if wc.status == IBV_WC_SUCCESS {
                continue;
            }
            self.wc[i].wr_id = 0;
            if wc.status == IBV_WC_WR_FLUSH_ERR && self.dead.is_some() {
                continue;
            }
            let e = self.wc_error(&wc);
            self.die(e);
        }
        Ok(n)
    }

    fn where_(&self, qpn: u32) -> String {
        format!("{}:{} QPN {qpn} (peer {})", self.port.dev.name, self.port.port, self.peer)
    }

    /// Whether the peer's out-of-band socket is closed (it exited or crashed), or has a notice.
    fn peer_state(&self) -> PeerState {
        let mut b = [0u8; NOTICE_SIZE];
        let r = unsafe {
            libc::recv(self.oob.as_raw_fd(), b.as_mut_ptr() as *mut _, NOTICE_SIZE, libc::MSG_PEEK | libc::MSG_DONTWAIT)
        };
        if r == NOTICE_SIZE as isize {
            if let Some(m) = Mismatch::decode(&b) {
                return PeerState::Mismatch(m);
            }
        }
        if r > 0 {
            return PeerState::Alive;
        }
        if r == 0 {
            return PeerState::Gone;
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => PeerState::Alive,
            _ if crate::transport::socket::sock::host_unreachable(&e) => PeerState::Unreachable(e),
            _ => PeerState::Gone,
        }
    }

    /// Tell the receiver why this sender fails (best effort; the socket is otherwise idle).
    fn notify_mismatch(&self, m: Mismatch) {
        let b = m.encode();
        unsafe { libc::send(self.oob.as_raw_fd(), b.as_ptr() as *const _, b.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    }

    /// A failed work completion as an error that says what and why.
    fn wc_error(&self, wc: &ibv_wc) -> Error {
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
        let dev = &self.port.dev;
        let find_cause = || {
            dev.poll_events();
            if let Some((_, ev)) = dev.qp_event(std::iter::once(wc.qp_num)) {
                Some(format!("; cause: asynchronous event {ev} on this QP: {}", event_hint(ev)))
            } else if dev.port_down(self.port.port) {
                Some(format!("; cause: the port {}:{} is down (PORT_ERR): check the link and the switch", dev.name, self.port.port))
            } else {
                // The event may not have been delivered yet: ask the port itself.
                let state = dev.port_state(self.port.port).filter(|s| *s != "ACTIVE")?;
                Some(format!("; cause: the port {}:{} is {state}: check the link and the switch", dev.name, self.port.port))
            }
        };
        // A link that just went down can fail the transport's retries before the port's state or
        // its PORT_ERR event shows it: for the errors a dead link causes, look again for a while
        // (bounded, and only on this error path) before blaming the peer.
        let link_error = matches!(wc.status, IBV_WC_RETRY_EXC_ERR | IBV_WC_RNR_RETRY_EXC_ERR);
        let mut cause = find_cause();
        let deadline = std::time::Instant::now() + CAUSE_WAIT;
        while cause.is_none() && link_error && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            cause = find_cause();
        }
        let cause = cause.unwrap_or_default();
        let gone = match self.peer_state() {
            PeerState::Gone => format!("; the peer {} has closed its connection, so it most likely exited or crashed", self.peer),
            PeerState::Unreachable(e) => format!("; the peer host {} is unreachable ({e})", self.peer.ip()),
            _ => String::new(),
        };
        Error::new(
            kind,
            format!(
                "{}: {op} failed with {} (vendor error {:#x}): {}{cause}{gone}",
                self.where_(wc.qp_num),
                wc_status_name(wc.status),
                wc.vendor_err,
                wc_status_hint(wc.status)
            ),
        )
    }

    /// Called when a call made no progress: notices a vanished peer or a fatal device event.
    fn idle(&mut self, outstanding: usize) -> Result<()> {
        // Reading the clock is a system call on hosts without a usable TSC (VMs on HPET): keep
        // it off the polling path and look only every IDLE_CALLS idle calls.
        self.idle_calls = self.idle_calls.wrapping_add(1);
        if self.idle_calls % IDLE_CALLS != 0 {
            return Ok(());
        }
        let now = Instant::now();
        if now.duration_since(self.last_check) < LIVENESS_EVERY {
            return Ok(());
        }
        self.last_check = now;
        let dev = &self.port.dev;
        dev.poll_events();
        if let Err(e) = dev.check_fatal() {
            return Err(self.die(e));
        }
        if let Some((qpn, ev)) = dev.qp_event(self.qpns[..self.nqpns].iter().copied()) {
            let e = Error::system(format!("{}: asynchronous event {ev}: {}", self.where_(qpn), event_hint(ev)));
            return Err(self.die(e));
        }
        match self.peer_state() {
            PeerState::Alive => return Ok(()),
            PeerState::Mismatch(m) => {
                let e = Error::usage(format!(
                    "collective mismatch with the peer {}: a send of {} bytes with tag {} into a receive of {} bytes; every rank must run the same collectives with the same sizes",
                    self.peer, m.send_size, m.tag, m.recv_size
                ));
                return Err(self.die(e));
            }
            PeerState::Unreachable(err) => {
                let e = Error::remote(format!(
                    "{}:{}: the peer host {} is unreachable (its out-of-band connection: {err}): it stopped answering for RIVET_TIMEOUT seconds, so it is down or the network between the hosts is broken; {outstanding} request(s) of ours outstanding",
                    self.port.dev.name,
                    self.port.port,
                    self.peer.ip()
                ));
                return Err(self.die(e));
            }
            PeerState::Gone => {}
        }
        let since = *self.eof_since.get_or_insert(now);
        if now.duration_since(since) < EOF_GRACE {
            return Ok(());
        }
        let e = Error::remote(format!(
            "{}:{}: the peer {} closed its connection (its process exited or crashed) with {outstanding} request(s) of ours outstanding",
            self.port.dev.name, self.port.port, self.peer
        ));
        Err(self.die(e))
    }
}

fn event_hint(ev: &str) -> &'static str {
    match ev {
        "QP_ACCESS_ERR" => "the peer wrote with an invalid or stale rkey, or outside a registered buffer",
        "QP_REQ_ERR" => "a malformed request reached this queue pair",
        _ => "the queue pair failed",
    }
}

fn mr_for<'a>(mr: *const MrInfo, ptr: usize, size: usize, dev: usize, need: u32, what: &str) -> Result<&'a MrInfo> {
    if mr.is_null() {
        return Err(Error::internal(format!("{what} of {size} bytes at {ptr:#x} without a memory handle")));
    }
    let m = unsafe { &*mr };
    if m.dev != dev {
        return Err(Error::internal(format!(
            "{what}: the memory handle was registered on another device (regMr must be called on a comm of the same device)"
        )));
    }
    if !m.covers(ptr, size) {
        return Err(Error::internal(format!(
            "{what}: [{ptr:#x}, +{size}) is not inside its registration [{:#x}, +{})",
            m.addr, m.len
        )));
    }
    if m.access & need != need {
        return Err(Error::internal(format!(
            "{what}: the buffer was registered without the access it needs ({:#x} lacks {need:#x}): register receive buffers through a receive comm",
            m.access
        )));
    }
    Ok(m)
}

fn dev_id(port: &IbPort) -> usize {
    &*port.dev as *const _ as usize
}

fn post_chain(qp: &QpRts, wrs: &mut [ibv_send_wr], sges: &mut [ibv_sge], k: usize) -> std::result::Result<(), i32> {
    for i in 0..k {
        wrs[i].sg_list = if wrs[i].num_sge > 0 { &mut sges[i] } else { std::ptr::null_mut() };
        wrs[i].next = if i + 1 < k { &mut wrs[i + 1] } else { std::ptr::null_mut() };
    }
    let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
    match unsafe { verbs::post_send(qp.qp().raw(), wrs.as_mut_ptr(), &mut bad) } {
        0 => Ok(()),
        rc => Err(rc),
    }
}

fn rdma_wr(op: u32, wr_id: u64, remote: u64, rkey: u32, nsge: i32) -> ibv_send_wr {
    let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
    w.wr_id = wr_id;
    w.opcode = op;
    w.num_sge = nsge;
    w.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: remote, rkey };
    w
}

// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum St {
    Free,
    Posted,
}

#[derive(Clone, Copy)]
struct SendReq {
    st: St,
    pending: u32,
    size: usize,
}

/// A rendezvous send's writes: where they go and how far each QP's part has been posted (a
/// partial send posts its parts as the staging engine's copy makes them ready).
#[derive(Clone, Copy, Default)]
struct Rdv {
    data: u64,
    lkey: u32,
    size: usize,
    addr: u64,
    rkey: u32,
    /// Immediate data (network order) that completes each QP's part.
    imm: u32,
    sizes_off: u64,
    posted: [usize; crate::proto::verbs::MAX_QPS],
    /// A bit per QP whose part is fully posted (its completing write included).
    closed: u32,
}

/// Where the sender's eager messages go.
pub struct Ring {
    pub addr: u64,
    pub rkey: u32,
    pub slots: usize,
    pub eager_max: usize,
}

pub struct VerbsSend {
    // Field order is drop order: QPs before their CQ, MRs before their memory.
    qps: Vec<QpRts>,
    cq: Cq,
    /// The CTS FIFO the receiver writes into, followed by the credit word.
    fifo: RegBuf,
    /// Sizes of rendezvous sends, staged for the write into the receiver's sizes FIFO.
    sizes_out: RegBuf,
    /// Eager headers, one per request slot.
    hdrs: RegBuf,
    rem_sizes_addr: u64,
    rem_sizes_rkey: u32,
    ring: Ring,
    /// Sequence number of the next send.
    seq: u32,
    /// Eager slots used so far (the next one is `eager_sent % ring.slots`).
    eager_sent: u64,
    /// CTS index the next large send looks at.
    cts_head: u64,
    /// Buffers of CTS `cts_head` already taken by large sends.
    cts_used: u8,
    /// A large send announced with a header-only eager message (its sequence number).
    rts_for: Option<u32>,
    /// Eager writes posted unsignaled since the last signaled one.
    unsignaled: u32,
    reqs: Box<[SendReq]>,
    rdv: Box<[Rdv]>,
    free: Vec<u16>,
    wrs: [ibv_send_wr; 3],
    sges: [ibv_sge; 3],
    pub c: Common,
}

unsafe impl Send for VerbsSend {}

impl VerbsSend {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        c: Common,
        qps: Vec<QpRts>,
        cq: Cq,
        fifo: RegBuf,
        sizes_out: RegBuf,
        hdrs: RegBuf,
        rem_sizes: (u64, u32),
        ring: Ring,
    ) -> VerbsSend {
        let empty = SendReq { st: St::Free, pending: 0, size: 0 };
        let mut free = Vec::with_capacity(SEND_REQS);
        free.extend((0..SEND_REQS as u16).rev());
        VerbsSend {
            qps,
            cq,
            fifo,
            sizes_out,
            hdrs,
            rem_sizes_addr: rem_sizes.0,
            rem_sizes_rkey: rem_sizes.1,
            ring,
            seq: 0,
            eager_sent: 0,
            cts_head: 0,
            cts_used: 0,
            rts_for: None,
            unsignaled: 0,
            reqs: vec![empty; SEND_REQS].into_boxed_slice(),
            rdv: vec![Rdv::default(); SEND_REQS].into_boxed_slice(),
            free,
            wrs: unsafe { std::mem::zeroed() },
            sges: unsafe { std::mem::zeroed() },
            c,
        }
    }

    /// Post what is newly ready (the first `ready` bytes) of rendezvous send `idx`: per QP, one
    /// RDMA WRITE of its part's new bytes, and once the part is complete the write that carries
    /// the immediate (QP 0: the size into the receiver's sizes FIFO) and is signaled.
    fn post_rdv(&mut self, idx: usize, ready: usize) -> Result<()> {
        let mut p = self.rdv[idx];
        let nqps = self.qps.len();
        let wr_id = (KIND_SEND << KIND_SHIFT) | idx as u64;
        for q in 0..nqps {
            if p.closed & (1 << q) != 0 {
                continue;
            }
            let (off, len) = qp_chunk(p.size, nqps, q);
            let avail = ready.saturating_sub(off).min(len);
            let mut k = 0;
            if avail > p.posted[q] {
                let from = (off + p.posted[q]) as u64;
                self.sges[k] = ibv_sge { addr: p.data + from, length: (avail - p.posted[q]) as u32, lkey: p.lkey };
                self.wrs[k] = rdma_wr(IBV_WR_RDMA_WRITE, wr_id, p.addr + from, p.rkey, 1);
                k += 1;
                p.posted[q] = avail;
            }
            if avail == len {
                if q == 0 {
                    // The size, then the immediate that completes this QP's part.
                    self.sges[k] = ibv_sge { addr: self.sizes_out.addr() + p.sizes_off, length: 8, lkey: self.sizes_out.mr.lkey() };
                    self.wrs[k] = rdma_wr(IBV_WR_RDMA_WRITE_WITH_IMM, wr_id, self.rem_sizes_addr + p.sizes_off, self.rem_sizes_rkey, 1);
                    self.wrs[k].send_flags |= IBV_SEND_INLINE;
                    k += 1;
                } else if k > 0 {
                    self.wrs[k - 1].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
                } else {
                    self.wrs[0] = rdma_wr(IBV_WR_SEND_WITH_IMM, wr_id, 0, 0, 0);
                    k = 1;
                }
                self.wrs[k - 1].__bindgen_anon_1.imm_data = p.imm;
                self.wrs[k - 1].send_flags |= IBV_SEND_SIGNALED;
                p.closed |= 1 << q;
            }
            if k > 0 {
                self.post(q, k)?;
            }
        }
        self.rdv[idx] = p;
        Ok(())
    }

    fn entry(&self, slot: usize, r: usize) -> Cts {
        let p = self.fifo.buf.ptr() as *const Cts;
        unsafe { std::ptr::read_volatile(p.add(slot * MAX_RECVS + r)) }
    }

    /// The stamp of a CTS entry, loaded alone with acquire: the entry's other fields are read
    /// after it. A 32-byte volatile read is several loads that Arm may reorder, so reading the
    /// stamp in the same read as the fields could pair a new stamp with the slot's old fields.
    fn stamp(&self, slot: usize, r: usize) -> u32 {
        let p = unsafe { (self.fifo.buf.ptr() as *mut Cts).add(slot * MAX_RECVS + r) };
        // SAFETY: the FIFO is registered memory that lives as long as the connection, the stamp is
        // an aligned u32 that only the NIC writes, and no Rust reference to it exists.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(std::ptr::addr_of_mut!((*p).stamp)) }.load(Ordering::Acquire)
    }

    /// Ring slots the receiver has released (its credit word).
    fn credits_freed(&self) -> u64 {
        unsafe { std::ptr::read_volatile(self.fifo.buf.ptr().add(FIFO_BYTES) as *const u64) }
    }

    fn free_slots(&self) -> usize {
        self.ring.slots.saturating_sub(self.eager_sent.wrapping_sub(self.credits_freed()) as usize)
    }

    fn post(&mut self, q: usize, k: usize) -> Result<()> {
        if let Err(rc) = post_chain(&self.qps[q], &mut self.wrs, &mut self.sges, k) {
            return Err(self.c.post_failed(self.qps[q].qp().qpn(), "ibv_post_send", rc));
        }
        Ok(())
    }

    /// One eager write into the receiver's ring: header (+ payload). Returns whether it went
    /// inline and unsignaled: the payload was copied at post time, nothing to wait for.
    /// `on_gpu`: the payload is GPU memory, which only the NIC may read (never inline).
    fn post_eager(&mut self, hdr_slot: usize, h: EagerHdr, data: u64, lkey: u32, wr_id: u64, on_gpu: bool) -> Result<bool> {
        let slot = (self.eager_sent % self.ring.slots as u64) as usize;
        let hp = unsafe { self.hdrs.buf.ptr().add(hdr_slot * EAGER_HDR) as *mut EagerHdr };
        unsafe { hp.write(h) };
        let size = if h.flags & EAGER_DATA != 0 { h.size as usize } else { 0 };
        self.sges[0] = ibv_sge { addr: hp as u64, length: EAGER_HDR as u32, lkey: self.hdrs.mr.lkey() };
        self.sges[1] = ibv_sge { addr: data, length: size as u32, lkey };
        let remote = self.ring.addr + (slot * slot_bytes(self.ring.eager_max)) as u64;
        self.wrs[0] = rdma_wr(IBV_WR_RDMA_WRITE_WITH_IMM, wr_id, remote, self.ring.rkey, if size > 0 { 2 } else { 1 });
        self.wrs[0].sg_list = self.sges.as_mut_ptr();
        self.wrs[0].__bindgen_anon_1.imm_data = Imm::Eager(slot as u32).encode().to_be();
        let inline = !on_gpu && EAGER_HDR + size <= self.qps[0].qp().max_inline as usize;
        self.unsignaled += 1;
        let quiet = inline && self.unsignaled < SIGNAL_EVERY;
        self.wrs[0].send_flags = if inline { IBV_SEND_INLINE } else { 0 };
        if !quiet {
            // A signaled completion also releases the send-queue slots of the quiet ones before.
            self.wrs[0].send_flags |= IBV_SEND_SIGNALED;
            self.unsignaled = 0;
        }
        self.wrs[0].next = std::ptr::null_mut();
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        let rc = unsafe { verbs::post_send(self.qps[0].qp().raw(), self.wrs.as_mut_ptr(), &mut bad) };
        if rc != 0 {
            return Err(self.c.post_failed(self.qps[0].qp().qpn(), "ibv_post_send (eager)", rc));
        }
        self.eager_sent += 1;
        Ok(quiet)
    }

    /// The CTS entry for the send with sequence number `seq`: Ok(Some((slot, entry))) when it has
    /// arrived, Ok(None) when not yet, Err when the send cannot match any receive.
    fn find_cts(&mut self, seq: u32, size: usize, tag: i32) -> Result<Option<(usize, usize)>> {
        loop {
            let slot = (self.cts_head % FIFO_DEPTH as u64) as usize;
            let s0 = self.stamp(slot, 0);
            let d = s0.wrapping_sub((self.cts_head + 1) as u32) as i32;
            if d < 0 {
                return Ok(None); // not written yet
            }
            if d > 0 {
                // Overwritten: the receiver moved past that CTS, so its receive completed
                // without a large send (all its sends went eagerly).
                self.cts_head += 1;
                self.cts_used = 0;
                continue;
            }
            // The fields, read after the stamp's acquire load.
            let e0 = self.entry(slot, 0);
            let n = e0.n();
            if n == 0 || n > MAX_RECVS {
                let e = Error::remote(format!("{}: corrupt clear-to-send entry (n {n})", self.c.where_(0)));
                return Err(self.c.die(e));
            }
            if (1..n).any(|r| self.stamp(slot, r) != s0) {
                return Ok(None); // the rest of the grouped entry is still arriving
            }
            fence(Ordering::Acquire);
            let off = seq_offset(seq, e0.base);
            if off >= n as i64 {
                // A receive whose sends all went eagerly.
                self.cts_head += 1;
                self.cts_used = 0;
                continue;
            }
            if off < 0 {
                // This send belongs to an earlier receive that posted no CTS: all its buffers
                // are within the eager limit, so a large send cannot fit.
                let e = Error::usage(format!(
                    "collective mismatch: a send of {size} bytes with tag {tag} is larger than every buffer of the peer's receive (at most {} bytes, the eager limit); every rank must run the same collectives with the same sizes",
                    self.ring.eager_max
                ));
                self.c.notify_mismatch(Mismatch { send_size: size as u64, recv_size: self.ring.eager_max as u64, tag });
                return Err(self.c.die(e));
            }
            let Some(r) = (0..n).find(|&r| self.cts_used & (1 << r) == 0 && self.entry(slot, r).tag == tag) else {
                let tags: Vec<i32> = (0..n).map(|r| self.entry(slot, r).tag).collect();
                let e = Error::usage(format!(
                    "collective mismatch: a send with tag {tag} does not match the peer's posted receive (tags {tags:?})"
                ));
                return Err(self.c.die(e));
            };
            return Ok(Some((slot, r)));
        }
    }

    fn progress(&mut self) -> Result<bool> {
        let n = self.c.poll(&self.cq)?;
        for i in 0..n {
            let wc = self.c.wc[i];
            if wc.wr_id >> KIND_SHIFT == KIND_SEND {
                if let Some(r) = self.reqs.get_mut((wc.wr_id & 0xffff) as usize) {
                    r.pending = r.pending.saturating_sub(1);
                }
            }
        }
        self.c.check()?;
        Ok(n > 0)
    }

    fn back_pressure(&mut self) -> Result<Option<u32>> {
        let outstanding = SEND_REQS - self.free.len();
        if !self.progress()? {
            self.c.idle(outstanding)?;
        }
        Ok(None)
    }
}

impl Conn for VerbsSend {
    fn isend(&mut self, data: *const u8, size: usize, tag: i32, mr: *const MrInfo) -> Result<Option<u32>> {
        self.isend_partial(data, size, tag, mr, size)
    }

    /// A partial send goes eagerly only once all of it is ready (eager messages are small); by
    /// rendezvous, its writes are posted as far as it is ready, the rest by `set_ready`.
    fn isend_partial(&mut self, data: *const u8, size: usize, tag: i32, mr: *const MrInfo, ready: usize) -> Result<Option<u32>> {
        self.c.check()?;
        let lkey = if size > 0 { mr_for(mr, data as usize, size, dev_id(self.c.port), 0, "isend")?.lkey } else { 0 };
        if self.free.is_empty() {
            return self.back_pressure();
        }
        let seq = self.seq;
        if size <= self.ring.eager_max && ready < size {
            return self.back_pressure();
        }
        if size <= self.ring.eager_max {
            let avail = self.free_slots();
            if avail == 0 {
                return self.back_pressure();
            }
            let idx = self.free.pop().unwrap();
            let mut flags = EAGER_DATA;
            if avail - 1 < self.ring.slots / 2 {
                flags |= EAGER_URGENT;
            }
            let h = EagerHdr { seq, flags, size: size as u64, tag, _pad: [0; 3] };
            let on_gpu = path_of(mr) == Path::Gdr;
            let quiet = match self.post_eager(idx as usize, h, data as u64, lkey, (KIND_SEND << KIND_SHIFT) | idx as u64, on_gpu) {
                Ok(q) => q,
                Err(e) => {
                    self.free.push(idx);
                    return Err(e);
                }
            };
            // An inline send is complete once posted: its bytes are in the work request.
            self.reqs[idx as usize] = SendReq { st: St::Posted, pending: if quiet { 0 } else { 1 }, size };
            self.seq = seq.wrapping_add(1);
            return Ok(Some(idx as u32));
        }
        let Some((slot, r)) = self.find_cts(seq, size, tag)? else {
            // No CTS yet: say once that this large send is waiting, so a receive too small for
            // it is reported instead of waited for.
            if self.rts_for != Some(seq) && self.free_slots() > 0 {
                let hdr_slot = SEND_REQS + (seq as usize % RTS_HDRS);
                let h = EagerHdr { seq, flags: EAGER_RTS | EAGER_URGENT, size: size as u64, tag, _pad: [0; 3] };
                self.post_eager(hdr_slot, h, 0, 0, KIND_CTRL << KIND_SHIFT, false)?;
                self.rts_for = Some(seq);
            }
            return self.back_pressure();
        };
        let cts = self.entry(slot, r);
        if size as u64 > cts.size() {
            let e = Error::usage(format!(
                "collective mismatch: a send of {size} bytes with tag {tag} is larger than the peer's receive of {} bytes; every rank must run the same collectives with the same sizes",
                cts.size()
            ));
            self.c.notify_mismatch(Mismatch { send_size: size as u64, recv_size: cts.size(), tag });
            return Err(self.c.die(e));
        }
        let idx = self.free.pop().unwrap();
        let nqps = self.qps.len();
        let imm = Imm::Rdv { slot: slot as u32, entry: r as u32 }.encode().to_be();
        let sizes_off = ((slot * SIZES_ENTRY) + r * 8) as u64;
        unsafe { (self.sizes_out.buf.ptr().add(sizes_off as usize) as *mut u64).write(size as u64) };
        self.rdv[idx as usize] = Rdv {
            data: data as u64,
            lkey,
            size,
            addr: cts.addr,
            rkey: cts.rkey,
            imm,
            sizes_off,
            posted: [0; crate::proto::verbs::MAX_QPS],
            closed: 0,
        };
        if let Err(e) = self.post_rdv(idx as usize, ready.min(size)) {
            self.free.push(idx);
            return Err(e);
        }
        self.reqs[idx as usize] = SendReq { st: St::Posted, pending: nqps as u32, size };
        self.cts_used |= 1 << r;
        self.seq = seq.wrapping_add(1);
        Ok(Some(idx as u32))
    }

    fn set_ready(&mut self, slot: u32, ready: usize) -> Result<()> {
        self.c.check()?;
        let idx = slot as usize;
        let all = (1u32 << self.qps.len()) - 1;
        if idx < SEND_REQS && self.reqs[idx].st == St::Posted && self.rdv[idx].size > 0 && self.rdv[idx].closed != all {
            self.post_rdv(idx, ready.min(self.rdv[idx].size))?;
        }
        Ok(())
    }

    fn test(&mut self, slot: u32, sizes: &mut [usize; MAX_RECVS]) -> Result<Option<usize>> {
        let i = slot as usize;
        if self.reqs.get(i).map_or(true, |r| r.st == St::Free) {
            return Err(Error::internal(format!("test on send request {slot}, which is not in flight")));
        }
        let mut moved = false;
        if self.reqs[i].pending > 0 {
            moved = self.progress()?;
        }
        let r = self.reqs[i];
        if r.pending == 0 {
            sizes[0] = r.size;
            self.reqs[i].st = St::Free;
            self.free.push(slot as u16);
            return Ok(Some(1));
        }
        if !moved {
            self.c.idle(SEND_REQS - self.free.len())?;
        }
        Ok(None)
    }

    fn capacity(&self) -> usize {
        SEND_REQS
    }
}

// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Default)]
struct Entry {
    buf: u64,
    /// The buffer is GPU memory registered for GPUDirect RDMA: eager bytes reach it by a CUDA copy.
    gpu: bool,
    size: u64,
    tag: i32,
    done: bool,
    /// Matched by a send (eager data, or a rendezvous whose parts are arriving).
    taken: bool,
    got: u64,
    /// Rendezvous parts (one per QP) arrived.
    parts: u16,
}

#[derive(Clone, Copy)]
struct RecvReq {
    st: St,
    flush: bool,
    n: u8,
    /// Buffers not yet filled.
    left: u8,
    /// Sequence number of this receive's first send.
    base: u32,
    entries: [Entry; MAX_RECVS],
}

pub struct VerbsRecv {
    qps: Vec<QpRts>,
    flush_qp: QpRts,
    cq: Cq,
    /// CTS entries staged for the RDMA write into the sender's FIFO.
    cts_out: RegBuf,
    /// Sizes of rendezvous sends, written by the sender.
    sizes_in: RegBuf,
    /// The eager ring the sender writes into.
    ring: RegBuf,
    ring_slots: usize,
    slot_bytes: usize,
    eager_max: usize,
    /// Where flush reads land; also the source of credit writes.
    scratch: RegBuf,
    rem_fifo_addr: u64,
    rem_fifo_rkey: u32,
    /// Sequence number of the next receive's first send.
    next_base: u32,
    /// CTS entries written so far.
    cts_tail: u64,
    /// The receive each CTS slot belongs to.
    cts_owner: Box<[u16]>,
    /// Eager slots arrived (in order) and consumed; credits reported to the sender.
    ring_arrived: u64,
    ring_done: u64,
    credits_sent: u64,
    credit_urgent: bool,
    /// Receives posted and not yet reported done, oldest first.
    order: VecDeque<u16>,
    reqs: Box<[RecvReq]>,
    free: Vec<u16>,
    free_flush: Vec<u16>,
    /// Receives consumed per QP since the last repost.
    consumed: [u32; crate::proto::verbs::MAX_QPS],
    unsignaled: [u32; crate::proto::verbs::MAX_QPS],
    wrs: [ibv_send_wr; 1],
    sges: [ibv_sge; 1],
    flush_disabled: bool,
    pub c: Common,
}

unsafe impl Send for VerbsRecv {}

impl VerbsRecv {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        c: Common,
        qps: Vec<QpRts>,
        flush_qp: QpRts,
        cq: Cq,
        cts_out: RegBuf,
        sizes_in: RegBuf,
        ring: RegBuf,
        eager_max: usize,
        scratch: RegBuf,
        rem_fifo: (u64, u32),
        flush_disabled: bool,
    ) -> VerbsRecv {
        let empty = RecvReq { st: St::Free, flush: false, n: 0, left: 0, base: 0, entries: [Entry::default(); MAX_RECVS] };
        let mut free = Vec::with_capacity(RECV_REQS);
        free.extend((0..RECV_REQS as u16).rev());
        let mut free_flush = Vec::with_capacity(FLUSH_REQS);
        free_flush.extend((RECV_REQS as u16..(RECV_REQS + FLUSH_REQS) as u16).rev());
        VerbsRecv {
            qps,
            flush_qp,
            cq,
            cts_out,
            sizes_in,
            ring,
            ring_slots: RING_SLOTS,
            slot_bytes: slot_bytes(eager_max),
            eager_max,
            scratch,
            rem_fifo_addr: rem_fifo.0,
            rem_fifo_rkey: rem_fifo.1,
            next_base: 0,
            cts_tail: 0,
            cts_owner: vec![0u16; FIFO_DEPTH].into_boxed_slice(),
            ring_arrived: 0,
            ring_done: 0,
            credits_sent: 0,
            credit_urgent: false,
            order: VecDeque::with_capacity(RECV_REQS),
            reqs: vec![empty; RECV_REQS + FLUSH_REQS].into_boxed_slice(),
            free,
            free_flush,
            consumed: [0; crate::proto::verbs::MAX_QPS],
            unsignaled: [0; crate::proto::verbs::MAX_QPS],
            wrs: unsafe { std::mem::zeroed() },
            sges: unsafe { std::mem::zeroed() },
            flush_disabled,
            c,
        }
    }

    /// Post one RDMA WRITE of our memory `[src, src+len)` (lkey) to the sender's FIFO memory.
    fn post_ctrl(&mut self, q: usize, src: u64, lkey: u32, len: usize, remote: u64) -> Result<()> {
        self.sges[0] = ibv_sge { addr: src, length: len as u32, lkey };
        self.wrs[0] = rdma_wr(IBV_WR_RDMA_WRITE, KIND_CTRL << KIND_SHIFT, remote, self.rem_fifo_rkey, 1);
        if len <= self.qps[q].qp().max_inline as usize {
            self.wrs[0].send_flags |= IBV_SEND_INLINE;
        }
        self.unsignaled[q] += 1;
        if self.unsignaled[q] >= SIGNAL_EVERY {
            self.wrs[0].send_flags |= IBV_SEND_SIGNALED;
            self.unsignaled[q] = 0;
        }
        if let Err(rc) = post_chain(&self.qps[q], &mut self.wrs, &mut self.sges, 1) {
            return Err(self.c.post_failed(self.qps[q].qp().qpn(), "posting a control write", rc));
        }
        Ok(())
    }

    /// The receive whose sends include sequence number `seq`.
    fn owner_of(&self, seq: u32) -> Option<u16> {
        self.order.iter().copied().find(|&i| {
            let r = &self.reqs[i as usize];
            (0..r.n as i64).contains(&seq_offset(seq, r.base))
        })
    }

    fn mismatch(&mut self, send: u64, recv: u64, tag: i32) -> Error {
        self.c.notify_mismatch(Mismatch { send_size: send, recv_size: recv, tag });
        let e = Error::usage(format!(
            "collective mismatch: the peer {} sent {send} bytes with tag {tag} but the posted receive holds only {recv} bytes; every rank must run the same collectives with the same sizes",
            self.c.peer
        ));
        self.c.die(e)
    }

    /// Consume arrived eager slots, in order, as far as posted receives allow.
    fn drain_ring(&mut self) -> Result<()> {
        while self.ring_done < self.ring_arrived {
            let slot = (self.ring_done % self.ring_slots as u64) as usize;
            let p = unsafe { self.ring.buf.ptr().add(slot * self.slot_bytes) };
            let h = unsafe { std::ptr::read_volatile(p as *const EagerHdr) };
            let Some(owner) = self.owner_of(h.seq) else {
                if seq_offset(h.seq, self.next_base) >= 0 {
                    break; // its receive is not posted yet: keep it (and everything after it)
                }
                let e = Error::remote(format!("{}: an eager message for an already completed receive (seq {})", self.c.where_(0), h.seq));
                return Err(self.c.die(e));
            };
            let rq = &mut self.reqs[owner as usize];
            let n = rq.n as usize;
            // An announcement may be read after its rendezvous data already landed (the two
            // travel independently), so it matches a taken buffer too; data never does.
            let rts = h.flags & EAGER_DATA == 0;
            let Some(r) = (0..n).find(|&r| (rts || !rq.entries[r].taken) && rq.entries[r].tag == h.tag) else {
                let tags: Vec<i32> = (0..n).map(|r| rq.entries[r].tag).collect();
                let e = Error::usage(format!(
                    "collective mismatch: the peer {} sent a message with tag {} that matches none of the posted receive's tags {tags:?}",
                    self.c.peer, h.tag
                ));
                return Err(self.c.die(e));
            };
            let en = rq.entries[r];
            if h.size > en.size {
                return Err(self.mismatch(h.size, en.size, h.tag));
            }
            if h.flags & EAGER_DATA != 0 {
                if h.size > self.eager_max as u64 {
                    let e = Error::remote(format!("{}: corrupt eager header (size {})", self.c.where_(0), h.size));
                    return Err(self.c.die(e));
                }
                if h.size > 0 && en.gpu {
                    if let Err(e) = crate::cuda::copy_to_device_sync(en.buf as usize, unsafe { p.add(EAGER_HDR) }, h.size as usize) {
                        return Err(self.c.die(Error::system(format!("{}: eager message into GPU memory: {e}", self.c.where_(0)))));
                    }
                } else if h.size > 0 {
                    unsafe { std::ptr::copy_nonoverlapping(p.add(EAGER_HDR), en.buf as *mut u8, h.size as usize) };
                }
                let rq = &mut self.reqs[owner as usize];
                rq.entries[r].taken = true;
                rq.entries[r].done = true;
                rq.entries[r].got = h.size;
                rq.left -= 1;
            }
            // EAGER_RTS: the size fits; the data follows by rendezvous.
            if h.flags & EAGER_URGENT != 0 {
                self.credit_urgent = true;
            }
            self.ring_done += 1;
        }
        // Credits: in batches, or at once when the sender runs low.
        let unreported = self.ring_done - self.credits_sent;
        if unreported > 0 && (self.credit_urgent || unreported >= self.ring_slots as u64 / 2) {
            // The copies out of the released slots (loads) complete before the credit that lets
            // the sender overwrite them is written: Arm may otherwise let the later store (and the
            // doorbell, whose barrier orders stores only) pass those loads.
            std::sync::atomic::fence(Ordering::SeqCst);
            let w = self.scratch.buf.ptr() as *mut u64;
            unsafe { w.add(1).write(self.ring_done) };
            let (src, lkey) = (self.scratch.addr() + 8, self.scratch.mr.lkey());
            self.post_ctrl(0, src, lkey, 8, self.rem_fifo_addr + FIFO_BYTES as u64)?;
            self.credits_sent = self.ring_done;
            self.credit_urgent = false;
        }
        Ok(())
    }

    fn on_rdv(&mut self, slot: u32, entry: u32) -> Result<()> {
        let owner = self.cts_owner[slot as usize % FIFO_DEPTH] as usize;
        let nqps = self.qps.len() as u16;
        let e = &mut self.reqs[owner].entries[entry as usize % MAX_RECVS];
        e.taken = true;
        e.parts += 1;
        if e.parts == nqps {
            let p = unsafe { (self.sizes_in.buf.ptr() as *const u64).add(slot as usize * MAX_RECVS + entry as usize) };
            e.got = unsafe { std::ptr::read_volatile(p) };
            e.done = true;
            self.reqs[owner].left -= 1;
        }
        Ok(())
    }

    fn progress(&mut self) -> Result<bool> {
        let n = self.c.poll(&self.cq)?;
        for i in 0..n {
            let wc = self.c.wc[i];
            match wc.wr_id >> KIND_SHIFT {
                KIND_RECV => {
                    if let Some(q) = self.qps.iter().position(|q| q.qp().qpn() == wc.qp_num) {
                        self.consumed[q] += 1;
                    }
                    match Imm::decode(u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data })) {
                        Imm::Eager(_) => self.ring_arrived += 1,
                        Imm::Rdv { slot, entry } => self.on_rdv(slot, entry)?,
                    }
                }
                KIND_FLUSH => {
                    if let Some(r) = self.reqs.get_mut((wc.wr_id & 0xffff) as usize) {
                        r.left = 0;
                    }
                }
                _ => {}
            }
        }
        self.c.check()?;
        for q in 0..self.qps.len() {
            if self.consumed[q] >= RECV_QP_RQ / 4 {
                if let Err(rc) = post_recvs(&self.qps[q], self.consumed[q]) {
                    return Err(self.c.post_failed(self.qps[q].qp().qpn(), "ibv_post_recv", rc));
                }
                self.consumed[q] = 0;
            }
        }
        if n > 0 {
            self.drain_ring()?;
        }
        Ok(n > 0)
    }

    fn outstanding(&self) -> usize {
        RECV_REQS + FLUSH_REQS - self.free.len() - self.free_flush.len()
    }
}

impl Conn for VerbsRecv {
    fn irecv(&mut self, bufs: &[RecvBuf]) -> Result<Option<u32>> {
        self.c.check()?;
        let n = bufs.len();
        let dev = dev_id(self.c.port);
        let mut entries = [Entry::default(); MAX_RECVS];
        let mut keys = [0u32; MAX_RECVS];
        let mut large = false;
        for (i, b) in bufs.iter().enumerate() {
            if b.size > 0 {
                keys[i] = mr_for(b.mr, b.ptr as usize, b.size, dev, IBV_ACCESS_REMOTE_WRITE, "irecv")?.rkey;
            }
            large |= b.size > self.eager_max;
            let gpu = path_of(b.mr) == Path::Gdr;
            entries[i] = Entry { buf: b.ptr as u64, gpu, size: b.size as u64, tag: b.tag, ..Default::default() };
        }
        let Some(idx) = self.free.pop() else { return Ok(None) };
        let base = self.next_base;
        if large {
            let slot = (self.cts_tail % FIFO_DEPTH as u64) as usize;
            let stamp = (self.cts_tail + 1) as u32;
            let out = unsafe { (self.cts_out.buf.ptr() as *mut Cts).add(slot * MAX_RECVS) };
            for (i, b) in bufs.iter().enumerate() {
                let e = Cts::new(b.ptr as u64, b.size as u64, keys[i], b.tag, n, base, stamp);
                unsafe { out.add(i).write(e) };
            }
            let q = (self.cts_tail % self.qps.len() as u64) as usize;
            let len = n * std::mem::size_of::<Cts>();
            let off = (slot * MAX_RECVS * std::mem::size_of::<Cts>()) as u64;
            let (src, lkey) = (self.cts_out.addr() + off, self.cts_out.mr.lkey());
            if let Err(e) = self.post_ctrl(q, src, lkey, len, self.rem_fifo_addr + off) {
                self.free.push(idx);
                return Err(e);
            }
            self.cts_owner[slot] = idx;
            self.cts_tail += 1;
        }
        self.reqs[idx as usize] = RecvReq { st: St::Posted, flush: false, n: n as u8, left: n as u8, base, entries };
        self.next_base = base.wrapping_add(n as u32);
        self.order.push_back(idx);
        // Eager messages that arrived before this receive.
        self.drain_ring()?;
        Ok(Some(idx as u32))
    }

    fn iflush(&mut self, bufs: &[RecvBuf]) -> Result<Option<u32>> {
        self.c.check()?;
        if self.flush_disabled {
            return Ok(None);
        }
        let Some(b) = bufs.iter().rev().find(|b| b.size > 0) else { return Ok(None) };
        let m = mr_for(b.mr, b.ptr as usize, b.size, dev_id(self.c.port), IBV_ACCESS_REMOTE_READ, "iflush")?;
        let Some(idx) = self.free_flush.pop() else {
            return Err(Error::internal(format!("more than {FLUSH_REQS} flushes in flight on one comm")));
        };
        self.sges[0] = ibv_sge { addr: self.scratch.addr(), length: 1, lkey: self.scratch.mr.lkey() };
        self.wrs[0] = rdma_wr(IBV_WR_RDMA_READ, (KIND_FLUSH << KIND_SHIFT) | idx as u64, b.ptr as u64, m.rkey, 1);
        self.wrs[0].send_flags = IBV_SEND_SIGNALED;
        if let Err(rc) = post_chain(&self.flush_qp, &mut self.wrs, &mut self.sges, 1) {
            self.free_flush.push(idx);
            return Err(self.c.post_failed(self.flush_qp.qp().qpn(), "posting the flush read", rc));
        }
        self.reqs[idx as usize] =
            RecvReq { st: St::Posted, flush: true, n: 0, left: 1, base: 0, entries: [Entry::default(); MAX_RECVS] };
        Ok(Some(idx as u32))
    }

    fn test(&mut self, slot: u32, sizes: &mut [usize; MAX_RECVS]) -> Result<Option<usize>> {
        let i = slot as usize;
        if self.reqs.get(i).map_or(true, |r| r.st == St::Free) {
            return Err(Error::internal(format!("test on receive request {slot}, which is not in flight")));
        }
        let mut moved = false;
        if self.reqs[i].left > 0 {
            moved = self.progress()?;
        }
        let r = self.reqs[i];
        if r.left == 0 {
            self.reqs[i].st = St::Free;
            if r.flush {
                self.free_flush.push(slot as u16);
                return Ok(Some(0));
            }
            let n = r.n as usize;
            for (k, s) in sizes.iter_mut().enumerate().take(n) {
                *s = r.entries[k].got as usize;
            }
            if let Some(pos) = self.order.iter().position(|&x| x == slot as u16) {
                self.order.remove(pos);
            }
            self.free.push(slot as u16);
            return Ok(Some(n));
        }
        if !moved {
            let o = self.outstanding();
            self.c.idle(o)?;
        }
        Ok(None)
    }

    fn capacity(&self) -> usize {
        RECV_REQS + FLUSH_REQS
    }
}
