#!/usr/bin/env bash
# One call of the GPU machine (4 GPUs) after a change to the family or the dispatch stage:
#   1. build, on every core at once, the kernels of the selection model's recheck
#      (ground_truth.py --recheck: the earlier run's two fastest candidates and the model's choice
#      on the validation half) and of a GPU test subset;
#   2. then, side by side: the recheck on GPUs 0-2, the GPU tests on GPU 3 (pytest -m gpu).
# Logs and JSON go to OUT. Stops each part at its deadline (DEADLINE_S from the start).
#   bash benchmarks/validate_call.sh [DEADLINE_S]
set -u
DEADLINE=${1:-540}
OUT=${OUT:-gpu-out}; mkdir -p "$OUT" .gt
T0=$SECONDS
left() { echo $(( DEADLINE - (SECONDS - T0) )); }
GT=benchmarks/ground_truth/H200.json
TESTS="tests/gpu/test_degenerate_gpu.py tests/gpu/test_runtime_checks.py tests/gpu/test_graphs.py tests/gpu/test_torch_fast_gpu.py tests/gpu/test_sm90_reference.py"
export EVTC_TEST_SOURCE=1 EVTC_BUILD_JOBS=$(nproc)
( python3 benchmarks/ground_truth.py build --split validation --recheck $GT -j 40 > "$OUT/build_recheck.log" 2>&1 ) &
( cd benchmarks && python3 prebuild.py degenerate tests runtime > "../$OUT/build_tests.log" 2>&1 ) &
wait
echo "built in $((SECONDS - T0)) s: $(tail -1 "$OUT/build_recheck.log") | $(tail -1 "$OUT/build_tests.log")"
B=$(( $(left) - 40 ))
for i in 0 1 2; do
  CUDA_VISIBLE_DEVICES=$i python3 benchmarks/ground_truth.py time --split validation --recheck $GT --shard "$i/3" \
    --out ".gt/recheck$i.json" --budget-s "$B" > ".gt/recheck$i.out" 2>&1 &
done
CUDA_VISIBLE_DEVICES=3 EVTC_ERROR_REPORT="$OUT/errors.json" timeout -s INT $(( $(left) - 25 )) \
  python3 -m pytest -q -p no:cacheprovider -m gpu $TESTS > "$OUT/pytest.log" 2>&1 &
wait
python3 benchmarks/ground_truth.py merge .gt/recheck*.json --out "$OUT/recheck.json"
cat .gt/recheck*.json.log > "$OUT/recheck.log"
tail -3 "$OUT/pytest.log"; grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head; grep -h "budget\|ERROR\|SKIP" .gt/recheck*.json.log | head -5
echo "total $((SECONDS - T0)) s"
