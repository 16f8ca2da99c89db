#!/usr/bin/env python3
"""rivet's TCP streaming bandwidth against iperf3 on loopback, same number of streams, same run.

    python3 ci/bench_tcp.py [--streams 2] [--rounds 3] [--sizes 1M,16M,256M] [--baseline OLD.so]

Builds the release binaries, then alternates rounds of `iperf3 -P N` (client and server on
127.0.0.1) and `rivet perf` (two processes, RIVET_SOCKET_NSTREAMS=N, NCCL_SOCKET_IFNAME=lo), and
prints the median GB/s of each with the ratio rivet / iperf3. iperf3 writes from one 1 MiB buffer
(its maximum block size) that stays in cache; rivet moves each message from and into a buffer of
the message's size, as NCCL does. `--baseline` names an earlier build of the plugin, measured by
the same CLI in the same rounds (a before/after column).
"""
import argparse, json, os, shutil, socket, statistics, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def iperf3(streams, secs):
    port = free_port()
    srv = subprocess.Popen(["iperf3", "-s", "-1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)  # let the server bind (a probe connection would use up its one client)
        out = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-P", str(streams), "-t", str(secs), "-l", "1M", "-J"],
                             capture_output=True, text=True, timeout=secs + 30)
        if out.returncode != 0:
            raise RuntimeError(out.stdout + out.stderr)
        return json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"] / 8e9
    finally:
        srv.kill()
        srv.wait()


def rivet(streams, sizes, rivet_bin, lib=None):
    env = dict(os.environ, RIVET_SOCKET_NSTREAMS=str(streams), NCCL_SOCKET_IFNAME="lo")
    out = subprocess.run([rivet_bin, "perf", "--sizes", sizes, "--lat-iters", "10", "--bytes", "2G"] + (["--lib", lib] if lib else []),
                         capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stdout + out.stderr)
    res = {}
    for line in out.stdout.splitlines():
        f = line.split()
        if len(f) == 4 and f[0].isdigit():
            res[int(f[0])] = float(f[3])
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=int(os.environ.get("RIVET_SOCKET_NSTREAMS", "2")))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="1M,16M,256M")
    ap.add_argument("--secs", type=int, default=3)
    ap.add_argument("--baseline", help="an earlier libnccl-net-rivet.so to measure in the same rounds")
    a = ap.parse_args()
    if shutil.which("cargo"):
        subprocess.run(["cargo", "build", "--release", "-q"], cwd=ROOT, check=True)
    # (Without cargo, e.g. on a benchmark host the binaries were copied to, the built ones are used.)
    rivet_bin = os.path.join(ROOT, "target", "release", "rivet")
    ip, rv, base = [], {}, {}
    for r in range(a.rounds):
        ip.append(iperf3(a.streams, a.secs))
        # With a baseline the two builds take turns going first, so neither gains from its place.
        runs = [(None, rv), (a.baseline, base)] if a.baseline else [(None, rv)]
        for lib, into in runs if r % 2 == 0 else runs[::-1]:
            for size, gbs in rivet(a.streams, a.sizes, rivet_bin, lib).items():
                into.setdefault(size, []).append(gbs)
        print(f"# round {r + 1}/{a.rounds}: iperf3 {ip[-1]:.2f} GB/s, rivet " +
              ", ".join(f"{s >> 20} MiB {v[-1]:.2f}" for s, v in sorted(rv.items())), file=sys.stderr)
    ref = statistics.median(ip)
    print(f"# TCP loopback, {a.streams} stream(s), median of {a.rounds} rounds, {os.cpu_count()} CPUs")
    print(f"| message | rivet GB/s | iperf3 -P {a.streams} GB/s | ratio |" + (" before GB/s | now / before |" if base else ""))
    print("|---:|---:|---:|---:|" + ("---:|---:|" if base else ""))
    for size in sorted(rv):
        m = statistics.median(rv[size])
        row = f"| {size >> 20} MiB | {m:.2f} | {ref:.2f} | {m / ref:.2f} |"
        if base:
            b = statistics.median(base[size])
            row += f" {b:.2f} | {m / b:.2f} |"
        print(row)


if __name__ == "__main__":
    main()
