"""The offline `arith_var` task: its data, its generator, and one run through the lm_eval CLI.

Pins: the bundled splits are what the seeded generator writes (1,000 held-out, 400 calibration
items), no question is shared between them or with the training stream, every answer is 120-250
tokens under the fixtures' tokenizer and ends with ``#### <target>``, the target is what the
question's story computes, each operation has at least four step templates with different
openings, and the lm_eval task scores exact match with the cost metrics at 256 tokens.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tasks" / "arith_var" / "data"
sys.path.insert(0, str(REPO / "scripts" / "tiny_fixtures"))

import arith_data  # noqa: E402
import arith_var_data as gen  # noqa: E402


def _read(split: str) -> list[dict]:
    with open(DATA / f"{split}.jsonl") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def length():
    pytest.importorskip("tokenizers")
    return gen.fixture_length()


def test_bundled_splits_are_the_generators(length):
    used: set[str] = set()
    for split in ("test", "calibration"):
        seed, count = gen.SPLITS[split]
        want = gen.make_split(seed, count, used, length)
        used |= {r["question"] for r in want}
        assert _read(split) == want, split
    assert len(_read("test")) == 1000 and len(_read("calibration")) == 400


def test_splits_and_training_stream_share_no_question(length):
    test = {r["question"] for r in _read("test")}
    cal = {r["question"] for r in _read("calibration")}
    assert len(test) == 1000 and len(cal) == 400 and not test & cal
    assert gen.held_out_keys(length) == test | cal
    seed = gen.SPLITS["train"][0] + 11          # the data seed of the bundled fixtures' last training stage
    train = gen.make_split(seed, 3000, test | cal, length)
    assert not {r["question"] for r in train} & (test | cal)


def _story_value(question: str) -> int:
    """Replays the question's story: the start, then each gain or loss (the other person's
    collection is an independent fact and must not count)."""
    name = question.split(" has ", 1)[0]
    value = int(re.match(rf"{name} has (\d+) ", question).group(1))
    verbs = [(q.split(" {n}")[0], sign) for q, _, sign in arith_data.GAINS + arith_data.LOSSES]
    for sentence in question.split(". "):
        for verb, sign in verbs:
            m = re.search(rf"\b(?:he|she|He|She) {verb} (\d+) ", sentence)
            if m:
                value += sign * int(m.group(1))
    return value


def test_answers_are_long_and_end_with_the_story_value(length):
    for r in _read("test") + _read("calibration"):
        assert gen.MIN_TOKENS <= length(r["answer"]) <= gen.MAX_TOKENS
        assert r["answer"].endswith(f"\n#### {r['target']}")
        assert int(r["target"]) == _story_value(r["question"]), r["question"]
        assert 1 <= int(r["target"]) <= arith_data.MAX_VALUE


def test_steps_vary_in_their_openings():
    for templates in (gen.STEP_GAIN, gen.STEP_LOSS):
        openings = {t.split()[0] for t in templates}
        assert len(openings) >= 4, openings
    answers = [r["answer"] for r in _read("test")]
    # Every template is used in the held-out set, and a solution's first line varies too.
    for t in gen.STEP_GAIN + gen.STEP_LOSS:
        head = t.split("{")[0]
        assert any(head in a for a in answers), head
    assert len({a.split()[0] for a in answers}) >= 4


def test_the_independent_fact_moves():
    places = set()
    for r in _read("test"):
        sentences = r["question"].split(". ")
        # the other person's collection: "<Name> has <n> <items>" after the first sentence
        places.add(next(i for i, s in enumerate(sentences[1:], 1)
                        if re.match(r"[A-Z][a-z]+ has \d+ ", s)))
    assert len(places) >= 3, places


def test_prompt_is_the_question_only():
    text = (REPO / "tasks" / "arith_var" / "arith_var.yaml").read_text()
    assert 'doc_to_text: "Question: {{question}}\\nAnswer:"' in text
    assert "max_gen_toks: 256" in text


def test_lm_eval_scores_exact_match_and_cost(tmp_path):
    pytest.importorskip("lm_eval")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
    bin_dir = Path(sys.executable).parent
    proc = subprocess.run(
        [str(bin_dir / "lm_eval"), "--model", "pvf-dlm",
         "--model_args", "pretrained=tiny-llada,decoder=pvf,preset=arith",
         "--include_path", str(REPO / "tasks"), "--tasks", "arith_var", "--limit", "2",
         "--output_path", str(tmp_path), "--log_samples"],
        env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (samples,) = tmp_path.glob("**/samples_arith_var_*.jsonl")
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert [r["doc"]["target"] for r in rows] == [d["target"] for d in _read("test")[:2]]
    # a deterministic run of the bundled fixture: exact outcomes. Document 0 ends its answer
    # without a number after "####" (wrong); document 1 ends with "#### 6", its target.
    assert [(r["exact_match"], r["gen_length"], r["nfe"], r["branch_rows"]) for r in rows] == [
        (0.0, 256, 31, 95), (1.0, 256, 26, 83)]
    assert rows[0]["filtered_resps"][0].endswith("In the end, Mia has 1 apples.\n####")
    assert rows[1]["filtered_resps"][0].endswith("So Max has 6 cards.\n#### 6")
    assert rows[1]["doc"]["target"] == "6"
