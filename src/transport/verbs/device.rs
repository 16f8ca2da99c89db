//! An RDMA port as a [`Transport`]: connection setup over an out-of-band TCP link, then the
//! queue-pair exchange ([`Setup`]); registration through the device's MR cache, or by dma-buf;
//! the facts GPUDirect RDMA is decided on.

use super::dev::IbPort;
use super::fuse::{self, MemberInfo};
use super::reg::{access_for, members_register, members_release, mr_info_of, verbs_register, verbs_release, VerbsRegistrar};
use super::Setup;
use crate::config;
use crate::error::{Error, Result};
use crate::gpu::staging::Registrar;
use crate::gpu::{cuda, gdr};
use crate::proto::{Handle, TRANSPORT_VERBS};
use crate::topo::Topology;
use crate::transport::oob::ifaces::Iface;
use crate::transport::oob::{Connector, Listener};
use crate::transport::{pci_text, DataPath, DevInfo, Dialing, GpuRoute, Listening, Path, PtrSupport, Registered, Registration, Transport};
use std::ffi::CString;

pub struct VerbsDevice {
    info: DevInfo,
    /// Its members: one port for a physical device, each member's for a fused one (member 0
    /// first: what the device reports besides name, speed, rail and plane, as net_ib).
    ports: &'static [&'static IbPort],
    /// The IP interface connection setup runs over.
    oob: Iface,
}

impl VerbsDevice {
    /// A physical device: its port lives for the process, as the device table does.
    pub fn new(port: IbPort, oob: Iface) -> VerbsDevice {
        let port: &'static IbPort = Box::leak(Box::new(port));
        let ports: &'static [&'static IbPort] = Box::leak(vec![port].into_boxed_slice());
        let info = DevInfo {
            name: CString::new(port.dev.name.clone()).unwrap_or_default(),
            pci_path: port.nccl_pci_path.as_ref().and_then(|s| CString::new(s.as_str()).ok()),
            guid: port.dev.guid,
            speed: port.speed,
            port: port.nccl_port,
            // One comm needs at least one queue pair.
            max_comms: port.dev.max_qp.max(1),
            iface: oob.name.clone(),
            addr: oob.addr,
            rail: port.rail,
            plane: port.plane,
        };
        VerbsDevice { info, ports, oob }
    }

    /// A fused device of `members` (checked by `fuse::check`): member 0's properties, with
    /// the name, speed, rail and plane `fuse::fused` makes of all of them.
    pub fn fused(members: &[&VerbsDevice]) -> VerbsDevice {
        let ports: &'static [&'static IbPort] = Box::leak(members.iter().map(|m| m.ports[0]).collect::<Vec<_>>().into_boxed_slice());
        let infos: Vec<MemberInfo> = members.iter().map(|m| m.physical_member()).collect();
        let f = fuse::fused(&infos.iter().collect::<Vec<_>>());
        let first = &members[0].info;
        let info = DevInfo { name: CString::new(f.name).unwrap_or_default(), speed: f.speed, rail: f.rail, plane: f.plane, ..first.clone() };
        VerbsDevice { info, ports, oob: members[0].oob.clone() }
    }

    /// What NIC fusion needs to know of this (physical) device.
    fn physical_member(&self) -> MemberInfo {
        let p = self.ports[0];
        MemberInfo {
            name: self.info.name.to_string_lossy().into_owned(),
            rdma: true,
            link_layer: p.link_layer,
            speed: self.info.speed,
            rail: p.rail,
            plane_idx: p.plane_idx,
            plane: p.plane,
        }
    }

    fn port(&self) -> &'static IbPort {
        self.ports[0]
    }

    fn name(&self) -> String {
        self.info.name.to_string_lossy().into_owned()
    }

    /// The facts GDR is decided on, for the GPU owning `pi` and this port.
    fn gdr_facts(&self, pi: &cuda::PtrInfo, via: gdr::Via) -> Result<gdr::Facts> {
        let cfg = config::get();
        let topo = Topology::machine();
        let (gpu_gdr, gpu_dmabuf) = cuda::gdr_attributes(pi.ordinal)?;
        let dmabuf = if !cfg.dmabuf {
            Err("RIVET_DMABUF=off".to_string())
        } else if !gpu_dmabuf {
            Err("the GPU does not support dma-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0)".to_string())
        } else {
            self.port().dev.dmabuf.clone()
        };
        let (path, gpu_numa, nic_numa) = gdr::locate(topo, &pi.bus_id, &self.port().dev.name);
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
}

/// A listen comm: the out-of-band listener, and the RDMA setups of connections whose TCP
/// handshake is done.
struct VerbsListen {
    ports: &'static [&'static IbPort],
    name: String,
    listener: Listener,
    setups: Vec<Setup>,
}

