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
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/remeasure}
JOBS=${JOBS:-$(nproc)}
PY=.venv/bin/python
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
mkdir -p "$OUT"
failed=0

run_jobs() {   # stdin: "name<TAB>command" lines; runs $1 at a time, logs to $OUT/name.log
    local parallel=$1
    while IFS=$'\t' read -r name cmd; do
        [ -z "$name" ] && continue
        printf '%s\0%s\0' "$name" "$cmd"
    done | xargs -0 -n 2 -P "$parallel" bash -c \
        'echo "[$(date +%T)] start $0"; if bash -c "$1" > "'"$OUT"'/$0.log" 2>&1; then
         echo "[$(date +%T)] done  $0"; else echo "[$(date +%T)] FAILED $0 (see '"$OUT"'/$0.log)"; exit 1; fi'
}

CAL=".venv/bin/pvf-calibrate --data arith_var --family math-word --gen-length 256 --block-length 32 --threads 1"

echo "phase 1: calibration"
rm -f vocab_artifacts/*.partial
run_jobs "$JOBS" <<EOF || failed=1
vocab-llada	$CAL --model tiny-llada --out vocab_artifacts/tiny-llada.math-word.calibrated.json
vocab-dream	$CAL --model tiny-dream --out vocab_artifacts/tiny-dream.math-word.calibrated.json
EOF
$PY scripts/make_heuristic_vocab.py > "$OUT/vocab-heuristic.log" 2>&1

echo "phase 2: accuracy and calls"
run_jobs "$JOBS" <<EOF || failed=1
decoders-arith-llada	$PY bench/decoders.py --fixtures tiny-llada --batch-size 32 --threads 1 --json $OUT/decoders-arith-llada.json
decoders-arith-dream	$PY bench/decoders.py --fixtures tiny-dream --batch-size 32 --threads 1 --json $OUT/decoders-arith-dream.json
decoders-var-llada	$PY bench/decoders.py --task arith_var --fixtures tiny-llada --batch-size 32 --threads 1 --slow-limit 100 --json $OUT/decoders-var-llada.json
decoders-var-dream	$PY bench/decoders.py --task arith_var --fixtures tiny-dream --batch-size 32 --threads 1 --slow-limit 100 --json $OUT/decoders-var-dream.json
vocab-modes-arith-llada	$PY bench/vocab_modes.py --limit 500 --fixtures tiny-llada --json $OUT/vocab-modes-arith-llada.json
vocab-modes-arith-dream	$PY bench/vocab_modes.py --limit 500 --fixtures tiny-dream --json $OUT/vocab-modes-arith-dream.json
vocab-modes-var	$PY bench/vocab_modes.py --task arith_var --batch-size 32 --only none heuristic hand-written calibrated --json $OUT/vocab-modes-var.json
rules-llada	$PY bench/rules.py --limit 200 --fixtures tiny-llada
rules-dream	$PY bench/rules.py --limit 200 --fixtures tiny-dream --no-switches
regime-arith-llada	$PY bench/regime_check.py --model tiny-llada --task arith --gen-length 96 --limit 8
regime-var-llada	$PY bench/regime_check.py --model tiny-llada --task arith_var --limit 8
regime-var-dream	$PY bench/regime_check.py --model tiny-dream --task arith_var --limit 8
trace-var	$PY bench/plan_case.py --model tiny-llada --task arith_var --limit 32 --out $OUT/arith_var_trace.md
sweep-arith	$PY bench/sweep.py --out $OUT/sweep-arith --threads 1
sweep-var	$PY bench/sweep.py --tasks arith_var --limit 100 --out $OUT/sweep-var --threads 1
demo	make -s demo
EOF

echo "phase 3: timing (one job at a time)"
run_jobs 1 <<EOF || failed=1
throughput-threads1	$PY bench/throughput.py --limit 100 --decoders threshold pvf --threads 1
throughput-threads2	$PY bench/throughput.py --limit 100 --decoders threshold pvf --threads 2
throughput-batch32	$PY bench/throughput.py --limit 1000 --batch-size 32 --threads 2 --decoders threshold pvf --width-reps 0
e2e	$PY bench/e2e.py --fixtures tiny-llada --limit 32 --decoders threshold pvf --caches none dual --replay llada-8b/16
EOF
echo "logs in $OUT"
exit "$failed"
