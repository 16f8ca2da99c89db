//! Wire formats of the verbs transport, as pure code: the connection metadata exchanged once over
//! the out-of-band TCP socket, the clear-to-send (CTS) entry the receiver RDMA-writes into the
//! sender's FIFO, the header of an eager message, the immediate-data encoding, and the
//! 128-byte-aligned split of a message across queue pairs.

use super::layout::{self, get, get_u16, get_u32, get_u64, get_u8, put, put_u16, put_u32, put_u64, put_u8};
use super::PROTO_VERSION;
pub use super::notice::{remap, remap_keeping, Mismatch, Notice, Resync, ResyncRecv, MAX_NOTICE, MAX_RESYNC_RECVS, NOTICE_SIZE};

pub const META_SIZE: usize = layout::meta::SIZE;
const META_MAGIC: u32 = 0x5256_564d; // "RVVM"
/// Most queue pairs one connection may use.
pub const MAX_QPS: usize = 16;
/// Most members of a fused device (NIC fusion): a handle and a CTS entry carry a key or GID per
/// member.
pub const MAX_MEMBERS: usize = 8;
/// Most buffers in one grouped receive (NCCL's `maxRecvs`); a clear-to-send entry counts them
/// in 4 bits.
pub const MAX_GROUP: usize = 8;
const NAME_LEN: usize = layout::meta::DEV_NAME.len;

/// What each side of a verbs connection tells the other. `fifo_addr`/`fifo_rkey` name the memory
/// the peer writes into: the sender's CTS FIFO (followed by its credit word), or the receiver's
/// sizes FIFO. The `ring_*` fields describe the receiver's eager ring (zero from the sender).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub nqps: u8,
    pub link_layer: u8,
    pub port: u8,
    /// `ibv_mtu` enum (1 = 256 … 5 = 4096).
    pub mtu: u8,
    pub lid: u16,
    pub tc: u8,
    pub sl: u8,
    pub gid: [u8; 16],
    pub fifo_addr: u64,
    pub fifo_rkey: u32,
    pub dev_name: String,
    pub qpns: Vec<u32>,
    pub ring_addr: u64,
    pub ring_rkey: u32,
    pub ring_slots: u16,
    /// Largest message sent eagerly (the ring slot holds it after an [`EagerHdr`]).
    pub eager_max: u32,
    /// Member 0's device index on its host (the plugin's device number of its port).
    pub dev_index: u8,
    /// Members 1.. of a fused device (the fields above describe member 0).
    pub extra: Vec<MemberMeta>,
    /// Per queue pair (as many as `qpns`, or none): its ECE, None where unsupported.
    pub ece: Vec<Option<Ece>>,
    /// The sender's: the parts each rendezvous message is split into (1..=nqps), which the
    /// receiver counts; 0 from the receiver.
    pub parts: u8,
    /// The members of this side's device (bit m: member m) whose port was down at setup.
    pub down: u8,
}

/// `struct ibv_ece`: a queue pair's enhanced connection establishment options (vendor id,
/// option bits, comp_mask), as `ibv_query_ece` gives them and `ibv_set_ece` takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ece {
    pub vendor_id: u32,
    pub options: u32,
    pub comp_mask: u32,
}

/// What a connection needs of each further member of a fused device: its address, and the keys of
/// the peer-written memory (`fifo_rkey`, `ring_rkey` as in [`Meta`]) registered there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemberMeta {
    pub gid: [u8; 16],
    pub lid: u16,
    pub port: u8,
    /// `ibv_mtu` enum.
    pub mtu: u8,
    pub fifo_rkey: u32,
    pub ring_rkey: u32,
    /// The member's device index on its host.
    pub dev_index: u8,
}

impl Meta {
    /// Members of the side that sent this (at least 1).
    pub fn members(&self) -> usize {
        1 + self.extra.len()
    }
    /// Member `m`'s address and keys.
    pub fn member(&self, m: usize) -> MemberMeta {
        if m == 0 {
            MemberMeta {
                gid: self.gid,
                lid: self.lid,
                port: self.port,
                mtu: self.mtu,
                fifo_rkey: self.fifo_rkey,
                ring_rkey: self.ring_rkey,
                dev_index: self.dev_index,
            }
        } else {
            self.extra[m - 1]
        }
    }
}

