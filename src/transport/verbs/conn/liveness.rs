//! What an idle call looks at: the count of idle calls, and every LIVENESS_EVERY the device's
//! asynchronous events, the ports, the peer's out-of-band socket and its notices.

use super::*;

impl<N: Nic> Common<N> {
    /// Called when a call made no progress: notices a vanished peer or a fatal device event.
    #[inline]
    pub(in crate::transport::verbs) fn idle(&mut self, outstanding: usize) -> Result<()> {
        if !self.idle_tick() {
            return Ok(());
        }
        self.idle_check(outstanding)
    }

    /// Count an idle call; whether the liveness check is due at it. The coarse clock is no
    /// system call on any host (see `sys::clock`); looked at only every IDLE_CALLS idle calls
    /// all the same (the count stays inline: every idle `test` makes it).
    #[inline]
    pub(in crate::transport::verbs) fn idle_tick(&mut self) -> bool {
        self.idle_calls = self.idle_calls.wrapping_add(1);
        self.idle_calls % IDLE_CALLS == 0
    }

    #[inline(never)]
    pub(in crate::transport::verbs) fn idle_check(&mut self, outstanding: usize) -> Result<()> {
        let now = N::now_ms();
        if now.saturating_sub(self.last_check) < LIVENESS_EVERY.as_millis() as u64 {
            return Ok(());
        }
        self.last_check = now;
        // NCCL_IB_RETURN_ASYNC_EVENTS=0: fatal events are only logged (by poll_events), as net_ib.
        let fail_on_events = self.set.return_async_events;
        for (m, p) in self.ports.iter().enumerate() {
            p.poll_events_at(now);
            if let Err(e) = p.check_fatal().or_else(|e| if fail_on_events { Err(e) } else { Ok(()) }) {
                return Err(self.die(e));
            }
            let on_m = (0..self.nqpns).filter(|&i| self.qp_member[i] as usize == m).map(|i| self.qpns[i]);
            if let Some((qpn, ev)) = p.qp_event(on_m).filter(|_| fail_on_events) {
                let e = Error::system(format!("{}: asynchronous event {ev}: {}", self.where_on(m, qpn), event_hint(ev)));
                return Err(self.die(e));
            }
            let mine = self.on_member(m);
            if self.failover && p.seen_down() && mine & !self.qs.down() != 0 {
                self.mark_failed(mine, &format!("the port {}:{} is down (PORT_ERR): check the link and the switch", p.dev_name(), p.num()));
            }
        }
        self.check()?;
        // The peer's notices: every 100 ms, every 10 ms while a failover is under way.
        let every = if self.qs.down() != 0 { LIVENESS_EVERY } else { PEER_EVERY };
        if now.saturating_sub(self.peer_checked) < every.as_millis() as u64 {
            return Ok(());
        }
        self.peer_checked = now;
        self.read_inbox()?;
        if let Some(m) = self.mismatch {
            let e = self.mismatch_error(m);
            return Err(self.die(e));
        }
        match self.peer_state() {
            PeerState::Alive => return Ok(()),
            PeerState::Unreachable(err) => {
                let e = Error::remote(format!(
                    "{}:{}: the peer host {} is unreachable (its out-of-band connection: {err}): it stopped answering for RIVET_TIMEOUT seconds, so it is down or the network between the hosts is broken; {outstanding} request(s) of ours outstanding",
                    self.port.dev_name(),
                    self.port.num(),
                    self.peer.ip()
                ));
                return Err(self.die(e));
            }
            PeerState::Gone => {}
        }
        let since = *self.eof_since.get_or_insert(now);
        if now.saturating_sub(since) < EOF_GRACE.as_millis() as u64 {
            return Ok(());
        }
        let e = Error::remote(format!(
            "{}:{}: the peer {} closed its connection (its process exited or crashed) with {outstanding} request(s) of ours outstanding",
            self.port.dev_name(),
            self.port.num(),
            self.peer
        ));
        Err(self.die(e))
    }
}

pub(super) fn event_hint(ev: &str) -> &'static str {
    match ev {
        "QP_ACCESS_ERR" => "the peer wrote with an invalid or stale rkey, or outside a registered buffer",
        "QP_REQ_ERR" => "a malformed request reached this queue pair",
        _ => "the queue pair failed",
    }
}
