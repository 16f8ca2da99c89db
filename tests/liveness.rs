//! A peer host that vanishes mid-transfer is found within a stated bound and reported as
//! unreachable, on both sides of a TCP connection; a receiver that is only late is waited for
//! (that half is the conformance driver's `late` case, in tests/conformance.rs).
//!
//! The two ranks run in two network namespaces joined by a veth pair; the receiver's end of the
//! pair is taken down while a stream of 16 MiB messages flows, so neither kernel hears from the
//! other again (no reset, no FIN): what a host that loses power or network looks like. Needs root
//! (`ip netns`); elsewhere it says SKIP and passes nothing.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;
use common::*;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TIMEOUT_S: u64 = 3;
/// What the README promises: a vanished host is reported within twice RIVET_TIMEOUT, plus the
/// time the kernel's buffers take to fill and a margin for a loaded machine.
const BOUND: Duration = Duration::from_secs(2 * TIMEOUT_S + 15);
const MSG: usize = 16 << 20;

fn ip(args: &[&str]) -> bool {
    Command::new("ip").args(args).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

struct Netns {
    a: String,
    b: String,
}

impl Netns {
    fn new() -> Option<Netns> {
        let id = std::process::id();
        let n = Netns { a: format!("rvt-a-{id}"), b: format!("rvt-b-{id}") };
        let (va, vb) = (format!("rva{id}"), format!("rvb{id}"));
        let ok = ip(&["netns", "add", &n.a])
            && ip(&["netns", "add", &n.b])
            && ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])
            && ip(&["link", "set", &va, "netns", &n.a])
            && ip(&["link", "set", &vb, "netns", &n.b])
            && ip(&["-n", &n.a, "addr", "add", "10.77.0.1/24", "dev", &va])
            && ip(&["-n", &n.b, "addr", "add", "10.77.0.2/24", "dev", &vb])
            && ip(&["-n", &n.a, "link", "set", &va, "up"])
            && ip(&["-n", &n.b, "link", "set", &vb, "up"]);
        if !ok {
            return None;
        }
        Some(n)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        ip(&["netns", "del", &self.a]);
        ip(&["netns", "del", &self.b]);
    }
}

