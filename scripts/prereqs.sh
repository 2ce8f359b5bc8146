#!/usr/bin/env bash
# Installs what vgpu's demo and tests need on a Debian 12 machine with Rust:
# a C compiler, QEMU (bookworm-backports), the container image tools (umoci,
# skopeo), the guest image tools (cpio,
# debootstrap for the QEMU 11.1 root of the virtio-vgpu tests), NVRTC (for
# the PTX fixture drift check) and Debian's CUDA 11.8 toolkit (nvcc, with
# g++-11, for the CUDA runtime programs in tests/cuda/). Idempotent; prints
# what it installs.
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
command -v mke2fs >/dev/null 2>&1 || missing+=(e2fsprogs)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
# libvirt's daemon and clients (tests/libvirt_domain.rs; docs/libvirt.md).
command -v libvirtd >/dev/null 2>&1 || missing+=(libvirt-daemon-system)
command -v virsh >/dev/null 2>&1 || missing+=(libvirt-clients)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
# scripts/build-image.sh makes the container images without a daemon (umoci); skopeo reads them
# back and converts them (k8s/tests/it/image.rs; docs/kubernetes.md). strip is in binutils.
command -v umoci >/dev/null 2>&1 || missing+=(umoci)
command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
command -v strip >/dev/null 2>&1 || missing+=(binutils)
# CUDA's graphics interop headers (cudaGL.h, cudaEGL.h, cudaVDPAU.h) include OpenGL's, EGL's and
# VDPAU's: the test that every function of the driver API's headers links preprocesses them.
[ -f /usr/include/GL/gl.h ] || missing+=(libgl-dev)
[ -f /usr/include/EGL/eglext.h ] || missing+=(libegl-dev)
[ -f /usr/include/vdpau/vdpau.h ] || missing+=(libvdpau-dev)
# The host tools images/build.sh uses to build the guest image (it never installs them itself:
# the tests run it, and an apt job during a test run fails whenever another one holds the lock).
for tool in dpkg-deb:dpkg gzip:gzip depmod:kmod ldd:libc-bin flock:util-linux \
    sha256sum:coreutils file:file; do
    command -v "${tool%%:*}" >/dev/null 2>&1 \
        || PATH="$PATH:/usr/sbin:/sbin" command -v "${tool%%:*}" >/dev/null 2>&1 \
        || missing+=("${tool#*:}")
done
# images/build.sh resolves the guest kernel and busybox from the local apt lists.
apt_lists_stale=0
if command -v apt-cache >/dev/null 2>&1; then
    apt-cache depends linux-image-cloud-amd64 2>/dev/null | grep -q 'Depends: linux-image-' \
        || apt_lists_stale=1
    case "$(apt-cache policy busybox-static 2>/dev/null | awk '/Candidate:/ { print $2; exit }')" in
    "" | "(none)") apt_lists_stale=1 ;;
    esac
