//! The version-independent core behind every exported `ncclNetPlugin_vN` table: the process-wide
//! device table, contexts, comms, requests and memory handles. The ABI shims in `abi/` convert
//! argument types and call these functions inside the FFI boundary.

use crate::abi::types::*;
use crate::config;
use crate::cuda;
use crate::error::{Error, Result};
use crate::log::INIT;
use crate::gdr;
use crate::topo::Topology;
use crate::proto::{self, Handle, HANDLE_SIZE};
use crate::transport::socket::{self, ifaces, Connector, Link, Listener, RecvConn, SendConn};
use crate::transport::verbs::dev::IbPort;
use crate::transport::verbs::{self, Setup};
use crate::staging::{NoRegistration, Registrar, Staged};
use crate::transport::{Conn, MrInfo, Path, RecvBuf, MAX_RECVS};
use crate::handles::{Guard, Kind, Stale, Table, Token, MAX_REQUESTS};
use std::collections::{HashMap, VecDeque};
use std::time::Instant;
use std::ffi::{c_char, c_void, CString};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// One network device as NCCL sees it.
pub struct Device {
    pub name: CString,
    pub pci_path: Option<CString>,
    pub guid: u64,
    pub speed: i32,
    pub port: i32,
    /// The TCP transport's interface, or the out-of-band interface of an RDMA port.
    pub iface: ifaces::Iface,
    /// The RDMA port, when this device is one.
    pub ib: Option<IbPort>,
}

pub struct Devices {
    pub list: Vec<Device>,
    pub transport: &'static str,
    /// Why the RDMA transport is not in use (when it is not).
    pub no_rdma: Option<String>,
}

/// Everything `getProperties` reports, before conversion to a versioned struct.
#[derive(Debug, Clone, Copy)]
pub struct Props {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: i32,
    pub reg_is_global: i32,
    pub force_flush: i32,
    pub speed: i32,
    pub port: i32,
    pub latency: f32,
    pub max_comms: i32,
    pub max_recvs: i32,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
}

static DEVICES: OnceLock<std::result::Result<Devices, Error>> = OnceLock::new();

fn discover() -> std::result::Result<Devices, Error> {
    let cfg = config::get();
    let no_rdma = if cfg.ib_disable {
        "NCCL_IB_DISABLE=1".to_string()
    } else {
        match verbs::dev::discover(cfg) {
            Ok(ports) => return verbs_devices(cfg, ports),
            Err(why) => why,
        }
    };
    let found = ifaces::select(cfg.socket_ifname.as_deref(), cfg.socket_family);
    if found.is_empty() {
        return Err(Error::system(match &cfg.socket_ifname {
            Some(s) => format!(
                "no usable network interface matches NCCL_SOCKET_IFNAME={s}: list the interfaces with `ip -br addr` and pick ones that are up and have an address"
            ),
            None => "no network interface with an IP address is up".to_string(),
        }));
    }
    let list = found
        .into_iter()
        .enumerate()
        .map(|(i, f)| Device {
            name: CString::new(f.name.clone()).unwrap_or_default(),
            pci_path: f.pci_path.as_ref().and_then(|p| CString::new(p.as_str()).ok()),
            guid: i as u64,
            speed: f.speed,
            port: 0,
            iface: f,
            ib: None,
        })
        .collect();
    Ok(Devices { list, transport: "TCP", no_rdma: Some(no_rdma) })
}

/// RDMA ports as NCCL devices; connection setup runs over the first usable IP interface.
fn verbs_devices(cfg: &config::Config, ports: Vec<IbPort>) -> std::result::Result<Devices, Error> {
    let Some(oob) = ifaces::select(cfg.socket_ifname.as_deref(), cfg.socket_family).into_iter().next() else {
        return Err(Error::system(
            "RDMA devices exist but no IP interface is up for the connection setup: bring one up or select it with NCCL_SOCKET_IFNAME",
        ));
    };
    if let Some(p) = verbs::dev::memlock_problem() {
        log::warn!("NET/rivet: {p}");
    }
    let list = ports
        .into_iter()
        .map(|p| Device {
            name: CString::new(p.dev.name.clone()).unwrap_or_default(),
            pci_path: p.dev.pci_path.as_ref().and_then(|s| CString::new(s.as_str()).ok()),
            guid: p.dev.guid,
            speed: p.speed,
            port: p.port as i32,
            iface: oob.clone(),
            ib: Some(p),
        })
        .collect();
    Ok(Devices { list, transport: "RDMA verbs", no_rdma: None })
}

/// The device table, discovered once per process.
pub fn devices_table() -> Result<&'static Devices> {
    DEVICES.get_or_init(discover).as_ref().map_err(|e| e.clone())
}

static BANNER: Mutex<u32> = Mutex::new(0);

fn library_path() -> String {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let addr = library_path as *const c_void;
    if unsafe { libc::dladdr(addr, &mut info) } != 0 && !info.dli_fname.is_null() {
        let p = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
        return std::fs::canonicalize(&p).map(|p| p.display().to_string()).unwrap_or(p);
    }
    "(unknown)".into()
}

