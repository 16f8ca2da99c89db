//! The TCP transport: rivet's fallback where a host has no RDMA device. Its connections are set
//! up by the out-of-band room's handshake (`transport::oob`), whose streams then carry the data:
//! the device is in [`device`], the data path in [`conn`] and its helper threads in [`helper`].

pub mod conn;
pub mod device;
pub mod helper;

pub use conn::{RecvConn, SendConn};
pub use device::TcpDevice;
