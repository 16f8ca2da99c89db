//! The out-of-band TCP room both transports set up over: the network interfaces ([`ifaces`]),
//! non-blocking sockets ([`sock`]), and the handshake as a pair of non-blocking state machines
//! (connector and listener: the listen handle's magic, hellos, acknowledgements, the rejection
//! of foreign clients), so that NCCL's `connect` and `accept` never block. The TCP transport
//! (`transport::socket`) carries its data on the streams it yields; the verbs transport sets up
//! its queue pairs over one and keeps it as the peer's pulse ([`pulse`]).

pub mod ifaces;
pub mod pulse;
pub mod sock;

use crate::error::{Error, Result};
use crate::proto::{self, Handle, Hello, ACK_SIZE, HELLO_SIZE};
use ifaces::Iface;
use sock::Io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use crate::log::Steps;
use std::time::{Duration, Instant};

pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if getrandom::getrandom(&mut b).is_err() {
        // Never fails on Linux >= 3.17; fall back to time and address entropy regardless.
        let t = Instant::now().elapsed().as_nanos() as u64 ^ (std::process::id() as u64) << 32;
        return t ^ (&b as *const _ as u64);
    }
    u64::from_le_bytes(b).max(1)
}

/// A connection whose hello has not fully arrived yet.
struct Pending {
    fd: OwnedFd,
    peer: SocketAddr,
    buf: [u8; HELLO_SIZE],
    got: usize,
    since: Instant,
}

/// Streams of one connector, gathered until all have said hello.
struct Group {
    conn_id: u64,
    min_chunk: usize,
    streams: Vec<Option<OwnedFd>>,
    have: usize,
    peer: SocketAddr,
    since: Instant,
    ack: [u8; ACK_SIZE],
    ack_sent: usize,
    /// From the first stream's TCP connection accepted.
    steps: Steps,
}

/// Most half-open connections a listen comm keeps; beyond this the oldest is dropped.
const MAX_PENDING: usize = 256;
/// Most partial connections (a rivet client with some of its streams in) a listen comm keeps.
const MAX_GROUPS: usize = 256;
/// Rejections WARNed one by one per listen comm; after these, one summary line per interval.
const REJECT_WARNS: u32 = 8;
const REJECT_INTERVAL: Duration = Duration::from_secs(10);

/// The WARNs of a listen comm's rejections, rate-limited: a flood of foreign clients must not
/// flood the job's log. The first few are WARNed each; after that they are counted, and one line
/// per interval says how many and the last one's peer and reason.
struct RejectLog {
    warned: u32,
    counted: u64,
    since: Instant,
    last: Option<(SocketAddr, String)>,
}

impl RejectLog {
    fn new() -> RejectLog {
        RejectLog { warned: 0, counted: 0, since: Instant::now(), last: None }
    }

    fn note(&mut self, addr: SocketAddr, peer: SocketAddr, why: &str) {
        if self.warned < REJECT_WARNS {
            self.warned += 1;
            let more = if self.warned == REJECT_WARNS {
                format!("; further rejections on this socket are counted and reported once per {} s", REJECT_INTERVAL.as_secs())
            } else {
                String::new()
            };
            log::warn!("NET/rivet: listen socket {addr}: rejected a connection from {peer}: {why}; the listen comm keeps accepting{more}");
            self.since = Instant::now();
            return;
        }
        self.counted += 1;
        self.last = Some((peer, why.to_string()));
        if self.since.elapsed() >= REJECT_INTERVAL {
            self.flush(addr);
        }
    }

    fn flush(&mut self, addr: SocketAddr) {
        if let Some((peer, why)) = self.last.take() {
            log::warn!(
                "NET/rivet: listen socket {addr}: rejected {} more connection(s) in the last {:.0} s (the last from {peer}: {why}); the listen comm keeps accepting",
                self.counted,
                self.since.elapsed().as_secs_f64()
            );
        }
        self.counted = 0;
        self.since = Instant::now();
    }
}

/// A connection whose TCP handshake is done: the streams, in order, and the peer.
pub struct Link {
    pub fds: Vec<OwnedFd>,
    pub peer: SocketAddr,
    pub min_chunk: usize,
    /// The setup's steps so far (timed with `NCCL_DEBUG=INFO`): the transport carries them on
    /// to its connection's INFO line.
    pub steps: Steps,
    /// A connector's link handed over before the listener's acknowledgement came
    /// ([`Connector::ack_later`]): the transport reads it off the first stream, ahead of anything
    /// else the listener sends there.
    pub ack: Option<AckWait>,
}

/// The listener's acknowledgement of a connection, as it arrives on the first stream.
pub struct AckWait {
    conn_id: u64,
    buf: [u8; ACK_SIZE],
    got: usize,
}

