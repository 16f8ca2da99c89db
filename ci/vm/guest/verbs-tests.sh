#!/bin/sh
# rivet over RDMA verbs, inside the Soft-RoCE guest (busybox sh). Run by ci/vm-test.sh, which puts
# the plugin, the conformance driver, the rivet CLI and the fault-test binary in the share
# (/mnt/host). Prints one "VERBS name PASS|FAIL (seconds)" line per step and exits with the
# number of failed steps.
cd /mnt/host || exit 2
export RIVET_TIMEOUT=10
# The conformance driver checks that rivet reports profiler events for every send and receive over
# verbs (v10+), and that the send events carry exactly the bytes sent.
export RIVET_CONFORMANCE_NET_EVENTS=1
LIB=/mnt/host/libnccl-net-rivet.so
failed=0
results=
allowed_skip='^SKIP api=[678] case=optional [(]skipped: api [678] < 9[)]$'
. /mnt/host/lib.sh
step() { # step NAME COMMAND...
  _name=$1; shift
  # ci/vm-test.sh's RIVET_VM_STEPS: a regex of the steps to run.
  [ -f /mnt/host/steps ] && ! echo "$_name" | grep -qE "$(cat /mnt/host/steps)" && return 0
  read -r _t0 _ < /proc/uptime
  echo "=== $_name: $*"
  "$@" > /tmp/step.log 2>&1; _rc=$?
  read -r _t1 _ < /proc/uptime
  _dt=$(awk "BEGIN { printf \"%.1f\", $_t1 - $_t0 }")
  # A skip is never a pass: a step whose log has a SKIP line fails, but for the documented one
  # (the optional case below v9, whose functions those versions do not have).
  if [ $_rc = 0 ] && grep -E '^SKIP ' /tmp/step.log | grep -vqE "$allowed_skip"; then
    echo "a SKIP in a step that must run here:"; grep -E '^SKIP ' /tmp/step.log | grep -vE "$allowed_skip"; _rc=99
  fi
  if [ $_rc = 0 ]; then _v=PASS; else _v="FAIL rc=$_rc"; failed=$((failed + 1)); fi
  # Passing steps show their summary lines; failing ones their whole log.
  if [ $_rc = 0 ]; then grep -E '^(PASS|SKIP|test |#|rivet)' /tmp/step.log | grep -v '^test .* ok$' | tail -40
  else cat /tmp/step.log; fi
  echo "VERBS $_name $_v (${_dt}s)"
  results="$results
VERBS $_name $_v (${_dt}s)"
}

# The devices, and the GPUDirect facts of each: rxe has no dma-buf support (EOPNOTSUPP from the
# ibv_reg_dmabuf_mr probe) and the guest has no peer-memory module.
devices() {
  NCCL_DEBUG=INFO ./rivet info --lib $LIB > /tmp/info.log 2>&1 || { cat /tmp/info.log; return 1; }
  cat /tmp/info.log
  [ "$(grep -c 'GPUDirect: peer memory none .*, dma-buf no (rxe[01] does not support dma-buf registration' /tmp/info.log)" = 2 ] || { echo "GPUDirect facts of rxe0/rxe1 not as expected"; return 1; }
}
step devices devices
# rivet doctor on rxe0/rxe1 (the VM runs at veth MTU 9000): both ports active, MTU 4096 at netdev
# MTU 9000 with no MTU warning, a RoCE v2 GID chosen, the verbs transport; a saved baseline
# diffs clean.
doctor() {
  ./rivet doctor > /tmp/doc.log 2>&1; _rc=$?
  cat /tmp/doc.log
  [ $_rc = 0 ] || return 1
  for d in rxe0 rxe1; do
    grep -q "$d:1: ACTIVE (LinkUp), Ethernet (RoCE), MTU 4096 (max 4096), .* netdev veth[01] MTU 9000" /tmp/doc.log || { echo "$d's port line is not as expected"; return 1; }
  done
  [ "$(grep -c 'rivet uses GID [0-9]* (RoCE v2 preferred' /tmp/doc.log)" = 2 ] || { echo "no GID choice for both ports"; return 1; }
  grep -q '== RDMA devices and ports: OK 2 usable port(s)' /tmp/doc.log || { echo "RDMA verdict not OK"; return 1; }
  grep -q "== Transport: OK NCCL gets rivet's RDMA verbs transport" /tmp/doc.log || { echo "transport verdict not OK"; return 1; }
  grep -q 'runs at MTU' /tmp/doc.log && { echo "an MTU warning at matching MTUs"; return 1; }
  ./rivet doctor --save /tmp/base.json > /dev/null 2>&1 && ./rivet doctor --diff /tmp/base.json > /tmp/diff.log 2>&1 || { cat /tmp/diff.log; echo "doctor --diff of an unchanged node failed"; return 1; }
  grep -q 'gid_chosen' /tmp/base.json || { echo "the baseline lacks the GID choice"; return 1; }
  ./rivet doctor --selftest > /tmp/self.log 2>&1; _rc=$?
  sed -n '/Self-test/,$p' /tmp/self.log
  [ $_rc = 0 ] && grep -q '== Self-test: OK 2 of 2 loopback transfer(s) passed' /tmp/self.log || { cat /tmp/self.log; echo "the self-test failed"; return 1; }
}
step doctor doctor
for api in 12 11 10 9 8 7 6; do
  step "conformance-v$api-rxe0-rxe1" ./conformance --lib $LIB --api $api --dev 0 --dev2 1
  step "conformance-v$api-rxe0-rxe0" ./conformance --lib $LIB --api $api --dev 0 --dev2 0
