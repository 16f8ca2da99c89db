#!/usr/bin/env bash
# The GPU check of a one-GPU machine: NCCL all_reduce (8 B .. 256 MiB, verified) between two
# PyTorch processes on the same GPU, through rivet's TCP transport with host buffers, again with GPU
# buffers through rivet's staging engine, and NCCL's own Socket transport as the baseline.
# Prints nccl-tests' columns per configuration and a busbw summary; exits non-zero on any failure.
#   bash nccl-tests/gpu-check.sh [--lib /abs/libnccl-net-rivet.so] [gpu_allreduce.py options]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
lib=""
if [ "${1:-}" = "--lib" ]; then lib=$2; shift 2; fi
if [ -z "$lib" ]; then
    lib=$root/target/release/libnccl-net-rivet.so
    if command -v cargo >/dev/null; then
        (cd "$root" && cargo build --release --quiet && cp -f target/release/libnccl_net_rivet.so "$lib")
    elif [ ! -e "$lib" ] && [ -e "$root/target/release/libnccl_net_rivet.so" ]; then
        cp -f "$root/target/release/libnccl_net_rivet.so" "$lib"
    fi
fi
[ -e "$lib" ] || { echo "gpu-check: $lib not found: build it with 'make' (or pass --lib)" >&2; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
exec python3 "$here/gpu_allreduce.py" --plugin "$(realpath "$lib")" --out "${GPU_CHECK_OUT:-$root/target/gpu-check}" "$@"
