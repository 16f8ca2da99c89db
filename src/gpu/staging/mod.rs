//! The host staging engine, and the per-comm layer every comm's data path goes through.
//!
//! A buffer whose registration says `Path::Staged` (GPU memory the NIC should not or cannot reach
//! directly) never goes to the transport: a send is copied device → host into a bounce buffer
//! and the bounce buffer is sent once the copy's event has fired; a receive lands in a bounce
//! buffer and `test` reports it done only after the host → device copy of the bytes that arrived
//! has completed. Bounce buffers are pinned, registered with the transport when first allocated
//! and pooled by size class, so steady traffic registers nothing.
//!
//! Copies go through the `Copier` trait: `CudaCopier` (one CUDA stream and event ring per comm)
//! on a GPU host, `HostCopier` (plain memcpy, completing one poll late) for the CPU tests, which
//! run the same engine over real TCP and RDMA transfers (`RIVET_STAGE_HOST=1`).
//!
//! Requests that need no staging pass straight through to the transport under their own slot
//! numbers; the layer only keeps sends in order (a host send never overtakes a staged send whose
//! copy is still running) and counts bytes by path for `RIVET_STATS`.

mod copy;
mod remains;

pub use copy::{Copier, CudaCopier, HostCopier, HostMem, NoRegistration, Registrar};
use copy::{Bounce, Pool};
use crate::error::{Error, Result};
use crate::transport::{gpu_of, path_of, Conn, DataPath, Lent, MrInfo, Path, RecvBuf, MAX_RECVS};
use crate::gpu::cuda;
use std::collections::VecDeque;
use std::mem::ManuallyDrop;

/// Requests the engine manages at once per comm.
pub const MANAGED: usize = 64;
/// A staged send is copied in up to this many chunks, each with its own fence, so the transport
/// sends the first chunk while the next is still being copied.
pub const MAX_CHUNKS: usize = 4;
/// Smallest chunk; a send below twice this is copied in one piece.
pub const CHUNK_MIN: usize = 128 << 10;
/// Fence ids: MAX_CHUNKS per managed request (request m uses m * MAX_CHUNKS + chunk).
pub const FENCES: usize = MANAGED * MAX_CHUNKS;

// ---------------------------------------------------------------------------------------------
// Statistics by path (RIVET_STATS).

#[derive(Default, Clone, Copy)]
pub struct Counter {
    pub bytes: u64,
    pub msgs: u64,
}

#[derive(Default, Clone, Copy)]
pub struct Stats {
    /// Indexed by `Path as usize`: host, staged, GDR.
    pub by_path: [Counter; 3],
    /// Staged sends handed to the transport before their copy had finished.
    pub pipelined: u64,
}

impl Stats {
    fn add(&mut self, path: Path, bytes: usize) {
        let c = &mut self.by_path[path as usize];
        c.bytes += bytes as u64;
        c.msgs += 1;
    }
}


// ---------------------------------------------------------------------------------------------
// The layer.

/// The chunks of a staged send's copy: where each ends, and how many have completed.
#[derive(Clone, Copy)]
struct Chunks {
    n: usize,
    done: usize,
    ends: [usize; MAX_CHUNKS],
}

impl Chunks {
    fn split(size: usize) -> Chunks {
        let n = if size == 0 { 0 } else { (size / CHUNK_MIN).clamp(1, MAX_CHUNKS) };
        let mut ends = [size; MAX_CHUNKS];
        if n > 1 {
            let chunk = size.div_ceil(n).next_multiple_of(4096);
            for (i, e) in ends.iter_mut().enumerate().take(n) {
                *e = ((i + 1) * chunk).min(size);
            }
        }
        Chunks { n, done: 0, ends }
    }

    /// Bytes copied so far.
    fn ready(&self) -> usize {
        if self.done == 0 {
            0
        } else {
            self.ends[self.done - 1]
        }
    }
}

