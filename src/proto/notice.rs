//! The notices of a verbs connection's out-of-band socket after setup, as pure code: a collective
//! mismatch, and failover's and recovery's (the queue pairs a side found failed, the receiver's
//! account of what arrived, a queue pair asked back and the answer); and the map of logical queue
//! pairs onto live ones both sides compute from the same dead set.

use super::layout::{self, get, get_u32, get_u64, get_u8, put, put_u32, put_u64, put_u8};
use super::verbs::*;

pub const NOTICE_SIZE: usize = layout::notice::SIZE;
const NOTICE_MAGIC: u32 = 0x5256_4e4f; // "RVNO"

/// Sent by the sender over the out-of-band socket when it fails a send because of a collective
/// mismatch, so that the receiver reports the same cause instead of a vanished peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    pub send_size: u64,
    pub recv_size: u64,
    pub tag: i32,
}

impl Mismatch {
    pub fn encode(&self) -> [u8; NOTICE_SIZE] {
        use layout::notice::*;
        let mut b = [0u8; NOTICE_SIZE];
        put_u32(&mut b, MAGIC, NOTICE_MAGIC);
        put_u32(&mut b, KIND, KIND_MISMATCH);
        put_u64(&mut b, SEND_SIZE, self.send_size);
        put_u64(&mut b, RECV_SIZE, self.recv_size);
        put_u32(&mut b, TAG, self.tag as u32);
        b
    }

    pub fn decode(b: &[u8; NOTICE_SIZE]) -> Option<Mismatch> {
        use layout::notice::*;
        (get_u32(b, MAGIC) == NOTICE_MAGIC && get_u32(b, KIND) == KIND_MISMATCH).then(|| Mismatch {
            send_size: get_u64(b, SEND_SIZE),
            recv_size: get_u64(b, RECV_SIZE),
            tag: get_u32(b, TAG) as i32,
        })
    }
}

/// Most receive records a resync carries: every receive the receiver may have outstanding.
pub const MAX_RESYNC_RECVS: usize = crate::proto::NCCL_INFLIGHT;
/// Longest failover notice, in bytes.
pub const MAX_NOTICE: usize = NOTICE_SIZE + MAX_RESYNC_RECVS * layout::failover::rec::SIZE;
const KIND_MISMATCH: u32 = 1;
const KIND_FAIL: u32 = 2;
const KIND_RESYNC: u32 = 3;
const KIND_RECOVER: u32 = 4;
const KIND_RECOVERED: u32 = 5;
const KIND_NOT_RECOVERED: u32 = 6;

/// What a receive has got of the rendezvous parts of each of its buffers, in a [`Resync`]: bit
/// `q` of `parts[e]` is part `q` of buffer `e` (every bit, once the buffer is complete).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResyncRecv {
    /// The receive's clear-to-send index (its stamp - 1).
    pub cts: u64,
    pub n: u8,
    pub parts: [u16; MAX_GROUP],
}

/// The receiver's account after queue pairs died, sent to the sender over the out-of-band
/// socket once its own dead queue pairs are drained: nothing more can arrive through them, so
/// what is not here was lost on them and must be sent again.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resync {
    /// The dead queue pairs (bit q: queue pair q, the same index on both sides).
    pub dead: u32,
    /// Eager ring slots that arrived (in ring order), since the connection began.
    pub ring_arrived: u64,
    /// The clear-to-send index of the next receive: a send into a receive at or after it was
    /// posted after this account (its parts on dead queue pairs were lost).
    pub cts_end: u64,
    /// Every incomplete receive with a clear-to-send out, before `cts_end`; one not listed has
    /// all its data.
    pub recvs: Vec<ResyncRecv>,
}

