#!/bin/sh
# What connections cost and how latency holds, in the guest (run by ci/bench_comms.py at MTU
# 9000): ROUNDS rounds of `rivet perf --dev 0,1 --comms LIST --sizes 1M` through each plugin in
# the share: rivet, then the peers that are there (peers/libnccl-net-rdma-sharp.so, NCCL's IB
# transport from nccl-rdma-sharp-plugins, and peers/libnccl-net-rdma-sharp-32.so, the same built
# with NCCL_NET_MAX_REQUESTS 32; peers/libnccl-net-ofi.so, aws-ofi-nccl over libfabric's
# verbs provider; peers/libnccl-net-rivet-base.so, another rivet build, as rivet-base), with the
# settings ../shared/peers/README.md gives for Soft-RoCE. Rank 0 is on rxe0, rank 1 on rxe1. The
# plugins take turns going first. Output: each plugin's lines prefixed with its name (rivet,
# nccl-ib, nccl-ib-32, ofi, rivet-base), and ROUND lines.
# Usage: comms.sh ROUNDS LIST BYTES LAT_ITERS [hog|hog:NICE] [warm] [fixed]
#   hog: one busy loop per vCPU at nice 19 (hog:NICE at that niceness) for the whole run
#   warm: `rivet perf --warm` (an untimed first pair before the timed ones)
#   fixed: address-space randomization off, and each plugin run once, untimed, before the rounds.
#     The emulator (TCG) translates a process's code when it first runs it, keyed by its
#     addresses: with them fixed, a new process reuses the translation of the last one, and its
#     first connection costs what it would on hardware (no translation) plus its own first
#     steps (page faults, the kernel's first objects), not what the emulator pays per process.
. /guest/lib.sh
cd /mnt/host || exit 2
rounds=${1:-3} list=${2:-1,16,256,1024} bytes=${3:-256M} lat=${4:-1000}
G=${RXE0_GID_INDEX:-1}
NICE= WARM= FIXED=
for w in "${5:-}" "${6:-}" "${7:-}"; do
  case $w in
    hog) NICE=19 ;;
    hog:*) NICE=${w#hog:} ;;
    warm) WARM=--warm ;;
    fixed) FIXED=1 ;;
  esac
done
plugins=rivet
[ -f peers/libnccl-net-rdma-sharp.so ] && plugins="$plugins nccl-ib"
[ -f peers/libnccl-net-rdma-sharp-32.so ] && plugins="$plugins nccl-ib-32"
[ -f peers/libnccl-net-rivet-base.so ] && plugins="$plugins rivet-base"
if [ -f peers/libnccl-net-ofi.so ]; then
  plugins="$plugins ofi"
  # aws-ofi-nccl will not start without an up interface whose name does not start with veth (or
  # docker, br-, ...): a second veth pair, renamed.
  $IP link add nid0 type veth peer name nid1 && $IP addr add 10.9.0.1/24 dev nid0 &&
    $IP addr add 10.9.0.2/24 dev nid1 && $IP link set nid0 up && $IP link set nid1 up || exit 1
fi
echo "COMMS info plugins=$plugins list=$list bytes=$bytes lat_iters=$lat gid=$G${WARM:+ warm}${FIXED:+ fixed}"
if [ -n "$NICE" ]; then
  start_hogs "$NICE"
  echo "COMMS info cpu_hog=$(nproc) nice=$NICE"
fi
PL=/mnt/host/peers/lib
one() {
  name=$1
  case $1 in
    rivet) set -- env /mnt/host/rivet perf --lib /mnt/host/libnccl-net-rivet.so ;;
    rivet-base) set -- env /mnt/host/rivet perf --lib /mnt/host/peers/libnccl-net-rivet-base.so ;;
    nccl-ib) set -- env LD_LIBRARY_PATH=$PL NCCL_IB_GID_INDEX=$G NCCL_SOCKET_IFNAME=veth0 \
               /mnt/host/rivet perf --lib /mnt/host/peers/libnccl-net-rdma-sharp.so ;;
    nccl-ib-32) set -- env LD_LIBRARY_PATH=$PL NCCL_IB_GID_INDEX=$G NCCL_SOCKET_IFNAME=veth0 \
               /mnt/host/rivet perf --lib /mnt/host/peers/libnccl-net-rdma-sharp-32.so ;;
    ofi) set -- env LD_LIBRARY_PATH=$PL:/mnt/host/peers/ofi-shim NCCL_SOCKET_IFNAME=veth0 \
           FI_PROVIDER=ofi_rxm,verbs FI_VERBS_IFACE=veth0 OFI_NCCL_PROTOCOL=SENDRECV FI_UNIVERSE_SIZE=16 \
           /mnt/host/rivet perf --lib /mnt/host/peers/libnccl-net-ofi.so ;;
  esac
  "$@" --dev 0,1 --comms "$list" $WARM --sizes 1M --bytes "$bytes" --lat-iters "$lat" 2>&1 | sed "s/^/$name /"
}
if [ -n "$FIXED" ]; then
  echo 0 > /proc/sys/kernel/randomize_va_space || exit 1
  for p in $plugins; do one $p > /dev/null; done
fi
r=1
while [ $r -le "$rounds" ]; do
  echo "ROUND $r"
  # Round r starts with the ((r-1) mod k)-th plugin.
  set -- $plugins
  k=$#
  skip=$(( (r - 1) % k ))
  order=
  i=0
  for p in $plugins; do [ $i -ge $skip ] && order="$order $p"; i=$((i + 1)); done
  i=0
  for p in $plugins; do [ $i -lt $skip ] && order="$order $p"; i=$((i + 1)); done
  for p in $order; do one $p; done
  r=$((r + 1))
done
[ -n "${hogs:-}" ] && kill $hogs 2>/dev/null
exit 0
