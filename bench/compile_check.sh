#!/usr/bin/env bash
# torch.compile on a real shape: the paper schedule of threshold and pvf (cache none and
# dual) and the one-call-vs-width table, eager and then compiled three ways, each its own process
# (so every compile starts cold and its warm-up time is printed). On an H100/H200:
#   OUT=out/device SHAPE=llada-8b bash bench/compile_check.sh
# A CPU smoke test of the same script: SHAPE=tiny-random bash bench/compile_check.sh
set -u
OUT=${OUT:-out/device}
SHAPE=${SHAPE:-llada-8b}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
PY=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  $PY -c "import torch; print('torch', torch.__version__)"
} | tee "$OUT/env.txt"
run() {   # label, time limit (s), extra throughput.py arguments
  local label=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" $PY bench/throughput.py --shape "$SHAPE" --schedule-file bench/schedules_tiny.json \
    --schedule paper --decoders threshold pvf --caches none dual --shape-reps 3 --width-reps 10 \
    "$@" > "$OUT/${SHAPE}_$label.md" 2> "$OUT/${SHAPE}_$label.log" || echo "$label: rc $?"
  echo "== $label ($((SECONDS - t0)) s)"
  grep -h "warm-up" "$OUT/${SHAPE}_$label.log"
  grep -h "^| \(threshold\|pvf\|[1248] \)" "$OUT/${SHAPE}_$label.md"
}
run eager 100
run blocks 150 --compile blocks
run blocks-cudagraphs 150 --compile blocks --compile-mode reduce-overhead
run model 170 --compile model
