#!/usr/bin/env bash
# Installs QEMU (qemu-system-x86_64, with vhost-user-vsock-pci) from Debian
# bookworm-backports. Idempotent: does nothing when a new-enough QEMU is present.
#
# Usage: images/install-qemu.sh            (needs root: it edits apt sources)
#        VGPU_QEMU_MIN_MAJOR=9 images/install-qemu.sh
set -euo pipefail

log() { printf 'install-qemu: %s\n' "$*" >&2; }

# bookworm's own QEMU (7.2) has vhost-user-vsock-pci too, but the backports
# build (10.x) is what the project is tested with.
MIN_MAJOR="${VGPU_QEMU_MIN_MAJOR:-8}"
BACKPORTS_LIST=/etc/apt/sources.list.d/bookworm-backports.list
BACKPORTS_LINE='deb http://deb.debian.org/debian bookworm-backports main'

qemu_major() {
    local v
    v="$(qemu-system-x86_64 --version 2>/dev/null | sed -n 's/^QEMU emulator version \([0-9]*\)\..*/\1/p')"
    printf '%s' "${v:-0}"
}

if command -v qemu-system-x86_64 >/dev/null 2>&1 && [ "$(qemu_major)" -ge "$MIN_MAJOR" ]; then
    log "already installed: $(qemu-system-x86_64 --version | head -n1)"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    log "error: must run as root to install QEMU (try: sudo $0)"
    exit 1
fi

# shellcheck source=/dev/null
. /etc/os-release
if [ "${VERSION_CODENAME:-}" != "bookworm" ]; then
    log "warning: this host is '${VERSION_CODENAME:-unknown}', not Debian bookworm; trying the distribution's qemu-system-x86"
    log "running: apt-get update && apt-get install -y qemu-system-x86"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-system-x86 >&2
    exit 0
fi

if ! grep -rqs '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    log "adding bookworm-backports to apt sources: $BACKPORTS_LIST"
    printf '%s\n' "$BACKPORTS_LINE" >"$BACKPORTS_LIST"
fi

log "running: apt-get update"
apt-get update -qq >&2
log "running: apt-get -t bookworm-backports install -y qemu-system-x86"
DEBIAN_FRONTEND=noninteractive apt-get -t bookworm-backports install -y -qq --no-install-recommends \
    qemu-system-x86 >&2
log "installed: $(qemu-system-x86_64 --version | head -n1)"
