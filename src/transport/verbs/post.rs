//! What the shells post and with which keys: the book of each send queue (work requests posted
//! and known complete, which to signal), chains of work requests under one doorbell, and the
//! registration a buffer handed to the data path must have.

use super::conn::{KIND_CTRL, KIND_SHIFT, QP_SHIFT, SEQ_SHIFT};
use super::nic::Nic;
use crate::error::{Error, Result};
use crate::sys::ib::*;
use crate::transport::MrInfo;

/// Signal one in this many unsignaled writes per QP (they hold send-queue slots until a later
/// signaled one completes).
pub(super) const SIGNAL_EVERY: u32 = 32;

/// The book of a comm's send queues: work requests posted and not yet known complete, per queue
/// pair. Work requests complete in order, so a signaled completion retires every one posted
/// before it on its queue pair; unsignaled ones are retired only that way, and one in every
/// SIGNAL_EVERY is signaled so that none waits long. A post that finds no room is not made: the
/// caller reaps completions, and else tells NCCL "not yet" or defers it.
pub(super) struct SqBook {
    depth: u32,
    /// One in this many posts is signaled: SIGNAL_EVERY, or half the depth of a shallower queue.
    every: u32,
    posted: [u64; crate::proto::verbs::MAX_QPS],
    retired: [u64; crate::proto::verbs::MAX_QPS],
    unsignaled: [u32; crate::proto::verbs::MAX_QPS],
}

impl SqBook {
    pub(super) fn new(depth: u32) -> SqBook {
        const N: usize = crate::proto::verbs::MAX_QPS;
        // Room for a post is always there once the signaled work requests are reaped: at most
        // `every - 1` unsignaled ones wait for a later signaled one, plus the largest post (2).
        assert!(depth >= 4, "a send queue of {depth}");
        SqBook { depth, every: SIGNAL_EVERY.min(depth / 2), posted: [0; N], retired: [0; N], unsignaled: [0; N] }
    }

    /// The room a queue pair is sure to have once its signaled work requests are reaped (up to
    /// `every - 1` unsignaled ones wait for a later signaled one).
    pub(super) fn most_room(&self) -> u32 {
        self.depth - (self.every - 1)
    }

    /// Work requests queue pair `q` can take now.
    pub(super) fn room(&self, q: usize) -> u32 {
        self.depth - (self.posted[q] - self.retired[q]) as u32
    }

    /// The place of the last work request booked on `q` (the count of posts so far).
    pub(super) fn last_place(&self, q: usize) -> u64 {
        self.posted[q]
    }

    /// Whether the work request booked at `place` on `q` is known complete.
    pub(super) fn done(&self, q: usize, place: u64) -> bool {
        self.retired[q] >= place
    }

    /// Whether the next unsignaled post on `q` will be signaled (ending a run of them).
    pub(super) fn signals_next(&self, q: usize) -> bool {
        self.unsignaled[q] + 1 >= self.every
    }

    /// Book the first `k` of `wrs` for posting on `q` (the caller checked `room`): each signaled
    /// one gets its place in the queue in its id, and the last is signaled (with a control id,
    /// which no request waits for) if it would otherwise end a run of `every` unsignaled ones.
    pub(super) fn book(&mut self, q: usize, wrs: &mut [ibv_send_wr], k: usize) {
        debug_assert!(k as u32 <= self.room(q));
        for (i, w) in wrs.iter_mut().enumerate().take(k) {
            self.posted[q] += 1;
            if w.send_flags & IBV_SEND_SIGNALED == 0 {
                self.unsignaled[q] += 1;
                if i + 1 < k || self.unsignaled[q] < self.every {
                    continue;
                }
                w.send_flags |= IBV_SEND_SIGNALED;
                w.wr_id = KIND_CTRL << KIND_SHIFT;
            }
            self.unsignaled[q] = 0;
            w.wr_id = (w.wr_id & !(0x00ff_ffff_ffff_u64 << SEQ_SHIFT)) | (q as u64) << QP_SHIFT | (self.posted[q] as u32 as u64) << SEQ_SHIFT;
        }
    }

    /// Queue pair `q` was reset (taken back after a failover): its queue is empty.
    pub(super) fn reset(&mut self, q: usize) {
        self.posted[q] = 0;
        self.retired[q] = 0;
        self.unsignaled[q] = 0;
    }

    /// A successful signaled completion with this id: the work requests up to it are done.
    pub(super) fn retire(&mut self, wr_id: u64) {
        let q = ((wr_id >> QP_SHIFT) & 0xff) as usize;
        if q >= self.posted.len() {
            return;
        }
        let seq = (wr_id >> SEQ_SHIFT) as u32;
        let behind = (self.posted[q] as u32).wrapping_sub(seq) as u64;
        let upto = self.posted[q].saturating_sub(behind);
        if upto > self.retired[q] {
            self.retired[q] = upto;
        }
    }
}

/// The registration of a buffer the data path was handed, checked against the device, range and
/// access it needs (the checks inline; the error, which says what is wrong, out of line).
#[inline]
pub(super) fn mr_for<'a>(mr: Option<&'a MrInfo>, ptr: usize, size: usize, dev: usize, members: usize, need: u32, what: &str) -> Result<&'a MrInfo> {
    match mr {
        Some(m) if m.dev == dev && m.nmembers() >= members && m.covers(ptr, size) && m.access & need == need => Ok(m),
        _ => Err(mr_error(mr, ptr, size, dev, members, need, what)),
    }
}

