//! Wire formats, as pure code: the 128-byte listen handle, the TCP handshake (hello / ack) and the
//! per-message header, plus the deterministic split of a message across streams. Decoding never
//! trusts a length, count or index from the wire.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

pub mod layout;
mod notice;
pub mod qps;

use layout::{get, get_u16, get_u32, get_u64, get_u8, put, put_u16, put_u32, put_u64, put_u8};

pub const HANDLE_SIZE: usize = layout::handle::SIZE;
const HANDLE_MAGIC: u32 = 0x5256_4e54; // "RVNT"
/// Bumped whenever a wire format changes: ranks must run one rivet build.
pub const PROTO_VERSION: u8 = 7;
/// Requests NCCL keeps in flight per comm at most (NCCL_NET_MAX_REQUESTS, checked against the
/// ABI's constant in `abi::types`): what the request slots of every transport are sized for.
pub const NCCL_INFLIGHT: usize = 32;

pub const TRANSPORT_SOCKET: u8 = 1;
pub const TRANSPORT_VERBS: u8 = 2;

pub mod recv;
pub mod send;
pub mod verbs;

/// A protocol violation or a collective mismatch found by the verbs engines. The transport adds
/// where (device, port, queue pair, peer) and turns it into the comm's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtoError {
    /// The sender's large send and the receive it belongs to posted no clear-to-send: all of the
    /// receive's buffers are within the eager limit.
    SendOverEager { size: usize, tag: i32, eager_max: usize },
    SendTagUnmatched { tag: i32, tags: [i32; verbs::MAX_GROUP], n: usize },
    SendTooLarge { size: usize, tag: i32, recv: u64 },
    RecvTagUnmatched { tag: i32, tags: [i32; verbs::MAX_GROUP], n: usize },
    RecvTooSmall { size: u64, recv: u64, tag: i32 },
    /// An eager message for a receive that already completed.
    EagerStale { seq: u32 },
    CorruptEager { size: u64 },
    CorruptCts { n: usize },
    /// A rendezvous immediate naming no buffer in flight.
    StrayImm { slot: u32, entry: u32 },
    CorruptSize { size: u64, recv: u64 },
    NotInFlight { req: u32, send: bool },
    TooManyFlushes { max: usize },
    /// The receiver's account after a failover contradicts the sender's (`got`: the receiver's
    /// value, `have`: the sender's).
    CorruptResync { what: &'static str, got: u64, have: u64 },
}

impl ProtoError {
    /// A collective mismatch (the application's error, not the network's).
    pub fn is_mismatch(&self) -> bool {
        use ProtoError::*;
        matches!(self, SendOverEager { .. } | SendTagUnmatched { .. } | SendTooLarge { .. } | RecvTagUnmatched { .. } | RecvTooSmall { .. })
    }

    /// An error of ours, not of the peer or the application.
    pub fn is_internal(&self) -> bool {
        matches!(self, ProtoError::NotInFlight { .. } | ProtoError::TooManyFlushes { .. })
    }

    /// What to tell the peer over the out-of-band socket, so that it reports the same cause.
    pub fn notice(&self) -> Option<verbs::Mismatch> {
        match *self {
            ProtoError::SendOverEager { size, tag, eager_max } => {
                Some(verbs::Mismatch { send_size: size as u64, recv_size: eager_max as u64, tag })
            }
            ProtoError::SendTooLarge { size, tag, recv } => Some(verbs::Mismatch { send_size: size as u64, recv_size: recv, tag }),
            ProtoError::RecvTooSmall { size, recv, tag } => Some(verbs::Mismatch { send_size: size, recv_size: recv, tag }),
            _ => None,
        }
    }
}

/// The text; `{peer}` is the remote address, which only the transport knows.
pub struct Explain<'a>(pub &'a ProtoError, pub &'a dyn std::fmt::Display);

