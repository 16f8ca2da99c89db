//! The sender's side of a failover: the receiver's account applied to what is in flight.

use super::*;

impl SendEngine {
    /// Queue pairs failed, and the receiver's account of what arrived says what was lost with
    /// them. `eager_lost`: the eager messages went on a failed queue pair (they all go on one,
    /// logical queue pair 0's); `lost(req, q)`: part `q` of rendezvous send `req` went on one
    /// (the shell knows where each part went: a logical queue pair may have moved since an
    /// earlier part of it was posted). Each such part of a rendezvous send in flight is either
    /// complete (the receiver has it: counted done, whether or not its completion came) or
    /// posted again from its first byte; eager writes the receiver did not get are written
    /// again, in order. Nothing the receiver has is sent twice, so a buffer it completed and
    /// reused is never written again.
    pub fn fail_over(&mut self, eager_lost: bool, lost: impl Fn(u16, usize) -> bool, r: &Resync) -> Result<Resend, ProtoError> {
        let mut out = Resend::default();
        let slots = self.ring.slots as u64;
        if eager_lost {
            // Part 0's queue pair carried the eager messages: those the receiver did not get
            // are written again, in order, and those it got are done, however their
            // completions fared.
            let behind = self.eager_sent.wrapping_sub(r.ring_arrived);
            if behind > slots.min(self.eager_sent) {
                return Err(ProtoError::CorruptResync { what: "eager messages", got: r.ring_arrived, have: self.eager_sent });
            }
            for i in r.ring_arrived..self.eager_sent {
                let s = (i % slots) as usize;
                let e = self.eager_log[s];
                out.eager.push((s, e.hdr_slot as usize, e.hdr, e.req));
            }
            for i in 0..SEND_REQS {
                let q = self.reqs[i];
                if q.posted && q.pending > 0 && self.rdv[i].target.size == 0 && q.ring_index < r.ring_arrived {
                    self.reqs[i].pending = 0;
                }
            }
        }
        // The clear-to-send groups not yet read: the receiver writes those of its incomplete
        // receives again; those of receives it completed (eagerly) are passed over.
        // (The sender may have read past `cts_end` already: entries written after the account.)
        let unread = (r.cts_end.wrapping_sub(self.cts_next) as i64).max(0) as u64;
        if unread > FIFO_DEPTH as u64 {
            return Err(ProtoError::CorruptResync { what: "clear-to-send entries", got: r.cts_end, have: self.cts_next });
        }
        for k in 0..unread {
            let i = self.cts_next + k;
            if !r.recvs.iter().any(|x| x.cts == i) && !self.cts_gone.contains(&i) {
                self.cts_gone.push_back(i);
            }
        }
        self.cts_gone.make_contiguous().sort_unstable();
        self.skip_gone();
        self.prune();
        let (nq, np) = (self.nqps, self.nparts);
        for i in 0..SEND_REQS {
            if !self.reqs[i].posted || self.rdv[i].target.size == 0 {
                continue;
            }
            let p = self.rdv[i];
            // A receive at or after `cts_end` was posted after the account: nothing of its sends
            // on the dead queue pairs arrived. One before it that is not listed is complete.
            let after = p.cts.wrapping_sub(r.cts_end) as i64 >= 0;
            let listed = r.recvs.iter().find(|x| x.cts == p.cts);
            let got = match listed {
                _ if after => 0,
                None => u16::MAX,
                Some(x) if (p.entry as usize) < x.n as usize => x.parts[p.entry as usize],
                Some(_) => 0,
            };
            let mut again = false;
            for q in (0..np).filter(|&q| lost(i as u16, q)) {
                let bit = 1u32 << q;
                if got & (1 << q) != 0 {
                    // The receiver has it: done, however its completion fared.
                    self.rdv[i].closed |= bit;
                    self.rdv_posted[i * nq + q] = qp_chunk(p.target.size, np, q).1;
                    self.on_completion(i as u16, q);
                } else if p.acked & bit != 0 {
                    // A completion says it landed, the receiver says it did not.
                    return Err(ProtoError::CorruptResync { what: "rendezvous parts", got: got as u64, have: p.acked as u64 });
                } else {
                    // Lost, or never posted: from its first byte again, on a live queue pair.
                    self.rdv[i].closed &= !bit;
                    self.rdv_posted[i * nq + q] = 0;
                    again = true;
                }
            }
            if again {
                out.rdv.push(i as u16);
            }
        }
        Ok(out)
    }
}