/// `init` for every ABI version: idempotent; installs the logger, discovers devices once, and
/// logs the version banner once per ABI version used in this process.
pub fn init(logger: ncclDebugLogger_t, abi: u32) -> Result<()> {
    crate::log::install(logger);
    let devs = devices_table()?;
    let mut seen = BANNER.lock().unwrap_or_else(|p| p.into_inner());
    if *seen & (1 << abi) == 0 {
        *seen |= 1 << abi;
        log::info!(target: INIT, "NET/rivet: rivet {VERSION} loaded from {}, ncclNet v{abi} ABI", library_path());
        let pci = |d: &Device| {
            d.pci_path.as_ref().map(|p| p.to_string_lossy().into_owned()).unwrap_or_else(|| "none (virtual)".into())
        };
        for (i, d) in devs.list.iter().enumerate() {
            match &d.ib {
                Some(p) => log::info!(
                    target: INIT,
                    "NET/rivet: device {i}: {} speed {} Mb/s pci {} guid {:#x}{}; GPUDirect: peer memory {}, dma-buf {}",
                    p.describe(),
                    d.speed,
                    pci(d),
                    d.guid,
                    if p.dev.relaxed_ordering { " [RO]" } else { "" },
                    gdr::peermem(&topology().root).unwrap_or("none (no nvidia_peermem or nv_peer_mem module)"),
                    match &p.dev.dmabuf {
                        Ok(()) => "yes".to_string(),
                        Err(why) => format!("no ({why})"),
                    }
                ),
                None => log::info!(
                    target: INIT,
                    "NET/rivet: device {i}: {} {} speed {} Mb/s pci {}",
                    d.iface.name,
                    d.iface.addr,
                    d.speed,
                    pci(d)
                ),
            }
        }
        // Loads the CUDA driver (or says once why rivet is host-only).
        let _ = cuda::get();
        let cfg = config::get();
        match &devs.no_rdma {
            Some(why) => log::info!(
                target: INIT,
                "NET/rivet: transport TCP (RDMA not used: {why}), {} device(s), {} stream(s) per connection{}, timeout {}s",
                devs.list.len(),
                cfg.socket_nstreams,
                if cfg.socket_threads && cfg.socket_nstreams > 1 { " (helper threads for streams 2..)" } else { "" },
                cfg.timeout_secs
            ),
            None => log::info!(
                target: INIT,
                "NET/rivet: transport RDMA verbs via {}, {} device(s), {} QP(s) per connection, out-of-band {} {}, timeout {}s",
                crate::sys::verbs::get().map(|v| v.path.clone()).unwrap_or_default(),
                devs.list.len(),
                cfg.ib_qps,
                devs.list[0].iface.name,
                devs.list[0].iface.addr,
                cfg.timeout_secs
            ),
        }
    }
    Ok(())
}

pub fn ndevices() -> Result<i32> {
    Ok(devices_table()?.list.len() as i32)
}

fn device(dev: i32) -> Result<&'static Device> {
    let t = devices_table()?;
    usize::try_from(dev)
        .ok()
        .and_then(|d| t.list.get(d))
        .ok_or_else(|| Error::arg(format!("device {dev} does not exist (this host has {} rivet devices)", t.list.len())))
}

/// HOST everywhere. TCP: CUDA when RIVET_SOCKET_CUDA=1 and a CUDA driver works (staged).
/// RDMA: CUDA when RIVET_GDR is not off, a CUDA driver works and peer memory or dma-buf exists
/// (or RIVET_GDR=force); DMABUF when the NIC and GPU 0 support dma-buf and RIVET_DMABUF allows.
fn ptr_support(d: &Device) -> i32 {
    let cfg = config::get();
    let Some(port) = &d.ib else {
        return if cfg.socket_cuda && cuda::get().is_ok() { NCCL_PTR_HOST | NCCL_PTR_CUDA } else { NCCL_PTR_HOST };
    };
    if cfg.gdr == gdr::Mode::Off || cuda::get().is_err() {
        return NCCL_PTR_HOST;
    }
    let dmabuf = cfg.dmabuf && port.dev.dmabuf.is_ok() && cuda::gdr_attributes(0).is_ok_and(|(_, db)| db);
    let peermem = gdr::peermem(&topology().root).is_some();
    match (dmabuf, peermem || cfg.gdr == gdr::Mode::Force) {
        (true, _) => NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF,
        (false, true) => NCCL_PTR_HOST | NCCL_PTR_CUDA,
        (false, false) => NCCL_PTR_HOST,
    }
}

pub fn properties(dev: i32) -> Result<Props> {
    let d = device(dev)?;
    Ok(Props {
        name: d.name.as_ptr() as *mut c_char,
        pci_path: d.pci_path.as_ref().map_or(std::ptr::null_mut(), |p| p.as_ptr() as *mut c_char),
        guid: d.guid,
        ptr_support: ptr_support(d),
        reg_is_global: 1,
        force_flush: 0,
        speed: d.speed,
        port: d.port,
        latency: 0.0,
        // RDMA: one comm needs at least one queue pair.
        max_comms: d.ib.as_ref().map_or(65536, |p| p.dev.max_qp.max(1)),
        max_recvs: MAX_RECVS as i32,
        max_p2p_bytes: NCCL_MAX_NET_SIZE_BYTES,
        max_coll_bytes: MAX_COLLNET_SIZE,
    })
}

// ---------------------------------------------------------------------------------------------
// Handles. Every object handed to NCCL lives in a table of its kind and is named by a token (see
// `handles`): a stale or foreign handle is an error, found without reading through it.

static CTXS: Table<Ctx> = Table::new();
static LISTENS: Table<ListenComm> = Table::new();
static COMMS: Table<Comm> = Table::new();
static MRS: Table<Mr> = Table::new();

fn token(p: *mut c_void, kinds: &[Kind], what: &str) -> Result<Token> {
    match Token::from_ptr(p) {
        Some(t) if kinds.contains(&t.kind) => Ok(t),
        _ if p.is_null() => Err(Error::internal(format!("{what} is NULL"))),
        _ => Err(Error::internal(format!("{what} {p:p} is not a rivet {what}"))),
    }
}

fn stale(what: &str, p: *mut c_void, s: Stale) -> Error {
    match s {
        Stale::Poisoned => Error::internal(format!("{what} {p:p} unusable after an earlier internal error")),
        Stale::Closed => Error::internal(format!("{what} {p:p} was already closed")),
        Stale::Foreign => Error::internal(format!("{what} {p:p} is not a rivet {what}")),
    }
}

