"""The published settings (``pvf_lmeval/lmeval/published.py``): per row, the prompts lm-eval
builds for its command are the bytes the published script builds on the same items, its
decoding settings are the script's, and its answer extraction / HumanEval program equal the
published functions' outputs.

Expected values come from running the published code (LLaDA's OpenCompass configs and
``eval_llada.py``, Fast-dLLM's ``eval_llada.py``, the PVF authors' dataset adapters) outside the
repository on the items of ``tests/data/published/items.json``; see that folder's README.md.
The likelihood rows' requests are checked in ``test_published_likelihood_prompts.py``.
"""

from __future__ import annotations

import functools
import gzip
import json
import shlex
from pathlib import Path

import pytest

from helpers.prerequisites import family_tier, require_math_extra
from pvf_lmeval.lmeval import published_answers as pa
from pvf_lmeval.lmeval.published import (DREAM_INSTRUCT, LLADA_15, markdown_table,
                                          published, published_rows)

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data" / "published"
ITEMS, PROMPTS, SETTINGS, ANSWERS, TEMPLATES = (
    json.loads((DATA / f"{name}.json").read_text())
    for name in ("items", "prompts", "settings", "answers", "chat_templates"))

#: each row -> the published script's row whose prompts it must reproduce (prompts.json)
SCRIPT_ROW = {
    "llada-instruct-gsm8k-256-8": "llada_instruct_gsm8k_len256_blk8",
    "llada-instruct-gsm8k-pure": "llada_instruct_gsm8k_len512_blk512_conf",
    "llada-instruct-humaneval-pure": "llada_instruct_humaneval_len512_blk512_logits",
    "llada-instruct-math-512-64": "llada_instruct_math_len512_blk64",
    "llada-instruct-math-pure": "llada_instruct_math_len512_blk512_conf",
    **{f"llada-base-gsm8k-{n}": "llada_base_lmeval_gsm8k" for n in (256, 512, 1024)},
    **{f"llada-base-humaneval-{n}": "llada_base_lmeval_humaneval" for n in (256, 512, 1024)},
    **{f"llada-base-math-{n}": "llada_base_lmeval_minerva_math" for n in (256, 512, 1024)},
    **{f"llada-base-bbh-{n}": "llada_base_lmeval_bbh" for n in (256, 512, 1024)},
    **{f"llada-base-oc-{b}-256": f"llada_base_oc_{b}_len256" for b in ("gsm8k", "math", "humaneval")},
    "llada-instruct-mmlu-pro-pure": "llada_instruct_mmlu_pro_len256",
    "llada-instruct-arc-c-pure": "llada_instruct_arc_c_len512",
    "llada-instruct-mmlu-3": "llada_instruct_mmlu_len3",
    "llada-instruct-hellaswag-3": "llada_instruct_hellaswag_len3",
    "llada-instruct-gpqa-pure": "llada_instruct_gpqa_len64",
    "llada-base-oc-bbh-256": "llada_base_oc_bbh_len256",
    "llada-instruct-mbpp-pure": "llada_instruct_mbpp_len256_conf",
    "llada-base-oc-mbpp-256": "llada_base_oc_mbpp_len256",
    "llada15-mbpp-512-32": "llada15_mbpp_len512_blk32_conf",
    **{f"llada-base-mbpp-{n}": "llada_base_lmeval_mbpp" for n in (256, 512, 1024)},
    **{f"fastdllm-{b}-{n}-{c}": f"fastdllm_{b}_len{n}" for b in ("gsm8k", "humaneval")
       for n in (256, 512)
       for c in ("baseline", "cache", "parallel", "cache-parallel", "dual-parallel")},
    **{f"pvf-paper-{m}-{b}-{d}": f"pvf_paper_{m}_{b}" for m in ("llada", "dream")
       for b in ("gsm8k", "humaneval", "math", "mmlu_pro")
       for d in ("static", "fastdllm", "freedave", "pvf")},
}

#: LLaDA 1.5's rows (EVAL.md's LLaDA 1.5 table) -> the examples/llada_1p5_gen_*.py rows
LLADA15_SCRIPT_ROW = {
    "llada15-gsm8k-256-16": "llada15_gsm8k_len256_blk16_conf",
    "llada15-math-1024-128": "llada15_math_len1024_blk128_conf",
    "llada15-gpqa-256-16": "llada15_gpqa_len256_blk16",
    "llada15-humaneval-512-32": "llada15_humaneval_len512_blk32_conf",
    "llada15-ifeval-256-16": "llada15_ifeval_len256_blk16_conf",
}
SCRIPT_ROW.update(LLADA15_SCRIPT_ROW)


#: the bundled variant that stands for a command's lm-eval task (tasks/gpqa_llada/)
SCRIPT_TASK = {"gpqa_main_n_shot_llada": "gpqa_main_n_shot"}
#: the likelihood rows -> their command in LLaDA's eval_llada_lm_eval.sh (by its --tasks)
LIKELIHOOD_ROW = {name: SCRIPT_TASK.get(row.task, row.task) for name, row in published_rows().items()
                  if "mc_num" in row.decoding}


def test_every_row_is_checked_against_a_script():
    assert sorted([*SCRIPT_ROW, *LIKELIHOOD_ROW]) == sorted(published_rows())
    assert not set(SCRIPT_ROW) & set(LIKELIHOOD_ROW)


# ----------------------------------------------------------------------------- prompts


def _template_family(row) -> str | None:
    """The chat template a row's prompts are rendered with (chat_templates.json), None without."""
    if row.chat == "none":
        return None
    return {LLADA_15: "llada15", DREAM_INSTRUCT: "dream"}.get(row.model, "llada")


def _tokenizer(family: str):
    """A tokenizer carrying the published chat template and special tokens (ids are a stub)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    spec = dict(TEMPLATES[family])
    template = spec.pop("template")
    vocab = {"[UNK]": 0, **{t: i + 1 for i, t in enumerate(sorted(set(spec.values())))}}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="[UNK]")),
                                  unk_token="[UNK]", **spec)
    tok.chat_template = template
    return tok


class PromptRecorder:
    """An lm-eval model that records each generation context and answers "": the chat history
    is rendered by pvf-dlm's own renderer (``planner.Prompts``) on the published template."""

    def __new__(cls, family: str | None):
        from lm_eval.api.model import LM

        from pvf_lmeval.lmeval.planner import Prompts

        class Recorder(LM):
            def __init__(self):
                super().__init__()
                self.contexts = []
                self.prompts = Prompts(_tokenizer(family or "llada"), family or "none", None,
                                       lambda _: None)

            @property
            def tokenizer_name(self) -> str:
                return f"published-{family}"

            def chat_template(self, chat_template=False):
                return self.prompts.chat_template(chat_template)

            def apply_chat_template(self, chat_history, add_generation_prompt=True):
                return self.prompts.render(chat_history, add_generation_prompt)

            def generate_until(self, requests, disable_tqdm=False):
                self.contexts += [r.args[0] for r in requests]
                return [""] * len(requests)

            def loglikelihood(self, requests, disable_tqdm=False):
                raise NotImplementedError

            def loglikelihood_rolling(self, requests, disable_tqdm=False):
                raise NotImplementedError

        return Recorder()


def _cli_flags(row) -> dict:
    """simple_evaluate's arguments as lm-eval's CLI sets them from the row's command."""
    argv = shlex.split(row.command().replace('"$(pvf-tasks-path)"', "TASKS"))
    out = {"tasks": [argv[argv.index("--tasks") + 1]],
           "num_fewshot": int(argv[argv.index("--num_fewshot") + 1]),
           "apply_chat_template": "--apply_chat_template" in argv,
           "confirm_run_unsafe_code": "--confirm_run_unsafe_code" in argv}
    if "--fewshot_as_multiturn" in argv:
        out["fewshot_as_multiturn"] = argv[argv.index("--fewshot_as_multiturn") + 1] != "false"
    else:   # lm-eval 0.4.13's CLI: on with --apply_chat_template unless turned off
        out["fewshot_as_multiturn"] = out["apply_chat_template"]
    return out


@pytest.fixture
def local_items(tmp_path, monkeypatch):
    """The tiny items as the pvf-data copies the bundled tasks read offline; MMLU-Pro's (no
    offline copy exists) as the hub's ``load_dataset`` would return them."""
    import datasets
    import lm_eval.evaluator

    import pvf_lmeval.data as data

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("PVF_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(data, "dataset_file", functools.partial(data.dataset_file, verify=False))
    for name, key in (("gsm8k_test", "gsm8k_test"), ("gsm8k_train", "gsm8k_train"),
                      ("humaneval", "humaneval"), ("math_test", "math_test")):
        path = tmp_path / data.DATASETS[name].path
        path.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps(d) + "\n" for d in ITEMS[key])
        if path.suffix == ".gz":
            with gzip.open(path, "wt", encoding="utf-8") as f:
                f.write(text)
        else:
            path.write_text(text)
    hub = datasets.load_dataset
    # the results' environment report runs torch's collect_env (seconds of subprocesses)
    monkeypatch.setattr(lm_eval.evaluator, "add_env_info", lambda results: None)

    def load_dataset(path=None, *args, **kwargs):
        if path == "TIGER-Lab/MMLU-Pro":
            items = datasets.Dataset.from_list(ITEMS["mmlu_pro_test"])
            return datasets.DatasetDict({"test": items})
        if path == "allenai/ai2_arc" and kwargs.get("name", args[0] if args else None) == "ARC-Challenge":
            items = datasets.Dataset.from_list(ITEMS["arc_challenge_validation"])
            return datasets.DatasetDict({"validation": items})
        if path == "Idavidrein/gpqa" and kwargs.get("name", args[0] if args else None) == "gpqa_diamond":
            return datasets.DatasetDict({"train": datasets.Dataset.from_list(ITEMS["gpqa_diamond_train"])})
        if path == "SaylorTwift/bbh" and kwargs.get("split") == "test":
            name = kwargs.get("name", args[0] if args else None)
            docs = [{k: d[k] for k in ("input", "target")} for d in ITEMS["bbh_test"]
                    if d["subtask"] == name]
            return datasets.Dataset.from_list(docs)
        if path == "google/IFEval":
            return datasets.DatasetDict({"train": datasets.Dataset.from_list(ITEMS["ifeval_train"])})
        if path == "google-research-datasets/mbpp" and \
                kwargs.get("name", args[0] if args else None) == "full":
            return datasets.DatasetDict({"test": datasets.Dataset.from_list(ITEMS["mbpp_test"])})
        if path == "Rowan/hellaswag":
            items = datasets.Dataset.from_list(ITEMS["hellaswag_validation"])
            return datasets.DatasetDict({"validation": items})
        if path == "cais/mmlu" and kwargs.get("name", args[0] if args else None) == "all":
            return datasets.DatasetDict({split: datasets.Dataset.from_list(ITEMS[f"mmlu_{split}"])
                                         for split in ("test", "dev")})
        return hub(path, *args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    _no_nltk_downloads(monkeypatch)


def _no_nltk_downloads(monkeypatch):
    """lm-eval's IFEval checkers fetch nltk's punkt_tab when they are first imported: never
    from a test (the corpus avoids the two checkers that need it)."""
    import importlib.util

    if importlib.util.find_spec("nltk") is not None:
        import nltk

        monkeypatch.setattr(nltk, "download", lambda *args, **kwargs: False)


def _contexts(row, family: str | None = None) -> list[str]:
    """The contexts lm-eval builds for the row's command, rendered with the row's chat template
    (``family``: another of chat_templates.json's)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    lm = PromptRecorder(family or _template_family(row))
    lm_eval.simple_evaluate(model=lm, task_manager=TaskManager(include_path=str(REPO / "tasks"),
                                                               include_defaults=False),
                            predict_only=True, random_seed=0, numpy_random_seed=1234,
                            torch_random_seed=1234, fewshot_random_seed=1234, **_cli_flags(row))
    return lm.contexts


def _prompt_setting(name: str) -> tuple:
    """What decides a row's prompts: its script row, the lm-eval flags of its command (task,
    few-shot count, chat form) and the chat template's family; not its decoding."""
    row = published(name)
    flags = {k: tuple(v) if isinstance(v, list) else v for k, v in _cli_flags(row).items()}
    return SCRIPT_ROW[name], tuple(sorted(flags.items())), _template_family(row)


