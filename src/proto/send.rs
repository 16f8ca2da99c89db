//! The sending half of the verbs protocol, as a state machine without I/O.
//!
//! The transport feeds it events (a post request, clear-to-send entries it read out of its FIFO,
//! the receiver's credit word, a send completion) and carries out what it answers: write this
//! eager header and payload into that ring slot, write these bytes of a rendezvous send to the
//! receive buffer with this immediate, report a mismatch. It never touches a queue pair or memory
//! the NIC writes, so the simulator in `tests/sim/` can run it against the receiving half under
//! any schedule. See `docs/protocol.md` for the protocol and `docs/architecture.md` for the shell.

use super::verbs::{qp_chunk, seq_offset, Cts, EagerHdr, Imm, Resync, EAGER_DATA, EAGER_RTS, EAGER_URGENT, FIFO_DEPTH, IMM_SIZE_LIMIT, MAX_GROUP, MAX_QPS, SIZES_ENTRY};
use super::ProtoError;
use std::collections::VecDeque;

mod failover;

/// Send request slots per connection (NCCL's 32 requests, each up to a full grouped receive).
pub const SEND_REQS: usize = crate::proto::NCCL_INFLIGHT * MAX_GROUP;
/// Header buffers for header-only announcements, after the per-request ones.
pub const RTS_HDRS: usize = 16;
/// Clear-to-send groups read out of the FIFO and not yet used up (the receiver has at most its
/// 32 receives in flight, so a well-behaved peer never fills this).
const GROUPS: usize = 64;

/// The receiver's eager ring, as its metadata announced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingSpec {
    pub slots: usize,
    /// Largest message sent eagerly.
    pub eager_max: usize,
}

/// Where a connection's counters start: zero on the wire; near the wrap in the simulator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Origin {
    /// Sequence number of the first send.
    pub seq: u32,
    /// Index of the first clear-to-send entry (its stamp is the index + 1).
    pub cts: u64,
}

/// What the transport does for a send request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendPlan {
    /// No request slot, ring slot or clear-to-send yet: NCCL gets a NULL request and retries.
    Busy,
    /// A large send has no clear-to-send yet: write this header-only announcement into ring
    /// slot `ring_slot` (from header buffer `hdr_slot`), then answer as for `Busy`. Made once per
    /// send, so that a receive too small for it is reported instead of waited for.
    Announce { ring_slot: usize, hdr_slot: usize, hdr: EagerHdr },
    /// Write `hdr` (from header buffer `req`) and the payload into ring slot `ring_slot`, with
    /// the immediate [`Imm::Eager`]. Call [`SendEngine::on_completion`] once the write completed
    /// (at once, for a write whose bytes went inline: the shell then keeps a copy of the payload
    /// until the receiver's credit returns the slot, in case it must be sent again).
    Eager { req: u16, ring_slot: usize, hdr: EagerHdr },
    /// A rendezvous send into `target`: write the size word at `sizes_off` of the transport's
    /// sizes buffer, then post [`SendEngine::rdv_steps`] as the payload becomes readable.
    Rdv { req: u16, target: RdvTarget },
}

/// Where a rendezvous send's bytes go (from the receiver's clear-to-send entry).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RdvTarget {
    pub addr: u64,
    pub rkey: u32,
    pub size: usize,
    /// Immediate data (host order) of part 0's completing write (see [`RdvTarget::imm_of`]).
    pub imm: u32,
    /// The immediate carries the size (one queue pair, a send below IMM_SIZE_LIMIT): the data
    /// write completes the send, and no size word is written.
    pub sized: bool,
    /// Offset of this send's size word in the sizes FIFO (the same in the sender's staging copy).
    pub sizes_off: u64,
}

impl RdvTarget {
    /// The immediate of part `q`'s completing write: it names the part (unless it carries the
    /// size, on a connection of one queue pair).
    pub fn imm_of(&self, q: usize) -> u32 {
        if self.sized {
            self.imm
        } else {
            self.imm | ((q as u32 & 0xf) << 10)
        }
    }
}

