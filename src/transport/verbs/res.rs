//! Owners of verbs resources, dropped in the order verbs requires (a QP before its CQ, an MR before
//! its memory; everything before the device's PD, which lives as long as the process), and queue
//! pairs that walk RESET → INIT → RTR → RTS as types.

use super::dev::{IbDevice, IbPort};
use super::fuse::MAX_MEMBERS;
use crate::error::{Error, Result};
use crate::sys::ib::*;
use crate::sys::verbs::{self, Verbs};
use std::alloc::Layout;
use std::ffi::c_int;

mod modify;

pub use modify::MqpRetry;
use modify::{modify, setup_retry, to_init, to_rtr, to_rts, IN_CALL};

fn v() -> &'static Verbs {
    verbs::get().expect("verbs resources exist only once libibverbs is loaded")
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// A completion queue.
pub struct Cq {
    raw: *mut ibv_cq,
    pub size: usize,
}

impl Cq {
    pub fn new(dev: &IbDevice, size: usize) -> Result<Cq> {
        let size = size.min(dev.max_cqe.max(1) as usize);
        // SAFETY: `create_cq` is ibv_create_cq, resolved from libibverbs at load with the C
        // signature declared in Verbs; dev.ctx is the device's context from ibv_open_device, never
        // closed (IbDevice has no Drop). ibv_create_cq(3) accepts a NULL cq_context and a NULL
        // completion channel, comp_vector 0 exists on every device, and cqe is clamped to max_cqe;
        // a NULL result is handled below.
        let raw = unsafe { (v().create_cq)(dev.ctx, size as c_int, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        if raw.is_null() {
            return Err(Error::system(format!("{}: ibv_create_cq({size}) failed: {}", dev.name, errno())));
        }
        Ok(Cq { raw, size })
    }

    pub fn raw(&self) -> *mut ibv_cq {
        self.raw
    }

    /// Poll up to `wc.len()` completions.
    #[inline(always)]
    pub fn poll(&self, wc: &mut [ibv_wc]) -> Result<usize> {
        // SAFETY: self.raw is the CQ ibv_create_cq returned in Cq::new (the field is private, so
        // that is the only source) and it is destroyed only in Drop, so it is live while &self is.
        // `wc` is an exclusive slice of wc.len() entries and the count passed never exceeds that
        // (the `as c_int` cast can only shrink it), which is what verbs::poll_cq requires.
        let n = unsafe { verbs::poll_cq(self.raw, wc.len() as c_int, wc.as_mut_ptr()) };
        if n < 0 {
            return Err(poll_cq_failed(n));
        }
        Ok(n as usize)
    }
}

#[cold]
#[inline(never)]
fn poll_cq_failed(n: c_int) -> Error {
    Error::system(format!("ibv_poll_cq failed ({n})"))
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: self.raw came from ibv_create_cq in Cq::new and is destroyed exactly once, here.
        // The owners declare their QPs before their CQ, so those are destroyed first; if one were
        // still attached, ibv_destroy_cq(3) fails (EBUSY) and leaves the CQ alive, which only leaks
        // it.
        let rc = unsafe { (v().destroy_cq)(self.raw) };
        if rc != 0 {
            log::warn!("NET/rivet: ibv_destroy_cq failed: {}", std::io::Error::from_raw_os_error(rc));
        }
    }
}

/// A queue pair in any state; destroys itself on drop.
pub struct Qp {
    raw: *mut ibv_qp,
    pub max_inline: u32,
}

impl Qp {
    pub fn raw(&self) -> *mut ibv_qp {
        self.raw
    }
    pub fn qpn(&self) -> u32 {
        // SAFETY: self.raw is the non-null QP from ibv_create_qp (Qp is built only in QpInit::new;
        // the field is private) and is destroyed only in Drop, so it is live while &self is; qp_num
        // is set at creation and never changes.
        unsafe { (*self.raw).qp_num }
    }
}

/// What an ECE call (`ibv_query_ece`, `ibv_set_ece`, resolved as `f`) made of `e` on queue pair
/// `qp`: Ok(None) where ECE is unsupported (EOPNOTSUPP, ENOTSUP, or a libibverbs older than
/// IBVERBS_1.10, `f` None), Err(errno) on any other failure.
fn ece_call(
    qp: &Qp,
    f: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_ece) -> c_int>,
    mut e: ibv_ece,
) -> std::result::Result<Option<crate::proto::verbs::Ece>, c_int> {
    let Some(f) = f else { return Ok(None) };
    // SAFETY: `f` is ibv_query_ece or ibv_set_ece, resolved with the C signature declared in
    // Verbs; qp.raw is a live QP (destroyed only in Drop, and borrowed here) and `e` a local
    // in/out parameter.
    match unsafe { f(qp.raw, &mut e) } {
        0 => Ok(Some(crate::proto::verbs::Ece { vendor_id: e.vendor_id, options: e.options, comp_mask: e.comp_mask })),
        rc if rc == libc::EOPNOTSUPP || rc == libc::ENOTSUP => Ok(None),
        rc => Err(rc),
    }
}

