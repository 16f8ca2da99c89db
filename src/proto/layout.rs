//! Every wire format's layout in one place: each field's offset and size, checked at compile time
//! (inside the format, in order, not overlapping). The encoders and decoders in [`super`] and
//! [`super::verbs`] read and write fields only through these tables, and `docs/protocol.md`
//! shows the same offsets.

/// One field: `len` bytes at `off`, little-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct F {
    pub off: usize,
    pub len: usize,
}

const fn f(off: usize, len: usize) -> F {
    F { off, len }
}

/// Whether `fields` (in order) fit in `size` bytes without overlapping.
pub const fn fits(fields: &[F], size: usize) -> bool {
    let mut end = 0;
    let mut i = 0;
    while i < fields.len() {
        if fields[i].off < end || fields[i].len == 0 {
            return false;
        }
        end = fields[i].off + fields[i].len;
        i += 1;
    }
    end <= size
}

pub fn put(b: &mut [u8], f: F, v: &[u8]) {
    debug_assert_eq!(v.len(), f.len, "field at {} written with {} bytes", f.off, v.len());
    b[f.off..f.off + f.len].copy_from_slice(v);
}
pub fn put_u8(b: &mut [u8], f: F, v: u8) {
    put(b, f, &[v])
}
pub fn put_u16(b: &mut [u8], f: F, v: u16) {
    put(b, f, &v.to_le_bytes())
}
pub fn put_u32(b: &mut [u8], f: F, v: u32) {
    put(b, f, &v.to_le_bytes())
}
pub fn put_u64(b: &mut [u8], f: F, v: u64) {
    put(b, f, &v.to_le_bytes())
}
pub fn get(b: &[u8], f: F) -> &[u8] {
    &b[f.off..f.off + f.len]
}
pub fn get_u8(b: &[u8], f: F) -> u8 {
    b[f.off]
}
pub fn get_u16(b: &[u8], f: F) -> u16 {
    u16::from_le_bytes(get(b, f).try_into().unwrap())
}
pub fn get_u32(b: &[u8], f: F) -> u32 {
    u32::from_le_bytes(get(b, f).try_into().unwrap())
}
pub fn get_u64(b: &[u8], f: F) -> u64 {
    u64::from_le_bytes(get(b, f).try_into().unwrap())
}

/// The 128-byte listen handle (both transports).
pub mod handle {
    use super::{f, fits, F};
    pub const SIZE: usize = 128;
    pub const MAGIC: F = f(0, 4);
    pub const VERSION: F = f(4, 1);
    pub const TRANSPORT: F = f(5, 1);
    /// 4 or 6.
    pub const FAMILY: F = f(6, 1);
    pub const LISTEN_MAGIC: F = f(8, 8);
    pub const PORT: F = f(16, 2);
    /// IPv4 in the first 4 bytes, IPv6 in all 16.
    pub const ADDR: F = f(20, 16);
    /// Members of the listening device (protocol 5; 0 before, meaning 1).
    pub const MEMBERS: F = f(36, 1);
    /// NCCL_IB_SUBNET_AWARE_ROUTING: how many of the listening device's RoCE GIDs follow (0-2).
    pub const NGIDS: F = f(37, 1);
    pub const GIDS: F = f(40, 32);
    /// GID `i` (0 or 1).
    pub const fn gid(i: usize) -> F {
        f(GIDS.off + 16 * i, 16)
    }
    /// A connect in progress: its state and cookie, in the caller's copy of the handle.
    pub const STAGE: F = f(112, 8);
    pub const STAGE_COOKIE: F = f(120, 8);
    const _: () = assert!(fits(&[MAGIC, VERSION, TRANSPORT, FAMILY, LISTEN_MAGIC, PORT, ADDR, MEMBERS, NGIDS, GIDS, STAGE, STAGE_COOKIE], SIZE));
}

/// The TCP transport's hello, the first 32 bytes of every stream.
pub mod hello {
    use super::{f, fits, F};
    pub const SIZE: usize = 32;
    pub const MAGIC: F = f(0, 4);
    pub const VERSION: F = f(4, 2);
    pub const NSTREAMS: F = f(6, 2);
    pub const LISTEN_MAGIC: F = f(8, 8);
    pub const CONN_ID: F = f(16, 8);
    pub const STREAM: F = f(24, 2);
    pub const MIN_CHUNK: F = f(28, 4);
    const _: () = assert!(fits(&[MAGIC, VERSION, NSTREAMS, LISTEN_MAGIC, CONN_ID, STREAM, MIN_CHUNK], SIZE));
}

