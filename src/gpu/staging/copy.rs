//! The staging engine's copiers (CUDA streams and events, or a plain memcpy for the CPU tests)
//! and its pool of pinned, registered bounce buffers.

use std::sync::atomic::{AtomicUsize, Ordering};
use super::FENCES;
use crate::error::Result;
use crate::gpu::cuda;
use crate::transport::MrInfo;
use std::mem::ManuallyDrop;

/// Moves bytes between device and host memory, asynchronously, in batches ended by a fence.
pub trait Copier: Send {
    /// The CUDA device whose memory it copies (None: the host copier).
    fn gpu(&self) -> Option<i32>;
    /// Memory the transport may read and write, and the copier may copy to and from.
    fn alloc(&mut self, len: usize) -> Result<HostMem>;
    /// Copy `len` bytes of device memory at `src` to host memory at `dst`, by the next fence.
    ///
    /// # Safety
    /// `[dst, dst+len)` is host memory from `alloc` and `[src, src+len)` device memory of this
    /// copier's GPU (any memory, for the host copier), both left alone until the fence after this
    /// copy is reached (or the copier drained).
    unsafe fn to_host(&mut self, dst: *mut u8, src: usize, len: usize) -> Result<()>;
    /// Copy `len` bytes of host memory at `src` to device memory at `dst`, by the next fence.
    ///
    /// # Safety
    /// As for `to_host`, the other way round.
    unsafe fn to_device(&mut self, dst: usize, src: *const u8, len: usize) -> Result<()>;
    /// End the batch of copies issued since the last fence; `id` < FENCES names it.
    fn fence(&mut self, id: usize) -> Result<()>;
    /// Whether every copy before fence `id` has completed.
    fn reached(&mut self, id: usize) -> Result<bool>;
    /// Whether every copy issued has completed (before bounce buffers are freed), without
    /// waiting: a close whose copies still run leaves its buffers for later (`remains`). Asked
    /// only at and after a close, so a copier may drop copies it has not started (the host
    /// copier does).
    fn idle(&mut self) -> bool;
    /// Whether no copy issued is still to run or running, without side effects (unlike `idle`,
    /// asked while the comm is in use: before pooled bounce buffers above the pool's cap are
    /// freed). The default, false, never lets them be freed before the close.
    fn quiet(&mut self) -> bool {
        false
    }
    /// Free bounce memory (CUDA: inside the GPU's context).
    fn free(&mut self, mem: HostMem) {
        drop(mem);
    }
}

/// Bounce memory: pinned by CUDA, or plain pages for the host copier.
pub enum HostMem {
    Pinned(cuda::PinnedBuf),
    Plain(Vec<u8>),
}

impl HostMem {
    fn ptr(&mut self) -> *mut u8 {
        match self {
            HostMem::Pinned(p) => p.ptr(),
            HostMem::Plain(v) => v.as_mut_ptr(),
        }
    }
}

/// Registers bounce buffers with the comm's transport (verbs: an MR on the comm's device).
pub trait Registrar: Send {
    /// The registration, and a handle to release it with.
    fn register(&self, addr: usize, len: usize) -> Result<(MrInfo, usize)>;
    fn release(&self, handle: usize);
}

/// TCP: nothing to register.
pub struct NoRegistration;

impl Registrar for NoRegistration {
    fn register(&self, addr: usize, len: usize) -> Result<(MrInfo, usize)> {
        Ok((MrInfo { addr, len, ..Default::default() }, 0))
    }
    fn release(&self, _: usize) {}
}

// ---------------------------------------------------------------------------------------------
// Copiers.

/// Copies on one CUDA stream of the GPU that owns the comm's buffers.
pub struct CudaCopier {
    stream: ManuallyDrop<cuda::Stream>,
    ctx: ManuallyDrop<cuda::Context>,
    pub ordinal: i32,
    pub bus_id: String,
}

impl CudaCopier {
    pub fn new(ordinal: i32, bus_id: String) -> Result<CudaCopier> {
        let ctx = cuda::Context::primary(ordinal)?;
        let stream = ctx.with(|| cuda::Stream::new(FENCES))?;
        Ok(CudaCopier { stream: ManuallyDrop::new(stream), ctx: ManuallyDrop::new(ctx), ordinal, bus_id })
    }
}

