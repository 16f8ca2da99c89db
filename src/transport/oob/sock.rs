//! Thin, non-blocking socket helpers over libc (every call uses MSG_NOSIGNAL / MSG_DONTWAIT, so a
//! dead peer is an error return, never SIGPIPE, and nothing here blocks).

use crate::error::{Error, Result};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

fn sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is a plain C struct of integers and byte arrays, for which all-zero
    // bytes are a valid value (family AF_UNSPEC).
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: `ss` is a live local sockaddr_storage, borrowed exclusively here; it is
            // larger than and at least as aligned as sockaddr_in (it is made to hold any socket
            // address), every bit pattern is a valid sockaddr_in, and `ss` is not otherwise used
            // while `sin` lives.
            let sin = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: `ss` is a live local sockaddr_storage, borrowed exclusively here; it is
            // larger than and at least as aligned as sockaddr_in6 (it is made to hold any socket
            // address), every bit pattern is a valid sockaddr_in6, and `ss` is not otherwise used
            // while `sin6` lives.
            let sin6 = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: ss_family is AF_INET, so the storage holds a sockaddr_in; sockaddr_storage is
            // larger than and at least as aligned as sockaddr_in, and any bytes are a valid
            // sockaddr_in (plain integers), so a shared reference borrowed from `ss` is valid for
            // as long as `ss`.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            Some(SocketAddr::new(
                IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes()),
                u16::from_be(sin.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: ss_family is AF_INET6, so the storage holds a sockaddr_in6; sockaddr_storage
            // is larger than and at least as aligned as sockaddr_in6, and any bytes are a valid
            // sockaddr_in6 (plain integers and bytes), so a shared reference borrowed from `ss` is
            // valid.
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::new(IpAddr::from(sin6.sin6_addr.s6_addr), u16::from_be(sin6.sin6_port)))
        }
        _ => None,
    }
}