/// Most eager ring slots and largest eager message a peer may announce.
pub const MAX_RING_SLOTS: u16 = 1024;
pub const MAX_EAGER: u32 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaError {
    NotRivet(u32),
    Version(u16),
    Length(u16),
    Field(&'static str, u64),
}

impl std::fmt::Display for MetaError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            MetaError::NotRivet(m) => write!(f, "the peer's connection metadata is not rivet's (magic {m:#010x})"),
            MetaError::Version(v) => {
                write!(f, "the peer speaks rivet verbs protocol {v}, this side {PROTO_VERSION}: run one rivet build on every rank")
            }
            MetaError::Length(l) => write!(f, "the peer's connection metadata has length {l}, expected {META_SIZE}"),
            MetaError::Field(name, v) => write!(f, "the peer's connection metadata has an invalid {name} ({v})"),
        }
    }
}

impl Meta {
    pub fn encode(&self) -> [u8; META_SIZE] {
        use layout::meta::*;
        let mut b = [0u8; META_SIZE];
        put_u32(&mut b, MAGIC, META_MAGIC);
        put_u16(&mut b, VERSION, PROTO_VERSION as u16);
        put_u16(&mut b, LENGTH, META_SIZE as u16);
        put_u8(&mut b, NQPS, self.nqps);
        put_u8(&mut b, LINK_LAYER, self.link_layer);
        put_u8(&mut b, PORT, self.port);
        put_u8(&mut b, MTU, self.mtu);
        put_u16(&mut b, LID, self.lid);
        put_u8(&mut b, TC, self.tc);
        put_u8(&mut b, SL, self.sl);
        put(&mut b, GID, &self.gid);
        put_u64(&mut b, FIFO_ADDR, self.fifo_addr);
        put_u32(&mut b, FIFO_RKEY, self.fifo_rkey);
        put_u32(&mut b, RING_RKEY, self.ring_rkey);
        let mut name = [0u8; NAME_LEN];
        let n = self.dev_name.len().min(NAME_LEN - 1);
        name[..n].copy_from_slice(&self.dev_name.as_bytes()[..n]);
        put(&mut b, DEV_NAME, &name);
        for (i, q) in self.qpns.iter().take(MAX_QPS).enumerate() {
            put_u32(&mut b, qpn(i), *q);
        }
        put_u64(&mut b, RING_ADDR, self.ring_addr);
        put_u32(&mut b, EAGER_MAX, self.eager_max);
        put_u16(&mut b, RING_SLOTS, self.ring_slots);
        let extra = &self.extra[..self.extra.len().min(MAX_MEMBERS - 1)];
        put_u8(&mut b, MEMBERS, 1 + extra.len() as u8);
        put_u8(&mut b, DEV_INDEX, self.dev_index);
        for (i, x) in extra.iter().enumerate() {
            let at = |fl| member::at(i + 1, fl);
            put(&mut b, at(member::GID), &x.gid);
            put_u16(&mut b, at(member::LID), x.lid);
            put_u8(&mut b, at(member::PORT), x.port);
            put_u8(&mut b, at(member::MTU), x.mtu);
            put_u32(&mut b, at(member::FIFO_RKEY), x.fifo_rkey);
            put_u32(&mut b, at(member::RING_RKEY), x.ring_rkey);
            put_u8(&mut b, at(member::DEV_INDEX), x.dev_index);
        }
        put_u8(&mut b, PARTS, self.parts);
        put_u8(&mut b, DOWN, self.down);
        for (q, e) in self.ece.iter().take(MAX_QPS).enumerate() {
            if let Some(e) = e {
                put_u32(&mut b, ece::at(q, ece::VENDOR_ID), e.vendor_id);
                put_u32(&mut b, ece::at(q, ece::OPTIONS), e.options);
                put_u32(&mut b, ece::at(q, ece::COMP_MASK), e.comp_mask);
                put_u8(&mut b, ece::at(q, ece::SUPPORTED), 1);
            }
        }
        b
    }

