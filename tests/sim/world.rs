//! The simulator's world: the scenario a seed draws (from `rng`), and simulated memory and
//! queue pairs (writes placed in pieces, in any order between completions).

use super::*;
// ---------------------------------------------------------------------------------------------
// The scenario.

#[derive(Clone, Debug)]
pub(crate) struct Msg {
    pub(crate) tag: i32,
    pub(crate) send: usize,
    pub(crate) recv: usize,
    /// The send's tag (the receive's, unless a test makes them differ).
    pub(crate) send_tag: i32,
}

#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) nqps: usize,
    /// Parts a rendezvous message is split into (NCCL_IB_SPLIT_DATA_ON_QPS: nqps when 1; fewer,
    /// on rotating queue pairs, when 0).
    pub(crate) parts: usize,
    pub(crate) ring_slots: usize,
    pub(crate) eager_max: usize,
    pub(crate) origin: Origin,
    /// Receives, each a group of buffers; the sends of a group go in `order`.
    pub(crate) groups: Vec<(Vec<Msg>, Vec<usize>)>,
    /// Placement reordered within a queue pair between completions.
    pub(crate) adaptive: bool,
    /// Adaptive routing with its hazard, as the engines are told (NCCL_IB_AR_THRESHOLD): a write
    /// of more than this many bytes may deliver its immediate before its own data has all landed
    /// (after everything before it); control writes of the receiver land in any order, a CTS
    /// group entry by entry. The engines split such writes; `ar_unsplit` tells them nothing (to
    /// show the simulator catches what the split prevents).
    pub(crate) ar: Option<usize>,
    pub(crate) ar_unsplit: bool,
    /// Copies out of the eager ring finish late (a GPU copy).
    pub(crate) async_copy: bool,
    /// Large sends are posted before all their bytes are readable (the staging engine).
    pub(crate) partial: bool,
    /// The peer that stops, and at which step: (step, sender dies?).
    pub(crate) fail: Option<(u64, bool)>,
    /// Members that fail (a fused device's port): at a step, the queue pairs in a mask die in
    /// both directions, and each side learns of it after its delay (None: only through the
    /// other's notice), as a failed completion or PORT_ERR would tell it.
    pub(crate) member_fail: Vec<MemberFail>,
    /// The sender ignores the receiver's account (to show that a lost part is caught).
    pub(crate) no_failover: bool,
    /// At most this many requests in flight per side (NCCL: up to 8 per comm in practice).
    pub(crate) window: usize,
}

#[derive(Clone, Debug)]
pub(crate) struct MemberFail {
    pub(crate) at: u64,
    pub(crate) qps: u32,
    pub(crate) recv_sees: Option<u64>,
    pub(crate) send_sees: Option<u64>,
    /// Recovery: this many steps after the failure the port is up again, and the receiver asks
    /// the sender to take its queue pairs back (if it has failed them over by then).
    pub(crate) back: Option<u64>,
}

/// Up to `nqps - 1` member failures (at least one queue pair lives), each seen by one side or
/// both, after a delay.
pub(crate) fn member_failures(r: &mut Rng, nqps: usize, steps: usize) -> Vec<MemberFail> {
    let mut out = Vec::new();
    let mut dead = 0u32;
    let mut at = 0u64;
    while nqps > 1 && (dead.count_ones() as usize) < nqps - 1 && (out.is_empty() || r.chance(30)) {
        at += 1 + r.below(steps) as u64;
        let live: Vec<usize> = (0..nqps).filter(|q| dead & (1 << q) == 0).collect();
        // One queue pair, or every one of a member (q % members == m, as a fused device's are).
        let members = r.pick(&[1usize, 2, 3]).min(nqps);
        let first = r.pick(&live);
        let mut qps = 0u32;
        for q in (0..nqps).filter(|q| q % members == first % members) {
            qps |= 1 << q;
        }
        if r.chance(30) {
            qps = 1 << first;
        }
        qps &= !dead;
        if (dead | qps).count_ones() as usize >= nqps || qps == 0 {
            qps = 1 << first;
            if (dead | qps).count_ones() as usize >= nqps {
                break;
            }
        }
        dead |= qps;
        let delay = |r: &mut Rng| if r.chance(80) { Some(r.below(3000) as u64) } else { None };
        let (mut recv_sees, mut send_sees) = (delay(r), delay(r));
        if recv_sees.is_none() && send_sees.is_none() {
            recv_sees = Some(r.below(500) as u64);
            if r.chance(50) {
                std::mem::swap(&mut recv_sees, &mut send_sees);
            }
        }
        let back = r.chance(40).then(|| 1000 + r.below(5000) as u64);
        out.push(MemberFail { at, qps, recv_sees, send_sees, back });
    }
    out
}

