//! The receiving half of the verbs protocol, as a state machine without I/O.
//!
//! Events: a receive posted, an eager immediate (a ring slot filled), a rendezvous immediate
//! (one queue pair's part of a large send landed, with its size: from the immediate, or the size
//! word the transport read), the
//! header of the next arrived ring slot, a copy out of the ring finished, a flush finished.
//! Answers: write this clear-to-send group into the sender's FIFO, copy this payload out of that
//! ring slot, write this credit word, complete this request, report a mismatch.

use super::verbs::{seq_offset, Cts, EagerHdr, Resync, ResyncRecv, EAGER_DATA, EAGER_URGENT, FIFO_DEPTH, MAX_GROUP};
use super::ProtoError;
use std::collections::VecDeque;

/// Receive request slots per connection (NCCL keeps at most 32 in flight per comm).
pub const RECV_REQS: usize = crate::proto::NCCL_INFLIGHT;
/// Flush request slots, after the receive ones.
pub const FLUSH_REQS: usize = 32;

/// One buffer of a receive, as the protocol sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecvSpec {
    pub addr: u64,
    pub size: u64,
    pub rkey: u32,
    pub tag: i32,
    /// GPU memory: an eager payload reaches it by a CUDA copy instead of a memcpy.
    pub gpu: bool,
}

/// A clear-to-send group to RDMA-write into the sender's FIFO slot `slot`, on queue pair `q`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CtsPlan {
    pub slot: usize,
    pub q: usize,
    pub n: usize,
    pub entries: [Cts; MAX_GROUP],
}

/// Small, so that it returns in registers: the group a receive with a CTS writes (256 bytes of
/// entries) stays in the engine, for [`RecvEngine::cts_plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvPlan {
    /// No request slot free: NCCL gets a NULL request and retries.
    Busy,
    /// Posted as request `req`; with `cts` (the receive has a buffer above the eager limit),
    /// write [`RecvEngine::cts_plan`]'s group first.
    Posted { req: u16, cts: bool },
}

/// What to do with the next arrived eager ring slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EagerStep {
    /// Its receive is not posted yet: keep it, and every slot after it.
    Wait,
    /// Consumed without a copy (an announcement, or an empty message).
    Consumed,
    /// Copy `len` payload bytes out of the slot into buffer `entry` of receive `req` (GPU
    /// memory when `gpu`), then call [`RecvEngine::copy_done`]; the slot is not released to the
    /// sender before that. The engine names the buffer; the transport holds it (a receive's
    /// buffers stay the transport's, lent, until it is done).
    Copy { req: u16, entry: u8, len: usize, gpu: bool },
}

#[derive(Clone, Copy, Default)]
struct Entry {
    spec: RecvSpec,
    done: bool,
    /// Matched by a send (eager data, or a rendezvous whose parts are arriving).
    taken: bool,
    got: u64,
    /// Rendezvous parts arrived: bit q is the part of logical queue pair q.
    parts: u16,
}

#[derive(Clone, Copy, Default)]
struct RecvReq {
    posted: bool,
    flush: bool,
    /// Its buffers were offered to the sender by a CTS group (rendezvous writes may come).
    cts: bool,
    n: u8,
    /// Buffers not yet filled.
    left: u8,
    /// Sequence number of this receive's first send.
    base: u32,
    /// Its clear-to-send index, if `cts`.
    cts_index: u64,
    entries: [Entry; MAX_GROUP],
}

/// An eager payload being copied out of its ring slot.
#[derive(Clone, Copy)]
struct Copying {
    ring_index: u64,
    req: u16,
    entry: u8,
}

