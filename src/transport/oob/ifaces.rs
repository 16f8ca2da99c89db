//! Network interfaces for the TCP transport, selected with `NCCL_SOCKET_IFNAME` syntax.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

#[derive(Debug, Clone)]
pub struct Iface {
    pub name: String,
    pub addr: IpAddr,
    /// realpath of /sys/class/net/IF/device; None for a virtual interface.
    pub pci_path: Option<String>,
    /// Mb/s from sysfs; 10000 when unknown.
    pub speed: i32,
}

/// A parsed `NCCL_SOCKET_IFNAME`-style list: `eth,ib` (prefixes), `^docker,lo` (exclude),
/// `=eth0,eth1` (exact names), `^=eth0` (exclude exact).
#[derive(Debug, Clone)]
pub struct IfFilter {
    exclude: bool,
    exact: bool,
    items: Vec<String>,
}

impl IfFilter {
    pub fn parse(spec: &str) -> IfFilter {
        let mut s = spec.trim();
        let exclude = s.starts_with('^');
        if exclude {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        let items = s.split(',').map(|x| x.trim().to_string()).filter(|x| !x.is_empty()).collect();
        IfFilter { exclude, exact, items }
    }

    pub fn matches(&self, name: &str) -> bool {
        let hit = self
            .items
            .iter()
            .any(|it| if self.exact { name == it } else { name.starts_with(it.as_str()) });
        hit != self.exclude
    }
}

/// (name, address) pairs of every interface with an IP address, in getifaddrs order.
fn addresses(family: Option<i32>) -> Vec<(String, IpAddr)> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs(3) takes a pointer to one `ifaddrs *`, here the live local `head`; on
    // success it stores a list it allocated, to be freed with freeifaddrs, and on failure (-1)
    // nothing that needs freeing.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is non-NULL and is `head` or an `ifa_next` of the list getifaddrs built,
        // which stays allocated and unchanged until freeifaddrs below, after the last use of `ifa`.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: `ifa_addr` was checked non-NULL just above and points to a socket address in the
        // list's memory; `sa_family` is the first field of every sockaddr type, so it can be read
        // whatever the family.
        let fam = unsafe { (*ifa.ifa_addr).sa_family } as i32;
        if family.is_some_and(|f| f != fam) {
            continue;
        }
        let addr = match fam {
            libc::AF_INET => {
                // SAFETY: the family is AF_INET, so getifaddrs stored a whole sockaddr_in at
                // `ifa_addr`, in storage the C library allocated for it (suitably aligned), valid
                // until freeifaddrs.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: the family is AF_INET6, so getifaddrs stored a whole sockaddr_in6 at
                // `ifa_addr`, in storage the C library allocated for it (suitably aligned), valid
                // until freeifaddrs.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                let a = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                // Link-local addresses need a scope id to be dialled; loopback v6 duplicates v4 lo.
                if a.is_loopback() || (a.segments()[0] & 0xffc0) == 0xfe80 {
                    continue;
                }
                IpAddr::V6(a)
            }
            _ => continue,
        };
        // SAFETY: getifaddrs sets each entry's `ifa_name` to a NUL-terminated interface name in the
        // list's memory, valid until freeifaddrs; it is copied into a String at once.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        out.push((name, addr));
    }
    // SAFETY: `head` is the list getifaddrs returned (the call succeeded, else this returned
    // early), freed exactly once, and nothing borrowed from it (`ifa`, `sin`, `sin6`, the name)
    // outlives the loop above.
    unsafe { libc::freeifaddrs(head) };
    out
}

fn sysfs_info(name: &str) -> (Option<String>, i32) {
    let base = format!("/sys/class/net/{name}");
    let pci = std::fs::canonicalize(format!("{base}/device"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
    let speed = std::fs::read_to_string(format!("{base}/speed"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|&s| s > 0)
        .unwrap_or(10000);
    (pci, speed)
}

/// Pick interfaces: one address per interface (the first, IPv4 before IPv6 as getifaddrs lists
/// them), at most 16, filtered by `spec` or, without one, everything but lo and docker*, falling
/// back to docker* and then lo when nothing else exists.
pub fn select(spec: Option<&str>, family: Option<i32>) -> Vec<Iface> {
    let all = addresses(family);
    let pick = |f: &IfFilter| {
        let mut v: Vec<(String, IpAddr)> = Vec::new();
        for (n, a) in &all {
            if f.matches(n) && !v.iter().any(|(m, _)| m == n) && v.len() < 16 {
                v.push((n.clone(), *a));
            }
        }
        v
    };
    let chosen = match spec {
        Some(s) => pick(&IfFilter::parse(s)),
        None => {
            let mut v = pick(&IfFilter::parse("^docker,lo"));
            if v.is_empty() {
                v = pick(&IfFilter::parse("docker"));
            }
            if v.is_empty() {
                v = pick(&IfFilter::parse("lo"));
            }
            v
        }
    };
    chosen
        .into_iter()
        .map(|(name, addr)| {
            let (pci_path, speed) = sysfs_info(&name);
            Iface { name, addr, pci_path, speed }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_syntax() {
        let f = IfFilter::parse("eth,ib");
        assert!(f.matches("eth0") && f.matches("ib1") && !f.matches("lo"));
        let f = IfFilter::parse("^docker,lo");
        assert!(f.matches("eth0") && !f.matches("docker0") && !f.matches("lo"));
        let f = IfFilter::parse("=eth0");
        assert!(f.matches("eth0") && !f.matches("eth01"));
        let f = IfFilter::parse("^=eth0");
        assert!(!f.matches("eth0") && f.matches("eth01"));
    }

    #[test]
    fn loopback_is_selectable_and_virtual() {
        let v = select(Some("lo"), Some(libc::AF_INET));
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].name, "lo");
        assert_eq!(v[0].addr, IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert!(v[0].pci_path.is_none());
        assert_eq!(v[0].speed, 10000);
    }

    #[test]
    fn default_skips_loopback_when_something_else_exists() {
        let v = select(None, None);
        let others = addresses(None).iter().any(|(n, _)| !n.starts_with("lo") && !n.starts_with("docker"));
        if others {
            assert!(v.iter().all(|i| i.name != "lo"), "{v:?}");
        }
        assert!(!v.is_empty());
    }
}
