# Where the row max's time goes at 16384x4096x1024 (issue 11, not run yet): bash benchmarks/ncu/rowmax_tail.sh on the GPU machine.
# Nsight Compute of the row max (rowmax: branch red; rowmax_main: main's kernel from .carry/main_src.tar.xz) vs
# bias_relu at 16384x4096x1024 on the `large` member (one launch each: the 4th of the process; three warm up). Reports (.ncu-rep) and CSV pages under $OUT.
# Needs the kernels in the cache (python3 benchmarks/prebuild.py reductions shapes builds them; .carry/red.sh
# builds the rowmax ones). A few minutes (--set full replays each kernel ~40 times).
set -u
: "${OUT:?set OUT}"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu found"; exit 1; }
"$NCU" --version | tail -1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}   # this checkout's evtc
SHAPE=${SHAPE:-16384x4096x1024}
MEMBER=${MEMBER:-large}
EVTC_BUILD_JOBS=${EVTC_BUILD_JOBS:-16} timeout 200 python3 benchmarks/prebuild.py shapes > $OUT/ncu_build.log 2>&1
ROOT=$PWD
# rowmax_main: main's rowmax kernel (CUTLASS's serial final reduction), from .carry/main_src.tar.xz
if [ -f .carry/main_src.tar.xz ]; then
  rm -rf /tmp/red_main && mkdir -p /tmp/red_main && tar -xJf .carry/main_src.tar.xz -C /tmp/red_main
  (cd /tmp/red_main/main_src && PYTHONPATH=$PWD EVTC_BUILD_JOBS=${EVTC_BUILD_JOBS:-16} timeout 200 python3 benchmarks/prebuild.py shapes > $OUT/ncu_build_main.log 2>&1)
fi
for ep in rowmax bias_relu rowmax_main; do
  name=${ep%_main}; dir=$ROOT
  if [ $ep = rowmax_main ]; then [ -d /tmp/red_main/main_src ] || continue; dir=/tmp/red_main/main_src; fi
  (cd $dir && PYTHONPATH=$dir timeout 240 "$NCU" --set full --import-source yes --kernel-name-base demangled \
      -k regex:GemmUniversal --launch-skip 3 --launch-count 1 -f -o $OUT/ncu_${ep} \
      python3 $ROOT/benchmarks/ncu/ncu_one.py $name $MEMBER $SHAPE > $OUT/ncu_${ep}.log 2>&1)
  echo "$ep ncu rc=$?"; grep -v "^DEBUG" $OUT/ncu_${ep}.log | grep -v "^==PROF==" | tail -2
  [ -f $OUT/ncu_${ep}.ncu-rep ] || continue
  "$NCU" -i $OUT/ncu_${ep}.ncu-rep --page details --csv > $OUT/ncu_${ep}_details.csv 2>/dev/null
  "$NCU" -i $OUT/ncu_${ep}.ncu-rep --page source --csv --print-source sass > $OUT/ncu_${ep}_sass.csv 2>/dev/null
  "$NCU" -i $OUT/ncu_${ep}.ncu-rep --page raw --csv > $OUT/ncu_${ep}_raw.csv 2>/dev/null
done
# the headline metrics side by side
python3 - <<'PY'
import csv, os
out = os.environ["OUT"]
want = ["Duration", "Elapsed Cycles", "Compute (SM) Throughput", "Memory Throughput", "DRAM Throughput",
        "L2 Cache Throughput", "Registers Per Thread", "Achieved Occupancy", "Warp Cycles Per Issued Instruction",
        "Executed Instructions", "Stall Long Scoreboard", "Stall Barrier", "Stall Membar", "L1/TEX Hit Rate", "L2 Hit Rate"]
vals = {}
eps = ("rowmax", "bias_relu", "rowmax_main")
for ep in eps:
    try:
        for r in csv.DictReader(open(f"{out}/ncu_{ep}_details.csv")):
            n = r.get("Metric Name", "")
            if any(n.startswith(w) for w in want):
                vals.setdefault((r.get("Section Name", ""), n, r.get("Metric Unit", "")), {})[ep] = r.get("Metric Value", "")
    except FileNotFoundError:
        print("no details for", ep)
for (sec, n, u), v in vals.items():
    print(f"{n[:44]:44s} {u[:10]:10s} " + "  ".join(f"{ep} {v.get(ep, '-'):>12s}" for ep in eps))
PY
