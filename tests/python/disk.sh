#!/usr/bin/env bash
# Builds a read-only ext4 disk image holding this host's Python and the
# packages a guest test needs (CuPy and what it loads), for a QEMU guest to
# mount at the same path as on the host:
#
#   tests/python/disk.sh OUT.img PACKAGE...
#
# PACKAGE is an importable top-level name in site-packages (cupy, numpy, …)
# or a path under site-packages (nvidia/cuda_nvrtc). The image holds the
# interpreter, its shared library, the standard library (without its tests)
# and those packages with their .dist-info; lib-extra/ holds the system
# libraries they link against that a minimal guest lacks (found with ldd).
# The image is rebuilt only when the package list or an input changed (a
# stamp next to it records both).
set -euo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 OUT.img PACKAGE..." >&2
    exit 2
fi
OUT="$1"
shift
PY="$(python3 -c 'import sys; print(sys.prefix)')"
VER="$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
SITE="$PY/lib/python$VER/site-packages"

STAMP="$OUT.stamp"
want="$PY $* $(cd "$SITE" && { ls -d "$@" 2>/dev/null || true; } | xargs -r stat -c '%n:%Y' | tr '\n' ' ')"
if [ -f "$OUT" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
    exit 0
fi

mkdir -p "$(dirname "$OUT")"
STAGE="$(mktemp -d "${OUT}.stage.XXXXXX")"
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/lib/python$VER/site-packages" "$STAGE/lib-extra"
cp -a "$PY/bin/python$VER" "$STAGE/bin/"
ln -s "python$VER" "$STAGE/bin/python3"
cp -a "$PY"/lib/libpython"$VER"*.so* "$STAGE/lib/" 2>/dev/null || true
# The standard library, hard-linked where the file system allows.
(cd "$PY/lib/python$VER" && find . -path ./site-packages -prune -o -path ./test -prune \
    -o -path ./idlelib -prune -o -path ./tkinter -prune -o -type f -print0) |
    (cd "$PY/lib/python$VER" && cpio --null -pdm --quiet "$STAGE/lib/python$VER")
for p in "$@"; do
    src="$SITE/$p"
    [ -e "$src" ] || { echo "disk.sh: $src does not exist" >&2; exit 1; }
    mkdir -p "$STAGE/lib/python$VER/site-packages/$(dirname "$p")"
    cp -a "$src" "$STAGE/lib/python$VER/site-packages/$p"
    # Its distribution metadata (importlib.metadata lookups).
    base="${p%%/*}"
    for d in "$SITE/${base//-/_}"*.dist-info "$SITE/${base}"-*.dist-info; do
        [ -d "$d" ] && cp -a "$d" "$STAGE/lib/python$VER/site-packages/"
    done
    [ -f "$SITE/$(dirname "$p")/__init__.py" ] &&
        cp -a "$SITE/$(dirname "$p")/__init__.py" "$STAGE/lib/python$VER/site-packages/$(dirname "$p")/"
done
# System libraries the interpreter and the packages' extension modules link
# against (libstdc++, libffi, zlib, …), except glibc's, which every guest has.
find "$STAGE" -type f \( -name '*.so' -o -name '*.so.*' -o -name "python$VER" \) -print0 |
    xargs -0 ldd 2>/dev/null |
    awk '/=> \// { print $3 }' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' |
    grep -v "^$PY" | grep -v "^$STAGE" |
    while read -r lib; do cp -L "$lib" "$STAGE/lib-extra/"; done

size_kib=$(( $(du -sk "$STAGE" | cut -f1) * 12 / 10 + 65536 ))
rm -f "$OUT.tmp"
mke2fs -q -t ext4 -O ^has_journal -L vgpu-python -d "$STAGE" "$OUT.tmp" "${size_kib}k"
mv -f "$OUT.tmp" "$OUT"
echo "$want" > "$STAMP"
echo "tests/python/disk.sh: $OUT ($(du -sh "$OUT" | cut -f1)) has python$VER and $*"