pub struct RecvEngine {
    nqps: usize,
    /// Parts each rendezvous message arrives in (the sender's, from its metadata).
    nparts: usize,
    ring_slots: usize,
    eager_max: usize,
    /// Sequence number of the next receive's first send.
    next_base: u32,
    /// Clear-to-send entries written so far.
    cts_tail: u64,
    /// The CTS group of the last receive posted with one.
    plan: CtsPlan,
    /// The receive each FIFO slot's group belongs to.
    cts_owner: Box<[u16]>,
    /// Eager slots arrived (in order), matched, and released to the sender.
    ring_arrived: u64,
    ring_done: u64,
    credits_sent: u64,
    credit_urgent: bool,
    copying: VecDeque<Copying>,
    /// Receives posted and not yet reported done, oldest first.
    order: VecDeque<u16>,
    reqs: Box<[RecvReq]>,
    free: Vec<u16>,
    free_flush: Vec<u16>,
    /// Rendezvous parts that arrived a second time (ignored; a failover that resent what had
    /// arrived would show here).
    pub dup_parts: u64,
}

impl RecvEngine {
    /// Count `n` parts per rendezvous message (the sender's split, at most one per queue pair).
    pub fn set_parts(&mut self, n: usize) {
        self.nparts = n.clamp(1, self.nqps);
    }

    pub fn parts(&self) -> usize {
        self.nparts
    }

    /// `origin`: the sequence number and clear-to-send index the sender starts from.
    pub fn new(nqps: usize, ring_slots: usize, eager_max: usize, origin: super::send::Origin) -> RecvEngine {
        let mut free = Vec::with_capacity(RECV_REQS);
        free.extend((0..RECV_REQS as u16).rev());
        let mut free_flush = Vec::with_capacity(FLUSH_REQS);
        free_flush.extend((RECV_REQS as u16..(RECV_REQS + FLUSH_REQS) as u16).rev());
        RecvEngine {
            nqps: nqps.max(1),
            nparts: nqps.max(1),
            ring_slots: ring_slots.max(1),
            eager_max,
            next_base: origin.seq,
            cts_tail: origin.cts,
            plan: CtsPlan::default(),
            cts_owner: vec![0u16; FIFO_DEPTH].into_boxed_slice(),
            ring_arrived: 0,
            ring_done: 0,
            credits_sent: 0,
            credit_urgent: false,
            copying: VecDeque::with_capacity(ring_slots.max(1)),
            order: VecDeque::with_capacity(RECV_REQS),
            reqs: vec![RecvReq::default(); RECV_REQS + FLUSH_REQS].into_boxed_slice(),
            free,
            free_flush,
            dup_parts: 0,
        }
    }

    pub fn eager_max(&self) -> usize {
        self.eager_max
    }

    /// Requests (receives and flushes) posted and not yet reported done.
    pub fn outstanding(&self) -> usize {
        RECV_REQS + FLUSH_REQS - self.free.len() - self.free_flush.len()
    }

    /// Post a receive of 1..=MAX_GROUP buffers. Eager messages that arrived before it are matched
    /// by the next [`next_eager`](Self::next_eager) loop.
    pub fn post(&mut self, bufs: &[RecvSpec]) -> RecvPlan {
        let n = bufs.len().clamp(1, MAX_GROUP);
        let Some(req) = self.free.pop() else { return RecvPlan::Busy };
        let base = self.next_base;
        let cts_index = self.cts_tail;
        let cts = bufs.iter().any(|b| b.size > self.eager_max as u64);
        if cts {
            let slot = (self.cts_tail % FIFO_DEPTH as u64) as usize;
            let stamp = (self.cts_tail + 1) as u32;
            let p = &mut self.plan;
            (p.slot, p.q, p.n) = (slot, (self.cts_tail % self.nqps as u64) as usize, n);
            for (o, b) in p.entries.iter_mut().zip(bufs).take(n) {
                *o = Cts::new(b.addr, b.size, b.rkey, b.tag, n, base, stamp);
            }
            self.cts_owner[slot] = req;
            self.cts_tail += 1;
        }
        // In place, and only its `n` entries: the rest of the slot is never read (every look at a
        // receive's entries stops at its `n`).
        let r = &mut self.reqs[req as usize];
        (r.posted, r.flush, r.cts, r.n, r.left, r.base, r.cts_index) = (true, false, cts, n as u8, n as u8, base, cts_index);
        for (e, b) in r.entries.iter_mut().zip(bufs).take(n) {
            *e = Entry { spec: *b, ..Entry::default() };
        }
        if bufs.is_empty() {
            r.entries[0] = Entry::default();
        }
        self.next_base = base.wrapping_add(n as u32);
        self.order.push_back(req);
        RecvPlan::Posted { req, cts }
    }