#: one prompt check per distinct prompt setting (the rows of a script row that differ only in
#: decoding share it): {first row: every row with its setting}
PROMPT_GROUPS: dict[str, list[str]] = {}
for _name in SCRIPT_ROW:
    _first = next((k for k in PROMPT_GROUPS if _prompt_setting(k) == _prompt_setting(_name)), _name)
    PROMPT_GROUPS.setdefault(_first, []).append(_name)

#: how the PVF authors' rows name an item (prompts.json "item"; they shuffle the items), by
#: item set; the other scripts' rows name it by its index
PVF_ITEM_KEY = {"humaneval": lambda i, d: d["task_id"],
                "mmlu_pro_test": lambda i, d: d["question_id"],
                "gsm8k_test": lambda i, d: i, "math_test": lambda i, d: i}


#: the items a script keeps of an item set (OpenCompass's ARCDataset: four choices only), and
#: how its rows name them (prompts.json "item")
KEPT = {"arc_challenge_validation": lambda d: len(d["choices"]["text"]) == 4}
ITEM_NAME = {"arc_challenge_validation": lambda i, d: d["id"],
             "mbpp_test": lambda i, d: d["task_id"]}
#: a group's requests come subtask by subtask in the group's order (bbh_llada: 0.4.8's bbh,
#: alphabetical), each subtask's items in their order: (index, item) pairs in that order
GROUP_ORDER = {"bbh_llada": lambda pairs: sorted(pairs, key=lambda p: p[1]["subtask"])}


def _items_of(row) -> str:
    if row.task.startswith("mbpp"):
        return "mbpp_test"
    if row.code:
        return "humaneval"
    if "arc_challenge" in row.task:
        return "arc_challenge_validation"
    if row.task.startswith("mmlu_llada"):
        return "mmlu_test"
    if row.task.startswith("hellaswag"):
        return "hellaswag_validation"
    if row.task.startswith("gpqa_diamond"):
        return "gpqa_diamond_train"
    if row.task.startswith("bbh_llada"):
        return "bbh_test"
    if row.task.startswith("ifeval"):
        return "ifeval_train"
    if "mmlu_pro" in row.task:
        return "mmlu_pro_test"
    return "math_test" if "math" in row.task else "gsm8k_test"


def test_rows_sharing_a_script_row_share_their_prompt_setting():
    """Every row of a script row is covered by one prompt check (its group)."""
    assert sorted(n for group in PROMPT_GROUPS.values() for n in group) == sorted(SCRIPT_ROW)
    for first, group in PROMPT_GROUPS.items():
        assert {_prompt_setting(n) for n in group} == {_prompt_setting(first)}
    assert len(PROMPT_GROUPS) == len({SCRIPT_ROW[n] for n in SCRIPT_ROW})


@pytest.mark.parametrize("name", list(PROMPT_GROUPS))
def test_prompts_are_the_published_scripts_bytes(name, local_items):
    row = published(name)
    if row.task == "ifeval_llada_oc":
        _require_ifeval_extra()
    want = PROMPTS[SCRIPT_ROW[name]]
    items = _items_of(row)
    key = PVF_ITEM_KEY[items] if name.startswith("pvf-paper") else ITEM_NAME.get(items, lambda i, d: i)
    docs = [d for d in ITEMS[items] if KEPT.get(items, lambda d: True)(d)]
    contexts = _contexts(row)
    pairs = GROUP_ORDER.get(row.task, list)(list(enumerate(docs)))
    by_item = {key(i, d): g for (i, d), g in zip(pairs, contexts)}
    assert len(contexts) == len(by_item) == len(want) == len(docs)
    for w in want:       # the published order (the PVF authors shuffle) read by item
        assert by_item[w["item"]] == w["prompt"], (name, w["item"])


def test_the_other_fewshot_form_breaks_fastdllms_prompt(local_items):
    """Fast-dLLM's one user turn is what ``--fewshot_as_multiturn false`` gives; lm-eval
    0.4.13's default (multi-turn) builds another prompt."""
    import dataclasses

    row = dataclasses.replace(published("fastdllm-gsm8k-256-baseline"), chat="multi_turn")
    want = [w["prompt"] for w in PROMPTS["fastdllm_gsm8k_len256"]]
    assert all(g != w for g, w in zip(_contexts(row), want))


def test_llada15_rows_are_the_llada15_configs():
    """Each LLaDA 1.5 row's script row is its examples/llada_1p5_gen_*.py config, whose model
    is GSAI-ML/LLaDA-1.5 (opencompass/configs/models/dllm/llada_15_instruct_8b.py), with the
    Instruct rows' dataset configs: the same prompts as the Instruct row of each dataset."""
    instruct = {"gsm8k": "llada_instruct_gsm8k_len256_blk8", "math": "llada_instruct_math_len512_blk64",
                "gpqa": "llada_instruct_gpqa_len64",
                "humaneval": "llada_instruct_humaneval_len512_blk512_logits"}
    for name, script in LLADA15_SCRIPT_ROW.items():
        row, setting = published(name), SETTINGS[script]
        bench = name.split("-")[1]
        assert setting["model"] == {"path": LLADA_15, "abbr": "llada-1.5-8b-instruct"} and row.model == LLADA_15
        assert setting["config"].startswith(f"opencompass/examples/llada_1p5_gen_{bench}_length")
        if bench == "ifeval":           # no Instruct row
            continue
        assert row.task == published({"gsm8k": "llada-instruct-gsm8k-256-8", "math": "llada-instruct-math-512-64",
                                      "gpqa": "llada-instruct-gpqa-pure",
                                      "humaneval": "llada-instruct-humaneval-pure"}[bench]).task
        theirs = {p["item"]: p["prompt"] for p in PROMPTS[instruct[bench]]}
        assert [p["prompt"] for p in PROMPTS[script]] == [theirs[p["item"]] for p in PROMPTS[script]]


@pytest.mark.parametrize("name", list(LLADA15_SCRIPT_ROW))
def test_llada15_prompts_do_not_depend_on_which_llada_template(name, local_items):
    """LLaDA-1.5's chat template was read from a public copy (chat_templates.json llada15): it
    differs from LLaDA-8B-Instruct's, yet renders these rows' turns (user and assistant, then
    the generation prompt) to the same bytes, so the rows' prompts are the script's under
    either."""
    copy, instruct = TEMPLATES["llada15"]["template"], TEMPLATES["llada"]["template"]
    assert copy != instruct
    assert _contexts(published(name), "llada") == [w["prompt"] for w in PROMPTS[SCRIPT_ROW[name]]]


# ----------------------------------------------------------------------------- settings

#: each row's decoding, written from the published sources (not read from the code)
EXPECTED = {
    "llada-instruct-gsm8k-256-8": "decoder=static,gen_length=256,block_length=8,steps=256",
    "llada-instruct-gsm8k-pure": "decoder=static,gen_length=512,block_length=512,steps=512,"
                                 "confidence_eos_eot_inf=true",
    "llada-instruct-humaneval-pure": "decoder=static,gen_length=512,block_length=512,steps=512,"
                                     "logits_eos_inf=true",
    "llada-instruct-math-512-64": "decoder=static,gen_length=512,block_length=64,steps=512",
    "llada-instruct-math-pure": "decoder=static,gen_length=512,block_length=512,steps=512,"
                                "confidence_eos_eot_inf=true",
    "llada-instruct-mmlu-pro-pure": "decoder=static,gen_length=256,block_length=256,steps=256",
    "llada-instruct-arc-c-pure": "decoder=static,gen_length=512,block_length=512,steps=512",
    "llada-instruct-mmlu-3": "decoder=static,gen_length=3,block_length=3,steps=3",
    "llada-instruct-hellaswag-3": "decoder=static,gen_length=3,block_length=3,steps=3",
    "llada-instruct-gpqa-pure": "decoder=static,gen_length=64,block_length=64,steps=64,"
                                "confidence_eos_eot_inf=true",
    "llada-instruct-mbpp-pure": "decoder=static,gen_length=256,block_length=256,steps=256,"
                                "confidence_eos_eot_inf=true",
    "llada-base-oc-mbpp-256": "decoder=static,gen_length=256,block_length=256,steps=256",
    "llada15-mbpp-512-32": "decoder=static,gen_length=512,block_length=32,steps=512,"
                           "confidence_eos_eot_inf=true",
}

