//! Test helpers: the plugin driven in-process through its exported v12 table (as NCCL calls
//! it), and scenarios run in a child process so each gets its own environment and its log lines
//! (stderr) can be checked.
#![allow(dead_code)]

use nccl_net_rivet::abi::types::*;
use nccl_net_rivet::abi::v12::ncclNetPlugin_v12;
use std::ffi::c_void;
use std::process::Command;
use std::time::{Duration, Instant};

pub fn t() -> &'static ncclNet_v12_t {
    &ncclNetPlugin_v12.0
}

pub struct Ctx(pub *mut c_void);

pub fn init() -> Ctx {
    let mut ctx = std::ptr::null_mut();
    let mut cfg = ncclNetCommConfig_t { trafficClass: -1 };
    // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and handles it
    // returned; the buffers are this test's and outlive their requests (the test waits for them or
    // closes the comm first).
    assert_eq!(unsafe { t().init.unwrap()(&mut ctx, 1, &mut cfg, None, None) }, 0);
    Ctx(ctx)
}

pub fn listen(ctx: &Ctx) -> ([u8; 128], *mut c_void) {
    let mut h = [0u8; 128];
    let mut lc = std::ptr::null_mut();
    // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and handles it
    // returned; the buffers are this test's and outlive their requests (the test waits for them or
    // closes the comm first).
    assert_eq!(unsafe { t().listen.unwrap()(ctx.0, 0, h.as_mut_ptr() as *mut c_void, &mut lc) }, 0);
    (h, lc)
}

/// One connect call; (result, comm).
pub fn connect_once(ctx: &Ctx, h: &mut [u8; 128]) -> (i32, *mut c_void) {
    let mut sc = std::ptr::null_mut();
    let mut dc = std::ptr::null_mut();
    // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and handles it
    // returned; the buffers are this test's and outlive their requests (the test waits for them or
    // closes the comm first).
    let r = unsafe { t().connect.unwrap()(ctx.0, 0, h.as_mut_ptr() as *mut c_void, &mut sc, &mut dc) };
    (r, sc)
}

pub fn accept_once(lc: *mut c_void) -> (i32, *mut c_void) {
    let mut rc = std::ptr::null_mut();
    let mut dc = std::ptr::null_mut();
    // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and handles it
    // returned; the buffers are this test's and outlive their requests (the test waits for them or
    // closes the comm first).
    let r = unsafe { t().accept.unwrap()(lc, &mut rc, &mut dc) };
    (r, rc)
}

/// Connect and accept, alternating, until both comms exist (bounded).
pub fn pair(ctx: &Ctx, h: &mut [u8; 128], lc: *mut c_void) -> (*mut c_void, *mut c_void) {
    let (mut sc, mut rc): (*mut c_void, *mut c_void) = (std::ptr::null_mut(), std::ptr::null_mut());
    let deadline = Instant::now() + Duration::from_secs(10);
    while sc.is_null() || rc.is_null() {
        if sc.is_null() {
            let (r, c) = connect_once(ctx, h);
            assert_eq!(r, 0, "connect failed");
            sc = c;
        }
        if rc.is_null() {
            let (r, c) = accept_once(lc);
            assert_eq!(r, 0, "accept failed");
            rc = c;
        }
        assert!(Instant::now() < deadline, "connection setup did not finish");
    }
    (sc, rc)
}

/// Register `len` bytes at `p` on `comm` as NCCL does before using a buffer (the RDMA transport
/// needs the keys). The handle is kept for the life of the test process, like NCCL's buffers.
pub fn reg(comm: *mut c_void, p: *const u8, len: usize) -> *mut c_void {
    let mut mh = std::ptr::null_mut();
    // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and handles it
    // returned; the buffers are this test's and outlive their requests (the test waits for them or
    // closes the comm first).
    let r = unsafe { t().regMr.unwrap()(comm, p as *mut c_void, len, NCCL_PTR_HOST, &mut mh) };
    assert_eq!(r, 0, "regMr failed");
    mh
}

/// One isend attempt after another until a request comes back or `wait` passes (then NULL:
/// the transport is applying back-pressure, e.g. no receive posted yet).
pub fn try_isend(sc: *mut c_void, buf: &[u8], tag: i32, wait: Duration) -> *mut c_void {
    let mh = reg(sc, buf.as_ptr(), buf.len());
    let deadline = Instant::now() + wait;
    loop {
        let mut req = std::ptr::null_mut();
        // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and handles
        // it returned; the buffers are this test's and outlive their requests (the test waits for
        // them or closes the comm first).
        let r = unsafe { t().isend.unwrap()(sc, buf.as_ptr() as *mut c_void, buf.len(), tag, mh, std::ptr::null_mut(), &mut req) };
        assert_eq!(r, 0, "isend failed");
        if !req.is_null() || Instant::now() >= deadline {
            return req;
        }
    }
}

pub fn isend(sc: *mut c_void, buf: &[u8], tag: i32) -> *mut c_void {
    let req = try_isend(sc, buf, tag, Duration::from_secs(10));
    assert!(!req.is_null(), "isend stayed back-pressured for 10 s");
    req
}