/// The map after the dead set changed, from the map `cur`: a logical queue pair whose queue pair
/// lives stays on it (moving one whose traffic is under way could let a later write overtake an
/// earlier one), and one whose queue pair died goes to the next live one ([`remap`]). `back`
/// (a failed queue pair was taken back): logical queue pairs 1.. go home to their own queue pair
/// if it lives; logical 0 stays where it is, because its eager messages and credit words must
/// arrive in order on one queue pair.
pub fn remap_keeping(dead: u32, nqps: usize, cur: &[u8; MAX_QPS], back: bool) -> Option<[u8; MAX_QPS]> {
    let fresh = remap(dead, nqps)?;
    let live = |p: usize| dead & (1 << p) == 0;
    let mut map = fresh;
    for q in 0..nqps.clamp(1, MAX_QPS) {
        let c = cur[q] as usize;
        map[q] = if back && q != 0 && live(q) {
            q as u8
        } else if c < MAX_QPS && live(c) {
            c as u8
        } else {
            fresh[q]
        };
    }
    Some(map)
}

/// Which queue pair carries each logical one's traffic once the queue pairs in `dead` failed:
/// itself while it lives, else the next live one after it (as net_ib replaces a failed queue
/// pair). Both sides compute it from the same set. None if every one is dead.
pub fn remap(dead: u32, nqps: usize) -> Option<[u8; MAX_QPS]> {
    let nqps = nqps.clamp(1, MAX_QPS);
    let live = |q: usize| dead & (1 << q) == 0;
    let mut map = [0u8; MAX_QPS];
    for (q, m) in map.iter_mut().enumerate().take(nqps) {
        *m = (0..nqps).map(|k| (q + k) % nqps).find(|&p| live(p))? as u8;
    }
    Some(map)
}

/// A message on a verbs connection's out-of-band socket after setup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    Mismatch(Mismatch),
    /// The sender found these queue pairs dead (bit q: queue pair q).
    Fail { dead: u32 },
    Resync(Resync),
    /// Failover recovery: the receiver has reset its side of these failed queue pairs and can
    /// receive on them again; the sender answers with `Recovered` (it reset its side and sends
    /// on them again) and `NotRecovered` (its port is not up yet) for each.
    Recover { qps: u32 },
    Recovered { qps: u32 },
    NotRecovered { qps: u32 },
}

impl Notice {
    pub fn encode(&self) -> Vec<u8> {
        use layout::failover::*;
        use layout::notice::{KIND, MAGIC};
        match self {
            Notice::Mismatch(m) => m.encode().to_vec(),
            Notice::Fail { dead: m } | Notice::Recover { qps: m } | Notice::Recovered { qps: m } | Notice::NotRecovered { qps: m } => {
                let kind = match self {
                    Notice::Fail { .. } => KIND_FAIL,
                    Notice::Recover { .. } => KIND_RECOVER,
                    Notice::Recovered { .. } => KIND_RECOVERED,
                    _ => KIND_NOT_RECOVERED,
                };
                let mut b = vec![0u8; NOTICE_SIZE];
                put_u32(&mut b, MAGIC, NOTICE_MAGIC);
                put_u32(&mut b, KIND, kind);
                put_u32(&mut b, DEAD, *m);
                b
            }
            Notice::Resync(r) => {
                let n = r.recvs.len().min(MAX_RESYNC_RECVS);
                let mut b = vec![0u8; NOTICE_SIZE + n * rec::SIZE];
                put_u32(&mut b, MAGIC, NOTICE_MAGIC);
                put_u32(&mut b, KIND, KIND_RESYNC);
                put_u32(&mut b, DEAD, r.dead);
                put_u32(&mut b, COUNT, n as u32);
                put_u64(&mut b, RING, r.ring_arrived);
                put_u64(&mut b, CTS_END, r.cts_end);
                for (i, x) in r.recvs[..n].iter().enumerate() {
                    let o = &mut b[NOTICE_SIZE + i * rec::SIZE..][..rec::SIZE];
                    put_u64(o, rec::CTS, x.cts);
                    put_u8(o, rec::N, x.n);
                    let mut parts = [0u8; 16];
                    for (k, p) in x.parts.iter().enumerate() {
                        parts[2 * k..2 * k + 2].copy_from_slice(&p.to_le_bytes());
                    }
                    put(o, rec::PARTS, &parts);
                }
                b
            }
        }
    }

