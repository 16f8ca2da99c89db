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
//! - one side going away (its process exited): the other must fail, not hang;
//! - a collective mismatch (a send larger than its buffer, a tag no buffer has): both sides
//!   fail naming it.
//!
//! Besides, the device refuses some moves to ERR for a while (a busy firmware), the counters
//! start near their wraps in half the schedules, and some sends go by parts (as staged GPU
//! buffers do). The plan is drawn in `plan.rs`, the connection made in `pair.rs`, the NIC is
//! `nic.rs` and `seam.rs`, the shells' heap counted in `heap.rs`.
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
use nccl_net_rivet::transport::verbs::fuse;
use nccl_net_rivet::transport::verbs::recv::{self as vrecv, VerbsRecv};
use nccl_net_rivet::transport::verbs::res::{Link, MqpRetry, Part, PathParams, RemoteQp};
use nccl_net_rivet::transport::verbs::send::{self as vsend, Ring, VerbsSend};
use nccl_net_rivet::transport::{Conn, Lent, MrInfo, Path, RecvBuf, MAX_RECVS};
use std::collections::VecDeque;
use std::os::fd::OwnedFd;

mod chosen;
mod gpu;
mod heap;
mod nic;
mod pair;
mod plan;
mod rng;
mod seam;
use heap::*;
use nic::*;
use pair::*;
use plan::*;
use rng::Rng;

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
    /// Eager copies the GPU's stream ran, flush reads done, immediates before their data.
    gpu_copies: usize,
    flushes: usize,
    imm_early: usize,
    /// The receive comm closed while its copies into GPU memory ran (its ring left, freed later:
    /// `reap` at the close itself or later finds them done).
    left: bool,
}

