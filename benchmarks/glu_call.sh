#!/usr/bin/env bash
# One call of the GPU machine for evtc.glu, the one-GEMM gated form (docs/gated.md): build
# test_glu_gpu's and bench_glu's kernels on every core, run tests/gpu/test_glu_gpu.py, then
# benchmarks/bench_glu.py; each part stops at its share of DEADLINE_S. Logs and JSON go to OUT.
#   [IMPORT=cache.tar.xz] [BENCH_ARGS="--graphs"] bash benchmarks/glu_call.sh [DEADLINE_S]
set -u
DEADLINE=${1:-560}
. "$(dirname "$0")/call_prelude.sh"
[ -n "${IMPORT:-}" ] && [ -f "$IMPORT" ] && python3 -m evtc cache import "$IMPORT" >> "$S" 2>&1
( cd benchmarks && timeout "$(( $(left) - 300 ))" python3 prebuild.py glu && \
  timeout "$(( $(left) - 280 ))" python3 bench_glu.py --prebuild ) > "$OUT/build.log" 2>&1
echo "built rc $? at $((SECONDS - T0)) s: $(grep -E '^built' "$OUT/build.log" | tr '\n' ' ')" >> "$S"
timeout -s INT "$(( $(left) - 240 ))" python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_glu_gpu.py \
  > "$OUT/pytest_glu.log" 2>&1
echo "pytest glu rc $? at $((SECONDS - T0)) s: $(tail -1 "$OUT/pytest_glu.log")" >> "$S"
timeout -s INT "$(( $(left) - 5 ))" python3 benchmarks/bench_glu.py --json "$OUT/glu.json" ${BENCH_ARGS:-} \
  > "$OUT/glu.log" 2>&1
echo "bench rc $? at $((SECONDS - T0)) s" >> "$S"
python3 -m evtc cache export "$OUT/glu_cache.tar.xz" >> "$S" 2>&1; ls -la "$OUT/glu_cache.tar.xz" >> "$S" 2>&1
cat "$S"; tail -15 "$OUT/pytest_glu.log"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_glu.log" | head
tail -40 "$OUT/glu.log"
