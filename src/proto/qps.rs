//! A comm's data queue pairs as failover and recovery see them, as pure code: which were found
//! failed, which are failed over (in ERR, drained) and which the peer named dead; the map of
//! logical queue pairs onto live ones, and what each direction's side of a failover and a
//! recovery has done (the sender's accounts applied, the receiver's queue pairs asked back); each one's
//! drain (its marker's completion, its flushed completions, the waits that stand in for a marker
//! a provider does not flush); the moves to ERR the device refused, retried at later calls as
//! NCCL_IB_MQP_RETRY_* says; and recovery's schedule (when each may be asked back, how often it
//! was). Both directions' shells keep one, hand it the time (coarse milliseconds) and what the
//! ports say, and carry out what it answers: it reads no clock, no configuration and no device.

use super::notice::remap_keeping;
use super::verbs::MAX_QPS;

/// How long a failover waits for its drain markers (and for room for what it writes again).
pub const DRAIN_WAIT_MS: u64 = 5_000;
/// How long a drain marker is waited for before quiet stands in for it, and how much quiet.
pub const MARKER_WAIT_MS: u64 = 500;
pub const QUIET_MS: u64 = 100;

/// NCCL_IB_MQP_RETRY_*: how a move to ERR the device refused is tried again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retry {
    /// Whatever the error; otherwise only ETIMEDOUT.
    pub all: bool,
    /// Tries after the first.
    pub count: u32,
    /// Try n comes n times this later than the one before it.
    pub sleep_ms: u64,
}

/// NCCL_IB_RESILIENCY_PORT_RECOVERY, its start delay and its attempts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    pub on: bool,
    pub delay_ms: u64,
    pub attempts: u32,
}

/// What `fail` made of queue pairs found failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failed {
    /// Nothing new (already failed, or failed over).
    Known,
    /// `new` fail over to the queue pairs that live (the shells do, at their next call).
    Over { new: u32 },
    /// `new` were the last: no queue pair is left to fail over to.
    NoneLeft { new: u32 },
}

/// What the device's refusal of a move to ERR means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Tried again at a later call (`moves_due`); `first`: the first refusal of this move.
    Later { first: bool },
    /// No try left: the comm's error, after `tries` retries.
    GiveUp { tries: u32 },
}

/// A failed completion's status, as failover tells them apart (the shell maps the device's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// WR_FLUSH_ERR: the queue pair is in ERR.
    Flushed,
    /// RETRY_EXC_ERR: the transport gave up (the link or the peer is gone).
    RetryExceeded,
    /// RNR_RETRY_EXC_ERR.
    RnrRetryExceeded,
    /// LOC_QP_OP_ERR: could not send (Soft-RoCE's word for a port whose netdev is down).
    LocalQpOp,
    /// Anything else: a bug of one side (REM_ACCESS_ERR, LOC_PROT_ERR, ...).
    Other,
}

/// Where a failed completion came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Data queue pair `q`.
    Data(usize),
    /// The flush queue pair of a member (GPUDirect receives' flush reads).
    Flush,
    /// None of the comm's.
    Unknown,
}

/// What a failed completion calls for (`QpStates::on_fault`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnFault {
    /// Nothing more: a queue pair failed over (or awaiting its verdict) flushing its queue.
    Ignore,
    /// Wait (at later calls, up to the shell's bound) for its port to say whether it went down:
    /// failed over if it did, the comm's error if not.
    AwaitPort,
    /// Fail over the data queue pair (`Source::Data`) or every data queue pair of the flush
    /// queue pair's member, whose read counts as done.
    FailOver,
    /// The comm's error, once the port's state names its cause (or the shell's bound is over).
    AwaitCause,
    /// The comm's error now.
    Die,
}

/// A failover's drain of queue pairs `mask`, looked at each call (`QpStates::drain_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drain {
    mask: u32,
    /// When it began (or its last move to ERR was made), and when a completion of its queue
    /// pairs was last seen.
    start: u64,
    quiet_since: u64,
    /// Failed completions of the queue pairs drained, when last looked at.
    seen: u64,
}

