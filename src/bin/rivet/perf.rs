//! `rivet perf`: 8-byte ping-pong latency and streaming bandwidth between two local processes
//! through the plugin, printed as a table.

use crate::net::Res;
use crate::peer::Ring;
use crate::{parse_size, Common};
use clap::Args;
use std::time::Instant;

#[derive(Args)]
pub struct Opts {
    /// Message sizes of the bandwidth test
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "64K,256K,1M,4M,16M,64M,256M", value_parser = parse_size)]
    pub sizes: Vec<usize>,
    /// Messages in flight in the bandwidth test
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=32), allow_negative_numbers = true)]
    pub window: u16,
    /// Bytes to move per size (at least 8 messages, at most 100000)
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_size)]
    pub bytes: usize,
    /// Round trips of the 8-byte latency test (0: no latency test)
    #[arg(long = "lat-iters", value_name = "N", default_value_t = 2000, value_parser = clap::value_parser!(u32).range(0..=10_000_000), allow_negative_numbers = true)]
    pub lat_iters: u32,
    /// Buffers in GPU memory (CUDA device 0), registered as NCCL_PTR_CUDA
    #[arg(long)]
    pub cuda: bool,
    #[command(flatten)]
    pub common: Common,
}

impl Opts {
    /// What clap cannot check alone, checked before any process starts.
    pub fn check(&self) -> Res<()> {
        if self.sizes.contains(&0) {
            return Err("--sizes: a size of 0 bytes moves nothing (examples: 64K,1M,16M)".into());
        }
        if self.sizes.iter().any(|&s| s > 1 << 31) {
            return Err("--sizes: the largest size a local run allocates is 2G".into());
        }
        Ok(())
    }
}

