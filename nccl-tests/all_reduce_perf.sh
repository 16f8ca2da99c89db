#!/usr/bin/env bash
# Run your own build of nccl-tests' all_reduce_perf with rivet as NCCL's network, as on a cluster:
#
#   nccl-tests/all_reduce_perf.sh [--lib PATH] [--bin PATH] [--hosts h1,h2 [--np N]] [-- ARGS...]
#
#   --lib    the plugin (default: target/release/libnccl-net-rivet.so of this checkout, as `make` builds it)
#   --bin    all_reduce_perf (default: $NCCL_TESTS_BIN, else all_reduce_perf on PATH, else
#            ./build/all_reduce_perf); build it from github.com/NVIDIA/nccl-tests with MPI=1 for --hosts
#   --hosts  run under mpirun on these hosts (comma-separated, as mpirun -H takes them), --np ranks
#            in all (default: one per host); the plugin path must be the same on every host
#   ARGS     all_reduce_perf's own options (default: -b 8 -e 128M -f 2 -g 1)
#
# Sets NCCL_NET_PLUGIN=rivet with the library's directory first on LD_LIBRARY_PATH (the one way
# every NCCL from 2.18 on finds it: 2.18-2.20 cannot take an absolute path) and NCCL_NET=rivet, so
# NCCL uses rivet or fails instead of quietly falling back to its own transports, and passes every
# NCCL_* and RIVET_* variable of this shell through to the ranks (mpirun -x). NCCL_DEBUG=INFO
# shows rivet's lines.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
lib=$root/target/release/libnccl-net-rivet.so
bin=${NCCL_TESTS_BIN:-}
hosts=""
np=""
while [ $# -gt 0 ]; do
  case $1 in
    --lib) lib=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --np) np=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "all_reduce_perf.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-b 8 -e 128M -f 2 -g 1)
[ -e "$lib" ] || { echo "all_reduce_perf.sh: $lib not found: run 'make' first or pass --lib" >&2; exit 2; }
lib=$(realpath "$lib")
[ "$(basename "$lib")" = libnccl-net-rivet.so ] || { echo "all_reduce_perf.sh: $lib must be named libnccl-net-rivet.so, the name NCCL looks up for NCCL_NET_PLUGIN=rivet (make builds it)" >&2; exit 2; }
if [ -z "$bin" ]; then
  bin=$(command -v all_reduce_perf || true)
  [ -n "$bin" ] || bin=./build/all_reduce_perf
fi
[ -x "$bin" ] || { echo "all_reduce_perf.sh: all_reduce_perf not found at '$bin': build nccl-tests (make MPI=1) and pass --bin or set NCCL_TESTS_BIN" >&2; exit 2; }
export NCCL_NET_PLUGIN=rivet NCCL_NET=rivet
export LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [ -z "$hosts" ]; then
  echo "+ LD_LIBRARY_PATH=$(dirname "$lib"):... NCCL_NET_PLUGIN=rivet NCCL_NET=rivet $bin ${args[*]}"
  exec "$bin" "${args[@]}"
fi
[ -n "$np" ] || np=$(tr ',' '\n' <<< "$hosts" | grep -c .)
pass=(-x LD_LIBRARY_PATH)
for v in $(env | sed -n 's/^\(\(NCCL\|RIVET\)_[A-Za-z0-9_]*\)=.*/\1/p' | sort -u); do pass+=(-x "$v"); done
echo "+ mpirun -np $np -H $hosts ${pass[*]} $bin ${args[*]}"
exec mpirun -np "$np" -H "$hosts" "${pass[@]}" "$bin" "${args[@]}"
