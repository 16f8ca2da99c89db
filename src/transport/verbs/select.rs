//! Pure selection logic of the verbs transport: `NCCL_IB_HCA` filters, the RoCE GID choice and the
//! port speed, each testable without a NIC.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A parsed `NCCL_IB_HCA`: `mlx5_0:1,mlx5_1` (prefixes, optional port), `^` excludes, `=` exact;
/// as NCCL 2.30, an entry may go on with a rail and a plane (`mlx5_0:1:3:2`, `mlx5_1::0` for a
/// rail without a port; empty fields are undefined).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaFilter {
    exclude: bool,
    exact: bool,
    entries: Vec<HcaEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct HcaEntry {
    name: String,
    port: Option<u8>,
    /// -1: undefined.
    rail: i16,
    plane: i16,
}

impl HcaFilter {
    pub fn parse(spec: &str) -> HcaFilter {
        let mut s = spec.trim();
        let mut exclude = false;
        let mut exact = false;
        // NCCL accepts the two markers in either order.
        for _ in 0..2 {
            if let Some(r) = s.strip_prefix('^') {
                exclude = true;
                s = r;
            } else if let Some(r) = s.strip_prefix('=') {
                exact = true;
                s = r;
            }
        }
        let entries = s
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|e| {
                let mut parts = e.split(':');
                let name = parts.next().unwrap_or("").to_string();
                let port = parts.next().and_then(|p| p.trim().parse::<u8>().ok());
                let id = |p: Option<&str>| p.and_then(|p| p.trim().parse::<i16>().ok()).filter(|&v| v >= 0).unwrap_or(-1);
                let rail = id(parts.next());
                let plane = id(parts.next());
                HcaEntry { name, port, rail, plane }
            })
            .collect();
        HcaFilter { exclude, exact, entries }
    }

    fn entry(&self, dev: &str, port: u8) -> Option<&HcaEntry> {
        self.entries.iter().find(|e| {
            let name_ok = if self.exact { dev == e.name } else { dev.starts_with(e.name.as_str()) };
            name_ok && e.port.map_or(true, |p| p == port)
        })
    }

    pub fn matches(&self, dev: &str, port: u8) -> bool {
        self.entry(dev, port).is_some() != self.exclude
    }

    /// The rail and plane the entry selecting `dev:port` gives it (-1 when undefined, and for
    /// every device of an exclude list).
    pub fn rail_plane(&self, dev: &str, port: u8) -> (i16, i16) {
        match self.entry(dev, port) {
            Some(e) if !self.exclude => (e.rail, e.plane),
            _ => (-1, -1),
        }
    }
}

/// One GID table entry as read from the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    pub index: u32,
    pub gid: [u8; 16],
    /// RoCE version from sysfs `gid_attrs/types` (1 or 2), None where unreadable.
    pub roce_version: Option<u32>,
}

/// An InfiniBand GID's FLID (bytes 4-5, big-endian): the LID of the port across subnets, where
/// the fabric routes by FLID.
pub fn flid(gid: &[u8; 16]) -> u16 {
    u16::from_be_bytes([gid[4], gid[5]])
}

/// An InfiniBand GID's local subnet prefix (bytes 6-7), which net_ib compares to tell whether a
/// peer is in our subnet.
pub fn ib_subnet(gid: &[u8; 16]) -> u16 {
    u16::from_be_bytes([gid[6], gid[7]])
}

/// The GID index of an InfiniBand port, as net_ib picks it: NCCL_IB_ROUTABLE_FLID_GID_INDEX where
/// that GID holds a FLID (the port is routable across subnets), else 0.
pub fn ib_gid_index(gids: &[GidEntry], routable: u32) -> u32 {
    gids.iter().find(|e| e.index == routable && flid(&e.gid) != 0).map_or(0, |e| e.index)
}

/// The address vector of a queue pair as net_ib builds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Av {
    /// A global route header: destination GID, our GID index, hop limit 255, the class.
    pub global: bool,
    pub dlid: u16,
    pub traffic_class: u8,
    /// Across subnets, the peer's GID holds no FLID: its LID is used, which the fabric may
    /// not route.
    pub no_flid: bool,
}

