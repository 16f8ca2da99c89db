//! The version-independent core behind every exported `ncclNetPlugin_vN` table: the handle
//! tables, contexts, comms and requests, and the data-path dispatch (isend, irecv, iflush, test).
//! The devices ([`devices`]), connection setup ([`connect`]) and memory registration ([`mr`]) have
//! their own files. The ABI shims in `abi/` convert argument types and call these functions
//! inside the FFI boundary.

mod connect;
mod devices;
mod mr;
pub mod profile;

pub use connect::{accept, close_listen, connect, listen};
pub use devices::{devices_table, init, make_vdevice, ndevices, properties, Props, VERSION};
pub use mr::{dereg_mr, reg_mr, MemKind, Mr};
pub use crate::transport::{Devices, PtrSupport};
use connect::ListenComm;
use devices::device;

use crate::error::{Error, Result};
use crate::gpu::staging::Staged;
use crate::handles::{Guard, Kind, Stale, Table, Token, MAX_REQUESTS};
use crate::transport::{Conn, DataPath, Lent, MrInfo, RecvBuf, MAX_RECVS};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

// ---------------------------------------------------------------------------------------------
// Handles. Every object handed to NCCL lives in a table of its kind and is named by a token (see
// `handles`): a stale or foreign handle is an error, found without reading through it.

static CTXS: Table<Ctx> = Table::new();
static LISTENS: Table<ListenComm> = Table::new();
static COMMS: Table<Comm> = Table::new();
static MRS: Table<Mr> = Table::new();

fn token(p: *mut c_void, kinds: &[Kind], what: &str) -> Result<Token> {
    match Token::from_ptr(p) {
        Some(t) if kinds.contains(&t.kind) => Ok(t),
        _ => Err(not_token(p, what)),
    }
}

/// What `token` says of a value that is no token of the kinds wanted.
#[cold]
#[inline(never)]
fn not_token(p: *mut c_void, what: &str) -> Error {
    if p.is_null() {
        Error::internal(format!("{what} is NULL"))
    } else {
        Error::internal(format!("{what} {p:p} is not a rivet {what}"))
    }
}

fn stale(what: &str, p: *mut c_void, s: Stale) -> Error {
    match s {
        Stale::Poisoned => Error::internal(format!("{what} {p:p} unusable after an earlier internal error")),
        Stale::Closed => Error::internal(format!("{what} {p:p} was already closed")),
        Stale::Foreign => Error::internal(format!("{what} {p:p} is not a rivet {what}")),
    }
}

fn full(what: &str) -> Error {
    Error::internal(format!("too many open {what}s"))
}

// ---------------------------------------------------------------------------------------------
// Contexts (v11/v12: one per NCCL communicator).

pub struct Ctx {
    pub comm_id: u64,
    pub traffic_class: i32,
}

static NCTX: AtomicU32 = AtomicU32::new(0);

pub fn ctx_new(comm_id: u64, traffic_class: i32) -> Result<*mut c_void> {
    let p = CTXS.insert(Kind::Ctx, Ctx { comm_id, traffic_class }).map_err(|_| full("context"))?.to_ptr();
    let n = NCTX.fetch_add(1, Ordering::Relaxed) + 1;
    log::trace!("NET/rivet: context {p:p} for communicator {comm_id:#x} ({n} open)");
    Ok(p)
}

fn unknown_ctx(ctx: *mut c_void) -> Error {
    Error::internal(format!("unknown plugin context {ctx:p} (not returned by init, or finalized)"))
}

/// Checks a context; returns its traffic class when the communicator set one.
pub fn ctx_check(ctx: *mut c_void) -> Result<Option<u8>> {
    let t = Token::from_ptr(ctx).filter(|t| t.kind == Kind::Ctx).ok_or_else(|| unknown_ctx(ctx))?;
    let tc = CTXS.get(t).map_err(|_| unknown_ctx(ctx))?.traffic_class;
    Ok(u8::try_from(tc).ok())
}

