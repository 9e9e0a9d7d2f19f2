#!/usr/bin/env bash
# One lent GPU, one call of at most 10 minutes: retrain both tiny fixtures from scratch on a mix
# of `arith` and `arith_var`, calibrate them on arith_var's calibration split, measure
# the decoder and vocabulary tables on the held-out sets, then time the batched decode loop and
# the 8B-shape replay. Every part has a deadline (seconds from the start); what is
# finished is packed into $OUT after each part, so a stopped run still returns it:
#   $OUT/fixtures.tgz  the new fixture folders and calibrated artifacts
#   $OUT/results.tgz   one log / JSON per job (r/)
#
#   OUT=out/gpu bash scripts/tiny_fixtures/gpu_run.sh            # on the GPU machine
#   OUT=/tmp/dry DEV=cpu SCALE=dry bash scripts/tiny_fixtures/gpu_run.sh   # wiring check
#
# Parts: 1 train, 2 calibrate + base decoder rows, 3 planning rows (parts 2 and 3 start one
# process per row: slow on one card), 4 time the decode loop and the 8B replay, 5 evaluate with
# one process per fixture and task at batch 128 (FULL_TABLES=1: every row of both tables; 37 s
# for 500 items and four rows per fixture on an H200). A run that retrains and measures
# everything: PARTS="1 2 5" CAL_ONLY=1 FULL_TABLES=1 with deadlines that fit (D_TRAIN, D_EVAL,
# D_QUICK); CAL_ONLY=1 makes part 2 calibrate only (batched: --batch-size 32 --width 256).
#
# Needs no install: the package runs from the checkout (PYTHONPATH). It trains with the
# tokenizers already in pvf_lmeval/fixtures/ (--tokenizer-from), which must be the ones the task
# data and the hand-written artifacts were made with: for a new vocabulary, first write it with
# tokenizers_build (train_bpe(fixture_corpus()) + write_tokenizer), then
# `arith_var_data.py --out tasks/arith_var/data` and scripts/make_handwritten_vocab.py. The
# training overwrites the weights there. The default deadlines fit one H200; parts 2 and 3
# may not finish within them (part 5 is the faster evaluation).
set -u
T0=$(date +%s)
OUT=${OUT:-out/gpu}
DEV=${DEV:-cuda}
SCALE=${SCALE:-full}
PARTS=${PARTS:-1 2 3 4}   # which parts to run, in this order (e.g. "4 1": time first, then train)
# INIT=1: part 1 continues from the weights in the fixture folders (--init-from, a new
# DATA_SEED) instead of training from scratch; LR, BUDGET and D_TRAIN override the defaults
# (a training-only run: PARTS=1 INIT=1 BUDGET=540 D_TRAIN=585). Without BUDGET the training
# steps end TRAIN_CHECK_S (60) seconds before D_TRAIN, whenever part 1 starts. The deadlines
# D_EVAL, D_PVF, D_E2E and D_QUICK (seconds from the start) can be set too, for another order of parts;
# QUICK_LIMIT: part 5 on the first N held-out items (default all); FULL_TABLES=1: part 5 runs
# every row of the decoder and vocabulary tables (docs/benchmarks.md).
# VAR_SHARE: the share of arith_var batches in part 1 (default 0.6).
# Part 6 (PARTS=6, deadline D_REMEASURE, default 578 s): the GPU share of re-measuring every
# README figure after new weights are installed (docs/fixture-figures.md).
INIT=${INIT:-0}
PY=${PYTHON:-python3}
R=${R:-$OUT/r}   # the logs (outside $OUT when only a few files may come back)
mkdir -p "$R"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export TOKENIZERS_PARALLELISM=true OMP_NUM_THREADS=2

if [ "$SCALE" = full ]; then
    BATCH=128; LIMIT=""; CAL_LIMIT=400; D_TRAIN=${D_TRAIN:-255}
    D_EVAL=${D_EVAL:-395}; D_PVF=${D_PVF:-485}; D_E2E=${D_E2E:-578}; D_QUICK=${D_QUICK:-578}
    QUICK_BATCH=128; QUICK_LIMIT=${QUICK_LIMIT:+--limit $QUICK_LIMIT}
    E2E=${E2E:-"--limit 32 --batch-sizes 1 16 --replay llada-8b --compile"}
