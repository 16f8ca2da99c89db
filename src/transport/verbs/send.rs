//! The sending shell: reads the clear-to-send FIFO and the credit word the receiver writes into
//! our memory, feeds them to the [`SendEngine`], and posts what it answers as work requests.

use super::conn::{members_id, mr_for, post_chain, rdma_wr, slot_bytes, Common, Drain, SqBook, DRAIN_WAIT, KIND_CTRL, KIND_DRAIN, KIND_SEND, KIND_SHIFT, PART_SHIFT, REQ_MASK};
use super::nic::{Nic, NicPort, Verbs};
use super::res::Part;
use crate::error::Result;
use crate::proto::send::{Close, RdvStep, Resend, RingSpec, SendEngine, SendPlan, SEND_REQS};
use crate::proto::verbs::{cts_stride, fifo_bytes, Cts, CtsKeys, EagerHdr, Imm, Notice, EAGER_DATA, EAGER_HDR, FIFO_DEPTH, MAX_GROUP, MAX_QPS};
use super::fuse::{member_of, MAX_MEMBERS};
use crate::sys::ib::*;
use crate::transport::{path_of, Conn, Lent, MrInfo, Path, MAX_RECVS};
use std::sync::atomic::{fence, AtomicU32, Ordering};

mod failover;

use failover::AfterDrain;

/// Sends between two reads of the CTS FIFO when every send goes eagerly.
const CTS_READ_EVERY: u32 = 4096;
/// The most work requests one post of a send makes on a queue pair: a rendezvous part's data
/// write and its size write.
const MAX_POST: u32 = 2;
/// Largest inline eager write (header and payload) whose bytes the sender keeps, on a comm that
/// can fail over, to write again if its queue pair fails before the receiver has it (the send
/// is complete once posted, so the application may have reused its buffer).
const INLINE_COPY: usize = 128;

/// Where the sender's eager messages go.
pub struct Ring {
    pub addr: u64,
    /// Its key on each of the receiver's members (eager writes go on queue pair 0: member 0).
    pub rkeys: [u32; MAX_MEMBERS],
    pub slots: usize,
    pub eager_max: usize,
}

/// The sender's registered memory: pieces of two registrations, what the receiver writes and
/// what only this side uses.
pub struct Parts {
    /// The CTS FIFO the receiver writes into, followed by the credit word.
    pub fifo: Part,
    /// Sizes of rendezvous sends, staged for the write into the receiver's sizes FIFO.
    pub sizes_out: Part,
    /// Eager headers, one per request slot, then the announcements'.
    pub hdrs: Part,
}

pub struct VerbsSend<N: Nic = Verbs> {
    // Field order is drop order: QPs before their CQ, and both before the memory they name.
    qps: Vec<N::Qp>,
    /// One per member, in member order.
    cqs: Vec<N::Cq>,
    fifo: Part,
    sizes_out: Part,
    hdrs: Part,
    /// What `fifo`, `sizes_out` and `hdrs` are pieces of.
    _mem: [N::Mem; 2],
    rem_sizes_addr: u64,
    /// The receiver's sizes FIFO's key on each of its members.
    rem_sizes_rkeys: [u32; MAX_MEMBERS],
    ring: Ring,
    /// Members of the receiver: CTS entries are `cts_stride(rem_members)` bytes, with a key
    /// per member when there are several.
    rem_members: usize,
    /// A fused receiver's keys of each CTS entry (slot × MAX_GROUP + entry), read with it.
    cts_rkeys: Box<[CtsKeys]>,
    eng: SendEngine,
    /// Each request slot's send: its buffer, NCCL's, lent to this comm until the send is done
    /// (a failover before then writes it again from here), its lkey on each member, and
    /// whether it is GPU memory.
    local: Box<[(Lent, [u32; MAX_MEMBERS], bool)]>,
    /// Bytes of each request slot's rendezvous send that can be read so far.
    ready: Box<[usize]>,
    /// Room one send needs on each queue pair (see `remapped`).
    need: [u32; MAX_QPS],
    in_failover: bool,
    /// A failover's queue pairs draining (in ERR, their markers posted), and what follows.
    draining: Option<(Drain, AfterDrain)>,
    /// Eager writes the receiver's account asks for again, in ring order (ring slot, header
    /// buffer, header, request slot), posted before anything new as the send queue has room, by
    /// the coarse ms in `resend_by`.
    resend_eager: std::collections::VecDeque<(usize, usize, EagerHdr, Option<u16>)>,
    resend_by: u64,
    /// Logical queue pairs wait to move back to a queue pair taken back (a part of theirs is
    /// half posted where they are).
    switching: bool,
    /// The queue pair each part of each request slot's rendezvous send was posted on (a logical
    /// queue pair may move between two of its parts' sends; a failover needs where each went).
    part_qp: Box<[[u8; MAX_QPS]]>,
    /// On a comm that can fail over: each ring slot's last inline eager write (its length, 0 for
    /// none, and bytes).
    inline_copy: Box<[(u8, [u8; INLINE_COPY])]>,
    /// Largest eager write (header and payload) that goes inline: what every queue pair takes
    /// (a failover may send it again on another), and what the copy holds.
    inline_room: usize,
    /// What each send queue holds.
    book: SqBook,
    /// Rendezvous sends whose newly ready bytes found a send queue full (request, bytes ready),
    /// oldest first: posted, in order, before anything else once there is room.
    deferred: Box<[(u16, usize)]>,
    ndeferred: usize,
    /// Sends since the CTS FIFO was last read.
    eager_run: u32,
    steps: [RdvStep; MAX_QPS],
    wrs: [ibv_send_wr; 3],
    sges: [ibv_sge; 3],
    pub c: Common<N>,
}

