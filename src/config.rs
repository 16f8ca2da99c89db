//! Every environment variable rivet reads, in one table (name, default, meaning: `vars.rs`), parsed
//! once per process. docs/configuration.md carries the same table and README.md the rows users set;
//! tests keep them in step. An invalid value gets a WARN naming the variable and what it accepts,
//! and the default is used.

use std::sync::OnceLock;

mod vars;
pub use vars::{Var, USER_SET, VARS};

/// `RIVET_TRANSPORT`: which transport a host may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportChoice {
    /// RDMA where a port is usable, else TCP (with a WARN where the host has GPUs or RDMA devices).
    Auto,
    /// RDMA or nothing: no usable port fails `init`.
    Verbs,
    /// TCP even where RDMA works.
    Tcp,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub socket_ifname: Option<String>,
    pub socket_family: Option<i32>,
    pub socket_nstreams: usize,
    pub socket_min_chunk: usize,
    pub socket_threads: bool,
    pub timeout_secs: u64,
    pub ib_disable: bool,
    pub transport: TransportChoice,
    pub ib_hca: Option<String>,
    pub ib_device_pci_order: bool,
    pub ib_merge_vfs: bool,
    pub ib_query_port_speed: bool,
    pub ib_gid_index: Option<u32>,
    pub ib_routable_flid_gid_index: u32,
    pub ib_subnet_aware: bool,
    pub ib_subnet_prefix_len: u8,
    pub ib_addr_family: i32,
    pub ib_addr_range: Option<(std::net::IpAddr, u8)>,
    pub ib_roce_version: u32,
    pub ib_timeout: u8,
    pub ib_retry_cnt: u8,
    pub ib_tc: Option<u8>,
    pub ib_sl: Option<u8>,
    pub ib_fifo_tc: Option<u8>,
    pub ib_pkey: u16,
    pub ib_ece: bool,
    pub ib_return_async_events: bool,
    pub ib_warn_rail_local: bool,
    pub ib_mqp_retry: crate::transport::verbs::res::MqpRetry,
    pub ib_qps: usize,
    pub ib_split_data_on_qps: bool,
    pub ib_merge_nics: bool,
    pub ib_failover: bool,
    pub ib_recovery: bool,
    pub ib_recovery_delay_ms: u64,
    pub ib_recovery_attempts: u32,
    /// NCCL_IB_ADAPTIVE_ROUTING: None = auto (per link layer).
    pub ib_adaptive_routing: Option<bool>,
    pub ib_ar_threshold: usize,
    pub ib_relaxed_ordering: u32,
    pub ib_eager_max: usize,
    pub gdr_flush_disable: bool,
    pub socket_cuda: bool,
    pub stats: bool,
    pub staging_pool_max: usize,
    pub stage_host: bool,
    pub ib_min_queues: bool,
    pub gdr: crate::gpu::gdr::Mode,
    pub dmabuf: bool,
    pub gdr_level: crate::topo::PathClass,
}

fn default_of(name: &str) -> &'static str {
    VARS.iter().find(|v| v.name == name).map(|v| v.default).unwrap_or("")
}

type Getter<'a> = &'a dyn Fn(&str) -> Option<String>;

/// NCCL_DEBUG, read without a WARN for a bad value: the logger is set up from it, before a WARN
/// could be written (a non-UTF-8 or unknown value means WARN, as in NCCL).
/// NCCL_DEBUG as a level: VERSION, WARN and ABORT show warnings, INFO and TRACE more, NONE
/// nothing (NCCL's words, any case); anything else gets the invalid-value WARN and WARN.
pub fn debug_level(get: Getter) -> log::LevelFilter {
    use log::LevelFilter;
    let Some(s) = get("NCCL_DEBUG") else { return LevelFilter::Warn };
    match s.trim().to_ascii_uppercase().as_str() {
        "TRACE" => LevelFilter::Trace,
        "INFO" => LevelFilter::Info,
        "WARN" | "ABORT" | "VERSION" => LevelFilter::Warn,
        "NONE" => LevelFilter::Off,
        _ => {
            invalid("NCCL_DEBUG", &s, "VERSION, WARN, INFO, TRACE, ABORT or NONE", "WARN");
            LevelFilter::Warn
        }
    }
}

/// The sysfs tree the topology probe reads: RIVET_SYSFS_ROOT, else `/sys`.
pub fn sysfs_root() -> std::path::PathBuf {
    sysfs_root_with(&env)
}

