//! A schedule's plan: the connection (members, queue pairs, parts, queues, adaptive routing and
//! its threshold, the eager limit, where the counters start, flushes), the messages in grouped
//! receives and which buffers are GPU memory, the fault and what must come of it, all drawn
//! from one seed.

use super::*;
/// The default eager limit (RIVET_IB_EAGER_MAX), and the others schedules draw (the variable
/// takes 0 to 262144).
pub(crate) const EAGER_MAX: usize = 8192;
const EAGER_LIMITS: [usize; 9] = [0, 64, 200, 1024, 8192, 8192, 8192, 65536, 262144];
/// Steps of the schedule per millisecond of the simulated NIC's clock.
pub(crate) const STEPS_PER_MS: u64 = 20;
/// After a side's error, the other side's calls must fail within this many steps (the
/// liveness check's clock is the schedule's: 20 s of it).
pub(crate) const AFTER_ERROR_STEPS: u64 = 400_000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Side {
    Send,
    Recv,
}

#[derive(Clone, Debug)]
pub(crate) enum Fault {
    None,
    /// The links of these queue pairs die at these steps (both ends).
    Links(Vec<(usize, u64)>),
    /// A member's port goes down at `at`, shows it (state DOWN, PORT_ERR) at `shown`, and comes
    /// back at `back`. At 0: down before the comm is made, so setup leaves its queue pairs in
    /// INIT and the comm starts failed over off them (`fuse::born_down`).
    Port { side: Side, member: usize, at: u64, shown: u64, back: Option<u64>, loc_op_err: bool },
    /// The next work request of queue pair `q` of a side after step `at` fails with `status`.
    Fatal { side: Side, q: usize, at: u64, status: u32 },
    /// A side goes away at step `at` (its process exited: its queue pairs and socket gone).
    Gone { side: Side, at: u64 },
    /// The application's mistake: one message (in send order) larger than its buffer, or with
    /// a tag no buffer of its receive has. Both sides must fail naming it.
    Mismatch { msg: usize, what: &'static str },
}

/// A grouped receive: (tag, send size, room) per buffer, and the order of the buffers' sends.
pub(crate) type Group = (Vec<(i32, usize, usize)>, Vec<usize>);

#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) seed: u64,
    /// Members of the sender's device and of the receiver's.
    pub(crate) ls: usize,
    pub(crate) lr: usize,
    pub(crate) nqps: usize,
    pub(crate) nparts: usize,
    pub(crate) depths: Depths,
    pub(crate) ar: bool,
    pub(crate) failover: bool,
    pub(crate) recovery: bool,
    pub(crate) recovery_delay_ms: u64,
    /// Where sequence numbers and clear-to-send indices start (near their wraps in some).
    pub(crate) origin: Origin,
    /// Messages (in send order) sent by parts, as a staged GPU buffer is: the bytes ready when
    /// posted, the rest made ready later (`set_ready`).
    pub(crate) partial: Vec<Option<usize>>,
    /// Receives, each of 1 to 4 buffers: (tag, send size, room) per buffer, and the order of
    /// the buffers' sends.
    pub(crate) groups: Vec<Group>,
    pub(crate) fault: Fault,
    /// Moves to ERR the device refuses (ETIMEDOUT, a busy firmware) before it takes one.
    pub(crate) err_busy: u32,
    /// What may happen besides everything delivered: the comm failing with an error that names
    /// one of these; `must_fail`: once a work request met the fault, it must.
    pub(crate) expect: Option<&'static [&'static str]>,
    pub(crate) must_fail: bool,
    /// RIVET_IB_EAGER_MAX of both sides.
    pub(crate) eager_max: usize,
    /// NCCL_IB_AR_THRESHOLD.
    pub(crate) ar_threshold: usize,
    /// Messages (in send order) whose receive buffer, or send buffer, is GPU memory (its
    /// registration's path GPUDirect).
    pub(crate) recv_gpu: Vec<bool>,
    pub(crate) send_gpu: Vec<bool>,
    /// Flushes on (NCCL_GDR_FLUSH_DISABLE=0): a receive into GPU memory is flushed, as NCCL does,
    /// and its bytes looked at only once the flush is done.
    pub(crate) flush: bool,
    /// Adaptive routing on the fabric, but the ports tell the shells it is off (only to show
    /// that the simulator catches what the shells' split prevents).
    pub(crate) ar_untold: bool,
    /// Only to show the simulator catches them: the shells' flushes off while the NIC's writes
    /// into GPU memory wait for one; the GPU's stream saying a fence is reached before its
    /// copies ran.
    pub(crate) flush_untold: bool,
    pub(crate) gpu_lies: bool,
}

