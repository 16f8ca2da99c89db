//! The production verbs shells (`VerbsSend`, `VerbsRecv`: the code that runs on a NIC) driven
//! through NCCL's data-path calls (`isend`, `irecv`, `test`) over a simulated NIC (`nic.rs`), in
//! one process, under seeded schedules. A schedule draws a connection (one or two members a
//! side, a fused device's keys per member, 1 to 4 queue pairs, one part per message or one per
//! queue pair, default or minimal queues, adaptive routing or not), 20 to 80 messages from 0
//! bytes to 4 MiB in grouped receives, random interleavings of the two sides' calls and of the
//! NIC's work, and a fault:
//! - none;
//! - a queue pair's link dying (sometimes a second one later): the shells' failover must
//!   deliver everything, or, with nothing to fail over to, the comm must fail naming
//!   RETRY_EXC_ERR;
//! - a member's port going down (its work requests failing with LOC_QP_OP_ERR or
//!   RETRY_EXC_ERR, the port's state and PORT_ERR shown at once or a moment later), sometimes
//!   coming back, with recovery on or off: everything delivered, queue pairs taken back;
//! - a work request failing with an error only a bug causes (REM_ACCESS_ERR, ...): the comm
//!   must fail with that status named;
//! - one side going away (its process exited): the other must fail, not hang.
//!
//! Every receive's sizes and bytes are checked the moment `test` reports it done, every send
//! must complete, nothing the shells post may break a rule of the NIC, the memory the shells
//! allocate inside their calls stays under a bound, and a failure names its seed:
//! `RIVET_SHELL_SIM_SEED=<seed>` replays that schedule, and the failure report gives the fewest
//! messages with which it still fails. `RIVET_SHELL_SIM_SCHEDULES` sets the number of schedules
//! (default 300); `RIVET_SHELL_SIM_VERBOSE=1` prints each one.

use nccl_net_rivet::proto::send::Origin;
use nccl_net_rivet::proto::verbs::{cts_stride, fifo_bytes, FIFO_DEPTH, MAX_GROUP, MAX_MEMBERS, SIZES_ENTRY};
use nccl_net_rivet::sys::ib::*;
use nccl_net_rivet::transport::verbs::conn::{self, members_id, Common, Depths, Settings};
use nccl_net_rivet::transport::verbs::recv::{self as vrecv, VerbsRecv};
use nccl_net_rivet::transport::verbs::res::{Link, MqpRetry, Part, PathParams, RemoteQp};
use nccl_net_rivet::transport::verbs::send::{self as vsend, Ring, VerbsSend};
use nccl_net_rivet::transport::{Conn, Lent, MrInfo, Path, RecvBuf, MAX_RECVS};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::VecDeque;
use std::os::fd::OwnedFd;

mod nic;
#[path = "../sim/rng.rs"]
mod rng;
use nic::*;
use rng::Rng;

// ---------------------------------------------------------------------------------------------
// The memory the shells allocate inside their calls (bounded memory is an invariant).

struct Counting;

thread_local! {
    /// Inside a shell's call (and not inside the simulated NIC): allocations count.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    /// Bytes allocated minus bytes freed inside the shells' calls, and the most it reached.
    static NET: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn count(d: isize) {
    // try_with: a thread's allocations after its thread-locals are gone count for nothing.
    let _ = COUNTING.try_with(|c| {
        if c.get() {
            let _ = NET.try_with(|n| {
                n.set(n.get() + d);
                let _ = PEAK.try_with(|p| p.set(p.get().max(n.get())));
            });
        }
    });
}

// SAFETY: every call goes to the system allocator unchanged; the counting beside it touches only
// const-initialised thread-locals (no allocation of their own).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count(l.size() as isize);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        count(-(l.size() as isize));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        count(new as isize - l.size() as isize);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Run one of the shells' calls with its allocations counted (those of the simulated NIC it
/// calls are not: `fab` turns counting off).
fn shell<T>(f: impl FnOnce() -> T) -> T {
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    r
}

/// `fab` with the NIC's own allocations left out of the shells' count.
fn nic_quiet<T>(f: impl FnOnce() -> T) -> T {
    let was = COUNTING.with(|c| c.replace(false));
    let r = f();
    COUNTING.with(|c| c.set(was));
    r
}

/// The most the shells' calls may hold allocated at once, beyond what they held at the start.
const SHELL_HEAP_BOUND: isize = 1 << 20;

// ---------------------------------------------------------------------------------------------
// A schedule: the connection, the messages, the fault.

const EAGER_MAX: usize = 8192;
/// Steps of the schedule per millisecond of the simulated NIC's clock.
const STEPS_PER_MS: u64 = 20;
/// After a side's error, the other side's calls must fail within this many steps (the
/// liveness check's clock is the schedule's: 20 s of it).
const AFTER_ERROR_STEPS: u64 = 400_000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Send,
    Recv,
}

