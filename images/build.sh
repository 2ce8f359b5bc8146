#!/usr/bin/env bash
# Builds the vgpu test/demo guest: a Debian bookworm cloud kernel plus a small
# busybox initramfs with glibc and the virtio/vsock modules.
#
# Output (in images/out/, git-ignored):
#   vmlinuz            the guest kernel
#   initrd.cpio.gz     the base initramfs (append a payload cpio to add files)
#   manifest.txt       what is in the image (versions, modules, every file)
#   .stage/            the unpacked root file system (for inspection)
#   cache/             downloaded .debs and their extracted trees, shared by
#                      every --out directory ($VGPU_IMAGE_CACHE to move it)
#
# A second run with nothing changed only compares a stamp and exits.
# docs/guest-image.md describes the image and the /init protocol.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: images/build.sh [options]

Builds images/out/vmlinuz and images/out/initrd.cpio.gz (cached).

options:
  --add HOST:GUEST   copy HOST file into the image at GUEST path (repeatable);
                     ELF files bring the shared libraries ldd reports
  --out DIR          output directory (default: images/out, or $VGPU_IMAGE_OUT)
  --force            rebuild even when the stamp says the image is up to date
  --quiet            print nothing when the image is already up to date
  -h, --help         this text

environment:
  VGPU_GUEST_KERNEL_PKG   kernel package (default: what linux-image-cloud-amd64
                          depends on in bookworm, e.g. linux-image-6.1.0-56-cloud-amd64)
  VGPU_GUEST_MODULES      extra kernel modules to load at boot (space separated)
  VGPU_IMAGE_OUT          output directory (like --out)
  VGPU_IMAGE_CACHE        download cache (default: images/out/cache)
EOF
}

IMAGES_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${VGPU_IMAGE_OUT:-$IMAGES_DIR/out}"
FORCE=0
QUIET=0
ADDS=()

while [ $# -gt 0 ]; do
    case "$1" in
        --add) [ $# -ge 2 ] || { echo "build.sh: --add needs HOST:GUEST" >&2; exit 2; }
               ADDS+=("$2"); shift 2 ;;
        --add=*) ADDS+=("${1#--add=}"); shift ;;
        --out) [ $# -ge 2 ] || { echo "build.sh: --out needs a directory" >&2; exit 2; }
               OUT="$2"; shift 2 ;;
        --out=*) OUT="${1#--out=}"; shift ;;
        --force) FORCE=1; shift ;;
        --quiet) QUIET=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "build.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

# Modules the guest loads at boot; their dependencies are computed from
# modules.dep. Built-in ones (serial 8250 on the cloud kernel) are skipped.
# virtio_blk and ext4 let a test attach a read-only disk (the host's Python
# and packages for the CuPy guest test, tests/python/disk.sh).
WANTED_MODULES="virtio_pci virtio_console vsock vmw_vsock_virtio_transport_common vmw_vsock_virtio_transport vsock_loopback virtio_blk ext4 ${VGPU_GUEST_MODULES:-}"
KERNEL_META=linux-image-cloud-amd64
MULTIARCH=x86_64-linux-gnu
# Fixed timestamp for every file in the image, so identical inputs give an
# identical initrd.
IMAGE_EPOCH=1700000000

T0=$(date +%s.%N)
log() { printf '[guest-image] %s\n' "$*" >&2; }
die() { printf '[guest-image] error: %s\n' "$*" >&2; exit 1; }
elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f s", b - a }'; }

CACHE="${VGPU_IMAGE_CACHE:-$IMAGES_DIR/out/cache}"
mkdir -p "$OUT" "$CACHE"
OUT="$(cd "$OUT" && pwd)"
CACHE="$(cd "$CACHE" && pwd)"

# One build per output directory at a time (tests may call this from several
# processes); the download cache, shared by all outputs, has its own lock.
exec 9>"$OUT/.lock"
flock 9

# --- host prerequisites ------------------------------------------------------
# command -> Debian package that provides it
declare -A PREREQ=(
    [apt-get]=apt [dpkg-deb]=dpkg [cpio]=cpio [gzip]=gzip [depmod]=kmod
    [ldd]=libc-bin [flock]=util-linux [sha256sum]=coreutils [file]=file
)
missing=()
for cmd in "${!PREREQ[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$cmd" >/dev/null 2>&1 \
        || missing+=("${PREREQ[$cmd]}")