/// How a queue pair's part of a rendezvous send is completed, once all its bytes are posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    /// Queue pair 0: an 8-byte write of the size word into the sizes FIFO, with the immediate.
    Size,
    /// The data write of this step carries the immediate.
    OnData,
    /// A zero-byte send with the immediate, after this step's data write if it has one: when the
    /// step has no data, or under adaptive routing for a message above its threshold (whose
    /// placement may finish after the write's own immediate; a later work request completes only
    /// once the writes before it on the queue pair have landed).
    Empty,
}

/// One queue pair's share of a rendezvous step: RDMA WRITE bytes `[off, off + len)` of the
/// message to `target.addr + off`, then complete the part if `close` says so (signaled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdvStep {
    /// The part of the message, which its immediate names.
    pub part: usize,
    /// The logical queue pair it goes on.
    pub q: usize,
    pub data: Option<(usize, usize)>,
    pub close: Option<Close>,
}

#[derive(Clone, Copy, Default)]
struct SendReq {
    posted: bool,
    /// Signaled writes not yet completed.
    pending: u32,
    size: usize,
    /// An eager send's index in the ring (counting every slot written since the start).
    ring_index: u64,
}

/// A rendezvous send's target and which parts are done (how far each part is posted is in
/// `SendEngine::rdv_posted`).
#[derive(Clone, Copy, Default)]
struct Rdv {
    target: RdvTarget,
    /// A bit per queue pair whose part is fully posted (its completing write included).
    closed: u32,
    /// A bit per part whose completion was seen (or that the receiver said it has).
    acked: u32,
    /// The clear-to-send index and entry of the buffer it writes into.
    cts: u64,
    entry: u8,
    /// The logical queue pair of part 0; part p goes on `(base + p) % nqps`.
    base: u8,
}

/// An eager ring slot's last write: what to write again if it was lost with a failed member.
#[derive(Clone, Copy, Default)]
struct EagerRec {
    /// The send's request slot (its header buffer), or None for an announcement.
    req: Option<u16>,
    hdr_slot: u16,
    hdr: EagerHdr,
}

/// What a sender must post again after queue pairs failed, from the receiver's [`Resync`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resend {
    /// Eager ring writes the receiver did not get, in ring order: ring slot, header buffer,
    /// header, and the send's request slot (None for an announcement). They go before any
    /// new eager message.
    pub eager: Vec<(usize, usize, EagerHdr, Option<u16>)>,
    /// Rendezvous sends with parts to post again: call [`SendEngine::rdv_steps`] for each.
    pub rdv: Vec<u16>,
}

/// A clear-to-send group: the buffers of one grouped receive, read out of the FIFO.
#[derive(Clone, Copy)]
struct Group {
    /// Its clear-to-send index (the FIFO slot is its remainder by FIFO_DEPTH).
    index: u64,
    slot: u16,
    n: u8,
    /// A bit per buffer already taken by a rendezvous send.
    used: u8,
    base: u32,
    entries: [Cts; MAX_GROUP],
}

pub struct SendEngine {
    nqps: usize,
    /// Parts a rendezvous message is split into (NCCL_IB_SPLIT_DATA_ON_QPS=1: one per queue
    /// pair; 0: one per member of the larger side, on a block of queue pairs that rotates with
    /// the clear-to-send index).
    nparts: usize,
    ring: RingSpec,
    seq: u32,
    /// Eager ring slots written so far (the next is `eager_sent % ring.slots`).
    eager_sent: u64,
    /// Ring slots the receiver released (the last credit word seen).
    credits: u64,
    /// Index of the next clear-to-send entry to read out of the FIFO.
    cts_next: u64,
    groups: VecDeque<Group>,
    /// The large send last announced (its sequence number).
    rts_for: Option<u32>,
    reqs: Box<[SendReq]>,
    rdv: Box<[Rdv]>,
    /// How far each rendezvous send's part on each queue pair is posted: `nqps` per request
    /// slot (a slot per queue pair the connection has, not per queue pair it could have).
    rdv_posted: Box<[usize]>,
    free: Vec<u16>,
    /// Adaptive routing: messages above this many bytes complete with a separate zero-byte
    /// immediate (NCCL_IB_AR_THRESHOLD); None: adaptive routing off.
    ar_threshold: Option<usize>,
    /// Each ring slot's last eager write (index `eager_sent % slots`).
    eager_log: Box<[EagerRec]>,
    /// Clear-to-send indices not yet read whose receives the receiver completed before a
    /// failover (all their sends went eagerly): their groups may have been lost with a failed
    /// queue pair and are not written again, so the reading skips them. Ascending.
    cts_gone: VecDeque<u64>,
}