impl std::fmt::Display for Explain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        const SAME: &str = "every rank must run the same collectives with the same sizes";
        let peer = self.1;
        match *self.0 {
            ProtoError::SendOverEager { size, tag, eager_max } => write!(
                f,
                "collective mismatch: a send of {size} bytes with tag {tag} is larger than every buffer of the peer's receive (at most {eager_max} bytes, the eager limit); {SAME}"
            ),
            ProtoError::SendTagUnmatched { tag, tags, n } => write!(
                f,
                "collective mismatch: a send with tag {tag} does not match the peer's posted receive (tags {:?})",
                &tags[..n]
            ),
            ProtoError::SendTooLarge { size, tag, recv } => write!(
                f,
                "collective mismatch: a send of {size} bytes with tag {tag} is larger than the peer's receive of {recv} bytes; {SAME}"
            ),
            ProtoError::RecvTagUnmatched { tag, tags, n } => write!(
                f,
                "collective mismatch: the peer {peer} sent a message with tag {tag} that matches none of the posted receive's tags {:?}",
                &tags[..n]
            ),
            ProtoError::RecvTooSmall { size, recv, tag } => write!(
                f,
                "collective mismatch: the peer {peer} sent {size} bytes with tag {tag} but the posted receive holds only {recv} bytes; {SAME}"
            ),
            ProtoError::EagerStale { seq } => write!(f, "an eager message for an already completed receive (seq {seq})"),
            ProtoError::CorruptEager { size } => write!(f, "corrupt eager header (size {size})"),
            ProtoError::CorruptCts { n } => write!(f, "corrupt clear-to-send entry (n {n})"),
            ProtoError::StrayImm { slot, entry } => {
                write!(f, "a rendezvous completion for clear-to-send slot {slot} buffer {entry}, which no receive in flight owns")
            }
            ProtoError::CorruptSize { size, recv } => {
                write!(f, "a rendezvous send reported {size} bytes into a receive buffer of {recv} bytes")
            }
            ProtoError::NotInFlight { req, send } => {
                write!(f, "test on {} request {req}, which is not in flight", if send { "send" } else { "receive" })
            }
            ProtoError::TooManyFlushes { max } => write!(f, "more than {max} flushes in flight on one comm"),
            ProtoError::CorruptResync { what, got, have } => write!(
                f,
                "the receiver's account after a failover does not fit what this sender sent ({what}: {got:#x} against {have:#x})"
            ),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handle {
    pub transport: u8,
    /// Random per listen call: a connection that presents another value is rejected.
    pub magic: u64,
    pub addr: SocketAddr,
    /// Members of the listening device (1, or the ports of a fused one): the connector makes a
    /// queue pair for each, and CTS entries carry a key per member.
    pub members: u8,
    /// NCCL_IB_SUBNET_AWARE_ROUTING: up to 2 RoCE GIDs of the listening device's members, so
    /// that a connector can pick a device on their subnets.
    pub gids: Vec<[u8; 16]>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandleError {
    NotRivet(u32),
    Version(u8),
    Family(u8),
    Members(u8),
}

impl std::fmt::Display for HandleError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            HandleError::NotRivet(m) => write!(
                f,
                "the handle is not a rivet handle (magic {m:#010x}): it was made by another plugin or is corrupted; check that every rank loads the same NCCL_NET_PLUGIN"
            ),
            HandleError::Version(v) => write!(
                f,
                "the handle has protocol version {v} but this rivet speaks {PROTO_VERSION}: run the same rivet build on every rank"
            ),
            HandleError::Family(x) => write!(f, "the handle has an unknown address family {x}"),
            HandleError::Members(x) => write!(f, "the handle names a device of {x} members (at most {} fuse)", verbs::MAX_MEMBERS),
        }
    }
}

impl Handle {
    pub fn encode(&self, out: &mut [u8; HANDLE_SIZE]) {
        use layout::handle::*;
        out.fill(0);
        put_u32(out, MAGIC, HANDLE_MAGIC);
        put_u8(out, VERSION, PROTO_VERSION);
        put_u8(out, TRANSPORT, self.transport);
        put_u64(out, LISTEN_MAGIC, self.magic);
        put_u16(out, PORT, self.addr.port());
        let mut addr = [0u8; 16];
        match self.addr.ip() {
            IpAddr::V4(a) => {
                put_u8(out, FAMILY, 4);
                addr[..4].copy_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                put_u8(out, FAMILY, 6);
                addr = a.octets();
            }
        }
        put(out, ADDR, &addr);
        put_u8(out, MEMBERS, self.members);
        let gids = &self.gids[..self.gids.len().min(2)];
        put_u8(out, NGIDS, gids.len() as u8);
        for (i, g) in gids.iter().enumerate() {
            put(out, gid(i), g);
        }
    }