fn full(what: &str) -> Error {
    Error::internal(format!("too many open {what}s"))
}

// The connect stages NCCL keeps in its handle buffer between calls: a pointer and a cookie,
// checked here before use.
static STAGES: Mutex<Option<HashMap<usize, u64>>> = Mutex::new(None);

fn stages() -> MutexGuard<'static, Option<HashMap<usize, u64>>> {
    STAGES.lock().unwrap_or_else(|p| p.into_inner())
}

fn stage_register(p: usize, cookie: u64) {
    stages().get_or_insert_with(HashMap::new).insert(p, cookie);
}

/// Remove stage `p` if it is live with `cookie`.
fn stage_unregister(p: usize, cookie: u64) -> bool {
    let mut g = stages();
    let m = g.get_or_insert_with(HashMap::new);
    if m.get(&p) == Some(&cookie) {
        m.remove(&p);
        true
    } else {
        false
    }
}

fn stage_live(p: usize, cookie: u64) -> bool {
    stages().as_ref().and_then(|m| m.get(&p)).copied() == Some(cookie)
}

// ---------------------------------------------------------------------------------------------
// Contexts (v11/v12: one per NCCL communicator).

pub struct Ctx {
    pub comm_id: u64,
    pub traffic_class: i32,
}

static NCTX: AtomicU32 = AtomicU32::new(0);

pub fn ctx_new(comm_id: u64, traffic_class: i32) -> Result<*mut c_void> {
    let p = CTXS.insert(Kind::Ctx, Ctx { comm_id, traffic_class }).ok_or_else(|| full("context"))?.to_ptr();
    let n = NCTX.fetch_add(1, Ordering::Relaxed) + 1;
    log::trace!("NET/rivet: context {p:p} for communicator {comm_id:#x} ({n} open)");
    Ok(p)
}

fn unknown_ctx(ctx: *mut c_void) -> Error {
    Error::internal(format!("unknown plugin context {ctx:p} (not returned by init, or finalized)"))
}

/// Checks a context; returns its traffic class when the communicator set one.
pub fn ctx_check(ctx: *mut c_void) -> Result<Option<u8>> {
    let t = Token::from_ptr(ctx).filter(|t| t.kind == Kind::Ctx).ok_or_else(|| unknown_ctx(ctx))?;
    let tc = CTXS.get(t).map_err(|_| unknown_ctx(ctx))?.traffic_class;
    Ok(u8::try_from(tc).ok())
}

pub fn ctx_finalize(ctx: *mut c_void) -> Result<()> {
    let bad = || Error::internal(format!("finalize of an unknown or already finalized context {ctx:p}"));
    let t = Token::from_ptr(ctx).filter(|t| t.kind == Kind::Ctx).ok_or_else(bad)?;
    let c = CTXS.remove(t).map_err(|_| bad())?;
    let n = NCTX.fetch_sub(1, Ordering::Relaxed) - 1;
    log::trace!("NET/rivet: finalized context for communicator {:#x} ({n} open)", c.comm_id);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Listen, connect, accept.

pub struct ListenComm {
    dev: i32,
    listener: Listener,
    /// RDMA setups of connections whose TCP handshake is done.
    setups: Vec<Setup>,
}

fn transport_of(d: &Device) -> u8 {
    if d.ib.is_some() {
        proto::TRANSPORT_VERBS
    } else {
        proto::TRANSPORT_SOCKET
    }
}

fn transport_name(t: u8) -> &'static str {
    match t {
        proto::TRANSPORT_SOCKET => "TCP",
        proto::TRANSPORT_VERBS => "RDMA verbs",
        _ => "unknown",
    }
}

fn socket_send(link: Link) -> Box<dyn Conn> {
    log::info!("NET/rivet: connected to {} over TCP with {} stream(s)", link.peer, link.fds.len());
    Box::new(SendConn::new(link.fds, link.peer, link.min_chunk))
}

fn socket_recv(link: Link) -> Box<dyn Conn> {
    log::info!("NET/rivet: accepted a TCP connection from {} with {} stream(s)", link.peer, link.fds.len());
    Box::new(RecvConn::new(link.fds, link.peer, link.min_chunk))
}

/// A connect in progress, kept between NCCL's calls.
enum Stage {
    Tcp(Connector),
    Verbs(Box<Setup>),
}

fn handle_buf<'a>(handle: *mut c_void) -> Result<&'a mut [u8; HANDLE_SIZE]> {
    if handle.is_null() {
        return Err(Error::internal("handle is NULL"));
    }
    Ok(unsafe { &mut *(handle as *mut [u8; HANDLE_SIZE]) })
}

/// A connector in progress: its stage (registered in STAGES with its cookie), when NCCL last
/// called connect for it, and whom it connects to.
struct Connecting {
    stage: usize,
    cookie: u64,
    last: Instant,
    peer: std::net::SocketAddr,
}

/// Every connect call holds this lock for its whole run, so reaping never frees a stage another
/// call is using. NCCL may give up on a peer after a few connect calls and never call again; the
/// stage's sockets would then stay open for the life of the process.
static CONNECTING: Mutex<Vec<Connecting>> = Mutex::new(Vec::new());
/// The stages reaped lately (pointer, cookie), so that a later call with such a handle is told why.
static REAPED: Mutex<VecDeque<(usize, u64)>> = Mutex::new(VecDeque::new());

fn connecting() -> MutexGuard<'static, Vec<Connecting>> {
    CONNECTING.lock().unwrap_or_else(|p| p.into_inner())
}

