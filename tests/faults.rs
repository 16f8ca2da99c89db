//! Bad input and faults at the plugin boundary, each in its own child process (fresh config,
//! stderr captured): foreign clients and garbage on a listen socket, wrong handles, truncated and
//! silent handshakes, closing with requests in flight, invalid configuration, the INFO banner.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;
use common::*;
use nccl_net_rivet::proto::Handle;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn listen_addr(h: &[u8; 128]) -> std::net::SocketAddr {
    Handle::decode(h).unwrap().addr
}

/// Drive accept until the foreign socket is closed by the listener (read returns 0 or reset).
fn until_closed(lc: *mut std::ffi::c_void, s: &mut TcpStream) {
    s.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut b = [0u8; 64];
    loop {
        let (r, c) = accept_once(lc);
        assert_eq!(r, 0, "accept must keep working while rejecting a foreign client");
        assert!(c.is_null(), "a foreign client must never become a comm");
        match s.read(&mut b) {
            Ok(0) => return,
            Ok(_) => {} // a NACK for a wrong magic; keep reading until the close
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
        assert!(Instant::now() < deadline, "listener never closed the foreign connection");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn garbage_from_a_foreign_client_is_rejected_and_the_real_peer_still_connects() {
    let Some((ok, err)) = in_child("garbage_from_a_foreign_client_is_rejected_and_the_real_peer_still_connects", &[]) else {
        let ctx = init();
        let (mut h, lc) = listen(&ctx);
        let mut s = TcpStream::connect(listen_addr(&h)).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: rivet\r\n\r\nAAAAAAAAAAAAAAAAAAAAAAAA").unwrap();
        until_closed(lc, &mut s);
        let (sc, rc) = pair(&ctx, &mut h, lc);
        roundtrip(sc, rc, 100_000);
        close(sc, rc, lc);
        return;
    };
    assert!(ok, "child failed:\n{err}");
    assert!(err.contains("rejected a connection from 127.0.0.1"), "{err}");
    assert!(err.contains("not a rivet client"), "{err}");
}

#[test]
fn a_handle_with_a_wrong_magic_is_rejected_and_the_real_peer_still_connects() {
    let Some((ok, err)) = in_child("a_handle_with_a_wrong_magic_is_rejected_and_the_real_peer_still_connects", &[]) else {
        let ctx = init();
        let (mut h, lc) = listen(&ctx);
        // Same address, another listen call's magic.
        let mut bad = h;
        bad[8] ^= 0x5a;
        let deadline = Instant::now() + Duration::from_secs(10);
        let code = loop {
            let (r, c) = connect_once(&ctx, &mut bad);
            if r != 0 {
                break r;
            }
            assert!(c.is_null(), "a wrong-magic connect must never succeed");
            let (r, c) = accept_once(lc);
            assert_eq!(r, 0);
            assert!(c.is_null());
            assert!(Instant::now() < deadline, "wrong-magic connect neither failed nor finished");
        };
        assert_eq!(code, 5, "wrong magic is a usage error (ncclInvalidUsage)");
        // A handle that is not rivet's at all fails at once.
        let mut foreign = [0x42u8; 128];
        assert_eq!(connect_once(&ctx, &mut foreign).0, 5);
        let (sc, rc) = pair(&ctx, &mut h, lc);
        roundtrip(sc, rc, 4096);
        close(sc, rc, lc);
        return;
    };
    assert!(ok, "child failed:\n{err}");
    assert!(err.contains("is not this listen comm's"), "{err}");
    assert!(err.contains("rejected our handle"), "{err}");
    assert!(err.contains("not a rivet handle"), "{err}");
}

#[test]
fn a_truncated_handshake_is_rejected() {
    let Some((ok, err)) = in_child("a_truncated_handshake_is_rejected", &[]) else {
        let ctx = init();
        let (mut h, lc) = listen(&ctx);
        let mut s = TcpStream::connect(listen_addr(&h)).unwrap();
        s.write_all(&h[..10]).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        until_closed(lc, &mut s);
        let (sc, rc) = pair(&ctx, &mut h, lc);
        roundtrip(sc, rc, 1);
        close(sc, rc, lc);
        return;
    };
    assert!(ok, "child failed:\n{err}");
    assert!(err.contains("truncated handshake: the client closed after 10 of 32 bytes"), "{err}");
}

#[test]
fn a_silent_client_is_dropped_after_the_timeout_without_blocking_accept() {
    let Some((ok, err)) =
        in_child("a_silent_client_is_dropped_after_the_timeout_without_blocking_accept", &[("RIVET_TIMEOUT", "1")])
    else {
        let ctx = init();
        let (mut h, lc) = listen(&ctx);
        let mut s = TcpStream::connect(listen_addr(&h)).unwrap();
        // The real peer connects while the silent one holds its socket open.
        let (sc, rc) = pair(&ctx, &mut h, lc);
        roundtrip(sc, rc, 10);
        let t0 = Instant::now();
        until_closed(lc, &mut s);
        assert!(t0.elapsed() < Duration::from_secs(5));
        close(sc, rc, lc);
        return;
    };
    assert!(ok, "child failed:\n{err}");
    assert!(err.contains("no complete handshake within RIVET_TIMEOUT=1s"), "{err}");
}

#[test]
fn closing_with_requests_in_flight_releases_every_descriptor() {
    let Some((ok, err)) = in_child("closing_with_requests_in_flight_releases_every_descriptor", &[("RIVET_SOCKET_NSTREAMS", "4")])
    else {
        let ctx = init();
        let before = open_fds();
        for _ in 0..3 {
            let (mut h, lc) = listen(&ctx);
            let (sc, rc) = pair(&ctx, &mut h, lc);
            // 8 x 8 MiB sends cannot all fit in socket buffers; 2 receives take part of them.
            // (Over RDMA only the 2 sends with a posted receive are accepted; the rest stay
            // back-pressured, which is fine: whatever is in flight must be released by close.)
            let src = vec![7u8; 8 << 20];
            let mut dst = vec![0u8; 8 << 20];
            let mut dst2 = vec![0u8; 8 << 20];
            let _r = irecv(rc, &mut dst, 0);
            let _r2 = irecv(rc, &mut dst2, 0);
            let sends: Vec<_> = (0..8).map(|_| try_isend(sc, &src, 0, Duration::from_millis(100))).collect();
            assert!(!sends[0].is_null(), "the first send has a posted receive");
            close(sc, rc, lc);
        }
        assert_eq!(open_fds(), before, "file descriptors leaked by close with requests in flight");
        return;
    };
    assert!(ok, "child failed:\n{err}");
}

#[test]
fn a_send_larger_than_its_receive_is_a_collective_mismatch() {
    let Some((ok, err)) = in_child("a_send_larger_than_its_receive_is_a_collective_mismatch", &[]) else {
        let ctx = init();
        let (mut h, lc) = listen(&ctx);
        let (sc, rc) = pair(&ctx, &mut h, lc);
        let src = vec![1u8; 65536];
        let mut dst = vec![0u8; 4096];
        let r = irecv(rc, &mut dst, 77);
        let _s = isend(sc, &src, 77);
        assert_eq!(wait(&[r]), Err(5), "ncclInvalidUsage expected");
        // The comm stays failed: later calls fail fast instead of hanging.
        assert_eq!(wait(&[r]), Err(5));
        close(sc, rc, lc);
        return;
    };
    assert!(ok, "child failed:\n{err}");
    assert!(err.contains("collective mismatch"), "{err}");
    assert!(err.contains("sent 65536 bytes with tag 77 but the posted receive holds only 4096 bytes"), "{err}");
}

#[test]
fn an_invalid_setting_warns_with_what_it_accepts() {
    let Some((ok, err)) = in_child(
        "an_invalid_setting_warns_with_what_it_accepts",
        &[("RIVET_SOCKET_NSTREAMS", "lots"), ("RIVET_TIMEOUT", "0")],
    ) else {
        one_transfer(1 << 20);
        return;
    };
    assert!(ok, "child failed:\n{err}");
    assert!(err.contains("RIVET_SOCKET_NSTREAMS=lots is invalid: it accepts an integer from 1 to 16; using the default 2"), "{err}");
    assert!(err.contains("RIVET_TIMEOUT=0 is invalid: it accepts an integer from 1 to 3600"), "{err}");
}

/// NCCL may call connect a few times against a peer that never answers and then never again:
/// after RIVET_TIMEOUT without a call, the connector's sockets are closed with a WARN (at the next
/// connect, accept or listen), and a later call with that handle gets an error, not a crash.
#[test]
fn an_abandoned_connect_is_reaped() {
    let Some((ok, err)) = in_child("an_abandoned_connect_is_reaped", &[("RIVET_TIMEOUT", "1")]) else {
        let ctx = init();
        // A listen comm that never accepts: the connector's hello is never answered.
        let (h, lc) = listen(&ctx);
        let fds0 = open_fds();
        let mut h1 = h;
        for _ in 0..3 {
            let (r, c) = connect_once(&ctx, &mut h1);
            assert_eq!(r, 0);
            assert!(c.is_null(), "no accept, so no connection");
        }
        assert!(open_fds() > fds0, "the connector holds its sockets");
        std::thread::sleep(Duration::from_millis(2500));
        // Any later listen (or connect, or accept) reaps it.
        let (_h2, lc2) = listen(&ctx);
        assert_eq!(open_fds(), fds0 + 1, "only the new listen socket is left");
        let (r, c) = connect_once(&ctx, &mut h1);
        assert_ne!(r, 0, "a call with the abandoned handle fails");
        assert!(c.is_null());
        // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and handles
        // it returned; the buffers are this test's and outlive their requests (the test waits for
        // them or closes the comm first).
        unsafe {
            assert_eq!(t().closeListen.unwrap()(lc), 0);
            assert_eq!(t().closeListen.unwrap()(lc2), 0);
        }
        return;
    };
    assert!(ok, "child failed:\n{err}");
    assert!(err.contains("abandoned: NCCL has not called connect for it for") && err.contains("RIVET_TIMEOUT=1s"), "{err}");
    assert!(err.contains("this connect was abandoned (no call for more than RIVET_TIMEOUT) and its state released"), "{err}");
}

/// A flood of foreign clients gets a few WARNs and then a count, not a line each; partial
/// connections from a client that knows the magic (some of its streams never come) are capped
/// like half-open ones; the real peer still connects.
#[test]
fn a_flood_of_rejected_clients_is_rate_limited_and_partial_connections_are_capped() {
    const NAME: &str = "a_flood_of_rejected_clients_is_rate_limited_and_partial_connections_are_capped";
    let Some((ok, err)) = in_child(NAME, &[]) else {
        use nccl_net_rivet::proto::Hello;
        let ctx = init();
        let (mut h, lc) = listen(&ctx);
        let addr = listen_addr(&h);
        let magic = Handle::decode(&h).unwrap().magic;
        let drive = |n: usize| {
            for _ in 0..n {
                let (r, c) = accept_once(lc);
                assert_eq!(r, 0);
                assert!(c.is_null());
            }
        };
        // 300 clients that speak garbage.
        for _ in 0..300 {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(&[0x47; 32]).unwrap();
            drive(2);
        }
        drive(50);
        // 300 partial connections: stream 0 of 2, the right magic, never stream 1.
        let fds0 = open_fds();
        let mut keep = Vec::new();
        for i in 0..300u64 {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(&Hello { listen_magic: magic, conn_id: 1000 + i, stream: 0, nstreams: 2, min_chunk: 131072 }.encode()).unwrap();
            keep.push(s);
            drive(2);
        }
        drive(50);
        let held = open_fds() - fds0 - keep.len();
        assert!(held <= 256 + 8, "the listen comm holds {held} partial connections' sockets");
        let (sc, rc) = pair(&ctx, &mut h, lc);
        roundtrip(sc, rc, 1 << 16);
        close(sc, rc, lc);
        return;
    };
    assert!(ok, "child failed:\n{err}");
    let one_by_one = err.matches("rejected a connection from").count();
    assert_eq!(one_by_one, 8, "the first 8 rejections are WARNed one by one, the rest counted:\n{err}");
    assert!(err.contains("further rejections on this socket are counted and reported once per 10 s"), "{err}");
    assert!(err.contains("more connection(s) in the last") && err.contains("too many partial connections (1 of 2 streams arrived)"), "the count, with the last reason, when the listen comm closes:\n{err}");
    assert!(err.lines().count() < 40, "{} lines:\n{err}", err.lines().count());
}

/// A value that is not valid UTF-8 is invalid like any other (a WARN, the default), never taken
/// as unset without a word: with NCCL_SOCKET_IFNAME that would silently drop the filter.
#[test]
fn a_setting_that_is_not_utf8_warns() {
    use std::os::unix::ffi::OsStrExt;
    const NAME: &str = "a_setting_that_is_not_utf8_warns";
    if std::env::var("RIVET_TEST_CHILD").as_deref() == Ok(NAME) {
        one_transfer(1 << 16);
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env("RIVET_TEST_CHILD", NAME)
        .env("NCCL_SOCKET_IFNAME", std::ffi::OsStr::from_bytes(b"eth\xff0"))
        .env("RIVET_SOCKET_NSTREAMS", std::ffi::OsStr::from_bytes(b"\xc3\x28"))
        .env_remove("NCCL_DEBUG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("NCCL_SOCKET_IFNAME=eth\u{fffd}0 is invalid: it accepts valid UTF-8 only; using the default all but lo, docker*"), "{err}");
    assert!(err.contains("RIVET_SOCKET_NSTREAMS=\u{fffd}( is invalid: it accepts valid UTF-8 only; using the default 2"), "{err}");
}

#[test]
fn init_logs_version_library_abi_devices_and_transport_at_info() {
    let Some((ok, err)) = in_child("init_logs_version_library_abi_devices_and_transport_at_info", &[("NCCL_DEBUG", "INFO")])
    else {
        let _ctx = init();
        let _ctx2 = init(); // idempotent: a second communicator's init succeeds, banner not repeated
        return;
    };
    assert!(ok, "child failed:\n{err}");
    let banner = format!("rivet {} loaded from", env!("CARGO_PKG_VERSION"));
    assert_eq!(err.matches(&banner).count(), 1, "{err}");
    assert!(err.contains("ncclNet v12 ABI"), "{err}");
    assert!(err.contains("device 0: lo 127.0.0.1"), "{err}");
    assert!(err.contains("transport TCP"), "{err}");
}

#[test]
fn no_matching_interface_fails_init_with_advice() {
    let Some((ok, err)) = in_child("no_matching_interface_fails_init_with_advice", &[("NCCL_SOCKET_IFNAME", "=nosuchif0")])
    else {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and handles
        // it returned; the buffers are this test's and outlive their requests (the test waits for
        // them or closes the comm first).
        let r = unsafe { t().init.unwrap()(&mut ctx, 1, std::ptr::null_mut(), None, None) };
        assert_eq!(r, 2, "ncclSystemError");
        return;
    };
    assert!(ok, "child failed:\n{err}");
    assert!(err.contains("no usable network interface matches NCCL_SOCKET_IFNAME==nosuchif0"), "{err}");
}

#[test]
fn without_libibverbs_the_plugin_runs_over_tcp_and_says_why() {
    let name = "without_libibverbs_the_plugin_runs_over_tcp_and_says_why";
    let Some((ok, err)) = in_child(name, &[("NCCL_DEBUG", "INFO"), ("RIVET_IBVERBS_LIB", "libibverbs-absent.so.1")]) else {
        one_transfer(1 << 20);
        return;
    };
    assert!(ok, "child failed:\n{err}");
    assert!(err.contains("transport TCP (RDMA not used: cannot load libibverbs-absent.so.1"), "{err}");
    assert!(err.contains("RIVET_IBVERBS_LIB"), "the reason must say how to fix it: {err}");
}

/// The real thing: libibverbs.so.1 made unloadable for one process with a private mount
/// namespace (needs root and util-linux's unshare; skipped, with a note, where either or
/// libibverbs itself is absent, e.g. a CI machine without rdma-core: the test above covers that).
#[test]
#[cfg_attr(not(all(rivet_root, rivet_libibverbs)), ignore = "needs root and an installed libibverbs")]
fn libibverbs_hidden_in_a_mount_namespace_falls_back_to_tcp() {
    let name = "libibverbs_hidden_in_a_mount_namespace_falls_back_to_tcp";
    let lib = ["/usr/lib/x86_64-linux-gnu/libibverbs.so.1", "/usr/lib64/libibverbs.so.1", "/usr/lib/libibverbs.so.1"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let unshare = std::process::Command::new("unshare").arg("--version").output().is_ok_and(|o| o.status.success());
    if std::env::var("RIVET_TEST_CHILD").as_deref() != Ok(name) && !(root && unshare && lib.is_some()) {
        skip(name, &format!("needs root, unshare and an installed libibverbs (root {root}, unshare {unshare}, lib {lib:?})"));
        return;
    }
    let script = format!("mount --bind /dev/null {} && exec \"$0\" \"$@\"", lib.unwrap_or(""));
    let wrapper = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script.as_str()];
    let Some((ok, err)) = in_child_via(&wrapper, name, &[("NCCL_DEBUG", "INFO")]) else {
        one_transfer(1 << 20);
        return;
    };
    assert!(ok, "child failed:\n{err}");
    assert!(err.contains("transport TCP (RDMA not used: cannot load libibverbs.so.1"), "{err}");
}

/// Handles of closed objects, and values no rivet call returned, are errors (ncclInternalError)
/// found without reading through them: a request tested after its comm was closed, a closed comm,
/// a released memory handle, a closed listen comm, a heap pointer of the test's own.
#[test]
fn stale_and_foreign_handles_are_errors() {
    use std::ffi::c_void;
    let ctx = init();
    let (mut h, lc) = listen(&ctx);
    let (sc, rc) = pair(&ctx, &mut h, lc);
    let mut dst = vec![0u8; 4096];
    let r = irecv(rc, &mut dst, 1);
    let src = vec![3u8; 4096];
    let mh = reg(sc, src.as_ptr(), src.len());
    let heap = [0u64; 8];
    let foreign = heap.as_ptr() as *mut c_void;
    let null = std::ptr::null_mut();
    // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and handles it
    // returned; the buffers are this test's and outlive their requests (the test waits for them or
    // closes the comm first).
    unsafe {
        // A send with the handle while it is live (the comm keeps its registration at hand).
        let mut sent = null;
        let data = src.as_ptr() as *mut c_void;
        assert_eq!(t().isend.unwrap()(sc, data, 4096, 1, mh, null, &mut sent), 0, "a send with a live memory handle");
        assert!(!sent.is_null());
        assert_eq!(t().closeRecv.unwrap()(rc), 0);
        let (mut done, mut sz) = (7, 0);
        assert_eq!(t().test.unwrap()(r, &mut done, &mut sz), 3, "test on a request of a closed comm");
        assert_eq!(done, 0);
        assert_eq!(t().closeRecv.unwrap()(rc), 3, "a comm closed twice");
        assert_eq!(t().deregMr.unwrap()(sc, mh), 0);
        assert_eq!(t().deregMr.unwrap()(sc, mh), 3, "a memory handle released twice");
        let mut req = null;
        assert_eq!(t().isend.unwrap()(sc, data, 4096, 1, mh, null, &mut req), 3, "a send with a released memory handle");
        assert!(req.is_null());
        // A new registration may take the released one's slot: the old handle still names nothing.
        let mh2 = reg(sc, src.as_ptr(), src.len());
        assert_eq!(t().isend.unwrap()(sc, data, 4096, 1, mh, null, &mut req), 3, "a released memory handle after its slot was reused");
        assert!(req.is_null());
        assert_eq!(t().deregMr.unwrap()(sc, mh2), 0);
        assert_eq!(t().closeSend.unwrap()(sc), 0);
        assert_eq!(t().isend.unwrap()(sc, data, 4096, 1, null, null, &mut req), 3, "a send on a closed comm");
        assert_eq!(t().closeListen.unwrap()(lc), 0);
        assert_eq!(t().closeListen.unwrap()(lc), 3, "a listen comm closed twice");
        assert_eq!(t().test.unwrap()(foreign, &mut done, &mut sz), 3, "a foreign request");
        assert_eq!(t().closeSend.unwrap()(foreign), 3, "a foreign comm");
        assert_eq!(t().deregMr.unwrap()(null, foreign), 3, "a foreign memory handle");
        // A new comm may reuse a closed one's slot: the old handles still name nothing.
        let (mut h2, lc2) = listen(&ctx);
        let (sc2, rc2) = pair(&ctx, &mut h2, lc2);
        assert_eq!(t().test.unwrap()(r, &mut done, &mut sz), 3, "a stale request after its slot was reused");
        assert_eq!(t().closeSend.unwrap()(sc), 3, "a stale comm after its slot was reused");
        close(sc2, rc2, lc2);
    }
}
