//! The report of `rivet doctor`: a pure function of the [`Facts`](super::facts::Facts), so every
//! verdict and warning is tested on synthetic facts and on the sysfs fixture trees.

use super::facts::{Facts, GpuFacts};
use nccl_net_rivet::gpu::gdr;
use nccl_net_rivet::topo::PathClass;
use nccl_net_rivet::transport::verbs::dev::{self, PortSurvey};
use nccl_net_rivet::transport::verbs::select;
use std::fmt::Write;

// ---------------------------------------------------------------------------------------------
// The report.

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    Ok,
    /// Not applicable here (no GPU, no RDMA device).
    Info,
    Warn,
    Fail,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "OK",
            Verdict::Info => "INFO",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
        }
    }
}

/// A problem and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub what: String,
    pub fix: String,
}

#[derive(Debug, Clone)]
pub struct Section {
    pub title: &'static str,
    pub verdict: Verdict,
    pub summary: String,
    pub lines: Vec<String>,
    pub findings: Vec<Finding>,
}

impl Section {
    pub fn new(title: &'static str) -> Section {
        Section { title, verdict: Verdict::Ok, summary: String::new(), lines: Vec::new(), findings: Vec::new() }
    }

    pub fn warn(&mut self, what: String, fix: String) {
        self.findings.push(Finding { what, fix });
        self.verdict = self.verdict.max(Verdict::Warn);
    }
}

/// The largest IB MTU a RoCE port can use over a netdev of `mtu` bytes (the IB payload plus
/// the RoCE v2 headers must fit in one Ethernet frame).
pub fn roce_mtu_for(netdev_mtu: u32) -> u32 {
    [4096, 2048, 1024, 512, 256].into_iter().find(|m| m + 78 <= netdev_mtu).unwrap_or(256)
}

pub(super) fn roce_gid_choice(f: &Facts, p: &PortSurvey) -> (Option<u32>, String) {
    if let Some(i) = f.gid_index {
        return (p.gids.iter().any(|g| g.index == i).then_some(i), format!("NCCL_IB_GID_INDEX={i}"));
    }
    let fam = if f.addr_family == libc::AF_INET6 { "AF_INET6" } else { "AF_INET" };
    let choice = select::choose_gid(&p.gids, f.addr_family, f.addr_range, f.roce_version);
    let why = format!(
        "RoCE v{} preferred, NCCL_IB_ADDR_FAMILY={fam}{}, skipping empty and link-local entries",
        f.roce_version,
        f.addr_range.map(|(a, l)| format!(", NCCL_IB_ADDR_RANGE={a}/{l}")).unwrap_or_default()
    );
    (choice, why)
}

