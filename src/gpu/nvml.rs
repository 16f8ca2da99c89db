//! What NVML says that sysfs cannot: whether a GPU is joined to its CPU by NVLink-C2C (Grace
//! Hopper), read as NCCL's topology reads it (the C2C link count and each link's status field).
//! libnvidia-ml is loaded at run time on first use; a host without it has no C2C GPU.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::sync::OnceLock;

/// NVML_FI_DEV_C2C_LINK_COUNT and NVML_FI_DEV_C2C_LINK_GET_STATUS (nvml.h).
const FI_C2C_LINK_COUNT: c_uint = 170;
const FI_C2C_LINK_GET_STATUS: c_uint = 171;

/// `nvmlFieldValue_t`: the field asked for (and the link, as scopeId), and the answer.
#[repr(C)]
#[derive(Clone, Copy)]
struct FieldValue {
    field_id: c_uint,
    scope_id: c_uint,
    timestamp: i64,
    latency_usec: i64,
    value_type: c_int,
    nvml_return: c_int,
    value: u64,
}
const _: () = assert!(std::mem::size_of::<FieldValue>() == 40);

struct Nvml {
    _lib: libloading::Library,
    handle_by_bus_id: unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> c_int,
    field_values: unsafe extern "C" fn(*mut c_void, c_int, *mut FieldValue) -> c_int,
}

// SAFETY: NVML's functions may be called from any thread; the pointers never change once loaded.
unsafe impl Send for Nvml {}
// SAFETY: as above.
unsafe impl Sync for Nvml {}

fn nvml() -> Option<&'static Nvml> {
    static N: OnceLock<Option<Nvml>> = OnceLock::new();
    N.get_or_init(|| {
        // SAFETY: loading NVML runs its initialisers, which make no demands on the caller (NCCL
        // and CUDA applications load it the same way).
        let lib = unsafe { libloading::Library::new("libnvidia-ml.so.1") }.ok()?;
        // SAFETY: each symbol is looked up with NVML's C prototype (nvml.h); the library is kept
        // in the same Nvml, so the copied pointers cannot outlive it.
        unsafe {
            let init: unsafe extern "C" fn() -> c_int = *lib.get(b"nvmlInit_v2\0").ok()?;
            let handle_by_bus_id = *lib.get(b"nvmlDeviceGetHandleByPciBusId_v2\0").ok()?;
            let field_values = *lib.get(b"nvmlDeviceGetFieldValues\0").ok()?;
            (init() == 0).then_some(Nvml { _lib: lib, handle_by_bus_id, field_values })
        }
    })
    .as_ref()
}

/// Whether the GPU at `bus_id` ("0000:01:00.0") has an active NVLink-C2C link to its CPU.
pub fn c2c(bus_id: &str) -> bool {
    let Some(n) = nvml() else { return false };
    let Ok(id) = CString::new(bus_id) else { return false };
    let mut dev: *mut c_void = std::ptr::null_mut();
    // SAFETY: NVML reads the NUL-terminated bus id and writes one handle to the live local `dev`.
    if unsafe { (n.handle_by_bus_id)(id.as_ptr(), &mut dev) } != 0 {
        return false;
    }
    let ask = |field_id: c_uint, scope_id: c_uint| {
        let mut f = FieldValue { field_id, scope_id, timestamp: 0, latency_usec: 0, value_type: 0, nvml_return: 0, value: 0 };
        // SAFETY: one nvmlFieldValue_t, a live local, for a handle NVML gave above.
        let rc = unsafe { (n.field_values)(dev, 1, &mut f) };
        (rc == 0 && f.nvml_return == 0).then_some(f.value as u32)
    };
    let links = ask(FI_C2C_LINK_COUNT, 0).unwrap_or(0);
    (0..links.min(64)).any(|l| ask(FI_C2C_LINK_GET_STATUS, l) == Some(1))
}
