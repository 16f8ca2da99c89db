//! PCIe/NUMA topology probe: pure code over a sysfs root (`/sys`, or `RIVET_SYSFS_ROOT` for tests
//! and diagnosis). It finds the GPUs (NVIDIA vendor 0x10de with a display or 3D controller class,
//! or any PCI device by the bus id CUDA reports), the NICs (`class/infiniband`, `class/net`), each
//! device's chain of PCI ancestors and NUMA node, and classifies every GPU–NIC pair in the words of
//! `nvidia-smi topo -m`: see [`PathClass`] and [`classify`].
//!
//! Symlinks are resolved here, lexically and inside the root: a relative target is resolved
//! against the link's directory (`..` never climbs above the root), an absolute target such as
//! `/sys/devices/...` is mapped under the root. Nothing is canonicalized by the OS, so a fixture
//! tree behaves exactly like the real `/sys`.

use std::ffi::OsString;
use std::fmt;
use std::path::{Component, Path, PathBuf};

#[cfg(test)]
pub(crate) mod fixture;
#[cfg(test)]
mod tests;

/// How a GPU reaches a NIC, in the words of `nvidia-smi topo -m` (NCCL's `PATH_*` use the same
/// names). The order is the order of distance: `Loc < Pix < Pxb < Phb < Node < Sys < Unknown`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathClass {
    /// The same PCI function (only meaningful as a `NCCL_NET_GDR_LEVEL` value).
    Loc,
    /// GPU and CPU joined by NVLink-C2C (Grace Hopper); as a level, NCCL's NVL, NVB and C2C,
    /// which allow no PCI path but LOC.
    C2c,
    /// Through at most one PCIe switch (`PIX`).
    Pix,
    /// Through several PCIe switches, without crossing the host bridge (`PXB`).
    Pxb,
    /// A GPU joined to its CPU by C2C and a NIC on that CPU's PCIe (`P2C`): NCCL's default level
    /// with NCCL_NET_GDR_C2C=1.
    P2c,
    /// Through another GPU over NVLink (`PXN`): a level only, rivet's probe never finds it.
    Pxn,
    /// Through the CPU's PCIe host bridge: one root complex, no shared switch (`PHB`).
    Phb,
    /// Across root complexes (host bridges) of one NUMA node (`NODE`). NCCL folds this into PHB
    /// for its decisions, see [`PathClass::nccl`].
    Node,
    /// Across NUMA nodes, through the inter-socket link (`SYS`).
    Sys,
    /// One of the devices has no PCI path (a virtual NIC, an unknown bus id).
    Unknown,
}

impl PathClass {
    pub fn as_str(self) -> &'static str {
        match self {
            PathClass::Loc => "LOC",
            PathClass::C2c => "C2C",
            PathClass::Pix => "PIX",
            PathClass::Pxb => "PXB",
            PathClass::P2c => "P2C",
            PathClass::Pxn => "PXN",
            PathClass::Phb => "PHB",
            PathClass::Node => "NODE",
            PathClass::Sys => "SYS",
            PathClass::Unknown => "UNKNOWN",
        }
    }

    /// The class NCCL acts on: NCCL folds NODE into PHB.
    pub fn nccl(self) -> PathClass {
        if self == PathClass::Node {
            PathClass::Phb
        } else {
            self
        }
    }

    /// A value as `NCCL_NET_GDR_LEVEL` accepts it: NCCL's path names LOC, NVL, NVB, C2C, PIX,
    /// PXB, P2C, PXN, PHB, SYS (and NODE, rivet's; any case), or the old integers 0-5 meaning
    /// LOC, PIX, PXB, PHB, SYS, SYS (larger ones SYS too, as NCCL).
    pub fn parse_level(s: &str) -> Option<PathClass> {
        let s = s.trim();
        Some(match s.to_ascii_uppercase().as_str() {
            "LOC" => PathClass::Loc,
            // Below PIX, a GPU-NIC PCI path never qualifies: C2C stands for all three.
            "NVL" | "NVB" | "C2C" => PathClass::C2c,
            "PIX" => PathClass::Pix,
            "PXB" => PathClass::Pxb,
            "P2C" => PathClass::P2c,
            "PXN" => PathClass::Pxn,
            "PHB" => PathClass::Phb,
            "NODE" => PathClass::Node,
            "SYS" => PathClass::Sys,
            n if n.starts_with(|c: char| c.is_ascii_digit()) => match n.parse::<u64>().ok()? {
                0 => PathClass::Loc,
                1 => PathClass::Pix,
                2 => PathClass::Pxb,
                3 => PathClass::Phb,
                _ => PathClass::Sys,
            },
            _ => return None,
        })
    }
}

