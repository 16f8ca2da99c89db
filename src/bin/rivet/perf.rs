//! `rivet perf`: 8-byte ping-pong latency and streaming bandwidth between two local processes
//! through the plugin, printed as a table.

use crate::net::Res;
use crate::peer::Ring;
use crate::usage::Usage;
use crate::{parse_size, Common};
use clap::Args;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct Opts {
    /// Message sizes of the bandwidth test [default: 64K,256K,1M,4M,16M,64M,256M; with --comms 1M]
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_size)]
    pub sizes: Vec<usize>,
    /// Messages in flight in the bandwidth test
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=32), allow_negative_numbers = true)]
    pub window: u16,
    /// Bytes to move per size (at least 8 messages, and one per comm; at most 100000)
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_size)]
    pub bytes: usize,
    /// Round trips of the 8-byte latency test (0: no latency test)
    #[arg(long = "lat-iters", value_name = "N", default_value_t = 2000, value_parser = clap::value_parser!(u32).range(0..=10_000_000), allow_negative_numbers = true)]
    pub lat_iters: u32,
    /// In the latency test, the initiator sleeps this many microseconds after each isend
    /// before it tests for the answer, so that its test finds it (while the responder's tests
    /// find nothing): for counting what each kind of `test` costs (ci/bench_instr.py), not for
    /// timing
    #[arg(long = "lat-settle", value_name = "US", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub lat_settle: u32,
    /// NCCL's profiler (ncclNet v10 and later): none passes no callback at init; callback
    /// passes one and no profiler handle with any request (NCCL without a profiler plugin);
    /// events passes one and a handle with every isend and irecv buffer (NCCL with a profiler
    /// plugin), and each rank prints the network events the plugin started and stopped
    #[arg(long, value_enum, value_name = "MODE", default_value = "none")]
    pub profiler: crate::net::Profiling,
    /// Buffers in GPU memory (CUDA device 0), registered as NCCL_PTR_CUDA
    #[arg(long)]
    pub cuda: bool,
    /// Verify every received byte against a pattern of its message's own (latency and bandwidth,
    /// a buffer per message in flight); a wrong byte fails the run (exit 1). For tests: the
    /// pattern costs time, so benchmark numbers are taken without it
    #[arg(long)]
    pub check: bool,
    /// What connections cost: open N send/receive comm pairs between the two processes (each its own listen, connect and accept, as NCCL makes one per peer) and print a row of setup time, memory, pinned bytes, queue pairs, CQ entries, fds and threads per pair, then latency and bandwidth with traffic round-robin over all N; a list (1,16,256,1024) runs each N in fresh processes
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub comms: Vec<u32>,
    /// With --comms: first connect one pair alone, untimed, and close it, so that the setup time
    /// is what connections take once the process has made its first (whose one-time costs, such
    /// as the plugin's first run through its setup code, are then left out); the usage columns
    /// are counted as without it, from before the first listen
    #[arg(long, requires = "comms")]
    pub warm: bool,
    #[command(flatten)]
    pub common: Common,
}

/// The launcher tells each pair of processes of a `--comms` run its N (and whether it prints
/// the table's header) through these.
pub const COMMS_ENV: &str = "RIVET_PERF_COMMS";
pub const HEADER_ENV: &str = "RIVET_PERF_HEADER";
/// Set: `--comms` also prints, per N, where each pair's RSS is, by mapping (/proc/self/smaps).
pub const SMAPS_ENV: &str = "RIVET_PERF_SMAPS";

impl Opts {
    /// What clap cannot check alone, checked before any process starts.
    pub fn check(&self) -> Res<()> {
        if self.sizes.contains(&0) {
            return Err("--sizes: a size of 0 bytes moves nothing (examples: 64K,1M,16M)".into());
        }
        if self.sizes.iter().any(|&s| s > 1 << 31) {
            return Err("--sizes: the largest size a local run allocates is 2G".into());
        }
        if self.check && self.cuda {
            return Err("--check verifies host buffers; with --cuda the receiver's GPU buffer is checked against the last message instead".into());
        }
        Ok(())
    }

