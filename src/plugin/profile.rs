//! NCCL's profiler (ncclNet v10+), the core's half: when NCCL passes a profiler callback to
//! `init`, each request that carries a profiler handle (`phandle` of isend, `phandles[i]` of
//! irecv) reports a network event per queue pair it goes over, as net_ib does: a start when it is
//! posted, with the queue pair, its device (the member of a fused NIC), the opcode and the bytes,
//! and a stop when `test` reports the request done (or its comm closes first). The callback and
//! its descriptor are the ABI layer's (`abi::profile`), which installs itself here as a
//! [`Profiler`]. The TCP transport reports none.

use crate::transport::NetEvent;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// NCCL's profiler handle of one request: opaque to the core, passed back to the profiler as it
/// came. Made only from the `phandle` NCCL passed with the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Phandle(pub usize);

/// Where the events go (NCCL's callback, through the ABI layer).
pub trait Profiler: Sync {
    /// Start the event of one queue pair's work `e` of request `wr_id` under NCCL's handle `ph`;
    /// the handle to stop it with (0: declined).
    fn start(&self, ph: Phandle, wr_id: u64, e: &NetEvent) -> usize;
    /// Stop an event `start` gave.
    fn stop(&self, h: usize);
}

static HOOK: OnceLock<&'static dyn Profiler> = OnceLock::new();
static ON: AtomicBool = AtomicBool::new(false);

/// Send the events to `p` from now on (the first profiler installed stays: there is one NCCL).
pub fn install(p: &'static dyn Profiler) {
    let _ = HOOK.set(p);
    ON.store(true, Ordering::Release);
}

/// Whether events are wanted at all (a callback was given).
#[inline]
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

fn hook() -> Option<&'static dyn Profiler> {
    if enabled() {
        HOOK.get().copied()
    } else {
        None
    }
}

/// Start an event per queue pair of `evs` under NCCL's `ph` (none for a NULL one); `wr_id` names
/// the request. The handles to stop them with are appended to `handles`.
pub fn start(ph: Phandle, wr_id: u64, evs: &[NetEvent], handles: &mut Vec<usize>) {
    let Some(p) = hook() else { return };
    if ph.0 == 0 {
        return;
    }
    for e in evs {
        handles.push(p.start(ph, wr_id, e));
    }
}

/// Stop the events of `handles` (NCCL's profiler takes a NULL handle: an event it declined).
pub fn stop(handles: &mut Vec<usize>) {
    let Some(p) = hook() else {
        handles.clear();
        return;
    };
    for h in handles.drain(..) {
        p.stop(h);
    }
}