/// Free the connectors NCCL has not called for RIVET_TIMEOUT (all but `keep`, the one being
/// called now), with a WARN each.
fn reap_connectors(g: &mut Vec<Connecting>, keep: Option<(usize, u64)>) {
    let t = config::get().timeout();
    let mut i = 0;
    while i < g.len() {
        let c = &g[i];
        if Some((c.stage, c.cookie)) == keep || c.last.elapsed() <= t {
            i += 1;
            continue;
        }
        let c = g.swap_remove(i);
        if stage_unregister(c.stage, c.cookie) {
            // SAFETY: the stage was registered by connect and just unregistered here, under the
            // lock every connect call holds: nobody else can reach it.
            drop(unsafe { Box::from_raw(c.stage as *mut Stage) });
        }
        log::warn!(
            "NET/rivet: connect to {}: abandoned: NCCL has not called connect for it for {:.0} s (more than RIVET_TIMEOUT={}s); its sockets are closed and a later call with its handle fails",
            c.peer,
            c.last.elapsed().as_secs_f64(),
            t.as_secs()
        );
        let mut r = REAPED.lock().unwrap_or_else(|p| p.into_inner());
        if r.len() >= 1024 {
            r.pop_front();
        }
        r.push_back((c.stage, c.cookie));
    }
}

pub fn listen(dev: i32, handle: *mut c_void) -> Result<*mut c_void> {
    reap_connectors(&mut connecting(), None);
    let d = device(dev)?;
    let buf = handle_buf(handle)?;
    let (l, h) = Listener::new(&d.iface, transport_of(d), config::get().timeout())?;
    h.encode(buf);
    log::trace!("NET/rivet: listening on {} (dev {dev})", l.addr);
    let lc = ListenComm { dev, listener: l, setups: Vec::new() };
    Ok(LISTENS.insert(Kind::Listen, lc).ok_or_else(|| full("listen comm"))?.to_ptr())
}

/// Non-blocking connect: Ok(null) until the connection is up; NCCL calls again with the same handle.
pub fn connect(dev: i32, handle: *mut c_void, traffic_class: Option<u8>) -> Result<*mut c_void> {
    let d = device(dev)?;
    let buf = handle_buf(handle)?;
    // A foreign or corrupted handle is reported as such, whatever its stage bytes hold.
    let h = Handle::decode(buf).map_err(|e| Error::usage(format!("connect: {e}")))?;
    let (sp, cookie) = proto::stage_get(buf);
    let mut g = connecting();
    reap_connectors(&mut g, Some((sp as usize, cookie)));
    let conn_ptr = if sp != 0 {
        if !stage_live(sp as usize, cookie) {
            let reaped = REAPED.lock().unwrap_or_else(|p| p.into_inner()).contains(&(sp as usize, cookie));
            if reaped {
                // The next call with this handle starts a new connect.
                proto::stage_set(buf, 0, 0);
                return Err(Error::remote(format!(
                    "connect to {}: this connect was abandoned (no call for more than RIVET_TIMEOUT) and its state released; the peer never completed the connection",
                    h.addr
                )));
            }
            return Err(Error::internal(
                "the handle carries a connect stage this process does not know (a handle reused across processes while its connect was in progress?)",
            ));
        }
        if let Some(c) = g.iter_mut().find(|c| c.stage == sp as usize && c.cookie == cookie) {
            c.last = Instant::now();
        }
        sp as *mut Stage
    } else {
        if h.transport != transport_of(d) {
            return Err(Error::usage(format!(
                "connect: the peer listens with the {} transport but device {dev} here uses {}: every rank must see the same kind of network (set NCCL_IB_DISABLE=1 everywhere to use TCP)",
                transport_name(h.transport),
                transport_name(transport_of(d))
            )));
        }
        let cfg = config::get();
        let nstreams = if d.ib.is_some() { 1 } else { cfg.socket_nstreams };
        let c = Connector::new(&h, nstreams, cfg.socket_min_chunk, cfg.timeout())?;
        let p = Box::into_raw(Box::new(Stage::Tcp(c)));
        let cookie = socket::random_u64();
        stage_register(p as usize, cookie);
        proto::stage_set(buf, p as u64, cookie);
        g.push(Connecting { stage: p as usize, cookie, last: Instant::now(), peer: h.addr });
        p
    };
    let stage = unsafe { &mut *conn_ptr };
    let r = (|| loop {
        match stage {
            Stage::Tcp(c) => match c.poll()? {
                None => return Ok(None),
                Some(link) => match &d.ib {
                    None => return Ok(Some(socket_send(link))),
                    Some(port) => *stage = Stage::Verbs(Box::new(Setup::connector(port, link, traffic_class)?)),
                },
            },
            Stage::Verbs(s) => return s.poll(),
        }
    })();
    let mut finish = |buf: &mut [u8; HANDLE_SIZE]| {
        let (_, cookie) = proto::stage_get(buf);
        stage_unregister(conn_ptr as usize, cookie);
        g.retain(|c| !(c.stage == conn_ptr as usize && c.cookie == cookie));
        proto::stage_set(buf, 0, 0);
        drop(unsafe { Box::from_raw(conn_ptr) });
    };
    match r {
        Ok(None) => Ok(std::ptr::null_mut()),
        Ok(Some(conn)) => {
            finish(buf);
            Comm::open(dev, conn, true)
        }
        Err(e) => {
            finish(buf);
            Err(e)
        }
    }
}

/// Non-blocking accept: Ok(null) until a connection has fully arrived.
pub fn accept(lc: *mut c_void) -> Result<*mut c_void> {
    reap_connectors(&mut connecting(), None);
    let t = Token::from_ptr(lc).filter(|t| t.kind == Kind::Listen).ok_or_else(|| Error::internal(format!("unknown listen comm {lc:p}")))?;
    let mut g = LISTENS.get(t).map_err(|e| stale("listen comm", lc, e))?;
    let dev = g.dev;
    let d = device(dev)?;
    while let Some(link) = g.listener.accept()? {
        match &d.ib {
            None => return Comm::open(dev, socket_recv(link), false),
            Some(port) => g.setups.push(Setup::acceptor(port, link)),
        }
    }
    for i in 0..g.setups.len() {
        match g.setups[i].poll() {
            Ok(None) => {}
            Ok(Some(conn)) => {
                g.setups.swap_remove(i);
                return Comm::open(dev, conn, false);
            }
            Err(e) => {
                g.setups.swap_remove(i);
                return Err(e);
            }
        }
    }
    Ok(std::ptr::null_mut())
}

