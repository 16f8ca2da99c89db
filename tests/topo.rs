//! `rivet topo` on generated sysfs fixtures (the generator is `src/topo/fixture.rs`, shared with
//! the unit tests): the JSON list and the matrix, through the built CLI.

#[path = "../src/topo/fixture.rs"]
mod fixture;

use std::process::Command;

fn rivet_topo(root: &std::path::Path, args: &[&str], via_env: bool) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rivet"));
    c.arg("topo").args(args);
    if via_env {
        c.env("RIVET_SYSFS_ROOT", root);
    } else {
        c.arg("--sysfs").arg(root).env_remove("RIVET_SYSFS_ROOT");
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "rivet topo failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The GPU-NIC pairs of `rivet topo --json`, each as its JSON object.
fn objects(j: &str) -> Vec<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_str(j).unwrap_or_else(|e| panic!("not JSON ({e}): {j}"));
    v["pairs"].as_array().unwrap_or_else(|| panic!("no pairs: {j}")).clone()
}

fn find<'a>(objs: &'a [serde_json::Value], gpu: &str, nic: &str) -> &'a serde_json::Value {
    objs.iter().find(|o| o["gpu"] == gpu && o["nic"] == nic).unwrap_or_else(|| panic!("no pair {gpu} {nic}"))
}

