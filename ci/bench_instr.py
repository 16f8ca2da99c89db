#!/usr/bin/env python3
"""Instructions per data-path call, for rivet and the peer plugins, in one VM run on the same link.

    python3 ci/bench_instr.py [--iters 300] [--settle-us 5000] [--peers DIR] [--budget FILE]

On Soft-RoCE the "NIC" is kernel work on the same emulated CPUs, and every instruction a plugin
runs on the way from `isend` to the peer's `test` that finds the message is on the latency's
critical path. Time is too noisy in an emulator to compare that work call by call; instruction
counts are not: callgrind counts the same instructions for the same binary and inputs whatever
else the host does. This runs `rivet perf --sizes 8 --lat-iters ITERS` (the 8-byte ping-pong;
the initiator sleeps --settle-us after each isend, 5000 by default: `--lat-settle`, so that its one
test per wait finds the answer while the responder's many tests find nothing) under callgrind in the Soft-RoCE VM (ci/vm/guest/instr.sh; valgrind is
copied in from this host), through rivet and through the peers of --peers DIR (as
ci/bench_comms.py), and prints per plugin and rank the instructions per call of the harness's
`isend`, `irecv` and `test` calls (a `test` that finds the message and one that finds nothing,
solved from the two ranks' counts, whose tests per wait differ; one on a send), and for rivet
the same per layer. Counts are user space only: the kernel's share (the doorbell system call
and, on Soft-RoCE, the packet's whole journey) is not in them.

--budget FILE (ci/instr-budget.json, run by ci/test.sh): rivet's isend + finding test, idle test
and irecv must each stay within the file's figure plus its margin; a figure over it, or one that
could not be measured, fails the run (exit 1). The budget reads the idle test as the responder's
mean test and the finding test from the initiator's tests given that (the table's two-rank solve
swings by a tenth between runs when the initiator's tests per wait come near 1).
"""
import json
import argparse, os, re, shutil, subprocess, sys
from benchlib import make_share
from bench_comms import copy_peers, peer_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The harness's calls into a plugin (any plugin), and rivet's layers under them.
HARNESS = [("isend", "rivet::net::Net::isend"), ("irecv", "rivet::net::Net::irecv"), ("test", "rivet::net::Net::test")]
LAYERS = [
    "nccl_net_rivet::abi::common::isend_p", "nccl_net_rivet::plugin::isend",
    "<nccl_net_rivet::gpu::staging::Staged as nccl_net_rivet::transport::Conn>::isend",
    "<nccl_net_rivet::transport::verbs::send::VerbsSend<N> as nccl_net_rivet::transport::Conn>::isend_partial",
    "nccl_net_rivet::transport::verbs::send::VerbsSend<N>::post_eager",
    "nccl_net_rivet::abi::common::irecv_p", "nccl_net_rivet::plugin::irecv",
    "<nccl_net_rivet::transport::verbs::recv::VerbsRecv<N> as nccl_net_rivet::transport::Conn>::irecv",
    "nccl_net_rivet::abi::common::test", "nccl_net_rivet::plugin::test",
    "<nccl_net_rivet::gpu::staging::Staged as nccl_net_rivet::transport::Conn>::test",
    "<nccl_net_rivet::transport::verbs::recv::VerbsRecv<N> as nccl_net_rivet::transport::Conn>::test",
    "<nccl_net_rivet::transport::verbs::send::VerbsSend<N> as nccl_net_rivet::transport::Conn>::test",
    "nccl_net_rivet::transport::verbs::recv::VerbsRecv<N>::progress",
    "nccl_net_rivet::transport::verbs::conn::Common<N>::poll",
    "nccl_net_rivet::transport::verbs::recv::VerbsRecv<N>::drain_ring",
    "nccl_net_rivet::transport::verbs::recv::VerbsRecv<N>::idle",
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
    ap.add_argument("--settle-us", type=int, default=5000)
    ap.add_argument("--peers", help="directory with the built peer plugins (../shared/peers/build.sh's out/)")
    ap.add_argument("--budget", help="JSON file of rivet's committed instruction budget: fail when a figure is over it")
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
    events = {}
    for line in log.splitlines():
        if line.startswith(("OK ", "FAIL ", "PROFILER ")):
            print("#", line)
        m = re.match(r"PROFILER (\S+) # profiler events, rank (\d+): (\d+) started, (\d+) stopped", line)
        if m:
            events.setdefault(m[1], {})[int(m[2])] = (int(m[3]), int(m[4]))
    if out.returncode not in (0, 1):
        sys.exit(f"the VM run failed (exit {out.returncode}): see target/vm/instr.log")
    cg = os.path.join(share, "cg")
    print(f"# user-space instructions per call (callgrind), 8-byte ping-pong, {a.iters} round trips after 100 of warm-up"
          + (f", the initiator asleep {a.settle_us} us after each isend" if a.settle_us else ""))
    print("# test: finds msg / finds nothing solve count(r) = finds * waits(r) + nothing * (tests(r) - waits(r)) over the two ranks,")
    print("# whose tests per wait differ (the same code on both); isend+finds: the work on a message's way (sender, then receiver)")
    print(f"{'plugin':<8} {'isend':>7} {'irecv':>7} {'test: finds msg':>15} {'finds nothing':>13} {'test (send)':>11} {'isend+finds':>11}   tests/wait (r0, r1)")
    layers, rows, hooks = {}, {}, {}
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
        tw = funcs.get("rivet::perf::wait_timed")
        nw, waited = per_call(funcs, HARNESS[2][1], "wait_timed")
        rows.setdefault(plugin, {})[rank] = {
            "isend": per_call(funcs, HARNESS[0][1]), "irecv": per_call(funcs, HARNESS[1][1]),
            "try": per_call(funcs, "rivet::net::Net::try_isend"),
            "sent": per_call(funcs, HARNESS[2][1], "wait_all"),
            "waits": sum(n for n, _ in tw[1].values()) if tw else 0, "tests": nw, "cost": (waited or 0) * nw,
        }
        if plugin.startswith("rivet"):
            hooks[plugin] = [a + b for a, b in zip(hooks.get(plugin, (0, 0)), profiler_hooks(funcs))]
        if plugin == "rivet":
            for name in LAYERS:
                n, v = per_call(funcs, name)
                if v is not None:
                    layers.setdefault(name, []).append((rank, n, v))
    fmt = lambda v, w=7: f"{v:{w}.0f}" if v is not None else " " * (w - 1) + "-"
    figures = {}
    for plugin, rk in rows.items():
        if set(rk) != {0, 1}:
            print(f"{plugin:<8} (a rank's profile is missing)")
            continue
        both = lambda k: sum(rk[r][k][0] * (rk[r][k][1] or 0) for r in (0, 1)) / max(1, sum(rk[r][k][0] for r in (0, 1)))
        (w0, t0, c0), (w1, t1, c1) = [(rk[r]["waits"], rk[r]["tests"], rk[r]["cost"]) for r in (0, 1)]
        # c = F*w + I*(t - w), for each rank: two equations, two unknowns.
        det = w0 * (t1 - w1) - w1 * (t0 - w0)
        found = nothing = None
        if w0 and w1 and abs(det) > 0.05 * w0 * w1 * max(t0 / w0, t1 / w1):
            found = (c0 * (t1 - w1) - c1 * (t0 - w0)) / det
            nothing = (w0 * c1 - w1 * c0) / det
        isend = both("isend")
        crit = isend + found if found is not None else None
        # For the budget, figures that do not hinge on the solve above (ill-conditioned when the
        # initiator's tests per wait come near 1, and its idle tests need not cost what the
        # responder's do): an idle test is the responder's mean test (about a hundred idle tests
        # per one that finds, which adds a few instructions), and the finding test what the
        # initiator's tests cost beyond that many idle ones.
        # And an isend is one attempt (the harness's isend tries again while the plugin answers
        # NULL, which it does now and then when a credit comes late: counted per message, those
        # retries would swing the figure by a tenth between runs).
        idle = c1 / t1 if t1 else None
        finds = (c0 - idle * (t0 - w0)) / w0 if idle is not None and w0 else None
        attempt = both("try")
        figures[plugin] = {"isend+finds": attempt + finds if finds is not None and attempt else None, "idle test": idle, "irecv": both("irecv"),
                           # The responder's isend attempts: each one a request (its answer's
                           # credit is always there), the same work whatever the timing.
                           "isend": rk[1]["try"][1]}
        print(f"{plugin:<8} {fmt(isend)} {fmt(both('irecv'))} {fmt(found, 15)} {fmt(nothing, 13)} {fmt(both('sent'), 11)} {fmt(crit, 11)}"
              f"   {t0 / max(w0, 1):.2f}, {t1 / max(w1, 1):.2f}")
    if layers:
        print("# rivet by layer: calls and instructions per call (inclusive), per rank")
        for name, rows in layers.items():
            print(f"  {' '.join(f'r{r}: {n:>6}x {v:6.0f}' for r, n, v in sorted(rows))}  {name}")
    for plugin, f in figures.items():
        show = lambda v: f"{v:.0f}" if v is not None else "-"
        print(f"# {plugin}, as the budget reads them: isend attempt+finds {show(f['isend+finds'])}, idle test (the responder's mean) {show(f['idle test'])}, irecv {show(f['irecv'])}")
    for run, (calls, cost) in hooks.items():
        if calls:
            print(f"# {run}: the core's profiler hooks, {calls} requests with a handle: {cost / calls:.0f} instructions per request (its events started and stopped)")
    if a.budget:
        return check_budget(a.budget, figures, events)
    return 0


def profiler_hooks(funcs):
    """(requests, instructions) under the core's profiler hooks in one rank's profile: the calls
    of Comm::profile_start (one per request posted with a profiler handle) and
    Comm::profile_stop_events (one per such request done), inclusive (the plan of the events,
    NCCL's callback, the handles kept). The inline checks before them are in the figures
    without a callback too."""
    calls = cost = 0
    for name in ("nccl_net_rivet::plugin::Comm::profile_start", "nccl_net_rivet::plugin::Comm::profile_stop_events"):
        n, v = per_call(funcs, name)
        if v is not None:
            cost += n * v
            calls += n if name.endswith("profile_start") else 0
    return calls, cost


def check_budget(path, figures, events):
    """Each of rivet's figures against the committed budget (plus its margin), and with NCCL's
    profiler callback (rivet-cb, rivet-prof) against the same figure without it in this run: 0
    when all hold."""
    with open(path) as f:
        b = json.load(f)
    got = figures.get("rivet", {})
    bad = profiler_check(b["profiler_margin"], got, figures, events, b["rivet"], b["margin"])
    margin = b["margin"]
    for k, limit in b["rivet"].items():
        v = got.get(k)
        allowed = limit * (1 + margin)
        ok = v is not None and v <= allowed
        bad += not ok
        shown = f"{v:.0f}" if v is not None else "not measured"
        print(f"BUDGET {k}: {shown} instructions (budget {limit}, at most {allowed:.0f} with the {margin:.0%} margin): {'PASS' if ok else 'FAIL'}")
    print(f"BUDGET {'FAILED' if bad else 'PASSED'}: {bad} of {2 * len(b['rivet']) + 4} check(s) failed")
    return 1 if bad else 0


def profiler_check(margin, base, figures, events, budget=None, budget_margin=0.0):
    """With NCCL's profiler callback passed and no handle with any request (rivet-cb: NCCL
    without a profiler plugin, as every NCCL of v10+ runs it): the responder's isend attempt,
    irecv and the idle test at most `margin` above the same figure without a callback in the
    same run (each repeats within about 1 % between processes), and every figure of the
    committed `budget` held as the plain run's is (isend+finds swings by up to a tenth between
    processes with the initiator's NULL attempts, more than a callback could add: its same-run
    ratio is shown). rivet-prof (a handle with every request, each network event reported) must
    report events on both ranks, as many stopped as started; its figures are shown, not
    budgeted (they pay for the events a profiler plugin asked for, and NCCL's own callback costs
    more than the harness's). Returns the failures."""
    bad = 0
    got = figures.get("rivet-cb", {})
    for k in ("isend", "idle test", "irecv", "isend+finds"):
        v0, v = base.get(k), got.get(k)
        shown = f"{v:.0f} against {v0:.0f} without one ({v / v0 - 1:+.1%})" if v is not None and v0 else "not measured"
        if k != "isend+finds":
            ok = v is not None and v0 is not None and v <= v0 * (1 + margin)
            bad += not ok
            print(f"BUDGET {k} with a profiler callback: {shown}, at most {margin:+.0%}: {'PASS' if ok else 'FAIL'}")
        else:
            print(f"# {k} with a profiler callback: {shown}")
    for k, limit in (budget or {}).items():
        v = got.get(k)
        ok = v is not None and v <= limit * (1 + budget_margin)
        bad += not ok
        print(f"BUDGET {k} with a profiler callback: {v if v is None else round(v)} (budget {limit}, at most {limit * (1 + budget_margin):.0f}): {'PASS' if ok else 'FAIL'}")
    got = figures.get("rivet-prof", {})
    print("# with a profiler handle per request (not budgeted): " + ", ".join(
        f"{k} {got[k]:.0f} against {v0:.0f} ({got[k] / v0 - 1:+.1%})" for k, v0 in base.items() if got.get(k) and v0))
    seen = [events.get("rivet-prof", {}).get(r) for r in (0, 1)]
    ok = all(e and e[0] > 0 and e[0] == e[1] for e in seen)
    bad += not ok
    print(f"BUDGET profiler events (started, stopped) per rank: {seen}: {'PASS' if ok else 'FAIL'}")
    return bad


if __name__ == "__main__":
    sys.exit(main())