EXPECTED.update({
    "llada15-gsm8k-256-16": "decoder=static,gen_length=256,block_length=16,steps=256,"
                            "confidence_eos_eot_inf=true",
    "llada15-math-1024-128": "decoder=static,gen_length=1024,block_length=128,steps=1024,"
                             "confidence_eos_eot_inf=true",
    "llada15-gpqa-256-16": "decoder=static,gen_length=256,block_length=16,steps=256",
    "llada15-humaneval-512-32": "decoder=static,gen_length=512,block_length=32,steps=512,"
                                "confidence_eos_eot_inf=true",
    "llada15-ifeval-256-16": "decoder=static,gen_length=256,block_length=16,steps=256,"
                             "confidence_eos_eot_inf=true",
})


def _script_settings(name: str) -> dict:
    """What the published script passed to its generate function, as pvf-dlm's keys."""
    script = SCRIPT_ROW[name]
    if name.startswith("fastdllm"):
        column = {"baseline": "baseline", "cache": "prefix_cache", "parallel": "parallel",
                  "cache-parallel": "prefix_cache_parallel",
                  "dual-parallel": "dual_cache_parallel"}[name.split("-", 3)[3]]
        call = SETTINGS[f"{script}:{column}"]["generate_call"]
        out = {"gen_length": call["gen_length"], "block_length": call["block_length"],
               "cache": {"generate": "none", "generate_with_prefix_cache": "prefix",
                         "generate_with_dual_cache": "dual"}[call["fn"]]}
        if call["threshold"] is None:
            out.update(decoder="static", steps=call["steps"])
        else:
            out.update(decoder="threshold", threshold=call["threshold"])
        assert call["temperature"] == 0 and call["remasking"] == "low_confidence"
        return out
    if name.startswith("pvf-paper"):
        text = SETTINGS[script]["generation"]
        assert text.startswith("gen_length 512, block_length 64, temperature 0, cfg_scale 0, "
                               "threshold 0.9")
        assert SETTINGS[script]["model"] == published(name).model
        return {"gen_length": 512, "block_length": 64}
    kw = SETTINGS[script]["generate_kwargs"]
    assert kw["temperature"] == 0 and kw["cfg_scale"] == 0 and kw["remasking"] == "low_confidence"
    out = {"decoder": "static", "steps": kw["steps"], "gen_length": kw["gen_length"],
           "block_length": kw["block_length"]}
    for switch in ("logits_eos_inf", "confidence_eos_eot_inf"):
        if kw.get(switch):
            out[switch] = True
    if name.startswith("llada-base"):   # the script shown at 1024; EVAL.md: gen = steps = block
        n = int(name.rsplit("-", 1)[1])
        out.update(steps=n, gen_length=n, block_length=n)
    return out


@pytest.mark.parametrize("name", list(SCRIPT_ROW))
def test_decoding_equals_the_published_scripts(name):
    from pvf_lmeval.lmeval.settings import RunSettings

    row = published(name)
    args = dict(kv.split("=", 1) for kv in row.model_args().split(","))
    assert args.pop("pretrained") == row.model
    params = RunSettings.parse(args).decoding.params(None)
    assert params.early_stop is False and params.temperature == 0
    for key, want in _script_settings(name).items():
        assert getattr(params, key) == want, (name, key)
    if name in EXPECTED:
        assert row.model_args() == f"pretrained={row.model},{EXPECTED[name]},early_stop=false"
    if name.startswith("pvf-paper"):
        method = name.rsplit("-", 1)[1]
        decoder = {"static": "static", "fastdllm": "threshold", "freedave": "freedave",
                   "pvf": "pvf"}[method]
        assert params.decoder == decoder
        if decoder in ("threshold", "pvf"):
            assert params.threshold == 0.9
        if decoder == "pvf":
            assert params.preset == name.split("-")[3]
    for switch in ("logits_eos_inf", "confidence_eos_eot_inf"):
        if switch not in _script_settings(name):
            assert not getattr(params, switch), (name, switch)


def _ppl_commands() -> dict:
    """LLaDA's likelihood commands (settings.json: eval_llada_lm_eval.sh's lines), by task:
    the lm-eval flags and the model args as its command line gives them."""
    out = {}
    for line in SETTINGS["llada_base_lmeval_ppl"]["commands"]:
        argv = shlex.split(line)
        flags = {a: argv[i + 1] for i, a in enumerate(argv) if a.startswith("--")
                 and i + 1 < len(argv) and not argv[i + 1].startswith("--")}
        model_args = dict(kv.split("=", 1) for kv in flags.pop("--model_args").split(","))
        out[flags["--tasks"]] = {**flags, "model_args": model_args}
    return out


def test_every_likelihood_command_has_its_rows():
    """A row per command; a command with guidance (cfg > 0) also has its row at cfg 0."""
    commands, rows = _ppl_commands(), published_rows()
    assert sorted(set(LIKELIHOOD_ROW.values())) == sorted(commands)
    for task, command in commands.items():
        guided = float(command["model_args"]["cfg"]) > 0
        assert (f"llada-base-{task}-cfg" in rows) == guided, task
        assert f"llada-base-{task}" in rows, task


@pytest.mark.parametrize("name", list(LIKELIHOOD_ROW))
def test_likelihood_equals_the_published_script(name):
    """The row's estimator is eval_llada.py's under the command's model args and --batch_size:
    mc_num draws, stratified per --batch_size draws (its _forward_process), cross-entropy over
    the whole vocabulary (mask logit kept), cfg as cfg_scale (the rows without "-cfg" at cfg
    0); the same task and few-shot count, no chat template."""
    from pvf_lmeval.lmeval.settings import RunSettings

    row = published(name)
    command = _ppl_commands()[LIKELIHOOD_ROW[name]]
    script = command["model_args"]
    assert script["model_path"].strip("'") == row.model
    assert script["is_check_greedy"] == "False"   # lm-eval reads no is_greedy on these tasks
    assert command["--model"] == "llada_dist" and "--apply_chat_template" not in command
    assert int(command["--num_fewshot"]) == row.num_fewshot and row.chat == "none"
    args = dict(kv.split("=", 1) for kv in row.model_args().split(","))
    assert args.pop("pretrained") == row.model
    options = RunSettings.parse(args).options
    batch = int(command["--batch_size"])
    cfg = float(script["cfg"]) if name.endswith("-cfg") else 0.0
    assert (options.likelihood.mc_num, options.likelihood.mc_stratum,
            options.likelihood.cfg_scale, options.likelihood.mask_logit) == (
        int(script["mc_num"]), batch, cfg, "kept"), name
    argv = shlex.split(row.command())
    task = argv[argv.index("--tasks") + 1]
    assert SCRIPT_TASK.get(task, task) == command["--tasks"]
    assert ("--include_path" in argv) == (task in SCRIPT_TASK)
    assert "--apply_chat_template" not in argv


def _published_until(script: str) -> list[str]:
    """The stop strings the published script cut its answers at (settings.json)."""
    found = SETTINGS[script]
    for key in ("stop_words_applied", "until_applied", "lm_eval_until"):
        if key in found:
            return found[key] if isinstance(found[key], list) else []   # "none (...)"
    if "lm_eval_gen_kwargs" in found:
        return found["lm_eval_gen_kwargs"]["until"]
    assert "no stop strings" in found["generation"], script
    return []


def test_stop_strings_are_the_published_scripts(local_items):
    """Each row's task cuts the answer where its script did: lm-eval's own ``until`` for
    eval_llada.py (GSM8K, HumanEval, minerva_math), OpenCompass's ``stop_words`` for the Base
    model (none but MATH's "Problem:"), none for the Instruct OpenCompass rows, the PVF authors'
    code and Fast-dLLM's HumanEval; the Fast-dLLM GSM8K rows keep lm-eval's."""
    from lm_eval.tasks import TaskManager

    want = {}
    for name in SCRIPT_ROW:
        until = want.setdefault(published(name).task, _published_until(SCRIPT_ROW[name]))
        assert until == _published_until(SCRIPT_ROW[name]), name   # a task serves one rule
    tm = TaskManager(include_path=str(REPO / "tasks"), include_defaults=False)
    loaded = tm.load(sorted(want))
    tasks = loaded["tasks"]
    # a group's subtasks serve its rows (bbh_llada)
    group_of = {leaf: g for g, leaves in loaded.get("group_map", {}).items() for leaf in leaves}
    got = {}
    for t in (tasks.values() if isinstance(tasks, dict) else tasks):
        got.setdefault(group_of.get(t.config.task, t.config.task), []).append(
            t.config.generation_kwargs["until"])
    assert {k: v[0] for k, v in got.items()} == want
    assert all(u == v[0] for v in got.values() for u in v)


def test_commands_name_the_chat_form_and_the_unsafe_code_switch():
    assert published("fastdllm-gsm8k-512-parallel").command() == (
        "lm_eval --model pvf-dlm --model_args pretrained=GSAI-ML/LLaDA-8B-Instruct,"
        "decoder=threshold,gen_length=512,block_length=32,threshold=0.9,cache=none,"
        'early_stop=false --include_path "$(pvf-tasks-path)" --tasks gsm8k_pvf --num_fewshot 5 '
        "--batch_size 1 --apply_chat_template --fewshot_as_multiturn false")
    assert published("llada-base-humaneval-512").command() == (
        "lm_eval --model pvf-dlm --model_args pretrained=GSAI-ML/LLaDA-8B-Base,decoder=static,"
        "gen_length=512,block_length=512,steps=512,early_stop=false "
        '--include_path "$(pvf-tasks-path)" --tasks humaneval_pvf --num_fewshot 0 '
        "--batch_size 1 --confirm_run_unsafe_code")
    assert published("llada-base-truthfulqa_mc2-cfg").command() == (
        "lm_eval --model pvf-dlm --model_args pretrained=GSAI-ML/LLaDA-8B-Base,cfg_scale=2.0,"
        "mc_num=128,mc_stratum=8,mask_logit=kept --tasks truthfulqa_mc2 "
        "--num_fewshot 0 --batch_size 1")
    with pytest.raises(ValueError, match="published setting 'nope' is not one of llada-"):
        published("nope")