    /// The CTS group of the last receive [`post`](Self::post) answered with `cts`.
    pub fn cts_plan(&self) -> &CtsPlan {
        &self.plan
    }

    /// The FIFO slot the next receive's CTS group will be written from (and to).
    pub fn next_cts_slot(&self) -> usize {
        (self.cts_tail % FIFO_DEPTH as u64) as usize
    }

    /// At most how many rendezvous writes with an immediate may still arrive on each queue pair:
    /// one per buffer of each incomplete receive that has a CTS out (its buffers filled by eager
    /// messages counted too, until the whole receive is complete).
    pub fn rdv_owed(&self) -> usize {
        self.order.iter().map(|&r| &self.reqs[r as usize]).filter(|r| r.cts && r.left > 0).map(|r| r.n as usize).sum()
    }

    /// A flush (a 1-byte RDMA READ on the loopback queue pair); `on_flush_done` ends it.
    pub fn post_flush(&mut self) -> Result<u16, ProtoError> {
        let req = self.free_flush.pop().ok_or(ProtoError::TooManyFlushes { max: FLUSH_REQS })?;
        self.reqs[req as usize] = RecvReq { posted: true, flush: true, n: 0, left: 1, ..Default::default() };
        Ok(req)
    }

    /// A flush's read completed.
    pub fn on_flush_done(&mut self, req: u16) {
        if let Some(r) = self.reqs.get_mut(req as usize).filter(|r| r.flush) {
            r.left = 0;
        }
    }

    /// A completion with the eager immediate: the next ring slot (in order) has arrived.
    pub fn on_eager_imm(&mut self) {
        self.ring_arrived += 1;
    }

    /// A completion with a rendezvous immediate: part `part` (logical queue pair) of the send into
    /// buffer `entry` of FIFO slot `slot`'s receive landed. `size` is the send's size from the
    /// immediate (a connection of one queue pair, a send below IMM_SIZE_LIMIT), or else the sizes
    /// FIFO word for that buffer as read now (valid once every part has arrived: queue pair 0
    /// writes it before its immediate).
    pub fn on_rdv_imm(&mut self, slot: u32, entry: u32, part: u32, size: u64) -> Result<(), ProtoError> {
        // The sender names the FIFO slot itself (below FIFO_DEPTH); anything above is corrupt,
        // not another name for a slot in use.
        let Some(&owner) = self.cts_owner.get(slot as usize) else {
            return Err(ProtoError::StrayImm { slot, entry });
        };
        let owner = owner as usize;
        let r = &mut self.reqs[owner];
        let e = entry as usize;
        if !r.posted || r.flush || e >= r.n as usize || r.entries[e].done || part as usize >= self.nparts {
            return Err(ProtoError::StrayImm { slot, entry });
        }
        let en = &mut r.entries[e];
        en.taken = true;
        if en.parts & (1 << part) != 0 {
            self.dup_parts += 1;
            return Ok(());
        }
        en.parts |= 1 << part;
        if en.parts.count_ones() as usize == self.nparts {
            if size > en.spec.size {
                return Err(ProtoError::CorruptSize { size, recv: en.spec.size });
            }
            en.got = size;
            en.done = true;
            r.left -= 1;
        }
        Ok(())
    }