pub(crate) fn size_near(r: &mut Rng, eager_max: usize, nqps: usize) -> usize {
    let split = nqps * 128;
    let base = r.pick(&[0usize, 1, 127, 128, 129, eager_max, split, 4096, 20000]);
    let v = match r.below(4) {
        0 => base,
        1 => base + 1,
        2 => base.saturating_sub(1),
        _ => r.below(30000),
    };
    if r.chance(30) {
        eager_max.saturating_sub(1) + r.below(3)
    } else {
        v
    }
}

pub(crate) fn config(seed: u64, ngroups: usize) -> Config {
    let mut r = Rng(seed);
    let nqps = r.pick(&[1usize, 1, 2, 3, 4]);
    let eager_max = r.pick(&[0usize, 64, 200, 1024, 8192]);
    let ring_slots = r.pick(&[1usize, 2, 4, 8, 32]);
    let (any_seq, any_cts) = (r.next() as u32, r.below(1 << 20) as u64);
    let origin = Origin {
        seq: r.pick(&[0u32, u32::MAX - 3, u32::MAX - 40, any_seq]),
        cts: r.pick(&[0u64, (u32::MAX - 2) as u64, (u32::MAX as u64) * 3 - 1, any_cts]),
    };
    let mut groups = Vec::new();
    for _ in 0..ngroups {
        let n = if r.chance(60) { 1 } else { 1 + r.below(MAX_GROUP) };
        // The buffers of a grouped receive have distinct tags (NCCL's are the peers' ranks): a
        // send finds its buffer by tag.
        let tags: Vec<i32> = (0..n as i32).map(|t| if n == 1 && r.chance(50) { 0 } else { t * 7 - 3 }).collect();
        let msgs: Vec<Msg> = tags
            .iter()
            .map(|&tag| {
                let send = size_near(&mut r, eager_max, nqps);
                let any = r.below(5000);
                let recv = send + r.pick(&[0usize, 0, 0, 1, 128, eager_max + 1, any]);
                Msg { tag, send, recv, send_tag: tag }
            })
            .collect();
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, r.below(i + 1));
        }
        groups.push((msgs, order));
    }
    // Drawn apart, so the rest of a seed's schedule is as it was before parts were drawn.
    let parts = {
        let mut p = Rng(seed ^ 0x5041_5254);
        if nqps > 1 && p.chance(50) {
            1 + p.below(nqps - 1)
        } else {
            nqps
        }
    };
    Config {
        nqps,
        parts,
        ring_slots,
        eager_max,
        origin,
        groups,
        adaptive: r.chance(60),
        ar: r.chance(30).then(|| r.pick(&[0usize, 100, 4096, 8192])),
        ar_unsplit: false,
        async_copy: r.chance(40),
        partial: r.chance(40),
        fail: r.chance(15).then(|| (r.below(3000) as u64, r.chance(50))),
        window: r.pick(&[1usize, 2, 8, 32]),
        member_fail: Vec::new(),
        no_failover: false,
    }
    .with_member_failures(&mut r)
}

