#!/usr/bin/env bash
# Every test of the project: unit tests, the C conformance driver for each exported ncclNet
# version, the C header layout check, and the fault tests.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --all-targets
cargo test --release --no-fail-fast
echo "ci/test.sh: all tests passed"
