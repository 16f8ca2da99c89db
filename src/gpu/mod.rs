//! GPU memory: the CUDA driver ([`cuda`], loaded at run time), the GPUDirect RDMA capabilities and
//! the GDR-or-staging decision ([`gdr`]), and the host staging engine every comm's data path goes
//! through ([`staging`]).

pub mod cuda;
pub mod gdr;
pub mod nvml;
pub mod staging;
