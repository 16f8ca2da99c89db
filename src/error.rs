//! The library's error type: a kind that maps onto `ncclResult_t` plus a message that says what
//! happened and, where we know it, how to fix it.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Network, hardware or syscall failure (`ncclSystemError`).
    System,
    /// Caused by the peer: it closed, died, or sent something we cannot accept (`ncclRemoteError`).
    Remote,
    /// Bad user configuration or a collective mismatch (`ncclInvalidUsage`).
    InvalidUsage,
    /// Misuse of the API by the caller: bad pointer, unknown handle (`ncclInternalError`).
    Internal,
    /// An argument out of range (`ncclInvalidArgument`).
    InvalidArgument,
}

#[derive(Debug, Clone)]
pub struct Error {
    pub kind: Kind,
    pub msg: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(kind: Kind, msg: impl Into<String>) -> Self {
        Error { kind, msg: msg.into() }
    }
    pub fn system(msg: impl Into<String>) -> Self {
        Self::new(Kind::System, msg)
    }
    pub fn remote(msg: impl Into<String>) -> Self {
        Self::new(Kind::Remote, msg)
    }
    pub fn usage(msg: impl Into<String>) -> Self {
        Self::new(Kind::InvalidUsage, msg)
    }
    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(Kind::Internal, msg)
    }
    pub fn arg(msg: impl Into<String>) -> Self {
        Self::new(Kind::InvalidArgument, msg)
    }
    /// A syscall failure with errno text.
    pub fn os(what: impl fmt::Display, err: std::io::Error) -> Self {
        Self::system(format!("{what}: {err}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Error {}
