#!/usr/bin/env bash
# vgpu demo: two real Linux VMs share one (simulated) GPU.
#
# vgpud runs on the built-in simulated GPU with two VMs of different memory
# slices and compute weights, each served through a vhost-user virtio-vsock
# device. Both guests boot in QEMU at once, install vgpu's guest shim
# (libcuda.so.1) with guest-shim/install.sh, and run an ordinary CUDA
# program (examples/workload.c: an NVRTC-compiled matmul PTX kernel checked
# against the CPU, then allocations until the slice refuses). The demo prints
# what each VM got, `vgpuctl vm list` while they run and `vgpu-smi` from
# inside a guest.
#
# Works on a fresh Debian 12 machine without a GPU (root or sudo): it installs
# QEMU and the other prerequisites and downloads the guest kernel and busybox
# packages. Environment: VGPU_QEMU_ACCEL=tcg|kvm|auto (default auto: KVM when
# a probe guest boots with it), VGPU_DEMO_KEEP=1 keeps the work directory.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

# --- what the demo runs -------------------------------------------------------
PTX="$ROOT/tests/kernels/ptx/matmul.sm_80.ptx"
MATMUL_SIZE=128
MATMUL_ROUNDS=6
GUEST_MEM_MIB=512
GUEST_TIMEOUT_S=300
KVM_PROBE_TIMEOUT_S=15
POLL_S=0.2
# name, slice, weight, guest CID
VMS=("inference 256MiB 3 3" "training 1GiB 1 4")

BOLD=$'\033[1m' CYAN=$'\033[1;36m' GREEN=$'\033[1;32m' RED=$'\033[1;31m' DIM=$'\033[2m' RESET=$'\033[0m'
if [ ! -t 1 ]; then BOLD="" CYAN="" GREEN="" RED="" DIM="" RESET=""; fi
step() { printf '\n%s==> %s%s\n' "$CYAN" "$*" "$RESET"; }
note() { printf '    %s\n' "$*"; }
fail() { printf '\n%sdemo failed: %s%s\n' "$RED" "$*" "$RESET" >&2; exit 1; }
T0=$SECONDS

WORK="$(mktemp -d /tmp/vgpu-demo.XXXXXX)"
VGPUD_PID=""
declare -A QEMU_PID=()
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    for vm in "${!QEMU_PID[@]}"; do
        kill "${QEMU_PID[$vm]}" 2>/dev/null || true
    done
    for vm in "${!QEMU_PID[@]}"; do
        wait "${QEMU_PID[$vm]}" 2>/dev/null || true
    done
    if [ -n "$VGPUD_PID" ]; then
        kill "$VGPUD_PID" 2>/dev/null || true
        wait "$VGPUD_PID" 2>/dev/null || true
    fi
    if [ "${VGPU_DEMO_KEEP:-0}" = 1 ]; then
        printf 'demo: kept %s (consoles, vgpud.log, config)\n' "$WORK" >&2
    else
        rm -rf "$WORK"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'printf "\ndemo: interrupted; cleaning up\n" >&2; exit 130' INT TERM

# --- 1. prerequisites and build ---------------------------------------------------
step "Installing prerequisites (C compiler, QEMU, image tools) if missing"
scripts/prereqs.sh

step "Building vgpud, the guest shim (libcuda.so.1, libnvidia-ml.so.1), vgpu-smi and vgpuctl (release)"
cargo build --release --locked -p vgpud -p vgpu-shim -p vgpu-nvml -p vgpu-host-tools
REL="${CARGO_TARGET_DIR:-$ROOT/target}/release"
QEMU="$(command -v qemu-system-x86_64)" || fail "QEMU is not installed (images/install-qemu.sh)"

