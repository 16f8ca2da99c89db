//! Which transport a host uses, decided once: the RDMA ports rivet may use (NCCL_IB_HCA and the
//! rest of the port selection, see `verbs::dev`), else TCP on the interfaces NCCL_SOCKET_IFNAME
//! selects.

use super::oob::ifaces;
use super::socket::TcpDevice;
use super::verbs::{self, VerbsDevice};
use super::Transport;
use crate::config::{self, Config, TransportChoice};
use crate::topo::{NicKind, Topology};
use std::path::Path;
use crate::error::Error;

/// The devices of the transport in use.
pub struct Devices {
    pub list: Vec<Box<dyn Transport>>,
    /// "RDMA verbs" or "TCP".
    pub transport: &'static str,
    /// Why the RDMA transport is not in use (when it is not).
    pub no_rdma: Option<String>,
    /// The WARN of a host with GPUs or RDMA devices that takes TCP anyway (see [`tcp_warning`]).
    pub tcp_warning: Option<String>,
    /// The start-up banner's line on the transport and its settings.
    pub summary: String,
}

/// Find the devices: RDMA ports unless NCCL_IB_DISABLE=1, RIVET_TRANSPORT=tcp or none is usable,
/// else TCP interfaces. With RIVET_TRANSPORT=verbs, no usable RDMA port is an error.
pub fn discover() -> Result<Devices, Error> {
    let cfg = config::get();
    let mut warning = None;
    let no_rdma = match (cfg.transport, cfg.ib_disable) {
        (TransportChoice::Verbs, true) => {
            return Err(Error::usage(
                "RIVET_TRANSPORT=verbs requires RDMA, but NCCL_IB_DISABLE=1 forbids it: unset one of them",
            ))
        }
        (TransportChoice::Tcp, _) => "RIVET_TRANSPORT=tcp".to_string(),
        (_, true) => "NCCL_IB_DISABLE=1".to_string(),
        (choice, false) => match verbs::dev::discover(cfg) {
            Ok(ports) => return verbs_devices(cfg, ports),
            Err(why) if choice == TransportChoice::Verbs => {
                let topo = Topology::machine();
                return Err(Error::system(format!(
                    "RIVET_TRANSPORT=verbs requires RDMA, but {} (or set RIVET_TRANSPORT=auto to run over TCP)",
                    with_fix(&why, rdma_fix(&why, topo, Path::new("/dev/infiniband")))
                )));
            }
            Err(why) => {
                warning = tcp_warning(&why, Topology::machine(), Path::new("/dev/infiniband"));
                if let Some(w) = &warning {
                    log::warn!("NET/rivet: {w}");
                }
                why
            }
        },
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
    Ok(Devices { list, transport: "TCP", no_rdma: Some(no_rdma), tcp_warning: warning, summary })
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
    Ok(Devices { list, transport: "RDMA verbs", no_rdma: None, tcp_warning: None, summary })
}

/// The WARN of a host that has GPUs or RDMA devices but whose rivet takes TCP (`why`: the reason
/// RDMA is not usable), with the fix; None on a host with neither, where TCP is what it has.
pub fn tcp_warning(why: &str, topo: &Topology, dev_ib: &Path) -> Option<String> {
    let rdma: Vec<&str> = topo.nics.iter().filter(|n| n.kind == NicKind::Rdma).map(|n| n.name.as_str()).collect();
    if topo.gpus.is_empty() && rdma.is_empty() {
        return None;
    }
    let mut has = Vec::new();
    if !topo.gpus.is_empty() {
        has.push(format!("{} GPU(s)", topo.gpus.len()));
    }
    if !rdma.is_empty() {
        has.push(format!("{} RDMA device(s) ({})", rdma.len(), rdma.join(", ")));
    }
    Some(format!(
        "this host has {} but rivet runs over TCP, many times slower than RDMA: {}. To make a job fail instead of running over TCP, set RIVET_TRANSPORT=verbs; to choose TCP and silence this, RIVET_TRANSPORT=tcp",
        has.join(" and "),
        with_fix(why, rdma_fix(why, topo, dev_ib))
    ))
}

/// What to do about `why` (the reason no RDMA port is usable) on this host: the first of the
/// usual causes that fits; None where `why` already says it (libibverbs missing or too old).
pub fn rdma_fix(why: &str, topo: &Topology, dev_ib: &Path) -> Option<String> {
    let has_rdma = topo.nics.iter().any(|n| n.kind == NicKind::Rdma);
    if why.starts_with("cannot load ") || why.contains(" has no symbol ") {
        return None;
    }
    let uverbs = std::fs::read_dir(dev_ib).map(|d| d.flatten().any(|e| e.file_name().to_string_lossy().starts_with("uverbs"))).unwrap_or(false);
    Some(if has_rdma && !uverbs {
        format!("{} has no uverbs device: in a container, pass the RDMA devices in (docker/podman: --device=/dev/infiniband; Kubernetes: the RDMA device plugin's resource and the IPC_LOCK capability)", dev_ib.display())
    } else if why.contains("NCCL_IB_HCA") {
        "NCCL_IB_HCA selects none of the usable ports: list them with `rivet doctor` (or ibv_devinfo) and fix the selection".into()
    } else if !has_rdma {
        "no RDMA device is visible: on the host, load the NIC's driver (mlx5_ib for ConnectX) and check `rdma link`; in a container, pass /dev/infiniband in".into()
    } else {
        "check the ports with `rivet doctor` (or `rdma link`, ibstat): a port must be ACTIVE, and a RoCE port needs an IP address on its interface for its GID".into()
    })
}

/// `why`, and its fix where there is one.
fn with_fix(why: &str, fix: Option<String>) -> String {
    match fix {
        Some(f) => format!("{why}; {f}"),
        None => why.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topo::fixture;

    #[test]
    fn tcp_on_a_host_with_gpus_or_rdma_devices_is_warned_with_the_fix() {
        let nothing = fixture::Fixture::new("discover-none");
        let bare = Topology::probe(&nothing.root);
        assert_eq!(tcp_warning("libibverbs.so.1 found no RDMA device (...)", &bare, Path::new("/nonexistent")), None, "a host with neither: TCP is what it has");

        let dgx = fixture::dgx_h100();
        let t = Topology::probe(&dgx.root);
        let no_dev = nothing.root.join("dev-infiniband");
        let w = tcp_warning("libibverbs.so.1 found no RDMA device (...)", &t, &no_dev).unwrap();
        assert!(w.contains("8 GPU(s)") && w.contains("RDMA device(s) (mlx5_0"), "{w}");
        assert!(w.contains("--device=/dev/infiniband") && w.contains("RIVET_TRANSPORT=verbs") && w.contains("RIVET_TRANSPORT=tcp"), "{w}");

        // The devices are passed in: the ports are the next suspect.
        std::fs::create_dir_all(&no_dev).unwrap();
        std::fs::write(no_dev.join("uverbs0"), "").unwrap();
        let w = tcp_warning("no usable RDMA port: mlx5_0:1 is DOWN", &t, &no_dev).unwrap();
        assert!(w.contains("must be ACTIVE") && !w.contains("--device"), "{w}");
        let w = tcp_warning("no usable RDMA port: mlx5_0:1 skipped by NCCL_IB_HCA=mlx9", &t, &no_dev).unwrap();
        assert!(w.contains("NCCL_IB_HCA selects none"), "{w}");
        // A missing libibverbs's reason carries its own fix.
        let why = "cannot load libibverbs.so.1 (not found); install rdma-core's libibverbs1 package";
        let w = tcp_warning(why, &t, &no_dev).unwrap();
        assert!(w.contains(why) && w.matches("install").count() == 1, "{w}");
    }
}