pub fn ctx_finalize(ctx: *mut c_void) -> Result<()> {
    let bad = || Error::internal(format!("finalize of an unknown or already finalized context {ctx:p}"));
    let t = Token::from_ptr(ctx).filter(|t| t.kind == Kind::Ctx).ok_or_else(bad)?;
    let c = CTXS.remove(t).map_err(|_| bad())?;
    let n = NCTX.fetch_sub(1, Ordering::Relaxed) - 1;
    log::trace!("NET/rivet: finalized context for communicator {:#x} ({n} open)", c.comm_id);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Comms and requests.

/// A send or receive comm: its device and its data path. NCCL holds a token for it, and one per
/// request slot (the same token with the slot in it).
pub struct Comm {
    send: bool,
    dev: i32,
    conn: Staged,
    /// NCCL profiler event handles of each request slot (empty unless NCCL passed a callback).
    events: Vec<Vec<usize>>,
    /// Requests posted, naming each in its profiler events.
    posted: u64,
    /// The queue pairs of the request being posted (kept to reuse its allocation: NCCL passes
    /// its callback whether or not a profiler is loaded, so this runs for every message).
    ev_buf: Vec<crate::transport::NetEvent>,
    /// The memory handle this comm's last isend or irecv named and its registration: NCCL
    /// passes the same few handles again and again, and a registration never changes while its
    /// handle is live (checked by generation, without the table's lock).
    last_mr: Option<(usize, Token, MrInfo)>,
    /// Where `test` has the transport write a finished request's sizes (kept, not made and
    /// zeroed at every call).
    sizes: [usize; MAX_RECVS],
}

impl Comm {
    /// Start the profiler events of request `slot` (one per buffer: its size and NCCL's handle),
    /// once NCCL has passed a callback (`profile::enabled`). Not inlined, nor
    /// `profile_stop_events`: ci/bench_instr.py counts the profiler's instructions under them.
    #[inline(never)]
    fn profile_start(&mut self, slot: Option<u32>, bufs: impl Iterator<Item = (usize, profile::Phandle)>) {
        let Some(slot) = slot else { return };
        self.posted += 1;
        if self.events.len() <= slot as usize {
            self.events.resize_with(slot as usize + 1, Vec::new);
        }
        let mut evs = std::mem::take(&mut self.ev_buf);
        for (size, ph) in bufs.filter(|(_, ph)| ph.0 != 0) {
            evs.clear();
            self.conn.net_events(size, &mut evs);
            profile::start(ph, self.posted, &evs, &mut self.events[slot as usize]);
        }
        self.ev_buf = evs;
    }

    /// Stop the profiler events of request `slot`, if it has any (inline: most have none).
    #[inline]
    fn profile_stop(&mut self, slot: u32) {
        if self.events.get(slot as usize).is_some_and(|h| !h.is_empty()) {
            self.profile_stop_events(slot as usize);
        }
    }

    #[inline(never)]
    fn profile_stop_events(&mut self, slot: usize) {
        profile::stop(&mut self.events[slot]);
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // Requests NCCL never saw done: their events end with the comm.
        for h in &mut self.events {
            profile::stop(h);
        }
    }
}

impl Comm {
    fn open(dev: i32, conn: DataPath, send: bool) -> Result<*mut c_void> {
        let d = device(dev)?;
        let label = format!("{} comm on dev {dev} ({})", if send { "send" } else { "recv" }, d.info().name.to_string_lossy());
        let conn = Staged::new(conn, send, label, d.registrar(send));
        if conn.capacity() > MAX_REQUESTS {
            return Err(Error::internal(format!("a comm with {} request slots (at most {MAX_REQUESTS})", conn.capacity())));
        }
        let kind = if send { Kind::SendComm } else { Kind::RecvComm };
        Ok(COMMS.insert(kind, Comm { send, dev, conn, events: Vec::new(), posted: 0, ev_buf: Vec::new(), last_mr: None, sizes: [0; MAX_RECVS] }).map_err(|_| full("comm"))?.to_ptr())
    }
}

fn kind_name(send: bool) -> &'static str {
    if send {
        "send comm"
    } else {
        "recv comm"
    }
}

/// The comm behind a send (`send`) or receive comm handle, held for this call: inline up to the
/// one compare-and-swap of a live comm, the errors out of line.
#[inline]
fn comm(p: *mut c_void, send: bool) -> Result<(Token, Guard<'static, Comm>)> {
    let kind = if send { Kind::SendComm } else { Kind::RecvComm };
    let Some(t) = Token::from_ptr(p).filter(|t| t.kind == kind) else { return Err(not_token(p, kind_name(send))) };
    match COMMS.get(t) {
        Ok(g) => Ok((t, g)),
        Err(e) => Err(stale_comm(p, send, e)),
    }
}

