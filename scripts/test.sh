#!/usr/bin/env bash
# Runs every vgpu check: formatting, clippy, unit tests, the shim against a
# real vgpud, the kernel corpus through the full path, real QEMU guests, and a
# short run of the fuzz targets. Installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/prereqs.sh
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked "$@"
# Every fuzz target under libFuzzer for a few seconds from its seeds (the
# replay of seeds and mutations under the cost oracle ran in cargo test).
scripts/fuzz.sh --seconds 5
