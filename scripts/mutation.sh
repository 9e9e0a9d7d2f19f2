#!/usr/bin/env bash
# Mutation testing (mutmut 3, `pip install -e .[mutation]`): does the test suite fail when a line
# of the decoders, the statistics, the KV cache or the report gate is changed? Run it before
# changing a decoder; docs/testing.md has the measured scores and the accepted survivors.
#
#   scripts/mutation.sh [AREA ...]      AREA: decoding, stats, kv, gate (default: all four)
#   FILES="pvf_lmeval/decoding/threshold.py" scripts/mutation.sh decoding     # part of an area
#   TEST_FILES="tests/test_decoding_threshold.py" ...      # other tests than the area's own
#   DESELECT="tests/test_x.py::test_slow ..." ...           # leave these tests out (default:
#                                                           # the area's slowest; "" for none)
#
# Each area runs in its own scratch copy of the checkout, mutation/AREA/ (git-ignored; mutmut
# keeps its results there, so a second run re-tests only what changed), against the fast tests
# of that area: every mutant runs the tests that reach the mutated function. It prints, per
# area, killed / mutants and the survivors; `cd mutation/AREA && mutmut show NAME` shows one.
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
  tests/test_batch_invariant_option.py"
# the slowest tests of that list, whose mutants the table tests reach
SLOW[decoding]="tests/test_decoding_rules.py::test_reference_batch_sizes_identical
  tests/test_decoding_rules.py::test_capitalised_ids_of_a_real_tokenizer"
MUTATE[stats]="pvf_lmeval/lmeval/stats.py"
TESTS[stats]="tests/test_lm_units.py"
MUTATE[kv]="pvf_lmeval/models/kv.py"
TESTS[kv]="tests/test_kv_cache.py"
MUTATE[gate]="pvf_lmeval/cli/report/gate.py"
TESTS[gate]="tests/test_report.py"

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
    echo "== $area: mutating ${FILES:-${MUTATE[$area]}}"
    (cd "$work" && env -u PYTHONPATH HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
        nice -n "$NICE" "$PY" -m mutmut run --max-children "$JOBS" > mutmut-run.log 2>&1) || {
        echo "mutation.sh: mutmut failed for $area (log: $work/mutmut-run.log)" >&2; exit 1; }
    (cd "$work" && "$PY" -m mutmut results --all true) | "$PY" -c '
import collections, sys
area = sys.argv[1]
rows = [line.rsplit(":", 1) for line in sys.stdin if ":" in line]
status = collections.Counter(s.strip() for _, s in rows)
killed = status["killed"] + status["timeout"]          # a mutant that hangs is detected too
run = sum(status.values()) - status["not checked"]
print(f"{area}: {killed}/{run} mutants killed ({100 * killed / max(run, 1):.1f}%); "
      + ", ".join(f"{n} {s}" for s, n in sorted(status.items())))
for name, s in rows:
    if s.strip() not in ("killed", "timeout", "not checked"):
        print(f"  {s.strip()}: {name.strip()}")
' "$area"
done
