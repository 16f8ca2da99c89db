#!/bin/sh
# rivet over impaired links, inside the Soft-RoCE guest (busybox sh). Run by ci/vm-impair.sh.
# For each impairment, applied with tc netem on both ends of the veth pair (so on every packet
# either way), over RDMA verbs (rxe0 <-> rxe1) and over TCP (veth0 <-> veth1):
#   - conformance driver cases that move data (sizes, bigrecv, outstanding, group);
#   - rivet soak (every byte checked, both directions, host buffers);
#   - rivet perf at 1 MiB: the bandwidth and the 8-byte latency, for the table.
# Jitter goes with a rate, which keeps netem's queue in order: plain "delay 5ms 2ms" gives every
# packet its own delay, so nearly all of them arrive out of order, and RC over rxe (go-back-N on
# every out-of-sequence packet) then barely moves; reordering is the 5 % case's subject.
# Then link flaps (100 % loss for a while): one shorter than the retry budget must be survived,
# one longer must fail on both sides, within a bound, with a WARN that names the cause.
# Prints "IMPAIR name PASS|FAIL" per step, "TABLE ..." rows, and exits with the failed count.
cd /mnt/host || exit 2
. ./lib.sh
LIB=/mnt/host/libnccl-net-rivet.so
TC=/usr/bin/tc
export RIVET_TIMEOUT=10
# rxe's retransmission timer follows the QP's timeout: 4.096 us x 2^16 = 268 ms per try, 7 tries
# (a 1.9 s budget). Shorter timeouts retransmit spuriously under emulation, where rxe itself is
# slow, and rxe then fails multi-packet writes with invalid-request errors.
export NCCL_IB_TIMEOUT=16 NCCL_IB_RETRY_CNT=7
failed=0
results=
table=

impair() {  # impair NETEM-ARGS... | impair none
  for d in veth0 veth1; do
    $TC qdisc del dev $d root 2>/dev/null
    [ "$1" = none ] || $TC qdisc add dev $d root netem "$@" || return 1
  done
}

step() {  # step NAME COMMAND... (its own variable names: lib.sh's pt_pair uses _name, _t0)
  _sname=$1; shift
  now; _st0=$NOW
  "$@" > /tmp/step.log 2>&1; _src=$?
  now; _sdt=$(awk -v a=$_st0 -v b=$NOW 'BEGIN { printf "%.1f", b - a }')
  if [ $_src = 0 ]; then _v=PASS; tail -n 1 /tmp/step.log | sed 's/^/# /'; else _v="FAIL rc=$_src"; failed=$((failed + 1)); cat /tmp/step.log; fi
  echo "IMPAIR $_sname $_v (${_sdt}s)"
  results="$results
IMPAIR $_sname $_v (${_sdt}s)"
}

