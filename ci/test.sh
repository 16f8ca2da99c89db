#!/usr/bin/env bash
# Every test of the project: clippy with warnings as errors, unit tests, the C conformance
# driver for each exported ncclNet version, the C header layout check, the fault tests (all over
# TCP on this host), the README's first command in a clean copy of the tree
# (ci/readme-first.sh), the release tarballs for x86_64 and aarch64 with their glibc and
# conformance checks (ci/dist.sh --check), then the same driver and faults over real RDMA verbs
# traffic in the Soft-RoCE VM (ci/vm-test.sh; set RIVET_SKIP_VM=1 to leave it out of a quick local
# run).
#
# Each step's output goes to the terminal and to target/ci/STEP.log; at the end (or at the first
# failed step) a table gives, per step, what ran, passed, failed and was skipped (cargo's ignored
# tests and the tests that print SKIP count as skipped, never as passed), and the variables that
# leave parts out. Under CI=true, a skip this machine could have run fails the run: a step left
# out by RIVET_SKIP_*, a RIVET_VM_STEPS filter, or a skipped test whose reason is not one of the
# hardware this machine lacks (an NVIDIA GPU) or has (tests with other answers there).
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p target/ci
rows=()
tot_p=0 tot_f=0 tot_s=0
runnable_skips=()
# Skips allowed under CI=true: the hardware a CI machine has not (a GPU), or has (the test then
# has other answers).
allowed_skip='needs an NVIDIA GPU|this host has an NVIDIA driver|this host has RDMA devices'

record() { # NAME PASSED FAILED SKIPPED
  rows+=("$(printf '%-28s %6s passed, %s failed, %s skipped' "$1" "$2" "$3" "$4")")
  tot_p=$((tot_p + $2)) tot_f=$((tot_f + $3)) tot_s=$((tot_s + $4))
}

# Count a step's log by its kind: cargo (test result lines; SKIP lines are moved from passed to
# skipped), vm (VERBS/IMPAIR lines), one (the step itself).
count() { # NAME KIND RC LOG
  local name=$1 kind=$2 rc=$3 log=$4 p=0 f=0 s=0
  case $kind in
    cargo)
      read -r p f s < <(grep -E '^test result: ' "$log" | sed -E 's/.* ([0-9]+) passed; ([0-9]+) failed; ([0-9]+) ignored.*/\1 \2 \3/' |
        awk '{p+=$1; f+=$2; s+=$3} END {print p+0, f+0, s+0}')
      local rt
      rt=$(grep -cE '^SKIP [A-Za-z0-9_]+: ' "$log" || true)
      p=$((p - rt)) s=$((s + rt))
      while IFS= read -r why; do
        grep -qE "$allowed_skip" <<< "$why" || runnable_skips+=("$name: $why")
      done < <(grep -E '^test .* \.\.\. ignored, |^SKIP [A-Za-z0-9_]+: ' "$log" | sed -E 's/^test (.*) \.\.\. ignored, /\1: /; s/^SKIP //')
      [ "$rc" != 0 ] && [ "$f" = 0 ] && f=1
      ;;
    vm)
      # Once per step: the guest prints each step's line as it ends and again in its summary.
      p=$(grep -E '^(VERBS|IMPAIR) .* PASS' "$log" | sort -u | wc -l)
      f=$(grep -E '^(VERBS|IMPAIR) .* FAIL' "$log" | sort -u | wc -l)
      s=$(grep -E '^(VERBS|IMPAIR) .* SKIP' "$log" | sort -u | wc -l)
      [ "$rc" != 0 ] && [ "$f" = 0 ] && f=1
      [ "$p" = 0 ] && [ "$f" = 0 ] && f=1 # nothing ran: not a pass
      ;;
    one)
      if [ "$rc" = 0 ]; then p=1; else f=1; fi
      ;;
  esac
  record "$name" "$p" "$f" "$s"
}

