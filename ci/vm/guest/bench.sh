#!/bin/sh
# Benchmark rounds in the guest (run by ci/bench_verbs.py at MTU 9000). Each round interleaves,
# per measurement, perftest and `rivet perf` on the same devices (rxe0 sends, rxe1 receives):
# ib_write_bw and rivet's streaming bandwidth at 64 KiB, 1 MiB and 16 MiB, then ib_write_lat and
# rivet's 8-byte ping-pong. Output: PERFTEST ... lines (as /guest/perftest.sh prints them) and
# RIVET-prefixed `rivet perf` output. With a second library (an earlier build, for a before/after
# comparison), each rivet measurement is followed by the same one through it, prefixed BASE; a
# library under /mnt/host/peers/ (NCCL's IB transport as a plugin) runs with the settings of
# ../shared/peers/README.md for Soft-RoCE.
# Usage: bench.sh ROUNDS [BASE_LIB|-] [SIZE:ITERS:BYTES|lat|-] [hog|hog:NICE]
#   SIZE:ITERS:BYTES: one streaming size only, no latency; lat: the latency only; hog: one busy loop per vCPU at nice 19
#   (hog:NICE at that niceness)
#   for the whole run (a host whose CPUs are taken by other work: on Soft-RoCE the NIC's work runs
#   on the same CPUs, so how a plugin polls and yields decides whether it gets to run).
. /guest/lib.sh
cd /mnt/host || exit 2
rounds=${1:-3}
LIB=/mnt/host/libnccl-net-rivet.so
G0=${RXE0_GID_INDEX:-1} G1=${RXE1_GID_INDEX:-1}
read -r netmtu < /sys/class/net/veth0/mtu
ibmtu=$(ibv_devinfo -d rxe0 | awk '/active_mtu:/ { print $2; exit }')
echo "PERFTEST info netdev_mtu=$netmtu active_mtu=$ibmtu"
BASE=${2:-}
[ "$BASE" = - ] && BASE=
ONLY=${3:-}
[ "$ONLY" = - ] && ONLY=
case "${4:-}" in
  hog) NICE=19 ;;
  hog:*) NICE=${4#hog:} ;;
  *) NICE= ;;
esac
if [ -n "$NICE" ]; then
  start_hogs "$NICE"
  echo "PERFTEST info cpu_hog=$(nproc) nice=$NICE"
fi
case $BASE in
  /mnt/host/peers/*) BASE_ENV="LD_LIBRARY_PATH=/mnt/host/peers/lib NCCL_IB_GID_INDEX=$G0 NCCL_SOCKET_IFNAME=veth0" ;;
  *) BASE_ENV= ;;
esac
base() {
  # shellcheck disable=SC2086 # BASE_ENV is a list of NAME=VALUE words
  env $BASE_ENV ./rivet perf --lib "$BASE" --dev 0,1 "$@" 2>&1 | sed 's/^/BASE /'
}
rivet() {
  # The two builds take turns going first (odd rounds: this build first), so that neither gains
  # from its place in the pair.
  if [ -z "$BASE" ]; then
    ./rivet perf --lib $LIB --dev 0,1 "$@" 2>&1 | sed 's/^/RIVET /'
  elif [ $((r % 2)) = 1 ]; then
    ./rivet perf --lib $LIB --dev 0,1 "$@" 2>&1 | sed 's/^/RIVET /'
    base "$@"
  else
    base "$@"
    ./rivet perf --lib $LIB --dev 0,1 "$@" 2>&1 | sed 's/^/RIVET /'
  fi
}
r=1
while [ $r -le "$rounds" ]; do
  echo "ROUND $r"
  [ "$ONLY" = lat ] && streams= || streams=${ONLY:-65536:1500:96M 1048576:120:120M 16777216:6:128M}
  for s in $streams; do
    size=${s%%:*} rest=${s#*:}; n=${rest%%:*} bytes=${rest#*:}
    pt_pair bw ib_write_bw rxe1 $G1 rxe0 $G0 10.0.0.2 -s $size -n $n || exit 1
    awk -v s=$size '$1 == s && NF >= 5 { printf "PERFTEST write_bw size=%s iters=%s MBps=%s peak_MBps=%s\n", $1, $2, $4, $3; exit }' /tmp/bw.cli
    rivet --sizes $size --bytes $bytes --lat-iters 10 | grep -v latency
  done
  if [ -n "$ONLY" ] && [ "$ONLY" != lat ]; then r=$((r + 1)); continue; fi
  pt_pair lat ib_write_lat rxe1 $G1 rxe0 $G0 10.0.0.2 -s 8 -n 1000 || exit 1
  # #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%  [usec]
  awk '$1 == 8 && NF >= 8 { printf "PERFTEST write_lat size=8 iters=%s usec_typical=%s usec_avg=%s usec_p99=%s usec_max=%s\n", $2, $5, $6, $8, $4; exit }' /tmp/lat.cli
  rivet --sizes 8 --bytes 8 --lat-iters 1000 | grep latency
  # The reference whose receiver learns of a message from a completion, as rivet's does (a
  # write with immediate), after it: its p50 is steadier here than ib_write_lat's.
  pt_pair lat ib_send_lat rxe1 $G1 rxe0 $G0 10.0.0.2 -s 8 -n 1000 || exit 1
  awk '$1 == 8 && NF >= 8 { printf "PERFTEST send_lat size=8 iters=%s usec_typical=%s usec_avg=%s usec_p99=%s usec_max=%s\n", $2, $5, $6, $8, $4; exit }' /tmp/lat.cli
  r=$((r + 1))
done
[ -n "${hogs:-}" ] && kill $hogs 2>/dev/null
exit 0
