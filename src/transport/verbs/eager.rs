//! Eager payloads out of the ring: into host memory by a memcpy, finished at once; into GPU
//! memory (GPUDirect receive buffers) by an asynchronous CUDA copy on the GPU's own stream,
//! finished when the fence recorded after it is reached. NCCL's proxy thread never waits for a
//! GPU: the ring slot, and the receive, are released only once the copy is done
//! (`RecvEngine::copy_done`, called in the engine's order). Nor does a close: a comm closed
//! while copies still run leaves its copier and its ring (`leave`) until a later close or a new
//! comm finds them done (`reap`).

use super::nic::Nic;
use crate::error::{Error, Result};
use crate::gpu::staging::{Copier, FENCES};
use std::collections::VecDeque;
use std::sync::Mutex;

/// What closed receive comms left: each looks once (no wait) whether its copies are done, and
/// when they are, frees what it holds and answers true.
pub type Left = Box<dyn FnMut() -> bool + Send>;

static LEFT: Mutex<Vec<Left>> = Mutex::new(Vec::new());

/// Keep what a closed comm's copies still use until they are done.
pub fn leave(left: Left) {
    LEFT.lock().unwrap_or_else(|p| p.into_inner()).push(left);
}

/// Free what closed comms left whose copies are done now (another thread at it: the next call
/// does it). The count still kept.
pub fn reap() -> usize {
    let Ok(mut l) = LEFT.try_lock() else { return 0 };
    l.retain_mut(|done| !done());
    l.len()
}

/// The copies not yet reported to the engine, oldest first: `Some(fence)` a GPU copy, `None` a
/// host copy that finished but waits behind an earlier GPU copy (the engine releases in order).
#[derive(Default)]
pub struct Order(VecDeque<Option<usize>>);

impl Order {
    /// How many copies at the front are finished (`reached` says for a fence); they leave.
    pub fn retire(&mut self, mut reached: impl FnMut(usize) -> Result<bool>) -> Result<usize> {
        let mut n = 0;
        while let Some(&front) = self.0.front() {
            if let Some(f) = front {
                if !reached(f)? {
                    break;
                }
            }
            self.0.pop_front();
            n += 1;
        }
        Ok(n)
    }
    pub fn push(&mut self, fence: Option<usize>) {
        self.0.push_back(fence);
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

pub struct EagerCopies<N: Nic> {
    /// The copier of the GPU the comm's GPU buffers are on, made at the first GPU-bound copy.
    gpu: Option<N::Gpu>,
    order: Order,
}

impl<N: Nic> Default for EagerCopies<N> {
    fn default() -> Self {
        EagerCopies { gpu: None, order: Order::default() }
    }
}

impl<N: Nic> EagerCopies<N> {
    /// Copy `len` bytes from the payload of ring slot `slot` at `src` to `dst` (GPU memory when
    /// `gpu`). Returns whether the copy may be reported done now; otherwise `retire` reports it.
    ///
    /// # Safety
    /// `src` is `len` bytes of ring slot `slot` (< FENCES), left alone until the copy is
    /// reported done; `[dst, dst+len)` is memory of a posted receive, the comm's until then
    /// (GPU memory when `gpu`, host memory otherwise).
    pub unsafe fn copy(&mut self, slot: usize, dst: *mut u8, src: *const u8, len: usize, gpu: bool) -> Result<bool> {
        if !gpu {
            // SAFETY: the caller's promise: host memory at both ends, `len` bytes each.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
            if self.order.is_empty() {
                return Ok(true);
            }
            self.order.push(None);
            return Ok(false);
        }
        let ordinal = N::gpu_of(dst as usize)?;
        let c = match &mut self.gpu {
            Some(c) if c.gpu() == Some(ordinal) => c,
            Some(c) => {
                return Err(Error::usage(format!(
                    "an eager message for GPU memory of CUDA device {ordinal} on a comm whose GPU buffers are on CUDA device {}: one comm serves one GPU",
                    c.gpu().unwrap_or(-1)
                )))
            }
            None => self.gpu.insert(N::gpu_copier(ordinal)?),
        };
        let fence = slot % FENCES;
        // SAFETY: the caller's promise; `src` is registered host memory (the ring), readable by
        // the copy engine, and `dst` device memory of this copier's GPU (its ordinal checked).
        unsafe { c.to_device(dst as usize, src, len)? };
        c.fence(fence)?;
        self.order.push(Some(fence));
        Ok(false)
    }

    /// How many earlier copies have finished since the last call, in order: the caller reports
    /// each to the engine.
    pub fn retire(&mut self) -> Result<usize> {
        if self.order.is_empty() {
            return Ok(0);
        }
        let gpu = &mut self.gpu;
        self.order.retire(|f| gpu.as_mut().map_or(Ok(true), |c| c.reached(f)))
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// At close: the copier, if copies into GPU memory may still run (one look, no wait).
    pub fn running(&mut self) -> Option<N::Gpu> {
        if self.order.is_empty() {
            return None;
        }
        let mut c = self.gpu.take()?;
        (!c.idle()).then_some(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_reported_in_order_and_only_once_finished() {
        let mut o = Order::default();
        o.push(Some(3)); // a GPU copy
        o.push(None); // a host copy behind it
        o.push(Some(5));
        let mut done = [false; 8];
        assert_eq!(o.retire(|f| Ok(done[f])).unwrap(), 0, "nothing before the first GPU copy is done");
        done[5] = true;
        assert_eq!(o.retire(|f| Ok(done[f])).unwrap(), 0, "a later copy finishing first releases nothing");
        done[3] = true;
        assert_eq!(o.retire(|f| Ok(done[f])).unwrap(), 3);
        assert!(o.is_empty());
        assert_eq!(o.retire(|_| unreachable!()).unwrap(), 0);
    }

    #[test]
    fn a_failed_fence_query_is_an_error() {
        let mut o = Order::default();
        o.push(Some(0));
        assert!(o.retire(|_| Err(Error::system("cuEventQuery failed"))).is_err());
    }
}