pub fn peer(lib: &std::path::Path, rank: usize, nranks: usize, o: &Opts) -> Res<u64> {
    let devs = o.common.devs();
    let (window, lat_iters) = (o.window as usize, o.lat_iters as usize);
    let max = o.sizes.iter().copied().max().unwrap_or(8).max(8);
    // Real pages with data (a zero-filled allocation would be lazily mapped to the zero page).
    let mut buf: Vec<u8> = (0..max).map(|i| (i * 131 + rank) as u8).collect();
    let mut small = [0u8; 8];
    // With --cuda the same pattern lives in GPU memory, registered as CUDA buffers.
    let gpu = if o.cuda {
        let big = nccl_net_rivet::gpu::cuda::DeviceBuf::new(0, max).map_err(|e| e.msg)?;
        big.upload(&buf).map_err(|e| e.msg)?;
        let small = nccl_net_rivet::gpu::cuda::DeviceBuf::new(0, 8).map_err(|e| e.msg)?;
        Some((big, small))
    } else {
        None
    };
    // The ring (and its comms) is made after the buffers, so it is dropped before them: on an
    // error return no comm with requests in flight outlives the memory they name.
    let r = Ring::join(lib, rank, nranks, &devs, false)?;
    let net = &r.net;
    let (bp, sp, ty) = match &gpu {
        Some((b, s)) => (b.ptr() as *mut u8, s.ptr() as *mut u8, nccl_net_rivet::abi::types::NCCL_PTR_CUDA),
        None => (buf.as_mut_ptr(), small.as_mut_ptr(), nccl_net_rivet::abi::types::NCCL_PTR_HOST),
    };
    // SAFETY: `bp` is `max` bytes and `sp` 8 of memory of type `ty` (the buffers above), which
    // outlive the ring and its comms, and so every registration and request on them.
    let (mh_s, mh_r) = unsafe { (net.reg_ptr(r.send, bp, max, ty)?, net.reg_ptr(r.recv, bp, max, ty)?) };
    // SAFETY: as above.
    let (mh_small_s, mh_small_r) = unsafe { (net.reg_ptr(r.send, sp, 8, ty)?, net.reg_ptr(r.recv, sp, 8, ty)?) };
    let p = net.props(r.dev)?;
    let name = p.name.clone();
    let cfg = nccl_net_rivet::config::get();
    // rivet's own settings say how many lanes a connection has; another plugin's are its own.
    let lanes = match (net.name(), r.transport) {
        ("rivet", "TCP") => format!(", {} stream(s)", cfg.socket_nstreams),
        ("rivet", _) => format!(", {} QP(s)", cfg.ib_qps),
        _ => String::new(),
    };
    r.out(&format!(
        "# rivet perf: {} (ncclNet v{}, plugin {}) dev {} ({name}, {} Mb/s), {}{lanes}, window {}, {} buffers",
        net.path.display(),
        net.version(),
        net.name(),
        r.dev,
        p.speed,
        r.transport,
        window,
        if o.cuda { "GPU (CUDA device 0)" } else { "host" }
    ));

    // Latency: rank 0 sends 8 bytes, rank 1 echoes them. Each side keeps its next receive posted
    // ahead (as NCCL does), so a clear-to-send is never on the critical path. Rank 0 times every
    // round trip with the cycle counter (as perftest does: reading the clock can be a system call
    // in a VM) and reports the median ("typical"), the mean, and the tail (p90, p99, max), halved.
    let warm = if lat_iters == 0 { 0 } else { 100 };
    let mut rtts: Vec<u64> = Vec::with_capacity(lat_iters);
    let (mut t0, mut c0) = (Instant::now(), cycles());
    // SAFETY: (here and in each isend and irecv below) the buffers outlive the comms (see the
    // registrations); a benchmark lets a send and a receive share the small buffer, whose bytes
    // it never checks.
    let mut rr = if lat_iters == 0 { std::ptr::null_mut() } else { unsafe { net.irecv(r.recv, sp, 8, 0, mh_small_r)? } };
    for i in 0..warm + lat_iters {
        if i == warm {
            (t0, c0) = (Instant::now(), cycles());
        }
        let last = i + 1 == warm + lat_iters;
        if rank == 0 {
            let start = cycles();
            // SAFETY: see above.
            let sr = unsafe { net.isend(r.send, sp, 8, 0, mh_small_s)? };
            r.wait_all(&[rr])?;
            if i >= warm {
                rtts.push(cycles().wrapping_sub(start));
            }
            if !last {
                // SAFETY: see above.
                rr = unsafe { net.irecv(r.recv, sp, 8, 0, mh_small_r)? };
            }
            r.wait_all(&[sr])?;
        } else {
            r.wait_all(&[rr])?;
            if !last {
                // SAFETY: see above.
                rr = unsafe { net.irecv(r.recv, sp, 8, 0, mh_small_r)? };
            }
            // SAFETY: see above.
            let sr = unsafe { net.isend(r.send, sp, 8, 0, mh_small_s)? };
            r.wait_all(&[sr])?;
        }
    }
    if rank == 0 && !rtts.is_empty() {
        let us_per_cycle = t0.elapsed().as_secs_f64() * 1e6 / cycles().wrapping_sub(c0).max(1) as f64;
        rtts.sort_unstable();
        let one_way = |c: u64| c as f64 * us_per_cycle / 2.0;
        let mean = rtts.iter().sum::<u64>() as f64 / rtts.len() as f64 * us_per_cycle / 2.0;
        let [p50, p90, p99] = [50, 90, 99].map(|p| one_way(percentile(&rtts, p)));
        let max = one_way(*rtts.last().unwrap());
        r.out(&format!(
            "# latency (8 B ping-pong, one way): typical {p50:.2} us, average {mean:.2} us, p90 {p90:.2} us, p99 {p99:.2} us, max {max:.2} us"
        ));
    }
    r.out(&format!("#{:>12} {:>8} {:>12} {:>10}", "size(B)", "iters", "time(us)", "GB/s"));

    // Bandwidth: rank 0 streams `iters` messages with `window` in flight; rank 1 receives them and
    // answers with one 8-byte message, which closes the timed interval.
    for &size in &o.sizes {
        let iters = (o.bytes / size.max(1)).clamp(8, 100_000);
        let t0 = Instant::now();
        let mut inflight = std::collections::VecDeque::with_capacity(window);
        for _ in 0..iters {
            if inflight.len() == window {
                let q: *mut std::ffi::c_void = inflight.pop_front().unwrap();
                r.wait_all(&[q])?;
            }
            // SAFETY: see above; size <= max.
            let q = unsafe { if rank == 0 { net.isend(r.send, bp, size, 1, mh_s)? } else { net.irecv(r.recv, bp, size, 1, mh_r)? } };
            inflight.push_back(q);
        }
        let rest: Vec<_> = inflight.into_iter().collect();
        r.wait_all(&rest)?;
        if rank == 0 {
            // SAFETY: see above.
            let rr = unsafe { net.irecv(r.recv, sp, 8, 2, mh_small_r)? };
            r.wait_all(&[rr])?;
        } else {
            // SAFETY: see above.
            let sr = unsafe { net.isend(r.send, sp, 8, 2, mh_small_s)? };
            r.wait_all(&[sr])?;
        }
        let dt = t0.elapsed().as_secs_f64();
        let gbs = (size * iters) as f64 / dt / 1e9;
        r.out(&format!(" {size:>12} {iters:>8} {:>12.1} {gbs:>10.3}", dt * 1e6 / iters as f64));
    }
    // GPU buffers: the receiver's holds what the sender's last message carried.
    let mut wrong = 0;
    if let (Some((b, _)), Some(&last)) = (&gpu, o.sizes.last()) {
        if rank == 1 {
            let mut got = vec![0u8; last];
            b.download(&mut got).map_err(|e| e.msg)?;
            wrong = got.iter().enumerate().filter(|(i, v)| **v != (i * 131) as u8).count() as u64;
            // Rank 1 speaks here (r.out is rank 0's): the launcher prints every rank's OUT lines.
            println!("OUT # GPU buffer check: {wrong} wrong byte(s) of {last}");
        }
    }
    for (c, m) in [(r.send, mh_s), (r.recv, mh_r), (r.send, mh_small_s), (r.recv, mh_small_r)] {
        net.dereg(c, m)?;
    }
    Ok(wrong)
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
    use super::percentile;

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!([50, 90, 99, 100].map(|p| percentile(&v, p)), [50, 90, 99, 100]);
        assert_eq!(percentile(&[7], 99), 7);
        let v = [1, 2, 3, 4, 1000];
        assert_eq!((percentile(&v, 50), percentile(&v, 90), percentile(&v, 99)), (3, 1000, 1000));
    }
}
