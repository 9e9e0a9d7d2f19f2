#!/usr/bin/env bash
# Mutation testing (mutmut 3, `pip install -e .[mutation]`): does the test suite fail when a line
# of the decoders, the statistics, the KV cache or the report gate is changed? Run it before
# changing a decoder; docs/testing.md has the measured scores and the accepted survivors.
#
#   scripts/mutation.sh [AREA ...]      AREA: decoding, lmeval, stats, kv, gate (default: all five)
#   FILES="pvf_lmeval/decoding/threshold.py" scripts/mutation.sh decoding     # part of an area
#   SAMPLE=12 [SEED=0] scripts/mutation.sh decoding        # a random 12% of the mutants, the
#                                                           # score with its 95% interval
#   NAMES="pvf_lmeval.decoding.eb.x_entropy_bound_select__mutmut_3" ...  # only these mutants (a sample's
#                                                           # survivors again, after new tests)
#   TEST_FILES="tests/test_decoding_threshold.py" ...      # other tests than the area's own
#   FAST_TEST_FILES=... / STAGES=full ...                   # another first stage / none
#   DESELECT="tests/test_x.py::test_slow ..." ...           # leave these tests out (default:
#                                                           # the area's LEFT_OUT list; "" for none)
#
# Two stages. Every mutant first runs the area's fast unit tests (hand-built tables, no model)
# that reach the mutated function, in the scratch copy mutation/AREA.fast/; a mutant they do not
# kill then runs the area's whole selection, fixture-model tests included, in mutation/AREA/.
# Both copies are git-ignored and keep mutmut's results, so a second run re-tests only the
# functions that changed and the callers whose results depended on them (another test
# selection makes mutmut discard every result of its copy). `-x`: the first failing test kills
# a mutant. It prints, per area, killed / mutants and the survivors;
# `cd mutation/AREA && python -m mutmut show NAME` shows one.
# Environment: PY (python, default .venv/bin/python), JOBS (parallel mutants, default 1),
# NICE (default 10).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
JOBS=${JOBS:-1}
NICE=${NICE:-10}

declare -A MUTATE TESTS FAST LEFT_OUT
MUTATE[decoding]="pvf_lmeval/decoding/*.py"
FAST[decoding]="tests/test_decoding_threshold.py tests/test_decoding_static.py
  tests/test_decoding_explore.py tests/test_decoding_freedave.py tests/test_decoding_pvf.py
  tests/test_decoding_loop.py tests/test_decoding_params.py tests/test_decoding_rules.py
  tests/test_decoding_reference_rounds.py tests/test_decoding_batch_tables.py
  tests/test_param_specs.py tests/test_verification.py tests/test_kv_cache_state.py
  tests/test_block_diffusion.py tests/test_decoding_api.py tests/test_sampling_filters.py
  tests/test_decoding_eb.py tests/test_loop_seams.py tests/test_decoding_subblock.py
  tests/test_decoding_dinfer.py tests/test_decoding_revocable.py tests/test_decoding_revocable_rules.py
  tests/test_decoding_commit_only.py tests/test_decoding_pvf_edit.py"
# the whole selection: the fast tests and those that decode with a fixture model. Not the
# torch.compile tests: every mutated function runs through a trampoline that records its hit
# in Python, where dynamo breaks the graph and recompiles past its limit (the round's
# compiled path runs the same functions as the eager tests)
TESTS[decoding]="${FAST[decoding]} tests/test_likelihood.py tests/test_calibrate.py
  tests/test_kv_cache.py tests/test_online_vocab.py tests/test_batch_invariant_option.py
  tests/test_decoding_revocable_reference.py tests/test_decoding_revocable_families.py
  tests/test_renoise.py tests/test_renoise_cache.py tests/test_cfg_scale.py
  tests/test_published_eos_switches.py"
# tests left out of an area's lists: the slowest, whose mutants the table tests reach, and
# those that run the package in a subprocess: mutmut records which tests reach a function in
# its own process only (so it never picks them for a mutant), and its trampolines in a
# subprocess that starts elsewhere cannot find their configuration (the tests fail there)
LEFT_OUT[decoding]="tests/test_decoding_rules.py::test_reference_batch_sizes_identical
  tests/test_decoding_rules.py::test_capitalised_ids_of_a_real_tokenizer
  tests/test_param_specs.py::test_a_new_decoder_is_its_step_module_and_one_registry_line"
