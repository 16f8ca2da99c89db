//! The seam between a verbs connection's data path and the NIC: the handful of verbs calls the
//! shells make (post, poll, a queue pair's state after a failure, a flush queue pair), what
//! they ask of a port (its name, its state, its asynchronous events), and the copier of eager
//! payloads into GPU memory (a CUDA stream on hardware). libibverbs implements it
//! ([`Verbs`]); a simulated NIC can implement it too, so that the shells that run on hardware
//! are the ones a simulator drives. Everything else the shells do is plain memory: what the NIC
//! wrote (FIFO, ring, sizes) is read, and what it reads is written, through registered
//! buffers the shells only see as addresses and keys.

use super::dev::IbPort;
use super::res::{Cq, Link, QpRts};
use crate::error::Result;
use crate::gpu::cuda;
use crate::gpu::staging::{Copier, CudaCopier};
use crate::sys::ib::{ibv_recv_wr, ibv_send_wr, ibv_wc};
use crate::sys::verbs;

/// What a port tells a connection: its name for messages, its state and events.
pub trait NicPort: Sync + 'static {
    /// The device's name ("mlx5_0", "rxe0").
    fn dev_name(&self) -> &str;
    /// The port's number on its device.
    fn num(&self) -> u8;
    /// Read the device's asynchronous events now (or, `at`, at most every few ms).
    fn poll_events(&self);
    fn poll_events_at(&self, now_ms: u64);
    /// A PORT_ERR has come since the port's last PORT_ACTIVE.
    fn seen_down(&self) -> bool;
    /// The port's state as the device reports it now ("ACTIVE", "DOWN", ...).
    fn state(&self) -> Option<&'static str>;
    /// A fatal asynchronous event on one of `qpns` (its QPN and the event's name).
    fn qp_event(&self, qpns: impl Iterator<Item = u32> + Clone) -> Option<(u32, &'static str)>;
    /// PORT_ERR events seen so far (of the port, or of any port of its device): a count that
    /// only grows, so that a port that went down and up again between two looks is seen to
    /// have.
    fn downs(&self) -> u32;
    /// A fatal event of the whole device, as the comm's error.
    fn check_fatal(&self) -> Result<()>;
    /// Adaptive routing on the port's fabric (NCCL_IB_ADAPTIVE_ROUTING).
    fn adaptive_routing(&self) -> bool;
    /// The identity of the device the port's keys belong to (registrations name it).
    fn dev_id(&self) -> usize;
}

/// The verbs calls of a connection's data path.
pub trait Nic: Sized + 'static {
    /// A member port.
    type Port: NicPort;
    /// A connected queue pair (RTS; in ERR, or RESET to RTR, after a failure).
    type Qp;
    /// A completion queue.
    type Cq;
    /// Registered memory a connection owns (the shells use its pieces, addresses and keys).
    type Mem;
    /// What copies eager payloads out of the ring into GPUDirect receive buffers, finishing
    /// later (`Copier::fence`, `Copier::reached`): a CUDA stream of the buffer's GPU on hardware.
    type Gpu: Copier;

    /// The CUDA device whose memory `addr` is.
    fn gpu_of(addr: usize) -> Result<i32>;
    /// A copier into the memory of CUDA device `ordinal`.
    fn gpu_copier(ordinal: i32) -> Result<Self::Gpu>;

    fn qpn(qp: &Self::Qp) -> u32;
    /// Bytes a work request on `qp` may carry inline.
    fn max_inline(qp: &Self::Qp) -> u32;
    /// `ibv_post_send` of the chain at `wr`: 0 or an errno.
    ///
    /// # Safety
    /// `wr` heads a chain of valid work requests (each `next` and `sg_list` pointing at live
    /// memory for the call) whose scatter entries name memory registered with this NIC.
    unsafe fn post_send(qp: &Self::Qp, wr: *mut ibv_send_wr) -> i32;
    /// `ibv_post_recv` of the chain at `wr`: 0 or an errno.
    ///
    /// # Safety
    /// As for `post_send`, for receive work requests.
    unsafe fn post_recv(qp: &Self::Qp, wr: *mut ibv_recv_wr) -> i32;
    /// Poll up to `wc.len()` completions.
    fn poll(cq: &Self::Cq, wc: &mut [ibv_wc]) -> Result<usize>;
    /// Move a failed queue pair to ERR, once, without waiting (every work request on it, and any
    /// posted after, completes flushed). Refused: the errno (ETIMEDOUT while the device is busy,
    /// which NCCL_IB_MQP_RETRY_* try again at later calls) and the error.
    fn to_err(qp: &Self::Qp, port: &Self::Port) -> std::result::Result<(), (i32, crate::error::Error)>;
    /// Move a queue pair recovery reset but could not take back to RESET, once, without the
    /// retries of a change that times out (from inside `test`): what is posted on it is
    /// discarded without a completion.
    fn to_reset(qp: &Self::Qp, port: &Self::Port) -> Result<()>;
    /// Take a failed queue pair back: RESET, INIT, RTR towards the same remote one.
    fn reset_to_rtr(qp: &Self::Qp, port: &Self::Port, l: &Link) -> Result<()>;
    /// Its second half: RTR to RTS.
    fn back_to_rts(qp: &Self::Qp, port: &Self::Port, l: &Link) -> Result<()>;
    /// A loopback queue pair for flush reads on `port`, its completions in `cq`.
    fn flush_qp(port: &'static Self::Port, cq: &Self::Cq) -> Result<Self::Qp>;
    /// The time, in milliseconds from an arbitrary start, for every deadline of the data path
    /// (liveness checks, a failure's verdict, drains, recovery's delays): the coarse monotonic
    /// clock on hardware; a simulated NIC hands its own, so that a schedule replays exactly.
    #[inline(always)]
    fn now_ms() -> u64 {
        crate::sys::clock::coarse_ms()
    }
}

