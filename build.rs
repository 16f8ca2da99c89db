// NCCL dlopens "libnccl-net-<name>.so": give the cdylib that SONAME so that a copy or symlink under
// that name (and an LD_PRELOADed copy, which the dynamic loader matches by SONAME) is found.
// `-z nodelete` keeps the library mapped after NCCL 2.27+ dlcloses it, so no code or static it handed
// out (logger state, thread-local destructors) can be unmapped under a running process.
// RIVET_GIT_REV is the revision `rivet --version` reports ("unknown" outside a git checkout).
// The host facts some tests need (root, an NVIDIA driver, RDMA devices, an installed libibverbs)
// become cfgs, so that a test that cannot run here is marked ignored, with the reason, instead
// of passing without asserting anything.
use std::process::Command;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl-net-rivet.so");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=build.rs");
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(2)).map(|u| u == "0"))
        .unwrap_or(false);
    let exists = |p: &str| std::path::Path::new(p).exists();
    let libibverbs = ["/usr/lib/x86_64-linux-gnu/libibverbs.so.1", "/usr/lib64/libibverbs.so.1", "/usr/lib/libibverbs.so.1"];
    for (cfg, on) in [
        ("rivet_root", root),
        ("rivet_nvidia", exists("/dev/nvidiactl")),
        ("rivet_rdma", exists("/dev/infiniband")),
        ("rivet_libibverbs", libibverbs.iter().any(|p| exists(p))),
    ] {
        println!("cargo:rustc-check-cfg=cfg({cfg})");
        if on {
            println!("cargo:rustc-cfg={cfg}");
        }
    }
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let rev = std::env::var("RIVET_GIT_REV").ok().filter(|r| !r.is_empty()).or_else(|| git(&["rev-parse", "--short=12", "HEAD"]));
    println!("cargo:rustc-env=RIVET_GIT_REV={}", rev.unwrap_or_else(|| "unknown".into()));
    println!("cargo:rerun-if-env-changed=RIVET_GIT_REV");
    // Rebuild when HEAD moves (a commit, a checkout).
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        let mut watch = vec![format!("{dir}/HEAD"), format!("{dir}/packed-refs")];
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch.push(format!("{dir}/{r}"));
        }
        // A path that does not exist would make cargo rerun this script on every build.
        for w in watch.iter().filter(|w| std::path::Path::new(w).exists()) {
            println!("cargo:rerun-if-changed={w}");
        }
    }
}
