//! The CUDA driver API, loaded at run time through `cudarc` (dynamic loading). Nothing here runs
//! unless a CUDA pointer reaches the plugin or a caller asks for the GPU facts.
//!
//! cudarc panics when libcuda is absent or lacks a symbol, so `get()` checks the library and
//! every symbol rivet calls before the first call, and a host without a GPU or driver gets one
//! INFO line saying why rivet is host-only. Every call returns a `CUresult` that becomes an
//! `Error` naming the call and the driver's error name.

use crate::error::{Error, Result};
use cudarc::driver::sys as cu;
use std::ffi::c_void;
use std::sync::OnceLock;

/// Every driver entry point rivet calls (checked for presence before the first call).
const SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetPCIBusId",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuPointerGetAttribute",
    "cuCtxGetCurrent",
    "cuCtxGetDevice",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuStreamCreate",
    "cuStreamQuery",
    "cuStreamDestroy_v2",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventDestroy_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuGetErrorName",
];

/// The loaded driver: its version and device count.
#[derive(Debug)]
pub struct Cuda {
    pub driver_version: i32,
    pub devices: i32,
}

static CUDA: OnceLock<std::result::Result<Cuda, String>> = OnceLock::new();

fn name_of(r: cu::CUresult) -> String {
    let mut p: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName(CUresult, const char **) only stores one pointer through its second
    // argument, here `&mut p`, a live local. cudarc resolves the symbol from libcuda on first use;
    // `get()` checked that it exists (were it missing, cudarc would panic, not misbehave).
    if unsafe { cu::cuGetErrorName(r, &mut p) } == cu::CUresult::CUDA_SUCCESS && !p.is_null() {
        // SAFETY: on CUDA_SUCCESS the driver has set `p` (checked non-NULL just above) to a
        // NUL-terminated string with static lifetime inside libcuda, so reading it up to its NUL is
        // valid; it is copied into a String at once.
        return unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned();
    }
    format!("{r:?}")
}

/// A driver call's result as an error naming the call.
pub fn check(r: cu::CUresult, what: &str) -> Result<()> {
    if r == cu::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(Error::system(format!("{what} failed: {}", name_of(r))))
}

fn load() -> std::result::Result<Cuda, String> {
    // SAFETY: is_culib_present only dlopens (and closes again) the candidate names of libcuda; it
    // is `unsafe` because loading a library runs its initialisers, which for the NVIDIA driver
    // library are trusted. No driver function is called here.
    if !unsafe { cu::is_culib_present() } {
        return Err("libcuda.so.1 not found (no NVIDIA driver on this host, or not on the loader path)".into());
    }
    // SAFETY: as above: this dlopens libcuda, just found loadable, and keeps it open in cudarc's
    // static for the life of the process; no driver function is called. (Should it fail after all,
    // cudarc panics, which `get()` catches.)
    let lib = unsafe { cu::culib() };
    for s in SYMBOLS {
        // SAFETY: the symbol is only looked up, as an untyped `*const c_void` that is never
        // dereferenced or called, so the type given to libloading need not match the symbol's C
        // prototype.
        if unsafe { lib.get::<*const c_void>(s.as_bytes()) }.is_err() {
            return Err(format!("the CUDA driver lacks {s} (driver too old; rivet needs CUDA 11.3 or newer)"));
        }
    }
    // SAFETY: every symbol in SYMBOLS, cuInit among them, was found above, so cudarc's lazy lookup
    // cannot fail; cuInit(unsigned int Flags) takes no pointers, and Flags must be 0.
    let r = unsafe { cu::cuInit(0) };
    if r != cu::CUresult::CUDA_SUCCESS {
        return Err(format!("cuInit failed: {} (no usable GPU, or the driver and kernel module disagree)", name_of(r)));
    }
    let mut driver_version = 0;
    let mut devices = 0;
    // SAFETY: cuInit succeeded; cuDriverGetVersion(int *) and cuDeviceGetCount(int *) each write
    // one int through their argument, here live locals. Their CUresults are ignored: on failure the
    // local keeps its 0 (and a device count of 0 is rejected below).
    unsafe {
        cu::cuDriverGetVersion(&mut driver_version);
        cu::cuDeviceGetCount(&mut devices);
    }
    if devices == 0 {
        return Err("the CUDA driver sees no GPU".into());
    }
    Ok(Cuda { driver_version, devices })
}