#[derive(Clone, Debug)]
enum Fault {
    None,
    /// The links of these queue pairs die at these steps (both ends).
    Links(Vec<(usize, u64)>),
    /// A member's port goes down at `at`, shows it (state DOWN, PORT_ERR) at `shown`, and comes
    /// back at `back`.
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
type Group = (Vec<(i32, usize, usize)>, Vec<usize>);

#[derive(Clone, Debug)]
struct Plan {
    seed: u64,
    /// Members of the sender's device and of the receiver's.
    ls: usize,
    lr: usize,
    nqps: usize,
    nparts: usize,
    depths: Depths,
    ar: bool,
    failover: bool,
    recovery: bool,
    recovery_delay_ms: u64,
    /// Where sequence numbers and clear-to-send indices start (near their wraps in some).
    origin: Origin,
    /// Messages (in send order) sent by parts, as a staged GPU buffer is: the bytes ready when
    /// posted, the rest made ready later (`set_ready`).
    partial: Vec<Option<usize>>,
    /// Receives, each of 1 to 4 buffers: (tag, send size, room) per buffer, and the order of
    /// the buffers' sends.
    groups: Vec<Group>,
    fault: Fault,
    /// Moves to ERR the device refuses (ETIMEDOUT, a busy firmware) before it takes one.
    err_busy: u32,
    /// What may happen besides everything delivered: the comm failing with an error that names
    /// one of these; `must_fail`: once a work request met the fault, it must.
    expect: Option<&'static [&'static str]>,
    must_fail: bool,
}

fn size(r: &mut Rng) -> usize {
    match r.below(10) {
        0 => 0,
        1..=4 => 1 + r.below(64),
        5..=6 => 1 + r.below(EAGER_MAX + 64),
        7..=8 => EAGER_MAX + 1 + r.below(256 << 10),
        _ => (1 << 20) + r.below(3 << 20),
    }
}

const STATUSES: [(u32, &str); 4] =
    [(IBV_WC_REM_ACCESS_ERR, "REM_ACCESS_ERR"), (IBV_WC_REM_OP_ERR, "REM_OP_ERR"), (IBV_WC_LOC_PROT_ERR, "LOC_PROT_ERR"), (IBV_WC_REM_INV_REQ_ERR, "REM_INV_REQ_ERR")];

fn plan(seed: u64) -> Plan {
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
                let s = size(&mut r);
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
    Plan { seed, ls, lr, nqps, nparts, depths, ar, failover, recovery, recovery_delay_ms, origin, partial, groups, fault, expect, must_fail, err_busy }
}

impl Plan {
    fn msgs(&self) -> usize {
        self.groups.iter().map(|g| g.0.len()).sum()
    }

    fn describe(&self) -> String {
        format!(
            "seed {:#x}: {}x{} member(s), {} QP(s), {} part(s), {} queues{}{}{}, {} messages ({} by parts) in {} receives, fault {:?}{}",
            self.seed,
            self.ls,
            self.lr,
            self.nqps,
            self.nparts,
            if self.depths == Depths::MIN { "minimal" } else { "default" },
            if self.ar { ", adaptive routing" } else { "" },
            if self.failover { "" } else { ", failover off" },
            if self.origin == Origin::default() { String::new() } else { format!(", counters from {:?}", self.origin) },
            self.msgs(),
            self.partial.iter().take(self.msgs()).filter(|p| p.is_some()).count(),
            self.groups.len(),
            self.fault,
            if self.recovery { format!(", recovery after {} ms", self.recovery_delay_ms) } else { String::new() },
        ) + &if self.err_busy > 0 { format!(", {} move(s) to ERR refused first", self.err_busy) } else { String::new() }
    }

    /// The same schedule with only the first `n` receives.
    fn first(&self, n: usize) -> Plan {
        Plan { groups: self.groups[..n].to_vec(), ..self.clone() }
    }
}

// ---------------------------------------------------------------------------------------------
// A connection of the two production shells over the simulated NIC.

/// The keys of one registration on each of `ports`.
type Keys = [(u32, u32); MAX_MEMBERS];

/// `len` bytes registered on each of `ports` (remote access as given).
fn registered(len: usize, access: u32, ports: &[usize]) -> (Vec<u8>, Keys) {
    let v = vec![0u8; len.max(64)];
    let mut keys = [(0, 0); MAX_MEMBERS];
    for (m, &p) in ports.iter().enumerate() {
        let k = fab(|f| f.register(v.as_ptr() as usize, v.len(), access | IBV_ACCESS_LOCAL_WRITE, p));
        keys[m] = (k, k);
    }
    (v, keys)
}

/// `lens` pieces of one registration on each of `ports`, each 64 bytes apart, as
/// `RegBuf::carve` makes them.
fn carve<const N: usize>(lens: [usize; N], access: u32, ports: &[usize]) -> (Vec<Line>, [Part; N]) {
    let mut offs = [0usize; N];
    let mut end = 0;
    for (o, l) in offs.iter_mut().zip(lens) {
        *o = end;
        end = (end + l).next_multiple_of(64);
    }
    let mut v = vec![Line([0; 64]); end.div_ceil(64).max(1)];
    let mut keys = [(0u32, 0u32); MAX_MEMBERS];
    for (m, &p) in ports.iter().enumerate() {
        let k = fab(|f| f.register(v.as_ptr() as usize, v.len() * 64, access | IBV_ACCESS_LOCAL_WRITE, p));
        keys[m] = (k, k);
    }
    let base = v.as_mut_ptr() as *mut u8;
    // SAFETY: each piece is inside the vector, whose heap memory stays put (and registered) for
    // as long as the comm that owns the vector lives.
    let parts = std::array::from_fn(|i| unsafe { Part::from_raw(base.add(offs[i]), lens[i], keys) });
    (v, parts)
}

