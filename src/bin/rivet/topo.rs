//! `rivet topo [--json] [--sysfs ROOT]`: the GPU × NIC matrix of PCIe path classes, as
//! `nvidia-smi topo -m` names them, read from sysfs (ROOT, else `RIVET_SYSFS_ROOT`, else /sys).

use crate::net::Res;
use crate::Args;
use nccl_net_rivet::topo::{self, Topology};
use std::path::PathBuf;

pub fn run(a: &mut Args) -> Res<i32> {
    let root = a.opt(&["--sysfs"]).map(PathBuf::from).unwrap_or_else(Topology::default_root);
    let json = if let Some(i) = a.rest.iter().position(|x| x == "--json") {
        a.rest.remove(i);
        true
    } else {
        false
    };
    if let Some(x) = a.rest.first() {
        return Err(format!("topo: unexpected argument '{x}' (usage: rivet topo [--json] [--sysfs ROOT])"));
    }
    if !root.is_dir() {
        return Err(format!("topo: sysfs root {} is not a directory", root.display()));
    }
    let t = Topology::probe(&root);
    if json {
        println!("{}", topo::to_json(&t));
    } else {
        print!("{}", matrix(&t));
    }
    Ok(0)
}

fn numa(n: Option<u32>) -> String {
    n.map(|n| n.to_string()).unwrap_or_else(|| "-".into())
}

fn matrix(t: &Topology) -> String {
    let mut o = String::new();
    let nic_pci = |n: &topo::Nic| n.pci.as_ref().map(|p| p.addr.clone()).unwrap_or_else(|| "none (virtual)".into());
    if t.gpus.is_empty() {
        o += &format!(
            "no GPU found under {} (NVIDIA vendor 0x10de, display or 3D controller class)\n",
            t.root.join("bus/pci/devices").display()
        );
        if t.nics.is_empty() {
            o += "no NIC found\n";
        }
        for n in &t.nics {
            o += &format!("NIC {:<12} pci {:<16} NUMA {}\n", n.name, nic_pci(n), numa(n.numa()));
        }
        return o;
    }
    let w = t.nics.iter().map(|n| n.name.len()).max().unwrap_or(0).max(7) + 2;
    o += &format!("{:<16}", "GPU \\ NIC");
    for n in &t.nics {
        o += &format!("{:<w$}", n.name);
    }
    o += "NUMA\n";
    for g in &t.gpus {
        o += &format!("{:<16}", g.addr);
        for n in &t.nics {
            o += &format!("{:<w$}", t.path(&g.addr, &n.name).as_str());
        }
        o += &format!("{}\n", numa(g.numa));
    }
    o += &format!("{:<16}", "NIC NUMA");
    for n in &t.nics {
        o += &format!("{:<w$}", numa(n.numa()));
    }
    o += "\n";
    if t.nics.is_empty() {
        o += "no NIC found\n";
    }
    o += "\nLegend: PIX = one PCIe switch; PXB = several PCIe switches, no host bridge; PHB = through the CPU's host bridge;\n        \
          NODE = across host bridges of one NUMA node (NCCL treats it as PHB); SYS = across NUMA nodes; UNKNOWN = no PCI path.\n";
    o
}
