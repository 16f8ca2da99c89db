//! NCCL's profiler (ncclNet v10+): when NCCL passes a profiler callback to `init`, each request
//! that carries a profiler handle (`phandle` of isend, `phandles[i]` of irecv) reports a network
//! event per queue pair it goes over, as net_ib does: a start when it is posted, with the queue
//! pair, its device (the member of a fused NIC), the opcode and the bytes, and a stop when `test`
//! reports the request done (or its comm closes first). The events use net_ib's descriptor
//! (`ncclProfilerNetIbDescr_v1_t`, plugin id NCCL_PROFILER_NET_TYPE_IB | 1), so NCCL's profiler
//! plugins read them as IB events. The TCP transport reports none.

use crate::abi::types::{ncclProfilerCallback_t, ncclResult_t};
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

pub fn set_callback(cb: ncclProfilerCallback_t) {
    if let Some(f) = cb {
        CALLBACK.store(f as usize, Ordering::Release);
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

/// Whether events are wanted at all (a callback was given).
pub fn enabled() -> bool {
    CALLBACK.load(Ordering::Relaxed) != 0
}

/// Start an event per queue pair of `evs` under NCCL's `phandle`; `wr_id` names the request.
/// The handles to stop them with are appended to `handles` (as usize).
pub fn start(phandle: *mut c_void, wr_id: u64, evs: &[NetEvent], handles: &mut Vec<usize>) {
    let Some(f) = callback() else { return };
    if phandle.is_null() {
        return;
    }
    for e in evs {
        let mut d = IbDescr {
            ty: PROFILE_QP,
            qp: QpDescr { device: e.device, wr_id, opcode: e.opcode, qp_num: e.qpn as c_int, length: e.length },
        };
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: NCCL's callback takes an out-pointer for the event handle (a live local), its
        // own phandle, the plugin id, and a descriptor it reads during the call (a live local).
        unsafe { f(&mut h, START, phandle, PLUGIN_ID_IB, &mut d as *mut IbDescr as *mut c_void) };
        handles.push(h as usize);
    }
}

/// Stop the events of `handles` (NCCL's profiler takes a NULL handle: an event it declined).
pub fn stop(handles: &mut Vec<usize>) {
    let Some(f) = callback() else {
        handles.clear();
        return;
    };
    for h in handles.drain(..) {
        let mut h = h as *mut c_void;
        // SAFETY: the handle NCCL's callback gave at start, passed back once, as its Stop expects.
        unsafe { f(&mut h, STOP, std::ptr::null_mut(), 0, std::ptr::null_mut()) };
    }
}
