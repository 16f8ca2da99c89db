//! RDMA device discovery: every ACTIVE port of every device (InfiniBand or RoCE), filtered by
//! `NCCL_IB_HCA`, sorted by PCI path, with its GID chosen; one protection domain and one MR cache
//! per device, shared by every comm on it.

use super::mr::MrCache;
use super::survey::for_each_device;
pub use super::survey::{survey, DevSurvey, PortSurvey};
use super::select::{self, GidEntry, HcaFilter};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::sys::ib::*;
use crate::sys::verbs::{self, Verbs};
use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// One opened RDMA device.
pub struct IbDevice {
    pub name: String,
    pub ctx: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub guid: u64,
    pub max_qp: i32,
    pub max_qp_wr: i32,
    pub max_cqe: i32,
    pub pci_path: Option<String>,
    /// Registrations of NCCL buffers (`*mut ibv_mr` as usize).
    pub mrs: Mutex<MrCache<usize>>,
    /// Register with IBV_ACCESS_RELAXED_ORDERING (through ibv_reg_mr_iova2).
    pub relaxed_ordering: bool,
    /// Whether the NIC registers dma-buf memory (the `ibv_reg_dmabuf_mr` probe), or why not.
    pub dmabuf: std::result::Result<(), String>,
    /// Device-wide fatal asynchronous events seen (DEVICE_FATAL, CQ_ERR).
    pub fatal_events: AtomicU32,
    pub fatal_reason: Mutex<Option<String>>,
    /// Queue pairs an asynchronous event declared broken: (QPN, event name).
    bad_qps: Mutex<Vec<(u32, &'static str)>>,
    /// Ports whose last event was PORT_ERR (bit per port number).
    ports_down: AtomicU32,
    /// PORT_ERR events seen so far, of any port of the device (only grows).
    port_errs: AtomicU32,
    /// The async event fd is non-blocking, so events can be polled (never waited for).
    watch_events: std::sync::atomic::AtomicBool,
    /// When the events were last drained from an idle path (coarse clock, ms): every comm of the
    /// device calls, and once per EVENTS_EVERY is enough for all of them.
    events_polled: std::sync::atomic::AtomicU64,
    /// The device answered an ECE call "not supported" (or libibverbs lacks the calls): later
    /// queue pairs are not asked again (`res::EceOn`).
    pub no_ece: std::sync::atomic::AtomicBool,
}

/// `IBV_QPF_GRH_REQUIRED` of `ibv_port_attr.flags` (verbs.h; not in the bindings' headers).
const QPF_GRH_REQUIRED: u8 = 1;

/// How often idle comms drain a device's asynchronous events, at most.
const EVENTS_EVERY_MS: u64 = 10;

// SAFETY: the context and protection domain live for the process (never closed) and libibverbs
// allows their use from any thread; the mutable state (events seen, bad QPs, ports down) is in
// atomics and mutexes.
unsafe impl Send for IbDevice {}
// SAFETY: as above.
unsafe impl Sync for IbDevice {}

impl IbDevice {
    /// Drain the device's asynchronous events (its fd is non-blocking). There is no event thread:
    /// the data path calls this when a call makes no progress, so nothing runs in the background
    /// after NCCL closes or dlcloses the plugin (v6-v10 have no finalize to stop a thread).
    /// `poll_events` from an idle path at coarse time `now_ms`: only if no comm of the device
    /// did in the last EVENTS_EVERY_MS (a thousand idle comms would otherwise each make the
    /// system call).
    pub fn poll_events_at(&self, now_ms: u64) {
        let last = self.events_polled.load(Ordering::Relaxed);
        if now_ms.saturating_sub(last) < EVENTS_EVERY_MS
            || self.events_polled.compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed).is_err()
        {
            return;
        }
        self.poll_events();
    }