    /// The bandwidth test's sizes.
    pub fn sizes(&self) -> Vec<usize> {
        match (self.sizes.is_empty(), self.comms.is_empty()) {
            (false, _) => self.sizes.clone(),
            (true, true) => [16, 18, 20, 22, 24, 26, 28].map(|b| 1usize << b).to_vec(),
            (true, false) => vec![1 << 20],
        }
    }
}

/// Registrations of one buffer on every send comm and every receive comm.
struct Regs {
    send: Vec<*mut std::ffi::c_void>,
    recv: Vec<*mut std::ffi::c_void>,
}

impl Regs {
    /// # Safety
    /// `p` is `len` bytes of memory of type `ty` that outlive the ring's comms.
    unsafe fn new(r: &Ring, p: *mut u8, len: usize, ty: i32) -> Res<Regs> {
        let mut g = Regs { send: Vec::with_capacity(r.sends.len()), recv: Vec::with_capacity(r.recvs.len()) };
        for &c in &r.sends {
            // SAFETY: the caller's promise.
            g.send.push(unsafe { r.net.reg_ptr(c, p, len, ty)? });
        }
        for &c in &r.recvs {
            // SAFETY: as above.
            g.recv.push(unsafe { r.net.reg_ptr(c, p, len, ty)? });
        }
        Ok(g)
    }

    fn release(&self, r: &Ring) -> Res<()> {
        for (c, m) in r.sends.iter().zip(&self.send).chain(r.recvs.iter().zip(&self.recv)) {
            r.net.dereg(*c, *m)?;
        }
        Ok(())
    }
}

/// One-way latency statistics, µs.
struct Lat {
    p50: f64,
    mean: f64,
    p90: f64,
    p99: f64,
    max: f64,
}

