//! Any ncclNet plugin's table, whatever its version (v6 … v12), as one set of function shapes:
//! the CLI drives rivet and the peer plugins (NCCL's IB transport as a plugin exports v6–v11,
//! aws-ofi-nccl v6–v12) through the same code, as NCCL drives them.

use crate::net::Res;
use nccl_net_rivet::abi::types::*;
use std::ffi::{c_int, c_void};

type Vp = *mut c_void;
type Vpp = *mut *mut c_void;
type Dev = *mut *mut ncclNetDeviceHandle_t;

#[derive(Clone, Copy)]
pub enum Init {
    Plain(unsafe extern "C" fn(ncclDebugLogger_t) -> ncclResult_t),
    Profiler(unsafe extern "C" fn(ncclDebugLogger_t, ncclProfilerCallback_t) -> ncclResult_t),
    Ctx(CtxInitFn),
}

#[derive(Clone, Copy)]
pub enum Props {
    V6(unsafe extern "C" fn(c_int, *mut ncclNetProperties_v6_t) -> ncclResult_t),
    V7(unsafe extern "C" fn(c_int, *mut ncclNetProperties_v7_t) -> ncclResult_t),
    V8(unsafe extern "C" fn(c_int, *mut ncclNetProperties_v8_t) -> ncclResult_t),
    V9(unsafe extern "C" fn(c_int, *mut ncclNetProperties_v9_t) -> ncclResult_t),
    V11(unsafe extern "C" fn(c_int, *mut ncclNetProperties_v11_t) -> ncclResult_t),
    V12(unsafe extern "C" fn(c_int, *mut ncclNetProperties_v12_t) -> ncclResult_t),
}

#[derive(Clone, Copy)]
pub enum Listen {
    Plain(ListenFn),
    Ctx(CtxListenFn),
}

#[derive(Clone, Copy)]
pub enum Connect {
    V6(unsafe extern "C" fn(c_int, Vp, Vpp) -> ncclResult_t),
    Dev(unsafe extern "C" fn(c_int, Vp, Vpp, Dev) -> ncclResult_t),
    Config(unsafe extern "C" fn(c_int, *mut ncclNetCommConfig_t, Vp, Vpp, Dev) -> ncclResult_t),
    Ctx(CtxConnectFn),
}

#[derive(Clone, Copy)]
pub enum Accept {
    V6(unsafe extern "C" fn(Vp, Vpp) -> ncclResult_t),
    Dev(AcceptDevFn),
}

#[derive(Clone, Copy)]
pub enum RegMr {
    Int(RegMrIntFn),
    Size(RegMrFn),
}

#[derive(Clone, Copy)]
pub enum Isend {
    Int(IsendIntFn),
    Size(IsendFn),
    Phandle(IsendPFn),
}

#[derive(Clone, Copy)]
pub enum Irecv {
    Int(IrecvIntFn),
    Size(IrecvFn),
    Phandle(IrecvPFn),
}

/// The functions the CLI calls, in the shape of the table they came from.
#[derive(Clone, Copy)]
pub struct Table {
    /// The ncclNet version of the table.
    pub version: u32,
    /// The plugin's name (what NCCL_NET= matches).
    pub name: &'static str,
    pub devices: DevicesFn,
    pub props: Props,
    pub listen: Listen,
    pub connect: Connect,
    pub accept: Accept,
    pub reg_mr: RegMr,
    pub dereg_mr: DeregMrFn,
    pub isend: Isend,
    pub irecv: Irecv,
    pub test: TestFn,
    pub close_send: CloseFn,
    pub close_recv: CloseFn,
    pub close_listen: CloseFn,
    /// v11+: the context from init is finalized.
    pub finalize: Option<CloseFn>,
    /// v9+: NIC fusion (None: the version has none, or the plugin leaves it NULL).
    pub make_vdevice: MakeVDevice,
}

/// `makeVDevice` by the vProps layout of its version.
#[derive(Clone, Copy)]
pub enum MakeVDevice {
    None,
    /// v9-v11: 4 devices.
    V9(unsafe extern "C" fn(*mut c_int, *mut ncclNetVDeviceProps_v9_t) -> ncclResult_t),
    /// v12: 8 devices.
    V12(unsafe extern "C" fn(*mut c_int, *mut ncclNetVDeviceProps_v12_t) -> ncclResult_t),
}

