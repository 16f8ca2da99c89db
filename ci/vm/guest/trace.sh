#!/bin/sh
# Where a round trip goes, in the guest (run by ci/lat_trace.py at MTU 9000): ROUNDS rounds of
# ib_write_lat and ib_send_lat (8 bytes, the references) and of `rivet perf`'s 8-byte ping-pong with
# RIVET_PERF_TRACE set, through rivet and through NCCL's IB transport when the share has it
# (peers/libnccl-net-rdma-sharp.so, with ../shared/peers/README.md's settings). Rank 0 on rxe0,
# rank 1 on rxe1. Output: PERFTEST and prefixed `rivet perf` lines; the traces in
# /mnt/host/trace/PLUGIN.ROUND/rankN.csv.
# Usage: trace.sh ROUNDS ITERS [hog|hog:NICE]
#   hog: one busy loop per vCPU at nice 19 (hog:NICE at that niceness) for the whole run
. /guest/lib.sh
cd /mnt/host || exit 2
rounds=${1:-3} iters=${2:-1000}
case "${3:-}" in
  hog) start_hogs 19 ;;
  hog:*) start_hogs "${3#hog:}" ;;
esac
G0=${RXE0_GID_INDEX:-1} G1=${RXE1_GID_INDEX:-1}
PL=/mnt/host/peers/lib
r=1
while [ $r -le "$rounds" ]; do
  echo "ROUND $r"
  pt_pair lat ib_write_lat rxe1 $G1 rxe0 $G0 10.0.0.2 -s 8 -n "$iters" || exit 1
  # #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%  [usec]
  awk '$1 == 8 && NF >= 8 { printf "PERFTEST write_lat typical=%s avg=%s p99=%s\n", $5, $6, $8; exit }' /tmp/lat.cli
  # Send/receive: the receiver learns of the message from a completion (a receive consumed, a CQ
  # entry written), as from a write with immediate: the floor of a design that polls a CQ.
  pt_pair slat ib_send_lat rxe1 $G1 rxe0 $G0 10.0.0.2 -s 8 -n "$iters" || exit 1
  awk '$1 == 8 && NF >= 8 { printf "PERFTEST send_lat typical=%s avg=%s p99=%s\n", $5, $6, $8; exit }' /tmp/slat.cli
  for name in rivet nccl-ib; do
    d=/mnt/host/trace/$name.$r
    mkdir -p $d
    case $name in
      rivet) set -- env RIVET_PERF_TRACE=$d /mnt/host/rivet perf --lib /mnt/host/libnccl-net-rivet.so ;;
      nccl-ib) [ -f peers/libnccl-net-rdma-sharp.so ] || continue
        set -- env RIVET_PERF_TRACE=$d LD_LIBRARY_PATH=$PL NCCL_IB_GID_INDEX=$G0 NCCL_SOCKET_IFNAME=veth0 \
          /mnt/host/rivet perf --lib /mnt/host/peers/libnccl-net-rdma-sharp.so ;;
    esac
    "$@" --dev 0,1 --sizes 8 --bytes 8 --lat-iters "$iters" 2>&1 | grep -E 'latency|initiator|responder|rror' | sed "s/^/$name /"
  done
  r=$((r + 1))
done
[ -n "${hogs:-}" ] && kill $hogs 2>/dev/null
exit 0
