//! rivet: an NCCL network plugin. The cdylib exports `ncclNetPlugin_v6` … `ncclNetPlugin_v12`
//! (see `abi/`); the rlib serves the tests and the `rivet` CLI.

pub mod abi;
pub mod config;
pub mod cuda;
pub mod doctor;
pub mod error;
pub mod gdr;
pub mod handles;
pub mod log;
pub mod plugin;
pub mod proto;
pub mod staging;
pub mod sys;
pub mod topo;
pub mod transport;