fn rkeys(p: &Part, members: usize) -> [u32; MAX_MEMBERS] {
    std::array::from_fn(|m| if m < members { p.rkey_on(m) } else { 0 })
}

struct Pair {
    send: Option<VerbsSend<SimNic>>,
    recv: Option<VerbsRecv<SimNic>>,
    /// The queue pairs of each side, and each side's ports (fabric indices and the shells' own).
    sqps: Vec<usize>,
    rqps: Vec<usize>,
    sports: Vec<usize>,
    rports: Vec<usize>,
    sp: &'static [&'static SimPort],
    rp: &'static [&'static SimPort],
}

fn ports(n: usize, side: &str, ar: bool, loc_op_err: bool) -> (Vec<usize>, &'static [&'static SimPort]) {
    let idx: Vec<usize> = (0..n).map(|_| fab(|f| f.new_port(ar, loc_op_err))).collect();
    let ps: Vec<&'static SimPort> = idx.iter().map(|&i| &*Box::leak(Box::new(SimPort { name: format!("sim{side}{i}"), idx: i }))).collect();
    (idx, Box::leak(ps.into_boxed_slice()))
}

fn pair(p: &Plan) -> Pair {
    let loc_op_err = matches!(p.fault, Fault::Port { loc_op_err: true, .. });
    let (sports, sp) = ports(p.ls, "s", p.ar, loc_op_err);
    let (rports, rp) = ports(p.lr, "r", p.ar, loc_op_err);
    let depths = p.depths;
    let set = Settings {
        depths,
        failover: p.failover,
        recovery: p.recovery,
        recovery_delay_ms: p.recovery_delay_ms,
        recovery_attempts: 3,
        return_async_events: true,
        ar_threshold: 8192,
        flush_disable: true,
        stats: false,
        origin: p.origin,
        // net_ib's defaults.
        mqp_retry: MqpRetry { all: false, count: 34, sleep_ms: 100 },
    };
    let on = |m: usize, members: usize| (0..p.nqps).filter(|&q| q % members == m).count() as u32;
    let scqs: Vec<usize> = (0..p.ls).map(|m| fab(|f| f.new_cq(depths.send_cq(on(m, p.ls)) as usize))).collect();
    let rcqs: Vec<usize> = (0..p.lr).map(|m| fab(|f| f.new_cq(depths.recv_cq(on(m, p.lr)) as usize))).collect();
    let sqps: Vec<usize> = (0..p.nqps).map(|q| fab(|f| f.new_qp(scqs[q % p.ls], sports[q % p.ls], depths.send_sq as usize, 0))).collect();
    let rqps: Vec<usize> =
        (0..p.nqps).map(|q| fab(|f| f.new_qp(rcqs[q % p.lr], rports[q % p.lr], depths.recv_sq as usize, depths.recv_rq as usize))).collect();
    fab(|f| {
        for (&s, &r) in sqps.iter().zip(&rqps) {
            f.qps[s].peer = Some(r);
            f.qps[r].peer = Some(s);
            // Setup posts the receives before the sender learns the QPNs.
            for _ in 0..depths.recvs_posted() {
                f.qps[r].rq.push_back(conn::RECV_WR_ID);
            }
        }
    });
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    let peer: std::net::SocketAddr = "10.0.0.2:4000".parse().unwrap();
    let qpn = |qs: &[usize]| -> Vec<u32> { qs.iter().map(|q| fab(|f| f.qps[*q].qpn)).collect() };
    // The sender's memory: what the receiver writes, and what only its own work requests read.
    let (mut s_remote, [fifo]) = carve([fifo_bytes(p.lr) + 64], IBV_ACCESS_REMOTE_WRITE, &sports);
    // The FIFO as a connection that started at `origin.cts` has it: every entry last written a
    // lap before (a fresh connection's zeros are that, for origin 0).
    if p.origin.cts != 0 {
        let stride = cts_stride(p.lr);
        let bytes = s_remote.as_mut_ptr() as *mut u8;
        for slot in 0..FIFO_DEPTH {
            let k = FIFO_DEPTH as u64;
            let idx = p.origin.cts + (slot as u64 + k - p.origin.cts % k) % k;
            let stale = ((idx + 1) as u32).wrapping_sub(FIFO_DEPTH as u32);
            for e in 0..MAX_GROUP {
                let at = (slot * MAX_GROUP + e) * stride + stride - 4;
                // SAFETY: inside the FIFO piece (FIFO_DEPTH * MAX_GROUP entries of `stride`
                // bytes at the start of the vector), nothing reads it yet.
                unsafe { (bytes.add(at) as *mut u32).write_unaligned(stale) };
            }
        }
    }
    let (s_local, [sizes_out, hdrs]) = carve([FIFO_DEPTH * SIZES_ENTRY, conn::HDRS_BYTES], 0, &sports);
    let (r_remote, [ring, sizes_in]) =
        carve([conn::RING_SLOTS * conn::slot_bytes(EAGER_MAX), FIFO_DEPTH * SIZES_ENTRY], IBV_ACCESS_REMOTE_WRITE, &rports);
    let (r_local, [cts_out, scratch]) = carve([vrecv::cts_stage_bytes(p.lr), 64], 0, &rports);
    // What setup learns of each queue pair's far end (recovery reconnects to it).
    let links = |peers: &[usize]| -> Vec<Link> {
        peers
            .iter()
            .map(|q| Link {
                remote: RemoteQp { qpn: fab(|f| f.qps[*q].qpn), lid: 0, gid: [0; 16], mtu: 5, global: true },
                params: PathParams { mtu: 5, tc: 0, sl: 0, timeout: 20, retry_cnt: 7, rnr_retry: 7 },
                access: IBV_ACCESS_REMOTE_WRITE,
                pkey_index: 0,
                ece: None,
            })
            .collect()
    };
    let sc = Common::<SimNic>::new(sp, peer, OwnedFd::from(a), &qpn(&sqps), links(&rqps), set);
    let rc = Common::<SimNic>::new(rp, peer, OwnedFd::from(b), &qpn(&rqps), links(&sqps), set);
    let ring_spec = Ring { addr: ring.addr(), rkeys: rkeys(&ring, p.lr), slots: conn::RING_SLOTS, eager_max: EAGER_MAX };
    let send = VerbsSend::new(
        sc,
        sqps.clone(),
        scqs,
        [s_remote, s_local],
        vsend::Parts { fifo, sizes_out, hdrs },
        (sizes_in.addr(), rkeys(&sizes_in, p.lr)),
        ring_spec,
        p.lr,
        p.nparts,
    );
    let fifo_keys = rkeys(&fifo, p.ls);
    let recv = VerbsRecv::new(rc, rqps.clone(), rcqs, [r_remote, r_local], vrecv::Parts { cts_out, sizes_in, ring, scratch }, EAGER_MAX, (fifo.addr(), fifo_keys), p.ls, p.nparts);
    Pair { send: Some(send), recv: Some(recv), sqps, rqps, sports, rports, sp, rp }
}

