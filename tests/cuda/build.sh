#!/usr/bin/env bash
# Builds the CUDA runtime test programs with nvcc 11.8 (Debian bookworm's
# nvidia-cuda-toolkit, installed by scripts/prereqs.sh):
#
#   tests/cuda/build.sh OUTDIR
#
# Each program is built twice: OUTDIR/<name>.static (-cudart static, the
# default) and OUTDIR/<name>.shared (-cudart shared, needs libcudart.so.11.0
# at run time). The fatbin carries PTX for compute_52 only (no SASS), which the
# simulated GPU runs. At run time the programs must load vgpu's libcuda.so.1
# (LD_LIBRARY_PATH=<dir with the shim>), not NVIDIA's.
#
# nvcc's default link runs a device-link step (nvlink ... -lcudadevrt) even
# without -rdc: the programs then carry a second, empty fatbin (fat size 0)
# registered through a version-2 wrapper whose prelinked fatbin is
# libcudadevrt's relocatable image (sm_35..sm_90 cubins + compute_90 PTX).
# The variants static-nodlink and shared-nodlink skip that step (-nodlink),
# as a plain g++ link of nvcc -c objects does (CMake, setuptools).
#
# The variants cudart12 and cudart13 compile with nvcc 11.8 (-c, once) and
# link the object against a newer runtime, libcudart.so.NN in
# $CUDARTNN_DIR/lib (PyPI's nvidia-cuda-runtime-cu12 and nvidia-cuda-runtime
# 13): the same program on NVIDIA's CUDA 12 and 13 runtimes, which load fat
# binaries as libraries. (Structures whose layout changed, such as CUDA 13's
# cudaDeviceProp, differ between nvcc 11.8's headers and those runtimes:
# programs that use them need headers of their runtime's version.)
#
# Exits 0 with a message, building nothing, when nvcc or g++-11 is missing.
# Environment: NVCC (default nvcc), CCBIN (default g++-11), NVCC_FLAGS (extra),
# CUDA_VARIANTS (default "static shared"; also static-nodlink, shared-nodlink,
# cudart12, cudart13), CUDART12_DIR and CUDART13_DIR (for those).
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
OUT="$1"
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NVCC="${NVCC:-nvcc}"
CCBIN="${CCBIN:-g++-11}"

if ! command -v "$NVCC" >/dev/null 2>&1; then
    echo "tests/cuda/build.sh: nvcc not found: skipping the CUDA runtime programs (scripts/prereqs.sh installs nvidia-cuda-toolkit)"
    exit 0
fi
if ! command -v "$CCBIN" >/dev/null 2>&1; then
    echo "tests/cuda/build.sh: $CCBIN not found (nvcc 11.8 needs gcc <= 11): skipping the CUDA runtime programs"
    exit 0
fi

PROGRAMS=(runtime_basics kernels streams device_io alloc_api graphs cooperative textures mipmaps tensor_cores texrefs thrust async_copies device_heap)
# texrefs.cu uses texture and surface references, which CUDA 12 removed from the
# runtime: it is built for nvcc 11.8's own runtime (static and shared) only.
cuda11_only() { [ "$1" = texrefs ]; }
# Texture references are deprecated: texrefs.cu builds without the warnings.
quiet_of() {
    case "$1" in
        texrefs) echo "-Xcudafe --diag_suppress=1215 -Xcompiler -Wno-deprecated-declarations" ;;
    esac
}
# PTX only (code=compute_52, no code=sm_52 cubin): the simulated GPU
# interprets PTX. compute_52 is the oldest target nvcc 11.8 does not call
# deprecated (compute_35/37 warn). cooperative.cu needs compute 6.0 (a
# grid-wide barrier): compute_70. tensor_cores.cu needs compute 8.0 (bf16 and tf32 fragments),
# async_copies.cu too (cp.async and mbarrier).
gencode_of() {
    case "$1" in
        cooperative) echo "-gencode arch=compute_70,code=compute_70" ;;
        tensor_cores | async_copies) echo "-gencode arch=compute_80,code=compute_80" ;;
        *) echo "-gencode arch=compute_52,code=compute_52" ;;
    esac
}
BASE_FLAGS=(-ccbin "$CCBIN" -O2 -std=c++14 -Xcompiler -Wall)
# shellcheck disable=SC2206
EXTRA=(${NVCC_FLAGS:-})

# shellcheck disable=SC2206
VARIANTS=(${CUDA_VARIANTS:-static shared})

