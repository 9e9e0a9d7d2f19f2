#!/usr/bin/env bash
# Mutation testing (mutmut 3, `pip install -e .[mutation]`): does the test suite fail when a line
# of the decoders, the statistics, the KV cache or the report gate is changed? Run it before
# changing a decoder; docs/testing.md has the measured scores and the accepted survivors.
#
#   scripts/mutation.sh [AREA ...]      AREA: decoding, stats, kv, gate (default: all four)
#   FILES="pvf_lmeval/decoding/threshold.py" scripts/mutation.sh decoding     # part of an area
#   TEST_FILES="tests/test_decoding_threshold.py" ...      # other tests than the area's own
#   SAMPLE=12 [SEED=0] scripts/mutation.sh decoding        # a random 12% of the mutants, the
#                                                           # score with its 95% interval
#   DESELECT="tests/test_x.py::test_slow ..." ...           # leave these tests out (default:
#                                                           # the area's slowest; "" for none)
#
# Each area runs in its own scratch copy of the checkout, mutation/AREA/ (git-ignored; mutmut
# keeps its results there, so a second run re-tests only the functions that changed and the
# callers whose results depended on them), against the tests of that area: every mutant runs
# the tests that reach the mutated function. Another test selection (TEST_FILES, DESELECT)
# makes mutmut discard every result of the copy. It prints, per area, killed / mutants and the
# survivors; `cd mutation/AREA && python -m mutmut show NAME` shows one.
# Environment: PY (python, default .venv/bin/python), JOBS (parallel mutants, default 1),
# NICE (default 10).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
JOBS=${JOBS:-1}
NICE=${NICE:-10}

declare -A MUTATE TESTS SLOW
MUTATE[decoding]="pvf_lmeval/decoding/*.py"
TESTS[decoding]="tests/test_decoding_threshold.py tests/test_decoding_static.py
  tests/test_decoding_explore.py tests/test_decoding_freedave.py tests/test_decoding_pvf.py
  tests/test_decoding_loop.py tests/test_decoding_params.py tests/test_decoding_rules.py
  tests/test_decoding_reference_rounds.py tests/test_decoding_batch_tables.py
  tests/test_decoder_names.py tests/test_verification.py tests/test_decoding_api.py
  tests/test_likelihood.py tests/test_calibrate.py tests/test_kv_cache.py
  tests/test_kv_cache_state.py tests/test_block_diffusion.py tests/test_online_vocab.py
  tests/test_batch_invariant_option.py tests/test_compiled_step.py"
# the slowest tests of that list, whose mutants the table tests reach
SLOW[decoding]="tests/test_decoding_rules.py::test_reference_batch_sizes_identical
  tests/test_decoding_rules.py::test_capitalised_ids_of_a_real_tokenizer"
MUTATE[stats]="pvf_lmeval/lmeval/stats.py"
TESTS[stats]="tests/test_stat_totals.py tests/test_lm_units.py"
MUTATE[kv]="pvf_lmeval/models/kv.py"
TESTS[kv]="tests/test_kv_call_view.py tests/test_kv_cache.py tests/test_block_diffusion.py"
MUTATE[gate]="pvf_lmeval/cli/report/gate.py"
TESTS[gate]="tests/test_gate_rules.py tests/test_report.py"

mutmut_run() {      # in an area's scratch copy: mutmut run [NAME ...]
    env -u PYTHONPATH HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
        nice -n "$NICE" "$PY" -m mutmut run --max-children "$JOBS" "$@"
}

