//! The receiving shell: turns completions (immediates), eager ring headers and the sizes FIFO the
//! sender writes into events for the [`RecvEngine`], and posts what it answers (clear-to-send
//! groups, credit words, flush reads) as work requests; copies eager payloads out of the ring.

use super::conn::{members_id, mr_for, post_chain, rdma_wr, slot_bytes, Common, Drain, SqBook, DRAIN_WAIT, KIND_CTRL, KIND_DRAIN, KIND_FLUSH, KIND_RECV, KIND_SHIFT, RING_SLOTS};
use super::nic::{Nic, NicPort, Verbs};
use super::res::{Part, QpRts};
use crate::error::{Error, Result};
use crate::proto::recv::{EagerStep, RecvEngine, RecvPlan, RecvSpec, FLUSH_REQS, RECV_REQS};
use crate::proto::verbs::{cts_stride, fifo_bytes, Cts, CtsKeys, EagerHdr, Imm, Notice, EAGER_HDR, FIFO_DEPTH, MAX_GROUP, MAX_QPS};
use super::fuse::{member_of, MAX_MEMBERS};

mod failover;
mod rq;

use failover::Rewrite;
pub use rq::post_recvs;
use rq::post_recvs_on;

/// Staging copies of CTS groups, used in turn by consecutive receives: a group's copy is read by
/// the NIC until its write completes (one entry goes inline and needs none for long), so a few
/// suffice, and a receive whose copy is still being read waits. Not one per FIFO slot: that was
/// 16 KiB pinned per connection for what is in flight for a round trip.
pub const CTS_STAGES: usize = 8;
/// Bytes of the CTS staging copies of a receiver of `members` members (a fused one's entries
/// carry its keys on each member).
pub const fn cts_stage_bytes(members: usize) -> usize {
    CTS_STAGES * MAX_GROUP * cts_stride(members)
}
use crate::proto::ProtoError;
use crate::sys::ib::*;
use crate::transport::{path_of, Conn, Lent, Path, RecvBuf, MAX_RECVS};
use super::eager::{self, EagerCopies};
use crate::gpu::staging::Copier;
use std::sync::atomic::{fence, Ordering};

// A GPU-bound eager copy is fenced by its ring slot's number.
const _: () = assert!(super::conn::RING_SLOTS <= crate::gpu::staging::FENCES);

/// The receiver's registered memory: pieces of two registrations, what the sender writes and
/// what only this side uses.
pub struct Parts {
    /// CTS entries staged for the RDMA write into the sender's FIFO.
    pub cts_out: Part,
    /// Sizes of rendezvous sends, written by the sender.
    pub sizes_in: Part,
    /// The eager ring the sender writes into.
    pub ring: Part,
    /// Where flush reads land; also the source of credit writes.
    pub scratch: Part,
}