fn new_socket(addr: &SocketAddr) -> io::Result<OwnedFd> {
    let fam = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: socket(2) takes no pointers; an unsupported family or type is an error return (-1),
    // checked below.
    let fd = unsafe { libc::socket(fam, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket(2) (checked >= 0) and nothing else owns it, so the
    // OwnedFd becomes its sole owner and closes it once.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn setopt<T>(fd: RawFd, level: i32, name: i32, v: T) -> io::Result<()> {
    // SAFETY: optval points to `v`, a live local `T`, and optlen is exactly size_of::<T>(), so
    // setsockopt(2) reads only `v`'s bytes (it never writes through optval); a bad fd, option or
    // size is an error return. Every caller passes an i32, the type these options take.
    let rc = unsafe {
        libc::setsockopt(fd, level, name, &v as *const T as *const libc::c_void, std::mem::size_of::<T>() as u32)
    };
    if rc != 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A listening socket on `ip`, ephemeral port, non-blocking. Returns the fd and the bound address.
pub fn listen(ip: IpAddr) -> Result<(OwnedFd, SocketAddr)> {
    let want = SocketAddr::new(ip, 0);
    let fd = new_socket(&want).map_err(|e| Error::os("socket()", e))?;
    let _ = setopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1i32);
    let (ss, len) = sockaddr(&want);
    // SAFETY: `ss` and `len` come from `sockaddr`, which fills a sockaddr_in or sockaddr_in6 and
    // returns its exact size, so bind(2) reads `len` initialised bytes of a live local; `fd` is the
    // open socket this function owns.
    if unsafe { libc::bind(fd.as_raw_fd(), &ss as *const _ as *const libc::sockaddr, len) } != 0 {
        return Err(Error::os(format!("bind({want})"), io::Error::last_os_error()));
    }
    // SAFETY: listen(2) takes no pointers; `fd` is the open socket this function owns.
    if unsafe { libc::listen(fd.as_raw_fd(), 1024) } != 0 {
        return Err(Error::os(format!("listen({want})"), io::Error::last_os_error()));
    }
    // SAFETY: sockaddr_storage is plain C data; all-zero bytes are a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `ss` is a live local sockaddr_storage and `len` holds its size, so getsockname(2)
    // writes at most that many bytes (it truncates, never overruns) and updates `len`; `fd` is the
    // open socket this function owns.
    if unsafe { libc::getsockname(fd.as_raw_fd(), &mut ss as *mut _ as *mut libc::sockaddr, &mut len) } != 0 {
        return Err(Error::os("getsockname()", io::Error::last_os_error()));
    }
    let bound = from_sockaddr(&ss).ok_or_else(|| Error::system("getsockname(): unknown family"))?;
    Ok((fd, bound))
}

/// Accept one pending connection, if any.
pub fn accept(lfd: &OwnedFd) -> Result<Option<(OwnedFd, SocketAddr)>> {
    // SAFETY: sockaddr_storage is plain C data; all-zero bytes are a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `lfd` is a borrowed OwnedFd, so the listening socket is open for the call; `ss` is a
    // live local sockaddr_storage and `len` holds its size, so accept4(2) writes at most `len`
    // bytes of the peer's address into it and updates `len`.
    let fd = unsafe {
        libc::accept4(
            lfd.as_raw_fd(),
            &mut ss as *mut _ as *mut libc::sockaddr,
            &mut len,
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) | Some(libc::ECONNABORTED) => Ok(None),
            _ => Err(Error::os("accept()", e)),
        };
    }
    // SAFETY: accept4(2) returned a new descriptor (checked >= 0) that nothing else owns, so the
    // OwnedFd becomes its sole owner.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let peer = from_sockaddr(&ss).unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
    Ok(Some((fd, peer)))
}

/// Start a non-blocking connect; completion is checked with [`connect_done`].
pub fn connect_start(addr: &SocketAddr) -> Result<OwnedFd> {
    let fd = new_socket(addr).map_err(|e| Error::os("socket()", e))?;
    let (ss, len) = sockaddr(addr);
    // SAFETY: `ss` and `len` come from `sockaddr` (a filled sockaddr_in or sockaddr_in6 and its
    // exact size); connect(2) reads them only during the call; `fd` is the open socket owned here.
    let rc = unsafe { libc::connect(fd.as_raw_fd(), &ss as *const _ as *const libc::sockaddr, len) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(connect_error(addr, e));
        }
    }
    Ok(fd)
}

fn connect_error(addr: &SocketAddr, e: io::Error) -> Error {
    let hint = match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => ": nothing listens there any more (did the peer process exit?)",
        Some(libc::ENETUNREACH) | Some(libc::EHOSTUNREACH) => {
            ": no route; check NCCL_SOCKET_IFNAME selects an interface both hosts can reach"
        }
        _ => "",
    };
    Error::system(format!("connect to {addr} failed: {e}{hint}"))
}

/// Ok(true) once the connect finished, Ok(false) while it is in progress.
pub fn connect_done(fd: &OwnedFd, addr: &SocketAddr) -> Result<bool> {
    let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
    // SAFETY: `p` is one live local pollfd and nfds is 1, so poll(2) reads `fd`/`events` and writes
    // `revents` of that one entry; timeout 0 returns at once. `fd` is a borrowed OwnedFd, open for
    // the call.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    if n <= 0 {
        return Ok(false);
    }
    let mut err: i32 = 0;
    let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: optval points to `err`, a live local i32, and `len` holds size_of::<i32>(), the size
    // SO_ERROR takes, so getsockopt(2) writes at most those 4 bytes; `fd` is a borrowed OwnedFd,
    // open for the call. (If the call fails, `err` stays 0.)
    unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_ERROR, &mut err as *mut i32 as *mut _, &mut len)
    };
    if err != 0 {
        return Err(connect_error(addr, io::Error::from_raw_os_error(err)));
    }
    Ok(true)
}

