//! The TCP data path allocates nothing per message: a counting allocator watches this thread
//! while it posts, progresses and completes messages through the exported v12 table.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;
use common::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::c_void;

struct Counting;
thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is passed on to the System allocator unchanged; counting touches only
// thread-local cells, which allocate nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if ON.with(|o| o.get()) {
            COUNT.with(|c| c.set(c.get() + 1));
        }
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if ON.with(|o| o.get()) {
            COUNT.with(|c| c.set(c.get() + 1));
        }
        System.realloc(p, l, n)
    }
}

#[global_allocator]
static A: Counting = Counting;

/// One message each way through the plugin, using only stack storage.
fn exchange(sc: *mut c_void, rc: *mut c_void, src: &[u8], dst: &mut [u8]) {
    let t = t();
    let (mut sreq, mut rreq): (*mut c_void, *mut c_void) = (std::ptr::null_mut(), std::ptr::null_mut());
    let mut data = dst.as_mut_ptr() as *mut c_void;
    let mut size = dst.len();
    let mut tag = 3;
    let mut mh = std::ptr::null_mut();
    while rreq.is_null() {
        // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and handles
        // it returned; the buffers are this test's and outlive their requests (the test waits for
        // them or closes the comm first).
        assert_eq!(unsafe { t.irecv.unwrap()(rc, 1, &mut data, &mut size, &mut tag, &mut mh, std::ptr::null_mut(), &mut rreq) }, 0);
    }
    while sreq.is_null() {
        let p = src.as_ptr() as *mut c_void;
        // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and handles
        // it returned; the buffers are this test's and outlive their requests (the test waits for
        // them or closes the comm first).
        assert_eq!(unsafe { t.isend.unwrap()(sc, p, src.len(), 3, mh, std::ptr::null_mut(), &mut sreq) }, 0);
    }
    let (mut sd, mut rd, mut sz) = (0, 0, 0);
    for _ in 0..100_000_000u64 {
        if sd == 0 {
            // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and
            // handles it returned; the buffers are this test's and outlive their requests (the test
            // waits for them or closes the comm first).
            assert_eq!(unsafe { t.test.unwrap()(sreq, &mut sd, &mut sz) }, 0);
        }
        if rd == 0 {
            // SAFETY: rivet's v12 table, called as NCCL calls it, with live out-parameters and
            // handles it returned; the buffers are this test's and outlive their requests (the test
            // waits for them or closes the comm first).
            assert_eq!(unsafe { t.test.unwrap()(rreq, &mut rd, &mut sz) }, 0);
        }
        if sd != 0 && rd != 0 {
            assert_eq!(sz as usize, src.len());
            return;
        }
    }
    panic!("transfer did not complete");
}

#[test]
fn posting_and_completing_messages_allocates_nothing() {
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    std::env::set_var("RIVET_SOCKET_NSTREAMS", "4");
    let ctx = init();
    let (mut h, lc) = listen(&ctx);
    let (sc, rc) = pair(&ctx, &mut h, lc);
    let src: Vec<u8> = (0..(4 << 20)).map(|i| i as u8).collect();
    let mut dst = vec![0u8; 4 << 20];
    for &n in &[0usize, 8, 4096, 1 << 20, 4 << 20] {
        exchange(sc, rc, &src[..n], &mut dst[..n]); // warm-up
    }
    ON.with(|o| o.set(true));
    for _ in 0..20 {
        for &n in &[0usize, 8, 4096, 1 << 20, 4 << 20] {
            exchange(sc, rc, &src[..n], &mut dst[..n]);
        }
    }
    ON.with(|o| o.set(false));
    assert_eq!(COUNT.with(|c| c.get()), 0, "the data path allocated");
    assert!(src == dst);
    close(sc, rc, lc);
}
