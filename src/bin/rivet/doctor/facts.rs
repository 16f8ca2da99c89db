//! The facts `rivet doctor` judges, gathered once with the code the plugin runs (device
//! discovery, GID choice, memlock check, GPUDirect probes, topology probe), and their flat
//! key → value map, which `--json` prints, `--save` writes and `--diff` compares against a saved
//! baseline. The report on them is in [`super::report`].

use nccl_net_rivet::config::{self, Config};
use nccl_net_rivet::gpu::cuda;
use nccl_net_rivet::gpu::gdr;
use nccl_net_rivet::topo::{PathClass, Topology};
use nccl_net_rivet::transport::verbs::dev::{self, DevSurvey};
use nccl_net_rivet::transport::verbs::select;
use std::collections::BTreeMap;
use super::report::{overall, pair_decision, roce_gid_choice, Section};

/// One GPU as CUDA reports it.
#[derive(Debug, Clone)]
pub struct GpuFacts {
    pub ordinal: i32,
    pub bus_id: String,
    pub gdr: bool,
    pub dmabuf: bool,
}

/// The limit on locked memory: None for unlimited.
#[derive(Debug, Clone, Copy)]
pub struct Memlock {
    pub limit: Option<u64>,
    pub cap_ipc_lock: bool,
}

/// Everything the report is made from.
#[derive(Debug, Clone)]
pub struct Facts {
    pub version: String,
    pub rdma: Result<Vec<DevSurvey>, String>,
    pub memlock: Memlock,
    pub peermem: Option<&'static str>,
    /// CUDA driver version and GPUs, or why there is no CUDA.
    pub cuda: Result<(i32, Vec<GpuFacts>), String>,
    pub topo: Topology,
    /// The transport the plugin picks, and why.
    pub transport: (String, String),
    /// The library's WARN of a host with GPUs or RDMA devices that takes TCP anyway.
    pub tcp_warning: Option<String>,
    /// The devices NCCL gets from the plugin, by name (RDMA devices, or TCP interfaces).
    pub net_devs: Vec<String>,
    /// RIVET_SOCKET_CUDA: the TCP transport stages GPU buffers itself.
    pub socket_cuda: bool,
    pub gdr_mode: gdr::Mode,
    pub gdr_level: PathClass,
    pub dmabuf_on: bool,
    pub addr_family: i32,
    pub addr_range: Option<(std::net::IpAddr, u8)>,
    pub roce_version: u32,
    pub gid_index: Option<u32>,
}

fn memlock() -> Memlock {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the local `r`.
    let limit = if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 || r.rlim_cur == libc::RLIM_INFINITY {
        None
    } else {
        Some(r.rlim_cur)
    };
    let cap_ipc_lock = dev::has_cap_ipc_lock();
    Memlock { limit, cap_ipc_lock }
}

fn cuda_facts() -> Result<(i32, Vec<GpuFacts>), String> {
    let c = cuda::get().map_err(|s| s.to_string())?;
    let mut gpus = Vec::new();
    for o in 0..c.devices {
        let bus_id = cuda::bus_id(o).map_err(|e| e.into_msg())?;
        let (gdr, dmabuf) = cuda::gdr_attributes(o).map_err(|e| e.into_msg())?;
        gpus.push(GpuFacts { ordinal: o, bus_id, gdr, dmabuf });
    }
    Ok((c.driver_version, gpus))
}

