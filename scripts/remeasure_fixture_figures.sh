#!/usr/bin/env bash
# Re-measure every README / docs figure that depends on the bundled tiny-fixture weights, after
# new weights are installed in pvf_lmeval/fixtures/ (see docs/fixture-figures.md for which figure
# each log feeds). Writes one log per job under OUT (default out/remeasure).
#
#   bash scripts/remeasure_fixture_figures.sh [OUT]        # JOBS=N parallel jobs (default: cores)
#
# Three phases: (1) calibration (`make vocab`: it changes what vocab=auto picks, so every pvf
# figure depends on it), (2) accuracy / NFE figures, JOBS at a time, one torch thread each,
# (3) the timing figures, one at a time with nothing else running.
#
# Settings (environment):
#   PHASES="1 2 3"  which phases to run;  ONLY=REGEX  only the jobs whose name matches (grep -E);
#   LIST=1          print the selected jobs ("phase<TAB>name<TAB>command") and run nothing;
#   PY              the Python that runs the jobs (default .venv/bin/python; python3 on a GPU
#                   machine with the checkout on PYTHONPATH);
#   DEV=cuda        calibration, bench/decoders.py and the arith_var vocabulary table run there, in
#                   float32 (the CPU's dtype, so the figures agree with a CPU run up to summation
#                   order) at batch DEV_BATCH (128); outputs and NFE do not depend on the batch.
#                   The other jobs are small, or are CPU timings, and stay on the CPU.
#   SPLIT=gpu|cpu   the jobs worth a lent GPU (the calibrations, the arith_var decoder and
#                   vocabulary tables; run them with DEV=cuda) / every other job. The GPU machine
#                   has no lm_eval (sweeps, demo), and the `arith` decoder table's wall-time
#                   columns are CPU figures, so those stay here. ONLY narrows either further.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/remeasure}
JOBS=${JOBS:-$(nproc)}
PY=${PY:-.venv/bin/python}
PHASES=${PHASES:-1 2 3}
ONLY=${ONLY:-.}
GPU_JOBS='^(vocab-(llada|dream)|decoders-var-.*|vocab-modes-var)$'
SPLIT=${SPLIT:-}
case "$SPLIT" in
    ""|gpu|cpu) ;;
    *) echo "SPLIT=$SPLIT: must be gpu or cpu" >&2; exit 2 ;;
esac
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
if [ -n "${DEV:-}" ]; then
    ON_DEV="--device $DEV --dtype float32"; B=${DEV_BATCH:-128}
else
    ON_DEV=""; B=32
fi
failed=0

run_jobs() {   # run_jobs PHASE PARALLEL, stdin: "name<TAB>command" lines; logs to $OUT/name.log
    local phase=$1 parallel=$2
    while IFS=$'\t' read -r name cmd; do
        [ -z "$name" ] && continue
        echo "$name" | grep -Eq -- "$ONLY" || continue
        if [ -n "$SPLIT" ]; then
            side=cpu; echo "$name" | grep -Eq -- "$GPU_JOBS" && side=gpu
            [ "$side" = "$SPLIT" ] || continue
        fi
        if [ "${LIST:-0}" = 1 ]; then printf '%s\t%s\t%s\n' "$phase" "$name" "$cmd" >&3; continue; fi
        printf '%s\0%s\0' "$name" "$cmd"
    done | xargs -0 -r -n 2 -P "$parallel" bash -c \
        'echo "[$(date +%T)] start $0"; if bash -c "$1" > "'"$OUT"'/$0.log" 2>&1; then
         echo "[$(date +%T)] done  $0"; else echo "[$(date +%T)] FAILED $0 (see '"$OUT"'/$0.log)"; exit 1; fi'
}
phase() { [[ " $PHASES " == *" $1 "* ]]; }
exec 3>&1
[ "${LIST:-0}" = 1 ] || mkdir -p "$OUT"
say() { [ "${LIST:-0}" = 1 ] || echo "$@"; }