    pub fn decode(b: &[u8; META_SIZE]) -> Result<Meta, MetaError> {
        use layout::meta::*;
        let m = get_u32(b, MAGIC);
        if m != META_MAGIC {
            return Err(MetaError::NotRivet(m));
        }
        let v = get_u16(b, VERSION);
        if v != PROTO_VERSION as u16 {
            return Err(MetaError::Version(v));
        }
        let len = get_u16(b, LENGTH);
        if len as usize != META_SIZE {
            return Err(MetaError::Length(len));
        }
        let nqps = get_u8(b, NQPS);
        if nqps == 0 || nqps as usize > MAX_QPS {
            return Err(MetaError::Field("queue pair count", nqps as u64));
        }
        let link_layer = get_u8(b, LINK_LAYER);
        if !(1..=2).contains(&link_layer) {
            return Err(MetaError::Field("link layer", link_layer as u64));
        }
        let mtu = get_u8(b, MTU);
        if !(1..=5).contains(&mtu) {
            return Err(MetaError::Field("MTU", mtu as u64));
        }
        let name_raw = get(b, DEV_NAME);
        let end = name_raw.iter().position(|&c| c == 0).unwrap_or(NAME_LEN);
        let qpns: Vec<u32> = (0..nqps as usize).map(|i| get_u32(b, qpn(i))).collect();
        if let Some(&q) = qpns.iter().find(|&&q| q == 0 || q > 0xff_ffff) {
            return Err(MetaError::Field("queue pair number", q as u64));
        }
        let ring_slots = get_u16(b, RING_SLOTS);
        if ring_slots > MAX_RING_SLOTS {
            return Err(MetaError::Field("eager ring size", ring_slots as u64));
        }
        let eager_max = get_u32(b, EAGER_MAX);
        if eager_max > MAX_EAGER {
            return Err(MetaError::Field("eager limit", eager_max as u64));
        }
        let parts = get_u8(b, PARTS);
        if parts > nqps {
            return Err(MetaError::Field("rendezvous part count", parts as u64));
        }
        let members = get_u8(b, MEMBERS);
        if members == 0 || members as usize > MAX_MEMBERS {
            return Err(MetaError::Field("member count", members as u64));
        }
        let mut extra = Vec::with_capacity(members as usize - 1);
        for m in 1..members as usize {
            let at = |fl| member::at(m, fl);
            let mtu = get_u8(b, at(member::MTU));
            if !(1..=5).contains(&mtu) {
                return Err(MetaError::Field("member MTU", mtu as u64));
            }
            extra.push(MemberMeta {
                gid: get(b, at(member::GID)).try_into().unwrap(),
                lid: get_u16(b, at(member::LID)),
                port: get_u8(b, at(member::PORT)),
                mtu,
                fifo_rkey: get_u32(b, at(member::FIFO_RKEY)),
                ring_rkey: get_u32(b, at(member::RING_RKEY)),
                dev_index: get_u8(b, at(member::DEV_INDEX)),
            });
        }
        Ok(Meta {
            nqps,
            link_layer,
            port: get_u8(b, PORT),
            mtu,
            lid: get_u16(b, LID),
            tc: get_u8(b, TC),
            sl: get_u8(b, SL),
            gid: get(b, GID).try_into().unwrap(),
            fifo_addr: get_u64(b, FIFO_ADDR),
            fifo_rkey: get_u32(b, FIFO_RKEY),
            dev_name: String::from_utf8_lossy(&name_raw[..end]).into_owned(),
            qpns,
            ring_addr: get_u64(b, RING_ADDR),
            ring_rkey: get_u32(b, RING_RKEY),
            ring_slots,
            eager_max,
            dev_index: get_u8(b, DEV_INDEX),
            parts,
            // Only bits of members it has.
            down: get_u8(b, DOWN) & ((1u16 << members) - 1) as u8,
            extra,
            ece: (0..nqps as usize)
                .map(|q| {
                    (get_u8(b, ece::at(q, ece::SUPPORTED)) == 1).then(|| Ece {
                        vendor_id: get_u32(b, ece::at(q, ece::VENDOR_ID)),
                        options: get_u32(b, ece::at(q, ece::OPTIONS)),
                        comp_mask: get_u32(b, ece::at(q, ece::COMP_MASK)),
                    })
                })
                .collect(),
        })
    }
}

