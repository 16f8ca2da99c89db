//! The two shells: what the verbs transport's send and receive shells do, with simulated memory
//! instead of the NIC's: events read out of memory and completions into the engines, their
//! answers turned into simulated work requests.

use super::*;
// ---------------------------------------------------------------------------------------------
// The two shells, doing what the verbs transport's shells do with simulated memory.

pub(crate) fn fill(id: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (id.wrapping_mul(131) ^ i.wrapping_mul(7) ^ (i >> 8)) as u8 | 1).collect()
}

pub(crate) struct Send {
    pub(crate) eng: SendEngine,
    /// (message id, group, buffer) in posting order; next to post.
    pub(crate) queue: Vec<(usize, usize, usize)>,
    pub(crate) next: usize,
    /// In flight: (req, message id, arena offset, size, ready).
    pub(crate) inflight: Vec<(u16, usize, usize, usize, usize)>,
    pub(crate) offs: Vec<usize>,
    pub(crate) local: Vec<(usize, usize)>,
    /// Bytes of each message readable so far.
    pub(crate) ready: Vec<usize>,
    pub(crate) steps: [RdvStep; MAX_QPS],
    pub(crate) dead: bool,
    /// The queue pairs as the production shells keep them: failed over, the accounts applied,
    /// and the map of logical queue pairs.
    pub(crate) qs: QpStates,
    /// The bytes of each ring slot's last eager write that went inline (complete when posted:
    /// the application may reuse its buffer), to write again if it is lost.
    pub(crate) inline_copy: Vec<Option<Vec<u8>>>,
    /// Logical queue pairs wait to move back to a queue pair taken back.
    pub(crate) switching: bool,
    /// The queue pair each part of each request slot's rendezvous send was posted on.
    pub(crate) part_qp: Vec<[u8; MAX_QPS]>,
}

pub(crate) struct Recv {
    pub(crate) eng: RecvEngine,
    pub(crate) next: usize,
    /// In flight: (req, group, arena offsets).
    pub(crate) inflight: Vec<(u16, usize, Vec<usize>)>,
    /// Eager copies not yet done: (ring slot, dst, len).
    pub(crate) copies: VecDeque<(usize, u64, usize)>,
    pub(crate) done: usize,
    pub(crate) dead: bool,
    /// Under adaptive routing: a credit write is on the wire (its completion not yet seen).
    pub(crate) credit_inflight: bool,
    /// The queue pairs as the production shells keep them: failed over (and accounted for in a
    /// resync sent), asked back, and the map of logical queue pairs.
    pub(crate) qs: QpStates,
}