impl SendEngine {
    /// Adaptive routing on (messages above `threshold` bytes get their immediate alone), or off.
    pub fn set_adaptive_routing(&mut self, threshold: Option<usize>) {
        self.ar_threshold = threshold;
    }

    /// Split each rendezvous message into `n` parts (at most one per queue pair): part p of the
    /// message for clear-to-send index k goes on logical queue pair `(k * n + p) % nqps`. The
    /// receiver must count the same number of parts.
    pub fn set_parts(&mut self, n: usize) {
        self.nparts = n.clamp(1, self.nqps);
    }

    pub fn parts(&self) -> usize {
        self.nparts
    }

    /// Whether a write of `len` bytes must not carry its own immediate (adaptive routing, above
    /// the threshold): its data goes as a plain write, a zero-byte one with the immediate after.
    pub fn ar_split(&self, len: usize) -> bool {
        self.ar_threshold.is_some_and(|t| len > t)
    }

    pub fn new(nqps: usize, ring: RingSpec, origin: Origin) -> SendEngine {
        let mut free = Vec::with_capacity(SEND_REQS);
        free.extend((0..SEND_REQS as u16).rev());
        SendEngine {
            nqps: nqps.clamp(1, MAX_QPS),
            nparts: nqps.clamp(1, MAX_QPS),
            ring,
            seq: origin.seq,
            eager_sent: 0,
            credits: 0,
            cts_next: origin.cts,
            groups: VecDeque::with_capacity(GROUPS),
            rts_for: None,
            reqs: vec![SendReq::default(); SEND_REQS].into_boxed_slice(),
            rdv: vec![Rdv::default(); SEND_REQS].into_boxed_slice(),
            rdv_posted: vec![0; SEND_REQS * nqps.clamp(1, MAX_QPS)].into_boxed_slice(),
            free,
            ar_threshold: None,
            eager_log: vec![EagerRec::default(); ring.slots.max(1)].into_boxed_slice(),
            cts_gone: VecDeque::new(),
        }
    }

    pub fn eager_max(&self) -> usize {
        self.ring.eager_max
    }

    /// Requests posted and not yet reported done.
    pub fn outstanding(&self) -> usize {
        SEND_REQS - self.free.len()
    }

    /// The receiver's credit word (ring slots it released); stale values are harmless.
    pub fn on_credit(&mut self, word: u64) {
        // The word only grows; a value older than one already seen changes nothing.
        if word.wrapping_sub(self.credits) as i64 > 0 && word.wrapping_sub(self.eager_sent) as i64 <= 0 {
            self.credits = word;
        }
    }

    fn free_slots(&self) -> usize {
        self.ring.slots.saturating_sub(self.eager_sent.wrapping_sub(self.credits) as usize)
    }

    /// Where the next clear-to-send entry will be written: its FIFO slot and the stamp it will
    /// carry. None while the groups already read are enough (the transport reads no further).
    pub fn cts_wanted(&self) -> Option<(usize, u32)> {
        (self.groups.len() < GROUPS).then(|| ((self.cts_next % FIFO_DEPTH as u64) as usize, (self.cts_next + 1) as u32))
    }