# Each impairment must have happened: a netem rule that did nothing cannot pass. rxe's counters
# (summed over rxe0 and rxe1), the kernel's TCP counters and netem's own drops are read before
# and after each transport's steps, and `moved` checks what the impairment must have moved, by
# mechanism: a packet that went missing or came early (loss, reordering, corruption: rxe's
# out_of_seq_request, 0 on a clean link, where the emulator's spurious retransmissions move
# only the duplicate and retry counters), more packets received than sent (duplication: rxe's
# rcvd_pkts over sent_pkts), netem's drops (loss), TCP's reordering and checksum-error
# counters, and the 8-byte latency (a 5 ms delay each way). TCP has no counter of duplicates
# received: its D-SACKs sent must be more than twice the clean link's (125 there, 801 under 1 %).
RXE_CNTS="out_of_seq_request rcvd_seq_err completer_retry_err duplicate_request sent_pkts rcvd_pkts"
TCP_CNTS="RetransSegs InCsumErrors TCPSACKReorder TCPDSACKOldSent"
snap() {  # snap PREFIX: PREFIX_<counter> for every counter, and PREFIX_drops (netem)
  for _c in $RXE_CNTS; do
    _s=0
    for _d in rxe0 rxe1; do _v=0; read -r _v 2>/dev/null < /sys/class/infiniband/$_d/ports/1/hw_counters/$_c; _s=$((_s + _v)); done
    eval "${1}_$_c=$_s"
  done
  for _c in $TCP_CNTS; do
    eval "${1}_$_c=$(awk -v c=$_c '$1 ~ /^(Tcp|TcpExt):$/ { if (h[$1] == "") { for (i = 2; i <= NF; i++) h[$1] = h[$1] " " $i; split(h[$1], n, " "); for (i in n) col[$1 ":" n[i]] = i + 1; next } k = $1 ":" c; if (k in col) v += $(col[k]) } END { print v + 0 }' /proc/net/snmp /proc/net/netstat)"
  done
  _d0=$($TC -s qdisc show dev veth0 | sed -n 's/.*dropped \([0-9]*\).*/\1/p' | head -1)
  _d1=$($TC -s qdisc show dev veth1 | sed -n 's/.*dropped \([0-9]*\).*/\1/p' | head -1)
  eval "${1}_drops=$((${_d0:-0} + ${_d1:-0}))"
}
d() { eval "echo \$((a_$1 - b_$1))"; }  # d COUNTER: after minus before
moved() {  # moved TRANSPORT IMPAIRMENT: after `snap b`, checks against now
  snap a
  echo "# $1 under '$2': rxe out_of_seq_request +$(d out_of_seq_request) rcvd_seq_err +$(d rcvd_seq_err) completer_retry_err +$(d completer_retry_err) duplicate_request +$(d duplicate_request) sent_pkts +$(d sent_pkts) rcvd_pkts +$(d rcvd_pkts); TCP RetransSegs +$(d RetransSegs) InCsumErrors +$(d InCsumErrors) TCPSACKReorder +$(d TCPSACKReorder) TCPDSACKOldSent +$(d TCPDSACKOldSent); netem drops +$(d drops); latency ${last_lat:-?} us"
  case "$1:$2" in
    tcp:none) clean_dsack=$(d TCPDSACKOldSent); return 0 ;;
    *:none) return 0 ;;
    *:"loss "*) [ "$(d drops)" -gt 0 ] || { echo "netem dropped nothing"; return 1; } ;;
  esac
  case "$1:$2" in
    verbs:"loss "*|verbs:*reorder*|verbs:"corrupt "*) [ "$(d out_of_seq_request)" -gt 0 ] || { echo "rxe saw no packet missing or out of sequence (out_of_seq_request did not move)"; return 1; } ;;
    verbs:"duplicate "*) [ "$(d rcvd_pkts)" -gt "$(d sent_pkts)" ] || { echo "rxe received no more packets than it sent: nothing was duplicated"; return 1; } ;;
    tcp:"loss "*) [ "$(d RetransSegs)" -gt 0 ] || { echo "TCP retransmitted nothing"; return 1; } ;;
    tcp:*reorder*) [ "$(d TCPSACKReorder)" -gt 0 ] || { echo "TCP saw no reordering (TCPSACKReorder did not move)"; return 1; } ;;
    tcp:"corrupt "*) [ "$(d InCsumErrors)" -gt 0 ] || { echo "TCP saw no checksum error"; return 1; } ;;
    tcp:"duplicate "*) [ "$(d TCPDSACKOldSent)" -gt $((2 * ${clean_dsack:-0})) ] || { echo "TCP sent $(d TCPDSACKOldSent) D-SACKs, not more than twice the clean link's ${clean_dsack:-0}: nothing was duplicated"; return 1; } ;;
  esac
  case "$2" in
    "delay 5ms"*) awk -v l="${last_lat:-0}" 'BEGIN { exit !(l >= 4000) }' || { echo "8-byte latency ${last_lat:-?} us under a 5 ms delay each way"; return 1; } ;;
  esac
  return 0
}

verbs_env() { unset NCCL_IB_DISABLE NCCL_SOCKET_IFNAME; }
tcp_env() { export NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=veth; }

