#!/usr/bin/env bash
# One GPU call: the backend's grouped match (tests/gpu/test_grouped_gpu.py -k backend, builds its
# one kernel first), then issue 38's training benchmark (its kernels carried in .evtc-cache).
#   bash benchmarks/final_call.sh [DEADLINE_S]
set -u
DEADLINE=${1:-420}
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
T0=$SECONDS
left() { local l=$(( DEADLINE - (SECONDS - T0) )); echo $(( l > 5 ? l : 5 )); }
export EVTC_TEST_SOURCE=1 EVTC_BUILD_JOBS=$(nproc)
timeout -s INT 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_grouped_gpu.py -k backend \
  > "$OUT/pytest_backend.log" 2>&1
echo "backend test rc $? at $((SECONDS - T0)) s: $(tail -1 "$OUT/pytest_backend.log")"
timeout -s INT "$(( $(left) - 5 ))" python3 benchmarks/bench_train.py --blocks gpt2,llama --json "$OUT/train.json" \
  > "$OUT/train.log" 2>&1
echo "train rc $? at $((SECONDS - T0)) s"
grep -E "^(FAILED|ERROR)|Error" "$OUT/pytest_backend.log" | head -5
tail -30 "$OUT/train.log"
