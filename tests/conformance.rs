//! The C conformance driver (nccl-tests/conformance.c), built with `cc` and run against the built
//! cdylib for every exported ABI version; plus the C header's layout check, the exported symbol
//! set and SONAME, and the ways NCCL finds the library (by name, by SONAME under LD_PRELOAD, and
//! STATIC_PLUGIN).

use std::path::{Path, PathBuf};

mod common;
use std::process::Command;
use std::sync::OnceLock;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// target/<profile>, where cargo put the cdylib.
fn target_dir() -> PathBuf {
    std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().to_path_buf()
}

fn lib() -> PathBuf {
    common::cdylib()
}

fn cc(src: &str, out: &str, extra: &[&str]) -> PathBuf {
    let exe = target_dir().join(out);
    let st = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror"])
        .arg(root().join(src))
        .arg("-o")
        .arg(&exe)
        .args(extra)
        .status()
        .expect("a C compiler (cc) is needed for the tests");
    assert!(st.success(), "compiling {src} failed");
    exe
}

fn driver() -> &'static Path {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| cc("nccl-tests/conformance.c", "rivet-conformance", &["-std=gnu11", "-ldl"]))
}

fn run_driver(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut c = Command::new(driver());
    c.args(args).env("NCCL_SOCKET_IFNAME", "lo").env("RIVET_TIMEOUT", "5").env_remove("LD_LIBRARY_PATH");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

const CASES: &[&str] = &[
    "props", "sizes", "bigrecv", "outstanding", "group", "ring", "closeinflight", "reuse", "mismatch", "kill",
    "reload", "optional", "badargs",
];

/// Whether the driver is expected to skip case `c` at `api` (and must say SKIP, not PASS): the
/// optional receive completion exists from v9 on.
fn skipped_at(c: &str, api: u32) -> bool {
    c == "optional" && api < 9
}

/// Every case passed, or said SKIP where it cannot run at this version (never counted as passed).
fn assert_cases(api: u32, out: &str, what: &str) {
    for c in CASES {
        if skipped_at(c, api) {
            assert!(out.contains(&format!("SKIP api={api} case={c} ")), "case {c} should say SKIP {what} for api {api}:\n{out}");
            assert!(!out.contains(&format!("PASS api={api} case={c} ")), "a skipped case {c} said PASS:\n{out}");
        } else {
            assert!(out.contains(&format!("PASS api={api} case={c} ")), "case {c} did not pass {what} for api {api}:\n{out}");
        }
    }
    assert!(!out.contains("FAIL"), "{out}");
}

fn conformance(api: u32) {
    let l = lib();
    let (ok, out) = run_driver(&["--lib", l.to_str().unwrap(), "--api", &api.to_string()], &[]);
    println!("{out}");
    assert!(ok, "conformance --api {api} failed:\n{out}");
    assert_cases(api, &out, "");
}

#[test]
fn conformance_v6() {
    conformance(6);
}
#[test]
fn conformance_v7() {
    conformance(7);
}
#[test]
fn conformance_v8() {
    conformance(8);
}
#[test]
fn conformance_v9() {
    conformance(9);
}
#[test]
fn conformance_v10() {
    conformance(10);
}
#[test]
fn conformance_v11() {
    conformance(11);
}
#[test]
fn conformance_v12() {
    conformance(12);
}

/// A receiver that is alive but 2.5 x RIVET_TIMEOUT late (RIVET_TIMEOUT=5, 12.5 s) gets 4 x 16 MiB
/// intact: TCP_USER_TIMEOUT used to abort such a connection at zero window after RIVET_TIMEOUT.
/// With the helper threads too, whose streams are watched for a vanished host the same way.
#[test]
fn a_late_receiver_is_waited_for() {
    let l = lib();
    for threads in ["0", "1"] {
        let (ok, out) = run_driver(&["--lib", l.to_str().unwrap(), "--api", "12", "--case", "late"], &[("RIVET_TIMEOUT", "5"), ("RIVET_SOCKET_THREADS", threads)]);
        assert!(ok && out.contains("PASS api=12 case=late "), "RIVET_SOCKET_THREADS={threads}:\n{out}");
        assert!(out.contains("4 x 16 MiB intact"), "{out}");
    }
}

/// The staging engine with its host copier (RIVET_STAGE_HOST=1) under every case: each buffer
/// goes through a bounce buffer, and the copier copies only when its fence is polled, so a
/// receive reported done before its copy shows as wrong contents.
fn staged(api: u32) {
    let l = lib();
    let env = [("RIVET_STAGE_HOST", "1"), ("RIVET_STATS", "1"), ("NCCL_DEBUG", "INFO")];
    let (ok, out) = run_driver(&["-v", "--lib", l.to_str().unwrap(), "--api", &api.to_string()], &env);
    assert!(ok, "staged conformance --api {api} failed:\n{out}");
    assert_cases(api, &out, "staged");
    let staged: Vec<u64> = out
        .lines()
        .filter(|l| l.contains("NET/rivet: stats "))
        .filter_map(|l| l.split("staged ").nth(1)?.split(" / ").nth(1)?.split(',').next()?.trim().parse().ok())
        .collect();
    assert!(staged.iter().sum::<u64>() > 0, "no message went through the staging engine:\n{out}");
    // Large sends are copied in chunks and handed to the transport after the first one.
    assert!(out.contains("staged sends pipelined with their copy)"), "no staged send was pipelined:\n{out}");
    let host: u64 = out
        .lines()
        .filter(|l| l.contains("NET/rivet: stats "))
        .filter_map(|l| l.split("host ").nth(1)?.split(" / ").nth(1)?.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(host, 0, "every buffer is registered, so none should bypass the engine:\n{out}");
}

/// Every case with helper threads on streams 2..n (RIVET_SOCKET_THREADS=1), 4 streams and small
/// chunks so that most messages reach the helpers; closing with requests in flight and the
/// reload case (threads counted) check that the helpers are joined.
#[test]
fn helper_threads_v12() {
    let l = lib();
    let env = [("RIVET_SOCKET_THREADS", "1"), ("RIVET_SOCKET_NSTREAMS", "4"), ("RIVET_SOCKET_MIN_CHUNK", "4096")];
    let (ok, out) = run_driver(&["--lib", l.to_str().unwrap(), "--api", "12"], &env);
    assert!(ok, "conformance with helper threads failed:\n{out}");
    assert_cases(12, &out, "with helper threads");
    let (ok, out) = run_driver(&["--lib", l.to_str().unwrap(), "--api", "12"], &[env[0], env[1], env[2], ("RIVET_STAGE_HOST", "1")]);
    assert!(ok, "staged conformance with helper threads failed:\n{out}");
}

#[test]
fn staged_v12() {
    staged(12);
}
#[test]
fn staged_v6() {
    staged(6);
}

#[test]
fn c_header_layout_matches_the_abi() {
    let exe = cc("tests/c/layout.c", "rivet-layout", &["-std=c11"]);
    let out = Command::new(exe).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ncclNetProperties_v12_t 128"), "{text}");
    assert!(text.contains("ncclNet_v7_t 152"), "{text}");
}

#[test]
fn exports_exactly_the_seven_tables_with_the_nccl_soname() {
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(lib()).output().expect("nm (binutils)");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut tables: Vec<&str> =
        text.lines().filter_map(|l| l.split_whitespace().nth(2)).filter(|s| s.starts_with("ncclNet")).collect();
    tables.sort();
    assert_eq!(
        tables,
        ["ncclNetPlugin_v10", "ncclNetPlugin_v11", "ncclNetPlugin_v12", "ncclNetPlugin_v6", "ncclNetPlugin_v7", "ncclNetPlugin_v8", "ncclNetPlugin_v9"]
    );
    for l in text.lines().filter(|l| l.contains("ncclNetPlugin")) {
        assert!(l.contains(" D ") || l.contains(" R "), "tables must be data symbols: {l}");
    }
    let out = Command::new("readelf").arg("-d").arg(lib()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Library soname: [libnccl-net-rivet.so]"), "{text}");
    assert!(text.contains("NODELETE"), "{text}");
}

#[test]
fn nccl_finds_it_by_plugin_name_on_the_library_path() {
    // NCCL_NET_PLUGIN=rivet makes every NCCL dlopen("libnccl-net-rivet.so").
    let dir = std::env::temp_dir().join(format!("rivet-libpath-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(lib(), dir.join("libnccl-net-rivet.so")).unwrap();
    let (ok, out) =
        run_driver(&["--lib", "libnccl-net-rivet.so", "--api", "6", "--case", "sizes"], &[("LD_LIBRARY_PATH", dir.to_str().unwrap())]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ok, "{out}");
}

#[test]
fn ld_preload_is_found_by_soname_and_as_static_plugin() {
    let l = lib();
    let pre = [("LD_PRELOAD", l.to_str().unwrap())];
    // dlopen of the SONAME returns the preloaded copy (no file by that name on any path).
    let (ok, out) = run_driver(&["--lib", "libnccl-net-rivet.so", "--api", "8", "--case", "sizes"], &pre);
    assert!(ok, "{out}");
    // NCCL 2.30 NCCL_NET_PLUGIN=STATIC_PLUGIN: dlopen(NULL) finds the preloaded tables.
    let (ok, out) = run_driver(&["--lib", "STATIC_PLUGIN", "--api", "12", "--case", "sizes"], &pre);
    assert!(ok, "{out}");
    // Without the preload, neither resolves.
    let (ok, _) = run_driver(&["--lib", "libnccl-net-rivet.so", "--api", "8", "--case", "props"], &[]);
    assert!(!ok);
}

/// With `NCCL_DEBUG=INFO` and NCCL's default `NCCL_DEBUG_SUBSYS` (INIT,BOOTSTRAP,ENV: NCCL shows
/// an INFO line only if its flags meet that mask), a user sees every line that confirms one of
/// rivet's decisions: the library and its devices, the transport, GPU support, each connection's
/// transport, and RIVET_STATS's figures. Every line rivet logs carries NCCL_NET, so
/// `NCCL_DEBUG_SUBSYS=NET` shows them all. The driver prints each line with the flags it got.
#[test]
fn the_lines_that_confirm_decisions_show_under_nccls_default_subsystems() {
    const NCCL_INIT: u64 = 0x1;
    const NCCL_NET: u64 = 0x10;
    const NCCL_ENV: u64 = 0x80;
    const NCCL_BOOTSTRAP: u64 = 0x1000;
    let default_mask = NCCL_INIT | NCCL_BOOTSTRAP | NCCL_ENV;
    let l = lib();
    let env = [("NCCL_DEBUG", "INFO"), ("RIVET_STATS", "1"), ("RIVET_STAGE_HOST", "1"), ("RIVET_SOCKET_CUDA", "1")];
    let mut out = String::new();
    for case in ["props", "sizes"] {
        let (ok, o) = run_driver(&["-v", "--lib", l.to_str().unwrap(), "--api", "12", "--case", case], &env);
        assert!(ok, "{o}");
        out += &o;
    }
    // "[pid N] plugin INFO (flags 0x11) file:line message"
    let infos: Vec<(u64, &str)> = out
        .lines()
        .filter_map(|l| {
            let rest = l.split("plugin INFO (flags 0x").nth(1)?;
            let (hex, msg) = rest.split_once(')')?;
            Some((u64::from_str_radix(hex, 16).ok()?, msg))
        })
        .collect();
    assert!(!infos.is_empty(), "no INFO line:\n{out}");
    for (flags, msg) in &infos {
        assert!(flags & NCCL_NET != 0, "an INFO line without NCCL_NET: {msg}");
    }
    let shown: Vec<&str> = infos.iter().filter(|(f, _)| f & default_mask != 0).map(|(_, m)| *m).collect();
    for want in ["NET/rivet: rivet ", "NET/rivet: device 0: ", "transport TCP", "NET/rivet: host memory only", "over TCP with", "accepted a TCP connection", "NET/rivet: stats "] {
        assert!(shown.iter().any(|m| m.contains(want)), "{want:?} does not show under NCCL's default subsystems; shown:\n{}\nall:\n{out}", shown.join("\n"));
    }
}

/// Settings from `/etc/nccl.conf` reach rivet: NCCL applies the file with setenv() before it loads
/// its net plugin, and rivet reads its variables at the first `init`, not when it is loaded. A
/// stand-in for NCCL (tests/c/confenv.c) sets NCCL_SOCKET_IFNAME to an interface that does not
/// exist, before dlopen as NCCL does and, to be sure, between dlopen and init: `init` must fail
/// naming it (without the setting it succeeds over TCP on lo).
#[test]
fn settings_nccl_applies_from_nccl_conf_reach_rivet() {
    let exe = cc("tests/c/confenv.c", "rivet-confenv", &["-std=gnu11", "-ldl"]);
    let run = |args: &[&str]| {
        let out = Command::new(&exe).arg(lib()).args(args).env_remove("NCCL_SOCKET_IFNAME").env("NCCL_IB_DISABLE", "1").output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    };
    let ok = run(&["NCCL_SOCKET_IFNAME", "lo"]);
    assert!(ok.contains("init 0 devices 1"), "{ok}");
    for late in [&[][..], &["--late"]] {
        let out = run(&[&["NCCL_SOCKET_IFNAME", "no_such_if0"][..], late].concat());
        assert!(!out.contains("init 0 "), "init took no notice of the setting:\n{out}");
        assert!(out.contains("WARN") && out.contains("NCCL_SOCKET_IFNAME=no_such_if0"), "{out}");
    }
}
