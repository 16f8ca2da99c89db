//! What a failure leaves for later calls (the notices not sent yet, the completions waiting for
//! their port's verdict, the error waiting for its cause), the queue pairs failed, failed over
//! and taken back, and the drain a failover waits for: state each later call takes up, never a
//! wait inside one.

use super::*;
use crate::proto::qps::{Drained, Failed, Refused, MARKER_WAIT_MS, QUIET_MS};

/// Run `f` on a shell unless a call of it is already under way there (`busy`): a failover polls
/// while it drains, and a poll may call for another.
pub(in crate::transport::verbs) fn once<S>(s: &mut S, busy: fn(&mut S) -> &mut bool, f: fn(&mut S) -> Result<()>) -> Result<()> {
    if *busy(s) {
        return Ok(());
    }
    *busy(s) = true;
    let r = f(s);
    *busy(s) = false;
    r
}

impl<N: Nic> Common<N> {
    /// Whether drain `d` is over yet (Err once DRAIN_WAIT is over): its markers completed, or,
    /// from a provider that does not flush a marker posted to a queue pair in ERR (Soft-RoCE of
    /// some kernels, for receive queues), quiet stood in for them ([`QpStates::drain_state`]).
    /// Never waits: the shell asks again at its next call, after polling.
    pub(in crate::transport::verbs) fn drain_done(&mut self, d: &mut Drain) -> Result<bool> {
        match self.qs.drain_state(d, N::now_ms()) {
            Drained::Yes => Ok(true),
            Drained::No => Ok(false),
            Drained::Quiet { unmarked } => {
                log::info!(
                    "NET/rivet: {}: queue pair(s) {unmarked:#x} in ERR: the provider did not flush the drain marker within {MARKER_WAIT_MS} ms; counted as drained after {QUIET_MS} ms without a completion (failed completions per queue pair: {:?})",
                    self.where_(0),
                    self.qs.flushed_counts()
                );
                Ok(true)
            }
            Drained::TimedOut { unmarked } => Err(self.drain_timeout(unmarked)),
        }
    }

    /// Move data queue pair `q` (`qp`) to ERR for a failover: Ok(true) once it is; Ok(false)
    /// while the device refuses with ETIMEDOUT (or anything, with NCCL_IB_MQP_RETRY_ALL) and
    /// NCCL_IB_MQP_RETRY_CNT allows another try at a later call ([`QpStates::refused`],
    /// `QpStates::moves_due`); the comm's error once the retries are spent.
    pub(in crate::transport::verbs) fn move_to_err(&mut self, q: usize, qp: &N::Qp) -> Result<bool> {
        let port = self.ports.get(self.qp_member[q] as usize).copied().unwrap_or(self.port);
        let (rc, e) = match N::to_err(qp, port) {
            Ok(()) => {
                self.qs.moved(q);
                return Ok(true);
            }
            Err(refused) => refused,
        };
        match self.qs.refused(q, rc == libc::ETIMEDOUT, N::now_ms()) {
            Refused::Later { first } => {
                if first {
                    let r = self.set.mqp_retry;
                    log::info!(
                        "NET/rivet: {}: moving queue pair {q} to ERR for a failover was refused ({e}); tried again at later calls, up to NCCL_IB_MQP_RETRY_CNT={} times, NCCL_IB_MQP_RETRY_SLEEP_MSEC={} ms later each time",
                        self.where_(0),
                        r.count,
                        r.sleep_ms
                    );
                }
                Ok(false)
            }
            Refused::GiveUp { tries } => {
                let e = if tries > 0 { Error::system(format!("{e} (after {tries} retries: NCCL_IB_MQP_RETRY_CNT)")) } else { e };
                Err(self.die(e))
            }
        }
    }

