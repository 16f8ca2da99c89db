//! The seam between the version-independent core and a network: a [`Transport`] is one device
//! NCCL sees, owning its properties, listen / connect / accept, and memory registration; a
//! [`Conn`] is one connected comm's data path. The TCP transport (`socket`) and the RDMA verbs
//! transport (`verbs`) implement both; [`discover`] picks which one a host uses.

pub mod discover;
pub mod oob;
pub mod socket;
pub mod verbs;

pub use discover::{discover, Devices};
/// NIC fusion's rules (which devices may fuse, and what the fused device reports).
pub use verbs::fuse::{check as check_fusion, MemberInfo, MAX_MEMBERS};

use crate::error::{Error, Result};
use crate::gpu::{cuda, gdr, staging::Registrar};
use crate::proto::Handle;
use std::ffi::CString;

/// What a device reports of itself (the transport-independent part of `getProperties`).
#[derive(Debug, Clone)]
pub struct DevInfo {
    pub name: CString,
    pub pci_path: Option<CString>,
    pub guid: u64,
    /// Mb/s.
    pub speed: i32,
    pub port: i32,
    /// How many comms the device can hold at once.
    pub max_comms: i32,
    /// The IP interface connection setup runs over (the device itself, for TCP).
    pub iface: String,
    pub addr: std::net::IpAddr,
    /// Rail and plane (ncclNet v12's railId / planeId; -1 when undefined): from NCCL_IB_HCA's
    /// `dev:port:rail:plane` entries, merged for a fused device.
    pub rail: i16,
    pub plane: i16,
}

/// The buffer kinds a device takes besides host memory (`ptrSupport`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PtrSupport {
    /// `cudaMalloc` memory, registered by address.
    pub cuda: bool,
    /// GPU memory registered through a dma-buf file descriptor.
    pub dmabuf: bool,
}

/// How GPU buffers travel on a device, before any decision for a particular GPU.
#[derive(Debug, Clone)]
pub enum GpuRoute {
    /// Decide GPUDirect RDMA on these facts; staging where it is refused or its registration fails.
    Gdr(gdr::Facts),
    /// Through the staging engine's host bounce buffers, for this reason (it goes to the log).
    Staging(String),
}

/// A registration a memory handle owns, given back at `deregMr`.
pub trait Registration: Send + Sync {
    fn release(self: Box<Self>) -> Result<()>;
}

/// A registration made by a transport: the data path's view of it, and what it owns (None when
/// nothing needs releasing, as on TCP).
pub struct Registered {
    pub info: MrInfo,
    pub owner: Option<Box<dyn Registration>>,
}