// SAFETY: the raw pointers inside (work requests, registered memory) are owned by this comm and
// only used under its lock; the NIC's objects are used from one thread at a time.
unsafe impl<N: Nic> Send for VerbsSend<N> {}

impl<N: Nic> VerbsSend<N> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        c: Common<N>,
        qps: Vec<N::Qp>,
        cqs: Vec<N::Cq>,
        mem: [N::Mem; 2],
        p: Parts,
        rem_sizes: (u64, [u32; MAX_MEMBERS]),
        ring: Ring,
        rem_members: usize,
        nparts: usize,
    ) -> VerbsSend<N> {
        let mut eng = SendEngine::new(qps.len(), RingSpec { slots: ring.slots, eager_max: ring.eager_max }, c.set.origin);
        eng.set_adaptive_routing(c.adaptive_routing().then_some(c.set.ar_threshold));
        eng.set_parts(nparts);
        let keyed = if rem_members > 1 { FIFO_DEPTH * MAX_GROUP } else { 0 };
        let copies = if c.failover { ring.slots } else { 0 };
        let inline_all = qps.iter().map(|q| N::max_inline(q) as usize).min().unwrap_or(0);
        VerbsSend {
            qps,
            cqs,
            fifo: p.fifo,
            sizes_out: p.sizes_out,
            hdrs: p.hdrs,
            _mem: mem,
            rem_sizes_addr: rem_sizes.0,
            rem_sizes_rkeys: rem_sizes.1,
            ring,
            rem_members,
            cts_rkeys: vec![CtsKeys::default(); keyed].into_boxed_slice(),
            eng,
            local: (0..SEND_REQS).map(|_| (Lent::EMPTY, [0; MAX_MEMBERS], false)).collect(),
            ready: vec![0; SEND_REQS].into_boxed_slice(),
            need: [MAX_POST; MAX_QPS],
            in_failover: false,
            draining: None,
            resend_eager: std::collections::VecDeque::new(),
            resend_by: 0,
            switching: false,
            part_qp: vec![[0; MAX_QPS]; SEND_REQS].into_boxed_slice(),
            inline_copy: vec![(0, [0; INLINE_COPY]); copies].into_boxed_slice(),
            inline_room: if copies > 0 { inline_all.min(INLINE_COPY) } else { inline_all },
            // One work request of each send queue is kept for a failover's drain marker.
            book: SqBook::new(c.set.depths.send_sq - 1),
            deferred: vec![(0, 0); SEND_REQS].into_boxed_slice(),
            ndeferred: 0,
            eager_run: 0,
            steps: [RdvStep { part: 0, q: 0, data: None, close: None }; MAX_QPS],
            // SAFETY: all-zero work requests and scatter entries are valid (null pointers, 0 sizes).
            wrs: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            sges: unsafe { std::mem::zeroed() },
            c,
        }
    }

    /// Where CTS entry `r` of slot `slot` is: the last 32 bytes of its stride (a fused
    /// receiver's keys come first).
    fn entry_ptr(&self, slot: usize, r: usize) -> *mut Cts {
        let stride = cts_stride(self.rem_members);
        // SAFETY: `slot < FIFO_DEPTH` and `r < MAX_GROUP` (the engine's and our bounds), inside the
        // fifo_bytes(rem_members) the FIFO buffer holds.
        unsafe { self.fifo.ptr().add((slot * MAX_GROUP + r) * stride + stride - std::mem::size_of::<Cts>()) as *mut Cts }
    }

    /// The stamp of a CTS entry, loaded alone with acquire: the entry's other fields are read
    /// after it. A 32-byte volatile read is several loads that Arm may reorder, so reading the
    /// stamp in the same read as the fields could pair a new stamp with the slot's old fields.
    fn stamp(&self, slot: usize, r: usize) -> u32 {
        let p = self.entry_ptr(slot, r);
        // SAFETY: the FIFO is registered memory that lives as long as the connection, the stamp is
        // an aligned u32 that only the NIC writes, and no Rust reference to it exists.
        unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*p).stamp)) }.load(Ordering::Acquire)
    }

    /// A CTS entry with the stamp loaded before its fields.
    fn entry(&self, slot: usize, r: usize) -> Cts {
        let stamp = self.stamp(slot, r);
        // SAFETY: as for `stamp`; a volatile read because the NIC writes the entry.
        let mut e = unsafe { std::ptr::read_volatile(self.entry_ptr(slot, r)) };
        e.stamp = stamp;
        e
    }

    /// Hand the engine the clear-to-send groups that have arrived, in order.
    fn read_cts(&mut self) -> Result<()> {
        while let Some((slot, want)) = self.eng.cts_wanted() {
            let mut g = [Cts::default(); MAX_GROUP];
            g[0] = self.entry(slot, 0);
            if (g[0].stamp.wrapping_sub(want) as i32) < 0 {
                break; // not written yet
            }
            let n = g[0].n().clamp(1, MAX_GROUP);
            for (r, e) in g.iter_mut().enumerate().take(n).skip(1) {
                *e = self.entry(slot, r);
            }
            // Every entry's own stamp, not only the first's: a group larger than a packet (8
            // entries of a fused receiver at MTU 256), or placed out of order under adaptive
            // routing, may show its first entry before its others.
            if g[1..n].iter().any(|e| e.stamp != g[0].stamp) {
                break;
            }
            fence(Ordering::Acquire);
            if self.rem_members > 1 {
                for r in 0..n {
                    // SAFETY: a fused receiver's keys block is the 32 bytes before the entry, in
                    // the same stride (and so the same write, placed before the stamp read above);
                    // volatile because the NIC writes it.
                    self.cts_rkeys[slot * MAX_GROUP + r] = unsafe { std::ptr::read_volatile((self.entry_ptr(slot, r) as *const CtsKeys).sub(1)) };
                }
            }
            match self.eng.on_cts(&g[..n]) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => return Err(self.c.proto(e)),
            }
        }
        Ok(())
    }

    /// The credit word the receiver writes after the FIFO (ring slots it released).
    fn read_credits(&mut self) {
        // SAFETY: the word is an aligned u64 of the registered FIFO buffer, written by the NIC.
        let w = unsafe { std::ptr::read_volatile(self.fifo.ptr().add(fifo_bytes(self.rem_members)) as *const u64) };
        self.eng.on_credit(w);
    }

    /// Post `k` work requests on queue pair `q`, unless it failed: then they are dropped, as
    /// its flush would, and the failover sends again whatever the receiver did not get.
    fn post(&mut self, q: usize, k: usize) -> Result<()> {
        if self.gone(q) {
            return Ok(());
        }
        self.book.book(q, &mut self.wrs, k);
        if let Err(rc) = post_chain::<N>(&self.qps[q], &mut self.wrs, &mut self.sges, k) {
            return Err(self.c.post_failed(N::qpn(&self.qps[q]), "ibv_post_send", rc));
        }
        Ok(())
    }

    /// One eager write into the receiver's ring: header (+ payload). Returns whether it went
    /// inline: the payload was copied at post time, nothing to wait for (if the write is
    /// signaled, to retire the ones before it, its id is a control one).
    /// `src`: the request whose buffer (`local`) is the payload (None: an announcement, a header
    /// alone); a payload in GPU memory (its `local` says) only the NIC may read (never inline).
    fn post_eager(&mut self, ring_slot: usize, hdr_slot: usize, h: EagerHdr, src: Option<u16>, wr_id: u64) -> Result<bool> {
        let on_gpu = src.is_some_and(|r| self.local[r as usize].2);
        let size = if h.flags & EAGER_DATA != 0 { h.size as usize } else { 0 };
        let split = self.eng.ar_split(EAGER_HDR + size);
        let inline = !split && !on_gpu && EAGER_HDR + size <= self.inline_room;
        if inline && self.book.signals_next(self.c.qs.carrier(0)) {
            // This one will be signaled: reap the completions before it first. Nothing else
            // polls a stream of inline sends (each is done once posted), and their send queue
            // slots come back only when a completion after them is polled. Before the work
            // request is built, and with no failover meanwhile (the engine has this message in
            // its ring already: a failover now would send it, and then this would again).
            let held = std::mem::replace(&mut self.in_failover, true);
            let r = self.progress();
            self.in_failover = held;
            r?;
        }
        // SAFETY: `hdr_slot < SEND_REQS + RTS_HDRS`, the header buffers HDRS_BYTES holds.
        let hp = unsafe { self.hdrs.ptr().add(hdr_slot * EAGER_HDR) as *mut EagerHdr };
        // SAFETY: our own registered memory, aligned for the header, not in flight (its request
        // slot, or the announcement's, is ours until its write completes).
        unsafe { hp.write(h) };
        // Logical queue pair 0 (queue pair 0 until it fails): our member lm to the receiver's rm.
        let q = self.c.qs.carrier(0);
        let (lm, rm) = (member_of(q, self.c.ports.len()), member_of(q, self.rem_members));
        self.c.member_bytes[lm] += size as u64;
        self.sges[0] = ibv_sge { addr: hp as u64, length: EAGER_HDR as u32, lkey: self.hdrs.lkey_on(lm) };
        let (data, lkeys) = match src {
            Some(r) => (self.local[r as usize].0.ptr(), self.local[r as usize].1),
            None => (std::ptr::null_mut(), [0; MAX_MEMBERS]),
        };
        self.sges[1] = ibv_sge { addr: data as u64, length: size as u32, lkey: lkeys[lm] };
        let remote = self.ring.addr + (ring_slot * slot_bytes(self.ring.eager_max)) as u64;
        let imm = Imm::Eager(ring_slot as u32).encode().to_be();
        let rkey = self.ring.rkeys[rm];
        if split {
            // Adaptive routing, above its threshold: the header and payload as a plain write,
            // then the immediate alone (a zero-byte send), completed only once the write landed.
            self.wrs[0] = rdma_wr(IBV_WR_RDMA_WRITE, wr_id, remote, rkey, if size > 0 { 2 } else { 1 });
            self.wrs[1] = rdma_wr(IBV_WR_SEND_WITH_IMM, wr_id, 0, 0, 0);
            self.wrs[1].__bindgen_anon_1.imm_data = imm;
            self.wrs[1].send_flags = IBV_SEND_SIGNALED;
            if !self.inline_copy.is_empty() {
                self.inline_copy[ring_slot].0 = 0;
            }
            // post_chain points wrs[0] at sges[0..2] (its num_sge) and wrs[1] at none.
            self.post(q, 2)?;
            return Ok(false);
        }
        self.wrs[0] = rdma_wr(IBV_WR_RDMA_WRITE_WITH_IMM, wr_id, remote, rkey, if size > 0 { 2 } else { 1 });
        self.wrs[0].__bindgen_anon_1.imm_data = imm;
        if !inline && !self.inline_copy.is_empty() {
            self.inline_copy[ring_slot].0 = 0;
        }
        if inline && !self.inline_copy.is_empty() {
            // Kept until the ring slot is written again: the send is done once posted.
            let c = &mut self.inline_copy[ring_slot];
            c.0 = (EAGER_HDR + size) as u8;
            // SAFETY: the header is our own memory (just written); the payload is `size` bytes of
            // host memory lent for this send (inline: not GPU memory), and the copy has room for
            // both (EAGER_HDR + size <= INLINE_COPY).
            unsafe {
                std::ptr::copy_nonoverlapping(hp as *const u8, c.1.as_mut_ptr(), EAGER_HDR);
                std::ptr::copy_nonoverlapping(data, c.1.as_mut_ptr().add(EAGER_HDR), size);
            }
        }
        // Not inline: signaled, its request waits for it. Inline: the book signals one in
        // SIGNAL_EVERY, which retires the ones before it.
        self.wrs[0].send_flags = if inline { IBV_SEND_INLINE } else { IBV_SEND_SIGNALED };
        self.post(q, 1)?;
        Ok(inline)
    }

    /// Whether queue pair `q` failed (its posts are dropped, as its flush would).
    fn gone(&self, q: usize) -> bool {
        self.c.qs.down() & (1 << q) != 0
    }

    /// Post what is newly ready (the first `ready` bytes) of rendezvous send `req`, as the
    /// engine's steps say: per QP, one RDMA WRITE of its part's new bytes, and once the part is
    /// complete the signaled write that carries the immediate (QP 0: the size word's, unless the
    /// immediate carries the size: then the data write's).
    fn post_rdv(&mut self, req: u16, ready: usize) -> Result<()> {
        let k = self.eng.rdv_steps(req, ready, &mut self.steps);
        let t = self.eng.target(req);
        let (data, lkeys, on_gpu) = {
            let (buf, lkeys, on_gpu) = &self.local[req as usize];
            (buf.addr() as u64, *lkeys, *on_gpu)
        };
        let wr_id = (KIND_SEND << KIND_SHIFT) | req as u64;
        let (ln, rn) = (self.c.ports.len(), self.rem_members);
        for i in 0..k {
            let s = self.steps[i];
            // Part s.part goes on logical queue pair s.q, which runs on queue pair q (itself,
            // until it fails): our member q % ln (its lkey) to the receiver's q % rn (its rkey).
            let q = self.c.qs.carrier(s.q);
            self.part_qp[req as usize][s.part] = q as u8;
            let (lm, rm) = (member_of(q, ln), member_of(q, rn));
            let mut n = 0;
            if let Some((off, len)) = s.data {
                let rkey = if rn > 1 { self.cts_rkeys[t.sizes_off as usize / 8].0[rm] } else { t.rkey };
                // Not a part posted to a queue pair found failed (dropped: the failover sends it
                // again), as a comm's first send can be onto a member down at setup.
                if !self.gone(q) {
                    self.c.member_bytes[lm] += len as u64;
                }
                self.sges[0] = ibv_sge { addr: data + off as u64, length: len as u32, lkey: lkeys[lm] };
                self.wrs[0] = rdma_wr(IBV_WR_RDMA_WRITE, wr_id, t.addr + off as u64, rkey, 1);
                if !on_gpu && len <= N::max_inline(&self.qps[q]) as usize {
                    // A small host payload goes in the work request (GPU memory only the NIC
                    // may read).
                    self.wrs[0].send_flags |= IBV_SEND_INLINE;
                }
                n = 1;
            }
            match s.close {
                None => {}
                Some(Close::Size) => {
                    self.sges[n] = ibv_sge { addr: self.sizes_out.addr() + t.sizes_off, length: 8, lkey: self.sizes_out.lkey_on(lm) };
                    self.wrs[n] = rdma_wr(IBV_WR_RDMA_WRITE_WITH_IMM, wr_id, self.rem_sizes_addr + t.sizes_off, self.rem_sizes_rkeys[rm], 1);
                    self.wrs[n].send_flags |= IBV_SEND_INLINE;
                    n += 1;
                }
                Some(Close::OnData) => self.wrs[n - 1].opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                Some(Close::Empty) => {
                    // After this step's data write, if any (adaptive routing: the immediate
                    // alone, completed only once the write before it has landed).
                    self.wrs[n] = rdma_wr(IBV_WR_SEND_WITH_IMM, wr_id, 0, 0, 0);
                    n += 1;
                }
            }
            if s.close.is_some() {
                // The completion names the part, which counts once however often it is posted.
                self.wrs[n - 1].wr_id = wr_id | (s.part as u64) << PART_SHIFT;
                self.wrs[n - 1].__bindgen_anon_1.imm_data = t.imm_of(s.part).to_be();
                self.wrs[n - 1].send_flags |= IBV_SEND_SIGNALED;
            }
            self.post(q, n)?;
        }
        Ok(())
    }

    fn progress(&mut self) -> Result<bool> {
        let n = self.c.poll(&self.cqs)?;
        for i in 0..n {
            let wc = self.c.wc[i];
            match wc.wr_id >> KIND_SHIFT {
                KIND_SEND => {
                    self.book.retire(wc.wr_id);
                    self.eng.on_completion((wc.wr_id & REQ_MASK) as u16, ((wc.wr_id >> PART_SHIFT) & 0xf) as usize);
                }
                KIND_CTRL => self.book.retire(wc.wr_id),
                _ => {}
            }
        }
        self.c.check()?;
        if self.c.failover_due() {
            self.fail_over()?;
        }
        if self.switching {
            self.switch_back();
        }
        if self.ndeferred > 0 {
            self.post_deferred()?;
        }
        Ok(n > 0)
    }

    /// Nothing moved: liveness, the device's events and the peer's notices, and a failover
    /// they call for.
    fn idle(&mut self) -> Result<()> {
        self.c.idle(self.eng.outstanding())?;
        if self.c.failover_due() {
            self.fail_over()?;
        }
        Ok(())
    }

    /// Whether every send queue in use has room for the largest post.
    fn room(&self) -> bool {
        (0..self.qps.len()).all(|q| self.gone(q) || self.book.room(q) >= self.need[q])
    }

    /// The map moved: how many work requests one send may post on each queue pair now (the
    /// largest post for each logical queue pair it carries: after a failover one carries
    /// several, and a send's parts on them all go to it).
    /// Never more than a send queue is sure to have once its signaled work requests are
    /// reaped (`SqBook::most_room`), or no send would ever be posted: with the minimal queues
    /// of RIVET_IB_MIN_QUEUES=1 and three logical queue pairs on one, a send may then find too
    /// little room for its last part and fail its comm (an error, not a hang).
    fn remapped(&mut self) {
        let nq = self.qps.len();
        self.need = [MAX_POST; MAX_QPS];
        let most = self.book.most_room();
        for q in 0..nq {
            let carried = self.c.qs.carried(q) as u32;
            self.need[q] = (MAX_POST * carried.max(1)).min(most);
        }
    }

    /// Post the deferred rendezvous bytes, oldest first, as far as the send queues have room
    /// (after the eager writes a failover makes again).
    fn post_deferred(&mut self) -> Result<()> {
        if !self.resend_eager.is_empty() {
            return Ok(());
        }
        let mut done = 0;
        while done < self.ndeferred && self.room() {
            let (req, ready) = self.deferred[done];
            self.post_rdv(req, ready)?;
            done += 1;
        }
        self.deferred.copy_within(done..self.ndeferred, 0);
        self.ndeferred -= done;
        Ok(())
    }

    /// Whether a new send may be posted now: nothing deferred, no failover under way, and room
    /// in every send queue (after reaping completions if there is not).
    fn can_post(&mut self) -> Result<bool> {
        if self.ndeferred == 0 && !self.c.failing() && self.room() {
            return Ok(true);
        }
        self.progress()?;
        Ok(self.ndeferred == 0 && !self.c.failing() && self.room())
    }

    fn back_pressure(&mut self) -> Result<Option<u32>> {
        if !self.progress()? {
            self.idle()?;
        }
        Ok(None)
    }
}