done
# Every message by rendezvous (no eager ring traffic but empty messages) on two QPs, and a large
# eager limit with four QPs per connection.
# Adaptive routing forced on (rxe is RoCE: auto leaves it off), every message split from its
# completion (threshold 0) and credits written one at a time.
step conformance-v12-ar env NCCL_IB_ADAPTIVE_ROUTING=1 NCCL_IB_AR_THRESHOLD=0 NCCL_IB_QPS_PER_CONNECTION=2 ./conformance --lib $LIB --api 12 --dev 0 --dev2 1
step conformance-v12-eager0-2qp env RIVET_IB_EAGER_MAX=0 NCCL_IB_QPS_PER_CONNECTION=2 ./conformance --lib $LIB --api 12 --dev 0 --dev2 1
step conformance-v12-eager64k-4qp env RIVET_IB_EAGER_MAX=65536 NCCL_IB_QPS_PER_CONNECTION=4 ./conformance --lib $LIB --api 12 --dev 0 --dev2 1
# Four queue pairs, each message split over all of them (NCCL_IB_SPLIT_DATA_ON_QPS=1; the steps
# above use net_ib's default 0: one queue pair per message, rotating), with adaptive routing too.
step conformance-v12-split-4qp env NCCL_IB_SPLIT_DATA_ON_QPS=1 NCCL_IB_QPS_PER_CONNECTION=4 ./conformance --lib $LIB --api 12 --dev 0 --dev2 1
step conformance-v12-split-4qp-ar env NCCL_IB_SPLIT_DATA_ON_QPS=1 NCCL_IB_QPS_PER_CONNECTION=4 NCCL_IB_ADAPTIVE_ROUTING=1 NCCL_IB_AR_THRESHOLD=0 ./conformance --lib $LIB --api 12 --dev 0 --dev2 1
# The staging engine over verbs: every buffer through a registered bounce buffer and the host
# copier (RIVET_STAGE_HOST=1), all cases, and RIVET_STATS must show the staged messages.
staged() {
  NCCL_DEBUG=INFO RIVET_STATS=1 RIVET_STAGE_HOST=1 ./conformance -v --lib $LIB --api "$1" --dev 0 --dev2 1 > /tmp/st.log 2>&1 || { cat /tmp/st.log; return 1; }
  grep -E '^(PASS|SKIP)' /tmp/st.log
  grep -q 'staged [^/]*/ [1-9]' /tmp/st.log || { echo "no message went through the staging engine"; return 1; }
  grep -q 'staged sends pipelined with their copy' /tmp/st.log || { echo "no staged send was handed to the transport before its copy finished"; return 1; }
  grep -q 'host [^/]*/ [1-9]' /tmp/st.log && { echo "a registered buffer bypassed the staging engine"; grep 'stats ' /tmp/st.log; return 1; }
  # The lines users confirm decisions by carry NCCL's INIT flag (0x1; with NET, 0x11), so NCCL's
  # default NCCL_DEBUG_SUBSYS shows them: each connection's transport and queue pairs, the stats.
  for what in 'NET/rivet: connected to .* with [0-9]* QP' 'NET/rivet: accepted from .* with [0-9]* QP' 'NET/rivet: stats '; do
    grep -q "plugin INFO (flags 0x11) .*$what" /tmp/st.log || { echo "no INIT|NET line matching '$what'"; grep 'plugin INFO' /tmp/st.log | head; return 1; }
  done
  return 0
}
step staged-v12-rxe0-rxe1 staged 12
step staged-v8-rxe0-rxe1 staged 8
# The shallowest queues the protocol allows (RIVET_IB_MIN_QUEUES=1): sends and receives must wait
# for room in the send queues and for posted receives (RIVET_STATS counts the waits at close),
# and every case still passes, plain, with four QPs, and staged (rendezvous sends posted in parts).
minq() {
  NCCL_DEBUG=INFO RIVET_STATS=1 RIVET_IB_MIN_QUEUES=1 "$@" -v --lib $LIB --api 12 --dev 0 --dev2 1 > /tmp/mq.log 2>&1 || { cat /tmp/mq.log; return 1; }
  grep -E '^(PASS|SKIP)' /tmp/mq.log
  grep 'waited for room' /tmp/mq.log | head -3 | sed 's/^/# /'
  grep -q 'waited for room' /tmp/mq.log || { echo "no post waited for room"; return 1; }
}
step minqueues-v12 minq ./conformance
step minqueues-v12-4qp minq env NCCL_IB_QPS_PER_CONNECTION=4 ./conformance
step minqueues-staged-v12 minq env RIVET_STAGE_HOST=1 ./conformance
# Staged streaming of 4 MiB messages (posted in 4 parts) into send queues of 8: newly ready parts
# wait for room, and are posted by later calls.
step minqueues-staged-perf env RIVET_IB_MIN_QUEUES=1 RIVET_STAGE_HOST=1 ./rivet perf --check --lib $LIB --dev 0,1 --sizes 64K,4M --bytes 16M --lat-iters 50
# A staged ping-pong over verbs in which each rank waits only on its receive: staged sends must
# move on from the receive comm's calls; then streaming with partial (pipelined) rendezvous sends.
step staged-perf env RIVET_STAGE_HOST=1 ./rivet perf --check --lib $LIB --dev 0,1 --sizes 64K,4M --bytes 16M --lat-iters 50
# QoS reaches the wire: rxe copies a queue pair's traffic class into the IP header's DS field, so
# tc filters on each veth's egress count RoCE v2 packets (UDP to 4791) by TOS: 104 (NCCL_IB_TC),
# 184 (NCCL_IB_FIFO_TC), 72 (the communicator's trafficClass), 0, and any other. Rank 0 (rxe0)
# sends from veth0 and rank 1 (rxe1) from veth1; each rank's send comm carries data in the
# sender's class, and its receive comm clear-to-sends and credits in the FIFO class.
qos_filters() {
  for _d in veth0 veth1; do
    /usr/bin/tc qdisc del dev $_d clsact 2>/dev/null
    /usr/bin/tc qdisc add dev $_d clsact || return 1
    _pref=1
    for _tos in 104 184 72 0; do
      /usr/bin/tc filter add dev $_d egress pref $_pref protocol ip u32 match ip protocol 17 0xff \
        match ip dport 4791 0xffff match ip dsfield $_tos 0xff action pass || return 1
      _pref=$((_pref + 1))
    done
    /usr/bin/tc filter add dev $_d egress pref 9 protocol ip u32 match ip protocol 17 0xff match ip dport 4791 0xffff action pass || return 1
  done
}
# "veth0: 104=N 184=N 72=N 0=N other=N": packets each filter counted.
qos_counts() {
  /usr/bin/tc -s filter show dev $1 egress | awk -v d=$1 '
    / pref [0-9]+ / { for (i = 1; i < NF; i++) if ($i == "pref") cur = $(i + 1) }
    /Sent [0-9]+ bytes [0-9]+ pkt/ { for (i = 1; i < NF; i++) if ($i == "bytes") n[cur] += $(i + 1) }
    END { printf "%s: 104=%d 184=%d 72=%d 0=%d other=%d\n", d, n[1], n[2], n[3], n[4], n[9] }'
}
# qos_run "EXPECTED" ENV/ARGS...: one short rivet perf, then each veth's counts must be nonzero
# exactly for the TOS values in EXPECTED (space-separated).
qos_run() {
  _want=$1; shift
  qos_filters || { echo "tc filters could not be set up"; return 1; }
  env "$@" --lib $LIB --dev 0,1 --sizes 64K --bytes 4M --lat-iters 50 > /tmp/qos.log 2>&1 || { cat /tmp/qos.log; return 1; }
  for _d in veth0 veth1; do
    _c=$(qos_counts $_d)
    echo "# $* -> $_c"
    for _k in 104 184 72 0 other; do
      _n=$(echo "$_c" | sed -n "s/.* $_k=\([0-9]*\).*/\1/p")
      case " $_want " in
        *" $_k "*) [ "$_n" -gt 0 ] || { echo "$_d: no RoCE packet with TOS $_k"; return 1; } ;;
        *) [ "$_n" = 0 ] || { echo "$_d: $_n RoCE packets with TOS $_k, which this run should not send"; return 1; } ;;
      esac
    done
  done
}
qos() {
  qos_run "0" ./rivet perf --check || return 1
  qos_run "104 184" NCCL_IB_TC=104 NCCL_IB_FIFO_TC=184 ./rivet perf --check || return 1
  qos_run "104" NCCL_IB_TC=104 ./rivet perf --check || return 1
  qos_run "72" ./rivet perf --check --traffic-class 72 || return 1
  qos_run "72" ./rivet perf --check --abi 10 --traffic-class 72 || return 1
  qos_run "104" NCCL_IB_TC=104 ./rivet perf --check --traffic-class 72 || return 1
  for _d in veth0 veth1; do /usr/bin/tc qdisc del dev $_d clsact; done
}
step qos qos
# ECE (NCCL_IB_ECE_ENABLE): rxe has none (ibv_query_ece answers EOPNOTSUPP), so each process
# says so once for its device, at INFO, and connects without it; with ECE off nothing is asked.
ece() {
  NCCL_DEBUG=INFO ./rivet perf --check --lib $LIB --dev 0,1 --sizes 64K --bytes 4M --lat-iters 20 > /tmp/ece.log 2>&1 || { cat /tmp/ece.log; return 1; }
  grep "enhanced connection establishment" /tmp/ece.log | sed 's/^/# /'
  for _d in rxe0 rxe1; do
    [ "$(grep -c "$_d: no enhanced connection establishment (ECE) (ibv_query_ece: not supported)" /tmp/ece.log)" = 1 ] || { echo "$_d's lack of ECE was not logged exactly once"; return 1; }
  done
  grep -q "ECE 0x" /tmp/ece.log && { echo "a connection claims an ECE on rxe"; return 1; }
  NCCL_IB_ECE_ENABLE=0 NCCL_DEBUG=INFO ./rivet perf --check --lib $LIB --dev 0,1 --sizes 64K --bytes 4M --lat-iters 20 > /tmp/ece.log 2>&1 || { cat /tmp/ece.log; return 1; }
  grep -q "enhanced connection establishment" /tmp/ece.log && { echo "ECE was asked for with NCCL_IB_ECE_ENABLE=0"; return 1; }
  return 0
}
step ece ece
step badrkey ./conformance --lib $LIB --api 12 --dev 0 --dev2 1 --case badrkey
# A receiver 2.5 x RIVET_TIMEOUT late (alive, not calling the plugin) gets 4 x 16 MiB intact:
# the sender waits for its clear-to-send, the out-of-band socket stays up, RNR retries forever.
step late env RIVET_TIMEOUT=4 ./conformance --lib $LIB --api 12 --dev 0 --dev2 1 --case late
# The Rust fault tests whose subject is the same on both transports (the out-of-band listener,
# closing with requests in flight, configuration warnings), here over verbs.
# exact BINARY NAMES...: the Rust tests of that name only, and all of them must have run and
# passed (a renamed test fails the step instead of dropping out of it).
exact() {
  _bin=$1; shift
  ./$_bin --exact --test-threads=1 "$@" > /tmp/fl.log 2>&1; _rc=$?
  cat /tmp/fl.log
  [ $_rc = 0 ] || return 1
  grep -q "^test result: ok. $# passed; 0 failed; 0 ignored" /tmp/fl.log || { echo "not all $# named tests of $_bin ran and passed"; return 1; }
}
step faults exact faults \
  garbage_from_a_foreign_client_is_rejected_and_the_real_peer_still_connects \
  a_handle_with_a_wrong_magic_is_rejected_and_the_real_peer_still_connects \
  a_truncated_handshake_is_rejected a_silent_client_is_dropped_after_the_timeout_without_blocking_accept \
  closing_with_requests_in_flight_releases_every_descriptor an_invalid_setting_warns_with_what_it_accepts
