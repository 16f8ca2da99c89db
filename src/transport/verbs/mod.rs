//! The RDMA verbs transport (InfiniBand and RoCE): RC queue pairs, receiver-driven RDMA WRITE
//! (see [`conn`]), a per-device MR cache ([`mr`]).
//!
//! Connection setup reuses the TCP machinery of the socket transport for the out-of-band link
//! (one stream, the same hello / ack and handle magic), then exchanges one versioned,
//! length-checked [`Meta`] each way and a one-byte "ready" from the sender. Both directions are
//! non-blocking state machines driven by NCCL's repeated `connect` / `accept` calls.

pub mod conn;
pub mod dev;
pub mod device;
pub mod eager;
pub mod ece;
pub mod fuse;
pub mod mr;
pub mod nic;
mod pool;
mod post;
pub mod recv;
pub mod reg;
pub mod res;
pub mod select;
pub mod send;
pub mod survey;

use crate::config;
use crate::error::{Error, Result};
use crate::proto::verbs::{fifo_bytes, MemberMeta, Meta, FIFO_DEPTH, MAX_QPS, META_SIZE, SIZES_ENTRY};
use fuse::MAX_MEMBERS;
use crate::sys::ib::*;
use crate::transport::oob::sock::{self, Io};
use crate::transport::oob::{AckWait, Link};
use crate::transport::DataPath;
use conn::Common;
pub use device::VerbsDevice;
use recv::VerbsRecv;
use send::{Ring, VerbsSend};
use dev::{mtu_bytes, IbDevice, IbPort};
use pool::Held;
use res::{Cq, PathParams, QpCaps, QpInit, QpRts, RegBuf, RemoteQp};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

const READY: u8 = 0x52;

/// The sender's traffic class and service level, as net_ib chooses them (and sends them to the
/// receiver): NCCL_IB_TC / NCCL_IB_SL, else the communicator's traffic class (v10+; for the
/// service level its low 4 bits), else 0.
fn sender_qos(ib_tc: Option<u8>, ib_sl: Option<u8>, comm_tc: Option<u8>) -> (u8, u8) {
    (ib_tc.or(comm_tc).unwrap_or(0), ib_sl.or(comm_tc.map(|t| t & 0xf)).unwrap_or(0))
}

/// The traffic class of the receiver's queue pairs, which carry its control writes (CTS entries,
/// credits): NCCL_IB_FIFO_TC on RoCE, else the sender's.
fn receiver_tc(fifo_tc: Option<u8>, roce: bool, sender_tc: u8) -> u8 {
    fifo_tc.filter(|_| roce).unwrap_or(sender_tc)
}


/// Local resources of a connection before its QPs are connected.
enum Local {
    Send { qps: Vec<QpInit>, cqs: Vec<Cq>, mem: [Held; 2], parts: send::Parts },
    Recv { qps: Vec<QpInit>, cqs: Vec<Cq>, mem: [Held; 2], parts: recv::Parts },
}

enum Step {
    /// Receiver: waiting for the sender's metadata before creating anything.
    RecvMeta,
    /// Sending our metadata (and, for the sender, receiving the peer's).
    Exchange,
    /// Sender: QPs connected, sending the ready byte.
    SendReady,
    /// Receiver: QPs connected, waiting for the ready byte.
    WaitReady,
}