/// The bytes message `id` carries.
fn pattern(id: usize, len: usize) -> impl Iterator<Item = u8> {
    (0..len).map(move |i| (id.wrapping_mul(131) ^ i.wrapping_mul(7) ^ (i >> 8)) as u8 | 1)
}

fn mr_of(v: &[u8], keys: Keys, ports: &'static [&'static SimPort]) -> MrInfo {
    let mut more = [(0, 0); MAX_MEMBERS - 1];
    more.copy_from_slice(&keys[1..]);
    MrInfo {
        addr: v.as_ptr() as usize,
        len: v.len(),
        lkey: keys[0].0,
        rkey: keys[0].1,
        more_keys: more,
        members: ports.len() as u8,
        access: IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
        dev: members_id(ports),
        path: Path::Host,
        gpu: None,
    }
}

/// What a schedule did, for the totals.
#[derive(Default)]
struct Ran {
    steps: u64,
    /// Work requests that met a failed link or port, queue pairs moved back to RTS, the comm
    /// failing as the schedule expected, the shells' heap at its highest.
    failed: usize,
    recovered: usize,
    errored: bool,
    heap: isize,
    /// Moves to ERR the device refused (a failover that waited for it at later calls).
    refused: u32,
}

/// A side's error: acceptable only where the plan expects one (and it names what it must).
fn on_error(p: &Plan, what: &str, e: &str, first: &mut Option<String>) -> Result<(), String> {
    if first.is_some() {
        // The other side after the first error: any error will do, but for a mismatch of sizes,
        // which the side that finds it tells the other (a notice), the same cause (a tag no
        // buffer has is not told: the other side sees the peer go).
        if matches!(p.fault, Fault::Mismatch { what: "size", .. }) && !e.contains("collective mismatch") {
            return Err(format!("{what} failed after the peer's mismatch without naming it: {e}"));
        }
        return Ok(());
    }
    match p.expect {
        Some(names) if names.iter().any(|n| e.contains(n)) => {
            *first = Some(e.to_string());
            Ok(())
        }
        Some(names) => Err(format!("{what} failed with an error that names none of {names:?}: {e}")),
        None if matches!(p.fault, Fault::Gone { .. } | Fault::Fatal { .. }) => {
            *first = Some(e.to_string());
            Ok(())
        }
        None => Err(format!("{what} failed: {e}")),
    }
}