/// RoCE: always a global route, with the traffic class. InfiniBand: by LID within the subnet
/// (the 16-bit prefix in GID bytes 6-7 is ours), with a GRH only where the port requires one;
/// across subnets with a GRH and the peer's FLID as the DLID where it has one (its LID where
/// not). InfiniBand's GRH carries no traffic class (net_ib leaves it 0; the service level is
/// what classes traffic there). A peer with LID 0 is reached by GID.
pub fn address_vector(roce: bool, local_gid: &[u8; 16], grh_required: bool, remote_lid: u16, remote_gid: &[u8; 16], tc: u8) -> Av {
    if roce {
        return Av { global: true, dlid: 0, traffic_class: tc, no_flid: false };
    }
    let same = ib_subnet(local_gid) == ib_subnet(remote_gid);
    let f = flid(remote_gid);
    let dlid = if !same && f != 0 { f } else { remote_lid };
    Av { global: !same || grh_required || remote_lid == 0, dlid, traffic_class: 0, no_flid: !same && f == 0 }
}

/// A GID worth comparing: not all zeros, and not a bare link-local prefix (fe80::/64 with
/// nothing else), as net_ib's validGid.
pub fn valid_gid(g: &[u8; 16]) -> bool {
    g.iter().any(|&b| b != 0) && !(g[..8] == [0xfe, 0x80, 0, 0, 0, 0, 0, 0] && g[8..].iter().all(|&b| b == 0))
}

fn ipv4_mapped(g: &[u8; 16]) -> bool {
    (g[..10].iter().all(|&b| b == 0) || g[..2] == [0xff, 0x0e] && g[2..10].iter().all(|&b| b == 0)) && g[10..12] == [0xff, 0xff]
}

/// NCCL_IB_SUBNET_AWARE_ROUTING's test of two RoCE GIDs: the same family, and for IPv4 the same
/// first `prefix_len` bits (NCCL_IB_SUBNET_PREFIX_LEN), for IPv6 the same 64-bit prefix.
pub fn same_subnet(a: &[u8; 16], b: &[u8; 16], prefix_len: u8) -> bool {
    match (ipv4_mapped(a), ipv4_mapped(b)) {
        (true, true) => {
            let mask = u32::MAX.checked_shl(32 - prefix_len.clamp(1, 32) as u32).unwrap_or(0);
            let ip = |g: &[u8; 16]| u32::from_be_bytes([g[12], g[13], g[14], g[15]]);
            ip(a) & mask == ip(b) & mask
        }
        (false, false) => a[..8] == b[..8],
        _ => false,
    }
}

/// The device a connect should use under NCCL_IB_SUBNET_AWARE_ROUTING, as net_ib picks it:
/// `default` if every RoCE member of it is on a subnet of one of the listener's GIDs `remote`,
/// else the first other device (`devices[i]`: its RoCE members' GIDs) of which that holds, else
/// `default`. Listener GIDs that are not valid (an InfiniBand listener sends none) change
/// nothing.
pub fn device_by_subnet(remote: &[[u8; 16]], default: usize, devices: &[Vec<[u8; 16]>], prefix_len: u8) -> usize {
    let remote: Vec<&[u8; 16]> = remote.iter().filter(|g| valid_gid(g)).collect();
    if remote.is_empty() {
        return default;
    }
    let fits = |d: &Vec<[u8; 16]>| !d.is_empty() && d.iter().all(|l| valid_gid(l) && remote.iter().any(|r| same_subnet(l, r, prefix_len)));
    if devices.get(default).is_some_and(fits) {
        return default;
    }
    (0..devices.len()).find(|&i| i != default && fits(&devices[i])).unwrap_or(default)
}

