//! The devices NCCL sees: discovered once (RDMA ports, else TCP interfaces), the start-up banner,
//! and `getProperties`.

use crate::error::{Error, Result};
use crate::gpu::cuda;
use crate::log::INIT;
use crate::transport::{self, Devices, PtrSupport, Transport, MAX_RECVS};
use std::ffi::{c_char, c_void};
use std::sync::{Mutex, OnceLock};

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Everything `getProperties` reports, before conversion to a versioned struct (which adds the
/// ABI's own constants: device type, size limits).
#[derive(Debug, Clone, Copy)]
pub struct Props {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr: PtrSupport,
    /// Registrations are global to a device (the MR cache), so NCCL may reuse one across comms.
    pub reg_is_global: bool,
    pub force_flush: bool,
    pub speed: i32,
    pub port: i32,
    pub latency: f32,
    pub max_comms: i32,
    pub max_recvs: i32,
}

static DEVICES: OnceLock<std::result::Result<Devices, Error>> = OnceLock::new();

/// The device table, discovered once per process.
pub fn devices_table() -> Result<&'static Devices> {
    DEVICES.get_or_init(transport::discover).as_ref().map_err(|e| e.clone())
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

/// `init` for every ABI version (the ABI layer has installed NCCL's logger): idempotent;
/// discovers devices once, and logs the version banner once per ABI version used in this process.
pub fn init(abi: u32) -> Result<()> {
    let devs = devices_table()?;
    let mut seen = BANNER.lock().unwrap_or_else(|p| p.into_inner());
    if *seen & (1 << abi) == 0 {
        *seen |= 1 << abi;
        log::info!(target: INIT, "NET/rivet: rivet {VERSION} loaded from {}, ncclNet v{abi} ABI", library_path());
        for (i, d) in devs.list.iter().enumerate() {
            log::info!(target: INIT, "NET/rivet: device {i}: {}", d.describe());
        }
        // Loads the CUDA driver (or says once why rivet is host-only).
        let _ = cuda::get();
        log::info!(target: INIT, "NET/rivet: {}", devs.summary);
    }
    Ok(())
}

pub fn ndevices() -> Result<i32> {
    Ok(devices_table()?.list.len() as i32)
}

pub(super) fn device(dev: i32) -> Result<&'static dyn Transport> {
    let t = devices_table()?;
    usize::try_from(dev)
        .ok()
        .and_then(|d| t.list.get(d))
        .map(|d| &**d)
        .ok_or_else(|| Error::arg(format!("device {dev} does not exist (this host has {} rivet devices)", t.list.len())))
}

pub fn properties(dev: i32) -> Result<Props> {
    let d = device(dev)?;
    let info = d.info();
    Ok(Props {
        name: info.name.as_ptr() as *mut c_char,
        pci_path: info.pci_path.as_ref().map_or(std::ptr::null_mut(), |p| p.as_ptr() as *mut c_char),
        guid: info.guid,
        ptr: d.ptr_support(),
        reg_is_global: true,
        force_flush: false,
        speed: info.speed,
        port: info.port,
        latency: 0.0,
        max_comms: info.max_comms,
        max_recvs: MAX_RECVS as i32,
    })
}