fn sysfs_root_with(get: Getter) -> std::path::PathBuf {
    match get("RIVET_SYSFS_ROOT") {
        Some(s) if std::path::Path::new(&s).is_dir() => std::path::PathBuf::from(s),
        Some(s) => {
            invalid("RIVET_SYSFS_ROOT", &s, "a directory (a sysfs tree)", "/sys");
            std::path::PathBuf::from("/sys")
        }
        None => std::path::PathBuf::from("/sys"),
    }
}

/// The one WARN of an invalid value: `NAME=value is invalid: it accepts ...; using ...`. Every
/// variable's parser reports through it (and tests read what it reported).
fn invalid(name: &str, value: &str, accepts: &str, using: &str) {
    log::warn!("NET/rivet: {name}={value} is invalid: it accepts {accepts}; using {using}");
    #[cfg(test)]
    tests::REPORTED.with(|r| r.borrow_mut().push(name.to_string()));
}

/// A variable's value, None when unset or empty. A value that is not valid UTF-8 is invalid like
/// any other: a WARN that names it, and the default (it is never silently taken as unset).
pub fn env(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(s) => Some(s).filter(|s| !s.trim().is_empty()),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(raw)) => {
            let using = match default_of(name) {
                "" => "the default (unset)".to_string(),
                d => format!("the default {d}"),
            };
            invalid(name, &raw.to_string_lossy(), "valid UTF-8 only", &using);
            None
        }
    }
}

/// Parse an integer variable in `[min, max]`; WARN and use the default otherwise.
fn int_var(get: Getter, name: &str, min: u64, max: u64) -> u64 {
    let def: u64 = default_of(name).parse().expect("numeric default");
    match get(name) {
        None => def,
        Some(s) => match s.trim().parse::<u64>() {
            Ok(v) if (min..=max).contains(&v) => v,
            _ => {
                invalid(name, &s, &format!("an integer from {min} to {max}"), &format!("the default {def}"));
                def
            }
        },
    }
}

/// A word-valued variable parsed by `parse`; WARN and use the default otherwise.
fn word_var<T>(get: Getter, name: &str, accepts: &str, parse: impl Fn(&str) -> Option<T>) -> T {
    let def = default_of(name);
    if let Some(s) = get(name) {
        match parse(&s) {
            Some(v) => return v,
            None => invalid(name, &s, accepts, &format!("the default {def}")),
        }
    }
    parse(def).expect("the default parses")
}

fn family_var(get: Getter) -> Option<i32> {
    let s = get("NCCL_SOCKET_FAMILY")?;
    match s.trim().to_ascii_uppercase().as_str() {
        "AF_INET" => Some(libc::AF_INET),
        "AF_INET6" => Some(libc::AF_INET6),
        _ => {
            invalid("NCCL_SOCKET_FAMILY", &s, "AF_INET or AF_INET6", "any family");
            None
        }
    }
}

/// An integer in `[min, max]`, or None for `unset_word` / unset; WARN and None otherwise.
fn opt_int_var(get: Getter, name: &str, min: u64, max: u64, unset_word: &str) -> Option<u64> {
    let s = get(name)?;
    let t = s.trim();
    if t.eq_ignore_ascii_case(unset_word) || t == "-1" {
        return None;
    }
    match t.parse::<u64>() {
        Ok(v) if (min..=max).contains(&v) => Some(v),
        _ => {
            invalid(name, &s, &format!("an integer from {min} to {max} or {unset_word}"), unset_word);
            None
        }
    }
}

fn ib_family_var(get: Getter) -> i32 {
    let Some(s) = get("NCCL_IB_ADDR_FAMILY") else { return libc::AF_INET };
    match s.trim().to_ascii_uppercase().as_str() {
        "AF_INET" => libc::AF_INET,
        "AF_INET6" => libc::AF_INET6,
        _ => {
            invalid("NCCL_IB_ADDR_FAMILY", &s, "AF_INET or AF_INET6", "AF_INET");
            libc::AF_INET
        }
    }
}

/// `NCCL_IB_ADDR_RANGE` as (network address, prefix length).
pub fn parse_cidr(s: &str) -> Option<(std::net::IpAddr, u8)> {
    let (a, l) = s.trim().split_once('/')?;
    let ip: std::net::IpAddr = a.trim().parse().ok()?;
    let len: u8 = l.trim().parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (len <= max).then_some((ip, len))
}

fn range_var(get: Getter) -> Option<(std::net::IpAddr, u8)> {
    let s = get("NCCL_IB_ADDR_RANGE")?;
    let r = parse_cidr(&s);
    if r.is_none() {
        invalid("NCCL_IB_ADDR_RANGE", &s, "a CIDR range such as 10.0.0.0/16 or fd00::/8", "any address");
    }
    r
}

