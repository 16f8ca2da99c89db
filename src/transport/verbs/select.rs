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
pub fn port_speed_mbps(active_speed: u8, active_width: u8) -> i32 {
    let lane_mbps = match active_speed {
        1 => 2500,    // SDR
        2 => 5000,    // DDR
        4 | 8 => 10000, // QDR, FDR10
        16 => 14000,  // FDR
        32 => 25000,  // EDR
        64 => 50000,  // HDR
        128 => 100000, // NDR
        _ => 10000,
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
    }

    #[test]
    fn gid_text() {
        assert_eq!(describe_gid(&v4(0, [10, 0, 0, 2], None).gid), "10.0.0.2");
        assert_eq!(describe_gid(&v6(0, "fe80::1", None).gid), "fe80::1");
    }
}
