//! nccl-tests/all_reduce_perf.sh selects rivet for a user's all_reduce_perf, locally and under
//! mpirun; checked with stand-ins for all_reduce_perf and mpirun that print what they were given.

use std::path::{Path, PathBuf};
use std::process::Command;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("nccl-tests/all_reduce_perf.sh")
}

fn stand_ins() -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("rivet-arperf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        Command::new("chmod").arg("+x").arg(&p).status().unwrap();
        p
    };
    let bin = exe("all_reduce_perf", r#"echo "ARGS $*"; echo "NET=$NCCL_NET PLUGIN=$NCCL_NET_PLUGIN TIMEOUT=$RIVET_TIMEOUT"; echo "LDPATH=$LD_LIBRARY_PATH""#);
    exe("mpirun", r#"echo "MPIRUN $*""#);
    // A plugin file to point at (its contents do not matter to the stand-ins).
    std::fs::write(dir.join("libnccl-net-rivet.so"), b"").unwrap();
    (dir, bin)
}

fn run(args: &[&str], path_dir: &Path) -> String {
    let out = Command::new("bash")
        .arg(script())
        .args(args)
        .env("RIVET_TIMEOUT", "7")
        .env("PATH", format!("{}:{}", path_dir.display(), std::env::var("PATH").unwrap()))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    text
}

#[test]
fn local_and_mpirun() {
    let (dir, bin) = stand_ins();
    let lib = dir.join("libnccl-net-rivet.so");
    let (lib_s, bin_s) = (lib.to_str().unwrap(), bin.to_str().unwrap());
    let t = run(&["--lib", lib_s, "--bin", bin_s], &dir);
    assert!(t.contains("ARGS -b 8 -e 128M -f 2 -g 1"), "{t}");
    // NCCL_NET_PLUGIN=rivet and the library's directory on the loader path: what NCCL 2.18-2.20
    // accept too (they cannot take an absolute path).
    assert!(t.contains("NET=rivet PLUGIN=rivet TIMEOUT=7"), "{t}");
    assert!(t.contains(&format!("LDPATH={}", dir.display())), "{t}");
    let t = run(&["--lib", lib_s, "--bin", bin_s, "--hosts", "n1,n2", "--", "-b", "1M", "-e", "1G"], &dir);
    let line = t.lines().find(|l| l.starts_with("MPIRUN")).unwrap_or_else(|| panic!("{t}"));
    assert!(line.starts_with("MPIRUN -np 2 -H n1,n2 -x LD_LIBRARY_PATH"), "{line}");
    for v in ["-x NCCL_NET ", "-x NCCL_NET_PLUGIN ", "-x RIVET_TIMEOUT "] {
        assert!(line.contains(v), "{v} missing: {line}");
    }
    assert!(line.ends_with(&format!("{bin_s} -b 1M -e 1G")), "{line}");
    // A missing binary is an error that says how to get one.
    let out = Command::new("bash").arg(script()).args(["--lib", lib_s, "--bin", "/nonexistent"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("build nccl-tests"));
    // A library under another name would not be found by NCCL_NET_PLUGIN=rivet.
    std::fs::write(dir.join("libnccl_net_rivet.so"), b"").unwrap();
    let out = Command::new("bash").arg(script()).args(["--lib", dir.join("libnccl_net_rivet.so").to_str().unwrap(), "--bin", bin_s]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("must be named libnccl-net-rivet.so"));
    let _ = std::fs::remove_dir_all(dir);
}