/// One schedule. Returns what ran, or what went wrong.
fn schedule(p: &Plan) -> Result<Ran, String> {
    FAB.with(|f| *f.borrow_mut() = Fabric { rng: Rng(p.seed ^ 0x0f1c_e5ee_d000), err_busy: p.err_busy, ..Default::default() });
    NET.with(|n| n.set(0));
    PEAK.with(|n| n.set(0));
    let mut rng = Rng(p.seed ^ 0x5eed);
    let mut pr = pair(p);
    let started = std::time::Instant::now();
    let msgs = p.msgs();
    // Each message (in send order): (group, buffer); each buffer's place in the arenas.
    let mut order = Vec::new();
    for (g, (_, o)) in p.groups.iter().enumerate() {
        order.extend(o.iter().map(|&b| (g, b)));
    }
    let mut id = vec![Vec::new(); p.groups.len()];
    for (i, &(g, b)) in order.iter().enumerate() {
        id[g].resize(p.groups[g].0.len(), 0);
        id[g][b] = i;
    }
    if std::env::var_os("RIVET_SHELL_SIM_PLAN").is_some() {
        for (g, (bufs, o)) in p.groups.iter().enumerate() {
            eprintln!("receive {g}: messages {:?}, buffers (tag, size, room) {bufs:?}, sent in order {o:?}", id[g]);
        }
    }
    // What each message's send carries: its size and tag, but for the mismatch a larger size or
    // a tag its receive does not have.
    let send_of = |i: usize| -> (i32, usize) {
        let (g, b) = order[i];
        let (tag, len, room) = p.groups[g].0[b];
        match p.fault {
            Fault::Mismatch { msg, what: "size" } if msg == i => (tag, room + 1 + room / 2),
            Fault::Mismatch { msg, .. } if msg == i => (tag + 100, len),
            _ => (tag, len),
        }
    };
    let total_send: usize = (0..msgs).map(|i| send_of(i).1 + 64).sum();
    let total_recv: usize = order.iter().map(|&(g, b)| p.groups[g].0[b].2 + 64).sum();
    let (mut smem, skeys) = registered(total_send, 0, &pr.sports);
    let (mut rmem, rkeys_) = registered(total_recv, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, &pr.rports);
    rmem.fill(0x5c);
    let (smr, rmr) = (mr_of(&smem, skeys, pr.sp), mr_of(&rmem, rkeys_, pr.rp));
    let (mut soff, mut roff) = (vec![0; msgs], vec![0; msgs]);
    let (mut s, mut r) = (0, 0);
    // Bytes of each send ready (a send by parts: those ready when it is posted; the rest of its
    // buffer is poison until made ready, so that a write of them before is caught).
    let mut ready = vec![0; msgs];
    for (i, &(g, b)) in order.iter().enumerate() {
        let (_, _, room) = p.groups[g].0[b];
        let len = send_of(i).1;
        soff[i] = s;
        roff[i] = r;
        ready[i] = p.partial.get(i).copied().flatten().map_or(len, |k| k % (len + 1));
        for (x, v) in smem[s..s + len].iter_mut().zip(pattern(i, len)).take(ready[i]) {
            *x = v;
        }
        smem[s + ready[i]..s + len].fill(0xee);
        s += len + 64;
        r += room + 64;
    }
    let (mut next_send, mut next_group) = (0, 0);
    let mut sent: VecDeque<(usize, u32)> = VecDeque::new();
    let mut posted: VecDeque<(usize, u32)> = VecDeque::new();
    let (mut sends_done, mut groups_done) = (0, 0);
    let mut first_error: Option<String> = None;
    let mut error_at = 0u64;
    let mut steps = 0u64;
    let ngroups = p.groups.len();
    let go_away = |pr: &mut Pair, side: Side| {
        // A side goes away: its queue pairs destroyed (its peer's packets go nowhere), its
        // socket closed.
        let qs = if side == Side::Send { pr.sqps.clone() } else { pr.rqps.clone() };
        fab(|f| {
            for q in qs {
                let qp = &mut f.qps[q];
                qp.sq.clear();
                qp.flights.clear();
                qp.rq.clear();
                qp.state = QpState::Gone;
                // Its memory goes with it: what its peer has on the wire towards it lands
                // nowhere.
                if let Some(p) = qp.peer {
                    for fl in f.qps[p].flights.iter_mut() {
                        fl.pending.clear();
                    }
                }
            }
        });
        if side == Side::Send {
            pr.send = None;
        } else {
            pr.recv = None;
        }
    };
    loop {
        steps += 1;
        fab(|f| f.now_ms = steps / STEPS_PER_MS);
        match &p.fault {
            Fault::Links(dies) => {
                for &(q, _) in dies.iter().filter(|&&(_, at)| at == steps) {
                    let (a, b) = (pr.sqps[q], pr.rqps[q]);
                    fab(|f| {
                        f.cut[a] = true;
                        f.cut[b] = true;
                    });
                }
            }
            &Fault::Port { side, member, at, shown, back, .. } => {
                let port = if side == Side::Send { pr.sports[member] } else { pr.rports[member] };
                fab(|f| {
                    let pt = &mut f.ports[port];
                    if steps == at {
                        pt.up = false;
                    }
                    if steps == shown {
                        pt.shown_down = true;
                        pt.downs += 1;
                    }
                    if Some(steps) == back {
                        pt.up = true;
                        pt.shown_down = false;
                    }
                });
            }
            &Fault::Fatal { side, q, at, status } if steps == at => {
                let qp = if side == Side::Send { pr.sqps[q] } else { pr.rqps[q] };
                fab(|f| f.fatal = Some((qp, status)));
            }
            &Fault::Gone { side, at } if steps == at => {
                go_away(&mut pr, side);
                first_error.get_or_insert_with(|| format!("the {side:?} side went away"));
                error_at = steps;
            }
            _ => {}
        }
        let send_live = pr.send.is_some();
        let recv_live = pr.recv.is_some();
        // The end: everything delivered; or after an error, the other side failed too, or has
        // nothing it waits for.
        if first_error.is_none() && sends_done == msgs && groups_done == ngroups {
            break;
        }
        if first_error.is_some() && (!send_live || (sent.is_empty() && next_send == msgs)) && (!recv_live || (posted.is_empty() && next_group == ngroups)) {
            break;
        }
        if let Some(first) = first_error.as_ref().filter(|_| steps - error_at > AFTER_ERROR_STEPS) {
            let waiting = if send_live { format!("the sender, {} sends outstanding", sent.len()) } else { format!("the receiver, {} receives outstanding", posted.len()) };
            return Err(format!("after the first error ({first}), {waiting}, still had no error {AFTER_ERROR_STEPS} steps later"));
        }
        if steps > 20_000_000 || started.elapsed() > std::time::Duration::from_secs(60) {
            return Err(format!(
                "no end after {steps} steps: {sends_done} of {msgs} sends and {groups_done} of {ngroups} receives done; {} sends and {} receives outstanding; the NIC:{}",
                sent.len(),
                posted.len(),
                fab(|f| f.dump())
            ));
        }
        match rng.below(8) {
            0 if send_live && next_send < msgs && sent.len() < 16 => {
                let i = next_send;
                let (tag, len) = send_of(i);
                // SAFETY: the message's bytes in the send arena, registered and left alone
                // until the send completes (the arena outlives the pair), but for the bytes made
                // ready later, which the shells may not read before.
                let buf = unsafe { Lent::new(smem.as_mut_ptr().add(soff[i]), len) };
                let send = pr.send.as_mut().unwrap();
                let rd = ready[i];
                match shell(|| send.isend_partial(buf, tag, Some(&smr), rd)) {
                    Ok(Some(slot)) => {
                        sent.push_back((i, slot));
                        next_send += 1;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        on_error(p, &format!("isend of message {i}"), &e.to_string(), &mut first_error)?;
                        error_at = steps;
                        go_away(&mut pr, Side::Send);
                    }
                }
            }
            1 if recv_live && next_group < ngroups && posted.len() < 8 => {
                let g = next_group;
                let bufs: Vec<RecvBuf> = p.groups[g]
                    .0
                    .iter()
                    .enumerate()
                    .map(|(b, &(tag, _, room))| {
                        // SAFETY: the buffer's room in the receive arena, registered, read by
                        // the test only once `test` reports the receive done.
                        let buf = unsafe { Lent::new(rmem.as_mut_ptr().add(roff[id[g][b]]), room) };
                        RecvBuf { buf, tag, mr: Some(rmr) }
                    })
                    .collect();
                let recv = pr.recv.as_mut().unwrap();
                match shell(|| recv.irecv(&bufs)) {
                    Ok(Some(slot)) => {
                        posted.push_back((g, slot));
                        next_group += 1;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        on_error(p, &format!("irecv of receive {g}"), &e.to_string(), &mut first_error)?;
                        error_at = steps;
                        go_away(&mut pr, Side::Recv);
                    }
                }
            }
            2 if send_live => {
                if let Some(&(i, slot)) = sent.front() {
                    let mut sz = [0usize; MAX_RECVS];
                    let send = pr.send.as_mut().unwrap();
                    match shell(|| send.test(slot, &mut sz)) {
                        Ok(Some(_)) => {
                            sent.pop_front();
                            sends_done += 1;
                        }
                        Ok(None) => {}
                        Err(e) => {
                            on_error(p, &format!("test of send {i}"), &e.to_string(), &mut first_error)?;
                            error_at = steps;
                            go_away(&mut pr, Side::Send);
                        }
                    }
                }
            }
            3 if recv_live => {
                if let Some(&(g, slot)) = posted.front() {
                    let mut sz = [0usize; MAX_RECVS];
                    let recv = pr.recv.as_mut().unwrap();
                    match shell(|| recv.test(slot, &mut sz)) {
                        Ok(Some(n)) => {
                            let bufs = &p.groups[g].0;
                            if n != bufs.len() {
                                return Err(format!("receive {g} done with {n} buffer(s); it posted {}", bufs.len()));
                            }
                            for (b, &(_, len, _)) in bufs.iter().enumerate() {
                                let i = id[g][b];
                                if sz[b] != len {
                                    return Err(format!("receive {g} buffer {b} (message {i}) done with {} bytes; {len} were sent", sz[b]));
                                }
                                let got = &rmem[roff[i]..roff[i] + len];
                                if let Some(k) = got.iter().zip(pattern(i, len)).position(|(a, b)| *a != b) {
                                    return Err(format!("receive {g} buffer {b} (message {i} of {len} bytes) reported done with byte {k} wrong"));
                                }
                            }
                            posted.pop_front();
                            groups_done += 1;
                        }
                        Ok(None) => {}
                        Err(e) => {
                            on_error(p, &format!("test of receive {g}"), &e.to_string(), &mut first_error)?;
                            error_at = steps;
                            go_away(&mut pr, Side::Recv);
                        }
                    }
                }
            }
            4 if send_live => {
                // A send by parts: more of it ready (the staging copy went on), posted or not.
                let waiting: Vec<(usize, Option<u32>)> =
                    sent.iter().map(|&(i, slot)| (i, Some(slot))).chain((next_send < msgs).then_some((next_send, None))).filter(|&(i, _)| ready[i] < send_of(i).1).collect();
                if !waiting.is_empty() {
                    let (i, slot) = waiting[rng.below(waiting.len())];
                    let len = send_of(i).1;
                    let to = if rng.chance(30) { len } else { ready[i] + 1 + rng.below(len - ready[i]) };
                    for (x, v) in smem[soff[i]..soff[i] + len].iter_mut().zip(pattern(i, len)).take(to).skip(ready[i]) {
                        *x = v;
                    }
                    ready[i] = to;
                    if let Some(slot) = slot {
                        let send = pr.send.as_mut().unwrap();
                        if let Err(e) = shell(|| send.set_ready(slot, to)) {
                            on_error(p, &format!("set_ready of message {i}"), &e.to_string(), &mut first_error)?;
                            error_at = steps;
                            go_away(&mut pr, Side::Send);
                        }
                    }
                }
            }
            _ => nic_quiet(|| {
                // The NIC: some work of queue pairs picked at random.
                for _ in 0..1 + rng.below(4) {
                    let qs: Vec<usize> = fab(|f| (0..f.qps.len()).filter(|&q| !f.qps[q].sq.is_empty() || !f.qps[q].flights.is_empty()).collect());
                    if qs.is_empty() {
                        break;
                    }
                    let q = rng.pick(&qs);
                    fab(|f| f.step(q));
                }
            }),
        }
        let faults = fab(|f| std::mem::take(&mut f.faults));
        if !faults.is_empty() {
            return Err(format!("the NIC refused what the shells posted: {}", faults.join("; ")));
        }
        let net = NET.with(|n| n.get());
        if net > SHELL_HEAP_BOUND {
            return Err(format!("the shells' calls hold {net} bytes more than at the start (bound {SHELL_HEAP_BOUND})"));
        }
    }
    // A fatal status that met its work request (the schedule reached its step, and it fired)
    // must have failed the comm.
    let fired = matches!(p.fault, Fault::Fatal { at, .. } if at <= steps) && fab(|f| f.fatal.is_none());
    if matches!(p.fault, Fault::Mismatch { msg, .. } if msg < msgs) && first_error.is_none() {
        return Err("everything delivered, though a message did not fit its receive".into());
    }
    if fired && first_error.is_none() {
        return Err(format!("everything delivered, though a work request failed with {:?}", p.expect.unwrap_or(&[])));
    }
    if let (Some(names), None, true) = (p.expect, &first_error, p.must_fail) {
        if fab(|f| f.failed > 0) {
            return Err(format!("everything delivered after a work request met the fault, though the comm should have failed naming one of {names:?}"));
        }
    }
    let ran = fab(|f| Ran { steps, failed: f.failed, recovered: f.recovered, errored: first_error.is_some(), heap: PEAK.with(|x| x.get()), refused: f.err_refused });
    drop(pr);
    Ok(ran)
}

