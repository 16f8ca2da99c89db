//! The exported `ncclNetPlugin_v6` … `ncclNetPlugin_v12` tables: thin shims that convert each
//! version's argument types and call the version-independent core in `plugin/`, every one
//! through the single FFI boundary in [`ffi`].

// Every `unsafe extern "C"` entry point's safety contract is the ncclNet ABI itself (the
// pointer arguments NCCL passes, see include/rivet_net.h), not something to repeat per function.
#![allow(clippy::missing_safety_doc)]

pub mod common;
pub mod ffi;
pub mod logger;
pub mod profile;
pub mod types;
pub mod v10;
pub mod v11;
pub mod v12;
pub mod v6;
pub mod v7;
pub mod v8;
pub mod v9;

/// The name NCCL matches with `NCCL_NET=`.
pub const NAME: &std::ffi::CStr = c"rivet";
