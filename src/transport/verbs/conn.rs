//! The verbs data path: receiver-driven RDMA WRITE.
//!
//! * `irecv` posts one zero-length receive per queue pair and RDMA-writes a clear-to-send (CTS)
//!   entry per buffer (address, size, rkey, tag, sequence) into the sender's FIFO.
//! * `isend` returns a NULL request until the CTS for its slot has arrived; once every send of
//!   the slot is matched (grouped receives take up to 8) it RDMA-writes the payloads, split across
//!   the queue pairs in 128-byte units, and completes each QP's chain with an immediate: the size
//!   for a single receive, or "read the sizes FIFO", which the chain wrote first.
//! * `test` polls the comm's one CQ in batches; a failed completion kills the comm with a WARN
//!   naming device, port, QPN, peer, status, vendor error and a hint; later calls fail fast.
//! * A peer that vanished (out-of-band socket closed) fails pending requests after a grace period.
//!
//! Nothing here allocates: requests, work requests and scatter lists are fixed arrays.

use super::dev::IbPort;
use super::res::{Cq, QpRts, RegBuf};
use crate::error::{Error, Kind, Result};
use crate::proto::verbs::{qp_chunk, Cts, Mismatch, FIFO_DEPTH, IMM_SIZES, NOTICE_SIZE, SIZES_ENTRY};
use crate::sys::ib::*;
use crate::sys::verbs::{self, wc_status_hint, wc_status_name};
use crate::transport::{Conn, MrInfo, RecvBuf, MAX_RECVS};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

pub const SEND_REQS: usize = 32 * MAX_RECVS;
pub const RECV_REQS: usize = 32;
pub const FLUSH_REQS: usize = 32;
/// Work requests one QP may chain for one slot: a write per buffer, the sizes write, the immediate.
const MAX_CHAIN: usize = MAX_RECVS + 2;
const POLL_BATCH: usize = 16;
/// Signal one CTS write in this many (the others complete silently but hold send-queue slots).
const CTS_SIGNAL_EVERY: u64 = 32;
/// How long completions may still arrive after the peer's socket closed.
const EOF_GRACE: Duration = Duration::from_millis(500);
const LIVENESS_EVERY: Duration = Duration::from_millis(10);

const KIND_SHIFT: u32 = 56;
const KIND_SEND: u64 = 1;
const KIND_RECV: u64 = 2;
const KIND_CTS: u64 = 3;
const KIND_FLUSH: u64 = 4;

/// Send-queue and receive-queue depths (also what CQs are sized from).
pub const SEND_QP_SQ: u32 = (RECV_REQS * MAX_CHAIN + 64) as u32;
pub const RECV_QP_SQ: u32 = 256;
pub const RECV_QP_RQ: u32 = (RECV_REQS * 2) as u32;
pub const FLUSH_QP_SQ: u32 = FLUSH_REQS as u32 + 1;