/// Receive `g`'s buffers checked: as many as posted, each with the size sent and every byte
/// right (reported done, and flushed where it is GPU memory with flushes on).
fn check_receive(p: &Plan, g: usize, n: usize, sz: &[usize], id: &[Vec<usize>], roff: &[usize], rmem: &[u8]) -> Result<(), String> {
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
            let gpu = if p.recv_gpu[i] { " (GPU memory)" } else { "" };
            return Err(format!("receive {g} buffer {b} (message {i} of {len} bytes{gpu}) reported done with byte {k} wrong"));
        }
    }
    Ok(())
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
    FAB.with(|f| *f.borrow_mut() = Fabric { rng: Rng(p.seed ^ 0x0f1c_e5ee_d000), err_busy: p.err_busy, ar_threshold: p.ar_threshold, ar_untold: p.ar_untold, gpu_lies: p.gpu_lies, gpu_writes_wait: p.flush, ..Default::default() });
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
    let (smr, rmr) = (mr_of(&smem, skeys, pr.sp, Path::Host), mr_of(&rmem, rkeys_, pr.rp, Path::Host));
    // The buffers in GPU memory: the same arenas, their registrations' path GPUDirect.
    let (smr_gpu, rmr_gpu) = (mr_of(&smem, skeys, pr.sp, Path::Gdr), mr_of(&rmem, rkeys_, pr.rp, Path::Gdr));
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
    let mut gpu = Vec::new();
    for i in 0..msgs {
        let (g, b) = order[i];
        if p.recv_gpu[i] {
            gpu.push((rmem.as_ptr() as usize + roff[i], p.groups[g].0[b].2));
        }
        if p.send_gpu[i] {
            gpu.push((smem.as_ptr() as usize + soff[i], send_of(i).1));
        }
    }
    fab(|f| f.gpu = gpu);
    let (mut next_send, mut next_group) = (0, 0);
    let mut sent: VecDeque<(usize, u32)> = VecDeque::new();
    let mut posted: VecDeque<(usize, u32)> = VecDeque::new();
    // Receives done whose flush is outstanding: (receive, flush request, sizes reported).
    let mut flushing: VecDeque<(usize, u32, [usize; MAX_RECVS])> = VecDeque::new();
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
                qp.reset(QpState::Gone);
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
                    if steps == at {
                        // Its writes into GPU memory land in the end.
                        f.flush_port(port);
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
        if first_error.is_some() && (!send_live || (sent.is_empty() && next_send == msgs)) && (!recv_live || (posted.is_empty() && flushing.is_empty() && next_group == ngroups)) {
            break;
        }
        if let Some(first) = first_error.as_ref().filter(|_| steps - error_at > AFTER_ERROR_STEPS) {
            let waiting = if send_live { format!("the sender, {} sends outstanding", sent.len()) } else { format!("the receiver, {} receives and {} flushes outstanding", posted.len(), flushing.len()) };
            return Err(format!("after the first error ({first}), {waiting}, still had no error {AFTER_ERROR_STEPS} steps later"));
        }
        if steps > 20_000_000 || started.elapsed() > std::time::Duration::from_secs(60) {
            return Err(format!(
                "no end after {steps} steps: {sends_done} of {msgs} sends and {groups_done} of {ngroups} receives done; {} sends, {} receives and {} flushes outstanding; the NIC:{}",
                sent.len(),
                posted.len(),
                flushing.len(),
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
                let mr = if p.send_gpu[i] { &smr_gpu } else { &smr };
                match shell(|| send.isend_partial(buf, tag, Some(mr), rd)) {
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
                let mut bufs: Vec<RecvBuf> = p.groups[g]
                    .0
                    .iter()
                    .enumerate()
                    .map(|(b, &(tag, _, room))| {
                        // SAFETY: the buffer's room in the receive arena, registered, read by
                        // the test only once `test` reports the receive done.
                        let buf = unsafe { Lent::new(rmem.as_mut_ptr().add(roff[id[g][b]]), room) };
                        RecvBuf { buf, tag, mr: Some(if p.recv_gpu[id[g][b]] { rmr_gpu } else { rmr }) }
                    })
                    .collect();
                let recv = pr.recv.as_mut().unwrap();
                match shell(|| recv.irecv(&mut bufs)) {
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
                            posted.pop_front();
                            // GPU memory, flushes on: NCCL flushes the receive (its buffers, the
                            // sizes received) and uses it once the flush is done.
                            let k = p.groups[g].0.len();
                            if p.flush && n == k && (0..k).any(|b| p.recv_gpu[id[g][b]]) {
                                let mut bufs: Vec<RecvBuf> = (0..k)
                                    .map(|b| {
                                        let i = id[g][b];
                                        // SAFETY: the buffer's bytes received, in the receive
                                        // arena, registered; the flush only reads them.
                                        let buf = unsafe { Lent::new(rmem.as_mut_ptr().add(roff[i]), sz[b]) };
                                        RecvBuf { buf, tag: 0, mr: Some(if p.recv_gpu[i] { rmr_gpu } else { rmr }) }
                                    })
                                    .collect();
                                match shell(|| recv.iflush(&mut bufs)) {
                                    Ok(Some(f)) => {
                                        flushing.push_back((g, f, sz));
                                        continue;
                                    }
                                    Ok(None) => {}
                                    Err(e) => {
                                        on_error(p, &format!("iflush of receive {g}"), &e.to_string(), &mut first_error)?;
                                        error_at = steps;
                                        go_away(&mut pr, Side::Recv);
                                        continue;
                                    }
                                }
                            }
                            check_receive(p, g, n, &sz, &id, &roff, &rmem)?;
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
            5 if recv_live && !flushing.is_empty() => {
                let (g, f, sz) = flushing[0];
                let mut fsz = [0usize; MAX_RECVS];
                let recv = pr.recv.as_mut().unwrap();
                match shell(|| recv.test(f, &mut fsz)) {
                    Ok(Some(_)) => {
                        flushing.pop_front();
                        check_receive(p, g, p.groups[g].0.len(), &sz, &id, &roff, &rmem)?;
                        groups_done += 1;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        on_error(p, &format!("test of receive {g}'s flush"), &e.to_string(), &mut first_error)?;
                        error_at = steps;
                        go_away(&mut pr, Side::Recv);
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
    let mut ran = fab(|f| Ran {
        steps,
        failed: f.failed,
        recovered: f.recovered,
        errored: first_error.is_some(),
        heap: PEAK.with(|x| x.get()),
        refused: f.err_refused,
        gpu_copies: f.gpu_copies,
        flushes: f.flushes,
        imm_early: f.imm_early,
        left: false,
    });
    drop(pr);
    // A receive comm closed while its copies into GPU memory ran left its ring: freed once they
    // are done, at a later close or connect (never waited for inside one).
    ran.left = fab(|f| f.gpu_busy > 0);
    if (0..1000).all(|_| nccl_net_rivet::transport::verbs::eager::reap() > 0) {
        return Err("a closed receive comm's copies into GPU memory never finished: its ring is never freed".into());
    }
    Ok(ran)
}

/// The schedule with the fewest receives (its first ones) that still fails, and its error.
fn shrink(p: &Plan) -> Option<(usize, String)> {
    if std::env::var_os("RIVET_SHELL_SIM_SEED").is_some() {
        return None;
    }
    (1..p.groups.len()).find_map(|n| schedule(&p.first(n)).err().map(|e| (n, e)))
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
    let (mut gpu_copied, mut flushed, mut early, mut left) = (0u64, 0u64, 0u64, 0u64);
    let (mut born, mut born_back) = (0u64, 0u64);
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
                gpu_copied += (r.gpu_copies > 0) as u64;
                flushed += (r.flushes > 0) as u64;
                early += (r.imm_early > 0) as u64;
                left += r.left as u64;
                if matches!(p.fault, Fault::Port { at: 0, .. }) && !r.errored {
                    born += 1;
                    born_back += (r.recovered > 0) as u64;
                }
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
        "shell_sim: {ran} schedules (faults: {} none, {} links, {} ports, {} fatal statuses, {} sides gone, {} mismatches); {failed_over} delivered everything through a failover, {recovered} took queue pairs back, {errored} failed as they had to, {waited} delivered everything though the device refused moves to ERR for a while, {gpu_copied} copied eager messages into GPU memory on the GPU's stream, {flushed} flushed receives into GPU memory, {early} saw an immediate before its data, {left} closed a receive comm while its GPU copies ran, {born} started with a member down and delivered everything ({born_back} of them took its queue pairs back); the shells' calls held at most {heap} bytes",
        kinds[0], kinds[1], kinds[2], kinds[3], kinds[4], kinds[5]
    );
    assert!(failed.is_empty(), "{} of {ran} schedule(s) failed:\n{}", failed.len(), failed.join("\n"));
    assert_eq!(ran, seeds.len() as u64, "every schedule ran");
    if one.is_none() && n >= 100 {
        assert!(failed_over * 6 >= n, "only {failed_over} of {n} schedules delivered through a failover: the failover path is not exercised");
        assert!(recovered * 30 >= n, "only {recovered} of {n} schedules took a queue pair back: recovery is not exercised");
        assert!(errored * 10 >= n, "only {errored} of {n} schedules failed as they had to: the error paths are not exercised");
        assert!(waited * 20 >= n, "only {waited} of {n} schedules delivered through refused moves to ERR: the deferred move is not exercised");
        assert!(gpu_copied * 10 >= n, "only {gpu_copied} of {n} schedules copied eager messages into GPU memory: the GPU's copies are not exercised");
        assert!(flushed * 10 >= n, "only {flushed} of {n} schedules flushed a receive: flushes are not exercised");
    }
    if one.is_none() && n >= 1000 {
        assert!(born * 50 >= n, "only {born} of {n} schedules started with a member down: the degraded start is not exercised");
        assert!(born_back * 200 >= n, "only {born_back} of {n} schedules took back the queue pairs of a member down at setup");
    }
}
