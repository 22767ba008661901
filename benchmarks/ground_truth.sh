#!/usr/bin/env bash
# The ground truth of issue 36 on the GPU machine, in one call: build every candidate kernel on
# every core, then one timing process per GPU over its shard of the corpus, each stopping (after
# saving) once BUDGET seconds have passed; results accumulate in .gt/ (git-ignored), so a second
# call on the same (warm) machine goes on where the first stopped. Copies the JSON and logs to OUT.
#   bash benchmarks/ground_truth.sh [BUDGET_S [ARGS...]]   (ARGS go to both phases, e.g. --only-streamk)
set -u
BUDGET=${1:-300}
shift || true
OUT=${OUT:-.gt}
mkdir -p .gt "$OUT"
NGPU=$(nvidia-smi -L | wc -l)
if [ ! -f .gt/built ]; then
  python3 benchmarks/ground_truth.py build -j "$(nproc)" "$@" > .gt/build.log 2>&1 && touch .gt/built
  tail -3 .gt/build.log; grep -c FAILED .gt/build.log
fi
VERIFY=--verify; [ -f .gt/verified ] && VERIFY=; [ -f .gt/built ] && touch .gt/verified
for i in $(seq 0 $((NGPU - 1))); do
  CUDA_VISIBLE_DEVICES=$i python3 benchmarks/ground_truth.py time --shard "$i/$NGPU" --out ".gt/gt$i.json" \
    --budget-s "$BUDGET" $VERIFY "$@" > ".gt/time$i.out" 2>&1 &
done
wait
python3 benchmarks/ground_truth.py merge .gt/gt*.json --out "$OUT/ground_truth.json"
cat .gt/gt*.json.log > "$OUT/time.log"; cp .gt/build.log "$OUT/build.log"
tail -n 3 .gt/time*.out; grep -h "VERIFY FAILED\|ERROR\|SKIP\|budget" .gt/gt*.json.log | head -20; grep -hc "^verified" .gt/gt*.json.log