#[cold]
#[inline(never)]
fn stale_comm(p: *mut c_void, send: bool, e: Stale) -> Error {
    stale(kind_name(send), p, e)
}

/// Either kind of comm (memory registration accepts both).
fn any_comm(p: *mut c_void) -> Result<Guard<'static, Comm>> {
    let t = Token::from_ptr(p)
        .filter(|t| matches!(t.kind, Kind::SendComm | Kind::RecvComm))
        .ok_or_else(|| Error::internal(format!("unknown comm {p:p} (not a live send or receive comm)")))?;
    COMMS.get(t).map_err(|e| stale("comm", p, e))
}

/// The registration behind a memory handle NCCL passes on the data path, from the comm's
/// `last_mr` (looked up in the table when `mh` is another handle; kept while that handle is
/// live: deregistration changes its generation).
#[inline]
fn mr_info(last: &mut Option<(usize, Token, MrInfo)>, mh: *mut c_void) -> Result<Option<&MrInfo>> {
    if mh.is_null() {
        return Ok(None);
    }
    let hit = matches!(last, Some((p, t, _)) if *p == mh as usize && MRS.live(*t));
    if !hit {
        mr_lookup(last, mh)?;
    }
    Ok(last.as_ref().map(|(_, _, info)| info))
}

/// `mr_info` of a handle not cached: from the table, into the cache.
#[inline(never)]
fn mr_lookup(last: &mut Option<(usize, Token, MrInfo)>, mh: *mut c_void) -> Result<()> {
    let t = token(mh, &[Kind::Mr], "memory handle")?;
    let info = MRS.get(t).map_err(|e| stale("memory handle", mh, e))?.info;
    *last = Some((mh as usize, t, info));
    Ok(())
}

/// The registration of buffer `i` of a grouped call (`mh` may be NULL: no handles at all).
///
/// # Safety
/// A non-NULL `mh` holds at least `i + 1` handles.
unsafe fn mr_at(c: &mut Comm, mh: *mut *mut c_void, i: usize) -> Result<Option<MrInfo>> {
    if mh.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's promise.
    Ok(mr_info(&mut c.last_mr, unsafe { *mh.add(i) })?.copied())
}

fn request(t: Token, slot: Option<u32>) -> *mut c_void {
    slot.map_or(std::ptr::null_mut(), |s| t.request(s).to_ptr())
}

/// # Safety
/// Unless `size` is 0, `data` points to `size` bytes NCCL lends for this send: valid, and not
/// written, until `test` reports the request done or the comm is closed (NCCL's isend contract).
/// `ph` is NCCL's profiler handle for the request (v10+; NULL: no events).
pub unsafe fn isend(sc: *mut c_void, data: *mut c_void, size: usize, tag: i32, mh: *mut c_void, ph: *mut c_void) -> Result<*mut c_void> {
    let (t, mut c) = comm(sc, true)?;
    if data.is_null() && size > 0 {
        return Err(Error::internal(format!("isend of {size} bytes from a NULL buffer")));
    }
    // SAFETY: the caller's promise is Lent's.
    let data = unsafe { Lent::new(data as *mut u8, size) };
    let cm = &mut *c;
    let slot = cm.conn.isend(data, tag, mr_info(&mut cm.last_mr, mh)?)?;
    // NCCL passes its callback whether or not a profiler plugin is loaded, and a NULL handle
    // unless one is: only a handle has events to start.
    if !ph.is_null() && profile::enabled() {
        c.profile_start(slot, std::iter::once((size, profile::Phandle(ph as usize))));
    }
    if c.conn.has_pending_sends() {
        pending_add(t);
    }
    Ok(request(t, slot))
}

// A staged send is handed to the transport only after its device-to-host copy, which calls on
// its comm notice. NCCL tests every outstanding request, but a caller may post a send and then
// wait on a receive from a peer that needs that send first (NCCL's IB transport has the send on
// the wire by then). So comms with staged sends still waiting are listed here, and every `test`
// and `irecv` moves them on too.
static PENDING: Mutex<Vec<Token>> = Mutex::new(Vec::new());
static NPENDING: AtomicU32 = AtomicU32::new(0);

fn pending_add(c: Token) {
    let mut g = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    if !g.contains(&c) {
        g.push(c);
        NPENDING.store(g.len() as u32, Ordering::Release);
    }
}

fn pending_remove(c: Token) {
    let mut g = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    g.retain(|&x| x != c);
    NPENDING.store(g.len() as u32, Ordering::Release);
}

