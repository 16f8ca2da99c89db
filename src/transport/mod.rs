//! What the version-independent core asks of a transport's connection: the TCP transport and the
//! RDMA verbs transport sit behind the same trait.

pub mod socket;
pub mod verbs;

use crate::error::{Error, Result};

/// A memory registration as the data path sees it (from the handle `regMr` returned).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MrInfo {
    /// The registered range (page aligned for verbs, exact for TCP).
    pub addr: usize,
    pub len: usize,
    pub lkey: u32,
    pub rkey: u32,
    /// IBV_ACCESS_* flags the registration has (0 for TCP).
    pub access: u32,
    /// Identity of the RDMA device the keys belong to (0 for TCP).
    pub dev: usize,
    /// How the data path moves this memory.
    pub path: Path,
    /// The CUDA device owning the memory (staged and GDR buffers); None for host memory.
    pub gpu: Option<i32>,
}

/// How a registered buffer's bytes travel (see `staging`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Path {
    /// Host memory, sent and received by the transport directly.
    #[default]
    Host = 0,
    /// GPU memory copied through pinned host bounce buffers.
    Staged = 1,
    /// GPU memory the NIC reads and writes directly (GPUDirect RDMA).
    Gdr = 2,
}

impl MrInfo {
    pub fn covers(&self, ptr: usize, size: usize) -> bool {
        ptr >= self.addr && ptr.checked_add(size).is_some_and(|end| end <= self.addr + self.len)
    }
}

/// How the buffer behind a registration NCCL passed travels (Host where it passed none).
pub(crate) fn path_of(mr: Option<MrInfo>) -> Path {
    mr.map_or(Path::Host, |m| m.path)
}

/// The GPU owning the buffer behind a registration (None for host memory or no registration).
pub(crate) fn gpu_of(mr: Option<MrInfo>) -> Option<i32> {
    mr.and_then(|m| m.gpu)
}

/// One buffer of a (possibly grouped) receive.
#[derive(Debug, Clone, Copy)]
pub struct RecvBuf {
    pub ptr: *mut u8,
    pub size: usize,
    pub tag: i32,
    /// The buffer's registration (None when NCCL passed none), copied from its memory handle.
    pub mr: Option<MrInfo>,
}

impl RecvBuf {
    pub const EMPTY: RecvBuf = RecvBuf { ptr: std::ptr::null_mut(), size: 0, tag: 0, mr: None };
}

/// Most buffers in one grouped receive (the `maxRecvs` every device reports).
pub const MAX_RECVS: usize = crate::proto::verbs::MAX_GROUP;

/// A connected send or receive comm. Requests are slot numbers below `capacity()`; a slot is
/// handed out by `isend`/`irecv` and free again once `test` reported it done.
pub trait Conn: Send {
    /// Post a send; `Ok(None)` is back-pressure (no free slot), the caller retries later.
    fn isend(&mut self, _data: *const u8, _size: usize, _tag: i32, _mr: Option<MrInfo>) -> Result<Option<u32>> {
        Err(Error::internal("isend called on a receive comm"))
    }
    /// Post a send of which only the first `ready` bytes (< `size`) can be read yet, for the
    /// staging engine to overlap its device-to-host copy with the network: `set_ready` raises
    /// the mark as the copy proceeds. A transport that cannot send part of a message answers
    /// with back-pressure until all of it is ready.
    fn isend_partial(&mut self, data: *const u8, size: usize, tag: i32, mr: Option<MrInfo>, ready: usize) -> Result<Option<u32>> {
        if ready >= size {
            self.isend(data, size, tag, mr)
        } else {
            Ok(None)
        }
    }
    /// More of a partial send's bytes can be read: the first `ready` of them.
    fn set_ready(&mut self, _slot: u32, _ready: usize) -> Result<()> {
        Ok(())
    }
    /// Post a receive of 1..=MAX_RECVS buffers; `Ok(None)` is back-pressure.
    fn irecv(&mut self, _bufs: &[RecvBuf]) -> Result<Option<u32>> {
        Err(Error::internal("irecv called on a send comm"))
    }
    /// Make GPU-written receive data visible (the receive buffers of a completed `irecv`);
    /// `Ok(None)` means nothing to wait for.
    fn iflush(&mut self, _bufs: &[RecvBuf]) -> Result<Option<u32>> {
        Ok(None)
    }
    /// Make progress and report whether `slot` is done; when it is, its sizes are written to
    /// `sizes` (one per buffer of the request) and their count returned.
    fn test(&mut self, slot: u32, sizes: &mut [usize; MAX_RECVS]) -> Result<Option<usize>>;
    /// Number of request slots.
    fn capacity(&self) -> usize;
}
