#!/usr/bin/env bash
# Builds vgpu's container images as OCI image layouts and oci-archive tarballs,
# without a container daemon or network: the rootfs is assembled from built
# binaries, the shared libraries they link (ldd) and a few /etc files, and the
# image is made with umoci (scripts/prereqs.sh installs umoci and skopeo).
#
#   scripts/build-image.sh [--profile-dir DIR] [--out DIR] [--version V] [--no-strip]
#
# Two images, one layer (the same blob) each (docs/kubernetes.md):
#   ghcr.io/vgpu-project/vgpu:<version>                    vgpud, vgpuctl, the device plugin
#   ghcr.io/vgpu-project/vgpu-kubevirt-sidecar:<version>   the KubeVirt hook sidecar
# Output under --out (default target/image):
#   vgpu/, vgpu-kubevirt-sidecar/                OCI layouts, tag <version>
#   vgpu-<version>.oci.tar, vgpu-kubevirt-sidecar-<version>.oci.tar   oci-archives
# Each layout's index names the image (org.opencontainers.image.ref.name =
# <version>, io.containerd.image.name = the full name, for `ctr images import`).
# The binaries come from --profile-dir (default target/release; build them with
# `cargo build --release -p vgpud -p vgpu-host-tools -p vgpu-k8s`).
# packaging/Containerfile builds an image with the same binaries, entrypoints
# and labels with docker, podman or buildah.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\033[1mbuild-image:\033[0m %s\n' "$*" >&2; }
die() {
    log "$*"
    exit 1
}

# The repository's owner on GitHub's registry (Cargo.toml's workspace repository).
REGISTRY=ghcr.io/vgpu-project
SOURCE=$(sed -n '/^\[workspace.package\]/,/^\[/s/^repository = "\(.*\)"/\1/p' Cargo.toml)
BINARIES=(vgpud vgpuctl vgpu-device-plugin vgpu-kubevirt-sidecar)
# KubeVirt's virt-launcher runs QEMU (and its sidecars) as 107:107.
QEMU_ID=107

profile_dir=target/release
out=target/image
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
strip=1
while [ $# -gt 0 ]; do
    case "$1" in
    --profile-dir) profile_dir=$2 && shift 2 ;;
    --out) out=$2 && shift 2 ;;
    --version) version=$2 && shift 2 ;;
    --no-strip) strip=0 && shift ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    *) die "unknown argument $1 (--help)" ;;
    esac
done
[ -n "$version" ] || die "no version: pass --version"
for tool in umoci skopeo ldd tar sha256sum python3; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is missing: run scripts/prereqs.sh"
done
for b in "${BINARIES[@]}"; do
    [ -x "$profile_dir/$b" ] \
        || die "$profile_dir/$b is missing: cargo build --release -p vgpud -p vgpu-host-tools -p vgpu-k8s"
done
if [ "$strip" -eq 1 ] && ! command -v strip >/dev/null 2>&1; then
    log "strip is missing (binutils): the binaries go in unstripped"
    strip=0
fi
# Timestamps in the layer and the config: the last commit's, so that a rebuild
# of the same commit and binaries gives the same layer.
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)

mkdir -p "$out"
work=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/rootfs

# Debian 12's merged /usr: /lib, /lib64, /bin are links into /usr.
mkdir -p "$root"/usr/{bin,lib,lib64,local/bin} "$root"/etc/vgpu "$root"/run/vgpu \
    "$root"/tmp "$root"/var/log/vgpu "$root"/proc "$root"/sys "$root"/dev
for d in bin lib lib64; do ln -s "usr/$d" "$root/$d"; done
chmod 1777 "$root/tmp"

for b in "${BINARIES[@]}"; do
    if [ "$strip" -eq 1 ]; then
        strip -o "$root/usr/local/bin/$b" "$profile_dir/$b"
    else
        cp "$profile_dir/$b" "$root/usr/local/bin/$b"
    fi
    chmod 0755 "$root/usr/local/bin/$b"
done

# The shared libraries the binaries link, at the paths the loader finds them
# (the dynamic loader itself is listed by its absolute path). vgpud opens
# NVIDIA's libcuda.so.1 at run time with dlopen for a real GPU: it is not in
# the image but comes from the host (docs/kubernetes.md).
libs=()
for b in "${BINARIES[@]}"; do
    ldd "$profile_dir/$b" >"$work/ldd" 2>&1 || die "ldd $profile_dir/$b: $(cat "$work/ldd")"
    if grep -q 'not found' "$work/ldd"; then die "$b: $(grep 'not found' "$work/ldd")"; fi
    while read -r path; do libs+=("$path"); done < <(
        awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' "$work/ldd"
    )
