//! Which transport a host uses, decided once: the RDMA ports rivet may use (NCCL_IB_HCA and the
//! rest of the port selection, see `verbs::dev`), else TCP on the interfaces NCCL_SOCKET_IFNAME
//! selects.

use super::oob::ifaces;
use super::socket::TcpDevice;
use super::verbs::{self, VerbsDevice};
use super::Transport;
use crate::config::{self, Config};
use crate::error::Error;

/// The devices of the transport in use.
pub struct Devices {
    pub list: Vec<Box<dyn Transport>>,
    /// "RDMA verbs" or "TCP".
    pub transport: &'static str,
    /// Why the RDMA transport is not in use (when it is not).
    pub no_rdma: Option<String>,
    /// The start-up banner's line on the transport and its settings.
    pub summary: String,
}

/// Find the devices: RDMA ports unless NCCL_IB_DISABLE=1 or none is usable, else TCP interfaces.
pub fn discover() -> Result<Devices, Error> {
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
    let summary = format!(
        "transport TCP (RDMA not used: {no_rdma}), {} device(s), {} stream(s) per connection{}, timeout {}s",
        found.len(),
        cfg.socket_nstreams,
        if cfg.socket_threads && cfg.socket_nstreams > 1 { " (helper threads for streams 2..)" } else { "" },
        cfg.timeout_secs
    );
    let list = found.into_iter().enumerate().map(|(i, f)| Box::new(TcpDevice::new(i, f)) as Box<dyn Transport>).collect();
    Ok(Devices { list, transport: "TCP", no_rdma: Some(no_rdma), summary })
}

/// RDMA ports as NCCL devices; connection setup runs over the first usable IP interface.
fn verbs_devices(cfg: &Config, ports: Vec<verbs::dev::IbPort>) -> Result<Devices, Error> {
    let Some(oob) = ifaces::select(cfg.socket_ifname.as_deref(), cfg.socket_family).into_iter().next() else {
        return Err(Error::system(
            "RDMA devices exist but no IP interface is up for the connection setup: bring one up or select it with NCCL_SOCKET_IFNAME",
        ));
    };
    if let Some(p) = verbs::dev::memlock_problem() {
        log::warn!("NET/rivet: {p}");
    }
    let summary = format!(
        "transport RDMA verbs via {}, {} device(s), {} QP(s) per connection, out-of-band {} {}, timeout {}s",
        crate::sys::verbs::get().map(|v| v.path.clone()).unwrap_or_default(),
        ports.len(),
        cfg.ib_qps,
        oob.name,
        oob.addr,
        cfg.timeout_secs
    );
    let list = ports.into_iter().map(|p| Box::new(VerbsDevice::new(p, oob.clone())) as Box<dyn Transport>).collect();
    Ok(Devices { list, transport: "RDMA verbs", no_rdma: None, summary })
}
