//! What the version-independent core asks of a transport's connection. The TCP transport is the
//! one built so far; the verbs transport plugs in behind the same trait.

pub mod socket;

use crate::error::{Error, Result};

/// One buffer of a (possibly grouped) receive.
#[derive(Debug, Clone, Copy)]
pub struct RecvBuf {
    pub ptr: *mut u8,
    pub size: usize,
    pub tag: i32,
}

/// Most buffers in one grouped receive (the `maxRecvs` every device reports).
pub const MAX_RECVS: usize = 8;

/// A connected send or receive comm. Requests are slot numbers below `capacity()`; a slot is
/// handed out by `isend`/`irecv` and free again once `test` reported it done.
pub trait Conn: Send {
    /// Post a send; `Ok(None)` is back-pressure (no free slot), the caller retries later.
    fn isend(&mut self, _data: *const u8, _size: usize, _tag: i32) -> Result<Option<u32>> {
        Err(Error::internal("isend called on a receive comm"))
    }
    /// Post a receive of 1..=MAX_RECVS buffers; `Ok(None)` is back-pressure.
    fn irecv(&mut self, _bufs: &[RecvBuf]) -> Result<Option<u32>> {
        Err(Error::internal("irecv called on a send comm"))
    }
    /// Make progress and report whether `slot` is done; when it is, its sizes are written to
    /// `sizes` (one per buffer of the request) and their count returned.
    fn test(&mut self, slot: u32, sizes: &mut [usize; MAX_RECVS]) -> Result<Option<usize>>;
    /// Number of request slots.
    fn capacity(&self) -> usize;
}
