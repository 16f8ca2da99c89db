//! The production verbs shells (`VerbsSend`, `VerbsRecv`: the code that runs on a NIC) driven
//! through NCCL's data-path calls (`isend`, `irecv`, `test`) over a simulated NIC, in one
//! process, under seeded schedules: the simulated NIC implements `nic::Nic` as a NIC would
//! (work requests executed in order per queue pair, queue pairs interleaved at random, keys and
//! ranges checked on every access, a write with an immediate taking a posted receive or waiting
//! for one, completions of signaled work requests only, finite queues). Every receive's bytes
//! and size are checked when `test` reports it done, every send completes, and nothing the
//! shells post breaks a rule of the NIC (an unknown key, a write outside a registration, a send
//! queue beyond its depth, more receives than the queue holds). In half the schedules a queue
//! pair's link dies mid-run (sometimes a second one later), and the shells' own failover must
//! deliver everything all the same.
//!
//! `RIVET_SHELL_SIM_SCHEDULES` sets the number of schedules (default 300);
//! `RIVET_SHELL_SIM_VERBOSE=1` prints each schedule and how many work requests met a dead link.

use nccl_net_rivet::sys::ib::*;
use nccl_net_rivet::transport::verbs::conn::{self, Common, Depths, Settings};
use nccl_net_rivet::transport::verbs::nic::{Nic, NicPort};
use nccl_net_rivet::transport::verbs::recv::{self as vrecv, VerbsRecv};
use nccl_net_rivet::transport::verbs::res::Part;
use nccl_net_rivet::transport::verbs::send::{self as vsend, Ring, VerbsSend};
use nccl_net_rivet::transport::{Conn, Lent, MrInfo, Path, RecvBuf, MAX_RECVS};
use nccl_net_rivet::proto::verbs::{fifo_bytes, FIFO_DEPTH, MAX_MEMBERS, SIZES_ENTRY};
use std::collections::VecDeque;
use std::os::fd::OwnedFd;

mod nic;
#[path = "../sim/rng.rs"]
mod rng;
use nic::*;
use rng::Rng;

// ---------------------------------------------------------------------------------------------
// A connection of the two production shells over the simulated NIC.

const EAGER_MAX: usize = 8192;

/// Registered memory of `len` bytes (remote access as given): the buffer and its key.
fn registered(len: usize, access: u32) -> (Vec<u8>, u32) {
    let v = vec![0u8; len.max(64)];
    let k = fab(|f| f.register(v.as_ptr() as usize, v.len(), access | IBV_ACCESS_LOCAL_WRITE));
    (v, k)
}

/// `lens` pieces of one registration, each 64 bytes apart, as `RegBuf::carve` makes them.
fn carve<const N: usize>(lens: [usize; N], access: u32) -> (Vec<Line>, [Part; N]) {
    let mut offs = [0usize; N];
    let mut end = 0;
    for (o, l) in offs.iter_mut().zip(lens) {
        *o = end;
        end = (end + l).next_multiple_of(64);
    }
    let mut v = vec![Line([0; 64]); end.div_ceil(64).max(1)];
    let k = fab(|f| f.register(v.as_ptr() as usize, v.len() * 64, access | IBV_ACCESS_LOCAL_WRITE));
    let mut keys = [(0u32, 0u32); MAX_MEMBERS];
    keys[0] = (k, k);
    let base = v.as_mut_ptr() as *mut u8;
    // SAFETY: each piece is inside the vector, whose heap memory stays put (and registered) for
    // as long as the comm that owns the vector lives.
    let parts = std::array::from_fn(|i| unsafe { Part::from_raw(base.add(offs[i]), lens[i], keys) });
    (v, parts)
}

struct Pair {
    send: VerbsSend<SimNic>,
    recv: VerbsRecv<SimNic>,
    /// The queue pairs of each side.
    sqps: Vec<usize>,
}