impl Qp {
    /// `ibv_query_ece`: the queue pair's ECE (see [`ece_call`]).
    pub fn query_ece(&self) -> std::result::Result<Option<crate::proto::verbs::Ece>, c_int> {
        ece_call(self, v().query_ece, ibv_ece { vendor_id: 0, options: 0, comp_mask: 0 })
    }

    /// `ibv_set_ece` (the queue pair in INIT): what the device accepted (see [`ece_call`]).
    pub fn set_ece(&self, want: crate::proto::verbs::Ece) -> std::result::Result<Option<crate::proto::verbs::Ece>, c_int> {
        ece_call(self, v().set_ece, ibv_ece { vendor_id: want.vendor_id, options: want.options, comp_mask: want.comp_mask })
    }
}

/// [`super::ece::Ops`] on queue pairs of one connection, with the device each is on (for the
/// once-per-device note of a device without ECE).
pub struct EceOn<'a> {
    qps: Vec<(&'a Qp, &'a IbPort)>,
}

impl<'a> EceOn<'a> {
    /// Queue pair `q` of `qps` runs on member `q % ports.len()`.
    pub fn new(qps: impl Iterator<Item = &'a Qp>, ports: &[&'a IbPort]) -> EceOn<'a> {
        EceOn { qps: qps.enumerate().map(|(q, qp)| (qp, ports[super::fuse::member_of(q, ports.len())])).collect() }
    }
}

impl super::ece::Ops for EceOn<'_> {
    fn query(&mut self, q: usize) -> std::result::Result<Option<crate::proto::verbs::Ece>, c_int> {
        let (qp, port) = self.qps[q];
        ece_unless_unsupported(port, || qp.query_ece(), if v().query_ece.is_none() { "libibverbs has no ibv_query_ece" } else { "ibv_query_ece: not supported" })
    }
    fn set(&mut self, q: usize, e: crate::proto::verbs::Ece) -> std::result::Result<Option<crate::proto::verbs::Ece>, c_int> {
        let (qp, port) = self.qps[q];
        ece_unless_unsupported(port, || qp.set_ece(e), if v().set_ece.is_none() { "libibverbs has no ibv_set_ece" } else { "ibv_set_ece: not supported" })
    }
}

/// `call`, unless `port`'s device already said it has no ECE (one system call per queue pair
/// saved on every later connection); its first "not supported" is remembered and logged once.
fn ece_unless_unsupported(
    port: &IbPort,
    call: impl FnOnce() -> std::result::Result<Option<crate::proto::verbs::Ece>, c_int>,
    why: &str,
) -> std::result::Result<Option<crate::proto::verbs::Ece>, c_int> {
    use std::sync::atomic::Ordering::Relaxed;
    if port.dev.no_ece.load(Relaxed) {
        return Ok(None);
    }
    let r = call();
    if let Ok(None) = r {
        port.dev.no_ece.store(true, Relaxed);
        super::ece::note_unsupported(&port.dev.name, why);
    }
    r
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: self.raw came from ibv_create_qp and is destroyed exactly once, here, and not
        // used afterwards. ibv_destroy_qp(3) waits for any unacked async event on it;
        // IbDevice::poll_events acks every event it takes.
        let rc = unsafe { (v().destroy_qp)(self.raw) };
        if rc != 0 {
            log::warn!("NET/rivet: ibv_destroy_qp failed: {}", std::io::Error::from_raw_os_error(rc));
        }
    }
}

