"""Decoding traces: the JSONL record, ``pvf-trace`` (HTML and ANSI), and the page in a real
headless browser (Debian's ``chromium`` + ``chromium-driver`` through selenium).

A missing chromium, chromedriver or selenium fails the browser test (``.ci/run`` installs them);
``PVF_ALLOW_MISSING=browser`` skips it on purpose (see tests/helpers/prerequisites.py).
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from helpers.decoding_tables import RandomModel
from helpers.prerequisites import missing as missing_piece
from pvf_lmeval.cli import trace as tr
from pvf_lmeval.lmeval import trace_records
from pvf_lmeval.decoding import decode

# ------------------------------------------------------------------ a known trace

# 12 positions: base x4, plan x2, ar x3, forced x1, then 2 early-stop fill positions (None).
KNOWN_ROUTES = ["base", "plan", "ar", "ar", "ar", "forced", "base", "plan", "base", "base", None, None]
KNOWN_PIECES = ["To", " find", " the", " total", ",", " add", ":\n", "5", " +", "<|endoftext|>"]
KNOWN_STEPS = [  # 1-based step numbers: position -> step
    {"step": 0, "committed": [[0, "base"], [1, "plan"]], "nfe": 2, "branch_rows": 3,
     "made_call": True, "route": "plan", "candidates": [1, 4], "verified": [True, False]},
    {"step": 1, "committed": [[2, "ar"], [3, "ar"], [4, "ar"]], "nfe": 3, "branch_rows": 7,
     "made_call": True, "route": "ar", "candidates": [2, 3, 4], "verified": [True, True, True]},
    {"step": 2, "committed": [[5, "forced"]], "nfe": 4, "branch_rows": 8, "made_call": True,
     "route": "base"},
    {"step": 3, "committed": [[6, "base"], [7, "plan"]], "nfe": 5, "branch_rows": 10,
     "made_call": True, "route": "plan", "candidates": [7], "verified": [True]},
    {"step": 4, "committed": [[8, "base"], [9, "base"]], "nfe": 5, "branch_rows": 10,
     "made_call": False, "route": "base", "early_stop_at": 9},
]
KNOWN_STEP_OF = [1, 1, 2, 2, 2, 3, 4, 4, 5, 5, 5, 5]
# the same request decoded by threshold: 3 steps, everything base/forced
OTHER_ROUTES = ["base"] * 6 + ["forced"] + ["base"] * 3 + [None, None]
OTHER_STEPS = [
    {"step": 0, "committed": [[i, "base"] for i in range(6)], "nfe": 2, "branch_rows": 2,
     "made_call": True, "route": "base"},
    {"step": 1, "committed": [[6, "forced"]], "nfe": 3, "branch_rows": 3, "made_call": True,
     "route": "base"},
    {"step": 2, "committed": [[7, "base"], [8, "base"], [9, "base"]], "nfe": 3,
     "branch_rows": 3, "made_call": False, "route": "base", "early_stop_at": 9},
]


def known_records() -> tuple[dict, dict]:
    common = {"request": "arith/7/0", "model": "tiny-llada", "prompt_ids": [1, 2, 3],
              "prompt_text": "Question: 5 + 8?\nAnswer:", "tokens": [10 + i for i in range(10)] + [2, 2],
              "pieces": KNOWN_PIECES, "gen_tokens": 9, "gen_length": 12, "block_length": 12}
    pvf = dict(common, decoder="pvf", routes=KNOWN_ROUTES, nfe=5, n_steps=5, steps=KNOWN_STEPS)
    thr = dict(common, decoder="threshold", routes=OTHER_ROUTES, nfe=3, n_steps=3, steps=OTHER_STEPS)
    return thr, pvf


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def known_html(tmp_path) -> Path:
    thr, pvf = known_records()
    a = write_jsonl(tmp_path / "threshold.jsonl", [thr])
    b = write_jsonl(tmp_path / "pvf.jsonl", [pvf])
    out = tmp_path / "out.html"
    assert tr.main([str(a), str(b), "--html", str(out)]) == 0
    return out


# ------------------------------------------------------------------ records and rendering


def test_token_steps_and_counts_of_the_known_trace():
    _, pvf = known_records()
    assert tr.token_steps(pvf) == KNOWN_STEP_OF
    assert tr.n_steps(pvf) == 5
    assert tr.route_counts(pvf) == Counter({"base": 4, "ar": 3, "plan": 2, "forced": 1, None: 2})
    assert trace_records.shown_length(pvf["routes"]) == 10


def test_records_of_one_request_are_grouped_side_by_side(tmp_path):
    thr, pvf = known_records()
    other = dict(pvf, request="arith/8/0")
    recs = tr.load_records([write_jsonl(tmp_path / "a.jsonl", [thr, other]),
                            write_jsonl(tmp_path / "b.jsonl", [pvf])])
    groups = tr.group_records(recs)
    assert [[r["decoder"] for r in g] for g in groups] == [["threshold", "pvf"], ["pvf"]]


def test_html_is_self_contained_and_carries_routes_and_steps(known_html):
    page = known_html.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "http://" not in page and "https://" not in page and "@import" not in page
    spans = re.findall(r'<span class="tok (r-\w+)" data-pos="(\d+)" data-step="(\d+)"', page)
    pvf_spans = spans[10:]                         # threshold panel first, 10 tokens each
    assert [int(s) for _, _, s in pvf_spans] == KNOWN_STEP_OF[:10]
    assert Counter(c for c, _, _ in pvf_spans) == {"r-base": 4, "r-ar": 3, "r-plan": 2, "r-forced": 1}
    assert "[+2 end-of-text fill]" in page
    assert 'data-steps="5"' in page and 'data-steps="3"' in page
    assert "↵\n" in page                          # a newline piece stays visible


def test_ansi_colours_planning_yellow_and_ar_pink(tmp_path, capsys):
    _, pvf = known_records()
    path = write_jsonl(tmp_path / "t.jsonl", [pvf])
    assert tr.main([str(path), "--ansi", "--color=always"]) == 0
    out = capsys.readouterr().out
    assert "\x1b[48;5;227m find\x1b[0m" in out      # plan: yellow
    assert "\x1b[48;5;218m the\x1b[0m" in out       # ar: pink
    assert "arith/7/0 · pvf: 5 model calls (NFE) in 5 decode steps" in out
    assert "NFE counts model calls, the first one included" in out
    assert out.endswith("[+2 end-of-text fill]\n")


def test_plain_text_marks_the_routes_and_pipes_get_no_colour(tmp_path, capsys):
    _, pvf = known_records()
    path = write_jsonl(tmp_path / "t.jsonl", [pvf])
    assert tr.main([str(path), "--ansi"]) == 0       # capsys is not a terminal: auto = no colour
    auto = capsys.readouterr().out
    assert tr.main([str(path), "--ansi", "--no-color"]) == 0
    assert capsys.readouterr().out == auto and "\x1b[" not in auto
    assert auto.endswith("\nTo{plan: find}{ar: the total,}{forced: add}:\n"
                         "{plan:5} +<|endoftext|> [+2 end-of-text fill]\n")
    assert "routes: high-confidence (base) unmarked, {plan:...} planning" in auto


def test_color_choice():
    class Tty:
        def isatty(self):
            return True

    assert tr.use_color("auto", Tty()) is True and tr.use_color("never", Tty()) is False
    assert tr.use_color("auto", object()) is False and tr.use_color("always", object()) is True


def test_bad_trace_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"request": "x"}\n')
    assert tr.main([str(bad), "--ansi"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "bad.jsonl:1" in err


class _FakeTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(f" w{t}" for t in ids)


def test_record_from_a_real_decode_matches_its_counts(tmp_path):
    m = RandomModel(4, jitter=1.0, eos_bias=-1.0)
    r = decode(m, [5, 6, 7], "pvf", gen_length=32, block_length=16, trace=True,
               plan_vocab=set(range(1, 23)))
    rec = trace_records.trace_record(r, request="t/0/0", prompt_ids=[5, 6, 7], tokenizer=_FakeTokenizer(),
                          model="random", block_length=16)
    assert r.tokens_plan and r.tokens_ar and r.tokens_base      # the record exercises 3 routes
    rec = json.loads(json.dumps(rec))                           # survives JSON
    counts = tr.route_counts(rec)
    assert (counts["base"], counts["plan"], counts["ar"], counts["forced"]) == \
        (r.tokens_base, r.tokens_plan, r.tokens_ar, r.tokens_forced)
    steps = tr.token_steps(rec)
    assert all(s is not None for s in steps) and max(steps) == len(r.steps) == rec["n_steps"]
    assert rec["pieces"][0] == f" w{r.tokens[0]}" and len(rec["pieces"]) == trace_records.shown_length(r.routes)
    assert len(json.dumps(rec)) < 8000                          # no logits: a few kB


def test_adapter_writes_pieces_that_the_renderer_reads(tmp_path):
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance
    from test_models_oracle import make_temp_checkpoint

    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    ckpt = make_temp_checkpoint(tmp_path / "ckpt", "llada")
    path = tmp_path / "trace.jsonl"
    lm = PVFDiffusionLM(pretrained=str(ckpt), device="cpu", decoder="pvf", gen_length=16,
                        block_length=8, trace=str(path), vocab="none")
    inst = Instance(request_type="generate_until", doc={}, arguments=("Question: 1 + 2?\nAnswer:",
                    {"until": ["Question:"]}), idx=0, metadata=("arith", 3, 1))
    lm.generate_until([inst], disable_tqdm=True)
    (rec,) = tr.load_records([path])
    assert rec["request"] == "arith/3/0" and rec["decoder"] == "pvf"
    n = trace_records.shown_length(rec["routes"])
    assert len(rec["pieces"]) == n and rec["pieces"] == [lm.tokenizer.decode([t]) for t in rec["tokens"][:n]]
    assert rec["prompt_text"].endswith("Answer:") and rec["steps"] and "nfe" in rec["steps"][0]
    assert "logits" not in json.dumps(rec)


# ------------------------------------------------------------------ the page in a real browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def _browser():
    missing = [n for n, ok in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)) if not ok]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium")
    if missing:
        msg = (f"headless browser test needs {', '.join(missing)} "
               "(apt-get install -y chromium chromium-driver; pip install selenium)")
        missing_piece("browser", msg)
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-extensions", "--no-first-run", "--window-size=1400,1000"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def _hex_rgb(color: str) -> str:
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


COUNT_BY_COLOUR = """
const panels = [...document.querySelectorAll('.panel')];
return panels.map(p => {
  const c = {};
  p.querySelectorAll('.canvas .tok').forEach(t => {
    if (t.classList.contains('masked')) { c.masked = (c.masked || 0) + 1; return; }
    const bg = getComputedStyle(t).backgroundColor;
    c[bg] = (c[bg] || 0) + 1;
  });
  const shown = {};
  p.querySelectorAll('.counts .cnt').forEach(e => { shown[e.dataset.route] = e.textContent; });
  return {decoder: p.dataset.decoder, header: p.querySelector('h3').textContent, counts: c,
          shown: shown};
});
"""


def test_page_in_headless_chromium(known_html):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver = _browser()
    try:
        driver.get(known_html.as_uri())
        assert driver.title == "pvf-trace"
        panels = driver.execute_script(COUNT_BY_COLOUR)
        assert [p["decoder"] for p in panels] == ["threshold", "pvf"]
        colour = {r: _hex_rgb(tr.ROUTE_STYLE[r][1]) for r in ("base", "plan", "ar", "forced")}
        assert panels[1]["counts"] == {colour["base"]: 4, colour["plan"]: 2, colour["ar"]: 3,
                                       colour["forced"]: 1}
        assert panels[0]["counts"] == {colour["base"]: 9, colour["forced"]: 1}
        assert colour["plan"] == "rgb(255, 228, 92)"              # yellow
        assert "5 steps" in panels[1]["header"] and "3 steps" in panels[0]["header"]

        # hover: the step number is in the token's title
        tok = driver.find_elements(By.CSS_SELECTOR, '.panel[data-decoder="pvf"] .canvas .tok')[7]
        assert tok.text == "5" and "step 4" in tok.get_attribute("title")
        assert "plan" in tok.get_attribute("title")

        # the slider replays the canvas: Home = empty, two steps right = steps 1..2 filled
        slider = driver.find_element(By.CSS_SELECTOR, "input.slider")
        assert slider.get_attribute("value") == "5" and slider.get_attribute("max") == "5"
        slider.click()
        slider.send_keys(Keys.HOME)
        assert slider.get_attribute("value") == "0"
        panels = driver.execute_script(COUNT_BY_COLOUR)
        assert panels[1]["counts"] == {"masked": 10} and panels[0]["counts"] == {"masked": 10}
        assert set(panels[1]["shown"].values()) == {"0"}       # the route counts follow the slider
        slider.send_keys(Keys.ARROW_RIGHT, Keys.ARROW_RIGHT)
        assert slider.get_attribute("value") == "2"
        panels = driver.execute_script(COUNT_BY_COLOUR)
        # pvf: steps 1-2 filled positions 0-4 (base, plan, ar x3); threshold: 0-6
        assert panels[1]["counts"] == {colour["base"]: 1, colour["plan"]: 1, colour["ar"]: 3,
                                       "masked": 5}
        assert panels[0]["counts"] == {colour["base"]: 6, colour["forced"]: 1, "masked": 3}
        assert panels[1]["shown"] == {"base": "1", "plan": "1", "ar": "3", "forced": "0", "fill": "0"}
        assert panels[0]["shown"] == {"base": "6", "forced": "1", "fill": "0"}
        now = driver.find_elements(By.CSS_SELECTOR, ".panel .stepnow")
        assert [e.text for e in now] == ["2", "2"]
        slider.send_keys(Keys.END)
        panels = driver.execute_script(COUNT_BY_COLOUR)
        assert panels[1]["counts"].get("masked") is None
        assert panels[1]["shown"] == {"base": "4", "plan": "2", "ar": "3", "forced": "1", "fill": "2"}
        assert [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".panel .stepnow")] == ["3", "5"]
    finally:
        driver.quit()
