//! libibverbs loaded with dlopen, as NCCL itself does: `RIVET_IBVERBS_LIB`, else `NCCL_IBVERBS_LIB`
//! (then `libibverbs.so.1` if that does not load), else `libibverbs.so.1`.
//! Linking it instead would make the plugin fail to load on a host without rdma-core, or on one
//! whose rdma-core lacks a symbol version the build machine had. Required symbols are resolved at
//! load (a missing one is a clear error naming it); newer ones are optional.

use super::ib::*;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::{offset_of, size_of};
use std::sync::OnceLock;

pub const DEFAULT_LIB: &str = "libibverbs.so.1";

// The fields rivet reads behind a glibc pthread_mutex_t, at the offsets rdma-core's verbs.h gives
// them on each target (bindgen's own assertions are x86_64's; ci/verbs-bindings-fixup.py).
#[cfg(target_arch = "x86_64")]
const _: () = assert!(offset_of!(ibv_context, abi_compat) == 320 && size_of::<ibv_context>() == 328);
#[cfg(target_arch = "aarch64")]
const _: () = assert!(offset_of!(ibv_context, abi_compat) == 328 && size_of::<ibv_context>() == 336);

/// The libibverbs functions rivet calls. The static-inline verbs are methods below.
pub struct Verbs {
    _lib: libloading::Library,
    /// What was dlopened (the name, or RIVET_IBVERBS_LIB).
    pub path: String,
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    pub free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    pub get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    pub open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub query_device: unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
    compat_query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut _compat_ibv_port_attr) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
    pub query_pkey: Option<unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut u16) -> c_int>,
    pub alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    pub dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    pub create_cq: unsafe extern "C" fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    pub get_async_event: unsafe extern "C" fn(*mut ibv_context, *mut ibv_async_event) -> c_int,
    pub ack_async_event: unsafe extern "C" fn(*mut ibv_async_event),
    // Optional (newer rdma-core).
    pub fork_init: Option<unsafe extern "C" fn() -> c_int>,
    /// IBVERBS_1.8: needed for relaxed-ordering registrations.
    pub reg_mr_iova2: Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_uint) -> *mut ibv_mr>,
    /// IBVERBS_1.12: dma-buf registrations (GPU memory, later).
    pub reg_dmabuf_mr: Option<unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr>,
    /// IBVERBS_1.10: enhanced connection establishment.
    pub query_ece: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_ece) -> c_int>,
    pub set_ece: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_ece) -> c_int>,
    /// IBVERBS_1.16 (rdma-core 62+): a port's effective bandwidth in units of 100 Mb/s.
    pub query_port_speed: Option<unsafe extern "C" fn(*mut ibv_context, u32, *mut u64) -> c_int>,
}

/// `struct ibv_port_attr` of rdma-core 49 and later: the bindings' (rdma-core 44's) followed by
/// `active_speed_ex`, which carries XDR and faster speeds.
#[repr(C)]
pub struct PortAttrEx {
    pub attr: ibv_port_attr,
    pub active_speed_ex: u32,
}
const _: () = assert!(size_of::<ibv_port_attr>() == 52 && size_of::<PortAttrEx>() == 56);

// SAFETY: the function pointers and the library handle are process-wide and immutable once
// loaded; libibverbs' functions may be called from any thread.
unsafe impl Send for Verbs {}
// SAFETY: as above: nothing in it is ever written after loading.
unsafe impl Sync for Verbs {}

/// Why libibverbs could not be used.
#[derive(Debug, Clone)]
pub struct LoadError(pub String);