/// Where a drain stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drained {
    /// Every marker completed.
    Yes,
    /// A provider that does not flush a marker posted to a queue pair in ERR (Soft-RoCE of some
    /// kernels, for receive queues): after MARKER_WAIT_MS, the queue pairs count as drained once
    /// none of them gave a completion for QUIET_MS. `unmarked`: those whose marker never came.
    Quiet { unmarked: u32 },
    /// Not yet: asked again at a later call.
    No,
    /// DRAIN_WAIT_MS is over: the comm's error. `unmarked` as above.
    TimedOut { unmarked: u32 },
}

impl Drain {
    pub fn new(mask: u32, now: u64) -> Drain {
        Drain { mask, start: now, quiet_since: now, seen: 0 }
    }

    /// The queue pairs drained.
    pub fn mask(&self) -> u32 {
        self.mask
    }
}

/// The state of a comm's `n` data queue pairs (bit q of each mask is queue pair q).
#[derive(Clone, Debug)]
pub struct QpStates {
    n: usize,
    /// Found failed here (a failed completion, its port's PORT_ERR) and not yet failed over.
    failed: u32,
    /// Failed over: in ERR and drained, their traffic on the others.
    dead: u32,
    /// Receiver: named dead by the sender's Fail notices (its side is in ERR).
    peer_dead: u32,
    /// Whose drain marker has completed.
    marked: u32,
    /// Failed completions seen per queue pair (a drain's quiet counts them).
    flushed: [u32; MAX_QPS],
    /// Recovery: when each was failed over or last asked back, and how often it was.
    failed_at: [u64; MAX_QPS],
    attempts: [u32; MAX_QPS],
    /// Moves to ERR the device refused for now, each one's retries so far and when the next
    /// is due.
    moves: u32,
    tries: [u32; MAX_QPS],
    due: [u64; MAX_QPS],
    retry: Retry,
    recovery: Recovery,
    /// Which queue pair carries each logical one's traffic.
    map: [u8; MAX_QPS],
    /// Sender: the failed queue pairs whose loss the receiver's account was applied for.
    synced: u32,
    /// Receiver: failed queue pairs reset here (in RTR, receives posted) and asked back, the
    /// sender's answer not yet in.
    asked: u32,
}

impl QpStates {
    pub fn new(n: usize, retry: Retry, recovery: Recovery) -> QpStates {
        QpStates {
            n: n.min(MAX_QPS),
            failed: 0,
            dead: 0,
            peer_dead: 0,
            marked: 0,
            flushed: [0; MAX_QPS],
            failed_at: [0; MAX_QPS],
            attempts: [0; MAX_QPS],
            moves: 0,
            tries: [0; MAX_QPS],
            due: [0; MAX_QPS],
            retry,
            recovery,
            map: std::array::from_fn(|q| q as u8),
            synced: 0,
            asked: 0,
        }
    }

    /// The queue pair that carries logical queue pair `q`'s traffic.
    #[inline]
    pub fn carrier(&self, q: usize) -> usize {
        self.map[q] as usize
    }

    /// The map of logical queue pairs onto queue pairs (the first `n` are in use).
    pub fn map(&self) -> &[u8; MAX_QPS] {
        &self.map
    }

    /// How many logical queue pairs queue pair `q` carries (after a failover, one carries
    /// several: their writes all go to it).
    pub fn carried(&self, q: usize) -> usize {
        self.map[..self.n].iter().filter(|&&p| p as usize == q).count()
    }

    /// Move the map off queue pairs `dead`, as little as it can ([`remap_keeping`]; `back`:
    /// logical queue pairs 1.. go home to queue pairs live again). False if none is left.
    fn remap(&mut self, dead: u32, back: bool) -> bool {
        match remap_keeping(dead, self.n, &self.map, back) {
            Some(m) => {
                self.map = m;
                true
            }
            None => false,
        }
    }

    /// Receiver: failed over, or asked back and not answered yet (in RTR, it cannot send).
    #[inline]
    pub fn recv_gone(&self) -> u32 {
        self.failed | self.dead | self.asked
    }

