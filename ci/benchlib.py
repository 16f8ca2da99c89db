"""What the VM benchmarks (bench_verbs.py, bench_comms.py) share."""
import os, shutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_share(name, script):
    """target/vm/NAME, fresh, holding the release plugin, the CLI and ci/vm/guest/SCRIPT; its path."""
    share = os.path.join(ROOT, "target", "vm", name)
    shutil.rmtree(share, ignore_errors=True)
    os.makedirs(share)
    shutil.copy(os.path.join(ROOT, "target/release/libnccl_net_rivet.so"), os.path.join(share, "libnccl-net-rivet.so"))
    shutil.copy(os.path.join(ROOT, "target/release/rivet"), share)
    shutil.copy(os.path.join(ROOT, "ci/vm/guest", script), share)
    return share