    pub fn poll_events(&self) {
        let Ok(v) = verbs::get() else { return };
        if !self.watch_events.load(Ordering::Relaxed) {
            return; // a blocking fd would stall the data path
        }
        let Ok(mut bad) = self.bad_qps.try_lock() else { return };
        for _ in 0..64 {
            // SAFETY: ibv_async_event is repr(C): a union of raw pointers and a c_int, and a c_uint
            // event type (an alias, not a Rust enum), so the all-zero bit pattern is a valid value.
            let mut ev: ibv_async_event = unsafe { std::mem::zeroed() };
            // SAFETY: `get_async_event` is ibv_get_async_event, resolved from libibverbs at load
            // with the C signature declared in Verbs; self.ctx came from ibv_open_device in
            // open_device and is never closed (IbDevice has no Drop; devices live for the process),
            // and `ev` is a local out-parameter of the right type. open_device set O_NONBLOCK on
            // the context's async_fd (watch_events says it did), so with nothing pending the call
            // fails with EAGAIN rather than blocking.
            if unsafe { (v.get_async_event)(self.ctx, &mut ev) } != 0 {
                return; // EAGAIN: none pending
            }
            let name = verbs::event_name(ev.event_type);
            match ev.event_type {
                IBV_EVENT_QP_FATAL | IBV_EVENT_QP_REQ_ERR | IBV_EVENT_QP_ACCESS_ERR => {
                    // SAFETY: for QP_FATAL, QP_REQ_ERR and QP_ACCESS_ERR, ibv_get_async_event(3)
                    // sets `element.qp` (the union member read here) to a QP of this context;
                    // ibv_destroy_qp(3) waits until every event reported on a QP has been acked
                    // before freeing it, and this event is acked only below, so the ibv_qp is live
                    // for this read.
                    let qpn = unsafe { (*ev.element.qp).qp_num };
                    log::warn!("NET/rivet: {}: asynchronous event {name} on QPN {qpn}", self.name);
                    if bad.len() < 4096 {
                        bad.push((qpn, name));
                    }
                }
                IBV_EVENT_DEVICE_FATAL | IBV_EVENT_CQ_ERR => {
                    log::warn!("NET/rivet: {}: fatal asynchronous event {name}", self.name);
                    // The reason first, then the count that publishes it (Release, paired with
                    // check_fatal's Acquire).
                    *self.fatal_reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(name.to_string());
                    self.fatal_events.fetch_add(1, Ordering::Release);
                }
                IBV_EVENT_PORT_ERR => {
                    // SAFETY: for PORT_ERR, ibv_get_async_event(3) fills `element.port_num`, the
                    // member read here; it is a plain c_int and `ev` was zeroed first, so the bytes
                    // are initialised.
                    let port = unsafe { ev.element.port_num };
                    self.ports_down.fetch_or(1 << (port & 31), Ordering::Relaxed);
                    self.port_errs.fetch_add(1, Ordering::Relaxed);
                    log::warn!("NET/rivet: {}:{port}: the port went down (PORT_ERR): its connections will fail", self.name)
                }
                IBV_EVENT_PORT_ACTIVE => {
                    // SAFETY: for PORT_ACTIVE, ibv_get_async_event(3) fills `element.port_num`, the
                    // member read here; it is a plain c_int and `ev` was zeroed first, so the bytes
                    // are initialised.
                    let port = unsafe { ev.element.port_num };
                    self.ports_down.fetch_and(!(1 << (port & 31)), Ordering::Relaxed);
                    log::info!(target: crate::log::INIT, "NET/rivet: {}:{port}: the port is active again (PORT_ACTIVE)", self.name)
                }
                _ => log::info!("NET/rivet: {}: asynchronous event {name}", self.name),
            }
            // SAFETY: `ev` was returned by the successful ibv_get_async_event above and is acked
            // exactly once, as ibv_ack_async_event(3) requires (the ack is what lets a destroy
            // waiting on the event's QP or CQ proceed); the resolved function has the C signature
            // declared in Verbs.
            unsafe { (v.ack_async_event)(&mut ev) };
        }
    }