enum Managed {
    Free,
    /// A staged send whose device → host copy is running, chunk by chunk (fences
    /// m * MAX_CHUNKS + chunk); `inner` once handed to the transport.
    SendStaged { bounce: Bounce, size: usize, tag: i32, chunks: Chunks, inner: Option<u32> },
    /// A send waiting for earlier staged sends to go first.
    SendWaiting { data: Lent, tag: i32, mr: Option<MrInfo> },
    /// Handed to the transport under `inner`; `bounce` returns to the pool when it completes.
    SendPosted { inner: u32, bounce: Option<Bounce> },
    /// A receive with staged buffers, posted to the transport.
    /// `staged`: per buffer, NCCL's (GPU) buffer, lent until the receive completes, and the
    /// bounce buffer the transport fills in its place.
    RecvPosted { inner: u32, n: usize, staged: [Option<(Lent, Bounce)>; MAX_RECVS] },
    /// The transport has delivered; host → device copies run until the fence.
    RecvCopying { n: usize, sizes: [usize; MAX_RECVS], staged: [Option<(Lent, Bounce)>; MAX_RECVS] },
}

/// Every comm's data path: staging where registrations ask for it, pass-through elsewhere.
pub struct Staged {
    inner: ManuallyDrop<DataPath>,
    icap: usize,
    send: bool,
    label: String,
    pub copier: Option<Box<dyn Copier>>,
    /// The GPU this comm's GPU buffers belong to, and the GDR-or-staging decision for it.
    pub gpu: Option<(i32, crate::gpu::gdr::Decision)>,
    registrar: Box<dyn Registrar>,
    pool: Pool,
    /// RIVET_STAGING_POOL_MAX: the process's unused pooled bytes above which buffers are freed.
    pool_cap: usize,
    slots: Vec<Managed>,
    free: Vec<u32>,
    /// Managed sends not yet handed to the transport, oldest first.
    queue: VecDeque<u32>,
    /// Staged sends handed to the transport before their copy finished.
    partial: Vec<u32>,
    /// Path of the first buffer of each pass-through receive, by transport slot (for stats).
    recv_path: Vec<[Path; MAX_RECVS]>,
    stats: Stats,
    stats_on: bool,
}

// SAFETY: the raw pointers inside (bounce buffers, NCCL's buffers) are only used under the
// comm's lock, by one thread at a time.
unsafe impl Send for Staged {}

impl Staged {
    pub fn new(inner: DataPath, send: bool, label: String, registrar: Box<dyn Registrar>) -> Staged {
        remains::reap();
        let icap = inner.capacity();
        Staged {
            inner: ManuallyDrop::new(inner),
            icap,
            send,
            label,
            copier: None,
            gpu: None,
            registrar,
            pool: Pool::default(),
            pool_cap: crate::config::get().staging_pool_max,
            // Made on first use: most comms never stage, and the slots are 57 KiB.
            slots: Vec::new(),
            free: (0..MANAGED as u32).rev().collect(),
            queue: VecDeque::with_capacity(MANAGED),
            partial: Vec::with_capacity(MANAGED),
            recv_path: vec![[Path::Host; MAX_RECVS]; if send { 0 } else { icap }],
            stats: Stats::default(),
            stats_on: crate::config::get().stats,
        }
    }

    fn copier(&mut self) -> Result<&mut dyn Copier> {
        match self.copier.as_deref_mut() {
            Some(c) => Ok(c),
            None => Err(Error::internal("staging: a staged request on a comm without a copier")),
        }
    }

