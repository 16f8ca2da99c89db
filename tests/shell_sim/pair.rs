//! A connection of the two production shells over the simulated NIC, made as setup makes one:
//! each side's ports, completion queues, queue pairs and registered memory, the links recovery
//! reconnects with; and NCCL's buffers and their registrations.

use super::*;
/// The keys of one registration on each of `ports`.
pub(crate) type Keys = [(u32, u32); MAX_MEMBERS];

/// `len` bytes registered on each of `ports` (remote access as given).
pub(crate) fn registered(len: usize, access: u32, ports: &[usize]) -> (Vec<u8>, Keys) {
    let v = vec![0u8; len.max(64)];
    let mut keys = [(0, 0); MAX_MEMBERS];
    for (m, &p) in ports.iter().enumerate() {
        let k = fab(|f| f.register(v.as_ptr() as usize, v.len(), access | IBV_ACCESS_LOCAL_WRITE, p));
        keys[m] = (k, k);
    }
    (v, keys)
}

/// `lens` pieces of one registration on each of `ports`, each 64 bytes apart, as
/// `RegBuf::carve` makes them.
pub(crate) fn carve<const N: usize>(lens: [usize; N], access: u32, ports: &[usize]) -> (Vec<Line>, [Part; N]) {
    let mut offs = [0usize; N];
    let mut end = 0;
    for (o, l) in offs.iter_mut().zip(lens) {
        *o = end;
        end = (end + l).next_multiple_of(64);
    }
    let mut v = vec![Line([0; 64]); end.div_ceil(64).max(1)];
    let mut keys = [(0u32, 0u32); MAX_MEMBERS];
    for (m, &p) in ports.iter().enumerate() {
        let k = fab(|f| f.register(v.as_ptr() as usize, v.len() * 64, access | IBV_ACCESS_LOCAL_WRITE, p));
        keys[m] = (k, k);
    }
    let base = v.as_mut_ptr() as *mut u8;
    // SAFETY: each piece is inside the vector, whose heap memory stays put (and registered) for
    // as long as the comm that owns the vector lives.
    let parts = std::array::from_fn(|i| unsafe { Part::from_raw(base.add(offs[i]), lens[i], keys) });
    (v, parts)
}

pub(crate) fn rkeys(p: &Part, members: usize) -> [u32; MAX_MEMBERS] {
    std::array::from_fn(|m| if m < members { p.rkey_on(m) } else { 0 })
}

pub(crate) struct Pair {
    pub(crate) send: Option<VerbsSend<SimNic>>,
    pub(crate) recv: Option<VerbsRecv<SimNic>>,
    /// The queue pairs of each side, and each side's ports (fabric indices and the shells' own).
    pub(crate) sqps: Vec<usize>,
    pub(crate) rqps: Vec<usize>,
    pub(crate) sports: Vec<usize>,
    pub(crate) rports: Vec<usize>,
    pub(crate) sp: &'static [&'static SimPort],
    pub(crate) rp: &'static [&'static SimPort],
}

pub(crate) fn ports(n: usize, side: &str, ar: bool, loc_op_err: bool) -> (Vec<usize>, &'static [&'static SimPort]) {
    let idx: Vec<usize> = (0..n).map(|_| fab(|f| f.new_port(ar, loc_op_err))).collect();
    let ps: Vec<&'static SimPort> = idx.iter().map(|&i| &*Box::leak(Box::new(SimPort { name: format!("sim{side}{i}"), idx: i }))).collect();
    (idx, Box::leak(ps.into_boxed_slice()))
}