step "Building the CUDA workload for the guests (examples/workload.c, linked with -lcuda)"
mkdir -p "$WORK/lib" "$WORK/bundle"
ln -s "$REL/libcuda.so" "$WORK/lib/libcuda.so"
# No rpath: inside the guest the loader finds the libcuda.so.1 that
# install.sh puts in place, as for any CUDA program.
cc -O2 -Wall -o "$WORK/workload" examples/workload.c -L"$WORK/lib" -lcuda -lm
# A tiny AF_VSOCK listener: each guest waits on it until both VMs are up.
cc -O2 -Wall -o "$WORK/vsock-echo" tests/guest/vsock-echo.c
cp "$REL/libcuda.so" "$WORK/bundle/libcuda.so.1"
cp "$REL/libnvidia_ml.so" "$WORK/bundle/libnvidia-ml.so.1"
cp "$REL/vgpu-smi" guest-shim/install.sh "$WORK/bundle/"
note "workload, vsock-echo, libcuda.so.1 ($(( $(stat -c %s "$REL/libcuda.so") / 1024 )) KiB), libnvidia-ml.so.1, vgpu-smi, install.sh"

# --- 2. the guest image -------------------------------------------------------------
step "Building the guest image (Debian cloud kernel + busybox; downloaded once, then cached)"
images/build.sh
cat >"$WORK/run.sh" <<'GUEST'
# Runs in each guest (busybox sh) as /payload/run.sh.
arg() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" /proc/cmdline; }
echo "DEMO-STEP installing the vgpu guest shim with install.sh"
sh /opt/vgpu/install.sh --from /opt/vgpu --quiet || exit 10
unset LD_LIBRARY_PATH   # found through the loader cache, like any CUDA library
echo "DEMO-STEP ready; waiting for the other VM"
# The host connects to this port (vsock CONNECT through vgpud) once both are ready.
VSOCK_ECHO_TIMEOUT=240 vsock-echo listen 7000 1 >/dev/null || exit 11
echo "DEMO-STEP running the CUDA workload"
workload /payload/matmul.ptx "$(arg demo.size)" "$(arg demo.rounds)" >/tmp/workload.out 2>&1 &
W=$!
# vgpu-smi as soon as the workload's CUDA session is open.
while kill -0 $W 2>/dev/null; do
    vgpu-smi --json 2>/dev/null | grep -q '"process"' && break
    usleep 50000
done
echo "DEMO-SMI-BEGIN"
vgpu-smi
# Scripts that ask nvidia-smi get the same from vgpu-smi (install.sh links it as nvidia-smi).
nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv
echo "DEMO-SMI-END"
wait $W
status=$?
echo "DEMO-WORKLOAD-BEGIN"
cat /tmp/workload.out
echo "DEMO-WORKLOAD-END status=$status"
exit $status
GUEST
images/payload-initrd.sh --out "$WORK/initrd.img" --script "$WORK/run.sh" \
    --add "$WORK/bundle/libcuda.so.1:/opt/vgpu/libcuda.so.1" \
    --add "$WORK/bundle/libnvidia-ml.so.1:/opt/vgpu/libnvidia-ml.so.1" \
    --add "$WORK/bundle/vgpu-smi:/opt/vgpu/vgpu-smi" \
    --add "$WORK/bundle/install.sh:/opt/vgpu/install.sh" \
    --add "$WORK/workload:/payload/bin/workload" \
    --add "$WORK/vsock-echo:/payload/bin/vsock-echo" \
    --add "$PTX:/payload/matmul.ptx"
note "guest initrd with the demo payload: $(( $(stat -c %s "$WORK/initrd.img") / 1024 )) KiB"

# KVM only where it really runs ordinary guests (some hosts' /dev/kvm runs only
# PVM guests); the verdict is cached like the test harness does.
choose_accel() {
    local want="${VGPU_QEMU_ACCEL:-auto}" key cache cached probe
    case "$want" in tcg|kvm) echo "$want"; return ;; auto|"") ;; *) fail "VGPU_QEMU_ACCEL must be tcg, kvm or auto" ;; esac
    if [ ! -r /dev/kvm ] || [ ! -w /dev/kvm ]; then echo tcg; return; fi
    key="$(cat /proc/sys/kernel/osrelease)|$("$QEMU" --version | head -n1)"
    cache="$ROOT/images/out/kvm-probe.txt"
    cached="$(cat "$cache" 2>/dev/null || true)"
    if [ "${cached%|*}" = "$key" ]; then echo "${cached##*|}"; return; fi
    probe="$WORK/kvm-probe.log"
    timeout "$KVM_PROBE_TIMEOUT_S" "$QEMU" -machine q35 -accel kvm -cpu max -m 256M \
        -nodefaults -no-user-config -display none -no-reboot \
        -chardev "file,id=console,path=$probe" -serial chardev:console \
        -kernel images/out/vmlinuz -initrd images/out/initrd.cpio.gz \
        -append "console=ttyS0 quiet panic=-1 vgpu.probe" >/dev/null 2>&1 || true
    if grep -q VGPU-GUEST-READY "$probe" 2>/dev/null; then want=kvm; else want=tcg; fi
    printf '%s|%s\n' "$key" "$want" >"$cache" 2>/dev/null || true
    echo "$want"
}
ACCEL="$(choose_accel)"
note "QEMU accelerator: $ACCEL$([ "$ACCEL" = tcg ] && echo ' (binary translation: no usable KVM here; slower, same result)')"