    /// The entries of the FIFO slot [`cts_wanted`](Self::cts_wanted) named, each one's stamp
    /// loaded (acquire) before its other fields, as many entries as the first one's count says
    /// (at least one). Returns whether the group was taken: false when it is not written yet, or
    /// not all of it; the transport reads again later.
    pub fn on_cts(&mut self, group: &[Cts]) -> Result<bool, ProtoError> {
        let Some((_, want)) = self.cts_wanted() else { return Ok(false) };
        let Some(first) = group.first() else { return Ok(false) };
        let d = first.stamp.wrapping_sub(want) as i32;
        if d < 0 {
            return Ok(false); // not written yet
        }
        if d > 0 {
            // A later lap overwrote this slot: the entry expected here is gone, so its receive's
            // sends all went eagerly (a receive that needs its entry stays outstanding, and the
            // receiver, with at most RECV_REQS receives outstanding, never writes FIFO_DEPTH
            // entries past it). So did every entry older than the lap before the one found. The
            // entries between may still be in their slots: read on from the first of them (the
            // one found is read again when its turn comes).
            self.cts_next += (d as u64).saturating_sub(FIFO_DEPTH as u64 - 1).max(1);
            self.skip_gone();
            self.prune();
            return Ok(true);
        }
        let n = first.n();
        if n == 0 || n > MAX_GROUP {
            return Err(ProtoError::CorruptCts { n });
        }
        if group.len() < n || group[..n].iter().any(|e| e.stamp != first.stamp) {
            return Ok(false); // the rest of the group is still arriving
        }
        let index = self.cts_next;
        self.cts_next = index + 1;
        self.skip_gone();
        self.prune();
        if seq_offset(self.seq, first.base) < n as i64 {
            let mut entries = [Cts::default(); MAX_GROUP];
            entries[..n].copy_from_slice(&group[..n]);
            let slot = (index % FIFO_DEPTH as u64) as u16;
            self.groups.push_back(Group { index, slot, n: n as u8, used: 0, base: first.base, entries });
        }
        Ok(true)
    }

    /// Read past the entries a failover said are gone.
    fn skip_gone(&mut self) {
        while let Some(&i) = self.cts_gone.front() {
            if i.wrapping_sub(self.cts_next) as i64 > 0 {
                break;
            }
            self.cts_gone.pop_front();
            if i == self.cts_next {
                self.cts_next += 1;
            }
        }
    }

    /// Drop the groups whose sends have all been made (eagerly, or by rendezvous).
    fn prune(&mut self) {
        while let Some(g) = self.groups.front() {
            if seq_offset(self.seq, g.base) < g.n as i64 {
                break;
            }
            self.groups.pop_front();
        }
    }

    /// A send of `size` bytes with `tag`, of which the first `ready` can be read yet (the staging
    /// engine's copy may still be filling the rest).
    pub fn post(&mut self, size: usize, tag: i32, ready: usize) -> Result<SendPlan, ProtoError> {
        if self.free.is_empty() {
            return Ok(SendPlan::Busy);
        }
        let seq = self.seq;
        if size <= self.ring.eager_max {
            // Eager messages are small: they go once all of them is ready.
            let avail = self.free_slots();
            if ready < size || avail == 0 {
                return Ok(SendPlan::Busy);
            }
            let req = self.free.pop().unwrap();
            // Urgent (the receiver writes its credit at once, even inside the `test` that
            // finds this message, before its answer can go) only when this send leaves less
            // than a quarter of the ring: a receiver writes a credit for every half of the ring
            // it releases, at its next `irecv` or idle moment, and a ping-pong's sender, which
            // reads it a round trip later, would otherwise find it not yet landed at the half and
            // put a credit on the critical path of every fourth message (docs/design.md).
            let mut flags = EAGER_DATA;
            if avail - 1 < self.ring.slots / 4 {
                flags |= EAGER_URGENT;
            }
            let hdr = EagerHdr { seq, flags, size: size as u64, tag, _pad: [0; 3] };
            let ring_index = self.eager_sent;
            let ring_slot = self.take_ring_slot(EagerRec { req: Some(req), hdr_slot: req, hdr });
            self.reqs[req as usize] = SendReq { posted: true, pending: 1, size, ring_index };
            self.seq = seq.wrapping_add(1);
            return Ok(SendPlan::Eager { req, ring_slot, hdr });
        }
        self.prune();
        let Some(g) = self.groups.front_mut() else {
            if self.rts_for != Some(seq) && self.free_slots() > 0 {
                self.rts_for = Some(seq);
                let hdr = EagerHdr { seq, flags: EAGER_RTS | EAGER_URGENT, size: size as u64, tag, _pad: [0; 3] };
                let hdr_slot = SEND_REQS + (seq as usize % RTS_HDRS);
                let ring_slot = self.take_ring_slot(EagerRec { req: None, hdr_slot: hdr_slot as u16, hdr });
                return Ok(SendPlan::Announce { ring_slot, hdr_slot, hdr });
            }
            return Ok(SendPlan::Busy);
        };
        if seq_offset(seq, g.base) < 0 {
            // This send belongs to an earlier receive that posted no clear-to-send: all its
            // buffers are within the eager limit, so a large send cannot fit.
            return Err(ProtoError::SendOverEager { size, tag, eager_max: self.ring.eager_max });
        }
        let n = g.n as usize;
        let Some(r) = (0..n).find(|&r| g.used & (1 << r) == 0 && g.entries[r].tag == tag) else {
            let mut tags = [0i32; MAX_GROUP];
            for (t, e) in tags.iter_mut().zip(&g.entries[..n]) {
                *t = e.tag;
            }
            return Err(ProtoError::SendTagUnmatched { tag, tags, n });
        };
        let cts = g.entries[r];
        if size as u64 > cts.size() {
            return Err(ProtoError::SendTooLarge { size, tag, recv: cts.size() });
        }
        g.used |= 1 << r;
        let slot = g.slot as usize;
        let req = self.free.pop().unwrap();
        let sized = self.nparts == 1 && size < IMM_SIZE_LIMIT;
        let target = RdvTarget {
            addr: cts.addr,
            rkey: cts.rkey,
            size,
            imm: Imm::Rdv { slot: slot as u32, entry: r as u32, part: 0, size: sized.then_some(size as u32) }.encode(),
            sized,
            sizes_off: (slot * SIZES_ENTRY + r * 8) as u64,
        };
        let base = ((g.index % self.nqps as u64) as usize * self.nparts % self.nqps) as u8;
        self.rdv[req as usize] = Rdv { target, closed: 0, acked: 0, cts: g.index, entry: r as u8, base };
        let nq = self.nqps;
        self.rdv_posted[req as usize * nq..][..nq].fill(0);
        self.reqs[req as usize] = SendReq { posted: true, pending: self.nparts as u32, size, ring_index: 0 };
        self.seq = seq.wrapping_add(1);
        Ok(SendPlan::Rdv { req, target })
    }