    /// The port's state now ("ACTIVE", "DOWN", ...), asked of the device.
    pub fn port_state(&self, port: u8) -> Option<&'static str> {
        let v = verbs::get().ok()?;
        // SAFETY: ibv_port_attr is repr(C) with only integer fields (its enums are c_uint aliases),
        // so all-zero is a valid value; it is also what the inline ibv_query_port does before the
        // compat call.
        let mut pa: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: Verbs::query_port requires an open context: self.ctx came from ibv_open_device in
        // open_device and is never closed (IbDevice has no Drop; devices live for the process).
        // `pa` is a local ibv_port_attr of the current layout; a port number the device lacks only
        // makes the call fail.
        (unsafe { v.query_port(self.ctx, port, &mut pa) } == 0).then(|| port_state_name(pa.state))
    }

    /// PORT_ERR events of the device's ports seen so far.
    pub fn port_errs(&self) -> u32 {
        self.port_errs.load(Ordering::Relaxed)
    }

    /// Whether the device said the port went down (and not up again).
    pub fn port_down(&self, port: u8) -> bool {
        self.ports_down.load(Ordering::Relaxed) & (1 << (port & 31)) != 0
    }

    /// The event that broke one of `qpns`, if any.
    pub fn qp_event(&self, qpns: impl Iterator<Item = u32> + Clone) -> Option<(u32, &'static str)> {
        let bad = self.bad_qps.lock().unwrap_or_else(|p| p.into_inner());
        bad.iter().copied().find(|(q, _)| qpns.clone().any(|x| x == *q))
    }

    /// Fails once the device reported a fatal asynchronous event.
    pub fn check_fatal(&self) -> Result<()> {
        if self.fatal_events.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let why = self.fatal_reason.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_default();
        Err(Error::system(format!("{}: the device reported a fatal asynchronous event ({why}); its connections are unusable", self.name)))
    }

    /// Register `[addr, addr+len)` (already page aligned) with `access`.
    pub fn register(&self, addr: usize, len: usize, access: i32) -> Result<*mut ibv_mr> {
        let v = verbs::get().map_err(|e| Error::system(e.0))?;
        let mr = match (self.relaxed_ordering, v.reg_mr_iova2) {
            // SAFETY: `f` is ibv_reg_mr_iova2 (IBVERBS_1.8), resolved from libibverbs with the C
            // signature declared in Verbs; self.pd was allocated by ibv_alloc_pd on this device's
            // context and is never deallocated. ibv_reg_mr(3) does not access the range from the
            // CPU: the kernel pins [addr, addr+len) and fails (NULL, errno EFAULT) if it is not
            // mapped, which is handled below. Keeping the memory mapped while the MR is in use is
            // the caller's job (NCCL deregisters a buffer before freeing it).
            (true, Some(f)) => unsafe {
                f(self.pd, addr as *mut _, len, addr as u64, (access | IBV_ACCESS_RELAXED_ORDERING as i32) as u32)
            },
            // SAFETY: `reg_mr` is ibv_reg_mr, a required symbol resolved with the C signature
            // declared in Verbs; self.pd is this device's PD, live for the process. As above, the
            // kernel only pins the range and reports failure as NULL, checked below.
            _ => unsafe { (v.reg_mr)(self.pd, addr as *mut _, len, access) },
        };
        if mr.is_null() {
            return Err(Error::system(format!(
                "{}: ibv_reg_mr of {len} bytes at {addr:#x} failed: {}{}",
                self.name,
                std::io::Error::last_os_error(),
                memlock_hint()
            )));
        }
        Ok(mr)
    }
}

/// Whether `ibv_reg_dmabuf_mr` works on this device, asked with fd -1: a driver without dma-buf
/// support answers EOPNOTSUPP (or EPROTONOSUPPORT); one with it rejects the fd (EBADF).
pub(super) fn probe_dmabuf(v: &Verbs, pd: *mut ibv_pd, name: &str) -> std::result::Result<(), String> {
    let Some(f) = v.reg_dmabuf_mr else {
        return Err("libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or newer has it)".into());
    };
    // SAFETY: `f` is ibv_reg_dmabuf_mr (IBVERBS_1.12), resolved with the C signature declared in
    // Verbs; the callers pass a PD they allocated on an open context and have not deallocated
    // (open_device's, or survey's before its dealloc_pd). fd -1 is never a dma-buf, so the kernel
    // rejects it (EBADF) or the driver answers EOPNOTSUPP; no caller memory is read or written.
    let mr = unsafe { f(pd, 0, page_size(), 0, -1, IBV_ACCESS_LOCAL_WRITE as c_int) };
    if !mr.is_null() {
        // SAFETY: `mr` is the non-null MR ibv_reg_dmabuf_mr just returned; nothing else holds it,
        // and it is deregistered exactly once, here.
        unsafe { (v.dereg_mr)(mr) };
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::EPROTONOSUPPORT) => {
            Err(format!("{name} does not support dma-buf registration ({e})"))
        }
        _ => Ok(()),
    }
}

