//! The notices a connection sends its peer over the out-of-band socket (failover, recovery, a
//! mismatch), what it reads from the peer, and what the socket says of the peer's state.

use super::*;

impl<N: Nic> Common<N> {
    /// Send a notice to the peer over the out-of-band socket: what the socket does not take now
    /// (it is otherwise idle, and a notice is at most a few KiB) goes at later calls, in order.
    pub(in crate::transport::verbs) fn notify(&mut self, n: &Notice) -> Result<()> {
        self.queue_notice(&n.encode());
        self.flush_outbox()
    }

    pub(in crate::transport::verbs) fn queue_notice(&mut self, b: &[u8]) {
        if self.outbox.is_empty() {
            self.outbox_since = N::now_ms();
        }
        self.outbox.extend_from_slice(b);
    }

    /// Write what the out-of-band socket takes now of the notices waiting; the comm fails if
    /// they have waited NOTICE_WAIT.
    pub(in crate::transport::verbs) fn flush_outbox(&mut self) -> Result<()> {
        while !self.outbox.is_empty() {
            match oob::send_some(&self.oob, &self.outbox) {
                Ok(k) => {
                    self.outbox.drain(..k);
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => {
                    if N::now_ms().saturating_sub(self.outbox_since) <= NOTICE_WAIT.as_millis() as u64 {
                        self.pending = true;
                        return Ok(());
                    }
                    let e = Error::remote(format!(
                        "{}: telling the peer of a failover over the out-of-band socket: the socket took nothing for {} s (the peer does not read it)",
                        self.where_(0),
                        NOTICE_WAIT.as_secs()
                    ));
                    return Err(self.die(e));
                }
                Err(e) => {
                    let e = Error::remote(format!("{}: telling the peer of a failover over the out-of-band socket failed: {e}", self.where_(0)));
                    return Err(self.die(e));
                }
            }
        }
        Ok(())
    }

    /// Read the notices the peer sent: failover notices are kept for the shell, a mismatch for
    /// `idle`. Garbage fails the comm.
    pub(in crate::transport::verbs) fn read_inbox(&mut self) -> Result<()> {
        let mut buf = [0u8; MAX_NOTICE];
        while self.oob_end.is_none() {
            let room = MAX_NOTICE.saturating_sub(self.inbox.len()).max(1);
            let k = match oob::recv_some(&self.oob, &mut buf[..room]) {
                Ok(0) => {
                    self.oob_end.get_or_insert(None);
                    break;
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => break,
                Err(e) => {
                    // Kept: the socket reports its error once (a keepalive timeout says the
                    // peer host stopped answering).
                    self.oob_end.get_or_insert(Some(e));
                    break;
                }
                Ok(k) => k,
            };
            self.inbox.extend_from_slice(&buf[..k]);
            loop {
                match Notice::decode(&self.inbox) {
                    Ok(None) => break,
                    Ok(Some((n, len))) => {
                        self.inbox.drain(..len);
                        match n {
                            Notice::Mismatch(m) => self.mismatch = Some(m),
                            n => {
                                let n = n.masked(self.qs.all());
                                self.notices.push_back(n);
                            }
                        }
                        if self.notices.len() > 4096 {
                            let e = Error::remote(format!("{}: the peer sent more failover notices than this comm can act on", self.where_(0)));
                            return Err(self.die(e));
                        }
                    }
                    Err(why) => {
                        let e = Error::remote(format!("{}: the peer's out-of-band socket carried {why}", self.where_(0)));
                        return Err(self.die(e));
                    }
                }
            }
        }
        Ok(())
    }

    pub(in crate::transport::verbs) fn peer_state(&self) -> PeerState {
        // Reading the notices may have met the socket's end or error first (an error is
        // reported once): it says what the peer's state is from then on.
        match &self.oob_end {
            Some(None) => PeerState::Gone,
            Some(Some(e)) if crate::transport::oob::sock::host_unreachable(e) => {
                PeerState::Unreachable(e.raw_os_error().map_or_else(|| std::io::Error::from(e.kind()), std::io::Error::from_raw_os_error))
            }
            Some(Some(_)) => PeerState::Gone,
            None => oob::peer_state(&self.oob),
        }
    }

    /// The mismatch the peer told of, if it did (its notices read now, once).
    #[cold]
    pub(in crate::transport::verbs) fn peer_mismatch(&mut self) -> Option<Error> {
        if self.mismatch.is_none() && !self.reading_cause {
            self.reading_cause = true;
            let _ = self.read_inbox();
            self.reading_cause = false;
        }
        self.mismatch.map(|m| self.mismatch_error(m))
    }

    /// The comm's error for the mismatch the peer told of.
    pub(in crate::transport::verbs) fn mismatch_error(&self, m: Mismatch) -> Error {
        Error::usage(format!(
            "collective mismatch with the peer {}: a send of {} bytes with tag {} into a receive of {} bytes; every rank must run the same collectives with the same sizes",
            self.peer, m.send_size, m.tag, m.recv_size
        ))
    }

    /// Tell the peer why this side fails (best effort: after any notice still waiting).
    pub(in crate::transport::verbs) fn notify_mismatch(&mut self, m: Mismatch) {
        self.queue_notice(&m.encode());
        let _ = self.flush_outbox();
    }
}