/// Queue sizes of a new QP.
#[derive(Debug, Clone, Copy)]
pub struct QpCaps {
    pub send_wr: u32,
    pub recv_wr: u32,
    pub send_sge: u32,
    pub inline: u32,
}

/// What the far end of a queue pair told us about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteQp {
    pub qpn: u32,
    pub lid: u16,
    pub gid: [u8; 16],
    pub mtu: u32,
    /// Use a global route (RoCE, or IB across subnets).
    pub global: bool,
}

/// Path settings both directions agree on.
#[derive(Debug, Clone, Copy)]
pub struct PathParams {
    pub mtu: u32,
    pub tc: u8,
    pub sl: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
}

/// A QP in INIT: created and bound to its port; it can take receive work requests.
pub struct QpInit(Qp);
/// Ready to receive.
pub struct QpRtr(Qp);
/// Ready to send: the only state the data path sees.
///
/// A queue pair walks RESET → INIT → RTR → RTS as types, each step consuming the one before, and
/// only a `QpRts` takes work requests:
///
/// ```no_run
/// use nccl_net_rivet::transport::verbs::{dev::IbPort, recv::post_recvs, res::{PathParams, QpInit, RemoteQp}};
/// fn connect(q: QpInit, port: &IbPort, peer: &RemoteQp, p: &PathParams) -> Option<()> {
///     let rts = q.rtr(port, peer, p).ok()?.rts(port, p).ok()?;
///     post_recvs(&rts, 1).ok()
/// }
/// ```
///
/// Posting on a queue pair that is not connected does not compile:
///
/// ```compile_fail
/// use nccl_net_rivet::transport::verbs::{recv::post_recvs, res::QpInit};
/// fn post(q: &QpInit) {
///     let _ = post_recvs(q, 1);
/// }
/// ```
///
/// Nor does skipping RTR:
///
/// ```compile_fail
/// use nccl_net_rivet::transport::verbs::{dev::IbPort, res::{PathParams, QpInit}};
/// fn skip(q: QpInit, port: &IbPort, p: &PathParams) {
///     let _ = q.rts(port, p);
/// }
/// ```
///
/// Nor using a state after the step that consumed it:
///
/// ```compile_fail
/// use nccl_net_rivet::transport::verbs::{dev::IbPort, res::{PathParams, QpInit, RemoteQp}};
/// fn reuse(q: QpInit, port: &IbPort, peer: &RemoteQp, p: &PathParams) {
///     let _rtr = q.rtr(port, peer, p);
///     let _ = q.qp();
/// }
/// ```
///
/// Nor making a connected queue pair out of a bare one:
///
/// ```compile_fail
/// use nccl_net_rivet::transport::verbs::res::{Qp, QpRts};
/// fn forge(q: Qp) -> QpRts {
///     QpRts(q)
/// }
/// ```
pub struct QpRts(Qp);