fn wait_file(p: &Path, limit: Duration) -> Option<Vec<u8>> {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if let Ok(s) = std::fs::read(p) {
            if !s.is_empty() {
                return Some(s);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Test `req` until it completes (Ok) or fails (Err(ncclResult_t)); None if `limit` passes.
fn test_until(req: *mut c_void, limit: Duration) -> Option<Result<(), i32>> {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        let (mut done, mut size) = (0, 0);
        // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and handles
        // it returned; the buffers are this test's and outlive their requests (the test waits for
        // them or closes the comm first).
        let r = unsafe { t().test.unwrap()(req, &mut done, &mut size) };
        if r != 0 {
            return Some(Err(r));
        }
        if done != 0 {
            return Some(Ok(()));
        }
    }
    None
}

/// One rank, inside its namespace: stream 16 MiB messages until the connection fails, then say
/// how long after the link went down (the parent writes that instant to `down`).
fn rank(role: &str, dir: &Path) {
    let ctx = init();
    let buf: Vec<u8> = (0..MSG).map(|i| (i * 13) as u8).collect();
    let mut rbuf = vec![0u8; MSG];
    let report = |what: String| {
        let down: Option<u128> = std::fs::read_to_string(dir.join("down")).ok().and_then(|s| s.trim().parse().ok());
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
        println!("RESULT {role}: {what}; {} ms after the link went down", down.map_or(-1, |d| (now - d) as i64));
    };
    if role == "recv" {
        let (h, lc) = listen(&ctx);
        std::fs::write(dir.join("handle.tmp"), h).unwrap();
        std::fs::rename(dir.join("handle.tmp"), dir.join("handle")).unwrap();
        let end = Instant::now() + Duration::from_secs(20);
        let rc = loop {
            let (r, c) = accept_once(lc);
            assert_eq!(r, 0);
            if !c.is_null() {
                break c;
            }
            assert!(Instant::now() < end, "no connection");
        };
        loop {
            let req = irecv(rc, &mut rbuf, 1);
            match test_until(req, Duration::from_secs(120)) {
                Some(Ok(())) => {}
                Some(Err(e)) => return report(format!("test failed with {e}")),
                None => return report("no error within 120 s".into()),
            }
        }
    }
    let h = wait_file(&dir.join("handle"), Duration::from_secs(20)).expect("no handle from the receiver");
    let mut h: [u8; 128] = h.as_slice().try_into().unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    let sc = loop {
        let (r, c) = connect_once(&ctx, &mut h);
        assert_eq!(r, 0);
        if !c.is_null() {
            break c;
        }
        assert!(Instant::now() < end, "no connection");
    };
    let mut sent = 0;
    loop {
        let req = try_isend(sc, &buf, 1, Duration::from_secs(120));
        if req.is_null() {
            return report("isend back-pressured for 120 s".into());
        }
        match test_until(req, Duration::from_secs(120)) {
            Some(Ok(())) => {}
            Some(Err(e)) => return report(format!("test failed with {e}")),
            None => return report("no error within 120 s".into()),
        }
        sent += 1;
        if sent == 4 {
            std::fs::write(dir.join("streaming"), "1").unwrap();
        }
    }
}

#[test]
#[cfg_attr(not(rivet_root), ignore = "needs root (ip netns)")]
fn a_vanished_host_is_reported_unreachable_on_both_sides() {
    if let Ok(role) = std::env::var("RIVET_LIVENESS_ROLE") {
        rank(&role, Path::new(&std::env::var("RIVET_LIVENESS_DIR").unwrap()));
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip("a_vanished_host_is_reported_unreachable_on_both_sides", "needs root (ip netns)");
        return;
    }
    let Some(ns) = Netns::new() else {
        skip("a_vanished_host_is_reported_unreachable_on_both_sides", "cannot create network namespaces with a veth pair (iproute2's ip, root)");
        return;
    };
    let dir: PathBuf = std::env::temp_dir().join(format!("rivet-liveness-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = std::env::current_exe().unwrap();
    let spawn = |netns: &str, role: &str, ifname: &str| {
        Command::new("ip")
            .args(["netns", "exec", netns])
            .arg(&exe)
            .args(["a_vanished_host_is_reported_unreachable_on_both_sides", "--exact", "--include-ignored", "--nocapture", "--test-threads=1"])
            .env("RIVET_LIVENESS_ROLE", role)
            .env("RIVET_LIVENESS_DIR", &dir)
            .env("RIVET_TIMEOUT", TIMEOUT_S.to_string())
            .env("NCCL_SOCKET_IFNAME", ifname)
            .env_remove("NCCL_DEBUG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let id = std::process::id();
    let recv = spawn(&ns.b, "recv", &format!("rvb{id}"));
    let send = spawn(&ns.a, "send", &format!("rva{id}"));
    assert!(wait_file(&dir.join("streaming"), Duration::from_secs(30)).is_some(), "the ranks never streamed");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    std::fs::write(dir.join("down"), now.to_string()).unwrap();
    let t0 = Instant::now();
    assert!(ip(&["-n", &ns.b, "link", "set", &format!("rvb{id}"), "down"]), "cannot take the link down");
    let mut outs = Vec::new();
    for (name, child) in [("send", send), ("recv", recv)] {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        outs.push((name, text));
    }
    let took = t0.elapsed();
    let _ = std::fs::remove_dir_all(&dir);
    for (name, text) in &outs {
        println!("--- {name}:\n{text}");
        let result = text.lines().find_map(|l| Some(&l[l.find("RESULT ")?..])).unwrap_or_else(|| panic!("{name} reported nothing:\n{text}"));
        assert!(result.contains("test failed with 6"), "{name} must fail with ncclRemoteError: {result}");
        let ms: i64 = result.rsplit("; ").next().unwrap().split(' ').next().unwrap().parse().unwrap();
        assert!(ms >= 0 && (ms as u128) < BOUND.as_millis(), "{name} took {ms} ms, more than {BOUND:?}");
        assert!(text.contains("is unreachable"), "{name}'s WARN must say the host is unreachable, not that it closed:\n{text}");
        assert!(!text.contains("closed or died"), "{name}: {text}");
    }
    assert!(took < BOUND + Duration::from_secs(5), "{took:?}");
}
