//! `ncclNetPlugin_v8`: NCCL 2.20–2.23 (size_t regMr, regIsGlobal).

use super::common::*;
use super::ffi::{boundary, nonnull};
use super::types::*;
use std::ffi::c_int;

unsafe extern "C" fn init(logger: ncclDebugLogger_t) -> ncclResult_t {
    boundary("init", || start(logger, 8))
}

unsafe extern "C" fn get_properties(dev: c_int, p: *mut ncclNetProperties_v8_t) -> ncclResult_t {
    boundary("getProperties", || {
        // SAFETY: NCCL passes its properties struct of this version to fill; NULL is checked.
        let p = unsafe { &mut *nonnull(p, "props")? };
        let c = props(dev)?;
        *p = ncclNetProperties_v8_t {
            name: c.name,
            pciPath: c.pci_path,
            guid: c.guid,
            ptrSupport: ptr_flags(c.ptr),
            regIsGlobal: c.reg_is_global as c_int,
            speed: c.speed,
            port: c.port,
            latency: c.latency,
            maxComms: c.max_comms,
            maxRecvs: c.max_recvs,
            netDeviceType: NCCL_NET_DEVICE_HOST,
            netDeviceVersion: 0,
        };
        Ok(())
    })
}

#[no_mangle]
pub static ncclNetPlugin_v8: Exported<ncclNet_v8_t> = Exported(ncclNet_v8_t {
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
    isend: Some(isend_int),
    irecv: Some(irecv_int),
    iflush: Some(iflush),
    test: Some(test),
    closeSend: Some(close_send),
    closeRecv: Some(close_recv),
    closeListen: Some(close_listen),
    getDeviceMr: None,
    irecvConsumed: None,
});
