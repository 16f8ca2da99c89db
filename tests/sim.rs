//! A deterministic two-sided simulator of the verbs protocol: the sending and receiving engines
//! of `rivet::proto` run against each other through simulated queue pairs and memory, under
//! seeded schedules that a real fabric could produce:
//! - placement of a queue pair's writes in any order and in pieces between its completions (as
//!   adaptive routing does), an immediate completing only once everything before it landed;
//! - queue pairs independent of each other; control writes (clear-to-send, credits) delayed and
//!   reordered across queue pairs, each placed in address order;
//! - credits returned late, eager copies out of the ring finishing late (as a GPU copy does);
//! - grouped receives with permuted tags, partial (staged) sends, sequence numbers and
//!   clear-to-send stamps starting just below their wrap, every size around the eager limit and
//!   the 128-byte split;
//! - a peer that stops at any step.
//!
//! Checks: every byte lands where its receive asked and nowhere else, sizes are reported right,
//! nothing completes before its data (a completed send's buffer is overwritten at once, and the
//! simulated NIC reads send buffers when it places them), and nothing deadlocks while both sides
//! keep calling. `RIVET_SIM_SCHEDULES` sets how many random schedules run (CI: 100,000); a
//! failure prints the seed, and `RIVET_SIM_SEED=<seed>` replays exactly that schedule.

use nccl_net_rivet::proto::recv::{EagerStep, RecvEngine, RecvPlan, RecvSpec};
use nccl_net_rivet::proto::send::{Close, Origin, RdvStep, RingSpec, SendEngine, SendPlan};
use nccl_net_rivet::proto::verbs::{Cts, EagerHdr, Imm, EAGER_HDR, FIFO_BYTES, FIFO_DEPTH, MAX_GROUP, MAX_QPS};
use nccl_net_rivet::proto::ProtoError;
use std::collections::VecDeque;

// ---------------------------------------------------------------------------------------------
// Deterministic randomness.

#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, pct: usize) -> bool {
        self.below(100) < pct
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len())]
    }
}

// ---------------------------------------------------------------------------------------------
// The scenario.

#[derive(Clone, Debug)]
struct Msg {
    tag: i32,
    send: usize,
    recv: usize,
    /// The send's tag (the receive's, unless a test makes them differ).
    send_tag: i32,
}

#[derive(Clone, Debug)]
struct Config {
    nqps: usize,
    ring_slots: usize,
    eager_max: usize,
    origin: Origin,
    /// Receives, each a group of buffers; the sends of a group go in `order`.
    groups: Vec<(Vec<Msg>, Vec<usize>)>,
    /// Placement reordered within a queue pair between completions.
    adaptive: bool,
    /// Copies out of the eager ring finish late (a GPU copy).
    async_copy: bool,
    /// Large sends are posted before all their bytes are readable (the staging engine).
    partial: bool,
    /// The peer that stops, and at which step: (step, sender dies?).
    fail: Option<(u64, bool)>,
    /// At most this many requests in flight per side (NCCL: up to 8 per comm in practice).
    window: usize,
}