pub fn close_listen(lc: *mut c_void) -> Result<()> {
    let bad = || Error::internal(format!("closeListen of an unknown or already closed listen comm {lc:p}"));
    let t = Token::from_ptr(lc).filter(|t| t.kind == Kind::Listen).ok_or_else(bad)?;
    drop(LISTENS.remove(t).map_err(|_| bad())?);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Comms and requests.

/// A send or receive comm: its device and its data path. NCCL holds a token for it, and one per
/// request slot (the same token with the slot in it).
pub struct Comm {
    send: bool,
    dev: i32,
    conn: Staged,
}

impl Comm {
    fn open(dev: i32, conn: Box<dyn Conn>, send: bool) -> Result<*mut c_void> {
        let d = device(dev).ok();
        let registrar: Box<dyn Registrar> = match d.and_then(|d| d.ib.as_ref()) {
            Some(port) => Box::new(VerbsRegistrar { port, access: access_for(send) }),
            None => Box::new(NoRegistration),
        };
        let label = format!(
            "{} comm on dev {dev} ({})",
            if send { "send" } else { "recv" },
            d.map(|d| d.name.to_string_lossy().into_owned()).unwrap_or_default()
        );
        let conn = Staged::new(conn, send, label, registrar);
        if conn.capacity() > MAX_REQUESTS {
            return Err(Error::internal(format!("a comm with {} request slots (at most {MAX_REQUESTS})", conn.capacity())));
        }
        let kind = if send { Kind::SendComm } else { Kind::RecvComm };
        Ok(COMMS.insert(kind, Comm { send, dev, conn }).ok_or_else(|| full("comm"))?.to_ptr())
    }
}

fn kind_name(send: bool) -> &'static str {
    if send {
        "send comm"
    } else {
        "recv comm"
    }
}

/// The comm behind a send (`send`) or receive comm handle, locked for this call.
fn comm(p: *mut c_void, send: bool) -> Result<(Token, Guard<'static, Comm>)> {
    let what = kind_name(send);
    let t = token(p, &[if send { Kind::SendComm } else { Kind::RecvComm }], what)?;
    Ok((t, COMMS.get(t).map_err(|e| stale(what, p, e))?))
}

/// Either kind of comm (memory registration accepts both).
fn any_comm(p: *mut c_void) -> Result<Guard<'static, Comm>> {
    let t = Token::from_ptr(p)
        .filter(|t| matches!(t.kind, Kind::SendComm | Kind::RecvComm))
        .ok_or_else(|| Error::internal(format!("unknown comm {p:p} (not a live send or receive comm)")))?;
    COMMS.get(t).map_err(|e| stale("comm", p, e))
}

/// The registration behind a memory handle NCCL passes on the data path, copied out.
fn mr_info(mh: *mut c_void) -> Result<Option<MrInfo>> {
    if mh.is_null() {
        return Ok(None);
    }
    let t = token(mh, &[Kind::Mr], "memory handle")?;
    Ok(Some(MRS.get(t).map_err(|e| stale("memory handle", mh, e))?.info))
}

/// The registration of buffer `i` of a grouped call (`mh` may be NULL: no handles at all).
///
/// # Safety
/// A non-NULL `mh` holds at least `i + 1` handles.
unsafe fn mr_at(mh: *mut *mut c_void, i: usize) -> Result<Option<MrInfo>> {
    if mh.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's promise.
    mr_info(unsafe { *mh.add(i) })
}

fn request(t: Token, slot: Option<u32>) -> *mut c_void {
    slot.map_or(std::ptr::null_mut(), |s| t.request(s).to_ptr())
}

pub fn isend(sc: *mut c_void, data: *mut c_void, size: usize, tag: i32, mh: *mut c_void) -> Result<*mut c_void> {
    let (t, mut c) = comm(sc, true)?;
    if data.is_null() && size > 0 {
        return Err(Error::internal(format!("isend of {size} bytes from a NULL buffer")));
    }
    let slot = c.conn.isend(data as *const u8, size, tag, mr_info(mh)?)?;
    if c.conn.has_pending_sends() {
        pending_add(t);
    }
    Ok(request(t, slot))
}

// A staged send is handed to the transport only after its device-to-host copy, which calls on
// its comm notice. NCCL tests every outstanding request, but a caller may post a send and then
// wait on a receive from a peer that needs that send first (NCCL's IB transport has the send on
// the wire by then). So comms with staged sends still waiting are listed here, and every `test`
// and `irecv` moves them on too.
static PENDING: Mutex<Vec<Token>> = Mutex::new(Vec::new());
static NPENDING: AtomicU32 = AtomicU32::new(0);

fn pending_add(c: Token) {
    let mut g = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    if !g.contains(&c) {
        g.push(c);
        NPENDING.store(g.len() as u32, Ordering::Release);
    }
}

fn pending_remove(c: Token) {
    let mut g = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    g.retain(|&x| x != c);
    NPENDING.store(g.len() as u32, Ordering::Release);
}

/// Move other comms' waiting staged sends on (comm locks only tried, never waited for). `except`
/// is the comm of the call being made, whose lock that call holds.
fn progress_pending(except: Token) {
    if NPENDING.load(Ordering::Acquire) == 0 {
        return;
    }
    let mut g = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    g.retain(|&t| {
        if t.same_object(except) {
            return true;
        }
        match COMMS.try_get(t) {
            Some(mut c) => {
                // An error stays with that comm's transport and surfaces at its own test.
                let _ = c.conn.progress_pending();
                c.conn.has_pending_sends()
            }
            // Held by another call (which moves it on itself), or closed (then it goes below).
            None => COMMS.live(t),
        }
    });
    NPENDING.store(g.len() as u32, Ordering::Release);
}

