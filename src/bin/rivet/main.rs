//! `rivet`: drives the built plugin through the same C ABI NCCL uses (`rivet --help`).
#![deny(clippy::undocumented_unsafe_blocks)]

mod allreduce;
mod doctor;
mod net;
mod table;
mod peer;
mod perf;
mod soak;
mod topo;
mod usage;

use clap::{Args, Parser, Subcommand};
use net::Res;
use std::path::PathBuf;
use std::time::Duration;

/// `rivet --version`: the crate version, the git revision it was built from, and the ncclNet
/// tables the plugin exports (tests/cli.rs checks them against the built library's symbols).
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("RIVET_GIT_REV"),
    ")\nncclNet ABI versions exported: v6 v7 v8 v9 v10 v11 v12 (ncclNetPlugin_v6 ... ncclNetPlugin_v12)"
);

#[derive(Parser)]
#[command(
    name = "rivet",
    version = LONG_VERSION,
    about = "rivet: an NCCL network plugin over RDMA verbs and TCP, and the tools to check it",
    after_help = "The plugin is --lib PATH, $RIVET_LIB, or libnccl-net-rivet.so next to this executable (or in ../lib, or cargo's target directory).\nEnvironment variables (NCCL_*, RIVET_*): `rivet config`."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// A ring allreduce of RANKS local processes (--ranks) through the plugin, in nccl-tests' all_reduce_perf layout
    Allreduce(allreduce::Opts),
    /// 8-byte ping-pong latency and streaming bandwidth between two local processes through the plugin
    Perf(perf::Opts),
    /// The plugin's devices and their properties, as NCCL sees them
    Info(LibOpt),
    /// Two ranks stream both ways for N minutes: random sizes, tags, groups and windows, every byte checked, host then staged buffers; fails on any error or growth of RSS, fds or threads
    Soak(soak::Opts),
    /// Every environment variable rivet reads, with its default and the value in effect
    Config,
    /// The GPU x NIC PCIe topology (the shape of `nvidia-smi topo -m`), from sysfs or an example machine
    Topo(topo::Opts),
    /// Pre-flight check of this node: RDMA ports, limits, GPUDirect, topology, transport, per-GPU decisions
    Doctor(doctor::Opts),
    /// Internal: one rank of a local multi-process run (started by `allreduce` and `perf`)
    #[command(name = "__peer", hide = true)]
    Peer(PeerOpts),
}

#[derive(Args, Clone)]
pub struct LibOpt {
    /// The plugin library to load [default: $RIVET_LIB, else libnccl-net-rivet.so next to this executable]: rivet, or any ncclNet plugin
    #[arg(long, value_name = "PATH")]
    pub lib: Option<PathBuf>,
    /// The ncclNet table version to drive it through (6-12) [default: the newest it exports]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(6..=12))]
    pub abi: Option<u32>,
    /// The communicator's traffic class handed to the plugin (v10: connect's config; v11+:
    /// init's), as NCCL passes NCCL_IB_TC-like per-communicator QoS [default: undefined, -1]
    #[arg(long = "traffic-class", value_name = "TC", value_parser = clap::value_parser!(u8))]
    pub traffic_class: Option<u8>,
}

/// Options every multi-process mode takes.
#[derive(Args, Clone)]
pub struct Common {
    #[command(flatten)]
    pub lib: LibOpt,
    /// Device of each rank: rank r uses the (r mod n)-th of the list (see `rivet info`); "0+2" is
    /// a virtual NIC each rank makes of devices 0 and 2 (makeVDevice, NIC fusion)
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "0", value_parser = parse_dev)]
    pub dev: Vec<Vec<i32>>,
}

/// "3", or "0+2" (members of a virtual NIC).
fn parse_dev(s: &str) -> Result<Vec<i32>, String> {
    let d: Vec<i32> = s
        .split('+')
        .map(|x| x.trim().parse::<u16>().map(i32::from).map_err(|_| format!("{s}: a device is a number, or numbers joined by + (a virtual NIC)")))
        .collect::<Result<_, _>>()?;
    if d.len() > 8 {
        return Err(format!("{s}: a virtual NIC has at most 8 members"));
    }
    Ok(d)
}

impl Common {
    /// `--dev` as the plugin numbers devices (several: a virtual NIC of them).
    pub fn devs(&self) -> Vec<Vec<i32>> {
        self.dev.clone()
    }
}

#[derive(Args)]
struct PeerOpts {
    rank: usize,
    nranks: usize,
    lib: PathBuf,
    /// The launcher's own subcommand line (`allreduce -n 4 ...`), parsed again here.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    argv: Vec<String>,
}

/// "64K", "16M", "1G", "4096" (nccl-tests' units: powers of 1024).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mul) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1usize << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("'{s}' is not a size (examples: 4096, 64K, 16M, 1G)"))
}

/// Run `mode` on `n` local ranks of this executable, each given this command line again.
fn launch(n: usize, lib: &LibOpt) -> Res<u64> {
    launch_env(n, lib, &[], Duration::from_secs(600))
}

fn launch_env(n: usize, lib: &LibOpt, env: &[(&str, String)], timeout: Duration) -> Res<u64> {
    let lib = net::find_library(lib.lib.as_deref())?;
    let argv: Vec<String> = std::env::args().skip(1).collect();
    peer::launch(n, &lib, &argv, env, timeout)
}