    /// The notice with its queue pair masks limited to `qps` (a peer's bits beyond a comm's
    /// queue pairs mean nothing to it).
    pub fn masked(self, qps: u32) -> Notice {
        match self {
            Notice::Mismatch(m) => Notice::Mismatch(m),
            Notice::Fail { dead } => Notice::Fail { dead: dead & qps },
            Notice::Resync(r) => Notice::Resync(Resync { dead: r.dead & qps, ..r }),
            Notice::Recover { qps: m } => Notice::Recover { qps: m & qps },
            Notice::Recovered { qps: m } => Notice::Recovered { qps: m & qps },
            Notice::NotRecovered { qps: m } => Notice::NotRecovered { qps: m & qps },
        }
    }

    /// The first notice in `b`, and its length; None while it has not all arrived; Err for
    /// bytes that are no notice of ours (the connection's peer is not a rivet of this build).
    pub fn decode(b: &[u8]) -> Result<Option<(Notice, usize)>, String> {
        use layout::failover::*;
        use layout::notice::{KIND, MAGIC};
        if b.len() < NOTICE_SIZE {
            return Ok(None);
        }
        if get_u32(b, MAGIC) != NOTICE_MAGIC {
            return Err(format!("not a rivet notice (magic {:#010x})", get_u32(b, MAGIC)));
        }
        match get_u32(b, KIND) {
            KIND_MISMATCH => {
                let m = Mismatch::decode(b[..NOTICE_SIZE].try_into().unwrap()).ok_or("a malformed mismatch notice")?;
                Ok(Some((Notice::Mismatch(m), NOTICE_SIZE)))
            }
            KIND_FAIL => Ok(Some((Notice::Fail { dead: get_u32(b, DEAD) }, NOTICE_SIZE))),
            KIND_RECOVER => Ok(Some((Notice::Recover { qps: get_u32(b, DEAD) }, NOTICE_SIZE))),
            KIND_RECOVERED => Ok(Some((Notice::Recovered { qps: get_u32(b, DEAD) }, NOTICE_SIZE))),
            KIND_NOT_RECOVERED => Ok(Some((Notice::NotRecovered { qps: get_u32(b, DEAD) }, NOTICE_SIZE))),
            KIND_RESYNC => {
                let n = get_u32(b, COUNT) as usize;
                if n > MAX_RESYNC_RECVS {
                    return Err(format!("a resync of {n} receives (at most {MAX_RESYNC_RECVS})"));
                }
                let len = NOTICE_SIZE + n * rec::SIZE;
                if b.len() < len {
                    return Ok(None);
                }
                let recvs = (0..n)
                    .map(|i| {
                        let o = &b[NOTICE_SIZE + i * rec::SIZE..][..rec::SIZE];
                        let p = get(o, rec::PARTS);
                        ResyncRecv { cts: get_u64(o, rec::CTS), n: get_u8(o, rec::N), parts: std::array::from_fn(|k| u16::from_le_bytes([p[2 * k], p[2 * k + 1]])) }
                    })
                    .collect::<Vec<_>>();
                if let Some(r) = recvs.iter().find(|r| r.n == 0 || r.n as usize > MAX_GROUP) {
                    return Err(format!("a resync names a receive of {} buffers", r.n));
                }
                let r = Resync { dead: get_u32(b, DEAD), ring_arrived: get_u64(b, RING), cts_end: get_u64(b, CTS_END), recvs };
                Ok(Some((Notice::Resync(r), len)))
            }
            k => Err(format!("a notice of unknown kind {k}")),
        }
    }
}
