//! `rivet topo`: the GPU × NIC matrix of PCIe path classes in the shape of `nvidia-smi topo -m`
//! (GPUn and NICn labels, CPU and NUMA affinity columns, a legend), read from sysfs (`--sysfs
//! ROOT`, else `RIVET_SYSFS_ROOT`, else /sys) or from an example machine (`--example NAME`).

#[path = "../../topo/fixture.rs"]
mod fixture;

use crate::net::Res;
use clap::Args;
use nccl_net_rivet::topo::{self, classify, PciDev, Topology};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct Opts {
    /// JSON: the GPUs, the NICs and every GPU-NIC pair with its path class
    #[arg(long)]
    pub json: bool,
    /// The sysfs tree to read [default: $RIVET_SYSFS_ROOT, else /sys]
    #[arg(long, value_name = "ROOT", conflicts_with = "example")]
    pub sysfs: Option<PathBuf>,
    /// Show an example machine instead of this one (dgx-h100, two-socket, vm)
    #[arg(long, value_name = "NAME", value_parser = example_names())]
    pub example: Option<String>,
    /// With --example: write the example machine's sysfs tree to DIR (for `RIVET_SYSFS_ROOT=DIR rivet doctor`)
    #[arg(long, value_name = "DIR", requires = "example")]
    pub write: Option<PathBuf>,
}

fn example_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(fixture::EXAMPLES.iter().map(|(n, _, about)| clap::builder::PossibleValue::new(*n).help(*about)))
}

/// The builder of the example machine `name` (clap has checked the name).
fn builder(name: &str) -> Res<fixture::Builder> {
    fixture::EXAMPLES.iter().find(|(n, _, _)| *n == name).map(|(_, b, _)| *b).ok_or_else(|| format!("unknown example '{name}'"))
}

/// Write the example `name` to `dir`, which must be empty or not exist yet.
fn write_example(name: &str, dir: &Path) -> Res<()> {
    let build = builder(name)?;
    if dir.exists() && std::fs::read_dir(dir).map_err(|e| format!("--write {}: {e}", dir.display()))?.next().is_some() {
        return Err(format!("--write {}: the directory is not empty (name a new or empty one)", dir.display()));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("--write {}: cannot create it: {e}", dir.display()))?;
    // The generator panics on an I/O error (it is test code first): turn that into an error.
    let dir2 = dir.to_path_buf();
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(move || build(&fixture::Fixture::at(&dir2)));
    std::panic::set_hook(prev);
    r.map_err(|_| format!("--write {}: could not write the tree (permissions, disk space?)", dir.display()))
}

pub fn run(o: &Opts) -> Res<i32> {
    // An example is generated in a temporary tree (removed at the end) or in --write DIR.
    let mut _tmp = None;
    let root = match (&o.example, &o.write) {
        (Some(name), Some(dir)) => {
            write_example(name, dir)?;
            eprintln!("rivet topo: wrote the '{name}' example machine to {}; use it with RIVET_SYSFS_ROOT={} rivet doctor", dir.display(), dir.display());
            dir.clone()
        }
        (Some(name), None) => {
            let f = fixture::Fixture::new("example");
            builder(name)?(&f);
            let r = f.root.clone();
            _tmp = Some(f);
            r
        }
        _ => o.sysfs.clone().unwrap_or_else(Topology::default_root),
    };
    if !root.is_dir() {
        return Err(format!("topo: sysfs root {} is not a directory", root.display()));
    }
    let t = Topology::probe(&root);
    if o.json {
        println!("{}", topo::to_json(&t));
    } else {
        print!("{}", matrix(&t));
    }
    Ok(0)
}

/// The CPUs of a device: its `local_cpulist`, else its NUMA node's `cpulist`.
fn cpus(t: &Topology, pci: Option<&PciDev>) -> String {
    let read = |p: PathBuf| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    let Some(p) = pci else { return "N/A".into() };
    read(t.root.join("bus/pci/devices").join(&p.addr).join("local_cpulist"))
        .or_else(|| {
            let node = p.numa.or((t.numa_nodes.len() == 1).then(|| t.numa_nodes[0]))?;
            read(t.root.join(format!("devices/system/node/node{node}/cpulist")))
        })
        .unwrap_or_else(|| "N/A".into())
}

fn numa(t: &Topology, pci: Option<&PciDev>) -> String {
    match pci.and_then(|p| p.numa) {
        Some(n) => n.to_string(),
        None if t.numa_nodes.len() == 1 && pci.is_some() => t.numa_nodes[0].to_string(),
        None => "N/A".into(),
    }
}

/// `nvidia-smi topo -m`'s layout: tab-separated, X on the diagonal, the affinity columns, then
/// the legends.
fn matrix(t: &Topology) -> String {
    let single = t.numa_nodes.len() <= 1;
    let devs: Vec<(String, Option<&PciDev>)> = t
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| (format!("GPU{i}"), Some(g)))
        .chain(t.nics.iter().enumerate().map(|(i, n)| (format!("NIC{i}"), n.pci.as_ref())))
        .collect();
    let mut o = String::new();
    if devs.is_empty() {
        o += &format!("no GPU and no NIC found under {}\n", t.root.display());
        return o;
    }
    o += "\t";
    for (label, _) in &devs {
        o += &format!("{label}\t");
    }
    o += "CPU Affinity\tNUMA Affinity\n";
    for (i, (label, a)) in devs.iter().enumerate() {
        o += &format!("{label}\t");
        for (j, (_, b)) in devs.iter().enumerate() {
            let cell = if i == j { " X ".to_string() } else { classify(*a, *b, single).as_str().to_string() };
            o += &format!("{cell}\t");
        }
        o += &format!("{}\t{}\n", cpus(t, *a), numa(t, *a));
    }
    o += "\nLegend:\n\n";
    for (k, v) in [
        ("X   ", "Self"),
        ("SYS ", "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)"),
        ("NODE", "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node (NCCL treats it as PHB)"),
        ("PHB ", "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)"),
        ("PXB ", "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)"),
        ("PIX ", "Connection traversing at most a single PCIe bridge"),
        ("UNKNOWN", "No PCI path (a virtual device such as Soft-RoCE rxe, or a NIC not on PCI)"),
    ] {
        o += &format!("  {k} = {v}\n");
    }
    o += "\nNVLink is not read here: GPU pairs show their PCIe path only.\n";
    if t.gpus.is_empty() {
        o += &format!(
            "\nno GPU found under {} (NVIDIA vendor 0x10de, display or 3D controller class)\n",
            t.root.join("bus/pci/devices").display()
        );
    } else {
        o += "\nGPU Legend:\n\n";
        for (i, g) in t.gpus.iter().enumerate() {
            let id = std::fs::read_to_string(t.root.join("bus/pci/devices").join(&g.addr).join("device")).ok();
            let id = id.map(|d| format!(", NVIDIA device {}", d.trim())).unwrap_or_default();
            o += &format!("  GPU{i}: {}{id}\n", g.addr);
        }
    }
    if t.nics.is_empty() {
        o += "\nno NIC found\n";
    } else {
        o += "\nNIC Legend:\n\n";
        for (i, n) in t.nics.iter().enumerate() {
            let pci = n.pci.as_ref().map_or("no PCI path".to_string(), |p| p.addr.clone());
            let kind = match n.kind {
                topo::NicKind::Rdma => "RDMA",
                topo::NicKind::Net => "netdev",
            };
            o += &format!("  NIC{i}: {} ({kind}, {pci})\n", n.name);
        }
    }
    o
}
