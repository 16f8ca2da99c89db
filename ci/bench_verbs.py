#!/usr/bin/env python3
"""rivet over RDMA verbs against perftest on the same Soft-RoCE link, in one VM run.

    python3 ci/bench_verbs.py [--rounds 5] [--mtu 9000] [--baseline OLD.so | --peer [DIR]] [--only 64K|1M|16M|lat] [--hog [NICE]]

Builds the release plugin and CLI, boots the Soft-RoCE VM (ci/vm/run-vm.sh) with the veth MTU
given (9000: rxe active_mtu 4096) and runs ROUNDS rounds of: ib_write_bw at 64 KiB, 1 MiB and
16 MiB plus ib_write_lat at 8 bytes (rxe0 -> rxe1), then `rivet perf --dev 0,1` (rank 0 on rxe0
sends to rank 1 on rxe1) at the same sizes and its 8-byte one-way ping-pong latency, each rivet
measurement right after the perftest one it is compared with. Prints the
median of each with the ratio rivet / perftest; latency as p50, p90, p99, max and average (each
per round of 1000 pings, then the median over the rounds; perftest reports no p90). `--hog [NICE]` runs
one busy loop per guest vCPU at nice 19 (or NICE) throughout: the latency tail of a host whose CPUs are
taken. Emulation is noisy: quote medians, not one run. The host's load changes within a run by more
than the differences under study, so the latency's p50 is also compared round by round (rivet's
against the ib_write_lat run just before it and the ib_send_lat run just after it, whose receiver
learns of a message from a completion as rivet's does): the median of those ratios is the
steadier number.
`--only lat` measures the latency alone (many short rounds: `--only lat --rounds 15`).
`--baseline` names an earlier build of the plugin (for example one built from an older commit
with `git worktree`): each rivet measurement is then repeated through it, interleaved in the same
rounds, and the table gets its column and the ratio now / before.
`--peer [DIR]` does the same with NCCL's IB transport built as a plugin (DIR's
libnccl-net-rdma-sharp.so, as ci/bench_comms.py finds it: default $PEERS_DIR/out, else
/tmp/rivet-peers/out; ../shared/peers/build.sh builds it), run with the settings of
../shared/peers/README.md: the column is NCCL's IB transport's and the ratio rivet / it.
"""
import argparse, os, re, shutil, statistics, subprocess, sys
from benchlib import make_share
from bench_comms import copy_peers, peer_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mtu", type=int, default=9000)
    ap.add_argument("--baseline", help="an earlier libnccl-net-rivet.so to measure in the same rounds")
    ap.add_argument("--peer", nargs="?", const="", metavar="DIR",
                    help="measure NCCL's IB transport (DIR/libnccl-net-rdma-sharp.so) in the same rounds instead")
    ap.add_argument("--only", choices=["64K", "1M", "16M", "lat"], help="measure only this streaming size (no latency), or only the latency")
    ap.add_argument("--hog", nargs="?", type=int, const=19, metavar="NICE",
                    help="one busy loop per guest vCPU for the whole run, at this niceness (default 19)")
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    share = make_share("bench", "bench.sh")
    args = ["/mnt/host/bench.sh", str(a.rounds)]
    if a.baseline and a.peer is not None:
        sys.exit("--baseline and --peer each name the second library: give one")
    if a.baseline:
        shutil.copy(a.baseline, os.path.join(share, "baseline.so"))
        args.append("/mnt/host/baseline.so")
    elif a.peer is not None:
        peers = peer_dir(a.peer or None)
        if not peers or not os.path.exists(os.path.join(peers, "libnccl-net-rdma-sharp.so")):
            sys.exit("--peer: no libnccl-net-rdma-sharp.so (build it with ../shared/peers/build.sh, or name its directory)")
        copy_peers(peers, os.path.join(share, "peers"))
        args.append("/mnt/host/peers/libnccl-net-rdma-sharp.so")
    else:
        args.append("-")
    args.append({"64K": "65536:1500:96M", "1M": "1048576:120:120M", "16M": "16777216:6:128M", "lat": "lat"}[a.only] if a.only else "-")
    if a.hog is not None:
        args.append(f"hog:{a.hog}")
    out = subprocess.run([os.path.join(ROOT, "ci/vm/run-vm.sh"), "--share", share, "--mtu", str(a.mtu), "--timeout", "3600"] + args,
                         cwd=ROOT, capture_output=True, text=True)
    log = out.stdout + out.stderr
    with open(os.path.join(ROOT, "target", "vm", "bench.log"), "w") as f:
        f.write(log)
    if out.returncode != 0:
        sys.exit(f"the VM run failed (exit {out.returncode}):\n{log}")
    # Latency samples per statistic: "p50", "p90", "p99", "max", "avg" -> one value per round.
    pt_bw, pt = {}, {}
    rv_bw, rv = {}, {}
    base_bw, bs = {}, {}
    # The p50 of each round, by round (a round whose perftest printed no number is left out).
    p50_at = {"PERFTEST": {}, "SEND": {}, "RIVET": {}, "BASE": {}}
    rnd = 0
    for line in log.splitlines():
        m = re.match(r"ROUND (\d+)", line)
        if m:
            rnd = int(m[1])
        # perftest's "MB/sec" is MiB/s (it divides by 0x100000); take the average, not the peak.
        m = re.match(r"PERFTEST write_bw size=(\d+) .* MBps=([\d.]+)", line)
        if m:
            pt_bw.setdefault(int(m[1]), []).append(float(m[2]))
        m = re.match(r"PERFTEST write_lat size=8 .*usec_typical=([\d.]+) usec_avg=([\d.]+) usec_p99=([\d.]+) usec_max=([\d.]+)", line)
        if m:
            for k, v in zip(["p50", "avg", "p99", "max"], m.groups()):
                pt.setdefault(k, []).append(float(v))
            p50_at["PERFTEST"][rnd] = float(m[1])
        m = re.match(r"PERFTEST send_lat size=8 .*usec_typical=([\d.]+)", line)
        if m:
            p50_at["SEND"][rnd] = float(m[1])
        # rivet perf rows: size, iterations, microseconds per message, GB/s; MiB/s from the time.
        for prefix, bw, lat in [("RIVET", rv_bw, rv), ("BASE", base_bw, bs)]:
            m = re.match(prefix + r"\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s*$", line)
            if m:
                bw.setdefault(int(m[1]), []).append(int(m[1]) / (float(m[3]) / 1e6) / 2**20)
            # (A baseline built before the tail was reported prints only typical and average.)
            m = re.search(prefix + r".*latency \(8 B ping-pong, one way\): typical ([\d.]+) us, average ([\d.]+) us"
                          r"(?:, p90 ([\d.]+) us, p99 ([\d.]+) us, max ([\d.]+) us)?", line)
            if m:
                for k, v in zip(["p50", "avg", "p90", "p99", "max"], m.groups()):
                    if v is not None:
                        lat.setdefault(k, []).append(float(v))
                p50_at[prefix][rnd] = float(m[1])
    med = statistics.median
    info = next((l for l in log.splitlines() if l.startswith("PERFTEST info")), "")
    print(f"# Soft-RoCE rxe0 -> rxe1, veth MTU {a.mtu} ({info.split('active_mtu=')[-1].split()[0] if info else '?'} active), "
          f"median of {a.rounds} rounds (all rounds: target/vm/bench.log)"
          + (f", one busy loop per vCPU at nice {a.hog} throughout" if a.hog is not None else ""))
    base = bool(a.baseline) or a.peer is not None
    # The second library's name in the tables, and the ratio's.
    bn, br = ("NCCL IB", "rivet / NCCL IB") if a.peer is not None else ("before", "now / before")
    extra = f" {bn} MiB/s | {br} |" if base else ""
    print(f"| {'size':>8} | {'ib_write_bw MiB/s':>17} | {'rivet MiB/s':>11} | {'ratio':>5} |{extra}")
    print("|---:|---:|---:|---:|" + ("---:|---:|" if base else ""))
    for size in sorted(pt_bw):
        p, r = med(pt_bw[size]), med(rv_bw.get(size, [0]))
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        row = f"| {label:>8} | {p:17.1f} | {r:11.1f} | {r / p if p else 0:5.2f} |"
        if base:
            b = med(base_bw.get(size, [0]))
            row += f" {b:.1f} | {r / b if b else 0:.2f} |"
        print(row)
    if pt and rv:
        # Each statistic is taken per round (1000 pings), then its median over the rounds.
        print(f"\n| 8 B one-way latency | ib_write_lat us | rivet us | ratio |" + (f" {bn} us | {br} |" if base else ""))
        print("|---|---:|---:|---:|" + ("---:|---:|" if base else ""))
        names = [("p50 (typical)", "p50"), ("p90", "p90"), ("p99", "p99"), ("max", "max"), ("average", "avg")]
        for name, k in names:
            r = med(rv[k])
            p = med(pt[k]) if k in pt else None
            row = f"| {name} | {p:.1f} | {r:.1f} | {r / p:.2f} |" if p else f"| {name} | n/a | {r:.1f} | |"
            if base and k in bs:
                b = med(bs[k])
                row += f" {b:.1f} | {r / b:.2f} |"
            print(row)
        if p50_at["SEND"]:
            # ib_send_lat's receiver learns of each message from a completion, as rivet's does.
            sl, r50 = med(p50_at["SEND"].values()), med(rv["p50"])
            print(f"| p50 against ib_send_lat | {sl:.1f} | {r50:.1f} | {r50 / sl:.2f} |" + (" | |" if base else ""))
        # Round by round: each rivet p50 against the perftest p50s of its own round.
        for ref, ref_name in [("PERFTEST", "ib_write_lat"), ("SEND", "ib_send_lat")]:
            pts = p50_at[ref]
            for name, runs in [("rivet", p50_at["RIVET"]), (bn, p50_at["BASE"])] if base else [("rivet", p50_at["RIVET"])]:
                ratios = [runs[k] / pts[k] for k in sorted(runs) if pts.get(k, 0) > 0]
                if ratios:
                    each = " ".join(f"{x:.2f}" for x in ratios)
                    print(f"\n{name} p50 / {ref_name} p50, per round: {each}; median {med(ratios):.2f}")
    measured = list(pt_bw.values()) + list(rv_bw.values()) + (list(base_bw.values()) if base else [])
    if a.only in (None, "lat"):
        measured += [rv.get("p50", [])] + ([bs.get("p50", [])] if base else [])
    if any(len(v) < a.rounds for v in measured):
        sys.exit("some rounds produced no number: see target/vm/bench.log")


if __name__ == "__main__":
    main()