/// RIVET_GDR_LEVEL, defaulting to NCCL_NET_GDR_LEVEL, then to NCCL's default level (P2C, or PXB
/// with NCCL_NET_GDR_C2C=0).
fn gdr_level_var(get: Getter) -> crate::topo::PathClass {
    use crate::topo::PathClass;
    const ACCEPTS: &str = "LOC, NVL, NVB, C2C, PIX, PXB, P2C, PXN, PHB, NODE, SYS or 0-5";
    let parse = |name: &str| {
        let s = get(name)?;
        if s.trim().eq_ignore_ascii_case("auto") && name == "RIVET_GDR_LEVEL" {
            return None;
        }
        // NCCL takes any number for its own variable (above 4: SYS); rivet's documents 0-5.
        let number_too_large = name == "RIVET_GDR_LEVEL" && s.trim().parse::<u64>().is_ok_and(|n| n > 5);
        let l = PathClass::parse_level(&s).filter(|_| !number_too_large);
        if l.is_none() {
            invalid(name, &s, ACCEPTS, if name == "RIVET_GDR_LEVEL" { "auto" } else { "NCCL's default" });
        }
        l
    };
    let (rivet, nccl) = (parse("RIVET_GDR_LEVEL"), parse("NCCL_NET_GDR_LEVEL"));
    if let (Some(r), Some(n)) = (rivet, nccl) {
        if r.nccl() != n.nccl() {
            log::info!(target: crate::log::INIT, "NET/rivet: RIVET_GDR_LEVEL={r} and NCCL_NET_GDR_LEVEL={n} disagree: rivet's GDR decision uses {r} (NCCL keeps {n} for its own paths)");
        }
    }
    let c2c = int_var(get, "NCCL_NET_GDR_C2C", 0, 1) == 1;
    rivet.or(nccl).unwrap_or(if c2c { PathClass::P2c } else { PathClass::Pxb })
}

impl Config {
    pub fn from_env() -> Config {
        Self::from_env_with(&env)
    }