/// The driver, loaded once; `Err` says why rivet is host-only (logged once at INFO).
pub fn get() -> std::result::Result<&'static Cuda, &'static str> {
    let r = CUDA.get_or_init(|| {
        // cudarc panics on a missing library or symbol; the checks above should prevent it, and
        // this keeps any that slips through inside the plugin.
        let r = std::panic::catch_unwind(load).unwrap_or_else(|_| Err("loading the CUDA driver panicked".into()));
        match &r {
            Ok(c) => log::info!(
                target: crate::log::INIT,
                "NET/rivet: CUDA driver {}.{} with {} GPU(s)",
                c.driver_version / 1000,
                c.driver_version % 1000 / 10,
                c.devices
            ),
            Err(why) => log::info!(target: crate::log::INIT, "NET/rivet: host memory only: {why}"),
        }
        r
    });
    r.as_ref().map_err(|s| s.as_str())
}

/// What the driver says about a pointer NCCL registers as `NCCL_PTR_CUDA`.
#[derive(Debug, Clone)]
pub struct PtrInfo {
    pub ordinal: i32,
    /// PCI bus id in sysfs form, lower case ("0000:18:00.0").
    pub bus_id: String,
}

fn attr_i32(attr: cu::CUdevice_attribute, dev: cu::CUdevice) -> Result<i32> {
    let mut v = 0;
    // SAFETY: cuDeviceGetAttribute(int *, CUdevice_attribute, CUdevice) writes one int to `v`, a
    // live local; an unknown attribute or device is an error return. Callers run after `get()`
    // loaded and checked the driver (without it: cudarc's panic or NOT_INITIALIZED, never UB).
    check(unsafe { cu::cuDeviceGetAttribute(&mut v, attr, dev) }, "cuDeviceGetAttribute")?;
    Ok(v)
}

pub fn bus_id(ordinal: i32) -> Result<String> {
    let mut dev = 0;
    // SAFETY: cuDeviceGet(CUdevice *, int) writes one CUdevice (an int) to the live local `dev`; an
    // ordinal out of range is CUDA_ERROR_INVALID_DEVICE, not UB.
    check(unsafe { cu::cuDeviceGet(&mut dev, ordinal) }, "cuDeviceGet")?;
    let mut buf = [0 as std::ffi::c_char; 32];
    // SAFETY: `buf` is a local array of 32 c_chars and `len` is passed as exactly its length, so
    // cuDeviceGetPCIBusId, which writes at most `len` bytes including the NUL, stays inside it;
    // `dev` came from cuDeviceGet above.
    check(unsafe { cu::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) }, "cuDeviceGetPCIBusId")?;
    // SAFETY: cuDeviceGetPCIBusId succeeded, so `buf` holds a NUL-terminated bus id
    // ("0000:18:00.0", 13 bytes with the NUL) within its 32 bytes; `buf` outlives the CStr, which
    // is copied into a String at once.
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().to_ascii_lowercase();
    Ok(s)
}

/// GPU-side GPUDirect facts of device `ordinal`: (GPUDirect RDMA supported, dma-buf supported).
pub fn gdr_attributes(ordinal: i32) -> Result<(bool, bool)> {
    let mut dev = 0;
    // SAFETY: cuDeviceGet(CUdevice *, int) writes one CUdevice to the live local `dev`; a bad
    // ordinal is an error return. The driver was loaded by `get()` before any caller gets here.
    check(unsafe { cu::cuDeviceGet(&mut dev, ordinal) }, "cuDeviceGet")?;
    let gdr = attr_i32(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, dev)? != 0;
    let dmabuf = attr_i32(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev)? != 0;
    Ok((gdr, dmabuf))
}

/// Whether the calling thread's current GPU takes dma-buf registrations: None when the thread has
/// no current context (NCCL calls getProperties with its rank's GPU current).
pub fn current_gpu_dmabuf() -> Option<bool> {
    get().ok()?;
    let mut ctx: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: cuCtxGetCurrent(CUcontext *) stores one pointer into the live local `ctx`; the
    // driver was loaded and its symbols checked by `get()` above.
    if unsafe { cu::cuCtxGetCurrent(&mut ctx) } != cu::CUresult::CUDA_SUCCESS || ctx.is_null() {
        return None;
    }
    let mut dev: cu::CUdevice = 0;
    // SAFETY: cuCtxGetDevice(CUdevice *) writes the current context's device to the live local
    // `dev`; the thread has a current context (checked above).
    if unsafe { cu::cuCtxGetDevice(&mut dev) } != cu::CUresult::CUDA_SUCCESS {
        return None;
    }
    attr_i32(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev).ok().map(|v| v != 0)
}

