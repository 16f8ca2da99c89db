//! NCCL's profiler callback (ncclNet v10+) and net_ib's event descriptor: the ABI half of the
//! profiler events, behind the core's [`crate::plugin::profile::Profiler`] hook. The events use
//! net_ib's descriptor (`ncclProfilerNetIbDescr_v1_t`, plugin id NCCL_PROFILER_NET_TYPE_IB | 1),
//! so NCCL's profiler plugins read them as IB events.

use super::types::{ncclProfilerCallback_t, ncclResult_t};
use crate::plugin::profile::{Phandle, Profiler};
use crate::transport::NetEvent;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// ncclProfilerNetEventStart / Stop.
const START: c_int = 0;
const STOP: c_int = 1;
/// NCCL_PROFILER_NET_TYPE_IB (1 << 16) | NCCL_PROFILER_NET_IB_VER (1).
pub const PLUGIN_ID_IB: i64 = (1 << 16) | 1;
/// ncclProfileQp: the descriptor describes one queue pair's work.
const PROFILE_QP: u8 = 1;

/// `ncclProfilerNetIbDescr_v1_t`: a type byte, then (8-aligned) the queue pair's event.
#[repr(C)]
pub struct IbDescr {
    pub ty: u8,
    pub qp: QpDescr,
}

#[repr(C)]
pub struct QpDescr {
    pub device: c_int,
    pub wr_id: u64,
    pub opcode: c_int,
    pub qp_num: c_int,
    pub length: usize,
}

const _: () = assert!(std::mem::size_of::<IbDescr>() == 40 && std::mem::offset_of!(IbDescr, qp) == 8);

/// The callback NCCL gave `init` (0: none).
static CALLBACK: AtomicUsize = AtomicUsize::new(0);

/// The profiler NCCL's callback is, for the core.
struct Nccl;
static NCCL: Nccl = Nccl;

/// Keep the callback NCCL passed to `init` (a NULL one leaves an earlier one in place) and hand
/// the core its hook.
pub fn set_callback(cb: ncclProfilerCallback_t) {
    if let Some(f) = cb {
        CALLBACK.store(f as usize, Ordering::Release);
        crate::plugin::profile::install(&NCCL);
    }
}

fn callback() -> ncclProfilerCallback_t {
    match CALLBACK.load(Ordering::Acquire) {
        0 => None,
        // SAFETY: a non-zero value was stored by set_callback from a valid function pointer of
        // exactly this type.
        f => Some(unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(*mut *mut c_void, c_int, *mut c_void, i64, *mut c_void) -> ncclResult_t>(f) }),
    }
}

impl Profiler for Nccl {
    fn start(&self, ph: Phandle, wr_id: u64, e: &NetEvent) -> usize {
        let Some(f) = callback() else { return 0 };
        let mut d = IbDescr { ty: PROFILE_QP, qp: QpDescr { device: e.device, wr_id, opcode: e.opcode, qp_num: e.qpn as c_int, length: e.length } };
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: NCCL's callback takes an out-pointer for the event handle (a live local), the
        // profiler handle NCCL itself passed with the request (`Phandle` is only ever made from
        // one), the plugin id, and a descriptor it reads during the call (a live local).
        unsafe { f(&mut h, START, ph.0 as *mut c_void, PLUGIN_ID_IB, &mut d as *mut IbDescr as *mut c_void) };
        h as usize
    }

    fn stop(&self, h: usize) {
        let Some(f) = callback() else { return };
        let mut h = h as *mut c_void;
        // SAFETY: the handle NCCL's callback gave at start, passed back once, as its Stop expects.
        unsafe { f(&mut h, STOP, std::ptr::null_mut(), 0, std::ptr::null_mut()) };
    }
}