impl AckWait {
    fn new(conn_id: u64) -> AckWait {
        AckWait { conn_id, buf: [0; ACK_SIZE], got: 0 }
    }

    /// Non-blocking: true once the whole acknowledgement is in and accepts the connection; an
    /// error when it rejects it (a wrong handle magic: a usage error), is garbage, or the
    /// listener closed the stream first.
    pub fn read(&mut self, fd: &OwnedFd, peer: SocketAddr) -> Result<bool> {
        while self.got < ACK_SIZE {
            let got = self.got;
            // SAFETY: `got < ACK_SIZE`, so `buf + got` is within `self.buf`, and recv_into may
            // write the `ACK_SIZE - got` bytes left in that array, which nothing else touches
            // during the call.
            match unsafe { sock::recv_into(std::os::fd::AsRawFd::as_raw_fd(fd), self.buf.as_mut_ptr().add(got), ACK_SIZE - got) } {
                Ok(Io::Done(n)) => self.got += n,
                Ok(Io::WouldBlock) => return Ok(false),
                Ok(Io::Closed) => {
                    return Err(Error::remote(format!(
                        "the listener at {peer} closed the connection during the handshake (see the peer's log for the reason)"
                    )))
                }
                Err(e) => return Err(Error::remote(format!("handshake with {peer} failed: {e}"))),
            }
        }
        match proto::decode_ack(&self.buf) {
            Some((id, proto::ACK_OK)) if id == self.conn_id => Ok(true),
            Some((_, proto::ACK_BAD_MAGIC)) => Err(Error::usage(format!(
                "the listener at {peer} rejected our handle: its magic does not match that listen comm (a stale handle, or one meant for another listen call)"
            ))),
            _ => Err(Error::remote(format!("the listener at {peer} answered the handshake with garbage"))),
        }
    }
}

pub struct Listener {
    fd: OwnedFd,
    pub addr: SocketAddr,
    magic: u64,
    timeout: Duration,
    pending: Vec<Pending>,
    groups: Vec<Group>,
    rejects: RejectLog,
    /// Calls of [`Listener::accept_busy`] made while busy (every BUSY_ACCEPT_EVERY-th of them
    /// looks for new connections).
    busy_polls: u32,
}

/// While a listen comm's owner has a connection in setup, one `accept` call in this many asks
/// the kernel for a new connection: the others would each be a system call that finds none
/// (NCCL calls `accept` until that connection is done, and a job sets up hundreds at once),
/// and a new connection still waits in the kernel's backlog for no more than a few calls.
const BUSY_ACCEPT_EVERY: u32 = 8;

impl Drop for Listener {
    fn drop(&mut self) {
        self.rejects.flush(self.addr);
    }
}

impl Listener {
    pub fn new(iface: &Iface, transport: u8, timeout: Duration) -> Result<(Listener, Handle)> {
        let (fd, addr) = sock::listen(iface.addr)
            .map_err(|e| Error::system(format!("listen on {} ({}): {e}", iface.name, iface.addr)))?;
        let magic = random_u64();
        let h = Handle { transport, magic, addr, members: 1, gids: Vec::new() };
        Ok((Listener { fd, addr, magic, timeout, pending: Vec::new(), groups: Vec::new(), rejects: RejectLog::new(), busy_polls: 0 }, h))
    }

    fn reject(&mut self, p: &Pending, why: &str) {
        self.rejects.note(self.addr, p.peer, why);
    }

    /// Non-blocking: returns a receive connection once a connector's streams have all arrived and
    /// been acknowledged. Foreign clients, garbage and wrong handles are dropped with a WARN.
    pub fn accept(&mut self) -> Result<Option<Link>> {
        self.accept_busy(false)
    }

    /// [`Listener::accept`] for an owner that has `busy` connections of this listen comm in
    /// setup still: it then looks for new ones only every few calls, but always reads the hellos
    /// of those the kernel gave it.
    pub fn accept_busy(&mut self, busy: bool) -> Result<Option<Link>> {
        let look = !busy || {
            self.busy_polls = self.busy_polls.wrapping_add(1);
            self.busy_polls % BUSY_ACCEPT_EVERY == 0
        };
        for _ in 0..if look { 64 } else { 0 } {
            match sock::accept(&self.fd)? {
                Some((fd, peer)) => {
                    if self.pending.len() >= MAX_PENDING {
                        let old = self.pending.remove(0);
                        self.reject(&old, "too many half-open connections");
                    }
                    self.pending.push(Pending { fd, peer, buf: [0; HELLO_SIZE], got: 0, since: Instant::now() })
                }
                None => break,
            }
        }
        self.read_hellos();
        self.expire();
        self.finish_group()
    }