fn devices_section(f: &Facts) -> Section {
    let mut s = Section::new("RDMA devices and ports");
    let devs = match &f.rdma {
        Err(why) => {
            s.verdict = Verdict::Info;
            s.summary = format!("no RDMA device: {why}; NCCL traffic goes over rivet's TCP transport");
            return s;
        }
        Ok(d) => d,
    };
    let mut usable = 0;
    for d in devs {
        s.lines.push(format!(
            "{}: firmware {}, node GUID {:#018x}, pci {}",
            d.name,
            d.fw_ver.as_deref().unwrap_or("?"),
            d.node_guid,
            d.pci_path.as_deref().unwrap_or("none (virtual)")
        ));
        for p in &d.ports {
            let id = format!("{}:{}", d.name, p.port);
            let roce = p.link_layer == "Ethernet";
            let mut line = format!(
                "  {id}: {} ({}), {}, MTU {} (max {}), {} Mb/s, P_Keys [{}]",
                p.state,
                p.phys_state,
                if roce { "Ethernet (RoCE)" } else { "InfiniBand" },
                p.active_mtu,
                p.max_mtu,
                p.speed_mbps,
                p.pkeys.iter().map(|k| format!("{k:#06x}")).collect::<Vec<_>>().join(", ")
            );
            if let Some((nd, mtu)) = &p.netdev {
                let _ = write!(line, ", netdev {nd} MTU {mtu}");
            }
            if !p.selected {
                line.push_str(" [excluded by NCCL_IB_HCA]");
            }
            s.lines.push(line);
            if p.state != "ACTIVE" {
                if p.selected {
                    s.warn(
                        format!("{id} is {} (physical state {}): rivet does not use it", p.state, p.phys_state),
                        if roce {
                            format!(
                                "bring the link up (`ip link set {} up`, check the cable and the switch port)",
                                p.netdev.as_ref().map_or("<netdev>", |n| n.0.as_str())
                            )
                        } else {
                            "check the cable, the switch port and the subnet manager (`ibstat`, `sminfo`)".into()
                        },
                    );
                }
                continue;
            }
            if !roce {
                s.lines.push(format!("    LID {}: InfiniBand routes by LID, the GID table is not used", p.lid));
                usable += p.selected as usize;
                continue;
            }
            for g in &p.gids {
                s.lines.push(format!(
                    "    GID[{}] {}{}",
                    g.index,
                    select::describe_gid(&g.gid),
                    g.roce_version.map(|v| format!(" RoCE v{v}")).unwrap_or_default()
                ));
            }
            let (choice, why) = roce_gid_choice(f, p);
            match choice {
                Some(i) => {
                    s.lines.push(format!("    rivet uses GID {i} ({why})"));
                    usable += p.selected as usize;
                }
                None => s.warn(
                    format!("{id} has no usable GID ({why}): rivet cannot use the port"),
                    if f.addr_family == libc::AF_INET6 {
                        "give the port's netdev an IPv6 address, or set NCCL_IB_ADDR_FAMILY=AF_INET".into()
                    } else {
                        format!(
                            "give {} an IPv4 address (`ip addr add 10.0.0.1/24 dev {0}`) so the port gets an IPv4-mapped RoCE v2 GID, or set NCCL_IB_ADDR_FAMILY=AF_INET6",
                            p.netdev.as_ref().map_or("the port's netdev", |n| n.0.as_str())
                        )
                    },
                ),
            }
            if let Some((nd, mtu)) = &p.netdev {
                let best = roce_mtu_for(*mtu);
                if p.active_mtu < best.min(p.max_mtu) {
                    s.warn(
                        format!("{id} runs at MTU {} although {nd} (MTU {mtu}) allows {best}", p.active_mtu),
                        format!("raise the port's MTU to match (mlxconfig/switch settings), or the netdev's MTU is wrong for this fabric (`ip link set {nd} mtu ...`)"),
                    );
                } else if p.active_mtu > best {
                    s.warn(
                        format!("{id} runs at MTU {} but {nd} has MTU {mtu}, which fits only {best}: large packets will be dropped", p.active_mtu),
                        format!("raise {nd}'s MTU (`ip link set {nd} mtu 9000`) or lower the port's"),
                    );
                }
            }
        }
    }
    if usable == 0 {
        s.verdict = Verdict::Fail;
        s.summary = "no usable RDMA port: rivet falls back to TCP".into();
    } else {
        s.summary = format!("{usable} usable port(s)");
    }
    s
}

fn limits_section(f: &Facts) -> Section {
    let mut s = Section::new("Limits");
    let lim = match f.memlock.limit {
        None => "unlimited".to_string(),
        Some(b) => format!("{} KiB", b / 1024),
    };
    s.lines.push(format!(
        "RLIMIT_MEMLOCK {lim}{}; rivet needs unlimited (or at least 1 GiB) to register NCCL's buffers",
        if f.memlock.cap_ipc_lock { " (CAP_IPC_LOCK: the limit does not apply)" } else { "" }
    ));
    let low = matches!(f.memlock.limit, Some(b) if b < dev::MEMLOCK_NEEDED) && !f.memlock.cap_ipc_lock;
    if low {
        if f.rdma.is_ok() {
            s.warn(
                format!("RLIMIT_MEMLOCK is {lim}: memory registrations will fail"),
                "`ulimit -l unlimited` (docker: --ulimit memlock=-1; systemd: LimitMEMLOCK=infinity; /etc/security/limits.conf: * - memlock unlimited)".into(),
            );
        } else {
            s.verdict = Verdict::Info;
        }
    }
    s.summary = if low { format!("memlock {lim}") } else { format!("memlock {lim}: enough") };
    s
}