    pub fn decode(b: &[u8; HANDLE_SIZE]) -> Result<Handle, HandleError> {
        use layout::handle::*;
        let m = get_u32(b, MAGIC);
        if m != HANDLE_MAGIC {
            return Err(HandleError::NotRivet(m));
        }
        let v = get_u8(b, VERSION);
        if v != PROTO_VERSION {
            return Err(HandleError::Version(v));
        }
        let a = get(b, ADDR);
        let ip = match get_u8(b, FAMILY) {
            4 => IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3])),
            6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(a).unwrap())),
            x => return Err(HandleError::Family(x)),
        };
        let members = get_u8(b, MEMBERS).max(1);
        if members as usize > verbs::MAX_MEMBERS {
            return Err(HandleError::Members(members));
        }
        let gids = (0..(get_u8(b, NGIDS) as usize).min(2)).map(|i| get(b, gid(i)).try_into().unwrap()).collect();
        Ok(Handle { transport: get_u8(b, TRANSPORT), magic: get_u64(b, LISTEN_MAGIC), addr: SocketAddr::new(ip, get_u16(b, PORT)), members, gids })
    }
}

/// The connect-in-progress stage stored in a handle: (state pointer, cookie). NCCL calls connect
/// again with the same buffer until it returns a comm.
pub fn stage_get(b: &[u8; HANDLE_SIZE]) -> (u64, u64) {
    (get_u64(b, layout::handle::STAGE), get_u64(b, layout::handle::STAGE_COOKIE))
}

pub fn stage_set(b: &mut [u8; HANDLE_SIZE], ptr: u64, cookie: u64) {
    put_u64(b, layout::handle::STAGE, ptr);
    put_u64(b, layout::handle::STAGE_COOKIE, cookie);
}

pub const HELLO_SIZE: usize = layout::hello::SIZE;
const HELLO_MAGIC: u32 = 0x5256_484c; // "RVHL"
pub const MAX_STREAMS: usize = 16;

/// First bytes a connector sends on each of its TCP streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub listen_magic: u64,
    pub conn_id: u64,
    pub stream: u16,
    pub nstreams: u16,
    /// The sender's RIVET_SOCKET_MIN_CHUNK: both ends must split messages the same way.
    pub min_chunk: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelloError {
    /// Not a rivet client at all (garbage, a port scanner, another protocol).
    Garbage(u32),
    Version(u16),
    BadStreams { stream: u16, nstreams: u16 },
    BadChunk(u32),
}

impl std::fmt::Display for HelloError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            HelloError::Garbage(m) => write!(f, "not a rivet client (first bytes {m:#010x})"),
            HelloError::Version(v) => {
                write!(f, "rivet protocol version {v}, this side speaks {PROTO_VERSION}: run one rivet build on every rank")
            }
            HelloError::BadStreams { stream, nstreams } => {
                write!(f, "invalid stream {stream} of {nstreams} (at most {MAX_STREAMS})")
            }
            HelloError::BadChunk(c) => write!(f, "invalid chunk size {c}"),
        }
    }
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_SIZE] {
        use layout::hello::*;
        let mut b = [0u8; HELLO_SIZE];
        put_u32(&mut b, MAGIC, HELLO_MAGIC);
        put_u16(&mut b, VERSION, PROTO_VERSION as u16);
        put_u16(&mut b, NSTREAMS, self.nstreams);
        put_u64(&mut b, LISTEN_MAGIC, self.listen_magic);
        put_u64(&mut b, CONN_ID, self.conn_id);
        put_u16(&mut b, STREAM, self.stream);
        put_u32(&mut b, MIN_CHUNK, self.min_chunk);
        b
    }

    pub fn decode(b: &[u8; HELLO_SIZE]) -> Result<Hello, HelloError> {
        use layout::hello::*;
        let m = get_u32(b, MAGIC);
        if m != HELLO_MAGIC {
            return Err(HelloError::Garbage(m.swap_bytes()));
        }
        let v = get_u16(b, VERSION);
        if v != PROTO_VERSION as u16 {
            return Err(HelloError::Version(v));
        }
        let h = Hello {
            nstreams: get_u16(b, NSTREAMS),
            listen_magic: get_u64(b, LISTEN_MAGIC),
            conn_id: get_u64(b, CONN_ID),
            stream: get_u16(b, STREAM),
            min_chunk: get_u32(b, MIN_CHUNK),
        };
        if h.nstreams == 0 || h.nstreams as usize > MAX_STREAMS || h.stream >= h.nstreams {
            return Err(HelloError::BadStreams { stream: h.stream, nstreams: h.nstreams });
        }
        if h.min_chunk < 4096 || h.min_chunk > 1 << 30 {
            return Err(HelloError::BadChunk(h.min_chunk));
        }
        Ok(h)
    }
}

