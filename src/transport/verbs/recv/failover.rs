//! The receiver's failover and recovery: failed queue pairs drained, the sender told what
//! arrived, the writes made again, and queue pairs taken back; each step state a later call
//! takes up, never a wait inside one.

use super::*;

/// One write a receiver's failover makes again.
#[derive(Clone, Copy)]
pub(super) enum Rewrite {
    /// A CTS entry (`len` bytes of `bytes`: a fused receiver's keys, then the entry) into the
    /// sender's FIFO at `remote`, on queue pair `q`: inline, or from staging copy `stage` at
    /// `off` where the provider has no inline room for it.
    Entry { q: usize, stage: usize, off: usize, bytes: [u8; 64], len: usize, remote: u64 },
    /// The latest credit word.
    Credit,
}

impl<N: Nic> VerbsRecv<N> {
    /// `idle` of a comm with a failover due or queue pairs failed over (recovery).
    #[inline(never)]
    pub(super) fn idle_failover(&mut self) -> Result<()> {
        if self.c.failover_due() {
            self.fail_over()?;
        }
        if self.c.qs.dead() != 0 && self.c.qs.asked() == 0 && !self.c.failing() {
            let now = N::now_ms();
            if now.saturating_sub(self.recovery_checked) >= 50 {
                self.recovery_checked = now;
                // Only queue pairs whose sender side is in ERR (its Fail named them): a queue
                // pair failed over here alone may still be live there until the sender reads
                // the account, and one reset here would take its writes after the account
                // (while the sender has sent nothing on it, the sequence numbers match).
                let m = self.c.recoverable_now() & self.c.qs.peer_dead();
                if m != 0 {
                    self.ask_back(m)?;
                }
            }
        }
        Ok(())
    }

    /// Recovery, first half: reset our side of failed queue pairs `m` whose port is up again
    /// (RESET, INIT, RTR: it can receive, and its receives are posted) and ask the sender to
    /// take them back.
    pub(super) fn ask_back(&mut self, m: u32) -> Result<()> {
        let (nq, ln) = (self.qps.len(), self.c.ports.len());
        let mut ok = 0u32;
        for q in (0..nq).filter(|&q| m & (1 << q) != 0) {
            self.c.qs.asking(q, N::now_ms());
            let (port, l) = (self.c.ports[member_of(q, ln)], self.c.links[q]);
            if let Err(e) = N::reset_to_rtr(&self.qps[q], port, &l) {
                log::warn!("NET/rivet: {}: taking queue pair {q} back failed: {e}", self.c.where_(0));
                continue;
            }
            if let Err(rc) = post_recvs_on::<N>(&self.qps[q], self.rq) {
                return Err(self.c.post_failed_on(member_of(q, ln), N::qpn(&self.qps[q]), "ibv_post_recv", rc));
            }
            self.posted_recvs[q] = self.rq;
            self.book.reset(q);
            ok |= 1 << q;
        }
        if ok != 0 {
            // They can receive again, and may fail again, from now on (not yet sent on: the map
            // moves when the sender answers).
            self.c.taken_back(ok);
            self.c.qs.recv_asked(ok);
            self.c.notify(&Notice::Recover { qps: ok })?;
        }
        Ok(())
    }

    /// Recovery, second half: the sender's answers. Those it took back go to RTS here too and
    /// get their own traffic back (the credit word stays where it went: it must arrive in
    /// order on one queue pair); those it could not go back to ERR, to be tried again later.
    pub(super) fn took_back(&mut self, yes: u32, no: u32) -> Result<()> {
        // Only those still being taken back (one failed again meanwhile is failed over); those
        // it could not take back are failed over again, its side still in ERR.
        let (yes, no) = self.c.qs.recv_answered(yes, no, N::now_ms());
        let (nq, ln) = (self.qps.len(), self.c.ports.len());
        for q in (0..nq).filter(|&q| no & (1 << q) != 0) {
            // To RESET (the sender never sent on it again: nothing to drain; its receives are
            // discarded, not flushed into the CQ at every attempt), tried again later. The
            // sender's side stays in ERR: no need to wait for its word again.
            let _ = N::to_reset(&self.qps[q], self.c.ports[member_of(q, ln)]);
        }
        let mut ok = 0u32;
        for q in (0..nq).filter(|&q| yes & (1 << q) != 0) {
            let (port, l) = (self.c.ports[member_of(q, ln)], self.c.links[q]);
            match N::back_to_rts(&self.qps[q], port, &l) {
                Ok(()) => {
                    ok |= 1 << q;
                    self.c.qs.recovered(q); // a later failure gets its own attempts
                }
                Err(e) => {
                    // The sender sends on it already: it fails over again at its first error.
                    log::warn!("NET/rivet: {}: taking queue pair {q} back failed: {e}", self.c.where_(0));
                    self.c.mark_failed(1 << q, &e.to_string());
                }
            }
        }
        self.c.qs.recv_home();
        if ok != 0 {
            log::info!(
                target: crate::log::INIT,
                "NET/rivet: {}: took back queue pair(s) {ok:#x} (NCCL_IB_RESILIENCY_PORT_RECOVERY); logical queue pairs now on {:?}",
                self.c.where_(0),
                &self.c.qs.map()[..nq]
            );
        }
        Ok(())
    }

