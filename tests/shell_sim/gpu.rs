//! The simulated GPU's copy stream (`Nic::Gpu` of the simulated NIC): the receive shell's eager
//! copies out of the ring into GPU memory. Copies run in the order issued, batch by batch (a
//! batch ends at a fence), each batch only when the stream gets to it: at random, at the
//! shell's polls of a fence, and a fence is reached only once its batch and every earlier one
//! ran. A copy reads its source when it runs, so a ring slot given back to the sender before
//! its copy ran, or a receive reported done before its bytes are there, is caught.

use super::nic::fab;
use nccl_net_rivet::error::Result;
use nccl_net_rivet::gpu::staging::{Copier, HostMem};

/// A handle: the stream's state is the fabric's (one per schedule).
pub(crate) struct SimGpu;

impl Copier for SimGpu {
    fn gpu(&self) -> Option<i32> {
        Some(0)
    }
    fn alloc(&mut self, len: usize) -> Result<HostMem> {
        Ok(HostMem::Plain(vec![0u8; len.max(1)]))
    }
    unsafe fn to_host(&mut self, dst: *mut u8, src: usize, len: usize) -> Result<()> {
        fab(|f| f.unfenced.push((dst as usize, src, len)));
        Ok(())
    }
    unsafe fn to_device(&mut self, dst: usize, src: *const u8, len: usize) -> Result<()> {
        fab(|f| f.unfenced.push((dst, src as usize, len)));
        Ok(())
    }
    fn fence(&mut self, id: usize) -> Result<()> {
        fab(|f| {
            let batch = std::mem::take(&mut f.unfenced);
            f.stream.push_back((id, batch));
        });
        Ok(())
    }
    fn reached(&mut self, id: usize) -> Result<bool> {
        Ok(fab(|f| {
            if f.gpu_lies {
                return true;
            }
            // The stream goes on by some batches (or none) since the last look.
            while f.rng.chance(40) && f.run_batch() {}
            !f.stream.iter().any(|b| b.0 == id)
        }))
    }
    fn idle(&mut self) -> bool {
        // Asked at and after a close: the stream goes on by a batch, or finishes what it was
        // given (its sources and destinations, the ring and the schedule's buffers, are still
        // there); a comm closed while it runs leaves its ring until it is done.
        fab(|f| {
            if !f.unfenced.is_empty() {
                let batch = std::mem::take(&mut f.unfenced);
                f.stream.push_back((usize::MAX, batch));
            }
            if f.rng.chance(50) {
                while f.run_batch() {}
            } else {
                f.run_batch();
            }
            f.gpu_busy += !f.stream.is_empty() as usize;
            f.stream.is_empty()
        })
    }
}