    /// Parse from any source of variables (the environment, or a map in tests).
    pub fn from_env_with(get: Getter) -> Config {
        Config {
            socket_ifname: get("NCCL_SOCKET_IFNAME"),
            socket_family: family_var(get),
            socket_nstreams: int_var(get, "RIVET_SOCKET_NSTREAMS", 1, 16) as usize,
            socket_min_chunk: int_var(get, "RIVET_SOCKET_MIN_CHUNK", 4096, 1 << 30) as usize,
            socket_threads: word_var(get, "RIVET_SOCKET_THREADS", "auto, 0 or 1", |s| match s.trim().to_ascii_lowercase().as_str() {
                "auto" => Some(std::thread::available_parallelism().is_ok_and(|n| n.get() >= 4)),
                "1" => Some(true),
                "0" => Some(false),
                _ => None,
            }),
            timeout_secs: int_var(get, "RIVET_TIMEOUT", 1, 3600),
            ib_disable: int_var(get, "NCCL_IB_DISABLE", 0, 1) == 1,
            transport: word_var(get, "RIVET_TRANSPORT", "auto, verbs or tcp", |s| match s.trim().to_ascii_lowercase().as_str() {
                "auto" => Some(TransportChoice::Auto),
                "verbs" | "ib" | "rdma" => Some(TransportChoice::Verbs),
                "tcp" | "socket" => Some(TransportChoice::Tcp),
                _ => None,
            }),
            ib_hca: get("NCCL_IB_HCA"),
            ib_device_pci_order: int_var(get, "NCCL_IB_DEVICE_PCI_ORDER", 0, 1) == 1,
            ib_merge_vfs: int_var(get, "NCCL_IB_MERGE_VFS", 0, 1) == 1,
            ib_query_port_speed: int_var(get, "NCCL_IB_QUERY_PORT_SPEED", 0, 1) == 1,
            ib_gid_index: opt_int_var(get, "NCCL_IB_GID_INDEX", 0, 1023, "auto").map(|v| v as u32),
            ib_routable_flid_gid_index: int_var(get, "NCCL_IB_ROUTABLE_FLID_GID_INDEX", 0, 1023) as u32,
            ib_subnet_aware: int_var(get, "NCCL_IB_SUBNET_AWARE_ROUTING", 0, 1) == 1,
            ib_subnet_prefix_len: int_var(get, "NCCL_IB_SUBNET_PREFIX_LEN", 1, 32) as u8,
            ib_addr_family: ib_family_var(get),
            ib_addr_range: range_var(get),
            ib_roce_version: int_var(get, "NCCL_IB_ROCE_VERSION_NUM", 1, 2) as u32,
            ib_timeout: int_var(get, "NCCL_IB_TIMEOUT", 1, 31) as u8,
            ib_retry_cnt: int_var(get, "NCCL_IB_RETRY_CNT", 0, 7) as u8,
            ib_tc: opt_int_var(get, "NCCL_IB_TC", 0, 255, "unset").map(|v| v as u8),
            ib_sl: opt_int_var(get, "NCCL_IB_SL", 0, 15, "unset").map(|v| v as u8),
            ib_fifo_tc: opt_int_var(get, "NCCL_IB_FIFO_TC", 0, 255, "unset").map(|v| v as u8),
            ib_pkey: int_var(get, "NCCL_IB_PKEY", 0, 65535) as u16,
            ib_ece: int_var(get, "NCCL_IB_ECE_ENABLE", 0, 1) == 1,
            ib_return_async_events: int_var(get, "NCCL_IB_RETURN_ASYNC_EVENTS", 0, 1) == 1,
            ib_warn_rail_local: int_var(get, "NCCL_IB_WARN_RAIL_LOCAL", 0, 1) == 1,
            ib_mqp_retry: crate::transport::verbs::res::MqpRetry {
                all: int_var(get, "NCCL_IB_MQP_RETRY_ALL", 0, 1) == 1,
                count: int_var(get, "NCCL_IB_MQP_RETRY_CNT", 0, 1000) as u32,
                sleep_ms: int_var(get, "NCCL_IB_MQP_RETRY_SLEEP_MSEC", 0, 60_000),
            },
            ib_qps: int_var(get, "NCCL_IB_QPS_PER_CONNECTION", 1, 16) as usize,
            ib_split_data_on_qps: int_var(get, "NCCL_IB_SPLIT_DATA_ON_QPS", 0, 1) == 1,
            ib_merge_nics: int_var(get, "NCCL_IB_MERGE_NICS", 0, 1) == 1,
            ib_failover: int_var(get, "NCCL_IB_RESILIENCY_PORT_FAILOVER", 0, 1) == 1,
            ib_recovery: int_var(get, "NCCL_IB_RESILIENCY_PORT_RECOVERY", 0, 1) == 1,
            ib_recovery_delay_ms: int_var(get, "NCCL_IB_RESILIENCY_PORT_RECOVERY_START_DELAY", 0, 3_600_000),
            ib_recovery_attempts: int_var(get, "NCCL_IB_RESILIENCY_PORT_RECOVERY_ATTEMPTS_MAX", 0, 1000) as u32,
            // net_ib's -2 means its default for both.
            ib_adaptive_routing: opt_int_var(&|n| get(n).filter(|v| v.trim() != "-2"), "NCCL_IB_ADAPTIVE_ROUTING", 0, 1, "auto").map(|v| v == 1),
            ib_ar_threshold: int_var(&|n| get(n).filter(|v| v.trim() != "-2"), "NCCL_IB_AR_THRESHOLD", 0, 1 << 30) as usize,
            ib_relaxed_ordering: int_var(get, "NCCL_IB_PCI_RELAXED_ORDERING", 0, 2) as u32,
            ib_eager_max: int_var(get, "RIVET_IB_EAGER_MAX", 0, 262144) as usize,
            gdr_flush_disable: int_var(get, "NCCL_GDR_FLUSH_DISABLE", 0, 1) == 1,
            socket_cuda: int_var(get, "RIVET_SOCKET_CUDA", 0, 1) == 1,
            stats: int_var(get, "RIVET_STATS", 0, 1) == 1,
            staging_pool_max: int_var(get, "RIVET_STAGING_POOL_MAX", 0, 1 << 40) as usize,
            stage_host: int_var(get, "RIVET_STAGE_HOST", 0, 1) == 1,
            ib_min_queues: int_var(get, "RIVET_IB_MIN_QUEUES", 0, 1) == 1,
            gdr: word_var(get, "RIVET_GDR", "auto, off or force", crate::gpu::gdr::Mode::parse),
            dmabuf: word_var(get, "RIVET_DMABUF", "auto or off", |s| match s.trim().to_ascii_lowercase().as_str() {
                "auto" | "1" => Some(true),
                "off" | "0" => Some(false),
                _ => None,
            }),
            gdr_level: gdr_level_var(get),
        }
    }

    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.timeout_secs)
    }
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// The process-wide configuration, read from the environment on first use.
pub fn get() -> &'static Config {
    CONFIG.get_or_init(Config::from_env)
}

#[cfg(test)]
mod tests;
