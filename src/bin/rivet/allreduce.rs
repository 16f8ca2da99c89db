//! `rivet allreduce -n N`: a ring allreduce (reduce-scatter then all-gather, float sum) of N local
//! processes over the plugin, out of place and in place, printed in nccl-tests' all_reduce_perf
//! layout (header, `# Using devices`, the two column groups, `# Out of bounds values`, `# Avg bus
//! bandwidth`) so that scripts written for nccl-tests parse it unchanged. Each size is checked
//! after it is timed, as nccl-tests does, and the error counts are summed over the ring.

use crate::net::Res;
use crate::peer::Ring;
use crate::{parse_size, Common};
use clap::Args;
use std::ffi::c_void;
use std::time::Instant;

#[derive(Args)]
pub struct Opts {
    /// Number of local processes (ranks) in the ring
    #[arg(long = "ranks", visible_alias = "nprocs", value_name = "RANKS", default_value_t = 2, value_parser = clap::value_parser!(u16).range(2..=64), allow_negative_numbers = true)]
    pub nprocs: u16,
    /// Smallest size in bytes (4096, 64K, 16M, 1G)
    #[arg(short = 'b', long = "minbytes", value_name = "SIZE", default_value = "8", value_parser = parse_size)]
    pub min: usize,
    /// Largest size in bytes
    #[arg(short = 'e', long = "maxbytes", value_name = "SIZE", default_value = "32M", value_parser = parse_size)]
    pub max: usize,
    /// Multiply the size by this factor between steps
    #[arg(short = 'f', long = "stepfactor", value_name = "FACTOR", default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=1024), allow_negative_numbers = true)]
    pub factor: u32,
    /// Timed iterations per size (all_reduce_perf's -n)
    #[arg(short = 'n', long = "iters", value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1_000_000), allow_negative_numbers = true)]
    pub iters: u32,
    /// Untimed iterations before the timed ones
    #[arg(short = 'w', long = "warmup_iters", visible_alias = "warmup", value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=1_000_000), allow_negative_numbers = true)]
    pub warmup: u32,
    /// Check the results of every size (0: off)
    #[arg(short = 'c', long = "check", value_name = "0|1", default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1), allow_negative_numbers = true)]
    pub check: u8,
    #[command(flatten)]
    pub common: Common,
}

impl Opts {
    /// What clap cannot check alone, checked before any process starts.
    pub fn check(&self) -> Res<()> {
        if self.min < 4 {
            return Err(format!("-b/--minbytes {} is below one float (4 bytes)", self.min));
        }
        if self.max < self.min {
            return Err(format!("-e/--maxbytes {} is below -b/--minbytes {}", self.max, self.min));
        }
        if self.max > 1 << 31 {
            return Err(format!("-e/--maxbytes {} is above 2G, the most a local run allocates", self.max));
        }
        Ok(())
    }
}

struct Bufs {
    /// The receive buffer (the in-place buffer too).
    data: Vec<f32>,
    /// The out-of-place send buffer.
    src: Vec<f32>,
    tmp: Vec<f32>,
    mh_src_s: *mut c_void,
    mh_data_s: *mut c_void,
    mh_data_r: *mut c_void,
    mh_tmp: *mut c_void,
}

fn seg(count: usize, n: usize, i: usize) -> (usize, usize) {
    (i * count / n, (i + 1) * count / n)
}

