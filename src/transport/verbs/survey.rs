//! What `rivet doctor` reports of the RDMA devices: every port of every device, whatever its
//! state, with its GID table and network device, beside the ports [`discover`](super::dev::discover)
//! would use.

use super::dev::{gid_table, mtu_bytes, port_state_name, probe_dmabuf};
use super::select::{GidEntry, HcaFilter};
use crate::config::Config;
use crate::sys::ib::*;
use crate::sys::verbs::{self, Verbs};
use std::ffi::{c_int, CStr};

/// Everything `rivet doctor` reports about one RDMA port, whatever its state.
#[derive(Debug, Clone)]
pub struct PortSurvey {
    pub port: u8,
    pub state: &'static str,
    pub phys_state: &'static str,
    pub link_layer: &'static str,
    /// Active and maximum MTU in bytes.
    pub active_mtu: u32,
    pub max_mtu: u32,
    pub speed_mbps: i32,
    pub lid: u16,
    pub pkeys: Vec<u16>,
    pub gids: Vec<GidEntry>,
    /// The RoCE netdev behind the port and its MTU (from the GID attributes in sysfs).
    pub netdev: Option<(String, u32)>,
    /// Whether NCCL_IB_HCA lets rivet use the port.
    pub selected: bool,
}

#[derive(Debug, Clone)]
pub struct DevSurvey {
    pub name: String,
    pub fw_ver: Option<String>,
    pub node_guid: u64,
    pub pci_path: Option<String>,
    pub dmabuf: std::result::Result<(), String>,
    pub ports: Vec<PortSurvey>,
}

fn phys_state_name(s: u8) -> &'static str {
    match s {
        1 => "Sleep",
        2 => "Polling",
        3 => "Disabled",
        4 => "PortConfigurationTraining",
        5 => "LinkUp",
        6 => "LinkErrorRecovery",
        7 => "PhyTest",
        _ => "unknown",
    }
}

fn sysfs_string(path: String) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// The netdev behind a RoCE port (the first GID entry that names one) and its MTU.
fn port_netdev(dev: &str, port: u8, gids: &[GidEntry]) -> Option<(String, u32)> {
    gids.iter().find_map(|g| {
        let nd = sysfs_string(format!("/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/ndevs/{}", g.index))?;
        let mtu = sysfs_string(format!("/sys/class/net/{nd}/mtu"))?.parse().ok()?;
        Some((nd, mtu))
    })
}

/// Call `f` with every RDMA device libibverbs lists and its name; `Err` says why there is none.
pub(super) fn for_each_device(v: &Verbs, mut f: impl FnMut(*mut ibv_device, &str)) -> std::result::Result<(), String> {
    let mut n: c_int = 0;
    // SAFETY: `get_device_list` is ibv_get_device_list, resolved with the C signature declared in
    // Verbs; `n` is a local c_int out-parameter for the count.
    let list = unsafe { (v.get_device_list)(&mut n) };
    if list.is_null() || n <= 0 {
        if !list.is_null() {
            // SAFETY: `list` is the non-null array ibv_get_device_list just returned; it is freed
            // once, here, and not used after this error return.
            unsafe { (v.free_device_list)(list) };
        }
        return Err(format!(
            "{} found no RDMA device (no HCA, or its kernel driver or rdma-core provider is missing: see `ibv_devices`)",
            v.path
        ));
    }
    for i in 0..n as usize {
        // SAFETY: ibv_get_device_list(3) returns an array of `n` device pointers (NULL-terminated)
        // and `i < n`; the list is not freed until after this loop.
        let d = unsafe { *list.add(i) };
        // SAFETY: `d` is an entry of the live list; ibv_get_device_name(3) returns the device's
        // NUL-terminated name (an array inside the ibv_device, never NULL), valid while the list
        // is, and it is copied into a String right away.
        let name = unsafe { CStr::from_ptr((v.get_device_name)(d)) }.to_string_lossy().into_owned();
        f(d, &name);
    }
    // SAFETY: `list` came from ibv_get_device_list above and is freed exactly once. The callbacks
    // used each `d` only to open contexts, which ibv_free_device_list(3) lets outlive the list, and
    // no ibv_device pointer is kept.
    unsafe { (v.free_device_list)(list) };
    Ok(())
}