def test_benchmarks_doc_holds_the_generated_table():
    doc = (REPO / "docs" / "benchmarks.md").read_text()
    begin, end = "<!-- published:begin -->\n", "<!-- published:end -->"
    assert doc.count(begin) == 1 and doc.count(end) == 1
    assert doc.split(begin)[1].split(end)[0] == markdown_table(), \
        "docs/benchmarks.md's published table drifted: paste `pvf-dlm published --markdown`"


# ----------------------------------------------------------------------------- answers

OC = ANSWERS["opencompass"]
PVF = ANSWERS["pvf"]
CODE_DOC = {"prompt": 'def add(a: int, b: int) -> int:\n    """Return a + b.\n    >>> add(1, 2)\n'
                      '    3\n    """\n', "entry_point": "add"}


@pytest.mark.parametrize("case", OC["gsm8k_postprocess (instruct rows)"], ids=lambda c: c["output"][:20])
def test_opencompass_gsm8k_prediction(case):
    assert pa.oc_gsm8k_prediction(case["output"]) == case["pred"]


def test_opencompass_gsm8k_reference_and_equality():
    case = OC["gsm8k_dataset_postprocess"][0]
    assert pa.oc_gsm8k_reference(case["answer"]) == case["ref"]
    # Gsm8kEvaluator.is_equal (opencompass/datasets/gsm8k.py l.66-72)
    assert pa.oc_gsm8k_equal("18", "18") and pa.oc_gsm8k_equal("18.0", "18")
    assert not pa.oc_gsm8k_equal("NULL", "18") and not pa.oc_gsm8k_equal("18", "18.5")
    assert pa.oc_gsm8k_equal("18.5", "18.5")      # the same string, before int() fails


@pytest.mark.parametrize("case", OC["humaneval_postprocess_v2 (instruct row)"],
                         ids=lambda c: c["output"][:20])
def test_opencompass_humaneval_completion(case):
    assert pa.oc_humaneval_completion(case["output"]) == case["completion"]
    assert pa.oc_humaneval_program(CODE_DOC, case["completion"]) == CODE_DOC["prompt"] + case["completion"]


@pytest.mark.parametrize("case", PVF["gsm8k extract_pred_number / accuracy_gsm8k"],
                         ids=lambda c: c["output"][:20])
def test_pvf_authors_gsm8k(case):
    assert pa.pvf_gsm8k_prediction(case["output"]) == case["pred"]
    assert pa.pvf_gsm8k_correct(case["output"], PVF["gold_gsm8k"]) == bool(case["correct"])


@pytest.mark.parametrize("case", PVF["humaneval extract_python_code"], ids=lambda c: c["output"][:20])
def test_pvf_authors_humaneval_code(case):
    code = pa.pvf_humaneval_code(case["output"], "add")
    assert code == case["code"]
    # check_correctness (humaneval_eval.py l.79-84): the code alone when it defines the entry
    want = code if code.strip().startswith("def add") else CODE_DOC["prompt"] + code
    assert pa.pvf_humaneval_program(CODE_DOC, code) == want


@pytest.mark.parametrize("case", PVF["humaneval extract_python_code (more)"],
                         ids=lambda c: c["output"][:20])
def test_pvf_authors_humaneval_last_block_and_program(case):
    code = pa.pvf_humaneval_code(case["output"], "add")
    assert code == case["code"]
    prompt_first = pa.pvf_humaneval_program(CODE_DOC, code).startswith(CODE_DOC["prompt"])
    assert prompt_first == case["program_starts_with_prompt"]


def test_pvf_authors_program_reads_the_code_stripped():
    """check_correctness tests ``completion.strip().startswith("def " + entry_point)``."""
    code = "\n  def add(a, b):\n    return a + b\n"
    assert pa.pvf_humaneval_program(CODE_DOC, code) == code
    assert pa.pvf_humaneval_program(CODE_DOC, "x = 1\n") == CODE_DOC["prompt"] + "x = 1\n"


OCM = ANSWERS["opencompass_math"]


def test_opencompass_math_extraction_and_equivalence():
    """math_postprocess_v2, extract_boxed_answer and MATHEvaluator(version='v2').is_equiv on
    every (solution, output) pair of the corpus."""
    got = [(pa.oc_math_boxed(r["solution"]), pa.oc_math_prediction(r["output"])) for r in OCM["rows"]]
    assert got == [(r["gold"], r["pred"]) for r in OCM["rows"]]
    assert [pa.oc_math_equal(p, g) for g, p in got] == [r["correct"] for r in OCM["rows"]]
    assert [pa.oc_math_equal(e["a"], e["b"]) for e in OCM["is_equiv"]] == \
        [e["equal"] for e in OCM["is_equiv"]]


def test_math_task_scores_with_opencompass_rule(local_items):
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(REPO / "tasks"), include_defaults=False)
    t = tm.load(["math_llada_oc"])["tasks"]
    t = next(iter(t.values())) if isinstance(t, dict) else t[0]
    doc = t.test_docs()[0]
    gold = pa.oc_math_boxed(doc["solution"])
    assert t.process_results(doc, [f"So the answer is $\\boxed{{{gold}}}$."])["exact_match"] == 1.0
    assert t.process_results(doc, ["no answer"])["exact_match"] == 0.0
    assert len(t.test_docs()) == len(ITEMS["math_test"]) and t.config.generation_kwargs["until"] == []


FD = ANSWERS["fastdllm"]


@pytest.mark.parametrize("case", FD["postprocess_code.py program"], ids=lambda c: c["output"][:20])
def test_fastdllm_humaneval_program(case):
    doc = {"prompt": FD["prompt"], "entry_point": FD["entry_point"]}
    assert pa.fastdllm_program(doc, case["output"]) == case["program"]


def test_fastdllm_humaneval_program_on_the_items():
    docs = {d["task_id"]: d for d in ITEMS["humaneval"]}
    for case in FD["postprocess_code.py program on items.json"]:
        assert pa.fastdllm_program(docs[case["task_id"]], case["output"]) == case["program"]


def test_pvf_authors_gold_numbers():
    """``extract_gold_number`` (gsm8k_eval.py l.17-41)."""
    assert pa.pvf_gsm8k_reference("so 3 + 4\n#### 1,234") == 1234.0
    assert pa.pvf_gsm8k_reference("x\n#### 3/4") == 3.0     # the number pattern is tried first
    assert pa.pvf_gsm8k_reference("no hashes, 12 then 7.5") == 7.5
    assert pa.pvf_gsm8k_reference("nothing") is None


@pytest.mark.parametrize("task", ["gsm8k_llada_oc", "gsm8k_pvf_paper"])
def test_gsm8k_tasks_score_with_the_published_rule(task, local_items):
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(REPO / "tasks"), include_defaults=False)
    t = tm.load([task])["tasks"]
    t = next(iter(t.values())) if isinstance(t, dict) else t[0]
    doc = t.test_docs()[0]                     # Janet's ducks: 18
    right = "She makes 9 * 2 = 18 dollars.\nQuestion: and 99?"
    score = t.process_results(doc, [right])["exact_match"]
    assert score == (1.0 if task == "gsm8k_llada_oc" else 0.0)   # the PVF rule reads the 99
    assert t.process_results(doc, ["She makes $18."])["exact_match"] == 1.0
    assert t.config.generation_kwargs["until"] == []


OCB = ANSWERS["opencompass_base"]


@pytest.mark.parametrize("case", OCB["gsm8k_postprocess_"], ids=lambda c: c["output"][:20])
def test_opencompass_base_gsm8k_prediction(case):
    assert pa.oc_gsm8k_base_prediction(case["output"]) == case["pred"]


@pytest.mark.parametrize("case", OCB["humaneval_internal_v2_postprocess"],
                         ids=lambda c: c["output"][:20])
def test_opencompass_base_humaneval_completion(case):
    assert pa.oc_humaneval_base_completion(case["output"]) == case["completion"]


def test_opencompass_base_math_gold_is_the_boxed_answer():
    """MATHDataset.load keeps ``extract_boxed_answer(solution)``; MATHVerifyEvaluator reads it."""
    rows = OCB["MATHVerifyEvaluator"]["rows"]
    assert [pa.oc_math_boxed(r["solution"]) for r in rows] == [r["gold"] for r in rows]


def test_opencompass_base_math_verify():
    require_math_extra()
    rows = OCB["MATHVerifyEvaluator"]["rows"]
    assert [pa.oc_math_verify_correct(r["output"], r["gold"]) for r in rows] == \
        [r["correct"] for r in rows]


def test_opencompass_base_math_verify_is_none_without_the_package(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "math_verify", None)    # import fails
    assert pa.oc_math_verify_correct("\\boxed{2}", "2") is None


def test_pvf_authors_math():
    """``check_single_MATH`` on every (solution, output) pair of the corpus: boxed answers,
    normalisation, numeric equality, the final-answer fallback and its vetoes."""
    rows = PVF["MATH check_single_MATH(allow_fallback=True, strict_fallback=False)"]
    assert [pa.pvf_math_correct(r["output"], r["solution"]) for r in rows] == \
        [r["correct"] for r in rows]


def test_pvf_authors_mmlu_pro():
    preds = PVF["mmlu_pro extract_mmlu_pro_pred_choice"]
    assert [pa.pvf_mmlu_pro_prediction(r["output"]) for r in preds] == [r["pred"] for r in preds]
    rows = PVF["mmlu_pro accuracy_MMLU_Pro"]
    assert [pa.pvf_mmlu_pro_correct(r["output"], r["gold"]) for r in rows] == \
        [r["correct"] for r in rows]


OCC = ANSWERS["opencompass_choice"]


def test_opencompass_first_option_on_the_corpus():
    """``first_option_postprocess(text, 'ABCD')`` (ARC-C) on 454 outputs: English and Chinese
    answer phrases, bare letters, and random mixtures of their fragments."""
    cases = OCC["first_option_postprocess_ABCD"]
    assert [pa.oc_first_option(c["text"]) for c in cases] == [c["option"] for c in cases]


def test_opencompass_mmlu_pro_letter_on_the_corpus():
    """``match_answer_pattern`` with MMLU-Pro's pattern on the same outputs (a lower-case
    letter stays lower-case, and AccEvaluator then counts it wrong)."""
    cases = OCC["match_answer_pattern_mmlu_pro"]
    assert OCC["mmlu_pro_answer_pattern"] == r"(?i)ANSWER\s*:\s*([A-P])"
    assert [pa.oc_mmlu_pro_prediction(c["text"]) for c in cases] == [c["prediction"] for c in cases]
    assert not pa.oc_choice_correct("a", "A") and pa.oc_choice_correct("A", "A")