/// # Safety
/// `data` and `tags` must point to `n` elements each, and a non-NULL `mh` too (NULL is checked
/// here).
pub unsafe fn irecv(
    rc: *mut c_void,
    n: i32,
    data: *mut *mut c_void,
    size_of: impl Fn(usize) -> Result<usize>,
    tags: *mut i32,
    mh: *mut *mut c_void,
) -> Result<*mut c_void> {
    if n < 1 || n as usize > MAX_RECVS {
        comm(rc, false)?;
        return Err(Error::internal(format!("irecv with n={n}: rivet accepts 1 to {MAX_RECVS} buffers (maxRecvs)")));
    }
    if data.is_null() || tags.is_null() {
        comm(rc, false)?;
        return Err(Error::internal("irecv with a NULL data or tags array"));
    }
    let (t, mut c) = comm(rc, false)?;
    let mut bufs = [RecvBuf::EMPTY; MAX_RECVS];
    for (i, b) in bufs.iter_mut().enumerate().take(n as usize) {
        let size = size_of(i)?;
        // SAFETY: i < n, the caller's promise for `data`, `tags` and `mh`.
        let (ptr, tag, mr) = unsafe { (*data.add(i) as *mut u8, *tags.add(i), mr_at(mh, i)?) };
        if ptr.is_null() && size > 0 {
            return Err(Error::internal(format!("irecv buffer {i} of {size} bytes is NULL")));
        }
        *b = RecvBuf { ptr, size, tag, mr };
    }
    let slot = c.conn.irecv(&bufs[..n as usize])?;
    drop(c);
    progress_pending(t);
    Ok(request(t, slot))
}

/// `iflush` after a receive completed: the transport decides whether there is anything to wait
/// for (TCP never; verbs issues its 1-byte RDMA READ). NULL request: nothing to wait for.
///
/// # Safety
/// Non-NULL `data` and `sizes` point to `n` elements each, and a non-NULL `mh` too.
pub unsafe fn iflush(rc: *mut c_void, n: i32, data: *mut *mut c_void, sizes: *mut i32, mh: *mut *mut c_void) -> Result<*mut c_void> {
    if n < 0 || n as usize > MAX_RECVS {
        return Err(Error::internal(format!("iflush with n={n}")));
    }
    let (t, mut c) = comm(rc, false)?;
    if n == 0 || data.is_null() || sizes.is_null() {
        return Ok(std::ptr::null_mut());
    }
    let mut bufs = [RecvBuf::EMPTY; MAX_RECVS];
    for (i, b) in bufs.iter_mut().enumerate().take(n as usize) {
        // SAFETY: i < n, the caller's promise.
        let (size, ptr, mr) = unsafe { ((*sizes.add(i)).max(0) as usize, *data.add(i) as *mut u8, mr_at(mh, i)?) };
        *b = RecvBuf { ptr, size, tag: 0, mr };
    }
    let slot = c.conn.iflush(&bufs[..n as usize])?;
    Ok(request(t, slot))
}

/// `test`: progress the request's comm; when done, sizes (one per buffer) go to `sizes` if non-NULL.
///
/// # Safety
/// `done` points to an int, a non-NULL `sizes` to as many as the request has buffers (NCCL's
/// contract: the `n` of its irecv).
pub unsafe fn test(req: *mut c_void, done: *mut i32, sizes: *mut i32) -> Result<()> {
    if req.is_null() || done.is_null() {
        return Err(Error::internal("test with a NULL request or done pointer"));
    }
    // SAFETY: `done` is not NULL, and points to an int (the caller's promise).
    unsafe { *done = 0 };
    let Some(t) = Token::from_ptr(req).filter(|t| t.kind == Kind::Request) else {
        return Err(Error::internal(format!("test on {req:p}, which is not a rivet request")));
    };
    let mut c = COMMS.get(t).map_err(|e| match e {
        Stale::Closed => Error::internal(format!("test on request {req:p} of a comm that was already closed")),
        e => stale("request", req, e),
    })?;
    let dev = c.dev;
    let mut out = [0usize; MAX_RECVS];
    let res = c.conn.test(t.req, &mut out);
    drop(c);
    progress_pending(t);
    // SAFETY (each write below): the caller's promise for `done` and `sizes`.
    match res {
        Ok(None) => {}
        Ok(Some(n)) => unsafe {
            *done = 1;
            if !sizes.is_null() {
                for (i, s) in out.iter().enumerate().take(n) {
                    *sizes.add(i) = (*s).min(i32::MAX as usize) as i32;
                }
            }
        },
        Err(e) => return Err(Error::new(e.kind, format!("{e} [dev {dev}]"))),
    }
    Ok(())
}

