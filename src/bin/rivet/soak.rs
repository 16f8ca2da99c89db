//! `rivet soak --minutes N`: two ranks stream to each other through the plugin for N minutes, in
//! both directions at once: random sizes from 0 B to `--max-size`, random tags, grouped receives
//! of up to maxRecvs buffers, receive buffers larger than their sends, a window of rounds in flight
//! that changes at random; every byte checked against the pattern its sender wrote. Host buffers
//! first, then (second half) staged ones through the staging engine (RIVET_STAGE_HOST=1). Each
//! rank samples its RSS, open fds and threads, and the run fails on any error, wrong byte, or
//! growth of those counts after the warm-up.
//!
//! Both directions follow one schedule, drawn from `--seed` by both ranks alike. The sender of a
//! direction decides when it stops: every round ends with an 8-byte control message carrying the
//! last round's number (unknown until the time is up; then the current round + MAX_WINDOW, so that
//! a receiver, which never has more than MAX_WINDOW rounds posted, never posts one too many).

use crate::net::Res;
use crate::peer::Ring;
use crate::usage::Usage;
use crate::{parse_size, Common};
use clap::Args;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct Opts {
    /// How long to run, in minutes (fractions allowed); the host and staged halves share it
    #[arg(long, value_name = "N", default_value_t = 1.0, value_parser = minutes)]
    pub minutes: f64,
    /// Largest message, and largest sum of a round's messages
    #[arg(long = "max-size", value_name = "SIZE", default_value = "64M", value_parser = parse_size)]
    pub max_size: usize,
    /// Seed of the schedule (default: from the clock; printed, so a run can be repeated)
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Which buffers: host, staged, or both (host, then staged)
    #[arg(long, value_name = "WHICH", default_value = "both", value_parser = ["host", "staged", "both"])]
    pub buffers: String,
    /// Listen, then wait this many seconds before connecting (NCCL connects lazily, long after
    /// init): a test changes the fabric meanwhile, e.g. takes a member of a fused device down
    #[arg(long = "connect-after", value_name = "SECS", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=600))]
    pub connect_after: u64,
    #[command(flatten)]
    pub common: Common,
}

fn minutes(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(m) if m > 0.0 && m <= 24.0 * 60.0 => Ok(m),
        _ => Err(format!("'{s}' is not a number of minutes above 0 and at most 1440")),
    }
}

impl Opts {
    pub fn check(&self) -> Res<()> {
        if self.max_size > 1 << 30 {
            return Err("--max-size: at most 1G (each rank keeps 2 x 4 rounds of it)".into());
        }
        Ok(())
    }
}

/// Rounds in flight per direction, at most.
const MAX_WINDOW: usize = 4;
/// Extra bytes a receive buffer may have beyond its send.
const SLACK: usize = 4096;
const CTRL_TAG: i32 = 0x7fff_0000;
const UNDECIDED: u64 = u64::MAX;

/// xorshift64*: the schedule both ranks draw alike.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One round of a direction: the messages (size, tag, receive buffer size) and its number.
struct Plan {
    round: u64,
    msgs: Vec<(usize, i32, usize)>,
}

fn plan(rng: &mut Rng, round: u64, max: usize, max_recvs: usize) -> Plan {
    let n = 1 + rng.below(max_recvs as u64) as usize;
    let mut msgs = Vec::with_capacity(n);
    let mut budget = max;
    let mut tags: Vec<i32> = Vec::with_capacity(n);
    for _ in 0..n {
        // Sizes spread over every order of magnitude: 1 in 10 empty, else 2^[0, log2(max)].
        let size = if rng.below(10) == 0 || budget == 0 {
            0
        } else {
            let bits = 64 - (budget as u64).leading_zeros() as u64;
            let top = 1u64 << rng.below(bits);
            ((top + rng.below(top)) as usize).min(budget)
        };
        budget -= size;
        let mut tag = (rng.below(1 << 20)) as i32;
        while tags.contains(&tag) {
            tag += 1;
        }
        tags.push(tag);
        let room = size + rng.below(SLACK as u64) as usize;
        msgs.push((size, tag, room));
    }
    Plan { round, msgs }
}