/// The schedule with the fewest receives (its first ones) that still fails, and its error.
fn shrink(p: &Plan) -> Option<(usize, String)> {
    if std::env::var_os("RIVET_SHELL_SIM_SEED").is_some() {
        return None;
    }
    (1..p.groups.len()).find_map(|n| schedule(&p.first(n)).err().map(|e| (n, e)))
}

/// A schedule of chosen receives (each buffer's send size and room, tags by position, sent in
/// order) on one queue pair without a fault, its interleavings drawn from `seed`.
fn chosen(receives: Vec<Vec<(usize, usize)>>, origin: Origin, seed: u64) -> Result<Ran, String> {
    schedule(&chosen_plan(receives, origin, seed))
}

fn chosen_plan(receives: Vec<Vec<(usize, usize)>>, origin: Origin, seed: u64) -> Plan {
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
    }
}

/// A failover whose move to ERR the device refuses past NCCL_IB_MQP_RETRY_CNT (34, 100 ms × n
/// apart: about 60 s of the schedule's clock): the comm fails, saying so, and the sends and
/// receives waiting meanwhile were answered at every call, never held inside one.
#[test]
fn a_move_to_err_refused_past_its_retries_fails_the_comm() {
    let receives: Vec<Vec<(usize, usize)>> = (0..40).map(|i| vec![(if i % 3 == 0 { 20_000 + i } else { 100 + i }, 30_000)]).collect();
    let p = Plan {
        nqps: 2,
        fault: Fault::Links(vec![(1, 40)]),
        expect: Some(&["NCCL_IB_MQP_RETRY_CNT"]),
        must_fail: true,
        err_busy: 1000,
        ..chosen_plan(receives, Origin::default(), 7)
    };
    match schedule(&p) {
        Ok(r) if r.errored => {}
        Ok(_) => panic!("{}: everything delivered though no queue pair could be moved to ERR", p.describe()),
        Err(e) => panic!("{}: {e}", p.describe()),
    }
    let refused = fab(|f| f.err_refused);
    assert_eq!(refused, 35, "the move is tried once and retried NCCL_IB_MQP_RETRY_CNT times");
}