CAL="$PY -m pvf_lmeval.cli.calibrate --data arith_var --family math-word --gen-length 256 --block-length 32 --threads 1 $ON_DEV${DEV:+ --batch-size 32 --width 256 --no-progress}"
DEC="$PY bench/decoders.py --batch-size $B --threads 1 $ON_DEV"

if phase 1; then
say "phase 1: calibration"
[ "${LIST:-0}" = 1 ] || rm -f vocab_artifacts/*.partial
run_jobs 1 "$JOBS" <<EOF || failed=1
vocab-llada	$CAL --model tiny-llada --out vocab_artifacts/tiny-llada.math-word.calibrated.json
vocab-dream	$CAL --model tiny-dream --out vocab_artifacts/tiny-dream.math-word.calibrated.json
vocab-heuristic	$PY scripts/make_heuristic_vocab.py
EOF
fi

if phase 2; then
say "phase 2: accuracy and calls"
run_jobs 2 "$JOBS" <<EOF || failed=1
decoders-arith-llada	$DEC --fixtures tiny-llada --json $OUT/decoders-arith-llada.json
decoders-arith-dream	$DEC --fixtures tiny-dream --json $OUT/decoders-arith-dream.json
decoders-var-llada	$DEC --task arith_var --fixtures tiny-llada --slow-limit 100 --json $OUT/decoders-var-llada.json
decoders-var-dream	$DEC --task arith_var --fixtures tiny-dream --slow-limit 100 --json $OUT/decoders-var-dream.json
vocab-modes-arith-llada	$PY bench/vocab_modes.py --limit 500 --fixtures tiny-llada --json $OUT/vocab-modes-arith-llada.json
vocab-modes-arith-dream	$PY bench/vocab_modes.py --limit 500 --fixtures tiny-dream --json $OUT/vocab-modes-arith-dream.json
vocab-modes-var	$PY bench/vocab_modes.py --task arith_var --batch-size $B $ON_DEV --only none heuristic hand-written calibrated --json $OUT/vocab-modes-var.json
rules-llada	$PY bench/rules.py --limit 200 --fixtures tiny-llada
rules-dream	$PY bench/rules.py --limit 200 --fixtures tiny-dream --no-switches
regime-arith-llada	$PY bench/regime_check.py --model tiny-llada --task arith --gen-length 96 --limit 8
regime-var-llada	$PY bench/regime_check.py --model tiny-llada --task arith_var --limit 8
regime-var-dream	$PY bench/regime_check.py --model tiny-dream --task arith_var --limit 8
trace-var	$PY bench/plan_case.py --model tiny-dream --task arith_var --limit 16 --out $OUT/arith_var_trace.md
sweep-arith	$PY bench/sweep.py --out $OUT/sweep-arith --threads 1
sweep-var	$PY bench/sweep.py --tasks arith_var --limit 50 --decoders threshold,pvf --out $OUT/sweep-var --threads 1
cache-accuracy	$PY bench/cache_accuracy.py --limit 200 --json $OUT/cache-accuracy.json
demo	make -s demo
EOF
fi

if phase 3; then
say "phase 3: timing (one job at a time)"
run_jobs 3 1 <<EOF || failed=1
throughput-threads1	$PY bench/throughput.py --limit 100 --decoders threshold pvf --threads 1
throughput-threads2	$PY bench/throughput.py --limit 100 --decoders threshold pvf --threads 2
throughput-batch32	$PY bench/throughput.py --limit 1000 --batch-size 32 --threads 2 --decoders threshold pvf --width-reps 0
e2e	$PY bench/e2e.py --fixtures tiny-llada --limit 32 --decoders threshold pvf --caches none dual --replay llada-8b/16
EOF
fi
[ "${LIST:-0}" = 1 ] || echo "logs in $OUT"
exit "$failed"