impl Listening for VerbsListen {
    fn accept(&mut self) -> Result<Option<DataPath>> {
        while let Some(link) = self.listener.accept_busy(!self.setups.is_empty())? {
            self.setups.push(Setup::acceptor(self.ports, &self.name, link));
        }
        for i in 0..self.setups.len() {
            match self.setups[i].poll() {
                Ok(None) => {}
                Ok(Some(conn)) => {
                    self.setups.swap_remove(i);
                    return Ok(Some(conn));
                }
                Err(e) => {
                    self.setups.swap_remove(i);
                    return Err(e);
                }
            }
        }
        Ok(None)
    }
}

/// A connect: the out-of-band TCP connect first, then the RDMA setup over it.
enum VerbsDial {
    Tcp { c: Box<Connector>, ports: &'static [&'static IbPort], name: String, rem_members: usize, tc: Option<u8> },
    Setup(Box<Setup>),
}

impl Dialing for VerbsDial {
    fn poll(&mut self) -> Result<Option<DataPath>> {
        loop {
            match self {
                VerbsDial::Tcp { c, ports, name, rem_members, tc } => match c.poll()? {
                    None => return Ok(None),
                    Some(link) => {
                        let s = Setup::connector(ports, name, link, *rem_members, *tc)?;
                        *self = VerbsDial::Setup(Box::new(s));
                    }
                },
                VerbsDial::Setup(s) => return s.poll(),
            }
        }
    }
}

/// A registration through the device's MR cache.
struct CachedMr {
    port: &'static IbPort,
    mr: usize,
}

impl Registration for CachedMr {
    fn release(self: Box<Self>) -> Result<()> {
        verbs_release(self.port, self.mr)
    }
}

/// A fused device's registration: one through each member's MR cache.
struct MembersMr {
    ports: &'static [&'static IbPort],
    mrs: Vec<usize>,
}

impl Registration for MembersMr {
    fn release(self: Box<Self>) -> Result<()> {
        members_release(self.ports, &self.mrs)
    }
}

/// Dma-buf registrations (one per member): not cached, so owned by one memory handle alone.
struct DmaBufMr {
    ports: &'static [&'static IbPort],
    mrs: Vec<usize>,
}