pub fn irecv(rc: *mut c_void, buf: &mut [u8], tag: i32) -> *mut c_void {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut req = std::ptr::null_mut();
        let mut data = buf.as_mut_ptr() as *mut c_void;
        let mut size = buf.len();
        let mut tg = tag;
        let mut mh = reg(rc, buf.as_ptr(), buf.len());
        // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and handles
        // it returned; the buffers are this test's and outlive their requests (the test waits for
        // them or closes the comm first).
        let r = unsafe {
            t().irecv.unwrap()(rc, 1, &mut data, &mut size, &mut tg, &mut mh, std::ptr::null_mut(), &mut req)
        };
        assert_eq!(r, 0, "irecv failed");
        if !req.is_null() {
            return req;
        }
        assert!(Instant::now() < deadline);
    }
}

/// Test until done: Ok(size) or Err(ncclResult_t).
pub fn wait(reqs: &[*mut c_void]) -> Result<Vec<i32>, i32> {
    let mut sizes = vec![-1; reqs.len()];
    let deadline = Instant::now() + Duration::from_secs(30);
    while sizes.iter().any(|&s| s < 0) {
        for (i, r) in reqs.iter().enumerate() {
            if sizes[i] >= 0 {
                continue;
            }
            let (mut done, mut sz) = (0, 0);
            // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and
            // handles it returned; the buffers are this test's and outlive their requests (the test
            // waits for them or closes the comm first).
            let res = unsafe { t().test.unwrap()(*r, &mut done, &mut sz) };
            if res != 0 {
                return Err(res);
            }
            if done != 0 {
                sizes[i] = sz;
            }
        }
        assert!(Instant::now() < deadline, "requests did not complete");
    }
    Ok(sizes)
}

/// Send `n` bytes over (sc, rc) and check they arrive intact.
pub fn roundtrip(sc: *mut c_void, rc: *mut c_void, n: usize) {
    let src: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
    let mut dst = vec![0u8; n];
    let r = irecv(rc, &mut dst, 1);
    let s = isend(sc, &src, 1);
    assert_eq!(wait(&[s, r]).unwrap(), vec![n as i32, n as i32]);
    assert!(src == dst, "payload corrupted");
}

/// A whole connection's life: init, listen, connect/accept, one `n`-byte round trip, close.
pub fn one_transfer(n: usize) {
    let ctx = init();
    let (mut h, lc) = listen(&ctx);
    let (sc, rc) = pair(&ctx, &mut h, lc);
    roundtrip(sc, rc, n);
    close(sc, rc, lc);
}

pub fn close(sc: *mut c_void, rc: *mut c_void, lc: *mut c_void) {
    // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and handles it
    // returned; the buffers are this test's and outlive their requests (the test waits for them or
    // closes the comm first).
    unsafe {
        assert_eq!(t().closeSend.unwrap()(sc), 0);
        assert_eq!(t().closeRecv.unwrap()(rc), 0);
        assert_eq!(t().closeListen.unwrap()(lc), 0);
    }
}

pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Run the test named `name` again in a child process with `env`, and return (success, stderr).
/// Inside the child (`RIVET_TEST_CHILD` = name) it returns None and the caller runs the scenario.
pub fn in_child(name: &str, env: &[(&str, &str)]) -> Option<(bool, String)> {
    in_child_via(&[], name, env)
}

/// As [`in_child`], with the child started through `wrapper` (e.g. `unshare --mount sh -c ...`,
/// which receives the test executable and its arguments as "$0" "$@").
pub fn in_child_via(wrapper: &[&str], name: &str, env: &[(&str, &str)]) -> Option<(bool, String)> {
    if std::env::var("RIVET_TEST_CHILD").as_deref() == Ok(name) {
        return None;
    }
    let exe = std::env::current_exe().unwrap();
    let mut c = match wrapper.split_first() {
        Some((w, rest)) => {
            let mut c = Command::new(w);
            c.args(rest).arg(&exe);
            c
        }
        None => Command::new(exe),
    };
    // --include-ignored: a test marked ignored on this host still runs its child when asked.
    c.args([name, "--exact", "--include-ignored", "--nocapture", "--test-threads=1"]);
    c.env("RIVET_TEST_CHILD", name).env("NCCL_SOCKET_IFNAME", "lo");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    Some((out.status.success(), err))
}

/// A test that cannot run on this host says so and returns: `SKIP name: why` on the process's
/// stdout itself (not through the test harness's capture, so ci/test.sh counts it as skipped,
/// never as passed). Under CI=true it fails instead: CI installs what these tests need, so a skip
/// there means a part that should have run did not.
#[allow(dead_code)] // not every test binary that includes this module skips
pub fn skip(name: &str, why: &str) {
    assert!(std::env::var("CI").as_deref() != Ok("true"), "SKIP {name} under CI=true: {why}");
    use std::io::Write;
    let _ = std::io::stdout().lock().write_all(format!("SKIP {name}: {why}\n").as_bytes());
}

/// The built cdylib: target/<profile>/libnccl_net_rivet.so where cargo built it as a target of
/// its own (`cargo build`), else the copy in deps/, which is all `cargo test` alone leaves (the
/// lib built only for the tests and the CLI is not copied up).
pub fn cdylib() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_BIN_EXE_rivet")).parent().unwrap().to_path_buf();
    let top = dir.join("libnccl_net_rivet.so");
    if top.exists() {
        return top;
    }
    let deps = dir.join("deps/libnccl_net_rivet.so");
    assert!(deps.exists(), "the cdylib is not built: neither {} nor {}", top.display(), deps.display());
    deps
}