impl IbDevice {
    /// Register a dma-buf: `len` bytes at `offset` in the dma-buf `fd`, addressed as `iova`
    /// (the GPU virtual address NCCL uses). The fd is not kept: NCCL closes it after the call.
    pub fn register_dmabuf(&self, offset: u64, len: usize, iova: u64, fd: c_int, access: i32) -> Result<*mut ibv_mr> {
        let v = verbs::get().map_err(|e| Error::system(e.0))?;
        let Some(f) = v.reg_dmabuf_mr else {
            return Err(Error::system("libibverbs has no ibv_reg_dmabuf_mr"));
        };
        let acc = if self.relaxed_ordering { access | IBV_ACCESS_RELAXED_ORDERING as i32 } else { access };
        // SAFETY: `f` is ibv_reg_dmabuf_mr, resolved with the C signature declared in Verbs;
        // self.pd is this device's PD, live for the process. No pointer of ours is dereferenced:
        // the kernel validates `fd` and [offset, offset+len) against the dma-buf and fails (NULL,
        // checked below) otherwise. NCCL keeps the GPU memory allocated until it deregisters.
        let mr = unsafe { f(self.pd, offset, len, iova, fd, acc) };
        if mr.is_null() {
            return Err(Error::system(format!(
                "{}: ibv_reg_dmabuf_mr of {len} bytes at offset {offset} of fd {fd} (iova {iova:#x}) failed: {}",
                self.name,
                std::io::Error::last_os_error()
            )));
        }
        Ok(mr)
    }
}

/// One usable port: what NCCL sees as a device.
pub struct IbPort {
    pub dev: Arc<IbDevice>,
    pub port: u8,
    pub link_layer: u8,
    pub lid: u16,
    pub mtu: u32,
    pub speed: i32,
    pub gid_index: u32,
    pub gid: [u8; 16],
    pub roce_version: Option<u32>,
    /// From NCCL_IB_HCA (`dev:port:rail:plane`), -1 when undefined.
    pub rail: i16,
    pub plane: i16,
    /// The plane's index among the distinct planes of the ports found (0: undefined), for a
    /// fused device's plane mask.
    pub plane_idx: u8,
    /// Adaptive routing on this port's fabric (NCCL_IB_ADAPTIVE_ROUTING; auto: InfiniBand).
    pub adaptive_routing: bool,
    /// Its index among the ports NCCL sees (the plugin's device number of this port).
    pub index: u8,
    /// The PCI path NCCL's topology gets (net_ib's: function digit, and with
    /// NCCL_IB_MERGE_VFS the device digits, zeroed), and the port number NCCL sees.
    pub nccl_pci_path: Option<String>,
    pub nccl_port: i32,
    /// The port's flags say every packet needs a global route header (IBV_QPF_GRH_REQUIRED).
    pub grh_required: bool,
}

impl IbPort {
    pub fn is_roce(&self) -> bool {
        self.link_layer == IBV_LINK_LAYER_ETHERNET as u8
    }

    /// "rxe0:1 RoCE v2 GID 1 (10.0.0.1)" or "mlx5_0:1 IB LID 3".
    pub fn describe(&self) -> String {
        if self.is_roce() {
            format!(
                "{}:{} RoCE{} GID {} ({})",
                self.dev.name,
                self.port,
                self.roce_version.map(|v| format!(" v{v}")).unwrap_or_default(),
                self.gid_index,
                select::describe_gid(&self.gid)
            )
        } else {
            format!("{}:{} IB LID {}", self.dev.name, self.port, self.lid)
        }
    }
}

pub fn mtu_bytes(m: u32) -> u32 {
    match m {
        1..=5 => 128 << m,
        _ => 0,
    }
}