impl MakeVDevice {
    /// Make a virtual NIC of `devs`; its index.
    ///
    /// # Safety
    /// The function is the plugin's makeVDevice of its version, the plugin initialized.
    pub unsafe fn call(self, devs: &[i32]) -> Res<(ncclResult_t, c_int)> {
        let mut d: c_int = -1;
        let r = match self {
            MakeVDevice::None => return Err("the plugin has no makeVDevice (NIC fusion needs ncclNet v9+)".into()),
            MakeVDevice::V9(f) => {
                if devs.len() > 4 {
                    return Err(format!("{} devices in one virtual NIC: ncclNet v9-v11 carry at most 4", devs.len()));
                }
                let mut p = ncclNetVDeviceProps_v9_t { ndevs: devs.len() as c_int, devs: [0; 4] };
                p.devs[..devs.len()].copy_from_slice(devs);
                // SAFETY: the caller's promise; `d` and `p` are live locals.
                unsafe { f(&mut d, &mut p) }
            }
            MakeVDevice::V12(f) => {
                if devs.len() > 8 {
                    return Err(format!("{} devices in one virtual NIC: ncclNet v12 carries at most 8", devs.len()));
                }
                let mut p = ncclNetVDeviceProps_v12_t { ndevs: devs.len() as c_int, devs: [0; 8] };
                p.devs[..devs.len()].copy_from_slice(devs);
                // SAFETY: as above.
                unsafe { f(&mut d, &mut p) }
            }
        };
        Ok((r, d))
    }
}

fn req<T>(f: Option<T>, name: &str, v: u32) -> Res<T> {
    f.ok_or_else(|| format!("the plugin's ncclNetPlugin_v{v} has no {name}"))
}

/// A plugin's table of one version, found but not read yet: NCCL reads `init` and calls it
/// before it reads anything else, and some plugins (NCCL's IB transport as a plugin) fill the
/// rest of their table in `init`.
pub struct Found {
    p: *const c_void,
    pub version: u32,
}

/// Find the table of a loaded plugin: version `want`, or the newest it exports.
pub fn find(lib: &libloading::Library, path: &std::path::Path, want: Option<u32>) -> Res<Found> {
    let versions: Vec<u32> = match want {
        Some(v @ 6..=12) => vec![v],
        Some(v) => return Err(format!("--abi {v}: the ncclNet versions are 6 to 12")),
        None => (6..=12).rev().collect(),
    };
    for v in versions {
        let name = format!("ncclNetPlugin_v{v}\0");
        // SAFETY: the symbol, when present, is the plugin's static table of that version (the
        // ncclNet contract); only its address is taken here.
        let Ok(sym) = (unsafe { lib.get::<*const c_void>(name.as_bytes()) }) else { continue };
        return Ok(Found { p: *sym, version: v });
    }
    Err(match want {
        Some(v) => format!("{} has no ncclNetPlugin_v{v}", path.display()),
        None => format!("{} exports no ncclNetPlugin_v6 … v12 table: is it an ncclNet plugin?", path.display()),
    })
}

impl Found {
    /// The table's name (set before init).
    ///
    /// # Safety
    /// The library the table was found in is still loaded.
    pub unsafe fn name(&self) -> &'static str {
        // SAFETY: the caller's promise.
        unsafe { name_at(self.p) }
    }

    /// The table's `init`, the first member after the name in every version.
    ///
    /// # Safety
    /// The library the table was found in is still loaded.
    pub unsafe fn init(&self) -> Res<Init> {
        let v = self.version;
        // SAFETY: the caller's promise: `p` is the live table of version `v`, read as its type.
        Ok(unsafe {
            match v {
                6 => Init::Plain(req((*(self.p as *const ncclNet_v6_t)).init, "init", v)?),
                7 => Init::Plain(req((*(self.p as *const ncclNet_v7_t)).init, "init", v)?),
                8 => Init::Plain(req((*(self.p as *const ncclNet_v8_t)).init, "init", v)?),
                9 => Init::Plain(req((*(self.p as *const ncclNet_v9_t)).init, "init", v)?),
                10 => Init::Profiler(req((*(self.p as *const ncclNet_v10_t)).init, "init", v)?),
                11 => Init::Ctx(req((*(self.p as *const ncclNet_v11_t)).init, "init", v)?),
                _ => Init::Ctx(req((*(self.p as *const ncclNet_v12_t)).init, "init", v)?),
            }
        })
    }

    /// The whole table, read after `init` succeeded (as NCCL reads it).
    ///
    /// # Safety
    /// As for `init`.
    pub unsafe fn table(&self) -> Res<Table> {
        // SAFETY: the caller's promise.
        unsafe { read(self.p, self.version) }
    }
}