/// Move other comms' waiting staged sends on (comm locks only tried, never waited for). `except`
/// is the comm of the call being made, whose lock that call holds.
#[inline(always)]
fn progress_pending(except: Token) {
    // On every test and irecv: the common case (no staged send waits anywhere) stays inline.
    if NPENDING.load(Ordering::Acquire) != 0 {
        progress_pending_slow(except);
    }
}

#[cold]
#[inline(never)]
fn progress_pending_slow(except: Token) {
    let mut g = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    g.retain(|&t| {
        if t.same_object(except) {
            return true;
        }
        match COMMS.try_get(t) {
            Some(mut c) => {
                // An error stays with that comm's transport and surfaces at its own test.
                let _ = c.conn.progress_pending();
                c.conn.has_pending_sends()
            }
            // Held by another call (which moves it on itself), or closed (then it goes below).
            None => COMMS.live(t),
        }
    });
    NPENDING.store(g.len() as u32, Ordering::Release);
}

/// # Safety
/// `data` and `tags` must point to `n` elements each, and a non-NULL `mh` too (NULL is checked
/// here). Each buffer `data[i]` of `size_of(i)` bytes is lent for this receive as `Lent::new`
/// says (NCCL's irecv contract). A non-NULL `ph` holds NCCL's profiler handle of each buffer.
#[inline]
pub unsafe fn irecv(
    rc: *mut c_void,
    n: i32,
    data: *mut *mut c_void,
    size_of: impl Fn(usize) -> Result<usize>,
    tags: *mut i32,
    mh: *mut *mut c_void,
    ph: *mut *mut c_void,
) -> Result<*mut c_void> {
    if n < 1 || n as usize > MAX_RECVS {
        comm(rc, false)?;
        return Err(Error::internal(format!("irecv with n={n}: rivet accepts 1 to {MAX_RECVS} buffers (maxRecvs)")));
    }
    if data.is_null() || tags.is_null() {
        comm(rc, false)?;
        return Err(Error::internal("irecv with a NULL data or tags array"));
    }
    let (t, mut c) = comm(rc, false)?;
    // SAFETY (both branches): i < n, the caller's promise for `data`, `tags` and `mh`.
    let buf = |c: &mut Comm, i: usize| -> Result<RecvBuf> {
        let size = size_of(i)?;
        // SAFETY: as above.
        let (ptr, tag, mr) = unsafe { (*data.add(i) as *mut u8, *tags.add(i), mr_at(c, mh, i)?) };
        if ptr.is_null() && size > 0 {
            return Err(Error::internal(format!("irecv buffer {i} of {size} bytes is NULL")));
        }
        // SAFETY: the caller's promise for the buffer is Lent's.
        Ok(RecvBuf { buf: unsafe { Lent::new(ptr, size) }, tag, mr })
    };
    // One buffer (most receives) without making the other seven (each holds a registration).
    let (mut one, mut bufs);
    let posted: &mut [RecvBuf] = if n == 1 {
        one = [buf(&mut c, 0)?];
        &mut one
    } else {
        bufs = [RecvBuf::EMPTY; MAX_RECVS];
        for (i, b) in bufs.iter_mut().enumerate().take(n as usize) {
            *b = buf(&mut c, i)?;
        }
        &mut bufs[..n as usize]
    };
    // The transport takes the buffers: each stays Lent in its request until it is done.
    let slot = c.conn.irecv(posted)?;
    if !ph.is_null() && profile::enabled() {
        // SAFETY: a non-NULL `ph` holds `n` handles (the caller's promise), 1 <= n <= MAX_RECVS.
        let hs = unsafe { std::slice::from_raw_parts(ph as *const *mut c_void, n as usize) };
        // As in isend: NULL handles (NCCL without a profiler plugin) have no events to start.
        if hs.iter().any(|h| !h.is_null()) {
            // (Each buffer's size read again from NCCL's array: the transport took the buffers.)
            c.profile_start(slot, hs.iter().enumerate().map(|(i, &h)| (size_of(i).unwrap_or(0), profile::Phandle(h as usize))));
        }
    }
    drop(c);
    progress_pending(t);
    Ok(request(t, slot))
}

