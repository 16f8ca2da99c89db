//! Listen, connect and accept: non-blocking stages driven by NCCL's repeated calls, and the
//! reaping of connects NCCL gave up on.

use super::devices::device;
use super::{full, stale, Comm, LISTENS};
use crate::config;
use crate::error::{Error, Result};
use crate::handles::{Kind, Token};
use crate::proto::{self, Handle, HANDLE_SIZE};
use crate::transport::{self, oob, Dialing, Listening};
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard};
use crate::sys::clock::coarse_ms;


pub struct ListenComm {
    dev: i32,
    listening: Box<dyn Listening>,
}

/// A connect in progress, kept between NCCL's calls, and the device it runs on (NCCL's, or the
/// one subnet-aware routing chose): NCCL holds its pointer and a cookie in its handle buffer,
/// checked against [`STAGES`] before use.
pub(super) struct Stage(Box<dyn Dialing>, i32);

// The connect stages live: pointer and cookie.
static STAGES: Mutex<Option<HashMap<usize, u64>>> = Mutex::new(None);

fn stages() -> MutexGuard<'static, Option<HashMap<usize, u64>>> {
    STAGES.lock().unwrap_or_else(|p| p.into_inner())
}

fn stage_register(p: usize, cookie: u64) {
    stages().get_or_insert_with(HashMap::new).insert(p, cookie);
}

/// Remove stage `p` if it is live with `cookie`.
fn stage_unregister(p: usize, cookie: u64) -> bool {
    let mut g = stages();
    let m = g.get_or_insert_with(HashMap::new);
    if m.get(&p) == Some(&cookie) {
        m.remove(&p);
        true
    } else {
        false
    }
}

fn stage_live(p: usize, cookie: u64) -> bool {
    stages().as_ref().and_then(|m| m.get(&p)).copied() == Some(cookie)
}

/// # Safety
/// A non-NULL `handle` points to NCCL's handle buffer (NCCL_NET_HANDLE_MAXSIZE, 128 bytes), not
/// used elsewhere during the call.
unsafe fn handle_buf<'a>(handle: *mut c_void) -> Result<&'a mut [u8; HANDLE_SIZE]> {
    if handle.is_null() {
        return Err(Error::internal("handle is NULL"));
    }
    // SAFETY: the caller's promise; the buffer has no alignment requirement.
    Ok(unsafe { &mut *(handle as *mut [u8; HANDLE_SIZE]) })
}

/// A connector in progress, by its stage (registered in STAGES with its cookie): when NCCL last
/// called connect for it, and whom it connects to.
struct Connecting {
    cookie: u64,
    /// On the coarse clock (ms): a connect's every call reads it, and the precise clock is a
    /// system call on some hosts (a VM's clocksource), a cost every pending connect paid per poll.
    last: u64,
    peer: std::net::SocketAddr,
}

/// The connectors in progress, and when they were last looked at for reaping.
struct Connectors {
    by_stage: Option<HashMap<usize, Connecting>>,
    reaped_at: Option<u64>,
}

/// Every connect call holds this lock for its whole run, so reaping never frees a stage another
/// call is using. NCCL may give up on a peer after a few connect calls and never call again; the
/// stage's sockets would then stay open for the life of the process.
static CONNECTING: Mutex<Connectors> = Mutex::new(Connectors { by_stage: None, reaped_at: None });
/// How often connect and accept calls look for abandoned connectors (a listen always does): a
/// thousand connects in progress, each polled, would otherwise each look at all the others.
const REAP_EVERY: std::time::Duration = std::time::Duration::from_millis(100);
/// The stages reaped lately (pointer, cookie), so that a later call with such a handle is told why.
static REAPED: Mutex<VecDeque<(usize, u64)>> = Mutex::new(VecDeque::new());

fn connecting() -> MutexGuard<'static, Connectors> {
    CONNECTING.lock().unwrap_or_else(|p| p.into_inner())
}