/// The name of the table at `p`: the first member of every version, `const char* name`.
///
/// # Safety
/// `p` points to a live table of a loaded library; its name is NULL or a NUL-terminated static
/// string of that library, which outlives the table's users.
unsafe fn name_at(p: *const c_void) -> &'static str {
    // SAFETY: the caller's promise.
    unsafe {
        let n = *(p as *const *const std::ffi::c_char);
        if n.is_null() {
            ""
        } else {
            std::ffi::CStr::from_ptr(n).to_str().unwrap_or("")
        }
    }
}

/// # Safety
/// `p` points to a live `ncclNet_v{v}_t`.
unsafe fn read(p: *const c_void, v: u32) -> Res<Table> {
    // The fields every version has with the same shape, and the closes.
    macro_rules! common {
        ($t:expr, $init:expr, $props:expr, $listen:expr, $connect:expr, $accept:expr, $reg:expr, $isend:expr, $irecv:expr, $fin:expr) => {{
            let t = $t;
            Table {
                version: v,
                // SAFETY: the caller's promise (`p` is a live table).
                name: unsafe { name_at(p) },
                devices: req(t.devices, "devices", v)?,
                props: $props(req(t.getProperties, "getProperties", v)?),
                listen: $listen(req(t.listen, "listen", v)?),
                connect: $connect(req(t.connect, "connect", v)?),
                accept: $accept(req(t.accept, "accept", v)?),
                reg_mr: $reg(req(t.regMr, "regMr", v)?),
                dereg_mr: req(t.deregMr, "deregMr", v)?,
                isend: $isend(req(t.isend, "isend", v)?),
                irecv: $irecv(req(t.irecv, "irecv", v)?),
                test: req(t.test, "test", v)?,
                close_send: req(t.closeSend, "closeSend", v)?,
                close_recv: req(t.closeRecv, "closeRecv", v)?,
                close_listen: req(t.closeListen, "closeListen", v)?,
                finalize: $fin(t),
                make_vdevice: MakeVDevice::None,
            }
        }};
    }
    let mut t = match v {
        // SAFETY: the caller's promise: `p` is a live ncclNet_v6_t.
        6 => common!(unsafe { &*(p as *const ncclNet_v6_t) }, Init::Plain, Props::V6, Listen::Plain, Connect::V6, Accept::V6, RegMr::Int, Isend::Int, Irecv::Int, |_| None),
        // SAFETY: the caller's promise: `p` is a live ncclNet_v7_t.
        7 => common!(unsafe { &*(p as *const ncclNet_v7_t) }, Init::Plain, Props::V7, Listen::Plain, Connect::Dev, Accept::Dev, RegMr::Int, Isend::Int, Irecv::Int, |_| None),
        // SAFETY: the caller's promise: `p` is a live ncclNet_v8_t.
        8 => common!(unsafe { &*(p as *const ncclNet_v8_t) }, Init::Plain, Props::V8, Listen::Plain, Connect::Dev, Accept::Dev, RegMr::Size, Isend::Int, Irecv::Int, |_| None),
        // SAFETY: the caller's promise: `p` is a live ncclNet_v9_t.
        9 => common!(unsafe { &*(p as *const ncclNet_v9_t) }, Init::Plain, Props::V9, Listen::Plain, Connect::Dev, Accept::Dev, RegMr::Size, Isend::Size, Irecv::Size, |_| None),
        // SAFETY: the caller's promise: `p` is a live ncclNet_v10_t.
        10 => common!(unsafe { &*(p as *const ncclNet_v10_t) }, Init::Profiler, Props::V9, Listen::Plain, Connect::Config, Accept::Dev, RegMr::Size, Isend::Phandle, Irecv::Phandle, |_| None),
        // SAFETY: the caller's promise: `p` is a live ncclNet_v11_t.
        11 => common!(unsafe { &*(p as *const ncclNet_v11_t) }, Init::Ctx, Props::V11, Listen::Ctx, Connect::Ctx, Accept::Dev, RegMr::Size, Isend::Phandle, Irecv::Phandle, |t: &ncclNet_v11_t| t.finalize),
        // SAFETY: the caller's promise: `p` is a live ncclNet_v12_t.
        _ => common!(unsafe { &*(p as *const ncclNet_v12_t) }, Init::Ctx, Props::V12, Listen::Ctx, Connect::Ctx, Accept::Dev, RegMr::Size, Isend::Phandle, Irecv::Phandle, |t: &ncclNet_v12_t| t.finalize),
    };
    // SAFETY: the caller's promise: `p` is a live table of version `v`, read as its type
    // (v10 and v11's vProps are v9's type).
    t.make_vdevice = unsafe {
        match v {
            9 => (*(p as *const ncclNet_v9_t)).makeVDevice.map_or(MakeVDevice::None, MakeVDevice::V9),
            10 => (*(p as *const ncclNet_v10_t)).makeVDevice.map_or(MakeVDevice::None, MakeVDevice::V9),
            11 => (*(p as *const ncclNet_v11_t)).makeVDevice.map_or(MakeVDevice::None, MakeVDevice::V9),
            12 => (*(p as *const ncclNet_v12_t)).makeVDevice.map_or(MakeVDevice::None, MakeVDevice::V12),
            _ => MakeVDevice::None,
        }
    };
    Ok(t)
}

