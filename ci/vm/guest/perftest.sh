#!/bin/sh
# perftest baseline (guest side), rxe0 (client, 10.0.0.1) -> rxe1 (server, 10.0.0.2):
# ib_write_bw at 64 KiB, 1 MiB and 16 MiB, ib_write_lat at 8 bytes. One line per measurement:
#   PERFTEST write_bw size=65536 iters=2000 MBps=27.07 peak_MBps=28.39 secs=6.2
#   PERFTEST write_lat size=8 iters=1000 usec_typical=62.40 usec_avg=71.14 usec_min=53.17 usec_p99=247.07 secs=2.1
# plus "PERFTEST info ..." with the MTUs. Iteration counts (about 100 MB per bandwidth run at
# active_mtu 4096, half that below) keep each run well under 20 s of TCG on a 2-core host.
# Usage: perftest.sh [--quick] [--verbose]
#   --quick    a tenth of the iterations;  --verbose  also print perftest's own result tables
# Run:   ci/vm/run-vm.sh --mtu 9000 /guest/perftest.sh
. "${0%/*}/lib.sh"
div=1 verbose=0
for a in "$@"; do
  case $a in
    --quick) div=10 ;;
    --verbose) verbose=1 ;;
    *) echo "perftest.sh: unknown argument $a"; exit 2 ;;
  esac
done
show() { [ $verbose = 0 ] || awk -v s=$2 '/#bytes/ || $1 == s' /tmp/$1.cli; }

roce_v2_gid rxe0 0a00:0001 || { echo "no RoCE v2 GID on rxe0"; exit 1; }; G0=$GID_INDEX
roce_v2_gid rxe1 0a00:0002 || { echo "no RoCE v2 GID on rxe1"; exit 1; }; G1=$GID_INDEX
read -r netmtu < /sys/class/net/veth0/mtu
ibmtu=$(ibv_devinfo -d rxe0 | awk '/active_mtu:/ { print $2; exit }')
read -r kver < /proc/sys/kernel/osrelease
echo "PERFTEST info kernel=$kver netdev_mtu=$netmtu active_mtu=$ibmtu gid_rxe0=$G0 gid_rxe1=$G1"
[ "${ibmtu:-0}" -ge 4096 ] || div=$((div * 2))     # smaller packets: roughly half the bandwidth

fail=0
bw() {  # SIZE ITERS
  n=$(( $2 / div )); [ $n -ge 5 ] || n=5       # perftest's minimum
  if pt_pair bw$1 ib_write_bw rxe1 $G1 rxe0 $G0 10.0.0.2 -s $1 -n $n; then
    show bw$1 $1
    # client table: #bytes #iterations BW_peak[MB/sec] BW_average[MB/sec] MsgRate[Mpps]
    line=$(awk -v s=$1 -v t=$PT_SECS '$1 == s && NF >= 5 {
             printf "PERFTEST write_bw size=%s iters=%s MBps=%s peak_MBps=%s secs=%s", $1, $2, $4, $3, t; exit }' /tmp/bw$1.cli)
    [ -n "$line" ] && echo "$line" || { echo "PERFTEST write_bw size=$1 error=unparsed"; cat /tmp/bw$1.cli; fail=1; }
  else
    echo "PERFTEST write_bw size=$1 error=failed"; fail=1
  fi
}
lat() {  # SIZE ITERS
  n=$(( $2 / div )); [ $n -ge 5 ] || n=5       # perftest's minimum
  if pt_pair lat$1 ib_write_lat rxe1 $G1 rxe0 $G0 10.0.0.2 -s $1 -n $n; then
    show lat$1 $1
    # #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%  [usec]
    line=$(awk -v s=$1 -v t=$PT_SECS '$1 == s && NF >= 8 {
             printf "PERFTEST write_lat size=%s iters=%s usec_typical=%s usec_avg=%s usec_min=%s usec_p99=%s secs=%s",
                    $1, $2, $5, $6, $3, $8, t; exit }' /tmp/lat$1.cli)
    [ -n "$line" ] && echo "$line" || { echo "PERFTEST write_lat size=$1 error=unparsed"; cat /tmp/lat$1.cli; fail=1; }
  else
    echo "PERFTEST write_lat size=$1 error=failed"; fail=1
  fi
}

bw 65536 1500
bw 1048576 120
bw 16777216 6
lat 8 1000
exit $fail