/// `iflush` after a receive completed: the transport decides whether there is anything to wait
/// for (TCP never; verbs issues its 1-byte RDMA READ). NULL request: nothing to wait for.
///
/// # Safety
/// Non-NULL `data` and `sizes` point to `n` elements each, and a non-NULL `mh` too; each buffer
/// is one of a receive that completed, lent again as `Lent::new` says until the flush is done.
pub unsafe fn iflush(rc: *mut c_void, n: i32, data: *mut *mut c_void, sizes: *mut i32, mh: *mut *mut c_void) -> Result<*mut c_void> {
    if n < 0 || n as usize > MAX_RECVS {
        return Err(Error::internal(format!("iflush with n={n}")));
    }
    let (t, mut c) = comm(rc, false)?;
    if n == 0 || data.is_null() || sizes.is_null() {
        return Ok(std::ptr::null_mut());
    }
    let mut bufs = [RecvBuf::EMPTY; MAX_RECVS];
    for (i, b) in bufs.iter_mut().enumerate().take(n as usize) {
        // SAFETY: i < n, the caller's promise.
        let (size, ptr, mr) = unsafe { ((*sizes.add(i)).max(0) as usize, *data.add(i) as *mut u8, mr_at(&mut c, mh, i)?) };
        // SAFETY: the caller's promise for the buffer is Lent's.
        *b = RecvBuf { buf: unsafe { Lent::new(ptr, size) }, tag: 0, mr };
    }
    let slot = c.conn.iflush(&mut bufs[..n as usize])?;
    Ok(request(t, slot))
}

/// `test`: progress the request's comm; when done, sizes (one per buffer) go to `sizes` if non-NULL.
///
/// # Safety
/// `done` points to an int, a non-NULL `sizes` to as many as the request has buffers (NCCL's
/// contract: the `n` of its irecv).
#[inline]
pub unsafe fn test(req: *mut c_void, done: *mut i32, sizes: *mut i32) -> Result<()> {
    if done.is_null() {
        return Err(Error::internal("test with a NULL done pointer"));
    }
    // SAFETY: `done` is not NULL, and points to an int (the caller's promise).
    unsafe { *done = 0 };
    let Some(t) = Token::request_from_ptr(req) else { return Err(not_request(req)) };
    let mut c = match COMMS.get(t) {
        Ok(c) => c,
        Err(e) => return Err(stale_request(req, e)),
    };
    let cm = &mut *c;
    match cm.conn.test(t.req, &mut cm.sizes) {
        Ok(None) => {
            drop(c);
            progress_pending(t);
        }
        Ok(Some(n)) => {
            c.profile_stop(t.req);
            // SAFETY: the caller's promise for `done`, and for `sizes` (non-NULL: at least the
            // request's `n` ints, n <= MAX_RECVS), memory of NCCL's that no comm lock guards.
            unsafe {
                if !sizes.is_null() {
                    for (i, s) in c.sizes.iter().enumerate().take(n) {
                        *sizes.add(i) = (*s).min(i32::MAX as usize) as i32;
                    }
                }
                *done = 1;
            }
            drop(c);
            progress_pending(t);
        }
        Err(e) => {
            let dev = c.dev;
            drop(c);
            progress_pending(t);
            return Err(on_dev(e, dev));
        }
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn not_request(req: *mut c_void) -> Error {
    if req.is_null() {
        Error::internal("test with a NULL request")
    } else {
        Error::internal(format!("test on {req:p}, which is not a rivet request"))
    }
}

#[cold]
#[inline(never)]
fn stale_request(req: *mut c_void, e: Stale) -> Error {
    match e {
        Stale::Closed => Error::internal(format!("test on request {req:p} of a comm that was already closed")),
        e => stale("request", req, e),
    }
}

/// A transport's error, with the device it happened on.
#[cold]
#[inline(never)]
fn on_dev(e: Error, dev: i32) -> Error {
    Error::new(e.kind, format!("{e} [dev {dev}]"))
}

pub fn close_comm(p: *mut c_void, send: bool) -> Result<()> {
    let what = if send { "closeSend" } else { "closeRecv" };
    let bad = || Error::internal(format!("{what} of an unknown or already closed comm {p:p}"));
    let t = Token::from_ptr(p).filter(|t| t.kind == if send { Kind::SendComm } else { Kind::RecvComm }).ok_or_else(bad)?;
    let c = COMMS.remove(t).map_err(|_| bad())?;
    pending_remove(t);
    // Its transport's resources go now; every token of it (its requests) is stale from here on.
    drop(c);
    Ok(())
}