impl Verbs {
    /// dlopen `path` and resolve every required symbol.
    pub fn load(path: &str) -> Result<Verbs, LoadError> {
        // SAFETY: dlopen runs the library's initialisers, and dlclose its finalisers. `path` is
        // libibverbs.so.1 or the operator's RIVET_IBVERBS_LIB; libibverbs does its setup lazily (in
        // ibv_get_device_list), so loading it makes no demands on the caller, and the Verbs that
        // get() loads sits in a static for the whole process (the plugin links -z nodelete), so the
        // library is never unloaded while verbs objects are in use.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| {
            LoadError(format!(
                "cannot load {path} ({e}); install rdma-core's libibverbs1 package (Debian/Ubuntu) or rdma-core (RHEL), or point RIVET_IBVERBS_LIB at it"
            ))
        })?;
        macro_rules! req {
            ($name:literal) => {
                // SAFETY: libloading::Library::get needs the requested type to match the symbol:
                // the type is that of the Verbs field this initialises, which is declared with
                // rdma-core's C prototype for that function (verbs.h). Copying the fn pointer out
                // of the Symbol drops its borrow of `lib`; that is sound because the Library is
                // moved into the same Verbs (`_lib`) and stays loaded as long as the pointers are
                // reachable through it.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|_| {
                    LoadError(format!(
                        "{path} has no symbol {}: this libibverbs is too old or not rdma-core's; install rdma-core >= 28",
                        $name
                    ))
                })?
            };
        }
        macro_rules! opt {
            ($name:literal) => {
                // SAFETY: as in req!: the type is the Verbs field's, declared with rdma-core's C
                // prototype for the symbol, and the Library is kept in the same Verbs, so the
                // copied fn pointer cannot outlive the loaded library through it.
                unsafe { lib.get(concat!($name, "\0").as_bytes()) }.ok().map(|s| *s)
            };
        }
        Ok(Verbs {
            path: path.to_string(),
            get_device_list: req!("ibv_get_device_list"),
            free_device_list: req!("ibv_free_device_list"),
            get_device_name: req!("ibv_get_device_name"),
            open_device: req!("ibv_open_device"),
            close_device: req!("ibv_close_device"),
            query_device: req!("ibv_query_device"),
            compat_query_port: req!("ibv_query_port"),
            query_gid: req!("ibv_query_gid"),
            query_pkey: opt!("ibv_query_pkey"),
            alloc_pd: req!("ibv_alloc_pd"),
            dealloc_pd: req!("ibv_dealloc_pd"),
            reg_mr: req!("ibv_reg_mr"),
            dereg_mr: req!("ibv_dereg_mr"),
            create_cq: req!("ibv_create_cq"),
            destroy_cq: req!("ibv_destroy_cq"),
            create_qp: req!("ibv_create_qp"),
            modify_qp: req!("ibv_modify_qp"),
            destroy_qp: req!("ibv_destroy_qp"),
            get_async_event: req!("ibv_get_async_event"),
            ack_async_event: req!("ibv_ack_async_event"),
            fork_init: opt!("ibv_fork_init"),
            reg_mr_iova2: opt!("ibv_reg_mr_iova2"),
            reg_dmabuf_mr: opt!("ibv_reg_dmabuf_mr"),
            query_ece: opt!("ibv_query_ece"),
            set_ece: opt!("ibv_set_ece"),
            query_port_speed: opt!("ibv_query_port_speed"),
            _lib: lib,
        })
    }

    /// `ibv_query_port` as the header's inline wrapper does it: the extended context's
    /// `query_port` (which fills the whole current `ibv_port_attr`) when the provider has one,
    /// else the exported compat symbol over a zeroed struct.
    ///
    /// # Safety
    /// `ctx` must be an open device context.
    pub unsafe fn query_port(&self, ctx: *mut ibv_context, port: u8, attr: &mut ibv_port_attr) -> c_int {
        const EXTENDED: usize = usize::MAX; // __VERBS_ABI_IS_EXTENDED
        if (*ctx).abi_compat as usize == EXTENDED {
            let v = (ctx as *mut u8).sub(offset_of!(verbs_context, context)) as *mut verbs_context;
            if (*v).sz >= size_of::<verbs_context>() - offset_of!(verbs_context, query_port) {
                if let Some(f) = (*v).query_port {
                    return f(ctx, port, attr, size_of::<ibv_port_attr>());
                }
            }
        }
        *attr = std::mem::zeroed();
        (self.compat_query_port)(ctx, port, attr as *mut ibv_port_attr as *mut _compat_ibv_port_attr)
    }

    /// The port's `active_speed_ex` (0 where libibverbs or the kernel does not report it): the
    /// extended context's `query_port` asked for rdma-core 49's larger struct, which a library
    /// whose struct is smaller zeroes and fills as far as it knows. Only the extended call can
    /// give it: the exported `ibv_query_port` copies the compat struct's 48 bytes.
    ///
    /// # Safety
    /// `ctx` must be an open device context.
    pub unsafe fn active_speed_ex(&self, ctx: *mut ibv_context, port: u8) -> u32 {
        const EXTENDED: usize = usize::MAX; // __VERBS_ABI_IS_EXTENDED
        if (*ctx).abi_compat as usize != EXTENDED {
            return 0;
        }
        let v = (ctx as *mut u8).sub(offset_of!(verbs_context, context)) as *mut verbs_context;
        if (*v).sz < size_of::<verbs_context>() - offset_of!(verbs_context, query_port) {
            return 0;
        }
        let Some(f) = (*v).query_port else { return 0 };
        let mut a: PortAttrEx = std::mem::zeroed();
        if f(ctx, port, &mut a.attr, size_of::<PortAttrEx>()) != 0 {
            return 0;
        }
        a.active_speed_ex
    }

    /// `ibv_query_port_speed` (units of 100 Mb/s), where libibverbs and the provider have it.
    ///
    /// # Safety
    /// `ctx` must be an open device context.
    pub unsafe fn port_speed(&self, ctx: *mut ibv_context, port: u8) -> Option<u64> {
        let f = self.query_port_speed?;
        let mut s = 0u64;
        (f(ctx, port as u32, &mut s) == 0).then_some(s)
    }
}

