#!/usr/bin/env bash
# Makes a per-run initrd for the vgpu test/demo guest: the base image's
# initramfs followed by a second cpio archive with your files, the way the
# Rust harness does it (tests/src/qemu.rs). Linux unpacks concatenated
# archives one after the other, so the base image stays generic and cached.
#
# usage: images/payload-initrd.sh --out FILE [--base INITRD] [--script FILE]
#                                 [--add HOST:GUEST]...
#
#   --out FILE        the initrd to write (pass it to QEMU's -initrd)
#   --base INITRD     the base initramfs (default: images/out/initrd.cpio.gz,
#                     built by images/build.sh)
#   --script FILE     becomes /payload/run.sh, which /init runs at boot (its
#                     exit status is printed as VGPU-GUEST-EXIT <status>)
#   --add HOST:GUEST  puts a host file at an absolute guest path (repeatable);
#                     its mode is kept. Programs may use the libraries the
#                     image has (glibc, libgcc_s) or files you add. Use /usr/…
#                     paths: /bin, /sbin, /lib and /lib64 are links into /usr.
#
# docs/guest-image.md describes the image and /init; docs/guest.md the guest
# shim and its install script.
set -euo pipefail

IMAGES_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BASE="$IMAGES_DIR/out/initrd.cpio.gz"
OUT=""
SCRIPT=""
ADDS=()
# Linux finds an appended archive only at a 4-byte aligned offset.
ALIGN=4

die() { printf 'payload-initrd: %s\n' "$*" >&2; exit 1; }
usage_error() { printf 'payload-initrd: %s (see --help)\n' "$*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --out) [ $# -ge 2 ] || usage_error "--out needs a file"; OUT="$2"; shift 2 ;;
        --base) [ $# -ge 2 ] || usage_error "--base needs a file"; BASE="$2"; shift 2 ;;
        --script) [ $# -ge 2 ] || usage_error "--script needs a file"; SCRIPT="$2"; shift 2 ;;
        --add) [ $# -ge 2 ] || usage_error "--add needs HOST:GUEST"; ADDS+=("$2"); shift 2 ;;
        -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) usage_error "unknown argument '$1'" ;;
    esac
done
[ -n "$OUT" ] || usage_error "--out FILE is required"
[ -f "$BASE" ] || die "no base initrd at $BASE; build it with images/build.sh"
command -v cpio >/dev/null 2>&1 || die "cpio is missing; install it (apt-get install cpio)"

STAGE="$(mktemp -d "${TMPDIR:-/tmp}/vgpu-payload.XXXXXX")"
TMP_OUT="$OUT.tmp.$$"
trap 'rm -rf "$STAGE" "$TMP_OUT"' EXIT

add() {
    local host="$1" guest="$2" first
    [[ "$guest" == /* ]] || die "guest path '$guest' is not absolute"
    [[ "$guest" != */ && "$guest" != *//* && "$guest" != */./* && "$guest" != */../* ]] \
        || die "guest path '$guest' is not a plain file path"
    first="${guest#/}"; first="${first%%/*}"
    case "$first" in
        bin|sbin|lib|lib64) die "guest path '$guest' goes through the /$first link; use /usr/$first/… instead" ;;
    esac
    [ -f "$host" ] || die "host file '$host' does not exist"
    [ ! -e "$STAGE$guest" ] || die "two files go to '$guest'"
    mkdir -p "$(dirname "$STAGE$guest")"
    cp -L --preserve=mode "$host" "$STAGE$guest"
}

for spec in "${ADDS[@]+"${ADDS[@]}"}"; do
    host="${spec%%:*}"
    guest="${spec#*:}"
    if [ "$host" = "$spec" ] || [ -z "$host" ] || [ -z "$guest" ]; then
        usage_error "--add '$spec' is not HOST:GUEST"
    fi
    add "$host" "$guest"
done
if [ -n "$SCRIPT" ]; then
    [ -f "$SCRIPT" ] || die "script '$SCRIPT' does not exist"
    [ ! -e "$STAGE/payload/run.sh" ] || die "--script and an --add both write /payload/run.sh"
    add "$SCRIPT" /payload/run.sh
    chmod 0755 "$STAGE/payload/run.sh"
fi
# Directories the kernel creates from the archive get these permissions.
find "$STAGE" -mindepth 1 -type d -exec chmod 0755 {} +

cp "$BASE" "$TMP_OUT"
size="$(stat -c %s "$TMP_OUT")"
truncate -s $(( (size + ALIGN - 1) / ALIGN * ALIGN )) "$TMP_OUT"
(cd "$STAGE" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort \
    | cpio --quiet -o -H newc -R 0:0) >>"$TMP_OUT"
mv "$TMP_OUT" "$OUT"