pub struct VerbsRecv<N: Nic = Verbs> {
    /// Eager payloads on their way out of the ring (at close, a copier whose copies still run
    /// is left with the ring they read: `Drop`).
    copies: EagerCopies<N>,
    qps: Vec<N::Qp>,
    /// The loopback queue pair of flush reads, made at the first flush (NCCL flushes GPUDirect
    /// receives only; most comms never do).
    flush_qps: Vec<Option<N::Qp>>,
    /// One per member, in member order (each also holds its member's flush QP's completions).
    cqs: Vec<N::Cq>,
    /// Flush reads still to complete per flush request (one per member).
    flush_left: Box<[u8]>,
    cts_out: Part,
    sizes_in: Part,
    ring: Part,
    slot_bytes: usize,
    scratch: Part,
    rem_fifo_addr: u64,
    /// The sender's FIFO's key on each of its members.
    rem_fifo_rkeys: [u32; MAX_MEMBERS],
    /// Members of the sender (queue pair q writes to its member q % rem_members).
    rem_members: usize,
    /// Adaptive routing on this side's members: credit writes one at a time, the last's queue
    /// pair and place in its send queue in `credit_at`.
    ar: bool,
    credit_at: Option<(usize, u64)>,
    in_failover: bool,
    /// The last idle moment found nothing to do and nothing happened since (see `idle`).
    calm: bool,
    /// A failover's queue pairs draining (in ERR, their markers posted).
    draining: Option<Drain>,
    /// What a failover writes again once the sender has the account, in order, as the send
    /// queues have room (by the coarse ms in `rewrite_by`): each CTS entry of the incomplete
    /// receives alone, then the credit word.
    rewrites: std::collections::VecDeque<Rewrite>,
    rewrite_by: u64,
    /// When recovery was last looked at (coarse ms).
    recovery_checked: u64,
    /// Each receive's keys of its buffers on every member (a fused receiver's CTS entries carry
    /// them), to write its CTS group again after a failover.
    keys: Box<[[CtsKeys; MAX_GROUP]]>,
    /// Each receive's buffers (NCCL's, lent until it is done), where eager payloads are copied.
    lent: Box<[[Lent; MAX_GROUP]]>,
    eng: RecvEngine,
    /// Receives posted and not yet consumed, per QP, and how many each QP's queue holds.
    posted_recvs: [u32; MAX_QPS],
    rq: u32,
    /// What each send queue holds (CTS and credit writes).
    book: SqBook,
    /// Per staging copy, the QP and place of the last CTS group written from it without inline
    /// (the NIC reads the copy when it sends): the copy is not rewritten before that write is
    /// known complete.
    cts_reading: [Option<(u8, u64)>; CTS_STAGES],
    wrs: [ibv_send_wr; 1],
    sges: [ibv_sge; 1],
    pub c: Common<N>,
    /// What the parts are pieces of: dropped last, after the QPs; or, at a close while eager
    /// copies into GPU memory still run, left with their copier until they are done.
    mem: Option<[N::Mem; 2]>,
}

/// A closed comm's copier and memory its copies still read (the ring).
struct Left<N: Nic> {
    copier: N::Gpu,
    mem: Option<[N::Mem; 2]>,
}

// SAFETY: the comm is closed: nothing else reads or writes the memory through its pointers or
// uses the copier; both are only queried and released, under the list's lock.
unsafe impl<N: Nic> Send for Left<N> {}

impl<N: Nic> Left<N> {
    /// Whether the copies are done (one look); if so, the memory is freed.
    fn done(&mut self) -> bool {
        let done = self.copier.idle();
        if done {
            self.mem = None;
        }
        done
    }
}

impl<N: Nic> Drop for VerbsRecv<N> {
    fn drop(&mut self) {
        // NCCL's proxy thread never waits for a GPU, not at close either.
        if let Some(copier) = self.copies.running() {
            let mut left = Left::<N> { copier, mem: self.mem.take() };
            log::info!("NET/rivet: {}: closed while copies into GPU memory still run: its ring is freed once they are done", self.c.where_(0));
            eager::leave(Box::new(move || left.done()));
        }
        eager::reap();
    }
}

// SAFETY: the raw pointers inside (work requests, registered memory) are owned by this comm and
// only used under its lock; the NIC's objects are used from one thread at a time.
unsafe impl<N: Nic> Send for VerbsRecv<N> {}

