#!/usr/bin/env bash
# Run the GPU tests and benchmarks on the GPU machine in one call, writing logs and JSON to $OUT
# (or ./gpu-out). Kernels built elsewhere travel as `evtc cache export` archives
# (benchmarks/pack_cache.py), which this script adds with `evtc cache import` (each entry checked):
#
#   python benchmarks/prebuild.py tests explore bias_relu planner:many_aux plan_vs_stock:differing runtime host
#   python benchmarks/pack_cache.py tests explore bias_relu planner:many_aux plan_vs_stock:differing runtime host -o .carry/k.tar.xz
#   # on the GPU machine, from the project root:
#   . ./.device-prelude.sh && bash benchmarks/gpu_suite.sh tests explore bias_relu planner plan_vs_stock runtime host
#
# The whole GPU suite (every tests/gpu/test_*.py) in chunks that each fit one 10-minute call of
# the lent machine (docs/testing.md, "The whole GPU suite in chunks"):
#
#   bash benchmarks/gpu_suite.sh chunk list          # the chunks: their prebuild groups and tests
#   bash benchmarks/gpu_suite.sh chunk 3/14 [DIR]    # chunk 3: prebuild its kernels, run its tests
#
# A chunk builds its kernels first, in parallel (benchmarks/prebuild.py groups; one nvcc per core,
# EVTC_BUILD_JOBS), then runs its tests with `pytest -v`, stopping both at a deadline
# (EVTC_CHUNK_LIMIT_S, 570 s from the start) so that what ran is still recorded: DIR (default
# $OUT, else ./gpu-out) gets chunk-N.log, chunk-N.json (per-file passed/failed/skipped/error
# counts, date, machine, commit, seconds, whether the deadline cut it) and errors_chunk-N.json
# (EVTC_ERROR_REPORT). Exit status 0 when nothing failed and the deadline did not cut the run.
#
# Stages (in the order given): demo (evtc demo), tests (the sm90 GPU tests), random (the sm90 GPU
# fuzz, tests/gpu/test_fuzz.py; random:EXPR: pytest -k EXPR as well), random80 (the sm80 fuzz),
# sm80 (sm80:EXPR: pytest -k EXPR), sanitize (compute-sanitizer, benchmarks/sanitize.py), explore,
# bias_relu (bias_relu:JSON: a GemmConfig instead of the default; a repeated stage writes
# name.2.json...), planner (many_aux), plan_vs_stock (the plans that differ from stock's), runtime
# (the run-time checks and CUDA-graph GPU tests; prebuild group runtime), host (host time per
# call, bench_host.py; prebuild group host), small (explore_small.py: candidate kernels for small
# problems), build (build times: bench_build.py; run it first, alone), launch (the host cost of a
# bare kernel launch by parameter size: benchmarks/micro/launch_cost.cu), gelu (evtc's exact GELU over
# all 2^32 inputs against float64, benchmarks/micro/gelu_check.cu; then probe_mlp_gemms.py
# --activations), mlp (bench_torch.py: the MLP block under eager, torch.compile and the evtc
# backend), prebuild:G1,G2 (build prebuild.py's groups G1, G2 on this machine's cores).
set -uo pipefail
start_s=$SECONDS
out=${OUT:-$PWD/gpu-out}
[ "${1:-}" = chunk ] && [ -n "${3:-}" ] && out=$3
mkdir -p "$out"
[ -n "${EVTC_CACHE_DIR:-}" ] && mkdir -p "$EVTC_CACHE_DIR"
for t in .carry/*.tar.xz; do [ -e "$t" ] && python3 -m evtc cache import "$t"; done
export EVTC_BUILD_JOBS=${EVTC_BUILD_JOBS:-$(nproc)}
export EVTC_TEST_SOURCE=1  # the device imports the working tree (PYTHONPATH), not an install: tests/conftest.py
rc=0

# ---- the whole GPU suite in chunks ---------------------------------------------------------------
# Each chunk: prebuild.py groups, then pytest runs. Kernel counts (2026-11-28) and the H100's build
# rate (75 conv kernels in 207 s on its 16 cores: docs/performance.md) size them; the files without a
# prebuild group (test_phase_split_gpu, test_staging_gpu, test_plugin_consumers, test_torch_backend_gpu)
# build the members their calls choose, one at a time, and sit in chunks with room for that.
NCHUNKS=14
FUZZ_K=(  # test_fuzz -k of the sm90 fuzz's four chunks (case ids sm90-000 ... sm90-199)
  "sm90-00 or sm90-01 or sm90-02 or sm90-03 or sm90-04" "sm90-05 or sm90-06 or sm90-07 or sm90-08 or sm90-09"
  "sm90-10 or sm90-11 or sm90-12 or sm90-13 or sm90-14" "sm90-15 or sm90-16 or sm90-17 or sm90-18 or sm90-19")
CHUNKS=(
  ""
  "sm90 tests and the runtime's: prebuild tests runtime degenerate (45 kernels); test_sm90_reference, test_sm90_language, test_sm90_planner, test_runtime_checks, test_graphs, test_degenerate_gpu, test_atomic_sums_gpu (builds its 8 kernels)"
  "sm80, torch, plugin, portable: prebuild sm80 torch (54 kernels); test_sm80_reference, test_torch_gpu, test_torch_backend_gpu, test_torch_fast_gpu, test_plugin_consumers, test_portable_gpu (skipped unless EVTC_PORTABLE_ARCHIVE)"
  "the family: prebuild family (111 kernels); test_family_gpu"
  "sm90 fuzz 0-49: prebuild random:0-49; test_fuzz -k 'sm90-00 ... sm90-04'"
  "sm90 fuzz 50-99: prebuild random:50-99; test_fuzz -k 'sm90-05 ... sm90-09'"
  "sm90 fuzz 100-149: prebuild random:100-149; test_fuzz -k 'sm90-10 ... sm90-14'"
  "sm90 fuzz 150-199: prebuild random:150-199; test_fuzz -k 'sm90-15 ... sm90-19'"
  "the sm80 fuzz: prebuild random80 (50 kernels); test_fuzz -k sm80"
  "evtc.glu and the row-phase split: prebuild glu (8 kernels); test_glu_gpu, test_phase_split_gpu (no prebuild group: its calls build their members)"
  "batch invariance, grouped GEMMs: prebuild invariance grouped (~60 kernels); test_batch_invariance_gpu, test_grouped_gpu"
  "quantized outputs, the padded staging route: prebuild quantize (~15 kernels); test_quantize_gpu, test_staging_gpu (no prebuild group: its calls build their members)"
  "conv but the persistent members: prebuild conv:tests conv:family (86 kernels); test_conv_gpu -k 'not persistent_member'"
  "conv persistent members 1: bias_relu, row_stats, fp8_out (36 kernels); test_conv_gpu -k 'persistent_member and not (many_aux or dgelu_bgrad)'"
  "conv persistent members 2: many_aux, dgelu_bgrad (39 kernels); test_conv_gpu -k 'persistent_member and (many_aux or dgelu_bgrad)'"
)
G=tests/gpu

left_s() { local l=$(( deadline_s - SECONDS )); echo $(( l > 1 ? l : 1 )); }  # timeout 0 would mean none

chunk_prebuild() {  # prebuild.py groups, within the deadline
  echo "--- prebuild $* ($(date +%T))"
  timeout -k 10 "$(left_s)" python3 benchmarks/prebuild.py "$@" 2>&1 | tail -3
}

chunk_prebuild_persistent() {  # the persistent conv members of the named epilogues (comma-separated)
  echo "--- prebuild conv:persistent of $1 ($(date +%T))"
  timeout -k 10 "$(left_s)" python3 - "$1" <<'PY' 2>&1 | tail -3
import sys
sys.path[:0] = ["benchmarks", "tests", "tests/gpu"]
import common
import conv_cases as CC
from evtc.compiler import BuildJob
want = set(sys.argv[1].split(","))
common.build_all([BuildJob(c.source, "sm90", f"{c.name}[{m}]")
                  for (n, m, _), c in CC.persistent_convs().items() if n in want], "prebuild")
PY
}

chunk_pytest() {  # pytest -v over its arguments, into the chunk's log; SIGINT at the deadline
  local left; left=$(left_s)
  if [ "$left" -le 5 ]; then echo "--- no time left for: $*" | tee -a "$log"; cut=1; return; fi
  echo "--- pytest $* ($(date +%T), ${left} s left)"
  timeout -s INT -k 20 "$left" python3 -m pytest -v -p no:cacheprovider -m gpu "$@" >> "$log" 2>&1
  local st=$?
  [ $st = 124 ] && cut=1
  [ $st != 0 ] && [ $st != 5 ] && chunk_rc=1  # 5: nothing selected
  grep -E "^(FAILED|ERROR) " "$log" | tail -5
}

run_chunk() {
  local spec=$1 n=${1%%/*}
  if [ "$spec" = list ]; then
    for i in $(seq 1 $NCHUNKS); do echo "chunk $i/$NCHUNKS: ${CHUNKS[$i]}"; done
    return 0
  fi
  if ! [[ "$n" =~ ^[0-9]+$ ]] || [ "$n" -lt 1 ] || [ "$n" -gt $NCHUNKS ] || { [ "$spec" != "$n" ] && [ "${spec#*/}" != $NCHUNKS ]; }; then
    echo "chunk '$spec': expected N or N/$NCHUNKS with N from 1 to $NCHUNKS (bash benchmarks/gpu_suite.sh chunk list)"
    return 2
  fi
  deadline_s=$(( start_s + ${EVTC_CHUNK_LIMIT_S:-570} ))
  log=$out/chunk-$n.log; cut=0; chunk_rc=0
  : > "$log"
  export EVTC_ERROR_REPORT=$out/errors_chunk-$n.json
  echo "=== chunk $n/$NCHUNKS: ${CHUNKS[$n]} ($(date +%T))"
  local t0=$SECONDS
  case $n in
    1) chunk_prebuild tests runtime degenerate; t1=$SECONDS
       chunk_pytest $G/test_sm90_reference.py $G/test_sm90_language.py $G/test_sm90_planner.py \
         $G/test_runtime_checks.py $G/test_graphs.py $G/test_degenerate_gpu.py
       chunk_pytest $G/test_atomic_sums_gpu.py ;;
    2) chunk_prebuild sm80 torch; t1=$SECONDS
       chunk_pytest $G/test_sm80_reference.py $G/test_torch_gpu.py $G/test_torch_backend_gpu.py $G/test_torch_fast_gpu.py \
         $G/test_plugin_consumers.py $G/test_portable_gpu.py ;;
    3) chunk_prebuild family; t1=$SECONDS
       chunk_pytest $G/test_family_gpu.py ;;
    4|5|6|7) f=$(( (n - 4) * 50 )); chunk_prebuild random:$f-$(( f + 49 )); t1=$SECONDS
       chunk_pytest $G/test_fuzz.py -k "${FUZZ_K[$(( n - 4 ))]}" ;;
    8) chunk_prebuild random80; t1=$SECONDS
       chunk_pytest $G/test_fuzz.py -k sm80 ;;
    9) chunk_prebuild glu; t1=$SECONDS
       chunk_pytest $G/test_glu_gpu.py
       chunk_pytest $G/test_phase_split_gpu.py ;;
    10) chunk_prebuild invariance grouped; t1=$SECONDS
       chunk_pytest $G/test_batch_invariance_gpu.py $G/test_grouped_gpu.py ;;
    11) chunk_prebuild quantize; t1=$SECONDS
       chunk_pytest $G/test_quantize_gpu.py $G/test_staging_gpu.py ;;
    12) chunk_prebuild conv:tests conv:family; t1=$SECONDS
       chunk_pytest $G/test_conv_gpu.py -k "not persistent_member" ;;
    13) chunk_prebuild_persistent bias_relu,row_stats,fp8_out; t1=$SECONDS
       chunk_pytest $G/test_conv_gpu.py -k "persistent_member and not (many_aux or dgelu_bgrad)" ;;
    14) chunk_prebuild_persistent many_aux,dgelu_bgrad; t1=$SECONDS
       chunk_pytest $G/test_conv_gpu.py -k "persistent_member and (many_aux or dgelu_bgrad)" ;;
  esac
  local machine
  machine=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd, -)
  python3 - "$log" "$out/chunk-$n.json" "$n/$NCHUNKS" "${machine:-unknown}" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    $(( t1 - t0 )) $(( SECONDS - t1 )) "$cut" <<'PY'
