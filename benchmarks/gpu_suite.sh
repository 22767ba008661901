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
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out" "$EVTC_CACHE_DIR"
for t in .carry/*.tar.xz; do [ -e "$t" ] && python3 -m evtc cache import "$t"; done
export EVTC_BUILD_JOBS=${EVTC_BUILD_JOBS:-16}
export EVTC_TEST_SOURCE=1  # the device imports the working tree (PYTHONPATH), not an install: tests/conftest.py
rc=0
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