/// One network device: everything the core asks of a transport besides the data path.
/// Devices live for the whole process (the device table is built once), so connections and
/// registrations may borrow them for `'static`.
pub trait Transport: Send + Sync {
    /// Name, PCI path, speed and limits.
    fn info(&self) -> &DevInfo;
    /// The transport's id in listen handles (`proto::TRANSPORT_*`): both ends must use the same.
    fn wire(&self) -> u8;
    /// The device as the start-up banner describes it (after "device N: "): address, speed,
    /// PCI path, and what matters for choosing a data path.
    fn describe(&self) -> String;
    /// Which buffer kinds NCCL may pass.
    fn ptr_support(&self) -> PtrSupport;
    /// The RoCE GIDs of the device's members (NCCL_IB_SUBNET_AWARE_ROUTING); none elsewhere.
    fn roce_gids(&self) -> Vec<[u8; 16]> {
        Vec::new()
    }
    /// Listen for connections; the handle goes to the connecting peer through NCCL.
    fn listen(&'static self) -> Result<(Box<dyn Listening>, Handle)>;
    /// Start connecting to the listener behind `peer` (its transport already checked to be this
    /// one's). `traffic_class` is the communicator's (v11+).
    fn connect(&'static self, peer: &Handle, traffic_class: Option<u8>) -> Result<Box<dyn Dialing>>;
    /// Register host memory for a send (`send`) or receive comm.
    fn register(&'static self, addr: usize, len: usize, send: bool) -> Result<Registered>;
    /// How buffers of the GPU `pi` travel; `via` says how NCCL registers them. An error refuses
    /// GPU memory on this device, saying why.
    fn gpu_route(&'static self, pi: &cuda::PtrInfo, via: gdr::Via) -> Result<GpuRoute>;
    /// Register GPU memory for GPUDirect RDMA (by address, or by dma-buf: offset and fd). Only
    /// called where [`gpu_route`](Transport::gpu_route) answered `Gdr`.
    fn register_gpu(&'static self, _addr: usize, _len: usize, _send: bool, _dmabuf: Option<(u64, i32)>) -> Result<Registered> {
        Err(Error::internal(format!("{}: GPUDirect registration on a transport without it", self.info().name.to_string_lossy())))
    }
    /// What a staged comm registers its bounce buffers with.
    fn registrar(&'static self, send: bool) -> Box<dyn Registrar>;
    /// What NIC fusion's rules look at ([`check_fusion`]): a device that is no RDMA port does
    /// not fuse.
    fn member_info(&self) -> MemberInfo {
        let i = self.info();
        MemberInfo { name: i.name.to_string_lossy().into_owned(), rdma: false, link_layer: 0, speed: i.speed, rail: -1, plane_idx: 0, plane: -1 }
    }
    /// A virtual device fusing this one (member 0) and `rest`, all of them passed by
    /// [`check_fusion`]. Made once per set of members: it lives for the process.
    fn fuse(&'static self, _rest: &[&'static dyn Transport]) -> Result<&'static dyn Transport> {
        Err(Error::usage(format!("{}: only RDMA devices fuse into a virtual NIC", self.info().name.to_string_lossy())))
    }
    /// The device as `Any`: its own transport finds its other devices among a fusion's members.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// A listening comm's transport side.
pub trait Listening: Send {
    /// Non-blocking: a receive comm once a connection has fully arrived.
    fn accept(&mut self) -> Result<Option<DataPath>>;
}

/// A connect in progress, kept between NCCL's calls.
pub trait Dialing: Send {
    /// Non-blocking: the send comm once the connection is up.
    fn poll(&mut self) -> Result<Option<DataPath>>;
}

/// A device's PCI path for the log ("none (virtual)" without one).
pub(crate) fn pci_text(d: &DevInfo) -> String {
    d.pci_path.as_ref().map(|p| p.to_string_lossy().into_owned()).unwrap_or_else(|| "none (virtual)".into())
}

/// The name of a transport id found in a handle.
pub fn wire_name(t: u8) -> &'static str {
    match t {
        crate::proto::TRANSPORT_SOCKET => "TCP",
        crate::proto::TRANSPORT_VERBS => "RDMA verbs",
        _ => "unknown",
    }
}

/// A memory registration as the data path sees it (from the handle `regMr` returned).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MrInfo {
    /// The registered range (page aligned for verbs, exact for TCP).
    pub addr: usize,
    pub len: usize,
    /// The local and remote key on each member (one for a physical device; 0 past the
    /// registration's members), kept as the data path reads them: a send's source takes its
    /// lkeys, a receive's CTS entry its rkeys, as they are.
    pub lkeys: [u32; verbs::fuse::MAX_MEMBERS],
    pub rkeys: [u32; verbs::fuse::MAX_MEMBERS],
    /// Members the keys cover (0 and 1 both mean a physical device's one).
    pub members: u8,
    /// IBV_ACCESS_* flags the registration has (0 for TCP).
    pub access: u32,
    /// Identity of the RDMA device the keys belong to (0 for TCP).
    pub dev: usize,
    /// How the data path moves this memory.
    pub path: Path,
    /// The CUDA device owning the memory (staged and GDR buffers); None for host memory.
    pub gpu: Option<i32>,
}

/// How a registered buffer's bytes travel (see `staging`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Path {
    /// Host memory, sent and received by the transport directly.
    #[default]
    Host = 0,
    /// GPU memory copied through pinned host bounce buffers.
    Staged = 1,
    /// GPU memory the NIC reads and writes directly (GPUDirect RDMA).
    Gdr = 2,
}

impl MrInfo {
    /// The keys (lkey, rkey) on member `m` of the device the registration was made on.
    pub fn keys(&self, m: usize) -> (u32, u32) {
        (self.lkeys.get(m).copied().unwrap_or(0), self.rkeys.get(m).copied().unwrap_or(0))
    }
    /// Member `m`'s keys set (a fused registration's, member by member).
    pub fn set_keys(&mut self, m: usize, (lkey, rkey): (u32, u32)) {
        self.lkeys[m] = lkey;
        self.rkeys[m] = rkey;
    }
    pub fn lkey_on(&self, m: usize) -> u32 {
        self.keys(m).0
    }
    pub fn rkey_on(&self, m: usize) -> u32 {
        self.keys(m).1
    }
    /// Members with keys (at least 1).
    pub fn nmembers(&self) -> usize {
        (self.members as usize).max(1)
    }

