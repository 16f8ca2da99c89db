//! GPUDirect RDMA: what the host, each NIC and each GPU can do, and the per-(comm, GPU) choice
//! between GDR (the NIC reads and writes GPU memory) and host staging (`staging`).
//!
//! The facts are checked, never assumed: the peer-memory module's sysfs files, an
//! `ibv_reg_dmabuf_mr` probe on each NIC, and the GPU's CUDA attributes. The choice (`decide`) is
//! pure, so every path class and every missing capability is unit-tested on fixture topologies.

use crate::topo::{PathClass, Topology};
use std::path::Path;

/// `RIVET_GDR`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// GDR where the path and the capabilities allow it.
    Auto,
    /// Never: GPU buffers are always staged.
    Off,
    /// GDR whatever the path class and capability checks say (registration can still fail).
    Force,
}

impl Mode {
    pub fn parse(s: &str) -> Option<Mode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(Mode::Auto),
            "off" | "0" => Some(Mode::Off),
            "force" | "1" => Some(Mode::Force),
            _ => None,
        }
    }
}

/// The files whose presence says a peer-memory client for NVIDIA GPUs is loaded, relative to the
/// sysfs root: MLNX_OFED's nv_peer_mem (and its non-cached variant), then the driver's own
/// nvidia_peermem module.
pub const PEERMEM_FILES: &[&str] =
    &["kernel/mm/memory_peers/nv_mem/version", "kernel/mm/memory_peers/nv_mem_nc/version", "module/nvidia_peermem/version"];

/// Which peer-memory file exists under `root` (the sysfs root), if any.
pub fn peermem(root: &Path) -> Option<&'static str> {
    PEERMEM_FILES.iter().copied().find(|f| root.join(f).exists())
}

/// Where a GPU and a NIC sit relative to each other: (path class, GPU NUMA node, NIC NUMA node).
pub fn locate(topo: &Topology, gpu_bus_id: &str, nic: &str) -> (PathClass, Option<u32>, Option<u32>) {
    (topo.path(gpu_bus_id, nic), topo.pci(gpu_bus_id).and_then(|p| p.numa), topo.nic(nic).and_then(|n| n.numa()))
}

/// How a GPU buffer is being registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// `regMr` with `NCCL_PTR_CUDA`: `ibv_reg_mr` on the device address, which needs peer memory.
    Address,
    /// `regMrDmaBuf` with a dma-buf fd: `ibv_reg_dmabuf_mr`.
    DmaBuf,
}

