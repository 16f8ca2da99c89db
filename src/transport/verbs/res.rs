//! Owners of verbs resources, dropped in the order verbs requires (a QP before its CQ, an MR before
//! its memory; everything before the device's PD, which lives as long as the process), and queue
//! pairs that walk RESET → INIT → RTR → RTS as types.

use super::dev::{IbDevice, IbPort};
use crate::error::{Error, Result};
use crate::sys::ib::*;
use crate::sys::verbs::{self, Verbs};
use std::alloc::Layout;
use std::ffi::c_int;

fn v() -> &'static Verbs {
    verbs::get().expect("verbs resources exist only once libibverbs is loaded")
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// A completion queue.
pub struct Cq {
    raw: *mut ibv_cq,
    pub size: usize,
}

impl Cq {
    pub fn new(dev: &IbDevice, size: usize) -> Result<Cq> {
        let size = size.min(dev.max_cqe.max(1) as usize);
        let raw = unsafe { (v().create_cq)(dev.ctx, size as c_int, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        if raw.is_null() {
            return Err(Error::system(format!("{}: ibv_create_cq({size}) failed: {}", dev.name, errno())));
        }
        Ok(Cq { raw, size })
    }

    pub fn raw(&self) -> *mut ibv_cq {
        self.raw
    }

    /// Poll up to `wc.len()` completions.
    #[inline]
    pub fn poll(&self, wc: &mut [ibv_wc]) -> Result<usize> {
        let n = unsafe { verbs::poll_cq(self.raw, wc.len() as c_int, wc.as_mut_ptr()) };
        if n < 0 {
            return Err(Error::system(format!("ibv_poll_cq failed ({n})")));
        }
        Ok(n as usize)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        let rc = unsafe { (v().destroy_cq)(self.raw) };
        if rc != 0 {
            log::warn!("NET/rivet: ibv_destroy_cq failed: {}", std::io::Error::from_raw_os_error(rc));
        }
    }
}

/// A queue pair in any state; destroys itself on drop.
pub struct Qp {
    raw: *mut ibv_qp,
    pub max_inline: u32,
}

impl Qp {
    pub fn raw(&self) -> *mut ibv_qp {
        self.raw
    }
    pub fn qpn(&self) -> u32 {
        unsafe { (*self.raw).qp_num }
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        let rc = unsafe { (v().destroy_qp)(self.raw) };
        if rc != 0 {
            log::warn!("NET/rivet: ibv_destroy_qp failed: {}", std::io::Error::from_raw_os_error(rc));
        }
    }
}

/// Queue sizes of a new QP.
#[derive(Debug, Clone, Copy)]
pub struct QpCaps {
    pub send_wr: u32,
    pub recv_wr: u32,
    pub send_sge: u32,
    pub inline: u32,
}

/// What the far end of a queue pair told us about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteQp {
    pub qpn: u32,
    pub lid: u16,
    pub gid: [u8; 16],
    pub mtu: u32,
    /// Use a global route (RoCE, or IB across subnets).
    pub global: bool,
}

/// Path settings both directions agree on.
#[derive(Debug, Clone, Copy)]
pub struct PathParams {
    pub mtu: u32,
    pub tc: u8,
    pub sl: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
}

/// A QP in INIT: created and bound to its port; it can take receive work requests.
pub struct QpInit(Qp);
/// Ready to receive.
pub struct QpRtr(Qp);
/// Ready to send: the only state the data path sees.
pub struct QpRts(Qp);

fn modify(qp: &Qp, attr: &mut ibv_qp_attr, mask: u32, what: &str, port: &IbPort) -> Result<()> {
    let rc = unsafe { (v().modify_qp)(qp.raw, attr, mask as c_int) };
    if rc != 0 {
        return Err(Error::system(format!(
            "{}:{}: moving QP {} to {what} failed: {}",
            port.dev.name,
            port.port,
            qp.qpn(),
            std::io::Error::from_raw_os_error(rc)
        )));
    }
    Ok(())
}

impl QpInit {
    /// Create an RC QP on `port` with both queues on `cq` and move it to INIT with `access`.
    pub fn new(port: &IbPort, cq: &Cq, caps: QpCaps, access: u32, pkey_index: u16) -> Result<QpInit> {
        let dev = &port.dev;
        let mut want = caps;
        let max_wr = dev.max_qp_wr.max(1) as u32;
        want.send_wr = want.send_wr.min(max_wr);
        want.recv_wr = want.recv_wr.min(max_wr);
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = cq.raw;
        attr.recv_cq = cq.raw;
        attr.qp_type = IBV_QPT_RC;
        attr.cap = ibv_qp_cap {
            max_send_wr: want.send_wr,
            max_recv_wr: want.recv_wr,
            max_send_sge: want.send_sge,
            max_recv_sge: 1,
            max_inline_data: want.inline,
        };
        let mut raw = unsafe { (v().create_qp)(dev.pd, &mut attr) };
        if raw.is_null() && want.inline > 0 {
            // Some providers have no inline support: retry without it.
            attr.cap.max_inline_data = 0;
            raw = unsafe { (v().create_qp)(dev.pd, &mut attr) };
        }
        if raw.is_null() {
            return Err(Error::system(format!(
                "{}:{}: ibv_create_qp (RC, {} send / {} recv WRs) failed: {}",
                dev.name,
                port.port,
                want.send_wr,
                want.recv_wr,
                errno()
            )));
        }
        let qp = Qp { raw, max_inline: attr.cap.max_inline_data };
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = IBV_QPS_INIT;
        a.pkey_index = pkey_index;
        a.port_num = port.port;
        a.qp_access_flags = access;
        modify(&qp, &mut a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT", port)?;
        Ok(QpInit(qp))
    }

    pub fn qp(&self) -> &Qp {
        &self.0
    }

    /// Connect to the remote QP: INIT → RTR.
    pub fn rtr(self, port: &IbPort, remote: &RemoteQp, p: &PathParams) -> Result<QpRtr> {
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = p.mtu;
        a.dest_qp_num = remote.qpn;
        a.rq_psn = 0;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        a.ah_attr.port_num = port.port;
        a.ah_attr.sl = p.sl;
        if remote.global {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = ibv_gid { raw: remote.gid };
            a.ah_attr.grh.sgid_index = port.gid_index as u8;
            a.ah_attr.grh.hop_limit = 255;
            a.ah_attr.grh.traffic_class = p.tc;
        } else {
            a.ah_attr.dlid = remote.lid;
        }
        let mask = IBV_QP_STATE
            | IBV_QP_AV
            | IBV_QP_PATH_MTU
            | IBV_QP_DEST_QPN
            | IBV_QP_RQ_PSN
            | IBV_QP_MAX_DEST_RD_ATOMIC
            | IBV_QP_MIN_RNR_TIMER;
        modify(&self.0, &mut a, mask, "RTR", port)?;
        Ok(QpRtr(self.0))
    }
}

impl QpRtr {
    /// RTR → RTS with the retry settings.
    pub fn rts(self, port: &IbPort, p: &PathParams) -> Result<QpRts> {
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = IBV_QPS_RTS;
        a.timeout = p.timeout;
        a.retry_cnt = p.retry_cnt;
        a.rnr_retry = p.rnr_retry;
        a.sq_psn = 0;
        a.max_rd_atomic = 1;
        let mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
        modify(&self.0, &mut a, mask, "RTS", port)?;
        Ok(QpRts(self.0))
    }
}

impl QpRts {
    pub fn qp(&self) -> &Qp {
        &self.0
    }
}

/// A registered memory region owned outside the cache (FIFOs, scratch).
pub struct Mr {
    raw: *mut ibv_mr,
}

impl Mr {
    pub fn lkey(&self) -> u32 {
        unsafe { (*self.raw).lkey }
    }
    pub fn rkey(&self) -> u32 {
        unsafe { (*self.raw).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        let rc = unsafe { (v().dereg_mr)(self.raw) };
        if rc != 0 {
            log::warn!("NET/rivet: ibv_dereg_mr failed: {}", std::io::Error::from_raw_os_error(rc));
        }
    }
}

/// Zeroed, page-aligned host memory.
pub struct HostBuf {
    ptr: *mut u8,
    layout: Layout,
}

impl HostBuf {
    pub fn new(len: usize) -> HostBuf {
        let layout = Layout::from_size_align(len.max(1).next_multiple_of(4096), 4096).expect("buffer layout");
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        HostBuf { ptr, layout }
    }
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.layout.size()
    }
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// Host memory with its registration; the MR is released before the memory.
pub struct RegBuf {
    pub mr: Mr,
    pub buf: HostBuf,
}

impl RegBuf {
    pub fn new(dev: &IbDevice, len: usize, access: u32) -> Result<RegBuf> {
        let buf = HostBuf::new(len);
        let raw = unsafe { (v().reg_mr)(dev.pd, buf.ptr() as *mut _, buf.len(), access as c_int) };
        if raw.is_null() {
            return Err(Error::system(format!(
                "{}: registering {} bytes of host memory failed: {}{}",
                dev.name,
                buf.len(),
                errno(),
                super::dev::memlock_hint()
            )));
        }
        Ok(RegBuf { mr: Mr { raw }, buf })
    }
    pub fn addr(&self) -> u64 {
        self.buf.ptr() as u64
    }
}

unsafe impl Send for Cq {}
unsafe impl Send for Qp {}
unsafe impl Send for QpRts {}
unsafe impl Send for Mr {}
unsafe impl Send for HostBuf {}