/// `ibv_post_send` (static inline in verbs.h): the provider's op from the context.
///
/// # Safety
/// `qp` must be a live QP and `wr` a valid chain.
#[inline]
pub unsafe fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad: *mut *mut ibv_send_wr) -> c_int {
    match (*(*qp).context).ops.post_send {
        Some(f) => f(qp, wr, bad),
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_post_recv` (static inline in verbs.h).
///
/// # Safety
/// As [`post_send`].
#[inline]
pub unsafe fn post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad: *mut *mut ibv_recv_wr) -> c_int {
    match (*(*qp).context).ops.post_recv {
        Some(f) => f(qp, wr, bad),
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_poll_cq` (static inline in verbs.h): the number of completions written to `wc`, or < 0.
///
/// # Safety
/// `cq` must be a live CQ; `wc` must hold `n` entries.
#[inline]
pub unsafe fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    match (*(*cq).context).ops.poll_cq {
        Some(f) => f(cq, n, wc),
        None => -libc::EOPNOTSUPP,
    }
}

/// `ibv_req_notify_cq` (static inline in verbs.h).
///
/// # Safety
/// `cq` must be a live CQ.
#[inline]
pub unsafe fn req_notify_cq(cq: *mut ibv_cq, solicited_only: bool) -> c_int {
    match (*(*cq).context).ops.req_notify_cq {
        Some(f) => f(cq, solicited_only as c_int),
        None => libc::EOPNOTSUPP,
    }
}

static VERBS: OnceLock<Result<Verbs, LoadError>> = OnceLock::new();

/// The process-wide libibverbs, loaded on first use (and kept: the plugin links `-z nodelete`,
/// and a verbs context must not outlive its library).
pub fn get() -> Result<&'static Verbs, LoadError> {
    VERBS
        .get_or_init(|| {
            let v = match (crate::config::env("RIVET_IBVERBS_LIB"), crate::config::env("NCCL_IBVERBS_LIB")) {
                (Some(p), _) => Verbs::load(&p)?,
                // As NCCL: the named library first, then the default.
                (None, Some(p)) => Verbs::load(&p).or_else(|e| {
                    log::info!(target: crate::log::INIT, "NET/rivet: NCCL_IBVERBS_LIB: {}; trying {DEFAULT_LIB}", e.0);
                    Verbs::load(DEFAULT_LIB)
                })?,
                (None, None) => Verbs::load(DEFAULT_LIB)?,
            };
            if let Some(f) = v.fork_init {
                // A no-op on kernels with native fork support; elsewhere it keeps registered
                // memory away from children (NCCL calls it too).
                // SAFETY: `f` is ibv_fork_init (int (void)), resolved from libibverbs.
                // ibv_fork_init(3) should precede other verbs calls: this runs inside get_or_init,
                // before get() hands the Verbs to anyone. If something else in the process already
                // used libibverbs, it only returns an error (ignored); it touches no caller memory.
                unsafe { f() };
            }
            Ok(v)
        })
        .as_ref()
        .map_err(|e| e.clone())
}

