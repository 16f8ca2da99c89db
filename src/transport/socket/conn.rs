//! The TCP data path. A connection is `n` streams; each message is a 24-byte header on stream 0
//! followed by its bytes split over the streams as `proto::split` says. Everything is
//! non-blocking and progressed from `test` (and eagerly from `isend`/`irecv`); all bookkeeping
//! is preallocated, so posting and completing a message allocates nothing.

use super::helper::{Helper, Part, Shared};
use crate::transport::oob::sock::{self, Io};
use crate::error::{Error, Result};
use crate::proto::{split, MsgHeader, MSG_HDR_SIZE};
use crate::transport::{Conn, Lent, MrInfo, RecvBuf, MAX_RECVS};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Send slots: NCCL keeps up to 32 requests in flight, times maxRecvs on the send side.
pub const SEND_SLOTS: usize = crate::proto::NCCL_INFLIGHT * MAX_RECVS;
pub const RECV_SLOTS: usize = crate::proto::NCCL_INFLIGHT;
const MAX_IOV: usize = 16;

/// A byte range still to move on one stream for one request slot.
#[derive(Clone, Copy)]
struct Task {
    slot: u32,
    ptr: *mut u8,
    len: usize,
    off: usize,
    /// Offset of `ptr` in its message, for a send's ready mark; `HDR` for a header.
    base: usize,
}

const HDR: usize = usize::MAX;

struct Streams {
    /// Helper threads of streams 1.. (RIVET_SOCKET_THREADS=1); first, so they are joined
    /// before the sockets close.
    helpers: Vec<Option<Helper>>,
    shared: Arc<Shared>,
    _fds: Vec<OwnedFd>,
    raw: Vec<RawFd>,
    pfds: Vec<libc::pollfd>,
    queues: Vec<VecDeque<Task>>,
    peer: SocketAddr,
    min_chunk: usize,
    failed: Option<Error>,
    /// Per stream: how long its bytes have been unable to move (sends), to find a vanished host.
    stalls: Vec<sock::Stall>,
    timeout: std::time::Duration,
}

// SAFETY: what keeps Streams from being Send on its own is the raw pointers in its queued Tasks,
// into NCCL's posted buffers or the owning comm's header slots (boxed, so they do not move with
// it). Those stay valid while their request is in flight, wherever the comm is moved, and the comm
// is used by one thread at a time (NCCL's calls, under the plugin's comm lock); the helpers it
// shares Parts with are Send and joined in Drop.
unsafe impl Send for Streams {}

/// On the polling path the clock is read once every this many blocked attempts.
const STALL_EVERY: u32 = 256;

impl Streams {
    fn new(fds: Vec<OwnedFd>, peer: SocketAddr, min_chunk: usize, per_queue: usize, slots: usize, send: bool) -> Streams {
        let raw = fds.iter().map(|f| f.as_raw_fd()).collect::<Vec<_>>();
        let queues = (0..fds.len()).map(|_| VecDeque::with_capacity(per_queue)).collect();
        let pfds = raw.iter().map(|&fd| libc::pollfd { fd, events: 0, revents: 0 }).collect();
        let shared = Shared::new(slots);
        let threads = crate::config::get().socket_threads;
        let helpers = raw
            .iter()
            .enumerate()
            .map(|(j, &fd)| {
                if j == 0 || !threads {
                    return None;
                }
                match Helper::spawn(fd, j, send, peer, shared.clone(), per_queue) {
                    Ok(h) => Some(h),
                    Err(e) => {
                        log::warn!("NET/rivet: cannot start a helper thread for stream {j} to {peer} ({e}); the stream is served inline");
                        None
                    }
                }
            })
            .collect();
        let stalls = raw.iter().map(|_| sock::Stall::new()).collect();
        let timeout = crate::config::get().timeout();
        Streams { helpers, shared, _fds: fds, raw, pfds, queues, peer, min_chunk, failed: None, stalls, timeout }
    }

