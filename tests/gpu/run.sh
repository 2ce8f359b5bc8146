#!/usr/bin/env bash
# The device conformance suite on a real NVIDIA GPU.
#
#   tests/gpu/run.sh build   # on a build machine with Rust: release test binaries
#                            # (stripped) into tests/out/gpu/ (ignored by git)
#   tests/gpu/run.sh         # on the GPU machine: run them, print a summary
#   tests/gpu/run.sh --no-sim   # the same without the simulated GPU's suite (CI runs it;
#                               # it only spends the GPU machine's time)
#
# The GPU machine needs the NVIDIA driver (libcuda.so.1) and nothing else: no
# Rust, no network. With the device tool, from the repository root:
#   tests/gpu/run.sh build
#   run(command="tests/gpu/run.sh", carry=["tests/out/gpu"], timeout_s=600)
# If tests/out/gpu has no binaries and cargo is installed there, the script
# builds them first. It finishes in well under 10 minutes (about a minute of
# checks on an H200); each stage has its own time limit.
#
# What runs: tests/conformance_cuda.rs (the suite of tests/src/conformance.rs
# through devices/cuda, the executor's own checks, and a copy-bandwidth
# benchmark against the driver's pinned copies), and for comparison the same
# suite on the simulated GPU (tests/conformance_sim.rs). Then, printed only,
# `vgpu-bench overflow --device cuda`: a kernel's bandwidth over device-resident
# memory vs the same buffer overflowed to host memory (read across PCIe), and a
# demotion/promotion vs a device-to-device copy of the same size (needs a driver
# that creates host memory with cuMemCreate, CUDA 12.2+; otherwise it says so).
# Then tests/gpu/shim.sh: vgpud serving the GPU to the C programs of tests/c, the nvcc-built
# runtime programs of tests/cuda and, where installed there, CuPy and PyTorch, all on vgpu's
# libcuda.so.1 (the guest's path, over a unix socket).
# The summary repeats conformance_cuda's "VMM isolation probe: ..." line: the
# verdict of the probe vgpud runs when it opens a GPU (docs/memory.md). Anything
# but "isolated" turns off movable allocations (no host overflow) and guests'
# cuMemCreate on that GPU, and the checks then expect those refused.
# Logs go to $OUT when the device tool sets it.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="$ROOT/tests/out/gpu"
TESTS=(conformance_cuda conformance_sim)
# The test binary of each (conformance_sim is a module of the e2e binary, run with its name as a
# filter).
test_binary() { if [[ "$1" == conformance_sim ]]; then echo e2e; else echo "$1"; fi; }
test_filter() { if [[ "$1" == conformance_sim ]]; then echo "conformance_sim::"; fi; }
# Seconds each stage may run (each can be set in the environment).
LIMIT_CUDA=${LIMIT_CUDA:-420}
LIMIT_SIM=${LIMIT_SIM:-120}
LIMIT_BENCH=${LIMIT_BENCH:-90}
LIMIT_SHIM=${LIMIT_SHIM:-300}
# The overflow benchmark on the GPU: buffer sizes in MiB.
BENCH_ARGS=(overflow --device cuda --runs 5 --kernel-mib 256 --move-mib 1024)

build() {
    mkdir -p "$BIN"
    for t in "${TESTS[@]}"; do
        local exe
        exe="$(cd "$ROOT" && cargo test --release -p vgpu-tests --test "$(test_binary "$t")" --no-run \
            --message-format=json 2>/dev/null |
            sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)"
        if [[ -z "$exe" || ! -x "$exe" ]]; then
            echo "build: cargo did not produce the $t test binary" >&2
            (cd "$ROOT" && cargo test --release -p vgpu-tests --test "$(test_binary "$t")" --no-run) >&2
            exit 1
        fi
        objcopy --strip-debug "$exe" "$BIN/$t"
        echo "build: $BIN/$t ($(du -h "$BIN/$t" | cut -f1))"
    done
    (cd "$ROOT" && cargo build --release -p vgpu-bench) >&2 || exit 1
    objcopy --strip-debug "$ROOT/target/release/vgpu-bench" "$BIN/vgpu-bench"
    echo "build: $BIN/vgpu-bench ($(du -h "$BIN/vgpu-bench" | cut -f1))"
    build_shim
    # The newest glibc symbol version the binaries need (the GPU machine must have it).
    echo "build: needs glibc $(objdump -T $(find "$BIN" -type f -perm -u+x) | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1)"
}