/// One clear-to-send entry: a receive buffer the sender may RDMA-write. 32 bytes and 32-byte
/// aligned, so one entry is one PCIe write; `stamp` (the CTS index + 1) comes last and says the
/// entry is complete. Only receives with a buffer larger than the eager limit post CTS entries.
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cts {
    pub addr: u64,
    /// Buffer size in the low 60 bits; the number of buffers in the grouped receive (1..=8) in
    /// the top 4 (the same in each entry of the group).
    pub size_n: u64,
    pub rkey: u32,
    pub tag: i32,
    /// Send sequence number (wrapping) of the grouped receive's first send.
    pub base: u32,
    pub stamp: u32,
}

impl Cts {
    pub fn new(addr: u64, size: u64, rkey: u32, tag: i32, n: usize, base: u32, stamp: u32) -> Cts {
        Cts { addr, size_n: (size & SIZE_MASK) | ((n as u64) << 60), rkey, tag, base, stamp }
    }
    pub fn size(&self) -> u64 {
        self.size_n & SIZE_MASK
    }
    pub fn n(&self) -> usize {
        (self.size_n >> 60) as usize
    }
}

const SIZE_MASK: u64 = (1 << 60) - 1;

/// The header an eager message carries at the start of its ring slot (followed by the payload).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EagerHdr {
    /// Send sequence number (wrapping): which receive, and which of its buffers by tag.
    pub seq: u32,
    pub flags: u32,
    pub size: u64,
    pub tag: i32,
    pub _pad: [u32; 3],
}

pub const EAGER_HDR: usize = 32;
/// The payload follows the header.
pub const EAGER_DATA: u32 = 1;
/// No payload: a large send announces itself because its CTS has not come (lets the receiver
/// report a send larger than its receive instead of both sides waiting).
pub const EAGER_RTS: u32 = 2;
/// The sender is running low on ring slots: return credits now.
pub const EAGER_URGENT: u32 = 4;

/// Immediate data of a write that completes a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Imm {
    /// An eager message landed in this ring slot.
    Eager(u32),
    /// Part `part` (the logical queue pair that carries it) of a rendezvous write into buffer
    /// `entry` of CTS slot `slot`; `size`: the send's size, carried here instead of in the sizes
    /// FIFO (a connection of one queue pair, a send below IMM_SIZE_LIMIT: its one write is all
    /// of it, part 0). The part is named so that a receiver counts each once whatever queue pair
    /// brought it (after a fused device's member failed, its parts are resent on others).
    Rdv { slot: u32, entry: u32, part: u32, size: Option<u32> },
}

const IMM_EAGER_BIT: u32 = 1 << 31;
const IMM_SIZED_BIT: u32 = 1 << 30;
/// Sends below this size can carry their size in the immediate (20 bits, above the 7 of the
/// slot and the 3 of the entry).
pub const IMM_SIZE_LIMIT: usize = 1 << 20;
const _: () = assert!(FIFO_DEPTH <= 1 << 7 && MAX_GROUP <= 1 << 3 && MAX_QPS <= 1 << 4);

impl Imm {
    pub fn encode(self) -> u32 {
        match self {
            Imm::Eager(s) => IMM_EAGER_BIT | (s & 0xffff),
            Imm::Rdv { slot, entry, part, size } => {
                debug_assert!(size.map_or(true, |s| (s as usize) < IMM_SIZE_LIMIT), "size {size:?} does not fit the immediate");
                debug_assert!(size.is_none() || part == 0, "a sized immediate is part 0");
                let hi = size.map_or((part & 0xf) << 10, |s| IMM_SIZED_BIT | (s & (IMM_SIZE_LIMIT as u32 - 1)) << 10);
                hi | ((slot & 0x7f) << 3) | (entry & 7)
            }
        }
    }
    pub fn decode(v: u32) -> Imm {
        if v & IMM_EAGER_BIT != 0 {
            Imm::Eager(v & 0xffff)
        } else {
            let sized = v & IMM_SIZED_BIT != 0;
            let size = sized.then_some((v >> 10) & (IMM_SIZE_LIMIT as u32 - 1));
            let part = if sized { 0 } else { (v >> 10) & 0xf };
            Imm::Rdv { slot: (v >> 3) & 0x7f, entry: v & 7, part, size }
        }
    }
}

