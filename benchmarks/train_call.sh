#!/usr/bin/env bash
# One call of the GPU machine: the training benchmark with the bias gradients through float atomics
# (bench_train.py --atomic-sums: NOTE [Atomic row and column sums]) and its GPU test, beside the
# GPU tests the 2026-11-29 suite run failed (benchmarks/fixes_call.sh's, evtc.glu's left out: that
# is glu_call.sh's) and the grouped reference test (its reductions' out= dict). The training kernels not carried (.carry/*.tar.xz) build on every core while
# the tests run; each part stops at its share of DEADLINE_S. Logs and JSON go to OUT.
#   bash benchmarks/train_call.sh [DEADLINE_S]
set -u
DEADLINE=${1:-480}
. "$(dirname "$0")/call_prelude.sh"
( cd benchmarks && timeout "$(( $(left) - 240 ))" python3 bench_train.py --prebuild --blocks gpt2,llama --atomic-sums ) \
  > "$OUT/train_build.log" 2>&1 &
BUILD=$!
timeout -s INT "$(( $(left) - 250 ))" python3 -m pytest -v -p no:cacheprovider -m gpu \
  "tests/gpu/test_fuzz.py::test_fuzz_epilogue[sm80-003]" "tests/gpu/test_fuzz.py::test_fuzz_epilogue[sm80-007]" \
  "tests/gpu/test_fuzz.py::test_fuzz_epilogue[sm80-010]" "tests/gpu/test_fuzz.py::test_fuzz_epilogue[sm80-028]" \
  tests/gpu/test_family_gpu.py::test_family_dispatch_end_to_end \
  tests/gpu/test_sm90_planner.py::test_variants_are_really_what_they_say \
  tests/gpu/test_atomic_sums_gpu.py "tests/gpu/test_grouped_gpu.py::test_grouped_matches_the_reference" \
  > "$OUT/pytest_fixes.log" 2>&1
echo "pytest rc $? at $((SECONDS - T0)) s: $(tail -1 "$OUT/pytest_fixes.log")" >> "$S"
wait $BUILD
echo "train kernels built rc $? at $((SECONDS - T0)) s: $(tail -1 "$OUT/train_build.log")" >> "$S"
timeout -s INT "$(( $(left) - 5 ))" python3 benchmarks/bench_train.py --blocks gpt2,llama --atomic-sums \
  --json "$OUT/train.json" > "$OUT/train.log" 2>&1
echo "train rc $? at $((SECONDS - T0)) s" >> "$S"
cat "$S"; grep -E "PASSED|FAILED|ERROR" "$OUT/pytest_fixes.log" | tail -40; tail -20 "$OUT/train.log"
