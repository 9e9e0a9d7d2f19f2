#!/usr/bin/env bash
# The GPU checks in one run (for an H100/H200; no downloads there): the 8B shapes
# with randomly initialised weights replaying the recorded tiny-llada schedules
# (bench/schedules_tiny.json, written by `bench/throughput.py --schedule-file`) and the paper's
# averages, then the tiny fixtures decoded on CUDA (every decoder x cache mode, batch 1 and 4).
#   OUT=out/device bash bench/device_check.sh [cuda]
# Writes one markdown file per part to $OUT. The package need not be installed (PYTHONPATH).
set -u
DEV=${1:-cuda}
OUT=${OUT:-out/device}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
SCHED=bench/schedules_tiny.json
PY=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} | tee "$OUT/env.txt"
for shape in llada-8b dream-7b; do
  [ "$DEV" = cuda ] || shape=tiny-random
  timeout 150 $PY bench/throughput.py --shape $shape --device "$DEV" --schedule-file $SCHED \
    --shape-reps 2 --width-reps 10 > "$OUT/${shape}_tiny_schedule.md" 2> "$OUT/${shape}.log" \
    || echo "$shape failed: rc $?"
  timeout 90 $PY bench/throughput.py --shape $shape --device "$DEV" --schedule-file $SCHED \
    --schedule paper --decoders static threshold pvf --caches none dual --shape-reps 2 \
    --width-reps 3 > "$OUT/${shape}_paper_schedule.md" 2>> "$OUT/${shape}.log" \
    || echo "$shape paper failed: rc $?"
  tail -n 4 "$OUT/${shape}.log"
  [ "$DEV" = cuda ] || break
done
for bs in 1 4; do
  timeout 120 $PY bench/throughput.py --device "$DEV" --limit 12 --batch-size $bs --width-reps 5 \
    > "$OUT/tiny_bs$bs.md" 2> "$OUT/tiny_bs$bs.log" || echo "tiny bs$bs failed: rc $?"
  tail -n 3 "$OUT/tiny_bs$bs.log"
done