/// The listener's 16-byte answer to a hello.
pub mod ack {
    use super::{f, fits, F};
    pub const SIZE: usize = 16;
    pub const MAGIC: F = f(0, 4);
    pub const STATUS: F = f(4, 4);
    pub const CONN_ID: F = f(8, 8);
    const _: () = assert!(fits(&[MAGIC, STATUS, CONN_ID], SIZE));
}

/// The 24-byte header before each TCP message, on stream 0.
pub mod msg {
    use super::{f, fits, F};
    pub const SIZE: usize = 24;
    pub const MAGIC: F = f(0, 4);
    pub const SEQ: F = f(4, 4);
    pub const LEN: F = f(8, 8);
    pub const TAG: F = f(16, 4);
    pub const RESERVED: F = f(20, 4);
    const _: () = assert!(fits(&[MAGIC, SEQ, LEN, TAG, RESERVED], SIZE));
}

/// The 648-byte metadata each side of a verbs connection sends once.
pub mod meta {
    use super::{f, fits, F};
    pub const SIZE: usize = 648;
    pub const MAGIC: F = f(0, 4);
    pub const VERSION: F = f(4, 2);
    pub const LENGTH: F = f(6, 2);
    pub const NQPS: F = f(8, 1);
    pub const LINK_LAYER: F = f(9, 1);
    pub const PORT: F = f(10, 1);
    pub const MTU: F = f(11, 1);
    pub const LID: F = f(12, 2);
    pub const TC: F = f(14, 1);
    pub const SL: F = f(15, 1);
    pub const GID: F = f(16, 16);
    pub const FIFO_ADDR: F = f(32, 8);
    pub const FIFO_RKEY: F = f(40, 4);
    pub const RING_RKEY: F = f(44, 4);
    /// NUL-terminated.
    pub const DEV_NAME: F = f(48, 32);
    /// Up to 16 queue pair numbers, 4 bytes each.
    pub const QPNS: F = f(80, 64);
    pub const RING_ADDR: F = f(144, 8);
    pub const EAGER_MAX: F = f(152, 4);
    pub const RING_SLOTS: F = f(156, 2);
    /// Members of the sending side's device (1, or the ports of a fused one); the fields above
    /// describe member 0, a [`member`] block each of the others.
    pub const MEMBERS: F = f(158, 1);
    /// Member 0's device index on its host (the plugin's device number of that port).
    pub const DEV_INDEX: F = f(159, 1);
    /// Members 1..8, 32 bytes each: GID, LID, port, MTU and the FIFO's and ring's keys there.
    pub const EXTRA: F = f(160, 224);
    /// Enhanced connection establishment, an [`ece`] block per queue pair (16 of them).
    pub const ECE: F = f(384, 256);
    /// The sender's: parts each rendezvous message is split into (NCCL_IB_SPLIT_DATA_ON_QPS).
    pub const PARTS: F = f(640, 1);
    /// The members of the sending side's device whose port was down when it set up (bit m:
    /// member m): their queue pairs start failed over on both sides. Zero from a build before it.
    pub const DOWN: F = f(641, 1);
    pub const RESERVED: F = f(642, 6);
    const _: () = assert!(fits(
        &[MAGIC, VERSION, LENGTH, NQPS, LINK_LAYER, PORT, MTU, LID, TC, SL, GID, FIFO_ADDR, FIFO_RKEY, RING_RKEY, DEV_NAME, QPNS, RING_ADDR, EAGER_MAX, RING_SLOTS, MEMBERS, DEV_INDEX, EXTRA, ECE, PARTS, DOWN, RESERVED],
        SIZE
    ));
    /// Queue pair `q`'s ECE block: `struct ibv_ece`'s three words and whether they are set (the
    /// sender: its queue pair's ECE, queried; the receiver: the ECE it accepted, reduced).
    pub mod ece {
        use super::super::{f, fits, F};
        pub const SIZE: usize = 16;
        pub const VENDOR_ID: F = f(0, 4);
        pub const OPTIONS: F = f(4, 4);
        pub const COMP_MASK: F = f(8, 4);
        /// 1: supported (the words are meaningful); 0: not.
        pub const SUPPORTED: F = f(12, 1);
        pub const RESERVED: F = f(13, 3);
        const _: () = assert!(fits(&[VENDOR_ID, OPTIONS, COMP_MASK, SUPPORTED, RESERVED], SIZE));
        const _: () = assert!(16 * SIZE == super::ECE.len);
        /// Field `x` of queue pair `q`'s block.
        pub const fn at(q: usize, x: F) -> F {
            f(super::ECE.off + q * SIZE + x.off, x.len)
        }
    }
    /// The block of member `m` (1..8), and its fields.
    pub mod member {
        use super::super::{f, fits, F};
        pub const SIZE: usize = 32;
        pub const GID: F = f(0, 16);
        pub const LID: F = f(16, 2);
        pub const PORT: F = f(18, 1);
        pub const MTU: F = f(19, 1);
        pub const FIFO_RKEY: F = f(20, 4);
        pub const RING_RKEY: F = f(24, 4);
        /// The member's device index on its host.
        pub const DEV_INDEX: F = f(28, 1);
        pub const RESERVED: F = f(29, 3);
        const _: () = assert!(fits(&[GID, LID, PORT, MTU, FIFO_RKEY, RING_RKEY, DEV_INDEX, RESERVED], SIZE));
        const _: () = assert!(7 * SIZE == super::EXTRA.len);
        /// Field `x` of member `m`'s block.
        pub const fn at(m: usize, x: F) -> F {
            f(super::EXTRA.off + (m - 1) * SIZE + x.off, x.len)
        }
    }
    /// Queue pair number `i`.
    pub const fn qpn(i: usize) -> F {
        f(QPNS.off + 4 * i, 4)
    }
}