    /// Queue a part on stream `j`: its helper's, or the calling thread's.
    fn push(&mut self, j: usize, t: Task) {
        match &self.helpers[j] {
            Some(h) => h.push(Part { slot: t.slot, ptr: t.ptr, len: t.len, base: t.base }),
            None => self.queues[j].push_back(t),
        }
    }

    /// Parts of request `slot` still moving: `pending` counts all that were queued, the helpers
    /// count the ones they finished.
    fn outstanding(&self, slot: u32, pending: u32) -> u32 {
        pending.saturating_sub(self.shared.done[slot as usize].load(Ordering::Acquire))
    }

    /// A request is over: its helper count starts again from zero.
    fn reset(&self, slot: u32) {
        self.shared.done[slot as usize].store(0, Ordering::Relaxed);
    }

    /// Which of the streams in `want` (a bit per stream) are ready for `events`, in one poll(2)
    /// call. Checking readiness first keeps a spinning `test` from taking the socket lock on
    /// every call, which would push the peer's incoming segments onto the slow backlog path.
    fn ready(&mut self, want: u32, events: i16) -> u32 {
        if want == 0 {
            return 0;
        }
        for (j, p) in self.pfds.iter_mut().enumerate() {
            // A negative fd makes poll skip the entry.
            p.fd = if want & (1 << j) != 0 { self.raw[j] } else { -1 };
            p.events = events;
            p.revents = 0;
        }
        // SAFETY: `self.pfds` is a live Vec of pollfd whose pointer and length are passed together;
        // poll(2) writes only the entries' `revents`. Each fd is -1 (skipped) or one of `raw`,
        // whose descriptors `_fds` owns and keeps open for as long as `self` lives; timeout 0.
        let n = unsafe { libc::poll(self.pfds.as_mut_ptr(), self.pfds.len() as libc::nfds_t, 0) };
        if n <= 0 {
            return 0;
        }
        let mut r = 0;
        for (j, p) in self.pfds.iter().enumerate() {
            // Errors and hang-ups count as ready, so the following read or write reports them.
            if p.revents != 0 {
                r |= 1 << j;
            }
        }
        r
    }

    /// A bit per stream with queued work.
    fn busy(&self) -> u32 {
        self.queues.iter().enumerate().filter(|(_, q)| !q.is_empty()).fold(0, |m, (j, _)| m | 1 << j)
    }

    fn check(&self) -> Result<()> {
        match &self.failed {
            Some(e) => Err(e.clone()),
            None => match self.shared.check() {
                Some(e) => Err(e),
                None => Ok(()),
            },
        }
    }

    fn fail(&mut self, e: Error) -> Error {
        if self.failed.is_none() {
            self.failed = Some(e.clone());
        }
        e
    }

    fn io_error(&self, stream: usize, dir: &str, e: std::io::Error) -> Error {
        sock::stream_error(self.peer, stream, dir, &e)
    }

    fn closed_error(&self, stream: usize) -> Error {
        Error::remote(format!(
            "connection to {} (stream {stream}) closed by the peer in the middle of a transfer: the peer process exited or died",
            self.peer
        ))
    }
}

struct SendSlot {
    hdr: [u8; MSG_HDR_SIZE],
    size: usize,
    /// Bytes of the message that can be read (all but for a partial send).
    ready: usize,
    pending: u32,
    busy: bool,
}

pub struct SendConn {
    s: Streams,
    slots: Box<[SendSlot]>,
    free: Vec<u32>,
    next_seq: u32,
    iov: Vec<libc::iovec>,
}

// SAFETY: besides `s` (Send, above) and plain data, SendConn holds `iov`, a scratch Vec of iovecs
// whose raw pointers are rebuilt from the queues before every use and never read otherwise, so
// moving it to another thread moves no live access with it.
unsafe impl Send for SendConn {}