fn size_near(r: &mut Rng, eager_max: usize, nqps: usize) -> usize {
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

fn config(seed: u64, ngroups: usize) -> Config {
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
    Config {
        nqps,
        ring_slots,
        eager_max,
        origin,
        groups,
        adaptive: r.chance(60),
        async_copy: r.chance(40),
        partial: r.chance(40),
        fail: r.chance(15).then(|| (r.below(3000) as u64, r.chance(50))),
        window: r.pick(&[1usize, 2, 8, 32]),
    }
}

// ---------------------------------------------------------------------------------------------
// Simulated memory and queue pairs.

const RECV_BASE: u64 = 0x1000_0000;
/// A data write is placed in pieces of this many bytes (packets).
const PIECE: usize = 64;
const POISON: u8 = 0x5c;
const REUSED: u8 = 0xaa;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mem {
    // At the receiver.
    Ring,
    Sizes,
    Arena,
    // At the sender.
    Fifo,
}

#[derive(Clone, Debug)]
enum Src {
    /// Bytes copied into the work request when it was posted (inline).
    Inline(Vec<u8>),
    /// The sender's memory, read when the NIC places the bytes.
    SendArena { off: usize, len: usize },
    SendHdrs { off: usize, len: usize },
}

#[derive(Clone, Debug)]
struct Op {
    mem: Mem,
    off: usize,
    src: Vec<Src>,
    /// Immediate data: a receive completion at the target once everything before it landed.
    imm: Option<u32>,
    /// A signaled send request: a completion for it at the poster.
    signal: Option<u16>,
    /// Pieces (start, len) not yet placed.
    pieces: Vec<(usize, usize)>,
    /// Control writes land in address order (one packet).
    in_order: bool,
    /// Its sender died with it half on the wire: the rest never lands.
    stuck: bool,
}

#[derive(Default)]
struct Qp {
    ops: VecDeque<Op>,
}

struct Sim {
    cfg: Config,
    rng: Rng,
    ring: Vec<u8>,
    sizes: Vec<u8>,
    arena: Vec<u8>,
    fifo: Vec<u8>,
    send_arena: Vec<u8>,
    hdrs: Vec<u8>,
    /// Sender to receiver (data), receiver to sender (control).
    data_qps: Vec<Qp>,
    ctrl_qps: Vec<Qp>,
    recv_cq: VecDeque<u32>,
    send_cq: VecDeque<u16>,
    slot_bytes: usize,
    steps: u64,
}

impl Sim {
    fn gather(&self, src: &[Src], from: usize, len: usize) -> Vec<u8> {
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

    fn mem(&mut self, m: Mem) -> &mut Vec<u8> {
        match m {
            Mem::Ring => &mut self.ring,
            Mem::Sizes => &mut self.sizes,
            Mem::Arena => &mut self.arena,
            Mem::Fifo => &mut self.fifo,
        }
    }

    /// Post a write of `src` to `(mem, off)` on queue pair `q` (a control one from the receiver,
    /// or a data one from the sender), with its immediate and the request it signals.
    fn post(&mut self, ctrl: bool, q: usize, (mem, off): (Mem, usize), src: Vec<Src>, imm: Option<u32>, signal: Option<u16>) {
        let len = src
            .iter()
            .map(|s| match s {
                Src::Inline(b) => b.len(),
                Src::SendArena { len, .. } | Src::SendHdrs { len, .. } => *len,
            })
            .sum();
        let piece = if ctrl { 8 } else { PIECE };
        let mut pieces: Vec<(usize, usize)> = (0..len).step_by(piece).map(|a| (a, piece.min(len - a))).collect();
        if pieces.is_empty() {
            pieces.push((0, 0));
        }
        let op = Op { mem, off, src, imm, signal, pieces, in_order: ctrl, stuck: false };
        let qps = if ctrl { &mut self.ctrl_qps } else { &mut self.data_qps };
        qps[q].ops.push_back(op);
    }

    /// Place one piece somewhere in the network; false when nothing is in flight.
    fn deliver(&mut self) -> bool {
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
        let window = if adaptive && !ctrl { qp.ops.iter().position(|o| o.imm.is_some()).map_or(qp.ops.len(), |i| i + 1) } else { 1 };
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
            if let Some(req) = op.signal {
                self.send_cq.push_back(req);
            }
        }
        true
    }
}

// ---------------------------------------------------------------------------------------------
// The two shells, doing what the verbs transport's shells do with simulated memory.

fn fill(id: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (id.wrapping_mul(131) ^ i.wrapping_mul(7) ^ (i >> 8)) as u8 | 1).collect()
}

struct Send {
    eng: SendEngine,
    /// (message id, group, buffer) in posting order; next to post.
    queue: Vec<(usize, usize, usize)>,
    next: usize,
    /// In flight: (req, message id, arena offset, size, ready).
    inflight: Vec<(u16, usize, usize, usize, usize)>,
    offs: Vec<usize>,
    local: Vec<(usize, usize)>,
    /// Bytes of each message readable so far.
    ready: Vec<usize>,
    steps: [RdvStep; MAX_QPS],
    dead: bool,
}

struct Recv {
    eng: RecvEngine,
    next: usize,
    /// In flight: (req, group, arena offsets).
    inflight: Vec<(u16, usize, Vec<usize>)>,
    /// Eager copies not yet done: (ring slot, dst, len).
    copies: VecDeque<(usize, u64, usize)>,
    done: usize,
    dead: bool,
}

