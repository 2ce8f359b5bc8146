#!/usr/bin/env bash
# Builds the vgpu guest module for a Debian kernel without installing anything
# system-wide: downloads that kernel's headers (linux-headers-REL, its
# linux-headers-ABI-common and linux-kbuild-X.Y) with `apt-get download`,
# extracts them under a cache directory and runs
# `make -C <headers> M=<copy of this directory>`.
#
#   guest-shim/kmod/build-against-debian.sh --release 6.1.0-56-cloud-amd64 \
#       --version 6.1.192-2 --out images/out/kmod/vgpu.ko
#
# Exits 3 when the headers cannot be downloaded, 1 when the module does not build.
#
# The tests build the module for the test guest's kernel this way (the image's
# manifest names the kernel package). A second run with the same sources and
# kernel only compares a stamp.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
RELEASE=""
VERSION=""
OUT=""
CACHE="${VGPU_KMOD_CACHE:-$REPO/images/out/cache/kmod}"
QUIET=0

usage() {
    sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    echo "options: --release KERNEL_RELEASE --version PACKAGE_VERSION --out FILE [--cache DIR] [--quiet]"
}

while [ $# -gt 0 ]; do
    case "$1" in
        --release) RELEASE="$2"; shift 2 ;;
        --version) VERSION="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        --cache) CACHE="$2"; shift 2 ;;
        --quiet) QUIET=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "build-against-debian.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ -n "$RELEASE" ] && [ -n "$VERSION" ] && [ -n "$OUT" ] || { usage >&2; exit 2; }

log() { [ "$QUIET" = 1 ] || printf '[vgpu-kmod] %s\n' "$*" >&2; }
die() { printf '[vgpu-kmod] error: %s\n' "$*" >&2; exit 1; }
# Exit status when the headers cannot be downloaded (no mirror): callers may skip, not fail.
EXIT_NO_HEADERS=3

# 6.1.0-56-cloud-amd64 -> ABI 6.1.0-56, kbuild 6.1
ABI="$(printf '%s' "$RELEASE" | sed -E 's/^([0-9]+\.[0-9]+\.[0-9]+-[0-9]+).*/\1/')"
KBUILD="$(printf '%s' "$RELEASE" | sed -E 's/^([0-9]+\.[0-9]+).*/\1/')"
[ "$ABI" != "$RELEASE" ] || die "cannot read an ABI from kernel release '$RELEASE'"

mkdir -p "$CACHE" "$(dirname "$OUT")"
CACHE="$(cd "$CACHE" && pwd)"
exec 9>"$CACHE/.lock"
flock 9

SOURCES=(vgpu.c vgpu_uapi.h vgpu_virtio.h Makefile)
SUM="$(cd "$HERE" && cat "${SOURCES[@]}" | sha256sum | cut -d' ' -f1)"
WANT="release=$RELEASE version=$VERSION sources=$SUM"
if [ -f "$OUT" ] && [ "$(cat "$OUT.stamp" 2>/dev/null)" = "$WANT" ]; then
    log "up to date: $OUT"
    exit 0
fi

ROOT="$CACHE/headers-$RELEASE-$VERSION"
HDRS="$ROOT/usr/src/linux-headers-$RELEASE"
if [ ! -f "$ROOT/.complete" ]; then
    DEBS="$CACHE/debs"
    mkdir -p "$DEBS"
    log "downloading the headers of $RELEASE ($VERSION)"
    (
        cd "$DEBS"
        apt-get download -q "linux-headers-$RELEASE=$VERSION" "linux-headers-$ABI-common=$VERSION" \
            "linux-kbuild-$KBUILD" >"$CACHE/download.log" 2>&1
    ) || {
        printf '[vgpu-kmod] error: apt-get download failed (is the Debian mirror reachable? see %s)\n' \
            "$CACHE/download.log" >&2
        exit "$EXIT_NO_HEADERS"
    }
    rm -rf "$ROOT"
    mkdir -p "$ROOT"
    for deb in "$DEBS/linux-headers-${RELEASE}_"*.deb "$DEBS/linux-headers-$ABI-common_"*.deb \
               "$DEBS/linux-kbuild-${KBUILD}_"*.deb; do
        [ -f "$deb" ] || die "missing $deb after the download"
        dpkg-deb -x "$deb" "$ROOT"
    done
    # The flavour's Makefile includes the common tree by absolute path; point it into the cache.
    # (scripts/ and tools/ are relative links into usr/lib/linux-kbuild-X.Y, extracted alongside.)
    sed -i "s|^include /usr/src/|include $ROOT/usr/src/|" "$HDRS/Makefile"
    touch "$ROOT/.complete"
fi

BUILD="$(mktemp -d "${TMPDIR:-/tmp}/vgpu-kmod.XXXXXX")"
trap 'rm -rf "$BUILD"' EXIT
cp "${SOURCES[@]/#/$HERE/}" "$BUILD/"
log "building vgpu.ko for $RELEASE"
make -C "$HDRS" M="$BUILD" modules >"$BUILD/build.log" 2>&1 || {
    cat "$BUILD/build.log" >&2
    die "the module did not build against $HDRS"
}
if grep -E "warning:" "$BUILD/build.log" | grep -v "Skipping BTF" >&2; then
    die "the module built with warnings (above)"
fi
cp "$BUILD/vgpu.ko" "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
printf '%s\n' "$WANT" >"$OUT.stamp"
log "built $OUT"