pub fn close_comm(p: *mut c_void, send: bool) -> Result<()> {
    let what = if send { "closeSend" } else { "closeRecv" };
    let bad = || Error::internal(format!("{what} of an unknown or already closed comm {p:p}"));
    let t = Token::from_ptr(p).filter(|t| t.kind == if send { Kind::SendComm } else { Kind::RecvComm }).ok_or_else(bad)?;
    let c = COMMS.remove(t).map_err(|_| bad())?;
    pending_remove(t);
    // Its transport's resources go now; every token of it (its requests) is stale from here on.
    drop(c);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Memory registration.

/// What a memory handle names.
pub struct Mr {
    pub info: MrInfo,
    pub ty: i32,
    /// The `ibv_mr` behind it (verbs only).
    verbs: Option<VerbsReg>,
}

/// IBV access flags of a comm's registrations: receive buffers take remote writes (and the
/// flush's read); send buffers are only read locally.
fn access_for(send: bool) -> u32 {
    use crate::sys::ib::*;
    if send {
        0
    } else {
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ
    }
}

/// The data path's view of a verbs registration.
fn mr_info_of(m: *mut crate::sys::ib::ibv_mr, access: u32, dev: &crate::transport::verbs::dev::IbDevice, path: Path) -> MrInfo {
    let m = unsafe { &*m };
    MrInfo { addr: m.addr as usize, len: m.length, lkey: m.lkey, rkey: m.rkey, access, dev: dev as *const _ as usize, path, gpu: None }
}

/// Register `[addr, addr+size)` on an RDMA port through its device's MR cache; returns the
/// registration and the cached `ibv_mr` to release it with.
fn verbs_register(port: &'static IbPort, addr: usize, size: usize, access: u32) -> Result<(MrInfo, usize)> {
    let dev = &port.dev;
    let mut cache = dev.mrs.lock().unwrap_or_else(|p| p.into_inner());
    let lease = cache.acquire(addr, size, access as i32, |a, l, acc| dev.register(a, l, acc).map(|m| m as usize))?;
    drop(cache);
    let info = mr_info_of(lease.mr as *mut _, access, dev, Path::Host);
    log::trace!(
        "NET/rivet: register {addr:#x} {size} bytes on {} -> MR [{:#x}, +{}) lkey {:#x} rkey {:#x} access {access:#x} refs {}{}",
        dev.name,
        info.addr,
        info.len,
        info.lkey,
        info.rkey,
        lease.refs,
        if lease.fresh { " (registered)" } else { " (cached)" }
    );
    Ok((info, lease.mr))
}

fn verbs_release(port: &IbPort, mr: usize) -> Result<()> {
    let dev = &port.dev;
    let v = crate::sys::verbs::get().map_err(|e| Error::system(e.0))?;
    let left = dev.mrs.lock().unwrap_or_else(|p| p.into_inner()).release(mr, |mr| {
        let rc = unsafe { (v.dereg_mr)(mr as *mut _) };
        if rc != 0 {
            return Err(Error::system(format!("{}: ibv_dereg_mr failed: {}", dev.name, std::io::Error::from_raw_os_error(rc))));
        }
        Ok(())
    })?;
    log::trace!("NET/rivet: release on {}: MR {mr:#x} refs {left}{}", dev.name, if left == 0 { " (deregistered)" } else { "" });
    Ok(())
}

/// Bounce buffers of a staged comm on an RDMA port.
struct VerbsRegistrar {
    port: &'static IbPort,
    access: u32,
}

impl Registrar for VerbsRegistrar {
    fn register(&self, addr: usize, len: usize) -> Result<(MrInfo, usize)> {
        verbs_register(self.port, addr, len, self.access)
    }
    fn release(&self, handle: usize) {
        if let Err(e) = verbs_release(self.port, handle) {
            log::warn!("NET/rivet: staging bounce buffer: {e}");
        }
    }
}

/// The machine's topology, probed once (sysfs at RIVET_SYSFS_ROOT, else /sys).
fn topology() -> &'static Topology {
    static T: OnceLock<Topology> = OnceLock::new();
    T.get_or_init(|| Topology::probe(&Topology::default_root()))
}

/// TCP: GPU memory goes through the staging engine, and only with RIVET_SOCKET_CUDA=1.
fn stage_cuda_tcp(c: &mut Comm, d: &Device, data: *mut c_void, size: usize) -> Result<MrInfo> {
    if !config::get().socket_cuda {
        return Err(Error::usage(format!(
            "regMr of GPU memory on dev {} ({}, TCP transport): rivet's TCP transport takes GPU buffers only with RIVET_SOCKET_CUDA=1 (without it ptrSupport does not offer NCCL_PTR_CUDA)",
            c.dev,
            d.name.to_string_lossy()
        )));
    }
    let pi = cuda::pointer_info(data as usize)?;
    if c.conn.ensure_copier(Some(pi.ordinal))? {
        log::info!("NET/rivet: host staging for GPU {} on {}: TCP transport (RIVET_SOCKET_CUDA=1)", pi.bus_id, d.name.to_string_lossy());
    }
    Ok(staged_mr(data, size, Some(pi.ordinal)))
}

fn staged_mr(data: *mut c_void, size: usize, gpu: Option<i32>) -> MrInfo {
    MrInfo { addr: data as usize, len: size, path: Path::Staged, gpu, ..Default::default() }
}

/// The facts GDR is decided on, for the GPU owning `pi` and this port.
fn gdr_facts(port: &IbPort, pi: &cuda::PtrInfo, via: gdr::Via) -> Result<gdr::Facts> {
    let cfg = config::get();
    let topo = topology();
    let (gpu_gdr, gpu_dmabuf) = cuda::gdr_attributes(pi.ordinal)?;
    let dmabuf = if !cfg.dmabuf {
        Err("RIVET_DMABUF=off".to_string())
    } else if !gpu_dmabuf {
        Err("the GPU does not support dma-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0)".to_string())
    } else {
        port.dev.dmabuf.clone()
    };
    let (path, gpu_numa, nic_numa) = gdr::locate(topo, &pi.bus_id, &port.dev.name);
    Ok(gdr::Facts {
        mode: cfg.gdr,
        level: cfg.gdr_level,
        path,
        gpu_numa,
        nic_numa,
        gpu_gdr,
        peermem: gdr::peermem(&topo.root),
        dmabuf,
        via,
    })
}