    /// Give the comm the copier for staged buffers of GPU `gpu` (None: the host copier of
    /// RIVET_STAGE_HOST). Registrations are global to a device (regIsGlobal), so a buffer
    /// registered through one comm may reach another first. Returns whether it was created.
    pub fn ensure_copier(&mut self, gpu: Option<i32>) -> Result<bool> {
        match self.copier.as_ref().map(|c| c.gpu()) {
            Some(g) if g == gpu => Ok(false),
            Some(other) => Err(Error::usage(format!(
                "a staged buffer of {} on a comm that already stages for {}: one comm serves one GPU",
                gpu.map_or("host memory (RIVET_STAGE_HOST=1)".to_string(), |o| format!("CUDA device {o}")),
                other.map_or("host memory (RIVET_STAGE_HOST=1)".to_string(), |o| format!("CUDA device {o}"))
            ))),
            None => {
                self.copier = Some(match gpu {
                    Some(o) => Box::new(CudaCopier::new(o, cuda::bus_id(o)?)?),
                    None => Box::new(HostCopier::new()),
                });
                Ok(true)
            }
        }
    }

    fn take_slot(&mut self) -> Option<u32> {
        if self.slots.is_empty() {
            self.slots = (0..MANAGED).map(|_| Managed::Free).collect();
        }
        self.free.pop()
    }

    /// A bounce buffer back to the pool, and the pool trimmed to its cap.
    fn put_back(&mut self, b: Bounce) {
        self.pool.put(b);
        if let Some(c) = self.copier.as_deref_mut() {
            self.pool.trim(self.pool_cap, &*self.registrar, c);
        }
    }

    fn release_slot(&mut self, m: u32) {
        if let Managed::SendStaged { bounce, .. } | Managed::SendPosted { bounce: Some(bounce), .. } =
            std::mem::replace(&mut self.slots[m as usize], Managed::Free)
        {
            self.put_back(bounce);
        }
        self.free.push(m);
    }

    /// Count the completed chunks of staged send `m`'s copy; returns (bytes ready, size).
    fn advance(&mut self, m: u32) -> Result<(usize, usize)> {
        let copier = match self.copier.as_deref_mut() {
            Some(c) => c,
            None => return Err(Error::internal("staging: a staged send on a comm without a copier")),
        };
        let Managed::SendStaged { chunks, size, .. } = &mut self.slots[m as usize] else {
            return Err(Error::internal("staging: a partial send in an unexpected state"));
        };
        while chunks.done < chunks.n && copier.reached(m as usize * MAX_CHUNKS + chunks.done)? {
            chunks.done += 1;
        }
        Ok((chunks.ready(), *size))
    }

    /// Tell the transport how much more of each partially handed-over send is ready, then hand
    /// waiting sends over in order, as far as copies and back-pressure allow.
    fn progress_sends(&mut self) -> Result<()> {
        let mut i = 0;
        while i < self.partial.len() {
            let m = self.partial[i];
            let (ready, size) = self.advance(m)?;
            let Managed::SendStaged { inner: Some(inner), .. } = &self.slots[m as usize] else {
                return Err(Error::internal("staging: a partial send in an unexpected state"));
            };
            let inner = *inner;
            // Also when the mark has not moved: the transport progresses the bytes that are ready.
            self.inner.set_ready(inner, ready)?;
            if ready == size {
                self.partial.swap_remove(i);
                if let Managed::SendStaged { bounce, .. } = std::mem::replace(&mut self.slots[m as usize], Managed::Free) {
                    self.slots[m as usize] = Managed::SendPosted { inner, bounce: Some(bounce) };
                }
            } else {
                i += 1;
            }
        }
        while let Some(&m) = self.queue.front() {
            let (data, tag, mr, ready) = match &self.slots[m as usize] {
                Managed::SendStaged { .. } => {
                    let (ready, size) = self.advance(m)?;
                    let Managed::SendStaged { bounce, tag, .. } = &self.slots[m as usize] else { unreachable!() };
                    if ready == 0 && size > 0 {
                        return Ok(()); // not even the first chunk yet
                    }
                    // SAFETY: the bounce buffer holds at least `size` bytes (the pool's class for
                    // it), stays with this send's slot until the transport reports the send done
                    // (`release_slot`), and goes back to the system only after the transport's
                    // comm is dropped (`Drop for Staged`); the copy into it only writes bytes
                    // beyond `ready`, which the transport does not read before `set_ready`.
                    (unsafe { Lent::new(bounce.ptr, size) }, *tag, Some(bounce.mr), ready)
                }
                Managed::SendWaiting { data, tag, mr } => {
                    // SAFETY: the buffer NCCL lent for this very send, handed on to the
                    // transport for it; the slot's own hold on it ends once the transport takes
                    // the send (the slot becomes SendPosted), or is handed on again next time.
                    (unsafe { Lent::new(data.ptr(), data.len()) }, *tag, *mr, data.len())
                }
                _ => return Err(Error::internal("staging: a queued send in an unexpected state")),
            };
            let size = data.len();
            let Some(inner) = self.inner.isend_partial(data, tag, mr.as_ref(), ready)? else { return Ok(()) };
            self.queue.pop_front();
            let slot = &mut self.slots[m as usize];
            match slot {
                Managed::SendStaged { inner: i, .. } if ready < size => {
                    *i = Some(inner);
                    self.partial.push(m);
                    self.stats.pipelined += 1;
                }
                _ => {
                    let bounce = match std::mem::replace(slot, Managed::Free) {
                        Managed::SendStaged { bounce, .. } => Some(bounce),
                        _ => None,
                    };
                    *slot = Managed::SendPosted { inner, bounce };
                }
            }
        }
        Ok(())
    }

