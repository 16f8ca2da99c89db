//! `rivet doctor` through the built CLI: on this machine (no RDMA, no GPU: TCP only, and why),
//! `--json`, `--save` then `--diff` (unchanged: exit 0; a changed baseline: exit 1 naming the
//! change), and on the sysfs fixture trees of the topology probe (RIVET_SYSFS_ROOT).

#[path = "../src/topo/fixture.rs"]
mod fixture;

use std::path::Path;
use std::process::Command;

fn doctor(args: &[&str], sysfs: Option<&Path>) -> (i32, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rivet"));
    c.arg("doctor").args(args).env("NCCL_SOCKET_IFNAME", "lo").env_remove("NCCL_DEBUG");
    match sysfs {
        Some(r) => c.env("RIVET_SYSFS_ROOT", r),
        None => c.env_remove("RIVET_SYSFS_ROOT"),
    };
    let out = c.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

fn section<'a>(text: &'a str, title: &str) -> &'a str {
    let start = text.find(&format!("== {title}: ")).unwrap_or_else(|| panic!("no section {title}:\n{text}"));
    let rest = &text[start + 3..];
    &text[start..start + 3 + rest.find("\n== ").unwrap_or(rest.len())]
}

#[test]
#[cfg_attr(rivet_rdma, ignore = "this host has RDMA devices, which have other answers")]
fn this_machine_reports_tcp_and_why() {
    if Path::new("/dev/infiniband").exists() {
        println!("SKIP this_machine_reports_tcp_and_why: this host has RDMA devices, which have other answers");
        return;
    }
    let (rc, t) = doctor(&[], None);
    assert_eq!(rc, 0, "{t}");
    assert!(section(&t, "RDMA devices and ports").contains("INFO no RDMA device:"), "{t}");
    let tr = section(&t, "Transport");
    assert!(tr.contains("NCCL gets rivet's TCP transport") && tr.contains("RDMA not used:") && tr.contains("TCP on lo"), "{t}");
    assert!(section(&t, "Limits").contains("RLIMIT_MEMLOCK"), "{t}");
    assert!(t.contains("== overall: "), "{t}");
}

#[test]
fn selftest_moves_data_through_the_plugin() {
    let (rc, t) = doctor(&["--selftest"], None);
    assert_eq!(rc, 0, "{t}");
    let s = section(&t, "Self-test");
    assert!(s.contains("OK 1 of 1 loopback transfer(s) passed (1 device(s), host memory)"), "{s}");
    assert!(s.contains("dev 0 (lo), host memory, every byte checked: 8 B latency") && s.contains("GB/s = ") && s.contains("of the port's 10000 Mb/s"), "{s}");
}