done
for lib in $(printf '%s\n' "${libs[@]}" | sort -u); do
    dest=$root/usr${lib#/usr}
    case "$lib" in /usr/* | /lib/* | /lib64/*) ;; *) dest=$root$lib ;; esac
    mkdir -p "$(dirname "$dest")"
    cp -L "$lib" "$dest"
done

# Minimal /etc: users and groups (vgpud resolves socket owners by name), the
# name service, and the ld.so cache.
cat >"$root/etc/passwd" <<EOF
root:x:0:0:root:/root:/usr/sbin/nologin
qemu:x:$QEMU_ID:$QEMU_ID:KubeVirt QEMU:/:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
EOF
cat >"$root/etc/group" <<EOF
root:x:0:
kvm:x:$QEMU_ID:
qemu:x:$QEMU_ID:
nogroup:x:65534:
EOF
printf 'passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
printf '/usr/local/lib\n/usr/lib/x86_64-linux-gnu\n' >"$root/etc/ld.so.conf"
cat >"$root/etc/os-release" <<EOF
NAME="vgpu"
ID=vgpu
VERSION_ID="$version"
PRETTY_NAME="vgpu $version (binaries and libraries from Debian 12)"
HOME_URL="$SOURCE"
EOF
find "$root" -exec touch -h -d "@$epoch" {} +

layout=$out/vgpu
sidecar_layout=$out/vgpu-kubevirt-sidecar
rm -rf "$layout" "$sidecar_layout"
rootless=()
[ "$(id -u)" -eq 0 ] || rootless=(--rootless)

log "creating $layout:$version"
umoci init --layout "$layout"
umoci new --image "$layout:$version"
# One layer: the whole rootfs, owned by root in the image.
umoci insert "${rootless[@]}" --image "$layout:$version" \
    --history.created "$created" --history.created_by "scripts/build-image.sh" \
    --history.comment "vgpu $version binaries and their libraries" "$root" /

labels=(
    --config.label "org.opencontainers.image.version=$version"
    --config.label "org.opencontainers.image.source=$SOURCE"
    --config.label "org.opencontainers.image.revision=$revision"
    --config.label "org.opencontainers.image.licenses=Apache-2.0 OR MIT"
    --config.label "org.opencontainers.image.created=$created"
)
common=(
    --no-history --created "$created"
    --config.env "PATH=/usr/local/bin:/usr/bin:/bin"
    --config.env "RUST_LOG=info"
    --config.workingdir /
    --os linux --architecture amd64
)
umoci config --image "$layout:$version" "${common[@]}" "${labels[@]}" \
    --config.label "org.opencontainers.image.title=vgpu" \
    --config.label "org.opencontainers.image.description=vgpud, vgpuctl and the vgpu Kubernetes device plugin" \
    --config.user 0:0 \
    --config.entrypoint /usr/local/bin/vgpud \
    --config.cmd=--config --config.cmd=/etc/vgpu/vgpud.toml \
    --config.volume /run/vgpu
# The sidecar: the same layer, its own entrypoint and user (virt-launcher's).
umoci config --image "$layout:$version" --tag sidecar "${common[@]}" "${labels[@]}" \
    --config.label "org.opencontainers.image.title=vgpu-kubevirt-sidecar" \
    --config.label "org.opencontainers.image.description=vgpu's KubeVirt hook sidecar" \
    --config.user "$QEMU_ID:$QEMU_ID" \
    --clear config.entrypoint --clear config.cmd --clear config.volume \
    --config.entrypoint /usr/local/bin/vgpu-kubevirt-sidecar
log "creating $sidecar_layout:$version"
skopeo copy --quiet "oci:$layout:sidecar" "oci:$sidecar_layout:$version"
umoci rm --image "$layout:sidecar"
umoci gc --layout "$layout"

# Name each image in its index for containerd, and archive each layout.
archive() {
    local dir=$1 name=$2 tar=$3
    python3 - "$dir/index.json" "$name:$version" <<'PY'
import json, sys
path, name = sys.argv[1], sys.argv[2]
index = json.load(open(path))
for m in index["manifests"]:
    m.setdefault("annotations", {})["io.containerd.image.name"] = name
json.dump(index, open(path, "w"), separators=(",", ":"))
PY
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
        -C "$dir" -cf "$tar" oci-layout index.json blobs
    log "$name:$version in $tar"
}
archive "$layout" "$REGISTRY/vgpu" "$out/vgpu-$version.oci.tar"
archive "$sidecar_layout" "$REGISTRY/vgpu-kubevirt-sidecar" "$out/vgpu-kubevirt-sidecar-$version.oci.tar"
