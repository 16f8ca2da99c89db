#!/usr/bin/env bash
# Boot rivet's Soft-RoCE test VM (qemu TCG, no network device, serial console on stdout), run one
# script or program in the guest and exit with its exit code.
#
# Usage: ci/vm/run-vm.sh [options] SCRIPT_PATH_IN_GUEST [ARGS...]
#   --share DIR      export host DIR as virtio-9p tag "host"; the guest mounts it at /mnt/host
#   --mtu N          MTU of the guest's veth pair (default 1500 -> rxe active_mtu 1024;
#                    9000 -> 4096, about twice the bandwidth)
#   --timeout S      stop the VM after S seconds (default 600) and exit 124
#   --smp N          guest vCPUs (default 2)
#   --mem SIZE       guest memory (default 2G)
#   --log FILE       also write the console output to FILE
#   --no-build       use the cached image as it is (do not call build-image.sh)
# SCRIPT_PATH_IN_GUEST is an absolute guest path: /guest/NAME for ci/vm/guest/NAME (baked into
# the image), /mnt/host/... for a file in the --share directory. ARGS reach it unchanged: each is
# hex-encoded into an rxe.arg= word of the kernel command line (2 KiB in all; larger inputs belong
# in a file in the share). An executable file is run directly, anything else with sh.
#
# Exit status: the guest script's own exit status (0..255), or
#   124  the VM did not finish within --timeout
#   125  harness failure: the image build failed, the guest never reported a result (kernel
#        panic, qemu error) or the guest's setup failed (RXE_SETUP_FAILED on the console)
#   2    usage error (bad option) before anything ran
#   127  SCRIPT_PATH_IN_GUEST does not exist in the guest
# Protocol: the guest's /init prints "RXE_RESULT rc=N", then powers off for N=0 (qemu exits 0) or
# writes N to isa-debug-exit (qemu exits 2*N+1). The printed N wins where both are present.
#
# Env: RIVET_VM_CACHE (default /var/cache/rivet-vm), RIVET_VM_APPEND (extra kernel arguments),
#      RIVET_VM_ACCEL (default tcg; kvm does not boot on the project's build machines).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${RIVET_VM_CACHE:-/var/cache/rivet-vm}
SHARE= MTU=1500 TIMEOUT=600 SMP=2 MEM=2G LOG= BUILD=1
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
die() { echo "run-vm: $*" >&2; exit 2; }                 # usage errors
harness_fail() { echo "run-vm: FAILURE: $*" >&2; exit 125; }
optval() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"; }
while [ $# -gt 0 ]; do
  case $1 in
    --share)   optval "$@"; SHARE=$2; shift 2 ;;
    --mtu)     optval "$@"; MTU=$2; shift 2 ;;
    --timeout) optval "$@"; TIMEOUT=$2; shift 2 ;;
    --smp)     optval "$@"; SMP=$2; shift 2 ;;
    --mem)     optval "$@"; MEM=$2; shift 2 ;;
    --log)     optval "$@"; LOG=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { usage >&2; exit 2; }
