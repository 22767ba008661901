#!/usr/bin/env bash
# One call of the GPU machine for issue 40's evtc.quantize: build test_quantize_gpu's and
# bench_quant's kernels on every core, run tests/gpu/test_quantize_gpu.py and the grouped
# GEMM's run_list test, then benchmarks/bench_quant.py; each part stops at its share of
# DEADLINE_S. Logs and JSON go to OUT.
#   [IMPORT=cache.tar.xz] [BENCH_ARGS="--tune-all"] bash benchmarks/quant_call.sh [DEADLINE_S]
set -u
DEADLINE=${1:-560}
. "$(dirname "$0")/call_prelude.sh"
# kernels an earlier call exported (evtc cache export), when carried: only changed sources rebuild
[ -n "${IMPORT:-}" ] && [ -f "$IMPORT" ] && python3 -m evtc cache import "$IMPORT" >> "$S" 2>&1
( cd benchmarks && timeout "$(( $(left) - 300 ))" python3 prebuild.py quantize && \
  timeout "$(( $(left) - 280 ))" python3 bench_quant.py --prebuild ${BENCH_ARGS:-} ) > "$OUT/build.log" 2>&1
echo "built rc $? at $((SECONDS - T0)) s" >> "$S"
timeout -s INT "$(( $(left) - 250 ))" python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_quantize_gpu.py \
  > "$OUT/pytest_quantize.log" 2>&1
echo "pytest quantize rc $? at $((SECONDS - T0)) s: $(tail -1 "$OUT/pytest_quantize.log")" >> "$S"
if [ "${RUN_LIST:-0}" = 1 ]; then  # issue 39's run_list test (recorded 2026-11-28)
  timeout -s INT "$(( $(left) - 220 ))" python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_grouped_gpu.py -k list_of_problems \
    > "$OUT/pytest_run_list.log" 2>&1
  echo "pytest run_list rc $? at $((SECONDS - T0)) s: $(tail -1 "$OUT/pytest_run_list.log")" >> "$S"
fi
timeout -s INT "$(( $(left) - 5 ))" python3 benchmarks/bench_quant.py --json "$OUT/quant.json" ${BENCH_ARGS:-} \
  > "$OUT/quant.log" 2>&1
echo "bench rc $? at $((SECONDS - T0)) s" >> "$S"
python3 -m evtc cache export "$OUT/quant_cache.tar.xz" >> "$S" 2>&1; ls -la "$OUT/quant_cache.tar.xz" >> "$S" 2>&1
cat "$S"; tail -15 "$OUT/pytest_quantize.log"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_quantize.log" | head
tail -40 "$OUT/quant.log"