#[test]
#[cfg_attr(rivet_nvidia, ignore = "this host has an NVIDIA driver")]
fn perf_with_gpu_buffers_needs_cuda() {
    if Path::new("/dev/nvidiactl").exists() {
        println!("SKIP perf_with_gpu_buffers_needs_cuda: this host has an NVIDIA driver");
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_rivet")).args(["perf", "--cuda", "--sizes", "1M"]).env("NCCL_SOCKET_IFNAME", "lo").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(err.contains("--cuda: no usable CUDA driver: libcuda.so.1 not found"), "{err}");
}

#[test]
fn json_save_and_diff() {
    let dir = std::env::temp_dir().join(format!("rivet-doctor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base = dir.join("baseline.json");
    let (rc, t) = doctor(&["--json", "--save", base.to_str().unwrap()], None);
    assert_eq!(rc, 0, "{t}");
    let saved = std::fs::read_to_string(&base).unwrap();
    assert!(saved.contains("\"facts\"") && saved.contains("\"transport\": \"TCP\"") && saved.contains("\"overall\""), "{saved}");
    assert!(t.trim_start().starts_with('{'), "--json prints JSON: {t}");

    let (rc, t) = doctor(&["--diff", base.to_str().unwrap()], None);
    assert_eq!(rc, 0, "nothing changed:\n{t}");
    assert!(t.contains("changes since") && t.contains(": none"), "{t}");

    // A baseline from before a change: another transport, a GID that went away.
    let edited = saved.replace("\"transport\": \"TCP\"", "\"transport\": \"RDMA verbs\"").replacen(
        "\"facts\": {",
        "\"facts\": {\n    \"port.mlx5_0:1.gid.3\": \"10.0.0.1 v2\",",
        1,
    );
    std::fs::write(&base, edited).unwrap();
    let (rc, t) = doctor(&["--diff", base.to_str().unwrap()], None);
    assert_eq!(rc, 1, "changes that matter exit 1:\n{t}");
    assert!(t.contains("~ transport: RDMA verbs -> TCP"), "{t}");
    assert!(t.contains("- port.mlx5_0:1.gid.3: 10.0.0.1 v2"), "{t}");

    // --save creates the baseline's directory; one it cannot create is an error before any report.
    let nested = dir.join("a/b/baseline.json");
    let (rc, t) = doctor(&["--save", nested.to_str().unwrap()], None);
    assert_eq!(rc, 0, "{t}");
    assert!(std::fs::read_to_string(&nested).unwrap().contains("\"facts\""));
    std::fs::write(dir.join("file"), "").unwrap();
    let bad = dir.join("file/baseline.json");
    let (rc, t) = doctor(&["--save", bad.to_str().unwrap()], None);
    assert_eq!(rc, 1, "{t}");
    assert!(t.contains("cannot create the directory") && !t.contains("== "), "the error comes first, alone: {t}");

    std::fs::write(&base, "not json").unwrap();
    let (rc, t) = doctor(&["--diff", base.to_str().unwrap()], None);
    assert_eq!(rc, 1);
    assert!(t.contains("not a rivet doctor baseline"), "{t}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn fixture_machines() {
    // DGX-H100-like, with the peer-memory module loaded: GDR to the NIC under the GPU's switch.
    let f = fixture::dgx_h100();
    std::fs::create_dir_all(f.root.join("module/nvidia_peermem")).unwrap();
    std::fs::write(f.root.join("module/nvidia_peermem/version"), "580.159.04\n").unwrap();
    let (_, t) = doctor(&[], Some(&f.root));
    let s = section(&t, "GPU x NIC topology");
    assert!(s.contains("OK 8 GPU(s)"), "{s}");
    // This host gives NCCL only TCP: with GPUs that is never OK, and each GPU says what it gets.
    let g = section(&t, "GPU jobs");
    assert!(g.contains("WARN this node has 8 GPU(s), but NCCL would move their data over TCP"), "{g}");
    assert!(g.contains("GPU0 0000:15:00.0: NIC lo (path UNKNOWN): TCP; NCCL copies its buffers through host memory itself"), "{g}");
    assert_eq!(g.lines().filter(|l| l.trim_start().starts_with("GPU")).count(), 8, "{g}");
    assert!(t.contains("== overall: WARN"), "{t}");
    let row = s.lines().find(|l| l.trim_start().starts_with("0000:15:00.0")).unwrap_or_else(|| panic!("{s}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cells[1..6], ["PIX/GDR", "PXB/GDR", "PHB/stg", "NODE/stg", "SYS/stg"], "{s}");
    assert!(s.contains("GPU 0000:15:00.0: closest NIC mlx5_0 (path PIX, peer memory (module/nvidia_peermem/version)): GDR"), "{s}");
    assert!(section(&t, "GPUDirect").contains("peer memory: yes (module/nvidia_peermem/version)"), "{t}");

    // A baseline of this machine, then the peer-memory module goes away (a driver update that
    // lost it): --diff names the module and every decision that changed, and exits 1.
    let base = f.root.join("baseline.json");
    let (rc, _) = doctor(&["--save", base.to_str().unwrap()], Some(&f.root));
    assert_eq!(rc, 0);
    let (rc, t) = doctor(&["--diff", base.to_str().unwrap()], Some(&f.root));
    assert_eq!(rc, 0, "{t}");
    std::fs::remove_dir_all(f.root.join("module/nvidia_peermem")).unwrap();
    let (rc, t) = doctor(&["--diff", base.to_str().unwrap()], Some(&f.root));
    assert_eq!(rc, 1, "{t}");
    assert!(t.contains("~ gpudirect.peermem: module/nvidia_peermem/version -> none"), "{t}");
    assert!(t.contains("~ topo.0000:15:00.0.mlx5_0: PIX GDR -> PIX staging"), "{t}");

    // Without the module every GPU stages, although each has a NIC under its own switch: the
    // topology section says so instead of OK.
    let (_, t) = doctor(&[], Some(&f.root));
    let s = section(&t, "GPU x NIC topology");
    assert!(s.contains("WARN 8 GPU(s), 8 NIC(s), every GPU stages"), "{s}");
    assert!(s.contains("WARN every GPU's buffers go through host staging, although RDMA NICs sit within P2C of GPUs (GPU 0000:15:00.0 with mlx5_0: no peer-memory module"), "{s}");

    // Two sockets, GPU and NICs on different ones: a warning that says so.
    let f = fixture::two_socket();
    let (_, t) = doctor(&[], Some(&f.root));
    println!("{t}");
    let s = section(&t, "GPU x NIC topology");
    assert!(s.contains("WARN GPU 0000:01:00.0 (NUMA 0) has no NIC on its NUMA node: its closest, mlx5_0, is on NUMA 1 (path SYS)"), "{s}");
    assert!(s.contains("fix: put a NIC on that socket"), "{s}");
    assert!(s.contains("host staging (path SYS, NUMA 0 → 1 (RIVET_GDR_LEVEL=P2C))"), "{s}");

    // A VM: Soft-RoCE without a PCI path.
    let f = fixture::vm();
    let (_, t) = doctor(&["--json"], Some(&f.root));
    assert!(t.contains("\"topo.0000:00:05.0.rxe0\": \"UNKNOWN staging\""), "{t}");
    assert!(t.contains("\"topo.0000:00:05.0.eth0\": \"PHB staging\""), "{t}");
}