/// Everything the decision depends on, gathered beforehand.
#[derive(Clone, Debug)]
pub struct Facts {
    pub mode: Mode,
    /// `RIVET_GDR_LEVEL`: the farthest path class GDR is used over.
    pub level: PathClass,
    pub path: PathClass,
    pub gpu_numa: Option<u32>,
    pub nic_numa: Option<u32>,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`.
    pub gpu_gdr: bool,
    /// A peer-memory file, when one exists.
    pub peermem: Option<&'static str>,
    /// dma-buf works end to end: the NIC's probe, the GPU's attribute and `RIVET_DMABUF`.
    pub dmabuf: Result<(), String>,
    pub via: Via,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Use GDR; the text says why ("path PIX, dma-buf").
    Gdr(String),
    /// Stage through host memory; the text says why.
    Staging(String),
}

fn numa(n: Option<u32>) -> String {
    n.map_or("?".into(), |n| n.to_string())
}

/// GDR or host staging for one (comm, GPU), from the facts.
pub fn decide(f: &Facts) -> Decision {
    let mech = match f.via {
        Via::DmaBuf => "dma-buf",
        Via::Address => "peer memory",
    };
    match f.mode {
        Mode::Off => return Decision::Staging("RIVET_GDR=off".into()),
        Mode::Force => return Decision::Gdr(format!("path {}, {mech} (RIVET_GDR=force)", f.path)),
        Mode::Auto => {}
    }
    if f.path == PathClass::Unknown {
        return Decision::Staging(format!(
            "path UNKNOWN: the NIC or the GPU has no PCI path, so the distance is unknown (RIVET_GDR=force overrides, RIVET_GDR_LEVEL={})",
            f.level
        ));
    }
    if f.path.nccl() > f.level.nccl() {
        return Decision::Staging(format!(
            "path {}, NUMA {} → {} (RIVET_GDR_LEVEL={})",
            f.path,
            numa(f.gpu_numa),
            numa(f.nic_numa),
            f.level
        ));
    }
    if !f.gpu_gdr {
        return Decision::Staging("the GPU does not support GPUDirect RDMA (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED is 0)".into());
    }
    match f.via {
        Via::DmaBuf => match &f.dmabuf {
            Ok(()) => Decision::Gdr(format!("path {}, dma-buf", f.path)),
            Err(why) => Decision::Staging(format!("dma-buf unusable: {why}")),
        },
        Via::Address => match f.peermem {
            Some(file) => Decision::Gdr(format!("path {}, peer memory ({file})", f.path)),
            None => Decision::Staging(
                "no peer-memory module (load it with `modprobe nvidia-peermem`), and NCCL registered the buffer by address, not by dma-buf"
                    .into(),
            ),
        },
    }
}

/// What happens to a registration once decided: GDR only if the registration itself works.
/// Returns the registration (GDR) or the reason for staging.
pub fn register_or_stage<T>(d: &Decision, register: impl FnOnce() -> crate::error::Result<T>, mech: &str) -> Result<T, String> {
    match d {
        Decision::Staging(why) => Err(why.clone()),
        Decision::Gdr(_) => register().map_err(|e| format!("{mech} registration failed: {}", e.msg)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    fn facts(path: PathClass) -> Facts {
        Facts {
            mode: Mode::Auto,
            level: PathClass::Pxb,
            path,
            gpu_numa: Some(0),
            nic_numa: Some(0),
            gpu_gdr: true,
            peermem: Some(PEERMEM_FILES[2]),
            dmabuf: Ok(()),
            via: Via::DmaBuf,
        }
    }

    #[test]
    fn every_path_class_against_the_default_level() {
        use PathClass::*;
        for (p, gdr) in [(Loc, true), (Pix, true), (Pxb, true), (Phb, false), (Node, false), (Sys, false), (Unknown, false)] {
            let d = decide(&facts(p));
            assert_eq!(matches!(d, Decision::Gdr(_)), gdr, "{p}: {d:?}");
        }
        assert_eq!(decide(&facts(Pix)), Decision::Gdr("path PIX, dma-buf".into()));
        let mut f = facts(Sys);
        f.gpu_numa = Some(1);
        assert_eq!(decide(&f), Decision::Staging("path SYS, NUMA 1 → 0 (RIVET_GDR_LEVEL=PXB)".into()));
    }

    #[test]
    fn the_level_moves_the_boundary_and_node_counts_as_phb() {
        let mut f = facts(PathClass::Node);
        f.level = PathClass::Phb;
        assert!(matches!(decide(&f), Decision::Gdr(_)), "NCCL folds NODE into PHB");
        f.path = PathClass::Sys;
        assert!(matches!(decide(&f), Decision::Staging(_)));
        f.level = PathClass::Sys;
        assert!(matches!(decide(&f), Decision::Gdr(_)));
        f.level = PathClass::Loc;
        f.path = PathClass::Pix;
        assert!(matches!(decide(&f), Decision::Staging(_)));
    }

    #[test]
    fn modes_and_missing_capabilities() {
        let mut f = facts(PathClass::Sys);
        f.mode = Mode::Force;
        assert_eq!(decide(&f), Decision::Gdr("path SYS, dma-buf (RIVET_GDR=force)".into()));
        f = facts(PathClass::Pix);
        f.mode = Mode::Off;
        assert_eq!(decide(&f), Decision::Staging("RIVET_GDR=off".into()));
        f = facts(PathClass::Pix);
        f.gpu_gdr = false;
        assert!(matches!(decide(&f), Decision::Staging(s) if s.contains("GPU_DIRECT_RDMA_SUPPORTED")));
        f = facts(PathClass::Pix);
        f.dmabuf = Err("rxe0 does not support dma-buf (EOPNOTSUPP)".into());
        assert!(matches!(decide(&f), Decision::Staging(s) if s.contains("EOPNOTSUPP")));
        f.via = Via::Address;
        assert_eq!(decide(&f), Decision::Gdr("path PIX, peer memory (module/nvidia_peermem/version)".into()));
        f.peermem = None;
        assert!(matches!(decide(&f), Decision::Staging(s) if s.contains("modprobe nvidia-peermem")));
    }

    #[test]
    fn a_failed_registration_falls_back_to_staging_with_its_reason() {
        let d = decide(&facts(PathClass::Pix));
        let r: Result<u32, String> = register_or_stage(&d, || Err(Error::system("ibv_reg_dmabuf_mr: Bad address")), "dma-buf");
        assert_eq!(r, Err("dma-buf registration failed: ibv_reg_dmabuf_mr: Bad address".into()));
        assert_eq!(register_or_stage(&d, || Ok(7u32), "dma-buf"), Ok(7));
        let s = decide(&facts(PathClass::Sys));
        assert!(register_or_stage(&s, || -> crate::error::Result<u32> { panic!("not called when staging") }, "x").is_err());
    }

    #[test]
    fn peer_memory_files() {
        let root = std::env::temp_dir().join(format!("rivet-peermem-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        assert_eq!(peermem(&root), None);
        std::fs::create_dir_all(root.join("module/nvidia_peermem")).unwrap();
        std::fs::write(root.join("module/nvidia_peermem/version"), "580.159.04\n").unwrap();
        assert_eq!(peermem(&root), Some("module/nvidia_peermem/version"));
        std::fs::create_dir_all(root.join("kernel/mm/memory_peers/nv_mem")).unwrap();
        std::fs::write(root.join("kernel/mm/memory_peers/nv_mem/version"), "1.3\n").unwrap();
        assert_eq!(peermem(&root), Some("kernel/mm/memory_peers/nv_mem/version"));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn modes_parse() {
        assert_eq!(Mode::parse("AUTO"), Some(Mode::Auto));
        assert_eq!(Mode::parse("off"), Some(Mode::Off));
        assert_eq!(Mode::parse("force"), Some(Mode::Force));
        assert_eq!(Mode::parse("maybe"), None);
    }
}