/// The IP address a RoCE GID stands for (IPv4-mapped GIDs give IPv4).
pub fn gid_ip(gid: &[u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(*gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

fn in_range(ip: IpAddr, range: Option<(IpAddr, u8)>) -> bool {
    let Some((net, len)) = range else { return true };
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len as u32) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if len == 0 { 0 } else { u128::MAX << (128 - len as u32) };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// NCCL's automatic RoCE GID choice: entries of the wanted family (AF_INET: IPv4-mapped) within
/// `range`, skipping empty and link-local ones; the first of the preferred RoCE version wins,
/// else the first candidate of any version.
pub fn choose_gid(entries: &[GidEntry], family: i32, range: Option<(IpAddr, u8)>, version: u32) -> Option<u32> {
    let candidates: Vec<&GidEntry> = entries
        .iter()
        .filter(|e| e.gid != [0; 16])
        .filter(|e| {
            let ip = gid_ip(&e.gid);
            let fam_ok = match ip {
                IpAddr::V4(v4) => family == libc::AF_INET && !v4.is_unspecified() && !v4.is_link_local(),
                IpAddr::V6(v6) => family == libc::AF_INET6 && (v6.segments()[0] & 0xffc0) != 0xfe80,
            };
            fam_ok && in_range(ip, range)
        })
        .collect();
    candidates
        .iter()
        .find(|e| e.roce_version == Some(version))
        .or_else(|| candidates.first())
        .map(|e| e.index)
}

/// Port speed in Mb/s from `ibv_port_attr.active_speed` and `active_width` (IB encodings).
pub fn port_speed_mbps(active_speed: u32, active_width: u8) -> i32 {
    // The lane rate of the lowest speed bit set, as net_ib reads it: SDR, DDR, QDR, FDR10, FDR,
    // EDR, HDR, NDR, then XDR (256, reported in active_speed_ex only).
    const LANE: [i32; 9] = [2500, 5000, 10000, 10000, 14000, 25000, 50000, 100000, 200000];
    let lane_mbps = match active_speed {
        // No speed at all: rivet's guess of 10 Gb/s (net_ib's table would say XDR).
        0 => 10000,
        s => LANE[(s.trailing_zeros() as usize).min(8)],
    };
    let lanes = match active_width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => 1,
    };
    lane_mbps * lanes
}

/// A port's speed in Mb/s: `ibv_query_port_speed`'s answer (units of 100 Mb/s: the effective
/// bandwidth, aggregated over a LAG) where NCCL_IB_QUERY_PORT_SPEED lets it be asked and
/// libibverbs has it (rdma-core 62+), else the lane rate of `active_speed_ex` (XDR and faster;
/// rdma-core 49+), or of `active_speed` where that is 0, times the lanes of `active_width`.
pub fn port_speed(queried: Option<u64>, active_speed: u8, active_speed_ex: u32, active_width: u8) -> i32 {
    if let Some(q) = queried.filter(|&q| q > 0) {
        return q.saturating_mul(100).min(i32::MAX as u64) as i32;
    }
    port_speed_mbps(if active_speed_ex != 0 { active_speed_ex } else { active_speed as u32 }, active_width)
}

/// The PCI path NCCL's topology gets for a device, as net_ib makes it from the sysfs realpath:
/// the function digit zeroed, so that the ports and PFs of one card are one PCI device to NCCL,
/// and with NCCL_IB_MERGE_VFS the two device digits too, so that its VFs are as well.
pub fn nccl_pci_path(full: &str, merge_vfs: bool) -> String {
    let mut b = full.as_bytes().to_vec();
    let n = b.len();
    if n >= 1 {
        b[n - 1] = b'0';
    }
    if merge_vfs && n >= 4 {
        b[n - 3] = b'0';
        b[n - 4] = b'0';
    }
    String::from_utf8_lossy(&b).into_owned()
}

/// net_ib's port numbering of devices that share a PCI device: for each device (in NCCL's order,
/// its NCCL PCI path), how many earlier ones have the same path but for the function digit (with
/// NCCL_IB_MERGE_VFS, but for the device digits too); NCCL sees port `port + this`.
pub fn real_ports(paths: &[Option<&str>], merge_vfs: bool) -> Vec<u8> {
    let cut = if merge_vfs { 4 } else { 1 };
    paths
        .iter()
        .enumerate()
        .map(|(d, p)| {
            let Some(p) = p else { return 0 };
            let key = &p.as_bytes()[..p.len().saturating_sub(cut)];
            paths[..d].iter().flatten().filter(|q| q.as_bytes().starts_with(key)).count().min(255) as u8
        })
        .collect()
}

/// IPv4 address of `::ffff:a.b.c.d`, for messages.
pub fn describe_gid(gid: &[u8; 16]) -> String {
    match gid_ip(gid) {
        IpAddr::V4(a) if a != Ipv4Addr::UNSPECIFIED => a.to_string(),
        ip => ip.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(index: u32, a: [u8; 4], ver: Option<u32>) -> GidEntry {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&a);
        GidEntry { index, gid, roce_version: ver }
    }
    fn v6(index: u32, s: &str, ver: Option<u32>) -> GidEntry {
        GidEntry { index, gid: s.parse::<Ipv6Addr>().unwrap().octets(), roce_version: ver }
    }

    #[test]
    fn hca_filter_syntax() {
        let f = HcaFilter::parse("mlx5_0:1:3:2,mlx5_1::0,mlx5_2:1::5");
        assert_eq!(f.rail_plane("mlx5_0", 1), (3, 2));
        assert!(f.matches("mlx5_1", 2), "an empty port field is any port");
        assert_eq!(f.rail_plane("mlx5_1", 2), (0, -1));
        assert_eq!(f.rail_plane("mlx5_2", 1), (-1, 5), "a plane without a rail");
        assert_eq!(f.rail_plane("mlx5_9", 1), (-1, -1));
        assert_eq!(HcaFilter::parse("^mlx5_0:1:3:2").rail_plane("mlx5_1", 1), (-1, -1), "an exclude list gives none");
        let f = HcaFilter::parse("mlx5_0:1,mlx5_1");
        assert!(f.matches("mlx5_0", 1) && !f.matches("mlx5_0", 2));
        assert!(f.matches("mlx5_1", 2) && f.matches("mlx5_10", 1)); // prefix, as NCCL
        assert!(!f.matches("rxe0", 1));
        let f = HcaFilter::parse("=mlx5_1");
        assert!(f.matches("mlx5_1", 1) && !f.matches("mlx5_10", 1));
        let f = HcaFilter::parse("^rxe1");
        assert!(f.matches("rxe0", 1) && !f.matches("rxe1", 1));
        let f = HcaFilter::parse("^=rxe");
        assert!(f.matches("rxe0", 1) && !f.matches("rxe", 1));
    }

    #[test]
    fn gid_choice_prefers_ipv4_roce_v2() {
        // Shaped like rxe: fe80 link-local v2 at 0, IPv4 v2 at 1; plus a v1 copy and an empty slot.
        let t = [
            v6(0, "fe80::ff:fe00:1", Some(2)),
            v4(1, [10, 0, 0, 1], Some(1)),
            GidEntry { index: 2, gid: [0; 16], roce_version: Some(2) },
            v4(3, [10, 0, 0, 1], Some(2)),
            v6(4, "fd00::1", Some(2)),
        ];
        assert_eq!(choose_gid(&t, libc::AF_INET, None, 2), Some(3));
        assert_eq!(choose_gid(&t, libc::AF_INET, None, 1), Some(1));
        assert_eq!(choose_gid(&t, libc::AF_INET6, None, 2), Some(4));
        // Only v1 present: still usable.
        assert_eq!(choose_gid(&t[..2], libc::AF_INET, None, 2), Some(1));
        // Range filters.
        let r = Some(("10.0.0.0".parse().unwrap(), 24));
        assert_eq!(choose_gid(&t, libc::AF_INET, r, 2), Some(3));
        let r = Some(("192.168.0.0".parse().unwrap(), 16));
        assert_eq!(choose_gid(&t, libc::AF_INET, r, 2), None);
        // Unreadable types (a container's EINVAL) do not hide an otherwise good entry.
        assert_eq!(choose_gid(&[v4(5, [10, 1, 2, 3], None)], libc::AF_INET, None, 2), Some(5));
        // Nothing but link-local.
        assert_eq!(choose_gid(&t[..1], libc::AF_INET6, None, 2), None);
    }

    #[test]
    fn speeds() {
        assert_eq!(port_speed_mbps(64, 2), 200_000); // HDR 4x
        assert_eq!(port_speed_mbps(128, 2), 400_000); // NDR 4x
        assert_eq!(port_speed_mbps(32, 1), 25_000);
        assert_eq!(port_speed_mbps(0, 0), 10_000);
        // XDR comes in active_speed_ex (active_speed then says NDR): 200 Gb/s a lane.
        assert_eq!(port_speed(None, 128, 256, 2), 800_000);
        assert_eq!(port_speed(None, 128, 0, 2), 400_000, "an older libibverbs leaves active_speed_ex 0");
        // ibv_query_port_speed's answer, in 100 Mb/s units, wins (a LAG of two NDR 4x ports).
        assert_eq!(port_speed(Some(8000), 128, 0, 2), 800_000);
        assert_eq!(port_speed(Some(0), 32, 0, 2), 100_000, "0 is no answer");
    }

    /// An InfiniBand GID: subnet prefix fe80::<flid>:<subnet>, then the port GUID.
    fn ib_gid(flid: u16, subnet: u16, guid: u8) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[4..6].copy_from_slice(&flid.to_be_bytes());
        g[6..8].copy_from_slice(&subnet.to_be_bytes());
        g[15] = guid;
        g
    }

    #[test]
    fn infiniband_routes_by_lid_in_a_subnet_and_by_flid_across() {
        let me = ib_gid(0x0101, 7, 1);
        // Same subnet: by LID, no GRH, whatever the FLIDs.
        let av = address_vector(false, &me, false, 12, &ib_gid(0x0202, 7, 2), 106);
        assert_eq!(av, Av { global: false, dlid: 12, traffic_class: 0, no_flid: false });
        // ... unless the port requires a GRH.
        assert!(address_vector(false, &me, true, 12, &ib_gid(0x0202, 7, 2), 0).global);
        // Another subnet: a GRH, and the peer's FLID as the DLID.
        let av = address_vector(false, &me, false, 12, &ib_gid(0x0202, 9, 2), 106);
        assert_eq!(av, Av { global: true, dlid: 0x0202, traffic_class: 0, no_flid: false });
        // Another subnet without a FLID: the LID, and a warning's worth.
        let av = address_vector(false, &me, false, 12, &ib_gid(0, 9, 2), 0);
        assert_eq!(av, Av { global: true, dlid: 12, traffic_class: 0, no_flid: true });
        // RoCE: always global, with the class.
        let av = address_vector(true, &me, false, 0, &me, 106);
        assert_eq!(av, Av { global: true, dlid: 0, traffic_class: 106, no_flid: false });
    }

    #[test]
    fn infiniband_gid_index_is_the_routable_flid_one_where_it_has_a_flid() {
        let e = |index: u32, gid: [u8; 16]| GidEntry { index, gid, roce_version: None };
        let gids = vec![e(0, ib_gid(0, 7, 1)), e(1, ib_gid(0x0101, 7, 1))];
        assert_eq!(ib_gid_index(&gids, 1), 1);
        assert_eq!(ib_gid_index(&gids, 3), 0, "no such entry");
        let gids = vec![e(0, ib_gid(0, 7, 1)), e(1, ib_gid(0, 7, 1))];
        assert_eq!(ib_gid_index(&gids, 1), 0, "no FLID: index 0");
        assert_eq!((flid(&ib_gid(0xabcd, 1, 0)), ib_subnet(&ib_gid(0, 0x1234, 0))), (0xabcd, 0x1234));
    }

    #[test]
    fn subnet_aware_routing_picks_a_device_on_the_listeners_subnet() {
        let g = |a: [u8; 4]| v4(0, a, None).gid;
        let rail0 = vec![g([10, 0, 0, 1])];
        let rail1 = vec![g([10, 0, 1, 1])];
        let fused = vec![g([10, 0, 0, 3]), g([10, 0, 1, 3])];
        let devs = vec![rail0.clone(), rail1.clone(), fused];
        // The listener is on rail 1: device 0 is not, device 1 is.
        assert_eq!(device_by_subnet(&[g([10, 0, 1, 2]), [0; 16]], 0, &devs, 24), 1);
        // On the default's subnet: kept.
        assert_eq!(device_by_subnet(&[g([10, 0, 0, 2])], 0, &devs, 24), 0);
        // A fused listener on both rails: the default (on one of them) is kept; a fused
        // connector needs every member on one of the listener's subnets.
        assert_eq!(device_by_subnet(&[g([10, 0, 0, 2]), g([10, 0, 1, 2])], 2, &devs, 24), 2);
        assert_eq!(device_by_subnet(&[g([10, 0, 1, 2])], 2, &devs, 24), 1);
        // No device on the listener's subnet, or no listener GIDs (InfiniBand): the default.
        assert_eq!(device_by_subnet(&[g([10, 9, 0, 2])], 0, &devs, 24), 0);
        assert_eq!(device_by_subnet(&[[0; 16], [0; 16]], 1, &devs, 24), 1);
        // The prefix length decides: /16 puts both rails in one subnet.
        assert_eq!(device_by_subnet(&[g([10, 0, 1, 2])], 0, &devs, 16), 0);
        // IPv6 compares the 64-bit prefix; families never match each other.
        let v6a = v6(0, "fd00:1::1", None).gid;
        let v6b = v6(0, "fd00:1::2", None).gid;
        let v6c = v6(0, "fd00:2::1", None).gid;
        assert!(same_subnet(&v6a, &v6b, 24) && !same_subnet(&v6a, &v6c, 24));
        assert!(!same_subnet(&v6a, &g([10, 0, 0, 1]), 24));
        assert!(!valid_gid(&[0; 16]) && valid_gid(&v6a));
    }

    #[test]
    fn pci_paths_merge_ports_and_vfs_as_net_ib() {
        let pf0 = "/sys/devices/pci0000:00/0000:00:01.0/0000:05:00.0";
        let pf1 = "/sys/devices/pci0000:00/0000:00:01.0/0000:05:00.1";
        let vf = "/sys/devices/pci0000:00/0000:00:01.0/0000:05:01.3";
        assert_eq!(nccl_pci_path(pf1, true), pf0);
        assert_eq!(nccl_pci_path(vf, true), pf0);
        assert_eq!(nccl_pci_path(vf, false), "/sys/devices/pci0000:00/0000:00:01.0/0000:05:01.0");
        let other = "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0";
        let paths: Vec<String> = [pf0, pf1, vf, other].iter().map(|p| nccl_pci_path(p, true)).collect();
        let refs: Vec<Option<&str>> = paths.iter().map(|p| Some(p.as_str())).chain([None]).collect();
        // Two PFs and a VF of one card: ports 1, 2, 3 to NCCL; the other card and a software
        // device: their own port.
        assert_eq!(real_ports(&refs, true), vec![0, 1, 2, 0, 0]);
        let paths: Vec<String> = [pf0, pf1, vf].iter().map(|p| nccl_pci_path(p, false)).collect();
        let refs: Vec<Option<&str>> = paths.iter().map(|p| Some(p.as_str())).collect();
        assert_eq!(real_ports(&refs, false), vec![0, 1, 0], "without NCCL_IB_MERGE_VFS the VF is its own device");
    }

    #[test]
    fn gid_text() {
        assert_eq!(describe_gid(&v4(0, [10, 0, 0, 2], None).gid), "10.0.0.2");
        assert_eq!(describe_gid(&v6(0, "fe80::1", None).gid), "fe80::1");
    }
}