/// The byte at offset `i` of message `m` of `round` in direction `dir`: one multiply per 8 bytes.
fn word(dir: u64, round: u64, m: usize, i: usize) -> u64 {
    ((dir << 56) ^ (round << 8) ^ m as u64 ^ ((i as u64) << 20)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn fill(p: &mut [u8], dir: u64, round: u64, m: usize) {
    for (k, c) in p.chunks_mut(8).enumerate() {
        let w = word(dir, round, m, k).to_le_bytes();
        c.copy_from_slice(&w[..c.len()]);
    }
}

fn wrong_bytes(p: &[u8], dir: u64, round: u64, m: usize) -> u64 {
    let mut bad = 0;
    for (k, c) in p.chunks(8).enumerate() {
        let w = word(dir, round, m, k).to_le_bytes();
        if c != &w[..c.len()] {
            bad += c.iter().zip(&w).filter(|(a, b)| a != b).count() as u64;
        }
    }
    bad
}

/// A registered buffer per window slot (plus the control words).
struct Arena {
    mem: Vec<u8>,
    mh: *mut c_void,
}

/// A round on its way: its plan, its window slot, the requests not yet done (in posting order),
/// and for a receive the message sizes its grouped request reported.
struct Round {
    plan: Plan,
    slot: usize,
    reqs: Vec<*mut c_void>,
    sizes: [i32; 8],
}

/// One direction's state on this rank.
struct Dir {
    rng: Rng,
    next: u64,
    last: u64,
    /// Rounds fully posted and not complete.
    flight: VecDeque<Round>,
    free: Vec<usize>,
    done: u64,
    /// A round whose requests are not all posted yet (back-pressure).
    posting: Option<Round>,
}

impl Dir {
    fn new(seed: u64) -> Dir {
        Dir { rng: Rng(seed | 1), next: 0, last: UNDECIDED, flight: VecDeque::new(), free: (0..MAX_WINDOW).collect(), done: 0, posting: None }
    }
}

struct Totals {
    msgs: u64,
    bytes: u64,
    wrong: u64,
}

/// One phase (host or staged) on this rank, for `secs` seconds.
/// The longest isend, irecv or test call so far: NCCL's proxy thread makes them for every
/// connection it serves, so none may wait (a failover included).
#[derive(Default)]
struct Longest {
    ms: f64,
    what: &'static str,
}

impl Longest {
    fn time<T>(&mut self, what: &'static str, call: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let r = call();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if ms > self.ms {
            self.ms = ms;
            self.what = what;
        }
        r
    }
}

pub fn peer(lib: &std::path::Path, rank: usize, nranks: usize, o: &Opts) -> Res<u64> {
    let devs = o.common.devs();
    // With the plugin loaded and initialized (its devices open: a process-wide cost, paid once),
    // before any connection: what must come back after the comms are closed.
    let net = crate::net::Net::load(lib)?;
    net.ndev()?;
    let before = Usage::of_process();
    // Declared before the ring (and its comms), so dropped after it: on an error return no comm
    // with requests in flight outlives the memory they name.
    let (mut sarena, mut rarena): (Arena, Arena);
    let mut r = Ring::join_with(net, rank, nranks, &devs, false, 1, false, std::time::Duration::from_secs(o.connect_after))?;
    let secs = std::env::var("RIVET_SOAK_SECS").ok().and_then(|s| s.parse::<f64>().ok()).ok_or("soak: the launcher did not say how long")?;
    let seed = std::env::var("RIVET_SOAK_SEED").ok().and_then(|s| s.parse::<u64>().ok()).ok_or("soak: no seed")?;
    let phase = std::env::var("RIVET_SOAK_PHASE").unwrap_or_default();
    let net = &r.net;
    let max_recvs = (net.props(r.dev)?.maxRecvs.max(1) as usize).min(8);
    let slot_bytes = o.max_size + max_recvs * SLACK + 4096;
    // Every page touched now, so the RSS is flat from the start.
    let mk = |comm: *mut c_void| -> Res<Arena> {
        let mut mem = vec![0xEEu8; slot_bytes * MAX_WINDOW + 4096];
        let mh = net.reg(comm, &mut mem)?;
        Ok(Arena { mem, mh })
    };
    sarena = mk(r.send())?;
    rarena = mk(r.recv())?;
    let ctrl_off = slot_bytes * MAX_WINDOW;
    // Direction d is "rank d sends": this rank sends in direction `rank`, receives in the other.
    let (sdir, rdir) = (rank as u64, (1 - rank) as u64);
    let mut send = Dir::new(seed ^ (sdir.wrapping_mul(0x1234_5678_9abc_def1)));
    let mut recv = Dir::new(seed ^ (rdir.wrapping_mul(0x1234_5678_9abc_def1)));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let warm = start + Duration::from_secs_f64((secs * 0.2).min(20.0));
    let mut base: Option<Usage> = None;
    let mut peak_rss = 0;
    let mut tot = Totals { msgs: 0, bytes: 0, wrong: 0 };
    let mut window = MAX_WINDOW;
    let mut last_print = start;
    let mut idle_since = Instant::now();
    let mut flip = std::env::var_os("RIVET_SOAK_FLIP").is_some();
    let mut longest = Longest::default();
    loop {
        let now = Instant::now();
        let mut moved = false;
        if send.last == UNDECIDED && now >= deadline {
            send.last = send.next + MAX_WINDOW as u64;
        }
        // Now and then a new window (1..=MAX_WINDOW rounds in flight), the same on both ranks.
        if send.next % 64 == 0 && send.posting.is_none() {
            window = 1 + (send.next / 64 % MAX_WINDOW as u64) as usize;
        }
        // Send: post the next round when a slot is free.
        if send.posting.is_none() && send.next <= send.last && send.flight.len() < window {
            if let Some(slot) = send.free.pop() {
                let p = plan(&mut send.rng, send.next, o.max_size, max_recvs);
                let base_off = slot * slot_bytes;
                let mut off = base_off;
                for (m, &(size, _, _)) in p.msgs.iter().enumerate() {
                    fill(&mut sarena.mem[off..off + size], sdir, p.round, m);
                    off += size;
                }
                let c = &mut sarena.mem[ctrl_off + slot * 8..ctrl_off + slot * 8 + 8];
                c.copy_from_slice(&send.last.to_le_bytes());
                send.next += 1;
                send.posting = Some(Round { plan: p, slot, reqs: Vec::new(), sizes: [0; 8] });
            }
        }
        if let Some(Round { plan: p, slot, reqs, .. }) = send.posting.as_mut() {
            // The messages lie one after another in the slot; the control word comes last.
            while reqs.len() <= p.msgs.len() {
                let k = reqs.len();
                let (ptr, size, tag) = if k < p.msgs.len() {
                    let off = *slot * slot_bytes + p.msgs[..k].iter().map(|m| m.0).sum::<usize>();
                    (sarena.mem[off..].as_ptr(), p.msgs[k].0, p.msgs[k].1)
                } else {
                    (sarena.mem[ctrl_off + *slot * 8..].as_ptr(), 8, CTRL_TAG)
                };
                // SAFETY: the message's bytes in this round's slot of the send arena, registered as
                // `sarena.mh` and kept (the arena outlives the comms) and unchanged until the round
                // completes: a slot is refilled only after its requests are done.
                match longest.time("isend", || unsafe { net.try_isend(r.send(), ptr, size, tag, sarena.mh) })? {
                    Some(q) => {
                        reqs.push(q);
                        moved = true;
                    }
                    None => break,
                }
            }
            if reqs.len() == p.msgs.len() + 1 {
                send.flight.extend(send.posting.take());
            }
        }
        // Receive: post the next round's grouped receive and its control receive.
        if recv.posting.is_none() && recv.next <= recv.last && recv.flight.len() < MAX_WINDOW {
            if let Some(slot) = recv.free.pop() {
                let p = plan(&mut recv.rng, recv.next, o.max_size, max_recvs);
                recv.next += 1;
                recv.posting = Some(Round { plan: p, slot, reqs: Vec::new(), sizes: [-1; 8] });
            }
        }
        if let Some(Round { plan: p, slot, reqs, .. }) = recv.posting.as_mut() {
            if reqs.is_empty() {
                let mut off = *slot * slot_bytes;
                let mut bufs = Vec::with_capacity(p.msgs.len());
                for &(_, tag, room) in &p.msgs {
                    let ptr = rarena.mem[off..].as_mut_ptr();
                    bufs.push((ptr, room, tag, rarena.mh));
                    off += room;
                }
                // SAFETY: each buffer is its room in this round's slot of the receive arena
                // (registered as `rarena.mh`, outliving the comms), read only once the round is done.
                if let Some(q) = longest.time("irecv", || unsafe { net.try_irecv_group(r.recv(), &bufs) })? {
                    reqs.push(q);
                    moved = true;
                }
            }
            if reqs.len() == 1 {
                let ptr = rarena.mem[ctrl_off + *slot * 8..].as_mut_ptr();
                // SAFETY: as above, for the slot's control word.
                if let Some(q) = longest.time("irecv", || unsafe { net.try_irecv_group(r.recv(), &[(ptr, 8, CTRL_TAG, rarena.mh)]) })? {
                    reqs.push(q);
                    moved = true;
                }
            }
            if reqs.len() == 2 {
                recv.flight.extend(recv.posting.take());
            }
        }
        // Completions, in order.
        while let Some(Round { reqs, .. }) = send.flight.front_mut() {
            // Requests are tested until done, and a done one is not tested again.
            while let Some(&q) = reqs.first() {
                let mut one = [0i32; 1];
                if !longest.time("test", || net.test_n(q, &mut one))? {
                    break;
                }
                reqs.remove(0);
                moved = true;
            }
            if !reqs.is_empty() {
                break;
            }
            let done = send.flight.pop_front().unwrap();
            send.free.push(done.slot);
            send.done += 1;
            moved = true;
        }
        while let Some(Round { plan: p, reqs, sizes, .. }) = recv.flight.front_mut() {
            let n = p.msgs.len();
            // First the grouped receive (its sizes kept), then the control word; a request that
            // is done is not tested again.
            if reqs.len() == 2 {
                if !longest.time("test", || net.test_n(reqs[0], &mut sizes[..n]))? {
                    break;
                }
                reqs.remove(0);
                moved = true;
            }
            let mut ctl = [0i32; 1];
            if !longest.time("test", || net.test_n(reqs[0], &mut ctl))? {
                break;
            }
            let Round { plan: p, slot, sizes, .. } = recv.flight.pop_front().unwrap();
            // Check the sizes and every byte. (RIVET_SOAK_FLIP: the test of the check itself
            // flips one received byte, which must be found.)
            let mut off = slot * slot_bytes;
            if flip && p.msgs.first().is_some_and(|m| m.0 > 0) {
                rarena.mem[off] ^= 0x01;
                flip = false;
            }
            for (m, &(size, _, room)) in p.msgs.iter().enumerate() {
                if sizes[m] as usize != size {
                    tot.wrong += 1;
                    r.out_any(&format!("# soak: round {} message {m}: size {} where {size} was sent", p.round, sizes[m]));
                }
                tot.wrong += wrong_bytes(&rarena.mem[off..off + size], rdir, p.round, m);
                tot.bytes += size as u64;
                off += room;
            }
            tot.msgs += n as u64;
            let c = slot * 8 + ctrl_off;
            let last = u64::from_le_bytes(rarena.mem[c..c + 8].try_into().unwrap());
            if last != UNDECIDED {
                recv.last = recv.last.min(last);
            }
            recv.free.push(slot);
            recv.done += 1;
            moved = true;
        }
        let finished = send.last != UNDECIDED && send.done > send.last && recv.last != UNDECIDED && recv.done > recv.last;
        let now = Instant::now();
        if moved {
            idle_since = now;
        } else if now.duration_since(idle_since) > net.timeout {
            return Err(format!(
                "soak: no progress for {} s (sent {} rounds, received {})",
                net.timeout.as_secs(),
                send.done,
                recv.done
            ));
        }
        // Samples: the baseline after the warm-up, then every 10 s.
        if now >= warm && base.is_none() {
            base = Some(Usage::of_process());
        }
        if now.duration_since(last_print) >= Duration::from_secs(10) || finished {
            last_print = now;
            let c = Usage::of_process();
            peak_rss = peak_rss.max(c.rss_kib);
            if rank == 0 {
                r.out(&format!(
                    "# soak {phase} t={:.0}s: received {} messages, {:.2} GiB, {} wrong bytes; rss {} MiB, fds {}, threads {}",
                    start.elapsed().as_secs_f64(),
                    tot.msgs,
                    tot.bytes as f64 / (1u64 << 30) as f64,
                    tot.wrong,
                    c.rss_kib / 1024,
                    c.fds,
                    c.threads
                ));
            }
        }
        if finished {
            break;
        }
        if !moved {
            std::hint::spin_loop();
        }
    }
    // In the run: fds and threads must not grow after the warm-up (the RSS may: the staging
    // engine's pool keeps the buffers of the largest bursts it has seen, and the window moves).
    let end = Usage::of_process();
    let b = base.unwrap_or(end);
    let grow = |a: u64, b: u64| a as i64 - b as i64;
    let (rfds, rthr) = (grow(end.fds, b.fds), grow(end.threads, b.threads));
    let secs_run = start.elapsed().as_secs_f64();
    // Every rank done before any closes: a sender's last completion may still be on its way
    // (its ACK lost and resent) when the receiver has everything.
    r.barrier()?;
    net.dereg(r.send(), sarena.mh)?;
    net.dereg(r.recv(), rarena.mh)?;
    let peak_rss = peak_rss.max(end.rss_kib);
    // The comms closed (the plugin stays loaded, as it does in NCCL between communicators).
    r.close();
    drop((sarena, rarena));
    // Back where the rank started.
    let after = Usage::of_process();
    let (drss, dfds, dthr) = (grow(after.rss_kib, before.rss_kib), grow(after.fds, before.fds), grow(after.threads, before.threads));
    let bad_counts = (rfds > 0) as u64 + (rthr > 0) as u64 + (drss > 16 * 1024) as u64 + (dfds > 0) as u64 + (dthr > 0) as u64;
    let bad = tot.wrong + bad_counts;
    r.out_any(&format!(
        "# soak {phase} rank {rank}: received {} messages, {} bytes ({:.2} GB/s) in {secs_run:.0} s; {} wrong bytes; in the run after the warm-up: fds {rfds:+}, threads {rthr:+} (peak rss {} MiB); after close: rss {drss:+} KiB, fds {dfds:+}, threads {dthr:+}; longest data-path call {:.1} ms ({}): {}",
        tot.msgs,
        tot.bytes,
        tot.bytes as f64 / secs_run / 1e9,
        tot.wrong,
        peak_rss / 1024,
        longest.ms,
        longest.what,
        if bad == 0 { "PASS" } else { "FAIL" }
    ));
    Ok(bad)
}
