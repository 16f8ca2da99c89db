#!/usr/bin/env python3
"""What each connection costs, for rivet and the peer plugins, in one run on the same link.

    python3 ci/bench_comms.py [--rounds 3] [--comms 1,16,256,1024] [--bytes 256M] [--lat-iters 1000]
                              [--peers DIR] [--base LIB] [--hog [NICE]] [--warm] [--fixed] [--tcp]

Runs `rivet perf --comms LIST --sizes 1M` (two processes, N send/receive comm pairs between
them, each N in fresh processes; see README.md) through rivet and through the peer plugins that
--peers DIR holds (default $PEERS_DIR/out, else /tmp/rivet-peers/out; ../shared/peers/build.sh
builds them): libnccl-net-rdma-sharp.so (NCCL's IB transport) and libnccl-net-ofi.so
(aws-ofi-nccl, with ofi-shim/); and, if the directory has it, libnccl-net-rdma-sharp-32.so, the
same plugin built with NCCL_NET_MAX_REQUESTS 32 (NCCL 2.19+'s value; its include/net.h says 8, the
2.18 one), which sizes its FIFOs as NCCL's own IB transport does today (docs/benchmarks.md says
how to build it), run as nccl-ib-32. Over verbs (the default) the runs happen in the Soft-RoCE VM
(ci/vm/run-vm.sh, MTU 9000; rank 0 on rxe0, rank 1 on rxe1), the libraries the peers link copied
in from this host. With --tcp they happen here on loopback: rivet's TCP transport and
aws-ofi-nccl over libfabric's tcp provider (NCCL's IB transport needs an RDMA device).
Prints, per plugin and N, the median over the rounds of every column; `--hog` adds one busy loop
per guest vCPU (the tail under contention); `--warm` passes `rivet perf --warm` (each process
connects one pair, untimed, before the timed ones: the setup column without what a process pays
at its first connection); `--fixed` turns address-space randomization off in the guest and runs
each plugin once, untimed, before the rounds (the emulator translates a new process's code on
its first run unless it sits where the last one's did: the first connection without that cost,
which hardware does not have). `--base LIB` adds another rivet build (e.g. the last commit's
libnccl_net_rivet.so, copied aside before building this one) as plugin rivet-base, taking turns
with the others in the same run: a change measured against what it changes. All rows:
target/vm/comms.log (or target/comms-tcp.log).
"""
import argparse, os, re, shutil, statistics, subprocess, sys
from benchlib import make_share

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLS = ["setup ms", "us/pair", "RSS KiB", "pin KiB", "MRs", "MR KiB", "QPs", "CQEs", "fds", "thr",
        "RSS aft", "pin aft", "p50 us", "p99 us", "GB/s@1M"]
# Present in the guest image (or glibc's own): never shadowed by a copy from the host.
GUEST_HAS = ("libc.so", "libm.so", "libpthread.so", "libdl.so", "librt.so", "ld-linux", "libgcc_s.so",
             "libibverbs.so", "librdmacm.so", "linux-vdso")


def peer_dir(arg):
    d = arg or (os.path.join(os.environ["PEERS_DIR"], "out") if os.environ.get("PEERS_DIR") else "/tmp/rivet-peers/out")
    return d if os.path.isdir(d) else None


def copy_peers(src, dst):
    """The peers and every library they link that the guest lacks."""
    os.makedirs(os.path.join(dst, "lib"))
    libs = []
    for so in ("libnccl-net-rdma-sharp.so", "libnccl-net-rdma-sharp-32.so", "libnccl-net-ofi.so"):
        p = os.path.join(src, so)
        if os.path.exists(p):
            shutil.copy(p, dst)
            libs.append(p)
    if os.path.isdir(os.path.join(src, "ofi-shim")):
        shutil.copytree(os.path.join(src, "ofi-shim"), os.path.join(dst, "ofi-shim"))
    for p in libs:
        out = subprocess.run(["ldd", p], capture_output=True, text=True, check=True).stdout
        for m in re.finditer(r"^\s*(\S+) => (/\S+)", out, re.M):
            if not m[1].startswith(GUEST_HAS):
                shutil.copy(m[2], os.path.join(dst, "lib", m[1]))
    return [os.path.basename(p) for p in libs]