impl fmt::Display for PathClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a PCI function sits: its address, its root complex, the bridges above it, its NUMA node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciDev {
    /// "0000:18:00.0".
    pub addr: String,
    /// The host bridge directory, "pci0000:15".
    pub root_complex: String,
    /// The PCI bridges from the root port down to the device's parent, as addresses.
    pub ancestors: Vec<String>,
    /// `numa_node`, None where it reads -1 or is missing.
    pub numa: Option<u32>,
    pub vendor: Option<u32>,
    pub class: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NicKind {
    /// `class/infiniband` (an RDMA device: mlx5_0, rxe0).
    Rdma,
    /// `class/net` (a network interface not already listed as the PCI function of an RDMA device).
    Net,
}

#[derive(Clone, Debug)]
pub struct Nic {
    pub name: String,
    pub kind: NicKind,
    /// None for a device without a PCI path (rxe, a netdev whose `device` is not on PCI).
    pub pci: Option<PciDev>,
}

impl Nic {
    pub fn numa(&self) -> Option<u32> {
        self.pci.as_ref().and_then(|p| p.numa)
    }
}

#[derive(Clone, Debug)]
pub struct Topology {
    pub root: PathBuf,
    /// NVIDIA display/3D controllers, sorted by address.
    pub gpus: Vec<PciDev>,
    /// RDMA devices first, then network interfaces, each sorted by name.
    pub nics: Vec<Nic>,
    /// `devices/system/node/nodeN`, sorted.
    pub numa_nodes: Vec<u32>,
    /// GPUs joined to their CPU by NVLink-C2C (Grace Hopper), by address: NVML's answer on this
    /// machine (sysfs cannot tell), asked the first time a path's class depends on it, so that
    /// start-up does not load NVML; none for a sysfs copy.
    pub c2c: std::sync::OnceLock<Vec<String>>,
}

impl Topology {
    /// Read the topology under `root` (normally `/sys`). Missing directories give empty lists.
    pub fn probe(root: &Path) -> Topology {
        let mut gpus: Vec<PciDev> = list_dir(&root.join("bus/pci/devices"))
            .into_iter()
            .filter_map(|name| pci_dev(root, &format!("bus/pci/devices/{name}")))
            .filter(is_nvidia_gpu)
            .collect();
        gpus.sort_by(|a, b| a.addr.cmp(&b.addr));

        let mut nics: Vec<Nic> = Vec::new();
        for name in sorted(list_dir(&root.join("class/infiniband"))) {
            let pci = pci_dev(root, &format!("class/infiniband/{name}/device"));
            nics.push(Nic { name, kind: NicKind::Rdma, pci });
        }
        for name in sorted(list_dir(&root.join("class/net"))) {
            if name == "lo" {
                continue;
            }
            let pci = pci_dev(root, &format!("class/net/{name}/device"));
            if pci.is_none() {
                // Bridges, veth, docker0, ifb, tun: software interfaces, not NICs. A netdev with
                // a `device` link that is not on PCI (Xen netfront, ...) is still a NIC.
                let on_bus = resolve(root, Path::new(&format!("class/net/{name}/device")))
                    .is_some_and(|c| c.len() > 1 && c[0] == "devices" && c[1] != "virtual");
                if !on_bus {
                    continue;
                }
            }
            // The netdev of an RDMA device's PCI function (mlx5_0's ens1np0) is the same NIC.
            if let Some(p) = &pci {
                if nics.iter().any(|n| n.kind == NicKind::Rdma && n.pci.as_ref().map(|q| &q.addr) == Some(&p.addr)) {
                    continue;
                }
            }
            nics.push(Nic { name, kind: NicKind::Net, pci });
        }

        let mut numa_nodes: Vec<u32> = list_dir(&root.join("devices/system/node"))
            .iter()
            .filter_map(|n| n.strip_prefix("node").and_then(|d| d.parse().ok()))
            .collect();
        numa_nodes.sort_unstable();
        let c2c = std::sync::OnceLock::new();
        if root != Path::new("/sys") {
            let _ = c2c.set(Vec::new());
        }
        Topology { root: root.to_path_buf(), gpus, nics, numa_nodes, c2c }
    }