import collections, datetime, json, re, socket, sys
log, path, chunk, machine, commit, build_s, test_s, cut = sys.argv[1:]
files = collections.defaultdict(lambda: {"passed": 0, "failed": 0, "skipped": 0, "error": 0})
word = {"PASSED": "passed", "XPASS": "passed", "FAILED": "failed", "XFAIL": "skipped", "SKIPPED": "skipped", "ERROR": "error"}
for line in open(log, errors="replace"):
    m = re.match(r"(tests/gpu/[^:\s]+\.py)(?:::\S+)? (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b", line)
    if m:
        files[m.group(1)][word[m.group(2)]] += 1
rec = {"chunk": chunk, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
       "machine": machine, "host": socket.gethostname(), "commit": commit, "prebuild_s": int(build_s),
       "tests_s": int(test_s), "cut_by_deadline": cut == "1", "files": dict(sorted(files.items()))}
json.dump(rec, open(path, "w"), indent=1)
for f, c in rec["files"].items():
    print(f"{f}: " + ", ".join(f"{v} {k}" for k, v in c.items() if v))
print(f"chunk {chunk}: prebuild {build_s} s, tests {test_s} s" + (", CUT by the deadline" if rec["cut_by_deadline"] else ""))
PY
  [ "$cut" = 1 ] && chunk_rc=1
  return $chunk_rc
}