/// `ibv_wc_status_str`, without a call into the library.
pub fn wc_status_name(s: ibv_wc_status) -> &'static str {
    match s {
        IBV_WC_SUCCESS => "SUCCESS",
        IBV_WC_LOC_LEN_ERR => "LOC_LEN_ERR",
        IBV_WC_LOC_QP_OP_ERR => "LOC_QP_OP_ERR",
        IBV_WC_LOC_EEC_OP_ERR => "LOC_EEC_OP_ERR",
        IBV_WC_LOC_PROT_ERR => "LOC_PROT_ERR",
        IBV_WC_WR_FLUSH_ERR => "WR_FLUSH_ERR",
        IBV_WC_MW_BIND_ERR => "MW_BIND_ERR",
        IBV_WC_BAD_RESP_ERR => "BAD_RESP_ERR",
        IBV_WC_LOC_ACCESS_ERR => "LOC_ACCESS_ERR",
        IBV_WC_REM_INV_REQ_ERR => "REM_INV_REQ_ERR",
        IBV_WC_REM_ACCESS_ERR => "REM_ACCESS_ERR",
        IBV_WC_REM_OP_ERR => "REM_OP_ERR",
        IBV_WC_RETRY_EXC_ERR => "RETRY_EXC_ERR",
        IBV_WC_RNR_RETRY_EXC_ERR => "RNR_RETRY_EXC_ERR",
        IBV_WC_LOC_RDD_VIOL_ERR => "LOC_RDD_VIOL_ERR",
        IBV_WC_REM_INV_RD_REQ_ERR => "REM_INV_RD_REQ_ERR",
        IBV_WC_REM_ABORT_ERR => "REM_ABORT_ERR",
        IBV_WC_INV_EECN_ERR => "INV_EECN_ERR",
        IBV_WC_INV_EEC_STATE_ERR => "INV_EEC_STATE_ERR",
        IBV_WC_FATAL_ERR => "FATAL_ERR",
        IBV_WC_RESP_TIMEOUT_ERR => "RESP_TIMEOUT_ERR",
        IBV_WC_GENERAL_ERR => "GENERAL_ERR",
        IBV_WC_TM_ERR => "TM_ERR",
        IBV_WC_TM_RNDV_INCOMPLETE => "TM_RNDV_INCOMPLETE",
        _ => "UNKNOWN_STATUS",
    }
}