def test_opencompass_choice_tasks_read_the_items_as_opencompass(local_items):
    """The tasks' docs carry what OpenCompass's loaders made of the same items
    (``ARCDataset.load``: four-choice questions, answer letter by position;
    ``MMLUProDataset``'s ``options_str``), and score with its rules."""
    from pvf_lmeval.lmeval.task_metrics import mean_of_group_means

    arc = _loaded("arc_challenge_llada_oc")
    docs = list(arc.test_docs())
    theirs = SETTINGS["llada_instruct_arc_c_len512"]["loaded_docs"]
    assert [(d["question"], d["A"], d["B"], d["C"], d["D"], d["label"]) for d in docs] == \
        [(t["question"], t["textA"], t["textB"], t["textC"], t["textD"], t["answerKey"])
         for t in theirs]
    assert docs[1]["label"] == "A"                     # labelled 1-4, answer "1"
    assert arc.process_results(docs[1], ["The answer is (A)."])["exact_match"] == 1.0
    assert arc.process_results(docs[1], ["B is wrong, A is right"])["exact_match"] == 0.0
    other = next(d for d in docs if d["label"] not in "AB")   # the label, not the first letter, scores
    assert arc.process_results(other, [f"Answer: {other['label']}"])["exact_match"] == 1.0
    assert arc.process_results(other, ["Answer: A"])["exact_match"] == 0.0
    pro = _loaded("mmlu_pro_llada_oc")
    utils = _task_utils("mmlu_pro_pvf")
    theirs = SETTINGS["llada_instruct_mmlu_pro_len256"]["loaded_docs"]
    assert [utils.options_llada_oc(d) for d in pro.test_docs()] == [t["options_str"] for t in theirs]
    doc = pro.test_docs()[0]                            # answer I, category business
    assert pro.process_results(doc, ["...\nANSWER: I"])["category_mean"] == ("business", 1.0)
    assert pro.process_results(doc, ["...\nanswer: i"])["exact_match"] == 0.0
    assert pro.process_results(doc, ["ANSWER: B\nANSWER: I"])["exact_match"] == 0.0
    # the summary OpenCompass prints: the plain mean of the category accuracies
    assert mean_of_group_means([("math", 1.0), ("math", 0.0), ("law", 1.0)]) == 0.75


def test_opencompass_gpqa_on_the_corpus_and_the_items(local_items):
    """``GPQA_Simple_Eval_postprocess_`` on the corpus and GPQA's phrases; ``GPQADataset_``'s
    shuffle (one ``random.seed(0)`` over the file's rows) as the task's docs."""
    cases = OCC["gpqa_simple_eval_postprocess_"]
    assert [pa.oc_gpqa_prediction(c["text"]) for c in cases] == [c["prediction"] for c in cases]
    gpqa = _loaded("gpqa_diamond_llada_oc")
    docs = list(gpqa.test_docs())
    theirs = SETTINGS["llada_instruct_gpqa_len64"]["loaded_docs"]
    assert [{k: d[k] for k in ("question", "A", "B", "C", "D", "answer")} for d in docs] == theirs
    assert gpqa.process_results(docs[0], ["... The correct answer is (B)."])["exact_match"] == 1.0
    assert gpqa.process_results(docs[0], ["the correct answer is (b)"])["exact_match"] == 0.0


OCBBH = ANSWERS["opencompass_bbh"]


def test_opencompass_bbh_post_processors_on_the_corpus():
    """``bbh_mcq_postprocess`` and ``bbh_freeform_postprocess`` on the corpus and BBH's own
    answer phrases (a second "answer is", an unclosed parenthesis, bold, a final period)."""
    assert [pa.oc_bbh_mcq(c["text"]) for c in OCBBH] == [c["mcq"] for c in OCBBH]
    assert [pa.oc_bbh_freeform(c["text"]) for c in OCBBH] == [c["freeform"] for c in OCBBH]


def test_opencompass_bbh_task_reads_the_items_and_scores_as_opencompass(local_items):
    """The 27 subtasks in the config's order, each scored with its evaluator (the
    multiple-choice ones are those whose eval_cfg is ``BBHEvaluator_mcq`` with
    ``bbh_mcq_postprocess`` on both sides), the docs ``BBHDataset.load``'s."""
    setting = SETTINGS["llada_base_oc_bbh_len256"]
    utils = _task_utils("bbh_llada")
    assert list(utils.SUBTASKS) == setting["subtasks"]
    mcq = {s for s, cfg in setting["eval_cfg"].items() if cfg["evaluator"]["type"] == "BBHEvaluator_mcq"
           and cfg["pred_postprocessor"]["type"] == cfg["dataset_postprocessor"]["type"]
           == "bbh_mcq_postprocess"}
    assert set(utils.MULTIPLE_CHOICE) == mcq
    assert {cfg["evaluator"]["type"] for s, cfg in setting["eval_cfg"].items() if s not in mcq} \
        == {"BBHEvaluator"}
    bbh = _loaded("bbh_llada_oc_base")
    docs = list(bbh.test_docs())
    assert [(d["subtask"], d["input"], d["target"]) for d in docs] == \
        [(s, t["input"], t["target"]) for s in setting["subtasks"] for t in setting["loaded_docs"][s]]
    mc = docs[0]
    free = next(d for d in docs if d["subtask"] not in mcq and d["target"] == "valid")
    assert bbh.process_results(mc, ["... So the answer is (A)."])["subtask_mean"] == \
        ("temporal_sequences", 1.0)
    assert bbh.process_results(mc, ["So the answer is (B)."])["exact_match"] == 0.0
    assert bbh.process_results(free, ["So the answer is **valid**."])["exact_match"] == 1.0
    assert bbh.process_results(free, ["So the answer is Valid."])["exact_match"] == 0.0


def test_opencompass_mmlu_task_reads_the_items_as_opencompass(local_items):
    """``MMLUDataset.load`` on the same items (as its CSVs): question, choices and the answer
    letter; the exemplars are the subject's dev questions in order (``fix_id_list`` 0-4 of a
    five-question dev split); the task scores with ``first_option_postprocess`` per question
    and per subject."""
    mmlu = _loaded("mmlu_llada_oc")
    docs = list(mmlu.test_docs())
    theirs = SETTINGS["llada_instruct_mmlu_len3"]["loaded_docs"]
    assert SETTINGS["llada_instruct_mmlu_len3"]["retriever"]["fix_id_list"] == [0, 1, 2, 3, 4]
    for split, ours in (("test", docs), ("dev", ITEMS["mmlu_dev"])):
        want = [(t["input"], t["A"], t["B"], t["C"], t["D"], t["target"])
                for subject in theirs.values() for t in subject[split]]
        assert [(d["question"], *d["choices"], "ABCD"[d["answer"]]) for d in ours] == want
    assert len(SETTINGS["llada_instruct_mmlu_len3"]["subjects"]) == 57
    doc = docs[0]                                       # answer B
    assert mmlu.process_results(doc, ["B"])["subject_mean"] == ("abstract_algebra", 1.0)
    # the corpus: "I choose A because it is correct." gives A, "Thus the answer is A, not B." B
    assert mmlu.process_results(doc, ["I choose A because it is correct."])["exact_match"] == 0.0
    assert mmlu.process_results(doc, ["Thus the answer is A, not B."])["exact_match"] == 1.0
    assert mmlu.process_results(doc, ["b"])["exact_match"] == 0.0


def test_opencompass_mmlu_fills_the_exemplars_again_with_the_asked_question(local_items):
    """OpenCompass formats the whole prompt, the finished exemplars in it included, with the
    asked question's columns: a dev question whose option D holds ``{A}`` (A is filled before
    D, so it survives its own filling) shows the asked question's option A there."""
    mmlu = _loaded("mmlu_llada_oc")
    doc = next(iter(mmlu.test_docs()))
    pool = mmlu._pool(doc["subject"])
    pool[0] = {**pool[0], "choices": [*pool[0]["choices"][:3], "none of {A}"]}
    context = mmlu.fewshot_context(doc, 5)
    assert f"\nD. none of {doc['choices'][0]}\nAnswer: " in context
    assert "{A}" not in context


#: the first line of OpenCompass's hellaswag.jsonl as AISBench's page of OpenCompass's
#: hellaswag.zip prints it (zhongzhouTan-coder/benchmark @ 8b3dba6,
#: ais_bench/benchmark/configs/datasets/hellaswag/README.md)
OC_HELLASWAG_FIRST_LINE = {
    "query": "Roof shingle removal: A man is sitting on a roof. He",
    "choices": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                "is holding a rubik's cube.", "starts pulling up roofing on a roof."],
    "gold": 3}


def test_opencompass_hellaswag_task_reads_the_items_as_opencompass(local_items):
    """On Rowan/hellaswag's validation rows (two of the hub's, two hand-made: WikiHow's bracket
    tags, an activity label holding ": ", field names in braces) the task's docs carry the
    lines of OpenCompass's hellaswag.jsonl (``query``, ``choices``, ``gold``: lm-eval's
    ``process_docs``) and what ``HellaswagDataset_V2.load`` makes of them (the context after the
    query's first ": ", the answer's letter); it scores with ``first_option_postprocess``."""
    task = _loaded("hellaswag_llada_oc")
    docs = list(task.test_docs())
    setting = SETTINGS["llada_instruct_hellaswag_len3"]
    assert [{k: d[k] for k in ("query", "choices", "gold")} for d in docs] == \
        setting["opencompass_jsonl"]
    assert setting["opencompass_jsonl"][0] == OC_HELLASWAG_FIRST_LINE
    assert [{k: d[k] for k in ("ctx", "A", "B", "C", "D", "label")} for d in docs] == \
        setting["loaded_docs"]
    assert setting["datasets"][0]["type"] == "HellaswagDataset_V2"
    doc = docs[0]                                       # answer D
    assert task.process_results(doc, ["D"])["exact_match"] == 1.0
    assert task.process_results(doc, ["The answer is D."])["exact_match"] == 1.0
    assert task.process_results(doc, ["B is wrong, D is right"])["exact_match"] == 0.0
    assert task.process_results(doc, ["d"])["exact_match"] == 0.0     # no option letter
    assert task.process_results(doc, [""])["exact_match"] == 0.0
    assert task.process_results(docs[3], ["A"])["exact_match"] == 1.0