/// A hint appended to registration failures when the memlock limit is the likely cause.
pub fn memlock_hint() -> String {
    match memlock_problem() {
        Some(p) => format!(" ({p})"),
        None => String::new(),
    }
}

/// Locked memory registrations need: unlimited, or at least this much.
pub const MEMLOCK_NEEDED: u64 = 1 << 30;

/// Whether the process has CAP_IPC_LOCK (RLIMIT_MEMLOCK then does not apply).
pub fn has_cap_ipc_lock() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 14) != 0)
}

/// Why pinned registrations may fail: RLIMIT_MEMLOCK below 1 GiB without CAP_IPC_LOCK.
pub fn memlock_problem() -> Option<String> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit(2) writes one struct rlimit through its pointer, and `r` is a local
    // libc::rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return None;
    }
    if r.rlim_cur == libc::RLIM_INFINITY || r.rlim_cur >= MEMLOCK_NEEDED || has_cap_ipc_lock() {
        return None;
    }
    Some(format!(
        "RLIMIT_MEMLOCK is {} KiB, too low to register NCCL's buffers: run with `ulimit -l unlimited` (docker: --ulimit memlock=-1; systemd: LimitMEMLOCK=infinity; /etc/security/limits.conf: memlock unlimited)",
        r.rlim_cur / 1024
    ))
}

fn sysfs_gid_type(dev: &str, port: u8, index: u32) -> Option<u32> {
    // Containers give EINVAL for some entries: that only means "unknown".
    let s = std::fs::read_to_string(format!("/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/types/{index}")).ok()?;
    let s = s.trim();
    if s.contains("v2") {
        Some(2)
    } else if s.contains("v1") || s.starts_with("IB") {
        Some(1)
    } else {
        None
    }
}

pub(super) fn gid_table(v: &Verbs, ctx: *mut ibv_context, dev: &str, port: u8, len: i32) -> Vec<GidEntry> {
    let mut out = Vec::new();
    for i in 0..len.clamp(0, 1024) {
        let mut gid = ibv_gid { raw: [0; 16] };
        // SAFETY: `query_gid` is ibv_query_gid, resolved with the C signature declared in Verbs;
        // the callers (survey, open_device) pass a context they opened and have not closed yet, and
        // `gid` is a local union ibv_gid out-parameter. An index past the table only makes the call
        // fail, which is skipped.
        if unsafe { (v.query_gid)(ctx, port, i, &mut gid) } != 0 {
            continue;
        }
        // SAFETY: both members of union ibv_gid are plain integer data covering the same 16 bytes,
        // and `gid` was initialised through `raw` (then possibly overwritten by ibv_query_gid), so
        // reading `raw` reads initialised bytes.
        let raw = unsafe { gid.raw };
        if raw == [0; 16] {
            continue;
        }
        out.push(GidEntry { index: i as u32, gid: raw, roce_version: sysfs_gid_type(dev, port, i as u32) });
    }
    out
}

pub(super) fn port_state_name(s: u32) -> &'static str {
    match s {
        IBV_PORT_DOWN => "DOWN",
        IBV_PORT_INIT => "INIT",
        IBV_PORT_ARMED => "ARMED",
        IBV_PORT_ACTIVE => "ACTIVE",
        IBV_PORT_ACTIVE_DEFER => "ACTIVE_DEFER",
        _ => "NOP",
    }
}

/// A port's speed in Mb/s, as `select::port_speed` makes it of what the device says
/// (ibv_query_port_speed where NCCL_IB_QUERY_PORT_SPEED allows, active_speed_ex, `pa`).
///
/// # Safety
/// `ctx` must be an open device context and `port` one of its ports.
pub(super) unsafe fn port_speed(v: &Verbs, ctx: *mut ibv_context, port: u8, pa: &ibv_port_attr) -> i32 {
    let q = if crate::config::get().ib_query_port_speed { v.port_speed(ctx, port) } else { None };
    select::port_speed(q, pa.active_speed, v.active_speed_ex(ctx, port), pa.active_width)
}

