//! The simulated NIC of `shell_sim`: one fabric per thread, behind the verbs shells' seam
//! (`nic::Nic`, `nic::NicPort`, implemented in `seam.rs`), doing what a NIC does:
//! - ports (one device each, a fused device's members among them) with their own keys: a key of
//!   one device used on a queue pair of another is refused, as hardware refuses it;
//! - a queue pair has up to `WINDOW` work requests on the wire; their bytes are placed in
//!   packets of `MTU` bytes, in order, or in any order under adaptive routing, and a packet of
//!   `SMALL` bytes or less in pieces in address order (what a reader polling memory may see);
//!   work requests complete in order, a write with an immediate only once everything before it
//!   is placed and the peer has a receive posted (receiver not ready: it waits, as with
//!   rnr_retry 7); but under adaptive routing a write with an immediate of more than a packet
//!   and more than the threshold the shells are told (`ar_threshold`, NCCL_IB_AR_THRESHOLD) may
//!   deliver its immediate once its last packet is placed, before the rest of its own data;
//! - a send queue slot is free again only when the completion of its work request, or of a
//!   signaled one after it, has been polled (as providers account), a receive queue holds what
//!   it was created for, and a completion queue that overflows is a fault;
//! - a link or port that fails leaves a random part of the writes on the wire placed, fails the
//!   oldest work request (RETRY_EXC_ERR; LOC_QP_OP_ERR for a port that is down, as Soft-RoCE
//!   reports it), flushes everything after it and the receive queue, and puts the queue pair in
//!   ERR; a queue pair reset and moved back to RTR and RTS starts empty;
//! - GPU memory (`gpu`): the CPU must not read it (an inline work request from it is a fault);
//!   with flushes on, a write into it through a port becomes visible only when a flush read
//!   through the same port completes (PCIe's posted writes to a GPU may pass the completion),
//!   or when the port goes down (its writes land in the end); copies into it by the GPU's
//!   stream (`gpu.rs`) run in order, late, at random;
//! - the time is the schedule's (`now_ms`), so that a schedule replays exactly.

use crate::rng::Rng;
use nccl_net_rivet::sys::ib::*;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

/// Bytes of a packet.
pub(crate) const MTU: usize = 4096;
/// Work requests of a queue pair on the wire at once.
const WINDOW: usize = 4;
/// Packets of this size or less (control writes: clear-to-send entries, credits, sizes) are
/// placed in pieces of 8 bytes or more, in address order.
const SMALL: usize = 256;

#[derive(Clone, Copy)]
pub(crate) struct Region {
    pub(crate) addr: usize,
    pub(crate) len: usize,
    pub(crate) access: u32,
    /// The port (device) the registration is on.
    pub(crate) port: usize,
}

pub(crate) enum Data {
    /// The bytes, copied at post (an inline work request).
    Inline(Vec<u8>),
    /// Read when the work request starts: (address, length, lkey) per scatter entry.
    Gather(Vec<(usize, usize, u32)>),
}

pub(crate) struct Wr {
    pub(crate) wr_id: u64,
    pub(crate) opcode: u32,
    pub(crate) signaled: bool,
    pub(crate) remote: u64,
    pub(crate) rkey: u32,
    pub(crate) imm: u32,
    pub(crate) data: Data,
    /// Its place in the send queue (since the queue pair's last reset).
    pub(crate) seq: u64,
}