    /// Staged sends not yet wholly handed to the transport, or handed over with posts that
    /// wait for room in its send queues: they need calls on this comm to move.
    #[inline]
    pub fn has_pending_sends(&self) -> bool {
        !self.queue.is_empty() || !self.partial.is_empty() || self.inner.has_deferred()
    }

    /// Move pending staged sends on (called from other comms' calls, see `plugin::test`).
    pub fn progress_pending(&mut self) -> Result<()> {
        if !self.queue.is_empty() || !self.partial.is_empty() {
            self.progress_sends()?;
        }
        if self.inner.has_deferred() {
            self.inner.progress_deferred()?;
        }
        Ok(())
    }

    /// Nothing to stage or count: no copier (so no staged request, and no send queued behind
    /// one) and no RIVET_STATS. A `test` of such a comm goes straight to the transport.
    #[inline(always)]
    fn direct(&self) -> bool {
        self.copier.is_none() && !self.stats_on
    }

    fn managed_id(&self, m: u32) -> u32 {
        self.icap as u32 + m
    }
}

// The data path's calls of a request the transport holds (every one not staged) are inline in
// the core's calls, with the rest out of line: this layer costs an unstaged message a few checks.
impl Conn for Staged {
    #[inline]
    fn isend(&mut self, data: Lent, tag: i32, mr: Option<&MrInfo>) -> Result<Option<u32>> {
        let path = path_of(mr);
        let size = data.len();
        if path != Path::Staged && self.queue.is_empty() {
            // Nothing staged ahead of it: straight through, the rest out of line.
            let r = self.inner.isend(data, tag, mr)?;
            if r.is_some() && self.stats_on {
                self.stats.add(path, size);
            }
            return Ok(r);
        }
        self.isend_managed(data, tag, mr)
    }

    #[inline]
    fn irecv(&mut self, bufs: &mut [RecvBuf]) -> Result<Option<u32>> {
        if !bufs.iter().any(|b| path_of(b.mr.as_ref()) == Path::Staged) {
            if !self.stats_on {
                return self.inner.irecv(bufs);
            }
            // Read before the transport takes the buffers.
            let mut paths = [Path::Host; MAX_RECVS];
            for (p, b) in paths.iter_mut().zip(bufs.iter()) {
                *p = path_of(b.mr.as_ref());
            }
            let r = self.inner.irecv(bufs)?;
            if let Some(s) = r {
                self.recv_path[s as usize] = paths;
            }
            return Ok(r);
        }
        self.irecv_managed(bufs)
    }