impl Config {
    /// In a quarter of the schedules with several queue pairs (and no peer that stops), members fail.
    fn with_member_failures(mut self, r: &mut Rng) -> Config {
        if self.fail.is_none() && self.nqps > 1 && r.chance(25) {
            self.member_fail = member_failures(r, self.nqps, 4000);
        }
        self
    }
}

// ---------------------------------------------------------------------------------------------
// Simulated memory and queue pairs.

pub(crate) const RECV_BASE: u64 = 0x1000_0000;
/// A data write is placed in pieces of this many bytes (packets).
pub(crate) const PIECE: usize = 64;
pub(crate) const POISON: u8 = 0x5c;
pub(crate) const REUSED: u8 = 0xaa;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mem {
    // At the receiver.
    Ring,
    Sizes,
    Arena,
    // At the sender.
    Fifo,
}

#[derive(Clone, Debug)]
pub(crate) enum Src {
    /// Bytes copied into the work request when it was posted (inline).
    Inline(Vec<u8>),
    /// The sender's memory, read when the NIC places the bytes.
    SendArena { off: usize, len: usize },
    SendHdrs { off: usize, len: usize },
}

#[derive(Clone, Debug)]
pub(crate) struct Op {
    pub(crate) mem: Mem,
    pub(crate) off: usize,
    pub(crate) src: Vec<Src>,
    /// Immediate data: a receive completion at the target once everything before it landed.
    pub(crate) imm: Option<u32>,
    /// A signaled send request: a completion for it at the poster (a control write's goes to
    /// the receiver's `ctrl_cq`). A rendezvous part's names its part above the request (bits
    /// 12..16), as the shell's work request id does.
    pub(crate) signal: Option<u16>,
    /// Bytes it writes.
    pub(crate) len: usize,
    /// Pieces (start, len) not yet placed.
    pub(crate) pieces: Vec<(usize, usize)>,
    /// Control writes land in address order (one packet).
    pub(crate) in_order: bool,
    /// Its sender died with it half on the wire: the rest never lands.
    pub(crate) stuck: bool,
}

#[derive(Default)]
pub(crate) struct Qp {
    pub(crate) ops: VecDeque<Op>,
}

pub(crate) struct Sim {
    pub(crate) cfg: Config,
    pub(crate) rng: Rng,
    pub(crate) ring: Vec<u8>,
    pub(crate) sizes: Vec<u8>,
    pub(crate) arena: Vec<u8>,
    pub(crate) fifo: Vec<u8>,
    pub(crate) send_arena: Vec<u8>,
    pub(crate) hdrs: Vec<u8>,
    /// Sender to receiver (data), receiver to sender (control).
    pub(crate) data_qps: Vec<Qp>,
    pub(crate) ctrl_qps: Vec<Qp>,
    pub(crate) recv_cq: VecDeque<u32>,
    pub(crate) send_cq: VecDeque<u16>,
    /// Completions of the receiver's signaled control writes.
    pub(crate) ctrl_cq: VecDeque<u16>,
    pub(crate) slot_bytes: usize,
    pub(crate) steps: u64,
    /// Queue pairs in ERR on the receiver's side and on the sender's (a member failed, or the
    /// side moved them there itself): nothing posted on one that either side has in ERR lands.
    pub(crate) recv_err: u32,
    pub(crate) send_err: u32,
    /// The out-of-band socket each way: (step it arrives, notice).
    pub(crate) to_recv: VecDeque<(u64, Notice)>,
    pub(crate) to_send: VecDeque<(u64, Notice)>,
}

impl Sim {
    pub(crate) fn gather(&self, src: &[Src], from: usize, len: usize) -> Vec<u8> {
        let mut all = Vec::new();
        for s in src {
            match s {
                Src::Inline(b) => all.extend_from_slice(b),
                Src::SendArena { off, len } => all.extend_from_slice(&self.send_arena[*off..off + len]),
                Src::SendHdrs { off, len } => all.extend_from_slice(&self.hdrs[*off..off + len]),
            }
            if all.len() >= from + len {
                break;
            }
        }
        all[from..from + len].to_vec()
    }