impl SendConn {
    pub fn new(fds: Vec<OwnedFd>, peer: SocketAddr, min_chunk: usize) -> SendConn {
        let slots = (0..SEND_SLOTS)
            .map(|_| SendSlot { hdr: [0; MSG_HDR_SIZE], size: 0, ready: 0, pending: 0, busy: false })
            .collect::<Vec<_>>()
            .into_boxed_slice();
        SendConn {
            s: Streams::new(fds, peer, min_chunk, 2 * SEND_SLOTS, SEND_SLOTS, true),
            slots,
            free: (0..SEND_SLOTS as u32).rev().collect(),
            next_seq: 0,
            iov: Vec::with_capacity(MAX_IOV),
        }
    }

    fn progress(&mut self) -> Result<()> {
        self.s.check()?;
        let busy = self.s.busy();
        let ready = self.s.ready(busy, libc::POLLOUT);
        for j in 0..self.s.raw.len() {
            if busy & (1 << j) == 0 {
                continue;
            }
            let moved = if ready & (1 << j) != 0 {
                match self.flush_stream(j) {
                    Ok(m) => m,
                    Err(e) => return Err(self.s.fail(e)),
                }
            } else {
                false
            };
            if moved {
                self.s.stalls[j].moved();
            } else if let Some(why) = self.s.stalls[j].blocked(self.s.raw[j], self.s.timeout, STALL_EVERY) {
                let e = sock::unreachable_error(self.s.peer, j, &why);
                return Err(self.s.fail(e));
            }
        }
        Ok(())
    }

    /// Write as much of stream `j`'s queue as the socket takes, gathering up to MAX_IOV tasks;
    /// true when some bytes moved.
    fn flush_stream(&mut self, j: usize) -> Result<bool> {
        let mut moved = false;
        loop {
            let q = &self.s.queues[j];
            if q.is_empty() {
                return Ok(moved);
            }
            self.iov.clear();
            for t in q.iter().take(MAX_IOV) {
                // A partial send's bytes go only as far as its ready mark; nothing behind them
                // on this stream may overtake.
                let end = if t.base == HDR { t.len } else { t.len.min(self.slots[t.slot as usize].ready.saturating_sub(t.base)) };
                if end > t.off {
                    // SAFETY: `t.ptr` points to `t.len` bytes (a slot's header array, or one part
                    // of the caller's send buffer that isend_partial cut within its size) and
                    // `t.off < end <= t.len` here, so the result stays inside that buffer; sendmsg
                    // reads the `end - t.off` bytes from it.
                    self.iov.push(libc::iovec { iov_base: unsafe { t.ptr.add(t.off) } as *mut libc::c_void, iov_len: end - t.off });
                }
                if end < t.len {
                    break;
                }
            }
            if self.iov.is_empty() {
                return Ok(moved);
            }
            // SAFETY: the iovecs were built above from this stream's header slot and the posted
            // send buffers (kept by NCCL until their requests complete), within their sizes.
            let n = match unsafe { sock::send_iov(self.s.raw[j], &self.iov) } {
                Ok(Io::Done(n)) => n,
                Ok(_) => return Ok(moved),
                Err(e) => return Err(self.s.io_error(j, "sending", e)),
            };
            moved = true;
            let mut left = n;
            while left > 0 {
                let t = self.s.queues[j].front_mut().expect("bytes sent beyond the queue");
                let take = left.min(t.len - t.off);
                t.off += take;
                left -= take;
                if t.off == t.len {
                    let slot = t.slot as usize;
                    self.s.queues[j].pop_front();
                    self.slots[slot].pending -= 1;
                }
            }
        }
    }
}

impl Conn for SendConn {
    fn isend(&mut self, data: Lent, tag: i32, mr: Option<&MrInfo>) -> Result<Option<u32>> {
        let len = data.len();
        self.isend_partial(data, tag, mr, len)
    }