/// A field as text: strings bare, numbers as digits, null as "null".
fn field(o: &serde_json::Value, k: &str) -> String {
    match o.get(k).unwrap_or_else(|| panic!("no key {k}")) {
        serde_json::Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

#[test]
fn json_on_dgx_h100() {
    let f = fixture::dgx_h100();
    let objs = objects(&rivet_topo(&f.root, &["--json"], true));
    assert_eq!(objs.len(), 64, "8 GPUs x 8 NICs");
    for o in &objs {
        for k in ["gpu", "nic", "path", "gpu_numa", "nic_numa"] {
            field(o, k);
        }
    }
    for (nic, path, nic_numa) in
        [("mlx5_0", "PIX", "0"), ("mlx5_1", "PXB", "0"), ("mlx5_2", "PHB", "0"), ("mlx5_3", "NODE", "0"), ("mlx5_4", "SYS", "1"), ("mlx5_7", "SYS", "1")]
    {
        let o = find(&objs, "0000:15:00.0", nic);
        assert_eq!(field(o, "path"), path, "GPU0 - {nic}");
        assert_eq!(field(o, "gpu_numa"), "0");
        assert_eq!(field(o, "nic_numa"), nic_numa);
    }
    assert_eq!(field(find(&objs, "0000:b3:00.0", "mlx5_7"), "path"), "PIX");
}

#[test]
fn json_on_two_socket_and_vm() {
    let f = fixture::two_socket();
    let objs = objects(&rivet_topo(&f.root, &["--json"], false));
    let o = find(&objs, "0000:01:00.0", "mlx5_0");
    assert_eq!([field(o, "path"), field(o, "gpu_numa"), field(o, "nic_numa")], ["SYS", "0", "1"]);
    let o = find(&objs, "0000:01:00.0", "eth2");
    assert_eq!([field(o, "path"), field(o, "nic_numa")], ["SYS", "null"]);

    let f = fixture::vm();
    let objs = objects(&rivet_topo(&f.root, &["--sysfs", f.root.to_str().unwrap(), "--json"], true));
    assert_eq!(objs.len(), 3);
    assert_eq!(field(find(&objs, "0000:00:05.0", "rxe0"), "path"), "UNKNOWN");
    assert_eq!(field(find(&objs, "0000:00:05.0", "eth1"), "path"), "UNKNOWN");
    assert_eq!(field(find(&objs, "0000:00:05.0", "eth0"), "path"), "PHB");
}

/// The matrix in the shape of `nvidia-smi topo -m`: a tab-separated header of GPUn, NICn and
/// the affinity columns, X on the diagonal, and the legends with bus ids and device names.
#[test]
fn matrix_and_no_gpu() {
    let f = fixture::dgx_h100();
    let m = rivet_topo(&f.root, &[], false);
    let header: Vec<&str> = m.lines().next().unwrap().split('\t').collect();
    let mut want = vec![""];
    let labels: Vec<String> = (0..8).map(|i| format!("GPU{i}")).chain((0..8).map(|i| format!("NIC{i}"))).collect();
    want.extend(labels.iter().map(String::as_str));
    want.extend(["CPU Affinity", "NUMA Affinity"]);
    assert_eq!(header, want, "{m}");
    let row = |label: &str| -> Vec<String> {
        m.lines().find(|l| l.starts_with(&format!("{label}\t"))).unwrap_or_else(|| panic!("no row {label}: {m}")).split('\t').map(|c| c.trim().to_string()).collect()
    };
    let g0 = row("GPU0");
    assert_eq!(g0[1], "X", "{m}");
    assert_eq!(&g0[9..17], ["PIX", "PXB", "PHB", "NODE", "SYS", "SYS", "SYS", "SYS"], "{m}");
    assert_eq!(&g0[17..], ["0-31", "0"], "{m}");
    assert_eq!(&row("GPU7")[17..], ["32-63", "1"], "{m}");
    assert_eq!(row("NIC0")[1], "PIX", "{m}");
    assert_eq!(row("NIC0")[9], "X", "{m}");
    assert!(m.contains("  PIX  = Connection traversing at most a single PCIe bridge"), "{m}");
    assert!(m.contains("  GPU0: 0000:15:00.0"), "{m}");
    assert!(m.contains("  NIC7: mlx5_7 (RDMA, 0000:b4:00.0)"), "{m}");

    let f = fixture::Fixture::new("nogpu");
    let nic = "pci0000:00/0000:00:03.0";
    f.pci(nic, 0x1af4, fixture::CLASS_ETH, -1);
    f.net("eth0", Some(nic), None);
    let m = rivet_topo(&f.root, &[], false);
    assert!(m.starts_with("\tNIC0\tCPU Affinity\tNUMA Affinity\n"), "{m}");
    assert!(m.contains("no GPU found under") && m.contains("NIC0: eth0 (netdev, 0000:00:03.0)"), "{m}");
    // JSON lists the NICs even with no GPU (and so no pairs).
    let j: serde_json::Value = serde_json::from_str(&rivet_topo(&f.root, &["--json"], false)).unwrap();
    assert_eq!(j["gpus"], serde_json::json!([]));
    assert_eq!(j["pairs"], serde_json::json!([]));
    assert_eq!(j["nics"], serde_json::json!([{"name": "eth0", "kind": "netdev", "pci": "0000:00:03.0", "numa": null}]));
}

/// `--example NAME` shows an example machine; `--write DIR` leaves its tree for
/// `RIVET_SYSFS_ROOT`, which then gives the same answer.
#[test]
fn example_machines() {
    let run = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_rivet")).arg("topo").args(args).env_remove("RIVET_SYSFS_ROOT").output().unwrap();
        (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    for (name, gpus, nics) in [("dgx-h100", 8, 8), ("two-socket", 1, 3), ("vm", 1, 3)] {
        let (rc, out, err) = run(&["--example", name, "--json"]);
        assert_eq!(rc, Some(0), "{err}");
        let j: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!((j["gpus"].as_array().unwrap().len(), j["nics"].as_array().unwrap().len()), (gpus, nics), "{name}: {out}");
    }
    let dir = std::env::temp_dir().join(format!("rivet-example-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (rc, shown, err) = run(&["--example", "dgx-h100", "--write", dir.to_str().unwrap()]);
    assert_eq!(rc, Some(0), "{err}");
    assert!(err.contains(&format!("RIVET_SYSFS_ROOT={}", dir.display())), "{err}");
    assert_eq!(rivet_topo(&dir, &[], true), shown, "the written tree reads back the same");
    // A directory that already holds something is not overwritten.
    let (rc, _, err) = run(&["--example", "vm", "--write", dir.to_str().unwrap()]);
    assert_eq!(rc, Some(1));
    assert!(err.contains("is not empty"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
