#!/usr/bin/env bash
# Runs every vgpu test: unit tests, the shim against a real vgpud, the kernel
# corpus through the full path, and real QEMU guests. Installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/prereqs.sh
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
cargo test --workspace --locked "$@"
