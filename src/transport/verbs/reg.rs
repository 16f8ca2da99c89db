//! Memory registration on an RDMA device: through the device's MR cache (page-aligned,
//! reference-counted ranges shared by every comm of the device), the data path's view of a
//! registration, and the staging engine's registrar for its bounce buffers.

use super::dev::{IbDevice, IbPort};
use crate::error::{Error, Result};
use crate::gpu::staging::Registrar;
use crate::transport::{MrInfo, Path};

/// IBV access flags of a comm's registrations: receive buffers take remote writes (and the
/// flush's read); send buffers are only read locally.
pub fn access_for(send: bool) -> u32 {
    use crate::sys::ib::*;
    if send {
        0
    } else {
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ
    }
}

/// The data path's view of a verbs registration.
///
/// # Safety
/// `m` is a live `ibv_mr` (returned by a registration and not yet deregistered).
pub unsafe fn mr_info_of(m: *mut crate::sys::ib::ibv_mr, access: u32, dev: &IbDevice, path: Path) -> MrInfo {
    // SAFETY: the caller's promise.
    let m = unsafe { &*m };
    let mut info = MrInfo { addr: m.addr as usize, len: m.length, access, dev: dev as *const _ as usize, path, ..Default::default() };
    info.set_keys(0, (m.lkey, m.rkey));
    info
}

/// Register `[addr, addr+size)` on an RDMA port through its device's MR cache; returns the
/// registration and the cached `ibv_mr` to release it with.
pub fn verbs_register(port: &'static IbPort, addr: usize, size: usize, access: u32) -> Result<(MrInfo, usize)> {
    let dev = &port.dev;
    let mut cache = dev.mrs.lock().unwrap_or_else(|p| p.into_inner());
    let lease = cache.acquire(addr, size, access as i32, |a, l, acc| dev.register(a, l, acc).map(|m| m as usize))?;
    drop(cache);
    // SAFETY: the cache's entry holds the registration until it is released.
    let info = unsafe { mr_info_of(lease.mr as *mut _, access, dev, Path::Host) };
    log::trace!(
        "NET/rivet: register {addr:#x} {size} bytes on {} -> MR [{:#x}, +{}) lkey {:#x} rkey {:#x} access {access:#x} refs {}{}",
        dev.name,
        info.addr,
        info.len,
        info.lkeys[0],
        info.rkeys[0],
        lease.refs,
        if lease.fresh { " (registered)" } else { " (cached)" }
    );
    Ok((info, lease.mr))
}

pub fn verbs_release(port: &IbPort, mr: usize) -> Result<()> {
    let dev = &port.dev;
    let v = crate::sys::verbs::get().map_err(|e| Error::system(e.0))?;
    let left = dev.mrs.lock().unwrap_or_else(|p| p.into_inner()).release(mr, |mr| {
        // SAFETY: the cache calls this once, for an entry whose last reference just went: a live
        // ibv_mr that nothing uses any more.
        let rc = unsafe { (v.dereg_mr)(mr as *mut _) };
        if rc != 0 {
            return Err(Error::system(format!("{}: ibv_dereg_mr failed: {}", dev.name, std::io::Error::from_raw_os_error(rc))));
        }
        Ok(())
    })?;
    log::trace!("NET/rivet: release on {}: MR {mr:#x} refs {left}{}", dev.name, if left == 0 { " (deregistered)" } else { "" });
    Ok(())
}

/// Register `[addr, addr+size)` on every member of a (fused) device: the registration with each
/// member's keys, and the cached `ibv_mr`s to release, one per member. A failure releases what
/// was made.
pub fn members_register(ports: &'static [&'static IbPort], addr: usize, size: usize, access: u32) -> Result<(MrInfo, Vec<usize>)> {
    let mut info = MrInfo::default();
    let mut mrs = Vec::with_capacity(ports.len());
    for (m, &p) in ports.iter().enumerate() {
        match verbs_register(p, addr, size, access) {
            Ok((i, mr)) => {
                mrs.push(mr);
                if m == 0 {
                    info = i;
                } else {
                    info.set_keys(m, i.keys(0));
                    // The range every member covers (the caches round to pages alike, but say so).
                    let end = (info.addr + info.len).min(i.addr + i.len);
                    info.addr = info.addr.max(i.addr);
                    info.len = end.saturating_sub(info.addr);
                }
            }
            Err(e) => {
                if let Err(r) = members_release(ports, &mrs) {
                    log::warn!("NET/rivet: {r}");
                }
                return Err(e);
            }
        }
    }
    info.members = ports.len() as u8;
    info.dev = super::conn::members_id(ports);
    Ok((info, mrs))
}

/// Release what [`members_register`] made, every member's; the first failure is returned (and
/// the others logged).
pub fn members_release(ports: &[&'static IbPort], mrs: &[usize]) -> Result<()> {
    let mut first = None;
    for (p, &mr) in ports.iter().zip(mrs) {
        if let Err(e) = verbs_release(p, mr) {
            if first.is_none() {
                first = Some(e);
            } else {
                log::warn!("NET/rivet: {e}");
            }
        }
    }
    first.map_or(Ok(()), Err)
}

/// Bounce buffers of a staged comm on an RDMA device (every member of a fused one).
pub struct VerbsRegistrar {
    pub ports: &'static [&'static IbPort],
    pub access: u32,
}

impl Registrar for VerbsRegistrar {
    fn register(&self, addr: usize, len: usize) -> Result<(MrInfo, usize)> {
        if let [port] = self.ports {
            return verbs_register(port, addr, len, self.access);
        }
        let (info, mrs) = members_register(self.ports, addr, len, self.access)?;
        Ok((info, Box::into_raw(Box::new(mrs)) as usize))
    }
    fn release(&self, handle: usize) {
        if let [port] = self.ports {
            if let Err(e) = verbs_release(port, handle) {
                log::warn!("NET/rivet: staging bounce buffer: {e}");
            }
            return;
        }
        // SAFETY: `register` made this handle from a boxed Vec of the members' MRs, and the
        // staging engine releases each handle once.
        let mrs = unsafe { Box::from_raw(handle as *mut Vec<usize>) };
        if let Err(e) = members_release(self.ports, &mrs) {
            log::warn!("NET/rivet: staging bounce buffer: {e}");
        }
    }
}

