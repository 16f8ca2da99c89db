//! The simulated NIC of `shell_sim`: one fabric per thread, implementing the verbs shells'
//! seam (`nic::Nic`, `nic::NicPort`) as a NIC would.

use nccl_net_rivet::sys::ib::*;
use nccl_net_rivet::transport::verbs::conn;
use nccl_net_rivet::transport::verbs::nic::{Nic, NicPort};
use nccl_net_rivet::transport::verbs::res::Link;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

#[derive(Clone, Copy)]
pub(crate) struct Region {
    pub(crate) addr: usize,
    pub(crate) len: usize,
    pub(crate) access: u32,
}

pub(crate) enum Data {
    /// The bytes, copied at post (an inline work request).
    Inline(Vec<u8>),
    /// Read when the work request executes: (address, length, lkey) per scatter entry.
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
}

pub(crate) struct Qp {
    pub(crate) qpn: u32,
    pub(crate) cq: usize,
    /// The queue pair at the other end (None for a flush queue pair: it reads its own memory).
    pub(crate) peer: Option<usize>,
    pub(crate) sq: VecDeque<Wr>,
    pub(crate) sq_depth: usize,
    pub(crate) rq: VecDeque<u64>,
    pub(crate) rq_depth: usize,
    pub(crate) err: bool,
}

#[derive(Default)]
pub(crate) struct Fabric {
    pub(crate) regions: HashMap<u32, Region>,
    pub(crate) qps: Vec<Qp>,
    pub(crate) cqs: Vec<VecDeque<ibv_wc>>,
    pub(crate) next_key: u32,
    /// What the shells did that a NIC would refuse (the run fails on any).
    pub(crate) faults: Vec<String>,
    /// Queue pairs whose link is dead (both ends of a pair): their work requests fail.
    pub(crate) broken: Vec<bool>,
    /// Work requests that ran into a dead link.
    pub(crate) failed: usize,
    /// Bytes a write on a dead link places before it fails (a prefix, as a link that dies
    /// mid-message leaves), chosen by the schedule.
    pub(crate) torn: usize,
}

thread_local! {
    pub(crate) static FAB: RefCell<Fabric> = RefCell::new(Fabric { next_key: 0x100, ..Default::default() });
}

