#!/usr/bin/env bash
# Boots the vgpu test guest with its serial console on this terminal: a busybox
# shell as root. Exit the shell (or press Ctrl-A X) to stop the guest.
#
# usage: images/run-guest.sh [--vsock SOCKET] [--mem MIB] [--accel tcg|kvm]
#                            [--add HOST:GUEST]... [--append ARGS] [-- QEMU ARGS...]
#
#   --vsock SOCKET   add a vhost-user-vsock-pci device served at SOCKET (vgpud's
#                    vhost_user_socket); the guest then reaches the host at CID 2
#   --mem MIB        guest memory (default 512)
#   --accel NAME     tcg (default, works everywhere) or kvm (only where /dev/kvm
#                    runs ordinary guests)
#   --add HOST:GUEST put a host file into the guest (builds a separate image in
#                    images/out/run-guest; ELF files bring their libraries)
#   --append ARGS    extra kernel command line arguments
#
# docs/guest-image.md explains the image and the /init protocol.
set -euo pipefail

IMAGES_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MEM=512
ACCEL="${VGPU_QEMU_ACCEL:-tcg}"
[ "$ACCEL" != auto ] || ACCEL=tcg
SOCKET=""
APPEND=""
ADDS=()
QEMU_EXTRA=()

while [ $# -gt 0 ]; do
    case "$1" in
        --vsock) SOCKET="${2:?--vsock needs a socket path}"; shift 2 ;;
        --mem) MEM="${2:?--mem needs MiB}"; shift 2 ;;
        --accel) ACCEL="${2:?--accel needs tcg or kvm}"; shift 2 ;;
        --add) ADDS+=(--add "${2:?--add needs HOST:GUEST}"); shift 2 ;;
        --append) APPEND="${2:?--append needs arguments}"; shift 2 ;;
        --) shift; QEMU_EXTRA=("$@"); break ;;
        -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "run-guest.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

case "$ACCEL" in tcg|kvm) ;; *) echo "run-guest.sh: --accel must be tcg or kvm" >&2; exit 2 ;; esac
[[ "$MEM" =~ ^[0-9]+$ ]] || { echo "run-guest.sh: --mem must be a number of MiB" >&2; exit 2; }

if ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
    echo "run-guest.sh: QEMU is missing; install it with: sudo $IMAGES_DIR/install-qemu.sh" >&2
    exit 1
fi

OUT="$IMAGES_DIR/out"
if [ ${#ADDS[@]} -gt 0 ]; then
    OUT="$IMAGES_DIR/out/run-guest"
fi
"$IMAGES_DIR/build.sh" --out "$OUT" "${ADDS[@]+"${ADDS[@]}"}"

# shellcheck disable=SC2054  # commas belong to QEMU option values
ARGS=(
    -machine q35 -accel "$ACCEL" -cpu max -m "${MEM}M"
    -object "memory-backend-memfd,id=mem,size=${MEM}M,share=on" -numa node,memdev=mem
    -nodefaults -no-user-config -display none -no-reboot
    -chardev stdio,id=console,mux=on,signal=off -serial chardev:console -mon chardev=console
    -kernel "$OUT/vmlinuz" -initrd "$OUT/initrd.cpio.gz"
    -append "console=ttyS0 quiet panic=-1 $APPEND"
)
if [ -n "$SOCKET" ]; then
    [ -S "$SOCKET" ] || { echo "run-guest.sh: $SOCKET is not a socket; start vgpud first" >&2; exit 1; }
    # shellcheck disable=SC2054
    ARGS+=(-chardev "socket,id=vsock0,path=${SOCKET//,/,,}" -device vhost-user-vsock-pci,chardev=vsock0)
fi
echo "[run-guest] booting ($ACCEL); exit the shell or press Ctrl-A X to stop" >&2
exec qemu-system-x86_64 "${ARGS[@]}" "${QEMU_EXTRA[@]+"${QEMU_EXTRA[@]}"}"