pub struct Setup {
    /// The device's members (one port for a physical device); queue pair `q` runs on member
    /// `q % members`.
    ports: &'static [&'static IbPort],
    /// "rxe0", or a fused device's "rxe0+rxe2".
    name: String,
    /// Members of the peer's device (from the listen handle, or the sender's metadata).
    rem_members: usize,
    send: bool,
    fd: Option<OwnedFd>,
    /// The connector's: the listener's acknowledgement, not yet read (it comes before the
    /// listener's metadata).
    ack: Option<AckWait>,
    peer: SocketAddr,
    // Connected QPs drop before `local`, which holds their CQ.
    connected: Option<Vec<QpRts>>,
    /// How each queue pair was connected (a failed one taken back is connected the same way).
    links: Vec<res::Link>,
    local: Option<Local>,
    peer_meta: Option<Meta>,
    out: [u8; META_SIZE],
    sent: usize,
    inb: [u8; META_SIZE],
    got: usize,
    step: Step,
    nqps: usize,
    tc: u8,
    sl: u8,
    /// Our metadata (the receiver's ECE replies added once its queue pairs connect, `out` redone).
    meta: Option<Meta>,
    /// The sender's parts per rendezvous message (NCCL_IB_SPLIT_DATA_ON_QPS), told the receiver.
    parts: usize,
    /// ECE per queue pair: the sender's offer; then what each runs with (both sides).
    ece: Vec<Option<crate::proto::verbs::Ece>>,
    /// This side's members whose port was down at setup (bit m), as our metadata says.
    down: u8,
    /// The queue pairs left in INIT for a member down here or at the peer (`fuse::born_down`), and
    /// the members, for the comm's record.
    born_down: u32,
    born_why: String,
    /// Every queue pair on a member down at setup (the members named): connected all the same.
    all_down: Option<String>,
    deadline: Instant,
    timeout: Duration,
    /// Polls that found nothing to do (the deadline is looked at every LATE_EVERY of them).
    idle_polls: u32,
    /// The setup's steps (timed with NCCL_DEBUG=INFO), for the connection's INFO line.
    steps: crate::log::Steps,
}

/// Idle setup polls between two looks at the clock, which can be a system call: a thousand
/// connections set up together are each polled over and over.
const LATE_EVERY: u32 = 16;

// SAFETY: the verbs objects inside (QPs, CQ, registered buffers) are owned by this setup and
// used by one call at a time (NCCL's connect or accept, under the listen comm's or the
// connector's lock); libibverbs objects may be used from any thread.
unsafe impl Send for Setup {}

fn caps(send_wr: u32, recv_wr: u32, inline: u32) -> QpCaps {
    QpCaps { send_wr, recv_wr, send_sge: 2, inline }
}

