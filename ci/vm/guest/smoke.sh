#!/bin/sh
# Soft-RoCE smoke test (guest side): both rxe devices are PORT_ACTIVE, each has an IPv4 RoCE v2
# GID, RDMA WRITE works rxe0 -> rxe1 across the veth pair and rxe0 -> rxe0 in loopback.
# Run: ci/vm/run-vm.sh /guest/smoke.sh     (or from a share: --share DIR /mnt/host/smoke.sh)
. "${0%/*}/lib.sh"
fail=0
bad() { echo "SMOKE FAIL: $*"; fail=1; }

echo "=== ibv_devinfo"
ibv_devinfo > /tmp/devinfo 2>&1 || bad "ibv_devinfo failed"
cat /tmp/devinfo
active=$(awk '/hca_id:/ { d = $2 } /state:/ && /PORT_ACTIVE/ { printf "%s ", d }' /tmp/devinfo)
for d in rxe0 rxe1; do
  case " $active" in *" $d "*) ;; *) bad "$d is not PORT_ACTIVE (active: '$active')" ;; esac
done
echo "PORT_ACTIVE: $active"

echo "=== rdma link"
$RDMA link show

echo "=== GIDs"
roce_v2_gid rxe0 0a00:0001 || bad "rxe0 has no RoCE v2 GID for 10.0.0.1"; G0=$GID_INDEX
roce_v2_gid rxe1 0a00:0002 || bad "rxe1 has no RoCE v2 GID for 10.0.0.2"; G1=$GID_INDEX
echo "RoCE v2 IPv4 GID index: rxe0=$G0 rxe1=$G1"
[ $fail = 0 ] || exit 1

N=200
echo "=== ib_write_bw rxe0 -> rxe1 (64 KiB x $N, over veth0/veth1)"
counter veth0 tx; v0=$COUNT; counter lo tx; l0=$COUNT
if pt_pair cross ib_write_bw rxe1 $G1 rxe0 $G0 10.0.0.2 -s 65536 -n $N; then
  counter veth0 tx; v1=$COUNT; counter lo tx; l1=$COUNT
  awk '/#bytes/ || $1 == 65536' /tmp/cross.cli
  echo "veth0 tx_packets +$((v1 - v0)), lo tx_packets +$((l1 - l0)), ${PT_SECS}s"
  # 64 KiB messages at rxe MTU <= 4096 are at least 16 packets each
  [ $((v1 - v0)) -ge $((N * 16)) ] || bad "too few packets on veth0: the traffic did not cross the veth"
else
  bad "ib_write_bw rxe0 -> rxe1"
fi

echo "=== ib_write_bw rxe0 -> rxe0 (loopback, 64 KiB x $N)"
if pt_pair loop ib_write_bw rxe0 $G0 rxe0 $G0 10.0.0.1 -s 65536 -n $N; then
  awk '/#bytes/ || $1 == 65536' /tmp/loop.cli
  echo "${PT_SECS}s"
else
  bad "ib_write_bw rxe0 -> rxe0"
fi

[ $fail = 0 ] && echo "SMOKE PASS" || echo "SMOKE FAILED"
exit $fail