# What tests/gpu/shim.sh runs: vgpud, the guest's libraries and programs built against them.
build_shim() {
    local shim="$BIN/shim" rel="$ROOT/target/release"
    mkdir -p "$shim/lib" "$shim/cuda"
    (cd "$ROOT" && cargo build --release -p vgpud -p vgpu-shim -p vgpu-nvml -p vgpu-host-tools) >&2 ||
        exit 1
    strip -o "$shim/vgpud" "$rel/vgpud"
    strip -o "$shim/vgpu-smi" "$rel/vgpu-smi"
    strip -o "$shim/lib/libcuda.so.1" "$rel/libcuda.so"
    strip -o "$shim/lib/libnvidia-ml.so.1" "$rel/libnvidia_ml.so"
    for p in driver_api driver_api_ext sync_threads ctx_events memcpy_batch3d stream_mem_ops graphs; do
        cc -O1 -Wall -Werror -o "$shim/c-$p" "$ROOT/tests/c/$p.c" -L"$shim/lib" -l:libcuda.so.1 ||
            exit 1
    done
    # The nvcc 11.8 runtime programs, built by the test suite (tests/cuda/build.sh) if nvcc is here.
    local cuda="$ROOT/target/debug/cuda-programs"
    if [[ ! -x "$cuda/kernels.static" ]] && command -v nvcc >/dev/null; then
        "$ROOT/tests/cuda/build.sh" "$cuda" >&2 || exit 1
    fi
    for p in runtime_basics kernels streams graphs alloc_api device_io cooperative textures; do
        [[ -x "$cuda/$p.static" ]] && strip -o "$shim/cuda/$p.static" "$cuda/$p.static"
    done
    echo "build: $shim ($(du -sh "$shim" | cut -f1))"
}

NO_SIM=0
if [[ "${1:-}" == "--no-sim" ]]; then
    NO_SIM=1
    TESTS=(conformance_cuda)
fi

if [[ "${1:-}" == "build" ]]; then
    build
    exit 0
fi

OUTDIR="${OUT:-$(mktemp -d)}"
echo "== machine"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi -L 2>&1 | head -n 8
    nvidia-smi --query-gpu=name,driver_version,memory.total,mig.mode.current --format=csv 2>&1 | head -n 4
else
    echo "nvidia-smi: not available"
fi
ldconfig -p 2>/dev/null | grep -m1 'libcuda.so.1' || echo "libcuda.so.1 is not in the loader cache"
echo "glibc: $(ldd --version 2>&1 | head -n 1)"

if [[ ! -x "$BIN/conformance_cuda" ]]; then
    if command -v cargo >/dev/null; then
        echo "== building (no prepared binaries in $BIN)"
        build || exit 1
    else
        echo "FATAL: no test binaries in $BIN and no cargo here: run 'tests/gpu/run.sh build' on a build machine and carry tests/out/gpu" >&2
        exit 2
    fi
fi

declare -A STATUS
run_one() {
    local name="$1" limit="$2"
    echo "== $name (limit ${limit}s)"
    local t0=$SECONDS
    # shellcheck disable=SC2046 # the filter is one word or none
    RUST_BACKTRACE=1 timeout "$limit" "$BIN/$name" $(test_filter "$name") --nocapture --test-threads=1 2>&1 |
        tee "$OUTDIR/$name.log"
    local rc=${PIPESTATUS[0]}
    STATUS[$name]="exit $rc after $((SECONDS - t0))s"
}

run_one conformance_cuda "$LIMIT_CUDA"
[[ $NO_SIM == 1 ]] || run_one conformance_sim "$LIMIT_SIM"

# Printed only: a driver without host cuMemCreate makes it stop with a message, not fail the run.
BENCH_STATUS="not run (no $BIN/vgpu-bench)"
if [[ -x "$BIN/vgpu-bench" ]]; then
    echo "== vgpu-bench ${BENCH_ARGS[*]} (limit ${LIMIT_BENCH}s)"
    timeout "$LIMIT_BENCH" "$BIN/vgpu-bench" "${BENCH_ARGS[@]}" 2>&1 | tee "$OUTDIR/overflow_bench.log"
    BENCH_STATUS="exit ${PIPESTATUS[0]}"
fi

SHIM_STATUS="not run (no $BIN/shim)"
if [[ -x "$BIN/shim/vgpud" ]]; then
    echo "== vgpud on the GPU, programs on the shim (limit ${LIMIT_SHIM}s)"
    timeout "$LIMIT_SHIM" "$ROOT/tests/gpu/shim.sh" "$BIN/shim" 2>&1 | tee "$OUTDIR/shim.log"
    SHIM_STATUS="exit ${PIPESTATUS[0]}"
fi

echo
echo "================ summary ================"
for t in "${TESTS[@]}"; do
    echo "$t: ${STATUS[$t]:-not run}"
    grep -E '^(SKIPPED|conformance on|  [a-z_]+ +(ok|FAIL) |FAIL |corpus: |copy bandwidth|kernel time|compute shares|CUDA driver|VMM isolation probe|test result)' \
        "$OUTDIR/$t.log" 2>/dev/null | awk '!seen[$0]++' | sed 's/^/  /'
done
echo "overflow benchmark (PCIe-resident vs device-resident): $BENCH_STATUS"
grep -E '^(host overflow|kernel over|[0-9]+ MiB:|error)' "$OUTDIR/overflow_bench.log" 2>/dev/null | sed 's/^/  /'
echo "programs on the shim: $SHIM_STATUS"
grep -E '^(shim: |    latency)' "$OUTDIR/shim.log" 2>/dev/null | sed 's/^/  /'
fail=0
for t in "${TESTS[@]}"; do
    [[ "${STATUS[$t]:-}" == "exit 0 after"* ]] || fail=1
done
if grep -q '^SKIPPED' "$OUTDIR/conformance_cuda.log" 2>/dev/null; then
    echo "RESULT: the GPU suite was SKIPPED (no usable NVIDIA driver or GPU)"
    exit 3
fi
if [[ $fail -eq 0 ]]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
exit $fail
