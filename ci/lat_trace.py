#!/usr/bin/env python3
"""Where the 8-byte round trip goes, step by step, on both ranks (Soft-RoCE VM).

    python3 ci/lat_trace.py [--rounds 3] [--iters 1000] [--peers DIR] [--hog [NICE]]
    python3 ci/lat_trace.py --dir DIR        # analyse one trace (rank0.csv, rank1.csv) only

Runs ci/vm/guest/trace.sh: per round, ib_write_lat (the reference; the receiver polls memory),
ib_send_lat (the receiver polls a CQ, as with a write with immediate) and `rivet perf --sizes 8` with
RIVET_PERF_TRACE set, through rivet and through NCCL's IB transport (nccl-rdma-sharp-plugins, when
--peers DIR or /tmp/rivet-peers/out has it, as ci/bench_comms.py). Each rank writes the cycle
counts of each round trip's steps; both ranks run on one host, so their counts line up, and this
prints, per plugin, the median over the rounds of each step's p50 and p90 in microseconds:

  isend (initiator)     rank 0's isend call (on Soft-RoCE the doorbell system call does the
                        packet's whole journey through rxe and the veth, and the ACK's)
  there                 rank 0's isend start to rank 1's test that finds the message (start)
  found (responder)     that test
  turnaround            rank 1's found test end to its answer's isend start (the harness)
  back                  rank 1's isend start to rank 0's test that finds the answer (start)
  found (initiator)     that test
  initiator waits after isend   rank 0's isend end to that test's start
  round trip            rank 0's isend start to its found test's end

and the same steps' means over the slowest 2% of round trips against all of them: where the
tail's time goes. --hog runs one busy loop per guest vCPU (nice 19, or NICE) throughout.
"""
import argparse, math, os, statistics, subprocess, sys
from benchlib import make_share
from bench_comms import copy_peers, peer_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(path):
    with open(path) as f:
        head = f.readline().split()
        meta = dict(zip(head[1::2], head[2::2]))
        cols = f.readline().strip().split(",")
        rows = [dict(zip(cols, map(int, l.split(",")))) for l in f if l.strip()]
    return float(meta["us_per_cycle"]), int(meta["warmup"]), rows


def steps(d):
    """{step: [microseconds per round trip]} of one trace directory."""
    us, warm, r0 = load(os.path.join(d, "rank0.csv"))
    _, _, r1 = load(os.path.join(d, "rank1.csv"))
    out = {}
    for i in range(warm, min(len(r0), len(r1))):
        a, b = r0[i], r1[i]
        for k, v in [("isend (initiator)", a["isend_end"] - a["isend_start"]),
                     ("there", b["found_start"] - a["isend_start"]),
                     ("found (responder)", b["found_end"] - b["found_start"]),
                     ("turnaround", b["isend_start"] - b["found_end"]),
                     ("isend (responder)", b["isend_end"] - b["isend_start"]),
                     ("back", a["found_start"] - b["isend_start"]),
                     ("found (initiator)", a["found_end"] - a["found_start"]),
                     ("initiator waits after isend", a["found_start"] - a["isend_end"]),
                     ("round trip", a["found_end"] - a["isend_start"])]:
            out.setdefault(k, []).append(v * us)
    return out


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--peers", help="directory with the built peer plugins (../shared/peers/build.sh's out/)")
    ap.add_argument("--dir", help="analyse this trace directory only (no VM run)")
    ap.add_argument("--hog", nargs="?", type=int, const=19, metavar="NICE",
                    help="one busy loop per guest vCPU for the whole run, at this niceness (default 19)")
    a = ap.parse_args()
    runs = {}
    if a.dir:
        runs["trace"] = [a.dir]
    else:
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
        share = make_share("trace", "trace.sh")
        peers = peer_dir(a.peers)
        if peers:
            copy_peers(peers, os.path.join(share, "peers"))
        out = subprocess.run([os.path.join(ROOT, "ci/vm/run-vm.sh"), "--share", share, "--mtu", "9000", "--timeout", "3600",
                              "/mnt/host/trace.sh", str(a.rounds), str(a.iters)] + ([f"hog:{a.hog}"] if a.hog is not None else []), cwd=ROOT, capture_output=True, text=True)
        log = out.stdout + out.stderr
        with open(os.path.join(ROOT, "target", "vm", "trace.log"), "w") as f:
            f.write(log)
        if out.returncode != 0:
            sys.exit(f"the VM run failed (exit {out.returncode}): see target/vm/trace.log")
        for tool in ("write_lat", "send_lat"):
            # perftest prints inf when its cycle counter misreads a round: left out.
            pt = [v for l in log.splitlines() if l.startswith(f"PERFTEST {tool} ")
                  for v in [float(l.split("typical=")[1].split()[0])] if math.isfinite(v)]
            if pt:
                print(f"# ib_{tool} 8 B one way, typical: median {statistics.median(pt):.1f} us (rounds: {', '.join(f'{x:.1f}' for x in pt)});"
                      f" its round trip {2 * statistics.median(pt):.1f} us")
        tdir = os.path.join(share, "trace")
        for d in sorted(os.listdir(tdir)):
            if os.path.exists(os.path.join(tdir, d, "rank1.csv")):
                runs.setdefault(d.rsplit(".", 1)[0], []).append(os.path.join(tdir, d))
    for plugin, dirs in runs.items():
        per = [steps(d) for d in dirs]
        print(f"# {plugin}: microseconds per round trip, median over {len(per)} round(s) of each step's p50, p90, mean, and mean over the round's slowest 2%")
        # The slowest 2% of round trips of each round, and each step's mean over them.
        slow = []
        for s in per:
            cut = pct(s["round trip"], 0.98)
            slow.append([i for i, v in enumerate(s["round trip"]) if v >= cut])
        print(f"  {'step':<30} {'p50':>8} {'p90':>8} {'mean':>8} {'slowest 2%: mean':>17}")
        for k in per[0]:
            p50 = statistics.median(pct(s[k], 0.5) for s in per)
            p90 = statistics.median(pct(s[k], 0.9) for s in per)
            mean = statistics.median(statistics.mean(s[k]) for s in per)
            tail = statistics.median(statistics.mean(s[k][i] for i in idx) for s, idx in zip(per, slow))
            print(f"  {k:<30} {p50:8.1f} {p90:8.1f} {mean:8.1f} {tail:17.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