    pub fn covers(&self, ptr: usize, size: usize) -> bool {
        ptr >= self.addr && ptr.checked_add(size).is_some_and(|end| end <= self.addr + self.len)
    }
}

/// How the buffer behind a registration NCCL passed travels (Host where it passed none).
pub(crate) fn path_of(mr: Option<&MrInfo>) -> Path {
    mr.map_or(Path::Host, |m| m.path)
}

/// The GPU owning the buffer behind a registration (None for host memory or no registration).
pub(crate) fn gpu_of(mr: Option<&MrInfo>) -> Option<i32> {
    mr.and_then(|m| m.gpu)
}

/// A buffer lent to the transport for one request: NCCL's send or receive buffer, or a staging
/// bounce buffer standing in for it. Only [`Lent::new`], which is unsafe, makes one: the promise
/// that the memory is there is made once, where the pointer comes in (the plugin's `isend`,
/// `irecv` and `iflush`, the staging engine), and every transport relies on it.
#[derive(Debug)]
pub struct Lent {
    ptr: *mut u8,
    len: usize,
}

impl Default for Lent {
    fn default() -> Lent {
        Lent::EMPTY
    }
}

impl Lent {
    pub const EMPTY: Lent = Lent { ptr: std::ptr::null_mut(), len: 0 };

