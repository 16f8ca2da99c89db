//! rivet: an NCCL network plugin. The cdylib exports `ncclNetPlugin_v6` … `ncclNetPlugin_v12`
//! (see `abi/`); the rlib serves the tests and the `rivet` CLI.
//!
//! Every `unsafe` block and impl says why it is sound (`// SAFETY:`), and every `unsafe fn` what
//! its caller must guarantee (`# Safety`).
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(clippy::missing_safety_doc)]

pub mod abi;
pub mod config;
pub mod error;
pub mod gpu;
pub mod handles;
pub mod log;
pub mod plugin;
pub mod proto;
pub mod sys;
pub mod topo;
pub mod transport;