# the adapter: settings, planner, sink, caches, presets (stats.py is its own area)
MUTATE[lmeval]="pvf_lmeval/lmeval/[!s]*.py pvf_lmeval/lmeval/settings.py pvf_lmeval/lmeval/sink.py"
FAST[lmeval]="tests/test_settings.py tests/test_param_specs.py tests/test_lm_units.py
  tests/test_stat_totals.py tests/test_batching.py tests/test_auto_batch.py tests/test_lm_batching.py
  tests/test_task_presets.py tests/test_published_settings.py tests/test_response_cache.py
  tests/test_trace.py tests/test_parallel_args.py tests/test_lm_errors.py tests/test_errors.py
  tests/test_identity.py tests/test_quiet_runs.py"
# and the runs through lm-eval made in this process
TESTS[lmeval]="${FAST[lmeval]} tests/test_likelihood.py tests/test_online_vocab.py
  tests/test_hostile_inputs.py tests/test_report_batch_identity.py tests/test_tasks_answers.py
  tests/test_lm_hflm_args.py tests/test_notices.py
  tests/test_compile.py::test_results_report_the_compile_scope_and_its_warm_up"
LEFT_OUT[lmeval]="tests/test_param_specs.py::test_a_new_decoder_is_its_step_module_and_one_registry_line
  tests/test_task_presets.py::test_the_cli_decodes_arith_var_with_the_arith_preset
  tests/test_response_cache.py::test_the_cli_stops_at_a_planted_row_in_one_line
  tests/test_lm_errors.py::test_bad_model_args_through_the_cli
  tests/test_trace.py::test_page_in_headless_chromium"
MUTATE[stats]="pvf_lmeval/lmeval/stats.py"
FAST[stats]="tests/test_stat_totals.py"
TESTS[stats]="${FAST[stats]} tests/test_lm_units.py"
MUTATE[kv]="pvf_lmeval/models/kv.py"
FAST[kv]="tests/test_kv_call_view.py tests/test_block_diffusion.py"
TESTS[kv]="${FAST[kv]} tests/test_kv_cache.py"
MUTATE[gate]="pvf_lmeval/cli/report/gate.py"
FAST[gate]="tests/test_gate_rules.py tests/test_gate_hostile.py"
TESTS[gate]="${FAST[gate]} tests/test_report.py"

areas=("$@")
[ ${#areas[@]} -gt 0 ] || areas=(decoding lmeval stats kv gate)
for area in "${areas[@]}"; do
    if [ -z "${MUTATE[$area]+x}" ]; then
        echo "mutation.sh: AREA '$area' must be one of: decoding, lmeval, stats, kv, gate" >&2
        exit 2
    fi
done
case "${STAGES:=fast,full}" in
    fast,full|full) ;;
    *) echo "mutation.sh: STAGES='$STAGES' must be one of: fast,full, full" >&2; exit 2 ;;
esac

mutmut_run() {      # in a scratch copy: mutmut run [NAME ...]
    env -u PYTHONPATH HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
        nice -n "$NICE" "$PY" -m mutmut run --max-children "$JOBS" "$@"
}

# A copy's results hold for the configuration they were made with: another set of files (mutmut
# regenerates only changed sources, so a file left out of the last run would stay unmutated) or
# another test selection starts it from scratch. Checked before its results are read too: a
# survivor of the last selection is not one of this one.
forget_if_changed() {   # forget_if_changed DIR FILES TESTS DESELECT
    local config
    config=$(echo "$2 | $3 | $4" | tr -s ' \n' ' ')
    if [ "$(cat "$1/.config" 2>/dev/null)" != "$config" ]; then
        rm -rf "$1/mutants"
        mkdir -p "$1"
        echo "$config" > "$1/.config"
    fi
}

prepare() {         # prepare DIR FILES TESTS DESELECT: a scratch copy with that configuration
    local work=$1
    mkdir -p "$work"
    # the checkout's files (tracked and untracked, not ignored), fixtures' weights included
    git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$work"
    "$PY" - "$work/pyproject.toml" "$2" "$3" "$4" <<'EOF'
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
    forget_if_changed "$@"
    # mutmut generates the mutants (and measures the tests) before it filters by name: a name
    # that matches nothing makes it stop right there, with every result of the copy current
    (cd "$work" && mutmut_run no-such-mutant > mutmut-generate.log 2>&1) || true
    grep -q "nothing matches" "$work/mutmut-generate.log" || {
        echo "mutation.sh: generating the mutants failed (log: $work/mutmut-generate.log)" >&2
        exit 1; }
}