/// A work request on the wire: its bytes, the pieces (offset, length) not placed yet, and
/// the epoch of the queue pair it goes to when it started (a reset there since: it fails).
pub(crate) struct Flight {
    pub(crate) wr: Wr,
    pub(crate) bytes: Vec<u8>,
    pub(crate) pending: Vec<(usize, usize)>,
    pub(crate) peer_epoch: u32,
    /// Its immediate was delivered before all its data was placed (adaptive routing's hazard).
    pub(crate) imm_early: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum QpState {
    /// Made and never connected (its member, or the peer's, down at setup): it takes receives,
    /// what reaches it is dropped, and a send posted on it is a fault.
    Init,
    /// Reset: takes nothing (what reaches it is dropped) until moved to RTR again.
    Reset,
    /// Ready to receive (reset and moved back, not yet sending).
    Rtr,
    Rts,
    Err,
    /// Its side went away (destroyed): its peer's packets go nowhere.
    Gone,
}

pub(crate) struct Qp {
    pub(crate) qpn: u32,
    pub(crate) cq: usize,
    pub(crate) port: usize,
    /// The queue pair at the other end (None for a flush queue pair: it reads its own memory).
    pub(crate) peer: Option<usize>,
    pub(crate) sq: VecDeque<Wr>,
    pub(crate) flights: VecDeque<Flight>,
    pub(crate) sq_depth: usize,
    pub(crate) rq: VecDeque<u64>,
    pub(crate) rq_depth: usize,
    pub(crate) state: QpState,
    /// Resets so far (a completion polled after one frees nothing of the new queue).
    pub(crate) epoch: u32,
    /// Work requests posted, and those whose slots a polled completion has freed.
    pub(crate) posted: u64,
    pub(crate) freed: u64,
    /// Packet sequence numbers (one per message here): the next this queue pair sends, and the
    /// next it expects. Both start again at a reset, so that a queue pair reset at one end
    /// only talks to one reset at the other.
    pub(crate) sq_psn: u64,
    pub(crate) rq_psn: u64,
}

impl Qp {
    /// RESET and on to `state`: every work request discarded without a completion, the counts
    /// and sequence numbers from zero, a new epoch (a completion of the old one frees nothing).
    pub(crate) fn reset(&mut self, state: QpState) {
        self.sq.clear();
        self.flights.clear();
        self.rq.clear();
        self.epoch += 1;
        self.posted = 0;
        self.freed = 0;
        self.sq_psn = 0;
        self.rq_psn = 0;
        self.state = state;
    }
}

pub(crate) struct Port {
    /// The link is up (the wire); `shown_down`: the port's state says DOWN and a PORT_ERR came.
    pub(crate) up: bool,
    pub(crate) shown_down: bool,
    pub(crate) ar: bool,
    /// PORT_ERR events so far.
    pub(crate) downs: u32,
    /// A work request on this port while it is down fails with LOC_QP_OP_ERR (Soft-RoCE's way),
    /// else RETRY_EXC_ERR (a NIC's transport giving up).
    pub(crate) loc_op_err: bool,
}

/// A copy on the GPU's stream: destination, source, length.
pub(crate) type GpuCopy = (usize, usize, usize);

/// The send work request a completion frees the slots up to: queue pair, epoch, sequence number.
type Frees = Option<(usize, u32, u64)>;

pub(crate) struct Cq {
    /// Completions, each with the send work request it frees the slots up to, if it is one.
    pub(crate) wcs: VecDeque<(ibv_wc, Frees)>,
    pub(crate) depth: usize,
}

pub(crate) struct Fabric {
    pub(crate) regions: HashMap<u32, Region>,
    pub(crate) ports: Vec<Port>,
    pub(crate) qps: Vec<Qp>,
    pub(crate) cqs: Vec<Cq>,
    pub(crate) next_key: u32,
    /// What the shells did that a NIC would refuse (the run fails on any).
    pub(crate) faults: Vec<String>,
    /// Queue pairs whose link is cut (both ends of a pair): their work requests fail.
    pub(crate) cut: Vec<bool>,
    /// The next work request of a queue pair fails with this status (a fault injected).
    pub(crate) fatal: Option<(usize, u32)>,
    /// Work requests that met a failed link or port, and queue pairs moved back to RTS.
    pub(crate) failed: usize,
    pub(crate) recovered: usize,
    pub(crate) rng: Rng,
    pub(crate) now_ms: u64,
    /// Moves to ERR the device refuses (ETIMEDOUT) before it takes one, and those refused.
    pub(crate) err_busy: u32,
    pub(crate) err_refused: u32,
    /// GPU memory: (address, length) of each buffer the schedule put there.
    pub(crate) gpu: Vec<(usize, usize)>,
    /// Writes into GPU memory wait for a flush read through their port (flushes on).
    pub(crate) gpu_writes_wait: bool,
    /// Writes into GPU memory not yet visible: (port, address, bytes).
    pub(crate) unflushed: Vec<(usize, usize, Vec<u8>)>,
    /// The GPU's copy stream: batches ended by a fence (its id), oldest first; copies issued
    /// since the last fence. A copy is (destination, source, length).
    pub(crate) stream: VecDeque<(usize, Vec<GpuCopy>)>,
    pub(crate) unfenced: Vec<GpuCopy>,
    /// Copies the stream ran, flush reads completed (for the totals).
    pub(crate) gpu_copies: usize,
    pub(crate) flushes: usize,
    /// Looks at a closed comm's copier that found copies still running.
    pub(crate) gpu_busy: usize,
    /// Writes above this many bytes (and a packet) may deliver their immediate before their
    /// own data under adaptive routing; `ar_untold`: the ports tell the shells adaptive routing
    /// is off (so that they do not split such writes), to show the hazard is caught.
    pub(crate) ar_threshold: usize,
    pub(crate) ar_untold: bool,
    /// The GPU's stream says a fence is reached though its copies have not run (and never run
    /// them): only to show that a receive used before its copy is caught.
    pub(crate) gpu_lies: bool,
    /// Immediates delivered before their data (for the totals).
    pub(crate) imm_early: usize,
}

impl Default for Fabric {
    fn default() -> Fabric {
        Fabric {
            regions: HashMap::new(),
            ports: Vec::new(),
            qps: Vec::new(),
            cqs: Vec::new(),
            next_key: 0x100,
            faults: Vec::new(),
            cut: Vec::new(),
            fatal: None,
            failed: 0,
            recovered: 0,
            rng: Rng(1),
            now_ms: 0,
            err_busy: 0,
            err_refused: 0,
            gpu: Vec::new(),
            gpu_writes_wait: false,
            unflushed: Vec::new(),
            stream: VecDeque::new(),
            unfenced: Vec::new(),
            gpu_copies: 0,
            flushes: 0,
            gpu_busy: 0,
            ar_threshold: 8192,
            ar_untold: false,
            gpu_lies: false,
            imm_early: 0,
        }
    }
}

thread_local! {
    pub(crate) static FAB: RefCell<Fabric> = RefCell::new(Fabric::default());
}

#[inline(never)]
pub(crate) fn fab<T>(f: impl FnOnce(&mut Fabric) -> T) -> T {
    // The NIC's own allocations are not the shells'.
    crate::nic_quiet(|| FAB.with(|x| f(&mut x.borrow_mut())))
}

pub(crate) fn wc(wr_id: u64, status: u32, opcode: u32, qpn: u32, len: u32, imm: u32) -> ibv_wc {
    // SAFETY: ibv_wc is plain C data; all-zero is a valid completion.
    let mut w: ibv_wc = unsafe { std::mem::zeroed() };
    w.wr_id = wr_id;
    w.status = status;
    w.opcode = opcode;
    w.qp_num = qpn;
    w.byte_len = len;
    w.__bindgen_anon_1.imm_data = imm;
    w
}

impl Fabric {
    pub(crate) fn register(&mut self, addr: usize, len: usize, access: u32, port: usize) -> u32 {
        let k = self.next_key;
        self.next_key += 1;
        self.regions.insert(k, Region { addr, len, access, port });
        k
    }

