#!/usr/bin/env bash
# `make dist`: the release tarballs users copy to a cluster,
#   dist/rivet-VERSION-x86_64-linux.tar.gz and dist/rivet-VERSION-aarch64-linux.tar.gz
# each holding rivet-VERSION-ARCH-linux/{lib/libnccl-net-rivet.so, lib/libnccl-net-rivet.so.debug,
# bin/rivet, README.md, LICENSE}. The plugin and the CLI are linked by zig against glibc 2.17's
# symbol versions (cargo-zigbuild, target ARCH-unknown-linux-gnu.2.17), so they load on RHEL 8,
# Ubuntu 20.04 and the containers built on them; the .so is stripped, its debug info kept beside it
# (linked with .gnu_debuglink, so gdb finds it).
#
#   ci/dist.sh [--check]   --check: also verify the symbol versions (ci/dist-check.sh)
#
# Needs (ci/dist-deps.sh installs them): ziglang and cargo-zigbuild (in the virtual environment
# target/dist-venv); rustup target add aarch64-unknown-linux-gnu; binutils and
# binutils-aarch64-linux-gnu (objcopy for each architecture). Writes dist/SHA256SUMS of the
# tarballs beside them (check with `sha256sum -c SHA256SUMS`).
set -euo pipefail
cd "$(dirname "$0")/.."
# zig and cargo-zigbuild, where ci/dist-deps.sh installed them.
[ -x target/dist-venv/bin/python3 ] && export PATH="$PWD/target/dist-venv/bin:$PATH"
check=0
[ "${1:-}" = --check ] && check=1
missing=()
cargo zigbuild --help >/dev/null 2>&1 || missing+=("cargo-zigbuild and zig: bash ci/dist-deps.sh (installs them in a virtual environment)")
grep -qx aarch64-unknown-linux-gnu <<< "$(rustup target list --installed 2>/dev/null)" || missing+=("the aarch64 standard library: rustup target add aarch64-unknown-linux-gnu")
command -v objcopy >/dev/null || missing+=("objcopy: apt-get install binutils")
command -v aarch64-linux-gnu-objcopy >/dev/null || missing+=("aarch64 objcopy: apt-get install binutils-aarch64-linux-gnu")
if [ ${#missing[@]} -gt 0 ]; then
  printf 'make dist: missing %s\n' "${missing[@]}" >&2
  exit 2
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
mkdir -p dist
for arch in x86_64 aarch64; do
  target=$arch-unknown-linux-gnu
  echo "== $arch: cargo zigbuild --release --target $target.2.17"
  cargo zigbuild --release --target "$target.2.17" --lib --bin rivet
  out=target/$target/release
  objcopy=objcopy
  [ "$arch" = aarch64 ] && objcopy=aarch64-linux-gnu-objcopy
  name=rivet-$version-$arch-linux
  stage=target/dist/$name
  rm -rf "$stage"
  mkdir -p "$stage/lib" "$stage/bin"
  so=$stage/lib/libnccl-net-rivet.so
  $objcopy --only-keep-debug "$out/libnccl_net_rivet.so" "$so.debug"
  $objcopy --strip-debug --strip-unneeded "$out/libnccl_net_rivet.so" "$so"
  (cd "$stage/lib" && $objcopy --add-gnu-debuglink=libnccl-net-rivet.so.debug libnccl-net-rivet.so)
  $objcopy --strip-debug --strip-unneeded "$out/rivet" "$stage/bin/rivet"
  chmod 755 "$so" "$stage/bin/rivet"
  chmod 644 "$so.debug"
  cp README.md LICENSE "$stage/"
  tar -C target/dist -czf "dist/$name.tar.gz" --owner=0 --group=0 --sort=name "$name"
  echo "   dist/$name.tar.gz: $(du -h "dist/$name.tar.gz" | cut -f1) (plugin $(du -h "$so" | cut -f1) stripped, debug info $(du -h "$so.debug" | cut -f1))"
  if [ $check = 1 ]; then
    bash ci/dist-check.sh "$arch" "$stage"
  fi
done
# Checksums of this version's tarballs, beside them.
(cd dist && sha256sum "rivet-$version-x86_64-linux.tar.gz" "rivet-$version-aarch64-linux.tar.gz" > SHA256SUMS && sha256sum --quiet -c SHA256SUMS)
echo "   dist/SHA256SUMS: $(wc -l < dist/SHA256SUMS) tarballs"