/// Every RDMA device and every port, active or not, for `rivet doctor`. `Err` says why there is
/// no RDMA device at all.
pub fn survey(cfg: &Config) -> std::result::Result<Vec<DevSurvey>, String> {
    let v = verbs::get().map_err(|e| e.0)?;
    let filter = cfg.ib_hca.as_deref().map(HcaFilter::parse);
    let mut out = Vec::new();
    for_each_device(v, |d, name| {
        let name = name.to_string();
        // SAFETY: `open_device` is ibv_open_device, resolved with the C signature declared in
        // Verbs; `d` is an entry of the device list, which for_each_device keeps alive during this
        // callback. A NULL result is handled below.
        let ctx = unsafe { (v.open_device)(d) };
        let base = DevSurvey {
            name: name.clone(),
            fw_ver: sysfs_string(format!("/sys/class/infiniband/{name}/fw_ver")),
            node_guid: 0,
            pci_path: std::fs::canonicalize(format!("/sys/class/infiniband/{name}/device"))
                .ok()
                .map(|p| p.display().to_string())
                .filter(|p| p.contains("/pci")),
            dmabuf: Err("the device could not be opened".into()),
            ports: Vec::new(),
        };
        if ctx.is_null() {
            out.push(base);
            return;
        }
        // SAFETY: ibv_device_attr is repr(C) with only integer and char-array fields (atomic_cap is
        // a c_uint alias), so all-zero is a valid value.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        let mut dev = base;
        // SAFETY: `ctx` is the non-null context just returned by ibv_open_device, closed only at
        // the end of this callback; `attr` is a local ibv_device_attr, the out-parameter
        // ibv_query_device(3) fills.
        if unsafe { (v.query_device)(ctx, &mut attr) } == 0 {
            dev.node_guid = u64::from_be(attr.node_guid);
            // SAFETY: `ctx` is the open context above, closed only after this PD is deallocated; a
            // NULL result is checked.
            let pd = unsafe { (v.alloc_pd)(ctx) };
            if !pd.is_null() {
                dev.dmabuf = probe_dmabuf(v, pd, &name);
                // SAFETY: `pd` is the non-null PD just allocated on `ctx`; probe_dmabuf
                // deregistered the only MR it may have made on it, so it has no resources, and it
                // is deallocated once, before its context is closed.
                unsafe { (v.dealloc_pd)(pd) };
            }
            for port in 1..=attr.phys_port_cnt {
                // SAFETY: ibv_port_attr is repr(C) with only integer fields (its enums are c_uint
                // aliases), so all-zero is a valid value; it is also what the inline ibv_query_port
                // does before the compat call.
                let mut pa: ibv_port_attr = unsafe { std::mem::zeroed() };
                // SAFETY: Verbs::query_port requires an open context: `ctx` stays open until the
                // close_device below. `pa` is a local ibv_port_attr and `port` is in
                // 1..=phys_port_cnt.
                if unsafe { v.query_port(ctx, port, &mut pa) } != 0 {
                    continue;
                }
                let gids = gid_table(v, ctx, &name, port, pa.gid_tbl_len);
                let mut pkeys = Vec::new();
                if let Some(q) = v.query_pkey {
                    for i in 0..(pa.pkey_tbl_len as c_int).min(16) {
                        let mut k = 0u16;
                        // SAFETY: `q` is ibv_query_pkey, resolved with the C signature declared in
                        // Verbs (its __be16 out-parameter is a u16); `ctx` is open until the close
                        // below, `k` is a local u16, and `i` is below the port's pkey_tbl_len.
                        if unsafe { q(ctx, port, i, &mut k) } == 0 && k != 0 {
                            pkeys.push(u16::from_be(k));
                        }
                    }
                }
                let roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET as u8;
                dev.ports.push(PortSurvey {
                    port,
                    state: port_state_name(pa.state),
                    phys_state: phys_state_name(pa.phys_state),
                    link_layer: if roce { "Ethernet" } else { "InfiniBand" },
                    active_mtu: mtu_bytes(pa.active_mtu),
                    max_mtu: mtu_bytes(pa.max_mtu),
                    // SAFETY: `ctx` is open until the close below and `port` is one of its ports.
                    speed_mbps: unsafe { super::dev::port_speed(v, ctx, port, &pa) },
                    lid: pa.lid,
                    netdev: if roce { port_netdev(&name, port, &gids) } else { None },
                    gids,
                    pkeys,
                    selected: filter.as_ref().map_or(true, |f| f.matches(&name, port)),
                });
            }
        }
        // SAFETY: `ctx` is the non-null context opened at the top of this callback and closed
        // exactly once, here; its only PD was deallocated above, nothing else was created on it,
        // and the pointer is not used afterwards, as ibv_close_device(3) requires.
        unsafe { (v.close_device)(ctx) };
        out.push(dev);
    })?;
    Ok(out)
}
