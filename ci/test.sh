#!/usr/bin/env bash
# Every test of the project: clippy with warnings as errors, unit tests, the C conformance
# driver for each exported ncclNet version, the C header layout check, the fault tests (all over TCP on this host), the README's
# first command in a clean copy of the tree (ci/readme-first.sh), the release tarballs for x86_64
# and aarch64 with their glibc and conformance checks (ci/dist.sh --check), then the same
# driver and faults over real RDMA verbs traffic in the Soft-RoCE VM (ci/vm-test.sh; set
# RIVET_SKIP_VM=1 to leave it out of a quick local run).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --all-targets
# Lints: every warning is an error, and every unsafe block says why it is sound.
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
cargo clippy --release --all-targets -- -D warnings -D clippy::undocumented_unsafe_blocks
cargo clippy --test shell_sim -- -D warnings -D clippy::undocumented_unsafe_blocks
cargo test --release --no-fail-fast
# The production verbs shells and engines over a simulated NIC with its faults (links, ports,
# recovery, fatal statuses, a side gone; adaptive routing and its hazard, fused members, GPU
# memory, flushes, eager limits): 100 seeded schedules in the dev profile (its debug assertions
# check the shells' unsafe code too), 10,000 in release.
RIVET_SHELL_SIM_SCHEDULES=100 cargo test --test shell_sim
RIVET_SHELL_SIM_SCHEDULES=10000 cargo test --release --test shell_sim
# The soak over TCP: random traffic both ways, every byte checked, no growth of RSS, fds or threads
# (RIVET_SOAK_MINUTES, default 3).
NCCL_SOCKET_IFNAME=lo target/release/rivet soak --minutes "${RIVET_SOAK_MINUTES:-3}"
# The README's first command, exactly as written, in a clean copy of the tree.
bash ci/readme-first.sh
# The release tarballs (make dist): glibc 2.17 symbol versions, and the conformance driver against
# the x86_64 build and, under qemu, the aarch64 one (RIVET_SKIP_DIST=1 leaves this out).
if [ "${RIVET_SKIP_DIST:-0}" != 1 ]; then
  bash ci/dist-deps.sh
  bash ci/dist.sh --check
fi
if [ "${RIVET_SKIP_VM:-0}" != 1 ]; then
  bash ci/vm-test.sh
  # Impaired links: loss, reordering, delay and jitter, duplication, corruption; link flaps.
  bash ci/vm-test.sh impair.sh
  # The data path's instructions per call (callgrind, in the VM) against the committed budget.
  python3 ci/bench_instr.py --iters 200 --budget ci/instr-budget.json
fi
echo "ci/test.sh: all tests passed"