pub fn peer(lib: &std::path::Path, rank: usize, nranks: usize, o: &Opts) -> Res<u64> {
    let devs = o.common.devs();
    let n: usize = std::env::var(COMMS_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(1).max(1);
    let costs = !o.comms.is_empty();
    let fd_limit = if costs { crate::usage::raise_fd_limit() } else { 0 };
    let sizes = o.sizes();
    let window = o.window as usize;
    let max = sizes.iter().copied().max().unwrap_or(8).max(8);
    // Real pages with data (a zero-filled allocation would be lazily mapped to the zero page).
    let mut buf: Vec<u8> = (0..max).map(|i| (i * 131 + rank) as u8).collect();
    let mut small = [0u8; 8];
    // With --cuda the same pattern lives in GPU memory, registered as CUDA buffers.
    let gpu = if o.cuda {
        let big = nccl_net_rivet::gpu::cuda::DeviceBuf::new(0, max).map_err(|e| e.into_msg())?;
        big.upload(&buf).map_err(|e| e.into_msg())?;
        let small = nccl_net_rivet::gpu::cuda::DeviceBuf::new(0, 8).map_err(|e| e.into_msg())?;
        Some((big, small))
    } else {
        None
    };
    // The plugin loaded and its devices open (a process-wide cost, paid once), before any comm.
    crate::net::set_profiling(o.profiler);
    let net = crate::net::Net::load(lib)?;
    net.ndev()?;
    let before = if costs { Usage::now() } else { Usage::default() };
    let smaps = costs && std::env::var_os(SMAPS_ENV).is_some();
    let maps_before = if smaps { crate::usage::rss_by_mapping() } else { Default::default() };
    // The ring (and its comms) is made after the buffers, so it is dropped before them: on an
    // error return no comm with requests in flight outlives the memory they name.
    let r = Ring::join_with(net, rank, nranks, &devs, false, n, o.warm, std::time::Duration::ZERO)?;
    let idle = if costs { Usage::now() } else { Usage::default() };
    if smaps {
        // Where the connected pairs' RSS is, by mapping, largest first.
        let now = crate::usage::rss_by_mapping();
        let mut d: Vec<(i64, &String)> = now.iter().map(|(k, v)| (*v as i64 - *maps_before.get(k).unwrap_or(&0) as i64, k)).filter(|(d, _)| *d != 0).collect();
        d.sort_by_key(|e| std::cmp::Reverse(e.0));
        for (kib, name) in d.iter().take(8) {
            r.out(&format!("# {n} comms: RSS {:+.1} KiB/pair in {name}", *kib as f64 / n as f64));
        }
    }
    let (bp, sp, ty) = match &gpu {
        Some((b, s)) => (b.ptr() as *mut u8, s.ptr() as *mut u8, nccl_net_rivet::abi::types::NCCL_PTR_CUDA),
        None => (buf.as_mut_ptr(), small.as_mut_ptr(), nccl_net_rivet::abi::types::NCCL_PTR_HOST),
    };
    // SAFETY: `bp` is `max` bytes and `sp` 8 of memory of type `ty` (the buffers above), which
    // outlive the ring and its comms, and so every registration and request on them.
    let (big, little) = unsafe { (Regs::new(&r, bp, max, ty)?, Regs::new(&r, sp, 8, ty)?) };
    // --check: a buffer per message in flight (the j-th message in slot j mod window; slot 0 is
    // `buf`), and the latency test's answers in a buffer of their own.
    let mut slots: Vec<Vec<u8>> = if o.check { (1..window).map(|_| vec![0u8; max]).collect() } else { Vec::new() };
    let mut answer = [0u8; 8];
    let mut slot_regs = Vec::with_capacity(slots.len());
    for v in &mut slots {
        // SAFETY: as above: each slot is `max` bytes of host memory that outlives the comms.
        slot_regs.push(unsafe { Regs::new(&r, v.as_mut_ptr(), max, ty)? });
    }
    let answer_regs = if o.check {
        // SAFETY: as above, 8 bytes.
        Some(unsafe { Regs::new(&r, answer.as_mut_ptr(), 8, ty)? })
    } else {
        None
    };
    let mut bufs: Vec<(*mut u8, &Regs)> = vec![(bp, &big)];
    bufs.extend(slots.iter_mut().map(|v| v.as_mut_ptr()).zip(slot_regs.iter()));
    let small_bufs = match &answer_regs {
        Some(a) => [(sp, &little), (answer.as_mut_ptr(), a)],
        None => [(sp, &little), (sp, &little)],
    };
    let net = &r.net;
    let p = net.props(r.dev)?;
    let name = p.name.clone();
    let cfg = nccl_net_rivet::config::get();
    // rivet's own settings say how many lanes a connection has; another plugin's are its own.
    let lanes = match (net.name(), r.transport) {
        ("rivet", "TCP") => format!(", {} stream(s)", cfg.socket_nstreams),
        ("rivet", _) => format!(", {} QP(s)", cfg.ib_qps),
        _ => String::new(),
    };
    let what = format!(
        "{} (ncclNet v{}, plugin {}) dev {} ({name}, {} Mb/s), {}{lanes}, window {}, {} buffers",
        net.path.display(),
        net.version(),
        net.name(),
        r.dev,
        p.speed,
        r.transport,
        window,
        if o.cuda { "GPU (CUDA device 0)" } else { "host" }
    );
    if !costs {
        r.out(&format!("# rivet perf: {what}"));
    } else if std::env::var_os(HEADER_ENV).is_some() {
        let warm = if o.warm { ", after an untimed first pair (--warm)" } else { "" };
        r.out(&format!("# rivet perf --comms: {what}, fd limit {fd_limit}{warm}"));
        r.out("# per pair: what one send comm and one receive comm cost in a process (rank 0's), connected and idle, before any buffer is registered;");
        r.out("# after: the same once traffic has run and the buffers are deregistered. Latency and bandwidth: traffic round-robin over all the pairs.");
        let bw: String = sizes.iter().map(|&s| format!(" {:>9}", format!("GB/s@{}", label(s)))).collect();
        r.out(&format!(
            "#{:>6} {:>9} {:>8} {:>8} {:>8} {:>6} {:>8} {:>5} {:>6} {:>5} {:>5} {:>8} {:>8} {:>8} {:>8}{bw}",
            "comms", "setup ms", "us/pair", "RSS KiB", "pin KiB", "MRs", "MR KiB", "QPs", "CQEs", "fds", "thr", "RSS aft", "pin aft", "p50 us", "p99 us"
        ));
    }

    let settle = Duration::from_micros(o.lat_settle as u64);
    let mut check = Check { on: o.check, wrong: 0, messages: 0 };
    let lat = latency(&r, o.lat_iters as usize, small_bufs, !costs, settle, &mut check)?;
    if let (false, Some(l)) = (costs, &lat) {
        r.out(&format!(
            "# latency (8 B ping-pong, one way): typical {:.2} us, average {:.2} us, p90 {:.2} us, p99 {:.2} us, max {:.2} us",
            l.p50, l.mean, l.p90, l.p99, l.max
        ));
    }
    if !costs {
        r.out(&format!("#{:>12} {:>8} {:>12} {:>10}", "size(B)", "iters", "time(us)", "GB/s"));
    }
    let mut rates = Vec::new();
    for &size in &sizes {
        let iters = (o.bytes / size.max(1)).max(n).clamp(8, 100_000);
        let dt = bandwidth(&r, size, iters, window, &bufs, (sp, &little), &mut check)?;
        let gbs = (size * iters) as f64 / dt / 1e9;
        rates.push(gbs);
        if !costs {
            r.out(&format!(" {size:>12} {iters:>8} {:>12.1} {gbs:>10.3}", dt * 1e6 / iters as f64));
        }
    }
    // GPU buffers: the receiver's holds what the sender's last message carried.
    let mut wrong = 0;
    if let (Some((b, _)), Some(&last)) = (&gpu, sizes.last()) {
        if rank == 1 {
            let mut got = vec![0u8; last];
            b.download(&mut got).map_err(|e| e.into_msg())?;
            wrong = got.iter().enumerate().filter(|(i, v)| **v != (i * 131) as u8).count() as u64;
            // Rank 1 speaks here (r.out is rank 0's): the launcher prints every rank's OUT lines.
            println!("OUT # GPU buffer check: {wrong} wrong byte(s) of {last}");
        }
    }
    if o.check && check.messages > 0 {
        // Each rank that received speaks for itself (r.out is rank 0's).
        println!("OUT # data check, rank {rank}: {} wrong byte(s) in {} message(s) received", check.wrong, check.messages);
        wrong += check.wrong;
    }
    if o.profiler == crate::net::Profiling::Events {
        // Every request has been tested done: each event started has been stopped.
        let (started, stopped) = crate::net::profiler_events();
        println!("OUT # profiler events, rank {rank}: {started} started, {stopped} stopped");
        if started != stopped {
            return Err(format!("the plugin started {started} profiler events and stopped {stopped}"));
        }
    }
    big.release(&r)?;
    little.release(&r)?;
    for g in slot_regs.iter().chain(answer_regs.iter()) {
        g.release(&r)?;
    }
    if costs {
        let after = Usage::now();
        r.out(&cost_row(n, r.setup, [&before, &idle, &after], lat.as_ref(), &rates));
    }
    Ok(wrong)
}

/// One row of the `--comms` table: the differences from `before` per pair of comms.
fn cost_row(n: usize, setup: std::time::Duration, [before, idle, after]: [&Usage; 3], lat: Option<&Lat>, rates: &[f64]) -> String {
    let per = |a: u64, b: u64| (a as f64 - b as f64) / n as f64;
    let f = |v: f64| if v.abs() >= 100.0 { format!("{v:.0}") } else { format!("{v:.1}") };
    let rd = |k: fn(&crate::usage::Rdma) -> u64| match (idle.rdma, before.rdma) {
        (Some(i), Some(b)) => f(per(k(&i), k(&b))),
        _ => "-".into(),
    };
    let (p50, p99) = lat.map_or(("-".into(), "-".into()), |l| (format!("{:.1}", l.p50), format!("{:.1}", l.p99)));
    let bw: String = rates.iter().map(|g| format!(" {g:>9.3}")).collect();
    format!(
        " {n:>6} {:>9.1} {:>8.1} {:>8} {:>8} {:>6} {:>8} {:>5} {:>6} {:>5} {:>5} {:>8} {:>8} {p50:>8} {p99:>8}{bw}",
        setup.as_secs_f64() * 1e3,
        setup.as_secs_f64() * 1e6 / n as f64,
        f(per(idle.rss_kib, before.rss_kib)),
        f(per(idle.pinned_kib, before.pinned_kib)),
        rd(|r| r.mrs),
        rd(|r| r.mr_bytes / 1024),
        rd(|r| r.qps),
        rd(|r| r.cqes),
        f(per(idle.fds, before.fds)),
        f(per(idle.threads, before.threads)),
        f(per(after.rss_kib, before.rss_kib)),
        f(per(after.pinned_kib, before.pinned_kib)),
    )
}

/// Where a round trip's time goes, in cycles, one sample per timed round trip: the plugin's
/// `isend`, the `test` that found the message (its poll, the completion's processing, the
/// request's retirement), the mean of the `test`s before it that found nothing (how often a
/// waiter looks), and on the responder the turnaround from the start of that `test` to the
/// answer's `isend` returning.
#[derive(Default)]
struct Split {
    isend: Vec<u64>,
    found: Vec<u64>,
    idle_sum: u64,
    idle_n: u64,
    turn: Vec<u64>,
}

impl Split {
    fn line(&mut self, us: f64, who: &str, rtt: Option<f64>, refused: u64) -> String {
        let med = |v: &mut Vec<u64>| {
            v.sort_unstable();
            v.get(v.len() / 2).map_or(0.0, |&c| c as f64 * us)
        };
        let (a, f) = (med(&mut self.isend), med(&mut self.found));
        let idle = self.idle_sum as f64 / self.idle_n.max(1) as f64 * us;
        let mut s = format!("# {who} (medians): isend {a:.2} us, the test that finds the message {f:.2} us, a test that finds nothing {idle:.2} us");
        if !self.turn.is_empty() {
            s += &format!(", message found to answer sent {:.2} us", med(&mut self.turn));
        }
        if refused > 0 {
            s += &format!(", {refused} isend/irecv call(s) refused (no request: back-pressure)");
        }
        if let Some(rtt) = rtt {
            s += &format!("; round trip {rtt:.2} us");
        }
        s
    }
}

/// Set to a directory: each rank of the latency test writes there (rankN.csv) the cycle counts
/// of every round trip's steps (TRACE_COLUMNS), for ci/lat_trace.py to lay the two ranks'
/// timelines side by side (the counter is the same on both: one host).
pub const TRACE_ENV: &str = "RIVET_PERF_TRACE";
const TRACE_COLUMNS: &str = "isend_start,isend_end,found_start,found_end,irecv_end,send_done";

/// Wait for one request after sleeping `settle`, timing its `test`s into `s` (when `timed`);
/// the cycle counts at the start and the end of the `test` that found it done.
// Not inlined: ci/bench_instr.py finds its tests by this caller.
#[inline(never)]
fn wait_timed(r: &Ring, req: *mut std::ffi::c_void, s: &mut Split, timed: bool, settle: Duration) -> Res<(u64, u64)> {
    if !settle.is_zero() {
        std::thread::sleep(settle);
    }
    let mut idle = 0u64;
    loop {
        let t = cycles();
        let done = r.net.test(req)?.is_some();
        let e = cycles();
        if done {
            if timed {
                s.found.push(e.wrapping_sub(t));
            }
            return Ok((t, e));
        }
        if timed {
            s.idle_sum += e.wrapping_sub(t);
            s.idle_n += 1;
        }
        idle += 1;
        if idle % 4096 == 0 {
            // The rest of the bounded wait (its deadline and its yields) is wait_all's.
            r.wait_all(&[req])?;
            let now = cycles();
            return Ok((now, now));
        }
    }
}

/// The 8-byte ping-pong: rank 0 sends, rank 1 echoes, the i-th round trip on the (i mod N)-th
/// pair of comms. Each side keeps a receive posted ahead on every receive comm (as NCCL does),
/// so a clear-to-send is never on the critical path. Rank 0 times every round trip with the
/// cycle counter (as perftest does: reading the clock can be a system call in a VM) and gets the
/// median, the mean and the tail (p90, p99, max), halved.
/// Each side also reports where its time went (`Split`); `settle` is `--lat-settle`.
/// `--check`: the pattern every message carries, and the wrong bytes received.
struct Check {
    on: bool,
    wrong: u64,
    messages: u64,
}

impl Check {
    /// Byte `b` of message `j` of a test (`test` tells the latency test's from each size's).
    fn byte(test: usize, j: usize, b: usize) -> u8 {
        let x = (test as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (j as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
            ^ (b as u64 >> 8).wrapping_mul(0xD6E8_FEB8_6659_FD93);
        (x >> 32) as u8 ^ (b as u8).wrapping_mul(131)
    }

    /// Write message `j`'s pattern into `len` bytes at `p`.
    ///
    /// # Safety
    /// `p` is `len` writable bytes that no request in flight uses.
    unsafe fn fill(&self, p: *mut u8, len: usize, test: usize, j: usize) {
        if self.on {
            // SAFETY: the caller's promise.
            let v = unsafe { std::slice::from_raw_parts_mut(p, len) };
            v.iter_mut().enumerate().for_each(|(b, x)| *x = Self::byte(test, j, b));
        }
    }

    /// Count the bytes of `len` at `p` that are not message `j`'s.
    ///
    /// # Safety
    /// `p` is `len` readable bytes of a completed receive.
    unsafe fn verify(&mut self, p: *const u8, len: usize, test: usize, j: usize) {
        if self.on {
            // SAFETY: the caller's promise.
            let v = unsafe { std::slice::from_raw_parts(p, len) };
            self.wrong += v.iter().enumerate().filter(|(b, x)| **x != Self::byte(test, j, *b)).count() as u64;
            self.messages += 1;
        }
    }
}

/// The latency test's two small buffers: what a rank sends from, and what it receives into (the
/// same one without --check, whose bytes nobody reads).
type Small<'a> = [(*mut u8, &'a Regs); 2];

fn latency(r: &Ring, iters: usize, [(sp, mh), (ap, ah)]: Small, split_line: bool, settle: Duration, check: &mut Check) -> Res<Option<Lat>> {
    let (net, n) = (&r.net, r.sends.len());
    let warm = if iters == 0 { 0 } else { 100 };
    let total = warm + iters;
    let mut rtts: Vec<u64> = Vec::with_capacity(iters);
    let mut split = Split::default();
    let trace_dir = std::env::var_os(TRACE_ENV);
    let mut trace: Vec<[u64; 6]> = Vec::with_capacity(if trace_dir.is_some() { total } else { 0 });
    let refused0 = net.refused.load(std::sync::atomic::Ordering::Relaxed);
    let (mut t0, mut c0) = (Instant::now(), cycles());
    // SAFETY: (here and in each isend and irecv below) the buffers outlive the comms (see the
    // registrations); a benchmark lets a send and a receive share the small buffer, whose bytes
    // it never checks.
    let mut rr: Vec<_> = (0..n.min(total)).map(|k| unsafe { net.irecv(r.recvs[k], ap, 8, 0, ah.recv[k]) }).collect::<Res<_>>()?;
    for i in 0..total {
        if i == warm {
            (t0, c0) = (Instant::now(), cycles());
        }
        let k = i % n;
        let again = i + n < total;
        let timed = i >= warm;
        // The responder answers first, as perftest's does: the next receive is posted while
        // the answer travels (a message that comes before its receive waits in the eager ring,
        // as NCCL's, which posts its receives ahead, never has to).
        let found = if r.rank == 0 { None } else { Some(wait_timed(r, rr[k], &mut split, timed, Duration::ZERO)?) };
        // SAFETY: the small buffers are 8 bytes; a found message's receive is complete, and no
        // send is in flight from `sp` (each is waited for below).
        unsafe {
            if found.is_some() {
                check.verify(ap, 8, 0, i);
            }
            check.fill(sp, 8, 0, i);
        }
        let start = cycles();
        // SAFETY: see above.
        let sr = unsafe { net.isend(r.sends[k], sp, 8, 0, mh.send[k])? };
        let sent = cycles();
        let (fs, fe) = match found {
            Some(f) => f,
            None => {
                let f = wait_timed(r, rr[k], &mut split, timed, settle)?;
                // SAFETY: the answer's receive is complete.
                unsafe { check.verify(ap, 8, 0, i) };
                f
            }
        };
        if timed {
            split.isend.push(sent.wrapping_sub(start));
            match found {
                None => rtts.push(fe.wrapping_sub(start)),
                Some(_) => split.turn.push(sent.wrapping_sub(fs)),
            }
        }
        if again {
            // SAFETY: see above.
            rr[k] = unsafe { net.irecv(r.recvs[k], ap, 8, 0, ah.recv[k])? };
        }
        let posted = cycles();
        r.wait_all(&[sr])?;
        if trace_dir.is_some() {
            trace.push([start, sent, fs, fe, posted, cycles()]);
        }
    }
    let us_per_cycle = t0.elapsed().as_secs_f64() * 1e6 / cycles().wrapping_sub(c0).max(1) as f64;
    if let Some(d) = trace_dir {
        let mut o = format!("# rank {} us_per_cycle {us_per_cycle} warmup {warm}\n{TRACE_COLUMNS}\n", r.rank);
        for t in &trace {
            o += &t.map(|c| c.to_string()).join(",");
            o.push('\n');
        }
        let f = std::path::Path::new(&d).join(format!("rank{}.csv", r.rank));
        std::fs::write(&f, o).map_err(|e| format!("{TRACE_ENV}: {}: {e}", f.display()))?;
    }
    if iters == 0 {
        return Ok(None);
    }
    let refused = net.refused.load(std::sync::atomic::Ordering::Relaxed) - refused0;
    if r.rank != 0 {
        if split_line {
            // Rank 1 speaks for itself (r.out is rank 0's): the launcher prints every rank's lines.
            r.out_any(&split.line(us_per_cycle, "responder", None, refused));
        }
        return Ok(None);
    }
    rtts.sort_unstable();
    let one_way = |c: u64| c as f64 * us_per_cycle / 2.0;
    let mean = rtts.iter().sum::<u64>() as f64 / rtts.len() as f64 * us_per_cycle / 2.0;
    let [p50, p90, p99] = [50, 90, 99].map(|p| one_way(percentile(&rtts, p)));
    if split_line {
        r.out(&split.line(us_per_cycle, "initiator", Some(p50 * 2.0), refused));
    }
    Ok(Some(Lat { p50, mean, p90, p99, max: one_way(*rtts.last().unwrap()) }))
}

/// Streaming: rank 0 sends `iters` messages of `size` bytes with `window` in flight, the j-th on
/// the (j mod N)-th pair; rank 1 receives them and answers with one 8-byte message, which closes
/// the timed interval. Returns the seconds it took.
fn bandwidth(r: &Ring, size: usize, iters: usize, window: usize, bufs: &[(*mut u8, &Regs)], (sp, little): (*mut u8, &Regs), check: &mut Check) -> Res<f64> {
    let (net, n) = (&r.net, r.sends.len());
    let t0 = Instant::now();
    let mut inflight = std::collections::VecDeque::with_capacity(window);
    // The receiver checks message j once its receive is done, in its slot (j mod the slots).
    let done = |r: &Ring, q: *mut std::ffi::c_void, j: usize, check: &mut Check| -> Res<()> {
        r.wait_all(&[q])?;
        if r.rank == 1 {
            // SAFETY: the receive of message j into its slot is complete; size <= the slot.
            unsafe { check.verify(bufs[j % bufs.len()].0, size, size, j) };
        }
        Ok(())
    };
    for j in 0..iters {
        if inflight.len() == window {
            let (q, jq) = inflight.pop_front().unwrap();
            done(r, q, jq, check)?;
        }
        let k = j % n;
        let (bp, big) = bufs[j % bufs.len()];
        // SAFETY: see `latency`; size <= the buffer's length, and the request that last used this
        // slot is done (a window of requests, at most one per slot with --check).
        let q = unsafe {
            if r.rank == 0 {
                check.fill(bp, size, size, j);
                net.isend(r.sends[k], bp, size, 1, big.send[k])?
            } else {
                net.irecv(r.recvs[k], bp, size, 1, big.recv[k])?
            }
        };
        inflight.push_back((q, j));
    }
    while let Some((q, j)) = inflight.pop_front() {
        done(r, q, j, check)?;
    }
    // SAFETY: see `latency`.
    let q = unsafe {
        if r.rank == 0 {
            net.irecv(r.recvs[0], sp, 8, 2, little.recv[0])?
        } else {
            net.isend(r.sends[0], sp, 8, 2, little.send[0])?
        }
    };
    r.wait_all(&[q])?;
    Ok(t0.elapsed().as_secs_f64())
}

/// 1M, 64K, 4096: a size as `--sizes` takes it.
fn label(s: usize) -> String {
    match s {
        s if s >= 1 << 30 && s % (1 << 30) == 0 => format!("{}G", s >> 30),
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{}M", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{}K", s >> 10),
        s => s.to_string(),
    }
}

