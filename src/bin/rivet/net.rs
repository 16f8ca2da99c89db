//! The CLI's view of the plugin: the built `.so` (or any ncclNet plugin) loaded with dlopen and
//! driven through its newest table (or the one `--abi` names), exactly as NCCL drives it.

use crate::table::{self, Accept, Connect, Init, Irecv, Isend, Listen, RegMr, Table};
use nccl_net_rivet::abi::types::*;
use nccl_net_rivet::transport::MAX_RECVS;
use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub type Res<T> = Result<T, String>;

/// What the harness gives a plugin of ncclNet v10+ for NCCL's profiler (`rivet perf --profiler`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Profiling {
    /// No callback at init (what the CLI does by default).
    None,
    /// A callback at init, and no profiler handle with any request: NCCL run without a profiler
    /// plugin (it always passes the callback).
    Callback,
    /// A callback at init and a profiler handle with every isend and irecv buffer: NCCL with a
    /// profiler plugin that takes network events. The callback counts them.
    Events,
}

/// The mode for every plugin this process loads from now on (0 none, 1 callback, 2 events).
static PROFILING: AtomicU8 = AtomicU8::new(0);
/// Events the harness's callback was asked to start, and to stop.
static EVENTS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
/// The handle passed with a request under `Profiling::Events` (any non-NULL value: the plugin
/// passes it back to the callback, which reads nothing through it).
static PHANDLE: u8 = 0;

pub fn set_profiling(p: Profiling) {
    PROFILING.store(p as u8, Ordering::Relaxed);
}

/// (started, stopped): the network events the plugin reported to the harness's callback.
pub fn profiler_events() -> (u64, u64) {
    (EVENTS[0].load(Ordering::Relaxed), EVENTS[1].load(Ordering::Relaxed))
}

/// NCCL's profiler callback as a profiler plugin that takes every event would make it cost
/// the least: count it, and hand back a non-NULL event handle (the start's own count).
unsafe extern "C" fn harness_profiler(e: *mut *mut c_void, ty: std::ffi::c_int, _ph: *mut c_void, _id: i64, _d: *mut c_void) -> ncclResult_t {
    let which = (ty != 0) as usize;
    let n = EVENTS[which].fetch_add(1, Ordering::Relaxed) + 1;
    if which == 0 && !e.is_null() {
        // SAFETY: NCCL's contract for a start: `e` is the plugin's out-pointer for the handle.
        unsafe { *e = n as usize as *mut c_void };
    }
    NCCL_SUCCESS
}

fn profiler_callback() -> ncclProfilerCallback_t {
    (PROFILING.load(Ordering::Relaxed) != 0).then_some(harness_profiler as unsafe extern "C" fn(_, _, _, _, _) -> _)
}

/// The profiler handle to pass with a request (NULL unless `Profiling::Events`).
fn phandle() -> *mut c_void {
    if PROFILING.load(Ordering::Relaxed) == 2 {
        &PHANDLE as *const u8 as *mut c_void
    } else {
        std::ptr::null_mut()
    }
}

pub struct Net {
    _lib: libloading::Library,
    t: Table,
    ctx: *mut c_void,
    pub path: PathBuf,
    pub timeout: Duration,
    /// isend and irecv calls that the plugin answered with no request (back-pressure), so far.
    pub refused: std::sync::atomic::AtomicU64,
}