fi
if { [ ${#missing[@]} -gt 0 ] || [ "$apt_lists_stale" -eq 1 ]; } \
    && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; then
    $SUDO apt-get update -qq
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >&2
    fi
fi

# cargo-fuzz for scripts/fuzz.sh (a short libFuzzer run of every target in
# the test command). It builds from crates.io once (a few minutes).
if ! cargo fuzz --version >/dev/null 2>&1; then
    log "installing cargo-fuzz 0.13.2 (for scripts/fuzz.sh)"
    cargo install --locked --quiet cargo-fuzz@0.13.2 \
        || log "cargo-fuzz could not be installed; the fuzz run will be skipped"
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
if ! command -v kubernetes-validate >/dev/null 2>&1; then
    log "installing kubernetes-validate from PyPI (Kubernetes' OpenAPI schemas, for deploy/ checks)"
    pip_install kubernetes-validate==1.37.0 \
        || log "kubernetes-validate could not be installed; the manifest test will fail and say so"
fi
if ! python3 -c 'import nvidia.cublas' >/dev/null 2>&1; then
    log "installing NVIDIA's cuBLAS from PyPI for the library test (about 580 MB)"
    pip_install --no-deps nvidia-cublas-cu12==12.9.3.13 \
        || log "cuBLAS could not be installed; its test will fail and say so"
fi
if ! python3 -c 'import nvidia.cufft' >/dev/null 2>&1; then
    log "installing NVIDIA's cuFFT from PyPI for the library test (about 200 MB)"
    pip_install --no-deps nvidia-cufft-cu12==11.4.1.4 \
        || log "cuFFT could not be installed; its test will fail and say so"
fi
if ! python3 -c 'import nvidia.cu13' >/dev/null 2>&1; then
    log "installing NVIDIA's CUDA 13 runtime from PyPI for the runtime tests"
    pip_install nvidia-cuda-runtime==13.5.37 \
        || log "the CUDA 13 runtime could not be installed; its tests will fail and say so"
fi
if ! python3 -c 'import nvidia.nvml_dev' >/dev/null 2>&1 \
    || [ ! -f "$(python3 -c 'import nvidia.cu13 as m; print(list(m.__path__)[0])' 2>/dev/null)/include/nvml.h" ]; then
    log "installing NVML's CUDA 12.9 and 13.5 headers from PyPI for the NVML test (under 1 MB)"
    pip_install --no-deps nvidia-nvml-dev-cu12==12.9.79 nvidia-nvml-dev==13.5.37 \
        || log "NVML's headers could not be installed; their test will fail and say so"
fi
if ! python3 -c 'import cupy' >/dev/null 2>&1; then
    log "installing CuPy (cupy-cuda12x) from PyPI for the CuPy test"
    pip_install cupy-cuda12x==14.2.0 \
        || log "CuPy could not be installed; the CuPy test will be skipped"
fi
if ! python3 -c 'import cuda.bindings.driver, numba.cuda, cuda.core.graph' >/dev/null 2>&1; then
    # numba-cuda without its [cu12] extra: no nvJitLink, so numba links
    # through the driver (cuLink*), which vgpu answers with PTX the simulated
    # GPU runs. NVVM comes from nvidia-cuda-nvcc-cu12.
    # cuda.core (a numba-cuda dependency) is pinned too: the graph builder test uses it.
    log "installing cuda-python (cuda-bindings), cuda.core and numba-cuda from PyPI for the Python tests"
    pip_install cuda-bindings==12.9.10 numba-cuda==0.30.4 nvidia-cuda-nvcc-cu12==12.9.86 \
        cuda-core==1.2.2 cuda-pathfinder==1.9.1 \
        || log "cuda-bindings or numba-cuda could not be installed; their tests will be skipped"
fi
if ! python3 -c 'import pytest, filecheck' >/dev/null 2>&1; then
    # numba-cuda's own test modules (run by the numba-cuda test) import them.
    log "installing pytest and filecheck from PyPI for numba-cuda's own tests"
    pip_install pytest==9.2.0 filecheck==1.0.6 \
        || log "pytest or filecheck could not be installed; numba-cuda's own tests will be skipped"
fi
# PyTorch, in a virtual environment of its own: its wheel pins NVIDIA's CUDA 13
# libraries (cuDNN, NCCL, cuBLAS...; about 5 GB installed), which must not
# replace the CUDA 12 ones the other packages use. tests/python_driver.rs
# finds it at the same path.
TORCH_VENV=${VGPU_TORCH_VENV:-$HOME/.cache/vgpu/torch-venv}
if ! "$TORCH_VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
    log "installing PyTorch 2.15 into $TORCH_VENV for the PyTorch test (about 3 GB to download)"
    { python3 -m venv "$TORCH_VENV" \
        && "$TORCH_VENV/bin/python" -m pip install --quiet torch==2.15.0; } \
        || log "PyTorch could not be installed; its test will be skipped"
fi
if ! python3 -c 'import pynvml' >/dev/null 2>&1; then
    # NVIDIA's NVML binding, for the test of the shim's libnvidia-ml.so.1.
    log "installing pynvml (nvidia-ml-py) from PyPI for the NVML test"
    pip_install nvidia-ml-py==13.580.82 \
        || log "nvidia-ml-py could not be installed; the pynvml test will be skipped"
fi
if ! python3 -c 'import gpustat, nvitop' >/dev/null 2>&1; then
    # The GPU monitors tenants run, on pynvml (the version above, which both accept).
    log "installing gpustat and nvitop from PyPI for the GPU monitor test"
    pip_install gpustat==1.1.1 nvitop==1.7.2 nvidia-ml-py==13.580.82 \
        || log "gpustat or nvitop could not be installed; the monitor test will be skipped"
fi

# Debian's CUDA 11.8 toolkit (nvcc, cuobjdump, NVIDIA's libcudart) from
# bookworm's contrib/non-free components, and g++-11 (nvcc 11.8 rejects gcc
# 12). It is a large download (about 1.6 GB, 5.3 GB installed); it also pulls
# in NVIDIA's libcuda.so.1 and libnvidia-ml.so.1, which vgpu's tests override
# with the shim. Anything that fails here is logged and skipped: the tests
# that need nvcc then fail and say so. VGPU_NO_CUDA_TOOLKIT=1 skips it.
NONFREE_SOURCES=/etc/apt/sources.list.d/vgpu-nonfree.sources
install_cuda_toolkit() {
    local codename
    codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
    if [ "$codename" != bookworm ]; then
        log "not Debian bookworm ($codename): install nvcc 11.8 and g++-11 yourself"
        return 1
    fi
    $SUDO apt-get update -qq || return 1
    # madison lists only what the enabled sources offer (nvidia-support is in
    # contrib, the toolkit in non-free).
    if [ -z "$(apt-cache madison nvidia-cuda-toolkit 2>/dev/null)" ] \
        || [ -z "$(apt-cache madison nvidia-support 2>/dev/null)" ]; then
        log "enabling bookworm contrib/non-free in $NONFREE_SOURCES"
        $SUDO tee "$NONFREE_SOURCES" >/dev/null <<'SOURCES' || return 1
# Added by vgpu scripts/prereqs.sh for nvidia-cuda-toolkit (nvcc 11.8).
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: contrib non-free non-free-firmware
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: contrib non-free non-free-firmware
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
        $SUDO apt-get update -qq || return 1
    fi
    log "installing nvidia-cuda-toolkit and g++-11 (about 1.6 GB to download)"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends nvidia-cuda-toolkit g++-11 >&2 || return 1
}
if [ "${VGPU_NO_CUDA_TOOLKIT:-0}" = 1 ]; then
    :
elif command -v nvcc >/dev/null 2>&1 && command -v g++-11 >/dev/null 2>&1; then
    :
elif [ "$(id -u)" -ne 0 ] && [ -z "$SUDO" ]; then
    log "not root: skipping nvcc 11.8 (the CUDA runtime tests will fail and say so)"
elif ! install_cuda_toolkit; then
    log "nvcc 11.8 could not be installed; the CUDA runtime tests will fail and say so"
fi

# libvirt's QEMU runs as libvirt-qemu (group kvm). On hosts without udev,
# /dev/kvm stays root-only: libvirt then finds KVM gone after every probe,
# probes QEMU's capabilities again on every call (tens of seconds each) and
# cannot use KVM. Give it to group kvm, mode 0660, as Debian's udev rules do.
if [ -c /dev/kvm ] && [ "$(stat -c %G /dev/kvm)" = root ] && getent group kvm >/dev/null \
    && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; then
    log "giving /dev/kvm to group kvm (mode 0660), as udev would"
    $SUDO chgrp kvm /dev/kvm && $SUDO chmod 0660 /dev/kvm
fi
