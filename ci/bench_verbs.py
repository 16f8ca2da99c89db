#!/usr/bin/env python3
"""rivet over RDMA verbs against perftest on the same Soft-RoCE link, in one VM run.

    python3 ci/bench_verbs.py [--rounds 5] [--mtu 9000] [--baseline OLD.so]

Builds the release plugin and CLI, boots the Soft-RoCE VM (ci/vm/run-vm.sh) with the veth MTU
given (9000: rxe active_mtu 4096) and runs ROUNDS rounds of: ib_write_bw at 64 KiB, 1 MiB and
16 MiB plus ib_write_lat at 8 bytes (rxe0 -> rxe1), then `rivet perf --dev 0,1` (rank 0 on rxe0
sends to rank 1 on rxe1) at the same sizes and its 8-byte one-way ping-pong latency, each rivet
measurement right after the perftest one it is compared with. Prints the
median of each with the ratio rivet / perftest. Emulation is noisy: quote medians, not one run.
`--baseline` names an earlier build of the plugin (for example one built from an older commit
with `git worktree`): each rivet measurement is then repeated through it, interleaved in the same
rounds, and the table gets its column and the ratio now / before.
"""
import argparse, os, re, shutil, statistics, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mtu", type=int, default=9000)
    ap.add_argument("--baseline", help="an earlier libnccl-net-rivet.so to measure in the same rounds")
    ap.add_argument("--only", choices=["64K", "1M", "16M"], help="measure only this streaming size (no latency)")
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    share = os.path.join(ROOT, "target", "vm", "bench")
    shutil.rmtree(share, ignore_errors=True)
    os.makedirs(share)
    shutil.copy(os.path.join(ROOT, "target/release/libnccl_net_rivet.so"), os.path.join(share, "libnccl-net-rivet.so"))
    shutil.copy(os.path.join(ROOT, "target/release/rivet"), share)
    shutil.copy(os.path.join(ROOT, "ci/vm/guest/bench.sh"), share)
    args = ["/mnt/host/bench.sh", str(a.rounds)]
    if a.baseline:
        shutil.copy(a.baseline, os.path.join(share, "baseline.so"))
    args.append("/mnt/host/baseline.so" if a.baseline else "-")
    if a.only:
        args.append({"64K": "65536:1500:96M", "1M": "1048576:120:120M", "16M": "16777216:6:128M"}[a.only])
    out = subprocess.run([os.path.join(ROOT, "ci/vm/run-vm.sh"), "--share", share, "--mtu", str(a.mtu), "--timeout", "3600"] + args,
                         cwd=ROOT, capture_output=True, text=True)
    log = out.stdout + out.stderr
    with open(os.path.join(ROOT, "target", "vm", "bench.log"), "w") as f:
        f.write(log)
    if out.returncode != 0:
        sys.exit(f"the VM run failed (exit {out.returncode}):\n{log}")
    pt_bw, pt_lat, pt_avg = {}, [], []
    rv_bw, rv_lat, rv_avg = {}, [], []
    base_bw, base_lat, base_avg = {}, [], []
    for line in log.splitlines():
        # perftest's "MB/sec" is MiB/s (it divides by 0x100000); take the average, not the peak.
        m = re.match(r"PERFTEST write_bw size=(\d+) .* MBps=([\d.]+)", line)
        if m:
            pt_bw.setdefault(int(m[1]), []).append(float(m[2]))
        m = re.match(r"PERFTEST write_lat size=8 .*usec_typical=([\d.]+) usec_avg=([\d.]+)", line)
        if m:
            pt_lat.append(float(m[1]))
            pt_avg.append(float(m[2]))
        # rivet perf rows: size, iterations, microseconds per message, GB/s; MiB/s from the time.
        for prefix, bw, lat, avg in [("RIVET", rv_bw, rv_lat, rv_avg), ("BASE", base_bw, base_lat, base_avg)]:
            m = re.match(prefix + r"\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s*$", line)
            if m:
                bw.setdefault(int(m[1]), []).append(int(m[1]) / (float(m[3]) / 1e6) / 2**20)
            m = re.search(prefix + r".*latency \(8 B ping-pong, one way\): typical ([\d.]+) us, average ([\d.]+) us", line)
            if m:
                lat.append(float(m[1]))
                avg.append(float(m[2]))
    med = statistics.median
    info = next((l for l in log.splitlines() if l.startswith("PERFTEST info")), "")
    print(f"# Soft-RoCE rxe0 -> rxe1, veth MTU {a.mtu} ({info.split('active_mtu=')[-1].split()[0] if info else '?'} active), "
          f"median of {a.rounds} rounds (all rounds: target/vm/bench.log)")
    base = bool(a.baseline)
    extra = " before MiB/s | now / before |" if base else ""
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
    if pt_lat and rv_lat:
        print(f"\n| 8 B one-way latency | ib_write_lat us | rivet us | ratio |" + (" before us | now / before |" if base else ""))
        print("|---|---:|---:|---:|" + ("---:|---:|" if base else ""))
        rows = [("typical (median)", pt_lat, rv_lat, base_lat), ("average", pt_avg, rv_avg, base_avg)]
        for name, p, r, b in rows:
            row = f"| {name} | {med(p):.1f} | {med(r):.1f} | {med(r) / med(p):.2f} |"
            if base and b:
                row += f" {med(b):.1f} | {med(r) / med(b):.2f} |"
            print(row)
    measured = list(pt_bw.values()) + list(rv_bw.values()) + (list(base_bw.values()) if base else [])
    if any(len(v) < a.rounds for v in measured):
        sys.exit("some rounds produced no number: see target/vm/bench.log")


if __name__ == "__main__":
    main()
