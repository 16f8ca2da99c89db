//! The out-of-band socket of a verbs connection, after setup: the TCP stream the connection was
//! set up over (its handshake and metadata exchange are in [`super::Setup`]) stays open, idle, as
//! the peer's pulse. Its end says the peer process exited, its keepalive timeout that the host
//! stopped answering, and a sender that fails a send for a collective mismatch writes a notice
//! on it so that the receiver reports the same cause. The notices on it (mismatch, failover) are
//! written in order through `Common::notify`'s outbox and read by `Common::read_inbox`; what is
//! here only looks at the socket's state, writes and reads, never waiting.

use std::os::fd::{AsRawFd, OwnedFd};

pub enum PeerState {
    Alive,
    /// The out-of-band socket ended (EOF or reset): the peer process exited or crashed.
    Gone,
    /// The out-of-band socket timed out (keepalive) or lost its route: the peer host stopped
    /// answering.
    Unreachable(std::io::Error),
}

/// What the socket says of the peer now (never blocks: a peek at one byte).
pub fn peer_state(fd: &OwnedFd) -> PeerState {
    let mut b = [0u8; 1];
    // SAFETY: a peek into our own buffer of 1 byte, on a socket we own.
    let r = unsafe { libc::recv(fd.as_raw_fd(), b.as_mut_ptr() as *mut _, 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    if r > 0 {
        return PeerState::Alive;
    }
    if r == 0 {
        return PeerState::Gone;
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EINTR) => PeerState::Alive,
        _ if super::sock::host_unreachable(&e) => PeerState::Unreachable(e),
        _ => PeerState::Gone,
    }
}

/// Send what the socket takes now of `b` (never blocks).
pub fn send_some(fd: &OwnedFd, b: &[u8]) -> std::io::Result<usize> {
    // SAFETY: a non-blocking send of our own buffer of b.len() bytes on a socket we own.
    let r = unsafe { libc::send(fd.as_raw_fd(), b.as_ptr() as *const _, b.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r as usize)
}

/// Read what has arrived, up to `b.len()` bytes (never blocks): 0 at the end of the stream.
pub fn recv_some(fd: &OwnedFd, b: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: a non-blocking read into our own buffer of b.len() bytes, on a socket we own.
    let r = unsafe { libc::recv(fd.as_raw_fd(), b.as_mut_ptr() as *mut _, b.len(), libc::MSG_DONTWAIT) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r as usize)
}