    fn take_ring_slot(&mut self, rec: EagerRec) -> usize {
        let s = (self.eager_sent % self.ring.slots as u64) as usize;
        self.eager_log[s] = rec;
        self.eager_sent += 1;
        s
    }

    /// Where rendezvous send `req` writes.
    pub fn target(&self, req: u16) -> RdvTarget {
        self.rdv.get(req as usize).map(|r| r.target).unwrap_or_default()
    }

    /// Whether rendezvous send `req` still has parts to post.
    pub fn rdv_open(&self, req: u16) -> bool {
        let i = req as usize;
        i < SEND_REQS && self.reqs[i].posted && self.rdv[i].target.size > 0 && self.rdv[i].closed != (1u32 << self.nparts) - 1
    }

    /// Whether `rdv_steps(req, ready)` would post anything: new bytes, or a part's completing write.
    pub fn rdv_has_new(&self, req: u16, ready: usize) -> bool {
        let (nq, np) = (self.nqps, self.nparts);
        let Some(p) = self.rdv.get(req as usize) else { return false };
        let posted = &self.rdv_posted[req as usize * nq..][..np];
        let ready = ready.min(p.target.size);
        posted.iter().enumerate().any(|(part, &done)| {
            let (off, len) = qp_chunk(p.target.size, np, part);
            let avail = ready.saturating_sub(off).min(len);
            p.closed & (1 << part) == 0 && (avail > done || avail == len)
        })
    }

    /// What to post of rendezvous send `req` now that its first `ready` bytes can be read: per
    /// queue pair, the new bytes of its part, and once the part is complete the write that
    /// carries the immediate. Returns the number of steps written to `out`.
    pub fn rdv_steps(&mut self, req: u16, ready: usize, out: &mut [RdvStep; MAX_QPS]) -> usize {
        let (nq, np) = (self.nqps, self.nparts);
        let Some(p) = self.rdv.get_mut(req as usize) else { return 0 };
        let posted = &mut self.rdv_posted[req as usize * nq..][..np];
        let size = p.target.size;
        let ready = ready.min(size);
        // Adaptive routing, above its threshold: no write carries its own immediate.
        let split = self.ar_threshold.is_some_and(|t| size > t);
        let mut k = 0;
        for (part, done) in posted.iter_mut().enumerate() {
            if p.closed & (1 << part) != 0 {
                continue;
            }
            let (off, len) = qp_chunk(size, np, part);
            let avail = ready.saturating_sub(off).min(len);
            let mut data = None;
            if avail > *done {
                data = Some((off + *done, avail - *done));
                *done = avail;
            }
            let mut close = None;
            if avail == len {
                close = Some(match (part, data) {
                    (0, Some(_)) if p.target.sized && !split => Close::OnData,
                    (0, _) if p.target.sized => Close::Empty,
                    (0, _) => Close::Size,
                    (_, Some(_)) if !split => Close::OnData,
                    (_, _) => Close::Empty,
                });
                p.closed |= 1 << part;
            }
            if data.is_some() || close.is_some() {
                out[k] = RdvStep { part, q: (p.base as usize + part) % nq, data, close };
                k += 1;
            }
        }
        k
    }

