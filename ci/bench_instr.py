#!/usr/bin/env python3
"""Instructions per data-path call, for rivet and the peer plugins, in one VM run on the same link.

    python3 ci/bench_instr.py [--iters 300] [--settle-us 2000] [--peers DIR] [--keep]

On Soft-RoCE the "NIC" is kernel work on the same emulated CPUs, and every instruction a plugin
runs on the way from `isend` to the peer's `test` that finds the message is on the latency's
critical path. Time is too noisy in an emulator to compare that work call by call; instruction
counts are not: callgrind counts the same instructions for the same binary and inputs whatever
else the host does. This runs `rivet perf --sizes 8 --lat-iters ITERS --lat-settle US` (the
8-byte ping-pong; each waiter sleeps US microseconds before it first tests, so that its first
test finds the message) under callgrind in the Soft-RoCE VM (ci/vm/guest/instr.sh; valgrind is
copied in from this host), through rivet and through the peers of --peers DIR (as
ci/bench_comms.py), and prints per plugin and rank the instructions per call of the harness's
`isend`, `irecv` and `test` calls (a `test` that finds the message, one that finds nothing, one on
a send), and for rivet the same per layer. Counts are user space only: the kernel's share (the
doorbell system call and, on Soft-RoCE, the packet's whole journey) is not in them.
"""
import argparse, os, re, shutil, subprocess, sys
from benchlib import make_share
from bench_comms import copy_peers, peer_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The harness's calls into a plugin (any plugin), and rivet's layers under them.
HARNESS = [("isend", "rivet::net::Net::isend"), ("irecv", "rivet::net::Net::irecv"), ("test", "rivet::net::Net::test")]
LAYERS = [
    "nccl_net_rivet::abi::common::isend_p", "nccl_net_rivet::plugin::isend",
    "<nccl_net_rivet::gpu::staging::Staged as nccl_net_rivet::transport::Conn>::isend",
    "<nccl_net_rivet::transport::verbs::send::VerbsSend as nccl_net_rivet::transport::Conn>::isend_partial",
    "nccl_net_rivet::transport::verbs::send::VerbsSend::post_eager",
    "nccl_net_rivet::abi::common::irecv_p", "nccl_net_rivet::plugin::irecv",
    "<nccl_net_rivet::transport::verbs::recv::VerbsRecv as nccl_net_rivet::transport::Conn>::irecv",
    "nccl_net_rivet::abi::common::test", "nccl_net_rivet::plugin::test",
    "<nccl_net_rivet::gpu::staging::Staged as nccl_net_rivet::transport::Conn>::test",
    "<nccl_net_rivet::transport::verbs::recv::VerbsRecv as nccl_net_rivet::transport::Conn>::test",
    "<nccl_net_rivet::transport::verbs::send::VerbsSend as nccl_net_rivet::transport::Conn>::test",
    "nccl_net_rivet::transport::verbs::recv::VerbsRecv::progress",
    "nccl_net_rivet::transport::verbs::conn::Common::poll",
    "nccl_net_rivet::transport::verbs::recv::VerbsRecv::drain_ring",
    "nccl_net_rivet::transport::verbs::recv::VerbsRecv::idle",
]


