//! The `rivet` CLI's conventions: help and version on stdout with exit 0, every value checked and
//! every unknown flag or missing value an error that names the flag (exit 2), a closed pipe ends
//! it quietly, plugin errors named as NCCL names them, and `rivet allreduce` in nccl-tests'
//! all_reduce_perf layout.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::process::{Command, Output};

mod common;

fn rivet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rivet")).args(args).env("NCCL_SOCKET_IFNAME", "lo").env_remove("NCCL_DEBUG").output().unwrap()
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

const SUBCOMMANDS: &[&str] = &["allreduce", "perf", "info", "config", "topo", "doctor"];

#[test]
fn help_goes_to_stdout_and_exits_0() {
    for args in [&["--help"][..], &["-h"], &["help"]] {
        let o = rivet(args);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
        for s in SUBCOMMANDS {
            assert!(out.contains(s), "{args:?} lists {s}: {out}");
        }
        assert!(err.is_empty(), "{err}");
    }
    for s in SUBCOMMANDS {
        for args in [vec![*s, "--help"], vec!["help", s]] {
            let o = rivet(&args);
            let (out, err) = text(&o);
            assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
            assert!(out.contains(&format!("Usage: rivet {s}")), "{args:?}: {out}");
        }
    }
    // `doctor --help` is help, not a doctor run.
    let (out, _) = text(&rivet(&["doctor", "--help"]));
    assert!(!out.contains("== overall"), "{out}");
}

/// `--version` names the version, the git revision and the ncclNet tables, and the built library
/// really exports those tables (and no others).
#[test]
fn version_names_the_exported_tables() {
    let o = rivet(&["--version"]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(0));
    assert!(out.starts_with(&format!("rivet {} (git ", env!("CARGO_PKG_VERSION"))), "{out}");
    let listed: Vec<u32> = out
        .lines()
        .find(|l| l.starts_with("ncclNet ABI versions exported:"))
        .unwrap_or_else(|| panic!("{out}"))
        .split_whitespace()
        .filter_map(|w| w.strip_prefix('v')?.parse().ok())
        .collect();
    let lib = common::cdylib();
    let nm = Command::new("nm").args(["-D", "--defined-only"]).arg(&lib).output().expect("nm (binutils)");
    let syms = String::from_utf8_lossy(&nm.stdout);
    let exported: Vec<u32> = syms
        .lines()
        .filter_map(|l| l.split_whitespace().last()?.strip_prefix("ncclNetPlugin_v")?.parse().ok())
        .collect::<std::collections::BTreeSet<u32>>()
        .into_iter()
        .collect();
    assert!(!exported.is_empty(), "{syms}");
    assert_eq!(listed, exported, "--version against nm -D of {}", lib.display());
}

/// Each case: the arguments, and what the error must say.
#[test]
fn bad_input_is_an_error_that_names_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["allreduce", "--ranks", "four"], "'four' for '--ranks <RANKS>'"),
        (&["allreduce", "--ranks", "1"], "--ranks <RANKS>"),
        (&["allreduce", "-n"], "a value is required for '--iters <N>'"),
        (&["allreduce", "-b", "12Q"], "'12Q' is not a size"),
        (&["allreduce", "-f", "1"], "--stepfactor"),
        (&["allreduce", "--iters", "0"], "--iters"),
        (&["allreduce", "--bogus"], "unexpected argument '--bogus'"),
        (&["perf", "--window", "0"], "--window"),
        (&["perf", "--window", "99"], "--window"),
        (&["perf", "--sizes", "1M,x"], "'x' is not a size"),
        (&["perf", "--lat-iters"], "a value is required for '--lat-iters <N>'"),
        (&["perf", "--lat-iters", "-3"], "--lat-iters"),
        (&["perf", "--dev", "a"], "--dev <LIST>"),
        (&["perf", "extra"], "unexpected argument 'extra'"),
        (&["info", "--nope"], "unexpected argument '--nope'"),
        (&["config", "--x"], "unexpected argument '--x'"),
        (&["topo", "--example", "nosuch"], "possible values: dgx-h100, two-socket, vm"),
        (&["topo", "--write", "/tmp/x"], "--example <NAME>"),
        (&["topo", "--jsn"], "unexpected argument '--jsn'"),
        (&["doctor", "--jsno"], "unexpected argument '--jsno'"),
        (&["doctor", "--save"], "a value is required for '--save <FILE>'"),
        (&["doctor", "--diff"], "a value is required for '--diff <FILE>'"),
        (&["nosuch"], "unrecognized subcommand 'nosuch'"),
        (&[], "Usage: rivet <COMMAND>"),
    ];
    for (args, want) in cases {
        let o = rivet(args);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?} exits 2 (usage error): {out}{err}");
        assert!(err.contains(want), "{args:?}: the error names {want:?}: {err}");
        assert!(!out.contains("== overall") && !out.contains("# nThread"), "{args:?} ran anyway: {out}");
    }
    // Checked before any process starts, with the flag named.
    let (_, err) = text(&rivet(&["allreduce", "-b", "1M", "-e", "64K"]));
    assert!(err.contains("-e/--maxbytes 65536 is below -b/--minbytes 1048576"), "{err}");
}

