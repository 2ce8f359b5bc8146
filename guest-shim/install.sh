#!/bin/sh
# Installs vgpu's guest side in a Linux VM: the guest shim as libcuda.so.1
# (plus the libcuda.so link), vgpu-smi, the loader configuration, and the vsock
# module load at boot. POSIX sh (works with busybox ash, dash and bash).
# Run it inside the guest as root; docs/guest.md explains what it does.
#
#   sh install.sh [--from DIR] [--prefix DIR] [--libdir DIR] [--bindir DIR]
#                 [--root DIR] [--force] [--uninstall] [--quiet]
#
# Running it again with the same files changes nothing ("up to date").
set -eu

PROG=vgpu-install
MODULE=vmw_vsock_virtio_transport
# Marks files written by this script; uninstall removes only files carrying it
# (configuration files) or, for the library, the shim's own strings.
STAMP="# written by vgpu guest-shim/install.sh"
# A string only the vgpu shim contains (its transport variable).
SHIM_SIGNATURE=VGPU_TRANSPORT

usage() {
    cat <<'EOF'
usage: install.sh [options]

Installs the vgpu guest shim (libcuda.so.1, libcuda.so), vgpu-smi, an
ld.so.conf.d entry and /etc/modules-load.d/vgpu.conf (vsock at boot).

options:
  --from DIR      where libcuda.so.1 (or libcuda.so) and vgpu-smi are
                  (default: this script's directory, else ../target/release)
  --prefix DIR    installation prefix (default /usr/local): libraries go to
                  PREFIX/lib, vgpu-smi to PREFIX/bin
  --libdir DIR    library directory (default PREFIX/lib)
  --bindir DIR    program directory (default PREFIX/bin)
  --root DIR      install into the file system tree at DIR (an image being
                  built) instead of /; skips ldconfig and module loading
  --force         replace a libcuda.so.1 that is not vgpu's (e.g. NVIDIA's)
  --uninstall     remove what an install with the same options put in place
  --quiet         print only warnings and errors
  -h, --help      this text

environment at run time (see docs/guest.md): VGPU_TRANSPORT, VGPU_LOG,
VGPU_ASYNC_BATCH, VGPU_FLUSH_US.
EOF
}

say() { [ "$QUIET" -eq 1 ] || printf '%s: %s\n' "$PROG" "$*"; }
warn() { printf '%s: warning: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

need_arg() {
    if [ $# -lt 2 ] || [ -z "$2" ]; then
        printf '%s: %s needs a value (see --help)\n' "$PROG" "$1" >&2
        exit 2
    fi
}

FROM=""
PREFIX=/usr/local
LIBDIR=""
BINDIR=""
ROOT=""
FORCE=0
UNINSTALL=0
QUIET=0
while [ $# -gt 0 ]; do
    case "$1" in
        --from) need_arg "$@"; FROM="$2"; shift 2 ;;
        --from=*) FROM="${1#*=}"; shift ;;
        --prefix) need_arg "$@"; PREFIX="$2"; shift 2 ;;
        --prefix=*) PREFIX="${1#*=}"; shift ;;
        --libdir) need_arg "$@"; LIBDIR="$2"; shift 2 ;;
        --libdir=*) LIBDIR="${1#*=}"; shift ;;
        --bindir) need_arg "$@"; BINDIR="$2"; shift 2 ;;
        --bindir=*) BINDIR="${1#*=}"; shift ;;
        --root) need_arg "$@"; ROOT="$2"; shift 2 ;;
        --root=*) ROOT="${1#*=}"; shift ;;
        --force) FORCE=1; shift ;;
        --uninstall) UNINSTALL=1; shift ;;
        --quiet|-q) QUIET=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) printf "%s: unknown argument '%s' (see --help)\\n" "$PROG" "$1" >&2; exit 2 ;;
    esac
done