def callers(path):
    """{function: (inclusive instructions, {caller: (calls, instructions)})} of one callgrind file."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--tree=caller", "--threshold=100", path],
                         capture_output=True, text=True, check=True).stdout
    funcs, pending = {}, {}
    num = lambda s: int(s.replace(",", ""))
    for line in out.splitlines():
        if not line.strip():
            pending = {}
            continue
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+<\s+(?:[^:]*:)?(.*?) \(([\d,]+)x\)", line)
        if m:
            c = pending.setdefault(m[2].strip(), [0, 0])
            c[0] += num(m[3])
            c[1] += num(m[1])
            continue
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+\*\s+(?:[^:]*:)?(.*?)(?: \[.*\])?\s*$", line)
        if m:
            name = m[2].strip()
            total, calls = funcs.get(name, (0, {}))
            for k, (n, cost) in pending.items():
                a = calls.setdefault(k, [0, 0])
                a[0] += n
                a[1] += cost
            funcs[name] = (total + num(m[1]), calls)
    return funcs


def per_call(funcs, name, caller=None):
    """(calls, instructions per call) of `name`, from every caller or from those matching `caller`."""
    if name not in funcs:
        return 0, None
    _, calls = funcs[name]
    sel = [(n, c) for k, (n, c) in calls.items() if caller is None or caller in k]
    n = sum(x for x, _ in sel)
    return n, (sum(c for _, c in sel) / n if n else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--settle-us", type=int, default=2000)
    ap.add_argument("--peers", help="directory with the built peer plugins (../shared/peers/build.sh's out/)")
    a = ap.parse_args()
    if not shutil.which("valgrind.bin") and not os.path.exists("/usr/bin/valgrind.bin"):
        sys.exit("bench_instr: needs valgrind on this host (apt-get install valgrind)")
    subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    share = make_share("instr", "instr.sh")
    peers = peer_dir(a.peers)
    if peers:
        print(f"# peers from {peers}: {', '.join(copy_peers(peers, os.path.join(share, 'peers')))}", flush=True)
    shutil.copytree("/usr/libexec/valgrind", os.path.join(share, "vg"))
    shutil.copy("/usr/bin/valgrind.bin", os.path.join(share, "vg", "valgrind"))
    out = subprocess.run([os.path.join(ROOT, "ci/vm/run-vm.sh"), "--share", share, "--mtu", "9000", "--timeout", "3600",
                          "/mnt/host/instr.sh", str(a.iters), str(a.settle_us)], cwd=ROOT, capture_output=True, text=True)
    log = out.stdout + out.stderr
    with open(os.path.join(ROOT, "target", "vm", "instr.log"), "w") as f:
        f.write(log)
    for line in log.splitlines():
        if line.startswith(("OK ", "FAIL ")):
            print("#", line)
    if out.returncode not in (0, 1):
        sys.exit(f"the VM run failed (exit {out.returncode}): see target/vm/instr.log")
    cg = os.path.join(share, "cg")
    print(f"# user-space instructions per call (callgrind), 8-byte ping-pong, {a.iters} round trips after 100 of warm-up, "
          f"each waiter asleep {a.settle_us} us before its first test")
    print(f"{'plugin':<8} {'rank':>4} {'isend':>7} {'irecv':>7} {'test (wait)':>11} {'tests/wait':>10} {'test (send)':>11} {'isend+test':>10}")
    layers = {}
    for f in sorted(os.listdir(cg)):
        plugin = f.split(".")[0]
        path = os.path.join(cg, f)
        with open(path, errors="replace") as fh:
            head = fh.read(4096)
        m = re.search(r"^cmd: .*__peer (\d+) ", head, re.M)
        if not m:
            continue  # the launcher
        rank = int(m[1])
        funcs = callers(path)
        _, isend = per_call(funcs, HARNESS[0][1])
        _, irecv = per_call(funcs, HARNESS[1][1])
        # A settled wait's first test finds the message: at 1.00 tests per wait, the column is
        # what a test that finds one costs.
        nw, waited = per_call(funcs, HARNESS[2][1], "wait_timed")
        _, sent = per_call(funcs, HARNESS[2][1], "wait_all")
        tw = funcs.get("rivet::perf::wait_timed")
        nwaits = sum(n for n, _ in tw[1].values()) if tw else 0
        fmt = lambda v, w=7: f"{v:{w}.0f}" if v is not None else " " * (w - 1) + "-"
        crit = isend + waited if isend is not None and waited is not None else None
        print(f"{plugin:<8} {rank:>4} {fmt(isend)} {fmt(irecv)} {fmt(waited, 11)} {nw / max(nwaits, 1):10.2f} {fmt(sent, 11)} {fmt(crit, 10)}")
        if plugin == "rivet":
            for name in LAYERS:
                n, v = per_call(funcs, name)
                if v is not None:
                    layers.setdefault(name, []).append((rank, n, v))
    if layers:
        print("# rivet by layer: calls and instructions per call (inclusive), per rank")
        for name, rows in layers.items():
            print(f"  {' '.join(f'r{r}: {n:>6}x {v:6.0f}' for r, n, v in sorted(rows))}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
