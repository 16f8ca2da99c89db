#!/bin/bash
# rivet over real verbs traffic: boots the Soft-RoCE VM (ci/vm/) and runs ci/vm/guest/verbs-tests.sh
# in it (veth MTU 9000, so rxe runs at MTU 4096 as RoCE fabrics do) against this tree's release
# build: the conformance driver for every ABI version over
# rxe0<->rxe1 (across the veth pair) and rxe0<->rxe0 (loopback), the stale-rkey fault, the fault
# tests, and `rivet allreduce --ranks 4`. Exit status: the number of failed steps (0 = all passed).
#
#   ci/vm-test.sh [GUEST_SCRIPT]   default verbs-tests.sh; impair.sh runs the impaired-link suite
#                                  (tc netem on the veth pair, link flaps; see the script)
#   RIVET_VM_STEPS=REGEX           run only the verbs-tests.sh steps whose names match
#
# Needs: the release build (ci/test.sh does it), cc, and qemu-system-x86 (installed here with
# apt-get when missing). The VM image is built from Debian's packages on first use and cached in
# $RIVET_VM_CACHE (default /var/cache/rivet-vm).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v qemu-system-x86_64 >/dev/null; then
  echo "vm-test: installing qemu-system-x86"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-system-x86 >/dev/null
fi
share=target/vm/share
rm -rf "$share" && mkdir -p "$share"
cargo build --release --quiet
cp target/release/libnccl_net_rivet.so "$share/libnccl-net-rivet.so"
cp target/release/rivet "$share/"
# The Rust test binaries the guest runs over verbs: the fault tests and NCCL's threads at once.
for t in faults threads; do
  exe=$(cargo test --release --test $t --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == sys.argv[1] and m.get("executable"):
        print(m["executable"])' $t)
  [ -n "$exe" ] || { echo "vm-test: no test binary for tests/$t.rs" >&2; exit 2; }
  cp "$exe" "$share/$t"
done
cc -std=gnu11 -O2 -Wall -Wextra -Werror nccl-tests/conformance.c -o "$share/conformance" -ldl
guest=${1:-verbs-tests.sh}
[ -f "ci/vm/guest/$guest" ] || { echo "vm-test: no guest script ci/vm/guest/$guest" >&2; exit 2; }
cp "ci/vm/guest/$guest" ci/vm/guest/lib.sh "$share/"
# RIVET_VM_STEPS=REGEX: only the steps whose names match (a quick run while developing).
[ -n "${RIVET_VM_STEPS:-}" ] && printf '%s\n' "$RIVET_VM_STEPS" > "$share/steps"
log=target/vm/${guest%.sh}.log
rc=0
ci/vm/run-vm.sh --share "$share" --mtu 9000 --timeout "${RIVET_VM_TIMEOUT:-1800}" "/mnt/host/$guest" > "$log" 2>&1 || rc=$?
# The guest kernel's own rxe (Debian 6.1) can fault on a packet that netem corrupted: a page
# fault in softirq (under rxe_icrc_check, computing the ICRC over a length the corruption
# changed), a kernel panic whatever the plugin does. Seen twice in the impaired-link suite's
# corrupt step: once with rxe_icrc in the trace, once where the run's record kept only the
# registers (a read at the end of guest memory). A panic counts as that bug when rxe_icrc is in
# the trace or when the last qdisc the guest printed before it (impair.sh prints each) corrupts
# packets; that run is repeated once, from a fresh boot, and a second such panic fails. The
# panic's own lines are printed first, so that a CI log's tail keeps them.
# The first run's results stay in the report, prefixed (so they are not counted twice), and a
# step that failed in it fails this run too, whatever the second run does.
oops() {  # the panic's own lines (fault, RIP, trace), short enough for a CI log's tail
  grep -E 'BUG:|Oops|RIP:|Call Trace|<IRQ>|</IRQ>|Kernel panic|^\[ *[0-9.]+\]  +[A-Za-z_.0-9]+\+0x' "$1" | head -n 40 | sed 's/^/vm-test: oops: /'
}
corrupting_at_panic() {  # the last qdisc the guest printed before the panic corrupts packets
  awk '/qdisc / { rule = $0 } /Kernel panic/ { exit } END { exit !(rule ~ /corrupt/) }' "$1"
}
first_failed=0 panicked=0
if [ "$rc" = 125 ] && grep -q 'Kernel panic' "$log"; then panicked=1; oops "$log"; fi
if [ "$panicked" = 1 ] && { grep -q 'rxe_icrc' "$log" || corrupting_at_panic "$log"; }; then
  grep -E '^VERBS |^IMPAIR ' "$log" | sed 's/^/first run (panicked): /' || true
  first_failed=$(grep -cE '^(VERBS|IMPAIR) .* FAIL' "$log" || true)
  echo "vm-test: the guest kernel panicked on a packet netem corrupted (rxe's ICRC check reading past guest memory: a Soft-RoCE kernel bug, not rivet's); running $guest once more"
  cp "$log" "${log%.log}.panic.log"
  rc=0
  ci/vm/run-vm.sh --share "$share" --mtu 9000 --timeout "${RIVET_VM_TIMEOUT:-1800}" "/mnt/host/$guest" > "$log" 2>&1 || rc=$?
fi
grep -E '^VERBS |^IMPAIR |^TABLE |^=== (summary|table)|VERBS_FAILED|IMPAIR_FAILED|RXE_RESULT|run-vm:' "$log" | grep -v '^run-vm: qemu' || true
if [ "$rc" != 0 ]; then
  echo "vm-test: FAILED (exit $rc); the VM's console log ($log) follows"
  cat "$log"
fi
if [ "$first_failed" != 0 ]; then
  echo "vm-test: FAILED: $first_failed step(s) failed in the run before the panic (${log%.log}.panic.log)"
  [ "$rc" != 0 ] || rc=$first_failed
fi
exit "$rc"