    /// Receiver: the queue pairs asked back, not answered yet.
    pub fn asked(&self) -> u32 {
        self.asked
    }

    /// Receiver: queue pairs `new` are drained. They are failed over (at `now`), no longer
    /// asked back, and the map moves off them (and off those being asked back). False if no
    /// queue pair is left.
    pub fn recv_drained(&mut self, new: u32, now: u64) -> bool {
        self.failed_over(new, now);
        self.asked &= !new;
        self.remap(self.dead | self.asked, false)
    }

    /// Receiver: queue pairs `ok`, taken back here (`taken_back`: reset, they can receive, and
    /// may fail again, from now on), are asked back of the sender.
    pub fn recv_asked(&mut self, ok: u32) {
        self.asked |= ok & self.all();
    }

    /// Receiver: the sender's answer to a Recover, of the queue pairs still asked back (one
    /// failed again meanwhile is failed over): those it took back (`yes`) and those it could not
    /// (`no`, failed over again at `now`; its side stays in ERR, so they may be asked again
    /// without its word). Returns both, filtered.
    pub fn recv_answered(&mut self, yes: u32, no: u32, now: u64) -> (u32, u32) {
        let (yes, no) = (yes & self.asked, no & self.asked);
        self.asked &= !(yes | no);
        self.failed_over(no, now);
        self.peer_named(no);
        (yes, no)
    }

    /// Receiver: the answer is applied (the queue pairs taken back are in RTS, or failed again):
    /// logical queue pairs 1.. go home to those that live.
    pub fn recv_home(&mut self) {
        self.remap(self.down() | self.asked, true);
    }

    /// Sender: the receiver's account names `dead`: the queue pairs no earlier account did, for
    /// which the engine applies it (their parts and eager writes lost or arrived). The map moves
    /// off every one the accounts named; None if none is left.
    pub fn send_account(&mut self, dead: u32) -> Option<u32> {
        let newly = dead & !self.synced;
        if newly == 0 {
            return Some(0);
        }
        self.synced |= dead;
        self.remap(self.synced, false).then_some(newly)
    }

    /// Sender: the failed queue pairs the receiver's accounts named (applied for).
    pub fn synced(&self) -> u32 {
        self.synced
    }

    /// Sender: of the queue pairs the receiver asks back (`asked`), those this side may take
    /// back: failed over and accounted for.
    pub fn send_may_take_back(&self, asked: u32) -> u32 {
        asked & self.dead & self.synced
    }

    /// Sender: queue pairs `ok` are taken back (reset and in RTS again).
    pub fn send_took_back(&mut self, ok: u32) {
        self.taken_back(ok);
        self.synced &= !ok;
    }

    /// Sender: move logical queue pairs home to the queue pairs taken back, each only if none of
    /// its parts is half posted where it is (`open`, bit per logical queue pair: a staged send's
    /// part that began on one queue pair and ended with its immediate on another could complete
    /// before its first bytes landed). Whether the map changed, and whether some still wait.
    pub fn send_home(&mut self, open: u32) -> (bool, bool) {
        let Some(want) = remap_keeping(self.synced, self.n, &self.map, true) else { return (false, false) };
        let (mut moved, mut waiting) = (false, false);
        for (q, &w) in want.iter().enumerate().take(self.n) {
            if self.map[q] != w {
                if open & (1 << q) == 0 {
                    self.map[q] = w;
                    moved = true;
                } else {
                    waiting = true;
                }
            }
        }
        (moved, waiting)
    }

    /// Every data queue pair.
    pub fn all(&self) -> u32 {
        ((1u64 << self.n) - 1) as u32
    }

    /// Found failed and not yet failed over.
    #[inline]
    pub fn failed(&self) -> u32 {
        self.failed
    }

    /// Failed over (in ERR, drained).
    #[inline]
    pub fn dead(&self) -> u32 {
        self.dead
    }

    /// Failed, found here or failed over: nothing is to be posted on them.
    #[inline]
    pub fn down(&self) -> u32 {
        self.failed | self.dead
    }