    pub(crate) fn mem(&mut self, m: Mem) -> &mut Vec<u8> {
        match m {
            Mem::Ring => &mut self.ring,
            Mem::Sizes => &mut self.sizes,
            Mem::Arena => &mut self.arena,
            Mem::Fifo => &mut self.fifo,
        }
    }

    /// Post a write of `src` to `(mem, off)` on queue pair `q` (a control one from the receiver,
    /// or a data one from the sender), with its immediate and the request it signals.
    pub(crate) fn post(&mut self, ctrl: bool, q: usize, (mem, off): (Mem, usize), src: Vec<Src>, imm: Option<u32>, signal: Option<u16>) {
        let len = src
            .iter()
            .map(|s| match s {
                Src::Inline(b) => b.len(),
                Src::SendArena { len, .. } | Src::SendHdrs { len, .. } => *len,
            })
            .sum();
        // Control writes land in address order, 8 bytes at a time; under adaptive routing a
        // clear-to-send group lands entry by entry, in any order.
        let piece = if ctrl && self.cfg.ar.is_some() { 32 } else if ctrl { 8 } else { PIECE };
        let mut pieces: Vec<(usize, usize)> = (0..len).step_by(piece).map(|a| (a, piece.min(len - a))).collect();
        if pieces.is_empty() {
            pieces.push((0, 0));
        }
        if self.down() & (1 << q) != 0 {
            return; // in ERR on one side: flushed, or dropped at the other
        }
        let op = Op { mem, off, src, imm, signal, len, pieces, in_order: ctrl && self.cfg.ar.is_none(), stuck: false };
        let qps = if ctrl { &mut self.ctrl_qps } else { &mut self.data_qps };
        qps[q].ops.push_back(op);
    }

    /// Queue pairs that carry nothing now.
    pub(crate) fn down(&self) -> u32 {
        self.recv_err | self.send_err
    }

    /// The member carrying queue pairs `mask` fails: both sides' ends stop.
    pub(crate) fn kill(&mut self, mask: u32) {
        self.stop(mask);
        self.recv_err |= mask;
        self.send_err |= mask;
    }

    /// One side moves queue pairs `mask` to ERR itself (it found them failed, perhaps late).
    pub(crate) fn err(&mut self, recv_side: bool, mask: u32) {
        self.stop(mask);
        if recv_side {
            self.recv_err |= mask;
        } else {
            self.send_err |= mask;
        }
    }

    /// Queue pairs `mask` stop carrying traffic, in both directions. On each that still did, a
    /// prefix of what was posted was on the wire and lands (with its receive completions); the
    /// next message lands in part, without a completion; the rest never leaves. The
    /// acknowledgements of the last of those that landed may be lost: the poster never sees
    /// their completions.
    fn stop(&mut self, mask: u32) {
        let mask = mask & !self.down();
        for q in (0..self.data_qps.len()).filter(|q| mask & (1 << q) != 0) {
            for ctrl in [false, true] {
                let qp = if ctrl { &mut self.ctrl_qps[q] } else { &mut self.data_qps[q] };
                let mut ops: Vec<Op> = qp.ops.drain(..).collect();
                let cut = self.rng.below(ops.len() + 1);
                let partial = (cut < ops.len() && self.rng.chance(50)).then(|| ops[cut].clone());
                ops.truncate(cut);
                let acked = self.rng.below(ops.len() + 1);
                for (i, op) in ops.into_iter().enumerate() {
                    let bytes = self.gather(&op.src, 0, op.len);
                    let m = self.mem(op.mem);
                    m[op.off..op.off + op.len].copy_from_slice(&bytes);
                    if let Some(imm) = op.imm {
                        self.recv_cq.push_back(imm);
                    }
                    match op.signal {
                        Some(req) if i < acked && ctrl => self.ctrl_cq.push_back(req),
                        Some(req) if i < acked => self.send_cq.push_back(req),
                        _ => {}
                    }
                }
                if let Some(op) = partial {
                    let keep = self.rng.below(op.pieces.len().max(1));
                    for &(start, len) in &op.pieces[..keep] {
                        let bytes = self.gather(&op.src, start, len);
                        let m = self.mem(op.mem);
                        m[op.off + start..op.off + start + len].copy_from_slice(&bytes);
                    }
                }
            }
        }
    }