def _task_utils(folder: str):
    import importlib.util

    path = REPO / "tasks" / folder / "utils.py"
    spec = importlib.util.spec_from_file_location(f"_published_{folder}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


M048 = ANSWERS["lmeval048_minerva_math"]


def test_lmeval048_minerva_answers_and_normalisation():
    """minerva_math_llada's reference answer and the output's answer, normalised as lm-eval
    0.4.8 did (no sympy needed), on every pair of the corpus."""
    import datasets

    mth = _task_utils("math500_pvf")
    rows = M048["rows"]
    docs = mth.process_docs_lmeval048(datasets.Dataset.from_list(
        [{"problem": "p", "solution": r["solution"]} for r in rows]))
    assert [d["answer"] for d in docs] == [r["answer"] for r in rows]
    got = [mth.normalize_final_answer(mth.get_unnormalized_answer(r["output"]), legacy=True)
           for r in rows]
    assert got == [r["normalized"] for r in rows]


@family_tier      # 6-8 s of sympy on the CPU
def test_lmeval048_minerva_scores():
    """exact_match and math_verify as lm-eval 0.4.8's process_results gives them (needs
    lm-eval[math]: sympy, antlr4-python3-runtime 4.11, math_verify)."""
    require_math_extra()
    mth = _task_utils("math500_pvf")
    rows = M048["rows"]
    got = [mth.process_results_lmeval048({"answer": r["answer"], "solution": r["solution"]},
                                         [r["output"]]) for r in rows]
    assert [(g["exact_match"], g["math_verify"]) for g in got] == \
        [(float(r["exact_match"]), float(r["math_verify"])) for r in rows]


def test_math_tasks_warn_once_of_an_antlr_runtime_other_than_lm_evals_pin(monkeypatch, caplog):
    """antlr 4.13 gives other verdicts than 4.11 on some MATH answers: each MATH task built with
    it warns once, in one line naming the version and the fix; 4.11.x or no antlr: no warning."""
    import importlib.metadata
    import logging

    import datasets

    mth = _task_utils("math500_pvf")
    docs = datasets.Dataset.from_list([{"problem": "p", "solution": "so $\\boxed{2}$"}])
    installed = {"antlr4-python3-runtime": "4.13.2"}

    def version(name):
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(importlib.metadata, "version", version)
    with caplog.at_level(logging.WARNING, logger="pvf_lmeval.tasks"):
        for _ in range(2):
            mth.process_docs(docs)
            mth.process_docs_lmeval048(docs)
            mth.process_docs_llada_oc_base(docs)
    warned = [r.getMessage() for r in caplog.records if "antlr4-python3-runtime is" in r.getMessage()]
    assert warned == [f"{task}: antlr4-python3-runtime is 4.13.2, not 4.11 (lm-eval[math]'s pin); "
                      "some LaTeX answers parse differently and their scores differ from the "
                      "published scorers' (pip install antlr4-python3-runtime==4.11)"
                      for task in ("math500_pvf", "minerva_math_llada", "math_llada_oc_base")]
    for got in ("4.11.0", "4.11", None):
        caplog.clear()
        fresh = _task_utils("math500_pvf")
        installed = {} if got is None else {"antlr4-python3-runtime": got}
        with caplog.at_level(logging.WARNING, logger="pvf_lmeval.tasks"):
            fresh.process_docs(docs)
            fresh.process_docs_lmeval048(docs)
        assert not [r for r in caplog.records if "antlr4-python3-runtime is" in r.getMessage()], got


def _loaded(task: str):
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(REPO / "tasks"), include_defaults=False)
    t = tm.load([task])["tasks"]
    return next(iter(t.values())) if isinstance(t, dict) else t[0]


def _available(*modules: str) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in modules)


def test_new_math_tasks_score_with_the_published_rules(local_items):
    """MATH item 0 (two vertical asymptotes): each MATH row's task reads the answer its script
    reads; a metric whose package is missing is NaN, not a guess."""
    import math

    minerva = _loaded("minerva_math_llada")
    doc = minerva.test_docs()[0]
    assert doc["answer"] == "2" and minerva.config.num_fewshot == 4
    phrase = "So there are two.\nFinal Answer: The final answer is $2$. I hope it is correct."
    res = minerva.process_results(doc, [phrase])
    assert (res["exact_match"] == 1.0) if _available("antlr4", "sympy") else math.isnan(res["exact_match"])
    assert (res["math_verify"] == 1.0) if _available("math_verify") else math.isnan(res["math_verify"])
    if _available("antlr4", "sympy"):         # the Minerva phrase only, as 0.4.8
        assert minerva.process_results(doc, ["$\\boxed{2}$"])["exact_match"] == 0.0
    oc_base = _loaded("math_llada_oc_base")
    got = oc_base.process_results(oc_base.test_docs()[0], ["so $\\boxed{2}$"])["exact_match"]
    assert got == 1.0 if _available("math_verify", "latex2sympy2_extended") else math.isnan(got)
    paper = _loaded("math_pvf_paper")
    doc = paper.test_docs()[0]
    assert paper.process_results(doc, ["thus \\boxed{2}."])["exact_match"] == 1.0
    assert paper.process_results(doc, ["The final answer is 3."])["exact_match"] == 0.0
    assert paper.config.num_fewshot in (None, 0) and paper.config.generation_kwargs["until"] == []


def test_new_gsm8k_mmlu_pro_humaneval_tasks_score_with_the_published_rules(local_items):
    base = _loaded("gsm8k_llada_oc_base")
    doc = base.test_docs()[0]                  # Janet's ducks: 18
    assert base.process_results(doc, ["The answer is: 18 ducks, not 20"])["exact_match"] == 1.0
    assert base.process_results(doc, ["18 then 20"])["exact_match"] == 0.0   # the last number
    mmlu = _loaded("mmlu_pro_pvf_paper")
    doc = mmlu.test_docs()[0]                  # answer I
    assert mmlu.process_results(doc, ["Analysis: ...\nAnswer: I"])["exact_match"] == 1.0
    assert mmlu.process_results(doc, ["Answer: B"])["exact_match"] == 0.0
    # their first pattern reads "answer is (A)" as "answer i...": the letter I
    assert mmlu.process_results(doc, ["the answer is (A)"])["exact_match"] == 1.0
    he = _task_utils("humaneval_pvf")
    doc = dict(CODE_DOC, task_id="t", test="", entry_point="add")
    body = "    return a + b\n\n\nprint(add(1, 2))"
    assert he.completion_llada_oc_base(doc, body) == CODE_DOC["prompt"] + "    return a + b"


# ----------------------------------------------------------------------------- IFEval

OCIF = ANSWERS["opencompass_ifeval"]


def _require_ifeval_extra():
    """lm-eval's IFEval checkers import: their packages are in the ``test`` extra, so a missing
    one is a broken install and fails."""
    missing = pa.ifeval_missing()
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: pip install -e '.[test]'", pytrace=False)


@pytest.fixture
def ifeval_checkers(monkeypatch):
    """lm-eval's IFEval checkers, without an nltk download, and langdetect seeded as the
    reference run was (it draws at random per call otherwise, in OpenCompass and lm-eval)."""
    _require_ifeval_extra()
    _no_nltk_downloads(monkeypatch)
    import langdetect

    monkeypatch.setattr(langdetect.DetectorFactory, "seed", OCIF["langdetect_seed"])


def test_opencompass_ifeval_verdicts_on_the_corpus(ifeval_checkers):
    """``test_instruction_following_strict`` / ``_loose`` per (item, output) of the corpus: 22
    of the 25 registered instruction types (not those that need nltk's punkt model or
    langdetect on short texts); strict and loose differ on 16 of 48 outputs."""
    from lm_eval.tasks.ifeval import instructions_registry

    docs = {d["key"]: d for d in ITEMS["ifeval_train"]}
    used = {i for d in docs.values() for i in d["instruction_id_list"]}
    assert set(instructions_registry.INSTRUCTION_DICT) - used == {
        "length_constraints:number_sentences", "change_case:capital_word_frequency",
        "language:response_language"}
    cases = OCIF["cases"]
    assert sum(c["strict"] != c["loose"] for c in cases) == 16
    got = [(pa.oc_ifeval_follows(docs[c["key"]], c["output"], loose=False),
            pa.oc_ifeval_follows(docs[c["key"]], c["output"], loose=True)) for c in cases]
    assert got == [(c["strict"], c["loose"]) for c in cases]


def test_opencompass_ifeval_gives_the_prompt_to_a_checker_that_takes_it(monkeypatch, ifeval_checkers):
    """``test_instruction_following_*``: a checker whose arguments name ``prompt`` is rebuilt
    with the item's prompt (none of the 25 registered ones does; the rule is the reference's),
    the item's kwargs without their None values first."""
    from lm_eval.tasks.ifeval import instructions_registry

    built = []

    class TakesPrompt:
        def __init__(self, instruction_id):
            self.prompt = None

        def build_description(self, **kwargs):
            built.append(kwargs)
            self.prompt = kwargs.get("prompt", self.prompt)

        def get_instruction_args(self):
            return {"prompt": self.prompt}

        def check_following(self, response):
            return self.prompt is not None and response.startswith(self.prompt)

    monkeypatch.setitem(instructions_registry.INSTRUCTION_DICT, "test:takes_prompt", TakesPrompt)
    doc = {"prompt": "Say hi.", "instruction_id_list": ["test:takes_prompt"],
           "kwargs": [{"n": 2, "unset": None}]}
    assert pa.oc_ifeval_follows(doc, "Say hi. hi", loose=False) == [True]
    assert built == [{"n": 2}, {"prompt": "Say hi."}]
    assert pa.oc_ifeval_follows(doc, "hi", loose=False) == [False]


def test_pvf_math_strip_drops_degrees_and_units():
    """``strip_string`` (Hendrycks' normalisation): degree marks in both spellings, a right
    ``\\text{ unit}``, dollars and ``\\left``/``\\right`` go."""
    assert pa.pvf_math_strip("30^{\\circ}") == "30"
    assert pa.pvf_math_strip("30^\\circ") == "30"
    assert pa.pvf_math_strip("5\\text{ cm}") == "5"
    assert pa.pvf_math_strip("\\$\\left(1,2\\right)") == "(1,2)"


