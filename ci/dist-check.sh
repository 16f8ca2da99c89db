#!/usr/bin/env bash
# Checks one staged release tree (ci/dist.sh --check calls it):
#   ci/dist-check.sh ARCH STAGE_DIR
# 1. No dynamic symbol of the plugin or the CLI needs a glibc newer than GLIBC_2.17 (objdump -T),
#    and nothing undefined is left without a version except libc's weak, optional ones.
# 2. The plugin exports ncclNetPlugin_v6..v12, has the SONAME NCCL looks up, carries no debug
#    info, and points at its .debug file.
# 3. The C conformance driver passes every case over TCP against this very file: natively on
#    x86_64, under qemu user emulation on aarch64 (Arm's weaker memory ordering exercises the
#    polling paths' atomics and fences). RIVET_DIST_APIS picks the ABI versions (default "12 8 6").
set -euo pipefail
cd "$(dirname "$0")/.."
# zig and cargo-zigbuild, where ci/dist-deps.sh installed them.
[ -x target/dist-venv/bin/python3 ] && export PATH="$PWD/target/dist-venv/bin:$PATH"
arch=$1
stage=$2
so=$stage/lib/libnccl-net-rivet.so
objdump=objdump
[ "$arch" = aarch64 ] && objdump=aarch64-linux-gnu-objdump
fail() { echo "dist-check $arch: FAILED: $*" >&2; exit 1; }

for f in "$so" "$stage/bin/rivet"; do
  syms=$($objdump -T "$f")
  newest=$(grep -o 'GLIBC_[0-9][0-9.]*' <<< "$syms" | sort -uV | tail -1)
  [ -n "$newest" ] || fail "$f has no versioned glibc symbols (not dynamically linked?)"
  [ "$(printf '%s\n' "$newest" GLIBC_2.17 | sort -V | tail -1)" = GLIBC_2.17 ] || {
    grep 'GLIBC_2\.\(1[89]\|[2-9][0-9]\)' <<< "$syms" | head >&2
    fail "$f needs $newest, newer than GLIBC_2.17"
  }
  # A strong undefined symbol without a version would fail to resolve on an older glibc.
  strong=$(awk '$2 != "w" && /\*UND\*/ && !/GLIBC_/ {print $NF}' <<< "$syms")
  [ -z "$strong" ] || fail "$f has unversioned undefined symbols: $strong"
  echo "dist-check $arch: $(basename "$f"): newest glibc symbol version $newest"
done
tables=$($objdump -T "$so" | grep -o 'ncclNetPlugin_v[0-9]*' | sort -uV | tr '\n' ' ')
[ "$tables" = "ncclNetPlugin_v6 ncclNetPlugin_v7 ncclNetPlugin_v8 ncclNetPlugin_v9 ncclNetPlugin_v10 ncclNetPlugin_v11 ncclNetPlugin_v12 " ] || fail "exported tables: $tables"
# readelf's output is read whole first: `readelf | grep -q` under pipefail fails at random, when
# grep has its match and exits while readelf is still writing (SIGPIPE).
dyn=$(readelf -d "$so") sec=$(readelf -S "$so") dsec=$(readelf -S "$so.debug")
grep -q 'Library soname: \[libnccl-net-rivet.so\]' <<< "$dyn" || fail "SONAME"
grep -q '\.debug_info' <<< "$sec" && fail "$so still has debug info"
grep -q '\.gnu_debuglink' <<< "$sec" || fail "$so has no .gnu_debuglink"
grep -q '\.debug_info' <<< "$dsec" || fail "$so.debug has no debug info"
echo "dist-check $arch: exports $tables; stripped, debug info in $(basename "$so").debug"

# The conformance driver, built for the architecture, against the tarball's plugin.
drv=target/dist/conformance-$arch
run=()
if [ "$arch" = x86_64 ]; then
  cc -O2 -std=gnu11 -o "$drv" nccl-tests/conformance.c -ldl
  # The tarball's CLI finds the tarball's plugin (../lib) and moves data through it.
  env -u RIVET_LIB NCCL_SOCKET_IFNAME=lo "$stage/bin/rivet" allreduce --ranks 2 -e 64K --iters 2 > "target/dist/allreduce-$arch.log" 2>&1 ||
    { cat "target/dist/allreduce-$arch.log"; fail "bin/rivet allreduce from the tarball"; }
  grep -q "^# Out of bounds values : 0 OK" "target/dist/allreduce-$arch.log" || fail "bin/rivet allreduce from the tarball: wrong results"
  echo "dist-check $arch: bin/rivet allreduce --ranks 2 through lib/libnccl-net-rivet.so: 0 wrong"
else
  python3 -m ziglang cc -target aarch64-linux-gnu.2.17 -O2 -std=gnu11 -o "$drv" nccl-tests/conformance.c -ldl
  command -v qemu-aarch64 >/dev/null || fail "qemu-aarch64 missing: apt-get install qemu-user"
  [ -e /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 ] || fail "the aarch64 C library is missing: apt-get install libc6-arm64-cross"
  run=(qemu-aarch64 -L /usr/aarch64-linux-gnu)
  # The CLI runs too (it reports its version without loading the plugin).
  "${run[@]}" "$stage/bin/rivet" --version | sed 's/^/   /'
fi
# Every case the driver runs by default ("cases: ..." in its usage text) must pass.
cases=$("${run[@]}" "$drv" 2>&1 | sed -n 's/^cases: //p' || true)
[ -n "$cases" ] || fail "the conformance driver lists no cases"
for api in ${RIVET_DIST_APIS:-12 8 6}; do
  out=$(NCCL_SOCKET_IFNAME=lo RIVET_TIMEOUT=10 "${run[@]}" "$drv" --lib "$(realpath "$so")" --api "$api" 2>&1) || {
    echo "$out" | tail -30
    fail "conformance --api $api on $arch"
  }
  grep -q '^FAIL' <<< "$out" && { echo "$out"; fail "conformance --api $api on $arch has a FAIL"; }
  passed=0 skipped=0
  for c in $cases; do
    if grep -q "^PASS api=$api case=$c " <<< "$out"; then
      passed=$((passed + 1))
    elif [ "$c" = optional ] && [ "$api" -lt 9 ] && grep -q "^SKIP api=$api case=$c " <<< "$out"; then
      skipped=$((skipped + 1)) # the optional receive completion exists from v9 on
    else
      echo "$out"; fail "conformance --api $api on $arch: case $c did not pass"
    fi
  done
  echo "dist-check $arch: conformance --api $api over TCP: $passed cases passed, $skipped skipped$([ ${#run[@]} -gt 0 ] && echo ' (qemu-aarch64)' || true)"
done
echo "dist-check $arch: passed"