impl<N: Nic> Conn for VerbsSend<N> {
    fn isend(&mut self, data: Lent, tag: i32, mr: Option<&MrInfo>) -> Result<Option<u32>> {
        let len = data.len();
        self.isend_partial(data, tag, mr, len)
    }

    /// A partial send goes eagerly only once all of it is ready (eager messages are small); by
    /// rendezvous, its writes are posted as far as it is ready, the rest by `set_ready`.
    fn isend_partial(&mut self, data: Lent, tag: i32, mr: Option<&MrInfo>, ready: usize) -> Result<Option<u32>> {
        self.c.check()?;
        let size = data.len();
        let lkeys = if size > 0 { mr_for(mr, data.addr(), size, members_id(self.c.ports), self.c.ports.len(), 0, "isend")?.lkeys } else { [0; MAX_MEMBERS] };
        if !self.can_post()? {
            // The send queues are full of work requests not yet known complete: not yet.
            self.c.waits += 1;
            self.idle()?;
            return Ok(None);
        }
        self.read_credits();
        self.eager_run += 1;
        if size > self.eng.eager_max() || self.eager_run >= CTS_READ_EVERY {
            // Also during a long run of eager sends: a receiver whose buffers are above the eager
            // limit writes a CTS entry per receive, and the 32-bit stamps compare correctly only
            // while the sender reads within 2^31 entries of it.
            self.eager_run = 0;
            self.read_cts()?;
        }
        match self.eng.post(size, tag, ready) {
            Err(e) => Err(self.c.proto(e)),
            Ok(SendPlan::Busy) => self.back_pressure(),
            Ok(SendPlan::Announce { ring_slot, hdr_slot, hdr }) => {
                self.post_eager(ring_slot, hdr_slot, hdr, None, KIND_CTRL << KIND_SHIFT)?;
                self.back_pressure()
            }
            Ok(SendPlan::Eager { req, ring_slot, hdr }) => {
                let wr_id = (KIND_SEND << KIND_SHIFT) | req as u64;
                // Lent until its completion: a failover before then writes it again from here.
                self.local[req as usize] = (data, lkeys, path_of(mr) == Path::Gdr);
                if self.post_eager(ring_slot, req as usize, hdr, Some(req), wr_id)? {
                    // An inline send is complete once posted: its bytes are in the work request.
                    self.eng.on_completion(req, 0);
                }
                Ok(Some(req as u32))
            }
            Ok(SendPlan::Rdv { req, target }) => {
                // SAFETY: `sizes_off` is inside the SIZES_ENTRY-per-slot buffer (slot < FIFO_DEPTH,
                // entry < MAX_GROUP), an aligned u64 of our own memory.
                unsafe { (self.sizes_out.ptr().add(target.sizes_off as usize) as *mut u64).write(size as u64) };
                self.local[req as usize] = (data, lkeys, path_of(mr) == Path::Gdr);
                self.ready[req as usize] = ready;
                self.post_rdv(req, ready)?;
                Ok(Some(req as u32))
            }
        }
    }