#[derive(Debug)]
enum Fault {
    Proto(ProtoError),
    Check(String),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Fault::Proto(e) => write!(f, "protocol error {e:?}"),
            Fault::Check(m) => write!(f, "check failed: {m}"),
        }
    }
}

impl From<ProtoError> for Fault {
    fn from(e: ProtoError) -> Fault {
        Fault::Proto(e)
    }
}

type Res<T> = Result<T, Fault>;

fn check(ok: bool, msg: impl FnOnce() -> String) -> Res<()> {
    if ok {
        Ok(())
    } else {
        Err(Fault::Check(msg()))
    }
}

impl Send {
    fn read_cts(&mut self, sim: &Sim) -> Res<()> {
        while let Some((slot, want)) = self.eng.cts_wanted() {
            let at = |r: usize| -> Cts {
                let o = (slot * MAX_GROUP + r) * 32;
                let b = &sim.fifo[o..o + 32];
                let u64_ = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
                let u32_ = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
                Cts { addr: u64_(0), size_n: u64_(8), rkey: u32_(16), tag: u32_(20) as i32, base: u32_(24), stamp: u32_(28) }
            };
            let mut g = [Cts::default(); MAX_GROUP];
            g[0] = at(0);
            if (g[0].stamp.wrapping_sub(want) as i32) < 0 {
                break;
            }
            let n = g[0].n().clamp(1, MAX_GROUP);
            for (r, e) in g.iter_mut().enumerate().take(n).skip(1) {
                *e = at(r);
            }
            if !self.eng.on_cts(&g[..n])? {
                break;
            }
        }
        Ok(())
    }

    fn post_rdv(&mut self, sim: &mut Sim, req: u16, ready: usize) {
        let k = self.eng.rdv_steps(req, ready, &mut self.steps);
        let t = self.eng.target(req);
        let (data, _) = self.local[req as usize];
        for s in &self.steps[..k] {
            let dst = (t.addr - RECV_BASE) as usize;
            let close_imm = s.close.map(|_| t.imm);
            match (s.data, s.close) {
                (Some((off, len)), Some(Close::OnData)) => {
                    sim.post(false, s.q, (Mem::Arena, dst + off), vec![Src::SendArena { off: data + off, len }], close_imm, Some(req))
                }
                (Some((off, len)), _) => sim.post(false, s.q, (Mem::Arena, dst + off), vec![Src::SendArena { off: data + off, len }], None, None),
                _ => {}
            }
            match s.close {
                Some(Close::Size) => {
                    let w = (t.size as u64).to_le_bytes().to_vec();
                    sim.post(false, s.q, (Mem::Sizes, t.sizes_off as usize), vec![Src::Inline(w)], close_imm, Some(req))
                }
                Some(Close::Empty) => sim.post(false, s.q, (Mem::Ring, 0), vec![], close_imm, Some(req)),
                _ => {}
            }
        }
    }

    fn progress(&mut self, sim: &mut Sim) {
        for _ in 0..16 {
            let Some(req) = sim.send_cq.pop_front() else { break };
            self.eng.on_completion(req);
        }
    }

    /// One isend attempt for the next message.
    fn try_post(&mut self, sim: &mut Sim, msgs: &[Msg]) -> Res<()> {
        let (id, _, _) = self.queue[self.next];
        let m = &msgs[id];
        let credit = u64::from_le_bytes(sim.fifo[FIFO_BYTES..FIFO_BYTES + 8].try_into().unwrap());
        self.eng.on_credit(credit);
        if m.send > self.eng.eager_max() {
            self.read_cts(sim)?;
        }
        let off = self.offs[id];
        // The staging engine's copy: a part of a large send readable at first, more at each call.
        if self.ready[id] < m.send {
            self.ready[id] = (self.ready[id] + sim.rng.below(m.send + 1)).min(m.send);
        }
        let ready = self.ready[id];
        match self.eng.post(m.send, m.send_tag, ready)? {
            SendPlan::Busy => self.progress(sim),
            SendPlan::Announce { ring_slot, hdr, .. } => {
                let h = hdr_bytes(&hdr);
                sim.post(false, 0, (Mem::Ring, ring_slot * sim.slot_bytes), vec![Src::Inline(h)], Some(Imm::Eager(ring_slot as u32).encode()), None);
                self.progress(sim);
            }
            SendPlan::Eager { req, ring_slot, hdr } => {
                let h = hdr_bytes(&hdr);
                let inline = EAGER_HDR + m.send <= 256 && sim.rng.chance(70);
                let (src, signal) = if inline {
                    let mut b = h;
                    b.extend_from_slice(&sim.send_arena[off..off + m.send]);
                    (vec![Src::Inline(b)], None)
                } else {
                    let ho = req as usize * EAGER_HDR;
                    sim.hdrs[ho..ho + EAGER_HDR].copy_from_slice(&h);
                    (vec![Src::SendHdrs { off: ho, len: EAGER_HDR }, Src::SendArena { off, len: m.send }], Some(req))
                };
                sim.post(false, 0, (Mem::Ring, ring_slot * sim.slot_bytes), src, Some(Imm::Eager(ring_slot as u32).encode()), signal);
                if inline {
                    self.eng.on_completion(req);
                }
                self.inflight.push((req, id, off, m.send, m.send));
                self.next += 1;
            }
            SendPlan::Rdv { req, target } => {
                check(target.size == m.send, || format!("rendezvous target of {} bytes for a send of {}", target.size, m.send))?;
                self.local[req as usize] = (off, 0);
                self.post_rdv(sim, req, ready);
                self.inflight.push((req, id, off, m.send, ready));
                self.next += 1;
            }
        }
        Ok(())
    }