# NCCL's threads at once over verbs (tests/threads.rs): progress, service and main threads on comms
# that come and go, a minute each plain and staged, every byte checked.
threads() {
  export RIVET_THREADS_SECS=60
  exact threads nccl_s_threads_at_once nccl_s_threads_at_once_staged; _r=$?
  unset RIVET_THREADS_SECS
  return $_r
}
step threads threads
step allreduce ./rivet allreduce --ranks 4 --lib $LIB -b 8 -e 4M -f 8 --iters 3 --warmup 1
# The soak over verbs (rxe0 <-> rxe1), host then staged buffers: every byte checked, no growth.
step soak ./rivet soak --lib $LIB --dev 0,1 --minutes ${RIVET_SOAK_MINUTES:-3} --max-size 4M
# NIC fusion: a second wire, and each rank a virtual NIC of two ports, rxe0+rxe2 (devices 0, 2)
# against rxe1+rxe3 (1, 3). Every ABI version with makeVDevice runs the conformance cases on it;
# rivet perf with RIVET_STATS=1 must show the bulk sender's (rank 0's) bytes on both of its
# members, and rank 1's 8-byte answers on its first member only (small messages stay on one).
wire2() {
  second_pair || { echo "rxe2/rxe3 did not come up"; return 1; }
  ./rivet info --lib $LIB 2>&1 | grep -E "rxe[0-3]"
}
step second-wire wire2
for api in 9 10 11 12; do
  step "fused-conformance-v$api" ./conformance --lib $LIB --api $api --fuse 0,2 --fuse2 1,3