else   # wiring check on a CPU: seconds of training, a handful of items
    BATCH=8; LIMIT="--limit 8"; CAL_LIMIT=4; D_TRAIN=${D_TRAIN:-400}
    D_EVAL=${D_EVAL:-900}; D_PVF=${D_PVF:-1300}; D_E2E=${D_E2E:-1500}; D_QUICK=${D_QUICK:-1500}
    QUICK_BATCH=8; QUICK_LIMIT="--limit ${QUICK_LIMIT:-8}"
    E2E=${E2E:-"--limit 4 --batch-sizes 1 4 --replay llada-8b/16"}
fi
left() { local s=$(( $1 - ($(date +%s) - T0) )); [ $s -lt 5 ] && s=5; echo $s; }
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$R/run.log"; }
pack() {
    tar czf "$OUT/fixtures.tgz" pvf_lmeval/fixtures/tiny-llada pvf_lmeval/fixtures/tiny-dream \
        $(ls vocab_artifacts/tiny-*.calibrated.json 2>/dev/null)
    tar czf "$OUT/results.tgz" -C "$(dirname "$R")" "$(basename "$R")"
}
job() {   # job NAME DEADLINE CMD...: runs in the background, logs to $R/NAME.log
    local name=$1 deadline=$2; shift 2
    ( timeout "$(left "$deadline")" "$@" > "$R/$name.log" 2>&1; echo "rc $?" >> "$R/$name.log" ) &
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  $PY -c "import torch, transformers, tokenizers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__)"
  nproc; } > "$R/env.txt" 2>&1
stamp "start $(cat "$R/env.txt" | tr '\n' ' ')"

part1() {
# 1. Training: both fixtures at once on the one GPU, from scratch with the fixtures' own
#    tokenizers, or (INIT=1) continuing from their weights.
local budget=${BUDGET:-$(( $(left "$D_TRAIN") - ${TRAIN_CHECK_S:-60} ))}
for fam in llada dream; do
    if [ "$INIT" = 1 ]; then
        FROM="--init-from pvf_lmeval/fixtures/tiny-$fam --data-seed ${DATA_SEED:-31}"; lr=${LR:-2e-3}
    else
        FROM="--tokenizer-from pvf_lmeval/fixtures/tiny-$fam"; lr=${LR:-3e-3}
    fi
    job "train-$fam" $D_TRAIN $PY scripts/tiny_fixtures/train.py --family $fam $FROM \
        --out pvf_lmeval/fixtures/tiny-$fam --var-share ${VAR_SHARE:-0.6} --batch $BATCH --lr $lr \
        --time-budget $budget --eval-every 2000 --check-items 100 --eval-items 200 --device $DEV
done
wait
stamp "training done: $(grep -h 'held-out exact match (threshold' "$R"/train-*.log | tr '\n' ' ')"
pack
}