/// Whether NCCL may hand this NIC dma-buf file descriptors, as far as the GPUs go: the current
/// GPU's support where the caller has one, else (no current GPU) every GPU's.
pub fn gpus_take_dmabuf(current: Option<bool>, every: impl FnOnce() -> bool) -> bool {
    current.unwrap_or_else(every)
}

/// The GPU that owns device memory at `ptr`; an error when it is not device memory.
pub fn pointer_info(ptr: usize) -> Result<PtrInfo> {
    get().map_err(|why| Error::usage(format!("a CUDA buffer was registered but rivet cannot use CUDA: {why}")))?;
    let mem_type = pointer_attr(ptr, cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, "MEMORY_TYPE")? as u32;
    if mem_type != cu::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
        return Err(Error::internal(format!(
            "{ptr:#x} was registered as NCCL_PTR_CUDA but the driver says it is not device memory (memory type {mem_type})"
        )));
    }
    let ordinal = pointer_ordinal(ptr)?;
    Ok(PtrInfo { ordinal, bus_id: bus_id(ordinal)? })
}

/// The primary context of one GPU, retained while this lives, made current around driver calls
/// on threads where it is not (NCCL's proxy thread normally has it current already).
pub struct Context {
    ctx: cu::CUcontext,
    dev: cu::CUdevice,
}

// SAFETY: a CUcontext is a driver handle, not memory tied to a thread: the driver API is
// thread-safe and `with` pushes the context on whichever thread it runs on. Context is not Sync, so
// one thread at a time uses it; the retain/release pair may run on different threads.
unsafe impl Send for Context {}

impl Context {
    pub fn primary(ordinal: i32) -> Result<Context> {
        let mut dev = 0;
        // SAFETY: cuDeviceGet(CUdevice *, int) writes one CUdevice to the live local `dev`; a bad
        // ordinal is CUDA_ERROR_INVALID_DEVICE, not UB.
        check(unsafe { cu::cuDeviceGet(&mut dev, ordinal) }, "cuDeviceGet")?;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: cuDevicePrimaryCtxRetain(CUcontext *, CUdevice) writes the context handle to the
        // live local `ctx`; `dev` came from cuDeviceGet. A Context is built only when the retain
        // succeeded, so its Drop's release is the matching one.
        check(unsafe { cu::cuDevicePrimaryCtxRetain(&mut ctx, dev) }, "cuDevicePrimaryCtxRetain")?;
        Ok(Context { ctx, dev })
    }