#[inline(never)]
pub(crate) fn fab<T>(f: impl FnOnce(&mut Fabric) -> T) -> T {
    FAB.with(|x| f(&mut x.borrow_mut()))
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
    pub(crate) fn register(&mut self, addr: usize, len: usize, access: u32) -> u32 {
        let k = self.next_key;
        self.next_key += 1;
        self.regions.insert(k, Region { addr, len, access });
        k
    }

    /// The region `key` names if it covers `[addr, addr + len)` with `access`.
    pub(crate) fn check(&mut self, key: u32, addr: usize, len: usize, access: u32, what: &str) -> bool {
        match self.regions.get(&key) {
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

    /// The oldest work request of `q` runs into a dead link: a write places at most a prefix of
    /// its bytes, then the transport gives up (RETRY_EXC_ERR, signaled or not), the queue pair
    /// goes to ERR, and everything after it on its send queue completes flushed.
    pub(crate) fn fail(&mut self, q: usize) -> bool {
        let w = self.qps[q].sq.pop_front().unwrap();
        self.failed += 1;
        if let (IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM, Data::Gather(g)) = (w.opcode, &w.data) {
            if let Some(&(addr, len, _)) = g.first() {
                let n = len.min(self.torn);
                if n > 0 && self.check(w.rkey, w.remote as usize, n, IBV_ACCESS_REMOTE_WRITE, "an RDMA WRITE") {
                    // SAFETY: the source is the work request's (checked when the shells posted
                    // it: their memory, live until the send completes), the target checked.
                    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, w.remote as *mut u8, n) };
                }
            }
        }
        let (qpn, cq) = (self.qps[q].qpn, self.qps[q].cq);
        self.cqs[cq].push_back(wc(w.wr_id, IBV_WC_RETRY_EXC_ERR, 0, qpn, 0, 0));
        self.qps[q].err = true;
        let rest: Vec<u64> = self.qps[q].sq.drain(..).map(|w| w.wr_id).collect();
        for id in rest {
            self.cqs[cq].push_back(wc(id, IBV_WC_WR_FLUSH_ERR, 0, qpn, 0, 0));
        }
        true
    }

    pub(crate) fn new_qp(&mut self, cq: usize, sq_depth: usize, rq_depth: usize) -> usize {
        let qpn = 0x40 + self.qps.len() as u32;
        self.qps.push(Qp { qpn, cq, peer: None, sq: VecDeque::new(), sq_depth, rq: VecDeque::new(), rq_depth, err: false });
        self.qps.len() - 1
    }

    pub(crate) fn new_cq(&mut self) -> usize {
        self.cqs.push(VecDeque::new());
        self.cqs.len() - 1
    }

    /// Execute the oldest work request of queue pair `q`; false if it must wait (no receive
    /// posted at the other end) or there is none.
    pub(crate) fn step(&mut self, q: usize) -> bool {
        let Some(w) = self.qps[q].sq.front() else { return false };
        let needs_recv = matches!(w.opcode, IBV_WR_RDMA_WRITE_WITH_IMM | IBV_WR_SEND_WITH_IMM);
        let peer = self.qps[q].peer;
        if needs_recv && peer.is_some_and(|p| self.qps[p].rq.is_empty()) {
            return false; // receiver not ready: the NIC retries (rnr_retry 7)
        }
        if self.broken.get(q).copied().unwrap_or(false) {
            return self.fail(q);
        }
        let w = self.qps[q].sq.pop_front().unwrap();
        let bytes = match &w.data {
            Data::Inline(b) => b.clone(),
            Data::Gather(g) => {
                let mut b = Vec::new();
                for &(addr, len, lkey) in g {
                    if !self.check(lkey, addr, len, 0, "a work request's local buffer") {
                        return true;
                    }
                    // SAFETY: checked inside a live registration (the test's memory, which
                    // outlives the comms).
                    b.extend_from_slice(unsafe { std::slice::from_raw_parts(addr as *const u8, len) });
                }
                b
            }
        };
        let (qpn, cq) = (self.qps[q].qpn, self.qps[q].cq);
        match w.opcode {
            IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => {
                let (addr, len) = (w.remote as usize, bytes.len());
                if self.check(w.rkey, addr, len, IBV_ACCESS_REMOTE_WRITE, "an RDMA WRITE") && len > 0 {
                    // SAFETY: checked inside a live registration with remote write.
                    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, len) };
                }
            }
            IBV_WR_RDMA_READ => {
                // A flush read of our own memory: nothing to move that the test looks at.
            }
            IBV_WR_SEND_WITH_IMM => {}
            op => self.faults.push(format!("opcode {op} is not one the shells post")),
        }
        if needs_recv {
            let p = peer.expect("a write with an immediate on a connected queue pair");
            let id = self.qps[p].rq.pop_front().unwrap();
            let (pqpn, pcq) = (self.qps[p].qpn, self.qps[p].cq);
            let op = if w.opcode == IBV_WR_SEND_WITH_IMM { IBV_WC_RECV } else { IBV_WC_RECV_RDMA_WITH_IMM };
            self.cqs[pcq].push_back(wc(id, IBV_WC_SUCCESS, op, pqpn, bytes.len() as u32, w.imm));
        }
        if w.signaled {
            self.cqs[cq].push_back(wc(w.wr_id, IBV_WC_SUCCESS, 0, qpn, 0, 0));
        }
        true
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
}

impl NicPort for SimPort {
    fn dev_name(&self) -> &str {
        &self.name
    }
    fn num(&self) -> u8 {
        1
    }
    fn poll_events(&self) {}
    fn poll_events_at(&self, _now_ms: u64) {}
    fn seen_down(&self) -> bool {
        false
    }
    fn state(&self) -> Option<&'static str> {
        Some("ACTIVE")
    }
    fn qp_event(&self, _qpns: impl Iterator<Item = u32> + Clone) -> Option<(u32, &'static str)> {
        None
    }
    fn check_fatal(&self) -> nccl_net_rivet::error::Result<()> {
        Ok(())
    }
    fn adaptive_routing(&self) -> bool {
        false
    }
    fn dev_id(&self) -> usize {
        self as *const _ as usize
    }
}

impl Nic for SimNic {
    type Port = SimPort;
    type Qp = usize;
    type Cq = usize;
    /// Cache lines, so that the pieces are aligned as the shells' reads of them need (a CTS
    /// entry is 32-byte aligned).
    type Mem = Vec<Line>;

    #[inline(never)]
    fn qpn(qp: &usize) -> u32 {
        fab(|f| f.qps[*qp].qpn)
    }

    #[inline(never)]
    fn max_inline(_qp: &usize) -> u32 {
        conn::SEND_INLINE
    }