def test_ifeval_task_scores_as_ifevaluator(local_items, ifeval_checkers):
    """The task's four metrics over the corpus, aggregated as its metric_list says, are
    ``IFEvaluator.score``'s four figures (percentages there, fractions here)."""
    task = _loaded("ifeval_llada_oc")
    docs = {d["key"]: d for d in task.test_docs()}
    assert [d["key"] for d in task.test_docs()] == [d["key"] for d in ITEMS["ifeval_train"]]
    per_case = [task.process_results(docs[c["key"]], [c["output"]]) for c in OCIF["cases"]]
    aggregate = {m["metric"]: m["aggregation"] for m in task.config.metric_list}
    figures = {"prompt_level_strict_acc": "Prompt-level-strict-accuracy",
               "inst_level_strict_acc": "Inst-level-strict-accuracy",
               "prompt_level_loose_acc": "Prompt-level-loose-accuracy",
               "inst_level_loose_acc": "Inst-level-loose-accuracy"}
    assert [m["metric"] for m in task.config.metric_list][:4] == list(figures)
    for ours, theirs in figures.items():
        agg = aggregate[ours]
        agg = agg if callable(agg) else (lambda xs: sum(xs) / len(xs))
        assert round(agg([r[ours] for r in per_case]) * 100, 9) == round(OCIF["ifevaluator_score"][theirs], 9)
    assert task.config.generation_kwargs["until"] == [] and task.config.num_fewshot in (None, 0)


def test_ifeval_task_stops_in_one_line_without_its_extra(local_items, monkeypatch):
    """Without lm-eval[ifeval] the task stops when its documents are read (before any
    decoding), in one line naming the extra."""
    from pvf_lmeval.one_line import _one_line

    monkeypatch.setattr(pa, "ifeval_missing", lambda: ["langdetect", "immutabledict"])
    with pytest.raises(ImportError) as error:
        _loaded("ifeval_llada_oc")
    assert _one_line(error.value) == ('pvf-dlm: ifeval_llada_oc: langdetect, immutabledict not '
                                      'installed; its scoring needs them (pip install '
                                      '"lm-eval[ifeval]")')
    assert error.value.pvf_one_line


# ----------------------------------------------------------------------------- a run


@pytest.mark.parametrize("name", ["llada-instruct-gsm8k-256-8", "fastdllm-gsm8k-256-parallel"])
def test_a_row_runs_through_lm_eval_on_the_tiny_model(name, local_items):
    """The row's model args and flags through lm-eval and pvf-dlm on tiny-llada (its own chat
    template; 32 positions instead of 256): the decoding is the row's, nothing cuts the answer
    but the row's stop strings, and the chat form is the row's."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from helpers.prerequisites import require_bundled_weights
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    require_bundled_weights("tiny-llada")
    row = published(name)
    args = dict(kv.split("=", 1) for kv in row.model_args().split(","))
    args.update(pretrained="tiny-llada", gen_length="32",
                **({"steps": "32"} if "steps" in args else {}))
    lm = PVFDiffusionLM.create_from_arg_string(",".join(f"{k}={v}" for k, v in args.items()))
    flags = _cli_flags(row)
    out = lm_eval.simple_evaluate(model=lm, limit=1, bootstrap_iters=0, log_samples=True,
                                  task_manager=TaskManager(include_path=str(REPO / "tasks"),
                                                           include_defaults=False), **flags)
    sample = out["samples"][row.task][0]
    context, gen_kwargs = sample["arguments"][0]
    assert context.count("<|start_header_id|>user") == (1 if row.chat == "single_turn" else 5)
    assert gen_kwargs["until"] == ([] if row.task == "gsm8k_llada_oc" else
                                   ["Question:", "</s>", "<|im_end|>"])
    meta = sample["resps"][0][0].meta
    assert meta["gen_length"] == 32
    if args["decoder"] == "static":      # one position per call, to the end of the canvas
        assert meta["nfe"] == 32
    assert "exact_match" in out["results"][row.task] or "exact_match,none" in out["results"][row.task]


def test_the_hellaswag_row_runs_through_lm_eval_on_the_tiny_model(local_items):
    """llada-instruct-hellaswag-3's model args and flags as they stand (three positions, three
    calls) through lm-eval and pvf-dlm on tiny-llada: one user turn, no stop string, the answer
    scored by first_option_postprocess against the item's letter."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from helpers.prerequisites import require_bundled_weights
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    require_bundled_weights("tiny-llada")
    row = published("llada-instruct-hellaswag-3")
    args = dict(kv.split("=", 1) for kv in row.model_args().split(","))
    args.update(pretrained="tiny-llada")
    lm = PVFDiffusionLM.create_from_arg_string(",".join(f"{k}={v}" for k, v in args.items()))
    out = lm_eval.simple_evaluate(model=lm, limit=2, bootstrap_iters=0, log_samples=True,
                                  task_manager=TaskManager(include_path=str(REPO / "tasks"),
                                                           include_defaults=False), **_cli_flags(row))
    for sample, doc in zip(out["samples"][row.task], ITEMS["hellaswag_validation"]):
        context, gen_kwargs = sample["arguments"][0]
        assert context.count("<|start_header_id|>user") == 1 and gen_kwargs["until"] == []
        assert context.endswith(
            "\nAnswer:<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
        meta = sample["resps"][0][0].meta
        assert meta["gen_length"] == 3 and meta["nfe"] == 3
        answer = sample["filtered_resps"][0]
        want = pa.oc_first_option(answer) == "ABCD"[int(doc["label"])]
        assert sample["exact_match"] == float(want)


def test_the_ifeval_row_runs_through_lm_eval_on_the_tiny_model(local_items, ifeval_checkers):
    """llada15-ifeval-256-16's model args and flags through lm-eval and pvf-dlm on tiny-llada
    (32 positions instead of 256): one user turn, no stop string, the whole canvas decoded one
    position per call, and IFEvaluator's four figures in the results."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from helpers.prerequisites import require_bundled_weights
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    require_bundled_weights("tiny-llada")
    row = published("llada15-ifeval-256-16")
    args = dict(kv.split("=", 1) for kv in row.model_args().split(","))
    args.update(pretrained="tiny-llada", gen_length="32", steps="32", block_length="16")
    lm = PVFDiffusionLM.create_from_arg_string(",".join(f"{k}={v}" for k, v in args.items()))
    out = lm_eval.simple_evaluate(model=lm, limit=1, bootstrap_iters=0, log_samples=True,
                                  task_manager=TaskManager(include_path=str(REPO / "tasks"),
                                                           include_defaults=False), **_cli_flags(row))
    sample = out["samples"][row.task][0]
    context, gen_kwargs = sample["arguments"][0]
    assert context.count("<|start_header_id|>user") == 1 and gen_kwargs["until"] == []
    meta = sample["resps"][0][0].meta
    assert meta["gen_length"] == 32 and meta["nfe"] == 32
    # one item of three instructions: prompt level all or none, instruction level in thirds;
    # loose reads the response as written too, so it follows whatever strict follows
    got = {k.split(",")[0]: v for k, v in out["results"][row.task].items() if "_acc," in k}
    assert len(ITEMS["ifeval_train"][0]["instruction_id_list"]) == 3
    for level in ("strict", "loose"):
        assert got[f"prompt_level_{level}_acc"] in (0.0, 1.0)
        assert round(got[f"inst_level_{level}_acc"] * 3, 9) in (0, 1, 2, 3)
    assert got["inst_level_loose_acc"] >= got["inst_level_strict_acc"]


def test_a_likelihood_row_scores_through_the_plugin_on_the_tiny_model():
    """A guided likelihood row's model args on tiny-llada (16 draws instead of 128) score a
    multiple-choice question: every canvas is scored twice (guidance: the prompt-masked copy
    beside it), the run reports the row's mc_num, and no greedy check runs (the script's
    is_check_greedy=False; lm-eval reads no is_greedy here)."""
    from lm_eval.api.instance import Instance

    from helpers.prerequisites import require_bundled_weights
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    require_bundled_weights("tiny-llada")
    row = published("llada-base-truthfulqa_mc2-cfg")
    args = dict(kv.split("=", 1) for kv in row.model_args().split(","))
    args.update(pretrained="tiny-llada", mc_num="16")
    lm = PVFDiffusionLM.create_from_arg_string(",".join(f"{k}={v}" for k, v in args.items()),
                                               {"device": "cpu"})
    choices = [Instance(request_type="loglikelihood", doc={}, idx=i,
                        metadata=("truthfulqa_mc2", 0, 1), arguments=("Q: 1 + 2?\nA:", f" {a}"))
               for i, a in enumerate(("3", "4 or 5"))]
    got = lm.loglikelihood(choices, disable_tqdm=True)
    assert len(got) == 2 and all(ll < 0 and g is False for ll, g in got)
    totals = lm.get_model_info()["pvf"]["totals"]["truthfulqa_mc2"]
    assert totals["mc_num"] == 16 and totals["greedy_checks"] == 0
    assert totals["branch_rows"] == 2 * totals["canvases"] > 0


# ----------------------------------------------------------------------------- lm-eval 0.4.8's bbh

B048 = ANSWERS["lmeval048_bbh"]


def test_lmeval048_bbh_answers_and_scores_on_the_corpus():
    """bbh_llada's answer and exact_match are lm-eval 0.4.8's ``get-answer`` filter (the first
    "the answer is " match up to the line's last character, stripped; "[invalid]" without
    one) and ``exact_match``: on 220 (output, target) pairs, and on every answer
    ``eval_llada.py`` returned in the corpus passes."""
    utils = _task_utils("bbh_llada")
    got = [(utils.answer_lmeval048(c["output"]),
            utils.process_results_lmeval048({"target": c["target"]}, [c["output"]])["exact_match"])
           for c in B048["scoring"]]
    assert got == [(c["filtered"], c["exact_match"]) for c in B048["scoring"]]
    items = ITEMS["bbh_test"]
    samples = [s for p in B048["passes"] for s in p["samples"]]
    got = [(utils.answer_lmeval048(s["answer"]),
            utils.process_results_lmeval048(items[s["item"]], [s["answer"]])["exact_match"])
           for s in samples]
    assert got == [(s["filtered"], s["exact_match"]) for s in samples]
    assert {s["exact_match"] for s in samples} == {0.0, 1.0}


def test_lmeval048_bbh_exemplars_are_the_cot_prompts_as_048_split_them():
    """0.4.8's exemplar answers repeat the prompt's "Let's think step by step." in every
    subtask but boolean_expressions (settings.json's contexts show both forms)."""
    utils = _task_utils("bbh_llada")
    prompts = {w["task"]: w["prompt"] for w in PROMPTS["llada_base_lmeval_bbh"]}
    for subtask in utils.SUBTASKS:
        description, samples = utils.lmeval048_exemplars(subtask)
        assert len(samples) == 3
        shots = "".join(f"Q: {s['input']}\nA: Let's think step by step.\n {s['target']}\n\n"
                        for s in samples)
        assert prompts[f"bbh_cot_fewshot_{subtask}"].startswith(description + shots), subtask
        twice = all(s["target"].startswith("Let's think step by step.") for s in samples)
        assert twice == (subtask != "boolean_expressions"), subtask
    with pytest.raises(ValueError, match="bbh_llada: subtask 'nope' is not one of boolean_"):
        utils.load_lmeval048("nope")


@pytest.fixture
def bbh_subset(local_items, monkeypatch):
    """The BBH items with the corpus passes' unequal subtask sizes (the first 1 or 2 items)."""
    import datasets

    hub = datasets.load_dataset

    def load_dataset(path=None, *args, **kwargs):
        data = hub(path, *args, **kwargs)
        if path == "SaylorTwift/bbh":
            return data.select(range(B048["subset"][kwargs.get("name", args[0] if args else None)]))
        return data

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)


