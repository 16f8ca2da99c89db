#!/usr/bin/env bash
# Build the Soft-RoCE test VM image from Debian bookworm packages:
#   $CACHE/vmlinux         uncompressed kernel (ELF with a PVH entry note; qemu boots it directly)
#   $CACHE/initramfs.cpio  raw newc cpio: busybox, iproute2, rdma-core (rxe provider only), perftest,
#                          the kernel modules for rdma_rxe/veth/9p, ci/vm/guest-init as /init and
#                          ci/vm/guest/* as /guest/*
# Nothing is installed on the host except, when missing, the tools this script needs
# (python3, binutils). Guest packages are fetched with `apt-get download` and unpacked with dpkg-deb.
#
# Usage: ci/vm/build-image.sh [--force]
# Env:   RIVET_VM_CACHE       cache directory (default /var/cache/rivet-vm)
#        RIVET_VM_KERNEL_PKG  kernel package to use (default: the one linux-image-amd64 depends on)
#        RIVET_VM_KEEP_WORK=1 keep the unpacked packages in $CACHE/work.* for inspection
#
# Two cache levels, each keyed by a hash of its inputs:
#   base     (this script, RIVET_VM_KERNEL_PKG): vmlinux and base.cpio, everything from Debian;
#            the .debs stay in $CACHE/debs and are only downloaded again when they change
#   overlay  (base key, guest-init, guest/*): initramfs.cpio = base.cpio + a small cpio with /init
#            and /guest (the kernel unpacks concatenated archives in order), rebuilt in about 1 s
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${RIVET_VM_CACHE:-/var/cache/rivet-vm}
FORCE=0
for a in "$@"; do
  case $a in
    --force) FORCE=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "build-image: unknown argument: $a" >&2; exit 2 ;;
  esac
done

T0=$EPOCHREALTIME
say() { printf 'build-image: %s\n' "$*"; }
die() { printf 'build-image: ERROR: %s\n' "$*" >&2; exit 1; }
elapsed() { awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# ---- cache keys -----------------------------------------------------------------------------------
BASE_KEY=$(cd "$HERE" && { sha256sum build-image.sh; echo "kernel=${RIVET_VM_KERNEL_PKG:-}"; } | sha256sum | cut -c1-16)
KEY=$(cd "$HERE" && { echo "$BASE_KEY"; sha256sum guest-init guest/*; } | sha256sum | cut -c1-16)
up_to_date() {
  [ "$FORCE" = 0 ] && [ -s "$CACHE/vmlinux" ] && [ -s "$CACHE/initramfs.cpio" ] &&
    [ "$(cat "$CACHE/image.key" 2>/dev/null)" = "$KEY" ]
}
base_up_to_date() {
  [ "$FORCE" = 0 ] && [ -s "$CACHE/vmlinux" ] && [ -s "$CACHE/base.cpio" ] && [ -x "$CACHE/busybox" ] &&
    [ "$(cat "$CACHE/base.key" 2>/dev/null)" = "$BASE_KEY" ]
}
info() { sed -n "s/^$1=//p" "$CACHE/image.info" 2>/dev/null; }
if up_to_date; then
  say "cached image is up to date (key $KEY, $(info kernel_pkg)) in $CACHE"
  exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9                     # concurrent runs: one builds, the others wait and then find it cached
if up_to_date; then say "cached image is up to date (built by a concurrent run) in $CACHE"; exit 0; fi
W=$(mktemp -d "$CACHE/work.XXXXXX")
[ "${RIVET_VM_KEEP_WORK:-0}" = 1 ] || trap 'rm -rf "$W"' EXIT

write_overlay() {  # /init and /guest on top of base.cpio -> initramfs.cpio
  local O=$W/overlay
  mkdir -p "$O/guest"
  install -m 755 "$HERE/guest-init" "$O/init"
  for g in "$HERE"/guest/*; do install -m 755 "$g" "$O/guest/"; done
  (cd "$O" && find . -mindepth 1 | LC_ALL=C sort | "$CACHE/busybox" cpio -o -H newc 2>/dev/null) > "$W/overlay.cpio"
  cat "$CACHE/base.cpio" "$W/overlay.cpio" > "$W/initramfs.cpio"
  rm -f "$CACHE/image.key"
  mv -f "$W/initramfs.cpio" "$CACHE/initramfs.cpio"
  echo "$KEY" > "$CACHE/image.key"
}
if base_up_to_date; then
  write_overlay
  say "base image cached ($(info kernel_pkg)); rewrote /init and /guest in $(elapsed) s (key $KEY)"
  exit 0
fi
say "building image (base key $BASE_KEY) in $CACHE"

# ---- host tools -----------------------------------------------------------------------------------
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || die "needs a Debian host (apt-get, dpkg-deb)"
need=()
command -v python3 >/dev/null || need+=(python3)
command -v readelf >/dev/null || need+=(binutils)
APT_UPDATED=0
apt_update() { [ "$APT_UPDATED" = 1 ] && return 0; say "apt-get update"; apt-get update -qq; APT_UPDATED=1; }
if [ ${#need[@]} -gt 0 ]; then
  say "installing host tools: ${need[*]}"
  apt_update
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
apt-cache show --no-all-versions linux-image-amd64 >/dev/null 2>&1 || apt_update

# ---- which packages -------------------------------------------------------------------------------
if [ -n "${RIVET_VM_KERNEL_PKG:-}" ]; then
  KPKG=$RIVET_VM_KERNEL_PKG
else
  # The metapackage depends on exactly one versioned image, e.g. linux-image-6.1.0-57-amd64 (= 6.1.192-3).
  KPKG=$(apt-cache show --no-all-versions linux-image-amd64 | sed -n 's/^Depends: *//p' | tr ',' '\n' |
         sed -n 's/^ *\(linux-image-[0-9][^ ]*-amd64\)\( .*\)\{0,1\}$/\1/p' | head -n1)
fi
case $KPKG in
  *-cloud-amd64|*-rt-amd64) die "$KPKG: the cloud/rt flavours lack rdma_rxe or 9p; use the plain -amd64 image" ;;
  linux-image-[0-9]*-amd64) ;;
  *) die "could not determine the kernel package (got '$KPKG')" ;;