/// Ring allreduce of `count` floats into `b.data`, from `b.src` (out of place) or from `b.data`
/// itself (in place). In the reduce-scatter each rank receives segment k once, adds its own
/// contribution (src[k]) and passes the sum on; the all-gather then circulates the sums.
fn allreduce(r: &Ring, b: &mut Bufs, count: usize, in_place: bool) -> Res<()> {
    let (n, rank, net) = (r.nranks, r.rank, &r.net);
    let dp = b.data.as_mut_ptr();
    let (sp, mh_src) = if in_place { (dp as *const f32, b.mh_data_s) } else { (b.src.as_ptr(), b.mh_src_s) };
    let tp = b.tmp.as_mut_ptr();
    for s in 0..n - 1 {
        let (slo, shi) = seg(count, n, (rank + n - s) % n);
        let (rlo, rhi) = seg(count, n, (rank + 2 * n - s - 1) % n);
        // SAFETY: (this irecv and the isends and irecvs below) segments [lo, hi) of `count` floats
        // lie inside the registered buffers (tmp holds a segment), which outlive the ring's comms;
        // each step waits for its send and receive before the buffers are touched again.
        let rr = unsafe { net.irecv(r.recv(), tp as *mut u8, (rhi - rlo) * 4, s as i32, b.mh_tmp)? };
        // Step 0 sends this rank's own contribution; later steps the sums made at the step before.
        let (from, mh) = if s == 0 { (sp, mh_src) } else { (dp as *const f32, b.mh_data_s) };
        // SAFETY: see above.
        let sr = unsafe { net.isend(r.send(), from.add(slo) as *const u8, (shi - slo) * 4, s as i32, mh)? };
        r.wait_all(&[sr, rr])?;
        for i in 0..rhi - rlo {
            // SAFETY: rlo + i < count <= both buffers' lengths; sp and dp may alias (in place).
            unsafe { *dp.add(rlo + i) = *sp.add(rlo + i) + b.tmp[i] };
        }
    }
    for s in 0..n - 1 {
        let (slo, shi) = seg(count, n, (rank + 1 + n - s) % n);
        let (rlo, rhi) = seg(count, n, (rank + n - s) % n);
        // SAFETY: see above; the segments received and sent are different ones.
        let rr = unsafe { net.irecv(r.recv(), dp.add(rlo) as *mut u8, (rhi - rlo) * 4, (n + s) as i32, b.mh_data_r)? };
        // SAFETY: see above.
        let sr = unsafe { net.isend(r.send(), dp.add(slo) as *const u8, (shi - slo) * 4, (n + s) as i32, b.mh_data_s)? };
        r.wait_all(&[sr, rr])?;
    }
    Ok(())
}

/// Exactly representable inputs, so the float sum is exact and checkable.
fn input(rank: usize, i: usize) -> f32 {
    ((rank + 1) * (1 + i % 251)) as f32
}

fn expected(n: usize, i: usize) -> f32 {
    ((n * (n + 1) / 2) * (1 + i % 251)) as f32
}

/// The sum over the ring of one count per rank (with the same allreduce, on `nranks` floats).
fn ring_sum(r: &Ring, b: &mut Bufs, local: u64) -> Res<u64> {
    b.data[..r.nranks].iter_mut().for_each(|d| *d = 0.0);
    b.data[0] = local as f32;
    allreduce(r, b, r.nranks, true)?;
    Ok(b.data[0] as u64)
}

/// nccl-tests' time column: 2 decimals below 100 us, 1 below 10 ms, none above.
fn time_str(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:7.0}")
    } else if us >= 100.0 {
        format!("{us:7.1}")
    } else {
        format!("{us:7.2}")
    }
}

/// C's `%g`: 6 significant digits, trailing zeros dropped, an exponent outside 1e-5..1e6.
pub fn fmt_g(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let exp = v.abs().log10().floor() as i32;
    if !(-5..6).contains(&exp) {
        let s = format!("{:.5e}", v);
        let (m, e) = s.split_once('e').unwrap();
        let m = m.trim_end_matches('0').trim_end_matches('.');
        let e: i32 = e.parse().unwrap();
        return format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs());
    }
    let s = format!("{:.*}", (5 - exp).max(0) as usize, v);
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

