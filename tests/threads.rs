//! NCCL's threads at once: NCCL's proxy progress thread calls isend, irecv and test on many
//! comms while its service thread connects, accepts, registers and deregisters buffers (also on
//! the comms the progress thread is using), and the main thread closes the comms it is done with.
//! Here three threads do exactly that, in one process, for RIVET_THREADS_SECS seconds (default
//! 15; ci/test.sh runs it for 2 minutes over TCP, the VM for a minute over verbs), plain and with
//! every buffer through the staging engine: pairs of comms come and go, each carries a few
//! hundred messages of random sizes with up to four in flight each way, every received byte is
//! checked against its message's pattern, scratch buffers are registered and deregistered on
//! live comms meanwhile, and at the end every comm is closed and the process's descriptors are
//! back where they were. A call that fails, a byte that is wrong, or 30 s without progress fails
//! the test (nothing waits unbounded).
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;
use common::*;
use nccl_net_rivet::abi::types::NCCL_PTR_HOST;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Messages in flight per direction of a pair, and the largest message.
const SLOTS: usize = 4;
const MAX: usize = 256 << 10;
/// Live pairs at a time.
const LIVE: usize = 6;

/// A handle as the threads pass it (the plugin's handles are plain values; NCCL passes them
/// between its threads too).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct H(usize);
impl H {
    fn p(self) -> *mut c_void {
        self.0 as *mut c_void
    }
}

struct Pair {
    id: u64,
    sc: H,
    rc: H,
    smh: H,
    rmh: H,
    sbuf: Vec<u8>,
    rbuf: Vec<u8>,
    msgs: u64,
}

