//! `rivet`: drives the built plugin through the same C ABI NCCL uses.
//!
//!   rivet perf [--sizes 64K,1M,...] [--window W] [--bytes TOTAL] [--lat-iters N] [--cuda]
//!   rivet allreduce -n N [-b MIN] [-e MAX] [-f FACTOR] [--iters I] [--warmup W]
//!   rivet info
//!   rivet config
//!   rivet topo [--json] [--sysfs ROOT]
//!   rivet doctor [--json] [--selftest] [--save FILE] [--diff FILE]
//! Common: --lib PATH (or RIVET_LIB) picks the plugin library.

mod allreduce;
mod net;
mod peer;
mod perf;
mod topo;

use net::Res;
use std::time::Duration;

pub struct Args {
    pub rest: Vec<String>,
}

impl Args {
    /// Take `--name VALUE` (or `-n VALUE`) out of the list.
    pub fn opt(&mut self, names: &[&str]) -> Option<String> {
        let i = self.rest.iter().position(|a| names.contains(&a.as_str()))?;
        if i + 1 >= self.rest.len() {
            return None;
        }
        let v = self.rest.remove(i + 1);
        self.rest.remove(i);
        Some(v)
    }
}

/// "64K", "16M", "1G", "4096".
pub fn parse_size(s: &str) -> Res<usize> {
    let s = s.trim().to_ascii_uppercase();
    let (num, mul) = match s.chars().last() {
        Some('K') => (&s[..s.len() - 1], 1usize << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        _ => (&s[..], 1),
    };
    num.parse::<usize>().map(|n| n * mul).map_err(|_| format!("bad size '{s}' (examples: 4096, 64K, 16M, 1G)"))
}

/// The arguments every peer of a local run gets: the mode's options, checked here before any
/// process starts, and the library this launcher resolved.
fn peer_args(a: &mut Args, check: impl Fn(&mut Args) -> Res<()>) -> Res<Vec<String>> {
    let lib = net::find_library(a.opt(&["--lib"]).as_deref())?;
    let dev = a.opt(&["--dev"]).unwrap_or_else(|| "0".into());
    parse_devs(&dev)?;
    check(&mut Args { rest: a.rest.clone() })?;
    let mut args = a.rest.clone();
    args.extend(["--lib".to_string(), lib.display().to_string(), "--dev".to_string(), dev]);
    Ok(args)
}

/// `--dev 0` or `--dev 0,1`: rank r uses the (r mod n)-th device of the list.
fn parse_devs(s: &str) -> Res<Vec<i32>> {
    s.split(',')
        .map(|d| d.trim().parse::<i32>().ok().filter(|&d| d >= 0).ok_or_else(|| format!("bad --dev '{s}' (examples: 0, or 0,1)")))
        .collect()
}

fn usage() -> ! {
    eprintln!(
        "usage:\n  rivet perf [--sizes 64K,1M,16M,256M] [--window 8] [--bytes 1G] [--lat-iters 2000] [--cuda] [--dev 0[,1]] [--lib PATH]\n  \
         rivet allreduce -n NPROCS [-b 8] [-e 32M] [-f 4] [--iters 20] [--warmup 5] [--dev 0[,1]] [--lib PATH]\n  \
         rivet info [--lib PATH]     devices and properties as NCCL sees them\n  \
         rivet config                every environment variable rivet reads, with its value\n  \
         rivet topo [--json] [--sysfs ROOT]  GPU x NIC PCIe path classes (PIX/PXB/PHB/NODE/SYS) from sysfs\n  \
         rivet doctor [--json] [--selftest] [--save FILE] [--diff FILE]  pre-flight check of this node (exit 1 on --diff changes)\n\
         --dev: the device of each rank (rank r uses the (r mod n)-th of the list; default 0).\n\
         The plugin is --lib PATH, $RIVET_LIB, or libnccl-net-rivet.so next to this executable."
    );
    std::process::exit(2)
}

/// `rivet doctor --selftest`: a short loopback transfer through the plugin on every device (two
/// processes on the same device, as `rivet perf --dev d,d` runs them), reported next to what the
/// port's speed promises.
fn self_test(lib: Option<&str>, gpu: bool) -> Res<nccl_net_rivet::doctor::Section> {
    use nccl_net_rivet::doctor::{Section, Verdict};
    let lib = net::find_library(lib)?;
    let n = net::Net::load(&lib)?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut s = Section::new("Self-test");
    let mut failed = 0;
    let ndev = n.ndev()?;
    for d in 0..ndev {
        let p = n.props(d)?;
        let name = if p.name.is_null() { "?".into() } else { unsafe { std::ffi::CStr::from_ptr(p.name) }.to_string_lossy().into_owned() };
        // Host memory, then (with a GPU) GPU memory by the path rivet chooses for it.
        for cuda in [false, true] {
            if cuda && !gpu {
                continue;
            }
            let mut c = std::process::Command::new(&exe);
            c.args(["perf", "--lib"]).arg(&lib);
            c.args(["--dev", &format!("{d},{d}"), "--sizes", "1M", "--bytes", "64M", "--lat-iters", "200"]);
            if cuda {
                c.arg("--cuda").env("NCCL_DEBUG", "INFO").env("RIVET_STATS", "1");
            }
            let out = c.output().map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            let lat = text.lines().find_map(|l| l.split("typical ").nth(1)?.split(' ').next()?.parse::<f64>().ok());
            let bw = text.lines().filter(|l| !l.starts_with('#')).find_map(|l| l.split_whitespace().last()?.parse::<f64>().ok());
            let what = if cuda { "GPU memory" } else { "host memory" };
            match (out.status.success(), lat, bw) {
                (true, Some(lat), Some(bw)) => {
                    let line_rate = p.speed as f64 / 8000.0;
                    let path = if cuda {
                        err.lines()
                            .find_map(|l| l.split("NET/rivet: ").nth(1).filter(|m| m.starts_with("GDR on") || m.starts_with("host staging for GPU")))
                            .map(|m| format!(", {m}"))
                            .unwrap_or_default()
                    } else {
                        String::new()
                    };
                    s.lines.push(format!(
                        "dev {d} ({name}), {what}: 8 B latency {lat:.1} us, 1 MiB streaming {bw:.2} GB/s = {:.0}% of the port's {} Mb/s ({line_rate:.2} GB/s){path}",
                        100.0 * bw / line_rate,
                        p.speed
                    ));
                }
                _ => {
                    failed += 1;
                    s.warn(
                        format!(
                            "the loopback transfer of {what} on dev {d} ({name}) failed: {}",
                            err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output")
                        ),
                        format!("run `NCCL_DEBUG=INFO rivet perf --dev {d},{d}{}` for the plugin's own messages", if cuda { " --cuda" } else { "" }),
                    );
                }
            }
        }
    }
    s.verdict = if failed > 0 { Verdict::Fail } else { Verdict::Ok };
    let runs = ndev * if gpu { 2 } else { 1 };
    s.summary = format!(
        "{} of {runs} loopback transfer(s) passed ({ndev} device(s), host memory{})",
        runs - failed,
        if gpu { " and GPU memory" } else { "" }
    );
    Ok(s)
}

/// `rivet doctor [--json] [--selftest] [--save FILE] [--diff FILE]`.
fn doctor(a: &mut Args) -> Res<i32> {
    use nccl_net_rivet::doctor;
    let json = a.rest.iter().any(|x| x == "--json");
    let save = a.opt(&["--save"]);
    let diff = a.opt(&["--diff"]);
    let selftest = a.rest.iter().any(|x| x == "--selftest");
    let lib = a.opt(&["--lib"]);
    let f = doctor::Facts::gather();
    let mut sections = doctor::analyze(&f);
    if selftest {
        let gpu = matches!(&f.cuda, Ok((_, g)) if !g.is_empty());
        sections.push(self_test(lib.as_deref(), gpu)?);
    }
    let facts = doctor::fact_map(&f);
    if json {
        println!("{}", doctor::to_json(&sections, &facts));
    } else {
        print!("{}", doctor::render(&sections));
    }
    if let Some(path) = save {
        std::fs::write(&path, doctor::to_json(&sections, &facts) + "\n").map_err(|e| format!("cannot write {path}: {e}"))?;
        eprintln!("rivet doctor: baseline saved to {path}");
    }
    if let Some(path) = diff {
        let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
        let old = doctor::load_facts(&text).map_err(|e| format!("{path}: {e}"))?;
        let (lines, matters) = doctor::diff(&old, &facts);
        println!("== changes since {path}: {}", if lines.is_empty() { "none" } else if matters { "yes" } else { "informational only" });
        for l in lines {
            println!("   {l}");
        }
        return Ok(if matters { 1 } else { 0 });
    }
    Ok(0)
}

fn run() -> Res<i32> {
    let mut argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.is_empty() {
        usage();
    }
    let cmd = argv.remove(0);
    if cmd == "__peer" {
        // Internal: one rank of a local multi-process run started by `launch`.
        let mode = argv.remove(0);
        let rank: usize = argv.remove(0).parse().map_err(|_| "bad rank")?;
        let nranks: usize = argv.remove(0).parse().map_err(|_| "bad nranks")?;
        let mut a = Args { rest: argv };
        let lib = net::find_library(a.opt(&["--lib"]).as_deref())?;
        let devs = parse_devs(&a.opt(&["--dev"]).unwrap_or_else(|| "0".into()))?;
        let wrong = match mode.as_str() {
            "perf" => perf::peer(&lib, rank, nranks, &devs, &mut a)?,
            "allreduce" => allreduce::peer(&lib, rank, nranks, &devs, &mut a)?,
            m => return Err(format!("unknown peer mode {m}")),
        };
        println!("DONE wrong={wrong}");
        return Ok(0);
    }
    let mut a = Args { rest: argv };
    let timeout = Duration::from_secs(600);
    match cmd.as_str() {
        "perf" => {
            if a.rest.iter().any(|x| x == "--cuda") {
                nccl_net_rivet::cuda::get().map_err(|why| format!("--cuda: no usable CUDA driver: {why}"))?;
                if std::env::var_os("RIVET_SOCKET_CUDA").is_none() {
                    // GPU buffers over the TCP transport go through the staging engine only when asked.
                    std::env::set_var("RIVET_SOCKET_CUDA", "1");
                }
            }
            let args = peer_args(&mut a, |a| perf::check_args(a).map(drop))?;
            let wrong = peer::launch(2, "perf", &args, timeout)?;
            Ok(if wrong == 0 { 0 } else { 1 })
        }
        "allreduce" => {
            let n: usize = a.opt(&["-n", "--nprocs"]).unwrap_or_else(|| "2".into()).parse().map_err(|_| "bad -n")?;
            if !(2..=64).contains(&n) {
                return Err("-n must be between 2 and 64".into());
            }
            let args = peer_args(&mut a, |a| allreduce::check_args(a).map(drop))?;
            let wrong = peer::launch(n, "allreduce", &args, timeout)?;
            println!("# Out of bounds values : {wrong} {}", if wrong == 0 { "OK" } else { "FAILED" });
            Ok(if wrong == 0 { 0 } else { 1 })
        }
        "info" => {
            let lib = net::find_library(a.opt(&["--lib"]).as_deref())?;
            let n = net::Net::load(&lib)?;
            println!("library: {}", std::fs::canonicalize(&n.path).unwrap_or(n.path.clone()).display());
            for d in 0..n.ndev()? {
                let p = n.props(d)?;
                let s = |c: *mut std::ffi::c_char| {
                    if c.is_null() {
                        "(none)".to_string()
                    } else {
                        unsafe { std::ffi::CStr::from_ptr(c) }.to_string_lossy().into_owned()
                    }
                };
                println!(
                    "dev {d}: name {} pci {} guid {:#x} speed {} Mb/s ptrSupport {:#x} regIsGlobal {} maxComms {} maxRecvs {} maxP2pBytes {}",
                    s(p.name), s(p.pciPath), p.guid, p.speed, p.ptrSupport, p.regIsGlobal, p.maxComms, p.maxRecvs, p.maxP2pBytes
                );
            }
            Ok(0)
        }
        "config" => {
            for v in nccl_net_rivet::config::VARS {
                let cur = std::env::var(v.name).unwrap_or_else(|_| "(unset)".into());
                println!("{:<24} default {:<22} now {:<12} {}", v.name, v.default, cur, v.meaning);
            }
            Ok(0)
        }
        "topo" => topo::run(&mut a),
        "doctor" => doctor(&mut a),
        "-h" | "--help" | "help" => usage(),
        c => Err(format!("unknown command '{c}' (try `rivet --help`)")),
    }
}

fn main() {
    match run() {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("rivet: error: {e}");
            std::process::exit(1);
        }
    }
}