    /// The root `RIVET_SYSFS_ROOT` names, else `/sys`.
    pub fn default_root() -> PathBuf {
        crate::config::sysfs_root()
    }

    /// This machine's topology, probed once per process (at [`Topology::default_root`]).
    pub fn machine() -> &'static Topology {
        static T: std::sync::OnceLock<Topology> = std::sync::OnceLock::new();
        T.get_or_init(|| Topology::probe(&Topology::default_root()))
    }

    /// The PCI function with this bus id (as CUDA reports it: "00000000:18:00.0", "0000:18:00.0"
    /// or "18:00.0", any case), whether or not it was recognized as a GPU.
    pub fn pci(&self, bus_id: &str) -> Option<PciDev> {
        let id = normalize_bus_id(bus_id)?;
        if let Some(g) = self.gpus.iter().find(|g| g.addr == id) {
            return Some(g.clone());
        }
        pci_dev(&self.root, &format!("bus/pci/devices/{id}"))
    }

    pub fn nic(&self, name: &str) -> Option<&Nic> {
        self.nics.iter().find(|n| n.name == name)
    }

    /// The class of the path between the GPU (or any PCI function) at `gpu_bus_id` and the NIC
    /// `nic_name`; UNKNOWN where either is not found or has no PCI path.
    pub fn path(&self, gpu_bus_id: &str, nic_name: &str) -> PathClass {
        let gpu = self.pci(gpu_bus_id);
        let nic = self.nic(nic_name).and_then(|n| n.pci.as_ref());
        let class = classify(gpu.as_ref(), nic, self.numa_nodes.len() <= 1);
        with_c2c(class, || gpu.is_some_and(|g| self.c2c_gpus().contains(&g.addr)))
    }

    /// The GPUs NVML says are joined to their CPU by NVLink-C2C (asked once).
    fn c2c_gpus(&self) -> &[String] {
        self.c2c.get_or_init(|| self.gpus.iter().filter(|g| crate::gpu::nvml::c2c(&g.addr)).map(|g| g.addr.clone()).collect())
    }
}

/// A GPU joined to its CPU by NVLink-C2C reaches a NIC on that CPU's PCIe (through the host
/// bridge, or another root complex of its NUMA node) over C2C and then PCIe: NCCL's P2C, which
/// NCCL_NET_GDR_C2C=1 (the default level) allows GDR over. `gpu_c2c` is asked only for those
/// classes.
pub fn with_c2c(class: PathClass, gpu_c2c: impl FnOnce() -> bool) -> PathClass {
    if matches!(class, PathClass::Phb | PathClass::Node) && gpu_c2c() {
        PathClass::P2c
    } else {
        class
    }
}