impl<N: Nic> VerbsRecv<N> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        c: Common<N>,
        qps: Vec<N::Qp>,
        cqs: Vec<N::Cq>,
        mem: [N::Mem; 2],
        p: Parts,
        eager_max: usize,
        rem_fifo: (u64, [u32; MAX_MEMBERS]),
        rem_members: usize,
        nparts: usize,
    ) -> VerbsRecv<N> {
        let mut eng = RecvEngine::new(qps.len(), super::conn::RING_SLOTS, eager_max, c.set.origin);
        eng.set_parts(nparts);
        let depths = c.set.depths;
        VerbsRecv {
            copies: EagerCopies::default(),
            qps,
            flush_qps: (0..cqs.len()).map(|_| None).collect(),
            cqs,
            flush_left: vec![0; RECV_REQS + FLUSH_REQS].into_boxed_slice(),
            cts_out: p.cts_out,
            sizes_in: p.sizes_in,
            ring: p.ring,
            slot_bytes: slot_bytes(eager_max),
            scratch: p.scratch,
            rem_fifo_addr: rem_fifo.0,
            rem_fifo_rkeys: rem_fifo.1,
            rem_members,
            ar: c.adaptive_routing(),
            credit_at: None,
            in_failover: false,
            calm: false,
            draining: None,
            rewrites: std::collections::VecDeque::new(),
            rewrite_by: 0,
            recovery_checked: 0,
            keys: vec![[CtsKeys::default(); MAX_GROUP]; RECV_REQS].into_boxed_slice(),
            lent: (0..RECV_REQS).map(|_| [const { Lent::EMPTY }; MAX_GROUP]).collect(),
            eng,
            posted_recvs: [depths.recvs_posted(); MAX_QPS],
            rq: depths.recvs_posted(),
            book: SqBook::new(depths.recv_sq),
            cts_reading: [None; CTS_STAGES],
            // SAFETY: all-zero work requests and scatter entries are valid (null pointers, 0 sizes).
            wrs: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            sges: unsafe { std::mem::zeroed() },
            c,
            mem: Some(mem),
        }
    }

    /// Post one RDMA WRITE of our memory `[src, src+len)` (lkey) to the sender's FIFO memory, on
    /// queue pair `q` (physical: the caller maps a logical one).
    /// Returns whether it went inline (else the NIC reads the source later: the write is
    /// signaled, so that it is known complete soon).
    /// `lkeys` are the source's keys per member (a Part's): queue pair q uses our member
    /// q % members' and writes with the sender's member q % rem_members' key.
    /// `signal`: signaled even when inline (so that its completion is known).
    fn post_ctrl(&mut self, q: usize, src: u64, lkey_on: impl Fn(usize) -> u32, len: usize, remote: u64, signal: bool) -> Result<bool> {
        if self.gone(q) {
            // Failed: dropped, as its flush would; the failover writes it again on a live one.
            return Ok(true);
        }
        let lkey = lkey_on(member_of(q, self.c.ports.len()));
        let rkey = self.rem_fifo_rkeys[member_of(q, self.rem_members)];
        self.sges[0] = ibv_sge { addr: src, length: len as u32, lkey };
        self.wrs[0] = rdma_wr(IBV_WR_RDMA_WRITE, KIND_CTRL << KIND_SHIFT, remote, rkey, 1);
        let inline = len <= N::max_inline(&self.qps[q]) as usize;
        self.wrs[0].send_flags |= if inline { IBV_SEND_INLINE } else { IBV_SEND_SIGNALED };
        if signal {
            self.wrs[0].send_flags |= IBV_SEND_SIGNALED;
        }
        self.book.book(q, &mut self.wrs, 1);
        if let Err(rc) = post_chain::<N>(&self.qps[q], &mut self.wrs, &mut self.sges, 1) {
            return Err(self.c.post_failed(N::qpn(&self.qps[q]), "posting a control write", rc));
        }
        Ok(inline)
    }

    /// Report the eager copies that finished, in order, to the engine.
    fn retire_copies(&mut self) -> Result<()> {
        match self.copies.retire() {
            Ok(n) => {
                for _ in 0..n {
                    self.eng.copy_done();
                }
                Ok(())
            }
            Err(e) => Err(self.c.die(Error::system(format!("{}: eager message into GPU memory: {e}", self.c.where_(0))))),
        }
    }

    /// Match arrived eager slots, in order, as far as posted receives allow, and copy their
    /// payloads out. A credit that must go now is written; one that can wait is left for the next
    /// `irecv` or idle moment (`write_credit`): its write is a system call and, on Soft-RoCE, a
    /// packet's worth of the CPU's time, which the answer to the message just received would
    /// otherwise wait for.
    fn drain_ring(&mut self) -> Result<()> {
        self.calm = false;
        while let Some(slot) = self.eng.next_eager() {
            // SAFETY: `slot < RING_SLOTS`, inside the ring buffer (RING_SLOTS slots of slot_bytes).
            let p = unsafe { self.ring.ptr().add(slot * self.slot_bytes) };
            // SAFETY: the header is aligned in the slot; volatile because the NIC wrote it (its
            // immediate has been seen, so the write is complete).
            let h = unsafe { std::ptr::read_volatile(p as *const EagerHdr) };
            if let Some((req, len)) = self.eng.eager_straight(&h) {
                let dst = self.lent[req as usize][0].ptr();
                // SAFETY: as for a host copy below (`EagerCopies::copy`): the payload follows the
                // header in the slot, `len` bytes (at most eager_max, checked by the engine);
                // `dst` is the receive's host buffer, lent to this comm until it completes, of
                // at least `len` bytes. Nothing is copied out before it (the engine checked).
                unsafe { std::ptr::copy_nonoverlapping(p.add(EAGER_HDR), dst, len) };
                continue;
            }
            match self.eng.on_eager(h) {
                Err(e) => return Err(self.c.proto(e)),
                Ok(EagerStep::Wait) => break,
                Ok(EagerStep::Consumed) => {}
                Ok(EagerStep::Copy { req, entry, len, gpu }) => {
                    let dst = self.lent[req as usize][entry as usize].ptr();
                    // SAFETY: the payload follows the header in the slot (len <= eager_max, checked by
                    // the engine); the engine keeps the slot from the sender until `copy_done`.
                    let src = unsafe { p.add(EAGER_HDR) };
                    // SAFETY: `src` as above; `dst` is inside a posted receive buffer, lent to this
                    // comm until the receive completes (Lent's invariant), of at least `len` bytes
                    // (the engine checked the size against the buffer's), GPU memory when `gpu`
                    // (its registration's path is GDR).
                    match unsafe { self.copies.copy(slot, dst, src, len, gpu) } {
                        Ok(true) => self.eng.copy_done(),
                        Ok(false) => {}
                        Err(e) => return Err(self.c.die(Error::system(format!("{}: eager message into GPU memory: {e}", self.c.where_(0))))),
                    }
                }
            }
        }
        if !self.copies.is_empty() {
            self.retire_copies()?;
        }
        if !self.eng.credit_pressing() {
            return Ok(());
        }
        self.write_credit()
    }

    /// Write the credit word due, if one is and there is room for it.
    fn write_credit(&mut self) -> Result<()> {
        // A credit lets the sender fill ring slots again: each takes a posted receive.
        let q0 = self.c.qs.carrier(0);
        if !self.eng.credit_pending() || self.book.room(q0) == 0 || !self.recvs_cover(q0, 0)? {
            return Ok(()); // none due, or it stays due
        }
        // Adaptive routing may place two writes of one queue pair out of order, and the credit
        // word is one address written again and again: an older value placed last would stand.
        // So one credit write at a time: the next waits until the last is known complete.
        if self.credit_at.is_some_and(|(q, place)| !self.book.done(q, place)) {
            return Ok(());
        }
        if let Some(word) = self.eng.credit_due() {
            // The copies out of the released slots (loads) complete before the credit that lets
            // the sender overwrite them is written: Arm may otherwise let the later store (and the
            // doorbell, whose barrier orders stores only) pass those loads.
            fence(Ordering::SeqCst);
            self.post_credit(word)?;
        }
        Ok(())
    }

    /// Write the credit word into the sender's memory (logical queue pair 0's).
    fn post_credit(&mut self, word: u64) -> Result<()> {
        let w = self.scratch.ptr() as *mut u64;
        // SAFETY: the scratch buffer holds 64 bytes of our own memory; word 1 is the credit's.
        unsafe { w.add(1).write(word) };
        let scratch = self.scratch;
        let credit = self.rem_fifo_addr + fifo_bytes(self.c.ports.len()) as u64;
        let q0 = self.c.qs.carrier(0);
        self.post_ctrl(q0, scratch.addr() + 8, |m| scratch.lkey_on(m), 8, credit, self.ar)?;
        if self.ar && !self.gone(q0) {
            self.credit_at = Some((q0, self.book.last_place(q0)));
        }
        Ok(())
    }

    /// Whether queue pair `q` failed (or is being taken back: in RTR, it cannot send yet).
    fn gone(&self, q: usize) -> bool {
        self.c.qs.recv_gone() & (1 << q) != 0
    }

    /// Nothing moved: liveness, the device's events and the peer's notices, and a failover
    /// they call for. Of a calm comm (the last idle moment found nothing to do, and nothing
    /// happened since), only the count of idle calls, up to the liveness check it makes due.
    #[inline]
    fn idle(&mut self) -> Result<()> {
        let check = self.c.idle_tick();
        if self.calm && !check {
            return Ok(());
        }
        self.idle_work(check)
    }

    /// `idle` of a comm that is not calm, or whose liveness check is due (`check`).
    #[inline(never)]
    fn idle_work(&mut self, check: bool) -> Result<()> {
        self.calm = false;
        if self.eng.credit_pending() {
            self.write_credit()?;
        }
        // In batches of a quarter of the queue or more (see `progress`).
        let low = self.rq - self.rq / 4;
        self.top_up(low)?;
        if check {
            self.c.idle_check(self.eng.outstanding())?;
        }
        if self.c.failover_due() || self.c.qs.dead() != 0 {
            self.idle_failover()?;
        }
        // Calm: the next idle moments would find nothing of the above to do. Every other call
        // (a completion polled, a receive posted or taken, a flush, eager payloads moved) ends
        // it, so only this full look starts it again.
        self.calm = !self.eng.credit_pending()
            && self.copies.is_empty()
            && self.c.quiet()
            && self.c.qs.dead() == 0
            && self.c.qs.asked() == 0
            && self.posted_recvs[..self.qps.len()].iter().all(|&p| p > low);
        Ok(())
    }

    /// Whether receive `specs` may be posted now: room for its CTS and a credit write in every
    /// send queue, and, if it will have a CTS, its staging copy free and receives
    /// posted for its writes (after reaping completions and topping up receives if not).
    fn can_post(&mut self, specs: &[RecvSpec]) -> Result<bool> {
        let cts = specs.iter().any(|s| s.size > self.eng.eager_max() as u64);
        if self.room_for(cts, specs.len())? {
            return Ok(true);
        }
        self.progress()?;
        self.room_for(cts, specs.len())
    }

    /// `can_post` without reaping: room in every send queue, and for a receive with a CTS of
    /// `n` buffers its staging copy free and receives posted for its writes.
    fn room_for(&mut self, cts: bool, n: usize) -> Result<bool> {
        if self.c.failing() || !(0..self.qps.len()).all(|q| self.gone(q) || self.book.room(q) >= 2) {
            return Ok(false);
        }
        if !cts {
            return Ok(true);
        }
        if let Some((q, place)) = self.cts_reading[self.eng.next_cts_slot() % CTS_STAGES] {
            if !self.gone(q as usize) && !self.book.done(q as usize, place) {
                return Ok(false);
            }
        }
        for q in 0..self.qps.len() {
            if !self.gone(q) && !self.recvs_cover(q, n)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// `irecv` with room for `bufs`' specs and keys (a fused device's keys of each buffer on
    /// every member: the CTS entry carries them).
    #[inline(always)]
    fn irecv_into(&mut self, bufs: &mut [RecvBuf], specs: &mut [RecvSpec], keys: &mut [CtsKeys]) -> Result<Option<u32>> {
        self.calm = false;
        self.c.check()?;
        let n = bufs.len().min(specs.len());
        let dev = members_id(self.c.ports);
        let ln = self.c.ports.len();
        for ((s, k), b) in specs.iter_mut().zip(keys.iter_mut()).zip(&bufs[..n]) {
            let (addr, size) = (b.buf.addr(), b.buf.len());
            let rkeys = if size > 0 { mr_for(b.mr.as_ref(), addr, size, dev, ln, IBV_ACCESS_REMOTE_WRITE, "irecv")?.rkeys } else { [0; MAX_MEMBERS] };
            *k = CtsKeys(rkeys);
            *s = RecvSpec { addr: addr as u64, size: size as u64, rkey: rkeys[0], tag: b.tag, gpu: path_of(b.mr.as_ref()) == Path::Gdr };
        }
        if !self.can_post(&specs[..n])? {
            // The send queues are full, or a CTS now could bring more writes than receives are
            // posted: not yet.
            self.c.waits += 1;
            self.idle()?;
            return Ok(None);
        }
        let RecvPlan::Posted { req, cts } = self.eng.post(&specs[..n]) else { return Ok(None) };
        if let (Some(k), Some(l)) = (self.keys.get_mut(req as usize), self.lent.get_mut(req as usize)) {
            k[..n].copy_from_slice(&keys[..n]);
            for (l, b) in l.iter_mut().zip(&mut bufs[..n]) {
                *l = std::mem::take(&mut b.buf);
            }
        }
        if cts {
            let p = self.eng.cts_plan();
            let (slot, pq, pn) = (p.slot, p.q, p.n);
            // Each entry takes its stride: [keys on every member, if fused][the 32-byte entry].
            let stride = cts_stride(ln);
            let stage = slot % CTS_STAGES;
            let off = stage * MAX_GROUP * stride;
            for (i, e) in p.entries[..p.n].iter().enumerate() {
                // SAFETY: stage < CTS_STAGES and i < MAX_GROUP: inside the staging copies
                // (cts_stage_bytes(ln)), our own memory, 32-byte aligned (carve aligns to 64);
                // the NIC no longer reads this copy: the previous write from it went inline or is
                // known complete (`can_post` looked at `cts_reading`).
                unsafe {
                    let at = self.cts_out.ptr().add(off + i * stride);
                    if ln > 1 {
                        (at as *mut CtsKeys).write(keys[i]);
                    }
                    (at.add(stride - std::mem::size_of::<Cts>()) as *mut Cts).write(*e);
                }
            }
            let out = self.cts_out;
            let remote = self.rem_fifo_addr + (slot * MAX_GROUP * stride) as u64;
            let q = self.c.qs.carrier(pq);
            let inline = self.post_ctrl(q, out.addr() + off as u64, |m| out.lkey_on(m), pn * stride, remote, false)?;
            self.cts_reading[stage] = if inline { None } else { Some((q as u8, self.book.last_place(q))) };
        }
        // Eager messages that arrived before this receive, and the credit due.
        self.drain_ring()?;
        self.write_credit()?;
        Ok(Some(req as u32))
    }

    /// Reap completions and act on them; whether any came. Inline up to an empty poll of a
    /// quiet comm (every idle `test`), the rest out of line.
    #[inline]
    fn progress(&mut self) -> Result<bool> {
        let n = self.c.poll(&self.cqs)?;
        if n == 0 && self.c.quiet() {
            return Ok(false);
        }
        self.progress_polled(n)
    }

    /// `progress` of the `n` completions polled into `self.c.wc`.
    #[inline(never)]
    fn progress_polled(&mut self, n: usize) -> Result<bool> {
        self.calm = false;
        let ln = self.c.ports.len();
        for i in 0..n {
            let wc = self.c.wc[i];
            let m = self.c.wc_member[i] as usize;
            match wc.wr_id >> KIND_SHIFT {
                KIND_CTRL => self.book.retire(wc.wr_id),
                KIND_RECV => {
                    // QPNs are per device: the one of this member.
                    if let [qp] = &self.qps[..] {
                        // One queue pair (NCCL's default): its receive, unless a flush's.
                        if m == 0 && N::qpn(qp) == wc.qp_num {
                            self.posted_recvs[0] = self.posted_recvs[0].saturating_sub(1);
                        }
                    } else {
                        let mine = |(q, p): &(usize, &N::Qp)| member_of(*q, ln) == m && N::qpn(p) == wc.qp_num;
                        if let Some((q, _)) = self.qps.iter().enumerate().find(mine) {
                            self.posted_recvs[q] = self.posted_recvs[q].saturating_sub(1);
                        }
                    }
                    // SAFETY: a receive completion with immediate data (every write to us has one).
                    match Imm::decode(u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data })) {
                        Imm::Eager(_) => self.eng.on_eager_imm(),
                        Imm::Rdv { slot, entry, size: Some(size), .. } => {
                            // Only a connection of one queue pair sends its sizes this way.
                            let r = if self.eng.parts() == 1 { self.eng.on_rdv_imm(slot, entry, 0, size as u64) } else { Err(ProtoError::StrayImm { slot, entry }) };
                            if let Err(e) = r {
                                return Err(self.c.proto(e));
                            }
                        }
                        Imm::Rdv { slot, entry, part, size: None } => {
                            let (s, e) = (slot as usize, entry as usize);
                            let size = if s < FIFO_DEPTH && e < MAX_GROUP {
                                // SAFETY: inside the sizes FIFO (FIFO_DEPTH entries of MAX_GROUP
                                // words); the sender's size write came before the last immediate.
                                unsafe { std::ptr::read_volatile((self.sizes_in.ptr() as *const u64).add(s * MAX_GROUP + e)) }
                            } else {
                                0
                            };
                            if let Err(e) = self.eng.on_rdv_imm(slot, entry, part, size) {
                                return Err(self.c.proto(e));
                            }
                        }
                    }
                }
                KIND_FLUSH => {
                    if wc.status != IBV_WC_SUCCESS {
                        // Its member failed over (Common::poll): a new flush queue pair is made
                        // at the next flush, once the member is back.
                        self.flush_qps[m] = None;
                    }
                    // One read per member: the flush is done with the last.
                    let req = (wc.wr_id & 0xffff) as u16;
                    if let Some(left) = self.flush_left.get_mut(req as usize) {
                        *left = left.saturating_sub(1);
                        if *left == 0 {
                            self.eng.on_flush_done(req);
                        }
                    }
                }
                _ => {}
            }
        }
        self.c.check()?;
        if self.c.failover_due() {
            self.fail_over()?;
        }
        if n == 0 {
            return Ok(false);
        }
        // Topped up here only once half the queue is used (a stream that is never idle);
        // usually at an idle moment (`idle`), off the path of the message just found. The exact
        // need is checked before each CTS and credit write. (Nothing polled, nothing used.)
        self.top_up(self.rq / 2)?;
        self.drain_ring()?;
        Ok(true)
    }
}