    fn iflush(&mut self, bufs: &mut [RecvBuf]) -> Result<Option<u32>> {
        // Staged receives are complete once their host → device copy is: nothing to flush.
        let mut rest = [RecvBuf::EMPTY; MAX_RECVS];
        let mut n = 0;
        for b in bufs.iter_mut().filter(|b| path_of(b.mr.as_ref()) != Path::Staged) {
            rest[n] = std::mem::take(b);
            n += 1;
        }
        if n == 0 {
            return Ok(None);
        }
        self.inner.iflush(&mut rest[..n])
    }

    #[inline(always)]
    fn test(&mut self, slot: u32, sizes: &mut [usize; MAX_RECVS]) -> Result<Option<usize>> {
        if self.direct() {
            return self.inner.test(slot, sizes);
        }
        self.test_staging(slot, sizes)
    }

    fn capacity(&self) -> usize {
        self.icap + MANAGED
    }

    fn net_events(&self, size: usize, out: &mut Vec<crate::transport::NetEvent>) {
        self.inner.net_events(size, out)
    }
}

impl Staged {
    /// `test` of a comm that stages or counts.
    #[inline(never)]
    fn test_staging(&mut self, slot: u32, sizes: &mut [usize; MAX_RECVS]) -> Result<Option<usize>> {
        if !self.queue.is_empty() || !self.partial.is_empty() {
            self.progress_sends()?;
        }
        // A request the transport holds (every one not staged): straight through, the rest out
        // of line, off the path of every message that is not staged.
        let slot = slot as usize;
        if slot >= self.icap {
            return self.test_managed(slot - self.icap, sizes);
        }
        if self.send || !self.stats_on {
            return self.inner.test(slot as u32, sizes);
        }
        let r = self.inner.test(slot as u32, sizes)?;
        if let Some(n) = r {
            self.count_received(slot, n, sizes);
        }
        Ok(r)
    }
}

impl Staged {
    /// `irecv` with staged buffers: each lands in a bounce buffer first.
    #[inline(never)]
    fn irecv_managed(&mut self, bufs: &mut [RecvBuf]) -> Result<Option<u32>> {
        let Some(m) = self.take_slot() else { return Ok(None) };
        let mut staged: [Option<(Lent, Bounce)>; MAX_RECVS] = Default::default();
        let mut posted = [RecvBuf::EMPTY; MAX_RECVS];
        let mut res = Ok(());
        for (i, b) in bufs.iter_mut().enumerate() {
            posted[i] = std::mem::take(b);
            let b = &mut posted[i];
            if path_of(b.mr.as_ref()) != Path::Staged {
                continue;
            }
            if let Err(e) = self.ensure_copier(gpu_of(b.mr.as_ref())) {
                res = Err(e);
                break;
            }
            let copier = self.copier.as_deref_mut().expect("ensured above");
            match self.pool.get(b.buf.len(), copier, &*self.registrar) {
                Ok(bounce) => {
                    let len = b.buf.len();
                    // SAFETY: the bounce buffer holds at least the receive buffer's size, stays
                    // with this receive's slot until its copy to the GPU is fenced, and is freed
                    // only after the transport's comm is dropped (`Drop for Staged`); nothing
                    // else uses it meanwhile. NCCL's buffer stays lent in `staged`.
                    let user = std::mem::replace(&mut b.buf, unsafe { Lent::new(bounce.ptr, len) });
                    b.mr = Some(bounce.mr);
                    staged[i] = Some((user, bounce));
                }
                Err(e) => {
                    res = Err(e);
                    break;
                }
            }
        }
        let r = res.and_then(|_| self.inner.irecv(&mut posted[..bufs.len()]));
        match r {
            Ok(Some(inner)) => {
                self.slots[m as usize] = Managed::RecvPosted { inner, n: bufs.len(), staged };
                Ok(Some(self.managed_id(m)))
            }
            other => {
                for (_, b) in staged.into_iter().flatten() {
                    self.put_back(b);
                }
                self.free.push(m);
                other.map(|_| None)
            }
        }
    }