pub fn peer(lib: &std::path::Path, rank: usize, nranks: usize, o: &Opts) -> Res<u64> {
    let devs = o.common.devs();
    if rank == 0 {
        println!(
            "OUT # nThread 1 nGpus 1 minBytes {} maxBytes {} step: {}(factor) warmup iters: {} iters: {} agg iters: 1 validation: {} graph: 0",
            o.min, o.max, o.factor, o.warmup, o.iters, o.check
        );
        println!("OUT #");
        println!("OUT # Using devices");
    }
    let maxcount = o.max / 4;
    let mut b = Bufs {
        data: vec![0f32; maxcount.max(nranks)],
        src: vec![0f32; maxcount.max(1)],
        tmp: vec![0f32; maxcount / nranks + 1],
        mh_src_s: std::ptr::null_mut(),
        mh_data_s: std::ptr::null_mut(),
        mh_data_r: std::ptr::null_mut(),
        mh_tmp: std::ptr::null_mut(),
    };
    // The ring (and its comms) is made after the buffers, so it is dropped before them: on an
    // error return no comm with requests in flight outlives the memory they name.
    let r = Ring::join(lib, rank, nranks, &devs, true)?;
    // SAFETY: the bytes of a Vec<f32> (any bit pattern is a valid f32), for as long as the borrow.
    let bytes = |v: &mut Vec<f32>| unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, v.len() * 4) };
    b.mh_src_s = r.net.reg(r.send(), bytes(&mut b.src))?;
    b.mh_data_s = r.net.reg(r.send(), bytes(&mut b.data))?;
    b.mh_data_r = r.net.reg(r.recv(), bytes(&mut b.data))?;
    b.mh_tmp = r.net.reg(r.recv(), bytes(&mut b.tmp))?;

    r.out(&format!("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          ", "", "", "", "", ""));
    r.out(&format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6} {:>6}  {:>7}  {:>6}  {:>6} {:>6}",
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"
    ));
    r.out(&format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>5}  {:>7}  {:>6}  {:>6}  {:>5}",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
    ));
    let (mut failed_tests, mut local_wrong_total) = (0u64, 0u64);
    let (mut bw_sum, mut bw_count) = (0f64, 0u32);
    let mut size = o.min;
    while size <= o.max {
        let count = size / 4;
        let mut row = format!("{:>12}  {count:>12}  {:>8}  {:>6}  {:>6}", count * 4, "float", "sum", -1);
        for in_place in [false, true] {
            for _ in 0..o.warmup {
                allreduce(&r, &mut b, count, in_place)?;
            }
            let t0 = Instant::now();
            for _ in 0..o.iters {
                allreduce(&r, &mut b, count, in_place)?;
            }
            let us = t0.elapsed().as_secs_f64() * 1e6 / o.iters as f64;
            // nccl-tests reports the time averaged over the ranks.
            let us = ring_sum(&r, &mut b, (us * 1000.0) as u64)? as f64 / 1000.0 / nranks as f64;
            let algbw = (count * 4) as f64 / 1e9 / (us / 1e6);
            let busbw = algbw * 2.0 * (nranks - 1) as f64 / nranks as f64;
            let wrong = if o.check == 1 {
                // Inputs in the send buffer (the receive buffer itself in place); out of place, the
                // receive buffer starts as a value no sum produces, so a missed write shows.
                let target = if in_place { &mut b.data } else { &mut b.src };
                for (i, d) in target[..count].iter_mut().enumerate() {
                    *d = input(rank, i);
                }
                if !in_place {
                    b.data[..count].iter_mut().for_each(|d| *d = -1.0);
                }
                allreduce(&r, &mut b, count, in_place)?;
                let local = b.data[..count].iter().enumerate().filter(|(i, d)| **d != expected(nranks, *i)).count() as u64;
                local_wrong_total += local;
                Some(ring_sum(&r, &mut b, local)?)
            } else {
                None
            };
            if wrong.is_some_and(|w| w > 0) {
                failed_tests += 1;
            }
            let wrong = wrong.map_or("N/A".to_string(), |w| w.to_string());
            row += &format!("  {}  {algbw:>6.2}  {busbw:>6.2}  {wrong:>5}", time_str(us));
            bw_sum += busbw;
            bw_count += 1;
        }
        r.out(&row);
        match size.checked_mul(o.factor as usize) {
            Some(s) => size = s,
            None => break,
        }
    }
    r.out(&format!("# Out of bounds values : {failed_tests} {}", if failed_tests == 0 { "OK" } else { "FAILED" }));
    r.out(&format!("# Avg bus bandwidth    : {} ", fmt_g(bw_sum / bw_count.max(1) as f64)));
    r.out("#");
    r.out("");
    r.net.dereg(r.send(), b.mh_src_s)?;
    r.net.dereg(r.send(), b.mh_data_s)?;
    r.net.dereg(r.recv(), b.mh_data_r)?;
    r.net.dereg(r.recv(), b.mh_tmp)?;
    Ok(local_wrong_total)
}

#[cfg(test)]
mod tests {
    #[test]
    fn c_percent_g() {
        for (v, s) in [(12.3456789, "12.3457"), (0.5, "0.5"), (100.0, "100"), (0.000123, "0.000123"), (1234567.0, "1.23457e+06"), (0.0000012, "1.2e-06"), (0.0, "0")] {
            assert_eq!(super::fmt_g(v), s, "{v}");
        }
    }
}