fn rnd(x: u64) -> u64 {
    // splitmix64: a message's size and bytes from (pair, sequence) alone.
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn size_of(id: u64, seq: u64) -> usize {
    let r = rnd(id << 32 | seq);
    match r % 8 {
        0 => 0,
        1 => 8,
        2 | 3 => (r >> 8) as usize % 8192,
        4 => MAX,
        _ => (r >> 8) as usize % (MAX + 1),
    }
}

fn byte(id: u64, seq: u64, i: usize) -> u8 {
    (rnd(id.wrapping_mul(1_000_003) ^ seq) as usize).wrapping_add(i.wrapping_mul(31)) as u8
}

fn check(what: &str, r: i32) {
    assert_eq!(r, 0, "{what} returned {r} (see the plugin's WARN above)");
}

fn reg(comm: H, p: *const u8, len: usize) -> H {
    let mut mh = std::ptr::null_mut();
    // SAFETY: rivet's v12 table, as NCCL's service thread calls it: a live comm, a buffer this
    // test owns and keeps until it deregisters the handle.
    check("regMr", unsafe { t().regMr.unwrap()(comm.p(), p as *mut c_void, len, NCCL_PTR_HOST, &mut mh) });
    H(mh as usize)
}

fn dereg(comm: H, mh: H) {
    // SAFETY: rivet's v12 table: a handle regMr returned on this live comm, deregistered once.
    check("deregMr", unsafe { t().deregMr.unwrap()(comm.p(), mh.p()) });
}

/// The service thread's connection: listen, then connect and accept in turn until both comms
/// exist (each call returns at once, as NCCL's non-blocking connect and accept do), then the
/// listening comm is closed, as NCCL closes it.
fn connect(ctx: &Ctx) -> (H, H) {
    let (mut h, lc) = listen(ctx);
    let (mut sc, mut rc): (*mut c_void, *mut c_void) = (std::ptr::null_mut(), std::ptr::null_mut());
    let deadline = Instant::now() + Duration::from_secs(20);
    while sc.is_null() || rc.is_null() {
        if sc.is_null() {
            let (r, c) = connect_once(ctx, &mut h);
            check("connect", r);
            sc = c;
        }
        if rc.is_null() {
            let (r, c) = accept_once(lc);
            check("accept", r);
            rc = c;
        }
        assert!(Instant::now() < deadline, "a connection took more than 20 s to set up");
    }
    // SAFETY: rivet's v12 table: the listening comm listen returned, closed once.
    check("closeListen", unsafe { t().closeListen.unwrap()(lc) });
    (H(sc as usize), H(rc as usize))
}

/// What the progress thread keeps per live pair.
struct Flow {
    p: Pair,
    sends: [Option<(H, u64)>; SLOTS],
    recvs: [Option<(H, u64)>; SLOTS],
    s_next: u64,
    r_next: u64,
    done: u64,
    sent: u64,
}

/// 1 once `req` is done (its size in `size`), 0 while not.
fn test(req: H, size: &mut i32) -> bool {
    let mut done = 0;
    // SAFETY: rivet's v12 table, as NCCL's progress thread calls it: a request this thread got
    // from isend/irecv and has not seen done yet.
    check("test", unsafe { t().test.unwrap()(req.p(), &mut done, size) });
    done != 0
}

impl Flow {
    /// One pass, as NCCL's progress loop makes one: post what may be posted, test what is in
    /// flight. Whether anything moved.
    fn step(&mut self, bytes: &AtomicU64) -> bool {
        let mut moved = false;
        let p = &mut self.p;
        // Receives first, in sequence order, into free slots.
        while self.r_next < p.msgs && self.recvs[(self.r_next % SLOTS as u64) as usize].is_none() {
            let slot = (self.r_next % SLOTS as u64) as usize;
            let mut req = std::ptr::null_mut();
            let mut data = p.rbuf[slot * MAX..].as_mut_ptr() as *mut c_void;
            let (mut size, mut tag, mut mh) = (MAX, 7, p.rmh.p());
            // SAFETY: rivet's v12 table: a live receive comm, a slot of this pair's registered
            // buffer (MAX bytes, not in use by another request), live out-parameters.
            check("irecv", unsafe { t().irecv.unwrap()(p.rc.p(), 1, &mut data, &mut size, &mut tag, &mut mh, std::ptr::null_mut(), &mut req) });
            if req.is_null() {
                break;
            }
            self.recvs[slot] = Some((H(req as usize), self.r_next));
            self.r_next += 1;
            moved = true;
        }
        while self.s_next < p.msgs && self.sends[(self.s_next % SLOTS as u64) as usize].is_none() {
            let (seq, slot) = (self.s_next, (self.s_next % SLOTS as u64) as usize);
            let n = size_of(p.id, seq);
            let buf = &mut p.sbuf[slot * MAX..slot * MAX + n];
            for (i, b) in buf.iter_mut().enumerate() {
                *b = byte(p.id, seq, i);
            }
            let mut req = std::ptr::null_mut();
            // SAFETY: rivet's v12 table: a live send comm, n bytes of a free slot of this pair's
            // registered buffer, which stays untouched until the request is done.
            check("isend", unsafe { t().isend.unwrap()(p.sc.p(), buf.as_mut_ptr() as *mut c_void, n, 7, p.smh.p(), std::ptr::null_mut(), &mut req) });
            if req.is_null() {
                break;
            }
            self.sends[slot] = Some((H(req as usize), seq));
            self.s_next += 1;
            moved = true;
        }
        for slot in 0..SLOTS {
            let mut size = -1;
            if let Some((req, _)) = self.sends[slot] {
                if test(req, &mut size) {
                    self.sends[slot] = None;
                    self.sent += 1;
                    moved = true;
                }
            }
            if let Some((req, seq)) = self.recvs[slot] {
                if test(req, &mut size) {
                    let n = size_of(p.id, seq);
                    assert_eq!(size as usize, n, "pair {} message {seq}: received {size} bytes where {n} were sent", p.id);
                    let got = &p.rbuf[slot * MAX..slot * MAX + n];
                    if let Some(i) = (0..n).find(|&i| got[i] != byte(p.id, seq, i)) {
                        panic!("pair {} message {seq} of {n} bytes: byte {i} is {:#x}, sent {:#x}", p.id, got[i], byte(p.id, seq, i));
                    }
                    bytes.fetch_add(n as u64, Ordering::Relaxed);
                    self.recvs[slot] = None;
                    self.done += 1;
                    moved = true;
                }
            }
        }
        moved
    }

    fn finished(&self) -> bool {
        self.done == self.p.msgs && self.sent == self.p.msgs
    }
}

fn now_ms(t0: Instant) -> u64 {
    t0.elapsed().as_millis() as u64
}

/// Each test runs its body in a child process of its own: the descriptor count at the end is the
/// run's alone, not shifted by the other test's child pipes opening or closing meanwhile.
#[test]
fn nccl_s_threads_at_once() {
    if let Some((ok, err)) = in_child("nccl_s_threads_at_once", &[]) {
        assert!(ok, "the run failed:\n{err}");
        return;
    }
    run();
}

/// The same with every buffer through the staging engine (RIVET_STAGE_HOST=1: registered bounce
/// buffers and the copier's own thread), in a child process so that the setting is read fresh.
#[test]
fn nccl_s_threads_at_once_staged() {
    if let Some((ok, err)) = in_child("nccl_s_threads_at_once_staged", &[("RIVET_STAGE_HOST", "1")]) {
        assert!(ok, "the staged run failed:\n{err}");
        return;
    }
    run();
}

fn run() {
    if std::env::var_os("NCCL_SOCKET_IFNAME").is_none() {
        std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    }
    std::env::set_var("RIVET_TIMEOUT", "10");
    let secs: u64 = std::env::var("RIVET_THREADS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
    let ctx = init();
    let fds0 = open_fds();
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let last_move = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let (new_tx, new_rx) = mpsc::channel::<Pair>();
    let (ret_tx, ret_rx) = mpsc::channel::<Pair>();
    let (close_tx, close_rx) = mpsc::channel::<(H, H)>();

    // The progress thread: every live pair's traffic, until told to stop and every pair it was
    // given is finished and handed back.
    let progress = {
        let (last_move, bytes) = (last_move.clone(), bytes.clone());
        std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || {
                let mut flows: Vec<Flow> = Vec::new();
                let mut open = true;
                while open || !flows.is_empty() {
                    loop {
                        match new_rx.try_recv() {
                            Ok(p) => flows.push(Flow { p, sends: [None; SLOTS], recvs: [None; SLOTS], s_next: 0, r_next: 0, done: 0, sent: 0 }),
                            Err(mpsc::TryRecvError::Empty) => break,
                            Err(mpsc::TryRecvError::Disconnected) => {
                                open = false;
                                break;
                            }
                        }
                    }
                    let mut moved = false;
                    let mut i = 0;
                    while i < flows.len() {
                        moved |= flows[i].step(&bytes);
                        if flows[i].finished() {
                            let f = flows.swap_remove(i);
                            if ret_tx.send(f.p).is_err() {
                                return;
                            }
                            moved = true;
                        } else {
                            i += 1;
                        }
                    }
                    if moved {
                        last_move.store(now_ms(t0), Ordering::Relaxed);
                    } else if flows.is_empty() {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            })
            .unwrap()
    };

    // The service thread: new pairs (connect, accept, regMr) while running, scratch
    // registrations on live comms, and the deregistration of the pairs the progress thread is
    // done with, which it then hands to the main thread to close.
    let ctx_p = ctx.0 as usize;
    let service = {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("service".into())
            .spawn(move || -> (u64, u64) {
                let ctx = Ctx(ctx_p as *mut c_void);
                let mut live: HashMap<u64, (H, H)> = HashMap::new();
                let mut scratch: Vec<(u64, H, H, Vec<u8>)> = Vec::new();
                let (mut next_id, mut scratch_regs, mut tick) = (0u64, 0u64, 0u64);
                let mut new_tx = Some(new_tx);
                while new_tx.is_some() || !live.is_empty() {
                    if stop.load(Ordering::Relaxed) {
                        new_tx = None; // the progress thread finishes what it has
                    }
                    if let Some(tx) = &new_tx {
                        if live.len() < LIVE {
                            let (sc, rc) = connect(&ctx);
                            let (sbuf, rbuf) = (vec![0u8; SLOTS * MAX], vec![0u8; SLOTS * MAX]);
                            let (smh, rmh) = (reg(sc, sbuf.as_ptr(), sbuf.len()), reg(rc, rbuf.as_ptr(), rbuf.len()));
                            let msgs = 50 + rnd(next_id ^ 0xabc) % 400;
                            live.insert(next_id, (sc, rc));
                            tx.send(Pair { id: next_id, sc, rc, smh, rmh, sbuf, rbuf, msgs }).unwrap();
                            next_id += 1;
                        }
                    }
                    // A scratch buffer registered on a live comm, or one deregistered: NCCL's
                    // user-buffer registration, while the progress thread uses the comm.
                    tick += 1;
                    let r = rnd(tick ^ 0x5eed);
                    if scratch.len() < 8 && !live.is_empty() && r % 2 == 0 {
                        let ids: Vec<u64> = live.keys().copied().collect();
                        let id = ids[(r >> 8) as usize % ids.len()];
                        let (sc, rc) = live[&id];
                        let comm = if r & 4 == 0 { sc } else { rc };
                        let buf = vec![1u8; 4096 + (r >> 16) as usize % (1 << 20)];
                        let mh = reg(comm, buf.as_ptr(), buf.len());
                        scratch.push((id, comm, mh, buf));
                        scratch_regs += 1;
                    } else if let Some((_, comm, mh, _buf)) = scratch.pop() {
                        dereg(comm, mh);
                    }
                    match ret_rx.recv_timeout(Duration::from_millis(2)) {
                        Ok(p) => {
                            scratch.retain(|(id, comm, mh, _)| {
                                let mine = *id == p.id;
                                if mine {
                                    dereg(*comm, *mh);
                                }
                                !mine
                            });
                            dereg(p.sc, p.smh);
                            dereg(p.rc, p.rmh);
                            live.remove(&p.id);
                            close_tx.send((p.sc, p.rc)).unwrap();
                        }
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    }
                }
                (next_id, scratch_regs)
            })
            .unwrap()
    };

    // The main thread: closes what the service thread hands it, and watches the others.
    let mut closed = 0u64;
    loop {
        match close_rx.recv_timeout(Duration::from_millis(200)) {
            Ok((sc, rc)) => {
                // SAFETY: rivet's v12 table: comms whose requests are all done and whose
                // buffers are deregistered, each closed once.
                unsafe {
                    check("closeSend", t().closeSend.unwrap()(sc.p()));
                    check("closeRecv", t().closeRecv.unwrap()(rc.p()));
                }
                closed += 1;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if t0.elapsed() >= Duration::from_secs(secs) {
            stop.store(true, Ordering::Relaxed);
        }
        let idle = now_ms(t0).saturating_sub(last_move.load(Ordering::Relaxed));
        assert!(
            progress.is_finished() || service.is_finished() || idle < 30_000,
            "no message moved for {} s: a call is stuck or a request never completes",
            idle / 1000
        );
        assert!(t0.elapsed() < Duration::from_secs(secs + 120), "the threads did not wind down within 120 s of the stop");
    }
    // The service thread has ended (its channel to this thread closed); the progress thread ends
    // once its pairs are handed back. A thread's own panic is the failure to report.
    let service = service.join();
    let wind_down = Instant::now() + Duration::from_secs(30);
    while !progress.is_finished() && Instant::now() < wind_down {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(progress.is_finished(), "the progress thread did not end within 30 s of the service thread");
    progress.join().expect("the progress thread failed");
    let (pairs, scratch) = service.expect("the service thread failed");
    let mb = bytes.load(Ordering::Relaxed) as f64 / (1 << 20) as f64;
    println!("{pairs} pairs connected, carried and closed in {secs} s ({mb:.0} MiB checked byte for byte), {scratch} scratch registrations on live comms");
    assert_eq!(closed, pairs, "every pair closed");
    assert!(pairs > LIVE as u64, "only {pairs} pairs in {secs} s: the comms did not turn over");
    assert_eq!(open_fds(), fds0, "descriptors left open after every comm closed");
}