    fn isend_partial(&mut self, data: Lent, tag: i32, _mr: Option<&MrInfo>, ready: usize) -> Result<Option<u32>> {
        self.s.check()?;
        let size = data.len();
        let Some(slot) = self.free.pop() else { return Ok(None) };
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        let sl = &mut self.slots[slot as usize];
        MsgHeader { seq, size: size as u64, tag }.encode(&mut sl.hdr);
        sl.size = size;
        sl.ready = ready.min(size);
        sl.busy = true;
        self.s.shared.ready[slot as usize].store(sl.ready, Ordering::Release);
        let (k, chunk) = split(size, self.s.raw.len(), self.s.min_chunk);
        let hdr_ptr = sl.hdr.as_mut_ptr();
        self.s.queues[0].push_back(Task { slot, ptr: hdr_ptr, len: MSG_HDR_SIZE, off: 0, base: HDR });
        let mut pending = 1;
        if size > 0 {
            for j in 0..k {
                let lo = j * chunk;
                let hi = ((j + 1) * chunk).min(size);
                // SAFETY: `data` is lent: `size` readable bytes valid until the request completes
                // or the comm closes (Lent's invariant; size > 0, so not NULL), and
                // `lo = j * chunk < size` for every j < k that `split` returns, so `data + lo` is
                // inside the buffer. A send never writes through Task's `*mut`.
                let ptr = unsafe { data.ptr().add(lo) };
                self.s.push(j, Task { slot, ptr, len: hi - lo, off: 0, base: lo });
                pending += 1;
            }
        }
        self.slots[slot as usize].pending = pending;
        self.progress()?;
        Ok(Some(slot))
    }

    fn set_ready(&mut self, slot: u32, ready: usize) -> Result<()> {
        let sl = self.slots.get_mut(slot as usize).ok_or_else(|| Error::internal("request slot out of range"))?;
        sl.ready = sl.ready.max(ready.min(sl.size));
        self.s.shared.ready[slot as usize].store(sl.ready, Ordering::Release);
        for h in self.s.helpers.iter().flatten() {
            h.nudge();
        }
        self.progress()
    }

    fn test(&mut self, slot: u32, sizes: &mut [usize; MAX_RECVS]) -> Result<Option<usize>> {
        let sl = self.slots.get(slot as usize).ok_or_else(|| Error::internal("request slot out of range"))?;
        if !sl.busy {
            return Err(Error::internal("test on a request that is not in flight (already completed?)"));
        }
        if self.s.outstanding(slot, sl.pending) > 0 {
            self.progress()?;
        }
        let sl = &mut self.slots[slot as usize];
        if self.s.outstanding(slot, sl.pending) > 0 {
            return Ok(None);
        }
        self.s.check()?;
        sl.busy = false;
        self.s.reset(slot);
        sizes[0] = sl.size;
        self.free.push(slot);
        Ok(Some(1))
    }

    fn capacity(&self) -> usize {
        SEND_SLOTS
    }
}

struct RecvSlot {
    n: usize,
    bufs: [RecvBuf; MAX_RECVS],
    sizes: [usize; MAX_RECVS],
    matched: u16,
    nmatched: usize,
    pending: u32,
    busy: bool,
}

pub struct RecvConn {
    s: Streams,
    slots: Box<[RecvSlot]>,
    free: Vec<u32>,
    /// Posted receives whose messages have not all been matched yet, in posting order.
    posted: VecDeque<u32>,
    hdr: [u8; MSG_HDR_SIZE],
    hdr_got: usize,
    expect_seq: u32,
}

// SAFETY: the raw pointers RecvConn holds are its slots' posted receive buffers and the Tasks in
// its streams' queues that point into them; NCCL keeps those buffers valid until the request
// completes, wherever the comm is moved, and the comm is used by one thread at a time (under the
// plugin's comm lock).
unsafe impl Send for RecvConn {}

impl RecvConn {
    pub fn new(fds: Vec<OwnedFd>, peer: SocketAddr, min_chunk: usize) -> RecvConn {
        let slots = (0..RECV_SLOTS)
            .map(|_| RecvSlot {
                n: 0,
                bufs: [RecvBuf::EMPTY; MAX_RECVS],
                sizes: [0; MAX_RECVS],
                matched: 0,
                nmatched: 0,
                pending: 0,
                busy: false,
            })
            .collect::<Vec<_>>()
            .into_boxed_slice();
        RecvConn {
            s: Streams::new(fds, peer, min_chunk, RECV_SLOTS * MAX_RECVS, RECV_SLOTS, false),
            slots,
            free: (0..RECV_SLOTS as u32).rev().collect(),
            posted: VecDeque::with_capacity(RECV_SLOTS),
            hdr: [0; MSG_HDR_SIZE],
            hdr_got: 0,
            expect_seq: 0,
        }
    }