if [ "${1:-}" = chunk ]; then
  run_chunk "${2:-list}"
  exit $?
fi

for stage in "$@"; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    demo)   python3 -m evtc demo --out-dir "$out/demo" 2>&1 | tee "$out/demo.log" | tail -12 ;;
    tests)  EVTC_ERROR_REPORT=$out/errors_sm90.json python3 -m pytest -q -m gpu tests/gpu/test_sm90_reference.py \
              tests/gpu/test_sm90_language.py tests/gpu/test_sm90_planner.py 2>&1 | tee "$out/tests.log" | tail -25 ;;
    random|random:*|random80)  # the fuzz kernels travel prebuilt: prebuild.py random:0-99 random:100-199 random80
            arch=sm90; [ "$stage" = random80 ] && arch=sm80; sel="$arch"; [ "${stage#random:}" != "$stage" ] && sel="$arch and (${stage#random:})"
            EVTC_ERROR_REPORT=$out/errors_${stage%%:*}.json python3 -m pytest -q -m gpu tests/gpu/test_fuzz.py -k "$sel" 2>&1 \
              | tee "$out/${stage%%:*}.log" | tail -8 ;;
    sanitize)       python3 benchmarks/sanitize.py --json "$out/sanitize.json" 2>&1 | tee "$out/sanitize.log" | tail -60 ;;
    sm80|sm80:*)  # sm80:EXPR runs the tests that pytest's -k EXPR selects
            sel=(); [ "$stage" != sm80 ] && sel=(-k "${stage#sm80:}")
            EVTC_ERROR_REPORT=$out/errors_sm80.json python3 -m pytest -q -m gpu tests/gpu/test_sm80_reference.py "${sel[@]}" \
              2>&1 | tee "$out/sm80.log" | tail -5 ;;
    explore)        python3 benchmarks/explore_configs.py bias_relu --json "$out/explore.json" 2>&1 | tee "$out/explore.log" | grep -A7 fastest ;;
    bias_relu|bias_relu:*)
                    base=$out/bias_relu; cfg=(); [ "$stage" != bias_relu ] && { base=$out/bias_relu_config; cfg=(--config "${stage#bias_relu:}"); }
                    name=$base; k=2; while [ -e "$name.json" ]; do name=$base.$k; k=$((k + 1)); done
                    python3 benchmarks/bench_bias_relu.py "${cfg[@]}" --json "$name.json" 2>&1 | tee "$name.log" | tail -6 ;;
    planner)        python3 benchmarks/bench_planner.py --only many_aux --json "$out/planner.json" 2>&1 | tee "$out/planner.log" | tail -6 ;;
    plan_vs_stock)  python3 benchmarks/bench_plan_vs_stock.py --differing --json "$out/plan_vs_stock.json" 2>&1 \
                      | tee "$out/plan_vs_stock.log" | tail -8 ;;
    runtime)        EVTC_ERROR_REPORT=$out/errors_runtime.json python3 -m pytest -q -m gpu tests/gpu/test_runtime_checks.py \
                      tests/gpu/test_graphs.py 2>&1 | tee "$out/runtime.log" | tail -8 ;;
    family)         EVTC_ERROR_REPORT=$out/errors_family.json python3 -m pytest -q -m gpu tests/gpu/test_family_gpu.py \
                      2>&1 | tee "$out/family.log" | tail -15 ;;
    shapes|shapes:*)  # shapes:ARGS passes ARGS (comma-free words) to bench_shapes.py
                    sargs=(); [ "$stage" != shapes ] && read -ra sargs <<< "${stage#shapes:}"
                    python3 benchmarks/bench_shapes.py "${sargs[@]}" --json "$out/shapes.json" 2>&1 | tee "$out/shapes.log" | tail -40 ;;
    host)           python3 benchmarks/bench_host.py --profile --json "$out/host.json" 2>&1 | tee "$out/host.log" | tail -22 ;;
    small)          python3 benchmarks/explore_small.py --json "$out/explore_small.json" 2>&1 | tee "$out/explore_small.log" | tail -16 ;;
    build)          python3 benchmarks/bench_build.py --json "$out/build.json" 2>&1 | tee "$out/build.log" | tail -20 ;;
    launch)         nvcc -O2 -std=c++17 -arch=sm_90a -o "$out/launch_cost" benchmarks/micro/launch_cost.cu \
                      && "$out/launch_cost" 2>&1 | tee "$out/launch_cost.log" | tail -12; rm -f "$out/launch_cost" ;;
    gelu)           inc=$(python3 -c 'import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__))')/source/include
                    nvcc -O3 -std=c++17 -arch=sm_90a -I codegen_templates/include -I "$inc" -o "$out/gelu_check" \
                      benchmarks/micro/gelu_check.cu && "$out/gelu_check" | tee "$out/gelu_check.json"
                    st=${PIPESTATUS[0]}; rm -f "$out/gelu_check"
                    python3 benchmarks/probe_mlp_gemms.py --activations --json "$out/activations.json" 2>&1 \
                      | tee "$out/activations.log" | tail -4
                    [ "$st" = 0 ] || rc=1 ;;
    mlp)            python3 benchmarks/bench_torch.py --modes eager,default,evtc --tokens 1,1024,1536,2048,8192 \
                      --json "$out/bench_torch.json" 2>&1 | tee "$out/bench_torch.log" | tail -9 ;;
    prebuild:*)     # prebuild:GROUP,GROUP... builds those prebuild.py groups here, on every core
                    IFS=, read -ra groups <<< "${stage#prebuild:}"
                    python3 benchmarks/prebuild.py "${groups[@]}" 2>&1 | tail -3 ;;
    *) echo "unknown stage $stage"; rc=2 ;;
  esac
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
done
exit $rc
