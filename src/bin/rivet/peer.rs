//! Local multi-process runs: the launcher starts N copies of this executable ("peers"), swaps
//! their listen handles so that each connects to the next rank (a ring), forwards rank 0's output
//! and gathers every rank's error count. Every wait is bounded.

use crate::net::{hex, unhex, Net, Res};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Run `n` local peers of this executable, each given the launcher's own subcommand line `argv`
/// and the library `lib` it resolved; returns the total #wrong reported by the peers.
pub fn launch(n: usize, lib: &std::path::Path, argv: &[String], env: &[(&str, String)], timeout: Duration) -> Res<u64> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let (tx, rx) = mpsc::channel::<(usize, Option<String>)>();
    let mut kids: Vec<Child> = Vec::new();
    let kill_all = |kids: &mut Vec<Child>| {
        for k in kids.iter_mut() {
            let _ = k.kill();
            let _ = k.wait();
        }
    };
    for r in 0..n {
        let mut c = Command::new(&exe);
        c.arg("__peer").arg(r.to_string()).arg(n.to_string()).arg(lib).arg("--").args(argv);
        c.envs(env.iter().map(|(k, v)| (k, v)));
        c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = c.spawn().map_err(|e| format!("spawn {}: {e}", exe.display()))?;
        let out = child.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                match line {
                    Ok(l) => {
                        if tx.send((r, Some(l))).is_err() {
                            return;
                        }
                    }
                    Err(_) => break,
                }
            }
            let _ = tx.send((r, None));
        });
        kids.push(child);
    }
    let deadline = Instant::now() + timeout;
    let mut handles: Vec<Option<String>> = vec![None; n];
    let mut ranks: Vec<Option<String>> = vec![None; n];
    let mut barrier = 0;
    let mut sent_peers = false;
    let mut finished = 0;
    let mut wrong = 0u64;
    let mut failed: Vec<String> = Vec::new();
    // Once a rank fails, the others get a grace period to finish or fail on their own (each with
    // its own error, which says what that side saw), then they are killed.
    let grace = Duration::from_secs(nccl_net_rivet::config::get().timeout_secs * 2 + 5);
    let mut deadline = deadline;
    while finished < n {
        let left = deadline.saturating_duration_since(Instant::now());
        let msg = match rx.recv_timeout(left) {
            Ok(m) => m,
            Err(_) => {
                if failed.is_empty() {
                    failed.push(format!("timed out after {}s", timeout.as_secs()));
                } else {
                    failed.push(format!("the other rank(s) did not end within {}s of that, and were killed", grace.as_secs()));
                }
                break;
            }
        };
        match msg {
            (r, Some(line)) => {
                if let Some(h) = line.strip_prefix("HANDLE ") {
                    handles[r] = Some(h.to_string());
                    if !sent_peers && handles.iter().all(|h| h.is_some()) {
                        sent_peers = true;
                        for d in ranks.iter().flatten() {
                            println!("{d}");
                        }
                        for (i, k) in kids.iter_mut().enumerate() {
                            let next = handles[(i + 1) % n].as_ref().unwrap();
                            let stdin = k.stdin.as_mut().unwrap();
                            writeln!(stdin, "PEER {next}").map_err(|e| e.to_string())?;
                        }
                    }
                } else if line == "BARRIER" {
                    barrier += 1;
                    if barrier == n {
                        barrier = 0;
                        for k in kids.iter_mut() {
                            let stdin = k.stdin.as_mut().unwrap();
                            writeln!(stdin, "GO").map_err(|e| e.to_string())?;
                        }
                    }
                } else if let Some(d) = line.strip_prefix("RANK ") {
                    ranks[r] = Some(d.to_string());
                } else if let Some(o) = line.strip_prefix("OUT ") {
                    println!("{o}");
                } else if let Some(w) = line.strip_prefix("DONE wrong=") {
                    wrong += w.trim().parse::<u64>().unwrap_or(1);
                }
            }
            (r, None) => {
                finished += 1;
                let st = kids[r].wait().map_err(|e| e.to_string())?;
                if !st.success() {
                    if failed.is_empty() {
                        deadline = deadline.min(Instant::now() + grace);
                    }
                    failed.push(format!("rank {r} failed ({st})"));
                }
            }
        }
    }
    if !failed.is_empty() {
        kill_all(&mut kids);
        return Err(failed.join("; "));
    }
    for k in kids.iter_mut() {
        let _ = k.wait();
    }
    Ok(wrong)
}