/// An error from the plugin is named as NCCL names it, never as a bare number.
#[test]
fn plugin_errors_use_ncclresult_names() {
    let o = Command::new(env!("CARGO_BIN_EXE_rivet")).arg("info").env("NCCL_SOCKET_IFNAME", "=nosuchif0").output().unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("init failed: ncclSystemError"), "{err}");
    assert!(!err.contains("ncclResult_t 2"), "{err}");
}

/// Output into a pipe whose reader is gone: the process ends quietly (SIGPIPE's default, as
/// `cat` does), never with a panic message.
#[test]
fn a_closed_pipe_ends_quietly() {
    use std::os::fd::{FromRawFd, OwnedFd};
    for args in [&["topo", "--example", "dgx-h100"][..], &["topo", "--json", "--example", "dgx-h100"], &["config"], &["--help"]] {
        let mut fds = [0; 2];
        // SAFETY: pipe(2) fills the two-int array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both descriptors were just created by pipe(2) and are owned here.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        drop(r);
        let o = Command::new(env!("CARGO_BIN_EXE_rivet")).args(args).stdout(w).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.is_empty(), "{args:?}: {err}");
        use std::os::unix::process::ExitStatusExt;
        assert!(o.status.signal() == Some(libc::SIGPIPE) || o.status.success(), "{args:?}: {:?}", o.status);
    }
}

/// `--lat-iters 0` skips the latency test instead of confusing the bandwidth test.
#[test]
fn perf_without_latency_test() {
    let o = rivet(&["perf", "--check", "--lat-iters", "0", "--sizes", "64K,1M", "--bytes", "8M"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(!out.contains("# latency"), "{out}");
    assert_checked(&out, 1);
    let rows: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(rows[1].split_whitespace().next() == Some("1048576"), "{out}");
}

/// `--profiler`: the harness passes NCCL's profiler callback at init (and with `events` a
/// handle with every request, as NCCL does with a profiler plugin loaded); the data still
/// arrives intact, and each rank says how many network events the plugin reported: none over
/// TCP, which reports none (over verbs, ci/bench_instr.py asserts they come and all stop).
#[test]
fn perf_with_a_profiler_callback() {
    for mode in ["callback", "events"] {
        let o = rivet(&["perf", "--check", "--profiler", mode, "--lat-iters", "100", "--sizes", "64K", "--bytes", "1M"]);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{mode}: {out}{err}");
        assert_checked(&out, 2);
        let events: Vec<&str> = out.lines().filter(|l| l.starts_with("# profiler events, rank ")).collect();
        if mode == "events" {
            assert_eq!(events.len(), 2, "an events line per rank:\n{out}");
            assert!(events.iter().all(|l| l.ends_with(": 0 started, 0 stopped")), "{out}");
        } else {
            assert!(events.is_empty(), "{out}");
        }
    }
    let o = rivet(&["perf", "--profiler", "loud"]);
    assert_ne!(o.status.code(), Some(0));
    assert!(text(&o).1.contains("--profiler"), "{}", text(&o).1);
}

/// `rivet perf --check`'s lines: each of `ranks` ranks received messages, every byte as sent.
fn assert_checked(out: &str, ranks: usize) {
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("# data check, rank ")).collect();
    assert_eq!(lines.len(), ranks, "a data check line per receiving rank:\n{out}");
    for l in lines {
        let n: u64 = l.split(" in ").nth(1).and_then(|r| r.split_whitespace().next()).and_then(|n| n.parse().ok()).unwrap_or(0);
        assert!(l.contains(": 0 wrong byte(s) in ") && n > 0, "{l}");
    }
}

/// `--abi N` drives the plugin through its ncclNetPlugin_vN table, as an NCCL of that version
/// would (the same code drives the peer plugins, whose newest tables differ): every version moves
/// the data, says which table it used, and reports the latency tail.
#[test]
fn perf_through_every_table_version() {
    for v in 6..=12 {
        let o = rivet(&["perf", "--check", "--abi", &v.to_string(), "--lat-iters", "200", "--sizes", "64K,1M", "--bytes", "4M"]);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(0), "v{v}: {out}{err}");
        assert_checked(&out, 2);
        assert!(out.contains(&format!("(ncclNet v{v}, plugin rivet)")), "v{v}: {out}");
        let lat = out.lines().find(|l| l.starts_with("# latency")).unwrap_or_else(|| panic!("v{v}: no latency line: {out}"));
        let num = |k: &str| -> f64 {
            let i = lat.find(k).unwrap_or_else(|| panic!("v{v}: no {k} in {lat}")) + k.len();
            lat[i..].split_whitespace().next().unwrap().parse().unwrap()
        };
        let (p50, p90, p99, max) = (num("typical "), num("p90 "), num("p99 "), num("max "));
        assert!(p50 > 0.0 && p50 <= p90 && p90 <= p99 && p99 <= max, "v{v}: percentiles out of order: {lat}");
        let rows: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(rows.len(), 2, "v{v}: {out}");
    }
    let o = rivet(&["info", "--abi", "9"]);
    let (out, err) = text(&o);
    assert!(out.contains("plugin: rivet through ncclNetPlugin_v9"), "{out}{err}");
    let o = rivet(&["perf", "--abi", "5"]);
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
}