impl<N: Nic> Conn for VerbsRecv<N> {
    fn irecv(&mut self, bufs: &mut [RecvBuf]) -> Result<Option<u32>> {
        // One buffer (most receives) without making the other seven's specs and keys.
        if let [_] = bufs {
            let (mut specs, mut keys) = ([RecvSpec::default(); 1], [CtsKeys::default(); 1]);
            return self.irecv_into(bufs, &mut specs, &mut keys);
        }
        let (mut specs, mut keys) = ([RecvSpec::default(); MAX_RECVS], [CtsKeys::default(); MAX_RECVS]);
        self.irecv_into(bufs, &mut specs, &mut keys)
    }

    fn iflush(&mut self, bufs: &mut [RecvBuf]) -> Result<Option<u32>> {
        self.calm = false;
        self.c.check()?;
        if self.c.set.flush_disable {
            return Ok(None);
        }
        let Some(b) = bufs.iter().rev().find(|b| !b.buf.is_empty()) else { return Ok(None) };
        let ln = self.c.ports.len();
        let m = mr_for(b.mr.as_ref(), b.buf.addr(), b.buf.len(), members_id(self.c.ports), ln, IBV_ACCESS_REMOTE_READ, "iflush")?;
        for k in 0..ln {
            if self.flush_qps[k].is_none() {
                let q = N::flush_qp(self.c.ports[k], &self.cqs[k]).map_err(|e| self.c.die(e))?;
                self.c.watch_qp(N::qpn(&q), k);
                log::debug!("NET/rivet: {}: flush queue pair made at the first flush", self.c.where_on(k, N::qpn(&q)));
                self.flush_qps[k] = Some(q);
            }
        }
        let req = self.eng.post_flush().map_err(|e| self.c.proto(e))?;
        // A read through every member: each member's writes into GPU memory are visible once a
        // read through it completes, and any member may have carried this buffer's data, even
        // one whose queue pairs failed over since (a cut link: the flush queue pair, a loopback
        // on the member's own port, still reads). Not a member whose port a PORT_ERR said is
        // down (its reads would fail; what it wrote before lands in the end): the events as
        // last read, no query of the device here.
        let live: u32 = (0..ln).filter(|&k| !self.c.ports[k].seen_down()).fold(0, |a, k| a | 1 << k);
        self.flush_left[req as usize] = live.count_ones() as u8;
        if live == 0 {
            self.eng.on_flush_done(req);
        }
        for k in 0..ln {
            if live & (1 << k) == 0 {
                continue;
            }
            let Some(flush_qp) = &self.flush_qps[k] else { return Ok(None) };
            self.sges[0] = ibv_sge { addr: self.scratch.addr(), length: 1, lkey: self.scratch.lkey_on(k) };
            self.wrs[0] = rdma_wr(IBV_WR_RDMA_READ, (KIND_FLUSH << KIND_SHIFT) | req as u64, b.buf.addr() as u64, m.rkey_on(k), 1);
            self.wrs[0].send_flags = IBV_SEND_SIGNALED;
            if let Err(rc) = post_chain::<N>(flush_qp, &mut self.wrs, &mut self.sges, 1) {
                let qpn = N::qpn(flush_qp);
                return Err(self.c.post_failed_on(k, qpn, "posting the flush read", rc));
            }
        }
        Ok(Some(req as u32))
    }