    fn set_ready(&mut self, slot: u32, ready: usize) -> Result<()> {
        self.c.check()?;
        let req = slot as u16;
        if slot < SEND_REQS as u32 && self.eng.rdv_open(req) {
            self.ready[req as usize] = self.ready[req as usize].max(ready);
            if let Some(d) = self.deferred[..self.ndeferred].iter_mut().find(|d| d.0 == req) {
                d.1 = d.1.max(ready);
                self.progress()?;
            } else if !self.eng.rdv_has_new(req, ready) {
                // The mark has not moved (the staging engine calls on every test).
            } else if self.can_post()? {
                self.post_rdv(req, ready)?;
            } else {
                // Posted by `progress` once the send queues have room, in order.
                self.c.waits += 1;
                self.deferred[self.ndeferred] = (req, ready);
                self.ndeferred += 1;
            }
        }
        Ok(())
    }

    fn test(&mut self, slot: u32, sizes: &mut [usize; MAX_RECVS]) -> Result<Option<usize>> {
        let waiting = self.eng.waiting(slot).map_err(|e| self.c.proto(e))?;
        let moved = waiting && self.progress()?;
        if let Some(size) = self.eng.take(slot).map_err(|e| self.c.proto(e))? {
            sizes[0] = size;
            return Ok(Some(1));
        }
        if !moved {
            self.idle()?;
        }
        Ok(None)
    }

    fn capacity(&self) -> usize {
        SEND_REQS
    }

    fn net_events(&self, size: usize, out: &mut Vec<crate::transport::NetEvent>) {
        let ar_split = self.eng.ar_split(size);
        super::conn::plan_events::<N>(size, size <= self.eng.eager_max(), self.eng.parts(), &self.qps, self.c.qs.map(), self.c.ports.len(), ar_split, out);
    }

    #[inline]
    fn has_deferred(&self) -> bool {
        self.ndeferred > 0
    }

    fn progress_deferred(&mut self) -> Result<()> {
        if self.ndeferred > 0 {
            self.progress()?;
        }
        Ok(())
    }
}