    /// NCCL's test on one request in flight (and the staging engine's copy moving on).
    fn test_one(&mut self, sim: &mut Sim) -> Res<()> {
        let i = sim.rng.below(self.inflight.len());
        let (req, id, off, size, ready) = self.inflight[i];
        if ready < size {
            let more = (ready + 1 + sim.rng.below(size)).min(size);
            self.inflight[i].4 = more;
            if self.eng.rdv_open(req) {
                self.post_rdv(sim, req, more);
            }
        }
        if self.eng.waiting(req as u32)? {
            self.progress(sim);
        }
        if let Some(got) = self.eng.take(req as u32)? {
            check(got == size, || format!("send {id} reported {got} bytes, sent {size}"))?;
            check(self.inflight[i].4 == size, || format!("send {id} completed with only {} of {size} bytes readable", self.inflight[i].4))?;
            // The application reuses the buffer at once: a byte the NIC had not placed yet is wrong now.
            sim.send_arena[off..off + size].fill(REUSED);
            self.inflight.swap_remove(i);
        }
        Ok(())
    }
}

fn hdr_bytes(h: &EagerHdr) -> Vec<u8> {
    let mut b = Vec::with_capacity(EAGER_HDR);
    b.extend_from_slice(&h.seq.to_le_bytes());
    b.extend_from_slice(&h.flags.to_le_bytes());
    b.extend_from_slice(&h.size.to_le_bytes());
    b.extend_from_slice(&h.tag.to_le_bytes());
    b.resize(EAGER_HDR, 0);
    b
}

fn read_hdr(b: &[u8]) -> EagerHdr {
    EagerHdr {
        seq: u32::from_le_bytes(b[0..4].try_into().unwrap()),
        flags: u32::from_le_bytes(b[4..8].try_into().unwrap()),
        size: u64::from_le_bytes(b[8..16].try_into().unwrap()),
        tag: i32::from_le_bytes(b[16..20].try_into().unwrap()),
        _pad: [0; 3],
    }
}

fn cts_bytes(c: &Cts) -> Vec<u8> {
    let mut b = Vec::with_capacity(32);
    b.extend_from_slice(&c.addr.to_le_bytes());
    b.extend_from_slice(&c.size_n.to_le_bytes());
    b.extend_from_slice(&c.rkey.to_le_bytes());
    b.extend_from_slice(&c.tag.to_le_bytes());
    b.extend_from_slice(&c.base.to_le_bytes());
    b.extend_from_slice(&c.stamp.to_le_bytes());
    b
}

impl Recv {
    fn copy_one(&mut self, sim: &mut Sim) {
        if let Some((slot, dst, len)) = self.copies.pop_front() {
            let s = slot * sim.slot_bytes + EAGER_HDR;
            let bytes = sim.ring[s..s + len].to_vec();
            let d = (dst - RECV_BASE) as usize;
            sim.arena[d..d + len].copy_from_slice(&bytes);
            self.eng.copy_done();
        }
    }