/// 300 receives with buffers above the eager limit that all get eager sends (their
/// clear-to-send entries are never used, so the FIFO laps while the sender does not look), then
/// large sends, then grouped receives of a large and an eager buffer: the sender finds its slots
/// a lap ahead and catches up. In the second run sequence numbers and stamps start just below
/// their wrap.
#[test]
fn every_counter_laps_and_wraps() {
    let big = EAGER_MAX + 1808;
    let mut receives: Vec<Vec<(usize, usize)>> = (0..300).map(|i| vec![(i % 40, big)]).collect();
    receives.extend((0..20).map(|i| vec![(big - i, big)]));
    receives.extend((0..20).map(|i| vec![(i * 10, big), (3000, 3000)]));
    for (seed, origin) in [(1, Origin::default()), (2, Origin { seq: u32::MAX - 100, cts: u32::MAX as u64 - 150 })] {
        if let Err(e) = chosen(receives.clone(), origin, seed) {
            panic!("counters from {origin:?}: {e}");
        }
    }
}

/// The same lap after the sender has read entries (large sends first), with a different number
/// of eager receives in each run: the slot the sender reads next then often holds an entry newer
/// than some it still needs (the last receives, 30 outstanding), which it must not skip.
#[test]
fn a_lap_after_the_sender_read_entries_skips_none_it_needs() {
    let big = EAGER_MAX + 1808;
    for seed in 0..24u64 {
        let mut receives: Vec<Vec<(usize, usize)>> = (0..5 + seed as usize).map(|i| vec![(EAGER_MAX + 1 + i, big)]).collect();
        receives.extend((0..580 + 3 * seed as usize).map(|i| vec![(i % 40, big)]));
        receives.extend((0..30).map(|i| vec![(big - i, big)]));
        let origin = if seed % 2 == 0 { Origin::default() } else { Origin { seq: u32::MAX - 300, cts: u32::MAX as u64 - 20 } };
        if let Err(e) = chosen(receives, origin, seed) {
            panic!("seed {seed}, counters from {origin:?}: {e}");
        }
    }
}

