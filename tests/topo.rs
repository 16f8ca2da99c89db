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

/// The objects of the JSON list, each as (key, raw value) pairs; a small parser for the flat
/// objects `rivet topo --json` writes (strings without escapes, integers, null).
fn objects(j: &str) -> Vec<Vec<(String, String)>> {
    let j = j.trim();
    assert!(j.starts_with('[') && j.ends_with(']'), "not a JSON list: {j}");
    let body = &j[1..j.len() - 1];
    let mut out = Vec::new();
    for obj in body.split('}').map(str::trim).filter(|s| !s.is_empty()) {
        let obj = obj.trim_start_matches(',').trim();
        let obj = obj.strip_prefix('{').unwrap_or_else(|| panic!("not an object: {obj}"));
        let mut fields = Vec::new();
        for kv in obj.split(',') {
            let (k, v) = kv.split_once(':').unwrap_or_else(|| panic!("bad field {kv}"));
            let k = k.trim();
            assert!(k.starts_with('"') && k.ends_with('"'), "bad key {k}");
            let v = v.trim();
            assert!(v == "null" || v.parse::<i64>().is_ok() || (v.starts_with('"') && v.ends_with('"')), "bad value {v}");
            fields.push((k.trim_matches('"').to_string(), v.trim_matches('"').to_string()));
        }
        out.push(fields);
    }
    out
}

fn find<'a>(objs: &'a [Vec<(String, String)>], gpu: &str, nic: &str) -> &'a Vec<(String, String)> {
    let get = |o: &'a Vec<(String, String)>, k: &str| o.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    objs.iter().find(|o| get(o, "gpu") == Some(gpu) && get(o, "nic") == Some(nic)).unwrap_or_else(|| panic!("no pair {gpu} {nic}"))
}

fn field<'a>(o: &'a [(String, String)], k: &str) -> &'a str {
    o.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str()).unwrap_or_else(|| panic!("no key {k}"))
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
    assert_eq!((field(o, "path"), field(o, "gpu_numa"), field(o, "nic_numa")), ("SYS", "0", "1"));
    let o = find(&objs, "0000:01:00.0", "eth2");
    assert_eq!((field(o, "path"), field(o, "nic_numa")), ("SYS", "null"));

    let f = fixture::vm();
    let objs = objects(&rivet_topo(&f.root, &["--sysfs", f.root.to_str().unwrap(), "--json"], true));
    assert_eq!(objs.len(), 3);
    assert_eq!(field(find(&objs, "0000:00:05.0", "rxe0"), "path"), "UNKNOWN");
    assert_eq!(field(find(&objs, "0000:00:05.0", "eth1"), "path"), "UNKNOWN");
    assert_eq!(field(find(&objs, "0000:00:05.0", "eth0"), "path"), "PHB");
}

#[test]
fn matrix_and_no_gpu() {
    let f = fixture::dgx_h100();
    let m = rivet_topo(&f.root, &[], false);
    let row = m.lines().find(|l| l.starts_with("0000:15:00.0")).unwrap_or_else(|| panic!("{m}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells, ["0000:15:00.0", "PIX", "PXB", "PHB", "NODE", "SYS", "SYS", "SYS", "SYS", "0"], "{m}");
    assert!(m.contains("Legend: PIX"), "{m}");

    let f = fixture::Fixture::new("nogpu");
    let nic = "pci0000:00/0000:00:03.0";
    f.pci(nic, 0x1af4, fixture::CLASS_ETH, -1);
    f.net("eth0", Some(nic), None);
    let m = rivet_topo(&f.root, &[], false);
    assert!(m.starts_with("no GPU found"), "{m}");
    assert!(m.contains("NIC eth0") && m.contains("0000:00:03.0"), "{m}");
    assert_eq!(rivet_topo(&f.root, &["--json"], false).trim(), "[]");
}