/// Options for a data stream: no Nagle delay, and keepalive, so that a peer host that vanishes
/// while the connection is idle is found within `timeout` (idle `timeout`/2, then 3 probes
/// `timeout`/6 apart). TCP_USER_TIMEOUT is not set: it also aborts a connection held at zero
/// window by a receiver that is alive but late (its kernel answers the window probes, its
/// application has not posted the receive yet), which must be waited for however long. A host that
/// stops answering while data is outstanding is found by [`Stall`] instead.
pub fn tune(fd: &OwnedFd, timeout: Duration) {
    let f = fd.as_raw_fd();
    let secs = timeout.as_secs().max(1) as i32;
    let _ = setopt(f, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1i32);
    let _ = setopt(f, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1i32);
    let _ = setopt(f, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, (secs / 2).max(1));
    let _ = setopt(f, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, (secs / 6).max(1));
    let _ = setopt(f, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3i32);
}

/// What the kernel knows of a stream's unanswered segments (TCP_INFO).
#[derive(Debug, Clone, Copy, Default)]
pub struct Unanswered {
    /// Consecutive retransmissions of the oldest unacknowledged segment, unanswered.
    pub retransmits: u8,
    /// Zero-window probes sent and not answered.
    pub probes: u8,
    /// Milliseconds since the last ACK came from the peer.
    pub last_ack_ms: u32,
}

pub fn unanswered(fd: RawFd) -> Option<Unanswered> {
    // SAFETY: tcp_info is a plain C struct of integer fields; all-zero bytes are a valid value.
    let mut ti: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `ti` is a live local tcp_info and `len` holds its size, so getsockopt(2) writes at
    // most `len` bytes into it (and the length written back into `len`). `fd` is a raw number from
    // the caller, meant to be one of its open streams; a wrong or closed fd only makes the call
    // fail (rc != 0) or report another socket's counters, and nothing but `ti` and `len` is written
    // either way.
    let rc = unsafe { libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, &mut ti as *mut _ as *mut libc::c_void, &mut len) };
    (rc == 0).then_some(Unanswered { retransmits: ti.tcpi_retransmits, probes: ti.tcpi_probes, last_ack_ms: ti.tcpi_last_ack_recv })
}

/// Watches a stream whose bytes cannot move. A live peer host acknowledges: the data, or, when its
/// application is late and its receive window is full, each zero-window probe, which resets the
/// probe count. A vanished host answers nothing, so retransmissions or probes go unanswered. The
/// stream is declared unreachable when it has been blocked for `timeout`, the last ACK is as old,
/// and at least two retransmissions or probes in a row are unanswered: never for a receiver that
/// is only late, however late.
pub struct Stall {
    since: Option<Instant>,
    calls: u32,
}

impl Default for Stall {
    fn default() -> Self {
        Stall::new()
    }
}

impl Stall {
    pub const fn new() -> Stall {
        Stall { since: None, calls: 0 }
    }

    /// Bytes moved on the stream.
    pub fn moved(&mut self) {
        self.since = None;
    }

    /// An attempt found the stream blocked. The clock is read every `every` calls (1 on a
    /// sleeping helper thread; more on a polling path, where the clock can be a system call).
    /// Some(error text) when the peer host is unreachable.
    pub fn blocked(&mut self, fd: RawFd, timeout: Duration, every: u32) -> Option<String> {
        self.calls = self.calls.wrapping_add(1);
        if self.since.is_some() && self.calls % every.max(1) != 0 {
            return None;
        }
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        let blocked = now.duration_since(since);
        if blocked < timeout {
            return None;
        }
        let u = unanswered(fd)?;
        let unanswered = u.retransmits.max(u.probes);
        if unanswered >= 2 && u64::from(u.last_ack_ms) >= timeout.as_millis() as u64 {
            return Some(format!(
                "no acknowledgement for {:.1} s ({} {} unanswered)",
                u.last_ack_ms as f64 / 1000.0,
                unanswered,
                if u.probes > u.retransmits { "window probes" } else { "retransmissions" }
            ));
        }
        None
    }
}