/// Open every device and keep its usable ports. `Err` says why there is none (rivet then falls
/// back to TCP and logs the reason).
pub fn discover(cfg: &Config) -> std::result::Result<Vec<IbPort>, String> {
    let v = verbs::get().map_err(|e| e.0)?;
    let filter = cfg.ib_hca.as_deref().map(HcaFilter::parse);
    let mut ports = Vec::new();
    let mut notes = Vec::new();
    for_each_device(v, |d, name| match open_device(v, cfg, d, name, filter.as_ref(), &mut notes) {
        Ok(mut p) => ports.append(&mut p),
        Err(e) => notes.push(e),
    })?;
    if ports.is_empty() {
        return Err(format!("no usable RDMA port: {}", notes.join("; ")));
    }
    // Same order on every node: by PCI path, then name and port (NCCL_IB_DEVICE_PCI_ORDER=0:
    // libibverbs' order, as net_ib).
    let keys: Vec<_> = ports.iter().map(|p| (p.dev.pci_path.clone(), p.dev.name.clone(), p.port)).collect();
    let order = device_order(&keys, cfg.ib_device_pci_order);
    let mut slots: Vec<Option<IbPort>> = ports.into_iter().map(Some).collect();
    let mut ports: Vec<IbPort> = order.iter().map(|&i| slots[i].take().expect("a permutation")).collect();
    for n in notes {
        log::info!(target: crate::log::INIT, "NET/rivet: {n}");
    }
    // What NCCL sees of each: its index, its PCI path and port number as net_ib makes them.
    let paths: Vec<Option<String>> = ports.iter().map(|p| p.dev.pci_path.as_deref().map(|f| select::nccl_pci_path(f, cfg.ib_merge_vfs))).collect();
    let real = select::real_ports(&paths.iter().map(|p| p.as_deref()).collect::<Vec<_>>(), cfg.ib_merge_vfs);
    for (i, (p, (path, r))) in ports.iter_mut().zip(paths.into_iter().zip(real)).enumerate() {
        p.index = i.min(255) as u8;
        p.nccl_pci_path = path;
        p.nccl_port = p.port as i32 + r as i32;
    }
    // Plane indices: 0 for none, then the distinct planes in device order (as net_ib).
    let mut planes: Vec<i16> = Vec::new();
    for p in ports.iter_mut() {
        if p.plane >= 0 {
            let i = planes.iter().position(|&x| x == p.plane).unwrap_or_else(|| {
                planes.push(p.plane);
                planes.len() - 1
            });
            p.plane_idx = (i + 1).min(13) as u8;
        }
    }
    Ok(ports)
}

/// The order NCCL numbers the ports in, as indices into `keys` (PCI path, device name, port) in
/// libibverbs' order: sorted by PCI path (none last), then name and port, so that every node of a
/// cluster numbers its NICs the same way; `by_pci` false keeps libibverbs' order.
pub fn device_order(keys: &[(Option<String>, String, u8)], by_pci: bool) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..keys.len()).collect();
    if by_pci {
        idx.sort_by(|&a, &b| {
            let (ka, kb) = (&keys[a], &keys[b]);
            (ka.0.is_none(), &ka.0, &ka.1, ka.2).cmp(&(kb.0.is_none(), &kb.0, &kb.1, kb.2))
        });
    }
    idx
}