summary() {
  local in_force=()
  for v in $(compgen -v | grep -E '^RIVET_(SKIP_.*|VM_STEPS|DIST_APIS|SOAK_MINUTES)$'); do
    [ -n "${!v:-}" ] && in_force+=("$v=${!v}")
  done
  echo
  echo "== ci/test.sh: per step"
  printf '%s\n' "${rows[@]}"
  [ ${#in_force[@]} -gt 0 ] && echo "in force: ${in_force[*]}"
  if [ ${#runnable_skips[@]} -gt 0 ]; then
    echo "skipped although this machine could run it:"
    printf '  %s\n' "${runnable_skips[@]}"
  fi
}

finish() { # RC
  summary
  local verdict="all tests passed"
  [ "$1" != 0 ] && verdict="FAILED"
  echo "ci/test.sh: $tot_p passed, $tot_f failed, $tot_s skipped: $verdict"
  exit "$1"
}

step() { # NAME KIND CMD...
  local name=$1 kind=$2
  shift 2
  local log=target/ci/$name.log
  echo "== step $name: $*"
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  count "$name" "$kind" "$rc" "$log"
  if [ "$rc" != 0 ]; then
    echo "== step $name FAILED (exit $rc)"
    finish 1
  fi
}

left_out() { # NAME WHY: a step not run
  record "$1" 0 0 1
  runnable_skips+=("$1: $2")
}

step build one cargo build --release --all-targets
# Lints: every warning is an error, and every unsafe block says why it is sound.
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
step clippy one cargo clippy --release --all-targets -- -D warnings -D clippy::undocumented_unsafe_blocks
step clippy-shell-sim one cargo clippy --test shell_sim -- -D warnings -D clippy::undocumented_unsafe_blocks
step cargo-test cargo cargo test --release --no-fail-fast
# NCCL's threads at once (tests/threads.rs: progress, service and main threads on comms that come
# and go, every byte checked), plain and staged, for 2 minutes over TCP.
step threads cargo env RIVET_THREADS_SECS=120 cargo test --release --test threads
# The production verbs shells and engines over a simulated NIC with its faults (links, ports,
# recovery, fatal statuses, a side gone; adaptive routing and its hazard, fused members, GPU
# memory, flushes, eager limits): 100 seeded schedules in the dev profile (its debug assertions
# check the shells' unsafe code too), 10,000 in release.
# The run must say it ran exactly that many schedules.
shell_sim() { # N [CARGO-ARGS...]
  local n=$1 out=target/ci/shell-sim.out
  shift
  RIVET_SHELL_SIM_SCHEDULES=$n cargo test "$@" --test shell_sim -- --show-output 2>&1 | tee "$out"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || return "$rc"
  grep -q "^shell_sim: $n schedules " "$out" || { echo "ci/test.sh: the simulator did not report $n schedules"; return 1; }
}
step shell-sim-dev cargo shell_sim 100
step shell-sim-release cargo shell_sim 10000 --release
# The soak over TCP: random traffic both ways, every byte checked, no growth of RSS, fds or threads
# (RIVET_SOAK_MINUTES, default 3).
step soak one env NCCL_SOCKET_IFNAME=lo target/release/rivet soak --minutes "${RIVET_SOAK_MINUTES:-3}"
# The README's first command, exactly as written, in a clean copy of the tree.
step readme-first one bash ci/readme-first.sh
# The release tarballs (make dist): glibc 2.17 symbol versions, and the conformance driver against
# the x86_64 build and, under qemu, the aarch64 one (RIVET_SKIP_DIST=1 leaves this out).
if [ "${RIVET_SKIP_DIST:-0}" != 1 ]; then
  step dist-deps one bash ci/dist-deps.sh
  step dist one bash ci/dist.sh --check
else
  left_out dist "RIVET_SKIP_DIST=1"
fi
if [ "${RIVET_SKIP_VM:-0}" != 1 ]; then
  [ -n "${RIVET_VM_STEPS:-}" ] && runnable_skips+=("vm: only the steps matching RIVET_VM_STEPS=$RIVET_VM_STEPS")
  step vm-verbs vm bash ci/vm-test.sh
  # Impaired links: loss, reordering, delay and jitter, duplication, corruption; link flaps.
  step vm-impair vm bash ci/vm-test.sh impair.sh
  # The data path's instructions per call (callgrind, in the VM) against the committed budget.
  step instr-budget one python3 ci/bench_instr.py --iters 200 --budget ci/instr-budget.json
else
  left_out vm "RIVET_SKIP_VM=1"
fi
if [ "${CI:-}" = true ] && [ ${#runnable_skips[@]} -gt 0 ]; then
  echo "ci/test.sh: under CI=true, nothing this machine can run may be skipped"
  finish 1
fi
finish 0