    fn progress(&mut self) -> Result<()> {
        self.s.check()?;
        let r = self.progress_inner();
        r.map_err(|e| self.s.fail(e))
    }

    fn progress_inner(&mut self) -> Result<()> {
        let mut want = self.s.busy();
        if !self.posted.is_empty() {
            want |= 1;
        }
        let ready = self.s.ready(want, libc::POLLIN);
        // Stream 0 interleaves headers and each message's first part: alternate in order.
        // (`ready` is fixed for this pass; the loop ends by `break`.)
        #[allow(clippy::while_immutable_condition)]
        while ready & 1 != 0 {
            if !self.s.queues[0].is_empty() {
                if !self.drain(0)? {
                    break;
                }
                continue;
            }
            if self.posted.is_empty() {
                break;
            }
            let fd = self.s.raw[0];
            let got = self.hdr_got;
            // SAFETY: `got = self.hdr_got < MSG_HDR_SIZE` (it is reset to 0 once a header is
            // whole), so `hdr + got` is inside `self.hdr`, and recv_into may write the
            // `MSG_HDR_SIZE - got` bytes left in that array, which nothing else touches during the
            // call.
            match unsafe { sock::recv_into(fd, self.hdr.as_mut_ptr().add(got), MSG_HDR_SIZE - got) } {
                Ok(Io::Done(n)) => {
                    self.hdr_got += n;
                    if self.hdr_got == MSG_HDR_SIZE {
                        self.hdr_got = 0;
                        self.on_header()?;
                    }
                }
                Ok(Io::WouldBlock) => break,
                Ok(Io::Closed) => return Err(self.s.closed_error(0)),
                Err(e) => return Err(self.s.io_error(0, "receiving", e)),
            }
        }
        for j in 1..self.s.raw.len() {
            if ready & (1 << j) != 0 {
                self.drain(j)?;
            }
        }
        Ok(())
    }

    /// Read into stream `j`'s queued tasks until it is empty (true) or the socket has no data (false).
    fn drain(&mut self, j: usize) -> Result<bool> {
        while let Some(t) = self.s.queues[j].front_mut() {
            // SAFETY: a queued task's `ptr` points to `t.len` bytes of a posted receive buffer
            // (on_header cut it within the size that receive holds) and `t.off < t.len` while it is
            // queued, so `ptr + off` is inside that buffer and recv_into may write the `t.len -
            // t.off` bytes left.
            let (ptr, want) = (unsafe { t.ptr.add(t.off) }, t.len - t.off);
            // SAFETY: as above: `want` writable bytes at `ptr`, inside the posted receive buffer.
            match unsafe { sock::recv_into(self.s.raw[j], ptr, want) } {
                Ok(Io::Done(n)) => {
                    t.off += n;
                    if t.off == t.len {
                        let slot = t.slot as usize;
                        self.s.queues[j].pop_front();
                        self.slots[slot].pending -= 1;
                    }
                }
                Ok(Io::WouldBlock) => return Ok(false),
                Ok(Io::Closed) => return Err(self.s.closed_error(j)),
                Err(e) => return Err(self.s.io_error(j, "receiving", e)),
            }
        }
        Ok(true)
    }

