#!/usr/bin/env bash
# Runs vgpu's libFuzzer targets (fuzz/, the functions of tests/fuzz) from the
# seed corpora, each for a while, with the cost oracle as libFuzzer limits:
# an input that crashes, allocates more than 256 MiB or runs longer than 1 s
# is a finding (kept in fuzz/artifacts/<target>/).
#
#   scripts/fuzz.sh [--seconds N] [TARGET...]     (default: 10 s, every target)
#
# cargo-fuzz runs on the stable toolchain here with RUSTC_BOOTSTRAP=1 and no
# sanitizer (-s none): coverage instrumentation is stable; the builds go to
# $VGPU_FUZZ_TARGET (default ~/.cache/vgpu/fuzz-target) so that repeated runs
# only rebuild what changed. Exits 0 with a message when cargo-fuzz is
# missing (scripts/prereqs.sh installs it), 1 on a finding.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET=10
TARGETS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) SECONDS_PER_TARGET="$2"; shift 2 ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) TARGETS+=("$1"); shift ;;
    esac
done
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "scripts/fuzz.sh: cargo-fuzz is not installed (scripts/prereqs.sh installs it); skipping the fuzz run"
    exit 0
fi
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(frame ptx fatbin config vsock_chain vgpu_chain session session_ring)

export RUSTC_BOOTSTRAP=1
FUZZ_TARGET_DIR="${VGPU_FUZZ_TARGET:-$HOME/.cache/vgpu/fuzz-target}"
fuzz() { (cd fuzz && CARGO_TARGET_DIR="$FUZZ_TARGET_DIR" cargo fuzz "$@"); }
cargo run -q -p vgpu-fuzz --bin vgpu-fuzz-seeds -- fuzz/corpus >/dev/null
fuzz build -s none

found=0
printf '%-12s %12s %10s %s\n' target executions exec/s result
for t in "${TARGETS[@]}"; do
    mkdir -p "fuzz/artifacts/$t"
    log="$(mktemp)"
    set +e
    fuzz run -s none "$t" "corpus/$t" -- \
        -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=512 -malloc_limit_mb=256 \
        -timeout=1 -artifact_prefix="artifacts/$t/" -print_final_stats=1 >"$log" 2>&1
    rc=$?
    set -e
    # A timeout is a finding only if it reproduces: on a loaded machine a
    # fast input can stall past 1 s of wall-clock time. Replay it up to three
    # times on its own.
    if [ $rc -ne 0 ] && grep -q 'libFuzzer: timeout' "$log"; then
        for artifact in fuzz/artifacts/"$t"/timeout-*; do
            [ -f "$artifact" ] || continue
            for _ in 1 2 3; do
                if fuzz run -s none "$t" "${artifact#fuzz/}" -- -timeout=1 -runs=1 >/dev/null 2>&1; then
                    echo "$t: timeout of $(basename "$artifact") did not reproduce (a stall of a loaded machine)"
                    rm -f "$artifact"
                    rc=0
                    break
                fi
            done
        done
    fi
    runs=$(grep -o 'Done [0-9]* runs' "$log" | grep -o '[0-9]*' || echo 0)
    rate=$(grep -o 'exec/s: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo 0)
    if [ $rc -ne 0 ]; then
        found=1
        printf '%-12s %12s %10s %s\n' "$t" "$runs" "$rate" "FINDING (see fuzz/artifacts/$t/)"
        grep -E 'ERROR|panicked|SUMMARY' "$log" | head -5
    else
        printf '%-12s %12s %10s %s\n' "$t" "$runs" "$rate" "ok"
    fi
    rm -f "$log"
done
exit $found