conf() {
  for c in sizes bigrecv outstanding group; do
    ./conformance --lib $LIB --api 12 --dev 0 --dev2 1 --case $c || return 1
  done
}
soak() { ./rivet soak --lib $LIB --dev 0,1 --minutes 0.25 --max-size 1M --buffers host; }
perf() {  # perf LABEL TRANSPORT: one table row
  ./rivet perf --check --lib $LIB --dev 0,1 --sizes 1M --bytes 64M --lat-iters 200 > /tmp/perf.log 2>&1 || { cat /tmp/perf.log; return 1; }
  cat /tmp/perf.log
  _lat=$(sed -n 's/.*typical \([0-9.]*\) us.*/\1/p' /tmp/perf.log)
  last_lat=$_lat
  _bw=$(awk '!/^#/ && NF == 4 { print $4 }' /tmp/perf.log)
  table="$table
TABLE | $1 | $2 | $_bw | $_lat |"
}

perftest() {  # the reference tool on the same link: ib_write_bw at 1 MiB, rxe0 -> rxe1
  pt_pair bw ib_write_bw rxe1 ${RXE1_GID_INDEX:-1} rxe0 ${RXE0_GID_INDEX:-1} 10.0.0.2 -s 1048576 -n 64 --report_gbits || return 1
  _g=$(awk '$1 == 1048576 && NF >= 5 { print $4; exit }' /tmp/bw.cli)
  _bw=$(awk -v g="$_g" 'BEGIN { printf "%.3f", g / 8 }')
  table="$table
TABLE | $1 | ib_write_bw (perftest) | $_bw | |"
}

for imp in "none" "loss 1%" "delay 2ms reorder 5% 50%" "delay 5ms 2ms rate 10gbit" "duplicate 1%" "corrupt 0.1%"; do
  label=$(echo "$imp" | tr ' ' '_')
  impair $imp || { echo "IMPAIR netem-$label FAIL (tc netem $imp not available)"; failed=$((failed + 1)); continue; }
  $TC qdisc show dev veth0 | sed 's/^/# /'
  verbs_env
  snap b; last_lat=
  step "verbs-conformance-$label" conf
  step "verbs-soak-$label" soak
  step "verbs-perf-$label" perf "$imp" "RDMA verbs"
  step "verbs-impaired-$label" moved verbs "$imp"
  step "perftest-$label" perftest "$imp"
  tcp_env
  snap b; last_lat=
  step "tcp-conformance-$label" conf
  step "tcp-soak-$label" soak
  step "tcp-perf-$label" perf "$imp" "TCP"
  step "tcp-impaired-$label" moved tcp "$imp"
  verbs_env