/// The peer side: load the plugin, join the ring, and hand the connected comms to `body`.
pub struct Ring {
    pub net: Net,
    pub rank: usize,
    pub nranks: usize,
    /// Every pair: the i-th send comm goes to the next rank's i-th receive comm.
    pub sends: Vec<*mut std::ffi::c_void>,
    pub recvs: Vec<*mut std::ffi::c_void>,
    /// From the first connect to the last pair connected (the listens are then closed, as NCCL
    /// closes a listening comm once it has accepted).
    pub setup: Duration,
    closed: bool,
    /// The device this rank uses.
    pub dev: i32,
    /// The transport the plugin chose ("TCP" or "RDMA verbs"), from the listen handle.
    pub transport: &'static str,
    /// Give the CPU away while waiting: with more ranks than cores (the peer this rank waits for
    /// needs it), and over TCP, whose bytes move in the kernel on the peer's system calls. Over
    /// RDMA with a core per rank, yielding only adds system calls to the polling loop (measured:
    /// higher ping-pong latency on Soft-RoCE).
    yield_when_idle: bool,
}

impl Ring {
    /// Join as `rank`, using device `devs[rank % devs.len()]`. With `describe`, the rank first
    /// sends the launcher its line for nccl-tests' `# Using devices` list, which the launcher
    /// prints in rank order once every rank has joined.
    pub fn join(lib: &std::path::Path, rank: usize, nranks: usize, devs: &[Vec<i32>], describe: bool) -> Res<Ring> {
        Self::join_with(Net::load(lib)?, rank, nranks, devs, describe, 1, false, Duration::ZERO)
    }