fn open_device(
    v: &Verbs,
    cfg: &Config,
    d: *mut ibv_device,
    name: &str,
    filter: Option<&HcaFilter>,
    notes: &mut Vec<String>,
) -> std::result::Result<Vec<IbPort>, String> {
    // SAFETY: `open_device` is ibv_open_device, resolved with the C signature declared in Verbs;
    // `d` is an entry of the device list, which for_each_device keeps alive while this runs. A NULL
    // result is handled below.
    let ctx = unsafe { (v.open_device)(d) };
    if ctx.is_null() {
        return Err(format!("{name}: ibv_open_device failed: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: ibv_device_attr is repr(C) with only integer and char-array fields (atomic_cap is a
    // c_uint alias), so all-zero is a valid value.
    let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: `ctx` is the non-null context just opened; `attr` is a local ibv_device_attr, the
    // out-parameter ibv_query_device(3) fills.
    if unsafe { (v.query_device)(ctx, &mut attr) } != 0 {
        // SAFETY: `ctx` was opened above, nothing was created on it, and it is not used after this
        // error return, so it is closed exactly once.
        unsafe { (v.close_device)(ctx) };
        return Err(format!("{name}: ibv_query_device failed"));
    }
    let mut kept = Vec::new();
    for port in 1..=attr.phys_port_cnt {
        if filter.is_some_and(|f| !f.matches(name, port)) {
            notes.push(format!("{name}:{port} skipped by NCCL_IB_HCA={}", cfg.ib_hca.as_deref().unwrap_or("")));
            continue;
        }
        // SAFETY: ibv_port_attr is repr(C) with only integer fields (its enums are c_uint aliases),
        // so all-zero is a valid value; it is also what the inline ibv_query_port does before the
        // compat call.
        let mut pa: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: Verbs::query_port requires an open context: `ctx` was opened above and is closed
        // only on the error returns below (or kept, open, in the IbDevice). `pa` is a local
        // ibv_port_attr and `port` is in 1..=phys_port_cnt.
        if unsafe { v.query_port(ctx, port, &mut pa) } != 0 {
            notes.push(format!("{name}:{port}: ibv_query_port failed"));
            continue;
        }
        if pa.state != IBV_PORT_ACTIVE {
            notes.push(format!("{name}:{port} is {} (not ACTIVE)", port_state_name(pa.state)));
            continue;
        }
        let ll = pa.link_layer;
        if ll != IBV_LINK_LAYER_INFINIBAND as u8 && ll != IBV_LINK_LAYER_ETHERNET as u8 && ll != IBV_LINK_LAYER_UNSPECIFIED as u8 {
            notes.push(format!("{name}:{port} has link layer {ll}, neither InfiniBand nor Ethernet"));
            continue;
        }
        let roce = ll == IBV_LINK_LAYER_ETHERNET as u8;
        let gids = gid_table(v, ctx, name, port, pa.gid_tbl_len);
        // InfiniBand ignores NCCL_IB_GID_INDEX and takes NCCL_IB_ROUTABLE_FLID_GID_INDEX where
        // that GID holds a FLID, as net_ib.
        let chosen = match (cfg.ib_gid_index, roce) {
            (Some(i), true) => Some(i),
            (None, true) => select::choose_gid(&gids, cfg.ib_addr_family, cfg.ib_addr_range, cfg.ib_roce_version),
            (_, false) => Some(select::ib_gid_index(&gids, cfg.ib_routable_flid_gid_index)),
        };
        let Some(gi) = chosen else {
            notes.push(format!(
                "{name}:{port}: no RoCE GID of family {} {}(set NCCL_IB_GID_INDEX, or give the interface an address)",
                if cfg.ib_addr_family == libc::AF_INET6 { "AF_INET6" } else { "AF_INET" },
                cfg.ib_addr_range.map(|(a, l)| format!("in {a}/{l} ")).unwrap_or_default()
            ));
            continue;
        };
        let e = gids.iter().find(|e| e.index == gi);
        if roce && e.is_none() {
            notes.push(format!("{name}:{port}: NCCL_IB_GID_INDEX={gi} is empty or unreadable on this port"));
            continue;
        }
        // SAFETY: `ctx` is open (as for query_port above) and `port` one of its ports.
        let speed = unsafe { port_speed(v, ctx, port, &pa) };
        kept.push((port, pa, gi, e.map(|e| e.gid).unwrap_or([0; 16]), e.and_then(|e| e.roce_version), speed));
    }
    if kept.is_empty() {
        // SAFETY: no port was kept, so nothing was created on `ctx` (it was only queried) and it is
        // not used after this return: it is closed exactly once.
        unsafe { (v.close_device)(ctx) };
        return Ok(Vec::new());
    }
    // SAFETY: `alloc_pd` is ibv_alloc_pd, resolved with the C signature declared in Verbs; `ctx` is
    // the open context from above. ibv_alloc_pd(3) returns NULL on failure, checked below.
    let pd = unsafe { (v.alloc_pd)(ctx) };
    if pd.is_null() {
        // SAFETY: the PD allocation failed, so `ctx` has no resources on it, and it is not used
        // after this error return: it is closed exactly once.
        unsafe { (v.close_device)(ctx) };
        return Err(format!("{name}: ibv_alloc_pd failed: {}", std::io::Error::last_os_error()));
    }
    let pci_path = std::fs::canonicalize(format!("/sys/class/infiniband/{name}/device"))
        .ok()
        .map(|p| p.display().to_string())
        .filter(|p| p.contains("/pci"));
    let relaxed_ordering = match cfg.ib_relaxed_ordering {
        0 => false,
        _ => v.reg_mr_iova2.is_some(),
    };
    let dev = Arc::new(IbDevice {
        name: name.to_string(),
        ctx,
        pd,
        guid: u64::from_be(attr.sys_image_guid),
        max_qp: attr.max_qp,
        max_qp_wr: attr.max_qp_wr,
        max_cqe: attr.max_cqe,
        pci_path,
        mrs: Mutex::new(MrCache::new(page_size())),
        relaxed_ordering,
        dmabuf: probe_dmabuf(v, pd, name),
        fatal_events: AtomicU32::new(0),
        fatal_reason: Mutex::new(None),
        bad_qps: Mutex::new(Vec::new()),
        ports_down: AtomicU32::new(0),
        port_errs: AtomicU32::new(0),
        watch_events: std::sync::atomic::AtomicBool::new(false),
        events_polled: std::sync::atomic::AtomicU64::new(0),
        no_ece: std::sync::atomic::AtomicBool::new(false),
    });
    // Asynchronous events are polled, never waited for.
    // SAFETY: `ctx` is the non-null ibv_context from ibv_open_device, now held by `dev` and never
    // closed, so reading its async_fd field is valid. fcntl(2) F_GETFL/F_SETFL take no pointers,
    // and making async_fd non-blocking is how ibv_get_async_event(3) documents polling for events;
    // libibverbs does not rely on the fd blocking.
    unsafe {
        let fd = (*ctx).async_fd;
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl < 0 || libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) != 0 {
            log::warn!("NET/rivet: {name}: cannot make the async event fd non-blocking; device events are not watched");
        } else {
            dev.watch_events.store(true, Ordering::Relaxed);
        }
    }
    Ok(kept
        .into_iter()
        .map(|(port, pa, gi, gid, rv, speed)| IbPort {
            dev: dev.clone(),
            port,
            link_layer: if pa.link_layer == IBV_LINK_LAYER_UNSPECIFIED as u8 { IBV_LINK_LAYER_INFINIBAND as u8 } else { pa.link_layer },
            lid: pa.lid,
            mtu: pa.active_mtu,
            speed,
            gid_index: gi,
            gid,
            roce_version: rv,
            rail: filter.map_or(-1, |f| f.rail_plane(name, port).0),
            plane: filter.map_or(-1, |f| f.rail_plane(name, port).1),
            plane_idx: 0,
            adaptive_routing: cfg.ib_adaptive_routing.unwrap_or(pa.link_layer != IBV_LINK_LAYER_ETHERNET as u8),
            index: 0,
            nccl_pci_path: None,
            nccl_port: port as i32,
            grh_required: pa.flags & QPF_GRH_REQUIRED != 0,
        })
        .collect())
}

pub fn page_size() -> usize {
    // SAFETY: sysconf(3) takes an integer name, touches no caller memory and has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::device_order;

    #[test]
    fn ports_are_numbered_by_pci_path_unless_told_not_to() {
        let k = |p: Option<&str>, n: &str, port: u8| (p.map(String::from), n.to_string(), port);
        // libibverbs' order: by name, and a device with no PCI path (a software device) first.
        let keys = vec![
            k(None, "rxe0", 1),
            k(Some("/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0"), "mlx5_0", 1),
            k(Some("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.1"), "mlx5_1", 2),
            k(Some("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.1"), "mlx5_1", 1),
        ];
        assert_eq!(device_order(&keys, true), vec![3, 2, 1, 0]);
        assert_eq!(device_order(&keys, false), vec![0, 1, 2, 3]);
    }
}