    fn drain(&mut self, sim: &mut Sim) -> Res<()> {
        while let Some(slot) = self.eng.next_eager() {
            let o = slot * sim.slot_bytes;
            let h = read_hdr(&sim.ring[o..o + EAGER_HDR]);
            match self.eng.on_eager(h)? {
                EagerStep::Wait => break,
                EagerStep::Consumed => {}
                EagerStep::Copy { dst, len, .. } => {
                    self.copies.push_back((slot, dst, len));
                    if !sim.cfg.async_copy {
                        self.copy_one(sim);
                    }
                }
            }
        }
        if let Some(word) = self.eng.credit_due() {
            sim.post(true, 0, (Mem::Fifo, FIFO_BYTES), vec![Src::Inline(word.to_le_bytes().to_vec())], None, None);
        }
        Ok(())
    }

    fn progress(&mut self, sim: &mut Sim) -> Res<()> {
        let mut n = 0;
        while n < 16 {
            let Some(imm) = sim.recv_cq.pop_front() else { break };
            n += 1;
            match Imm::decode(imm) {
                Imm::Eager(_) => self.eng.on_eager_imm(),
                Imm::Rdv { slot, entry } => {
                    let o = (slot as usize * MAX_GROUP + entry as usize) * 8;
                    let size = u64::from_le_bytes(sim.sizes[o..o + 8].try_into().unwrap());
                    self.eng.on_rdv_imm(slot, entry, size)?;
                }
            }
        }
        if n > 0 {
            self.drain(sim)?;
        }
        Ok(())
    }

    fn try_post(&mut self, sim: &mut Sim, offs: &[Vec<usize>]) -> Res<()> {
        let g = self.next;
        let (msgs, _) = &sim.cfg.groups[g];
        let specs: Vec<RecvSpec> = msgs
            .iter()
            .zip(&offs[g])
            .map(|(m, &o)| RecvSpec { addr: RECV_BASE + o as u64, size: m.recv as u64, rkey: 0x77, tag: m.tag, gpu: false })
            .collect();
        match self.eng.post(&specs) {
            RecvPlan::Busy => {}
            RecvPlan::Posted { req, cts } => {
                if let Some(p) = cts {
                    let bytes: Vec<u8> = p.entries[..p.n].iter().flat_map(cts_bytes).collect();
                    sim.post(true, p.q, (Mem::Fifo, p.slot * MAX_GROUP * 32), vec![Src::Inline(bytes)], None, None);
                }
                self.inflight.push((req, g, offs[g].clone()));
                self.next += 1;
                self.drain(sim)?;
            }
        }
        Ok(())
    }