pub(crate) fn size(r: &mut Rng, eager_max: usize) -> usize {
    match r.below(10) {
        0 => 0,
        1..=4 => 1 + r.below(64),
        5..=6 => 1 + r.below(eager_max + 64),
        7..=8 => eager_max + 1 + r.below(256 << 10),
        _ => (1 << 20) + r.below(3 << 20),
    }
}

pub(crate) const STATUSES: [(u32, &str); 4] =
    [(IBV_WC_REM_ACCESS_ERR, "REM_ACCESS_ERR"), (IBV_WC_REM_OP_ERR, "REM_OP_ERR"), (IBV_WC_LOC_PROT_ERR, "LOC_PROT_ERR"), (IBV_WC_REM_INV_REQ_ERR, "REM_INV_REQ_ERR")];

/// The schedule of `seed`: the eager limit, the AR threshold, GPU memory and flushes drawn
/// apart from the rest, so that with the defaults (`plan_at`) a seed draws what it drew before
/// they were.
pub(crate) fn plan(seed: u64) -> Plan {
    let mut r = Rng(seed ^ 0x9e_ca9e);
    let eager_max = r.pick(&EAGER_LIMITS);
    let mut p = plan_at(seed, eager_max);
    // Three queue pairs (uneven over two members) in some of those drawn with four.
    if p.nqps == 4 && r.chance(30) {
        p.nqps = 3;
        p.nparts = p.nparts.min(3);
        match &mut p.fault {
            Fault::Links(dies) => dies.iter_mut().for_each(|d| d.0 %= 3),
            Fault::Fatal { q, .. } => *q %= 3,
            _ => {}
        }
        // A member's failure, or two links', puts three logical queue pairs on one: the minimal
        // queues cannot hold a send's parts then (RIVET_IB_MIN_QUEUES' documented limit).
        if matches!(&p.fault, Fault::Port { .. }) || matches!(&p.fault, Fault::Links(d) if d.len() > 1) {
            p.depths = Depths::DEFAULT;
        }
    }
    // Parts per message as setup makes them: every queue pair (NCCL_IB_SPLIT_DATA_ON_QPS=1), or
    // one per member of the larger side (0).
    if p.nparts == 1 {
        p.nparts = p.ls.max(p.lr).min(p.nqps);
    }
    // Sizes at the edges: the eager limit, the 128-byte split of a message over its parts.
    let split = p.nparts * 128;
    for (bufs, _) in &mut p.groups {
        for b in bufs.iter_mut() {
            if !r.chance(15) {
                continue;
            }
            let edge = r.pick(&[eager_max.saturating_sub(1), eager_max, eager_max + 1, 127, 128, 129, split - 1, split, split + 1]);
            *b = (b.0, edge, edge + (b.2 - b.1));
        }
    }
    p.ar_threshold = r.pick(&[8192, 8192, 0, 4096, 100_000]);
    p.flush = r.chance(50);
    let n = p.msgs();
    // No GPU memory; every receive buffer; some; every buffer of both sides.
    let (rg, sg) = r.pick(&[(0, 0), (100, 0), (40, 30), (100, 100)]);
    p.recv_gpu = (0..n).map(|_| r.chance(rg)).collect();
    // A send by parts is a staged GPU buffer: host memory (the bounce buffer).
    p.send_gpu = (0..n).map(|i| r.chance(sg) && p.partial[i].is_none()).collect();
    // A member down before the comm is made (of a side with another to start on); drawn last.
    let (ls, lr) = (p.ls, p.lr);
    if let Fault::Port { side, at, shown, back, .. } = &mut p.fault {
        let members = if *side == Side::Send { ls } else { lr };
        if members > 1 && r.chance(30) {
            let (was_at, was_back) = (*at, *back);
            *at = 0;
            *shown = 0;
            *back = was_back.map(|b| b - was_at);
        }
    }
    p
}

