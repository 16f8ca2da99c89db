//! Entry points whose C signature is the same in several ABI versions.

use super::ffi::{boundary, out};
use super::types::*;
use crate::error::{Error, Result};
use crate::plugin;
use std::ffi::{c_int, c_void};

pub unsafe extern "C" fn devices(ndev: *mut c_int) -> ncclResult_t {
    boundary("devices", || out(ndev, "ndev", plugin::ndevices()?))
}

pub unsafe extern "C" fn listen(dev: c_int, handle: *mut c_void, lc: *mut *mut c_void) -> ncclResult_t {
    boundary("listen", || {
        super::ffi::nonnull(lc, "listenComm")?;
        out(lc, "listenComm", plugin::listen(dev, handle)?)
    })
}

pub unsafe extern "C" fn ctx_listen(ctx: *mut c_void, dev: c_int, handle: *mut c_void, lc: *mut *mut c_void) -> ncclResult_t {
    boundary("listen", || {
        plugin::ctx_check(ctx)?;
        super::ffi::nonnull(lc, "listenComm")?;
        out(lc, "listenComm", plugin::listen(dev, handle)?)
    })
}

pub unsafe extern "C" fn connect(dev: c_int, handle: *mut c_void, sc: *mut *mut c_void) -> ncclResult_t {
    connect_tc(dev, handle, sc, None)
}

/// A connect with the communicator's traffic class (None: undefined).
pub unsafe fn connect_tc(dev: c_int, handle: *mut c_void, sc: *mut *mut c_void, tc: Option<u8>) -> ncclResult_t {
    boundary("connect", || {
        super::ffi::nonnull(sc, "sendComm")?;
        out(sc, "sendComm", plugin::connect(dev, handle, tc)?)
    })
}

/// The traffic class of NCCL's connect (v10) or init (v11+) config: NCCL_NET_TRAFFIC_CLASS_UNDEF
/// (-1) when the communicator set none, or when NCCL passed no config.
///
/// # Safety
/// A non-NULL `config` points to NCCL's ncclNetCommConfig_t.
pub unsafe fn traffic_class(config: *const ncclNetCommConfig_t) -> c_int {
    if config.is_null() {
        -1
    } else {
        // SAFETY: the caller's promise.
        unsafe { (*config).trafficClass }
    }
}

/// v7–v9: the device handle out-param is for device offload, which rivet does not offer; it is
/// left untouched.
pub unsafe extern "C" fn connect_dev(
    dev: c_int,
    handle: *mut c_void,
    sc: *mut *mut c_void,
    _dc: *mut *mut ncclNetDeviceHandle_t,
) -> ncclResult_t {
    connect(dev, handle, sc)
}

pub unsafe extern "C" fn ctx_connect(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    sc: *mut *mut c_void,
    _dc: *mut *mut ncclNetDeviceHandle_t,
) -> ncclResult_t {
    boundary("connect", || {
        let tc = plugin::ctx_check(ctx)?;
        super::ffi::nonnull(sc, "sendComm")?;
        out(sc, "sendComm", plugin::connect(dev, handle, tc)?)
    })
}

pub unsafe extern "C" fn accept(lc: *mut c_void, rc: *mut *mut c_void) -> ncclResult_t {
    boundary("accept", || {
        super::ffi::nonnull(rc, "recvComm")?;
        out(rc, "recvComm", plugin::accept(lc)?)
    })
}

pub unsafe extern "C" fn accept_dev(
    lc: *mut c_void,
    rc: *mut *mut c_void,
    _dc: *mut *mut ncclNetDeviceHandle_t,
) -> ncclResult_t {
    accept(lc, rc)
}

pub unsafe extern "C" fn reg_mr_int(comm: *mut c_void, data: *mut c_void, size: c_int, ty: c_int, mh: *mut *mut c_void) -> ncclResult_t {
    boundary("regMr", || {
        let size = usize::try_from(size).map_err(|_| Error::arg(format!("regMr with negative size {size}")))?;
        super::ffi::nonnull(mh, "mhandle")?;
        out(mh, "mhandle", plugin::reg_mr(comm, data, size, mem_kind(ty)?, None)?)
    })
}

pub unsafe extern "C" fn reg_mr(comm: *mut c_void, data: *mut c_void, size: usize, ty: c_int, mh: *mut *mut c_void) -> ncclResult_t {
    boundary("regMr", || {
        super::ffi::nonnull(mh, "mhandle")?;
        out(mh, "mhandle", plugin::reg_mr(comm, data, size, mem_kind(ty)?, None)?)
    })
}

