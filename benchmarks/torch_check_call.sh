#!/usr/bin/env bash
# One GPU call after a change to the torch ops (their layout tags): tests/gpu/test_torch_backend_gpu.py
# (four tests in parallel processes, each building its kernel on first use) and
# tests/gpu/test_torch_gpu.py (its kernels: prebuild.py torch), every core building.
#   bash benchmarks/torch_check_call.sh [DEADLINE_S]
set -u
DEADLINE=${1:-400}
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export EVTC_TEST_SOURCE=1 EVTC_BUILD_JOBS=4
G=tests/gpu
for k in linear_gelu mlp_block layernorm fp8_output; do
  timeout -s INT "$DEADLINE" python3 -m pytest -q -p no:cacheprovider -m gpu $G/test_torch_backend_gpu.py -k "$k" \
    > "$OUT/backend_$k.log" 2>&1 &
done
( cd benchmarks && timeout $(( DEADLINE - 90 )) python3 prebuild.py torch > "$OUT/build_torch.log" 2>&1 )
timeout -s INT 80 python3 -m pytest -q -p no:cacheprovider -m gpu $G/test_torch_gpu.py > "$OUT/torch_gpu.log" 2>&1
wait
for f in "$OUT"/backend_*.log "$OUT/torch_gpu.log"; do echo "== $f: $(tail -1 "$f")"; grep -E "^(FAILED|ERROR)" "$f" | head -3; done
tail -1 "$OUT/build_torch.log"
