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

/// The verbs receiver's eager copies into GPU memory are asynchronous: a copy is reported done
/// only once its fence is reached, a host copy queued behind it waits for it, and the bytes land.
#[test]
#[cfg_attr(not(rivet_nvidia), ignore = "needs an NVIDIA GPU and driver")]
fn eager_copies_into_gpu_memory_finish_in_order() {
    use nccl_net_rivet::gpu::cuda::DeviceBuf;
    use nccl_net_rivet::transport::verbs::eager::EagerCopies;
    let len = 64 << 10;
    let dev = DeviceBuf::new(0, len).expect("cuMemAlloc on GPU 0");
    // Pageable host memory, as the verbs ring is to CUDA (registered with the NIC only).
    let s: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    let mut host_dst = vec![0u8; 16];
    let mut c = EagerCopies::<nccl_net_rivet::transport::verbs::nic::Verbs>::default();
    // SAFETY: `s` and `dev` outlive the copies (retired below before they drop); `host_dst`
    // holds 16 bytes.
    unsafe {
        assert!(!c.copy(0, dev.ptr() as *mut u8, s.as_ptr(), len, true).unwrap(), "a GPU copy is never done at once");
        assert!(!c.copy(1, host_dst.as_mut_ptr(), s.as_ptr(), 16, false).unwrap(), "a host copy behind it waits");
    }
    assert_eq!(host_dst[..], s[..16], "the host copy itself is done at once");
    let t = std::time::Instant::now();
    let mut done = 0;
    while done < 2 {
        done += c.retire().unwrap();
        assert!(t.elapsed().as_secs() < 10, "the copy into GPU memory did not finish");
    }
    assert!(c.is_empty());
    let mut back = vec![0u8; len];
    dev.download(&mut back).unwrap();
    assert!(back == s, "the bytes in GPU memory differ from the ring's");
}
