//! The out-of-band socket of a verbs connection, after setup: the TCP stream the connection was
//! set up over (its handshake and metadata exchange are in [`super::Setup`]) stays open, idle, as
//! the peer's pulse. Its end says the peer process exited, its keepalive timeout that the host
//! stopped answering, and a sender that fails a send for a collective mismatch writes a notice
//! on it so that the receiver reports the same cause.

use crate::proto::verbs::{Mismatch, NOTICE_SIZE};
use std::os::fd::{AsRawFd, OwnedFd};

pub enum PeerState {
    Alive,
    /// The out-of-band socket ended (EOF or reset): the peer process exited or crashed.
    Gone,
    /// The out-of-band socket timed out (keepalive) or lost its route: the peer host stopped
    /// answering.
    Unreachable(std::io::Error),
    Mismatch(Mismatch),
}

/// What the socket says of the peer now (never blocks: a peek).
pub fn peer_state(fd: &OwnedFd) -> PeerState {
    let mut b = [0u8; NOTICE_SIZE];
    // SAFETY: a peek into our own buffer of NOTICE_SIZE bytes, on a socket we own.
    let r = unsafe { libc::recv(fd.as_raw_fd(), b.as_mut_ptr() as *mut _, NOTICE_SIZE, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    if r == NOTICE_SIZE as isize {
        if let Some(m) = Mismatch::decode(&b) {
            return PeerState::Mismatch(m);
        }
    }
    if r > 0 {
        return PeerState::Alive;
    }
    if r == 0 {
        return PeerState::Gone;
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EINTR) => PeerState::Alive,
        _ if crate::transport::socket::sock::host_unreachable(&e) => PeerState::Unreachable(e),
        _ => PeerState::Gone,
    }
}

/// Tell the peer why this side fails (best effort; the socket is otherwise idle).
pub fn notify_mismatch(fd: &OwnedFd, m: Mismatch) {
    let b = m.encode();
    // SAFETY: a non-blocking send of our own buffer on a socket we own.
    unsafe { libc::send(fd.as_raw_fd(), b.as_ptr() as *const _, b.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
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