    /// The work a failure left for later calls (see `pending`): the notices the out-of-band
    /// socket did not take yet, the completions waiting for their port's verdict, the error
    /// waiting for its cause. Never waits; an error once the comm is dead.
    #[inline(never)]
    pub(in crate::transport::verbs) fn resolve(&mut self) -> Result<()> {
        if !self.pending {
            return Ok(());
        }
        let now = N::now_ms();
        if let Some((wc, m, until)) = self.dying {
            if now >= until || self.cause(&wc, m).is_some() {
                self.dying = None;
                let e = self.wc_error(&wc, m);
                self.die(e);
            }
        }
        let mut i = 0;
        while i < self.verdicts.len() {
            let (m, mask) = (self.verdicts[i].m, self.verdicts[i].mask);
            if self.qs.down() & mask == mask {
                // Failed over meanwhile (the peer named it, or its port's event came): no verdict
                // is needed any more.
                self.verdicts.swap_remove(i);
                continue;
            }
            let down = self.member_down(m) || self.flapped(m);
            if !down && now < self.verdicts[i].until {
                i += 1;
                continue;
            }
            let v = self.verdicts.swap_remove(i);
            let e = self.wc_error(&v.wc, m);
            if down {
                self.mark_failed(mask, &e.to_string());
            } else {
                self.die(e);
            }
        }
        self.flush_outbox()?;
        self.refresh_pending();
        self.check()
    }

    /// A shell's failover is under way (or over): new sends and receives wait for it.
    pub(in crate::transport::verbs) fn set_failing(&mut self, on: bool) {
        self.failing = on;
        self.refresh_pending();
    }

    /// `pending` from what it stands for.
    pub(in crate::transport::verbs) fn refresh_pending(&mut self) {
        self.pending = self.failing || self.dying.is_some() || !self.verdicts.is_empty() || !self.outbox.is_empty();
    }

    /// Whether new sends and receives wait: a failover under way, or a failure's verdict or
    /// cause not known yet.
    #[inline]
    pub(in crate::transport::verbs) fn failing(&self) -> bool {
        self.pending && (self.failing || self.dying.is_some() || !self.verdicts.is_empty())
    }

    /// What the device says caused a failed completion on member `m`, if anything yet.
    pub(in crate::transport::verbs) fn cause(&self, wc: &ibv_wc, m: usize) -> Option<String> {
        cause_on(self.member_port(m), wc.qp_num)
    }

