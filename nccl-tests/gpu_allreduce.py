#!/usr/bin/env python3
"""NCCL all_reduce through rivet on ONE GPU: two PyTorch processes, each with its own NCCL_HOSTID,
so NCCL sees two one-GPU hosts and every byte crosses the network plugin.

Runs three configurations in one go and prints nccl-tests' columns for each, then a summary:
  rivet-host    rivet's TCP transport, NCCL's host buffers          (NCCL_NET=rivet)
  rivet-staged  rivet's TCP transport, GPU buffers through rivet's staging engine
                (RIVET_SOCKET_CUDA=1 NCCL_NET_GDR_LEVEL=SYS)
  socket        NCCL's built-in TCP transport, the baseline          (NCCL_NET=Socket)

Exit status non-zero when a rank fails or times out, any element is wrong, NCCL's log lacks
'via NET/rivet' for a rivet run, or the staged run moved no bytes through the staging engine
(RIVET_STATS). Usage: nccl-tests/gpu-check.sh (builds, then runs this), or
  python3 nccl-tests/gpu_allreduce.py --plugin /abs/libnccl-net-rivet.so [--configs rivet-host,socket]
"""
import argparse, datetime, glob, os, re, socket, subprocess, sys, time

CONFIGS = {
    "rivet-host": {"NCCL_NET": "rivet"},
    "rivet-staged": {"NCCL_NET": "rivet", "RIVET_SOCKET_CUDA": "1", "NCCL_NET_GDR_LEVEL": "SYS"},
    "socket": {"NCCL_NET": "Socket", "NCCL_NET_PLUGIN": "none"},
}


def sizes(lo, hi):
    s = lo
    while s <= hi:
        yield s
        s *= 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_config(name, a, out):
    logdir = os.path.join(out, name)
    os.makedirs(logdir, exist_ok=True)
    for f in glob.glob(os.path.join(logdir, "*")):
        os.remove(f)
    env = dict(os.environ)
    env.update({
        "MASTER_PORT": str(free_port()),
        "NCCL_NET_PLUGIN": a.plugin,
        "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NVLS_ENABLE": "0",
        "NCCL_MNNVL_ENABLE": "0", "NCCL_COLLNET_ENABLE": "0", "NCCL_SOCKET_IFNAME": "lo",
        "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV",
        "NCCL_DEBUG_FILE": os.path.join(logdir, "nccl.%h.%p.log"),
        "RIVET_STATS": "1", "RIVET_TIMEOUT": "30",
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0],
        "PYTHONUNBUFFERED": "1",
    })
    env.update(CONFIGS[name])
    procs = []
    for r in range(2):
        e = dict(env, RANK=str(r), NCCL_HOSTID=f"rivet-gpu-check-host{r}")
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", "-b", str(a.minbytes), "-e", str(a.maxbytes),
             "-n", str(a.iters), "-w", str(a.warmup), "--timeout", str(a.timeout)],
            env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.time() + a.timeout
    outs, rc = [], 0
    for p in procs:
        try:
            o, _ = p.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            o, _ = p.communicate()
            o += f"\n# TIMEOUT after {a.timeout} s\n"
            rc |= 124
        outs.append(o)
        rc |= p.returncode or 0
    print(f"\n## {name}: " + " ".join(f"{k}={v}" for k, v in CONFIGS[name].items()), flush=True)
    print(outs[0], end="")
    if rc:
        print(f"# rank 1 output:\n{outs[1]}")
    logs = "".join(open(f, errors="replace").read() for f in sorted(glob.glob(os.path.join(logdir, "*.log"))))
    problems = []
    if rc:
        problems.append(f"a rank failed (status {rc})")
    if re.search(r"#wrong_total [1-9]", outs[0]):
        problems.append("wrong elements")
    rows = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"^\s*(\d+)\s+\d+\s+float\s+sum\s+-1\s+\S+\s+\S+\s+(\S+)", outs[0], re.M)}
    if name.startswith("rivet"):
        via = re.findall(r"via NET/rivet/\d+(/\S+)?", logs)
        loaded = re.findall(r"Loaded net plugin (\S+ \(v\d+\))", logs)
        print(f"# NCCL log: {len(via)} 'via NET/rivet' channel lines ({sorted(set(v or '/host buffers' for v in via))}), loaded {sorted(set(loaded))}")
        if not via:
            problems.append("NCCL's log has no 'via NET/rivet' line: the plugin did not carry the traffic")
        for l in sorted(set(re.findall(r"NET/rivet: (?:host staging|GDR|host memory only|CUDA driver)[^\n]*", logs))):
            print(f"# rivet: {l}")
        staged = [int(x) for x in re.findall(r"staged \S+ \S+ / (\d+)", logs)]
        print(f"# RIVET_STATS: {len(staged)} comm(s) reported, {sum(staged)} staged messages")
        if name == "rivet-staged" and sum(staged) == 0:
            problems.append("no message went through the staging engine (RIVET_STATS): NCCL kept GPU buffers off the network")
    else:
        via = re.findall(r"via NET/Socket/\d+", logs)
        print(f"# NCCL log: {len(via)} 'via NET/Socket' channel lines")
    for w in sorted(set(re.findall(r"NCCL WARN [^\n]*", logs)))[:10]:
        print(f"# {w}")
    for p in problems:
        print(f"# FAIL {name}: {p}")
    return rows, problems