/// Free the connectors NCCL has not called for RIVET_TIMEOUT (all but `keep`, the one being
/// called now), with a WARN each; unless `always`, only if the last look was REAP_EVERY ago.
fn reap_connectors(g: &mut Connectors, keep: Option<(usize, u64)>, now: u64, always: bool) {
    if !always && g.reaped_at.is_some_and(|t| now.saturating_sub(t) < REAP_EVERY.as_millis() as u64) {
        return;
    }
    g.reaped_at = Some(now);
    let t = config::get().timeout().as_millis() as u64;
    let Some(m) = g.by_stage.as_mut() else { return };
    let stale: Vec<usize> =
        m.iter().filter(|(s, c)| Some((**s, c.cookie)) != keep && now.saturating_sub(c.last) > t).map(|(s, _)| *s).collect();
    for stage in stale {
        let Some(c) = m.remove(&stage) else { continue };
        if stage_unregister(stage, c.cookie) {
            // SAFETY: the stage was registered by connect and just unregistered here, under the
            // lock every connect call holds: nobody else can reach it.
            drop(unsafe { Box::from_raw(stage as *mut Stage) });
        }
        log::warn!(
            "NET/rivet: connect to {}: abandoned: NCCL has not called connect for it for {:.0} s (more than RIVET_TIMEOUT={}s); its sockets are closed and a later call with its handle fails",
            c.peer,
            now.saturating_sub(c.last) as f64 / 1000.0,
            t / 1000
        );
        let mut r = REAPED.lock().unwrap_or_else(|p| p.into_inner());
        if r.len() >= 1024 {
            r.pop_front();
        }
        r.push_back((stage, c.cookie));
    }
}

/// # Safety
/// `handle` is NULL or points to NCCL's 128-byte handle buffer.
pub unsafe fn listen(dev: i32, handle: *mut c_void) -> Result<*mut c_void> {
    reap_connectors(&mut connecting(), None, coarse_ms(), true);
    let d = device(dev)?;
    // SAFETY: the caller's promise.
    let buf = unsafe { handle_buf(handle)? };
    let (listening, h) = d.listen()?;
    h.encode(buf);
    log::trace!("NET/rivet: listening on {} (dev {dev})", h.addr);
    let lc = ListenComm { dev, listening };
    Ok(LISTENS.insert(Kind::Listen, lc).map_err(|_| full("listen comm"))?.to_ptr())
}

/// Non-blocking connect: Ok(null) until the connection is up; NCCL calls again with the same handle.
/// # Safety
/// `handle` is NULL or points to NCCL's 128-byte handle buffer, the one of the earlier calls of
/// this connect (NCCL passes the same buffer until a comm comes back).
pub unsafe fn connect(dev: i32, handle: *mut c_void, traffic_class: Option<u8>) -> Result<*mut c_void> {
    device(dev)?;
    // SAFETY: the caller's promise.
    let buf = unsafe { handle_buf(handle)? };
    // A foreign or corrupted handle is reported as such, whatever its stage bytes hold.
    let h = Handle::decode(buf).map_err(|e| Error::usage(format!("connect: {e}")))?;
    let (sp, cookie) = proto::stage_get(buf);
    let mut g = connecting();
    // One look at the coarse clock per call (never a system call).
    let now = coarse_ms();
    reap_connectors(&mut g, Some((sp as usize, cookie)), now, false);
    let conn_ptr = if sp != 0 {
        if !stage_live(sp as usize, cookie) {
            let reaped = REAPED.lock().unwrap_or_else(|p| p.into_inner()).contains(&(sp as usize, cookie));
            if reaped {
                // The next call with this handle starts a new connect.
                proto::stage_set(buf, 0, 0);
                return Err(Error::remote(format!(
                    "connect to {}: this connect was abandoned (no call for more than RIVET_TIMEOUT) and its state released; the peer never completed the connection",
                    h.addr
                )));
            }
            return Err(Error::internal(
                "the handle carries a connect stage this process does not know (a handle reused across processes while its connect was in progress?)",
            ));
        }
        if let Some(c) = g.by_stage.as_mut().and_then(|m| m.get_mut(&(sp as usize))).filter(|c| c.cookie == cookie) {
            c.last = now;
        }
        sp as *mut Stage
    } else {
        let dev = by_subnet(dev, &h)?;
        let d = device(dev)?;
        if h.transport != d.wire() {
            return Err(Error::usage(format!(
                "connect: the peer listens with the {} transport but device {dev} here uses {}: every rank must see the same kind of network (set NCCL_IB_DISABLE=1 everywhere to use TCP)",
                transport::wire_name(h.transport),
                transport::wire_name(d.wire())
            )));
        }
        let c = d.connect(&h, traffic_class)?;
        let p = Box::into_raw(Box::new(Stage(c, dev)));
        let cookie = oob::random_u64();
        stage_register(p as usize, cookie);
        proto::stage_set(buf, p as u64, cookie);
        g.by_stage.get_or_insert_with(HashMap::new).insert(p as usize, Connecting { cookie, last: now, peer: h.addr });
        p
    };
    // SAFETY: the stage is live (just created, or found registered with its cookie), and only
    // connect calls, which all hold CONNECTING's lock (`g`), use or free it.
    let stage = unsafe { &mut *conn_ptr };
    let dev = stage.1;
    let r = stage.0.poll();
    let mut finish = |buf: &mut [u8; HANDLE_SIZE]| {
        let (_, cookie) = proto::stage_get(buf);
        stage_unregister(conn_ptr as usize, cookie);
        if let Some(m) = g.by_stage.as_mut() {
            if m.get(&(conn_ptr as usize)).is_some_and(|c| c.cookie == cookie) {
                m.remove(&(conn_ptr as usize));
            }
        }
        proto::stage_set(buf, 0, 0);
        // SAFETY: unregistered just above, under CONNECTING's lock: no other call can reach it.
        drop(unsafe { Box::from_raw(conn_ptr) });
    };
    match r {
        Ok(None) => Ok(std::ptr::null_mut()),
        Ok(Some(conn)) => {
            finish(buf);
            Comm::open(dev, conn, true)
        }
        Err(e) => {
            finish(buf);
            Err(e)
        }
    }
}

