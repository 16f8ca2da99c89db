//! Memory registration: host memory, GPU memory by GPUDirect RDMA (peer memory or dma-buf) or
//! through the staging engine, decided once per (comm, GPU).

use super::*;
use crate::transport::verbs::reg::{access_for, mr_info_of, verbs_register, verbs_release};


/// What a memory handle names.
pub struct Mr {
    pub info: MrInfo,
    pub ty: i32,
    /// The `ibv_mr` behind it (verbs only).
    verbs: Option<VerbsReg>,
}

/// The machine's topology, probed once (sysfs at RIVET_SYSFS_ROOT, else /sys).
pub(super) fn topology() -> &'static Topology {
    static T: OnceLock<Topology> = OnceLock::new();
    T.get_or_init(|| Topology::probe(&Topology::default_root()))
}

/// TCP: GPU memory goes through the staging engine, and only with RIVET_SOCKET_CUDA=1.
pub(super) fn stage_cuda_tcp(c: &mut Comm, d: &Device, data: *mut c_void, size: usize) -> Result<MrInfo> {
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

pub(super) fn staged_mr(data: *mut c_void, size: usize, gpu: Option<i32>) -> MrInfo {
    MrInfo { addr: data as usize, len: size, path: Path::Staged, gpu, ..Default::default() }
}

/// The facts GDR is decided on, for the GPU owning `pi` and this port.
pub(super) fn gdr_facts(port: &IbPort, pi: &cuda::PtrInfo, via: gdr::Via) -> Result<gdr::Facts> {
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
pub(super) type VerbsReg = (usize, &'static IbPort, bool);

/// GPU memory on an RDMA port: GDR where the decision and the registration itself allow it,
/// host staging otherwise. The decision is made, and logged, once per (comm, GPU); a failed
/// registration turns the comm to staging and says why.
pub(super) fn reg_gpu_verbs(
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
                // SAFETY: `m` was just registered.
                let mut info = unsafe { mr_info_of(m, access, &port.dev, Path::Gdr) };
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
pub(super) fn release_verbs(m: Mr) -> Result<()> {
    match m.verbs {
        Some((mr, port, true)) => verbs_release(port, mr)?,
        Some((mr, port, false)) => {
            let v = crate::sys::verbs::get().map_err(|e| Error::system(e.0))?;
            // SAFETY: the dma-buf registration this handle owned (not cached, so no other handle
            // shares it), released once: the handle was just taken out of its table.
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