    /// Member `m`'s port.
    pub(in crate::transport::verbs) fn member_port(&self, m: usize) -> &'static N::Port {
        self.ports.get(m).copied().unwrap_or(self.port)
    }

    /// Whether member `m`'s port is seen down (its PORT_ERR event, or its state).
    pub(in crate::transport::verbs) fn member_down(&self, m: usize) -> bool {
        port_down(self.member_port(m))
    }

    /// Member `m`'s PORT_ERR count when the comm began or last took a queue pair of it back
    /// (see `flapped`).
    pub(in crate::transport::verbs) fn downs_at(&self, m: usize) -> u32 {
        self.downs_at.get(m).copied().unwrap_or(0)
    }

    /// Whether member `m`'s port went down since the comm began or last took a queue pair of it
    /// back, though it may be up again now (a flap shorter than the time between two looks): a
    /// LOC_QP_OP_ERR from then is the port's, not a bug's.
    pub(in crate::transport::verbs) fn flapped(&self, m: usize) -> bool {
        self.member_port(m).downs() != self.downs_at(m)
    }

    /// The data queue pairs on member `m` (bit q).
    pub(in crate::transport::verbs) fn on_member(&self, m: usize) -> u32 {
        (0..self.ndata).filter(|&q| self.qp_member[q] as usize == m).fold(0, |a, q| a | 1 << q)
    }

    /// Queue pairs `mask` failed, for `cause`: the comm fails them over (the shells do, at their
    /// next call), or, with none left, fails.
    pub(in crate::transport::verbs) fn mark_failed(&mut self, mask: u32, cause: &str) {
        if self.dead.is_some() {
            return;
        }
        let new = match self.qs.fail(mask) {
            Failed::Known => return,
            Failed::NoneLeft { .. } => {
                self.causes.push(cause.to_string());
                let e = Error::remote(format!("every queue pair of this connection failed ({}); no member is left to fail over to", self.causes.join("; ")));
                self.die(e);
                return;
            }
            Failed::Over { new } => new,
        };
        self.causes.push(cause.to_string());
        let names = |mask: u32| {
            let mut v: Vec<String> = (0..self.ndata).filter(|&q| mask & (1 << q) != 0).map(|q| self.member_name(self.qp_member[q] as usize)).collect();
            v.dedup();
            v.join(", ")
        };
        log::warn!(
            "NET/rivet: {} (peer {}): queue pair(s) {new:#x} on {} failed: {cause}; their traffic fails over to {} (NCCL_IB_RESILIENCY_PORT_FAILOVER)",
            self.member_name(0),
            self.peer,
            names(new),
            names(self.qs.all() & !self.qs.down())
        );
    }

    /// Queue pairs `mask`, on a member down at setup here or at the peer (setup left them in
    /// INIT and logged it): found failed from the start, so the first call fails them over as
    /// any that fail (drained, the peer told), and recovery takes them back once the port is up.
    /// Setup makes a comm so only with a queue pair left to fail over to.
    pub fn start_failed(&mut self, mask: u32, cause: &str) {
        if let Failed::Over { .. } = self.qs.fail(mask) {
            self.causes.push(cause.to_string());
        }
    }

    pub(in crate::transport::verbs) fn member_name(&self, m: usize) -> String {
        let p = self.ports.get(m).unwrap_or(&self.port);
        format!("{}:{}", p.dev_name(), p.num())
    }

    /// Whether a failover is due: queue pairs found failed, the peer naming dead ones, or (on a
    /// sender) the receiver's account; or a recovery notice to act on.
    pub(in crate::transport::verbs) fn failover_due(&self) -> bool {
        self.qs.due() || !self.notices.is_empty() || self.pending
    }

    /// Queue pairs `mask` are failed over (in ERR, drained): recovery may take them back later.
    pub(in crate::transport::verbs) fn failed_over(&mut self, mask: u32) {
        self.qs.failed_over(mask, N::now_ms());
    }

    /// Queue pairs `mask` are taken back (both sides reset and reconnected them).
    pub(in crate::transport::verbs) fn taken_back(&mut self, mask: u32) {
        self.qs.taken_back(mask);
        for q in (0..self.ndata).filter(|&q| mask & (1 << q) != 0) {
            // Its port is up again: a later flap is a new one.
            let m = self.qp_member[q] as usize;
            if let (Some(p), Some(d)) = (self.ports.get(m), self.downs_at.get_mut(m)) {
                *d = p.downs();
            }
        }
    }

    /// Whether data queue pair `q`'s port is up (ACTIVE, and no PORT_ERR since its PORT_ACTIVE).
    pub(in crate::transport::verbs) fn port_up(&self, q: usize) -> bool {
        let p = self.ports.get(self.qp_member[q] as usize).copied().unwrap_or(self.port);
        !p.seen_down() && p.state() == Some("ACTIVE")
    }

    /// The failed-over queue pairs recovery may try to take back now ([`QpStates::recoverable`],
    /// of those whose port is up).
    pub(in crate::transport::verbs) fn recoverable_now(&self) -> u32 {
        if self.dead.is_some() {
            return 0;
        }
        self.qs.recoverable(N::now_ms(), |q| self.port_up(q))
    }

    /// A failover that could not drain its queue pairs in time: the comm fails.
    pub(in crate::transport::verbs) fn drain_timeout(&mut self, mask: u32) -> Error {
        let e = Error::system(format!(
            "{}: failing over queue pair(s) {mask:#x}: their work requests were not flushed within {} s",
            self.where_(0),
            DRAIN_WAIT.as_secs()
        ));
        self.die(e)
    }
}

/// What the device says about queue pair `qpn` or port `port`, as the cause of a failed
/// completion, if anything yet.
pub(in crate::transport::verbs) fn cause_on<P: NicPort>(port: &P, qpn: u32) -> Option<String> {
    port.poll_events();
    if let Some((_, ev)) = port.qp_event(std::iter::once(qpn)) {
        Some(format!("; cause: asynchronous event {ev} on this QP: {}", event_hint(ev)))
    } else if port.seen_down() {
        Some(format!("; cause: the port {}:{} is down (PORT_ERR): check the link and the switch", port.dev_name(), port.num()))
    } else {
        // The event may not have been delivered yet: ask the port itself.
        let state = port.state().filter(|s| *s != "ACTIVE")?;
        Some(format!("; cause: the port {}:{} is {state}: check the link and the switch", port.dev_name(), port.num()))
    }
}

/// Whether `port` is seen down (its PORT_ERR event, or its state).
pub(in crate::transport::verbs) fn port_down<P: NicPort>(port: &P) -> bool {
    port.poll_events();
    port.seen_down() || port.state().is_some_and(|s| s != "ACTIVE")
}
