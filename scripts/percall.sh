#!/usr/bin/env bash
# The broker's instructions per direct call, counted by callgrind: a figure that does not move
# with the machine's load (docs/performance.md, "The broker's posted call").
#
#   scripts/percall.sh [ITERS]     # default 20000 calls per measurement
#
# It runs `vgpu-bench remoting --runs 1` twice under callgrind, once counting only
# `Direct::posted_memsets` (posted 64-byte `Memset`s on a direct broker session, closed by one
# `CtxSynchronize`) and once only `Direct::synchronize` (one `CtxSynchronize`), and divides by
# the calls the benchmark made (its warm-up of ITERS/10+1 and its run of ITERS).
set -euo pipefail
cd "$(dirname "$0")/.."

iters=${1:-20000}
if ! [[ $iters =~ ^[1-9][0-9]*$ ]]; then
    echo "percall.sh: ITERS must be a positive number of calls, not '$iters'" >&2
    exit 2
fi
if ! command -v valgrind >/dev/null; then
    echo "percall.sh: needs valgrind (apt-get install valgrind)" >&2
    exit 1
fi
cargo build --release -q -p vgpu-bench
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Instructions counted in FUNCTION over one callgrind run of the benchmark.
count() {
    valgrind --tool=callgrind --callgrind-out-file="$out/$1" \
        --toggle-collect="vgpu_bench::direct::Direct::$1" \
        target/release/vgpu-bench remoting --iters "$iters" --runs 1 >"$out/$1.log" 2>&1 ||
        { cat "$out/$1.log" >&2; exit 1; }
    awk '/^(summary|totals):/ { print $2; exit }' "$out/$1"
}

calls=$((iters / 10 + 1 + iters))
sync_ir=$(count synchronize)
memsets_ir=$(count posted_memsets)
# posted_memsets ran twice (warm-up and run), each closed by one CtxSynchronize.
awk -v s="$sync_ir" -v m="$memsets_ir" -v n="$calls" 'BEGIN {
    sync = s / n
    printf "CtxSynchronize, direct:        %8.0f instructions per call (%d calls)\n", sync, n
    printf "posted Memset (64 B), direct:  %8.0f instructions per call (%d calls)\n", (m - 2 * sync) / n, n
}'
