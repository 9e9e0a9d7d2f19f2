#!/usr/bin/env bash
# The decode loop's speed on a GPU, in one command of at most 8 minutes (docs/speed.md):
#
#   part 0  the host's waits for the device (bench/host_ops.py --device cuda): synchronisations
#           CUDA reports per round, tiny-llada, threshold and pvf, cache=dual, batch 1 and 4
#   part 1  the loop on the bundled fixtures (bench/e2e.py part 1): both fixtures, held-out
#           arith_var items at gen_length 256, cache=dual, threshold and pvf, batch 1 and 16,
#           statistics pass eager and compiled: share of the wall outside model calls, host ms
#   part 2  the loop at the 8B shapes (bench/e2e.py --shadow): llada-8b and dream-7b, batch
#           1/4/16/64, pvf and threshold, cache dual and dual_base, the network compiled with
#           compile=true's scope
#
# Each part runs under its own timeout; raw output (stdout, stderr, JSON) goes to $OUT when it is
# set, else to bench/results/<UTC date>-<host>/.
#
#   bash bench/gpu_speed.sh            # on a CUDA machine
#   bash bench/gpu_speed.sh --tiny     # everything shrunk, on the CPU (checks the script runs)
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

if [ "${1:-}" = "--tiny" ]; then
    DEV=cpu LIMIT=2 PER_SIZE=2 SIZES_1="1 2" SIZES_2="1 2" SHAPES="llada-8b/16" TASK=arith TASK1=arith
    T0=300 T1=300 T1C=300 T2=300 COMPILE="" THREADS="--threads 1"
elif [ -n "${1:-}" ]; then
    echo "gpu_speed.sh: unknown argument '$1'; allowed: --tiny (or nothing)" >&2; exit 2
else
    DEV=cuda LIMIT=64 PER_SIZE=8 SIZES_1="1 16" SIZES_2="1 4 16 64" SHAPES="llada-8b dream-7b"
    TASK=arith_var TASK1=arith_var T0=30 T1=75 T1C=95 T2=135 COMPILE="--compile" THREADS=""
fi
DIR=${OUT:-bench/results/$(date -u +%Y-%m-%d)-$(hostname -s)}
mkdir -p "$DIR"
{ date -u; hostname; $PY -c 'import torch; print("torch", torch.__version__,
  torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA")'
  echo "commit ${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo 'unknown (no .git: set COMMIT)')}"
} > "$DIR/machine.txt" 2>&1
cat "$DIR/machine.txt"

run() {   # name, timeout seconds, arguments of bench/e2e.py
    local name=$1 secs=$2; shift 2
    echo "== $name (at most ${secs} s)"
    timeout "$secs" $PY bench/e2e.py "$@" --json "$DIR/$name.json" \
        > "$DIR/$name.out" 2> "$DIR/$name.err"
    local rc=$?
    [ $rc -eq 0 ] || echo "$name: exit $rc (124: timed out); see $DIR/$name.err"
    if grep -q '^Decode loop' "$DIR/$name.out"; then
        sed -n '/^Decode loop/,$p' "$DIR/$name.out"
    else                    # cut short: the rows measured so far, one JSON object each
        grep '^{' "$DIR/$name.out"
    fi
}

echo "== host-syncs (at most ${T0} s)"
timeout "$T0" $PY bench/host_ops.py --device $DEV --fixtures tiny-llada --limit 4 --caches dual \
    --batch-sizes 1 4 > "$DIR/host-syncs.out" 2> "$DIR/host-syncs.err" \
    || echo "host-syncs: exit $? (124: timed out); see $DIR/host-syncs.err"
cat "$DIR/host-syncs.out"

run loop-eager "$T1" --fixtures tiny-llada tiny-dream --task $TASK1 --limit $((LIMIT < 16 ? LIMIT : 16)) \
    --decoders threshold pvf --caches dual --batch-sizes $SIZES_1 --device $DEV $THREADS
run loop-step-compiled "$T1C" --fixtures tiny-llada tiny-dream --task $TASK1 \
    --limit $((LIMIT < 16 ? LIMIT : 16)) --decoders threshold pvf --caches dual \
    --batch-sizes $SIZES_1 --device $DEV $THREADS --compile-step
for shape in $SHAPES; do
    fixture=tiny-llada; [ "${shape%%-*}" = dream ] && fixture=tiny-dream
    run "shadow-${shape//\//-}" "$T2" --shadow "$shape" --fixtures $fixture --task $TASK \
        --limit $LIMIT --requests-per-size $PER_SIZE --decoders pvf threshold \
        --caches dual dual_base --batch-sizes $SIZES_2 --device $DEV $THREADS $COMPILE
done
echo "raw output: $DIR"
