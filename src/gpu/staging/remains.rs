//! What closed comms' staging could not free at close: copies still ran on the copier's stream
//! (a GPU that is slow or hung), so their bounce buffers, with their registrations and the
//! copier, stay until a later close or a new comm finds the stream idle. A close never waits for
//! a copy: each look is one query of the stream.

use super::copy::{Copier, Pool, Registrar};
use std::sync::Mutex;

struct Remains {
    copier: Box<dyn Copier>,
    registrar: Box<dyn Registrar>,
    pool: Pool,
}

// SAFETY: the raw pointers inside (each bounce buffer's address) point into memory the pool
// owns; the comm that used them is closed, so nothing else reads or writes through them, and
// they are only released (never dereferenced) here, under the list's lock.
unsafe impl Send for Remains {}

static REMAINS: Mutex<Vec<Remains>> = Mutex::new(Vec::new());

/// Keep a closed comm's copier and bounce buffers until its copies are done.
pub(super) fn leave(copier: Box<dyn Copier>, registrar: Box<dyn Registrar>, pool: Pool) {
    REMAINS.lock().unwrap_or_else(|p| p.into_inner()).push(Remains { copier, registrar, pool });
}

/// Free what closed comms left whose copies are done now (no wait; another thread at it: the
/// next call does it). The count still kept.
pub(super) fn reap() -> usize {
    let Ok(mut r) = REMAINS.try_lock() else { return 0 };
    r.retain_mut(|x| {
        if !x.copier.idle() {
            return true;
        }
        x.pool.clear(&*x.registrar, &mut *x.copier);
        false
    });
    r.len()
}

#[cfg(test)]
mod tests {
    use super::super::copy::{HostMem, NoRegistration};
    use super::*;
    use crate::error::Result;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A copier whose stream stays busy for `busy` looks, counting the buffers it frees.
    struct Slow {
        busy: usize,
        freed: &'static AtomicUsize,
    }

    impl Copier for Slow {
        fn gpu(&self) -> Option<i32> {
            None
        }
        fn alloc(&mut self, len: usize) -> Result<HostMem> {
            Ok(HostMem::Plain(vec![0; len]))
        }
        unsafe fn to_host(&mut self, _dst: *mut u8, _src: usize, _len: usize) -> Result<()> {
            Ok(())
        }
        unsafe fn to_device(&mut self, _dst: usize, _src: *const u8, _len: usize) -> Result<()> {
            Ok(())
        }
        fn fence(&mut self, _id: usize) -> Result<()> {
            Ok(())
        }
        fn reached(&mut self, _id: usize) -> Result<bool> {
            Ok(true)
        }
        fn idle(&mut self) -> bool {
            self.busy = self.busy.saturating_sub(1);
            self.busy == 0
        }
        fn free(&mut self, _mem: HostMem) {
            self.freed.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn bounce_buffers_of_copies_running_at_close_are_freed_once_they_finish() {
        static FREED: AtomicUsize = AtomicUsize::new(0);
        let mut c = Slow { busy: 3, freed: &FREED };
        let mut pool = Pool::default();
        for len in [4096, 1 << 20] {
            let b = pool.get(len, &mut c, &NoRegistration).unwrap();
            pool.put(b);
        }
        leave(Box::new(c), Box::new(NoRegistration), pool);
        // Busy for two more looks: kept, nothing freed.
        assert_eq!(reap(), 1);
        assert_eq!(reap(), 1);
        assert_eq!(FREED.load(Ordering::Relaxed), 0);
        // Idle: both buffers freed through the copier, and nothing is kept.
        assert_eq!(reap(), 0);
        assert_eq!(FREED.load(Ordering::Relaxed), 2);
    }
}
