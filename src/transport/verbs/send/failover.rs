//! The sender's failover and recovery: failed queue pairs drained, the receiver's account
//! applied (what it has is complete, what it lacks is sent again), and queue pairs taken back;
//! each step state a later call takes up, never a wait inside one.

use super::*;

/// What a sender's failover does once its queue pairs are drained.
pub(super) enum AfterDrain {
    /// They were found failed here: name them to the receiver.
    Tell,
    /// The receiver named them: apply its account.
    Account(crate::proto::verbs::Resync),
}

impl<N: Nic> VerbsSend<N> {
    /// Fail over (once per call chain: draining polls, and polls may find more).
    pub(super) fn fail_over(&mut self) -> Result<()> {
        super::super::conn::once(self, |s| &mut s.in_failover, Self::fail_over_now)
    }

    /// Queue pairs found failed here, or named by the receiver, go to ERR and are drained (no
    /// completion of theirs comes after); those found here are named to the receiver, whose
    /// account (sent once its own are drained) says what of them arrived; the engine completes
    /// what did and the rest is posted again on the queue pairs that live. Resumable: a drain
    /// not over yet, or writes waiting for room, are taken up again at the next call (new sends
    /// wait meanwhile: `Common::failing`), so no call waits.
    pub(super) fn fail_over_now(&mut self) -> Result<()> {
        self.c.resolve()?;
        loop {
            // Moves to ERR the device refused before, due again now.
            let due = self.c.qs.moves_due(N::now_ms());
            for q in (0..self.qps.len()).filter(|&q| due & (1 << q) != 0) {
                self.stop_and_mark(q)?;
            }
            if let Some((wait, _)) = &mut self.draining {
                if !self.c.drain_done(wait)? {
                    break;
                }
                let Some((wait, then)) = self.draining.take() else { break };
                let mask = wait.mask();
                self.c.failed_over(mask);
                match then {
                    AfterDrain::Tell => self.c.notify(&Notice::Fail { dead: mask })?,
                    AfterDrain::Account(r) => {
                        self.apply_account(r)?;
                        // The receiver named them: tell it that this side is in ERR too, so
                        // that recovery may reset them there (see `VerbsRecv::idle_failover`).
                        self.c.notify(&Notice::Fail { dead: mask })?;
                    }
                }
                continue;
            }
            // Found here: drained, then named to the receiver (only these: a Fail that named
            // ones failed over before could undo a take-back under way).
            let found = self.c.qs.failed() & !self.c.qs.dead();
            if found != 0 {
                self.drain(found, AfterDrain::Tell)?;
                continue;
            }
            // The receiver's notices, in the order it sent them.
            match self.c.notices.pop_front() {
                None => break,
                Some(Notice::Resync(r)) => {
                    let named = r.dead & !self.c.qs.dead();
                    if named != 0 {
                        self.drain(named, AfterDrain::Account(r))?;
                    } else {
                        self.apply_account(r)?;
                    }
                }
                // Recovery: the receiver has reset its side of failed queue pairs.
                Some(Notice::Recover { qps }) => self.take_back(qps)?,
                Some(_) => {} // a receiver's notice: not for a sender
            }
        }
        self.post_resends()?;
        self.c.set_failing(self.draining.is_some() || !self.resend_eager.is_empty());
        Ok(())
    }

    /// Move logical queue pairs back to the queue pairs taken back, each once none of its parts
    /// is half posted on the one it moved to.
    pub(super) fn switch_back(&mut self) {
        let (moved, waiting) = self.c.qs.send_home(self.eng.open_parts());
        if moved {
            self.remapped();
        }
        self.switching = waiting;
    }