    #[inline(always)]
    fn test(&mut self, slot: u32, sizes: &mut [usize; MAX_RECVS]) -> Result<Option<usize>> {
        // The straight path of most calls: a calm comm (nothing copying, nothing due at an idle
        // moment: see `idle`) whose request still waits polls once, and when that finds nothing,
        // counts the idle call and returns.
        if self.calm && matches!(self.eng.waiting(slot), Ok(true)) {
            let n = match self.c.poll(&self.cqs) {
                Ok(n) => n,
                Err(e) => {
                    // The comm is dead: every later call goes the general way, and fails.
                    self.calm = false;
                    return Err(e);
                }
            };
            if n == 0 && !self.c.idle_tick() {
                return Ok(None);
            }
            return self.test_polled(slot, sizes, n);
        }
        self.test_general(slot, sizes)
    }

    fn capacity(&self) -> usize {
        RECV_REQS + FLUSH_REQS
    }

    fn net_events(&self, size: usize, out: &mut Vec<crate::transport::NetEvent>) {
        let ar_split = self.ar && size > self.c.set.ar_threshold;
        super::conn::plan_events::<N>(size, size <= self.eng.eager_max(), self.eng.parts(), &self.qps, self.c.qs.map(), self.c.ports.len(), ar_split, out);
    }
}