/// The fd is used for the registration only: NCCL closes it when this returns.
pub unsafe extern "C" fn reg_mr_dmabuf(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ty: c_int,
    offset: u64,
    fd: c_int,
    mh: *mut *mut c_void,
) -> ncclResult_t {
    boundary("regMrDmaBuf", || {
        super::ffi::nonnull(mh, "mhandle")?;
        out(mh, "mhandle", plugin::reg_mr(comm, data, size, mem_kind(ty)?, Some((offset, fd)))?)
    })
}

pub unsafe extern "C" fn dereg_mr(comm: *mut c_void, mh: *mut c_void) -> ncclResult_t {
    boundary("deregMr", || plugin::dereg_mr(comm, mh))
}

fn send_size(size: i64) -> Result<usize> {
    usize::try_from(size).map_err(|_| Error::arg(format!("isend with negative size {size}")))
}

pub unsafe extern "C" fn isend_int(
    sc: *mut c_void,
    data: *mut c_void,
    size: c_int,
    tag: c_int,
    mh: *mut c_void,
    req: *mut *mut c_void,
) -> ncclResult_t {
    boundary("isend", || {
        super::ffi::nonnull(req, "request")?;
        out(req, "request", plugin::isend(sc, data, send_size(size as i64)?, tag, mh, std::ptr::null_mut())?)
    })
}

pub unsafe extern "C" fn isend(
    sc: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mh: *mut c_void,
    req: *mut *mut c_void,
) -> ncclResult_t {
    isend_p(sc, data, size, tag, mh, std::ptr::null_mut(), req)
}

pub unsafe extern "C" fn isend_p(
    sc: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mh: *mut c_void,
    ph: *mut c_void,
    req: *mut *mut c_void,
) -> ncclResult_t {
    boundary("isend", || {
        super::ffi::nonnull(req, "request")?;
        out(req, "request", plugin::isend(sc, data, size, tag, mh, ph)?)
    })
}

pub unsafe extern "C" fn irecv_int(
    rc: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    tags: *mut c_int,
    mh: *mut *mut c_void,
    req: *mut *mut c_void,
) -> ncclResult_t {
    boundary("irecv", || {
        super::ffi::nonnull(req, "request")?;
        super::ffi::nonnull(sizes, "sizes")?;
        let size_of = |i: usize| {
            let s = *sizes.add(i);
            usize::try_from(s).map_err(|_| Error::arg(format!("irecv buffer {i} with negative size {s}")))
        };
        out(req, "request", plugin::irecv(rc, n, data, size_of, tags, mh, std::ptr::null_mut())?)
    })
}

pub unsafe extern "C" fn irecv(
    rc: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mh: *mut *mut c_void,
    req: *mut *mut c_void,
) -> ncclResult_t {
    irecv_p(rc, n, data, sizes, tags, mh, std::ptr::null_mut(), req)
}

pub unsafe extern "C" fn irecv_p(
    rc: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mh: *mut *mut c_void,
    ph: *mut *mut c_void,
    req: *mut *mut c_void,
) -> ncclResult_t {
    boundary("irecv", || {
        // `*req` may hold NCCL_NET_OPTIONAL_RECV_COMPLETION on entry: a hint that the completion
        // may be skipped. rivet completes every receive, so it is read as nothing more.
        super::ffi::nonnull(req, "request")?;
        super::ffi::nonnull(sizes, "sizes")?;
        out(req, "request", plugin::irecv(rc, n, data, |i| Ok(*sizes.add(i)), tags, mh, ph)?)
    })
}

pub unsafe extern "C" fn iflush(
    rc: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    mh: *mut *mut c_void,
    req: *mut *mut c_void,
) -> ncclResult_t {
    boundary("iflush", || {
        super::ffi::nonnull(req, "request")?;
        out(req, "request", plugin::iflush(rc, n, data, sizes, mh)?)
    })
}