/// Where `seq` falls relative to a group of `n` sends starting at `base` (wrapping u32 sequence
/// numbers): negative before it, 0..n inside, >= n after.
pub fn seq_offset(seq: u32, base: u32) -> i64 {
    seq.wrapping_sub(base) as i32 as i64
}

/// CTS slots per connection (a ring; the receiver has at most its request count, 32, in flight,
/// so a slot is written again only after 63 later ones: twice that count, as margin). Each slot
/// costs 256 bytes of registered memory on both sides.
pub const FIFO_DEPTH: usize = 64;
const _: () = assert!(FIFO_DEPTH >= 2 * crate::proto::NCCL_INFLIGHT);
/// Bytes of the CTS FIFO; the sender's credit word (u64, written by the receiver) follows it.
pub const FIFO_BYTES: usize = FIFO_DEPTH * 8 * 32;

/// Bytes of one CTS entry in the FIFO of a connection whose receiver has `members` members: the
/// 32-byte [`Cts`], after (for a fused receiver) a [`CtsKeys`] block with the buffer's rkey on
/// each member, placed before the entry's stamp.
pub const fn cts_stride(members: usize) -> usize {
    if members > 1 {
        64
    } else {
        32
    }
}

/// Bytes of the CTS FIFO for a receiver of `members` members (the credit word follows).
pub const fn fifo_bytes(members: usize) -> usize {
    FIFO_DEPTH * MAX_GROUP * cts_stride(members)
}

/// A fused receiver's keys for one receive buffer: its rkey on each member (0..8), in the 32
/// bytes before the buffer's CTS entry.
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CtsKeys(pub [u32; MAX_MEMBERS]);
const _: () = assert!(std::mem::size_of::<CtsKeys>() == 32 && fifo_bytes(1) == FIFO_BYTES);
/// Bytes of the sizes FIFO entry (one u64 per buffer of a grouped receive).
pub const SIZES_ENTRY: usize = 8 * 8;
/// Alignment of the pieces a message is split into across QPs (LL128 needs 128-byte units).
pub const CHUNK_ALIGN: usize = 128;