esac
KVER=${KPKG#linux-image-}
say "kernel package: $KPKG"

# Userland roots; their library dependencies are added by walking Depends (library packages only).
# The initramfs later takes only what readelf's NEEDED closure asks for.
ROOTS=(busybox-static libibverbs1 ibverbs-providers ibverbs-utils librdmacm1 libibumad3 perftest
       iproute2 kmod libc6 libgcc-s1)
# One recursive apt-cache call, then a breadth-first walk in awk that follows only library packages.
mapfile -t PKGS < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
                      --no-replaces --no-enhances "${ROOTS[@]}" |
                    awk -v roots="${ROOTS[*]}" '
  /^[^ ]/ { cur = $1; next }
  match($0, /^ +[|]?(Pre)?Depends: /) {
    d = substr($0, RLENGTH + 1); sub(/:any$/, "", d)
    if (d !~ /^</) edges[cur] = edges[cur] " " d
  }
  END {
    n = split(roots, q, " "); for (i = 1; i <= n; i++) seen[q[i]] = 1
    for (h = 1; h <= n; h++) {
      print q[h]; m = split(edges[q[h]], e, " ")
      for (j = 1; j <= m; j++) if (!(e[j] in seen) && e[j] ~ /^(lib|zlib1g$)/) { seen[e[j]] = 1; q[++n] = e[j] }
    }
  }')
[ ${#PKGS[@]} -gt ${#ROOTS[@]} ] || die "apt-cache depends found no library packages"
PKGS+=("$KPKG")
say "${#PKGS[@]} packages: ${PKGS[*]}"

# ---- download (apt-get download, cached in $CACHE/debs) -------------------------------------------
DEBS=$CACHE/debs
mkdir -p "$DEBS"
SUDO_OPT=(); [ "$(id -u)" = 0 ] && SUDO_OPT=(-o APT::Sandbox::User=root)
fetch() {   # fills DEB_FILES; returns nonzero when a download fails (e.g. stale package lists)
  local empty line url file size hash missing=()
  empty=$(mktemp -d)
  # --print-uris run in an empty directory lists every package: 'URL' FILE SIZE SHA256:HEX
  (cd "$empty" && apt-get download --print-uris "${PKGS[@]}") > "$empty/uris" || { rm -rf "$empty"; return 1; }
  DEB_FILES=()
  local -A want=()
  while read -r url file size hash; do
    DEB_FILES+=("$file"); want[$file]=${hash#SHA256:}
    if [ -f "$DEBS/$file" ] && [ "$(stat -c %s "$DEBS/$file")" = "$size" ]; then continue; fi
    missing+=("$file")
  done < "$empty/uris"
  rm -rf "$empty"
  [ ${#DEB_FILES[@]} = ${#PKGS[@]} ] || { echo "print-uris listed ${#DEB_FILES[@]} of ${#PKGS[@]} packages" >&2; return 1; }
  if [ ${#missing[@]} -gt 0 ]; then
    say "downloading ${#missing[@]} packages"
    # apt-get download wants package names; the file name starts with NAME_VERSION (epoch ':' as %3a)
    local names=() f
    for f in "${missing[@]}"; do
      local n=${f%%_*} v=${f#*_}; v=${v%_*.deb}; v=${v//%3a/:}
      names+=("$n=$v")
    done
    (cd "$DEBS" && apt-get download -q "${SUDO_OPT[@]}" "${names[@]}") || return 1
  else
    say "all packages already in $DEBS"
  fi
  for f in "${DEB_FILES[@]}"; do
    echo "${want[$f]}  $DEBS/$f"
  done | sha256sum --quiet -c - || { echo "checksum mismatch" >&2; return 1; }
}
if ! fetch; then
  say "download failed; refreshing package lists and retrying"
  APT_UPDATED=0; apt_update
  fetch || die "could not download the packages"
fi
# drop .debs that are no longer part of the set
declare -A KEEP=(); for f in "${DEB_FILES[@]}"; do KEEP[$f]=1; done
for f in "$DEBS"/*.deb; do [ -n "${KEEP[$(basename "$f")]:-}" ] || rm -f "$f"; done

# ---- unpack ---------------------------------------------------------------------------------------
S=$W/stage; R=$W/root
mkdir -p "$S" "$R"

# Modules, in load order (dependencies first). Paths are relative to /lib/modules/$KVER/kernel.
# crc32: rxe computes its ICRC with crypto_alloc_shash("crc32"), a runtime lookup no depends= names.
MODS_BASE=(crypto/crc32_generic arch/x86/crypto/crc32-pclmul
           drivers/infiniband/core/ib_core drivers/infiniband/core/ib_uverbs
           net/ipv4/udp_tunnel net/ipv6/ip6_udp_tunnel
           drivers/infiniband/sw/rxe/rdma_rxe drivers/net/veth net/sched/sch_netem
           net/sched/sch_ingress net/sched/cls_u32 net/sched/act_gact)
# Loaded by /init only when a 9p share is requested.
MODS_9P=(drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_pci_legacy_dev
         drivers/virtio/virtio_pci_modern_dev drivers/virtio/virtio_pci
         fs/netfs/netfs fs/fscache/fscache net/9p/9pnet net/9p/9pnet_virtio fs/9p/9p)

KDEB=
for f in "${DEB_FILES[@]}"; do
  case $f in "${KPKG}"_*) KDEB=$f; continue ;; esac
  dpkg-deb -x "$DEBS/$f" "$S"
done
[ -n "$KDEB" ] || die "kernel .deb not found"
say "unpacked userland ($(elapsed) s); unpacking the kernel's vmlinuz and modules"
pats=("./boot/vmlinuz-$KVER" "./lib/modules/$KVER/modules.builtin" "./lib/modules/$KVER/modules.builtin.modinfo")
for m in "${MODS_BASE[@]}" "${MODS_9P[@]}"; do pats+=("./lib/modules/$KVER/kernel/$m.ko"); done
# tar exits nonzero for patterns it did not find (e.g. a module that became built-in): checked below
dpkg-deb --fsys-tarfile "$DEBS/$KDEB" | tar -x -C "$S" "${pats[@]}" 2>/dev/null || true
[ -f "$S/boot/vmlinuz-$KVER" ] || die "no /boot/vmlinuz-$KVER in $KDEB"

# host-side kmod from the stage, run through the stage's own dynamic loader
LDSO=$S/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
[ -x "$LDSO" ] || LDSO=$S/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
KMOD=$S/bin/kmod; [ -x "$KMOD" ] || KMOD=$S/usr/bin/kmod
LIBPATH=$S/lib/x86_64-linux-gnu:$S/usr/lib/x86_64-linux-gnu
kmod_as() { local name=$1; shift; "$LDSO" --library-path "$LIBPATH" --argv0 "$name" "$KMOD" "$@"; }

# ---- root filesystem (usr-merged) -----------------------------------------------------------------
LIBDIR=usr/lib/x86_64-linux-gnu
mkdir -p "$R"/{usr/bin,usr/sbin,$LIBDIR/libibverbs,usr/lib64,etc/libibverbs.d,etc/rivet-vm,proc,sys,dev,tmp,run,mnt/host,root}
ln -s usr/bin "$R/bin"; ln -s usr/sbin "$R/sbin"; ln -s usr/lib "$R/lib"; ln -s usr/lib64 "$R/lib64"

# busybox and its applet links (bin/x and usr/bin/x -> usr/bin/x, sbin/x and usr/sbin/x -> usr/sbin/x)
cp "$S/bin/busybox" "$R/usr/bin/busybox"
napplets=0
while read -r a; do
  n=${a##*/}; [ "$n" = busybox ] && continue
  case $a in
    sbin/*|usr/sbin/*) ln -sf ../bin/busybox "$R/usr/sbin/$n" ;;
    *)                 ln -sf busybox "$R/usr/bin/$n" ;;
  esac
  napplets=$((napplets + 1))
done < <("$S/bin/busybox" --list-full)
[ -e "$R/usr/sbin/modprobe" ] || ln -s ../bin/busybox "$R/usr/sbin/modprobe"   # kernel request_module()

# real binaries; they replace busybox applets of the same name (ip)
BINS=(ip tc rdma ibv_devinfo ibv_devices ibv_rc_pingpong ibv_ud_pingpong
      ib_write_bw ib_write_lat ib_read_bw ib_read_lat ib_send_bw ib_send_lat ib_atomic_bw ib_atomic_lat)
findbin() { local d; for d in usr/bin bin usr/sbin sbin; do [ -f "$S/$d/$1" ] && { echo "$S/$d/$1"; return 0; }; done; return 1; }
ELF_ROOTS=()
for b in "${BINS[@]}"; do
  src=$(findbin "$b") || die "binary $b not found in the unpacked packages"
  rm -f "$R/usr/bin/$b" "$R/usr/sbin/$b"
  cp -L "$src" "$R/usr/bin/$b"
  ELF_ROOTS+=("$src")
done

# the rxe verbs provider and its driver file only (no warnings about absent hardware providers)
RXE=$S/$LIBDIR/libibverbs/librxe-rdmav34.so
[ -f "$RXE" ] || RXE=$(ls "$S"/$LIBDIR/libibverbs/librxe-rdmav*.so 2>/dev/null | head -n1)
[ -f "$RXE" ] || die "rxe provider not found in ibverbs-providers"
cp -L "$RXE" "$R/$LIBDIR/libibverbs/"
ELF_ROOTS+=("$RXE")
cp "$S/etc/libibverbs.d/rxe.driver" "$R/etc/libibverbs.d/"

# shared libraries: NEEDED closure, plus what host-built test programs commonly link
# (libibverbs/librdmacm for C, libgcc_s for Rust, and glibc's compat stubs)
EXTRA_LIBS=(libibverbs.so.1 librdmacm.so.1 libgcc_s.so.1 libm.so.6 libc.so.6
            libpthread.so.0 libdl.so.2 librt.so.1 libutil.so.1)
findlib() { local d; for d in lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu; do
              [ -e "$S/$d/$1" ] && { echo "$S/$d/$1"; return 0; }; done; return 1; }
declare -A HAVE_LIB=()
MISSING=()
addlib() {  # $1 = soname
  local p n
  [ -n "${HAVE_LIB[$1]:-}" ] && return 0
  HAVE_LIB[$1]=1
  p=$(findlib "$1") || { MISSING+=("$1"); return 0; }
  cp -L "$p" "$R/$LIBDIR/$1"
  for n in $(readelf -d "$p" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do addlib "$n"; done
}
for e in "${ELF_ROOTS[@]}"; do
  for n in $(readelf -d "$e" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do addlib "$n"; done
done
for l in "${EXTRA_LIBS[@]}"; do addlib "$l"; done
[ ${#MISSING[@]} = 0 ] || die "shared libraries not found in the packages: ${MISSING[*]}"
cp -L "$S/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" "$R/$LIBDIR/"
ln -s ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$R/usr/lib64/ld-linux-x86-64.so.2"
say "binaries: ${BINS[*]}; ${#HAVE_LIB[@]} libraries"

# kernel modules; check that each one's depends= are loaded before it
MD=lib/modules/$KVER
mkdir -p "$R/usr/$MD"
declare -A LOADED=()
: > "$R/etc/rivet-vm/modules.base"; : > "$R/etc/rivet-vm/modules.9p"
add_mods() {  # $1 = list file, rest = module paths
  local list=$1 m name d; shift
  for m in "$@"; do
    name=${m##*/}; name=${name//-/_}
    if [ ! -f "$S/$MD/kernel/$m.ko" ]; then
      grep -qx "kernel/$m.ko" "$S/$MD/modules.builtin" 2>/dev/null && { LOADED[$name]=1; continue; }
      die "module $m.ko is neither in $KDEB nor built in"
    fi
    for d in $(kmod_as modinfo -F depends "$S/$MD/kernel/$m.ko" | tr ',' ' '); do
      [ -n "${LOADED[$d]:-}" ] || die "module $m needs $d, which is not loaded before it"
    done
    mkdir -p "$R/usr/$MD/kernel/${m%/*}"
    cp "$S/$MD/kernel/$m.ko" "$R/usr/$MD/kernel/$m.ko"
    echo "kernel/$m.ko" >> "$R/etc/rivet-vm/$list"
    LOADED[$name]=1
  done
}
add_mods modules.base "${MODS_BASE[@]}"
add_mods modules.9p "${MODS_9P[@]}"
cat "$R/etc/rivet-vm/modules.base" "$R/etc/rivet-vm/modules.9p" > "$R/usr/$MD/modules.order"
for f in modules.builtin modules.builtin.modinfo; do [ ! -f "$S/$MD/$f" ] || cp "$S/$MD/$f" "$R/usr/$MD/"; done
mkdir -p "$W/depmod.d"
kmod_as depmod -C "$W/depmod.d" -b "$R/usr" "$KVER"
say "modules: $(wc -l < "$R/usr/$MD/modules.order") for $KVER (depmod done)"

# /etc (/init and /guest come with the overlay)
echo "root:x:0:0:root:/root:/bin/sh" > "$R/etc/passwd"
echo "root:x:0:" > "$R/etc/group"
printf '127.0.0.1 localhost\n10.0.0.1 rxe0-host\n10.0.0.2 rxe1-host\n' > "$R/etc/hosts"
echo "hosts: files" > "$R/etc/nsswitch.conf"
printf 'kernel_pkg=%s\nkernel=%s\nbase_key=%s\n' "$KPKG" "$KVER" "$BASE_KEY" > "$R/etc/rivet-vm/image-info"

# ---- outputs --------------------------------------------------------------------------------------
(cd "$R" && find . -mindepth 1 | LC_ALL=C sort | "$S/bin/busybox" cpio -o -H newc 2>/dev/null) > "$W/base.cpio"
# vmlinuz is a bzImage: setup sectors, then the xz-compressed vmlinux ELF. Booting the ELF directly
# (PVH) skips the firmware path and the in-guest xz decompression, which costs seconds under TCG.
python3 - "$S/boot/vmlinuz-$KVER" "$W/vmlinux" <<'EOF2'
import lzma, struct, sys
d = open(sys.argv[1], 'rb').read()
setup_sects = d[0x1f1] or 4
payload_off, = struct.unpack_from('<I', d, 0x248)      # boot protocol >= 2.08
i = (setup_sects + 1) * 512 + payload_off
if d[i:i + 6] != b'\xfd7zXZ\x00':
    i = d.find(b'\xfd7zXZ\x00')                          # fall back to the xz magic
    if i < 0:
        sys.exit('no xz payload in ' + sys.argv[1])
elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(d[i:])
if elf[:4] != b'\x7fELF':
    sys.exit('payload is not an ELF image')
open(sys.argv[2], 'wb').write(elf)
EOF2
printf 'kernel_pkg=%s\nkernel=%s\nbase_key=%s\npackages=%s\n' "$KPKG" "$KVER" "$BASE_KEY" "${DEB_FILES[*]}" > "$W/image.info"
rm -f "$CACHE/base.key" "$CACHE/image.key"
mv -f "$W/vmlinux" "$CACHE/vmlinux"
mv -f "$W/base.cpio" "$CACHE/base.cpio"
cp "$S/bin/busybox" "$CACHE/busybox.tmp" && mv -f "$CACHE/busybox.tmp" "$CACHE/busybox"   # cpio for the overlay
mv -f "$W/image.info" "$CACHE/image.info"
echo "$BASE_KEY" > "$CACHE/base.key"
write_overlay
say "vmlinux $(du -h "$CACHE/vmlinux" | cut -f1), initramfs.cpio $(du -h "$CACHE/initramfs.cpio" | cut -f1)" \
    "($napplets busybox applets, kernel $KVER); key $KEY"
say "done in $(elapsed) s"