    fn test_one(&mut self, sim: &mut Sim, expect: &[Vec<Vec<u8>>]) -> Res<()> {
        let i = sim.rng.below(self.inflight.len());
        let (req, g) = (self.inflight[i].0, self.inflight[i].1);
        let offs = self.inflight[i].2.clone();
        if self.eng.waiting(req as u32)? {
            self.progress(sim)?;
        }
        let mut sizes = [0usize; MAX_GROUP];
        if let Some(n) = self.eng.take(req as u32, &mut sizes)? {
            let (msgs, _) = &sim.cfg.groups[g];
            check(n == msgs.len(), || format!("receive {g} reported {n} buffers of {}", msgs.len()))?;
            for (b, m) in msgs.iter().enumerate() {
                check(sizes[b] == m.send, || format!("receive {g} buffer {b}: size {} reported, {} sent", sizes[b], m.send))?;
                let got = &sim.arena[offs[b]..offs[b] + m.recv];
                if let Some(at) = (0..m.send).find(|&k| got[k] != expect[g][b][k]) {
                    return Err(Fault::Check(format!(
                        "receive {g} buffer {b} (tag {}, {} of {} bytes) completed with byte {at} wrong: {:#x}, expected {:#x}",
                        m.tag, m.send, m.recv, got[at], expect[g][b][at]
                    )));
                }
                if let Some(at) = (m.send..m.recv).find(|&k| got[k] != POISON) {
                    return Err(Fault::Check(format!("receive {g} buffer {b}: byte {at} beyond the {} sent was written", m.send)));
                }
            }
            self.inflight.swap_remove(i);
            self.done += 1;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The run.

fn run(cfg: Config, seed: u64) -> Result<u64, String> {
    let mut r = Rng(seed ^ 0x5eed);
    let slot_bytes = (EAGER_HDR + cfg.eager_max).next_multiple_of(64);
    // Memory: receive buffers and send buffers, each message its own region.
    let mut msgs = Vec::new();
    let mut queue = Vec::new();
    let mut recv_offs = Vec::new();
    let mut expect = Vec::new();
    let (mut ra, mut sa) = (0usize, 0usize);
    let mut send_offs = Vec::new();
    for (g, (ms, order)) in cfg.groups.iter().enumerate() {
        let mut ro = Vec::new();
        let mut ex = Vec::new();
        for m in ms {
            ro.push(ra);
            ra += m.recv.next_multiple_of(128) + 128;
        }
        for &b in order {
            queue.push((msgs.len(), g, b));
            msgs.push(ms[b].clone());
            send_offs.push(sa);
            sa += ms[b].send + 64;
        }
        for (b, m) in ms.iter().enumerate() {
            let id = queue.iter().find(|q| q.1 == g && q.2 == b).unwrap().0;
            ex.push(fill(id, m.send));
            let _ = m;
        }
        recv_offs.push(ro);
        expect.push(ex);
    }
    let mut send_arena = vec![0u8; sa + 64];
    for (id, m) in msgs.iter().enumerate() {
        send_arena[send_offs[id]..send_offs[id] + m.send].copy_from_slice(&fill(id, m.send));
    }
    let mut fifo = vec![0u8; FIFO_BYTES + 8];
    // The FIFO as a connection that started at `origin.cts` would have it: every slot last written
    // a lap before (a fresh connection's zeros are that, for origin 0).
    for slot in 0..FIFO_DEPTH {
        let idx = cfg.origin.cts + ((slot as u64 + FIFO_DEPTH as u64 - cfg.origin.cts % FIFO_DEPTH as u64) % FIFO_DEPTH as u64);
        let old = (idx + 1) as u32;
        let stale = old.wrapping_sub(FIFO_DEPTH as u32);
        for e in 0..MAX_GROUP {
            let o = (slot * MAX_GROUP + e) * 32 + 28;
            let v = if cfg.origin.cts == 0 { 0 } else { stale };
            fifo[o..o + 4].copy_from_slice(&v.to_le_bytes());
        }
    }
    let mut sim = Sim {
        rng: r.clone(),
        ring: vec![0u8; cfg.ring_slots * slot_bytes],
        sizes: vec![0u8; FIFO_DEPTH * MAX_GROUP * 8],
        arena: vec![POISON; ra + 128],
        fifo,
        send_arena,
        hdrs: vec![0u8; (nccl_net_rivet::proto::send::SEND_REQS + 16) * EAGER_HDR],
        data_qps: (0..cfg.nqps).map(|_| Qp::default()).collect(),
        ctrl_qps: (0..cfg.nqps).map(|_| Qp::default()).collect(),
        recv_cq: VecDeque::new(),
        send_cq: VecDeque::new(),
        slot_bytes,
        steps: 0,
        cfg: cfg.clone(),
    };
    let mut s = Send {
        eng: SendEngine::new(cfg.nqps, RingSpec { slots: cfg.ring_slots, eager_max: cfg.eager_max }, cfg.origin),
        queue,
        next: 0,
        inflight: Vec::new(),
        offs: send_offs,
        local: vec![(0, 0); nccl_net_rivet::proto::send::SEND_REQS],
        ready: msgs.iter().map(|m| if cfg.partial && m.send > cfg.eager_max { r.below(m.send) } else { m.send }).collect(),
        steps: [RdvStep { q: 0, data: None, close: None }; MAX_QPS],
        dead: false,
    };
    let mut v = Recv { eng: RecvEngine::new(cfg.nqps, cfg.ring_slots, cfg.eager_max, cfg.origin), next: 0, inflight: Vec::new(), copies: VecDeque::new(), done: 0, dead: false };
    let ngroups = cfg.groups.len();
    let limit = 400_000 + 2_000 * msgs.len() as u64;
    let mut failed_at = None;
    loop {
        sim.steps += 1;
        if sim.steps > limit {
            let credit = u64::from_le_bytes(sim.fifo[FIFO_BYTES..FIFO_BYTES + 8].try_into().unwrap());
            return Err(format!(
                "no progress after {limit} steps (deadlock): sent {} of {} (next {:?}), {} sends and {} receives in flight, {} of {ngroups} receives done; credit word {credit}, CTS wanted {:?}, {} copies pending, {} ops in flight, receive CQ {}, send CQ {}, sender outstanding {}",
                s.next,
                msgs.len(),
                s.queue.get(s.next).map(|q| &msgs[q.0]),
                s.inflight.len(),
                v.inflight.len(),
                v.done,
                s.eng.cts_wanted(),
                v.copies.len(),
                sim.data_qps.iter().chain(&sim.ctrl_qps).map(|q| q.ops.len()).sum::<usize>(),
                sim.recv_cq.len(),
                sim.send_cq.len(),
                s.eng.outstanding(),
            ));
        }
        if let Some((at, sender)) = cfg.fail {
            if failed_at.is_none() && sim.steps == at {
                // The peer stops: what it had not yet put on the wire never comes.
                // On each of its queue pairs, a prefix of what it posted was on the wire and still
                // completes; the first message after it lands in part or not at all, never
                // completing (RC: nothing completes after a gap), and the rest never comes.
                failed_at = Some(sim.steps);
                let qps = if sender {
                    s.dead = true;
                    &mut sim.data_qps
                } else {
                    v.dead = true;
                    &mut sim.ctrl_qps
                };
                for q in qps.iter_mut() {
                    let cut = sim.rng.below(q.ops.len() + 1);
                    q.ops.truncate(cut);
                    if let Some(last) = q.ops.back_mut().filter(|_| sim.rng.chance(50)) {
                        // Part of it lands; its completion never fires.
                        let keep = sim.rng.below(last.pieces.len());
                        last.pieces.truncate(keep.max(1));
                        last.imm = None;
                        last.signal = None;
                        last.stuck = true; // the rest never comes: the message never ends
                    }
                }
            }
        }
        if let Some(f) = failed_at {
            // The survivor keeps calling for a while (what completes must be right), then learns
            // of the failure (a failed completion or the closed socket) and every call fails.
            if sim.steps > f + 20_000 || (s.dead && v.inflight.is_empty()) || (v.dead && s.inflight.is_empty()) {
                return Ok(sim.steps);
            }
        }
        let res: Res<()> = match sim.rng.below(10) {
            0 | 1 if !s.dead && s.next < msgs.len() && s.inflight.len() < cfg.window => s.try_post(&mut sim, &msgs),
            2 | 3 if !s.dead && !s.inflight.is_empty() => s.test_one(&mut sim),
            4 if !v.dead && v.next < ngroups && v.inflight.len() < cfg.window => v.try_post(&mut sim, &recv_offs),
            5 | 6 if !v.dead && !v.inflight.is_empty() => v.test_one(&mut sim, &expect),
            7 if !v.dead && !v.copies.is_empty() => {
                v.copy_one(&mut sim);
                v.drain(&mut sim)
            }
            _ => {
                if !sim.deliver() && failed_at.is_none() && s.next == msgs.len() && s.inflight.is_empty() && v.inflight.is_empty() && v.next == ngroups {
                    break;
                }
                Ok(())
            }
        };
        if let Err(e) = res {
            return Err(format!("step {}: {e}", sim.steps));
        }
    }
    if v.done != ngroups {
        return Err(format!("only {} of {ngroups} receives completed", v.done));
    }
    let _ = &mut r;
    Ok(sim.steps)
}

fn run_seed(seed: u64) {
    let mut r = Rng(seed);
    let ngroups = 1 + r.below(24);
    let cfg = config(seed, ngroups);
    if let Err(e) = run(cfg.clone(), seed) {
        panic!("schedule failed: {e}\nreplay with RIVET_SIM_SEED={seed}\n{cfg:#?}");
    }
}

fn schedules() -> u64 {
    std::env::var("RIVET_SIM_SCHEDULES").ok().and_then(|v| v.parse().ok()).unwrap_or(3_000)
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 256, failure_persistence: None, ..Default::default() })]
    /// The same runs drawn by proptest, which shrinks a failing one towards fewer receives.
    #[test]
    fn shrinkable_schedules(seed in proptest::prelude::any::<u64>(), ngroups in 1usize..24) {
        let cfg = config(seed, ngroups);
        let r = run(cfg.clone(), seed);
        proptest::prop_assert!(r.is_ok(), "{}\nconfig(seed {seed}, {ngroups} receives): {cfg:#?}", r.unwrap_err());
    }
}