fn gpudirect_section(f: &Facts) -> Section {
    let mut s = Section::new("GPUDirect");
    s.lines.push(format!(
        "peer memory: {}",
        f.peermem.map_or("none (no nvidia_peermem or nv_peer_mem module)".to_string(), |p| format!("yes ({p})"))
    ));
    let nic_dmabuf: Vec<(String, bool)> = match &f.rdma {
        Ok(devs) => devs
            .iter()
            .map(|d| {
                s.lines.push(format!(
                    "dma-buf on {}: {}",
                    d.name,
                    match &d.dmabuf {
                        Ok(()) => "yes".to_string(),
                        Err(why) => format!("no ({why})"),
                    }
                ));
                (d.name.clone(), d.dmabuf.is_ok())
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    let gpus = match &f.cuda {
        Err(why) => {
            s.verdict = Verdict::Info;
            s.summary = format!("no GPU in use: {why}; rivet registers host memory only");
            return s;
        }
        Ok((ver, gpus)) => {
            s.lines.push(format!("CUDA driver {}.{}", ver / 1000, ver % 1000 / 10));
            gpus
        }
    };
    for g in gpus {
        s.lines.push(format!(
            "GPU {} (CUDA device {}): GPUDirect RDMA {}, dma-buf {}",
            g.bus_id,
            g.ordinal,
            if g.gdr { "supported" } else { "not supported" },
            if g.dmabuf { "supported" } else { "not supported" }
        ));
    }
    if f.rdma.is_err() {
        s.verdict = Verdict::Info;
        s.summary = "no RDMA device: GPUDirect RDMA does not apply".into();
        return s;
    }
    let any_dmabuf = nic_dmabuf.iter().any(|(_, ok)| *ok) && gpus.iter().any(|g| g.dmabuf) && f.dmabuf_on;
    if f.peermem.is_none() && !any_dmabuf && !gpus.is_empty() {
        s.warn(
            "neither peer memory nor dma-buf is available: GPU buffers go through host staging".into(),
            "load the peer-memory module (`modprobe nvidia-peermem`), or use NVIDIA's open kernel modules with a kernel of 5.12 or newer and rdma-core 34 or newer for dma-buf".into(),
        );
    }
    if f.gdr_mode == gdr::Mode::Off {
        s.lines.push("RIVET_GDR=off: GPU buffers always go through host staging".into());
    }
    s.summary = match (f.peermem.is_some(), any_dmabuf) {
        (true, true) => "peer memory and dma-buf".into(),
        (true, false) => "peer memory".into(),
        (false, true) => "dma-buf".into(),
        (false, false) => "no GPUDirect mechanism".into(),
    };
    s
}

fn numa(n: Option<u32>) -> String {
    n.map_or("?".into(), |n| n.to_string())
}

/// The decision for one pair, under the facts' settings and the GPU's own capabilities (GPUs
/// CUDA does not know, e.g. in a fixture tree, are assumed capable).
pub(super) fn pair_decision(f: &Facts, gpu: &str, nic: &str) -> gdr::Decision {
    let (path, gpu_numa, nic_numa) = gdr::locate(&f.topo, gpu, nic);
    let g = f.cuda.as_ref().ok().and_then(|(_, gs)| gs.iter().find(|g| g.bus_id == gpu));
    let nic_dmabuf = match &f.rdma {
        Ok(devs) => devs.iter().find(|d| d.name == nic).map_or(Err("not an RDMA device".to_string()), |d| d.dmabuf.clone()),
        Err(why) => Err(why.clone()),
    };
    let dmabuf = match (f.dmabuf_on, g.map_or(true, |g| g.dmabuf)) {
        (false, _) => Err("RIVET_DMABUF=off".to_string()),
        (_, false) => Err("the GPU does not support dma-buf".to_string()),
        _ => nic_dmabuf,
    };
    let via = if dmabuf.is_ok() { gdr::Via::DmaBuf } else { gdr::Via::Address };
    gdr::decide(&gdr::Facts {
        mode: f.gdr_mode,
        level: f.gdr_level,
        path,
        gpu_numa,
        nic_numa,
        gpu_gdr: g.map_or(true, |g| g.gdr),
        peermem: f.peermem,
        dmabuf,
        via,
    })
}

fn topology_section(f: &Facts) -> Section {
    let mut s = Section::new("GPU x NIC topology");
    let t = &f.topo;
    if t.gpus.is_empty() {
        s.verdict = Verdict::Info;
        s.summary = format!("no GPU under {}", t.root.display());
        return s;
    }
    if t.nics.is_empty() {
        s.verdict = Verdict::Info;
        s.summary = "no NIC found".into();
        return s;
    }
    let w = t.nics.iter().map(|n| n.name.len()).max().unwrap_or(4).max(7) + 2;
    let mut head = format!("{:<14}", "GPU");
    for n in &t.nics {
        let _ = write!(head, "{:<w$}", n.name);
    }
    head.push_str("NUMA");
    s.lines.push(head);
    for g in &t.gpus {
        let mut row = format!("{:<14}", g.addr);
        for n in &t.nics {
            let p = t.path(&g.addr, &n.name);
            let d = if matches!(pair_decision(f, &g.addr, &n.name), gdr::Decision::Gdr(_)) { "GDR" } else { "stg" };
            let _ = write!(row, "{:<w$}", format!("{p}/{d}"));
        }
        row.push_str(&numa(g.numa));
        s.lines.push(row);
    }
    s.lines.push("(path class / rivet's choice for GPU buffers: GDR or host staging)".into());
    // The NIC rivet would pair each GPU with is the closest one; say why GDR is off for it, and
    // name the NIC on the GPU's NUMA node when the closest crosses NUMA nodes.
    for g in &t.gpus {
        let best = t.nics.iter().map(|n| (t.path(&g.addr, &n.name), n)).min_by_key(|(p, _)| *p);
        let Some((p, n)) = best else { continue };
        match pair_decision(f, &g.addr, &n.name) {
            gdr::Decision::Gdr(why) => s.lines.push(format!("GPU {}: closest NIC {} ({why}): GDR", g.addr, n.name)),
            gdr::Decision::Staging(why) => s.lines.push(format!("GPU {}: closest NIC {}: host staging ({why})", g.addr, n.name)),
        }
        if p >= PathClass::Sys {
            let local = t.nics.iter().find(|m| m.numa().is_some() && m.numa() == g.numa);
            s.warn(
                format!(
                    "GPU {} (NUMA {}) has no NIC on its NUMA node: its closest, {}, is on NUMA {} (path {p})",
                    g.addr,
                    numa(g.numa),
                    n.name,
                    numa(n.numa())
                ),
                match local {
                    Some(l) => format!("use {} (on NUMA {}), e.g. NCCL_IB_HCA={}", l.name, numa(l.numa()), l.name),
                    None => "put a NIC on that socket, or pin the job to the other socket's GPUs".into(),
                },
            );
        }
    }
    s.summary = format!("{} GPU(s), {} NIC(s)", t.gpus.len(), t.nics.len());
    // A node built for GPUDirect (an RDMA NIC within RIVET_GDR_LEVEL of a GPU) whose GPUs all
    // stage does not give a GPU job what it was built for.
    let near = |g: &nccl_net_rivet::topo::PciDev| {
        t.nics.iter().any(|n| n.kind == nccl_net_rivet::topo::NicKind::Rdma && t.path(&g.addr, &n.name).nccl() <= f.gdr_level.nccl())
    };
    let all_staged = t.gpus.iter().all(|g| t.nics.iter().all(|n| !matches!(pair_decision(f, &g.addr, &n.name), gdr::Decision::Gdr(_))));
    if all_staged && t.gpus.iter().any(near) {
        let why = t
            .gpus
            .iter()
            .find(|g| near(g))
            .and_then(|g| {
                let n = t.nics.iter().filter(|n| n.kind == nccl_net_rivet::topo::NicKind::Rdma).min_by_key(|n| t.path(&g.addr, &n.name))?;
                match pair_decision(f, &g.addr, &n.name) {
                    gdr::Decision::Staging(why) => Some(format!("GPU {} with {}: {why}", g.addr, n.name)),
                    gdr::Decision::Gdr(_) => None,
                }
            })
            .unwrap_or_default();
        s.summary += ", every GPU stages";
        s.warn(
            format!("every GPU's buffers go through host staging, although RDMA NICs sit within {} of GPUs ({why})", f.gdr_level),
            "see the GPUDirect section: load nvidia-peermem or use dma-buf; check RIVET_GDR and RIVET_GDR_LEVEL".into(),
        );
    }
    s
}

/// The GPUs a job would use: those in sysfs, then any CUDA reports that sysfs does not show.
fn gpu_list(f: &Facts) -> Vec<(String, Option<i32>)> {
    let cuda: &[GpuFacts] = f.cuda.as_ref().map(|(_, g)| g.as_slice()).unwrap_or(&[]);
    let norm = |b: &str| nccl_net_rivet::topo::normalize_bus_id(b).unwrap_or_else(|| b.to_string());
    let mut out: Vec<(String, Option<i32>)> =
        f.topo.gpus.iter().map(|g| (g.addr.clone(), cuda.iter().find(|c| norm(&c.bus_id) == g.addr).map(|c| c.ordinal))).collect();
    for c in cuda {
        if !out.iter().any(|(a, _)| *a == norm(&c.bus_id)) {
            out.push((norm(&c.bus_id), Some(c.ordinal)));
        }
    }
    out
}

/// One line per GPU: the NIC NCCL will pair it with (the closest of the plugin's devices), the
/// transport, and GDR or staging with the reason. A GPU job that gets TCP is a WARN.
fn gpu_jobs_section(f: &Facts) -> Section {
    let mut s = Section::new("GPU jobs");
    let gpus = gpu_list(f);
    if gpus.is_empty() {
        s.verdict = Verdict::Info;
        s.summary = "no GPU: nothing to check for GPU jobs".into();
        return s;
    }
    let t = &f.topo;
    let tcp = f.transport.0 == "TCP";
    for (i, (addr, ordinal)) in gpus.iter().enumerate() {
        let who = format!("GPU{i} {addr}{}", ordinal.map(|o| format!(" (CUDA device {o})")).unwrap_or_default());
        let nic = f.net_devs.iter().min_by_key(|n| t.path(addr, n));
        let Some(nic) = nic else {
            s.lines.push(format!("{who}: no network device: NCCL cannot leave this node"));
            continue;
        };
        let path = t.path(addr, nic);
        let how = if tcp {
            if f.socket_cuda {
                "TCP; rivet stages its buffers through host memory (RIVET_SOCKET_CUDA=1)".to_string()
            } else {
                "TCP; NCCL copies its buffers through host memory itself".to_string()
            }
        } else {
            match pair_decision(f, addr, nic) {
                gdr::Decision::Gdr(why) => format!("RDMA verbs, GDR ({why})"),
                gdr::Decision::Staging(why) => format!("RDMA verbs, host staging ({why})"),
            }
        };
        s.lines.push(format!("{who}: NIC {nic} (path {path}): {how}"));
    }
    s.summary = format!("{} GPU(s)", gpus.len());
    match f.transport.0.as_str() {
        "TCP" => {
            let why = f.transport.1.split("; TCP on").next().unwrap_or(&f.transport.1).to_string();
            s.warn(
                format!("this node has {} GPU(s), but NCCL would move their data over TCP ({why})", gpus.len()),
                "give the job RDMA: install rdma-core (libibverbs1, ibverbs-providers), pass /dev/infiniband into the container, and see the RDMA section; NCCL_IB_DISABLE must not be 1".into(),
            );
        }
        "RDMA verbs" => {}
        _ => {
            s.warn("NCCL would get no network device from rivet".into(), "see the Transport section".into());
        }
    }
    s
}

fn transport_section(f: &Facts) -> Section {
    let mut s = Section::new("Transport");
    s.summary = format!("NCCL gets rivet's {} transport", f.transport.0);
    s.lines.push(f.transport.1.clone());
    match f.transport.0.as_str() {
        "RDMA verbs" => {}
        "TCP" => s.verdict = if f.rdma.is_ok() || f.tcp_warning.is_some() { Verdict::Warn } else { Verdict::Info },
        _ => s.verdict = Verdict::Fail,
    }
    if let Some(w) = &f.tcp_warning {
        s.findings.push(Finding { what: "rivet would run over TCP on a host with GPUs or RDMA devices (a job would train many times slower)".into(), fix: w.clone() });
    } else if f.transport.0 == "TCP" && f.rdma.is_ok() {
        s.findings.push(Finding {
            what: "RDMA devices exist but rivet would use TCP".into(),
            fix: "see the RDMA section's warnings (no active port, no usable GID, NCCL_IB_HCA)".into(),
        });
    }
    s
}

pub fn analyze(f: &Facts) -> Vec<Section> {
    vec![devices_section(f), limits_section(f), gpudirect_section(f), topology_section(f), transport_section(f), gpu_jobs_section(f)]
}

pub fn render(sections: &[Section]) -> String {
    let mut out = String::new();
    for s in sections {
        let _ = writeln!(out, "== {}: {} {}", s.title, s.verdict.as_str(), s.summary);
        for l in &s.lines {
            let _ = writeln!(out, "   {l}");
        }
        for w in &s.findings {
            let _ = writeln!(out, "   WARN {}\n        fix: {}", w.what, w.fix);
        }
    }
    let _ = writeln!(out, "== overall: {}", overall(sections).as_str());
    out
}

/// The worst verdict, where sections that do not apply (INFO) count as OK.
pub fn overall(sections: &[Section]) -> Verdict {
    match sections.iter().map(|s| s.verdict).max().unwrap_or(Verdict::Ok) {
        Verdict::Info => Verdict::Ok,
        v => v,
    }
}

// ---------------------------------------------------------------------------------------------
// Facts as a flat map, for --json, --save and --diff.


#[cfg(test)]
mod tests {
    use super::super::facts::{diff, fact_map, load_facts, to_json, Memlock};
    use super::*;
    use nccl_net_rivet::topo::Topology;
    use nccl_net_rivet::transport::verbs::dev::DevSurvey;
    use nccl_net_rivet::transport::verbs::select::GidEntry;

    fn v4_gid(a: [u8; 4]) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&a);
        g
    }

    fn port(state: &'static str, mtu: u32, netdev_mtu: u32, gids: Vec<GidEntry>) -> PortSurvey {
        PortSurvey {
            port: 1,
            state,
            phys_state: if state == "ACTIVE" { "LinkUp" } else { "Disabled" },
            link_layer: "Ethernet",
            active_mtu: mtu,
            max_mtu: 4096,
            speed_mbps: 100000,
            lid: 0,
            pkeys: vec![0xffff],
            gids,
            netdev: Some(("eth2".into(), netdev_mtu)),
            selected: true,
        }
    }

    fn facts(ports: Vec<PortSurvey>) -> Facts {
        Facts {
            version: "test".into(),
            rdma: Ok(vec![DevSurvey {
                name: "mlx5_0".into(),
                fw_ver: Some("28.39.1002".into()),
                node_guid: 1,
                pci_path: None,
                dmabuf: Err("mlx5_0 does not support dma-buf registration".into()),
                ports,
            }]),
            memlock: Memlock { limit: None, cap_ipc_lock: false },
            peermem: Some("module/nvidia_peermem/version"),
            cuda: Ok((12040, vec![GpuFacts { ordinal: 0, bus_id: "0000:18:00.0".into(), gdr: true, dmabuf: true }])),
            topo: Topology { root: "/nonexistent".into(), gpus: vec![], nics: vec![], numa_nodes: vec![], c2c: std::sync::OnceLock::from(Vec::new()) },
            transport: ("RDMA verbs".into(), "1 active port(s): mlx5_0".into()),
            tcp_warning: None,
            net_devs: vec!["mlx5_0".into()],
            socket_cuda: false,
            gdr_mode: gdr::Mode::Auto,
            gdr_level: PathClass::Pxb,
            dmabuf_on: true,
            addr_family: libc::AF_INET,
            addr_range: None,
            roce_version: 2,
            gid_index: None,
        }
    }

    fn good_gids() -> Vec<GidEntry> {
        vec![GidEntry { index: 3, gid: v4_gid([10, 0, 0, 1]), roce_version: Some(2) }]
    }

    fn warnings(f: &Facts) -> Vec<String> {
        analyze(f).iter().flat_map(|s| s.findings.iter().map(|w| format!("{} | {}", w.what, w.fix))).collect()
    }

    #[test]
    fn a_healthy_roce_node() {
        let f = facts(vec![port("ACTIVE", 4096, 9000, good_gids())]);
        let s = analyze(&f);
        assert!(warnings(&f).is_empty(), "{:?}", warnings(&f));
        assert_eq!(s[0].verdict, Verdict::Ok);
        let text = render(&s);
        assert!(text.contains("rivet uses GID 3 (RoCE v2 preferred, NCCL_IB_ADDR_FAMILY=AF_INET"), "{text}");
        assert!(text.contains("MTU 4096 (max 4096), 100000 Mb/s, P_Keys [0xffff], netdev eth2 MTU 9000"), "{text}");
        assert_eq!(fact_map(&f).get("port.mlx5_0:1.gid_chosen").map(String::as_str), Some("3"));
    }

    #[test]
    fn port_down_no_ipv4_gid_and_mtu_mismatch() {
        let f = facts(vec![port("DOWN", 1024, 1500, good_gids())]);
        let w = warnings(&f);
        assert!(w.iter().any(|w| w.contains("mlx5_0:1 is DOWN (physical state Disabled)") && w.contains("ip link set eth2 up")), "{w:?}");
        assert_eq!(analyze(&f)[0].verdict, Verdict::Fail, "no usable port");

        let link_local = GidEntry { index: 0, gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8], roce_version: Some(2) };
        let f = facts(vec![port("ACTIVE", 4096, 9000, vec![link_local])]);
        let w = warnings(&f);
        assert!(w.iter().any(|w| w.contains("has no usable GID") && w.contains("IPv4 address")), "{w:?}");

        let f = facts(vec![port("ACTIVE", 1024, 9000, good_gids())]);
        let w = warnings(&f);
        assert!(w.iter().any(|w| w.contains("runs at MTU 1024 although eth2 (MTU 9000) allows 4096")), "{w:?}");
        let f = facts(vec![port("ACTIVE", 4096, 1500, good_gids())]);
        let w = warnings(&f);
        assert!(w.iter().any(|w| w.contains("eth2 has MTU 1500, which fits only 1024") && w.contains("mtu 9000")), "{w:?}");
        assert_eq!((roce_mtu_for(9000), roce_mtu_for(1500), roce_mtu_for(4200)), (4096, 1024, 4096));
    }

    #[test]
    fn memlock_and_gpudirect() {
        let mut f = facts(vec![port("ACTIVE", 4096, 9000, good_gids())]);
        f.memlock = Memlock { limit: Some(64 << 10), cap_ipc_lock: false };
        f.peermem = None;
        let w = warnings(&f);
        assert!(w.iter().any(|w| w.contains("RLIMIT_MEMLOCK is 64 KiB") && w.contains("ulimit -l unlimited")), "{w:?}");
        assert!(w.iter().any(|w| w.contains("neither peer memory nor dma-buf") && w.contains("modprobe nvidia-peermem")), "{w:?}");
        f.memlock.cap_ipc_lock = true;
        f.peermem = Some("module/nvidia_peermem/version");
        assert!(warnings(&f).is_empty(), "{:?}", warnings(&f));
    }

    #[test]
    fn diff_of_facts() {
        let f = facts(vec![port("ACTIVE", 4096, 9000, good_gids())]);
        let a = fact_map(&f);
        assert_eq!(diff(&a, &a), (vec![], false));
        let mut g = f.clone();
        g.version = "other".into();
        assert!(!diff(&a, &fact_map(&g)).1, "the version alone does not matter");
        let g = facts(vec![port("ACTIVE", 1024, 9000, good_gids())]);
        let (lines, matters) = diff(&a, &fact_map(&g));
        assert!(matters);
        assert_eq!(lines, vec!["~ port.mlx5_0:1.mtu: 4096 (max 4096) -> 1024 (max 4096)".to_string()]);
        let back = load_facts(&to_json(&analyze(&f), &a)).unwrap();
        assert_eq!(back, a);
        assert!(load_facts("{}").is_err());
    }
}