/// Schedules that found bugs of the production shells (docs/testing.md names each), kept as they
/// were drawn: each failed before its fix.
#[test]
fn the_schedules_that_found_bugs_pass() {
    for seed in [0x5eed_00fb, 0x5eed_0a2d, 0x5eed_0a0f, 0x5eed_0ca9] {
        let p = plan(seed);
        if let Err(e) = schedule(&p) {
            panic!("{}: {e}", p.describe());
        }
    }
}

/// `RIVET_SHELL_SIM_LOG=1`: the shells' log lines (INFO and WARN) on stderr, with the step's
/// millisecond of the simulated clock.
struct Logger;

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Info
    }
    fn log(&self, r: &log::Record) {
        let now = FAB.try_with(|f| f.try_borrow().map(|f| f.now_ms).unwrap_or(0)).unwrap_or(0);
        eprintln!("[{now} ms] {} {}", r.level(), r.args());
    }
    fn flush(&self) {}
}

#[test]
fn the_production_shells_deliver_every_byte_over_a_simulated_nic() {
    if std::env::var_os("RIVET_SHELL_SIM_LOG").is_some() {
        let _ = log::set_logger(&Logger).map(|_| log::set_max_level(log::LevelFilter::Info));
    }
    let one: Option<u64> = std::env::var("RIVET_SHELL_SIM_SEED").ok().and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok());
    let n: u64 = std::env::var("RIVET_SHELL_SIM_SCHEDULES").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    let verbose = std::env::var_os("RIVET_SHELL_SIM_VERBOSE").is_some() || one.is_some();
    let seeds: Vec<u64> = match one {
        Some(s) => vec![s],
        None => (0..n).map(|i| 0x5eed_0000 + i).collect(),
    };
    let mut failed = Vec::new();
    let (mut ran, mut failed_over, mut recovered, mut errored, mut heap, mut waited) = (0u64, 0u64, 0u64, 0u64, 0isize, 0u64);
    let mut kinds = [0u64; 6];
    for &seed in &seeds {
        let p = plan(seed);
        ran += 1;
        kinds[match p.fault {
            Fault::None => 0,
            Fault::Links(_) => 1,
            Fault::Port { .. } => 2,
            Fault::Fatal { .. } => 3,
            Fault::Gone { .. } => 4,
            Fault::Mismatch { .. } => 5,
        }] += 1;
        match schedule(&p) {
            Ok(r) => {
                if verbose {
                    println!("{}: {} steps, {} work request(s) met a failure, {} queue pair(s) back to RTS, {}heap {} bytes", p.describe(), r.steps, r.failed, r.recovered, if r.errored { "failed as expected, " } else { "" }, r.heap);
                }
                failed_over += (r.failed > 0 && !r.errored) as u64;
                waited += (r.refused > 0 && !r.errored) as u64;
                recovered += (r.recovered > 0) as u64;
                errored += r.errored as u64;
                heap = heap.max(r.heap);
            }
            Err(e) => {
                let small = match shrink(&p) {
                    Some((k, e2)) => format!("\n    still fails with its first {k} receive(s) of {}: {e2}", p.groups.len()),
                    None => String::new(),
                };
                failed.push(format!("{}: {e}{small}\n    replay: RIVET_SHELL_SIM_SEED={seed:#x} cargo test --test shell_sim", p.describe()));
                if failed.len() >= 3 {
                    break;
                }
            }
        }
    }
    println!(
        "shell_sim: {ran} schedules (faults: {} none, {} links, {} ports, {} fatal statuses, {} sides gone, {} mismatches); {failed_over} delivered everything through a failover, {recovered} took queue pairs back, {errored} failed as they had to, {waited} delivered everything though the device refused moves to ERR for a while; the shells' calls held at most {heap} bytes",
        kinds[0], kinds[1], kinds[2], kinds[3], kinds[4], kinds[5]
    );
    assert!(failed.is_empty(), "{} of {ran} schedule(s) failed:\n{}", failed.len(), failed.join("\n"));
    assert_eq!(ran, seeds.len() as u64, "every schedule ran");
    if one.is_none() && n >= 100 {
        assert!(failed_over * 6 >= n, "only {failed_over} of {n} schedules delivered through a failover: the failover path is not exercised");
        assert!(recovered * 30 >= n, "only {recovered} of {n} schedules took a queue pair back: recovery is not exercised");
        assert!(errored * 10 >= n, "only {errored} of {n} schedules failed as they had to: the error paths are not exercised");
        assert!(waited * 20 >= n, "only {waited} of {n} schedules delivered through refused moves to ERR: the deferred move is not exercised");
    }
}