/// NCCL_IB_SUBNET_AWARE_ROUTING, at a connect's first call: NCCL's device if its RoCE members
/// are on the subnets of the listener's GIDs (in the handle), else the first device, physical or
/// virtual, that is; NCCL's where none is.
fn by_subnet(dev: i32, h: &Handle) -> Result<i32> {
    let cfg = crate::config::get();
    if !cfg.ib_subnet_aware || h.gids.is_empty() {
        return Ok(dev);
    }
    let n = super::ndevices()?;
    let gids: Vec<Vec<[u8; 16]>> = (0..n).map(|i| device(i).map(|d| d.roce_gids()).unwrap_or_default()).collect();
    let chosen = crate::transport::verbs::select::device_by_subnet(&h.gids, dev as usize, &gids, cfg.ib_subnet_prefix_len) as i32;
    if chosen != dev {
        log::info!(
            target: crate::log::INIT,
            "NET/rivet: connect to {}: device {dev} is not on the listener's subnet; using device {chosen} ({}), which is (NCCL_IB_SUBNET_AWARE_ROUTING, /{} for IPv4)",
            h.addr,
            device(chosen)?.info().name.to_string_lossy(),
            cfg.ib_subnet_prefix_len
        );
    }
    Ok(chosen)
}

/// Non-blocking accept: Ok(null) until a connection has fully arrived.
pub fn accept(lc: *mut c_void) -> Result<*mut c_void> {
    {
        let mut g = connecting();
        if g.by_stage.as_ref().is_some_and(|m| !m.is_empty()) {
            reap_connectors(&mut g, None, coarse_ms(), false);
        }
    }
    let t = Token::from_ptr(lc).filter(|t| t.kind == Kind::Listen).ok_or_else(|| Error::internal(format!("unknown listen comm {lc:p}")))?;
    let mut g = LISTENS.get(t).map_err(|e| stale("listen comm", lc, e))?;
    let dev = g.dev;
    match g.listening.accept()? {
        Some(conn) => Comm::open(dev, conn, false),
        None => Ok(std::ptr::null_mut()),
    }
}

pub fn close_listen(lc: *mut c_void) -> Result<()> {
    let bad = || Error::internal(format!("closeListen of an unknown or already closed listen comm {lc:p}"));
    let t = Token::from_ptr(lc).filter(|t| t.kind == Kind::Listen).ok_or_else(bad)?;
    drop(LISTENS.remove(t).map_err(|_| bad())?);
    Ok(())
}

