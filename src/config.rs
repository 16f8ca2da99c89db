//! Every environment variable rivet reads, in one table (name, default, meaning), parsed once per
//! process. README.md carries the same table; a test keeps the two in step. An invalid value gets a
//! WARN naming the variable and what it accepts, and the default is used.

use std::sync::OnceLock;

pub struct Var {
    pub name: &'static str,
    pub default: &'static str,
    pub meaning: &'static str,
}

/// The table. `rivet config` prints it with the values in effect.
pub const VARS: &[Var] = &[
    Var {
        name: "NCCL_DEBUG",
        default: "WARN",
        meaning: "Log level: VERSION, WARN, INFO or TRACE. Inside NCCL, NCCL's own logger applies it too; outside NCCL (CLI, tests) lines go to stderr.",
    },
    Var {
        name: "NCCL_SOCKET_IFNAME",
        default: "all but lo, docker*",
        meaning: "Interfaces the TCP transport uses: comma-separated prefixes; `^` excludes the listed ones; `=` matches exact names. Without it, lo and docker* are used only when nothing else exists.",
    },
    Var {
        name: "NCCL_SOCKET_FAMILY",
        default: "any",
        meaning: "Address family of the TCP transport's interfaces: AF_INET or AF_INET6.",
    },
    Var {
        name: "RIVET_SOCKET_NSTREAMS",
        default: "2",
        meaning: "TCP streams per connection (1-16); messages of at least 2 x RIVET_SOCKET_MIN_CHUNK are split across them.",
    },
    Var {
        name: "RIVET_SOCKET_MIN_CHUNK",
        default: "131072",
        meaning: "Smallest piece (bytes, 4096-1073741824) of a message sent on one TCP stream.",
    },
    Var {
        name: "RIVET_SOCKET_THREADS",
        default: "auto",
        meaning: "1: TCP streams 2..n each get a helper thread that moves its parts of large messages, so their copies run on several cores (as NCCL_SOCKET_NTHREADS does for NCCL's socket transport); the threads are joined when the comm closes. 0: one thread serves every stream. auto: 1 on hosts with at least 4 CPUs.",
    },
    Var {
        name: "RIVET_TIMEOUT",
        default: "30",
        meaning: "Seconds (1-3600) before a connection setup or an unanswered handshake fails, and how long a peer host may stop answering (no ACK for data sent to it, keepalive unanswered on an idle connection) before it is reported unreachable, within about twice this. A peer that is alive but late to post its receives is waited for, however late.",
    },
    Var {
        name: "RIVET_SYSFS_ROOT",
        default: "/sys",
        meaning: "The sysfs tree `rivet topo`, `rivet doctor` and the topology probe read (GPUs, NICs, PCI bridges, NUMA nodes): a copy of another node's, or an example machine written by `rivet topo --example NAME --write DIR`.",
    },
    Var {
        name: "NCCL_IB_DISABLE",
        default: "0",
        meaning: "1: do not use RDMA devices even where they exist; rivet then runs over TCP.",
    },
    Var {
        name: "RIVET_IBVERBS_LIB",
        default: "libibverbs.so.1",
        meaning: "The libibverbs rivet dlopens (a name on the loader path or an absolute path); unset: NCCL_IBVERBS_LIB's.",
    },
    Var {
        name: "NCCL_IBVERBS_LIB",
        default: "unset",
        meaning: "As NCCL: the libibverbs to dlopen first; if it does not load, libibverbs.so.1 is tried (RIVET_IBVERBS_LIB, when set, is used instead, and alone).",
    },
    Var {
        name: "NCCL_IB_HCA",
        default: "all active ports",
        meaning: "RDMA ports to use: comma-separated `device[:port]` prefixes (`mlx5_0:1,mlx5_1`); `^` excludes the listed ones; `=` matches exact device names.",
    },
    Var {
        name: "NCCL_IB_DEVICE_PCI_ORDER",
        default: "1",
        meaning: "1: number the RDMA ports by PCI path (then device name and port), so every node of a cluster numbers its NICs alike; 0: in libibverbs' order (net_ib's meaning).",
    },
    Var {
        name: "NCCL_IB_MERGE_VFS",
        default: "1",
        meaning: "The PCI path NCCL's topology gets for an RDMA device is its sysfs path with the PCI function digit zeroed, so that the ports and PFs of one card are one PCI device (their ports numbered on from each other); 1 zeroes the device digits too, so that the card's VFs are as well; 0: a VF is its own device (net_ib's meaning).",
    },
    Var {
        name: "NCCL_IB_QUERY_PORT_SPEED",
        default: "1",
        meaning: "1: a port's speed is ibv_query_port_speed's (the effective bandwidth, a LAG's aggregate) where libibverbs has it (rdma-core 62+); else, and with 0, the lane rate (active_speed_ex for XDR and faster, rdma-core 49+, else active_speed) times the lanes (net_ib's meaning).",
    },
    Var {
        name: "NCCL_IB_GID_INDEX",
        default: "auto",
        meaning: "RoCE GID index. auto: the first GID of family NCCL_IB_ADDR_FAMILY within NCCL_IB_ADDR_RANGE, skipping empty and link-local entries, of RoCE version NCCL_IB_ROCE_VERSION_NUM where there is one.",
    },
    Var {
        name: "NCCL_IB_ROUTABLE_FLID_GID_INDEX",
        default: "1",
        meaning: "InfiniBand: the GID index used where that GID holds a FLID (the port is routable across subnets), else GID 0. A peer in another subnet (its GID's 16-bit subnet prefix differs) is reached with a global route header and its FLID as the destination LID (net_ib's meaning).",
    },
    Var {
        name: "NCCL_IB_SUBNET_AWARE_ROUTING",
        default: "0",
        meaning: "1 (RoCE): the listen handle carries up to 2 GIDs of the listening device's members, and a connect uses, instead of the device NCCL gave it, the first device whose RoCE members are all on those GIDs' subnets (NCCL's device when it is, or when none is), as net_ib's connect side does: for fabrics whose rails are separate subnets.",
    },
    Var {
        name: "NCCL_IB_SUBNET_PREFIX_LEN",
        default: "24",
        meaning: "IPv4 prefix length (1-32) subnet-aware routing compares RoCE GIDs under; IPv6 GIDs compare their 64-bit prefix (net_ib's meaning).",
    },
    Var {
        name: "NCCL_IB_ADDR_FAMILY",
        default: "AF_INET",
        meaning: "Address family of the automatically chosen RoCE GID: AF_INET (IPv4-mapped) or AF_INET6.",
    },
    Var {
        name: "NCCL_IB_ADDR_RANGE",
        default: "any",
        meaning: "CIDR range (e.g. 10.0.0.0/16 or fd00::/8) the automatically chosen RoCE GID must lie in.",
    },
    Var {
        name: "NCCL_IB_ROCE_VERSION_NUM",
        default: "2",
        meaning: "RoCE version (1 or 2) preferred by the automatic GID choice.",
    },
    Var {
        name: "NCCL_IB_TIMEOUT",
        default: "20",
        meaning: "Queue pair ACK timeout exponent (1-31): 4.096 us x 2^value per try.",
    },
    Var {
        name: "NCCL_IB_RETRY_CNT",
        default: "7",
        meaning: "Queue pair transport retries (0-7) before RETRY_EXC_ERR.",
    },
    Var {
        name: "NCCL_IB_TC",
        default: "unset",
        meaning: "Traffic class (0-255) of the queue pairs; unset: the communicator's trafficClass, else 0.",
    },
    Var {
        name: "NCCL_IB_FIFO_TC",
        default: "unset",
        meaning: "RoCE traffic class (0-255) of the receiver's queue pairs, which carry the clear-to-send entries and credits (control traffic); unset: the sender's (NCCL_IB_TC's).",
    },
    Var {
        name: "NCCL_IB_SL",
        default: "unset",
        meaning: "InfiniBand service level (0-15); unset: the communicator's trafficClass (its low 4 bits), else 0.",
    },
    Var {
        name: "NCCL_IB_PKEY",
        default: "0",
        meaning: "Partition key index (0-65535) of the queue pairs.",
    },
    Var {
        name: "NCCL_IB_ECE_ENABLE",
        default: "1",
        meaning: "1: enhanced connection establishment, as net_ib: the connecting side offers its queue pairs' ECE (ibv_query_ece), the accepting side sets it and answers with what its device supports, and both set that before the queue pairs connect; a device without ECE (Soft-RoCE) is logged once at INFO and goes on without it. 0 on the connecting side: no ECE.",
    },
    Var {
        name: "NCCL_IB_RETURN_ASYNC_EVENTS",
        default: "1",
        meaning: "1: a fatal asynchronous event of a device (DEVICE_FATAL, CQ_ERR) or of a comm's queue pair (QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR) fails the comms it concerns, with the event named in the error; 0: it is only logged as a WARN, and the comms go on until a work request fails (net_ib's meaning).",
    },
    Var {
        name: "NCCL_IB_WARN_RAIL_LOCAL",
        default: "0",
        meaning: "1: the accepting side logs at INFO when its device's members and the connecting side's (each host's device indices) are not the same rails, e.g. rxe0+rxe2 against rxe1+rxe3 (net_ib's meaning).",
    },
    Var {
        name: "NCCL_IB_MQP_RETRY_ALL",
        default: "0",
        meaning: "1: retry a failing ibv_modify_qp (a queue pair's state change during connection setup) whatever its error; 0: only when it fails with ETIMEDOUT, as large RoCE jobs see while the NIC's firmware is busy (net_ib's meaning).",
    },
    Var {
        name: "NCCL_IB_MQP_RETRY_CNT",
        default: "34",
        meaning: "Retries (0-1000) of a failing ibv_modify_qp before the connection fails (net_ib's meaning), with NCCL_IB_MQP_RETRY_SLEEP_MSEC's waits at connection setup. A failover's move of a failed queue pair to ERR is retried as often and as much later, but at NCCL's later calls, never sleeping inside one (the proxy thread serves its other connections meanwhile); not when recovery takes one back (`NCCL_IB_RESILIENCY_PORT_RECOVERY=1`): that happens inside NCCL's `test` calls, which must not sleep, so a failed take-back waits for recovery's next attempt instead.",
    },
    Var {
        name: "NCCL_IB_MQP_RETRY_SLEEP_MSEC",
        default: "100",
        meaning: "Milliseconds (0-60000) before the first retry of ibv_modify_qp; retry n waits n times this (net_ib's meaning: 34 retries wait about 60 s in all).",
    },
    Var {
        name: "NCCL_IB_QPS_PER_CONNECTION",
        default: "1",
        meaning: "Queue pairs per connection (1-16), NCCL's default; each message above the eager limit is split across them in 128-byte-aligned chunks. More spread a connection over ECMP paths (on Soft-RoCE, its work over CPUs: docs/benchmarks.md), at a queue pair and its queues' memory each. On a fused device, per member (of the larger side).",
    },
    Var {
        name: "NCCL_IB_SPLIT_DATA_ON_QPS",
        default: "0",
        meaning: "With several queue pairs per member (NCCL_IB_QPS_PER_CONNECTION above 1): 0, net_ib's default, sends each message above the eager limit on one queue pair per member of the larger side, moving to the next queue pairs with each message; 1 splits every such message over all the queue pairs (net_ib's meaning; set on the connecting side, the accepting side follows it).",
    },
    Var {
        name: "NCCL_IB_ADAPTIVE_ROUTING",
        default: "auto",
        meaning: "Adaptive routing (the fabric may place a queue pair's packets out of order): auto, as net_ib: on for InfiniBand ports, off for RoCE; 1 or 0 forces it. On (every member of the device must have it), a message above NCCL_IB_AR_THRESHOLD goes as plain RDMA writes followed by a separate zero-byte completion, and the receiver writes one credit word at a time.",
    },
    Var {
        name: "NCCL_IB_AR_THRESHOLD",
        default: "8192",
        meaning: "Bytes (0-1073741824) above which a message's data, under adaptive routing, never carries its own completion (NCCL's default).",
    },
    Var {
        name: "NCCL_IB_MERGE_NICS",
        default: "1",
        meaning: "1: NCCL may fuse RDMA ports into one virtual NIC (makeVDevice, ncclNet v9+; by default NCCL fuses the ports of one card, NCCL_NET_MERGE_LEVEL): a comm on it has queue pairs on every member and stripes each large message across them. 0: fusion is refused (every port stays its own device).",
    },
    Var {
        name: "NCCL_IB_RESILIENCY_PORT_FAILOVER",
        default: "1",
        meaning: "1: when a queue pair or a member port of a fused device fails (port down, a retry-exceeded or flushed completion), its traffic moves to the comm's live queue pairs: what was in flight on it is sent again once the receiver has said, over the out-of-band socket, what arrived; nothing is lost or sent twice, and NCCL sees no error. The failed member is not used again by that comm (as net_ib without NCCL_IB_RESILIENCY_PORT_RECOVERY); a comm whose last queue pair fails returns an error. 0: a failed queue pair fails its comm. (net_ib's default is 0: its failover costs it pre-posted receives and matching by id; rivet's costs nothing until a failure.)",
    },
    Var {
        name: "NCCL_IB_RESILIENCY_PORT_RECOVERY",
        default: "0",
        meaning: "1 (with failover on): a comm takes a failed queue pair back once its port is ACTIVE again, as net_ib's recovery does: NCCL_IB_RESILIENCY_PORT_RECOVERY_START_DELAY after the failure the receiver resets its side of it and asks the sender over the out-of-band socket, the sender resets its side if its own port is up, and traffic moves back to it (the eager messages and credit word stay where they are). 0 (net_ib's default): a failed member stays out of the comm.",
    },
    Var {
        name: "NCCL_IB_RESILIENCY_PORT_RECOVERY_START_DELAY",
        default: "200",
        meaning: "Milliseconds (0-3600000) after a queue pair fails before its comm tries to take it back (net_ib's meaning).",
    },
    Var {
        name: "NCCL_IB_RESILIENCY_PORT_RECOVERY_ATTEMPTS_MAX",
        default: "5",
        meaning: "Attempts (0-1000) to take a failed queue pair back, after which its comm gives up on it (net_ib's meaning).",
    },
    Var {
        name: "RIVET_IB_EAGER_MAX",
        default: "8192",
        meaning: "Largest message (bytes, 0-262144) the RDMA transport sends eagerly into the receiver's ring of registered buffers, without waiting for a clear-to-send; set on the receiving side (it sizes the ring: 8 slots).",
    },
    Var {
        name: "NCCL_IB_PCI_RELAXED_ORDERING",
        default: "2",
        meaning: "Relaxed-ordering memory registrations: 0 off, 1 on, 2 on where libibverbs has ibv_reg_mr_iova2.",
    },
    Var {
        name: "NCCL_GDR_FLUSH_DISABLE",
        default: "0",
        meaning: "1: iflush returns at once instead of issuing its 1-byte RDMA READ over the loopback queue pair.",
    },
    Var {
        name: "RIVET_SOCKET_CUDA",
        default: "0",
        meaning: "1: the TCP transport accepts GPU buffers (ptrSupport gains NCCL_PTR_CUDA) and moves them through the host staging engine. Off by default: NCCL's own host buffers are faster over TCP; this exists to exercise the engine on a GPU host without an RDMA NIC.",
    },
    Var {
        name: "RIVET_GDR",
        default: "auto",
        meaning: "GPUDirect RDMA on RDMA devices: auto (where the GPU-NIC path is within RIVET_GDR_LEVEL and peer memory or dma-buf works), off (rivet offers no NCCL_PTR_CUDA, so NCCL keeps its buffers in host memory), force (GDR whatever the path and checks say; a failed registration still falls back to staging).",
    },
    Var {
        name: "RIVET_DMABUF",
        default: "auto",
        meaning: "dma-buf registration of GPU memory: auto (offer NCCL_PTR_DMABUF where the NIC and the GPU support it) or off.",
    },
    Var {
        name: "RIVET_GDR_LEVEL",
        default: "auto",
        meaning: "Farthest GPU-NIC path class GDR is used over, as NCCL_NET_GDR_LEVEL names them: LOC, PIX, PXB, P2C, PXN, PHB (NODE counts as PHB), SYS, or NCCL's numbers 0-5. Farther pairs use host staging. auto: NCCL_NET_GDR_LEVEL when it is set (one setting for NCCL and rivet), else NCCL's default, P2C (PXB with NCCL_NET_GDR_C2C=0). Set to a value other than NCCL_NET_GDR_LEVEL's, it wins for rivet, and INFO says so.",
    },
    Var {
        name: "NCCL_NET_GDR_LEVEL",
        default: "unset",
        meaning: "NCCL's GDR distance (NCCL applies it to its own paths); rivet takes it as RIVET_GDR_LEVEL's default, with the same names and numbers.",
    },
    Var {
        name: "NCCL_NET_GDR_C2C",
        default: "1",
        meaning: "As NCCL: 1 makes the default GDR level P2C, so that a GPU joined to its CPU by NVLink-C2C (Grace Hopper; rivet asks NVML, as NCCL does) uses GDR with a NIC on that CPU's PCIe; 0: PXB.",
    },
    Var {
        name: "RIVET_STATS",
        default: "0",
        meaning: "1: every comm logs at INFO when it closes how many bytes and messages went by each path (GDR, staged, host), so a bypassed GDR path shows.",
    },
    Var {
        name: "RIVET_STAGE_HOST",
        default: "0",
        meaning: "Testing: 1 routes host buffers through the staging engine with a memcpy copier, so the engine runs over TCP and RDMA on machines without a GPU.",
    },
    Var {
        name: "RIVET_IB_MIN_QUEUES",
        default: "0",
        meaning: "Testing: 1 makes every verbs queue as shallow as the protocol allows (8 work requests per send queue, 16 posted receives), so that tests reach the paths that wait for room.",
    },
];

