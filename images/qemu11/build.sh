#!/usr/bin/env bash
# Builds a Debian trixie root with QEMU 11.1 from trixie-backports, for the
# virtio-vgpu device's end-to-end tests: bookworm's QEMU (10.0) lacks the
# generic vhost-user device (`vhost-user-test-device-pci`, QEMU >= 10.2).
#
# Output (in images/out/qemu11/, git-ignored, or $VGPU_QEMU11_OUT):
#   root/                   `debootstrap --variant=minbase trixie` + qemu-system-x86
#   qemu-system-x86_64      a wrapper that runs the root's QEMU on the host
#   version.txt             `qemu-system-x86_64 --version` of that QEMU
#   stamp                   inputs of the build; a second run with the same
#                           inputs only compares it and exits
#
# The wrapper runs QEMU through the root's own dynamic loader with the root's
# libraries (no chroot): host paths (kernel, initrd, vhost-user sockets, logs)
# work unchanged, nothing is mounted, and QEMU runs with the caller's
# privileges. Firmware comes from the root (`-L`), modules from the root
# (QEMU_MODULE_DIR).
#
# Building needs root (debootstrap, installed with apt-get when missing; chroot
# for apt inside the root) and the Debian mirror.
# docs/vgpu-device.md describes it.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: images/qemu11/build.sh [--force] [--quiet] [--out DIR]

Builds images/out/qemu11/qemu-system-x86_64 (QEMU 11.1 from trixie-backports
in a minimal trixie root). Idempotent.

environment:
  VGPU_QEMU11_OUT     output directory (default: images/out/qemu11)
  VGPU_DEBIAN_MIRROR  Debian mirror (default: http://deb.debian.org/debian)
USAGE
}

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
IMAGES_DIR="$(dirname "$HERE")"
OUT="${VGPU_QEMU11_OUT:-$IMAGES_DIR/out/qemu11}"
MIRROR="${VGPU_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=trixie
BACKPORTS="$SUITE-backports"
PACKAGE=qemu-system-x86
# The generic vhost-user device appeared in QEMU 10.2 (as vhost-user-test-device-pci).
MIN_VERSION_MAJOR=10
MIN_VERSION_MINOR=2
FORCE=0
QUIET=0

while [ $# -gt 0 ]; do
    case "$1" in
        --force) FORCE=1; shift ;;
        --quiet) QUIET=1; shift ;;
        --out) [ $# -ge 2 ] || { echo "qemu11/build.sh: --out needs a directory" >&2; exit 2; }
               OUT="$2"; shift 2 ;;
        --out=*) OUT="${1#--out=}"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "qemu11/build.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

log() { printf '[qemu11] %s\n' "$*" >&2; }
die() { printf '[qemu11] error: %s\n' "$*" >&2; exit 1; }

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
ROOT="$OUT/root"
WRAPPER="$OUT/qemu-system-x86_64"
STAMP="$OUT/stamp"
SCRIPT_SUM="$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)"
WANT_STAMP="suite=$SUITE package=$PACKAGE/$BACKPORTS mirror=$MIRROR script=$SCRIPT_SUM"

# One build at a time per output directory (tests may start several).
exec 9>"$OUT/.lock"
flock 9

