//! The single FFI boundary: every exported function runs its body through [`boundary`], which
//! catches panics, turns `Err` into an `ncclResult_t`, and logs the reason once through NCCL's
//! logger (or stderr outside NCCL).

use crate::abi::types::*;
use crate::error::{Error, Kind, Result};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Run `f`, never letting a panic cross into C. `what` names the entry point for the log line.
/// Inline: it is on the path of every data-path call; what it does on an error is out of line.
#[inline(always)]
pub fn boundary(what: &str, f: impl FnOnce() -> Result<()>) -> ncclResult_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => NCCL_SUCCESS,
        Ok(Err(e)) => failed(what, e),
        Err(p) => panicked(what, p),
    }
}

#[cold]
#[inline(never)]
fn failed(what: &str, e: Error) -> ncclResult_t {
    log::warn!("NET/rivet: {what}: {e}");
    code(&e)
}

#[cold]
#[inline(never)]
fn panicked(what: &str, p: Box<dyn std::any::Any + Send>) -> ncclResult_t {
    let msg = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    log::warn!("NET/rivet: {what}: internal error (panic caught at the plugin boundary): {msg}");
    NCCL_INTERNAL_ERROR
}

/// The `ncclResult_t` of an error's kind.
pub fn code(e: &Error) -> ncclResult_t {
    match e.kind {
        Kind::System => NCCL_SYSTEM_ERROR,
        Kind::Remote => NCCL_REMOTE_ERROR,
        Kind::InvalidUsage => NCCL_INVALID_USAGE,
        Kind::Internal => NCCL_INTERNAL_ERROR,
        Kind::InvalidArgument => NCCL_INVALID_ARGUMENT,
    }
}

/// Write `v` through an out-pointer supplied by the caller, checking it is not NULL.
///
/// # Safety
/// A non-NULL `p` points to writable, aligned memory for a `T` (NCCL's out-parameter).
pub unsafe fn out<T>(p: *mut T, name: &str, v: T) -> Result<()> {
    if p.is_null() {
        return Err(Error::internal(format!("{name} is NULL")));
    }
    // SAFETY: not NULL, and the caller's promise for the rest.
    unsafe { p.write(v) };
    Ok(())
}

/// A non-NULL pointer argument, or an `ncclInternalError` naming it.
pub fn nonnull<T>(p: *mut T, name: &str) -> Result<*mut T> {
    if p.is_null() {
        Err(Error::internal(format!("{name} is NULL")))
    } else {
        Ok(p)
    }
}