#[cold]
#[inline(never)]
fn mr_error(mr: Option<&MrInfo>, ptr: usize, size: usize, dev: usize, members: usize, need: u32, what: &str) -> Error {
    let Some(m) = mr else {
        return Error::internal(format!("{what} of {size} bytes at {ptr:#x} without a memory handle"));
    };
    if m.dev != dev || m.nmembers() < members {
        return Error::internal(format!(
            "{what}: the memory handle was registered on another device (regMr must be called on a comm of the same device; a fused device's comm needs a registration on every member, {} here of {members})",
            m.nmembers()
        ));
    }
    if !m.covers(ptr, size) {
        return Error::internal(format!("{what}: [{ptr:#x}, +{size}) is not inside its registration [{:#x}, +{})", m.addr, m.len));
    }
    Error::internal(format!(
        "{what}: the buffer was registered without the access it needs ({:#x} lacks {need:#x}): register receive buffers through a receive comm",
        m.access
    ))
}

pub(super) fn post_chain<N: Nic>(qp: &N::Qp, wrs: &mut [ibv_send_wr], sges: &mut [ibv_sge], k: usize) -> std::result::Result<(), i32> {
    for i in 0..k {
        wrs[i].sg_list = if wrs[i].num_sge > 0 { &mut sges[i] } else { std::ptr::null_mut() };
        wrs[i].next = if i + 1 < k { &mut wrs[i + 1] } else { std::ptr::null_mut() };
    }
    // SAFETY: the first `k` work requests were just chained (each `next` and `sg_list` points
    // into `wrs`/`sges`, which outlive the call: ibv_post_send copies them), and their scatter
    // entries name registered memory.
    match unsafe { N::post_send(qp, wrs.as_mut_ptr()) } {
        0 => Ok(()),
        rc => Err(rc),
    }
}

pub(super) fn rdma_wr(op: u32, wr_id: u64, remote: u64, rkey: u32, nsge: i32) -> ibv_send_wr {
    // SAFETY: ibv_send_wr is plain C data; all-zero is valid (null pointers, no flags).
    let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
    w.wr_id = wr_id;
    w.opcode = op;
    w.num_sge = nsge;
    w.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: remote, rkey };
    w
}

#[cfg(test)]
mod tests {
    use super::super::conn::KIND_SEND;
    use super::*;

    fn is_signaled(w: &ibv_send_wr) -> bool {
        w.send_flags & IBV_SEND_SIGNALED != 0
    }

    fn wr(id: u64, signaled: bool) -> ibv_send_wr {
        let mut w = rdma_wr(IBV_WR_RDMA_WRITE, id, 0, 0, 0);
        if signaled {
            w.send_flags = IBV_SEND_SIGNALED;
        }
        w
    }

    #[test]
    fn the_book_counts_posts_and_a_signaled_completion_retires_everything_before_it() {
        let mut b = SqBook::new(63);
        let send = KIND_SEND << KIND_SHIFT;
        let mut w = [wr(send | 7, false), wr(send | 7, true)];
        b.book(1, &mut w, 2);
        assert!(is_signaled(&w[1]) && !is_signaled(&w[0]));
        assert_eq!(b.room(1), 61);
        assert_eq!(b.room(0), 63, "another queue pair's room is its own");
        // The signaled one keeps its kind and slot, and carries its queue pair and place.
        assert_eq!(w[1].wr_id >> KIND_SHIFT, KIND_SEND);
        assert_eq!(w[1].wr_id & 0xffff, 7);
        let first = w[1].wr_id;
        let mut more = [wr(send | 8, true)];
        b.book(1, &mut more, 1);
        assert_eq!(b.room(1), 60);
        b.retire(more[0].wr_id);
        assert_eq!(b.room(1), 63, "the later completion retires the earlier posts too");
        b.retire(first);
        assert_eq!(b.room(1), 63, "an older completion polled late retires nothing twice");
    }

    #[test]
    fn one_in_signal_every_unsignaled_posts_is_signaled_with_a_control_id() {
        let mut b = SqBook::new(255);
        let mut signaled = Vec::new();
        for i in 0..100u64 {
            let mut w = [wr((KIND_SEND << KIND_SHIFT) | i, false)];
            b.book(0, &mut w, 1);
            if is_signaled(&w[0]) {
                assert_eq!(w[0].wr_id >> KIND_SHIFT, KIND_CTRL, "no request waits for a signal the book added");
                signaled.push((i, w[0].wr_id));
            }
        }
        assert_eq!(signaled.iter().map(|s| s.0).collect::<Vec<_>>(), vec![31, 63, 95]);
        assert_eq!(b.room(0), 155);
        b.retire(signaled[2].1);
        assert_eq!(b.room(0), 251, "the 4 posted after the last signaled one wait for the next");
        assert_eq!(b.unsignaled[0], 4);
        // Within a chain, only the last can be the one signaled.
        let mut chain: Vec<ibv_send_wr> = (0..30).map(|_| wr(KIND_SEND << KIND_SHIFT, false)).collect();
        b.book(0, &mut chain, 30);
        assert!(is_signaled(&chain[29]));
        assert!(chain[..29].iter().all(|w| !is_signaled(w)));
    }

    #[test]
    fn places_compare_across_the_wrap_of_their_32_bits() {
        let mut b = SqBook::new(255);
        b.posted[0] = u32::MAX as u64 - 2;
        b.retired[0] = b.posted[0];
        let mut w: Vec<ibv_send_wr> = (0..6).map(|_| wr(KIND_CTRL << KIND_SHIFT, true)).collect();
        b.book(0, &mut w, 6);
        assert_eq!(b.room(0), 249);
        b.retire(w[4].wr_id); // the 5th: its place, 2^32 + 2, wrapped to 2
        assert_eq!(b.room(0), 254);
        assert_eq!(b.retired[0], (1u64 << 32) + 2);
    }
}