#[derive(Debug, Clone)]
pub struct Config {
    pub socket_ifname: Option<String>,
    pub socket_family: Option<i32>,
    pub socket_nstreams: usize,
    pub socket_min_chunk: usize,
    pub socket_threads: bool,
    pub timeout_secs: u64,
    pub ib_disable: bool,
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
pub fn nccl_debug() -> Option<String> {
    std::env::var("NCCL_DEBUG").ok()
}

/// The sysfs tree the topology probe reads: RIVET_SYSFS_ROOT, else `/sys`.
pub fn sysfs_root() -> std::path::PathBuf {
    env("RIVET_SYSFS_ROOT").map(std::path::PathBuf::from).unwrap_or_else(|| std::path::PathBuf::from("/sys"))
}

/// A variable's value, None when unset or empty. A value that is not valid UTF-8 is invalid like
/// any other: a WARN that names it, and the default (it is never silently taken as unset).
pub fn env(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(s) => Some(s).filter(|s| !s.trim().is_empty()),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(raw)) => {
            log::warn!(
                "NET/rivet: {name}={} is invalid: it is not valid UTF-8; using the default {}",
                raw.to_string_lossy(),
                match default_of(name) {
                    "" => "(unset)",
                    d => d,
                }
            );
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
                log::warn!(
                    "NET/rivet: {name}={s} is invalid: it accepts an integer from {min} to {max}; using the default {def}"
                );
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
            None => log::warn!("NET/rivet: {name}={s} is invalid: it accepts {accepts}; using the default {def}"),
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
            log::warn!("NET/rivet: NCCL_SOCKET_FAMILY={s} is invalid: it accepts AF_INET or AF_INET6; using any family");
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
            log::warn!("NET/rivet: {name}={s} is invalid: it accepts an integer from {min} to {max} or {unset_word}; using {unset_word}");
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
            log::warn!("NET/rivet: NCCL_IB_ADDR_FAMILY={s} is invalid: it accepts AF_INET or AF_INET6; using AF_INET");
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
        log::warn!("NET/rivet: NCCL_IB_ADDR_RANGE={s} is invalid: it accepts a CIDR range such as 10.0.0.0/16 or fd00::/8; using any address");
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
        let l = PathClass::parse_level(&s);
        if l.is_none() {
            log::warn!("NET/rivet: {name}={s} is invalid: it accepts {ACCEPTS}; ignoring it");
        }
        l
    };
    let (rivet, nccl) = (parse("RIVET_GDR_LEVEL"), parse("NCCL_NET_GDR_LEVEL"));
    if let (Some(r), Some(n)) = (rivet, nccl) {
        if r.nccl() != n.nccl() {
            log::info!("NET/rivet: RIVET_GDR_LEVEL={r} and NCCL_NET_GDR_LEVEL={n} disagree: rivet's GDR decision uses {r} (NCCL keeps {n} for its own paths)");
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
mod tests {
    use super::*;

    #[test]
    fn every_default_parses() {
        for v in VARS {
            assert!(!v.default.is_empty() && !v.meaning.is_empty(), "{}", v.name);
        }
        // Numeric defaults must satisfy their own ranges.
        let c = Config::from_env_with(&|_| None);
        assert_eq!(c.socket_nstreams, 2);
        assert_eq!(c.timeout_secs, 30);
    }

    #[test]
    fn invalid_values_fall_back_to_defaults() {
        let get = |n: &str| match n {
            "RIVET_SOCKET_NSTREAMS" => Some("99".to_string()),
            "RIVET_TIMEOUT" => Some("soon".to_string()),
            "NCCL_SOCKET_FAMILY" => Some("AF_UNIX".to_string()),
            _ => None,
        };
        let c = Config::from_env_with(&get);
        assert_eq!(c.socket_nstreams, 2);
        assert_eq!(c.timeout_secs, 30);
        assert_eq!(c.socket_family, None);
        let ok = |n: &str| match n {
            "RIVET_SOCKET_NSTREAMS" => Some("8".to_string()),
            "NCCL_SOCKET_FAMILY" => Some("af_inet6".to_string()),
            _ => None,
        };
        let c = Config::from_env_with(&ok);
        assert_eq!(c.socket_nstreams, 8);
        assert_eq!(c.socket_family, Some(libc::AF_INET6));
    }

    #[test]
    fn gdr_variables() {
        use crate::topo::PathClass;
        let c = Config::from_env_with(&|_| None);
        assert_eq!((c.gdr, c.dmabuf, c.gdr_level), (crate::gpu::gdr::Mode::Auto, true, PathClass::P2c));
        let get = |n: &str| {
            Some(match n {
                "RIVET_GDR" => "force",
                "RIVET_DMABUF" => "off",
                "RIVET_GDR_LEVEL" => "sys",
                _ => return None,
            }
            .to_string())
        };
        let c = Config::from_env_with(&get);
        assert_eq!((c.gdr, c.dmabuf, c.gdr_level), (crate::gpu::gdr::Mode::Force, false, PathClass::Sys));
        let bad = |n: &str| (n == "RIVET_GDR_LEVEL" || n == "RIVET_GDR").then(|| "far".to_string());
        let c = Config::from_env_with(&bad);
        assert_eq!((c.gdr, c.gdr_level), (crate::gpu::gdr::Mode::Auto, PathClass::P2c));
        // One setting: NCCL_NET_GDR_LEVEL is rivet's default; RIVET_GDR_LEVEL, set, wins;
        // NCCL_NET_GDR_C2C=0 makes the default PXB, as in NCCL.
        let level = |vars: &'static [(&'static str, &'static str)]| {
            Config::from_env_with(&|n: &str| vars.iter().find(|v| v.0 == n).map(|v| v.1.to_string())).gdr_level
        };
        assert_eq!(level(&[("NCCL_NET_GDR_LEVEL", "PHB")]), PathClass::Phb);
        assert_eq!(level(&[("NCCL_NET_GDR_LEVEL", "3")]), PathClass::Phb);
        assert_eq!(level(&[("NCCL_NET_GDR_LEVEL", "7")]), PathClass::Sys);
        assert_eq!(level(&[("NCCL_NET_GDR_LEVEL", "PIX"), ("RIVET_GDR_LEVEL", "SYS")]), PathClass::Sys);
        assert_eq!(level(&[("NCCL_NET_GDR_LEVEL", "PIX"), ("RIVET_GDR_LEVEL", "auto")]), PathClass::Pix);
        assert_eq!(level(&[("NCCL_NET_GDR_C2C", "0")]), PathClass::Pxb);
        assert_eq!(level(&[("NCCL_NET_GDR_C2C", "0"), ("NCCL_NET_GDR_LEVEL", "C2C")]), PathClass::C2c);
        assert_eq!(level(&[("NCCL_NET_GDR_LEVEL", "-1")]), PathClass::P2c, "invalid: ignored");
    }

    #[test]
    fn ib_variables() {
        let c = Config::from_env_with(&|_| None);
        assert_eq!((c.ib_timeout, c.ib_retry_cnt, c.ib_qps, c.ib_gid_index, c.ib_tc), (20, 7, 1, None, None));
        assert_eq!(c.ib_addr_family, libc::AF_INET);
        let get = |n: &str| {
            Some(match n {
                "NCCL_IB_GID_INDEX" => "3",
                "NCCL_IB_TC" => "106",
                "NCCL_IB_TIMEOUT" => "40",
                "NCCL_IB_ADDR_RANGE" => "10.1.0.0/16",
                "NCCL_IB_ADDR_FAMILY" => "AF_INET6",
                "NCCL_IB_SL" => "-1",
                _ => return None,
            }
            .to_string())
        };
        let c = Config::from_env_with(&get);
        assert_eq!((c.ib_gid_index, c.ib_tc, c.ib_timeout, c.ib_sl), (Some(3), Some(106), 20, None));
        assert_eq!(c.ib_addr_range, Some(("10.1.0.0".parse().unwrap(), 16)));
        assert_eq!(c.ib_addr_family, libc::AF_INET6);
        assert_eq!(parse_cidr("fd00::/8"), Some(("fd00::".parse().unwrap(), 8)));
        // Adaptive routing: auto by default, net_ib's -2 is auto, 0/1 force it.
        assert_eq!((Config::from_env_with(&|_| None).ib_adaptive_routing, Config::from_env_with(&|_| None).ib_ar_threshold), (None, 8192));
        let ar = |v: &'static str| move |n: &str| (n == "NCCL_IB_ADAPTIVE_ROUTING" || n == "NCCL_IB_AR_THRESHOLD").then(|| v.to_string());
        let c = Config::from_env_with(&ar("-2"));
        assert_eq!((c.ib_adaptive_routing, c.ib_ar_threshold), (None, 8192));
        let c = Config::from_env_with(&ar("1"));
        assert_eq!((c.ib_adaptive_routing, c.ib_ar_threshold), (Some(true), 1));
        let c = Config::from_env_with(&ar("0"));
        assert_eq!((c.ib_adaptive_routing, c.ib_ar_threshold), (Some(false), 0));
        assert_eq!(parse_cidr("10.0.0.0/33"), None);
        assert_eq!(parse_cidr("10.0.0.0"), None);
    }

    #[test]
    fn readme_documents_every_variable_with_its_default() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
        for v in VARS {
            let row = readme
                .lines()
                .find(|l| l.starts_with(&format!("| `{}`", v.name)))
                .unwrap_or_else(|| panic!("README.md has no table row for {}", v.name));
            assert!(row.contains(&format!("`{}`", v.default)), "README row for {} lacks default {}", v.name, v.default);
        }
    }
}