    /// `isend` of a send this layer manages: staged (GPU memory the NIC does not reach), or
    /// waiting behind one.
    #[inline(never)]
    fn isend_managed(&mut self, data: Lent, tag: i32, mr: Option<&MrInfo>) -> Result<Option<u32>> {
        let path = path_of(mr);
        let size = data.len();
        if path != Path::Staged {
            let Some(m) = self.take_slot() else { return Ok(None) };
            self.slots[m as usize] = Managed::SendWaiting { data, tag, mr: mr.copied() };
            self.queue.push_back(m);
            if self.stats_on {
                self.stats.add(path, size);
            }
            self.progress_sends()?;
            return Ok(Some(self.managed_id(m)));
        }
        self.ensure_copier(gpu_of(mr))?;
        let Some(m) = self.take_slot() else { return Ok(None) };
        let copier = self.copier.as_deref_mut().expect("ensured above");
        let bounce = match self.pool.get(size, copier, &*self.registrar) {
            Ok(b) => b,
            Err(e) => {
                self.free.push(m);
                return Err(e);
            }
        };
        let chunks = Chunks::split(size);
        let r = (|| {
            let mut lo = 0;
            for c in 0..chunks.n {
                let hi = chunks.ends[c];
                if hi > lo {
                    // SAFETY: `[lo, hi)` is inside both the bounce buffer (of at least `size`
                    // bytes) and the lent send buffer; the send's slot keeps the bounce buffer,
                    // and the lender the send buffer, until the send completes, after its fences.
                    unsafe { copier.to_host(bounce.ptr.add(lo), data.addr() + lo, hi - lo)? };
                }
                copier.fence(m as usize * MAX_CHUNKS + c)?;
                lo = hi;
            }
            Ok(())
        })();
        self.slots[m as usize] = Managed::SendStaged { bounce, size, tag, chunks, inner: None };
        if let Err(e) = r {
            self.release_slot(m);
            return Err(e);
        }
        self.queue.push_back(m);
        if self.stats_on {
            self.stats.add(Path::Staged, size);
        }
        self.progress_sends()?;
        Ok(Some(self.managed_id(m)))
    }

    #[inline(never)]
    fn count_received(&mut self, slot: usize, n: usize, sizes: &[usize; MAX_RECVS]) {
        for (i, s) in sizes.iter().enumerate().take(n) {
            self.stats.add(self.recv_path[slot][i], *s);
        }
    }