/// Bytes `[off, off+len)` of a `size`-byte message that queue pair `q` of `nqps` carries.
pub fn qp_chunk(size: usize, nqps: usize, q: usize) -> (usize, usize) {
    let chunk = size.div_ceil(nqps.max(1)).next_multiple_of(CHUNK_ALIGN);
    let off = (q * chunk).min(size);
    (off, chunk.min(size - off))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Meta {
        Meta {
            nqps: 2,
            link_layer: 2,
            port: 1,
            mtu: 5,
            lid: 0,
            tc: 106,
            sl: 3,
            gid: [7; 16],
            fifo_addr: 0x7f00_1234_5000,
            fifo_rkey: 0xabcd,
            dev_name: "rxe0".into(),
            qpns: vec![17, 18],
            ring_addr: 0x7f00_0000_1000,
            ring_rkey: 0x1234,
            ring_slots: 32,
            eager_max: 8192,
            dev_index: 3,
            extra: Vec::new(),
            ece: vec![None, None],
            parts: 2,
            down: 0,
        }
    }

    #[test]
    fn meta_roundtrip() {
        let m = meta();
        assert_eq!(Meta::decode(&m.encode()).unwrap(), m);
        assert_eq!(m.members(), 1);
        // A fused device's further members, each with its own address and keys.
        let mut f = meta();
        f.extra = (1..8).map(|i| MemberMeta { gid: [i; 16], lid: i as u16, port: 1, mtu: 4, fifo_rkey: 100 + i as u32, ring_rkey: 200 + i as u32, dev_index: 10 + i }).collect();
        let d = Meta::decode(&f.encode()).unwrap();
        assert_eq!(d, f);
        assert_eq!((d.members(), d.member(0).fifo_rkey, d.member(3).ring_rkey, d.member(7).gid), (8, 0xabcd, 203, [7; 16]));
        // ECE per queue pair: set on one, unsupported on the other; all 16 blocks fit.
        let mut e = meta();
        e.ece = vec![None, Some(Ece { vendor_id: 0x15b3, options: 0x3000_0001, comp_mask: 0 })];
        assert_eq!(Meta::decode(&e.encode()).unwrap(), e);
        e.nqps = 16;
        e.qpns = (1..=16).collect();
        e.ece = (0..16).map(|i| (i % 3 != 0).then_some(Ece { vendor_id: i, options: !i, comp_mask: 0 })).collect();
        assert_eq!(Meta::decode(&e.encode()).unwrap(), e);
        // The members down at setup: kept for members the side has, dropped beyond them.
        f.down = 0b1000_0010;
        assert_eq!(Meta::decode(&f.encode()).unwrap().down, 0b1000_0010);
        let mut one = meta();
        one.down = 0b11;
        assert_eq!(Meta::decode(&one.encode()).unwrap().down, 0b01, "a one-member side has only member 0");
    }

    #[test]
    fn meta_rejects_bad_fields() {
        let mut b = meta().encode();
        b[0] = b'G';
        assert!(matches!(Meta::decode(&b), Err(MetaError::NotRivet(_))));
        let mut b = meta().encode();
        b[6] = 10;
        assert!(matches!(Meta::decode(&b), Err(MetaError::Length(_))));
        let mut b = meta().encode();
        b[8] = 17;
        assert!(matches!(Meta::decode(&b), Err(MetaError::Field("queue pair count", 17))));
        let mut b = meta().encode();
        b[11] = 9;
        assert!(matches!(Meta::decode(&b), Err(MetaError::Field("MTU", 9))));
        let mut m = meta();
        m.qpns[1] = 0;
        assert!(matches!(Meta::decode(&m.encode()), Err(MetaError::Field("queue pair number", 0))));
        let mut m = meta();
        m.ring_slots = 5000;
        assert!(matches!(Meta::decode(&m.encode()), Err(MetaError::Field("eager ring size", 5000))));
        let mut b = meta().encode();
        b[layout::meta::MEMBERS.off] = 9;
        assert!(matches!(Meta::decode(&b), Err(MetaError::Field("member count", 9))));
        b[layout::meta::MEMBERS.off] = 0;
        assert!(matches!(Meta::decode(&b), Err(MetaError::Field("member count", 0))));
        let mut m = meta();
        m.extra = vec![MemberMeta { mtu: 0, ..Default::default() }];
        assert!(matches!(Meta::decode(&m.encode()), Err(MetaError::Field("member MTU", 0))));
    }

    #[test]
    fn cts_packs_size_and_count() {
        let c = Cts::new(1, (1 << 40) + 5, 2, -1, 8, 77, 9);
        assert_eq!((c.size(), c.n(), c.base, c.stamp), ((1 << 40) + 5, 8, 77, 9));
    }

    #[test]
    fn imm_roundtrip_and_seq_offsets() {
        for i in [
            Imm::Eager(0),
            Imm::Eager(1023),
            Imm::Rdv { slot: 127, entry: 7, part: 15, size: None },
            Imm::Rdv { slot: 0, entry: 0, part: 0, size: None },
            Imm::Rdv { slot: 5, entry: 3, part: 9, size: None },
            Imm::Rdv { slot: 63, entry: 5, part: 0, size: Some(IMM_SIZE_LIMIT as u32 - 1) },
            Imm::Rdv { slot: 1, entry: 0, part: 0, size: Some(0) },
        ] {
            assert_eq!(Imm::decode(i.encode()), i);
        }
        assert_eq!(seq_offset(5, 3), 2);
        assert_eq!(seq_offset(2, 3), -1);
        assert_eq!(seq_offset(1, u32::MAX), 2); // across the wrap
    }

    #[test]
    fn failover_notices_roundtrip_and_wait_for_all_their_bytes() {
        let r = Resync {
            dead: 0b1010,
            ring_arrived: (1 << 40) + 3,
            cts_end: 99,
            recvs: vec![ResyncRecv { cts: 77, n: 2, parts: [0b01, 0xffff, 0, 0, 0, 0, 0, 0] }, ResyncRecv { cts: u64::MAX - 1, n: 8, parts: [3; 8] }],
        };
        for n in [
            Notice::Fail { dead: 0b100 },
            Notice::Resync(r),
            Notice::Mismatch(Mismatch { send_size: 9, recv_size: 8, tag: 1 }),
            Notice::Recover { qps: 3 },
            Notice::Recovered { qps: 1 },
            Notice::NotRecovered { qps: 2 },
        ] {
            let mut b = n.encode();
            let len = b.len();
            assert_eq!(Notice::decode(&b[..len - 1]), Ok(None), "{n:?}: a notice not all here is not read");
            b.extend_from_slice(&[1, 2, 3]);
            assert_eq!(Notice::decode(&b), Ok(Some((n, len))));
        }
        assert!(Notice::decode(&[0x41u8; NOTICE_SIZE]).is_err(), "garbage is refused");
        assert_eq!(Notice::Fail { dead: 0b1111 }.masked(0b11), Notice::Fail { dead: 0b11 }, "bits beyond the comm's queue pairs dropped");
        assert_eq!(Notice::Recover { qps: 0b100 }.masked(0b11), Notice::Recover { qps: 0 });
        let mut bad = Notice::Resync(Resync { dead: 1, ..Default::default() }).encode();
        bad[layout::failover::COUNT.off] = 33;
        assert!(Notice::decode(&bad).is_err(), "more receives than a receiver can have");
    }

    #[test]
    fn a_dead_queue_pairs_traffic_moves_to_the_next_live_one() {
        assert_eq!(remap(0, 3).unwrap()[..3], [0, 1, 2]);
        assert_eq!(remap(0b010, 3).unwrap()[..3], [0, 2, 2]);
        assert_eq!(remap(0b001, 4).unwrap()[..4], [1, 1, 2, 3]);
        assert_eq!(remap(0b1011, 4).unwrap()[..4], [2, 2, 2, 2]);
        assert_eq!(remap(0b0110, 4).unwrap()[..4], [0, 3, 3, 3]);
        assert_eq!(remap(0b11, 2), None, "none left");
        let cur = |v: &[u8]| -> [u8; MAX_QPS] { std::array::from_fn(|i| v.get(i).copied().unwrap_or(0)) };
        assert_eq!(remap_keeping(0, 2, &cur(&[1, 1]), true).unwrap()[..2], [1, 1], "taken back: logical 0 stays where it went");
        assert_eq!(remap_keeping(0b10, 2, &cur(&[1, 1]), false).unwrap()[..2], [0, 0], "unless that one failed");
        assert_eq!(remap_keeping(0, 3, &cur(&[2, 2, 2]), true).unwrap()[..3], [2, 1, 2], "the others go home");
        assert_eq!(remap_keeping(0b001, 3, &cur(&[1, 1, 2]), false).unwrap()[..3], [1, 1, 2]);
        assert_eq!(remap_keeping(0b100, 3, &cur(&[0, 2, 2]), false).unwrap()[..3], [0, 1, 0], "a live one stays put, a dead one moves");
    }

    #[test]
    fn mismatch_notice_roundtrip() {
        let m = Mismatch { send_size: 65536, recv_size: 4096, tag: -3 };
        assert_eq!(Mismatch::decode(&m.encode()), Some(m));
        assert_eq!(Mismatch::decode(&[0u8; NOTICE_SIZE]), None);
    }

    #[test]
    fn qp_chunks_cover_every_byte_in_128_byte_units() {
        for nqps in 1..=5 {
            for size in [0usize, 1, 127, 128, 129, 1000, 4096, 65537, 1 << 20] {
                let mut next = 0;
                for q in 0..nqps {
                    let (off, len) = qp_chunk(size, nqps, q);
                    assert!(len == 0 || off == next, "size {size} nqps {nqps} q {q}");
                    if len > 0 {
                        assert_eq!(off % CHUNK_ALIGN, 0);
                        next = off + len;
                    }
                }
                assert_eq!(next, size, "size {size} nqps {nqps}");
            }
        }
    }
}
