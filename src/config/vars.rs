//! The table of every variable rivet reads: name, default, meaning. `rivet config` prints it with
//! the values in effect; docs/configuration.md carries it whole and README.md the rows users set,
//! and tests keep both in step.

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
        name: "RIVET_TRANSPORT",
        default: "auto",
        meaning: "auto: RDMA verbs where a port is usable, else TCP, with a WARN when the host has GPUs or RDMA devices (a job that falls back runs many times slower). verbs: RDMA or nothing: `init` fails with the reason, so a job cannot train at TCP speed by mistake (with `NCCL_NET=rivet`, NCCL then stops instead of using a network of its own). tcp: TCP even where RDMA works, without the WARN.",
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
        meaning: "Queue pairs per connection (1-16; net_ib allows up to 128). With NCCL_IB_SPLIT_DATA_ON_QPS=0, the default, each message above the eager limit goes on one queue pair (one per member of a fused device), the next message on the next; with 1, every such message is split across all of them in 128-byte-aligned chunks. More spread a connection over ECMP paths (on Soft-RoCE, its work over CPUs: docs/benchmarks.md), at a queue pair and its queues' memory each. On a fused device, per member (of the larger side).",
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
        name: "RIVET_STAGING_POOL_MAX",
        default: "268435456",
        meaning: "Bytes (0-1099511627776) of unused host-staging bounce buffers a process keeps pooled for reuse, over all its comms: buffers returned above it are freed (their registration released) once their comm's copies are done, largest first, so a burst of large staged messages does not pin its peak for good. 0 keeps none.",
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

/// The variables users set, the rows of README.md's configuration table (docs/configuration.md has
/// every row of [`VARS`]).
pub const USER_SET: &[&str] = &[
    "NCCL_DEBUG",
    "NCCL_SOCKET_IFNAME",
    "RIVET_TIMEOUT",
    "RIVET_TRANSPORT",
    "NCCL_IB_DISABLE",
    "NCCL_IBVERBS_LIB",
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_ADDR_FAMILY",
    "NCCL_IB_ADDR_RANGE",
    "NCCL_IB_ROCE_VERSION_NUM",
    "NCCL_IB_TIMEOUT",
    "NCCL_IB_RETRY_CNT",
    "NCCL_IB_TC",
    "NCCL_IB_SL",
    "NCCL_IB_QPS_PER_CONNECTION",
    "NCCL_IB_SPLIT_DATA_ON_QPS",
    "NCCL_IB_ADAPTIVE_ROUTING",
    "NCCL_IB_MERGE_NICS",
    "NCCL_IB_RESILIENCY_PORT_FAILOVER",
    "NCCL_IB_RESILIENCY_PORT_RECOVERY",
    "RIVET_IB_EAGER_MAX",
    "RIVET_GDR",
    "RIVET_DMABUF",
    "NCCL_NET_GDR_LEVEL",
    "RIVET_STATS",
];
