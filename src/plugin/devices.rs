//! The devices NCCL sees: discovered once (RDMA ports, else TCP interfaces), the start-up banner,
//! and `getProperties`.

use super::*;

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
    // SAFETY: Dl_info is plain C data; all-zero is valid (null pointers).
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let addr = library_path as *const c_void;
    // SAFETY: `addr` is a function of this library; dladdr only fills `info`, a local.
    if unsafe { libc::dladdr(addr, &mut info) } != 0 && !info.dli_fname.is_null() {
        // SAFETY: dladdr succeeded and dli_fname is not NULL: a NUL-terminated path owned by the
        // dynamic loader, valid while the library stays loaded (it is running this code).
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

pub(super) fn device(dev: i32) -> Result<&'static Device> {
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