    /// The parts (logical queue pairs) of rendezvous sends in flight that have bytes posted but
    /// not their completing write: such a part must finish on the queue pair it started on (its
    /// immediate says its bytes before it on that queue pair have landed).
    pub fn open_parts(&self) -> u32 {
        let (nq, np) = (self.nqps, self.nparts);
        let mut m = 0u32;
        for i in 0..SEND_REQS {
            if !self.reqs[i].posted || self.rdv[i].target.size == 0 {
                continue;
            }
            for part in 0..np {
                if self.rdv_posted[i * nq + part] > 0 && self.rdv[i].closed & (1 << part) == 0 {
                    m |= 1 << ((self.rdv[i].base as usize + part) % nq);
                }
            }
        }
        m
    }

    /// A signaled write of request `req` completed (or an eager one went inline, complete at
    /// post): for a rendezvous send, the completing write of its part `part` (each counts once).
    pub fn on_completion(&mut self, req: u16, part: usize) {
        let i = req as usize;
        let Some(r) = self.reqs.get_mut(i) else { return };
        if self.rdv[i].target.size > 0 {
            let bit = 1u32 << (part % 32);
            if part >= self.nparts || self.rdv[i].acked & bit != 0 {
                return;
            }
            self.rdv[i].acked |= bit;
        }
        r.pending = r.pending.saturating_sub(1);
    }

    /// Whether `req` still waits for completions (Err if it is not in flight).
    pub fn waiting(&self, req: u32) -> Result<bool, ProtoError> {
        match self.reqs.get(req as usize) {
            Some(r) if r.posted => Ok(r.pending > 0),
            _ => Err(ProtoError::NotInFlight { req, send: true }),
        }
    }

