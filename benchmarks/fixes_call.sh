#!/usr/bin/env bash
# One call of the GPU machine that runs again the GPU tests the 2026-11-29 suite run failed, after
# their fixes (docs/testing.md, "Partial runs"): the sm80 fuzz epilogues with a scalar sum
# (evtc::Sm80ScalarReduction) and the one that didn't build (regions of two ops), the family's
# dispatch routes, the planner's sharing variant, and evtc.glu (a caller's ragged out= refused;
# the backend's gated forms). Each test module builds its own kernels (its fixture, in parallel).
# Logs go to OUT.
#   bash benchmarks/fixes_call.sh [DEADLINE_S]
set -u
DEADLINE=${1:-560}
. "$(dirname "$0")/call_prelude.sh"
timeout -s INT "$(( $(left) - 5 ))" python3 -m pytest -v -p no:cacheprovider -m gpu \
  "tests/gpu/test_fuzz.py::test_fuzz_epilogue[sm80-003]" "tests/gpu/test_fuzz.py::test_fuzz_epilogue[sm80-007]" \
  "tests/gpu/test_fuzz.py::test_fuzz_epilogue[sm80-010]" "tests/gpu/test_fuzz.py::test_fuzz_epilogue[sm80-028]" \
  tests/gpu/test_family_gpu.py::test_family_dispatch_end_to_end \
  tests/gpu/test_sm90_planner.py::test_variants_are_really_what_they_say \
  tests/gpu/test_glu_gpu.py > "$OUT/pytest_fixes.log" 2>&1
echo "pytest rc $? at $((SECONDS - T0)) s: $(tail -1 "$OUT/pytest_fixes.log")" >> "$S"
cat "$S"; grep -E "PASSED|FAILED|ERROR" "$OUT/pytest_fixes.log" | tail -40
