#!/usr/bin/env bash
# The GPU tables of docs/speed.md, docs/batch-invariance.md and docs/models.md, each part
# reduced, in one command of at most 8 minutes (for a GPU lent for a short while):
#
#   host-syncs   synchronisations per round that CUDA reports (bench/host_ops.py --device cuda)
#   invariance   batch 1 vs 16 with batch_invariant off and on, threshold and pvf, and the
#                option's cost per call at LLaDA-8B's shape (bench/gpu_invariance.py)
#   loop         the loop on tiny-llada, arith_var at 256, cache dual, batch 1 and 16: share
#                of the wall outside model calls (bench/e2e.py)
#   loop-round   the same with the round's step compiled (compile_round=true)
#   shadow       the real loop at LLaDA-8B's cost: pvf and threshold, dual and dual_base,
#                batch 1/4/16/64, compile=true's scope (bench/e2e.py --shadow llada-8b)
#   moe          LLaDA-MoE-7B-A1B and LLaDA2.0-mini shapes: replayed decodes and the expert
#                layer against a dense one of the same active width (bench/moe_speed.py)
#   parallel     two processes on the one GPU (gloo) at LLaDA2.0-mini's shape, random weights:
#                expert parallel 2 against one process, logits equal, time per call
#                (bench/parallel.py; no interconnect is measured)
#   flash-shard  rank 0 of expert parallel 8 of LLaDA2.0-flash (32 of 256 experts, about 31
#                GB), alone, its collectives local: time per call of one rank's compute
#   dgemma       DiffusionGemma 26B-A4B as published (about 51 GB in bfloat16), random weights:
#                time per denoising call and per renoise sampler round, batch 1 and 16
#                (bench/dgemma_speed.py)
#
# Each part runs under its own timeout (they add up to at most 460 s) and keeps what it printed
# when cut short. A device call brings back at most 8 files, so with $OUT set the raw output is
# packed into $OUT/session.tgz after every part, beside $OUT/session.txt (everything printed);
# without it, both and the raw files go to bench/results/<UTC date>-<host>/.
#
#   COMMIT=<sha> bash bench/gpu_session.sh   # on a CUDA machine (COMMIT: for a copy without .git)
#   bash bench/gpu_session.sh --tiny     # everything shrunk, on the CPU (checks the script runs)
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export PYTHONUNBUFFERED=1

if [ "${1:-}" = "--tiny" ]; then
    DEV=cpu ITEMS=2 SIZES_INV=1,2 SIZES_LOOP="1 2" SIZES_SHADOW="1 2" PER_SIZE=2 TASK=arith
    SHAPE=llada-8b/16 INV="--dtype float32 --gen-length 32 --shape none" MOE="--reduce 16"
    COMPILE="" THREADS="--threads 1"
    PAR="--reduce 16 --calls 1 --canvas 64 --gen 32 --layers experts all"
    FLASH="--reduce 16 --calls 1 --canvas 64 --gen 32"
    DG="--reduce 32 --batch-sizes 1 2 --prompt 16 --calls 1 --steps 2"
    T_SYNC=300 T_INV=300 T_LOOP=300 T_ROUND=300 T_SHADOW=300 T_MOE=300 T_PAR=300 T_FLASH=300
    T_DG=300
elif [ -n "${1:-}" ]; then
    echo "gpu_session.sh: unknown argument '$1'; allowed: --tiny (or nothing)" >&2; exit 2
else
    DEV=cuda ITEMS=32 SIZES_INV=1,16 SIZES_LOOP="1 16" SIZES_SHADOW="1 4 16 64" PER_SIZE=8
    TASK=arith_var SHAPE=llada-8b INV="" MOE="" COMPILE="--compile" THREADS=""
    PAR="--reduce 1 --calls 3 --rows 2 --layers experts" FLASH="--calls 3 --rows 2"
    DG="--batch-sizes 1 16"
    T_SYNC=30 T_INV=95 T_LOOP=40 T_ROUND=60 T_SHADOW=90 T_MOE=30 T_PAR=45 T_FLASH=25 T_DG=45
fi
if [ -n "${OUT:-}" ]; then          # a device call: only the log and the pack go to $OUT
    DIR=$OUT WORK=$(mktemp -d)
else
    DIR=bench/results/$(date -u +%Y-%m-%d)-$(hostname -s)
    WORK=$DIR/session
fi
mkdir -p "$DIR" "$WORK"
LOG=$DIR/session.txt
: > "$LOG"
{ date -u; hostname; $PY -c 'import torch; print("torch", torch.__version__,
  torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA")'
  echo "commit ${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo 'unknown (no .git: set COMMIT)')}"
} 2>&1 | tee "$WORK/machine.txt" >> "$LOG"

part() {   # name, timeout seconds, command...: output to $WORK/name.out/.err, then pack
    local name=$1 secs=$2; shift 2
    echo "== $name (at most ${secs} s)" | tee -a "$LOG"
    timeout "$secs" "$@" > "$WORK/$name.out" 2> "$WORK/$name.err"
    local rc=$?
    [ $rc -eq 0 ] || echo "$name: exit $rc (124: timed out)" | tee -a "$LOG"
    cat "$WORK/$name.out" >> "$LOG"
    tail -5 "$WORK/$name.err" >> "$LOG"
    tar czf "$DIR/session.tgz" -C "$WORK" .
}

part host-syncs "$T_SYNC" $PY bench/host_ops.py --device $DEV --fixtures tiny-llada --limit 4 \
    --caches dual --batch-sizes 1 4
part invariance "$T_INV" $PY bench/gpu_invariance.py --device $DEV --decoders threshold,pvf \
    --items $ITEMS --batch-sizes $SIZES_INV --out "$WORK/invariance" $INV
LOOP="bench/e2e.py --fixtures tiny-llada --task $TASK --limit $((ITEMS < 16 ? ITEMS : 16))
    --decoders threshold pvf --caches dual --batch-sizes $SIZES_LOOP --device $DEV $THREADS"
part loop "$T_LOOP" $PY $LOOP --json "$WORK/loop.json"
part loop-round "$T_ROUND" $PY $LOOP --compile-round --json "$WORK/loop-round.json"
part shadow "$T_SHADOW" $PY bench/e2e.py --shadow $SHAPE --fixtures tiny-llada --task $TASK \
    --limit $((ITEMS * 2)) --requests-per-size $PER_SIZE --decoders pvf threshold \
    --caches dual dual_base --batch-sizes $SIZES_SHADOW --device $DEV $THREADS $COMPILE \
    --json "$WORK/shadow.json"
part moe "$T_MOE" $PY bench/moe_speed.py --device $DEV $MOE
part parallel "$T_PAR" $PY bench/parallel.py --device $DEV $PAR
part flash-shard "$T_FLASH" $PY bench/parallel.py --flash-shard --device $DEV $FLASH
part dgemma "$T_DG" $PY bench/dgemma_speed.py --device $DEV $DG
echo "raw output: $DIR (packed: $DIR/session.tgz)" | tee -a "$LOG"