fn pair(nqps: usize, nparts: usize, depths: Depths, failover: bool) -> Pair {
    let port: &'static SimPort = Box::leak(Box::new(SimPort { name: "sim0".into() }));
    let ports: &'static [&'static SimPort] = Box::leak(vec![port].into_boxed_slice());
    let set = Settings {
        depths,
        failover,
        recovery: false,
        recovery_delay_ms: 0,
        recovery_attempts: 0,
        return_async_events: true,
        ar_threshold: 8192,
        flush_disable: true,
        stats: false,
    };
    let (scq, rcq) = fab(|f| (f.new_cq(), f.new_cq()));
    let sqps: Vec<usize> = (0..nqps).map(|_| fab(|f| f.new_qp(scq, depths.send_sq as usize, 0))).collect();
    let rqps: Vec<usize> = (0..nqps).map(|_| fab(|f| f.new_qp(rcq, depths.recv_sq as usize, depths.recv_rq as usize))).collect();
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
    let qpn = |qs: &[usize]| -> Vec<u32> { qs.iter().map(SimNic::qpn).collect() };
    // The sender's memory: what the receiver writes, and what only its own work requests read.
    let (s_remote, [fifo]) = carve([fifo_bytes(1) + 64], IBV_ACCESS_REMOTE_WRITE);
    let (s_local, [sizes_out, hdrs]) = carve([FIFO_DEPTH * SIZES_ENTRY, conn::HDRS_BYTES], 0);
    let (r_remote, [ring, sizes_in]) = carve([conn::RING_SLOTS * conn::slot_bytes(EAGER_MAX), FIFO_DEPTH * SIZES_ENTRY], IBV_ACCESS_REMOTE_WRITE);
    let (r_local, [cts_out, scratch]) = carve([vrecv::cts_stage_bytes(1), 64], 0);
    let keys = |p: &Part| -> [u32; MAX_MEMBERS] { std::array::from_fn(|m| if m == 0 { p.rkey() } else { 0 }) };
    let sc = Common::<SimNic>::new(ports, peer, OwnedFd::from(a), &qpn(&sqps), set);
    let rc = Common::<SimNic>::new(ports, peer, OwnedFd::from(b), &qpn(&rqps), set);
    let ring_spec = Ring { addr: ring.addr(), rkeys: keys(&ring), slots: conn::RING_SLOTS, eager_max: EAGER_MAX };
    let send = VerbsSend::new(
        sc,
        sqps.clone(),
        vec![scq],
        [s_remote, s_local],
        vsend::Parts { fifo, sizes_out, hdrs },
        (sizes_in.addr(), keys(&sizes_in)),
        ring_spec,
        1,
        nparts,
    );
    let recv = VerbsRecv::new(rc, rqps, vec![rcq], [r_remote, r_local], vrecv::Parts { cts_out, sizes_in, ring, scratch }, EAGER_MAX, (fifo.addr(), keys(&fifo)), 1, nparts);
    Pair { send, recv, sqps }
}

/// The bytes message `id` carries.
fn pattern(id: usize, len: usize) -> impl Iterator<Item = u8> {
    (0..len).map(move |i| (id.wrapping_mul(131) ^ i.wrapping_mul(7) ^ (i >> 8)) as u8 | 1)
}

fn mr_of(v: &[u8], key: u32, dev: usize) -> MrInfo {
    MrInfo {
        addr: v.as_ptr() as usize,
        len: v.len(),
        lkey: key,
        rkey: key,
        more_keys: [(0, 0); MAX_MEMBERS - 1],
        members: 1,
        access: IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
        dev,
        path: Path::Host,
        gpu: None,
    }
}

