#!/usr/bin/env bash
# Installs what vgpu's demo and tests need on a Debian 12 machine with Rust:
# a C compiler, QEMU (bookworm-backports), the guest image tools (cpio,
# debootstrap for the QEMU 11.1 root of the virtio-vgpu tests), and NVRTC
# (for the PTX fixture drift check). Idempotent; prints what it installs.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\033[1mprereqs:\033[0m %s\n' "$*" >&2; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        log "not root and no sudo: skipping system packages (install gcc, cpio, busybox-static and QEMU yourself)"
    fi
fi

missing=()
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
command -v cpio >/dev/null 2>&1 || missing+=(cpio)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
if [ ${#missing[@]} -gt 0 ] && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; then
    log "installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >&2
fi

if [ "$(id -u)" -eq 0 ]; then
    images/install-qemu.sh
elif [ -n "$SUDO" ]; then
    $SUDO images/install-qemu.sh
fi

pip_install() {
    python3 -m pip install --quiet "$@" 2>/dev/null \
        || python3 -m pip install --quiet --break-system-packages "$@"
}

if ! python3 -c 'import nvidia.cuda_nvrtc, nvidia.cuda_runtime' >/dev/null 2>&1; then
    log "installing NVRTC from PyPI (compiles CUDA C++ to PTX; no GPU needed)"
    pip_install nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-runtime-cu12==12.9.79 \
        || log "NVRTC could not be installed; the PTX drift check will be skipped"
fi
if ! python3 -c 'import cuda.bindings.driver' >/dev/null 2>&1; then
    log "installing cuda-python (cuda-bindings) from PyPI for the cuda-python test"
    pip_install cuda-bindings==12.9.0 \
        || log "cuda-bindings could not be installed; the cuda-python test will be skipped"
fi