pub unsafe extern "C" fn test(req: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> ncclResult_t {
    boundary("test", || plugin::test(req, done, sizes))
}

pub unsafe extern "C" fn close_send(sc: *mut c_void) -> ncclResult_t {
    boundary("closeSend", || plugin::close_comm(sc, true))
}

pub unsafe extern "C" fn close_recv(rc: *mut c_void) -> ncclResult_t {
    boundary("closeRecv", || plugin::close_comm(rc, false))
}

pub unsafe extern "C" fn close_listen(lc: *mut c_void) -> ncclResult_t {
    boundary("closeListen", || plugin::close_listen(lc))
}

pub unsafe extern "C" fn finalize(ctx: *mut c_void) -> ncclResult_t {
    boundary("finalize", || plugin::ctx_finalize(ctx))
}


/// Properties shared by the v6 … v12 layouts: the core's [`plugin::Props`], which each version's
/// `getProperties` fills its struct from (with [`ptr_flags`] and the ABI's size limits).
pub fn props(dev: c_int) -> Result<plugin::Props> {
    plugin::properties(dev)
}

/// The members of device `c` as v9-v11 report them (at most 4: those versions' limit).
pub fn vprops_v9(c: &plugin::Props) -> ncclNetVDeviceProps_v9_t {
    let mut devs = [0; 4];
    let n = c.nvdevs.min(4);
    devs[..n].copy_from_slice(&c.vdevs[..n]);
    ncclNetVDeviceProps_v9_t { ndevs: n as c_int, devs }
}

/// The members of device `c` as v12 reports them.
pub fn vprops_v12(c: &plugin::Props) -> ncclNetVDeviceProps_v12_t {
    let mut devs = [0; 8];
    let n = c.nvdevs.min(8);
    devs[..n].copy_from_slice(&c.vdevs[..n]);
    ncclNetVDeviceProps_v12_t { ndevs: n as c_int, devs }
}

/// # Safety
/// `d` is NULL or NCCL's out-parameter for the new device's index.
unsafe fn make_vdevice(d: *mut c_int, ndevs: c_int, devs: &[c_int]) -> Result<()> {
    super::ffi::nonnull(d, "d")?;
    let n = usize::try_from(ndevs).ok().filter(|&n| n <= devs.len()).ok_or_else(|| {
        Error::usage(format!("makeVDevice with ndevs={ndevs}: this ncclNet version carries at most {} devices per virtual NIC", devs.len()))
    })?;
    // SAFETY: the caller's promise about `d`.
    unsafe { out(d, "d", plugin::make_vdevice(&devs[..n])?) }
}

/// `makeVDevice` of v9-v11 (4 members at most).
pub unsafe extern "C" fn make_vdevice_v9(d: *mut c_int, props: *mut ncclNetVDeviceProps_v9_t) -> ncclResult_t {
    boundary("makeVDevice", || {
        // SAFETY: NCCL passes its vProps of this version; NULL is checked.
        let p = unsafe { &*super::ffi::nonnull(props, "props")? };
        // SAFETY: `d` is NCCL's out-parameter (checked for NULL by `out`).
        unsafe { make_vdevice(d, p.ndevs, &p.devs) }
    })
}

/// `makeVDevice` of v12 (8 members at most).
pub unsafe extern "C" fn make_vdevice_v12(d: *mut c_int, props: *mut ncclNetVDeviceProps_v12_t) -> ncclResult_t {
    boundary("makeVDevice", || {
        // SAFETY: NCCL passes its vProps of this version; NULL is checked.
        let p = unsafe { &*super::ffi::nonnull(props, "props")? };
        // SAFETY: `d` is NCCL's out-parameter (checked for NULL by `out`).
        unsafe { make_vdevice(d, p.ndevs, &p.devs) }
    })
}

/// `ptrSupport`: NCCL_PTR_HOST always, CUDA and DMABUF as the device takes them.
pub fn ptr_flags(p: plugin::PtrSupport) -> c_int {
    NCCL_PTR_HOST | if p.cuda { NCCL_PTR_CUDA } else { 0 } | if p.dmabuf { NCCL_PTR_DMABUF } else { 0 }
}

/// `init` for every version: NCCL's logger first, so that everything after it logs through NCCL.
pub fn start(logger: ncclDebugLogger_t, abi: u32) -> Result<()> {
    super::logger::install(logger);
    plugin::init(abi)
}

/// The memory kind of a `regMr` pointer type.
fn mem_kind(ty: c_int) -> Result<plugin::MemKind> {
    match ty {
        NCCL_PTR_HOST => Ok(plugin::MemKind::Host),
        NCCL_PTR_CUDA => Ok(plugin::MemKind::Cuda),
        NCCL_PTR_DMABUF => Ok(plugin::MemKind::DmaBuf),
        _ => Err(Error::arg(format!("regMr with unknown pointer type {ty:#x} (NCCL_PTR_HOST=1, CUDA=2, DMABUF=4)"))),
    }
}