/// libibverbs.
pub struct Verbs;

impl NicPort for IbPort {
    fn dev_name(&self) -> &str {
        &self.dev.name
    }

    fn num(&self) -> u8 {
        self.port
    }

    fn poll_events(&self) {
        self.dev.poll_events()
    }

    fn poll_events_at(&self, now_ms: u64) {
        self.dev.poll_events_at(now_ms)
    }

    fn seen_down(&self) -> bool {
        self.dev.port_down(self.port)
    }

    fn state(&self) -> Option<&'static str> {
        self.dev.port_state(self.port)
    }

    fn qp_event(&self, qpns: impl Iterator<Item = u32> + Clone) -> Option<(u32, &'static str)> {
        self.dev.qp_event(qpns)
    }

    fn downs(&self) -> u32 {
        self.dev.port_errs()
    }

    fn check_fatal(&self) -> Result<()> {
        self.dev.check_fatal()
    }

    fn adaptive_routing(&self) -> bool {
        self.adaptive_routing
    }

    fn dev_id(&self) -> usize {
        &*self.dev as *const _ as usize
    }
}

impl Nic for Verbs {
    type Port = IbPort;
    type Qp = QpRts;
    type Cq = Cq;
    type Mem = super::pool::Held;
    type Gpu = CudaCopier;

    fn gpu_of(addr: usize) -> Result<i32> {
        cuda::pointer_ordinal(addr)
    }

    fn gpu_copier(ordinal: i32) -> Result<CudaCopier> {
        CudaCopier::new(ordinal, cuda::bus_id(ordinal)?)
    }

    #[inline]
    fn qpn(qp: &QpRts) -> u32 {
        qp.qp().qpn()
    }

    #[inline]
    fn max_inline(qp: &QpRts) -> u32 {
        qp.qp().max_inline
    }

    #[inline]
    unsafe fn post_send(qp: &QpRts, wr: *mut ibv_send_wr) -> i32 {
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is connected (QpRts) and lives as long as `qp`; the caller vouches for
        // the chain.
        unsafe { verbs::post_send(qp.qp().raw(), wr, &mut bad) }
    }

    #[inline]
    unsafe fn post_recv(qp: &QpRts, wr: *mut ibv_recv_wr) -> i32 {
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: as for post_send.
        unsafe { verbs::post_recv(qp.qp().raw(), wr, &mut bad) }
    }

    #[inline(always)]
    fn poll(cq: &Cq, wc: &mut [ibv_wc]) -> Result<usize> {
        cq.poll(wc)
    }

    fn to_err(qp: &QpRts, port: &IbPort) -> std::result::Result<(), (i32, crate::error::Error)> {
        qp.to_err(port)
    }

    fn to_reset(qp: &QpRts, port: &IbPort) -> Result<()> {
        qp.to_reset(port)
    }

    fn reset_to_rtr(qp: &QpRts, port: &IbPort, l: &Link) -> Result<()> {
        qp.reset_to_rtr(port, l)
    }

    fn back_to_rts(qp: &QpRts, port: &IbPort, l: &Link) -> Result<()> {
        qp.back_to_rts(port, l)
    }

    fn flush_qp(port: &'static IbPort, cq: &Cq) -> Result<QpRts> {
        super::Setup::flush_qp(port, cq)
    }
}