SCRIPT=$1; shift
case $SCRIPT in
  /*) ;;
  *) die "the script path must be an absolute path in the guest (/guest/..., /mnt/host/...): $SCRIPT" ;;
esac
case $SCRIPT in *[[:space:]\"\'\\]*) die "the script path may not contain blanks, quotes or backslashes" ;; esac
[[ $MTU =~ ^[0-9]+$ ]] && [ "$MTU" -ge 1280 ] && [ "$MTU" -le 65535 ] || die "--mtu: 1280..65535"
[[ $TIMEOUT =~ ^[0-9]+$ ]] && [ "$TIMEOUT" -gt 0 ] || die "--timeout: seconds"
[[ $SMP =~ ^[0-9]+$ ]] || die "--smp: a number"
if [ -n "$SHARE" ]; then
  [ -d "$SHARE" ] || die "--share: $SHARE is not a directory"
  SHARE=$(cd "$SHARE" && pwd)
  case $SHARE in *,*) die "--share: qemu cannot take a path with a comma: $SHARE" ;; esac
fi

# ---- image and qemu -------------------------------------------------------------------------------
if [ "$BUILD" = 1 ]; then
  RIVET_VM_CACHE=$CACHE "$HERE/build-image.sh" >&2 || harness_fail "build-image.sh failed"
fi
[ -s "$CACHE/vmlinux" ] && [ -s "$CACHE/initramfs.cpio" ] || harness_fail "no image in $CACHE (run build-image.sh)"
if ! command -v qemu-system-x86_64 >/dev/null; then
  echo "run-vm: installing qemu-system-x86" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-x86; } >&2 ||
    harness_fail "could not install qemu-system-x86"
fi

# ---- kernel command line --------------------------------------------------------------------------
APPEND="console=ttyS0 panic=-1 quiet loglevel=3 cryptomgr.notests rxe.mtu=$MTU rxe.run=$SCRIPT rxe.argc=$#"
for a in "$@"; do
  APPEND+=" rxe.arg=$(printf '%s' "$a" | od -An -v -tx1 | tr -d ' \n')"
done
[ -n "$SHARE" ] && APPEND+=" rxe.9p=1"
[ -n "${RIVET_VM_APPEND:-}" ] && APPEND+=" $RIVET_VM_APPEND"
# COMMAND_LINE_SIZE is 2048 on x86, including the terminating NUL
[ ${#APPEND} -le 2000 ] || die "kernel command line too long (${#APPEND} bytes): pass large arguments in a file in the share"

QEMU=(qemu-system-x86_64 -accel "${RIVET_VM_ACCEL:-tcg}" -cpu max -smp "$SMP" -m "$MEM"
      -nodefaults -no-user-config -display none -monitor none -serial stdio -no-reboot
      -device isa-debug-exit,iobase=0xf4,iosize=0x04
      -kernel "$CACHE/vmlinux" -initrd "$CACHE/initramfs.cpio")
[ -n "$SHARE" ] && QEMU+=(-virtfs "local,path=$SHARE,mount_tag=host,security_model=none,id=host0")

CONSOLE=$LOG
if [ -z "$CONSOLE" ]; then
  CONSOLE=$(mktemp "${TMPDIR:-/tmp}/rivet-vm.XXXXXX.log")
  trap 'rm -f "$CONSOLE"' EXIT
fi
echo "run-vm: ${QEMU[*]} -append \"$APPEND\"" >&2
T0=$EPOCHREALTIME
# stdin from /dev/null: qemu never puts a terminal into raw mode, and nothing blocks on input.
timeout --foreground -k 10 "$TIMEOUT" "${QEMU[@]}" -append "$APPEND" < /dev/null 2>&1 |
  sed -u 's/\r$//' | tee "$CONSOLE"
QRC=${PIPESTATUS[0]}
SECS=$(awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
[ ! -s "$CONSOLE" ] || [ -z "$(tail -c1 "$CONSOLE")" ] || echo   # console ended mid-line

# ---- result ---------------------------------------------------------------------------------------
RESULT=$(sed -n 's/^RXE_RESULT rc=\([0-9][0-9]*\)$/\1/p' "$CONSOLE" | tail -n1)
if [ "$QRC" = 124 ] || [ "$QRC" = 137 ]; then
  echo "run-vm: TIMEOUT: the VM did not finish within ${TIMEOUT}s" >&2
  exit 124
fi
if [ -n "$RESULT" ]; then
  b=$RESULT; [ "$b" -gt 127 ] && b=127
  want=0; [ "$RESULT" = 0 ] || want=$(( (2 * b + 1) & 255 ))
  if [ "$QRC" != "$want" ]; then
    echo "run-vm: note: qemu exited $QRC, expected $want for rc=$RESULT" >&2
    # a zero on the console but a code at isa-debug-exit: the console line was not /init's
    [ "$RESULT" = 0 ] && [ $((QRC % 2)) = 1 ] && [ "$QRC" -gt 1 ] && RESULT=$(( (QRC - 1) / 2 ))
  fi
  if grep -q '^RXE_SETUP_FAILED' "$CONSOLE"; then
    echo "run-vm: guest setup failed: $(sed -n 's/^RXE_SETUP_FAILED: //p' "$CONSOLE" | tail -n1) (rc $RESULT, ${SECS}s)" >&2
  else
    echo "run-vm: guest $SCRIPT exited $RESULT (${SECS}s)" >&2
  fi
  exit "$RESULT"
fi
if [ $((QRC % 2)) = 1 ] && [ "$QRC" -gt 1 ]; then
  echo "run-vm: guest exited $(( (QRC - 1) / 2 )) via isa-debug-exit, without an RXE_RESULT line (${SECS}s)" >&2
  exit $(( (QRC - 1) / 2 ))
fi
if grep -q 'Kernel panic' "$CONSOLE"; then
  echo "run-vm: FAILURE: the guest kernel panicked (qemu exit $QRC, ${SECS}s)" >&2
else
  echo "run-vm: FAILURE: the guest ended without reporting a result (qemu exit $QRC, ${SECS}s)" >&2
fi
exit 125