    /// Fail over (once per call chain: draining polls, and polls may find more).
    pub(super) fn fail_over(&mut self) -> Result<()> {
        super::super::conn::once(self, |s| &mut s.in_failover, Self::fail_over_now)
    }

    /// Queue pairs found failed here, or named by the sender, go to ERR and are drained: every
    /// write that reached them is polled, and nothing more arrives through them. Then the
    /// account of what arrived goes to the sender (which sends again what is missing), and the
    /// clear-to-send groups and the credit word, which may have been lost with them, are written
    /// again on the queue pairs that live. Resumable: a drain not over yet, or writes waiting
    /// for room, are taken up again at the next call (new receives wait meanwhile:
    /// `Common::failing`), so no call waits.
    pub(super) fn fail_over_now(&mut self) -> Result<()> {
        self.c.resolve()?;
        // What failed so far, then each of the sender's notices in the order it sent them (a
        // Fail and a Recovered mean different things the other way round).
        loop {
            // Moves to ERR the device refused before, due again now.
            let due = self.c.qs.moves_due(N::now_ms());
            for q in (0..self.qps.len()).filter(|&q| due & (1 << q) != 0) {
                self.stop_and_mark(q)?;
            }
            if let Some(wait) = &mut self.draining {
                if !self.c.drain_done(wait)? {
                    break;
                }
                let new = wait.mask();
                self.draining = None;
                self.drained(new)?;
                continue;
            }
            if !self.rewrites.is_empty() {
                self.post_rewrites()?;
                if !self.rewrites.is_empty() {
                    break;
                }
            }
            let new = (self.c.qs.failed() | self.c.qs.peer_dead()) & !self.c.qs.dead();
            if new != 0 {
                self.drain(new)?;
                continue;
            }
            match self.c.notices.pop_front() {
                None => break,
                Some(Notice::Fail { dead }) => self.c.qs.peer_named(dead),
                Some(Notice::Recovered { qps }) => self.took_back(qps, 0)?,
                Some(Notice::NotRecovered { qps }) => self.took_back(0, qps)?,
                Some(_) => {} // a sender's notice: not for a receiver
            }
        }
        self.c.set_failing(self.draining.is_some() || !self.rewrites.is_empty());
        Ok(())
    }

    /// Move queue pairs `new` (found failed here or named by the sender) to ERR and post their
    /// drain markers: once each one's has completed (a later call sees it), `drained` follows.
    pub(super) fn drain(&mut self, new: u32) -> Result<()> {
        for q in (0..self.qps.len()).filter(|&q| new & (1 << q) != 0) {
            self.stop_and_mark(q)?;
        }
        self.draining = Some(Drain::new(new, N::now_ms()));
        Ok(())
    }

    /// Move queue pair `q` to ERR and post its drain marker, or leave the move for a later call
    /// (`Common::move_to_err`: the device refused it for now).
    fn stop_and_mark(&mut self, q: usize) -> Result<()> {
        if !self.c.move_to_err(q, &self.qps[q])? {
            return Ok(());
        }
        let mut wr = ibv_recv_wr { wr_id: (KIND_DRAIN << KIND_SHIFT) | q as u64, next: std::ptr::null_mut(), sg_list: std::ptr::null_mut(), num_sge: 0 };
        // SAFETY: a valid receive work request without a scatter list, on a live queue pair (in
        // ERR: it completes flushed, after every receive posted before it).
        let rc = unsafe { N::post_recv(&self.qps[q], &mut wr) };
        if rc != 0 {
            let m = member_of(q, self.c.ports.len());
            return Err(self.c.post_failed_on(m, N::qpn(&self.qps[q]), "posting the drain marker", rc));
        }
        Ok(())
    }