    /// # Safety
    /// Unless `len` is 0, `ptr` points to `len` bytes that stay valid until the request the
    /// buffer is posted with has been reported done, or its comm closed. In that time a send
    /// buffer is only read, and a receive buffer is not used by anyone but the transport. The
    /// bytes may be GPU memory; the transport then reaches them only by the NIC or a CUDA copy,
    /// as the buffer's registration says (`MrInfo::path`).
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Lent {
        Lent { ptr, len }
    }
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub fn addr(&self) -> usize {
        self.ptr as usize
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// One buffer of a (possibly grouped) receive.
#[derive(Debug, Default)]
pub struct RecvBuf {
    pub buf: Lent,
    pub tag: i32,
    /// The buffer's registration (None when NCCL passed none), copied from its memory handle.
    pub mr: Option<MrInfo>,
}

impl RecvBuf {
    pub const EMPTY: RecvBuf = RecvBuf { buf: Lent::EMPTY, tag: 0, mr: None };
}

/// Most buffers in one grouped receive (the `maxRecvs` every device reports).
pub const MAX_RECVS: usize = crate::proto::verbs::MAX_GROUP;

/// One queue pair's share of a request, for NCCL's profiler (ncclNet v10+): the member it runs on,
/// its number, the bytes it carries and the `ibv_wr_opcode` of its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetEvent {
    pub device: i32,
    pub qpn: u32,
    pub length: usize,
    pub opcode: i32,
}

/// A connected send or receive comm. Requests are slot numbers below `capacity()`; a slot is
/// handed out by `isend`/`irecv` and free again once `test` reported it done.
pub trait Conn: Send {
    /// Post a send; `Ok(None)` is back-pressure (no free slot), the caller retries later.
    fn isend(&mut self, _data: Lent, _tag: i32, _mr: Option<&MrInfo>) -> Result<Option<u32>> {
        Err(Error::internal("isend called on a receive comm"))
    }
    /// Post a send of which only the first `ready` bytes (< its size) can be read yet, for the
    /// staging engine to overlap its device-to-host copy with the network: `set_ready` raises
    /// the mark as the copy proceeds. A transport that cannot send part of a message answers
    /// with back-pressure until all of it is ready.
    fn isend_partial(&mut self, data: Lent, tag: i32, mr: Option<&MrInfo>, ready: usize) -> Result<Option<u32>> {
        if ready >= data.len() {
            self.isend(data, tag, mr)
        } else {
            Ok(None)
        }
    }
    /// More of a partial send's bytes can be read: the first `ready` of them.
    fn set_ready(&mut self, _slot: u32, _ready: usize) -> Result<()> {
        Ok(())
    }
    /// Post a receive of 1..=MAX_RECVS buffers; `Ok(None)` is back-pressure. A transport that
    /// posts them takes the buffers it reaches later (`std::mem::take`): they stay `Lent` in its
    /// request until it is done.
    fn irecv(&mut self, _bufs: &mut [RecvBuf]) -> Result<Option<u32>> {
        Err(Error::internal("irecv called on a send comm"))
    }
    /// Make GPU-written receive data visible (the receive buffers of a completed `irecv`);
    /// `Ok(None)` means nothing to wait for.
    fn iflush(&mut self, _bufs: &mut [RecvBuf]) -> Result<Option<u32>> {
        Ok(None)
    }
    /// Make progress and report whether `slot` is done; when it is, its sizes are written to
    /// `sizes` (one per buffer of the request) and their count returned.
    fn test(&mut self, slot: u32, sizes: &mut [usize; MAX_RECVS]) -> Result<Option<usize>>;
    /// Number of request slots.
    fn capacity(&self) -> usize;
    /// The queue pairs a request of `size` bytes (a receive buffer's size on a receive comm) goes
    /// over, for NCCL's profiler; none on a transport without queue pairs.
    fn net_events(&self, _size: usize, _out: &mut Vec<NetEvent>) {}
    /// Whether posts of this comm wait for room (the newly ready bytes of partial sends, see
    /// `set_ready`): they need calls on this comm to move, like staged sends do.
    fn has_deferred(&self) -> bool {
        false
    }
    /// Move deferred posts on, as far as there is room.
    fn progress_deferred(&mut self) -> Result<()> {
        Ok(())
    }
}

/// A connected comm's data path, held by type: the RDMA comms, whose calls are inline in the
/// core's (every message's way: no virtual call, and the idle `test`'s straight path inlined up
/// to the provider's poll), or another transport's comm behind `dyn Conn`.
pub enum DataPath {
    VerbsSend(Box<verbs::send::VerbsSend>),
    VerbsRecv(Box<verbs::recv::VerbsRecv>),
    Other(Box<dyn Conn>),
}

/// `$body` with `$c` bound to whichever comm `$d` holds.
macro_rules! on_path {
    ($d:expr, $c:ident => $body:expr) => {
        match $d {
            DataPath::VerbsSend($c) => $body,
            DataPath::VerbsRecv($c) => $body,
            DataPath::Other($c) => $body,
        }
    };
}

impl Conn for DataPath {
    #[inline]
    fn isend(&mut self, data: Lent, tag: i32, mr: Option<&MrInfo>) -> Result<Option<u32>> {
        on_path!(self, c => c.isend(data, tag, mr))
    }
    #[inline]
    fn isend_partial(&mut self, data: Lent, tag: i32, mr: Option<&MrInfo>, ready: usize) -> Result<Option<u32>> {
        on_path!(self, c => c.isend_partial(data, tag, mr, ready))
    }
    fn set_ready(&mut self, slot: u32, ready: usize) -> Result<()> {
        on_path!(self, c => c.set_ready(slot, ready))
    }
    #[inline]
    fn irecv(&mut self, bufs: &mut [RecvBuf]) -> Result<Option<u32>> {
        on_path!(self, c => c.irecv(bufs))
    }
    fn iflush(&mut self, bufs: &mut [RecvBuf]) -> Result<Option<u32>> {
        on_path!(self, c => c.iflush(bufs))
    }
    #[inline(always)]
    fn test(&mut self, slot: u32, sizes: &mut [usize; MAX_RECVS]) -> Result<Option<usize>> {
        on_path!(self, c => c.test(slot, sizes))
    }
    fn capacity(&self) -> usize {
        on_path!(self, c => c.capacity())
    }
    fn net_events(&self, size: usize, out: &mut Vec<NetEvent>) {
        on_path!(self, c => c.net_events(size, out))
    }
    #[inline]
    fn has_deferred(&self) -> bool {
        on_path!(self, c => c.has_deferred())
    }
    fn progress_deferred(&mut self) -> Result<()> {
        on_path!(self, c => c.progress_deferred())
    }
}
