#!/usr/bin/env bash
# vgpu demo: vgpud on the simulated GPU serving two tenants with different
# memory slices; an ordinary CUDA program (examples/workload.c, linked against
# vgpu's libcuda.so.1) runs in each and shows what it got.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

step() { printf '\n\033[1;36m==> %s\033[0m\n' "$*"; }

step "Installing prerequisites (C compiler, QEMU, image tools) if missing"
scripts/prereqs.sh

step "Building vgpud, the guest shim (libcuda.so.1), vgpu-smi and vgpuctl (release)"
cargo build --release --locked -p vgpu-vmm -p vgpu-shim -p vgpu-host-tools
REL="${CARGO_TARGET_DIR:-$ROOT/target}/release"
LIB="$REL/vgpu-lib"
mkdir -p "$LIB"
ln -sf ../libcuda.so "$LIB/libcuda.so.1"
ln -sf ../libcuda.so "$LIB/libcuda.so"

WORK="$(mktemp -d /tmp/vgpu-demo.XXXXXX)"
VGPUD_PID=""
cleanup() {
    [ -n "$VGPUD_PID" ] && kill "$VGPUD_PID" 2>/dev/null && wait "$VGPUD_PID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

step "Building the demo workload against vgpu's libcuda.so.1"
cc -O2 -o "$WORK/workload" examples/workload.c -L"$LIB" -lcuda -Wl,-rpath,"$LIB" -lm
PTX="$ROOT/tests/kernels/ptx/matmul.sm_80.ptx"

cat > "$WORK/vgpud.toml" <<TOML
[admin]
socket = "$WORK/admin.sock"

[[device]]
name = "gpu0"
kind = "sim"          # the built-in simulated GPU: runs real PTX, no GPU needed
memory = "4GiB"

[[vm]]
name = "inference"
device = "gpu0"
memory = "256MiB"     # hard memory slice
weight = 3
unix_socket = "$WORK/inference.sock"

[[vm]]
name = "training"
device = "gpu0"
memory = "1GiB"
weight = 1
unix_socket = "$WORK/training.sock"
TOML
step "Starting vgpud with two tenants (config: $WORK/vgpud.toml)"
sed 's/^/    /' "$WORK/vgpud.toml"
"$REL/vgpud" --config "$WORK/vgpud.toml" --log warn 2>"$WORK/vgpud.log" &
VGPUD_PID=$!
for _ in $(seq 100); do
    [ -S "$WORK/training.sock" ] && [ -S "$WORK/admin.sock" ] && break
    sleep 0.05
done

step "Running the CUDA workload in both tenants at once"
VGPU_TRANSPORT="unix:$WORK/inference.sock" "$WORK/workload" "$PTX" 96 4 > "$WORK/inference.out" 2>&1 &
P1=$!
VGPU_TRANSPORT="unix:$WORK/training.sock" "$WORK/workload" "$PTX" 128 4 > "$WORK/training.out" 2>&1 &
P2=$!
sleep 0.3
"$REL/vgpuctl" --socket "$WORK/admin.sock" vm list || true
rc=0
wait "$P1" || rc=1
wait "$P2" || rc=1
for vm in inference training; do
    printf '\n\033[1m[%s]\033[0m\n' "$vm"
    sed 's/^/    /' "$WORK/$vm.out"
done

step "What vgpu-smi shows inside a tenant"
VGPU_TRANSPORT="unix:$WORK/training.sock" "$REL/vgpu-smi" || true

step "Tenants after the workloads ended (everything was released)"
"$REL/vgpuctl" --socket "$WORK/admin.sock" vm list
if [ "$rc" -ne 0 ]; then
    echo "demo: a workload failed; vgpud log:" >&2
    cat "$WORK/vgpud.log" >&2
    exit 1
fi
printf '\n\033[1;32mdemo finished: each tenant ran real PTX on the simulated GPU within its own memory slice.\033[0m\n'