done
step fused-conformance-v12-eager0-4qp env RIVET_IB_EAGER_MAX=0 NCCL_IB_QPS_PER_CONNECTION=2 ./conformance --lib $LIB --api 12 --fuse 0,2 --fuse2 1,3
step fused-conformance-v12-ar env NCCL_IB_ADAPTIVE_ROUTING=1 NCCL_IB_AR_THRESHOLD=0 ./conformance --lib $LIB --api 12 --fuse 0,2 --fuse2 1,3
# NCCL_IB_SUBNET_AWARE_ROUTING=1: the rails are two subnets (rxe0/rxe1 on 10.0.0.0/24, rxe2/rxe3
# on 10.0.1.0/24). Rank 0 is given rxe2 and rank 1 rxe1: each connect moves to the device on its
# listener's subnet (the first such device: rxe0, and rxe2, the listener's own, as both ranks
# share the VM) and says so; the case passes. With /16 both rails are one subnet: nothing moves.
subnet() {
  NCCL_IB_SUBNET_AWARE_ROUTING=1 NCCL_DEBUG=INFO ./conformance -v --lib $LIB --api 12 --dev 2 --dev2 1 --case sizes > /tmp/sn.log 2>&1 || { cat /tmp/sn.log; return 1; }
  grep -E '^(PASS|SKIP)' /tmp/sn.log
  grep "NCCL_IB_SUBNET_AWARE_ROUTING" /tmp/sn.log | sed 's/^/# /'
  grep -q "device 2 is not on the listener's subnet; using device 0 (rxe0)" /tmp/sn.log || { echo "rank 0's connect did not move to rxe0"; return 1; }
  grep -q "device 1 is not on the listener's subnet; using device 2 (rxe2)" /tmp/sn.log || { echo "rank 1's connect did not move to rxe2"; return 1; }
  # With /16 rxe2 and rxe1 stay paired, on two wires the VM does not route between: no data can
  # flow, so the connections alone (the connect case), whose exit status counts.
  NCCL_IB_SUBNET_AWARE_ROUTING=1 NCCL_IB_SUBNET_PREFIX_LEN=16 NCCL_DEBUG=INFO ./conformance -v --lib $LIB --api 12 --dev 2 --dev2 1 --case connect > /tmp/sn.log 2>&1 || { echo "the /16 run failed"; cat /tmp/sn.log; return 1; }
  grep -E '^(PASS|SKIP)' /tmp/sn.log
  grep -q "not on the listener's subnet" /tmp/sn.log && { echo "a connect moved although /16 puts both rails in one subnet"; return 1; }
  grep -q "connected to .* over rxe2:1 .* -> rxe1 " /tmp/sn.log || { echo "rank 0 did not connect over rxe2 to rxe1 with /16"; cat /tmp/sn.log; return 1; }
  return 0
}
step subnet-aware subnet
# NCCL_IB_WARN_RAIL_LOCAL=1: a fused rxe0+rxe2 against rxe1+rxe3 (other devices on each side)
# logs net_ib's INFO at accept; the same members on both sides, or the variable unset, do not.
raillocal() {
  NCCL_IB_WARN_RAIL_LOCAL=1 NCCL_DEBUG=INFO ./conformance -v --lib $LIB --api 12 --fuse 0,2 --fuse2 1,3 --case sizes > /tmp/rl.log 2>&1 || { cat /tmp/rl.log; return 1; }
  grep -m2 "mismatched physical devices" /tmp/rl.log | sed 's/^/# /'
  grep -qE "mismatched physical devices between local \((0,2|1,3)\) and remote \((1,3|0,2)\)" /tmp/rl.log || { echo "no INFO about the mismatched members"; return 1; }
  NCCL_IB_WARN_RAIL_LOCAL=1 NCCL_DEBUG=INFO ./conformance -v --lib $LIB --api 12 --fuse 0,2 --fuse2 0,2 --case sizes > /tmp/rl.log 2>&1 || { cat /tmp/rl.log; return 1; }
  grep -q "mismatched physical devices" /tmp/rl.log && { echo "an INFO about members that match"; return 1; }
  NCCL_DEBUG=INFO ./conformance -v --lib $LIB --api 12 --fuse 0,2 --fuse2 1,3 --case sizes > /tmp/rl.log 2>&1 || { cat /tmp/rl.log; return 1; }
  grep -q "mismatched physical devices" /tmp/rl.log && { echo "an INFO without NCCL_IB_WARN_RAIL_LOCAL"; return 1; }
  return 0
}
step rail-local raillocal
fused_perf() {
  RIVET_STATS=1 NCCL_DEBUG=INFO ./rivet perf --check --lib $LIB --dev 0+2,1+3 --sizes 64K,4M --bytes 32M --lat-iters 100 > /tmp/fp.log 2>&1 || { cat /tmp/fp.log; return 1; }
  grep -E "^#|^ +[0-9]|made virtual device|striped" /tmp/fp.log | sort | uniq -c | sort -rn | head -20
  grep "bytes sent per member" /tmp/fp.log | head -4
  grep -qE "bytes sent per member: rxe0:1 [1-9][0-9]*, rxe2:1 [1-9]" /tmp/fp.log || { echo "no stats line shows bytes on both of rank 0's members"; return 1; }
  grep -qE "bytes sent per member: rxe1:1 [1-9][0-9]*, rxe3:1 0[[:space:]]*$" /tmp/fp.log || { echo "rank 1's small answers did not stay on its first member"; return 1; }
}
step fused-perf fused_perf
# A checksummed stream through the fused pair, adaptive routing forced on: every byte checked.
step fused-soak env NCCL_IB_ADAPTIVE_ROUTING=1 ./rivet soak --lib $LIB --dev 0+2,1+3 --minutes 1 --max-size 4M
# conns PATTERN FILE: how many distinct connections (the "(peer ADDR)" their lines name) logged
# PATTERN. Counted per connection, not per line: on a slow host a member can also fail on its
# own (its writes exhausting NCCL_IB_RETRY_CNT's few retries during a stall of the VM), and the
# comm fails over, takes it back (recovery) and fails over again when the wire goes down: more
# lines, the same connections, every byte still checked.
conns() { grep -E "$1" "$2" | grep -oE '[(]peer [^)]*[)]' | sort -u | wc -l; }
# calls_ok FILE: no isend, irecv or test call of the soak took 450 ms or more, on either rank: a
# failover is taken up again at later calls, never waited for inside one (NCCL's proxy thread
# serves every other connection meanwhile). Measured here: 118-143 ms in a soak without
# failures (the longest are posts of 4 MiB, which rxe packetizes inside the call), 127-186 ms
# with the failover, 508-517 ms when the failover waited for its drain inside `test`.
calls_ok() {
  awk 'match($0, /longest data-path call [0-9.]+ ms/) { n++; split(substr($0, RSTART, RLENGTH), w, " "); if (w[4] + 0 >= 450) bad++ } END { exit (n == 2 && !bad) ? 0 : 1 }' "$1" \
    || { echo "a data-path call took 450 ms or more (or a rank did not say):"; grep -oE 'longest data-path call [0-9.]+ ms [(][a-z]+[)]' "$1"; return 1; }
}
# Failover: the same checksummed stream over the fused pair (host buffers, both directions), and
# one member's wire (veth2: rxe2 <-> rxe3) failing 20 s in. "down": the link goes down (each side
# sees its port's PORT_ERR); "loss": every packet leaving veth2 is dropped (tc netem), the ports
# stay up, and only the senders find out (their writes exhaust the transport's retries), so each
# receiver learns of it from its sender's notice over the out-of-band socket. The stream must go
# on over the other member and end with every byte right, WARNs must name the failed port and
# its cause, and every comm must say it failed over. The soak's 10-second lines give the
# bandwidth before and after. Then the wire comes back (a comm does not take a failed member
# back; new comms use it again). Soft-RoCE retries for ever at NCCL_IB_RETRY_CNT=7 (it reads 7
# as "infinite"), so 3 retries of 1.07 s here (NCCL_IB_TIMEOUT=18: 268 ms at 16 was short enough
# for a stall of the VM on a loaded CI host to exhaust them once before the wire went down).
failover() {  # failover down|loss [ENV...]
  _how=$1; shift
  # Three steps share the log: the last one's lines go first, so that the waits below see this run's.
  rm -f /tmp/fo.log
  env RIVET_TIMEOUT=30 NCCL_DEBUG=INFO NCCL_IB_TIMEOUT=18 NCCL_IB_RETRY_CNT=3 "$@" \
    ./rivet soak --lib $LIB --dev 0+2,1+3 --minutes 1 --max-size 4M --buffers host > /tmp/fo.log 2>&1 &
  _p=$!
  # 20 s in: once the soak has reported its second 10 seconds.
  wait_for /tmp/fo.log '^# soak .* t=[0-9]+s: received' 2 900 $_p || { echo "the soak did not report 20 s of traffic"; cat /tmp/fo.log; kill -9 $_p; return 1; }
  if [ $_how = down ]; then /usr/bin/ip link set veth2 down; else /usr/bin/tc qdisc add dev veth2 root netem loss 100%; fi
  _i=0; while kill -0 $_p 2>/dev/null && [ $_i -lt 240 ]; do sleep 0.5; _i=$((_i + 1)); done
  _stuck=0; kill -0 $_p 2>/dev/null && { _stuck=1; kill -9 $_p; }
  wait $_p; _rc=$?
  /usr/bin/tc qdisc del dev veth2 root 2>/dev/null
  wire_up 1 || { echo "the second wire did not come back"; return 1; }
  grep -E "^# soak|WARN.*(rxe[23]|fail)|failed over|drain" /tmp/fo.log | cut -c1-400 | head -40
  [ $_stuck = 0 ] || { echo "rivet soak still running 2 min after the member failed"; cat /tmp/fo.log; return 1; }
  [ $_rc = 0 ] || { echo "rivet soak failed (rc $_rc)"; cat /tmp/fo.log; return 1; }
  [ "$(grep -c 'wrong bytes.*: PASS' /tmp/fo.log)" = 2 ] || { echo "not both ranks passed the checksums"; return 1; }
  if [ $_how = down ]; then
    grep -qE "WARN.*on rxe2:1 failed: .*(PORT_ERR|DOWN)" /tmp/fo.log || { echo "no WARN names rxe2 and the port going down"; return 1; }
    grep -qE "WARN.*on rxe3:1 failed: .*(PORT_ERR|DOWN)" /tmp/fo.log || { echo "no WARN names rxe3 and the port going down"; return 1; }
  else
    grep -qE "WARN.*on rxe[23]:1 failed: .*RETRY_EXC" /tmp/fo.log || { echo "no WARN names the member whose writes exhausted their retries"; return 1; }
  fi
  [ "$(conns 'told the sender what arrived' /tmp/fo.log)" -eq 2 ] || { echo "not both receivers failed over"; cat /tmp/fo.log; return 1; }
  [ "$(conns "the receiver's account" /tmp/fo.log)" -eq 2 ] || { echo "not both senders failed over"; cat /tmp/fo.log; return 1; }
  calls_ok /tmp/fo.log
}
step fused-failover failover down
step fused-failover-ar failover down NCCL_IB_ADAPTIVE_ROUTING=1
step fused-failover-loss failover loss
# soak_ends PID LOG: a soak started with the fused pair's member back ends within 2 min (else its
# threads are dumped and it is killed), with rc 0 and both ranks' checksums passed.
soak_ends() {
  _i=0; while kill -0 $1 2>/dev/null && [ $_i -lt 240 ]; do sleep 0.5; _i=$((_i + 1)); done
  _stuck=0; kill -0 $1 2>/dev/null && { _stuck=1; dump_threads rivet; kill -9 $1; }
  wait $1; _rc=$?
  grep -E "^# soak|^# rank|WARN|down at setup|failed over|took back|bytes sent per member" $2 | cut -c1-400 | head -40
  [ $_stuck = 0 ] || { echo "rivet soak still running 2 min after the member came back"; cat $2; return 1; }
  [ $_rc = 0 ] || { echo "rivet soak failed (rc $_rc)"; cat $2; return 1; }
  [ "$(grep -c 'wrong bytes.*: PASS' $2)" = 2 ] || { echo "not both ranks passed the checksums"; return 1; }
}
# back_in_use FILE: each of the two bulk senders sent more on rxe2/rxe3 by the end than when it
# took the member back (RIVET_STATS' bytes per member at close against the take-back line's).
back_in_use() {
  awk '/took back queue pair.*bytes sent per member so far/ { match($0, /\(peer [^)]*\)/); p = substr($0, RSTART, RLENGTH); n = split($0, a, /rxe[23]:1 /); split(a[n], b, /[^0-9]/); at[p] = b[1] }
       /stats .*bytes sent per member:/ { match($0, /\(peer [^)]*\)/); p = substr($0, RSTART, RLENGTH); n = split($0, a, /rxe[23]:1 /); split(a[n], b, /[^0-9]/); end[p] = b[1] }
       END { ok = 0; for (p in at) { print "# sender " p ": on its second member " at[p] " bytes when taken back, " end[p] " at close"; if (end[p] + 0 > at[p] + 0) ok++ } exit ok == 2 ? 0 : 1 }' "$1" \
    || { echo "a sender did not use its second member again after taking it back"; return 1; }
}
# Recovery (NCCL_IB_RESILIENCY_PORT_RECOVERY=1): veth2 goes down 15 s into the soak and comes back
# 10 s later. Every comm must fail over, then take the member back (the receiver resets its side
# and asks, the sender resets its side and answers), both ranks must pass their checksums, and
# each bulk sender must have sent more on rxe2/rxe3 by the end than when it took it back
# (RIVET_STATS' bytes per member at close against the take-back line's).
recovery() {
  env RIVET_TIMEOUT=30 NCCL_DEBUG=INFO RIVET_STATS=1 NCCL_IB_RESILIENCY_PORT_RECOVERY=1 NCCL_IB_TIMEOUT=18 NCCL_IB_RETRY_CNT=3 \
    ./rivet soak --lib $LIB --dev 0+2,1+3 --minutes 1 --max-size 4M --buffers host > /tmp/rc.log 2>&1 &
  _p=$!
  wait_for /tmp/rc.log '^# soak .* t=[0-9]+s: received' 1 900 $_p || { echo "the soak did not report 10 s of traffic"; cat /tmp/rc.log; kill -9 $_p; return 1; }
  /usr/bin/ip link set veth2 down
  # The member comes back once every comm has failed over (both receivers and both senders).
  _i=0
  while [ "$(conns 'told the sender what arrived' /tmp/rc.log)" -lt 2 ] || [ "$(conns "the receiver's account" /tmp/rc.log)" -lt 2 ]; do
    [ $_i -lt 600 ] && kill -0 $_p 2>/dev/null || { echo "not every comm failed over within 60 s of the wire going down"; cat /tmp/rc.log; kill -9 $_p; wire_up 1; return 1; }
    sleep 0.1; _i=$((_i + 1))
  done
  wire_up 1 || { echo "the second wire did not come back"; kill -9 $_p; return 1; }
  soak_ends $_p /tmp/rc.log || return 1
  [ "$(conns 'told the sender what arrived' /tmp/rc.log)" -eq 2 ] || { echo "not both receivers failed over"; cat /tmp/rc.log; return 1; }
  [ "$(conns 'took back queue pair' /tmp/rc.log)" -eq 4 ] || { echo "not every comm took the member back"; cat /tmp/rc.log; return 1; }
  calls_ok /tmp/rc.log || return 1
  back_in_use /tmp/rc.log
}
step fused-recovery recovery
# A degraded fused device still connects (NCCL makes connections lazily, long after init, when a
# member may have failed): the soak's ranks start with every port up (a port down at init is no
# device), listen, and connect 10 s later (--connect-after); meanwhile veth2 goes down (rxe2 and
# rxe3 DOWN). Each comm must come up on rxe0/rxe1, say once which member it left out, and carry
# a checksummed stream; once the soak has reported 10 s of traffic the wire returns, and every
# comm must take the member back (recovery) and each bulk sender use it by the end.
degraded() {
  env RIVET_TIMEOUT=30 NCCL_DEBUG=INFO RIVET_STATS=1 NCCL_IB_RESILIENCY_PORT_RECOVERY=1 NCCL_IB_TIMEOUT=18 NCCL_IB_RETRY_CNT=3 \
    ./rivet soak --lib $LIB --dev 0+2,1+3 --minutes 1 --max-size 4M --buffers host --connect-after 10 > /tmp/dg.log 2>&1 &
  _p=$!
  wait_for /tmp/dg.log '^# rank [01] listening, connecting in' 2 600 $_p || { echo "the ranks did not start listening"; cat /tmp/dg.log; kill -9 $_p; return 1; }
  /usr/bin/ip link set veth2 down
  _i=0
  until grep -q DOWN /sys/class/infiniband/rxe2/ports/1/state && grep -q DOWN /sys/class/infiniband/rxe3/ports/1/state; do
    [ $_i -lt 50 ] || { echo "rxe2/rxe3 did not go DOWN within 5 s of veth2"; kill -9 $_p; wire_up 1; return 1; }
    sleep 0.1; _i=$((_i + 1))
  done
  wait_for /tmp/dg.log '^# soak .* t=[0-9]+s: received' 1 900 $_p || { echo "the soak did not report 10 s of traffic with a member down"; cat /tmp/dg.log; kill -9 $_p; wire_up 1; return 1; }
  wire_up 1 || { echo "the second wire did not come back"; kill -9 $_p; return 1; }
  soak_ends $_p /tmp/dg.log || return 1
  [ "$(conns 'rxe[23]:1, the peer.s member 1 of rxe[0-9]+[+]rxe[0-9]+ down at setup' /tmp/dg.log)" -eq 4 ] || { echo "not every comm (two senders, two receivers) said once that it left rxe2/rxe3 out"; cat /tmp/dg.log; return 1; }
  grep -qE 'RDMA setup.*failed|moving QP.*RTR' /tmp/dg.log && { echo "a connection failed to set up"; return 1; }
  [ "$(conns 'took back queue pair' /tmp/dg.log)" -eq 4 ] || { echo "not every comm took the member back"; cat /tmp/dg.log; return 1; }
  calls_ok /tmp/dg.log || return 1
  back_in_use /tmp/dg.log
}
step fused-degraded-start degraded
# The last member fails too: veth2 goes down (the comm fails over to rxe0/rxe1), then veth0. The
# run must fail within a bound (no hang), with an error that says no member is left. Then both
# wires come back.
lastmember() {
  NCCL_DEBUG=WARN NCCL_IB_TIMEOUT=16 NCCL_IB_RETRY_CNT=3 ./rivet perf --check --lib $LIB --dev 0+2,1+3 --sizes 16M --bytes 4G --lat-iters 10 > /tmp/lm.log 2>&1 &
  _p=$!
  # Once the stream runs (its table's header), then once both ranks have failed over to rxe0/rxe1.
  wait_for /tmp/lm.log 'size[(]B[)]' 1 600 $_p || { echo "rivet perf did not start its stream"; cat /tmp/lm.log; kill -9 $_p; return 1; }
  /usr/bin/ip link set veth2 down
  wait_for /tmp/lm.log 'WARN.*on rxe[23]:1 failed' 2 600 $_p || { echo "not both ranks failed over within 60 s of veth2 going down"; cat /tmp/lm.log; kill -9 $_p; wire_up 1; return 1; }
  /usr/bin/ip link set veth0 down
  _i=0; while kill -0 $_p 2>/dev/null && [ $_i -lt 120 ]; do sleep 0.5; _i=$((_i + 1)); done
  _stuck=0; kill -0 $_p 2>/dev/null && { _stuck=1; kill -9 $_p; }
  wait $_p; _rc=$?
  wire_up 0 && wire_up 1 || { echo "the wires did not come back"; return 1; }
  grep -E "WARN" /tmp/lm.log | cut -c1-300 | head -20
  [ $_stuck = 0 ] || { echo "rivet perf still running 60 s after its last member failed"; cat /tmp/lm.log; return 1; }
  [ $_rc != 0 ] || { echo "rivet perf succeeded with both members down"; cat /tmp/lm.log; return 1; }
  grep -q "no member is left" /tmp/lm.log || { echo "no error says no member is left"; cat /tmp/lm.log; return 1; }
}
step fused-last-member lastmember
# Last, because it takes the wire down: the link fails mid-transfer. rivet perf must fail within
# a bounded time (no hang), and the WARNs must say the port went down (the PORT_ERR asynchronous
# event, or the port's state when the event has not arrived yet).
linkdown() {
  NCCL_IB_TIMEOUT=12 NCCL_IB_RETRY_CNT=3 ./rivet perf --check --lib $LIB --dev 0,1 --sizes 16M --bytes 4G --lat-iters 10 > /tmp/ld.log 2>&1 &
  _p=$!
  wait_for /tmp/ld.log 'size[(]B[)]' 1 600 $_p || { echo "rivet perf did not start its stream"; cat /tmp/ld.log; kill -9 $_p; return 1; }
  /usr/bin/ip link set veth0 down
  _i=0; while kill -0 $_p 2>/dev/null && [ $_i -lt 120 ]; do sleep 0.5; _i=$((_i + 1)); done
  if kill -0 $_p 2>/dev/null; then echo "rivet perf still running 60 s after the link went down"; kill -9 $_p; cat /tmp/ld.log; return 1; fi
  wait $_p && { echo "rivet perf succeeded with the link down"; cat /tmp/ld.log; return 1; }
  cat /tmp/ld.log
  grep -qE "PORT_ERR|is DOWN" /tmp/ld.log || { echo "no WARN says the port went down"; return 1; }
  grep -q "connection is dead" /tmp/ld.log || { echo "no WARN says the connection failed"; return 1; }
}
step linkdown linkdown
echo "=== summary$results"
echo "VERBS_FAILED=$failed"
exit $failed