    fn read_hellos(&mut self) {
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            // SAFETY: `p.got < HELLO_SIZE` while the connection is pending (it is removed as soon
            // as its hello is whole), so `buf + got` is inside `p.buf`, and recv_into may write the
            // `HELLO_SIZE - p.got` bytes left in that array, which nothing else touches meanwhile.
            let r = unsafe { sock::recv_into(
                std::os::fd::AsRawFd::as_raw_fd(&p.fd),
                p.buf.as_mut_ptr().add(p.got),
                HELLO_SIZE - p.got,
            ) };
            match r {
                Ok(Io::Done(n)) => {
                    p.got += n;
                    if p.got < HELLO_SIZE {
                        continue; // read again on this one
                    }
                    let p = self.pending.swap_remove(i);
                    self.on_hello(p);
                }
                Ok(Io::WouldBlock) => i += 1,
                Ok(Io::Closed) => {
                    let p = self.pending.swap_remove(i);
                    let why = format!("truncated handshake: the client closed after {} of {HELLO_SIZE} bytes", p.got);
                    self.reject(&p, &why);
                }
                Err(e) => {
                    let p = self.pending.swap_remove(i);
                    self.reject(&p, &format!("handshake read failed: {e}"));
                }
            }
        }
    }

    fn on_hello(&mut self, p: Pending) {
        let h = match Hello::decode(&p.buf) {
            Ok(h) => h,
            Err(e) => return self.reject(&p, &e.to_string()),
        };
        if h.listen_magic != self.magic {
            self.reject(
                &p,
                &format!(
                    "its handle magic {:#018x} is not this listen comm's {:#018x} (a handle from another listen call, an earlier job, or corrupted in transit)",
                    h.listen_magic, self.magic
                ),
            );
            let _ = sock::send_small(&p.fd, &proto::encode_ack(h.conn_id, proto::ACK_BAD_MAGIC));
            return;
        }
        let gi = match self.groups.iter().position(|g| g.conn_id == h.conn_id) {
            Some(gi) => gi,
            None => {
                if self.groups.len() >= MAX_GROUPS {
                    // The oldest partial connection goes (its streams are closed with it).
                    let old = self.groups.remove(0);
                    let why = format!("too many partial connections ({} of {} streams arrived)", old.have, old.streams.len());
                    self.rejects.note(self.addr, old.peer, &why);
                }
                self.groups.push(Group {
                    conn_id: h.conn_id,
                    min_chunk: h.min_chunk as usize,
                    streams: (0..h.nstreams).map(|_| None).collect(),
                    have: 0,
                    peer: p.peer,
                    since: p.since,
                    ack: proto::encode_ack(h.conn_id, proto::ACK_OK),
                    ack_sent: 0,
                    steps: Steps::since(p.since),
                });
                self.groups.len() - 1
            }
        };
        let g = &mut self.groups[gi];
        let consistent = g.streams.len() == h.nstreams as usize;
        match g.streams.get_mut(h.stream as usize) {
            Some(s) if s.is_none() && consistent => {
                *s = Some(p.fd);
                g.have += 1;
                if g.have == g.streams.len() {
                    g.steps.mark("hello");
                }
            }
            _ => self.reject(&p, &format!("duplicate or inconsistent stream {} of {}", h.stream, h.nstreams)),
        }
    }

    fn expire(&mut self) {
        let t = self.timeout;
        let (old, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending).into_iter().partition(|p| p.since.elapsed() > t);
        self.pending = keep;
        for p in &old {
            self.reject(p, &format!("no complete handshake within RIVET_TIMEOUT={}s ({} bytes received)", t.as_secs(), p.got));
        }
        let (old, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.groups).into_iter().partition(|g| g.since.elapsed() > t);
        self.groups = keep;
        for g in &old {
            let why = format!("only {} of {} streams arrived within RIVET_TIMEOUT={}s", g.have, g.streams.len(), t.as_secs());
            self.rejects.note(self.addr, g.peer, &why);
        }
    }

    fn finish_group(&mut self) -> Result<Option<Link>> {
        let Some(gi) = self.groups.iter().position(|g| g.have == g.streams.len()) else { return Ok(None) };
        let g = &mut self.groups[gi];
        let Some(fd0) = g.streams[0].as_ref() else { return Ok(None) };
        match sock::send_small(fd0, &g.ack[g.ack_sent..]) {
            Ok(Io::Done(n)) => g.ack_sent += n,
            Ok(_) => return Ok(None),
            Err(e) => {
                let g = self.groups.swap_remove(gi);
                log::warn!("NET/rivet: listen socket {}: connection from {} failed during the handshake: {e}", self.addr, g.peer);
                return Ok(None);
            }
        }
        if g.ack_sent < ACK_SIZE {
            return Ok(None);
        }
        let mut g = self.groups.swap_remove(gi);
        let fds: Vec<OwnedFd> = g.streams.into_iter().map(|s| s.unwrap()).collect();
        for fd in &fds {
            sock::tune(fd, self.timeout);
        }
        g.steps.mark("ack");
        Ok(Some(Link { fds, peer: g.peer, min_chunk: g.min_chunk, steps: g.steps, ack: None }))
    }
}

