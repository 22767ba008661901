#!/usr/bin/env bash
# One short call of the GPU machine (4 GPUs) after a refactor of the call path: the training
# benchmark (bench_train.py, its kernels carried in .evtc-cache) on GPU 0 while the test
# kernels build on every core, then GPU test subsets side by side on GPUs 1-3. Each part stops at
# its share of DEADLINE_S; logs and JSON go to OUT.
#   bash benchmarks/check_call.sh [DEADLINE_S]
set -u
DEADLINE=${1:-360}
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
T0=$SECONDS
left() { local l=$(( DEADLINE - (SECONDS - T0) )); echo $(( l > 5 ? l : 5 )); }
export EVTC_TEST_SOURCE=1 EVTC_BUILD_JOBS=$(nproc)
G=tests/gpu
CUDA_VISIBLE_DEVICES=0 timeout -s INT "$(left)" python3 benchmarks/bench_train.py --blocks gpt2,llama \
  --json "$OUT/train.json" > "$OUT/train.log" 2>&1 &
( cd benchmarks && timeout "$(( $(left) - 150 ))" python3 prebuild.py invariance degenerate runtime conv:tests \
  > "$OUT/build.log" 2>&1 )
echo "built at $((SECONDS - T0)) s: $(tail -1 "$OUT/build.log")"
CUDA_VISIBLE_DEVICES=1 EVTC_ERROR_REPORT="$OUT/errors_runtime.json" timeout -s INT "$(( $(left) - 15 ))" \
  python3 -m pytest -q -p no:cacheprovider -m gpu \
  $G/test_batch_invariance_gpu.py $G/test_degenerate_gpu.py $G/test_runtime_checks.py $G/test_graphs.py $G/test_torch_fast_gpu.py \
  > "$OUT/pytest_runtime.log" 2>&1 &
CUDA_VISIBLE_DEVICES=2 timeout -s INT "$(( $(left) - 15 ))" python3 -m pytest -q -p no:cacheprovider -m gpu \
  $G/test_conv_gpu.py -k "sm90 and not persistent_member and not family_member and not long_k" \
  > "$OUT/pytest_conv_sm90.log" 2>&1 &
CUDA_VISIBLE_DEVICES=3 timeout -s INT "$(( $(left) - 15 ))" python3 -m pytest -q -p no:cacheprovider -m gpu \
  $G/test_conv_gpu.py -k "sm80 or bad_problem or zero_batch or channels_last or evtc_allocates" \
  > "$OUT/pytest_conv_sm80.log" 2>&1 &
wait
for f in "$OUT"/pytest_*.log; do echo "== $f"; tail -2 "$f"; grep -E "^(FAILED|ERROR)" "$f" | head -5; done
echo "== train"; tail -4 "$OUT/train.log"
echo "total $((SECONDS - T0)) s"