pub(crate) fn pair(p: &Plan) -> Pair {
    let loc_op_err = matches!(p.fault, Fault::Port { loc_op_err: true, .. });
    let (sports, sp) = ports(p.ls, "s", p.ar, loc_op_err);
    let (rports, rp) = ports(p.lr, "r", p.ar, loc_op_err);
    let depths = p.depths;
    let set = Settings {
        depths,
        failover: p.failover,
        recovery: p.recovery,
        recovery_delay_ms: p.recovery_delay_ms,
        recovery_attempts: 3,
        return_async_events: true,
        ar_threshold: p.ar_threshold,
        flush_disable: !p.flush || p.flush_untold,
        stats: false,
        origin: p.origin,
        // net_ib's defaults.
        mqp_retry: MqpRetry { all: false, count: 34, sleep_ms: 100 },
    };
    let on = |m: usize, members: usize| (0..p.nqps).filter(|&q| q % members == m).count() as u32;
    let scqs: Vec<usize> = (0..p.ls).map(|m| fab(|f| f.new_cq(depths.send_cq(on(m, p.ls)) as usize))).collect();
    let rcqs: Vec<usize> = (0..p.lr).map(|m| fab(|f| f.new_cq(depths.recv_cq(on(m, p.lr)) as usize))).collect();
    let sqps: Vec<usize> = (0..p.nqps).map(|q| fab(|f| f.new_qp(scqs[q % p.ls], sports[q % p.ls], depths.send_sq as usize, 0))).collect();
    let rqps: Vec<usize> =
        (0..p.nqps).map(|q| fab(|f| f.new_qp(rcqs[q % p.lr], rports[q % p.lr], depths.recv_sq as usize, depths.recv_rq as usize))).collect();
    fab(|f| {
        for (&s, &r) in sqps.iter().zip(&rqps) {
            f.qps[s].peer = Some(r);
            f.qps[r].peer = Some(s);
            // Setup posts the receives before the sender learns the QPNs.
            for _ in 0..depths.recvs_posted() {
                f.qps[r].rq.push_back(conn::RECV_WR_ID);
            }
        }
    });
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    let peer: std::net::SocketAddr = "10.0.0.2:4000".parse().unwrap();
    let qpn = |qs: &[usize]| -> Vec<u32> { qs.iter().map(|q| fab(|f| f.qps[*q].qpn)).collect() };
    // The sender's memory: what the receiver writes, and what only its own work requests read.
    let (mut s_remote, [fifo]) = carve([fifo_bytes(p.lr) + 64], IBV_ACCESS_REMOTE_WRITE, &sports);
    // The FIFO as a connection that started at `origin.cts` has it: every entry last written a
    // lap before (a fresh connection's zeros are that, for origin 0).
    if p.origin.cts != 0 {
        let stride = cts_stride(p.lr);
        let bytes = s_remote.as_mut_ptr() as *mut u8;
        for slot in 0..FIFO_DEPTH {
            let k = FIFO_DEPTH as u64;
            let idx = p.origin.cts + (slot as u64 + k - p.origin.cts % k) % k;
            let stale = ((idx + 1) as u32).wrapping_sub(FIFO_DEPTH as u32);
            for e in 0..MAX_GROUP {
                let at = (slot * MAX_GROUP + e) * stride + stride - 4;
                // SAFETY: inside the FIFO piece (FIFO_DEPTH * MAX_GROUP entries of `stride`
                // bytes at the start of the vector), nothing reads it yet.
                unsafe { (bytes.add(at) as *mut u32).write_unaligned(stale) };
            }
        }
    }
    let (s_local, [sizes_out, hdrs]) = carve([FIFO_DEPTH * SIZES_ENTRY, conn::HDRS_BYTES], 0, &sports);
    let (r_remote, [ring, sizes_in]) =
        carve([conn::RING_SLOTS * conn::slot_bytes(p.eager_max), FIFO_DEPTH * SIZES_ENTRY], IBV_ACCESS_REMOTE_WRITE, &rports);
    let (r_local, [cts_out, scratch]) = carve([vrecv::cts_stage_bytes(p.lr), 64], 0, &rports);
    // What setup learns of each queue pair's far end (recovery reconnects to it).
    let links = |peers: &[usize]| -> Vec<Link> {
        peers
            .iter()
            .map(|q| Link {
                remote: RemoteQp { qpn: fab(|f| f.qps[*q].qpn), lid: 0, gid: [0; 16], mtu: 5, global: true },
                params: PathParams { mtu: 5, tc: 0, sl: 0, timeout: 20, retry_cnt: 7, rnr_retry: 7 },
                access: IBV_ACCESS_REMOTE_WRITE,
                pkey_index: 0,
                ece: None,
            })
            .collect()
    };
    // A member down before the comm is made: its port down (shown, one PORT_ERR), and the queue
    // pairs setup leaves in INIT on both sides, as both sides' metadata tells them.
    let born = match p.fault {
        Fault::Port { side, member, at: 0, .. } => {
            let (s_down, r_down) = if side == Side::Send { (1u8 << member, 0) } else { (0, 1u8 << member) };
            let port = if side == Side::Send { sports[member] } else { rports[member] };
            let born = fuse::born_down(p.nqps, p.ls, s_down, p.lr, r_down);
            fab(|f| {
                let pt = &mut f.ports[port];
                pt.up = false;
                pt.shown_down = true;
                pt.downs += 1;
                for q in (0..p.nqps).filter(|&q| born & (1 << q) != 0) {
                    f.qps[sqps[q]].state = QpState::Init;
                    f.qps[rqps[q]].state = QpState::Init;
                }
            });
            born
        }
        _ => 0,
    };
    let mut sc = Common::<SimNic>::new(sp, peer, OwnedFd::from(a), &qpn(&sqps), links(&rqps), set);
    let mut rc = Common::<SimNic>::new(rp, peer, OwnedFd::from(b), &qpn(&rqps), links(&sqps), set);
    if born != 0 {
        sc.start_failed(born, "a member down at setup");
        rc.start_failed(born, "a member down at setup");
    }
    let ring_spec = Ring { addr: ring.addr(), rkeys: rkeys(&ring, p.lr), slots: conn::RING_SLOTS, eager_max: p.eager_max };
    let send = VerbsSend::new(
        sc,
        sqps.clone(),
        scqs,
        [s_remote, s_local],
        vsend::Parts { fifo, sizes_out, hdrs },
        (sizes_in.addr(), rkeys(&sizes_in, p.lr)),
        ring_spec,
        p.lr,
        p.nparts,
    );
    let fifo_keys = rkeys(&fifo, p.ls);
    let recv = VerbsRecv::new(rc, rqps.clone(), rcqs, [r_remote, r_local], vrecv::Parts { cts_out, sizes_in, ring, scratch }, p.eager_max, (fifo.addr(), fifo_keys), p.ls, p.nparts);
    Pair { send: Some(send), recv: Some(recv), sqps, rqps, sports, rports, sp, rp }
}

/// The bytes message `id` carries.
pub(crate) fn pattern(id: usize, len: usize) -> impl Iterator<Item = u8> {
    (0..len).map(move |i| (id.wrapping_mul(131) ^ i.wrapping_mul(7) ^ (i >> 8)) as u8 | 1)
}

/// The registration of `v` (GPU memory where `path` is GPUDirect).
pub(crate) fn mr_of(v: &[u8], keys: Keys, ports: &'static [&'static SimPort], path: Path) -> MrInfo {
    MrInfo {
        addr: v.as_ptr() as usize,
        len: v.len(),
        lkeys: keys.map(|k| k.0),
        rkeys: keys.map(|k| k.1),
        members: ports.len() as u8,
        access: IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
        dev: members_id(ports),
        path,
        gpu: (path == Path::Gdr).then_some(0),
    }
}