enum PeerState {
    Alive,
    Gone,
    Mismatch(Mismatch),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum St {
    Free,
    /// A send waiting for the other sends of its grouped receive.
    Matched,
    Posted,
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
        if r == 0 || !matches!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR)) {
            return PeerState::Gone;
        }
        PeerState::Alive
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
            KIND_CTS => "clear-to-send write",
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
        let mut cause = String::new();
        if wc.status == IBV_WC_WR_FLUSH_ERR {
            // What put the QP in the error state, when the device said so.
            self.port.dev.poll_events();
            if let Some((_, ev)) = self.port.dev.qp_event(std::iter::once(wc.qp_num)) {
                cause = format!("; cause: asynchronous event {ev} on this QP: {}", event_hint(ev));
            }
        }
        let gone = if matches!(self.peer_state(), PeerState::Gone) {
            format!("; the peer {} has closed its connection, so it most likely exited or crashed", self.peer)
        } else {
            String::new()
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
                    "collective mismatch: the peer {} sends {} bytes with tag {} into our receive of {} bytes; every rank must run the same collectives with the same sizes",
                    self.peer, m.send_size, m.tag, m.recv_size
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

#[derive(Clone, Copy)]
struct SendReq {
    st: St,
    pending: u32,
    size: usize,
    data: u64,
    lkey: u32,
    cts: Cts,
}

pub struct VerbsSend {
    // Field order is drop order: QPs before their CQ, MRs before their memory.
    qps: Vec<QpRts>,
    cq: Cq,
    /// The CTS FIFO the receiver writes into.
    fifo: RegBuf,
    /// Sizes of grouped receives, staged for the RDMA write into the receiver's sizes FIFO.
    sizes_out: RegBuf,
    rem_sizes_addr: u64,
    rem_sizes_rkey: u32,
    head: u64,
    /// Request index + 1 matched to each entry of the current slot.
    matched: [u16; MAX_RECVS],
    nmatched: usize,
    groups: Box<[[u16; MAX_RECVS]]>,
    group_n: Box<[u8]>,
    reqs: Box<[SendReq]>,
    free: Vec<u16>,
    wrs: [ibv_send_wr; MAX_CHAIN],
    sges: [ibv_sge; MAX_CHAIN],
    pub c: Common,
}

unsafe impl Send for VerbsSend {}

impl VerbsSend {
    pub fn new(c: Common, qps: Vec<QpRts>, cq: Cq, fifo: RegBuf, sizes_out: RegBuf, rem_sizes: (u64, u32)) -> VerbsSend {
        let empty = SendReq { st: St::Free, pending: 0, size: 0, data: 0, lkey: 0, cts: Cts::default() };
        let mut free = Vec::with_capacity(SEND_REQS);
        free.extend((0..SEND_REQS as u16).rev());
        VerbsSend {
            qps,
            cq,
            fifo,
            sizes_out,
            rem_sizes_addr: rem_sizes.0,
            rem_sizes_rkey: rem_sizes.1,
            head: 0,
            matched: [0; MAX_RECVS],
            nmatched: 0,
            groups: vec![[0u16; MAX_RECVS]; FIFO_DEPTH].into_boxed_slice(),
            group_n: vec![0u8; FIFO_DEPTH].into_boxed_slice(),
            reqs: vec![empty; SEND_REQS].into_boxed_slice(),
            free,
            wrs: unsafe { std::mem::zeroed() },
            sges: unsafe { std::mem::zeroed() },
            c,
        }
    }

    fn entry(&self, slot: usize, r: usize) -> Cts {
        let p = self.fifo.buf.ptr() as *const Cts;
        unsafe { std::ptr::read_volatile(p.add(slot * MAX_RECVS + r)) }
    }

    /// Every send of the current slot is matched: write the payloads and the completion.
    fn post_group(&mut self, slot: usize, n: usize) -> Result<()> {
        let members: [u16; MAX_RECVS] = std::array::from_fn(|r| if r < n { self.matched[r] - 1 } else { 0 });
        let use_sizes = n > 1 || members[..n].iter().any(|&m| self.reqs[m as usize].size >= IMM_SIZES as usize / 2);
        if use_sizes {
            let p = unsafe { (self.sizes_out.buf.ptr() as *mut u64).add(slot * MAX_RECVS) };
            for (r, &m) in members[..n].iter().enumerate() {
                unsafe { p.add(r).write(self.reqs[m as usize].size as u64) };
            }
        }
        let nqps = self.qps.len();
        let wr_id = (KIND_SEND << KIND_SHIFT) | slot as u64;
        for q in 0..nqps {
            let max_inline = self.qps[q].qp().max_inline as usize;
            let mut k = 0;
            for &m in &members[..n] {
                let rq = &self.reqs[m as usize];
                let (off, len) = qp_chunk(rq.size, nqps, q);
                if len == 0 {
                    continue;
                }
                self.sges[k] = ibv_sge { addr: rq.data + off as u64, length: len as u32, lkey: rq.lkey };
                self.wrs[k] = rdma_wr(IBV_WR_RDMA_WRITE, wr_id, rq.cts.addr + off as u64, rq.cts.rkey, 1);
                if len <= max_inline {
                    self.wrs[k].send_flags |= IBV_SEND_INLINE;
                }
                k += 1;
            }
            if use_sizes && q == 0 {
                let off = (slot * SIZES_ENTRY) as u64;
                self.sges[k] =
                    ibv_sge { addr: self.sizes_out.addr() + off, length: (n * 8) as u32, lkey: self.sizes_out.mr.lkey() };
                self.wrs[k] = rdma_wr(IBV_WR_RDMA_WRITE, wr_id, self.rem_sizes_addr + off, self.rem_sizes_rkey, 1);
                if n * 8 <= max_inline {
                    self.wrs[k].send_flags |= IBV_SEND_INLINE;
                }
                k += 1;
            }
            let imm = if use_sizes { IMM_SIZES } else { self.reqs[members[0] as usize].size as u32 };
            if k > 0 {
                // The last write carries the immediate that completes the receive.
                self.wrs[k - 1].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
            } else {
                // Nothing for this QP to write: a zero-length send still consumes its receive.
                self.wrs[0] = rdma_wr(IBV_WR_SEND_WITH_IMM, wr_id, 0, 0, 0);
                k = 1;
            }
            self.wrs[k - 1].__bindgen_anon_1.imm_data = imm.to_be();
            self.wrs[k - 1].send_flags |= IBV_SEND_SIGNALED;
            if let Err(rc) = post_chain(&self.qps[q], &mut self.wrs, &mut self.sges, k) {
                let e = Error::system(format!(
                    "{}: ibv_post_send failed: {}",
                    self.c.where_(self.qps[q].qp().qpn()),
                    std::io::Error::from_raw_os_error(rc)
                ));
                return Err(self.c.die(e));
            }
        }
        self.groups[slot] = members;
        self.group_n[slot] = n as u8;
        for &m in &members[..n] {
            let rq = &mut self.reqs[m as usize];
            rq.st = St::Posted;
            rq.pending = nqps as u32;
        }
        Ok(())
    }

    fn progress(&mut self) -> Result<bool> {
        let n = self.cq.poll(&mut self.c.wc)?;
        for i in 0..n {
            let wc = self.c.wc[i];
            if wc.status != IBV_WC_SUCCESS {
                if wc.status == IBV_WC_WR_FLUSH_ERR && self.c.dead.is_some() {
                    continue;
                }
                let e = self.c.wc_error(&wc);
                self.c.die(e);
                continue;
            }
            if wc.wr_id >> KIND_SHIFT == KIND_SEND {
                let slot = (wc.wr_id & 0xffff_ffff) as usize % FIFO_DEPTH;
                let g = self.groups[slot];
                for &m in &g[..self.group_n[slot] as usize] {
                    let rq = &mut self.reqs[m as usize];
                    rq.pending = rq.pending.saturating_sub(1);
                }
            }
        }
        self.c.check()?;
        Ok(n > 0)
    }
}

impl Conn for VerbsSend {
    fn isend(&mut self, data: *const u8, size: usize, tag: i32, mr: *const MrInfo) -> Result<Option<u32>> {
        self.c.check()?;
        let slot = (self.head % FIFO_DEPTH as u64) as usize;
        let seq = (self.head + 1) as u32;
        let e0 = self.entry(slot, 0);
        if e0.seq != seq {
            let outstanding = SEND_REQS - self.free.len();
            self.progress()?;
            self.c.idle(outstanding)?;
            return Ok(None);
        }
        let n = e0.nreqs as usize;
        if n == 0 || n > MAX_RECVS {
            let e = Error::remote(format!("{}: corrupt clear-to-send entry (nreqs {n})", self.c.where_(0)));
            return Err(self.c.die(e));
        }
        if (1..n).any(|r| self.entry(slot, r).seq != seq) {
            return Ok(None); // the rest of the grouped entry is still arriving
        }
        fence(Ordering::Acquire);
        let Some(r) = (0..n).find(|&r| self.matched[r] == 0 && self.entry(slot, r).tag == tag) else {
            let tags: Vec<i32> = (0..n).map(|r| self.entry(slot, r).tag).collect();
            return Err(Error::usage(format!(
                "collective mismatch: a send with tag {tag} does not match the peer's posted receive (tags {tags:?}, sends already matched {})",
                self.nmatched
            )));
        };
        let cts = self.entry(slot, r);
        if size as u64 > cts.size {
            let e = Error::usage(format!(
                "collective mismatch: a send of {size} bytes with tag {tag} is larger than the peer's receive of {} bytes; every rank must run the same collectives with the same sizes",
                cts.size
            ));
            self.c.notify_mismatch(Mismatch { send_size: size as u64, recv_size: cts.size, tag });
            return Err(self.c.die(e));
        }
        let lkey = if size > 0 {
            mr_for(mr, data as usize, size, dev_id(self.c.port), 0, "isend")?.lkey
        } else {
            0
        };
        let Some(idx) = self.free.pop() else { return Ok(None) };
        self.reqs[idx as usize] = SendReq { st: St::Matched, pending: 0, size, data: data as u64, lkey, cts };
        self.matched[r] = idx + 1;
        self.nmatched += 1;
        if self.nmatched == n {
            self.post_group(slot, n)?;
            self.matched = [0; MAX_RECVS];
            self.nmatched = 0;
            self.head += 1;
        }
        Ok(Some(idx as u32))
    }

    fn test(&mut self, slot: u32, sizes: &mut [usize; MAX_RECVS]) -> Result<Option<usize>> {
        let i = slot as usize;
        if self.reqs.get(i).map_or(true, |r| r.st == St::Free) {
            return Err(Error::internal(format!("test on send request {slot}, which is not in flight")));
        }
        let mut moved = false;
        if self.reqs[i].st != St::Posted || self.reqs[i].pending > 0 {
            moved = self.progress()?;
        }
        let r = self.reqs[i];
        if r.st == St::Posted && r.pending == 0 {
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

#[derive(Clone, Copy)]
struct RecvReq {
    st: St,
    flush: bool,
    pending: u32,
    n: u8,
    slot: u16,
    imm: u32,
}

pub struct VerbsRecv {
    qps: Vec<QpRts>,
    flush_qp: QpRts,
    cq: Cq,
    /// CTS entries staged for the RDMA write into the sender's FIFO.
    cts_out: RegBuf,
    /// Sizes of grouped receives, written by the sender.
    sizes_in: RegBuf,
    /// Where flush reads land.
    scratch: RegBuf,
    rem_fifo_addr: u64,
    rem_fifo_rkey: u32,
    tail: u64,
    reqs: Box<[RecvReq]>,
    free: Vec<u16>,
    free_flush: Vec<u16>,
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
        scratch: RegBuf,
        rem_fifo: (u64, u32),
        flush_disabled: bool,
    ) -> VerbsRecv {
        let empty = RecvReq { st: St::Free, flush: false, pending: 0, n: 0, slot: 0, imm: 0 };
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
            scratch,
            rem_fifo_addr: rem_fifo.0,
            rem_fifo_rkey: rem_fifo.1,
            tail: 0,
            reqs: vec![empty; RECV_REQS + FLUSH_REQS].into_boxed_slice(),
            free,
            free_flush,
            wrs: unsafe { std::mem::zeroed() },
            sges: unsafe { std::mem::zeroed() },
            flush_disabled,
            c,
        }
    }

    fn progress(&mut self) -> Result<bool> {
        let n = self.cq.poll(&mut self.c.wc)?;
        for i in 0..n {
            let wc = self.c.wc[i];
            if wc.status != IBV_WC_SUCCESS {
                if wc.status == IBV_WC_WR_FLUSH_ERR && self.c.dead.is_some() {
                    continue;
                }
                let e = self.c.wc_error(&wc);
                self.c.die(e);
                continue;
            }
            let kind = wc.wr_id >> KIND_SHIFT;
            if kind == KIND_RECV || kind == KIND_FLUSH {
                let Some(r) = self.reqs.get_mut((wc.wr_id & 0xffff_ffff) as usize) else { continue };
                r.pending = r.pending.saturating_sub(1);
                if kind == KIND_RECV {
                    r.imm = u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data });
                }
            }
        }
        self.c.check()?;
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
        let mut keys = [0u32; MAX_RECVS];
        for (i, b) in bufs.iter().enumerate() {
            if b.size > 0 {
                keys[i] = mr_for(b.mr, b.ptr as usize, b.size, dev, IBV_ACCESS_REMOTE_WRITE, "irecv")?.rkey;
            }
        }
        let Some(idx) = self.free.pop() else { return Ok(None) };
        for q in 0..self.qps.len() {
            let mut wr = ibv_recv_wr {
                wr_id: (KIND_RECV << KIND_SHIFT) | idx as u64,
                next: std::ptr::null_mut(),
                sg_list: std::ptr::null_mut(),
                num_sge: 0,
            };
            let mut bad = std::ptr::null_mut();
            let rc = unsafe { verbs::post_recv(self.qps[q].qp().raw(), &mut wr, &mut bad) };
            if rc != 0 {
                let e = Error::system(format!(
                    "{}: ibv_post_recv failed: {}",
                    self.c.where_(self.qps[q].qp().qpn()),
                    std::io::Error::from_raw_os_error(rc)
                ));
                return Err(self.c.die(e));
            }
        }
        let slot = (self.tail % FIFO_DEPTH as u64) as usize;
        let seq = (self.tail + 1) as u32;
        let out = unsafe { (self.cts_out.buf.ptr() as *mut Cts).add(slot * MAX_RECVS) };
        for (i, b) in bufs.iter().enumerate() {
            let e = Cts {
                addr: b.ptr as u64,
                size: b.size as u64,
                rkey: keys[i],
                tag: b.tag,
                nreqs: n as u16,
                _pad: 0,
                seq,
            };
            unsafe { out.add(i).write(e) };
        }
        let q = (self.tail % self.qps.len() as u64) as usize;
        let len = n * std::mem::size_of::<Cts>();
        let off = (slot * MAX_RECVS * std::mem::size_of::<Cts>()) as u64;
        self.sges[0] = ibv_sge { addr: self.cts_out.addr() + off, length: len as u32, lkey: self.cts_out.mr.lkey() };
        self.wrs[0] = rdma_wr(IBV_WR_RDMA_WRITE, KIND_CTS << KIND_SHIFT, self.rem_fifo_addr + off, self.rem_fifo_rkey, 1);
        if len <= self.qps[q].qp().max_inline as usize {
            self.wrs[0].send_flags |= IBV_SEND_INLINE;
        }
        if self.tail % CTS_SIGNAL_EVERY == 0 {
            self.wrs[0].send_flags |= IBV_SEND_SIGNALED;
        }
        if let Err(rc) = post_chain(&self.qps[q], &mut self.wrs, &mut self.sges, 1) {
            let e = Error::system(format!(
                "{}: posting a clear-to-send failed: {}",
                self.c.where_(self.qps[q].qp().qpn()),
                std::io::Error::from_raw_os_error(rc)
            ));
            return Err(self.c.die(e));
        }
        self.tail += 1;
        self.reqs[idx as usize] =
            RecvReq { st: St::Posted, flush: false, pending: self.qps.len() as u32, n: n as u8, slot: slot as u16, imm: 0 };
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
            let e = Error::system(format!(
                "{}: posting the flush read failed: {}",
                self.c.where_(self.flush_qp.qp().qpn()),
                std::io::Error::from_raw_os_error(rc)
            ));
            return Err(self.c.die(e));
        }
        self.reqs[idx as usize] = RecvReq { st: St::Posted, flush: true, pending: 1, n: 0, slot: 0, imm: 0 };
        Ok(Some(idx as u32))
    }

    fn test(&mut self, slot: u32, sizes: &mut [usize; MAX_RECVS]) -> Result<Option<usize>> {
        let i = slot as usize;
        if self.reqs.get(i).map_or(true, |r| r.st == St::Free) {
            return Err(Error::internal(format!("test on receive request {slot}, which is not in flight")));
        }
        let mut moved = false;
        if self.reqs[i].pending > 0 {
            moved = self.progress()?;
        }
        let r = self.reqs[i];
        if r.pending == 0 {
            self.reqs[i].st = St::Free;
            if r.flush {
                self.free_flush.push(slot as u16);
                return Ok(Some(0));
            }
            let n = r.n as usize;
            if r.imm == IMM_SIZES {
                let p = unsafe { (self.sizes_in.buf.ptr() as *const u64).add(r.slot as usize * MAX_RECVS) };
                fence(Ordering::Acquire);
                for (k, s) in sizes.iter_mut().enumerate().take(n) {
                    *s = unsafe { std::ptr::read_volatile(p.add(k)) } as usize;
                }
            } else {
                sizes[0] = r.imm as usize;
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
