//! Helper threads for the TCP transport's streams 1..n (`RIVET_SOCKET_THREADS=1`): each moves
//! its stream's parts of large messages, so a message's copies into and out of the kernel run on
//! several cores at once, as NCCL's own socket transport does with NCCL_SOCKET_NTHREADS. Stream 0
//! (headers, small messages, each message's first part) stays with the calling thread.
//!
//! A helper takes tasks in stream order from its queue, moves their bytes (a send only as far
//! as its ready mark), and counts each finished task in the per-slot `done` counters, which the
//! calling thread reads (Acquire) before it reports a request complete. A helper waits on a
//! condition variable when idle and polls its socket with a 100 ms timeout, so it notices the
//! stop flag promptly; the comm joins its helpers when it closes, before any buffer or socket
//! goes away (nothing runs after NCCL dlcloses the plugin).

use crate::transport::oob::sock::{self, Io};
use crate::error::Error;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// One part of a message for a helper: `len` bytes at `ptr`, for request slot `slot`; `base` is
/// the part's offset in its message (a send's ready mark is in message bytes).
#[derive(Clone, Copy)]
pub struct Part {
    pub slot: u32,
    pub ptr: *mut u8,
    pub len: usize,
    pub base: usize,
}

// SAFETY: `ptr` points into a posted send or receive buffer that stays valid until its request
// completes, and the comm joins its helpers (Helper::drop, before its sockets and slots go) before
// it goes away. A Part's bytes are touched only by the one helper it is queued on, until that
// helper counts it in `done` (Release), which the comm's thread reads (Acquire) before it reports
// the request complete.
unsafe impl Send for Part {}

/// What a comm and its helpers share.
pub struct Shared {
    /// Finished helper parts per request slot.
    pub done: Box<[AtomicU32]>,
    /// Bytes of each send slot's message that can be read (sends only).
    pub ready: Box<[AtomicUsize]>,
    pub stop: AtomicBool,
    pub failed: AtomicBool,
    pub error: Mutex<Option<Error>>,
}

impl Shared {
    pub fn new(slots: usize) -> Arc<Shared> {
        Arc::new(Shared {
            done: (0..slots).map(|_| AtomicU32::new(0)).collect(),
            ready: (0..slots).map(|_| AtomicUsize::new(0)).collect(),
            stop: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
        })
    }

    fn fail(&self, e: Error) {
        let mut g = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(e);
        }
        self.failed.store(true, Ordering::Release);
    }

    /// The first helper error, if any.
    pub fn check(&self) -> Option<Error> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

struct Queue {
    parts: Mutex<VecDeque<Part>>,
    cv: Condvar,
}

/// One stream's helper thread.
pub struct Helper {
    queue: Arc<Queue>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Helper {
    pub fn spawn(fd: RawFd, stream: usize, send: bool, peer: SocketAddr, shared: Arc<Shared>, capacity: usize) -> std::io::Result<Helper> {
        let queue = Arc::new(Queue { parts: Mutex::new(VecDeque::with_capacity(capacity)), cv: Condvar::new() });
        let (q, s) = (queue.clone(), shared.clone());
        let thread = std::thread::Builder::new()
            .name(format!("rivet-tcp-{}{stream}", if send { "tx" } else { "rx" }))
            .spawn(move || run(fd, stream, send, peer, &q, &s))?;
        Ok(Helper { queue, shared, thread: Some(thread) })
    }

    pub fn push(&self, p: Part) {
        self.queue.parts.lock().unwrap_or_else(|p| p.into_inner()).push_back(p);
        self.queue.cv.notify_one();
    }

    /// Wake the helper (a send's ready mark moved).
    pub fn nudge(&self) {
        self.queue.cv.notify_one();
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.queue.cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(fd: RawFd, stream: usize, send: bool, peer: SocketAddr, q: &Queue, s: &Shared) {
    let dir = if send { "sending" } else { "receiving" };
    let timeout = crate::config::get().timeout();
    let mut stall = sock::Stall::new();
    loop {
        let p = {
            let mut g = q.parts.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if s.stop.load(Ordering::Acquire) {
                    return;
                }
                if let Some(p) = g.front() {
                    break *p;
                }
                g = q.cv.wait_timeout(g, Duration::from_millis(100)).unwrap_or_else(|p| p.into_inner()).0;
            }
        };
        let mut off = 0;
        while off < p.len {
            if s.stop.load(Ordering::Acquire) {
                return;
            }
            let end = if send { p.len.min(s.ready[p.slot as usize].load(Ordering::Acquire).saturating_sub(p.base)) } else { p.len };
            if end <= off {
                // A staged send whose copy has not reached this part yet.
                let g = q.parts.lock().unwrap_or_else(|p| p.into_inner());
                let _ = q.cv.wait_timeout(g, Duration::from_millis(1));
                continue;
            }
            // SAFETY: `p.ptr` points to `p.len` bytes (the Part's contract above) and `off < end <=
            // p.len` here, so `ptr + off` stays inside the part, and the send or receive below
            // moves at most the `end - off` bytes left in it.
            let ptr = unsafe { p.ptr.add(off) };
            // SAFETY: as above: `end - off` bytes at `ptr`, inside the part (a send buffer to read
            // or a receive buffer to write, kept by NCCL until the request completes).
            let r = unsafe {
                if send {
                    sock::send_iov(fd, &[libc::iovec { iov_base: ptr as *mut libc::c_void, iov_len: end - off }])
                } else {
                    sock::recv_into(fd, ptr, end - off)
                }
            };
            match r {
                Ok(Io::Done(n)) => {
                    off += n;
                    stall.moved();
                }
                Ok(Io::WouldBlock) => {
                    if send {
                        if let Some(why) = stall.blocked(fd, timeout, 1) {
                            s.fail(sock::unreachable_error(peer, stream, &why));
                            return;
                        }
                    }
                    let mut pfd = libc::pollfd { fd, events: if send { libc::POLLOUT } else { libc::POLLIN }, revents: 0 };
                    // SAFETY: `pfd` is one live local pollfd and nfds is 1; timeout 100 ms. `fd`
                    // stays open while this thread runs: the comm's Streams drops (joins) its
                    // helpers before it closes its fds.
                    unsafe { libc::poll(&mut pfd, 1, 100) };
                }
                Ok(Io::Closed) => {
                    s.fail(Error::remote(format!(
                        "connection to {peer} (stream {stream}) closed by the peer in the middle of a transfer: the peer process exited or died"
                    )));
                    return;
                }
                Err(e) => {
                    s.fail(sock::stream_error(peer, stream, dir, &e));
                    return;
                }
            }
        }
        s.done[p.slot as usize].fetch_add(1, Ordering::Release);
        q.parts.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
    }
}