    /// The receiver has reset its side of failed queue pairs `asked` and can receive on them:
    /// those whose port is up here too are reset and reconnected, and get their own traffic
    /// back (the eager messages stay where they went: they must arrive in ring order on one
    /// queue pair); the receiver is told which.
    pub(super) fn take_back(&mut self, asked: u32) -> Result<()> {
        let (nq, ln) = (self.qps.len(), self.c.ports.len());
        let mut ok = 0u32;
        let eligible = self.c.qs.send_may_take_back(asked);
        for q in (0..nq).filter(|&q| eligible & (1 << q) != 0 && self.c.port_up(q)) {
            let (port, l) = (self.c.ports[member_of(q, ln)], self.c.links[q]);
            match N::reset_to_rtr(&self.qps[q], port, &l).and_then(|_| N::back_to_rts(&self.qps[q], port, &l)) {
                Ok(()) => ok |= 1 << q,
                Err(e) => log::warn!("NET/rivet: {}: taking queue pair {q} back failed: {e}", self.c.where_(0)),
            }
            self.book.reset(q);
        }
        self.c.taken_back(ok);
        self.c.qs.send_took_back(ok);
        self.switch_back();
        if ok != 0 {
            self.c.notify(&Notice::Recovered { qps: ok })?;
            let per: Vec<String> = self.c.ports.iter().zip(&self.c.member_bytes).map(|(p, b)| format!("{}:{} {b}", p.dev_name(), p.num())).collect();
            log::info!(
                target: crate::log::INIT,
                "NET/rivet: {}: took back queue pair(s) {ok:#x} (NCCL_IB_RESILIENCY_PORT_RECOVERY); logical queue pairs now on {:?}; bytes sent per member so far: {}",
                self.c.where_(0),
                &self.c.qs.map()[..nq],
                per.join(", ")
            );
        }
        if asked & !ok != 0 {
            self.c.notify(&Notice::NotRecovered { qps: asked & !ok })?;
        }
        Ok(())
    }

    /// Apply the receiver's account of what arrived: for the queue pairs it names that no
    /// earlier account did, the engine completes what arrived and says what to post again.
    pub(super) fn apply_account(&mut self, r: crate::proto::verbs::Resync) -> Result<()> {
        // (Logical queue pair 0's carrier before the map moves: the eager writes went there.)
        let q0 = self.c.qs.carrier(0);
        let newly = match self.c.qs.send_account(r.dead) {
            Some(0) => return Ok(()),
            Some(newly) => newly,
            None => return Err(self.c.die(crate::error::Error::remote(format!("{}: every queue pair failed", self.c.where_(0))))),
        };
        let nq = self.qps.len();
        let part_qp = &self.part_qp;
        let lost = |req: u16, q: usize| newly & (1 << part_qp[req as usize][q]) != 0;
        let eager_lost = newly & (1 << q0) != 0;
        let resend = self.eng.fail_over(eager_lost, lost, &r).map_err(|e| self.c.proto(e))?;
        self.remapped();
        log::info!(
            target: crate::log::INIT,
            "NET/rivet: {}: failed over queue pair(s) {newly:#x}: the receiver's account (from its out-of-band notice) asks for {} eager and {} rendezvous send(s) again; logical queue pairs now on {:?}",
            self.c.where_(0),
            resend.eager.len(),
            resend.rdv.len(),
            &self.c.qs.map()[..nq]
        );
        self.resend(resend, eager_lost)
    }

    /// Move queue pairs `mask` to ERR and post their drain markers: once each one's has
    /// completed (a later call sees it: `fail_over_now`), every completion of theirs is polled,
    /// and `then` follows.
    pub(super) fn drain(&mut self, mask: u32, then: AfterDrain) -> Result<()> {
        for q in (0..self.qps.len()).filter(|&q| mask & (1 << q) != 0) {
            self.stop_and_mark(q)?;
        }
        self.draining = Some((Drain::new(mask, N::now_ms()), then));
        Ok(())
    }