/// Seeded random schedules, split across threads; `RIVET_SIM_SEED` replays one.
#[test]
fn random_schedules() {
    if let Some(seed) = std::env::var("RIVET_SIM_SEED").ok().and_then(|v| v.parse().ok()) {
        run_seed(seed);
        return;
    }
    let n = schedules();
    let threads = std::thread::available_parallelism().map_or(2, |p| p.get()).min(8) as u64;
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let mut i = t;
                while i < n {
                    run_seed(0x1234_5678_9abc_def0 ^ i.wrapping_mul(0x9e37_79b9));
                    i += threads;
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    println!("{n} schedules passed");
}

// ---------------------------------------------------------------------------------------------
// Chosen schedules: mismatches on both paths, and a run long enough to lap every ring.

fn msg(tag: i32, send: usize, recv: usize) -> Msg {
    Msg { tag, send, recv, send_tag: tag }
}

fn chosen(groups: Vec<Vec<Msg>>, eager_max: usize, origin: Origin, seed: u64) -> Result<u64, String> {
    let groups = groups.into_iter().map(|g| {
        let order = (0..g.len()).collect();
        (g, order)
    });
    let cfg = Config {
        nqps: 2,
        ring_slots: 2,
        eager_max,
        origin,
        groups: groups.collect(),
        adaptive: true,
        async_copy: true,
        partial: false,
        fail: None,
        window: 32,
    };
    run(cfg, seed)
}

fn assert_mismatch(r: Result<u64, String>, kinds: &[&str]) {
    let e = r.expect_err("a mismatch must be reported");
    assert!(kinds.iter().any(|k| e.contains(k)), "expected one of {kinds:?}, got: {e}");
}

#[test]
fn a_send_larger_than_its_receive_is_reported() {
    for seed in 0..50 {
        // Into a receive within the eager limit: the receiver reads the announcement.
        assert_mismatch(chosen(vec![vec![msg(0, 2000, 100)]], 1024, Origin::default(), seed), &["RecvTooSmall"]);
        // Into a larger receive: the sender reads its clear-to-send (or the receiver the announcement).
        assert_mismatch(chosen(vec![vec![msg(0, 6000, 5000)]], 1024, Origin::default(), seed), &["SendTooLarge", "RecvTooSmall"]);
        // An eager-only receive followed by a large one: the sender sees the later receive's entry.
        assert_mismatch(
            chosen(vec![vec![msg(0, 2000, 100)], vec![msg(0, 10, 5000)]], 1024, Origin::default(), seed),
            &["SendOverEager", "RecvTooSmall"],
        );
        // Eagerly, a message larger than its receive.
        assert_mismatch(chosen(vec![vec![msg(0, 900, 100)]], 1024, Origin::default(), seed), &["RecvTooSmall"]);
    }
}

#[test]
fn a_tag_no_buffer_has_is_reported() {
    for seed in 0..50 {
        let bad = |send| vec![vec![msg(1, 0, 0), Msg { tag: 2, send, recv: 9000, send_tag: 3 }]];
        assert_mismatch(chosen(bad(10), 1024, Origin::default(), seed), &["RecvTagUnmatched"]);
        assert_mismatch(chosen(bad(5000), 1024, Origin::default(), seed), &["SendTagUnmatched", "RecvTagUnmatched"]);
    }
}

/// 300 receives with large buffers that all get eager sends (their clear-to-send entries are never
/// used, so the FIFO laps while the sender does not look), then large sends: the sender finds its
/// slots a lap ahead and catches up. Sequence numbers and stamps start just below their wrap.
#[test]
fn every_counter_laps_and_wraps() {
    let mut groups: Vec<Vec<Msg>> = (0..300).map(|i| vec![msg(0, i % 40, 5000)]).collect();
    groups.extend((0..20).map(|i| vec![msg(0, 5000 - i, 5000)]));
    groups.extend((0..20).map(|i| vec![msg(0, i * 10, 5000), msg(1, 3000, 3000)]));
    for (seed, origin) in [(1, Origin::default()), (2, Origin { seq: u32::MAX - 100, cts: u32::MAX as u64 - 150 })] {
        chosen(groups.clone(), 1024, origin, seed).unwrap();
    }
}
