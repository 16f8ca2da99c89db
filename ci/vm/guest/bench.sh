#!/bin/sh
# Benchmark rounds in the guest (run by ci/bench_verbs.py at MTU 9000): each round runs the
# perftest baseline (/guest/perftest.sh: ib_write_bw 64K/1M/16M, ib_write_lat 8 B, rxe0 -> rxe1)
# and `rivet perf` over the same devices (rank 0 on rxe0 sends, rank 1 on rxe1 receives).
# Usage: bench.sh ROUNDS
cd /mnt/host || exit 2
rounds=${1:-3}
r=1
while [ $r -le "$rounds" ]; do
  echo "ROUND $r"
  sh /guest/perftest.sh || exit 1
  ./rivet perf --lib /mnt/host/libnccl-net-rivet.so --dev 0,1 --sizes 64K,1M,16M --bytes 96M \
    --lat-iters 1000 --window 8 2>&1 | sed 's/^/RIVET /' || exit 1
  r=$((r + 1))
done
