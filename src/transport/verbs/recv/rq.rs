//! The receive queues: every write with an immediate the sender may make must find a posted
//! receive; they are posted at setup, topped up at idle moments, and counted before a clear-to-send
//! or a credit lets the sender write more.

use super::*;

/// Post `n` zero-length receives on `qp` (each consumes one completion with immediate data), in
/// chains of up to 32 work requests per call (the provider's lock and checks once per chain).
pub fn post_recvs(qp: &QpRts, n: u32) -> std::result::Result<(), i32> {
    post_recvs_on::<Verbs>(qp, n)
}

/// `post_recvs` through any NIC.
pub(super) fn post_recvs_on<N: Nic>(qp: &N::Qp, n: u32) -> std::result::Result<(), i32> {
    const CHAIN: usize = 32;
    let blank = ibv_recv_wr { wr_id: KIND_RECV << KIND_SHIFT, next: std::ptr::null_mut(), sg_list: std::ptr::null_mut(), num_sge: 0 };
    let mut wrs = [blank; CHAIN];
    let mut left = n as usize;
    while left > 0 {
        let k = left.min(CHAIN);
        for i in 0..k {
            let next = if i + 1 < k { &mut wrs[i + 1] as *mut ibv_recv_wr } else { std::ptr::null_mut() };
            wrs[i].next = next;
        }
        // SAFETY: `k` valid receive work requests without scatter lists, linked through `next`
        // (the last one's is NULL), on a live queue pair; the array outlives the call.
        let rc = unsafe { N::post_recv(qp, wrs.as_mut_ptr()) };
        if rc != 0 {
            return Err(rc);
        }
        left -= k;
    }
    Ok(())
}

impl<N: Nic> VerbsRecv<N> {
    /// Top up every queue pair whose posted receives are down to `at_most` (the check inline:
    /// every idle `test` makes it; the posting in `repost`).
    #[inline(always)]
    pub(super) fn top_up(&mut self, at_most: u32) -> Result<()> {
        for q in 0..self.qps.len() {
            if self.posted_recvs[q] <= at_most {
                self.repost(q)?;
            }
        }
        Ok(())
    }

    /// Top up QP `q`'s posted receives.
    #[inline(never)]
    pub(super) fn repost(&mut self, q: usize) -> Result<()> {
        if self.gone(q) {
            return Ok(());
        }
        let n = self.rq - self.posted_recvs[q];
        if let Err(rc) = post_recvs_on::<N>(&self.qps[q], n) {
            return Err(self.c.post_failed(N::qpn(&self.qps[q]), "ibv_post_recv", rc));
        }
        self.posted_recvs[q] = self.rq;
        Ok(())
    }

    /// Whether QP `q`'s posted receives cover every write with an immediate that may still
    /// arrive on it, and `more` writes more (topping them up first if they do not): one per
    /// ring slot, and one per buffer of each incomplete receive with a CTS out (at most all the
    /// receive queue holds: see below).
    pub(super) fn recvs_cover(&mut self, q: usize, more: usize) -> Result<bool> {
        // More than its queue holds: after a failover, where a queue pair carries several
        // logical ones' writes; and for writes owed already (`more` 0), which a queue pair that
        // carried several when they were admitted may have to take alone once recovery moved
        // the others back. Then it waits for all its receives, and an excess write is retried
        // by the sender's NIC, not lost (rnr_retry 7). A new receive (`more`) on a queue pair of
        // its own is admitted only if its writes fit.
        let carried = self.c.qs.carried(q).max(1);
        let need = RING_SLOTS + (self.eng.rdv_owed() + more) * carried;
        let need = if carried > 1 || more == 0 { need.min(self.rq as usize) } else { need };
        if (self.posted_recvs[q] as usize) < need && self.posted_recvs[q] < self.rq {
            self.repost(q)?;
        }
        Ok(self.posted_recvs[q] as usize >= need)
    }
}