    /// Named dead by the peer.
    pub fn peer_dead(&self) -> u32 {
        self.peer_dead
    }

    /// The peer named `mask` dead (its side of them is in ERR).
    pub fn peer_named(&mut self, mask: u32) {
        self.peer_dead |= mask & self.all();
    }

    /// Whether a failover is due on what this state knows: queue pairs found failed, or the
    /// peer naming ones not failed over here.
    #[inline]
    pub fn due(&self) -> bool {
        self.failed != 0 || self.peer_dead & !self.dead != 0
    }

    /// Queue pairs `mask` found failed.
    pub fn fail(&mut self, mask: u32) -> Failed {
        let new = mask & self.all() & !(self.failed | self.dead);
        if new == 0 {
            return Failed::Known;
        }
        self.failed |= new;
        if self.down() == self.all() {
            Failed::NoneLeft { new }
        } else {
            Failed::Over { new }
        }
    }

    /// A failed completion of queue pair `q`: counted for its drain's quiet. Whether `q` is
    /// failed over already (what comes from it is only its queue flushed).
    pub fn flushed(&mut self, q: usize) -> bool {
        if q < self.n {
            self.flushed[q] = self.flushed[q].saturating_add(1);
        }
        self.dead & (1 << q) != 0
    }

    /// A failed completion with `fault` from `src`, on a comm that fails over (`failover`: on,
    /// and a queue pair to fail over to) or not; `awaiting`: its queue pair waits for its port's
    /// verdict already. As net_ib's resiliency: a queue pair whose transport gave up or that was
    /// flushed fails over; so does one that could not send because its port is down
    /// (`port_down`: seen down, or down and up again since the comm began: a flap); any other
    /// status is a bug of one side. A failure a dead link causes may show its cause only a moment
    /// later (`cause_known`: the port's state or an event names it). `port_down` and
    /// `cause_known` are asked only where the answer matters (each looks at the device).
    pub fn on_fault(&mut self, fault: Fault, src: Source, failover: bool, awaiting: bool, port_down: impl Fn() -> bool, cause_known: impl Fn() -> bool) -> OnFault {
        if let Source::Data(q) = src {
            if self.flushed(q) || awaiting {
                return OnFault::Ignore;
            }
        }
        let op_err = failover && fault == Fault::LocalQpOp;
        let down = op_err && port_down();
        if op_err && !down && src != Source::Unknown {
            return OnFault::AwaitPort;
        }
        let recoverable = matches!(fault, Fault::RetryExceeded | Fault::Flushed) || down;
        if failover && recoverable && src != Source::Unknown {
            return OnFault::FailOver;
        }
        if matches!(fault, Fault::RetryExceeded | Fault::RnrRetryExceeded) && !cause_known() {
            return OnFault::AwaitCause;
        }
        OnFault::Die
    }

    /// The drain marker of queue pair `q` completed: everything posted on it before is polled.
    pub fn marker(&mut self, q: usize) {
        if q < self.n {
            self.marked |= 1 << q;
        }
    }

    /// Failed completions seen per queue pair.
    pub fn flushed_counts(&self) -> &[u32] {
        &self.flushed[..self.n]
    }

    /// Where drain `d` stands at `now`. Never waits: the shell asks again at its next call,
    /// after polling.
    pub fn drain_state(&self, d: &mut Drain, now: u64) -> Drained {
        if self.marked & d.mask == d.mask {
            return Drained::Yes;
        }
        let unmarked = d.mask & !self.marked;
        if self.moves & d.mask != 0 {
            // Not all in ERR yet (the device is busy): the drain's waits count from the last.
            d.start = now;
            d.quiet_since = now;
            return Drained::No;
        }
        let seen: u64 = (0..self.n).filter(|&q| d.mask & (1 << q) != 0).map(|q| self.flushed[q] as u64).sum();
        if seen != d.seen {
            d.seen = seen;
            d.quiet_since = now;
        }
        let over = |since: u64, ms: u64| now.saturating_sub(since) > ms;
        if over(d.start, MARKER_WAIT_MS) && over(d.quiet_since, QUIET_MS) {
            return Drained::Quiet { unmarked };
        }
        if over(d.start, DRAIN_WAIT_MS) {
            return Drained::TimedOut { unmarked };
        }
        Drained::No
    }

