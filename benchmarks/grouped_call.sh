#!/usr/bin/env bash
# One call of the GPU machine for issue 39 (evtc.GroupedGemm): import the kernels built on the CPU
# machine (.carry/*.tar.xz, benchmarks/call_prelude.sh), build the rest on every core, run
# tests/gpu/test_grouped_gpu.py, then benchmarks/bench_moe.py; each part stops at its share of
# DEADLINE_S. Logs and JSON go to OUT.
#   bash benchmarks/grouped_call.sh [DEADLINE_S] [BENCH_TOKENS]
set -u
DEADLINE=${1:-540}
TOKENS=${2:-1,64,512,4096,16384}
. "$(dirname "$0")/call_prelude.sh"
( cd benchmarks && timeout "$(( $(left) - 200 ))" python3 prebuild.py grouped ) > "$OUT/build.log" 2>&1
echo "built rc $? at $((SECONDS - T0)) s" >> "$S"
timeout -s INT "$(( $(left) - 150 ))" python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_grouped_gpu.py \
  > "$OUT/pytest_grouped.log" 2>&1
echo "pytest rc $? at $((SECONDS - T0)) s: $(tail -1 "$OUT/pytest_grouped.log")" >> "$S"
timeout -s INT "$(( $(left) - 5 ))" python3 benchmarks/bench_moe.py --tokens "$TOKENS" --json "$OUT/moe.json" ${BENCH_ARGS:-} \
  > "$OUT/moe.log" 2>&1
echo "bench rc $? at $((SECONDS - T0)) s" >> "$S"
cat "$S"; tail -5 "$OUT/pytest_grouped.log"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_grouped.log" | head; tail -40 "$OUT/moe.log"
