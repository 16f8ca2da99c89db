//! `ncclNetPlugin_v9`: NCCL 2.24–2.25 (size_t isend/irecv, forceFlush, virtual devices).

use super::common::*;
use super::ffi::{boundary, nonnull};
use super::types::*;
use std::ffi::c_int;

unsafe extern "C" fn init(logger: ncclDebugLogger_t) -> ncclResult_t {
    boundary("init", || start(logger, 9))
}

/// Also the v10 getProperties (identical layout).
pub(super) unsafe extern "C" fn get_properties(dev: c_int, p: *mut ncclNetProperties_v9_t) -> ncclResult_t {
    boundary("getProperties", || {
        // SAFETY: NCCL passes its properties struct of this version to fill; NULL is checked.
        let p = unsafe { &mut *nonnull(p, "props")? };
        let c = props(dev)?;
        *p = ncclNetProperties_v9_t {
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
        };
        Ok(())
    })
}

#[no_mangle]
pub static ncclNetPlugin_v9: Exported<ncclNet_v9_t> = Exported(ncclNet_v9_t {
    name: super::NAME.as_ptr(),
    init: Some(init),
    devices: Some(devices),
    getProperties: Some(get_properties),
    listen: Some(listen),
    connect: Some(connect_dev),
    accept: Some(accept_dev),
    regMr: Some(reg_mr),
    regMrDmaBuf: Some(reg_mr_dmabuf),
    deregMr: Some(dereg_mr),
    isend: Some(isend),
    irecv: Some(irecv),
    iflush: Some(iflush),
    test: Some(test),
    closeSend: Some(close_send),
    closeRecv: Some(close_recv),
    closeListen: Some(close_listen),
    getDeviceMr: None,
    irecvConsumed: None,
    makeVDevice: Some(make_vdevice_v9),
});
