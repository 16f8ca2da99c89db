//! The staging engine with registrations that cross comms: regIsGlobal = 1 lets NCCL register a
//! buffer through one comm and use the handle on another of the same device, so a comm must
//! set up its copier on the first staged buffer it meets, not only on regMr. Runs with
//! RIVET_STAGE_HOST=1 (the host copier) over TCP; one test per process, so the environment is
//! set before the plugin reads it.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;
use common::*;
use nccl_net_rivet::abi::types::NCCL_PTR_HOST;
use std::ffi::c_void;

#[test]
fn a_handle_registered_through_another_comm() {
    std::env::set_var("RIVET_STAGE_HOST", "1");
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    std::env::set_var("RIVET_TIMEOUT", "5");
    let ctx = init();
    let (mut h, lc) = listen(&ctx);
    let (sc, rc) = pair(&ctx, &mut h, lc);
    let n = 3 << 20; // above the chunk size: the send is copied in chunks
    let src: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
    let mut dst = vec![0u8; n];
    // The send buffer is registered through the receive comm, the receive buffer through the
    // send comm; neither comm has registered anything itself.
    let (mut smh, mut rmh) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and handles it
    // returned; the buffers are this test's and outlive their requests (the test waits for them or
    // closes the comm first).
    unsafe {
        assert_eq!(t().regMr.unwrap()(rc, src.as_ptr() as *mut c_void, n, NCCL_PTR_HOST, &mut smh), 0);
        assert_eq!(t().regMr.unwrap()(sc, dst.as_mut_ptr() as *mut c_void, n, NCCL_PTR_HOST, &mut rmh), 0);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut rreq: *mut c_void = std::ptr::null_mut();
    let (mut data, mut size, mut tag) = (dst.as_mut_ptr() as *mut c_void, n, 5);
    while rreq.is_null() {
        // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and handles
        // it returned; the buffers are this test's and outlive their requests (the test waits for
        // them or closes the comm first).
        assert_eq!(unsafe { t().irecv.unwrap()(rc, 1, &mut data, &mut size, &mut tag, &mut rmh, std::ptr::null_mut(), &mut rreq) }, 0);
        assert!(std::time::Instant::now() < deadline);
    }
    let mut sreq: *mut c_void = std::ptr::null_mut();
    while sreq.is_null() {
        // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and handles
        // it returned; the buffers are this test's and outlive their requests (the test waits for
        // them or closes the comm first).
        assert_eq!(unsafe { t().isend.unwrap()(sc, src.as_ptr() as *mut c_void, n, 5, smh, std::ptr::null_mut(), &mut sreq) }, 0);
        assert!(std::time::Instant::now() < deadline);
    }
    assert_eq!(wait(&[sreq, rreq]).expect("transfer failed"), vec![n as i32, n as i32]);
    assert!(src == dst, "data differs after staging");
    // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and handles it
    // returned; the buffers are this test's and outlive their requests (the test waits for them or
    // closes the comm first).
    unsafe {
        assert_eq!(t().deregMr.unwrap()(rc, smh), 0);
        assert_eq!(t().deregMr.unwrap()(sc, rmh), 0);
        assert_eq!(t().closeSend.unwrap()(sc), 0);
        assert_eq!(t().closeRecv.unwrap()(rc), 0);
        assert_eq!(t().closeListen.unwrap()(lc), 0);
    }
}

/// A ping-pong through the staging engine: each rank posts its send, then waits on its receive
/// only. The staged send must move on from the receive comm's calls (before the fix it waited
/// for a test on the send request, and both ranks timed out).
#[test]
fn a_send_moves_while_the_caller_waits_on_a_receive() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rivet"))
        .args(["perf", "--check", "--sizes", "64K,1M", "--bytes", "8M", "--lat-iters", "50"])
        .env("RIVET_STAGE_HOST", "1")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("RIVET_TIMEOUT", "5")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("# latency (8 B ping-pong, one way): typical"), "{text}");
    assert_eq!(text.matches(": 0 wrong byte(s) in ").count(), 2, "every byte through the staging engine as sent:\n{text}");
}
