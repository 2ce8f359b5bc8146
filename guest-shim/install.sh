#!/bin/sh
# Installs vgpu's guest side in a Linux VM: the guest shim as libcuda.so.1
# (plus the libcuda.so link), NVML's library libnvidia-ml.so.1 (a filter whose
# symbols resolve in the shim; plus libnvidia-ml.so), vgpu-smi (also as
# nvidia-smi where there is none), the loader configuration, the vsock
# module load at boot and, when it can, the vgpu kernel module for the
# virtio-vgpu device (prebuilt vgpu.ko, DKMS, or built against the kernel
# headers). POSIX sh (works with busybox ash, dash and bash).
# Run it inside the guest as root; docs/guest.md explains what it does.
#
#   sh install.sh [--from DIR] [--prefix DIR] [--libdir DIR] [--bindir DIR]
#                 [--root DIR] [--force] [--uninstall] [--quiet]
#
# Running it again with the same files changes nothing ("up to date").
set -eu

PROG=vgpu-install
MODULE=vmw_vsock_virtio_transport
# The guest module of the virtio-vgpu device (guest-shim/kmod).
KMOD=vgpu
KMOD_SIGNATURE="virtio-vgpu paravirtual GPU (vgpu project)"
KMOD_SOURCES="vgpu.c vgpu_uapi.h vgpu_virtio.h Makefile dkms.conf"
DKMS_VERSION=0.1.0
# Marks files written by this script; uninstall removes only files carrying it
# (configuration files) or, for the library, the shim's own strings.
STAMP="# written by vgpu guest-shim/install.sh"
# A string only the vgpu shim contains (its transport variable), and one only its NVML filter
# library contains.
SHIM_SIGNATURE=VGPU_TRANSPORT
NVML_SIGNATURE="vgpu NVML filter library"