done
export PATH="$PATH:/usr/sbin:/sbin"
if [ ${#missing[@]} -gt 0 ]; then
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
    # Never installed from here: tests run this script, and an apt job in the middle of a test
    # run fails on the dpkg lock whenever another one runs. scripts/prereqs.sh installs them.
    die "missing host tools (${missing[*]}); install them with scripts/prereqs.sh" \
        "(or: sudo apt-get install -y ${missing[*]})"
fi

# --- resolve package versions (local apt lists; no network) ------------------
candidate() { apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ { print $2; exit }'; }

apt_update_once() {
    # Never updated from here (tests run this script; see the host prerequisites above).
    die "apt lists do not know '$1'; run scripts/prereqs.sh (it runs apt-get update)"
}

# apt-cache takes ~0.5 s a call here, so the resolution is cached for as long
# as the apt lists (and the requested kernel package) do not change.
RESOLVED="$CACHE/resolved.env"
LISTS_SIG="$( { printf '%s\n' "kernel_pkg=${VGPU_GUEST_KERNEL_PKG:-}";
    stat -c '%n %s %Y' /var/lib/apt/lists/*Packages* /etc/apt/preferences /etc/apt/preferences.d/* 2>/dev/null || true; } \
    | sha256sum | awk '{ print $1 }')"
KERNEL_PKG="" KERNEL_VER="" BUSYBOX_VER=""
if [ -f "$RESOLVED" ] && [ "$(sed -n 's/^LISTS_SIG=//p' "$RESOLVED")" = "$LISTS_SIG" ]; then
    KERNEL_PKG="$(sed -n 's/^KERNEL_PKG=//p' "$RESOLVED")"
    KERNEL_VER="$(sed -n 's/^KERNEL_VER=//p' "$RESOLVED")"
    BUSYBOX_VER="$(sed -n 's/^BUSYBOX_VER=//p' "$RESOLVED")"
fi
if [ -z "$KERNEL_PKG" ] || [ -z "$KERNEL_VER" ] || [ -z "$BUSYBOX_VER" ]; then
    KERNEL_PKG="${VGPU_GUEST_KERNEL_PKG:-}"
    if [ -z "$KERNEL_PKG" ]; then
        kernel_dep() {
            apt-cache depends "$KERNEL_META" 2>/dev/null \
                | awk '/Depends: linux-image-/ { print $2; exit }'
        }
        KERNEL_PKG="$(kernel_dep)"
        if [ -z "$KERNEL_PKG" ]; then
            apt_update_once "$KERNEL_META"
            KERNEL_PKG="$(kernel_dep)"
        fi
        [ -n "$KERNEL_PKG" ] || die "cannot find the kernel package that $KERNEL_META depends on"
    fi
    resolve_version() {
        local v
        v="$(candidate "$1")"
        if [ -z "$v" ] || [ "$v" = "(none)" ]; then
            apt_update_once "$1"
            v="$(candidate "$1")"
        fi
        if [ -z "$v" ] || [ "$v" = "(none)" ]; then die "no installable version of package '$1'"; fi
        printf '%s' "$v"
    }
    KERNEL_VER="$(resolve_version "$KERNEL_PKG")"
    BUSYBOX_VER="$(resolve_version busybox-static)"
    printf 'LISTS_SIG=%s\nKERNEL_PKG=%s\nKERNEL_VER=%s\nBUSYBOX_VER=%s\n' \
        "$LISTS_SIG" "$KERNEL_PKG" "$KERNEL_VER" "$BUSYBOX_VER" >"$RESOLVED"
fi
LIBC_VER="$(dpkg-query -W -f='${Version}' libc6)"
LIBGCC_VER="$(dpkg-query -W -f='${Version}' libgcc-s1 2>/dev/null || echo none)"

# --- parse --add specs and compute the cache key -----------------------------
ADD_HOST=()
ADD_GUEST=()
for spec in "${ADDS[@]+"${ADDS[@]}"}"; do
    host="${spec%%:*}"
    guest="${spec#*:}"
    if [ "$host" = "$spec" ] || [ -z "$host" ] || [ -z "$guest" ]; then
        die "--add '$spec' is not HOST:GUEST"
    fi
    [[ "$guest" == /* ]] || die "--add '$spec': the guest path must be absolute"
    [[ "$guest" != */ ]] || die "--add '$spec': the guest path names a directory, not a file"
    [ -f "$host" ] || die "--add '$spec': host file '$host' does not exist"
    ADD_HOST+=("$host")
    ADD_GUEST+=("$guest")
done

KEY_INPUT="$(
    sha256sum "$IMAGES_DIR/build.sh" "$IMAGES_DIR/init" | awk '{ print $1 }'
    printf '%s\n' "kernel=$KERNEL_PKG $KERNEL_VER" "busybox=$BUSYBOX_VER" "libc6=$LIBC_VER" \
        "libgcc=$LIBGCC_VER" "modules=$WANTED_MODULES"
    for i in "${!ADD_HOST[@]}"; do
        printf 'add %s %s\n' "${ADD_GUEST[$i]}" "$(sha256sum <"${ADD_HOST[$i]}" | awk '{ print $1 }')"
    done
)"
KEY="$(printf '%s' "$KEY_INPUT" | sha256sum | awk '{ print $1 }')"

