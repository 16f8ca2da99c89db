//! A TCP interface as a [`Transport`]: listen and connect with the socket handshake, registration
//! that only records the range, and GPU buffers through the staging engine (RIVET_SOCKET_CUDA=1).

use super::{RecvConn, SendConn};
use crate::transport::oob::ifaces::Iface;
use crate::transport::oob::{Connector, Link, Listener};
use crate::config;
use crate::error::{Error, Result};
use crate::gpu::staging::{NoRegistration, Registrar};
use crate::gpu::{cuda, gdr};
use crate::proto::{Handle, TRANSPORT_SOCKET};
use crate::transport::{pci_text, DataPath, DevInfo, Dialing, GpuRoute, Listening, MrInfo, PtrSupport, Registered, Transport};
use std::ffi::CString;

pub struct TcpDevice {
    info: DevInfo,
    iface: Iface,
}

impl TcpDevice {
    /// Device `index` of the TCP transport, on `iface`.
    pub fn new(index: usize, iface: Iface) -> TcpDevice {
        let info = DevInfo {
            name: CString::new(iface.name.clone()).unwrap_or_default(),
            pci_path: iface.pci_path.as_ref().and_then(|p| CString::new(p.as_str()).ok()),
            guid: index as u64,
            speed: iface.speed,
            port: 0,
            max_comms: 65536,
            iface: iface.name.clone(),
            addr: iface.addr,
            rail: -1,
            plane: -1,
        };
        TcpDevice { info, iface }
    }
}

fn send_conn(link: Link) -> DataPath {
    log::info!(target: crate::log::INIT, "NET/rivet: connected to {} over TCP with {} stream(s)", link.peer, link.fds.len());
    DataPath::Other(Box::new(SendConn::new(link.fds, link.peer, link.min_chunk)))
}

fn recv_conn(link: Link) -> DataPath {
    log::info!(target: crate::log::INIT, "NET/rivet: accepted a TCP connection from {} with {} stream(s)", link.peer, link.fds.len());
    DataPath::Other(Box::new(RecvConn::new(link.fds, link.peer, link.min_chunk)))
}

impl Listening for Listener {
    fn accept(&mut self) -> Result<Option<DataPath>> {
        Ok(Listener::accept(self)?.map(recv_conn))
    }
}

impl Dialing for Connector {
    fn poll(&mut self) -> Result<Option<DataPath>> {
        Ok(Connector::poll(self)?.map(send_conn))
    }
}

impl Transport for TcpDevice {
    fn info(&self) -> &DevInfo {
        &self.info
    }

    fn wire(&self) -> u8 {
        TRANSPORT_SOCKET
    }

    fn describe(&self) -> String {
        format!("{} {} speed {} Mb/s pci {}", self.iface.name, self.iface.addr, self.info.speed, pci_text(&self.info))
    }

    /// CUDA buffers (staged) when RIVET_SOCKET_CUDA=1 and a CUDA driver works.
    fn ptr_support(&self) -> PtrSupport {
        PtrSupport { cuda: config::get().socket_cuda && cuda::get().is_ok(), dmabuf: false }
    }

    fn listen(&'static self) -> Result<(Box<dyn Listening>, Handle)> {
        let (l, h) = Listener::new(&self.iface, TRANSPORT_SOCKET, config::get().timeout())?;
        Ok((Box::new(l), h))
    }

    fn connect(&'static self, peer: &Handle, _traffic_class: Option<u8>) -> Result<Box<dyn Dialing>> {
        let cfg = config::get();
        Ok(Box::new(Connector::new(peer, cfg.socket_nstreams, cfg.socket_min_chunk, cfg.timeout())?))
    }

    /// Nothing to register: the range is kept for the data path's checks.
    fn register(&'static self, addr: usize, len: usize, _send: bool) -> Result<Registered> {
        Ok(Registered { info: MrInfo { addr, len, ..Default::default() }, owner: None })
    }

    fn gpu_route(&'static self, _pi: &cuda::PtrInfo, _via: gdr::Via) -> Result<GpuRoute> {
        if !config::get().socket_cuda {
            return Err(Error::usage(format!(
                "regMr of GPU memory on {} (TCP transport): rivet's TCP transport takes GPU buffers only with RIVET_SOCKET_CUDA=1 (without it ptrSupport does not offer NCCL_PTR_CUDA)",
                self.iface.name
            )));
        }
        Ok(GpuRoute::Staging("TCP transport (RIVET_SOCKET_CUDA=1)".into()))
    }

    fn registrar(&'static self, _send: bool) -> Box<dyn Registrar> {
        Box::new(NoRegistration)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