thread_local! {
    /// Failovers that sent something again, on this thread (the tests check that the path is
    /// exercised).
    pub(crate) static RESENT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Queue pairs taken back by recovery, on this thread.
    pub(crate) static RECOVERED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A notice's trip over the out-of-band socket: a few hundred steps.
pub(crate) fn oob_delay(sim: &mut Sim) -> u64 {
    sim.steps + 1 + sim.rng.below(400) as u64
}

/// The signal id of a credit write (the receiver's control completions).
pub(crate) const CREDIT_TAG: u16 = 0xc4ed;

#[derive(Debug)]
pub(crate) enum Fault {
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

pub(crate) type Res<T> = Result<T, Fault>;

pub(crate) fn check(ok: bool, msg: impl FnOnce() -> String) -> Res<()> {
    if ok {
        Ok(())
    } else {
        Err(Fault::Check(msg()))
    }
}

impl Send {
    pub(crate) fn read_cts(&mut self, sim: &Sim) -> Res<()> {
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
            // Every entry's own stamp (a group may land entry by entry).
            if g[1..n].iter().any(|e| e.stamp != g[0].stamp) {
                break;
            }
            if std::env::var("RIVET_SIM_TRACE").is_ok() {
                eprintln!("step {}: sender reads slot {slot} want {want}: stamps {:?}", sim.steps, g[..n].iter().map(|e| e.stamp).collect::<Vec<_>>());
            }
            if !self.eng.on_cts(&g[..n])? {
                break;
            }
        }
        Ok(())
    }

    pub(crate) fn post_rdv(&mut self, sim: &mut Sim, req: u16, ready: usize) {
        let has_new = self.eng.rdv_has_new(req, ready);
        let k = self.eng.rdv_steps(req, ready, &mut self.steps);
        // The shell defers a set_ready only when the engine has something to post for it.
        assert_eq!(has_new, k > 0, "rdv_has_new({req}, {ready}) disagrees with rdv_steps ({k} steps)");
        let t = self.eng.target(req);
        let (data, _) = self.local[req as usize];
        for s in &self.steps[..k] {
            let dst = (t.addr - RECV_BASE) as usize;
            let close_imm = s.close.map(|_| t.imm_of(s.part));
            // The completion names the part (as the shell's work request id does).
            let sig = Some(req | (s.part as u16) << 12);
            let pq = self.qs.carrier(s.q);
            self.part_qp[req as usize][s.part] = pq as u8;
            match (s.data, s.close) {
                (Some((off, len)), Some(Close::OnData)) => {
                    sim.post(false, pq, (Mem::Arena, dst + off), vec![Src::SendArena { off: data + off, len }], close_imm, sig)
                }
                (Some((off, len)), _) => sim.post(false, pq, (Mem::Arena, dst + off), vec![Src::SendArena { off: data + off, len }], None, None),
                _ => {}
            }
            match s.close {
                Some(Close::Size) => {
                    let w = (t.size as u64).to_le_bytes().to_vec();
                    sim.post(false, pq, (Mem::Sizes, t.sizes_off as usize), vec![Src::Inline(w)], close_imm, sig)
                }
                Some(Close::Empty) => sim.post(false, pq, (Mem::Ring, 0), vec![], close_imm, sig),
                _ => {}
            }
        }
    }

    pub(crate) fn progress(&mut self, sim: &mut Sim) {
        for _ in 0..16 {
            let Some(id) = sim.send_cq.pop_front() else { break };
            self.eng.on_completion(id & 0xfff, (id >> 12) as usize);
        }
        if self.switching {
            self.switch_back();
        }
    }

    /// One isend attempt for the next message.
    pub(crate) fn try_post(&mut self, sim: &mut Sim, msgs: &[Msg]) -> Res<()> {
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
                self.inline_copy[ring_slot] = Some(h.clone());
                self.post_eager(sim, ring_slot, vec![Src::Inline(h)], None);
                self.progress(sim);
            }
            SendPlan::Eager { req, ring_slot, hdr } => {
                let h = hdr_bytes(&hdr);
                let inline = EAGER_HDR + m.send <= 256 && sim.rng.chance(70);
                let (src, signal) = if inline {
                    let mut b = h;
                    b.extend_from_slice(&sim.send_arena[off..off + m.send]);
                    self.inline_copy[ring_slot] = Some(b.clone());
                    (vec![Src::Inline(b)], None)
                } else {
                    let ho = req as usize * EAGER_HDR;
                    sim.hdrs[ho..ho + EAGER_HDR].copy_from_slice(&h);
                    self.inline_copy[ring_slot] = None;
                    (vec![Src::SendHdrs { off: ho, len: EAGER_HDR }, Src::SendArena { off, len: m.send }], Some(req))
                };
                self.post_eager(sim, ring_slot, src, signal);
                if inline {
                    self.eng.on_completion(req, 0);
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

    /// One eager ring write on part 0's queue pair (under adaptive routing above its threshold,
    /// the header and payload, then the immediate alone).
    fn post_eager(&mut self, sim: &mut Sim, ring_slot: usize, src: Vec<Src>, signal: Option<u16>) {
        let len: usize = src.iter().map(|s| match s {
            Src::Inline(b) => b.len(),
            Src::SendArena { len, .. } | Src::SendHdrs { len, .. } => *len,
        }).sum();
        let imm = Some(Imm::Eager(ring_slot as u32).encode());
        let q = self.qs.carrier(0);
        if self.eng.ar_split(len) {
            sim.post(false, q, (Mem::Ring, ring_slot * sim.slot_bytes), src, None, None);
            sim.post(false, q, (Mem::Ring, 0), vec![], imm, signal);
        } else {
            sim.post(false, q, (Mem::Ring, ring_slot * sim.slot_bytes), src, imm, signal);
        }
    }

    /// This side found queue pairs dead (a failed completion, PORT_ERR): it tells the receiver,
    /// whose resync says what to send again.
    pub(crate) fn sees_dead(&mut self, sim: &mut Sim, mask: u32) {
        let new = mask & !self.qs.dead();
        if new == 0 {
            return;
        }
        // In ERR from now on: nothing more goes out on them or arrives through them (a live one
        // found failed late, after it was taken back, dies here).
        sim.err(false, new);
        self.qs.fail(new);
        self.qs.failed_over(new, sim.steps);
        let at = oob_delay(sim);
        // Only the new ones: naming one failed over before could undo a take-back under way.
        sim.to_recv.push_back((at, Notice::Fail { dead: new }));
    }

    /// The receiver's account: the queue pairs it names and this side has not yet failed over
    /// are drained (every completion they will give is in), their parts (the logical queue
    /// pairs mapped onto them) go to the engine, and what it says was lost is posted again on
    /// the queue pairs that live.
    pub(crate) fn on_resync(&mut self, sim: &mut Sim, r: &Resync) -> Res<()> {
        if r.dead & !self.qs.synced() == 0 || sim.cfg.no_failover {
            return Ok(());
        }
        let newly_dead = r.dead & !self.qs.dead();
        self.qs.fail(newly_dead);
        self.qs.failed_over(newly_dead, sim.steps);
        while !sim.send_cq.is_empty() {
            self.progress(sim);
        }
        let nq = sim.cfg.nqps;
        // (Where logical queue pairs were before the map moves: the parts lost went there.)
        let before = *self.qs.map();
        let new = self.qs.send_account(r.dead).expect("a queue pair lives");
        let part_qp = &self.part_qp;
        let resend = self.eng.fail_over(new & (1 << before[0]) != 0, |req, q| new & (1 << part_qp[req as usize][q]) != 0, r)?;
        let parts = (0..nq).filter(|&q| new & (1 << before[q]) != 0).fold(0u32, |m, q| m | 1 << q);
        if std::env::var("RIVET_SIM_TRACE").is_ok() {
            eprintln!("step {}: sender fails over parts {parts:#b}: {resend:?}", sim.steps);
        }
        if !resend.eager.is_empty() || !resend.rdv.is_empty() {
            RESENT.with(|c| c.set(c.get() + 1));
        }
        for (slot, _, hdr, req) in resend.eager {
            match (&self.inline_copy[slot], req) {
                (Some(b), _) => {
                    let b = b.clone();
                    self.post_eager(sim, slot, vec![Src::Inline(b)], None);
                }
                (None, Some(req)) => {
                    let &(_, _, off, size, _) = self.inflight.iter().find(|f| f.0 == req).ok_or_else(|| Fault::Check(format!("eager send {req} to resend is not in flight")))?;
                    let ho = req as usize * EAGER_HDR;
                    sim.hdrs[ho..ho + EAGER_HDR].copy_from_slice(&hdr_bytes(&hdr));
                    self.post_eager(sim, slot, vec![Src::SendHdrs { off: ho, len: EAGER_HDR }, Src::SendArena { off, len: size }], Some(req));
                }
                (None, None) => return Err(Fault::Check(format!("announcement in ring slot {slot} to resend has no copy"))),
            }
        }
        for req in resend.rdv {
            let &(_, _, _, _, ready) = self.inflight.iter().find(|f| f.0 == req).ok_or_else(|| Fault::Check(format!("rendezvous send {req} to resend is not in flight")))?;
            self.post_rdv(sim, req, ready);
        }
        Ok(())
    }

    /// Recovery: the receiver has reset its side of queue pairs `qps`; those this side failed
    /// over are reset here too (the member is back), and their logical queue pairs move home
    /// once none of their parts is half posted where they are.
    pub(crate) fn on_recover(&mut self, sim: &mut Sim, qps: u32) {
        let ok = self.qs.send_may_take_back(qps);
        if std::env::var("RIVET_SIM_TRACE").is_ok() {
            eprintln!("step {}: sender takes back {ok:#b} of {qps:#b} (map {:?})", sim.steps, &self.qs.map()[..sim.cfg.nqps]);
        }
        if ok != 0 {
            RECOVERED.with(|c| c.set(c.get() + 1));
        }
        sim.revive(false, ok);
        self.qs.taken_back(ok);
        self.qs.send_took_back(ok);
        self.switch_back();
        let at = oob_delay(sim);
        sim.to_recv.push_back((at, Notice::Recovered { qps: ok }));
        if qps & !ok != 0 {
            sim.to_recv.push_back((at, Notice::NotRecovered { qps: qps & !ok }));
        }
    }

    pub(crate) fn switch_back(&mut self) {
        self.switching = self.qs.send_home(self.eng.open_parts()).1;
    }

    /// NCCL's test on one request in flight (and the staging engine's copy moving on).
    pub(crate) fn test_one(&mut self, sim: &mut Sim) -> Res<()> {
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

pub(crate) fn hdr_bytes(h: &EagerHdr) -> Vec<u8> {
    let mut b = Vec::with_capacity(EAGER_HDR);
    b.extend_from_slice(&h.seq.to_le_bytes());
    b.extend_from_slice(&h.flags.to_le_bytes());
    b.extend_from_slice(&h.size.to_le_bytes());
    b.extend_from_slice(&h.tag.to_le_bytes());
    b.resize(EAGER_HDR, 0);
    b
}

pub(crate) fn read_hdr(b: &[u8]) -> EagerHdr {
    EagerHdr {
        seq: u32::from_le_bytes(b[0..4].try_into().unwrap()),
        flags: u32::from_le_bytes(b[4..8].try_into().unwrap()),
        size: u64::from_le_bytes(b[8..16].try_into().unwrap()),
        tag: i32::from_le_bytes(b[16..20].try_into().unwrap()),
        _pad: [0; 3],
    }
}

pub(crate) fn cts_bytes(c: &Cts) -> Vec<u8> {
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
    pub(crate) fn copy_one(&mut self, sim: &mut Sim) {
        if let Some((slot, dst, len)) = self.copies.pop_front() {
            let s = slot * sim.slot_bytes + EAGER_HDR;
            let bytes = sim.ring[s..s + len].to_vec();
            let d = (dst - RECV_BASE) as usize;
            sim.arena[d..d + len].copy_from_slice(&bytes);
            self.eng.copy_done();
        }
    }

    pub(crate) fn drain(&mut self, sim: &mut Sim) -> Res<()> {
        while let Some(slot) = self.eng.next_eager() {
            let o = slot * sim.slot_bytes;
            let h = read_hdr(&sim.ring[o..o + EAGER_HDR]);
            if std::env::var("RIVET_SIM_TRACE").is_ok() {
                eprintln!("step {}: receiver reads ring slot {slot}: seq {} flags {} size {}", sim.steps, h.seq, h.flags, h.size);
            }
            // The production shell's straight path (host copies done at once), where it applies.
            if !sim.cfg.async_copy {
                if let Some((dst, len)) = self.eng.eager_straight(&h) {
                    let s = o + EAGER_HDR;
                    let d = (dst - RECV_BASE) as usize;
                    let bytes = sim.ring[s..s + len].to_vec();
                    sim.arena[d..d + len].copy_from_slice(&bytes);
                    continue;
                }
            }
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
        // Under adaptive routing one credit write at a time (the word is one address: an older
        // value placed after a newer one would stand).
        let ar = sim.cfg.ar.is_some() && !sim.cfg.ar_unsplit;
        if ar && self.credit_inflight {
            return Ok(());
        }
        if let Some(word) = self.eng.credit_due() {
            self.post_credit(sim, word);
        }
        Ok(())
    }

    fn post_credit(&mut self, sim: &mut Sim, word: u64) {
        let ar = sim.cfg.ar.is_some() && !sim.cfg.ar_unsplit;
        sim.post(true, self.qs.carrier(0), (Mem::Fifo, FIFO_BYTES), vec![Src::Inline(word.to_le_bytes().to_vec())], None, ar.then_some(CREDIT_TAG));
        self.credit_inflight = ar;
    }

    fn post_cts(&mut self, sim: &mut Sim, p: &CtsPlan) {
        let bytes: Vec<u8> = p.entries[..p.n].iter().flat_map(cts_bytes).collect();
        sim.post(true, self.qs.carrier(p.q), (Mem::Fifo, p.slot * MAX_GROUP * 32), vec![Src::Inline(bytes)], None, None);
    }

    /// Recovery, first half: the port of queue pairs `qps` is up again; those failed over are
    /// reset here and the sender is asked to take them back.
    pub(crate) fn ask_back(&mut self, sim: &mut Sim, qps: u32) {
        let m = qps & self.qs.dead() & !self.qs.asked();
        if m != 0 {
            if std::env::var("RIVET_SIM_TRACE").is_ok() {
                eprintln!("step {}: receiver asks back {m:#b}", sim.steps);
            }
            // Reset here (RTR): they can receive again, and may fail again, from now on.
            sim.revive(true, m);
            self.qs.taken_back(m);
            self.qs.recv_asked(m);
            let at = oob_delay(sim);
            sim.to_send.push_back((at, Notice::Recover { qps: m }));
        }
    }

    /// Recovery, second half: the sender's answer.
    pub(crate) fn on_recovered(&mut self, sim: &mut Sim, qps: u32, yes: bool) {
        let m = qps & self.qs.asked();
        if std::env::var("RIVET_SIM_TRACE").is_ok() {
            eprintln!("step {}: receiver hears {} for {m:#b}", sim.steps, if yes { "Recovered" } else { "NotRecovered" });
        }
        if yes {
            // Not onto one still being taken back (it cannot send yet).
            self.qs.recv_answered(m, 0, sim.steps);
            self.qs.recv_home();
        } else {
            // Back to ERR: the sender never sent on them again.
            sim.err(true, m);
            self.qs.recv_answered(0, m, sim.steps);
        }
    }

    /// Queue pairs found dead (by this side, or in the sender's notice): once every completion
    /// they will give is in, the account goes to the sender, and the clear-to-send groups and
    /// the credit word that may have been lost with them are written again on live ones.
    pub(crate) fn sees_dead(&mut self, sim: &mut Sim, mask: u32) -> Res<()> {
        let new = mask & !self.qs.dead();
        if new == 0 {
            return Ok(());
        }
        // In ERR from now on (as the sender's side).
        sim.err(true, new);
        self.qs.fail(new);
        // Drained: every completion of the dead queue pairs is in.
        while !sim.recv_cq.is_empty() || !sim.ctrl_cq.is_empty() {
            self.progress(sim)?;
        }
        // Not onto one being taken back: it cannot send until the sender has answered.
        assert!(self.qs.recv_drained(new, sim.steps), "a queue pair lives");
        let r = self.eng.resync(self.qs.dead());
        if std::env::var("RIVET_SIM_TRACE").is_ok() {
            eprintln!("step {}: receiver resync {r:?}, cts {:?}", sim.steps, self.eng.cts_outstanding());
        }
        let at = oob_delay(sim);
        sim.to_send.push_back((at, Notice::Resync(r)));
        for (_, p) in self.eng.cts_outstanding() {
            self.post_cts(sim, &p);
        }
        let word = self.eng.credits_sent();
        if word > 0 {
            self.post_credit(sim, word);
        }
        Ok(())
    }

    pub(crate) fn progress(&mut self, sim: &mut Sim) -> Res<()> {
        let mut n = 0;
        // The completions of signaled control writes come on the same CQ as the receives.
        while let Some(tag) = sim.ctrl_cq.pop_front() {
            if tag == CREDIT_TAG {
                self.credit_inflight = false;
            }
            n += 1;
        }
        while n < 16 {
            let Some(imm) = sim.recv_cq.pop_front() else { break };
            n += 1;
            if std::env::var("RIVET_SIM_TRACE").is_ok() {
                eprintln!("step {}: receiver completion {:?}", sim.steps, Imm::decode(imm));
            }
            match Imm::decode(imm) {
                Imm::Eager(_) => self.eng.on_eager_imm(),
                Imm::Rdv { slot, entry, part, size: Some(size) } => self.eng.on_rdv_imm(slot, entry, part, size as u64)?,
                Imm::Rdv { slot, entry, part, size: None } => {
                    let o = (slot as usize * MAX_GROUP + entry as usize) * 8;
                    let size = u64::from_le_bytes(sim.sizes[o..o + 8].try_into().unwrap());
                    self.eng.on_rdv_imm(slot, entry, part, size)?;
                }
            }
        }
        if n > 0 {
            self.drain(sim)?;
        }
        Ok(())
    }

    pub(crate) fn try_post(&mut self, sim: &mut Sim, offs: &[Vec<usize>]) -> Res<()> {
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
                if cts {
                    let p = *self.eng.cts_plan();
                    self.post_cts(sim, &p);
                }
                self.inflight.push((req, g, offs[g].clone()));
                self.next += 1;
                self.drain(sim)?;
            }
        }
        Ok(())
    }

    pub(crate) fn test_one(&mut self, sim: &mut Sim, expect: &[Vec<Vec<u8>>]) -> Res<()> {
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