    /// One side resets queue pairs `mask` (taking them back): once both have, they carry
    /// traffic again.
    pub(crate) fn revive(&mut self, recv_side: bool, mask: u32) {
        if recv_side {
            self.recv_err &= !mask;
        } else {
            self.send_err &= !mask;
        }
    }

    /// Place one piece somewhere in the network; false when nothing is in flight.
    pub(crate) fn deliver(&mut self) -> bool {
        let busy: Vec<(bool, usize)> = (0..self.data_qps.len())
            .filter(|&q| !self.data_qps[q].ops.is_empty())
            .map(|q| (false, q))
            .chain((0..self.ctrl_qps.len()).filter(|&q| !self.ctrl_qps[q].ops.is_empty()).map(|q| (true, q)))
            .collect();
        if busy.is_empty() {
            return false;
        }
        let (ctrl, q) = busy[self.rng.below(busy.len())];
        let adaptive = self.cfg.adaptive;
        let qp = if ctrl { &self.ctrl_qps[q] } else { &self.data_qps[q] };
        // The ops whose placement may interleave: up to and including the first with an immediate.
        // Control writes keep their order: the credit word is one address written again and again,
        // and a late-placed older value would stand (the simulator found that deadlock; issue 14's
        // adaptive-routing mode must change the credit protocol before this can be lifted).
        // Under adaptive routing the receiver's control writes (no immediates) interleave too.
        let window = if (adaptive && !ctrl) || (ctrl && self.cfg.ar.is_some()) {
            qp.ops.iter().position(|o| o.imm.is_some()).map_or(qp.ops.len(), |i| i + 1)
        } else {
            1
        };
        let candidates: Vec<usize> = (0..window).filter(|&i| !qp.ops[i].pieces.is_empty() && !qp.ops[i].stuck).collect();
        if let Some(&i) = candidates.get(self.rng.below(candidates.len().max(1))) {
            let op = &qp.ops[i];
            let k = if op.in_order || !adaptive { 0 } else { self.rng.below(op.pieces.len()) };
            let (start, len) = op.pieces[k];
            let (mem, off, src) = (op.mem, op.off, op.src.clone());
            let bytes = self.gather(&src, start, len);
            let m = self.mem(mem);
            m[off + start..off + start + len].copy_from_slice(&bytes);
            let qp = if ctrl { &mut self.ctrl_qps[q] } else { &mut self.data_qps[q] };
            qp.ops[i].pieces.remove(k);
        }
        // Completions, in order, for the ops fully placed at the front.
        let qp = if ctrl { &mut self.ctrl_qps[q] } else { &mut self.data_qps[q] };
        while qp.ops.front().is_some_and(|o| o.pieces.is_empty() && !o.stuck) {
            let op = qp.ops.pop_front().unwrap();
            if let Some(imm) = op.imm {
                self.recv_cq.push_back(imm);
            }
            match op.signal {
                Some(req) if ctrl => self.ctrl_cq.push_back(req),
                Some(req) => self.send_cq.push_back(req),
                None => {}
            }
        }
        // Adaptive routing's hazard: the write at the front (everything before it landed) may
        // deliver its immediate while its own data is still arriving, when it is more than one
        // packet (PIECE) and above the threshold (what NCCL's IB transport trusts a single
        // write with its immediate for).
        if let (Some(t), Some(front)) = (self.cfg.ar, qp.ops.front_mut()) {
            if front.imm.is_some() && front.len > t.max(PIECE) && !front.stuck && self.rng.chance(30) {
                self.recv_cq.push_back(front.imm.take().unwrap());
            }
        }
        true
    }
}
