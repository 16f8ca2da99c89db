#!/bin/sh
# Instructions per data-path call, in the guest (run by ci/bench_instr.py at MTU 9000): the 8-byte
# ping-pong of `rivet perf` under callgrind (valgrind copied from the host into the share: vg/),
# through rivet and through the peers that are in the share (peers/: NCCL's IB transport,
# aws-ofi-nccl), with the settings of ../shared/peers/README.md. Rank 0 on rxe0, rank 1 on rxe1.
# The initiator sleeps SETTLE us after each isend, so that its test finds the answer.
# rivet runs three times: as the CLI loads it (no profiler callback), as NCCL does without a
# profiler plugin (rivet-cb: a callback at init, no handle with any request) and as NCCL does
# with one (rivet-prof: a handle with every request, each network event reported to the callback);
# NCCL's IB transport runs without a callback and as rivet-prof does (nccl-ib-prof).
# Output: one callgrind file per process in /mnt/host/cg/PLUGIN.PID, and OK/FAIL lines.
# Usage: instr.sh ITERS SETTLE_US
. /guest/lib.sh
cd /mnt/host || exit 2
iters=${1:-300} settle=${2:-5000}
G=${RXE0_GID_INDEX:-1}
mkdir -p /mnt/host/cg
export VALGRIND_LIB=/mnt/host/vg
plugins="rivet rivet-cb rivet-prof"
[ -f peers/libnccl-net-rdma-sharp.so ] && plugins="$plugins nccl-ib nccl-ib-prof"
if [ -f peers/libnccl-net-ofi.so ]; then
  plugins="$plugins ofi"
  # aws-ofi-nccl will not start without an up interface whose name does not start with veth.
  $IP link add nid0 type veth peer name nid1 && $IP addr add 10.9.0.1/24 dev nid0 &&
    $IP addr add 10.9.0.2/24 dev nid1 && $IP link set nid0 up && $IP link set nid1 up || exit 1
fi
PL=/mnt/host/peers/lib
rc=0
for name in $plugins; do
  prof=none
  case $name in
    rivet-cb) prof=callback ;;
    rivet-prof|nccl-ib-prof) prof=events ;;
  esac
  case $name in
    rivet*) set -- env ;;
    nccl-ib*) set -- env LD_LIBRARY_PATH=$PL NCCL_IB_GID_INDEX=$G NCCL_SOCKET_IFNAME=veth0 ;;
    ofi) set -- env LD_LIBRARY_PATH=$PL:/mnt/host/peers/ofi-shim NCCL_SOCKET_IFNAME=veth0 \
           FI_PROVIDER=ofi_rxm,verbs FI_VERBS_IFACE=veth0 OFI_NCCL_PROTOCOL=SENDRECV FI_UNIVERSE_SIZE=16 ;;
  esac
  case $name in
    rivet*) lib=/mnt/host/libnccl-net-rivet.so ;;
    nccl-ib*) lib=/mnt/host/peers/libnccl-net-rdma-sharp.so ;;
    ofi) lib=/mnt/host/peers/libnccl-net-ofi.so ;;
  esac
  if "$@" /mnt/host/vg/valgrind --tool=callgrind --trace-children=yes --callgrind-out-file=/mnt/host/cg/$name.%p \
       /mnt/host/rivet perf --lib $lib --dev 0,1 --sizes 8 --bytes 8 --lat-iters "$iters" --lat-settle "$settle" --profiler $prof \
       > /tmp/$name.out 2>&1; then
    echo "OK $name"
    grep -h '# profiler events' /tmp/$name.out | sed "s/^/PROFILER $name /"
  else
    echo "FAIL $name"; grep -v '^==' /tmp/$name.out | tail -20; rc=1
  fi
done
exit $rc