/// The class of the path between two PCI functions.
///
/// With `a` and `b` seen as chains from their root complex down (`pciDDDD:BB`, root port,
/// bridges…, device), the rule is:
/// - UNKNOWN: either has no PCI path.
/// - LOC: the same function.
/// - Same root complex: let the shared bridges be the common prefix of the two bridge chains.
///   None shared (they hang off different root ports and meet in the host bridge): PHB.
///   Otherwise count, for each device, the bridges below the deepest shared one. In sysfs a PCIe
///   switch shows as an upstream-port bridge with one downstream-port bridge per slot, so two
///   devices under one switch share the upstream port and each sits below one more bridge (its
///   downstream port). Both counts at most 1: PIX (one switch, or two functions of one device
///   under the root port). More: PXB (several switches, the host bridge not crossed).
/// - Different root complexes, the same NUMA node: NODE (NCCL folds it into PHB).
/// - Different root complexes on different NUMA nodes: SYS. Where a NUMA node is unknown (-1),
///   SYS too, the conservative answer, unless `single_numa` says the machine has at most one
///   NUMA node, which makes it NODE.
pub fn classify(a: Option<&PciDev>, b: Option<&PciDev>, single_numa: bool) -> PathClass {
    let (Some(a), Some(b)) = (a, b) else { return PathClass::Unknown };
    if a.addr == b.addr {
        return PathClass::Loc;
    }
    if a.root_complex != b.root_complex {
        return match (a.numa, b.numa) {
            (Some(x), Some(y)) if x == y => PathClass::Node,
            (Some(_), Some(_)) => PathClass::Sys,
            _ if single_numa => PathClass::Node,
            _ => PathClass::Sys,
        };
    }
    let shared = a.ancestors.iter().zip(&b.ancestors).take_while(|(x, y)| x == y).count();
    if shared == 0 {
        return PathClass::Phb;
    }
    let below_a = a.ancestors.len() - shared;
    let below_b = b.ancestors.len() - shared;
    if below_a <= 1 && below_b <= 1 {
        PathClass::Pix
    } else {
        PathClass::Pxb
    }
}

fn is_nvidia_gpu(d: &PciDev) -> bool {
    d.vendor == Some(0x10de) && matches!(d.class.map(|c| c >> 8), Some(0x0300) | Some(0x0302))
}

/// "00000000:18:00.0" / "0000:18:00.0" / "18:00.0" → "0000:18:00.0" (lower case).
pub fn normalize_bus_id(s: &str) -> Option<String> {
    let s = s.trim().to_ascii_lowercase();
    let parts: Vec<&str> = s.split(':').collect();
    let (dom, bus, devfn) = match parts.as_slice() {
        [d, b, df] => (*d, *b, *df),
        [b, df] => ("0000", *b, *df),
        _ => return None,
    };
    let dom = u32::from_str_radix(dom, 16).ok()?;
    let bus = u8::from_str_radix(bus, 16).ok()?;
    let (dev, func) = devfn.split_once('.')?;
    let dev = u8::from_str_radix(dev, 16).ok()?;
    let func = u8::from_str_radix(func, 16).ok()?;
    Some(format!("{dom:04x}:{bus:02x}:{dev:02x}.{func:x}"))
}

/// "0000:18:00.0": hex domain (4 digits or more, VMD domains have 5), bus, device, function.
fn is_pci_addr(s: &str) -> bool {
    let p: Vec<&str> = s.split(':').collect();
    let hex = |x: &str, n: usize| x.len() == n && x.chars().all(|c| c.is_ascii_hexdigit());
    match p.as_slice() {
        [d, b, df] => {
            d.len() >= 4 && d.chars().all(|c| c.is_ascii_hexdigit()) && hex(b, 2) && {
                match df.split_once('.') {
                    Some((dv, f)) => hex(dv, 2) && f.len() == 1 && f.chars().all(|c| c.is_digit(8)),
                    None => false,
                }
            }
        }
        _ => false,
    }
}

/// "pci0000:15" (a host bridge directory under `devices/`).
fn is_root_complex(s: &str) -> bool {
    s.strip_prefix("pci").map(|r| r.split_once(':').map(|(d, b)| !d.is_empty() && !b.is_empty()).unwrap_or(false)).unwrap_or(false)
}

/// The PCI function a sysfs path (relative to `root`) leads to: the deepest PCI address in the
/// resolved path below `devices/pciDDDD:BB/` (a virtio netdev's `device` is `virtio2`, whose
/// parent is the PCI function). None where the path does not exist or is not on PCI.
fn pci_dev(root: &Path, rel: &str) -> Option<PciDev> {
    let comps = resolve(root, Path::new(rel))?;
    if comps.first().map(String::as_str) != Some("devices") {
        return None;
    }
    let rc = comps.get(1).filter(|c| is_root_complex(c))?.clone();
    let chain: Vec<String> = comps[2..].iter().take_while(|c| is_pci_addr(c)).cloned().collect();
    let (addr, ancestors) = chain.split_last()?;
    let dir = root.join("devices").join(&rc).join(chain.join("/"));
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok().map(|s| s.trim().to_string());
    let hex = |f: &str| read(f).and_then(|s| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok());
    let numa = read("numa_node").and_then(|s| s.parse::<i64>().ok()).filter(|&n| n >= 0).map(|n| n as u32);
    Some(PciDev { addr: addr.clone(), root_complex: rc, ancestors: ancestors.to_vec(), numa, vendor: hex("vendor"), class: hex("class") })
}

