# Sourced by the one-call GPU scripts (grouped_call.sh, quant_call.sh) after they set DEADLINE:
# OUT (made), T0, left (seconds to the deadline, at least 5), every core for nvcc, the source tree
# under test, and $S, the summary file, begun with the machine, torch, the commit and the cores.
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
T0=$SECONDS
left() { local l=$(( DEADLINE - (SECONDS - T0) )); echo $(( l > 5 ? l : 5 )); }
export EVTC_TEST_SOURCE=1 EVTC_BUILD_JOBS=$(nproc)
S="$OUT/summary.txt"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  git rev-parse --short HEAD 2>/dev/null; echo "nproc $(nproc)"; } > "$S" 2>&1
# kernels built on the CPU machine and carried (benchmarks/pack_cache.py; .carry/ is git-ignored):
# every archive, each entry checked by `evtc cache import`; an archive whose sources changed since
# only adds entries nothing asks for
for t in .carry/*.tar.xz; do [ -e "$t" ] && python3 -m evtc cache import "$t" >> "$S" 2>&1; done