if [ "$FORCE" = 0 ] && [ -x "$WRAPPER" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$WANT_STAMP" ]; then
    [ "$QUIET" = 1 ] || log "up to date: $(cat "$OUT/version.txt")"
    exit 0
fi

[ "$(id -u)" -eq 0 ] || die "building the trixie root needs root (debootstrap and chroot); run as root or point VGPU_QEMU11 at a QEMU >= 10.2"
# Never installed from here (tests run this script; an apt job during a test run fails on the
# dpkg lock whenever another one runs): scripts/prereqs.sh installs debootstrap.
command -v debootstrap >/dev/null \
    || die "debootstrap is missing; install it with scripts/prereqs.sh (or: sudo apt-get install -y debootstrap)"

T0=$(date +%s)
TMP="$OUT/root.tmp"
# Anything mounted inside the half-built root is unmounted on every exit.
cleanup() {
    for m in "$TMP/proc" "$ROOT/proc"; do
        if mountpoint -q "$m" 2>/dev/null; then umount -l "$m" || true; fi
    done
}
trap cleanup EXIT
rm -rf "$TMP"
mkdir -p "$OUT/cache"
log "debootstrap --variant=minbase $SUITE (cache $OUT/cache)"
debootstrap --variant=minbase --cache-dir="$OUT/cache" "$SUITE" "$TMP" "$MIRROR" >"$OUT/debootstrap.log" 2>&1 \
    || die "debootstrap failed; see $OUT/debootstrap.log"
echo "deb $MIRROR $BACKPORTS main" >"$TMP/etc/apt/sources.list.d/backports.list"
# Keep downloaded packages in the shared cache.
mkdir -p "$TMP/var/cache/apt/archives"
cp -n "$OUT/cache/"*.deb "$TMP/var/cache/apt/archives/" 2>/dev/null || true
mount -t proc proc "$TMP/proc"
log "installing $PACKAGE from $BACKPORTS"
{
    chroot "$TMP" apt-get update -q
    DEBIAN_FRONTEND=noninteractive chroot "$TMP" apt-get install -y -q --no-install-recommends \
        -t "$BACKPORTS" "$PACKAGE"
} >"$OUT/apt.log" 2>&1 || die "installing $PACKAGE failed; see $OUT/apt.log"
cp -n "$TMP/var/cache/apt/archives/"*.deb "$OUT/cache/" 2>/dev/null || true
chroot "$TMP" apt-get clean >/dev/null 2>&1 || true
umount -l "$TMP/proc"

# Firmware links in the root that are absolute (/usr/share/seabios/...) would
# resolve to the host's files: make them relative, inside the root.
find "$TMP/usr/share/qemu" "$TMP/usr/share/seabios" -type l 2>/dev/null | while read -r link; do
    target="$(readlink "$link")"
    case "$target" in
        /*) ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$TMP$target")" "$link" ;;
    esac
done

rm -rf "$ROOT"
mv "$TMP" "$ROOT"

LOADER="$ROOT/lib64/ld-linux-x86-64.so.2"
[ -e "$LOADER" ] || die "the root has no dynamic loader at $LOADER"
cat >"$WRAPPER.tmp" <<WRAP
#!/bin/sh
# Generated by images/qemu11/build.sh: runs QEMU from the trixie root
# $ROOT with the root's loader and libraries.
ROOT='$ROOT'
export QEMU_MODULE_DIR="\$ROOT/usr/lib/x86_64-linux-gnu/qemu"
exec "\$ROOT/lib64/ld-linux-x86-64.so.2" \\
    --library-path "\$ROOT/usr/lib/x86_64-linux-gnu:\$ROOT/lib/x86_64-linux-gnu:\$ROOT/usr/lib/x86_64-linux-gnu/qemu" \\
    "\$ROOT/usr/bin/qemu-system-x86_64" -L "\$ROOT/usr/share/qemu" -L "\$ROOT/usr/share/seabios" "\$@"
WRAP
chmod 755 "$WRAPPER.tmp"
mv "$WRAPPER.tmp" "$WRAPPER"

VERSION="$("$WRAPPER" --version | head -n1)"
MAJOR="$(printf '%s' "$VERSION" | sed -n 's/^QEMU emulator version \([0-9]*\)\.\([0-9]*\).*/\1/p')"
MINOR="$(printf '%s' "$VERSION" | sed -n 's/^QEMU emulator version \([0-9]*\)\.\([0-9]*\).*/\2/p')"
if [ -z "$MAJOR" ] || [ "$MAJOR" -lt "$MIN_VERSION_MAJOR" ] || \
   { [ "$MAJOR" -eq "$MIN_VERSION_MAJOR" ] && [ "$MINOR" -lt "$MIN_VERSION_MINOR" ]; }; then
    die "the root's QEMU is '$VERSION'; need >= $MIN_VERSION_MAJOR.$MIN_VERSION_MINOR"
fi
"$WRAPPER" -device vhost-user-test-device-pci,help >/dev/null 2>&1 \
    || die "$VERSION has no vhost-user-test-device-pci"
printf '%s\n' "$VERSION" >"$OUT/version.txt"
printf '%s\n' "$WANT_STAMP" >"$STAMP"
log "built: $VERSION in $(( $(date +%s) - T0 )) s"