def test_lmeval048_bbh_group_figure(bbh_subset):
    """bbh_llada through lm-eval on the passes' items (1 or 2 per subtask), each answered with
    what ``eval_llada.py`` returned for it: every subtask's exact_match and the group's
    figure are 0.4.8's, the mean over all questions (subtasks weighted by size), which is not
    the mean of the subtask figures here."""
    from lm_eval.api.model import LM
    from lm_eval.evaluator import evaluate
    from lm_eval.tasks import TaskManager

    items = ITEMS["bbh_test"]
    index = {(d["subtask"], d["input"]): i for i, d in enumerate(items)}

    class Answers(LM):
        answers: dict = {}

        def generate_until(self, requests, disable_tqdm=False):
            return [self.answers[index[r.task_name.removeprefix("bbh_llada_"), r.doc["input"]]]
                    for r in requests]

        def loglikelihood(self, requests, disable_tqdm=False):
            raise NotImplementedError

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            raise NotImplementedError

    tm = TaskManager(include_path=str(REPO / "tasks"), include_defaults=False)
    task_dict = tm.load(["bbh_llada"])
    lm = Answers()
    unweighted = []
    for p in B048["passes"]:
        lm.answers = {s["item"]: s["answer"] for s in p["samples"]}
        results = evaluate(lm, task_dict, bootstrap_iters=0)["results"]
        got = {name.replace("bbh_llada", "bbh_cot_fewshot") if name != "bbh_llada" else "bbh":
               r["exact_match,none"] for name, r in results.items()}
        assert got == pytest.approx(p["figures"], abs=1e-12), p["shift"]
        subtasks = [v for k, v in p["figures"].items() if k != "bbh"]
        unweighted.append(abs(sum(subtasks) / len(subtasks) - p["figures"]["bbh"]))
    assert max(unweighted) > 0.01


def test_eval_llada_answer_text_and_pvf_dlms():
    """``eval_llada.py`` cuts the canvas text at the stop strings with its special tokens in
    it, then drops them, and keeps what follows the first end-of-text; pvf-dlm's answer is
    the text before the first end-of-text or end-of-turn id, cut without special tokens. On
    the corpus pvf-dlm's answer is eval_llada.py's on a canvas that holds only end-of-text
    from there on; the two differ where text follows an end token and survives the stop
    strings (4 of the 27 templates), as docs/reference-differences.md states."""
    from pvf_lmeval.decoding import DecodeResult
    from pvf_lmeval.lmeval.sink import Sink
    from pvf_lmeval.models.loader import FIXTURES_DIR, _special_ids, load_tokenizer

    folder = FIXTURES_DIR / "tiny-llada"
    tok = load_tokenizer(folder)
    _, eos, _ = _special_ids(json.loads((folder / "config.json").read_text()), tok)
    sink = Sink(tokenizer=tok, model_name="t", model_family="llada", vocab=None, options=None,
                ranks=None)
    until = SETTINGS["llada_base_lmeval_bbh"]["lm_eval_gen_kwargs"]["until"]
    for case in B048["cuts"]:
        ids = case["output_ids"] + [tok.eos_token_id] * 8
        end = next(k for k, t in enumerate(ids) if t in eos)
        out = DecodeResult(tokens=ids, nfe=1, branch_rows=1, routes=["base"] * len(ids),
                           committed=len(ids), gen_tokens=end, gen_length=len(ids), wall_s=0.0,
                           early_stop=False, tokens_base=len(ids))
        assert sink.text(out, until)[0] == case["answer_eos"], case["output"]
    differ = {c["template"] for c in B048["cuts"] if c["answer"] != c["answer_eos"]}
    assert differ == {"So the answer is {t}<|eot_id|>.",
                      "So the answer is {t}.<|endoftext|>So the answer is {w}.",
                      "So the answer is {t}.<|eot_id|>\n<|endoftext|>\nQ",
                      "<|eot_id|>\n<|eot_id|>\nSo the answer is {t}."}


# ----------------------------------------------------------------------------- MBPP

MBPP = ANSWERS["opencompass_mbpp"]


@pytest.mark.parametrize("case", MBPP["process_answer"], ids=range(len(MBPP["process_answer"])))
def test_opencompass_mbpp_program(case):
    """``MBPPEvaluator._process_answer`` on the corpus."""
    assert pa.oc_mbpp_program(case["text"]) == case["answer"]


def test_mbpp_rows_read_the_test_split_as_opencompass_and_run_code():
    """OpenCompass's MBPPDataset: lines 11-510 of mbpp.jsonl are the test problems (train[:10]
    the rest), the asserts joined by newlines; the rows' commands confirm running code and
    name the checkpoints."""
    for name in ("llada-instruct-mbpp-pure", "llada-base-oc-mbpp-256", "llada15-mbpp-512-32"):
        found = SETTINGS[SCRIPT_ROW[name]]
        assert found["loaded_train_task_ids"] == list(range(1, 11))
        assert found["loaded_test_task_ids"] == [d["task_id"] for d in ITEMS["mbpp_test"]]
        assert [d["test_list"] for d in found["loaded_docs"]] == \
            ["\n".join(d["test_list"]) for d in ITEMS["mbpp_test"]]
        row = published(name)
        assert row.code and row.command().endswith("--confirm_run_unsafe_code")
    # the configs' model paths: the Instruct one is a local folder of the authors'
    assert [SETTINGS[SCRIPT_ROW[n]]["model_path"] for n in ("llada-base-oc-mbpp-256",
                                                            "llada15-mbpp-512-32")] == \
        [published("llada-base-oc-mbpp-256").model, published("llada15-mbpp-512-32").model]
    assert SETTINGS["llada15_mbpp_len512_blk32_conf"]["chat_templates_agree"]


#: where the sandbox's verdict differs from OpenCompass's one-namespace exec, by answer: a
#: program importing numpy (the sandbox shows the standard library only) and results that are
#: no plain data (an iterator, a map: unchecked, where the exec compared them and failed them)
MBPP_DIFFERENT = {"import numpy\ndef sort_matrix(M):\n    return sorted(M, key=sum)\n": "failed",
                  "def remove_Occ(s, ch):\n    return iter(s)\n": "unchecked",
                  "def sort_matrix(M):\n    return map(list, sorted(M, key=sum))\n": "unchecked"}


def test_mbpp_tasks_score_as_opencompass_through_the_sandbox(local_items):
    """Each answer of the corpus to the items passes in the sandbox exactly where
    MBPPEvaluator's own execution() passed it, but for the named differences."""
    for task in ("mbpp_llada_oc", "mbpp_llada_oc_base"):
        loaded = _loaded(task)
        docs = {d["task_id"]: d for d in loaded.test_docs()}
        for case in MBPP["one_namespace"] if task == "mbpp_llada_oc" else MBPP["one_namespace"][:2]:
            got = loaded.process_results(docs[case["item"]], [case["text"]])
            passed = case["result"] == "pass" and case["text"] not in MBPP_DIFFERENT
            assert got["pass@1"] == float(passed), case
            if case["text"] in MBPP_DIFFERENT:
                assert got["verdict"] == [MBPP_DIFFERENT[case["text"]]]
            else:       # their "failed" covers a program that does not compile
                assert got["verdict"][0] in (("passed",) if passed else ("failed", "syntax"))


def test_lmeval048_mbpp_is_0413s_prompt_and_scores_as_code_eval_through_the_sandbox(local_items):
    """``mbpp_llada``: lm-eval 0.4.8's ``mbpp`` requests, which 0.4.13's ``mbpp`` builds too
    (checked on the items), scored as 0.4.8's ``code_eval`` (the answer, then the first three
    asserts) scored each answer of the corpus, but for the named difference (numpy)."""
    assert SETTINGS["llada_base_lmeval_mbpp"]["lm_eval_0413_builds_the_same_prompts"]
    assert SETTINGS["llada_base_lmeval_mbpp"]["lm_eval"] == "0.4.8"
    utils = _task_utils("mbpp_llada")
    docs = {d["task_id"]: d for d in ITEMS["mbpp_test"]}
    for case in ANSWERS["lmeval048_mbpp"]["scores"]:
        doc = docs[case["item"]]
        assert case["reference"] == "\n".join(doc["test_list"][:3])
        got = utils.process_results_lmeval048(doc, [case["answer"]], workers=1)
        numpy = case["answer"].startswith("import numpy")
        assert got["pass@1"] == (0.0 if numpy else case["pass@1"]), case
        assert got["verdict"] == (["failed"] if numpy else got["verdict"])
