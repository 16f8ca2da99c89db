//! The exported `ncclNetPlugin_v6` … `ncclNetPlugin_v12` tables: thin shims that convert each
//! version's argument types and call the version-independent core in `plugin.rs`, every one
//! through the single FFI boundary in [`ffi`].

pub mod common;
pub mod ffi;
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