    /// Move queue pair `q` to ERR and post its drain marker, or leave the move for a later call
    /// (`Common::move_to_err`: the device refused it for now).
    fn stop_and_mark(&mut self, q: usize) -> Result<()> {
        if !self.c.move_to_err(q, &self.qps[q])? {
            return Ok(());
        }
        self.wrs[0] = rdma_wr(IBV_WR_RDMA_WRITE, (KIND_DRAIN << KIND_SHIFT) | q as u64, 0, 0, 0);
        self.wrs[0].send_flags = IBV_SEND_SIGNALED;
        if let Err(rc) = post_chain::<N>(&self.qps[q], &mut self.wrs, &mut self.sges, 1) {
            let m = member_of(q, self.c.ports.len());
            return Err(self.c.post_failed_on(m, N::qpn(&self.qps[q]), "posting the drain marker", rc));
        }
        Ok(())
    }

    /// Post what the receiver did not get: the eager writes, in ring order, on part 0's queue
    /// pair before any new one; the rendezvous parts, in order, as the send queues have room.
    /// `eager_lost`: the account covers logical queue pair 0's, and so lists every eager write
    /// after what the receiver has, those an earlier account asked for and not yet posted too.
    pub(super) fn resend(&mut self, r: Resend, eager_lost: bool) -> Result<()> {
        if eager_lost {
            self.resend_eager.clear();
        }
        self.resend_eager.extend(r.eager);
        self.resend_by = N::now_ms() + DRAIN_WAIT.as_millis() as u64;
        for req in r.rdv {
            let ready = self.ready[req as usize];
            if !self.deferred[..self.ndeferred].iter().any(|d| d.0 == req) {
                self.deferred[self.ndeferred] = (req, ready);
                self.ndeferred += 1;
            }
        }
        self.post_resends()
    }

    /// Post the eager writes to make again as far as part 0's send queue has room (the rest at
    /// a later call, within DRAIN_WAIT), then the deferred rendezvous bytes.
    pub(super) fn post_resends(&mut self) -> Result<()> {
        while let Some(&(slot, hdr_slot, hdr, req)) = self.resend_eager.front() {
            // (Not for a queue pair that fails meanwhile: the post is dropped, and the next
            // failover's account asks for it again.)
            let q0 = self.c.qs.carrier(0);
            if !self.gone(q0) && self.book.room(q0) < MAX_POST {
                if N::now_ms() > self.resend_by {
                    return Err(self.c.drain_timeout(0));
                }
                return Ok(());
            }
            self.resend_eager.pop_front();
            let copy = self.inline_copy.get(slot).filter(|c| c.0 > 0).map(|c| (c.0 as usize, c.1));
            match (copy, req) {
                (Some((len, bytes)), _) => {
                    // Its bytes were in the work request, and are in the copy: inline again.
                    let q = self.c.qs.carrier(0);
                    let remote = self.ring.addr + (slot * slot_bytes(self.ring.eager_max)) as u64;
                    self.sges[0] = ibv_sge { addr: bytes.as_ptr() as u64, length: len as u32, lkey: 0 };
                    self.wrs[0] = rdma_wr(IBV_WR_RDMA_WRITE_WITH_IMM, KIND_CTRL << KIND_SHIFT, remote, self.ring.rkeys[member_of(q, self.rem_members)], 1);
                    self.wrs[0].__bindgen_anon_1.imm_data = Imm::Eager(slot as u32).encode().to_be();
                    self.wrs[0].send_flags = IBV_SEND_INLINE;
                    // Inline: the bytes are copied into the work request at post (`bytes` is ours).
                    self.post(q, 1)?;
                }
                (None, Some(req)) => {
                    // Not complete: its buffer is still lent to this send.
                    if self.post_eager(slot, hdr_slot, hdr, Some(req), (KIND_SEND << KIND_SHIFT) | req as u64)? {
                        self.eng.on_completion(req, 0);
                    }
                }
                (None, None) => self.post_eager(slot, hdr_slot, hdr, None, KIND_CTRL << KIND_SHIFT).map(|_| ())?,
            }
        }
        self.post_deferred()
    }
}
