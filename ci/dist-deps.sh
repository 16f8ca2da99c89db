#!/usr/bin/env bash
# Installs what `make dist` needs where it is missing (ci/test.sh runs this before the release
# build, as ci/vm-test.sh installs qemu for the VM): zig and cargo-zigbuild from PyPI (in a virtual environment), the aarch64
# standard library through rustup, and from Debian binutils for aarch64, qemu user emulation and
# the aarch64 C library (for the conformance run of the aarch64 build).
set -euo pipefail
cd "$(dirname "$0")/.."
# zig and cargo-zigbuild go into a virtual environment of the project's (target/dist-venv), never
# into the system's Python (Debian 12's is externally managed: a plain pip install is refused).
# ci/dist.sh and ci/dist-check.sh put its bin/ first on PATH.
venv=target/dist-venv
if ! PATH="$PWD/$venv/bin:$PATH" cargo zigbuild --help >/dev/null 2>&1 || ! "$venv/bin/python3" -m ziglang version >/dev/null 2>&1; then
  echo "dist-deps: ziglang and cargo-zigbuild into $venv (a Python virtual environment)"
  if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
    echo "dist-deps: apt-get install python3-venv"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  fi
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python3" -m pip install -q --disable-pip-version-check ziglang cargo-zigbuild
fi
if ! grep -qx aarch64-unknown-linux-gnu <<< "$(rustup target list --installed)"; then
  echo "dist-deps: rustup target add aarch64-unknown-linux-gnu"
  rustup target add aarch64-unknown-linux-gnu
fi
need=()
command -v objcopy >/dev/null || need+=(binutils)
command -v aarch64-linux-gnu-objcopy >/dev/null || need+=(binutils-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
[ -e /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 ] || need+=(libc6-arm64-cross)
if [ ${#need[@]} -gt 0 ]; then
  echo "dist-deps: apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