# --- 3. vgpud -----------------------------------------------------------------------
{
    printf '[admin]\nsocket = "%s/admin.sock"\n\n' "$WORK"
    printf '[[device]]\nname = "gpu0"\nkind = "sim"          # the built-in simulated GPU: runs real PTX, no GPU needed\nmemory = "4GiB"\n'
    for spec in "${VMS[@]}"; do
        read -r vm slice weight cid <<<"$spec"
        printf '\n[[vm]]\nname = "%s"\ndevice = "gpu0"\nmemory = "%s"         # hard memory slice\nweight = %s           # compute share\n' \
            "$vm" "$slice" "$weight"
        printf 'vhost_user_socket = "%s/%s.vhost.sock"   # QEMU connects here\nguest_cid = %s\n' "$WORK" "$vm" "$cid"
    done
} >"$WORK/vgpud.toml"
step "Starting vgpud on the simulated GPU with two VMs (config: $WORK/vgpud.toml)"
sed 's/^/    /' "$WORK/vgpud.toml"
# setsid: Ctrl-C reaches only this script, whose trap stops QEMU, then vgpud.
setsid "$REL/vgpud" --config "$WORK/vgpud.toml" --log info 2>"$WORK/vgpud.log" &
VGPUD_PID=$!
for _ in $(seq 200); do
    ready=1
    [ -S "$WORK/admin.sock" ] || ready=0
    for spec in "${VMS[@]}"; do
        read -r vm _ <<<"$spec"
        [ -S "$WORK/$vm.vhost.sock" ] || ready=0
    done
    [ "$ready" = 1 ] && break
    kill -0 "$VGPUD_PID" 2>/dev/null || { cat "$WORK/vgpud.log" >&2; fail "vgpud exited at start"; }
    sleep 0.05
done
[ "$ready" = 1 ] || { cat "$WORK/vgpud.log" >&2; fail "vgpud did not open its sockets"; }
VGPUCTL=("$REL/vgpuctl" --socket "$WORK/admin.sock")

# --- 4. boot both guests ---------------------------------------------------------------
step "Booting both VMs in QEMU ($ACCEL), each with a vhost-user-vsock-pci device served by vgpud"
for spec in "${VMS[@]}"; do
    read -r vm _ _ _ <<<"$spec"
    note "$vm: $QEMU … -object memory-backend-memfd,id=mem,size=${GUEST_MEM_MIB}M,share=on -numa node,memdev=mem -chardev socket,id=vgpu0,path=$WORK/$vm.vhost.sock -device vhost-user-vsock-pci,chardev=vgpu0"
    setsid "$QEMU" -name "vgpu-demo-$vm" -machine q35 -accel "$ACCEL" -cpu max -m "${GUEST_MEM_MIB}M" \
        -object "memory-backend-memfd,id=mem,size=${GUEST_MEM_MIB}M,share=on" -numa node,memdev=mem \
        -nodefaults -no-user-config -display none -no-reboot \
        -chardev "file,id=console,path=$WORK/$vm.console" -serial chardev:console \
        -kernel images/out/vmlinuz -initrd "$WORK/initrd.img" \
        -append "console=ttyS0 quiet panic=-1 demo.size=$MATMUL_SIZE demo.rounds=$MATMUL_ROUNDS" \
        -chardev "socket,id=vgpu0,path=$WORK/$vm.vhost.sock" -device vhost-user-vsock-pci,chardev=vgpu0 \
        </dev/null >"$WORK/$vm.qemu.log" 2>&1 &
    QEMU_PID[$vm]=$!
