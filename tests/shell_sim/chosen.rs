//! Chosen schedules: the cases a random schedule reaches seldom (a move to ERR refused past its
//! retries, reordered placement, GPU memory used too early, counters at their wraps) and the
//! seeds that once found bugs, each run on its own.

use super::*;

/// A schedule of chosen receives (each buffer's send size and room, tags by position, sent in
/// order) on one queue pair without a fault, its interleavings drawn from `seed`.
fn chosen(receives: Vec<Vec<(usize, usize)>>, origin: Origin, seed: u64) -> Result<Ran, String> {
    schedule(&chosen_plan(receives, origin, seed))
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

/// Adaptive routing's hazard (a write's immediate before its own data), with the shells told
/// and not told: told, they split such writes and every schedule passes; not told, the simulator
/// sees a receive reported done before its data (or an eager header read before it landed) in
/// some.
#[test]
fn under_adaptive_routing_no_receive_completes_before_its_data() {
    let (mut caught, mut early) = (0, 0);
    for seed in 0..40u64 {
        let mut p = plan(0xa4_0000 + seed);
        (p.ar, p.fault, p.expect, p.must_fail) = (true, Fault::None, None, false);
        if let Err(e) = schedule(&p) {
            panic!("{}: {e}", p.describe());
        }
        p.ar_untold = true;
        // (Caught as bytes wrong, or as a header read before it landed.)
        caught += schedule(&p).is_err() as usize;
        early += fab(|f| f.imm_early);
    }
    println!("adaptive routing: {early} immediates before their data; the shells not told, {caught} of 40 schedules caught");
    assert!(early > 0, "no immediate came before its data: the hazard is not simulated");
    assert!(caught > 0, "the shells not told of adaptive routing, the simulator caught nothing ({early} immediates before their data)");
}

/// Receives into GPU memory used too early are caught: with the shells' flushes off while the
/// NIC's writes wait for a flush, and with a GPU stream that says a copy finished before it ran,
/// some schedules see bytes wrong (and with both right, every schedule passes).
#[test]
fn a_receive_into_gpu_memory_used_before_its_flush_or_copy_is_caught() {
    let (mut unflushed, mut uncopied) = (0, 0);
    for seed in 0..30u64 {
        let mut p = plan_at(0x6d_0000 + seed, [64, 1024, 8192][seed as usize % 3]);
        (p.fault, p.expect, p.must_fail, p.flush) = (Fault::None, None, false, true);
        p.recv_gpu = vec![true; p.msgs()];
        if let Err(e) = schedule(&p) {
            panic!("{}: {e}", p.describe());
        }
        let bad = |p: &Plan| matches!(schedule(p), Err(e) if e.contains("wrong"));
        unflushed += bad(&Plan { flush_untold: true, ..p.clone() }) as usize;
        uncopied += bad(&Plan { gpu_lies: true, ..p.clone() }) as usize;
    }
    println!("GPU memory: of 30 schedules, {unflushed} caught unflushed, {uncopied} caught before their copies");
    assert!(unflushed > 0 && uncopied > 0, "unflushed {unflushed}, copies not run {uncopied}: the simulator does not see GPU memory used early");
}

/// A receive comm closed (its process going away) while eager copies into GPU memory still run
/// on the GPU's stream: the close does not wait; the ring stays until the copies are done and is
/// freed at a later close, in every schedule.
#[test]
fn a_receive_comm_closed_while_its_gpu_copies_run_leaves_its_ring_until_they_are_done() {
    let mut left = 0;
    for seed in 0..60u64 {
        let mut p = plan_at(0x1e_0000 + seed, 8192);
        p.recv_gpu = vec![true; p.msgs()];
        p.groups = p.groups.iter().map(|(b, o)| (b.iter().map(|&(t, s, r)| (t, s % 4096, r % 4096 + 64)).collect(), o.clone())).collect();
        (p.fault, p.expect, p.must_fail) = (Fault::Gone { side: Side::Recv, at: 100 + 3 * seed }, None, false);
        match schedule(&p) {
            Ok(r) => left += r.left as usize,
            Err(e) => panic!("{}: {e}", p.describe()),
        }
    }
    println!("closed while GPU copies ran: {left} of 60");
    assert!(left > 0, "no receive comm closed while its copies ran: the case is not exercised");
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
        let p = plan_at(seed, EAGER_MAX);
        if let Err(e) = schedule(&p) {
            panic!("{}: {e}", p.describe());
        }
    }
}