impl QpInit {
    /// Create an RC QP on `port` with both queues on `cq` and move it to INIT with `access`.
    pub fn new(port: &IbPort, cq: &Cq, caps: QpCaps, access: u32, pkey_index: u16) -> Result<QpInit> {
        let dev = &port.dev;
        let mut want = caps;
        let max_wr = dev.max_qp_wr.max(1) as u32;
        want.send_wr = want.send_wr.min(max_wr);
        want.recv_wr = want.recv_wr.min(max_wr);
        // SAFETY: ibv_qp_init_attr is repr(C) of raw pointers (NULL is valid), integers and c_uint
        // enum aliases, so all-zero is a valid value; it also leaves qp_context and srq NULL and
        // sq_sig_all 0, as intended.
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = cq.raw;
        attr.recv_cq = cq.raw;
        attr.qp_type = IBV_QPT_RC;
        attr.cap = ibv_qp_cap {
            max_send_wr: want.send_wr,
            max_recv_wr: want.recv_wr,
            max_send_sge: want.send_sge,
            max_recv_sge: 1,
            max_inline_data: want.inline,
        };
        // SAFETY: `create_qp` is ibv_create_qp, resolved with the C signature declared in Verbs;
        // dev.pd was allocated on the device's context and is never deallocated, and `attr` is a
        // local ibv_qp_init_attr whose send_cq and recv_cq are the live CQ `cq`, made on the same
        // context, with srq NULL. ibv_create_qp(3) writes the granted capabilities back into
        // attr.cap; NULL is handled below.
        let mut raw = unsafe { (v().create_qp)(dev.pd, &mut attr) };
        if raw.is_null() && want.inline > 0 {
            // Some providers have no inline support: retry without it.
            attr.cap.max_inline_data = 0;
            // SAFETY: as above: the same live PD and CQ, and the same local init attributes with
            // max_inline_data now 0.
            raw = unsafe { (v().create_qp)(dev.pd, &mut attr) };
        }
        if raw.is_null() {
            return Err(Error::system(format!(
                "{}:{}: ibv_create_qp (RC, {} send / {} recv WRs) failed: {}",
                dev.name,
                port.port,
                want.send_wr,
                want.recv_wr,
                errno()
            )));
        }
        let qp = Qp { raw, max_inline: attr.cap.max_inline_data };
        to_init(&qp, port, access, pkey_index, setup_retry())?;
        Ok(QpInit(qp))
    }

    pub fn qp(&self) -> &Qp {
        &self.0
    }

    /// Connect to the remote QP: INIT → RTR.
    pub fn rtr(self, port: &IbPort, remote: &RemoteQp, p: &PathParams) -> Result<QpRtr> {
        to_rtr(&self.0, port, remote, p, setup_retry())?;
        Ok(QpRtr(self.0))
    }

    /// A queue pair whose member (here or at the peer) is down at setup: left in INIT (RTR
    /// would fail there, or wait on an address that does not answer) and held as the comm holds
    /// the others, found failed from the start. Only receives (INIT takes them) and, once the
    /// failover has moved it to ERR, its drain marker are posted on it; recovery reconnects it
    /// (RESET, INIT, RTR, RTS) when the port is up again, as one that failed.
    pub fn parked(self) -> QpRts {
        QpRts(self.0)
    }
}

impl QpRtr {
    /// RTR → RTS with the retry settings.
    pub fn rts(self, port: &IbPort, p: &PathParams) -> Result<QpRts> {
        to_rts(&self.0, port, p, setup_retry())?;
        Ok(QpRts(self.0))
    }
}

/// How a connected queue pair was connected: what taking it back after a failover connects it
/// to again.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    pub remote: RemoteQp,
    pub params: PathParams,
    pub access: u32,
    pub pkey_index: u16,
    /// The ECE the queue pair was connected with (set again, as net_ib's restore does).
    pub ece: Option<crate::proto::verbs::Ece>,
}

impl QpRts {
    pub fn qp(&self) -> &Qp {
        &self.0
    }

    /// Take a failed queue pair back (failover recovery): RESET (its queues emptied), INIT and
    /// RTR towards the same remote queue pair as before, packet numbers from 0 as the peer's
    /// new incarnation uses: it can receive again; `back_to_rts` lets it send.
    pub fn reset_to_rtr(&self, port: &IbPort, l: &Link) -> Result<()> {
        // SAFETY: ibv_qp_attr is plain C data (see `to_init`); only the state is read for this mask.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = IBV_QPS_RESET;
        modify(&self.0, &mut a, IBV_QP_STATE, "RESET", port, IN_CALL)?;
        to_init(&self.0, port, l.access, l.pkey_index, IN_CALL)?;
        if let Some(e) = l.ece {
            self.0.set_ece(e).map_err(|rc| {
                Error::system(format!(
                    "{}:{}: setting ECE on QP {} again failed: {}",
                    port.dev.name,
                    port.port,
                    self.0.qpn(),
                    std::io::Error::from_raw_os_error(rc)
                ))
            })?;
        }
        to_rtr(&self.0, port, &l.remote, &l.params, IN_CALL)
    }