    pub(crate) fn new_port(&mut self, ar: bool, loc_op_err: bool) -> usize {
        self.ports.push(Port { up: true, shown_down: false, ar, downs: 0, loc_op_err });
        self.ports.len() - 1
    }

    /// The region `key` names if it is on `port` and covers `[addr, addr + len)` with `access`.
    pub(crate) fn check(&mut self, key: u32, port: usize, addr: usize, len: usize, access: u32, what: &str) -> bool {
        match self.regions.get(&key) {
            Some(r) if r.port != port => {
                let rp = r.port;
                self.faults.push(format!("{what}: key {key:#x} is of port {rp}, used on port {port}"));
                false
            }
            Some(r) if addr >= r.addr && addr + len <= r.addr + r.len && r.access & access == access => true,
            Some(r) => {
                self.faults.push(format!("{what}: [{addr:#x}, +{len}) with key {key:#x} is outside or lacks access {access:#x} of its region [{:#x}, +{}) {:#x}", r.addr, r.len, r.access));
                false
            }
            None if len == 0 => true,
            None => {
                self.faults.push(format!("{what}: unknown key {key:#x}"));
                false
            }
        }
    }

    /// Whether `[addr, addr + len)` touches GPU memory.
    pub(crate) fn in_gpu(&self, addr: usize, len: usize) -> bool {
        self.gpu.iter().any(|&(a, l)| addr < a + l && a < addr + len.max(1))
    }