/// `--lib`, `$RIVET_LIB`, or the library built next to this executable: `make`'s and an
/// install's `libnccl-net-rivet.so` (beside it or in `../lib`), or cargo's own
/// `libnccl_net_rivet.so` (beside it, or in `deps/`, where `cargo run --bin rivet` leaves it).
pub fn find_library(arg: Option<&Path>) -> Res<PathBuf> {
    if let Some(p) = arg.map(Path::to_path_buf).or_else(|| std::env::var_os("RIVET_LIB").filter(|v| !v.is_empty()).map(PathBuf::from)) {
        if !p.exists() && p.components().count() > 1 {
            return Err(format!("the plugin library {} does not exist (--lib / RIVET_LIB)", p.display()));
        }
        return Ok(p);
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidates = [
        dir.join("libnccl-net-rivet.so"),
        dir.join("../lib/libnccl-net-rivet.so"),
        dir.join("libnccl_net_rivet.so"),
        dir.join("deps/libnccl_net_rivet.so"),
    ];
    if let Some(p) = candidates.iter().find(|p| p.exists()) {
        return Ok(p.clone());
    }
    Err(format!(
        "cannot find the plugin next to {}: looked for {} (build it with `make` or `cargo build --release`, or pass --lib PATH / set RIVET_LIB)",
        exe.display(),
        candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    ))
}

/// A C string from the plugin, or "(none)".
///
/// # Safety
/// A non-NULL `c` is NUL-terminated and readable for the call.
unsafe fn cstr(c: *const std::ffi::c_char) -> String {
    if c.is_null() {
        "(none)".to_string()
    } else {
        // SAFETY: the caller's promise.
        unsafe { std::ffi::CStr::from_ptr(c) }.to_string_lossy().into_owned()
    }
}

/// A device's properties, with its name and PCI path read out as strings.
pub struct Props {
    pub raw: ncclNetProperties_v12_t,
    pub name: String,
    pub pci_path: String,
}

impl std::ops::Deref for Props {
    type Target = ncclNetProperties_v12_t;
    fn deref(&self) -> &ncclNetProperties_v12_t {
        &self.raw
    }
}

/// The ncclNet version `--abi` asked for (None: the newest the plugin exports), set once by
/// `main` for every process of a run (the peers parse the same command line).
/// `--abi` and `--traffic-class`, set once per process.
static OPTS: OnceLock<(Option<u32>, Option<u8>)> = OnceLock::new();

pub fn set_opts(l: Option<&crate::LibOpt>) {
    let _ = OPTS.set(l.map_or((None, None), |l| (l.abi, l.traffic_class)));
}

fn abi() -> Option<u32> {
    OPTS.get().and_then(|o| o.0)
}

/// The communicator config the plugin gets: `--traffic-class`, else undefined (-1).
fn comm_config() -> ncclNetCommConfig_t {
    ncclNetCommConfig_t { trafficClass: OPTS.get().and_then(|o| o.1).map_or(-1, i32::from) }
}

/// The logger handed to a plugin's init. A C-variadic function cannot be defined in stable Rust;
/// this one takes the fixed arguments and leaves the rest unread, which the x86_64 and aarch64
/// calling conventions allow (the caller passes them where a callee that ignores them never
/// looks). It prints a plugin's WARN lines as their format string, unformatted; rivet itself logs
/// through its own bridge, not through this.
extern "C" fn plugin_log(level: std::ffi::c_int, _flags: std::ffi::c_ulong, _file: *const std::ffi::c_char, _line: std::ffi::c_int, fmt: *const std::ffi::c_char) {
    if level == NCCL_LOG_WARN && !fmt.is_null() {
        // SAFETY: the plugin passes its printf format, a NUL-terminated string, for the call.
        let f = unsafe { std::ffi::CStr::from_ptr(fmt) }.to_string_lossy();
        // One write per line (two ranks share stderr); never a panic here (it would abort inside
        // a C call): a failed write is dropped.
        let line = format!("rivet: the plugin warns (format string, arguments not shown): {}\n", f.trim_end());
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

fn logger() -> unsafe extern "C" fn(std::ffi::c_int, std::ffi::c_ulong, *const std::ffi::c_char, std::ffi::c_int, *const std::ffi::c_char, ...) {
    let f: extern "C" fn(std::ffi::c_int, std::ffi::c_ulong, *const std::ffi::c_char, std::ffi::c_int, *const std::ffi::c_char) = plugin_log;
    // SAFETY: the same fixed parameters; see `plugin_log` for the variadic tail it leaves unread.
    unsafe { std::mem::transmute(f) }
}

/// A size for a table of v6–v8, whose sizes are C ints.
fn int(what: &str, n: usize) -> Res<std::ffi::c_int> {
    std::ffi::c_int::try_from(n).map_err(|_| format!("{what} of {n} bytes: this ncclNet version takes sizes up to 2 GiB - 1 (int)"))
}

fn check(what: &str, r: ncclResult_t) -> Res<()> {
    if r == NCCL_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what} failed: {} (the plugin's WARN line above says why)", result_name(r)))
    }
}

impl Net {
    pub fn load(path: &Path) -> Res<Net> {
        // SAFETY: loading an ncclNet plugin runs its initializers, as NCCL's dlopen does; the user
        // named this library as one.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| format!("dlopen {}: {e}", path.display()))?;
        // The functions read out of the table are used only through `self`, which keeps the
        // library loaded as long as it lives.
        let found = table::find(&lib, path, abi())?;
        let mut ctx = std::ptr::null_mut();
        let mut cfg = comm_config();
        // Plugins call the logger without checking it, as NCCL always passes one. rivet, given
        // none, writes its own lines to stderr, formatted and at NCCL_DEBUG's level (which this
        // logger, unable to format, could not do for it).
        // SAFETY: `lib` is loaded.
        let log = if unsafe { found.name() } == "rivet" { None } else { Some(logger()) };
        // SAFETY: `lib` is loaded; then (here and in each call into the table below) the
        // plugin's functions with their version's signatures, called with live out-parameters
        // and with handles this plugin returned.
        let r = unsafe {
            match found.init()? {
                Init::Plain(f) => f(log),
                Init::Profiler(f) => f(log, profiler_callback()),
                Init::Ctx(f) => f(&mut ctx, 0x5249_5645, &mut cfg, log, profiler_callback()),
            }
        };
        check("init", r)?;
        // SAFETY: `lib` is loaded, and init succeeded: the table is complete now.
        let t = unsafe { found.table()? };
        let timeout = Duration::from_secs(nccl_net_rivet::config::get().timeout_secs + 5);
        Ok(Net { _lib: lib, t, ctx, path: path.to_path_buf(), timeout, refused: Default::default() })
    }

    /// The ncclNet version of the table in use.
    pub fn version(&self) -> u32 {
        self.t.version
    }

    /// The plugin's name, as its table gives it.
    pub fn name(&self) -> &str {
        self.t.name
    }

    pub fn ndev(&self) -> Res<i32> {
        let mut n = 0;
        // SAFETY: see `load`.
        check("devices", unsafe { (self.t.devices)(&mut n) })?;
        Ok(n)
    }

    /// `makeVDevice`: a virtual NIC fusing `devs`, its device index.
    pub fn make_vdevice(&self, devs: &[i32]) -> Res<i32> {
        // SAFETY: see `load`.
        let (r, d) = unsafe { self.t.make_vdevice.call(devs)? };
        check("makeVDevice", r)?;
        Ok(d)
    }

    pub fn props(&self, dev: i32) -> Res<Props> {
        // SAFETY: see `load`.
        let (r, p) = unsafe { self.t.props.get(dev) };
        check("getProperties", r)?;
        // SAFETY: getProperties returned success: name and pciPath are NULL or NUL-terminated
        // strings the plugin keeps while it is loaded (the ncclNet contract).
        let (name, pci_path) = unsafe { (cstr(p.name), cstr(p.pciPath)) };
        Ok(Props { raw: p, name, pci_path })
    }

    pub fn listen(&self, dev: i32) -> Res<([u8; 128], *mut c_void)> {
        let mut h = [0u8; 128];
        let mut lc = std::ptr::null_mut();
        // SAFETY: see `load`; `h` is a 128-byte handle buffer (NCCL_NET_HANDLE_MAXSIZE).
        let hp = h.as_mut_ptr() as *mut c_void;
        // SAFETY: as above.
        let r = unsafe {
            match self.t.listen {
                Listen::Plain(f) => f(dev, hp, &mut lc),
                Listen::Ctx(f) => f(self.ctx, dev, hp, &mut lc),
            }
        };
        check("listen", r)?;
        Ok((h, lc))
    }

    /// Connect to each of `peers` and accept one connection on each of `lcs` (as many), progressing
    /// them all together without blocking, as NCCL's lazy connection of many peers does. Returns
    /// the (send, receive) comm pairs in the order given.
    pub fn connect_accept(&self, dev: i32, peers: &mut [[u8; 128]], lcs: &[*mut c_void]) -> Res<Vec<(*mut c_void, *mut c_void)>> {
        let null = std::ptr::null_mut::<c_void>();
        let mut pairs = vec![(null, null); peers.len().max(lcs.len())];
        let deadline = Instant::now() + self.timeout;
        let mut left = peers.len() + lcs.len();
        let r = self.progress_setup(dev, peers, lcs, &mut pairs, &mut left, deadline);
        if let Err(e) = r {
            // What did connect is closed again: a failed setup leaves nothing behind.
            for &(sc, rc) in &pairs {
                if !sc.is_null() {
                    self.close_send(sc);
                }
                if !rc.is_null() {
                    self.close_recv(rc);
                }
            }
            return Err(e);
        }
        Ok(pairs)
    }

    fn progress_setup(
        &self,
        dev: i32,
        peers: &mut [[u8; 128]],
        lcs: &[*mut c_void],
        pairs: &mut [(*mut c_void, *mut c_void)],
        left: &mut usize,
        deadline: Instant,
    ) -> Res<()> {
        while *left > 0 {
            for (i, peer) in peers.iter_mut().enumerate() {
                let sc = &mut pairs[i].0;
                if !sc.is_null() {
                    continue;
                }
                let (mut dc, hp) = (std::ptr::null_mut(), peer.as_mut_ptr() as *mut c_void);
                let mut cfg = comm_config();
                // SAFETY: see `load`; `peer` is a 128-byte handle, the same buffer each call.
                let r = unsafe {
                    match self.t.connect {
                        Connect::V6(f) => f(dev, hp, sc),
                        Connect::Dev(f) => f(dev, hp, sc, &mut dc),
                        Connect::Config(f) => f(dev, &mut cfg, hp, sc, &mut dc),
                        Connect::Ctx(f) => f(self.ctx, dev, hp, sc, &mut dc),
                    }
                };
                check("connect", r)?;
                *left -= usize::from(!sc.is_null());
            }
            for (i, &lc) in lcs.iter().enumerate() {
                let rc = &mut pairs[i].1;
                if !rc.is_null() {
                    continue;
                }
                let mut dc = std::ptr::null_mut();
                // SAFETY: see `load`.
                let r = unsafe {
                    match self.t.accept {
                        Accept::V6(f) => f(lc, rc),
                        Accept::Dev(f) => f(lc, rc, &mut dc),
                    }
                };
                check("accept", r)?;
                *left -= usize::from(!rc.is_null());
            }
            if *left > 0 && Instant::now() > deadline {
                return Err(format!("connection setup timed out ({left} of {} connects and accepts unfinished)", peers.len() + lcs.len()));
            }
        }
        Ok(())
    }

    /// Register a buffer; the caller keeps it (and does not move it) until it is deregistered.
    pub fn reg(&self, comm: *mut c_void, buf: &mut [u8]) -> Res<*mut c_void> {
        // SAFETY: the buffer is `buf.len()` bytes of host memory, which the caller keeps until the
        // registration is released.
        unsafe { self.reg_ptr(comm, buf.as_mut_ptr(), buf.len(), NCCL_PTR_HOST) }
    }

    /// Register `len` bytes at `p` of pointer type `ty` (NCCL_PTR_HOST or NCCL_PTR_CUDA).
    ///
    /// # Safety
    /// `[p, p+len)` is memory of type `ty`, allocated until the registration is released.
    pub unsafe fn reg_ptr(&self, comm: *mut c_void, p: *mut u8, len: usize, ty: i32) -> Res<*mut c_void> {
        let mut mh = std::ptr::null_mut();
        // SAFETY: see `load`, and the caller's promise for the buffer.
        let r = unsafe {
            match self.t.reg_mr {
                RegMr::Int(f) => f(comm, p as *mut c_void, int("regMr", len)?, ty, &mut mh),
                RegMr::Size(f) => f(comm, p as *mut c_void, len, ty, &mut mh),
            }
        };
        check("regMr", r)?;
        Ok(mh)
    }

    pub fn dereg(&self, comm: *mut c_void, mh: *mut c_void) -> Res<()> {
        // SAFETY: see `load`.
        check("deregMr", unsafe { (self.t.dereg_mr)(comm, mh) })
    }

    /// Call a posting attempt until it returns a request: a NULL request is the plugin's
    /// back-pressure, retried until the timeout.
    fn post(&self, what: &str, mut attempt: impl FnMut() -> Res<Option<*mut c_void>>) -> Res<*mut c_void> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(req) = attempt()? {
                return Ok(req);
            }
            self.refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if Instant::now() > deadline {
                return Err(format!("{what}: no free request slot within the timeout"));
            }
        }
    }

    /// # Safety
    /// As for `try_isend`.
    // Not inlined: ci/bench_instr.py counts the plugin's instructions per call under it.
    #[inline(never)]
    pub unsafe fn isend(&self, sc: *mut c_void, p: *const u8, size: usize, tag: i32, mh: *mut c_void) -> Res<*mut c_void> {
        // SAFETY: the caller's promise.
        self.post("isend", || unsafe { self.try_isend(sc, p, size, tag, mh) })
    }

    /// # Safety
    /// As for `try_irecv_group`.
    // Not inlined: ci/bench_instr.py counts the plugin's instructions per call under it.
    #[inline(never)]
    pub unsafe fn irecv(&self, rc: *mut c_void, p: *mut u8, size: usize, tag: i32, mh: *mut c_void) -> Res<*mut c_void> {
        // SAFETY: the caller's promise.
        self.post("irecv", || unsafe { self.try_irecv_group(rc, &[(p, size, tag, mh)]) })
    }

    /// One isend attempt: None is the plugin's back-pressure (try again later).
    ///
    /// # Safety
    /// `[p, p+size)` is inside the registration `mh`, readable, and left unchanged until the
    /// request completes or the comm is closed.
    // Not inlined: ci/bench_instr.py's budget counts the plugin's instructions per attempt under it.
    #[inline(never)]
    pub unsafe fn try_isend(&self, sc: *mut c_void, p: *const u8, size: usize, tag: i32, mh: *mut c_void) -> Res<Option<*mut c_void>> {
        let mut req = std::ptr::null_mut();
        let data = p as *mut c_void;
        // SAFETY: see `load`, and the caller's promise for the buffer.
        let r = unsafe {
            match self.t.isend {
                Isend::Int(f) => f(sc, data, int("isend", size)?, tag, mh, &mut req),
                Isend::Size(f) => f(sc, data, size, tag, mh, &mut req),
                Isend::Phandle(f) => f(sc, data, size, tag, mh, phandle(), &mut req),
            }
        };
        check("isend", r)?;
        Ok((!req.is_null()).then_some(req))
    }

    /// One attempt at a grouped receive of up to 8 buffers (pointer, size, tag, memory handle
    /// each). The arrays NCCL's irecv takes live on the stack: posting allocates nothing.
    ///
    /// # Safety
    /// Each buffer lies inside its registration, writable, and is neither read nor written by
    /// anyone else until the request completes or the comm is closed.
    pub unsafe fn try_irecv_group(&self, rc: *mut c_void, bufs: &[(*mut u8, usize, i32, *mut c_void)]) -> Res<Option<*mut c_void>> {
        const MAX: usize = 8;
        if bufs.is_empty() || bufs.len() > MAX {
            return Err(format!("irecv of {} buffers: 1 to {MAX} are allowed", bufs.len()));
        }
        let (mut data, mut sizes, mut tags, mut mhs) = ([std::ptr::null_mut(); MAX], [0usize; MAX], [0i32; MAX], [std::ptr::null_mut(); MAX]);
        let mut isizes = [0 as std::ffi::c_int; MAX];
        for (i, b) in bufs.iter().enumerate() {
            (data[i], sizes[i], tags[i], mhs[i]) = (b.0 as *mut c_void, b.1, b.2, b.3);
            isizes[i] = if matches!(self.t.irecv, Irecv::Int(_)) { int("irecv", b.1)? } else { 0 };
        }
        let (mut req, n) = (std::ptr::null_mut(), bufs.len() as i32);
        let mut phs = [phandle(); MAX];
        let (d, t, m) = (data.as_mut_ptr(), tags.as_mut_ptr(), mhs.as_mut_ptr());
        // NCCL passes its array of per-buffer handles (each NULL without a profiler plugin).
        let ph = phs.as_mut_ptr();
        // SAFETY: see `load`; the arrays hold `bufs.len()` entries each, and the caller's promise
        // covers the buffers.
        let r = unsafe {
            match self.t.irecv {
                Irecv::Int(f) => f(rc, n, d, isizes.as_mut_ptr(), t, m, &mut req),
                Irecv::Size(f) => f(rc, n, d, sizes.as_mut_ptr(), t, m, &mut req),
                Irecv::Phandle(f) => f(rc, n, d, sizes.as_mut_ptr(), t, m, ph, &mut req),
            }
        };
        check("irecv", r)?;
        Ok((!req.is_null()).then_some(req))
    }

    /// Test a request of `sizes.len()` buffers (1 for a send); true once done, with the size of
    /// each buffer's message in `sizes`.
    pub fn test_n(&self, req: *mut c_void, sizes: &mut [i32]) -> Res<bool> {
        let mut done = 0;
        // Room for the most buffers any request has (maxRecvs), whatever the caller's count.
        let mut all = [0i32; MAX_RECVS];
        // SAFETY: see `load`; `done` and `all` are locals, `all` as large as any request's sizes.
        check("test", unsafe { (self.t.test)(req, &mut done, all.as_mut_ptr()) })?;
        let n = sizes.len().min(MAX_RECVS);
        sizes[..n].copy_from_slice(&all[..n]);
        Ok(done != 0)
    }

    /// Some(size) once the request is done.
    // Not inlined: ci/bench_instr.py counts the plugin's instructions per call under it.
    #[inline(never)]
    pub fn test(&self, req: *mut c_void) -> Res<Option<usize>> {
        let mut size = [0i32; 1];
        Ok(self.test_n(req, &mut size)?.then_some(size[0] as usize))
    }

    /// Close a send comm, a receive comm or a listening comm (each once; callers forget them).
    pub fn close_send(&self, sc: *mut c_void) {
        // SAFETY: see `load`; a send comm of this plugin, closed once.
        unsafe { (self.t.close_send)(sc) };
    }

    pub fn close_recv(&self, rc: *mut c_void) {
        // SAFETY: see `load`; a receive comm of this plugin, closed once.
        unsafe { (self.t.close_recv)(rc) };
    }

    pub fn close_listen(&self, lc: *mut c_void) {
        // SAFETY: see `load`; a listening comm of this plugin, closed once.
        unsafe { (self.t.close_listen)(lc) };
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if let Some(f) = self.t.finalize {
            // SAFETY: see `load`; the context from init (v11+), finalized once.
            unsafe { f(self.ctx) };
        }
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Res<[u8; 128]> {
    let s = s.trim();
    if s.len() != 256 {
        return Err(format!("bad handle line of {} chars", s.len()));
    }
    let mut out = [0u8; 128];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok(out)
}