pub const ACK_SIZE: usize = layout::ack::SIZE;
const ACK_MAGIC: u32 = 0x5256_414b; // "RVAK"
pub const ACK_OK: u32 = 0;
pub const ACK_BAD_MAGIC: u32 = 1;

pub fn encode_ack(conn_id: u64, status: u32) -> [u8; ACK_SIZE] {
    use layout::ack::*;
    let mut b = [0u8; ACK_SIZE];
    put_u32(&mut b, MAGIC, ACK_MAGIC);
    put_u32(&mut b, STATUS, status);
    put_u64(&mut b, CONN_ID, conn_id);
    b
}

/// `Some((conn_id, status))`, or None when the bytes are not an ack.
pub fn decode_ack(b: &[u8; ACK_SIZE]) -> Option<(u64, u32)> {
    use layout::ack::*;
    (get_u32(b, MAGIC) == ACK_MAGIC).then(|| (get_u64(b, CONN_ID), get_u32(b, STATUS)))
}

pub const MSG_HDR_SIZE: usize = layout::msg::SIZE;
const MSG_MAGIC: u32 = 0x5256_4d48; // "RVMH"

/// Sent on stream 0 before each message's first chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsgHeader {
    pub seq: u32,
    pub size: u64,
    pub tag: i32,
}

impl MsgHeader {
    pub fn encode(&self, b: &mut [u8; MSG_HDR_SIZE]) {
        use layout::msg::*;
        put_u32(b, MAGIC, MSG_MAGIC);
        put_u32(b, SEQ, self.seq);
        put_u64(b, LEN, self.size);
        put_u32(b, TAG, self.tag as u32);
        put_u32(b, RESERVED, 0);
    }

    pub fn decode(b: &[u8; MSG_HDR_SIZE]) -> Option<MsgHeader> {
        use layout::msg::*;
        (get_u32(b, MAGIC) == MSG_MAGIC).then(|| MsgHeader { seq: get_u32(b, SEQ), size: get_u64(b, LEN), tag: get_u32(b, TAG) as i32 })
    }
}

