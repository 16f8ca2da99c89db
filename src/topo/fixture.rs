//! Generator of sysfs fixture trees for the topology probe: directories, attribute files and
//! relative symlinks shaped like the real `/sys`, in a fresh directory under the temp dir (removed
//! on drop), or in a directory a user names (`rivet topo --example NAME --write DIR`, kept). Used
//! by the unit tests (`src/topo/tests.rs`), by `tests/topo.rs` and by the CLI (through `#[path]`),
//! so it only uses std.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

pub const NVIDIA: u32 = 0x10de;
pub const MELLANOX: u32 = 0x15b3;
pub const CLASS_3D: u32 = 0x030200;
pub const CLASS_VGA: u32 = 0x030000;
pub const CLASS_BRIDGE: u32 = 0x060400;
pub const CLASS_OTHER_BRIDGE: u32 = 0x068000;
pub const CLASS_ETH: u32 = 0x020000;
pub const CLASS_IB: u32 = 0x020700;

pub struct Fixture {
    pub root: PathBuf,
    /// Left in place on drop (a tree written for a user).
    keep: bool,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// Writes an example machine into a fixture tree.
pub type Builder = fn(&Fixture);

/// The example machines, by the name `rivet topo --example` takes: (name, builder, description).
pub const EXAMPLES: &[(&str, Builder, &str)] = &[
    ("dgx-h100", build_dgx_h100, "2 sockets, 8 GPUs, 8 ConnectX NICs, GPU i and NIC i under one PCIe switch"),
    ("two-socket", build_two_socket, "a GPU on socket 0, a dual-port ConnectX and an Ethernet NIC on socket 1"),
    ("vm", build_vm, "a VM: a passed-through GPU, Soft-RoCE rxe0, virtio and netfront NICs"),
];

fn write(p: &Path, s: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, format!("{s}\n")).unwrap();
}

fn link(at: &Path, target: &str) {
    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(at);
    std::os::unix::fs::symlink(target, at).unwrap();
}

/// "0000:15:00.0" → "0000:15:00.0"; a numbered helper.
pub fn addr(bus: u32, dev: u32, func: u32) -> String {
    format!("0000:{bus:02x}:{dev:02x}.{func}")
}

impl Fixture {
    pub fn new(tag: &str) -> Fixture {
        static N: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "rivet-topo-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        Self::make(root, false)
    }

    /// A tree at `root` (which must not hold anything yet), kept when dropped.
    pub fn at(root: &Path) -> Fixture {
        Self::make(root.to_path_buf(), true)
    }

    fn make(root: PathBuf, keep: bool) -> Fixture {
        std::fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
        std::fs::create_dir_all(root.join("class/net")).unwrap();
        Fixture { root, keep }
    }

    pub fn numa_nodes(&self, n: u32) {
        for i in 0..n {
            // 32 CPUs per node, as `cpulist` lists them.
            write(&self.root.join(format!("devices/system/node/node{i}/cpulist")), &format!("{}-{}", 32 * i, 32 * i + 31));
        }
    }

    /// A PCI function at `path` ("pci0000:15/0000:15:01.0/.../0000:19:00.0", below `devices/`).
    /// Every level above it that does not exist yet becomes a PCI bridge on the same NUMA node;
    /// each level gets its `bus/pci/devices/ADDR` link ("../../../devices/...").
    pub fn pci(&self, path: &str, vendor: u32, class: u32, numa: i32) {
        let comps: Vec<&str> = path.split('/').collect();
        std::fs::create_dir_all(self.root.join("devices").join(comps[0])).unwrap();
        for i in 1..comps.len() {
            let rel = comps[..=i].join("/");
            let dir = self.root.join("devices").join(&rel);
            let last = i == comps.len() - 1;
            if last || !dir.join("class").exists() {
                let (v, c) = if last { (vendor, class) } else { (0x1000, CLASS_BRIDGE) };
                write(&dir.join("vendor"), &format!("{v:#06x}"));
                write(&dir.join("class"), &format!("{c:#08x}"));
                write(&dir.join("numa_node"), &numa.to_string());
            }
            link(&self.root.join("bus/pci/devices").join(comps[i]), &format!("../../../devices/{rel}"));
        }
    }