    /// The second half of taking a queue pair back: RTR → RTS.
    pub fn back_to_rts(&self, port: &IbPort, l: &Link) -> Result<()> {
        to_rts(&self.0, port, &l.params, IN_CALL)
    }

    /// Move a failed queue pair to ERR, once (nothing more arrives through it, and every work
    /// request on it, and any posted after, completes flushed): refused, the errno and the
    /// error. A failover tries again at later calls (`Common::move_to_err`), never sleeping.
    pub fn to_err(&self, port: &IbPort) -> std::result::Result<(), (c_int, Error)> {
        modify::to_err_once(&self.0, port)
    }

    /// RESET, once, without a retry: a queue pair recovery reset and could not take back (the
    /// peer's side stayed down), from inside `test`. RESET discards the receives posted on it
    /// without a completion each (ERR would flush them into the CQ, every attempt); the next
    /// attempt starts from RESET as from ERR.
    pub fn to_reset(&self, port: &IbPort) -> Result<()> {
        // SAFETY: ibv_qp_attr is plain C data (see `rtr`); only the state is read for this mask.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = IBV_QPS_RESET;
        modify(&self.0, &mut a, IBV_QP_STATE, "RESET", port, IN_CALL)
    }

}

/// A registered memory region owned outside the cache (FIFOs, scratch).
pub struct Mr {
    raw: *mut ibv_mr,
}

impl Mr {
    pub fn lkey(&self) -> u32 {
        // SAFETY: self.raw is the non-null MR ibv_reg_mr returned in `reg_mr` (the field is
        // private, so that is the only way to make an Mr) and it is deregistered only in Drop, so
        // it is live while &self is; lkey is set at registration and never changes.
        unsafe { (*self.raw).lkey }
    }
    pub fn rkey(&self) -> u32 {
        // SAFETY: as in lkey: self.raw is a live MR from ibv_reg_mr, deregistered only in Drop;
        // rkey is set at registration and never changes.
        unsafe { (*self.raw).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: self.raw came from ibv_reg_mr in `reg_mr` and is deregistered exactly once,
        // here. RegBuf declares `mrs` before `buf`, so this runs before the memory under it is
        // freed.
        let rc = unsafe { (v().dereg_mr)(self.raw) };
        if rc != 0 {
            log::warn!("NET/rivet: ibv_dereg_mr failed: {}", std::io::Error::from_raw_os_error(rc));
        }
    }
}

/// Zeroed, page-aligned host memory.
pub struct HostBuf {
    ptr: *mut u8,
    layout: Layout,
}

impl HostBuf {
    pub fn new(len: usize) -> HostBuf {
        // Checked: an unchecked rounding of a size near usize::MAX would wrap to 0 in release builds.
        let size = len.max(1).checked_next_multiple_of(4096).expect("buffer size");
        let layout = Layout::from_size_align(size, 4096).expect("buffer layout");
        // SAFETY: alloc_zeroed needs a layout of non-zero size: len.max(1) rounded up to a multiple
        // of 4096 (checked above) is at least 4096. A NULL result is handled below.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        HostBuf { ptr, layout }
    }
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.layout.size()
    }
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // SAFETY: self.ptr was returned by alloc_zeroed with exactly self.layout (non-null, checked
        // in new) and is freed exactly once, here. An MR over it is deregistered first when both
        // sit in a RegBuf (`mr` is declared before `buf`).
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// Host memory with its registrations, one per member of the device (one for a physical
/// device); the MRs are released before the memory.
pub struct RegBuf {
    pub mrs: Vec<Mr>,
    pub buf: HostBuf,
}

fn reg_mr(dev: &IbDevice, buf: &HostBuf, access: u32) -> Result<Mr> {
    // SAFETY: `reg_mr` is ibv_reg_mr, resolved with the C signature declared in Verbs; dev.pd was
    // allocated on the device's context and is never deallocated. [buf.ptr(), buf.ptr() +
    // buf.len()) is a live heap allocation owned by `buf`, which the caller keeps in the same
    // RegBuf as the MR, freed only after the MR is deregistered (field order). NULL is handled
    // below.
    let raw = unsafe { (v().reg_mr)(dev.pd, buf.ptr() as *mut _, buf.len(), access as c_int) };
    if raw.is_null() {
        return Err(Error::system(format!(
            "{}: registering {} bytes of host memory failed: {}{}",
            dev.name,
            buf.len(),
            errno(),
            super::dev::memlock_hint()
        )));
    }
    Ok(Mr { raw })
}

impl RegBuf {
    /// `len` bytes of zeroed host memory registered on each of `devs`.
    pub fn new(devs: &[&IbDevice], len: usize, access: u32) -> Result<RegBuf> {
        let buf = HostBuf::new(len);
        let mrs = devs.iter().map(|d| reg_mr(d, &buf, access)).collect::<Result<Vec<_>>>()?;
        Ok(RegBuf { mrs, buf })
    }
    pub fn addr(&self) -> u64 {
        self.buf.ptr() as u64
    }