    /// What arrived, for the sender after queue pairs failed (the shell drained the dead ones
    /// first, so nothing more arrives through them): the eager slots, and the rendezvous parts
    /// of every incomplete receive with a clear-to-send out. `dead`: the failed queue pairs.
    pub fn resync(&self, dead: u32) -> Resync {
        let full = ((1u32 << self.nparts) - 1) as u16;
        let recvs = self
            .order
            .iter()
            .map(|&i| &self.reqs[i as usize])
            .filter(|r| r.cts && r.left > 0)
            .map(|r| ResyncRecv {
                cts: r.cts_index,
                n: r.n,
                parts: std::array::from_fn(|e| match r.entries.get(e).filter(|_| e < r.n as usize) {
                    Some(en) if en.done => full,
                    Some(en) => en.parts,
                    None => 0,
                }),
            })
            .collect();
        Resync { dead, ring_arrived: self.ring_arrived, cts_end: self.cts_tail, recvs }
    }

    /// The clear-to-send groups of every incomplete receive that posted one, to write again after
    /// queue pairs failed (a group lost with them would leave its sends waiting; one that did
    /// arrive is written with the same bytes, and its slot is not reused before its receive
    /// completes). Each with its receive's request slot.
    pub fn cts_outstanding(&self) -> Vec<(u16, CtsPlan)> {
        self.order
            .iter()
            .filter(|&&i| self.reqs[i as usize].cts && self.reqs[i as usize].left > 0)
            .map(|&i| {
                let r = &self.reqs[i as usize];
                let n = r.n as usize;
                let stamp = (r.cts_index + 1) as u32;
                let mut entries = [Cts::default(); MAX_GROUP];
                for (o, e) in entries.iter_mut().zip(&r.entries[..n]) {
                    *o = Cts::new(e.spec.addr, e.spec.size, e.spec.rkey, e.spec.tag, n, r.base, stamp);
                }
                let slot = (r.cts_index % FIFO_DEPTH as u64) as usize;
                (i, CtsPlan { slot, q: (r.cts_index % self.nqps as u64) as usize, n, entries })
            })
            .collect()
    }

    /// The credit word last written (to write again after queue pairs failed).
    pub fn credits_sent(&self) -> u64 {
        self.credits_sent
    }

    /// The ring slot whose header to read next, if one has arrived and is not matched yet.
    pub fn next_eager(&self) -> Option<usize> {
        (self.ring_done < self.ring_arrived).then(|| (self.ring_done % self.ring_slots as u64) as usize)
    }

    /// The receive whose sends include sequence number `seq`.
    fn owner_of(&self, seq: u32) -> Option<u16> {
        self.order.iter().copied().find(|&i| {
            let r = &self.reqs[i as usize];
            (0..r.n as i64).contains(&seq_offset(seq, r.base))
        })
    }

    /// The header of the ring slot [`next_eager`](Self::next_eager) named.
    pub fn on_eager(&mut self, h: EagerHdr) -> Result<EagerStep, ProtoError> {
        let Some(owner) = self.owner_of(h.seq) else {
            if seq_offset(h.seq, self.next_base) >= 0 {
                return Ok(EagerStep::Wait);
            }
            if h.flags & EAGER_DATA == 0 {
                // An announcement read after its receive completed: its rendezvous data went on
                // a queue pair of its own (NCCL_IB_SPLIT_DATA_ON_QPS=0 rotates the parts over
                // them) and landed first. It has nothing more to say.
                if h.flags & EAGER_URGENT != 0 {
                    self.credit_urgent = true;
                }
                self.ring_done += 1;
                return Ok(EagerStep::Consumed);
            }
            return Err(ProtoError::EagerStale { seq: h.seq });
        };
        let rq = &mut self.reqs[owner as usize];
        let n = rq.n as usize;
        // An announcement may be read after its rendezvous data already landed (the two travel
        // independently), so it matches a taken buffer too; data never does.
        let rts = h.flags & EAGER_DATA == 0;
        let Some(r) = (0..n).find(|&r| (rts || !rq.entries[r].taken) && rq.entries[r].spec.tag == h.tag) else {
            let mut tags = [0i32; MAX_GROUP];
            for (t, e) in tags.iter_mut().zip(&rq.entries[..n]) {
                *t = e.spec.tag;
            }
            return Err(ProtoError::RecvTagUnmatched { tag: h.tag, tags, n });
        };
        let spec = rq.entries[r].spec;
        if h.size > spec.size {
            return Err(ProtoError::RecvTooSmall { size: h.size, recv: spec.size, tag: h.tag });
        }
        if h.flags & EAGER_URGENT != 0 {
            self.credit_urgent = true;
        }
        if rts {
            // The size fits; the data follows by rendezvous.
            self.ring_done += 1;
            return Ok(EagerStep::Consumed);
        }
        if h.size > self.eager_max as u64 {
            return Err(ProtoError::CorruptEager { size: h.size });
        }
        let e = &mut rq.entries[r];
        e.taken = true;
        e.got = h.size;
        let index = self.ring_done;
        self.ring_done += 1;
        if h.size == 0 {
            e.done = true;
            rq.left -= 1;
            return Ok(EagerStep::Consumed);
        }
        self.copying.push_back(Copying { ring_index: index, req: owner, entry: r as u8 });
        Ok(EagerStep::Copy { req: owner, entry: r as u8, len: h.size as usize, gpu: spec.gpu })
    }