/// The error of a failed stream operation (`dir`: "sending" or "receiving"), naming the cause as
/// the kernel reported it: reset (the peer process closed or died) or timed out (the peer host
/// stopped answering: down, or the network between the hosts broken).
pub fn stream_error(peer: SocketAddr, stream: usize, dir: &str, e: &io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::EPIPE) | Some(libc::ECONNRESET) => {
            Error::remote(format!("connection to {peer} (stream {stream}) was reset while {dir}: the peer process closed or died"))
        }
        _ if host_unreachable(e) => Error::remote(format!(
            "the peer host {} is unreachable (stream {stream}, while {dir}: {e}): it stopped answering for RIVET_TIMEOUT seconds, so it is down or the network between the hosts is broken",
            peer.ip()
        )),
        _ => Error::system(format!("{dir} on stream {stream} to {peer}: {e}")),
    }
}

/// Whether a socket error means the peer host stopped answering (keepalive or retransmissions
/// timed out, or its route went away), as opposed to its process closing the connection.
pub fn host_unreachable(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ETIMEDOUT) | Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH))
}

/// The error of a stream that [`Stall`] found unreachable.
pub fn unreachable_error(peer: SocketAddr, stream: usize, why: &str) -> Error {
    Error::remote(format!(
        "the peer host {} is unreachable (stream {stream} to {peer}: {why}): it is down or the network between the hosts is broken (a peer that is only slow to receive is waited for)",
        peer.ip()
    ))
}

pub enum Io {
    /// This many bytes moved.
    Done(usize),
    /// Nothing can move now.
    WouldBlock,
    /// The peer closed its end (read returned 0).
    Closed,
}

fn classify(rc: isize) -> io::Result<Io> {
    if rc > 0 {
        return Ok(Io::Done(rc as usize));
    }
    if rc == 0 {
        return Ok(Io::Closed);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(Io::WouldBlock),
        _ => Err(e),
    }
}

/// Gathered non-blocking send. An empty `iov` is a no-op.
///
/// # Safety
/// Each iovec names `iov_len` readable bytes at `iov_base`, kept alive for the call.
pub unsafe fn send_iov(fd: RawFd, iov: &[libc::iovec]) -> io::Result<Io> {
    if iov.is_empty() {
        return Ok(Io::Done(0));
    }
    // SAFETY: msghdr is a plain C struct of integers and pointers; all-zero (no name, no control
    // data, flags 0) is a valid value, and the iov fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len();
    // SAFETY: `msg` is a live local msghdr with no name and no control data, and its iov is the
    // caller's `iov` slice with its length (sendmsg(2) only reads the iovecs, despite the `*mut`
    // cast). The kernel reads `iov_len` bytes at each `iov_base`: the caller's promise.
    // MSG_NOSIGNAL|MSG_DONTWAIT: no SIGPIPE, no blocking.
    let rc = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    match classify(rc)? {
        // A zero-byte send of a non-empty iovec cannot happen on a stream socket; treat as blocked.
        Io::Closed => Ok(Io::WouldBlock),
        x => Ok(x),
    }
}

/// Non-blocking receive into `buf[..len]`.
///
/// # Safety
/// `buf` is valid for `len` writable bytes that nothing else reads or writes during the call.
pub unsafe fn recv_into(fd: RawFd, buf: *mut u8, len: usize) -> io::Result<Io> {
    // SAFETY: recv(2) writes at most `len` bytes at `buf`: the caller's promise. MSG_DONTWAIT:
    // never blocks.
    let rc = unsafe { libc::recv(fd, buf as *mut libc::c_void, len, libc::MSG_DONTWAIT) };
    classify(rc)
}

/// Best-effort non-blocking send of a small control message (a NACK before closing).
pub fn send_small(fd: &OwnedFd, b: &[u8]) -> io::Result<Io> {
    let iov = libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() };
    // SAFETY: the iovec names the caller's slice, alive for the call.
    unsafe { send_iov(fd.as_raw_fd(), &[iov]) }
}