impl Setup {
    /// The sender's side, once the out-of-band link is up, to a listener of `rem_members`
    /// members. `traffic_class` is the communicator's (v11+), used when NCCL_IB_TC is unset.
    pub fn connector(ports: &'static [&'static IbPort], name: &str, link: Link, rem_members: usize, traffic_class: Option<u8>) -> Result<Setup> {
        let cfg = config::get();
        // Every member of the larger side carries NCCL_IB_QPS_PER_CONNECTION queue pairs.
        let nqps = fuse::nqps(ports.len(), rem_members, cfg.ib_qps, MAX_QPS);
        let mut s = Setup::new(ports, name, true, link, nqps);
        s.rem_members = rem_members;
        // NCCL_IB_SPLIT_DATA_ON_QPS=1: every queue pair carries a part of each message; 0 (net_ib's
        // default): one per member of the larger side, on queue pairs that rotate per message.
        s.parts = if cfg.ib_split_data_on_qps { nqps } else { ports.len().max(rem_members).min(nqps) };
        (s.tc, s.sl) = sender_qos(cfg.ib_tc, cfg.ib_sl, traffic_class);
        s.create_local()?;
        s.steps.mark("queue pairs made");
        s.step = Step::Exchange;
        Ok(s)
    }

    /// The receiver's side, once the out-of-band link is up.
    pub fn acceptor(ports: &'static [&'static IbPort], name: &str, link: Link) -> Setup {
        Setup::new(ports, name, false, link, 0)
    }

    fn new(ports: &'static [&'static IbPort], name: &str, send: bool, mut link: Link, nqps: usize) -> Setup {
        let timeout = config::get().timeout();
        Setup {
            ports,
            name: name.to_string(),
            rem_members: 1,
            send,
            fd: link.fds.drain(..).next(),
            ack: link.ack.take(),
            peer: link.peer,
            local: None,
            connected: None,
            links: Vec::new(),
            peer_meta: None,
            out: [0; META_SIZE],
            sent: 0,
            inb: [0; META_SIZE],
            got: 0,
            step: Step::RecvMeta,
            nqps,
            tc: 0,
            sl: 0,
            meta: None,
            parts: 1,
            ece: Vec::new(),
            down: 0,
            born_down: 0,
            born_why: String::new(),
            all_down: None,
            deadline: Instant::now() + timeout,
            timeout,
            idle_polls: 0,
            steps: link.steps,
        }
    }

    fn create_local(&mut self) -> Result<()> {
        let ps = self.ports;
        let p = ps[0];
        let devs: Vec<&IbDevice> = ps.iter().map(|p| &*p.dev).collect();
        let cfg = config::get();
        let (nq, ln) = (self.nqps, ps.len());
        let depths = conn::Depths::get();
        // A fused device's members whose port is down now: their queue pairs are made but not
        // connected (the peer learns it from our metadata), and the comm starts failed over off
        // them. The port's state now (after its events): one that flapped and is ACTIVE again
        // connects. A single port is not asked (a device query per connection): down, it leaves
        // nothing to start on, and its queue pairs are connected as they always were.
        let down = |m: usize| {
            use nic::NicPort;
            ps[m].poll_events();
            ps[m].state().is_some_and(|s| s != "ACTIVE")
        };
        self.down = if ln == 1 { 0 } else { (0..ln).filter(|&m| down(m)).fold(0u8, |d, m| d | 1 << m) };
        // One CQ per member (a CQ belongs to one device), holding its queue pairs' completions.
        let on = |m: usize| (0..nq).filter(|&q| fuse::member_of(q, ln) == m).count() as u32;
        let (local, fifo_addr, qpns) = if self.send {
            let cqs = (0..ln).map(|m| Cq::new(&ps[m].dev, depths.send_cq(on(m)) as usize)).collect::<Result<Vec<_>>>()?;
            let qps = (0..nq)
                .map(|q| {
                    let m = fuse::member_of(q, ln);
                    QpInit::new(ps[m], &cqs[m], caps(depths.send_sq, 1, conn::SEND_INLINE), IBV_ACCESS_REMOTE_WRITE, cfg.ib_pkey)
                })
                .collect::<Result<Vec<_>>>()?;
            // What the receiver writes (the CTS FIFO for its members' keys, then the credit word):
            // a registration of its own; what only this side's work requests read (the sizes
            // staged for the receiver's FIFO, the eager headers): leased from a slab without
            // remote access (`pool`), so a stray remote write fails. Each on every member.
            let fifo_len = fifo_bytes(self.rem_members) + 64;
            let (remote, [fifo]) = RegBuf::carve(&devs, [fifo_len], IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)?;
            let (local, [sizes_out, hdrs]) = pool::carve(&devs, [FIFO_DEPTH * SIZES_ENTRY, conn::HDRS_BYTES])?;
            let qpns = qps.iter().map(|q| q.qp().qpn()).collect();
            let mut on = res::EceOn::new(qps.iter().map(|q| q.qp()), ps);
            self.ece = ece::offer(&mut on, nq, cfg.ib_ece).map_err(|f| self.ece_failed(f))?;
            let keys: [u32; MAX_MEMBERS] = std::array::from_fn(|m| if m < ln { fifo.rkey_on(m) } else { 0 });
            (Local::Send { qps, cqs, mem: [Held::Own(remote), Held::Leased(local)], parts: send::Parts { fifo, sizes_out, hdrs } }, (fifo.addr(), keys), qpns)
        } else {
            let cqs = (0..ln).map(|m| Cq::new(&ps[m].dev, depths.recv_cq(on(m)) as usize)).collect::<Result<Vec<_>>>()?;
            let qps = (0..nq)
                .map(|q| {
                    let m = fuse::member_of(q, ln);
                    // A fused receiver's CTS entry is 64 bytes: inline too.
                    let inline = if ln > 1 { conn::SEND_INLINE.max(64) } else { conn::SEND_INLINE };
                    QpInit::new(ps[m], &cqs[m], caps(depths.recv_sq, depths.recv_rq, inline), IBV_ACCESS_REMOTE_WRITE, cfg.ib_pkey)
                })
                .collect::<Result<Vec<_>>>()?;
            // What the sender writes (the eager ring, the sizes FIFO): its own registration; what
            // only this side uses (the CTS entries staged, the scratch word of flush reads and
            // credit writes): leased (`pool`). Each on every member.
            let (remote, [ring, sizes_in]) = RegBuf::carve(
                &devs,
                [conn::RING_SLOTS * conn::slot_bytes(cfg.ib_eager_max), FIFO_DEPTH * SIZES_ENTRY],
                IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
            )?;
            let (local, [cts_out, scratch]) = pool::carve(&devs, [recv::cts_stage_bytes(ln), 64])?;
            let qpns = qps.iter().map(|q| q.qp().qpn()).collect();
            let keys: [u32; MAX_MEMBERS] = std::array::from_fn(|m| if m < ln { sizes_in.rkey_on(m) } else { 0 });
            (Local::Recv { qps, cqs, mem: [Held::Own(remote), Held::Leased(local)], parts: recv::Parts { cts_out, sizes_in, ring, scratch } }, (sizes_in.addr(), keys), qpns)
        };
        let (ring_addr, ring_keys, ring_slots, eager_max) = match &local {
            Local::Recv { parts, .. } => {
                let keys: [u32; MAX_MEMBERS] = std::array::from_fn(|m| if m < ln { parts.ring.rkey_on(m) } else { 0 });
                (parts.ring.addr(), keys, conn::RING_SLOTS as u16, cfg.ib_eager_max as u32)
            }
            Local::Send { .. } => (0, [0; MAX_MEMBERS], 0, 0),
        };
        let extra = (1..ln)
            .map(|m| MemberMeta {
                gid: ps[m].gid,
                lid: ps[m].lid,
                port: ps[m].port,
                mtu: ps[m].mtu as u8,
                fifo_rkey: fifo_addr.1[m],
                ring_rkey: ring_keys[m],
                dev_index: ps[m].index,
            })
            .collect();
        let m = Meta {
            nqps: nq as u8,
            link_layer: p.link_layer,
            port: p.port,
            mtu: p.mtu as u8,
            lid: p.lid,
            tc: self.tc,
            sl: self.sl,
            gid: p.gid,
            fifo_addr: fifo_addr.0,
            fifo_rkey: fifo_addr.1[0],
            dev_name: self.name.clone(),
            qpns,
            ring_addr,
            ring_rkey: ring_keys[0],
            ring_slots,
            eager_max,
            dev_index: p.index,
            extra,
            ece: self.ece.clone(),
            parts: if self.send { self.parts as u8 } else { 0 },
            down: self.down,
        };
        self.out = m.encode();
        self.meta = Some(m);
        self.local = Some(local);
        Ok(())
    }

    /// A failed ECE call, as the connection's error.
    fn ece_failed(&self, f: ece::Failed) -> Error {
        Error::system(format!(
            "RDMA setup with {}: {} on queue pair {} of {} failed: {} (NCCL_IB_ECE_ENABLE=0 on the connecting side turns ECE off)",
            self.peer,
            f.call,
            f.q,
            self.name,
            std::io::Error::from_raw_os_error(f.errno)
        ))
    }

    fn fd(&self) -> i32 {
        self.fd.as_ref().map_or(-1, |f| f.as_raw_fd())
    }

    fn read_meta(&mut self) -> Result<Option<Meta>> {
        while self.got < META_SIZE {
            // SAFETY: `got < META_SIZE`: the pointer stays inside `inb`, and so do the bytes after it.
            let r = unsafe { sock::recv_into(self.fd(), self.inb.as_mut_ptr().add(self.got), META_SIZE - self.got) };
            match r {
                Ok(Io::Done(n)) => self.got += n,
                Ok(Io::WouldBlock) => return Ok(None),
                Ok(Io::Closed) => {
                    return Err(Error::remote(format!(
                        "the peer {} closed the connection during RDMA setup (see its log for the reason)",
                        self.peer
                    )))
                }
                Err(e) => return Err(Error::remote(format!("RDMA setup with {} failed: {e}", self.peer))),
            }
        }
        let m = Meta::decode(&self.inb).map_err(|e| Error::remote(format!("RDMA setup with {}: {e}", self.peer)))?;
        let me = self.ports[0];
        if m.link_layer != me.link_layer {
            return Err(Error::usage(format!(
                "RDMA setup with {}: {} is {} but the peer's {} is {}: select ports of one link layer with NCCL_IB_HCA",
                self.peer,
                me.dev.name,
                if me.is_roce() { "RoCE" } else { "InfiniBand" },
                m.dev_name,
                if m.link_layer == IBV_LINK_LAYER_ETHERNET as u8 { "RoCE" } else { "InfiniBand" }
            )));
        }
        if self.send && m.nqps as usize != self.nqps {
            return Err(Error::remote(format!(
                "RDMA setup with {}: the peer created {} queue pairs, we asked for {}",
                self.peer, m.nqps, self.nqps
            )));
        }
        if self.send && (m.ring_slots == 0 || m.ring_addr == 0) {
            return Err(Error::remote(format!("RDMA setup with {}: the receiver announced no eager ring", self.peer)));
        }
        if self.send && m.members() != self.rem_members {
            return Err(Error::remote(format!(
                "RDMA setup with {}: the receiver's device {} has {} member(s), its listen handle said {}",
                self.peer,
                m.dev_name,
                m.members(),
                self.rem_members
            )));
        }
        Ok(Some(m))
    }

    fn write_out(&mut self) -> Result<bool> {
        while self.sent < META_SIZE {
            match sock::send_small(self.fd.as_ref().unwrap(), &self.out[self.sent..]) {
                Ok(Io::Done(n)) => self.sent += n,
                Ok(_) => return Ok(false),
                Err(e) => return Err(Error::remote(format!("RDMA setup with {} failed: {e}", self.peer))),
            }
        }
        Ok(true)
    }

    /// Connect our QPs to the peer's (INIT → RTR → RTS), and the flush QP to itself.
    fn connect_qps(&mut self, m: &Meta) -> Result<()> {
        let cfg = config::get();
        let born = self.born_down(m)?;
        let (ln, rn) = (self.ports.len(), m.members());
        // Queue pair q: our member q % ln to the peer's member q % rn.
        let params = |p: &IbPort, r: &MemberMeta| PathParams {
            mtu: (p.mtu as u8).min(r.mtu) as u32,
            tc: if self.send { self.tc } else { receiver_tc(cfg.ib_fifo_tc, p.is_roce(), m.tc) },
            sl: if self.send { self.sl } else { m.sl },
            timeout: cfg.ib_timeout,
            retry_cnt: cfg.ib_retry_cnt,
            rnr_retry: 7,
        };
        let qps = match self.local.as_mut() {
            Some(Local::Send { qps, .. } | Local::Recv { qps, .. }) => std::mem::take(qps),
            None => return Err(Error::internal("RDMA setup: no local queue pairs")),
        };
        // ECE, before RTR: the receiver sets the sender's offer, the sender the receiver's reply.
        let took = {
            let mut on = res::EceOn::new(qps.iter().map(|q| q.qp()), self.ports);
            if self.send {
                self.ece = ece::apply(&mut on, &self.ece, &m.ece).map_err(|f| self.ece_failed(f))?;
                Vec::new()
            } else {
                ece::accept(&mut on, &m.ece).map_err(|f| self.ece_failed(f))?
            }
        };
        let mut rts = Vec::with_capacity(qps.len());
        for (i, (q, &qpn)) in qps.into_iter().zip(m.qpns.iter()).enumerate() {
            let p = self.ports[fuse::member_of(i, ln)];
            let r = m.member(fuse::member_of(i, rn));
            let remote = RemoteQp { qpn, lid: r.lid, gid: r.gid, mtu: r.mtu as u32, global: p.is_roce() || r.lid == 0 };
            let params = params(p, &r);
            rts.push(if born & (1 << i) != 0 {
                q.parked()
            } else {
                q.rtr(p, &remote, &params).and_then(|q| q.rts(p, &params)).map_err(|e| match &self.all_down {
                    Some(d) => Error::system(format!("{e} (the port of every queue pair is down: {d}: check the links and the switch; ibv_devinfo shows each port's state)")),
                    None => e,
                })?
            });
            self.links.push(res::Link { remote, params, access: IBV_ACCESS_REMOTE_WRITE, pkey_index: cfg.ib_pkey, ece: None });
        }
        if !self.send {
            // After RTS: what the device made of each offer goes back to the sender.
            let mut on = res::EceOn::new(rts.iter().map(|q| q.qp()), self.ports);
            self.ece = ece::reply(&mut on, &took).map_err(|f| self.ece_failed(f))?;
            if let Some(my) = self.meta.as_mut() {
                my.ece = self.ece.clone();
                self.out = my.encode();
            }
        }
        for (l, e) in self.links.iter_mut().zip(&self.ece) {
            l.ece = *e;
        }
        if !self.send {
            // Every completion the sender may trigger needs a posted receive: post them before
            // the sender learns our QPNs.
            for (i, q) in rts.iter().enumerate() {
                let p = self.ports[fuse::member_of(i, ln)];
                recv::post_recvs(q, conn::Depths::get().recvs_posted()).map_err(|rc| {
                    Error::system(format!(
                        "{}:{}: ibv_post_recv failed: {}",
                        p.dev.name,
                        p.port,
                        std::io::Error::from_raw_os_error(rc)
                    ))
                })?;
            }
        }
        self.connected = Some(rts);
        Ok(())
    }

    /// The queue pairs on a member down here or at the peer (`fuse::born_down`, from both
    /// sides' metadata), to be left in INIT and failed over from the start, logged once. None
    /// where none would be left (all are connected, and a failed RTR names the ports); an error
    /// where failover is off.
    fn born_down(&mut self, m: &Meta) -> Result<u32> {
        let (ln, rn) = (self.ports.len(), m.members());
        let (s, r) = if self.send { ((ln, self.down), (rn, m.down)) } else { ((rn, m.down), (ln, self.down)) };
        let born = fuse::born_down(self.nqps, s.0, s.1, r.0, r.1);
        if born == 0 {
            return Ok(0);
        }
        let names = |mine: bool| -> Vec<String> {
            let (n, down) = if mine { (ln, self.down) } else { (rn, m.down) };
            (0..n)
                .filter(|&i| down & (1 << i) != 0)
                .map(|i| if mine { format!("{}:{}", self.ports[i].dev.name, self.ports[i].port) } else { format!("the peer's member {i} of {}", m.dev_name) })
                .collect()
        };
        let mut left_out = names(true);
        left_out.extend(names(false));
        let left_out = left_out.join(", ");
        let all = ((1u64 << self.nqps) - 1) as u32;
        if born == all {
            // Nothing to start on: connected as any other (a port coming up meanwhile works);
            // an RTR that fails says why.
            self.all_down = Some(left_out);
            return Ok(0);
        }
        if !config::get().ib_failover {
            return Err(Error::system(format!(
                "RDMA setup with {} on {}: {left_out} is down, and with NCCL_IB_RESILIENCY_PORT_FAILOVER=0 a connection does not start without it: bring the port up, or leave failover on",
                self.peer, self.name
            )));
        }
        let live: Vec<String> = (0..ln).filter(|&i| self.down & (1 << i) == 0).map(|i| format!("{}:{}", self.ports[i].dev.name, self.ports[i].port)).collect();
        log::info!(
            target: crate::log::INIT,
            "NET/rivet: {} (peer {}, {}): {left_out} down at setup: queue pair(s) {born:#x} start failed over onto {} ({})",
            self.name,
            self.peer,
            if self.send { "sending" } else { "receiving" },
            live.join(", "),
            if config::get().ib_recovery {
                "NCCL_IB_RESILIENCY_PORT_RECOVERY takes them back once the port is up"
            } else {
                "they stay out of this connection; NCCL_IB_RESILIENCY_PORT_RECOVERY=1 takes them back once the port is up, and new connections use it again"
            }
        );
        self.born_down = born;
        self.born_why = format!("{left_out} down at setup");
        Ok(born)
    }

    /// The loopback queue pair of flush reads on `port`, connected to itself, its completions on
    /// `cq`. Made by a receive comm at its first flush: NCCL flushes GPUDirect receives only, so
    /// a comm that never receives into GPU memory never pays a queue pair for it.
    pub(crate) fn flush_qp(port: &'static IbPort, cq: &Cq) -> Result<QpRts> {
        let cfg = config::get();
        let f = QpInit::new(port, cq, caps(conn::FLUSH_QP_SQ, 1, 0), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, cfg.ib_pkey)?;
        let me = RemoteQp { qpn: f.qp().qpn(), lid: port.lid, gid: port.gid, mtu: port.mtu, global: port.is_roce() || port.lid == 0 };
        let own = PathParams { mtu: port.mtu, tc: 0, sl: 0, timeout: cfg.ib_timeout, retry_cnt: cfg.ib_retry_cnt, rnr_retry: 7 };
        f.rtr(port, &me, &own)?.rts(port, &own)
    }

    fn fail_if_late(&mut self) -> Result<()> {
        self.idle_polls = self.idle_polls.wrapping_add(1);
        if self.idle_polls % LATE_EVERY == 0 && Instant::now() > self.deadline {
            return Err(Error::system(format!(
                "RDMA connection setup with {} did not complete within RIVET_TIMEOUT={}s (is the peer alive and calling {}?)",
                self.peer,
                self.timeout.as_secs(),
                if self.send { "accept" } else { "connect" }
            )));
        }
        Ok(())
    }

    /// Non-blocking: Some(comm) once the connection is ready for data.
    pub fn poll(&mut self) -> Result<Option<DataPath>> {
        loop {
            match self.step {
                Step::RecvMeta => {
                    let Some(m) = self.read_meta()? else { return self.fail_if_late().map(|_| None) };
                    if m.nqps as usize > MAX_QPS {
                        return Err(Error::remote("too many queue pairs"));
                    }
                    self.nqps = m.nqps as usize;
                    self.rem_members = m.members();
                    if m.parts == 0 {
                        return Err(Error::remote(format!("RDMA setup with {}: the sender announced no rendezvous part count", self.peer)));
                    }
                    self.parts = m.parts as usize;
                    if config::get().ib_warn_rail_local {
                        let local: Vec<u8> = self.ports.iter().map(|p| p.index).collect();
                        let remote: Vec<u8> = (0..m.members()).map(|i| m.member(i).dev_index).collect();
                        if fuse::rails_differ(&local, &remote) {
                            log::info!(
                                "NET/rivet: there are mismatched physical devices between local ({}) and remote ({}) (the connection from {} on {}); to disable this message, set NCCL_IB_WARN_RAIL_LOCAL=0",
                                fuse::join(&local),
                                fuse::join(&remote),
                                self.peer,
                                self.name
                            );
                        }
                    }
                    self.steps.mark("peer's metadata");
                    self.create_local()?;
                    self.steps.mark("queue pairs made");
                    self.connect_qps(&m)?;
                    self.steps.mark("queue pairs connected");
                    self.peer_meta = Some(m);
                    self.step = Step::Exchange;
                }
                Step::Exchange => {
                    let written = self.write_out();
                    if let Some(a) = self.ack.as_mut() {
                        // A rejection of our handle closes the stream: its reason is in the ack,
                        // ahead of the failed write's.
                        if !a.read(self.fd.as_ref().unwrap(), self.peer)? {
                            written?;
                            return self.fail_if_late().map(|_| None);
                        }
                        self.ack = None;
                        self.steps.mark("ack");
                    }
                    if !written? {
                        return self.fail_if_late().map(|_| None);
                    }
                    if self.send {
                        let Some(m) = self.read_meta()? else { return self.fail_if_late().map(|_| None) };
                        self.steps.mark("metadata exchanged");
                        self.connect_qps(&m)?;
                        self.steps.mark("queue pairs connected");
                        self.peer_meta = Some(m);
                        self.step = Step::SendReady;
                    } else {
                        self.steps.mark("metadata sent");
                        self.step = Step::WaitReady;
                    }
                }
                Step::SendReady => match sock::send_small(self.fd.as_ref().unwrap(), &[READY]) {
                    Ok(Io::Done(_)) => return Ok(Some(self.finish())),
                    Ok(_) => return self.fail_if_late().map(|_| None),
                    Err(e) => return Err(Error::remote(format!("RDMA setup with {} failed: {e}", self.peer))),
                },
                Step::WaitReady => {
                    let mut b = [0u8; 1];
                    // SAFETY: one writable byte: the local `b`.
                    match unsafe { sock::recv_into(self.fd(), b.as_mut_ptr(), 1) } {
                        Ok(Io::Done(_)) if b[0] == READY => return Ok(Some(self.finish())),
                        Ok(Io::Done(_)) => return Err(Error::remote(format!("RDMA setup with {}: bad ready byte", self.peer))),
                        Ok(Io::WouldBlock) => return self.fail_if_late().map(|_| None),
                        Ok(Io::Closed) => {
                            return Err(Error::remote(format!(
                                "the peer {} closed the connection during RDMA setup (see its log for the reason)",
                                self.peer
                            )))
                        }
                        Err(e) => return Err(Error::remote(format!("RDMA setup with {} failed: {e}", self.peer))),
                    }
                }
            }
        }
    }

    fn finish(&mut self) -> DataPath {
        self.steps.mark("ready");
        let p = self.ports[0];
        let m = self.peer_meta.take().unwrap();
        let qps = self.connected.take().unwrap();
        let fd = self.fd.take().unwrap();
        let cfg = config::get();
        let mtu = mtu_bytes((p.mtu as u8).min(m.mtu) as u32);
        let (ln, rn) = (self.ports.len(), m.members());
        let ar = if conn::adaptive_routing(self.ports) {
            format!(", adaptive routing (completions apart from data above {} B)", cfg.ib_ar_threshold)
        } else {
            String::new()
        };
        log::info!(
            target: crate::log::INIT,
            "NET/rivet: {} {} over {}{} -> {} {}:{}{} with {} QP(s){}, MTU {mtu}, TC {}, SL {}{}{ar}{}",
            if self.send { "connected to" } else { "accepted from" },
            self.peer,
            p.describe(),
            if ln > 1 { format!(" (+{} member(s) of {})", ln - 1, self.name) } else { String::new() },
            m.dev_name,
            select::describe_gid(&m.gid),
            m.port,
            if rn > 1 { format!(" (+{} member(s))", rn - 1) } else { String::new() },
            qps.len(),
            if ln > 1 || rn > 1 { " striped over the members" } else { "" },
            if self.send { self.tc } else { receiver_tc(cfg.ib_fifo_tc, p.is_roce(), m.tc) },
            if self.send { self.sl } else { m.sl },
            ece::describe(&self.ece),
            self.steps.describe()
        );
        let qpns: Vec<u32> = qps.iter().map(|q| q.qp().qpn()).collect();
        let mut c = Common::<nic::Verbs>::new(self.ports, self.peer, fd, &qpns, std::mem::take(&mut self.links), conn::Settings::from_config());
        if self.born_down != 0 {
            c.start_failed(self.born_down, &self.born_why);
        }
        let fifo_keys = std::array::from_fn(|i| if i < rn { m.member(i).fifo_rkey } else { 0 });
        match self.local.take().unwrap() {
            Local::Send { cqs, mem, parts, .. } => {
                let rkeys = std::array::from_fn(|i| if i < rn { m.member(i).ring_rkey } else { 0 });
                let ring = Ring { addr: m.ring_addr, rkeys, slots: m.ring_slots as usize, eager_max: m.eager_max as usize };
                DataPath::VerbsSend(Box::new(VerbsSend::new(c, qps, cqs, mem, parts, (m.fifo_addr, fifo_keys), ring, rn, self.parts)))
            }
            Local::Recv { cqs, mem, parts, .. } => {
                DataPath::VerbsRecv(Box::new(VerbsRecv::new(c, qps, cqs, mem, parts, cfg.ib_eager_max, (m.fifo_addr, fifo_keys), rn, self.parts)))
            }
        }
    }
}

#[cfg(test)]
mod qos_tests {
    use super::*;

    #[test]
    fn traffic_classes_and_service_levels_fall_back_as_net_ib_does() {
        assert_eq!(sender_qos(None, None, None), (0, 0));
        assert_eq!(sender_qos(None, None, Some(106)), (106, 106 & 0xf), "the communicator's class for both");
        assert_eq!(sender_qos(Some(32), Some(3), Some(106)), (32, 3), "the variables win");
        assert_eq!(sender_qos(Some(32), None, None), (32, 0));
        assert_eq!(receiver_tc(Some(8), true, 106), 8, "NCCL_IB_FIFO_TC on RoCE");
        assert_eq!(receiver_tc(Some(8), false, 106), 106, "not on InfiniBand");
        assert_eq!(receiver_tc(None, true, 106), 106);
    }
}