    /// The common eager message, decided without the general matching of
    /// [`on_eager`](Self::on_eager): data for the oldest receive, posted with one buffer of host
    /// memory whose tag it has and which it fits, nothing copied out of the ring before it. Its
    /// buffer is filled once the caller copies `len` bytes of the slot's payload into the one
    /// buffer of receive `req` (so it must, before anything else looks at the ring or the
    /// receive): what `on_eager` and `copy_done` make of it. None: `on_eager` decides (which
    /// answers exactly as before).
    #[inline]
    pub fn eager_straight(&mut self, h: &EagerHdr) -> Option<(u16, usize)> {
        if !self.copying.is_empty() || h.flags & EAGER_DATA == 0 || h.size == 0 || h.size > self.eager_max as u64 {
            return None;
        }
        let &owner = self.order.front()?;
        let rq = &mut self.reqs[owner as usize];
        let e = &mut rq.entries[0];
        if rq.n != 1 || rq.base != h.seq || e.taken || e.spec.tag != h.tag || e.spec.gpu || h.size > e.spec.size {
            return None;
        }
        if h.flags & EAGER_URGENT != 0 {
            self.credit_urgent = true;
        }
        e.taken = true;
        e.got = h.size;
        e.done = true;
        rq.left -= 1;
        self.ring_done += 1;
        Some((owner, h.size as usize))
    }

    /// The oldest copy out of the ring finished: its buffer is filled, its slot may be released.
    pub fn copy_done(&mut self) {
        if let Some(c) = self.copying.pop_front() {
            let r = &mut self.reqs[c.req as usize];
            r.entries[c.entry as usize].done = true;
            r.left -= 1;
        }
    }

    /// The credit word to write into the sender's memory now (in batches, or at once when the
    /// sender runs low), if any: ring slots matched and copied out.
    pub fn credit_due(&mut self) -> Option<u64> {
        let released = self.released()?;
        self.credits_sent = released;
        self.credit_urgent = false;
        Some(released)
    }

    /// Whether `credit_due` would answer a credit word now.
    pub fn credit_pending(&self) -> bool {
        self.released().is_some()
    }

    /// Whether the credit due cannot wait for the next receive or idle moment: the sender said
    /// it runs low, or three quarters of the ring wait to be released.
    pub fn credit_pressing(&self) -> bool {
        self.released().is_some_and(|r| self.credit_urgent || r - self.credits_sent >= (self.ring_slots as u64 * 3).div_ceil(4))
    }

    /// The ring slots released so far, if it is time to tell the sender.
    fn released(&self) -> Option<u64> {
        let released = self.copying.front().map_or(self.ring_done, |c| c.ring_index);
        let unreported = released - self.credits_sent;
        (unreported > 0 && (self.credit_urgent || unreported >= self.ring_slots as u64 / 2)).then_some(released)
    }

