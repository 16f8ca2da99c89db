//! Without a usable CUDA driver the plugin is host-only, says why once at INFO, and never panics:
//! no libcuda at all, a libcuda that lacks entry points (cudarc would panic on the first call to
//! one), and a libcuda whose cuInit fails. The stand-ins are built from tests/c/fakecuda.c.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fake_driver(tag: &str, defs: &[&str]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rivet-fakecuda-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/fakecuda.c");
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join("libcuda.so.1"))
        .arg(&src)
        .args(defs)
        .status()
        .expect("cc");
    assert!(st.success());
    std::fs::copy(dir.join("libcuda.so.1"), dir.join("libcuda.so")).unwrap();
    dir
}

/// `rivet info` with RIVET_SOCKET_CUDA=1 (which would offer CUDA pointers if a driver worked).
fn info(libdir: Option<&Path>) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rivet"));
    c.arg("info").env("NCCL_DEBUG", "INFO").env("RIVET_SOCKET_CUDA", "1").env("NCCL_SOCKET_IFNAME", "lo").env("NCCL_IB_DISABLE", "1");
    match libdir {
        Some(d) => c.env("LD_LIBRARY_PATH", d),
        None => c.env_remove("LD_LIBRARY_PATH"),
    };
    let out = c.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("panick"), "{text}");
    assert!(text.contains("ptrSupport 0x1 "), "host memory only, whatever RIVET_SOCKET_CUDA says:\n{text}");
    assert_eq!(text.matches("NET/rivet: host memory only").count(), 1, "said once:\n{text}");
    text
}

#[test]
#[cfg_attr(rivet_nvidia, ignore = "this host has an NVIDIA driver")]
fn no_driver_library() {
    // Where an NVIDIA driver is installed, libcuda.so.1 is found: nothing to show there.
    if Path::new("/dev/nvidiactl").exists() {
        println!("SKIP no_driver_library: this host has an NVIDIA driver");
        return;
    }
    let t = info(None);
    assert!(t.contains("host memory only: libcuda.so.1 not found"), "{t}");
}

#[test]
fn driver_lacking_entry_points() {
    let d = fake_driver("partial", &["-DFAKE_PARTIAL"]);
    let t = info(Some(&d));
    assert!(t.contains("host memory only: the CUDA driver lacks cuDriverGetVersion"), "{t}");
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn driver_that_sees_no_gpu() {
    let d = fake_driver("nodev", &[]);
    let t = info(Some(&d));
    assert!(t.contains("host memory only: cuInit failed: CUDA_ERROR_NO_DEVICE"), "{t}");
    let _ = std::fs::remove_dir_all(d);
}