    /// Queue pairs `new` are drained: the sender gets the account, and the clear-to-send
    /// entries of the incomplete receives and the credit word are queued to be written again.
    pub(super) fn drained(&mut self, new: u32) -> Result<()> {
        let (nq, ln) = (self.qps.len(), self.c.ports.len());
        // Not onto one being taken back (in RTR, it cannot send until the sender has answered).
        if !self.c.qs.recv_drained(new, N::now_ms()) {
            return Err(self.c.die(Error::remote(format!("{}: every queue pair failed", self.c.where_(0)))));
        }
        let account = self.eng.resync(self.c.qs.dead());
        let (nrecvs, ring) = (account.recvs.len(), account.ring_arrived);
        self.c.notify(&Notice::Resync(account))?;
        if self.credit_at.is_some_and(|(q, _)| self.gone(q)) {
            self.credit_at = None;
        }
        for r in self.cts_reading.iter_mut() {
            if r.is_some_and(|(q, _)| self.c.qs.down() & (1 << q) != 0) {
                *r = None;
            }
        }
        // Each entry alone (a group may land entry by entry: the sender checks each entry's
        // stamp); an earlier failover's rewrites not made yet are in these.
        self.rewrites.clear();
        let stride = cts_stride(ln);
        for (req, p) in self.eng.cts_outstanding() {
            let q = self.c.qs.carrier(p.q);
            for (i, e) in p.entries[..p.n].iter().enumerate() {
                let mut b = [0u8; 64];
                if ln > 1 {
                    b[..32].copy_from_slice(&self.keys[req as usize][i].0.map(u32::to_le_bytes).concat());
                }
                // SAFETY: Cts is 32 bytes of plain integers (repr(C)); `b` has room for it at the
                // stride's end.
                unsafe { (b.as_mut_ptr().add(stride - 32) as *mut Cts).write_unaligned(*e) };
                let remote = self.rem_fifo_addr + ((p.slot * MAX_GROUP + i) * stride) as u64;
                let stage = p.slot % CTS_STAGES;
                self.rewrites.push_back(Rewrite::Entry { q, stage, off: (stage * MAX_GROUP + i) * stride, bytes: b, len: stride, remote });
            }
        }
        self.rewrites.push_back(Rewrite::Credit);
        self.rewrite_by = N::now_ms() + DRAIN_WAIT.as_millis() as u64;
        log::info!(
            target: crate::log::INIT,
            "NET/rivet: {}: failed over queue pair(s) {new:#x}: told the sender what arrived ({ring} eager slots, {nrecvs} receive(s) in flight); its clear-to-send entries and the credit are written again; logical queue pairs now on {:?}",
            self.c.where_(0),
            &self.c.qs.map()[..nq]
        );
        self.post_rewrites()
    }

    /// Make the failover's writes, in order, as far as the send queues have room (the rest at a
    /// later call, within DRAIN_WAIT).
    pub(super) fn post_rewrites(&mut self) -> Result<()> {
        while let Some(&r) = self.rewrites.front() {
            let q = match r {
                Rewrite::Entry { q, .. } => q,
                Rewrite::Credit => self.c.qs.carrier(0),
            };
            // Not on a queue pair that failed meanwhile (dropped, as its flush would; the next
            // failover writes it again), and so not into a staging copy the NIC may still read
            // for a live one.
            if self.gone(q) {
                self.rewrites.pop_front();
                continue;
            }
            let mut ready = self.book.room(q) >= 2;
            if let (true, Rewrite::Entry { stage, len, .. }) = (ready, r) {
                // From the staging copy where the provider has no inline room: once the NIC no
                // longer reads that copy.
                if len > N::max_inline(&self.qps[q]) as usize {
                    if let Some((rq, place)) = self.cts_reading[stage] {
                        ready = self.gone(rq as usize) || self.book.done(rq as usize, place);
                    }
                }
            }
            if !ready {
                if N::now_ms() > self.rewrite_by {
                    return Err(self.c.drain_timeout(0));
                }
                return Ok(());
            }
            self.rewrites.pop_front();
            match r {
                Rewrite::Entry { q, stage, off, bytes, len, remote } => {
                    if len <= N::max_inline(&self.qps[q]) as usize {
                        // Inline: the bytes are copied into the work request at post (ours).
                        self.post_ctrl(q, bytes.as_ptr() as u64, |_| 0, len, remote, false)?;
                        continue;
                    }
                    // SAFETY: inside the staging copies (stage < CTS_STAGES, the entry < MAX_GROUP),
                    // our own memory, which the NIC no longer reads (checked above).
                    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.cts_out.ptr().add(off), len) };
                    let out = self.cts_out;
                    self.post_ctrl(q, out.addr() + off as u64, |m| out.lkey_on(m), len, remote, false)?;
                    self.cts_reading[stage] = Some((q as u8, self.book.last_place(q)));
                }
                Rewrite::Credit => {
                    let word = self.eng.credits_sent();
                    if word > 0 {
                        self.post_credit(word)?;
                    }
                }
            }
        }
        Ok(())
    }
}