    /// Whether `req` still waits for data (Err if it is not in flight).
    pub fn waiting(&self, req: u32) -> Result<bool, ProtoError> {
        match self.reqs.get(req as usize) {
            Some(r) if r.posted => Ok(r.left > 0),
            _ => Err(ProtoError::NotInFlight { req, send: false }),
        }
    }

    /// Report `req` done if it is: the received sizes, one per buffer, and their count (0 for a
    /// flush); the slot is free again.
    pub fn take(&mut self, req: u32, sizes: &mut [usize; MAX_GROUP]) -> Result<Option<usize>, ProtoError> {
        let r = match self.reqs.get_mut(req as usize) {
            Some(r) if r.posted => r,
            _ => return Err(ProtoError::NotInFlight { req, send: false }),
        };
        if r.left > 0 {
            return Ok(None);
        }
        r.posted = false;
        if r.flush {
            self.free_flush.push(req as u16);
            return Ok(Some(0));
        }
        let n = r.n as usize;
        for (s, e) in sizes.iter_mut().zip(&r.entries[..n]) {
            *s = e.got as usize;
        }
        // Usually the oldest receive (NCCL tests its receives in order).
        if self.order.front() == Some(&(req as u16)) {
            self.order.pop_front();
        } else if let Some(pos) = self.order.iter().position(|&x| x as u32 == req) {
            self.order.remove(pos);
        }
        self.free.push(req as u16);
        Ok(Some(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::send::Origin;

    fn big(eng: &RecvEngine) -> RecvSpec {
        RecvSpec { addr: 0x1000, size: eng.eager_max() as u64 + 1, rkey: 7, tag: 3, gpu: false }
    }

    /// Eager messages `seqs` of 8 bytes with tag 0, each into its own receive, consumed in order;
    /// those from `urgent_from` on say the sender runs low.
    fn eager_arrivals(eng: &mut RecvEngine, seqs: std::ops::Range<u32>, urgent_from: u32) {
        for seq in seqs {
            eng.post(&[RecvSpec { addr: 0x1000, size: 8, rkey: 7, tag: 0, gpu: false }]);
            eng.on_eager_imm();
            assert_eq!(eng.next_eager(), Some(seq as usize % 8));
            let flags = EAGER_DATA | if seq >= urgent_from { EAGER_URGENT } else { 0 };
            let step = eng.on_eager(EagerHdr { seq, flags, size: 8, tag: 0, _pad: [0; 3] }).unwrap();
            assert!(matches!(step, EagerStep::Copy { .. }));
            eng.copy_done();
        }
    }

    #[test]
    fn a_credit_waits_for_a_quiet_moment_until_it_presses() {
        // A ring of 8: due from half of it released, pressing (written at once) from three
        // quarters, or as soon as the sender says it runs low.
        let mut eng = RecvEngine::new(1, 8, 1024, Origin { seq: 0, cts: 0 });
        eager_arrivals(&mut eng, 0..3, u32::MAX);
        assert!(!eng.credit_pending() && !eng.credit_pressing());
        eager_arrivals(&mut eng, 3..5, u32::MAX);
        assert!(eng.credit_pending() && !eng.credit_pressing(), "4 and 5 released: due, can wait");
        eager_arrivals(&mut eng, 5..6, u32::MAX);
        assert!(eng.credit_pressing(), "6 of 8 released");
        assert_eq!(eng.credit_due(), Some(6));
        assert!(!eng.credit_pending());
        let mut eng = RecvEngine::new(1, 8, 1024, Origin { seq: 0, cts: 0 });
        eager_arrivals(&mut eng, 0..1, 0);
        assert!(eng.credit_pressing(), "the sender runs low: at once, however few");
    }

    #[test]
    fn an_immediate_naming_a_slot_beyond_the_fifo_is_stray() {
        let mut eng = RecvEngine::new(1, 8, 1024, Origin { seq: 0, cts: 0 });
        let RecvPlan::Posted { cts: true, .. } = eng.post(&[big(&eng)]) else { panic!("no clear-to-send") };
        let c = *eng.cts_plan();
        // The same slot plus FIFO_DEPTH names no buffer, though it wraps onto the posted one.
        let stray = (c.slot + FIFO_DEPTH) as u32;
        assert!(matches!(eng.on_rdv_imm(stray, 0, 0, 1), Err(ProtoError::StrayImm { .. })));
        assert!(matches!(eng.on_rdv_imm(u32::MAX, 0, 0, 1), Err(ProtoError::StrayImm { .. })));
        assert!(matches!(eng.on_rdv_imm(c.slot as u32, 0, 1, 1), Err(ProtoError::StrayImm { .. })), "a part beyond the queue pairs");
        // The real slot still completes the receive.
        eng.on_rdv_imm(c.slot as u32, 0, 0, 5).unwrap();
        let mut sizes = [0; MAX_GROUP];
        assert_eq!(eng.take(0, &mut sizes).unwrap(), Some(1));
        assert_eq!(sizes[0], 5);
    }

    /// Every header a ring slot may hold, against every receive it may meet: the straight path
    /// either declines or leaves the engine as the general one does.
    #[test]
    fn the_straight_eager_path_decides_as_the_general_one() {
        let mut tried = 0;
        let mut taken = 0;
        for n in 1..=2usize {
            for (size, gpu) in [(8u64, false), (4, false), (16, false), (8, true)] {
                for (hseq, hflags, hsize, htag) in [
                    (0u32, EAGER_DATA, 8u64, 0i32),
                    (0, EAGER_DATA | EAGER_URGENT, 8, 0),
                    (0, EAGER_DATA, 8, 1),
                    (0, EAGER_DATA, 0, 0),
                    (0, EAGER_DATA, 2000, 0),
                    (0, 0, 8, 0),
                    (1, EAGER_DATA, 8, 0),
                    (u32::MAX, EAGER_DATA, 8, 0),
                ] {
                    let fresh = || {
                        let mut eng = RecvEngine::new(1, 8, 1024, Origin { seq: 0, cts: 0 });
                        let specs = [RecvSpec { addr: 0x1000, size, rkey: 7, tag: 0, gpu }; 2];
                        eng.post(&specs[..n]);
                        eng.on_eager_imm();
                        eng
                    };
                    let h = EagerHdr { seq: hseq, flags: hflags, size: hsize, tag: htag, _pad: [0; 3] };
                    let (mut a, mut b) = (fresh(), fresh());
                    tried += 1;
                    let Some((req, len)) = a.eager_straight(&h) else {
                        // Declined, and nothing changed: the general path answers as it would.
                        assert_eq!(format!("{:?}", a.on_eager(h)), format!("{:?}", b.on_eager(h)));
                        assert_eq!((a.ring_done, a.credit_urgent), (b.ring_done, b.credit_urgent));
                        continue;
                    };
                    taken += 1;
                    assert_eq!(b.on_eager(h).unwrap(), EagerStep::Copy { req, entry: 0, len, gpu: false });
                    b.copy_done();
                    let (mut sa, mut sb) = ([0; MAX_GROUP], [0; MAX_GROUP]);
                    assert_eq!(a.take(0, &mut sa).unwrap(), b.take(0, &mut sb).unwrap());
                    assert_eq!((sa, a.ring_done, a.credit_urgent, a.next_eager()), (sb, b.ring_done, b.credit_urgent, b.next_eager()));
                    assert_eq!(a.credit_pressing(), b.credit_pressing());
                }
            }
        }
        assert_eq!((tried, taken), (64, 4), "the cases the straight path takes: one buffer of host memory of 8 or 16 bytes, data of 8 with tag 0 and seq 0, urgent or not");
    }
}