enum Stage {
    Connecting,
    Hello { sent: usize },
    Done,
}

pub struct Connector {
    peer: SocketAddr,
    conn_id: u64,
    min_chunk: usize,
    streams: Vec<(OwnedFd, Stage)>,
    hellos: Vec<[u8; HELLO_SIZE]>,
    ack: AckWait,
    /// Hand the link over once the hellos are written, the acknowledgement still to read.
    ack_later: bool,
    deadline: Instant,
    timeout: Duration,
    /// Polls that did not finish (the deadline is looked at every 16th: the clock can be a
    /// system call, and a thousand connects set up together are each polled over and over).
    polls: u32,
    /// From the connect's first call.
    steps: Steps,
}

impl Connector {
    pub fn new(h: &Handle, nstreams: usize, min_chunk: usize, timeout: Duration) -> Result<Connector> {
        let now = Instant::now();
        let conn_id = random_u64();
        let mut streams = Vec::with_capacity(nstreams);
        let mut hellos = Vec::with_capacity(nstreams);
        for i in 0..nstreams {
            streams.push((sock::connect_start(&h.addr)?, Stage::Connecting));
            hellos.push(
                Hello { listen_magic: h.magic, conn_id, stream: i as u16, nstreams: nstreams as u16, min_chunk: min_chunk as u32 }
                    .encode(),
            );
        }
        Ok(Connector {
            peer: h.addr,
            conn_id,
            min_chunk,
            streams,
            hellos,
            ack: AckWait::new(conn_id),
            ack_later: false,
            deadline: now + timeout,
            timeout,
            polls: 0,
            steps: Steps::since(now),
        })
    }

    /// The link is handed over as soon as every hello is written, the listener's acknowledgement
    /// left in [`Link::ack`] for the caller to read before anything else on the first stream: a
    /// transport that answers the listener anyway (the verbs setup's metadata) saves the round
    /// trip of waiting for it first.
    pub fn ack_later(mut self) -> Connector {
        self.ack_later = true;
        self
    }

    /// Non-blocking: Some once every stream is connected, has sent its hello, and the listener
    /// acknowledged the connection (or, with [`Connector::ack_later`], once the hellos are sent).
    pub fn poll(&mut self) -> Result<Option<Link>> {
        let peer = self.peer;
        let mut hellos_done = false;
        for (i, (fd, st)) in self.streams.iter_mut().enumerate() {
            if let Stage::Connecting = st {
                if !sock::connect_done(fd, &peer)? {
                    continue;
                }
                *st = Stage::Hello { sent: 0 };
            }
            if let Stage::Hello { sent } = st {
                match sock::send_small(fd, &self.hellos[i][*sent..]) {
                    Ok(Io::Done(n)) => *sent += n,
                    Ok(_) => {}
                    Err(e) => return Err(Error::remote(format!("handshake with {peer} failed: {e}"))),
                }
                if *sent == HELLO_SIZE {
                    *st = Stage::Done;
                    hellos_done = true;
                }
            }
        }
        if self.streams.iter().all(|(_, st)| matches!(st, Stage::Done)) {
            if hellos_done {
                // Connected, and the last hello written into its socket in this call.
                self.steps.mark("TCP and hello");
            }
            if self.ack_later || self.ack.read(&self.streams[0].0, peer)? {
                let fds: Vec<OwnedFd> = std::mem::take(&mut self.streams).into_iter().map(|(f, _)| f).collect();
                for fd in &fds {
                    sock::tune(fd, self.timeout);
                }
                let ack = if self.ack_later {
                    // Not read here at all: the caller's to read, from its first byte.
                    Some(AckWait::new(self.conn_id))
                } else {
                    self.steps.mark("ack");
                    None
                };
                return Ok(Some(Link { fds, peer, min_chunk: self.min_chunk, steps: self.steps, ack }));
            }
        }
        self.polls = self.polls.wrapping_add(1);
        if self.polls % 16 == 0 && Instant::now() > self.deadline {
            return Err(Error::system(format!(
                "connect to {peer} did not complete within RIVET_TIMEOUT={}s (is the peer calling accept? is a firewall dropping the connection?)",
                self.timeout.as_secs()
            )));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests;
