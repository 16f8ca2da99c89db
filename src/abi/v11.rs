//! `ncclNetPlugin_v11`: NCCL 2.28–2.29 (per-communicator init/finalize).

use super::common::*;
use super::ffi::{boundary, nonnull};
use super::types::*;
use crate::plugin;
use std::ffi::c_int;
use std::ffi::c_void;

/// Called once per NCCL communicator: the device table is process-wide, the context per comm.
unsafe extern "C" fn init(
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut ncclNetCommConfig_t,
    logger: ncclDebugLogger_t,
    prof: ncclProfilerCallback_t,
) -> ncclResult_t {
    boundary("init", || {
        nonnull(ctx, "ctx")?;
        start(logger, 11)?;
        super::profile::set_callback(prof);
        // SAFETY: a non-NULL config is NCCL's ncclNetCommConfig_t for this communicator.
        let tc = unsafe { traffic_class(config) };
        let c = plugin::ctx_new(comm_id, tc)?;
        // SAFETY: `ctx` is NCCL's out-parameter, checked not NULL above.
        unsafe { *ctx = c };
        Ok(())
    })
}

unsafe extern "C" fn get_properties(dev: c_int, p: *mut ncclNetProperties_v11_t) -> ncclResult_t {
    boundary("getProperties", || {
        // SAFETY: NCCL passes its properties struct of this version to fill; NULL is checked.
        let p = unsafe { &mut *nonnull(p, "props")? };
        let c = props(dev)?;
        *p = ncclNetProperties_v11_t {
            name: c.name,
            pciPath: c.pci_path,
            guid: c.guid,
            ptrSupport: ptr_flags(c.ptr),
            regIsGlobal: c.reg_is_global as c_int,
            forceFlush: c.force_flush as c_int,
            speed: c.speed,
            port: c.port,
            latency: c.latency,
            maxComms: c.max_comms,
            maxRecvs: c.max_recvs,
            netDeviceType: NCCL_NET_DEVICE_HOST,
            netDeviceVersion: 0,
            vProps: vprops_v9(&c),
            maxP2pBytes: NCCL_MAX_NET_SIZE_BYTES,
            maxCollBytes: MAX_COLLNET_SIZE,
            maxMultiRequestSize: 1,
        };
        Ok(())
    })
}

#[no_mangle]
pub static ncclNetPlugin_v11: Exported<ncclNet_v11_t> = Exported(ncclNet_v11_t {
    name: super::NAME.as_ptr(),
    init: Some(init),
    devices: Some(devices),
    getProperties: Some(get_properties),
    listen: Some(ctx_listen),
    connect: Some(ctx_connect),
    accept: Some(accept_dev),
    regMr: Some(reg_mr),
    regMrDmaBuf: Some(reg_mr_dmabuf),
    deregMr: Some(dereg_mr),
    isend: Some(isend_p),
    irecv: Some(irecv_p),
    iflush: Some(iflush),
    test: Some(test),
    closeSend: Some(close_send),
    closeRecv: Some(close_recv),
    closeListen: Some(close_listen),
    getDeviceMr: None,
    irecvConsumed: None,
    makeVDevice: Some(make_vdevice_v9),
    finalize: Some(finalize),
    setNetAttr: None,
});