    /// Queue pairs `mask` are failed over (in ERR, drained) at `now`: recovery may take them
    /// back later.
    pub fn failed_over(&mut self, mask: u32, now: u64) {
        let mask = mask & self.all();
        self.dead |= mask;
        self.failed &= !mask;
        for q in (0..self.n).filter(|&q| mask & (1 << q) != 0) {
            self.failed_at[q] = now;
        }
    }

    /// Queue pairs `mask` are taken back (both sides reset and reconnected them): live, and
    /// their drain and flushed completions forgotten.
    pub fn taken_back(&mut self, mask: u32) {
        self.dead &= !mask;
        self.failed &= !mask;
        self.peer_dead &= !mask;
        self.marked &= !mask;
        for q in (0..self.n).filter(|&q| mask & (1 << q) != 0) {
            self.flushed[q] = 0;
        }
    }

    /// Recovery asks queue pair `q` back at `now` (one more attempt; the next, if this one
    /// fails, START_DELAY after it).
    pub fn asking(&mut self, q: usize, now: u64) {
        if q < self.n {
            self.attempts[q] += 1;
            self.failed_at[q] = now;
        }
    }

    /// Queue pair `q` is back in use: a later failure gets its own attempts.
    pub fn recovered(&mut self, q: usize) {
        if q < self.n {
            self.attempts[q] = 0;
        }
    }

    /// The failed-over queue pairs recovery may try to take back at `now`, of those whose port
    /// is up (`up`): recovery on, NCCL_IB_RESILIENCY_PORT_RECOVERY_START_DELAY since they failed
    /// (or since the last attempt), fewer than NCCL_IB_RESILIENCY_PORT_RECOVERY_ATTEMPTS_MAX
    /// attempts. `up` is a function so that a port is asked only about a candidate.
    pub fn recoverable(&self, now: u64, up: impl Fn(usize) -> bool) -> u32 {
        let r = &self.recovery;
        if !r.on || self.dead == 0 {
            return 0;
        }
        (0..self.n)
            .filter(|&q| self.dead & (1 << q) != 0 && now.saturating_sub(self.failed_at[q]) >= r.delay_ms && self.attempts[q] < r.attempts && up(q))
            .fold(0, |m, q| m | 1 << q)
    }

    /// The move of queue pair `q` to ERR succeeded.
    pub fn moved(&mut self, q: usize) {
        self.moves &= !(1 << q);
        if q < self.n {
            self.tries[q] = 0;
        }
    }

    /// The device refused to move queue pair `q` to ERR at `now` (`timed_out`: with
    /// ETIMEDOUT): tried again NCCL_IB_MQP_RETRY_SLEEP_MSEC × n later, up to
    /// NCCL_IB_MQP_RETRY_CNT times (net_ib sleeps that long inside the call; a failover cannot
    /// go on with the queue pair still sending, and a comm killed for a busy firmware loses the
    /// job a wait saves).
    pub fn refused(&mut self, q: usize, timed_out: bool, now: u64) -> Refused {
        let q = q.min(MAX_QPS - 1);
        let tries = self.tries[q];
        if tries < self.retry.count && (self.retry.all || timed_out) {
            self.tries[q] = tries + 1;
            self.due[q] = now + self.retry.sleep_ms.saturating_mul(tries as u64 + 1);
            self.moves |= 1 << q;
            return Refused::Later { first: tries == 0 };
        }
        self.moves &= !(1 << q);
        Refused::GiveUp { tries }
    }

    /// The moves to ERR whose next try is due at `now`.
    pub fn moves_due(&self, now: u64) -> u32 {
        if self.moves == 0 {
            return 0;
        }
        (0..self.n).filter(|&q| self.moves & (1 << q) != 0 && self.due[q] <= now).fold(0, |m, q| m | 1 << q)
    }
}

#[cfg(test)]
mod tests;