for d in "$PREFIX" "${LIBDIR:-/}" "${BINDIR:-/}"; do
    case "$d" in
        /*) ;;
        *) printf "%s: '%s' is not an absolute path\\n" "$PROG" "$d" >&2; exit 2 ;;
    esac
done
PREFIX="${PREFIX%/}"
LIBDIR="${LIBDIR:-$PREFIX/lib}"
BINDIR="${BINDIR:-$PREFIX/bin}"
if [ -n "$ROOT" ]; then
    [ -d "$ROOT" ] || die "--root $ROOT is not a directory"
    ROOT="$(cd "$ROOT" && pwd)"
    [ "$ROOT" != / ] || ROOT=""
fi

# Paths as the guest sees them, and where this run writes them.
LIB1="$LIBDIR/libcuda.so.1"
LIBLINK="$LIBDIR/libcuda.so"
SMI="$BINDIR/vgpu-smi"
LDCONF=/etc/ld.so.conf.d/vgpu.conf
MODCONF=/etc/modules-load.d/vgpu.conf
at() { printf '%s%s' "$ROOT" "$1"; }

if [ -z "$ROOT" ] && [ "$(id -u)" -ne 0 ]; then
    die "run me as root (sudo sh $0 …), or use --root DIR to fill a file system tree"
fi

is_shim() { [ -f "$1" ] && grep -q "$SHIM_SIGNATURE" "$1" 2>/dev/null; }
is_ours() { [ -f "$1" ] && grep -qF "$STAMP" "$1" 2>/dev/null; }

find_ldconfig() {
    for c in ldconfig /sbin/ldconfig /usr/sbin/ldconfig; do
        if command -v "$c" >/dev/null 2>&1; then command -v "$c"; return 0; fi
    done
    return 1
}

run_ldconfig() {
    if [ -n "$ROOT" ]; then
        say "not running ldconfig for --root $ROOT (the system runs it at boot or when you run it)"
        return 0
    fi
    if LDCONFIG="$(find_ldconfig)"; then
        "$LDCONFIG" || warn "ldconfig failed; programs may not find libcuda.so.1 until it runs"
        say "updated the loader cache (ldconfig)"
    else
        warn "no ldconfig here: programs find libcuda.so.1 only through LD_LIBRARY_PATH=$LIBDIR"
    fi
}

# A directory the loader searches without configuration.
default_loader_dir() {
    case "$1" in
        /lib|/usr/lib|/lib64|/usr/lib64|/lib/*-linux-gnu|/usr/lib/*-linux-gnu) return 0 ;;
    esac
    return 1
}

# ---------------------------------------------------------------------------
if [ "$UNINSTALL" -eq 1 ]; then
    removed=0
    remove() {
        rm -f "$(at "$1")"
        say "removed $1"
        removed=$((removed + 1))
    }
    if is_shim "$(at "$LIB1")"; then
        remove "$LIB1"
    elif [ -e "$(at "$LIB1")" ]; then
        warn "$LIB1 is not vgpu's shim; left in place"
    fi
    if [ -L "$(at "$LIBLINK")" ] && [ "$(readlink "$(at "$LIBLINK")")" = libcuda.so.1 ] \
        && [ ! -e "$(at "$LIB1")" ]; then
        remove "$LIBLINK"
    fi
    if [ -f "$(at "$SMI")" ] && grep -q vgpu "$(at "$SMI")" 2>/dev/null; then
        remove "$SMI"
    fi
    for f in "$LDCONF" "$MODCONF"; do
        if is_ours "$(at "$f")"; then remove "$f"; fi
    done
    if [ "$removed" -eq 0 ]; then
        say "nothing to remove under $LIBDIR, $BINDIR and /etc (installed with other --prefix/--libdir?)"
    else
        run_ldconfig
        say "uninstalled ($removed files)"
    fi
    exit 0
fi

# --- sources -------------------------------------------------------------------
HERE="$(cd "$(dirname "$0")" && pwd)"
if [ -z "$FROM" ]; then
    FROM="$HERE"
    if [ ! -f "$FROM/libcuda.so.1" ] && [ ! -f "$FROM/libcuda.so" ] && [ -d "$HERE/../target/release" ]; then
        FROM="$(cd "$HERE/../target/release" && pwd)"
    fi
fi
[ -d "$FROM" ] || die "--from $FROM is not a directory"
SRC_LIB=""
for c in "$FROM/libcuda.so.1" "$FROM/libcuda.so"; do
    if [ -f "$c" ]; then SRC_LIB="$c"; break; fi
done
[ -n "$SRC_LIB" ] || die "no libcuda.so.1 or libcuda.so in $FROM (build it with: cargo build --release -p vgpu-shim, then copy target/release/libcuda.so and vgpu-smi next to this script, or pass --from DIR)"
is_shim "$SRC_LIB" || die "$SRC_LIB is not the vgpu guest shim"
SRC_SMI="$FROM/vgpu-smi"
[ -f "$SRC_SMI" ] || die "no vgpu-smi in $FROM"

# --- install ---------------------------------------------------------------------
changed=0
# put SRC DEST MODE: copy unless identical; replaces through a rename so a
# program using the old file keeps running.
put() {
    src="$1"; dest="$2"; mode="$3"; real="$(at "$dest")"
    if [ -f "$real" ] && cmp -s "$src" "$real"; then
        chmod "$mode" "$real"
        say "up to date: $dest"
        return 0
    fi
    mkdir -p "$(dirname "$real")"
    tmp="$real.vgpu-new.$$"
    cp "$src" "$tmp"
    chmod "$mode" "$tmp"
    if [ -e "$real" ]; then what=updated; else what=installed; fi
    mv -f "$tmp" "$real"
    say "$what: $dest"
    changed=1
}

# put_text DEST TEXT: a configuration file carrying $STAMP.
put_text() {
    dest="$1"; real="$(at "$dest")"
    tmp="$(mktemp "${TMPDIR:-/tmp}/vgpu-install.XXXXXX")"
    printf '%s\n%s\n' "$STAMP" "$2" >"$tmp"
    if [ -e "$real" ] && ! is_ours "$real"; then
        rm -f "$tmp"
        warn "$dest exists and was not written by this script; left alone"
        return 0
    fi
    put "$tmp" "$dest" 0644
    rm -f "$tmp"
}

LIB1_REAL="$(at "$LIB1")"
if [ -e "$LIB1_REAL" ] && ! is_shim "$LIB1_REAL"; then
    if [ "$FORCE" -eq 1 ]; then
        warn "replacing $LIB1, which is not vgpu's shim (--force)"
    else
        die "$LIB1 exists and is not vgpu's shim (another CUDA driver?); use --libdir elsewhere, or --force to replace it"
    fi
fi
put "$SRC_LIB" "$LIB1" 0755
link="$(at "$LIBLINK")"
if [ -L "$link" ] && [ "$(readlink "$link")" = libcuda.so.1 ]; then
    say "up to date: $LIBLINK -> libcuda.so.1"
else
    if [ -e "$link" ] && ! [ -L "$link" ] && ! is_shim "$link" && [ "$FORCE" -eq 0 ]; then
        die "$LIBLINK exists and is not vgpu's; use --force to replace it"
    fi
    ln -sf libcuda.so.1 "$link"
    say "linked: $LIBLINK -> libcuda.so.1"
    changed=1
fi
put "$SRC_SMI" "$SMI" 0755

if default_loader_dir "$LIBDIR"; then
    say "$LIBDIR is a default loader directory; no ld.so.conf.d entry needed"
else
    put_text "$LDCONF" "$LIBDIR"
fi
put_text "$MODCONF" "$MODULE"

in_cache() {
    LDCONFIG="$(find_ldconfig)" && "$LDCONFIG" -p 2>/dev/null | grep -qF "=> $LIB1"
}
if [ "$changed" -eq 1 ]; then
    run_ldconfig
elif [ -z "$ROOT" ] && ! in_cache; then
    run_ldconfig
fi

# --- checks (only on a live system) -----------------------------------------------
if [ -z "$ROOT" ]; then
    if LDCONFIG="$(find_ldconfig)"; then
        others="$("$LDCONFIG" -p 2>/dev/null | awk -v mine="$LIB1" '/libcuda\.so\.1 / { p = $NF; if (p != mine) print p }' || true)"
        for o in $others; do
            case "$o" in
                "$LIB1") ;;
                *) is_shim "$o" || warn "another libcuda.so.1 is in the loader cache: $o (programs may load it instead of vgpu's)" ;;
            esac
        done
    fi
    if [ ! -d /sys/module/$MODULE ]; then
        if command -v modprobe >/dev/null 2>&1 && modprobe $MODULE 2>/dev/null; then
            say "loaded the $MODULE kernel module"
        else
            warn "could not load $MODULE now; it loads at the next boot (modules-load.d) if the kernel has it"
        fi
    fi
    vsock_dev=no
    for dev in /sys/bus/virtio/drivers/"$MODULE"/virtio*; do
        [ -e "$dev" ] && vsock_dev=yes
    done
    if [ "$vsock_dev" = yes ]; then
        say "virtio-vsock device present: the shim reaches vgpud at vsock CID 2 (check with: vgpu-smi)"
    else
        warn "no virtio-vsock device in this VM: start it with vgpud's vhost-user-vsock device (docs/attach.md), or set VGPU_TRANSPORT"
    fi
fi
if [ "$changed" -eq 1 ]; then
    say "done: libcuda.so.1 in $LIBDIR, vgpu-smi in $BINDIR"
else
    say "done: everything was up to date"
fi