/// One schedule: `msgs` messages of random sizes (0 to past the eager limit, some of several
/// MiB) from the sender to the receiver, with random interleavings of the two sides' calls and
/// of the NIC's work, and in half of them a queue pair's link dying. Returns what ran and how
/// many work requests met the dead link, or what went wrong.
fn schedule(seed: u64) -> Result<(String, usize), String> {
    let mut rng = Rng(seed);
    // Half the schedules with a queue pair's link dying at a random moment (failover on, 2 or 4
    // queue pairs; the shells must fail over to the others and lose nothing).
    let failing = rng.chance(50);
    let nqps = if failing { rng.pick(&[2, 4]) } else { rng.pick(&[1, 1, 2, 4]) };
    let nparts = if rng.chance(50) { 1 } else { nqps };
    let depths = if rng.below(3) == 0 { Depths::MIN } else { Depths::DEFAULT };
    let msgs = 20 + rng.below(60);
    let sizes: Vec<usize> = (0..msgs)
        .map(|_| match rng.below(10) {
            0 => 0,
            1..=4 => 1 + rng.below(64),
            5..=6 => 1 + rng.below(EAGER_MAX + 64),
            7..=8 => EAGER_MAX + 1 + rng.below(256 << 10),
            _ => (1 << 20) + rng.below(3 << 20),
        })
        .collect();
    // With 4 queue pairs and the default queues, sometimes a second link dies later (the
    // minimal queues cannot hold a send's parts once three logical queue pairs share one).
    let mut dies: Vec<(usize, u64)> = Vec::new();
    if failing {
        dies.push((rng.below(nqps), 1 + rng.below(msgs * 10) as u64));
        if nqps == 4 && depths == Depths::DEFAULT && rng.chance(50) {
            let q = (dies[0].0 + 1 + rng.below(3)) % 4;
            dies.push((q, dies[0].1 + 1 + rng.below(msgs * 5) as u64));
        }
    }
    let what = format!(
        "seed {seed:#x}: {nqps} QP(s), {nparts} part(s), {} queues, {msgs} messages{}",
        if depths == Depths::MIN { "minimal" } else { "default" },
        dies.iter().map(|(q, at)| format!(", queue pair {q}'s link dying at step {at}")).collect::<String>()
    );
    let mut p = pair(nqps, nparts, depths, failing);
    fab(|f| f.torn = rng.below(3 << 20));
    let started = std::time::Instant::now();
    let dev = {
        // The identity registrations must carry: the (one) port's.
        let c = &p.send.c;
        c.ports[0].dev_id()
    };
    let total: usize = sizes.iter().sum::<usize>() + 64 * msgs;
    let (mut smem, skey) = registered(total, 0);
    let (mut rmem, rkey) = registered(total + msgs * 64, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    rmem.fill(0x5c);
    let (smr, rmr) = (mr_of(&smem, skey, dev), mr_of(&rmem, rkey, dev));
    // Each message's place in the send and receive arenas; receive buffers have some room.
    let mut soff = Vec::new();
    let mut roff = Vec::new();
    let (mut s, mut r) = (0, 0);
    for (id, &len) in sizes.iter().enumerate() {
        soff.push(s);
        roff.push(r);
        for (b, v) in smem[s..s + len].iter_mut().zip(pattern(id, len)) {
            *b = v;
        }
        s += len + 64;
        r += len + 64;
    }
    let tag = |id: usize| (id % 7) as i32;
    let (mut next_send, mut next_recv) = (0, 0);
    let mut sent: VecDeque<(usize, u32)> = VecDeque::new();
    let mut posted: VecDeque<(usize, u32)> = VecDeque::new();
    let (mut sends_done, mut recvs_done) = (0, 0);
    let mut steps = 0u64;
    while sends_done < msgs || recvs_done < msgs {
        steps += 1;
        for &(q, _) in dies.iter().filter(|&&(_, at)| at == steps) {
            // Both ends of pair q: the sender's queue pair q and the receiver's.
            fab(|f| {
                f.broken.resize(f.qps.len(), false);
                let peer = f.qps[p.sqps[q]].peer.unwrap();
                f.broken[p.sqps[q]] = true;
                f.broken[peer] = true;
            });
        }
        if steps > 2_000_000 && started.elapsed() > std::time::Duration::from_secs(30) {
            return Err(format!("{what}: no end after {steps} steps: {sends_done} sends and {recvs_done} receives done"));
        }
        match rng.below(8) {
            0 if next_send < msgs && sent.len() < 16 => {
                let id = next_send;
                // SAFETY: the message's bytes in the send arena, registered and left alone
                // until the send completes (the arena outlives the pair).
                let buf = unsafe { Lent::new(smem.as_mut_ptr().add(soff[id]), sizes[id]) };
                match p.send.isend(buf, tag(id), Some(&smr)) {
                    Ok(Some(slot)) => {
                        sent.push_back((id, slot));
                        next_send += 1;
                    }
                    Ok(None) => {}
                    Err(e) => return Err(format!("{what}: isend of message {id}: {e}")),
                }
            }
            1 if next_recv < msgs && posted.len() < 16 => {
                let id = next_recv;
                let room = sizes[id] + rng.below(64);
                // SAFETY: the message's room in the receive arena, registered, read by the test
                // only once `test` reports the receive done.
                let buf = unsafe { Lent::new(rmem.as_mut_ptr().add(roff[id]), room) };
                let bufs = [RecvBuf { buf, tag: tag(id), mr: Some(rmr) }];
                match p.recv.irecv(&bufs) {
                    Ok(Some(slot)) => {
                        posted.push_back((id, slot));
                        next_recv += 1;
                    }
                    Ok(None) => {}
                    Err(e) => return Err(format!("{what}: irecv of message {id}: {e}")),
                }
            }
            2 => {
                if let Some(&(id, slot)) = sent.front() {
                    let mut sz = [0usize; MAX_RECVS];
                    match p.send.test(slot, &mut sz) {
                        Ok(Some(_)) => {
                            sent.pop_front();
                            sends_done += 1;
                        }
                        Ok(None) => {}
                        Err(e) => return Err(format!("{what}: test of send {id}: {e}")),
                    }
                }
            }
            3 => {
                if let Some(&(id, slot)) = posted.front() {
                    let mut sz = [0usize; MAX_RECVS];
                    match p.recv.test(slot, &mut sz) {
                        Ok(Some(n)) => {
                            if n != 1 || sz[0] != sizes[id] {
                                return Err(format!("{what}: receive {id} done with {n} buffer(s) of {} bytes; {} were sent", sz[0], sizes[id]));
                            }
                            let got = &rmem[roff[id]..roff[id] + sizes[id]];
                            if let Some(i) = got.iter().zip(pattern(id, sizes[id])).position(|(a, b)| *a != b) {
                                return Err(format!("{what}: receive {id} of {} bytes reported done with byte {i} wrong", sizes[id]));
                            }
                            posted.pop_front();
                            recvs_done += 1;
                        }
                        Ok(None) => {}
                        Err(e) => return Err(format!("{what}: test of receive {id}: {e}")),
                    }
                }
            }
            _ => {
                // The NIC: some work of queue pairs picked at random (each in its own order).
                for _ in 0..1 + rng.below(4) {
                    let qs: Vec<usize> = fab(|f| (0..f.qps.len()).filter(|&q| !f.qps[q].sq.is_empty()).collect());
                    if qs.is_empty() {
                        break;
                    }
                    let q = rng.pick(&qs);
                    fab(|f| f.step(q));
                }
            }
        }
        let faults = fab(|f| std::mem::take(&mut f.faults));
        if !faults.is_empty() {
            return Err(format!("{what}: the NIC refused what the shells posted: {}", faults.join("; ")));
        }
    }
    let failed = fab(|f| f.failed);
    drop(p);
    Ok((format!("{what}: {steps} steps"), failed))
}

#[test]
fn the_production_shells_deliver_every_byte_over_a_simulated_nic() {
    let n: u64 = std::env::var("RIVET_SHELL_SIM_SCHEDULES").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    let mut failed = Vec::new();
    let (mut ran, mut failed_over) = (0, 0);
    for i in 0..n {
        // A fresh fabric per schedule.
        FAB.with(|f| *f.borrow_mut() = Fabric { next_key: 0x100, ..Default::default() });
        let seed = 0x5eed_0000 + i;
        ran += 1;
        match schedule(seed) {
            Ok((w, hit)) => {
                if std::env::var_os("RIVET_SHELL_SIM_VERBOSE").is_some() {
                    println!("{w}: {hit} work request(s) met the dead link");
                }
                failed_over += (hit > 0) as u64
            }
            Err(e) => {
                failed.push(e);
                if failed.len() >= 3 {
                    break;
                }
            }
        }
    }
    println!("shell_sim: {ran} schedules, {failed_over} of them with traffic on a link that died (failed over)");
    assert!(failed.is_empty(), "{} of {ran} schedule(s) failed:\n{}", failed.len(), failed.join("\n"));
    assert_eq!(ran, n, "every schedule ran");
    assert!(n < 10 || failed_over * 5 >= n, "only {failed_over} of {n} schedules had traffic on the link that died: the failover path is not exercised");
}