    /// An RDMA device: `class/infiniband/NAME` → `../../devices/<pci>/infiniband/NAME`, with
    /// `device` → `../../../ADDR`; without a PCI path it lives in `devices/virtual/infiniband`
    /// and has no `device` link (rxe).
    pub fn rdma(&self, name: &str, pci: Option<&str>) {
        self.class_dev("infiniband", name, pci, None);
    }

    /// A network interface: on PCI (`pci`), on another bus (`bus`: a directory below `devices/`
    /// such as "vif-0", whose netdev's `device` points there), or virtual (neither: veth, lo).
    pub fn net(&self, name: &str, pci: Option<&str>, bus: Option<&str>) {
        self.class_dev("net", name, pci, bus);
    }

    fn class_dev(&self, class: &str, name: &str, pci: Option<&str>, bus: Option<&str>) {
        let parent = match (pci, bus) {
            (Some(p), _) => p.to_string(),
            (None, Some(b)) => b.to_string(),
            (None, None) => "virtual".to_string(),
        };
        let dir = format!("devices/{parent}/{class}/{name}");
        write(&self.root.join(&dir).join("uevent"), &format!("NAME={name}"));
        link(&self.root.join("class").join(class).join(name), &format!("../../{dir}"));
        if pci.is_some() || bus.is_some() {
            let last = parent.rsplit('/').next().unwrap();
            link(&self.root.join(&dir).join("device"), &format!("../../../{last}"));
        }
    }
}

/// A GPU and a NIC under one PCIe switch whose upstream port hangs below `parent` (a bridge
/// path): upstream port BUS:00.0, downstream ports BUS+1:00.0 and BUS+1:01.0, GPU at BUS+2:00.0,
/// NIC (ConnectX, `mlx5_IDX`, with its netdev `ibpNs0`) at BUS+3:00.0. Returns (gpu, nic) paths.
fn switch_pair(f: &Fixture, parent: &str, bus: u32, numa: i32, idx: usize) -> (String, String) {
    let usp = format!("{parent}/{}", addr(bus, 0, 0));
    let gpu = format!("{usp}/{}/{}", addr(bus + 1, 0, 0), addr(bus + 2, 0, 0));
    let nic = format!("{usp}/{}/{}", addr(bus + 1, 1, 0), addr(bus + 3, 0, 0));
    f.pci(&gpu, NVIDIA, CLASS_3D, numa);
    f.pci(&nic, MELLANOX, CLASS_IB, numa);
    f.rdma(&format!("mlx5_{idx}"), Some(&nic));
    f.net(&format!("ibp{}s0", bus + 3), Some(&nic), None);
    (gpu, nic)
}

/// DGX-H100-like: 2 sockets (NUMA 0 and 1), 8 GPUs, 8 ConnectX NICs (mlx5_0..7), each GPU i with
/// NIC i under one PCIe switch. Per socket (A = 0x10, B = 0x30 on socket 0; 0x90, 0xb0 on 1):
///
/// ```text
/// pciA ── A:01.0 root port ── A+1:00.0 upper switch ─┬─ switch ── GPU0 A+5:00.0, NIC0 A+6:00.0
///      │                                            └─ switch ── GPU1 A+9:00.0, NIC1 A+a:00.0
///      └─ A:03.0 root port ── switch ── GPU2 A+d:00.0, NIC2 A+e:00.0
/// pciB ── B:01.0 root port ── switch ── GPU3 B+3:00.0, NIC3 B+4:00.0   (+ an NVSwitch, class 0x0680)
/// ```
///
/// So for GPU0 (0000:15:00.0): mlx5_0 PIX, mlx5_1 PXB, mlx5_2 PHB, mlx5_3 NODE, mlx5_4..7 SYS.
/// An ASPEED VGA (not NVIDIA) sits on socket 0. mlx5_7's class link is absolute ("/sys/...").
pub fn dgx_h100() -> Fixture {
    let f = Fixture::new("dgx");
    build_dgx_h100(&f);
    f
}

