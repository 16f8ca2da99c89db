//! `ncclNetPlugin_v6`: what NCCL 2.17/2.18 load (int sizes, no device handles).

use super::common::*;
use super::ffi::{boundary, nonnull};
use super::types::*;
use std::ffi::c_int;

unsafe extern "C" fn init(logger: ncclDebugLogger_t) -> ncclResult_t {
    boundary("init", || start(logger, 6))
}

unsafe extern "C" fn get_properties(dev: c_int, p: *mut ncclNetProperties_v6_t) -> ncclResult_t {
    boundary("getProperties", || {
        // SAFETY: NCCL passes its properties struct of this version to fill; NULL is checked.
        let p = unsafe { &mut *nonnull(p, "props")? };
        let c = props(dev)?;
        *p = ncclNetProperties_v6_t {
            name: c.name,
            pciPath: c.pci_path,
            guid: c.guid,
            ptrSupport: ptr_flags(c.ptr),
            speed: c.speed,
            port: c.port,
            latency: c.latency,
            maxComms: c.max_comms,
            maxRecvs: c.max_recvs,
        };
        Ok(())
    })
}

#[no_mangle]
pub static ncclNetPlugin_v6: Exported<ncclNet_v6_t> = Exported(ncclNet_v6_t {
    name: super::NAME.as_ptr(),
    init: Some(init),
    devices: Some(devices),
    getProperties: Some(get_properties),
    listen: Some(listen),
    connect: Some(connect),
    accept: Some(accept),
    regMr: Some(reg_mr_int),
    regMrDmaBuf: Some(reg_mr_dmabuf),
    deregMr: Some(dereg_mr),
    isend: Some(isend_int),
    irecv: Some(irecv_int),
    iflush: Some(iflush),
    test: Some(test),
    closeSend: Some(close_send),
    closeRecv: Some(close_recv),
    closeListen: Some(close_listen),
});