done
impair none
echo "# qdisc none: the netem impairments are over"  # ci/vm-test.sh reads the last qdisc line before a panic
# rxe counts the packets its ICRC check dropped; with 0.1 % corruption some must have been.
for f in /sys/class/infiniband/rxe*/ports/1/hw_counters/rcvd_seq_err /sys/class/infiniband/rxe*/ports/1/hw_counters/*icrc*; do
  [ -e "$f" ] && echo "# $f: $(cat $f)"
done

# Link flaps: 100 % loss on both ends for SECS while a stream runs. FLAP: the stream survives;
# OUTAGE: it fails on both ranks within BOUND seconds of the outage's start, naming the cause.
# Each output line gets the guest's uptime in front, so the WARNs can be timed.
stamp() { while IFS= read -r _l; do read -r _t _ < /proc/uptime; echo "$_t $_l"; done; }
flap() {  # flap SECS expect(survive|fail) BOUND
  # The last step's log goes first: the wait below must not find its lines (its header and EXIT)
  # before this run's redirection has emptied the file, and start the outage before the stream.
  rm -f /tmp/flap.log
  (./rivet perf --check --lib $LIB --dev 0,1 --sizes 1M --bytes 512M --lat-iters 10 2>&1; echo "EXIT $?") | stamp > /tmp/flap.log &
  # Once the stream runs (its table's header).
  wait_for /tmp/flap.log 'size[(]B[)]|EXIT' 1 600 || { echo "rivet perf did not start its stream"; cat /tmp/flap.log; return 1; }
  now; _t0=$NOW
  impair loss 100%
  # The outage's length, watching the ranks: still running 5 s after both WARNed, their threads
  # are dumped (once) so that what they wait in is on record.
  _dumped=0; rm -f /tmp/dump.log
  while now; awk -v a=$_t0 -v b=$NOW -v s=$1 'BEGIN { exit !(b - a < s) }'; do
    sleep 0.2
    [ $_dumped = 0 ] || continue
    grep -q " EXIT " /tmp/flap.log && continue
    [ "$(grep -oE "NCCL WARN" /tmp/flap.log | wc -l)" -ge 2 ] || continue
    _lw=$(awk '/NCCL WARN/ { t = $1 } END { print t }' /tmp/flap.log)
    awk -v a=$_lw -v b=$NOW 'BEGIN { exit !(b - a > 5) }' || continue
    _dumped=1
    { echo "# the ranks still run 5 s after their WARNs:"; dump_threads rivet; } > /tmp/dump.log 2>&1
  done
  impair none
  _i=0; while ! grep -q " EXIT " /tmp/flap.log && [ $_i -lt 1200 ]; do sleep 0.1; _i=$((_i + 1)); done
  wait
  cat /tmp/flap.log
  grep -q " EXIT " /tmp/flap.log || { echo "still running 120 s after the flap"; return 1; }
  _rc=$(sed -n 's/.* EXIT //p' /tmp/flap.log)
  _end=$(awk -v a=$_t0 '/ EXIT / { printf "%.1f", $1 - a }' /tmp/flap.log)
  if [ "$2" = survive ]; then
    [ "$_rc" = 0 ] || { echo "a ${1} s flap broke the stream"; return 1; }
    grep -q WARN /tmp/flap.log && { echo "a ${1} s flap gave a WARN"; return 1; }
    echo "survived a ${1} s flap (done ${_end} s after it began)"
    return 0
  fi
  [ "$_rc" != 0 ] || { echo "a ${1} s outage did not fail the stream"; return 1; }
  # Both ranks WARN with the cause, each within BOUND seconds of the outage's start.
  # (Two ranks' WARNs can share a line: count the matches, not the lines.)
  _n=$(grep -oE "NCCL WARN[^[]*(unreachable|RETRY_EXC_ERR|no acknowledgement)" /tmp/flap.log | wc -l)
  [ "$_n" -ge 2 ] || { echo "not both ranks named the cause ($_n WARNs)"; return 1; }
  _last=$(awk -v a=$_t0 '/NCCL WARN/ { t = $1 - a } END { printf "%.1f", t }' /tmp/flap.log)
  awk -v d=$_last -v b=$3 'BEGIN { exit !(d <= b) }' || { echo "the last WARN came ${_last} s after the outage began, more than $3 s"; return 1; }
  # A rank that has failed exits: it must not wait for the link to come back.
  awk -v w=$_last -v e=$_end 'BEGIN { exit !(e - w <= 5) }' || { echo "the ranks exited ${_end} s after the outage began, $(awk -v w=$_last -v e=$_end 'BEGIN { printf "%.1f", e - w }') s after their last WARN (at most 5 s)"; cat /tmp/dump.log 2>/dev/null; return 1; }
  echo "a ${1} s outage: both ranks failed naming the cause, the last WARN ${_last} s after it began (the ranks exited after ${_end} s)"
}
# The verbs retry budget: 7 tries x 268 ms; RIVET_TIMEOUT=10 for TCP.
verbs_env
step verbs-flap-0.2s flap 0.2 survive
step verbs-outage-30s flap 30 fail 25
tcp_env
step tcp-flap-2s flap 2 survive
step tcp-outage-40s flap 40 fail 35
verbs_env

echo "=== table (1 MiB streaming GB/s and 8-byte one-way latency in us: rivet perf --dev 0,1, and ib_write_bw on the same link)"
echo "TABLE | impairment | transport | GB/s | latency us |"
echo "$table" | sed '/^$/d'
echo "=== summary$results"
echo "IMPAIR_FAILED=$failed"
exit $failed
