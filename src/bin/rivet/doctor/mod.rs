//! `rivet doctor`: the pre-flight check of an RDMA + GPU node, built on the code the plugin runs
//! (device discovery, GID choice, memlock check, GPUDirect probes, topology probe, GDR decision):
//! the facts ([`facts`]), the report on them ([`report`]), with `--selftest` (loopback transfers
//! through the plugin), `--json`, `--save FILE` and `--diff FILE`.

mod facts;
mod report;

use crate::net::{self, Res};
use crate::LibOpt;
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct Opts {
    /// Print the report and a flat map of facts as JSON
    #[arg(long)]
    pub json: bool,
    /// Also run a short loopback transfer through the plugin on every device (host memory, and GPU memory where there is a GPU)
    #[arg(long)]
    pub selftest: bool,
    /// Write the facts to FILE as a baseline for --diff (its directory is created)
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,
    /// Compare with a baseline written by --save; exit 1 when something other than rivet's version changed
    #[arg(long, value_name = "FILE")]
    pub diff: Option<PathBuf>,
    #[command(flatten)]
    pub lib: LibOpt,
}

/// Open the --save file before anything is printed, creating its directory: a baseline that
/// cannot be written is an error up front, not after the report.
fn open_save(path: &Path) -> Res<std::fs::File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("--save {}: cannot create the directory {}: {e}", path.display(), dir.display()))?;
    }
    std::fs::File::create(path).map_err(|e| format!("--save {}: cannot write it: {e}", path.display()))
}

/// `rivet doctor --selftest`: a short loopback transfer through the plugin on every device (two
/// processes on the same device, as `rivet perf --dev d,d` runs them), reported next to what the
/// port's speed promises.
fn self_test(lib: Option<&Path>, gpu: bool) -> Res<report::Section> {
    use report::{Section, Verdict};
    let lib = net::find_library(lib)?;
    let n = net::Net::load(&lib)?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut s = Section::new("Self-test");
    let mut failed = 0;
    let ndev = n.ndev()?;
    for d in 0..ndev {
        let p = n.props(d)?;
        let name = p.name.clone();
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
            } else {
                // Every byte received checked (GPU buffers have their own check).
                c.arg("--check");
            }
            let out = c.output().map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            let lat = text.lines().find_map(|l| l.split("typical ").nth(1)?.split(' ').next()?.parse::<f64>().ok());
            let bw = text.lines().filter(|l| !l.starts_with('#')).find_map(|l| l.split_whitespace().last()?.parse::<f64>().ok());
            let what = if cuda { "GPU memory" } else { "host memory, every byte checked" };
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
                            text.lines()
                                .find(|l| l.contains("data check") && !l.contains(": 0 wrong"))
                                .or_else(|| err.lines().rev().find(|l| !l.trim().is_empty()))
                                .unwrap_or("no output")
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

pub fn run(o: &Opts) -> Res<i32> {
    use std::io::Write;
    // Both files are checked before the report is made or printed.
    let mut save = o.save.as_deref().map(open_save).transpose()?;
    let old = match &o.diff {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("--diff {}: cannot read it: {e}", path.display()))?;
            Some(facts::load_facts(&text).map_err(|e| format!("--diff {}: {e}", path.display()))?)
        }
        None => None,
    };
    let f = facts::Facts::gather();
    let mut sections = report::analyze(&f);
    if o.selftest {
        let gpu = matches!(&f.cuda, Ok((_, g)) if !g.is_empty());
        sections.push(self_test(o.lib.lib.as_deref(), gpu)?);
    }
    let facts = facts::fact_map(&f);
    if o.json {
        println!("{}", facts::to_json(&sections, &facts));
    } else {
        print!("{}", report::render(&sections));
    }
    if let (Some(file), Some(path)) = (save.as_mut(), &o.save) {
        file.write_all((facts::to_json(&sections, &facts) + "\n").as_bytes())
            .map_err(|e| format!("--save {}: cannot write it: {e}", path.display()))?;
        eprintln!("rivet doctor: baseline saved to {}", path.display());
    }
    if let (Some(old), Some(path)) = (old, &o.diff) {
        let (lines, matters) = facts::diff(&old, &facts);
        println!(
            "== changes since {}: {}",
            path.display(),
            if lines.is_empty() {
                "none"
            } else if matters {
                "yes"
            } else {
                "informational only"
            }
        );
        for l in lines {
            println!("   {l}");
        }
        return Ok(if matters { 1 } else { 0 });
    }
    Ok(0)
}
