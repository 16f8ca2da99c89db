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

use nccl_net_rivet::proto::recv::{CtsPlan, EagerStep, RecvEngine, RecvPlan, RecvSpec};
use nccl_net_rivet::proto::send::{Close, Origin, RdvStep, RingSpec, SendEngine, SendPlan};
use nccl_net_rivet::proto::qps::{QpStates, Recovery, Retry};
use nccl_net_rivet::proto::verbs::{Cts, EagerHdr, Imm, Notice, Resync, EAGER_HDR, FIFO_BYTES, FIFO_DEPTH, MAX_GROUP, MAX_QPS};
use nccl_net_rivet::proto::ProtoError;
use std::collections::VecDeque;


mod shells;
mod rng;
mod world;
use shells::*;
use rng::*;
use world::*;

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
        ctrl_cq: VecDeque::new(),
        slot_bytes,
        steps: 0,
        recv_err: 0,
        send_err: 0,
        to_recv: VecDeque::new(),
        to_send: VecDeque::new(),
        cfg: cfg.clone(),
    };
    let mut eng = SendEngine::new(cfg.nqps, RingSpec { slots: cfg.ring_slots, eager_max: cfg.eager_max }, cfg.origin);
    eng.set_adaptive_routing(cfg.ar.filter(|_| !cfg.ar_unsplit));
    eng.set_parts(cfg.parts);
    let mut s = Send {
        eng,
        queue,
        next: 0,
        inflight: Vec::new(),
        offs: send_offs,
        local: vec![(0, 0); nccl_net_rivet::proto::send::SEND_REQS],
        ready: msgs.iter().map(|m| if cfg.partial && m.send > cfg.eager_max { r.below(m.send) } else { m.send }).collect(),
        steps: [RdvStep { part: 0, q: 0, data: None, close: None }; MAX_QPS],
        dead: false,
        qs: QpStates::new(cfg.nqps, Retry::default(), Recovery::default()),
        inline_copy: vec![None; cfg.ring_slots],
        switching: false,
        part_qp: vec![[0; MAX_QPS]; nccl_net_rivet::proto::send::SEND_REQS],
    };
    let mut reng = RecvEngine::new(cfg.nqps, cfg.ring_slots, cfg.eager_max, cfg.origin);
    reng.set_parts(cfg.parts);
    let mut v = Recv {
        eng: reng,
        next: 0,
        inflight: Vec::new(),
        copies: VecDeque::new(),
        done: 0,
        dead: false,
        credit_inflight: false,
        qs: QpStates::new(cfg.nqps, Retry::default(), Recovery::default()),
    };
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
        // Members that fail, and each side learning of it; the out-of-band notices arriving.
        let now = sim.steps;
        for mf in &cfg.member_fail {
            if now == mf.at {
                sim.kill(mf.qps);
            }
            if mf.send_sees.is_some_and(|d| now == mf.at + d) {
                s.sees_dead(&mut sim, mf.qps);
            }
            if mf.recv_sees.is_some_and(|d| now == mf.at + d) {
                if let Err(e) = v.sees_dead(&mut sim, mf.qps) {
                    return Err(format!("step {now}: {e}"));
                }
            }
            if mf.back.is_some_and(|d| now == mf.at + d) {
                v.ask_back(&mut sim, mf.qps);
            }
        }
        while sim.to_recv.front().is_some_and(|n| n.0 <= now) {
            let (_, n) = sim.to_recv.pop_front().unwrap();
            let r = match n {
                Notice::Fail { dead } => v.sees_dead(&mut sim, dead),
                Notice::Recovered { qps } => {
                    v.on_recovered(&mut sim, qps, true);
                    Ok(())
                }
                Notice::NotRecovered { qps } => {
                    v.on_recovered(&mut sim, qps, false);
                    Ok(())
                }
                n => return Err(format!("step {now}: the receiver got {n:?}")),
            };
            if let Err(e) = r {
                return Err(format!("step {now}: {e}"));
            }
        }
        while sim.to_send.front().is_some_and(|n| n.0 <= now) {
            let (_, n) = sim.to_send.pop_front().unwrap();
            match n {
                Notice::Resync(r) => {
                    if let Err(e) = s.on_resync(&mut sim, &r) {
                        return Err(format!("step {now}: failing over: {e}"));
                    }
                }
                Notice::Recover { qps } => s.on_recover(&mut sim, qps),
                n => return Err(format!("step {now}: the sender got {n:?}")),
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
    if v.eng.dup_parts > 0 {
        return Err(format!("{} rendezvous parts arrived twice (a failover resent what had arrived)", v.eng.dup_parts));
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
        parts: 2,
        ring_slots: 2,
        eager_max,
        origin,
        groups: groups.collect(),
        adaptive: true,
        ar: None,
        ar_unsplit: false,
        async_copy: true,
        partial: false,
        fail: None,
        window: 32,
        member_fail: Vec::new(),
        no_failover: false,
    };
    run(cfg, seed)
}

/// Adaptive routing's hazard, with the engines told (the split) and not told: large writes whose
/// immediate may come before their own data. Split, every schedule passes; unsplit, the
/// simulator sees a receive complete before its data in some of them.
#[test]
fn under_adaptive_routing_no_receive_completes_before_its_data() {
    let mut caught = 0;
    for seed in 0..400u64 {
        let mut cfg = config(seed ^ 0xa4, 1 + (seed as usize % 12));
        cfg.ar = Some([0usize, 100, 4096][seed as usize % 3]);
        cfg.fail = None;
        if let Err(e) = run(cfg.clone(), seed) {
            panic!("adaptive routing, split: {e}\nconfig: {cfg:#?}");
        }
        cfg.ar_unsplit = true;
        if run(cfg, seed).is_err() {
            caught += 1;
        }
    }
    assert!(caught > 0, "without the split (and one credit write at a time) the simulator caught nothing: the hazard is not simulated");
}

/// A fused device's member fails at every step of the protocol (its queue pairs die in both
/// directions: a prefix of what was posted lands, one message in part, acknowledgements lost),
/// seen by either side or both, sometimes twice in a run: every receive completes with every
/// byte right, no part arrives twice, nothing deadlocks. Without the failover (the sender
/// ignores the receiver's account) some schedules lose data or hang: the loss is simulated.
#[test]
fn a_member_failing_at_any_step_loses_and_duplicates_nothing() {
    let before = RESENT.with(|c| c.get());
    let mut failed_without = 0;
    for seed in 0..800u64 {
        let mut cfg = config(seed ^ 0xfa11, 1 + (seed as usize % 16));
        cfg.nqps = 2 + seed as usize % 3;
        cfg.fail = None;
        let mut r = Rng(seed);
        cfg.member_fail = member_failures(&mut r, cfg.nqps, 1500);
        // The first failure at every step from the first to the 3000th, across the seeds.
        let shift = (seed * 37 % 3000) as i64 - cfg.member_fail[0].at as i64;
        for f in &mut cfg.member_fail {
            f.at = (f.at as i64 + shift).max(1) as u64;
        }
        if let Err(e) = run(cfg.clone(), seed) {
            panic!("member failure: {e}\nconfig: {cfg:#?}");
        }
        if seed < 150 {
            cfg.no_failover = true;
            if run(cfg, seed).is_err() {
                failed_without += 1;
            }
        }
    }
    let resent = RESENT.with(|c| c.get()) - before;
    assert!(resent > 100, "only {resent} failovers sent anything again: the path is hardly exercised");
    assert!(failed_without > 10, "without the failover only {failed_without} of 150 schedules failed: the loss is not simulated");
    println!("{resent} failovers sent something again; without them {failed_without} of 150 schedules failed");
}

/// Recovery: a member fails, both sides fail over, and later its port is up again and its queue
/// pairs are taken back (the receiver resets its side and asks, the sender resets its side and
/// moves each logical queue pair home once none of its parts is half posted where it is; the
/// eager messages and credit words stay where they went). Late detections of the old failure
/// (after the take-back) fail the queue pairs over again. Every receive completes right, and no
/// part arrives twice.
#[test]
fn a_member_taken_back_after_a_failover_loses_nothing() {
    let before = RECOVERED.with(|c| c.get());
    let only: Option<u64> = std::env::var("RIVET_SIM_ONLY").ok().and_then(|v| v.parse().ok());
    for seed in 0..600u64 {
        if only.is_some_and(|o| o != seed) {
            continue;
        }
        let mut cfg = config(seed ^ 0xbac4, 4 + (seed as usize % 16));
        cfg.nqps = 2 + seed as usize % 3;
        cfg.fail = None;
        cfg.partial = seed % 2 == 0;
        let mut r = Rng(seed ^ 0x77);
        cfg.member_fail = member_failures(&mut r, cfg.nqps, 800);
        for f in &mut cfg.member_fail {
            f.back = Some(f.back.unwrap_or(1500 + r.below(3000) as u64));
        }
        if let Err(e) = run(cfg.clone(), seed) {
            panic!("member failure and recovery (RIVET_SIM_ONLY={seed}): {e}\nconfig: {cfg:#?}");
        }
    }
    let recovered = RECOVERED.with(|c| c.get()) - before;
    assert!(recovered > 100, "only {recovered} recoveries took queue pairs back: the path is hardly exercised");
    println!("{recovered} recoveries took queue pairs back");
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

/// The same lap after the sender has already read entries (large sends first), with a different
/// number of eager receives in each run: the slot the sender reads next then often holds an entry
/// newer than some it still needs (the last receives, 30 of them outstanding), which it must not
/// skip.
#[test]
fn a_lap_after_the_sender_read_entries_skips_none_it_needs() {
    for seed in 0..24u64 {
        let mut groups: Vec<Vec<Msg>> = (0..5 + seed as usize).map(|i| vec![msg(0, 4000 + i, 5000)]).collect();
        groups.extend((0..580 + 3 * seed as usize).map(|i| vec![msg(0, i % 40, 5000)]));
        groups.extend((0..30).map(|i| vec![msg(0, 5000 - i, 5000)]));
        let origin = if seed % 2 == 0 { Origin::default() } else { Origin { seq: u32::MAX - 300, cts: u32::MAX as u64 - 20 } };
        chosen(groups, 1024, origin, seed).unwrap();
    }
}