/// A version's properties in the v12 layout (fields the version lacks: 0, not reported).
macro_rules! to_v12 {
    ($p:expr, [$($f:ident),*]) => {{
        // SAFETY: plain C data; all-zero is valid (null pointers).
        let mut o: ncclNetProperties_v12_t = unsafe { std::mem::zeroed() };
        let p = $p;
        $(o.$f = p.$f;)*
        o
    }};
}

impl Props {
    /// Call getProperties and return the result in the v12 layout.
    ///
    /// # Safety
    /// The function is the plugin's getProperties of its version, the plugin initialized.
    pub unsafe fn get(self, dev: c_int) -> (ncclResult_t, ncclNetProperties_v12_t) {
        macro_rules! call {
            ($f:expr, $ty:ty, [$($field:ident),*]) => {{
                // SAFETY: plain C data; all-zero is valid.
                let mut p: $ty = unsafe { std::mem::zeroed() };
                // SAFETY: the caller's promise; `p` is a live struct of the version's type.
                let r = unsafe { $f(dev, &mut p) };
                (r, to_v12!(p, [$($field),*]))
            }};
        }
        match self {
            Props::V6(f) => call!(f, ncclNetProperties_v6_t, [name, pciPath, guid, ptrSupport, speed, port, latency, maxComms, maxRecvs]),
            Props::V7(f) => call!(f, ncclNetProperties_v7_t, [name, pciPath, guid, ptrSupport, speed, port, latency, maxComms, maxRecvs, netDeviceType, netDeviceVersion]),
            Props::V8(f) => call!(f, ncclNetProperties_v8_t, [name, pciPath, guid, ptrSupport, regIsGlobal, speed, port, latency, maxComms, maxRecvs, netDeviceType, netDeviceVersion]),
            Props::V9(f) => call!(f, ncclNetProperties_v9_t, [name, pciPath, guid, ptrSupport, regIsGlobal, forceFlush, speed, port, latency, maxComms, maxRecvs, netDeviceType, netDeviceVersion, maxP2pBytes, maxCollBytes]),
            Props::V11(f) => call!(f, ncclNetProperties_v11_t, [name, pciPath, guid, ptrSupport, regIsGlobal, forceFlush, speed, port, latency, maxComms, maxRecvs, netDeviceType, netDeviceVersion, maxP2pBytes, maxCollBytes, maxMultiRequestSize]),
            Props::V12(f) => {
                // SAFETY: plain C data; all-zero is valid.
                let mut p: ncclNetProperties_v12_t = unsafe { std::mem::zeroed() };
                // SAFETY: the caller's promise.
                let r = unsafe { f(dev, &mut p) };
                (r, p)
            }
        }
    }
}