def launcher(a):
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    results, failed = {}, []
    for name in a.configs.split(","):
        t = time.time()
        rows, problems = run_config(name, a, out)
        results[name] = rows
        failed += [f"{name}: {p}" for p in problems]
        print(f"# {name} took {time.time() - t:.0f} s", flush=True)
    names = list(results)
    print("\n## busbw (GB/s) by size" + (" and rivet / socket" if "socket" in names else ""))
    print(f"{'size':>12} " + " ".join(f"{n:>13}" for n in names) + ("  ratio" * sum(1 for n in names if n != "socket" and "socket" in names)))
    for s in sizes(a.minbytes, a.maxbytes):
        vals = [results[n].get(s) for n in names]
        line = f"{s:>12} " + " ".join(f"{v:>13.3f}" if v is not None else f"{'-':>13}" for v in vals)
        base = results.get("socket", {}).get(s)
        for n in names:
            if n != "socket" and base:
                v = results[n].get(s)
                line += f"  {v / base:5.2f}" if v else "      -"
        print(line)
    if failed:
        print("\n# FAILED:\n# " + "\n# ".join(failed))
        return 1
    print("\n# all configurations passed")
    return 0


def worker(a):
    import torch
    import torch.distributed as dist
    rank = int(os.environ["RANK"])
    n = 2
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=rank,
                            world_size=n, device_id=dev, timeout=datetime.timedelta(seconds=a.timeout))
    buf = torch.empty(a.maxbytes // 4, dtype=torch.float32, device=dev)
    if rank == 0:
        print(f"# torch {torch.__version__} NCCL {'.'.join(map(str, torch.cuda.nccl.version()))} "
              f"{torch.cuda.get_device_name(0)}, 2 ranks on one GPU, in-place all_reduce")
        print(f"#{'size':>11} {'count':>12} {'type':>6} {'redop':>6} {'root':>5} {'time(us)':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>7}")
    bad = 0
    for size in sizes(a.minbytes, a.maxbytes):
        count = max(1, size // 4)
        t = buf[:count]
        iters = a.iters if size <= (16 << 20) else max(2, a.iters // 4)
        t.zero_()
        for _ in range(a.warmup):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        dist.barrier(device_ids=[0])
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        sec = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=dev)
        dist.all_reduce(sec)
        sec = sec.item() / n
        algbw = count * 4 / 1e9 / sec
        busbw = algbw * 2 * (n - 1) / n
        idx = torch.arange(count, dtype=torch.int32, device=dev) % 1024
        t.copy_(idx * 3 + rank)
        dist.all_reduce(t)
        wrong = int((t != (idx * 3 * n + n * (n - 1) // 2)).sum().item())
        bad += wrong
        if rank == 0:
            print(f"{count * 4:>12} {count:>12} {'float':>6} {'sum':>6} {-1:>5} {sec * 1e6:>10.1f} {algbw:>7.3f} {busbw:>7.3f} {wrong:>7}",
                  flush=True)
    if rank == 0:
        print(f"#wrong_total {bad}")
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    p.add_argument("--plugin", default=None, help="absolute path of libnccl-net-rivet.so")
    p.add_argument("--configs", default="rivet-host,rivet-staged,socket")
    p.add_argument("-b", "--minbytes", type=int, default=8)
    p.add_argument("-e", "--maxbytes", type=int, default=256 << 20)
    p.add_argument("-n", "--iters", type=int, default=10)
    p.add_argument("-w", "--warmup", type=int, default=2)
    p.add_argument("--timeout", type=int, default=150, help="seconds per configuration")
    p.add_argument("--out", default="gpu-check-out")
    a = p.parse_args()
    if a.worker:
        sys.exit(worker(a))
    if not a.plugin or not os.path.isabs(a.plugin) or not os.path.exists(a.plugin):
        sys.exit("--plugin must be the absolute path of the built libnccl-net-rivet.so")
    sys.exit(launcher(a))
