//! What this process holds: memory, pinned pages, fds and threads from /proc, and its RDMA
//! resources (queue pairs, CQ entries, memory regions) from the kernel's resource tracker
//! through iproute2's `rdma` tool, whichever plugin made them.

use std::process::Command;

#[derive(Clone, Copy, Default)]
pub struct Usage {
    pub rss_kib: u64,
    /// Pages pinned by RDMA registrations (VmPin) and locked by mlock (VmLck), KiB.
    pub pinned_kib: u64,
    pub fds: u64,
    pub threads: u64,
    /// None where the kernel tracks no RDMA resources for us (no `rdma` tool, no RDMA device).
    pub rdma: Option<Rdma>,
}

#[derive(Clone, Copy, Default)]
pub struct Rdma {
    pub qps: u64,
    pub cqes: u64,
    pub mrs: u64,
    pub mr_bytes: u64,
}

impl Usage {
    /// Now, with the RDMA resources.
    pub fn now() -> Usage {
        Usage { rdma: rdma(std::process::id()), ..Self::of_process() }
    }

    /// Now, from /proc only, after giving the heap's free pages back (what glibc keeps after free
    /// would read as use).
    pub fn of_process() -> Usage {
        // SAFETY: malloc_trim has no preconditions; it only returns free heap pages to the kernel.
        unsafe { libc::malloc_trim(0) };
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |k: &str| -> u64 {
            status.lines().find_map(|l| l.strip_prefix(k)).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse().ok()).unwrap_or(0)
        };
        let fds = std::fs::read_dir("/proc/self/fd").map(|d| d.count() as u64).unwrap_or(0);
        Usage {
            rss_kib: field("VmRSS:"),
            pinned_kib: field("VmPin:") + field("VmLck:"),
            fds,
            threads: field("Threads:"),
            rdma: None,
        }
    }
}

/// This process's RDMA resources, from `rdma -j res show qp|cq|mr`.
fn rdma(pid: u32) -> Option<Rdma> {
    let mine = |kind: &str| -> Option<Vec<serde_json::Value>> {
        let out = Command::new("rdma").args(["-j", "res", "show", kind]).output().ok()?;
        if !out.status.success() {
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        Some(v.as_array()?.iter().filter(|e| e["pid"].as_u64() == Some(pid as u64)).cloned().collect())
    };
    // No device, no tracker: `rdma` prints nothing (or fails) for every kind.
    let any = Command::new("rdma").args(["-j", "res", "show"]).output().ok()?;
    let all: serde_json::Value = serde_json::from_slice(&any.stdout).ok()?;
    if all.as_array().map_or(true, |a| a.is_empty()) {
        return None;
    }
    let qps = mine("qp")?;
    let cqs = mine("cq")?;
    let mrs = mine("mr")?;
    let sum = |v: &[serde_json::Value], k: &str| v.iter().filter_map(|e| e[k].as_u64()).sum::<u64>();
    Some(Rdma { qps: qps.len() as u64, cqes: sum(&cqs, "cqe"), mrs: mrs.len() as u64, mr_bytes: sum(&mrs, "mrlen") })
}

/// The soft limit on open files raised to the hard one (a thousand connections need more fds
/// than the common soft limit of 1024); returns the limit in effect.
pub fn raise_fd_limit() -> u64 {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit read and write one local struct rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 0;
        }
        if r.rlim_cur < r.rlim_max {
            let want = libc::rlimit { rlim_cur: r.rlim_max, rlim_max: r.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                r.rlim_cur = r.rlim_max;
            }
        }
    }
    r.rlim_cur
}

/// Resident KiB per mapping name in /proc/self/smaps (anonymous mappings as "[anon]"), for
/// `RIVET_PERF_SMAPS`: where a connection's RSS lives (heap, the provider's queue buffers, the
/// registered memory).
pub fn rss_by_mapping() -> std::collections::BTreeMap<String, u64> {
    let mut m = std::collections::BTreeMap::new();
    let text = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    let mut name = String::new();
    for l in text.lines() {
        let mut w = l.split_whitespace();
        let first = w.next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            // address perms offset dev inode [path]
            let path: Vec<&str> = w.skip(4).collect();
            name = if path.is_empty() { "[anon]".into() } else { path.join(" ") };
        } else if first == "Rss:" {
            let kib: u64 = w.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            *m.entry(name.clone()).or_insert(0) += kib;
        }
    }
    m
}
