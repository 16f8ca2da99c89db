use super::*;
use std::cell::RefCell;

thread_local! {
    /// The variables whose values `invalid` reported on this thread.
    pub(super) static REPORTED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// How a test drives a variable's parser.
enum Parsed {
    /// Values the parser must report as invalid (and then use its default).
    Invalid(&'static [&'static str]),
    /// Free-form: any value is taken, and what it selects fails, with its own message, where it is
    /// used; the reason says where.
    FreeForm(&'static str),
}

/// Every variable of VARS: the values it must refuse, or why it has none.
const CASES: &[(&str, Parsed)] = &[
    ("NCCL_DEBUG", Parsed::Invalid(&["LOUD", "4", "INFO,NET"])),
    ("NCCL_SOCKET_IFNAME", Parsed::FreeForm("an interface list; one that matches nothing fails init, naming the variable")),
    ("NCCL_SOCKET_FAMILY", Parsed::Invalid(&["AF_UNIX", "4"])),
    ("RIVET_SOCKET_NSTREAMS", Parsed::Invalid(&["0", "17", "two", "-1"])),
    ("RIVET_SOCKET_MIN_CHUNK", Parsed::Invalid(&["4095", "2147483648", "64K"])),
    ("RIVET_SOCKET_THREADS", Parsed::Invalid(&["2", "yes"])),
    ("RIVET_TIMEOUT", Parsed::Invalid(&["0", "3601", "soon", "-5"])),
    ("RIVET_SYSFS_ROOT", Parsed::Invalid(&["/nonexistent/sysfs"])),
    ("NCCL_IB_DISABLE", Parsed::Invalid(&["2", "yes"])),
    ("RIVET_TRANSPORT", Parsed::Invalid(&["rdmaa", "1"])),
    ("RIVET_IBVERBS_LIB", Parsed::FreeForm("a library name or path; one that does not load is the reason given for TCP (sys::verbs)")),
    ("NCCL_IBVERBS_LIB", Parsed::FreeForm("as RIVET_IBVERBS_LIB (sys::verbs)")),
    ("NCCL_IB_HCA", Parsed::FreeForm("a port selection; one that selects nothing is the reason given for TCP (verbs::dev)")),
    ("NCCL_IB_DEVICE_PCI_ORDER", Parsed::Invalid(&["2"])),
    ("NCCL_IB_MERGE_VFS", Parsed::Invalid(&["2"])),
    ("NCCL_IB_QUERY_PORT_SPEED", Parsed::Invalid(&["2"])),
    ("NCCL_IB_GID_INDEX", Parsed::Invalid(&["1024", "first", "-2"])),
    ("NCCL_IB_ROUTABLE_FLID_GID_INDEX", Parsed::Invalid(&["1024", "x"])),
    ("NCCL_IB_SUBNET_AWARE_ROUTING", Parsed::Invalid(&["2"])),
    ("NCCL_IB_SUBNET_PREFIX_LEN", Parsed::Invalid(&["0", "33"])),
    ("NCCL_IB_ADDR_FAMILY", Parsed::Invalid(&["AF_UNIX"])),
    ("NCCL_IB_ADDR_RANGE", Parsed::Invalid(&["10.0.0.0/33", "10.0.0.0", "net"])),
    ("NCCL_IB_ROCE_VERSION_NUM", Parsed::Invalid(&["0", "3"])),
    ("NCCL_IB_TIMEOUT", Parsed::Invalid(&["0", "32"])),
    ("NCCL_IB_RETRY_CNT", Parsed::Invalid(&["8"])),
    ("NCCL_IB_TC", Parsed::Invalid(&["256", "ef"])),
    ("NCCL_IB_FIFO_TC", Parsed::Invalid(&["256"])),
    ("NCCL_IB_SL", Parsed::Invalid(&["16"])),
    ("NCCL_IB_PKEY", Parsed::Invalid(&["65536"])),
    ("NCCL_IB_ECE_ENABLE", Parsed::Invalid(&["2"])),
    ("NCCL_IB_RETURN_ASYNC_EVENTS", Parsed::Invalid(&["2"])),
    ("NCCL_IB_WARN_RAIL_LOCAL", Parsed::Invalid(&["2"])),
    ("NCCL_IB_MQP_RETRY_ALL", Parsed::Invalid(&["2"])),
    ("NCCL_IB_MQP_RETRY_CNT", Parsed::Invalid(&["1001"])),
    ("NCCL_IB_MQP_RETRY_SLEEP_MSEC", Parsed::Invalid(&["60001"])),
    ("NCCL_IB_QPS_PER_CONNECTION", Parsed::Invalid(&["0", "17", "128"])),
    ("NCCL_IB_SPLIT_DATA_ON_QPS", Parsed::Invalid(&["2"])),
    ("NCCL_IB_ADAPTIVE_ROUTING", Parsed::Invalid(&["2", "on"])),
    ("NCCL_IB_AR_THRESHOLD", Parsed::Invalid(&["1073741825", "big"])),
    ("NCCL_IB_MERGE_NICS", Parsed::Invalid(&["2"])),
    ("NCCL_IB_RESILIENCY_PORT_FAILOVER", Parsed::Invalid(&["2"])),
    ("NCCL_IB_RESILIENCY_PORT_RECOVERY", Parsed::Invalid(&["2"])),
    ("NCCL_IB_RESILIENCY_PORT_RECOVERY_START_DELAY", Parsed::Invalid(&["3600001"])),
    ("NCCL_IB_RESILIENCY_PORT_RECOVERY_ATTEMPTS_MAX", Parsed::Invalid(&["1001"])),
    ("RIVET_IB_EAGER_MAX", Parsed::Invalid(&["262145", "8K"])),
    ("NCCL_IB_PCI_RELAXED_ORDERING", Parsed::Invalid(&["3"])),
    ("NCCL_GDR_FLUSH_DISABLE", Parsed::Invalid(&["2"])),
    ("RIVET_SOCKET_CUDA", Parsed::Invalid(&["2"])),
    ("RIVET_GDR", Parsed::Invalid(&["on", "2"])),
    ("RIVET_DMABUF", Parsed::Invalid(&["2", "yes"])),
    ("RIVET_GDR_LEVEL", Parsed::Invalid(&["9", "6", "FAR", "-1"])),
    ("NCCL_NET_GDR_LEVEL", Parsed::Invalid(&["FAR", "-1"])),
    ("NCCL_NET_GDR_C2C", Parsed::Invalid(&["2"])),
    ("RIVET_STAGING_POOL_MAX", Parsed::Invalid(&["256M", "1099511627777"])),
    ("RIVET_STATS", Parsed::Invalid(&["2", "on"])),
    ("RIVET_STAGE_HOST", Parsed::Invalid(&["2"])),
    ("RIVET_IB_MIN_QUEUES", Parsed::Invalid(&["2"])),
];

/// Every variable's out-of-range and malformed values get the invalid-value WARN (and the default),
/// through the parser the library uses for it; the table holds exactly the variables of VARS.
#[test]
fn every_invalid_value_is_warned() {
    for v in VARS {
        assert!(CASES.iter().any(|(n, _)| *n == v.name), "{} has no row in CASES: give its invalid values, or say why it has none", v.name);
    }
    for (name, parsed) in CASES {
        assert!(VARS.iter().any(|v| v.name == *name), "CASES names {name}, which VARS lacks");
        let values = match parsed {
            Parsed::Invalid(values) => *values,
            Parsed::FreeForm(why) => {
                assert!(!why.is_empty(), "{name}: say why it takes any value");
                continue;
            }
        };
        for value in values {
            REPORTED.with(|r| r.borrow_mut().clear());
            let get = |n: &str| (n == *name).then(|| value.to_string());
            let c = Config::from_env_with(&get);
            debug_level(&get);
            sysfs_root_with(&get);
            let reported = REPORTED.with(|r| r.borrow().clone());
            assert_eq!(reported, vec![name.to_string()], "{name}={value}: one invalid-value WARN for it, and none for others");
            // The default is used: the same configuration as with the variable unset.
            assert_eq!(format!("{c:?}"), format!("{:?}", Config::from_env_with(&|_| None)), "{name}={value} must leave the default");
        }
        // Unset: nothing reported.
        REPORTED.with(|r| r.borrow_mut().clear());
        Config::from_env_with(&|_| None);
        assert!(REPORTED.with(|r| r.borrow().is_empty()));
    }
}

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
fn the_variables_users_set_are_known_once() {
    for (i, n) in USER_SET.iter().enumerate() {
        assert!(VARS.iter().any(|v| v.name == *n), "USER_SET names {n}, which VARS lacks");
        assert!(!USER_SET[..i].contains(n), "{n} twice in USER_SET");
    }
    for (i, v) in VARS.iter().enumerate() {
        assert!(!VARS[..i].iter().any(|w| w.name == v.name), "{} twice in VARS", v.name);
    }
}
