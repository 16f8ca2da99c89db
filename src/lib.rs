//! rivet: an NCCL network plugin. The cdylib exports `ncclNetPlugin_v6` … `ncclNetPlugin_v12`
//! (see `abi/`); the rlib serves the tests and the `rivet` CLI.

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