    #[inline(never)]
    unsafe fn post_send(qp: &usize, mut wr: *mut ibv_send_wr) -> i32 {
        fab(|f| {
            while !wr.is_null() {
                // SAFETY: the caller vouches for the chain (post_send's contract).
                let w = unsafe { &*wr };
                let sges: &[ibv_sge] = if w.num_sge > 0 {
                    // SAFETY: as above: `num_sge` entries at `sg_list`.
                    unsafe { std::slice::from_raw_parts(w.sg_list, w.num_sge as usize) }
                } else {
                    &[]
                };
                let data = if w.send_flags & IBV_SEND_INLINE != 0 {
                    let mut b = Vec::new();
                    for s in sges {
                        // SAFETY: an inline work request's bytes are read at post, from memory
                        // the caller vouches for.
                        b.extend_from_slice(unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.length as usize) });
                    }
                    if b.len() > conn::SEND_INLINE as usize {
                        f.faults.push(format!("an inline work request of {} bytes (the queue pair takes {})", b.len(), conn::SEND_INLINE));
                    }
                    Data::Inline(b)
                } else {
                    Data::Gather(sges.iter().map(|s| (s.addr as usize, s.length as usize, s.lkey)).collect())
                };
                // SAFETY: the rdma member is the one RDMA work requests use (zeroed otherwise).
                let (remote, rkey) = unsafe { (w.wr.rdma.remote_addr, w.wr.rdma.rkey) };
                // SAFETY: a plain u32 either way.
                let imm = unsafe { w.__bindgen_anon_1.imm_data };
                let q = &mut f.qps[*qp];
                let item = Wr { wr_id: w.wr_id, opcode: w.opcode, signaled: w.send_flags & IBV_SEND_SIGNALED != 0, remote, rkey, imm, data };
                if q.err {
                    // In ERR: every work request completes, flushed.
                    let (qpn, cq) = (q.qpn, q.cq);
                    f.cqs[cq].push_back(wc(item.wr_id, IBV_WC_WR_FLUSH_ERR, 0, qpn, 0, 0));
                } else {
                    q.sq.push_back(item);
                    if q.sq.len() > q.sq_depth {
                        let (n, d) = (q.sq.len(), q.sq_depth);
                        f.faults.push(format!("send queue of QP {qp} holds {n} work requests, deeper than its {d}"));
                    }
                }
                wr = w.next;
            }
            0
        })
    }

    #[inline(never)]
    unsafe fn post_recv(qp: &usize, mut wr: *mut ibv_recv_wr) -> i32 {
        fab(|f| {
            while !wr.is_null() {
                // SAFETY: the caller vouches for the chain.
                let w = unsafe { &*wr };
                let q = &mut f.qps[*qp];
                if q.err {
                    let (qpn, cq) = (q.qpn, q.cq);
                    f.cqs[cq].push_back(wc(w.wr_id, IBV_WC_WR_FLUSH_ERR, 0, qpn, 0, 0));
                } else {
                    q.rq.push_back(w.wr_id);
                    if q.rq.len() > q.rq_depth {
                        let (n, d) = (q.rq.len(), q.rq_depth);
                        f.faults.push(format!("receive queue of QP {qp} holds {n}, deeper than its {d}"));
                    }
                }
                wr = w.next;
            }
            0
        })
    }

    #[inline(never)]
    fn poll(cq: &usize, out: &mut [ibv_wc]) -> nccl_net_rivet::error::Result<usize> {
        Ok(fab(|f| {
            let mut n = 0;
            while n < out.len() {
                let Some(w) = f.cqs[*cq].pop_front() else { break };
                out[n] = w;
                n += 1;
            }
            n
        }))
    }

    #[inline(never)]
    fn to_err(qp: &usize, _port: &SimPort) -> nccl_net_rivet::error::Result<()> {
        fab(|f| {
            let q = &mut f.qps[*qp];
            q.err = true;
            let (qpn, cq) = (q.qpn, q.cq);
            let flushed: Vec<u64> = q.sq.drain(..).map(|w| w.wr_id).chain(q.rq.drain(..)).collect();
            for id in flushed {
                f.cqs[cq].push_back(wc(id, IBV_WC_WR_FLUSH_ERR, 0, qpn, 0, 0));
            }
        });
        Ok(())
    }

    #[inline(never)]
    fn reset_to_rtr(_qp: &usize, _port: &SimPort, _l: &Link) -> nccl_net_rivet::error::Result<()> {
        Err(nccl_net_rivet::error::Error::internal("the simulated NIC does not take queue pairs back"))
    }

    #[inline(never)]
    fn back_to_rts(_qp: &usize, _port: &SimPort, _l: &Link) -> nccl_net_rivet::error::Result<()> {
        Err(nccl_net_rivet::error::Error::internal("the simulated NIC does not take queue pairs back"))
    }

    #[inline(never)]
    fn flush_qp(_port: &'static SimPort, cq: &usize) -> nccl_net_rivet::error::Result<usize> {
        Ok(fab(|f| f.new_qp(*cq, 8, 0)))
    }
}