    /// Run `f` with this context current on the calling thread.
    pub fn with<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let mut cur = std::ptr::null_mut();
        // SAFETY: cuCtxGetCurrent(CUcontext *) writes one handle to the live local `cur` (NULL when
        // no context is current); if it fails `cur` stays NULL and the context is pushed below.
        unsafe { cu::cuCtxGetCurrent(&mut cur) };
        if cur == self.ctx {
            return f();
        }
        // SAFETY: `self.ctx` is the primary context retained in `primary()` and released only in
        // Drop, which cannot run while `&self` is borrowed, so it is a live context to push on this
        // thread.
        check(unsafe { cu::cuCtxPushCurrent_v2(self.ctx) }, "cuCtxPushCurrent")?;
        let r = f();
        let mut popped = std::ptr::null_mut();
        // SAFETY: this pops the context pushed just above on the same thread; `popped` is a live
        // local the driver writes the popped handle to.
        unsafe { cu::cuCtxPopCurrent_v2(&mut popped) };
        r
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: `self.dev` is the device whose primary context `primary()` retained once for this
        // Context, and Drop runs once, so this is the matching release (the call takes the device,
        // not the context).
        unsafe { cu::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

/// The CUDA device that owns device memory at `ptr`.
pub fn pointer_ordinal(ptr: usize) -> Result<i32> {
    pointer_attr(ptr, cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, "DEVICE_ORDINAL")
}

/// One 32-bit attribute of the memory at `ptr` (`name` for the error).
fn pointer_attr(ptr: usize, attr: cu::CUpointer_attribute, name: &str) -> Result<i32> {
    let mut v: i32 = -1;
    check(
        // SAFETY: both attributes asked for here are 4-byte values (MEMORY_TYPE a CUmemorytype
        // enum, DEVICE_ORDINAL an int), written to `v`, a live local i32; `ptr` is only looked up
        // by the driver, never dereferenced, and an address it does not know is an error return.
        unsafe { cu::cuPointerGetAttribute(&mut v as *mut i32 as *mut c_void, attr, ptr as cu::CUdeviceptr) },
        &format!("cuPointerGetAttribute({ptr:#x}, {name})"),
    )?;
    Ok(v)
}

/// Device memory (`cuMemAlloc`) in a GPU's primary context: the buffers of `rivet perf --cuda`
/// and of the doctor's GPU self-test.
pub struct DeviceBuf {
    ptr: usize,
    len: usize,
    ctx: Context,
}

// SAFETY: the fields are a device address, a length and a Context (Send, above); the allocation may
// be used and freed from any thread with its context current, which every method arranges with
// `with`.
unsafe impl Send for DeviceBuf {}

impl DeviceBuf {
    /// The device address.
    pub fn ptr(&self) -> usize {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn new(ordinal: i32, len: usize) -> Result<DeviceBuf> {
        get().map_err(|why| Error::usage(format!("no CUDA: {why}")))?;
        let ctx = Context::primary(ordinal)?;
        let mut p: cu::CUdeviceptr = 0;
        // SAFETY: inside `ctx.with` the primary context is current, so the memory is allocated in
        // it; cuMemAlloc(CUdeviceptr *, size_t) writes the address to the live local `p`
        // (len.max(1): a 0-byte request is an error).
        ctx.with(|| check(unsafe { cu::cuMemAlloc_v2(&mut p, len.max(1)) }, &format!("cuMemAlloc({len})")))?;
        Ok(DeviceBuf { ptr: p as usize, len, ctx })
    }

    pub fn upload(&self, host: &[u8]) -> Result<()> {
        let n = host.len().min(self.len);
        // SAFETY: `self.ptr` is this buffer's cuMemAlloc allocation of `self.len` bytes, freed only
        // in Drop (the fields are `pub`: this relies on no code rewriting them); `host` is a
        // borrowed slice; `n` is at most both lengths, and the synchronous copy is over before the
        // borrow ends. `with` makes the allocation's context current.
        self.ctx.with(|| check(unsafe { cu::cuMemcpyHtoD_v2(self.ptr as cu::CUdeviceptr, host.as_ptr() as *const c_void, n) }, "cuMemcpyHtoD"))
    }

    pub fn download(&self, host: &mut [u8]) -> Result<()> {
        let n = host.len().min(self.len);
        // SAFETY: `self.ptr` is this buffer's cuMemAlloc allocation of `self.len` bytes, freed only
        // in Drop (the fields are `pub`: this relies on no code rewriting them); `host` is an
        // exclusively borrowed slice; `n` is at most both lengths, and the synchronous copy is over
        // before the borrow ends. `with` makes the context current.
        self.ctx.with(|| check(unsafe { cu::cuMemcpyDtoH_v2(host.as_mut_ptr() as *mut c_void, self.ptr as cu::CUdeviceptr, n) }, "cuMemcpyDtoH"))
    }
}

impl Drop for DeviceBuf {
    fn drop(&mut self) {
        // SAFETY: `self.ptr` came from cuMemAlloc in this context (made current by `with`) and is
        // freed exactly once, here.
        let _ = self.ctx.with(|| check(unsafe { cu::cuMemFree_v2(self.ptr as cu::CUdeviceptr) }, "cuMemFree"));
    }
}

/// Pinned (page-locked) host memory, portable across contexts.
pub struct PinnedBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: `ptr` is the only handle to a pinned allocation made with CU_MEMHOSTALLOC_PORTABLE
// (usable from every context and thread), so moving its owner to another thread, and freeing it
// there, is allowed. PinnedBuf is not Sync.
unsafe impl Send for PinnedBuf {}

impl PinnedBuf {
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn new(len: usize) -> Result<PinnedBuf> {
        let mut p = std::ptr::null_mut();
        // SAFETY: cuMemHostAlloc(void **, size_t, unsigned int) writes the allocation's address to
        // the live local `p`; PORTABLE is a valid flag. It needs a current context (else it returns
        // an error): CudaCopier::alloc calls this inside its context's `with`.
        check(unsafe { cu::cuMemHostAlloc(&mut p, len.max(1), cu::CU_MEMHOSTALLOC_PORTABLE) }, &format!("cuMemHostAlloc({len})"))?;
        Ok(PinnedBuf { ptr: p as *mut u8, len })
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        // SAFETY: `self.ptr` came from the successful cuMemHostAlloc in `new` (the fields are
        // `pub`: this relies on no code building a PinnedBuf otherwise or rewriting `ptr`) and is
        // freed exactly once, here. CudaCopier::free drops it inside its context's `with`; without
        // a current context the driver returns an error (a leak, not UB).
        unsafe { cu::cuMemFreeHost(self.ptr as *mut c_void) };
    }
}

/// A stream with a fixed set of events; each marks the end of a batch of copies.
pub struct Stream {
    stream: cu::CUstream,
    events: Vec<cu::CUevent>,
}

// SAFETY: the stream and event handles are driver objects that may be used from any thread on which
// their context is current (CudaCopier makes it current with `with` around every call); Stream is
// not Sync, and one thread at a time uses it.
unsafe impl Send for Stream {}

impl Stream {
    pub fn new(nevents: usize) -> Result<Stream> {
        let mut stream = std::ptr::null_mut();
        // SAFETY: cuStreamCreate(CUstream *, unsigned int) writes the handle to the live local
        // `stream`; the stream is created in the current context, which the caller
        // (CudaCopier::new, inside `with`) made the GPU's primary context.
        check(unsafe { cu::cuStreamCreate(&mut stream, cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) }, "cuStreamCreate")?;
        let mut s = Stream { stream, events: Vec::with_capacity(nevents) };
        for _ in 0..nevents {
            let mut e = std::ptr::null_mut();
            // SAFETY: cuEventCreate(CUevent *, unsigned int) writes the handle to the live local
            // `e`; it is pushed into `s.events` at once, so an early return drops `s`, which
            // destroys it.
            check(unsafe { cu::cuEventCreate(&mut e, cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) }, "cuEventCreate")?;
            s.events.push(e);
        }
        Ok(s)
    }

    /// # Safety
    /// `src` is `len` bytes of device memory of this stream's context, which is current, and
    /// `dst` `len` writable host bytes left alone until a fence recorded after this copy is
    /// reached (or the stream drained).
    pub unsafe fn to_host(&mut self, dst: *mut u8, src: usize, len: usize) -> Result<()> {
        check(
            // SAFETY: `self.stream` lives until Drop; the caller's promise covers the rest.
            unsafe { cu::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src as cu::CUdeviceptr, len, self.stream) },
            "cuMemcpyDtoHAsync",
        )
    }

    /// # Safety
    /// As for `to_host`, the other way round.
    pub unsafe fn to_device(&mut self, dst: usize, src: *const u8, len: usize) -> Result<()> {
        check(
            // SAFETY: `self.stream` lives until Drop; the caller's promise covers the rest.
            unsafe { cu::cuMemcpyHtoDAsync_v2(dst as cu::CUdeviceptr, src as *const c_void, len, self.stream) },
            "cuMemcpyHtoDAsync",
        )
    }

    pub fn record(&mut self, event: usize) -> Result<()> {
        // SAFETY: the event (indexing panics when `event` is out of range) and the stream were
        // created by `new` in the context the caller makes current, and are destroyed only in Drop.
        check(unsafe { cu::cuEventRecord(self.events[event], self.stream) }, "cuEventRecord")
    }

    pub fn reached(&self, event: usize) -> Result<bool> {
        // SAFETY: the event is one of this Stream's own (indexing is bounds-checked), alive until
        // Drop; cuEventQuery takes only the handle.
        match unsafe { cu::cuEventQuery(self.events[event]) } {
            cu::CUresult::CUDA_SUCCESS => Ok(true),
            cu::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => check(r, "cuEventQuery").map(|_| false),
        }
    }

    /// Whether every copy on the stream has completed (teardown: buffers are freed after it
    /// is), without waiting. An error other than "not ready" counts as idle: the stream holds
    /// nothing that could still run.
    pub fn idle(&self) -> bool {
        // SAFETY: `self.stream` was created by `new` and is destroyed only in Drop; cuStreamQuery
        // takes only the handle.
        !matches!(unsafe { cu::cuStreamQuery(self.stream) }, cu::CUresult::CUDA_ERROR_NOT_READY)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the events and the stream were created by `new` and are destroyed exactly once,
        // here. Work still queued on them is no hazard to the driver: a stream or event destroyed
        // with pending work is released once the device finishes it. CudaCopier drops the Stream
        // inside its context's `with`.
        unsafe {
            for e in &self.events {
                cu::cuEventDestroy_v2(*e);
            }
            cu::cuStreamDestroy_v2(self.stream);
        }
    }
}