areas=("$@")
[ ${#areas[@]} -gt 0 ] || areas=(decoding stats kv gate)
for area in "${areas[@]}"; do
    if [ -z "${MUTATE[$area]+x}" ]; then
        echo "mutation.sh: AREA '$area' must be one of: decoding, stats, kv, gate" >&2
        exit 2
    fi
done

for area in "${areas[@]}"; do
    work=$ROOT/mutation/$area
    mkdir -p "$work"
    # the checkout's files (tracked and untracked, not ignored), fixtures' weights included
    git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$work"
    "$PY" - "$work/pyproject.toml" "${FILES:-${MUTATE[$area]}}" "${TEST_FILES:-${TESTS[$area]}}" \
        "${DESELECT-${SLOW[$area]:-}}" <<'EOF'
import re, sys
path, mutate, tests, deselect = (sys.argv[1], sys.argv[2].split(), sys.argv[3].split(),
                                 sys.argv[4].split())
text = open(path).read()
args = ["-p", "no:cacheprovider", "-p", "no:timeout"] + [a for d in deselect for a in ("--deselect", d)]
for key, values in (("only_mutate", mutate), ("pytest_add_cli_args_test_selection", tests),
                    ("pytest_add_cli_args", args)):
    text, n = re.subn(rf"^{key} = \[.*?\]\n", f"{key} = {values!r}\n".replace("'", '"'),
                      text, count=1, flags=re.S | re.M)
    assert n == 1, key
open(path, "w").write(text)
EOF
    # mutmut regenerates only changed sources: a file left out of the last run would stay
    # unmutated, so another set of files starts from scratch
    if [ "$(cat "$work/.mutated" 2>/dev/null)" != "${FILES:-${MUTATE[$area]}}" ]; then
        rm -rf "$work/mutants"
        echo "${FILES:-${MUTATE[$area]}}" > "$work/.mutated"
    fi
    echo "== $area: mutating ${FILES:-${MUTATE[$area]}}${SAMPLE:+ (a random $SAMPLE% of its mutants)}"
    names=()
    rm -f "$work/sample.txt"
    if [ -n "${SAMPLE:-}" ]; then
        # mutmut generates the mutants (and measures the tests) before it filters by name: a
        # name that matches nothing makes it stop right there
        (cd "$work" && mutmut_run no-such-mutant > mutmut-generate.log 2>&1) || true
        grep -q "nothing matches" "$work/mutmut-generate.log" || {
            echo "mutation.sh: generating the mutants failed (log: $work/mutmut-generate.log)" >&2
            exit 1; }
        # uniform over the area's mutants, seeded; the file lists them all, the run only
        # those without a result for the current source
        mapfile -t names < <("$PY" - "$work" "$SAMPLE" "${SEED:-0}" <<'EOF'
import hashlib, json, pathlib, sys
work, percent, seed = pathlib.Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
results = {}
for meta in sorted((work / "mutants").rglob("*.py.meta")):
    results.update(json.loads(meta.read_text())["exit_code_by_key"])
def draw(key):        # uniform in [0, 1), fixed per (seed, mutant): runs reuse their results
    h = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2 ** 64
sample = sorted(k for k in results if draw(k) < percent / 100)
(work / "sample.txt").write_text("".join(k + "\n" for k in sample))
print("\n".join(k for k in sample if results[k] is None))
EOF
        )
        [ ${#names[@]} -gt 0 ] && [ -n "${names[0]}" ] || names=()
    fi
    if [ -z "${SAMPLE:-}" ] || [ ${#names[@]} -gt 0 ]; then
        (cd "$work" && mutmut_run "${names[@]}" > mutmut-run.log 2>&1) || {
            echo "mutation.sh: mutmut failed for $area (log: $work/mutmut-run.log)" >&2; exit 1; }
    fi
    (cd "$work" && "$PY" -m mutmut results --all true) | "$PY" -c '
import collections, math, pathlib, sys
area, sample_file = sys.argv[1], pathlib.Path(sys.argv[2])
rows = [[x.strip() for x in line.rsplit(":", 1)] for line in sys.stdin if ":" in line]
if sample_file.exists():
    sample = set(sample_file.read_text().split())
    rows = [(name, s) for name, s in rows if name in sample]
status = collections.Counter(s for _, s in rows)
killed = status["killed"] + status["timeout"]          # a mutant that hangs is detected too
run = sum(status.values()) - status["not checked"]
print(f"{area}: {killed}/{run} mutants killed ({100 * killed / max(run, 1):.1f}%); "
      + ", ".join(f"{n} {s}" for s, n in sorted(status.items())))
if sample_file.exists() and run:
    # Wilson score interval, 95%
    z, p = 1.96, killed / run
    mid, half = p + z * z / (2 * run), z * math.sqrt(p * (1 - p) / run + z * z / (4 * run * run))
    lo, hi = (mid - half) / (1 + z * z / run), (mid + half) / (1 + z * z / run)
    print(f"  a random sample: the area kills {100 * lo:.1f}-{100 * hi:.1f}% (95% interval)")
for name, s in rows:
    if s not in ("killed", "timeout", "not checked"):
        print(f"  {s}: {name}")
' "$area" "$work/sample.txt"
done
