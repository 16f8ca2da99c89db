#!/usr/bin/env bash
# Every test of the project: unit tests, the C conformance driver for each exported ncclNet
# version, the C header layout check, the fault tests (all over TCP on this host), the README's
# first command in a clean copy of the tree (ci/readme-first.sh), then the same
# driver and faults over real RDMA verbs traffic in the Soft-RoCE VM (ci/vm-test.sh; set
# RIVET_SKIP_VM=1 to leave it out of a quick local run).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --all-targets
cargo test --release --no-fail-fast
# The README's first command, exactly as written, in a clean copy of the tree.
bash ci/readme-first.sh
if [ "${RIVET_SKIP_VM:-0}" != 1 ]; then
  bash ci/vm-test.sh
fi
echo "ci/test.sh: all tests passed"