/// The 32-byte mismatch notice on a verbs connection's out-of-band socket.
pub mod notice {
    use super::{f, fits, F};
    pub const SIZE: usize = 32;
    pub const MAGIC: F = f(0, 4);
    pub const KIND: F = f(4, 4);
    pub const SEND_SIZE: F = f(8, 8);
    pub const RECV_SIZE: F = f(16, 8);
    pub const TAG: F = f(24, 4);
    const _: () = assert!(fits(&[MAGIC, KIND, SEND_SIZE, RECV_SIZE, TAG], SIZE));
}

/// Failover notices on the same socket, after the 32-byte notice's magic and kind: kind 2 (a side
/// found queue pairs dead) and kind 3 (the receiver's account of what arrived), whose records
/// follow it.
pub mod failover {
    use super::{f, fits, F};
    pub const DEAD: F = f(8, 4);
    pub const COUNT: F = f(12, 4);
    pub const RING: F = f(16, 8);
    pub const CTS_END: F = f(24, 8);
    const _: () = assert!(fits(&[super::notice::MAGIC, super::notice::KIND, DEAD, COUNT, RING, CTS_END], super::notice::SIZE));
    /// One record per receive the sender may still write into.
    pub mod rec {
        use super::super::{f, fits, F};
        pub const SIZE: usize = 32;
        pub const CTS: F = f(0, 8);
        pub const N: F = f(8, 1);
        pub const PARTS: F = f(16, 16);
        const _: () = assert!(fits(&[CTS, N, PARTS], SIZE));
    }
}

/// The formats the NIC writes, as `#[repr(C)]` structs: their layout is the table, checked here.
mod structs {
    use super::super::verbs::{Cts, EagerHdr, EAGER_HDR};
    use std::mem::{align_of, offset_of, size_of};
    // A clear-to-send entry: one 32-byte, 32-byte-aligned write, its stamp last.
    const _: () = assert!(size_of::<Cts>() == 32 && align_of::<Cts>() == 32);
    const _: () = assert!(offset_of!(Cts, addr) == 0 && offset_of!(Cts, size_n) == 8 && offset_of!(Cts, rkey) == 16);
    const _: () = assert!(offset_of!(Cts, tag) == 20 && offset_of!(Cts, base) == 24 && offset_of!(Cts, stamp) == 28);
    // The eager header at the start of a ring slot.
    const _: () = assert!(size_of::<EagerHdr>() == EAGER_HDR);
    const _: () = assert!(offset_of!(EagerHdr, seq) == 0 && offset_of!(EagerHdr, flags) == 4);
    const _: () = assert!(offset_of!(EagerHdr, size) == 8 && offset_of!(EagerHdr, tag) == 16);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_rejects_overlaps_and_overruns() {
        assert!(fits(&[f(0, 4), f(4, 4)], 8));
        assert!(!fits(&[f(0, 4), f(3, 4)], 8), "overlap");
        assert!(!fits(&[f(0, 4), f(6, 4)], 8), "past the end");
        assert!(!fits(&[f(4, 4), f(0, 4)], 8), "out of order");
    }
}