done

# Progress: follow both consoles until both guests powered off.
declare -A SEEN=() FINISHED=() STATUS=()
now_ms() { local us="${EPOCHREALTIME/./}"; echo $(( us / 1000 )); }
progress() { printf '    %s[%3d.%ds]%s %-9s %s\n' "$DIM" $(( $1 / 1000 )) $(( $1 % 1000 / 100 )) "$RESET" "$2" "$3"; }
# Starts the workloads: connects to guest port 7000 through the VM's vsock
# socket (vgpud's vsock_uds_path) the hybrid-vsock way, CONNECT <port>.
release() {
    python3 - "$WORK/$1.vsock" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(30)
s.connect(sys.argv[1])
s.sendall(b"CONNECT 7000\n")
reply = s.makefile("rb").readline()
if not reply.startswith(b"OK "):
    sys.exit("CONNECT answered %r" % reply)
s.sendall(b"go")
s.recv(2)
PY
}
BOOTED_AT=$(now_ms)
RELEASED=0
LISTED=0
while :; do
    all_done=1
    for spec in "${VMS[@]}"; do
        read -r vm _ <<<"$spec"
        [ -n "${FINISHED[$vm]:-}" ] && continue
        all_done=0
        console="$WORK/$vm.console"
        t=$(( $(now_ms) - BOOTED_AT ))
        report() { # key, message: print once
            if [ -z "${SEEN[$vm.$1]:-}" ]; then SEEN[$vm.$1]=1; progress "$t" "$vm" "$2"; fi
        }
        if [ -f "$console" ]; then
            grep -q VGPU-GUEST-BOOT "$console" && report boot "Linux $(sed -n 's/.*VGPU-GUEST-BOOT kernel=\([^ ]*\).*/\1/p' "$console" | head -n1) started"
            grep -q 'VGPU-GUEST-READY.*vsock=yes' "$console" && report vsock "virtio-vsock device bound (vmw_vsock_virtio_transport)"
            grep -q 'VGPU-GUEST-READY.*vsock=no' "$console" && report novsock "${RED}no virtio-vsock device${RESET}"
            while IFS= read -r line; do
                report "step:$line" "${line#*DEMO-STEP }"
            done < <(grep -a 'DEMO-STEP' "$console" | tr -d '\r')
            grep -q 'DEMO-WORKLOAD-END' "$console" && report workload "workload finished"
            if grep -q 'VGPU-GUEST-EXIT' "$console"; then
                STATUS[$vm]="$(sed -n 's/.*VGPU-GUEST-EXIT \([0-9]*\).*/\1/p' "$console" | tail -n1)"
            fi
        fi
        if ! kill -0 "${QEMU_PID[$vm]}" 2>/dev/null; then
            wait "${QEMU_PID[$vm]}" 2>/dev/null || true
            unset "QEMU_PID[$vm]"
            FINISHED[$vm]=1
            report exit "powered off (payload status ${STATUS[$vm]:-none})"
        elif (( t > GUEST_TIMEOUT_S * 1000 )); then
            kill "${QEMU_PID[$vm]}" 2>/dev/null || true
            STATUS[$vm]=timeout
        fi
    done
    # Both waiting: start their workloads at the same moment.
    if [ "$RELEASED" = 0 ] && [ -n "${SEEN[inference.step:DEMO-STEP ready; waiting for the other VM]:-}" ] \
        && [ -n "${SEEN[training.step:DEMO-STEP ready; waiting for the other VM]:-}" ]; then
        RELEASED=1
        for spec in "${VMS[@]}"; do
            read -r vm _ <<<"$spec"
            release "$vm" || fail "cannot reach $vm's guest through $WORK/$vm.vsock"
        done
    fi
    # vgpuctl while both run the workload (their CUDA sessions are open).
    if [ "$LISTED" = 0 ] && [ -n "${SEEN[inference.step:DEMO-STEP running the CUDA workload]:-}" ] \
        && [ -n "${SEEN[training.step:DEMO-STEP running the CUDA workload]:-}" ]; then
        sessions="$("${VGPUCTL[@]}" vm list | awk 'NR > 1 && $NF > 0' | wc -l)"
        if [ "$sessions" -ge 2 ] || [ -n "${FINISHED[inference]:-}${FINISHED[training]:-}" ] \
            || grep -q DEMO-WORKLOAD-END "$WORK"/*.console; then
            LISTED=1
            printf '\n    %svgpuctl vm list%s (host, while both workloads run)\n' "$BOLD" "$RESET"
            "${VGPUCTL[@]}" vm list | sed 's/^/      /'
            echo
        fi
    fi
    [ "$all_done" = 1 ] && break
    kill -0 "$VGPUD_PID" 2>/dev/null || { cat "$WORK/vgpud.log" >&2; fail "vgpud died"; }
    sleep "$POLL_S"
done

# --- 5. what each VM got ---------------------------------------------------------------
section() { # console, begin marker, end marker
    awk -v b="$2" -v e="$3" 'index($0, e) { on = 0 } on { print } index($0, b) { on = 1 }' "$1" | tr -d '\r'
}
step "What each VM got"
rc=0
for spec in "${VMS[@]}"; do
    read -r vm slice weight cid <<<"$spec"
    console="$WORK/$vm.console"
    printf '\n  %s[%s]%s slice %s, weight %s, guest CID %s\n' "$BOLD" "$vm" "$RESET" "$slice" "$weight" "$cid"
    out="$(section "$console" DEMO-WORKLOAD-BEGIN DEMO-WORKLOAD-END)"
    if [ -n "$out" ]; then printf '%s\n' "$out" | sed 's/^/    /'; fi
    stats="$("${VGPUCTL[@]}" --json vm show "$vm" | python3 -c '
import json, sys
v = json.load(sys.stdin)
s, x = v["stats"], (v.get("vsock") or {}).get("stats", {})
print("vgpud counted: %d kernels, %d KiB host->device, %d KiB device->host, %d session(s); "
      "vsock: %d KiB in, %d KiB out; memory in use now: %d MiB"
      % (s["kernels"], s["bytes_htod"] // 1024, s["bytes_dtoh"] // 1024, s["sessions_total"],
         x.get("bytes_guest_to_host", 0) // 1024, x.get("bytes_host_to_guest", 0) // 1024,
         v["memory_used"] >> 20))' 2>/dev/null || echo "vgpud: no statistics")"
    note "$stats"
    ok=1
    [ "${STATUS[$vm]:-none}" = 0 ] || { ok=0; note "${RED}the guest's script exited with status ${STATUS[$vm]:-none}${RESET}"; }
    grep -q 'result OK' <<<"$out" || { ok=0; note "${RED}no correct matmul result${RESET}"; }
    grep -q 'before CUDA_ERROR_OUT_OF_MEMORY' <<<"$out" || { ok=0; note "${RED}no out-of-memory at the slice limit${RESET}"; }
    if [ "$ok" = 0 ]; then
        rc=1
        note "console of $vm (last lines):"
        tail -n 30 "$console" 2>/dev/null | sed 's/^/      | /'
        sed 's/^/      [qemu] /' "$WORK/$vm.qemu.log" 2>/dev/null || true
    fi
done

step "vgpu-smi and nvidia-smi inside the inference VM (while its workload ran)"
smi="$(section "$WORK/inference.console" DEMO-SMI-BEGIN DEMO-SMI-END)"
if [ -n "$smi" ]; then printf '%s\n' "$smi" | sed 's/^/    /'; else note "(no output)"; rc=1; fi

step "VMs after the workloads ended (everything was released)"
"${VGPUCTL[@]}" vm list | sed 's/^/    /'

if [ "$rc" -ne 0 ]; then
    printf '\nvgpud log (last lines):\n' >&2
    tail -n 40 "$WORK/vgpud.log" >&2
    fail "a VM did not get what it should (see above)"
fi
printf '\n%sdemo finished in %d s: two VMs ran real PTX on one simulated GPU, each within its own memory slice.%s\n' \
    "$GREEN" $(( SECONDS - T0 )) "$RESET"