/// Another plugin, driven as NCCL drives it: its table is read after init (NCCL's IB transport as a
/// plugin fills its table in init), and init gets a logger (plugins call it unchecked). The
/// stand-in is tests/c/lateplugin.c.
#[test]
fn a_plugin_that_fills_its_table_in_init() {
    let dir = std::env::temp_dir().join(format!("rivet-lateplugin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let so = dir.join("liblate.so");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/lateplugin.c");
    let st = Command::new("cc").args(["-std=gnu11", "-shared", "-fPIC", "-o"]).arg(&so).arg(&src).status().expect("cc");
    assert!(st.success());
    let o = rivet(&["info", "--lib", so.to_str().unwrap()]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(out.contains("plugin: late through ncclNetPlugin_v11"), "{out}");
    assert!(out.contains("dev 0: name late0") && out.contains("speed 1234 Mb/s"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// nccl-tests' all_reduce_perf layout, parsed as scripts written for nccl-tests parse it: the
/// header, one `#  Rank` line per rank, 13 columns per row (size, count, type, redop, root, and
/// time/algbw/busbw/#wrong twice), sizes stepping by the factor with count = size / 4, and the
/// closing lines.
#[test]
fn allreduce_prints_all_reduce_perf_layout() {
    let o = rivet(&["allreduce", "--ranks", "3", "-b", "8", "-e", "128K", "-f", "4", "-n", "3", "-w", "1"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("# nThread 1 nGpus 1 minBytes 8 maxBytes 131072 step: 4(factor) warmup iters: 1 iters: 3 agg iters: 1 validation: 1 graph: 0"), "{out}");
    assert_eq!(lines.iter().filter(|l| l.starts_with("#  Rank ")).count(), 3, "{out}");
    for r in 0..3 {
        assert!(out.contains(&format!("#  Rank  {r} Group  0 Pid ")), "{out}");
    }
    assert!(out.contains("out-of-place                       in-place"), "{out}");
    let head = lines.iter().find(|l| l.contains("#wrong")).unwrap();
    assert_eq!(
        head.split_whitespace().collect::<Vec<_>>(),
        ["#", "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"]
    );
    let rows: Vec<Vec<&str>> = lines.iter().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).map(|l| l.split_whitespace().collect()).collect();
    let sizes: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(sizes, ["8", "32", "128", "512", "2048", "8192", "32768", "131072"], "{out}");
    let mut busbw = Vec::new();
    for r in &rows {
        assert_eq!(r.len(), 13, "{r:?}");
        assert_eq!(r[1].parse::<usize>().unwrap() * 4, r[0].parse::<usize>().unwrap());
        assert_eq!(&r[2..5], ["float", "sum", "-1"]);
        for g in [5, 9] {
            assert!(r[g].parse::<f64>().unwrap() > 0.0, "time {r:?}");
            r[g + 1].parse::<f64>().unwrap();
            busbw.push(r[g + 2].parse::<f64>().unwrap());
            assert_eq!(r[g + 3], "0", "#wrong {r:?}");
        }
    }
    assert!(out.contains("\n# Out of bounds values : 0 OK\n"), "{out}");
    let avg: f64 = lines.iter().find_map(|l| l.strip_prefix("# Avg bus bandwidth    : ")).unwrap().trim().parse().unwrap();
    let mean = busbw.iter().sum::<f64>() / busbw.len() as f64;
    // The rows print 2 decimals; the average is of the unrounded values.
    assert!((avg - mean).abs() < 0.01, "avg {avg} vs rows {mean}");
}

/// `rivet soak`: a short run passes with every byte checked and nothing grown; a flipped byte
/// (the check's own test) fails it.
#[test]
fn soak_checks_every_byte() {
    let o = rivet(&["soak", "--minutes", "0.1", "--max-size", "4M", "--seed", "7"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    for phase in ["host", "staged"] {
        for rank in 0..2 {
            let line = out.lines().find(|l| l.starts_with(&format!("# soak {phase} rank {rank}: "))).unwrap_or_else(|| panic!("{out}"));
            assert!(line.contains(" 0 wrong bytes") && line.ends_with("PASS"), "{line}");
            assert!(line.contains("after close: ") && line.contains("fds +0, threads +0"), "{line}");
            assert!(line.contains("; longest data-path call ") && line.contains(" ms ("), "{line}");
        }
    }
    assert!(out.contains("seed 7") && out.trim_end().ends_with("# rivet soak: PASS"), "{out}");
    let o = Command::new(env!("CARGO_BIN_EXE_rivet"))
        .args(["soak", "--minutes", "0.05", "--max-size", "1M", "--buffers", "host"])
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("RIVET_SOAK_FLIP", "1")
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(out.contains(" 1 wrong bytes") && out.trim_end().ends_with("# rivet soak: FAIL"), "{out}");
}

/// `rivet perf ARGS --bytes 4M --lat-iters 50` over TCP on loopback, 3 streams per comm: its
/// stdout, once it has exited 0.
fn perf_comms(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_rivet"))
        .arg("perf")
        .args(args)
        .args(["--bytes", "4M", "--lat-iters", "50", "--check"])
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_IB_DISABLE", "1")
        .env("RIVET_SOCKET_NSTREAMS", "3")
        .env_remove("NCCL_DEBUG")
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    out
}

/// The rows of a printed table (the lines not starting with `#`), split into their cells.
fn table_rows(out: &str) -> Vec<Vec<&str>> {
    out.lines().filter(|l| !l.starts_with('#')).map(|l| l.split_whitespace().collect()).collect()
}

/// `perf --comms` prints one row per N (each from fresh processes) with what a connection costs:
/// over TCP each pair holds one socket per stream in each of its two comms, no thread, and no
/// RDMA resources; and it moves data over all the pairs.
#[test]
fn perf_comms_prints_what_each_connection_costs() {
    let out = perf_comms(&["--comms", "1,3"]);
    assert!(out.contains("# rivet perf --comms:") && out.contains("GB/s@1M"), "{out}");
    let rows = table_rows(&out);
    assert_eq!(rows.iter().map(|r| r[0]).collect::<Vec<_>>(), ["1", "3"], "{out}");
    for r in &rows {
        assert_eq!(r.len(), 16, "{out}");
        assert_eq!((r[9], r[10]), ("6.0", "0.0"), "fds and threads per pair: {out}");
        // `-` where the host tracks no RDMA resources; 0 where it does (none are this process's).
        assert!(r[5..9].iter().all(|v| *v == "-" || *v == "0.0"), "no RDMA resources over TCP: {out}");
        let (p50, gbs): (f64, f64) = (r[13].parse().unwrap(), r[15].parse().unwrap());
        assert!(p50 > 0.0 && gbs > 0.0, "{out}");
    }
}

/// `perf --comms --warm` connects and closes one pair before the timed ones: the header says so,
/// every N still gets its row, and the per-pair fds are those of the N pairs alone (the first
/// pair's sockets were closed again); without --comms the option is refused.
#[test]
fn perf_comms_warm_connects_an_untimed_first_pair_and_closes_it() {
    let out = perf_comms(&["--comms", "1,2", "--warm"]);
    assert!(out.contains("after an untimed first pair (--warm)"), "{out}");
    let rows = table_rows(&out);
    assert_eq!(rows.iter().map(|r| r[0]).collect::<Vec<_>>(), ["1", "2"], "{out}");
    for r in &rows {
        assert_eq!(r.len(), 16, "{out}");
        assert_eq!(r[9], "6.0", "fds per pair, the first pair's closed: {out}");
        let setup: f64 = r[1].parse().unwrap();
        assert!(setup > 0.0, "{out}");
    }
    let o = Command::new(env!("CARGO_BIN_EXE_rivet")).args(["perf", "--warm"]).output().unwrap();
    let (out, err) = text(&o);
    assert_ne!(o.status.code(), Some(0), "{out}{err}");
    assert!(err.contains("--comms"), "{err}");
}

/// A host with GPUs and RDMA devices (the dgx-h100 example machine) whose rivet finds no usable
/// RDMA port runs over TCP with one WARN that says why and what to do; RIVET_TRANSPORT=verbs makes
/// `init` fail instead (with the reason), and RIVET_TRANSPORT=tcp chooses TCP without the WARN.
/// NCCL_IB_HCA matches nothing, so that no port is usable even where this host has one.
#[test]
fn tcp_where_rdma_was_expected_is_warned_and_rivet_transport_verbs_refuses_it() {
    let dir = std::env::temp_dir().join(format!("rivet-tcpwarn-{}", std::process::id()));
    let sys = dir.join("sys");
    let o = rivet(&["topo", "--example", "dgx-h100", "--write", sys.to_str().unwrap()]);
    assert!(o.status.success(), "{:?}", text(&o));
    let info = |env: &[(&str, &str)]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rivet"));
        c.arg("info").env("NCCL_SOCKET_IFNAME", "lo").env("NCCL_IB_HCA", "=no_such_hca").env_remove("NCCL_DEBUG").env_remove("NCCL_IB_DISABLE").env_remove("RIVET_TRANSPORT");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let dgx = [("RIVET_SYSFS_ROOT", sys.to_str().unwrap())];
    let o = info(&dgx);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(out.contains("dev 0: name lo"), "TCP is used:\n{out}");
    let warns: Vec<&str> = err.lines().filter(|l| l.contains("NCCL WARN")).collect();
    assert_eq!(warns.len(), 1, "one WARN:\n{err}");
    for part in ["this host has 8 GPU(s) and 8 RDMA device(s) (mlx5_0", "runs over TCP", "RIVET_TRANSPORT=verbs", "RIVET_TRANSPORT=tcp"] {
        assert!(warns[0].contains(part), "the WARN lacks {part:?}:\n{}", warns[0]);
    }
    // A host with neither GPUs nor RDMA devices: TCP is what it has, no WARN.
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let o = info(&[("RIVET_SYSFS_ROOT", empty.to_str().unwrap())]);
    let (out, err) = text(&o);
    assert!(o.status.success() && !err.contains("WARN"), "{out}{err}");
    // Chosen TCP: no WARN.
    let o = info(&[dgx[0], ("RIVET_TRANSPORT", "tcp")]);
    let (out, err) = text(&o);
    assert!(o.status.success() && !err.contains("WARN"), "{out}{err}");
    // RDMA required: init fails, saying why and how to get RDMA or TCP back.
    for env in [&[dgx[0], ("RIVET_TRANSPORT", "verbs")][..], &[("RIVET_TRANSPORT", "verbs"), ("RIVET_SYSFS_ROOT", empty.to_str().unwrap())]] {
        let o = info(env);
        let (out, err) = text(&o);
        assert_ne!(o.status.code(), Some(0), "{out}{err}");
        assert!(err.contains("RIVET_TRANSPORT=verbs requires RDMA, but ") && err.contains("RIVET_TRANSPORT=auto"), "{err}");
        assert!(!out.contains("dev 0"), "no device offered:\n{out}");
    }
    let o = info(&[("RIVET_TRANSPORT", "verbs"), ("NCCL_IB_DISABLE", "1")]);
    assert!(!o.status.success() && text(&o).1.contains("NCCL_IB_DISABLE=1 forbids it"), "{:?}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}