impl<N: Nic> VerbsRecv<N> {
    /// `test`'s straight path after its poll: `n` completions to act on, or none and the
    /// liveness check due.
    #[inline(never)]
    fn test_polled(&mut self, slot: u32, sizes: &mut [usize; MAX_RECVS], n: usize) -> Result<Option<usize>> {
        if n == 0 {
            self.idle_work(true)?;
            return Ok(None);
        }
        self.progress_polled(n)?;
        let done = self.eng.take(slot, sizes).map_err(|e| self.c.proto(e))?;
        // (`progress_polled` ended the calm.)
        Ok(done)
    }

    /// `test` of a comm that is not calm, or of a request that no longer waits.
    #[inline(never)]
    fn test_general(&mut self, slot: u32, sizes: &mut [usize; MAX_RECVS]) -> Result<Option<usize>> {
        let waiting = self.eng.waiting(slot).map_err(|e| self.c.proto(e))?;
        let mut moved = false;
        if waiting {
            let copying = !self.copies.is_empty();
            if copying {
                // Copies into GPU memory finish without a completion to wake the shell.
                self.drain_ring()?;
            }
            moved = self.progress()?;
            if !moved && !copying {
                // Nothing polled and nothing copied: the request still waits.
                self.idle()?;
                return Ok(None);
            }
        }
        if let Some(n) = self.eng.take(slot, sizes).map_err(|e| self.c.proto(e))? {
            // A receive taken may make a credit due.
            self.calm = false;
            return Ok(Some(n));
        }
        if !moved {
            self.idle()?;
        }
        Ok(None)
    }
}