if [ "$FORCE" -eq 0 ] && [ -f "$OUT/.stamp" ] && [ "$(cat "$OUT/.stamp")" = "$KEY" ] \
    && [ -f "$OUT/vmlinuz" ] && [ -f "$OUT/initrd.cpio.gz" ] && [ -f "$OUT/manifest.txt" ]; then
    [ "$QUIET" -eq 1 ] || log "up to date: $OUT ($KERNEL_PKG $KERNEL_VER, checked in $(elapsed))"
    exit 0
fi

log "building the guest image in $OUT"
log "kernel $KERNEL_PKG $KERNEL_VER, busybox-static $BUSYBOX_VER, host glibc $LIBC_VER"

# --- download and extract packages -------------------------------------------
# fetch_deb PKG VERSION -> prints the path of the cached .deb
fetch_deb() {
    local pkg="$1" ver="$2" deb tmp
    deb="$CACHE/debs/${pkg}_${ver//:/%3a}_amd64.deb"
    if [ ! -s "$deb" ]; then
        mkdir -p "$CACHE/debs"
        # Drop other cached versions of this package.
        rm -f "$CACHE/debs/${pkg}_"*.deb
        tmp="$(mktemp -d "$CACHE/dl.XXXXXX")"
        log "downloading $pkg $ver"
        (cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root "$pkg=$ver" >/dev/null) \
            || { rm -rf "$tmp"; die "apt-get download $pkg=$ver failed (is the network or the apt mirror reachable?)"; }
        mv "$tmp"/*.deb "$deb"
        rm -rf "$tmp"
    fi
    printf '%s' "$deb"
}

# extract_deb PKG VERSION -> prints the directory of the extracted tree
extract_deb() {
    local pkg="$1" ver="$2" deb dir
    deb="$(fetch_deb "$pkg" "$ver")"
    dir="$CACHE/extract/${pkg}_${ver//:/%3a}"
    if [ ! -f "$dir/.done" ]; then
        rm -rf "$CACHE/extract/${pkg}_"*
        mkdir -p "$dir"
        log "extracting $(basename "$deb")"
        dpkg-deb -x "$deb" "$dir"
        touch "$dir/.done"
    fi
    printf '%s' "$dir"
}

exec 8>"$CACHE/.lock"
flock 8
KTREE="$(extract_deb "$KERNEL_PKG" "$KERNEL_VER")"
BBTREE="$(extract_deb busybox-static "$BUSYBOX_VER")"

KREL="$(basename "$(find "$KTREE/lib/modules" -mindepth 1 -maxdepth 1 -type d | head -n1)")"
[ -n "$KREL" ] || die "$KERNEL_PKG has no lib/modules/<release> directory"
[ -f "$KTREE/boot/vmlinuz-$KREL" ] || die "$KERNEL_PKG has no boot/vmlinuz-$KREL"
KMOD="$KTREE/lib/modules/$KREL"
if [ ! -f "$KMOD/modules.dep" ]; then
    log "computing module dependencies (depmod $KREL)"
    depmod -b "$KTREE" "$KREL"
fi

# --- module closure in load order --------------------------------------------
declare -A MOD_PATH=()     # name -> path relative to $KMOD
declare -A MOD_DEPS=()     # name -> space-separated dep names
modname() { local b; b="${1##*/}"; b="${b%%.ko*}"; printf '%s' "${b//-/_}"; }
# awk turns "kernel/a/b-c.ko: kernel/x.ko ..." into "b_c kernel/a/b-c.ko x ..."
while read -r name path deps; do
    MOD_PATH[$name]="$path"
    MOD_DEPS[$name]="$deps"
done < <(awk -F': *' '
    function mod(p,  b) { b = p; sub(/.*\//, "", b); sub(/\.ko.*/, "", b); gsub(/-/, "_", b); return b }
    { line = mod($1) " " $1; n = split($2, d, " "); for (i = 1; i <= n; i++) line = line " " mod(d[i]); print line }
' "$KMOD/modules.dep")
declare -A BUILTIN=()
while read -r name; do BUILTIN[$name]=1; done < <(awk '{ sub(/.*\//, ""); sub(/\.ko.*/, ""); gsub(/-/, "_"); print }' "$KMOD/modules.builtin")

declare -A VISITED=()
ORDER=()
visit() {
    local m="$1" d
    [ -z "${VISITED[$m]:-}" ] || return 0
    VISITED[$m]=1
    for d in ${MOD_DEPS[$m]}; do visit "$d"; done
    ORDER+=("$m")
}
for m in $WANTED_MODULES; do
    m="${m//-/_}"
    if [ -n "${BUILTIN[$m]:-}" ]; then
        log "module $m is built into $KREL"
    elif [ -n "${MOD_PATH[$m]:-}" ]; then
        visit "$m"
    else
        die "kernel $KREL has no module '$m' (neither built in nor in modules.dep)"
    fi
done
log "modules (load order): ${ORDER[*]}"

# --- stage the root file system ----------------------------------------------
STAGE="$OUT/.stage"
rm -rf "$STAGE"
mkdir -p "$STAGE"
MANIFEST_FILES="$OUT/.files.txt"
: >"$MANIFEST_FILES"

# Merged /usr like Debian 12: /bin, /sbin, /lib, /lib64 are links into /usr.
mkdir -p "$STAGE"/{usr/bin,usr/sbin,usr/lib/$MULTIARCH,usr/lib64,usr/local/bin,usr/local/lib} \
    "$STAGE"/{etc/vgpu,proc,sys,dev,tmp,run,root,var/tmp,mnt}
for d in bin sbin lib lib64; do ln -s "usr/$d" "$STAGE/$d"; done
TOP_LINKS="bin sbin lib lib64"

# guest_path HOSTPATH -> the canonical guest path (through /usr for merged dirs)
canonical() {
    local p="$1" first rest
    first="${p#/}"; first="${first%%/*}"
    rest="${p#/"$first"}"
    case " $TOP_LINKS " in *" $first "*) printf '/usr/%s%s' "$first" "$rest" ;; *) printf '%s' "$p" ;; esac
}

# put SRC GUEST ORIGIN: copy a file (following links) into the stage
put() {
    local src="$1" guest dst
    guest="$(canonical "$2")"
    dst="$STAGE$guest"
    mkdir -p "$(dirname "$dst")"
    cp -L --preserve=mode "$src" "$dst"
    printf 'file\t%s\t%s\n' "$guest" "$3" >>"$MANIFEST_FILES"
}

# busybox and its applets
put "$BBTREE/bin/busybox" /usr/bin/busybox "busybox-static $BUSYBOX_VER"
while IFS= read -r applet; do
    case "$applet" in
        bin/*|sbin/*) target="/usr/$applet" ;;
        *) target="/$applet" ;;
    esac
    [ -e "$STAGE$target" ] || [ -L "$STAGE$target" ] || ln -s /usr/bin/busybox "$STAGE$target"
done < <("$BBTREE/bin/busybox" --list-full)

# glibc (runtime libraries only, no gconv modules or debug helpers), libgcc_s,
# the loader and ldconfig, all from the host (Debian 12 like the guest kernel)
for pkg in libc6 libgcc-s1; do
    ver="$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null)" || continue
    while IFS= read -r f; do
        [ -f "$f" ] && put "$f" "$f" "host $pkg $ver"
    done < <(dpkg -L "$pkg" | grep -E "/$MULTIARCH/[^/]*\.so(\.[0-9]+)*\$" \
                 | grep -vE 'libmemusage|libpcprofile|libc_malloc_debug|libSegFault')
done
ln -sf /lib/$MULTIARCH/ld-linux-x86-64.so.2 "$STAGE/usr/lib64/ld-linux-x86-64.so.2"
put /sbin/ldconfig /usr/sbin/ldconfig "host libc-bin $LIBC_VER"
printf 'include /etc/ld.so.conf.d/*.conf\n' >"$STAGE/etc/ld.so.conf"
mkdir -p "$STAGE/etc/ld.so.conf.d"
printf '/usr/local/lib\n/usr/local/lib/%s\n/lib/%s\n/usr/lib/%s\n/payload/lib\n' \
    "$MULTIARCH" "$MULTIARCH" "$MULTIARCH" >"$STAGE/etc/ld.so.conf.d/$MULTIARCH.conf"

# add_with_libs HOST GUEST ORIGIN: copy a file and, for ELF files, its libraries
add_with_libs() {
    local host="$1" guest="$2" origin="$3" lib
    put "$host" "$guest" "$origin"
    if file -L "$host" | grep -q 'ELF .*dynamically linked'; then
        while IFS= read -r lib; do
            [ -e "$STAGE$(canonical "$lib")" ] || put "$lib" "$lib" "ldd of $guest"
        done < <(ldd "$host" 2>/dev/null | awk '/=> \// { print $3 } /^\t\// { print $1 }')
        if ldd "$host" 2>/dev/null | grep -q 'not found'; then
            die "--add $host: ldd reports missing libraries: $(ldd "$host" | grep 'not found' | tr -s ' \t\n' ' ')"
        fi
    fi
}
for i in "${!ADD_HOST[@]}"; do
    add_with_libs "${ADD_HOST[$i]}" "${ADD_GUEST[$i]}" "--add ${ADD_HOST[$i]}"
done

# kernel modules (kept at their usual paths so that modprobe works too)
: >"$STAGE/etc/vgpu/modules.order"
for m in "${ORDER[@]}"; do
    rel="${MOD_PATH[$m]}"
    put "$KMOD/$rel" "/lib/modules/$KREL/$rel" "$KERNEL_PKG $KERNEL_VER"
    printf '%s /lib/modules/%s/%s\n' "$m" "$KREL" "$rel" >>"$STAGE/etc/vgpu/modules.order"
done
cp "$KMOD/modules.builtin" "$KMOD/modules.order" "$STAGE/usr/lib/modules/$KREL/"
[ -f "$KMOD/modules.builtin.modinfo" ] && cp "$KMOD/modules.builtin.modinfo" "$STAGE/usr/lib/modules/$KREL/"
depmod -b "$STAGE/usr" "$KREL"

# /init and small /etc files
install -m 0755 "$IMAGES_DIR/init" "$STAGE/init"
printf 'file\t/init\timages/init\n' >>"$MANIFEST_FILES"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$STAGE/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$STAGE/etc/group"
printf 'vgpu-guest\n' >"$STAGE/etc/hostname"
printf 'export PS1="vgpu-guest:\\w# "\n' >"$STAGE/etc/profile"
printf 'kernel_release=%s\n' "$KREL" >"$STAGE/etc/vgpu/image-release"

# Pre-build the loader cache; /init reruns ldconfig only for payload libraries.
ldconfig -r "$STAGE" 2>/dev/null || log "warning: ldconfig -r failed; the guest will run ldconfig at boot"

# --- pack --------------------------------------------------------------------
find "$STAGE" -exec touch -h -d "@$IMAGE_EPOCH" {} +
TMP_INITRD="$OUT/.initrd.cpio.gz.tmp"
(cd "$STAGE" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort \
    | cpio --quiet -o -H newc -R 0:0 --reproducible | gzip -n -6) >"$TMP_INITRD"
cp "$KTREE/boot/vmlinuz-$KREL" "$OUT/.vmlinuz.tmp"

{
    printf '# vgpu guest image manifest (generated by images/build.sh; do not edit)\n'
    printf 'key=%s\n' "$KEY"
    printf 'kernel_release=%s\n' "$KREL"
    printf 'kernel_package=%s %s\n' "$KERNEL_PKG" "$KERNEL_VER"
    printf 'busybox=%s\n' "$BUSYBOX_VER"
    printf 'glibc=%s\n' "$LIBC_VER"
    printf 'modules=%s\n' "${ORDER[*]}"
    printf 'initrd_bytes=%s\n' "$(stat -c %s "$TMP_INITRD")"
    for d in $TOP_LINKS; do printf 'symlink\t/%s\t/usr/%s\n' "$d" "$d"; done
    LC_ALL=C sort -u "$MANIFEST_FILES"
} >"$OUT/.manifest.txt.tmp"

mv "$OUT/.vmlinuz.tmp" "$OUT/vmlinuz"
mv "$TMP_INITRD" "$OUT/initrd.cpio.gz"
mv "$OUT/.manifest.txt.tmp" "$OUT/manifest.txt"
printf '%s' "$KEY" >"$OUT/.stamp"
log "done in $(elapsed): $OUT/vmlinuz, $OUT/initrd.cpio.gz ($(( $(stat -c %s "$OUT/initrd.cpio.gz") / 1024 )) KiB), $OUT/manifest.txt"