/// The schedule of `seed` with `eager_max`, host memory only, flushes off, the default AR
/// threshold.
pub(crate) fn plan_at(seed: u64, eager_max: usize) -> Plan {
    let mut r = Rng(seed);
    let kind = r.below(10);
    // A port fault mostly on a fused device (a member to fail over to, to take back later).
    let (ls, lr) = if (5..=6).contains(&kind) && r.chance(80) { r.pick(&[(2, 1), (1, 2), (2, 2)]) } else { r.pick(&[(1, 1), (1, 1), (1, 1), (2, 1), (1, 2), (2, 2)]) };
    let big = ls.max(lr);
    let nqps = r.pick(&[1, 2, 4, 4]).max(big);
    let nparts = if r.chance(50) { 1 } else { nqps };
    let depths = if r.below(3) == 0 { Depths::MIN } else { Depths::DEFAULT };
    let ar = r.chance(33);
    // Traffic that goes on long enough after a port's return for recovery to take it back.
    let msgs = if (5..=6).contains(&kind) { 50 + r.below(30) } else { 20 + r.below(60) };
    let mut groups = Vec::new();
    let mut n = 0;
    while n < msgs {
        let k = if r.chance(70) { 1 } else { 2 + r.below(3) };
        let bufs: Vec<(i32, usize, usize)> = (0..k)
            .map(|b| {
                let s = size(&mut r, eager_max);
                ((groups.len() % 3 * 8 + b) as i32, s, s + r.below(64))
            })
            .collect();
        let mut order: Vec<usize> = (0..k).collect();
        for i in (1..k).rev() {
            order.swap(i, r.below(i + 1));
        }
        groups.push((bufs, order));
        n += k;
    }
    let (any_seq, any_cts) = (r.next() as u32, r.below(1 << 20) as u64);
    let origin = if r.chance(50) {
        Origin::default()
    } else {
        Origin { seq: r.pick(&[0u32, u32::MAX - 3, u32::MAX - 40, any_seq]), cts: r.pick(&[0u64, (u32::MAX - 2) as u64, (u32::MAX as u64) * 3 - 1, any_cts]) }
    };
    let nmsgs: usize = groups.iter().map(|g: &Group| g.0.len()).sum();
    let partial: Vec<Option<usize>> = (0..nmsgs).map(|_| r.chance(15).then(|| r.below(1 << 20))).collect();
    let horizon = (msgs * 10) as u64;
    let mut failover = true;
    let (mut recovery, mut recovery_delay_ms) = (false, 0);
    let mut expect: Option<&'static [&'static str]> = None;
    let mut must_fail = false;
    let fault = match kind {
        2..=4 => {
            // One link, sometimes a second later (with 4 queue pairs and the default queues:
            // the minimal ones cannot hold a send's parts once three logical queue pairs share
            // one); with one queue pair, or failover off, nothing to fail over to.
            failover = !r.chance(10);
            let mut dies = vec![(r.below(nqps), 1 + r.below(horizon as usize) as u64)];
            if nqps == 4 && depths == Depths::DEFAULT && r.chance(50) {
                let q = (dies[0].0 + 1 + r.below(3)) % 4;
                dies.push((q, dies[0].1 + 1 + r.below(horizon as usize / 2) as u64));
            }
            if nqps == 1 || !failover {
                expect = Some(&["RETRY_EXC_ERR"]);
                must_fail = true;
            }
            Fault::Links(dies)
        }
        5..=6 => {
            // A member's port: of a side with two members where there is one.
            let side = match (ls, lr) {
                (2, 1) => Side::Send,
                (1, 2) => Side::Recv,
                _ => r.pick(&[Side::Send, Side::Recv]),
            };
            let members = if side == Side::Send { ls } else { lr };
            // Early enough, and back soon enough, that traffic goes on after it (recovery's
            // checks are 50 ms apart, its delay up to 20 ms: 1,000 and 400 steps).
            let at = 1 + r.below(horizon as usize / 5) as u64;
            let shown = at + if r.chance(50) { 0 } else { r.below(20 * STEPS_PER_MS as usize) as u64 };
            let back = r.chance(75).then(|| shown + STEPS_PER_MS * (5 + r.below(40) as u64));
            recovery = r.chance(80);
            recovery_delay_ms = r.below(20) as u64;
            if members == 1 {
                // Every queue pair of the comm on it: those that carry traffic while it is down
                // fail, and with all of them the comm (those idle until it is back live on).
                expect = Some(&["RETRY_EXC_ERR", "LOC_QP_OP_ERR", "is down"]);
            }
            Fault::Port { side, member: r.below(members), at, shown, back, loc_op_err: r.chance(50) }
        }
        7 => {
            let (status, name) = r.pick(&STATUSES);
            expect = Some(match name {
                "REM_ACCESS_ERR" => &["REM_ACCESS_ERR"],
                "REM_OP_ERR" => &["REM_OP_ERR"],
                "LOC_PROT_ERR" => &["LOC_PROT_ERR"],
                _ => &["REM_INV_REQ_ERR"],
            });
            Fault::Fatal { side: r.pick(&[Side::Send, Side::Recv]), q: r.below(nqps), at: 1 + r.below(horizon as usize) as u64, status }
        }
        8 => Fault::Gone { side: r.pick(&[Side::Send, Side::Recv]), at: 1 + r.below(horizon as usize) as u64 },
        9 if r.chance(50) => {
            expect = Some(&["collective mismatch"]);
            Fault::Mismatch { msg: r.below(nmsgs), what: r.pick(&["size", "tag"]) }
        }
        _ => Fault::None,
    };
    // Drawn last, so that the schedules drawn before it was are the same.
    let err_busy = if r.chance(30) { 1 + r.below(4) as u32 } else { 0 };
    Plan {
        seed,
        ls,
        lr,
        nqps,
        nparts,
        depths,
        ar,
        failover,
        recovery,
        recovery_delay_ms,
        origin,
        partial,
        groups,
        fault,
        expect,
        must_fail,
        err_busy,
        eager_max,
        ar_threshold: 8192,
        recv_gpu: vec![false; nmsgs],
        send_gpu: vec![false; nmsgs],
        flush: false,
        ar_untold: false,
        flush_untold: false,
        gpu_lies: false,
    }
}

