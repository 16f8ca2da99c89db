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

/// An error: boxed, so that a `Result` of a small value fits in registers (every data-path
/// call returns one, and most layers pass it on).
#[derive(Debug, Clone)]
pub struct Error(Box<Inner>);

#[derive(Debug, Clone)]
pub struct Inner {
    pub kind: Kind,
    pub msg: String,
}

impl std::ops::Deref for Error {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl std::ops::DerefMut for Error {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.0
    }
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    #[cold]
    pub fn new(kind: Kind, msg: impl Into<String>) -> Self {
        Error(Box::new(Inner { kind, msg: msg.into() }))
    }
    /// The message, taken out.
    pub fn into_msg(self) -> String {
        self.0.msg
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