impl Facts {
    pub fn gather() -> Facts {
        let cfg: &Config = config::get();
        let topo = Topology::probe(&Topology::default_root());
        let net_devs = nccl_net_rivet::plugin::devices_table()
            .map(|t| t.list.iter().map(|d| d.info().name.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let transport = match nccl_net_rivet::plugin::devices_table() {
            Ok(t) => match &t.no_rdma {
                None => (
                    t.transport.to_string(),
                    format!(
                        "{} active port(s): {}",
                        t.list.len(),
                        t.list.iter().map(|d| d.info().name.to_string_lossy().into_owned()).collect::<Vec<_>>().join(", ")
                    ),
                ),
                Some(why) => (
                    t.transport.to_string(),
                    format!(
                        "RDMA not used: {why}; TCP on {}",
                        t.list.iter().map(|d| format!("{} ({})", d.info().iface, d.info().addr)).collect::<Vec<_>>().join(", ")
                    ),
                ),
            },
            Err(e) => ("none".into(), e.into_msg()),
        };
        let tcp_warning = nccl_net_rivet::plugin::devices_table().ok().and_then(|t| t.tcp_warning.clone());
        Facts {
            version: nccl_net_rivet::plugin::VERSION.to_string(),
            rdma: if cfg.ib_disable { Err("NCCL_IB_DISABLE=1".into()) } else { dev::survey(cfg) },
            memlock: memlock(),
            peermem: gdr::peermem(&topo.root),
            cuda: cuda_facts(),
            topo,
            transport,
            tcp_warning,
            net_devs,
            socket_cuda: cfg.socket_cuda,
            gdr_mode: cfg.gdr,
            gdr_level: cfg.gdr_level,
            dmabuf_on: cfg.dmabuf,
            addr_family: cfg.ib_addr_family,
            addr_range: cfg.ib_addr_range,
            roce_version: cfg.ib_roce_version,
            gid_index: cfg.ib_gid_index,
        }
    }
}

/// Facts that change without anything being wrong: `--diff` shows them but does not fail on them.
const INFORMATIONAL: &[&str] = &["rivet.version"];

pub fn fact_map(f: &Facts) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    let mut put = |k: String, v: String| {
        m.insert(k, v);
    };
    put("rivet.version".into(), f.version.clone());
    match &f.rdma {
        Err(why) => put("rdma".into(), format!("none: {why}")),
        Ok(devs) => {
            put("rdma".into(), devs.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(","));
            for d in devs {
                put(format!("dev.{}.firmware", d.name), d.fw_ver.clone().unwrap_or_default());
                put(format!("dev.{}.pci", d.name), d.pci_path.clone().unwrap_or_default());
                put(format!("dev.{}.dmabuf", d.name), d.dmabuf.clone().map_or_else(|e| format!("no: {e}"), |_| "yes".into()));
                for p in &d.ports {
                    let k = format!("port.{}:{}", d.name, p.port);
                    put(format!("{k}.state"), format!("{} {}", p.state, p.phys_state));
                    put(format!("{k}.link_layer"), p.link_layer.into());
                    put(format!("{k}.mtu"), format!("{} (max {})", p.active_mtu, p.max_mtu));
                    put(format!("{k}.speed"), p.speed_mbps.to_string());
                    put(format!("{k}.pkeys"), p.pkeys.iter().map(|x| format!("{x:#06x}")).collect::<Vec<_>>().join(","));
                    if let Some((nd, mtu)) = &p.netdev {
                        put(format!("{k}.netdev"), format!("{nd} mtu {mtu}"));
                    }
                    for g in &p.gids {
                        put(
                            format!("{k}.gid.{}", g.index),
                            format!("{}{}", select::describe_gid(&g.gid), g.roce_version.map(|v| format!(" v{v}")).unwrap_or_default()),
                        );
                    }
                    if p.link_layer == "Ethernet" {
                        put(format!("{k}.gid_chosen"), roce_gid_choice(f, p).0.map_or("none".into(), |i| i.to_string()));
                    }
                }
            }
        }
    }
    put("limits.memlock".into(), f.memlock.limit.map_or("unlimited".into(), |b| b.to_string()));
    put("gpudirect.peermem".into(), f.peermem.unwrap_or("none").into());
    match &f.cuda {
        Err(why) => put("cuda".into(), format!("none: {why}")),
        Ok((ver, gpus)) => {
            put("cuda".into(), format!("driver {ver}"));
            for g in gpus {
                put(format!("gpu.{}.gdr", g.bus_id), g.gdr.to_string());
                put(format!("gpu.{}.dmabuf", g.bus_id), g.dmabuf.to_string());
            }
        }
    }
    for g in &f.topo.gpus {
        for n in &f.topo.nics {
            let d = match pair_decision(f, &g.addr, &n.name) {
                gdr::Decision::Gdr(_) => "GDR",
                gdr::Decision::Staging(_) => "staging",
            };
            put(format!("topo.{}.{}", g.addr, n.name), format!("{} {d}", f.topo.path(&g.addr, &n.name)));
        }
    }
    put("transport".into(), f.transport.0.clone());
    m
}

pub fn to_json(sections: &[Section], facts: &BTreeMap<String, String>) -> String {
    let secs: Vec<serde_json::Value> = sections
        .iter()
        .map(|s| {
            serde_json::json!({
                "title": s.title,
                "verdict": s.verdict.as_str(),
                "summary": s.summary,
                "lines": s.lines,
                "warnings": s.findings.iter().map(|w| serde_json::json!({"what": w.what, "fix": w.fix})).collect::<Vec<_>>(),
            })
        })
        .collect();
    let overall = overall(sections).as_str();
    serde_json::to_string_pretty(&serde_json::json!({"overall": overall, "sections": secs, "facts": facts})).unwrap_or_default()
}

/// The facts of a saved baseline (`--save`'s file).
pub fn load_facts(text: &str) -> Result<BTreeMap<String, String>, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not a rivet doctor baseline: {e}"))?;
    let obj = v.get("facts").and_then(|f| f.as_object()).ok_or("not a rivet doctor baseline: no \"facts\" object")?;
    Ok(obj.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect())
}

/// What changed from `old` to `new`: one line per key, and whether anything that matters did.
pub fn diff(old: &BTreeMap<String, String>, new: &BTreeMap<String, String>) -> (Vec<String>, bool) {
    let mut out = Vec::new();
    let mut matters = false;
    for (k, v) in new {
        let line = match old.get(k) {
            None => format!("+ {k}: {v}"),
            Some(o) if o != v => format!("~ {k}: {o} -> {v}"),
            Some(_) => continue,
        };
        matters |= !INFORMATIONAL.contains(&k.as_str());
        out.push(line);
    }
    for (k, v) in old {
        if !new.contains_key(k) {
            matters |= !INFORMATIONAL.contains(&k.as_str());
            out.push(format!("- {k}: {v}"));
        }
    }
    (out, matters)
}