mkdir -p "$OUT"
for prog in "${PROGRAMS[@]}"; do
    # shellcheck disable=SC2207
    FLAGS=("${BASE_FLAGS[@]}" $(gencode_of "$prog") $(quiet_of "$prog"))
    for variant in "${VARIANTS[@]}"; do
        case "$variant" in
            static | shared) rt="$variant" link=() ;;
            static-nodlink | shared-nodlink) rt="${variant%-nodlink}" link=(-nodlink) ;;
            cudart12 | cudart13) rt="$variant" link=() ;;
            *) echo "tests/cuda/build.sh: unknown variant $variant" >&2; exit 2 ;;
        esac
        if cuda11_only "$prog" && [[ "$rt" == cudart1[0-9] ]]; then
            continue
        fi
        dst="$OUT/$prog.$variant"
        # Rebuild only when the source, the header or this script changed.
        if [ -x "$dst" ] && [ "$dst" -nt "$SRC/$prog.cu" ] && [ "$dst" -nt "$SRC/check.h" ] \
            && [ "$dst" -nt "${BASH_SOURCE[0]}" ]; then
            continue
        fi
        if [[ "$rt" == cudart1[0-9] ]]; then
            major="${rt#cudart}"
            dir_var="CUDART${major}_DIR"
            lib="${!dir_var:?$dir_var must name the CUDA $major runtime for the $rt variant}/lib"
            obj="$OUT/$prog.o"
            if ! [ "$obj" -nt "$SRC/$prog.cu" ] || ! [ "$obj" -nt "$SRC/check.h" ]; then
                "$NVCC" "${FLAGS[@]}" "${EXTRA[@]}" -c -o "$obj.tmp" "$SRC/$prog.cu"
                mv -f "$obj.tmp" "$obj"
            fi
            echo "$prog.o + $lib/libcudart.so.$major -> $dst"
            "$CCBIN" -o "$dst.tmp" "$obj" -L"$lib" -l:libcudart.so."$major" -Wl,-rpath,"$lib"
        else
            echo "nvcc -cudart $rt${link[*]:+ ${link[*]}} $prog.cu -> $dst"
            "$NVCC" "${FLAGS[@]}" "${EXTRA[@]}" -cudart "$rt" "${link[@]}" -o "$dst.tmp" "$SRC/$prog.cu"
        fi
        mv -f "$dst.tmp" "$dst"
    done
done
# rdc: two translation units with relocatable device code (-rdc=true), PTX only, linked by
# nvcc's device-link step; static and shared cudart.
for variant in "${VARIANTS[@]}"; do
    case "$variant" in
        static | shared) ;;
        *) continue ;;
    esac
    dst="$OUT/rdc.$variant"
    if [ -x "$dst" ] && [ "$dst" -nt "$SRC/rdc_main.cu" ] && [ "$dst" -nt "$SRC/rdc_lib.cu" ] \
        && [ "$dst" -nt "$SRC/rdc_common.cuh" ] && [ "$dst" -nt "$SRC/check.h" ] && [ "$dst" -nt "${BASH_SOURCE[0]}" ]; then
        continue
    fi
    echo "nvcc -rdc=true -cudart $variant rdc_main.cu rdc_lib.cu -> $dst"
    "$NVCC" "${BASE_FLAGS[@]}" -gencode arch=compute_52,code=compute_52 "${EXTRA[@]}" -rdc=true \
        -cudart "$variant" -o "$dst.tmp" "$SRC/rdc_main.cu" "$SRC/rdc_lib.cu"
    mv -f "$dst.tmp" "$dst"
done
# dynamic_parallelism: kernels launching kernels (-rdc=true, libcudadevrt), PTX only; static and
# shared cudart.
for variant in "${VARIANTS[@]}"; do
    case "$variant" in
        static | shared) ;;
        *) continue ;;
    esac
    dst="$OUT/dynamic_parallelism.$variant"
    if [ -x "$dst" ] && [ "$dst" -nt "$SRC/dynamic_parallelism.cu" ] \
        && [ "$dst" -nt "$SRC/check.h" ] && [ "$dst" -nt "${BASH_SOURCE[0]}" ]; then
        continue
    fi
    echo "nvcc -rdc=true -cudart $variant dynamic_parallelism.cu -lcudadevrt -> $dst"
    "$NVCC" "${BASE_FLAGS[@]}" -gencode arch=compute_52,code=compute_52 "${EXTRA[@]}" -rdc=true \
        -cudart "$variant" -o "$dst.tmp" "$SRC/dynamic_parallelism.cu" -lcudadevrt
    mv -f "$dst.tmp" "$dst"
done
# cdp_sync: CUDA 11's device-side cudaDeviceSynchronize (deprecated: its warning silenced), as
# dynamic_parallelism.
for variant in "${VARIANTS[@]}"; do
    case "$variant" in
        static | shared) ;;
        *) continue ;;
    esac
    dst="$OUT/cdp_sync.$variant"
    if [ -x "$dst" ] && [ "$dst" -nt "$SRC/cdp_sync.cu" ] \
        && [ "$dst" -nt "$SRC/check.h" ] && [ "$dst" -nt "${BASH_SOURCE[0]}" ]; then
        continue
    fi
    echo "nvcc -rdc=true -cudart $variant cdp_sync.cu -lcudadevrt -> $dst"
    "$NVCC" "${BASE_FLAGS[@]}" -gencode arch=compute_52,code=compute_52 "${EXTRA[@]}" -rdc=true \
        -D__CDPRT_SUPPRESS_SYNC_DEPRECATION_WARNING -cudart "$variant" -o "$dst.tmp" \
        "$SRC/cdp_sync.cu" -lcudadevrt
    mv -f "$dst.tmp" "$dst"
done
echo "tests/cuda/build.sh: $OUT has ${PROGRAMS[*]} x {${VARIANTS[*]}} (texrefs: static and shared only), rdc, dynamic_parallelism and cdp_sync (static and shared)"