/// Resolve `rel` (relative to `root`) component by component, following symlinks inside the
/// root; returns the components of the final path below the root, or None where something does
/// not exist or the links loop. `..` at the root stays at the root; an absolute link target has
/// its leading `/sys` (or `/`) replaced by the root.
pub fn resolve(root: &Path, rel: &Path) -> Option<Vec<String>> {
    let mut todo: Vec<OsString> = Vec::new();
    push_components(&mut todo, rel);
    let mut cur: Vec<String> = Vec::new();
    let mut links = 0;
    while let Some(c) = todo.pop() {
        let c = c.to_string_lossy().into_owned();
        match c.as_str() {
            "" | "." => continue,
            ".." => {
                cur.pop();
                continue;
            }
            _ => {}
        }
        let mut p = root.to_path_buf();
        p.extend(cur.iter());
        p.push(&c);
        let md = std::fs::symlink_metadata(&p).ok()?;
        if md.file_type().is_symlink() {
            links += 1;
            if links > 40 {
                return None;
            }
            let target = std::fs::read_link(&p).ok()?;
            if target.is_absolute() {
                cur.clear();
                let t = target.strip_prefix("/sys").unwrap_or(&target);
                push_components(&mut todo, t);
            } else {
                push_components(&mut todo, &target);
            }
        } else {
            cur.push(c);
        }
    }
    Some(cur)
}

/// Push the components of `p` onto the stack so that the first component is popped first.
fn push_components(todo: &mut Vec<OsString>, p: &Path) {
    let comps: Vec<OsString> = p
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    todo.extend(comps.into_iter().rev());
}

fn list_dir(p: &Path) -> Vec<String> {
    std::fs::read_dir(p)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort_by_key(|s| natural_key(s));
    v
}

/// "mlx5_10" after "mlx5_9": split off a trailing number.
fn natural_key(s: &str) -> (String, u64, String) {
    let digits = s.chars().rev().take_while(|c| c.is_ascii_digit()).count();
    let (head, tail) = s.split_at(s.len() - digits);
    (head.to_string(), tail.parse().unwrap_or(0), s.to_string())
}

/// The `rivet topo --json` document: the GPUs, the NICs (each list present even when the other
/// is empty), and one object per GPU–NIC pair with its path class.
pub fn to_json(t: &Topology) -> String {
    use serde_json::json;
    let pci = |p: Option<&PciDev>| p.map(|p| json!(p.addr));
    let gpus: Vec<_> = t.gpus.iter().map(|g| json!({"bus_id": g.addr, "numa": g.numa})).collect();
    let nics: Vec<_> = t
        .nics
        .iter()
        .map(|n| {
            let kind = match n.kind {
                NicKind::Rdma => "rdma",
                NicKind::Net => "netdev",
            };
            json!({"name": n.name, "kind": kind, "pci": pci(n.pci.as_ref()), "numa": n.numa()})
        })
        .collect();
    let mut pairs = Vec::new();
    for g in &t.gpus {
        for n in &t.nics {
            pairs.push(json!({
                "gpu": g.addr,
                "nic": n.name,
                "nic_pci": pci(n.pci.as_ref()),
                "path": t.path(&g.addr, &n.name).as_str(),
                "gpu_numa": g.numa,
                "nic_numa": n.numa(),
            }));
        }
    }
    let doc = json!({"sysfs_root": t.root.display().to_string(), "numa_nodes": t.numa_nodes, "gpus": gpus, "nics": nics, "pairs": pairs});
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}
