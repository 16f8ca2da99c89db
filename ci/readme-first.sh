#!/usr/bin/env bash
# The README's first shell block, run exactly as written in a clean copy of this tree (the tracked
# files and the untracked ones git does not ignore: no target/, no build products), as a new user
# runs it on a fresh clone. It must succeed and end with nccl-tests' "Out of bounds values: 0 OK".
set -euo pipefail
cd "$(dirname "$0")/.."
block=$(awk '/^```(sh|bash)$/ {f = 1; next} f && /^```$/ {exit} f' README.md)
[ -n "$block" ] || { echo "readme-first: README.md has no \`\`\`sh block" >&2; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/rivet-readme.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
git ls-files -z --cached --others --exclude-standard | tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$tmp"
echo "readme-first: in a clean copy ($tmp):"
sed 's/^/  $ /' <<< "$block"
out=$(cd "$tmp" && env -u CARGO_TARGET_DIR -u RIVET_LIB bash -euo pipefail -c "$block" 2>&1) || {
  echo "$out" | tail -40
  echo "readme-first: FAILED: the README's first block exits non-zero" >&2
  exit 1
}
echo "$out" | tail -8
grep -q '^# Out of bounds values : 0 OK$' <<< "$out" || { echo "readme-first: FAILED: no '# Out of bounds values : 0 OK' line" >&2; exit 1; }
echo "readme-first: passed"
