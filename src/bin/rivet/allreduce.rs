//! `rivet allreduce -n N`: a ring allreduce (reduce-scatter then all-gather, float sum) of N local
//! processes over the plugin, printed with nccl-tests' columns, with a correctness check whose
//! error count is itself summed over the ring.

use crate::net::Res;
use crate::peer::Ring;
use crate::{parse_size, Args};
use std::ffi::c_void;
use std::time::Instant;

pub struct Opts {
    min: usize,
    max: usize,
    factor: usize,
    iters: usize,
    warmup: usize,
}

pub fn check_args(a: &mut Args) -> Res<Opts> {
    let min = parse_size(&a.opt(&["-b", "--minbytes"]).unwrap_or_else(|| "8".into()))?;
    let max = parse_size(&a.opt(&["-e", "--maxbytes"]).unwrap_or_else(|| "32M".into()))?;
    let factor: usize = a.opt(&["-f", "--stepfactor"]).unwrap_or_else(|| "4".into()).parse().map_err(|_| "bad -f")?;
    let iters: usize = a.opt(&["--iters"]).unwrap_or_else(|| "20".into()).parse().map_err(|_| "bad --iters")?;
    let warmup: usize = a.opt(&["--warmup"]).unwrap_or_else(|| "5".into()).parse().map_err(|_| "bad --warmup")?;
    if min < 4 || max < min || factor < 2 || iters == 0 {
        return Err("need 4 <= -b <= -e, -f >= 2, --iters >= 1".into());
    }
    if let Some(x) = a.rest.first() {
        return Err(format!("unexpected argument '{x}'"));
    }
    Ok(Opts { min, max, factor, iters, warmup })
}

struct Bufs {
    data: Vec<f32>,
    tmp: Vec<f32>,
    mh_data_s: *mut c_void,
    mh_data_r: *mut c_void,
    mh_tmp: *mut c_void,
}

fn seg(count: usize, n: usize, i: usize) -> (usize, usize) {
    (i * count / n, (i + 1) * count / n)
}

/// In-place ring allreduce of `b.data[..count]`.
fn allreduce(r: &Ring, b: &mut Bufs, count: usize) -> Res<()> {
    let (n, rank, net) = (r.nranks, r.rank, &r.net);
    let dp = b.data.as_mut_ptr();
    let tp = b.tmp.as_mut_ptr();
    for s in 0..n - 1 {
        let (slo, shi) = seg(count, n, (rank + n - s) % n);
        let (rlo, rhi) = seg(count, n, (rank + 2 * n - s - 1) % n);
        let rr = net.irecv(r.recv, tp as *mut u8, (rhi - rlo) * 4, s as i32, b.mh_tmp)?;
        let sr = net.isend(r.send, unsafe { dp.add(slo) } as *const u8, (shi - slo) * 4, s as i32, b.mh_data_s)?;
        r.wait_all(&[sr, rr])?;
        for (d, t) in b.data[rlo..rhi].iter_mut().zip(&b.tmp[..rhi - rlo]) {
            *d += *t;
        }
    }
    for s in 0..n - 1 {
        let (slo, shi) = seg(count, n, (rank + 1 + n - s) % n);
        let (rlo, rhi) = seg(count, n, (rank + n - s) % n);
        let rr = net.irecv(r.recv, unsafe { dp.add(rlo) } as *mut u8, (rhi - rlo) * 4, (n + s) as i32, b.mh_data_r)?;
        let sr = net.isend(r.send, unsafe { dp.add(slo) } as *const u8, (shi - slo) * 4, (n + s) as i32, b.mh_data_s)?;
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

pub fn peer(lib: &std::path::Path, rank: usize, nranks: usize, devs: &[i32], a: &mut Args) -> Res<u64> {
    let o = check_args(a)?;
    let r = Ring::join(lib, rank, nranks, devs)?;
    let maxcount = o.max / 4;
    let mut b = Bufs {
        data: vec![0f32; maxcount.max(nranks)],
        tmp: vec![0f32; maxcount / nranks + 1],
        mh_data_s: std::ptr::null_mut(),
        mh_data_r: std::ptr::null_mut(),
        mh_tmp: std::ptr::null_mut(),
    };
    let bytes = |v: &mut Vec<f32>| unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, v.len() * 4) };
    b.mh_data_s = r.net.reg(r.send, bytes(&mut b.data))?;
    b.mh_data_r = r.net.reg(r.recv, bytes(&mut b.data))?;
    b.mh_tmp = r.net.reg(r.recv, bytes(&mut b.tmp))?;

    r.out(&format!("# rivet allreduce: {nranks} processes in a ring over {}", r.net.path.display()));
    r.out("#");
    r.out(&format!(
        "# {:>10} {:>12} {:>8} {:>6} {:>6} {:>10} {:>8} {:>8} {:>7}",
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"
    ));
    r.out(&format!(
        "# {:>10} {:>12} {:>8} {:>6} {:>6} {:>10} {:>8} {:>8} {:>7}",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", ""
    ));
    let mut total_wrong = 0u64;
    let mut size = o.min;
    while size <= o.max {
        let count = size / 4;
        // Correctness pass.
        for (i, d) in b.data[..count].iter_mut().enumerate() {
            *d = input(rank, i);
        }
        allreduce(&r, &mut b, count)?;
        let wrong_local = b.data[..count].iter().enumerate().filter(|(i, d)| **d != expected(nranks, *i)).count();
        // Sum the error counts over the ring with the same allreduce (count = nranks elements).
        b.data[..nranks].iter_mut().for_each(|d| *d = 0.0);
        b.data[0] = wrong_local as f32;
        allreduce(&r, &mut b, nranks)?;
        let wrong = b.data[0] as u64;
        total_wrong += wrong_local as u64;
        // Timed passes.
        for _ in 0..o.warmup {
            allreduce(&r, &mut b, count)?;
        }
        let t0 = Instant::now();
        for _ in 0..o.iters {
            allreduce(&r, &mut b, count)?;
        }
        let us = t0.elapsed().as_secs_f64() * 1e6 / o.iters as f64;
        let algbw = size as f64 / us / 1e3;
        let busbw = algbw * 2.0 * (nranks - 1) as f64 / nranks as f64;
        r.out(&format!(
            "  {size:>10} {count:>12} {:>8} {:>6} {:>6} {us:>10.1} {algbw:>8.3} {busbw:>8.3} {wrong:>7}",
            "float", "sum", "-1"
        ));
        size *= o.factor;
    }
    r.net.dereg(r.send, b.mh_data_s)?;
    r.net.dereg(r.recv, b.mh_data_r)?;
    r.net.dereg(r.recv, b.mh_tmp)?;
    Ok(total_wrong)
}