fn run(cli: Cli) -> Res<i32> {
    match cli.cmd {
        Cmd::Peer(p) => {
            let mut full = vec!["rivet".to_string()];
            full.extend(p.argv);
            let inner = Cli::try_parse_from(full).map_err(|e| format!("peer: {e}"))?;
            net::set_opts(match &inner.cmd {
                Cmd::Perf(o) => Some(&o.common.lib),
                Cmd::Allreduce(o) => Some(&o.common.lib),
                Cmd::Soak(o) => Some(&o.common.lib),
                _ => None,
            });
            let wrong = match inner.cmd {
                Cmd::Perf(o) => perf::peer(&p.lib, p.rank, p.nranks, &o)?,
                Cmd::Allreduce(o) => allreduce::peer(&p.lib, p.rank, p.nranks, &o)?,
                Cmd::Soak(o) => soak::peer(&p.lib, p.rank, p.nranks, &o)?,
                _ => return Err("peer: not a multi-process mode".into()),
            };
            println!("DONE wrong={wrong}");
            Ok(0)
        }
        Cmd::Perf(o) => {
            o.check()?;
            if o.cuda {
                nccl_net_rivet::gpu::cuda::get().map_err(|why| format!("--cuda: no usable CUDA driver: {why}"))?;
                if std::env::var_os("RIVET_SOCKET_CUDA").is_none() {
                    // GPU buffers over the TCP transport go through the staging engine only when asked.
                    std::env::set_var("RIVET_SOCKET_CUDA", "1");
                }
            }
            if o.comms.is_empty() {
                let wrong = launch(2, &o.common.lib)?;
                return Ok(if wrong == 0 { 0 } else { 1 });
            }
            // One pair of fresh processes per N, so that no row inherits another's memory. An N
            // that fails is a row of the result too: the others still run.
            let (mut bad, mut header) = (0, true);
            for n in &o.comms {
                let mut env = vec![(perf::COMMS_ENV, n.to_string())];
                if header {
                    env.push((perf::HEADER_ENV, "1".into()));
                }
                match launch_env(2, &o.common.lib, &env, Duration::from_secs(1800)) {
                    Ok(wrong) => {
                        header = false;
                        bad += wrong;
                    }
                    Err(e) => {
                        println!("# {n} comms: FAILED: {e}");
                        bad += 1;
                    }
                }
            }
            Ok(if bad == 0 { 0 } else { 1 })
        }
        Cmd::Allreduce(o) => {
            o.check()?;
            let wrong = launch(o.nprocs as usize, &o.common.lib)?;
            Ok(if wrong == 0 { 0 } else { 1 })
        }
        Cmd::Soak(o) => {
            o.check()?;
            let seed = o.seed.unwrap_or_else(|| {
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
            });
            let phases: &[&str] = match o.buffers.as_str() {
                "host" => &["host"],
                "staged" => &["staged"],
                _ => &["host", "staged"],
            };
            let secs = o.minutes * 60.0 / phases.len() as f64;
            println!("# rivet soak: {} min, messages 0 B to {} B, seed {seed} (repeat with --seed {seed})", o.minutes, o.max_size);
            let mut bad = 0;
            for phase in phases {
                let mut env = vec![("RIVET_SOAK_SECS", secs.to_string()), ("RIVET_SOAK_SEED", seed.to_string()), ("RIVET_SOAK_PHASE", phase.to_string())];
                if *phase == "staged" {
                    env.push(("RIVET_STAGE_HOST", "1".into()));
                }
                // Bounded: the run, the rounds after the deadline, the wait before connecting, and setup.
                let limit = Duration::from_secs_f64(secs + 120.0 + o.connect_after as f64 + 2.0 * nccl_net_rivet::config::get().timeout_secs as f64);
                bad += launch_env(2, &o.common.lib, &env, limit)?;
            }
            println!("# rivet soak: {}", if bad == 0 { "PASS" } else { "FAIL" });
            Ok(if bad == 0 { 0 } else { 1 })
        }
        Cmd::Info(l) => {
            let lib = net::find_library(l.lib.as_deref())?;
            net::set_opts(Some(&l));
            let n = net::Net::load(&lib)?;
            println!("library: {}", std::fs::canonicalize(&n.path).unwrap_or(n.path.clone()).display());
            println!("plugin: {} through ncclNetPlugin_v{}", n.name(), n.version());
            for d in 0..n.ndev()? {
                let p = n.props(d)?;
                println!(
                    "dev {d}: name {} pci {} guid {:#x} speed {} Mb/s ptrSupport {:#x} regIsGlobal {} maxComms {} maxRecvs {} maxP2pBytes {}",
                    p.name.clone(),
                    p.pci_path.clone(),
                    p.guid,
                    p.speed,
                    p.ptrSupport,
                    p.regIsGlobal,
                    p.maxComms,
                    p.maxRecvs,
                    p.maxP2pBytes
                );
            }
            Ok(0)
        }
        Cmd::Config => {
            for v in nccl_net_rivet::config::VARS {
                let cur = match std::env::var_os(v.name) {
                    None => "(unset)".to_string(),
                    Some(s) => s.to_string_lossy().into_owned(),
                };
                println!("{:<24} default {:<22} now {:<12} {}", v.name, v.default, cur, v.meaning);
            }
            Ok(0)
        }
        Cmd::Topo(o) => topo::run(&o),
        Cmd::Doctor(o) => doctor::run(&o),
    }
}

fn main() {
    // A closed stdout (`rivet topo | head -1`) ends the program quietly, as it does `cat`.
    // SAFETY: restoring SIGPIPE's default action, before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("rivet: error: {e}");
            std::process::exit(1);
        }
    }
}