impl Copier for CudaCopier {
    fn gpu(&self) -> Option<i32> {
        Some(self.ordinal)
    }
    fn alloc(&mut self, len: usize) -> Result<HostMem> {
        self.ctx.with(|| cuda::PinnedBuf::new(len)).map(HostMem::Pinned)
    }
    unsafe fn to_host(&mut self, dst: *mut u8, src: usize, len: usize) -> Result<()> {
        let s = &mut self.stream;
        // SAFETY: the caller's promise (this function's contract is the stream's), and `with`
        // makes the stream's context current.
        self.ctx.with(|| unsafe { s.to_host(dst, src, len) })
    }
    unsafe fn to_device(&mut self, dst: usize, src: *const u8, len: usize) -> Result<()> {
        let s = &mut self.stream;
        // SAFETY: as for to_host.
        self.ctx.with(|| unsafe { s.to_device(dst, src, len) })
    }
    fn fence(&mut self, id: usize) -> Result<()> {
        let s = &mut self.stream;
        self.ctx.with(|| s.record(id))
    }
    fn reached(&mut self, id: usize) -> Result<bool> {
        let s = &self.stream;
        self.ctx.with(|| s.reached(id))
    }
    fn idle(&mut self) -> bool {
        let s = &self.stream;
        self.ctx.with(|| Ok(s.idle())).unwrap_or(false)
    }
    fn quiet(&mut self) -> bool {
        self.idle()
    }
    fn free(&mut self, mem: HostMem) {
        let _ = self.ctx.with(|| {
            drop(mem);
            Ok(())
        });
    }
}

impl Drop for CudaCopier {
    fn drop(&mut self) {
        // The stream goes first, inside its context; then the context is released.
        // SAFETY: taken once, in drop; neither field is used afterwards.
        let ctx = unsafe { ManuallyDrop::take(&mut self.ctx) };
        // SAFETY: as above.
        let stream = unsafe { ManuallyDrop::take(&mut self.stream) };
        let _ = ctx.with(|| {
            drop(stream);
            Ok(())
        });
        drop(ctx);
    }
}

/// memcpy between host buffers, standing in for the GPU in tests: copies run when their fence
/// is first polled, and that poll still says "not reached", so the engine's waiting is exercised.
/// One deferred copy: (destination, source, length).
type HostCopy = (usize, usize, usize);

#[derive(Default)]
pub struct HostCopier {
    pending: Vec<HostCopy>,
    /// Per fence: its copies, and whether they have run.
    batches: Vec<(Vec<HostCopy>, bool)>,
}

impl HostCopier {
    pub fn new() -> HostCopier {
        HostCopier { pending: Vec::new(), batches: (0..FENCES).map(|_| (Vec::new(), true)).collect() }
    }
    /// # Safety
    /// Every copy of the batch was issued under `to_host`'s or `to_device`'s contract, whose
    /// fence is being reached now: both ranges are still valid and left alone.
    unsafe fn run(batch: &mut Vec<HostCopy>) {
        for (dst, src, len) in batch.drain(..) {
            // SAFETY: the function's contract; the ranges are distinct buffers (a bounce buffer
            // and the GPU-side one), so they do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) };
        }
    }
}

impl Copier for HostCopier {
    fn gpu(&self) -> Option<i32> {
        None
    }
    fn alloc(&mut self, len: usize) -> Result<HostMem> {
        Ok(HostMem::Plain(vec![0u8; len.max(1)]))
    }
    unsafe fn to_host(&mut self, dst: *mut u8, src: usize, len: usize) -> Result<()> {
        self.pending.push((dst as usize, src, len));
        Ok(())
    }
    unsafe fn to_device(&mut self, dst: usize, src: *const u8, len: usize) -> Result<()> {
        self.pending.push((dst, src as usize, len));
        Ok(())
    }
    fn fence(&mut self, id: usize) -> Result<()> {
        let b = &mut self.batches[id];
        // A fence reused before it was reached belonged to a cancelled request.
        b.0.clear();
        b.0.append(&mut self.pending);
        b.1 = false;
        Ok(())
    }
    fn reached(&mut self, id: usize) -> Result<bool> {
        let b = &mut self.batches[id];
        if b.1 {
            return Ok(true);
        }
        // SAFETY: the batch's copies were issued under to_host's and to_device's contract, and
        // this is their fence being reached.
        unsafe { Self::run(&mut b.0) };
        b.1 = true;
        Ok(false)
    }
    fn quiet(&mut self) -> bool {
        self.pending.is_empty() && self.batches.iter().all(|b| b.1 || b.0.is_empty())
    }
    fn idle(&mut self) -> bool {
        // Copies not yet run are dropped, as a cancelled asynchronous copy would be: at close the
        // buffers they name may already be gone.
        self.pending.clear();
        for b in &mut self.batches {
            b.0.clear();
        }
        true
    }
}