    /// The writes into GPU memory through `port` become visible (a flush read through it
    /// completed, or the port went down).
    pub(crate) fn flush_port(&mut self, port: usize) {
        let (now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.unflushed).into_iter().partition(|w| w.0 == port);
        self.unflushed = later;
        for (_, addr, b) in now {
            // SAFETY: checked inside a live registration with remote write when its work request
            // started (the test's memory outlives the comms).
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), addr as *mut u8, b.len()) };
        }
    }

    /// The GPU's stream runs its oldest batch of copies.
    pub(crate) fn run_batch(&mut self) -> bool {
        let Some((_, copies)) = self.stream.pop_front() else { return false };
        for (dst, src, len) in copies {
            // SAFETY: issued under `Copier::to_device`'s contract: both ranges stay valid and
            // left alone until the batch's fence is reached, which is now.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) };
            self.gpu_copies += 1;
        }
        true
    }

    pub(crate) fn push_wc(&mut self, cq: usize, w: ibv_wc, frees: Frees) {
        let c = &mut self.cqs[cq];
        if c.wcs.len() >= c.depth {
            let d = c.depth;
            self.faults.push(format!("completion queue {cq} of depth {d} overflows (a NIC reports CQ_ERR and the device is lost)"));
        }
        self.cqs[cq].wcs.push_back((w, frees));
    }

    /// A send work request's completion on `q` with `status`.
    pub(crate) fn complete(&mut self, q: usize, wr: &Wr, status: u32) {
        let (qpn, cq, epoch) = (self.qps[q].qpn, self.qps[q].cq, self.qps[q].epoch);
        self.push_wc(cq, wc(wr.wr_id, status, 0, qpn, 0, 0), Some((q, epoch, wr.seq)));
    }

    pub(crate) fn new_qp(&mut self, cq: usize, port: usize, sq_depth: usize, rq_depth: usize) -> usize {
        let qpn = 0x40 + self.qps.len() as u32;
        self.qps.push(Qp {
            qpn,
            cq,
            port,
            peer: None,
            sq: VecDeque::new(),
            flights: VecDeque::new(),
            sq_depth,
            rq: VecDeque::new(),
            rq_depth,
            state: QpState::Rts,
            epoch: 0,
            posted: 0,
            freed: 0,
            sq_psn: 0,
            rq_psn: 0,
        });
        self.cut.push(false);
        self.qps.len() - 1
    }

    pub(crate) fn new_cq(&mut self, depth: usize) -> usize {
        self.cqs.push(Cq { wcs: VecDeque::new(), depth });
        self.cqs.len() - 1
    }

    /// The state of every queue pair, port and completion queue, for a report.
    pub(crate) fn dump(&self) -> String {
        let mut s = String::new();
        for (i, q) in self.qps.iter().enumerate() {
            let pieces: usize = q.flights.iter().map(|f| f.pending.len()).sum();
            s += &format!(
                "\n  QP {i} (QPN {:#x}, port {}, peer {:?}): {:?}, {} queued, {} on the wire ({pieces} pieces unplaced), {} receives, {} posted {} freed of {}, epoch {}, cut {}",
                q.qpn, q.port, q.peer, q.state, q.sq.len(), q.flights.len(), q.rq.len(), q.posted, q.freed, q.sq_depth, q.epoch, self.cut[i]
            );
        }
        for (i, p) in self.ports.iter().enumerate() {
            s += &format!("\n  port {i}: up {}, shown down {}", p.up, p.shown_down);
        }
        for (i, c) in self.cqs.iter().enumerate() {
            s += &format!("\n  CQ {i}: {} of {}", c.wcs.len(), c.depth);
        }
        s
    }

    /// Why `q`'s next work request cannot reach its peer, if it cannot.
    fn link_fault(&self, q: usize) -> Option<u32> {
        let qp = &self.qps[q];
        let port = &self.ports[qp.port];
        if !port.up {
            return Some(if port.loc_op_err { IBV_WC_LOC_QP_OP_ERR } else { IBV_WC_RETRY_EXC_ERR });
        }
        let p = qp.peer?;
        let peer = &self.qps[p];
        if self.cut[q] || !self.ports[peer.port].up || matches!(peer.state, QpState::Err | QpState::Gone | QpState::Reset | QpState::Init) {
            return Some(IBV_WC_RETRY_EXC_ERR);
        }
        // A queue pair reset at one end and not at the other: the responder's expected sequence
        // number is not the requester's (its NAKs end in the requester's retries exceeded).
        if qp.flights.iter().any(|f| f.peer_epoch != peer.epoch) || (!qp.sq.is_empty() && qp.sq_psn != peer.rq_psn) {
            return Some(IBV_WC_RETRY_EXC_ERR);
        }
        None
    }

    /// Place the piece `i` of flight `f` of `q` (all of it, or for a small one a prefix).
    fn place(&mut self, q: usize, f: usize, i: usize) {
        let (off, len) = self.qps[q].flights[f].pending[i];
        let n = if len <= SMALL && len > 8 { (1 + self.rng.below(len / 8)) * 8 } else { len };
        let n = n.min(len);
        let fl = &mut self.qps[q].flights[f];
        if n == len {
            fl.pending.remove(i);
        } else {
            fl.pending[i] = (off + n, len - n);
        }
        if matches!(fl.wr.opcode, IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM) {
            let to = fl.wr.remote as usize + off;
            let port = self.qps[q].peer.map_or(self.qps[q].port, |p| self.qps[p].port);
            // (Through a port that is down, writes land in the end: no flush comes through it.)
            if self.gpu_writes_wait && self.ports[port].up && self.in_gpu(to, n) {
                let b = self.qps[q].flights[f].bytes[off..off + n].to_vec();
                self.unflushed.push((port, to, b));
                return;
            }
            let fl = &self.qps[q].flights[f];
            // SAFETY: the target was checked inside a live registration with remote write when
            // the work request started (the test's memory outlives the comms).
            unsafe { std::ptr::copy_nonoverlapping(fl.bytes.as_ptr().add(off), (fl.wr.remote as usize + off) as *mut u8, n) };
        }
    }

    /// Some of what is on the wire lands before a failure (in order without adaptive routing).
    fn tear(&mut self, q: usize) {
        let ar = self.ports[self.qps[q].port].ar;
        for f in 0..self.qps[q].flights.len() {
            let k = self.rng.below(self.qps[q].flights[f].pending.len() + 1);
            for _ in 0..k {
                let i = if ar { self.rng.below(self.qps[q].flights[f].pending.len()) } else { 0 };
                self.place(q, f, i);
            }
        }
    }

    /// `q` goes to ERR: what is on the wire is torn, the oldest work request fails with `status`
    /// (flushed too, for a queue pair moved to ERR), everything after it and the receive queue
    /// complete flushed.
    pub(crate) fn fail_qp(&mut self, q: usize, status: u32) {
        self.tear(q);
        let qp = &mut self.qps[q];
        qp.state = QpState::Err;
        let mut wrs: Vec<Wr> = qp.flights.drain(..).map(|f| f.wr).collect();
        wrs.extend(qp.sq.drain(..));
        let rq: Vec<u64> = qp.rq.drain(..).collect();
        for (i, w) in wrs.iter().enumerate() {
            self.complete(q, w, if i == 0 { status } else { IBV_WC_WR_FLUSH_ERR });
        }
        let (qpn, cq) = (self.qps[q].qpn, self.qps[q].cq);
        for id in rq {
            self.push_wc(cq, wc(id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, qpn, 0, 0), None);
        }
    }

    /// Start the oldest work request of `q`: read its bytes, check its target, cut it in pieces.
    fn start(&mut self, q: usize) {
        let w = self.qps[q].sq.pop_front().unwrap();
        let port = self.qps[q].port;
        let bytes = match &w.data {
            Data::Inline(b) => b.clone(),
            Data::Gather(g) => {
                let mut b = Vec::new();
                for &(addr, len, lkey) in g {
                    if self.check(lkey, port, addr, len, 0, "a work request's local buffer") {
                        // SAFETY: checked inside a live registration (the test's memory, which
                        // outlives the comms).
                        b.extend_from_slice(unsafe { std::slice::from_raw_parts(addr as *const u8, len) });
                    } else {
                        b.resize(b.len() + len, 0);
                    }
                }
                b
            }
        };
        let len = bytes.len();
        let mut pending = Vec::new();
        match w.opcode {
            IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => {
                let target = self.qps[q].peer.map_or(port, |p| self.qps[p].port);
                if self.check(w.rkey, target, w.remote as usize, len, IBV_ACCESS_REMOTE_WRITE, "an RDMA WRITE") {
                    pending = (0..len).step_by(MTU).map(|o| (o, MTU.min(len - o))).collect();
                }
            }
            IBV_WR_RDMA_READ => {
                // A flush read of our own memory: the target must allow it; nothing placed that
                // the test looks at.
                let len = match &w.data {
                    Data::Gather(g) => g.iter().map(|s| s.1).sum(),
                    Data::Inline(_) => 0,
                };
                self.check(w.rkey, port, w.remote as usize, len, IBV_ACCESS_REMOTE_READ, "an RDMA READ");
            }
            IBV_WR_SEND_WITH_IMM => {}
            op => self.faults.push(format!("opcode {op} is not one the shells post")),
        }
        let peer_epoch = match self.qps[q].peer {
            Some(p) => {
                self.qps[p].rq_psn += 1;
                self.qps[p].epoch
            }
            None => 0,
        };
        self.qps[q].sq_psn += 1;
        self.qps[q].flights.push_back(Flight { wr: w, bytes, pending, peer_epoch, imm_early: false });
    }

    /// The oldest work request on the wire of `q`, all placed: completes (false if it must wait
    /// for a receive at the other end).
    fn finish(&mut self, q: usize) -> bool {
        let f = self.qps[q].flights.front().unwrap();
        let needs_recv = matches!(f.wr.opcode, IBV_WR_RDMA_WRITE_WITH_IMM | IBV_WR_SEND_WITH_IMM) && !f.imm_early;
        let peer = self.qps[q].peer;
        if needs_recv && peer.is_some_and(|p| self.qps[p].rq.is_empty()) {
            return false; // receiver not ready: the NIC retries (rnr_retry 7)
        }
        let f = self.qps[q].flights.pop_front().unwrap();
        let needs_recv = needs_recv && !f.imm_early;
        if f.wr.opcode == IBV_WR_RDMA_READ {
            // A flush read: every write through this port before it is visible now.
            self.flushes += 1;
            self.flush_port(self.qps[q].port);
        }
        if needs_recv {
            let p = peer.expect("a write with an immediate on a connected queue pair");
            let id = self.qps[p].rq.pop_front().unwrap();
            let (pqpn, pcq) = (self.qps[p].qpn, self.qps[p].cq);
            let op = if f.wr.opcode == IBV_WR_SEND_WITH_IMM { IBV_WC_RECV } else { IBV_WC_RECV_RDMA_WITH_IMM };
            self.push_wc(pcq, wc(id, IBV_WC_SUCCESS, op, pqpn, f.bytes.len() as u32, f.wr.imm), None);
        }
        if f.wr.signaled {
            self.complete(q, &f.wr, IBV_WC_SUCCESS);
        }
        true
    }

    /// Some work of queue pair `q`: start a work request, place a piece, or complete the oldest
    /// one; false if it has nothing it can do now.
    pub(crate) fn step(&mut self, q: usize) -> bool {
        let qp = &self.qps[q];
        if qp.state != QpState::Rts || (qp.sq.is_empty() && qp.flights.is_empty()) {
            return false;
        }
        if let Some(status) = self.link_fault(q) {
            self.failed += 1;
            self.fail_qp(q, status);
            return true;
        }
        if let Some((_, status)) = self.fatal.filter(|&(fq, _)| fq == q) {
            self.fatal = None;
            self.fail_qp(q, status);
            return true;
        }
        let ar = self.ports[qp.port].ar;
        let can_start = !qp.sq.is_empty() && qp.flights.len() < WINDOW;
        let placeable: Vec<usize> = (0..qp.flights.len()).filter(|&f| !qp.flights[f].pending.is_empty()).collect();
        let head_done = qp.flights.front().is_some_and(|f| f.pending.is_empty());
        // Adaptive routing's hazard: the oldest write, its last packet placed, delivers its
        // immediate while some of its own data is still on the wire.
        let early = ar
            && qp.flights.front().is_some_and(|f| {
                f.wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM && !f.imm_early && !f.pending.is_empty() && f.bytes.len() > self.ar_threshold.max(MTU) && !f.pending.iter().any(|&(o, l)| o + l == f.bytes.len())
            })
            && qp.peer.is_some_and(|p| !self.qps[p].rq.is_empty());
        if early && self.rng.chance(30) {
            let p = self.qps[q].peer.unwrap();
            let id = self.qps[p].rq.pop_front().unwrap();
            let (pqpn, pcq) = (self.qps[p].qpn, self.qps[p].cq);
            let f = self.qps[q].flights.front_mut().unwrap();
            f.imm_early = true;
            let (len, imm) = (f.bytes.len() as u32, f.wr.imm);
            self.imm_early += 1;
            self.push_wc(pcq, wc(id, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, pqpn, len, imm), None);
            return true;
        }
        for k in 0..3 {
            match (self.rng.below(3) + k) % 3 {
                0 if can_start => {
                    self.start(q);
                    return true;
                }
                1 if !placeable.is_empty() => {
                    let f = if ar { placeable[self.rng.below(placeable.len())] } else { placeable[0] };
                    let i = if ar { self.rng.below(self.qps[q].flights[f].pending.len()) } else { 0 };
                    self.place(q, f, i);
                    return true;
                }
                2 if head_done && self.finish(q) => return true,
                _ => {}
            }
        }
        false
    }
}

/// 64 bytes, 64-aligned (what the shells' pieces of registered memory are made of).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Line(pub(crate) [u8; 64]);

/// The simulated NIC: one fabric per thread.
pub(crate) struct SimNic;

pub(crate) struct SimPort {
    pub(crate) name: String,
    /// Its index in the fabric's ports.
    pub(crate) idx: usize,
}
