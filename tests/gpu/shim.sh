#!/usr/bin/env bash
# Stage 3 of tests/gpu/run.sh: vgpud serving the real GPU (`kind = "cuda"`) to
# programs that load vgpu's libcuda.so.1, as a tenant's programs do in a VM
# (over a unix socket here: the transport is not what this stage checks).
#
#   tests/gpu/shim.sh DIR     # DIR: what `tests/gpu/run.sh build` put in tests/out/gpu/shim
#
# Runs, each under its own time limit and reported on its own line:
#   - the C programs of tests/c (built against the shim on the build machine);
#   - the nvcc 11.8 runtime programs of tests/cuda (static libcudart, compute_52 PTX the
#     driver compiles for the GPU), when the build machine had them;
#   - the GPU machine's own CuPy and PyTorch, if installed, on the shim (informational).
# vgpud starts with its seccomp filters on; if it dies under them the stage says so and goes on
# with `--seccomp=off`, so the programs' results are still seen.
# VGPU_SHIM_DEVICE=sim runs the same on the simulated GPU (to try the script without a GPU).
# Prints "shim: NAME exit N, K ok, M FAIL" per program and the FAIL lines; logs in $OUT.
set -uo pipefail

S="$(cd "${1:?usage: shim.sh DIR}" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUTDIR="${OUT:-$(mktemp -d)}"
mkdir -p "$OUTDIR"
WORK="$(mktemp -d /tmp/vgpu-gpu.XXXXXX)"
# Seconds one program may run.
LIMIT_PROGRAM=${LIMIT_PROGRAM:-40}
LIMIT_PYTHON=${LIMIT_PYTHON:-90}

if [[ "${VGPU_SHIM_DEVICE:-cuda}" == sim ]]; then
    DEVICE='kind = "sim"
memory = "16GiB"'
else
    DEVICE='kind = "cuda"
index = 0'
fi
cat >"$WORK/vgpud.toml" <<EOF
[admin]
socket = "$WORK/admin.sock"

[[device]]
name = "gpu0"
$DEVICE

[[vm]]
name = "vm1"
device = "gpu0"
memory = "8GiB"
unix_socket = "$WORK/vm1.sock"
EOF

VGPUD_PID=
start_vgpud() {
    # The daemon loads NVIDIA's libcuda.so.1: no shim directory on its library path.
    env -u LD_LIBRARY_PATH RUST_LOG=info "$S/vgpud" --config "$WORK/vgpud.toml" "$@" \
        >>"$OUTDIR/vgpud.log" 2>&1 &
    VGPUD_PID=$!
    for _ in $(seq 300); do
        [[ -S "$WORK/vm1.sock" ]] && return 0
        kill -0 "$VGPUD_PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "shim: vgpud did not start ($*); its log:"
    tail -n 30 "$OUTDIR/vgpud.log"
    return 1
}

echo "== vgpud on the GPU (seccomp on)"
SECCOMP=on
if ! start_vgpud; then
    SECCOMP=off
    rm -f "$WORK/vm1.sock"
    start_vgpud --seccomp=off || exit 1
fi

# Runs one guest program on the shim; NAME is what the report calls it.
run_prog() {
    local name="$1" limit="$2"
    shift 2
    local log="$OUTDIR/shim-$name.log"
    (cd "$WORK" && VGPU_TRANSPORT="unix:$WORK/vm1.sock" LD_LIBRARY_PATH="$S/lib" \
        timeout "$limit" "$@") >"$log" 2>&1
    local rc=$?
    local ok fail
    ok=$(grep -c '^ok ' "$log")
    fail=$(grep -c 'FAIL' "$log")
    echo "shim: $name exit $rc, $ok ok, $fail FAIL"
    grep -m 12 -E '^FAIL|FAIL |panicked|Traceback|^[A-Za-z_.]*(Error|Exception)' "$log" | sed 's/^/    /'
    if ! kill -0 "$VGPUD_PID" 2>/dev/null; then
        wait "$VGPUD_PID"
        echo "shim: vgpud DIED (exit $?, seccomp $SECCOMP) during $name; its log:"
        tail -n 30 "$OUTDIR/vgpud.log" | sed 's/^/    /'
        if [[ "$SECCOMP" == on ]]; then
            SECCOMP=off
            rm -f "$WORK/vm1.sock"
            start_vgpud --seccomp=off || exit 1
        else
            exit 1
        fi
    fi
}