part2() {
# 2. Calibration (arith_var's split, the paper's filters) beside the decoders that need no
#    vocabulary. A second calibration on fewer prompts is the fallback if the full one is stopped.
rm -f vocab_artifacts/*.partial
DEC="$PY bench/decoders.py --batch-size 32 --device $DEV --dtype float32 $LIMIT"
CAL="$PY -m pvf_lmeval.cli.calibrate --data arith_var --family math-word --gen-length 256 --block-length 32 --device $DEV --dtype float32 --no-progress --batch-size 32 --width 256"
for f in llada dream; do
    job "vocab-$f" $D_EVAL $CAL --model tiny-$f --limit $CAL_LIMIT \
        --out vocab_artifacts/tiny-$f.math-word.calibrated.json
    job "vocab-$f-small" $D_EVAL $CAL --model tiny-$f --limit $(( CAL_LIMIT * 3 / 8 )) \
        --out "$R/tiny-$f.math-word.calibrated-small.json"
    [ "${CAL_ONLY:-0}" = 1 ] && continue    # part 5 runs the decoder rows
    for task in arith_var arith; do
        job "dec-$task-$f-base" $D_EVAL $DEC --task $task --fixtures tiny-$f \
            --only threshold static freedave --json "$R/dec-$task-$f-base.json"
    done
done
wait
for f in llada dream; do
    if ! grep -q "^rc 0" "$R/vocab-$f.log"; then
        cp "$R/tiny-$f.math-word.calibrated-small.json" vocab_artifacts/tiny-$f.math-word.calibrated.json \
            && stamp "tiny-$f: full calibration stopped, installed the small one"
    fi
done
stamp "calibration: $(grep -h 'kept' "$R"/vocab-*.log | tr '\n' ' ')"
pack
}

part3() {
# 3. Everything that reads the planning vocabulary (vocab=auto now picks the calibrated artifact
#    if it kept tokens), one row per process (threshold is in part 2's files).
n=0
for f in llada dream; do
    for row in pvf "pvf routes=plan" "pvf routes=ar" "pvf routes=none" "explore pick=planning" \
               "explore pick=random"; do
        n=$((n + 1))
        job "dec-arith_var-$f-p$n" $D_PVF $DEC --task arith_var --fixtures tiny-$f --skip-threshold \
            --only "$row" --json "$R/dec-arith_var-$f-p$n.json"
    done
    job "dec-arith-$f-pvf" $D_PVF $DEC --task arith --fixtures tiny-$f --skip-threshold \
        --only pvf "pvf routes=plan" "pvf routes=ar" --json "$R/dec-arith-$f-pvf.json"
    for v in none hand-written calibrated heuristic; do
        job "vocab-modes-arith_var-$f-$v" $D_PVF $PY bench/vocab_modes.py --task arith_var \
            --fixtures tiny-$f $LIMIT --batch-size 32 --device $DEV --only $v \
            --json "$R/vocab-modes-arith_var-$f-$v.json"
    done
done
wait
stamp "planning rows done"
pack
}

part4() {
# 4. Timing on its own (nothing else running): the batched decode loop on the new tiny-llada,
#    then the 8B-shape replay with compile=blocks.
job e2e $D_E2E $PY bench/e2e.py --fixtures tiny-llada --device $DEV --decoders threshold pvf \
    --caches none dual $E2E --json "$R/e2e.json"
wait
stamp "e2e done"
pack
}

part5() {
# 5. Evaluating new weights on the card (after part 1, instead of parts 2 and 3): one process per
#    fixture and task, batch 128 (20 processes sharing the card make each call slow),
#    vocab=auto (the hand-written vocabulary unless a calibrated artifact of these weights is
#    present); each row's figures are in its log as soon as it is done. FULL_TABLES=1 adds the
#    rest of the decoder table, bench/decoders.py's opt-in row with the published code's
#    impact rule, and the vocabulary table (bench/vocab_modes.py).
local var_rows=(pvf "pvf routes=ar" "pvf routes=plan") arith_rows=(pvf)
if [ "${FULL_TABLES:-0}" = 1 ]; then
    var_rows+=(static freedave "pvf routes=none" "explore pick=planning" "explore pick=random"
               "pvf rules=paper+impact_includes_committed")
    arith_rows+=("pvf routes=plan" "pvf routes=ar")
fi
for f in llada dream; do
    job "quick-arith_var-$f" $D_QUICK $PY bench/decoders.py --task arith_var --fixtures tiny-$f \
        --batch-size $QUICK_BATCH --device $DEV --dtype float32 $QUICK_LIMIT \
        --only "${var_rows[@]}" --json "$R/quick-arith_var-$f.json"
    job "quick-arith-$f" $D_QUICK $PY bench/decoders.py --task arith --fixtures tiny-$f \
        --batch-size $QUICK_BATCH --device $DEV --dtype float32 $QUICK_LIMIT \
        --only "${arith_rows[@]}" --json "$R/quick-arith-$f.json"
    if [ "${FULL_TABLES:-0}" = 1 ]; then
        job "quick-vocab-modes-$f" $D_QUICK $PY bench/vocab_modes.py --task arith_var \
            --fixtures tiny-$f $QUICK_LIMIT --batch-size $QUICK_BATCH --device $DEV \
            --only none hand-written calibrated heuristic --json "$R/quick-vocab-modes-$f.json"
    fi
done
wait
stamp "quick evaluation: $(grep -h "acc" "$R"/quick-*.log | cut -c1-150 | tr '\n' ' ')"
pack
}

part6() {
# 6. Installing weights: the GPU share of scripts/remeasure_fixture_figures.sh (calibration, the
#    arith_var decoder and vocabulary tables; docs/fixture-figures.md has the CPU share), its logs
#    and JSON in $R/remeasure, the new calibrated artifacts in vocab_artifacts/ (packed).
( timeout "$(left "${D_REMEASURE:-578}")" env PY="$PY" DEV="$DEV" JOBS=8 SPLIT=gpu \
    bash scripts/remeasure_fixture_figures.sh "$R/remeasure" > "$R/remeasure.log" 2>&1
  echo "rc $?" >> "$R/remeasure.log" )
stamp "remeasure: $(tr '\n' ' ' < "$R/remeasure.log")"
pack
}

for p in $PARTS; do
    stamp "part $p"
    "part$p"
done
