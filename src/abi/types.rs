//! `#[repr(C)]` mirrors of NCCL's net-plugin types, v6 … v12 (reference: ncclnet-abi.md §3–§4).
//! Layouts are asserted in the tests at the bottom of this file and, for the C header, by tests/c/layout.c.
#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int, c_ulong, c_void};

pub type ncclResult_t = c_int;
pub const NCCL_SUCCESS: ncclResult_t = 0;
pub const NCCL_UNHANDLED_CUDA_ERROR: ncclResult_t = 1;
pub const NCCL_SYSTEM_ERROR: ncclResult_t = 2;
pub const NCCL_INTERNAL_ERROR: ncclResult_t = 3;
pub const NCCL_INVALID_ARGUMENT: ncclResult_t = 4;
pub const NCCL_INVALID_USAGE: ncclResult_t = 5;
pub const NCCL_REMOTE_ERROR: ncclResult_t = 6;
pub const NCCL_IN_PROGRESS: ncclResult_t = 7;

/// NCCL's name for a result code (`ncclSystemError`), as its headers spell it.
pub fn result_name(r: ncclResult_t) -> String {
    match r {
        NCCL_SUCCESS => "ncclSuccess".into(),
        NCCL_UNHANDLED_CUDA_ERROR => "ncclUnhandledCudaError".into(),
        NCCL_SYSTEM_ERROR => "ncclSystemError".into(),
        NCCL_INTERNAL_ERROR => "ncclInternalError".into(),
        NCCL_INVALID_ARGUMENT => "ncclInvalidArgument".into(),
        NCCL_INVALID_USAGE => "ncclInvalidUsage".into(),
        NCCL_REMOTE_ERROR => "ncclRemoteError".into(),
        NCCL_IN_PROGRESS => "ncclInProgress".into(),
        r => format!("ncclResult_t {r} (not a result NCCL defines)"),
    }
}

pub const NCCL_PTR_HOST: c_int = 0x1;
pub const NCCL_PTR_CUDA: c_int = 0x2;
pub const NCCL_PTR_DMABUF: c_int = 0x4;

pub const NCCL_NET_HANDLE_MAXSIZE: usize = 128;
pub const NCCL_NET_MAX_REQUESTS: usize = 32;
const _: () = assert!(NCCL_NET_MAX_REQUESTS == crate::proto::NCCL_INFLIGHT);
pub const NCCL_NET_OPTIONAL_RECV_COMPLETION: usize = 0x1;
pub const NCCL_MAX_NET_SIZE_BYTES: usize = 1 << 40;
pub const MAX_NET_SIZE: usize = 1 << 30;
pub const MAX_COLLNET_SIZE: usize = 512 << 20;
pub const NCCL_NET_ID_UNDEF: i16 = -1;

pub const NCCL_LOG_NONE: c_int = 0;
pub const NCCL_LOG_VERSION: c_int = 1;
pub const NCCL_LOG_WARN: c_int = 2;
pub const NCCL_LOG_INFO: c_int = 3;
pub const NCCL_LOG_ABORT: c_int = 4;
pub const NCCL_LOG_TRACE: c_int = 5;
pub const NCCL_INIT: c_ulong = 0x1;
pub const NCCL_NET: c_ulong = 0x10;

/// `void (*)(ncclDebugLogLevel, unsigned long flags, const char* file, int line, const char* fmt, ...)`
pub type ncclDebugLogger_t =
    Option<unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...)>;
/// `ncclResult_t (*)(void** eHandle, int type, void* pHandle, int64_t pluginId, void* extData)`
pub type ncclProfilerCallback_t =
    Option<unsafe extern "C" fn(*mut *mut c_void, c_int, *mut c_void, i64, *mut c_void) -> ncclResult_t>;

