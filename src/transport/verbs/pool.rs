//! Registered host memory that only this process's own work requests touch (a sender's sizes
//! staged for the peer's FIFO and its eager headers; a receiver's CTS entries staged and its
//! scratch word), carved out of slabs that the connections on the same device (or the same fused
//! members) share. A connection then registers only what its peer writes into, on its own so that
//! a stray remote write fails instead of landing in another connection's memory: two
//! registrations a pair of comms instead of four (each a system call that pins pages and takes
//! one of the NIC's memory regions; docs/benchmarks.md measured setup with it). The slabs have local
//! access only (`IBV_ACCESS_LOCAL_WRITE`, for the flush reads into the scratch word): no peer
//! can write into them. A slab grows with the number of connections (16 KiB, doubling up to 256
//! KiB) and is deregistered when its last piece is given back.

use super::dev::IbDevice;
use super::res::{Part, RegBuf};
use crate::error::Result;
use crate::sys::ib::IBV_ACCESS_LOCAL_WRITE;
use std::sync::Mutex;

/// Slabs are leased in units of this many bytes (the alignment of `res::pieces`).
const UNIT: usize = 64;
/// The first slab of a device set; each later one twice the last, up to [`MAX_SLAB`].
const FIRST_SLAB: usize = 16 << 10;
const MAX_SLAB: usize = 256 << 10;

struct Slab {
    id: u64,
    /// The devices it is registered on (their addresses, which live for the process), in the
    /// connection's member order.
    devs: Vec<usize>,
    reg: RegBuf,
    units: Units,
    leases: usize,
}

/// Which units of a slab are leased: one bit each.
struct Units {
    used: Vec<u64>,
    n: usize,
}

impl Units {
    fn new(n: usize) -> Units {
        Units { used: vec![0; n.div_ceil(64)], n }
    }

    /// The first run of `k` free units.
    fn find(&self, k: usize) -> Option<usize> {
        let mut run = 0;
        for u in 0..self.n {
            if self.used[u / 64] & 1 << (u % 64) != 0 {
                run = 0;
                continue;
            }
            run += 1;
            if run == k {
                return Some(u + 1 - k);
            }
        }
        None
    }

    fn mark(&mut self, at: usize, k: usize, on: bool) {
        for u in at..at + k {
            if on {
                self.used[u / 64] |= 1 << (u % 64);
            } else {
                self.used[u / 64] &= !(1 << (u % 64));
            }
        }
    }
}

struct Slabs {
    next_id: u64,
    all: Vec<Slab>,
}

static SLABS: Mutex<Slabs> = Mutex::new(Slabs { next_id: 1, all: Vec::new() });

fn slabs() -> std::sync::MutexGuard<'static, Slabs> {
    SLABS.lock().unwrap_or_else(|p| p.into_inner())
}

/// A connection's pieces of a slab: given back when dropped (after the connection's queue pairs,
/// which are declared before it, are destroyed).
pub struct Lease {
    slab: u64,
    at: usize,
    units: usize,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut s = slabs();
        let Some(i) = s.all.iter().position(|x| x.id == self.slab) else { return };
        let slab = &mut s.all[i];
        slab.units.mark(self.at, self.units, false);
        slab.leases -= 1;
        if slab.leases == 0 {
            // Deregistered and freed: nothing names its memory any more.
            s.all.swap_remove(i);
        }
    }
}

/// Registered memory a connection keeps: a registration of its own (what its peer writes into),
/// or its lease of a slab.
pub enum Held {
    Own(RegBuf),
    Leased(Lease),
}

/// Zeroed pieces of the given lengths, each 64-byte aligned, registered on every one of `devs`
/// with local access only, as [`RegBuf::carve`] makes them, from a slab shared with the other
/// connections on the same devices. The pieces name the slab's memory: keep the lease until they
/// are no longer used.
pub fn carve<const N: usize>(devs: &[&IbDevice], lens: [usize; N]) -> Result<(Lease, [Part; N])> {
    let (offs, end) = super::res::pieces(lens);
    let n = end.div_ceil(UNIT).max(1);
    let key: Vec<usize> = devs.iter().map(|d| *d as *const IbDevice as usize).collect();
    let mut s = slabs();
    let found = s.all.iter().enumerate().filter(|(_, x)| x.devs == key).find_map(|(i, x)| x.units.find(n).map(|at| (i, at)));
    let (i, at) = match found {
        Some(f) => f,
        None => {
            let have = s.all.iter().filter(|x| x.devs == key).count() as u32;
            let len = (FIRST_SLAB << have.min(8)).min(MAX_SLAB).max(n * UNIT).next_multiple_of(4096);
            let reg = RegBuf::new(devs, len, IBV_ACCESS_LOCAL_WRITE)?;
            let id = s.next_id;
            s.next_id += 1;
            s.all.push(Slab { id, devs: key, reg, units: Units::new(len / UNIT), leases: 0 });
            (s.all.len() - 1, 0)
        }
    };
    let slab = &mut s.all[i];
    slab.units.mark(at, n, true);
    slab.leases += 1;
    // SAFETY: units [at, at + n) are within the slab's `units.n * UNIT` bytes, which its HostBuf
    // holds, and no other lease holds them (they were free and are now marked).
    let base = unsafe { slab.reg.buf.ptr().add(at * UNIT) };
    // Zeroed, as a fresh registration is: an earlier lease may have written them.
    // SAFETY: as above, `n * UNIT` bytes from `base` are this lease's.
    unsafe { std::ptr::write_bytes(base, 0, n * UNIT) };
    let keys = slab.reg.keys();
    // SAFETY: each offset plus its length is within the lease's `n * UNIT` bytes, which stay
    // registered under these keys until the lease is dropped.
    let parts = std::array::from_fn(|k| unsafe { Part::from_raw(base.add(offs[k]), lens[k], keys) });
    Ok((Lease { slab: slab.id, at, units: n }, parts))
}

#[cfg(test)]
mod tests {
    use super::Units;

    #[test]
    fn runs_are_found_first_fit_and_given_back() {
        let mut u = Units::new(130);
        assert_eq!(u.find(104), Some(0));
        u.mark(0, 104, true);
        assert_eq!(u.find(27), None, "26 units are left");
        assert_eq!(u.find(26), Some(104));
        u.mark(104, 26, true);
        assert_eq!(u.find(1), None);
        // A hole in the middle, across a word's boundary, is reused; a run longer than it is not.
        u.mark(60, 10, false);
        assert_eq!(u.find(11), None);
        assert_eq!(u.find(10), Some(60));
        u.mark(60, 4, true);
        assert_eq!(u.find(6), Some(64));
        assert_eq!(u.find(7), None);
    }
}