/// What a failed completion most likely means and how to fix it.
pub fn wc_status_hint(s: ibv_wc_status) -> &'static str {
    match s {
        IBV_WC_REM_ACCESS_ERR => "the remote buffer was registered without REMOTE_WRITE access or its rkey is stale (deregistered or from another device)",
        IBV_WC_RETRY_EXC_ERR => "the peer is unreachable or dead (check the link, the GID/routing and that the peer process is alive), or NCCL_IB_TIMEOUT is too small for this fabric",
        IBV_WC_RNR_RETRY_EXC_ERR => "the peer had no receive posted in time (receiver not ready): the peer is stalled or dead",
        IBV_WC_LOC_PROT_ERR => "a local buffer is not covered by its memory region (lkey or protection domain mismatch; with GPU memory, check PCIe ACS settings)",
        IBV_WC_LOC_LEN_ERR => "a message is longer than the buffer posted for it",
        IBV_WC_REM_INV_REQ_ERR => "the peer rejected the request (message too long for its buffer, or QP misconfigured)",
        IBV_WC_REM_OP_ERR => "the peer could not complete the operation (its queue pair went to the error state)",
        IBV_WC_WR_FLUSH_ERR => "the queue pair was already in the error state (an earlier failure on this connection)",
        IBV_WC_LOC_QP_OP_ERR => "a local work request could not be executed: malformed (too many SGEs, inline data too large), or the packet could not be transmitted (Soft-RoCE reports a link that went down this way)",
        IBV_WC_FATAL_ERR => "the device reported a fatal error: check dmesg and the NIC's health",
        _ => "see the device's vendor error code and dmesg",
    }
}

/// Name of an asynchronous event type.
pub fn event_name(e: ibv_event_type) -> &'static str {
    match e {
        IBV_EVENT_CQ_ERR => "CQ_ERR",
        IBV_EVENT_QP_FATAL => "QP_FATAL",
        IBV_EVENT_QP_REQ_ERR => "QP_REQ_ERR",
        IBV_EVENT_QP_ACCESS_ERR => "QP_ACCESS_ERR",
        IBV_EVENT_COMM_EST => "COMM_EST",
        IBV_EVENT_SQ_DRAINED => "SQ_DRAINED",
        IBV_EVENT_PATH_MIG => "PATH_MIG",
        IBV_EVENT_PATH_MIG_ERR => "PATH_MIG_ERR",
        IBV_EVENT_DEVICE_FATAL => "DEVICE_FATAL",
        IBV_EVENT_PORT_ACTIVE => "PORT_ACTIVE",
        IBV_EVENT_PORT_ERR => "PORT_ERR",
        IBV_EVENT_LID_CHANGE => "LID_CHANGE",
        IBV_EVENT_PKEY_CHANGE => "PKEY_CHANGE",
        IBV_EVENT_SM_CHANGE => "SM_CHANGE",
        IBV_EVENT_SRQ_ERR => "SRQ_ERR",
        IBV_EVENT_SRQ_LIMIT_REACHED => "SRQ_LIMIT_REACHED",
        IBV_EVENT_QP_LAST_WQE_REACHED => "QP_LAST_WQE_REACHED",
        IBV_EVENT_CLIENT_REREGISTER => "CLIENT_REREGISTER",
        IBV_EVENT_GID_CHANGE => "GID_CHANGE",
        IBV_EVENT_WQ_FATAL => "WQ_FATAL",
        _ => "UNKNOWN_EVENT",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_a_clear_error() {
        let e = Verbs::load("libibverbs-does-not-exist.so.9").err().unwrap();
        assert!(e.0.contains("libibverbs-does-not-exist.so.9") && e.0.contains("RIVET_IBVERBS_LIB"), "{}", e.0);
    }

    #[test]
    fn library_without_verbs_symbols_names_the_missing_one() {
        // libc loads fine but is not libibverbs.
        let e = Verbs::load("libc.so.6").err().unwrap();
        assert!(e.0.contains("ibv_get_device_list"), "{}", e.0);
    }

    #[test]
    fn status_names_cover_the_hinted_errors() {
        assert_eq!(wc_status_name(IBV_WC_REM_ACCESS_ERR), "REM_ACCESS_ERR");
        assert!(wc_status_hint(IBV_WC_REM_ACCESS_ERR).contains("REMOTE_WRITE"));
        assert!(wc_status_hint(IBV_WC_RETRY_EXC_ERR).contains("NCCL_IB_TIMEOUT"));
        assert!(wc_status_hint(IBV_WC_LOC_PROT_ERR).contains("lkey"));
    }
}
