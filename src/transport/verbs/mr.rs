//! The per-device memory-registration cache: page-aligned ranges, reference-counted, a covering
//! entry with at least the requested access reused. This is what lets rivet report
//! `regIsGlobal = 1`: a buffer registered once is found again by every comm on the device.
//!
//! The cache is generic over the registrar so its bookkeeping is tested without a NIC.

use crate::error::{Error, Result};

#[derive(Debug)]
struct Entry<M> {
    addr: usize,
    end: usize,
    access: i32,
    refs: u32,
    mr: M,
}

/// One registration as the cache hands it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease<M> {
    pub mr: M,
    /// References held after this call.
    pub refs: u32,
    /// True when this call registered memory (a miss).
    pub fresh: bool,
}

#[derive(Debug)]
pub struct MrCache<M> {
    /// Sorted by `addr`.
    entries: Vec<Entry<M>>,
    page: usize,
}

impl<M: Copy + PartialEq + std::fmt::Debug> MrCache<M> {
    pub fn new(page: usize) -> Self {
        MrCache { entries: Vec::new(), page: page.max(1) }
    }

    /// The page-aligned range covering `[ptr, ptr + len)`.
    pub fn span(&self, ptr: usize, len: usize) -> (usize, usize) {
        let a = ptr & !(self.page - 1);
        let end = (ptr + len.max(1)).div_ceil(self.page) * self.page;
        (a, end)
    }

    /// Find an entry covering the range with at least `access`, or register one with `reg(addr,
    /// len, access)`.
    pub fn acquire(
        &mut self,
        ptr: usize,
        len: usize,
        access: i32,
        reg: impl FnOnce(usize, usize, i32) -> Result<M>,
    ) -> Result<Lease<M>> {
        let (a, end) = self.span(ptr, len);
        if let Some(e) = self.entries.iter_mut().find(|e| e.addr <= a && end <= e.end && e.access & access == access) {
            e.refs += 1;
            return Ok(Lease { mr: e.mr, refs: e.refs, fresh: false });
        }
        let mr = reg(a, end - a, access)?;
        let at = self.entries.partition_point(|e| e.addr < a);
        self.entries.insert(at, Entry { addr: a, end, access, refs: 1, mr });
        Ok(Lease { mr, refs: 1, fresh: true })
    }

    /// Drop one reference to `mr`; at zero, `dereg` releases it. Returns the references left.
    /// An unknown (or already released) registration is an error, never a double free.
    pub fn release(&mut self, mr: M, dereg: impl FnOnce(M) -> Result<()>) -> Result<u32> {
        let i = self
            .entries
            .iter()
            .position(|e| e.mr == mr)
            .ok_or_else(|| Error::internal(format!("deregMr of a registration the cache does not hold ({mr:?}): released twice?")))?;
        let e = &mut self.entries[i];
        e.refs -= 1;
        if e.refs > 0 {
            return Ok(e.refs);
        }
        let e = self.entries.remove(i);
        dereg(e.mr)?;
        Ok(0)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covering_entries_are_shared_and_counted() {
        let mut c = MrCache::<u32>::new(4096);
        let mut next = 0u32;
        let mut reg = |_: usize, _: usize, _: i32| -> Result<u32> {
            next += 1;
            Ok(next)
        };
        let a = c.acquire(0x10010, 100, 7, &mut reg).unwrap();
        assert_eq!(a, Lease { mr: 1, refs: 1, fresh: true });
        // Same page, narrower access: reused.
        let b = c.acquire(0x10800, 16, 1, &mut reg).unwrap();
        assert_eq!(b, Lease { mr: 1, refs: 2, fresh: false });
        // Wider access than the entry has: a new registration.
        let d = c.acquire(0x10000, 8, 15, &mut reg).unwrap();
        assert!(d.fresh && d.mr == 2);
        // Crossing the page end: not covered.
        let e = c.acquire(0x10ff0, 32, 1, &mut reg).unwrap();
        assert!(e.fresh && e.mr == 3);
        assert_eq!(c.len(), 3);
        let mut freed = vec![];
        let mut release = |c: &mut MrCache<u32>| {
            c.release(1, |m| {
                freed.push(m);
                Ok(())
            })
        };
        assert_eq!(release(&mut c).unwrap(), 1);
        assert_eq!(release(&mut c).unwrap(), 0);
        // Releasing again is an error, not a double free.
        let err = release(&mut c).unwrap_err();
        assert!(err.msg.contains("released twice"));
        assert_eq!(freed, vec![1]);
    }

    #[test]
    fn span_is_page_aligned() {
        let c = MrCache::<u8>::new(4096);
        assert_eq!(c.span(4097, 1), (4096, 8192));
        assert_eq!(c.span(4096, 4096), (4096, 8192));
        assert_eq!(c.span(4096, 0), (4096, 8192));
    }

    #[test]
    fn failed_registration_leaves_no_entry() {
        let mut c = MrCache::<u8>::new(4096);
        assert!(c.acquire(0, 10, 1, |_, _, _| Err(Error::system("no"))).is_err());
        assert!(c.is_empty());
    }
}