    /// As [`Ring::join`], with the plugin already loaded (and initialized), and `comms` pairs of
    /// comms (each its own listen, connect and accept, as NCCL makes one per peer and channel).
    /// `warm`: one more pair is connected first, untimed, and closed again (the process's first
    /// connection, with what the plugin pays once per process), then the `comms` pairs are
    /// connected and timed. `connect_after`: between the handles' exchange and the first connect,
    /// the rank says so (`# rank R listening, connecting in S s`) and waits that long.
    #[allow(clippy::too_many_arguments)]
    pub fn join_with(
        net: Net,
        rank: usize,
        nranks: usize,
        devs: &[Vec<i32>],
        describe: bool,
        comms: usize,
        warm: bool,
        connect_after: Duration,
    ) -> Res<Ring> {
        let ndev = net.ndev()?;
        let spec = devs.get(rank % devs.len().max(1)).cloned().unwrap_or_else(|| vec![0]);
        if let Some(&d) = spec.iter().find(|&&d| d >= ndev) {
            return Err(format!("device {d} does not exist: the plugin reports {ndev} device(s) (see `rivet info`)"));
        }
        // Several: a virtual NIC of them, made as NCCL makes one (once, before any comm).
        let dev = if let [d] = spec[..] { d } else { net.make_vdevice(&spec).map_err(|e| format!("fusing devices {spec:?}: {e}"))? };
        let first = usize::from(warm);
        let mut handles = Vec::with_capacity(comms + first);
        let mut lcs = Vec::with_capacity(comms + first);
        let close_listens = |net: &Net, lcs: &[*mut std::ffi::c_void]| lcs.iter().for_each(|&lc| net.close_listen(lc));
        for _ in 0..comms.max(1) + first {
            match net.listen(dev) {
                Ok((h, lc)) => {
                    handles.push(h);
                    lcs.push(lc);
                }
                Err(e) => {
                    close_listens(&net, &lcs);
                    return Err(format!("listen #{}: {e}", lcs.len() + 1));
                }
            }
        }
        let h = handles[0];
        // rivet's handle says which transport it chose; another plugin's handle is its own.
        let transport = match nccl_net_rivet::proto::Handle::decode(&h).map(|h| h.transport) {
            Ok(nccl_net_rivet::proto::TRANSPORT_VERBS) => "RDMA verbs",
            Ok(_) => "TCP",
            Err(_) => "the plugin's transport",
        };
        // Handles out, the next rank's in; on any failure the listens are closed again.
        let exchange = || -> Res<Vec<[u8; 128]>> {
            if describe {
                let p = net.props(dev)?;
                let pci = p.pci_path.clone();
                // nccl-tests prints the GPU's PCI bus number; here it is the NIC's, from its PCI path.
                let bus = pci
                    .rsplit('/')
                    .next()
                    .and_then(|a| a.split(':').nth(1))
                    .and_then(|b| u8::from_str_radix(b, 16).ok())
                    .map_or("[----]".to_string(), |b| format!("[0x{b:02x}]"));
                println!(
                    "RANK #  Rank {rank:2} Group {:2} Pid {:6} on {:>10} device {dev:2} {bus} {} ({transport})",
                    0,
                    std::process::id(),
                    nccl_net_rivet::log::hostname(),
                    p.name.clone()
                );
            }
            // One line carries every handle, comma-separated; the launcher passes it on unread.
            println!("HANDLE {}", handles.iter().map(|h| hex(h)).collect::<Vec<_>>().join(","));
            std::io::stdout().flush().map_err(|e| e.to_string())?;
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).map_err(|e| e.to_string())?;
            let peer = line.strip_prefix("PEER ").ok_or("launcher protocol error")?;
            let peers = peer.split(',').map(unhex).collect::<Res<Vec<_>>>()?;
            if peers.len() != lcs.len() {
                return Err(format!("the next rank listens {} time(s), this one {}", peers.len(), lcs.len()));
            }
            Ok(peers)
        };
        let mut peers = match exchange() {
            Ok(p) => p,
            Err(e) => {
                close_listens(&net, &lcs);
                return Err(e);
            }
        };
        if !connect_after.is_zero() {
            println!("OUT # rank {rank} listening, connecting in {} s", connect_after.as_secs());
            std::io::stdout().flush().map_err(|e| e.to_string())?;
            std::thread::sleep(connect_after);
        }
        if warm {
            // The warm-up pair: connected alone, untimed, and closed.
            match net.connect_accept(dev, &mut peers[..1], &lcs[..1]) {
                Ok(pairs) => pairs.into_iter().for_each(|(sc, rc)| {
                    net.close_send(sc);
                    net.close_recv(rc);
                }),
                Err(e) => {
                    close_listens(&net, &lcs);
                    return Err(format!("the untimed first connection (--warm): {e}"));
                }
            }
        }
        let t0 = Instant::now();
        let pairs = net.connect_accept(dev, &mut peers[first..], &lcs[first..]);
        let setup = t0.elapsed();
        close_listens(&net, &lcs);
        let pairs = pairs?;
        let (sends, recvs): (Vec<_>, Vec<_>) = pairs.into_iter().unzip();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let yield_when_idle = nranks > cores || transport == "TCP";
        Ok(Ring { net, rank, nranks, sends, recvs, setup, closed: false, dev, transport, yield_when_idle })
    }

    /// The first send comm (most modes use one pair).
    pub fn send(&self) -> *mut std::ffi::c_void {
        self.sends[0]
    }

    /// The first receive comm.
    pub fn recv(&self) -> *mut std::ffi::c_void {
        self.recvs[0]
    }

    pub fn out(&self, s: &str) {
        if self.rank == 0 {
            println!("OUT {s}");
        }
    }

    /// Wait until every rank has called this (the launcher answers when all have): so that no
    /// rank closes its comms while another still has requests in flight on them.
    pub fn barrier(&self) -> Res<()> {
        println!("BARRIER");
        std::io::stdout().flush().map_err(|e| e.to_string())?;
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map_err(|e| e.to_string())?;
        if line.trim() != "GO" {
            return Err("launcher protocol error at the barrier".into());
        }
        Ok(())
    }

    /// A line the launcher prints whichever rank says it.
    pub fn out_any(&self, s: &str) {
        println!("OUT {s}");
    }

    /// Close the comms (once; drop does it otherwise), keeping the plugin loaded.
    pub fn close(&mut self) {
        if !self.closed {
            self.closed = true;
            self.sends.iter().for_each(|&c| self.net.close_send(c));
            self.recvs.iter().for_each(|&c| self.net.close_recv(c));
        }
    }

    /// Test every request until all are done.
    // Not inlined: ci/bench_instr.py finds the sender's tests by this caller.
    #[inline(never)]
    pub fn wait_all(&self, reqs: &[*mut std::ffi::c_void]) -> Res<()> {
        let mut done = vec![false; reqs.len()];
        // Set at the first long idle stretch: a clock read can be a system call (see the
        // plugin's sys::clock), and most waits end long before.
        let mut deadline = None;
        let mut idle = 0u32;
        while done.iter().any(|d| !d) {
            idle += 1;
            for (i, r) in reqs.iter().enumerate() {
                if !done[i] && self.net.test(*r)?.is_some() {
                    done[i] = true;
                    idle = 0;
                }
            }
            if self.yield_when_idle && idle > 64 {
                std::thread::yield_now();
            }
            if idle % 1024 == 1023 && Instant::now() > *deadline.get_or_insert_with(|| Instant::now() + self.net.timeout) {
                return Err("transfer did not complete within the timeout".into());
            }
        }
        Ok(())
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.close();
    }
}