/// The `p`-th percentile of sorted, non-empty samples (nearest rank: the smallest sample with at
/// least p % of them at or below it).
fn percentile(sorted: &[u64], p: usize) -> u64 {
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

/// A cheap, monotonic cycle count (the TSC on x86_64; nanoseconds elsewhere).
fn cycles() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC exists on every x86_64 CPU and has no preconditions.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        T0.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::{percentile, Check};

    /// The pattern differs between messages, tests and positions, and a flipped byte is counted.
    #[test]
    fn the_data_check_counts_a_flipped_byte() {
        let mut c = Check { on: true, wrong: 0, messages: 0 };
        let mut a = vec![0u8; 4096];
        // SAFETY: `a` is 4096 bytes, used by nothing else.
        unsafe { c.fill(a.as_mut_ptr(), a.len(), 65536, 7) };
        assert!((0..4096).any(|b| Check::byte(65536, 7, b) != Check::byte(65536, 8, b)), "messages differ");
        assert!((0..4096).any(|b| Check::byte(65536, 7, b) != Check::byte(0, 7, b)), "tests differ");
        assert!(a.windows(2).any(|w| w[0] != w[1]) && a[..256] != a[256..512], "not one byte repeated");
        // SAFETY: as above.
        unsafe { c.verify(a.as_ptr(), a.len(), 65536, 7) };
        assert_eq!((c.wrong, c.messages), (0, 1));
        a[1234] ^= 0x10;
        // SAFETY: as above.
        unsafe { c.verify(a.as_ptr(), a.len(), 65536, 7) };
        assert_eq!(c.wrong, 1);
        // SAFETY: as above: the wrong message's pattern.
        unsafe { c.verify(a.as_ptr(), a.len(), 65536, 8) };
        assert!(c.wrong > 1000);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!([50, 90, 99, 100].map(|p| percentile(&v, p)), [50, 90, 99, 100]);
        assert_eq!(percentile(&[7], 99), 7);
        let v = [1, 2, 3, 4, 1000];
        assert_eq!((percentile(&v, 50), percentile(&v, 90), percentile(&v, 99)), (3, 1000, 1000));
    }
}