/// A verbs registration a memory handle owns: the `ibv_mr`, its port, and whether it is in the
/// device's MR cache (dma-buf registrations are not).
type VerbsReg = (usize, &'static IbPort, bool);

/// GPU memory on an RDMA port: GDR where the decision and the registration itself allow it,
/// host staging otherwise. The decision is made, and logged, once per (comm, GPU); a failed
/// registration turns the comm to staging and says why.
fn reg_gpu_verbs(
    c: &mut Comm,
    port: &'static IbPort,
    data: *mut c_void,
    size: usize,
    dmabuf: Option<(u64, i32)>,
) -> Result<(MrInfo, Option<VerbsReg>)> {
    let pi = cuda::pointer_info(data as usize)?;
    let via = if dmabuf.is_some() { gdr::Via::DmaBuf } else { gdr::Via::Address };
    let nic = &port.dev.name;
    let send = c.send;
    let g = &mut c.conn;
    let (decision, first) = match &g.gpu {
        Some((o, d)) if *o == pi.ordinal => (d.clone(), false),
        Some((o, _)) => {
            return Err(Error::usage(format!(
                "regMr of memory on GPU {} (CUDA device {}) on a comm that serves CUDA device {o}: one comm serves one GPU",
                pi.bus_id, pi.ordinal
            )))
        }
        None => (gdr::decide(&gdr_facts(port, &pi, via)?), true),
    };
    let access = access_for(send);
    let mech = if dmabuf.is_some() { "dma-buf" } else { "peer-memory" };
    let reg = gdr::register_or_stage(
        &decision,
        || match dmabuf {
            Some((offset, fd)) => {
                let m = port.dev.register_dmabuf(offset, size, data as u64, fd, access as i32)?;
                // The ibv_mr of a dma-buf registration has the offset in its addr field; the
                // buffer the data path checks against is the GPU address range registered.
                let mut info = mr_info_of(m, access, &port.dev, Path::Gdr);
                (info.addr, info.len) = (data as usize, size);
                Ok((info, m as usize, false))
            }
            None => verbs_register(port, data as usize, size, access).map(|(i, m)| (i, m, true)),
        },
        mech,
    );
    match reg {
        Ok((mut info, mr, cached)) => {
            info.path = Path::Gdr;
            info.gpu = Some(pi.ordinal);
            if first {
                if let gdr::Decision::Gdr(why) = &decision {
                    log::info!("NET/rivet: GDR on {nic} for GPU {}: {why}", pi.bus_id);
                }
                g.gpu = Some((pi.ordinal, decision));
            }
            Ok((info, Some((mr, port, cached))))
        }
        Err(why) => {
            g.ensure_copier(Some(pi.ordinal))?;
            if first || matches!(decision, gdr::Decision::Gdr(_)) {
                log::info!("NET/rivet: host staging for GPU {} on {nic}: {why}", pi.bus_id);
                g.gpu = Some((pi.ordinal, gdr::Decision::Staging(why)));
            }
            Ok((staged_mr(data, size, Some(pi.ordinal)), None))
        }
    }
}

/// `regMr` (`dmabuf` None) and `regMrDmaBuf` (`dmabuf` = offset and fd, which is not kept).
pub fn reg_mr(comm: *mut c_void, data: *mut c_void, size: usize, ty: i32, dmabuf: Option<(u64, i32)>) -> Result<*mut c_void> {
    let mut g = any_comm(comm)?;
    let c = &mut *g;
    let d = device(c.dev)?;
    if data.is_null() && size > 0 {
        return Err(Error::internal(format!("regMr of {size} bytes at NULL")));
    }
    let gpu = match ty {
        NCCL_PTR_HOST => false,
        NCCL_PTR_CUDA | NCCL_PTR_DMABUF => true,
        _ => return Err(Error::arg(format!("regMr with unknown pointer type {ty:#x} (NCCL_PTR_HOST=1, CUDA=2, DMABUF=4)"))),
    };
    let (info, verbs) = match (&d.ib, gpu) {
        (None, true) => (stage_cuda_tcp(c, d, data, size)?, None),
        (Some(port), true) => reg_gpu_verbs(c, port, data, size, dmabuf.filter(|(_, fd)| *fd >= 0))?,
        (_, false) if config::get().stage_host => {
            c.conn.ensure_copier(None)?;
            (staged_mr(data, size, None), None)
        }
        (None, false) => (MrInfo { addr: data as usize, len: size, ..Default::default() }, None),
        (Some(port), false) => {
            let (info, mr) = verbs_register(port, data as usize, size, access_for(c.send))?;
            (info, Some((mr, port, true)))
        }
    };
    let path = info.path;
    let m = Mr { info, ty, verbs };
    let p = match MRS.insert(Kind::Mr, m) {
        Some(t) => t.to_ptr(),
        None => {
            release_verbs(Mr { info, ty, verbs })?;
            return Err(full("memory handle"));
        }
    };
    log::trace!("NET/rivet: regMr {data:p} {size} bytes type {ty} path {path:?} -> {p:p}");
    Ok(p)
}

pub fn dereg_mr(_comm: *mut c_void, mh: *mut c_void) -> Result<()> {
    let bad = || Error::internal(format!("deregMr of an unknown or already released memory handle {mh:p}"));
    let t = Token::from_ptr(mh).filter(|t| t.kind == Kind::Mr).ok_or_else(bad)?;
    let m = MRS.remove(t).map_err(|_| bad())?;
    release_verbs(m)
}

/// Release the verbs registration a memory handle owned, if any.
fn release_verbs(m: Mr) -> Result<()> {
    match m.verbs {
        Some((mr, port, true)) => verbs_release(port, mr)?,
        Some((mr, port, false)) => {
            let v = crate::sys::verbs::get().map_err(|e| Error::system(e.0))?;
            let rc = unsafe { (v.dereg_mr)(mr as *mut _) };
            if rc != 0 {
                return Err(Error::system(format!(
                    "{}: ibv_dereg_mr of a dma-buf registration failed: {}",
                    port.dev.name,
                    std::io::Error::from_raw_os_error(rc)
                )));
            }
        }
        None => {}
    }
    log::trace!("NET/rivet: deregMr {:#x} {} bytes", m.info.addr, m.info.len);
    Ok(())
}