impl Plan {
    pub(crate) fn msgs(&self) -> usize {
        self.groups.iter().map(|g| g.0.len()).sum()
    }

    pub(crate) fn describe(&self) -> String {
        format!(
            "seed {:#x}: {}x{} member(s), {} QP(s), {} part(s), {} queues{}{}{}, eager limit {}{}, {} messages ({} by parts, {} into GPU memory, {} from it) in {} receives, fault {:?}{}",
            self.seed,
            self.ls,
            self.lr,
            self.nqps,
            self.nparts,
            if self.depths == Depths::MIN { "minimal" } else { "default" },
            if self.ar { format!(", adaptive routing above {} B", self.ar_threshold) } else { String::new() },
            if self.failover { "" } else { ", failover off" },
            if self.origin == Origin::default() { String::new() } else { format!(", counters from {:?}", self.origin) },
            self.eager_max,
            if self.flush { ", flushes on" } else { "" },
            self.msgs(),
            self.partial.iter().take(self.msgs()).filter(|p| p.is_some()).count(),
            self.recv_gpu.iter().take(self.msgs()).filter(|&&g| g).count(),
            self.send_gpu.iter().take(self.msgs()).filter(|&&g| g).count(),
            self.groups.len(),
            self.fault,
            if self.recovery { format!(", recovery after {} ms", self.recovery_delay_ms) } else { String::new() },
        ) + &if self.err_busy > 0 { format!(", {} move(s) to ERR refused first", self.err_busy) } else { String::new() }
    }

    /// The same schedule with only the first `n` receives.
    pub(crate) fn first(&self, n: usize) -> Plan {
        Plan { groups: self.groups[..n].to_vec(), ..self.clone() }
    }
}


/// The plan of chosen receives (each buffer's send size and room, tags by position, sent in
/// order) on one queue pair without a fault, its interleavings drawn from `seed`.
pub(crate) fn chosen_plan(receives: Vec<Vec<(usize, usize)>>, origin: Origin, seed: u64) -> Plan {
    let groups: Vec<Group> = receives.into_iter().map(|bufs| (bufs.iter().enumerate().map(|(b, &(s, room))| (b as i32, s, room)).collect(), (0..bufs.len()).collect())).collect();
    let n: usize = groups.iter().map(|g| g.0.len()).sum();
    Plan {
        seed,
        ls: 1,
        lr: 1,
        nqps: 1,
        nparts: 1,
        depths: Depths::DEFAULT,
        ar: false,
        failover: true,
        recovery: false,
        recovery_delay_ms: 0,
        origin,
        partial: vec![None; n],
        groups,
        fault: Fault::None,
        expect: None,
        must_fail: false,
        err_busy: 0,
        eager_max: EAGER_MAX,
        ar_threshold: 8192,
        recv_gpu: vec![false; n],
        send_gpu: vec![false; n],
        flush: false,
        ar_untold: false,
        flush_untold: false,
        gpu_lies: false,
    }
}
