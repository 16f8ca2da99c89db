//! The memory the shells allocate inside their calls, counted: a global allocator that counts
//! only inside a shell's call (`shell`) and not inside the simulated NIC (`nic_quiet`), so that
//! bounded memory is an invariant every schedule checks.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
pub(crate) struct Counting;

thread_local! {
    /// Inside a shell's call (and not inside the simulated NIC): allocations count.
    pub(crate) static COUNTING: Cell<bool> = const { Cell::new(false) };
    /// Bytes allocated minus bytes freed inside the shells' calls, and the most it reached.
    pub(crate) static NET: Cell<isize> = const { Cell::new(0) };
    pub(crate) static PEAK: Cell<isize> = const { Cell::new(0) };
}

pub(crate) fn count(d: isize) {
    // try_with: a thread's allocations after its thread-locals are gone count for nothing.
    let _ = COUNTING.try_with(|c| {
        if c.get() {
            let _ = NET.try_with(|n| {
                n.set(n.get() + d);
                let _ = PEAK.try_with(|p| p.set(p.get().max(n.get())));
            });
        }
    });
}

// SAFETY: every call goes to the system allocator unchanged; the counting beside it touches only
// const-initialised thread-locals (no allocation of their own).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count(l.size() as isize);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        count(-(l.size() as isize));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        count(new as isize - l.size() as isize);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
pub(crate) static ALLOC: Counting = Counting;

/// Run one of the shells' calls with its allocations counted (those of the simulated NIC it
/// calls are not: `fab` turns counting off).
pub(crate) fn shell<T>(f: impl FnOnce() -> T) -> T {
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    r
}

/// `fab` with the NIC's own allocations left out of the shells' count.
pub(crate) fn nic_quiet<T>(f: impl FnOnce() -> T) -> T {
    let was = COUNTING.with(|c| c.replace(false));
    let r = f();
    COUNTING.with(|c| c.set(was));
    r
}

/// The most the shells' calls may hold allocated at once, beyond what they held at the start.
pub(crate) const SHELL_HEAP_BOUND: isize = 1 << 20;