    /// `test` of a request this layer manages (`m`: its managed slot): a staged send or receive.
    #[inline(never)]
    fn test_managed(&mut self, m: usize, sizes: &mut [usize; MAX_RECVS]) -> Result<Option<usize>> {
        if m >= MANAGED {
            return Err(Error::internal("request slot out of range"));
        }
        let Some(slot) = self.slots.get_mut(m) else {
            return Err(Error::internal("test on a request that is not in flight (already completed?)"));
        };
        match slot {
            Managed::Free => Err(Error::internal("test on a request that is not in flight (already completed?)")),
            Managed::SendStaged { .. } | Managed::SendWaiting { .. } => Ok(None),
            Managed::SendPosted { inner, .. } => {
                let r = self.inner.test(*inner, sizes)?;
                if r.is_some() {
                    self.release_slot(m as u32);
                }
                Ok(r)
            }
            Managed::RecvPosted { inner, n, staged } => {
                let Some(got) = self.inner.test(*inner, sizes)? else { return Ok(None) };
                let (n, staged) = (*n, std::mem::take(staged));
                debug_assert_eq!(got, n);
                let r = self.copier().and_then(|copier| {
                    for (i, s) in staged.iter().enumerate() {
                        if let Some((dst, b)) = s {
                            if sizes[i] > 0 {
                                // SAFETY: `sizes[i]` bytes arrived in the bounce buffer, which is
                                // kept until this receive's fence; `dst` is the receive's GPU buffer
                                // of at least that size, NCCL's until the receive completes.
                                unsafe { copier.to_device(dst.addr(), b.ptr, sizes[i])? };
                            }
                        }
                    }
                    copier.fence(m * MAX_CHUNKS)
                });
                if let Err(e) = r {
                    // The bounces go back to the pool (never freed with their registration
                    // still cached), and the request is over.
                    for (_, b) in staged.into_iter().flatten() {
                        self.put_back(b);
                    }
                    self.slots[m] = Managed::Free;
                    self.free.push(m as u32);
                    return Err(e);
                }
                if self.stats_on {
                    for (i, s) in staged.iter().enumerate().take(n) {
                        self.stats.add(if s.is_some() { Path::Staged } else { Path::Host }, sizes[i]);
                    }
                }
                self.slots[m] = Managed::RecvCopying { n, sizes: *sizes, staged };
                Ok(None)
            }
            Managed::RecvCopying { .. } => {
                if !self.copier()?.reached(m * MAX_CHUNKS)? {
                    return Ok(None);
                }
                let Managed::RecvCopying { n, sizes: got, staged } = std::mem::replace(&mut self.slots[m], Managed::Free)
                else {
                    unreachable!()
                };
                for (_, b) in staged.into_iter().flatten() {
                    self.put_back(b);
                }
                self.free.push(m as u32);
                sizes[..n].copy_from_slice(&got[..n]);
                Ok(Some(n))
            }
        }
    }
}

fn human(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        // The network stops first, then, once the copies are done, bounce buffers go.
        // SAFETY: dropped once, here; `inner` is not used after this line.
        unsafe { ManuallyDrop::drop(&mut self.inner) };
        let drained = self.copier.as_deref_mut().map_or(true, |c| c.idle());
        for m in 0..self.slots.len() as u32 {
            if !matches!(self.slots[m as usize], Managed::Free) {
                if let Managed::RecvPosted { staged, .. } | Managed::RecvCopying { staged, .. } =
                    std::mem::replace(&mut self.slots[m as usize], Managed::Free)
                {
                    for (_, b) in staged.into_iter().flatten() {
                        self.pool.put(b);
                    }
                }
                self.release_slot(m);
            }
        }
        match (drained, self.copier.take()) {
            (true, Some(mut c)) => self.pool.clear(&*self.registrar, &mut *c),
            (false, Some(c)) => {
                // Copies may still write into the bounce buffers: they stay (with their
                // registrations and the copier) until a later close or new comm finds the copies
                // done; the close does not wait.
                log::info!("NET/rivet: {}: staging copies still running at close: their bounce buffers are freed once they finish", self.label);
                let registrar = std::mem::replace(&mut self.registrar, Box::new(NoRegistration));
                remains::leave(c, registrar, std::mem::take(&mut self.pool));
            }
            (_, None) => {}
        }
        remains::reap();
        if self.stats_on {
            let s = &self.stats.by_path;
            let total: u64 = s.iter().map(|c| c.bytes).sum();
            let msgs: u64 = s.iter().map(|c| c.msgs).sum();
            log::info!(
                target: crate::log::INIT,
                "NET/rivet: stats {} closed: {} {} in {msgs} messages: GDR {} / {}, staged {} / {}, host {} / {}{}",
                self.label,
                if self.send { "sent" } else { "received" },
                human(total),
                human(s[Path::Gdr as usize].bytes),
                s[Path::Gdr as usize].msgs,
                human(s[Path::Staged as usize].bytes),
                s[Path::Staged as usize].msgs,
                human(s[Path::Host as usize].bytes),
                s[Path::Host as usize].msgs,
                if self.stats.pipelined > 0 {
                    format!(" ({} staged sends pipelined with their copy)", self.stats.pipelined)
                } else {
                    String::new()
                },
            );
        }
    }
}

#[cfg(test)]
mod tests;