impl Registration for DmaBufMr {
    fn release(self: Box<Self>) -> Result<()> {
        let v = crate::sys::verbs::get().map_err(|e| Error::system(e.0))?;
        let mut first = None;
        for (p, &mr) in self.ports.iter().zip(&self.mrs) {
            // SAFETY: a dma-buf registration this owner holds alone (not cached), released once:
            // `release` consumes the owner.
            let rc = unsafe { (v.dereg_mr)(mr as *mut _) };
            if rc != 0 && first.is_none() {
                first = Some(Error::system(format!(
                    "{}: ibv_dereg_mr of a dma-buf registration failed: {}",
                    p.dev.name,
                    std::io::Error::from_raw_os_error(rc)
                )));
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Transport for VerbsDevice {
    fn info(&self) -> &DevInfo {
        &self.info
    }

    fn wire(&self) -> u8 {
        TRANSPORT_VERBS
    }

    fn describe(&self) -> String {
        let p = self.port();
        let what = if self.ports.len() > 1 {
            format!("{} (fused: {})", self.name(), self.ports.iter().map(|p| p.describe()).collect::<Vec<_>>().join(" + "))
        } else {
            p.describe()
        };
        format!(
            "{} speed {} Mb/s pci {} guid {:#x}{}; GPUDirect: peer memory {}, dma-buf {}",
            what,
            self.info.speed,
            pci_text(&self.info),
            self.info.guid,
            if p.dev.relaxed_ordering { " [RO]" } else { "" },
            gdr::peermem(&Topology::machine().root).unwrap_or("none (no nvidia_peermem or nv_peer_mem module)"),
            match &p.dev.dmabuf {
                Ok(()) => "yes".to_string(),
                Err(why) => format!("no ({why})"),
            }
        )
    }

    /// CUDA when RIVET_GDR is not off, a CUDA driver works and peer memory or dma-buf exists (or
    /// RIVET_GDR=force); dma-buf when the NIC and the GPU support it and RIVET_DMABUF allows: the
    /// GPU current on the calling thread (NCCL's rank's), or every GPU when none is current.
    fn ptr_support(&self) -> PtrSupport {
        let cfg = config::get();
        let Ok(cu) = cuda::get() else { return PtrSupport::default() };
        if cfg.gdr == gdr::Mode::Off {
            return PtrSupport::default();
        }
        // Every member must take dma-buf (net_ib looks at member 0 only).
        let every_gpu = || (0..cu.devices).all(|g| cuda::gdr_attributes(g).is_ok_and(|(_, db)| db));
        let dmabuf = cfg.dmabuf
            && self.ports.iter().all(|p| p.dev.dmabuf.is_ok())
            && cuda::gpus_take_dmabuf(cuda::current_gpu_dmabuf(), every_gpu);
        let peermem = gdr::peermem(&Topology::machine().root).is_some();
        PtrSupport { cuda: dmabuf || peermem || cfg.gdr == gdr::Mode::Force, dmabuf }
    }

    fn roce_gids(&self) -> Vec<[u8; 16]> {
        self.ports.iter().filter(|p| p.is_roce()).map(|p| p.gid).collect()
    }

    fn listen(&'static self) -> Result<(Box<dyn Listening>, Handle)> {
        let (listener, mut h) = Listener::new(&self.oob, TRANSPORT_VERBS, config::get().timeout())?;
        h.members = self.ports.len() as u8;
        if config::get().ib_subnet_aware {
            h.gids = self.roce_gids().into_iter().take(2).collect();
        }
        Ok((Box::new(VerbsListen { ports: self.ports, name: self.name(), listener, setups: Vec::new() }), h))
    }

    fn connect(&'static self, peer: &Handle, traffic_class: Option<u8>) -> Result<Box<dyn Dialing>> {
        let cfg = config::get();
        let c = Connector::new(peer, 1, cfg.socket_min_chunk, cfg.timeout())?.ack_later();
        Ok(Box::new(VerbsDial::Tcp { c: Box::new(c), ports: self.ports, name: self.name(), rem_members: peer.members as usize, tc: traffic_class }))
    }

    fn register(&'static self, addr: usize, len: usize, send: bool) -> Result<Registered> {
        if let [port] = self.ports {
            let (info, mr) = verbs_register(port, addr, len, access_for(send))?;
            return Ok(Registered { info, owner: Some(Box::new(CachedMr { port, mr })) });
        }
        let (info, mrs) = members_register(self.ports, addr, len, access_for(send))?;
        Ok(Registered { info, owner: Some(Box::new(MembersMr { ports: self.ports, mrs })) })
    }

    fn gpu_route(&'static self, pi: &cuda::PtrInfo, via: gdr::Via) -> Result<GpuRoute> {
        Ok(GpuRoute::Gdr(self.gdr_facts(pi, via)?))
    }

    fn register_gpu(&'static self, addr: usize, len: usize, send: bool, dmabuf: Option<(u64, i32)>) -> Result<Registered> {
        let access = access_for(send);
        let mut r = match dmabuf {
            Some((offset, fd)) => {
                // On every member (each its own registration of the same dma-buf).
                let mut owner = DmaBufMr { ports: self.ports, mrs: Vec::new() };
                let mut info = Default::default();
                for (k, port) in self.ports.iter().enumerate() {
                    let m = match port.dev.register_dmabuf(offset, len, addr as u64, fd, access as i32) {
                        Ok(m) => m,
                        Err(e) => {
                            owner.ports = &self.ports[..owner.mrs.len()];
                            let _ = Box::new(owner).release();
                            return Err(e);
                        }
                    };
                    owner.mrs.push(m as usize);
                    // SAFETY: `m` was just registered.
                    let i = unsafe { mr_info_of(m, access, &port.dev, Path::Gdr) };
                    if k == 0 {
                        info = i;
                    } else {
                        info.set_keys(k, i.keys(0));
                    }
                }
                info.members = self.ports.len() as u8;
                info.dev = super::conn::members_id(self.ports);
                // The ibv_mr of a dma-buf registration has the offset in its addr field; the
                // buffer the data path checks against is the GPU address range registered.
                (info.addr, info.len) = (addr, len);
                Registered { info, owner: Some(Box::new(owner)) }
            }
            None => self.register(addr, len, send)?,
        };
        r.info.path = Path::Gdr;
        Ok(r)
    }

    fn registrar(&'static self, send: bool) -> Box<dyn Registrar> {
        Box::new(VerbsRegistrar { ports: self.ports, access: access_for(send) })
    }

    fn member_info(&self) -> MemberInfo {
        self.physical_member()
    }

    fn fuse(&'static self, rest: &[&'static dyn Transport]) -> Result<&'static dyn Transport> {
        let mut members = vec![self];
        for d in rest {
            match d.as_any().downcast_ref::<VerbsDevice>() {
                Some(v) => members.push(v),
                None => return Err(Error::usage(format!("{}: only RDMA devices fuse into a virtual NIC", d.info().name.to_string_lossy()))),
            }
        }
        Ok(Box::leak(Box::new(VerbsDevice::fused(&members))))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