pub type ncclNetDeviceType = c_int;
pub const NCCL_NET_DEVICE_HOST: ncclNetDeviceType = 0;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetDeviceHandle_t {
    pub netDeviceType: ncclNetDeviceType,
    pub netDeviceVersion: c_int,
    pub handle: *mut c_void,
    pub size: usize,
    pub needsProxyProgress: c_int,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ncclNetVDeviceProps_v9_t {
    pub ndevs: c_int,
    pub devs: [c_int; 4],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ncclNetVDeviceProps_v12_t {
    pub ndevs: c_int,
    pub devs: [c_int; 8],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetCommConfig_t {
    pub trafficClass: c_int,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetCommAttr_t {
    pub maxConcurrentPeers: i32,
    pub minConcurrentPeers: i32,
    pub maxFlowsPerPeer: i32,
    pub minFlowsPerPeer: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetAttr_t {
    pub sendCommAttr: ncclNetCommAttr_t,
    pub recvCommAttr: ncclNetCommAttr_t,
    pub op: u32,
    pub algo: u32,
    pub proto: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetProperties_v6_t {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetProperties_v7_t {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: ncclNetDeviceType,
    pub netDeviceVersion: c_int,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetProperties_v8_t {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: ncclNetDeviceType,
    pub netDeviceVersion: c_int,
}

/// Also `ncclNetProperties_v10_t` (identical layout).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetProperties_v9_t {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub forceFlush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: ncclNetDeviceType,
    pub netDeviceVersion: c_int,
    pub vProps: ncclNetVDeviceProps_v9_t,
    pub maxP2pBytes: usize,
    pub maxCollBytes: usize,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetProperties_v11_t {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub forceFlush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: ncclNetDeviceType,
    pub netDeviceVersion: c_int,
    pub vProps: ncclNetVDeviceProps_v9_t,
    pub maxP2pBytes: usize,
    pub maxCollBytes: usize,
    pub maxMultiRequestSize: c_int,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetProperties_v12_t {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub forceFlush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: ncclNetDeviceType,
    pub netDeviceVersion: c_int,
    pub vProps: ncclNetVDeviceProps_v12_t,
    pub maxP2pBytes: usize,
    pub maxCollBytes: usize,
    pub maxMultiRequestSize: c_int,
    pub railId: i16,
    pub planeId: i16,
}

// Function-pointer shapes shared by several versions.
type Vp = *mut c_void;
type Vpp = *mut *mut c_void;
pub type DevicesFn = unsafe extern "C" fn(*mut c_int) -> ncclResult_t;
pub type ListenFn = unsafe extern "C" fn(c_int, Vp, Vpp) -> ncclResult_t;
pub type CtxListenFn = unsafe extern "C" fn(Vp, c_int, Vp, Vpp) -> ncclResult_t;
pub type RegMrIntFn = unsafe extern "C" fn(Vp, Vp, c_int, c_int, Vpp) -> ncclResult_t;
pub type RegMrFn = unsafe extern "C" fn(Vp, Vp, usize, c_int, Vpp) -> ncclResult_t;
pub type RegMrDmaBufFn = unsafe extern "C" fn(Vp, Vp, usize, c_int, u64, c_int, Vpp) -> ncclResult_t;
pub type DeregMrFn = unsafe extern "C" fn(Vp, Vp) -> ncclResult_t;
pub type IsendIntFn = unsafe extern "C" fn(Vp, Vp, c_int, c_int, Vp, Vpp) -> ncclResult_t;
pub type IrecvIntFn =
    unsafe extern "C" fn(Vp, c_int, Vpp, *mut c_int, *mut c_int, Vpp, Vpp) -> ncclResult_t;
pub type IsendFn = unsafe extern "C" fn(Vp, Vp, usize, c_int, Vp, Vpp) -> ncclResult_t;
pub type IrecvFn =
    unsafe extern "C" fn(Vp, c_int, Vpp, *mut usize, *mut c_int, Vpp, Vpp) -> ncclResult_t;
pub type IsendPFn = unsafe extern "C" fn(Vp, Vp, usize, c_int, Vp, Vp, Vpp) -> ncclResult_t;
pub type IrecvPFn =
    unsafe extern "C" fn(Vp, c_int, Vpp, *mut usize, *mut c_int, Vpp, Vpp, Vpp) -> ncclResult_t;
pub type IflushFn =
    unsafe extern "C" fn(Vp, c_int, Vpp, *mut c_int, Vpp, Vpp) -> ncclResult_t;
pub type TestFn = unsafe extern "C" fn(Vp, *mut c_int, *mut c_int) -> ncclResult_t;
pub type CloseFn = unsafe extern "C" fn(Vp) -> ncclResult_t;
pub type GetDeviceMrFn = unsafe extern "C" fn(Vp, Vp, Vpp) -> ncclResult_t;
pub type IrecvConsumedFn = unsafe extern "C" fn(Vp, c_int, Vp) -> ncclResult_t;
pub type AcceptDevFn = unsafe extern "C" fn(Vp, Vpp, *mut *mut ncclNetDeviceHandle_t) -> ncclResult_t;

#[repr(C)]
pub struct ncclNet_v6_t {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(ncclDebugLogger_t) -> ncclResult_t>,
    pub devices: Option<DevicesFn>,
    pub getProperties: Option<unsafe extern "C" fn(c_int, *mut ncclNetProperties_v6_t) -> ncclResult_t>,
    pub listen: Option<ListenFn>,
    pub connect: Option<unsafe extern "C" fn(c_int, Vp, Vpp) -> ncclResult_t>,
    pub accept: Option<unsafe extern "C" fn(Vp, Vpp) -> ncclResult_t>,
    pub regMr: Option<RegMrIntFn>,
    pub regMrDmaBuf: Option<RegMrDmaBufFn>,
    pub deregMr: Option<DeregMrFn>,
    pub isend: Option<IsendIntFn>,
    pub irecv: Option<IrecvIntFn>,
    pub iflush: Option<IflushFn>,
    pub test: Option<TestFn>,
    pub closeSend: Option<CloseFn>,
    pub closeRecv: Option<CloseFn>,
    pub closeListen: Option<CloseFn>,
}

#[repr(C)]
pub struct ncclNet_v7_t {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(ncclDebugLogger_t) -> ncclResult_t>,
    pub devices: Option<DevicesFn>,
    pub getProperties: Option<unsafe extern "C" fn(c_int, *mut ncclNetProperties_v7_t) -> ncclResult_t>,
    pub listen: Option<ListenFn>,
    pub connect:
        Option<unsafe extern "C" fn(c_int, Vp, Vpp, *mut *mut ncclNetDeviceHandle_t) -> ncclResult_t>,
    pub accept: Option<AcceptDevFn>,
    pub regMr: Option<RegMrIntFn>,
    pub regMrDmaBuf: Option<RegMrDmaBufFn>,
    pub deregMr: Option<DeregMrFn>,
    pub isend: Option<IsendIntFn>,
    pub irecv: Option<IrecvIntFn>,
    pub iflush: Option<IflushFn>,
    pub test: Option<TestFn>,
    pub closeSend: Option<CloseFn>,
    pub closeRecv: Option<CloseFn>,
    pub closeListen: Option<CloseFn>,
    pub getDeviceMr: Option<GetDeviceMrFn>,
    pub irecvConsumed: Option<IrecvConsumedFn>,
}

#[repr(C)]
pub struct ncclNet_v8_t {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(ncclDebugLogger_t) -> ncclResult_t>,
    pub devices: Option<DevicesFn>,
    pub getProperties: Option<unsafe extern "C" fn(c_int, *mut ncclNetProperties_v8_t) -> ncclResult_t>,
    pub listen: Option<ListenFn>,
    pub connect:
        Option<unsafe extern "C" fn(c_int, Vp, Vpp, *mut *mut ncclNetDeviceHandle_t) -> ncclResult_t>,
    pub accept: Option<AcceptDevFn>,
    pub regMr: Option<RegMrFn>,
    pub regMrDmaBuf: Option<RegMrDmaBufFn>,
    pub deregMr: Option<DeregMrFn>,
    pub isend: Option<IsendIntFn>,
    pub irecv: Option<IrecvIntFn>,
    pub iflush: Option<IflushFn>,
    pub test: Option<TestFn>,
    pub closeSend: Option<CloseFn>,
    pub closeRecv: Option<CloseFn>,
    pub closeListen: Option<CloseFn>,
    pub getDeviceMr: Option<GetDeviceMrFn>,
    pub irecvConsumed: Option<IrecvConsumedFn>,
}

#[repr(C)]
pub struct ncclNet_v9_t {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(ncclDebugLogger_t) -> ncclResult_t>,
    pub devices: Option<DevicesFn>,
    pub getProperties: Option<unsafe extern "C" fn(c_int, *mut ncclNetProperties_v9_t) -> ncclResult_t>,
    pub listen: Option<ListenFn>,
    pub connect:
        Option<unsafe extern "C" fn(c_int, Vp, Vpp, *mut *mut ncclNetDeviceHandle_t) -> ncclResult_t>,
    pub accept: Option<AcceptDevFn>,
    pub regMr: Option<RegMrFn>,
    pub regMrDmaBuf: Option<RegMrDmaBufFn>,
    pub deregMr: Option<DeregMrFn>,
    pub isend: Option<IsendFn>,
    pub irecv: Option<IrecvFn>,
    pub iflush: Option<IflushFn>,
    pub test: Option<TestFn>,
    pub closeSend: Option<CloseFn>,
    pub closeRecv: Option<CloseFn>,
    pub closeListen: Option<CloseFn>,
    pub getDeviceMr: Option<GetDeviceMrFn>,
    pub irecvConsumed: Option<IrecvConsumedFn>,
    pub makeVDevice: Option<unsafe extern "C" fn(*mut c_int, *mut ncclNetVDeviceProps_v9_t) -> ncclResult_t>,
}

#[repr(C)]
pub struct ncclNet_v10_t {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(ncclDebugLogger_t, ncclProfilerCallback_t) -> ncclResult_t>,
    pub devices: Option<DevicesFn>,
    pub getProperties: Option<unsafe extern "C" fn(c_int, *mut ncclNetProperties_v9_t) -> ncclResult_t>,
    pub listen: Option<ListenFn>,
    pub connect: Option<
        unsafe extern "C" fn(
            c_int,
            *mut ncclNetCommConfig_t,
            Vp,
            Vpp,
            *mut *mut ncclNetDeviceHandle_t,
        ) -> ncclResult_t,
    >,
    pub accept: Option<AcceptDevFn>,
    pub regMr: Option<RegMrFn>,
    pub regMrDmaBuf: Option<RegMrDmaBufFn>,
    pub deregMr: Option<DeregMrFn>,
    pub isend: Option<IsendPFn>,
    pub irecv: Option<IrecvPFn>,
    pub iflush: Option<IflushFn>,
    pub test: Option<TestFn>,
    pub closeSend: Option<CloseFn>,
    pub closeRecv: Option<CloseFn>,
    pub closeListen: Option<CloseFn>,
    pub getDeviceMr: Option<GetDeviceMrFn>,
    pub irecvConsumed: Option<IrecvConsumedFn>,
    pub makeVDevice: Option<unsafe extern "C" fn(*mut c_int, *mut ncclNetVDeviceProps_v9_t) -> ncclResult_t>,
}

pub type CtxInitFn = unsafe extern "C" fn(
    Vpp,
    u64,
    *mut ncclNetCommConfig_t,
    ncclDebugLogger_t,
    ncclProfilerCallback_t,
) -> ncclResult_t;
pub type CtxConnectFn =
    unsafe extern "C" fn(Vp, c_int, Vp, Vpp, *mut *mut ncclNetDeviceHandle_t) -> ncclResult_t;

#[repr(C)]
pub struct ncclNet_v11_t {
    pub name: *const c_char,
    pub init: Option<CtxInitFn>,
    pub devices: Option<DevicesFn>,
    pub getProperties: Option<unsafe extern "C" fn(c_int, *mut ncclNetProperties_v11_t) -> ncclResult_t>,
    pub listen: Option<CtxListenFn>,
    pub connect: Option<CtxConnectFn>,
    pub accept: Option<AcceptDevFn>,
    pub regMr: Option<RegMrFn>,
    pub regMrDmaBuf: Option<RegMrDmaBufFn>,
    pub deregMr: Option<DeregMrFn>,
    pub isend: Option<IsendPFn>,
    pub irecv: Option<IrecvPFn>,
    pub iflush: Option<IflushFn>,
    pub test: Option<TestFn>,
    pub closeSend: Option<CloseFn>,
    pub closeRecv: Option<CloseFn>,
    pub closeListen: Option<CloseFn>,
    pub getDeviceMr: Option<GetDeviceMrFn>,
    pub irecvConsumed: Option<IrecvConsumedFn>,
    pub makeVDevice: Option<unsafe extern "C" fn(*mut c_int, *mut ncclNetVDeviceProps_v9_t) -> ncclResult_t>,
    pub finalize: Option<CloseFn>,
    pub setNetAttr: Option<unsafe extern "C" fn(Vp, *mut ncclNetAttr_t) -> ncclResult_t>,
}

#[repr(C)]
pub struct ncclNet_v12_t {
    pub name: *const c_char,
    pub init: Option<CtxInitFn>,
    pub devices: Option<DevicesFn>,
    pub getProperties: Option<unsafe extern "C" fn(c_int, *mut ncclNetProperties_v12_t) -> ncclResult_t>,
    pub listen: Option<CtxListenFn>,
    pub connect: Option<CtxConnectFn>,
    pub accept: Option<AcceptDevFn>,
    pub regMr: Option<RegMrFn>,
    pub regMrDmaBuf: Option<RegMrDmaBufFn>,
    pub deregMr: Option<DeregMrFn>,
    pub isend: Option<IsendPFn>,
    pub irecv: Option<IrecvPFn>,
    pub iflush: Option<IflushFn>,
    pub test: Option<TestFn>,
    pub closeSend: Option<CloseFn>,
    pub closeRecv: Option<CloseFn>,
    pub closeListen: Option<CloseFn>,
    pub getDeviceMr: Option<GetDeviceMrFn>,
    pub irecvConsumed: Option<IrecvConsumedFn>,
    pub makeVDevice: Option<unsafe extern "C" fn(*mut c_int, *mut ncclNetVDeviceProps_v12_t) -> ncclResult_t>,
    pub finalize: Option<CloseFn>,
    pub setNetAttr: Option<unsafe extern "C" fn(Vp, *mut ncclNetAttr_t) -> ncclResult_t>,
}

/// The exported tables hold raw pointers (the name) and are only ever read: NCCL copies or reads
/// them. This wrapper makes them `Sync` statics with the same layout.
#[repr(transparent)]
pub struct Exported<T>(pub T);
// SAFETY: the tables are immutable statics (function pointers and a pointer to a static C
// string); nothing ever writes through them, so sharing them between threads is sound.
unsafe impl<T> Sync for Exported<T> {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn property_layouts_match_nccl() {
        assert_eq!(size_of::<ncclNetProperties_v6_t>(), 48);
        assert_eq!(offset_of!(ncclNetProperties_v6_t, guid), 16);
        assert_eq!(offset_of!(ncclNetProperties_v6_t, ptrSupport), 24);
        assert_eq!(offset_of!(ncclNetProperties_v6_t, speed), 28);
        assert_eq!(offset_of!(ncclNetProperties_v6_t, port), 32);
        assert_eq!(offset_of!(ncclNetProperties_v6_t, latency), 36);
        assert_eq!(offset_of!(ncclNetProperties_v6_t, maxComms), 40);
        assert_eq!(offset_of!(ncclNetProperties_v6_t, maxRecvs), 44);

        assert_eq!(size_of::<ncclNetProperties_v7_t>(), 56);
        assert_eq!(offset_of!(ncclNetProperties_v7_t, netDeviceType), 48);
        assert_eq!(offset_of!(ncclNetProperties_v7_t, netDeviceVersion), 52);

        assert_eq!(size_of::<ncclNetProperties_v8_t>(), 64);
        assert_eq!(offset_of!(ncclNetProperties_v8_t, regIsGlobal), 28);
        assert_eq!(offset_of!(ncclNetProperties_v8_t, speed), 32);
        assert_eq!(offset_of!(ncclNetProperties_v8_t, netDeviceType), 52);
        assert_eq!(offset_of!(ncclNetProperties_v8_t, netDeviceVersion), 56);

        assert_eq!(size_of::<ncclNetProperties_v9_t>(), 104);
        assert_eq!(offset_of!(ncclNetProperties_v9_t, regIsGlobal), 28);
        assert_eq!(offset_of!(ncclNetProperties_v9_t, forceFlush), 32);
        assert_eq!(offset_of!(ncclNetProperties_v9_t, speed), 36);
        assert_eq!(offset_of!(ncclNetProperties_v9_t, port), 40);
        assert_eq!(offset_of!(ncclNetProperties_v9_t, latency), 44);
        assert_eq!(offset_of!(ncclNetProperties_v9_t, maxComms), 48);
        assert_eq!(offset_of!(ncclNetProperties_v9_t, maxRecvs), 52);
        assert_eq!(offset_of!(ncclNetProperties_v9_t, netDeviceType), 56);
        assert_eq!(offset_of!(ncclNetProperties_v9_t, netDeviceVersion), 60);
        assert_eq!(offset_of!(ncclNetProperties_v9_t, vProps), 64);
        assert_eq!(offset_of!(ncclNetProperties_v9_t, maxP2pBytes), 88);
        assert_eq!(offset_of!(ncclNetProperties_v9_t, maxCollBytes), 96);

        assert_eq!(size_of::<ncclNetProperties_v11_t>(), 112);
        assert_eq!(offset_of!(ncclNetProperties_v11_t, maxMultiRequestSize), 104);

        assert_eq!(size_of::<ncclNetProperties_v12_t>(), 128);
        assert_eq!(offset_of!(ncclNetProperties_v12_t, vProps), 64);
        assert_eq!(offset_of!(ncclNetProperties_v12_t, maxP2pBytes), 104);
        assert_eq!(offset_of!(ncclNetProperties_v12_t, maxCollBytes), 112);
        assert_eq!(offset_of!(ncclNetProperties_v12_t, maxMultiRequestSize), 120);
        assert_eq!(offset_of!(ncclNetProperties_v12_t, railId), 124);
        assert_eq!(offset_of!(ncclNetProperties_v12_t, planeId), 126);
    }

    #[test]
    fn small_type_layouts_match_nccl() {
        assert_eq!(size_of::<ncclNetDeviceHandle_t>(), 32);
        assert_eq!(offset_of!(ncclNetDeviceHandle_t, handle), 8);
        assert_eq!(offset_of!(ncclNetDeviceHandle_t, size), 16);
        assert_eq!(offset_of!(ncclNetDeviceHandle_t, needsProxyProgress), 24);
        assert_eq!(size_of::<ncclNetVDeviceProps_v9_t>(), 20);
        assert_eq!(size_of::<ncclNetVDeviceProps_v12_t>(), 36);
        assert_eq!(size_of::<ncclNetCommConfig_t>(), 4);
        assert_eq!(size_of::<ncclNetCommAttr_t>(), 16);
        assert_eq!(size_of::<ncclNetAttr_t>(), 44);
        assert_eq!(offset_of!(ncclNetAttr_t, op), 32);
    }

    #[test]
    fn table_layouts_match_nccl() {
        assert_eq!(size_of::<ncclNet_v6_t>(), 136);
        assert_eq!(offset_of!(ncclNet_v6_t, test), 13 * 8);
        assert_eq!(offset_of!(ncclNet_v6_t, closeListen), 16 * 8);
        assert_eq!(size_of::<ncclNet_v7_t>(), 152);
        assert_eq!(offset_of!(ncclNet_v7_t, getDeviceMr), 17 * 8);
        assert_eq!(offset_of!(ncclNet_v7_t, irecvConsumed), 18 * 8);
        assert_eq!(size_of::<ncclNet_v8_t>(), 152);
        assert_eq!(size_of::<ncclNet_v9_t>(), 160);
        assert_eq!(offset_of!(ncclNet_v9_t, makeVDevice), 19 * 8);
        assert_eq!(size_of::<ncclNet_v10_t>(), 160);
        assert_eq!(size_of::<ncclNet_v11_t>(), 176);
        assert_eq!(offset_of!(ncclNet_v11_t, finalize), 20 * 8);
        assert_eq!(offset_of!(ncclNet_v11_t, setNetAttr), 21 * 8);
        assert_eq!(size_of::<ncclNet_v12_t>(), 176);
        assert_eq!(offset_of!(ncclNet_v12_t, finalize), 20 * 8);
        // Option<fn> must be pointer-sized with NULL as None.
        assert_eq!(size_of::<Option<TestFn>>(), 8);
    }
}