P="$ROOT/tests/kernels/ptx"
run_prog driver_api "$LIMIT_PROGRAM" "$S/c-driver_api" basic
run_prog driver_api_latency "$LIMIT_PROGRAM" "$S/c-driver_api" latency 2000
grep '^latency' "$OUTDIR/shim-driver_api_latency.log" | sed 's/^/    /'
for p in driver_api_ext sync_threads ctx_events memcpy_batch3d stream_mem_ops; do
    run_prog "$p" "$LIMIT_PROGRAM" "$S/c-$p"
done
for m in capture fork branches errors update generic hostcopy userobjects; do
    run_prog "graphs_$m" "$LIMIT_PROGRAM" "$S/c-graphs" "$m" "$P/saxpy.sm_80.ptx"
done
"$S/vgpu-smi" --help >/dev/null 2>&1 &&
    run_prog vgpu_smi "$LIMIT_PROGRAM" "$S/vgpu-smi"
for p in "$S"/cuda/*.static; do
    [[ -x "$p" ]] && run_prog "cuda_$(basename "$p" .static)" "$LIMIT_PROGRAM" "$p"
done

PY="$(command -v python3 || true)"
if [[ -n "$PY" ]] && "$PY" -c 'import cupy' 2>/dev/null; then
    run_prog cupy "$LIMIT_PYTHON" env PYTHONUNBUFFERED=1 "$PY" "$ROOT/tests/python/cupy_basics.py"
fi
if [[ -n "$PY" ]] && "$PY" -c 'import torch' 2>/dev/null; then
    run_prog torch "$LIMIT_PYTHON" env PYTHONUNBUFFERED=1 "$PY" -c '
import torch
print("ok torch", torch.__version__, "sees", torch.cuda.device_count(), "device(s):", torch.cuda.get_device_name(0))
x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
s = (x * 2 + 1).sum().item()
want = float((1 << 20) * ((1 << 20) - 1) + (1 << 20))
print("ok elementwise and sum" if abs(s - want) / want < 1e-5 else f"FAIL elementwise and sum: {s} vs {want}")
a = torch.randn(256, 256, device="cuda")
b = (a @ a).cpu()
c = a.cpu() @ a.cpu()
print("ok matmul (cuBLAS)" if torch.allclose(b, c, atol=1e-2, rtol=1e-3) else "FAIL matmul (cuBLAS)")
free, total = torch.cuda.mem_get_info()
print(f"ok mem_get_info free {free} total {total}")
'
fi
# PyTorch's allocator (with and without expandable segments), IPC, NCCL, the profiler and
# cuBLAS against vm1's 8 GiB slice; on a GPU its kernels and the matrix product run.
if [[ -n "$PY" ]] && "$PY" -c 'import torch' 2>/dev/null; then
    for conf in "" "expandable_segments:True"; do
        run_prog "torch_basics${conf:+_expandable}" "$LIMIT_PYTHON" env PYTHONUNBUFFERED=1 \
            PYTORCH_CUDA_ALLOC_CONF="$conf" "$PY" "$ROOT/tests/python/torch_basics.py" $((8 << 30))
    done
fi

kill "$VGPUD_PID" 2>/dev/null
wait "$VGPUD_PID" 2>/dev/null
echo "shim: vgpud ran with seccomp $SECCOMP"
grep -i -m 20 'warn\|error' "$OUTDIR/vgpud.log" | sed 's/^/    vgpud: /'
rm -rf "$WORK"
exit 0
