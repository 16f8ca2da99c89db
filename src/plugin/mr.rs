//! Memory registration: host memory, GPU memory by GPUDirect RDMA (peer memory or dma-buf) or
//! through the staging engine, decided once per (comm, GPU). The device's transport registers;
//! this file holds the policy.

use super::devices::device;
use super::{any_comm, full, Comm, MRS};
use crate::config;
use crate::error::{Error, Result};
use crate::gpu::{cuda, gdr};
use crate::handles::{Kind, Token};
use crate::transport::{GpuRoute, MrInfo, Path, Registered, Registration, Transport};
use std::ffi::c_void;

/// The kind of memory `regMr` is given (NCCL_PTR_HOST, _CUDA or _DMABUF).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemKind {
    Host,
    Cuda,
    DmaBuf,
}

/// What a memory handle names.
pub struct Mr {
    pub info: MrInfo,
    /// The transport's registration behind it, given back at deregMr.
    owner: Option<Box<dyn Registration>>,
}

pub(super) fn staged_mr(data: *mut c_void, size: usize, gpu: Option<i32>) -> MrInfo {
    MrInfo { addr: data as usize, len: size, path: Path::Staged, gpu, ..Default::default() }
}

/// GPU memory: GDR where the transport offers it and the decision and the registration itself
/// allow it, host staging otherwise. The decision is made, and logged, once per (comm, GPU); a
/// failed registration turns the comm to staging and says why.
fn reg_gpu(c: &mut Comm, d: &'static dyn Transport, data: *mut c_void, size: usize, dmabuf: Option<(u64, i32)>) -> Result<Registered> {
    let pi = cuda::pointer_info(data as usize)?;
    let via = if dmabuf.is_some() { gdr::Via::DmaBuf } else { gdr::Via::Address };
    let nic = d.info().name.to_string_lossy();
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
        None => match d.gpu_route(&pi, via)? {
            GpuRoute::Gdr(facts) => (gdr::decide(&facts), true),
            GpuRoute::Staging(why) => (gdr::Decision::Staging(why), true),
        },
    };
    let mech = if dmabuf.is_some() { "dma-buf" } else { "peer-memory" };
    match gdr::register_or_stage(&decision, || d.register_gpu(data as usize, size, send, dmabuf), mech) {
        Ok(mut r) => {
            r.info.gpu = Some(pi.ordinal);
            if first {
                if let gdr::Decision::Gdr(why) = &decision {
                    log::info!(target: crate::log::INIT, "NET/rivet: GDR on {nic} for GPU {}: {why}", pi.bus_id);
                }
                g.gpu = Some((pi.ordinal, decision));
            }
            Ok(r)
        }
        Err(why) => {
            g.ensure_copier(Some(pi.ordinal))?;
            if first || matches!(decision, gdr::Decision::Gdr(_)) {
                log::info!(target: crate::log::INIT, "NET/rivet: host staging for GPU {} on {nic}: {why}", pi.bus_id);
                g.gpu = Some((pi.ordinal, gdr::Decision::Staging(why)));
            }
            Ok(Registered { info: staged_mr(data, size, Some(pi.ordinal)), owner: None })
        }
    }
}

/// `regMr` (`dmabuf` None) and `regMrDmaBuf` (`dmabuf` = offset and fd, which is not kept).
pub fn reg_mr(comm: *mut c_void, data: *mut c_void, size: usize, kind: MemKind, dmabuf: Option<(u64, i32)>) -> Result<*mut c_void> {
    let mut g = any_comm(comm)?;
    let c = &mut *g;
    let d = device(c.dev)?;
    if data.is_null() && size > 0 {
        return Err(Error::internal(format!("regMr of {size} bytes at NULL")));
    }
    let r = match kind {
        MemKind::Cuda | MemKind::DmaBuf => reg_gpu(c, d, data, size, dmabuf.filter(|(_, fd)| *fd >= 0))?,
        MemKind::Host if config::get().stage_host => {
            c.conn.ensure_copier(None)?;
            Registered { info: staged_mr(data, size, None), owner: None }
        }
        MemKind::Host => d.register(data as usize, size, c.send)?,
    };
    let (info, path) = (r.info, r.info.path);
    let p = match MRS.insert(Kind::Mr, Mr { info, owner: r.owner }) {
        Ok(t) => t.to_ptr(),
        Err(m) => {
            release(m)?;
            return Err(full("memory handle"));
        }
    };
    log::trace!("NET/rivet: regMr {data:p} {size} bytes {kind:?} path {path:?} -> {p:p}");
    Ok(p)
}

pub fn dereg_mr(_comm: *mut c_void, mh: *mut c_void) -> Result<()> {
    let bad = || Error::internal(format!("deregMr of an unknown or already released memory handle {mh:p}"));
    let t = Token::from_ptr(mh).filter(|t| t.kind == Kind::Mr).ok_or_else(bad)?;
    let m = MRS.remove(t).map_err(|_| bad())?;
    release(m)
}

/// Give back the transport's registration a memory handle owned, if any.
fn release(m: Mr) -> Result<()> {
    if let Some(o) = m.owner {
        o.release()?;
    }
    log::trace!("NET/rivet: deregMr {:#x} {} bytes", m.info.addr, m.info.len);
    Ok(())
}