/// How a message of `size` bytes is spread over `nstreams` streams: `(k, chunk)` where stream
/// `j < k` carries bytes `[j*chunk, min((j+1)*chunk, size))`. Every part but the last is a multiple
/// of 4 KiB and at least `min_chunk`; every part is non-empty (a 0-byte message has k = 1, chunk = 0).
pub fn split(size: usize, nstreams: usize, min_chunk: usize) -> (usize, usize) {
    if size == 0 {
        return (1, 0);
    }
    let k = (size / min_chunk.max(1)).clamp(1, nstreams.max(1));
    let chunk = size.div_ceil(k).next_multiple_of(4096);
    (size.div_ceil(chunk), chunk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_roundtrip_and_stage() {
        for addr in ["127.0.0.1:4242", "[fd00::2]:65535"] {
            let h = Handle { transport: TRANSPORT_SOCKET, magic: 0xdead_beef_1234, addr: addr.parse().unwrap(), members: 1, gids: Vec::new() };
            let mut b = [0xffu8; HANDLE_SIZE];
            h.encode(&mut b);
            assert_eq!(stage_get(&b), (0, 0), "a fresh handle has no connect stage");
            stage_set(&mut b, 77, 99);
            assert_eq!(Handle::decode(&b).unwrap(), h);
            assert_eq!(stage_get(&b), (77, 99));
        }
    }

    #[test]
    fn handle_rejects_foreign_bytes() {
        let mut b = [0u8; HANDLE_SIZE];
        assert!(matches!(Handle::decode(&b), Err(HandleError::NotRivet(0))));
        let h = Handle { transport: 1, magic: 5, addr: "1.2.3.4:5".parse().unwrap(), members: 3, gids: vec![[7; 16], [9; 16]] };
        h.encode(&mut b);
        b[4] = 9;
        assert_eq!(Handle::decode(&b), Err(HandleError::Version(9)));
        h.encode(&mut b);
        b[6] = 5;
        assert_eq!(Handle::decode(&b), Err(HandleError::Family(5)));
        h.encode(&mut b);
        b[layout::handle::MEMBERS.off] = 9;
        assert_eq!(Handle::decode(&b), Err(HandleError::Members(9)));
        b[layout::handle::MEMBERS.off] = 0;
        assert_eq!(Handle::decode(&b).unwrap().members, 1, "0 (a physical device before protocol 5) means one member");
    }

    #[test]
    fn hello_roundtrip_and_validation() {
        let h = Hello { listen_magic: 1, conn_id: 2, stream: 3, nstreams: 4, min_chunk: 65536 };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        let bad = Hello { stream: 4, ..h };
        assert!(matches!(Hello::decode(&bad.encode()), Err(HelloError::BadStreams { .. })));
        let bad = Hello { nstreams: 17, stream: 0, ..h };
        assert!(matches!(Hello::decode(&bad.encode()), Err(HelloError::BadStreams { .. })));
        let bad = Hello { min_chunk: 1, ..h };
        assert!(matches!(Hello::decode(&bad.encode()), Err(HelloError::BadChunk(1))));
        let mut g = [0u8; HELLO_SIZE];
        g[..4].copy_from_slice(b"GET ");
        assert!(matches!(Hello::decode(&g), Err(HelloError::Garbage(_))));
    }

    #[test]
    fn ack_and_header_roundtrip() {
        assert_eq!(decode_ack(&encode_ack(42, ACK_BAD_MAGIC)), Some((42, ACK_BAD_MAGIC)));
        assert_eq!(decode_ack(&[0u8; ACK_SIZE]), None);
        let m = MsgHeader { seq: 7, size: 1 << 33, tag: -5 };
        let mut b = [0u8; MSG_HDR_SIZE];
        m.encode(&mut b);
        assert_eq!(MsgHeader::decode(&b), Some(m));
        b[0] ^= 1;
        assert_eq!(MsgHeader::decode(&b), None);
    }

    #[test]
    fn split_covers_every_byte_once() {
        for &n in &[1usize, 2, 3, 4, 8, 16] {
            for &size in &[0usize, 1, 4095, 4096, 65536, 65537, 131072, 1 << 20, (1 << 20) + 3, 16 << 20, 1000003] {
                let (k, chunk) = split(size, n, 65536);
                assert!(k >= 1 && k <= n, "size {size} n {n}: k {k}");
                if size == 0 {
                    assert_eq!((k, chunk), (1, 0));
                    continue;
                }
                let mut covered = 0;
                for j in 0..k {
                    let lo = j * chunk;
                    let hi = ((j + 1) * chunk).min(size);
                    assert!(lo < hi, "empty part {j} for size {size} n {n}");
                    if j + 1 < k {
                        assert!(hi - lo >= 65536 && (hi - lo) % 4096 == 0);
                    }
                    covered += hi - lo;
                }
                assert_eq!(covered, size);
                if size < 2 * 65536 {
                    assert_eq!(k, 1, "small messages use one stream");
                }
            }
        }
    }
}