usage() {
    cat <<'EOF'
usage: install.sh [options]

Installs the vgpu guest shim (libcuda.so.1, libcuda.so), its NVML library
(libnvidia-ml.so.1, libnvidia-ml.so), vgpu-smi (also as nvidia-smi when the
guest has none), an
ld.so.conf.d entry and /etc/modules-load.d/vgpu.conf (vsock at boot), and the
vgpu kernel module for the virtio-vgpu device when FROM has a vgpu.ko built
for this kernel, or the module source (FROM/kmod or kmod/ next to this script)
and the kernel headers are here (with DKMS when it is installed).

options:
  --from DIR      where libcuda.so.1 (or libcuda.so), libnvidia-ml.so.1 (or
                  libnvidia_ml.so), vgpu-smi and optionally
                  vgpu.ko or kmod/ are
                  (default: this script's directory, else ../target/release)
  --prefix DIR    installation prefix (default /usr/local): libraries go to
                  PREFIX/lib, vgpu-smi to PREFIX/bin
  --libdir DIR    library directory (default PREFIX/lib)
  --bindir DIR    program directory (default PREFIX/bin)
  --root DIR      install into the file system tree at DIR (an image being
                  built) instead of /; skips ldconfig and module loading
  --force         replace a libcuda.so.1 or libnvidia-ml.so.1 that is not
                  vgpu's (e.g. NVIDIA's)
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
# NVML's library: a filter whose symbols the loader resolves in libcuda.so.1 (docs/guest.md).
NVML1="$LIBDIR/libnvidia-ml.so.1"
NVMLLINK="$LIBDIR/libnvidia-ml.so"
SMI="$BINDIR/vgpu-smi"
# vgpu-smi also under nvidia-smi's name, for scripts that call it, where the guest has none.
NVSMI="$BINDIR/nvidia-smi"
LDCONF=/etc/ld.so.conf.d/vgpu.conf
MODCONF=/etc/modules-load.d/vgpu.conf
at() { printf '%s%s' "$ROOT" "$1"; }

if [ -z "$ROOT" ] && [ "$(id -u)" -ne 0 ]; then
    die "run me as root (sudo sh $0 …), or use --root DIR to fill a file system tree"
fi

is_shim() { [ -f "$1" ] && grep -q "$SHIM_SIGNATURE" "$1" 2>/dev/null; }
is_nvml() { [ -f "$1" ] && tr '\000' '\n' <"$1" 2>/dev/null | grep -qF "$NVML_SIGNATURE"; }
# A file this script may replace: vgpu's shim or NVML library.
is_vgpus() { is_shim "$1" || is_nvml "$1"; }
# ko_has FILE TEXT: the module file carries TEXT (its .modinfo strings are NUL-separated, which
# some greps stop at).
ko_has() { [ -f "$1" ] && tr '\000' '\n' <"$1" 2>/dev/null | grep -qF "$2"; }
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
    if is_nvml "$(at "$NVML1")" && ! [ -L "$(at "$NVML1")" ]; then
        remove "$NVML1"
    elif [ -e "$(at "$NVML1")" ] && ! [ -L "$(at "$NVML1")" ]; then
        warn "$NVML1 is not vgpu's NVML library; left in place"
    fi
    # Links that pointed to the shim (dangling now).
    for l in "$LIBLINK:libcuda.so.1" "$NVMLLINK:libnvidia-ml.so.1"; do
        path="${l%%:*}"
        if [ -L "$(at "$path")" ] && [ "$(readlink "$(at "$path")")" = "${l#*:}" ] \
            && [ ! -e "$(at "$path")" ]; then
            remove "$path"
        fi
    done
    if [ -f "$(at "$SMI")" ] && grep -q vgpu "$(at "$SMI")" 2>/dev/null; then
        remove "$SMI"
    fi
    if [ -L "$(at "$NVSMI")" ] && [ "$(readlink "$(at "$NVSMI")")" = vgpu-smi ]; then
        remove "$NVSMI"
    fi
    for f in "$LDCONF" "$MODCONF"; do
        if is_ours "$(at "$f")"; then remove "$f"; fi
    done
    if [ -z "$ROOT" ]; then
        kver="$(uname -r)"
        if command -v dkms >/dev/null 2>&1 && dkms status -m "$KMOD" -v "$DKMS_VERSION" 2>/dev/null | grep -q .; then
            dkms remove -m "$KMOD" -v "$DKMS_VERSION" --all >/dev/null 2>&1 || warn "dkms remove $KMOD/$DKMS_VERSION failed"
            rm -rf "/usr/src/$KMOD-$DKMS_VERSION"
            say "removed the $KMOD module from DKMS"
            removed=$((removed + 1))
        fi
        ko="/lib/modules/$kver/extra/$KMOD.ko"
        if ko_has "$ko" "$KMOD_SIGNATURE"; then
            remove "$ko"
            if command -v depmod >/dev/null 2>&1; then depmod -a "$kver" 2>/dev/null || true; fi
        fi
        if [ -d "/sys/module/$KMOD" ]; then
            rmmod "$KMOD" 2>/dev/null && say "unloaded the $KMOD module" \
                || warn "the $KMOD module is in use; it stays loaded until reboot"
        fi
    fi
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
# first_in DIR NAME...: the first NAME that is a file in DIR (its path), or nothing.
first_in() {
    dir="$1"; shift
    for n in "$@"; do
        if [ -f "$dir/$n" ]; then printf '%s' "$dir/$n"; return 0; fi
    done
}
SRC_LIB="$(first_in "$FROM" libcuda.so.1 libcuda.so)"
[ -n "$SRC_LIB" ] || die "no libcuda.so.1 or libcuda.so in $FROM (build it with: cargo build --release -p vgpu-shim -p vgpu-nvml, then copy target/release/libcuda.so, libnvidia_ml.so and vgpu-smi next to this script, or pass --from DIR)"
is_shim "$SRC_LIB" || die "$SRC_LIB is not the vgpu guest shim"
SRC_NVML="$(first_in "$FROM" libnvidia-ml.so.1 libnvidia_ml.so)"
[ -n "$SRC_NVML" ] || die "no libnvidia-ml.so.1 or libnvidia_ml.so in $FROM (build it with: cargo build --release -p vgpu-nvml)"
is_nvml "$SRC_NVML" || die "$SRC_NVML is not vgpu's NVML library"
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

# Another driver's libraries are replaced only with --force; checked before anything is written.
for f in "$LIB1" "$LIBLINK" "$NVML1" "$NVMLLINK"; do
    if [ -e "$(at "$f")" ] && ! is_vgpus "$(at "$f")"; then
        if [ "$FORCE" -eq 1 ]; then
            warn "replacing $f, which is not vgpu's shim (--force)"
        else
            die "$f exists and is not vgpu's shim (another driver's?); use --libdir elsewhere, or --force to replace it"
        fi
    fi
done
put "$SRC_LIB" "$LIB1" 0755
# link_to TARGET LINK: makes LINK (a guest path) a symbolic link to TARGET (a name in the
# same directory).
link_to() {
    link="$(at "$2")"
    if [ -L "$link" ] && [ "$(readlink "$link")" = "$1" ]; then
        say "up to date: $2 -> $1"
        return 0
    fi
    rm -f "$link"
    ln -s "$1" "$link"
    say "linked: $2 -> $1"
    changed=1
}
link_to libcuda.so.1 "$LIBLINK"
put "$SRC_NVML" "$NVML1" 0755
link_to libnvidia-ml.so.1 "$NVMLLINK"
put "$SRC_SMI" "$SMI" 0755
if [ -L "$(at "$NVSMI")" ] && [ "$(readlink "$(at "$NVSMI")")" = vgpu-smi ]; then
    say "up to date: $NVSMI -> vgpu-smi"
elif [ -e "$(at "$NVSMI")" ] || [ -L "$(at "$NVSMI")" ]; then
    say "$NVSMI is not vgpu's; left in place (vgpu-smi answers nvidia-smi's queries)"
elif [ -z "$ROOT" ] && other="$(command -v nvidia-smi 2>/dev/null)" && [ -n "$other" ]; then
    say "nvidia-smi is $other; not linking $NVSMI (vgpu-smi answers nvidia-smi's queries)"
else
    link_to vgpu-smi "$NVSMI"
fi

if default_loader_dir "$LIBDIR"; then
    say "$LIBDIR is a default loader directory; no ld.so.conf.d entry needed"
else
    put_text "$LDCONF" "$LIBDIR"
fi
# --- the vgpu kernel module (virtio-vgpu device) ---------------------------------
KMOD_READY=no
if [ -z "$ROOT" ]; then
    KVER="$(uname -r)"
    KMOD_DEST="/lib/modules/$KVER/extra/$KMOD.ko"
    KSRC=""
    for d in "$FROM/kmod" "$HERE/kmod"; do
        if [ -f "$d/vgpu.c" ] && [ -f "$d/Makefile" ]; then KSRC="$d"; break; fi
    done
    if [ -f "$FROM/$KMOD.ko" ]; then
        if ko_has "$FROM/$KMOD.ko" "vermagic=$KVER "; then
            put "$FROM/$KMOD.ko" "$KMOD_DEST" 0644
            KMOD_READY=yes
        else
            warn "$FROM/$KMOD.ko was built for another kernel than $KVER; not installed (the shim uses vsock)"
        fi
    elif [ -n "$KSRC" ] && [ -d "/lib/modules/$KVER/build" ]; then
        if command -v dkms >/dev/null 2>&1; then
            dsrc="/usr/src/$KMOD-$DKMS_VERSION"
            before="$changed"
            changed=0
            for f in $KMOD_SOURCES; do put "$KSRC/$f" "$dsrc/$f" 0644; done
            if [ "$changed" -eq 1 ] && dkms status -m "$KMOD" -v "$DKMS_VERSION" 2>/dev/null | grep -q .; then
                dkms remove -m "$KMOD" -v "$DKMS_VERSION" --all >/dev/null 2>&1 || true
            fi
            [ "$before" -eq 1 ] && changed=1
            dkms status -m "$KMOD" -v "$DKMS_VERSION" 2>/dev/null | grep -q . \
                || dkms add -m "$KMOD" -v "$DKMS_VERSION" >/dev/null || die "dkms add $KMOD/$DKMS_VERSION failed"
            if dkms install -m "$KMOD" -v "$DKMS_VERSION" -k "$KVER" >/dev/null 2>&1 \
                || dkms status -m "$KMOD" -v "$DKMS_VERSION" -k "$KVER" 2>/dev/null | grep -q installed; then
                say "the $KMOD module is built and installed by DKMS for $KVER (rebuilt for new kernels)"
                KMOD_READY=yes
            else
                warn "dkms install $KMOD/$DKMS_VERSION failed (see /var/lib/dkms/$KMOD/$DKMS_VERSION/build/make.log); the shim uses vsock"
            fi
        else
            kbuild="$(mktemp -d "${TMPDIR:-/tmp}/vgpu-kmod.XXXXXX")"
            for f in $KMOD_SOURCES; do cp "$KSRC/$f" "$kbuild/"; done
            if make -s -C "/lib/modules/$KVER/build" M="$kbuild" modules >"$kbuild/build.log" 2>&1; then
                put "$kbuild/$KMOD.ko" "$KMOD_DEST" 0644
                KMOD_READY=yes
            else
                warn "building the $KMOD module against /lib/modules/$KVER/build failed (log: $kbuild/build.log); the shim uses vsock"
            fi
            [ "$KMOD_READY" = no ] || rm -rf "$kbuild"
        fi
    elif [ -n "$KSRC" ]; then
        say "the $KMOD module (virtio-vgpu device) needs the kernel headers to build: install linux-headers-$KVER (and dkms) and run this again; the shim uses vsock meanwhile"
    fi
    if [ "$KMOD_READY" = yes ] && command -v depmod >/dev/null 2>&1; then
        depmod -a "$KVER" 2>/dev/null || warn "depmod failed; the $KMOD module loads with insmod only"
    fi
fi
if [ "$KMOD_READY" = yes ]; then
    put_text "$MODCONF" "$MODULE
$KMOD"
else
    put_text "$MODCONF" "$MODULE"
fi

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
    if [ "$KMOD_READY" = yes ] && [ ! -d "/sys/module/$KMOD" ]; then
        if { command -v modprobe >/dev/null 2>&1 && modprobe "$KMOD" 2>/dev/null; } || insmod "$KMOD_DEST"; then
            say "loaded the $KMOD kernel module"
        else
            warn "could not load the $KMOD module now (see dmesg); it loads at the next boot"
        fi
    elif [ "$KMOD_READY" = yes ] && [ "$changed" -eq 1 ]; then
        say "the $KMOD module was already loaded; the new one loads at the next boot (or: rmmod $KMOD; modprobe $KMOD)"
    fi
    vsock_dev=no
    for dev in /sys/bus/virtio/drivers/"$MODULE"/virtio*; do
        [ -e "$dev" ] && vsock_dev=yes
    done
    vgpu_dev=""
    for dev in /dev/vgpu[0-9]*; do
        [ -e "$dev" ] && { vgpu_dev="$dev"; break; }
    done
    if [ -n "$vgpu_dev" ]; then
        say "virtio-vgpu device present: $vgpu_dev (the shim uses it unless VGPU_TRANSPORT says otherwise; check with: vgpu-smi)"
    fi
    if [ "$vsock_dev" = yes ]; then
        say "virtio-vsock device present: the shim reaches vgpud at vsock CID 2 (check with: vgpu-smi)"
    elif [ -z "$vgpu_dev" ]; then
        warn "no virtio-vsock or virtio-vgpu device in this VM: start it with vgpud's vhost-user-vsock device or virtio-vgpu device (docs/attach.md), or set VGPU_TRANSPORT"
    fi
fi
if [ "$changed" -eq 1 ]; then
    say "done: libcuda.so.1 and libnvidia-ml.so.1 in $LIBDIR, vgpu-smi in $BINDIR"
else
    say "done: everything was up to date"
fi
