//! The verbs shells' seam (`nic::Nic`, `nic::NicPort`) on the simulated fabric: what a post,
//! a poll, a state change or a port's question does to it.

use super::gpu::SimGpu;
use super::nic::*;
use nccl_net_rivet::sys::ib::*;
use nccl_net_rivet::transport::verbs::conn;
use nccl_net_rivet::transport::verbs::nic::{Nic, NicPort};
use nccl_net_rivet::transport::verbs::res::Link;

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
        fab(|f| f.ports[self.idx].shown_down)
    }
    fn state(&self) -> Option<&'static str> {
        Some(if fab(|f| f.ports[self.idx].shown_down) { "DOWN" } else { "ACTIVE" })
    }
    fn qp_event(&self, _qpns: impl Iterator<Item = u32> + Clone) -> Option<(u32, &'static str)> {
        None
    }
    fn downs(&self) -> u32 {
        fab(|f| f.ports[self.idx].downs)
    }
    fn check_fatal(&self) -> nccl_net_rivet::error::Result<()> {
        Ok(())
    }
    fn adaptive_routing(&self) -> bool {
        fab(|f| f.ports[self.idx].ar && !f.ar_untold)
    }
    fn dev_id(&self) -> usize {
        0x1000 + self.idx
    }
}

fn sim_err(what: String) -> nccl_net_rivet::error::Error {
    nccl_net_rivet::error::Error::system(what)
}

impl Nic for SimNic {
    type Port = SimPort;
    type Qp = usize;
    type Cq = usize;
    /// Cache lines, so that the pieces are aligned as the shells' reads of them need (a CTS
    /// entry is 32-byte aligned).
    type Mem = Vec<Line>;
    type Gpu = SimGpu;

    fn gpu_of(addr: usize) -> nccl_net_rivet::error::Result<i32> {
        if !fab(|f| f.in_gpu(addr, 1)) {
            return Err(sim_err(format!("{addr:#x} is not GPU memory")));
        }
        Ok(0)
    }

    fn gpu_copier(_ordinal: i32) -> nccl_net_rivet::error::Result<SimGpu> {
        Ok(SimGpu)
    }

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
                        if f.in_gpu(s.addr as usize, s.length as usize) {
                            f.faults.push(format!("an inline work request from GPU memory at {:#x} (the CPU cannot read it)", s.addr));
                            continue;
                        }
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
                let item = Wr { wr_id: w.wr_id, opcode: w.opcode, signaled: w.send_flags & IBV_SEND_SIGNALED != 0, remote, rkey, imm, data, seq: q.posted };
                q.posted += 1;
                if q.posted - q.freed > q.sq_depth as u64 {
                    let (n, d) = (q.posted - q.freed, q.sq_depth);
                    f.faults.push(format!("send queue of QP {qp} holds {n} work requests not yet freed by a polled completion, deeper than its {d}"));
                }
                match q.state {
                    QpState::Rts => q.sq.push_back(item),
                    // In ERR: every work request completes, flushed.
                    QpState::Err => f.complete(*qp, &item, IBV_WC_WR_FLUSH_ERR),
                    s => f.faults.push(format!("a send work request posted on QP {qp} in state {s:?}")),
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
                match q.state {
                    QpState::Err => {
                        let (qpn, cq) = (q.qpn, q.cq);
                        f.push_wc(cq, wc(w.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, qpn, 0, 0), None);
                    }
                    QpState::Gone | QpState::Reset => f.faults.push(format!("a receive posted on QP {qp} in state {:?}", q.state)),
                    _ => {
                        q.rq.push_back(w.wr_id);
                        if q.rq.len() > q.rq_depth {
                            let (n, d) = (q.rq.len(), q.rq_depth);
                            f.faults.push(format!("receive queue of QP {qp} holds {n}, deeper than its {d}"));
                        }
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
                let Some((w, frees)) = f.cqs[*cq].wcs.pop_front() else { break };
                if let Some((q, epoch, seq)) = frees {
                    let qp = &mut f.qps[q];
                    if qp.epoch == epoch {
                        qp.freed = qp.freed.max(seq + 1);
                    }
                }
                out[n] = w;
                n += 1;
            }
            n
        }))
    }

    #[inline(never)]
    fn to_reset(qp: &usize, _port: &SimPort) -> nccl_net_rivet::error::Result<()> {
        fab(|f| f.qps[*qp].reset(QpState::Reset));
        Ok(())
    }

    #[inline(never)]
    fn to_err(qp: &usize, _port: &SimPort) -> std::result::Result<(), (i32, nccl_net_rivet::error::Error)> {
        fab(|f| {
            if f.err_busy > 0 {
                // A busy firmware: the change times out, and the queue pair is as it was.
                f.err_busy -= 1;
                f.err_refused += 1;
                return Err((libc::ETIMEDOUT, sim_err(format!("moving QP {qp} to ERR failed: Connection timed out"))));
            }
            if f.qps[*qp].state != QpState::Gone {
                f.fail_qp(*qp, IBV_WC_WR_FLUSH_ERR)
            }
            Ok(())
        })
    }

    #[inline(never)]
    fn reset_to_rtr(qp: &usize, _port: &SimPort, l: &Link) -> nccl_net_rivet::error::Result<()> {
        fab(|f| {
            let port = f.qps[*qp].port;
            let peer = f.qps[*qp].peer.map(|p| f.qps[p].qpn);
            if peer != Some(l.remote.qpn) {
                f.faults.push(format!("QP {qp} reconnected to QPN {:#x}; its peer is {peer:?}", l.remote.qpn));
            }
            if !f.ports[port].up {
                return Err(sim_err(format!("modify QP {qp} to RTR: its port is down")));
            }
            f.qps[*qp].reset(QpState::Rtr);
            Ok(())
        })
    }

    #[inline(never)]
    fn back_to_rts(qp: &usize, _port: &SimPort, _l: &Link) -> nccl_net_rivet::error::Result<()> {
        fab(|f| {
            let port = f.qps[*qp].port;
            if !f.ports[port].up || f.qps[*qp].state != QpState::Rtr {
                return Err(sim_err(format!("modify QP {qp} to RTS: in state {:?}, port up {}", f.qps[*qp].state, f.ports[port].up)));
            }
            f.qps[*qp].state = QpState::Rts;
            f.recovered += 1;
            Ok(())
        })
    }

    #[inline(never)]
    fn flush_qp(port: &'static SimPort, cq: &usize) -> nccl_net_rivet::error::Result<usize> {
        Ok(fab(|f| f.new_qp(*cq, port.idx, conn::FLUSH_QP_SQ as usize, 0)))
    }

    #[inline(never)]
    fn now_ms() -> u64 {
        fab(|f| f.now_ms)
    }
}
