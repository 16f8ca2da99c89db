//! `ncclNetPlugin_v10`: NCCL 2.26–2.27 (profiler callback, per-connection config).

use super::common::*;
use super::ffi::boundary;
use super::types::*;
use std::ffi::c_int;
use std::ffi::c_void;

unsafe extern "C" fn init(logger: ncclDebugLogger_t, prof: ncclProfilerCallback_t) -> ncclResult_t {
    boundary("init", || {
        super::profile::set_callback(prof);
        start(logger, 10)
    })
}

/// The traffic class in `config` (NCCL_NET_TRAFFIC_CLASS_UNDEF, -1, when the communicator set
/// none) is the RDMA queue pairs' when NCCL_IB_TC is unset, as in v11+; TCP ignores it.
unsafe extern "C" fn connect(
    dev: c_int,
    config: *mut ncclNetCommConfig_t,
    handle: *mut c_void,
    sc: *mut *mut c_void,
    _dc: *mut *mut ncclNetDeviceHandle_t,
) -> ncclResult_t {
    // SAFETY: a non-NULL config is NCCL's ncclNetCommConfig_t for this connection.
    connect_tc(dev, handle, sc, u8::try_from(unsafe { traffic_class(config) }).ok())
}

#[no_mangle]
pub static ncclNetPlugin_v10: Exported<ncclNet_v10_t> = Exported(ncclNet_v10_t {
    name: super::NAME.as_ptr(),
    init: Some(init),
    devices: Some(devices),
    getProperties: Some(super::v9::get_properties),
    listen: Some(listen),
    connect: Some(connect),
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
});