fn build_dgx_h100(f: &Fixture) {
    f.numa_nodes(2);
    for (s, (a, b)) in [(0x10u32, 0x30u32), (0x90, 0xb0)].into_iter().enumerate() {
        let numa = s as i32;
        let rca = format!("pci0000:{a:02x}");
        let rp1 = format!("{rca}/{}", addr(a, 1, 0));
        let upper = format!("{rp1}/{}", addr(a + 1, 0, 0));
        let d1 = format!("{upper}/{}", addr(a + 2, 0, 0));
        let d2 = format!("{upper}/{}", addr(a + 2, 1, 0));
        f.pci(&d1, 0x1000, CLASS_BRIDGE, numa);
        f.pci(&d2, 0x1000, CLASS_BRIDGE, numa);
        switch_pair(f, &d1, a + 3, numa, 4 * s);
        switch_pair(f, &d2, a + 7, numa, 4 * s + 1);
        switch_pair(f, &format!("{rca}/{}", addr(a, 3, 0)), a + 11, numa, 4 * s + 2);
        let rpb = format!("pci0000:{b:02x}/{}", addr(b, 1, 0));
        let (_, nic3) = switch_pair(f, &rpb, b + 1, numa, 4 * s + 3);
        f.pci(&format!("pci0000:{b:02x}/{}/{}", addr(b, 2, 0), addr(b + 8, 0, 0)), NVIDIA, CLASS_OTHER_BRIDGE, numa);
        if s == 1 {
            link(&f.root.join("class/infiniband/mlx5_7"), &format!("/sys/devices/{nic3}/infiniband/mlx5_7"));
        }
    }
    f.pci(&format!("pci0000:00/{}/{}", addr(0, 0x1c, 0), addr(2, 0, 0)), 0x1a03, CLASS_VGA, 0);
    f.net("lo", None, None);
    f.net("docker0", None, None);
}

/// Two sockets: GPU 0000:01:00.0 on socket 0 (pci0000:00, directly below root port 00:02.0);
/// a dual-port ConnectX (mlx5_0 at 81:00.0, mlx5_1 at 81:00.1, netdevs ens2f0np0/ens2f1np1) on
/// socket 1 (pci0000:80); an Ethernet NIC eth2 at 41:00.0 on pci0000:40 whose numa_node is -1.
/// GPU–mlx5_0 SYS, GPU–eth2 SYS (unknown NUMA on a 2-node machine), mlx5_0–mlx5_1 PIX.
pub fn two_socket() -> Fixture {
    let f = Fixture::new("2s");
    build_two_socket(&f);
    f
}

fn build_two_socket(f: &Fixture) {
    f.numa_nodes(2);
    f.pci(&format!("pci0000:00/{}/{}", addr(0, 2, 0), addr(1, 0, 0)), NVIDIA, CLASS_VGA, 0);
    let rp = format!("pci0000:80/{}", addr(0x80, 2, 0));
    for func in 0..2 {
        let nic = format!("{rp}/{}", addr(0x81, 0, func));
        f.pci(&nic, MELLANOX, CLASS_ETH, 1);
        f.rdma(&format!("mlx5_{func}"), Some(&nic));
        f.net(&format!("ens2f{func}np{func}"), Some(&nic), None);
    }
    let eth = format!("pci0000:40/{}/{}", addr(0x40, 1, 0), addr(0x41, 0, 0));
    f.pci(&eth, 0x8086, CLASS_ETH, -1);
    f.net("eth2", Some(&eth), None);
    f.net("lo", None, None);
}

/// A VM: one NUMA node, a passed-through GPU at 0000:00:05.0 (numa_node -1), Soft-RoCE rxe0 (no
/// `device`), a virtio NIC eth0 (0000:00:03.0/virtio0, so it has a PCI path: PHB to the GPU), a
/// Xen-style netfront eth1 whose `device` is `devices/vif-0` (not PCI: UNKNOWN), and virtual
/// veth0/lo (not NICs, not listed).
pub fn vm() -> Fixture {
    let f = Fixture::new("vm");
    build_vm(&f);
    f
}

fn build_vm(f: &Fixture) {
    f.numa_nodes(1);
    f.pci(&format!("pci0000:00/{}", addr(0, 5, 0)), NVIDIA, CLASS_3D, -1);
    let virtio = format!("pci0000:00/{}", addr(0, 3, 0));
    f.pci(&virtio, 0x1af4, CLASS_ETH, -1);
    std::fs::create_dir_all(f.root.join("devices").join(&virtio).join("virtio0")).unwrap();
    f.net("eth0", Some(&format!("{virtio}/virtio0")), None);
    std::fs::create_dir_all(f.root.join("devices/vif-0")).unwrap();
    f.net("eth1", None, Some("vif-0"));
    f.rdma("rxe0", None);
    f.net("veth0", None, None);
    f.net("lo", None, None);
}
