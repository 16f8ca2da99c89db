//! The devices NCCL sees: discovered once (RDMA ports, else TCP interfaces), the start-up banner,
//! and `getProperties`.

use crate::error::{Error, Result};
use crate::gpu::cuda;
use crate::log::INIT;
use crate::transport::{self, Devices, MemberInfo, PtrSupport, Transport, MAX_MEMBERS, MAX_RECVS};
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
    /// The physical devices a virtual (fused) device is made of; a physical one: itself.
    pub vdevs: [i32; MAX_MEMBERS],
    pub nvdevs: usize,
    /// ncclNet v12's railId / planeId (-1: undefined).
    pub rail: i16,
    pub plane: i16,
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

/// A virtual device `makeVDevice` made: its members (physical device indices) and the fused
/// device. They live for the process (NCCL makes them once, at init).
struct VDev {
    members: Vec<i32>,
    dev: &'static dyn Transport,
}

static VDEVS: Mutex<Vec<VDev>> = Mutex::new(Vec::new());

fn vdevs() -> std::sync::MutexGuard<'static, Vec<VDev>> {
    VDEVS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Physical devices, then the virtual ones in the order they were made (as net_ib numbers them).
pub fn ndevices() -> Result<i32> {
    Ok((devices_table()?.list.len() + vdevs().len()) as i32)
}

pub(super) fn device(dev: i32) -> Result<&'static dyn Transport> {
    let t = devices_table()?;
    let n = t.list.len();
    let d = usize::try_from(dev).ok();
    if let Some(p) = d.and_then(|d| t.list.get(d)) {
        return Ok(&**p);
    }
    let v = vdevs();
    d.and_then(|d| d.checked_sub(n)).and_then(|i| v.get(i)).map(|v| v.dev).ok_or_else(|| {
        Error::arg(format!("device {dev} does not exist (this host has {n} rivet devices and {} virtual ones)", v.len()))
    })
}

/// `makeVDevice`: a virtual NIC fusing the physical devices `devs` (NCCL_IB_MERGE_NICS
/// allowing), its index in `*d`. One member gives a virtual device that is that device; the same
/// members again give the device made before.
pub fn make_vdevice(devs: &[i32]) -> Result<i32> {
    let t = devices_table()?;
    let phys: Vec<MemberInfo> = t.list.iter().map(|d| d.member_info()).collect();
    let mut v = vdevs();
    if let Some(i) = v.iter().position(|x| x.members == devs) {
        return Ok((t.list.len() + i) as i32);
    }
    transport::check_fusion(devs, &phys, crate::config::get().ib_merge_nics, v.len()).map_err(Error::usage)?;
    // One member: a virtual device that is the physical one under a new index (some NCCL
    // releases make a virtual device of every group, single ones too, and then use only the
    // virtual indices).
    let f: &'static dyn Transport = if let [d] = devs {
        &*t.list[*d as usize]
    } else {
        let rest: Vec<&'static dyn Transport> = devs[1..].iter().map(|&d| &*t.list[d as usize]).collect();
        let first: &'static dyn Transport = &*t.list[devs[0] as usize];
        first.fuse(&rest)?
    };
    let index = (t.list.len() + v.len()) as i32;
    log::info!(
        target: INIT,
        "NET/rivet: made virtual device {index} {} of devices {devs:?}: speed {} Mb/s, rail {}, plane {:#x}",
        f.info().name.to_string_lossy(),
        f.info().speed,
        f.info().rail,
        f.info().plane
    );
    v.push(VDev { members: devs.to_vec(), dev: f });
    Ok(index)
}

pub fn properties(dev: i32) -> Result<Props> {
    let d = device(dev)?;
    let info = d.info();
    let mut vdevs = [0i32; MAX_MEMBERS];
    let nphys = devices_table()?.list.len() as i32;
    let nvdevs = if dev < nphys {
        vdevs[0] = dev;
        1
    } else {
        let v = self::vdevs();
        let m = &v[(dev - nphys) as usize].members;
        vdevs[..m.len()].copy_from_slice(m);
        m.len()
    };
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
        vdevs,
        nvdevs,
        rail: info.rail,
        plane: info.plane,
    })
}