    /// Report `req` done if it is: its size, and the slot is free again.
    pub fn take(&mut self, req: u32) -> Result<Option<usize>, ProtoError> {
        if self.waiting(req)? {
            return Ok(None);
        }
        let r = &mut self.reqs[req as usize];
        r.posted = false;
        self.rdv[req as usize].target.size = 0;
        self.free.push(req as u16);
        Ok(Some(r.size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_send_below_the_limit_on_one_qp_is_one_write_with_its_size_in_the_immediate() {
        for (nqps, size, sized) in [(1, IMM_SIZE_LIMIT - 1, true), (1, IMM_SIZE_LIMIT, false), (2, 65536, false)] {
            let mut e = SendEngine::new(nqps, RingSpec { slots: 8, eager_max: 8192 }, Origin::default());
            assert!(e.on_cts(&[Cts::new(0x1000, 4 << 20, 7, 0, 1, 0, 1)]).unwrap());
            let Ok(SendPlan::Rdv { req, target }) = e.post(size, 0, size / 4) else { panic!("not a rendezvous send") };
            assert_eq!(target.sized, sized, "{nqps} QP(s), {size} bytes");
            assert_eq!(Imm::decode(target.imm), Imm::Rdv { slot: 0, entry: 0, part: 0, size: sized.then_some(size as u32) });
            let mut steps = [RdvStep { part: 0, q: 0, data: None, close: None }; MAX_QPS];
            // A staged send's first quarter: its bytes, no part complete, no immediate yet.
            let k = e.rdv_steps(req, size / 4, &mut steps);
            assert!(k > 0 && steps[..k].iter().all(|s| s.close.is_none() && s.data.is_some()));
            let k = e.rdv_steps(req, size, &mut steps);
            let closes: Vec<(usize, Close)> = steps[..k].iter().filter_map(|s| s.close.map(|c| (s.q, c))).collect();
            let want = match (sized, nqps) {
                (true, _) => vec![(0, Close::OnData)],
                (false, 1) => vec![(0, Close::Size)],
                _ => vec![(0, Close::Size), (1, Close::OnData)],
            };
            assert_eq!(closes, want, "{nqps} QP(s), {size} bytes");
            assert!(!e.rdv_has_new(req, size), "nothing left to post");
        }
    }

    #[test]
    fn an_eager_send_is_urgent_only_when_it_leaves_less_than_a_quarter_of_the_ring() {
        let mut e = SendEngine::new(1, RingSpec { slots: 8, eager_max: 4096 }, Origin::default());
        let mut urgent = Vec::new();
        for _ in 0..8 {
            let Ok(SendPlan::Eager { req, hdr, .. }) = e.post(8, 0, 8) else { panic!("not an eager send") };
            urgent.push(hdr.flags & EAGER_URGENT != 0);
            e.on_completion(req, 0);
        }
        // Slots left after each send: 7 … 0; urgent from 1 left on.
        assert_eq!(urgent, [false, false, false, false, false, false, true, true]);
        assert!(matches!(e.post(8, 0, 8), Ok(SendPlan::Busy)), "no slot left without a credit");
        // A credit for the first four: four slots free again, the next send not urgent.
        e.on_credit(4);
        let Ok(SendPlan::Eager { hdr, .. }) = e.post(8, 0, 8) else { panic!("not an eager send") };
        assert_eq!(hdr.flags & EAGER_URGENT, 0);
    }

    #[test]
    fn a_part_with_bytes_posted_and_no_immediate_yet_is_open() {
        let mut e = SendEngine::new(2, RingSpec { slots: 8, eager_max: 4096 }, Origin::default());
        assert!(e.on_cts(&[Cts::new(0x1000, 1 << 20, 7, 0, 1, 0, 1)]).unwrap());
        let Ok(SendPlan::Rdv { req, .. }) = e.post(100_000, 0, 0) else { panic!("not a rendezvous send") };
        let mut steps = [RdvStep { part: 0, q: 0, data: None, close: None }; MAX_QPS];
        assert_eq!(e.open_parts(), 0, "nothing posted yet");
        // A staged send's first 60,000 bytes: part 0 (50,048 bytes) complete, part 1 begun.
        e.rdv_steps(req, 60_000, &mut steps);
        assert_eq!(e.open_parts(), 0b10, "part 1 has bytes on its queue pair and no immediate");
        e.rdv_steps(req, 100_000, &mut steps);
        assert_eq!(e.open_parts(), 0, "every part closed");
    }

    #[test]
    fn under_adaptive_routing_a_message_above_the_threshold_carries_no_immediate_with_its_data() {
        // (queue pairs, size, closes): at the threshold a write still carries its immediate;
        // above it every part's data goes plain and a zero-byte send carries the immediate.
        for (nqps, size, want) in [
            (1, 8192, vec![(0, Close::OnData, true)]),
            (1, 8193, vec![(0, Close::Empty, true)]),
            (2, 20000, vec![(0, Close::Size, true), (1, Close::Empty, true)]),
        ] {
            let mut e = SendEngine::new(nqps, RingSpec { slots: 8, eager_max: 4096 }, Origin::default());
            e.set_adaptive_routing(Some(8192));
            assert!(e.ar_split(8193) && !e.ar_split(8192));
            assert!(e.on_cts(&[Cts::new(0x1000, 4 << 20, 7, 0, 1, 0, 1)]).unwrap());
            let Ok(SendPlan::Rdv { req, .. }) = e.post(size, 0, size) else { panic!("not a rendezvous send") };
            let mut steps = [RdvStep { part: 0, q: 0, data: None, close: None }; MAX_QPS];
            let k = e.rdv_steps(req, size, &mut steps);
            let closes: Vec<(usize, Close, bool)> = steps[..k].iter().filter_map(|s| s.close.map(|c| (s.q, c, s.data.is_some()))).collect();
            assert_eq!(closes, want, "{nqps} QP(s), {size} bytes");
        }
    }
}
