#!/usr/bin/env bash
# One call of a one-GPU machine: re-time the selection model's choices on the validation half
# (ground_truth.py --recheck: the first run's two fastest candidates, the model's choice through
# the family Gemm's own call, cuBLAS, eager and torch.compile) for some epilogue classes; the
# timing stops (after saving) at DEADLINE_S from the start. Logs and JSON go to OUT.
#   [EPILOGUES=pointwise] bash benchmarks/recheck_call.sh [DEADLINE_S]
set -u
DEADLINE=${1:-560}
. "$(dirname "$0")/call_prelude.sh"
mkdir -p .gt
GT=benchmarks/ground_truth/H200.json
EP=${EPILOGUES:-pointwise}
python3 benchmarks/ground_truth.py build --split validation --recheck $GT --epilogues "$EP" -j "$(nproc)" \
  > "$OUT/build_recheck.log" 2>&1
echo "built at $((SECONDS - T0)) s: $(tail -1 "$OUT/build_recheck.log")" >> "$S"
python3 benchmarks/ground_truth.py time --split validation --recheck $GT --epilogues "$EP" \
  --out "$OUT/recheck.json" --budget-s "$(( $(left) - 15 ))" > "$OUT/recheck.out" 2>&1
echo "timed at $((SECONDS - T0)) s: $(grep -c . "$OUT/recheck.json.log") log lines" >> "$S"
cat "$S"; tail -3 "$OUT/recheck.out"