def parse(log):
    """{plugin: {N: [row, ...]}} and the failures, from the prefixed `perf --comms` output."""
    rows, failed, headers = {}, [], {}
    for line in log.splitlines():
        m = re.match(r"(\S+) +(\d+)((?: +(?:[-\d.]+))+)\s*$", line)
        if m and len(m[3].split()) == len(COLS):
            vals = [None if v == "-" else float(v) for v in m[3].split()]
            rows.setdefault(m[1], {}).setdefault(int(m[2]), []).append(vals)
        m = re.match(r"(\S+) # (\d+) comms: FAILED: (.*)", line)
        if m:
            failed.append(f"{m[1]}, {m[2]} comms: {m[3]}")
        m = re.match(r"(\S+) # rivet perf --comms: (.*)", line)
        if m:
            headers[m[1]] = m[2]
    return rows, failed, headers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--comms", default="1,16,256,1024")
    ap.add_argument("--bytes", default="256M", help="bytes per bandwidth run (at least one 1 MiB message per comm)")
    ap.add_argument("--lat-iters", type=int, default=1000)
    ap.add_argument("--peers", help="directory with the built peer plugins (../shared/peers/build.sh's out/)")
    ap.add_argument("--base", metavar="LIB", help="another rivet library, run as rivet-base in the same rounds (verbs only)")
    ap.add_argument("--hog", nargs="?", type=int, const=19, metavar="NICE")
    ap.add_argument("--warm", action="store_true", help="rivet perf --warm: an untimed first pair in each process")
    ap.add_argument("--fixed", action="store_true", help="address-space randomization off in the guest, each plugin run once untimed first (comms.sh says why)")
    ap.add_argument("--tcp", action="store_true", help="loopback TCP on this host instead of verbs in the VM")
    ap.add_argument("--mem", default="4G", help="guest memory")
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    peers = peer_dir(a.peers)
    if a.tcp:
        log = tcp_rounds(a, peers)
        path = os.path.join(ROOT, "target", "comms-tcp.log")
    else:
        log = vm_rounds(a, peers)
        path = os.path.join(ROOT, "target", "vm", "comms.log")
    with open(path, "w") as f:
        f.write(log)
    rows, failed, headers = parse(log)
    med = statistics.median
    where = "loopback TCP on this host" if a.tcp else "Soft-RoCE rxe0 <-> rxe1 (MTU 9000)"
    print(f"# rivet perf --comms {a.comms} --sizes 1M --bytes {a.bytes} --lat-iters {a.lat_iters}, {where}, "
          f"median of {a.rounds} rounds" + (f", one busy loop per vCPU at nice {a.hog}" if a.hog is not None else "")
          + (", after an untimed first pair (--warm)" if a.warm else "")
          + (", fixed addresses after an untimed run per plugin (--fixed)" if a.fixed else "")
          + f" (all rows: {os.path.relpath(path, ROOT)})")
    for p, h in headers.items():
        print(f"# {p}: {h}")
    print("| plugin | comms | " + " | ".join(COLS) + " |")
    print("|---|---:|" + "---:|" * len(COLS))
    for p in rows:
        for n in sorted(rows[p]):
            rs = rows[p][n]
            cells = []
            for i in range(len(COLS)):
                vs = [r[i] for r in rs if r[i] is not None]
                v = med(vs) if vs else None
                cells.append("-" if v is None else (f"{v:.3f}" if COLS[i].startswith("GB/s") else f"{v:.1f}" if abs(v) < 100 else f"{v:.0f}"))
            print(f"| {p} | {n} | " + " | ".join(cells) + (f" ({len(rs)} rounds)" if len(rs) < a.rounds else "") + " |")
    for f in failed:
        print(f"FAILED: {f}")
    if not rows.get("rivet"):
        sys.exit(f"no rows from rivet: see {path}")


def vm_rounds(a, peers):
    share = make_share("comms", "comms.sh")
    if peers:
        print(f"# peers from {peers}: {', '.join(copy_peers(peers, os.path.join(share, 'peers')))}", flush=True)
    if a.base:
        os.makedirs(os.path.join(share, "peers"), exist_ok=True)
        shutil.copy(a.base, os.path.join(share, "peers", "libnccl-net-rivet-base.so"))
        print(f"# rivet-base: {a.base}", flush=True)
    args = ["/mnt/host/comms.sh", str(a.rounds), a.comms, a.bytes, str(a.lat_iters)]
    if a.hog is not None:
        args.append(f"hog:{a.hog}")
    if a.warm:
        args.append("warm")
    if a.fixed:
        args.append("fixed")
    out = subprocess.run([os.path.join(ROOT, "ci/vm/run-vm.sh"), "--share", share, "--mtu", "9000", "--mem", a.mem,
                          "--timeout", "7200"] + args, cwd=ROOT, capture_output=True, text=True)
    log = out.stdout + out.stderr
    if out.returncode != 0:
        with open(os.path.join(ROOT, "target", "vm", "comms.log"), "w") as f:
            f.write(log)
        sys.exit(f"the VM run failed (exit {out.returncode}): see target/vm/comms.log")
    return log


def tcp_rounds(a, peers):
    rivet = os.path.join(ROOT, "target/release/rivet")
    base = ["perf", "--comms", a.comms, "--sizes", "1M", "--bytes", a.bytes, "--lat-iters", str(a.lat_iters)] + (["--warm"] if a.warm else [])
    runs = [("rivet", ["--lib", os.path.join(ROOT, "target/release/libnccl_net_rivet.so")], {"NCCL_SOCKET_IFNAME": "lo"})]
    if peers and os.path.exists(os.path.join(peers, "libnccl-net-ofi.so")):
        runs.append(("ofi", ["--lib", os.path.join(peers, "libnccl-net-ofi.so")],
                     {"NCCL_SOCKET_IFNAME": "lo", "FI_PROVIDER": "tcp", "OFI_NCCL_PROTOCOL": "SENDRECV",
                      "LD_LIBRARY_PATH": os.path.join(peers, "ofi-shim")}))
    hogs = []
    if a.hog is not None:
        hogs = [subprocess.Popen(["nice", "-n", str(a.hog), "sh", "-c", "while :; do :; done"]) for _ in range(os.cpu_count() or 1)]
    log = []
    try:
        for r in range(a.rounds):
            log.append(f"ROUND {r + 1}")
            for name, lib, env in runs[r % len(runs):] + runs[:r % len(runs)]:
                out = subprocess.run([rivet] + base + lib, env=dict(os.environ, **env), capture_output=True, text=True, timeout=3600)
                log += [f"{name} {l}" for l in (out.stdout + out.stderr).splitlines()]
    finally:
        for h in hogs:
            h.kill()
    return "\n".join(log) + "\n"


if __name__ == "__main__":
    main()