    /// One registration (per member) carved into pieces of the given lengths, each 64-byte
    /// aligned (one MR and one system call for several buffers of the same access, and no page
    /// rounding per piece).
    /// The pieces name memory of the RegBuf: keep it until they are no longer used.
    pub fn carve<const N: usize>(devs: &[&IbDevice], lens: [usize; N], access: u32) -> Result<(RegBuf, [Part; N])> {
        let (offs, end) = pieces(lens);
        let r = RegBuf::new(devs, end, access)?;
        let keys = r.keys();
        // SAFETY: each offset plus its length is within the `end` bytes the buffer holds.
        let parts = std::array::from_fn(|i| Part { ptr: unsafe { r.buf.ptr().add(offs[i]) }, len: lens[i], keys });
        Ok((r, parts))
    }

    /// The (lkey, rkey) of its registration on each member.
    pub fn keys(&self) -> [(u32, u32); MAX_MEMBERS] {
        let mut keys = [(0u32, 0u32); MAX_MEMBERS];
        for (k, m) in keys.iter_mut().zip(&self.mrs) {
            *k = (m.lkey(), m.rkey());
        }
        keys
    }
}

/// Pieces of the given lengths laid end to end, each 64-byte aligned: their offsets and the
/// bytes they take in all.
pub fn pieces<const N: usize>(lens: [usize; N]) -> ([usize; N], usize) {
    let mut offs = [0usize; N];
    let mut end = 0;
    for (o, l) in offs.iter_mut().zip(lens) {
        *o = end;
        end = (end + l).next_multiple_of(64);
    }
    (offs, end)
}

/// A piece of a registered region ([`RegBuf::carve`]): its address and its keys on each member.
#[derive(Clone, Copy)]
pub struct Part {
    ptr: *mut u8,
    len: usize,
    keys: [(u32, u32); MAX_MEMBERS],
}

impl Part {
    /// A piece of memory registered some other way (a simulated NIC's): `len` bytes at `ptr`,
    /// with the (lkey, rkey) of each member.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` is memory that stays valid and registered under those keys for as long
    /// as the connection using the piece lives.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize, keys: [(u32, u32); MAX_MEMBERS]) -> Part {
        Part { ptr, len, keys }
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The key on member 0 (a physical device's only one).
    pub fn lkey(&self) -> u32 {
        self.keys[0].0
    }
    pub fn rkey(&self) -> u32 {
        self.keys[0].1
    }
    pub fn lkey_on(&self, m: usize) -> u32 {
        self.keys[m].0
    }
    pub fn rkey_on(&self, m: usize) -> u32 {
        self.keys[m].1
    }
}

// SAFETY: each owns its verbs object (or memory) alone and frees it in Drop; libibverbs objects
// may be used from any thread, and rivet uses each from one thread at a time (under its comm's
// lock).
unsafe impl Send for Cq {}
// SAFETY: as for Cq.
unsafe impl Send for Qp {}
// SAFETY: as for Cq.
unsafe impl Send for QpRts {}
// SAFETY: as for Cq.
unsafe impl Send for Mr {}
// SAFETY: a heap allocation owned alone, freed in Drop.
unsafe impl Send for HostBuf {}

