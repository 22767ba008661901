#!/usr/bin/env bash
# One call of the GPU machine (one H200) that measures, with the existing benchmarks:
#   issue 38: bench_train.py --blocks gpt2,llama (its kernels carried in .evtc-cache);
#   issue 35: bench_host.py (host us per call; prebuild.py host builds its kernels and the torch
#             fast path first);
#   issue 40: bench_invariance.py (the cost of batch_invariant=True; its kernels: --prebuild).
# Kernels packed on the CPU machine (benchmarks/pack_cache.py, or pack() on bench_invariance's
# jobs) travel as .carry/*.tar.xz and are imported first. Whatever is still missing builds in the
# background (prebuild.py host, then bench_invariance.py --prebuild, on every core) while the
# training benchmark, whose kernels are cached, compiles and times on the GPU. The timings run one
# after another, never two on the GPU at once, and the host benchmark starts only after the builds
# have ended (nvcc on every core would inflate host time per call). Each part stops at its share
# of DEADLINE_S; logs, JSON and a summary (the GPU's name, what ran, how long) go to OUT.
#   bash benchmarks/measure_call.sh [DEADLINE_S]
set -u
DEADLINE=${1:-440}
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
T0=$SECONDS
left() { local l=$(( DEADLINE - (SECONDS - T0) )); echo $(( l > 5 ? l : 5 )); }
atmost() { local l; l=$(left); echo $(( l < $1 ? l : $1 )); }
export EVTC_TEST_SOURCE=1 EVTC_BUILD_JOBS=$(nproc)
S="$OUT/summary.txt"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  echo "nproc $(nproc)"; } > "$S" 2>&1
for t in .carry/*.tar.xz; do [ -e "$t" ] && python3 -m evtc cache import "$t" >> "$S" 2>&1; done
echo "imported at $((SECONDS - T0)) s" >> "$S"

# builds: host kernels and the torch fast path, then the invariance benchmark's kernels; they
# stop in time to leave 200 s for the host and invariance timings
( cd benchmarks && timeout "$(( DEADLINE - 200 ))" python3 prebuild.py host
  echo "host build rc $? at $((SECONDS - T0)) s"
  B=$(( DEADLINE - 200 - (SECONDS - T0) )); timeout "$(( B > 1 ? B : 1 ))" python3 bench_invariance.py --prebuild
  echo "invariance build rc $? at $((SECONDS - T0)) s" ) > "$OUT/build.log" 2>&1 &
BUILD=$!

timeout -s INT "$(atmost 240)" python3 benchmarks/bench_train.py --blocks gpt2,llama \
  --json "$OUT/train.json" > "$OUT/train.log" 2>&1
echo "train rc $? at $((SECONDS - T0)) s" >> "$S"
wait "$BUILD"
echo "builds ended at $((SECONDS - T0)) s: $(grep -E 'rc |built' "$OUT/build.log" | tr '\n' ' ')" >> "$S"

timeout -s INT "$(atmost 120)" python3 benchmarks/bench_host.py --json "$OUT/host.json" > "$OUT/host.log" 2>&1
echo "host rc $? at $((SECONDS - T0)) s" >> "$S"

timeout -s INT "$(left)" python3 benchmarks/bench_invariance.py --json "$OUT/inv.json" > "$OUT/inv.log" 2>&1
echo "invariance rc $? at $((SECONDS - T0)) s ($(grep -c ' ms (' "$OUT/inv.log") rows)" >> "$S"

cat "$S"
echo "== train"; grep -E "fused|Error|error" "$OUT/train.log" | tail -6
echo "== host"; tail -12 "$OUT/host.log"
echo "== invariance"; tail -3 "$OUT/inv.log"
echo "total $((SECONDS - T0)) s"