    /// Match a complete header to the oldest posted receive and queue its parts.
    fn on_header(&mut self) -> Result<()> {
        let peer = self.s.peer;
        let h = MsgHeader::decode(&self.hdr).ok_or_else(|| {
            Error::remote(format!("protocol error from {peer}: corrupted message header (stream out of sync)"))
        })?;
        if h.seq != self.expect_seq {
            return Err(Error::remote(format!(
                "protocol error from {peer}: message {} arrived where {} was expected",
                h.seq, self.expect_seq
            )));
        }
        self.expect_seq = self.expect_seq.wrapping_add(1);
        let slot = *self.posted.front().expect("header read without a posted receive");
        let sl = &mut self.slots[slot as usize];
        let idx = if sl.n == 1 {
            0
        } else {
            (0..sl.n).find(|&i| sl.matched & (1 << i) == 0 && sl.bufs[i].tag == h.tag).ok_or_else(|| {
                let tags: Vec<i32> = sl.bufs[..sl.n].iter().map(|b| b.tag).collect();
                Error::usage(format!(
                    "collective mismatch with {peer}: a message with tag {} does not match any open buffer of the grouped receive (tags {tags:?})",
                    h.tag
                ))
            })?
        };
        let size = h.size as usize;
        let cap = sl.bufs[idx].buf.len();
        if h.size > cap as u64 {
            return Err(Error::usage(format!(
                "collective mismatch with {peer}: the peer sent {} bytes with tag {} but the posted receive holds only {cap} bytes; every rank must run the same collectives with the same counts and datatypes",
                h.size, h.tag
            )));
        }
        sl.matched |= 1 << idx;
        sl.nmatched += 1;
        sl.sizes[idx] = size;
        let base = sl.bufs[idx].buf.ptr();
        if sl.nmatched == sl.n {
            self.posted.pop_front();
        }
        if size > 0 {
            let (k, chunk) = split(size, self.s.raw.len(), self.s.min_chunk);
            for j in 0..k {
                let lo = j * chunk;
                let hi = ((j + 1) * chunk).min(size);
                // SAFETY: `base` is the matched posted receive buffer, lent: `cap` writable bytes
                // until the request completes or the comm closes (Lent's invariant; cap >= size
                // > 0, so not NULL), and `lo < size <= cap` (checked above, and `split` keeps
                // `lo` below `size`), so `base + lo` is inside it.
                self.s.push(j, Task { slot, ptr: unsafe { base.add(lo) }, len: hi - lo, off: 0, base: HDR });
            }
            self.slots[slot as usize].pending += k as u32;
        }
        Ok(())
    }
}

impl Conn for RecvConn {
    fn irecv(&mut self, bufs: &mut [RecvBuf]) -> Result<Option<u32>> {
        self.s.check()?;
        if bufs.is_empty() || bufs.len() > MAX_RECVS {
            return Err(Error::internal(format!("irecv with n={} (1..={MAX_RECVS} accepted)", bufs.len())));
        }
        let Some(slot) = self.free.pop() else { return Ok(None) };
        let sl = &mut self.slots[slot as usize];
        sl.n = bufs.len();
        for (kept, b) in sl.bufs.iter_mut().zip(bufs.iter_mut()) {
            *kept = std::mem::take(b);
        }
        sl.sizes = [0; MAX_RECVS];
        sl.matched = 0;
        sl.nmatched = 0;
        sl.pending = 0;
        sl.busy = true;
        self.posted.push_back(slot);
        self.progress()?;
        Ok(Some(slot))
    }

    fn test(&mut self, slot: u32, sizes: &mut [usize; MAX_RECVS]) -> Result<Option<usize>> {
        let sl = self.slots.get(slot as usize).ok_or_else(|| Error::internal("request slot out of range"))?;
        if !sl.busy {
            return Err(Error::internal("test on a request that is not in flight (already completed?)"));
        }
        let done = |st: &Streams, s: &RecvSlot| s.nmatched == s.n && st.outstanding(slot, s.pending) == 0;
        if !done(&self.s, sl) {
            self.progress()?;
        }
        let sl = &mut self.slots[slot as usize];
        if !done(&self.s, sl) {
            return Ok(None);
        }
        self.s.check()?;
        sl.busy = false;
        self.s.reset(slot);
        sizes[..sl.n].copy_from_slice(&sl.sizes[..sl.n]);
        let n = sl.n;
        self.free.push(slot);
        Ok(Some(n))
    }

    fn capacity(&self) -> usize {
        RECV_SLOTS
    }
}
