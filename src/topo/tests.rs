use super::fixture::{self, Fixture};
use super::*;

fn names(t: &Topology) -> Vec<&str> {
    t.nics.iter().map(|n| n.name.as_str()).collect()
}

#[test]
fn dgx_h100_gpus_nics_numa() {
    let f = fixture::dgx_h100();
    let t = Topology::probe(&f.root);
    let gpus: Vec<&str> = t.gpus.iter().map(|g| g.addr.as_str()).collect();
    assert_eq!(
        gpus,
        ["0000:15:00.0", "0000:19:00.0", "0000:1d:00.0", "0000:33:00.0", "0000:95:00.0", "0000:99:00.0", "0000:9d:00.0", "0000:b3:00.0"],
        "8 NVIDIA 3D controllers; not the NVSwitches (class 0x0680) nor the ASPEED VGA"
    );
    assert_eq!(names(&t), ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"], "netdevs of the mlx5 functions, lo, docker0 folded or skipped");
    assert_eq!(t.numa_nodes, [0, 1]);
    for (i, g) in t.gpus.iter().enumerate() {
        let want = if i < 4 { 0 } else { 1 };
        assert_eq!(g.numa, Some(want));
        assert_eq!(t.nics[i].numa(), Some(want));
    }
    let g0 = &t.gpus[0];
    assert_eq!(g0.root_complex, "pci0000:10");
    assert_eq!(g0.ancestors, ["0000:10:01.0", "0000:11:00.0", "0000:12:00.0", "0000:13:00.0", "0000:14:00.0"]);
    assert_eq!(t.nics[0].pci.as_ref().unwrap().addr, "0000:16:00.0");
}

#[test]
fn dgx_h100_path_classes() {
    let f = fixture::dgx_h100();
    let t = Topology::probe(&f.root);
    let g0 = "0000:15:00.0";
    let want = [
        ("mlx5_0", PathClass::Pix),
        ("mlx5_1", PathClass::Pxb),
        ("mlx5_2", PathClass::Phb),
        ("mlx5_3", PathClass::Node),
        ("mlx5_4", PathClass::Sys),
        ("mlx5_5", PathClass::Sys),
        ("mlx5_6", PathClass::Sys),
        ("mlx5_7", PathClass::Sys),
    ];
    for (nic, class) in want {
        assert_eq!(t.path(g0, nic), class, "GPU0 - {nic}");
    }
    // Every GPU is PIX to its own NIC, including mlx5_7 reached through an absolute link.
    for (i, g) in t.gpus.iter().enumerate() {
        assert_eq!(t.path(&g.addr, &format!("mlx5_{i}")), PathClass::Pix, "GPU{i}");
    }
    assert_eq!(t.path("0000:33:00.0", "mlx5_0"), PathClass::Node);
    assert_eq!(t.path("0000:b3:00.0", "mlx5_4"), PathClass::Node);
    assert_eq!(t.path("0000:9d:00.0", "mlx5_4"), PathClass::Phb);
    assert_eq!(t.path("0000:99:00.0", "mlx5_4"), PathClass::Pxb);
    // The bus id as CUDA writes it.
    assert_eq!(t.path("00000000:15:00.0", "mlx5_0"), PathClass::Pix);
    assert_eq!(t.path("15:00.0", "mlx5_1"), PathClass::Pxb);
    // Unknown names.
    assert_eq!(t.path(g0, "mlx5_9"), PathClass::Unknown);
    assert_eq!(t.path("0000:ee:00.0", "mlx5_0"), PathClass::Unknown);
    assert_eq!(t.path(g0, "mlx5_0").nccl(), PathClass::Pix);
    assert_eq!(t.path(g0, "mlx5_3").nccl(), PathClass::Phb);
}

#[test]
fn two_socket_gpu_and_nic_on_different_sockets() {
    let f = fixture::two_socket();
    let t = Topology::probe(&f.root);
    assert_eq!(t.gpus.len(), 1, "a VGA-class NVIDIA GPU counts");
    assert_eq!(t.gpus[0].addr, "0000:01:00.0");
    assert_eq!(t.gpus[0].numa, Some(0));
    assert_eq!(names(&t), ["mlx5_0", "mlx5_1", "eth2"]);
    assert_eq!(t.nic("mlx5_0").unwrap().numa(), Some(1));
    assert_eq!(t.nic("eth2").unwrap().numa(), None);
    assert_eq!(t.nic("eth2").unwrap().kind, NicKind::Net);
    assert_eq!(t.path("0000:01:00.0", "mlx5_0"), PathClass::Sys);
    assert_eq!(t.path("0000:01:00.0", "mlx5_1"), PathClass::Sys);
    assert_eq!(t.path("0000:01:00.0", "eth2"), PathClass::Sys, "unknown NUMA across root complexes: SYS");
    // Any PCI function by bus id: the two ports of the ConnectX sit below one root port.
    assert_eq!(t.path("0000:81:00.1", "mlx5_0"), PathClass::Pix);
    assert_eq!(t.path("0000:81:00.0", "mlx5_0"), PathClass::Loc);
}

#[test]
fn vm_virtual_nics_have_no_pci_path() {
    let f = fixture::vm();
    let t = Topology::probe(&f.root);
    assert_eq!(t.gpus.len(), 1);
    let g = t.gpus[0].addr.clone();
    assert_eq!(g, "0000:00:05.0");
    assert_eq!(t.gpus[0].numa, None);
    assert_eq!(names(&t), ["rxe0", "eth0", "eth1"], "veth0 and lo are not NICs");
    assert!(t.nic("rxe0").unwrap().pci.is_none());
    assert!(t.nic("eth1").unwrap().pci.is_none());
    assert_eq!(t.nic("eth0").unwrap().pci.as_ref().unwrap().addr, "0000:00:03.0", "virtio0's PCI parent");
    assert_eq!(t.path(&g, "rxe0"), PathClass::Unknown);
    assert_eq!(t.path(&g, "eth1"), PathClass::Unknown);
    assert_eq!(t.path(&g, "eth0"), PathClass::Phb);
}

#[test]
fn classify_unknown_numa_on_one_node_machine_is_node() {
    let d = |addr: &str, rc: &str, numa| PciDev {
        addr: addr.into(),
        root_complex: rc.into(),
        ancestors: vec![],
        numa,
        vendor: None,
        class: None,
    };
    let a = d("0000:01:00.0", "pci0000:00", None);
    let b = d("0000:41:00.0", "pci0000:40", None);
    assert_eq!(classify(Some(&a), Some(&b), true), PathClass::Node);
    assert_eq!(classify(Some(&a), Some(&b), false), PathClass::Sys);
    assert_eq!(classify(Some(&a), None, true), PathClass::Unknown);
    assert_eq!(classify(None, Some(&b), true), PathClass::Unknown);
}

#[test]
fn symlinks_resolve_inside_the_root() {
    let f = Fixture::new("links");
    let r = &f.root;
    std::fs::create_dir_all(r.join("devices/a/b")).unwrap();
    std::os::unix::fs::symlink("/sys/devices/a", r.join("abs")).unwrap();
    std::os::unix::fs::symlink("/devices/a/b", r.join("abs2")).unwrap();
    std::os::unix::fs::symlink("../../../../../../devices/a", r.join("devices/a/b/up")).unwrap();
    std::os::unix::fs::symlink("loop", r.join("loop")).unwrap();
    std::os::unix::fs::symlink("/etc", r.join("etc")).unwrap();
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(resolve(r, Path::new("abs/b")), Some(s(&["devices", "a", "b"])));
    assert_eq!(resolve(r, Path::new("abs2/..")), Some(s(&["devices", "a"])));
    assert_eq!(resolve(r, Path::new("devices/a/b/up/b")), Some(s(&["devices", "a", "b"])), "`..` stops at the root");
    assert_eq!(resolve(r, Path::new("loop")), None);
    assert_eq!(resolve(r, Path::new("etc/passwd")), None, "an absolute target never leaves the root");
    assert_eq!(resolve(r, Path::new("../../etc/passwd")), None);
}

#[test]
fn a_c2c_gpu_reaches_its_cpus_nics_over_p2c() {
    use PathClass::*;
    // Grace Hopper: the NIC on the GPU's CPU is P2C, within NCCL's default level; one on the
    // other socket stays SYS, and a non-C2C GPU keeps its PCI class.
    assert_eq!(with_c2c(Phb, || true), P2c);
    assert_eq!(with_c2c(Node, || true), P2c);
    assert_eq!((with_c2c(Sys, || true), with_c2c(Pix, || true), with_c2c(Phb, || false)), (Sys, Pix, Phb));
    assert_eq!(with_c2c(Pix, || unreachable!("NVML is not asked about a PCIe-switch path")), Pix);
    assert!(P2c.nccl() <= P2c && Phb.nccl() > P2c, "P2C is within the default level, PHB beyond it");
}

#[test]
fn level_names_and_order() {
    use PathClass::*;
    assert!(Loc < C2c && C2c < Pix && Pix < Pxb && Pxb < P2c && P2c < Pxn && Pxn < Phb && Phb < Node && Node < Sys && Sys < Unknown);
    for c in [Loc, C2c, Pix, Pxb, P2c, Pxn, Phb, Node, Sys] {
        assert_eq!(PathClass::parse_level(c.as_str()), Some(c));
        assert_eq!(PathClass::parse_level(&c.as_str().to_lowercase()), Some(c));
    }
    let ints = [Loc, Pix, Pxb, Phb, Sys, Sys];
    for (i, c) in ints.into_iter().enumerate() {
        assert_eq!(PathClass::parse_level(&i.to_string()), Some(c));
    }
    // NCCL reads any larger number as SYS, and NVL/NVB (below C2C) as C2C does: no PCI path.
    assert_eq!(PathClass::parse_level("6"), Some(Sys));
    assert_eq!((PathClass::parse_level("nvl"), PathClass::parse_level("NVB")), (Some(C2c), Some(C2c)));
    assert_eq!(PathClass::parse_level("-1"), None);
    assert_eq!(PathClass::parse_level("UNKNOWN"), None);
    assert_eq!(Node.nccl(), Phb);
    assert_eq!(Unknown.to_string(), "UNKNOWN");
}

#[test]
fn bus_ids_and_json() {
    assert_eq!(normalize_bus_id("00000000:1B:00.0").as_deref(), Some("0000:1b:00.0"));
    assert_eq!(normalize_bus_id("1b:00.0").as_deref(), Some("0000:1b:00.0"));
    assert_eq!(normalize_bus_id("10000:01:00.0").as_deref(), Some("10000:01:00.0"));
    assert_eq!(normalize_bus_id("nonsense"), None);
    let f = fixture::vm();
    let j: serde_json::Value = serde_json::from_str(&to_json(&Topology::probe(&f.root))).unwrap();
    let pair = |nic: &str| j["pairs"].as_array().unwrap().iter().find(|p| p["nic"] == nic).unwrap().clone();
    assert_eq!(pair("rxe0"), serde_json::json!({"gpu": "0000:00:05.0", "nic": "rxe0", "nic_pci": null, "path": "UNKNOWN", "gpu_numa": null, "nic_numa": null}));
    assert_eq!((pair("eth0")["nic_pci"].as_str(), pair("eth0")["path"].as_str()), (Some("0000:00:03.0"), Some("PHB")));
    assert_eq!(j["gpus"][0]["bus_id"], "0000:00:05.0");
    assert_eq!(j["nics"].as_array().unwrap().len(), 3);
}

/// The GDR decision on each fixture machine, through the same `locate` the plugin uses: every
/// path class, with a GPU and NIC that support GDR and the default RIVET_GDR_LEVEL (PXB).
#[test]
fn gdr_decision_on_fixtures() {
    use crate::gpu::gdr::{decide, locate, Decision, Facts, Mode, Via};
    let decide_on = |t: &Topology, gpu: &str, nic: &str| {
        let (path, gpu_numa, nic_numa) = locate(t, gpu, nic);
        let f = Facts {
            mode: Mode::Auto,
            level: PathClass::Pxb,
            path,
            gpu_numa,
            nic_numa,
            gpu_gdr: true,
            peermem: None,
            dmabuf: Ok(()),
            via: Via::DmaBuf,
        };
        decide(&f)
    };
    let f = fixture::dgx_h100();
    let t = Topology::probe(&f.root);
    let gpu0 = "0000:15:00.0";
    assert_eq!(decide_on(&t, gpu0, "mlx5_0"), Decision::Gdr("path PIX, dma-buf".into()));
    assert_eq!(decide_on(&t, gpu0, "mlx5_1"), Decision::Gdr("path PXB, dma-buf".into()));
    assert_eq!(decide_on(&t, gpu0, "mlx5_2"), Decision::Staging("path PHB, NUMA 0 → 0 (RIVET_GDR_LEVEL=PXB)".into()));
    assert_eq!(decide_on(&t, gpu0, "mlx5_3"), Decision::Staging("path NODE, NUMA 0 → 0 (RIVET_GDR_LEVEL=PXB)".into()));
    assert_eq!(decide_on(&t, gpu0, "mlx5_4"), Decision::Staging("path SYS, NUMA 0 → 1 (RIVET_GDR_LEVEL=PXB)".into()));
    // Every GPU has its own NIC under its switch.
    for g in &t.gpus {
        let gdr = t.nics.iter().filter(|n| matches!(decide_on(&t, &g.addr, &n.name), Decision::Gdr(_))).count();
        assert!(gdr >= 1, "GPU {} has no GDR NIC", g.addr);
    }

    let f = fixture::two_socket();
    let t = Topology::probe(&f.root);
    assert_eq!(decide_on(&t, "0000:01:00.0", "mlx5_0"), Decision::Staging("path SYS, NUMA 0 → 1 (RIVET_GDR_LEVEL=PXB)".into()));

    let f = fixture::vm();
    let t = Topology::probe(&f.root);
    assert!(matches!(decide_on(&t, "0000:00:05.0", "rxe0"), Decision::Staging(s) if s.starts_with("path UNKNOWN")));
}