// ---------------------------------------------------------------------------------------------
// The bounce buffer pool.

pub(super) struct Bounce {
    pub(super) mem: HostMem,
    pub(super) ptr: *mut u8,
    /// The bounce buffer's registration with the transport.
    pub(super) mr: MrInfo,
    pub(super) handle: usize,
    pub(super) class: usize,
}

pub(super) const MIN_CLASS: usize = 12; // 4 KiB

pub(super) fn class_of(len: usize) -> usize {
    (usize::BITS - (len.max(1) - 1).leading_zeros()).max(MIN_CLASS as u32) as usize
}

/// Bytes of bounce buffers pooled and not in use, in every comm of the process: what
/// RIVET_STAGING_POOL_MAX caps.
static IDLE_BYTES: AtomicUsize = AtomicUsize::new(0);

#[derive(Default)]
pub(super) struct Pool {
    pub(super) free: Vec<Vec<Bounce>>,
    /// Bytes allocated by this pool and not yet freed (in use or not).
    pub(super) bytes: usize,
    /// Of those, the bytes in `free`.
    pub(super) idle: usize,
}

impl Drop for Pool {
    fn drop(&mut self) {
        IDLE_BYTES.fetch_sub(self.idle, Ordering::Relaxed);
    }
}

impl Pool {
    pub(super) fn get(&mut self, len: usize, copier: &mut dyn Copier, reg: &dyn Registrar) -> Result<Bounce> {
        let class = class_of(len);
        if self.free.len() <= class {
            self.free.resize_with(class + 1, Vec::new);
        }
        if let Some(b) = self.free[class].pop() {
            self.idle -= 1 << class;
            IDLE_BYTES.fetch_sub(1 << class, Ordering::Relaxed);
            return Ok(b);
        }
        let size = 1usize << class;
        let mut mem = copier.alloc(size)?;
        let ptr = mem.ptr();
        let (mr, handle) = match reg.register(ptr as usize, size) {
            Ok(r) => r,
            Err(e) => {
                copier.free(mem);
                return Err(e);
            }
        };
        self.bytes += size;
        log::trace!("NET/rivet: staging pool: new {size}-byte bounce buffer at {ptr:p} ({} bytes pooled)", self.bytes);
        Ok(Bounce { mem, ptr, mr, handle, class })
    }

    pub(super) fn put(&mut self, b: Bounce) {
        let c = b.class;
        self.idle += 1 << c;
        IDLE_BYTES.fetch_add(1 << c, Ordering::Relaxed);
        self.free[c].push(b);
    }

    /// While the process's unused pooled bytes exceed `cap` and no copy of this comm's copier is
    /// still to run, free this pool's unused buffers, largest first. The bytes freed.
    pub(super) fn trim(&mut self, cap: usize, reg: &dyn Registrar, copier: &mut dyn Copier) -> usize {
        if IDLE_BYTES.load(Ordering::Relaxed) <= cap || self.idle == 0 || !copier.quiet() {
            return 0;
        }
        let mut freed = 0;
        for class in (0..self.free.len()).rev() {
            while IDLE_BYTES.load(Ordering::Relaxed) > cap {
                let Some(b) = self.free[class].pop() else { break };
                let size = 1usize << class;
                reg.release(b.handle);
                copier.free(b.mem);
                self.idle -= size;
                self.bytes -= size;
                IDLE_BYTES.fetch_sub(size, Ordering::Relaxed);
                freed += size;
            }
        }
        if freed > 0 {
            log::trace!("NET/rivet: staging pool: freed {freed} bytes above RIVET_STAGING_POOL_MAX={cap} ({} bytes pooled here)", self.bytes);
        }
        freed
    }

    /// Release every pooled buffer: its registration first, then its memory.
    pub(super) fn clear(&mut self, reg: &dyn Registrar, copier: &mut dyn Copier) {
        for b in self.free.drain(..).flatten() {
            reg.release(b.handle);
            copier.free(b.mem);
        }
        IDLE_BYTES.fetch_sub(self.idle, Ordering::Relaxed);
        self.idle = 0;
        self.bytes = 0;
    }
}