# The mutants of $area to test (all, or the SAMPLE) from both copies' results: prints the
# names a stage still has to run (todo-fast, todo-full) or the merged score (summary).
#   select_mutants todo-fast | todo-full | summary
select_mutants() {
    "$PY" - "$ROOT/mutation" "$area" "${SAMPLE:-}" "${SEED:-0}" "$STAGES" "$1" "${NAMES:-}" <<'EOF'
import collections, hashlib, json, math, pathlib, sys
from mutmut.stats import status_by_exit_code as status_of
root, area, percent, seed, stages, what, only = sys.argv[1:]
only = set(only.split())
root = pathlib.Path(root)
def results(work):
    out = {}
    for meta in sorted((work / "mutants").rglob("*.py.meta")):
        out.update(json.loads(meta.read_text())["exit_code_by_key"])
    return out
full = results(root / area)
fast = results(root / f"{area}.fast") if stages == "fast,full" else {}
every = fast if stages == "fast,full" else full
def draw(key):        # uniform in [0, 1), fixed per (seed, mutant): runs reuse their results
    h = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2 ** 64
names = sorted(k for k in every if (not percent or draw(k) < float(percent) / 100)
               and (not only or k in only))
if only - set(every):
    sys.exit(f"mutation.sh: NAMES: no mutant {sorted(only - set(every))[0]} in {area}")
DETECTED = ("killed", "timeout", "caught by type check")
def fast_status(k):
    return status_of[fast.get(k)]
if what == "todo-fast":
    print("\n".join(k for k in names if fast.get(k) is None))
    sys.exit()
todo = [k for k in names if fast_status(k) not in DETECTED]
if what == "todo-full":
    print("\n".join(k for k in todo if full.get(k) is None))
    sys.exit()
status = {k: fast_status(k) if fast_status(k) in DETECTED else status_of[full.get(k)]
          for k in names}
count = collections.Counter(status.values())
killed = count["killed"] + count["timeout"] + count["caught by type check"]  # a hang is detected too
run = len(names) - count["not checked"]
stage = (f"; {len(names) - len(todo)} by the fast tests" if stages == "fast,full" else "")
print(f"{area}: {killed}/{run} mutants killed ({100 * killed / max(run, 1):.1f}%{stage}); "
      + ", ".join(f"{n} {s}" for s, n in sorted(count.items())))
if percent and run:
    # Wilson score interval, 95%
    z, p = 1.96, killed / run
    mid, half = p + z * z / (2 * run), z * math.sqrt(p * (1 - p) / run + z * z / (4 * run * run))
    lo, hi = (mid - half) / (1 + z * z / run), (mid + half) / (1 + z * z / run)
    print(f"  a random {percent}% of {len(every)} mutants: the area kills {100 * lo:.1f}-{100 * hi:.1f}% "
          "(95% interval)")
for k in names:
    if status[k] not in DETECTED + ("not checked",):
        print(f"  {status[k]}: {k}")
EOF
}

run_stage() {       # run_stage DIR todo-fast|todo-full: mutmut on what the stage still has to run
    local names=()
    mapfile -t names < <(select_mutants "$2")
    [ ${#names[@]} -gt 0 ] && [ -n "${names[0]}" ] || return 0
    echo "   $(basename "$1"): ${#names[@]} mutants"
    (cd "$1" && mutmut_run "${names[@]}" > mutmut-run.log 2>&1) || {
        echo "mutation.sh: mutmut failed (log: $1/mutmut-run.log)" >&2; exit 1; }
}

for area in "${areas[@]}"; do
    files=${FILES:-${MUTATE[$area]}}
    deselect=${DESELECT-${LEFT_OUT[$area]:-}}
    echo "== $area: mutating $files${SAMPLE:+ (a random $SAMPLE% of its mutants)}"
    if [ "$STAGES" = fast,full ]; then
        prepare "$ROOT/mutation/$area.fast" "$files" "${FAST_TEST_FILES:-${FAST[$area]}}" "$deselect"
        run_stage "$ROOT/mutation/$area.fast" todo-fast
    fi
    # the whole selection only for what the fast tests left (its copy measures every test once)
    forget_if_changed "$ROOT/mutation/$area" "$files" "${TEST_FILES:-${TESTS[$area]}}" "$deselect"
    if [ "$STAGES" = full ] || [ -n "$(select_mutants todo-full)" ]; then
        prepare "$ROOT/mutation/$area" "$files" "${TEST_FILES:-${TESTS[$area]}}" "$deselect"
        run_stage "$ROOT/mutation/$area" todo-full
    fi
    select_mutants summary
done
